#!/usr/bin/env bash
# One GRPO step of `trl grpo` beside the same step in PyTorch (bench/grpo_torch.py): Qwen3-0.6B shapes with random
# bf16 weights, PROMPTS prompts of PROMPT_LEN tokens, GENERATIONS completions of NEW_TOKENS tokens each (random
# weights never emit EOS, so every completion is NEW_TOKENS long on both sides), training in micro-batches of BATCH
# rows. Prints each side's JSON line (seconds per step split into generation / rewards / training, programs
# compiled and compile seconds, peak RSS) and the ratio.
#   bash bench/run_grpo.sh                        # the seed's GRPOConfig: 1 prompt × 4 generations, batch 4
#   PROMPTS=4 bash bench/run_grpo.sh              # 4 prompts × 4 generations (gradient_accumulation_steps 4)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
PRESET=${PRESET:-qwen3-0.6b} PROMPTS=${PROMPTS:-1} GENERATIONS=${GENERATIONS:-4} BATCH=${BATCH:-4}
PROMPT_LEN=${PROMPT_LEN:-256} NEW_TOKENS=${NEW_TOKENS:-128} STEPS=${STEPS:-3}
cmake --build "$build" --target trl >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/trl" init-model --preset "$PRESET" --dtype bf16 --seed 1 --out "$tmp/model" >/dev/null
/usr/bin/python3 - "$tmp/prompts.jsonl" "$PROMPT_LEN" <<'PY'
import json, sys
# " a" is one token of Qwen3's vocabulary: a prompt of exactly PROMPT_LEN tokens.
open(sys.argv[1], "w").write("".join(json.dumps({"prompt": " a" * int(sys.argv[2])}) + "\n" for _ in range(64)))
PY
ga=$(( PROMPTS * GENERATIONS / BATCH ))
ours=$(/usr/bin/python3 - "$build/trl" "$tmp" "$BATCH" "$ga" "$GENERATIONS" "$NEW_TOKENS" "$STEPS" "$PRESET" "$PROMPTS" "$PROMPT_LEN" <<'PY'
import json, resource, subprocess, sys
trl, tmp, batch, ga, gens, new, steps, preset, prompts, plen = sys.argv[1:]
cmd = [trl, "grpo", "--model_name_or_path", f"{tmp}/model", "--dataset_name", f"{tmp}/prompts.jsonl", "--reward_funcs", "length:200",
       "--per_device_train_batch_size", batch, "--gradient_accumulation_steps", ga, "--num_generations", gens,
       "--max_completion_length", new, "--max_steps", str(int(steps) + 1), "--logging_steps", "1", "--save_steps", "100000",
       "--report", "false", "--output_dir", f"{tmp}/out", "--cache_implementation", "static"]
p = subprocess.run(cmd, capture_output=True, text=True)
if p.returncode != 0:
    sys.exit(p.stderr)
summary = json.loads(p.stdout.strip().splitlines()[-1])
log = [json.loads(l) for l in open(f"{tmp}/out/log.jsonl")]
later = log[1:]
best = min(later, key=lambda e: e["step_time"])
print(json.dumps({"bench": "trl_grpo", "preset": preset, "prompts": int(prompts), "generations": int(gens), "batch": int(batch),
                  "prompt_len": int(plen), "new_tokens": int(new), "step_seconds_best": best["step_time"],
                  "generation_seconds": best["time/generation"], "reward_seconds": best["time/rewards"],
                  "training_seconds": best["time/training"], "first_step_seconds": log[0]["step_time"],
                  "completion_tokens": best["completions/mean_length"],
                  "programs_compiled": summary["programs_compiled"], "compile_seconds": summary["compile_seconds"],
                  "generation_programs_compiled": summary["generation_programs_compiled"],
                  "generation_compile_seconds": summary["generation_compile_seconds"],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
PY
)
echo "$ours"
theirs=$(/usr/bin/python3 "$root/bench/grpo_torch.py" --preset "$PRESET" --prompts "$PROMPTS" --generations "$GENERATIONS" --batch "$BATCH" \
  --prompt_len "$PROMPT_LEN" --new_tokens "$NEW_TOKENS" --steps "$STEPS")
echo "$theirs"
/usr/bin/python3 - "$ours" "$theirs" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({"bench": "ratio_grpo_vs_torch", "speedup": b["step_seconds_best"] / a["step_seconds_best"],
                  "generation_speedup": b["generation_seconds"] / a["generation_seconds"],
                  "training_speedup": b["training_seconds"] / a["training_seconds"], "rss_ratio": a["peak_rss_mb"] / b["peak_rss_mb"]}))
PY

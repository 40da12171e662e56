#!/usr/bin/env bash
# bench/sft: `trl sft` on the qwen3-0.6b shapes (random bf16 weights, `trl init-model`) with a synthetic
# conversational dataset of varied lengths, with pad_to_multiple_of auto, 128 and None: seconds per step, tokens/s,
# programs compiled, the data pipeline's share of a step, and peak memory; then `trl bench train` for the same
# batch at the longest bucket, for comparison. Prints one JSON line per configuration.
#   bash bench/run_sft.sh [steps=4] [batch=2] [max_length=512]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
steps=${1:-4}
batch=${2:-2}
maxlen=${3:-512}
cmake --build "$build" --target trl >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/trl" init-model --preset qwen3-0.6b --dtype bf16 --out "$work/model" >/dev/null
# 64 conversations, user turns of 5..400 words (seeded), short answers.
/usr/bin/python3 - "$work/data.jsonl" <<'PY'
import json, random, sys
random.seed(0)
words = "the of and to in is that it was for on are as with his they at be this from have or by one had not but what all were when".split()
with open(sys.argv[1], "w") as f:
    for i in range(64):
        n = random.randint(5, 400)
        q = " ".join(random.choice(words) for _ in range(n))
        f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "An answer of a few words."}]}) + "\n")
PY
for pad in ${PADS:-auto 128 None}; do
  out="$work/out-$pad"
  /usr/bin/time -v "$build/trl" sft --model_name_or_path "$work/model" --dataset_name "$work/data.jsonl" --output_dir "$out" \
    --max_steps "$steps" --per_device_train_batch_size "$batch" --max_length "$maxlen" --pad_to_multiple_of "$pad" \
    --logging_steps 1 --save_steps 100000 --report=false --learning_rate 1e-5 > "$work/res-$pad.json" 2> "$work/err-$pad.txt"
  rss=$(grep "Maximum resident set size" "$work/err-$pad.txt" | awk '{print $NF}')
  /usr/bin/python3 - "$pad" "$out/log.jsonl" "$work/res-$pad.json" "$rss" <<'PY'
import json, sys
pad, log, res, rss = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
entries = [json.loads(l) for l in open(log) if '"loss"' in l]
r = json.loads(open(res).read().strip().splitlines()[-1])
steps = [e["step_seconds"] for e in entries]
data = [e["data_seconds"] for e in entries]
tokens = entries[-1]["num_tokens"]
print(json.dumps({"bench": "sft", "pad_to_multiple_of": pad, "steps": len(steps), "seconds_per_step_mean": sum(steps) / len(steps),
                  "seconds_per_step_after_first": sum(steps[1:]) / max(1, len(steps) - 1), "tokens_per_s": tokens / sum(steps),
                  "programs_compiled": r["programs_compiled"], "data_share_of_step": sum(data) / sum(steps), "peak_rss_mb": rss / 1024}))
PY
done
"$build/trl" bench train --preset qwen3-0.6b --batch "$batch" --seq "$maxlen" --dtype bf16 --steps 2

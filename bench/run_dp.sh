#!/usr/bin/env bash
# Data-parallel scaling of `trl sft` on this machine: the same global batch (GLOBAL rows of SEQ tokens per step,
# random weights of PRESET, f32 or bf16) trained as
#   1 rank  × 1 core   (TRL_VISIBLE_CORES=0, per_device_train_batch_size GLOBAL),
#   2 ranks × 1 core   (mpirun -np 2, per_device_train_batch_size GLOBAL/2: each rank pins itself to one core),
#   1 rank  × 2 cores  (per_device_train_batch_size GLOBAL),
#   2 ranks × 1 core with --fsdp_size 2 (the masters and AdamW moments sharded between them),
#   2 ranks × 1 core with --tp_size 2 (the model split between them; both train on the GLOBAL rows).
# Prints each run's mean step seconds over the steps after the first (compilation), the ranks' comm_seconds, the
# speed-ups: 2 ranks against 1 core (the goal: 1.9x), and against 1 rank on both cores, and the FSDP step beside the
# data-parallel one with each rank's optimizer state (f32 masters + AdamW moments) against the unsharded, and the
# tensor-parallel step with the weights each rank holds (rank 0's memory line) against one process's.
#   bash bench/run_dp.sh                            # PRESET=small GLOBAL=8 SEQ=256 STEPS=4
#   PRESET=qwen3-0.6b GLOBAL=4 SEQ=128 bash bench/run_dp.sh
#   PRESET=qwen3-1.7b LAYERS=2 GLOBAL=2 SEQ=128 bash bench/run_dp.sh   # the seed's FSDP model at reduced depth
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
PRESET=${PRESET:-small} GLOBAL=${GLOBAL:-8} SEQ=${SEQ:-256} STEPS=${STEPS:-4} DTYPE=${DTYPE:-bf16} LAYERS=${LAYERS:-0}
cmake --build "$build" --target trl >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/trl" init-model --preset "$PRESET" --layers "$LAYERS" --dtype "$DTYPE" --seed 1 --out "$tmp/model" >/dev/null
/usr/bin/python3 - "$tmp/data.jsonl" "$SEQ" <<'PY'
import json, sys
# " a" is one token of Qwen3's vocabulary: rows of SEQ - 1 tokens (the EOS makes SEQ).
open(sys.argv[1], "w").write("".join(json.dumps({"text": " a" * (int(sys.argv[2]) - 1)}) + "\n" for _ in range(256)))
PY
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
bf16=$([ "$DTYPE" = bf16 ] && echo true || echo false)
common=(sft --model_name_or_path "$tmp/model" --dataset_name "$tmp/data.jsonl" --max_length "$SEQ" --max_steps "$STEPS" --logging_steps 1
        --save_steps 100000 --report false --bf16 "$bf16" --learning_rate 1e-5)
mean_step() {  # mean step_seconds (and comm_seconds) of the log's steps after the first
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
step = sum(r["step_seconds"] for r in rows) / len(rows)
comm = sum(r.get("comm_seconds", 0) for r in rows) / len(rows)
print(f"{step:.3f} {comm:.3f}")
PY
}
TRL_VISIBLE_CORES=0 "$build/trl" "${common[@]}" --per_device_train_batch_size "$GLOBAL" --output_dir "$tmp/one_core" >/dev/null 2>&1
read -r one_core _ < <(mean_step "$tmp/one_core/log.jsonl")
mpirun -np 2 --bind-to none "$build/trl" "${common[@]}" --per_device_train_batch_size $((GLOBAL / 2)) --output_dir "$tmp/two_ranks" >/dev/null 2>&1
read -r two_ranks comm < <(mean_step "$tmp/two_ranks/log.jsonl")
"$build/trl" "${common[@]}" --per_device_train_batch_size "$GLOBAL" --output_dir "$tmp/two_cores" >/dev/null 2>&1
read -r two_cores _ < <(mean_step "$tmp/two_cores/log.jsonl")
mpirun -np 2 --bind-to none "$build/trl" "${common[@]}" --per_device_train_batch_size $((GLOBAL / 2)) --fsdp_size 2 --output_dir "$tmp/fsdp" \
  >/dev/null 2>"$tmp/fsdp.err"
read -r fsdp fsdp_comm < <(mean_step "$tmp/fsdp/log.jsonl")
mpirun -np 2 --bind-to none "$build/trl" "${common[@]}" --per_device_train_batch_size "$GLOBAL" --tp_size 2 --output_dir "$tmp/tp" \
  >/dev/null 2>"$tmp/tp.err"
read -r tp tp_comm < <(mean_step "$tmp/tp/log.jsonl")
# "[trl] memory: holds compute weights X, f32 masters Y; needs ..." of one process (1 core) and of tp rank 0
"$build/trl" "${common[@]}" --per_device_train_batch_size "$GLOBAL" --max_steps 1 --output_dir "$tmp/mem" >/dev/null 2>"$tmp/mem.err"
holds_one=$(sed -n 's/.*memory: holds \([^;]*\);.*/\1/p' "$tmp/mem.err")
holds_tp=$(sed -n 's/.*memory: holds \([^;]*\);.*/\1/p' "$tmp/tp.err")
# "[trl] [rank r/2] FSDP shard j of 2: f32 masters and AdamW moments B bytes on this rank (...), U unsharded"
held=$(sed -n 's/.*FSDP shard 0 of 2: f32 masters and AdamW moments \([0-9]*\) bytes.*, \([0-9]*\) unsharded/\1 \2/p' "$tmp/fsdp.err")
/usr/bin/python3 - "$PRESET" "$LAYERS" "$DTYPE" "$GLOBAL" "$SEQ" "$one_core" "$two_ranks" "$comm" "$two_cores" "$fsdp" "$fsdp_comm" $held \
  "$tp" "$tp_comm" "$holds_one" "$holds_tp" <<'PY'
import json, sys
preset, layers, dtype, g, seq = sys.argv[1:6]
one, two, comm, both, fsdp, fsdp_comm = map(float, sys.argv[6:12])
held, unsharded = map(int, sys.argv[12:14])
tp, tp_comm = map(float, sys.argv[14:16])
holds_one, holds_tp = sys.argv[16:18]
print(json.dumps({"preset": preset, "layers": int(layers) or "preset", "dtype": dtype, "global_batch": int(g), "seq": int(seq),
                  "step_s_1rank_1core": one, "step_s_2ranks_1core_each": two, "comm_s_2ranks": comm, "step_s_1rank_2cores": both,
                  "speedup_2ranks_vs_1core": round(one / two, 3), "efficiency": round(one / two / 2, 3),
                  "speedup_2ranks_vs_1rank_2cores": round(both / two, 3),
                  "step_s_fsdp2": fsdp, "comm_s_fsdp2": fsdp_comm, "fsdp_vs_data_parallel": round(two / fsdp, 3),
                  "optimizer_state_bytes_per_rank_fsdp2": held, "optimizer_state_bytes_unsharded": unsharded,
                  "step_s_tp2": tp, "comm_s_tp2": tp_comm, "tp_vs_data_parallel": round(two / tp, 3),
                  "holds_1process": holds_one, "holds_per_rank_tp2": holds_tp}))
PY

#!/usr/bin/env bash
# Regenerates the committed golden files in tests/data/goldens/ (needs Debian's python3-torch; CI does not).
#   bash tests/reference/make_goldens.sh [build-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
out=$root/tests/data/goldens
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
# Keep these arguments in sync with tests/models/golden_test.cpp (kGoldenModels).
for preset in tiny small; do
  for dtype in f32 bf16; do
    "$build/trl" init-model --preset $preset --dtype $dtype --seed 1234 --initializer_range 0.1 --randomize_norms --out "$tmp/$preset-$dtype" >/dev/null
    /usr/bin/python3 "$root/tests/reference/qwen3_reference.py" "$tmp/$preset-$dtype" "$out/qwen3_${preset}_${dtype}.json"
    if [ $dtype = f32 ]; then
      /usr/bin/python3 "$root/tests/reference/qwen3_train_reference.py" "$tmp/$preset-$dtype" "$out/qwen3_${preset}_train.json"
      /usr/bin/python3 "$root/tests/reference/generate_reference.py" "$tmp/$preset-$dtype" "$out/qwen3_${preset}_generate.json"
    fi
    if [ $dtype = bf16 ]; then
      /usr/bin/python3 "$root/tests/reference/qwen3_reference.py" "$tmp/$preset-$dtype" "$out/qwen3_${preset}_${dtype}_emulated.json" --emulate
      /usr/bin/python3 "$root/tests/reference/qwen3_train_reference.py" "$tmp/$preset-$dtype" "$out/qwen3_${preset}_train_bf16.json"
    fi
  done
done
# The preference trainers (DPO for every loss type, KTO, reward) on the tiny f32 model: tests/train/preference_golden_test.cpp.
"$build/trl" init-model --preset tiny --dtype f32 --seed 1234 --initializer_range 0.1 --randomize_norms --out "$tmp/pref" >/dev/null
(cd "$root/tests/reference" && /usr/bin/python3 preference_train_reference.py "$tmp/pref" "$out/preference_train.json")
# GRPO and RLOO on a fixed round of completions, same model: tests/train/grpo_golden_test.cpp.
(cd "$root/tests/reference" && /usr/bin/python3 grpo_reference.py "$tmp/pref" "$out/grpo_train.json")
# A folder saved by `trl sft` (tests/data/sft/golden_recipe.yaml on the tiny f32 model above and the demo chat data):
# PyTorch checks it is a complete Hugging Face folder and computes its logits (tests/models/golden_test.cpp).
"$build/trl" init-model --preset tiny --dtype f32 --seed 1234 --initializer_range 0.1 --randomize_norms --out "$tmp/sft-base" >/dev/null
"$build/trl" sft --config "$root/tests/data/sft/golden_recipe.yaml" --model_name_or_path "$tmp/sft-base" \
  --dataset_name "$root/assets/demo/chat.jsonl" --output_dir "$tmp/sft-out" >/dev/null 2>&1
/usr/bin/python3 "$root/tests/reference/qwen3_reference.py" "$tmp/sft-out" "$out/qwen3_tiny_sft.json" --hf-folder
# LoRA (tests/models/lora_test.cpp): an adapter in PEFT's layout written by the reference (committed in
# tests/data/lora/peft_tiny), and the adapter `trl sft --use_peft` saves (tests/data/lora/lora_recipe.yaml), both on
# the tiny f32 model above: their logits, and 3 AdamW steps of the PEFT adapter.
/usr/bin/python3 "$root/tests/reference/lora_reference.py" write-peft "$tmp/sft-base" "$root/tests/data/lora/peft_tiny"
"$build/trl" sft --config "$root/tests/data/lora/lora_recipe.yaml" --model_name_or_path "$tmp/sft-base" \
  --dataset_name "$root/assets/demo/chat.jsonl" --output_dir "$tmp/lora-out" >/dev/null 2>&1
(cd "$root/tests/reference" && /usr/bin/python3 lora_reference.py goldens "$tmp/sft-base" "$root/tests/data/lora/peft_tiny" "$tmp/lora-out" \
  "$out/lora_tiny.json")
# Distillation (tests/train/gkd_test.cpp): the tiny f32 model above as the student, a one-layer tiny teacher.
"$build/trl" init-model --preset tiny --dtype f32 --seed 4321 --initializer_range 0.2 --randomize_norms --num_hidden_layers 1 \
  --out "$tmp/teacher" >/dev/null
(cd "$root/tests/reference" && /usr/bin/python3 gkd_reference.py "$tmp/pref" "$tmp/teacher" "$out/gkd_train.json")

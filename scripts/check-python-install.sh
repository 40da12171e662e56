#!/usr/bin/env bash
# Proves the Python package installs as the README says: `pip install .` into a new virtual environment (its build
# tool, scikit-build-core, from PyPI), then one of the seeds' snippets runs with the installed package (not the
# build tree) against a tiny model in a Hub-cache layout.
#   bash scripts/check-python-install.sh [BUILD_DIR]
# With BUILD_DIR (test.sh passes its Release build), pip builds in that folder, so only the extension is compiled
# again; the folder's own Python (for its tests) is put back afterwards. Without it, pip builds in build/pip-* as a
# user's `pip install .` does.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
pip_args=()
if [ -n "$build" ]; then
  build=$(cd "$build" && pwd)
  before=$(sed -n 's/^Python_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")
  pip_args=(--config-settings "build-dir=$build")  # Debian's pip 23.0 has no -C
fi
CMAKE_GENERATOR=Ninja "$work/venv/bin/pip" install --quiet --disable-pip-version-check "${pip_args[@]}" "$root"
if [ -n "$build" ]; then  # the build's tests keep the Python they were configured with
  cmake -S "$root" -B "$build" -DPython_EXECUTABLE="${before:-/usr/bin/python3}" >/dev/null
  cmake --build "$build" --target trl_python >/dev/null
fi
trl=$(command -v trl || true)
[ -n "$build" ] && trl="$build/trl"
[ -x "$trl" ] || trl="$root/build/trl"
commit=0000000000000000000000000000000000000001
snap="$work/hub/models--Qwen--Qwen3-0.6B/snapshots/$commit"
mkdir -p "$snap" "$work/hub/models--Qwen--Qwen3-0.6B/refs"
echo "$commit" > "$work/hub/models--Qwen--Qwen3-0.6B/refs/main"
"$trl" init-model --preset tiny --vocab_size 4096 --out "$snap" >/dev/null
cd "$work"
HF_HUB_CACHE="$work/hub" "$work/venv/bin/python" - <<'PY'
import trl_cpp
assert "site-packages" in trl_cpp.__file__, trl_cpp.__file__   # the installed package, not a build tree

from trl_cpp import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen3-0.6B")
model = AutoModelForCausalLM.from_pretrained(
    "Qwen/Qwen3-0.6B", dtype="bfloat16", device_map="cpu"
)
inputs = tokenizer("The French Bread Law states", return_tensors="pt")
output = model.generate(
    **inputs, do_sample=False, max_new_tokens=50, cache_implementation="static"
)
text = tokenizer.decode(output[0], skip_special_tokens=True)
assert text.startswith("The French Bread Law states") and len(output[0]) > len(inputs["input_ids"][0])
print(f"check-python-install: trl_cpp {trl_cpp.__version__} from {trl_cpp.__file__}: generate() gave {len(output[0])} tokens")
PY

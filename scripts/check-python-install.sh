#!/usr/bin/env bash
# Proves the Python package installs into a new virtual environment and runs one of the seeds' snippets from there
# (not from the build tree), against a tiny model in a Hub-cache layout. Two ways, as docs/PYTHON.md gives them:
#   bash scripts/check-python-install.sh BUILD_DIR         the CMake build's package (component "python") installed
#                                                         into the venv's site-packages: no network (test.sh, CI)
#   bash scripts/check-python-install.sh BUILD_DIR --pip   `pip install .`: scikit-build-core from PyPI builds in
#                                                         BUILD_DIR (only the extension is compiled again); what its
#                                                         configuration changed there (its Python, pyproject.toml's
#                                                         TRL_BUILD_TESTS/BENCH OFF) is put back afterwards; then,
#                                                         with PyPI's openai and pytest in the same venv (test-only),
#                                                         trl serve's tests through the real OpenAI client
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: check-python-install.sh BUILD_DIR [--pip]}" && pwd)
mode=${2:-cmake}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
if [ "$mode" = --pip ]; then
  # What pip's configuration changes in the folder (pyproject.toml's defines, its Python), put back afterwards.
  cached() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
  before=$(cached Python_EXECUTABLE) tests=$(cached TRL_BUILD_TESTS) bench=$(cached TRL_BUILD_BENCH)
  # Debian's pip 23.0 has no -C.
  CMAKE_GENERATOR=Ninja "$work/venv/bin/pip" install --quiet --disable-pip-version-check --config-settings "build-dir=$build" "$root"
  cmake -S "$root" -B "$build" -U 'SKBUILD*' -DPython_EXECUTABLE="${before:-/usr/bin/python3}" -DTRL_BUILD_TESTS="${tests:-ON}" \
    -DTRL_BUILD_BENCH="${bench:-ON}" >/dev/null
  cmake --build "$build" --target trl_python >/dev/null
else
  site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
  cmake --install "$build" --component python --prefix "$site" >/dev/null
fi
trl="$build/trl"
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
if [ "$mode" = --pip ]; then
  # trl serve spoken to by the real OpenAI client (tests/serve/test_openai_client.py; it skips where openai is missing).
  "$work/venv/bin/pip" install --quiet --disable-pip-version-check openai pytest
  TRL_BINARY="$trl" PYTHONDONTWRITEBYTECODE=1 "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/serve/test_openai_client.py"
  echo "check-python-install: trl serve answered the OpenAI client $("$work/venv/bin/python" -c 'import openai; print(openai.__version__)')"
fi

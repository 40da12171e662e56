#!/usr/bin/env bash
# Installs the Debian 12 packages trl.cpp needs to build and test. Idempotent: installed packages are skipped.
#   bash scripts/install-deps.sh            # build + test dependencies
#   bash scripts/install-deps.sh --dev      # also what regenerates golden files (python3-torch)
# Why each library is here: docs/DEPENDENCIES.md.
set -euo pipefail

packages=(
  g++ cmake ninja-build git ca-certificates pkg-config
  libgtest-dev          # GoogleTest (unit tests, run by CTest)
  libbenchmark-dev      # Google Benchmark: the kernel micro-benchmarks in dev/
  nlohmann-json3-dev    # JSON: safetensors headers, config.json, CLI output
  libfmt-dev            # formatting of messages
  libsimdjson-dev       # fast parsing of the 11 MB tokenizer.json (CLI start-up time)
  libcli11-dev          # command-line parsing of the trl binary
  libdnnl-dev           # oneDNN: GEMM primitives (version reported by `trl env`)
  ocl-icd-opencl-dev    # OpenCL dev files: Debian's dnnl-config.cmake calls find_package(OpenCL) (only a Recommends)
  libyaml-cpp-dev       # `trl sft --config sft.yaml`: TRL's YAML config files
  libpcre2-dev          # PCRE2: the tokenizers' pre-tokenizer regexes (Unicode classes, look-ahead), JIT-compiled
  libutf8proc-dev       # utf8proc: Unicode normalisation (NFC, ...) and case mapping for the tokenizer
  libsnappy-dev         # Parquet datasets: SNAPPY pages (what the Hub's files use)
  libzstd-dev           # Parquet datasets: ZSTD pages
  zlib1g-dev            # Parquet datasets: GZIP pages
  libcpp-httplib-dev    # cpp-httplib: `trl serve`'s HTTP server (the library llama.cpp's server uses)
  libopenmpi-dev        # Open MPI: the collectives of distributed training (data parallel)
  openmpi-bin           # mpirun: starts the ranks (trl sft --nproc_per_node N runs it)
  clang                 # the sanitizer build and the fuzz targets (libFuzzer) of scripts/test.sh
  libclang-rt-14-dev    # libFuzzer and the sanitizer runtimes for clang
  libomp-dev            # clang's OpenMP runtime, for that build
  python3               # the exec: reward test runs a Python reward script, as TRL users write theirs (tests only)
  python3-dev           # the Python package trl_cpp (python/, docs/PYTHON.md): Python's headers for its extension
  pybind11-dev          # pybind11: the extension's bindings
  python3-venv          # `pip install .` of the package into a virtual environment (test.sh proves it)
  python3-pytest        # the Python package's tests (tests/python) and trl serve's (tests/serve)
  curl                  # trl serve's tests speak to it as docs/SERVE.md does (tests only)
)
if [ "${1:-}" = "--dev" ]; then
  packages+=(python3-torch python3-numpy python3-jinja2 nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

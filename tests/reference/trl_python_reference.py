#!/usr/bin/env python3
"""The oracle of the Python package's losses: the scripts of tests/python/trl_scripts.py run with PyPI's trl,
transformers and datasets (PyTorch on the CPU) on the tiny model the package's tests use, and what they logged
written to tests/data/python/trl_reference.json (test_same_script_as_trl.py runs the same scripts with trl_cpp).

    python3 -m venv /tmp/trlvenv && /tmp/trlvenv/bin/pip install torch trl transformers datasets peft
    /tmp/trlvenv/bin/python tests/reference/trl_python_reference.py build/trl tests/data/python/trl_reference.json
"""
import json
import os
import subprocess
import sys
import tempfile
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import trl_scripts  # noqa: E402


def main() -> None:
    trl_binary, out = sys.argv[1], os.path.abspath(sys.argv[2])
    import datasets
    import torch
    import transformers
    import trl

    torch.use_deterministic_algorithms(True)
    work = tempfile.mkdtemp()
    model = os.path.join(work, "model")
    # The model of tests/python/conftest.py (the tiny preset, the 4096-token cut vocabulary, seed 3).
    subprocess.run([trl_binary, "init-model", "--preset", "tiny", "--vocab_size", "4096", "--seed", "3", "--initializer_range", "0.1", "--out", model],
                   check=True, capture_output=True)
    os.chdir(work)
    lib = types.SimpleNamespace(SFTConfig=trl.SFTConfig, SFTTrainer=trl.SFTTrainer, DPOConfig=trl.DPOConfig, DPOTrainer=trl.DPOTrainer,
                                GRPOConfig=trl.GRPOConfig, GRPOTrainer=trl.GRPOTrainer, Dataset=datasets.Dataset)
    result = {"versions": {"trl": trl.__version__, "transformers": transformers.__version__, "datasets": datasets.__version__, "torch": torch.__version__},
              "sft": trl_scripts.sft(lib, model), "dpo": trl_scripts.dpo(lib, model), "grpo": trl_scripts.grpo(lib, model)}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

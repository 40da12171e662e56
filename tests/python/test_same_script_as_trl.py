"""The same scripts (trl_scripts.py) with PyPI's trl, transformers and datasets (the committed
tests/data/python/trl_reference.json, made by tests/reference/trl_python_reference.py) and with trl_cpp: the same
SFT and DPO losses, gradient norms and DPO metrics, step by step, within 1e-4; GRPO's rewards and completion lengths
(greedy generation, so that the completions can be the same)."""

import json
import math
import os
import types

import trl_scripts

REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "python", "trl_reference.json")


def close(a, b, what):
    assert math.isfinite(a) and math.isfinite(b), what
    assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), f"{what}: trl_cpp {a!r}, TRL {b!r}"


def lib():
    import trl_cpp

    return types.SimpleNamespace(SFTConfig=trl_cpp.SFTConfig, SFTTrainer=trl_cpp.SFTTrainer, DPOConfig=trl_cpp.DPOConfig,
                                 DPOTrainer=trl_cpp.DPOTrainer, GRPOConfig=trl_cpp.GRPOConfig, GRPOTrainer=trl_cpp.GRPOTrainer,
                                 Dataset=trl_cpp.Dataset)


def model_dir(hub):
    snapshots = hub / "models--Qwen--Qwen3-0.6B" / "snapshots"
    return str(next(snapshots.iterdir()))


def compare(method, hub):
    ref = json.load(open(REFERENCE))[method]
    ours = getattr(trl_scripts, method)(lib(), model_dir(hub))
    assert len(ours) == len(ref) > 0
    for step, (a, b) in enumerate(zip(ours, ref), start=1):
        for key, value in b.items():
            close(a[key], value, f"{method} step {step} {key}")


def test_sft_losses_equal_trl(hub):
    compare("sft", hub)


def test_dpo_losses_equal_trl(hub):
    compare("dpo", hub)


def test_grpo_rewards_equal_trl(hub):
    compare("grpo", hub)

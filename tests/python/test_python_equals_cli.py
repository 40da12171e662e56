"""A run from Python is the run of the same `trl` command line: the same losses (log.jsonl) and the same saved weights."""

import hashlib
import os

from conftest import read_log, trl


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_sft_from_python_equals_the_command_line():
    from trl_cpp import SFTConfig, SFTTrainer, load_dataset

    args = SFTConfig(output_dir="py", max_steps=3, per_device_train_batch_size=2, learning_rate=1e-3, logging_steps=1, bf16=False, seed=7)
    trainer = SFTTrainer(model="Qwen/Qwen3-0.6B", args=args, train_dataset=load_dataset("trl-lib/Capybara", split="train"))
    trainer.train()
    trl("sft", "--model_name_or_path", "Qwen/Qwen3-0.6B", "--dtype", "float32", "--dataset_name", "trl-lib/Capybara", "--output_dir", "cli",
        "--max_steps", 3, "--per_device_train_batch_size", 2, "--learning_rate", 1e-3, "--logging_steps", 1, "--bf16", "false", "--seed", 7)
    py, cli = read_log("py/log.jsonl"), read_log("cli/log.jsonl")
    assert len(py) == len(cli) == 3
    for a, b in zip(py, cli):
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"] and a["learning_rate"] == b["learning_rate"]
    assert digest("py/model.safetensors") == digest("cli/model.safetensors")
    assert [e["loss"] for e in trainer.state.log_history if "loss" in e] == [e["loss"] for e in py]


def test_in_memory_rows_train_as_the_same_rows_from_a_file():
    from trl_cpp import SFTConfig, SFTTrainer, load_dataset

    rows = load_dataset("trl-lib/Capybara", split="train").to_list()
    common = dict(max_steps=2, per_device_train_batch_size=4, logging_steps=1, bf16=False)
    a = SFTTrainer(model="Qwen/Qwen3-0.6B", args=SFTConfig(output_dir="a", **common), train_dataset=rows)
    b = SFTTrainer(model="Qwen/Qwen3-0.6B", args=SFTConfig(output_dir="b", **common), train_dataset=load_dataset("trl-lib/Capybara", split="train"))
    a.train()
    b.train()
    assert [e["loss"] for e in read_log("a/log.jsonl")] == [e["loss"] for e in read_log("b/log.jsonl")]
    assert digest("a/model.safetensors") == digest("b/model.safetensors")

"""A Python reward function gives the same rewards and losses as the same rule run as an exec: program, bit for bit."""

import sys

from conftest import read_log

PROGRAM = r'''
import json, sys
for line in sys.stdin:
    batch = json.loads(line)
    print(json.dumps([-abs(200 - len(c)) / 100 for c in batch["completions"]]), flush=True)
'''


def reward_len(completions, **kwargs):
    return [-abs(200 - len(completion)) / 100 for completion in completions]


def test_python_reward_equals_exec_reward():
    from trl_cpp import GRPOConfig, GRPOTrainer, load_dataset

    with open("reward.py", "w") as f:
        f.write(PROGRAM)
    common = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=16, max_steps=4, logging_steps=1, bf16=False, seed=11,
                  learning_rate=1e-3)
    runs = {}
    for name, funcs in (("python", reward_len), ("exec", f"exec:{sys.executable} reward.py")):
        trainer = GRPOTrainer(model="Qwen/Qwen3-0.6B", reward_funcs=funcs, args=GRPOConfig(output_dir=name, **common),
                              train_dataset=load_dataset("trl-lib/tldr", split="train"))
        trainer.train()
        runs[name] = read_log(f"{name}/log.jsonl")
    py, ex = runs["python"], runs["exec"]
    assert len(py) == len(ex) == 4
    for a, b in zip(py, ex):
        assert a["rewards/reward_len/mean"] == next(v for k, v in b.items() if k.startswith("rewards/exec") and k.endswith("/mean"))
        assert a["reward"] == b["reward"] and a["reward_std"] == b["reward_std"]
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"]

#!/usr/bin/env python3
"""The GRPO quick start's reward_len as an exec: reward (tests/train/grpo_trainer_test.cpp): one JSON line in per
batch, {"prompts": [...], "completions": [...], "completion_ids": [...], ...}; one JSON array of rewards out.

    trl grpo ... --reward_funcs "exec:python3 tests/data/grpo/reward_len.py 20"
"""
import json
import sys

target = int(sys.argv[1]) if len(sys.argv) > 1 else 200
for line in sys.stdin:
    batch = json.loads(line)
    texts = [c if isinstance(c, str) else c[0]["content"] for c in batch["completions"]]
    print(json.dumps([-abs(target - len(t)) / 100 for t in texts]), flush=True)

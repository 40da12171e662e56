#!/usr/bin/env python3
"""What a Python reward function costs in a GRPO step (issue 39: under 1% on the seed's shapes).

Runs the seed's GRPO snippet (per_device_train_batch_size 4, num_generations 4, max_completion_length 128, bf16) for
STEPS steps with the seed's reward_len as a Python function, then with the same rule as the built-in length:200 and
as an exec: program, and prints each run's mean time in the reward functions against its mean step time (the
trainer's own time/rewards and step_time metrics).

    PYTHONPATH=build/python python3 bench/python_reward.py MODEL_DIR [STEPS]

MODEL_DIR: a Qwen3 folder, e.g. `trl init-model --preset qwen3-0.6b --layers 2 --dtype bf16 --out /tmp/q06` (the
seed's widths and vocabulary with 2 of its 28 layers: a step 14x shorter than the whole model's, so the share
measured is an upper bound of the whole model's).
"""
import json
import os
import sys
import tempfile

from trl_cpp import GRPOConfig, GRPOTrainer

PROGRAM = r'''
import json, sys
for line in sys.stdin:
    print(json.dumps([-abs(200 - len(c)) / 100 for c in json.loads(line)["completions"]]), flush=True)
'''


def reward_len(completions, **kwargs):
    return [-abs(200 - len(completion)) / 100 for completion in completions]


def main() -> None:
    model, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4
    work = tempfile.mkdtemp()
    program = os.path.join(work, "reward.py")
    with open(program, "w") as f:
        f.write(PROGRAM)
    prompts = [{"prompt": f"SUBREDDIT: r/test\nPOST: story number {i} about a long day.\nTL;DR:"} for i in range(steps)]
    for label, funcs in (("python reward_len", reward_len), ("built-in length:200", "length:200"), ("exec: program", f"exec:{sys.executable} {program}")):
        args = GRPOConfig(output_dir=os.path.join(work, label.split()[0]), per_device_train_batch_size=4, num_generations=4, max_completion_length=128,
                          cache_implementation="static", model_init_kwargs={"dtype": "bfloat16"}, max_steps=steps, logging_steps=1, seed=1)
        trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=args, train_dataset=prompts)
        trainer.train()
        logs = [e for e in trainer.state.log_history if "time/rewards" in e]
        reward_s = sum(e["time/rewards"] for e in logs) / len(logs)
        step_s = sum(e["step_time"] for e in logs) / len(logs)
        print(json.dumps({"reward_funcs": label, "steps": len(logs), "reward_ms_per_step": round(reward_s * 1e3, 3),
                          "step_s": round(step_s, 3), "share_percent": round(100 * reward_s / step_s, 4)}))


if __name__ == "__main__":
    main()

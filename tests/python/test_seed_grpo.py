"""Seed 000's GRPO snippet with its Python reward function, as written but for the import line."""

import math


def test_grpo_with_reward_len_runs_as_written():
    # --- the seed's snippet ---
    from trl_cpp import load_dataset
    from trl_cpp import GRPOConfig, GRPOTrainer

    # Reward completions close to 200 characters
    def reward_len(completions, **kwargs):
        return [-abs(200 - len(completion)) / 100 for completion in completions]

    trainer = GRPOTrainer(
        model="Qwen/Qwen3-0.6B",
        reward_funcs=reward_len,
        args=GRPOConfig(
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=128,
            cache_implementation="static",
            model_init_kwargs={"dtype": "bfloat16"},
        ),
        train_dataset=load_dataset("trl-lib/tldr", split="train"),
    )
    trainer.train()
    # --- what it did ---
    logged = [e for e in trainer.state.log_history if "rewards/reward_len/mean" in e]
    assert logged, "the reward function's mean is logged under its name, as TRL logs it"
    for e in logged:
        r = e["rewards/reward_len/mean"]
        # -|200 - characters| / 100 is never positive, and never NaN.
        assert math.isfinite(r) and r <= 0.0 and e["reward"] == r  # one reward function, weight 1
    assert trainer.args.output_dir == "trainer_output"  # a config without output_dir: Transformers' default
    # 2 prompts x 3 epochs, one prompt (4 completions) per step.
    assert trainer.state.global_step == 6


def test_reward_function_sees_trl_keyword_arguments():
    from trl_cpp import GRPOConfig, GRPOTrainer, load_dataset

    seen = {}

    def spy(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, solution, **kwargs):
        seen.update(n=len(completions), prompts=prompts, ids=completion_ids, extra=solution, step=trainer_state.global_step, rest=kwargs)
        return [None if i == 0 else float(len(c)) for i, c in enumerate(completions)]

    trainer = GRPOTrainer(model="Qwen/Qwen3-0.6B", reward_funcs=[spy, "length:20"],
                          args=GRPOConfig(output_dir="out", per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=1),
                          train_dataset=[{"prompt": "SUBREDDIT: r/test", "completion": "x", "solution": "Paris."}])
    trainer.train()
    assert seen["n"] == 4 and len(seen["prompts"]) == 4 and len(seen["ids"]) == 4
    assert all(isinstance(i, int) for row in seen["ids"] for i in row) and all(1 <= len(row) <= 8 for row in seen["ids"])
    assert all(isinstance(p, str) and p.startswith("SUBREDDIT") for p in seen["prompts"])
    assert seen["extra"] == ["Paris."] * 4  # the dataset's other columns (not prompt, completion), one value per completion
    assert seen["rest"] == {}
    e = trainer.state.log_history[0]
    assert math.isfinite(e["rewards/spy/mean"]) and math.isfinite(e["rewards/reward_len/mean"])  # length:N is named as the quick start's function

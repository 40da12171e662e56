"""Scripts written once and run twice: with PyPI's trl, transformers and datasets (tests/reference/trl_python_reference.py
writes what they log to tests/data/python/trl_reference.json) and with trl_cpp (test_same_script_as_trl.py compares).
`lib` carries the classes: SFTConfig, SFTTrainer, DPOConfig, DPOTrainer and Dataset (with from_list).

The runs are made to be comparable: one batch holds every row (so the data order cannot differ), float32 weights
and compute, a constant learning rate, no gradient checkpointing (the result is the same, the reference's speed
better), no reporting."""

QA = [("What is the capital of France?", "Paris."), ("What is 2 + 2?", "4."), ("What do bees make?", "Honey."),
      ("What colour is the sky?", "Blue.")]

COMMON = dict(per_device_train_batch_size=4, max_steps=3, learning_rate=1e-3, lr_scheduler_type="constant", logging_steps=1, bf16=False,
              seed=1, gradient_checkpointing=False, report_to="none", model_init_kwargs={"dtype": "float32"})


def sft(lib, model):
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in QA]
    trainer = lib.SFTTrainer(model=model, args=lib.SFTConfig(output_dir="sft", **COMMON), train_dataset=lib.Dataset.from_list(rows))
    trainer.train()
    return [{k: e[k] for k in ("loss", "grad_norm")} for e in trainer.state.log_history if "loss" in e]


def dpo(lib, model):
    rows = [{"prompt": [{"role": "user", "content": q}], "chosen": [{"role": "assistant", "content": a}],
             "rejected": [{"role": "assistant", "content": "I do not know."}]} for q, a in QA]
    trainer = lib.DPOTrainer(model=model, args=lib.DPOConfig(output_dir="dpo", **COMMON), train_dataset=lib.Dataset.from_list(rows))
    trainer.train()
    keys = ("loss", "grad_norm", "rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected")
    return [{k: e[k] for k in keys if k in e} for e in trainer.state.log_history if "loss" in e]


def reward_len(completions, **kwargs):
    return [-abs(200 - len(completion)) / 100 for completion in completions]


def grpo(lib, model):
    # Greedy generation (generation_kwargs do_sample False), so that both implementations generate the same
    # completions from the same weights; both prompts in every step (8 completions, 4 per prompt).
    rows = [{"prompt": f"SUBREDDIT: r/test\nPOST: {q}\nTL;DR:"} for q, _ in QA[:2]]
    args = lib.GRPOConfig(output_dir="grpo", **{**COMMON, "per_device_train_batch_size": 8, "max_steps": 2}, num_generations=4,
                          max_completion_length=16, generation_kwargs={"do_sample": False})
    trainer = lib.GRPOTrainer(model=model, reward_funcs=reward_len, args=args, train_dataset=lib.Dataset.from_list(rows))
    trainer.train()
    keys = ("rewards/reward_len/mean", "reward", "completions/mean_length")
    return [{k: e[k] for k in keys} for e in trainer.state.log_history if "reward" in e]

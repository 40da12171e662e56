"""Every trainer of the package, one short run each on the fixtures' tiny model: TRL's classes and arguments reach
the engine's methods (finite losses, the method's own metrics, the saved model or adapter)."""

import json
import math
import os

ROWS_KTO = [{"prompt": "What is 2 + 2?", "completion": " 4.", "label": True}, {"prompt": "What is 2 + 2?", "completion": " 5.", "label": False},
            {"prompt": "Sky colour?", "completion": " Blue.", "label": True}, {"prompt": "Sky colour?", "completion": " Green.", "label": False}]


def losses(trainer):
    out = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert out and all(math.isfinite(x) for x in out)
    return out


def test_kto_trainer():
    from trl_cpp import KTOConfig, KTOTrainer

    t = KTOTrainer(model="Qwen/Qwen3-0.6B", args=KTOConfig(output_dir="kto", max_steps=2, per_device_train_batch_size=4, logging_steps=1), train_dataset=ROWS_KTO)
    t.train()
    losses(t)
    assert any("kl" in e for e in t.state.log_history)  # KTO's KL term is logged


def test_reward_trainer_writes_a_score_head():
    from trl_cpp import RewardConfig, RewardTrainer, load_dataset

    t = RewardTrainer(model="Qwen/Qwen3-0.6B", args=RewardConfig(output_dir="rm", max_steps=2, per_device_train_batch_size=4, logging_steps=1),
                      train_dataset=load_dataset("trl-lib/ultrafeedback_binarized", split="train"))
    t.train()
    losses(t)
    config = json.load(open("rm/config.json"))
    assert config["architectures"] == ["Qwen3ForSequenceClassification"]


def test_rloo_trainer_with_a_python_reward():
    from trl_cpp import RLOOConfig, RLOOTrainer, load_dataset

    t = RLOOTrainer(model="Qwen/Qwen3-0.6B", reward_funcs=lambda completions, **kw: [float(len(c) % 3) for c in completions],
                    args=RLOOConfig(output_dir="rloo", max_steps=2, per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
                                    logging_steps=1),
                    train_dataset=load_dataset("trl-lib/tldr", split="train"))
    t.train()
    assert all(math.isfinite(e["reward"]) for e in t.state.log_history if "reward" in e)
    assert os.path.exists("rloo/model.safetensors")


def test_gkd_trainer_with_a_teacher():
    from trl_cpp import GKDConfig, GKDTrainer, load_dataset

    t = GKDTrainer(model="Qwen/Qwen3-0.6B", teacher_model="Qwen/Qwen3-0.6B",
                   args=GKDConfig(output_dir="gkd", max_steps=2, per_device_train_batch_size=2, logging_steps=1, max_new_tokens=4),
                   train_dataset=load_dataset("trl-lib/Capybara", split="train"))
    t.train()
    # The student starts as the teacher: the divergence starts at 0.
    assert abs(losses(t)[0]) < 1e-4


def test_dpo_trainer_takes_training_arguments_and_a_lora_config():
    from trl_cpp import DPOTrainer, LoraConfig, TrainingArguments, load_dataset

    t = DPOTrainer(model="Qwen/Qwen3-0.6B", args=TrainingArguments(output_dir="dpo", max_steps=2, per_device_train_batch_size=4, logging_steps=1),
                   train_dataset=load_dataset("trl-lib/ultrafeedback_binarized", split="train"),
                   peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    t.train()
    assert losses(t)[0] == math.log(2) or abs(losses(t)[0] - math.log(2)) < 1e-6  # the policy starts as its reference
    adapter = json.load(open("dpo/adapter_config.json"))
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8 and sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    assert t.args.learning_rate == 5e-5  # TrainingArguments' default, carried into DPO's config

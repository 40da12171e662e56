"""Seed 003's TrainingArguments snippets (bf16, torch_compile), as written, given to a trainer."""

import json
import math
import os


def test_training_arguments_as_written_train_a_model():
    from trl_cpp import TrainingArguments

    training_args = TrainingArguments(
        output_dir="./outputs",
        bf16=True,
    )
    training_args = TrainingArguments(
        output_dir="./outputs",
        bf16=True,
        torch_compile=True,
    )
    assert training_args.bf16 is True and training_args.torch_compile is True
    assert training_args.learning_rate == 5e-5  # Transformers' default, not TRL's SFT one

    from trl_cpp import SFTTrainer, load_dataset

    trainer = SFTTrainer(model="Qwen/Qwen3-0.6B", args=training_args, train_dataset=load_dataset("trl-lib/Capybara", split="train"))
    trainer.train()
    state = json.load(open(os.path.join("outputs", "trainer_state.json")))
    assert state["global_step"] == trainer.state.global_step > 0
    assert all(math.isfinite(e["learning_rate"]) for e in trainer.state.log_history if "learning_rate" in e)


def test_training_arguments_refuses_fields_of_trl_configs():
    import pytest
    from trl_cpp import TrainingArguments

    with pytest.raises(TypeError, match="max_length"):
        TrainingArguments(output_dir="x", max_length=128)
    with pytest.raises(TypeError, match="did you mean 'learning_rate'"):
        TrainingArguments(output_dir="x", learning_rat=1e-4)

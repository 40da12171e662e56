"""Seed 000's SFT quick start, as written but for the import line (datasets and trl -> trl_cpp)."""

import math
import os


def test_sft_quickstart_runs_as_written():
    # --- the seed's snippet ---
    from trl_cpp import load_dataset, SFTTrainer

    trainer = SFTTrainer(
        model="Qwen/Qwen3-0.6B",
        train_dataset=load_dataset("trl-lib/Capybara", split="train"),
    )
    trainer.train()
    # --- what it did ---
    # TRL's default output_dir when args is None: the model's name + "-SFT"; the final model is saved there.
    assert trainer.args.output_dir == "Qwen3-0.6B-SFT"
    assert os.path.exists(os.path.join("Qwen3-0.6B-SFT", "model.safetensors"))
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert losses and all(math.isfinite(x) for x in losses)
    # 8 rows, TRL's per_device_train_batch_size 8 and num_train_epochs 3: 3 steps.
    assert trainer.state.global_step == 3
    assert trainer.state.log_history[-1]["train_loss"] > 0


def test_sft_with_torch_compile_config_runs_as_written():
    from trl_cpp import load_dataset, SFTConfig, SFTTrainer

    trainer = SFTTrainer(
        model="Qwen/Qwen3-0.6B",
        args=SFTConfig(torch_compile=True),
        train_dataset=load_dataset("trl-lib/Capybara", split="train"),
    )
    out = trainer.train()
    assert trainer.args.output_dir == "trainer_output"  # Transformers' default when a config names none
    assert out.global_step == 3 and math.isfinite(out.training_loss)
    assert set(out.metrics) >= {"train_runtime", "train_loss", "epoch"}

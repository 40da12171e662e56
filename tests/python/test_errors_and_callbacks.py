"""Bad arguments raise the exception type a Python user expects, with the engine's message; a raising reward function
ends the run with its own traceback and the checkpoints kept; callbacks see every logged step."""

import os

import pytest


def test_unknown_config_field_is_a_type_error_with_a_suggestion():
    from trl_cpp import SFTConfig

    with pytest.raises(TypeError, match=r"unexpected keyword argument 'learning_rat' \(did you mean 'learning_rate'\?\)"):
        SFTConfig(learning_rat=1e-4)
    with pytest.raises(TypeError, match="pass the model to the trainer"):
        SFTConfig(model_name_or_path="x")


def test_a_value_the_engine_refuses_is_a_value_error_naming_the_option():
    from trl_cpp import SFTConfig, SFTTrainer, load_dataset

    with pytest.raises(ValueError, match="max_length"):
        SFTTrainer(model="Qwen/Qwen3-0.6B", args=SFTConfig(max_length=0), train_dataset=load_dataset("trl-lib/Capybara", split="train"))
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        SFTTrainer(model="Qwen/Qwen3-0.6B", args=SFTConfig(lr_scheduler_type="sideways"), train_dataset=load_dataset("trl-lib/Capybara", split="train"))


def test_missing_model_and_dataset_are_file_not_found():
    from trl_cpp import AutoModelForCausalLM, SFTTrainer, load_dataset

    with pytest.raises(FileNotFoundError, match="model 'nobody/nothing' not found"):
        AutoModelForCausalLM.from_pretrained("nobody/nothing")
    with pytest.raises(FileNotFoundError, match="dataset 'nobody/nothing' not found"):
        load_dataset("nobody/nothing", split="train")
    with pytest.raises(FileNotFoundError, match="not found"):
        SFTTrainer(model="nobody/nothing", train_dataset=[{"text": "a"}])


def test_bad_rows_are_type_errors_that_say_where():
    from trl_cpp import SFTTrainer

    with pytest.raises(TypeError, match=r"train_dataset\[1\]: a row must be a dict"):
        SFTTrainer(model="Qwen/Qwen3-0.6B", train_dataset=[{"text": "a"}, "b"])


def test_a_raising_reward_function_ends_the_run_with_its_traceback_and_keeps_checkpoints():
    from trl_cpp import GRPOConfig, GRPOTrainer, load_dataset

    calls = []

    def flaky(completions, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise ZeroDivisionError("the reward's own error")
        return [0.0] * len(completions)

    trainer = GRPOTrainer(model="Qwen/Qwen3-0.6B", reward_funcs=flaky,
                          args=GRPOConfig(output_dir="out", per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=5,
                                          save_steps=1),
                          train_dataset=load_dataset("trl-lib/tldr", split="train"))
    with pytest.raises(ZeroDivisionError, match="the reward's own error") as info:
        trainer.train()
    assert any(frame.name == "flaky" for frame in info.traceback)
    assert os.path.isdir("out/checkpoint-1") and os.path.isdir("out/checkpoint-2") and not os.path.exists("out/checkpoint-3")


def test_reward_function_returning_a_string_is_a_type_error():
    from trl_cpp import GRPOConfig, GRPOTrainer, load_dataset

    trainer = GRPOTrainer(model="Qwen/Qwen3-0.6B", reward_funcs=lambda completions, **kw: ["x"] * len(completions),
                          args=GRPOConfig(output_dir="out", per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=1),
                          train_dataset=load_dataset("trl-lib/tldr", split="train"))
    with pytest.raises(TypeError, match="a reward is a number or None"):
        trainer.train()


def test_callbacks_see_every_logged_step_and_can_stop_the_run():
    from trl_cpp import SFTConfig, SFTTrainer, TrainerCallback, load_dataset

    class Recorder(TrainerCallback):
        def __init__(self):
            self.logs, self.steps, self.events = [], [], []

        def on_train_begin(self, args, state, control, **kwargs):
            self.events.append("begin")

        def on_step_end(self, args, state, control, **kwargs):
            self.steps.append(state.global_step)

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs))

        def on_train_end(self, args, state, control, **kwargs):
            self.events.append("end")

    rec = Recorder()
    trainer = SFTTrainer(model="Qwen/Qwen3-0.6B", args=SFTConfig(output_dir="out", max_steps=4, logging_steps=2, per_device_train_batch_size=2),
                         train_dataset=load_dataset("trl-lib/Capybara", split="train"), callbacks=[rec])
    trainer.train()
    assert rec.steps == [1, 2, 3, 4]
    assert [e["step"] for e in rec.logs] == [2, 4]
    assert rec.logs == [e for e in trainer.state.log_history if "loss" in e]
    assert rec.events == ["begin", "end"]

    class StopAtTwo(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                control.should_training_stop = True

    trainer = SFTTrainer(model="Qwen/Qwen3-0.6B", args=SFTConfig(output_dir="stop", max_steps=10, per_device_train_batch_size=2),
                         train_dataset=load_dataset("trl-lib/Capybara", split="train"), callbacks=[StopAtTwo])
    out = trainer.train()
    assert out.global_step == 2 and os.path.isdir("stop/checkpoint-2")


def test_evaluate_and_resume():
    from trl_cpp import SFTConfig, SFTTrainer, load_dataset

    args = SFTConfig(output_dir="out", max_steps=2, save_steps=1, per_device_train_batch_size=2)
    trainer = SFTTrainer(model="Qwen/Qwen3-0.6B", args=args, train_dataset=load_dataset("trl-lib/Capybara", split="train"),
                         eval_dataset=load_dataset("trl-lib/Capybara", split="test"))
    trainer.train()
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] > 0 and "epoch" in metrics
    args.max_steps = 3
    resumed = SFTTrainer(model="Qwen/Qwen3-0.6B", args=args, train_dataset=load_dataset("trl-lib/Capybara", split="train"))
    out = resumed.train(resume_from_checkpoint="out/checkpoint-2")
    assert out.global_step == 3
    trainer.save_model("saved")
    assert os.path.exists("saved/model.safetensors")

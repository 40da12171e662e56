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
    # on_log gets the logs (Transformers' form, without "step"); log_history holds them with their step.
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert [e["step"] for e in logged] == [2, 4]
    assert rec.logs[:2] == [{k: v for k, v in e.items() if k != "step"} for e in logged]
    assert "train_loss" in rec.logs[-1]  # the run's final metrics are logged too
    assert rec.events == ["begin", "end"]

    class StopAtTwo(TrainerCallback):  # as EarlyStoppingCallback: the stop is set when the step's logs arrive
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.global_step == 2:
                control.should_training_stop = True

    trainer = SFTTrainer(model="Qwen/Qwen3-0.6B", args=SFTConfig(output_dir="stop", max_steps=10, per_device_train_batch_size=2, logging_steps=1),
                         train_dataset=load_dataset("trl-lib/Capybara", split="train"), callbacks=[StopAtTwo])
    out = trainer.train()
    assert out.global_step == 2
    # The run ended as at its last step: the final model and trainer_state.json, no interrupt checkpoint.
    assert os.path.exists("stop/model.safetensors") and os.path.exists("stop/trainer_state.json")
    assert not os.path.exists("stop/checkpoint-2")


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


def test_a_config_its_checks_refuse_is_a_value_error():
    from trl_cpp import GRPOConfig, GRPOTrainer, load_dataset

    def make(**kw):
        GRPOTrainer(model="Qwen/Qwen3-0.6B", reward_funcs="length:20", args=GRPOConfig(output_dir="out", **kw),
                    train_dataset=load_dataset("trl-lib/tldr", split="train"))

    with pytest.raises(ValueError, match="'num_beams' is not a setting"):
        make(per_device_train_batch_size=4, num_generations=4, generation_kwargs={"num_beams": 2})
    with pytest.raises(ValueError, match="num_generations"):
        make(per_device_train_batch_size=4, num_generations=3)


def test_ctrl_c_saves_a_checkpoint_and_raises_keyboard_interrupt():
    import signal

    from trl_cpp import SFTConfig, SFTTrainer, TrainerCallback, load_dataset

    class CtrlC(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                signal.raise_signal(signal.SIGINT)  # as a terminal's Ctrl-C during the step

    trainer = SFTTrainer(model="Qwen/Qwen3-0.6B", args=SFTConfig(output_dir="out", max_steps=10, per_device_train_batch_size=2),
                         train_dataset=load_dataset("trl-lib/Capybara", split="train"), callbacks=[CtrlC])
    with pytest.raises(KeyboardInterrupt, match="interrupted at step 2"):
        trainer.train()
    assert os.path.isdir("out/checkpoint-2")
    out = trainer.train(resume_from_checkpoint="out/checkpoint-2")  # and the run goes on from there
    assert out.global_step == 10


def test_the_gil_is_released_while_the_engine_trains():
    import threading

    from trl_cpp import SFTConfig, SFTTrainer, TrainerCallback, load_dataset

    ticks = []
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks.append(1)
            stop.wait(0.001)

    seen = []

    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(len(ticks))

    trainer = SFTTrainer(model="Qwen/Qwen3-0.6B", args=SFTConfig(output_dir="out", max_steps=6, per_device_train_batch_size=4),
                         train_dataset=load_dataset("trl-lib/Capybara", split="train"), callbacks=[Watch])
    thread = threading.Thread(target=count)
    thread.start()
    try:
        trainer.train()
    finally:
        stop.set()
        thread.join()
    # The other thread ran while the engine computed the steps: its count grew between step ends.
    assert sum(1 for a, b in zip(seen, seen[1:]) if b > a) >= 3


def test_a_datasets_dataset_trains_as_its_rows():
    datasets = pytest.importorskip("datasets")  # only where PyPI's datasets is installed
    from trl_cpp import SFTConfig, SFTTrainer, load_dataset

    rows = load_dataset("trl-lib/Capybara", split="train").to_list()
    common = dict(max_steps=2, per_device_train_batch_size=4, logging_steps=1, bf16=False)
    a = SFTTrainer(model="Qwen/Qwen3-0.6B", args=SFTConfig(output_dir="a", **common), train_dataset=datasets.Dataset.from_list(rows))
    b = SFTTrainer(model="Qwen/Qwen3-0.6B", args=SFTConfig(output_dir="b", **common), train_dataset=rows)
    a.train()
    b.train()
    assert [e["loss"] for e in a.state.log_history if "loss" in e] == [e["loss"] for e in b.state.log_history if "loss" in e]


def test_a_trainer_is_freed_after_training_and_can_train_twice():
    import gc
    import weakref

    from trl_cpp import GRPOConfig, GRPOTrainer, load_dataset

    def reward(completions, **kwargs):
        return [1.0 if len(c) % 2 else 0.0 for c in completions]

    trainer = GRPOTrainer(model="Qwen/Qwen3-0.6B", reward_funcs=reward,
                          args=GRPOConfig(output_dir="out", per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=1),
                          train_dataset=load_dataset("trl-lib/tldr", split="train"))
    trainer.train()
    trainer.train(resume_from_checkpoint=None)  # a second call: callbacks swapped while the engine holds the old ones
    ref = weakref.ref(trainer)
    del trainer
    gc.collect()
    assert ref() is None, "the engine's callbacks or reward functions keep the trainer alive"


def test_rewards_as_bools_nan_and_async_functions():
    import asyncio
    import math

    from trl_cpp import GRPOConfig, GRPOTrainer, load_dataset

    def as_bool(completions, **kwargs):
        return [len(c) > 0 for c in completions]

    def with_nan(completions, **kwargs):
        return [float("nan")] + [0.5] * (len(completions) - 1)  # NaN is "no reward", as TRL reads None

    async def slow(completions, **kwargs):
        await asyncio.sleep(0)
        return [0.25] * len(completions)

    trainer = GRPOTrainer(model="Qwen/Qwen3-0.6B", reward_funcs=[as_bool, with_nan, slow],
                          args=GRPOConfig(output_dir="out", per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=1),
                          train_dataset=load_dataset("trl-lib/tldr", split="train"))
    trainer.train()
    e = trainer.state.log_history[0]
    assert e["rewards/as_bool/mean"] == 1.0 and e["rewards/with_nan/mean"] == 0.5 and e["rewards/slow/mean"] == 0.25
    assert math.isfinite(e["reward"])


def test_dataset_map_as_datasets_does():
    from trl_cpp import Dataset

    d = Dataset.from_list([{"q": "a", "n": 1}, {"q": "bb", "n": 2}])
    assert d.map(lambda r: {"text": r["q"] * 2}, remove_columns=d.column_names).to_list() == [{"text": "aa"}, {"text": "bbbb"}]
    assert d.map(lambda b: {"len": [len(q) for q in b["q"]]}, batched=True).to_list() == [{"q": "a", "n": 1, "len": 1}, {"q": "bb", "n": 2, "len": 2}]
    assert d.map(lambda r, i: {"i": i}, with_indices=True)["i"] == [0, 1]
    with pytest.raises(TypeError, match="unexpected keyword argument 'input_columns'"):
        d.map(lambda r: r, input_columns=["q"])


def test_config_defaults_are_trls():
    from trl_cpp import DPOConfig, GRPOConfig, SFTConfig

    g = GRPOConfig()
    # TRL 1.x's GRPOConfig defaults (trl/trainer/grpo_config.py).
    assert (g.learning_rate, g.num_generations, g.max_completion_length, g.temperature, g.top_p, g.top_k) == (1e-6, 8, 512, 1.0, 1.0, 0)
    assert (g.min_p, g.beta, g.loss_type, g.scale_rewards, g.epsilon, g.num_iterations) == (None, 0.0, "dapo", "group", 0.2, 1)
    assert g.reward_weights is None and g.generation_kwargs is None and g.chat_template_kwargs is None and g.log_completions is False
    s = SFTConfig()
    assert (s.learning_rate, s.logging_steps, s.max_length, s.packing, s.bf16) == (2e-5, 10, 1024, False, True)
    d = DPOConfig()
    assert (d.beta, d.loss_type, d.learning_rate) == (0.1, ["sigmoid"], 1e-6) or (d.beta, d.loss_type, d.learning_rate) == (0.1, "sigmoid", 1e-6)
    # TRL's router_aux_loss_coef (SFT, DPO, GRPO; KTO and RLOO too), and Transformers' expert-parallel size.
    assert s.router_aux_loss_coef == d.router_aux_loss_coef == g.router_aux_loss_coef == 0.001
    assert s.ep_size == 1
    with pytest.raises(TypeError, match="pass the split itself"):
        SFTConfig(dataset_train_split="nope")


def test_messages_speak_python():
    from trl_cpp import AutoModelForCausalLM, AutoTokenizer, SFTConfig, SFTTrainer, load_dataset

    with pytest.raises(ValueError) as info:
        SFTTrainer(model="Qwen/Qwen3-0.6B", args=SFTConfig(warmup_steps=-1), train_dataset=load_dataset("trl-lib/Capybara", split="train"))
    assert "warmup_steps" in str(info.value) and "--" not in str(info.value) and "see trl" not in str(info.value)
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-0.6B")
    with pytest.raises(TypeError, match="do_sample must be True or False, got 1"):
        model.generate(input_ids=[[1, 2, 3]], do_sample=1)
    with pytest.raises(TypeError, match="stop_strings must be a str or a list of str"):
        model.generate(input_ids=[[1, 2, 3]], stop_strings=[1], tokenizer=AutoTokenizer.from_pretrained("Qwen/Qwen3-0.6B"))


def test_an_unknown_split_is_a_value_error_listing_the_splits():
    from trl_cpp import load_dataset

    with pytest.raises(ValueError, match=r"Unknown split \"validation\". Should be one of \['train', 'test'\]"):
        load_dataset("trl-lib/Capybara", split="validation")


def test_a_callback_cannot_reenter_the_trainer():
    from trl_cpp import SFTConfig, SFTTrainer, TrainerCallback, load_dataset

    class Reenter(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            trainer.save_model("inside")

    trainer = SFTTrainer(model="Qwen/Qwen3-0.6B", args=SFTConfig(output_dir="out", max_steps=2, per_device_train_batch_size=2),
                         train_dataset=load_dataset("trl-lib/Capybara", split="train"), callbacks=[Reenter])
    with pytest.raises(ValueError, match=r"save_model\(\) was called while this object is still working"):
        trainer.train()


def test_lora_config_target_parameters_reach_the_engine():
    from trl_cpp import LoraConfig

    # PEFT's way to adapt parameters only (a mixture of experts' experts): target_modules empty or None.
    for modules in (None, []):
        args = LoraConfig(r=4, target_modules=modules, target_parameters=["mlp.experts.gate_up_proj", "mlp.gate.weight"]).to_args()
        assert "--lora_target_modules" not in args
        at = args.index("--lora_target_parameters")
        assert args[at + 1:at + 3] == ["mlp.experts.gate_up_proj", "mlp.gate.weight"]
    assert "target_parameters=['mlp.gate.weight']" in repr(LoraConfig(target_parameters=["mlp.gate.weight"]))

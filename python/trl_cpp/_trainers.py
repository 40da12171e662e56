"""The trainers: TRL's classes and arguments over the engine's training commands.

A trainer turns its arguments into the words of a `trl` command line (the Config's fields, the model, the data,
LoRA, reward functions) and asks the engine to prepare that command in this process: the same parser and checks
as `trl sft ...`, so a run from Python and the same run from the command line are one run. The engine then trains
with the GIL released; callbacks and Python reward functions are called from its loop.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import re
import tempfile
import threading
import time
import warnings
import weakref
from typing import Any, Callable, NamedTuple

from . import _core
from ._config import (DPOConfig, GKDConfig, GRPOConfig, KTOConfig, RewardConfig, RLOOConfig, SFTConfig, _Config)
from ._data import dataset_args
from ._peft import LoraConfig


class TrainerState:
    """Transformers' TrainerState: where the run is; log_history holds every logged entry (as log.jsonl)."""

    def __init__(self) -> None:
        self.epoch: float = 0.0
        self.global_step: int = 0
        self.max_steps: int = 0
        self.num_input_tokens_seen: int = 0
        self.log_history: list[dict] = []
        self.best_metric = None
        self.best_global_step = None
        self.best_model_checkpoint = None
        self.is_local_process_zero = True
        self.is_world_process_zero = True
        self.total_flos = 0.0


class TrainerControl:
    """Transformers' TrainerControl: a callback sets should_training_stop (in on_step_end, on_log or on_evaluate) to
    end the run after the current step, as at its last step (the final model and trainer_state.json are saved)."""

    def __init__(self) -> None:
        self.should_training_stop = False
        self.should_epoch_stop = False
        self.should_save = False
        self.should_evaluate = False
        self.should_log = False


class TrainerCallback:
    """Transformers' TrainerCallback. Called: on_init_end, on_train_begin, on_step_end (every optimizer step),
    on_log (every entry of log_history), on_evaluate (eval entries), on_train_end. The others exist so that
    subclasses written for Transformers load, and are not called."""

    def on_init_end(self, args, state, control, **kwargs): pass
    def on_train_begin(self, args, state, control, **kwargs): pass
    def on_train_end(self, args, state, control, **kwargs): pass
    def on_epoch_begin(self, args, state, control, **kwargs): pass
    def on_epoch_end(self, args, state, control, **kwargs): pass
    def on_step_begin(self, args, state, control, **kwargs): pass
    def on_pre_optimizer_step(self, args, state, control, **kwargs): pass
    def on_optimizer_step(self, args, state, control, **kwargs): pass
    def on_substep_end(self, args, state, control, **kwargs): pass
    def on_step_end(self, args, state, control, **kwargs): pass
    def on_evaluate(self, args, state, control, **kwargs): pass
    def on_predict(self, args, state, control, metrics, **kwargs): pass
    def on_save(self, args, state, control, **kwargs): pass
    def on_log(self, args, state, control, **kwargs): pass
    def on_prediction_step(self, args, state, control, **kwargs): pass
    def on_push_begin(self, args, state, control, **kwargs): pass


class TrainOutput(NamedTuple):
    global_step: int
    training_loss: float
    metrics: dict


def _callable_name(f: Callable) -> str:
    while isinstance(f, functools.partial):
        f = f.func
    return getattr(f, "__name__", type(f).__name__)


def _model_words(model: Any, model_init_kwargs: dict | None) -> list[str]:
    """--model_name_or_path and how it is loaded (model_init_kwargs: dtype, device_map), as TRL loads a model by name."""
    from ._models import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        if model_init_kwargs:
            warnings.warn("model_init_kwargs is ignored: the model is already loaded", stacklevel=3)
        return ["--model_name_or_path", model.name_or_path, "--dtype", model.dtype]
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model: expected a model id or folder (str) or a model from AutoModelForCausalLM.from_pretrained, got {type(model).__name__}")
    kwargs = dict(model_init_kwargs or {})
    # TRL's create_model_from_path: float32 unless model_init_kwargs says otherwise.
    dtype = kwargs.pop("dtype", kwargs.pop("torch_dtype", "float32"))
    dtype = str(dtype).replace("torch.", "") if dtype is not None else "auto"
    if dtype not in ("auto", "float32", "bfloat16"):
        raise ValueError(f"model_init_kwargs dtype={dtype!r}: trl.cpp trains in 'float32' or 'bfloat16' (or 'auto', the checkpoint's)")
    words = ["--model_name_or_path", os.fspath(model), "--dtype", dtype]
    device_map = kwargs.pop("device_map", None)
    if device_map is not None:
        device = str(device_map).split(":")[0]
        if device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"model_init_kwargs device_map={device_map!r}: trl.cpp places a model with 'auto', 'cpu' or 'cuda'")
        words += ["--device", device]
    revision = kwargs.pop("revision", None)
    if revision is not None:
        words += ["--model_revision", str(revision)]
    for ignored in ("trust_remote_code", "attn_implementation", "low_cpu_mem_usage", "use_cache"):
        kwargs.pop(ignored, None)
    if kwargs:
        raise ValueError(f"model_init_kwargs: {sorted(kwargs)} not supported (trl.cpp reads dtype, device_map and revision)")
    return words


def _python_words(message: str) -> str:
    """The engine's command-line wording in Python's: '--max_length must be ...' -> 'max_length must be ...'."""
    message = re.sub(r" \(see trl [a-z-]+ --help\)$", "", message)
    return re.sub(r"(?<![\w-])--([a-z][a-z0-9_]*)", r"\1", message)


def _prepare(words: list[str], rewards: list, load_eval: bool) -> Any:
    try:
        return _core.prepare(words, rewards, load_eval)
    except ValueError as e:
        raise ValueError(_python_words(str(e))) from None


def _refuse(**unsupported: Any) -> None:
    for name, value in unsupported.items():
        if value is not None and value != (None, None):
            raise ValueError(f"{name} is not supported by trl_cpp: the engine's trainers compute their losses, metrics and batches "
                             f"themselves (docs/PYTHON.md, 'What differs from TRL')")


class _Trainer:
    _command = "sft"
    _config_class: type = SFTConfig
    _suffix = "SFT"

    def _setup(self, model: Any, args: Any, train_dataset: Any, eval_dataset: Any, callbacks: Any, peft_config: Any,
               extra_words: list[str] | None = None, rewards: list[tuple[str, Callable]] | None = None) -> None:
        if train_dataset is None:
            raise ValueError(f"{type(self).__name__}: train_dataset is required")
        if args is None:
            name = os.path.basename(os.fspath(model).rstrip("/")) if isinstance(model, (str, os.PathLike)) else "model"
            args = self._config_class(output_dir=f"{name}-{self._suffix}")
        elif not isinstance(args, self._config_class):
            if not isinstance(args, _Config):
                raise TypeError(f"args: expected a {self._config_class.__name__} or TrainingArguments, got {type(args).__name__}")
            converted = self._config_class(**args.given())
            converted.model_init_kwargs = args.model_init_kwargs
            args = converted
        self.args = args
        self.state = TrainerState()
        self.control = TrainerControl()
        self.callbacks = [c() if isinstance(c, type) else c for c in (callbacks or [])]
        self._workdir = tempfile.TemporaryDirectory(prefix="trl_cpp-")
        words = [self._command] + _model_words(model, args.model_init_kwargs) + args.to_args()
        words += dataset_args(train_dataset, eval_dataset, self._workdir.name)
        words += _peft_words(peft_config)
        words += extra_words or []
        self._words = words
        self._rewards = rewards or []
        self._has_eval = eval_dataset is not None
        self._handle = _prepare(words, self._rewards, self._has_eval)
        self._call("on_init_end")

    # -- callbacks ---------------------------------------------------------------------------------------------------

    def add_callback(self, callback: Any) -> None:
        self.callbacks.append(callback() if isinstance(callback, type) else callback)

    def _call(self, event: str, **kwargs: Any) -> None:
        for cb in self.callbacks:
            out = getattr(cb, event, None)
            if out is None:
                continue
            result = out(self.args, self.state, self.control, **kwargs)
            if isinstance(result, TrainerControl):
                self.control = result

    def _on_step(self, entry: dict) -> None:
        self.state.global_step = int(entry["step"])
        self.state.max_steps = int(entry["max_steps"])
        self.state.epoch = float(entry["epoch"])
        self.state.num_input_tokens_seen = int(entry.get("num_tokens", self.state.num_input_tokens_seen))
        self._call("on_step_end")

    def _on_log(self, entry: dict) -> None:
        self.state.log_history.append(entry)
        logs = {k: v for k, v in entry.items() if k != "step"}  # Transformers passes the logs; log_history adds the step
        self._call("on_log", logs=logs)
        if any(k.startswith("eval_") for k in entry):
            self._call("on_evaluate", metrics=logs)

    def _should_stop(self) -> bool:
        return bool(self.control.should_training_stop)

    # -- the Trainer API ---------------------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> TrainOutput:
        """Trains to max_steps (else num_train_epochs); resume_from_checkpoint a checkpoint folder, or True for the
        output_dir's last one. Ctrl-C saves a checkpoint and raises KeyboardInterrupt."""
        for key in ("trial", "ignore_keys_for_eval"):
            kwargs.pop(key, None)
        if kwargs:
            raise TypeError(f"train() got an unexpected keyword argument '{next(iter(kwargs))}'")
        if resume_from_checkpoint not in (None, False):
            value = "true" if resume_from_checkpoint is True else os.fspath(resume_from_checkpoint)
            self._handle = _prepare(self._words + ["--resume_from_checkpoint", value], self._rewards, self._has_eval)
        self.state = TrainerState()
        self.control = TrainerControl()
        # The engine holds the callbacks only while it trains: a cycle through it would keep the trainer alive.
        me = weakref.ref(self)
        self._handle.set_callbacks(lambda e: me()._on_log(e), lambda e: me()._on_step(e), lambda: me()._should_stop())
        self._call("on_train_begin")
        start = time.monotonic()
        try:
            out = self._handle.train()
        finally:
            self._handle.set_callbacks(None, None, None)
        runtime = time.monotonic() - start
        self.state.log_history = list(out["log_history"])
        self.state.global_step = out["global_step"]
        if out["interrupted"]:
            raise KeyboardInterrupt(f"training interrupted at step {out['global_step']}; a checkpoint was saved in {self.args.output_dir}")
        metrics = {"train_runtime": round(runtime, 4), "train_steps_per_second": round(out["global_step"] / runtime, 3) if runtime > 0 else 0.0,
                   "train_loss": out["training_loss"], "epoch": self.state.epoch}
        self.state.log_history.append({**metrics, "step": self.state.global_step})
        self._call("on_log", logs=metrics)
        self._call("on_train_end")
        return TrainOutput(out["global_step"], out["training_loss"], metrics)

    def evaluate(self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval") -> dict:
        """eval_loss and the method's eval metrics over the eval_dataset given to the trainer, with the current weights."""
        if eval_dataset is not None:
            raise ValueError("evaluate(eval_dataset=...): pass the eval data to the trainer (eval_dataset=...) when you make it")
        if not self._has_eval:
            raise ValueError(f"{type(self).__name__}.evaluate: no eval_dataset was given to the trainer")
        start = time.monotonic()
        metrics = dict(self._handle.evaluate())
        if metric_key_prefix != "eval":
            metrics = {(metric_key_prefix + k[4:] if k.startswith("eval") else k): v for k, v in metrics.items()}
        metrics[f"{metric_key_prefix}_runtime"] = round(time.monotonic() - start, 4)
        metrics["epoch"] = self.state.epoch
        self.state.log_history.append({**metrics, "step": self.state.global_step})
        self._call("on_log", logs=metrics)
        self._call("on_evaluate", metrics=metrics)
        return metrics

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Writes the model (or the LoRA adapter), its config and the tokenizer to output_dir (default args.output_dir)."""
        self._handle.save_model(os.fspath(output_dir) if output_dir is not None else str(self.args.output_dir))

    @property
    def command_line(self) -> list[str]:
        """The `trl` command line this trainer runs (data given in memory is in a temporary folder)."""
        return ["trl"] + list(self._words)


def _peft_words(peft_config: Any) -> list[str]:
    if peft_config is None:
        return []
    if not isinstance(peft_config, LoraConfig):
        raise TypeError(f"peft_config: expected a LoraConfig, got {type(peft_config).__name__}")
    return peft_config.to_args()


class SFTTrainer(_Trainer):
    """TRL's SFTTrainer: `SFTTrainer(model="Qwen/Qwen3-0.6B", train_dataset=load_dataset(...)).train()`."""

    _command, _config_class, _suffix = "sft", SFTConfig, "SFT"

    def __init__(self, model, args=None, data_collator=None, train_dataset=None, eval_dataset=None, processing_class=None, compute_loss_func=None,
                 compute_metrics=None, callbacks=None, optimizers=(None, None), optimizer_cls_and_kwargs=None, preprocess_logits_for_metrics=None,
                 quantization_config=None, peft_config=None, formatting_func=None):
        _refuse(data_collator=data_collator, compute_loss_func=compute_loss_func, compute_metrics=compute_metrics, optimizers=optimizers,
                optimizer_cls_and_kwargs=optimizer_cls_and_kwargs, preprocess_logits_for_metrics=preprocess_logits_for_metrics,
                quantization_config=quantization_config, formatting_func=formatting_func)
        _check_processing_class(processing_class, model)
        self._setup(model, args, train_dataset, eval_dataset, callbacks, peft_config)


class DPOTrainer(_Trainer):
    """TRL's DPOTrainer (ref_model: a second model id or folder; None: a frozen copy of the model)."""

    _command, _config_class, _suffix = "dpo", DPOConfig, "DPO"

    def __init__(self, model, ref_model=None, args=None, data_collator=None, train_dataset=None, eval_dataset=None, processing_class=None,
                 compute_metrics=None, callbacks=None, optimizers=(None, None), quantization_config=None, peft_config=None):
        _refuse(data_collator=data_collator, compute_metrics=compute_metrics, optimizers=optimizers, quantization_config=quantization_config)
        _check_processing_class(processing_class, model)
        self._setup(model, args, train_dataset, eval_dataset, callbacks, peft_config, _ref_words(ref_model))


class KTOTrainer(_Trainer):
    """TRL's KTOTrainer."""

    _command, _config_class, _suffix = "kto", KTOConfig, "KTO"

    def __init__(self, model, ref_model=None, args=None, data_collator=None, train_dataset=None, eval_dataset=None, processing_class=None,
                 compute_metrics=None, callbacks=None, optimizers=(None, None), quantization_config=None, peft_config=None):
        _refuse(data_collator=data_collator, compute_metrics=compute_metrics, optimizers=optimizers, quantization_config=quantization_config)
        _check_processing_class(processing_class, model)
        self._setup(model, args, train_dataset, eval_dataset, callbacks, peft_config, _ref_words(ref_model))


class RewardTrainer(_Trainer):
    """TRL's RewardTrainer (a score head on the model, trained on preference pairs)."""

    _command, _config_class, _suffix = "reward", RewardConfig, "Reward"

    def __init__(self, model, args=None, data_collator=None, train_dataset=None, eval_dataset=None, processing_class=None, compute_metrics=None,
                 callbacks=None, optimizers=(None, None), optimizer_cls_and_kwargs=None, preprocess_logits_for_metrics=None,
                 quantization_config=None, peft_config=None):
        _refuse(data_collator=data_collator, compute_metrics=compute_metrics, optimizers=optimizers, optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
                preprocess_logits_for_metrics=preprocess_logits_for_metrics, quantization_config=quantization_config)
        _check_processing_class(processing_class, model)
        self._setup(model, args, train_dataset, eval_dataset, callbacks, peft_config)


class GKDTrainer(_Trainer):
    """TRL's GKDTrainer (trl.experimental.gkd): teacher_model an id or folder."""

    _command, _config_class, _suffix = "gkd", GKDConfig, "GKD"

    def __init__(self, model=None, teacher_model=None, args=None, data_collator=None, train_dataset=None, eval_dataset=None, processing_class=None,
                 compute_metrics=None, callbacks=None, optimizers=(None, None), preprocess_logits_for_metrics=None, peft_config=None,
                 formatting_func=None):
        _refuse(data_collator=data_collator, compute_metrics=compute_metrics, optimizers=optimizers,
                preprocess_logits_for_metrics=preprocess_logits_for_metrics, formatting_func=formatting_func)
        _check_processing_class(processing_class, model)
        if teacher_model is None:
            raise ValueError("GKDTrainer: teacher_model is required")
        self._setup(model, args, train_dataset, eval_dataset, callbacks, peft_config, ["--teacher_model_name_or_path", _name_of(teacher_model)])


def _name_of(model: Any) -> str:
    from ._models import PreTrainedModel

    return model.name_or_path if isinstance(model, PreTrainedModel) else os.fspath(model)


def _ref_words(ref_model: Any) -> list[str]:
    return [] if ref_model is None else ["--ref_model_name_or_path", _name_of(ref_model)]


def _check_processing_class(processing_class: Any, model: Any) -> None:
    """The engine reads the tokenizer from the model's folder; a tokenizer of another folder is refused."""
    from ._models import PreTrainedTokenizer

    if processing_class is None:
        return
    if not isinstance(processing_class, PreTrainedTokenizer):
        raise TypeError(f"processing_class: expected a tokenizer from AutoTokenizer.from_pretrained, got {type(processing_class).__name__}")
    if processing_class.changed:
        raise ValueError("processing_class: its pad_token or chat_template was changed in the script; trl_cpp trains with the tokenizer files of "
                         "the model's folder: set them there (tokenizer_config.json) instead")
    if isinstance(model, (str, os.PathLike)) and os.fspath(model) != processing_class.name_or_path:
        raise ValueError(f"processing_class: the tokenizer of {processing_class.name_or_path!r} with the model {os.fspath(model)!r}: trl_cpp trains "
                         "with the model's own tokenizer (save the tokenizer into the model's folder)")


def _reward_words(reward_funcs: Any, trainer: "_Trainer") -> tuple[list[str], list[tuple[str, Callable]]]:
    """--reward_funcs words (names, folders, exec: programs, python:N for a callable) and the callables."""
    if reward_funcs is None:
        return [], []
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    words: list[str] = []
    callables: list[tuple[str, Callable]] = []
    for f in funcs:
        if isinstance(f, (str, os.PathLike)):
            words.append(os.fspath(f))
        elif callable(f):
            words.append(f"python:{len(callables)}")
            callables.append((_callable_name(f), _reward_adapter(f, trainer)))
        else:
            raise TypeError(f"reward_funcs: expected a name, a folder or a callable, got {type(f).__name__}")
    return (["--reward_funcs"] + words if words else []), callables


def _reward_adapter(f: Callable, trainer: "_Trainer") -> Callable:
    """Calls `f` as TRL does: by keyword, with trainer_state, log_extra and log_metric beside the batch; an async
    function runs to its end on an event loop of its own (in a thread when the caller's loop is running, as in a
    notebook)."""
    is_async = inspect.iscoroutinefunction(f) or inspect.iscoroutinefunction(getattr(f, "__call__", None))
    owner = weakref.ref(trainer)  # the engine holds this function: no cycle back to the trainer

    def call(**batch: Any):
        t = owner()
        batch["trainer_state"] = t.state if t is not None else TrainerState()
        batch["log_extra"] = lambda column, values: None
        batch["log_metric"] = lambda name, value: None
        out = f(**batch)
        if is_async:
            out = _run_coroutine(out)
        return list(out) if not isinstance(out, (list, str)) and hasattr(out, "__iter__") else out

    return call


def _run_coroutine(coroutine: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = asyncio.run(coroutine)
        except BaseException as e:  # noqa: BLE001 - handed back to the caller's thread
            result["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


class GRPOTrainer(_Trainer):
    """TRL's GRPOTrainer: reward_funcs are Python callables f(prompts, completions, completion_ids, **kwargs) -> list of
    float or None, built-in names (length:N, accuracy_reward, ...), exec: programs or reward-model folders."""

    _command, _config_class, _suffix = "grpo", GRPOConfig, "GRPO"

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, processing_class=None,
                 reward_processing_classes=None, callbacks=None, optimizers=(None, None), quantization_config=None, peft_config=None, tools=None,
                 rollout_func=None, environment_factory=None):
        _refuse(reward_processing_classes=reward_processing_classes, optimizers=optimizers, quantization_config=quantization_config, tools=tools,
                rollout_func=rollout_func, environment_factory=environment_factory)
        _check_processing_class(processing_class, model)
        self.state = TrainerState()
        words, callables = _reward_words(reward_funcs, self)
        if not words:
            raise ValueError("No reward source provided. Pass `reward_funcs` (a function, a built-in name such as 'length:200', or a reward model folder)")
        if eval_dataset is not None:
            raise ValueError("GRPOTrainer: eval_dataset is not supported by trl_cpp's online trainers yet")
        self._setup(model, args, train_dataset, None, callbacks, peft_config, words, callables)


class RLOOTrainer(_Trainer):
    """TRL's RLOOTrainer (reward_funcs as for GRPOTrainer)."""

    _command, _config_class, _suffix = "rloo", RLOOConfig, "RLOO"

    def __init__(self, model, reward_funcs, args=None, train_dataset=None, eval_dataset=None, processing_class=None, reward_processing_classes=None,
                 callbacks=None, optimizers=(None, None), quantization_config=None, peft_config=None):
        _refuse(reward_processing_classes=reward_processing_classes, optimizers=optimizers, quantization_config=quantization_config)
        _check_processing_class(processing_class, model)
        self.state = TrainerState()
        words, callables = _reward_words(reward_funcs, self)
        if not words:
            raise ValueError("RLOOTrainer: reward_funcs is required")
        if eval_dataset is not None:
            raise ValueError("RLOOTrainer: eval_dataset is not supported by trl_cpp's online trainers yet")
        self._setup(model, args, train_dataset, None, callbacks, peft_config, words, callables)

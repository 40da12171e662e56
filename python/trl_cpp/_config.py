"""The Config classes (SFTConfig, GRPOConfig, TrainingArguments, ...): TRL's keyword arguments and defaults.

A Config holds the options of one `trl` command. Its fields, their kinds and defaults come from that command's
option table in the engine (the same table the command line parses), so a keyword here and a flag there are one:
`SFTConfig(learning_rate=1e-4).to_args()` is `["--learning_rate", "0.0001"]`, and the engine checks both the same
way when the trainer is made.
"""

from __future__ import annotations

import difflib
import json
import math
from typing import Any

from . import _core

# Keys of TRL's ModelConfig and ScriptArguments that the trainers take as their own arguments instead of a field.
_TRAINER_ARGUMENTS = {
    "model_name_or_path": "pass the model to the trainer: SFTTrainer(model=...)",
    "dataset_name": "pass the data to the trainer: SFTTrainer(train_dataset=load_dataset(...))",
    "reward_funcs": "pass them to the trainer: GRPOTrainer(reward_funcs=...)",
    "reward_model_name_or_path": "pass the reward model to the trainer: GRPOTrainer(reward_funcs='folder')",
    "ref_model_name_or_path": "pass the reference to the trainer: DPOTrainer(model, ref_model=...)",
    "config": "a YAML file is the command line's way; in Python give the fields as keywords",
    "teacher_model_name_or_path": "pass the teacher to the trainer: GKDTrainer(model, teacher_model=...)",
    "dataset_train_split": "pass the split itself: train_dataset=load_dataset(name, split=...)",
    "dataset_test_split": "pass the split itself: eval_dataset=load_dataset(name, split=...)",
    "dataset_config": "pass the configuration to load_dataset(name, config_name)",
    "datasets": "a dataset mixture is the command line's way; in Python pass the rows (train_dataset=...)",
    "dtype": "give it in model_init_kwargs={'dtype': ...} (TRL's ModelConfig field)",
    "torch_dtype": "give it in model_init_kwargs={'dtype': ...} (TRL's ModelConfig field)",
    "device": "give it in model_init_kwargs={'device_map': ...}",
    "model_revision": "give it in model_init_kwargs={'revision': ...}",
}

# Fields TRL's configs have that the engine reads from the trainer's arguments (handled in _trainers.py).
_PYTHON_FIELDS = {
    "model_init_kwargs": None,  # {"dtype": "bfloat16", "device_map": ...}: how a model given by name is loaded
}

_tables: dict[str, tuple[dict[str, dict], dict[str, str]]] = {}


def _table(command: str) -> tuple[dict[str, dict], dict[str, str]]:
    """The options of `command` by name, and every alias (dashes too) to its name."""
    if command not in _tables:
        specs = {}
        aliases = {}
        for spec in _core.options(command):
            specs[spec["name"]] = spec
            for a in spec["aliases"]:
                aliases[a] = spec["name"]
                aliases[a.replace("_", "-")] = spec["name"]
        _tables[command] = (specs, aliases)
    return _tables[command]


def _parse(spec: dict, t: str) -> Any:
    if t == "None":
        return None
    if spec["kind"] == "bool":
        return t == "true"
    if spec["kind"] == "int":
        return int(t)
    if spec["kind"] == "float":
        return float(t)
    return t


def _default(spec: dict) -> Any:
    """An option's default as a Python value, from what the command line's --help shows: the value itself, or the
    text that stands for it ("None (gradient_accumulation_steps)" is None, "group" is "group")."""
    text, shown = spec["value"], spec["shown"]
    if shown:
        word = shown.split(" ", 1)[0].rstrip(",")
        if word == "None" or word.startswith("{") or word.startswith("["):
            return None  # TRL's None (a dict or list field left unset)
        if " " not in shown and text in ("", "none"):
            return _parse(spec, shown)
    if spec["list"]:
        return None if text in ("", "none") else [_parse(spec, t) for t in text.split(",")]
    if spec["kind"] == "str" and text == "" and spec["json"]:
        return None
    return _parse(spec, text)


def _flag_values(name: str, spec: dict, value: Any) -> list[str] | None:
    """The words of `--name value` on the command line, or None when the option is left at its default."""
    if value is None:
        # TRL's None: unset. The command line spells it None where the option can be unset.
        return ["None"] if spec["optional"] or spec["kind"] == "str" else None
    if spec["json"]:
        return [value if isinstance(value, str) else json.dumps(value)]
    if isinstance(value, dict):
        return [json.dumps(value)]
    if spec["list"]:
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        return [_word(name, spec, v) for v in values] if values else None
    return [_word(name, spec, value)]


def _word(name: str, spec: dict, v: Any) -> str:
    import enum
    import numbers

    if isinstance(v, enum.Enum):  # SchedulerType.COSINE, IntervalStrategy.STEPS
        v = v.value
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    if isinstance(v, numbers.Integral):  # int, NumPy integers
        return str(int(v))
    if isinstance(v, numbers.Real):
        x = float(v)
        if not math.isfinite(x):
            raise ValueError(f"{name}={v!r}: must be a finite number")
        return repr(x)
    raise TypeError(f"{name}={v!r}: expected {spec['kind']}, got {type(v).__name__}")


class _Config:
    """Fields by keyword, with TRL's defaults; unknown keywords are a TypeError, as for TRL's dataclasses."""

    _command = "sft"
    _kind = "TrainingArguments"  # what TRL names the class

    def __init__(self, output_dir: str | None = None, **kwargs: Any) -> None:
        object.__setattr__(self, "_given", {})
        object.__setattr__(self, "_python", dict(_PYTHON_FIELDS))
        if output_dir is not None:
            self._given["output_dir"] = output_dir
        for key, value in kwargs.items():
            setattr(self, key, value)

    # -- fields ------------------------------------------------------------------------------------------------------

    def _name(self, key: str) -> str:
        specs, aliases = _table(self._command)
        if key in _PYTHON_FIELDS:
            return key
        if key in _TRAINER_ARGUMENTS and key in aliases:
            raise TypeError(f"{type(self).__name__}: '{key}' is not a field of {self._kind}: {_TRAINER_ARGUMENTS[key]}")
        if key not in aliases:
            close = difflib.get_close_matches(key, list(specs) + list(_PYTHON_FIELDS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise TypeError(f"{type(self).__name__}.__init__() got an unexpected keyword argument '{key}'{hint}")
        return aliases[key]

    def __setattr__(self, key: str, value: Any) -> None:
        if key.startswith("_"):
            object.__setattr__(self, key, value)
            return
        name = self._name(key)
        if name in _PYTHON_FIELDS:
            self._python[name] = json.loads(value) if isinstance(value, str) and value.startswith("{") else value
        else:
            self._given[name] = value

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        try:
            name = self._name(key)
        except TypeError as e:
            raise AttributeError(str(e)) from None
        if name in _PYTHON_FIELDS:
            return self._python[name]
        if name in self._given:
            return self._given[name]
        if name == "output_dir":
            return "trainer_output"  # Transformers' default when none is given
        return _default(_table(self._command)[0][name])

    def to_dict(self) -> dict[str, Any]:
        """Every field with its value (given or default)."""
        specs, _ = _table(self._command)
        out = {name: getattr(self, name) for name in specs if name not in _TRAINER_ARGUMENTS}
        out.update(self._python)
        return out

    def given(self) -> dict[str, Any]:
        """The fields set by keyword or assignment."""
        return dict(self._given)

    def _args_fields(self) -> dict[str, Any]:
        return self._given

    def to_args(self) -> list[str]:
        """The command-line words of the fields given (the engine's defaults are TRL's for the rest)."""
        specs, _ = _table(self._command)
        args = ["--output_dir", str(getattr(self, "output_dir"))]
        for name, value in self._args_fields().items():
            if name == "output_dir":
                continue
            words = _flag_values(name, specs[name], value)
            if words is not None:
                args += ["--" + name] + words
        return args

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self._given.items())
        return f"{type(self).__name__}({given})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.to_dict() == other.to_dict()  # type: ignore[union-attr]


def _config_class(name: str, command: str, doc: str) -> type:
    return type(name, (_Config,), {"_command": command, "_kind": name, "__doc__": doc, "__module__": "trl_cpp"})


SFTConfig = _config_class("SFTConfig", "sft", "TRL's SFTConfig: supervised fine-tuning (`trl sft`).")
DPOConfig = _config_class("DPOConfig", "dpo", "TRL's DPOConfig: direct preference optimization (`trl dpo`).")
KTOConfig = _config_class("KTOConfig", "kto", "TRL's KTOConfig (`trl kto`).")
RewardConfig = _config_class("RewardConfig", "reward", "TRL's RewardConfig: reward-model training (`trl reward`).")
GRPOConfig = _config_class("GRPOConfig", "grpo", "TRL's GRPOConfig (`trl grpo`).")
RLOOConfig = _config_class("RLOOConfig", "rloo", "TRL's RLOOConfig (`trl rloo`).")
GKDConfig = _config_class("GKDConfig", "gkd", "TRL's GKDConfig: generalized knowledge distillation (`trl gkd`).")


class TrainingArguments(_Config):
    """Transformers' TrainingArguments: the options every trainer shares, with Transformers' defaults where TRL's
    configs change them. A trainer given one reads all its fields (as TRL's trainers convert it to their config)."""

    _command = "sft"
    _kind = "TrainingArguments"
    _shared: set[str] | None = None
    # Transformers' defaults that TRL's configs override (TRL's _BaseConfig: logging_steps 10, gradient
    # checkpointing on, bf16 on; SFTConfig: learning_rate 2e-5).
    _transformers_defaults = {"learning_rate": 5e-5, "logging_steps": 500, "gradient_checkpointing": False, "bf16": False}

    def __getattr__(self, key: str) -> Any:
        if not key.startswith("_") and key in self._transformers_defaults and key not in self._given:
            return self._transformers_defaults[key]
        return super().__getattr__(key)

    def given(self) -> dict[str, Any]:
        return {**self._transformers_defaults, **self._given}

    def _args_fields(self) -> dict[str, Any]:
        return self.given()

    def _name(self, key: str) -> str:
        name = super()._name(key)
        if TrainingArguments._shared is None:
            names = [set(_table(c)[0]) for c in ("sft", "dpo", "kto", "reward", "grpo", "rloo", "gkd")]
            TrainingArguments._shared = set.intersection(*names)
        if name not in TrainingArguments._shared and name not in _PYTHON_FIELDS:
            raise TypeError(f"TrainingArguments.__init__() got an unexpected keyword argument '{key}' (a field of a TRL config, not of TrainingArguments)")
        return name

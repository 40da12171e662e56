"""PEFT's LoraConfig, as `peft_config=` of a trainer: the engine trains a LoRA adapter (docs/LORA.md) and saves it in
PEFT's format (adapter_config.json, adapter_model.safetensors)."""

from __future__ import annotations

from typing import Any


class LoraConfig:
    """peft.LoraConfig's fields the engine reads; the others keep PEFT's defaults and must stay at them."""

    def __init__(self, r: int = 8, lora_alpha: float = 8, lora_dropout: float = 0.0, target_modules: Any = None, modules_to_save: Any = None,
                 target_parameters: Any = None,
                 task_type: str | None = "CAUSAL_LM", use_rslora: bool = False, use_dora: bool = False, bias: str = "none",
                 inference_mode: bool = False, **kwargs: Any) -> None:
        if bias != "none":
            raise ValueError(f"LoraConfig(bias={bias!r}): trl.cpp trains adapters without biases (bias='none')")
        if use_dora:
            raise ValueError("LoraConfig(use_dora=True): DoRA is not available in trl.cpp (plain LoRA, or use_rslora=True)")
        for key in ("fan_in_fan_out", "layers_to_transform", "layers_pattern", "rank_pattern", "alpha_pattern", "exclude_modules"):
            if kwargs.pop(key, None) not in (None, False, {}):
                raise ValueError(f"LoraConfig({key}=...): not available in trl.cpp")
        if kwargs.pop("init_lora_weights", True) is not True:
            raise ValueError("LoraConfig(init_lora_weights=...): trl.cpp initialises adapters as PEFT's default (True) does")
        if kwargs:
            raise TypeError(f"LoraConfig.__init__() got an unexpected keyword argument '{next(iter(kwargs))}'")
        self.r, self.lora_alpha, self.lora_dropout = r, lora_alpha, lora_dropout
        self.target_modules, self.modules_to_save = target_modules, modules_to_save
        self.target_parameters = target_parameters
        self.task_type = getattr(task_type, "value", task_type)
        self.use_rslora, self.use_dora, self.bias, self.inference_mode = use_rslora, use_dora, bias, inference_mode

    def to_args(self) -> list[str]:
        args = ["--use_peft", "--lora_r", str(self.r), "--lora_alpha", repr(float(self.lora_alpha)), "--lora_dropout", repr(float(self.lora_dropout))]
        if self.target_modules:  # None or []: the default (with target_parameters: none, as PEFT)
            modules = [self.target_modules] if isinstance(self.target_modules, str) else list(self.target_modules)
            args += ["--lora_target_modules"] + modules
        if self.target_parameters:
            params = [self.target_parameters] if isinstance(self.target_parameters, str) else list(self.target_parameters)
            args += ["--lora_target_parameters"] + params
        if self.modules_to_save:
            args += ["--lora_modules_to_save"] + list(self.modules_to_save)
        if self.task_type is not None:
            args += ["--lora_task_type", str(self.task_type)]
        if self.use_rslora:
            args += ["--use_rslora"]
        return args

    def __repr__(self) -> str:
        return (f"LoraConfig(r={self.r}, lora_alpha={self.lora_alpha}, lora_dropout={self.lora_dropout}, target_modules={self.target_modules!r}, "
                f"target_parameters={self.target_parameters!r}, task_type={self.task_type!r})")

"""trl_cpp: TRL's and Transformers' Python API on trl.cpp's native engine, without PyTorch.

The seeds' scripts run with their import lines changed:

    from trl_cpp import load_dataset, SFTTrainer          # was: from datasets import ...; from trl import ...
    trainer = SFTTrainer(model="Qwen/Qwen3-0.6B", train_dataset=load_dataset("trl-lib/Capybara", split="train"))
    trainer.train()

Models and datasets are read from local folders and the local Hugging Face cache; nothing is downloaded.
docs/PYTHON.md shows each seed snippet beside its trl_cpp form and says what differs from TRL.
"""

from ._core import EngineError
from ._core import __version__ as build  # "0.1.0 (commit)": the engine's version and the commit it was built from

__version__ = build.split(" ")[0]
from ._config import (DPOConfig, GKDConfig, GRPOConfig, KTOConfig, RewardConfig, RLOOConfig, SFTConfig, TrainingArguments)
from ._data import Dataset, load_dataset
from ._models import (AutoModelForCausalLM, AutoTokenizer, BatchEncoding, GenerationConfig, PreTrainedModel, PreTrainedTokenizer)
from ._peft import LoraConfig
from ._trainers import (DPOTrainer, GKDTrainer, GRPOTrainer, KTOTrainer, RewardTrainer, RLOOTrainer, SFTTrainer, TrainerCallback,
                        TrainerControl, TrainerState, TrainOutput)

__all__ = [
    "AutoModelForCausalLM", "AutoTokenizer", "BatchEncoding", "DPOConfig", "DPOTrainer", "Dataset", "EngineError", "GKDConfig", "GKDTrainer",
    "GRPOConfig", "GRPOTrainer", "GenerationConfig", "KTOConfig", "KTOTrainer", "LoraConfig", "PreTrainedModel", "PreTrainedTokenizer",
    "RLOOConfig", "RLOOTrainer", "RewardConfig", "RewardTrainer", "SFTConfig", "SFTTrainer", "TrainOutput", "TrainerCallback", "TrainerControl",
    "TrainerState", "TrainingArguments", "build", "load_dataset", "__version__",
]

"""Transformers' AutoTokenizer and AutoModelForCausalLM over the engine: tokenize, apply_chat_template, decode, and
generate() on the static-cache engine. Tensors are NumPy arrays where NumPy is installed (return_tensors="np" or
"pt"), else nested lists; generate() takes either."""

from __future__ import annotations

import os
from collections import UserDict
from typing import Any

from . import _core

try:  # optional: arrays when the script has NumPy, lists otherwise
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the machine
    _np = None


def _tensor(rows: list[list[int]], return_tensors: str | None):
    if return_tensors is None:
        return rows
    if return_tensors not in ("pt", "np"):
        raise ValueError(f"return_tensors={return_tensors!r}: trl_cpp returns NumPy arrays ('np', and 'pt' without PyTorch) or lists (None)")
    if _np is None:
        return rows  # no NumPy: nested lists, which generate() and decode() take as they are
    return _np.asarray(rows, dtype=_np.int64)


def _rows(x: Any, what: str) -> list[list[int]]:
    """A [B, T] batch (array, tensor or nested list) or one [T] row, as lists of ints."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, (list, tuple)) and x and all(isinstance(v, int) for v in x):
        return [list(x)]
    if not isinstance(x, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in x):
        raise TypeError(f"{what}: expected token ids as a [batch, length] array or nested list, got {type(x).__name__}")
    return [[int(v) for v in r] for r in x]


class BatchEncoding(UserDict):
    """Transformers' BatchEncoding: input_ids and attention_mask, by key or attribute."""

    def __getattr__(self, key: str):
        try:
            return self.data[key]
        except KeyError:
            raise AttributeError(key) from None

    def to(self, device: Any) -> "BatchEncoding":  # tensors stay on the host, as the seeds advise
        return self


class PreTrainedTokenizer:
    """A tokenizer.json tokenizer with its chat template (AutoTokenizer.from_pretrained)."""

    def __init__(self, core: Any, name_or_path: str) -> None:
        self._t = core
        self.name_or_path = name_or_path
        self.padding_side = "right"
        self._pad_token: str | None = None  # set by the script (tokenizer.pad_token = tokenizer.eos_token)
        self._chat_template: str | None = None

    # special tokens (pad_token and chat_template may be set, as scripts do; a trainer reads the model folder's files)
    eos_token = property(lambda self: self._t.eos_token)
    bos_token = property(lambda self: self._t.bos_token or None)
    eos_token_id = property(lambda self: self._t.eos_token_id)
    bos_token_id = property(lambda self: self._t.bos_token_id)
    vocab_size = property(lambda self: self._t.vocab_size)

    @property
    def pad_token(self) -> str:
        return self._pad_token if self._pad_token is not None else (self._t.pad_token or self._t.eos_token)

    @pad_token.setter
    def pad_token(self, token: str) -> None:
        if self._t.token_to_id(token) is None:
            raise ValueError(f"pad_token {token!r} is not a token of this tokenizer")
        self._pad_token = token

    @property
    def pad_token_id(self) -> int | None:
        return self._t.token_to_id(self._pad_token) if self._pad_token is not None else self._t.pad_token_id

    @property
    def chat_template(self) -> str | None:
        return self._chat_template if self._chat_template is not None else (self._t.chat_template or None)

    @chat_template.setter
    def chat_template(self, template: str) -> None:
        self._chat_template = template

    @property
    def changed(self) -> bool:
        """Whether the script set pad_token or chat_template (the trainers read the model folder's files instead)."""
        return self._pad_token is not None or self._chat_template is not None

    def _pad(self, ids: list[list[int]], padding: Any, max_length: int | None, side: str) -> tuple[list[list[int]], list[list[int]]]:
        pad_to = None
        if padding in (True, "longest"):
            pad_to = max((len(r) for r in ids), default=0)
        elif padding == "max_length":
            if max_length is None:
                raise ValueError("padding='max_length' needs max_length")
            pad_to = max_length
        elif padding not in (False, "do_not_pad", None):
            raise ValueError(f"padding={padding!r}: expected True, 'longest', 'max_length' or False")
        masks = [[1] * len(r) for r in ids]
        if pad_to is None:
            return ids, masks
        pid = self.pad_token_id
        out_ids, out_masks = [], []
        for r, m in zip(ids, masks):
            fill = [pid] * max(0, pad_to - len(r))
            zeros = [0] * len(fill)
            out_ids.append(r + fill if side == "right" else fill + r)
            out_masks.append(m + zeros if side == "right" else zeros + m)
        return out_ids, out_masks

    def __len__(self) -> int:
        return self._t.vocab_size

    def __call__(self, text: str | list[str], add_special_tokens: bool = True, padding: bool | str = False, truncation: bool | str | None = None,
                 max_length: int | None = None, padding_side: str | None = None, return_tensors: str | None = None, **kwargs: Any) -> BatchEncoding:
        for ignored in ("return_attention_mask", "return_token_type_ids", "verbose"):
            kwargs.pop(ignored, None)
        if kwargs:
            raise TypeError(f"tokenizer() got an unexpected keyword argument '{next(iter(kwargs))}'")
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        ids = [self._t.encode(t, add_special_tokens) for t in texts]
        if truncation not in (None, False, "do_not_truncate") and max_length is not None:
            ids = [r[:max_length] for r in ids]
        ids, masks = self._pad(ids, padding, max_length, padding_side or self.padding_side)
        if return_tensors is not None:
            if len({len(r) for r in ids}) > 1:
                raise ValueError("rows of different lengths cannot be one tensor: pass padding=True")
            return BatchEncoding({"input_ids": _tensor(ids, return_tensors), "attention_mask": _tensor(masks, return_tensors)})
        if single:
            return BatchEncoding({"input_ids": ids[0], "attention_mask": masks[0]})
        return BatchEncoding({"input_ids": ids, "attention_mask": masks})

    def encode(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        return self(text, add_special_tokens=add_special_tokens, **kwargs)["input_ids"]

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str | list[str]:
        if hasattr(token_ids, "tolist"):
            token_ids = token_ids.tolist()
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        if token_ids and isinstance(token_ids[0], (list, tuple)):
            return [self._t.decode([int(i) for i in r], skip_special_tokens) for r in token_ids]
        return self._t.decode([int(i) for i in token_ids], skip_special_tokens)

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = False, **kwargs: Any) -> list[str]:
        return [self.decode(r, skip_special_tokens) for r in _rows(sequences, "batch_decode")]

    def convert_tokens_to_ids(self, tokens: str | list[str]):
        if isinstance(tokens, str):
            return self._t.token_to_id(tokens)
        return [self._t.token_to_id(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | list[int]):
        if isinstance(ids, int):
            return self._t.id_to_token(ids)
        return [self._t.id_to_token(int(i)) for i in ids]

    def apply_chat_template(self, conversation: list, tools: list | None = None, documents: list | None = None, chat_template: str | None = None,
                            add_generation_prompt: bool = False, continue_final_message: bool = False, tokenize: bool = True,
                            return_tensors: str | None = None, return_dict: bool = True, **kwargs: Any):
        """Transformers v5's apply_chat_template: with tokenize (the default) a BatchEncoding (return_dict=True) or
        the ids; with tokenize=False the text. Other keywords (enable_thinking=False, ...) are template variables."""
        padding = kwargs.pop("padding", False)
        truncation = kwargs.pop("truncation", False)
        max_length = kwargs.pop("max_length", None)
        for ignored in ("tokenizer_kwargs", "return_assistant_tokens_mask", "sanitize_control_tokens"):
            kwargs.pop(ignored, None)
        if add_generation_prompt and continue_final_message:
            raise ValueError("continue_final_message and add_generation_prompt are not compatible")
        batched = bool(conversation) and isinstance(conversation[0], (list, tuple))
        convs = conversation if batched else [conversation]
        template = chat_template if chat_template is not None else self._chat_template
        texts = [self._t.render_chat(c, add_generation_prompt, bool(continue_final_message), tools, documents, template, kwargs) for c in convs]
        if not tokenize:
            return texts if batched else texts[0]
        ids = [self._t.encode(t, False) for t in texts]
        if truncation and max_length is not None:
            ids = [r[:max_length] for r in ids]
        ids, masks = self._pad(ids, padding, max_length, self.padding_side)
        if return_tensors is not None:
            if len({len(r) for r in ids}) > 1:
                raise ValueError("conversations of different lengths cannot be one tensor: pass padding=True")
            enc = BatchEncoding({"input_ids": _tensor(ids, return_tensors), "attention_mask": _tensor(masks, return_tensors)})
        else:
            enc = BatchEncoding({"input_ids": ids if batched else ids[0], "attention_mask": masks if batched else masks[0]})
        return enc if return_dict else enc["input_ids"]

    def __repr__(self) -> str:
        return f"PreTrainedTokenizer(name_or_path={self.name_or_path!r}, vocab_size={self.vocab_size})"


class AutoTokenizer:
    @staticmethod
    def from_pretrained(pretrained_model_name_or_path: str | os.PathLike, revision: str = "main", **kwargs: Any) -> PreTrainedTokenizer:
        for ignored in ("trust_remote_code", "use_fast", "cache_dir", "token", "local_files_only"):
            kwargs.pop(ignored, None)
        side = kwargs.pop("padding_side", None)
        if kwargs:
            raise TypeError(f"AutoTokenizer.from_pretrained() got an unexpected keyword argument '{next(iter(kwargs))}'")
        name = os.fspath(pretrained_model_name_or_path)
        tok = PreTrainedTokenizer(_core.Tokenizer.from_pretrained(name, revision), name)
        if side is not None:
            tok.padding_side = side
        return tok


class GenerationConfig:
    """Transformers' GenerationConfig: the fields generate() reads (None: the model's generation_config.json, else
    Transformers' default)."""

    _FIELDS = ("max_new_tokens", "max_length", "do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "num_return_sequences",
               "eos_token_id", "pad_token_id", "stop_strings", "cache_implementation", "disable_compile", "seed", "pad_to_multiple_of")

    def __init__(self, **kwargs: Any) -> None:
        for k in self._FIELDS:
            setattr(self, k, None)
        for k, v in kwargs.items():
            if k not in self._FIELDS and k not in _IGNORED_GENERATE:
                raise TypeError(f"GenerationConfig: '{k}' is not a field trl.cpp reads ({', '.join(self._FIELDS)})")
            setattr(self, k, v)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self._FIELDS if getattr(self, k) is not None}


# Keywords of generate() that change nothing here (the engine always uses its static cache and returns ids).
_IGNORED_GENERATE = {"use_cache", "compile_config", "synced_gpus", "output_scores", "return_dict_in_generate", "num_beams", "cache_config"}


class PreTrainedModel:
    """A causal LM loaded by the engine (AutoModelForCausalLM.from_pretrained); generate() runs its compiled
    static-cache programs."""

    def __init__(self, core: Any, name_or_path: str) -> None:
        self._m = core
        self.name_or_path = name_or_path
        self.generation_config = GenerationConfig()

    @property
    def config(self) -> dict:
        return self._m.config

    @property
    def dtype(self) -> str:
        return self._m.dtype

    @property
    def device(self) -> str:
        return self._m.device

    def to(self, device: Any) -> "PreTrainedModel":
        return self

    def eval(self) -> "PreTrainedModel":
        return self

    def generate(self, inputs: Any = None, generation_config: GenerationConfig | None = None, input_ids: Any = None, attention_mask: Any = None,
                 tokenizer: PreTrainedTokenizer | None = None, **kwargs: Any):
        """Transformers' generate(): the prompts (input_ids, left- or right-padded with attention_mask) and new tokens,
        [rows, prompt + new] with finished rows filled with pad_token_id; an array when the input was one."""
        if inputs is not None and input_ids is not None:
            raise ValueError("generate(): pass the prompts once (inputs or input_ids)")
        ids_in = inputs if inputs is not None else input_ids
        if ids_in is None:
            raise ValueError("generate(): input_ids is required")
        as_array = hasattr(ids_in, "tolist") and _np is not None
        rows = _rows(ids_in, "input_ids")
        masks = _rows(attention_mask, "attention_mask") if attention_mask is not None else [[1] * len(r) for r in rows]
        if len(masks) != len(rows) or any(len(m) != len(r) for m, r in zip(masks, rows)):
            raise ValueError("generate(): attention_mask must have the shape of input_ids")
        prompts = [[t for t, m in zip(r, mk) if m] for r, mk in zip(rows, masks)]
        options = dict(self.generation_config.to_dict())
        if generation_config is not None:
            options.update(generation_config.to_dict())
        for k, v in kwargs.items():
            if k in _IGNORED_GENERATE:
                continue
            if k not in GenerationConfig._FIELDS:
                raise TypeError(f"generate() got an unexpected keyword argument '{k}'")
            options[k] = v
        if options.get("stop_strings") and tokenizer is None:
            raise ValueError("generate(stop_strings=...) needs tokenizer=: the strings are matched on the decoded text, as in Transformers")
        new = self._m.generate(prompts, options, tokenizer._t if tokenizer is not None else None)
        n = int(options.get("num_return_sequences") or 1)
        pad = options.get("pad_token_id")
        if pad is None:
            pad = self._pad_id(tokenizer)
        longest = max((len(g) for g in new), default=0)
        out = [rows[i // n] + g + [pad] * (longest - len(g)) for i, g in enumerate(new)]
        return _np.asarray(out, dtype=_np.int64) if as_array else out

    def _pad_id(self, tokenizer: PreTrainedTokenizer | None) -> int:
        if tokenizer is not None and tokenizer.pad_token_id is not None:
            return tokenizer.pad_token_id
        cfg = self.config
        eos = cfg.get("pad_token_id") if cfg.get("pad_token_id") is not None else cfg.get("eos_token_id")
        return eos[0] if isinstance(eos, list) else (eos if eos is not None else 0)

    def __repr__(self) -> str:
        return f"PreTrainedModel(name_or_path={self.name_or_path!r}, dtype={self.dtype!r}, device={self.device!r})"


class AutoModelForCausalLM:
    @staticmethod
    def from_pretrained(pretrained_model_name_or_path: str | os.PathLike, dtype: Any = "auto", device_map: Any = None, revision: str = "main",
                        torch_dtype: Any = None, **kwargs: Any) -> PreTrainedModel:
        """Loads a model folder or a local-cache id (or a PEFT adapter folder, merged into its base). dtype 'auto'
        (the checkpoint's), 'bfloat16' or 'float32'; device_map 'auto', 'cpu' or 'cuda' (the engine's devices)."""
        for ignored in ("trust_remote_code", "attn_implementation", "low_cpu_mem_usage", "cache_dir", "token", "local_files_only", "use_cache"):
            kwargs.pop(ignored, None)
        if kwargs:
            raise TypeError(f"AutoModelForCausalLM.from_pretrained() got an unexpected keyword argument '{next(iter(kwargs))}'")
        if torch_dtype is not None:
            dtype = torch_dtype
        dtype = "auto" if dtype is None else str(dtype).replace("torch.", "")
        device = "auto" if device_map is None else str(device_map).split(":")[0]
        if device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device_map={device_map!r}: trl.cpp places a model with 'auto', 'cpu' or 'cuda' (see `trl env`)")
        name = os.fspath(pretrained_model_name_or_path)
        return PreTrainedModel(_core.Model.from_pretrained(name, dtype, device, revision), name)

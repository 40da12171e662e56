"""Datasets: `load_dataset` over the local Hugging Face cache (as `datasets` reads it, nothing downloaded), a small
`Dataset` of rows, and what a trainer passes to the engine for each kind of data a script gives it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from . import _core


class Dataset(Sequence):
    """Rows (dicts) of one split. Made by `load_dataset` (then it remembers where it came from, and a trainer reads
    the files itself) or from rows in memory (`Dataset.from_list`)."""

    def __init__(self, rows: list[dict], source: dict | None = None) -> None:
        self._rows = rows
        self._source = source  # {"name", "split", "config", "revision"} while the rows are the files' own

    @classmethod
    def from_list(cls, rows: Iterable[Mapping]) -> "Dataset":
        return cls([dict(r) for r in rows])

    @classmethod
    def from_dict(cls, columns: Mapping[str, Sequence]) -> "Dataset":
        names = list(columns)
        lengths = {len(columns[n]) for n in names}
        if len(lengths) > 1:
            raise ValueError(f"Dataset.from_dict: the columns have different lengths {sorted(lengths)}")
        n = lengths.pop() if lengths else 0
        return cls([{k: columns[k][i] for k in names} for i in range(n)])

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def num_rows(self) -> int:
        return len(self._rows)

    @property
    def column_names(self) -> list[str]:
        names: dict[str, None] = {}
        for r in self._rows[:100]:
            names.update(dict.fromkeys(r))
        return list(names)

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, str):
            if key not in self.column_names:
                raise KeyError(f"column '{key}' not in the dataset (columns: {self.column_names})")
            return [r.get(key) for r in self._rows]
        if isinstance(key, slice):
            return Dataset(self._rows[key])
        return self._rows[key]

    def __iter__(self):
        return iter(self._rows)

    def to_list(self) -> list[dict]:
        return list(self._rows)

    def select(self, indices: Iterable[int]) -> "Dataset":
        return Dataset([self._rows[i] for i in indices])

    def shuffle(self, seed: int | None = None) -> "Dataset":
        import random

        rows = list(self._rows)
        random.Random(seed).shuffle(rows)
        return Dataset(rows)

    def map(self, function, with_indices: bool = False, batched: bool = False, batch_size: int | None = 1000, remove_columns: Sequence[str] | str | None = None,
            fn_kwargs: dict | None = None, **kwargs: Any) -> "Dataset":
        """datasets' map: `function(row)` (or, batched, `function(columns)` on dicts of lists) returns new or updated
        columns; remove_columns are dropped before they are merged, as in datasets."""
        for ignored in ("num_proc", "desc", "load_from_cache_file", "keep_in_memory", "cache_file_name"):
            kwargs.pop(ignored, None)
        if kwargs:
            raise TypeError(f"Dataset.map() got an unexpected keyword argument '{next(iter(kwargs))}'")
        drop = [remove_columns] if isinstance(remove_columns, str) else list(remove_columns or [])
        extra = dict(fn_kwargs or {})
        out: list[dict] = []
        if not batched:
            for i, r in enumerate(self._rows):
                new = function(r, i, **extra) if with_indices else function(r, **extra)
                row = {k: v for k, v in r.items() if k not in drop}
                row.update(new or {})
                out.append(row)
            return Dataset(out)
        step = batch_size if batch_size and batch_size > 0 else max(1, len(self._rows))
        for start in range(0, len(self._rows), step):
            rows = self._rows[start:start + step]
            columns = {k: [r.get(k) for r in rows] for k in self.column_names}
            new = function(columns, list(range(start, start + len(rows))), **extra) if with_indices else function(columns, **extra)
            new = new or {}
            lengths = {len(v) for v in new.values()}
            if len(lengths) > 1:
                raise ValueError(f"Dataset.map(batched=True): the function returned columns of different lengths {sorted(lengths)}")
            n = lengths.pop() if lengths else len(rows)
            if n != len(rows) and not set(columns) <= set(drop) | set(new):
                raise ValueError(f"Dataset.map(batched=True): {n} rows returned for {len(rows)}: remove the old columns (remove_columns=...)")
            for i in range(n):
                row = {k: v[i] for k, v in columns.items() if k not in drop} if n == len(rows) else {}
                row.update({k: v[i] for k, v in new.items()})
                out.append(row)
        return Dataset(out)

    def filter(self, function, with_indices: bool = False, **kwargs: Any) -> "Dataset":
        for ignored in ("num_proc", "desc", "load_from_cache_file"):
            kwargs.pop(ignored, None)
        if kwargs:
            raise TypeError(f"Dataset.filter() got an unexpected keyword argument '{next(iter(kwargs))}'")
        return Dataset([r for i, r in enumerate(self._rows) if (function(r, i) if with_indices else function(r))])

    def __repr__(self) -> str:
        return f"Dataset({{features: {self.column_names}, num_rows: {len(self)}}})"


def load_dataset(path: str, name: str | None = None, data_dir: str | None = None, data_files: Any = None, split: str | None = None,
                 revision: str | None = None, **kwargs: Any):
    """`datasets.load_dataset` over local data: a Hub id in the local cache, a folder, or a .jsonl/.json/.parquet
    file. With `split=None`, a dict of the splits "train" and "test" that exist."""
    if data_dir is not None or data_files is not None:
        raise ValueError("load_dataset: data_dir and data_files are the command line's (trl sft --data_files ...); in Python load the files one by "
                         "one (load_dataset('file.jsonl')) or pass the folder")
    for key in ("streaming", "num_proc", "cache_dir", "keep_in_memory", "token", "download_mode", "verification_mode"):
        kwargs.pop(key, None)
    if kwargs:
        raise TypeError(f"load_dataset() got an unexpected keyword argument '{next(iter(kwargs))}'")
    rev = revision or "main"
    if split is None:  # every split there is, by name (datasets' DatasetDict; here a dict)
        splits = {s: load_dataset(path, name, split=s, revision=rev) for s in ("train", "validation", "test") if _core.has_split(path, s, name or "", rev)}
        if not splits:
            load_dataset(path, name, split="train", revision=rev)  # raises with the engine's message
        return splits
    if not _core.has_split(path, split, name or "", rev):
        known = [s for s in ("train", "validation", "test") if _core.has_split(path, s, name or "", rev)]
        if known:  # the dataset is there without this split (a dataset that is not there: dataset_rows says where it looked)
            raise ValueError(f'Unknown split "{split}". Should be one of {known}.')
    rows = _core.dataset_rows(path, split, name or "", rev)
    return Dataset(rows, {"name": path, "split": split, "config": name or "", "revision": rev})


def _rows_of(data: Any, what: str) -> list[dict]:
    if isinstance(data, Dataset):
        return data.to_list()
    if hasattr(data, "to_list") and callable(data.to_list):  # a datasets.Dataset
        return list(data.to_list())
    if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
        raise TypeError(f"{what}: expected a dataset (load_dataset(...), a list of dicts), got {type(data).__name__}")
    rows = []
    for i, r in enumerate(data):
        if not isinstance(r, Mapping):
            raise TypeError(f"{what}[{i}]: a row must be a dict (a mapping of column to value), got {type(r).__name__}")
        rows.append(dict(r))
    return rows


def _write_jsonl(path: str, rows: list[dict], what: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i, r in enumerate(rows):
            try:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
            except TypeError as e:
                raise TypeError(f"{what}[{i}]: {e} (rows hold str, numbers, bools, None, lists and dicts)") from None


def dataset_args(train: Any, eval_: Any, workdir: str) -> list[str]:
    """The command-line words that make the engine read `train` (and `eval_`): the files of a loaded dataset when
    both come from one place, else the rows written as JSON lines into `workdir`."""
    def source(d: Any) -> dict | None:
        if isinstance(d, str):
            return {"name": d, "split": "train", "config": "", "revision": "main"}
        return d._source if isinstance(d, Dataset) else None

    st, se = source(train), (source(eval_) if eval_ is not None else None)
    same_place = st is not None and st["revision"] == "main" and (eval_ is None or (se is not None and (se["name"], se["config"], se["revision"]) == (st["name"], st["config"], st["revision"])))
    if same_place:
        args = ["--dataset_name", st["name"], "--dataset_train_split", st["split"]]
        if st["config"]:
            args += ["--dataset_config", st["config"]]
        if se is not None:
            args += ["--dataset_test_split", se["split"]]
        return args
    folder = os.path.join(workdir, "data")
    os.makedirs(folder, exist_ok=True)
    _write_jsonl(os.path.join(folder, "train.jsonl"), _rows_of(train, "train_dataset"), "train_dataset")
    args = ["--dataset_name", folder, "--dataset_train_split", "train"]
    if eval_ is not None:
        _write_jsonl(os.path.join(folder, "test.jsonl"), _rows_of(eval_, "eval_dataset"), "eval_dataset")
        args += ["--dataset_test_split", "test"]
    return args

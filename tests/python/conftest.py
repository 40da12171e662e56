"""Fixtures of the Python package's tests: a local Hugging Face cache holding a tiny model under the seeds' model id
(Qwen/Qwen3-0.6B: the tiny preset with the 4096-token cut vocabulary) and small datasets under the seeds' dataset
ids, so that the seeds' snippets run as written, offline, in seconds."""

import hashlib
import json
import os
import subprocess

import pytest

TRL = os.environ.get("TRL_BINARY", "trl")


def snapshot(root, kind, repo_id):
    """A Hub-cache snapshot folder of `repo_id` (kind 'models' or 'datasets') with refs/main pointing at it."""
    repo = root / f"{kind}--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snap


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


QUESTIONS = [("What is the capital of France?", "Paris."), ("What is 2 + 2?", "4."), ("Name a primary colour.", "Red."),
             ("What do bees make?", "Honey."), ("What is the opposite of hot?", "Cold."), ("How many legs has a spider?", "Eight."),
             ("What colour is the sky?", "Blue."), ("What is frozen water called?", "Ice.")]


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    model = snapshot(root, "models", "Qwen/Qwen3-0.6B")
    subprocess.run([TRL, "init-model", "--preset", "tiny", "--vocab_size", "4096", "--seed", "3", "--initializer_range", "0.1", "--out", str(model)],
                   check=True, capture_output=True)
    capybara = snapshot(root, "datasets", "trl-lib/Capybara")
    write_jsonl(capybara / "data" / "train.jsonl",
                [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in QUESTIONS])
    write_jsonl(capybara / "data" / "test.jsonl",
                [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in QUESTIONS[:4]])
    tldr = snapshot(root, "datasets", "trl-lib/tldr")
    write_jsonl(tldr / "data" / "train.jsonl", [{"prompt": f"SUBREDDIT: r/test\nPOST: {q}\nTL;DR:", "completion": a} for q, a in QUESTIONS[:2]])
    prefs = snapshot(root, "datasets", "trl-lib/ultrafeedback_binarized")
    write_jsonl(prefs / "data" / "train.jsonl",
                [{"prompt": [{"role": "user", "content": q}], "chosen": [{"role": "assistant", "content": a}],
                  "rejected": [{"role": "assistant", "content": "I do not know."}]} for q, a in QUESTIONS])
    return root


@pytest.fixture(autouse=True)
def offline_cache(hub, tmp_path, monkeypatch):
    """Every test: the fixture cache as the Hugging Face cache, and a fresh working folder (output_dir defaults there)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.chdir(tmp_path)
    return hub


def trl(*args, cwd=None):
    """Runs the trl binary; returns its stdout (the run's summary line for training commands)."""
    out = subprocess.run([TRL, *map(str, args)], capture_output=True, text=True, cwd=cwd)
    if out.returncode != 0:
        raise AssertionError(f"trl {' '.join(map(str, args))} failed ({out.returncode}):\n{out.stderr}")
    return out.stdout


def read_log(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]

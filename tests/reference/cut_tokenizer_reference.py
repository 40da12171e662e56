#!/usr/bin/env python3
"""The oracle of `trl init-model --vocab_size N` (InitOptions::vocab_size): a cut of the Qwen3 tokenizer.

    build/trl init-model --preset tiny --vocab_size 4096 --out /tmp/cut4096
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install tokenizers
    /tmp/venv/bin/python tests/reference/cut_tokenizer_reference.py /tmp/cut4096 tests/data/tokenizer/cut4096_expected.json

Checks, independently of trl.cpp's code, that the folder's tokenizer files are the cut the option promises: the
ordinary tokens with id < N - 26 and the merges that make them (rank r makes id 256 + r), the 26 special tokens
renumbered to N - 26 ... N - 1 in their order, tokenizer_config.json's added_tokens_decoder with the same ids, and
config.json / generation_config.json's bos, eos and pad ids following the special tokens. Then Hugging Face's
`tokenizers` loads the cut tokenizer.json and encodes every 10th document of tests/data/tokenizer/corpus.jsonl and a
chat-formatted text with special tokens; their ids (all < N) are the golden that tests/tokenizer/tokenizer_test.cpp
compares trl's tokenizer on the same cut with.
"""
import json
import os
import sys

from tokenizers import Tokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
folder, out = sys.argv[1], sys.argv[2]
config = json.load(open(os.path.join(folder, "config.json")))
n = config["vocab_size"]

# The cut, built here from the bundled files.
full = json.load(open(os.path.join(ROOT, "assets", "qwen3-tokenizer", "tokenizer.json")))
full_config = json.load(open(os.path.join(ROOT, "assets", "qwen3-tokenizer", "tokenizer_config.json")))
specials = sorted(full["added_tokens"], key=lambda t: t["id"])
ordinary = n - len(specials)
renumber = {t["id"]: ordinary + i for i, t in enumerate(specials)}

cut = json.load(open(os.path.join(folder, "tokenizer.json")))
want_vocab = {s: i for s, i in full["model"]["vocab"].items() if i < ordinary}
assert cut["model"]["vocab"] == want_vocab, "vocab differs"
want_merges = full["model"]["merges"][: ordinary - 256]
for rank, (a, b) in enumerate(want_merges):
    assert full["model"]["vocab"][a + b] == 256 + rank, f"merge {rank} does not make id {256 + rank}"
assert cut["model"]["merges"] == want_merges, "merges differ"
assert [(t["id"], t["content"]) for t in cut["added_tokens"]] == [(renumber[t["id"]], t["content"]) for t in specials]
cut_config = json.load(open(os.path.join(folder, "tokenizer_config.json")))
assert cut_config["added_tokens_decoder"] == {str(renumber[int(k)]): v for k, v in full_config["added_tokens_decoder"].items()}
for key in ("model", "added_tokens"):
    cut.pop(key), full.pop(key)
assert cut == full, "the cut changed a part other than the vocabulary"
ids = {t["content"]: renumber[t["id"]] for t in specials}
assert config["bos_token_id"] == ids["<|endoftext|>"] and config["eos_token_id"] == ids["<|im_end|>"]
gen = json.load(open(os.path.join(folder, "generation_config.json")))
assert gen["eos_token_id"] == [ids["<|im_end|>"], ids["<|endoftext|>"]] and gen["pad_token_id"] == ids["<|endoftext|>"]

tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
docs = [json.loads(line)["text"] for line in open(os.path.join(ROOT, "tests", "data", "tokenizer", "corpus.jsonl"))][::10]
docs.append("<|im_start|>user\nCount to three.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n one two three<|im_end|>\n")
encoded = []
for text in docs:
    e = tok.encode(text, add_special_tokens=False).ids
    assert all(0 <= i < n for i in e), "an id beyond the cut"
    encoded.append(e)
json.dump({"vocab_size": n, "every": 10, "special_ids": ids, "ids": encoded, "tokenizers": __import__("tokenizers").__version__},
          open(out, "w"), separators=(",", ":"))
print(f"{out}: {len(docs)} documents, {sum(map(len, encoded))} ids, all < {n}")

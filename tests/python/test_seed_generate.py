"""Seed 003's generate() with the static cache, as written but for the import line; the same tokens as `trl generate`."""

import json

from conftest import trl


def test_generate_static_cache_runs_as_written(capsys):
    # --- the seed's snippet ---
    from trl_cpp import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen3-0.6B")
    model = AutoModelForCausalLM.from_pretrained(
        "Qwen/Qwen3-0.6B", dtype="bfloat16", device_map="cpu"
    )

    # leave the inputs on CPU
    inputs = tokenizer("The French Bread Law states", return_tensors="pt")
    output = model.generate(
        **inputs, do_sample=False, max_new_tokens=50, cache_implementation="static"
    )
    print(tokenizer.decode(output[0], skip_special_tokens=True))
    # --- what it did ---
    printed = capsys.readouterr().out
    assert printed.startswith("The French Bread Law states")
    ids = list(output[0])
    prompt = tokenizer("The French Bread Law states")["input_ids"]
    assert ids[: len(prompt)] == prompt and len(prompt) < len(ids) <= len(prompt) + 50
    # The command line's greedy continuation of the same prompt ids, same dtype: the same tokens.
    with open("prompts.jsonl", "w") as f:
        f.write(json.dumps({"ids": prompt}) + "\n")
    line = trl("generate", "--model", "Qwen/Qwen3-0.6B", "--dtype", "bf16", "--device", "cpu", "--input", "prompts.jsonl", "--max_new_tokens", "50",
               "--do_sample", "false", "--cache_implementation", "static")
    assert ids[len(prompt):] == json.loads(line.strip().splitlines()[-1])["completion_ids"]

def test_generate_batch_keeps_the_padded_prompts_and_equals_the_command_line():
    from trl_cpp import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained("Qwen/Qwen3-0.6B", padding_side="left")
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-0.6B")
    texts = ["Hello there", "A much longer prompt than the first one"]
    batch = tok(texts, padding=True)  # lists: the package needs no NumPy
    out = model.generate(**batch, max_new_tokens=6, do_sample=False)  # the folder's generation_config.json samples
    width = len(batch["input_ids"][0])
    assert len(out) == 2 and all(width < len(r) <= width + 6 for r in out)
    assert [r[:width] for r in out] == batch["input_ids"]  # the prompts as given, padding included (Transformers' layout)
    assert batch["attention_mask"][0][0] == 0 and tok.pad_token_id == batch["input_ids"][0][0]
    # The same two prompts through `trl generate --input` (one batch of 2): the same new tokens.
    with open("prompts.jsonl", "w") as f:
        for t in texts:
            f.write(json.dumps({"ids": tok(t)["input_ids"]}) + "\n")
    lines = trl("generate", "--model", "Qwen/Qwen3-0.6B", "--input", "prompts.jsonl", "--batch_size", 2, "--max_new_tokens", 6, "--do_sample", "false")
    cli = [json.loads(line)["completion_ids"] for line in lines.strip().splitlines()]
    for i in range(2):
        new = out[i][width:]
        assert new[: len(cli[i])] == cli[i] and all(t == tok.pad_token_id for t in new[len(cli[i]):])


def test_apply_chat_template_v5_forms():
    from trl_cpp import AutoTokenizer

    tok = AutoTokenizer.from_pretrained("Qwen/Qwen3-0.6B")
    messages = [{"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert text.startswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert "<think>\n\n</think>" in text  # enable_thinking=False reached the template
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False)
    assert enc["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]  # v5: a dict by default
    assert tok.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False, return_dict=False) == enc["input_ids"]

#!/usr/bin/python3
"""Golden chat-template renderings from Python's jinja2, in the environment Transformers uses
(transformers/utils/chat_template_utils.py): ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True),
the loopcontrols extension, a {% generation %} tracker, tojson as json.dumps(ensure_ascii=False), raise_exception
and strftime_now. Writes tests/data/chat/renders.json.

    /usr/bin/python3 tests/reference/chat_templates.py      (Debian: apt-get install python3-jinja2)
"""
import itertools
import json
import os
import random

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "data", "chat", "renders.json")
TEMPLATES_DIR = os.path.join(ROOT, "tests", "data", "chat")


class GenerationTracker(Extension):
    """Records the character span of the output of each {% generation %} block (our own implementation of the
    behaviour of Transformers' AssistantTracker)."""
    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        self.spans = None
        self.blocks = None

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_track"), [], [], body).set_lineno(lineno)

    def _track(self, caller):
        rv = caller()
        if self.spans is not None:
            start = len("".join(self.blocks))
            self.spans.append((start, start + len(rv)))
        return rv


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTracker, jinja2.ext.loopcontrols])
ENV.filters["tojson"] = tojson
ENV.globals["raise_exception"] = raise_exception
TRACKER = ENV.extensions[GenerationTracker.identifier]


def render(source, context):
    template = ENV.from_string(source)
    TRACKER.spans, TRACKER.blocks = [], []
    try:
        for block in template.generate(**context):
            TRACKER.blocks.append(block)
        text = "".join(TRACKER.blocks)
        return text, TRACKER.spans
    finally:
        TRACKER.spans, TRACKER.blocks = None, None


def load(name):
    return open(os.path.join(TEMPLATES_DIR, name), encoding="utf-8").read()


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city, in °C.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "calc", "description": "Évalue une expression « simple ».", "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}},
]


def conversations():
    rng = random.Random(7)
    users = ["Hi", "What's the weather in Paris?", "Écris un poème sur la mer.", "2+2=?", "  spaces around  ", "Line one\nLine two\n",
             "你好，世界", "Explain <think> tags.", "Tabs\tand \"quotes\" and 'apostrophes' and \\backslashes\\"]
    answers = ["Hello!", "It is sunny.", "<think>\nThe user wants a poem.\n</think>\n\nLa mer est bleue.", "4", "\nLeading newline",
               "<think>short</think>answer", "Sure — here it is.", "😀 emoji answer", "Trailing space "]
    convs = []
    for system, turns in itertools.product([None, "You are a helpful assistant.", "Tu es utile.\nRéponds en français."], [1, 2, 3]):
        msgs = []
        if system:
            msgs.append({"role": "system", "content": system})
        for t in range(turns):
            msgs.append({"role": "user", "content": rng.choice(users)})
            msgs.append({"role": "assistant", "content": rng.choice(answers)})
        convs.append(msgs)
        convs.append(msgs[:-1])  # ends with a user message
    # reasoning_content
    convs.append([{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because.", "reasoning_content": "Let me think.\n"}])
    convs.append([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning_content": ""},
                  {"role": "user", "content": "c"}, {"role": "assistant", "content": "d", "reasoning_content": "\nthinking about d\n"}])
    convs.append([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning_content": None}])
    # tool calls and responses
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]}
    call_str = {"role": "assistant", "content": "Let me check.", "tool_calls": [{"function": {"name": "calc", "arguments": "{\"expr\": \"2+2\"}"}},
                                                                                {"function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]}
    tool = {"role": "tool", "content": "{\"temp\": 21}"}
    tool2 = {"role": "tool", "content": "4"}
    convs.append([{"role": "user", "content": "Weather?"}, call, tool, {"role": "assistant", "content": "21 °C."}])
    convs.append([{"role": "user", "content": "Compute"}, call_str, tool2, tool, {"role": "assistant", "content": "Done."}])
    convs.append([{"role": "system", "content": "sys"}, {"role": "user", "content": "Weather?"}, call, tool])
    convs.append([{"role": "user", "content": "<tool_response>\nfake\n</tool_response>"}, {"role": "assistant", "content": "ok"}])
    convs.append([{"role": "user", "content": "q1"}, call, tool, {"role": "assistant", "content": "<think>\nr\n</think>\n\nfinal"}])
    convs.append([{"role": "system", "content": "first"}, {"role": "user", "content": "u"}, {"role": "system", "content": "second system"},
                  {"role": "assistant", "content": "a"}])
    return convs


def main():
    qwen3 = open(os.path.join(ROOT, "assets", "qwen3-tokenizer", "chat_template.jinja"), encoding="utf-8").read()
    templates = {"qwen3": qwen3, "chatml": load("chatml.jinja"), "llama3": load("llama3.jinja"),
                 "generation": load("qwen3_generation.jinja"), "features": load("features.jinja")}
    cases = []
    specials = {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    for i, msgs in enumerate(conversations()):
        for agp in [False, True]:
            for thinking in [None, True, False]:
                for tools in [None, TOOLS]:
                    if (i + (thinking is None) + (tools is None)) % 3 and not (agp and thinking is False):
                        continue  # keep the set varied but not combinatorial
                    ctx = {"messages": msgs, "add_generation_prompt": agp, "tools": tools, **specials}
                    if thinking is not None:
                        ctx["enable_thinking"] = thinking
                    cases.append(("qwen3", ctx))
    for msgs in conversations()[:12]:
        simple = [m for m in msgs if m["role"] in ("system", "user", "assistant") and "tool_calls" not in m]
        for name in ["chatml", "llama3", "generation"]:
            for agp in [False, True]:
                cases.append((name, {"messages": simple, "add_generation_prompt": agp, **specials}))
    for k, msgs in enumerate(conversations()[:20]):
        cases.append(("features", {"messages": msgs, "tools": TOOLS if k % 2 else None, "add_generation_prompt": k % 3 == 0,
                                   "numbers": [3, -1.5, 2.0, 1e-07, 1e16, 123456789.125, 0.1, 7], "nested": {"b": [1, {"c": None}], "a": "x"},
                                   "flag": k % 2 == 0, **specials}))
    out = []
    for name, ctx in cases:
        try:
            text, spans = render(templates[name], ctx)
            out.append({"template": name, "context": ctx, "text": text, "generation_spans": spans})
        except jinja2.exceptions.TemplateError as e:
            out.append({"template": name, "context": ctx, "error": str(e)})
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"jinja2": jinja2.__version__, "cases": out}, f, ensure_ascii=False, indent=0)
    counts = {}
    for c in out:
        counts[c["template"]] = counts.get(c["template"], 0) + 1
    print(f"wrote {OUT}: {len(out)} renderings {counts}, {sum('error' in c for c in out)} errors")


if __name__ == "__main__":
    main()

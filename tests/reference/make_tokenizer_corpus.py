#!/usr/bin/python3
"""Builds the tokenizer test corpus (tests/data/tokenizer/corpus.jsonl, invalid_utf8.jsonl), deterministically.

    /usr/bin/python3 tests/reference/make_tokenizer_corpus.py

Sources: the project's own code and docs (code, English), the two specification pages (Chinese, Russian), short
sentences written here in other languages and scripts, and generated stress text (whitespace runs, CRLF, digits,
emoji, combining marks, special tokens inside text, random code points from many Unicode blocks). The ids are then
produced by Hugging Face's tokenizers (tests/reference/tokenizer_ids.js).
"""
import glob
import json
import os
import random

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")
rng = random.Random(20261129)

SENTENCES = {
    "en": ["The quick brown fox jumps over the lazy dog.", "I'M sure they'LL say it's fine, but we've seen worse.",
           "Don't panic: it's only 3.14159 percent of the budget!", "She said \"hello\" -- and left.",
           "E-mail me at someone@example.com or call +1 (555) 010-9999.", "Well...  that's   odd;\tisn't it?"],
    "de": ["Größere Übungen fördern die Änderungsfähigkeit.", "Straße, Maß und Fuß: ß bleibt ß.", "Das Brötchen kostet 1,50 €."],
    "fr": ["L'été dernier, j'ai mangé une crème brûlée à Paris.", "« Où est la bibliothèque ? » demanda-t-il.", "Ça coûte 12,5 % de plus."],
    "es": ["¿Dónde está el baño? ¡Aquí!", "El niño comió piña y jalapeños.", "Año 2024: mañana será otro día."],
    "tr": ["İstanbul'da ılık bir gün; şu çiçekler güzel.", "Iğdır ve Ağrı doğuda."],
    "vi": ["Tiếng Việt có nhiều dấu: ả, ẫ, ặ, ờ, ữ.", "Người ta nói rằng học ngôn ngữ không khó."],
    "ru": ["Съешь же ещё этих мягких французских булок, да выпей чаю.", "Ёлка и ёжик — это разные слова."],
    "uk": ["Гей, хлопці, ґанок і їжак — українські літери є, ї, ґ."],
    "el": ["Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.", "Η γλώσσα είναι ελληνική."],
    "he": ["עברית נכתבת מימין לשמאל.", "שָׁלוֹם עֲלֵיכֶם"],
    "ar": ["اللغة العربية جميلة جداً.", "مَرْحَبًا بِكُمْ فِي البَيْتِ"],
    "hi": ["हिन्दी भाषा देवनागरी लिपि में लिखी जाती है।", "क्षत्रिय, ज्ञान और श्री।"],
    "bn": ["আমি বাংলায় গান গাই।"],
    "ta": ["தமிழ் ஒரு பழமையான மொழி."],
    "th": ["ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ", "สวัสดีครับ ยินดีต้อนรับ"],
    "zh": ["我能吞下玻璃而不伤身体。", "今天天气很好，我们去公园散步吧！", "数字１２３和全角字符ＡＢＣ。"],
    "ja": ["私はガラスを食べられます。それは私を傷つけません。", "カタカナとひらがなと漢字が混ざる文章です。", "ｈａｌｆ－ｗｉｄｔｈ ｶﾀｶﾅ"],
    "ko": ["나는 유리를 먹을 수 있어요. 그래도 아프지 않아요.", "한국어 자모: ᄒ ᅡ ᆫ 과 완성형 한."],
    "ka": ["ქართული ენა ძალიან ლამაზია."],
    "hy": ["Հայերենը հնդեվրոպական լեզու է։"],
    "am": ["አማርኛ በግዕዝ ፊደል ይጻፋል።"],
}

EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "❤️", "🤖", "🧪🔬", "✨", "🙏🏿", "🫠", "©️", "1️⃣", "🐍" * 3]
COMBINING = ["e\u0301", "a\u0300\u0323", "n\u0303", "o\u0308\u0304", "\u1100\u1161\u11a8", "Z\u0351\u0352\u0357\u0358",
             "\u0915\u094d\u0937", "A\u030a", "\u212b", "\ufb01", "\u2126", "i\u0307", "\u0041\u030A\u0301"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
            "<tool_response>", "</tool_response>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|vision_pad|>",
            "<|im_sta", "|im_end|>", "<|endoftext|", "<<|im_end|>>", "< think>"]
WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n", "\u00a0", "\u3000", "\u2028", "\u2009", "\u200b", "\x0b", "\x0c", "\u1680",
              "\u180e", "\u0085", "\x1c", "\u202f", "   \t  "]
BLOCKS = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x5ff), (0x600, 0x6ff), (0x900, 0x97f),
          (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f), (0x2190, 0x22ff), (0x2500, 0x257f), (0x3040, 0x30ff),
          (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0xe000, 0xe0ff), (0xff00, 0xffef), (0x1d400, 0x1d7ff), (0x1f300, 0x1faff),
          (0x20000, 0x2a6df), (0xe0000, 0xe007f), (0x10fff0, 0x10fffd)]


def random_unicode(n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(BLOCKS)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def mixed_paragraph():
    parts = []
    for _ in range(rng.randint(3, 12)):
        kind = rng.random()
        if kind < 0.45:
            lang = rng.choice(list(SENTENCES))
            parts.append(rng.choice(SENTENCES[lang]))
        elif kind < 0.55:
            parts.append(rng.choice(EMOJI))
        elif kind < 0.62:
            parts.append(rng.choice(COMBINING) * rng.randint(1, 3))
        elif kind < 0.70:
            parts.append(rng.choice(SPECIALS))
        elif kind < 0.80:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 18))) + rng.choice(["", ".5", ",000", "%", "th", "x"]))
        elif kind < 0.90:
            parts.append(random_unicode(rng.randint(1, 12)))
        else:
            parts.append(rng.choice(WHITESPACE) * rng.randint(1, 4))
        parts.append(rng.choice(WHITESPACE[:6] + ["", "", ""]))
    return "".join(parts)


def main():
    docs = []
    # Code and English prose of this project (sorted for determinism), in chunks of about 4 KB.
    files = sorted(glob.glob(os.path.join(ROOT, "src", "**", "*.*"), recursive=True))
    files += sorted(glob.glob(os.path.join(ROOT, "tests", "reference", "*.py")))
    files += sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]
    files += [os.path.join(ROOT, "assets", "qwen3-tokenizer", "chat_template.jinja")]
    for path in files:
        if os.path.basename(path) == "corpus.jsonl":
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for i in range(0, len(text), 4000):
            docs.append(text[i:i + 4000])
    # The specification pages (Chinese, Russian).
    seeds = os.path.join(ROOT, "..", "shared", "seeds")
    for name in sorted(os.listdir(seeds)) if os.path.isdir(seeds) else []:
        if name.endswith(".txt"):
            text = open(os.path.join(seeds, name), encoding="utf-8").read()
            for i in range(0, len(text), 3000):
                docs.append(text[i:i + 3000])
    # CRLF versions of some code.
    for d in docs[:40]:
        docs.append(d.replace("\n", "\r\n"))
    # Generated stress paragraphs.
    while sum(len(d.encode("utf-8")) for d in docs) < 1_150_000:
        docs.append(mixed_paragraph())
    # Short edge cases.
    docs += ["", " ", "  ", "\n", "\r\n", "a", "'s", "'S", "'t've", "1234567890", " 1 2 3 ", "\t\t", "<|im_end|>",
             "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
             "<think>\n\n</think>\n\n", "x" * 5000, " " * 3000, "ab" * 2000 + "\n", "🤖" * 300, "\u00e9" * 1000,
             "e\u0301" * 1000, "a\n\n\n b", "a  \n  b", "hello world   ", "   hello", "100,000.50$", "(a+b)*c/d-e",
             "def f(x):\n    return x**2  # square\n", "<|endoftext|><|endoftext|>", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>"]
    with open(os.path.join(OUT, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    # Invalid UTF-8, as hex (JSON strings cannot hold it).
    bad = [b"\x80", b"abc\xffdef", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82(", b"\xf0\x9f\x98", b"\xf0\x9f\x98 ok", b"\xc0\x80",
           b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xfe\xff",
           b"Hello \xe4\xb8 world", b"\xe4\xb8\xad\xe6\x96", b"<|im_end\xff|>", b"\xc3\xa9\x80\xc3\xa9", "ok".encode() * 10 + b"\x80" * 10]
    for _ in range(30):
        raw = bytearray(mixed_paragraph().encode("utf-8"))
        for _ in range(rng.randint(1, 6)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        bad.append(bytes(raw))
    with open(os.path.join(OUT, "invalid_utf8.jsonl"), "w") as f:
        for b in bad:
            f.write(json.dumps({"hex": b.hex()}) + "\n")
    total = sum(len(d.encode("utf-8")) for d in docs)
    print(f"corpus: {len(docs)} documents, {total} bytes; invalid: {len(bad)}")


if __name__ == "__main__":
    main()

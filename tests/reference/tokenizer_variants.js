// Ids from Hugging Face's tokenizers for variants of the Qwen3 tokenizer.json that swap in other building blocks
// (GPT-2's ByteLevel regex with add_prefix_space, Llama 3's split regex and BOS template, NFKC/Lowercase/Replace
// normalizers, Digits and MergedWithPrevious splits, added-token lstrip/rstrip/single_word). The variants are
// described in tests/data/tokenizer/variants.json; the C++ test builds the same files.
//   node tokenizer_variants.js
const fs = require("fs");
const os = require("os");
const path = require("path");
const { Tokenizer } = require("tokenizers");

const root = path.join(__dirname, "..", "..");
const dataDir = path.join(root, "tests", "data", "tokenizer");
const base = JSON.parse(fs.readFileSync(path.join(root, "assets", "qwen3-tokenizer", "tokenizer.json"), "utf8"));
const variants = JSON.parse(fs.readFileSync(path.join(dataDir, "variants.json"), "utf8"));
const corpus = fs.readFileSync(path.join(dataDir, "corpus.jsonl"), "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l).text);
const indices = corpus.map((_, i) => i).filter((i) => i % 6 === 0 || i >= corpus.length - 40);
const extra = ["hi <think> reasoning </think>  answer", "x<tool_call>y", "a <tool_call> b", "Numbers 1234567 and 12.5%!", "TABS\there\tTOO",
  "Ｆｕｌｌｗｉｄｔｈ ①②③ ﬁ", "Hello, world. How are you? Fine; thanks: ok!", " leading space", "trailing space ", ""];
const docs = indices.map((i) => corpus[i]).concat(extra);

(async () => {
  const out = { corpus_indices: indices, extra, variants: {} };
  for (const [name, v] of Object.entries(variants)) {
    const t = JSON.parse(JSON.stringify(base));
    for (const key of ["normalizer", "pre_tokenizer", "post_processor", "decoder"]) if (key in v) t[key] = v[key];
    for (const [content, flags] of Object.entries(v.added_token_flags || {})) {
      const tok = t.added_tokens.find((a) => a.content === content);
      Object.assign(tok, flags);
    }
    const file = path.join(os.tmpdir(), `variant-${name}.json`);
    fs.writeFileSync(file, JSON.stringify(t));
    const tok = await Tokenizer.fromFile(file);
    const ids = [];
    for (const d of docs) ids.push((await tok.encode(d, null, { addSpecialTokens: true })).getIds());
    const decoded = [];
    for (const i of ids.slice(0, 50)) decoded.push(await tok.decode(i, false));
    out.variants[name] = { ids, decoded };
    console.log(`${name}: ${ids.reduce((n, x) => n + x.length, 0)} ids`);
  }
  fs.writeFileSync(path.join(dataDir, "variants_expected.json"), JSON.stringify(out));
})();

// Ids from Hugging Face's own tokenizers (the npm package `tokenizers`: Node bindings of the Rust library) for the
// tokenizer corpus; the C++ tests compare every id. Also times encoding, for bench/run_tokenizer.sh.
//   cd tests/reference && npm install --no-save tokenizers@0.23.2 && node tokenizer_ids.js
//   node tokenizer_ids.js --bench          # one-thread encode throughput and load time (one JSON line)
const fs = require("fs");
const path = require("path");
const { Tokenizer } = require("tokenizers");

const root = path.join(__dirname, "..", "..");
const dataDir = path.join(root, "tests", "data", "tokenizer");
const tokenizerPath = path.join(root, "assets", "qwen3-tokenizer", "tokenizer.json");

function fnv1a64(ids) {
  // FNV-1a over the little-endian int32 bytes of the ids (same as the C++ test).
  let h = 0xcbf29ce484222325n;
  const prime = 0x100000001b3n;
  const mask = 0xffffffffffffffffn;
  const buf = Buffer.alloc(4);
  for (const id of ids) {
    buf.writeInt32LE(id, 0);
    for (const b of buf) h = ((h ^ BigInt(b)) * prime) & mask;
  }
  return h.toString(16).padStart(16, "0");
}

function readLines(file) {
  return fs.readFileSync(file, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));
}

async function encodeAll(tok, texts) {
  const out = [];
  for (const t of texts) {
    const enc = await tok.encode(t, null, { addSpecialTokens: false });
    out.push(enc.getIds());
  }
  return out;
}

(async () => {
  const t0 = process.hrtime.bigint();
  const tok = await Tokenizer.fromFile(tokenizerPath);
  const loadMs = Number(process.hrtime.bigint() - t0) / 1e6;
  const corpus = readLines(path.join(dataDir, "corpus.jsonl")).map((j) => j.text);
  if (process.argv.includes("--bench")) {
    const bytes = corpus.reduce((n, t) => n + Buffer.byteLength(t, "utf8"), 0);
    let best = Infinity;
    for (let r = 0; r < 3; r++) {
      const s = process.hrtime.bigint();
      await encodeAll(tok, corpus);
      best = Math.min(best, Number(process.hrtime.bigint() - s) / 1e9);
    }
    // Also one encodeBatch() call over the whole corpus: the loop runs in Rust (run pinned to one core).
    let bestBatch = Infinity;
    for (let r = 0; r < 3; r++) {
      const s = process.hrtime.bigint();
      await tok.encodeBatch(corpus, { addSpecialTokens: false });
      bestBatch = Math.min(bestBatch, Number(process.hrtime.bigint() - s) / 1e9);
    }
    console.log(JSON.stringify({ bench: "npm_tokenizers_encode", bytes, seconds: best, MB_per_s: bytes / best / 1e6,
                                 batch_MB_per_s: bytes / bestBatch / 1e6, load_ms: loadMs,
                                 note: "Node bindings: encode() per document, and one encodeBatch(); one core" }));
    return;
  }
  const invalid = readLines(path.join(dataDir, "invalid_utf8.jsonl")).map((j) => Buffer.from(j.hex, "hex").toString("utf8"));
  const result = { tokenizer: "qwen3", corpus: [], invalid: [] };
  const ids = await encodeAll(tok, corpus);
  ids.forEach((v, i) => result.corpus.push(v.length <= 64 ? { n: v.length, ids: v } : { n: v.length, fnv: fnv1a64(v), head: v.slice(0, 16) }));
  const bad = await encodeAll(tok, invalid);
  bad.forEach((v) => result.invalid.push({ n: v.length, ids: v }));
  fs.writeFileSync(path.join(dataDir, "qwen3_expected.json"), JSON.stringify(result));
  const total = ids.reduce((n, v) => n + v.length, 0);
  console.log(`wrote qwen3_expected.json: ${ids.length} documents, ${total} ids; ${bad.length} invalid-UTF-8 documents`);
})();

// Parquet fixtures for tests/data/parquet_test.cpp, written by two independent writers and read back by an
// independent reader (none of them trl.cpp's):
//   hyparquet-writer: data pages v2, dictionary and plain, DELTA_* and BYTE_STREAM_SPLIT, SNAPPY/GZIP/ZSTD/none;
//   @dsnp/parquetjs:  data pages v1 (what pyarrow and so the Hub's datasets write), legacy repeated groups;
//   hyparquet:        reads every fixture; its rows, checked against the rows written, are the expected JSON.
// Each fixture NAME.parquet comes with NAME.json (the rows). Run (needs node and npm; CI does not):
//   cd tests/reference && npm install --no-save hyparquet@1.33.0 hyparquet-writer@0.17.0 hyparquet-compressors@1.1.2 @dsnp/parquetjs@1.8.8
//   node parquet_fixtures.mjs            # writes tests/data/parquet/
//   node parquet_fixtures.mjs --big FILE # a ~100 MB conversational file for bench/run_parquet.sh
//   node parquet_fixtures.mjs --read FILE  # hyparquet's read time and rows/s of FILE (one JSON line)
// GZIP pages use node's zlib, ZSTD pages the `zstd` command (Debian's zstd package).
import fs from "node:fs";
import path from "node:path";
import zlib from "node:zlib";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { parquetReadObjects, asyncBufferFromFile } from "hyparquet";
import { compressors as readCompressors } from "hyparquet-compressors";
import { parquetWriteBuffer } from "hyparquet-writer";
import parquetjs from "@dsnp/parquetjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const outDir = path.join(here, "..", "data", "parquet");

const writeCompressors = {
  GZIP: (bytes) => new Uint8Array(zlib.gzipSync(bytes)),
  ZSTD: (bytes) => new Uint8Array(execFileSync("zstd", ["-q", "-c", "-3"], { input: bytes })),
};

// A small deterministic generator (mulberry32), so the fixtures are the same on every run.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const words = "the a model token train loss step data row page group list struct null value shard split Qwen 日本語 émoji 🙂 \"quoted\" back\\slash".split(" ");
function sentence(r, n) {
  const out = [];
  for (let i = 0; i < n; ++i) out.push(words[Math.floor(r() * words.length)]);
  return out.join(" ");
}

function toPlain(v) {
  if (typeof v === "bigint") return Number(v);
  if (v instanceof Date) return v.getTime();
  if (Array.isArray(v)) return v.map(toPlain);
  if (v && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, toPlain(x)]));
  return v;
}

async function readRows(file) {
  const buf = await asyncBufferFromFile(file);
  return toPlain(await parquetReadObjects({ file: buf, compressors: readCompressors }));
}

// Writes NAME.parquet and NAME.json, after checking that hyparquet reads back the rows that were written.
async function fixture(name, bytes, rowsWritten) {
  const file = path.join(outDir, name + ".parquet");
  fs.writeFileSync(file, Buffer.from(bytes));
  const rows = await readRows(file);
  const want = JSON.stringify(toPlain(rowsWritten));
  if (JSON.stringify(rows) !== want) {
    throw new Error(`${name}: hyparquet reads back other rows than were written\n got ${JSON.stringify(rows).slice(0, 400)}\nwant ${want.slice(0, 400)}`);
  }
  fs.writeFileSync(path.join(outDir, name + ".json"), JSON.stringify(rows, null, 0) + "\n");
  console.log(`${name}: ${rows.length} rows, ${bytes.byteLength} bytes`);
}

// ---- every type, nulls at every level (hyparquet-writer, pages v2) ----

const messagesSchema = (name) => [
  { name, repetition_type: "OPTIONAL", converted_type: "LIST", num_children: 1 },
  { name: "list", repetition_type: "REPEATED", num_children: 1 },
  { name: "element", repetition_type: "OPTIONAL", num_children: 2 },
  { name: "content", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "OPTIONAL" },
  { name: "role", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "OPTIONAL" },
];

function typedRows(n, seed) {
  const r = rng(seed);
  const rows = [];
  for (let i = 0; i < n; ++i) {
    const pick = r();
    const msgs = pick < 0.1 ? null : pick < 0.2 ? [] : Array.from({ length: 1 + Math.floor(r() * 4) }, (_, k) =>
      r() < 0.1 ? null : { content: r() < 0.1 ? null : sentence(r, 1 + Math.floor(r() * 12)), role: k % 2 ? "assistant" : "user" });
    rows.push({
      id: i,
      big: BigInt(i) * 1000000007n - 5000000000n,
      text: sentence(r, 1 + Math.floor(r() * 8)),
      maybe: r() < 0.3 ? null : sentence(r, 3),
      flag: r() < 0.5,
      score: Math.fround(r() * 10 - 5),
      weight: r() * 1e6 - 5e5,
      ints: r() < 0.15 ? null : Array.from({ length: Math.floor(r() * 5) }, () => (r() < 0.1 ? null : Math.floor(r() * 2000) - 1000)),
      pair: r() < 0.15 ? null : { a: Math.floor(r() * 100), b: r() < 0.2 ? null : sentence(r, 2) },
      messages: msgs,
    });
  }
  return rows;
}

const typedSchema = [
  { name: "root", num_children: 10 },
  { name: "id", type: "INT32", repetition_type: "REQUIRED" },
  { name: "big", type: "INT64", repetition_type: "REQUIRED" },
  { name: "text", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "REQUIRED" },
  { name: "maybe", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "OPTIONAL" },
  { name: "flag", type: "BOOLEAN", repetition_type: "OPTIONAL" },
  { name: "score", type: "FLOAT", repetition_type: "OPTIONAL" },
  { name: "weight", type: "DOUBLE", repetition_type: "OPTIONAL" },
  { name: "ints", repetition_type: "OPTIONAL", converted_type: "LIST", num_children: 1 },
  { name: "list", repetition_type: "REPEATED", num_children: 1 },
  { name: "element", type: "INT32", repetition_type: "OPTIONAL" },
  { name: "pair", repetition_type: "OPTIONAL", num_children: 2 },
  { name: "a", type: "INT32", repetition_type: "REQUIRED" },
  { name: "b", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "OPTIONAL" },
  ...messagesSchema("messages"),
];

function columnsOf(rows, overrides = {}) {
  const names = Object.keys(rows[0]);
  return names.map((name) => ({ name, data: rows.map((row) => row[name]), ...(overrides[name] || {}) }));
}

async function hyparquetFixtures() {
  const rows = typedRows(60, 7);
  for (const codec of ["UNCOMPRESSED", "SNAPPY", "GZIP", "ZSTD"]) {
    const bytes = parquetWriteBuffer({ columnData: columnsOf(rows), schema: typedSchema, codec, compressors: writeCompressors, rowGroupSize: 16, pageSize: 256 });
    await fixture(`types_${codec.toLowerCase()}`, bytes, rows);
  }
  // Plain against dictionary, and the DELTA / BYTE_STREAM_SPLIT encodings.
  const r = rng(11);
  const enc = Array.from({ length: 300 }, (_, i) => ({
    small: Math.floor(r() * 5) - 2,
    counter: BigInt(i * i) - 40000n,
    label: ["user", "assistant", "system"][Math.floor(r() * 3)],
    url: `https://example.org/${Math.floor(i / 7)}/item-${i}`,
    free: sentence(r, 1 + Math.floor(r() * 5)),
    f32: Math.fround(r() * 100),
    f64: r() * 1e9,
  }));
  const encSchema = [
    { name: "root", num_children: 7 },
    { name: "small", type: "INT32", repetition_type: "REQUIRED" },
    { name: "counter", type: "INT64", repetition_type: "REQUIRED" },
    { name: "label", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "REQUIRED" },
    { name: "url", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "REQUIRED" },
    { name: "free", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "OPTIONAL" },
    { name: "f32", type: "FLOAT", repetition_type: "REQUIRED" },
    { name: "f64", type: "DOUBLE", repetition_type: "REQUIRED" },
  ];
  await fixture("encodings_dictionary", parquetWriteBuffer({ columnData: columnsOf(enc), schema: encSchema, rowGroupSize: 128, pageSize: 512 }), enc);
  const plain = Object.fromEntries(encSchema.slice(1).map((e) => [e.name, { encoding: "PLAIN" }]));
  await fixture("encodings_plain", parquetWriteBuffer({ columnData: columnsOf(enc, plain), schema: encSchema, rowGroupSize: 128, pageSize: 512 }), enc);
  const delta = {
    small: { encoding: "DELTA_BINARY_PACKED" },
    counter: { encoding: "DELTA_BINARY_PACKED" },
    label: { encoding: "DELTA_LENGTH_BYTE_ARRAY" },
    url: { encoding: "DELTA_BYTE_ARRAY" },
    free: { encoding: "DELTA_BYTE_ARRAY" },
    f32: { encoding: "BYTE_STREAM_SPLIT" },
    f64: { encoding: "BYTE_STREAM_SPLIT" },
  };
  await fixture("encodings_delta", parquetWriteBuffer({ columnData: columnsOf(enc, delta), schema: encSchema, rowGroupSize: 128, pageSize: 512, codec: "ZSTD", compressors: writeCompressors }), enc);
}

// ---- the dataset shapes trl.cpp's trainers read ----

function capybaraRows(n, seed, maxTurns = 4, maxWords = 40) {
  const r = rng(seed);
  return Array.from({ length: n }, (_, i) => ({
    source: ["Airoboros", "EverythingLM", "GPT4LLM", "Know-Logic"][i % 4],
    messages: Array.from({ length: 2 * (1 + Math.floor(r() * maxTurns)) }, (_, k) => ({
      content: sentence(r, 1 + Math.floor(r() * maxWords)),
      role: k % 2 ? "assistant" : "user",
    })),
  }));
}
const capybaraSchema = [
  { name: "root", num_children: 2 },
  { name: "source", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "OPTIONAL" },
  { name: "messages", repetition_type: "OPTIONAL", converted_type: "LIST", num_children: 1 },
  { name: "list", repetition_type: "REPEATED", num_children: 1 },
  { name: "element", repetition_type: "OPTIONAL", num_children: 2 },
  { name: "content", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "OPTIONAL" },
  { name: "role", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "OPTIONAL" },
];

async function shapeFixtures() {
  const capy = capybaraRows(40, 3);
  await fixture("capybara", parquetWriteBuffer({ columnData: columnsOf(capy), schema: capybaraSchema, rowGroupSize: 16 }), capy);
  const r = rng(5);
  const pref = Array.from({ length: 24 }, () => ({ prompt: sentence(r, 6), chosen: sentence(r, 8), rejected: sentence(r, 5) }));
  await fixture("preference", parquetWriteBuffer({ columnData: columnsOf(pref), rowGroupSize: 10 }), pref);
  const prompts = Array.from({ length: 12 }, (_, i) => ({ prompt: [{ content: sentence(r, 5), role: "user" }], answer: String(i) }));
  const promptSchema = [{ name: "root", num_children: 2 }, ...messagesSchema("prompt"), { name: "answer", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "OPTIONAL" }];
  await fixture("prompt_only", parquetWriteBuffer({ columnData: columnsOf(prompts), schema: promptSchema }), prompts);
  // A map column (datasets writes dicts of unknown keys this way), and nested lists.
  const maps = Array.from({ length: 20 }, (_, i) => ({
    meta: i % 5 === 0 ? null : Object.fromEntries(Array.from({ length: i % 4 }, (_, k) => [`k${k}`, k % 3 === 2 ? null : i * 10 + k])),
    grid: i % 6 === 0 ? null : Array.from({ length: i % 3 }, (_, k) => Array.from({ length: (i + k) % 3 }, (_, j) => j + k)),
  }));
  const mapSchema = [
    { name: "root", num_children: 2 },
    { name: "meta", repetition_type: "OPTIONAL", converted_type: "MAP", num_children: 1 },
    { name: "key_value", repetition_type: "REPEATED", num_children: 2 },
    { name: "key", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "REQUIRED" },
    { name: "value", type: "INT64", repetition_type: "OPTIONAL" },
    { name: "grid", repetition_type: "OPTIONAL", converted_type: "LIST", num_children: 1 },
    { name: "list", repetition_type: "REPEATED", num_children: 1 },
    { name: "element", repetition_type: "REQUIRED", converted_type: "LIST", num_children: 1 },
    { name: "list", repetition_type: "REPEATED", num_children: 1 },
    { name: "element", type: "INT32", repetition_type: "REQUIRED" },
  ];
  const mapRows = maps.map((m) => ({ ...m, meta: m.meta && Object.fromEntries(Object.entries(m.meta).map(([k, v]) => [k, v === null ? null : BigInt(v)])) }));
  await fixture("maps_and_nested_lists", parquetWriteBuffer({ columnData: columnsOf(mapRows), schema: mapSchema, rowGroupSize: 8 }), maps);
}

// ---- data pages v1 (@dsnp/parquetjs) ----

async function parquetjsFixture(name, schemaFields, rows, opts) {
  const schema = new parquetjs.ParquetSchema(schemaFields);
  const file = path.join(outDir, name + ".tmp.parquet");
  const writer = await parquetjs.ParquetWriter.openFile(schema, file, opts);
  writer.setRowGroupSize(opts.rowGroupSize ?? 8);
  if (opts.pageSize) writer.setPageSize(opts.pageSize);
  for (const row of rows) await writer.appendRow(row);
  await writer.close();
  const bytes = fs.readFileSync(file);
  fs.unlinkSync(file);
  await fixture(name, bytes, rows);
}

async function v1Fixtures() {
  const r = rng(9);
  const rows = Array.from({ length: 30 }, (_, i) => ({
    name: sentence(r, 3),
    count: i * 3 - 20,
    total: BigInt(i) * 99999999999n,
    ratio: r(),
    ok: i % 3 === 0,
    note: i % 4 === 0 ? null : sentence(r, 2),
    messages: Array.from({ length: i % 3 }, (_, k) => ({ content: sentence(r, 4), role: k % 2 ? "assistant" : "user" })),
    tags: Array.from({ length: i % 4 }, () => sentence(r, 1)),
  }));
  const fields = (compression) => ({
    name: { type: "UTF8", compression },
    count: { type: "INT32", compression },
    total: { type: "INT64", compression },
    ratio: { type: "DOUBLE", compression },
    ok: { type: "BOOLEAN", compression },
    note: { type: "UTF8", optional: true, compression },
    messages: { repeated: true, fields: { content: { type: "UTF8", compression }, role: { type: "UTF8", compression } } },
    tags: { type: "UTF8", repeated: true, compression },
  });
  // parquetjs leaves out empty repeated fields from its rows; hyparquet (and trl.cpp) give [] for them.
  const expect = rows.map((row) => ({ ...row }));
  for (const compression of ["UNCOMPRESSED", "SNAPPY", "GZIP"]) {
    await parquetjsFixture(`v1_${compression.toLowerCase()}`, fields(compression), expect, { rowGroupSize: 8, pageSize: 64 });
  }
}

// ---- the benchmark file and hyparquet's read time ----

async function bigFile(file) {
  const rows = capybaraRows(92000, 17, 6, 160);
  const bytes = parquetWriteBuffer({ columnData: columnsOf(rows), schema: capybaraSchema, rowGroupSize: 10000 });
  fs.writeFileSync(file, Buffer.from(bytes));
  console.log(`${file}: ${rows.length} rows, ${(bytes.byteLength / 1e6).toFixed(1)} MB`);
}

async function timeRead(file) {
  const t0 = process.hrtime.bigint();
  const buf = await asyncBufferFromFile(file);
  const rows = await parquetReadObjects({ file: buf, compressors: readCompressors });
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  const mb = fs.statSync(file).size / 1e6;
  console.log(JSON.stringify({ reader: "hyparquet", file, rows: rows.length, seconds: s, rows_per_s: rows.length / s, mb_per_s: mb / s }));
}

const args = process.argv.slice(2);
if (args[0] === "--big") await bigFile(args[1]);
else if (args[0] === "--read") await timeRead(args[1]);
else {
  fs.mkdirSync(outDir, { recursive: true });
  await hyparquetFixtures();
  await shapeFixtures();
  await v1Fixtures();
}

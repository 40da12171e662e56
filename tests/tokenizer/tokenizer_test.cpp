// The tokenizer against Hugging Face's tokenizers (npm package, fixtures from tests/reference/tokenizer_ids.js).
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "assets/assets.h"
#include "trl/core/error.h"
#include "core/fs.h"
#include "trl/models/init.h"
#include "test_util.h"
#include "trl/tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace trl {
namespace {

using json = nlohmann::json;

const Tokenizer& qwen3() { return test::qwen3_tokenizer(); }

std::vector<json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

std::string fnv1a64(const std::vector<int32_t>& ids) {
  uint64_t h = 14695981039346656037ull;
  for (int32_t id : ids) {
    const uint32_t u = static_cast<uint32_t>(id);
    for (int k = 0; k < 4; ++k) h = (h ^ ((u >> (8 * k)) & 0xff)) * 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

const std::string kData = std::string(TRL_TEST_DATA_DIR) + "/tokenizer/";

TEST(Tokenizer, CorpusMatchesHuggingFace) {
  const auto corpus = read_jsonl(kData + "corpus.jsonl");
  const json expected = json::parse(read_text_file(kData + "qwen3_expected.json"));
  ASSERT_EQ(corpus.size(), expected["corpus"].size());
  size_t bytes = 0, ids_total = 0, mismatches = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string text = corpus[i]["text"].get<std::string>();
    bytes += text.size();
    const auto ids = qwen3().encode(text, false);
    ids_total += ids.size();
    const json& e = expected["corpus"][i];
    bool ok = ids.size() == e["n"].get<size_t>();
    if (ok && e.contains("ids")) ok = json(ids) == e["ids"];
    if (ok && e.contains("fnv")) ok = fnv1a64(ids) == e["fnv"].get<std::string>();
    if (!ok && ++mismatches <= 5) {
      ADD_FAILURE() << "document " << i << " differs: " << ids.size() << " ids vs " << e["n"] << "; head ours " << json(std::vector<int32_t>(ids.begin(), ids.begin() + std::min<size_t>(16, ids.size()))).dump()
                    << " theirs " << (e.contains("head") ? e["head"] : e["ids"]).dump() << "\ntext: " << json(text.substr(0, 300)).dump();
    }
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(bytes, 1'000'000u);
  std::printf("[ tokenizer ] %zu documents, %zu bytes, %zu ids: all equal to Hugging Face tokenizers\n", corpus.size(), bytes, ids_total);
}

// Invalid UTF-8: each ill-formed subsequence becomes U+FFFD (as Node's and Python's UTF-8 decoders do) before
// tokenization, so the ids equal those of the decoded string.
// The cut vocabulary of `trl init-model --vocab_size 4096` (the learning and distributed tests' tokenizer):
// tests/reference/cut_tokenizer_reference.py checked the cut files against the bundled ones on its own and encoded
// every 10th corpus document and a chat text with Hugging Face's tokenizers.
TEST(Tokenizer, CutVocabularyMatchesHuggingFace) {
  const json expected = json::parse(read_text_file(kData + "cut4096_expected.json"));
  ASSERT_EQ(expected["vocab_size"].get<int64_t>(), test::kCutVocab);
  const Tokenizer& cut = test::cut_tokenizer();
  for (const auto& [token, id] : expected["special_ids"].items()) EXPECT_EQ(cut.token_to_id(token), id.get<int32_t>()) << token;
  EXPECT_EQ(cut.eos_token_id(), expected["special_ids"]["<|im_end|>"].get<int32_t>());
  const auto corpus = read_jsonl(kData + "corpus.jsonl");
  std::vector<std::string> docs;
  for (size_t i = 0; i < corpus.size(); i += expected["every"].get<size_t>()) docs.push_back(corpus[i]["text"].get<std::string>());
  docs.push_back("<|im_start|>user\nCount to three.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n one two three<|im_end|>\n");
  ASSERT_EQ(docs.size(), expected["ids"].size());
  size_t mismatches = 0, ids_total = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    const auto ids = cut.encode(docs[i], false);
    ids_total += ids.size();
    if (json(ids) != expected["ids"][i] && ++mismatches <= 5) ADD_FAILURE() << "document " << i << " differs: " << json(docs[i].substr(0, 200)).dump();
    for (int32_t id : ids) ASSERT_LT(id, test::kCutVocab) << "document " << i;
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(ids_total, 50'000u);
  // Shorter tokens than the whole vocabulary's, and the same text back.
  EXPECT_GT(cut.encode(docs[0], false).size(), qwen3().encode(docs[0], false).size());
  EXPECT_EQ(cut.decode(cut.encode(docs[0], false)), docs[0]);
}

// A tokenizer.json whose model has no merges (absent or null) loads as a vocabulary-only BPE; merges of another kind
// are named. Without merges the loader iterated a default simdjson array and crashed (issue 37's sweep).
TEST(Tokenizer, MergesAbsentNullOrOfTheWrongKind) {
  test::TempDir dir;
  nlohmann::json t = nlohmann::json::parse(test::read_file(std::string(TRL_TEST_DATA_DIR) + "/../../fuzz/corpus/tokenizer/qwen3_small.json"));
  for (const nlohmann::json& merges : {nlohmann::json(nullptr), nlohmann::json("discarded")}) {
    if (merges.is_null()) t["model"]["merges"] = nullptr;
    else t["model"].erase("merges");
    test::write_file(dir.file("tokenizer.json"), t.dump());
    const Tokenizer tok = Tokenizer::from_file(dir.file("tokenizer.json"));
    // Without merges BPE joins nothing: each character is its own token, though the vocabulary holds "in" too.
    ASSERT_TRUE(tok.token_to_id("i") && tok.token_to_id("n") && tok.token_to_id("in"));
    EXPECT_EQ(tok.encode("in", false), (std::vector<int32_t>{*tok.token_to_id("i"), *tok.token_to_id("n")}));
  }
  t["model"]["merges"] = 5;
  test::write_file(dir.file("tokenizer.json"), t.dump());
  EXPECT_NE(test::error_of([&] { (void)Tokenizer::from_file(dir.file("tokenizer.json")); }).find("model.merges must be a list"), std::string::npos);
}

// tokenizer_config.json's special tokens: text or {"content": text}; another kind, or an eos/pad token the tokenizer
// does not have, is named with the file and the key (both were reported later as "the tokenizer has no eos_token").
TEST(Tokenizer, SpecialTokensOfTheWrongKindOrUnknownAreNamed) {
  test::TempDir dir;
  test::write_file(dir.file("tokenizer.json"), test::read_file(std::string(TRL_TEST_DATA_DIR) + "/../../fuzz/corpus/tokenizer/qwen3_small.json"));
  auto error_with = [&](const std::string& config) {
    test::write_file(dir.file("tokenizer_config.json"), config);
    return test::error_of([&] { (void)Tokenizer::from_pretrained(dir.path()); });
  };
  test::write_file(dir.file("tokenizer_config.json"), R"({"eos_token": {"content": "<|im_end|>"}, "pad_token": null, "unk_token": null})");
  const Tokenizer ok = Tokenizer::from_pretrained(dir.path());
  EXPECT_EQ(ok.eos_token(), "<|im_end|>");
  EXPECT_EQ(ok.pad_token_id(), ok.eos_token_id());
  for (const char* config : {R"({"eos_token": 5})", R"({"eos_token": ["<|im_end|>"]})", R"({"eos_token": {"id": 5}})"}) {
    const std::string e = error_with(config);
    EXPECT_NE(e.find("tokenizer_config.json: 'eos_token'"), std::string::npos) << config << ": " << e;
  }
  std::string e = error_with(R"({"eos_token": "<|im_end|>", "pad_token": "<pad>"})");
  EXPECT_NE(e.find("tokenizer_config.json: pad_token '<pad>' is not a token of"), std::string::npos) << e;
  e = error_with(R"({"eos_token": "</s>"})");
  EXPECT_NE(e.find("eos_token '</s>' is not a token of"), std::string::npos) << e;
}

// A Strip decoder's counts are tokenizers' unsigned integers: a negative one is refused (it wrapped to 2^64 - 1 and
// stripped every leading character), as is an empty character.
TEST(Tokenizer, StripDecoderCountsAreChecked) {
  test::TempDir dir;
  nlohmann::json t = nlohmann::json::parse(test::read_file(std::string(TRL_TEST_DATA_DIR) + "/../../fuzz/corpus/tokenizer/qwen3_small.json"));
  t["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "ByteLevel"}}, {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  test::write_file(dir.file("tokenizer.json"), t.dump());
  const Tokenizer tok = Tokenizer::from_file(dir.file("tokenizer.json"));
  const auto two_spaces = tok.token_to_id("\xc4\xa0\xc4\xa0");  // "ĠĠ", two byte-level spaces
  ASSERT_TRUE(two_spaces);
  EXPECT_EQ(tok.decode(std::vector<int32_t>{*two_spaces}), " ");  // one leading space stripped, not both
  for (const auto& [key, value, expected] : {std::tuple<const char*, nlohmann::json, const char*>{"start", -1, "Strip's 'start' must be a count"},
                                             {"stop", int64_t{1} << 40, "Strip's 'stop' must be a count"},
                                             {"content", "", "Strip's 'content' must be the character"}}) {
    nlohmann::json bad = t;
    bad["decoder"]["decoders"][1][key] = value;
    test::write_file(dir.file("tokenizer.json"), bad.dump());
    const std::string e = test::error_of([&] { (void)Tokenizer::from_file(dir.file("tokenizer.json")); });
    EXPECT_NE(e.find(expected), std::string::npos) << key << ": " << e;
  }
}

TEST(Tokenizer, InvalidUtf8IsReplacedLikeTheDecoders) {
  const auto docs = read_jsonl(kData + "invalid_utf8.jsonl");
  const json expected = json::parse(read_text_file(kData + "qwen3_expected.json"));
  ASSERT_EQ(docs.size(), expected["invalid"].size());
  for (size_t i = 0; i < docs.size(); ++i) {
    const std::string raw = from_hex(docs[i]["hex"].get<std::string>());
    EXPECT_EQ(json(qwen3().encode(raw, false)), expected["invalid"][i]["ids"]) << "document " << i << " hex " << docs[i]["hex"];
  }
}

TEST(Tokenizer, DecodeInvertsEncode) {
  const auto corpus = read_jsonl(kData + "corpus.jsonl");
  for (size_t i = 0; i < corpus.size(); i += 7) {
    const std::string text = corpus[i]["text"].get<std::string>();
    // decode(encode(s)) == NFC(s): the normaliser is part of the round trip.
    ASSERT_EQ(qwen3().decode(qwen3().encode(text, false)), unicode::nfc(text)) << "document " << i;
  }
  EXPECT_EQ(qwen3().decode(qwen3().encode("Hello, wörld! 你好 🤖", false)), "Hello, wörld! 你好 🤖");
}

TEST(Tokenizer, SpecialTokensAndVocabulary) {
  const Tokenizer& t = qwen3();
  EXPECT_EQ(t.vocab_size(), 151669);
  EXPECT_EQ(t.token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(t.eos_token(), "<|im_end|>");
  EXPECT_EQ(t.eos_token_id(), 151645);
  EXPECT_EQ(t.pad_token_id(), 151643);
  EXPECT_FALSE(t.bos_token_id().has_value());
  EXPECT_TRUE(t.is_special(151643));
  EXPECT_FALSE(t.is_special(151667));  // <think> is an added token but not special
  const std::vector<int32_t> ids = t.encode("<|im_start|>user\nHi<think>x</think><|im_end|>", false);
  EXPECT_EQ(ids.front(), 151644);
  EXPECT_EQ(ids.back(), 151645);
  // skip_special_tokens drops only the special ones: <think> stays.
  EXPECT_EQ(t.decode(ids, true), "user\nHi<think>x</think>");
  EXPECT_EQ(t.decode(ids, false), "<|im_start|>user\nHi<think>x</think><|im_end|>");
  EXPECT_FALSE(t.chat_template().empty());
}

TEST(Tokenizer, OffsetsCoverTheText) {
  const std::string text = "Hello <|im_end|> wörld  123 🤖\n";
  std::vector<std::pair<size_t, size_t>> offsets;
  const auto ids = qwen3().encode_with_offsets(text, false, offsets);
  ASSERT_EQ(ids.size(), offsets.size());
  size_t pos = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(offsets[i].first, pos) << i;
    EXPECT_GE(offsets[i].second, offsets[i].first);
    pos = offsets[i].second;
  }
  EXPECT_EQ(pos, text.size());
  EXPECT_EQ(text.substr(offsets[1].first, offsets[1].second - offsets[1].first), " ");
}

TEST(Tokenizer, BatchPaddingAndTruncation) {
  const Tokenizer& t = qwen3();
  TokenizeOptions o;
  o.padding = "longest";
  o.pad_to_multiple_of = 8;
  o.padding_side = "left";
  BatchEncoding b = t({"a b c", "hello"}, o);
  ASSERT_EQ(b.input_ids.size(), 2u);
  EXPECT_EQ(b.input_ids[0].size(), 8u);
  EXPECT_EQ(b.input_ids[1][0], 151643);  // left-padded with <|endoftext|>
  EXPECT_EQ(b.attention_mask[1][0], 0);
  EXPECT_EQ(b.attention_mask[1].back(), 1);
  EXPECT_EQ(b.input_ids_tensor().shape(), (Shape{2, 8}));
  o.padding = "max_length";
  o.max_length = 4;
  o.truncation = true;
  o.padding_side = "right";
  o.pad_to_multiple_of.reset();
  b = t({"one two three four five six", "x"}, o);
  EXPECT_EQ(b.input_ids[0].size(), 4u);
  EXPECT_EQ(b.input_ids[1].size(), 4u);
  EXPECT_EQ(b.attention_mask[1], (std::vector<int32_t>{1, 0, 0, 0}));
  o.truncation_side = "left";
  b = t({"one two three four five six"}, o);
  EXPECT_EQ(t.decode(b.input_ids[0]), " three four five six");
  o.padding = "sideways";
  EXPECT_THROW(t({"x"}, o), Error);
}

TEST(Tokenizer, UnsupportedComponentsAreNamed) {
  test::TempDir dir;
  json j = json::parse(std::string(asset("tokenizer.json")));
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
  write_text_file_atomic(dir.file("tokenizer.json"), j.dump());
  try {
    Tokenizer::from_file(dir.file("tokenizer.json"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Metaspace"), std::string::npos) << e.what();
  }
  j = json::parse(std::string(asset("tokenizer.json")));
  j["model"]["type"] = "Unigram";
  write_text_file_atomic(dir.file("tokenizer.json"), j.dump());
  EXPECT_THROW(Tokenizer::from_file(dir.file("tokenizer.json")), Error);
  write_text_file_atomic(dir.file("tokenizer.json"), "{\"model\": ");
  EXPECT_THROW(Tokenizer::from_file(dir.file("tokenizer.json")), Error);
}

TEST(Unicode, SanitizeFollowsMaximalSubpart) {
  EXPECT_EQ(unicode::sanitize_utf8("a\xe2\x82(b"), "a\xef\xbf\xbd(b");             // one U+FFFD for the truncated E2 82
  EXPECT_EQ(unicode::sanitize_utf8("\xc0\x80"), "\xef\xbf\xbd\xef\xbf\xbd");       // overlong: two
  EXPECT_EQ(unicode::sanitize_utf8("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // surrogate: three
  EXPECT_EQ(unicode::sanitize_utf8("\xf0\x9f\x98"), "\xef\xbf\xbd");
  EXPECT_EQ(unicode::sanitize_utf8("ok é"), "ok é");
  EXPECT_EQ(unicode::nfc("e\xcc\x81"), "\xc3\xa9");
}

}  // namespace
}  // namespace trl

namespace trl {
namespace {

// Variants of the Qwen3 tokenizer.json with other building blocks (GPT-2 ByteLevel regex + add_prefix_space,
// Llama 3 split regex + BOS template, NFKC/Lowercase/Replace, Digits, MergedWithPrevious, added-token flags),
// against Hugging Face's tokenizers (tests/reference/tokenizer_variants.js).
TEST(Tokenizer, VariantsMatchHuggingFace) {
  const json variants = json::parse(read_text_file(kData + "variants.json"));
  const json expected = json::parse(read_text_file(kData + "variants_expected.json"));
  const auto corpus = read_jsonl(kData + "corpus.jsonl");
  std::vector<std::string> docs;
  for (const auto& i : expected["corpus_indices"]) docs.push_back(corpus[i.get<size_t>()]["text"].get<std::string>());
  for (const auto& e : expected["extra"]) docs.push_back(e.get<std::string>());
  const json base = json::parse(std::string(asset("tokenizer.json")));
  for (auto it = variants.begin(); it != variants.end(); ++it) {
    json t = base;
    for (const char* key : {"normalizer", "pre_tokenizer", "post_processor", "decoder"}) {
      if (it.value().contains(key)) t[key] = it.value()[key];
    }
    if (it.value().contains("added_token_flags")) {
      for (auto f = it.value()["added_token_flags"].begin(); f != it.value()["added_token_flags"].end(); ++f) {
        for (auto& a : t["added_tokens"]) {
          if (a["content"] == f.key()) a.update(f.value());
        }
      }
    }
    test::TempDir dir;
    write_text_file_atomic(dir.file("tokenizer.json"), t.dump());
    const Tokenizer tok = Tokenizer::from_file(dir.file("tokenizer.json"));
    const json& want = expected["variants"][it.key()];
    ASSERT_EQ(want["ids"].size(), docs.size());
    int bad = 0;
    for (size_t i = 0; i < docs.size(); ++i) {
      const auto ids = tok.encode(docs[i], true);
      if (json(ids) != want["ids"][i] && ++bad <= 3) {
        ADD_FAILURE() << it.key() << " document " << i << ": " << json(docs[i].substr(0, 200)).dump() << "\nours   " << json(ids).dump().substr(0, 400)
                      << "\ntheirs " << want["ids"][i].dump().substr(0, 400);
      }
      if (i < want["decoded"].size()) {
        EXPECT_EQ(tok.decode(want["ids"][i].get<std::vector<int32_t>>()), want["decoded"][i].get<std::string>()) << it.key() << " decode " << i;
      }
    }
    EXPECT_EQ(bad, 0) << it.key();
  }
}

}  // namespace
}  // namespace trl

// generate(): PyTorch greedy goldens, the static-cache invariants, program counts, sampling and bad input.
#include "trl/generation/generate.h"

#include <cmath>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "trl/core/error.h"
#include "core/fs.h"
#include "trl/models/init.h"
#include "test_util.h"

namespace trl {
namespace {

using json = nlohmann::json;

// The goldens' model; the tests that compare with no golden take the cut vocabulary (test::kCutVocab), which
// decoding reads whole at every step.
CausalLM golden_model(const std::string& preset, DType dtype, test::TempDir& dir, int64_t vocab_size = 0) {
  InitOptions o;
  o.vocab_size = vocab_size;
  o.preset = preset;
  o.dtype = dtype;
  o.seed = 1234;
  o.initializer_range = 0.1;
  o.randomize_norms = true;
  return init_model(o, dir.path());
}

std::vector<std::vector<int32_t>> rows(const json& j) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& r : j) out.push_back(r.get<std::vector<int32_t>>());
  return out;
}

GenerationConfig greedy(int64_t n) {
  GenerationConfig c;
  c.max_new_tokens = n;
  c.do_sample = false;
  c.eos_token_id = std::vector<int32_t>{};  // random models: run to the length
  return c;
}

class GenerateGolden : public ::testing::TestWithParam<const char*> {};

// Greedy continuations equal PyTorch's, alone and as a left-padded batch, on the static cache (compiled), the
// dynamic path and the reference backend.
TEST_P(GenerateGolden, GreedyMatchesPyTorch) {
  const std::string preset = GetParam();
  const json golden = json::parse(read_text_file(std::string(TRL_TEST_DATA_DIR) + "/goldens/qwen3_" + preset + "_generate.json"));
  test::TempDir dir;
  const CausalLM model = golden_model(preset, DType::F32, dir);
  Generator gen(model);
  const auto prompts = rows(golden["prompts"]);
  const auto single = rows(golden["single"]), batch = rows(golden["batch"]);
  const int64_t n = golden["new_tokens"].get<int64_t>();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(gen.generate({prompts[i]}, greedy(n)).generated[0], single[i]) << "prompt " << i;
  const auto out = gen.generate(prompts, greedy(n));
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(out.generated[i], batch[i]) << "batch row " << i;
  GenerationConfig dyn = greedy(n);
  dyn.cache_implementation = "dynamic";
  EXPECT_EQ(gen.generate(prompts, dyn).generated, batch);
  if (preset == std::string("tiny")) {
    GenerationConfig ref = greedy(n);
    ref.disable_compile = true;
    EXPECT_EQ(gen.generate(prompts, ref).generated, batch);
  }
}

INSTANTIATE_TEST_SUITE_P(Qwen3, GenerateGolden, ::testing::Values("tiny", "small"));

// Prefill + incremental decode give the logits of a full forward pass; static equals dynamic; bucketed equals
// unbucketed; f32 and bf16 models both run on the static cache.
TEST(Generate, StaticCacheLogitsEqualFullForward) {
  for (DType dt : {DType::F32, DType::BF16}) {
    test::TempDir dir;
    const CausalLM model = golden_model("tiny", dt, dir, test::kCutVocab);
    Generator gen(model);
    const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7, 8, 9, 10, 11}, {300, 301}};
    GenerationConfig c = greedy(9);
    c.output_logits = true;
    const auto s = gen.generate(prompts, c);
    c.cache_implementation = "dynamic";
    const auto d = gen.generate(prompts, c);
    c.cache_implementation = "static";
    c.pad_to_multiple_of = 0;
    const auto u = gen.generate(prompts, c);
    EXPECT_EQ(s.generated, d.generated) << dtype_name(dt);
    EXPECT_EQ(s.generated, u.generated) << dtype_name(dt);
    EXPECT_EQ(s.prompt_length, 64);  // the CPU backend's auto bucket
    EXPECT_EQ(u.prompt_length, 7);
    ASSERT_EQ(s.logits.size(), 9u);
    ASSERT_EQ(d.logits.size(), 9u);
    const double tol = dt == DType::F32 ? 1e-4 : 3e-2;
    for (size_t step = 0; step < s.logits.size(); ++step)
      for (size_t b = 0; b < prompts.size(); ++b) {
        double scale = 1, worst = 0, worst_u = 0;
        for (size_t v = 0; v < s.logits[step][b].size(); ++v) {
          scale = std::max(scale, static_cast<double>(std::fabs(d.logits[step][b][v])));
          worst = test::nan_max(worst, static_cast<double>(std::fabs(s.logits[step][b][v] - d.logits[step][b][v])));
          worst_u = test::nan_max(worst_u, static_cast<double>(std::fabs(s.logits[step][b][v] - u.logits[step][b][v])));
        }
        EXPECT_LE(worst / scale, tol) << dtype_name(dt) << " step " << step << " row " << b;
        EXPECT_LE(worst_u / scale, tol) << dtype_name(dt) << " step " << step << " row " << b;
      }
  }
}

TEST(Generate, BatchGivesEachPromptsTokens) {
  test::TempDir dir;
  const CausalLM model = golden_model("tiny", DType::BF16, dir, test::kCutVocab);
  Generator gen(model);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {40, 41, 42, 43, 44, 45, 46, 47, 48, 49}, {7}};
  const auto batch = gen.generate(prompts, greedy(10));
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(gen.generate({prompts[i]}, greedy(10)).generated[0], batch.generated[i]) << i;
  // Transformers' sequences: left-padded prompt, then the new tokens.
  EXPECT_EQ(batch.sequences[2].size(), static_cast<size_t>(batch.prompt_length + 10));
  EXPECT_EQ(batch.sequences[2][static_cast<size_t>(batch.prompt_length - 1)], 7);
}

// 200 tokens for a batch: one prefill and one decode program, then only cache hits; a second call with another
// prompt length in the same bucket compiles nothing.
TEST(Generate, CompilesOnePrefillAndOneDecodeProgram) {
  test::TempDir dir;
  const CausalLM model = golden_model("tiny", DType::F32, dir, test::kCutVocab);
  Generator gen(model);
  const auto out = gen.generate({{1, 2, 3, 4}, {9, 8}}, greedy(200));
  EXPECT_EQ(out.generated[0].size(), 200u);
  EXPECT_EQ(gen.stats().compilations, 2);
  EXPECT_EQ(gen.stats().hits, 198);  // decode runs 199 times: the first compiles
  (void)gen.generate({{5, 6, 7, 8, 9, 10}, {3}}, greedy(200));
  EXPECT_EQ(gen.stats().compilations, 2);
}

TEST(Generate, EosStopsRowsAndPadsThem) {
  test::TempDir dir;
  const CausalLM model = golden_model("tiny", DType::F32, dir, test::kCutVocab);
  Generator gen(model);
  const auto free_run = gen.generate({{1, 2, 3}, {4, 5}}, greedy(8));
  // Make row 0's third token the eos: row 0 stops there and is padded; row 1 runs on unchanged.
  GenerationConfig c = greedy(8);
  c.eos_token_id = std::vector<int32_t>{free_run.generated[0][2]};
  c.pad_token_id = 17;
  const auto out = gen.generate({{1, 2, 3}, {4, 5}}, c);
  ASSERT_EQ(out.generated[0].size(), 3u);
  EXPECT_EQ(out.finish_reasons[0], "eos");
  const auto& seq = out.sequences[0];
  const size_t stop = static_cast<size_t>(out.prompt_length) + 3;
  for (size_t i = stop; i < seq.size(); ++i) EXPECT_EQ(seq[i], 17);
  if (std::find(free_run.generated[1].begin(), free_run.generated[1].end(), free_run.generated[0][2]) == free_run.generated[1].end()) {
    EXPECT_EQ(out.generated[1], free_run.generated[1]);
  }
}

TEST(Generate, SamplingIsReproducibleBySeed) {
  test::TempDir dir;
  const CausalLM model = golden_model("tiny", DType::F32, dir, test::kCutVocab);
  Generator gen(model);
  GenerationConfig c = greedy(16);
  c.do_sample = true;
  c.temperature = 1.5f;
  c.top_k = 0;
  c.seed = 42;
  const auto a = gen.generate({{1, 2, 3}}, c), b = gen.generate({{1, 2, 3}}, c);
  EXPECT_EQ(a.generated, b.generated);
  c.seed = 43;
  EXPECT_NE(gen.generate({{1, 2, 3}}, c).generated, a.generated);  // 16 draws at temperature 1.5 on a random model
  c.num_return_sequences = 3;
  const auto many = gen.generate({{1, 2, 3}}, c);
  EXPECT_EQ(many.generated.size(), 3u);
}

// On a device backend (the stand-in "reference-device") generate() gives the host oracle's ids, greedy and sampled,
// batched and with several sequences per prompt: the weights go up once, the cache stays on the device, and per
// decode step only the step's inputs go up and the last position's logits come down.
TEST(Generate, OnADeviceTheIdsEqualTheHostOracle) {
  test::TempDir dir;
  (void)golden_model("tiny", DType::F32, dir, test::kCutVocab);
  const CausalLM host_model = CausalLM::from_pretrained(dir.path(), LoadOptions{.device = "cpu"});
  const CausalLM dev_model = CausalLM::from_pretrained(dir.path(), LoadOptions{.device = "reference-device"});
  Generator dev(dev_model), host(host_model);
  GenerationConfig c = greedy(6);
  GenerationConfig h = c;
  h.disable_compile = true;  // the host oracle
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {7, 8, 9, 10, 11}};
  EXPECT_EQ(dev.generate(prompts, c).sequences, host.generate(prompts, h).sequences);
  const Backend::Transfers greedy_run = dev.transfers();
  EXPECT_EQ(greedy_run.uploads, static_cast<int64_t>(dev_model.weights().size()) + 4 + 5 * 5);  // weights; prefill; 5 decodes
  EXPECT_EQ(greedy_run.downloads, 6);           // each row's id of each of the 6 steps: the choice runs on the device
  EXPECT_EQ(greedy_run.largest_download, 2 * 4);  // [2] i32 ids: no logits row comes down
  // Sampling through every processor, 4 rows: the same ids; each step also uploads the rows' ids so far (the
  // repetition penalty's context) and still downloads one id per row.
  c.do_sample = h.do_sample = true;
  c.temperature = h.temperature = 1.5f;
  c.top_k = h.top_k = 20;
  c.top_p = h.top_p = 0.9f;
  c.min_p = h.min_p = 0.02f;
  c.repetition_penalty = h.repetition_penalty = 1.3f;
  c.seed = h.seed = 7;
  c.num_return_sequences = h.num_return_sequences = 2;
  EXPECT_EQ(dev.generate(prompts, c).sequences, host.generate(prompts, h).sequences);
  const Backend::Transfers sampled = dev.transfers();
  EXPECT_EQ(sampled.uploads - greedy_run.uploads, 4 + 5 * 5 + 6);  // the weights stayed
  EXPECT_EQ(sampled.downloads - greedy_run.downloads, 6);
  EXPECT_EQ(sampled.largest_download, 4 * 4);
  // The dynamic cache (the whole sequence every step): the last position's row is chosen inside the [B, T, V]
  // logits on the device; none of them comes down.
  c.cache_implementation = h.cache_implementation = "dynamic";
  EXPECT_EQ(dev.generate(prompts, c).sequences, host.generate(prompts, h).sequences);
  EXPECT_EQ(dev.transfers().uploads - sampled.uploads, 6 * (3 + 1));  // ids, mask, positions and the context, 6 steps
  EXPECT_EQ(dev.transfers().largest_download, 4 * 4);
  // Asking for the logits brings them down: the same raw rows as the host's.
  c.cache_implementation = h.cache_implementation = "static";
  c.output_logits = h.output_logits = true;
  const GenerationOutput with_logits = dev.generate(prompts, c);
  EXPECT_EQ(with_logits.logits, host.generate(prompts, h).logits);
  EXPECT_EQ(dev.transfers().largest_download, 4 * test::kCutVocab * 4);  // [4 rows, V] f32
}

// Top-k, top-p and min-p never let an excluded token through, whatever the draw.
TEST(Sampling, FiltersNeverEmitExcludedTokens) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 3.0f, -1.0f, 2.0f, 0.0f, -5.0f};
  // Probabilities (softmax): token 3 0.45, tokens 0 and 5 0.166 each, 1 0.061, 2 0.037, 6 0.022, 4 0.008, 7 0.0001.
  auto emitted = [&](SamplingParams p) {
    std::set<int32_t> seen;
    for (int i = 0; i < 2000; ++i) {
      std::vector<float> s = logits;
      process_logits(s, {}, p);
      seen.insert(pick_token(s, true, (i + 0.5) / 2000.0));
    }
    return seen;
  };
  SamplingParams p;
  p.do_sample = true;
  p.top_k = 3;  // 3.0, then the tie 2.0 / 2.0: both kept
  EXPECT_EQ(emitted(p), (std::set<int32_t>{0, 3, 5}));
  p.top_k = 0;
  p.top_p = 0.5f;  // the 0.45 token and the next most likely until the mass exceeds 0.5
  for (int32_t t : emitted(p)) EXPECT_TRUE(t == 3 || t == 0 || t == 5) << t;
  EXPECT_TRUE(emitted(p).count(3));
  p.top_p = 1.0f;
  p.min_p = 0.1f;  // keep p >= 0.045: tokens 3, 0, 5, 1
  EXPECT_EQ(emitted(p), (std::set<int32_t>{0, 1, 3, 5}));
  p.min_p.reset();
  // Nothing filtered: every token with probability above 1/1000 appears in 2000 evenly spread draws.
  const auto all = emitted(p);
  for (int32_t t : {0, 1, 2, 3, 4, 5, 6}) EXPECT_TRUE(all.count(t)) << t;
  // Greedy ignores the sampling filters but not the repetition penalty.
  std::vector<float> s = logits;
  SamplingParams g;
  g.repetition_penalty = 2.0f;
  process_logits(s, {3, 3}, g);
  EXPECT_FLOAT_EQ(s[3], 1.5f);
  EXPECT_EQ(pick_token(s, false, 0.0), 0);  // 2.0 at 0 and 5: the first maximum
  s = logits;
  process_logits(s, {7}, g);
  EXPECT_FLOAT_EQ(s[7], -10.0f);  // negative scores are multiplied
}

TEST(Generate, BadInputIsAClearError) {
  test::TempDir dir;
  const CausalLM model = golden_model("tiny", DType::F32, dir, test::kCutVocab);
  Generator gen(model);
  auto message = [&](const std::vector<std::vector<int32_t>>& prompts, const GenerationConfig& c) {
    try {
      gen.generate(prompts, c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{}}, greedy(4)).find("prompt 0 is empty"), std::string::npos);
  EXPECT_NE(message({{1, 999999}}, greedy(4)).find("outside the vocabulary"), std::string::npos);
  const std::vector<int32_t> long_prompt(static_cast<size_t>(model.config().max_position_embeddings), 5);
  EXPECT_NE(message({long_prompt}, greedy(4)).find("max_position_embeddings"), std::string::npos);
  GenerationConfig c = greedy(4);
  c.cache_implementation = "paged";
  EXPECT_NE(message({{1}}, c).find("cache_implementation 'paged'"), std::string::npos);
  c = greedy(4);
  c.do_sample = true;
  c.temperature = 0.0f;
  EXPECT_NE(message({{1}}, c).find("temperature"), std::string::npos);
}

}  // namespace
}  // namespace trl

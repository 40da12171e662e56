// Continuous batching (trl serve's engine): every sequence gets the tokens generate() gives it alone, whatever joins
// or leaves the batch beside it; rows are reused; stop strings, eos, cancel, logprobs and bad requests.
#include "trl/generation/continuous.h"

#include <cmath>
#include <condition_variable>
#include <mutex>

#include <gtest/gtest.h>

#include "trl/core/error.h"
#include "trl/generation/generate.h"
#include "trl/models/init.h"
#include "trl/tokenizer/tokenizer.h"
#include "test_util.h"

namespace trl {
namespace {

CausalLM tiny_model(DType dtype, test::TempDir& dir, const std::string& preset = "tiny") {
  InitOptions o;
  o.vocab_size = test::kCutVocab;
  o.preset = preset;
  o.dtype = dtype;
  o.seed = 1234;
  o.initializer_range = 0.1;
  o.randomize_norms = true;
  return init_model(o, dir.path());
}

ContinuousBatcher::Options options(int64_t max_batch, int64_t max_model_len, int64_t prefill_chunk) {
  ContinuousBatcher::Options o;
  o.max_batch = max_batch;
  o.max_model_len = max_model_len;
  o.prefill_chunk = prefill_chunk;
  return o;
}

// What the sink received for one sequence.
struct Collected {
  std::vector<int32_t> ids;
  std::string text, finish_reason, error;
  std::vector<TokenLogprob> logprobs;
  std::vector<std::vector<TokenLogprob>> top;
  int64_t deltas = 0, completion_tokens = 0;
  bool done = false;
};

class Results {
 public:
  explicit Results(size_t n) : r_(n) {}
  ContinuousBatcher::Sink sink(size_t i) {
    return [this, i](const SequenceDelta& d) {
      std::lock_guard<std::mutex> lock(mu_);
      Collected& c = r_[i];
      EXPECT_FALSE(c.done) << "a delta after the last one, sequence " << i;
      c.ids.insert(c.ids.end(), d.ids.begin(), d.ids.end());
      c.text += d.text;
      c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
      c.top.insert(c.top.end(), d.top_logprobs.begin(), d.top_logprobs.end());
      ++c.deltas;
      if (d.finished) {
        c.done = true, c.finish_reason = d.finish_reason, c.error = d.error, c.completion_tokens = d.completion_tokens;
        cv_.notify_all();
      }
    };
  }
  const std::vector<Collected>& wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return std::all_of(r_.begin(), r_.end(), [](const Collected& c) { return c.done; }); });
    return r_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Collected> r_;
};

SequenceRequest greedy_request(std::vector<int32_t> prompt, int64_t n) {
  SequenceRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = n;
  r.sampling.do_sample = false;
  return r;
}

GenerationConfig greedy(int64_t n) {
  GenerationConfig c;
  c.max_new_tokens = n;
  c.do_sample = false;
  c.eos_token_id = std::vector<int32_t>{};
  return c;
}

std::vector<int32_t> prompt_of(int64_t length, int32_t start) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < length; ++i) p.push_back(static_cast<int32_t>((start + 37 * i) % 4000 + 5));
  return p;
}

// Nine sequences of mixed lengths through 3 rows: they queue, join as rows free up, prefill in chunks of 8 (prompts
// of 1 to 30 tokens: one to four chunks), and each one's greedy tokens equal generate()'s for its prompt alone; also
// for a mixture of experts (tiny-moe, f32), whose experts see other rows' tokens beside each row's.
TEST(ContinuousBatching, EverySequenceGetsItsTokensAloneWhateverRunsBesideIt) {
  for (const auto& [dt, preset] : std::vector<std::pair<DType, std::string>>{{DType::F32, "tiny"}, {DType::BF16, "tiny"}, {DType::F32, "tiny-moe"}}) {
    SCOPED_TRACE(preset);
    test::TempDir dir;
    const CausalLM model = tiny_model(dt, dir, preset);
    Generator gen(model);
    ContinuousBatcher::Options o = options(3, 64, 8);
    o.prefill_rows = 2;
    ContinuousBatcher batcher({&model}, test::cut_tokenizer(), o);
    const std::vector<int64_t> lengths = {1, 30, 7, 8, 9, 16, 3, 25, 12}, news = {12, 5, 20, 9, 1, 14, 30, 6, 11};
    Results results(lengths.size());
    for (size_t i = 0; i < lengths.size(); ++i)
      ASSERT_NE(batcher.submit(greedy_request(prompt_of(lengths[i], static_cast<int32_t>(i * 101)), news[i]), results.sink(i)), nullptr);
    const auto& got = results.wait();
    for (size_t i = 0; i < lengths.size(); ++i) {
      const auto alone = gen.generate({prompt_of(lengths[i], static_cast<int32_t>(i * 101))}, greedy(news[i]));
      EXPECT_EQ(got[i].ids, alone.generated[0]) << dtype_name(dt) << " sequence " << i;
      EXPECT_EQ(got[i].finish_reason, "length");
      EXPECT_EQ(got[i].completion_tokens, news[i]);
      EXPECT_EQ(got[i].text, test::cut_tokenizer().decode(got[i].ids, true)) << i;
    }
    const auto m = batcher.metrics();
    EXPECT_EQ(m.sequences, 9);
    EXPECT_EQ(m.finished, 9);
    EXPECT_EQ(m.generated_tokens, 12 + 5 + 20 + 9 + 1 + 14 + 30 + 6 + 11);
    EXPECT_EQ(m.running, 0);
    EXPECT_EQ(m.waiting, 0);
    EXPECT_GT(m.decode_rows, m.decode_steps);  // rows decoded together
    // Buckets: decode B1, B2, B4 (3 rows -> bucket 4 capped at max_batch 3 -> 3), prefill chunks B1, B2: a handful.
    EXPECT_LE(m.programs.size(), 6u);
  }
}

// Sampling: a sequence's draws are its own (its seed), so it samples the tokens generate() samples for it alone with
// that row seed, beside other sampled and greedy sequences.
TEST(ContinuousBatching, SampledSequencesFollowTheirOwnSeed) {
  test::TempDir dir;
  const CausalLM model = tiny_model(DType::F32, dir);
  Generator gen(model);
  ContinuousBatcher::Options o = options(4, 64, 16);
  ContinuousBatcher batcher({&model}, test::cut_tokenizer(), o);
  Results results(4);
  for (size_t i = 0; i < 4; ++i) {
    SequenceRequest r = greedy_request(prompt_of(5 + static_cast<int64_t>(i), 7), 16);
    r.sampling.do_sample = i != 3;
    r.sampling.temperature = 1.5f;
    r.sampling.top_k = 0;
    r.sampling.top_p = 0.9f;
    r.seed = 1000 + i;
    ASSERT_NE(batcher.submit(r, results.sink(i)), nullptr);
  }
  const auto& got = results.wait();
  for (size_t i = 0; i < 4; ++i) {
    GenerationConfig c = greedy(16);
    c.do_sample = i != 3;
    c.temperature = 1.5f;
    c.top_k = 0;
    c.top_p = 0.9f;
    c.row_seeds = {1000 + i};
    EXPECT_EQ(got[i].ids, gen.generate({prompt_of(5 + static_cast<int64_t>(i), 7)}, c).generated[0]) << i;
  }
  EXPECT_NE(got[0].ids, got[1].ids);  // 16 draws at temperature 1.5 with different seeds
}

// eos ends a sequence with "stop" (the eos id counted, not in the text); a stop string cuts the text before it.
TEST(ContinuousBatching, EosAndStopStringsEndASequence) {
  test::TempDir dir;
  const CausalLM model = tiny_model(DType::F32, dir);
  const Tokenizer& tok = test::cut_tokenizer();
  ContinuousBatcher::Options o = options(2, 64, 8);
  ContinuousBatcher batcher({&model}, tok, o);
  Results free_run(1);
  ASSERT_NE(batcher.submit(greedy_request(prompt_of(6, 3), 20), free_run.sink(0)), nullptr);
  const Collected base = free_run.wait()[0];
  ASSERT_EQ(base.ids.size(), 20u);

  Results r(2);
  SequenceRequest eos = greedy_request(prompt_of(6, 3), 20);
  eos.eos_token_ids = {base.ids[4]};
  ASSERT_NE(batcher.submit(eos, r.sink(0)), nullptr);
  // A stop string: the text of tokens 6..7 (non-empty), which first ends after token 7 at the latest.
  const std::string full = tok.decode(base.ids, true);
  const std::string stop = tok.decode(std::vector<int32_t>(base.ids.begin() + 6, base.ids.begin() + 8), true);
  ASSERT_FALSE(stop.empty());
  SequenceRequest st = greedy_request(prompt_of(6, 3), 20);
  st.stop = {stop};
  ASSERT_NE(batcher.submit(st, r.sink(1)), nullptr);
  const auto& got = r.wait();
  const size_t first_eos = static_cast<size_t>(std::find(base.ids.begin(), base.ids.end(), base.ids[4]) - base.ids.begin());
  EXPECT_EQ(got[0].finish_reason, "stop");
  EXPECT_EQ(got[0].ids, std::vector<int32_t>(base.ids.begin(), base.ids.begin() + static_cast<int64_t>(first_eos) + 1));
  EXPECT_EQ(got[0].text, tok.decode(std::vector<int32_t>(base.ids.begin(), base.ids.begin() + static_cast<int64_t>(first_eos)), true));
  EXPECT_EQ(got[1].finish_reason, "stop");
  EXPECT_EQ(got[1].text, full.substr(0, full.find(stop)));
  EXPECT_LE(got[1].ids.size(), 8u);
}

// Log-probs: each chosen token's log-softmax value, and the top-k list sorted, its first entry the greedy choice.
TEST(ContinuousBatching, LogprobsAreTheLogSoftmaxOfTheChosenTokens) {
  test::TempDir dir;
  const CausalLM model = tiny_model(DType::F32, dir);
  ContinuousBatcher::Options o = options(2, 32, 8);
  ContinuousBatcher batcher({&model}, test::cut_tokenizer(), o);
  Results r(1);
  SequenceRequest q = greedy_request(prompt_of(5, 9), 6);
  q.logprobs = 3;
  ASSERT_NE(batcher.submit(q, r.sink(0)), nullptr);
  const Collected c = r.wait()[0];
  ASSERT_EQ(c.logprobs.size(), 6u);
  ASSERT_EQ(c.top.size(), 6u);
  for (size_t t = 0; t < 6; ++t) {
    EXPECT_EQ(c.logprobs[t].id, c.ids[t]);
    EXPECT_TRUE(std::isfinite(c.logprobs[t].logprob) && c.logprobs[t].logprob <= 0) << c.logprobs[t].logprob;
    ASSERT_EQ(c.top[t].size(), 3u);
    EXPECT_EQ(c.top[t][0].id, c.ids[t]);  // greedy
    EXPECT_FLOAT_EQ(c.top[t][0].logprob, c.logprobs[t].logprob);
    EXPECT_GE(c.top[t][0].logprob, c.top[t][1].logprob);
    EXPECT_GE(c.top[t][1].logprob, c.top[t][2].logprob);
  }
}

// A cancelled sequence ends with "abort" and frees its row for the one waiting; a full queue refuses; shutdown
// without drain aborts what runs and waits for it.
TEST(ContinuousBatching, CancelFreesTheRowAndShutdownAborts) {
  test::TempDir dir;
  const CausalLM model = tiny_model(DType::F32, dir);
  ContinuousBatcher::Options o = options(1, 512, 8);
  o.max_queue = 1;
  ContinuousBatcher batcher({&model}, test::cut_tokenizer(), o);
  Results first(1), second(1), refused(1);
  auto long_one = batcher.submit(greedy_request(prompt_of(4, 1), 500), first.sink(0));
  ASSERT_NE(long_one, nullptr);
  ASSERT_NE(batcher.submit(greedy_request(prompt_of(4, 2), 3), second.sink(0)), nullptr);
  // One row, running or about to; one sequence waiting: the queue is full.
  EXPECT_EQ(batcher.submit(greedy_request(prompt_of(4, 3), 3), refused.sink(0)), nullptr);
  long_one->cancel();
  EXPECT_EQ(first.wait()[0].finish_reason, "abort");
  EXPECT_LT(first.wait()[0].ids.size(), 500u);
  EXPECT_EQ(second.wait()[0].finish_reason, "length");
  EXPECT_EQ(second.wait()[0].ids.size(), 3u);
  // A sequence cancelled while it waits for a row leaves the queue without one.
  Results running(1), waiting(1);
  auto holder = batcher.submit(greedy_request(prompt_of(4, 5), 500), running.sink(0));
  auto queued = batcher.submit(greedy_request(prompt_of(4, 6), 3), waiting.sink(0));
  ASSERT_NE(holder, nullptr);
  ASSERT_NE(queued, nullptr);
  queued->cancel();
  EXPECT_EQ(waiting.wait()[0].finish_reason, "abort");
  EXPECT_TRUE(waiting.wait()[0].ids.empty());
  holder->cancel();
  EXPECT_EQ(running.wait()[0].finish_reason, "abort");
  Results last(1);
  ASSERT_NE(batcher.submit(greedy_request(prompt_of(4, 4), 500), last.sink(0)), nullptr);
  batcher.shutdown(false);
  EXPECT_EQ(last.wait()[0].finish_reason, "abort");
  EXPECT_EQ(batcher.submit(greedy_request(prompt_of(4, 4), 5), refused.sink(0)), nullptr);  // after shutdown
}

// On a device backend (the stand-in "reference-device", whose memory the host cannot read) the batcher gives the
// compiled CPU's greedy tokens and log-probs: the cache lives on the device, the reference programs return new
// cache values (copied into the cache there), and only ids, logits rows asked for and the inputs cross.
TEST(ContinuousBatching, OnADeviceTheTokensEqualTheHost) {
  test::TempDir dir;
  (void)tiny_model(DType::F32, dir);
  const CausalLM host_model = CausalLM::from_pretrained(dir.path(), LoadOptions{.device = "cpu"});
  const CausalLM dev_model = CausalLM::from_pretrained(dir.path(), LoadOptions{.device = "reference-device"});
  ContinuousBatcher::Options o = options(2, 32, 8);
  std::vector<Collected> got[2];
  for (int d = 0; d < 2; ++d) {
    ContinuousBatcher batcher({d == 0 ? &host_model : &dev_model}, test::cut_tokenizer(), o);
    Results r(3);
    for (size_t i = 0; i < 3; ++i) {
      SequenceRequest q = greedy_request(prompt_of(3 + 5 * static_cast<int64_t>(i), 11), 5);
      q.logprobs = 1;
      ASSERT_NE(batcher.submit(q, r.sink(i)), nullptr);
    }
    got[d] = r.wait();
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[1][i].ids, got[0][i].ids) << i;
    ASSERT_EQ(got[1][i].logprobs.size(), 5u);
    for (size_t t = 0; t < 5; ++t) EXPECT_NEAR(got[1][i].logprobs[t].logprob, got[0][i].logprobs[t].logprob, 1e-4) << i << " " << t;
  }
}

TEST(ContinuousBatching, BadRequestsNameTheField) {
  test::TempDir dir;
  const CausalLM model = tiny_model(DType::F32, dir);
  ContinuousBatcher::Options o = options(1, 32, 8);
  ContinuousBatcher batcher({&model}, test::cut_tokenizer(), o);
  auto expect_error = [&](SequenceRequest r, const std::string& what) {
    try {
      (void)batcher.submit(std::move(r), nullptr);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error(greedy_request({}, 4), "prompt: empty");
  expect_error(greedy_request({1, 99999}, 4), "outside the vocabulary");
  expect_error(greedy_request({1, 2}, 0), "max_new_tokens: must be >= 1");
  expect_error(greedy_request({1, 2}, 25), "more than max_model_len (32)");  // 8 slots for the prompt + 25 > 32
  expect_error(greedy_request(prompt_of(40, 1), 1), "do not fit");
  SequenceRequest t = greedy_request({1, 2}, 4);
  t.sampling.do_sample = true;
  t.sampling.temperature = 0;
  expect_error(t, "temperature");
  t = greedy_request({1, 2}, 4);
  t.sampling.top_p = 1.5f;
  expect_error(t, "top_p");
  t = greedy_request({1, 2}, 4);
  t.model = 3;
  expect_error(t, "model: no model 3");
  EXPECT_EQ(batcher.room_after(8), 24);
  EXPECT_EQ(batcher.room_after(9), 16);
}

}  // namespace
}  // namespace trl

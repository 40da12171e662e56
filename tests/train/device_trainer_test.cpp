// The trainers on the stand-in device ("reference-device": the oracle's kernels on tensors the host may not read):
// the same losses and weights as on the host oracle, and only the batch going up and the losses and metrics coming
// down once the weights are on the device (the transfer counters).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "trl/models/init.h"
#include "trl/backend/program_cache.h"
#include "trl/backend/registry.h"
#include "trl/models/reward_model.h"
#include "trl/models/score.h"
#include "trl/train/dpo_trainer.h"
#include "trl/train/gkd_trainer.h"
#include "trl/train/grpo_trainer.h"
#include "trl/train/kto_trainer.h"
#include "trl/train/reward_trainer.h"
#include "trl/train/sft_trainer.h"

namespace trl {
namespace {

using ojson = nlohmann::ordered_json;

Dataset sentences() {
  Dataset d;
  const char* texts[] = {"the cat sat on the mat", "one two three", "a much longer sentence with a few more tokens", "x y z",
                         "hello there", "short", "what is this", "green eggs and ham"};
  for (const char* t : texts) d.rows.push_back(ojson{{"text", t}}), d.where.push_back("test");
  return d;
}

// 2 steps of 2 micro-batches of 2 rows, logged every step, clipped (the norm and the scaling run on the device).
template <typename Config>
Config config(const std::string& out, bool bf16 = false) {
  Config c;
  c.output_dir = out;
  c.bf16 = bf16;
  c.learning_rate = 1e-3;
  c.logging_steps = 1;
  c.save_steps = 1000;
  c.report = false;
  c.progress = false;
  c.per_device_train_batch_size = 2;
  c.gradient_accumulation_steps = 2;
  c.max_steps = 2;
  c.max_grad_norm = 0.5;
  return c;
}

// A logged time or speed (step_seconds, time/generation, train_tokens_per_s, ...): they differ between runs.
bool is_timing(const std::string& key) {
  for (const char* part : {"time", "seconds", "_per_s", "runtime"})
    if (key.find(part) != std::string::npos) return true;
  return false;
}

// Every logged figure of every step (times aside) to 1e-6, relative; the masters to 1e-5.
void expect_same_run(const TrainOutput& got, const TrainOutput& want, const TensorMap& got_w, const TensorMap& want_w) {
  ASSERT_EQ(got.log_history.size(), want.log_history.size());
  for (size_t i = 0; i < want.log_history.size(); ++i) {
    for (const auto& [key, value] : want.log_history[i].items()) {
      if (!value.is_number() || is_timing(key)) continue;
      ASSERT_TRUE(got.log_history[i].contains(key)) << key;
      const double a = got.log_history[i][key].get<double>(), b = value.get<double>();
      EXPECT_TRUE(std::isfinite(a) && std::fabs(a - b) <= 1e-6 * std::max(1.0, std::fabs(b))) << key << " entry " << i << ": " << a << " vs " << b;
    }
  }
  ASSERT_EQ(got_w.size(), want_w.size());
  double worst = 0;
  for (const auto& [name, w] : want_w) {
    const std::vector<float> a = got_w.at(name).to_f32_vector(), b = w.to_f32_vector();
    ASSERT_EQ(a.size(), b.size()) << name;
    for (size_t i = 0; i < a.size(); ++i) worst = test::nan_max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  EXPECT_LE(worst, 1e-5);
}

CausalLM on_device(const test::TinyModel& t) { return CausalLM::from_pretrained(t.dir.file("model"), LoadOptions{.device = "reference-device"}); }

// Losses to 1e-6 and weights to 1e-5 of the host oracle's (the same kernels: in practice equal), f32 and bf16.
TEST(DeviceTrainer, SftEqualsTheHostOracleAndMovesOnlyTheBatchAndTheScalars) {
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  for (bool bf16 : {false, true}) {
    if (bf16 && test::kSanitized) continue;  // the oracle's bf16 run twice: f32 covers the path under the sanitizers
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    SFTConfig host_cfg = config<SFTConfig>(t.dir.file(bf16 ? "host16" : "host32"), bf16);
    host_cfg.torch_compile = false;  // the host oracle ("reference")
    SFTTrainer host(t.model, tok, sentences(), host_cfg);
    const TrainOutput want = host.train();

    const CausalLM on_device = CausalLM::from_pretrained(t.dir.file("model"), LoadOptions{.device = "reference-device"});
    SFTTrainer dev(on_device, tok, sentences(), config<SFTConfig>(t.dir.file(bf16 ? "dev16" : "dev32"), bf16));
    // The weights went up once: one upload per master and per distinct compute weight, nothing down.
    const Backend::Transfers start = dev.transfers();
    const size_t params = dev.master_weights().size();
    EXPECT_EQ(start.uploads, static_cast<int64_t>(bf16 ? 2 * params : params));
    EXPECT_EQ(start.downloads, 0);
    for (const auto& [name, w] : dev.master_weights()) EXPECT_TRUE(w.is_device()) << name;

    Backend::Transfers at_last_step;
    dev.on_step = [&](const ojson&) { at_last_step = dev.transfers(); };
    const TrainOutput got = dev.train();
    // Nothing larger than a micro-batch's per-row metric sums came down in the steps (2 rows, f64).
    EXPECT_LE(at_last_step.largest_download, 2 * 8);
    EXPECT_GT(at_last_step.downloads, 0);
    ASSERT_EQ(got.log_history.size(), want.log_history.size());
    for (size_t i = 0; i + 1 < want.log_history.size(); ++i) {  // the step entries (the last is the run's summary)
      for (const char* key : {"loss", "grad_norm", "entropy", "mean_token_accuracy"}) {
        const double a = got.log_history[i][key].get<double>(), b = want.log_history[i][key].get<double>();
        EXPECT_TRUE(std::isfinite(a) && std::fabs(a - b) <= 1e-6 * std::max(1.0, std::fabs(b))) << key << " step " << i << ": " << a << " vs " << b;
      }
    }
    const TensorMap w_dev = dev.master_weights_on_host();
    double worst = 0;
    for (const auto& [name, w] : host.master_weights()) {
      const std::vector<float> a = w_dev.at(name).to_f32_vector(), b = w.to_f32_vector();
      for (size_t i = 0; i < a.size(); ++i) worst = test::nan_max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
    }
    EXPECT_LE(worst, 1e-5);

    // Per micro-batch (2 steps × 2): its 5 batch tensors and the metrics' two token masks up, its loss and the two
    // metrics' per-row sums down; per step the gradient norm's sum; the final save downloads the trained weights
    // once (and the test's read of the masters above, once more each).
    const Backend::Transfers end = dev.transfers();
    const int64_t steps = 2, micro = steps * 2;
    EXPECT_EQ(end.uploads - start.uploads, 7 * micro);
    EXPECT_EQ(end.downloads - start.downloads, 3 * micro + steps + static_cast<int64_t>(params) + static_cast<int64_t>(params));
  }
}

// What crossed during each step (from one on_step to the next): the counters at every step's end.
struct StepTransfers {
  std::vector<Backend::Transfers> at_step;
  void watch(BaseTrainer& t) {
    at_step.push_back(t.transfers());  // after the weights went up
    t.on_step = [this, &t](const ojson&) { at_step.push_back(t.transfers()); };
  }
  // Every step moved the same number of tensors each way, and no tensor larger than `largest` bytes came down or
  // went up (a weight, a gradient or a row of logits would be larger).
  void expect_only_batches_and_scalars(int64_t largest) const {
    ASSERT_GE(at_step.size(), 3u);
    EXPECT_GT(at_step[0].uploads, 0);  // the weights are on the device
    for (size_t i = 1; i < at_step.size(); ++i) {
      EXPECT_EQ(at_step[i].uploads - at_step[i - 1].uploads, at_step[1].uploads - at_step[0].uploads) << "step " << i;
      EXPECT_EQ(at_step[i].downloads - at_step[i - 1].downloads, at_step[1].downloads - at_step[0].downloads) << "step " << i;
    }
    EXPECT_GT(at_step[1].downloads - at_step[0].downloads, 0);
    EXPECT_LE(at_step.back().largest_download, largest);
  }
};

Dataset word_pairs(int n) {
  static const char* words[] = {"apple", "river", "stone", "cloud", "green", "tiger", "piano", "light"};
  Dataset d;
  for (int i = 0; i < n; ++i) {
    const std::string w = words[i % 8], other = words[(i + 3) % 8];
    d.rows.push_back(ojson{{"prompt", "Repeat the word " + w + ":"}, {"chosen", " " + w}, {"rejected", " " + other}});
    d.where.push_back("pairs:" + std::to_string(i + 1));
  }
  return d;
}

// A resume on the device loads the checkpoint's masters, bf16 copies and moments into the device tensors the model
// and AdamW share (Backend::upload_into, in place), and continues exactly as the uninterrupted run.
TEST(DeviceTrainer, ResumeOnTheDeviceContinuesAsTheUninterruptedRun) {
  test::TinyModel t(test::kCutVocab);
  for (bool bf16 : {false, true}) {
    if (bf16 && test::kSanitized) continue;
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    SFTConfig c = config<SFTConfig>(t.dir.file(bf16 ? "whole16" : "whole32"), bf16);
    c.save_steps = 1;
    SFTTrainer whole(on_device(t), test::cut_tokenizer(), sentences(), c);
    const TrainOutput want = whole.train();
    SFTConfig r = config<SFTConfig>(t.dir.file(bf16 ? "resumed16" : "resumed32"), bf16);
    r.resume_from_checkpoint = c.output_dir + "/checkpoint-1";
    SFTTrainer resumed(on_device(t), test::cut_tokenizer(), sentences(), r);
    for (const auto& [name, w] : resumed.master_weights()) EXPECT_TRUE(w.is_device()) << name;
    const TrainOutput got = resumed.train();
    ASSERT_EQ(got.log_history.size(), want.log_history.size());
    EXPECT_EQ(got.log_history[1]["loss"].get<double>(), want.log_history[1]["loss"].get<double>());
    const TensorMap a = resumed.master_weights_on_host(), b = whole.master_weights_on_host();
    for (const auto& [name, w] : b) EXPECT_EQ(a.at(name).to_f32_vector(), w.to_f32_vector()) << name;
  }
}

// DPO with a live reference that TR-DPO mixes into every step (the policy's masters into the reference's weights,
// on the device), and with a precomputed one: each equal to the host oracle.
TEST(DeviceTrainer, DpoEqualsTheHostOracle) {
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  for (bool sync : {true, false}) {
    if (!sync && test::kSanitized) continue;  // the sanitizer pass runs the live reference only
    SCOPED_TRACE(sync ? "sync_ref_model" : "precompute_ref_log_probs");
    DPOConfig c = config<DPOConfig>(t.dir.file(sync ? "sync" : "pre"));
    c.sync_ref_model = sync, c.ref_model_sync_steps = 1, c.ref_model_mixup_alpha = 0.5;
    c.precompute_ref_log_probs = !sync;
    DPOConfig h = c;
    h.output_dir += "-host", h.torch_compile = false;
    DPOTrainer host(t.model, tok, word_pairs(8), h);
    const TrainOutput want = host.train();
    DPOTrainer dev(on_device(t), tok, word_pairs(8), c);
    StepTransfers watch;
    watch.watch(dev);
    const TrainOutput got = dev.train();
    expect_same_run(got, want, dev.master_weights_on_host(), host.master_weights());
    watch.expect_only_batches_and_scalars(/*the sums of 4 sequences, f64: no per-token values come down*/ 4 * 8);
  }
}

TEST(DeviceTrainer, KtoEqualsTheHostOracle) {
  if (test::kSanitized) GTEST_SKIP() << "the sequence step's device path runs under the sanitizers in the DPO test";
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  Dataset rows;
  const Dataset pairs = word_pairs(8);
  for (const auto& r : pairs.rows) {
    rows.rows.push_back(ojson{{"prompt", r["prompt"]}, {"completion", r["chosen"]}, {"label", true}}), rows.where.push_back("rows");
    rows.rows.push_back(ojson{{"prompt", r["prompt"]}, {"completion", r["rejected"]}, {"label", false}}), rows.where.push_back("rows");
  }
  KTOConfig c = config<KTOConfig>(t.dir.file("kto"));
  KTOConfig h = c;
  h.output_dir += "-host", h.torch_compile = false;
  KTOTrainer host(t.model, tok, rows, h);
  const TrainOutput want = host.train();
  KTOTrainer dev(on_device(t), tok, rows, c);
  StepTransfers watch;
  watch.watch(dev);
  const TrainOutput got = dev.train();
  expect_same_run(got, want, dev.master_weights_on_host(), host.master_weights());
  watch.expect_only_batches_and_scalars(/*per-sequence sums, f64*/ 4 * 8);
}

TEST(DeviceTrainer, RewardEqualsTheHostOracle) {
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  const int32_t pad = *tok.pad_token_id();
  const RewardModel host_model{t.model, new_score_head(t.model.config(), t.model.dtype(), 7), pad, true};
  const RewardModel dev_model{on_device(t), host_model.score, pad, true};
  RewardConfig c = config<RewardConfig>(t.dir.file("rm"));
  RewardConfig h = c;
  h.output_dir += "-host", h.torch_compile = false;
  RewardTrainer host(host_model, tok, word_pairs(8), h);
  const TrainOutput want = host.train();
  RewardTrainer dev(dev_model, tok, word_pairs(8), c);
  StepTransfers watch;
  watch.watch(dev);
  const TrainOutput got = dev.train();
  expect_same_run(got, want, dev.master_weights_on_host(), host.master_weights());
  watch.expect_only_batches_and_scalars(/*the rewards of 4 sequences, f64: not the [4, T] scores*/ 4 * 8);
}

// SFT and DPO with a LoRA adapter (dropout on: its mask seed goes up each micro-batch; DPO's reference is the base
// with the adapter disabled, sharing the frozen weights): equal to the host oracle.
TEST(DeviceTrainer, LoraEqualsTheHostOracle) {
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  LoraConfig lora;
  lora.r = 8, lora.lora_alpha = 16, lora.lora_dropout = 0.1, lora.target_modules = {"all-linear"};
  for (bool dpo : {false, true}) {
    if (dpo && test::kSanitized) continue;  // SFT covers the adapter's device path under the sanitizers
    SCOPED_TRACE(dpo ? "dpo" : "sft");
    std::vector<TrainOutput> out;
    std::vector<TensorMap> weights;
    for (bool on_dev : {false, true}) {
      const std::string name = fmt::format("lora-{}-{}", dpo ? "dpo" : "sft", on_dev ? "dev" : "host");
      const CausalLM model = on_dev ? on_device(t) : t.model;
      if (dpo) {
        DPOConfig c = config<DPOConfig>(t.dir.file(name));
        c.peft_config = lora, c.torch_compile = on_dev;
        DPOTrainer tr(model, tok, word_pairs(8), c);
        out.push_back(tr.train()), weights.push_back(tr.master_weights_on_host());
      } else {
        SFTConfig c = config<SFTConfig>(t.dir.file(name));
        c.peft_config = lora, c.torch_compile = on_dev;
        SFTTrainer tr(model, tok, sentences(), c);
        out.push_back(tr.train()), weights.push_back(tr.master_weights_on_host());
      }
    }
    expect_same_run(out[1], out[0], weights[1], weights[0]);
  }
}

// GRPO (with a KL term against a copied reference) and RLOO: generation on the device from the compute weights AdamW
// updates there, the same completions, losses and weights as the host oracle.
template <class Trainer, class Config>
void expect_online_run_equal(const std::string& name) {
  SCOPED_TRACE(name);
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  Dataset prompts;
  for (const char* p : {"Say a word.", "Count to three.", "Name a colour.", "Say hello."})
    prompts.rows.push_back(ojson{{"prompt", p}}), prompts.where.push_back("prompts");
  Config c = config<Config>(t.dir.file(name));
  c.per_device_train_batch_size = 4, c.gradient_accumulation_steps = 1;
  c.num_generations = 2, c.max_completion_length = 6, c.beta = 0.1, c.pad_to_multiple_of = "32";
  Config h = c;
  h.output_dir += "-host", h.torch_compile = false;  // the oracle trains and generates
  std::vector<std::vector<std::string>> seen[2];
  Trainer host(t.model, tok, {reward_function("length:20")}, prompts, h);
  host.on_rollout = [&](const RolloutRecord& r) { seen[0].push_back(r.completions); };
  const TrainOutput want = host.train();
  Trainer dev(on_device(t), tok, {reward_function("length:20")}, prompts, c);
  dev.on_rollout = [&](const RolloutRecord& r) { seen[1].push_back(r.completions); };
  StepTransfers watch;
  watch.watch(dev);
  const TrainOutput got = dev.train();
  ASSERT_FALSE(seen[0].empty());
  EXPECT_EQ(seen[1], seen[0]);
  expect_same_run(got, want, dev.master_weights_on_host(), host.master_weights());
  // Generation downloads one id per row per step; the loss runs where the per-token log-probs are (the round's
  // generation-time and reference log-probs stay there too), so the largest thing down is its metrics.
  watch.expect_only_batches_and_scalars(static_cast<int64_t>(sizeof(PolicyLossMetrics)));
}

TEST(DeviceTrainer, GrpoEqualsTheHostOracle) { expect_online_run_equal<GRPOTrainer, GRPOConfig>("grpo"); }
TEST(DeviceTrainer, RlooEqualsTheHostOracle) {
  if (test::kSanitized) GTEST_SKIP() << "GRPO's test runs the same device path under the sanitizers";
  expect_online_run_equal<RLOOTrainer, RLOOConfig>("rloo");
}

// A reward model on the device (trl score, GRPO's reward-model rewards): the same rewards as the host oracle, its
// weights uploaded once, then per batch only the batch up and the [rows] rewards down.
TEST(DeviceTrainer, RewardModelScoresEqualTheHostOracle) {
  test::TinyModel t(test::kCutVocab);
  const RewardModel host = load_reward_model(t.dir.file("model"), LoadOptions{.device = "cpu"}, 0);
  const RewardModel dev = load_reward_model(t.dir.file("model"), LoadOptions{.device = "reference-device"}, 0);
  const std::vector<std::vector<int32_t>> seqs = {{5, 9, 3}, {7}, {4, 4, 8, 2, 6}, {1, 2}, {3, 0, 0}};
  auto oracle = make_backend("reference");
  const std::vector<double> want = reward_scores(host, seqs, *oracle, 2);
  auto device = make_backend("reference-device");
  ProgramCache programs(*device, 4);
  const TensorMap weights = reward_weights(dev, *device);
  const Backend::Transfers start = device->transfers();
  EXPECT_EQ(start.uploads, static_cast<int64_t>(weights.size()));
  for (const auto& [name, w] : weights) EXPECT_TRUE(w.is_device()) << name;
  const std::vector<double> got = reward_scores(dev, seqs, programs, 2, &weights);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(std::isfinite(got[i]) && got[i] == want[i]) << i << ": " << got[i] << " vs " << want[i];
  const Backend::Transfers end = device->transfers();
  const int64_t batches = 3;  // 2 + 2 + 1 rows
  EXPECT_EQ(end.uploads - start.uploads, 3 * batches);  // ids, mask, positions (the pooling reads one-token spans, no weights)
  EXPECT_EQ(end.downloads - start.downloads, batches);
  EXPECT_EQ(end.largest_download, 2 * 8);  // two rows' rewards, f64
}

// trl score's log-probs and CausalLM::forward's logits on the device: the weights go up once per call, each batch
// goes up and only what the caller asked for comes down; the values equal the host oracle's.
TEST(DeviceModel, ScoresAndLogitsEqualTheHostOracle) {
  test::TinyModel t(test::kCutVocab);
  const std::vector<std::vector<int32_t>> seqs = {{5, 9, 3, 7}, {7, 2}, {4, 4, 8, 2, 6}};
  auto oracle = make_backend("reference");
  auto device = make_backend("reference-device");
  const std::vector<SequenceScore> want = score_sequences(t.model, seqs, *oracle, 2), got = score_sequences(t.model, seqs, *device, 2);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].token_logprobs, want[i].token_logprobs) << i;
  const Backend::Transfers after_score = device->transfers();
  EXPECT_EQ(after_score.uploads, static_cast<int64_t>(t.model.weights().size()) + 2 * 4);  // the weights, then 2 batches of 4 inputs
  EXPECT_EQ(after_score.downloads, 2);
  Batch batch;
  batch.input_ids = Tensor::from_i32(std::vector<int32_t>{5, 9, 3, 7}, {1, 4});
  const Tensor a = t.model.forward(batch, *oracle), b = t.model.forward(batch, *device);
  ASSERT_FALSE(b.is_device());
  EXPECT_EQ(a.to_f32_vector(), b.to_f32_vector());
}

// GKD with on-policy completions half the time (the student generates on the device), GKD with seq_kd (the rest
// from the teacher, loaded for the CPU: its generate() runs on the trainer's device, where its weights went), and the
// DistillationTrainer: the teacher's hidden states stay on the device between its program and the student's.
TEST(DeviceTrainer, DistillationEqualsTheHostOracle) {
  test::TinyModel student(test::kCutVocab);
  test::TempDir dir;
  InitOptions o;
  o.vocab_size = test::kCutVocab, o.preset = "tiny", o.seed = 4321, o.initializer_range = 0.2, o.num_hidden_layers = 1;
  init_model(o, dir.file("teacher"));
  const CausalLM teacher = CausalLM::from_pretrained(dir.file("teacher"), LoadOptions{.device = "cpu"});
  const Tokenizer& tok = test::cut_tokenizer();
  Dataset rows;
  for (const char* w : {"apple", "river", "stone", "cloud", "green", "tiger", "piano", "light"})
    rows.rows.push_back(ojson{{"prompt", std::string("Repeat ") + w + ":"}, {"completion", std::string(" ") + w}}), rows.where.push_back("rows");
  for (const std::string method : {"gkd", "gkd_seq_kd", "distillation"}) {
    if (method != "distillation" && test::kSanitized) continue;  // the DistillationTrainer covers the same device path (and always generates)
    SCOPED_TRACE(method);
    std::vector<TrainOutput> out;
    std::vector<TensorMap> weights;
    for (bool on_dev : {false, true}) {
      const std::string name = fmt::format("{}-{}", method, on_dev ? "dev" : "host");
      const CausalLM model = on_dev ? on_device(student) : student.model;
      StepTransfers watch;
      if (method != "distillation") {
        GKDConfig c = config<GKDConfig>(dir.file(name));
        c.lmbda = 0.5, c.beta = 0.5, c.max_new_tokens = 4, c.seed = 11, c.torch_compile = on_dev;
        c.seq_kd = method == "gkd_seq_kd";
        GKDTrainer t(model, teacher, tok, rows, c);
        if (on_dev) watch.watch(t);
        out.push_back(t.train()), weights.push_back(t.master_weights_on_host());
      } else {
        DistillationConfig c = config<DistillationConfig>(dir.file(name));
        c.max_completion_length = 4, c.seed = 11, c.torch_compile = on_dev;
        DistillationTrainer t(model, teacher, tok, rows, c);
        if (on_dev) watch.watch(t);
        out.push_back(t.train()), weights.push_back(t.master_weights_on_host());
      }
      if (on_dev) watch.expect_only_batches_and_scalars(8);  // the norm's sum and the loss: generation brings down ids, the divergence stays
    }
    expect_same_run(out[1], out[0], weights[1], weights[0]);
  }
}

}  // namespace
}  // namespace trl

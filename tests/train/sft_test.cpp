// SFT: loss masks per dataset format, collation, gradient accumulation, resume, program counts, saving, learning.
#include "trl/train/sft_trainer.h"

#include <csignal>
#include <cmath>
#include <filesystem>
#include <algorithm>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "assets/assets.h"
#include "trl/backend/cpu/cpu_backend.h"
#include "trl/core/error.h"
#include "core/fs.h"
#include "trl/generation/generate.h"
#include "trl/models/init.h"
#include "test_util.h"
#include "trl/tokenizer/chat_template.h"

namespace trl {
namespace {

using ojson = nlohmann::ordered_json;

Dataset rows(const std::vector<std::string>& lines) {
  Dataset d;
  for (size_t i = 0; i < lines.size(); ++i) {
    d.rows.push_back(ojson::parse(lines[i]));
    d.where.push_back("test:" + std::to_string(i + 1));
  }
  return d;
}

// The training tests run real steps over the 151936-word vocabulary; under the sanitizers (10-20x slower) the
// longest ones are skipped: the sanitizer pass still runs the data, collation and resume tests.
using test::kSanitized;

TEST(SFTData, LossMasksPerFormat) {
  const Tokenizer& tok = test::qwen3_tokenizer();
  SFTDataOptions o;
  // Language modelling: every token is a label; the eos string is appended.
  auto ex = prepare_sft_dataset(rows({R"({"text": "Hello world"})"}), tok, o);
  EXPECT_EQ(ex[0].input_ids, tok.encode("Hello world<|im_end|>"));
  EXPECT_EQ(ex[0].labels_mask, std::vector<uint8_t>(ex[0].input_ids.size(), 1));
  // Prompt-completion: the prompt's tokens are masked (completion_only_loss defaults to true here).
  ex = prepare_sft_dataset(rows({R"({"prompt": "The sky is", "completion": " blue"})"}), tok, o);
  const auto prompt = tok.encode("The sky is");
  EXPECT_EQ(ex[0].input_ids, tok.encode("The sky is blue<|im_end|>"));
  for (size_t t = 0; t < ex[0].labels_mask.size(); ++t) EXPECT_EQ(ex[0].labels_mask[t], t >= prompt.size() ? 1 : 0) << t;
  o.completion_only_loss = false;
  ex = prepare_sft_dataset(rows({R"({"prompt": "The sky is", "completion": " blue"})"}), tok, o);
  EXPECT_EQ(ex[0].labels_mask, std::vector<uint8_t>(ex[0].input_ids.size(), 1));
  o.completion_only_loss.reset();
  // Conversational: the chat template renders it; every token is a label by default.
  const ojson msgs = ojson::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}])");
  ex = prepare_sft_dataset(rows({ojson{{"messages", msgs}}.dump()}), tok, o);
  EXPECT_EQ(ex[0].input_ids, apply_chat_template_ids(tok, msgs).input_ids);
  EXPECT_EQ(ex[0].labels_mask, std::vector<uint8_t>(ex[0].input_ids.size(), 1));
  // Conversational prompt-completion: the prompt with its generation prompt is masked.
  const ojson p = ojson::parse(R"([{"role": "user", "content": "Hi"}])"), c = ojson::parse(R"([{"role": "assistant", "content": "Hello!"}])");
  ex = prepare_sft_dataset(rows({ojson{{"prompt", p}, {"completion", c}}.dump()}), tok, o);
  ChatTemplateOptions gen;
  gen.add_generation_prompt = true;
  const size_t plen = apply_chat_template_ids(tok, p, gen).input_ids.size();
  EXPECT_EQ(ex[0].input_ids, apply_chat_template_ids(tok, msgs).input_ids);
  for (size_t t = 0; t < ex[0].labels_mask.size(); ++t) EXPECT_EQ(ex[0].labels_mask[t], t >= plen ? 1 : 0) << t;
  // assistant_only_loss needs {% generation %} in the template: Qwen3's has none, a clear error.
  o.assistant_only_loss = true;
  try {
    prepare_sft_dataset(rows({ojson{{"messages", msgs}}.dump()}), tok, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("{% generation %}"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test:1"), std::string::npos) << e.what();
  }
  // Truncation keeps the start; a row with no label left is dropped.
  o = SFTDataOptions{};
  o.max_length = 3;
  int64_t dropped = 0;
  ex = prepare_sft_dataset(rows({R"({"text": "one two three four five"})", R"({"prompt": "one two three four five", "completion": " six"})"}), tok, o, &dropped);
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].input_ids.size(), 3u);
  EXPECT_EQ(dropped, 1);
  // A row in no known format names its place.
  try {
    prepare_sft_dataset(rows({R"({"question": "x"})"}), tok, SFTDataOptions{});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test:1: no SFT field"), std::string::npos) << e.what();
  }
}

TEST(SFTData, CollationAndPacking) {
  SFTExample a{{10, 11, 12}, {0, 1, 1}, ""}, b{{20, 21, 22, 23, 24}, {1, 1, 1, 1, 1}, ""};
  SFTBatch p = collate_padded({&a, &b}, 0, 4, 100);
  ASSERT_EQ(p.input_ids.shape(), (Shape{2, 8}));  // longest 5, rounded up to a multiple of 4
  EXPECT_EQ(p.num_items, 2 + 4);
  EXPECT_EQ(p.num_tokens, 8);
  const float* w = p.weights.data_as<float>();
  EXPECT_EQ(std::vector<float>(w, w + 8), (std::vector<float>{1, 1, 0, 0, 0, 0, 0, 0}));  // position t predicts token t+1
  EXPECT_EQ(p.labels.data_as<int32_t>()[0], 11);
  SFTBatch k = collate_packed({{&a, &b}}, 0, 10);
  EXPECT_EQ(k.attention_mask.to_i64_vector(), (std::vector<int64_t>{1, 1, 1, 2, 2, 2, 2, 2, 0, 0}));
  EXPECT_EQ(k.position_ids.to_i64_vector(), (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 4, 1, 1}));
  const float* kw = k.weights.data_as<float>();
  EXPECT_EQ(kw[2], 0.0f);  // the last token of a never predicts the first of b
  const auto bins = pack_best_fit_decreasing({5, 3, 4, 2, 6, 1}, 8);
  std::set<size_t> seen;
  for (const auto& bin : bins) {
    int64_t total = 0;
    for (size_t i : bin) total += std::vector<int64_t>{5, 3, 4, 2, 6, 1}[i], seen.insert(i);
    EXPECT_LE(total, 8);
  }
  EXPECT_EQ(seen.size(), 6u);
  EXPECT_EQ(bins.size(), 3u);  // 21 tokens in bins of 8: 6+2, 5+3, 4+1
}


Dataset uneven_data() {
  std::vector<std::string> lines;
  const char* texts[] = {"a", "the cat sat on the mat", "one two", "a much longer sentence with quite a few more tokens in it", "x y z",
                         "hello there", "short", "what is this"};
  for (const char* t : texts) lines.push_back(ojson{{"text", t}}.dump());
  return rows(lines);
}

SFTConfig base_config(const std::string& out) {
  SFTConfig c;
  c.output_dir = out;
  c.bf16 = false;
  c.learning_rate = 1e-3;
  c.logging_steps = 1;
  c.save_steps = 1000;
  c.report = false;
  c.progress = false;
  c.max_grad_norm = 0;  // compare raw updates
  return c;
}

// 4 micro-batches of 1 == 1 batch of 4: the loss is normalised by the labels of the whole accumulated batch.
TEST(SFTTrainer, GradientAccumulationEqualsOneLargeBatch) {
  test::TinyModel t;
  const Tokenizer& tok = test::qwen3_tokenizer();
  SFTConfig a = base_config(t.dir.file("a"));
  a.adam_epsilon = 1.0;  // with a large epsilon the first Adam update is ~lr·g: it compares the gradients themselves
  a.per_device_train_batch_size = 4;
  a.max_steps = 1;
  SFTConfig b = base_config(t.dir.file("b"));
  b.adam_epsilon = 1.0;
  b.per_device_train_batch_size = 1;
  b.gradient_accumulation_steps = 4;
  b.max_steps = 1;
  SFTTrainer ta(t.model, tok, uneven_data(), a), tb(t.model, tok, uneven_data(), b);
  const TrainOutput oa = ta.train(), ob = tb.train();
  EXPECT_NEAR(oa.log_history[0]["loss"].get<double>(), ob.log_history[0]["loss"].get<double>(), 1e-5);
  double worst = 0, scale = 0;
  for (const auto& [name, w] : ta.master_weights()) {
    const auto x = w.to_f32_vector(), y = tb.master_weights().at(name).to_f32_vector(), w0 = t.model.weights().at(name).to_f32_vector();
    for (size_t i = 0; i < x.size(); ++i) worst = test::nan_max(worst, static_cast<double>(std::fabs(x[i] - y[i]))), scale = std::max(scale, static_cast<double>(std::fabs(x[i] - w0[i])));
  }
  EXPECT_GT(scale, 1e-7);          // the step moved the weights
  EXPECT_LE(worst, 1e-3 * scale);  // by the same update
}

// Train 6 steps; or train 3, stop, resume from the checkpoint and train 3 more: the same losses and weights.
TEST(SFTTrainer, ResumeIsExact) {
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  SFTConfig c = base_config(t.dir.file("full"));
  c.per_device_train_batch_size = 2;
  c.max_steps = 6;
  c.bf16 = true;
  SFTTrainer full(t.model, tok, uneven_data(), c);
  const TrainOutput of = full.train();
  SFTConfig first = c;
  first.output_dir = t.dir.file("split");
  first.save_steps = 3;
  first.max_steps = 6;
  {
    SFTTrainer tr(t.model, tok, uneven_data(), first);
    int steps = 0;
    tr.on_step = [&](const ojson&) {
      if (++steps == 3) ::raise(SIGINT);  // Ctrl-C after step 3: a checkpoint is saved, training stops
    };
    const TrainOutput o = tr.train();
    EXPECT_TRUE(o.interrupted);
    EXPECT_EQ(o.global_step, 3);
  }
  ASSERT_TRUE(std::filesystem::exists(t.dir.file("split/checkpoint-3/optimizer.safetensors")));
  SFTConfig second = first;
  second.resume_from_checkpoint = "last";
  SFTTrainer tr(t.model, tok, uneven_data(), second);
  const TrainOutput os = tr.train();
  ASSERT_EQ(os.global_step, 6);
  ASSERT_EQ(of.log_history.size(), os.log_history.size());
  for (size_t i = 0; i < of.log_history.size(); ++i) EXPECT_EQ(of.log_history[i]["loss"], os.log_history[i]["loss"]) << i;
  for (const auto& [name, w] : full.master_weights()) EXPECT_EQ(w.to_f32_vector(), tr.master_weights().at(name).to_f32_vector()) << name;
  // The final folder is a Hugging Face model that loads back with the trained weights' logits.
  const CausalLM back = CausalLM::from_pretrained(t.dir.file("split"));
  EXPECT_EQ(back.weights().at("model.norm.weight").to_f32_vector(), full.master_weights().at("model.norm.weight").to_f32_vector());
  const CausalLM in_memory = CausalLM::from_weights(t.model.config(), full.master_weights(), "trainer");
  Batch batch;
  batch.input_ids = Tensor::from_i32(std::vector<int32_t>{785, 858, 4049, 750, 530}, {1, 5});
  auto backend = make_cpu_backend();
  EXPECT_EQ(back.forward(batch, *backend).to_f32_vector(), in_memory.forward(batch, *backend).to_f32_vector());
  const ojson state = ojson::parse(read_text_file(t.dir.file("split/trainer_state.json")));
  EXPECT_EQ(state["global_step"], 6);
}

// entropy and mean_token_accuracy (TRL's metrics) equal what the model's full logits give: entropy averaged over
// the real tokens, accuracy over the predicted labels, per batch; here after a few steps, so that accuracy is
// neither 0 nor 1, on the eval set (one batch of 8 rows padded to a bucket) and on the first logged training step.
TEST(SFTTrainer, EntropyAndAccuracyMetricsMatchTheLogits) {
  test::TinyModel t;
  const Tokenizer& tok = test::qwen3_tokenizer();
  SFTConfig c = base_config(t.dir.file("m"));
  c.per_device_train_batch_size = 8;  // the whole dataset: step k's metrics are those of the weights before it
  int calls = 0;
  c.per_device_eval_batch_size = 8;
  c.learning_rate = 1e-2;
  c.max_steps = 3;
  SFTTrainer tr(t.model, tok, uneven_data(), c, uneven_data());
  TensorMap after_two;  // the weights step 3 computes its metrics with
  tr.on_step = [&](const ojson&) {
    if (after_two.empty() && tr.master_weights().size() > 0 && ++calls == 2)
      for (const auto& [name, w] : tr.master_weights()) after_two[name] = w.clone();
  };
  const TrainOutput out = tr.train();
  // {entropy, accuracy, number of labels} from the full [1, L, V] logits of each example.
  auto direct = [&](const CausalLM& model) {
    auto backend = make_cpu_backend();
    double ent = 0, right = 0;
    int64_t tokens = 0, labels = 0;
    for (const SFTExample& e : prepare_sft_dataset(uneven_data(), tok, SFTDataOptions{})) {
      const int64_t L = static_cast<int64_t>(e.input_ids.size());
      Batch b;
      b.input_ids = Tensor::from_i32(e.input_ids, {1, L});
      const std::vector<float> z = model.forward(b, *backend).to_f32_vector();
      const int64_t V = static_cast<int64_t>(z.size()) / L;
      for (int64_t i = 0; i < L; ++i) {
        const float* row = z.data() + i * V;
        const double mx = *std::max_element(row, row + V);
        double s = 0, sz = 0;
        for (int64_t v = 0; v < V; ++v) s += std::exp(row[v] - mx), sz += std::exp(row[v] - mx) * row[v];
        ent += mx + std::log(s) - sz / s;
        ++tokens;
        if (i + 1 < L && e.labels_mask[static_cast<size_t>(i + 1)]) {
          right += (std::max_element(row, row + V) - row) == e.input_ids[static_cast<size_t>(i + 1)];
          ++labels;
        }
      }
    }
    return std::array<double, 3>{ent / static_cast<double>(tokens), right / static_cast<double>(labels), static_cast<double>(labels)};
  };
  ASSERT_EQ(out.log_history.size(), 3u);
  ASSERT_FALSE(after_two.empty());
  const auto before = direct(CausalLM::from_weights(t.model.config(), after_two, "two"));
  ASSERT_TRUE(out.log_history[2].contains("mean_token_accuracy"));
  EXPECT_NEAR(out.log_history[2]["entropy"].get<double>(), before[0], 1e-3);
  EXPECT_NEAR(out.log_history[2]["mean_token_accuracy"].get<double>(), before[1], 1.0 / before[2]);  // one near-tie at most
  const auto after = direct(CausalLM::from_weights(t.model.config(), tr.master_weights(), "tuned"));
  EXPECT_GT(after[1], 0.05);  // partly learned: a wrong mask or shift would not match by chance
  EXPECT_LT(after[1], 0.95);
  const ojson m = tr.evaluate_metrics();
  EXPECT_NEAR(m["eval_mean_token_accuracy"].get<double>(), after[1], 1.0 / after[2]);
  EXPECT_NEAR(m["eval_entropy"].get<double>(), after[0], 1e-3);
  EXPECT_NEAR(m["eval_loss"].get<double>(), tr.evaluate(), 1e-9);
  std::printf("[ metrics  ] accuracy %.3f -> %.3f, entropy %.3f -> %.3f\n", before[1], after[1], before[0], after[0]);
}

// pad_to_multiple_of 128 with max_length 512: 4 programs over lengths in 4 buckets; None: one per distinct length,
// reused when a length comes back.
TEST(SFTTrainer, ProgramCountsFollowThePaddingPolicy) {
  if (kSanitized) GTEST_SKIP() << "long: runs in the Release pass";
  test::TinyModel t;
  const Tokenizer& tok = test::qwen3_tokenizer();
  std::vector<std::string> lines;
  std::string text;
  std::set<size_t> lengths;
  // 8 rows from a few tokens to past max_length, in every 128-bucket.
  for (int words : {5, 40, 70, 110, 150, 190, 230, 400}) {
    text.clear();
    for (int k = 0; k < words; ++k) text += " w" + std::to_string(k);
    lines.push_back(ojson{{"text", text}}.dump());
  }
  SFTConfig c = base_config(t.dir.file("o"));
  c.per_device_train_batch_size = 1;
  c.num_train_epochs = 1;
  c.max_length = 512;
  c.pad_to_multiple_of = "128";
  SFTTrainer a(t.model, tok, rows(lines), c);
  const TrainOutput oa = a.train();
  EXPECT_EQ(oa.global_step, 8);
  EXPECT_EQ(oa.programs.compilations, 4);  // every bucket 128..512 occurs once or more
  c.pad_to_multiple_of = "None";
  c.num_train_epochs = 2;  // every length comes back in the second epoch: it must find its program
  SFTTrainer b(t.model, tok, rows(lines), c);
  const TrainOutput ob = b.train();
  for (const auto& l : lines) lengths.insert(std::min<size_t>(512, tok.encode(ojson::parse(l)["text"].get<std::string>() + "<|im_end|>").size()));
  EXPECT_EQ(ob.global_step, 16);
  EXPECT_EQ(ob.programs.compilations, static_cast<int64_t>(lengths.size()));
  EXPECT_EQ(ob.programs.hits, 16 - static_cast<int64_t>(lengths.size()));
}

}  // namespace
}  // namespace trl

namespace trl {
namespace {

// A preset of the cut vocabulary written to dir/base and loaded; the demo dataset's first 8 conversations.
CausalLM cut_model(const test::TempDir& dir, const std::string& preset) {
  InitOptions io;
  io.preset = preset;
  io.vocab_size = test::kCutVocab;
  init_model(io, dir.file("base"));
  return CausalLM::from_pretrained(dir.file("base"));
}
Dataset demo_rows(const test::TempDir& dir) {
  test::write_file(dir.file("chat.jsonl"), std::string(asset("demo/chat.jsonl")));
  Dataset ds = load_dataset(dir.file("chat.jsonl"));
  ds.rows.resize(8);
  ds.where.resize(8);
  return ds;
}

// The learning runs' settings: lr 1e-2 after 5 warm-up steps, a log line every 10 steps, no checkpoints or reports.
SFTConfig learning_config(const std::string& out, int64_t batch, int64_t steps) {
  SFTConfig c;
  c.output_dir = out;
  c.learning_rate = 1e-2;
  c.lr_scheduler_type = "constant_with_warmup";
  c.warmup_steps = 5;
  c.per_device_train_batch_size = batch;
  c.max_steps = steps;
  c.logging_steps = 10;
  c.save_steps = 1000;
  c.progress = false;
  c.report = false;
  return c;
}

// Learning: the tiny model learns 8 of the demo dataset's questions and answers within CI time, with padding
// (batches padded to their longest row) and with packing (best-fit-decreasing rows of 128 tokens).
TEST(SFTTrainer, TinyModelLearnsTheDemoAnswers) {
  if (kSanitized) GTEST_SKIP() << "long: runs in the Release pass";
  const Tokenizer& tok = test::cut_tokenizer();
  test::TempDir dir;
  const CausalLM model = cut_model(dir, "tiny");
  const Dataset ds = demo_rows(dir);
  for (bool packing : {false, true}) {
    SFTConfig c = learning_config(dir.file(packing ? "packed" : "padded"), packing ? 2 : 8, 100);
    c.packing = packing;
    c.max_length = packing ? 128 : 1024;
    SFTTrainer trainer(model, tok, ds, c);
    const TrainOutput out = trainer.train();
    EXPECT_EQ(out.programs.compilations, 1) << "packing " << packing;  // one shape for the whole run
    const double first = out.log_history.front()["loss"].get<double>(), last = out.log_history.back()["loss"].get<double>();
    EXPECT_LT(last, 0.1 * first) << "packing " << packing;
    EXPECT_GT(out.log_history.back()["mean_token_accuracy"].get<double>(), 0.9) << "packing " << packing;
    const CausalLM tuned = CausalLM::from_pretrained(c.output_dir);
    Generator gen(tuned);
    int right = 0;
    for (const ChatAnswer& a : greedy_chat_answers(gen, tok, ds.rows, 10)) right += a.exact;
    EXPECT_GE(right, 7) << "packing " << packing << ": " << right << " of 8 answers exact";
    std::printf("[ learning ] packing %d: loss %.3f -> %.3f, %d of 8 answers exact\n", packing, first, last, right);
  }
}

// A mixture of experts (tiny-moe): the load-balancing loss joins the loss as router_aux_loss_coef · aux (TRL's
// SFTTrainer and its default 0.001), aux_loss is logged, 0 turns it off; on a dense model the option does nothing.
TEST(SFTTrainer, MixtureOfExpertsAddsTheLoadBalancingLoss) {
  const Tokenizer& tok = test::cut_tokenizer();
  test::TempDir dir;
  InitOptions io;
  io.preset = "tiny-moe";
  io.vocab_size = test::kCutVocab;
  io.seed = 5;
  init_model(io, dir.file("moe"));
  const CausalLM model = CausalLM::from_pretrained(dir.file("moe"));
  auto run = [&](std::optional<double> coef) {
    SFTConfig c = base_config(dir.file("out"));
    c.per_device_train_batch_size = 4;
    c.max_steps = 1;
    if (coef) c.router_aux_loss_coef = *coef;
    SFTTrainer trainer(model, tok, uneven_data(), c);
    return trainer.train().log_history.at(0);
  };
  const auto unset = run(std::nullopt), off = run(0.0), one = run(1.0);
  ASSERT_TRUE(unset.contains("aux_loss")) << unset.dump();
  EXPECT_FALSE(off.contains("aux_loss")) << off.dump();
  const double aux = one["aux_loss"].get<double>();
  // E·Σ f·P of a router near uniform: about K (= 2), never below 0 nor above E (= 8).
  EXPECT_GT(aux, 1.0);
  EXPECT_LT(aux, 8.0);
  EXPECT_NEAR(unset["aux_loss"].get<double>(), aux, 1e-6);  // the same first batch and weights
  EXPECT_NEAR(one["loss"].get<double>() - off["loss"].get<double>(), aux, 1e-4);
  EXPECT_NEAR(unset["loss"].get<double>() - off["loss"].get<double>(), 0.001 * aux, 1e-5);
  // A qwen3_moe config whose layers are all dense (mlp_only_layers) has no router: no aux loss, no error.
  ModelConfig all_dense = model.config();
  all_dense.moe.mlp_only_layers = {0, 1};
  const CausalLM dense_moe = CausalLM::from_weights(all_dense, init_weights(all_dense, DType::F32, 5, 0.02, false), "all dense");
  SFTConfig d = base_config(dir.file("all_dense"));
  d.max_steps = 1;
  const auto dense_log = SFTTrainer(dense_moe, tok, uneven_data(), d).train().log_history.at(0);
  EXPECT_FALSE(dense_log.contains("aux_loss")) << dense_log.dump();
  EXPECT_TRUE(std::isfinite(dense_log["loss"].get<double>()));
  // A dense model has no load-balancing loss: the option does nothing (TRL), a bad value is still an error.
  test::TinyModel dense(test::kCutVocab);
  SFTConfig c = base_config(dir.file("dense"));
  c.max_steps = 1;
  c.router_aux_loss_coef = 0.5;
  const auto plain = SFTTrainer(dense.model, tok, uneven_data(), c).train().log_history.at(0);
  EXPECT_FALSE(plain.contains("aux_loss")) << plain.dump();
  c.router_aux_loss_coef = -1;
  EXPECT_NE(test::error_of([&] { SFTTrainer t(dense.model, tok, uneven_data(), c); }).find("router_aux_loss_coef must be a finite number >= 0"),
            std::string::npos);
}

// tiny-moe learns the demo answers as tiny does (the experts, the router and the load-balancing loss train).
TEST(SFTTrainer, TinyMixtureOfExpertsLearns) {
  if (kSanitized) GTEST_SKIP() << "long: runs in the Release pass";
  const Tokenizer& tok = test::cut_tokenizer();
  test::TempDir dir;
  const CausalLM model = cut_model(dir, "tiny-moe");
  const Dataset ds = demo_rows(dir);
  const SFTConfig c = learning_config(dir.file("out"), 8, 60);
  SFTTrainer trainer(model, tok, ds, c);
  const TrainOutput out = trainer.train();
  const double first = out.log_history.front()["loss"].get<double>(), last = out.log_history.back()["loss"].get<double>();
  EXPECT_LT(last, 0.2 * first);
  for (const auto& e : out.log_history) {
    if (e.contains("aux_loss")) {
      EXPECT_TRUE(std::isfinite(e["aux_loss"].get<double>())) << e.dump();
    }
  }
  const CausalLM tuned = CausalLM::from_pretrained(c.output_dir);  // saved one tensor per expert, loaded back
  EXPECT_EQ(tuned.config().model_type, "qwen3_moe");
  std::printf("[ learning ] tiny-moe: loss %.3f -> %.3f, aux_loss %.3f\n", first, last, out.log_history.back().value("aux_loss", -1.0));
}

}  // namespace
}  // namespace trl

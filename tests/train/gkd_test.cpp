// Distillation (docs/DISTILLATION.md): GKD and the DistillationTrainer on the tiny model.
// - Against PyTorch (tests/reference/gkd_reference.py, TRL's generalized_jsd_loss with an independent forward pass):
//   3 GKD steps with lmbda 0 for beta 0.5, 0 and 1 (losses, gradient norms, every step-1 gradient) with a one-layer
//   teacher, padded into larger buckets than PyTorch's unpadded rows; one batch's loss and gradients with a loss
//   temperature (the DistillationTrainer's); a student that is its own teacher gives 0.
// - The sources of completions: lmbda 1 (always the student's), lmbda 0.5 (a mix over steps), seq_kd (the
//   teacher's), and the DistillationTrainer (always the student's, num_generations per prompt).
// - Errors: a teacher of another vocabulary, bad options, malformed rows.
// - Learning: a fresh student distilled from a teacher fine-tuned by SFT answers as the teacher does.
#include <gtest/gtest.h>

#include <cmath>

#include <fmt/format.h>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "golden_util.h"
#include "test_util.h"
#include "assets/assets.h"
#include "trl/backend/program_cache.h"
#include "trl/backend/registry.h"
#include "trl/core/error.h"
#include "trl/data/dataset.h"
#include "trl/generation/generate.h"
#include "trl/models/init.h"
#include "trl/train/gkd_trainer.h"
#include "trl/train/objectives.h"
#include "trl/train/sft_trainer.h"

namespace trl {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using test::kSanitized;

const json& golden() {
  static const json g = json::parse(test::read_file(std::string(TRL_TEST_DATA_DIR) + "/goldens/gkd_train.json"));
  return g;
}

// The golden's teacher: tiny widths, one layer (as tests/reference/make_goldens.sh makes it).
// The goldens' teacher; with vocab_size (test::kCutVocab) the cut vocabulary, for the tests that compare with no golden.
CausalLM golden_teacher(test::TempDir& dir, int64_t vocab_size = 0) {
  InitOptions o;
  o.vocab_size = vocab_size;
  o.preset = "tiny";
  o.dtype = DType::F32;
  o.seed = 4321;
  o.initializer_range = 0.2;
  o.randomize_norms = true;
  o.num_hidden_layers = 1;
  init_model(o, dir.file("teacher"));
  return CausalLM::from_pretrained(dir.file("teacher"));
}

// The golden's rows, pre-tokenized (input_ids + completion_mask, as TRL's collator accepts them).
Dataset golden_rows() {
  Dataset d;
  for (const auto& row : golden()["rows"]) {
    std::vector<int32_t> ids = row[0].get<std::vector<int32_t>>(), mask(ids.size(), 0);
    for (int32_t t : row[1].get<std::vector<int32_t>>()) ids.push_back(t), mask.push_back(1);
    d.rows.push_back(ojson{{"input_ids", ids}, {"completion_mask", mask}});
    d.where.push_back("golden.jsonl:" + std::to_string(d.rows.size()));
  }
  return d;
}

GKDConfig golden_config(const std::string& out, double beta) {
  GKDConfig c;
  c.output_dir = out;
  c.bf16 = false;
  c.learning_rate = golden()["lr"].get<double>();
  c.lr_scheduler_type = "constant";
  c.per_device_train_batch_size = golden()["batch"].get<int64_t>();
  c.max_steps = 3;
  c.logging_steps = 1;
  c.save_steps = 1000;
  c.train_sampling_strategy = "sequential";
  c.report = false;
  c.progress = false;
  c.lmbda = 0;
  c.beta = beta;
  return c;
}

void expect_near(double got, double want, double tol, const std::string& what) {
  EXPECT_TRUE(std::isfinite(got) && std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want))) << what << ": " << got << ", PyTorch " << want;
}

TEST(Gkd, ThreeStepsWithDatasetCompletionsEqualPyTorch) {
  test::GoldenModel student;
  test::TempDir dir;
  const CausalLM teacher = golden_teacher(dir);
  const Tokenizer& tok = test::qwen3_tokenizer();
  for (const json& run : golden()["gkd"]) {
    const double beta = run["beta"].get<double>();
    const std::string what = "beta " + std::to_string(beta);
    GKDTrainer trainer(student.model, teacher, tok, golden_rows(), golden_config(dir.file("gkd" + std::to_string(beta)), beta));
    TensorMap step1;
    trainer.on_pre_optimizer_step = [&](int64_t step, const TensorMap& g) {
      if (step == 1)
        for (const auto& [name, t] : g) step1[name] = t.clone();
    };
    const TrainOutput out = trainer.train();
    ASSERT_EQ(out.log_history.size(), 3u) << what;
    for (size_t s = 0; s < 3; ++s) {
      const ojson& e = out.log_history[s];
      const json& want = run["steps"][s];
      expect_near(e["loss"].get<double>(), want["loss"].get<double>(), 1e-5, what + " step " + std::to_string(s + 1) + " loss");
      expect_near(e["grad_norm"].get<double>(), want["grad_norm"].get<double>(), 1e-4, what + " step " + std::to_string(s + 1) + " grad_norm");
      EXPECT_EQ(e["on_policy"].get<double>(), 0.0) << what;  // lmbda 0: the dataset's completions
    }
    test::expect_gradients(run["grads_step1"], step1, what);
    EXPECT_EQ(out.programs.compilations, 2) << what;  // rows of 2 and the epoch's last row alone, in the same buckets
  }
}

// One batch of rows 0 and 1 through the student's distillation program with a loss temperature.
TEST(Gkd, DivergenceWithATemperatureEqualsPyTorch) {
  test::GoldenModel student;
  test::TempDir dir;
  const CausalLM teacher = golden_teacher(dir);
  auto backend = make_backend("cpu");
  ProgramCache programs(*backend, 4);
  auto tbackend = make_backend("cpu");
  ProgramCache tprograms(*tbackend, 4);
  const json& rows = golden()["rows"];
  const int64_t P = 8, C = 8, T = P + C, B = 2;  // larger than the rows: padding must change nothing
  Tensor ids = Tensor::zeros(DType::I32, {B, T}), mask = Tensor::zeros(DType::I32, {B, T}), pos = Tensor::zeros(DType::I32, {B, T});
  Tensor kept = Tensor::zeros(DType::I32, {B, C});
  int64_t items = 0;
  std::vector<int64_t> lengths;
  for (int64_t b = 0; b < B; ++b) {
    const auto p = rows[b][0].get<std::vector<int32_t>>(), c = rows[b][1].get<std::vector<int32_t>>();
    const int64_t off = P - static_cast<int64_t>(p.size());
    for (size_t t = 0; t < p.size(); ++t) ids.mutable_data_as<int32_t>()[b * T + off + static_cast<int64_t>(t)] = p[t];
    for (size_t t = 0; t < c.size(); ++t) ids.mutable_data_as<int32_t>()[b * T + P + static_cast<int64_t>(t)] = c[t];
    for (int64_t t = off; t < P + static_cast<int64_t>(c.size()); ++t) {
      mask.mutable_data_as<int32_t>()[b * T + t] = 1;
      pos.mutable_data_as<int32_t>()[b * T + t] = static_cast<int32_t>(t - off);
    }
    for (int64_t k = 0; k < C; ++k) kept.mutable_data_as<int32_t>()[b * C + k] = static_cast<int32_t>(b * T + P - 1 + k);
    items += static_cast<int64_t>(c.size());
    lengths.push_back(static_cast<int64_t>(c.size()));
  }
  for (const json& d : golden()["divergence"]) {
    const double beta = d["beta"].get<double>(), temperature = d["temperature"].get<double>();
    const std::string what = fmt::format("beta {} temperature {}", beta, temperature);
    TensorMap tin = teacher.weights();
    tin["input_ids"] = ids, tin["attention_mask"] = mask, tin["position_ids"] = pos, tin["kept_positions"] = kept;
    const Tensor th = tprograms.get(hidden_graph(teacher, B, T, temperature, C)).run(tin).at(0).clone();
    Tensor w = Tensor::zeros(DType::F32, {B, C});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t k = 0; k < lengths[static_cast<size_t>(b)]; ++k) w.mutable_data_as<float>()[b * C + k] = 1.0f / static_cast<float>(items);
    TensorMap in = student.model.weights();
    in["input_ids"] = ids, in["attention_mask"] = mask, in["position_ids"] = pos, in["kept_positions"] = kept;
    in["teacher_hidden"] = th, in["teacher_lm_head"] = teacher.weights().at(teacher.lm_head_name()), in["loss_weights"] = w;
    const graph::Graph g = distillation_graph(student.model, {.batch = B, .tokens = T, .logits_to_keep = C, .teacher = {teacher.config().hidden_size, teacher.dtype()}, .beta = beta, .temperature = temperature});
    const auto out = programs.get(g).run(in);
    expect_near(out[g.output_index("loss")].data_as<float>()[0], d["loss"].get<double>(), 1e-5, what + " loss");
    TensorMap grads;
    for (const auto& [name, i] : g.output_indices())
      if (name.rfind("grad.", 0) == 0) grads[name.substr(5)] = out[i];
    test::expect_gradients(d["grads"], grads, what);
  }
}

// eval_loss: the divergence on the eval rows' own completions, token-weighted: on rows 0 and 1 before any step it is
// PyTorch's first GKD loss (the batch of those two rows).
TEST(Gkd, EvalLossIsTheDivergenceOnTheEvalCompletions) {
  test::GoldenModel student;
  test::TempDir dir;
  const CausalLM teacher = golden_teacher(dir);
  Dataset eval = golden_rows();
  eval.rows.resize(2), eval.where.resize(2);
  GKDConfig c = golden_config(dir.file("eval"), 0.5);
  c.per_device_eval_batch_size = 1;  // the token weighting spans batches
  GKDTrainer trainer(student.model, teacher, test::qwen3_tokenizer(), golden_rows(), c, eval);
  const ojson m = trainer.evaluate_metrics();
  expect_near(m["eval_loss"].get<double>(), golden()["gkd"][0]["steps"][0]["loss"].get<double>(), 1e-5, "eval_loss");
}

TEST(Gkd, AStudentThatIsItsOwnTeacherHasNoDivergence) {
  test::GoldenModel student;
  test::TempDir dir;
  for (double beta : {0.0, 0.5, 1.0}) {
    GKDConfig c = golden_config(dir.file("self" + std::to_string(beta)), beta);
    c.max_steps = 1;
    GKDTrainer trainer(student.model, student.model, test::qwen3_tokenizer(), golden_rows(), c);
    const double loss = trainer.train().log_history.front()["loss"].get<double>();
    EXPECT_TRUE(std::isfinite(loss) && std::fabs(loss) < 1e-6) << "beta " << beta << ": " << loss;
  }
  // PyTorch's own value in f32 (the mixture's logsumexp rounds): also ~0.
  for (const auto& [beta, v] : golden()["self"].items()) EXPECT_LT(std::fabs(v.get<double>()), 1e-6) << beta;
}

// Conversations of the demo data (the completion is the assistant's turn).
Dataset chat_rows(test::TempDir& dir, size_t n) {
  test::write_file(dir.file("chat.jsonl"), std::string(asset("demo/chat.jsonl")));
  Dataset d = load_dataset(dir.file("chat.jsonl"));
  d.rows.resize(n);
  d.where.resize(n);
  return d;
}

TEST(Gkd, CompletionsComeFromTheStudentTheTeacherOrTheDataset) {
  test::TinyModel student(test::kCutVocab);
  test::TempDir dir;
  const CausalLM teacher = golden_teacher(dir, test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  auto run = [&](double lmbda, bool seq_kd, int64_t steps) {
    GKDConfig c = golden_config(dir.file("src" + std::to_string(lmbda) + std::to_string(seq_kd)), 0.5);
    c.lmbda = lmbda, c.seq_kd = seq_kd, c.max_steps = steps, c.max_new_tokens = 6;
    GKDTrainer trainer(student.model, teacher, tok, chat_rows(dir, 8), c);
    return trainer.train();
  };
  const TrainOutput on = run(1.0, false, 2);
  for (const ojson& e : on.log_history) {
    EXPECT_EQ(e["on_policy"].get<double>(), 1.0);
    EXPECT_GE(e["completions/mean_length"].get<double>(), 1.0);
    EXPECT_LE(e["completions/max_length"].get<double>(), 6.0);
    EXPECT_TRUE(std::isfinite(e["loss"].get<double>()) && e["loss"].get<double>() > 0);
  }
  const TrainOutput mixed = run(0.5, false, 12);
  int on_steps = 0;
  for (const ojson& e : mixed.log_history) on_steps += e["on_policy"].get<double>() == 1.0;
  EXPECT_GT(on_steps, 0);
  EXPECT_LT(on_steps, 12);
  const TrainOutput kd = run(0.0, true, 2);  // seq_kd: the teacher writes every completion
  for (const ojson& e : kd.log_history) {
    EXPECT_EQ(e["on_policy"].get<double>(), 0.0);
    EXPECT_TRUE(e.contains("completions/mean_length"));
  }
}

TEST(Distillation, TheStudentGeneratesEveryCompletion) {
  test::TinyModel student(test::kCutVocab);
  test::TempDir dir;
  const CausalLM teacher = golden_teacher(dir, test::kCutVocab);
  Dataset prompts;
  for (const char* w : {"apple", "river", "stone", "cloud"}) {
    prompts.rows.push_back(ojson{{"prompt", ojson::array({ojson{{"role", "user"}, {"content", std::string("Say ") + w}}})}});
    prompts.where.push_back("prompts.jsonl");
  }
  DistillationConfig c;
  c.output_dir = dir.file("distill");
  c.bf16 = false;
  c.per_device_train_batch_size = 2;
  c.gradient_accumulation_steps = 2;
  c.num_generations = 2;
  c.max_completion_length = 5;
  c.max_steps = 2;
  c.logging_steps = 1;
  c.report = false;
  c.progress = false;
  DistillationTrainer trainer(student.model, teacher, test::cut_tokenizer(), prompts, c);
  const TrainOutput out = trainer.train();
  ASSERT_EQ(out.log_history.size(), 2u);
  for (const ojson& e : out.log_history) {
    EXPECT_TRUE(std::isfinite(e["loss"].get<double>()) && e["loss"].get<double>() > 0);
    EXPECT_LE(e["completions/max_length"].get<double>(), 5.0);
    EXPECT_FALSE(e.contains("on_policy"));
  }
  EXPECT_EQ(out.log_history[1]["epoch"].get<double>(), 1.0);  // 4 prompts × 2 generations = 8 rows = 2 steps of 4
}

TEST(Gkd, ErrorsSayWhatAndWhere) {
  test::GoldenModel student;
  test::TempDir dir;
  const Tokenizer& tok = test::qwen3_tokenizer();
  // A teacher of another vocabulary.
  {
    const CausalLM& m = student.model;
    ModelConfig cfg = m.config();
    cfg.vocab_size = 1024;
    TensorMap w = m.weights();
    w["model.embed_tokens.weight"] = m.weights().at("model.embed_tokens.weight").slice_flat(0, {1024, cfg.hidden_size}).clone();
    if (!cfg.tie_word_embeddings) w["lm_head.weight"] = m.weights().at("lm_head.weight").slice_flat(0, {1024, cfg.hidden_size}).clone();
    const CausalLM small = CausalLM::from_weights(cfg, w, "small");
    const std::string e = test::error_of([&] { GKDTrainer(student.model, small, tok, golden_rows(), golden_config(dir.file("v"), 0.5)); });
    EXPECT_NE(e.find("vocabulary (1024 tokens) differs from the student's (151936)"), std::string::npos) << e;
  }
  GKDConfig bad = golden_config(dir.file("b"), 0.5);
  bad.lmbda = 1.5;
  EXPECT_NE(test::error_of([&] { check_gkd_config(bad); }).find("GKDConfig: lmbda must be in [0, 1], got 1.5"), std::string::npos);
  DistillationConfig d;
  d.per_device_train_batch_size = 3, d.num_generations = 2;
  // Without generation_batch_size the rows must split into whole groups (issue 37, defect 11: it said
  // "generation_batch_size must be at least 1, got 0", an option never given).
  EXPECT_NE(test::error_of([&] { check_distillation_config(d); }).find("(3 * 1 = 3) must be a multiple of num_generations (2)"), std::string::npos);
  d.generation_batch_size = 2;
  EXPECT_NE(test::error_of([&] { check_distillation_config(d); }).find("generation_batch_size * num_generations must equal"), std::string::npos);
  Dataset rows;
  rows.rows.push_back(ojson{{"messages", ojson::array({ojson{{"role", "user"}, {"content", "hi"}}})}});
  rows.where.push_back("chat.jsonl:1");
  const std::string e = test::error_of([&] { GKDTrainer(student.model, student.model, tok, rows, golden_config(dir.file("r"), 0.5)); });
  EXPECT_NE(e.find("chat.jsonl:1: \"messages\" must be a conversation of at least two turns"), std::string::npos) << e;
  Dataset tokenized;
  tokenized.rows.push_back(ojson{{"input_ids", {1, 2, 3}}, {"completion_mask", {1, 1, 1}}});
  tokenized.where.push_back("ids.jsonl:1");
  const std::string t = test::error_of([&] { GKDTrainer(student.model, student.model, tok, tokenized, golden_config(dir.file("t"), 0.5)); });
  EXPECT_NE(t.find("ids.jsonl:1: completion_mask must mark a non-empty completion after a non-empty prompt"), std::string::npos) << t;
}

}  // namespace
}  // namespace trl

namespace trl {
namespace {

// Learning: a teacher fine-tuned by SFT on 8 of the demo answers, then a fresh student distilled from it by GKD
// (forward KL, a quarter of the steps on the student's own completions) answers as the teacher does, though it
// never saw an SFT loss.
TEST(Gkd, AStudentDistilledFromATunedTeacherAnswersAsItDoes) {
  if (kSanitized) GTEST_SKIP() << "long: runs in the Release pass";
  const Tokenizer& tok = test::cut_tokenizer();
  test::TempDir dir;
  InitOptions io;
  io.preset = "tiny";
  io.vocab_size = test::kCutVocab;
  init_model(io, dir.file("base"));
  io.seed = 7;
  init_model(io, dir.file("student"));
  const Dataset ds = chat_rows(dir, 8);
  SFTConfig s;
  s.output_dir = dir.file("teacher");
  s.learning_rate = 1e-2;
  s.lr_scheduler_type = "constant_with_warmup";
  s.warmup_steps = 5;
  s.per_device_train_batch_size = 8;
  s.max_steps = 100;
  s.logging_steps = 50;
  s.save_steps = 1000;
  s.progress = false;
  s.report = false;
  SFTTrainer(CausalLM::from_pretrained(dir.file("base")), tok, ds, s).train();
  const CausalLM teacher = CausalLM::from_pretrained(s.output_dir);
  GKDConfig g;
  g.output_dir = dir.file("distilled");
  g.learning_rate = 1e-2;
  g.lr_scheduler_type = "constant_with_warmup";
  g.warmup_steps = 5;
  g.per_device_train_batch_size = 8;
  g.max_steps = 100;
  g.logging_steps = 10;
  g.save_steps = 1000;
  g.progress = false;
  g.report = false;
  g.lmbda = 0.25;
  g.beta = 0;
  g.max_new_tokens = 12;
  const TrainOutput out = GKDTrainer(CausalLM::from_pretrained(dir.file("student")), teacher, tok, ds, g).train();
  const double first = out.log_history.front()["loss"].get<double>(), last = out.log_history.back()["loss"].get<double>();
  EXPECT_LT(last, 0.2 * first);
  const CausalLM student = CausalLM::from_pretrained(g.output_dir);
  Generator tg(teacher), sg(student);
  const auto want = greedy_chat_answers(tg, tok, ds.rows, 10), got = greedy_chat_answers(sg, tok, ds.rows, 10);
  int same = 0, teacher_right = 0;
  for (size_t i = 0; i < want.size(); ++i) same += want[i].answer == got[i].answer, teacher_right += want[i].exact;
  EXPECT_GE(teacher_right, 7);
  EXPECT_GE(same, 7) << same << " of 8 answers equal the teacher's";
  std::printf("[ learning ] gkd: loss %.4f -> %.4f, %d of 8 answers equal the teacher's (teacher exact on %d)\n", first, last, same, teacher_right);
}

}  // namespace
}  // namespace trl

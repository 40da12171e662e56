// The preference and online trainers on a mixture of experts (tiny-moe): router_aux_loss_coef adds the
// load-balancing loss as TRL's DPO, KTO, GRPO and RLOO trainers do. For each: with the coefficient 1 the first
// logged loss is the one of coefficient 0 plus the logged aux_loss (the same weights, data and samples), the step
// moves the router differently (the aux loss's gradient reached it), 0 logs no aux_loss; a dense model under the
// default 0.001 trains without one and without an error ("for other models it does nothing").
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "trl/models/init.h"
#include "trl/train/dpo_trainer.h"
#include "trl/train/grpo_trainer.h"
#include "trl/train/kto_trainer.h"

namespace trl {
namespace {

using ojson = nlohmann::ordered_json;

const char* const kWords[] = {"apple", "river", "stone", "cloud", "green", "tiger", "piano", "light"};

Dataset pairs(int n) {
  Dataset d;
  for (int i = 0; i < n; ++i) {
    const std::string w = kWords[i % 8], other = kWords[(i + 3) % 8];
    d.rows.push_back(ojson{{"prompt", "Repeat the word " + w + ":"}, {"chosen", " " + w}, {"rejected", " " + other}});
    d.where.push_back("pairs.jsonl:" + std::to_string(i + 1));
  }
  return d;
}

Dataset unpaired(int n) {
  Dataset d;
  for (int i = 0; i < n; ++i) {
    const std::string w = kWords[i % 8], other = kWords[(i + 3) % 8];
    d.rows.push_back(ojson{{"prompt", "Repeat the word " + w + ":"}, {"completion", " " + (i % 2 ? other : w)}, {"label", i % 2 == 0}});
    d.where.push_back("rows.jsonl:" + std::to_string(i + 1));
  }
  return d;
}

Dataset prompts(int n) {
  Dataset d;
  for (int i = 0; i < n; ++i) {
    d.rows.push_back(ojson{{"prompt", std::string("Say ") + kWords[i % 8] + "."}});
    d.where.push_back("prompts.jsonl:" + std::to_string(i + 1));
  }
  return d;
}

template <class Config>
Config common(const std::string& out) {
  Config c;
  c.output_dir = out;
  c.bf16 = false;
  c.learning_rate = 1e-3;
  c.logging_steps = 1;
  c.save_steps = 1000;
  c.report = false;
  c.progress = false;
  c.max_steps = 1;
  c.per_device_train_batch_size = 4;
  return c;
}

struct OneStep {
  ojson first;     // the first log entry
  TensorMap master;
};

// One step of a trainer under router_aux_loss_coef `coef`.
using Trainer1 = std::function<OneStep(const CausalLM& model, double coef, const std::string& out)>;

OneStep dpo(const CausalLM& model, double coef, const std::string& out) {
  DPOConfig c = common<DPOConfig>(out);
  c.router_aux_loss_coef = coef;
  DPOTrainer t(model, test::cut_tokenizer(), pairs(4), c);
  const TrainOutput o = t.train();
  return {o.log_history.at(0), t.master_weights()};
}

OneStep kto(const CausalLM& model, double coef, const std::string& out) {
  KTOConfig c = common<KTOConfig>(out);
  c.router_aux_loss_coef = coef;
  KTOTrainer t(model, test::cut_tokenizer(), unpaired(8), c);
  const TrainOutput o = t.train();
  return {o.log_history.at(0), t.master_weights()};
}

template <class Config, class Trainer>
OneStep online(const CausalLM& model, double coef, const std::string& out) {
  Config c = common<Config>(out);
  c.num_generations = 4;
  c.max_completion_length = 6;
  c.pad_to_multiple_of = "32";
  c.router_aux_loss_coef = coef;
  std::vector<NamedRewardFunction> rewards{reward_function("length:4")};
  Trainer t(model, test::cut_tokenizer(), rewards, prompts(2), c);
  const TrainOutput o = t.train();
  return {o.log_history.at(0), t.master_weights()};
}

double number(const ojson& entry, const char* key) {
  const double v = entry.at(key).get<double>();
  EXPECT_TRUE(std::isfinite(v)) << key << ": " << entry.dump();
  return v;
}

// The largest |a − b| over the routers (mlp.gate.weight of every layer); NaN gives NaN.
double router_gap(const TensorMap& a, const TensorMap& b) {
  double worst = 0;
  int routers = 0;
  for (const auto& [name, w] : a) {
    if (name.find("mlp.gate.weight") == std::string::npos) continue;
    ++routers;
    const auto x = w.to_f32_vector(), y = b.at(name).to_f32_vector();
    for (size_t i = 0; i < x.size(); ++i) {
      const double gap = std::fabs(static_cast<double>(x[i]) - y[i]);
      if (!(gap <= worst)) worst = gap;
    }
  }
  EXPECT_GT(routers, 0);
  return worst;
}

// tiny-moe (8 experts, 2 per token) with the cut vocabulary, written into `dir` and loaded.
CausalLM tiny_moe(const test::TempDir& dir) {
  InitOptions io;
  io.preset = "tiny-moe";
  io.vocab_size = test::kCutVocab;
  io.seed = 7;
  init_model(io, dir.file("moe"));
  return CausalLM::from_pretrained(dir.file("moe"));
}

struct TrainerCase {
  const char* name;
  Trainer1 train;
  friend void PrintTo(const TrainerCase& c, std::ostream* os) { *os << c.name; }
};

class MoeTrainers : public ::testing::TestWithParam<TrainerCase> {};

TEST_P(MoeTrainers, AddTheLoadBalancingLossWithRouterAuxLossCoef) {
  const auto& [name, train] = GetParam();
  test::TempDir dir;
  const CausalLM model = tiny_moe(dir);
  const OneStep off = train(model, 0.0, dir.file("off")), on = train(model, 1.0, dir.file("on"));
  EXPECT_FALSE(off.first.contains("aux_loss")) << off.first.dump();
  ASSERT_TRUE(on.first.contains("aux_loss")) << on.first.dump();
  const double aux = number(on.first, "aux_loss");
  // E·Σ f·P of a router near uniform: about K (= 2), above 1 and below E (= 8).
  EXPECT_GT(aux, 1.0);
  EXPECT_LT(aux, 8.0);
  EXPECT_NEAR(number(on.first, "loss") - number(off.first, "loss"), aux, 1e-4 * aux) << name;
  const double gap = router_gap(on.master, off.master);
  EXPECT_GT(gap, 1e-7) << name;  // the aux loss's gradient moved the routers
  EXPECT_TRUE(std::isfinite(gap));

  // A dense model under the default coefficient: no aux loss, no error.
  const test::TinyModel dense(test::kCutVocab);
  const OneStep d = train(dense.model, 0.001, dir.file("dense"));
  EXPECT_FALSE(d.first.contains("aux_loss")) << d.first.dump();
  EXPECT_TRUE(std::isfinite(number(d.first, "loss")));
}

// Evaluation: DPO's and KTO's eval_loss includes the weighted aux loss and eval_aux_loss is logged, as TRL's.
TEST(MoeTrainers, DpoAndKtoEvaluationAddTheAuxLoss) {
  test::TempDir dir;
  const CausalLM model = tiny_moe(dir);
  auto dpo_eval = [&](double coef) {
    DPOConfig c = common<DPOConfig>(dir.file("dpo"));
    c.router_aux_loss_coef = coef;
    return DPOTrainer(model, test::cut_tokenizer(), pairs(4), c, pairs(3)).evaluate_metrics();
  };
  auto kto_eval = [&](double coef) {
    KTOConfig c = common<KTOConfig>(dir.file("kto"));
    c.router_aux_loss_coef = coef;
    return KTOTrainer(model, test::cut_tokenizer(), unpaired(8), c, unpaired(4)).evaluate_metrics();
  };
  for (const auto& [name, eval] : std::vector<std::pair<std::string, std::function<ojson(double)>>>{{"DPO", dpo_eval}, {"KTO", kto_eval}}) {
    const ojson off = eval(0.0), on = eval(1.0);
    EXPECT_FALSE(off.contains("eval_aux_loss")) << name << off.dump();
    ASSERT_TRUE(on.contains("eval_aux_loss")) << name << on.dump();
    const double aux = number(on, "eval_aux_loss");
    EXPECT_GT(aux, 1.0) << name;
    EXPECT_LT(aux, 8.0) << name;
    EXPECT_NEAR(number(on, "eval_loss") - number(off, "eval_loss"), aux, 1e-4 * aux) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Trainers, MoeTrainers,
                         ::testing::Values(TrainerCase{"DPO", dpo}, TrainerCase{"KTO", kto}, TrainerCase{"GRPO", online<GRPOConfig, GRPOTrainer>},
                                           TrainerCase{"RLOO", online<RLOOConfig, RLOOTrainer>}),
                         [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace trl

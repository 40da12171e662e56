// A training step (loss and every gradient) and 5 AdamW steps against PyTorch (tests/reference/qwen3_train_reference.py).
#include <cmath>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "models/causal_lm.h"
#include "models/init.h"
#include "test_util.h"
#include "train/optim/adamw.h"

namespace trl {
namespace {

using json = nlohmann::json;

struct TrainCase {
  TensorMap data;  // input_ids, attention_mask, position_ids, labels, loss_weights
  int64_t B = 0, T = 0;
};

TrainCase make_batch(const json& rows) {
  TrainCase c;
  c.B = static_cast<int64_t>(rows.size());
  for (const auto& r : rows) c.T = std::max<int64_t>(c.T, static_cast<int64_t>(r.size()));
  int64_t n_items = 0;
  for (const auto& r : rows) n_items += static_cast<int64_t>(r.size()) - 1;
  Tensor ids = Tensor::zeros(DType::I32, {c.B, c.T}), mask = Tensor::zeros(DType::I32, {c.B, c.T}), labels = Tensor::zeros(DType::I32, {c.B, c.T});
  Tensor weights = Tensor::zeros(DType::F32, {c.B, c.T});
  for (int64_t b = 0; b < c.B; ++b) {
    const auto& r = rows[static_cast<size_t>(b)];
    for (size_t t = 0; t < r.size(); ++t) {
      ids.mutable_data_as<int32_t>()[b * c.T + static_cast<int64_t>(t)] = r[t].get<int32_t>();
      mask.mutable_data_as<int32_t>()[b * c.T + static_cast<int64_t>(t)] = 1;
      if (t + 1 < r.size()) {
        labels.mutable_data_as<int32_t>()[b * c.T + static_cast<int64_t>(t)] = r[t + 1].get<int32_t>();
        weights.mutable_data_as<float>()[b * c.T + static_cast<int64_t>(t)] = -1.0f / static_cast<float>(n_items);
      }
    }
  }
  c.data = {{"input_ids", ids}, {"attention_mask", mask}, {"position_ids", default_position_ids(mask)}, {"labels", labels},
            {"loss_weights", weights}};
  return c;
}

class TrainGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(TrainGolden, LossAndGradientsMatchPyTorch) {
  const std::string preset = GetParam();
  const json golden = json::parse(read_text_file(std::string(TRL_TEST_DATA_DIR) + "/goldens/qwen3_" + preset + "_train.json"));
  test::TempDir dir;
  InitOptions o;
  o.preset = preset;
  o.seed = 1234;
  o.initializer_range = 0.1;
  o.randomize_norms = true;
  const CausalLM model = init_model(o, dir.path());
  const TrainCase batch = make_batch(golden["rows"]);
  auto program = make_reference_backend()->compile(model.training_graph(batch.B, batch.T));
  TensorMap params;
  for (const auto& [name, t] : model.weights()) params[name] = t.to(DType::F32);  // owned f32 master weights
  auto run = [&] {
    TensorMap in = batch.data;
    for (const auto& [name, t] : params) in[name] = t;
    return program->run(in);
  };
  const auto shapes = parameter_shapes(model.config());
  auto out = run();
  const double loss = load_element(out[0].data(), out[0].dtype(), 0);
  EXPECT_NEAR(loss, golden["loss"].get<double>(), 1e-5 * std::fabs(golden["loss"].get<double>()));
  double worst = 0;
  for (size_t k = 0; k < shapes.size(); ++k) {
    const std::string& name = shapes[k].first;
    const json& g = golden["grads"][name];
    const Tensor& ours = out[k + 1];
    ASSERT_EQ(ours.shape(), shapes[k].second) << name;
    double sumsq = 0;
    for (int64_t i = 0; i < ours.numel(); ++i) sumsq += std::pow(load_element(ours.data(), ours.dtype(), i), 2);
    const double norm = std::sqrt(g["sumsq"].get<double>());
    EXPECT_NEAR(std::sqrt(sumsq), norm, 1e-4 * norm + 1e-9) << name << " gradient norm";
    for (const auto& s : g["samples"]) {
      const double want = s[1].get<double>();
      const double got = load_element(ours.data(), ours.dtype(), s[0].get<int64_t>());
      const double err = std::fabs(got - want) / std::max(norm / std::sqrt(static_cast<double>(ours.numel())), std::fabs(want));
      worst = std::max(worst, err);
      EXPECT_LE(err, 1e-3) << name << "[" << s[0] << "]: " << got << " vs " << want;
    }
  }
  std::printf("[ train golden ] %s: loss %.6f (torch %.6f), %zu gradients, worst sample error %.2g\n", preset.c_str(), loss,
              golden["loss"].get<double>(), shapes.size(), worst);

  if (preset != "tiny") return;  // 5 optimizer steps on the tiny model (the small one costs minutes on the oracle)
  const json& adam = golden["adamw"];
  AdamW opt(AdamWConfig{adam["betas"][0].get<double>(), adam["betas"][1].get<double>(), adam["eps"].get<double>(), adam["weight_decay"].get<double>()});
  for (int step = 0; step < 5; ++step) {
    if (step > 0) out = run();
    const double l = load_element(out[0].data(), out[0].dtype(), 0);
    EXPECT_NEAR(l, adam["losses"][static_cast<size_t>(step)].get<double>(), 1e-4 * std::fabs(l)) << "step " << step;
    TensorMap grads;
    for (size_t k = 0; k < shapes.size(); ++k) grads[shapes[k].first] = out[k + 1];
    opt.step(params, grads, adam["lr"].get<double>());
  }
  out = run();
  EXPECT_NEAR(load_element(out[0].data(), out[0].dtype(), 0), adam["final_loss"].get<double>(), 1e-4 * adam["final_loss"].get<double>());
  for (auto it = adam["params_after"].begin(); it != adam["params_after"].end(); ++it) {
    for (const auto& s : it.value()) {
      EXPECT_NEAR(params.at(it.key()).data_as<float>()[s[0].get<int64_t>()], s[1].get<double>(), 2e-5) << it.key();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Qwen3, TrainGolden, ::testing::Values("tiny", "small"));

TEST(AdamW, WeightDecayGroupsLikeTransformers) {
  EXPECT_FALSE(applies_weight_decay("model.layers.0.input_layernorm.weight"));
  EXPECT_FALSE(applies_weight_decay("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_FALSE(applies_weight_decay("model.norm.weight"));
  EXPECT_FALSE(applies_weight_decay("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_TRUE(applies_weight_decay("model.embed_tokens.weight"));
  EXPECT_TRUE(applies_weight_decay("model.layers.0.mlp.down_proj.weight"));
  EXPECT_TRUE(applies_weight_decay("lm_head.weight"));
  EXPECT_TRUE(applies_weight_decay("model.normalizer.weight"));  // "norm" must be a whole name part
}

}  // namespace
}  // namespace trl

// A training step (loss and every gradient) and 5 AdamW steps against PyTorch (tests/reference/qwen3_train_reference.py).
#include <cmath>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "trl/backend/cpu/cpu_backend.h"
#include "trl/backend/registry.h"
#include "core/fs.h"
#include "trl/models/causal_lm.h"
#include "trl/models/init.h"
#include "trl/train/objectives.h"
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
  auto program = make_reference_backend()->compile(training_graph(model, batch.B, batch.T));
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
      worst = test::nan_max(worst, err);
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
    opt.step(params, grads, adam["lr"].get<double>(), *make_reference_backend());
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

// AdamW's pass on each host backend (the CPU's kernel is vectorised with non-temporal stores where the CPU has AVX-512
// or AVX2: Backend::adamw_kernel(); the reference runs the portable loop) against the formula written out here for
// each element, over two steps (fresh moments, then stored ones), a length with a tail of 16-lane groups, the bf16
// compute copy, and a NaN and an infinite gradient (the weight turns NaN; its bf16 copy is a quiet NaN).
TEST(AdamW, UpdateMatchesTheFormulaForEachElement) {
  for (const char* name : {"cpu", "reference"}) {
    SCOPED_TRACE(name);
    auto backend = make_backend(name);
    const int64_t n = 4099;
    std::vector<float> w0(static_cast<size_t>(n)), g(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) w0[i] = std::sin(0.37f * static_cast<float>(i)), g[i] = 0.01f * std::cos(1.3f * static_cast<float>(i));
    g[5] = NAN, g[4000] = INFINITY;
    TensorMap params{{"w", Tensor::from_f32(w0, {n})}}, grads{{"w", Tensor::from_f32(g, {n})}};
    TensorMap compute{{"w", Tensor::zeros(DType::BF16, {n})}};
    AdamWConfig cfg{0.9, 0.999, 1e-8, 0.01};
    AdamW opt(cfg);
    std::vector<float> m(static_cast<size_t>(n), 0.0f), v(static_cast<size_t>(n), 0.0f), w = w0;
    const double lr = 1e-3;
    for (int step = 1; step <= 2; ++step) {
      opt.step(params, grads, lr, *backend, &compute);
      const double bc1 = 1.0 - std::pow(0.9, step), bc2 = 1.0 - std::pow(0.999, step);
      const float keep = static_cast<float>(1.0 - lr * 0.01), step_size = static_cast<float>(lr / bc1), isb = static_cast<float>(1.0 / std::sqrt(bc2));
      const float* got = params.at("w").data_as<float>();
      const uint16_t* got16 = compute.at("w").data_as<uint16_t>();
      for (int64_t i = 0; i < n; ++i) {
        m[i] = m[i] + (1.0f - 0.9f) * (g[i] - m[i]);
        v[i] = 0.999f * v[i] + (1.0f - 0.999f) * g[i] * g[i];
        w[i] = w[i] * keep - step_size * m[i] / (std::sqrt(v[i]) * isb + 1e-8f);
        if (std::isnan(w[i])) {
          ASSERT_TRUE(std::isnan(got[i])) << "step " << step << " element " << i;
          ASSERT_EQ(got16[i] & 0x7fc0u, 0x7fc0u) << "a quiet NaN in the bf16 copy, element " << i;
          continue;
        }
        ASSERT_TRUE(std::isfinite(got[i])) << "step " << step << " element " << i;
        ASSERT_NEAR(got[i], w[i], 1e-6f * std::max(1.0f, std::fabs(w[i]))) << "step " << step << " element " << i;
        ASSERT_EQ(got16[i], f32_to_bf16(got[i])) << "the bf16 copy, element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace trl

namespace trl {
namespace {

// bf16 training (a bf16 model's forward and backward on the CPU backend) against PyTorch training the same bf16
// model (bf16 activations, bf16 gradients). The two round at different points in the backward pass, so the
// comparison is statistical: the loss to 0.2%, each gradient's norm to 3% and its direction (the cosine of the
// sampled elements) above 0.99 — far tighter than the gap to the f32 gradients would allow to be missed by a bug,
// which moves a tensor's gradient entirely.
class TrainGoldenBf16 : public ::testing::TestWithParam<const char*> {};

TEST_P(TrainGoldenBf16, LossAndGradientsMatchPyTorchBf16) {
  const std::string preset = GetParam();
  const json golden = json::parse(read_text_file(std::string(TRL_TEST_DATA_DIR) + "/goldens/qwen3_" + preset + "_train_bf16.json"));
  test::TempDir dir;
  InitOptions o;
  o.preset = preset;
  o.dtype = DType::BF16;
  o.seed = 1234;
  o.initializer_range = 0.1;
  o.randomize_norms = true;
  const CausalLM model = init_model(o, dir.path());
  const TrainCase batch = make_batch(golden["rows"]);
  TensorMap in = model.weights();
  for (const auto& [k, v] : batch.data) in[k] = v;
  const auto out = make_cpu_backend()->compile(training_graph(model, batch.B, batch.T))->run(in);
  const double loss = out[0].data_as<float>()[0], want_loss = golden["loss"].get<double>();
  EXPECT_NEAR(loss, want_loss, 2e-3 * std::fabs(want_loss));
  const auto shapes = parameter_shapes(model.config());
  double worst_norm = 0, worst_cos = 1;
  for (size_t k = 0; k < shapes.size(); ++k) {
    const auto& g = golden["grads"][shapes[k].first];
    const Tensor& ours = out[k + 1];
    double sumsq = 0;
    for (float x : ours.to_f32_vector()) sumsq += static_cast<double>(x) * x;
    const double norm = std::sqrt(g["sumsq"].get<double>());
    const double rel = std::fabs(std::sqrt(sumsq) - norm) / norm;
    double dot = 0, aa = 0, bb = 0;
    for (const auto& smp : g["samples"]) {
      const double want = smp[1].get<double>(), got = load_element(ours.data(), ours.dtype(), smp[0].get<int64_t>());
      dot += want * got, aa += want * want, bb += got * got;
    }
    const double cos = aa == 0 && bb == 0 ? 1.0 : dot / std::sqrt(aa * bb + 1e-300);
    worst_norm = test::nan_max(worst_norm, rel), worst_cos = test::nan_min(worst_cos, cos);
    EXPECT_LE(rel, 3e-2) << shapes[k].first;
    EXPECT_GE(cos, 0.99) << shapes[k].first;
  }
  std::printf("[ train golden bf16 ] %s: loss %.6f (torch %.6f), worst gradient norm error %.2g, worst cosine %.6f\n", preset.c_str(), loss,
              want_loss, worst_norm, worst_cos);
}

INSTANTIATE_TEST_SUITE_P(Qwen3, TrainGoldenBf16, ::testing::Values("tiny", "small"));

}  // namespace
}  // namespace trl

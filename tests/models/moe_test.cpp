// Qwen3-MoE against Transformers itself (tests/reference/qwen3_moe_reference.py): two tiny mixture-of-experts models
// made and saved by Transformers 5 (tests/data/moe: one as the Hub keeps checkpoints, one tensor per expert; one in
// v5's stacked layout, with a dense first layer), their logits on a padded batch, the load-balancing loss, every
// parameter's gradient of loss + router_aux_loss_coef·aux, and greedy generation. Then saving (one tensor per
// expert again), loading errors, and an expert that no token chose.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "trl/core/error.h"
#include "graph/autodiff.h"
#include "trl/backend/cpu/cpu_backend.h"
#include "trl/backend/registry.h"
#include "trl/generation/generate.h"
#include "trl/io/safetensors.h"
#include "trl/models/causal_lm.h"
#include "models/moe_golden.h"
#include "test_util.h"

namespace trl {
namespace {

using json = nlohmann::json;
using graph::kNone;
using graph::ValueId;

const json& goldens() {
  static const json g = json::parse(read_text_file(std::string(TRL_TEST_DATA_DIR) + "/goldens/qwen3_moe.json"));
  return g;
}
std::string model_dir(const std::string& name) { return std::string(TRL_TEST_DATA_DIR) + "/moe/" + name; }

class MoeGolden : public ::testing::TestWithParam<const char*> {};

// Logits of every real position, on the CPU backend and on the reference backend: within 1e-4 of Transformers' f32
// (relative to max(1, |logit|); only the f32 summation order differs).
TEST_P(MoeGolden, LogitsMatchTransformers) {
  const json& g = goldens()["models"][GetParam()];
  const CausalLM model = CausalLM::from_pretrained(model_dir(GetParam()));
  ASSERT_TRUE(model.unused_weights().empty()) << "every tensor Transformers saved has a place";
  const PaddedBatch p = golden_batch(g["rows"]);
  for (const std::string backend_name : {"cpu", "reference"}) {
    auto backend = make_backend(backend_name);
    const Tensor logits = model.forward(Batch{p.ids, p.mask, p.positions}, *backend);
    const int64_t V = logits.size(2);
    double worst = 0;
    for (int64_t b = 0; b < p.B; ++b)
      for (size_t t = 0; t < g["logits"][static_cast<size_t>(b)].size(); ++t)
        for (int64_t v = 0; v < V; ++v) {
          const double want = g["logits"][static_cast<size_t>(b)][t][static_cast<size_t>(v)].get<double>();
          const double got = logits.data_as<float>()[(b * p.T + static_cast<int64_t>(t)) * V + v];
          ASSERT_TRUE(std::isfinite(got)) << backend_name;
          worst = std::max(worst, std::fabs(got - want) / std::max(1.0, std::fabs(want)));
        }
    EXPECT_LE(worst, 1e-4) << GetParam() << " on " << backend_name;
  }
}

// loss = mean cross-entropy + router_aux_loss_coef·aux (Transformers' Qwen3MoeForCausalLM with labels and
// output_router_logits), the aux loss itself, and the gradient of every parameter: its sum, sum of squares and 30
// sampled elements, against autograd.
TEST_P(MoeGolden, LossAuxLossAndGradientsMatchTransformers) {
  const json& g = goldens()["models"][GetParam()];
  const CausalLM model = CausalLM::from_pretrained(model_dir(GetParam()));
  const PaddedBatch p = golden_batch(g["rows"]);
  graph::Builder b;
  ValueId head = kNone, aux = kNone;
  const ValueId h = model.build_training_hidden(b, p.B, p.T, &head, false, &aux);
  ASSERT_NE(aux, kNone);
  const ValueId logp = b.token_logprobs(h, head, b.input("labels", {p.B, p.T}, DType::I32));
  const ValueId ce = b.weighted_sum(logp, b.input("weights", {p.B, p.T}, DType::F32));
  const double coef = model.config().moe.router_aux_loss_coef;
  const ValueId loss = b.add(ce, b.scale_by(aux, b.fill({}, DType::F32, coef), DType::F32));
  std::vector<std::string> params;
  for (const auto& [name, t] : model.weights()) params.push_back(name);
  const auto grads = graph::add_backward(b, loss, params, DType::F32);
  b.output(loss, "loss");
  b.output(aux, "aux");
  for (const std::string& n : params) b.output(grads.at(n), n);
  const graph::Graph graph = b.finish();
  TensorMap in = model.weights();
  in["input_ids"] = p.ids;
  in["attention_mask"] = p.mask;
  in["position_ids"] = p.positions;
  in["labels"] = p.labels;
  in["weights"] = p.weights;
  for (const std::string backend_name : {"cpu", "reference"}) {
    const std::vector<Tensor> out = make_backend(backend_name)->compile(graph)->run(in);
    const std::string at = fmt::format("{} on {}", GetParam(), backend_name);
    EXPECT_NEAR(out[0].data_as<float>()[0], g["loss"].get<double>(), 1e-5 * std::fabs(g["loss"].get<double>())) << at;
    EXPECT_NEAR(out[1].data_as<float>()[0], g["aux_loss"].get<double>(), 1e-5 * std::fabs(g["aux_loss"].get<double>())) << at;
    ASSERT_EQ(g["grads"].size(), params.size()) << at << ": Transformers' parameters and ours";
    for (size_t k = 0; k < params.size(); ++k) {
      const std::string& name = params[k];
      ASSERT_TRUE(g["grads"].contains(name)) << name;
      const json& want = g["grads"][name];
      const Tensor& got = out[2 + k];
      ASSERT_EQ(got.shape(), Shape(want["shape"].get<std::vector<int64_t>>())) << at << " " << name;
      double sum = 0, sumsq = 0;
      for (int64_t i = 0; i < got.numel(); ++i) {
        const double v = got.data_as<float>()[i];
        ASSERT_TRUE(std::isfinite(v)) << at << " " << name;
        sum += v, sumsq += v * v;
      }
      // Errors measured against the gradient's own size (its root mean square times 10: f32 sums in another order).
      const double scale = 10 * std::sqrt(want["sumsq"].get<double>() / static_cast<double>(got.numel())) + 1e-12;
      EXPECT_NEAR(sumsq, want["sumsq"].get<double>(), 1e-4 * want["sumsq"].get<double>() + 1e-12) << at << " " << name;
      EXPECT_NEAR(sum, want["sum"].get<double>(), 1e-4 * scale * static_cast<double>(got.numel())) << at << " " << name;
      for (const auto& s : want["samples"]) {
        const int64_t i = s[0].get<int64_t>();
        EXPECT_NEAR(got.data_as<float>()[i], s[1].get<double>(), 1e-4 * scale) << at << " " << name << "[" << i << "]";
      }
    }
  }
}

// Greedy continuations of the golden prompts (a batch of two, no padding) equal Transformers' generate().
TEST_P(MoeGolden, GreedyGenerationMatchesTransformers) {
  const json& g = goldens()["models"][GetParam()];
  const CausalLM model = CausalLM::from_pretrained(model_dir(GetParam()));
  Generator gen(model);
  GenerationConfig c;
  c.max_new_tokens = 8;
  c.do_sample = false;
  c.eos_token_id = std::vector<int32_t>{};
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& r : g["prompt"]) prompts.push_back(r.get<std::vector<int32_t>>());
  const auto out = gen.generate(prompts, c);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(out.generated[i], g["generated"][i].get<std::vector<int32_t>>()) << GetParam() << " row " << i;
}

INSTANTIATE_TEST_SUITE_P(Qwen3Moe, MoeGolden, ::testing::Values("topk_norm", "dense_first"));

// A model saved by trl has the Hub's layout (one tensor per expert, as Transformers' save_pretrained writes by
// default), whichever layout it was loaded from, and loads back to the same weights.
TEST(Qwen3Moe, SavesOneTensorPerExpertAndReloads) {
  for (const char* name : {"topk_norm", "dense_first"}) {
    const CausalLM model = CausalLM::from_pretrained(model_dir(name));
    test::TempDir dir;
    model.save_pretrained(dir.path());
    const Checkpoint ck = Checkpoint::open(dir.path());
    std::set<std::string> names;
    for (const std::string& n : ck.names()) names.insert(n);
    EXPECT_TRUE(names.count("model.layers.1.mlp.experts.7.up_proj.weight")) << name;
    EXPECT_TRUE(names.count("model.layers.1.mlp.gate.weight")) << name;
    for (const std::string& n : names) EXPECT_FALSE(n.ends_with("experts.gate_up_proj") || n.ends_with("experts.down_proj")) << name << ": " << n;
    if (std::string(name) == "topk_norm") {  // saved as Transformers saved it: the same names
      std::set<std::string> original;
      for (const std::string& n : Checkpoint::open(model_dir(name)).names()) original.insert(n);
      EXPECT_EQ(names, original);
    }
    const CausalLM again = CausalLM::from_pretrained(dir.path());
    ASSERT_EQ(again.weights().size(), model.weights().size());
    for (const auto& [n, t] : model.weights()) {
      const Tensor& u = again.weights().at(n);
      ASSERT_EQ(u.shape(), t.shape()) << n;
      EXPECT_EQ(std::memcmp(u.data(), t.data(), t.nbytes()), 0) << name << ": " << n << " changed through save and load";
    }
    EXPECT_EQ(again.config().moe.num_experts, 8);
    EXPECT_EQ(again.config().moe.mlp_only_layers, model.config().moe.mlp_only_layers);
    EXPECT_EQ(again.config().moe.norm_topk_prob, model.config().moe.norm_topk_prob);
  }
}

// A checkpoint without one expert's tensor: an error naming that tensor, not a crash or a half-loaded model.
TEST(Qwen3Moe, AMissingExpertTensorIsNamed) {
  const Checkpoint ck = Checkpoint::open(model_dir("topk_norm"));
  TensorMap kept;
  for (const std::string& n : ck.names())
    if (n != "model.layers.0.mlp.experts.5.up_proj.weight") kept.emplace(n, ck.get(n));
  test::TempDir dir;
  save_checkpoint(dir.path(), kept);
  std::filesystem::copy_file(model_dir("topk_norm") + "/config.json", dir.path() + "/config.json");
  try {
    (void)CausalLM::from_pretrained(dir.path());
    FAIL() << "loaded a checkpoint without an expert's up_proj";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.experts.5.up_proj.weight"), std::string::npos) << e.what();
  }
}

// An expert index outside [0, E) given to the router ops (a graph built by hand: moe_topk never makes one) is an
// error that names it, on every backend, not a crash inside a parallel loop.
TEST(Qwen3Moe, AnExpertIndexOutOfRangeIsAnError) {
  for (const std::string backend_name : {"cpu", "reference"}) {
    graph::Builder b;
    const ValueId logits = b.input("logits", {3, 4}, DType::F32), experts = b.input("experts", {3, 2}, DType::I32);
    b.output(b.moe_route_weights(logits, experts, true));
    b.output(b.moe_router_stats(logits, experts, kNone));
    TensorMap in;
    in["logits"] = Tensor::from_f32(std::vector<float>(12, 0.5f), {3, 4});
    in["experts"] = Tensor::from_i32(std::vector<int32_t>{0, 1, 2, 3, 4, 0}, {3, 2});
    const std::string err = test::error_of([&] { (void)make_backend(backend_name)->compile(b.finish())->run(in); });
    EXPECT_NE(err.find("expert 4"), std::string::npos) << backend_name << ": " << err;
  }
}

// Experts that no token chose get a zero gradient (not what the memory held before): 8 experts, tokens routed to 4.
TEST(Qwen3Moe, ExpertsWithoutTokensGetZeroGradients) {
  graph::Builder b;
  const int64_t N = 24, C = 16, F = 8, E = 8, K = 2;
  std::vector<int32_t> experts(static_cast<size_t>(N * K));
  for (size_t i = 0; i < experts.size(); ++i) experts[i] = static_cast<int32_t>((i * 3 + i / 2) % 4);
  TensorMap in;
  auto rand = [&](const std::string& name, const Shape& s) {
    Tensor t = Tensor::zeros(DType::F32, s);
    for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data_as<float>()[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + name.size()));
    in[name] = t;
    return b.input(name, s, DType::F32);
  };
  const ValueId ex = b.input("experts", {N, K}, DType::I32);
  in["experts"] = Tensor::from_i32(experts, {N, K});
  const auto d = b.moe_experts_backward(rand("x", {N, C}), ex, rand("w", {N, K}), rand("gate_up", {E, 2 * F, C}), rand("down", {E, C, F}), rand("dy", {N, C}));
  b.output(d[2]);
  b.output(d[3]);
  auto program = make_backend("cpu")->compile(b.finish());
  for (int run = 0; run < 2; ++run) {  // the second run finds the first run's values in its memory
    const std::vector<Tensor> out = program->run(in);
    for (int64_t e = 0; e < E; ++e) {
      double gu = 0, dn = 0;
      for (int64_t i = 0; i < 2 * F * C; ++i) gu += std::fabs(out[0].data_as<float>()[e * 2 * F * C + i]);
      for (int64_t i = 0; i < C * F; ++i) dn += std::fabs(out[1].data_as<float>()[e * C * F + i]);
      if (e < 4) {
        EXPECT_GT(gu, 0) << "expert " << e;
        EXPECT_GT(dn, 0) << "expert " << e;
      } else {
        EXPECT_EQ(gu, 0) << "expert " << e << " had no token";
        EXPECT_EQ(dn, 0) << "expert " << e << " had no token";
      }
    }
  }
}

}  // namespace
}  // namespace trl

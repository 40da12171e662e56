// Every op of the CPU backend against the reference backend on random inputs, odd sizes included, with guard
// regions after every buffer (TRL_CHECK_GUARDS=1); then whole models: logits and training gradients.
#include <cmath>
#include <cstdlib>
#include <functional>
#include <numeric>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "trl/backend/cpu/cpu_backend.h"
#include "core/fs.h"
#include "core/rng.h"
#include "graph/autodiff.h"
#include "trl/models/causal_lm.h"
#include "trl/models/init.h"
#include "trl/train/objectives.h"
#include "test_util.h"

namespace trl {
namespace {

using graph::Builder;
using graph::kNone;
using graph::ValueId;

struct Spec {
  std::string name;
  Shape shape;
  DType dtype = DType::F32;
  int32_t int_range = 0;
};

// Runs op(inputs) (and, with `grad`, its backward through autodiff) on both backends and compares every output:
// max |cpu - ref| <= tol · max(1, max |ref|).
void compare(const std::vector<Spec>& specs, const std::function<ValueId(Builder&, const std::vector<ValueId>&)>& op, double tol,
             bool grad = true, uint64_t seed = 7) {
  ::setenv("TRL_CHECK_GUARDS", "1", 1);
  Builder b;
  std::vector<ValueId> ids;
  for (const Spec& s : specs) ids.push_back(b.input(s.name, s.shape, s.dtype));
  const ValueId out = op(b, ids);
  const Shape out_shape = b.shape(out);
  b.output(out);
  if (grad) {
    const ValueId r = b.input("r", out_shape, DType::F32);
    const ValueId loss = b.weighted_sum(b.cast(out, DType::F32), r);
    std::vector<std::string> wrt;
    for (const Spec& s : specs)
      if (s.dtype != DType::I32) wrt.push_back(s.name);
    const auto grads = graph::add_backward(b, loss, wrt);
    for (const auto& w : wrt) b.output(grads.at(w));
  }
  const graph::Graph g = b.finish();
  SplitMix64 rng(seed);
  TensorMap in;
  for (const Spec& s : specs) {
    Tensor t = Tensor::zeros(s.dtype, s.shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (s.dtype == DType::I32) t.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(s.int_range));
      else store_element(t.mutable_data(), s.dtype, i, rng.normal());
    }
    in[s.name] = t;
  }
  if (in.count("mask")) {
    Tensor& m = in["mask"];
    // Segment ids in runs (packing), with some padding (0).
    for (int64_t i = 0; i < m.numel(); ++i) m.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(1 + (i % m.size(-1)) * 2 / m.size(-1)) * (rng.next() % 5 != 0);
  }
  if (grad) {
    Tensor r = Tensor::zeros(DType::F32, out_shape);
    for (int64_t i = 0; i < r.numel(); ++i) r.mutable_data_as<float>()[i] = static_cast<float>(rng.normal());
    in["r"] = r;
  }
  const auto want = make_reference_backend()->compile(g)->run(in);
  const auto got = make_cpu_backend()->compile(g)->run(in);
  ASSERT_EQ(want.size(), got.size());
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ(want[k].shape(), got[k].shape()) << "output " << k;
    const auto a = want[k].to_f32_vector(), c = got[k].to_f32_vector();
    double scale = 1, worst = 0;
    for (float x : a) scale = std::max(scale, static_cast<double>(std::fabs(x)));
    for (size_t i = 0; i < a.size(); ++i) worst = test::nan_max(worst, std::fabs(static_cast<double>(a[i]) - c[i]));
    EXPECT_LE(worst / scale, tol) << "output " << k << " (shape " << shape_str(want[k].shape()) << ")";
  }
}

class CpuOps : public ::testing::TestWithParam<int64_t> {};

TEST_P(CpuOps, MatMulEmbeddingNorm) {
  const int64_t n = GetParam();
  compare({{"x", {2, n, 9}}, {"w", {n + 2, 9}}, {"b", {n + 2}}}, [](Builder& b, const std::vector<ValueId>& v) { return b.matmul(v[0], v[1], v[2], DType::F32); }, 1e-5);
  compare({{"ids", {2, n}, DType::I32, 11}, {"t", {11, n}}}, [](Builder& b, const std::vector<ValueId>& v) { return b.embedding(v[0], v[1], DType::F32); }, 1e-6);
  compare({{"x", {n, 13}}, {"w", {13}}}, [](Builder& b, const std::vector<ValueId>& v) { return b.rms_norm(v[0], v[1], 1e-6); }, 1e-5);
}

TEST_P(CpuOps, RopeAttentionSwiGLU) {
  const int64_t n = GetParam();
  compare({{"x", {2, n, 3, 8}}, {"pos", {2, n}, DType::I32, 100}},
          [](Builder& b, const std::vector<ValueId>& v) { return b.rope(v[0], v[1], {1.0f, 0.1f, 0.01f, 0.001f}, 1.0f); }, 1e-5);
  compare({{"q", {2, n, 4, 8}}, {"k", {2, n + 3, 2, 8}}, {"v", {2, n + 3, 2, 8}}, {"mask", {2, n + 3}, DType::I32, 2}},
          [](Builder& b, const std::vector<ValueId>& v) { return b.attention(v[0], v[1], v[2], v[3], 0.35, true); }, 1e-5);
  compare({{"g", {n, 5}}, {"u", {n, 5}}}, [](Builder& b, const std::vector<ValueId>& v) { return b.swiglu(v[0], v[1]); }, 1e-5);
}

TEST_P(CpuOps, TokenLogprobsOverManyChunks) {
  const int64_t n = GetParam();
  // A vocabulary of 9001: two full 4096-column chunks and a tail.
  compare({{"h", {n, 16}}, {"w", {9001, 16}}, {"t", {n}, DType::I32, 9001}},
          [](Builder& b, const std::vector<ValueId>& v) { return b.token_logprobs(v[0], v[1], v[2]); }, 1e-4);
  compare({{"h", {n, 16}}, {"w", {9001, 16}}}, [](Builder& b, const std::vector<ValueId>& v) { return b.entropy(v[0], v[1]); }, 1e-4);
  // bf16: the forward keeps the (bf16) logits for the backward, which reads them instead of recomputing them.
  compare({{"h", {n, 16}, DType::BF16}, {"w", {9001, 16}, DType::BF16}, {"t", {n}, DType::I32, 9001}},
          [](Builder& b, const std::vector<ValueId>& v) { return b.token_logprobs(v[0], v[1], v[2]); }, 2e-2);
  compare({{"h", {n, 16}, DType::BF16}, {"w", {9001, 16}, DType::BF16}}, [](Builder& b, const std::vector<ValueId>& v) { return b.entropy(v[0], v[1]); },
          2e-2);
}

// token_logprobs, entropy and token_argmax_match on the same (h, w, targets) share one pass over the vocabulary on
// the CPU (whichever comes first computes it): all three, and the loss's gradient that reuses the pass, must match
// the reference, with targets that are the argmax for every other row and in either node order.
TEST_P(CpuOps, LossMetricsShareOnePass) {
  const int64_t n = GetParam(), V = 9001, C = 16;
  SplitMix64 rng(11);
  Tensor h = Tensor::zeros(DType::F32, {n, C}), w = Tensor::zeros(DType::F32, {V, C}), t = Tensor::zeros(DType::I32, {n});
  Tensor r = Tensor::zeros(DType::F32, {n});
  for (int64_t i = 0; i < h.numel(); ++i) h.mutable_data_as<float>()[i] = static_cast<float>(rng.normal());
  for (int64_t i = 0; i < w.numel(); ++i) w.mutable_data_as<float>()[i] = static_cast<float>(rng.normal());
  int64_t argmax_rows = 0;
  for (int64_t i = 0; i < n; ++i) {
    int32_t best = 0;
    double best_z = -1e300;
    for (int32_t v = 0; v < V; ++v) {
      double z = 0;
      for (int64_t c = 0; c < C; ++c) z += static_cast<double>(h.data_as<float>()[i * C + c]) * w.data_as<float>()[v * C + c];
      if (z > best_z) best_z = z, best = v;
    }
    t.mutable_data_as<int32_t>()[i] = i % 2 == 0 ? best : static_cast<int32_t>(rng.next() % V);
    argmax_rows += i % 2 == 0;
    r.mutable_data_as<float>()[i] = static_cast<float>(rng.normal());
  }
  const TensorMap in{{"h", h}, {"w", w}, {"t", t}, {"r", r}};
  for (bool entropy_first : {false, true}) {
    Builder b;
    const ValueId hv = b.input("h", {n, C}, DType::F32), wv = b.input("w", {V, C}, DType::F32), tv = b.input("t", {n}, DType::I32);
    ValueId ent = kNone, logp = kNone;
    if (entropy_first) ent = b.entropy(hv, wv);
    const ValueId match = b.token_argmax_match(hv, wv, tv);
    logp = b.token_logprobs(hv, wv, tv);
    if (!entropy_first) ent = b.entropy(hv, wv);
    const ValueId loss = b.weighted_sum(logp, b.input("r", {n}, DType::F32));
    const auto grads = graph::add_backward(b, loss, {"h", "w"});
    for (ValueId o : {logp, ent, match, grads.at("h"), grads.at("w")}) b.output(o);
    const graph::Graph g = b.finish();
    const auto want = make_reference_backend()->compile(g)->run(in);
    const auto got = make_cpu_backend()->compile(g)->run(in);
    for (size_t k = 0; k < want.size(); ++k) {
      const auto a = want[k].to_f32_vector(), c = got[k].to_f32_vector();
      double scale = 1, worst = 0;
      for (size_t i = 0; i < a.size(); ++i) scale = std::max(scale, static_cast<double>(std::fabs(a[i]))), worst = test::nan_max(worst, std::fabs(static_cast<double>(a[i]) - c[i]));
      EXPECT_LE(worst, 1e-4 * scale) << "output " << k << " entropy_first " << entropy_first;
    }
    const auto m = got[2].to_f32_vector();
    EXPECT_EQ(std::accumulate(m.begin(), m.end(), 0.0), static_cast<double>(argmax_rows));  // random targets all miss
  }
}

TEST_P(CpuOps, Bf16Inputs) {
  const int64_t n = GetParam();
  // bf16 activations: both backends round at the same points; single values may still land one bf16 step apart.
  compare({{"x", {n, 9}, DType::BF16}, {"w", {6, 9}, DType::BF16}},
          [](Builder& b, const std::vector<ValueId>& v) { return b.matmul(v[0], v[1], kNone, DType::BF16); }, 1e-2);
  compare({{"x", {n, 13}, DType::BF16}, {"w", {13}, DType::BF16}}, [](Builder& b, const std::vector<ValueId>& v) { return b.rms_norm(v[0], v[1], 1e-6); }, 1e-2);
  // Attention's GEMMs run in bf16 on bf16 inputs (scores, probabilities and dS rounded as autocast rounds them);
  // the reference keeps f64 in the backward pass, hence the bf16-sized tolerance. Causal with a KV offset, and not.
  for (bool causal : {true, false})
    compare({{"q", {2, n, 4, 8}, DType::BF16}, {"k", {2, n + 3, 2, 8}, DType::BF16}, {"v", {2, n + 3, 2, 8}, DType::BF16}, {"mask", {2, n + 3}, DType::I32, 2}},
            [causal](Builder& b, const std::vector<ValueId>& v) { return b.attention(v[0], v[1], v[2], v[3], 0.35, causal); }, 2e-2);
}

TEST(CpuOpsLong, AttentionAcrossQueryBlocks) {
  // Several 64-row query blocks, a ragged last block, causal skipping of later keys, KV offset, packed segments.
  compare({{"q", {1, 150, 2, 16}}, {"k", {1, 170, 1, 16}}, {"v", {1, 170, 1, 16}}, {"mask", {1, 170}, DType::I32, 2}},
          [](Builder& b, const std::vector<ValueId>& v) { return b.attention(v[0], v[1], v[2], v[3], 0.25, true); }, 1e-5);
  compare({{"q", {1, 150, 2, 16}, DType::BF16}, {"k", {1, 150, 1, 16}, DType::BF16}, {"v", {1, 150, 1, 16}, DType::BF16}},
          [](Builder& b, const std::vector<ValueId>& v) { return b.attention(v[0], v[1], v[2], kNone, 0.25, true); }, 2e-2);
}

INSTANTIATE_TEST_SUITE_P(Sizes, CpuOps, ::testing::Values(1, 7, 129));

// The whole tiny model's training step on the CPU backend against PyTorch's gradients.
TEST(CpuBackend, TrainingStepMatchesPyTorch) {
  const nlohmann::json golden = nlohmann::json::parse(read_text_file(std::string(TRL_TEST_DATA_DIR) + "/goldens/qwen3_tiny_train.json"));
  test::TempDir dir;
  InitOptions o;
  o.preset = "tiny";
  o.seed = 1234;
  o.initializer_range = 0.1;
  o.randomize_norms = true;
  const CausalLM model = init_model(o, dir.path());
  const auto& rows = golden["rows"];
  const int64_t B = static_cast<int64_t>(rows.size());
  int64_t T = 0, items = 0;
  for (const auto& r : rows) T = std::max<int64_t>(T, static_cast<int64_t>(r.size())), items += static_cast<int64_t>(r.size()) - 1;
  Tensor ids = Tensor::zeros(DType::I32, {B, T}), mask = Tensor::zeros(DType::I32, {B, T}), labels = Tensor::zeros(DType::I32, {B, T});
  Tensor w = Tensor::zeros(DType::F32, {B, T});
  for (int64_t b = 0; b < B; ++b)
    for (size_t t = 0; t < rows[static_cast<size_t>(b)].size(); ++t) {
      ids.mutable_data_as<int32_t>()[b * T + static_cast<int64_t>(t)] = rows[static_cast<size_t>(b)][t].get<int32_t>();
      mask.mutable_data_as<int32_t>()[b * T + static_cast<int64_t>(t)] = 1;
      if (t + 1 < rows[static_cast<size_t>(b)].size()) {
        labels.mutable_data_as<int32_t>()[b * T + static_cast<int64_t>(t)] = rows[static_cast<size_t>(b)][t + 1].get<int32_t>();
        w.mutable_data_as<float>()[b * T + static_cast<int64_t>(t)] = -1.0f / static_cast<float>(items);
      }
    }
  TensorMap in = model.weights();
  in["input_ids"] = ids, in["attention_mask"] = mask, in["position_ids"] = default_position_ids(mask), in["labels"] = labels, in["loss_weights"] = w;
  const auto out = make_cpu_backend()->compile(training_graph(model, B, T))->run(in);
  EXPECT_NEAR(out[0].data_as<float>()[0], golden["loss"].get<double>(), 1e-4 * golden["loss"].get<double>());
  const auto shapes = parameter_shapes(model.config());
  for (size_t k = 0; k < shapes.size(); ++k) {
    const auto& g = golden["grads"][shapes[k].first];
    double sumsq = 0;
    for (float x : out[k + 1].to_f32_vector()) sumsq += static_cast<double>(x) * x;
    const double norm = std::sqrt(g["sumsq"].get<double>());
    EXPECT_NEAR(std::sqrt(sumsq), norm, 1e-3 * norm + 1e-8) << shapes[k].first;
    // Element by element too: a gradient in the wrong place keeps its norm.
    const Tensor& ours = out[k + 1];
    const double floor = norm / std::sqrt(static_cast<double>(ours.numel()));
    for (const auto& smp : g["samples"]) {
      const double want = smp[1].get<double>();
      const double got = load_element(ours.data(), ours.dtype(), smp[0].get<int64_t>());
      EXPECT_LE(std::fabs(got - want) / std::max(floor, std::fabs(want)), 2e-3) << shapes[k].first << "[" << smp[0] << "]";
    }
  }
}

}  // namespace
}  // namespace trl

namespace trl {
namespace {

// A bf16 training step at Qwen3-0.6B's widths (hidden 1024, MLP 3072, 16 query / 8 key-value heads of 128; one
// layer, the cut vocabulary) against the reference backend: the shapes and dtype of the real model's step, so a CPU
// whose GEMM or attention path cannot run them (no bf16 matmul in oneDNN without AVX-512) fails here on whatever
// machine CI has. The two backends round at different points, so the comparison is statistical, as
// TrainGoldenBf16's: the loss to 1%, each gradient's norm to 3% and its direction (cosine) above 0.99.
TEST(CpuBackend, Bf16TrainingStepAtQwen3Widths) {
  ModelConfig cfg = preset_config("qwen3-0.6b", DType::BF16);
  cfg.num_hidden_layers = 1;
  cfg.vocab_size = test::kCutVocab;
  const CausalLM model = CausalLM::from_weights(cfg, init_weights(cfg, DType::BF16, 11, 0.02, true), "qwen3-0.6b widths");
  const int64_t B = 1, T = 16;
  SplitMix64 rng(5);
  Tensor ids = Tensor::zeros(DType::I32, {B, T}), mask = Tensor::zeros(DType::I32, {B, T}), labels = Tensor::zeros(DType::I32, {B, T});
  Tensor w = Tensor::zeros(DType::F32, {B, T});
  for (int64_t i = 0; i < B * T; ++i) {
    ids.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(cfg.vocab_size));
    labels.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(cfg.vocab_size));
    mask.mutable_data_as<int32_t>()[i] = 1;
    w.mutable_data_as<float>()[i] = -1.0f / static_cast<float>(B * T);
  }
  TensorMap in = model.weights();
  in["input_ids"] = ids, in["attention_mask"] = mask, in["position_ids"] = default_position_ids(mask), in["labels"] = labels, in["loss_weights"] = w;
  const graph::Graph g = training_graph(model, B, T);
  const auto want = make_reference_backend()->compile(g)->run(in);
  const auto got = make_cpu_backend()->compile(g)->run(in);
  ASSERT_EQ(want.size(), got.size());
  const double loss = want[0].data_as<float>()[0];
  ASSERT_TRUE(std::isfinite(loss) && loss > 1.0) << loss;  // about log(4096) = 8.3 for a random model
  EXPECT_NEAR(got[0].data_as<float>()[0], loss, 0.01 * loss);
  const auto shapes = parameter_shapes(model.config());
  ASSERT_GE(want.size(), shapes.size() + 1);  // loss, the gradients in parameter_shapes() order, then metrics
  for (size_t k = 0; k < shapes.size(); ++k) {
    const auto a = want[k + 1].to_f32_vector(), c = got[k + 1].to_f32_vector();
    double aa = 0, cc = 0, ac = 0;
    for (size_t i = 0; i < a.size(); ++i) aa += static_cast<double>(a[i]) * a[i], cc += static_cast<double>(c[i]) * c[i], ac += static_cast<double>(a[i]) * c[i];
    ASSERT_TRUE(std::isfinite(aa) && std::isfinite(cc) && aa > 0) << shapes[k].first;
    EXPECT_NEAR(std::sqrt(cc), std::sqrt(aa), 0.03 * std::sqrt(aa)) << shapes[k].first;
    EXPECT_GT(ac / std::sqrt(aa * cc), 0.99) << shapes[k].first;
  }
}

// gradient_checkpointing recomputes each layer in the backward pass: the loss and every gradient must be the same
// bits as without it, in f32 and bf16, with padding and packed segments, while the planned arena shrinks.
TEST(CpuBackend, GradientCheckpointingIsBitIdenticalAndSmaller) {
  for (DType dt : {DType::F32, DType::BF16}) {
    ModelConfig cfg = preset_config("small", dt);
    TensorMap weights = init_weights(cfg, dt, 5, 0.05, true);
    const CausalLM model = CausalLM::from_weights(cfg, weights, "small");
    const int64_t B = 2, T = 37;
    SplitMix64 rng(3);
    Tensor ids = Tensor::zeros(DType::I32, {B, T}), mask = Tensor::zeros(DType::I32, {B, T}), labels = Tensor::zeros(DType::I32, {B, T});
    Tensor w = Tensor::zeros(DType::F32, {B, T});
    for (int64_t i = 0; i < B * T; ++i) {
      ids.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(cfg.vocab_size));
      labels.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(cfg.vocab_size));
      const int64_t t = i % T;
      // Row 0: two packed sequences; row 1: 30 tokens and right padding.
      mask.mutable_data_as<int32_t>()[i] = i < T ? (t < 20 ? 1 : 2) : (t < 30 ? 1 : 0);
      w.mutable_data_as<float>()[i] = mask.data_as<int32_t>()[i] != 0 ? -0.01f : 0.0f;
    }
    TensorMap in = model.weights();
    in["input_ids"] = ids, in["attention_mask"] = mask, in["position_ids"] = default_position_ids(mask), in["labels"] = labels, in["loss_weights"] = w;
    auto backend = make_cpu_backend();
    auto plain = backend->compile(training_graph(model, B, T));
    auto remat = backend->compile(training_graph(model, {.batch = B, .tokens = T, .gradient_checkpointing = true}));
    EXPECT_LT(remat->arena_bytes(), plain->arena_bytes());
    std::vector<std::vector<float>> want;
    for (const Tensor& t : plain->run(in)) want.push_back(t.to_f32_vector());
    const auto got = remat->run(in);
    ASSERT_EQ(want.size(), got.size());
    for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(want[k], got[k].to_f32_vector()) << "output " << k << " (" << dtype_name(dt) << ")";
  }
}

}  // namespace
}  // namespace trl

namespace trl {
namespace {

// Packing: two sequences packed into one row (segment ids, positions reset) give the same loss and gradients as
// the same sequences in two padded rows.
TEST(CpuBackend, PackedTrainingStepEqualsPadded) {
  ModelConfig cfg = preset_config("tiny", DType::F32);
  const CausalLM model = CausalLM::from_weights(cfg, init_weights(cfg, DType::F32, 9, 0.1, true), "tiny");
  const std::vector<std::vector<int32_t>> seqs = {{11, 12, 13, 14, 15}, {21, 22, 23, 24}};
  const float items = 4 + 3;
  auto run = [&](int64_t B, int64_t T, bool packed) {
    Tensor ids = Tensor::zeros(DType::I32, {B, T}), mask = Tensor::zeros(DType::I32, {B, T}), labels = Tensor::zeros(DType::I32, {B, T});
    Tensor w = Tensor::zeros(DType::F32, {B, T});
    int64_t row = 0, col = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      if (!packed) row = static_cast<int64_t>(s), col = 0;
      for (size_t t = 0; t < seqs[s].size(); ++t, ++col) {
        const int64_t i = row * T + col;
        ids.mutable_data_as<int32_t>()[i] = seqs[s][t];
        mask.mutable_data_as<int32_t>()[i] = packed ? static_cast<int32_t>(s + 1) : 1;
        if (t + 1 < seqs[s].size()) labels.mutable_data_as<int32_t>()[i] = seqs[s][t + 1], w.mutable_data_as<float>()[i] = -1.0f / items;
      }
    }
    TensorMap in = model.weights();
    in["input_ids"] = ids, in["attention_mask"] = mask, in["position_ids"] = default_position_ids(mask), in["labels"] = labels, in["loss_weights"] = w;
    std::vector<std::vector<float>> out;
    for (const Tensor& t : make_cpu_backend()->compile(training_graph(model, B, T))->run(in)) out.push_back(t.to_f32_vector());
    return out;
  };
  const auto padded = run(2, 5, false), packed = run(1, 9, true);
  ASSERT_EQ(padded.size(), packed.size());
  // The loss and every gradient (the per-token log-probs are laid out by row, so they differ in shape).
  const size_t per_token = training_graph(model, 1, 9).output_index("token_logprobs");
  for (size_t k = 0; k < padded.size(); ++k) {
    if (k == per_token) continue;
    ASSERT_EQ(padded[k].size(), packed[k].size()) << "output " << k;
    double scale = 1e-6;
    for (float x : padded[k]) scale = std::max(scale, static_cast<double>(std::fabs(x)));
    for (size_t i = 0; i < padded[k].size(); ++i) {
      const double err = std::fabs(static_cast<double>(padded[k][i]) - packed[k][i]);
      ASSERT_TRUE(err <= 1e-5 * scale) << "output " << k << " [" << i << "]: " << padded[k][i] << " vs " << packed[k][i];  // NaN fails
    }
  }
}

}  // namespace
}  // namespace trl

namespace trl {
namespace {

// share_arena: programs of three shapes planned into one arena give the same bits as programs with arenas of their
// own, also when a smaller program runs after a larger one grew the arena (its buffers are rebound), and an output
// kept from before the arena grew still reads its values (the old buffer lives while a view holds it).
TEST(CpuBackend, SharedArenaGivesTheSameResultsAndKeepsHeldOutputs) {
  ModelConfig cfg = preset_config("small", DType::F32);
  const CausalLM model = CausalLM::from_weights(cfg, init_weights(cfg, DType::F32, 4, 0.05, true), "small");
  auto inputs = [&](int64_t T) {
    Tensor ids = Tensor::zeros(DType::I32, {1, T}), mask = Tensor::zeros(DType::I32, {1, T}), labels = Tensor::zeros(DType::I32, {1, T});
    Tensor w = Tensor::zeros(DType::F32, {1, T});
    for (int64_t t = 0; t < T; ++t) {
      ids.mutable_data_as<int32_t>()[t] = static_cast<int32_t>((t * 7919 + T) % cfg.vocab_size);
      labels.mutable_data_as<int32_t>()[t] = static_cast<int32_t>((t * 104729 + 3) % cfg.vocab_size);
      mask.mutable_data_as<int32_t>()[t] = 1;
      w.mutable_data_as<float>()[t] = -1.0f / static_cast<float>(T);
    }
    TensorMap in = model.weights();
    in["input_ids"] = ids, in["attention_mask"] = mask, in["position_ids"] = default_position_ids(mask), in["labels"] = labels, in["loss_weights"] = w;
    return in;
  };
  auto values = [](const std::vector<Tensor>& out) {
    std::vector<std::vector<float>> v;
    for (const Tensor& t : out) v.push_back(t.to_f32_vector());
    return v;
  };
  auto own = make_cpu_backend();
  auto shared = make_cpu_backend(CpuBackendOptions{.share_arena = true});
  std::vector<std::vector<std::vector<float>>> want;
  for (int64_t T : {9, 40, 17}) want.push_back(values(own->compile(training_graph(model, 1, T))->run(inputs(T))));
  auto p9 = shared->compile(training_graph(model, 1, 9));
  const std::vector<Tensor> held = p9->run(inputs(9));
  auto p40 = shared->compile(training_graph(model, 1, 40));  // grows the arena
  EXPECT_GT(p40->arena_bytes(), p9->arena_bytes());
  EXPECT_EQ(values(held), want[0]);  // still the first run's values
  auto p17 = shared->compile(training_graph(model, 1, 17));
  EXPECT_EQ(values(p40->run(inputs(40))), want[1]);
  EXPECT_EQ(values(p9->run(inputs(9))), want[0]);
  EXPECT_EQ(values(p17->run(inputs(17))), want[2]);
  EXPECT_EQ(values(p40->run(inputs(40))), want[1]);
}

}  // namespace
}  // namespace trl

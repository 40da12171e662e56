// Every VJP rule against central finite differences, in f64 on the reference backend.
#include <cmath>
#include <functional>

#include <gtest/gtest.h>

#include "trl/backend/backend.h"
#include "core/rng.h"
#include "graph/autodiff.h"

namespace trl {
namespace {

using graph::Builder;
using graph::kNone;
using graph::ValueId;

struct Input {
  std::string name;
  Shape shape;
  DType dtype = DType::F64;
  int32_t int_range = 0;  // i32 inputs: values in [0, int_range)
  bool differentiate = true;
};

// Builds op(inputs) -> loss = Σ out·r (r random), differentiates with respect to every differentiable input and
// compares each gradient element (up to 24 per input, spread over the tensor) with (L(x+ε) - L(x-ε)) / 2ε.
void check_vjp(const std::vector<Input>& specs, const std::function<ValueId(Builder&, const std::vector<ValueId>&)>& op,
               uint64_t seed = 1) {
  Builder b;
  std::vector<ValueId> ids;
  for (const Input& s : specs) ids.push_back(b.input(s.name, s.shape, s.dtype));
  const ValueId out = op(b, ids);
  const Shape out_shape = b.shape(out);
  const ValueId r = b.input("r", out_shape, DType::F64);
  const ValueId loss = b.weighted_sum(out, r);
  std::vector<std::string> wrt;
  for (const Input& s : specs)
    if (s.differentiate && s.dtype == DType::F64) wrt.push_back(s.name);
  const auto grads = graph::add_backward(b, loss, wrt, DType::F64);
  b.output(loss);
  for (const auto& w : wrt) b.output(grads.at(w));
  auto program = make_reference_backend()->compile(b.finish());

  SplitMix64 rng(seed);
  TensorMap in;
  auto random_tensor = [&](const Shape& shape, DType dtype, int32_t range) {
    Tensor t = Tensor::zeros(dtype, shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (dtype == DType::I32) t.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(range));
      else store_element(t.mutable_data(), dtype, i, rng.normal());
    }
    return t;
  };
  for (const Input& s : specs) in[s.name] = random_tensor(s.shape, s.dtype, s.int_range);
  in["r"] = random_tensor(out_shape, DType::F64, 0);
  if (in.count("mask")) {  // keep the first key visible in every row
    Tensor& m = in["mask"];
    // Segment ids 0 (padding), 1, 2 in runs, as packing produces them.
    for (int64_t i = 0; i < m.numel(); ++i) m.mutable_data_as<int32_t>()[i] = static_cast<int32_t>((i % m.size(-1)) * 3 / m.size(-1) + (rng.next() % 5 == 0 ? 0 : 1)) % 3;
  }
  const auto result = program->run(in);
  auto loss_at = [&](const std::string& name, int64_t i, double delta) {
    TensorMap moved = in;
    Tensor t = moved[name].clone();
    store_element(t.mutable_data(), DType::F64, i, load_element(t.data(), DType::F64, i) + delta);
    moved[name] = t;
    return load_element(program->run(moved)[0].data(), DType::F64, 0);
  };
  for (size_t k = 0; k < wrt.size(); ++k) {
    const Tensor& g = result[k + 1];
    const int64_t n = g.numel();
    const int64_t step = std::max<int64_t>(1, n / 24);
    for (int64_t i = 0; i < n; i += step) {
      const double eps = 1e-6;
      const double fd = (loss_at(wrt[k], i, eps) - loss_at(wrt[k], i, -eps)) / (2 * eps);
      const double ad = load_element(g.data(), DType::F64, i);
      ASSERT_NEAR(ad, fd, 1e-6 * std::max(1.0, std::fabs(fd))) << "d/d" << wrt[k] << "[" << i << "]";
    }
  }
}

TEST(Autodiff, MatMulWithBias) {
  check_vjp({{"x", {2, 3, 5}}, {"w", {4, 5}}, {"b", {4}}},
            [](Builder& b, const std::vector<ValueId>& v) { return b.matmul(v[0], v[1], v[2], DType::F64); });
}

TEST(Autodiff, Embedding) {
  check_vjp({{"ids", {2, 3}, DType::I32, 7}, {"table", {7, 4}}},
            [](Builder& b, const std::vector<ValueId>& v) { return b.embedding(v[0], v[1], DType::F64); });
}

TEST(Autodiff, RmsNorm) {
  check_vjp({{"x", {3, 7}}, {"w", {7}}}, [](Builder& b, const std::vector<ValueId>& v) { return b.rms_norm(v[0], v[1], 1e-6); });
}

TEST(Autodiff, Rope) {
  check_vjp({{"x", {2, 3, 2, 8}}, {"pos", {2, 3}, DType::I32, 50}}, [](Builder& b, const std::vector<ValueId>& v) {
    return b.rope(v[0], v[1], {1.0f, 0.1f, 0.01f, 0.001f}, 1.0f);
  });
}

TEST(Autodiff, AttentionCausalGqaWithMask) {
  check_vjp({{"q", {2, 3, 4, 8}}, {"k", {2, 5, 2, 8}}, {"v", {2, 5, 2, 8}}, {"mask", {2, 5}, DType::I32, 2, false}},
            [](Builder& b, const std::vector<ValueId>& v) { return b.attention(v[0], v[1], v[2], v[3], 0.35, true); });
  check_vjp({{"q", {1, 7, 2, 4}}, {"k", {1, 7, 2, 4}}, {"v", {1, 7, 2, 4}}},
            [](Builder& b, const std::vector<ValueId>& v) { return b.attention(v[0], v[1], v[2], kNone, 0.5, false); }, 3);
}

TEST(Autodiff, SwiGLUAddReshapeCast) {
  check_vjp({{"g", {3, 6}}, {"u", {3, 6}}}, [](Builder& b, const std::vector<ValueId>& v) {
    const ValueId s = b.swiglu(v[0], v[1]);
    const ValueId r = b.reshape(b.add(s, v[0]), {6, 3});
    return b.cast(r, DType::F64);
  });
}

TEST(Autodiff, TokenLogprobs) {
  check_vjp({{"h", {2, 3, 4}}, {"w", {9, 4}}, {"t", {2, 3}, DType::I32, 9}},
            [](Builder& b, const std::vector<ValueId>& v) { return b.token_logprobs(v[0], v[1], v[2]); });
}

TEST(Autodiff, Entropy) {
  check_vjp({{"h", {2, 3, 4}}, {"w", {9, 4}}}, [](Builder& b, const std::vector<ValueId>& v) { return b.entropy(v[0], v[1]); });
}

// A constant scale (a sampling temperature's 1/T before the vocabulary ops): d(x·s)/dx = s.
TEST(Autodiff, ScaleByAConstant) {
  check_vjp({{"h", {2, 3, 4}}, {"w", {9, 4}}, {"t", {2, 3}, DType::I32, 9}}, [](Builder& b, const std::vector<ValueId>& v) {
    const ValueId scaled = b.scale_by(v[0], b.fill({}, DType::F64, 1.0 / 0.7), DType::F64);
    return b.token_logprobs(scaled, v[1], v[2]);
  });
}

TEST(Autodiff, ValueUsedTwiceAccumulates) {
  // w is both a matmul weight and a token_logprobs head (like tied embeddings).
  check_vjp({{"x", {2, 4}}, {"w", {4, 4}}, {"t", {2}, DType::I32, 4}}, [](Builder& b, const std::vector<ValueId>& v) {
    const ValueId h = b.matmul(v[0], v[1], kNone, DType::F64);
    return b.token_logprobs(h, v[1], v[2]);
  });
}

TEST(Autodiff, TiedEmbeddingAccumulatesIntoTheHeadGradient) {
  check_vjp({{"ids", {2, 3}, DType::I32, 6}, {"table", {6, 4}}, {"t", {2, 3}, DType::I32, 6}}, [](Builder& b, const std::vector<ValueId>& v) {
    const ValueId h = b.embedding(v[0], v[1], DType::F64);
    return b.token_logprobs(h, v[1], v[2]);
  });
}

}  // namespace
}  // namespace trl

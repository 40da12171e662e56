#include <gtest/gtest.h>

#include "trl/backend/backend.h"
#include "trl/core/error.h"
#include "trl/backend/cpu/cpu_backend.h"
#include "trl/graph/graph.h"
#include "graph/passes.h"

#include <cmath>

namespace trl {
namespace {

using graph::Builder;
using graph::kNone;

TEST(Graph, ShapeInferenceAndErrors) {
  Builder b;
  auto x = b.input("x", {2, 3, 8}, DType::F32);
  auto w = b.input("w", {5, 8}, DType::F32);
  auto y = b.matmul(x, w, kNone, DType::F32, "proj");
  EXPECT_EQ(b.shape(y), (Shape{2, 3, 5}));
  auto bad = b.input("bad", {5, 7}, DType::F32);
  try {
    b.matmul(x, bad, kNone, DType::F32, "blk.0.attn_q");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.0.attn_q"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[5, 7]"), std::string::npos);
  }
  EXPECT_THROW(b.input("x", {1}, DType::F32), Error);  // declared twice
  EXPECT_THROW(b.reshape(y, {7}), Error);
  auto q = b.input("q", {1, 4, 4, 2}, DType::F32);
  auto k = b.input("k", {1, 3, 3, 2}, DType::F32);
  EXPECT_THROW(b.attention(q, k, k, kNone, 1.0, true, "a"), Error);  // H % Hkv != 0
}

TEST(Graph, HashDependsOnShapesNotDebugNames) {
  auto make = [](int64_t T, const char* name) {
    Builder b;
    auto x = b.input("x", {1, T, 4}, DType::F32);
    auto w = b.input("w", {4}, DType::F32);
    b.output(b.rms_norm(x, w, 1e-6, name));
    return b.finish();
  };
  EXPECT_EQ(make(3, "a").hash(), make(3, "b").hash());
  EXPECT_NE(make(3, "a").hash(), make(4, "a").hash());
  EXPECT_NE(make(3, "a").dump().find("rms_norm(%0, %1) [1, 3, 4] f32"), std::string::npos) << make(3, "a").dump();
}

TEST(Passes, DeadCodeIsRemovedAndResultsAreUnchanged) {
  Builder b;
  auto x = b.input("x", {2, 3}, DType::F32);
  auto unused = b.input("unused", {4}, DType::F32);
  auto w = b.input("w", {3}, DType::F32);
  auto dead = b.add(x, x, "dead");  // nothing reads it
  (void)dead;
  (void)unused;
  auto y = b.rms_norm(x, w, 1e-6);
  b.output(y);
  const graph::Graph g = b.finish();
  const graph::Graph pruned = graph::eliminate_dead_code(g);
  EXPECT_EQ(pruned.nodes.size(), 3u);   // x, w, rms_norm
  EXPECT_EQ(pruned.inputs.size(), 2u);  // "unused" is gone and need not be bound
  for (auto* make : {&make_reference_backend, &make_cpu_backend}) {
    TensorMap in;
    in["x"] = Tensor::from_f32(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    in["w"] = Tensor::from_f32(std::vector<float>{1, 1, 2}, {3});
    const auto out = make()->compile(g)->run(in);  // no binding for "unused": pruned before lowering
    const float r = 1.0f / std::sqrt((1 + 4 + 9) / 3.0f + 1e-6f);
    EXPECT_NEAR(out[0].to_f32_vector()[2], 3 * r * 2, 1e-5);
  }
}

TEST(ReferenceBackend, SmallOpsByHand) {
  Builder b;
  auto x = b.input("x", {1, 2}, DType::F32);
  auto w = b.input("w", {3, 2}, DType::F32);
  auto bias = b.input("bias", {3}, DType::F32);
  auto y = b.matmul(x, w, bias, DType::F32);
  auto nw = b.input("nw", {3}, DType::F32);
  b.output(y);
  b.output(b.rms_norm(y, nw, 0.0));
  b.output(b.swiglu(y, y));
  auto program = make_reference_backend()->compile(b.finish());
  TensorMap in;
  in["x"] = Tensor::from_f32(std::vector<float>{1, 2}, {1, 2});
  in["w"] = Tensor::from_f32(std::vector<float>{1, 0, 0, 1, 1, 1}, {3, 2});
  in["bias"] = Tensor::from_f32(std::vector<float>{0, 0, -3}, {3});
  in["nw"] = Tensor::from_f32(std::vector<float>{1, 2, 3}, {3});
  auto out = program->run(in);
  EXPECT_EQ(out[0].to_f32_vector(), (std::vector<float>{1, 2, 0}));
  const float r = 1.0f / std::sqrt(5.0f / 3.0f);
  auto n = out[1].to_f32_vector();
  EXPECT_NEAR(n[0], 1 * r, 1e-6);
  EXPECT_NEAR(n[1], 2 * 2 * r, 1e-6);
  EXPECT_NEAR(n[2], 0, 1e-6);
  auto s = out[2].to_f32_vector();
  EXPECT_NEAR(s[1], 2.0 / (1 + std::exp(-2.0)) * 2.0, 1e-6);
  // Binding errors name the input.
  in.erase("bias");
  try {
    program->run(in);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'bias'"), std::string::npos);
  }
  in["bias"] = Tensor::from_f32(std::vector<float>{0, 0, 0, 0}, {4});
  EXPECT_THROW(program->run(in), Error);
}

TEST(ReferenceBackend, AttentionMasksAndGqa) {
  // One query head pair sharing one KV head; key 1 masked out: the output is exactly v[0] or v[2] mixtures.
  Builder b;
  auto q = b.input("q", {1, 3, 2, 1}, DType::F32);
  auto k = b.input("k", {1, 3, 1, 1}, DType::F32);
  auto v = b.input("v", {1, 3, 1, 1}, DType::F32);
  auto m = b.input("m", {1, 3}, DType::I32);
  b.output(b.attention(q, k, v, m, 1.0, true));
  auto program = make_reference_backend()->compile(b.finish());
  TensorMap in;
  in["q"] = Tensor::from_f32(std::vector<float>{0, 0, 0, 0, 0, 0}, {1, 3, 2, 1});
  in["k"] = Tensor::from_f32(std::vector<float>{0, 0, 0}, {1, 3, 1, 1});
  in["v"] = Tensor::from_f32(std::vector<float>{10, 20, 30}, {1, 3, 1, 1});
  in["m"] = Tensor::from_i32(std::vector<int32_t>{1, 0, 1}, {1, 3});
  auto out = program->run(in)[0].to_f32_vector();
  // t=0 sees key 0; t=1 is padding and sees nothing (zeros); t=2 sees keys 0 and 2 equally.
  EXPECT_EQ(out, (std::vector<float>{10, 10, 0, 0, 20, 20}));
  // Segment ids: keys of another packed sequence are invisible. Mask {1, 2, 2}: t=2 sees keys 1 and 2 only.
  in["m"] = Tensor::from_i32(std::vector<int32_t>{1, 2, 2}, {1, 3});
  EXPECT_EQ(program->run(in)[0].to_f32_vector(), (std::vector<float>{10, 10, 20, 20, 25, 25}));
}

}  // namespace
}  // namespace trl

namespace trl {
namespace {

// Shapes no kernel can run are refused when the graph is built, naming the op: an empty reduction dimension, and
// more queries than keys without explicit query positions (the op table test found both).
TEST(GraphBuilder, RefusesShapesNoKernelCanRun) {
  auto message = [](auto&& build) -> std::string {
    graph::Builder b;
    try {
      build(b);
    } catch (const Error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_NE(message([](graph::Builder& b) { b.matmul(b.input("x", {3, 0}, DType::F32), b.input("w", {4, 0}, DType::F32), graph::kNone, DType::F32, "proj"); })
                .find("matmul proj: x [3, 0] and w [4, 0] have an empty reduction dimension"),
            std::string::npos);
  EXPECT_NE(message([](graph::Builder& b) { b.rms_norm(b.input("x", {3, 0}, DType::F32), b.input("w", {0}, DType::F32), 1e-6, "norm"); })
                .find("rms_norm norm: x [3, 0] has an empty last dimension"),
            std::string::npos);
  const std::string attn = message([](graph::Builder& b) {
    const auto q = b.input("q", {2, 3, 1, 2}, DType::F32);
    const auto k = b.input("k", {2, 2, 1, 2}, DType::F32);
    const auto v = b.input("v", {2, 2, 1, 2}, DType::F32);
    b.attention(q, k, v, graph::kNone, 1.0, /*causal=*/false, "attn");
  });
  EXPECT_NE(attn.find("attention attn: 3 queries need at least as many keys, got S = 2"), std::string::npos) << attn;
}

}  // namespace
}  // namespace trl

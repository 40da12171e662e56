// graph::fuse_vocabulary_ops: which nodes it fuses, what their backward nodes are handed, and that the fused graph
// computes exactly what the graph as written does (the reference backend runs both).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "core/rng.h"
#include "graph/passes.h"
#include "test_util.h"
#include "trl/backend/backend.h"
#include "trl/core/error.h"
#include "trl/graph/graph.h"
#include "trl/train/objectives.h"

namespace trl {
namespace {

using graph::Builder;
using graph::kNone;
using graph::Op;
using graph::ValueId;

size_t count(const graph::Graph& g, Op op) {
  return static_cast<size_t>(std::count_if(g.nodes.begin(), g.nodes.end(), [op](const graph::Node& n) { return n.op == op; }));
}

const graph::Node& only(const graph::Graph& g, Op op) {
  const auto it = std::find_if(g.nodes.begin(), g.nodes.end(), [op](const graph::Node& n) { return n.op == op; });
  if (it == g.nodes.end()) fail("no {} node in\n{}", graph::op_name(op), g.dump());
  return *it;
}

// A loss-and-metrics graph on one (h, w, targets) with both backward nodes, in `dt`.
graph::Graph head_graph(DType dt) {
  Builder b;
  const ValueId h = b.input("h", {2, 3, 8}, dt), w = b.input("w", {11, 8}, dt), t = b.input("t", {2, 3}, DType::I32);
  const ValueId dl = b.input("dl", {2, 3}, DType::F32), de = b.input("de", {2, 3}, DType::F32);
  b.output(b.token_logprobs(h, w, t, "logp"), "logp");
  b.output(b.entropy(h, w, "entropy"), "entropy");
  b.output(b.token_argmax_match(h, w, t, "match"), "match");
  for (ValueId v : b.token_logprobs_backward(h, w, t, dl, "d.logp")) b.output(v);
  for (ValueId v : b.entropy_backward(h, w, de, "d.entropy")) b.output(v);
  return b.finish();
}

TensorMap head_inputs(DType dt) {
  SplitMix64 rng(5);
  auto rand = [&](Shape s) {
    std::vector<float> v(static_cast<size_t>(shape_numel(s)));
    for (float& x : v) x = static_cast<float>(rng.normal());
    return Tensor::from_f32(v, s, dt);
  };
  TensorMap in;
  in["h"] = rand({2, 3, 8});
  in["w"] = rand({11, 8});
  in["t"] = Tensor::from_i32(std::vector<int32_t>{0, 10, 3, 7, 7, 1}, {2, 3});
  in["dl"] = Tensor::from_f32(std::vector<float>{0.5f, -1, 0, 2, 0.25f, -0.75f}, {2, 3});
  in["de"] = Tensor::from_f32(std::vector<float>{0.5f, -1, 0, 2, 0.25f, -0.75f}, {2, 3});
  return in;
}

TEST(FuseVocabularyOps, OnePassForTheLossItsMetricsAndTheirBackward) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const graph::Graph g = head_graph(dt), fused = graph::fuse_vocabulary_ops(g);
    EXPECT_EQ(count(fused, Op::VocabStats), 1u) << fused.dump();
    EXPECT_EQ(count(fused, Op::TokenLogprobs) + count(fused, Op::Entropy) + count(fused, Op::TokenArgmaxMatch), 0u) << fused.dump();
    const graph::Node& st = only(fused, Op::VocabStats);
    EXPECT_TRUE(st.attrs.entropy);
    EXPECT_EQ(st.attrs.keep_logits, dt == DType::BF16);  // exact only for bf16 logits
    const ValueId stats = static_cast<ValueId>(&st - fused.nodes.data());
    EXPECT_EQ(only(fused, Op::TokenLogprobsBackward).inputs.back(), stats);
    EXPECT_EQ(only(fused, Op::EntropyBackward).inputs.back(), stats);
    EXPECT_EQ(fused.output_names, g.output_names);
    // The reference runs both graphs with the same f64 formulas: equal bit for bit.
    const auto want = make_reference_backend()->compile(g)->run(head_inputs(dt));
    const auto got = make_reference_backend()->compile(fused)->run(head_inputs(dt));
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_EQ(got[k].shape(), want[k].shape()) << "output " << k;
      EXPECT_EQ(std::memcmp(got[k].data(), want[k].data(), want[k].nbytes()), 0) << "output " << k << " differs";
    }
  }
}

TEST(FuseVocabularyOps, GroupsByHeadAndTargets) {
  Builder b;
  const ValueId h = b.input("h", {4, 8}, DType::F32), w = b.input("w", {11, 8}, DType::F32), w2 = b.input("w2", {11, 8}, DType::F32);
  const ValueId t = b.input("t", {4}, DType::I32), u = b.input("u", {4}, DType::I32);
  b.output(b.token_logprobs(h, w, t));
  b.output(b.token_logprobs(h, w, u));  // other targets: a pass of its own
  b.output(b.token_logprobs(h, w2, t));  // another head: a pass of its own
  b.output(b.entropy(h, w));              // joins the first pass
  const graph::Graph fused = graph::fuse_vocabulary_ops(b.finish());
  EXPECT_EQ(count(fused, Op::VocabStats), 3u) << fused.dump();
  size_t with_entropy = 0;
  for (const graph::Node& n : fused.nodes) with_entropy += n.op == Op::VocabStats && n.attrs.entropy;
  EXPECT_EQ(with_entropy, 1u);
}

TEST(FuseVocabularyOps, LeavesGraphsWithoutVocabularyOpsAlone) {
  Builder b;
  const ValueId x = b.input("x", {2, 3}, DType::F32);
  b.output(b.add(x, x));
  const graph::Graph g = b.finish();
  EXPECT_EQ(graph::fuse_vocabulary_ops(g).key(), g.key());
}

TEST(FuseVocabularyOps, TheTrainingGraphHasOneVocabularyPass) {
  const test::TinyModel tiny;
  const graph::Graph g = graph::optimize(training_graph(tiny.model, {.batch = 2, .tokens = 8, .metrics = true}));
  EXPECT_EQ(count(g, Op::VocabStats), 1u) << "the loss, entropy and accuracy share one lm_head pass";
  EXPECT_EQ(count(g, Op::TokenLogprobs) + count(g, Op::Entropy) + count(g, Op::TokenArgmaxMatch), 0u);
  EXPECT_NE(only(g, Op::TokenLogprobsBackward).inputs.back(), kNone);
}

TEST(VocabStats, BuilderRefusesStatsThatDoNotFit) {
  auto message = [](auto&& build) -> std::string {
    Builder b;
    try {
      build(b);
    } catch (const Error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  const std::string other = message([](Builder& b) {
    const ValueId h = b.input("h", {4, 8}, DType::F32), h2 = b.input("h2", {4, 8}, DType::F32), w = b.input("w", {11, 8}, DType::F32);
    const ValueId t = b.input("t", {4}, DType::I32), dl = b.input("dl", {4}, DType::F32);
    const ValueId st = b.vocab_stats(h2, w, t, true, false, "stats");
    b.token_logprobs_backward(h, w, t, dl, "d", st);
  });
  EXPECT_NE(other.find("token_logprobs_backward d: stats %"), std::string::npos) << other;
  EXPECT_NE(other.find("not a vocab_stats node of the same h and w"), std::string::npos) << other;
  const std::string no_entropy = message([](Builder& b) {
    const ValueId h = b.input("h", {4, 8}, DType::F32), w = b.input("w", {11, 8}, DType::F32), de = b.input("de", {4}, DType::F32);
    b.entropy_backward(h, w, de, "d", b.vocab_stats(h, w, kNone, false, false));
  });
  EXPECT_NE(no_entropy.find("has no entropy row"), std::string::npos) << no_entropy;
  const std::string keep_f32 = message([](Builder& b) {
    b.vocab_stats(b.input("h", {4, 8}, DType::F32), b.input("w", {11, 8}, DType::F32), kNone, true, true, "stats");
  });
  EXPECT_NE(keep_f32.find("keep_logits keeps bf16 logits, so h and w must be bf16"), std::string::npos) << keep_f32;
}

}  // namespace
}  // namespace trl

// Two-stage programs (graph::Graph::seed_inputs, Program::run_stage): the forward stage returns the per-token
// log-probs, the host computes a loss that is nonlinear in them (a DPO-style -log σ(β·Σ logp) per row) and its
// derivative, and the backward stage, seeded with that derivative, returns that loss's gradients. Checked against
// run() with the same seed (bit for bit), against central finite differences of the nonlinear loss, and for the
// errors a misuse gets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"
#include "trl/backend/backend.h"
#include "trl/backend/registry.h"
#include "trl/core/error.h"
#include "trl/models/causal_lm.h"
#include "trl/train/objectives.h"

namespace trl {
namespace {

constexpr int64_t B = 2, T = 5;
constexpr double kBeta = 0.5;

TensorMap batch_inputs(const CausalLM& model, int64_t rows = B) {
  TensorMap in = model.weights();
  std::vector<int32_t> ids(rows * T), mask(rows * T, 1), labels(rows * T), pos(rows * T);
  for (int64_t i = 0; i < rows * T; ++i) {
    ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 11) % 1000);
    labels[static_cast<size_t>(i)] = static_cast<int32_t>((i * 104729 + 3) % 1000);
    pos[static_cast<size_t>(i)] = static_cast<int32_t>(i % T);
  }
  mask[rows * T - 1] = 0;  // one padding token
  in["input_ids"] = Tensor::from_i32(ids, {rows, T});
  in["attention_mask"] = Tensor::from_i32(mask, {rows, T});
  in["position_ids"] = Tensor::from_i32(pos, {rows, T});
  in["labels"] = Tensor::from_i32(labels, {rows, T});
  return in;
}

// The completion mask of the loss: tokens 1.. of each row (not the padding one).
double completion(int64_t b, int64_t t) { return t >= 1 && !(b == B - 1 && t == T - 1) ? 1.0 : 0.0; }

// L = Σ_b -log σ(β·S_b), S_b = Σ_t completion·logp; returns L and writes dL/dlogp into *seed.
double loss_and_seed(const Tensor& logp, Tensor* seed) {
  double L = 0;
  std::vector<float> w(B * T, 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    double S = 0;
    for (int64_t t = 0; t < T; ++t) S += completion(b, t) * load_element(logp.data(), logp.dtype(), b * T + t);
    L += std::log1p(std::exp(-kBeta * S));                 // -log σ(βS)
    const double dS = -kBeta / (1.0 + std::exp(kBeta * S));  // d/dS of -log σ(βS) = -β σ(-βS)
    for (int64_t t = 0; t < T; ++t) w[static_cast<size_t>(b * T + t)] = static_cast<float>(dS * completion(b, t));
  }
  if (seed) *seed = Tensor::from_f32(w, {B, T});
  return L;
}

TEST(StagedProgram, TheBoundaryIsTheFirstNodeThatReadsTheSeed) {
  const test::TinyModel tiny;
  const graph::Graph g = training_graph(tiny.model, B, T);
  ASSERT_EQ(g.seed_inputs, std::vector<std::string>{"loss_weights"});
  const size_t boundary = graph::stage_boundary(g);
  ASSERT_LT(boundary, g.nodes.size());
  EXPECT_EQ(g.nodes[boundary].op, graph::Op::WeightedSum) << g.nodes[boundary].name;
  EXPECT_LT(static_cast<size_t>(g.outputs[g.output_index("token_logprobs")]), boundary);  // a stage-0 output
  graph::Graph plain = g;
  plain.seed_inputs.clear();
  EXPECT_EQ(graph::stage_boundary(plain), plain.nodes.size());
  EXPECT_NE(plain.key(), g.key());  // the seeds are part of what a program is
}

TEST(StagedProgram, BackwardStageGivesTheGradientOfANonlinearLoss) {
  const test::TinyModel tiny;
  const graph::Graph g = training_graph(tiny.model, B, T);
  const size_t logp_at = g.output_index("token_logprobs"), loss_at = g.output_index("loss");
  const std::string probe = "model.layers.0.self_attn.q_proj.weight";
  const size_t grad_at = g.output_index("grad." + probe);
  for (const std::string& name : {std::string("cpu"), std::string("reference")}) {
    SCOPED_TRACE(name);
    auto backend = make_backend(name);
    auto program = backend->compile(g);
    TensorMap in = batch_inputs(tiny.model);
    // Stage 0 without the seed: the log-probs, nothing of stage 1.
    const std::vector<Tensor> first = program->run_stage(in, 0);
    ASSERT_EQ(first.size(), g.outputs.size());
    EXPECT_EQ(first[loss_at].data(), nullptr) << "the loss belongs to stage 1";
    const Tensor logp = first[logp_at].clone();
    Tensor seed;
    const double L = loss_and_seed(logp, &seed);
    ASSERT_TRUE(std::isfinite(L));
    TensorMap seeds;
    seeds["loss_weights"] = seed;
    const std::vector<Tensor> second = program->run_stage(seeds, 1);
    const Tensor staged_grad = second[grad_at].clone();
    // run() with the same seed computes the same program at once: equal bit for bit.
    in["loss_weights"] = seed;
    const std::vector<Tensor> whole = program->run(in);
    ASSERT_EQ(whole[grad_at].nbytes(), staged_grad.nbytes());
    EXPECT_EQ(std::memcmp(whole[grad_at].data(), staged_grad.data(), staged_grad.nbytes()), 0);
    EXPECT_EQ(std::memcmp(whole[logp_at].data(), logp.data(), logp.nbytes()), 0);
    if (name != "cpu") continue;
    // Central differences of the nonlinear L (f32 forward: a relative 2e-2 is what ε = 1e-2 allows).
    const Tensor& w = tiny.model.weights().at(probe);
    double largest = 0;
    for (int64_t k : {int64_t{0}, w.numel() / 3, w.numel() - 1}) {
      auto L_at = [&](double delta) {
        TensorMap moved = in;
        Tensor p = w.clone();
        store_element(p.mutable_data(), p.dtype(), k, load_element(w.data(), w.dtype(), k) + delta);
        moved[probe] = p;
        return loss_and_seed(program->run_stage(moved, 0)[logp_at].clone(), nullptr);
      };
      const double eps = 1e-2, fd = (L_at(eps) - L_at(-eps)) / (2 * eps);
      const double got = load_element(staged_grad.data(), staged_grad.dtype(), k);
      ASSERT_TRUE(std::isfinite(fd) && std::isfinite(got));
      EXPECT_NEAR(got, fd, 2e-2 * std::fabs(fd) + 1e-4) << probe << "[" << k << "]";
      largest = std::max(largest, std::fabs(fd));
    }
    EXPECT_GT(largest, 1e-3) << "the probed gradient is ~0: the finite-difference check would prove nothing";
  }
}

TEST(StagedProgram, MisuseIsAClearError) {
  const test::TinyModel tiny;
  const graph::Graph g = training_graph(tiny.model, B, T);
  auto shared = make_backend("cpu", BackendOptions{.share_arena = true});
  auto program = shared->compile(g);
  auto other = shared->compile(training_graph(tiny.model, 1, T));
  TensorMap in = batch_inputs(tiny.model);
  TensorMap seeds;
  seeds["loss_weights"] = Tensor::zeros(DType::F32, {B, T});
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(message([&] { program->run_stage(seeds, 1); }).find("needs its stage 0 first"), std::string::npos);
  TensorMap missing = in;
  missing.erase("labels");
  EXPECT_NE(message([&] { program->run_stage(missing, 0); }).find("program input 'labels' (i32 [2, 5]) is not bound"), std::string::npos);
  EXPECT_NE(message([&] { program->run_stage(in, 2); }).find("program stage 2 does not exist"), std::string::npos);
  // Another program of the same shared arena between the stages: its values are gone, and stage 1 says so.
  program->run_stage(in, 0);
  TensorMap one = batch_inputs(tiny.model, 1);
  one["loss_weights"] = Tensor::zeros(DType::F32, {1, T});
  other->run(one);
  const std::string clobbered = message([&] { program->run_stage(seeds, 1); });
  EXPECT_NE(clobbered.find("another program ran on this program's arena between its stage 0 and stage 1"), std::string::npos) << clobbered;
  // A fresh stage 0 makes it whole again.
  program->run_stage(in, 0);
  EXPECT_EQ(message([&] { program->run_stage(seeds, 1); }), "(no error)");
}

}  // namespace
}  // namespace trl

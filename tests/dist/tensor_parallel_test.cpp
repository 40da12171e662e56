// Tensor parallel's collectives as graph ops (graph::Op::AllReduce, Op::AllReduceGrad; docs/DISTRIBUTED.md): a
// SwiGLU MLP split over 2 ranks as Megatron-LM splits it (gate and up by rows of their weights, down by columns,
// all_reduce_grad before and all_reduce after) computes, on every rank, the output, the loss and the input's
// gradient of the whole MLP, and each rank's weight gradients are its slices of the whole ones, on the reference and
// the CPU backends. The ranks run under `mpirun -np 2` (TensorParallel.TwoRanks... starts them).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/rng.h"
#include "graph/autodiff.h"
#include "test_util.h"
#include "trl/backend/backend.h"
#include "trl/backend/registry.h"
#include "trl/core/collectives.h"
#include "trl/dist/communicator.h"
#include "trl/models/causal_lm.h"
#include "trl/models/init.h"
#include "trl/train/objectives.h"

namespace trl {
namespace {

using graph::Builder;
using graph::ValueId;

constexpr int64_t B = 2, T = 3, C = 8, F = 12;  // F splits into 2 × 6 rows
constexpr int32_t kTpGroup = 1;

// Under mpirun the ranks end MPI after their tests (mpirun reports a rank that exits without it as failed).
class FinalizeMpi : public ::testing::Environment {
 public:
  void TearDown() override { dist::finalize(); }
};
[[maybe_unused]] const auto* const kFinalizeMpi = ::testing::AddGlobalTestEnvironment(new FinalizeMpi);

Tensor random(SplitMix64& rng, const Shape& shape) {
  Tensor t = Tensor::zeros(DType::F32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data_as<float>()[i] = static_cast<float>(rng.normal() * 0.5);
  return t;
}

// Rows [r0, r0 + n) of a [R, K] tensor; columns [c0, c0 + n) of an [R, K] tensor.
Tensor rows_of(const Tensor& w, int64_t r0, int64_t n) { return w.slice_flat(r0 * w.size(1), {n, w.size(1)}).clone(); }
Tensor cols_of(const Tensor& w, int64_t c0, int64_t n) {
  Tensor out = Tensor::zeros(DType::F32, {w.size(0), n});
  for (int64_t r = 0; r < w.size(0); ++r)
    for (int64_t c = 0; c < n; ++c) out.mutable_data_as<float>()[r * n + c] = w.data_as<float>()[r * w.size(1) + c0 + c];
  return out;
}

// y = down · swiglu(gate · x, up · x), loss = Σ y·r; outputs y, loss, dx, dgate, dup, ddown. With `tp`, the weights
// are one rank's slices and the collectives of group kTpGroup join the ranks.
graph::Graph mlp(int64_t f, bool tp) {
  Builder b;
  ValueId x = b.input("x", {B, T, C}, DType::F32);
  const ValueId gate = b.input("gate", {f, C}, DType::F32), up = b.input("up", {f, C}, DType::F32), down = b.input("down", {C, f}, DType::F32);
  const ValueId r = b.input("r", {B, T, C}, DType::F32);
  if (tp) x = b.all_reduce_grad(x, kTpGroup, "tp_in");
  const ValueId h = b.swiglu(b.matmul(x, gate, graph::kNone, DType::F32), b.matmul(x, up, graph::kNone, DType::F32));
  ValueId y = b.matmul(h, down, graph::kNone, DType::F32);
  if (tp) y = b.all_reduce(y, kTpGroup, "tp_out");
  const ValueId loss = b.weighted_sum(y, r);
  const auto d = graph::add_backward(b, loss, {"x", "gate", "up", "down"}, DType::F32);
  b.output(y, "y");
  b.output(loss, "loss");
  for (const char* n : {"x", "gate", "up", "down"}) b.output(d.at(n), std::string("d") + n);
  return b.finish();
}

// Largest |a − b| relative to the largest |b| (NaN propagates into a failure).
double rel_error(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double worst = 0, scale = 1e-30;
  for (int64_t i = 0; i < b.numel(); ++i) {
    worst = test::nan_max(worst, std::fabs(static_cast<double>(a.data_as<float>()[i]) - b.data_as<float>()[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b.data_as<float>()[i])));
  }
  return worst / scale;
}

TEST(TensorParallelRanks, ColumnThenRowParallelMlpEqualsTheWholeMlp) {
  if (!dist::launched_by_mpi() || dist::world().size() != 2) GTEST_SKIP() << "runs as 2 ranks under mpirun (TensorParallel.TwoRanks...)";
  dist::Communicator& w = dist::world();
  set_collective_group(kTpGroup, [&w](void* data, int64_t n, DType dtype) { w.all_reduce(data, n, dtype, dist::ReduceOp::Sum); });
  SplitMix64 rng(7);  // the same whole weights and inputs on both ranks
  TensorMap whole{{"x", random(rng, {B, T, C})}, {"gate", random(rng, {F, C})}, {"up", random(rng, {F, C})}, {"down", random(rng, {C, F})},
                  {"r", random(rng, {B, T, C})}};
  const int64_t f = F / 2, r0 = w.rank() * f;
  TensorMap mine = whole;
  mine["gate"] = rows_of(whole.at("gate"), r0, f), mine["up"] = rows_of(whole.at("up"), r0, f), mine["down"] = cols_of(whole.at("down"), r0, f);
  for (const char* backend : {"reference", "cpu"}) {
    SCOPED_TRACE(backend);
    const graph::Graph gw = mlp(F, false), gt = mlp(f, true);
    const std::vector<Tensor> want = make_backend(backend)->compile(gw)->run(whole);
    const std::vector<Tensor> got = make_backend(backend)->compile(gt)->run(mine);
    auto at = [](const graph::Graph& g, const std::vector<Tensor>& v, const char* name) { return v.at(g.output_index(name)); };
    for (const char* name : {"y", "loss", "dx"}) EXPECT_LE(rel_error(at(gt, got, name), at(gw, want, name)), 1e-5) << name;
    EXPECT_LE(rel_error(at(gt, got, "dgate"), rows_of(at(gw, want, "dgate"), r0, f)), 1e-5);
    EXPECT_LE(rel_error(at(gt, got, "dup"), rows_of(at(gw, want, "dup"), r0, f)), 1e-5);
    EXPECT_LE(rel_error(at(gt, got, "ddown"), cols_of(at(gw, want, "ddown"), r0, f)), 1e-5);
    // Without the collectives a rank has only its part: the test would see it.
    EXPECT_GT(rel_error(at(gt, got, "dx"), Tensor::zeros(DType::F32, {B, T, C})), 0.0);
  }
  set_collective_group(kTpGroup, nullptr);
}

// The tiny Qwen3 (4 heads, 2 kv heads, ffn 128) split over 2 ranks: its forward pass gives each rank its columns of
// the whole model's logits, and its training step gives the whole model's loss,
// per-token log-probs, entropy and argmax match on every rank, the whole gradient of every parameter held whole,
// and each split parameter's gradient slice (the tied embedding / lm_head by vocabulary rows: ids and labels fall
// in both ranks' halves). q_norm and k_norm act on each rank's own heads; their weights pass through
// all_reduce_grad, so their gradients too are whole on every rank.
TEST(TensorParallelRanks, TinyQwen3TrainingStepEqualsTheWholeModel) {
  if (!dist::launched_by_mpi() || dist::world().size() != 2) GTEST_SKIP() << "runs as 2 ranks under mpirun (TensorParallel.TwoRanks...)";
  dist::Communicator& w = dist::world();
  set_collective_group(kTpGroup, [&w](void* data, int64_t n, DType dtype) { w.all_reduce(data, n, dtype, dist::ReduceOp::Sum); });
  const ModelConfig config = preset_config("tiny", DType::F32);
  const CausalLM whole = CausalLM::from_weights(config, init_weights(config, DType::F32, 5, 0.05, /*randomize_norms=*/true));
  const TensorParallel tp{2, w.rank(), kTpGroup};
  const CausalLM shard = whole.tensor_parallel_shard(tp);
  constexpr int64_t Bt = 2, Tt = 8;
  SplitMix64 rng(11);
  Tensor ids = Tensor::zeros(DType::I32, {Bt, Tt}), labels = Tensor::zeros(DType::I32, {Bt, Tt}), mask = Tensor::zeros(DType::I32, {Bt, Tt});
  Tensor weights = Tensor::zeros(DType::F32, {Bt, Tt});
  for (int64_t i = 0; i < Bt * Tt; ++i) {
    ids.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(config.vocab_size));
    labels.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(config.vocab_size));
    mask.mutable_data_as<int32_t>()[i] = i % Tt < 6 || i < Tt ? 1 : 0;  // the second row ends in padding
    weights.mutable_data_as<float>()[i] = -static_cast<float>(mask.data_as<int32_t>()[i]) / 14.0f;
  }
  auto inputs = [&](const CausalLM& m) {
    TensorMap in = m.weights();
    in["input_ids"] = ids, in["labels"] = labels, in["attention_mask"] = mask, in["position_ids"] = default_position_ids(mask);
    in["loss_weights"] = weights;
    return in;
  };
  // The last row's last labels are the whole model's argmax (so that some tokens match).
  {
    Builder b;
    b.output(b.reshape(whole.build_forward(b, Bt, Tt), {Bt * Tt, config.vocab_size}), "logits");
    const graph::Graph fg = b.finish();
    const std::vector<float> logits = make_backend("cpu")->compile(fg)->run(inputs(whole)).at(0).to_f32_vector();
    for (int64_t i = Bt * Tt - 3; i < Bt * Tt; ++i) {
      const auto row = logits.begin() + i * config.vocab_size;
      labels.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(std::max_element(row, row + config.vocab_size) - row);
    }
  }
  // The forward pass's logits: each rank's are its columns of the whole model's (rows of the vocabulary r·V/2 on).
  {
    const graph::Graph fw = whole.forward_graph(Bt, Tt), fs = shard.forward_graph(Bt, Tt);
    TensorMap wi = inputs(whole), si = inputs(shard);
    const Tensor all = make_backend("cpu")->compile(fw)->run(wi).at(0), mine = make_backend("cpu")->compile(fs)->run(si).at(0);
    const int64_t part = config.vocab_size / 2;
    ASSERT_EQ(mine.shape(), (Shape{Bt, Tt, part}));
    const Tensor expect = cols_of(all.reshape({Bt * Tt, config.vocab_size}), w.rank() * part, part);
    EXPECT_LE(rel_error(mine.reshape({Bt * Tt, part}), expect), 1e-5);
  }
  const graph::Graph gw = training_graph(whole, {.batch = Bt, .tokens = Tt, .metrics = true});
  const graph::Graph gs = training_graph(shard, {.batch = Bt, .tokens = Tt, .metrics = true});
  EXPECT_NE(gs.dump().find("all_reduce_grad"), std::string::npos);
  const std::vector<Tensor> want = make_backend("cpu")->compile(gw)->run(inputs(whole));
  const std::vector<Tensor> got = make_backend("cpu")->compile(gs)->run(inputs(shard));
  auto at = [](const graph::Graph& g, const std::vector<Tensor>& v, const std::string& name) { return v.at(g.output_index(name)); };
  EXPECT_LE(rel_error(at(gs, got, "loss"), at(gw, want, "loss")), 1e-5);
  EXPECT_LE(rel_error(at(gs, got, "token_logprobs"), at(gw, want, "token_logprobs")), 1e-5);
  EXPECT_LE(rel_error(at(gs, got, "entropy"), at(gw, want, "entropy")), 1e-5);
  EXPECT_EQ(at(gs, got, "token_accuracy").to_f32_vector(), at(gw, want, "token_accuracy").to_f32_vector());
  float matched = 0;
  for (float m : at(gw, want, "token_accuracy").to_f32_vector()) matched += m;
  EXPECT_GE(matched, 3.0f);
  int split = 0;
  for (const auto& [name, wt] : whole.weights()) {
    Tensor g = at(gs, got, "grad." + name).clone();
    const Tensor expect = tensor_parallel_slice(name, at(gw, want, "grad." + name), tp);
    EXPECT_EQ(g.shape(), expect.shape()) << name;
    EXPECT_LE(rel_error(g, expect), 1e-4) << name;
    split += tensor_parallel_axis(name) >= 0;
  }
  EXPECT_EQ(split, 2 * 7 + 1);  // 2 layers × q, k, v, o, gate, up, down; the tied embedding
  set_collective_group(kTpGroup, nullptr);
}

// The vocabulary ops over a head split between 2 ranks (graph::VocabSplit: rows [6r, 6r + 6) of 12): token_logprobs,
// entropy and token_argmax_match equal the whole head's on every rank, and their backward gives each rank its rows
// of dw and, through all_reduce_grad, the whole dh; on both backends, in f32 and (CPU, with the fused pass keeping
// bf16 logits) bf16. Targets fall in both halves; some are the argmax, and one row ties across the ranks (the first
// index, on rank 0, wins), one within rank 1.
TEST(TensorParallelRanks, VocabularyParallelOpsEqualTheWholeVocabulary) {
  if (!dist::launched_by_mpi() || dist::world().size() != 2) GTEST_SKIP() << "runs as 2 ranks under mpirun (TensorParallel.TwoRanks...)";
  dist::Communicator& w = dist::world();
  set_collective_group(kTpGroup, [&w](void* data, int64_t n, DType dtype) { w.all_reduce(data, n, dtype, dist::ReduceOp::Sum); });
  constexpr int64_t R = 6, Cv = 4, V = 12, part = V / 2;
  SplitMix64 rng(21);
  Tensor h = random(rng, {R, Cv}), head = random(rng, {V, Cv});
  // Row 0's logits tie between vocabulary rows 2 (rank 0) and 8 (rank 1); row 1's between 7 and 9 (both rank 1).
  for (int64_t c = 0; c < Cv; ++c) {
    head.mutable_data_as<float>()[8 * Cv + c] = head.mutable_data_as<float>()[2 * Cv + c] = 3.0f * (c == 0 ? 1.0f : 0.0f);
    head.mutable_data_as<float>()[7 * Cv + c] = head.mutable_data_as<float>()[9 * Cv + c] = 4.0f * (c == 1 ? 1.0f : 0.0f);
  }
  h.mutable_data_as<float>()[0] = 5.0f, h.mutable_data_as<float>()[Cv + 1] = 5.0f;  // make those the rows' maxima
  const Tensor targets = Tensor::from_i32(std::vector<int32_t>{2, 7, 11, 0, 6, 5}, {R});
  const Tensor dlogp = random(rng, {R}), dent = random(rng, {R});
  auto program = [&](int64_t v, DType dt, const graph::VocabSplit& split) {
    Builder b;
    ValueId hh = b.input("h", {R, Cv}, dt);
    const ValueId ww = b.input("w", {v, Cv}, dt), tt = b.input("t", {R}, DType::I32);
    if (split.split()) hh = b.all_reduce_grad(hh, kTpGroup, "h.tp_in");
    const ValueId logp = b.token_logprobs(hh, ww, tt, "logp", split), ent = b.entropy(hh, ww, "ent", split);
    const ValueId match = b.token_argmax_match(hh, ww, tt, "match", split);
    const ValueId loss = b.add(b.weighted_sum(logp, b.input("a", {R}, DType::F32)), b.weighted_sum(ent, b.input("c", {R}, DType::F32)));
    const auto d = graph::add_backward(b, loss, {"h", "w"}, DType::F32);
    b.output(logp, "logp"), b.output(ent, "ent"), b.output(match, "match"), b.output(d.at("h"), "dh"), b.output(d.at("w"), "dw");
    return b.finish();
  };
  const int r = w.rank();
  for (const DType dt : {DType::F32, DType::BF16}) {
    for (const char* backend : {"reference", "cpu"}) {
      if (dt == DType::BF16 && std::string(backend) == "reference") continue;
      SCOPED_TRACE(fmt::format("{} {}", backend, dtype_name(dt)));
      const graph::Graph gw = program(V, dt, {}), gs = program(part, dt, graph::VocabSplit{kTpGroup, r * part, V});
      auto bind = [&](const Tensor& wt) {
        return TensorMap{{"h", h.to(dt)}, {"w", wt.to(dt)}, {"t", targets}, {"a", dlogp}, {"c", dent}};
      };
      const std::vector<Tensor> want = make_backend(backend)->compile(gw)->run(bind(head));
      const std::vector<Tensor> got = make_backend(backend)->compile(gs)->run(bind(rows_of(head, r * part, part)));
      auto at = [](const graph::Graph& g, const std::vector<Tensor>& v, const char* name) { return v.at(g.output_index(name)).to(DType::F32); };
      const double tol = dt == DType::F32 ? 1e-5 : 1e-2;
      for (const char* name : {"logp", "ent", "dh"}) EXPECT_LE(rel_error(at(gs, got, name), at(gw, want, name)), tol) << name;
      EXPECT_LE(rel_error(at(gs, got, "dw"), rows_of(at(gw, want, "dw"), r * part, part)), tol);
      EXPECT_EQ(at(gs, got, "match").to_f32_vector(), at(gw, want, "match").to_f32_vector());
      EXPECT_EQ(at(gw, want, "match").to_f32_vector()[0], 1.0f) << "row 0: target 2 is the first of the tied maxima";
      EXPECT_EQ(at(gw, want, "match").to_f32_vector()[1], 1.0f) << "row 1: target 7 is the first of the tied maxima";
    }
  }
  // A split head's targets are of the whole vocabulary: one past it is an error.
  const graph::Graph bad = program(part, DType::F32, graph::VocabSplit{kTpGroup, r * part, V});
  const std::string e = test::error_of([&] {
    make_backend("cpu")->compile(bad)->run(TensorMap{{"h", h}, {"w", rows_of(head, r * part, part)}, {"t", Tensor::from_i32(std::vector<int32_t>(R, 12), {R})},
                                                      {"a", dlogp}, {"c", dent}});
  });
  EXPECT_NE(e.find("target 12 at row 0 is outside the vocabulary [0, 12)"), std::string::npos) << e;
  set_collective_group(kTpGroup, nullptr);
}

TEST(TensorParallel, TwoRanksComputeTheWholeMlpWithCollectiveOps) {
  if (test::run_command("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin)";
  std::string out;
  const std::string cmd = fmt::format(
      "{}timeout 300 mpirun -np 2 --bind-to none {} --gtest_filter=TensorParallelRanks.* --gtest_color=no 2>&1", test::mpirun_env(),
      test::self_executable());
  ASSERT_EQ(test::run_command(cmd, &out), 0) << cmd << "\n" << out;
  // Both ranks ran both tests (none skipped).
  size_t passed = 0;
  for (size_t at = out.find("[  PASSED  ] 3 tests."); at != std::string::npos; at = out.find("[  PASSED  ] 3 tests.", at + 1)) ++passed;
  EXPECT_EQ(passed, 2u) << out;
  EXPECT_EQ(out.find("SKIPPED"), std::string::npos) << out;
}

// One process: the ops call the registered group (a stand-in that doubles: two ranks holding the same x) on both
// backends, and a program that names a group nobody registered fails with what to do.
TEST(TensorParallel, AllReduceCallsItsGroupAndAnUnknownGroupIsAnError) {
  set_collective_group(77, [](void* data, int64_t n, DType) {
    for (int64_t i = 0; i < n; ++i) static_cast<float*>(data)[i] *= 2;
  });
  Builder b;
  const ValueId x = b.input("x", {5}, DType::F32);
  b.output(b.all_reduce(x, 77), "sum");
  b.output(b.all_reduce_grad(x, 77), "same");
  const graph::Graph g = b.finish();
  const Tensor in = Tensor::from_f32(std::vector<float>{1, -2, 3, 0.5f, 7}, {5});
  for (const char* backend : {"reference", "cpu"}) {
    const std::vector<Tensor> r = make_backend(backend)->compile(g)->run({{"x", in}});
    EXPECT_EQ(r.at(0).to_f32_vector(), (std::vector<float>{2, -4, 6, 1, 14})) << backend;
    EXPECT_EQ(r.at(1).to_f32_vector(), in.to_f32_vector()) << backend;
  }
  set_collective_group(77, nullptr);
  const std::string e = test::error_of([&] { make_backend("cpu")->compile(g)->run({{"x", in}}); });
  EXPECT_NE(e.find("collective group 77 is not registered"), std::string::npos) << e;
}

// The split of each parameter, and a tp_size the model's heads do not divide by.
TEST(TensorParallel, ParametersSplitByRowsOrColumnsAndBadSizesAreErrors) {
  EXPECT_EQ(tensor_parallel_axis("model.layers.3.self_attn.k_proj.weight"), 0);
  EXPECT_EQ(tensor_parallel_axis("model.layers.3.mlp.up_proj.weight"), 0);
  EXPECT_EQ(tensor_parallel_axis("model.layers.3.self_attn.o_proj.weight"), 1);
  EXPECT_EQ(tensor_parallel_axis("model.layers.3.mlp.down_proj.weight"), 1);
  EXPECT_EQ(tensor_parallel_axis("model.embed_tokens.weight"), 0);  // vocabulary parallel
  EXPECT_EQ(tensor_parallel_axis("lm_head.weight"), 0);
  for (const char* whole : {"model.layers.0.self_attn.q_norm.weight", "model.norm.weight", "model.layers.1.input_layernorm.weight"})
    EXPECT_EQ(tensor_parallel_axis(whole), -1) << whole;
  const Tensor w = Tensor::from_f32(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}, {2, 4});
  EXPECT_EQ(tensor_parallel_slice("x.o_proj.weight", w, {2, 1, 0}).to_f32_vector(), (std::vector<float>{2, 3, 6, 7}));
  EXPECT_EQ(tensor_parallel_slice("x.q_proj.weight", w, {2, 1, 0}).to_f32_vector(), (std::vector<float>{4, 5, 6, 7}));
  const ModelConfig config = preset_config("tiny", DType::F32);
  const CausalLM whole = CausalLM::from_weights(config, init_weights(config, DType::F32, 5, 0.02, false));
  const std::string e = test::error_of([&] { whole.tensor_parallel_shard({3, 0, 0}); });
  EXPECT_NE(e.find("num_attention_heads (4) does not divide by it"), std::string::npos) << e;
}

}  // namespace
}  // namespace trl

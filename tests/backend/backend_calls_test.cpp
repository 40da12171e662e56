// The table of Backend's calls between programs (what a trainer runs on the tensors in a backend's memory outside
// the compiled programs: gradient accumulation, the global norm, clipping, data parallel's all-reduce, the AdamW
// step, TR-DPO's mixing, allocation, zeroing and copying whole tensors or rows, DPO's per-sequence sums, GRPO's and
// RLOO's per-token loss and generate()'s choice of the next tokens), in the op table's manner: each call has cases with their edges (sizes 1, 7 and
// 4099 — a tail after the 16- and 8-lane groups —, NaN and Inf, zero, a factor of exactly 1, fresh and stored
// moments, with and without the bf16 compute copy, mixing into f32 and bf16 at alpha 0 and 1), run on every backend
// under test and on the stand-in device ("reference-device"), and compared with the reference backend bit for bit:
// every backend runs the same f32 operations in the same order.
//
// A new call: add it to Call and call_name(); BackendCalls.EveryCallHasCases fails until it has cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/rng.h"
#include "trl/backend/backend.h"
#include "test_util.h"
#include "trl/backend/registry.h"
#include "trl/dist/communicator.h"

namespace trl {
namespace {

enum class Call { Allocate, Zero, Copy, CopyRows, Accumulate, SumOfSquares, Scale, AllReduce, AdamWStep, Mix, Sample, SpanSums, PolicyLoss, kCount };

const char* call_name(Call c) {
  switch (c) {
    case Call::Allocate: return "allocate";
    case Call::Zero: return "zero";
    case Call::Copy: return "copy";
    case Call::CopyRows: return "copy_rows";
    case Call::Accumulate: return "accumulate";
    case Call::SumOfSquares: return "sum_of_squares";
    case Call::Scale: return "scale";
    case Call::AllReduce: return "all_reduce";
    case Call::AdamWStep: return "adamw_step";
    case Call::Mix: return "mix";
    case Call::Sample: return "sample";
    case Call::SpanSums: return "span_sums";
    case Call::PolicyLoss: return "policy_loss";
    case Call::kCount: break;
  }
  return "?";
}

// A case uploads its host inputs through `up`, makes the call on the backend, and returns what the host reads back
// (downloaded through `down`): tensors, and scalars as an f64 tensor.
using Up = std::function<Tensor(const Tensor&)>;
using Down = std::function<Tensor(const Tensor&)>;
struct CallCase {
  Call call;
  std::string name;
  std::function<std::vector<Tensor>(Backend&, const Up&, const Down&)> run;
  bool non_finite = false;  // the reference's results hold NaN or Inf on purpose (they must match there)
};
// gtest prints a failing case's parameter by its name, not its bytes.
void PrintTo(const CallCase& c, std::ostream* os) { *os << call_name(c.call) << " " << c.name; }

Tensor random_f32(int64_t n, uint64_t seed, float scale = 1.0f) {
  SplitMix64 rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = scale * static_cast<float>(rng.normal());
  return Tensor::from_f32(v, {n});
}
Tensor with(Tensor t, int64_t i, float value) {
  t.mutable_data_as<float>()[i] = value;
  return t;
}
Tensor i32_values(const std::vector<int32_t>& v) { return Tensor::from_i32(v, {static_cast<int64_t>(v.size())}); }
Tensor f64_values(const std::vector<double>& v) {
  Tensor t = Tensor::zeros(DType::F64, {static_cast<int64_t>(v.size())});
  if (!v.empty()) std::memcpy(t.mutable_data(), v.data(), v.size() * sizeof(double));
  return t;
}

std::vector<CallCase> call_table() {
  std::vector<CallCase> table;
  // allocate: the shape and dtype asked for, in the backend's own memory.
  table.push_back({Call::Allocate, "f32_7x3", [](Backend& b, const Up&, const Down&) {
                     const Tensor t = b.allocate(DType::F32, {7, 3}, "moments");
                     EXPECT_EQ(t.is_device(), !b.host_memory());
                     return std::vector<Tensor>{f64_values({static_cast<double>(t.shape()[0]), static_cast<double>(t.shape()[1]), static_cast<double>(t.dtype())})};
                   }});
  // zero and copy: every byte, any dtype; a copy is its own memory (writing the source afterwards leaves it).
  for (DType dt : {DType::F32, DType::BF16, DType::I32}) {
    table.push_back({Call::Zero, std::string(dtype_name(dt)), [dt](Backend& b, const Up& up, const Down& down) {
                       Tensor t = up(random_f32(4099, 50).to(dt == DType::I32 ? DType::F32 : dt));
                       if (dt == DType::I32) t = up(Tensor::from_i32(std::vector<int32_t>(129, -7), {129}));
                       b.zero(t);
                       return std::vector<Tensor>{down(t)};
                     }});
    table.push_back({Call::Copy, std::string(dtype_name(dt)), [dt](Backend& b, const Up& up, const Down& down) {
                       Tensor src = up(dt == DType::I32 ? Tensor::from_i32(std::vector<int32_t>(129, 5), {129}) : random_f32(4099, 51).to(dt));
                       const Tensor copy = b.copy(src, "copy");
                       EXPECT_EQ(copy.is_device(), !b.host_memory());
                       b.zero(src);  // the copy keeps its bytes
                       return std::vector<Tensor>{down(copy), down(src)};
                     }});
  }
  // copy_rows: rows gathered (a row twice, in any order) and scattered into a tensor whose other rows stay; any dtype
  // and row shape.
  for (DType dt : {DType::F32, DType::BF16, DType::I32}) {
    table.push_back({Call::CopyRows, "gather_" + std::string(dtype_name(dt)), [dt](Backend& b, const Up& up, const Down& down) {
                       const Tensor src = up(random_f32(6 * 3 * 5, 52, 4.0f).to(dt == DType::I32 ? DType::F32 : dt).reshape({6, 3, 5}));
                       const Tensor ints = up(Tensor::from_i32(std::vector<int32_t>(6 * 15, 3), {6, 3, 5}));
                       Tensor dst = b.allocate(dt, {4, 3, 5}, "gathered");
                       b.copy_rows(dt == DType::I32 ? ints : src, {5, 0, 5, 2}, dst, {0, 1, 2, 3});
                       return std::vector<Tensor>{down(dst)};
                     }});
  }
  table.push_back({Call::CopyRows, "scatter_keeps_the_other_rows", [](Backend& b, const Up& up, const Down& down) {
                     Tensor dst = up(random_f32(7 * 9, 53).reshape({7, 9}));
                     b.copy_rows(up(random_f32(2 * 9, 54).reshape({2, 9})), {1, 0}, dst, {6, 2});
                     b.copy_rows(up(random_f32(2 * 9, 55).reshape({2, 9})), {}, dst, {});  // no rows: nothing
                     return std::vector<Tensor>{down(dst)};
                   }});
  for (int64_t n : {1, 7, 4099}) {
    const std::string size = fmt::format("n{}", n);
    table.push_back({Call::Accumulate, "first_" + size, [n](Backend& b, const Up& up, const Down& down) {
                       Tensor acc = b.allocate(DType::F32, {n}, "acc");
                       b.accumulate(acc, up(random_f32(n, 1)), /*first=*/true);
                       return std::vector<Tensor>{down(acc)};
                     }});
    table.push_back({Call::Accumulate, "sum_of_three_" + size, [n](Backend& b, const Up& up, const Down& down) {
                       Tensor acc = b.allocate(DType::F32, {n}, "acc");
                       for (uint64_t k = 0; k < 3; ++k) b.accumulate(acc, up(random_f32(n, 10 + k)), /*first=*/k == 0);
                       return std::vector<Tensor>{down(acc)};
                     }});
    table.push_back({Call::SumOfSquares, "three_tensors_" + size, [n](Backend& b, const Up& up, const Down&) {
                       return std::vector<Tensor>{f64_values(b.sum_of_squares({up(random_f32(n, 2)), up(random_f32(n + 3, 3)), up(random_f32(1, 4))}, {}))};
                     }});
    table.push_back({Call::SumOfSquares, "two_groups_" + size, [n](Backend& b, const Up& up, const Down&) {
                       return std::vector<Tensor>{
                           f64_values(b.sum_of_squares({up(random_f32(n, 2)), up(random_f32(n + 3, 3)), up(random_f32(1, 4)), up(random_f32(n, 5))}, {1, 0, 1, 1}))};
                     }});
    table.push_back({Call::Scale, "half_" + size, [n](Backend& b, const Up& up, const Down& down) {
                       std::vector<Tensor> xs = {up(random_f32(n, 5)), up(random_f32(2 * n, 6))};
                       b.scale(xs, 0.5f);
                       return std::vector<Tensor>{down(xs[0]), down(xs[1])};
                     }});
  }
  table.push_back({Call::Accumulate, "nan_and_inf_propagate", [](Backend& b, const Up& up, const Down& down) {
                     Tensor acc = up(with(random_f32(33, 7), 3, NAN));
                     b.accumulate(acc, up(with(random_f32(33, 8), 20, INFINITY)), /*first=*/false);
                     return std::vector<Tensor>{down(acc)};
                   },
                   /*non_finite=*/true});
  table.push_back({Call::SumOfSquares, "zero_and_empty_list", [](Backend& b, const Up& up, const Down&) {
                     const std::vector<double> zero = b.sum_of_squares({up(Tensor::zeros(DType::F32, {9}))}, {});
                     EXPECT_EQ(zero.at(0), 0.0);  // a zero gradient: a zero norm, exactly
                     EXPECT_TRUE(b.sum_of_squares({}, {}).empty());
                     return std::vector<Tensor>{f64_values(zero)};
                   }});
  table.push_back({Call::SumOfSquares, "nan_and_inf", [](Backend& b, const Up& up, const Down&) {
                     return std::vector<Tensor>{f64_values(b.sum_of_squares({up(with(random_f32(17, 9), 4, NAN)), up(with(random_f32(17, 9), 4, -INFINITY))}, {}))};
                   },
                   /*non_finite=*/true});
  table.push_back({Call::Scale, "by_exactly_one_keeps_the_bits", [](Backend& b, const Up& up, const Down& down) {
                     const Tensor h = random_f32(4099, 11);
                     std::vector<Tensor> xs = {up(h)};
                     b.scale(xs, 1.0f);
                     const Tensor got = down(xs[0]);
                     EXPECT_EQ(std::memcmp(got.data(), h.data(), h.nbytes()), 0);
                     return std::vector<Tensor>{got};
                   }});
  // all_reduce over this process's own world (one rank: the sum is the tensor itself): small tensors packed into one
  // bucket and unpacked, each back in its own place, whatever its size.
  table.push_back({Call::AllReduce, "one_rank_keeps_every_tensor", [](Backend& b, const Up& up, const Down& down) {
                     const std::vector<Tensor> host = {random_f32(1, 90), random_f32(4099, 91), random_f32(7, 92), random_f32(129, 93)};
                     std::vector<Tensor> xs;
                     for (const Tensor& h : host) xs.push_back(up(h));
                     b.all_reduce(xs, dist::world());
                     std::vector<Tensor> out;
                     for (size_t k = 0; k < xs.size(); ++k) {
                       out.push_back(down(xs[k]));
                       EXPECT_EQ(std::memcmp(out.back().data(), host[k].data(), host[k].nbytes()), 0) << "tensor " << k;
                     }
                     return out;
                   }});
  // adamw_step: two steps (fresh moments, then stored ones), with weight decay, the bf16 copy or not.
  struct Adam {
    std::string name;
    int64_t n;
    bool compute;
    float nan_at;  // < 0: none
  };
  for (const Adam& a : {Adam{"n1_f32", 1, false, -1}, Adam{"n7_bf16_copy", 7, true, -1}, Adam{"n4099_f32", 4099, false, -1},
                        Adam{"n4099_bf16_copy", 4099, true, -1}, Adam{"nan_gradient", 4099, true, 1000}}) {
    table.push_back({Call::AdamWStep, a.name, [a](Backend& b, const Up& up, const Down& down) {
                       Tensor w = up(random_f32(a.n, 20)), m = b.allocate(DType::F32, {a.n}, "m"), v = b.allocate(DType::F32, {a.n}, "v");
                       Tensor c = a.compute ? up(Tensor::zeros(DType::BF16, {a.n})) : Tensor();
                       for (int t = 1; t <= 2; ++t) {
                         Tensor g = random_f32(a.n, 30 + static_cast<uint64_t>(t), 0.01f);
                         if (a.nan_at >= 0) g = with(g, static_cast<int64_t>(a.nan_at), NAN);
                         Backend::AdamWStep s;
                         s.keep = 1.0f - 1e-3f * 0.01f, s.step_size = static_cast<float>(1e-3 / (1 - std::pow(0.9, t)));
                         s.inv_sqrt_bc2 = static_cast<float>(1 / std::sqrt(1 - std::pow(0.999, t))), s.fresh = t == 1;
                         b.adamw_step(up(g), m, v, w, a.compute ? &c : nullptr, s);
                       }
                       std::vector<Tensor> out = {down(w), down(m), down(v)};
                       if (a.compute) out.push_back(down(c));
                       return out;
                     },
                     /*non_finite=*/a.nan_at >= 0});
  }
  // mix: TR-DPO's alpha · policy + (1 - alpha) · reference, into the reference's dtype; alpha 0 keeps the reference.
  struct Mix {
    std::string name;
    DType target, source;
    float alpha;
  };
  for (const Mix& x : {Mix{"f32_from_f32", DType::F32, DType::F32, 0.3f}, Mix{"bf16_from_f32", DType::BF16, DType::F32, 0.5f},
                       Mix{"bf16_from_bf16", DType::BF16, DType::BF16, 0.9f}, Mix{"alpha_0_keeps_the_target", DType::BF16, DType::F32, 0.0f},
                       Mix{"alpha_1_takes_the_source", DType::F32, DType::F32, 1.0f}, Mix{"f16_from_f32", DType::F16, DType::F32, 0.25f}}) {
    table.push_back({Call::Mix, x.name, [x](Backend& b, const Up& up, const Down& down) {
                       const Tensor target = random_f32(4099, 40).to(x.target), source = random_f32(4099, 41).to(x.source);
                       const Tensor got = down(b.mix(up(target), up(source), x.alpha, "model.norm.weight"));
                       EXPECT_EQ(got.dtype(), x.target);
                       if (x.alpha == 0.0f) {
                         EXPECT_EQ(std::memcmp(got.data(), target.data(), target.nbytes()), 0);
                       }
                       if (x.alpha == 1.0f) {
                         EXPECT_EQ(std::memcmp(got.data(), source.data(), source.nbytes()), 0);
                       }
                       return std::vector<Tensor>{got};
                     }});
  }
  // sample: generate()'s next token per row where the logits are. Rows picked by stride and offset (the last position
  // of [B, T, V]), f32 and bf16 logits, greedy ties (the first maximum), every processor with draws at 0 and just
  // below 1, a row masked to one token and a row masked entirely (-inf everywhere gives 0).
  struct Sample {
    std::string name;
    DType dtype;
    bool do_sample;
    float repetition_penalty;
  };
  for (const Sample& x : {Sample{"greedy_f32", DType::F32, false, 1.0f}, Sample{"greedy_bf16_repetition_penalty", DType::BF16, false, 1.7f},
                          Sample{"every_processor_f32", DType::F32, true, 1.3f}, Sample{"every_processor_bf16", DType::BF16, true, 1.0f}}) {
    table.push_back({Call::Sample, x.name, [x](Backend& b, const Up& up, const Down&) {
                       const int64_t B = 5, T = 3, V = 37;  // logits [B, T, V]; row b's scores at position T - 1
                       Tensor logits = random_f32(B * T * V, 60, 3.0f).reshape({B, T, V});
                       float* l = logits.mutable_data_as<float>();
                       l[(0 * T + 2) * V + 4] = l[(0 * T + 2) * V + 9] = 50.0f;  // a tie at the top: 4 comes first
                       for (int64_t v = 0; v < V; ++v) l[(3 * T + 2) * V + v] = v == 11 ? 0.5f : -INFINITY;  // one token left
                       for (int64_t v = 0; v < V; ++v) l[(4 * T + 2) * V + v] = -INFINITY;                   // none
                       std::vector<int32_t> ctx(static_cast<size_t>(B * 6));
                       for (size_t i = 0; i < ctx.size(); ++i) ctx[i] = static_cast<int32_t>((i * 7) % V);
                       const Tensor context = up(Tensor::from_i32(ctx, {B, 6}));
                       Backend::SampleRequest r;
                       r.rows = B, r.row_stride = T, r.row_offset = T - 1;
                       r.params.do_sample = x.do_sample, r.params.repetition_penalty = x.repetition_penalty;
                       r.params.temperature = 0.7f, r.params.top_k = 20, r.params.top_p = 0.9f, r.params.min_p = 0.01f;
                       r.uniforms = {0.0, 0.5, 1.0 - 0x1.0p-53, 0.25, 0.75};
                       r.context = &context;
                       const std::vector<int32_t> ids = b.sample(up(logits.to(x.dtype)), r);
                       EXPECT_EQ(ids.at(3), 11);
                       EXPECT_EQ(ids.at(4), 0);
                       if (!x.do_sample && x.repetition_penalty == 1.0f) {
                         EXPECT_EQ(ids.at(0), 4);
                       }
                       return std::vector<Tensor>{i32_values(ids)};
                     }});
  }
  table.push_back({Call::Sample, "one_row_no_context", [](Backend& b, const Up& up, const Down&) {
                     Backend::SampleRequest r;
                     r.rows = 1, r.params.do_sample = true, r.uniforms = {0.3};
                     return std::vector<Tensor>{i32_values(b.sample(up(random_f32(151, 61, 2.0f).reshape({1, 151})), r))};
                   }});
  // span_sums: per-sequence sums of per-token values — padded rows (one span per row), packed rows (several spans in
  // one row, an empty one), tokens of weight 0 skipped even where the value is NaN, LD-DPO's factors, NaN and Inf
  // inside a span propagate.
  struct Spans {
    std::string name;
    std::vector<Backend::Span> spans;
    bool factors;
    bool non_finite;
    bool weights = true;  // false: no weights, every token of a span counts once
  };
  for (const Spans& x : {Spans{"padded_rows", {{0, 0, 40}, {1, 0, 40}, {2, 0, 40}}, false, false},
                         Spans{"packed_with_an_empty_span_and_factors", {{0, 0, 13}, {0, 13, 13}, {0, 13, 40}, {2, 5, 29}}, true, false},
                         Spans{"nan_and_inf_inside_spans", {{1, 0, 40}, {2, 0, 40}, {3, 0, 40}}, false, true},
                         Spans{"one_token_spans_without_weights", {{0, 1, 2}, {1, 39, 40}, {3, 17, 18}, {2, 0, 0}}, false, false, false}}) {
    table.push_back({Call::SpanSums, x.name, [x](Backend& b, const Up& up, const Down&) {
                       const int64_t R = 4, T = 40;
                       Tensor values = random_f32(R * T, 70, 5.0f).reshape({R, T}), weights = random_f32(R * T, 71).reshape({R, T});
                       float* v = values.mutable_data_as<float>();
                       float* w = weights.mutable_data_as<float>();
                       for (int64_t i = 0; i < R * T; ++i)
                         if (i % 5 == 0 && x.weights) w[i] = 0.0f, v[i] = NAN;  // masked: never read into a sum
                       if (x.non_finite) v[1 * T + 3] = NAN, v[2 * T + 7] = INFINITY;
                       const Tensor factors = up(random_f32(R * T, 72).reshape({R, T}));
                       const Tensor up_weights = up(weights);
                       const std::vector<double> sums = b.span_sums(up(values), x.weights ? &up_weights : nullptr, x.factors ? &factors : nullptr, x.spans);
                       EXPECT_EQ(sums.size(), x.spans.size());
                       if (!x.weights) {  // a one-token span reads its value exactly (the pooled rewards), an empty one 0
                         for (size_t q = 0; q + 1 < x.spans.size(); ++q)
                           EXPECT_EQ(sums[q], static_cast<double>(v[x.spans[q].row * T + x.spans[q].begin])) << q;
                         EXPECT_EQ(sums.back(), 0.0);
                       }
                       if (!x.non_finite) {
                         for (double s : sums) EXPECT_TRUE(std::isfinite(s));
                       }
                       return std::vector<Tensor>{f64_values(sums)};
                     },
                     x.non_finite});
  }
  // policy_loss: GRPO's four reductions at the token level, the sequence level, the KL to the reference, delta's
  // cap, no old log-probs (ρ = 1), RLOO; a row masked entirely (its clip ratios are NaN and left out of min/max),
  // ratios far outside the clip range on both sides, a rank's share.
  struct Policy {
    std::string name;
    bool rloo;
    std::string loss_type, level;
    double beta;
    std::optional<double> delta;
    bool old, masked_row;
  };
  for (const Policy& x : {Policy{"dapo_token", false, "dapo", "token", 0, {}, true, false}, Policy{"grpo_token_beta", false, "grpo", "token", 0.04, {}, true, true},
                          Policy{"bnpo_delta", false, "bnpo", "token", 0, 1.5, true, false}, Policy{"dr_grpo_no_old", false, "dr_grpo", "token", 0, {}, false, false},
                          Policy{"grpo_sequence_masked_row", false, "grpo", "sequence", 0.1, {}, true, true}, Policy{"rloo", true, "", "", 0, {}, true, false},
                          Policy{"rloo_no_old_masked_row", true, "", "", 0, {}, false, true}}) {
    table.push_back({Call::PolicyLoss, x.name, [x](Backend& b, const Up& up, const Down& down) {
                       const int64_t B = 4, C = 37;
                       Tensor logp = random_f32(B * C, 80, 0.5f).reshape({B, C}), old = random_f32(B * C, 81, 0.5f).reshape({B, C});
                       float* lp = logp.mutable_data_as<float>();
                       for (int64_t i = 0; i < B * C; ++i) lp[i] = -std::fabs(lp[i]) - 0.1f;  // log-probs are negative
                       Tensor mask = Tensor::zeros(DType::F32, {B, C});
                       for (int64_t r = 0; r < B; ++r)
                         for (int64_t c = 0; c < C - 5 * r; ++c) mask.mutable_data_as<float>()[r * C + c] = x.masked_row && r == 2 ? 0.0f : 1.0f;
                       const Tensor d_logp = up(logp), d_mask = up(mask), d_old = up(old.reshape({B, C})), d_ref = up(random_f32(B * C, 82, 0.5f).reshape({B, C}));
                       const Tensor d_entropy = up(random_f32(B * C, 83).reshape({B, C}));
                       Backend::PolicyLossRequest q;
                       q.rloo = x.rloo, q.share = 0.5;
                       q.options.loss_type = x.rloo ? "dapo" : x.loss_type, q.options.importance_sampling_level = x.rloo ? "token" : x.level;
                       q.options.beta = x.beta, q.options.delta = x.delta, q.options.epsilon_high = 0.28;
                       q.options.max_completion_length = C, q.options.micro_batches = 2, q.options.num_items_in_batch = 300;
                       q.logp = &d_logp, q.mask = &d_mask, q.entropy = &d_entropy;
                       if (x.old) q.old_logp = &d_old;
                       if (x.beta != 0) q.ref_logp = &d_ref;
                       q.advantages = {1.5, -0.7, 0.0, -2.0};
                       Tensor seed = b.allocate(DType::F32, {B, C}, "loss_weights");
                       const PolicyLossMetrics m = b.policy_loss(q, seed);
                       EXPECT_TRUE(std::isfinite(m.loss) && std::isfinite(m.entropy));
                       EXPECT_EQ(std::isnan(m.kl), x.rloo || x.beta == 0);
                       // NaN metrics are a value of their own here (the comparison fails on any other NaN).
                       std::vector<double> v = {m.loss, m.entropy, m.kl, m.clip_low_mean, m.clip_high_mean, m.clip_region_mean, m.clip_low_min, m.clip_high_max};
                       for (double& y : v) y = std::isnan(y) ? -1e300 : y;
                       return std::vector<Tensor>{down(seed), f64_values(v)};
                     }});
  }
  return table;
}

// ---- running a case on a backend: the host backends take host tensors, a device backend gets them uploaded ----

std::vector<Tensor> run_on(const CallCase& c, Backend& b) {
  const Up up = [&](const Tensor& h) { return b.host_memory() ? h.clone() : b.upload(h, "input"); };
  const Down down = [&](const Tensor& t) { return t.is_device() ? b.download(t) : t.clone(); };
  return c.run(b, up, down);
}

// Equal bits, or both NaN (a NaN's payload may differ); non-finite values pass only where the case expects them.
void expect_same(const Tensor& got, const Tensor& want, bool non_finite, const std::string& where) {
  ASSERT_EQ(got.dtype(), want.dtype()) << where;
  ASSERT_EQ(got.shape(), want.shape()) << where;
  const int64_t n = want.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double g = load_element(got.data(), got.dtype(), i), w = load_element(want.data(), want.dtype(), i);
    if (!std::isfinite(w)) {
      ASSERT_TRUE(non_finite) << where << ": the reference is non-finite at " << i << " in a case that expects no NaN or Inf";
      ASSERT_TRUE(std::isnan(w) ? std::isnan(g) : g == w) << where << "[" << i << "]: " << g << " vs " << w;
      continue;
    }
    ASSERT_TRUE(std::isfinite(g) && g == w) << where << "[" << i << "]: " << g << " vs " << w;
  }
}

std::vector<std::string> backends_under_test() {
  std::vector<std::string> names;
  for (const std::string& n : available_backends())
    if (n != "reference") names.push_back(n);
  names.push_back("reference-device");
  return names;
}

class BackendCallCase : public ::testing::TestWithParam<CallCase> {};

TEST_P(BackendCallCase, MatchesReference) {
  const CallCase& c = GetParam();
  auto reference = make_backend("reference");
  const std::vector<Tensor> want = run_on(c, *reference);
  for (const std::string& name : backends_under_test()) {
    auto backend = make_backend(name);
    const std::vector<Tensor> got = run_on(c, *backend);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t k = 0; k < want.size(); ++k) expect_same(got[k], want[k], c.non_finite, name + " output " + std::to_string(k));
  }
}

INSTANTIATE_TEST_SUITE_P(BackendCalls, BackendCallCase, ::testing::ValuesIn(call_table()),
                         [](const ::testing::TestParamInfo<CallCase>& p) { return std::string(call_name(p.param.call)) + "_" + p.param.name; });

TEST(BackendCalls, EveryCallHasCases) {
  std::map<Call, int> count;
  for (const CallCase& c : call_table()) ++count[c.call];
  for (int i = 0; i < static_cast<int>(Call::kCount); ++i)
    EXPECT_GE(count[static_cast<Call>(i)], 1) << "backend call " << call_name(static_cast<Call>(i)) << " has no case (tests/backend/backend_calls_test.cpp)";
}

// f fails with an error whose message contains `what` (nothing thrown fails too).
void expect_error_naming(const std::string& what, const std::function<void()>& f) {
  const std::string e = test::error_of(f);
  EXPECT_NE(e.find(what), std::string::npos) << "expected an error naming \"" << what << "\", got: " << e;
}

// On the stand-in device the calls move nothing but what the case uploads and downloads: an AdamW step of a weight
// already on the device, with its gradient on the device, reads nothing back.
TEST(BackendCalls, OnTheDeviceAnAdamWStepMovesNothing) {
  auto dev = make_backend("reference-device");
  Tensor w = dev->upload(random_f32(4099, 1), "w"), g = dev->upload(random_f32(4099, 2, 0.01f), "grad.w");
  Tensor m = dev->allocate(DType::F32, {4099}, "exp_avg of w"), v = dev->allocate(DType::F32, {4099}, "exp_avg_sq of w");
  Tensor c = dev->upload(Tensor::zeros(DType::BF16, {4099}), "w (bf16)");
  const Backend::Transfers before = dev->transfers();
  Backend::AdamWStep s;
  s.step_size = 1e-3f, s.fresh = true;
  dev->adamw_step(g, m, v, w, &c, s);
  s.fresh = false;
  dev->adamw_step(g, m, v, w, &c, s);
  const Backend::Transfers after = dev->transfers();
  EXPECT_EQ(after.uploads, before.uploads);
  EXPECT_EQ(after.downloads, before.downloads);
  EXPECT_TRUE(m.is_device() && v.is_device());
  // A host tensor among device ones is an error that names the call and says what to do.
  Tensor host_m = Tensor::zeros(DType::F32, {4099});
  expect_error_naming("adamw_step on the reference-device backend: a tensor in host memory (upload it first)",
                      [&] { dev->adamw_step(g, host_m, v, w, &c, s); });
}

// The argument checks, shared by every backend: dtype and shape mismatches name what was expected.
TEST(BackendCalls, AdamWStepChecksItsArguments) {
  auto cpu = make_backend("cpu");
  Tensor w = Tensor::zeros(DType::F32, {4}), m = Tensor::zeros(DType::F32, {4}), v = Tensor::zeros(DType::F32, {4});
  Tensor short_g = Tensor::zeros(DType::F32, {3}), bf16_c = Tensor::zeros(DType::F32, {4});
  for (const auto& [what, f] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"f32 tensors of one shape", [&] { cpu->adamw_step(short_g, m, v, w, nullptr, {}); }},
           {"contiguous bf16 tensor", [&] { cpu->adamw_step(m, m, v, w, &bf16_c, {}); }}}) {
    expect_error_naming(what, f);
  }
}

// sample's checks, shared by every backend: rows outside the logits, a draw missing, a penalty without the ids.
TEST(BackendCalls, SampleChecksItsArguments) {
  auto cpu = make_backend("cpu");
  const Tensor logits = random_f32(2 * 9, 1).reshape({2, 9});
  for (const auto& [what, edit] : std::vector<std::pair<std::string, std::function<void(Backend::SampleRequest&)>>>{
           {"3 rows at stride 1 from row 0 do not fit the 2 rows of logits [2, 9]", [](Backend::SampleRequest& r) { r.rows = 3; }},
           {"1 uniforms for 2 rows", [](Backend::SampleRequest& r) { r.params.do_sample = true, r.uniforms = {0.5}; }},
           {"a repetition penalty needs the rows' ids so far", [](Backend::SampleRequest& r) { r.params.repetition_penalty = 1.2f; }}}) {
    Backend::SampleRequest r;
    r.rows = 2;
    edit(r);
    expect_error_naming(what, [&] { cpu->sample(logits, r); });
  }
  Backend::SampleRequest r;
  r.rows = 2;
  expect_error_naming("a contiguous float tensor whose last dimension is the vocabulary",
                      [&] { cpu->sample(Tensor::from_i32(std::vector<int32_t>{1, 2}, {1, 2}), r); });
}

// span_sums checks its spans and shapes; an empty span sums to exactly 0.
TEST(BackendCalls, SpanSumsCheckTheirSpans) {
  auto cpu = make_backend("cpu");
  const Tensor v = random_f32(2 * 5, 1).reshape({2, 5}), w = Tensor::from_f32(std::vector<float>(10, 1.0f), {2, 5}), bad = v.reshape({5, 2});
  EXPECT_EQ(cpu->span_sums(v, &w, nullptr, {{1, 2, 2}}).at(0), 0.0);
  EXPECT_DOUBLE_EQ(cpu->span_sums(v, &w, nullptr, {{0, 0, 2}}).at(0), static_cast<double>(v.data_as<float>()[0]) + v.data_as<float>()[1]);
  for (const auto& [what, f] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"span [3, 6) of row 0 lies outside the [2, 5] values", [&] { cpu->span_sums(v, &w, nullptr, {{0, 3, 6}}); }},
           {"span [0, 1) of row 2 lies outside", [&] { cpu->span_sums(v, &w, nullptr, {{2, 0, 1}}); }},
           {"must be [rows, tokens] of one shape", [&] { cpu->span_sums(v, &bad, nullptr, {}); }}}) {
    expect_error_naming(what, f);
  }
}

// On the stand-in device a choice moves only the ids down: one download of rows x 4 bytes.
TEST(BackendCalls, OnTheDeviceASampleBringsDownOnlyTheIds) {
  auto dev = make_backend("reference-device");
  const Tensor logits = dev->upload(random_f32(4 * 1000, 3).reshape({4, 1000}), "logits");
  const Backend::Transfers before = dev->transfers();
  Backend::SampleRequest r;
  r.rows = 4, r.params.do_sample = true, r.uniforms = {0.1, 0.2, 0.3, 0.4};
  EXPECT_EQ(dev->sample(logits, r).size(), 4u);
  const Backend::Transfers after = dev->transfers();
  EXPECT_EQ(after.uploads, before.uploads);
  EXPECT_EQ(after.downloads - before.downloads, 1);
  EXPECT_EQ(after.download_bytes - before.download_bytes, 4 * 4);
}

// On the stand-in device GRPO's loss runs where the log-probs are: only its metrics come down, nothing goes up, and
// the seed stays in device memory; a row gather moves nothing.
TEST(BackendCalls, OnTheDeviceAPolicyLossBringsDownOnlyItsMetrics) {
  auto dev = make_backend("reference-device");
  const Tensor table = dev->upload(random_f32(8 * 16, 4, 0.3f).reshape({8, 16}), "old_logp");
  const Tensor logp = dev->upload(random_f32(3 * 16, 5, 0.3f).reshape({3, 16}), "logp");
  const Tensor mask = dev->upload(Tensor::from_f32(std::vector<float>(3 * 16, 1.0f), {3, 16}), "mask");
  const Backend::Transfers before = dev->transfers();
  Tensor old = dev->allocate(DType::F32, {3, 16}, "old_logp rows");
  dev->copy_rows(table, {7, 1, 4}, old, {0, 1, 2});
  Backend::PolicyLossRequest q;
  q.logp = &logp, q.mask = &mask, q.old_logp = &old, q.advantages = {1, -1, 0.5};
  Tensor seed = dev->allocate(DType::F32, {3, 16}, "loss_weights");
  const PolicyLossMetrics m = dev->policy_loss(q, seed);
  const Backend::Transfers after = dev->transfers();
  EXPECT_TRUE(std::isfinite(m.loss));
  EXPECT_TRUE(seed.is_device());
  EXPECT_EQ(after.uploads, before.uploads);
  EXPECT_EQ(after.downloads - before.downloads, 1);
  EXPECT_EQ(after.download_bytes - before.download_bytes, static_cast<int64_t>(sizeof(PolicyLossMetrics)));
}

// upload_into writes host values into a tensor already in the backend's memory: a second holder of that tensor sees
// them (a resumed master shared by the model and AdamW), one upload is counted, nothing comes down.
TEST(BackendCalls, UploadIntoWritesTheTensorEveryHolderSees) {
  for (const char* name : {"cpu", "reference-device"}) {
    SCOPED_TRACE(name);
    auto b = make_backend(name);
    const Tensor start = random_f32(4099, 7), loaded = random_f32(4099, 8);
    Tensor w = b->host_memory() ? start.clone() : b->upload(start, "w");
    const Tensor holder = w;  // the model's handle on the same storage
    const Backend::Transfers before = b->transfers();
    b->upload_into(w, loaded);
    const Tensor got = holder.is_device() ? b->download(holder) : holder;
    EXPECT_EQ(std::memcmp(got.data(), loaded.data(), loaded.nbytes()), 0);
    if (!b->host_memory()) {
      EXPECT_EQ(b->transfers().uploads - before.uploads, 1);
      EXPECT_EQ(b->transfers().upload_bytes - before.upload_bytes, static_cast<int64_t>(loaded.nbytes()));
    }
    Tensor other_shape = random_f32(7, 9);
    expect_error_naming("shapes [7] and [4099] differ", [&] { b->upload_into(w, other_shape); });
  }
}

// policy_loss, copy_rows and sum_of_squares's groups check their arguments, on every backend alike.
TEST(BackendCalls, PolicyLossAndCopyRowsCheckTheirArguments) {
  auto cpu = make_backend("cpu");
  const Tensor logp = random_f32(2 * 5, 1).reshape({2, 5}), mask = Tensor::from_f32(std::vector<float>(10, 1.0f), {2, 5});
  const Tensor short_mask = Tensor::from_f32(std::vector<float>(8, 1.0f), {2, 4});
  Tensor seed = Tensor::zeros(DType::F32, {2, 5});
  auto request = [&] {
    Backend::PolicyLossRequest q;
    q.logp = &logp, q.mask = &mask, q.advantages = {1, 2};
    return q;
  };
  for (const auto& [what, edit] : std::vector<std::pair<std::string, std::function<void(Backend::PolicyLossRequest&)>>>{
           {"1 advantages for 2 rows", [](Backend::PolicyLossRequest& q) { q.advantages = {1}; }},
           {"the loss mask must be contiguous f32 [2, 5] as the log-probs, got f32 [2, 4]", [&](Backend::PolicyLossRequest& q) { q.mask = &short_mask; }},
           {"beta = 0.1 needs the reference's log-probs", [](Backend::PolicyLossRequest& q) { q.options.beta = 0.1; }},
           {"loss_type 'ppo' is not grpo, bnpo, dr_grpo or dapo", [](Backend::PolicyLossRequest& q) { q.options.loss_type = "ppo"; }}}) {
    Backend::PolicyLossRequest q = request();
    edit(q);
    expect_error_naming(what, [&] { cpu->policy_loss(q, seed); });
  }
  Tensor dst = Tensor::zeros(DType::F32, {3, 5});
  expect_error_naming("row 2 of [2, 5] to row 0 of [3, 5]: outside the tensors", [&] { cpu->copy_rows(logp, {2}, dst, {0}); });
  expect_error_naming("2 source rows for 1 destination rows", [&] { cpu->copy_rows(logp, {0, 1}, dst, {0}); });
  Tensor narrow = Tensor::zeros(DType::F32, {3, 4});
  expect_error_naming("rows of f32 [2, 5] do not fit rows of f32 [3, 4]", [&] { cpu->copy_rows(logp, {0}, narrow, {0}); });
  expect_error_naming("sum_of_squares: 2 groups for 1 tensors", [&] { cpu->sum_of_squares({logp}, {0, 1}); });
}

}  // namespace
}  // namespace trl

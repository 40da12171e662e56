// The reference backend's mixture-of-experts kernels (graph::Op::MoeTopK ... MoeAuxLossBackward; shapes there).
#pragma once

#include "trl/core/tensor.h"

namespace trl::reference {

void moe_topk(const Tensor& logits, Tensor& out);
void moe_route_weights(const Tensor& logits, const Tensor& experts, bool normalize, Tensor& out);
// first / total: gate_up and down hold experts [first, first + E) of `total` (0: E); other choices add nothing.
void moe_experts(const Tensor& x, const Tensor& experts, const Tensor& weights, const Tensor& gate_up, const Tensor& down, int64_t first,
                 int64_t total, Tensor& out);
void moe_router_stats(const Tensor& logits, const Tensor& experts, const Tensor* mask, Tensor& out);
void moe_aux_loss(const Tensor& stats, Tensor& out);
void moe_route_weights_backward(const Tensor& logits, const Tensor& experts, const Tensor& dweights, bool normalize, Tensor& out);
void moe_experts_backward(const Tensor& x, const Tensor& experts, const Tensor& weights, const Tensor& gate_up, const Tensor& down,
                          const Tensor& dy, bool dh_only, int64_t first, int64_t total, Tensor& out);
void moe_router_stats_backward(const Tensor& logits, const Tensor* mask, const Tensor& dstats, Tensor& out);
void moe_aux_loss_backward(const Tensor& stats, const Tensor& dloss, Tensor& out);
// op(a_e)·op(b_e) for every e, accumulated in f64 and rounded once to out's dtype (graph::Op::BatchedMatMul).
void batched_matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, Tensor& out);

}  // namespace trl::reference

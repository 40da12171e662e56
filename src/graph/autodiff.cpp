#include "graph/autodiff.h"

#include "trl/core/error.h"

namespace trl::graph {

std::map<std::string, ValueId> add_backward(Builder& b, ValueId loss, const std::vector<std::string>& wrt, DType gd) {
  if (!b.shape(loss).empty()) fail("autodiff: the loss must be a scalar, got {}", shape_str(b.shape(loss)));
  const size_t n = static_cast<size_t>(loss) + 1;  // nodes after the loss do not matter
  // Which values depend on a `wrt` input (only those need gradients).
  std::vector<bool> needs(n, false);
  std::vector<ValueId> wrt_ids;
  for (const std::string& name : wrt) {
    const ValueId id = b.find_input(name);
    if (id == kNone) fail("autodiff: no input named '{}'", name);
    wrt_ids.push_back(id);
    if (static_cast<size_t>(id) < n) needs[static_cast<size_t>(id)] = true;
  }
  for (size_t i = 0; i < n; ++i) {
    const Node& nd = b.node(static_cast<ValueId>(i));
    if (nd.op == Op::Input || !dtype_is_float(nd.dtype)) continue;  // integers (a router's choice of experts) have no gradient
    for (ValueId in : nd.inputs)
      if (in != kNone && needs[static_cast<size_t>(in)]) needs[i] = true;
  }
  std::vector<ValueId> grad(n, kNone);
  // A value read by several nodes sums their gradients. Where the new part is a matmul_nn (a layer input's dx), it
  // adds the sum so far into its GEMM instead of a separate add (in place where nothing else reads it: a LoRA
  // layer's input gets the dx of its base GEMM and of its adapter's A).
  auto accumulate = [&](ValueId v, ValueId g) {
    if (v == kNone || !needs[static_cast<size_t>(v)]) return;
    ValueId& slot = grad[static_cast<size_t>(v)];
    if (slot == kNone) slot = g;
    else if (b.fold_addend(g, slot)) slot = g;
    else slot = b.add(slot, g, "grad_sum");
  };
  grad[static_cast<size_t>(loss)] = b.fill({}, gd, 1.0, "dloss");
  std::map<ValueId, ValueId> rounded;  // a gradient value → its bf16 cast (the matmuls' backward GEMMs share it)
  for (size_t i = n; i-- > 0;) {
    const ValueId g = grad[i];
    if (g == kNone || !needs[i]) continue;
    const Node nd = b.node(static_cast<ValueId>(i));  // copy: pushing nodes may reallocate
    const std::string& nm = nd.name;
    auto in = [&](size_t k) { return k < nd.inputs.size() ? nd.inputs[k] : kNone; };
    auto need = [&](size_t k) { return in(k) != kNone && needs[static_cast<size_t>(in(k))]; };
    switch (nd.op) {
      case Op::Input:
      case Op::Fill:
        break;
      case Op::Embedding: {
        // A tied embedding already holds the lm_head's gradient: scatter into it instead of adding two [V, C]s.
        ValueId& slot = grad[static_cast<size_t>(in(1))];
        if (needs[static_cast<size_t>(in(1))]) slot = b.embedding_backward(in(0), g, b.shape(in(1))[0], gd, "d." + nm, slot, nd.attrs.vocab);
        break;
      }
      case Op::MatMul: {
        // A bf16 matmul's backward GEMMs run in bf16 with f32 accumulation (as under torch.autocast): the
        // incoming gradient is rounded to bf16 once, and dx, dw come out in f32.
        // One rounding per gradient value: a gradient that reaches several bf16 matmuls (a LoRA branch beside its
        // base layer) is cast once.
        const DType wd = b.node(in(1)).dtype;
        ValueId gm = g;
        if (wd == DType::BF16 && b.node(g).dtype != DType::BF16) {
          const auto it = rounded.find(g);
          gm = it != rounded.end() ? it->second : rounded.emplace(g, b.cast(g, DType::BF16, "g16." + nm)).first->second;
        }
        if (need(0)) accumulate(in(0), b.matmul_nn(gm, in(1), gd, "dx." + nm));
        if (need(1)) accumulate(in(1), b.matmul_tn(gm, in(0), gd, "dw." + nm));
        if (need(2)) accumulate(in(2), b.sum_rows(g, gd, "db." + nm));
        if (need(3)) accumulate(in(3), g);  // y = x·wᵀ + b + addend
        break;
      }
      case Op::RmsNorm:
        if (need(0)) accumulate(in(0), b.rms_norm_back_x(in(0), in(1), g, nd.attrs.eps, "dx." + nm));
        if (need(1)) accumulate(in(1), b.rms_norm_back_w(in(0), g, nd.attrs.eps, gd, "dw." + nm));
        break;
      case Op::Rope:
        accumulate(in(0), b.rope_inverse(g, nd, "d." + nm));
        break;
      case Op::Attention: {
        if (nd.inputs.size() > 4 && nd.inputs[4] != kNone) fail("autodiff: attention {} places its queries in a KV cache (q_pos): inference only", nm);
        const auto d = b.attention_backward(in(0), in(1), in(2), in(3), g, nd.attrs.scale, nd.attrs.causal, "d." + nm);
        for (size_t k = 0; k < 3; ++k) accumulate(in(k), d[k]);
        break;
      }
      case Op::SwiGLU: {
        const auto d = b.swiglu_backward(in(0), in(1), g, "d." + nm);
        accumulate(in(0), d[0]);
        accumulate(in(1), d[1]);
        break;
      }
      case Op::Add:
        accumulate(in(0), g);
        accumulate(in(1), g);
        break;
      case Op::Cast:
        accumulate(in(0), g);  // gradients stay f32
        break;
      case Op::Reshape:
        accumulate(in(0), b.reshape(g, b.shape(in(0)), "d." + nm));
        break;
      case Op::TokenLogprobs: {
        const auto d = b.token_logprobs_backward(in(0), in(1), in(2), g, "d." + nm, kNone, nd.attrs.vocab, need(1));
        accumulate(in(0), d[0]);
        accumulate(in(1), d[1]);
        break;
      }
      case Op::Entropy: {
        const auto d = b.entropy_backward(in(0), in(1), g, "d." + nm, kNone, nd.attrs.vocab, need(1));
        accumulate(in(0), d[0]);
        accumulate(in(1), d[1]);
        break;
      }
      case Op::WeightedSum:
        accumulate(in(0), b.scale_by(in(1), g, gd, "d." + nm));
        if (need(1)) accumulate(in(1), b.scale_by(in(0), g, gd, "dweights." + nm));
        break;
      case Op::ScaleBy:  // w·s with a constant scale s (a sampling temperature's 1/T): dw = g·s
        if (need(1)) fail("autodiff: scale_by {} has a scale that depends on a parameter: only a constant scale is differentiated", nm);
        accumulate(in(0), b.scale_by(g, in(1), gd, "d." + nm));
        break;
      case Op::Dropout:  // y = x·mask/(1 − p) with a fixed mask: dx = dy·mask/(1 − p), the same op on the same seed
        accumulate(in(0), b.dropout(g, in(1), nd.attrs.value, nd.attrs.offset, "d." + nm));
        break;
      case Op::AllReduce:  // y = Σ_ranks x: every rank's x gets the (same) gradient of y
        accumulate(in(0), g);
        break;
      case Op::AllReduceGrad:  // y = x on every rank, used by each rank's own columns: dx = Σ_ranks dy
        accumulate(in(0), b.all_reduce(g, nd.attrs.group, "d." + nm));
        break;
      case Op::MoeRouteWeights:
        accumulate(in(0), b.moe_route_weights_backward(in(0), in(1), g, nd.attrs.normalize, "d." + nm));
        break;
      case Op::MoeExperts: {
        // The experts' backward GEMMs run in the weights' dtype with f32 accumulation (the kernel rounds dy, as the
        // matmul rule above does for a bf16 layer).
        const bool dw = need(3) || need(4);
        const auto d = b.moe_experts_backward(in(0), in(1), in(2), in(3), in(4), g, "d." + nm, dw, nd.attrs.offset, nd.attrs.rows);
        accumulate(in(0), d[0]);
        accumulate(in(2), d[1]);
        if (dw) {
          accumulate(in(3), d[2]);
          accumulate(in(4), d[3]);
        }
        break;
      }
      case Op::MoeRouterStats:
        accumulate(in(0), b.moe_router_stats_backward(in(0), in(2), g, "d." + nm));
        break;
      case Op::MoeAuxLoss:
        accumulate(in(0), b.moe_aux_loss_backward(in(0), g, "d." + nm));
        break;
      case Op::BatchedMatMul: {
        // C_e = op(A_e)·op(B_e): dop(A) = dC·op(B)ᵀ, dop(B) = op(A)ᵀ·dC, written as the same op with the operands
        // swapped or transposed so that each result comes out in its operand's own layout. A gradient is rounded
        // to the operands' dtype first (one GEMM dtype, as the matmul rule above).
        const bool ta = nd.attrs.trans_a, tb = nd.attrs.trans_b;
        const DType od = b.node(in(0)).dtype;
        const ValueId gm = b.node(g).dtype == od ? g : b.cast(g, od, "g." + nm);
        if (need(0)) accumulate(in(0), ta ? b.batched_matmul(in(1), gm, tb, true, gd, "da." + nm) : b.batched_matmul(gm, in(1), false, !tb, gd, "da." + nm));
        if (need(1)) accumulate(in(1), tb ? b.batched_matmul(gm, in(0), true, ta, gd, "db." + nm) : b.batched_matmul(in(0), gm, !ta, false, gd, "db." + nm));
        break;
      }
      case Op::MoeTopK:
        break;  // indices: never reached (an integer value needs no gradient)
      case Op::View: {
        // A multi-result forward op's View is differentiated by that op's rule: jsd()'s value (row 0 of Op::Jsd).
        const Node& src = b.node(in(0));
        if (src.op != Op::Jsd || nd.attrs.offset != 0)
          fail("autodiff: view {} of {} has no VJP rule (only the value of a jsd node is differentiated)", nm, op_name(src.op));
        const std::vector<ValueId> s = src.inputs;  // h, w, ht, wt
        if (needs[static_cast<size_t>(s[2])] || needs[static_cast<size_t>(s[3])])
          fail("autodiff: jsd {}: the teacher's side (ht, wt) is frozen: differentiate the student's h and w only", nm);
        const bool dw = needs[static_cast<size_t>(s[1])];
        const auto d = b.jsd_backward(s[0], s[1], s[2], s[3], g, in(0), "d." + nm, dw);
        accumulate(s[0], d[0]);
        if (dw) accumulate(s[1], d[1]);
        break;
      }
      case Op::VocabStats:
        fail("autodiff: {} ({}) is made by graph::fuse_vocabulary_ops after autodiff: differentiate token_logprobs and entropy",
             op_name(nd.op), nm);
      case Op::TokenArgmaxMatch:
        fail("autodiff: {} ({}) is a metric (an argmax): it has no gradient", op_name(nd.op), nm);
      case Op::Slice:
      case Op::KvCacheWrite:
        fail("autodiff: op {} ({}) is inference only (the static KV cache): it has no VJP rule", op_name(nd.op), nm);
      default:
        fail("autodiff: op {} ({}) has no VJP rule (it is a backward op)", op_name(nd.op), nm);
    }
  }
  std::map<std::string, ValueId> out;
  for (size_t k = 0; k < wrt.size(); ++k) {
    const ValueId id = wrt_ids[k];
    ValueId g = static_cast<size_t>(id) < n ? grad[static_cast<size_t>(id)] : kNone;
    if (g == kNone) g = b.fill(b.shape(id), gd, 0.0, "zero_grad." + wrt[k]);
    out[wrt[k]] = g;
  }
  return out;
}

}  // namespace trl::graph

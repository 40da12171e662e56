// The graph IR: a topologically ordered list of nodes, each producing one typed value. A model is traced once
// per input shape into a Graph with concrete shapes; backends compile a Graph into a Program and run it many
// times. Weights are graph inputs (bound by name at run time), so a weight update never changes the graph.
//
// Ops are coarse (docs/COMPILER.md). Shapes use the glossary B batch, T tokens, S key positions, C hidden,
// H heads, Hkv kv heads, D head dim, F ffn, V vocab.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trl/core/dtype.h"
#include "trl/core/tensor.h"

namespace trl::graph {

enum class Op : uint8_t {
  Input,      // a data input or a parameter, bound by name at run time
  Embedding,  // ids:[B,T] i32, table:[V,C] -> [B,T,C]
  MatMul,     // x:[...,K], w:[N,K] (nn.Linear layout), optional bias:[N], optional addend:[...,N] -> [...,N]
              //   y = x·wᵀ + b + addend (the addend in the output's dtype: a GEMM that accumulates into it, in place
              //   when nothing reads it afterwards; see accumulate_input)
  RmsNorm,    // x:[...,C], w:[C] -> [...,C]   (Transformers' order: normalise in f32, cast, then scale)
  Rope,       // x:[B,T,H,D], positions:[B,T] i32 -> [B,T,H,D]   rotate-half (GPT-NeoX) layout
  Attention,  // q:[B,T,H,D], k,v:[B,S,Hkv,D], optional key_mask:[B,S] i32, optional q_pos:[B,T] i32 -> [B,T,H,D]
              //   key_mask holds segment ids: 0 = padding; a query (at key index q_pos, default t + S - T) sees
              //   only keys of its own segment, so packed sequences stay isolated; a 0/1 padding mask is the
              //   one-segment case. q_pos (inference only) places queries in a static KV cache; with a 6th input
              //   cache_rows:[B] i32 (needs q_pos) k,v are a cache of any number of rows and query row b reads cache
              //   row cache_rows[b] (key_mask stays [B,S], per query row).
  SwiGLU,     // gate,up:[...,F] -> silu(gate)·up
  Add,        // a,b: same shape
  Cast,       // x -> x in another dtype
  Reshape,    // same elements, new shape
  // Inference: the static KV cache (docs/GENERATION.md). No VJP (autodiff rejects them by name).
  Slice,         // x:[B,T,...] -> x[:, attrs.offset : attrs.offset + attrs.rows, ...]
  KvCacheWrite,  // cache:[B,S,Hkv,D], x:[B,T,Hkv,D], pos:[1] or [B] i32 (every row's first slot, or row b's) -> cache
                 //   with x's row b at slots [pos, pos + T) of cache row b; with a 4th input rows:[B] i32, of cache row
                 //   rows[b] (a cache of any number of rows: continuous batching's slots). Backends update the bound
                 //   cache tensor in place (the CPU backend does) or return a copy
  // Training: the loss and the backward pass (docs/COMPILER.md). Ops with several results write one packed buffer
  // that View nodes slice (zero-copy).
  TokenLogprobs,          // h:[...,C], w:[V,C], targets:[...] i32 -> [...] f32   log softmax(h·wᵀ)[target], chunked over V
  WeightedSum,            // x:[...] f32, weights:[...] f32 -> [] f32              Σ x·weights
  Fill,                   // -> shape filled with attrs.scale
  MatMulNN,               // dy:[...,N], w:[N,K], optional addend:[...,K] -> [...,K] dy·w + addend
  MatMulTN,               // a:[...,N], b:[...,K] -> [N,K]                         aᵀ·b over all leading dims
  SumRows,                // x:[...,N] -> [N]
  ScaleBy,                // w:[...] f32, s:[] f32 -> w·s
  EmbeddingBackward,      // ids:[B,T] i32, dy:[B,T,C], base:[V,C]|none -> base + scatter-add (attrs.rows = V)
  RmsNormBackX,           // x:[...,C], w:[C], dy -> dx
  RmsNormBackW,           // x:[...,C], dy:[...,C] -> dw:[C]
  SwiGLUBackward,         // gate, up, dy:[...,F] -> packed [dgate | dup]
  AttentionBackward,      // q, k, v, key_mask|none, dy -> packed [dq | dk | dv]
  TokenLogprobsBackward,  // h, w, targets, dlogp, stats|none -> packed [dh | dw] (dh alone with attrs.dh_only)
  Entropy,                // h:[...,C], w:[V,C] -> [...] f32                      entropy of softmax(h·wᵀ), chunked over V
  EntropyBackward,        // h, w, dH, stats|none -> packed [dh | dw] (dh alone with attrs.dh_only)
  TokenArgmaxMatch,       // h:[...,C], w:[V,C], targets:[...] i32 -> [...] f32   1 where target = argmax(h·wᵀ) (first of ties), else 0
                          //   (a metric: no VJP)
  VocabStats,             // h:[...,C], w:[V,C], targets:[R] i32|none -> packed f32, R = rows of h:
                          //   [logp | entropy | match | lse] (R each; logp, match 0 without targets; entropy 0 unless
                          //   attrs.entropy), then with attrs.keep_logits the bf16 logits [R, V] (R·V/2 f32 slots).
                          //   The fused vocabulary pass: fuse_vocabulary_ops (graph/passes.h) puts one in place of the
                          //   forward ops above on the same (h, w), and hands it to their backward nodes as `stats`
                          //   (they then skip recomputing lse, entropy and, kept, the logits). No VJP.
  // Tensor parallel (docs/DISTRIBUTED.md): collectives over the ranks of group attrs.group (core/collectives.h), the
  // pair of Megatron-LM's f and g operators.
  AllReduce,              // x:[...] f32|bf16 -> Σ of x over the group's ranks (a row-parallel layer's partial outputs);
                          //   VJP: the identity (the gradient of the sum is the same on every rank)
  AllReduceGrad,          // x -> x (the input of column-parallel layers, the same on every rank); VJP: the gradient
                          //   all-reduced over the group (each rank holds the part of it that its columns give)
  // Training with LoRA (docs/LORA.md).
  Dropout,                // x:[...], seed:[2] i32 -> x·keep/(1 − p), p = attrs.value: element i is kept where
                          //   dropout_keep(seed, attrs.offset, i, p) (core/rng.h): a counter-based mask, so the VJP
                          //   is the same op on dy (linear in x) and a recomputed forward gives the same mask
  // Distillation (docs/DISTILLATION.md): TRL's generalized Jensen-Shannon divergence between the student's
  // next-token distribution S = softmax(h·wᵀ) and the teacher's T = softmax(ht·wtᵀ), with β = attrs.value:
  //   β = 0: KL(T‖S);  β = 1: KL(S‖T);  else β·KL(T‖M) + (1 − β)·KL(S‖M), M = (1 − β)·S + β·T,
  // summed over the vocabulary, chunked over V: neither model's [R, V] logits are ever formed.
  Jsd,                    // h:[...,C], w:[V,C], ht:[...,Ct], wt:[V,Ct] -> packed f32 rows (R each, see JsdStat): jsd, then
                          //   lse, lse_t and kl_sm = KL(S‖M) (the backward's row constants) each as a pair of f32 rows
                          //   hi + lo (their sum carries f64 precision). Builder::jsd returns the View of jsd;
                          //   autodiff differentiates that View into a jsd_backward reading this node as its stats
  JsdBackward,            // h, w, ht, wt, djsd:[...], stats (the jsd node) -> packed [dh | dw] (dh alone with
                          //   attrs.dh_only): the student's gradients only (the teacher is frozen)
  // Mixture of experts (Qwen3-MoE, docs/MODELS.md): a router picks K of E experts per token; each expert is a SwiGLU
  // MLP whose weights are stacked: gate_up:[E, 2F, C] (gate rows [0, F), up rows [F, 2F)), down:[E, C, F].
  MoeTopK,                // logits:[N,E] -> [N,K] i32 (K = attrs.rows): the experts of the K largest logits (those of the K
                          //   largest softmax probabilities), largest first, ties to the lower index. No VJP (indices)
  MoeRouteWeights,        // logits:[N,E], experts:[N,K] i32 -> [N,K] f32: softmax(f32 logits) at the chosen experts, divided
                          //   by their sum with attrs.normalize (norm_topk_prob)
  MoeExperts,             // x:[N,C], experts:[N,K] i32, weights:[N,K], gate_up:[E,2F,C], down:[E,C,F] -> [N,C] in x's dtype:
                          //   Σ_k weights[n,k]·down_e(silu(gate_e·x_n)·up_e·x_n), e = experts[n,k]. Tokens are grouped by
                          //   expert, one GEMM per expert over its tokens; an expert no token chose costs nothing.
                          //   Expert parallel: gate_up and down hold experts [attrs.offset, attrs.offset + E) of
                          //   attrs.rows (0: E) numbered globally in `experts`; a choice of another expert adds nothing
                          //   (and gets a zero dweight): each rank's partial sum, which an all_reduce completes
  MoeRouterStats,         // logits:[N,E], experts:[N,K] i32, mask:[N] i32|none -> [2E+1] f32, over the tokens whose mask is
                          //   not 0: per expert the number of times it was chosen, per expert the sum of its softmax
                          //   probabilities, then the number of tokens (the load-balancing loss's sums for one layer)
  MoeAuxLoss,             // stats:[2E+1] f32 (MoeRouterStats summed over the sparse layers) -> [] f32:
                          //   E·Σ_e chosen_e·probs_e / tokens², Transformers' load_balancing_loss_func
  MoeRouteWeightsBackward,  // logits, experts, dweights:[N,K] -> dlogits [N,E]
  MoeExpertsBackward,       // x, experts, weights, gate_up, down, dy:[N,C] -> packed [dx | dweights | dgate_up | ddown]
                            //   ([dx | dweights] alone with attrs.dh_only: frozen experts, LoRA)
  MoeRouterStatsBackward,   // logits, mask|none, dstats:[2E+1] -> dlogits [N,E] (through the probabilities' sums only)
  MoeAuxLossBackward,       // stats, dloss:[] -> dstats [2E+1] (zero for the counts: they have no gradient)
  // LoRA on stacked experts (PEFT's target_parameters, docs/LORA.md): each expert's ΔW_e = B_e·A_e.
  BatchedMatMul,          // a:[E,M,K] ([E,K,M] with attrs.trans_a), b:[E,K,N] ([E,N,K] with attrs.trans_b) -> [E,M,N]:
                          //   op(a_e)·op(b_e) per e, f32 accumulation; a and b share a dtype. VJP: the same op transposed
  View,                   // packed -> elements [attrs.offset, +numel) as `shape`
  // A new op goes above this line: View stays last (kNumOps), and every backend's op table gets an entry.
};
constexpr size_t kNumOps = static_cast<size_t>(Op::View) + 1;

const char* op_name(Op op);

struct Node;
// The input an op adds its result into (-1: none): MatMul's addend (3), MatMulNN's (2), EmbeddingBackward's base (2).
// A backend may write the result over that input's buffer when nothing reads the input afterwards.
int accumulate_input(const Node& node);

using ValueId = int32_t;  // index of the node that produces the value
constexpr ValueId kNone = -1;

// Vocabulary parallel (tensor parallel's lm_head and embedding, docs/DISTRIBUTED.md): the [V, C] table or head of an
// embedding, embedding_backward or vocabulary op is rows [offset, offset + V) of a vocabulary of `size` rows, split
// into equal parts between the ranks of collective group `group`. Token ids and targets are of the whole vocabulary:
// an embedding gives zero rows for the ids other ranks hold (an all_reduce after it sums the ranks' rows), and the
// vocabulary ops combine their rows' statistics (log-sum-exp, entropy, argmax) over the group, so that each rank's
// result is the whole vocabulary's and its gradients are of its own rows (dh its part: the graph sums it through
// all_reduce_grad). size 0: not split.
struct VocabSplit {
  int32_t group = 0;
  int64_t offset = 0, size = 0;
  bool split() const { return size > 0; }
};

struct Attrs {
  double eps = 0;                // RmsNorm
  double scale = 1;              // Attention: softmax scale
  bool causal = true;            // Attention: query t sees keys up to t + (S - T)
  std::vector<float> inv_freq;   // Rope: D/2 inverse frequencies (f32, as Transformers computes them)
  float rope_scaling = 1.0f;     // Rope: attention_scaling applied to cos and sin
  bool inverse = false;          // Rope: rotate by -angle (the VJP of a rotation is its inverse)
  int64_t rows = 0;              // EmbeddingBackward: V
  int64_t offset = 0;            // View: element offset into the packed input; Dropout: the mask's stream
  double value = 0;              // Fill; Dropout: the probability p of zeroing an element; Jsd: β
  bool entropy = false;          // VocabStats: compute the entropy row
  bool keep_logits = false;      // VocabStats: keep the bf16 logits for the backward nodes (bf16 h and w only)
  int32_t group = 0;             // AllReduce, AllReduceGrad: the collective group (core/collectives.h)
  VocabSplit vocab;              // Embedding, EmbeddingBackward and the vocabulary ops: vocabulary parallel
  bool dh_only = false;          // TokenLogprobsBackward, EntropyBackward, JsdBackward: the head is frozen (LoRA): dh alone;
                                 //   MoeExpertsBackward: the experts are frozen: dx and dweights alone
  bool normalize = false;        // MoeRouteWeights(Backward): divide the chosen probabilities by their sum
  bool trans_a = false, trans_b = false;  // BatchedMatMul: read a (b) transposed
};

// VocabStats' packed result: row k of the four per-row statistics starts at element k·R.
enum class VocabStat : int64_t { Logprob = 0, Entropy = 1, Match = 2, Lse = 3 };
constexpr int64_t kVocabStatRows = 4;
// Jsd's packed result: row k of its per-row values starts at element k·R. The backward's constants are kept as
// hi + lo pairs of f32 (row k and row k + 3): its gradient is a small difference of O(1) terms, and an f32 lse's
// rounding (1e-6 at lse ≈ 12) would shift every term of a row by the same amount.
enum class JsdStat : int64_t { Value = 0, Lse = 1, LseTeacher = 2, KlStudentMixture = 3 };
constexpr int64_t kJsdStatRows = 7;  // value, 3 hi rows, 3 lo rows
// Elements (f32) of a VocabStats result over R rows and a vocabulary of V.
int64_t vocab_stats_numel(int64_t R, int64_t V, bool keep_logits);

struct Node {
  Op op = Op::Input;
  std::vector<ValueId> inputs;  // kNone marks an absent optional input
  Shape shape;
  DType dtype = DType::F32;
  std::string name;             // inputs: the binding name; others: a debug name such as "blk.3.attn_q"
  Attrs attrs;
  int32_t segment = -1;         // the checkpoint segment (decoder layer) a forward node belongs to; -1: none
};

struct Graph {
  std::vector<Node> nodes;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  std::vector<std::string> output_names;  // one per output ("" for an unnamed one); not part of key()
  // Seed inputs (by name) make a two-stage program: stage 0 runs every node up to the first one that depends on a
  // seed, stage 1 the rest, with the seeds bound only then (Program::run_stage). A trainer whose loss is a
  // nonlinear function of the stage-0 outputs (DPO's sequence log-probs) computes the loss and its derivative on
  // the host between the stages and feeds that derivative as the seed of the backward pass (docs/COMPILER.md).
  std::vector<std::string> seed_inputs;

  // The position of the output named `name` in Program::run's result (an error listing the names otherwise).
  size_t output_index(const std::string& name) const;
  std::map<std::string, size_t> output_indices() const;

  const Node& node(ValueId v) const { return nodes.at(static_cast<size_t>(v)); }
  // One line per node: "%12 = matmul(%3, %7) [2, 5, 64] f32  blk.0.attn_q".
  std::string dump() const;
  // Structure, shapes, dtypes and attributes as bytes (names of inputs included, debug names excluded): two graphs
  // compile to the same program exactly when their keys are equal. hash() is its 64-bit digest.
  std::string key() const;
  uint64_t hash() const;
};

// The 64-bit digest of a key (another `seed` gives an independent digest).
uint64_t hash_key(const std::string& key, uint64_t seed = 0);

// The first node of stage 1: the first that depends (through any path) on a seed input; nodes.size() when the
// graph has no seed (or none is used). An output of a node before it is a stage-0 output.
size_t stage_boundary(const Graph& g);

// Builds a graph with shape inference; every misuse throws trl::Error naming the op and the shapes.
class Builder {
 public:
  ValueId input(const std::string& name, Shape shape, DType dtype);
  ValueId embedding(ValueId ids, ValueId table, DType out, const std::string& name = "", const VocabSplit& split = {});
  ValueId matmul(ValueId x, ValueId w, ValueId bias, DType out, const std::string& name = "", ValueId addend = kNone);
  ValueId rms_norm(ValueId x, ValueId w, double eps, const std::string& name = "");
  ValueId rope(ValueId x, ValueId positions, std::vector<float> inv_freq, float scaling, const std::string& name = "");
  ValueId attention(ValueId q, ValueId k, ValueId v, ValueId key_mask, double scale, bool causal, const std::string& name = "",
                    ValueId q_pos = kNone, ValueId cache_rows = kNone);
  ValueId slice(ValueId x, int64_t start, int64_t length, const std::string& name = "");
  ValueId kv_cache_write(ValueId cache, ValueId x, ValueId pos, const std::string& name = "", ValueId rows = kNone);
  ValueId swiglu(ValueId gate, ValueId up, const std::string& name = "");
  ValueId add(ValueId a, ValueId b, const std::string& name = "");
  ValueId cast(ValueId x, DType out, const std::string& name = "");
  ValueId reshape(ValueId x, Shape shape, const std::string& name = "");
  ValueId token_logprobs(ValueId h, ValueId w, ValueId targets, const std::string& name = "", const VocabSplit& split = {});
  ValueId entropy(ValueId h, ValueId w, const std::string& name = "", const VocabSplit& split = {});
  ValueId token_argmax_match(ValueId h, ValueId w, ValueId targets, const std::string& name = "", const VocabSplit& split = {});
  // The generalized JSD of every row (see Op::Jsd): the View [...] of a Jsd node. Student and teacher share the
  // vocabulary (w and wt have the same rows); each side's logits are rounded to its own dtype, as each model's
  // lm_head output is. Not under a vocabulary split.
  ValueId jsd(ValueId h, ValueId w, ValueId ht, ValueId wt, double beta, const std::string& name = "");
  ValueId weighted_sum(ValueId x, ValueId weights, const std::string& name = "");
  ValueId fill(Shape shape, DType dtype, double value, const std::string& name = "");
  // x with each element zeroed with probability p (0 <= p < 1) and the others scaled by 1/(1 − p): PyTorch's
  // training-mode dropout, its mask drawn from seed [2] i32 and `stream` (one per dropout site of a graph).
  ValueId dropout(ValueId x, ValueId seed, double p, int64_t stream, const std::string& name = "");
  // Mixture of experts (see Op::MoeTopK ... Op::MoeAuxLoss). moe_router_stats' mask may be kNone (every token counts).
  ValueId moe_topk(ValueId logits, int64_t k, const std::string& name = "");
  ValueId moe_route_weights(ValueId logits, ValueId experts, bool normalize, const std::string& name = "");
  // With first_expert / num_experts (expert parallel): gate_up and down are experts [first_expert, first_expert + E)
  // of num_experts; 0, 0: all of them.
  ValueId moe_experts(ValueId x, ValueId experts, ValueId weights, ValueId gate_up, ValueId down, const std::string& name = "",
                      int64_t first_expert = 0, int64_t num_experts = 0);
  ValueId moe_router_stats(ValueId logits, ValueId experts, ValueId mask, const std::string& name = "");
  ValueId moe_aux_loss(ValueId stats, const std::string& name = "");
  // op(a_e)·op(b_e) for every e (see Op::BatchedMatMul), in dtype `out`.
  ValueId batched_matmul(ValueId a, ValueId b, bool trans_a, bool trans_b, DType out, const std::string& name = "");
  // Tensor parallel's collectives over collective group `group` (see Op::AllReduce, Op::AllReduceGrad).
  ValueId all_reduce(ValueId x, int32_t group, const std::string& name = "");
  ValueId all_reduce_grad(ValueId x, int32_t group, const std::string& name = "");
  // Backward-pass ops (used by autodiff; see Op for shapes).
  ValueId matmul_nn(ValueId dy, ValueId w, DType out, const std::string& name = "", ValueId addend = kNone);
  // Makes `sum` (a matmul_nn without an addend, made after `addend`) add `addend` into its result: the fused form of
  // add(addend, sum) that autodiff uses to accumulate gradients. False (nothing changed) when it does not apply.
  bool fold_addend(ValueId sum, ValueId addend);
  ValueId matmul_tn(ValueId a, ValueId b, DType out, const std::string& name = "");
  ValueId sum_rows(ValueId x, DType out, const std::string& name = "");
  ValueId scale_by(ValueId w, ValueId s, DType out, const std::string& name = "");
  // With `base`, the scatter-add starts from base (a tied embedding's other gradient) instead of zeros.
  ValueId embedding_backward(ValueId ids, ValueId dy, int64_t rows, DType out, const std::string& name = "", ValueId base = kNone,
                             const VocabSplit& split = {});
  ValueId rms_norm_back_x(ValueId x, ValueId w, ValueId dy, double eps, const std::string& name = "");
  ValueId rms_norm_back_w(ValueId x, ValueId dy, double eps, DType out, const std::string& name = "");
  // Ops with several results return the View of each part.
  std::vector<ValueId> swiglu_backward(ValueId gate, ValueId up, ValueId dy, const std::string& name = "");
  std::vector<ValueId> attention_backward(ValueId q, ValueId k, ValueId v, ValueId key_mask, ValueId dy, double scale, bool causal,
                                          const std::string& name = "");
  // `stats`: a VocabStats of the same (h, w) computed earlier (with attrs.entropy for entropy_backward), or kNone.
  // with_dw false (a frozen head): the result is dh alone and the second value kNone (the GEMMs of dw are skipped).
  std::vector<ValueId> token_logprobs_backward(ValueId h, ValueId w, ValueId targets, ValueId dlogp, const std::string& name = "",
                                               ValueId stats = kNone, const VocabSplit& split = {}, bool with_dw = true);
  std::vector<ValueId> entropy_backward(ValueId h, ValueId w, ValueId dent, const std::string& name = "", ValueId stats = kNone,
                                        const VocabSplit& split = {}, bool with_dw = true);
  // `stats`: the Jsd node (the packed one, not its View) on the same inputs. with_dw false: dh alone.
  std::vector<ValueId> jsd_backward(ValueId h, ValueId w, ValueId ht, ValueId wt, ValueId djsd, ValueId stats, const std::string& name = "",
                                    bool with_dw = true);
  ValueId moe_route_weights_backward(ValueId logits, ValueId experts, ValueId dweights, bool normalize, const std::string& name = "");
  // [dx, dweights, dgate_up, ddown] (the last two kNone without with_dw).
  std::vector<ValueId> moe_experts_backward(ValueId x, ValueId experts, ValueId weights, ValueId gate_up, ValueId down, ValueId dy,
                                            const std::string& name = "", bool with_dw = true, int64_t first_expert = 0,
                                            int64_t num_experts = 0);
  ValueId moe_router_stats_backward(ValueId logits, ValueId mask, ValueId dstats, const std::string& name = "");
  ValueId moe_aux_loss_backward(ValueId stats, ValueId dloss, const std::string& name = "");
  // The fused vocabulary pass (see Op::VocabStats); `targets` may be kNone. vocab_stat() is the View of one row.
  ValueId vocab_stats(ValueId h, ValueId w, ValueId targets, bool entropy, bool keep_logits, const std::string& name = "",
                      const VocabSplit& split = {});
  ValueId vocab_stat(ValueId stats, VocabStat which, const std::string& name = "");
  ValueId view(ValueId packed, int64_t offset, Shape shape, DType dtype, const std::string& name = "");
  ValueId rope_inverse(ValueId dy, const graph::Node& forward_rope, const std::string& name = "");
  // Marks v as the next output, optionally named (callers read results by name: Graph::output_index).
  void output(ValueId v, const std::string& name = "");
  // Makes input v a seed input (see Graph::seed_inputs).
  void mark_seed(ValueId v);
  // Nodes pushed from now on belong to checkpoint segment `s` (-1: none); see rematerialize() in passes.h.
  void set_segment(int32_t s) { segment_ = s; }
  size_t size() const { return graph_.nodes.size(); }
  // The input value named `name`, or kNone.
  ValueId find_input(const std::string& name) const;

  const Node& node(ValueId v) const { return graph_.node(v); }
  const Shape& shape(ValueId v) const { return graph_.node(v).shape; }
  Graph finish() { return std::move(graph_); }

 private:
  ValueId push(Node node);
  void check(ValueId v, const char* what) const;
  ValueId head_target_op(Op op, ValueId h, ValueId w, ValueId targets, DType out, const std::string& name, const VocabSplit& split);
  Graph graph_;
  int32_t segment_ = -1;
};

}  // namespace trl::graph

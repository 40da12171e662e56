// The decoder-only causal LM family (Qwen3, with Qwen2 and Llama as flags of the same decoder), written once
// against the graph builder. Parameter names are Hugging Face's, so checkpoints load and save unchanged.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trl/backend/backend.h"
#include "trl/graph/graph.h"
#include "trl/io/model_config.h"
#include "trl/io/safetensors.h"
#include "trl/models/lora.h"

namespace trl {

struct LoadOptions {
  std::optional<DType> dtype{};  // convert the weights; default: keep the checkpoint's dtype
  std::string device = "auto";  // "auto" = the best available; an unavailable device is an error, never a fallback
  std::string revision = "main";
};

// Host-side inputs of one forward pass.
struct Batch {
  Tensor input_ids{};       // [B,T] i32
  Tensor attention_mask{};  // [B,T] i32, 0 = padding, else a segment id (1 for a single sequence; 1, 2, ... for
                            // sequences packed into one row, which never attend to each other); optional (all ones)
  Tensor position_ids{};    // [B,T] i32; optional: each token's index within its segment, so padding never shifts
                            // positions and every packed sequence starts at 0
};

// Hugging Face names and shapes of every parameter, in a fixed order. lm_head.weight is listed only when the
// embeddings are not tied.
std::vector<std::pair<std::string, Shape>> parameter_shapes(const ModelConfig& config);

// RoPE inverse frequencies (head_dim/2 values, f32 as Transformers computes them), with "llama3" scaling applied.
std::vector<float> rope_inv_freq(const ModelConfig& config);

// position_ids = each token's index within its segment (cumsum(mask) - 1 for a 0/1 mask); padding gets 1 (as
// generate() does).
Tensor default_position_ids(const Tensor& attention_mask);

// Tensor parallel (docs/DISTRIBUTED.md): rank `rank` of `size` ranks holds whole attention heads and a slice of the
// MLP. q_proj, k_proj, v_proj, gate_proj and up_proj are split by rows (their outputs: heads H/size and kv heads
// Hkv/size, F/size), o_proj and down_proj by columns (their inputs); the layers' inputs pass through
// all_reduce_grad and their outputs through all_reduce over collective `group`. The embedding and the lm_head are
// split by vocabulary rows (V/size each: vocabulary parallel, graph::VocabSplit). The norms are whole on every rank.
struct TensorParallel {
  int64_t size = 1, rank = 0;
  int32_t group = 0;  // the collective group of the ranks (core/collectives.h)
};
// The axis `name` is split on under tensor parallel: 0 (rows), 1 (columns), or -1 (whole on every rank).
int tensor_parallel_axis(const std::string& parameter_name);
// Rank tp.rank's slice of a whole parameter (a copy; the tensor itself when it is whole on every rank).
Tensor tensor_parallel_slice(const std::string& parameter_name, const Tensor& whole, const TensorParallel& tp);

class CausalLM {
 public:
  // From a folder or a Hugging Face id in the local cache. Every expected tensor must be present with its exact
  // shape; tied lm_head may be absent (the embedding is used).
  static CausalLM from_pretrained(const std::string& name_or_path, const LoadOptions& options = {});
  // From weights in memory (validated the same way). `source` names them in errors.
  static CausalLM from_weights(ModelConfig config, TensorMap weights, const std::string& source = "weights");

  const ModelConfig& config() const { return config_; }
  const TensorMap& weights() const { return weights_; }
  DType dtype() const { return dtype_; }
  const std::string& path() const { return path_; }  // empty when built in memory
  const std::string& device() const { return device_; }
  // This rank's part of the model under tensor parallel (tp.size ranks; heads, kv heads and intermediate_size must
  // divide by it): its graphs compute, with the other ranks, what the whole model computes. tensor_parallel() is
  // {1, 0} for a whole model.
  CausalLM tensor_parallel_shard(const TensorParallel& tp) const;
  const TensorParallel& tensor_parallel() const { return tp_; }
  // The same architecture (a tensor-parallel rank's included) bound to other weights: the same names and shapes,
  // one floating dtype (which becomes the model's). `source` names them in errors.
  CausalLM with_weights(TensorMap weights, const std::string& source) const;
  // The same model whose programs (generate()) run on `device`: a frozen model whose weights were moved to a
  // trainer's device backend runs there, whatever device it was loaded for.
  CausalLM with_device(const std::string& device) const {
    CausalLM m = *this;
    m.device_ = device;
    return m;
  }
  // Checkpoint tensors that this architecture does not use (from_pretrained warns about them, as Transformers does).
  const std::vector<std::string>& unused_weights() const { return unused_weights_; }
  int64_t num_parameters() const;

  // LoRA (trl/models/lora.h, docs/LORA.md). with_adapter: this model with `adapter` attached: its lora tensors join
  // the weights (in the model's dtype) and every adapted linear layer adds scaling·(x·Aᵀ)·Bᵀ in every graph (after
  // dropout(x) in the training graphs, whose input lora_dropout_seed [2] i32 the trainer binds); its
  // modules_to_save weights replace the base's. Not under tensor parallel.
  CausalLM with_adapter(const LoraAdapter& adapter) const;
  // The base model: the weights without the adapter's tensors (modules_to_save keep the weights they have now).
  CausalLM without_adapter() const;
  // A plain model with the adapter merged into its weights (W + scaling·B·A): it computes what this one does.
  CausalLM merged() const;
  const LoraConfig* lora() const { return lora_ ? &lora_->config : nullptr; }
  // The adapted modules (model order); empty without an adapter.
  const std::vector<std::string>& lora_modules() const;
  // The adapter's tensors: lora_A / lora_B of every module, then the modules_to_save weights (by parameter name).
  std::vector<std::string> lora_parameters() const;
  // What training updates: every parameter of a plain model; with an adapter only lora_parameters() (the base
  // weights stay frozen: no gradient, master or optimizer state).
  std::vector<std::string> trainable_parameters() const;

  // Adds the forward pass for a [B,T] batch to `b`. Declares the inputs input_ids, position_ids and
  // attention_mask ([B,T] i32) and one input per parameter (by its HF name); returns logits [B,T,V] in the
  // model's dtype.
  graph::ValueId build_forward(graph::Builder& b, int64_t batch, int64_t tokens) const;
  graph::Graph forward_graph(int64_t batch, int64_t tokens) const;
  // log p(labels[b, t] | ids[b, ≤t]) for every position: inputs as forward_graph plus labels [B,T] i32; output
  // token_logprobs [B,T] f32, one chunked pass over the vocabulary (no [B,T,V] logits). `trl score` and the
  // frozen reference model of DPO and KTO run it. With a temperature T ≠ 1: the log-probs of logits / T (GRPO's).
  // logits_to_keep K > 0: only the K positions predicting each row's last K tokens (vocab_positions).
  graph::Graph logprobs_graph(int64_t batch, int64_t tokens, double temperature = 1.0, int64_t logits_to_keep = 0) const;
  // The same with a mixture of experts' load-balancing loss as a second output, aux_loss [] f32 (an evaluation's
  // aux loss; a dense model's graph has no such output).
  graph::Graph logprobs_aux_graph(int64_t batch, int64_t tokens) const;
  // Forward only: a reward model's score head (score.weight [1, C], no bias, in the model dtype) at every
  // position, output "rewards" [B,T] f32 (trl/models/reward_model.h; its training program is the reward trainer's,
  // trl/train/objectives.h).
  graph::Graph reward_graph(int64_t batch, int64_t tokens) const;
  // The decoder up to the final norm: returns h [B,T,C]; *head receives the lm_head weight value. With `cache`,
  // the layers also write their keys and values into a static KV cache (below) and, when decoding, attend over it.
  struct CacheSpec {
    int64_t length = 0;   // max_cache_len S
    bool decode = false;  // false: prefill (attend within the T new tokens); true: attend over the cache
    int64_t rows = 0;     // > 0: a cache of this many rows shared by batches of any size (slots_graph)
  };
  graph::ValueId build_hidden(graph::Builder& b, int64_t batch, int64_t tokens, graph::ValueId* head, const CacheSpec* cache = nullptr,
                              std::vector<graph::ValueId>* cache_out = nullptr) const;
  // What the vocabulary ops (token_logprobs, entropy, token_argmax_match) of a graph that build_hidden made take:
  // the hidden state, the lm_head and its split. Under tensor parallel the lm_head is this rank's vocabulary rows
  // and h passes through all_reduce_grad (each rank's rows give part of its gradient); no rank forms [B, T, V].
  struct VocabHead {
    graph::ValueId h, w;
    graph::VocabSplit split;
  };
  VocabHead vocab_head(graph::Builder& b, graph::ValueId h, graph::ValueId head) const;

  // Generation with a static KV cache (docs/GENERATION.md): one prefill program per (batch, prompt bucket) and one
  // decode program per (batch, cache length), whatever the number of tokens generated.
  // Inputs: input_ids, position_ids [B,T] i32; attention_mask [B,T] (prefill) or [B,S] (decode: 1 where a cache
  // slot holds a real token, 0 for padding and empty slots); cache_position [1] i32 (the slot of the first new
  // token); decode also query_positions [B,T] i32 (each new token's slot); and the cache itself,
  // past_key_values.{layer}.key/value [B,S,Hkv,D] in the model's dtype, updated in place.
  // Outputs: logits of the last position [B,V] (model dtype), then the updated key and value caches per layer.
  // Under tensor parallel: this rank's kv heads in the cache ([B,S,Hkv/size,D]) and its columns of the logits
  // ([B,V/size]; generate() joins the ranks' columns). forward_graph's logits likewise.
  graph::Graph prefill_graph(int64_t batch, int64_t tokens, int64_t cache_len) const;
  graph::Graph decode_graph(int64_t batch, int64_t cache_len) const;
  // Continuous batching (trl serve): B rows of T new tokens each, written into and attending over rows of one shared
  // cache of `cache_rows` rows. Inputs as decode_graph's, except: cache_position [B] (row b's first new slot),
  // cache_rows [B] i32 (the cache row of batch row b), and the cache is [cache_rows, S, Hkv, D]. T = 1 is a decode
  // step; T > 1 a chunk of a prompt (prefilled chunk by chunk into its row). Output: the logits of each row's last
  // position [B, V], then the caches.
  graph::Graph slots_graph(int64_t batch, int64_t tokens, int64_t cache_rows, int64_t cache_len) const;

  // The objectives' building blocks (the training programs themselves are the trainers', trl/train/objectives.h).
  // build_training_hidden: build_hidden as a training graph runs it, with a LoRA adapter's dropout active when
  // `dropout` (its input lora_dropout_seed [2] i32 declared). With `aux_loss` and a mixture-of-experts model:
  // *aux_loss receives the load-balancing loss of the batch ([] f32, Transformers' load_balancing_loss_func over
  // the sparse layers, padding excluded; not yet scaled by router_aux_loss_coef); kNone for a dense model.
  graph::ValueId build_training_hidden(graph::Builder& b, int64_t batch, int64_t tokens, graph::ValueId* head, bool dropout = true,
                                       graph::ValueId* aux_loss = nullptr) const;
  // The hidden state the vocabulary ops read: h / temperature (logits / T = (h / T) · head, a finite T > 0), then with
  // logits_to_keep K > 0 (TRL's option) only the K positions of each row that predict its last K tokens,
  // [T − 1 − K, T − 1), gathered by the input kept_positions [B, K] i32 (their flat indices b·T + t, bound by the
  // caller): [B, T or K, C] in the model's dtype.
  graph::ValueId vocab_positions(graph::Builder& b, graph::ValueId h, int64_t batch, int64_t tokens, double temperature, int64_t logits_to_keep) const;
  std::string lm_head_name() const { return config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"; }
  // Runs the forward pass; returns f32 logits [B,T,V].
  Tensor forward(const Batch& batch, Backend& backend) const;

  // Writes config.json, generation_config.json (when known) and the weights (sharded above max_shard_bytes;
  // 0 = one file). Tokenizer files are the caller's (see init.h).
  void save_pretrained(const std::string& dir, uint64_t max_shard_bytes = 5'000'000'000ull) const;

 private:
  ModelConfig config_;
  TensorMap weights_;
  DType dtype_ = DType::F32;
  std::string path_;
  std::vector<std::string> unused_weights_;
  std::string device_ = "cpu";
  TensorParallel tp_;
  std::shared_ptr<const LoraAdapter> lora_;  // config and modules (its tensors are in weights_)
  graph::VocabSplit vocab_split() const;
  graph::ValueId build_decoder(graph::Builder& b, int64_t batch, int64_t tokens, graph::ValueId* head, const CacheSpec* cache,
                               std::vector<graph::ValueId>* cache_out, bool training, std::vector<graph::ValueId>* router_stats) const;  // this rank's rows of the vocabulary (none without tensor parallel)
};

}  // namespace trl

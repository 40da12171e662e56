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
  // logits_to_keep K > 0: only the K positions predicting each row's last K tokens (as training_graph's).
  graph::Graph logprobs_graph(int64_t batch, int64_t tokens, double temperature = 1.0, int64_t logits_to_keep = 0) const;
  // A reward model's training program (AutoModelForSequenceClassification with num_labels 1): the backbone, then
  // the `score` head (score.weight [1, C], no bias, in the model dtype) at every position: rewards [B,T] f32, a
  // stage-0 output. reward_weights [B,T] f32 is the seed: the trainer pools each row's reward at its last real
  // token, computes the loss on the host and seeds dL/dreward there (0 elsewhere). Outputs: loss (Σ rewards·seed,
  // not the trainer's loss), grad.<p> for every backbone parameter and score.weight (lm_head has none), rewards.
  graph::Graph reward_training_graph(int64_t batch, int64_t tokens, bool gradient_checkpointing = false) const;
  // Forward only: the score head's reward at every position, output "rewards" [B,T] f32 (inputs as
  // reward_training_graph's, without the seed).
  graph::Graph reward_graph(int64_t batch, int64_t tokens) const;
  // The decoder up to the final norm: returns h [B,T,C]; *head receives the lm_head weight value. With `cache`,
  // the layers also write their keys and values into a static KV cache (below) and, when decoding, attend over it.
  struct CacheSpec {
    int64_t length = 0;   // max_cache_len S
    bool decode = false;  // false: prefill (attend within the T new tokens); true: attend over the cache
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

  // Training: loss = Σ log p(labels)·loss_weights over [B,T], computed without materialising [B,T,V] logits
  // (token_logprobs), and the gradient of every parameter. Trainers choose the weights (SFT: -mask/num_items).
  // Inputs: input_ids, position_ids, attention_mask, labels (i32 [B,T]: the next token at each position, any valid
  // id where the weight is 0), loss_weights (f32 [B,T]), and the parameters.
  // Outputs: loss (f32 scalar), then the gradient of each parameter in parameter_shapes() order (f32).
  // gradient_checkpointing: keep only each layer's input and recompute the layer in the backward pass
  // (graph::rematerialize); same results bit for bit, about one layer's activations alive instead of all.
  // metrics: two more outputs after the gradients, per token [B,T] f32: the entropy of the predicted distribution
  // and 1 where the label is the argmax prediction (TRL's `entropy` and `mean_token_accuracy` come from them).
  // logit_sums: then logit_sum [B,T] f32, Σ over the vocabulary of each position's logits (TRL's logits/* metrics).
  // Last, token_logprobs [B,T] f32: log p(labels) per token.
  // loss_weights is the graph's seed: as a two-stage program (Program::run_stage), stage 0 binds everything else
  // and returns token_logprobs (and the metrics); stage 1 binds loss_weights = dL/d token_logprobs, for any loss L
  // of the per-token log-probs computed on the host in between, and returns the gradients of that L.
  // temperature T ≠ 1: every vocabulary quantity (log-probs, entropy, logit sums) is of logits / T (GRPO, RLOO).
  // logits_to_keep K > 0 (TRL's option of that name): the vocabulary ops run only at the K positions that predict
  // each row's last K tokens, [T − 1 − K, T − 1); labels, loss_weights and the per-token outputs are then [B, K],
  // and the input kept_positions [B, K] i32 holds those positions' flat indices b·T + t (token_train_step binds it).
  struct TrainingSpec {
    int64_t batch = 1, tokens = 1;
    DType grad_dtype = DType::F32;        // the gradients' dtype (F64 for the finite-difference tests)
    bool gradient_checkpointing = false;
    bool metrics = false;                 // the entropy and token_accuracy outputs
    bool logit_sums = false;              // the logit_sum output
    double temperature = 1.0;
    int64_t logits_to_keep = 0;
  };
  graph::Graph training_graph(const TrainingSpec& spec) const;
  // The plain objective of a [batch, tokens] batch: no metrics, f32 gradients, temperature 1.
  graph::Graph training_graph(int64_t batch, int64_t tokens) const { return training_graph(TrainingSpec{.batch = batch, .tokens = tokens}); }
  // Distillation (docs/DISTILLATION.md). hidden_graph: the teacher's side, forward only: the final hidden state
  // [B, Tk, C] in the model's dtype ("hidden"), divided by `temperature` and, with logits_to_keep K > 0, gathered at
  // kept_positions [B, K] i32 as training_graph's. The lm_head it pairs with is the weight named lm_head_name().
  graph::Graph hidden_graph(int64_t batch, int64_t tokens, double temperature = 1.0, int64_t logits_to_keep = 0) const;
  std::string lm_head_name() const { return config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"; }
  // The student's side: loss = Σ jsd·loss_weights, jsd the generalized JSD (graph::Op::Jsd, β = beta) between
  // softmax(logits / temperature) of this model and of the teacher, whose hidden state (hidden_graph's output on the
  // same rows and kept positions) and lm_head are the inputs teacher_hidden [B, Tk, Ct] and teacher_lm_head [V, Ct]
  // in the teacher's dtype. Other inputs as training_graph's (no labels); loss_weights [B, Tk] f32. Outputs: loss,
  // grad.<p> of trainable_parameters() (with `backward`), then jsd [B, Tk] f32 per position. dropout false: a LoRA
  // adapter's dropout is off (TRL's disable_dropout).
  struct TeacherShape {
    int64_t hidden_size = 0;
    DType dtype = DType::F32;
  };
  struct DistillationSpec {
    int64_t batch = 1, tokens = 1, logits_to_keep = 0;
    TeacherShape teacher;
    double beta = 0.5, temperature = 1.0;
    bool gradient_checkpointing = false;
    bool backward = true;  // false: the loss and jsd only (evaluation)
    bool dropout = true;   // false: a LoRA adapter's dropout is off
  };
  graph::Graph distillation_graph(const DistillationSpec& spec) const;
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
                               std::vector<graph::ValueId>* cache_out, bool training) const;  // this rank's rows of the vocabulary (none without tensor parallel)
};

}  // namespace trl

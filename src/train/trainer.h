// The Trainer: one loop for every training method (docs/TRAINING.md, "The Trainer and its methods").
//
// The Trainer owns what every method shares: f32 master weights and their compute copies, AdamW, the schedule,
// the seeded data order, micro-batches and gradient accumulation, global-norm clipping, logging (log.jsonl,
// trainer_state.json, progress, the HTML report), evaluation times, checkpoints with exact resume and Ctrl-C, and
// the policy's backend and program cache. A method (SFT, DPO, ...) says what the rest is: how many training items
// there are, how the items of a micro-batch become fixed-shape batches, which programs compute the loss, its
// metrics and the gradients, and which frozen models it keeps beside the policy.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "trl/backend/backend.h"
#include "trl/backend/program_cache.h"
#include "trl/data/dataset.h"
#include "trl/dist/communicator.h"
#include "trl/models/causal_lm.h"
#include "trl/train/training_args.h"

namespace trl {

// Per-micro-batch metrics a logging window averages, in the order they were first added (TRL stores each metric
// per batch and logs the mean of what was stored since the last log).
class MetricWindow {
 public:
  void add(const std::string& name, double value);
  bool empty() const { return sums_.empty(); }
  // name → mean over the values added since the last clear().
  nlohmann::ordered_json means() const;
  // name → [sum, count] (the ranks' windows are merged from these).
  nlohmann::ordered_json sums() const;
  void clear() { sums_.clear(); }

 private:
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> sums_;
};

// What a method sees of the policy while it computes a step or an evaluation.
struct MethodContext {
  const CausalLM& model;      // the policy's architecture, bound to the compute weights
  const TensorMap& weights;   // the compute weights by parameter name (graph inputs)
  ProgramCache& programs;     // the policy's programs: they share one arena, so a program's outputs are read
                              // before the next one runs
  const TrainingArguments& args;
  int64_t global_step = 0;  // optimizer steps done before this one
  int64_t epoch = 0;        // the epoch this step belongs to
  // Data parallel: the ranks that share each step (size 1 with one process). Every rank holds the whole dataset
  // and its own slice of each micro-batch; a method's collectives over `dp` are called by every rank in the same
  // order (a micro-batch this rank has no rows of included).
  dist::Communicator& dp;
  // The backend the programs run on: the weights, gradients and optimizer state live in its memory.
  Backend& backend;
  // The rows of each micro-batch of the step over all ranks (micro_rows[k] >= this rank's micro[k].size()).
  std::vector<int64_t> micro_rows = {};
  // Appends rows to output_dir/completions.jsonl (rank 0), under the rule of the run's files (log.jsonl's).
  std::function<void(const std::string& lines)> append_completions = {};

  // A host tensor a program reads (the batch), in the backend's memory: uploaded to a device, as it is on the host.
  Tensor to_backend(const Tensor& host, const std::string& name) const { return trl::to_backend(backend, host, name); }
  // An output the host reads (a loss, per-token metrics): downloaded from a device, as it is on the host.
  Tensor to_host(const Tensor& t) const { return trl::to_host(backend, t); }

  // The weight of this rank's rows in micro-batch k's mean: a method that averages over the rows of a micro-batch
  // scales its local mean by this (1 with one process), so that the ranks' shares sum to the mean over all rows.
  double share(size_t k, size_t local_rows) const {
    return micro_rows.empty() ? 1.0 : static_cast<double>(local_rows) / static_cast<double>(micro_rows.at(k));
  }
};

// A micro-batch's gradients, by graph output name ("grad.<parameter>"), of its share of the step's loss (the
// method has already normalised it for accumulation). Views into the program's arena may be passed: the Trainer
// copies or sums them before the next program runs.
using GradientSink = std::function<void(const std::map<std::string, Tensor>& grads)>;

struct MethodStep {
  double loss = 0;          // the step's loss as logged (the micro-batches' normalised losses, summed)
  int64_t tokens = 0;       // real tokens the step consumed (num_tokens)
  double data_seconds = 0;  // of the step's time: tokenized items → batches
};

struct FrozenMemory {
  uint64_t weights = 0, arena = 0;
};

class TrainingMethod {
 public:
  virtual ~TrainingMethod() = default;
  // "SFT", "DPO": messages and the report's title.
  virtual const char* name() const = 0;
  // The training items (rows, pairs or packed rows) that batches draw from; the Trainer shuffles their indices.
  virtual size_t num_items() const = 0;
  // true: the items are handed out in their own order every epoch, whatever train_sampling_strategy (a method
  // that samples by itself: GRPO's items are slots of its generation rounds, their prompts drawn by its sampler).
  virtual bool sequential_items() const { return false; }
  // How many programs the policy's cache keeps (each bucket of lengths is one program).
  virtual size_t programs_to_keep() const = 0;
  // Called once before the first step (a resumed run included): frozen-model passes such as
  // precompute_ref_log_probs.
  virtual void before_training(MethodContext&) {}
  // One optimizer step: micro[k] are this rank's item indices of micro-batch k (empty when the last, short
  // micro-batch of an epoch has no rows for this rank). Calls `add` once per non-empty micro-batch and adds its
  // per-micro-batch metrics to `metrics`. Under data parallel the loss it returns and the gradients it hands are
  // this rank's share of the step's (the Trainer sums them over the ranks).
  virtual MethodStep step(const std::vector<std::vector<size_t>>& micro, MethodContext& ctx, MetricWindow& metrics, const GradientSink& add) = 0;
  // Parameters the policy trains beyond the model's own (a reward model's score.weight), f32 or its dtype; and the
  // model's parameters it does not train (kept as compute inputs, no masters or moments: a reward model's lm_head).
  virtual TensorMap extra_parameters() const { return {}; }
  virtual std::vector<std::string> frozen_parameters() const { return {}; }
  // Writes the model's weight and config files into `dir` (the weights in the save dtype, by name); false: the
  // Trainer saves a causal LM.
  virtual bool write_model(const std::string& /*dir*/, const TensorMap& /*weights*/, DType /*dtype*/) const { return false; }
  // The training program of the method's largest micro-batch of `batch` items (the most rows, each of the longest
  // length the data holds), for the memory check before the first step; nullopt: not known (no check).
  virtual std::optional<graph::Graph> largest_program(const CausalLM& /*model*/, int64_t /*batch*/) const { return std::nullopt; }
  // The frozen models the method holds beside the policy: their weights, and the working memory of their largest
  // program for micro-batches of `batch` items (planned, not allocated).
  virtual FrozenMemory frozen_memory(int64_t /*batch*/) { return {}; }
  // Called after every optimizer step with the new step number and the f32 master weights (TR-DPO's reference
  // update).
  virtual void after_step(int64_t /*global_step*/, const TensorMap& /*master*/) {}
  // What the method keeps between steps that a checkpoint must hold for an exact resume (GRPO's generated batch
  // when it spans several steps): written into, and read back from, the checkpoint folder.
  virtual void save_state(const std::string& /*dir*/) const {}
  virtual void load_state(const std::string& /*dir*/) {}
  // Sample rows for the HTML report (log_completions): {"step", "prompt", "completion", "rewards", "advantage"}.
  virtual std::vector<nlohmann::ordered_json> report_samples() const { return {}; }
  virtual bool has_eval() const { return false; }
  // eval_loss and the method's eval_* metrics over its eval dataset with the current weights.
  virtual nlohmann::ordered_json evaluate(MethodContext& ctx);
};

// The file a dataset's rows came from ("data.jsonl" of "data.jsonl:12" or "data.json[3]"); "" when unknown. The
// report's default dataset name.
std::string dataset_source_file(const Dataset& data);

class Trainer {
 public:
  // `model` supplies the architecture and the starting weights (f32 masters; bf16 compute copies when args.bf16).
  // `config_name` ("SFTConfig") prefixes option errors. The method is attached after construction, because it may
  // need the backend's bucket (auto_pad_multiple()).
  Trainer(const CausalLM& model, const TrainingArguments& args, const char* config_name);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  int64_t auto_pad_multiple() const { return backend_->auto_pad_multiple(); }
  // The ranks that split each batch between them (the world without tensor parallel; world / tp_size with it).
  int64_t data_parallel_size() const;
  int64_t data_parallel_rank() const;
  const std::string& device() const { return device_; }
  // Checks that the method has items and a full batch, and sizes the program cache by it.
  void set_method(std::unique_ptr<TrainingMethod> method);
  TrainingMethod& method() { return *method_; }
  // The training loop: see SFTTrainer::train (include/trl/train/sft_trainer.h) for what it saves and when.
  TrainOutput train();
  nlohmann::ordered_json evaluate();
  void save_model(const std::string& dir) const;
  // The weights as the trainer holds them: in the backend's memory (a device's: read them through to_host).
  const TensorMap& master_weights() const;
  const TensorMap& compute_weights() const;
  // Host copies of tensors in the backend's memory (the same tensors on a host backend).
  TensorMap to_host(const TensorMap& tensors) const;
  // What crossed between the host and the backend's memory so far (nothing on a host backend).
  Backend::Transfers transfers() const { return backend_->transfers(); }
  const CausalLM& model() const;
  const ProgramCacheStats& program_stats() const;
  std::function<void(const nlohmann::ordered_json&)> on_step;
  std::function<void(const nlohmann::ordered_json&)> on_log;  // see BaseTrainer::on_log
  std::function<bool()> stop_requested;                       // see BaseTrainer::stop_requested
  // See BaseTrainer::on_pre_optimizer_step.
  std::function<void(int64_t step, const TensorMap& grads)> on_pre_optimizer_step;

 private:
  struct State;
  std::unique_ptr<Backend> backend_;
  std::string device_;
  std::unique_ptr<TrainingMethod> method_;
  std::unique_ptr<State> s_;
};

}  // namespace trl

// The Trainer's state, private to src/train: trainer.cpp runs the loop, saves and resumes; trainer_dist.cpp holds
// what the ranks share (the tensor-parallel and data-parallel groups, FSDP's shards, the joins of tensor-parallel
// slices, the agreements between data-parallel ranks). docs/TRAINING.md and docs/DISTRIBUTED.md describe both.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/memory.h"
#include "core/rng.h"
#include "dist/fsdp.h"
#include "train/optim/adamw.h"
#include "train/report.h"
#include "train/saved_state.h"
#include "train/tensorboard.h"
#include "train/trainer.h"

namespace trl {

// The collective group of a trainer's tensor-parallel ranks (core/collectives.h): its programs' all_reduce nodes
// name it.
constexpr int32_t kTensorParallelGroup = 100;
// The compute-weights entry the training programs of a model with LoRA dropout read their mask seed from
// (CausalLM::with_adapter); the Trainer sets it before every micro-batch.
constexpr const char* kDropoutSeed = "lora_dropout_seed";

struct StepResult {
  double loss = 0, grad_norm = 0, lr = 0, data_seconds = 0, step_seconds = 0, comm_seconds = 0;
  bool interrupted = false;  // Ctrl-C on any rank
};

// A step's micro-batches: this rank's item indices of each, and each one's rows over all ranks.
struct StepItems {
  std::vector<std::vector<size_t>> local;
  std::vector<int64_t> rows;
};

// A cheap fingerprint of weights that equal weights share (trainer_dist.cpp).
uint64_t weights_fingerprint(const TensorMap& weights);

struct Trainer::State {
  TrainingArguments cfg;
  std::string config_name;
  CausalLM model;  // the architecture (weights in the compute dtype; the graph inputs are bound explicitly)
  DType save_dtype;
  std::string source_dir;  // the model folder: tokenizer and generation files are copied from it
  // master: the f32 masters of the trained parameters; under FSDP this rank's pieces of them (1-D, by name; in an
  // f32 run views of the compute weights). compute: every parameter in the compute dtype. Both are of this rank's
  // slices of the parameters under tensor parallel, else of whole parameters.
  TensorMap master, compute;
  std::map<std::string, Shape> trained;  // every trained parameter's shape on this rank (whole_shape: the whole)
  // FSDP (fsdp_size > 1): the flat shard layout, the group of ranks that shard the state between them, the ranks
  // that hold the same shard in the other groups, this rank's shard of the step's gradient sum ([S] f32), and the
  // pieces of the bf16 compute weights that AdamW writes.
  std::unique_ptr<dist::FlatShards> shards;
  std::unique_ptr<dist::Communicator> shard_group, replicas;
  Tensor shard_grad;
  TensorMap compute_pieces;
  // The step's gradients: the program's own outputs when a step is one micro-batch (views into its arena, used
  // before the next program runs), else sums in `accumulated` (allocated at the first accumulating step).
  TensorMap grads, accumulated;
  AdamW opt;
  std::unique_ptr<ProgramCache> programs;
  Backend* backend = nullptr;  // the policy's (Trainer::backend_)
  TrainingMethod* method = nullptr;
  int64_t global_step = 0, tokens_seen = 0;
  std::vector<nlohmann::ordered_json> log_history;
  std::function<void(const nlohmann::ordered_json&)> on_log;  // Trainer::on_log, called with each entry log() keeps
  std::unique_ptr<TensorBoardWriter> tensorboard;  // report_to tensorboard: opened on rank 0 at the first log entry
  std::string model_name;  // for the report
  dist::Communicator& comm;  // every rank of the job
  // Tensor parallel (tp_size > 1): the ranks [g·tp, (g+1)·tp) each hold a slice of the model
  // (CausalLM::tensor_parallel_shard) and run every program together (collective group kTensorParallelGroup);
  // `dp` are the ranks that hold the same slice, between which data parallel and FSDP work as without tensor
  // parallel. Without it, dp is the world.
  std::unique_ptr<dist::Communicator> tp_group, dp_group;
  dist::Communicator* dp = nullptr;
  double tp_seconds = 0;  // spent in the programs' tensor-parallel all-reduces (logged in comm_seconds)

  State(const CausalLM& m, const TrainingArguments& c, const char* name);
  ~State();

  MethodContext context() {
    MethodContext c{model, compute, *programs, cfg, global_step, global_step / steps_per_epoch(), *dp, *backend};
    c.append_completions = [this](const std::string& lines) { append_completions(lines); };
    return c;
  }
  bool is_main() const { return comm.rank() == 0; }
  bool fsdp() const { return shards != nullptr; }
  int64_t tp() const { return cfg.distributed.model_parallel_size(); }
  // The whole shape of trained parameter `name` (`trained` holds this rank's: a slice under tensor parallel).
  Shape whole_shape(const std::string& name) const {
    Shape s = trained.at(name);
    if (const int axis = tensor_parallel_axis(name); tp() > 1 && axis >= 0) s[static_cast<size_t>(axis)] *= tp();
    return s;
  }
  // Rows of a micro-batch over all data-parallel ranks: each takes per_device_train_batch_size of them.
  int64_t micro_rows() const { return cfg.per_device_train_batch_size * dp->size(); }
  int64_t micro_batches() const {
    const int64_t n = static_cast<int64_t>(method->num_items()), b = micro_rows();
    return cfg.dataloader_drop_last ? n / b : (n + b - 1) / b;
  }
  int64_t steps_per_epoch() const {
    const int64_t mb = micro_batches(), ga = cfg.gradient_accumulation_steps;
    return std::max<int64_t>(1, mb / ga + (mb % ga > 0 ? 1 : 0));
  }
  int64_t total_steps() const {
    return cfg.max_steps > 0 ? cfg.max_steps : static_cast<int64_t>(std::ceil(cfg.num_train_epochs * static_cast<double>(steps_per_epoch())));
  }
  int64_t warmup() const {
    const double w = cfg.warmup_steps, total = static_cast<double>(total_steps());
    if (w >= 1) return static_cast<int64_t>(w);  // Transformers' get_warmup_steps
    return static_cast<int64_t>(std::ceil((w > 0 ? w : cfg.warmup_ratio) * total));
  }
  // The order of the items in `epoch`: a seeded Fisher-Yates shuffle, the same on every run and on resume.
  std::vector<size_t> order(int64_t epoch) const {
    std::vector<size_t> o(method->num_items());
    std::iota(o.begin(), o.end(), 0);
    if (cfg.train_sampling_strategy == "sequential" || method->sequential_items()) return o;
    SplitMix64 rng(cfg.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1);
    for (size_t i = o.size(); i > 1; --i) std::swap(o[i - 1], o[rng.next() % i]);
    return o;
  }
  std::string out_path(const std::string& name) const { return (std::filesystem::path(cfg.output_dir) / name).string(); }

  // Training (below).
  void resume(const std::string& spec);
  void check_resumed_layout(const SavedTrainerState& state, const std::string& dir) const;
  struct MemoryPlan {
    uint64_t more = 0;  // bytes still to allocate
    MemoryBudget budget;
    std::string held, parts;  // what is held now, and what `more` is made of
    bool fits() const { return budget.available == 0 || more <= budget.available; }
  };
  std::optional<MemoryPlan> plan_memory(int64_t batch);
  void check_memory(bool resumed);
  StepItems step_items(const std::vector<size_t>& order, int64_t within) const;
  nlohmann::ordered_json global_means(const MetricWindow& metrics) const;
  void check_ranks_agree() const;
  void shard_state();
  // A device backend: the masters and compute weights move to its memory once (a tensor that is both, in an f32
  // run, once); from then on only the batch goes up and the losses and metrics come down.
  void move_weights_to_backend();
  TensorMap to_host(const TensorMap& tensors) const;
  void reduce_gradients_to_shard();
  void report_shard() const;
  TensorMap whole(const TensorMap& pieces) const;
  // The dtype a trained parameter is saved in: the model's, but f32 for LoRA's A and B (PEFT keeps adapters in f32).
  DType save_dtype_of(const std::string& name) const {
    return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight") ? DType::F32 : save_dtype;
  }
  TensorMap join_slices(const TensorMap& local) const;
  TensorMap whole_masters_for_saving() const;
  TensorMap weights_to_save(const TensorMap& whole_master) const;
  bool saving_needs_masters() const;
  void add_gradients(const std::map<std::string, Tensor>& out, size_t k, size_t n);
  double clip_gradients(double step_loss);
  StepResult train_step(const std::vector<size_t>& order, MetricWindow& metrics,
                        const std::function<void(int64_t, const TensorMap&)>& pre_optimizer);
  // The run's files in output_dir follow its state (docs/TRAINING.md, "Output"): log.jsonl always equals the
  // log_history of the trainer_state.json beside it, when there is one. Nothing changes before the run's first
  // entry, so a run that fails before it leaves an earlier run's files as they were. At its first entry (a log line,
  // a completions row or the final save) the run takes the files over: an earlier run's trainer_state.json goes,
  // log.jsonl is rewritten atomically with log_history (a resume's entries, steps <= N), completions.jsonl keeps the
  // rows of steps <= N (none in a fresh run); then entries are appended.
  void start_log();  // records the step the run starts from
  void take_over_run_files();
  void log(nlohmann::ordered_json entry);
  bool wants_tensorboard() const;  // report_to tensorboard or all
  void open_tensorboard();         // rank 0, at the first entry
  void log_to_tensorboard(const nlohmann::ordered_json& entry);
  void append_completions(const std::string& lines);
  int64_t log_start_step = 0;
  bool run_files_taken = false;
  // Saving.
  // weights: the trained weights, whole, in the save dtype (State::weights_to_save).
  void write_model_files(const std::string& dir, const TensorMap& weights) const;
  nlohmann::ordered_json trainer_state() const;
  // The whole f32 masters and AdamW moments, and the weights to save, as a checkpoint holds them: on rank 0 (every
  // rank calls: a collective under FSDP and tensor parallel).
  struct WholeState {
    TensorMap master, exp_avg, exp_avg_sq, weights;
  };
  WholeState whole_state() const {
    WholeState w{join_slices(whole(master)), join_slices(whole(opt.exp_avg())), join_slices(whole(opt.exp_avg_sq())), {}};
    w.weights = weights_to_save(w.master);
    return w;
  }
  void write_checkpoint_files(const std::string& dir, const WholeState& state) const;
  std::string resume_advice(bool disk_full) const;
  std::string save_checkpoint();
  void rotate_checkpoints() const;
  void save_final(const RunSummary* summary);
};

}  // namespace trl

// What every trainer (SFTTrainer, DPOTrainer, KTOTrainer, RewardTrainer) offers, as TRL's trainers share
// transformers.Trainer's train/evaluate/save_model: the loop itself is the internal Trainer (src/train/trainer.h).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "trl/backend/backend.h"
#include "trl/backend/program_cache.h"
#include "trl/core/tensor.h"
#include "trl/train/training_args.h"

namespace trl {

class Trainer;

class BaseTrainer {
 public:
  virtual ~BaseTrainer();
  BaseTrainer(const BaseTrainer&) = delete;
  BaseTrainer& operator=(const BaseTrainer&) = delete;
  // Trains to max_steps (else num_train_epochs). Every save_steps (the last step included when it is a multiple)
  // it saves output_dir/checkpoint-N, written into checkpoint-N.tmp and renamed; at the end the final model,
  // trainer_state.json and training_report.html go into output_dir all or nothing (as save_model). A failed save
  // removes its partial folder and throws; checkpoints already saved stay. output_dir/log.jsonl always equals
  // log_history: a fresh run starts it anew, a resume from checkpoint-N rewrites it with that checkpoint's entries.
  // Before the first step the run's memory is checked (docs/TRAINING.md, "Memory").
  TrainOutput train();
  // eval_loss and the method's eval_* metrics over the eval dataset with the current weights (as logged at eval time).
  nlohmann::ordered_json evaluate_metrics();
  // Writes the model (in the dtype it was loaded with), its config and the tokenizer files to `dir`, all or nothing:
  // the files are written into `dir`/.final.tmp and renamed into `dir` only once every one of them was written; on
  // an error (a full disk) the temp folder is removed, `dir`'s files are left as they were, and the trl::Error says
  // what failed.
  void save_model(const std::string& dir) const;
  // The trained parameters' f32 master weights, by name (under FSDP this rank's pieces of them: 1-D runs of their
  // elements, docs/DISTRIBUTED.md).
  const TensorMap& master_weights() const;
  // Host copies of the master weights: on a device backend they live in its memory (master_weights() holds tensors
  // the host cannot read); on the host, the same tensors.
  TensorMap master_weights_on_host() const;
  // What crossed between the host and the backend's memory so far (nothing on a host backend).
  Backend::Transfers transfers() const;
  const ProgramCacheStats& program_stats() const;
  // Called after every optimizer step with that step's loss, grad_norm, learning_rate, num_tokens, step, max_steps
  // and epoch (tests, progress displays, Transformers' TrainerCallback.on_step_end).
  std::function<void(const nlohmann::ordered_json&)> on_step;
  // Called with every entry that joins log_history (training logs and evaluations, with their epoch and step), on
  // the rank that writes log.jsonl, after it was written: Transformers' TrainerCallback.on_log.
  std::function<void(const nlohmann::ordered_json&)> on_log;
  // Asked at the end of every step (after its logging, evaluation and checkpoint): true ends the run there as at
  // its last step, final save included (Transformers' TrainerControl.should_training_stop).
  std::function<bool()> stop_requested;
  // Called at every optimizer step (1, 2, ...) after clipping and before AdamW, with the step's f32 gradient of each
  // trained parameter by name, as Transformers' TrainerCallback.on_pre_optimizer_step (the views are valid only
  // during the call; under FSDP this rank's pieces).
  std::function<void(int64_t step, const TensorMap& grads)> on_pre_optimizer_step;

 protected:
  BaseTrainer();
  std::unique_ptr<Trainer> trainer_;
};

}  // namespace trl

// A frozen model beside the policy (DPO's and KTO's reference; later GRPO's reference and distillation's
// teacher): a second set of weights in the compute dtype with forward-only programs on a backend of its own, so it
// may run while the policy's two-stage program is between its stages. No f32 masters, gradients or optimizer state.
#pragma once

#include <memory>
#include <vector>

#include "train/sequence_step.h"
#include "train/trainer.h"
#include "trl/backend/backend.h"
#include "trl/backend/program_cache.h"
#include "trl/models/causal_lm.h"

namespace trl {

class FrozenModel {
 public:
  // `given` (another checkpoint, with the policy's vocabulary), else a copy of the trainer's starting compute
  // weights, as TRL copies the policy when no ref_model is given; with a LoRA adapter on the policy, its base with
  // the adapter disabled (PEFT's reference), sharing the frozen base weights.
  FrozenModel(const CausalLM* given, const Trainer& trainer, size_t programs_to_keep);
  // A distillation teacher: `teacher` itself (its weights shared, in its own dtype), which must have the policy's
  // vocabulary.
  struct Teacher {};
  FrozenModel(Teacher, const CausalLM& teacher, const Trainer& trainer, size_t programs_to_keep);
  // The summed completion log-probs of each sequence.
  std::vector<double> sequence_logps(const SequenceBatch& batch);
  // log p(labels) at every position [B, T] f32, of logits / temperature (GRPO's reference): its program's output in
  // its backend's memory, valid until that program runs again.
  Tensor token_logprobs(const SFTBatch& batch, double temperature = 1.0, int64_t logits_to_keep = 0);
  // The final hidden state divided by `temperature` at the kept positions [B, K] i32 (CausalLM::hidden_graph),
  // [B, K, C] in the model's dtype.
  Tensor hidden_states(const SFTBatch& batch, const Tensor& kept_positions, double temperature);
  const CausalLM& model() const;
  // Its weights and the arena of its forward-only log-prob program for `rows` × `tokens` (compiled, not cached or
  // allocated); nothing once released.
  FrozenMemory memory(int64_t rows, int64_t tokens);
  ProgramCache& programs();
  // TR-DPO's update: each weight becomes alpha · policy + (1 − alpha) · itself (policy: f32, by name), stored in
  // new tensors in its dtype (never written in place: a given model's tensors stay the caller's).
  void mix_in(const TensorMap& policy, double alpha);
  // Frees the weights and programs (after precompute_ref_log_probs); any later use is an error.
  void release();
  bool released() const { return !model_; }

 private:
  void move_weights_to_backend(const std::string& device);

  std::unique_ptr<CausalLM> model_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ProgramCache> programs_;
  uint64_t shared_bytes_ = 0;  // of the weights shared with the policy (an adapter's frozen base)
  bool teacher_ = false;
};

}  // namespace trl

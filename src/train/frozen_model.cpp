#include "train/frozen_model.h"

#include <algorithm>

#include "trl/backend/registry.h"
#include "trl/core/error.h"
#include "trl/train/objectives.h"

namespace trl {

FrozenModel::FrozenModel(const CausalLM* given, const Trainer& trainer, size_t programs_to_keep) {
  backend_ = make_backend(trainer.device(), BackendOptions{.share_arena = true});
  // A copy of a trainer's weight, where it lives (on a device: within the device).
  auto copy = [&](const Tensor& w, const std::string& name) { return w.is_device() ? backend_->copy(w, name) : w.clone(); };
  if (given) {
    if (given->config().vocab_size != trainer.model().config().vocab_size)
      fail("the reference model's vocabulary ({} tokens) differs from the policy's ({}): their log-probs cannot be compared",
           given->config().vocab_size, trainer.model().config().vocab_size);
    // Under tensor parallel the reference is sharded as the policy is, and runs with it.
    const TensorParallel& tp = trainer.model().tensor_parallel();
    model_ = std::make_unique<CausalLM>(tp.size > 1 ? given->tensor_parallel_shard(tp) : *given);
  } else if (const CausalLM& policy = trainer.model(); policy.lora()) {
    // PEFT's reference with an adapter: the same model with the adapter disabled. The frozen base weights are
    // shared with the policy (never written); only the modules_to_save weights, which training changes, are copied.
    const std::vector<std::string> saved = policy.lora_parameters();
    CausalLM base = policy.without_adapter();
    TensorMap frozen;
    for (const auto& [name, w] : base.weights()) {
      const Tensor& now = trainer.compute_weights().at(name);
      const bool copied = std::find(saved.begin(), saved.end(), name) != saved.end();
      frozen[name] = copied ? copy(now, name) : now;
      if (!copied) shared_bytes_ += static_cast<uint64_t>(now.nbytes());
    }
    model_ = std::make_unique<CausalLM>(base.with_weights(std::move(frozen), "reference"));
  } else {
    TensorMap frozen;
    for (const auto& [name, w] : trainer.compute_weights()) frozen[name] = copy(w, name);
    model_ = std::make_unique<CausalLM>(trainer.model().with_weights(std::move(frozen), "reference"));
  }
  programs_ = std::make_unique<ProgramCache>(*backend_, ProgramCacheOptions{programs_to_keep, ""});
  move_weights_to_backend(trainer.device());
}

// A device backend: the weights go to its memory once (those already there stay), and the model's own programs
// (a teacher's generate() for GKD's seq_kd) run on that device too, whatever device the model was loaded for.
void FrozenModel::move_weights_to_backend(const std::string& device) {
  if (backend_->host_memory()) return;
  model_ = std::make_unique<CausalLM>(model_->with_weights(to_backend(*backend_, model_->weights()), teacher_ ? "teacher" : "reference").with_device(device));
}

FrozenModel::FrozenModel(Teacher, const CausalLM& teacher, const Trainer& trainer, size_t programs_to_keep) {
  const ModelConfig &t = teacher.config(), &s = trainer.model().config();
  if (t.vocab_size != s.vocab_size)
    fail("the teacher model's vocabulary ({} tokens) differs from the student's ({}): distillation compares the teacher's whole next-token "
         "distribution with the student's, so both need the same vocabulary (and tokenizer)",
         t.vocab_size, s.vocab_size);
  if (teacher.tensor_parallel().size > 1 || trainer.model().tensor_parallel().size > 1) fail("distillation does not support tensor parallel (tp_size > 1)");
  model_ = std::make_unique<CausalLM>(teacher);  // the weights are shared (tensors are reference-counted), never written
  backend_ = make_backend(trainer.device(), BackendOptions{.share_arena = true});
  programs_ = std::make_unique<ProgramCache>(*backend_, ProgramCacheOptions{programs_to_keep, ""});
  teacher_ = true;
  move_weights_to_backend(trainer.device());
}

Tensor FrozenModel::hidden_states(const SFTBatch& batch, const Tensor& kept, double temperature) {
  const int64_t B = batch.input_ids.size(0), T = batch.input_ids.size(1), K = kept.size(1);
  const graph::Graph g = hidden_graph(model(), B, T, temperature, K);
  TensorMap in = model().weights();
  Backend& b = *backend_;
  in["input_ids"] = to_backend(b, batch.input_ids, "input_ids"), in["attention_mask"] = to_backend(b, batch.attention_mask, "attention_mask");
  in["position_ids"] = to_backend(b, batch.position_ids, "position_ids"), in["kept_positions"] = to_backend(b, kept, "kept_positions");
  return b.copy(programs().get(g).run(in).at(0), "teacher_hidden");  // the arena is reused by the next program
}

const CausalLM& FrozenModel::model() const {
  if (!model_) fail("the reference model was released (precompute_ref_log_probs) and cannot run again");
  return *model_;
}

ProgramCache& FrozenModel::programs() {
  if (!programs_) fail("the reference model was released (precompute_ref_log_probs) and cannot run again");
  return *programs_;
}

std::vector<double> FrozenModel::sequence_logps(const SequenceBatch& batch) {
  return trl::sequence_logps(model(), model().weights(), programs(), batch);
}

Tensor FrozenModel::token_logprobs(const SFTBatch& batch, double temperature, int64_t logits_to_keep) {
  return trl::token_logprobs(model(), model().weights(), programs(), batch, temperature, logits_to_keep);
}

FrozenMemory FrozenModel::memory(int64_t rows, int64_t tokens) {
  if (!model_) return {};
  FrozenMemory m;
  for (const auto& [name, w] : model_->weights()) m.weights += static_cast<uint64_t>(w.nbytes());
  m.weights -= shared_bytes_;  // counted as the policy's
  if (rows > 0 && tokens > 0)
    m.arena = backend_->compile(teacher_ ? hidden_graph(*model_, rows, tokens) : model_->logprobs_graph(rows, tokens))->arena_bytes();
  return m;
}

void FrozenModel::mix_in(const TensorMap& policy, double alpha) {
  const CausalLM& m = model();
  TensorMap mixed;
  for (const auto& [name, w] : m.weights()) {
    const auto it = policy.find(name);
    if (it == policy.end() || it->second.shape() != w.shape())
      fail("sync_ref_model: the reference's {} {} has no counterpart of that shape in the policy; sync_ref_model needs a reference of the "
           "policy's architecture", name, shape_str(w.shape()));
    mixed[name] = backend_->mix(w, it->second, static_cast<float>(alpha), name);
  }
  model_ = std::make_unique<CausalLM>(m.with_weights(std::move(mixed), "reference"));
}

void FrozenModel::release() {
  programs_.reset();
  backend_.reset();
  model_.reset();
}

}  // namespace trl

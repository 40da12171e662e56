// DPO on the Trainer. A training item is one preference pair; a micro-batch of N pairs is 2N sequences
// ([chosen...; rejected...], or back to back with padding_free). Per micro-batch: the reference log-probs (from a
// frozen model's forward-only programs on a backend of its own, or precomputed once before training), then the
// policy's two-stage program (dpo_step.h). As in TRL (model_accepts_loss_kwargs = False) each micro-batch's mean
// pair loss is divided by the number of micro-batches of the step.
#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "data/preference.h"
#include "train/dpo_step.h"
#include "train/frozen_model.h"
#include "train/trainer.h"
#include "trl/core/error.h"
#include "trl/runtime/shapes.h"
#include "trl/train/dpo_trainer.h"
#include "trl/train/objectives.h"

namespace trl {

namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

DpoLossConfig loss_config(const DPOConfig& c) {
  DpoLossConfig l;
  l.loss_type = c.loss_type;
  l.loss_weights = c.loss_weights;
  l.beta = c.beta;
  l.label_smoothing = c.label_smoothing;
  l.f_divergence_type = c.f_divergence_type;
  l.f_alpha_divergence_coef = c.f_alpha_divergence_coef;
  l.discopop_tau = c.discopop_tau;
  return l;
}

void add_loss_metrics(MetricWindow& m, const DpoLoss& l, const char* prefix = "") {
  const std::string p = prefix;
  m.add(p + "rewards/chosen", l.rewards_chosen);
  m.add(p + "rewards/rejected", l.rewards_rejected);
  m.add(p + "rewards/accuracies", l.rewards_accuracies);
  m.add(p + "rewards/margins", l.rewards_margins);
  m.add(p + "logps/chosen", l.logps_chosen);
  m.add(p + "logps/rejected", l.logps_rejected);
}

class DpoMethod final : public TrainingMethod {
 public:
  DpoMethod(const DPOConfig& c, const Tokenizer& tok, const Dataset& train, const std::optional<Dataset>& eval, const CausalLM* ref,
            const Trainer& trainer)
      : cfg_(c) {
    opt_.loss = loss_config(c);
    opt_.data.max_length = c.max_length;
    opt_.data.truncation_mode = c.truncation_mode;
    opt_.data.eos_token = c.eos_token;
    opt_.data.vocab_size = trainer.model().config().vocab_size;
    opt_.pad_to_multiple_of = parse_pad_to_multiple_of(c.pad_to_multiple_of, trainer.auto_pad_multiple());
    opt_.padding_free = c.padding_free;
    opt_.ld_alpha = c.ld_alpha;
    opt_.gradient_checkpointing = c.gradient_checkpointing;
    const auto pad = tok.pad_token_id();
    if (!pad) fail("DPO: the tokenizer has neither a pad_token nor an eos_token");
    opt_.pad_token_id = *pad;
    PreferenceDataStats stats;
    train_ = prepare_preference_dataset(train, tok, opt_.data, &stats);
    report_preference_stats("dpo", "training", stats);
    if (eval) {
      PreferenceDataStats es;
      eval_ = prepare_preference_dataset(*eval, tok, opt_.data, &es);
      report_preference_stats("dpo", "eval", es);
    }
    if (train_.empty()) fail("DPO: no training pair is left (every prompt fills max_length {})", c.max_length);
    // The reference: the given model, else a frozen copy of the policy's starting weights (frozen_model.h).
    reference_ = std::make_unique<FrozenModel>(ref, trainer, programs_to_keep());
  }

  const char* name() const override { return "DPO"; }
  size_t num_items() const override { return train_.size(); }
  size_t programs_to_keep() const override {
    return opt_.pad_to_multiple_of > 0 ? 2 * static_cast<size_t>(2 * cfg_.max_length / opt_.pad_to_multiple_of + 2) : 64;
  }
  bool has_eval() const override { return !eval_.empty(); }
  // The [rows, tokens] of the largest micro-batch of `batch` pairs: the policy's training program and the
  // reference's forward program both take it.
  std::pair<int64_t, int64_t> largest_shape(int64_t batch) const {
    std::vector<int64_t> lengths;
    for (const PreferenceExample& e : train_)
      for (const auto* c : {&e.chosen_ids, &e.rejected_ids})
        lengths.push_back(std::min<int64_t>(static_cast<int64_t>(e.prompt_ids.size() + c->size()), cfg_.max_length));
    return largest_batch_shape(lengths, 2 * batch, SequenceLayout{opt_.pad_token_id, opt_.pad_to_multiple_of, opt_.data.max_length, opt_.padding_free});
  }
  std::optional<graph::Graph> largest_program(const CausalLM& model, int64_t batch) const override {
    const auto [R, T] = largest_shape(batch);
    return training_graph(model, {.batch = R,
                                  .tokens = T,
                                  .gradient_checkpointing = cfg_.gradient_checkpointing,
                                  .metrics = true,
                                  .logit_sums = true,
                                  .aux_loss = aux_loss_coef(model, cfg_.router_aux_loss_coef) != 0});
  }
  FrozenMemory frozen_memory(int64_t batch) override {
    const auto [R, T] = largest_shape(batch);
    return reference_->memory(R, T);
  }

  // TR-DPO: the reference moves toward the policy every ref_model_sync_steps steps (TRL's SyncRefModelCallback).
  void after_step(int64_t global_step, const TensorMap& master) override {
    if (cfg_.sync_ref_model && global_step % cfg_.ref_model_sync_steps == 0) reference_->mix_in(master, cfg_.ref_model_mixup_alpha);
  }

  // precompute_ref_log_probs: one pass of the reference over every pair, then the reference is released.
  void before_training(MethodContext&) override {
    if (!cfg_.precompute_ref_log_probs || !train_ref_.empty()) return;
    train_ref_ = reference_logps(train_, cfg_.precompute_ref_batch_size.value_or(cfg_.per_device_train_batch_size));
    if (!eval_.empty()) eval_ref_ = reference_logps(eval_, cfg_.precompute_ref_batch_size.value_or(cfg_.per_device_eval_batch_size));
    reference_->release();
    std::fprintf(stderr, "[trl] dpo: reference log-probs of %zu pairs computed; the reference model is released\n", train_.size());
  }

  MethodStep step(const std::vector<std::vector<size_t>>& micro, MethodContext& ctx, MetricWindow& metrics, const GradientSink& add) override {
    MethodStep out;
    DpoStepOptions o = opt_;
    o.aux_coef = aux_loss_coef(ctx.model, cfg_.router_aux_loss_coef);  // TRL: loss + router_aux_loss_coef · aux
    for (size_t k = 0; k < micro.size(); ++k) {
      const std::vector<size_t>& items = micro[k];
      if (items.empty()) continue;  // data parallel: this rank has no rows of the epoch's last micro-batch
      o.loss_scale = ctx.share(k, items.size()) / static_cast<double>(micro.size());
      const auto t0 = Clock::now();
      std::vector<const PreferenceExample*> pairs;
      for (size_t i : items) pairs.push_back(&train_[i]);
      out.data_seconds += std::chrono::duration<double>(Clock::now() - t0).count();  // the reference's pass is compute, not data
      const std::vector<RefLogps> ref = reference_for(pairs, items, train_ref_);
      const DpoStepResult r = dpo_step(ctx.model, ctx.weights, ctx.programs, pairs, ref, o);
      out.loss += (r.loss.loss + (r.aux_loss ? o.aux_coef * *r.aux_loss : 0.0)) * o.loss_scale;
      if (r.aux_loss) metrics.add("aux_loss", *r.aux_loss);
      out.tokens += r.num_tokens;
      metrics.add("entropy", r.entropy);
      metrics.add("mean_token_accuracy", r.mean_token_accuracy);
      metrics.add("logits/chosen", r.logits_chosen);
      metrics.add("logits/rejected", r.logits_rejected);
      add_loss_metrics(metrics, r.loss);
      add(r.grads);
    }
    return out;
  }

  // Forward only: the policy's and the reference's sequence log-probs per eval batch, the loss and metrics of
  // each batch averaged over the batches (TRL's prediction_step and its stored eval metrics).
  ojson evaluate(MethodContext& ctx) override {
    if (eval_.empty()) fail("evaluate: no eval dataset");
    MetricWindow m;
    const size_t bsz = static_cast<size_t>(cfg_.per_device_eval_batch_size);
    const double aux_coef = aux_loss_coef(ctx.model, cfg_.router_aux_loss_coef);
    for (size_t i = 0; i < eval_.size(); i += bsz) {
      std::vector<const PreferenceExample*> pairs;
      std::vector<size_t> items;
      for (size_t k = i; k < std::min(eval_.size(), i + bsz); ++k) pairs.push_back(&eval_[k]), items.push_back(k);
      const std::vector<RefLogps> ref = reference_for(pairs, items, eval_ref_);
      double aux = 0;
      const std::vector<RefLogps> pol = dpo_sequence_logps(ctx.model, ctx.weights, ctx.programs, pairs, opt_, aux_coef != 0 ? &aux : nullptr);
      const SequenceBatch b = dpo_batch(pairs, opt_);
      const size_t N = pairs.size();
      std::vector<DpoPair> dp;
      for (size_t q = 0; q < N; ++q)
        dp.push_back({pol[q].chosen, pol[q].rejected, ref[q].chosen, ref[q].rejected, b.completion_tokens[q], b.completion_tokens[N + q]});
      const DpoLoss l = dpo_loss(opt_.loss, dp);
      m.add("eval_loss", l.loss + aux_coef * aux);  // TRL's eval loss includes the weighted aux loss
      if (aux_coef != 0) m.add("eval_aux_loss", aux);
      add_loss_metrics(m, l, "eval_");
    }
    return m.means();
  }

 private:
  std::vector<RefLogps> reference_logps(const std::vector<PreferenceExample>& data, int64_t batch) {
    std::vector<RefLogps> out;
    for (size_t i = 0; i < data.size(); i += static_cast<size_t>(batch)) {
      std::vector<const PreferenceExample*> pairs;
      for (size_t k = i; k < std::min(data.size(), i + static_cast<size_t>(batch)); ++k) pairs.push_back(&data[k]);
      for (const RefLogps& r : dpo_reference_logps(reference_->model(), reference_->programs(), pairs, opt_)) out.push_back(r);
    }
    return out;
  }
  std::vector<RefLogps> reference_for(const std::vector<const PreferenceExample*>& pairs, const std::vector<size_t>& items,
                                      const std::vector<RefLogps>& precomputed) {
    if (!precomputed.empty()) {
      std::vector<RefLogps> out;
      for (size_t i : items) out.push_back(precomputed.at(i));
      return out;
    }
    return dpo_reference_logps(reference_->model(), reference_->programs(), pairs, opt_);
  }

  DPOConfig cfg_;
  DpoStepOptions opt_;
  std::vector<PreferenceExample> train_, eval_;
  std::vector<RefLogps> train_ref_, eval_ref_;  // precompute_ref_log_probs
  std::unique_ptr<FrozenModel> reference_;
};

}  // namespace

void check_dpo_config(const DPOConfig& c) {
  check_training_arguments(c, "DPOConfig");
  check_router_aux_loss_coef(c.router_aux_loss_coef, "DPOConfig");
  if (c.max_length < 2) fail("DPOConfig: max_length must be >= 2, got {}", c.max_length);
  if (c.truncation_mode != "keep_start" && c.truncation_mode != "keep_end")
    fail("DPOConfig: truncation_mode '{}' is not keep_start or keep_end", c.truncation_mode);
  if (c.precompute_ref_batch_size && *c.precompute_ref_batch_size < 1)
    fail("DPOConfig: precompute_ref_batch_size must be >= 1, got {}", *c.precompute_ref_batch_size);
  if (c.ld_alpha) {
    if (!(*c.ld_alpha >= 0 && *c.ld_alpha <= 1)) fail("DPOConfig: ld_alpha must be in [0, 1], got {}", *c.ld_alpha);
    for (const std::string& t : c.loss_type)
      if (t == "sft")
        fail("DPOConfig: ld_alpha with loss_type sft is not supported here (TRL's sft term reads the unweighted token log-probs); "
             "drop ld_alpha or the sft loss");
  }
  if (c.sync_ref_model) {
    if (c.peft_config)
      fail("DPOConfig: sync_ref_model with a LoRA adapter: the reference is the base model with the adapter disabled, which has no weights of "
           "its own to mix (TRL refuses this too); drop sync_ref_model or use_peft");
    if (c.precompute_ref_log_probs)
      fail("DPOConfig: sync_ref_model needs a live reference, but precompute_ref_log_probs computes its log-probs once before training; "
           "set one of them to false");
    if (!(c.ref_model_mixup_alpha >= 0 && c.ref_model_mixup_alpha <= 1))
      fail("DPOConfig: ref_model_mixup_alpha must be in [0, 1], got {}", c.ref_model_mixup_alpha);
    if (c.ref_model_sync_steps < 1) fail("DPOConfig: ref_model_sync_steps must be >= 1, got {}", c.ref_model_sync_steps);
  }
  try {
    validate(loss_config(c));
  } catch (const Error& e) {
    fail("DPOConfig: {}", e.what());
  }
}

DPOTrainer::DPOTrainer(const CausalLM& model, const Tokenizer& tok, Dataset train, DPOConfig config, std::optional<Dataset> eval,
                       const CausalLM* ref_model) {
  check_dpo_config(config);
  if (config.dataset_name.empty()) config.dataset_name = dataset_source_file(train);
  trainer_ = std::make_unique<Trainer>(model, config, "DPOConfig");
  trainer_->set_method(std::make_unique<DpoMethod>(config, tok, train, eval, ref_model, *trainer_));
}

DPOTrainer::~DPOTrainer() = default;

}  // namespace trl

// KTO on the Trainer. A training item is one row (prompt, completion, desirable). Per micro-batch of n rows:
//   1. the KL rows: row i's prompt with the completion of the row before it in its dataset batch of
//      per_device_train_batch_size (the first takes the last), as TRL's add_kl_completion_ids forms them;
//   2. the reference's log-probs of the n rows and the n KL rows (one forward pass; or precomputed);
//   3. the policy's log-probs of the KL rows (forward only: the KL estimate is detached);
//   4. z = max(0, mean(policy KL − reference KL)), then the policy's two-stage step on the n rows with KTO's loss.
// As in TRL (model_accepts_loss_kwargs = False) each micro-batch's mean row loss is divided by the number of
// micro-batches of the step.
#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "data/preference.h"
#include "train/frozen_model.h"
#include "train/losses/kto_loss.h"
#include "train/sequence_step.h"
#include "train/trainer.h"
#include "trl/core/error.h"
#include "trl/runtime/shapes.h"
#include "trl/train/kto_trainer.h"
#include "trl/train/objectives.h"

namespace trl {

namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

KtoLossConfig loss_config(const KTOConfig& c) { return KtoLossConfig{c.loss_type, c.beta, c.desirable_weight, c.undesirable_weight}; }

// The reference log-probs of a row and of its KL row.
struct KtoRef {
  double logp = 0, kl_logp = 0;
};

class KtoMethod final : public TrainingMethod {
 public:
  KtoMethod(const KTOConfig& c, const Tokenizer& tok, const Dataset& train, const std::optional<Dataset>& eval, const CausalLM* ref,
            const Trainer& trainer)
      : cfg_(c), loss_(loss_config(c)), kl_(c.loss_type != "apo_zero_unpaired") {
    data_.max_length = c.max_length;
    data_.eos_token = c.eos_token;
    data_.vocab_size = trainer.model().config().vocab_size;
    const auto pad = tok.pad_token_id();
    if (!pad) fail("KTO: the tokenizer has neither a pad_token nor an eos_token");
    layout_ = SequenceLayout{*pad, parse_pad_to_multiple_of(c.pad_to_multiple_of, trainer.auto_pad_multiple()), c.max_length, false};
    PreferenceDataStats stats;
    train_ = prepare_unpaired_dataset(train, tok, data_, &stats);
    report_preference_stats("kto", "training", stats);
    // The KL pairs are formed within the micro-batches of all ranks together (one process's batches of
    // per_device_train_batch_size × data-parallel ranks), so that a data-parallel run is the same as one such process.
    train_kl_ = kl_sources(train_.size(), c.per_device_train_batch_size * trainer.data_parallel_size());
    if (eval) {
      PreferenceDataStats es;
      eval_ = prepare_unpaired_dataset(*eval, tok, data_, &es);
      report_preference_stats("kto", "eval", es);
      eval_kl_ = kl_sources(eval_.size(), c.per_device_eval_batch_size);
    }
    int64_t desirable = 0;
    for (const UnpairedExample& e : train_) desirable += e.desirable;
    const std::string warning = kto_weight_warning(loss_, desirable, static_cast<int64_t>(train_.size()) - desirable);
    if (!warning.empty()) std::fprintf(stderr, "[trl] kto: warning: %s\n", warning.c_str());
    reference_ = std::make_unique<FrozenModel>(ref, trainer, programs_to_keep());
  }

  const char* name() const override { return "KTO"; }
  size_t num_items() const override { return train_.size(); }
  size_t programs_to_keep() const override {
    return layout_.pad_to_multiple_of > 0 ? 2 * static_cast<size_t>(cfg_.max_length / layout_.pad_to_multiple_of + 2) : 64;
  }
  bool has_eval() const override { return !eval_.empty(); }
  // The [rows, tokens] of the largest micro-batch of `rows` sequences.
  std::pair<int64_t, int64_t> largest_shape(int64_t rows) const {
    std::vector<int64_t> lengths;
    for (const UnpairedExample& e : train_)
      lengths.push_back(std::min<int64_t>(static_cast<int64_t>(e.prompt_ids.size() + e.completion_ids.size()), cfg_.max_length));
    return largest_batch_shape(lengths, rows, layout_);
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
  // The reference's pass takes a micro-batch's rows and, with the KL term, their KL rows together.
  FrozenMemory frozen_memory(int64_t batch) override {
    const auto [R, T] = largest_shape(kl_ ? 2 * batch : batch);
    return reference_->memory(R, T);
  }

  void before_training(MethodContext&) override {
    if (!cfg_.precompute_ref_log_probs || !train_ref_.empty()) return;
    train_ref_ = precompute(train_, train_kl_, cfg_.precompute_ref_batch_size.value_or(cfg_.per_device_train_batch_size));
    if (!eval_.empty()) eval_ref_ = precompute(eval_, eval_kl_, cfg_.precompute_ref_batch_size.value_or(cfg_.per_device_eval_batch_size));
    reference_->release();
    std::fprintf(stderr, "[trl] kto: reference log-probs of %zu rows computed; the reference model is released\n", train_.size());
  }

  MethodStep step(const std::vector<std::vector<size_t>>& micro, MethodContext& ctx, MetricWindow& metrics, const GradientSink& add) override {
    MethodStep out;
    const double aux_coef = aux_loss_coef(ctx.model, cfg_.router_aux_loss_coef);  // TRL: loss + router_aux_loss_coef · aux
    for (size_t k = 0; k < micro.size(); ++k) {
      const std::vector<size_t>& items = micro[k];
      // The KL estimate is one collective per micro-batch, also on a rank without rows of it.
      const std::vector<KtoRef> ref = items.empty() ? std::vector<KtoRef>{} : reference_for(train_, train_kl_, items, train_ref_);
      const double z = kl_estimate(ctx, train_, train_kl_, items, ref);
      if (items.empty()) continue;  // data parallel: this rank has no rows of the epoch's last micro-batch
      const double scale = ctx.share(k, items.size()) / static_cast<double>(micro.size());
      const auto t0 = Clock::now();
      const SequenceBatch rows = batch(train_, items, nullptr);
      out.data_seconds += std::chrono::duration<double>(Clock::now() - t0).count();  // the forward passes below are compute
      KtoLoss l;
      const SequenceLoss loss = [&](const std::vector<double>& logps, std::vector<double>& d) {
        l = kto_loss(loss_, kto_rows(train_, items, logps, ref), z);
        d = l.d_logp;
        return l.loss;
      };
      SequenceStepResult r = sequence_train_step(ctx.model, ctx.weights, ctx.programs, rows, loss, scale, cfg_.gradient_checkpointing,
                                                 /*logit_means=*/true, aux_coef);
      out.loss += (l.loss + (r.aux_loss ? aux_coef * *r.aux_loss : 0.0)) * scale;
      if (r.aux_loss) metrics.add("aux_loss", *r.aux_loss);
      out.tokens += rows.batch.num_tokens;
      double entropy = 0, logits[2] = {0, 0};  // [undesirable, desirable]
      int64_t tokens = 0, label_tokens[2] = {0, 0};
      for (size_t q = 0; q < r.entropy_sums.size(); ++q) {
        entropy += r.entropy_sums[q], tokens += rows.completion_tokens[q];
        const int desirable = train_[items[q]].desirable ? 1 : 0;
        logits[desirable] += r.logit_mean_sums[q], label_tokens[desirable] += rows.completion_tokens[q];
      }
      add_metrics(metrics, l, tokens ? entropy / static_cast<double>(tokens) : 0.0, "");
      // TRL's logits/chosen and logits/rejected: the mean logit over the desirable (undesirable) rows' completion tokens.
      if (label_tokens[1] > 0) metrics.add("logits/chosen", logits[1] / static_cast<double>(label_tokens[1]));
      if (label_tokens[0] > 0) metrics.add("logits/rejected", logits[0] / static_cast<double>(label_tokens[0]));
      add(r.grads);
    }
    return out;
  }

  ojson evaluate(MethodContext& ctx) override {
    if (eval_.empty()) fail("evaluate: no eval dataset");
    MetricWindow m;
    const size_t bsz = static_cast<size_t>(cfg_.per_device_eval_batch_size);
    const double aux_coef = aux_loss_coef(ctx.model, cfg_.router_aux_loss_coef);
    for (size_t i = 0; i < eval_.size(); i += bsz) {
      std::vector<size_t> items;
      for (size_t k = i; k < std::min(eval_.size(), i + bsz); ++k) items.push_back(k);
      const std::vector<KtoRef> ref = reference_for(eval_, eval_kl_, items, eval_ref_);
      const double z = kl_estimate(ctx, eval_, eval_kl_, items, ref);
      double aux = 0;
      const std::vector<double> logps =
          sequence_logps(ctx.model, ctx.weights, ctx.programs, batch(eval_, items, nullptr), aux_coef != 0 ? &aux : nullptr);
      const KtoLoss l = kto_loss(loss_, kto_rows(eval_, items, logps, ref), z);
      m.add("eval_loss", l.loss + aux_coef * aux);  // TRL's eval loss includes the weighted aux loss
      if (aux_coef != 0) m.add("eval_aux_loss", aux);
      add_metrics(m, l, -1, "eval_");
    }
    return m.means();
  }

 private:
  // The row whose completion row i's KL row takes: the previous one in its dataset batch (the first takes the last).
  static std::vector<size_t> kl_sources(size_t n, int64_t batch_size) {
    std::vector<size_t> src(n);
    const size_t b = static_cast<size_t>(batch_size);
    for (size_t start = 0; start < n; start += b) {
      const size_t end = std::min(n, start + b);
      for (size_t i = start; i < end; ++i) src[i] = i == start ? end - 1 : i - 1;
    }
    return src;
  }
  // The rows of `items` (kl_src == nullptr), or their KL rows (prompt of the row, completion of kl_src[row]).
  SequenceBatch batch(const std::vector<UnpairedExample>& data, const std::vector<size_t>& items, const std::vector<size_t>* kl_src) const {
    std::vector<SFTExample> seqs;
    for (size_t i : items) {
      const UnpairedExample& c = kl_src ? data[(*kl_src)[i]] : data[i];
      seqs.push_back(prompt_completion_row(data[i].prompt_ids, c.completion_ids, data_, data[i].where));
    }
    return sequence_batch(seqs, layout_);
  }
  // The reference's log-probs of the rows and (with the KL term) their KL rows, in one forward pass.
  std::vector<KtoRef> reference_logps(const std::vector<UnpairedExample>& data, const std::vector<size_t>& kl_src, const std::vector<size_t>& items) {
    std::vector<SFTExample> seqs;
    for (size_t i : items) seqs.push_back(prompt_completion_row(data[i].prompt_ids, data[i].completion_ids, data_, data[i].where));
    if (kl_)
      for (size_t i : items) seqs.push_back(prompt_completion_row(data[i].prompt_ids, data[kl_src[i]].completion_ids, data_, data[i].where));
    const std::vector<double> s = reference_->sequence_logps(sequence_batch(seqs, layout_));
    std::vector<KtoRef> out(items.size());
    for (size_t k = 0; k < items.size(); ++k) out[k] = {s[k], kl_ ? s[items.size() + k] : 0.0};
    return out;
  }
  std::vector<KtoRef> precompute(const std::vector<UnpairedExample>& data, const std::vector<size_t>& kl_src, int64_t batch_size) {
    std::vector<KtoRef> out;
    for (size_t i = 0; i < data.size(); i += static_cast<size_t>(batch_size)) {
      std::vector<size_t> items;
      for (size_t k = i; k < std::min(data.size(), i + static_cast<size_t>(batch_size)); ++k) items.push_back(k);
      for (const KtoRef& r : reference_logps(data, kl_src, items)) out.push_back(r);
    }
    return out;
  }
  std::vector<KtoRef> reference_for(const std::vector<UnpairedExample>& data, const std::vector<size_t>& kl_src, const std::vector<size_t>& items,
                                    const std::vector<KtoRef>& precomputed) {
    if (precomputed.empty()) return reference_logps(data, kl_src, items);
    std::vector<KtoRef> out;
    for (size_t i : items) out.push_back(precomputed.at(i));
    return out;
  }
  // The detached KL estimate of a micro-batch (0 for apo_zero_unpaired).
  double kl_estimate(MethodContext& ctx, const std::vector<UnpairedExample>& data, const std::vector<size_t>& kl_src, const std::vector<size_t>& items,
                     const std::vector<KtoRef>& ref) const {
    if (!kl_) return 0.0;
    if (ctx.dp.size() > 1) {
      // TRL gathers the estimate over the ranks before the clamp; here the mean is over every rank's KL rows of the
      // micro-batch, as one process with the whole micro-batch would take it.
      double sum_count[2] = {0, static_cast<double>(items.size())};
      if (!items.empty()) {
        const std::vector<double> policy = sequence_logps(ctx.model, ctx.weights, ctx.programs, batch(data, items, &kl_src));
        for (size_t i = 0; i < policy.size(); ++i) sum_count[0] += policy[i] - ref[i].kl_logp;
      }
      ctx.dp.all_reduce(sum_count, 2, DType::F64, dist::ReduceOp::Sum);
      return std::max(0.0, sum_count[0] / std::max(1.0, sum_count[1]));
    }
    const std::vector<double> policy = sequence_logps(ctx.model, ctx.weights, ctx.programs, batch(data, items, &kl_src));
    std::vector<double> reference;
    for (const KtoRef& r : ref) reference.push_back(r.kl_logp);
    return kto_kl_estimate(policy, reference);
  }
  static std::vector<KtoRow> kto_rows(const std::vector<UnpairedExample>& data, const std::vector<size_t>& items, const std::vector<double>& logps,
                                      const std::vector<KtoRef>& ref) {
    std::vector<KtoRow> rows;
    for (size_t k = 0; k < items.size(); ++k) rows.push_back({logps[k], ref[k].logp, data[items[k]].desirable});
    return rows;
  }
  // TRL's per-batch metrics: the chosen/rejected ones only when the batch has such rows, the margin when both.
  static void add_metrics(MetricWindow& m, const KtoLoss& l, double entropy, const std::string& p) {
    m.add(p + "kl", l.kl);
    if (entropy >= 0) m.add(p + "entropy", entropy);
    if (l.num_chosen > 0) m.add(p + "rewards/chosen", l.rewards_chosen), m.add(p + "logps/chosen", l.logps_chosen);
    if (l.num_rejected > 0) m.add(p + "rewards/rejected", l.rewards_rejected), m.add(p + "logps/rejected", l.logps_rejected);
    if (l.num_chosen > 0 && l.num_rejected > 0) m.add(p + "rewards/margins", l.rewards_margins);
  }

  KTOConfig cfg_;
  KtoLossConfig loss_;
  bool kl_;  // the KL term is estimated (loss_type kto)
  PreferenceDataOptions data_;
  SequenceLayout layout_;
  std::vector<UnpairedExample> train_, eval_;
  std::vector<size_t> train_kl_, eval_kl_;
  std::vector<KtoRef> train_ref_, eval_ref_;  // precompute_ref_log_probs
  std::unique_ptr<FrozenModel> reference_;
};

}  // namespace

void check_kto_config(const KTOConfig& c) {
  check_training_arguments(c, "KTOConfig");
  check_router_aux_loss_coef(c.router_aux_loss_coef, "KTOConfig");
  if (c.max_length < 2) fail("KTOConfig: max_length must be >= 2, got {}", c.max_length);
  if (c.precompute_ref_batch_size && *c.precompute_ref_batch_size < 1)
    fail("KTOConfig: precompute_ref_batch_size must be >= 1, got {}", *c.precompute_ref_batch_size);
  try {
    validate(loss_config(c));
  } catch (const Error& e) {
    fail("KTOConfig: {}", e.what());
  }
  if (c.loss_type == "apo_zero_unpaired") return;
  if (c.per_device_train_batch_size <= 1)
    fail("KTOConfig: per_device_train_batch_size must be > 1 for loss_type '{}', got {}: the KL estimate pairs each prompt with another "
         "row's completion in the same batch, and with one row that is the row itself (the KL term would equal the implied reward); "
         "use a batch of 2 or more (with gradient_accumulation_steps for the same effective batch), or loss_type apo_zero_unpaired",
         c.loss_type, c.per_device_train_batch_size);
  if (c.train_sampling_strategy != "sequential")
    fail("KTOConfig: loss_type '{}' needs train_sampling_strategy sequential, got '{}': the KL pairs are formed within the dataset's fixed "
         "batches, which another order would break (shuffle the dataset file instead)",
         c.loss_type, c.train_sampling_strategy);
}

KTOTrainer::KTOTrainer(const CausalLM& model, const Tokenizer& tok, Dataset train, KTOConfig config, std::optional<Dataset> eval,
                       const CausalLM* ref_model) {
  check_kto_config(config);
  if (config.dataset_name.empty()) config.dataset_name = dataset_source_file(train);
  trainer_ = std::make_unique<Trainer>(model, config, "KTOConfig");
  trainer_->set_method(std::make_unique<KtoMethod>(config, tok, train, eval, ref_model, *trainer_));
}

KTOTrainer::~KTOTrainer() = default;

}  // namespace trl

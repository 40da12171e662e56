// Reward models on the Trainer. A training item is one pair; a micro-batch of N pairs is 2N rows [chosen...;
// rejected...] of prompt + completion, right-padded with the pad token. The two-stage program
// (CausalLM::reward_training_graph) gives the score head's reward at every position; the host pools each row at
// its rightmost non-pad token, evaluates the Bradley–Terry loss and seeds the backward pass with its derivative at
// those positions. As in TRL (model_accepts_loss_kwargs = False) each micro-batch's mean loss is divided by the
// number of micro-batches of the step.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "data/preference.h"
#include "train/losses/reward_loss.h"
#include "train/sequence_step.h"
#include "train/trainer.h"
#include "trl/core/error.h"
#include "trl/runtime/shapes.h"
#include "trl/train/objectives.h"
#include "trl/train/reward_trainer.h"

namespace trl {

namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

class RewardMethod final : public TrainingMethod {
 public:
  RewardMethod(const RewardConfig& c, const RewardModel& model, const Tokenizer& tok, const Dataset& train, const std::optional<Dataset>& eval,
               const Trainer& trainer)
      : cfg_(c), config_(model.backbone.config()), pad_(model.pad_token_id), score_(model.score),
        multiple_(parse_pad_to_multiple_of(c.pad_to_multiple_of, trainer.auto_pad_multiple())) {
    PreferenceDataOptions o;
    o.max_length = 0;  // TRL filters long pairs instead of truncating them
    o.eos_token = c.eos_token;
    o.vocab_size = config_.vocab_size;
    train_ = prepare(train, tok, o, "training");
    if (eval) eval_ = prepare(*eval, tok, o, "eval");
  }

  const char* name() const override { return "Reward"; }
  size_t num_items() const override { return train_.size(); }
  size_t programs_to_keep() const override { return multiple_ > 0 ? 2 * static_cast<size_t>(cfg_.max_length / multiple_ + 2) : 64; }
  bool has_eval() const override { return !eval_.empty(); }
  std::optional<graph::Graph> largest_program(const CausalLM& model, int64_t batch) const override {
    std::vector<int64_t> lengths;
    for (const PreferenceExample& e : train_)
      for (const auto* c : {&e.chosen_ids, &e.rejected_ids}) lengths.push_back(static_cast<int64_t>(e.prompt_ids.size() + c->size()));
    const auto [R, T] = largest_batch_shape(lengths, 2 * batch, SequenceLayout{pad_, multiple_, cfg_.max_length, false});
    return reward_training_graph(model, R, T, cfg_.gradient_checkpointing);
  }
  TensorMap extra_parameters() const override { return {{"score.weight", score_}}; }
  std::vector<std::string> frozen_parameters() const override { return {"lm_head.weight"}; }
  bool write_model(const std::string& dir, const TensorMap& weights, DType dtype) const override {
    save_reward_model(dir, config_, weights, pad_, dtype);
    return true;
  }

  MethodStep step(const std::vector<std::vector<size_t>>& micro, MethodContext& ctx, MetricWindow& metrics, const GradientSink& add) override {
    MethodStep out;
    for (size_t k = 0; k < micro.size(); ++k) {
      const std::vector<size_t>& items = micro[k];
      if (items.empty()) continue;  // data parallel: this rank has no rows of the epoch's last micro-batch
      const double scale = ctx.share(k, items.size()) / static_cast<double>(micro.size());
      const auto t0 = Clock::now();
      const SFTBatch b = batch(train_, items);
      out.data_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      const int64_t R = b.input_ids.size(0), T = b.input_ids.size(1);
      const graph::Graph g = reward_training_graph(ctx.model, R, T, cfg_.gradient_checkpointing);
      Program& program = ctx.programs.get(g);
      const TensorMap in = inputs(ctx, b);
      const std::vector<int64_t> at = pooled(b);
      const std::vector<double> rewards = pooled_scores(ctx.backend, program.run_stage(in, 0).at(g.output_index("rewards")), at);  // before stage 1 reuses the arena
      const RewardLoss l = reward_loss(pairs(train_, items, rewards), cfg_.center_rewards_coefficient);
      Tensor seed = Tensor::zeros(DType::F32, {R, T});
      float* s = seed.mutable_data_as<float>();
      const size_t N = items.size();
      for (size_t i = 0; i < N; ++i) {
        s[static_cast<int64_t>(i) * T + at[i]] = static_cast<float>(scale * l.d_chosen[i]);
        s[static_cast<int64_t>(N + i) * T + at[N + i]] = static_cast<float>(scale * l.d_rejected[i]);
      }
      TensorMap seeds;
      seeds["reward_weights"] = ctx.to_backend(seed, "reward_weights");
      const std::vector<Tensor> result = program.run_stage(seeds, 1);
      std::map<std::string, Tensor> grads;
      for (const auto& [n, i] : g.output_indices())
        if (n.rfind("grad.", 0) == 0) grads[n] = result.at(i);
      out.loss += l.loss * scale;
      out.tokens += b.num_tokens;
      add_metrics(metrics, l, "");
      add(grads);
    }
    return out;
  }

  ojson evaluate(MethodContext& ctx) override {
    if (eval_.empty()) fail("evaluate: no eval dataset");
    MetricWindow m;
    const size_t bsz = static_cast<size_t>(cfg_.per_device_eval_batch_size);
    for (size_t i = 0; i < eval_.size(); i += bsz) {
      std::vector<size_t> items;
      for (size_t k = i; k < std::min(eval_.size(), i + bsz); ++k) items.push_back(k);
      const SFTBatch b = batch(eval_, items);
      const int64_t R = b.input_ids.size(0), T = b.input_ids.size(1);
      const graph::Graph g = ctx.model.reward_graph(R, T);
      const std::vector<double> rewards = pooled_scores(ctx.backend, ctx.programs.get(g).run(inputs(ctx, b)).at(g.output_index("rewards")), pooled(b));
      const RewardLoss l = reward_loss(pairs(eval_, items, rewards), cfg_.center_rewards_coefficient);
      m.add("eval_loss", l.loss);
      add_metrics(m, l, "eval_");
    }
    return m.means();
  }

 private:
  // Tokenized pairs; those whose chosen or rejected sequence is longer than max_length are dropped (TRL's filter).
  std::vector<PreferenceExample> prepare(const Dataset& data, const Tokenizer& tok, const PreferenceDataOptions& o, const char* split) const {
    PreferenceDataStats st;
    std::vector<PreferenceExample> all = prepare_preference_dataset(data, tok, o, &st), kept;
    for (PreferenceExample& e : all) {
      const size_t np = e.prompt_ids.size();
      if (static_cast<int64_t>(np + std::max(e.chosen_ids.size(), e.rejected_ids.size())) <= cfg_.max_length) kept.push_back(std::move(e));
    }
    if (kept.size() < all.size())
      std::fprintf(stderr, "[trl] reward: dropped %zu %s pairs longer than max_length %lld\n", all.size() - kept.size(), split,
                   static_cast<long long>(cfg_.max_length));
    if (kept.empty()) fail("reward: every {} pair is longer than max_length {} (raise max_length)", split, cfg_.max_length);
    const bool margins = kept.front().margin.has_value();
    for (const PreferenceExample& e : kept)
      if (e.margin.has_value() != margins) fail("{}: \"margin\" must be in every row or in none (the first row {} one)", e.where, margins ? "has" : "has no");
    return kept;
  }
  SFTBatch batch(const std::vector<PreferenceExample>& data, const std::vector<size_t>& items) const {
    std::vector<const PreferenceExample*> p;
    for (size_t i : items) p.push_back(&data[i]);
    PreferenceDataOptions o;
    o.max_length = 0;
    const std::vector<SFTExample> rows = preference_rows(p, o);
    std::vector<const SFTExample*> ptrs;
    for (const SFTExample& r : rows) ptrs.push_back(&r);
    return collate_padded(ptrs, pad_, multiple_, cfg_.max_length);
  }
  static TensorMap inputs(const MethodContext& ctx, const SFTBatch& b) {
    TensorMap in = ctx.weights;
    in.erase("lm_head.weight");
    in["input_ids"] = ctx.to_backend(b.input_ids, "input_ids"), in["attention_mask"] = ctx.to_backend(b.attention_mask, "attention_mask");
    in["position_ids"] = ctx.to_backend(b.position_ids, "position_ids");
    return in;
  }
  std::vector<int64_t> pooled(const SFTBatch& b) const {
    const int64_t R = b.input_ids.size(0), T = b.input_ids.size(1);
    std::vector<int64_t> at;
    for (int64_t r = 0; r < R; ++r) at.push_back(pooled_position(b.input_ids.data_as<int32_t>() + r * T, T, pad_));
    return at;
  }
  // rewards: the chosen sequences' then the rejected ones', as the batch holds them.
  static std::vector<RewardPair> pairs(const std::vector<PreferenceExample>& data, const std::vector<size_t>& items, const std::vector<double>& rewards) {
    const size_t N = items.size();
    std::vector<RewardPair> out;
    for (size_t i = 0; i < N; ++i) out.push_back({rewards[i], rewards[N + i], data[items[i]].margin.value_or(0.0)});
    return out;
  }
  static void add_metrics(MetricWindow& m, const RewardLoss& l, const std::string& p) {
    m.add(p + "min_reward", l.min_reward);
    m.add(p + "mean_reward", l.mean_reward);
    m.add(p + "max_reward", l.max_reward);
    m.add(p + "accuracy", l.accuracy);
    m.add(p + "margin", l.margin);
  }

  RewardConfig cfg_;
  ModelConfig config_;
  int32_t pad_;
  Tensor score_;
  int64_t multiple_;
  std::vector<PreferenceExample> train_, eval_;
};

}  // namespace

void check_reward_config(const RewardConfig& c) {
  check_training_arguments(c, "RewardConfig");
  if (c.max_length < 2) fail("RewardConfig: max_length must be >= 2, got {}", c.max_length);
  if (c.center_rewards_coefficient && !(std::isfinite(*c.center_rewards_coefficient) && *c.center_rewards_coefficient >= 0))
    fail("RewardConfig: center_rewards_coefficient must be a finite number >= 0, got {}", *c.center_rewards_coefficient);
}

RewardTrainer::RewardTrainer(const RewardModel& model, const Tokenizer& tok, Dataset train, RewardConfig config, std::optional<Dataset> eval) {
  check_reward_config(config);
  if (config.dataset_name.empty()) config.dataset_name = dataset_source_file(train);
  if (config.peft_config) {  // a sequence-classification adapter: the score head trains in full and is saved with it
    config.peft_config->task_type = "SEQ_CLS";
    auto& saved = config.peft_config->modules_to_save;
    if (std::find(saved.begin(), saved.end(), "score") == saved.end()) saved.push_back("score");
  }
  trainer_ = std::make_unique<Trainer>(model.backbone, config, "RewardConfig");
  trainer_->set_method(std::make_unique<RewardMethod>(config, model, tok, train, eval, *trainer_));
}

RewardTrainer::~RewardTrainer() = default;

}  // namespace trl

// GRPO and RLOO on the Trainer (include/trl/train/grpo_trainer.h; docs/TRAINING.md, "trl grpo").
//
// Batch layout (TRL's RepeatSampler): a generation round takes U = generation_batch_size / G prompts of the epoch's
// seeded permutation and generates G completions of each (N = U·G rows, a group's rows consecutive). The round is
// shuffled and split into steps_per_generation chunks of W·bs rows (W ranks, bs = per_device_train_batch_size);
// each micro-batch trains on one chunk, rank r on its r-th run of bs rows, and the round serves
// steps_per_generation × num_iterations micro-batches before the next round. A Trainer item is one slot of a round:
// items are handed out in order (sequential_items) and item i of an epoch belongs to micro-batch i / (W·bs), round
// (i / (W·bs)) / (steps_per_generation · num_iterations).
//
// Data parallel: each rank generates, scores and computes the old and reference log-probs of the rows it trains on
// (a group may span ranks), then every rank gathers the whole round (completions, rewards, log-probs), so the
// group statistics, advantages and metrics are those of the whole round and a checkpoint holds it whole. Each row
// samples from its own stream, seeded by its place in the round, so a round is the same whichever rank generates a
// row: W ranks × bs give the rounds of one process with W·bs.
//
// Shapes: prompts are left-padded to the round's bucket P (a multiple of pad_to_multiple_of), completions
// right-padded to the round's bucket C, so a training row is [P + C] and a run compiles one training program per
// (P, C) pair met, one prefill per prompt bucket and one decode per cache length.
#include <algorithm>
#include <chrono>
#include <deque>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "core/clock.h"
#include "core/fs.h"
#include "core/json_text.h"
#include "core/rng.h"
#include "train/frozen_model.h"
#include "train/losses/grpo_loss.h"
#include "train/online_step.h"
#include "train/sequence_step.h"
#include "train/trainer.h"
#include "trl/core/error.h"
#include "trl/generation/generate.h"
#include "trl/runtime/shapes.h"
#include "trl/tokenizer/chat_template.h"
#include "trl/train/grpo_trainer.h"
#include "trl/train/objectives.h"

namespace trl {

namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Prompt {
  ojson prompt;                 // as the dataset holds it (the reward functions' `prompts`)
  std::vector<int32_t> ids;     // tokenized (conversations rendered with the generation prompt)
  size_t row = 0;               // its dataset row
};

// The layout GRPOConfig / RLOOConfig resolve to.
struct Layout {
  int64_t G = 0, bs = 0, spg = 0, iterations = 1, per_round = 0;  // per_round: completions per round
};

// W: the data-parallel ranks. generation_batch_size is global, as in TRL (per_device_train_batch_size × W ×
// steps_per_generation).
Layout resolve_layout(const OnlineRLConfig& c, const char* name, int64_t W) {
  Layout l;
  l.G = c.num_generations, l.bs = c.per_device_train_batch_size, l.iterations = c.num_iterations;
  if (c.generation_batch_size && c.steps_per_generation)
    fail("{}: set generation_batch_size or steps_per_generation, not both", name);
  if (c.generation_batch_size) {
    if (*c.generation_batch_size < 1 || *c.generation_batch_size % (l.bs * W) != 0)
      fail("{}: generation_batch_size ({}) must be a positive multiple of per_device_train_batch_size ({}){}", name, *c.generation_batch_size, l.bs,
           W > 1 ? fmt::format(" × the {} processes", W) : std::string());
    l.spg = *c.generation_batch_size / (l.bs * W);
  } else {
    l.spg = c.steps_per_generation.value_or(c.gradient_accumulation_steps);
    if (l.spg < 1) fail("{}: steps_per_generation must be >= 1, got {}", name, l.spg);
  }
  l.per_round = l.bs * W * l.spg;
  if (l.per_round % l.G != 0)
    fail("{}: the generation batch ({} = per_device_train_batch_size {}{} × steps_per_generation {}) must be a multiple of num_generations ({}); "
         "change per_device_train_batch_size, gradient_accumulation_steps or num_generations",
         name, l.per_round, l.bs, W > 1 ? fmt::format(" × {} processes", W) : std::string(), l.spg, l.G);
  return l;
}

void check_online_config(const OnlineRLConfig& c, const char* name, int64_t reward_functions) {
  check_training_arguments(c, name);
  check_router_aux_loss_coef(c.router_aux_loss_coef, name);
  auto bad = [&](const char* option, const std::string& why) { fail("{}: {} {}", name, option, why); };
  if (c.num_generations < 2) bad("num_generations", fmt::format("must be >= 2 (a group needs a baseline), got {}", c.num_generations));
  if (c.max_completion_length < 1) bad("max_completion_length", fmt::format("must be >= 1, got {}", c.max_completion_length));
  if (c.num_iterations < 1) bad("num_iterations", fmt::format("must be >= 1, got {}", c.num_iterations));
  if (!(c.temperature > 0) || !std::isfinite(c.temperature)) bad("temperature", fmt::format("must be a finite number > 0, got {}", c.temperature));
  if (!(c.top_p > 0 && c.top_p <= 1)) bad("top_p", fmt::format("must be in (0, 1], got {}", c.top_p));
  if (c.top_k < 0) bad("top_k", fmt::format("must be >= 0 (0: off), got {}", c.top_k));
  if (c.min_p && !(*c.min_p >= 0 && *c.min_p <= 1)) bad("min_p", fmt::format("must be in [0, 1], got {}", *c.min_p));
  if (!(c.repetition_penalty > 0)) bad("repetition_penalty", fmt::format("must be > 0, got {}", c.repetition_penalty));
  if (!(c.epsilon >= 0) || !std::isfinite(c.epsilon)) bad("epsilon", fmt::format("must be a finite number >= 0, got {}", c.epsilon));
  if (c.epsilon_high && !(*c.epsilon_high >= 0)) bad("epsilon_high", fmt::format("must be >= 0, got {}", *c.epsilon_high));
  if (!std::isfinite(c.beta) || c.beta < 0) bad("beta", fmt::format("must be a finite number >= 0, got {}", c.beta));
  if (!c.cache_implementation.empty() && c.cache_implementation != "static" && c.cache_implementation != "dynamic")
    bad("cache_implementation", fmt::format("'{}' is not static or dynamic", c.cache_implementation));
  if (!c.chat_template_kwargs.is_object()) bad("chat_template_kwargs", fmt::format("must be a JSON object, got {}", c.chat_template_kwargs.dump()));
  if (!c.generation_kwargs.is_object()) bad("generation_kwargs", fmt::format("must be a JSON object, got {}", c.generation_kwargs.dump()));
  for (auto it = c.generation_kwargs.begin(); it != c.generation_kwargs.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::ordered_json& v = it.value();
    if (key == "do_sample") {
      if (!v.is_boolean()) bad("generation_kwargs", fmt::format("do_sample must be true or false, got {}", v.dump()));
    } else if (key == "top_k") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) bad("generation_kwargs", fmt::format("top_k must be an integer >= 0, got {}", v.dump()));
    } else if (key == "temperature" || key == "top_p" || key == "min_p" || key == "repetition_penalty") {
      const double x = v.is_number() ? v.get<double>() : std::nan("");
      const bool ok = key == "temperature" || key == "repetition_penalty" ? x > 0 && std::isfinite(x) : key == "top_p" ? x > 0 && x <= 1 : x >= 0 && x <= 1;
      if (!ok) bad("generation_kwargs", fmt::format("{} = {} is out of range", key, v.dump()));
    } else {
      bad("generation_kwargs", fmt::format("'{}' is not a setting trl.cpp's generation reads (do_sample, temperature, top_p, top_k, min_p, "
                                           "repetition_penalty)", key));
    }
  }
  if (c.num_completions_to_print && *c.num_completions_to_print < 0) bad("num_completions_to_print", "must be >= 0");
  if (!(c.reward_timeout_seconds > 0)) bad("reward_timeout_seconds", fmt::format("must be > 0, got {}", c.reward_timeout_seconds));
  if (reward_functions < 1) fail("{}: no reward function: give at least one (--reward_funcs length:200, ...)", name);
  if (!c.reward_weights.empty() && static_cast<int64_t>(c.reward_weights.size()) != reward_functions)
    bad("reward_weights", fmt::format("has {} values for {} reward functions", c.reward_weights.size(), reward_functions));
  for (double w : c.reward_weights)
    if (!std::isfinite(w)) bad("reward_weights", "must be finite numbers");
  if (c.auto_find_batch_size)
    bad("auto_find_batch_size", "is not supported: the generation batch layout depends on per_device_train_batch_size; set it explicitly");
  if (c.eval_strategy != "no") bad("eval_strategy", "must be no: evaluation with generation is not implemented for online methods yet");
  try {
    parse_pad_to_multiple_of(c.pad_to_multiple_of, 1);
  } catch (const Error& e) {
    bad("pad_to_multiple_of", e.what());
  }
  resolve_layout(c, name, dist::world().size() / std::max<int64_t>(1, c.distributed.model_parallel_size()));  // the data-parallel ranks
}

class OnlineMethod final : public TrainingMethod {
 public:
  // One of grpo / rloo is set.
  OnlineMethod(const GRPOConfig* grpo, const RLOOConfig* rloo, const Tokenizer& tok, std::vector<NamedRewardFunction> rewards, const Dataset& train,
               const CausalLM* ref, const Trainer& trainer, std::function<void(const RolloutRecord&)>* on_rollout)
      : rloo_(rloo != nullptr), tok_(tok), rewards_(std::move(rewards)), on_rollout_(on_rollout) {
    if (grpo) cfg_ = *grpo, grpo_ = *grpo;
    else cfg_ = *rloo, rloo_cfg_ = *rloo;
    name_ = rloo_ ? "RLOO" : "GRPO";
    // The data-parallel ranks split each round; a tensor-parallel group generates and trains on the same rows.
    world_ = trainer.data_parallel_size(), rank_ = trainer.data_parallel_rank();
    writer_ = dist::world().rank() == 0;
    layout_ = resolve_layout(cfg_, config_name(), world_);
    multiple_ = parse_pad_to_multiple_of(cfg_.pad_to_multiple_of, trainer.auto_pad_multiple());
    const auto eos = tok.eos_token_id();
    const auto pad = tok.pad_token_id();
    if (!eos || !pad) fail("{}: the tokenizer has no eos_token: completions could not end", name_);
    eos_ = *eos, pad_ = *pad;
    weights_ = cfg_.reward_weights.empty() ? std::vector<double>(rewards_.size(), 1.0) : cfg_.reward_weights;
    prepare_prompts(train, trainer.model().config());
    rounds_per_epoch_ = static_cast<int64_t>(prompts_.size()) / (layout_.per_round / layout_.G);
    if (rounds_per_epoch_ < 1)
      fail("{}: a generation round needs {} prompts ({} completions / num_generations {}), the dataset has {}", name_, layout_.per_round / layout_.G,
           layout_.per_round, layout_.G, prompts_.size());
    const int64_t generate_every = layout_.spg * layout_.iterations;
    // As TRL: the log-probs at generation time are needed when the weights change between generation and a
    // micro-batch's loss (RLOO needs them for its KL penalty anyway).
    need_old_ = cfg_.gradient_accumulation_steps % generate_every != 0 || (rloo_ && cfg_.beta != 0);
    if (cfg_.beta != 0) reference_ = std::make_unique<FrozenModel>(ref, trainer, programs_to_keep());
    // The generator reads the trainer's compute weights in place (a model over the same tensors, which AdamW
    // updates in place): no copy of the weights per round, and no recompilation when they change.
    policy_ = std::make_unique<CausalLM>(trainer.model().with_weights(trainer.compute_weights(), "policy"));
    generator_ = std::make_unique<Generator>(*policy_);
    loss_.rloo = rloo_;
    loss_.epsilon_low = cfg_.epsilon, loss_.epsilon_high = cfg_.epsilon_high.value_or(cfg_.epsilon);
    loss_.temperature = cfg_.temperature;
    loss_.gradient_checkpointing = cfg_.gradient_checkpointing;
    GrpoLossOptions& g = loss_.grpo;
    g.loss_type = grpo_.loss_type;
    g.epsilon_low = loss_.epsilon_low, g.epsilon_high = loss_.epsilon_high;
    g.delta = grpo_.delta;
    g.beta = cfg_.beta;
    g.importance_sampling_level = grpo_.importance_sampling_level;
    g.max_completion_length = cfg_.max_completion_length;
  }

  const char* name() const override { return name_.c_str(); }
  size_t num_items() const override {
    return static_cast<size_t>(rounds_per_epoch_ * layout_.per_round * layout_.iterations);
  }
  bool sequential_items() const override { return true; }
  size_t programs_to_keep() const override {
    const int64_t m = multiple_ > 0 ? multiple_ : 1;
    const int64_t pb = multiple_ > 0 ? longest_prompt_ / m + 2 : 8, cb = multiple_ > 0 ? cfg_.max_completion_length / m + 2 : 8;
    return static_cast<size_t>(std::min<int64_t>(2 * pb * cb + 4, 64));
  }
  std::optional<graph::Graph> largest_program(const CausalLM& model, int64_t batch) const override {
    const int64_t C = padded_length(cfg_.max_completion_length, multiple_), T = padded_length(longest_prompt_, multiple_) + C;
    return training_graph(model, {.batch = batch,
                                  .tokens = T,
                                  .gradient_checkpointing = cfg_.gradient_checkpointing,
                                  .metrics = true,
                                  .temperature = cfg_.temperature,
                                  .logits_to_keep = C,
                                  .aux_loss = aux_loss_coef(model, cfg_.router_aux_loss_coef) != 0});
  }
  FrozenMemory frozen_memory(int64_t batch) override {
    if (!reference_) return {};
    return reference_->memory(batch, padded_length(longest_prompt_, multiple_) + padded_length(cfg_.max_completion_length, multiple_));
  }

  const ProgramCacheStats& generation_stats() const { return generator_->stats(); }

  MethodStep step(const std::vector<std::vector<size_t>>& micro, MethodContext& ctx, MetricWindow& metrics, const GradientSink& add) override {
    const auto t0 = Clock::now();
    MethodStep out;
    double gen_s = 0, reward_s = 0;
    const int64_t per_round_micro = layout_.spg * layout_.iterations;
    backend_ = &ctx.backend;
    if (rollout_) {  // a round loaded from a checkpoint: its log-probs go where the loss reads them
      for (Tensor* t : {&rollout_->old_logp, &rollout_->ref_logp})
        if (t->numel() > 0 && !t->is_device()) *t = ctx.to_backend(*t, "rollout log-probs");
    }
    for (size_t k = 0; k < micro.size(); ++k) {
      const int64_t j = static_cast<int64_t>(micro[k].at(0)) / (layout_.bs * world_), round = j / per_round_micro, within = j % per_round_micro;
      if (!rollout_ || rollout_->epoch != ctx.epoch || rollout_->round != round) {
        generate_round(ctx, ctx.epoch, round, metrics, gen_s, reward_s, out.tokens);
      }
      const std::vector<size_t> rows = chunk_rows(*rollout_, within % layout_.spg, rank_);
      out.loss += train_micro(ctx, rows, static_cast<int64_t>(micro.size()), ctx.share(k, rows.size()), metrics, add);
    }
    const double total = seconds_since(t0);
    metrics.add("step_time", total);
    metrics.add("time/generation", gen_s);
    metrics.add("time/rewards", reward_s);
    metrics.add("time/training", total - gen_s - reward_s);
    return out;
  }

  // A round's log-probs as rows of floats on the host (the checkpoint's rollout.json).
  std::vector<std::vector<float>> host_logps(const Tensor& t) const { return logp_rows(t.is_device() ? backend_->download(t) : t); }

  void save_state(const std::string& dir) const override {
    if (!rollout_) return;
    const Rollout& r = *rollout_;
    ojson j{{"epoch", r.epoch}, {"round", r.round}, {"P", r.P}, {"C", r.C}, {"prompt_of", r.prompt_of}, {"prompt_ids", r.prompt_ids}, {"completions", r.completions},
            {"truncated", std::vector<int>(r.truncated.begin(), r.truncated.end())}, {"advantages", r.advantages}, {"old_logp", host_logps(r.old_logp)},
            {"ref_logp", host_logps(r.ref_logp)}, {"order", r.order}, {"num_items", r.num_items}};
    write_text_file_atomic(dir + "/rollout.json", j.dump());
  }
  void load_state(const std::string& dir) override {
    const std::string path = dir + "/rollout.json";
    rollout_.reset();
    if (!std::filesystem::exists(path)) return;
    try {
      const ojson j = parse_json<ojson>(read_text_file(path), path);
      if (!j.is_object()) fail("it holds {}, not an object", json_kind(j));
      // Each field read as what it must be; an error names the field (the library's words never reach the user).
      auto get = [&j](const char* key, auto& out, const char* what) {
        if (!j.contains(key)) fail("field '{}' is missing", key);
        try {
          j[key].get_to(out);
        } catch (const nlohmann::json::exception&) {
          fail("field '{}' must be {}, got {}", key, what, json_kind(j[key]));
        }
      };
      Rollout r;
      get("epoch", r.epoch, "a whole number"), get("round", r.round, "a whole number"), get("P", r.P, "a whole number"), get("C", r.C, "a whole number");
      get("prompt_of", r.prompt_of, "a list of prompt indices");
      get("prompt_ids", r.prompt_ids, "a list of token-id lists");
      get("completions", r.completions, "a list of token-id lists");
      r.mask_truncated = cfg_.mask_truncated_completions;
      std::vector<int> truncated;
      get("truncated", truncated, "a list of 0/1 flags");
      for (int t : truncated) r.truncated.push_back(static_cast<char>(t));
      get("advantages", r.advantages, "a list of numbers");
      std::vector<std::vector<float>> old_logp, ref_logp;
      get("old_logp", old_logp, "a list of log-prob lists");
      get("ref_logp", ref_logp, "a list of log-prob lists");
      r.old_logp = logp_table(old_logp, r.C);
      r.ref_logp = logp_table(ref_logp, r.C);
      for (const Tensor* t : {&r.old_logp, &r.ref_logp})
        if (t->numel() > 0 && t->size(0) != static_cast<int64_t>(r.prompt_of.size()))
          fail("{} rows of log-probs for a round of {} completions", t->size(0), r.prompt_of.size());
      get("order", r.order, "a list of item indices");
      get("num_items", r.num_items, "a number");
      for (size_t p : r.prompt_of)
        if (p >= prompts_.size()) fail("prompt index {} is outside the dataset's {} prompts", p, prompts_.size());
      check_round(r);
      rollout_ = std::make_unique<Rollout>(std::move(r));
    } catch (const std::exception& e) {
      fail("resume_from_checkpoint {}: {} is not a valid generation round: {}", dir, path, e.what());
    }
  }

 private:
  const char* config_name() const { return rloo_ ? "RLOOConfig" : "GRPOConfig"; }

  // A saved round's parts agree with each other and with this run (the bad-input sweep found rounds whose lists
  // differed in length reading past their ends): N rows everywhere, the order a permutation of them, the buckets
  // holding every row, token ids inside the vocabulary.
  void check_round(const Rollout& r) const {
    const size_t N = r.prompt_of.size();
    const std::pair<const char*, size_t> lists[] = {{"prompt_ids", r.prompt_ids.size()}, {"completions", r.completions.size()},
                                                    {"truncated", r.truncated.size()}, {"advantages", r.advantages.size()}, {"order", r.order.size()}};
    for (const auto& [name, n] : lists)
      if (n != N) fail("field '{}' has {} entries for a round of {} rows (prompt_of)", name, n, N);
    if (N == 0) fail("the round has no rows");
    std::vector<char> seen(N, 0);
    for (size_t i : r.order) {
      if (i >= N || seen[i]) fail("field 'order' must hold each of the {} rows once, got {}", N, i);
      seen[i] = 1;
    }
    constexpr int64_t kMaxBucket = int64_t{1} << 20;
    if (r.P < 1 || r.C < 1 || r.P > kMaxBucket || r.C > kMaxBucket) fail("fields 'P' and 'C' (the buckets) must be in [1, {}], got {} and {}", kMaxBucket, r.P, r.C);
    for (size_t i = 0; i < N; ++i) {
      if (static_cast<int64_t>(r.prompt_ids[i].size()) > r.P || static_cast<int64_t>(r.completions[i].size()) > r.C || r.completions[i].empty())
        fail("row {}: a prompt of {} and a completion of {} tokens do not fit the buckets P = {} and C = {}", i, r.prompt_ids[i].size(),
             r.completions[i].size(), r.P, r.C);
      for (const auto* ids : {&r.prompt_ids[i], &r.completions[i]})
        for (int32_t id : *ids)
          if (id < 0 || id >= vocab_size_) fail("row {}: token id {} is outside the model's vocabulary of {} ids", i, id, vocab_size_);
    }
  }

  void prepare_prompts(const Dataset& train, const ModelConfig& mc) {
    vocab_size_ = mc.vocab_size;
    ChatTemplateOptions co;
    co.add_generation_prompt = true;
    co.extra = cfg_.chat_template_kwargs;
    for (size_t i = 0; i < train.size(); ++i) {
      const ojson row = train.row(i);
      const std::string where = train.location(i);
      if (!row.is_object() || !row.contains("prompt"))
        fail("{}: {}: a row needs a \"prompt\" (text, or a list of messages); it has {}", name_, where, row.is_object() ? fmt::format("keys {}", keys_of(row)) : row.dump());
      const ojson& p = row["prompt"];
      Prompt pr;
      pr.prompt = p, pr.row = i;
      if (p.is_string()) {
        pr.ids = tok_.encode(p.get<std::string>(), /*add_special_tokens=*/false);
      } else if (p.is_array()) {
        try {
          pr.ids = apply_chat_template_ids(tok_, p, co).input_ids;
        } catch (const Error& e) {
          fail("{}: {}: the prompt's conversation cannot be rendered: {}", name_, where, e.what());
        }
      } else {
        fail("{}: {}: \"prompt\" must be text or a list of messages, got {}", name_, where, p.dump().substr(0, 200));
      }
      if (pr.ids.empty()) fail("{}: {}: the prompt is empty", name_, where);
      const int64_t need = padded_length(static_cast<int64_t>(pr.ids.size()), multiple_) + padded_length(cfg_.max_completion_length, multiple_);
      if (need > mc.max_position_embeddings)
        fail("{}: {}: a prompt of {} tokens and max_completion_length {} need {} positions, more than the model's max_position_embeddings ({})", name_,
             where, pr.ids.size(), cfg_.max_completion_length, need, mc.max_position_embeddings);
      longest_prompt_ = std::max<int64_t>(longest_prompt_, static_cast<int64_t>(pr.ids.size()));
      prompts_.push_back(std::move(pr));
      train_rows_.push_back(row);
    }
    if (prompts_.empty()) fail("{}: the training dataset has no rows", name_);
    for (const auto& [k, v] : train_rows_[0].items())
      if (k != "prompt" && k != "completion") columns_.push_back(k);
  }

  static std::string keys_of(const ojson& row) {
    std::string s;
    for (const auto& [k, v] : row.items()) s += (s.empty() ? "" : ", ") + k;
    return "[" + s + "]";
  }

  // The epoch's prompt order (TRL's RepeatSampler: a seeded permutation when shuffle_dataset).
  std::vector<size_t> prompt_order(int64_t epoch) const {
    std::vector<size_t> o(prompts_.size());
    std::iota(o.begin(), o.end(), 0);
    if (!cfg_.shuffle_dataset) return o;
    SplitMix64 rng(cfg_.seed * 0xD1B54A32D192ED03ull + static_cast<uint64_t>(epoch) + 17);
    for (size_t i = o.size(); i > 1; --i) std::swap(o[i - 1], o[rng.next() % i]);
    return o;
  }

  // Rank `rank`'s rows of chunk `chunk` of the round: its run of bs rows of the chunk's W·bs.
  std::vector<size_t> chunk_rows(const Rollout& r, int64_t chunk, int64_t rank) const {
    const int64_t at = (chunk * world_ + rank) * layout_.bs;
    return std::vector<size_t>(r.order.begin() + at, r.order.begin() + at + layout_.bs);
  }
  // Every row rank `rank` trains on in the round, chunk by chunk.
  std::vector<size_t> rank_rows(const Rollout& r, int64_t rank) const {
    std::vector<size_t> rows;
    for (int64_t c = 0; c < layout_.spg; ++c) {
      const std::vector<size_t> part = chunk_rows(r, c, rank);
      rows.insert(rows.end(), part.begin(), part.end());
    }
    return rows;
  }
  // Each rank's values for its rows (`per_row` numbers a row, rank_rows order) -> every row's, in round order.
  template <typename T>
  std::vector<T> gather_rows(dist::Communicator& dp, const Rollout& r, const std::vector<T>& mine, size_t per_row, DType dtype) const {
    const size_t n = mine.size();
    // out: one row per row of the round (r.size() counts the completions, which may not be there yet)
    std::vector<T> all(n * static_cast<size_t>(world_)), out(r.prompt_of.size() * per_row);
    dp.all_gather(mine.data(), all.data(), static_cast<int64_t>(n), dtype);
    for (int64_t q = 0; q < world_; ++q) {
      const std::vector<size_t> rows = rank_rows(r, q);
      for (size_t k = 0; k < rows.size(); ++k)
        std::copy_n(all.begin() + static_cast<int64_t>(static_cast<size_t>(q) * n + k * per_row), per_row, out.begin() + static_cast<int64_t>(rows[k] * per_row));
    }
    return out;
  }
  // Each rank's log-probs of its rows -> every row's. The gather runs on the host (on a device the ranks' rows come
  // down and every row goes back up: once per round, not per step).
  Tensor gather_logps(MethodContext& ctx, const Rollout& r, const std::vector<size_t>& mine, const Tensor& logps) const {
    dist::Communicator& dp = ctx.dp;
    if (dp.size() == 1) return logps;  // every row is this rank's, already in place
    const size_t C = static_cast<size_t>(r.C);
    const Tensor host = ctx.to_host(logps);
    const float* x = host.data_as<float>();
    std::vector<float> flat;
    for (size_t i : mine) flat.insert(flat.end(), x + i * C, x + (i + 1) * C);
    const std::vector<float> all = gather_rows(dp, r, flat, C, DType::F32);
    Tensor out = Tensor::zeros(DType::F32, {static_cast<int64_t>(r.size()), r.C});
    std::copy(all.begin(), all.end(), out.mutable_data_as<float>());
    return ctx.to_backend(out, "rollout log-probs");
  }

  void generate_round(MethodContext& ctx, int64_t epoch, int64_t round, MetricWindow& metrics, double& gen_s, double& reward_s, int64_t& tokens) {
    auto t = Clock::now();
    dist::Communicator& dp = ctx.dp;
    const int64_t U = layout_.per_round / layout_.G;
    const std::vector<size_t> order = prompt_order(epoch);
    auto r = std::make_unique<Rollout>();
    r->epoch = epoch, r->round = round;
    r->mask_truncated = cfg_.mask_truncated_completions;
    int64_t longest_prompt = 0;
    for (int64_t u = 0; u < U; ++u) {
      const size_t p = order[static_cast<size_t>(round * U + u)];
      for (int64_t g = 0; g < layout_.G; ++g) r->prompt_of.push_back(p), r->prompt_ids.push_back(prompts_[p].ids);
      longest_prompt = std::max<int64_t>(longest_prompt, static_cast<int64_t>(prompts_[p].ids.size()));
    }
    const size_t N = r->prompt_of.size();
    const int64_t batch_no = epoch * rounds_per_epoch_ + round + 1;
    // The round's rows shuffled (TRL's shuffle_sequence_dict), seeded by the round; chunk c is order[c·W·bs, ...).
    r->order.resize(N);
    std::iota(r->order.begin(), r->order.end(), 0);
    SplitMix64 shuffle(cfg_.seed * 0xA24BAED4963EE407ull + static_cast<uint64_t>(batch_no));
    for (size_t i = N; i > 1; --i) std::swap(r->order[i - 1], r->order[shuffle.next() % i]);
    const std::vector<size_t> mine = rank_rows(*r, rank_);

    // This rank's rows, generated with the current weights, each from the stream of its place in the round.
    GenerationConfig gc;
    gc.max_new_tokens = cfg_.max_completion_length;
    gc.do_sample = true;
    gc.temperature = static_cast<float>(cfg_.temperature);
    gc.top_p = static_cast<float>(cfg_.top_p);
    gc.top_k = cfg_.top_k;
    if (cfg_.min_p) gc.min_p = static_cast<float>(*cfg_.min_p);
    gc.repetition_penalty = static_cast<float>(cfg_.repetition_penalty);
    const ojson& over = cfg_.generation_kwargs;  // TRL updates its generation settings with these (checked above)
    if (over.contains("do_sample")) gc.do_sample = over["do_sample"].get<bool>();
    if (over.contains("temperature")) gc.temperature = over["temperature"].get<float>();
    if (over.contains("top_p")) gc.top_p = over["top_p"].get<float>();
    if (over.contains("top_k")) gc.top_k = over["top_k"].get<int64_t>();
    if (over.contains("min_p")) gc.min_p = over["min_p"].get<float>();
    if (over.contains("repetition_penalty")) gc.repetition_penalty = over["repetition_penalty"].get<float>();
    gc.eos_token_id = std::vector<int32_t>{eos_};
    gc.pad_token_id = pad_;
    const uint64_t round_seed = cfg_.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) * 1000003ull + static_cast<uint64_t>(round) + 1;
    std::vector<std::vector<int32_t>> prompt_ids;
    for (size_t i : mine) {
      prompt_ids.push_back(r->prompt_ids[i]);
      gc.row_seeds.push_back(SplitMix64(round_seed ^ (0xD6E8FEB86659FD93ull * (i + 1))).next());
    }
    gc.pad_to_multiple_of = multiple_;
    gc.disable_compile = !ctx.args.torch_compile;
    const GenerationOutput g = generator_->generate(prompt_ids, gc, &tok_);
    // Completions cut after the first EOS (kept), gathered from every rank as rows of max_completion_length + 1
    // numbers: the length, then the tokens.
    const size_t width = static_cast<size_t>(cfg_.max_completion_length) + 1;
    std::vector<int32_t> packed(mine.size() * width, 0);
    for (size_t k = 0; k < mine.size(); ++k) {
      std::vector<int32_t> c = g.generated[k];
      const auto at = std::find(c.begin(), c.end(), eos_);
      if (at != c.end()) c.erase(at + 1, c.end());
      if (c.empty()) c.push_back(eos_);  // max_completion_length >= 1 always yields a token
      packed[k * width] = static_cast<int32_t>(c.size());
      std::copy(c.begin(), c.end(), packed.begin() + static_cast<int64_t>(k * width + 1));
    }
    const std::vector<int32_t> every = gather_rows(dp, *r, packed, width, DType::I32);
    r->completions.resize(N);
    for (size_t i = 0; i < N; ++i) {
      const int32_t* row = every.data() + i * width;
      r->completions[i].assign(row + 1, row + 1 + row[0]);
    }
    int64_t longest = 1;
    for (const auto& c : r->completions) {
      r->truncated.push_back(c.back() != eos_ && c.back() != pad_);
      longest = std::max<int64_t>(longest, static_cast<int64_t>(c.size()));
    }
    r->P = padded_length(longest_prompt, multiple_);
    r->C = padded_length(longest, multiple_);
    rollout_ = std::move(r);
    Rollout& ro = *rollout_;
    auto logps_of = [&](const std::function<Tensor(const SFTBatch&)>& run) {
      return gather_logps(ctx, ro, mine, rollout_logps(ro, mine, layout_.bs, pad_, ctx.backend, run));
    };
    if (need_old_) ro.old_logp = logps_of([&](const SFTBatch& b) { return token_logprobs(ctx.model, ctx.weights, ctx.programs, b, cfg_.temperature, ro.C); });
    if (reference_) ro.ref_logp = logps_of([&](const SFTBatch& b) { return reference_->token_logprobs(b, cfg_.temperature, ro.C); });
    gen_s += seconds_since(t);

    // Rewards of this rank's rows, then every row's.
    t = Clock::now();
    RewardInputs in;
    in.batch = batch_no;
    std::vector<std::string> texts(N);
    std::vector<ojson> prompts(N);
    for (size_t i = 0; i < N; ++i) {
      prompts[i] = prompts_[ro.prompt_of[i]].prompt;
      texts[i] = tok_.decode(ro.completions[i], /*skip_special_tokens=*/true);
    }
    for (size_t i : mine) {
      const Prompt& p = prompts_[ro.prompt_of[i]];
      in.prompts.push_back(p.prompt);
      in.completions.push_back(p.prompt.is_array() ? ojson::array({ojson{{"role", "assistant"}, {"content", texts[i]}}}) : ojson(texts[i]));
      in.completion_ids.push_back(ro.completions[i]);
      tokens += static_cast<int64_t>(p.ids.size() + ro.completions[i].size());
    }
    for (const std::string& col : columns_) {
      std::vector<ojson> values;
      for (size_t i : mine) {
        const ojson& row = train_row(ro.prompt_of[i]);
        values.push_back(row.contains(col) ? row[col] : ojson());
      }
      in.columns.emplace_back(col, std::move(values));
    }
    const int64_t F = static_cast<int64_t>(rewards_.size());
    const size_t n = mine.size();
    std::vector<double> local(n * static_cast<size_t>(F), kNaN);
    for (int64_t f = 0; f < F; ++f) {
      std::vector<std::optional<double>> v;
      try {
        v = rewards_[static_cast<size_t>(f)].fn(in);
      } catch (const Error& e) {
        fail("{}: reward function '{}' failed on batch {}: {}", name_, rewards_[static_cast<size_t>(f)].name, in.batch, e.what());
      }
      if (v.size() != n)
        fail("{}: reward function '{}' returned {} rewards for the {} completions of batch {}", name_, rewards_[static_cast<size_t>(f)].name, v.size(), n,
             in.batch);
      for (size_t k = 0; k < n; ++k) {
        if (v[k] && !std::isfinite(*v[k]))
          fail("{}: reward function '{}' returned {} for completion {} of batch {}", name_, rewards_[static_cast<size_t>(f)].name, *v[k], mine[k], in.batch);
        local[k * static_cast<size_t>(F) + static_cast<size_t>(f)] = v[k] ? *v[k] : kNaN;
      }
    }
    const std::vector<double> table = gather_rows(dp, ro, local, static_cast<size_t>(F), DType::F64);
    reward_s += seconds_since(t);

    // Advantages and the round's metrics.
    std::vector<double> kl_rows;
    double kl_sum = 0, kl_count = 0;
    if (rloo_ && cfg_.beta != 0) {
      // Σ_t m·(old − ref) per completion, from the masked sums where the log-probs are.
      std::vector<size_t> all_rows(N);
      std::iota(all_rows.begin(), all_rows.end(), size_t{0});
      std::vector<Backend::Span> spans;
      for (size_t i = 0; i < N; ++i) spans.push_back({static_cast<int64_t>(i), 0, ro.C});
      const Tensor mask = ctx.to_backend(ro.completion_mask(all_rows), "completion_mask");
      const std::vector<double> old = ctx.backend.span_sums(ro.old_logp, &mask, nullptr, spans), ref = ctx.backend.span_sums(ro.ref_logp, &mask, nullptr, spans);
      for (size_t i = 0; i < N; ++i) {
        kl_rows.push_back(old[i] - ref[i]);
        kl_sum += kl_rows.back();
        for (int64_t c = 0; c < ro.C; ++c) kl_count += ro.mask(i, c);
      }
    }
    const Advantages a = rloo_ ? rloo_advantages(table, F, weights_, layout_.G, kl_rows, cfg_.beta, rloo_cfg_.reward_clip_range, rloo_cfg_.normalize_advantages)
                               : grpo_advantages(table, F, weights_, layout_.G, grpo_.scale_rewards, grpo_.multi_objective_aggregation);
    ro.advantages = a.advantages;
    ro.count_items();
    add_round_metrics(metrics, a, kl_count > 0 ? kl_sum / kl_count : kNaN);
    if (cfg_.log_completions) log_completions(ctx, prompts, texts, table, a);
    if (on_rollout_ && *on_rollout_) {
      RolloutRecord rec;
      for (size_t i = 0; i < N; ++i) {
        const ojson& p = prompts[i];
        rec.prompts.push_back(p.is_string() ? p.get<std::string>() : p.dump());
        rec.completions.push_back(texts[i]);
        rec.rewards.emplace_back(table.begin() + static_cast<int64_t>(i) * F, table.begin() + static_cast<int64_t>(i + 1) * F);
      }
      rec.advantages = a.advantages;
      (*on_rollout_)(rec);
    }
  }

  const ojson& train_row(size_t prompt) const { return train_rows_.at(prompts_[prompt].row); }

  void add_round_metrics(MetricWindow& m, const Advantages& a, double rloo_kl) const {
    const Rollout& r = *rollout_;
    std::vector<double> lengths, terminated;
    int64_t clipped = 0;
    for (size_t i = 0; i < r.completions.size(); ++i) {
      const double n = static_cast<double>(r.completions[i].size());
      lengths.push_back(n);
      if (r.truncated[i]) ++clipped;
      else terminated.push_back(n);
    }
    if (terminated.empty()) terminated.push_back(0);  // as TRL: no terminated completion logs 0
    auto add = [&](const std::string& k, double v) {
      if (std::isfinite(v)) m.add(k, v);  // NaN means "no value" (TRL leaves it out of the mean)
    };
    add("completions/mean_length", std::accumulate(lengths.begin(), lengths.end(), 0.0) / static_cast<double>(lengths.size()));
    add("completions/min_length", *std::min_element(lengths.begin(), lengths.end()));
    add("completions/max_length", *std::max_element(lengths.begin(), lengths.end()));
    add("completions/clipped_ratio", static_cast<double>(clipped) / static_cast<double>(lengths.size()));
    add("completions/mean_terminated_length", std::accumulate(terminated.begin(), terminated.end(), 0.0) / static_cast<double>(terminated.size()));
    add("completions/min_terminated_length", *std::min_element(terminated.begin(), terminated.end()));
    add("completions/max_terminated_length", *std::max_element(terminated.begin(), terminated.end()));
    for (size_t f = 0; f < rewards_.size(); ++f) {
      add("rewards/" + rewards_[f].name + "/mean", a.func_mean[f]);
      add("rewards/" + rewards_[f].name + "/std", a.func_std[f]);
    }
    add("reward", a.reward_mean);
    add("reward_std", a.reward_std);
    add("frac_reward_zero_std", a.frac_reward_zero_std);
    if (rloo_ && cfg_.beta != 0) add("kl", rloo_kl);
  }

  // log_completions: a sample of the round in the log (stderr) and every row in output_dir/completions.jsonl.
  std::vector<ojson> report_samples() const override { return {samples_.begin(), samples_.end()}; }

  // Rank 0 prints and writes (every rank holds the whole round).
  void log_completions(MethodContext& ctx, const std::vector<ojson>& prompts, const std::vector<std::string>& texts, const std::vector<double>& table,
                       const Advantages& a) {
    const size_t F = rewards_.size(), show = static_cast<size_t>(cfg_.num_completions_to_print.value_or(4));
    std::string lines;
    for (size_t i = 0; i < texts.size(); ++i) {
      ojson rw = ojson::object();
      for (size_t f = 0; f < F; ++f) {
        const double v = table[i * F + f];
        rw[rewards_[f].name] = std::isnan(v) ? ojson() : ojson(v);
      }
      const ojson row{{"step", ctx.global_step + 1}, {"prompt", prompts[i]}, {"completion", texts[i]}, {"rewards", rw}, {"advantage", a.advantages[i]}};
      lines += row.dump() + "\n";
      if (i < std::max<size_t>(show, 1)) {  // the report keeps the first rows of the last rounds
        samples_.push_back(row);
        while (samples_.size() > 20) samples_.pop_front();
      }
      if (i < show && writer_) {
        const std::string p = prompts[i].is_string() ? prompts[i].get<std::string>() : prompts[i].dump();
        std::fprintf(stderr, "[trl] %s step %lld | prompt: %.80s | completion: %.120s | rewards: %s | advantage: %.3f\n", name_.c_str(),
                     static_cast<long long>(ctx.global_step + 1), p.c_str(), texts[i].c_str(), rw.dump().c_str(), a.advantages[i]);
      }
    }
    if (writer_) ctx.append_completions(lines);
  }

  // share: this rank's part of the micro-batch's rows (1 with one process).
  double train_micro(MethodContext& ctx, const std::vector<size_t>& rows, int64_t micro_batches, double share, MetricWindow& metrics,
                     const GradientSink& add) {
    OnlineLoss loss = loss_;
    // dapo divides by the loss tokens of the whole round (every rank's): its per-rank losses already sum to the
    // round's. The others average over the micro-batch's rows (grpo, dr_grpo, RLOO: exactly the one-process
    // loss) or over this rank's tokens (bnpo: as TRL's DDP average of the ranks' losses).
    loss.share = !rloo_ && grpo_.loss_type == "dapo" ? 1.0 : share;
    loss.aux_weight = aux_loss_coef(ctx.model, cfg_.router_aux_loss_coef) * share / static_cast<double>(micro_batches);
    const OnlineStepResult r = online_train_step(ctx.model, ctx.weights, ctx.programs, *rollout_, rows, loss, micro_batches, pad_);
    auto put = [&](const char* k, double v) {
      if (std::isfinite(v)) metrics.add(k, v);  // NaN: no value (TRL leaves it out of the mean)
    };
    put("entropy", r.metrics.entropy);
    if (!rloo_ && cfg_.beta != 0) put("kl", r.metrics.kl);
    put("clip_ratio/low_mean", r.metrics.clip_low_mean);
    put("clip_ratio/low_min", r.metrics.clip_low_min);
    put("clip_ratio/high_mean", r.metrics.clip_high_mean);
    put("clip_ratio/high_max", r.metrics.clip_high_max);
    put("clip_ratio/region_mean", r.metrics.clip_region_mean);
    if (r.aux_loss) put("aux_loss", *r.aux_loss);
    add(r.grads);
    return r.loss;
  }

  std::vector<ojson> train_rows_;  // the dataset's rows, kept for the reward functions' extra columns
  bool rloo_;
  std::string name_;
  OnlineRLConfig cfg_;
  GRPOConfig grpo_;
  RLOOConfig rloo_cfg_;
  const Tokenizer& tok_;
  std::vector<NamedRewardFunction> rewards_;
  std::vector<double> weights_;
  std::function<void(const RolloutRecord&)>* on_rollout_;
  Layout layout_;
  int64_t world_ = 1, rank_ = 0;  // the data-parallel ranks and this one
  int64_t vocab_size_ = 0;        // the policy's (a saved round's ids are checked against it)
  bool writer_ = true;            // rank 0 of the job: prints samples and writes completions.jsonl
  int64_t multiple_ = 0, rounds_per_epoch_ = 0, longest_prompt_ = 0;
  int32_t eos_ = 0, pad_ = 0;
  bool need_old_ = false;
  std::vector<Prompt> prompts_;
  std::vector<std::string> columns_;
  std::unique_ptr<FrozenModel> reference_;
  std::unique_ptr<CausalLM> policy_;
  std::unique_ptr<Generator> generator_;
  std::unique_ptr<Rollout> rollout_;
  Backend* backend_ = nullptr;  // the memory rollout_'s log-probs are in (set by each step)
  OnlineLoss loss_;
  std::deque<ojson> samples_;  // log_completions: the report's rows
};

std::vector<NamedRewardFunction> checked_rewards(std::vector<NamedRewardFunction> f, const char* name) {
  for (size_t i = 0; i < f.size(); ++i)
    if (!f[i].fn) fail("{}: reward function {} ('{}') is empty", name, i, f[i].name);
  // Two functions of one name (two regex: rewards) get distinct metric keys: name, name_2, ...
  for (size_t i = 0; i < f.size(); ++i) {
    int n = 1;
    for (size_t k = 0; k < i; ++k)
      if (f[k].name == f[i].name || f[k].name.rfind(f[i].name + "_", 0) == 0) ++n;
    if (n > 1) f[i].name += fmt::format("_{}", n);
  }
  return f;
}

}  // namespace

void check_grpo_config(const GRPOConfig& c, int64_t reward_functions) {
  check_online_config(c, "GRPOConfig", reward_functions);
  const auto& t = c.loss_type;
  if (t != "grpo" && t != "bnpo" && t != "dr_grpo" && t != "dapo") fail("GRPOConfig: loss_type '{}' is not grpo, bnpo, dr_grpo or dapo", t);
  if (c.scale_rewards != "group" && c.scale_rewards != "batch" && c.scale_rewards != "none")
    fail("GRPOConfig: scale_rewards '{}' is not group, batch or none (true is group, false is none)", c.scale_rewards);
  if (c.importance_sampling_level != "token" && c.importance_sampling_level != "sequence")
    fail("GRPOConfig: importance_sampling_level '{}' is not token or sequence", c.importance_sampling_level);
  if (c.multi_objective_aggregation != "sum_then_normalize" && c.multi_objective_aggregation != "normalize_then_sum")
    fail("GRPOConfig: multi_objective_aggregation '{}' is not sum_then_normalize or normalize_then_sum", c.multi_objective_aggregation);
  if (c.delta && !(*c.delta > 1 + c.epsilon_high.value_or(c.epsilon)))
    fail("GRPOConfig: delta ({}) must be greater than 1 + epsilon_high ({})", *c.delta, 1 + c.epsilon_high.value_or(c.epsilon));
}

void check_rloo_config(const RLOOConfig& c, int64_t reward_functions) {
  check_online_config(c, "RLOOConfig", reward_functions);
  if (c.reward_clip_range && !(c.reward_clip_range->first <= c.reward_clip_range->second))
    fail("RLOOConfig: reward_clip_range ({}, {}) must be (low, high) with low <= high", c.reward_clip_range->first, c.reward_clip_range->second);
}

GRPOTrainer::GRPOTrainer(const CausalLM& model, const Tokenizer& tok, std::vector<NamedRewardFunction> reward_funcs, Dataset train, GRPOConfig config,
                         const CausalLM* ref_model) {
  reward_funcs = checked_rewards(std::move(reward_funcs), "GRPOConfig");
  check_grpo_config(config, static_cast<int64_t>(reward_funcs.size()));
  if (config.dataset_name.empty()) config.dataset_name = dataset_source_file(train);
  trainer_ = std::make_unique<Trainer>(model, config, "GRPOConfig");
  auto m = std::make_unique<OnlineMethod>(&config, nullptr, tok, std::move(reward_funcs), train, ref_model, *trainer_, &on_rollout);
  generation_stats_ = &m->generation_stats();
  trainer_->set_method(std::move(m));
}
GRPOTrainer::~GRPOTrainer() = default;

RLOOTrainer::RLOOTrainer(const CausalLM& model, const Tokenizer& tok, std::vector<NamedRewardFunction> reward_funcs, Dataset train, RLOOConfig config,
                         const CausalLM* ref_model) {
  reward_funcs = checked_rewards(std::move(reward_funcs), "RLOOConfig");
  check_rloo_config(config, static_cast<int64_t>(reward_funcs.size()));
  if (config.dataset_name.empty()) config.dataset_name = dataset_source_file(train);
  trainer_ = std::make_unique<Trainer>(model, config, "RLOOConfig");
  auto m = std::make_unique<OnlineMethod>(nullptr, &config, tok, std::move(reward_funcs), train, ref_model, *trainer_, &on_rollout);
  generation_stats_ = &m->generation_stats();
  trainer_->set_method(std::move(m));
}
RLOOTrainer::~RLOOTrainer() = default;

}  // namespace trl

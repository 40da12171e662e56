// GKD and on-policy distillation on the Trainer (include/trl/train/gkd_trainer.h, docs/DISTILLATION.md).
//
// One method serves both trainers. A training row is a prompt and a completion; each micro-batch of rows is laid
// out as online_step.h's rollouts are: [P + C] tokens, the prompt left-padded to the bucket P and the completion
// right-padded to the bucket C, so the divergence runs only at the C positions that predict completion tokens
// (logits_to_keep = C) and both models see the same rows. Per optimizer step:
//   1. Completions. GKD draws u ~ U[0, 1) per micro-batch (seeded by the step and the micro-batch, so a resumed run
//      draws the same): u < lmbda → the student generates; else with seq_kd → the teacher generates; else the
//      dataset's completion. The distillation trainer always generates with the student, num_generations per
//      prompt, the whole step's rows at once (TRL's buffer over the accumulation steps). A generated completion ends
//      after its first EOS (kept, as a label) or at the length limit.
//   2. num_items_in_batch: the completion tokens of the step, over every micro-batch and rank.
//   3. Per micro-batch: the teacher's hidden state at the kept positions (its forward-only program), then the
//      student's distillation program: loss = Σ jsd / num_items_in_batch and the gradients.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>

#include <fmt/format.h>

#include "core/clock.h"
#include "core/rng.h"
#include "train/frozen_model.h"
#include "train/online_step.h"
#include "train/trainer.h"
#include "trl/core/error.h"
#include "trl/data/sft.h"
#include "trl/generation/generate.h"
#include "trl/runtime/shapes.h"
#include "trl/tokenizer/chat_template.h"
#include "trl/train/gkd_trainer.h"
#include "trl/train/objectives.h"

namespace trl {

namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// A prompt and the completion trained on (empty until generated, for the distillation trainer's prompts).
struct DistillRow {
  std::vector<int32_t> prompt, completion;
  std::string where;
};

// Where a micro-batch's completions come from.
enum class Source { Dataset, Student, Teacher };

// What differs between GKD and the distillation trainer.
struct DistillSpec {
  std::string name;  // "GKD" | "Distillation"
  double beta = 0.5;
  double loss_temperature = 1.0;
  // Generation.
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = 0, max_new_tokens = 128;
  // GKD's sources; the distillation trainer: on_policy_always.
  double lmbda = 0;
  bool seq_kd = false, on_policy_always = false;
  int64_t num_generations = 1;
  bool shuffle_prompts = true;
  bool dropout = false;  // a LoRA adapter's dropout in the training graph (on only with disable_dropout false)
};

// The [B, K] flat indices b·T + t of the kept positions t in [T − 1 − K, T − 1).
Tensor kept_positions(int64_t B, int64_t T, int64_t K) {
  Tensor k = Tensor::zeros(DType::I32, {B, K});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < K; ++j) k.mutable_data_as<int32_t>()[b * K + j] = static_cast<int32_t>(b * T + T - 1 - K + j);
  return k;
}

class DistillMethod final : public TrainingMethod {
 public:
  DistillMethod(DistillSpec spec, std::vector<DistillRow> train, std::vector<DistillRow> eval, const Tokenizer& tok, const CausalLM& teacher,
                const Trainer& trainer, int64_t multiple)
      : spec_(std::move(spec)), train_(std::move(train)), eval_(std::move(eval)), tok_(tok), multiple_(multiple) {
    const auto eos = tok.eos_token_id();
    const auto pad = tok.pad_token_id();
    if (!eos || !pad) fail("{}: the tokenizer has no eos_token: completions could not end", spec_.name);
    pad_ = *pad;
    for (const DistillRow& r : train_) {
      longest_prompt_ = std::max<int64_t>(longest_prompt_, static_cast<int64_t>(r.prompt.size()));
      longest_completion_ = std::max<int64_t>(longest_completion_, static_cast<int64_t>(r.completion.size()));
    }
    if (spec_.lmbda > 0 || spec_.seq_kd || spec_.on_policy_always) longest_completion_ = std::max(longest_completion_, spec_.max_new_tokens);
    teacher_ = std::make_unique<FrozenModel>(FrozenModel::Teacher{}, teacher, trainer, programs_to_keep());
    // The student generates from the trainer's compute weights in place (AdamW updates them; no copy per step).
    policy_ = std::make_unique<CausalLM>(trainer.model().with_weights(trainer.compute_weights(), "policy"));
    student_gen_ = std::make_unique<Generator>(*policy_);
    eos_ids_ = student_gen_->defaults().eos_token_id.value_or(std::vector<int32_t>{*eos});
    if (spec_.seq_kd) teacher_gen_ = std::make_unique<Generator>(teacher_->model());
    teacher_shape_ = {teacher.config().hidden_size, teacher.dtype()};
  }

  const char* name() const override { return spec_.name.c_str(); }
  size_t num_items() const override { return train_.size() * static_cast<size_t>(spec_.on_policy_always ? spec_.num_generations : 1); }
  // The distillation trainer draws its prompts itself (an epoch's seeded permutation, num_generations slots each).
  bool sequential_items() const override { return spec_.on_policy_always; }
  size_t programs_to_keep() const override {
    const int64_t m = std::max<int64_t>(multiple_, 1);
    return static_cast<size_t>(std::min<int64_t>(2 * (longest_prompt_ / m + 2) * (longest_completion_ / m + 2) + 4, 64));
  }
  bool has_eval() const override { return !eval_.empty(); }

  std::optional<graph::Graph> largest_program(const CausalLM& model, int64_t batch) const override {
    const int64_t C = padded_length(longest_completion_, multiple_), T = padded_length(longest_prompt_, multiple_) + C;
    return distillation_graph(model, {.batch = batch, .tokens = T, .logits_to_keep = C, .teacher = teacher_shape_, .beta = spec_.beta, .temperature = spec_.loss_temperature, .gradient_checkpointing = gradient_checkpointing_, .dropout = spec_.dropout});
  }
  FrozenMemory frozen_memory(int64_t batch) override {
    return teacher_->memory(batch, padded_length(longest_prompt_, multiple_) + padded_length(longest_completion_, multiple_));
  }
  void set_gradient_checkpointing(bool on) { gradient_checkpointing_ = on; }
  void set_seed(uint64_t seed, bool compiled) { seed_ = seed, compiled_ = compiled; }

  MethodStep step(const std::vector<std::vector<size_t>>& micro, MethodContext& ctx, MetricWindow& metrics, const GradientSink& add) override {
    const auto t0 = Clock::now();
    MethodStep out;
    // 1. The rows of every micro-batch, their completions generated where the source says so.
    std::vector<std::vector<DistillRow>> rows(micro.size());
    std::vector<Source> source(micro.size(), Source::Dataset);
    std::vector<std::pair<size_t, size_t>> by_student, by_teacher;  // (micro-batch, row)
    for (size_t k = 0; k < micro.size(); ++k) {
      if (spec_.on_policy_always) {
        source[k] = Source::Student;
      } else {
        const double u = static_cast<double>(SplitMix64(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(ctx.global_step) * 131 + k).next() >> 11) * 0x1.0p-53;
        source[k] = u < spec_.lmbda ? Source::Student : spec_.seq_kd ? Source::Teacher : Source::Dataset;
      }
      for (size_t item : micro[k]) {
        rows[k].push_back(row_of(item, ctx.epoch));
        if (source[k] == Source::Student) by_student.emplace_back(k, rows[k].size() - 1);
        if (source[k] == Source::Teacher) by_teacher.emplace_back(k, rows[k].size() - 1);
      }
    }
    const auto tg = Clock::now();
    generate(*student_gen_, by_student, micro, rows, ctx);
    if (!by_teacher.empty()) generate(*teacher_gen_, by_teacher, micro, rows, ctx);
    const double gen_s = seconds_since(tg);
    if (!by_student.empty() || !by_teacher.empty()) completion_metrics(rows, by_student, by_teacher, metrics);
    if (!spec_.on_policy_always) {
      const auto on = std::count(source.begin(), source.end(), Source::Student);
      metrics.add("on_policy", static_cast<double>(on) / static_cast<double>(source.size()));
    }
    // 2. num_items_in_batch: the completion tokens of the whole step.
    int64_t items = 0;
    for (const auto& rs : rows)
      for (const DistillRow& r : rs) items += static_cast<int64_t>(r.completion.size());
    items = ctx.dp.sum(items);
    out.data_seconds = seconds_since(t0) - gen_s;
    // 3. The divergence and its gradients, micro-batch by micro-batch.
    for (const auto& rs : rows) {
      if (rs.empty()) continue;
      const auto r = run(ctx, rs, 1.0 / static_cast<double>(std::max<int64_t>(1, items)), true);
      out.loss += r.loss;
      out.tokens += r.tokens;
      add(r.grads);
    }
    if (!by_student.empty() || !by_teacher.empty()) metrics.add("time/generation", gen_s);
    return out;
  }

  ojson evaluate(MethodContext& ctx) override {
    if (eval_.empty()) fail("evaluate: no eval dataset");
    double sum = 0;
    int64_t items = 0;
    const size_t bsz = static_cast<size_t>(ctx.args.per_device_eval_batch_size);
    for (size_t i = 0; i < eval_.size(); i += bsz) {
      const std::vector<DistillRow> rs(eval_.begin() + static_cast<int64_t>(i), eval_.begin() + static_cast<int64_t>(std::min(eval_.size(), i + bsz)));
      sum += run(ctx, rs, 1.0, false).loss;
      for (const DistillRow& r : rs) items += static_cast<int64_t>(r.completion.size());
    }
    return ojson{{"eval_loss", sum / static_cast<double>(std::max<int64_t>(1, items))}};
  }

 private:
  struct RunResult {
    double loss = 0;
    int64_t tokens = 0;
    std::map<std::string, Tensor> grads;
  };

  // The distillation program on `rs` with loss weight `scale` per completion token.
  RunResult run(MethodContext& ctx, const std::vector<DistillRow>& rs, double scale, bool train) {
    Rollout ro;
    int64_t lp = 1, lc = 1;
    for (const DistillRow& r : rs) {
      ro.prompt_ids.push_back(r.prompt), ro.completions.push_back(r.completion);
      lp = std::max<int64_t>(lp, static_cast<int64_t>(r.prompt.size())), lc = std::max<int64_t>(lc, static_cast<int64_t>(r.completion.size()));
    }
    ro.P = padded_length(lp, multiple_), ro.C = padded_length(lc, multiple_);
    std::vector<size_t> all(rs.size());
    std::iota(all.begin(), all.end(), 0);
    const SFTBatch b = rollout_batch(ro, all, pad_);
    const int64_t B = b.input_ids.size(0), T = b.input_ids.size(1), C = ro.C;
    const Tensor kept = kept_positions(B, T, C);
    Tensor weights = Tensor::zeros(DType::F32, {B, C});
    for (int64_t i = 0; i < B; ++i)
      for (int64_t c = 0; c < static_cast<int64_t>(rs[static_cast<size_t>(i)].completion.size()); ++c)
        weights.mutable_data_as<float>()[i * C + c] = static_cast<float>(scale);
    TensorMap in = ctx.weights;
    in["teacher_hidden"] = teacher_->hidden_states(b, kept, spec_.loss_temperature);
    in["teacher_lm_head"] = teacher_->model().weights().at(teacher_->model().lm_head_name());
    in["input_ids"] = ctx.to_backend(b.input_ids, "input_ids"), in["attention_mask"] = ctx.to_backend(b.attention_mask, "attention_mask");
    in["position_ids"] = ctx.to_backend(b.position_ids, "position_ids");
    in["kept_positions"] = ctx.to_backend(kept, "kept_positions"), in["loss_weights"] = ctx.to_backend(weights, "loss_weights");
    const graph::Graph g =
        distillation_graph(ctx.model, {.batch = B, .tokens = T, .logits_to_keep = C, .teacher = teacher_shape_, .beta = spec_.beta, .temperature = spec_.loss_temperature, .gradient_checkpointing = gradient_checkpointing_, .backward = train, .dropout = spec_.dropout});
    const auto result = ctx.programs.get(g).run(in);
    RunResult out;
    const std::map<std::string, size_t> at = g.output_indices();
    out.loss = ctx.to_host(result[at.at("loss")]).data_as<float>()[0];
    if (!std::isfinite(out.loss)) fail("{}: the divergence is not finite ({}) on rows {}...", spec_.name, out.loss, rs.front().where);
    out.tokens = b.num_tokens;
    for (const auto& [n, i] : at)
      if (n.rfind("grad.", 0) == 0) out.grads[n] = result[i];
    return out;
  }

  // The training row of Trainer item `item`: a dataset row (GKD), or a prompt slot of the epoch's order.
  DistillRow row_of(size_t item, int64_t epoch) {
    if (!spec_.on_policy_always) return train_.at(item);
    if (order_epoch_ != epoch) {
      order_.resize(train_.size());
      std::iota(order_.begin(), order_.end(), 0);
      if (spec_.shuffle_prompts) {
        SplitMix64 rng(seed_ * 0xD1B54A32D192ED03ull + static_cast<uint64_t>(epoch) + 17);
        for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng.next() % i]);
      }
      order_epoch_ = epoch;
    }
    DistillRow r = train_.at(order_.at(item / static_cast<size_t>(spec_.num_generations)));
    r.completion.clear();
    return r;
  }

  // Completions for the listed rows with one batched generate() call; each row samples from its own stream,
  // seeded by the step and its place in it, so a row's tokens do not depend on the rows beside it or on the rank.
  void generate(Generator& gen, const std::vector<std::pair<size_t, size_t>>& which, const std::vector<std::vector<size_t>>& micro,
                std::vector<std::vector<DistillRow>>& rows, MethodContext& ctx) {
    if (which.empty()) return;
    GenerationConfig gc;
    gc.max_new_tokens = spec_.max_new_tokens;
    gc.do_sample = true;
    gc.temperature = static_cast<float>(spec_.temperature);
    gc.top_p = static_cast<float>(spec_.top_p);
    gc.top_k = spec_.top_k;
    gc.eos_token_id = eos_ids_;
    gc.pad_token_id = pad_;
    gc.pad_to_multiple_of = multiple_;
    gc.disable_compile = !compiled_;
    std::vector<std::vector<int32_t>> prompts;
    for (const auto& [k, i] : which) {
      prompts.push_back(rows[k][i].prompt);
      const uint64_t slot = static_cast<uint64_t>(micro[k][i]) + 1;
      gc.row_seeds.push_back(SplitMix64((seed_ + 1) * 0xA24BAED4963EE407ull ^ (static_cast<uint64_t>(ctx.global_step) << 20) ^ slot * 0xD6E8FEB86659FD93ull).next());
    }
    const GenerationOutput g = gen.generate(prompts, gc, &tok_);
    for (size_t n = 0; n < which.size(); ++n) {
      std::vector<int32_t> c = g.generated[n];
      const auto at = std::find_if(c.begin(), c.end(), [&](int32_t t) { return std::find(eos_ids_.begin(), eos_ids_.end(), t) != eos_ids_.end(); });
      if (at != c.end()) c.erase(at + 1, c.end());
      if (c.empty()) c.push_back(eos_ids_.front());  // max_new_tokens >= 1 always yields a token
      rows[which[n].first][which[n].second].completion = std::move(c);
    }
  }

  // TRL's completion metrics (the distillation trainer's names) over the generated rows of this rank.
  void completion_metrics(const std::vector<std::vector<DistillRow>>& rows, const std::vector<std::pair<size_t, size_t>>& a,
                          const std::vector<std::pair<size_t, size_t>>& b, MetricWindow& metrics) const {
    double sum = 0, lo = 1e300, hi = 0, truncated = 0, n = 0;
    for (const auto* list : {&a, &b})
      for (const auto& [k, i] : *list) {
        const std::vector<int32_t>& c = rows[k][i].completion;
        const double len = static_cast<double>(c.size());
        sum += len, lo = std::min(lo, len), hi = std::max(hi, len), n += 1;
        truncated += std::find(eos_ids_.begin(), eos_ids_.end(), c.back()) == eos_ids_.end() ? 1 : 0;
      }
    metrics.add("completions/mean_length", sum / n);
    metrics.add("completions/max_length", hi);
    metrics.add("completions/min_length", lo);
    metrics.add("completions/truncated_fraction", truncated / n);
  }

  DistillSpec spec_;
  std::vector<DistillRow> train_, eval_;
  const Tokenizer& tok_;
  int64_t multiple_ = 0;
  int32_t pad_ = 0;
  std::vector<int32_t> eos_ids_;
  uint64_t seed_ = 42;
  bool compiled_ = true, gradient_checkpointing_ = false;
  int64_t longest_prompt_ = 1, longest_completion_ = 1;
  TeacherShape teacher_shape_;
  std::unique_ptr<FrozenModel> teacher_;
  std::unique_ptr<CausalLM> policy_;
  std::unique_ptr<Generator> student_gen_, teacher_gen_;
  std::vector<size_t> order_;
  int64_t order_epoch_ = -1;
};

// ---- data ----

// A pre-tokenized row {"input_ids": [...], "completion_mask": [0, ..., 0, 1, ..., 1]}.
DistillRow pretokenized_row(const ojson& row, const std::string& where, int64_t vocab_size) {
  DistillRow r;
  r.where = where;
  try {
    const std::vector<int32_t> ids = row.at("input_ids").get<std::vector<int32_t>>();
    const std::vector<int32_t> mask = row.at("completion_mask").get<std::vector<int32_t>>();
    if (mask.size() != ids.size()) fail("completion_mask has {} entries for {} input_ids", mask.size(), ids.size());
    check_token_ids(ids, vocab_size, where, "input_ids");
    const size_t first = static_cast<size_t>(std::find(mask.begin(), mask.end(), 1) - mask.begin());
    if (first == 0 || first == ids.size()) fail("completion_mask must mark a non-empty completion after a non-empty prompt");
    for (size_t t = first; t < mask.size(); ++t)
      if (mask[t] != 1) fail("completion_mask must be 0 on the prompt, then 1 to the end");
    r.prompt.assign(ids.begin(), ids.begin() + static_cast<int64_t>(first));
    r.completion.assign(ids.begin() + static_cast<int64_t>(first), ids.end());
  } catch (const nlohmann::json::exception&) {
    fail("GKD: {}: input_ids and completion_mask must be lists of whole numbers", where);
  } catch (const Error& e) {
    fail("GKD: {}: {}", where, e.what());
  }
  return r;
}

// GKD's rows: SFT's tokenization of prompt-completion data (a conversation's last turn, the assistant's, is its
// completion), then TRL's collator's truncation: a row longer than max_length keeps its last max_length tokens.
std::vector<DistillRow> gkd_rows(const Dataset& data, const Tokenizer& tok, const GKDConfig& c, const char* split, int64_t vocab_size) {
  Dataset converted;
  std::vector<DistillRow> tokenized;  // rows given as token ids
  for (size_t i = 0; i < data.size(); ++i) {
    const ojson row = data.row(i);
    const std::string where = data.location(i);
    if (!row.is_object()) fail("GKD: {}: a row must be a JSON object, got {}", where, row.dump().substr(0, 200));
    if (row.contains("input_ids")) {  // pre-tokenized, as TRL's collator accepts: the completion where completion_mask is 1
      tokenized.push_back(pretokenized_row(row, where, vocab_size));
      continue;
    }
    ojson r = row;
    if (row.contains("messages") && !row.contains("prompt")) {
      const ojson& m = row["messages"];
      if (!m.is_array() || m.size() < 2 || !m.back().is_object() || m.back().value("role", "") != "assistant")
        fail("GKD: {}: \"messages\" must be a conversation of at least two turns whose last turn is the assistant's (the completion)", where);
      r = ojson::object();
      r["prompt"] = ojson(std::vector<ojson>(m.begin(), m.end() - 1));
      r["completion"] = ojson::array({m.back()});
      for (const auto& [k, v] : row.items())
        if (k != "messages") r[k] = v;
    } else if (!row.contains("prompt") || !row.contains("completion")) {
      fail("GKD: {}: a row needs \"messages\" (a conversation) or \"prompt\" and \"completion\"; it has {}", where, row.dump().substr(0, 200));
    }
    converted.rows.push_back(std::move(r));
    converted.where.push_back(where);
  }
  SFTDataOptions o;
  o.max_length = 0;  // truncated below, from the left
  o.completion_only_loss = true;
  o.eos_token = c.eos_token;
  o.truncate = false;
  o.vocab_size = vocab_size;
  std::vector<SFTExample> ex = converted.rows.empty() ? std::vector<SFTExample>{} : prepare_sft_dataset(converted, tok, o);
  for (DistillRow& r : tokenized) {
    SFTExample e;
    e.input_ids = r.prompt;
    e.input_ids.insert(e.input_ids.end(), r.completion.begin(), r.completion.end());
    e.labels_mask.assign(e.input_ids.size(), 0);
    std::fill(e.labels_mask.begin() + static_cast<int64_t>(r.prompt.size()), e.labels_mask.end(), 1);
    e.where = r.where;
    ex.push_back(std::move(e));
  }
  if (ex.empty()) fail("GKD: the {} dataset has no rows", split);
  std::vector<DistillRow> out;
  for (const SFTExample& e : ex) {
    const size_t first = static_cast<size_t>(std::find(e.labels_mask.begin(), e.labels_mask.end(), 1) - e.labels_mask.begin());
    std::vector<int32_t> ids = e.input_ids;
    size_t prompt_len = first;
    if (c.max_length > 0 && static_cast<int64_t>(ids.size()) > c.max_length) {
      const size_t cut = ids.size() - static_cast<size_t>(c.max_length);
      ids.erase(ids.begin(), ids.begin() + static_cast<int64_t>(cut));
      prompt_len = prompt_len > cut ? prompt_len - cut : 0;
    }
    if (prompt_len == 0)
      fail("GKD: {}: no prompt token is left after truncation to max_length {} (the completion alone fills it), so there is nothing to "
           "generate from; increase max_length",
           e.where, c.max_length);
    DistillRow r;
    r.prompt.assign(ids.begin(), ids.begin() + static_cast<int64_t>(prompt_len));
    r.completion.assign(ids.begin() + static_cast<int64_t>(prompt_len), ids.end());
    r.where = e.where;
    out.push_back(std::move(r));
  }
  return out;
}

// The distillation trainer's prompts (GRPO's format: text, or a conversation with the generation prompt).
std::vector<DistillRow> prompt_rows(const Dataset& data, const Tokenizer& tok, const DistillationConfig& c) {
  ChatTemplateOptions co;
  co.add_generation_prompt = true;
  co.extra = c.chat_template_kwargs;
  std::vector<DistillRow> out;
  for (size_t i = 0; i < data.size(); ++i) {
    const ojson row = data.row(i);
    const std::string where = data.location(i);
    if (!row.is_object() || !row.contains("prompt")) fail("Distillation: {}: a row needs a \"prompt\" (text, or a list of messages)", where);
    const ojson& p = row["prompt"];
    DistillRow r;
    r.where = where;
    if (p.is_string()) {
      r.prompt = tok.encode(p.get<std::string>(), /*add_special_tokens=*/false);
    } else if (p.is_array()) {
      try {
        r.prompt = apply_chat_template_ids(tok, p, co).input_ids;
      } catch (const Error& e) {
        fail("Distillation: {}: the prompt's conversation cannot be rendered: {}", where, e.what());
      }
    } else {
      fail("Distillation: {}: \"prompt\" must be text or a list of messages, got {}", where, p.dump().substr(0, 200));
    }
    if (r.prompt.empty()) fail("Distillation: {}: the prompt is empty", where);
    out.push_back(std::move(r));
  }
  if (out.empty()) fail("Distillation: the training dataset has no rows");
  return out;
}

void check_unit(const char* config, const char* name, double v) {
  if (!(v >= 0 && v <= 1)) fail("{}: {} must be in [0, 1], got {}", config, name, v);
}

}  // namespace

void check_gkd_config(const GKDConfig& c) {
  check_sft_config(c);
  check_unit("GKDConfig", "lmbda", c.lmbda);
  check_unit("GKDConfig", "beta", c.beta);
  if (!(c.temperature > 0) || !std::isfinite(c.temperature)) fail("GKDConfig: temperature must be a finite number > 0, got {}", c.temperature);
  if (c.max_new_tokens < 1) fail("GKDConfig: max_new_tokens must be >= 1, got {}", c.max_new_tokens);
  if (c.packing || c.padding_free) fail("GKDConfig: packing and padding_free are not supported by GKD (each row is a prompt and its completion)");
  if (c.distributed.model_parallel_size() > 1)
    fail("GKDConfig: tensor or expert parallel (tp_size {}, ep_size {}) is not supported; use data parallel or FSDP", c.distributed.tp_size,
         c.distributed.ep_size);
}

void check_distillation_config(const DistillationConfig& c) {
  check_training_arguments(c, "DistillationConfig");
  check_unit("DistillationConfig", "beta", c.beta);
  if (!(c.temperature > 0) || !std::isfinite(c.temperature)) fail("DistillationConfig: temperature must be a finite number > 0, got {}", c.temperature);
  if (!(c.top_p > 0 && c.top_p <= 1)) fail("DistillationConfig: top_p must be in (0, 1], got {}", c.top_p);
  if (c.top_k < 0) fail("DistillationConfig: top_k must be >= 0, got {}", c.top_k);
  if (c.max_completion_length < 1) fail("DistillationConfig: max_completion_length must be >= 1, got {}", c.max_completion_length);
  if (c.num_generations < 1) fail("DistillationConfig: num_generations must be at least 1, got {}", c.num_generations);
  const int64_t local = c.per_device_train_batch_size * c.gradient_accumulation_steps;
  if (!c.generation_batch_size && local % c.num_generations != 0)
    fail("DistillationConfig: per_device_train_batch_size * gradient_accumulation_steps ({} * {} = {}) must be a multiple of num_generations ({}): "
         "each prompt's {} completions are trained together; change one of them",
         c.per_device_train_batch_size, c.gradient_accumulation_steps, local, c.num_generations, c.num_generations);
  const int64_t gbs = c.generation_batch_size.value_or(local / c.num_generations);
  if (gbs < 1) fail("DistillationConfig: generation_batch_size must be at least 1, got {}", gbs);
  if (gbs * c.num_generations != local)
    fail("DistillationConfig: generation_batch_size * num_generations must equal per_device_train_batch_size * gradient_accumulation_steps; "
         "got {} * {} != {} * {}",
         gbs, c.num_generations, c.per_device_train_batch_size, c.gradient_accumulation_steps);
  if (c.eval_strategy != "no") fail("DistillationConfig: eval_strategy must be no: evaluation with generation is not implemented");
  if (c.distributed.model_parallel_size() > 1)
    fail("DistillationConfig: tensor or expert parallel (tp_size {}, ep_size {}) is not supported; use data parallel or FSDP",
         c.distributed.tp_size, c.distributed.ep_size);
}

GKDTrainer::GKDTrainer(const CausalLM& model, const CausalLM& teacher, const Tokenizer& tok, Dataset train, GKDConfig c, std::optional<Dataset> eval) {
  check_gkd_config(c);
  if (c.dataset_name.empty()) c.dataset_name = dataset_source_file(train);
  trainer_ = std::make_unique<Trainer>(model, c, "GKDConfig");
  DistillSpec s;
  s.name = "GKD";
  s.beta = c.beta;
  s.loss_temperature = 1.0;  // TRL's GKD: the temperature is the sampling one only
  s.temperature = c.temperature, s.top_p = 1.0, s.top_k = 0, s.max_new_tokens = c.max_new_tokens;
  s.lmbda = c.lmbda, s.seq_kd = c.seq_kd;
  s.dropout = !c.disable_dropout;
  const int64_t vocab = model.config().vocab_size;
  std::vector<DistillRow> rows = gkd_rows(train, tok, c, "train", vocab), eval_rows;
  if (eval) eval_rows = gkd_rows(*eval, tok, c, "eval", vocab);
  const int64_t multiple = parse_pad_to_multiple_of(c.pad_to_multiple_of, trainer_->auto_pad_multiple());
  auto m = std::make_unique<DistillMethod>(std::move(s), std::move(rows), std::move(eval_rows), tok, teacher, *trainer_, multiple);
  m->set_gradient_checkpointing(c.gradient_checkpointing);
  m->set_seed(c.seed, c.torch_compile);
  trainer_->set_method(std::move(m));
}

GKDTrainer::~GKDTrainer() = default;

DistillationTrainer::DistillationTrainer(const CausalLM& model, const CausalLM& teacher, const Tokenizer& tok, Dataset train, DistillationConfig c) {
  check_distillation_config(c);
  if (c.dataset_name.empty()) c.dataset_name = dataset_source_file(train);
  trainer_ = std::make_unique<Trainer>(model, c, "DistillationConfig");
  DistillSpec s;
  s.name = "Distillation";
  s.beta = c.beta;
  s.loss_temperature = c.temperature;
  s.temperature = c.temperature, s.top_p = c.top_p, s.top_k = c.top_k, s.max_new_tokens = c.max_completion_length;
  s.on_policy_always = true;
  s.num_generations = c.num_generations;
  s.shuffle_prompts = c.shuffle_dataset;
  s.dropout = !c.disable_dropout;
  const int64_t multiple = parse_pad_to_multiple_of(c.pad_to_multiple_of, trainer_->auto_pad_multiple());
  auto m = std::make_unique<DistillMethod>(std::move(s), prompt_rows(train, tok, c), std::vector<DistillRow>{}, tok, teacher, *trainer_, multiple);
  m->set_gradient_checkpointing(c.gradient_checkpointing);
  m->set_seed(c.seed, c.torch_compile);
  trainer_->set_method(std::move(m));
}

DistillationTrainer::~DistillationTrainer() = default;

}  // namespace trl

// SFT on the Trainer: TRL's SFT data (language modelling, prompt-completion, conversations) tokenized once, then
// per micro-batch collated as padded rows, one padding-free row, or best-fit-decreasing packed rows; the loss is the
// token mean over the whole accumulated batch (Σ token NLL / num_items_in_batch, as Transformers does for models
// that accept num_items_in_batch). Metrics per micro-batch: entropy over the real tokens, mean_token_accuracy over
// the tokens in the loss.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "train/trainer.h"
#include "trl/core/error.h"
#include "trl/runtime/shapes.h"
#include "trl/train/objectives.h"
#include "trl/train/sft_trainer.h"

namespace trl {

namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// TRL's per-batch metrics from the per-token outputs: entropy averaged over the real tokens (attention_mask != 0),
// accuracy (label = argmax) over the tokens in the loss (weight != 0). Summed per row where the per-token values are
// (Backend::span_sums, one span per row: [rows] sums come down); the counts are the host's.
struct TokenMetrics {
  double entropy = 0, accuracy = 0;
};
TokenMetrics token_metrics(const MethodContext& ctx, const SFTBatch& b, const Tensor& entropy, const Tensor& match) {
  const int64_t R = b.input_ids.size(0), T = b.input_ids.size(1);
  Tensor real = Tensor::zeros(DType::F32, {R, T}), in_loss = Tensor::zeros(DType::F32, {R, T});
  const int32_t* mask = b.attention_mask.data_as<int32_t>();
  const float* w = b.weights.data_as<float>();
  float* real_at = real.mutable_data_as<float>();
  float* loss_at = in_loss.mutable_data_as<float>();
  int64_t en = 0, mn = 0;
  for (int64_t i = 0; i < R * T; ++i) {
    if (mask[i] != 0) real_at[i] = 1.0f, ++en;
    if (w[i] != 0) loss_at[i] = 1.0f, ++mn;
  }
  std::vector<Backend::Span> rows;
  for (int64_t r = 0; r < R; ++r) rows.push_back({r, 0, T});
  double es = 0, ms = 0;
  const Tensor real_up = ctx.to_backend(real, "entropy_weights"), loss_up = ctx.to_backend(in_loss, "accuracy_weights");
  for (double x : ctx.backend.span_sums(entropy, &real_up, nullptr, rows)) es += x;
  for (double x : ctx.backend.span_sums(match, &loss_up, nullptr, rows)) ms += x;
  return {en ? es / static_cast<double>(en) : 0.0, mn ? ms / static_cast<double>(mn) : 0.0};
}

class SftMethod final : public TrainingMethod {
 public:
  SftMethod(const SFTConfig& c, const Tokenizer& tok, const Dataset& train, const std::optional<Dataset>& eval, int64_t auto_multiple, int64_t vocab_size)
      : cfg_(c) {
    multiple_ = parse_pad_to_multiple_of(c.pad_to_multiple_of, auto_multiple);
    const auto pad = tok.pad_token_id();
    if (!pad) fail("SFT: the tokenizer has neither a pad_token nor an eos_token");
    pad_ = *pad;
    SFTDataOptions o;
    o.max_length = c.max_length;
    o.completion_only_loss = c.completion_only_loss;
    o.assistant_only_loss = c.assistant_only_loss;
    o.dataset_text_field = c.dataset_text_field;
    o.eos_token = c.eos_token;
    o.vocab_size = vocab_size;
    int64_t dropped = 0;
    train_ = prepare_sft_dataset(train, tok, o, &dropped);
    if (dropped > 0) std::fprintf(stderr, "[trl] dropped %lld training rows whose labels are all masked\n", static_cast<long long>(dropped));
    if (eval) eval_ = prepare_sft_dataset(*eval, tok, o);
    if (c.packing) {
      std::vector<int64_t> lengths;
      for (const auto& e : train_) lengths.push_back(static_cast<int64_t>(e.input_ids.size()));
      items_ = pack_best_fit_decreasing(lengths, c.max_length);
    } else {
      for (size_t i = 0; i < train_.size(); ++i) items_.push_back({i});
    }
  }

  const char* name() const override { return "SFT"; }
  size_t num_items() const override { return items_.size(); }
  // Each program holds its plan, kernels and oneDNN primitives (megabytes): a bucketed run keeps all of its (at most
  // max_length / multiple + 2, eval included); an unbucketed one the 64 most recently used.
  size_t programs_to_keep() const override {
    return multiple_ > 0 ? 2 * static_cast<size_t>(cfg_.max_length / multiple_ + 2) : 64;
  }
  bool has_eval() const override { return !eval_.empty(); }

  // per_device_train_batch_size rows of the longest length collation can give (packed rows: the bucket of
  // max_length; padding-free: one row of the batch's longest examples together).
  std::optional<graph::Graph> largest_program(const CausalLM& model, int64_t batch) const override {
    int64_t longest = 0;
    std::vector<int64_t> lengths;
    for (const SFTExample& e : train_) lengths.push_back(static_cast<int64_t>(e.input_ids.size())), longest = std::max(longest, lengths.back());
    int64_t B = batch, T = 0;
    if (cfg_.packing) {
      T = padded_length(cfg_.max_length, multiple_);
    } else if (cfg_.padding_free) {
      std::sort(lengths.rbegin(), lengths.rend());
      int64_t total = 0;
      for (size_t i = 0; i < lengths.size() && i < static_cast<size_t>(B); ++i) total += lengths[i];
      B = 1, T = padded_length(total, multiple_);
    } else {
      T = multiple_ > 0 ? (longest + multiple_ - 1) / multiple_ * multiple_ : longest;
      T = std::max(longest, std::min(T, cfg_.max_length));
    }
    B = std::min<int64_t>(B, static_cast<int64_t>(items_.size()));
    return training_graph(model, {.batch = B, .tokens = T, .gradient_checkpointing = cfg_.gradient_checkpointing, .metrics = true,
                                  .aux_loss = aux_coef(model) != 0});
  }

  MethodStep step(const std::vector<std::vector<size_t>>& micro, MethodContext& ctx, MetricWindow& metrics, const GradientSink& add) override {
    const auto t0 = Clock::now();
    // Collated first: num_items_in_batch counts the labels of all micro-batches.
    std::vector<SFTBatch> batches;
    int64_t items = 0;
    for (const auto& chosen : micro) {
      if (chosen.empty()) continue;  // data parallel: this rank has no rows of the epoch's last micro-batch
      batches.push_back(collate_train(chosen));
      items += batches.back().num_items;
    }
    items = ctx.dp.sum(items);  // num_items_in_batch counts every rank's labels
    MethodStep out;
    out.data_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const float scale = -1.0f / static_cast<float>(std::max<int64_t>(1, items));
    // A mixture of experts' load-balancing loss: coef · aux of each micro-batch, divided by the accumulation steps
    // (TRL's SFTTrainer); logged unweighted as aux_loss.
    const double coef = aux_coef(ctx.model);
    const float aux_weight = static_cast<float>(coef / static_cast<double>(std::max<size_t>(1, micro.size())));
    for (const SFTBatch& b : batches) {
      const int64_t B = b.input_ids.size(0), T = b.input_ids.size(1);
      const graph::Graph graph = training_graph(
          ctx.model, {.batch = B, .tokens = T, .gradient_checkpointing = cfg_.gradient_checkpointing, .metrics = true, .aux_loss = coef != 0});
      const std::map<std::string, size_t> at = graph.output_indices();
      TensorMap in = inputs(ctx, b, scale);
      if (coef != 0) in["aux_loss_weight"] = ctx.to_backend(Tensor::from_f32(std::vector<float>{aux_weight}, {}), "aux_loss_weight");
      const auto result = ctx.programs.get(graph).run(in);
      out.loss += ctx.to_host(result[at.at("loss")]).data_as<float>()[0];
      if (coef != 0) metrics.add("aux_loss", ctx.to_host(result[at.at("aux_loss")]).data_as<float>()[0]);
      const TokenMetrics m = token_metrics(ctx, b, result[at.at("entropy")], result[at.at("token_accuracy")]);
      metrics.add("entropy", m.entropy);
      metrics.add("mean_token_accuracy", m.accuracy);
      std::map<std::string, Tensor> grads;
      for (const auto& [n, i] : at)
        if (n.rfind("grad.", 0) == 0) grads[n] = result[i];
      add(grads);
      out.tokens += b.num_tokens;
    }
    return out;
  }

  ojson evaluate(MethodContext& ctx) override {
    if (eval_.empty()) fail("evaluate: no eval dataset");
    double nll = 0, entropy = 0, accuracy = 0;
    int64_t items = 0, batches = 0;
    const size_t bsz = static_cast<size_t>(cfg_.per_device_eval_batch_size);
    for (size_t i = 0; i < eval_.size(); i += bsz) {
      std::vector<const SFTExample*> ex;
      for (size_t k = i; k < std::min(eval_.size(), i + bsz); ++k) ex.push_back(&eval_[k]);
      const SFTBatch b = collate_padded(ex, pad_, multiple_, cfg_.max_length);
      const int64_t B = b.input_ids.size(0), T = b.input_ids.size(1);
      graph::Builder g;
      graph::ValueId head = graph::kNone;
      const graph::ValueId h = ctx.model.build_hidden(g, B, T, &head);  // sets head
      const CausalLM::VocabHead v = ctx.model.vocab_head(g, h, head);
      const graph::ValueId labels = g.input("labels", {B, T}, DType::I32);
      const graph::ValueId logp = g.token_logprobs(v.h, v.w, labels, "token_logprobs", v.split);
      g.output(g.weighted_sum(logp, g.input("loss_weights", {B, T}, DType::F32), "loss"), "loss");
      g.output(g.entropy(v.h, v.w, "entropy", v.split), "entropy");
      g.output(g.token_argmax_match(v.h, v.w, labels, "token_accuracy", v.split), "token_accuracy");
      const graph::Graph graph = g.finish();
      const auto out = ctx.programs.get(graph).run(inputs(ctx, b, -1.0f));
      nll += ctx.to_host(out[graph.output_index("loss")]).data_as<float>()[0];
      const TokenMetrics m = token_metrics(ctx, b, out[graph.output_index("entropy")], out[graph.output_index("token_accuracy")]);
      entropy += m.entropy, accuracy += m.accuracy;
      items += b.num_items;
      ++batches;
    }
    return ojson{{"eval_loss", nll / static_cast<double>(std::max<int64_t>(1, items))},
                 {"eval_entropy", entropy / static_cast<double>(batches)},
                 {"eval_mean_token_accuracy", accuracy / static_cast<double>(batches)}};
  }

 private:
  SFTBatch collate_train(const std::vector<size_t>& chosen) const {
    if (cfg_.packing) {
      std::vector<std::vector<const SFTExample*>> rows;
      for (size_t i : chosen) {
        rows.emplace_back();
        for (size_t e : items_[i]) rows.back().push_back(&train_[e]);
      }
      return collate_packed(rows, pad_, padded_length(cfg_.max_length, multiple_));
    }
    std::vector<const SFTExample*> ex;
    for (size_t i : chosen)
      for (size_t e : items_[i]) ex.push_back(&train_[e]);
    if (cfg_.padding_free) {
      // The whole micro-batch as one row of segments (positions restart per example), padded to the bucket.
      int64_t total = 0;
      for (const SFTExample* e : ex) total += static_cast<int64_t>(e->input_ids.size());
      return collate_packed({ex}, pad_, padded_length(total, multiple_));
    }
    return collate_padded(ex, pad_, multiple_, cfg_.max_length);
  }
  // The compute weights and the batch (uploaded where the backend has memory of its own).
  static TensorMap inputs(const MethodContext& ctx, const SFTBatch& b, float scale) {
    TensorMap in = ctx.weights;
    Tensor w = b.weights.clone();
    for (int64_t i = 0; i < w.numel(); ++i) w.mutable_data_as<float>()[i] *= scale;
    for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"input_ids", b.input_ids}, {"attention_mask", b.attention_mask},
                                  {"position_ids", b.position_ids}, {"labels", b.labels}, {"loss_weights", w}})
      in[name] = ctx.to_backend(t, name);
    return in;
  }

  double aux_coef(const CausalLM& model) const { return aux_loss_coef(model, cfg_.router_aux_loss_coef); }

  SFTConfig cfg_;
  int64_t multiple_ = 0;
  int32_t pad_ = 0;
  std::vector<SFTExample> train_, eval_;
  std::vector<std::vector<size_t>> items_;  // a training item: one example, or a packed row of several
};

}  // namespace

void check_sft_config(const SFTConfig& c, const Tokenizer* tok) {
  check_training_arguments(c, "SFTConfig");
  check_router_aux_loss_coef(c.router_aux_loss_coef, "SFTConfig");
  if (c.max_length < 2) fail("SFTConfig: max_length must be >= 2, got {}", c.max_length);
  // packing with padding_free is accepted, as in TRL (its bfd packing is padding-free): packed rows are already
  // padding-free, so packing decides the layout.
  // TRL raises when eos_token is not in the vocabulary: the string appended to every text must be one token.
  if (tok && !c.eos_token.empty()) {
    const std::vector<int32_t> ids = tok->encode(c.eos_token, false);
    if (ids.size() != 1)
      fail("SFTConfig: eos_token '{}' is not a single token of the tokenizer (it encodes to {} tokens); give one of its tokens, such as its "
           "eos_token '{}', or leave eos_token unset",
           c.eos_token, ids.size(), tok->eos_token());
  }
}

SFTTrainer::SFTTrainer(const CausalLM& model, const Tokenizer& tok, Dataset train, SFTConfig config, std::optional<Dataset> eval) {
  check_sft_config(config, &tok);
  if (config.dataset_name.empty()) config.dataset_name = dataset_source_file(train);
  trainer_ = std::make_unique<Trainer>(model, config, "SFTConfig");
  trainer_->set_method(std::make_unique<SftMethod>(config, tok, train, eval, trainer_->auto_pad_multiple(), trainer_->model().config().vocab_size));
}

SFTTrainer::~SFTTrainer() = default;

double SFTTrainer::evaluate() { return evaluate_metrics().at("eval_loss").get<double>(); }

}  // namespace trl

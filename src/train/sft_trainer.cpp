#include "train/sft_trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "models/init.h"
#include "runtime/shapes.h"
#include "train/optim/adamw.h"

namespace trl {

namespace {

namespace stdfs = std::filesystem;
using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted = true; }

void check_config(const SFTConfig& c) {
  auto bad = [](const char* name, const std::string& why) { fail("SFTConfig: {} {}", name, why); };
  if (!(c.learning_rate >= 0)) bad("learning_rate", "must be >= 0");
  if (c.per_device_train_batch_size < 1) bad("per_device_train_batch_size", "must be >= 1");
  if (c.per_device_eval_batch_size < 1) bad("per_device_eval_batch_size", "must be >= 1");
  if (c.gradient_accumulation_steps < 1) bad("gradient_accumulation_steps", "must be >= 1");
  if (c.max_steps <= 0 && !(c.num_train_epochs > 0)) bad("num_train_epochs", "must be > 0 when max_steps is not set");
  if (c.lr_scheduler_type != "linear" && c.lr_scheduler_type != "cosine" && c.lr_scheduler_type != "constant" &&
      c.lr_scheduler_type != "constant_with_warmup")
    bad("lr_scheduler_type", fmt::format("'{}' is not linear, cosine, constant or constant_with_warmup", c.lr_scheduler_type));
  if (!(c.warmup_ratio >= 0 && c.warmup_ratio <= 1)) bad("warmup_ratio", "must be in [0, 1]");
  if (c.warmup_steps < 0) bad("warmup_steps", "must be >= 0");
  if (c.logging_steps < 1) bad("logging_steps", "must be >= 1");
  if (c.save_steps < 1) bad("save_steps", "must be >= 1");
  if (c.save_total_limit && *c.save_total_limit < 1) bad("save_total_limit", "must be >= 1");
  if (c.eval_strategy != "no" && c.eval_strategy != "steps" && c.eval_strategy != "epoch")
    bad("eval_strategy", fmt::format("'{}' is not no, steps or epoch", c.eval_strategy));
  if (c.max_length < 2) bad("max_length", "must be >= 2");
  if (c.packing && c.padding_free) bad("packing", "and padding_free: packing already gives one fixed-length shape; choose one");
}

// "checkpoint-<digits>" (not the ".tmp" folder of a save in progress).
bool is_checkpoint_name(const std::string& n) {
  if (n.rfind("checkpoint-", 0) != 0 || n.size() == 11) return false;
  for (size_t i = 11; i < n.size(); ++i)
    if (n[i] < '0' || n[i] > '9') return false;
  return true;
}

std::string fmt_duration(double s) {
  const int64_t t = static_cast<int64_t>(s);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60) : fmt::format("{:02}:{:02}", t / 60, t % 60);
}

// A self-contained HTML page with the loss and learning-rate curves (inline SVG).
std::string report_html(const std::vector<ojson>& log, const std::string& title) {
  auto series = [&](const char* key) {
    std::vector<std::pair<double, double>> out;
    for (const auto& e : log)
      if (e.contains(key) && e.contains("step")) out.emplace_back(e["step"].get<double>(), e[key].get<double>());
    return out;
  };
  auto chart = [&](const std::string& name, const std::vector<std::pair<std::vector<std::pair<double, double>>, std::string>>& lines) {
    double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
    for (const auto& [pts, color] : lines)
      for (auto [x, y] : pts) x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    if (x0 > x1) return fmt::format("<h2>{}</h2><p>no data</p>", name);
    if (x1 == x0) x1 = x0 + 1;
    if (y1 == y0) y1 = y0 + 1, y0 -= 1;
    const double W = 640, H = 260, L = 60, B = 30;
    std::string svg = fmt::format("<h2>{}</h2><svg width=\"{}\" height=\"{}\" xmlns=\"http://www.w3.org/2000/svg\">", name, W + L + 10, H + B + 10);
    svg += fmt::format("<rect x=\"{}\" y=\"5\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>", L, W, H);
    for (int k = 0; k <= 4; ++k) {
      const double y = y0 + (y1 - y0) * k / 4, py = 5 + H - H * k / 4;
      svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">{:.4g}</text>", L - 4, py + 4, y);
      const double x = x0 + (x1 - x0) * k / 4;
      svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{:.0f}</text>", L + W * k / 4, H + 22, x);
    }
    for (const auto& [pts, color] : lines) {
      std::string path;
      for (auto [x, y] : pts) path += fmt::format("{:.1f},{:.1f} ", L + (x - x0) / (x1 - x0) * W, 5 + H - (y - y0) / (y1 - y0) * H);
      svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>", color, path);
    }
    return svg + "</svg>";
  };
  std::string html = "<!doctype html><html><head><meta charset=\"utf-8\"><title>" + title +
                     "</title><style>body{font-family:sans-serif;margin:2em}</style></head><body><h1>" + title + "</h1>";
  html += "<p>step on the x axis; blue: training loss, orange: evaluation loss</p>";
  html += chart("loss", {{series("loss"), "#1f77b4"}, {series("eval_loss"), "#ff7f0e"}});
  html += chart("learning rate", {{series("learning_rate"), "#2ca02c"}});
  html += chart("gradient norm (before clipping)", {{series("grad_norm"), "#d62728"}});
  html += chart("mean token accuracy (label = argmax)", {{series("mean_token_accuracy"), "#1f77b4"}, {series("eval_mean_token_accuracy"), "#ff7f0e"}});
  return html + "</body></html>\n";
}


// TRL's per-batch metrics from the per-token outputs: entropy averaged over the real tokens (attention_mask != 0),
// accuracy (label = argmax) over the tokens in the loss (weight != 0).
struct TokenMetrics {
  double entropy = 0, accuracy = 0;
};
TokenMetrics token_metrics(const SFTBatch& b, const Tensor& entropy, const Tensor& match) {
  const int32_t* mask = b.attention_mask.data_as<int32_t>();
  const float* w = b.weights.data_as<float>();
  const float* e = entropy.data_as<float>();
  const float* m = match.data_as<float>();
  double es = 0, ms = 0;
  int64_t en = 0, mn = 0;
  for (int64_t i = 0; i < b.attention_mask.numel(); ++i) {
    if (mask[i] != 0) es += e[i], ++en;
    if (w[i] != 0) ms += m[i], ++mn;
  }
  return {en ? es / static_cast<double>(en) : 0.0, mn ? ms / static_cast<double>(mn) : 0.0};
}

}  // namespace

double scheduled_lr(const std::string& type, double base, int64_t step, int64_t total, int64_t warmup) {
  if (warmup > 0 && step < warmup && type != "constant") return base * static_cast<double>(step) / static_cast<double>(warmup);
  if (type == "constant" || type == "constant_with_warmup") return base;
  const double span = static_cast<double>(std::max<int64_t>(1, total - warmup)), done = static_cast<double>(step - warmup);
  if (type == "cosine") return base * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * done / span)));
  return base * std::max(0.0, (static_cast<double>(total) - static_cast<double>(step)) / span);  // linear
}

struct SFTTrainer::State {
  SFTConfig cfg;
  CausalLM model;  // the architecture (weights in the compute dtype; the graph inputs are bound explicitly)
  const Tokenizer& tok;
  DType save_dtype;
  std::string source_dir;  // the model folder: tokenizer and generation files are copied from it
  std::vector<SFTExample> train, eval;
  std::vector<std::vector<size_t>> items;  // a training item: one example, or a packed row of several
  TensorMap master, compute;
  // The step's gradients: the program's own outputs when a step is one micro-batch (views into its arena, used
  // before the next program runs), else sums in `accumulated` (allocated at the first accumulating step).
  TensorMap grads, accumulated;
  AdamW opt;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ProgramCache> programs;
  int64_t multiple = 0;
  int32_t pad = 0;
  int64_t global_step = 0, tokens_seen = 0;
  std::vector<ojson> log_history;

  State(const CausalLM& m, const Tokenizer& t, SFTConfig c)
      : cfg(std::move(c)), model(m), tok(t), save_dtype(m.dtype()), source_dir(m.path()),
        opt(AdamWConfig{cfg.adam_beta1, cfg.adam_beta2, cfg.adam_epsilon, cfg.weight_decay}) {}

  int64_t micro_batches() const {
    const int64_t n = static_cast<int64_t>(items.size()), b = cfg.per_device_train_batch_size;
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
    return cfg.warmup_steps > 0 ? cfg.warmup_steps : static_cast<int64_t>(std::ceil(cfg.warmup_ratio * static_cast<double>(total_steps())));
  }
  // The order of the items in `epoch`: a seeded Fisher-Yates shuffle, the same on every run and on resume.
  std::vector<size_t> order(int64_t epoch) const {
    std::vector<size_t> o(items.size());
    std::iota(o.begin(), o.end(), 0);
    SplitMix64 rng(cfg.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1);
    for (size_t i = o.size(); i > 1; --i) std::swap(o[i - 1], o[rng.next() % i]);
    return o;
  }
  SFTBatch collate(const std::vector<size_t>& chosen, const std::vector<SFTExample>& pool, int64_t max_length) const {
    if (cfg.packing) {
      std::vector<std::vector<const SFTExample*>> rows;
      for (size_t i : chosen) {
        rows.emplace_back();
        for (size_t e : items[i]) rows.back().push_back(&pool[e]);
      }
      return collate_packed(rows, pad, padded_length(max_length, multiple));
    }
    std::vector<const SFTExample*> ex;
    for (size_t i : chosen)
      for (size_t e : (&pool == &train ? items[i] : std::vector<size_t>{i})) ex.push_back(&pool[e]);
    if (cfg.padding_free) {
      // The whole micro-batch as one row of segments (positions restart per example), padded to the bucket.
      int64_t total = 0;
      for (const SFTExample* e : ex) total += static_cast<int64_t>(e->input_ids.size());
      return collate_packed({ex}, pad, padded_length(total, multiple));
    }
    return collate_padded(ex, pad, multiple, max_length);
  }
  TensorMap inputs(const SFTBatch& b, float scale) const {
    TensorMap in = compute;
    Tensor w = b.weights.clone();
    for (int64_t i = 0; i < w.numel(); ++i) w.mutable_data_as<float>()[i] *= scale;
    in["input_ids"] = b.input_ids, in["attention_mask"] = b.attention_mask, in["position_ids"] = b.position_ids;
    in["labels"] = b.labels, in["loss_weights"] = w;
    return in;
  }
};

SFTTrainer::SFTTrainer(const CausalLM& model, const Tokenizer& tok, Dataset train, SFTConfig config, std::optional<Dataset> eval)
    : s_(std::make_unique<State>(model, tok, std::move(config))) {
  State& s = *s_;
  check_config(s.cfg);
  // The trainer consumes each program's outputs before it runs the next, so its programs share one arena (the
  // largest one's): keeping a program per length costs its plan and kernels, not another ~3.6 GB of buffers.
  s.backend = s.cfg.torch_compile ? make_cpu_backend(CpuBackendOptions{.share_arena = true}) : make_reference_backend();
  s.multiple = parse_pad_to_multiple_of(s.cfg.pad_to_multiple_of, s.backend->name());
  // Each program still holds its plan, kernels and oneDNN primitives (megabytes): a bucketed run keeps all of its
  // (at most max_length / multiple + 2, eval included); an unbucketed one the 64 most recently used.
  const size_t buckets = s.multiple > 0 ? static_cast<size_t>(s.cfg.max_length / s.multiple + 2) : 0;
  s.programs = std::make_unique<ProgramCache>(*s.backend, ProgramCacheOptions{s.multiple > 0 ? 2 * buckets : 64, ""});
  const auto pad = tok.pad_token_id();
  if (!pad) fail("SFT: the tokenizer has neither a pad_token nor an eos_token");
  s.pad = *pad;
  SFTDataOptions o;
  o.max_length = s.cfg.max_length;
  o.completion_only_loss = s.cfg.completion_only_loss;
  o.assistant_only_loss = s.cfg.assistant_only_loss;
  o.dataset_text_field = s.cfg.dataset_text_field;
  o.eos_token = s.cfg.eos_token;
  int64_t dropped = 0;
  s.train = prepare_sft_dataset(train, tok, o, &dropped);
  if (dropped > 0) std::fprintf(stderr, "[trl] dropped %lld training rows whose labels are all masked\n", static_cast<long long>(dropped));
  if (eval) s.eval = prepare_sft_dataset(*eval, tok, o);
  if (s.cfg.eval_strategy != "no" && s.eval.empty()) fail("SFTConfig: eval_strategy '{}' needs an eval dataset", s.cfg.eval_strategy);
  if (s.cfg.packing) {
    std::vector<int64_t> lengths;
    for (const auto& e : s.train) lengths.push_back(static_cast<int64_t>(e.input_ids.size()));
    s.items = pack_best_fit_decreasing(lengths, s.cfg.max_length);
  } else {
    for (size_t i = 0; i < s.train.size(); ++i) s.items.push_back({i});
  }
  if (s.micro_batches() == 0) fail("SFT: {} training items and dataloader_drop_last leave no full batch of {}", s.items.size(), s.cfg.per_device_train_batch_size);
  // f32 master weights; bf16 compute copies refreshed by AdamW in the same pass.
  for (const auto& [name, w] : model.weights()) {
    s.master[name] = w.to(DType::F32).clone();
    s.compute[name] = s.cfg.bf16 ? s.master[name].to(DType::BF16).clone() : s.master[name];
  }
  if (s.cfg.bf16 || s.model.dtype() != DType::F32) {
    ModelConfig mc = model.config();
    s.model = CausalLM::from_weights(mc, s.compute, "trainer");
  }
}

SFTTrainer::~SFTTrainer() = default;

const TensorMap& SFTTrainer::master_weights() const { return s_->master; }
const ProgramCacheStats& SFTTrainer::program_stats() const { return s_->programs->stats(); }

void SFTTrainer::save_model(const std::string& dir) const {
  const State& s = *s_;
  TensorMap out;
  for (const auto& [name, w] : s.master) out[name] = s.save_dtype == DType::F32 ? w : w.to(s.save_dtype);
  const CausalLM m = CausalLM::from_weights(s.model.config(), out, "trainer");
  m.save_pretrained(dir);
  // Tokenizer and generation files travel with the weights (copied from the source model folder, else written).
  const std::string& src = s.source_dir;
  bool tokenizer_copied = false;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "generation_config.json",
                        "vocab.json", "merges.txt"}) {
    const stdfs::path from = stdfs::path(src) / f;
    if (!src.empty() && stdfs::is_regular_file(from)) {
      write_text_file_atomic((stdfs::path(dir) / f).string(), read_text_file(from.string()));
      tokenizer_copied = tokenizer_copied || std::string(f) == "tokenizer.json";
    }
  }
  if (!tokenizer_copied) write_tokenizer_files(dir);
}

double SFTTrainer::evaluate() { return evaluate_metrics().at("eval_loss").get<double>(); }

nlohmann::ordered_json SFTTrainer::evaluate_metrics() {
  State& s = *s_;
  if (s.eval.empty()) fail("evaluate: no eval dataset");
  double nll = 0, entropy = 0, accuracy = 0;
  int64_t items = 0, batches = 0;
  for (size_t i = 0; i < s.eval.size(); i += static_cast<size_t>(s.cfg.per_device_eval_batch_size)) {
    std::vector<const SFTExample*> ex;
    for (size_t k = i; k < std::min(s.eval.size(), i + static_cast<size_t>(s.cfg.per_device_eval_batch_size)); ++k) ex.push_back(&s.eval[k]);
    const SFTBatch b = collate_padded(ex, s.pad, s.multiple, s.cfg.max_length);
    const int64_t B = b.input_ids.size(0), T = b.input_ids.size(1);
    graph::Builder g;
    graph::ValueId head = graph::kNone;
    const graph::ValueId h = s.model.build_hidden(g, B, T, &head);
    const graph::ValueId labels = g.input("labels", {B, T}, DType::I32);
    const graph::ValueId logp = g.token_logprobs(h, head, labels, "token_logprobs");
    g.output(g.weighted_sum(logp, g.input("loss_weights", {B, T}, DType::F32), "loss"));
    g.output(g.entropy(h, head, "entropy"));
    g.output(g.token_argmax_match(h, head, labels, "token_accuracy"));
    const auto out = s.programs->get(g.finish()).run(s.inputs(b, -1.0f));
    nll += out[0].data_as<float>()[0];
    const TokenMetrics m = token_metrics(b, out[1], out[2]);
    entropy += m.entropy, accuracy += m.accuracy;
    items += b.num_items;
    ++batches;
  }
  return ojson{{"eval_loss", nll / static_cast<double>(std::max<int64_t>(1, items))},
               {"eval_entropy", entropy / static_cast<double>(batches)},
               {"eval_mean_token_accuracy", accuracy / static_cast<double>(batches)}};
}

TrainOutput SFTTrainer::train() {
  State& s = *s_;
  const SFTConfig& c = s.cfg;
  std::error_code ec;
  stdfs::create_directories(c.output_dir, ec);
  if (ec) fail("output_dir {}: cannot create: {}", c.output_dir, ec.message());
  // Resume: weights, moments, step, log and the position in the data order.
  if (!c.resume_from_checkpoint.empty()) {
    std::string dir = c.resume_from_checkpoint;
    if (dir == "last" || dir == "true" || dir == "True") {
      int64_t best = -1;
      for (const auto& e : stdfs::directory_iterator(c.output_dir)) {
        const std::string n = e.path().filename().string();
        if (e.is_directory() && is_checkpoint_name(n)) {
          const int64_t k = std::atoll(n.c_str() + 11);
          if (k > best) best = k, dir = e.path().string();
        }
      }
      if (best < 0) fail("resume_from_checkpoint: no checkpoint-* folder in {}", c.output_dir);
    }
    const std::string opt_file = (stdfs::path(dir) / "optimizer.safetensors").string(), state_file = (stdfs::path(dir) / "trainer_state.json").string();
    if (!stdfs::is_regular_file(opt_file) || !stdfs::is_regular_file(state_file))
      fail("resume_from_checkpoint {}: not a checkpoint (needs optimizer.safetensors and trainer_state.json)", dir);
    const SafeTensorsFile f = SafeTensorsFile::open(opt_file);
    TensorMap m, v;
    for (auto& [name, w] : s.master) {
      for (const char* part : {"master/", "exp_avg/", "exp_avg_sq/"})
        if (!f.contains(part + name)) fail("resume_from_checkpoint {}: {} has no '{}{}'", dir, opt_file, part, name);
      w.copy_from(f.get("master/" + name));
      m[name] = f.get("exp_avg/" + name).clone();
      v[name] = f.get("exp_avg_sq/" + name).clone();
      if (c.bf16) s.compute[name].copy_from(w.to(DType::BF16));
    }
    const ojson st = ojson::parse(read_text_file(state_file));
    s.global_step = st.at("global_step").get<int64_t>();
    s.opt.set_state(std::move(m), std::move(v), st.at("trl_cpp").at("optimizer_steps").get<int64_t>());
    s.tokens_seen = st.at("trl_cpp").at("num_tokens").get<int64_t>();
    s.log_history.clear();
    for (const auto& e : st.at("log_history")) s.log_history.push_back(e);
    std::fprintf(stderr, "[trl] resumed from %s at step %lld\n", dir.c_str(), static_cast<long long>(s.global_step));
  }
  const int64_t total = s.total_steps(), spe = s.steps_per_epoch(), warm = s.warmup(), ga = c.gradient_accumulation_steps;
  const int64_t bsz = c.per_device_train_batch_size, nmicro = s.micro_batches();
  TrainOutput result;
  g_interrupted = false;
  auto old_handler = std::signal(SIGINT, on_sigint);
  const bool tty = c.progress && isatty(2);
  const auto t_start = Clock::now();
  const int64_t start_step = s.global_step;
  double loss_since_log = 0, last_grad_norm = 0, entropy_since_log = 0, accuracy_since_log = 0;
  int64_t batches_since_log = 0;  // micro-batches: TRL averages its per-batch metrics over the logging window
  int64_t steps_since_log = 0, tokens_at_start = s.tokens_seen;
  auto write_state = [&](const std::string& dir) {
    ojson st;
    st["global_step"] = s.global_step;
    st["epoch"] = static_cast<double>(s.global_step) / static_cast<double>(spe);
    st["max_steps"] = total;
    st["num_train_epochs"] = c.num_train_epochs;
    st["logging_steps"] = c.logging_steps;
    st["save_steps"] = c.save_steps;
    st["train_batch_size"] = bsz;
    st["log_history"] = s.log_history;
    st["trl_cpp"] = ojson{{"optimizer_steps", s.opt.steps()}, {"num_tokens", s.tokens_seen}, {"seed", c.seed}, {"steps_per_epoch", spe}};
    write_text_file_atomic((stdfs::path(dir) / "trainer_state.json").string(), st.dump(2) + "\n");
  };
  auto save_checkpoint_dir = [&] {
    const std::string dir = (stdfs::path(c.output_dir) / fmt::format("checkpoint-{}", s.global_step)).string();
    const std::string tmp = dir + ".tmp";
    stdfs::remove_all(tmp, ec);
    stdfs::create_directories(tmp, ec);
    save_model(tmp);
    TensorMap opt;
    for (const auto& [name, w] : s.master) {
      opt["master/" + name] = w;
      opt["exp_avg/" + name] = s.opt.exp_avg().at(name);
      opt["exp_avg_sq/" + name] = s.opt.exp_avg_sq().at(name);
    }
    save_safetensors((stdfs::path(tmp) / "optimizer.safetensors").string(), opt);
    write_text_file_atomic((stdfs::path(tmp) / "scheduler.json").string(),
                           ojson{{"lr_scheduler_type", c.lr_scheduler_type}, {"base_lr", c.learning_rate}, {"total_steps", total},
                                 {"warmup_steps", warm}, {"last_step", s.global_step}}
                                   .dump(2));
    write_state(tmp);
    stdfs::remove_all(dir, ec);
    stdfs::rename(tmp, dir, ec);
    if (ec) fail("checkpoint {}: cannot rename from {}: {}", dir, tmp, ec.message());
    if (c.save_total_limit) {  // rotation: keep the newest save_total_limit checkpoints
      std::vector<std::pair<int64_t, stdfs::path>> all;
      for (const auto& e : stdfs::directory_iterator(c.output_dir)) {
        const std::string n = e.path().filename().string();
        if (e.is_directory() && is_checkpoint_name(n)) all.emplace_back(std::atoll(n.c_str() + 11), e.path());
      }
      std::sort(all.begin(), all.end());
      for (size_t i = 0; i + static_cast<size_t>(*c.save_total_limit) < all.size(); ++i) stdfs::remove_all(all[i].second, ec);
    }
    return dir;
  };
  auto log_entry = [&](ojson e) {
    e["epoch"] = static_cast<double>(s.global_step) / static_cast<double>(spe);
    e["step"] = s.global_step;
    s.log_history.push_back(e);
    const std::string line = e.dump() + "\n";
    FILE* f = std::fopen((stdfs::path(c.output_dir) / "log.jsonl").string().c_str(), "a");
    if (f) {
      std::fwrite(line.data(), 1, line.size(), f);
      std::fclose(f);
    }
    if (c.progress && !tty) std::fprintf(stderr, "%s", line.c_str());
  };
  std::vector<size_t> order;
  int64_t order_epoch = -1;
  while (s.global_step < total) {
    const int64_t epoch = s.global_step / spe, within = s.global_step % spe;
    if (epoch != order_epoch) order = s.order(epoch), order_epoch = epoch;
    // This step's micro-batches, collated first: num_items_in_batch counts the labels of all of them.
    const auto t_step = Clock::now();
    std::vector<SFTBatch> micro;
    int64_t items = 0;
    for (int64_t k = within * ga; k < std::min(nmicro, (within + 1) * ga); ++k) {
      std::vector<size_t> chosen;
      for (int64_t i = k * bsz; i < std::min<int64_t>(static_cast<int64_t>(order.size()), (k + 1) * bsz); ++i) chosen.push_back(order[static_cast<size_t>(i)]);
      micro.push_back(s.collate(chosen, s.train, c.max_length));
      items += micro.back().num_items;
    }
    const double data_seconds = std::chrono::duration<double>(Clock::now() - t_step).count();
    double step_loss = 0;
    for (size_t k = 0; k < micro.size(); ++k) {
      const SFTBatch& b = micro[k];
      const int64_t B = b.input_ids.size(0), T = b.input_ids.size(1);
      Program& prog = s.programs->get(s.model.training_graph(B, T, DType::F32, c.gradient_checkpointing, true));
      const auto out = prog.run(s.inputs(b, -1.0f / static_cast<float>(std::max<int64_t>(1, items))));
      step_loss += out[0].data_as<float>()[0];
      const auto shapes = parameter_shapes(s.model.config());
      const TokenMetrics m = token_metrics(b, out[shapes.size() + 1], out[shapes.size() + 2]);
      entropy_since_log += m.entropy, accuracy_since_log += m.accuracy, ++batches_since_log;
      for (size_t p = 0; p < shapes.size(); ++p) {
        const std::string& name = shapes[p].first;
        if (micro.size() == 1) {
          s.grads[name] = out[p + 1];
          continue;
        }
        if (!s.accumulated.count(name)) s.accumulated[name] = Tensor::uninitialized(DType::F32, out[p + 1].shape());
        Tensor& acc_t = s.accumulated.at(name);
        float* acc = acc_t.mutable_data_as<float>();
        const float* g = out[p + 1].data_as<float>();
        const int64_t n = out[p + 1].numel();
        if (k == 0) std::memcpy(acc, g, static_cast<size_t>(n) * sizeof(float));
        else {
#pragma omp parallel for schedule(static)
          for (int64_t i = 0; i < n; ++i) acc[i] += g[i];
        }
        s.grads[name] = acc_t;
      }
      s.tokens_seen += b.num_tokens;
    }
    // Global-norm clipping (the logged grad_norm is before clipping, as in Transformers).
    double sq = 0;
    for (const auto& [name, g] : s.grads) {
      const float* x = g.data_as<float>();
      double part = 0;
#pragma omp parallel for reduction(+ : part) schedule(static)
      for (int64_t i = 0; i < g.numel(); ++i) part += static_cast<double>(x[i]) * x[i];
      sq += part;
    }
    const double norm = std::sqrt(sq);
    if (!std::isfinite(norm)) fail("training step {}: the gradient norm is {} (the loss was {})", s.global_step + 1, norm, step_loss);
    if (c.max_grad_norm > 0 && norm > c.max_grad_norm) {
      const float coef = static_cast<float>(c.max_grad_norm / (norm + 1e-6));
      for (auto& [name, g] : s.grads) {
        float* x = g.mutable_data_as<float>();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < g.numel(); ++i) x[i] *= coef;
      }
    }
    const double lr = scheduled_lr(c.lr_scheduler_type, c.learning_rate, s.global_step, total, warm);
    s.opt.step(s.master, s.grads, lr, c.bf16 ? &s.compute : nullptr);
    s.grads.clear();  // views into the program's arena must not keep a replaced arena alive
    ++s.global_step;
    loss_since_log += step_loss;
    ++steps_since_log;
    last_grad_norm = norm;
    const double step_seconds = std::chrono::duration<double>(Clock::now() - t_step).count();
    ojson entry{{"loss", step_loss}, {"grad_norm", norm}, {"learning_rate", lr}, {"num_tokens", s.tokens_seen}, {"step_seconds", step_seconds},
                {"data_seconds", data_seconds}};
    if (on_step) on_step(entry);
    const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
    const double tps = static_cast<double>(s.tokens_seen - tokens_at_start) / std::max(elapsed, 1e-9);
    if (tty) {
      const int64_t done = s.global_step - start_step, left = total - s.global_step;
      const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(left) : 0;
      const int width = 24, fill = static_cast<int>(width * s.global_step / std::max<int64_t>(1, total));
      std::fprintf(stderr, "\r[%s%s] %lld/%lld  loss %.4f  lr %.2e  %.0f tok/s  ETA %s   ", std::string(static_cast<size_t>(fill), '#').c_str(),
                   std::string(static_cast<size_t>(width - fill), '.').c_str(), static_cast<long long>(s.global_step),
                   static_cast<long long>(total), step_loss, lr, tps, fmt_duration(eta).c_str());
      std::fflush(stderr);
    }
    if (s.global_step % c.logging_steps == 0 || s.global_step == total) {
      const double nb = static_cast<double>(std::max<int64_t>(1, batches_since_log));
      log_entry(ojson{{"loss", loss_since_log / static_cast<double>(steps_since_log)},
                      {"grad_norm", last_grad_norm},
                      {"learning_rate", lr},
                      {"entropy", entropy_since_log / nb},
                      {"mean_token_accuracy", accuracy_since_log / nb},
                      {"num_tokens", s.tokens_seen},
                      {"train_tokens_per_s", tps},
                      {"step_seconds", step_seconds},
                      {"data_seconds", data_seconds}});
      loss_since_log = 0, steps_since_log = 0, entropy_since_log = 0, accuracy_since_log = 0, batches_since_log = 0;
    }
    const bool epoch_end = s.global_step % spe == 0;
    if ((c.eval_strategy == "steps" && s.global_step % c.eval_steps.value_or(c.logging_steps) == 0) || (c.eval_strategy == "epoch" && epoch_end))
      log_entry(evaluate_metrics());
    if (s.global_step % c.save_steps == 0 && s.global_step < total) save_checkpoint_dir();
    if (g_interrupted) {
      const std::string dir = save_checkpoint_dir();
      std::fprintf(stderr, "\n[trl] interrupted: saved %s; resume with --resume_from_checkpoint %s\n", dir.c_str(), dir.c_str());
      result.interrupted = true;
      break;
    }
  }
  std::signal(SIGINT, old_handler);
  if (tty) std::fprintf(stderr, "\n");
  if (!result.interrupted) {
    save_model(c.output_dir);
    write_state(c.output_dir);
    if (c.report) write_text_file_atomic((stdfs::path(c.output_dir) / "training_report.html").string(), report_html(s.log_history, "trl.cpp SFT: " + c.output_dir));
  }
  result.global_step = s.global_step;
  double sum = 0;
  int64_t n = 0;
  for (const auto& e : s.log_history)
    if (e.contains("loss")) sum += e["loss"].get<double>(), ++n;
  result.training_loss = n ? sum / static_cast<double>(n) : 0;
  result.log_history = s.log_history;
  result.programs = s.programs->stats();
  return result;
}

}  // namespace trl

#include "trl/train/sft_trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "trl/backend/registry.h"
#include "trl/core/error.h"
#include "core/fs.h"
#include "core/rng.h"
#include "trl/io/safetensors.h"
#include "trl/models/init.h"
#include "trl/runtime/shapes.h"
#include "train/optim/adamw.h"
#include "train/report.h"

namespace trl {

namespace {

namespace stdfs = std::filesystem;
using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted = true; }

// Ctrl-C sets g_interrupted while training; the previous handler comes back however the loop ends.
class SigintScope {
 public:
  SigintScope() : old_(std::signal(SIGINT, on_sigint)) { g_interrupted = false; }
  ~SigintScope() { std::signal(SIGINT, old_); }
  SigintScope(const SigintScope&) = delete;
  SigintScope& operator=(const SigintScope&) = delete;

 private:
  void (*old_)(int);
};

// "checkpoint-<digits>" (not the ".tmp" folder of a save in progress).
bool is_checkpoint_name(const std::string& n) {
  if (n.rfind("checkpoint-", 0) != 0 || n.size() == 11) return false;
  for (size_t i = 11; i < n.size(); ++i)
    if (n[i] < '0' || n[i] > '9') return false;
  return true;
}

// The complete checkpoint-N folders of `dir`, by step.
std::vector<std::pair<int64_t, stdfs::path>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, stdfs::path>> all;
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && is_checkpoint_name(n)) all.emplace_back(std::atoll(n.c_str() + 11), e.path());
  }
  std::sort(all.begin(), all.end());
  return all;
}

std::string jsonl(const std::vector<ojson>& entries) {
  std::string out;
  for (const auto& e : entries) out += e.dump() + "\n";
  return out;
}

// The file the rows came from: "data.jsonl" of "data.jsonl:12" or "data.json[3]"; "" when unknown.
std::string source_file(const Dataset& d) {
  if (d.where.empty()) return "";
  const std::string& w = d.where.front();
  if (const size_t b = w.rfind('['); b != std::string::npos && w.back() == ']') return w.substr(0, b);
  const size_t c = w.rfind(':');
  if (c == std::string::npos || c + 1 == w.size()) return w;
  for (size_t i = c + 1; i < w.size(); ++i)
    if (w[i] < '0' || w[i] > '9') return w;
  return w.substr(0, c);
}

void print_progress(int64_t step, int64_t total, int64_t start_step, double elapsed, double loss, double lr, double tps) {
  const int64_t done = step - start_step, left = total - step;
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(left) : 0;
  const int width = 24, fill = static_cast<int>(width * step / std::max<int64_t>(1, total));
  std::fprintf(stderr, "\r[%s%s] %lld/%lld  loss %.4f  lr %.2e  %.0f tok/s  ETA %s   ", std::string(static_cast<size_t>(fill), '#').c_str(),
               std::string(static_cast<size_t>(width - fill), '.').c_str(), static_cast<long long>(step), static_cast<long long>(total), loss, lr,
               tps, fmt_duration(eta).c_str());
  std::fflush(stderr);
}

using FolderWriter = std::function<void(const std::string& dir)>;
using Advice = std::function<std::string(bool disk_full)>;

// Runs `write(tmp)` into a fresh folder `tmp`. If anything fails, removes `tmp` and throws
// "saving <what> failed: <error> — removed the partial folder <tmp>; <advice>".
void write_folder_or_clean_up(const std::string& what, const stdfs::path& tmp, const FolderWriter& write, const Advice& advice) {
  std::error_code ec;
  try {
    stdfs::remove_all(tmp, ec);  // left by a crashed earlier save
    stdfs::create_directories(tmp);
    write(tmp.string());
  } catch (const std::exception& e) {
    const std::string why = e.what();
    stdfs::remove_all(tmp, ec);
    const std::string removed = ec ? fmt::format("could not remove the partial folder {} ({}): remove it by hand", tmp.string(), ec.message())
                                   : fmt::format("removed the partial folder {}", tmp.string());
    const bool full = is_disk_full_message(why);
    fail("saving {} failed: {} — {}; {}", what, why, removed, advice(full));
  }
}

bool is_weight_file(const std::string& f) {
  const bool shard = f.rfind("model-", 0) == 0 && f.size() > 12 && f.substr(f.size() - 12) == ".safetensors";
  return shard || f == "model.safetensors" || f == "model.safetensors.index.json";
}

// Writes a set of files into `dir` all or nothing: `write` fills dir/.final.tmp; only once every file was written
// is each renamed into `dir` (atomic per file on one filesystem); then the weight files of an earlier save that the
// new set lacks are removed, so that the folder never mixes two models. On failure only the temp folder goes.
void publish_files(const std::string& dir, const std::string& what, const FolderWriter& write, const Advice& advice) {
  const stdfs::path tmp = stdfs::path(dir) / ".final.tmp";
  write_folder_or_clean_up(what, tmp, [&](const std::string& t) {
    write(t);
    std::set<std::string> names;
    for (const auto& e : stdfs::directory_iterator(t)) names.insert(e.path().filename().string());
    for (const std::string& n : names) stdfs::rename(tmp / n, stdfs::path(dir) / n);
    std::error_code ec;
    for (const auto& e : stdfs::directory_iterator(dir, ec)) {
      const std::string n = e.path().filename().string();
      if (e.is_regular_file() && is_weight_file(n) && !names.count(n)) stdfs::remove(e.path(), ec);
    }
    stdfs::remove(tmp, ec);
  }, advice);
}

// The sums TRL averages over a logging window.
struct LogWindow {
  double loss = 0, entropy = 0, accuracy = 0;
  int64_t batches = 0;  // micro-batches: TRL averages its per-batch metrics over them
  int64_t steps = 0;
};

struct StepResult {
  double loss = 0, grad_norm = 0, lr = 0, data_seconds = 0, step_seconds = 0;
};

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

void check_sft_config(const SFTConfig& c, const Tokenizer* tok) {
  auto bad = [](const char* name, const std::string& why) { fail("SFTConfig: {} {}", name, why); };
  // torch.optim.AdamW's checks (lr >= 0, 0 <= beta < 1, weight_decay >= 0), plus eps > 0 (it divides the update)
  // and finite values everywhere: an inf or NaN option would only show up as NaN weights later.
  auto at_least = [&](const char* name, double v, double lo, const char* hint = "") {
    if (!(std::isfinite(v) && v >= lo)) bad(name, fmt::format("must be a finite number >= {}, got {}{}", lo, v, hint));
  };
  auto in_unit = [&](const char* name, double v, bool closed) {
    if (!(v >= 0 && (closed ? v <= 1 : v < 1))) bad(name, fmt::format("must be in [0, 1{}, got {}", closed ? "]" : ")", v));
  };
  auto count_at_least = [&](const char* name, int64_t v, int64_t lo) {
    if (v < lo) bad(name, fmt::format("must be >= {}, got {}", lo, v));
  };
  at_least("learning_rate", c.learning_rate, 0);
  in_unit("adam_beta1", c.adam_beta1, false);
  in_unit("adam_beta2", c.adam_beta2, false);
  if (!(std::isfinite(c.adam_epsilon) && c.adam_epsilon > 0))
    bad("adam_epsilon", fmt::format("must be a finite number > 0, got {} (it divides the update; the default is 1e-08)", c.adam_epsilon));
  at_least("weight_decay", c.weight_decay, 0);
  at_least("max_grad_norm", c.max_grad_norm, 0, " (0 turns clipping off)");
  in_unit("warmup_ratio", c.warmup_ratio, true);
  // num_train_epochs is unused with max_steps (as in Transformers), but is written to trainer_state.json.
  if (!std::isfinite(c.num_train_epochs) || (c.max_steps <= 0 && !(c.num_train_epochs > 0)))
    bad("num_train_epochs", fmt::format("must be a finite number > 0, got {}{}", c.num_train_epochs, c.max_steps <= 0 ? " (or set max_steps)" : ""));
  count_at_least("per_device_train_batch_size", c.per_device_train_batch_size, 1);
  count_at_least("per_device_eval_batch_size", c.per_device_eval_batch_size, 1);
  count_at_least("gradient_accumulation_steps", c.gradient_accumulation_steps, 1);
  count_at_least("warmup_steps", c.warmup_steps, 0);
  count_at_least("logging_steps", c.logging_steps, 1);
  count_at_least("save_steps", c.save_steps, 1);
  if (c.save_total_limit) count_at_least("save_total_limit", *c.save_total_limit, 1);
  if (c.eval_steps) count_at_least("eval_steps", *c.eval_steps, 1);
  count_at_least("max_length", c.max_length, 2);
  // Transformers' set_seed seeds numpy too, which takes 32 bits; a larger value here is usually a negative one
  // that wrapped around.
  if (c.seed > 0xFFFFFFFFull)
    bad("seed", fmt::format("must be in [0, 4294967295], got {}{}", c.seed,
                            c.seed >> 63 ? fmt::format(" (= {} as a signed number)", static_cast<int64_t>(c.seed)) : ""));
  if (c.lr_scheduler_type != "linear" && c.lr_scheduler_type != "cosine" && c.lr_scheduler_type != "constant" &&
      c.lr_scheduler_type != "constant_with_warmup")
    bad("lr_scheduler_type", fmt::format("'{}' is not linear, cosine, constant or constant_with_warmup", c.lr_scheduler_type));
  if (c.eval_strategy != "no" && c.eval_strategy != "steps" && c.eval_strategy != "epoch")
    bad("eval_strategy", fmt::format("'{}' is not no, steps or epoch", c.eval_strategy));
  // packing with padding_free is accepted, as in TRL (its bfd packing is padding-free): packed rows are already
  // padding-free, so packing decides the layout.
  // TRL raises when eos_token is not in the vocabulary: the string appended to every text must be one token.
  if (tok && !c.eos_token.empty()) {
    const std::vector<int32_t> ids = tok->encode(c.eos_token, false);
    if (ids.size() != 1)
      bad("eos_token", fmt::format("'{}' is not a single token of the tokenizer (it encodes to {} tokens); give one of its tokens, such as its "
                                   "eos_token '{}', or leave eos_token unset",
                                   c.eos_token, ids.size(), tok->eos_token()));
  }
}

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
  std::string model_name, dataset_name;  // for the report

  State(const CausalLM& m, const Tokenizer& t, SFTConfig c)
      : cfg(std::move(c)), model(m), tok(t), save_dtype(m.dtype()), source_dir(m.path()),
        opt(AdamWConfig{cfg.adam_beta1, cfg.adam_beta2, cfg.adam_epsilon, cfg.weight_decay}),
        model_name(cfg.model_name_or_path.empty() ? m.path() : cfg.model_name_or_path) {}

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
  std::string out_path(const std::string& name) const { return (stdfs::path(cfg.output_dir) / name).string(); }

  // Training (below).
  void resume(const std::string& spec);
  std::vector<SFTBatch> step_batches(const std::vector<size_t>& order, int64_t within, int64_t* items) const;
  double forward_backward(const std::vector<SFTBatch>& micro, int64_t items, LogWindow& window);
  double clip_gradients(double step_loss);
  StepResult train_step(const std::vector<size_t>& order, LogWindow& window);
  // log.jsonl always holds log_history: rewritten atomically at the start, then appended to entry by entry.
  void start_log() const;
  void log(ojson entry);
  // Saving.
  void write_model_files(const std::string& dir) const;
  ojson trainer_state() const;
  void write_checkpoint_files(const std::string& dir) const;
  std::string resume_advice(bool disk_full) const;
  std::string save_checkpoint();
  void rotate_checkpoints() const;
  void save_final(const RunSummary* summary) const;
};

SFTTrainer::SFTTrainer(const CausalLM& model, const Tokenizer& tok, Dataset train, SFTConfig config, std::optional<Dataset> eval)
    : s_(std::make_unique<State>(model, tok, std::move(config))) {
  State& s = *s_;
  check_sft_config(s.cfg, &tok);
  s.dataset_name = s.cfg.dataset_name.empty() ? source_file(train) : s.cfg.dataset_name;
  // The trainer consumes each program's outputs before it runs the next, so its programs share one arena (the
  // largest one's): keeping a program per length costs its plan and kernels, not another ~3.6 GB of buffers.
  s.backend = make_backend(s.cfg.torch_compile ? model.device() : "reference", BackendOptions{.share_arena = true});
  s.multiple = parse_pad_to_multiple_of(s.cfg.pad_to_multiple_of, s.backend->auto_pad_multiple());
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
  std::error_code ec;
  stdfs::create_directories(dir, ec);
  if (ec) fail("save_model: cannot create the folder {}: {}", dir, ec.message());
  publish_files(dir, "the model to " + dir, [&](const std::string& tmp) { s.write_model_files(tmp); },
                [&](bool) { return fmt::format("the files already in {} are unchanged", dir); });
}

// Weights in the dtype the model was loaded with, config, and the tokenizer and generation files (copied from the
// source model folder, else the bundled tokenizer).
void SFTTrainer::State::write_model_files(const std::string& dir) const {
  TensorMap out;
  for (const auto& [name, w] : master) out[name] = save_dtype == DType::F32 ? w : w.to(save_dtype);
  const CausalLM m = CausalLM::from_weights(model.config(), out, "trainer");
  m.save_pretrained(dir);
  const std::string& src = source_dir;
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

ojson SFTTrainer::State::trainer_state() const {
  const int64_t spe = steps_per_epoch();
  ojson st;
  st["global_step"] = global_step;
  st["epoch"] = static_cast<double>(global_step) / static_cast<double>(spe);
  st["max_steps"] = total_steps();
  st["num_train_epochs"] = cfg.num_train_epochs;
  st["logging_steps"] = cfg.logging_steps;
  st["save_steps"] = cfg.save_steps;
  st["train_batch_size"] = cfg.per_device_train_batch_size;
  st["log_history"] = log_history;
  st["trl_cpp"] = ojson{{"optimizer_steps", opt.steps()}, {"num_tokens", tokens_seen}, {"seed", cfg.seed}, {"steps_per_epoch", spe}};
  return st;
}

void SFTTrainer::State::write_checkpoint_files(const std::string& dir) const {
  write_model_files(dir);
  TensorMap moments;
  for (const auto& [name, w] : master) {
    moments["master/" + name] = w;
    moments["exp_avg/" + name] = opt.exp_avg().at(name);
    moments["exp_avg_sq/" + name] = opt.exp_avg_sq().at(name);
  }
  save_safetensors((stdfs::path(dir) / "optimizer.safetensors").string(), moments);
  write_text_file_atomic((stdfs::path(dir) / "scheduler.json").string(),
                         ojson{{"lr_scheduler_type", cfg.lr_scheduler_type}, {"base_lr", cfg.learning_rate}, {"total_steps", total_steps()},
                               {"warmup_steps", warmup()}, {"last_step", global_step}}
                                 .dump(2));
  write_text_file_atomic((stdfs::path(dir) / "trainer_state.json").string(), trainer_state().dump(2) + "\n");
}

// What to do after a failed save: where training can resume from.
std::string SFTTrainer::State::resume_advice(bool disk_full) const {
  const std::string fix = disk_full ? "free some disk space (or choose an output_dir on another disk)" : "fix the cause";
  const auto all = list_checkpoints(cfg.output_dir);
  if (all.empty()) return fmt::format("there is no complete checkpoint in {}: {}, then train again", cfg.output_dir, fix);
  const std::string last = all.back().second.string();
  return fmt::format("the last complete checkpoint is {}: {}, then resume with --resume_from_checkpoint {}", last, fix, last);
}

// checkpoint-N is written into checkpoint-N.tmp and renamed, so a checkpoint-N folder is always complete.
std::string SFTTrainer::State::save_checkpoint() {
  const std::string name = fmt::format("checkpoint-{}", global_step);
  const stdfs::path dir = stdfs::path(cfg.output_dir) / name, tmp = stdfs::path(cfg.output_dir) / (name + ".tmp");
  write_folder_or_clean_up(
      name, tmp,
      [&](const std::string& t) {
        write_checkpoint_files(t);
        std::error_code ec;
        stdfs::remove_all(dir, ec);  // an earlier save of this step (a run resumed from an older checkpoint)
        stdfs::rename(tmp, dir);
      },
      [&](bool full) { return resume_advice(full); });
  rotate_checkpoints();
  return dir.string();
}

// Keeps the newest save_total_limit checkpoints.
void SFTTrainer::State::rotate_checkpoints() const {
  if (!cfg.save_total_limit) return;
  const auto all = list_checkpoints(cfg.output_dir);
  std::error_code ec;
  for (size_t i = 0; i + static_cast<size_t>(*cfg.save_total_limit) < all.size(); ++i) stdfs::remove_all(all[i].second, ec);
}

// The final model, trainer_state.json and the report, all or nothing; checkpoints stay whatever happens.
void SFTTrainer::State::save_final(const RunSummary* summary) const {
  publish_files(
      cfg.output_dir, "the final model to " + cfg.output_dir,
      [&](const std::string& tmp) {
        write_model_files(tmp);
        write_text_file_atomic((stdfs::path(tmp) / "trainer_state.json").string(), trainer_state().dump(2) + "\n");
        if (summary) write_text_file_atomic((stdfs::path(tmp) / "training_report.html").string(), training_report_html(log_history, *summary));
      },
      [&](bool full) { return fmt::format("the files already in {} are unchanged; {}", cfg.output_dir, resume_advice(full)); });
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
    g.output(g.weighted_sum(logp, g.input("loss_weights", {B, T}, DType::F32), "loss"), "loss");
    g.output(g.entropy(h, head, "entropy"), "entropy");
    g.output(g.token_argmax_match(h, head, labels, "token_accuracy"), "token_accuracy");
    const graph::Graph graph = g.finish();
    const auto out = s.programs->get(graph).run(s.inputs(b, -1.0f));
    nll += out[graph.output_index("loss")].data_as<float>()[0];
    const TokenMetrics m = token_metrics(b, out[graph.output_index("entropy")], out[graph.output_index("token_accuracy")]);
    entropy += m.entropy, accuracy += m.accuracy;
    items += b.num_items;
    ++batches;
  }
  return ojson{{"eval_loss", nll / static_cast<double>(std::max<int64_t>(1, items))},
               {"eval_entropy", entropy / static_cast<double>(batches)},
               {"eval_mean_token_accuracy", accuracy / static_cast<double>(batches)}};
}

// Resume: weights, moments, step, log and the position in the data order.
void SFTTrainer::State::resume(const std::string& spec) {
  std::string dir = spec;
  if (dir == "last" || dir == "true" || dir == "True") {
    const auto all = list_checkpoints(cfg.output_dir);
    if (all.empty()) fail("resume_from_checkpoint: no checkpoint-* folder in {}", cfg.output_dir);
    dir = all.back().second.string();
  }
  const std::string opt_file = (stdfs::path(dir) / "optimizer.safetensors").string(), state_file = (stdfs::path(dir) / "trainer_state.json").string();
  if (!stdfs::is_regular_file(opt_file) || !stdfs::is_regular_file(state_file))
    fail("resume_from_checkpoint {}: not a checkpoint (needs optimizer.safetensors and trainer_state.json)", dir);
  const SafeTensorsFile f = SafeTensorsFile::open(opt_file);
  TensorMap m, v;
  for (auto& [name, w] : master) {
    for (const char* part : {"master/", "exp_avg/", "exp_avg_sq/"})
      if (!f.contains(part + name)) fail("resume_from_checkpoint {}: {} has no '{}{}'", dir, opt_file, part, name);
    w.copy_from(f.get("master/" + name));
    m[name] = f.get("exp_avg/" + name).clone();
    v[name] = f.get("exp_avg_sq/" + name).clone();
    if (cfg.bf16) compute[name].copy_from(w.to(DType::BF16));
  }
  const ojson st = ojson::parse(read_text_file(state_file));
  global_step = st.at("global_step").get<int64_t>();
  opt.set_state(std::move(m), std::move(v), st.at("trl_cpp").at("optimizer_steps").get<int64_t>());
  tokens_seen = st.at("trl_cpp").at("num_tokens").get<int64_t>();
  log_history.clear();
  for (const auto& e : st.at("log_history")) log_history.push_back(e);
  std::fprintf(stderr, "[trl] resumed from %s at step %lld\n", dir.c_str(), static_cast<long long>(global_step));
}

// A fresh run starts log.jsonl anew; a resume keeps the checkpoint's entries (the steps after it are redone).
// Written atomically, so a crash leaves the old file or the new one, never a torn line.
void SFTTrainer::State::start_log() const { write_text_file_atomic(out_path("log.jsonl"), jsonl(log_history)); }

void SFTTrainer::State::log(ojson e) {
  e["epoch"] = static_cast<double>(global_step) / static_cast<double>(steps_per_epoch());
  e["step"] = global_step;
  const std::string line = e.dump() + "\n";
  try {
    append_text_file(out_path("log.jsonl"), line);
  } catch (const Error& err) {
    fail("logging step {} failed: {}; {}", global_step, err.what(), resume_advice(is_disk_full_message(err.what())));
  }
  log_history.push_back(std::move(e));
  if (cfg.progress && !isatty(2)) std::fprintf(stderr, "%s", line.c_str());
}

// Step `within` of the epoch's `order`, collated first: num_items_in_batch counts the labels of all micro-batches.
std::vector<SFTBatch> SFTTrainer::State::step_batches(const std::vector<size_t>& order, int64_t within, int64_t* items) const {
  const int64_t ga = cfg.gradient_accumulation_steps, bsz = cfg.per_device_train_batch_size;
  std::vector<SFTBatch> micro;
  *items = 0;
  for (int64_t k = within * ga; k < std::min(micro_batches(), (within + 1) * ga); ++k) {
    std::vector<size_t> chosen;
    for (int64_t i = k * bsz; i < std::min<int64_t>(static_cast<int64_t>(order.size()), (k + 1) * bsz); ++i) chosen.push_back(order[static_cast<size_t>(i)]);
    micro.push_back(collate(chosen, train, cfg.max_length));
    *items += micro.back().num_items;
  }
  return micro;
}

// Forward and backward over the step's micro-batches; the gradients (summed) are left in `grads`.
double SFTTrainer::State::forward_backward(const std::vector<SFTBatch>& micro, int64_t items, LogWindow& window) {
  double step_loss = 0;
  const auto shapes = parameter_shapes(model.config());
  for (size_t k = 0; k < micro.size(); ++k) {
    const SFTBatch& b = micro[k];
    const int64_t B = b.input_ids.size(0), T = b.input_ids.size(1);
    const graph::Graph graph = model.training_graph(B, T, DType::F32, cfg.gradient_checkpointing, true);
    const std::map<std::string, size_t> at = graph.output_indices();
    Program& prog = programs->get(graph);
    const auto out = prog.run(inputs(b, -1.0f / static_cast<float>(std::max<int64_t>(1, items))));
    step_loss += out[at.at("loss")].data_as<float>()[0];
    const TokenMetrics m = token_metrics(b, out[at.at("entropy")], out[at.at("token_accuracy")]);
    window.entropy += m.entropy, window.accuracy += m.accuracy, ++window.batches;
    for (size_t p = 0; p < shapes.size(); ++p) {
      const std::string& name = shapes[p].first;
      const Tensor& grad = out[at.at("grad." + name)];
      if (micro.size() == 1) {
        grads[name] = grad;
        continue;
      }
      if (!accumulated.count(name)) accumulated[name] = Tensor::uninitialized(DType::F32, grad.shape());
      Tensor& acc_t = accumulated.at(name);
      float* acc = acc_t.mutable_data_as<float>();
      const float* g = grad.data_as<float>();
      const int64_t n = grad.numel();
      if (k == 0) std::memcpy(acc, g, static_cast<size_t>(n) * sizeof(float));
      else {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) acc[i] += g[i];
      }
      grads[name] = acc_t;
    }
    tokens_seen += b.num_tokens;
  }
  return step_loss;
}

// Global-norm clipping; returns the norm before clipping (the logged grad_norm, as in Transformers).
double SFTTrainer::State::clip_gradients(double step_loss) {
  double sq = 0;
  for (const auto& [name, g] : grads) {
    const float* x = g.data_as<float>();
    double part = 0;
#pragma omp parallel for reduction(+ : part) schedule(static)
    for (int64_t i = 0; i < g.numel(); ++i) part += static_cast<double>(x[i]) * x[i];
    sq += part;
  }
  const double norm = std::sqrt(sq);
  if (!std::isfinite(norm)) fail("training step {}: the gradient norm is {} (the loss was {})", global_step + 1, norm, step_loss);
  if (cfg.max_grad_norm > 0 && norm > cfg.max_grad_norm) {
    const float coef = static_cast<float>(cfg.max_grad_norm / (norm + 1e-6));
    for (auto& [name, g] : grads) {
      float* x = g.mutable_data_as<float>();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < g.numel(); ++i) x[i] *= coef;
    }
  }
  return norm;
}

StepResult SFTTrainer::State::train_step(const std::vector<size_t>& order, LogWindow& window) {
  const auto t_step = Clock::now();
  StepResult r;
  int64_t items = 0;
  const std::vector<SFTBatch> micro = step_batches(order, global_step % steps_per_epoch(), &items);
  r.data_seconds = std::chrono::duration<double>(Clock::now() - t_step).count();
  r.loss = forward_backward(micro, items, window);
  r.grad_norm = clip_gradients(r.loss);
  r.lr = scheduled_lr(cfg.lr_scheduler_type, cfg.learning_rate, global_step, total_steps(), warmup());
  opt.step(master, grads, r.lr, cfg.bf16 ? &compute : nullptr);
  grads.clear();  // views into the program's arena must not keep a replaced arena alive
  ++global_step;
  window.loss += r.loss;
  ++window.steps;
  r.step_seconds = std::chrono::duration<double>(Clock::now() - t_step).count();
  return r;
}

TrainOutput SFTTrainer::train() {
  State& s = *s_;
  const SFTConfig& c = s.cfg;
  std::error_code ec;
  stdfs::create_directories(c.output_dir, ec);
  if (ec) fail("output_dir {}: cannot create: {}", c.output_dir, ec.message());
  if (!c.resume_from_checkpoint.empty()) s.resume(c.resume_from_checkpoint);
  s.start_log();
  const int64_t total = s.total_steps(), spe = s.steps_per_epoch();
  TrainOutput result;
  const bool tty = c.progress && isatty(2);
  const auto t_start = Clock::now();
  const int64_t start_step = s.global_step, tokens_at_start = s.tokens_seen;
  LogWindow window;
  int64_t saved_step = -1;
  std::vector<size_t> order;
  int64_t order_epoch = -1;
  {
    const SigintScope sigint;
    while (s.global_step < total) {
      if (s.global_step / spe != order_epoch) order_epoch = s.global_step / spe, order = s.order(order_epoch);
      const StepResult r = s.train_step(order, window);
      if (on_step)
        on_step(ojson{{"loss", r.loss}, {"grad_norm", r.grad_norm}, {"learning_rate", r.lr}, {"num_tokens", s.tokens_seen},
                      {"step_seconds", r.step_seconds}, {"data_seconds", r.data_seconds}});
      const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
      const double tps = static_cast<double>(s.tokens_seen - tokens_at_start) / std::max(elapsed, 1e-9);
      if (tty) print_progress(s.global_step, total, start_step, elapsed, r.loss, r.lr, tps);
      if (s.global_step % c.logging_steps == 0 || s.global_step == total) {
        const double nb = static_cast<double>(std::max<int64_t>(1, window.batches));
        s.log(ojson{{"loss", window.loss / static_cast<double>(window.steps)}, {"grad_norm", r.grad_norm}, {"learning_rate", r.lr},
                    {"entropy", window.entropy / nb}, {"mean_token_accuracy", window.accuracy / nb}, {"num_tokens", s.tokens_seen},
                    {"train_tokens_per_s", tps}, {"step_seconds", r.step_seconds}, {"data_seconds", r.data_seconds}});
        window = LogWindow{};
      }
      if ((c.eval_strategy == "steps" && s.global_step % c.eval_steps.value_or(c.logging_steps) == 0) ||
          (c.eval_strategy == "epoch" && s.global_step % spe == 0))
        s.log(evaluate_metrics());
      // As in Transformers, the last step too is saved when it is a multiple of save_steps.
      if (s.global_step % c.save_steps == 0) s.save_checkpoint(), saved_step = s.global_step;
      if (g_interrupted) {
        const std::string dir = saved_step == s.global_step ? s.out_path(fmt::format("checkpoint-{}", s.global_step)) : s.save_checkpoint();
        std::fprintf(stderr, "\n[trl] interrupted: saved %s; resume with --resume_from_checkpoint %s\n", dir.c_str(), dir.c_str());
        result.interrupted = true;
        break;
      }
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  if (!result.interrupted) {
    RunSummary summary;
    summary.title = "trl.cpp SFT: " + c.output_dir;
    summary.model = s.model_name, summary.dataset = s.dataset_name, summary.output_dir = c.output_dir;
    summary.steps_done = s.global_step, summary.total_steps = total;
    summary.epochs = static_cast<double>(s.global_step) / static_cast<double>(spe);
    summary.tokens = s.tokens_seen;
    summary.train_seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
    summary.programs = s.programs->stats();
    s.save_final(c.report ? &summary : nullptr);
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

#include "train/trainer.h"
#include "trl/train/base_trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <signal.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <sstream>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "trl/backend/registry.h"
#include "trl/core/error.h"
#include "core/fs.h"
#include "core/memory.h"
#include "core/rng.h"
#include "trl/io/safetensors.h"
#include "trl/models/init.h"
#include "trl/runtime/shapes.h"
#include "dist/fsdp.h"
#include "train/optim/adamw.h"
#include "train/report.h"
#include "train/saved_state.h"
#include "train/trainer_state.h"

namespace trl {

namespace {

namespace stdfs = std::filesystem;
using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted = true; }

// Ctrl-C sets g_interrupted while training; the previous handler comes back however the loop ends, with its flags
// (sigaction: a Python interpreter's handler is installed without SA_RESTART, and must stay so).
class SigintScope {
 public:
  SigintScope() {
    g_interrupted = false;
    struct sigaction now {};
    now.sa_handler = on_sigint;
    sigemptyset(&now.sa_mask);
    sigaction(SIGINT, &now, &old_);
  }
  ~SigintScope() { sigaction(SIGINT, &old_, nullptr); }
  SigintScope(const SigintScope&) = delete;
  SigintScope& operator=(const SigintScope&) = delete;

 private:
  struct sigaction old_ {};
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

}  // namespace

std::string dataset_source_file(const Dataset& d) { return d.source_file(); }

namespace {

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

// The files that say which model a folder holds: a model's weights and config, or an adapter's.
bool is_weight_file(const std::string& f) {
  const bool shard = f.rfind("model-", 0) == 0 && f.size() > 12 && f.substr(f.size() - 12) == ".safetensors";
  return shard || f == "model.safetensors" || f == "model.safetensors.index.json" || f == "config.json" || f == "adapter_model.safetensors" ||
         f == "adapter_config.json";
}

// Writes a set of files into `dir` all or nothing: `write` fills dir/.final.tmp; only once every file was written
// is each renamed into `dir` (atomic per file on one filesystem); then the weight and config files of an earlier save
// that the new set lacks are removed, so that the folder never mixes two models (or a model and an adapter). On failure only the temp folder goes.
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

// Rows and tokens of a graph's input_ids ([B, T]).
int64_t shape_rows(const graph::Graph& g) {
  for (graph::ValueId v : g.inputs)
    if (g.nodes[static_cast<size_t>(v)].name == "input_ids") return g.nodes[static_cast<size_t>(v)].shape.at(0);
  return 0;
}
int64_t shape_tokens(const graph::Graph& g) {
  for (graph::ValueId v : g.inputs)
    if (g.nodes[static_cast<size_t>(v)].name == "input_ids") return g.nodes[static_cast<size_t>(v)].shape.at(1);
  return 0;
}

}  // namespace

namespace {

// lr_scheduler_kwargs as Transformers' schedules take them: num_cycles for the cosine ones, min_lr or min_lr_rate
// (one, required) for cosine_with_min_lr; a key another schedule does not take is an error, as its TypeError is.
void check_scheduler_kwargs(const TrainingArguments& c, const std::function<void(const char*, const std::string&)>& bad) {
  const auto& kw = c.lr_scheduler_kwargs;
  if (!kw.is_object()) bad("lr_scheduler_kwargs", fmt::format("must be a JSON object such as {{\"min_lr_rate\": 0.1}}, got {}", kw.dump()));
  const bool cosine = c.lr_scheduler_type == "cosine" || c.lr_scheduler_type == "cosine_with_min_lr";
  for (const auto& [k, v] : kw.items()) {
    const bool known = (cosine && k == "num_cycles") || (c.lr_scheduler_type == "cosine_with_min_lr" && (k == "min_lr" || k == "min_lr_rate"));
    if (!known) bad("lr_scheduler_kwargs", fmt::format("'{}' is not an argument of the {} schedule", k, c.lr_scheduler_type));
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      bad("lr_scheduler_kwargs", fmt::format("'{}' must be a number >= 0, got {}", k, v.dump()));
  }
  if (c.lr_scheduler_type == "cosine_with_min_lr" && kw.contains("min_lr") == kw.contains("min_lr_rate"))
    bad("lr_scheduler_kwargs", "cosine_with_min_lr takes exactly one of min_lr and min_lr_rate, such as {\"min_lr_rate\": 0.1}");
}

}  // namespace

std::pair<double, double> scheduler_rates(const TrainingArguments& c) {
  const auto& kw = c.lr_scheduler_kwargs;
  double rate = 0;
  if (kw.is_object() && kw.contains("min_lr_rate")) rate = kw["min_lr_rate"].get<double>();
  if (kw.is_object() && kw.contains("min_lr")) rate = c.learning_rate > 0 ? kw["min_lr"].get<double>() / c.learning_rate : 0;
  return {rate, kw.is_object() && kw.contains("num_cycles") ? kw["num_cycles"].get<double>() : 0.5};
}

void check_training_arguments(const TrainingArguments& c, const char* config_name) {
  auto bad = [&](const char* name, const std::string& why) { fail("{}: {} {}", config_name, name, why); };
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
  at_least("warmup_steps", c.warmup_steps, 0, " (a value in (0, 1) is a ratio of the total steps)");
  if (c.warmup_steps > 1e15) bad("warmup_steps", fmt::format("must be at most 1e15, got {}", c.warmup_steps));
  count_at_least("logging_steps", c.logging_steps, 1);
  count_at_least("save_steps", c.save_steps, 1);
  if (c.save_total_limit) count_at_least("save_total_limit", *c.save_total_limit, 1);
  if (c.eval_steps) count_at_least("eval_steps", *c.eval_steps, 1);
  // Transformers' set_seed seeds numpy too, which takes 32 bits; a larger value here is usually a negative one
  // that wrapped around.
  if (c.seed > 0xFFFFFFFFull)
    bad("seed", fmt::format("must be in [0, 4294967295], got {}{}", c.seed,
                            c.seed >> 63 ? fmt::format(" (= {} as a signed number)", static_cast<int64_t>(c.seed)) : ""));
  count_at_least("tp_size", c.distributed.tp_size, 1);
  count_at_least("fsdp_size", c.distributed.fsdp_size, 1);
  count_at_least("ep_size", c.distributed.ep_size, 1);
  if (c.distributed.enable_expert_parallel && c.distributed.model_parallel_size() == 1)
    bad("enable_expert_parallel", "splits the experts between the tensor-parallel ranks, but tp_size is 1: give ep_size (or tp_size) > 1");
  if (c.distributed.ep_size > 1 && c.distributed.tp_size > 1 && c.distributed.tp_size != c.distributed.ep_size)
    bad("ep_size", fmt::format("{} with tp_size {}: the expert-parallel ranks are the tensor-parallel group (as in Transformers), so the two "
                               "must be equal; give one of them",
                               c.distributed.ep_size, c.distributed.tp_size));
  if (const int64_t W = dist::world().size(), mp = c.distributed.model_parallel_size(), model = mp * c.distributed.fsdp_size; W % model != 0)
    bad(c.distributed.ep_size > 1 ? "ep_size" : "tp_size",
        fmt::format("× fsdp_size = {} × {} = {} does not divide the {} processes of this run (world size = data parallel × fsdp_size × "
                    "tp_size, or ep_size): start a multiple of {} processes, or change {} / fsdp_size",
                    mp, c.distributed.fsdp_size, model, W, model, c.distributed.ep_size > 1 ? "ep_size" : "tp_size"));
  if (c.lr_scheduler_type != "linear" && c.lr_scheduler_type != "cosine" && c.lr_scheduler_type != "cosine_with_min_lr" &&
      c.lr_scheduler_type != "constant" && c.lr_scheduler_type != "constant_with_warmup")
    bad("lr_scheduler_type", fmt::format("'{}' is not linear, cosine, cosine_with_min_lr, constant or constant_with_warmup", c.lr_scheduler_type));
  check_scheduler_kwargs(c, bad);
  static const char* adamw[] = {"adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_apex_fused", "adamw_torch_xla", "adamw_torch_npu_fused"};
  if (std::none_of(std::begin(adamw), std::end(adamw), [&](const char* o) { return c.optim == o; }))
    bad("optim", fmt::format("'{}' is not available: trl.cpp trains with AdamW (f32 moments, Transformers' adamw_torch); 8-bit, paged and "
                             "other optimizers are not implemented (drop --optim, or give adamw_torch)", c.optim));
  if (c.train_sampling_strategy != "random" && c.train_sampling_strategy != "sequential")
    bad("train_sampling_strategy", fmt::format("'{}' is not random or sequential", c.train_sampling_strategy));
  if (c.eval_strategy != "no" && c.eval_strategy != "steps" && c.eval_strategy != "epoch")
    bad("eval_strategy", fmt::format("'{}' is not no, steps or epoch", c.eval_strategy));
}

double scheduled_lr(const std::string& type, double base, int64_t step, int64_t total, int64_t warmup, double min_lr_rate, double num_cycles) {
  if (warmup > 0 && step < warmup && type != "constant") return base * static_cast<double>(step) / static_cast<double>(warmup);
  if (type == "constant" || type == "constant_with_warmup") return base;
  const double span = static_cast<double>(std::max<int64_t>(1, total - warmup)), done = static_cast<double>(step - warmup);
  if (type == "cosine" || type == "cosine_with_min_lr") {  // Transformers' _get_cosine_schedule_with_warmup_lr_lambda
    const double factor = 0.5 * (1.0 + std::cos(M_PI * num_cycles * 2.0 * done / span));
    return base * std::max(0.0, factor * (1 - min_lr_rate) + min_lr_rate);
  }
  return base * std::max(0.0, (static_cast<double>(total) - static_cast<double>(step)) / span);  // linear
}

void MetricWindow::add(const std::string& name, double value) {
  for (auto& [n, s] : sums_)
    if (n == name) {
      s.first += value, ++s.second;
      return;
    }
  sums_.push_back({name, {value, 1}});
}

ojson MetricWindow::means() const {
  ojson out = ojson::object();
  for (const auto& [n, s] : sums_) out[n] = s.first / static_cast<double>(std::max<int64_t>(1, s.second));
  return out;
}

ojson MetricWindow::sums() const {
  ojson out = ojson::object();
  for (const auto& [n, s] : sums_) out[n] = ojson::array({s.first, s.second});
  return out;
}

ojson TrainingMethod::evaluate(MethodContext&) { fail("evaluate: {} has no eval dataset", name()); }

Trainer::Trainer(const CausalLM& model, const TrainingArguments& args, const char* config_name) {
  check_training_arguments(args, config_name);
  device_ = args.torch_compile ? model.device() : "reference";
  // The trainer consumes each program's outputs before it runs the next, so its programs share one arena (the
  // largest one's): keeping a program per length costs its plan and kernels, not another ~3.6 GB of buffers.
  backend_ = make_backend(device_, BackendOptions{.share_arena = true});
  // LoRA (docs/LORA.md): a fresh adapter from args.peft_config, or the one the model came with (trained on).
  if (args.peft_config && model.lora()) fail("{}: the model already has a LoRA adapter; pass it without peft_config to train it", config_name);
  const CausalLM adapted = args.peft_config ? model.with_adapter(init_lora(model.config(), *args.peft_config, args.seed)) : model;
  s_ = std::make_unique<State>(adapted, args, config_name);
  State& s = *s_;
  // f32 master weights of the trained parameters (this rank's slices under tensor parallel); bf16 compute copies
  // refreshed by AdamW in the same pass. With an adapter the base weights are frozen: compute weights only, shared
  // with the model where they are already in the compute dtype.
  const DType compute_dtype = args.bf16 ? DType::BF16 : DType::F32;
  const std::vector<std::string> trainable = s.model.trainable_parameters();
  const std::set<std::string> trained_names(trainable.begin(), trainable.end());
  for (const auto& [name, w] : s.model.weights()) {
    if (!trained_names.count(name)) {
      s.compute[name] = w.dtype() == compute_dtype ? w : w.to(compute_dtype);
      continue;
    }
    s.master[name] = w.to(DType::F32).clone();
    s.compute[name] = args.bf16 ? s.master[name].to(DType::BF16).clone() : s.master[name];
  }
  if (s.model.lora() && s.model.lora()->lora_dropout > 0) s.compute[kDropoutSeed] = Tensor::zeros(DType::I32, {2});
  // On a device the weights move before any method is made: a method's models over the compute weights (GRPO's
  // generator, a copied reference) then hold the device tensors that AdamW updates.
  s.backend = backend_.get();
  if (!backend_->host_memory()) s.move_weights_to_backend();
  if (args.bf16 || s.model.dtype() != DType::F32 || !backend_->host_memory()) s.model = s.model.with_weights(s.compute, "trainer");
}

Trainer::~Trainer() = default;

int64_t Trainer::data_parallel_size() const { return s_->dp->size(); }
int64_t Trainer::data_parallel_rank() const { return s_->dp->rank(); }

void Trainer::set_method(std::unique_ptr<TrainingMethod> method) {
  State& s = *s_;
  method_ = std::move(method);
  s.method = method_.get();
  if (s.cfg.eval_strategy != "no" && !method_->has_eval())
    fail("{}: eval_strategy '{}' needs an eval dataset", s.config_name, s.cfg.eval_strategy);
  if (s.micro_batches() == 0)
    fail("{}: {} training items and dataloader_drop_last leave no full batch of {}", method_->name(), method_->num_items(),
         s.cfg.per_device_train_batch_size);
  for (const auto& [name, w] : method_->extra_parameters()) {
    if (s.master.count(name)) fail("{}: the extra parameter {} is already one of the model's", method_->name(), name);
    s.master[name] = w.to(DType::F32).clone();
    s.compute[name] = s.cfg.bf16 ? s.master[name].to(DType::BF16).clone() : s.master[name];
  }
  for (const std::string& name : method_->frozen_parameters()) s.master.erase(name);
  for (const auto& [name, w] : s.master) s.trained[name] = w.shape();
  if (s.cfg.distributed.fsdp_size > 1) s.shard_state();
  s.programs = std::make_unique<ProgramCache>(*backend_, ProgramCacheOptions{method_->programs_to_keep(), ""});
  if (!backend_->host_memory()) s.move_weights_to_backend();  // the method's extra parameters (a reward head)
}

void Trainer::State::move_weights_to_backend() {
  if (cfg.distributed.fsdp_size > 1 || tp() > 1)
    fail("{}: FSDP and tensor parallel run on host backends for now; '{}' keeps the weights in its own memory "
         "(use data parallel alone: --fsdp_size 1 --tp_size 1, or choose --device cpu)", config_name, backend->name());
  std::map<const void*, Tensor> moved;  // by host address: a tensor that is both master and compute goes up once
  auto move = [&](Tensor& t, const std::string& name) {
    if (t.is_device()) return;  // moved before
    const void* at = t.data();
    if (auto it = moved.find(at); it != moved.end() && it->second.shape() == t.shape() && it->second.dtype() == t.dtype()) {
      t = it->second;
      return;
    }
    t = backend->upload(t, name);
    moved[at] = t;
  };
  for (auto& [name, w] : master) move(w, name);
  for (auto& [name, w] : compute) move(w, name);
}

TensorMap Trainer::State::to_host(const TensorMap& tensors) const {
  TensorMap out;
  for (const auto& [name, t] : tensors) out[name] = t.is_device() ? backend->download(t) : t;
  return out;
}

const TensorMap& Trainer::master_weights() const { return s_->master; }
const TensorMap& Trainer::compute_weights() const { return s_->compute; }
TensorMap Trainer::to_host(const TensorMap& tensors) const { return s_->to_host(tensors); }
const CausalLM& Trainer::model() const { return s_->model; }
const ProgramCacheStats& Trainer::program_stats() const { return s_->programs->stats(); }

ojson Trainer::evaluate() {
  MethodContext ctx = s_->context();
  return method_->evaluate(ctx);
}

void Trainer::save_model(const std::string& dir) const {
  const State& s = *s_;
  const TensorMap weights = s.weights_to_save(s.whole_masters_for_saving());  // every rank: collectives under FSDP and TP
  if (!s.is_main()) return;  // rank 0 writes
  std::error_code ec;
  stdfs::create_directories(dir, ec);
  if (ec) fail("save_model: cannot create the folder {}: {}", dir, ec.message());
  publish_files(dir, "the model to " + dir, [&](const std::string& tmp) { s.write_model_files(tmp, weights); },
                [&](bool) { return fmt::format("the files already in {} are unchanged", dir); });
}
// Weights in the dtype the model was loaded with, config, and the tokenizer and generation files (copied from the
// source model folder, else the bundled tokenizer).
void Trainer::State::write_model_files(const std::string& dir, const TensorMap& weights) const {
  if (const LoraConfig* lora = model.lora()) {  // a PEFT adapter: adapter_config.json and adapter_model.safetensors
    LoraConfig c = *lora;
    c.base_model_name_or_path = cfg.model_name_or_path.empty() ? source_dir : cfg.model_name_or_path;
    if (c.target_modules.size() == 1 && c.target_modules[0] == "all-linear") {  // PEFT saves the names all-linear chose
      LoraConfig modules_only = c;  // the linear modules alone: what target_parameters adapts stays in target_parameters
      modules_only.target_parameters.clear();
      c.target_modules.clear();
      for (const std::string& m : lora_target_modules(model.config(), modules_only))
        if (const std::string short_name = m.substr(m.rfind('.') + 1);
            std::find(c.target_modules.begin(), c.target_modules.end(), short_name) == c.target_modules.end())
          c.target_modules.push_back(short_name);
    }
    save_adapter(dir, c, weights);
  } else if (!method->write_model(dir, weights, save_dtype)) {
    CausalLM::from_weights(model.config(), weights, "trainer").save_pretrained(dir);
  }
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

ojson Trainer::State::trainer_state() const {
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
  // What a resume checks: the data order and the batch layout must be this run's (check_resumed_layout).
  st["trl_cpp"] = ojson{{"optimizer_steps", opt.steps()}, {"num_tokens", tokens_seen}, {"seed", cfg.seed}, {"steps_per_epoch", spe},
                        {"method", method->name()}, {"train_items", method->num_items()},
                        {"train_sampling_strategy", cfg.train_sampling_strategy},
                        {"per_device_train_batch_size", cfg.per_device_train_batch_size},
                        {"gradient_accumulation_steps", cfg.gradient_accumulation_steps}, {"dataloader_drop_last", cfg.dataloader_drop_last},
                        {"world_size", comm.size()}, {"data_parallel_size", dp->size()}, {"tp_size", tp()}};
  return st;
}

void Trainer::State::write_checkpoint_files(const std::string& dir, const WholeState& state) const {
  write_model_files(dir, state.weights);
  TensorMap moments;
  for (const auto& [name, w] : state.master) {
    moments["master/" + name] = w;
    moments["exp_avg/" + name] = state.exp_avg.at(name);
    moments["exp_avg_sq/" + name] = state.exp_avg_sq.at(name);
  }
  save_safetensors((stdfs::path(dir) / "optimizer.safetensors").string(), moments);
  method->save_state(dir);
  write_text_file_atomic((stdfs::path(dir) / "scheduler.json").string(),
                         ojson{{"lr_scheduler_type", cfg.lr_scheduler_type}, {"base_lr", cfg.learning_rate}, {"total_steps", total_steps()},
                               {"warmup_steps", warmup()}, {"last_step", global_step}}
                                 .dump(2));
  write_text_file_atomic((stdfs::path(dir) / "trainer_state.json").string(), trainer_state().dump(2) + "\n");
}

// What to do after a failed save: where training can resume from.
std::string Trainer::State::resume_advice(bool disk_full) const {
  const std::string fix = disk_full ? "free some disk space (or choose an output_dir on another disk)" : "fix the cause";
  const auto all = list_checkpoints(cfg.output_dir);
  if (all.empty()) return fmt::format("there is no complete checkpoint in {}: {}, then train again", cfg.output_dir, fix);
  const std::string last = all.back().second.string();
  return fmt::format("the last complete checkpoint is {}: {}, then resume with --resume_from_checkpoint {}", last, fix, last);
}

// checkpoint-N is written into checkpoint-N.tmp and renamed, so a checkpoint-N folder is always complete.
std::string Trainer::State::save_checkpoint() {
  const std::string name = fmt::format("checkpoint-{}", global_step);
  const stdfs::path dir = stdfs::path(cfg.output_dir) / name, tmp = stdfs::path(cfg.output_dir) / (name + ".tmp");
  check_ranks_agree();
  const WholeState state = whole_state();  // under FSDP and TP: gathered onto rank 0 (every rank takes part)
  if (!is_main()) return dir.string();  // rank 0 writes the checkpoint
  write_folder_or_clean_up(
      name, tmp,
      [&](const std::string& t) {
        write_checkpoint_files(t, state);
        std::error_code ec;
        stdfs::remove_all(dir, ec);  // an earlier save of this step (a run resumed from an older checkpoint)
        stdfs::rename(tmp, dir);
      },
      [&](bool full) { return resume_advice(full); });
  rotate_checkpoints();
  return dir.string();
}

// Keeps the newest save_total_limit checkpoints.
void Trainer::State::rotate_checkpoints() const {
  if (!cfg.save_total_limit) return;
  const auto all = list_checkpoints(cfg.output_dir);
  std::error_code ec;
  for (size_t i = 0; i + static_cast<size_t>(*cfg.save_total_limit) < all.size(); ++i) stdfs::remove_all(all[i].second, ec);
}

// The final model, trainer_state.json and the report, all or nothing; checkpoints stay whatever happens.
void Trainer::State::save_final(const RunSummary* summary) {
  const TensorMap weights = weights_to_save(whole_masters_for_saving());  // every rank: collectives under FSDP and TP
  take_over_run_files();  // a run without a log entry (resumed at its last step) too
  if (!is_main()) return;
  publish_files(
      cfg.output_dir, "the final model to " + cfg.output_dir,
      [&](const std::string& tmp) {
        write_model_files(tmp, weights);
        write_text_file_atomic((stdfs::path(tmp) / "trainer_state.json").string(), trainer_state().dump(2) + "\n");
        if (summary) write_text_file_atomic((stdfs::path(tmp) / "training_report.html").string(), training_report_html(log_history, *summary));
      },
      [&](bool full) { return fmt::format("the files already in {} are unchanged; {}", cfg.output_dir, resume_advice(full)); });
}

// A checkpoint resumes only the run that wrote it: the seed, the method, the number of training items and the
// batch layout decide the data order and the position in it (checkpoints from before these were recorded have
// only the seed).
void Trainer::State::check_resumed_layout(const SavedTrainerState& st, const std::string& dir) const {
  const ojson& saved = st.trl_cpp;
  const ojson now = trainer_state()["trl_cpp"];
  // Any number of processes resumes a checkpoint, as long as a micro-batch has the same rows over all of them
  // (data-parallel ranks × per_device_train_batch_size): the data order and the position in it are the same.
  if (st.per_device_train_batch_size) {
    const int64_t saved_world = st.data_parallel_size, saved_b = *st.per_device_train_batch_size, rows = saved_world * saved_b;
    if (rows != micro_rows() && saved_world == dp->size())
      fail("resume_from_checkpoint {}: the checkpoint was written with per_device_train_batch_size = {}, this run has per_device_train_batch_size = {}; "
           "resume with --per_device_train_batch_size {} (the data order and the position in it depend on it), or start a new run",
           dir, saved_b, cfg.per_device_train_batch_size, saved_b);
    if (rows != micro_rows()) {
      // Without tensor parallel the data-parallel ranks are the processes.
      const int64_t W = dp->size();
      auto ranks = [](int64_t n) { return fmt::format("{} {}", n, n == 1 ? "process" : "processes"); };
      fail("resume_from_checkpoint {}: the checkpoint was written by {}{} × per_device_train_batch_size {} ({} rows per micro-batch), "
           "this run is {}{} × {} ({} rows); {}",
           dir, ranks(saved_world), st.data_parallel_recorded ? " (data parallel)" : "", saved_b, rows, ranks(W),
           tp() > 1 ? " (data parallel)" : "", cfg.per_device_train_batch_size, micro_rows(),
           rows % W == 0 ? fmt::format("resume with --per_device_train_batch_size {} on {} (the data order and the position in it depend on it), "
                                       "or start a new run", rows / W, ranks(W))
                         : fmt::format("resume on a number of data-parallel processes that divides {}, or start a new run", rows));
    }
  }
  for (const char* field : {"seed", "method", "train_items", "train_sampling_strategy", "gradient_accumulation_steps", "dataloader_drop_last"}) {
    if (!saved.contains(field) || saved[field] == now[field]) continue;
    const bool option = std::string(field) != "method" && std::string(field) != "train_items";
    fail("resume_from_checkpoint {}: the checkpoint was written with {} = {}, this run has {} = {}; {}", dir, field, saved[field].dump(), field,
         now[field].dump(),
         option ? fmt::format("resume with --{} {} (the data order and the position in it depend on it), or start a new run", field,
                              saved[field].is_string() ? saved[field].get<std::string>() : saved[field].dump())
                : std::string(field) == "train_items"
                    ? "the training data changed since the checkpoint: resume with the same dataset and max_length, or start a new run"
                    : "resume with the same trainer, or start a new run");
  }
}

// What a run with micro-batches of `batch` rows will still allocate (AdamW's moments, the accumulation buffers, the
// largest program's arena: planned, not allocated, by compiling it; the frozen models' working memory) against
// what the process may still use. nullopt: the method does not know its largest program.
std::optional<Trainer::State::MemoryPlan> Trainer::State::plan_memory(int64_t batch) {
  const std::optional<graph::Graph> g = method->largest_program(model, batch);
  if (!g) return std::nullopt;
  // Compiled on its own, not through the cache, so that the run's program counts stay those of its batches; a
  // compile plans and lowers but allocates nothing.
  const uint64_t arena = backend->compile(*g)->arena_bytes();
  const FrozenMemory frozen = method->frozen_memory(batch);
  // f32 elements: of this rank's masters (a shard of them under FSDP), of every trained parameter.
  uint64_t own = 0, whole_f32 = 0;
  for (const auto& [name, w] : master) own += static_cast<uint64_t>(w.numel()) * 4;
  for (const auto& [name, shape] : trained) whole_f32 += static_cast<uint64_t>(shape_numel(shape)) * 4;
  // Without bf16 the masters share the compute weights' storage, counted once: as masters (whole), or under FSDP as
  // compute weights (the masters are views of them).
  const bool shared = !cfg.bf16;
  uint64_t compute_bytes = 0;
  for (const auto& [name, w] : compute)
    if (!shared || fsdp() || !trained.count(name)) compute_bytes += static_cast<uint64_t>(w.nbytes());
  const uint64_t masters = shared && fsdp() ? 0 : own;
  const uint64_t moments = opt.exp_avg().empty() ? 2 * own : 0;
  // The micro-batches' gradients are summed whole on each rank, also under FSDP (reduce-scattered once per step).
  const uint64_t accumulation = cfg.gradient_accumulation_steps > 1 ? whole_f32 : 0;
  MemoryPlan p;
  p.more = moments + accumulation + arena + frozen.arena;
  const Backend::Memory m = backend->memory();
  p.budget = {m.available, m.source, m.total};
  if (comm.local_size() > 1 && backend->host_memory()) {  // the ranks on this machine share its memory
    p.budget.available /= static_cast<uint64_t>(comm.local_size());
    p.budget.source += fmt::format(", shared by {} ranks on this machine", comm.local_size());
  }
  p.held = fmt::format("compute weights {}, f32 masters {}{}", format_bytes(compute_bytes), format_bytes(masters),
                       frozen.weights ? ", frozen models " + format_bytes(frozen.weights) : std::string());
  p.parts = fmt::format("AdamW moments {}, gradient accumulation {}, the largest program's working memory {} ({} × {} tokens){}",
                        format_bytes(moments), format_bytes(accumulation), format_bytes(arena), g->nodes.empty() ? 0 : shape_rows(*g),
                        shape_tokens(*g), frozen.arena ? ", the frozen models' working memory " + format_bytes(frozen.arena) : std::string());
  return p;
}

// Before the first step: a run that cannot fit is refused with the figures and the options that shrink it, or,
// with auto_find_batch_size, runs with the largest per_device_train_batch_size that fits (a bisection over the
// plans, no out-of-memory-and-retry). TRL_SKIP_MEMORY_CHECK=1 skips the check.
void Trainer::State::check_memory(bool resumed) {
  if (const char* e = std::getenv("TRL_SKIP_MEMORY_CHECK"); e && std::string(e) == "1") return;
  std::optional<MemoryPlan> p = plan_memory(cfg.per_device_train_batch_size);
  if (!p) return;
  // A resumed run keeps its checkpoint's batch size (the data order depends on it).
  if (!p->fits() && cfg.auto_find_batch_size && !resumed && cfg.per_device_train_batch_size > 1) {
    // Invariant: `too_large` does not fit; `fits` does (0: none known yet). Each probe compiles one plan.
    int64_t fits = 0, too_large = cfg.per_device_train_batch_size;
    std::optional<MemoryPlan> best, smallest;
    while (too_large - fits > 1) {
      const int64_t mid = fits + (too_large - fits) / 2;
      std::optional<MemoryPlan> probe = plan_memory(mid);
      if (mid == 1) smallest = probe;
      if (probe->fits()) fits = mid, best = std::move(probe);
      else too_large = mid;
    }
    // Every rank must train with the same batch size: the smallest any of them found.
    if (const int64_t agreed = comm.min(fits); agreed != fits) fits = agreed, best = fits > 0 ? plan_memory(fits) : std::nullopt;
    if (fits > 0 && is_main()) {
      std::fprintf(stderr, "[trl] auto_find_batch_size: per_device_train_batch_size %lld needs %s more, %s is available; %lld fits\n",
                   static_cast<long long>(cfg.per_device_train_batch_size), format_bytes(p->more).c_str(), format_bytes(p->budget.available).c_str(),
                   static_cast<long long>(fits));
    }
    if (fits > 0) {
      cfg.per_device_train_batch_size = fits;
      p = std::move(best);
    } else {
      p = std::move(smallest);  // not even one row fits: the refusal gives one row's figures
    }
  }
  if (!p->fits())
    fail("{}: this run does not fit in memory: it holds {} now and needs {} more ({}), but {} is available ({}). Make it fit with "
         "--gradient_checkpointing (about one layer's activations instead of all), a smaller --per_device_train_batch_size with more "
         "--gradient_accumulation_steps (the same effective batch){}, or a smaller --max_length; TRL_SKIP_MEMORY_CHECK=1 skips this check",
         method->name(), p->held, format_bytes(p->more), p->parts, format_bytes(p->budget.available), p->budget.source,
         cfg.auto_find_batch_size ? std::string() : " or --auto_find_batch_size");
  // A device backend is named, so a run says where it trains (the host backends' line stays as it was).
  const std::string where = backend->host_memory() ? std::string() : " on " + backend->name();
  if (is_main())
    std::fprintf(stderr, "[trl] memory%s: holds %s; needs %s more (%s); %s available (%s)\n", where.c_str(), p->held.c_str(), format_bytes(p->more).c_str(),
                 p->parts.c_str(), format_bytes(p->budget.available).c_str(), p->budget.source.c_str());
}

// Resume: weights, moments, step, log and the position in the data order.
void Trainer::State::resume(const std::string& spec) {
  std::string dir = spec;
  if (dir == "last" || dir == "true" || dir == "True") {
    const auto all = list_checkpoints(cfg.output_dir);
    if (all.empty()) fail("resume_from_checkpoint: no checkpoint-* folder in {}", cfg.output_dir);
    dir = all.back().second.string();
  }
  const std::string opt_file = (stdfs::path(dir) / "optimizer.safetensors").string(), state_file = (stdfs::path(dir) / "trainer_state.json").string();
  if (!stdfs::is_regular_file(opt_file) || !stdfs::is_regular_file(state_file))
    fail("resume_from_checkpoint {}: not a checkpoint (needs optimizer.safetensors and trainer_state.json)", dir);
  const SavedTrainerState st = read_trainer_state(state_file);
  // auto_find_batch_size resumes with the batch size the checkpoint's run found (as Transformers does).
  if (cfg.auto_find_batch_size && st.per_device_train_batch_size) cfg.per_device_train_batch_size = *st.per_device_train_batch_size;
  check_resumed_layout(st, dir);
  const SafeTensorsFile f = SafeTensorsFile::open(opt_file);
  // The checkpoint holds the whole state, whatever the world size, tp_size and fsdp_size of the run that wrote it.
  // This rank's part of a tensor: its tensor-parallel slice (the tensor itself without tensor parallel).
  auto local = [&](const std::string& part, const std::string& name) { return tensor_parallel_slice(name, f.get(part + name), model.tensor_parallel()); };
  // A loaded master or compute copy goes into the tensor the model, the method and AdamW share (Backend::upload_into:
  // in place on a device too, so every holder sees it); a moment becomes a tensor of the backend's memory.
  auto moment = [&](const Tensor& host, const std::string& name) { return backend->host_memory() ? host.clone() : backend->upload(host, name); };
  TensorMap m, v;
  for (const auto& [name, shape] : trained) {
    for (const char* part : {"master/", "exp_avg/", "exp_avg_sq/"}) {
      if (!f.contains(part + name)) fail("resume_from_checkpoint {}: {} has no '{}{}'", dir, opt_file, part, name);
      if (const Shape saved = f.get(part + name).shape(); saved != whole_shape(name))
        fail("resume_from_checkpoint {}: {}'s '{}{}' is {}, the model's {} is {}: a checkpoint of another model", dir, opt_file, part, name,
             shape_str(saved), name, shape_str(whole_shape(name)));
    }
    if (fsdp()) {  // the compute weight (in an f32 run the storage of this rank's master pieces); pieces below
      compute[name].copy_from(local("master/", name));
      continue;
    }
    const Tensor w = local("master/", name);
    backend->upload_into(master.at(name), w);
    m[name] = moment(local("exp_avg/", name), "exp_avg of " + name);
    v[name] = moment(local("exp_avg_sq/", name), "exp_avg_sq of " + name);
    if (cfg.bf16) backend->upload_into(compute[name], w.to(DType::BF16));
  }
  if (fsdp())
    for (const dist::FlatShards::Piece& piece : shards->pieces()) {
      auto part_of = [&](const std::string& part) {
        const Tensor t = local(part, piece.name);
        return t.reshape({t.numel()}).slice_flat(piece.offset, {piece.length});
      };
      if (cfg.bf16) master.at(piece.name).copy_from(part_of("master/"));
      m[piece.name] = part_of("exp_avg/").clone();
      v[piece.name] = part_of("exp_avg_sq/").clone();
    }
  global_step = st.global_step;
  method->load_state(dir);
  opt.set_state(std::move(m), std::move(v), st.optimizer_steps);
  tokens_seen = st.num_tokens;
  log_history = st.log_history;
  if (is_main()) std::fprintf(stderr, "[trl] resumed from %s at step %lld\n", dir.c_str(), static_cast<long long>(global_step));
}

void Trainer::State::start_log() {
  log_start_step = global_step;
  // A logging_dir that cannot be a folder fails now, before the first step, not at the first entry.
  if (!wants_tensorboard() || !is_main() || cfg.logging_dir.empty()) return;
  std::error_code ec;
  stdfs::path p = stdfs::absolute(cfg.logging_dir, ec);
  while (!p.empty() && !stdfs::exists(p, ec) && p != p.parent_path()) p = p.parent_path();
  if (!stdfs::is_directory(p, ec) || ::access(p.c_str(), W_OK) != 0)
    fail("--logging_dir {}: {} is {}: TensorBoard's event files cannot go there; give a folder you can write", cfg.logging_dir, p.string(),
         stdfs::is_directory(p, ec) ? "a folder this process cannot write" : "not a folder");
}

bool Trainer::State::wants_tensorboard() const {
  return std::any_of(cfg.report_to.begin(), cfg.report_to.end(), [](const std::string& r) { return r == "tensorboard" || r == "all"; });
}

void Trainer::State::take_over_run_files() {
  if (run_files_taken) return;
  run_files_taken = true;
  if (!is_main()) return;
  std::error_code ec;
  const std::string state = out_path("trainer_state.json");
  if (stdfs::exists(state, ec)) {
    std::fprintf(stderr, "[trl] %s holds an earlier run's trainer_state.json: this run replaces it, log.jsonl and completions.jsonl\n",
                 cfg.output_dir.c_str());
    if (!stdfs::remove(state, ec) && ec) fail("{}: cannot remove an earlier run's file: {}", state, ec.message());
  }
  write_text_file_atomic(out_path("log.jsonl"), jsonl(log_history));
  // completions.jsonl: the rows of the steps this run keeps (a resume from checkpoint-N: steps <= N).
  const std::string completions = out_path("completions.jsonl");
  if (!stdfs::exists(completions, ec)) return;
  std::string kept;
  if (log_start_step > 0) {
    std::istringstream in(read_text_file(completions));
    for (std::string line; std::getline(in, line);) {
      const ojson row = ojson::parse(line, nullptr, false);
      if (row.is_object() && row.contains("step") && row["step"].is_number_integer() && row["step"].get<int64_t>() <= log_start_step) kept += line + "\n";
    }
  }
  write_text_file_atomic(completions, kept);
}

void Trainer::State::log(ojson e) {
  e["epoch"] = static_cast<double>(global_step) / static_cast<double>(steps_per_epoch());
  e["step"] = global_step;
  const std::string line = e.dump() + "\n";
  open_tensorboard();     // before the run takes output_dir over: a folder that cannot be made leaves the earlier run's files
  take_over_run_files();  // before the entry joins log_history: the rewrite holds the entries before it
  log_history.push_back(std::move(e));  // every rank keeps the history (TrainOutput), only rank 0 writes it
  if (!is_main()) return;
  if (on_log) on_log(log_history.back());
  try {
    append_text_file(out_path("log.jsonl"), line);
  } catch (const Error& err) {
    fail("logging step {} failed: {}; {}", global_step, err.what(), resume_advice(is_disk_full_message(err.what())));
  }
  if (cfg.progress && !isatty(2)) std::fprintf(stderr, "%s", line.c_str());
  log_to_tensorboard(log_history.back());
}

// report_to tensorboard (or all): every log entry's numbers as scalars, and the arguments as text first, into
// logging_dir (Transformers' default: output_dir/runs/<Mon DD_HH-MM-SS>_<host>).
void Trainer::State::open_tensorboard() {
  if (tensorboard || !wants_tensorboard() || !is_main()) return;
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  {
    std::string dir = cfg.logging_dir;
    if (dir.empty()) {
      char host[256] = {0}, when[64] = {0};
      if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
      const std::time_t t = std::time(nullptr);
      std::tm local{};
      localtime_r(&t, &local);
      std::strftime(when, sizeof(when), "%b%d_%H-%M-%S", &local);
      dir = out_path(fmt::format("runs/{}_{}", when, host));
    }
    tensorboard = std::make_unique<TensorBoardWriter>(dir, now);
    tensorboard->add_text("args", training_arguments_json(cfg).dump(2), 0, now);
    std::fprintf(stderr, "[trl] TensorBoard: %s (tensorboard --logdir %s)\n", tensorboard->path().c_str(), dir.c_str());
  }
}

void Trainer::State::log_to_tensorboard(const ojson& e) {
  if (!tensorboard) return;
  tensorboard->add_log_entry(e, std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
}

void Trainer::State::append_completions(const std::string& lines) {
  take_over_run_files();
  if (is_main()) append_text_file(out_path("completions.jsonl"), lines);
}

// The micro-batches of step `within` of the epoch's `order`. Micro-batch k is the k-th run of micro_rows() items
// of the order (the last of an epoch may be shorter), and rank r takes its r-th run of per_device_train_batch_size
// items (accelerate's batch-sampler sharding): together the ranks see exactly the micro-batches one process with
// per_device_train_batch_size × world_size would.
StepItems Trainer::State::step_items(const std::vector<size_t>& order, int64_t within) const {
  const int64_t ga = cfg.gradient_accumulation_steps, bsz = cfg.per_device_train_batch_size, rows = micro_rows();
  const int64_t n = static_cast<int64_t>(order.size()), r = dp->rank();
  StepItems s;
  for (int64_t k = within * ga; k < std::min(micro_batches(), (within + 1) * ga); ++k) {
    const int64_t end = std::min(n, (k + 1) * rows);
    s.rows.push_back(end - k * rows);
    s.local.emplace_back();
    for (int64_t i = k * rows + r * bsz; i < std::min(end, k * rows + (r + 1) * bsz); ++i) s.local.back().push_back(order[static_cast<size_t>(i)]);
  }
  return s;
}

// The whole f32 masters on rank 0 where saving converts them (saving_needs_masters), else nothing (every rank calls).
TensorMap Trainer::State::whole_masters_for_saving() const { return saving_needs_masters() ? join_slices(whole(master)) : TensorMap{}; }

// The trained weights, whole, in the save dtype, on rank 0 (every rank calls: a collective under tensor parallel).
// A compute weight in the save dtype is the master itself (an f32 run) or the master rounded to bf16 (AdamW writes
// the bf16 copies so): saved as it is instead of converting a second copy of every weight (1.19 GB for Qwen3-0.6B
// at the peak of a run). Otherwise the whole master (`whole_master`, on rank 0) is converted.
TensorMap Trainer::State::weights_to_save(const TensorMap& whole_master) const {
  TensorMap ready;
  for (const auto& [name, shape] : trained)
    if (const Tensor& c = compute.at(name); c.dtype() == save_dtype_of(name)) ready[name] = c;
  TensorMap out = join_slices(to_host(ready));
  if (!is_main()) return {};
  for (const auto& [name, shape] : trained)
    if (!out.count(name)) out[name] = whole_master.at(name).to(save_dtype_of(name));
  return out;
}

// Whether saving the model converts a master (a compute weight not in the save dtype).
bool Trainer::State::saving_needs_masters() const {
  for (const auto& [name, shape] : trained)
    if (compute.at(name).dtype() != save_dtype_of(name)) return true;
  return false;
}

// Micro-batch k of n: a single micro-batch's gradients are used where they are (views into the arena, consumed by
// the optimizer before the next program runs); several are summed into `accumulated`.
void Trainer::State::add_gradients(const std::map<std::string, Tensor>& out, size_t k, size_t n) {
  for (const auto& [name, shape] : trained) {
    const auto it = out.find("grad." + name);
    if (it == out.end()) fail("{}: micro-batch {} has no gradient for {}", method->name(), k, name);
    const Tensor& grad = it->second;
    if (grad.dtype() != DType::F32 || grad.shape() != shape)
      fail("{}: the gradient of {} is {} {}, the parameter f32 {}", method->name(), name, dtype_name(grad.dtype()), shape_str(grad.shape()),
           shape_str(shape));
    if (n == 1) {
      grads[name] = grad;
      continue;
    }
    if (!accumulated.count(name)) accumulated[name] = backend->allocate(DType::F32, grad.shape(), "the accumulated gradient of " + name);
    Tensor& acc_t = accumulated.at(name);
    backend->accumulate(acc_t, grad, /*first=*/k == 0);
    grads[name] = acc_t;
  }
}

// Global-norm clipping; returns the norm before clipping (the logged grad_norm, as in Transformers). Under tensor
// parallel the squares of the split parameters are summed over the ranks, those whole on every rank counted once.
double Trainer::State::clip_gradients(double step_loss) {
  double sq[2] = {0, 0};  // whole, split
  std::vector<Tensor> all;
  std::vector<int> group_of;
  for (const auto& [name, g] : grads) all.push_back(g), group_of.push_back(tp() > 1 && tensor_parallel_axis(name) >= 0 ? 1 : 0);
  const std::vector<double> sums = backend->sum_of_squares(all, group_of);  // where the gradients are: 1 or 2 come back
  for (size_t i = 0; i < sums.size(); ++i) sq[i] = sums[i];
  if (fsdp()) shard_group->all_reduce(sq, 2, DType::F64, dist::ReduceOp::Sum);  // the shards' parts (the replicas hold the same)
  if (tp_group) sq[1] = tp_group->sum(sq[1]);
  const double norm = std::sqrt(sq[0] + sq[1]);
  if (!std::isfinite(norm)) fail("training step {}: the gradient norm is {} (the loss was {})", global_step + 1, norm, step_loss);
  if (cfg.max_grad_norm > 0 && norm > cfg.max_grad_norm) {
    backend->scale(all, static_cast<float>(cfg.max_grad_norm / (norm + 1e-6)));  // `all` shares the gradients' storage
  }
  return norm;
}

StepResult Trainer::State::train_step(const std::vector<size_t>& order, MetricWindow& metrics,
                                      const std::function<void(int64_t, const TensorMap&)>& pre_optimizer) {
  const auto t_step = Clock::now();
  const double tp_before = tp_seconds;
  StepResult r;
  const StepItems items = step_items(order, global_step % steps_per_epoch());
  const size_t filled = static_cast<size_t>(std::count_if(items.local.begin(), items.local.end(), [](const auto& m) { return !m.empty(); }));
  size_t k = 0;
  MethodContext ctx = context();
  if (dp->size() > 1) ctx.micro_rows = items.rows;
  // LoRA dropout: a mask stream of its own for every micro-batch of every step on every data-parallel rank (the
  // seed advances after each micro-batch's gradients), the same on a resumed run.
  const auto dropout = compute.find(kDropoutSeed);
  auto set_dropout_seed = [&](size_t micro) {
    if (dropout == compute.end()) return;
    Tensor seed = Tensor::zeros(DType::I32, {2});
    int32_t* sd = seed.mutable_data_as<int32_t>();
    sd[0] = static_cast<int32_t>(static_cast<uint32_t>(cfg.seed) ^ (static_cast<uint32_t>(dp->rank()) * 0x9E3779B9u));
    sd[1] = static_cast<int32_t>(static_cast<uint32_t>(global_step) * 4096u + static_cast<uint32_t>(micro));
    dropout->second = backend->host_memory() ? seed : backend->upload(seed, kDropoutSeed);
  };
  set_dropout_seed(0);
  const MethodStep m = method->step(items.local, ctx, metrics, [&](const std::map<std::string, Tensor>& out) {
    add_gradients(out, k++, filled);
    set_dropout_seed(k);
  });
  if (k != filled) fail("{}: the step handed gradients for {} of its {} micro-batches", method->name(), k, filled);
  r.data_seconds = m.data_seconds;
  r.loss = m.loss;
  int64_t tokens = m.tokens;
  if (comm.size() > 1) {
    // The ranks' shares of the loss and their gradients sum to the step's; Ctrl-C on one rank stops them all.
    const auto t_comm = Clock::now();
    if (filled == 0)  // this rank had no rows in this (last, short) step: it adds nothing
      for (const auto& [name, shape] : trained) {
        grads[name] = backend->allocate(DType::F32, shape, "the gradient of " + name);
        backend->zero(grads[name]);
      }
    // Tensor-parallel ranks share their rows, loss and tokens: the sums run over the data-parallel ranks.
    double totals[3] = {r.loss, static_cast<double>(tokens), g_interrupted ? 1.0 : 0.0};
    dp->all_reduce(totals, 3, DType::F64, dist::ReduceOp::Sum);
    r.loss = totals[0], tokens = static_cast<int64_t>(totals[1]), r.interrupted = totals[2] > 0;
    if (tp_group) r.interrupted = tp_group->any(r.interrupted);
    if (fsdp()) reduce_gradients_to_shard();
    else if (dp->size() > 1) {
      std::vector<Tensor> all;
      for (const auto& [name, g] : grads) all.push_back(g);  // a std::map: the same order on every rank
      backend->all_reduce(all, *dp);
    }
    r.comm_seconds = std::chrono::duration<double>(Clock::now() - t_comm).count();
  } else {
    r.interrupted = g_interrupted;
  }
  tokens_seen += tokens;
  r.grad_norm = clip_gradients(r.loss);
  if (pre_optimizer) pre_optimizer(global_step + 1, grads);
  const auto [min_lr_rate, num_cycles] = scheduler_rates(cfg);
  r.lr = scheduled_lr(cfg.lr_scheduler_type, cfg.learning_rate, global_step, total_steps(), warmup(), min_lr_rate, num_cycles);
  opt.step(master, grads, r.lr, *backend, cfg.bf16 ? (fsdp() ? &compute_pieces : &compute) : nullptr);
  grads.clear();  // views into the program's arena must not keep a replaced arena alive
  if (fsdp()) {  // every rank's updated shard into every rank's compute weights
    const auto t_gather = Clock::now();
    dist::all_gather_flat(*shard_group, *shards, compute);
    r.comm_seconds += std::chrono::duration<double>(Clock::now() - t_gather).count();
  }
  r.comm_seconds += tp_seconds - tp_before;  // the programs' tensor-parallel all-reduces
  ++global_step;
  // Under FSDP no rank holds the whole masters: the method sees the whole compute weights (the masters themselves in
  // an f32 run, rounded to bf16 in a bf16 one).
  method->after_step(global_step, fsdp() ? compute : master);
  r.step_seconds = std::chrono::duration<double>(Clock::now() - t_step).count();
  return r;
}

TrainOutput Trainer::train() {
  if (!method_) fail("Trainer::train: no training method attached");
  State& s = *s_;
  const TrainingArguments& c = s.cfg;
  std::error_code ec;
  stdfs::create_directories(c.output_dir, ec);
  if (ec) fail("output_dir {}: cannot create: {}", c.output_dir, ec.message());
  if (!c.resume_from_checkpoint.empty()) s.resume(c.resume_from_checkpoint);
  {
    MethodContext ctx = s.context();
    method_->before_training(ctx);
  }
  s.check_memory(!c.resume_from_checkpoint.empty());
  s.on_log = on_log;
  s.start_log();
  const int64_t total = s.total_steps(), spe = s.steps_per_epoch();
  TrainOutput result;
  const bool tty = c.progress && isatty(2) && s.is_main();
  const auto t_start = Clock::now();
  const int64_t start_step = s.global_step, tokens_at_start = s.tokens_seen;
  MetricWindow metrics;
  double window_loss = 0, run_loss = 0;
  int64_t window_steps = 0, saved_step = -1, run_steps = 0;
  std::vector<size_t> order;
  int64_t order_epoch = -1;
  {
    const SigintScope sigint;
    while (s.global_step < total) {
      if (s.global_step / spe != order_epoch) order_epoch = s.global_step / spe, order = s.order(order_epoch);
      const StepResult r = s.train_step(order, metrics, on_pre_optimizer_step);
      if (s.fsdp() && s.global_step == start_step + 1) s.report_shard();  // AdamW allocated its moments in this step
      window_loss += r.loss, ++window_steps;
      run_loss += r.loss, ++run_steps;
      if (on_step)
        on_step(ojson{{"loss", r.loss}, {"grad_norm", r.grad_norm}, {"learning_rate", r.lr}, {"num_tokens", s.tokens_seen},
                      {"step_seconds", r.step_seconds}, {"data_seconds", r.data_seconds}, {"step", s.global_step}, {"max_steps", total},
                      {"epoch", static_cast<double>(s.global_step) / static_cast<double>(spe)}});
      const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
      const double tps = static_cast<double>(s.tokens_seen - tokens_at_start) / std::max(elapsed, 1e-9);
      if (tty) print_progress(s.global_step, total, start_step, elapsed, r.loss, r.lr, tps);
      if (s.global_step % c.logging_steps == 0 || s.global_step == total || (c.logging_first_step && s.global_step == 1)) {
        ojson e{{"loss", window_loss / static_cast<double>(window_steps)}, {"grad_norm", r.grad_norm}, {"learning_rate", r.lr}};
        const ojson means = s.global_means(metrics);
        for (const auto& [name, v] : means.items()) e[name] = v;
        e["num_tokens"] = s.tokens_seen;
        e["train_tokens_per_s"] = tps;
        e["step_seconds"] = r.step_seconds;
        e["data_seconds"] = r.data_seconds;
        if (s.comm.size() > 1) e["comm_seconds"] = r.comm_seconds;
        s.log(std::move(e));
        metrics.clear();
        window_loss = 0, window_steps = 0;
      }
      if ((c.eval_strategy == "steps" && s.global_step % c.eval_steps.value_or(c.logging_steps) == 0) ||
          (c.eval_strategy == "epoch" && s.global_step % spe == 0))
        s.log(evaluate());
      // As in Transformers, the last step too is saved when it is a multiple of save_steps.
      if (s.global_step % c.save_steps == 0) s.save_checkpoint(), saved_step = s.global_step;
      // One process: Ctrl-C during this step (its callbacks included); several: as the ranks agreed in the step.
      if (s.comm.size() > 1 ? r.interrupted : g_interrupted.load()) {
        const std::string dir = saved_step == s.global_step ? s.out_path(fmt::format("checkpoint-{}", s.global_step)) : s.save_checkpoint();
        if (s.is_main()) std::fprintf(stderr, "\n[trl] interrupted: saved %s; resume with --resume_from_checkpoint %s\n", dir.c_str(), dir.c_str());
        result.interrupted = true;
        break;
      }
      // A stop asked for by the caller (TrainerControl.should_training_stop): the run ends here as at its last step.
      if (stop_requested && stop_requested()) break;
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  if (!result.interrupted) {
    RunSummary summary;
    summary.title = fmt::format("trl.cpp {}: {}", method_->name(), c.output_dir);
    summary.model = s.model_name, summary.dataset = c.dataset_name, summary.output_dir = c.output_dir;
    summary.steps_done = s.global_step, summary.total_steps = total;
    summary.epochs = static_cast<double>(s.global_step) / static_cast<double>(spe);
    summary.tokens = s.tokens_seen;
    summary.train_seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
    summary.programs = s.programs->stats();
    summary.completions = method_->report_samples();
    s.save_final(c.report ? &summary : nullptr);
  }
  result.global_step = s.global_step;
  // As Transformers' TrainOutput: the mean of the steps' losses in this run (a resumed run's own steps).
  result.training_loss = run_steps ? run_loss / static_cast<double>(run_steps) : 0;
  result.log_history = s.log_history;
  result.programs = s.programs->stats();
  return result;
}

}  // namespace trl

namespace trl {

BaseTrainer::BaseTrainer() = default;
BaseTrainer::~BaseTrainer() = default;

TrainOutput BaseTrainer::train() {
  trainer_->on_step = on_step;
  trainer_->on_log = on_log;
  trainer_->stop_requested = stop_requested;
  trainer_->on_pre_optimizer_step = on_pre_optimizer_step;
  return trainer_->train();
}
nlohmann::ordered_json BaseTrainer::evaluate_metrics() { return trainer_->evaluate(); }
void BaseTrainer::save_model(const std::string& dir) const { trainer_->save_model(dir); }
const TensorMap& BaseTrainer::master_weights() const { return trainer_->master_weights(); }
TensorMap BaseTrainer::master_weights_on_host() const { return trainer_->to_host(trainer_->master_weights()); }
Backend::Transfers BaseTrainer::transfers() const { return trainer_->transfers(); }
const ProgramCacheStats& BaseTrainer::program_stats() const { return trainer_->program_stats(); }

}  // namespace trl

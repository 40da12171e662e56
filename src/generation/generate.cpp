#include "trl/generation/generate.h"
#include "core/json_text.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "trl/backend/registry.h"
#include "trl/core/collectives.h"
#include "trl/core/error.h"
#include "core/fs.h"
#include "core/rng.h"
#include "trl/runtime/shapes.h"
#include "trl/tokenizer/chat_template.h"
#include "trl/tokenizer/tokenizer.h"

namespace trl {

namespace {

using json = nlohmann::json;

std::vector<int32_t> ids_field(const json& v, const std::string& what) {
  std::vector<int32_t> out;
  if (v.is_number_integer()) out.push_back(v.get<int32_t>());
  else if (v.is_array())
    for (const auto& x : v) {
      if (!x.is_number_integer()) fail("{}: expected token ids, got {}", what, v.dump());
      out.push_back(x.get<int32_t>());
    }
  else if (!v.is_null()) fail("{}: expected a token id or a list of them, got {}", what, v.dump());
  return out;
}

}  // namespace

GenerationConfig GenerationConfig::from_model_dir(const std::string& dir) {
  GenerationConfig c;
  const std::string path = (std::filesystem::path(dir) / "generation_config.json").string();
  if (dir.empty() || !std::filesystem::exists(path)) return c;
  const json j = parse_json(read_text_file(path), path);
  if (!j.is_object()) fail("{}: expected a JSON object", path);
  c.source = path;
  // Each field with the type Transformers gives it; a wrong one is named with what it holds.
  auto field = [&](const char* key, auto& out, const char* what) {
    if (!j.contains(key) || j[key].is_null()) return;
    const json& v = j[key];
    using T = typename std::decay_t<decltype(out)>::value_type;
    bool ok;
    if constexpr (std::is_same_v<T, bool>) ok = v.is_boolean();
    else if constexpr (std::is_integral_v<T>) ok = v.is_number_integer();
    else ok = v.is_number();
    if (!ok) fail("{}: field '{}' must be {}, got {}", path, key, what, v.dump());
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<T>::max())
                                 : v.get<int64_t>() < static_cast<int64_t>(std::numeric_limits<T>::min()))
        fail("{}: field '{}' is out of range: {}", path, key, v.dump());
    }
    out = v.get<T>();
  };
  field("max_new_tokens", c.max_new_tokens, "an integer");
  field("max_length", c.max_length, "an integer");
  field("do_sample", c.do_sample, "true or false");
  field("temperature", c.temperature, "a number");
  field("top_k", c.top_k, "an integer");
  field("top_p", c.top_p, "a number");
  field("min_p", c.min_p, "a number");
  field("repetition_penalty", c.repetition_penalty, "a number");
  if (j.contains("eos_token_id")) c.eos_token_id = ids_field(j["eos_token_id"], path + ": eos_token_id");
  field("pad_token_id", c.pad_token_id, "an integer");
  return c;
}

struct Generator::State {
  explicit State(const std::string& device_name) : device(make_backend(device_name)), reference(make_backend("reference")) {}
  std::unique_ptr<Backend> device;     // the model's device: compiled programs
  std::unique_ptr<Backend> reference;  // disable_compile: the oracle
  ProgramCache compiled{*device, 32};
  ProgramCache oracle{*reference, 8};
  std::map<std::tuple<bool, int64_t, int64_t>, std::vector<Tensor>> caches;  // (compiled, batch, cache length) -> k0, v0, k1, ...
  std::map<std::pair<int64_t, int64_t>, graph::Graph> decode_graphs;   // traced once per (batch, cache length)
  TensorMap device_weights;  // a device backend: the model's weights in its memory (uploaded at the first call)

  // The weights the programs on `backend` bind: the model's own on a host backend; on a device, the model's tensors
  // already there (a trainer's compute weights, updated in place) and uploads of the others, made once.
  const TensorMap& weights(const CausalLM& model, Backend& backend) {
    if (backend.host_memory()) {
      for (const auto& [name, w] : model.weights())
        if (w.is_device())
          fail("generate: the model's weights are on a device ({}), and disable_compile runs the host oracle: generate with "
               "disable_compile false there", w.device_label());
      return model.weights();
    }
    if (device_weights.empty()) device_weights = to_backend(backend, model.weights());
    return device_weights;
  }
};

namespace {

template <typename T, typename U>
T pick(const std::optional<T>& user, const std::optional<T>& model_default, U fallback) {
  return user ? *user : model_default ? *model_default : T(fallback);
}

// ---- phase 1: the options, resolved against the model's generation_config.json and checked ----
struct Settings {
  SamplingParams sampling;
  std::vector<int32_t> eos;
  int32_t pad = 0;
};

Settings resolve_settings(const GenerationConfig& user, const GenerationConfig& d, const ModelConfig& mc, const Tokenizer* tokenizer) {
  Settings st;
  SamplingParams& sp = st.sampling;
  sp.do_sample = pick(user.do_sample, d.do_sample, false);
  sp.temperature = pick(user.temperature, d.temperature, 1.0f);
  sp.top_k = pick(user.top_k, d.top_k, int64_t{50});
  sp.top_p = pick(user.top_p, d.top_p, 1.0f);
  sp.min_p = user.min_p ? user.min_p : d.min_p;
  sp.repetition_penalty = pick(user.repetition_penalty, d.repetition_penalty, 1.0f);
  // A value the user did not give came from the model's generation_config.json: an error about it names that file.
  auto from = [&d](const auto& given) { return given ? std::string() : d.origin(); };
  if (sp.do_sample && !(sp.temperature > 0))
    fail("generate: temperature must be > 0 when sampling, got {}{}", sp.temperature, from(user.temperature));
  if (sp.top_k < 0) fail("generate: top_k must be >= 0, got {}{}", sp.top_k, from(user.top_k));
  if (!(sp.top_p > 0 && sp.top_p <= 1)) fail("generate: top_p must be in (0, 1], got {}{}", sp.top_p, from(user.top_p));
  if (sp.min_p && !(*sp.min_p >= 0 && *sp.min_p <= 1)) fail("generate: min_p must be in [0, 1], got {}{}", *sp.min_p, from(user.min_p));
  if (!(sp.repetition_penalty > 0))
    fail("generate: repetition_penalty must be > 0, got {}{}", sp.repetition_penalty, from(user.repetition_penalty));
  st.eos = pick(user.eos_token_id, d.eos_token_id, std::vector<int32_t>{});
  st.pad = user.pad_token_id ? *user.pad_token_id : d.pad_token_id ? *d.pad_token_id : !st.eos.empty() ? st.eos[0] : 0;
  for (int32_t id : st.eos)
    if (id < 0 || id >= mc.vocab_size)
      fail("generate: eos_token_id {} is outside the vocabulary [0, {}){}", id, mc.vocab_size, from(user.eos_token_id));
  if (st.pad < 0 || st.pad >= mc.vocab_size)
    fail("generate: pad_token_id {} is outside the vocabulary [0, {}){}", st.pad, mc.vocab_size,
         user.pad_token_id ? "" : d.pad_token_id ? d.origin() : from(user.eos_token_id));
  if (user.cache_implementation != "static" && user.cache_implementation != "dynamic")
    fail("generate: cache_implementation '{}' is not \"static\" or \"dynamic\"", user.cache_implementation);
  if (user.num_return_sequences < 1) fail("generate: num_return_sequences must be >= 1, got {}", user.num_return_sequences);
  if (!user.stop_strings.empty() && tokenizer == nullptr) fail("generate: stop_strings need the tokenizer");
  return st;
}

// ---- phase 2: the rows and their shapes: B rows, prompts left-padded to P, N new tokens, a cache of S slots ----
struct Layout {
  std::vector<std::vector<int32_t>> rows;  // each prompt num_return_sequences times, consecutively (as Transformers)
  int64_t B = 0, P = 0, N = 0, S = 0, longest = 0;
};

Layout plan_layout(const std::vector<std::vector<int32_t>>& prompts, const GenerationConfig& user, const GenerationConfig& d, const ModelConfig& mc,
                   int64_t multiple) {
  if (prompts.empty()) fail("generate: no prompts");
  Layout l;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) fail("generate: prompt {} is empty (a prompt needs at least one token)", i);
    for (int32_t id : prompts[i])
      if (id < 0 || id >= mc.vocab_size) fail("generate: prompt {} holds token id {}, outside the vocabulary [0, {})", i, id, mc.vocab_size);
    for (int64_t r = 0; r < user.num_return_sequences; ++r) l.rows.push_back(prompts[i]);
    l.longest = std::max<int64_t>(l.longest, static_cast<int64_t>(prompts[i].size()));
  }
  if (multiple < 0) fail("generate: pad_to_multiple_of must be >= 0, got {}", multiple);
  l.B = static_cast<int64_t>(l.rows.size());
  l.P = padded_length(l.longest, multiple);
  if (user.max_new_tokens || (!user.max_length && d.max_new_tokens)) {
    l.N = user.max_new_tokens ? *user.max_new_tokens : *d.max_new_tokens;
  } else {
    const int64_t max_length = pick(user.max_length, d.max_length, int64_t{20});
    l.N = max_length - l.longest;
    if (l.N <= 0)
      fail("generate: max_length {}{} leaves no room after a prompt of {} tokens; set max_new_tokens", max_length,
           user.max_length || !d.max_length ? std::string() : d.origin(), l.longest);
  }
  if (l.N < 1) fail("generate: max_new_tokens must be >= 1, got {}{}", l.N, user.max_new_tokens ? std::string() : d.origin());
  l.S = padded_length(l.P + l.N, multiple);
  if (l.S > mc.max_position_embeddings)
    fail("generate: a prompt of {} tokens (bucket {}) and {} new tokens need a cache of {} positions, more than the model's "
         "max_position_embeddings ({})",
         l.longest, l.P, l.N, l.S, mc.max_position_embeddings);
  return l;
}

// What stays on the host and grows: the rows' ids so far (GenerationOutput::sequences), the [B, S] mask of filled
// cache slots, each row's last position; and the prefill's fixed-shape inputs.
struct HostRows {
  std::vector<int32_t> mask, last_pos;
  Tensor ids, prompt_mask;  // [B, P]
};

HostRows left_pad(const Layout& l, int32_t pad, GenerationOutput& out) {
  HostRows h;
  h.mask.assign(static_cast<size_t>(l.B * l.S), 0);
  h.last_pos.assign(static_cast<size_t>(l.B), 0);
  h.ids = Tensor::zeros(DType::I32, {l.B, l.P});
  h.prompt_mask = Tensor::zeros(DType::I32, {l.B, l.P});
  for (int64_t b = 0; b < l.B; ++b) {
    const auto& p = l.rows[static_cast<size_t>(b)];
    const int64_t L = static_cast<int64_t>(p.size()), off = l.P - L;
    auto& seq = out.sequences[static_cast<size_t>(b)];
    seq.assign(static_cast<size_t>(off), pad);
    seq.insert(seq.end(), p.begin(), p.end());
    for (int64_t t = 0; t < l.P; ++t) {
      h.ids.mutable_data_as<int32_t>()[b * l.P + t] = seq[static_cast<size_t>(t)];
      const int32_t m = t >= off ? 1 : 0;
      h.prompt_mask.mutable_data_as<int32_t>()[b * l.P + t] = m;
      h.mask[static_cast<size_t>(b * l.S + t)] = m;
    }
    h.last_pos[static_cast<size_t>(b)] = static_cast<int32_t>(L - 1);
  }
  return h;
}

// ---- phase 3: the static KV cache, bound by name into every prefill and decode run ----
// Its tensors (k0, v0, k1, ...; [B, S, kv heads on this rank, head_dim]) are the generator's, kept per (B, S) and
// zeroed for each call. Programs update them in place (CPU) or return new values (reference): keep() copies those.
// The cache lives in the backend's memory (kept per (batch, cache length) between calls, zeroed at each start).
class StaticKvCache {
 public:
  StaticKvCache(std::vector<Tensor>& tensors, Backend& backend, const ModelConfig& mc, int64_t B, int64_t S, DType dtype, int64_t tp_size)
      : t_(tensors), backend_(backend) {
    if (t_.empty())
      for (int64_t l = 0; l < mc.num_hidden_layers; ++l)
        for (int kv = 0; kv < 2; ++kv)
          t_.push_back(backend.allocate(dtype, {B, S, mc.num_key_value_heads / tp_size, mc.head_dim}, name(t_.size())));
    for (Tensor& t : t_) backend.zero(t);
  }
  void bind(TensorMap& in) const {
    for (size_t i = 0; i < t_.size(); ++i) in[name(i)] = t_[i];
  }
  // Outputs are read by the names the model's graphs give them ("past_key_values.<layer>.key|value"). A program
  // that wrote the cache in place returns it; one that returned other memory is copied from (on a device, within it).
  void keep(const std::vector<Tensor>& res, const graph::Graph& g) {
    for (size_t i = 0; i < t_.size(); ++i) {
      const Tensor& updated = res[g.output_index(name(i))];
      if (updated.is_device()) {
        if (updated.device_handle() != t_[i].device_handle()) t_[i] = backend_.copy(updated, name(i));
      } else if (updated.data() != t_[i].data()) {
        t_[i].copy_from(updated);
      }
    }
  }

 private:
  static std::string name(size_t i) { return fmt::format("past_key_values.{}.{}", i / 2, i % 2 == 0 ? "key" : "value"); }
  std::vector<Tensor>& t_;
  Backend& backend_;
};

// ---- the logits of the last position of every row, where the next tokens are chosen ----
// A program's logits stay in the backend's memory (row b at row b·stride + offset of the output) and
// Backend::sample chooses there: one id per row comes back. Under tensor parallel a program's logits are this rank's
// V / size columns: each rank writes its columns into zeroed host rows and one all-reduce joins them, so every rank
// chooses from the same whole rows (with the same seeds, the same tokens) on the host.
class LastLogits {
 public:
  LastLogits(Backend& backend, Backend& host, int64_t B, int64_t V, const TensorParallel& tp)
      : backend_(backend), host_(host), B_(B), V_(V), Vl_(V / tp.size), tp_(tp) {}
  void take(const Tensor& t, int64_t rows_stride, int64_t row_offset) {
    if (t.shape().empty() || t.shape().back() != Vl_)
      fail("generate: the program's logits are {}, expected a last dimension of {} (the vocabulary on this rank)", shape_str(t.shape()), Vl_);
    if (tp_.size == 1) {
      t_ = t, stride_ = rows_stride, offset_ = row_offset;
      return;
    }
    const Tensor h = to_host(backend_, t);
    Tensor joined = Tensor::zeros(DType::F32, {B_, V_});
    float* j = joined.mutable_data_as<float>();
    for (int64_t b = 0; b < B_; ++b) load_f32(h.data(), h.dtype(), (b * rows_stride + row_offset) * Vl_, Vl_, j + b * V_ + tp_.rank * Vl_);
    all_reduce_in_group(tp_.group, j, B_ * V_, DType::F32);
    t_ = joined, stride_ = 1, offset_ = 0;
  }
  // Each row's next token; the rows' ids so far go up only for a repetition penalty.
  std::vector<int32_t> choose(const SamplingParams& params, std::vector<double> uniforms, const std::vector<std::vector<int32_t>>& sequences) {
    Backend& where = t_.is_device() || backend_.host_memory() ? backend_ : host_;
    Backend::SampleRequest r;
    r.rows = B_, r.row_stride = stride_, r.row_offset = offset_, r.params = params, r.uniforms = std::move(uniforms);
    Tensor context;
    if (params.repetition_penalty != 1.0f) {
      const int64_t T = static_cast<int64_t>(sequences.at(0).size());
      context = Tensor::zeros(DType::I32, {B_, T});
      for (int64_t b = 0; b < B_; ++b)
        std::memcpy(context.mutable_data_as<int32_t>() + b * T, sequences[static_cast<size_t>(b)].data(), static_cast<size_t>(T) * sizeof(int32_t));
      context = to_backend(where, context, "the rows' ids so far");
      r.context = &context;
    }
    return where.sample(t_, r);
  }
  // output_logits: the raw rows as f32 on the host (a download on a device).
  std::vector<std::vector<float>> host_rows() {
    const Tensor h = to_host(backend_, t_);
    const int64_t V = h.shape().back();
    std::vector<std::vector<float>> rows(static_cast<size_t>(B_), std::vector<float>(static_cast<size_t>(V)));
    for (int64_t b = 0; b < B_; ++b) load_f32(h.data(), h.dtype(), (b * stride_ + offset_) * V, V, rows[static_cast<size_t>(b)].data());
    return rows;
  }

 private:
  Backend& backend_;
  Backend& host_;  // where the joined rows of tensor parallel are chosen when the model's backend is a device
  int64_t B_, V_, Vl_;
  TensorParallel tp_;
  Tensor t_;
  int64_t stride_ = 1, offset_ = 0;
};

// ---- phase 4: choosing each row's next token and when a row finishes ----
class TokenChooser {
 public:
  TokenChooser(const GenerationConfig& user, const Settings& st, uint64_t seed, int64_t B, const Tokenizer* tokenizer)
      : user_(user), st_(st), rng_(seed), unfinished_(static_cast<size_t>(B), 1), text_(static_cast<size_t>(B)), tokenizer_(tokenizer) {
    if (user.row_seeds.empty()) return;
    if (static_cast<int64_t>(user.row_seeds.size()) != B)
      fail("generate: {} row_seeds for {} rows (prompts × num_return_sequences)", user.row_seeds.size(), B);
    for (uint64_t s : user.row_seeds) row_rng_.emplace_back(s);
  }
  // This step's draw of every row: drawn for every row at every step, so a row's draws do not depend on when the
  // others finish.
  std::vector<double> uniforms() {
    std::vector<double> u(unfinished_.size());
    for (size_t r = 0; r < u.size(); ++r) {
      const uint64_t bits = row_rng_.empty() ? rng_.next() : row_rng_[r].next();
      u[r] = static_cast<double>(bits >> 11) * 0x1.0p-53;
    }
    return u;
  }
  // Appends each row's chosen token (pad for a finished one), finishes rows on eos or a stop string, and returns the
  // tokens as [B, 1] ids for the next decode.
  Tensor take(const std::vector<int32_t>& chosen, GenerationOutput& out) {
    const int64_t B = static_cast<int64_t>(chosen.size());
    Tensor next = Tensor::zeros(DType::I32, {B, 1});
    for (int64_t b = 0; b < B; ++b) {
      const size_t r = static_cast<size_t>(b);
      const int32_t tok = unfinished_[r] ? chosen[r] : st_.pad;
      next.mutable_data_as<int32_t>()[b] = tok;
      out.sequences[r].push_back(tok);
      if (!unfinished_[r]) continue;
      out.generated[r].push_back(tok);
      if (user_.streamer) user_.streamer(b, tok);
      if (std::find(st_.eos.begin(), st_.eos.end(), tok) != st_.eos.end()) finish(r, "eos", out);
      else if (hit_stop_string(r, out)) finish(r, "stop_string", out);
    }
    return next;
  }
  void interrupt(GenerationOutput& out) {
    for (size_t r = 0; r < unfinished_.size(); ++r)
      if (unfinished_[r]) finish(r, "interrupted", out);
  }
  bool all_finished() const { return std::none_of(unfinished_.begin(), unfinished_.end(), [](char c) { return c != 0; }); }

 private:
  void finish(size_t r, const char* reason, GenerationOutput& out) {
    unfinished_[r] = 0;
    out.finish_reasons[r] = reason;
  }
  // A stop string that ends inside the text this token added stops the row (the token is kept).
  bool hit_stop_string(size_t r, const GenerationOutput& out) {
    if (user_.stop_strings.empty()) return false;
    const std::string before = text_[r];
    text_[r] = tokenizer_->decode(out.generated[r]);
    const std::string& now = text_[r];
    for (const std::string& stop : user_.stop_strings) {
      if (stop.empty()) continue;
      const size_t from = before.size() >= stop.size() ? before.size() - stop.size() + 1 : 0;
      if (now.find(stop, std::min(from, now.size())) != std::string::npos) return true;
    }
    return false;
  }

  const GenerationConfig& user_;
  const Settings& st_;
  SplitMix64 rng_;
  std::vector<SplitMix64> row_rng_;
  std::vector<char> unfinished_;
  std::vector<std::string> text_;
  const Tokenizer* tokenizer_;
};

}  // namespace

Generator::Generator(const CausalLM& model)
    : model_(model), defaults_(GenerationConfig::from_model_dir(model.path())), state_(std::make_unique<State>(model.device())) {}
Generator::~Generator() = default;

const ProgramCacheStats& Generator::stats() const { return state_->compiled.stats(); }
Backend::Transfers Generator::transfers() const { return state_->device->transfers(); }

GenerationOutput Generator::generate(const std::vector<std::vector<int32_t>>& prompts, const GenerationConfig& user, const Tokenizer* tokenizer) {
  const ModelConfig& mc = model_.config();
  const Settings st = resolve_settings(user, defaults_, mc, tokenizer);
  const bool compiled = !user.disable_compile;
  ProgramCache& programs = compiled ? state_->compiled : state_->oracle;
  Backend& backend = compiled ? *state_->device : *state_->reference;
  const TensorMap& weights = state_->weights(model_, backend);
  auto up = [&](const Tensor& host, const char* name) { return to_backend(backend, host, name); };
  const Layout l = plan_layout(prompts, user, defaults_, mc, user.pad_to_multiple_of ? *user.pad_to_multiple_of : backend.auto_pad_multiple());
  const int64_t B = l.B, P = l.P, S = l.S;

  GenerationOutput out;
  out.prompt_length = P;
  out.cache_length = S;
  out.sequences.assign(static_cast<size_t>(B), {});
  out.generated.assign(static_cast<size_t>(B), {});
  out.finish_reasons.assign(static_cast<size_t>(B), "length");
  HostRows host = left_pad(l, st.pad, out);
  const bool use_cache = user.cache_implementation == "static";
  std::optional<StaticKvCache> cache;
  if (use_cache) cache.emplace(state_->caches[{compiled, B, S}], backend, mc, B, S, model_.dtype(), model_.tensor_parallel().size);
  LastLogits logits(backend, *state_->reference, B, mc.vocab_size, model_.tensor_parallel());  // a tensor-parallel rank's model runs with its group

  // The dynamic path: the whole sequence so far, every step (one program per length: the comparison point).
  auto run_full = [&](int64_t T) {
    Tensor x = Tensor::zeros(DType::I32, {B, T}), m = Tensor::zeros(DType::I32, {B, T});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        x.mutable_data_as<int32_t>()[b * T + t] = out.sequences[static_cast<size_t>(b)][static_cast<size_t>(t)];
        m.mutable_data_as<int32_t>()[b * T + t] = host.mask[static_cast<size_t>(b * S + t)];
      }
    TensorMap in = weights;
    in["input_ids"] = up(x, "input_ids"), in["attention_mask"] = up(m, "attention_mask"), in["position_ids"] = up(default_position_ids(m), "position_ids");
    const graph::Graph g = model_.forward_graph(B, T);
    const auto res = programs.get(g).run(in);
    logits.take(res[g.output_index("logits")], T, T - 1);
  };

  // Prefill: the left-padded prompts fill cache slots [0, P).
  if (use_cache) {
    TensorMap in = weights;
    in["input_ids"] = up(host.ids, "input_ids"), in["attention_mask"] = up(host.prompt_mask, "attention_mask");
    in["position_ids"] = up(default_position_ids(host.prompt_mask), "position_ids");
    in["cache_position"] = up(Tensor::from_i32(std::vector<int32_t>{0}, {1}), "cache_position");
    cache->bind(in);
    const graph::Graph g = model_.prefill_graph(B, P, S);
    const auto res = programs.get(g).run(in);
    logits.take(res[g.output_index("logits")], 1, 0);
    cache->keep(res, g);
  } else {
    run_full(P);
  }

  // Decode: a token per row per step; the next one enters cache slot P + step for every row (finished rows too, as
  // in Transformers).
  TokenChooser chooser(user, st, pick(user.seed, defaults_.seed, uint64_t{0}), B, tokenizer);
  for (int64_t step = 0; step < l.N; ++step) {
    if (user.interrupted && user.interrupted()) {
      chooser.interrupt(out);
      break;
    }
    if (user.output_logits) out.logits.push_back(logits.host_rows());
    const Tensor next = chooser.take(logits.choose(st.sampling, chooser.uniforms(), out.sequences), out);
    if (step + 1 == l.N || chooser.all_finished()) break;
    const int64_t slot = P + step;
    for (int64_t b = 0; b < B; ++b) host.mask[static_cast<size_t>(b * S + slot)] = 1;
    if (!use_cache) {
      run_full(slot + 1);
      continue;
    }
    Tensor pos = Tensor::zeros(DType::I32, {B, 1}), qpos = Tensor::zeros(DType::I32, {B, 1});
    for (int64_t b = 0; b < B; ++b) {
      pos.mutable_data_as<int32_t>()[b] = ++host.last_pos[static_cast<size_t>(b)];
      qpos.mutable_data_as<int32_t>()[b] = static_cast<int32_t>(slot);
    }
    TensorMap in = weights;
    in["input_ids"] = up(next, "input_ids"), in["position_ids"] = up(pos, "position_ids"), in["query_positions"] = up(qpos, "query_positions");
    in["attention_mask"] = up(Tensor::from_i32(host.mask, {B, S}), "attention_mask");
    in["cache_position"] = up(Tensor::from_i32(std::vector<int32_t>{static_cast<int32_t>(slot)}, {1}), "cache_position");
    cache->bind(in);
    auto g = state_->decode_graphs.find({B, S});
    if (g == state_->decode_graphs.end()) g = state_->decode_graphs.emplace(std::make_pair(B, S), model_.decode_graph(B, S)).first;
    const auto res = programs.get(g->second).run(in);  // a cache lookup every step: the counters show each reuse
    logits.take(res[g->second.output_index("logits")], 1, 0);
    cache->keep(res, g->second);
  }
  return out;
}

std::vector<ChatAnswer> greedy_chat_answers(Generator& generator, const Tokenizer& tokenizer, const std::vector<nlohmann::ordered_json>& rows,
                                            int64_t max_new_tokens) {
  GenerationConfig g;
  g.do_sample = false;
  g.max_new_tokens = max_new_tokens;
  ChatTemplateOptions co;
  co.add_generation_prompt = true;
  co.extra["enable_thinking"] = false;
  std::vector<ChatAnswer> out;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    if (!row.contains("messages") || !row["messages"].is_array() || row["messages"].size() < 2)
      fail("greedy_chat_answers: row {} is not a conversation with a user turn and an answer", i + 1);
    const nlohmann::ordered_json prompt = nlohmann::ordered_json::array({row["messages"][0]});
    ChatAnswer a;
    a.question = row["messages"][0].value("content", "");
    a.expected = row["messages"][1].value("content", "");
    const auto res = generator.generate({apply_chat_template_ids(tokenizer, prompt, co).input_ids}, g, &tokenizer);
    a.answer = tokenizer.decode(res.generated[0], true);
    a.exact = a.answer == a.expected;
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace trl

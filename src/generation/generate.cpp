#include "trl/generation/generate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>

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

// Row-wise softmax of finite scores (-inf stays 0).
std::vector<double> softmax(const std::vector<float>& s) {
  const float mx = *std::max_element(s.begin(), s.end());
  std::vector<double> p(s.size());
  double sum = 0;
  for (size_t i = 0; i < s.size(); ++i) sum += p[i] = s[i] == -INFINITY ? 0.0 : std::exp(static_cast<double>(s[i]) - mx);
  for (double& x : p) x /= sum;
  return p;
}

}  // namespace

GenerationConfig GenerationConfig::from_model_dir(const std::string& dir) {
  GenerationConfig c;
  const std::string path = (std::filesystem::path(dir) / "generation_config.json").string();
  if (dir.empty() || !std::filesystem::exists(path)) return c;
  json j;
  try {
    j = json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) fail("{}: expected a JSON object", path);
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

void process_logits(std::vector<float>& s, const std::vector<int32_t>& context, const SamplingParams& p) {
  const int64_t V = static_cast<int64_t>(s.size());
  if (p.repetition_penalty != 1.0f) {
    std::vector<char> seen(static_cast<size_t>(V), 0);
    for (int32_t id : context)
      if (id >= 0 && id < V && !seen[static_cast<size_t>(id)]) {
        seen[static_cast<size_t>(id)] = 1;
        float& x = s[static_cast<size_t>(id)];
        x = x < 0 ? x * p.repetition_penalty : x / p.repetition_penalty;
      }
  }
  if (!p.do_sample) return;
  if (p.temperature != 1.0f)
    for (float& x : s) x /= p.temperature;
  if (p.top_k > 0 && p.top_k < V) {
    std::vector<float> sorted(s);
    std::nth_element(sorted.begin(), sorted.begin() + (p.top_k - 1), sorted.end(), std::greater<float>());
    const float kth = sorted[static_cast<size_t>(p.top_k - 1)];
    for (float& x : s)
      if (x < kth) x = -INFINITY;  // ties with the k-th are kept
  }
  if (p.top_p < 1.0f) {
    const std::vector<double> prob = softmax(s);
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[static_cast<size_t>(a)] < s[static_cast<size_t>(b)]; });
    double cum = 0;
    for (int64_t i = 0; i < V - 1; ++i) {  // ascending; the last (the most likely) is always kept
      cum += prob[static_cast<size_t>(order[static_cast<size_t>(i)])];
      if (cum <= 1.0 - static_cast<double>(p.top_p)) s[static_cast<size_t>(order[static_cast<size_t>(i)])] = -INFINITY;
    }
  }
  if (p.min_p) {
    const std::vector<double> prob = softmax(s);
    const double top = *std::max_element(prob.begin(), prob.end());
    for (int64_t i = 0; i < V; ++i)
      if (prob[static_cast<size_t>(i)] < static_cast<double>(*p.min_p) * top) s[static_cast<size_t>(i)] = -INFINITY;
  }
}

int32_t pick_token(const std::vector<float>& s, bool do_sample, double u) {
  if (!do_sample) return static_cast<int32_t>(std::max_element(s.begin(), s.end()) - s.begin());
  // Inverse CDF of softmax(s): one pass of exps (float, into a buffer) and their total, then the first index whose
  // running sum passes u·total. -inf scores (filtered tokens) have weight 0 and are never picked.
  const float mx = *std::max_element(s.begin(), s.end());
  thread_local std::vector<float> e;
  e.resize(s.size());
  double total = 0;
  for (size_t i = 0; i < s.size(); ++i) total += e[i] = s[i] == -INFINITY ? 0.0f : std::exp(s[i] - mx);
  const double target = u * total;
  double cum = 0;
  int32_t last = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    if (e[i] == 0) continue;
    cum += e[i];
    last = static_cast<int32_t>(i);
    if (target < cum) return last;
  }
  return last;  // rounding left u·total above the sum
}

struct Generator::State {
  explicit State(const std::string& device) : cpu(make_backend(device)), reference(make_backend("reference")) {}
  std::unique_ptr<Backend> cpu;        // the model's device (compiled programs)
  std::unique_ptr<Backend> reference;  // disable_compile
  ProgramCache compiled{*cpu, 32};
  ProgramCache oracle{*reference, 8};
  std::map<std::pair<int64_t, int64_t>, std::vector<Tensor>> caches;  // (batch, cache length) -> k0, v0, k1, ...
  std::map<std::pair<int64_t, int64_t>, graph::Graph> decode_graphs;   // traced once per (batch, cache length)
};

Generator::Generator(const CausalLM& model)
    : model_(model), defaults_(GenerationConfig::from_model_dir(model.path())), state_(std::make_unique<State>(model.device())) {}
Generator::~Generator() = default;

const ProgramCacheStats& Generator::stats() const { return state_->compiled.stats(); }

GenerationOutput Generator::generate(const std::vector<std::vector<int32_t>>& prompts_in, const GenerationConfig& user, const Tokenizer* tokenizer) {
  const ModelConfig& mc = model_.config();
  const TensorParallel& tp = model_.tensor_parallel();  // a tensor-parallel rank's model runs with its group
  const GenerationConfig& d = defaults_;
  auto pick = [](const auto& a, const auto& b, auto fallback) { return a ? *a : b ? *b : fallback; };
  SamplingParams sp;
  sp.do_sample = pick(user.do_sample, d.do_sample, false);
  sp.temperature = pick(user.temperature, d.temperature, 1.0f);
  sp.top_k = pick(user.top_k, d.top_k, int64_t{50});
  sp.top_p = pick(user.top_p, d.top_p, 1.0f);
  sp.min_p = user.min_p ? user.min_p : d.min_p;
  sp.repetition_penalty = pick(user.repetition_penalty, d.repetition_penalty, 1.0f);
  if (sp.do_sample && !(sp.temperature > 0)) fail("generate: temperature must be > 0 when sampling, got {}", sp.temperature);
  if (sp.top_k < 0) fail("generate: top_k must be >= 0, got {}", sp.top_k);
  if (!(sp.top_p > 0 && sp.top_p <= 1)) fail("generate: top_p must be in (0, 1], got {}", sp.top_p);
  if (sp.min_p && !(*sp.min_p >= 0 && *sp.min_p <= 1)) fail("generate: min_p must be in [0, 1], got {}", *sp.min_p);
  if (!(sp.repetition_penalty > 0)) fail("generate: repetition_penalty must be > 0, got {}", sp.repetition_penalty);
  const std::vector<int32_t> eos = pick(user.eos_token_id, d.eos_token_id, std::vector<int32_t>{});
  const int32_t pad = user.pad_token_id ? *user.pad_token_id : d.pad_token_id ? *d.pad_token_id : !eos.empty() ? eos[0] : 0;
  for (int32_t id : eos)
    if (id < 0 || id >= mc.vocab_size) fail("generate: eos_token_id {} is outside the vocabulary [0, {})", id, mc.vocab_size);
  if (pad < 0 || pad >= mc.vocab_size) fail("generate: pad_token_id {} is outside the vocabulary [0, {})", pad, mc.vocab_size);
  if (user.cache_implementation != "static" && user.cache_implementation != "dynamic")
    fail("generate: cache_implementation '{}' is not \"static\" or \"dynamic\"", user.cache_implementation);
  if (user.num_return_sequences < 1) fail("generate: num_return_sequences must be >= 1, got {}", user.num_return_sequences);
  if (!user.stop_strings.empty() && tokenizer == nullptr) fail("generate: stop_strings need the tokenizer");
  if (prompts_in.empty()) fail("generate: no prompts");

  // Rows: each prompt num_return_sequences times, consecutively (as Transformers expands them).
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < prompts_in.size(); ++i) {
    if (prompts_in[i].empty()) fail("generate: prompt {} is empty (a prompt needs at least one token)", i);
    for (int32_t id : prompts_in[i])
      if (id < 0 || id >= mc.vocab_size) fail("generate: prompt {} holds token id {}, outside the vocabulary [0, {})", i, id, mc.vocab_size);
    for (int64_t r = 0; r < user.num_return_sequences; ++r) prompts.push_back(prompts_in[i]);
  }
  const int64_t B = static_cast<int64_t>(prompts.size());
  const bool compiled = !user.disable_compile;
  Backend& backend = compiled ? *state_->cpu : *state_->reference;
  ProgramCache& programs = compiled ? state_->compiled : state_->oracle;
  const int64_t multiple = user.pad_to_multiple_of ? *user.pad_to_multiple_of : backend.auto_pad_multiple();
  if (multiple < 0) fail("generate: pad_to_multiple_of must be >= 0, got {}", multiple);
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  const int64_t P = padded_length(longest, multiple);
  int64_t N = 0;
  if (user.max_new_tokens || (!user.max_length && d.max_new_tokens)) {
    N = user.max_new_tokens ? *user.max_new_tokens : *d.max_new_tokens;
  } else {
    const int64_t max_length = pick(user.max_length, d.max_length, int64_t{20});
    N = max_length - longest;
    if (N <= 0) fail("generate: max_length {} leaves no room after a prompt of {} tokens; set max_new_tokens", max_length, longest);
  }
  if (N < 1) fail("generate: max_new_tokens must be >= 1, got {}", N);
  const int64_t S = padded_length(P + N, multiple);
  if (S > mc.max_position_embeddings)
    fail("generate: a prompt of {} tokens (bucket {}) and {} new tokens need a cache of {} positions, more than the model's "
         "max_position_embeddings ({})",
         longest, P, N, S, mc.max_position_embeddings);

  GenerationOutput out;
  out.prompt_length = P;
  out.cache_length = S;
  out.sequences.assign(static_cast<size_t>(B), {});
  out.generated.assign(static_cast<size_t>(B), {});
  out.finish_reasons.assign(static_cast<size_t>(B), "length");
  // Host state: left-padded prompts, the [B, S] mask of filled cache slots, each row's last position.
  std::vector<int32_t> mask(static_cast<size_t>(B * S), 0), last_pos(static_cast<size_t>(B), 0);
  Tensor ids = Tensor::zeros(DType::I32, {B, P}), pmask = Tensor::zeros(DType::I32, {B, P});
  for (int64_t b = 0; b < B; ++b) {
    const auto& p = prompts[static_cast<size_t>(b)];
    const int64_t L = static_cast<int64_t>(p.size()), off = P - L;
    auto& seq = out.sequences[static_cast<size_t>(b)];
    seq.assign(static_cast<size_t>(off), pad);
    seq.insert(seq.end(), p.begin(), p.end());
    for (int64_t t = 0; t < P; ++t) {
      ids.mutable_data_as<int32_t>()[b * P + t] = seq[static_cast<size_t>(t)];
      const int32_t m = t >= off ? 1 : 0;
      pmask.mutable_data_as<int32_t>()[b * P + t] = m;
      mask[static_cast<size_t>(b * S + t)] = m;
    }
    last_pos[static_cast<size_t>(b)] = static_cast<int32_t>(L - 1);
  }

  const bool use_cache = user.cache_implementation == "static";
  std::vector<Tensor>* cache = nullptr;
  if (use_cache) {
    auto& c = state_->caches[{B, S}];
    if (c.empty())
      for (int64_t l = 0; l < mc.num_hidden_layers; ++l)
        for (int kv = 0; kv < 2; ++kv) c.push_back(Tensor::zeros(model_.dtype(), {B, S, mc.num_key_value_heads / tp.size, mc.head_dim}));
    for (Tensor& t : c) std::memset(t.mutable_data(), 0, t.nbytes());
    cache = &c;
  }
  auto bind_cache = [&](TensorMap& in) {
    for (int64_t l = 0; l < mc.num_hidden_layers; ++l) {
      in["past_key_values." + std::to_string(l) + ".key"] = (*cache)[static_cast<size_t>(2 * l)];
      in["past_key_values." + std::to_string(l) + ".value"] = (*cache)[static_cast<size_t>(2 * l + 1)];
    }
  };
  // After a run: the caches are updated in place (CPU) or returned as new values (reference): copy those back.
  // Outputs are read by the names the model's graphs give them ("logits", "past_key_values.<layer>.key|value").
  auto keep_cache = [&](const std::vector<Tensor>& res, const graph::Graph& g) {
    for (size_t i = 0; i < cache->size(); ++i) {
      const Tensor& updated = res[g.output_index(fmt::format("past_key_values.{}.{}", i / 2, i % 2 == 0 ? "key" : "value"))];
      if (updated.data() != (*cache)[i].data()) (*cache)[i].copy_from(updated);
    }
  };
  // Under tensor parallel a program's logits are this rank's V / size columns: each rank writes its columns into
  // zeroed rows and one all-reduce joins them, so every rank samples from the same whole rows (and, with the same
  // seeds, the same tokens).
  const int64_t V = mc.vocab_size, Vl = V / tp.size, first = tp.rank * Vl;
  std::vector<std::vector<float>> logits(static_cast<size_t>(B), std::vector<float>(static_cast<size_t>(V)));
  std::vector<float> joined(tp.size > 1 ? static_cast<size_t>(B * V) : 0);
  auto take_logits = [&](const Tensor& t, int64_t rows_stride, int64_t row_offset) {
    if (tp.size > 1) std::fill(joined.begin(), joined.end(), 0.0f);
    for (int64_t b = 0; b < B; ++b) {
      float* row = (tp.size > 1 ? joined.data() + b * V : logits[static_cast<size_t>(b)].data()) + first;
      const int64_t at = (b * rows_stride + row_offset) * Vl;
      if (t.dtype() == DType::BF16) {
        const uint16_t* x = static_cast<const uint16_t*>(t.data()) + at;
        for (int64_t v = 0; v < Vl; ++v) row[v] = bf16_to_f32(x[v]);
      } else if (t.dtype() == DType::F32) {
        std::memcpy(row, static_cast<const float*>(t.data()) + at, static_cast<size_t>(Vl) * sizeof(float));
      } else {
        for (int64_t v = 0; v < Vl; ++v) row[v] = static_cast<float>(load_element(t.data(), t.dtype(), at + v));
      }
    }
    if (tp.size == 1) return;
    all_reduce_in_group(tp.group, joined.data(), B * V, DType::F32);
    for (int64_t b = 0; b < B; ++b) std::memcpy(logits[static_cast<size_t>(b)].data(), joined.data() + b * V, static_cast<size_t>(V) * sizeof(float));
  };
  // The dynamic path: the whole sequence so far, every step (one program per length: the comparison point).
  auto run_full = [&](int64_t T) {
    Tensor x = Tensor::zeros(DType::I32, {B, T}), m = Tensor::zeros(DType::I32, {B, T});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        x.mutable_data_as<int32_t>()[b * T + t] = out.sequences[static_cast<size_t>(b)][static_cast<size_t>(t)];
        m.mutable_data_as<int32_t>()[b * T + t] = mask[static_cast<size_t>(b * S + t)];
      }
    TensorMap in = model_.weights();
    in["input_ids"] = x, in["attention_mask"] = m, in["position_ids"] = default_position_ids(m);
    const graph::Graph g = model_.forward_graph(B, T);
    const auto res = programs.get(g).run(in);
    take_logits(res[g.output_index("logits")], T, T - 1);
  };

  // Prefill.
  if (use_cache) {
    TensorMap in = model_.weights();
    in["input_ids"] = ids, in["attention_mask"] = pmask, in["position_ids"] = default_position_ids(pmask);
    in["cache_position"] = Tensor::from_i32(std::vector<int32_t>{0}, {1});
    bind_cache(in);
    const graph::Graph g = model_.prefill_graph(B, P, S);
    const auto res = programs.get(g).run(in);
    take_logits(res[g.output_index("logits")], 1, 0);
    keep_cache(res, g);
  } else {
    run_full(P);
  }
  (void)backend;

  SplitMix64 rng(pick(user.seed, d.seed, uint64_t{0}));
  std::vector<SplitMix64> row_rng;
  if (!user.row_seeds.empty()) {
    if (static_cast<int64_t>(user.row_seeds.size()) != B)
      fail("generate: {} row_seeds for {} rows (prompts × num_return_sequences)", user.row_seeds.size(), B);
    for (uint64_t s : user.row_seeds) row_rng.emplace_back(s);
  }
  std::vector<char> unfinished(static_cast<size_t>(B), 1);
  std::vector<std::string> text(static_cast<size_t>(B));
  for (int64_t step = 0; step < N; ++step) {
    if (user.interrupted && user.interrupted()) {
      for (int64_t b = 0; b < B; ++b)
        if (unfinished[static_cast<size_t>(b)]) out.finish_reasons[static_cast<size_t>(b)] = "interrupted";
      break;
    }
    Tensor next = Tensor::zeros(DType::I32, {B, 1});
    if (user.output_logits) out.logits.push_back(logits);
    for (int64_t b = 0; b < B; ++b) {
      std::vector<float>& s = logits[static_cast<size_t>(b)];
      process_logits(s, out.sequences[static_cast<size_t>(b)], sp);
      // Drawn for every row at every step: a row's draws do not depend on when the others finish.
      const uint64_t bits = row_rng.empty() ? rng.next() : row_rng[static_cast<size_t>(b)].next();
      const double u = static_cast<double>(bits >> 11) * 0x1.0p-53;
      int32_t tok = pick_token(s, sp.do_sample, u);
      if (!unfinished[static_cast<size_t>(b)]) tok = pad;
      next.mutable_data_as<int32_t>()[b] = tok;
      out.sequences[static_cast<size_t>(b)].push_back(tok);
      if (!unfinished[static_cast<size_t>(b)]) continue;
      out.generated[static_cast<size_t>(b)].push_back(tok);
      if (user.streamer) user.streamer(b, tok);
      if (std::find(eos.begin(), eos.end(), tok) != eos.end()) {
        unfinished[static_cast<size_t>(b)] = 0;
        out.finish_reasons[static_cast<size_t>(b)] = "eos";
      } else if (!user.stop_strings.empty()) {
        // A stop string that ends inside the text this token added stops the row (the token is kept).
        const std::string before = text[static_cast<size_t>(b)];
        text[static_cast<size_t>(b)] = tokenizer->decode(out.generated[static_cast<size_t>(b)]);
        const std::string& now = text[static_cast<size_t>(b)];
        for (const std::string& stop : user.stop_strings) {
          if (stop.empty()) continue;
          const size_t from = before.size() >= stop.size() ? before.size() - stop.size() + 1 : 0;
          if (now.find(stop, std::min(from, now.size())) != std::string::npos) {
            unfinished[static_cast<size_t>(b)] = 0;
            out.finish_reasons[static_cast<size_t>(b)] = "stop_string";
            break;
          }
        }
      }
    }
    if (step + 1 == N || std::none_of(unfinished.begin(), unfinished.end(), [](char c) { return c != 0; })) break;
    // The next token enters cache slot P + step for every row (finished rows too, as in Transformers).
    const int64_t slot = P + step;
    for (int64_t b = 0; b < B; ++b) mask[static_cast<size_t>(b * S + slot)] = 1;
    if (!use_cache) {
      run_full(slot + 1);
      continue;
    }
    Tensor pos = Tensor::zeros(DType::I32, {B, 1}), qpos = Tensor::zeros(DType::I32, {B, 1});
    for (int64_t b = 0; b < B; ++b) {
      pos.mutable_data_as<int32_t>()[b] = ++last_pos[static_cast<size_t>(b)];
      qpos.mutable_data_as<int32_t>()[b] = static_cast<int32_t>(slot);
    }
    TensorMap in = model_.weights();
    in["input_ids"] = next, in["position_ids"] = pos, in["query_positions"] = qpos;
    in["attention_mask"] = Tensor::from_i32(mask, {B, S});
    in["cache_position"] = Tensor::from_i32(std::vector<int32_t>{static_cast<int32_t>(slot)}, {1});
    bind_cache(in);
    auto g = state_->decode_graphs.find({B, S});
    if (g == state_->decode_graphs.end()) g = state_->decode_graphs.emplace(std::make_pair(B, S), model_.decode_graph(B, S)).first;
    const auto res = programs.get(g->second).run(in);  // a cache lookup every step: the counters show each reuse
    take_logits(res[g->second.output_index("logits")], 1, 0);
    keep_cache(res, g->second);
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

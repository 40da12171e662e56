#include "data/preference.h"

#include <algorithm>
#include <climits>
#include <cstdio>

#include "data/messages.h"
#include "trl/data/sft.h"
#include "trl/core/error.h"
#include "trl/tokenizer/chat_template.h"

#include <fmt/format.h>

namespace trl {

namespace {

using ojson = nlohmann::ordered_json;

// A field's kind: "text", "messages"; anything else is an error naming the row and the field.
std::string kind_of(const ojson& row, const char* field, const std::string& where) {
  if (!row.contains(field)) {
    std::string keys;
    for (const auto& [k, v] : row.items()) keys += (keys.empty() ? "" : ", ") + k;
    fail("{}: preference row has no \"{}\" (keys: {}); DPO and reward data need \"chosen\" and \"rejected\", and optionally \"prompt\"",
         where, field, keys);
  }
  const ojson& v = row[field];
  if (v.is_string()) {
    if (v.get<std::string>().empty() && std::string(field) != "prompt") fail("{}: \"{}\" is empty", where, field);
    return "text";
  }
  if (v.is_array()) {
    if (v.empty()) {
      if (std::string(field) == "prompt") return "messages";
      fail("{}: \"{}\" is an empty list of messages", where, field);
    }
    if (!is_message_list(v)) fail("{}: \"{}\" must be a string or a list of {{\"role\", \"content\"}} messages", where, field);
    return "messages";
  }
  fail("{}: \"{}\" must be a string or a list of messages, not {}", where, field, v.type_name());
}

// The kind ("text" or "messages") a preference row's "chosen" and "rejected" (and its "prompt", when given) share;
// an error that names the row and the three kinds when they differ.
std::string preference_kind(const ojson& row, const std::string& where) {
  const std::string kc = kind_of(row, "chosen", where), kr = kind_of(row, "rejected", where);
  const std::string kp = row.contains("prompt") ? kind_of(row, "prompt", where) : kc;
  if (kc != kr || kp != kc)
    fail("{}: \"prompt\", \"chosen\" and \"rejected\" must all be strings or all be lists of messages (got {} / {} / {})", where, kp, kc, kr);
  return kc;
}

// TRL's extract_prompt: the longest common prefix of chosen and rejected (turns for messages, characters for
// text, giving back a space that ends the prompt to the completions). When one is a prefix of the other, the
// prompt stops one turn (character) short of the shorter, as TRL's loop leaves it, so both keep a completion.
void split_implicit_prompt(ojson& prompt, ojson& chosen, ojson& rejected, bool messages) {
  if (messages) {
    const size_t n = std::min(chosen.size(), rejected.size());
    size_t i = 0;
    while (i < n && chosen[i] == rejected[i]) ++i;
    if (i == n && n > 0) i = n - 1;
    prompt = ojson::array();
    for (size_t k = 0; k < i; ++k) prompt.push_back(chosen[k]);
    ojson c = ojson::array(), r = ojson::array();
    for (size_t k = i; k < chosen.size(); ++k) c.push_back(chosen[k]);
    for (size_t k = i; k < rejected.size(); ++k) r.push_back(rejected[k]);
    chosen = c, rejected = r;
    return;
  }
  const std::string a = chosen.get<std::string>(), b = rejected.get<std::string>();
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  if (i == n && n > 0) i = n - 1;
  else if (i > 0 && a[i - 1] == ' ') --i;
  prompt = a.substr(0, i);
  chosen = a.substr(i);
  rejected = b.substr(i);
}

// Token ids given in the row (pre-tokenized data skips tokenization, as in TRL): a list of non-negative integers.
std::vector<int32_t> ids_field(const ojson& row, const char* field, const std::string& where, int64_t vocab_size) {
  const ojson& v = row[field];
  if (!v.is_array()) fail("{}: \"{}\" must be a list of token ids", where, field);
  std::vector<int32_t> ids;
  for (const ojson& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
      fail("{}: \"{}\" element {} is not a token id ({})", where, field, ids.size(), x.dump());
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  check_token_ids(ids, vocab_size, where, field);
  return ids;
}

// The reward model's optional "margin" column.
std::optional<double> margin_of(const ojson& row, const std::string& where) {
  if (!row.contains("margin")) return std::nullopt;
  if (!row["margin"].is_number()) fail("{}: \"margin\" must be a number, not {}", where, row["margin"].dump());
  return row["margin"].get<double>();
}

ojson concat(const ojson& a, const ojson& b) {
  ojson out = a;
  for (const auto& m : b) out.push_back(m);
  return out;
}

// The prompt's ids (with the chat template's generation prompt for messages) and the ids of prompt + each
// completion (the eos string appended to text completions that lack it).
std::vector<int32_t> tokenize_prompt_and_completions(const Tokenizer& tok, const ojson& row, const ojson& prompt, const std::vector<const ojson*>& completions,
                                                     bool messages, const std::string& eos, const std::string& where,
                                                     std::vector<std::vector<int32_t>>* full) {
  std::vector<int32_t> prompt_ids;
  try {
    if (messages) {
      ChatTemplateOptions co;
      if (row.contains("chat_template_kwargs") && row["chat_template_kwargs"].is_object()) co.extra = row["chat_template_kwargs"];
      if (row.contains("tools")) co.tools = row["tools"];
      ChatTemplateOptions po = co;
      po.add_generation_prompt = true;
      prompt_ids = apply_chat_template_ids(tok, prompt, po).input_ids;
      for (const ojson* c : completions) full->push_back(apply_chat_template_ids(tok, concat(prompt, *c), co).input_ids);
    } else {
      auto with_eos = [&](std::string s) { return s.size() >= eos.size() && s.compare(s.size() - eos.size(), eos.size(), eos) == 0 ? s : s + eos; };
      const std::string p = prompt.get<std::string>();
      prompt_ids = tok.encode(p, true);
      for (const ojson* c : completions) full->push_back(tok.encode(p + with_eos(c->get<std::string>()), true));
    }
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  return prompt_ids;
}

}  // namespace

std::vector<PreferenceExample> prepare_preference_dataset(const Dataset& data, const Tokenizer& tok, const PreferenceDataOptions& o,
                                                          PreferenceDataStats* stats) {
  if (o.truncation_mode != "keep_start" && o.truncation_mode != "keep_end")
    fail("truncation_mode: '{}' is not supported (keep_start or keep_end)", o.truncation_mode);
  const std::string eos = o.eos_token.empty() ? tok.eos_token() : o.eos_token;
  if (eos.empty()) fail("preference data: the tokenizer has no eos_token; set eos_token");
  PreferenceDataStats st;
  std::vector<PreferenceExample> out;
  for (size_t r = 0; r < data.size(); ++r) {
    const ojson row = data.row(r);
    const std::string where = data.location(r);
    if (!row.is_object()) fail("{}: a preference row must be a JSON object", where);
    if (row.contains("prompt_ids") && row.contains("chosen_ids") && row.contains("rejected_ids")) {  // already tokenized
      PreferenceExample ex{ids_field(row, "prompt_ids", where, o.vocab_size), ids_field(row, "chosen_ids", where, o.vocab_size),
                           ids_field(row, "rejected_ids", where, o.vocab_size), where,
                           std::nullopt};
      ex.margin = margin_of(row, where);
      if (ex.chosen_ids.empty() || ex.rejected_ids.empty()) fail("{}: the {} completion has no tokens", where, ex.chosen_ids.empty() ? "chosen" : "rejected");
      if (o.max_length > 0 && o.truncation_mode == "keep_start" && static_cast<int64_t>(ex.prompt_ids.size()) >= o.max_length) {
        ++st.dropped;
        continue;
      }
      out.push_back(std::move(ex));
      continue;
    }
    const bool explicit_prompt = row.contains("prompt");
    const bool messages = preference_kind(row, where) == "messages";
    ojson prompt = explicit_prompt ? row["prompt"] : ojson(), chosen = row["chosen"], rejected = row["rejected"];
    if (!explicit_prompt) split_implicit_prompt(prompt, chosen, rejected, messages);
    if ((messages && (chosen.empty() || rejected.empty())) || (!messages && (chosen.get<std::string>().empty() || rejected.get<std::string>().empty())))
      fail("{}: chosen and rejected are identical (the implicit prompt is all of them): no completion to compare", where);
    PreferenceExample ex;
    ex.where = where;
    ex.margin = margin_of(row, where);
    std::vector<std::vector<int32_t>> full;
    ex.prompt_ids = tokenize_prompt_and_completions(tok, row, prompt, {&chosen, &rejected}, messages, eos, where, &full);
    check_token_ids(full[0], o.vocab_size, where, "prompt + chosen (tokenized)");
    check_token_ids(full[1], o.vocab_size, where, "prompt + rejected (tokenized)");
    const std::vector<int32_t>& with_chosen = full[0];
    const std::vector<int32_t>& with_rejected = full[1];
    const size_t np = ex.prompt_ids.size();
    auto prefixed = [&](const std::vector<int32_t>& v) { return v.size() >= np && std::equal(ex.prompt_ids.begin(), ex.prompt_ids.end(), v.begin()); };
    if (!prefixed(with_chosen) || !prefixed(with_rejected)) ++st.mismatched;
    ex.chosen_ids.assign(with_chosen.begin() + static_cast<std::ptrdiff_t>(std::min(np, with_chosen.size())), with_chosen.end());
    ex.rejected_ids.assign(with_rejected.begin() + static_cast<std::ptrdiff_t>(std::min(np, with_rejected.size())), with_rejected.end());
    if (ex.chosen_ids.empty() || ex.rejected_ids.empty()) fail("{}: the {} completion has no tokens after the prompt", where, ex.chosen_ids.empty() ? "chosen" : "rejected");
    if (o.max_length > 0 && o.truncation_mode == "keep_start" && static_cast<int64_t>(np) >= o.max_length) {
      ++st.dropped;
      continue;
    }
    out.push_back(std::move(ex));
  }
  if (stats) *stats = st;
  if (out.empty()) fail("preference data: no usable rows ({} rows, {} dropped because the prompt alone reaches max_length {})", data.size(), st.dropped, o.max_length);
  return out;
}

SFTExample prompt_completion_row(const std::vector<int32_t>& prompt_ids, const std::vector<int32_t>& completion_ids, const PreferenceDataOptions& o,
                                 const std::string& where) {
  SFTExample ex;
  ex.where = where;
  ex.input_ids = prompt_ids;
  ex.input_ids.insert(ex.input_ids.end(), completion_ids.begin(), completion_ids.end());
  ex.labels_mask.assign(prompt_ids.size(), 0);
  ex.labels_mask.resize(ex.input_ids.size(), 1);
  const int64_t n = static_cast<int64_t>(ex.input_ids.size());
  if (o.max_length > 0 && n > o.max_length) {
    const auto cut = static_cast<std::ptrdiff_t>(o.max_length);
    if (o.truncation_mode == "keep_end") {
      ex.input_ids.erase(ex.input_ids.begin(), ex.input_ids.end() - cut);
      ex.labels_mask.erase(ex.labels_mask.begin(), ex.labels_mask.end() - cut);
    } else {
      ex.input_ids.resize(static_cast<size_t>(cut));
      ex.labels_mask.resize(static_cast<size_t>(cut));
    }
  }
  return ex;
}

std::vector<SFTExample> preference_rows(const std::vector<const PreferenceExample*>& pairs, const PreferenceDataOptions& o) {
  std::vector<SFTExample> rows;
  rows.reserve(2 * pairs.size());
  for (int side = 0; side < 2; ++side)
    for (const PreferenceExample* p : pairs) rows.push_back(prompt_completion_row(p->prompt_ids, side == 0 ? p->chosen_ids : p->rejected_ids, o, p->where));
  return rows;
}

// TRL's unpair_preference_dataset (a batched map of 1000 rows): each chunk's chosen completions (label true), then
// its rejected ones (label false), with the prompt repeated.
Dataset unpair_preference_rows(const Dataset& data) {
  Dataset out;
  const size_t chunk = 1000;
  for (size_t start = 0; start < data.size(); start += chunk) {
    const size_t end = std::min(data.size(), start + chunk);
    for (int side = 0; side < 2; ++side)
      for (size_t r = start; r < end; ++r) {
        const ojson row = data.row(r);
        const std::string where = data.location(r);
        if (!row.is_object()) fail("{}: a preference row must be a JSON object", where);
        const char* field = side == 0 ? "chosen" : "rejected";
        const bool messages = preference_kind(row, where) == "messages";
        ojson u = row;
        u.erase("chosen"), u.erase("rejected");
        ojson prompt = row.contains("prompt") ? row["prompt"] : ojson(), chosen = row["chosen"], rejected = row["rejected"];
        if (!row.contains("prompt")) split_implicit_prompt(prompt, chosen, rejected, messages);
        u["prompt"] = prompt;
        u["completion"] = side == 0 ? chosen : rejected;
        u["label"] = side == 0;
        out.rows.push_back(std::move(u));
        out.where.push_back(fmt::format("{} ({})", where, field));
      }
  }
  return out;
}

std::vector<UnpairedExample> prepare_unpaired_dataset(const Dataset& input, const Tokenizer& tok, const PreferenceDataOptions& o,
                                                      PreferenceDataStats* stats) {
  if (o.truncation_mode != "keep_start" && o.truncation_mode != "keep_end")
    fail("truncation_mode: '{}' is not supported (keep_start or keep_end)", o.truncation_mode);
  const std::string eos = o.eos_token.empty() ? tok.eos_token() : o.eos_token;
  if (eos.empty()) fail("preference data: the tokenizer has no eos_token; set eos_token");
  const ojson first = input.empty() ? ojson() : input.row(0);
  const bool paired = first.is_object() && first.contains("chosen") && first.contains("rejected");
  const Dataset data = paired ? unpair_preference_rows(input) : input;
  PreferenceDataStats st;
  std::vector<UnpairedExample> out;
  for (size_t r = 0; r < data.size(); ++r) {
    const ojson row = data.row(r);
    const std::string where = data.location(r);
    if (!row.is_object()) fail("{}: an unpaired preference row must be a JSON object", where);
    if (row.contains("prompt_ids") && row.contains("completion_ids")) {  // already tokenized
      if (!row.contains("label") || !row["label"].is_boolean()) fail("{}: \"label\" must be true or false", where);
      UnpairedExample ex{ids_field(row, "prompt_ids", where, o.vocab_size), ids_field(row, "completion_ids", where, o.vocab_size),
                         row["label"].get<bool>(), where};
      if (ex.completion_ids.empty()) fail("{}: the completion has no tokens", where);
      if (o.max_length > 0 && static_cast<int64_t>(ex.prompt_ids.size()) >= o.max_length) {
        ++st.dropped;
        continue;
      }
      out.push_back(std::move(ex));
      continue;
    }
    for (const char* f : {"prompt", "completion", "label"})
      if (!row.contains(f)) {
        std::string keys;
        for (const auto& [k, v] : row.items()) keys += (keys.empty() ? "" : ", ") + k;
        fail("{}: unpaired preference row has no \"{}\" (keys: {}); KTO data needs \"prompt\", \"completion\" and \"label\" (true for a "
             "desirable completion), or \"chosen\" and \"rejected\" pairs",
             where, f, keys);
      }
    if (!row["label"].is_boolean()) fail("{}: \"label\" must be true or false, not {}", where, row["label"].dump());
    const std::string kp = kind_of(row, "prompt", where), kc = kind_of(row, "completion", where);
    if (kp != kc) fail("{}: \"prompt\" and \"completion\" must both be strings or both be lists of messages (got {} / {})", where, kp, kc);
    UnpairedExample ex;
    ex.where = where;
    ex.desirable = row["label"].get<bool>();
    std::vector<std::vector<int32_t>> full;
    ex.prompt_ids = tokenize_prompt_and_completions(tok, row, row["prompt"], {&row["completion"]}, kc == "messages", eos, where, &full);
    check_token_ids(full[0], o.vocab_size, where, "prompt + completion (tokenized)");
    const size_t np = ex.prompt_ids.size();
    if (full[0].size() < np || !std::equal(ex.prompt_ids.begin(), ex.prompt_ids.end(), full[0].begin())) ++st.mismatched;
    ex.completion_ids.assign(full[0].begin() + static_cast<std::ptrdiff_t>(std::min(np, full[0].size())), full[0].end());
    if (ex.completion_ids.empty()) fail("{}: the completion has no tokens after the prompt", where);
    if (o.max_length > 0 && o.truncation_mode == "keep_start" && static_cast<int64_t>(np) >= o.max_length) {
      ++st.dropped;
      continue;
    }
    out.push_back(std::move(ex));
  }
  if (stats) *stats = st;
  if (out.empty()) fail("preference data: no usable rows ({} rows, {} dropped because the prompt alone reaches max_length {})", data.size(), st.dropped, o.max_length);
  return out;
}

void report_preference_stats(const char* method, const char* split, const PreferenceDataStats& s) {
  if (s.dropped > 0)
    std::fprintf(stderr, "[trl] %s: dropped %lld %s rows whose prompt alone fills max_length\n", method, static_cast<long long>(s.dropped), split);
  if (s.mismatched > 0)
    std::fprintf(stderr, "[trl] %s: %lld %s rows: the tokenized prompt is not a prefix of prompt + completion (the completion starts after "
                 "the prompt's tokens)\n", method, static_cast<long long>(s.mismatched), split);
}

}  // namespace trl

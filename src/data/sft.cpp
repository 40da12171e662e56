#include "trl/data/sft.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "data/messages.h"
#include "trl/core/error.h"
#include "trl/tokenizer/chat_template.h"

namespace trl {

namespace {

using ojson = nlohmann::ordered_json;

// ShareGPT-style {"from", "value"} turns become ChatML messages, as TRL converts them.
ojson to_messages(const ojson& v) {
  ojson out = ojson::array();
  for (const auto& m : v) {
    if (m.contains("from") && m.contains("value")) {
      const std::string from = m["from"].get<std::string>();
      const std::string role = from == "human" ? "user" : from == "gpt" ? "assistant" : from;
      out.push_back(ojson{{"role", role}, {"content", m["value"]}});
    } else {
      out.push_back(m);
    }
  }
  return out;
}

}  // namespace

std::string sft_format(const ojson& row, const std::string& text_field, const std::string& where) {
  if (row.contains("prompt") && row.contains("completion")) {
    const bool pm = row["prompt"].is_array(), cm = row["completion"].is_array();
    if (row["prompt"].is_string() && row["completion"].is_string()) return "prompt_completion";
    if (pm && cm) return "conversational_prompt_completion";
    fail("{}: \"prompt\" and \"completion\" must both be strings or both be lists of messages", where);
  }
  if (row.contains("messages")) {
    if (!row["messages"].is_array()) fail("{}: \"messages\" must be a list of {{\"role\", \"content\"}}", where);
    return "conversational";
  }
  if (row.contains("conversations")) return "conversational";
  if (row.contains(text_field)) {
    if (!row[text_field].is_string()) fail("{}: \"{}\" must be a string", where, text_field);
    return "language_modeling";
  }
  fail("{}: no SFT field: expected \"{}\", \"messages\", or \"prompt\" + \"completion\" (keys: {})", where, text_field,
       [&] {
         std::string keys;
         for (const auto& [k, v] : row.items()) keys += (keys.empty() ? "" : ", ") + k;
         return keys;
       }());
}

void check_token_ids(const std::vector<int32_t>& ids, int64_t vocab_size, const std::string& where, const char* field) {
  if (vocab_size <= 0) return;
  for (size_t t = 0; t < ids.size(); ++t)
    if (ids[t] < 0 || ids[t] >= vocab_size)
      fail("{}: \"{}\" position {} is token id {}, outside the model's vocabulary of {} ids (0 to {}): the data was tokenized for "
           "another model or tokenizer",
           where, field, t, ids[t], vocab_size, vocab_size - 1);
}

std::vector<SFTExample> prepare_sft_dataset(const Dataset& data, const Tokenizer& tok, const SFTDataOptions& o, int64_t* dropped) {
  const std::string eos = o.eos_token.empty() ? tok.eos_token() : o.eos_token;
  if (eos.empty()) fail("SFT: the tokenizer has no eos_token; set eos_token");
  std::vector<SFTExample> out;
  int64_t n_dropped = 0;
  for (size_t r = 0; r < data.size(); ++r) {
    const ojson row = data.row(r);
    const std::string where = data.location(r);
    const std::string fmt = sft_format(row, o.dataset_text_field, where);
    const bool completion_only = o.completion_only_loss.value_or(fmt == "prompt_completion" || fmt == "conversational_prompt_completion");
    SFTExample ex;
    ex.where = where;
    std::vector<int32_t> assistant;
    size_t prompt_len = 0;
    auto with_eos = [&](std::string s) { return s.size() >= eos.size() && s.compare(s.size() - eos.size(), eos.size(), eos) == 0 ? s : s + eos; };
    try {
      if (fmt == "language_modeling") {
        ex.input_ids = tok.encode(with_eos(row[o.dataset_text_field].get<std::string>()), true);
      } else if (fmt == "prompt_completion") {
        const std::string prompt = row["prompt"].get<std::string>();
        ex.input_ids = tok.encode(prompt + with_eos(row["completion"].get<std::string>()), true);
        prompt_len = tok.encode(prompt, true).size();
      } else {
        ChatTemplateOptions co;
        if (row.contains("chat_template_kwargs") && row["chat_template_kwargs"].is_object()) co.extra = row["chat_template_kwargs"];
        if (row.contains("tools")) co.tools = row["tools"];
        if (fmt == "conversational") {
          const ojson messages = to_messages(row.contains("messages") ? row["messages"] : row["conversations"]);
          if (!is_message_list(messages)) fail("messages must be a non-empty list of {{\"role\", \"content\"}}");
          const ChatEncoding enc = apply_chat_template_ids(tok, messages, co);
          ex.input_ids = enc.input_ids;
          assistant = enc.assistant_masks;
        } else {
          const ojson prompt = to_messages(row["prompt"]), completion = to_messages(row["completion"]);
          ojson all = prompt;
          for (const auto& m : completion) all.push_back(m);
          ChatTemplateOptions po = co;
          po.add_generation_prompt = true;
          prompt_len = apply_chat_template_ids(tok, prompt, po).input_ids.size();
          const ChatEncoding enc = apply_chat_template_ids(tok, all, co);
          ex.input_ids = enc.input_ids;
          assistant = enc.assistant_masks;
        }
      }
    } catch (const Error& e) {
      fail("{}: {}", where, e.what());
    }
    check_token_ids(ex.input_ids, o.vocab_size, where, "input_ids (tokenized)");
    if (o.assistant_only_loss) {
      if (fmt == "language_modeling" || fmt == "prompt_completion") fail("{}: assistant_only_loss needs conversational data", where);
      if (std::find(assistant.begin(), assistant.end(), 1) == assistant.end())
        fail("{}: assistant_only_loss needs a chat template that marks assistant turns with {{% generation %}}; this row has none", where);
    }
    ex.labels_mask.assign(ex.input_ids.size(), 1);
    for (size_t t = 0; t < ex.input_ids.size(); ++t) {
      if (completion_only && t < prompt_len) ex.labels_mask[t] = 0;
      if (o.assistant_only_loss && (t >= assistant.size() || assistant[t] == 0)) ex.labels_mask[t] = 0;
    }
    if (o.truncate && o.max_length > 0 && static_cast<int64_t>(ex.input_ids.size()) > o.max_length) {
      ex.input_ids.resize(static_cast<size_t>(o.max_length));
      ex.labels_mask.resize(static_cast<size_t>(o.max_length));
    }
    // A row needs at least one predicted label (position >= 1) to contribute to the loss.
    bool any = false;
    for (size_t t = 1; t < ex.labels_mask.size(); ++t) any = any || ex.labels_mask[t];
    if (!any) {
      ++n_dropped;
      continue;
    }
    out.push_back(std::move(ex));
  }
  if (dropped) *dropped = n_dropped;
  if (out.empty()) fail("SFT: no usable rows (every row's labels are masked or empty)");
  return out;
}

namespace {

SFTBatch empty_batch(int64_t B, int64_t T, int32_t pad) {
  SFTBatch b;
  b.input_ids = Tensor::zeros(DType::I32, {B, T});
  b.attention_mask = Tensor::zeros(DType::I32, {B, T});
  b.position_ids = Tensor::zeros(DType::I32, {B, T});
  b.labels = Tensor::zeros(DType::I32, {B, T});
  b.weights = Tensor::zeros(DType::F32, {B, T});
  for (int64_t i = 0; i < B * T; ++i) b.input_ids.mutable_data_as<int32_t>()[i] = pad;
  for (int64_t i = 0; i < B * T; ++i) b.position_ids.mutable_data_as<int32_t>()[i] = 1;  // padding, as generate() does
  return b;
}

// Writes one example at row b from column c0 as segment `seg`.
void place(SFTBatch& b, int64_t T, int64_t row, int64_t c0, int32_t seg, const SFTExample& ex) {
  const int64_t L = static_cast<int64_t>(ex.input_ids.size());
  int32_t* ids = b.input_ids.mutable_data_as<int32_t>();
  int32_t* m = b.attention_mask.mutable_data_as<int32_t>();
  int32_t* pos = b.position_ids.mutable_data_as<int32_t>();
  int32_t* lab = b.labels.mutable_data_as<int32_t>();
  float* w = b.weights.mutable_data_as<float>();
  for (int64_t t = 0; t < L; ++t) {
    const int64_t i = row * T + c0 + t;
    ids[i] = ex.input_ids[static_cast<size_t>(t)];
    m[i] = seg;
    pos[i] = static_cast<int32_t>(t);
    if (t + 1 < L) {
      lab[i] = ex.input_ids[static_cast<size_t>(t + 1)];
      if (ex.labels_mask[static_cast<size_t>(t + 1)]) {
        w[i] = 1.0f;
        ++b.num_items;
      }
    }
  }
  b.num_tokens += L;
}

}  // namespace

SFTBatch collate_padded(const std::vector<const SFTExample*>& examples, int32_t pad, int64_t multiple, int64_t max_length) {
  if (examples.empty()) fail("collate: an empty batch");
  int64_t longest = 0;
  for (const SFTExample* e : examples) longest = std::max<int64_t>(longest, static_cast<int64_t>(e->input_ids.size()));
  int64_t T = multiple > 0 ? (longest + multiple - 1) / multiple * multiple : longest;
  if (max_length > 0) T = std::max(longest, std::min(T, max_length));
  SFTBatch b = empty_batch(static_cast<int64_t>(examples.size()), T, pad);
  for (size_t r = 0; r < examples.size(); ++r) place(b, T, static_cast<int64_t>(r), 0, 1, *examples[r]);
  return b;
}

SFTBatch collate_packed(const std::vector<std::vector<const SFTExample*>>& rows, int32_t pad, int64_t length) {
  if (rows.empty()) fail("collate: an empty batch");
  SFTBatch b = empty_batch(static_cast<int64_t>(rows.size()), length, pad);
  for (size_t r = 0; r < rows.size(); ++r) {
    int64_t c = 0;
    int32_t seg = 1;
    for (const SFTExample* e : rows[r]) {
      if (c + static_cast<int64_t>(e->input_ids.size()) > length) fail("collate: packed row {} overflows its {} tokens", r, length);
      place(b, length, static_cast<int64_t>(r), c, seg++, *e);
      c += static_cast<int64_t>(e->input_ids.size());
    }
  }
  return b;
}

std::vector<std::vector<size_t>> pack_best_fit_decreasing(const std::vector<int64_t>& lengths, int64_t capacity) {
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<size_t>> bins;
  std::multimap<int64_t, size_t> space;  // remaining space -> bin
  for (size_t i : order) {
    const int64_t L = lengths[i];
    if (L > capacity) fail("packing: a sequence of {} tokens does not fit rows of {}", L, capacity);
    auto it = space.lower_bound(L);  // the bin with the smallest remaining space that still fits
    size_t bin;
    int64_t left;
    if (it == space.end()) {
      bin = bins.size();
      bins.emplace_back();
      left = capacity;
    } else {
      bin = it->second;
      left = it->first;
      space.erase(it);
    }
    bins[bin].push_back(i);
    if (left - L > 0) space.emplace(left - L, bin);
  }
  return bins;
}

}  // namespace trl

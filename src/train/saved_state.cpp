#include "train/saved_state.h"

#include "core/fs.h"
#include "core/json_text.h"
#include "trl/core/error.h"

namespace trl {

using ojson = nlohmann::ordered_json;

SavedTrainerState read_trainer_state(const std::string& path) {
  const ojson st = parse_json<ojson>(read_text_file(path), path);
  if (!st.is_object()) fail("{}: holds {}, not a trainer state object", path, json_kind(st));
  if (!st.contains("trl_cpp") || !st["trl_cpp"].is_object()) fail("{}: has no trl_cpp section (written by another program?)", path);
  SavedTrainerState s;
  s.trl_cpp = st["trl_cpp"];
  const std::string section = path + ", trl_cpp";
  s.global_step = json_field<int64_t>(st, "global_step", path);
  s.optimizer_steps = json_field<int64_t>(s.trl_cpp, "optimizer_steps", section);
  s.num_tokens = json_field<int64_t>(s.trl_cpp, "num_tokens", section);
  if (s.global_step < 0 || s.optimizer_steps < 0 || s.num_tokens < 0)
    fail("{}: global_step, optimizer_steps and num_tokens must be >= 0, got {}, {} and {}", path, s.global_step, s.optimizer_steps, s.num_tokens);
  if (!st.contains("log_history") || !st["log_history"].is_array()) fail("{}: field 'log_history' must be a list of log entries", path);
  // The entries go back into log.jsonl, the report and the final summary: each is an object whose "step" is a whole
  // number and whose other values are numbers (strings and null allowed, as a hand-edited file may hold them).
  for (const ojson& e : st["log_history"]) {
    const std::string entry = fmt::format("{}: log_history[{}]", path, s.log_history.size());
    if (!e.is_object()) fail("{}: is {}, not an object", entry, json_kind(e));
    if (json_field<int64_t>(e, "step", entry) < 0) fail("{}: 'step' must be >= 0", entry);
    for (const auto& [key, v] : e.items())
      if (!v.is_number() && !v.is_string() && !v.is_null() && !v.is_boolean()) fail("{}: '{}' must be a number, got {}", entry, key, json_kind(v));
    s.log_history.push_back(e);
  }
  if (s.trl_cpp.contains("per_device_train_batch_size")) {
    s.per_device_train_batch_size = json_field<int64_t>(s.trl_cpp, "per_device_train_batch_size", section);
    s.data_parallel_recorded = s.trl_cpp.contains("data_parallel_size");
    s.data_parallel_size = s.data_parallel_recorded            ? json_field<int64_t>(s.trl_cpp, "data_parallel_size", section)
                           : s.trl_cpp.contains("world_size") ? json_field<int64_t>(s.trl_cpp, "world_size", section)
                                                               : 1;
    if (*s.per_device_train_batch_size < 1 || s.data_parallel_size < 1)
      fail("{}: per_device_train_batch_size and data_parallel_size must be >= 1, got {} and {}", section, *s.per_device_train_batch_size,
           s.data_parallel_size);
  }
  return s;
}

}  // namespace trl

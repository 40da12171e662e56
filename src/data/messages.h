// Chat data shared by the dataset formats (SFT, preference): what counts as a list of messages.
#pragma once

#include <nlohmann/json.hpp>

namespace trl {

// A non-empty JSON array of objects that each have "role" and "content".
inline bool is_message_list(const nlohmann::ordered_json& v) {
  if (!v.is_array() || v.empty()) return false;
  for (const auto& m : v)
    if (!m.is_object() || !m.contains("role") || !m.contains("content")) return false;
  return true;
}

}  // namespace trl

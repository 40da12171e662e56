// Files that ship inside the trl binary (embedded at build time), so that trl never depends on the source tree
// or on anything outside itself at run time. Currently: the Qwen3 tokenizer (Apache-2.0, see
// assets/qwen3-tokenizer/LICENSE and SOURCE.txt) and the demo's chat dataset (assets/demo/chat.jsonl, written for
// this project).
#pragma once

#include <string_view>
#include <vector>

namespace trl {

// "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "LICENSE", "demo/chat.jsonl". Throws for an
// unknown name.
std::string_view asset(std::string_view name);
std::vector<std::string_view> asset_names();

}  // namespace trl

// Helpers shared by the `trl` subcommands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "trl/core/error.h"
#include "trl/models/causal_lm.h"

namespace CLI {
class App;
}

namespace trl::cli {

// "--max_new_tokens,--max-new-tokens": every flag accepts underscores or dashes, as Transformers' parser does.
std::string flag(const std::string& name);

// The token ids of a JSON array (nlohmann::json or ordered_json), each checked to be an integer in [0, 2^31):
// "<where>: ids[3] = 3000000000 is not a token id (0 to 2147483647)". Never wraps a large id to a negative one.
template <class Json>
std::vector<int32_t> token_ids_from_json(const Json& v, const std::string& where) {
  if (!v.is_array()) fail("{}: expected a list of token ids such as [1, 2, 3], got {}", where, v.dump());
  std::vector<int32_t> ids;
  for (const auto& x : v) {
    const bool ok = x.is_number_unsigned() ? x.template get<uint64_t>() <= 2147483647u
                                           : x.is_number_integer() && x.template get<int64_t>() >= 0 && x.template get<int64_t>() <= 2147483647;
    if (!ok) fail("{}: ids[{}] = {} is not a token id (an integer from 0 to 2147483647)", where, ids.size(), x.dump());
    ids.push_back(static_cast<int32_t>(x.template get<int64_t>()));
  }
  return ids;
}

// A model for inference (generate, chat, score, merge-adapter): `model` is a model folder or hub id, or a PEFT adapter
// folder (its base found through base_model_name_or_path); `adapter`, when given, is an adapter folder to put on
// `model`. With merge, the adapter is merged into the weights (W + scaling·B·A: the same logits, no extra GEMMs).
CausalLM load_inference_model(const std::string& model, const std::string& adapter, const LoadOptions& options, bool merge);
// Where the tokenizer of `model` is: the folder itself, or for an adapter folder without tokenizer files, its base.
std::string tokenizer_source(const std::string& model);

// The kernel family of each hot op on this CPU (`trl env`'s cpu_kernels; also in each `trl bench` line).
nlohmann::ordered_json cpu_kernels_info();
void register_env(CLI::App& app);
void register_merge_adapter(CLI::App& app);
void register_init_model(CLI::App& app);
void register_score(CLI::App& app);
void register_demo(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_dataset_info(CLI::App& app);
void register_bench(CLI::App& app);
void register_compile(CLI::App& app);
void register_generate(CLI::App& app);
void register_serve(CLI::App& app);
void register_sft(CLI::App& app);
void register_dpo(CLI::App& app);
void register_kto(CLI::App& app);
void register_gkd(CLI::App& app);
void register_distill(CLI::App& app);
void register_grpo(CLI::App& app);
void register_demo_grpo(CLI::App& app);
void register_rloo(CLI::App& app);
void register_reward(CLI::App& app);

}  // namespace trl::cli

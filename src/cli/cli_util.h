// Helpers shared by the `trl` subcommands.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace trl::cli {

// "--max_new_tokens,--max-new-tokens": every flag accepts underscores or dashes, as Transformers' parser does.
std::string flag(const std::string& name);

void register_env(CLI::App& app);
void register_init_model(CLI::App& app);
void register_score(CLI::App& app);
void register_demo(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_bench(CLI::App& app);
void register_compile(CLI::App& app);
void register_generate(CLI::App& app);
void register_sft(CLI::App& app);

}  // namespace trl::cli

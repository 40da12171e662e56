// How a training command hands over its trainer. The `trl` binary trains at once and prints the summary line; the
// Python package (python/) parses the same command line in-process, keeps the trainer and calls train(),
// evaluate() and save_model() on it when the user's script does. One parser, one set of checks, for both.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trl/backend/program_cache.h"
#include "trl/train/base_trainer.h"
#include "trl/train/rewards.h"

namespace CLI {
class App;
}

namespace trl::cli {

// A trainer and what it refers to (the model, tokenizer, reference or teacher), kept alive together.
struct PreparedTrainer {
  std::string command;                    // "sft", "grpo", ...
  std::shared_ptr<void> held;             // the values the trainer holds references to
  std::unique_ptr<BaseTrainer> trainer;
  std::function<const ProgramCacheStats*()> generation_stats;  // the online methods' generator counters, else null
  std::string output_dir;
};

// Set while the Python package runs a command: the reward functions its script passed as Python callables
// (reward_funcs entries "python:N" name them by index, so they keep their place among the named ones), and where
// the command leaves its trainer.
struct EmbeddedCall {
  std::vector<NamedRewardFunction> python_rewards;
  bool load_eval_split = false;  // the script passed an eval_dataset: load the test split even when eval_strategy is no
  std::unique_ptr<PreparedTrainer> prepared;
};
EmbeddedCall*& embedded_call();  // defined in train_options.cpp

// The end of every training command: under the Python package, keeps `p` in embedded_call(); else trains and
// prints the summary line (exits 130 when interrupted).
void deliver(std::unique_ptr<PreparedTrainer> p);

// A training command's trainer of type T, built from its arguments, with `held` kept alive beside it.
template <class T, class... Args>
std::unique_ptr<PreparedTrainer> prepared(const char* command, std::shared_ptr<void> held, const std::string& output_dir, Args&&... args) {
  auto p = std::make_unique<PreparedTrainer>();
  p->command = command;
  p->held = std::move(held);
  p->trainer = std::make_unique<T>(std::forward<Args>(args)...);
  p->output_dir = output_dir;
  return p;
}

// The `trl` command line: every command registered, errors formatted as the binary prints them.
std::unique_ptr<CLI::App> make_app();
// "error: ... (see trl sft --help)" for a CLI11 parse error of `app`, as the binary prints it (without "error: ").
std::string parse_error_message(const CLI::App& app, const std::exception& e);

}  // namespace trl::cli

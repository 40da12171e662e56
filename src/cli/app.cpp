// The `trl` command line as an object (every command registered, parse errors in the project's words), shared by
// the binary (main.cpp) and the Python package; and deliver(), where a training command's trainer goes.
#include <cstdio>
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/cli_util.h"
#include "cli/embed.h"
#include "cli/options.h"
#include "cli/train_options.h"
#include "version.h"

namespace trl::cli {

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// "unknown option --learning_rat (did you mean --learning_rate?)" instead of CLI11's list of leftover words.
std::string unknown_options_message(const CLI::App& cmd, const std::string& fallback) {
  std::string out;
  for (std::string arg : cmd.remaining()) {
    if (arg.rfind("--", 0) != 0) continue;
    arg = arg.substr(0, arg.find('='));
    if (const std::string hint = trl::cli::renamed_option_hint(arg.substr(2)); !hint.empty()) {
      out += (out.empty() ? "" : "; ") + ("unknown option " + arg + ": use " + hint);
      continue;
    }
    std::string best;
    size_t best_d = 4;  // suggest only close names
    for (const CLI::Option* o : cmd.get_options())
      for (const std::string& n : o->get_lnames()) {
        const size_t d = edit_distance(arg.substr(2), n);
        if (d < best_d) best_d = d, best = "--" + n;
      }
    out += (out.empty() ? "" : "; ") + ("unknown option " + arg) + (best.empty() ? "" : " (did you mean " + best + "?)");
  }
  return out.empty() ? fallback : out;
}

// "error: what (see trl sft --help)\n": the words of every parse error.
std::string failure_text(const CLI::App* cmd, const CLI::Error& e) {
  std::string where = "trl";
  const CLI::App* last = cmd;
  for (const CLI::App* sub = cmd; sub != nullptr;) {
    const auto parsed = sub->get_subcommands();
    sub = parsed.empty() ? nullptr : parsed.front();
    if (sub != nullptr) where += " " + sub->get_name(), last = sub;
  }
  std::string what = e.what();
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) what = unknown_options_message(*last, what);
  return "error: " + what + " (see " + where + " --help)\n";
}

}  // namespace

std::unique_ptr<CLI::App> make_app() {
  auto owned = std::make_unique<CLI::App>("trl.cpp: train and serve Qwen3-class language models natively (TRL and Transformers concepts, no Python)", "trl");
  CLI::App& app = *owned;
  app.set_version_flag("--version", std::string("trl.cpp ") + TRL_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);
  // Parse errors read like every other error: "error: --max_new_tokens must be at least 1, got 0".
  app.failure_message(failure_text);
  register_env(app);
  register_init_model(app);
  register_score(app);
  register_demo(app);
  register_demo_grpo(app);
  register_tokenize(app);
  register_dataset_info(app);
  register_sft(app);
  register_dpo(app);
  register_kto(app);
  register_gkd(app);
  register_distill(app);
  register_grpo(app);
  register_rloo(app);
  register_reward(app);
  register_generate(app);
  register_serve(app);
  register_merge_adapter(app);
  register_compile(app);
  register_bench(app);
  return owned;
}

std::string parse_error_message(const CLI::App& app, const std::exception& e) {
  const auto* cli = dynamic_cast<const CLI::Error*>(&e);
  std::string message = cli != nullptr ? failure_text(&app, *cli) : std::string(e.what());
  if (message.rfind("error: ", 0) == 0) message = message.substr(7);
  while (!message.empty() && message.back() == '\n') message.pop_back();
  return message;
}

void deliver(std::unique_ptr<PreparedTrainer> p) {
  if (EmbeddedCall* call = embedded_call()) {
    call->prepared = std::move(p);
    return;
  }
  const TrainOutput out = p->trainer->train();
  print_train_output(out, p->generation_stats ? p->generation_stats() : nullptr);
}

}  // namespace trl::cli

// libFuzzer target: YAML configs (`--config file.yaml`) read into the training options every trainer shares, then
// checked as a run checks them (docs/TESTING.md, "Fuzzing"). Anything but options or a trl::Error (a raw yaml-cpp or
// CLI11 exception included) is a finding.
#include <cstddef>
#include <cstdint>

#include <CLI/CLI.hpp>

#include "cli/options.h"
#include "cli/train_options.h"
#include "fuzz_util.h"
#include "trl/core/error.h"

namespace {

// The options are registered once (about 200 of them: registering them per input made the target 20 times slower);
// each input starts from the defaults again.
struct Command {
  CLI::App app{"trl"};
  CLI::App* cmd = app.add_subcommand("sft", "fuzzed");
  trl::TrainingArguments c;
  trl::cli::TrainCommandArgs a;
  trl::cli::Options o{cmd};
  Command() { trl::cli::add_training_options(o, c, a); }
};

}  // namespace

TRL_FUZZ_TARGET(yaml) {
  static Command* command = new Command();  // lives for the process, as the program's command does
  command->c = trl::TrainingArguments{};
  command->a = trl::cli::TrainCommandArgs{};
  const std::string path = trl::fuzz::write("config.yaml", data, size);
  try {
    command->o.apply_yaml(path);
    trl::cli::finish_training_options("sft", command->c, command->a);
  } catch (const trl::Error&) {
  }
  return 0;
}

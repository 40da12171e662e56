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

TRL_FUZZ_TARGET(yaml) {
  const std::string path = trl::fuzz::write("config.yaml", data, size);
  try {
    CLI::App app("trl");
    CLI::App* cmd = app.add_subcommand("sft", "fuzzed");
    trl::cli::Options o(cmd);
    trl::TrainingArguments c;
    trl::cli::TrainCommandArgs a;
    trl::cli::add_training_options(o, c, a);
    o.apply_yaml(path);
    trl::cli::finish_training_options("sft", c, a);
  } catch (const trl::Error&) {
  }
  return 0;
}

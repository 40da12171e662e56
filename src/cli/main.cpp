// The `trl` command line: one binary, one subcommand per job (DESIGN.md §3).
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/cli_util.h"
#include "core/error.h"
#include "version.h"

int main(int argc, char** argv) {
  CLI::App app{"trl.cpp: train and serve Qwen3-class language models natively (TRL and Transformers concepts, no Python)", "trl"};
  app.set_version_flag("--version", std::string("trl.cpp ") + TRL_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);
  // Parse errors read like every other error: "error: --max_new_tokens must be at least 1, got 0".
  app.failure_message([](const CLI::App* cmd, const CLI::Error& e) {
    std::string where = "trl";
    for (const CLI::App* sub = cmd; sub != nullptr;) {
      const auto parsed = sub->get_subcommands();
      sub = parsed.empty() ? nullptr : parsed.front();
      if (sub != nullptr) where += " " + sub->get_name();
    }
    return "error: " + std::string(e.what()) + " (see " + where + " --help)\n";
  });
  trl::cli::register_env(app);
  trl::cli::register_init_model(app);
  trl::cli::register_score(app);
  trl::cli::register_demo(app);
  trl::cli::register_tokenize(app);
  trl::cli::register_sft(app);
  trl::cli::register_generate(app);
  trl::cli::register_compile(app);
  trl::cli::register_bench(app);
  std::string names;
  bool known = false;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
    known = known || (argc > 1 && sub->get_name() == argv[1]);
  }
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::fprintf(stderr, "error: unknown command '%s' (commands: %s; see trl --help)\n", argv[1], names.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;  // --help is 0; every usage error is 2, as argparse exits
  } catch (const trl::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

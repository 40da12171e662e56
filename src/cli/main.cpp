// The `trl` command line: one binary, one subcommand per job (docs/CLI.md).
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <algorithm>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/cli_util.h"
#include "cli/launch.h"
#include "cli/options.h"
#include "trl/core/error.h"
#include "trl/dist/communicator.h"
#include "trl/runtime/runtime.h"
#include "version.h"

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

// Under mpirun: the rank's error, then the whole job ends (the other ranks may be waiting in a collective).
[[noreturn]] void fail_job(const std::string& message, int code) {
  std::fprintf(stderr, "error: %s%s\n", trl::dist::rank_prefix().c_str(), message.c_str());
  trl::dist::world().abort(code);
  std::_Exit(code);  // not reached
}

// Under an MPI launcher: MPI starts, each rank pins itself to its cores (before any OpenMP thread exists), and a
// process count given (--nproc_per_node, --num_processes) must match the local ranks. Outside one, a count N > 1
// starts mpirun. Returns the arguments to parse.
std::vector<std::string> start_distributed(int argc, char** argv) {
  const trl::cli::LaunchRequest launch = trl::cli::take_launch_options(argc, argv);
  const auto say_notes = [&] {
    for (const std::string& n : launch.notes) std::fprintf(stderr, "[trl] note: %s\n", n.c_str());
  };
  if (!trl::dist::launched_by_mpi()) {
    say_notes();
    if (launch.nproc_per_node > 1) trl::cli::exec_mpirun(launch);
    return trl::cli::rank_args(launch, 1);
  }
  trl::dist::Communicator& world = trl::dist::world();
  if (launch.nproc_given && launch.nproc_per_node != world.local_size())
    trl::cli::usage_fail("{} processes asked for under mpirun, which started {} ranks on this machine: give one or the other", launch.nproc_per_node,
                         world.local_size());
  if (world.rank() == 0 && std::getenv("TRL_LAUNCHED") == nullptr) say_notes();
  trl::dist::pin_local_cores(world);
  return trl::cli::rank_args(launch, world.size());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args;
  try {
    args = start_distributed(argc, argv);
    trl::apply_num_threads();  // TRL_NUM_THREADS / TRL_VISIBLE_CORES also bound the loops outside programs
  } catch (const std::exception& e) {
    const bool usage = dynamic_cast<const trl::cli::UsageError*>(&e) != nullptr;
    const std::string message = usage && argc > 1 && argv[1][0] != '-' ? fmt::format("{} (see trl {} --help)", e.what(), argv[1]) : std::string(e.what());
    if (trl::dist::launched_by_mpi()) fail_job(message, usage ? 2 : 1);
    std::fprintf(stderr, "error: %s\n", message.c_str());
    return usage ? 2 : 1;
  }
  const bool job = trl::dist::launched_by_mpi() && trl::dist::world().size() > 1;
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  argc = static_cast<int>(arg_ptrs.size());
  arg_ptrs.push_back(nullptr);
  argv = arg_ptrs.data();
  CLI::App app{"trl.cpp: train and serve Qwen3-class language models natively (TRL and Transformers concepts, no Python)", "trl"};
  app.set_version_flag("--version", std::string("trl.cpp ") + TRL_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);
  // Parse errors read like every other error: "error: --max_new_tokens must be at least 1, got 0".
  const auto failure = [](const CLI::App* cmd, const CLI::Error& e) {
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
  };
  app.failure_message(failure);
  trl::cli::register_env(app);
  trl::cli::register_init_model(app);
  trl::cli::register_score(app);
  trl::cli::register_demo(app);
  trl::cli::register_demo_grpo(app);
  trl::cli::register_tokenize(app);
  trl::cli::register_dataset_info(app);
  trl::cli::register_sft(app);
  trl::cli::register_dpo(app);
  trl::cli::register_kto(app);
  trl::cli::register_gkd(app);
  trl::cli::register_distill(app);
  trl::cli::register_grpo(app);
  trl::cli::register_rloo(app);
  trl::cli::register_reward(app);
  trl::cli::register_generate(app);
  trl::cli::register_merge_adapter(app);
  trl::cli::register_compile(app);
  trl::cli::register_bench(app);
  std::string names;
  bool known = false;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
    known = known || (argc > 1 && sub->get_name() == argv[1]);
  }
  if (argc > 1 && argv[1][0] != '-' && !known) {
    const std::string message = fmt::format("unknown command '{}' (commands: {}; see trl --help)", argv[1], names);
    if (job) fail_job(message, 2);
    std::fprintf(stderr, "error: %s\n", message.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (job && e.get_exit_code() != 0) {
      std::string message = failure(&app, e);
      if (message.rfind("error: ", 0) == 0) message = message.substr(7);
      while (!message.empty() && message.back() == '\n') message.pop_back();
      fail_job(message, 2);
    }
    const int rc = app.exit(e);
    trl::dist::finalize();
    return rc == 0 ? 0 : 2;  // --help is 0; every usage error is 2, as argparse exits
  } catch (const std::exception& e) {
    const bool usage = dynamic_cast<const trl::cli::UsageError*>(&e) != nullptr;  // usage errors exit 2, as argparse's do
    const std::string message = usage ? fmt::format("{} (see trl {} --help)", e.what(), argv[1]) : std::string(e.what());
    if (job) fail_job(message, usage ? 2 : 1);
    std::fprintf(stderr, "error: %s\n", message.c_str());
    return usage ? 2 : 1;
  }
  trl::dist::finalize();
  return 0;
}

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
#include "cli/embed.h"
#include "cli/launch.h"
#include "cli/options.h"
#include "trl/core/error.h"
#include "trl/dist/communicator.h"
#include "trl/runtime/runtime.h"
#include "version.h"

namespace {

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
  const std::unique_ptr<CLI::App> owned = trl::cli::make_app();
  CLI::App& app = *owned;
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
      fail_job(trl::cli::parse_error_message(app, e), 2);
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

#include "cli/launch.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

#include "trl/core/error.h"

namespace trl::cli {

std::optional<LaunchRequest> take_nproc_per_node(int argc, char** argv) {
  LaunchRequest r;
  bool found = false;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    std::string value;
    bool match = false;
    for (const char* name : {"--nproc_per_node", "--nproc-per-node"}) {
      const std::string n = name;
      if (a == n) {
        if (i + 1 >= argc) fail("--nproc_per_node needs a value: the number of processes to start on this machine, such as 2");
        value = argv[++i], match = true;
      } else if (a.rfind(n + "=", 0) == 0) {
        value = a.substr(n.size() + 1), match = true;
      }
    }
    if (!match) {
      r.args.push_back(a);
      continue;
    }
    if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos || value.size() > 4 || std::stoi(value) < 1)
      fail("--nproc_per_node {}: expected a whole number >= 1 (the processes to start on this machine)", value);
    r.nproc_per_node = std::stoi(value), found = true;
  }
  if (!found) return std::nullopt;
  return r;
}

std::vector<std::string> mpirun_command(const LaunchRequest& r, const std::string& self, int machine_cores, bool as_root) {
  const char* mpirun = std::getenv("TRL_MPIRUN");
  std::vector<std::string> cmd{mpirun && *mpirun ? mpirun : "mpirun", "-np", std::to_string(r.nproc_per_node), "--bind-to", "none"};
  if (as_root) cmd.emplace_back("--allow-run-as-root");  // containers run as root; the user asked for these processes
  if (r.nproc_per_node > machine_cores) cmd.emplace_back("--oversubscribe");
  if (const char* extra = std::getenv("TRL_MPIRUN_ARGS"); extra && *extra) {
    std::istringstream in(extra);
    for (std::string w; in >> w;) cmd.push_back(w);
  }
  cmd.push_back(self);
  for (size_t i = 1; i < r.args.size(); ++i) cmd.push_back(r.args[i]);
  return cmd;
}

void exec_mpirun(const LaunchRequest& r) {
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) fail("--nproc_per_node: cannot find this program's path (/proc/self/exe: {})", ec.message());
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  const std::vector<std::string> cmd = mpirun_command(r, self, static_cast<int>(cores > 0 ? cores : 1), ::geteuid() == 0);
  std::vector<char*> argv;
  for (const std::string& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  fail("--nproc_per_node {}: cannot run {}: {} (install Open MPI: apt-get install openmpi-bin, or set TRL_MPIRUN to its mpirun)", r.nproc_per_node,
       cmd[0], std::strerror(errno));
}

}  // namespace trl::cli

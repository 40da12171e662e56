// `trl <command> --nproc_per_node N ...`: the process starts N ranks of itself through Open MPI's mpirun, as
// torchrun does for a Python script (docs/DISTRIBUTED.md, "Launching").
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace trl::cli {

struct LaunchRequest {
  int nproc_per_node = 1;
  std::vector<std::string> args;  // argv without --nproc_per_node
};
// Finds and removes --nproc_per_node N / --nproc_per_node=N (or --nproc-per-node); nullopt when absent. Throws on a
// value that is not a whole number >= 1.
std::optional<LaunchRequest> take_nproc_per_node(int argc, char** argv);
// The mpirun command line that runs `args` as N local ranks (mpirun from PATH, or TRL_MPIRUN; TRL_MPIRUN_ARGS adds
// options such as "--mca btl tcp,self"). Ranks are not bound by mpirun: each one pins itself (pin_local_cores).
std::vector<std::string> mpirun_command(const LaunchRequest& r, const std::string& self, int machine_cores, bool as_root);
// Replaces this process with mpirun; returns only on failure (with the error thrown).
[[noreturn]] void exec_mpirun(const LaunchRequest& r);

}  // namespace trl::cli

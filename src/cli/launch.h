// The launcher's options, read before a command starts (docs/DISTRIBUTED.md, "Launching"):
//   trl <command> --nproc_per_node N ...   (torchrun's name)
//   trl <command> --num_processes N ...    (TRL's and accelerate's name; the same thing)
//   trl <command> --accelerate_config zero2|fsdp2|multi_gpu|...|FILE.yaml
// and, in a --config YAML file, the keys TRL hands to its launcher: env (variables set before anything starts, as
// TRL's parser sets them), num_processes, accelerate_config, num_machines, mixed_precision, main_process_port.
// N > 1 outside an MPI launcher starts N ranks of this program through Open MPI's mpirun, as torchrun does for a
// Python script.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace trl::cli {

struct LaunchRequest {
  int nproc_per_node = 1;
  bool nproc_given = false;  // a process count was asked for (--nproc_per_node, --num_processes, num_processes:)
  // An accelerate config that shards (DeepSpeed ZeRO 1-3, FSDP 1-2): the ranks shard their masters, gradients and
  // AdamW moments (--fsdp_size = the ranks), unless fsdp_size is given.
  bool sharded = false;
  bool fsdp_size_given = false;
  std::vector<std::string> args;   // argv without the launcher's options
  std::vector<std::string> notes;  // what the accelerate options mean here, said once on stderr
};

// Reads and removes the launcher's options from argv, reads the --config file's launcher keys and sets its env:
// block. Throws a UsageError that names the option (and the file and line) for a value it cannot use.
LaunchRequest take_launch_options(int argc, char** argv);
// The arguments each rank parses: `r.args`, with --fsdp_size `ranks` added when the accelerate config shards.
std::vector<std::string> rank_args(const LaunchRequest& r, int ranks);

// The mpirun command line that runs `args` as N local ranks (mpirun from PATH, or TRL_MPIRUN; TRL_MPIRUN_ARGS adds
// options such as "--mca btl tcp,self"). Ranks are not bound by mpirun: each one pins itself (pin_local_cores).
std::vector<std::string> mpirun_command(const LaunchRequest& r, const std::string& self, int machine_cores, bool as_root);
// Replaces this process with mpirun; returns only on failure (with the error thrown).
[[noreturn]] void exec_mpirun(const LaunchRequest& r);

}  // namespace trl::cli

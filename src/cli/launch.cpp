#include "cli/launch.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <type_traits>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "cli/options.h"
#include "trl/core/error.h"

namespace trl::cli {

namespace {

bool is_training_command(const std::string& c) {
  for (const char* t : {"sft", "dpo", "kto", "reward", "grpo", "rloo", "gkd", "distill"})
    if (c == t) return true;
  return false;
}

// At most 4 ranks per core: more is a typo (--num_processes 1000 would start a thousand processes), not a run.
int process_count(const std::string& value, const std::string& where) {
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos)
    usage_fail("{} {}: expected a whole number >= 1 (the processes to start on this machine)", where, value);
  const size_t digits = value.find_first_not_of('0');
  const long n = digits == std::string::npos || value.size() - digits > 6 ? (digits == std::string::npos ? 0 : 1000000) : std::stol(value);
  if (n < 1) usage_fail("{} {}: expected a whole number >= 1 (the processes to start on this machine)", where, value);
  if (n > 4 * cores)
    usage_fail("{} {}: more than 4 processes per core of this machine's {} core{}: give at most {} (one per core is the usual)", where, value, cores,
               cores == 1 ? "" : "s", 4 * cores);
  return static_cast<int>(n);
}

// What an accelerate config means here: TRL's presets by name, or a file of accelerate's format.
struct AccelerateConfig {
  std::string distributed_type;  // NO, MULTI_GPU, MULTI_CPU, DEEPSPEED, FSDP
  int zero_stage = 0, fsdp_version = 0, num_processes = 0, num_machines = 1;
};

AccelerateConfig accelerate_config(const std::string& value, const std::string& where) {
  struct Preset {
    const char* name;
    AccelerateConfig c;
  };
  static const Preset presets[] = {{"zero1", {"DEEPSPEED", 1, 0, 8, 1}}, {"zero2", {"DEEPSPEED", 2, 0, 8, 1}}, {"zero3", {"DEEPSPEED", 3, 0, 8, 1}},
                                   {"fsdp1", {"FSDP", 0, 1, 8, 1}},      {"fsdp2", {"FSDP", 0, 2, 8, 1}},      {"multi_gpu", {"MULTI_GPU", 0, 0, 8, 1}},
                                   {"single_gpu", {"NO", 0, 0, 8, 1}}};
  std::error_code ec;
  if (!std::filesystem::is_regular_file(value, ec)) {
    for (const Preset& p : presets)
      if (value == p.name) return p.c;
    usage_fail("{} {}: neither a file nor one of TRL's presets (zero1, zero2, zero3, fsdp1, fsdp2, multi_gpu, single_gpu)", where, value);
  }
  AccelerateConfig c;
  YAML::Node n;
  try {  // a regular file: yaml-cpp throws only its own exceptions on it
    n = YAML::LoadFile(value);
  } catch (const YAML::Exception& e) {
    usage_fail("{} {}: not a readable accelerate config (line {}): {}", where, value, e.mark.line + 1, e.msg);
  }
  if (!n.IsMap()) usage_fail("{} {}: not an accelerate config (expected a mapping with distributed_type)", where, value);
  // Each key as its type, or an error naming the key and its line.
  const auto get = [&](const YAML::Node& node, const char* key, auto fallback) {
    using T = decltype(fallback);
    if (!node || !node.IsMap() || !node[key] || node[key].IsNull()) return fallback;
    try {
      return node[key].template as<T>();
    } catch (const YAML::Exception&) {
      usage_fail("{} {}:{}: {} must be {}", where, value, node[key].Mark().line + 1, key, std::is_same_v<T, int> ? "a whole number" : "a word");
    }
  };
  c.distributed_type = get(n, "distributed_type", std::string("NO"));
  if (n["deepspeed_config"] && c.distributed_type == "NO")
    usage_fail("{} {}: has a deepspeed_config but distributed_type NO (accelerate's config writes distributed_type: DEEPSPEED)", where, value);
  c.zero_stage = get(n["deepspeed_config"], "zero_stage", 2);  // accelerate's default stage
  c.fsdp_version = get(n["fsdp_config"], "fsdp_version", 1);
  c.num_processes = get(n, "num_processes", 0);
  c.num_machines = get(n, "num_machines", 1);
  if (c.distributed_type == "DEEPSPEED" && (c.zero_stage < 0 || c.zero_stage > 3))
    usage_fail("{} {}: zero_stage {} is not a DeepSpeed ZeRO stage (0 to 3)", where, value, c.zero_stage);
  if (c.distributed_type == "FSDP" && c.fsdp_version != 1 && c.fsdp_version != 2)
    usage_fail("{} {}: fsdp_version {} is not 1 or 2", where, value, c.fsdp_version);
  if (c.num_machines < 1) usage_fail("{} {}: num_machines {} must be at least 1", where, value, c.num_machines);
  return c;
}

// The --config file's launcher keys (and its env: block, set here).
struct YamlLaunchKeys {
  std::optional<std::string> num_processes, accelerate_config;
  bool fsdp_size = false;
  std::vector<std::string> notes;
};

YamlLaunchKeys read_yaml_launch_keys(const std::string& path) {
  YamlLaunchKeys k;
  YAML::Node root;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return k;  // a folder, a missing file: the command's --config reports it
  try {
    root = YAML::LoadFile(path);
  } catch (const std::exception&) {
    return k;  // the command's own reading of --config reports it, with its line
  }
  if (!root.IsMap()) return k;
  for (const auto& kv : root) {
    if (!kv.first.IsScalar()) continue;
    const std::string key = kv.first.as<std::string>();
    const int line = kv.first.Mark().line + 1;
    const auto scalar = [&]() -> std::string {
      if (!kv.second.IsScalar()) usage_fail("--config {}:{}: '{}' must be a single value", path, line, key);
      return kv.second.as<std::string>();
    };
    if (key == "env") {  // TRL's TrlParser sets these before the run
      if (kv.second.IsNull()) continue;
      if (!kv.second.IsMap()) usage_fail("--config {}:{}: env must be a mapping of VARIABLE: value", path, line);
      for (const auto& v : kv.second) {
        if (!v.first.IsScalar() || !v.second.IsScalar()) usage_fail("--config {}:{}: env: each entry must be VARIABLE: value", path, line);
        const std::string name = v.first.as<std::string>();
        if (name.empty() || name.find('=') != std::string::npos)
          usage_fail("--config {}:{}: env: '{}' is not a variable name", path, v.first.Mark().line + 1, name);
        ::setenv(name.c_str(), v.second.as<std::string>().c_str(), 1);
      }
    } else if (key == "num_processes" || key == "nproc_per_node") {
      if (k.num_processes && *k.num_processes != scalar())
        usage_fail("--config {}:{}: {} {} and a process count of {} above: give one", path, line, key, scalar(), *k.num_processes);
      k.num_processes = scalar();
      (void)process_count(*k.num_processes, fmt::format("--config {}:{}: {}", path, line, key));
    } else if (key == "accelerate_config") {
      k.accelerate_config = scalar();
    } else if (key == "fsdp_size") {
      k.fsdp_size = true;
    } else if (key == "num_machines") {
      if (scalar() != "1")
        usage_fail("--config {}:{}: num_machines {}: one machine per launch; for several, start the ranks with mpirun and a hostfile "
                   "(docs/DISTRIBUTED.md)", path, line, scalar());
    } else if (key == "mixed_precision") {
      k.notes.push_back(fmt::format("mixed_precision: {} in {}: the compute dtype follows --bf16 (true by default)", scalar(), path));
    } else if (key == "main_process_port") {
      k.notes.push_back(fmt::format("main_process_port in {}: not used (the ranks meet through Open MPI)", path));
    }
  }
  return k;
}

}  // namespace

LaunchRequest take_launch_options(int argc, char** argv) {
  LaunchRequest r;
  std::optional<std::string> nproc, nproc_flag, accel, config, config_file;
  std::string accel_where = "--accelerate_config";
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    // `--name VALUE` or `--name=VALUE`, with underscores or dashes; nullopt when argv[i] is another word.
    const auto value_of = [&](const std::string& name, const char* what) -> std::optional<std::string> {
      std::string dashed = name;
      std::replace(dashed.begin() + 2, dashed.end(), '_', '-');
      for (const std::string& form : {name, dashed}) {
        if (a == form) {
          if (i + 1 >= argc) usage_fail("{} needs a value: {}", name, what);
          return std::string(argv[++i]);
        }
        if (a.rfind(form + "=", 0) == 0) return a.substr(form.size() + 1);
      }
      return std::nullopt;
    };
    bool counted = false;
    for (const char* flag : {"--nproc_per_node", "--num_processes"}) {  // torchrun's name and TRL's
      if (auto v = value_of(flag, "the number of processes to start on this machine, such as 2")) {
        // The same flag repeated: the last wins (argparse's rule); the two names with different counts: an error.
        if (nproc && *nproc != *v && *nproc_flag != flag) usage_fail("{} {} and {} {}: give one process count", *nproc_flag, *nproc, flag, *v);
        nproc = *v, nproc_flag = flag, counted = true;
        break;
      }
    }
    if (counted) continue;
    if (auto v = value_of("--accelerate_config", "a preset (zero1, zero2, zero3, fsdp1, fsdp2, multi_gpu, single_gpu) or an accelerate YAML file")) {
      accel = *v;
      continue;
    }
    if (auto v = value_of("--config_file", "an accelerate config file (accelerate launch's option)")) {  // accelerate's own name
      std::error_code ec;
      if (std::filesystem::is_directory(*v, ec)) usage_fail("--config_file {}: is a folder; expected an accelerate config file (YAML)", *v);
      if (!std::filesystem::is_regular_file(*v, ec)) usage_fail("--config_file {}: no such file (an accelerate config file)", *v);
      config_file = *v;
      continue;
    }
    if ((a == "--config") && i + 1 < argc) config = argv[i + 1];
    else if (a.rfind("--config=", 0) == 0) config = a.substr(9);
    if (a == "--fsdp_size" || a == "--fsdp-size" || a.rfind("--fsdp_size=", 0) == 0 || a.rfind("--fsdp-size=", 0) == 0) r.fsdp_size_given = true;
    r.args.push_back(a);
  }
  if (config_file) {
    if (accel) usage_fail("--config_file {} and --accelerate_config {}: give one accelerate config", *config_file, *accel);
    accel = config_file, accel_where = "--config_file";
  }
  if (config) {
    YamlLaunchKeys k = read_yaml_launch_keys(*config);
    if (!nproc && k.num_processes) nproc = k.num_processes, nproc_flag = "--config " + *config + ": num_processes";
    if (!accel && k.accelerate_config) accel = k.accelerate_config, accel_where = "--config " + *config + ": accelerate_config";
    r.fsdp_size_given = r.fsdp_size_given || k.fsdp_size;
    r.notes.insert(r.notes.end(), k.notes.begin(), k.notes.end());
  }
  if (nproc) r.nproc_per_node = process_count(*nproc, *nproc_flag), r.nproc_given = true;
  if (accel) {
    const std::string command = argc > 1 ? argv[1] : "";
    if (!is_training_command(command)) usage_fail("{}: only the training commands (sft, dpo, kto, reward, grpo, rloo, gkd, distill) take it", accel_where);
    const AccelerateConfig c = accelerate_config(*accel, accel_where);
    if (c.num_machines > 1)
      usage_fail("{} {}: num_machines {}: one machine per launch; for several, start the ranks with mpirun and a hostfile (docs/DISTRIBUTED.md)",
                 accel_where, *accel, c.num_machines);
    const std::string ranks = fmt::format("{} rank{}", r.nproc_per_node, r.nproc_per_node == 1 ? "" : "s");
    if ((c.distributed_type == "DEEPSPEED" && c.zero_stage > 0) || c.distributed_type == "FSDP") {
      r.sharded = true;
      const std::string kind = c.distributed_type == "DEEPSPEED" ? fmt::format("DeepSpeed ZeRO-{}", c.zero_stage) : fmt::format("FSDP{}", c.fsdp_version == 0 ? "" : std::to_string(c.fsdp_version));
      r.notes.push_back(fmt::format("{} {}: {} runs as trl.cpp's sharded data parallel over {} (--fsdp_size: f32 masters, gradient sums and "
                                    "AdamW moments sharded; docs/DISTRIBUTED.md){}",
                                    accel_where, *accel, kind, ranks, r.fsdp_size_given ? ", with the fsdp_size given" : ""));
    } else if (c.distributed_type == "MULTI_GPU" || c.distributed_type == "MULTI_CPU" || c.distributed_type == "NO" || c.distributed_type == "DEEPSPEED") {
      r.notes.push_back(fmt::format("{} {}: plain data parallel over {}", accel_where, *accel, ranks));
    } else {
      usage_fail("{} {}: distributed_type {} has no counterpart here (trl.cpp runs NO, MULTI_GPU/MULTI_CPU as data parallel, DEEPSPEED and "
                 "FSDP as sharded data parallel)", accel_where, *accel, c.distributed_type);
    }
    if (c.num_processes > 0 && c.num_processes != r.nproc_per_node)
      r.notes.push_back(fmt::format("{} {}: its num_processes ({}) is not used: trl.cpp starts the ranks --num_processes asks for ({})", accel_where,
                                    *accel, c.num_processes, r.nproc_per_node));
  }
  return r;
}

std::vector<std::string> rank_args(const LaunchRequest& r, int ranks) {
  std::vector<std::string> args = r.args;
  if (r.sharded && ranks > 1 && !r.fsdp_size_given) {
    args.emplace_back("--fsdp_size");
    args.push_back(std::to_string(ranks));
  }
  return args;
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
  const std::vector<std::string> args = rank_args(r, r.nproc_per_node);
  for (size_t i = 1; i < args.size(); ++i) cmd.push_back(args[i]);
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
  ::setenv("TRL_LAUNCHED", "1", 1);  // the ranks know their launcher said the notes already
  ::execvp(argv[0], argv.data());
  fail("--nproc_per_node {}: cannot run {}: {} (install Open MPI: apt-get install openmpi-bin, or set TRL_MPIRUN to its mpirun)", r.nproc_per_node,
       cmd[0], std::strerror(errno));
}

}  // namespace trl::cli

// The launcher's options (src/cli/launch.h): torchrun's --nproc_per_node, TRL's --num_processes and
// --accelerate_config (its presets and accelerate's YAML files), and a --config file's launcher keys and env: block.
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/launch.h"
#include "cli/options.h"
#include "test_util.h"

namespace trl::cli {
namespace {

LaunchRequest take(std::vector<std::string> args) {
  args.insert(args.begin(), "trl");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return take_launch_options(static_cast<int>(argv.size()), argv.data());
}

std::string usage_error_of(const std::vector<std::string>& args) {
  try {
    take(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

bool says(const LaunchRequest& r, const std::string& text) {
  for (const std::string& n : r.notes)
    if (n.find(text) != std::string::npos) return true;
  return false;
}

TEST(Launch, NumProcessesIsNprocPerNode) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"sft", "--num_processes", "2", "--max_steps", "1"}, {"sft", "--num-processes=2", "--max_steps", "1"},
        {"sft", "--nproc_per_node", "2", "--max_steps", "1"}, {"sft", "--nproc_per_node=2", "--num_processes", "2", "--max_steps", "1"}}) {
    const LaunchRequest r = take(args);
    EXPECT_TRUE(r.nproc_given);
    EXPECT_EQ(r.nproc_per_node, 2);
    EXPECT_EQ(r.args, (std::vector<std::string>{"trl", "sft", "--max_steps", "1"})) << args[1];
    EXPECT_FALSE(r.sharded);
  }
  const LaunchRequest none = take({"sft", "--max_steps", "1"});
  EXPECT_FALSE(none.nproc_given);
  EXPECT_EQ(none.nproc_per_node, 1);
  EXPECT_NE(usage_error_of({"sft", "--num_processes", "2", "--nproc_per_node", "4"}).find("--num_processes 2 and --nproc_per_node 4: give one process count"),
            std::string::npos);
  EXPECT_NE(usage_error_of({"sft", "--num_processes", "x"}).find("--num_processes x: expected a whole number >= 1"), std::string::npos);
  EXPECT_EQ(take({"sft", "--num_processes", "1", "--num_processes", "2"}).nproc_per_node, 2);  // repeated: the last wins
  EXPECT_EQ(take({"sft", "--num_processes", "002"}).nproc_per_node, 2);
  EXPECT_NE(usage_error_of({"sft", "--num_processes", "1000"}).find("--num_processes 1000: more than 4 processes per core"), std::string::npos);
  EXPECT_NE(usage_error_of({"sft", "--num_processes", "99999999999999999999"}).find("more than 4 processes per core"), std::string::npos);
  EXPECT_NE(usage_error_of({"sft", "--num_processes", "0000"}).find("expected a whole number >= 1"), std::string::npos);
  EXPECT_NE(usage_error_of({"sft", "--num_processes"}).find("--num_processes needs a value"), std::string::npos);
}

// TRL's presets: DeepSpeed ZeRO and FSDP shard (--fsdp_size = the ranks, unless given), multi_gpu is plain data
// parallel; the preset's num_processes (8, for 8 GPUs) is not used.
TEST(Launch, AccelerateConfigsMapToShardingOrDataParallel) {
  for (const char* preset : {"zero1", "zero2", "zero3", "fsdp1", "fsdp2"}) {
    const LaunchRequest r = take({"dpo", "--accelerate_config", preset, "--num_processes", "2"});
    EXPECT_TRUE(r.sharded) << preset;
    EXPECT_EQ(rank_args(r, 2), (std::vector<std::string>{"trl", "dpo", "--fsdp_size", "2"})) << preset;
    EXPECT_EQ(rank_args(r, 1), (std::vector<std::string>{"trl", "dpo"})) << preset;
    EXPECT_TRUE(says(r, "its num_processes (8) is not used")) << preset;
    const std::vector<std::string> cmd = mpirun_command(r, "/bin/trl", 4, false);
    EXPECT_EQ(std::vector<std::string>(cmd.end() - 3, cmd.end()), (std::vector<std::string>{"dpo", "--fsdp_size", "2"})) << preset;
  }
  EXPECT_TRUE(says(take({"sft", "--accelerate_config", "zero3"}), "DeepSpeed ZeRO-3 runs as trl.cpp's sharded data parallel over 1 rank"));
  const LaunchRequest given = take({"sft", "--accelerate_config=zero2", "--num_processes", "4", "--fsdp_size", "2"});
  EXPECT_EQ(rank_args(given, 4), (std::vector<std::string>{"trl", "sft", "--fsdp_size", "2"}));  // hybrid sharding kept
  const LaunchRequest dp = take({"grpo", "--accelerate_config", "multi_gpu", "--num_processes", "2"});
  EXPECT_FALSE(dp.sharded);
  EXPECT_TRUE(says(dp, "plain data parallel over 2 ranks"));
  EXPECT_NE(usage_error_of({"sft", "--accelerate_config", "zero4"}).find("neither a file nor one of TRL's presets"), std::string::npos);
  EXPECT_NE(usage_error_of({"score", "--accelerate_config", "zero2"}).find("only the training commands"), std::string::npos);
}

TEST(Launch, AccelerateConfigFilesAreRead) {
  test::TempDir dir;
  test::write_file(dir.file("fsdp.yaml"), "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\nnum_processes: 2\n");
  const LaunchRequest r = take({"sft", "--accelerate_config", dir.file("fsdp.yaml"), "--num_processes", "2"});
  EXPECT_TRUE(r.sharded);
  EXPECT_TRUE(says(r, "FSDP2 runs as trl.cpp's sharded data parallel over 2 ranks"));
  EXPECT_FALSE(says(r, "is not used"));
  test::write_file(dir.file("xla.yaml"), "distributed_type: XLA\n");
  EXPECT_NE(usage_error_of({"sft", "--accelerate_config", dir.file("xla.yaml")}).find("distributed_type XLA has no counterpart here"), std::string::npos);
  test::write_file(dir.file("two.yaml"), "distributed_type: MULTI_GPU\nnum_machines: 2\n");
  EXPECT_NE(usage_error_of({"sft", "--accelerate_config", dir.file("two.yaml")}).find("num_machines 2: one machine per launch"), std::string::npos);
  test::write_file(dir.file("stage.yaml"), "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 7\n");
  EXPECT_NE(usage_error_of({"sft", "--accelerate_config", dir.file("stage.yaml")}).find("zero_stage 7 is not a DeepSpeed ZeRO stage (0 to 3)"), std::string::npos);
  test::write_file(dir.file("kind.yaml"), "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: [2]\n");
  EXPECT_NE(usage_error_of({"sft", "--accelerate_config", dir.file("kind.yaml")}).find("kind.yaml:3: zero_stage must be a whole number"), std::string::npos);
  test::write_file(dir.file("zero0.yaml"), "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 0\n");
  EXPECT_FALSE(take({"sft", "--accelerate_config", dir.file("zero0.yaml"), "--num_processes", "2"}).sharded);  // ZeRO-0: plain data parallel
  EXPECT_NE(usage_error_of({"sft", "--config_file", dir.file("zero0.yaml"), "--accelerate_config", "zero3"}).find("give one accelerate config"),
            std::string::npos);
  EXPECT_NE(usage_error_of({"sft", "--config_file", dir.path()}).find("is a folder"), std::string::npos);
  test::write_file(dir.file("bad.yaml"), "distributed_type: [\n");
  EXPECT_NE(usage_error_of({"sft", "--accelerate_config", dir.file("bad.yaml")}).find("not a readable accelerate config"), std::string::npos);
}

// A --config file: env: is set at once (TRL's TrlParser does the same), num_processes and accelerate_config count
// as the flags do (the command line wins), fsdp_size there counts as given.
TEST(Launch, ConfigFilesGiveLauncherKeysAndEnv) {
  test::TempDir dir;
  ::unsetenv("TRL_LAUNCH_TEST_VAR");
  test::write_file(dir.file("c.yaml"), "env:\n  TRL_LAUNCH_TEST_VAR: 5\nnum_processes: 2\naccelerate_config: zero3\nmixed_precision: bf16\nmax_steps: 1\n");
  const LaunchRequest r = take({"sft", "--config", dir.file("c.yaml")});
  ASSERT_NE(std::getenv("TRL_LAUNCH_TEST_VAR"), nullptr);
  EXPECT_STREQ(std::getenv("TRL_LAUNCH_TEST_VAR"), "5");
  EXPECT_EQ(r.nproc_per_node, 2);
  EXPECT_TRUE(r.sharded);
  EXPECT_EQ(r.args, (std::vector<std::string>{"trl", "sft", "--config", dir.file("c.yaml")}));  // the command reads the file too
  EXPECT_TRUE(says(r, "mixed_precision: bf16"));
  EXPECT_EQ(take({"sft", "--config", dir.file("c.yaml"), "--num_processes", "1"}).nproc_per_node, 1);
  test::write_file(dir.file("f.yaml"), "accelerate_config: zero2\nfsdp_size: 1\nnum_processes: 2\n");
  EXPECT_EQ(rank_args(take({"sft", "--config", dir.file("f.yaml")}), 2), (std::vector<std::string>{"trl", "sft", "--config", dir.file("f.yaml")}));
  test::write_file(dir.file("n.yaml"), "num_processes: many\n");
  EXPECT_NE(usage_error_of({"sft", "--config", dir.file("n.yaml")}).find("n.yaml:1: num_processes many: expected a whole number"), std::string::npos);
  test::write_file(dir.file("m.yaml"), "num_machines: 2\n");
  EXPECT_NE(usage_error_of({"sft", "--config", dir.file("m.yaml")}).find("m.yaml:1: num_machines 2: one machine per launch"), std::string::npos);
  test::write_file(dir.file("e.yaml"), "env:\n  A=B: 1\n");
  EXPECT_NE(usage_error_of({"sft", "--config", dir.file("e.yaml")}).find("e.yaml:2: env: 'A=B' is not a variable name"), std::string::npos);
  // A file that does not parse is left to the command, which names its line.
  test::write_file(dir.file("broken.yaml"), "a: [\n");
  EXPECT_EQ(usage_error_of({"sft", "--config", dir.file("broken.yaml")}), "");
}

}  // namespace
}  // namespace trl::cli

// Data parallel under Open MPI (docs/DISTRIBUTED.md): a run of 2 ranks × per_device_train_batch_size 2 is the run
// of one process with batch 4 (losses, token counts, final weights), also with accumulation and a short last
// micro-batch that leaves one rank without rows; a 2-rank checkpoint resumes in 1 and in 2 ranks; ranks over TCP
// only (as on two hosts); a rank that fails ends the job with its error; the core split between local ranks. FSDP:
// the same equalities, half the optimizer state per rank, consolidated checkpoints that resume in any layout. Tensor
// parallel: 2 ranks with one batch are one process with it (every trainer), also combined with data parallel and
// with FSDP on 4 ranks; its checkpoints are whole and resume in any layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "trl/core/error.h"
#include "trl/dist/communicator.h"
#include "trl/io/safetensors.h"

namespace trl {
namespace {

using json = nlohmann::json;
const std::string kTrl = TRL_BINARY;
const std::string kEnv = test::mpirun_env();
const std::string kMpirun = kEnv + "timeout 600 mpirun -np 2 --bind-to none ";

class Distributed : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::run_command("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin)";
    // Under the sanitizers (5-10x slower), one test per distributed code path runs: data parallel, FSDP, tensor
    // parallel and a failing rank, with leak checking in every rank (test::mpirun_env()); the rest are Release-only.
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    if (test::kSanitized && name != "SftTwoRanksEqualOneProcessWithTheirBatch" && name != "FsdpTwoRanksEqualOneProcessWithHalfTheOptimizerStateEach" &&
        name != "TensorParallelInBf16FollowsOneProcess" && name != "AFailingRankEndsTheJobWithItsError")
      GTEST_SKIP() << "runs in the Release pass (docs/TESTING.md)";
    ASSERT_EQ(test::run_command(fmt::format("{} init-model --preset tiny --seed 3 --vocab_size {} --out {} > /dev/null 2>&1", kTrl, test::kCutVocab, dir_.file("model"))), 0);
    // 13 rows of uneven lengths: micro-batches of 4 rows leave a last one of 1 row (rank 1 has none of it).
    std::ofstream sft(dir_.file("sft.jsonl")), dpo(dir_.file("dpo.jsonl")), kto(dir_.file("kto.jsonl"));
    const char* words[] = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta"};
    for (int i = 0; i < 13; ++i) {
      std::string text;
      for (int w = 0; w < 3 + (i * 7) % 23; ++w) text += fmt::format("{}{}", w ? " " : "", words[(i * 5 + w * 3) % 6]);
      sft << json{{"text", text}}.dump() << "\n";
      dpo << json{{"prompt", fmt::format("Say {}", words[i % 6])}, {"chosen", fmt::format(" {}", text)}, {"rejected", fmt::format(" {}", words[(i + 1) % 6])}}.dump()
          << "\n";
      kto << json{{"prompt", fmt::format("Say {}", words[i % 6])}, {"completion", fmt::format(" {}", text)}, {"label", i % 3 != 0}}.dump() << "\n";
    }
  }
  // The options every run shares (the trainer's name comes before them).
  std::string common(const std::string& data) const {
    return fmt::format("--model_name_or_path {} --dataset_name {} --max_steps 4 --logging_steps 1 --bf16 false --learning_rate 1e-3 "
                       "--report false --save_steps 2 --gradient_accumulation_steps 2",
                       dir_.file("model"), dir_.file(data));
  }
  // Runs a command; on failure the test fails with its output.
  void run(const std::string& cmd, int expect = 0) {
    std::string out;
    const int rc = test::run_command(cmd + " 2>&1", &out);
    ASSERT_EQ(rc, expect) << cmd << "\n" << out;
  }
  // 8 prompt-only rows for GRPO and RLOO; returns the file.
  std::string write_prompts() const {
    std::ofstream p(dir_.file("prompts.jsonl"));
    for (int i = 0; i < 8; ++i) p << json{{"prompt", fmt::format("Count to {}:", i + 2)}}.dump() << "\n";
    return dir_.file("prompts.jsonl");
  }
  std::vector<json> log(const std::string& out) const {
    std::vector<json> entries;
    std::ifstream in(dir_.file(out + "/log.jsonl"));
    for (std::string line; std::getline(in, line);) entries.push_back(json::parse(line));
    return entries;
  }
  // Losses and token counts agree step by step (relative 1e-6, f32, plus `abs_tol` for losses that are small
  // differences of larger terms), and so do the final weights.
  void expect_same_run(const std::string& a, const std::string& b, size_t steps = 4, double abs_tol = 0) {
    const std::vector<json> la = log(a), lb = log(b);
    ASSERT_EQ(la.size(), steps);
    ASSERT_EQ(lb.size(), steps);
    for (size_t i = 0; i < steps; ++i) {
      const double x = la[i]["loss"], y = lb[i]["loss"];
      EXPECT_TRUE(std::isfinite(x) && std::fabs(x - y) <= 1e-6 * std::fabs(x) + abs_tol) << "step " << i + 1 << ": " << x << " vs " << y;
      EXPECT_EQ(la[i]["num_tokens"], lb[i]["num_tokens"]) << "step " << i + 1;
      EXPECT_EQ(la[i]["step"], lb[i]["step"]);
    }
    // A LoRA run saves its adapter instead of the model.
    const std::string weights = std::ifstream(dir_.file(a + "/adapter_model.safetensors")).good() ? "/adapter_model.safetensors" : "/model.safetensors";
    const SafeTensorsFile fa = SafeTensorsFile::open(dir_.file(a + weights));
    const SafeTensorsFile fb = SafeTensorsFile::open(dir_.file(b + weights));
    ASSERT_EQ(fa.names(), fb.names());
    double worst = 0;
    for (const std::string& name : fa.names()) {
      const Tensor ta = fa.get(name).to(DType::F32), tb = fb.get(name).to(DType::F32);
      ASSERT_EQ(ta.shape(), tb.shape()) << name;
      for (int64_t i = 0; i < ta.numel(); ++i) worst = test::nan_max(worst, std::fabs(ta.data_as<float>()[i] - tb.data_as<float>()[i]));
    }
    // Adam divides each moment by its own square root, so a weight whose gradients are near zero moves by up to the
    // learning rate on rounding alone: 2e-5 (measured up to 1.08e-5 for GRPO under tensor parallel at lr 1e-3).
    EXPECT_LE(worst, 2e-5) << "largest difference of a final weight";
  }
  test::TempDir dir_;
};

TEST_F(Distributed, SftTwoRanksEqualOneProcessWithTheirBatch) {
  run(fmt::format("{} sft {} --per_device_train_batch_size 4 --output_dir {}", kTrl, common("sft.jsonl"), dir_.file("one")));
  run(fmt::format("{} {} sft {} --per_device_train_batch_size 2 --output_dir {}", kMpirun, kTrl, common("sft.jsonl"), dir_.file("two")));
  expect_same_run("one", "two");
  // Only rank 0 writes: one log line per step.
  const std::vector<json> l = log("two");
  EXPECT_GT(l.at(0).value("comm_seconds", -1.0), 0.0);
}

TEST_F(Distributed, DpoTwoRanksEqualOneProcessWithTheirBatch) {
  run(fmt::format("{} dpo {} --per_device_train_batch_size 4 --output_dir {}", kTrl, common("dpo.jsonl"), dir_.file("one")));
  run(fmt::format("{} {} dpo {} --per_device_train_batch_size 2 --output_dir {}", kMpirun, kTrl, common("dpo.jsonl"), dir_.file("two")));
  expect_same_run("one", "two");
}

TEST_F(Distributed, KtoTwoRanksEqualOneProcessWithTheirBatch) {
  run(fmt::format("{} kto {} --per_device_train_batch_size 4 --output_dir {}", kTrl, common("kto.jsonl"), dir_.file("one")));
  run(fmt::format("{} {} kto {} --per_device_train_batch_size 2 --output_dir {}", kMpirun, kTrl, common("kto.jsonl"), dir_.file("two")));
  expect_same_run("one", "two");
}

TEST_F(Distributed, RewardTwoRanksEqualOneProcessWithTheirBatch) {
  run(fmt::format("{} reward {} --per_device_train_batch_size 4 --output_dir {}", kTrl, common("dpo.jsonl"), dir_.file("one")));
  run(fmt::format("{} {} reward {} --per_device_train_batch_size 2 --output_dir {}", kMpirun, kTrl, common("dpo.jsonl"), dir_.file("two")));
  expect_same_run("one", "two");
}

// Data parallel on a device backend (the stand-in "reference-device"): every rank keeps its weights, gradients and
// moments in the device's memory and the gradients are summed there (Backend::all_reduce); the run is that of one
// process on the device with their batch, for a per-token, a per-sequence and an online trainer. FSDP and tensor
// parallel on a device are refused with what to do.
TEST_F(Distributed, DataParallelOnADeviceEqualsOneProcess) {
  const std::string online = fmt::format("--model_name_or_path {} --dataset_name {} --max_steps 2 --logging_steps 1 --bf16 false --learning_rate 1e-3 "
                                         "--report false --save_steps 2 --gradient_accumulation_steps 2 --steps_per_generation 4 --num_generations 4 "
                                         "--max_completion_length 6 --reward_funcs length:12 --beta 0.1",
                                         dir_.file("model"), write_prompts());
  for (const auto& [trainer, options] : std::vector<std::pair<std::string, std::string>>{
           {"sft", common("sft.jsonl")}, {"dpo", common("dpo.jsonl")}, {"grpo --loss_type dapo", online}}) {
    SCOPED_TRACE(trainer);
    run(fmt::format("rm -rf {} {}", dir_.file("one"), dir_.file("two")));
    run(fmt::format("{} {} {} --device reference-device --per_device_train_batch_size 4 --output_dir {}", kTrl, trainer, options, dir_.file("one")));
    run(fmt::format("{} {} {} {} --device reference-device --per_device_train_batch_size 2 --output_dir {}", kMpirun, kTrl, trainer, options,
                    dir_.file("two")));
    const bool grpo = trainer.rfind("grpo", 0) == 0;
    expect_same_run("one", "two", grpo ? 2 : 4, grpo ? 1e-6 : 0);  // GRPO: one round, the tolerance of its host test
  }
  std::string out;
  EXPECT_NE(test::run_command(fmt::format("{} {} sft {} --device reference-device --per_device_train_batch_size 2 --fsdp_size 2 --output_dir {} 2>&1",
                                          kMpirun, kTrl, common("sft.jsonl"), dir_.file("fsdp")),
                              &out),
            0);
  EXPECT_NE(out.find("FSDP and tensor parallel run on host backends for now; 'reference-device' keeps the weights in its own memory"), std::string::npos)
      << out;
}

// The other methods on a device under data parallel: KTO (its KL batch's mean crosses the ranks), the reward model
// (a score head, pooled where the scores are), RLOO (its KL from per-row sums), GKD and the on-policy distillation
// (a teacher on the same device) and a LoRA adapter (the frozen base and its adapter weights in the device's memory).
TEST_F(Distributed, DataParallelOnADeviceEqualsOneProcessForEveryOtherMethod) {
  ASSERT_EQ(test::run_command(fmt::format("{} init-model --preset tiny --seed 11 --num_hidden_layers 1 --vocab_size {} --out {} > /dev/null 2>&1", kTrl,
                                          test::kCutVocab, dir_.file("teacher"))),
            0);
  const std::string teacher = " --teacher_model_name_or_path " + dir_.file("teacher");
  const std::string prompts = write_prompts();
  const std::string rloo = fmt::format("--model_name_or_path {} --dataset_name {} --max_steps 2 --logging_steps 1 --bf16 false --learning_rate 1e-3 "
                                       "--report false --save_steps 2 --gradient_accumulation_steps 2 --steps_per_generation 4 --num_generations 4 "
                                       "--max_completion_length 6 --reward_funcs length:12 --beta 0.1",
                                       dir_.file("model"), prompts);
  const std::string distill = fmt::format("--model_name_or_path {} --dataset_name {} --max_steps 2 --logging_steps 1 --bf16 false "
                                          "--learning_rate 1e-3 --report false --save_steps 2 --gradient_accumulation_steps 2 "
                                          "--num_generations 2 --max_completion_length 5{}",
                                          dir_.file("model"), prompts, teacher);
  struct Case {
    std::string trainer, options;
    size_t steps;
    double abs_tol;  // the policy-gradient losses nearly cancel (see GrpoAndRlooTwoRanksEqualOneProcessWithTheirBatch)
  };
  for (const Case& c : std::vector<Case>{
           {"kto", common("kto.jsonl"), 4, 0},
           {"reward", common("dpo.jsonl"), 4, 0},
           {"rloo", rloo, 2, 1e-6},
           {"gkd", common("kto.jsonl") + teacher + " --lmbda 0.5 --max_new_tokens 5", 4, 0},
           {"distill", distill, 2, 0},
           {"sft", common("sft.jsonl") + " --use_peft --lora_dropout 0 --lora_target_modules all-linear", 4, 0}}) {
    SCOPED_TRACE(c.trainer + " " + c.options);
    run(fmt::format("rm -rf {} {}", dir_.file("one"), dir_.file("two")));
    run(fmt::format("{} {} {} --device reference-device --per_device_train_batch_size 4 --output_dir {}", kTrl, c.trainer, c.options, dir_.file("one")));
    std::string out;
    const std::string two = fmt::format("{} {} {} {} --device reference-device --per_device_train_batch_size 2 --output_dir {} 2>&1", kMpirun, kTrl,
                                        c.trainer, c.options, dir_.file("two"));
    ASSERT_EQ(test::run_command(two, &out), 0) << two << "\n" << out;
    EXPECT_NE(out.find("[trl] memory on reference-device: holds"), std::string::npos) << "the run did not train on the device: " << out;
    expect_same_run("one", "two", c.steps, c.abs_tol);
  }
}

TEST_F(Distributed, CheckpointOfTwoRanksResumesInOneAndInTwo) {
  const std::string sft = common("sft.jsonl");
  run(fmt::format("{} {} sft {} --per_device_train_batch_size 2 --output_dir {}", kMpirun, kTrl, sft, dir_.file("two")));
  const std::string ckpt = dir_.file("two/checkpoint-2");
  run(fmt::format("cp -r {} {}", dir_.file("two"), dir_.file("again2")));
  run(fmt::format("cp -r {} {}", dir_.file("two"), dir_.file("again1")));
  run(fmt::format("{} {} sft {} --per_device_train_batch_size 2 --output_dir {} --resume_from_checkpoint {}/checkpoint-2", kMpirun, kTrl, sft,
                  dir_.file("again2"), dir_.file("again2")));
  run(fmt::format("{} sft {} --per_device_train_batch_size 4 --output_dir {} --resume_from_checkpoint {}/checkpoint-2", kTrl, sft, dir_.file("again1"),
                  dir_.file("again1")));
  expect_same_run("two", "again2");
  expect_same_run("two", "again1");
  // Another number of rows per micro-batch is refused with what to resume with.
  std::string out;
  EXPECT_NE(test::run_command(fmt::format("{} sft {} --per_device_train_batch_size 2 --output_dir {} --resume_from_checkpoint {} 2>&1", kTrl, sft,
                                          dir_.file("bad"), ckpt),
                              &out),
            0);
  EXPECT_NE(out.find("resume with --per_device_train_batch_size 4 on 1 process"), std::string::npos) << out;
}

TEST_F(Distributed, RanksOverTcpOnlyAsOnTwoHostsAndThroughNprocPerNode) {
  run(fmt::format("{} sft {} --per_device_train_batch_size 4 --output_dir {}", kTrl, common("sft.jsonl"), dir_.file("one")));
  run(fmt::format("{} --mca btl tcp,self {} sft {} --per_device_train_batch_size 2 --output_dir {}", kMpirun, kTrl, common("sft.jsonl"),
                  dir_.file("tcp")));
  expect_same_run("one", "tcp");
  // Through the launcher, with TRL's accelerate preset: ZeRO-2 is the sharded data parallel over the 2 ranks.
  std::string out;
  const std::string cmd = fmt::format("{} {} sft --nproc_per_node 2 --accelerate_config zero2 {} --per_device_train_batch_size 2 --output_dir {} 2>&1",
                                      kEnv, kTrl, common("sft.jsonl"), dir_.file("launched"));
  ASSERT_EQ(test::run_command(cmd, &out), 0) << cmd << "\n" << out;
  expect_same_run("one", "launched");
  EXPECT_NE(out.find("FSDP shard 1 of 2"), std::string::npos) << out;
  ASSERT_NE(out.find("DeepSpeed ZeRO-2 runs as trl.cpp's sharded data parallel over 2 ranks"), std::string::npos) << out;
  EXPECT_EQ(out.find("DeepSpeed ZeRO-2 runs as trl.cpp's sharded data parallel over 2 ranks"),
            out.rfind("DeepSpeed ZeRO-2 runs as trl.cpp's sharded data parallel over 2 ranks")) << "said once, by the launcher: " << out;
}

TEST_F(Distributed, AFailingRankEndsTheJobWithItsError) {
  test::write_file(dir_.file("broken.jsonl"), "{\"text\": \"fine\"}\n{\"text\": \"broken\n");
  std::string out;
  const int rc = test::run_command(fmt::format("{}timeout 300 mpirun --bind-to none -np 1 {} sft {} --per_device_train_batch_size 2 --output_dir {} : "
                                               "-np 1 {} sft {} --per_device_train_batch_size 2 --output_dir {} 2>&1",
                                               kEnv, kTrl, common("sft.jsonl"), dir_.file("a"), kTrl, common("broken.jsonl"), dir_.file("a")),
                                   &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(rc, 124) << "the job hung: " << out;
  EXPECT_NE(out.find("error: [rank 1/2] "), std::string::npos) << out;
  EXPECT_NE(out.find("broken.jsonl"), std::string::npos) << out;
  // A rank killed in the middle of training ends the job too.
  out.clear();
  const int killed = test::run_command(
      fmt::format("{}timeout 300 mpirun --bind-to none -np 2 sh -c 'if [ $OMPI_COMM_WORLD_RANK = 1 ]; then (sleep 2; kill -9 $$) & fi; exec {} sft {} "
                  "--max_steps 100000 --per_device_train_batch_size 2 --output_dir {}' 2>&1",
                  kEnv, kTrl, common("sft.jsonl"), dir_.file("k")),
      &out);
  EXPECT_NE(killed, 0) << out;
  EXPECT_NE(killed, 124) << "the job hung after a rank was killed: " << out;
}

// FSDP over 2 ranks is the run of one process with their batch (losses, tokens, final weights), and each rank holds
// half of the f32 masters and AdamW moments (the bytes of its own tensors, printed by every rank).
TEST_F(Distributed, FsdpTwoRanksEqualOneProcessWithHalfTheOptimizerStateEach) {
  run(fmt::format("{} sft {} --per_device_train_batch_size 4 --output_dir {}", kTrl, common("sft.jsonl"), dir_.file("one")));
  std::string out;
  const std::string cmd = fmt::format("{} {} sft {} --per_device_train_batch_size 2 --fsdp_size 2 --output_dir {} 2>&1", kMpirun, kTrl,
                                      common("sft.jsonl"), dir_.file("fsdp"));
  ASSERT_EQ(test::run_command(cmd, &out), 0) << cmd << "\n" << out;
  expect_same_run("one", "fsdp");
  uint64_t held[2] = {0, 0}, unsharded = 0;
  for (int shard = 0; shard < 2; ++shard) {
    const std::string key = fmt::format("FSDP shard {} of 2: f32 masters and AdamW moments ", shard);
    const size_t at = out.find(key);
    ASSERT_NE(at, std::string::npos) << out;
    unsigned long long bytes = 0, whole = 0;
    ASSERT_EQ(std::sscanf(out.c_str() + at + key.size(), "%llu bytes on this rank (%*[^)]), %llu unsharded", &bytes, &whole), 2) << out;
    held[shard] = bytes, unsharded = whole;
  }
  EXPECT_GT(unsharded, 0u);
  EXPECT_EQ(held[0] + held[1], unsharded);  // every element in exactly one shard
  for (uint64_t h : held) EXPECT_LE(h, unsharded / 2 + 12) << "a shard holds more than half (one element of padding)";
}

TEST_F(Distributed, FsdpPreferenceTrainersEqualOneProcess) {
  for (const char* trainer : {"dpo", "reward"}) {
    SCOPED_TRACE(trainer);
    const std::string one = std::string(trainer) + "-one", fsdp = std::string(trainer) + "-fsdp";
    run(fmt::format("{} {} {} --per_device_train_batch_size 4 --output_dir {}", kTrl, trainer, common("dpo.jsonl"), dir_.file(one)));
    run(fmt::format("{} {} {} {} --per_device_train_batch_size 2 --fsdp_size 2 --output_dir {}", kMpirun, kTrl, trainer, common("dpo.jsonl"),
                    dir_.file(fsdp)));
    expect_same_run(one, fsdp);
  }
}

// bf16 compute weights: the all-gathered bf16 shards equal the bf16 copies data parallel keeps whole (with two ranks
// both sum the same two gradients).
TEST_F(Distributed, FsdpInBf16EqualsDataParallel) {
  const std::string bf16 = common("sft.jsonl") + " --bf16 true --per_device_train_batch_size 2";
  run(fmt::format("{} {} sft {} --output_dir {}", kMpirun, kTrl, bf16, dir_.file("dp")));
  run(fmt::format("{} {} sft {} --fsdp_size 2 --output_dir {}", kMpirun, kTrl, bf16, dir_.file("fsdp")));
  expect_same_run("dp", "fsdp");
}

// An FSDP checkpoint is consolidated (one model and one optimizer file): it resumes in one process, as plain data
// parallel and as FSDP, with the losses of the uninterrupted run.
TEST_F(Distributed, FsdpCheckpointResumesInAnyLayout) {
  const std::string sft = common("sft.jsonl");
  run(fmt::format("{} {} sft {} --per_device_train_batch_size 2 --fsdp_size 2 --output_dir {}", kMpirun, kTrl, sft, dir_.file("fsdp")));
  const SafeTensorsFile opt = SafeTensorsFile::open(dir_.file("fsdp/checkpoint-2/optimizer.safetensors"));
  const SafeTensorsFile model = SafeTensorsFile::open(dir_.file("fsdp/checkpoint-2/model.safetensors"));
  for (const std::string& name : model.names()) EXPECT_EQ(opt.get("exp_avg/" + name).shape(), model.get(name).shape()) << name;
  for (const char* layout : {"one", "dp", "fsdp2"}) {
    const std::string out = std::string("again-") + layout;
    run(fmt::format("cp -r {} {}", dir_.file("fsdp"), dir_.file(out)));
    const std::string resume = fmt::format("--output_dir {} --resume_from_checkpoint {}/checkpoint-2", dir_.file(out), dir_.file(out));
    if (std::string(layout) == "one") run(fmt::format("{} sft {} --per_device_train_batch_size 4 {}", kTrl, sft, resume));
    else run(fmt::format("{} {} sft {} --per_device_train_batch_size 2 {} {}", kMpirun, kTrl, sft, std::string(layout) == "dp" ? "" : "--fsdp_size 2", resume));
    SCOPED_TRACE(layout);
    expect_same_run("fsdp", out);
  }
}

// GRPO and RLOO under data parallel: each rank generates, scores and trains on its rows of every round (a group of
// 4 spans both ranks), and the ranks gather the round: 2 ranks × 2 rows are one process with 4 (the same rewards,
// losses, tokens and final weights). A 2-rank checkpoint taken in the middle of a round resumes in one process.
TEST_F(Distributed, GrpoAndRlooTwoRanksEqualOneProcessWithTheirBatch) {
  const std::string online = fmt::format("--model_name_or_path {} --dataset_name {} --max_steps 4 --logging_steps 1 --bf16 false --learning_rate 1e-3 "
                                         "--report false --save_steps 1 --gradient_accumulation_steps 2 --steps_per_generation 4 --num_generations 4 "
                                         "--max_completion_length 6 --reward_funcs length:12",
                                         dir_.file("model"), write_prompts());
  for (const char* trainer : {"grpo --loss_type grpo", "grpo --loss_type dapo", "rloo"}) {
    SCOPED_TRACE(trainer);
    run(fmt::format("rm -rf {} {} {}", dir_.file("one"), dir_.file("two"), dir_.file("again")));
    run(fmt::format("{} {} {} --per_device_train_batch_size 4 --output_dir {}", kTrl, trainer, online, dir_.file("one")));
    run(fmt::format("{} {} {} {} --per_device_train_batch_size 2 --output_dir {}", kMpirun, kTrl, trainer, online, dir_.file("two")));
    // The policy-gradient losses are means of ±advantage · ratio terms of size ~0.1 that nearly cancel (RLOO's
    // ~1e-4); the ranks compute a round's old log-probs in batches of 2 rows instead of 4, whose GEMMs round
    // differently (~1e-7), so the losses agree to 1e-6 in absolute terms.
    constexpr double kPolicyLossTol = 1e-6;
    expect_same_run("one", "two", 4, kPolicyLossTol);
    const std::vector<json> a = log("one"), b = log("two");
    int rounds = 0;  // a round's rewards are logged at the step that generated it
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].contains("reward"), b[i].contains("reward")) << "step " << i + 1;
      if (!a[i].contains("reward")) continue;
      ++rounds;
      EXPECT_EQ(a[i]["reward"], b[i]["reward"]) << "step " << i + 1;
      EXPECT_EQ(a[i]["completions/mean_length"], b[i]["completions/mean_length"]) << "step " << i + 1;
    }
    EXPECT_EQ(rounds, 2);
    // checkpoint-1 is the first of the two steps a round of 16 rows serves.
    run(fmt::format("cp -r {} {}", dir_.file("two"), dir_.file("again")));
    run(fmt::format("{} {} {} --per_device_train_batch_size 4 --output_dir {} --resume_from_checkpoint {}/checkpoint-1", kTrl, trainer, online,
                    dir_.file("again"), dir_.file("again")));
    expect_same_run("two", "again", 4, kPolicyLossTol);
  }
}

// Tensor parallel over 2 ranks: both ranks train on the same rows, each with its slice of the model (whole heads,
// half the MLP and of the vocabulary), and the run is that of one process with their batch, for every trainer (SFT
// also with gradient checkpointing).
TEST_F(Distributed, TensorParallelTwoRanksEqualOneProcess) {
  for (const auto& [name, trainer, data] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"sft", "sft", "sft.jsonl"},
           {"sft-gc", "sft --gradient_checkpointing true", "sft.jsonl"},  // layers recomputed in the backward, collectives included
           {"dpo", "dpo", "dpo.jsonl"},
           {"kto", "kto", "kto.jsonl"},
           {"reward", "reward", "dpo.jsonl"}}) {
    SCOPED_TRACE(name);
    const std::string one = name + "-one", tp = name + "-tp";
    run(fmt::format("{} {} {} --per_device_train_batch_size 2 --output_dir {}", kTrl, trainer, common(data), dir_.file(one)));
    run(fmt::format("{} {} {} {} --per_device_train_batch_size 2 --tp_size 2 --output_dir {}", kMpirun, kTrl, trainer, common(data), dir_.file(tp)));
    expect_same_run(one, tp);
    const std::vector<json> a = log(one), b = log(tp);
    for (size_t i = 0; i < a.size(); ++i) {  // the split parameters' squares summed over the ranks, the others counted once
      const double x = a[i]["grad_norm"], y = b[i]["grad_norm"];
      EXPECT_TRUE(std::fabs(x - y) <= 1e-6 * x) << "step " << i + 1 << ": " << x << " vs " << y;
      // Metrics over the vocabulary, which each rank holds a part of.
      for (const char* metric : {"entropy", "mean_token_accuracy", "logits/chosen", "logits/rejected", "logps/chosen"}) {
        if (!a[i].contains(metric)) continue;
        const double p = a[i][metric], q = b[i].value(metric, NAN);
        EXPECT_TRUE(std::fabs(p - q) <= 1e-5 * std::fabs(p) + 1e-9) << metric << " at step " << i + 1 << ": " << p << " vs " << q;
      }
    }
  }
}

// Expert parallel over 2 ranks on a mixture of experts (tiny-moe: 8 experts, 2 per token): each rank holds 4 of
// every sparse layer's experts (and half the heads: the ranks are the tensor-parallel group), runs them on the tokens
// that chose them, and the all-reduced sum is one process's layer. SFT (also with gradient checkpointing) and DPO
// (with the load-balancing loss) are one process's runs; expert parallel 2 × data parallel 2 on 4 ranks is one
// process with their batch; the checkpoint holds whole expert tensors and resumes in one process;
// --enable_expert_parallel with --tp_size 2 is the same run; ep_size on a dense model is an error.
TEST_F(Distributed, ExpertParallelTwoRanksEqualOneProcess) {
  ASSERT_EQ(test::run_command(fmt::format("{} init-model --preset tiny-moe --seed 4 --vocab_size {} --out {} > /dev/null 2>&1", kTrl, test::kCutVocab,
                                          dir_.file("moe"))),
            0);
  for (const auto& [name, trainer, data] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"sft", "sft", "sft.jsonl"}, {"sft-gc", "sft --gradient_checkpointing true", "sft.jsonl"}, {"dpo", "dpo", "dpo.jsonl"}}) {
    SCOPED_TRACE(name);
    const std::string args = common(data) + " --model_name_or_path " + dir_.file("moe") + " --per_device_train_batch_size 2";
    run(fmt::format("{} {} {} --output_dir {}", kTrl, trainer, args, dir_.file(name + "-one")));
    run(fmt::format("{} {} {} {} --ep_size 2 --output_dir {}", kMpirun, kTrl, trainer, args, dir_.file(name + "-ep")));
    expect_same_run(name + "-one", name + "-ep");
    const std::vector<json> a = log(name + "-one"), b = log(name + "-ep");
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(a[i].contains("aux_loss")) << a[i].dump();
      const double x = a[i]["aux_loss"], y = b[i].value("aux_loss", NAN), gx = a[i]["grad_norm"], gy = b[i]["grad_norm"];
      EXPECT_TRUE(std::fabs(x - y) <= 1e-5 * x) << "aux_loss at step " << i + 1 << ": " << x << " vs " << y;
      EXPECT_TRUE(std::fabs(gx - gy) <= 1e-6 * gx) << "grad_norm at step " << i + 1 << ": " << gx << " vs " << gy;
    }
  }
  const std::string sft = common("sft.jsonl") + " --model_name_or_path " + dir_.file("moe") + " --per_device_train_batch_size 2";
  run(fmt::format("cp -r {} {}", dir_.file("sft-ep"), dir_.file("ep-one")));
  run(fmt::format("{} sft {} --output_dir {} --resume_from_checkpoint {}/checkpoint-2", kTrl, sft, dir_.file("ep-one"), dir_.file("ep-one")));
  expect_same_run("sft-ep", "ep-one");
  run(fmt::format("{} {} sft {} --tp_size 2 --enable_expert_parallel true --output_dir {}", kMpirun, kTrl, sft, dir_.file("sft-tp")));
  expect_same_run("sft-one", "sft-tp");
  const std::string four = kEnv + "timeout 600 mpirun -np 4 --bind-to none --oversubscribe ";
  // Without the load-balancing loss: under data parallel each replica's aux loss is of its own rows (a product of
  // means over them, as each rank's under TRL's DDP), not of the whole batch's, so only the rest is one process's.
  const std::string sft4 = common("sft.jsonl") + " --model_name_or_path " + dir_.file("moe") + " --router_aux_loss_coef 0";
  run(fmt::format("{} sft {} --per_device_train_batch_size 4 --output_dir {}", kTrl, sft4, dir_.file("one4")));
  run(fmt::format("{} {} sft {} --per_device_train_batch_size 2 --ep_size 2 --output_dir {}", four, kTrl, sft4, dir_.file("ep-dp")));
  expect_same_run("one4", "ep-dp");
  std::string out;
  EXPECT_NE(test::run_command(fmt::format("{} {} sft {} --per_device_train_batch_size 2 --ep_size 2 --output_dir {} 2>&1", kMpirun, kTrl,
                                          common("sft.jsonl"), dir_.file("dense")),
                              &out),
            0);
  EXPECT_NE(out.find("has none; use tp_size for tensor parallel"), std::string::npos) << out;
}

// 4 ranks: tensor parallel 2 × data parallel 2, and tensor parallel 2 × FSDP 2 (the seed's DistributedConfig(tp_size=2,
// fsdp_size=2)), are one process with the batch of the 2 data-parallel ranks. The TP × FSDP checkpoint is whole and
// resumes in one process.
TEST_F(Distributed, TensorParallelWithDataParallelAndFsdpOnFourRanks) {
  const std::string four = kEnv + "timeout 600 mpirun -np 4 --bind-to none ";
  const std::string sft = common("sft.jsonl");
  run(fmt::format("{} sft {} --per_device_train_batch_size 4 --output_dir {}", kTrl, sft, dir_.file("one")));
  run(fmt::format("{} {} sft {} --per_device_train_batch_size 2 --tp_size 2 --output_dir {}", four, kTrl, sft, dir_.file("tp-dp")));
  expect_same_run("one", "tp-dp");
  std::string out;
  const std::string cmd = fmt::format("{} {} sft {} --per_device_train_batch_size 2 --tp_size 2 --fsdp_size 2 --output_dir {} 2>&1", four, kTrl, sft,
                                      dir_.file("tp-fsdp"));
  ASSERT_EQ(test::run_command(cmd, &out), 0) << cmd << "\n" << out;
  expect_same_run("one", "tp-fsdp");
  EXPECT_NE(out.find("[rank 3/4] FSDP shard 1 of 2"), std::string::npos) << out;
  const SafeTensorsFile opt = SafeTensorsFile::open(dir_.file("tp-fsdp/checkpoint-2/optimizer.safetensors"));
  const SafeTensorsFile model = SafeTensorsFile::open(dir_.file("one/model.safetensors"));
  for (const std::string& name : model.names()) EXPECT_EQ(opt.get("master/" + name).shape(), model.get(name).shape()) << name;
  run(fmt::format("cp -r {} {}", dir_.file("tp-fsdp"), dir_.file("again")));
  run(fmt::format("{} sft {} --per_device_train_batch_size 4 --output_dir {} --resume_from_checkpoint {}/checkpoint-2", kTrl, sft, dir_.file("again"),
                  dir_.file("again")));
  expect_same_run("tp-fsdp", "again");
}

// A tensor-parallel checkpoint holds whole tensors: it resumes in one process and again under tensor parallel, and
// a one-process checkpoint resumes under tensor parallel, with the uninterrupted losses.
TEST_F(Distributed, TensorParallelCheckpointResumesInAnyLayout) {
  const std::string sft = common("sft.jsonl") + " --per_device_train_batch_size 2";
  run(fmt::format("{} {} sft {} --tp_size 2 --output_dir {}", kMpirun, kTrl, sft, dir_.file("tp")));
  run(fmt::format("{} sft {} --output_dir {}", kTrl, sft, dir_.file("one")));
  for (const auto& [from, to, launch] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"tp", "tp-one", ""}, {"tp", "tp-tp", "--tp_size 2"}, {"one", "one-tp", "--tp_size 2"}}) {
    SCOPED_TRACE(to);
    run(fmt::format("cp -r {} {}", dir_.file(from), dir_.file(to)));
    run(fmt::format("{} {} sft {} {} --output_dir {} --resume_from_checkpoint {}/checkpoint-2", launch.empty() ? "" : kMpirun, kTrl, sft, launch,
                    dir_.file(to), dir_.file(to)));
    expect_same_run(from, to);
  }
}

// bf16 compute weights under tensor parallel: the ranks' bf16 partial sums are added in bf16 (as on an
// accelerator), so the run follows one process's closely but not to f32 precision.
TEST_F(Distributed, TensorParallelInBf16FollowsOneProcess) {
  const std::string bf16 = common("sft.jsonl") + " --bf16 true --per_device_train_batch_size 2";
  run(fmt::format("{} sft {} --output_dir {}", kTrl, bf16, dir_.file("one")));
  run(fmt::format("{} {} sft {} --tp_size 2 --output_dir {}", kMpirun, kTrl, bf16, dir_.file("tp")));
  const std::vector<json> a = log("one"), b = log("tp");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i]["loss"], y = b[i]["loss"];
    EXPECT_TRUE(std::isfinite(y) && std::fabs(x - y) <= 1e-2 * std::fabs(x)) << "step " << i + 1 << ": " << x << " vs " << y;
    EXPECT_EQ(a[i]["num_tokens"], b[i]["num_tokens"]);
  }
}

// A LoRA adapter (dropout 0: the masks depend on each rank's rows) trains under data parallel and FSDP as in one
// process with their batch; tensor parallel refuses an adapter with the fix.
TEST_F(Distributed, LoraUnderDataParallelAndFsdpEqualsOneProcess) {
  const std::string lora = common("sft.jsonl") + " --use_peft --lora_dropout 0 --lora_target_modules all-linear";
  run(fmt::format("{} sft {} --per_device_train_batch_size 4 --output_dir {}", kTrl, lora, dir_.file("one")));
  run(fmt::format("{} {} sft {} --per_device_train_batch_size 2 --output_dir {}", kMpirun, kTrl, lora, dir_.file("two")));
  expect_same_run("one", "two");
  run(fmt::format("{} {} sft {} --per_device_train_batch_size 2 --fsdp_size 2 --output_dir {}", kMpirun, kTrl, lora, dir_.file("fsdp")));
  expect_same_run("one", "fsdp");
  std::string out;
  EXPECT_NE(test::run_command(fmt::format("{} {} sft {} --per_device_train_batch_size 2 --tp_size 2 --output_dir {} 2>&1", kMpirun, kTrl, lora,
                                          dir_.file("tp")),
                              &out),
            0);
  EXPECT_NE(out.find("not supported under tensor or expert parallel"), std::string::npos) << out;
}

// GKD (half of the micro-batches generated by the student, seeded by the step and each row's slot, so the ranks
// generate exactly the rows one process would) and the on-policy DistillationTrainer under data parallel and FSDP
// equal one process with their batch; the loss's normaliser counts every rank's completion tokens.
TEST_F(Distributed, DistillationUnderDataParallelAndFsdpEqualsOneProcess) {
  ASSERT_EQ(test::run_command(fmt::format("{} init-model --preset tiny --seed 11 --num_hidden_layers 1 --vocab_size {} --out {} > /dev/null 2>&1", kTrl,
                                          test::kCutVocab, dir_.file("teacher"))),
            0);
  const std::string teacher = " --teacher_model_name_or_path " + dir_.file("teacher");
  const std::string gkd = common("kto.jsonl") + teacher + " --lmbda 0.5 --max_new_tokens 5";
  run(fmt::format("{} gkd {} --per_device_train_batch_size 4 --output_dir {}", kTrl, gkd, dir_.file("gkd-one")));
  run(fmt::format("{} {} gkd {} --per_device_train_batch_size 2 --output_dir {}", kMpirun, kTrl, gkd, dir_.file("gkd-two")));
  expect_same_run("gkd-one", "gkd-two");
  run(fmt::format("{} {} gkd {} --per_device_train_batch_size 2 --fsdp_size 2 --output_dir {}", kMpirun, kTrl, gkd, dir_.file("gkd-fsdp")));
  expect_same_run("gkd-one", "gkd-fsdp");
  const std::string distill = fmt::format("--model_name_or_path {} --dataset_name {} --max_steps 4 --logging_steps 1 --bf16 false "
                                          "--learning_rate 1e-3 --report false --save_steps 2 --gradient_accumulation_steps 2 "
                                          "--num_generations 2 --max_completion_length 5{}",
                                          dir_.file("model"), write_prompts(), teacher);
  run(fmt::format("{} distill {} --per_device_train_batch_size 4 --output_dir {}", kTrl, distill, dir_.file("distill-one")));
  run(fmt::format("{} {} distill {} --per_device_train_batch_size 2 --output_dir {}", kMpirun, kTrl, distill, dir_.file("distill-two")));
  expect_same_run("distill-one", "distill-two");
}

TEST_F(Distributed, ModelParallelSizesAreCheckedAgainstTheWorld) {
  std::string out;
  EXPECT_NE(test::run_command(fmt::format("{} {} sft {} --per_device_train_batch_size 2 --tp_size 3 --output_dir {} 2>&1", kMpirun, kTrl,
                                          common("sft.jsonl"), dir_.file("tp")),
                              &out),
            0);
  EXPECT_NE(out.find("does not divide the 2 processes"), std::string::npos) << out;
  // The tiny model's 2 kv heads do not split over 4 ranks.
  out.clear();
  EXPECT_NE(test::run_command(fmt::format("{}timeout 300 mpirun -np 4 --bind-to none {} sft {} --per_device_train_batch_size 2 --tp_size 4 "
                                          "--output_dir {} 2>&1", kEnv, kTrl, common("sft.jsonl"), dir_.file("tp4")),
                              &out),
            0);
  EXPECT_NE(out.find("num_key_value_heads (2) does not divide by it"), std::string::npos) << out;
}

// GRPO and RLOO under tensor parallel: both ranks generate the same rows with their halves of the model (the KV
// cache holds each rank's kv heads; the ranks' logit columns are joined before sampling), and the run is one
// process's with their batch (the same completions, rewards, losses and weights). RLOO's KL runs the reference
// split as the policy is.
TEST_F(Distributed, TensorParallelGrpoAndRlooEqualOneProcess) {
  const std::string online = fmt::format("--model_name_or_path {} --dataset_name {} --max_steps 4 --logging_steps 1 --bf16 false --learning_rate 1e-3 "
                                         "--report false --save_steps 4 --gradient_accumulation_steps 2 --steps_per_generation 4 --num_generations 4 "
                                         "--max_completion_length 6 --reward_funcs length:12 --per_device_train_batch_size 2",
                                         dir_.file("model"), write_prompts());
  for (const char* trainer : {"grpo", "rloo"}) {
    SCOPED_TRACE(trainer);
    const std::string one = std::string(trainer) + "-one", tp = std::string(trainer) + "-tp";
    run(fmt::format("{} {} {} --output_dir {}", kTrl, trainer, online, dir_.file(one)));
    run(fmt::format("{} {} {} {} --tp_size 2 --output_dir {}", kMpirun, kTrl, trainer, online, dir_.file(tp)));
    expect_same_run(one, tp, 4, /*abs_tol=*/1e-6);  // policy-gradient losses: small differences of larger terms
    const std::vector<json> a = log(one), b = log(tp);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].contains("reward"), b[i].contains("reward")) << "step " << i + 1;
      if (a[i].contains("reward")) {
        EXPECT_EQ(a[i]["reward"], b[i]["reward"]) << "step " << i + 1;
      }
    }
  }
}

TEST(DistributedCores, SplitBetweenLocalRanks) {
  // Unbound ranks (the same mask) split the visible cores evenly.
  const std::vector<std::vector<int>> same{{0, 1, 2, 3}, {0, 1, 2, 3}};
  EXPECT_EQ(dist::assign_cores({}, same, 0, false).cores, (std::vector<int>{0, 1}));
  EXPECT_EQ(dist::assign_cores({}, same, 1, false).cores, (std::vector<int>{2, 3}));
  // Ranks the launcher bound to their own cores keep them.
  EXPECT_EQ(dist::assign_cores({}, {{0}, {1}}, 1, false).cores, (std::vector<int>{1}));
  // TRL_VISIBLE_CORES: split evenly, or an error that says why.
  EXPECT_EQ(dist::assign_cores({4, 5, 6, 7}, same, 1, true).cores, (std::vector<int>{6, 7}));
  const std::string e = test::error_of([&] { dist::assign_cores({0, 1, 2}, same, 0, true); });
  EXPECT_NE(e.find("3 cores cannot be split evenly between the 2 ranks"), std::string::npos) << e;
  // More ranks than cores share them, one core each.
  const std::vector<std::vector<int>> four(4, std::vector<int>{0, 1});
  EXPECT_EQ(dist::assign_cores({}, four, 3, false).cores, (std::vector<int>{1}));
}

// Each rank's OpenMP loops outside programs run on as many threads as the rank has cores: OpenMP fixes its default
// when the library loads, before the rank is pinned, and 2 threads on 1 core spin against each other (a 4-step SFT
// run of 2 ranks on 2 cores took 3 s instead of 0.4 s).
TEST(DistributedCores, EachRanksLoopsRunOnItsOwnCores) {
  if (test::run_command("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin)";
  std::string out;
  ASSERT_EQ(test::run_command(fmt::format("{}timeout 120 mpirun -np 2 --bind-to none {} env --json 2>&1", kEnv, kTrl), &out), 0) << out;
  // Each rank prints one JSON object; they may interleave only between lines, so split at the top-level braces.
  int ranks = 0, depth = 0;
  std::string doc;
  for (char c : out) {
    if (depth > 0 || c == '{') doc += c;
    if (c == '{') ++depth;
    if (c == '}' && --depth == 0) {
      const json j = json::parse(doc);
      doc.clear();
      ++ranks;
      EXPECT_EQ(j.at("openmp_threads"), j.at("threads")) << j.dump();
      EXPECT_EQ(j.at("threads"), j.at("num_visible_cores")) << j.dump();
    }
  }
  EXPECT_EQ(ranks, 2) << out;
}

TEST(DistributedCores, OneProcessIsItsOwnWorld) {
  dist::Communicator& w = dist::world();
  if (dist::launched_by_mpi()) GTEST_SKIP() << "run under mpirun";
  EXPECT_EQ(w.size(), 1);
  EXPECT_EQ(w.sum(int64_t{5}), 5);
  float x[2] = {1.5f, -2.0f};
  w.all_reduce(x, 2, DType::F32, dist::ReduceOp::Sum);
  EXPECT_EQ(x[0], 1.5f);
  EXPECT_EQ(w.broadcast_string("abc", 0), "abc");
}

}  // namespace
}  // namespace trl

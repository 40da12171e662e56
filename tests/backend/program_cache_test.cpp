#include <cstdlib>
#include <filesystem>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "trl/backend/cpu/cpu_backend.h"
#include "trl/backend/program_cache.h"
#include "trl/models/init.h"
#include "trl/train/objectives.h"
#include "test_util.h"

namespace trl {
namespace {

TEST(ProgramCache, CompilesOncePerShapeAndCachedProgramsGiveTheSameResults) {
  ModelConfig c = preset_config("tiny", DType::F32);
  const CausalLM model = CausalLM::from_weights(c, init_weights(c, DType::F32, 3, 0.1, true));
  auto backend = make_cpu_backend();
  ProgramCache cache(*backend);
  auto run = [&](Program& p, int64_t T) {
    TensorMap in = model.weights();
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(100 + 7 * i);
    Tensor mask = Tensor::from_i32(std::vector<int32_t>(static_cast<size_t>(T), 1), {1, T});
    in["input_ids"] = Tensor::from_i32(ids, {1, T}), in["attention_mask"] = mask, in["position_ids"] = default_position_ids(mask);
    return p.run(in)[0].clone();
  };
  const Tensor fresh = run(cache.get(model.forward_graph(1, 5)), 5);
  EXPECT_EQ(cache.stats().compilations, 1);
  const Tensor cached = run(cache.get(model.forward_graph(1, 5)), 5);  // traced anew: same hash
  EXPECT_EQ(cache.stats().compilations, 1);
  EXPECT_EQ(cache.stats().hits, 1);
  EXPECT_EQ(fresh.to_f32_vector(), cached.to_f32_vector());
  ::setenv("TRL_LOG_RECOMPILES", "1", 1);
  testing::internal::CaptureStderr();
  (void)cache.get(model.forward_graph(1, 7));
  const std::string log = testing::internal::GetCapturedStderr();
  ::unsetenv("TRL_LOG_RECOMPILES");
  EXPECT_EQ(cache.stats().compilations, 2);
  EXPECT_NE(log.find("input 'input_ids' is [1, 7] (cached: [1, 5])"), std::string::npos) << log;
}

TEST(ProgramCache, EvictsTheLeastRecentlyUsed) {
  ModelConfig c = preset_config("tiny", DType::F32);
  const CausalLM model = CausalLM::from_weights(c, init_weights(c, DType::F32, 3, 0.1, false));
  auto backend = make_reference_backend();
  ProgramCache cache(*backend, 2);
  (void)cache.get(model.forward_graph(1, 2));
  (void)cache.get(model.forward_graph(1, 3));
  (void)cache.get(model.forward_graph(1, 2));  // hit; 3 is now the least recently used
  (void)cache.get(model.forward_graph(1, 4));  // evicts 3
  EXPECT_EQ(cache.size(), 2u);
  (void)cache.get(model.forward_graph(1, 2));
  EXPECT_EQ(cache.stats().hits, 2);
  (void)cache.get(model.forward_graph(1, 3));
  EXPECT_EQ(cache.stats().compilations, 4);
}

// A second process (here: a second cache) finds the plan on disk, compiles from it and gets the same results; a
// damaged plan file is reported, ignored and replaced.
TEST(ProgramCache, DiskCacheReusesPlansAcrossRunsAndSurvivesDamage) {
  ModelConfig c = preset_config("tiny", DType::F32);
  const CausalLM model = CausalLM::from_weights(c, init_weights(c, DType::F32, 3, 0.1, true));
  test::TempDir dir;
  auto backend = make_cpu_backend();
  TensorMap in = model.weights();
  Tensor mask = Tensor::from_i32(std::vector<int32_t>{1, 1, 1, 1, 1, 1}, {2, 3});
  in["input_ids"] = Tensor::from_i32(std::vector<int32_t>{5, 6, 7, 8, 9, 10}, {2, 3}), in["attention_mask"] = mask, in["position_ids"] = default_position_ids(mask);
  in["labels"] = Tensor::from_i32(std::vector<int32_t>{6, 7, 8, 9, 10, 11}, {2, 3});
  in["loss_weights"] = Tensor::from_f32(std::vector<float>{-0.25f, -0.25f, 0, -0.25f, -0.25f, 0}, {2, 3});
  const graph::Graph g = training_graph(model, 2, 3);
  std::vector<std::vector<float>> first;
  std::string path;
  {
    ProgramCache cache(*backend, ProgramCacheOptions{8, dir.path()});
    for (const Tensor& t : cache.get(g).run(in)) first.push_back(t.to_f32_vector());
    EXPECT_EQ(cache.stats().disk_hits, 0);
    EXPECT_EQ(cache.stats().disk_writes, 1);
    path = cache.plan_path(cache.key(g));
    ASSERT_TRUE(std::filesystem::exists(path));
  }
  {
    ProgramCache cache(*backend, ProgramCacheOptions{8, dir.path()});
    const auto out = cache.get(training_graph(model, 2, 3)).run(in);
    EXPECT_EQ(cache.stats().compilations, 1);
    EXPECT_EQ(cache.stats().disk_hits, 1);
    EXPECT_EQ(cache.stats().disk_writes, 0);
    for (size_t k = 0; k < out.size(); ++k) EXPECT_EQ(out[k].to_f32_vector(), first[k]);
  }
  test::write_file(path, "trl-plan 4 3 64\n0 0\n");  // the wrong node count
  {
    ProgramCache cache(*backend, ProgramCacheOptions{8, dir.path()});
    testing::internal::CaptureStderr();
    const auto out = cache.get(g).run(in);
    const std::string log = testing::internal::GetCapturedStderr();
    EXPECT_NE(log.find("does not fit its graph"), std::string::npos) << log;
    EXPECT_EQ(cache.stats().disk_hits, 0);
    EXPECT_EQ(cache.stats().disk_writes, 1);  // replaced by a good plan
    for (size_t k = 0; k < out.size(); ++k) EXPECT_EQ(out[k].to_f32_vector(), first[k]);
  }
  // The plan of another graph with the same node count (another length), put under this graph's name (as a
  // 64-bit key collision would): its header names the other graph, so it is not used.
  {
    const graph::Graph other = training_graph(model, 2, 2);
    ASSERT_EQ(other.nodes.size(), g.nodes.size());
    ASSERT_NE(other.key(), g.key());
    test::TempDir dir2;
    ProgramCache writer(*backend, ProgramCacheOptions{8, dir2.path()});
    writer.get(other);
    test::write_file(path, test::read_file(writer.plan_path(writer.key(other))));
    ProgramCache cache(*backend, ProgramCacheOptions{8, dir.path()});
    testing::internal::CaptureStderr();
    const auto out = cache.get(g).run(in);
    testing::internal::GetCapturedStderr();
    EXPECT_EQ(cache.stats().disk_hits, 0);
    for (size_t k = 0; k < out.size(); ++k) EXPECT_EQ(out[k].to_f32_vector(), first[k]);
  }
}

// Graph::key() is the whole structure: graphs that differ only in one attribute, one shape or one input name have
// different keys, and the same trace twice has the same key.
TEST(ProgramCache, GraphKeySeparatesEveryField) {
  auto build = [](double eps, int64_t C, const std::string& name) {
    graph::Builder b;
    const auto x = b.input(name, {2, C}, DType::F32);
    const auto w = b.input("w", {C}, DType::F32);
    b.output(b.rms_norm(x, w, eps));
    return b.finish();
  };
  const std::string base = build(1e-6, 8, "x").key();
  EXPECT_EQ(build(1e-6, 8, "x").key(), base);
  EXPECT_NE(build(1e-5, 8, "x").key(), base);
  EXPECT_NE(build(1e-6, 9, "x").key(), base);
  EXPECT_NE(build(1e-6, 8, "y").key(), base);
  EXPECT_EQ(build(1e-6, 8, "x").hash(), graph::hash_key(base));
}

TEST(Cli, CompileFillsTheDiskCacheOncePerBucket) {
  test::TempDir dir;
  const std::string cmd = "TRL_CACHE_DIR=" + dir.path() + " " + std::string(TRL_BINARY) +
                          " compile --preset tiny --per_device_train_batch_size 2 --max_length 40 --pad_to_multiple_of 16 --dtype f32";
  for (bool second : {false, true}) {
    std::string out;
    ASSERT_EQ(test::run_command(cmd, &out), 0) << out;
    std::vector<int64_t> seqs;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      const auto j = nlohmann::json::parse(line);
      seqs.push_back(j["seq"].get<int64_t>());
      EXPECT_EQ(j["plan_from_disk"].get<bool>(), second) << line;
      EXPECT_TRUE(std::filesystem::exists(j["plan"].get<std::string>())) << line;
    }
    EXPECT_EQ(seqs, (std::vector<int64_t>{16, 32, 40})) << out;
  }
  std::string out;
  EXPECT_NE(test::run_command(std::string(TRL_BINARY) + " compile --preset tiny --pad_to_multiple_of twelve 2>&1", &out), 0);
  EXPECT_NE(out.find("pad_to_multiple_of: 'twelve'"), std::string::npos) << out;
}

TEST(Cli, BenchTrainPrintsItsFigures) {
  std::string out;
  ASSERT_EQ(test::run_command(std::string(TRL_BINARY) + " bench train --preset tiny --batch 2 --seq 8 --dtype f32 --steps 1", &out), 0) << out;
  const auto j = nlohmann::json::parse(out);
  for (const char* key : {"tokens_per_s", "mfu", "gemm_peak_gflops", "peak_rss_mb", "compile_seconds", "cache_hit_ms", "loss"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["programs_compiled"], 1);
  EXPECT_EQ(j["cache_hits"], 1);
  EXPECT_GT(j["loss"].get<double>(), 5.0);  // about log(vocab) for random weights
}

}  // namespace
}  // namespace trl

#include <cstdlib>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/program_cache.h"
#include "models/init.h"
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

// Figures for the foundation (issue 2): memory bandwidth, writing and loading a Qwen3-0.6B-shaped checkpoint, and
// the reference backend's forward pass. Prints one JSON object per line; never passes or fails on time.
//   build/bench/trl_bench_foundation [--skip-0.6b]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "trl/models/causal_lm.h"
#include "trl/models/init.h"

using namespace trl;
using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Sums `n` u64 words with `threads` threads; returns the sum so the reads cannot be optimised away.
static uint64_t parallel_sum(const uint64_t* p, size_t n, int threads) {
  std::vector<uint64_t> partial(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      size_t lo = n * static_cast<size_t>(t) / static_cast<size_t>(threads), hi = n * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      size_t i = lo;
      for (; i + 4 <= hi; i += 4) s0 += p[i], s1 += p[i + 1], s2 += p[i + 2], s3 += p[i + 3];
      for (; i < hi; ++i) s0 += p[i];
      partial[static_cast<size_t>(t)] = s0 + s1 + s2 + s3;
    });
  }
  for (auto& th : pool) th.join();
  return std::accumulate(partial.begin(), partial.end(), uint64_t{0});
}

static void emit(const nlohmann::ordered_json& j) { std::printf("%s\n", j.dump().c_str()); std::fflush(stdout); }

int main(int argc, char** argv) {
  const bool skip_big = argc > 1 && std::strcmp(argv[1], "--skip-0.6b") == 0;
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  // 1. Memory read bandwidth: best of 5 passes over 1 GiB.
  std::vector<uint64_t> buf((1ull << 30) / 8, 1);
  double best = 1e9;
  uint64_t sink = 0;
  for (int r = 0; r < 5; ++r) {
    auto t0 = Clock::now();
    sink += parallel_sum(buf.data(), buf.size(), threads);
    best = std::min(best, seconds_since(t0));
  }
  const double mem_gbs = static_cast<double>(buf.size() * 8) / best / 1e9;
  emit({{"bench", "memory_read_bandwidth"}, {"threads", threads}, {"GB_per_s", mem_gbs}, {"sink", sink % 7}});
  buf = {};

  const std::string dir = (std::filesystem::temp_directory_path() / "trl-bench-foundation").string();
  if (!skip_big) {
    // 2. init-model --preset qwen3-0.6b --dtype bf16: generate + write 1.2 GB.
    InitOptions o;
    o.preset = "qwen3-0.6b";
    o.dtype = DType::BF16;
    auto t0 = Clock::now();
    CausalLM m = init_model(o, dir);
    const double init_s = seconds_since(t0);
    const double bytes = static_cast<double>(m.num_parameters()) * 2;
    emit({{"bench", "init_model_qwen3_0.6b_bf16"}, {"seconds", init_s}, {"GB", bytes / 1e9}, {"GB_per_s", bytes / init_s / 1e9}});

    // 3. Load: header validation + zero-copy mapping, then a first full read of every weight (page cache).
    t0 = Clock::now();
    CausalLM loaded = CausalLM::from_pretrained(dir);
    const double load_s = seconds_since(t0);
    t0 = Clock::now();
    uint64_t s = 0;
    for (const auto& [name, t] : loaded.weights()) s += parallel_sum(static_cast<const uint64_t*>(t.data()), t.nbytes() / 8, threads);
    const double read_s = seconds_since(t0);
    emit({{"bench", "load_qwen3_0.6b_bf16"}, {"from_pretrained_ms", load_s * 1e3}, {"first_read_GB_per_s", bytes / read_s / 1e9},
          {"first_read_vs_memory_bandwidth", bytes / read_s / 1e9 / mem_gbs}, {"sink", s % 7}});
    std::filesystem::remove_all(dir);
  }

  // 4. Reference backend forward pass, [1, 32] tokens, f32 (the oracle: f64 accumulation, not the fast path).
  for (const char* preset : {"tiny", "small"}) {
    ModelConfig c = preset_config(preset, DType::F32);
    CausalLM m = CausalLM::from_weights(c, init_weights(c, DType::F32, 1, 0.02, false));
    std::vector<int32_t> ids(32);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(100 + 37 * i);
    Batch b;
    b.input_ids = Tensor::from_i32(ids, {1, 32});
    auto backend = make_reference_backend();
    m.forward(b, *backend);  // warm-up
    double best_s = 1e9;
    for (int r = 0; r < 3; ++r) {
      auto t0 = Clock::now();
      m.forward(b, *backend);
      best_s = std::min(best_s, seconds_since(t0));
    }
    emit({{"bench", "reference_forward"}, {"preset", preset}, {"dtype", "f32"}, {"batch", 1}, {"tokens", 32}, {"ms", best_s * 1e3},
          {"tokens_per_s", 32 / best_s}});
  }
  return 0;
}

// Tokenizer figures (issue 3): load time of the Qwen3 tokenizer and one-thread encode throughput over the test
// corpus. One JSON line per figure; bench/run_tokenizer.sh sets Hugging Face's tokenizers (npm) beside it.
//   build/bench/trl_bench_tokenizer MODEL_DIR CORPUS.jsonl
#include <chrono>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "trl/tokenizer/tokenizer.h"

using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR CORPUS.jsonl\n", argv[0]);
    return 2;
  }
  std::vector<std::string> docs;
  size_t bytes = 0;
  std::ifstream in(argv[2]);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    docs.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
    bytes += docs.back().size();
  }
  double best_load = 1e9, cold = 0, best = 1e9;
  size_t ids = 0;
  for (int r = 0; r < 3; ++r) {
    auto t0 = Clock::now();
    trl::Tokenizer tok = trl::Tokenizer::from_pretrained(argv[1]);
    best_load = std::min(best_load, std::chrono::duration<double>(Clock::now() - t0).count());
    for (int pass = 0; pass < 2; ++pass) {
      t0 = Clock::now();
      ids = 0;
      for (const auto& d : docs) ids += tok.encode(d, false).size();
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (r == 0 && pass == 0) cold = s;
      best = std::min(best, s);
    }
  }
  std::printf("%s\n", nlohmann::json({{"bench", "trl_tokenizer_encode"}, {"bytes", bytes}, {"documents", docs.size()}, {"ids", ids},
                                      {"cold_MB_per_s", bytes / cold / 1e6}, {"best_MB_per_s", bytes / best / 1e6},
                                      {"load_ms", best_load * 1e3}, {"threads", 1}}).dump().c_str());
  return 0;
}

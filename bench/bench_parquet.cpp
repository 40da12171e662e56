// Parquet read speed and memory (docs/PERFORMANCE.md, "Datasets"): streams FILE a row group at a time through
// trl::parquet::File (rows as JSON, as the trainers get them), then prints one JSON line: rows/s, MB/s of the file,
// the largest row group's uncompressed size and the process's peak RSS above what it was before reading.
//   build/bench/trl_bench_parquet FILE [--repeat N]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "trl/core/error.h"
#include "trl/data/parquet.h"

namespace {

// VmHWM (peak resident set) or VmRSS from /proc/self/status, in bytes.
long long proc_status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key))) * 1024;
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE [--repeat N]\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  int repeat = 1;
  if (argc >= 4 && std::strcmp(argv[2], "--repeat") == 0) repeat = std::max(1, std::atoi(argv[3]));
  try {
    const long long rss_before = proc_status_kb("VmRSS:");
    double best = 1e30;
    long long rows = 0, chars = 0, biggest_group = 0;
    for (int r = 0; r < repeat; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const trl::parquet::File f = trl::parquet::File::open(path);
      rows = 0, chars = 0;
      for (int g = 0; g < f.num_row_groups(); ++g) {
        const auto group = f.read_row_group(g);
        rows += static_cast<long long>(group.size());
        biggest_group = std::max<long long>(biggest_group, f.row_group_bytes(g));
        for (const auto& row : group) chars += static_cast<long long>(row.size());  // touch every row
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double mb = static_cast<double>(std::filesystem::file_size(path)) / 1e6;
    const long long peak = proc_status_kb("VmHWM:") - rss_before;
    std::printf("{\"reader\": \"trl.cpp\", \"file\": \"%s\", \"rows\": %lld, \"seconds\": %.4f, \"rows_per_s\": %.0f, \"mb_per_s\": %.1f, "
                "\"largest_row_group_mb\": %.1f, \"peak_rss_growth_mb\": %.1f}\n",
                path.c_str(), rows, best, static_cast<double>(rows) / best, mb / best, static_cast<double>(biggest_group) / 1e6,
                static_cast<double>(peak) / 1e6);
    (void)chars;
  } catch (const trl::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

#include "core/memory.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "trl/core/byte_size.h"
#include "trl/core/error.h"

namespace trl {

namespace {

// The value after `key` in a /proc file of "Key:   123 kB" lines, in bytes; 0 when absent.
uint64_t proc_kb(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      std::istringstream s(line.substr(key.size()));
      uint64_t kb = 0;
      s >> kb;
      return kb * 1024;
    }
  return 0;
}

uint64_t file_number(const char* path) {
  std::ifstream in(path);
  std::string v;
  if (!(in >> v) || v == "max") return 0;
  return std::strtoull(v.c_str(), nullptr, 10);
}

}  // namespace

MemoryBudget memory_budget() {
  if (const char* e = std::getenv("TRL_MEMORY_LIMIT"); e && *e) {
    try {
      const uint64_t limit = parse_byte_size(e);
      return {limit, "TRL_MEMORY_LIMIT", limit};
    } catch (const Error& err) {
      fail("the environment variable TRL_MEMORY_LIMIT: {}", err.what());
    }
  }
  MemoryBudget b{proc_kb("/proc/meminfo", "MemAvailable:"), "MemAvailable", proc_kb("/proc/meminfo", "MemTotal:")};
  const uint64_t limit = file_number("/sys/fs/cgroup/memory.max"), current = file_number("/sys/fs/cgroup/memory.current");
  if (limit > 0 && current <= limit && (b.available == 0 || limit - current < b.available)) b = {limit - current, "cgroup memory.max", limit};
  return b;
}

uint64_t resident_bytes() { return proc_kb("/proc/self/status", "VmRSS:"); }

std::string format_bytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.0f} MB", b / 1e6);
  return fmt::format("{:.0f} KB", b / 1e3);
}

}  // namespace trl

#include "trl/runtime/runtime.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>

#include <fmt/ranges.h>

#include "trl/core/error.h"

namespace trl {

static int machine_cores() {
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::string format_core_list(const std::vector<int>& cores) {
  std::string out;
  for (size_t i = 0; i < cores.size();) {
    size_t j = i;
    while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1) ++j;
    if (!out.empty()) out.push_back(',');
    out += std::to_string(cores[i]);
    if (j > i) out.push_back('-'), out += std::to_string(cores[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> parse_core_list(const std::string& text, int num_cores) {
  auto bad = [&](const std::string& why) -> void {
    fail("TRL_VISIBLE_CORES='{}': {} (expected a list such as 0-3 or 0,1; this machine has cores 0-{})", text, why, num_cores - 1);
  };
  std::vector<int> cores;
  std::set<int> seen;
  size_t start = 0;
  if (text.empty()) bad("empty list");
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string part = text.substr(start, end - start);
    if (part.empty()) bad("empty element");
    auto parse_int = [&](const std::string& s) {
      if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 6) bad("'" + s + "' is not a core number");
      return std::stoi(s);
    };
    size_t dash = part.find('-');
    int lo, hi;
    if (dash == std::string::npos) {
      lo = hi = parse_int(part);
    } else {
      lo = parse_int(part.substr(0, dash));
      hi = parse_int(part.substr(dash + 1));
      if (lo > hi) bad("range '" + part + "' runs backwards");
    }
    for (int c = lo; c <= hi; ++c) {
      if (c >= num_cores) bad(fmt::format("core {} does not exist", c));
      if (!seen.insert(c).second) bad(fmt::format("core {} is listed twice", c));
      cores.push_back(c);
    }
    start = end + 1;
  }
  return cores;
}

namespace {
std::vector<int>& rank_cores() {
  static std::vector<int> cores;
  return cores;
}
}  // namespace

void set_rank_cores(std::vector<int> cores) {
  rank_cores() = std::move(cores);
  apply_num_threads();
}

void apply_num_threads() { omp_set_num_threads(num_threads()); }

std::vector<int> visible_cores() {
  if (!rank_cores().empty()) return rank_cores();
  const char* v = std::getenv("TRL_VISIBLE_CORES");
  if (v != nullptr) return parse_core_list(v, machine_cores());
  std::vector<int> all(static_cast<size_t>(machine_cores()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  return all;
}

int num_threads() {
  const char* v = std::getenv("TRL_NUM_THREADS");
  if (v != nullptr) {
    const std::string s = v;
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 4 || std::stoi(s) < 1) {
      fail("TRL_NUM_THREADS='{}': expected a positive integer", s);
    }
    return std::stoi(s);
  }
  return static_cast<int>(visible_cores().size());
}

std::string cache_dir() {
  namespace fs = std::filesystem;
  if (const char* v = std::getenv("TRL_CACHE_DIR"); v != nullptr && *v) return v;
  if (const char* v = std::getenv("XDG_CACHE_HOME"); v != nullptr && *v) return (fs::path(v) / "trl.cpp").string();
  if (const char* v = std::getenv("HOME"); v != nullptr && *v) return (fs::path(v) / ".cache" / "trl.cpp").string();
  return ".trl-cache";
}

}  // namespace trl

// The memory this process may still use: the smaller of the kernel's MemAvailable and, under a cgroup v2 limit
// (containers, CI runners), the limit minus the cgroup's current use. TRL_MEMORY_LIMIT (e.g. "8GB") overrides both
// (tests; a machine shared with other jobs).
#pragma once

#include <cstdint>
#include <string>

namespace trl {

struct MemoryBudget {
  uint64_t available = 0;  // bytes this process may still allocate
  std::string source;      // what the figure came from: "MemAvailable", "cgroup memory.max", "TRL_MEMORY_LIMIT"
  uint64_t total = 0;      // the memory behind it: MemTotal, the cgroup limit, or TRL_MEMORY_LIMIT; 0 when unknown
};

MemoryBudget memory_budget();
// Resident memory of this process (VmRSS), bytes; 0 when unknown.
uint64_t resident_bytes();

std::string format_bytes(uint64_t bytes);  // "1.23 GB" (10^9), "456 MB"

}  // namespace trl

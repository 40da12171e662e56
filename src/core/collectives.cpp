#include "trl/core/collectives.h"

#include <map>
#include <mutex>

#include "trl/core/error.h"

namespace trl {

namespace {

std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}
std::map<int, AllReduceFn>& table() {
  static std::map<int, AllReduceFn> groups;
  return groups;
}

}  // namespace

void set_collective_group(int id, AllReduceFn fn) {
  const std::lock_guard<std::mutex> lock(table_mutex());
  if (fn) table()[id] = std::move(fn);
  else table().erase(id);
}

void all_reduce_in_group(int id, void* data, int64_t n, DType dtype) {
  AllReduceFn fn;
  {
    const std::lock_guard<std::mutex> lock(table_mutex());
    const auto it = table().find(id);
    if (it == table().end())
      fail("all_reduce: collective group {} is not registered in this process (a program traced for tensor parallel runs only in the run "
           "that set up its groups)", id);
    fn = it->second;
  }
  fn(data, n, dtype);
}

}  // namespace trl

// The parts of the communicator that do not depend on MPI: the conveniences, the single-process communicator, the
// choice between it and MPI's, and the cores each local rank runs on.
#include "trl/dist/communicator.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <type_traits>

#include <fmt/format.h>

#include "dist/mpi_communicator.h"
#include "trl/core/error.h"
#include "trl/runtime/runtime.h"

namespace trl::dist {

namespace {

// One process: every collective's result is its input.
class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  const char* kind() const override { return "single"; }
  void all_reduce(void*, int64_t, DType, ReduceOp) override {}
  void all_gather(const void* send, void* recv, int64_t n, DType dtype) override {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(n) * dtype_size(dtype));
  }
  void reduce_scatter(const void* send, void* recv, int64_t n, DType dtype) override {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(n) * dtype_size(dtype));
  }
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<SingleCommunicator>(); }
};

std::vector<int> affinity_mask() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cores;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cores;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cores.push_back(c);
  return cores;
}

}  // namespace

namespace {
// One number reduced over the ranks.
template <typename T>
T reduced(Communicator& comm, T x, ReduceOp op) {
  comm.all_reduce(&x, 1, std::is_same_v<T, double> ? DType::F64 : DType::I64, op);
  return x;
}
}  // namespace

double Communicator::sum(double x) { return reduced(*this, x, ReduceOp::Sum); }
int64_t Communicator::sum(int64_t x) { return reduced(*this, x, ReduceOp::Sum); }
int64_t Communicator::max(int64_t x) { return reduced(*this, x, ReduceOp::Max); }
int64_t Communicator::min(int64_t x) { return reduced(*this, x, ReduceOp::Min); }
bool Communicator::any(bool x) { return max(static_cast<int64_t>(x)) != 0; }

void Communicator::all_reduce(Tensor& t, ReduceOp op) {
  if (!t.is_contiguous()) fail("all_reduce: the tensor {} is not contiguous", shape_str(t.shape()));
  all_reduce(t.mutable_data(), t.numel(), t.dtype(), op);
}

std::string Communicator::broadcast_string(const std::string& s, int root) {
  int64_t n = static_cast<int64_t>(s.size());
  broadcast(&n, sizeof(n), root);
  std::string out = rank() == root ? s : std::string(static_cast<size_t>(n), '\0');
  if (n > 0) broadcast(out.data(), n, root);
  return out;
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

Communicator& world() {
  static std::unique_ptr<Communicator> comm = launched_by_mpi() ? make_mpi_world() : std::unique_ptr<Communicator>(new SingleCommunicator());
  return *comm;
}

void finalize() {
  if (launched_by_mpi()) finalize_mpi();
}

std::string rank_prefix() {
  if (!launched_by_mpi()) return "";
  const Communicator& w = world();
  return w.size() > 1 ? fmt::format("[rank {}/{}] ", w.rank(), w.size()) : "";
}

CoreAssignment assign_cores(const std::vector<int>& visible, const std::vector<std::vector<int>>& masks, int local_rank, bool from_env) {
  const int L = static_cast<int>(masks.size());
  if (!from_env) {
    // The launcher (or the user, with taskset per rank) already gave each local rank its own cores: keep them.
    std::set<int> seen;
    bool disjoint = true;
    for (const auto& m : masks)
      for (int c : m) disjoint = seen.insert(c).second && disjoint;
    if (disjoint && L > 1) return {masks[static_cast<size_t>(local_rank)], "as the launcher bound the local ranks"};
  }
  std::vector<int> all = visible;
  if (all.empty()) {
    std::set<int> u;
    for (const auto& m : masks) u.insert(m.begin(), m.end());
    all.assign(u.begin(), u.end());
  }
  const int n = static_cast<int>(all.size());
  if (L == 1) return {all, from_env ? "TRL_VISIBLE_CORES" : "all visible cores"};
  if (from_env && n % L != 0)
    fail("TRL_VISIBLE_CORES={}: {} cores cannot be split evenly between the {} ranks on this machine; list a multiple of {} cores "
         "(such as {}), or start {} ranks",
         format_core_list(all), n, L, L, format_core_list(std::vector<int>(all.begin(), all.begin() + std::max(L, n / L * L))), n);
  if (n < L) {
    // More ranks than cores (mpirun --oversubscribe): the ranks share cores round-robin, one thread each.
    return {{all[static_cast<size_t>(local_rank % n)]}, fmt::format("{} local ranks share {} cores (oversubscribed)", L, n)};
  }
  const int per = n / L;
  std::vector<int> mine(all.begin() + local_rank * per, all.begin() + (local_rank + 1) * per);
  return {mine, fmt::format("{} split between {} local ranks{}", format_core_list(all), L,
                            n % L ? fmt::format(" ({} left unused)", n % L) : std::string())};
}

CoreAssignment pin_local_cores(Communicator& comm) {
  const char* env = std::getenv("TRL_VISIBLE_CORES");
  const std::vector<int> visible = env ? parse_core_list(env, static_cast<int>(std::max<long>(1, ::sysconf(_SC_NPROCESSORS_ONLN)))) : std::vector<int>{};
  // Every local rank's current mask, gathered as fixed-size rows (-1 padded).
  const std::vector<int> own = affinity_mask();
  const int L = comm.local_size();
  constexpr int64_t kRow = 1024;
  std::vector<int32_t> row(kRow, -1), rows(static_cast<size_t>(kRow * L));
  for (size_t i = 0; i < own.size() && i < static_cast<size_t>(kRow); ++i) row[i] = own[i];
  local_all_gather(comm, row.data(), rows.data(), kRow);
  std::vector<std::vector<int>> masks(static_cast<size_t>(L));
  for (int r = 0; r < L; ++r)
    for (int64_t i = 0; i < kRow && rows[static_cast<size_t>(r * kRow + i)] >= 0; ++i) masks[static_cast<size_t>(r)].push_back(rows[static_cast<size_t>(r * kRow + i)]);
  CoreAssignment a = assign_cores(visible, masks, comm.local_rank(), env != nullptr);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : a.cores) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0)
    fail("{}cannot pin this process to cores {}: {}", rank_prefix(), format_core_list(a.cores), std::strerror(errno));
  set_rank_cores(a.cores);
  return a;
}

}  // namespace trl::dist

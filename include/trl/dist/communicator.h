// Collectives between the processes of a distributed run (docs/DISTRIBUTED.md).
//
// A job of N processes is started by Open MPI (`mpirun -np N trl sft ...`, or `trl sft --nproc_per_node N`, which
// runs mpirun for the user). Each process is a rank; the ranks on one machine are its local ranks. world() is the
// process's communicator: Open MPI's when the process was started by mpirun, else a single-process one whose
// collectives return their input (so every code path is the same with one process).
//
// Every collective is called by all ranks of the communicator in the same order with the same sizes (MPI's rule);
// a rank that fails ends the whole job (abort), so a collective never waits for a rank that is gone.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trl/core/dtype.h"
#include "trl/core/tensor.h"

namespace trl::dist {

enum class ReduceOp { Sum, Max, Min };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The rank among the processes on this machine, and how many there are.
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  // "mpi" or "single".
  virtual const char* kind() const = 0;

  // data:[n] dtype -> data:[n], the element-wise reduction over the ranks, on every rank. F32, F64, I32, I64 and
  // BF16 (summed in f32, each partial sum rounded to bf16).
  virtual void all_reduce(void* data, int64_t n, DType dtype, ReduceOp op) = 0;
  // send:[n] -> recv:[size() * n], rank r's block at r * n.
  virtual void all_gather(const void* send, void* recv, int64_t n, DType dtype) = 0;
  // send:[size() * n] -> recv:[n]: block r of the element-wise sum over the ranks, on rank r. F32 and BF16.
  virtual void reduce_scatter(const void* send, void* recv, int64_t n, DType dtype) = 0;
  // data:[bytes] of rank `root` -> every rank.
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // The ranks that pass the same `color` as a communicator of their own, ranked by `key` (MPI_Comm_split): FSDP's
  // shard groups and their replicas. Collective: every rank calls it.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // Ends every rank of the job with exit code `code` (after this rank has printed why); does not return.
  [[noreturn]] virtual void abort(int code) = 0;

  // Conveniences over the above.
  double sum(double x);
  int64_t sum(int64_t x);
  int64_t max(int64_t x);
  int64_t min(int64_t x);
  bool any(bool x);
  // In place over the tensor's elements (contiguous F32 / BF16 / F64 / I64).
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
  // A string of rank `root` on every rank.
  std::string broadcast_string(const std::string& s, int root);
};

// The process's communicator (see above). The first call under mpirun initialises MPI.
Communicator& world();
// True when this process was started by an MPI launcher (mpirun / mpiexec / srun with PMIx).
bool launched_by_mpi();
// Ends MPI at the end of a successful run (every rank calls it); nothing with one process.
void finalize();
// "[rank 1/2] " under a job of several ranks, "" with one process: prefixes messages that only one rank prints.
std::string rank_prefix();

// The cores this rank runs on: TRL_VISIBLE_CORES (or the cores this process may use) split evenly between the local
// ranks, unless the launcher already gave the local ranks disjoint cores (mpirun binds each rank to a core by
// default), which are kept. Pins the process to them (sched_setaffinity) and sets the runtime's thread count to their
// number. Throws when a TRL_VISIBLE_CORES list cannot be split evenly between the local ranks. Called once, before
// any OpenMP thread starts.
struct CoreAssignment {
  std::vector<int> cores;
  std::string how;  // "split 0-1 between 2 local ranks", ...
};
CoreAssignment pin_local_cores(Communicator& comm);
// Pure part of pin_local_cores, for tests: this local rank's cores, given the visible list (or empty), every local
// rank's current cores, and whether the visible list came from TRL_VISIBLE_CORES.
CoreAssignment assign_cores(const std::vector<int>& visible, const std::vector<std::vector<int>>& local_masks, int local_rank, bool from_env);

}  // namespace trl::dist

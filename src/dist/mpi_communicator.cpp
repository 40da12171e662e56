// Open MPI behind the Communicator interface. Buffers are passed to MPI as they are (no staging copies); counts
// above MPI's int range are split into chunks. bf16 has no MPI type: it travels as 16-bit words and is summed by a
// user operation in f32, each partial sum rounded to bf16.
#include "dist/mpi_communicator.h"

// The C API only: Open MPI's deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "trl/core/error.h"

namespace trl::dist {

namespace {

constexpr int64_t kChunk = int64_t{1} << 30;  // elements per MPI call (below INT_MAX)

extern "C" void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

class MpiCommunicator final : public Communicator {
 public:
  // The world (MPI_COMM_WORLD, initialising MPI), or a group made by split() (which owns its handle).
  MpiCommunicator() : MpiCommunicator(MPI_COMM_NULL, false) {}
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    if (comm_ == MPI_COMM_NULL) {
      int ready = 0;
      MPI_Initialized(&ready);
      if (!ready) {
        int provided = 0;
        MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      }
      comm_ = MPI_COMM_WORLD;
    }
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local_);
    MPI_Comm_rank(local_, &local_rank_);
    MPI_Comm_size(local_, &local_size_);
    MPI_Op_create(&bf16_sum, 1, &bf16_sum_);
  }
  ~MpiCommunicator() override {
    // The world's handles live until MPI_Finalize (finalize()); a group frees its own while MPI is still up.
    int done = 0;
    MPI_Finalized(&done);
    if (!owned_ || done) return;
    MPI_Op_free(&bf16_sum_);
    MPI_Comm_free(&local_);
    MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm group = MPI_COMM_NULL;
    MPI_Comm_split(comm_, color, key, &group);
    return std::make_unique<MpiCommunicator>(group, true);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  const char* kind() const override { return "mpi"; }
  MPI_Comm local() const { return local_; }

  void all_reduce(void* data, int64_t n, DType dtype, ReduceOp op) override {
    const bool bf16 = dtype == DType::BF16;
    if (dtype == DType::F16 || (bf16 && op != ReduceOp::Sum)) fail("all_reduce: {} is not supported for {}", op_name(op), dtype_name(dtype));
    const MPI_Op mop = bf16 ? bf16_sum_ : op == ReduceOp::Sum ? MPI_SUM : op == ReduceOp::Max ? MPI_MAX : MPI_MIN;
    char* p = static_cast<char*>(data);
    const size_t es = dtype_size(dtype);
    for (int64_t at = 0; at < n; at += kChunk) {
      const int count = static_cast<int>(std::min(kChunk, n - at));
      MPI_Allreduce(MPI_IN_PLACE, p + static_cast<size_t>(at) * es, count, mpi_type(dtype), mop, comm_);
    }
  }
  void all_gather(const void* send, void* recv, int64_t n, DType dtype) override {
    if (n > kChunk) fail("all_gather: {} elements per rank is more than {}", n, kChunk);
    MPI_Allgather(send == recv ? MPI_IN_PLACE : send, static_cast<int>(n), mpi_type(dtype), recv, static_cast<int>(n), mpi_type(dtype), comm_);
  }
  void reduce_scatter(const void* send, void* recv, int64_t n, DType dtype) override {
    if (n > kChunk) fail("reduce_scatter: {} elements per rank is more than {}", n, kChunk);
    if (dtype != DType::F32 && dtype != DType::BF16) fail("reduce_scatter: {} is not supported (f32 or bf16)", dtype_name(dtype));
    MPI_Reduce_scatter_block(send, recv, static_cast<int>(n), mpi_type(dtype), dtype == DType::BF16 ? bf16_sum_ : MPI_SUM, comm_);
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    char* p = static_cast<char*>(data);
    for (int64_t at = 0; at < bytes; at += kChunk) MPI_Bcast(p + at, static_cast<int>(std::min(kChunk, bytes - at)), MPI_BYTE, root, comm_);
  }
  void barrier() override { MPI_Barrier(comm_); }
  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  static const char* op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : op == ReduceOp::Max ? "max" : "min"; }
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_world() { return std::make_unique<MpiCommunicator>(); }

void finalize_mpi() {
  int ready = 0, done = 0;
  MPI_Initialized(&ready);
  MPI_Finalized(&done);
  if (ready && !done) MPI_Finalize();
}

void local_all_gather(Communicator& comm, const int32_t* row, int32_t* rows, int64_t n) {
  auto* m = dynamic_cast<MpiCommunicator*>(&comm);
  if (m == nullptr) {
    std::memcpy(rows, row, static_cast<size_t>(n) * sizeof(int32_t));
    return;
  }
  MPI_Allgather(row, static_cast<int>(n), MPI_INT32_T, rows, static_cast<int>(n), MPI_INT32_T, m->local());
}

}  // namespace trl::dist

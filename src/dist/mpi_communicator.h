// Open MPI's communicator (src/dist/mpi_communicator.cpp): the only file that includes <mpi.h>.
#pragma once

#include <cstdint>
#include <memory>

#include "trl/dist/communicator.h"

namespace trl::dist {

// MPI_COMM_WORLD, with the ranks of this machine (MPI_COMM_TYPE_SHARED) as the local ranks. Initialises MPI
// (MPI_THREAD_FUNNELED: only the main thread calls MPI; OpenMP threads run the kernels).
std::unique_ptr<Communicator> make_mpi_world();
void finalize_mpi();
// rows:[local_size * n] = every local rank's row:[n] (int32), in local-rank order.
void local_all_gather(Communicator& comm, const int32_t* row, int32_t* rows, int64_t n);

}  // namespace trl::dist

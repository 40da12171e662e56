// The collectives that compiled programs run (graph::Op::AllReduce, docs/DISTRIBUTED.md "Tensor parallel"): a
// process-wide table of groups of ranks by id. The distributed layer registers its groups (a tensor-parallel group's
// communicator); a program's all_reduce node names its group, and its kernel calls the function registered for it.
// Kept in core so that backends need no dependency on the distributed layer.
#pragma once

#include <cstdint>
#include <functional>

#include "trl/core/dtype.h"

namespace trl {

// data:[n] dtype -> data:[n], summed over the ranks of the group, on every rank (f32 and bf16).
using AllReduceFn = std::function<void(void* data, int64_t n, DType dtype)>;

// Registers (or, with an empty function, removes) group `id`. Every rank of a group registers it under the same id
// before it runs a program that names it.
void set_collective_group(int id, AllReduceFn fn);
// Sums data over group `id`; throws when no such group is registered (a program traced for tensor parallel run
// outside of the run that set it up).
void all_reduce_in_group(int id, void* data, int64_t n, DType dtype);

}  // namespace trl

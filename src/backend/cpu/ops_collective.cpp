// Tensor parallel's collectives on the CPU: all_reduce (the sum over a collective group, core/collectives.h) and
// all_reduce_grad (the identity whose gradient is all-reduced). Both copy their input into their own buffer; the
// sum then runs in place through the group's communicator (Open MPI), whose ranks each run the same program.
#include <cstring>

#include "backend/cpu/lower.h"
#include "trl/core/collectives.h"

namespace trl::cpu {

// x:[...] f32|bf16 -> y:[...] (all_reduce: Σ over the group's ranks; all_reduce_grad: x)
Kernel lower_collective(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const graph::ValueId x = n.inputs[0];
  const int64_t count = shape_numel(n.shape);
  const size_t bytes = static_cast<size_t>(count) * dtype_size(n.dtype);
  const bool reduce = n.op == Op::AllReduce;
  const int32_t group = n.attrs.group;
  const DType dtype = n.dtype;
  return [cx, id, x, count, bytes, reduce, group, dtype] {
    if (cx->p(id) != cx->p(x)) std::memcpy(cx->p(id), cx->p(x), bytes);
    if (reduce) all_reduce_in_group(group, cx->p(id), count, dtype);
  };
}

}  // namespace trl::cpu

// Reverse-mode autodiff on the graph: every op has a VJP rule, written with forward or explicit backward ops, so
// the backward pass is part of the same graph (and later of the same compiled program). Gradients are f32.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "trl/graph/graph.h"

namespace trl::graph {

// Appends to `b` the gradient of the scalar `loss` with respect to the inputs named in `wrt`. Returns, for each of
// them, the value holding its gradient (same shape, f32). An input the loss does not depend on gets zeros.
// `grad_dtype` is f32 for training; f64 lets the tests compare gradients with finite differences.
std::map<std::string, ValueId> add_backward(Builder& b, ValueId loss, const std::vector<std::string>& wrt, DType grad_dtype = DType::F32);

}  // namespace trl::graph

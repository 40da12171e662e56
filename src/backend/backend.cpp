#include "trl/backend/backend.h"

#include <algorithm>
#include <cstring>

#include "core/memory.h"
#include "trl/core/error.h"

namespace trl {

namespace {
Tensor bind_one(const graph::Node& n, const TensorMap& inputs, InputMemory memory) {
  auto it = inputs.find(n.name);
  if (it == inputs.end()) fail("program input '{}' ({} {}) is not bound", n.name, dtype_name(n.dtype), shape_str(n.shape));
  const Tensor& t = it->second;
  if (t.dtype() != n.dtype || t.shape() != n.shape) {
    fail("program input '{}': expected {} {}, got {} {}", n.name, dtype_name(n.dtype), shape_str(n.shape), dtype_name(t.dtype()),
         shape_str(t.shape()));
  }
  if (!t.is_contiguous()) fail("program input '{}' must be contiguous", n.name);
  if (memory == InputMemory::Host && t.is_device())
    fail("program input '{}' is in device memory ({}), but this backend runs on host memory: download it first (Backend::download)", n.name, t.device_label());
  if (memory == InputMemory::Device && !t.is_device() && t.numel() > 0)
    fail("program input '{}' is in host memory, but this backend's programs read device memory: upload it first (Backend::upload)", n.name);
  return t;
}
}  // namespace

std::vector<Tensor> bind_inputs(const graph::Graph& graph, const TensorMap& inputs, InputMemory memory) {
  std::vector<Tensor> bound;
  bound.reserve(graph.inputs.size());
  for (graph::ValueId id : graph.inputs) bound.push_back(bind_one(graph.node(id), inputs, memory));
  return bound;
}

std::vector<Tensor> bind_stage_inputs(const graph::Graph& graph, const TensorMap& inputs, int stage, InputMemory memory) {
  if (stage != 0 && stage != 1) fail("program stage {} does not exist (a two-stage program has stages 0 and 1)", stage);
  std::vector<Tensor> bound(graph.inputs.size());
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    const graph::Node& n = graph.node(graph.inputs[i]);
    const bool seed = std::find(graph.seed_inputs.begin(), graph.seed_inputs.end(), n.name) != graph.seed_inputs.end();
    if (seed == (stage == 1)) bound[i] = bind_one(n, inputs, memory);
  }
  return bound;
}

Backend::Memory Backend::memory() const {
  const MemoryBudget b = memory_budget();
  return {b.available, b.total, b.source};
}

namespace {
void check_f32(const Tensor& t, const char* what) {
  if (t.dtype() != DType::F32 || !t.is_contiguous()) fail("{}: expected a contiguous f32 tensor, got {} {}", what, dtype_name(t.dtype()), shape_str(t.shape()));
}
}  // namespace

void Backend::accumulate(Tensor& acc, const Tensor& x, bool first) {
  check_f32(acc, "accumulate");
  check_f32(x, "accumulate");
  if (acc.shape() != x.shape()) fail("accumulate: shapes {} and {} differ", shape_str(acc.shape()), shape_str(x.shape()));
  float* a = acc.mutable_data_as<float>();
  const float* g = x.data_as<float>();
  const int64_t n = x.numel();
  if (first) {
    std::memcpy(a, g, static_cast<size_t>(n) * sizeof(float));
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] += g[i];
}

std::vector<double> Backend::sum_of_squares(const std::vector<Tensor>& xs) {
  std::vector<double> out;
  out.reserve(xs.size());
  for (const Tensor& t : xs) {
    check_f32(t, "sum_of_squares");
    const float* x = t.data_as<float>();
    double part = 0;
#pragma omp parallel for reduction(+ : part) schedule(static)
    for (int64_t i = 0; i < t.numel(); ++i) part += static_cast<double>(x[i]) * x[i];
    out.push_back(part);
  }
  return out;
}

void Backend::scale(std::vector<Tensor>& xs, float factor) {
  for (Tensor& t : xs) {
    check_f32(t, "scale");
    float* x = t.mutable_data_as<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < t.numel(); ++i) x[i] *= factor;
  }
}

std::vector<Tensor> Program::run_stage(const TensorMap&, int) {
  fail("this backend's programs do not run in stages (Program::run_stage); use run() with every input bound");
}

}  // namespace trl

#include "trl/backend/backend.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/adamw_update.h"
#include "core/memory.h"
#include "trl/core/error.h"
#include "trl/dist/communicator.h"

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
constexpr int64_t kChunk = 1 << 14;  // elements per unit of work of the host loops below

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

void Backend::all_reduce(std::vector<Tensor>& xs, dist::Communicator& comm) {
  constexpr int64_t kBucket = 25 << 20 >> 2;  // f32 elements
  for (const Tensor& t : xs) check_f32(t, "all_reduce");
  std::vector<Tensor*> pending;
  int64_t pending_n = 0;
  std::vector<float> bucket;
  // A tensor of a bucket's size or more is reduced in place; smaller ones are packed together first, so that a
  // model's hundreds of small norm weights cost a few collectives instead of hundreds.
  auto flush = [&] {
    if (pending.empty()) return;
    bucket.resize(static_cast<size_t>(pending_n));
    int64_t at = 0;
    for (Tensor* t : pending) std::memcpy(bucket.data() + at, t->data(), t->nbytes()), at += t->numel();
    comm.all_reduce(bucket.data(), pending_n, DType::F32, dist::ReduceOp::Sum);
    at = 0;
    for (Tensor* t : pending) std::memcpy(t->mutable_data(), bucket.data() + at, t->nbytes()), at += t->numel();
    pending.clear(), pending_n = 0;
  };
  for (Tensor& g : xs) {
    if (g.numel() >= kBucket) {
      comm.all_reduce(g);
      continue;
    }
    if (pending_n + g.numel() > kBucket) flush();
    pending.push_back(&g), pending_n += g.numel();
  }
  flush();
}

std::vector<double> Backend::sum_of_squares(const std::vector<Tensor>& xs, const std::vector<int>& group_of) {
  if (!group_of.empty() && group_of.size() != xs.size()) fail("sum_of_squares: {} groups for {} tensors", group_of.size(), xs.size());
  for (int g : group_of)
    if (g < 0) fail("sum_of_squares: group {} is negative", g);  // groups name kinds (whole, split), not tensors: a rank may hold one tensor of group 1
  std::vector<double> out;
  out.reserve(xs.size());
  for (const Tensor& t : xs) {
    check_f32(t, "sum_of_squares");
    // Fixed chunks summed in order: the same bits on any number of threads (an OpenMP reduction adds the threads'
    // parts in the order they finish).
    const float* x = t.data_as<float>();
    const int64_t n = t.numel(), chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> parts(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      double part = 0;
      for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) part += static_cast<double>(x[i]) * x[i];
      parts[static_cast<size_t>(c)] = part;
    }
    double sum = 0;
    for (double p : parts) sum += p;
    out.push_back(sum);
  }
  if (group_of.empty()) return out;
  std::vector<double> groups(static_cast<size_t>(*std::max_element(group_of.begin(), group_of.end()) + 1), 0.0);
  for (size_t i = 0; i < out.size(); ++i) groups[static_cast<size_t>(group_of[i])] += out[i];
  return groups;
}

void Backend::scale(std::vector<Tensor>& xs, float factor) {
  for (Tensor& t : xs) {
    check_f32(t, "scale");
    float* x = t.mutable_data_as<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < t.numel(); ++i) x[i] *= factor;
  }
}

void Backend::zero(Tensor& t) {
  if (!t.is_contiguous()) fail("zero: expected a contiguous tensor, got {} {}", dtype_name(t.dtype()), shape_str(t.shape()));
  if (t.nbytes() > 0) std::memset(t.mutable_data(), 0, t.nbytes());
}

Tensor Backend::allocate(DType dtype, const Shape& shape, const std::string& name) {
  (void)name;
  return Tensor::uninitialized(dtype, shape);
}

void check_adamw_step(const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& weight, const Tensor* compute) {
  for (const Tensor* t : {&grad, &exp_avg, &exp_avg_sq, &weight})
    if (t->dtype() != DType::F32 || t->shape() != weight.shape() || !t->is_contiguous())
      fail("AdamW step: the gradient, both moments and the weight must be contiguous f32 tensors of one shape (weight {} {}, got {} {})",
           dtype_name(weight.dtype()), shape_str(weight.shape()), dtype_name(t->dtype()), shape_str(t->shape()));
  if (compute != nullptr && (compute->dtype() != DType::BF16 || compute->shape() != weight.shape() || !compute->is_contiguous()))
    fail("AdamW step: the compute copy must be a contiguous bf16 tensor of the weight's shape {} (got {} {})", shape_str(weight.shape()),
         dtype_name(compute->dtype()), shape_str(compute->shape()));
}

void Backend::adamw_step(const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, Tensor& weight, Tensor* compute, const AdamWStep& step) {
  const AdamWArrays a = adamw_arrays(grad, exp_avg, exp_avg_sq, weight, compute);
  const int64_t n = a.n;
#pragma omp parallel for schedule(static)
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t i1 = std::min(n, i0 + kChunk);
    if (step.fresh)
      adamw_update_scalar<true>(a.g, a.m, a.v, a.w, a.w16, i0, i1, step);
    else
      adamw_update_scalar<false>(a.g, a.m, a.v, a.w, a.w16, i0, i1, step);
  }
}

Tensor Backend::mix(const Tensor& target, const Tensor& source, float alpha, const std::string& name) {
  for (const Tensor* t : {&target, &source})
    if (!dtype_is_float(t->dtype()) || t->shape() != target.shape() || !t->is_contiguous())
      fail("mix of '{}': the target and the source must be contiguous float tensors of one shape (target {} {}, source {} {})", name,
           dtype_name(target.dtype()), shape_str(target.shape()), dtype_name(source.dtype()), shape_str(source.shape()));
  Tensor out = allocate(target.dtype(), target.shape(), name);
  const bool f32_or_bf16 = [&] {
    for (const Tensor* t : {&target, &source})
      if (t->dtype() != DType::F32 && t->dtype() != DType::BF16) return false;
    return true;
  }();
  if (!f32_or_bf16) {  // f16, f64: element by element, in f32 as below
    for (int64_t i = 0; i < target.numel(); ++i) {
      const float m = alpha * static_cast<float>(load_element(source.data(), source.dtype(), i)) +
                      (1.0f - alpha) * static_cast<float>(load_element(target.data(), target.dtype(), i));
      store_element(out.mutable_data(), out.dtype(), i, m);
    }
    return out;
  }
  const int64_t n = target.numel();
  const void* a = target.data();
  const void* b = source.data();
  void* o = out.mutable_data();
  const DType ta = target.dtype(), tb = source.dtype();
  auto f32_at = [](const void* p, DType dt, int64_t i) {
    return dt == DType::F32 ? static_cast<const float*>(p)[i] : bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  };
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float m = alpha * f32_at(b, tb, i) + (1.0f - alpha) * f32_at(a, ta, i);
    if (ta == DType::F32)
      static_cast<float*>(o)[i] = m;
    else
      static_cast<uint16_t*>(o)[i] = f32_to_bf16(m);
  }
  return out;
}

std::vector<double> Backend::span_sums(const Tensor& values, const Tensor* weights, const Tensor* factors, const std::vector<Span>& spans) {
  check_f32(values, "span_sums");
  if (weights != nullptr) check_f32(*weights, "span_sums");
  if (factors != nullptr) check_f32(*factors, "span_sums");
  if (values.shape().size() != 2 || (weights != nullptr && weights->shape() != values.shape()) || (factors != nullptr && factors->shape() != values.shape()))
    fail("span_sums: the values, weights and factors must be [rows, tokens] of one shape, got {}, {} and {}", shape_str(values.shape()),
         weights != nullptr ? shape_str(weights->shape()) : std::string("none"), factors != nullptr ? shape_str(factors->shape()) : std::string("none"));
  const int64_t R = values.size(0), T = values.size(1);
  for (const Span& s : spans)
    if (s.row < 0 || s.row >= R || s.begin < 0 || s.begin > s.end || s.end > T)
      fail("span_sums: span [{}, {}) of row {} lies outside the [{}, {}] values", s.begin, s.end, s.row, R, T);
  const float* v = values.data_as<float>();
  const float* w = weights != nullptr ? weights->data_as<float>() : nullptr;
  const float* f = factors != nullptr ? factors->data_as<float>() : nullptr;
  std::vector<double> out(spans.size());
#pragma omp parallel for schedule(static) if (spans.size() > 1)
  for (size_t q = 0; q < spans.size(); ++q) {
    const Span& s = spans[q];
    double sum = 0;
    for (int64_t t = s.begin; t < s.end; ++t) {
      const int64_t i = s.row * T + t;
      const float wi = w != nullptr ? w[i] : 1.0f;
      if (wi != 0) sum += static_cast<double>(wi) * (f != nullptr ? f[i] : 1.0f) * v[i];
    }
    out[q] = sum;
  }
  return out;
}

TensorMap to_backend(Backend& backend, const TensorMap& tensors) {
  if (backend.host_memory()) return tensors;
  TensorMap out;
  for (const auto& [name, t] : tensors) out[name] = t.is_device() ? t : backend.upload(t, name);
  return out;
}

void check_copy_rows(const Tensor& src, const std::vector<int64_t>& src_rows, const Tensor& dst, const std::vector<int64_t>& dst_rows) {
  const Shape& a = src.shape();
  const Shape& b = dst.shape();
  if (a.empty() || b.empty() || src.dtype() != dst.dtype() || !src.is_contiguous() || !dst.is_contiguous() || !std::equal(a.begin() + 1, a.end(), b.begin() + 1, b.end()))
    fail("copy_rows: rows of {} {} do not fit rows of {} {} (one dtype, one row shape, contiguous)", dtype_name(src.dtype()), shape_str(a),
         dtype_name(dst.dtype()), shape_str(b));
  if (src_rows.size() != dst_rows.size()) fail("copy_rows: {} source rows for {} destination rows", src_rows.size(), dst_rows.size());
  for (size_t k = 0; k < src_rows.size(); ++k)
    if (src_rows[k] < 0 || src_rows[k] >= a[0] || dst_rows[k] < 0 || dst_rows[k] >= b[0])
      fail("copy_rows: row {} of {} to row {} of {}: outside the tensors", src_rows[k], shape_str(a), dst_rows[k], shape_str(b));
}

void Backend::copy_rows(const Tensor& src, const std::vector<int64_t>& src_rows, Tensor& dst, const std::vector<int64_t>& dst_rows) {
  check_copy_rows(src, src_rows, dst, dst_rows);
  const size_t row = src.shape()[0] > 0 ? src.nbytes() / static_cast<size_t>(src.shape()[0]) : 0;
  const auto* from = static_cast<const char*>(src.data());
  auto* to = static_cast<char*>(dst.mutable_data());
  for (size_t k = 0; k < src_rows.size(); ++k) std::memcpy(to + static_cast<size_t>(dst_rows[k]) * row, from + static_cast<size_t>(src_rows[k]) * row, row);
}

std::vector<Tensor> Program::run_stage(const TensorMap&, int) {
  fail("this backend's programs do not run in stages (Program::run_stage); use run() with every input bound");
}

}  // namespace trl

// generate()'s logits processors and pick (trl/backend/sampling.h) and Backend::sample, the host backends' way of
// running them over the rows of a logits tensor.
#include "trl/backend/sampling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "trl/backend/backend.h"
#include "trl/core/error.h"

namespace trl {

namespace {
// Row-wise softmax of finite scores (-inf stays 0).
std::vector<double> softmax(const std::vector<float>& s) {
  const float mx = *std::max_element(s.begin(), s.end());
  std::vector<double> p(s.size());
  double sum = 0;
  for (size_t i = 0; i < s.size(); ++i) sum += p[i] = s[i] == -INFINITY ? 0.0 : std::exp(static_cast<double>(s[i]) - mx);
  for (double& x : p) x /= sum;
  return p;
}
}  // namespace

void process_logits(std::vector<float>& s, const std::vector<int32_t>& context, const SamplingParams& p) {
  process_logits(s, context.data(), static_cast<int64_t>(context.size()), p);
}

void process_logits(std::vector<float>& s, const int32_t* context, int64_t context_length, const SamplingParams& p) {
  const int64_t V = static_cast<int64_t>(s.size());
  if (p.repetition_penalty != 1.0f) {
    std::vector<char> seen(static_cast<size_t>(V), 0);
    for (int64_t i = 0; i < context_length; ++i) {
      const int32_t id = context[i];
      if (id >= 0 && id < V && !seen[static_cast<size_t>(id)]) {
        seen[static_cast<size_t>(id)] = 1;
        float& x = s[static_cast<size_t>(id)];
        x = x < 0 ? x * p.repetition_penalty : x / p.repetition_penalty;
      }
    }
  }
  if (!p.do_sample) return;
  if (p.temperature != 1.0f)
    for (float& x : s) x /= p.temperature;
  if (p.top_k > 0 && p.top_k < V) {
    std::vector<float> sorted(s);
    std::nth_element(sorted.begin(), sorted.begin() + (p.top_k - 1), sorted.end(), std::greater<float>());
    const float kth = sorted[static_cast<size_t>(p.top_k - 1)];
    for (float& x : s)
      if (x < kth) x = -INFINITY;  // ties with the k-th are kept
  }
  if (p.top_p < 1.0f) {
    const std::vector<double> prob = softmax(s);
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[static_cast<size_t>(a)] < s[static_cast<size_t>(b)]; });
    double cum = 0;
    for (int64_t i = 0; i < V - 1; ++i) {  // ascending; the last (the most likely) is always kept
      cum += prob[static_cast<size_t>(order[static_cast<size_t>(i)])];
      if (cum <= 1.0 - static_cast<double>(p.top_p)) s[static_cast<size_t>(order[static_cast<size_t>(i)])] = -INFINITY;
    }
  }
  if (p.min_p) {
    const std::vector<double> prob = softmax(s);
    const double top = *std::max_element(prob.begin(), prob.end());
    for (int64_t i = 0; i < V; ++i)
      if (prob[static_cast<size_t>(i)] < static_cast<double>(*p.min_p) * top) s[static_cast<size_t>(i)] = -INFINITY;
  }
}

int32_t pick_token(const std::vector<float>& s, bool do_sample, double u) {
  if (!do_sample) return static_cast<int32_t>(std::max_element(s.begin(), s.end()) - s.begin());
  // Inverse CDF of softmax(s): one pass of exps (float, into a buffer) and their total, then the first index whose
  // running sum passes u·total. -inf scores (filtered tokens) have weight 0 and are never picked.
  const float mx = *std::max_element(s.begin(), s.end());
  thread_local std::vector<float> e;
  e.resize(s.size());
  double total = 0;
  for (size_t i = 0; i < s.size(); ++i) total += e[i] = s[i] == -INFINITY ? 0.0f : std::exp(s[i] - mx);
  const double target = u * total;
  double cum = 0;
  int32_t last = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    if (e[i] == 0) continue;
    cum += e[i];
    last = static_cast<int32_t>(i);
    if (target < cum) return last;
  }
  return last;  // rounding left u·total above the sum
}

void check_sample_request(const Tensor& logits, const Backend::SampleRequest& r) {
  if (!dtype_is_float(logits.dtype()) || !logits.is_contiguous() || logits.shape().empty() || logits.shape().back() < 1)
    fail("sample: the logits must be a contiguous float tensor whose last dimension is the vocabulary, got {} {}", dtype_name(logits.dtype()),
         shape_str(logits.shape()));
  const int64_t V = logits.shape().back(), R = logits.numel() / V;
  if (r.rows < 1 || r.row_stride < 0 || r.row_offset < 0 || (r.rows - 1) * r.row_stride + r.row_offset >= R)
    fail("sample: {} rows at stride {} from row {} do not fit the {} rows of logits {}", r.rows, r.row_stride, r.row_offset, R, shape_str(logits.shape()));
  if (r.params.do_sample && static_cast<int64_t>(r.uniforms.size()) != r.rows)
    fail("sample: {} uniforms for {} rows (one draw per row)", r.uniforms.size(), r.rows);
  if (r.params.repetition_penalty != 1.0f) {
    if (r.context == nullptr) fail("sample: a repetition penalty needs the rows' ids so far (context)");
    const Tensor& c = *r.context;
    if (c.dtype() != DType::I32 || c.shape().size() != 2 || c.shape()[0] != r.rows || !c.is_contiguous())
      fail("sample: the context must be contiguous i32 [{}, T], got {} {}", r.rows, dtype_name(c.dtype()), shape_str(c.shape()));
  }
}

std::vector<int32_t> Backend::sample(const Tensor& logits, const SampleRequest& r) {
  check_sample_request(logits, r);
  const int64_t V = logits.shape().back();
  const bool penalty = r.params.repetition_penalty != 1.0f;
  const int64_t T = penalty ? r.context->shape()[1] : 0;
  const int32_t* ctx = penalty ? r.context->data_as<int32_t>() : nullptr;
  const void* x = logits.data();
  const DType dt = logits.dtype();
  std::vector<int32_t> ids(static_cast<size_t>(r.rows));
  // Rows are independent: each thread takes whole rows (the same ids on any thread count).
#pragma omp parallel for schedule(dynamic, 1) if (r.rows > 1)
  for (int64_t b = 0; b < r.rows; ++b) {
    thread_local std::vector<float> s;
    s.resize(static_cast<size_t>(V));
    load_f32(x, dt, (b * r.row_stride + r.row_offset) * V, V, s.data());
    process_logits(s, penalty ? ctx + b * T : nullptr, T, r.params);
    ids[static_cast<size_t>(b)] = pick_token(s, r.params.do_sample, r.params.do_sample ? r.uniforms[static_cast<size_t>(b)] : 0.0);
  }
  return ids;
}

}  // namespace trl

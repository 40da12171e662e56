#include "trl/core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <limits>

#include <sys/mman.h>

#include "trl/core/error.h"

namespace trl {

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail("invalid shape {}: negative dimension", shape_str(shape));
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) fail("invalid shape {}: too many elements", shape_str(shape));
    n *= d;
  }
  return n;
}

static Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t = uninitialized(dtype, std::move(shape));
  std::memset(const_cast<void*>(t.data_), 0, (t.nbytes() + 63) / 64 * 64);
  return t;
}

Tensor Tensor::uninitialized(DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.numel_ = shape_numel(shape);
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.kind_ = StorageKind::Owned;
  size_t bytes = t.nbytes();
  size_t alloc = (bytes + 63) / 64 * 64;
  if (alloc == 0) alloc = 64;
  // Large buffers (weights, optimizer moments, program arenas) go on 2 MB-aligned memory that the kernel may back
  // with transparent huge pages (madvise mode): first touch costs about a quarter less here, and big GEMM operands
  // need fewer TLB entries.
  constexpr size_t kHuge = size_t{2} << 20;
  const bool huge = alloc >= 4 * kHuge;
  if (huge) alloc = (alloc + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(huge ? kHuge : 64, alloc);
#if defined(MADV_HUGEPAGE)
  if (p != nullptr && huge) ::madvise(p, alloc, MADV_HUGEPAGE);
#endif
  if (p == nullptr) fail("out of memory allocating {} bytes for a {} {} tensor", alloc, dtype_name(dtype), shape_str(t.shape_));
  t.keepalive_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.data_ = p;
  return t;
}

Tensor Tensor::view(const void* data, DType dtype, Shape shape, std::shared_ptr<const void> keepalive, StorageKind kind) {
  Tensor t;
  t.dtype_ = dtype;
  t.numel_ = shape_numel(shape);
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.kind_ = kind;
  t.keepalive_ = std::move(keepalive);
  t.data_ = data;
  return t;
}

Tensor Tensor::device(void* handle, DType dtype, Shape shape, std::shared_ptr<const void> keepalive, std::string label) {
  Tensor t = view(handle, dtype, std::move(shape), std::move(keepalive), StorageKind::Device);
  t.device_label_ = std::make_shared<const std::string>(std::move(label));
  return t;
}

void* Tensor::device_handle() const {
  if (kind_ != StorageKind::Device) fail("internal: device_handle() of a {} {} tensor in host memory", dtype_name(dtype_), shape_str(shape_));
  return const_cast<void*>(data_);
}

const std::string& Tensor::device_label() const {
  static const std::string host = "host memory";
  return device_label_ ? *device_label_ : host;
}

void Tensor::host_access_error(const char* what) const {
  fail("the host tried to {} a {} {} tensor, {}, which only its backend can reach: download it first (Backend::download; a "
       "trainer's weights: master_weights_on_host())", what,
       dtype_name(dtype_), shape_str(shape_), device_label());
}

Tensor Tensor::from_f32(std::span<const float> values, Shape shape, DType dtype) {
  if (!dtype_is_float(dtype)) fail("Tensor::from_f32: {} is not a float dtype", dtype_name(dtype));
  Tensor t = zeros(dtype, std::move(shape));
  if (static_cast<int64_t>(values.size()) != t.numel()) {
    fail("Tensor::from_f32: {} values for shape {}", values.size(), shape_str(t.shape()));
  }
  void* out = t.mutable_data();
  for (int64_t i = 0; i < t.numel(); ++i) store_element(out, dtype, i, values[static_cast<size_t>(i)]);
  return t;
}

Tensor Tensor::from_i32(std::span<const int32_t> values, Shape shape) {
  Tensor t = zeros(DType::I32, std::move(shape));
  if (static_cast<int64_t>(values.size()) != t.numel()) {
    fail("Tensor::from_i32: {} values for shape {}", values.size(), shape_str(t.shape()));
  }
  std::memcpy(t.mutable_data(), values.data(), t.nbytes());
  return t;
}

int64_t Tensor::size(int64_t axis) const {
  int64_t n = dim();
  if (axis < 0) axis += n;
  if (axis < 0 || axis >= n) fail("axis {} out of range for a tensor of shape {}", axis, shape_str(shape_));
  return shape_[static_cast<size_t>(axis)];
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

void* Tensor::mutable_data() {
  if (kind_ == StorageKind::Mapped) fail("tensor {} is a read-only view of a memory-mapped file; copy it first", shape_str(shape_));
  if (kind_ == StorageKind::Device) host_access_error("write");
  return const_cast<void*>(data_);
}

Tensor Tensor::reshape(Shape shape) const {
  if (!is_contiguous()) fail("reshape of a non-contiguous tensor {}", shape_str(shape_));
  if (shape_numel(shape) != numel_) fail("cannot reshape {} to {}: element counts differ", shape_str(shape_), shape_str(shape));
  Tensor t = *this;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice_flat(int64_t offset, Shape shape) const {
  if (!is_contiguous()) fail("slice_flat of a non-contiguous tensor {}", shape_str(shape_));
  const int64_t n = shape_numel(shape);
  if (offset < 0 || offset + n > numel_) fail("slice_flat [{}, {}) is outside a tensor of {} elements", offset, offset + n, numel_);
  Tensor t = *this;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.numel_ = n;
  t.data_ = static_cast<const char*>(data_) + offset * static_cast<int64_t>(dtype_size(dtype_));
  return t;
}

void load_f32(const void* data, DType dtype, int64_t at, int64_t n, float* out) {
  if (dtype == DType::F32) {
    std::memcpy(out, static_cast<const float*>(data) + at, static_cast<size_t>(n) * sizeof(float));
  } else if (dtype == DType::BF16) {
    const uint16_t* h = static_cast<const uint16_t*>(data) + at;
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(h[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(load_element(data, dtype, at + i));
  }
}

double load_element(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(data)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::I32: return static_cast<const int32_t*>(data)[i];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DType::F64: return static_cast<const double*>(data)[i];
  }
  return 0;
}

void store_element(void* data, DType dtype, int64_t i, double value) {
  switch (dtype) {
    case DType::F32: static_cast<float*>(data)[i] = static_cast<float>(value); break;
    case DType::BF16: static_cast<uint16_t*>(data)[i] = f32_to_bf16(static_cast<float>(value)); break;
    case DType::F16: static_cast<uint16_t*>(data)[i] = f32_to_f16(static_cast<float>(value)); break;
    case DType::I32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(value); break;
    case DType::I64: static_cast<int64_t*>(data)[i] = static_cast<int64_t>(value); break;
    case DType::F64: static_cast<double*>(data)[i] = value; break;
  }
}

Tensor Tensor::to(DType dtype) const {
  if (!is_contiguous()) fail("conversion of a non-contiguous tensor {}", shape_str(shape_));
  bool src_float = dtype_is_float(dtype_), dst_float = dtype_is_float(dtype);
  if (src_float && !dst_float) fail("cannot convert a {} tensor to {}", dtype_name(dtype_), dtype_name(dtype));
  Tensor out = zeros(dtype, shape_);
  if (dtype == dtype_) {
    std::memcpy(out.mutable_data(), data(), nbytes());
    return out;
  }
  void* dst = out.mutable_data();
  if (!src_float && !dst_float) {
    for (int64_t i = 0; i < numel_; ++i) {
      int64_t v = dtype_ == DType::I32 ? data_as<int32_t>()[i] : data_as<int64_t>()[i];
      if (dtype == DType::I32) {
        if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
          fail("cannot convert i64 value {} at index {} to i32", v, i);
        }
        out.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(v);
      } else {
        out.mutable_data_as<int64_t>()[i] = v;
      }
    }
    return out;
  }
  for (int64_t i = 0; i < numel_; ++i) store_element(dst, dtype, i, load_element(data(), dtype_, i));
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  if (src.shape() != shape_) fail("copy_from: shapes {} and {} differ", shape_str(src.shape()), shape_str(shape_));
  if (!is_contiguous() || !src.is_contiguous()) fail("copy_from needs contiguous tensors");
  void* dst = mutable_data();
  const int64_t n = numel_;
  if (src.dtype() == dtype_) {
    std::memcpy(dst, src.data(), nbytes());
  } else if (src.dtype() == DType::F32 && dtype_ == DType::BF16) {
    const float* a = src.data_as<float>();
    uint16_t* b = static_cast<uint16_t*>(dst);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) b[i] = f32_to_bf16(a[i]);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) store_element(dst, dtype_, i, load_element(src.data(), src.dtype(), i));
  }
}

std::vector<float> Tensor::to_f32_vector() const {
  if (!is_contiguous()) fail("to_f32_vector of a non-contiguous tensor");
  std::vector<float> v(static_cast<size_t>(numel_));
  const void* src = data();
  for (int64_t i = 0; i < numel_; ++i) v[static_cast<size_t>(i)] = static_cast<float>(load_element(src, dtype_, i));
  return v;
}

std::vector<int64_t> Tensor::to_i64_vector() const {
  if (!is_contiguous()) fail("to_i64_vector of a non-contiguous tensor");
  std::vector<int64_t> v(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) {
    v[static_cast<size_t>(i)] = dtype_ == DType::I64 ? data_as<int64_t>()[i] : static_cast<int64_t>(load_element(data(), dtype_, i));
  }
  return v;
}

}  // namespace trl

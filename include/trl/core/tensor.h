// Tensor: a dtype, a shape, strides (in elements) and a pointer into storage that is owned (heap, 64-byte
// aligned), memory-mapped (a read-only view of a checkpoint file), a view into memory owned by someone else (an
// arena planned by the compiler, a caller's buffer), or a backend's device memory, which the host cannot read.
// Copying a Tensor is cheap and shares storage.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "trl/core/dtype.h"

namespace trl {

using Shape = std::vector<int64_t>;

enum class StorageKind : uint8_t { Owned, Mapped, View, Device };

std::string shape_str(const Shape& shape);  // "[2, 3, 4]"
int64_t shape_numel(const Shape& shape);     // throws on negative dims or overflow

class Tensor {
 public:
  Tensor() = default;

  // Owned, contiguous, zero-filled.
  static Tensor zeros(DType dtype, Shape shape);
  // Owned, contiguous, contents unspecified (for buffers that are written before they are read).
  static Tensor uninitialized(DType dtype, Shape shape);
  // A contiguous view of memory owned elsewhere; `keepalive` (may be null) is held while the view lives.
  static Tensor view(const void* data, DType dtype, Shape shape, std::shared_ptr<const void> keepalive,
                     StorageKind kind = StorageKind::View);
  // A tensor in a backend's device memory: the host cannot read or write it (data(), mutable_data() and every
  // conversion fail, naming it by `label`, such as "'lm_head.weight' in cuda:0 memory"); the backend that made it
  // reaches its memory through device_handle(). `keepalive` frees the memory when the last copy goes.
  static Tensor device(void* handle, DType dtype, Shape shape, std::shared_ptr<const void> keepalive, std::string label);
  // Owned f32 / i32 tensors from values (for tests and small inputs).
  static Tensor from_f32(std::span<const float> values, Shape shape, DType dtype = DType::F32);
  static Tensor from_i32(std::span<const int32_t> values, Shape shape);

  bool defined() const { return data_ != nullptr || numel_ == 0; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t axis) const;  // negative axis counts from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  StorageKind storage_kind() const { return kind_; }
  bool is_device() const { return kind_ == StorageKind::Device; }
  // A device tensor's memory, for the backend that made it (an error on a host tensor), and what it is and where.
  void* device_handle() const;
  const std::string& device_label() const;
  bool is_contiguous() const;

  // The host address of the data; an error for a device tensor (download it first: Backend::download).
  const void* data() const {
    if (kind_ == StorageKind::Device) [[unlikely]] host_access_error("read");
    return data_;
  }
  // Writable pointer; throws for memory-mapped (read-only) storage and device tensors.
  void* mutable_data();
  template <typename T> const T* data_as() const { return static_cast<const T*>(data()); }
  template <typename T> T* mutable_data_as() { return static_cast<T*>(mutable_data()); }

  // Same storage, new shape (contiguous tensors only; numel must match).
  Tensor reshape(Shape shape) const;
  // Same storage: `numel(shape)` elements starting at element `offset` of this contiguous tensor, as `shape`.
  Tensor slice_flat(int64_t offset, Shape shape) const;
  // Owned contiguous copy, converting the element type (float <-> float, int <-> int, int -> float).
  Tensor to(DType dtype) const;
  Tensor clone() const { return to(dtype_); }
  // Converts `src` into this tensor's storage (same shape), in parallel; f32 -> bf16 has a fast path.
  void copy_from(const Tensor& src);
  // Every element as f32 / as i64, in row-major order.
  std::vector<float> to_f32_vector() const;
  std::vector<int64_t> to_i64_vector() const;

 private:
  [[noreturn]] void host_access_error(const char* what) const;

  DType dtype_ = DType::F32;
  Shape shape_;
  Shape strides_;
  int64_t numel_ = 0;
  StorageKind kind_ = StorageKind::Owned;
  std::shared_ptr<const void> keepalive_;
  const void* data_ = nullptr;
  std::shared_ptr<const std::string> device_label_;  // device tensors only
};

// Element i (row-major index into a contiguous tensor) as double / stored from double, any float dtype.
double load_element(const void* data, DType dtype, int64_t i);
void store_element(void* data, DType dtype, int64_t i, double value);
// Elements [at, at + n) as f32 into `out`: f32 copied, bf16 widened exactly, any other dtype through load_element
// (a logits row read for sampling).
void load_f32(const void* data, DType dtype, int64_t at, int64_t n, float* out);

}  // namespace trl

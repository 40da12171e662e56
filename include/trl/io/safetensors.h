// safetensors files and sharded checkpoints.
//
// Format (https://github.com/huggingface/safetensors): 8 bytes little-endian u64 N, then N bytes of a UTF-8 JSON
// object, then the data buffer. The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the start of the data buffer) plus an optional "__metadata__" object of string values.
// The buffer must be covered exactly: no overlaps, no holes, nothing after the last tensor.
//
// A sharded checkpoint is a folder with model-00001-of-0000K.safetensors files and model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {tensor name: shard file}}), as Transformers writes them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trl/core/byte_size.h"  // parse_byte_size, for max_shard_size (declared here before)
#include "trl/core/mapped_file.h"
#include "trl/core/tensor.h"

namespace trl {

using TensorMap = std::map<std::string, Tensor>;
using Metadata = std::map<std::string, std::string>;

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data buffer
  uint64_t end = 0;
};

class SafeTensorsFile {
 public:
  // Maps and validates the whole header; every error names the file (and the tensor when there is one).
  static SafeTensorsFile open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  const Metadata& metadata() const { return metadata_; }
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  // A zero-copy, read-only view into the mapping (kept alive by the returned tensor).
  Tensor get(const std::string& name) const;

 private:
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, TensorInfo> tensors_;
  Metadata metadata_;
  uint64_t data_start_ = 0;
};

// Writes one safetensors file atomically (temp file + rename). Tensors are laid out by decreasing element size,
// then by name, after a header padded with spaces to a multiple of 8 bytes, so every tensor is aligned to its
// element size. `metadata` defaults to {"format": "pt"}, which Transformers requires to load the file.
void save_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata = {{"format", "pt"}});

// A model checkpoint: a single model.safetensors or a sharded set with its index.
class Checkpoint {
 public:
  // `path` is a folder (model.safetensors.index.json is preferred, then model.safetensors) or a .safetensors file.
  static Checkpoint open(const std::string& path);
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  Tensor get(const std::string& name) const;
  // The file that holds `name`.
  const std::string& file_of(const std::string& name) const;
  const std::vector<SafeTensorsFile>& files() const { return files_; }

 private:
  std::vector<SafeTensorsFile> files_;
  std::map<std::string, size_t> where_;
  std::string description_;
};

// Writes `tensors` into `dir` as model.safetensors when they fit in `max_shard_bytes` (0 = no limit), otherwise as
// shards of at most max_shard_bytes each (a larger tensor gets a shard of its own) plus the index. Each file is
// written atomically, and stale shards of an earlier save in `dir` are removed. Returns the files written.
std::vector<std::string> save_checkpoint(const std::string& dir, const TensorMap& tensors, uint64_t max_shard_bytes = 0,
                                         const Metadata& metadata = {{"format", "pt"}});

}  // namespace trl

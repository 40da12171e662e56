// A read-only memory mapping of a whole file. Tensors that view a mapping keep it alive through a shared_ptr,
// so a checkpoint's weights are used in place, without a copy.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace trl {

class MappedFile {
 public:
  // Throws trl::Error naming the path when the file cannot be opened or mapped.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace trl

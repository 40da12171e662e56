// Where a Parquet file's bytes come from: a file read with pread (a page at a time), or memory (tests, fuzzing).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "trl/core/error.h"

namespace trl::parquet {

class Source {
 public:
  virtual ~Source() = default;
  virtual uint64_t size() const = 0;
  // Reads [offset, offset + n) into out (the caller checked the range against size()).
  virtual void read(uint64_t offset, size_t n, std::vector<uint8_t>& out) const = 0;
};

class FileSource : public Source {
 public:
  explicit FileSource(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail("{}: not a regular file", path);
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~FileSource() override { ::close(fd_); }
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, size_t n, std::vector<uint8_t>& out) const override {
    out.resize(n);
    size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, out.data() + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) fail("{}: read of {} bytes at offset {} failed: {}", path_, n, offset, got < 0 ? std::strerror(errno) : "the file is shorter than it was");
      done += static_cast<size_t>(got);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

class MemorySource : public Source {
 public:
  explicit MemorySource(std::string bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t offset, size_t n, std::vector<uint8_t>& out) const override {
    out.resize(n);
    if (n) std::memcpy(out.data(), bytes_.data() + offset, n);
  }

 private:
  std::string bytes_;
};

}  // namespace trl::parquet

#include "core/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "trl/core/error.h"

namespace trl {

void write_all(int fd, const void* data, size_t size, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("{}: write failed: {}", what, std::strerror(errno));
    }
    if (n == 0) fail("{}: write failed: wrote 0 of {} bytes", what, size);
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void write_file_atomic(const std::string& path, const std::function<void(int fd)>& write) {
  std::string tmp = path + ".tmp.XXXXXX";
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) fail("{}: cannot create a temporary file next to it: {}", path, std::strerror(errno));
  try {
    write(fd);
    if (::fsync(fd) != 0) fail("{}: fsync failed: {}", path, std::strerror(errno));
    if (::fchmod(fd, 0644) != 0) fail("{}: chmod failed: {}", path, std::strerror(errno));
    if (::close(fd) != 0) {
      fd = -1;
      fail("{}: close failed: {}", path, std::strerror(errno));
    }
    fd = -1;
    if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("{}: cannot rename the temporary file into place: {}", path, std::strerror(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    std::remove(tmp.c_str());
    throw;
  }
}

void write_text_file_atomic(const std::string& path, std::string_view text) {
  write_file_atomic(path, [&](int fd) { write_all(fd, text.data(), text.size(), path); });
}

void append_text_file(const std::string& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail("{}: cannot open for appending: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(err));
  }
  try {
    write_all(fd, text.data(), text.size(), path);
  } catch (...) {
    [[maybe_unused]] const bool cut = ::ftruncate(fd, st.st_size) == 0;  // reported: the write error, not this one
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) fail("{}: close failed: {}", path, std::strerror(errno));
}

bool is_disk_full_message(std::string_view message) {
  return message.find(std::strerror(ENOSPC)) != std::string_view::npos || message.find(std::strerror(EDQUOT)) != std::string_view::npos;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open for reading: {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("{}: read error", path);
  return ss.str();
}

}  // namespace trl

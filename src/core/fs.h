// File helpers. Every output file is written to a temporary name in the same directory and renamed into place,
// so a crash or an error never leaves a half-written file under the final name.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace trl {

// Calls `write(fd)` on a fresh temp file next to `path`, fsyncs, and renames it to `path`. On any error the temp
// file is removed and a trl::Error naming `path` is thrown.
void write_file_atomic(const std::string& path, const std::function<void(int fd)>& write);
void write_text_file_atomic(const std::string& path, std::string_view text);
// Writes all of `data` to `fd`; throws naming `what` on failure (a short write, as on a full disk, is an error).
void write_all(int fd, const void* data, size_t size, const std::string& what);
// Appends `text` to `path` (created if missing). On any error the file is cut back to its previous length, so a
// full disk never leaves a torn line, and a trl::Error naming `path` is thrown.
void append_text_file(const std::string& path, std::string_view text);
// Whether an error message reports a full disk or an exhausted quota (ENOSPC, EDQUOT).
bool is_disk_full_message(std::string_view message);
std::string read_text_file(const std::string& path);

}  // namespace trl

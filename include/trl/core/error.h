// Errors in trl.cpp are exceptions that carry a complete, user-facing message:
// what was wrong, where (file, tensor, field, line) and, when we know it, how to fix it.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace trl {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A model, dataset or file that a name does not resolve to (the Python package raises FileNotFoundError for it).
class NotFoundError : public Error {
 public:
  explicit NotFoundError(const std::string& message) : Error(message) {}
};

// A training configuration that its checks refuse before anything is loaded (the Python package raises ValueError
// for it, as TRL's configs do; the trl binary reports it as every other error).
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& message) : Error(message) {}
};

// throw trl::Error with a fmt-style message: fail("{}: tensor '{}' is missing", path, name)
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace trl

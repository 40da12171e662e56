// What the fuzz targets share: the bytes as a file in a scratch folder (the readers under test take paths, as the
// program does), and the rule every target enforces: reading ends in a result or a trl::Error, never another
// exception (a JSON or YAML library's own error, std::bad_alloc, std::out_of_range) or a crash.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

// A target's entry point: libFuzzer's, or under TRL_FUZZ_REGRESSION a function of its own name that
// fuzz/corpus_main.cpp calls on every file of the target's corpus (a CTest test per target in every build).
#ifdef TRL_FUZZ_REGRESSION
#define TRL_FUZZ_TARGET(name) int trl_fuzz_##name(const uint8_t* data, size_t size)
#else
#define TRL_FUZZ_TARGET(name) extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
#endif

namespace trl::fuzz {

// A folder of this process's own, made once (libFuzzer runs one input at a time per process).
inline const std::string& scratch() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::filesystem::path p = std::filesystem::path(base && *base ? base : "/tmp") / ("trl-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    return p.string();
  }();
  return dir;
}

// Writes `size` bytes to `path` (its folder made) and returns the path.
inline std::string write_to(const std::string& path, const uint8_t* data, size_t size) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

// Writes `size` bytes to scratch()/name and returns the path.
inline std::string write(const std::string& name, const uint8_t* data, size_t size) { return write_to(scratch() + "/" + name, data, size); }

inline std::string text(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }

}  // namespace trl::fuzz

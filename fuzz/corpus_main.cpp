// The fuzz targets as regression tests: every file of a target's corpus (the seeds and the findings kept there) runs
// through the target's own function, built with the program's compiler and, in the sanitizer build, its sanitizers.
// A target ends each input in a result or a trl::Error; anything else that escapes it fails the run here.
//   trl_fuzz_corpora TARGET DIR
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <typeinfo>
#include <vector>

#include "fuzz_util.h"

int trl_fuzz_parquet(const uint8_t*, size_t);
int trl_fuzz_safetensors(const uint8_t*, size_t);
int trl_fuzz_config(const uint8_t*, size_t);
int trl_fuzz_tokenizer(const uint8_t*, size_t);
int trl_fuzz_jinja(const uint8_t*, size_t);
int trl_fuzz_dataset(const uint8_t*, size_t);
int trl_fuzz_yaml(const uint8_t*, size_t);
int trl_fuzz_checkpoint(const uint8_t*, size_t);
int trl_fuzz_serve(const uint8_t*, size_t);

int main(int argc, char** argv) {
  const std::map<std::string, int (*)(const uint8_t*, size_t)> targets = {
      {"parquet", trl_fuzz_parquet}, {"safetensors", trl_fuzz_safetensors}, {"config", trl_fuzz_config},   {"tokenizer", trl_fuzz_tokenizer},
      {"jinja", trl_fuzz_jinja},     {"dataset", trl_fuzz_dataset},         {"yaml", trl_fuzz_yaml},       {"checkpoint", trl_fuzz_checkpoint}, {"serve", trl_fuzz_serve}};
  if (argc != 3 || !targets.count(argv[1])) {
    std::fprintf(stderr, "usage: trl_fuzz_corpora TARGET DIR (TARGET: parquet, safetensors, config, tokenizer, jinja, dataset, yaml, checkpoint, serve)\n");
    return 2;
  }
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(argv[2]))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  int failed = 0;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      targets.at(argv[1])(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s escaped the target: %s\n", f.string().c_str(), typeid(e).name(), e.what());
      ++failed;
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(trl::fuzz::scratch(), ec);
  std::printf("%s: %zu inputs, %d failed\n", argv[1], files.size(), failed);
  return failed == 0 && !files.empty() ? 0 : 1;
}

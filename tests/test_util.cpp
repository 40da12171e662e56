#include "test_util.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "trl/core/error.h"
#include "trl/models/init.h"
#include "trl/tokenizer/tokenizer.h"

namespace trl::test {

namespace {
CausalLM write_tiny(const TempDir& dir, int64_t vocab_size) {
  InitOptions o;
  o.preset = "tiny";
  o.vocab_size = vocab_size;
  o.seed = 3;
  o.initializer_range = 0.1;
  init_model(o, dir.file("model"));
  return CausalLM::from_pretrained(dir.file("model"));
}
}  // namespace

TinyModel::TinyModel(int64_t vocab_size) : model(write_tiny(dir, vocab_size)) {}

const Tokenizer& qwen3_tokenizer() {
  static const Tokenizer tok = [] {
    TempDir dir;
    write_tokenizer_files(dir.path());
    return Tokenizer::from_pretrained(dir.path());
  }();
  return tok;
}

const Tokenizer& cut_tokenizer() {
  static const Tokenizer tok = [] {
    TempDir dir;
    write_tokenizer_files(dir.path(), kCutVocab);
    return Tokenizer::from_pretrained(dir.path());
  }();
  return tok;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/trl-test-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

int run_command(const std::string& command, std::string* output) {
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string self_executable() {
  std::error_code ec;
  const std::string path = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) throw std::runtime_error("cannot read /proc/self/exe: " + ec.message());
  return path;
}

std::string mpirun_env() {
  std::string env = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 ";
  if (kSanitized)
    env += "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0 "
           "LSAN_OPTIONS=suppressions=" TRL_TEST_DATA_DIR "/sanitizers/openmpi-leaks.supp:print_suppressions=0 ";
  return env;
}

}  // namespace trl::test

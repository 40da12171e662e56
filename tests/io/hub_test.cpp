#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>

#include "trl/core/error.h"
#include "core/fs.h"
#include "trl/io/hub.h"
#include "trl/backend/registry.h"
#include "trl/runtime/runtime.h"
#include "test_util.h"

namespace trl {
namespace {

namespace fs = std::filesystem;

// Sets an environment variable for the scope of a test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) ::setenv(name_, old_.c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

void make_snapshot(const fs::path& cache, const std::string& repo, const std::string& commit, bool with_ref) {
  const fs::path base = cache / ("models--" + repo);
  fs::create_directories(base / "snapshots" / commit);
  write_text_file_atomic((base / "snapshots" / commit / "config.json").string(), "{}");
  if (with_ref) {
    fs::create_directories(base / "refs");
    write_text_file_atomic((base / "refs" / "main").string(), commit + "\n");
  }
}

TEST(Hub, LocalFolder) {
  test::TempDir dir;
  write_text_file_atomic(dir.file("config.json"), "{}");
  EXPECT_EQ(resolve_model_dir(dir.path()), dir.path());
  test::TempDir empty;
  EXPECT_THROW(resolve_model_dir(empty.path()), Error);  // no config.json
}

TEST(Hub, FindsIdInCacheThroughRefs) {
  test::TempDir cache;
  ScopedEnv env("HF_HUB_CACHE", cache.path());
  make_snapshot(cache.path(), "Qwen--Qwen3-0.6B", "aaa111", false);
  make_snapshot(cache.path(), "Qwen--Qwen3-0.6B", "bbb222", true);
  EXPECT_EQ(resolve_model_dir("Qwen/Qwen3-0.6B"), (fs::path(cache.path()) / "models--Qwen--Qwen3-0.6B" / "snapshots" / "bbb222").string());
  // A commit hash as the revision.
  EXPECT_EQ(resolve_model_dir("Qwen/Qwen3-0.6B", "aaa111"), (fs::path(cache.path()) / "models--Qwen--Qwen3-0.6B" / "snapshots" / "aaa111").string());
}

// An empty ref or one that leads out of the repository's snapshots is named, never followed (issue 37, defect 4).
TEST(Hub, ARefThatNamesNoSnapshotIsRefused) {
  test::TempDir cache;
  ScopedEnv env("HF_HUB_CACHE", cache.path());
  make_snapshot(cache.path(), "org--m", "aaa111", true);
  make_snapshot(cache.path(), "org--other", "bbb222", true);
  const std::string ref = (fs::path(cache.path()) / "models--org--m" / "refs" / "main").string();
  for (const std::string& bad : {std::string(""), std::string("../../models--org--other/snapshots/bbb222"), std::string("/tmp")}) {
    write_text_file_atomic(ref, bad + "\n");
    const std::string e = test::error_of([] { resolve_model_dir("org/m"); });
    EXPECT_NE(e.find(ref + ": this Hub-cache ref should hold the commit hash"), std::string::npos) << e;
  }
}

TEST(Hub, SingleSnapshotWithoutRef) {
  test::TempDir home;
  ScopedEnv a("HF_HUB_CACHE", home.path() + "/nothing-here");
  ScopedEnv b("HF_HOME", home.path());
  make_snapshot(fs::path(home.path()) / "hub", "org--m", "c0ffee", false);
  EXPECT_EQ(resolve_model_dir("org/m"), (fs::path(home.path()) / "hub" / "models--org--m" / "snapshots" / "c0ffee").string());
}

TEST(Hub, NotFoundListsWhereItLooked) {
  test::TempDir cache;
  ScopedEnv env("HF_HUB_CACHE", cache.path());
  try {
    resolve_model_dir("Qwen/Qwen3-0.6B");
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(cache.path() + "/models--Qwen--Qwen3-0.6B/snapshots/main"), std::string::npos) << msg;
    EXPECT_NE(msg.find("never downloads"), std::string::npos) << msg;
  }
}

TEST(Runtime, CoreLists) {
  EXPECT_EQ(parse_core_list("0-3", 8), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(parse_core_list("0,1", 8), (std::vector<int>{0, 1}));
  EXPECT_EQ(parse_core_list("2,4-5", 8), (std::vector<int>{2, 4, 5}));
  // format_core_list writes the shortest list, which parses back to the same cores.
  EXPECT_EQ(format_core_list({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
  EXPECT_EQ(format_core_list({3}), "3");
  EXPECT_EQ(format_core_list({}), "");
  EXPECT_EQ(parse_core_list(format_core_list({0, 2, 3, 4, 6}), 8), (std::vector<int>{0, 2, 3, 4, 6}));
  for (const char* bad : {"", "a", "3-1", "0,,1", "0-", "9", "1,1", "-1"}) {
    EXPECT_THROW(parse_core_list(bad, 8), Error) << bad;
  }
  try {
    parse_core_list("0-9", 4);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("core 4 does not exist"), std::string::npos) << e.what();
  }
  EXPECT_EQ(resolve_device("auto"), "cpu");
  EXPECT_THROW(resolve_device("neuron"), Error);
}

}  // namespace
}  // namespace trl

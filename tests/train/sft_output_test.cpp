// SFT output folder: atomic checkpoint and final saves on a full disk, the last step's checkpoint, log.jsonl equal
// to trainer_state.json's log_history across runs and resumes, config validation, and the HTML report.
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "trl/core/error.h"
#include "core/fs.h"
#include "trl/io/safetensors.h"
#include "trl/models/init.h"
#include "test_util.h"
#include "trl/tokenizer/tokenizer.h"
#include "trl/train/sft_trainer.h"

namespace trl {
namespace {

namespace stdfs = std::filesystem;
using ojson = nlohmann::ordered_json;

Dataset text_rows() {
  Dataset d;
  const char* texts[] = {"a", "the cat sat on the mat", "one two", "a much longer sentence with quite a few more tokens in it", "x y z",
                         "hello there", "short", "what is this"};
  for (const char* t : texts) {
    d.rows.push_back(ojson{{"text", t}});
    d.where.push_back("words.jsonl:" + std::to_string(d.rows.size()));
  }
  return d;
}


SFTConfig small_config(const std::string& out) {
  SFTConfig c;
  c.output_dir = out;
  c.bf16 = false;
  c.learning_rate = 1e-3;
  c.per_device_train_batch_size = 4;
  c.logging_steps = 1;
  c.save_steps = 1000;
  c.report = false;
  c.progress = false;
  return c;
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : stdfs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

std::set<std::string> checkpoint_folders(const std::string& dir) {
  std::set<std::string> out;
  for (const std::string& n : names_in(dir))
    if (n.rfind("checkpoint-", 0) == 0) out.insert(n);
  return out;
}

// Every path under `dir` whose name contains ".tmp" (a save's temp folder or file left behind).
std::vector<std::string> temp_leftovers(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : stdfs::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(".tmp") != std::string::npos) out.push_back(e.path().string());
  return out;
}

std::vector<ojson> jsonl_lines(const std::string& path) {
  std::vector<ojson> out;
  std::istringstream in(read_text_file(path));
  for (std::string line; std::getline(in, line);) out.push_back(ojson::parse(line));
  return out;
}

std::vector<ojson> state_log_history(const std::string& path) {
  const ojson state = ojson::parse(read_text_file(path));
  std::vector<ojson> out;
  for (const auto& e : state.at("log_history")) out.push_back(e);
  return out;
}

// A complete checkpoint: every file a resume and a from_pretrained need, loadable, at `step`.
void expect_complete_checkpoint(const std::string& dir, int64_t step) {
  ASSERT_TRUE(stdfs::is_directory(dir)) << dir;
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "optimizer.safetensors", "scheduler.json",
                        "trainer_state.json"})
    EXPECT_TRUE(stdfs::is_regular_file(stdfs::path(dir) / f)) << dir << " has no " << f;
  EXPECT_EQ(ojson::parse(read_text_file(dir + "/trainer_state.json")).at("global_step").get<int64_t>(), step) << dir;
  EXPECT_NO_THROW(SafeTensorsFile::open(dir + "/optimizer.safetensors")) << dir;
  EXPECT_NO_THROW(CausalLM::from_pretrained(dir)) << dir;
}

// A tmpfs mounted on `dir` for the object's lifetime (mount(2) needs root), resizable in place to make the disk
// full at a chosen moment. `skip` says why there is none.
class SmallDisk {
 public:
  explicit SmallDisk(std::string dir) : dir_(std::move(dir)) {
    if (::geteuid() != 0) {
      skip = "mounting a tmpfs needs root";
      return;
    }
    stdfs::create_directories(dir_);
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, "size=1g") != 0) {
      if (errno == EPERM) skip = std::string("mount(tmpfs) is not permitted here: ") + std::strerror(errno);
      else error = std::string("mount(tmpfs) on ") + dir_ + ": " + std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  ~SmallDisk() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;
  uint64_t used() const {
    struct statvfs v {};
    ::statvfs(dir_.c_str(), &v);
    return static_cast<uint64_t>(v.f_blocks - v.f_bfree) * v.f_frsize;
  }
  // From now on only `bytes` more fit.
  void leave_free(uint64_t bytes) {
    const std::string opt = "size=" + std::to_string(used() + bytes);
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", MS_REMOUNT, opt.c_str()) != 0) ADD_FAILURE() << "remount " << opt << ": " << std::strerror(errno);
  }
  std::string skip, error;

 private:
  std::string dir_;
  bool mounted_ = false;
};

// Trains `tr` on a disk that fills up: the error it must throw (printed, so a run shows the message users get).
std::string train_expecting_failure(SFTTrainer& tr) {
  std::string message;
  try {
    tr.train();
    ADD_FAILURE() << "training on a full disk did not fail";
  } catch (const Error& e) {
    message = e.what();
  }
  std::printf("[ message  ] %s\n", message.c_str());
  return message;
}

// The disk fills up while checkpoint-2 is written: the error says so, checkpoint-2.tmp is gone, checkpoint-1 is
// intact, and nothing of a final model was written.
TEST(SFTSaving, FailedCheckpointSaveRemovesItsPartialFolder) {
  test::TinyModel t;
  SmallDisk disk(t.dir.file("disk"));
  if (!disk.skip.empty()) GTEST_SKIP() << disk.skip;
  ASSERT_TRUE(disk.error.empty()) << disk.error;
  const Tokenizer& tok = test::qwen3_tokenizer();
  SFTConfig c = small_config(t.dir.file("disk/out"));
  c.max_steps = 3;
  c.save_steps = 1;
  SFTTrainer tr(t.model, tok, text_rows(), c);
  int steps = 0;
  tr.on_step = [&](const ojson&) {
    if (++steps == 2) disk.leave_free(20 << 20);  // room for a few files of checkpoint-2, not its 39 MB of weights
  };
  const std::string message = train_expecting_failure(tr);
  EXPECT_NE(message.find("saving checkpoint-2 failed"), std::string::npos) << message;
  EXPECT_NE(message.find(std::strerror(ENOSPC)), std::string::npos) << message;
  EXPECT_NE(message.find("removed the partial folder"), std::string::npos) << message;
  EXPECT_NE(message.find("checkpoint-1"), std::string::npos) << message;  // where to resume from
  EXPECT_EQ(temp_leftovers(c.output_dir), std::vector<std::string>{});
  EXPECT_EQ(checkpoint_folders(c.output_dir), (std::set<std::string>{"checkpoint-1"}));
  expect_complete_checkpoint(c.output_dir + "/checkpoint-1", 1);
  EXPECT_FALSE(stdfs::exists(c.output_dir + "/model.safetensors"));
}

// The disk fills up during the final save, after the weights were written: output_dir keeps what it had before
// (here a config.json of an earlier run), holds no new model file and no temp folder, and the last checkpoint
// stays for a resume.
TEST(SFTSaving, FailedFinalSaveLeavesOutputDirUnchanged) {
  test::TinyModel t;
  SmallDisk disk(t.dir.file("disk"));
  if (!disk.skip.empty()) GTEST_SKIP() << disk.skip;
  ASSERT_TRUE(disk.error.empty()) << disk.error;
  const Tokenizer& tok = test::qwen3_tokenizer();
  SFTConfig c = small_config(t.dir.file("disk/out"));
  c.max_steps = 3;
  c.save_steps = 2;
  c.report = true;
  stdfs::create_directories(c.output_dir);
  const std::string earlier = "{\"from\": \"an earlier run\"}\n";
  test::write_file(c.output_dir + "/config.json", earlier);
  const uint64_t weights = stdfs::file_size(t.dir.file("model/model.safetensors"));
  SFTTrainer tr(t.model, tok, text_rows(), c);
  int steps = 0;
  tr.on_step = [&](const ojson&) {
    if (++steps == 3) disk.leave_free(weights + (1 << 20));  // the weights and config fit, the 11 MB tokenizer.json not
  };
  const std::string message = train_expecting_failure(tr);
  EXPECT_NE(message.find("saving the final model"), std::string::npos) << message;
  EXPECT_NE(message.find(std::strerror(ENOSPC)), std::string::npos) << message;
  EXPECT_NE(message.find("removed the partial folder"), std::string::npos) << message;
  EXPECT_NE(message.find("checkpoint-2"), std::string::npos) << message;
  EXPECT_EQ(temp_leftovers(c.output_dir), std::vector<std::string>{});
  EXPECT_EQ(read_text_file(c.output_dir + "/config.json"), earlier);
  for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json", "trainer_state.json", "training_report.html"})
    EXPECT_FALSE(stdfs::exists(stdfs::path(c.output_dir) / f)) << f << " of a half-written final save";
  EXPECT_EQ(checkpoint_folders(c.output_dir), (std::set<std::string>{"checkpoint-2"}));
  expect_complete_checkpoint(c.output_dir + "/checkpoint-2", 2);
}

// save_checkpoint into a folder that holds earlier weights: when the disk fills up during the new save, the earlier
// weights are still there and load (they are replaced only once every new file is written); a save that fits
// replaces them and leaves no file of the old layout.
TEST(SFTSaving, FailedWeightSaveKeepsTheEarlierWeights) {
  test::TempDir dir;
  SmallDisk disk(dir.file("disk"));
  if (!disk.skip.empty()) GTEST_SKIP() << disk.skip;
  ASSERT_TRUE(disk.error.empty()) << disk.error;
  const std::string out = dir.file("disk/m");
  const std::vector<float> before(1000, 1.5f), after(4 << 20, -2.0f);  // 4 KB, then 16 MB
  save_checkpoint(out, {{"w", Tensor::from_f32(before, {1000})}});
  const TensorMap big{{"w", Tensor::from_f32(after, {4, 1 << 20})}, {"v", Tensor::from_f32(after, {4, 1 << 20})}};
  disk.leave_free(1 << 20);
  EXPECT_THROW(save_checkpoint(out, big, 8 << 20), Error);  // two 16 MB shards; the first does not fit
  EXPECT_EQ(names_in(out), (std::set<std::string>{"model.safetensors"}));
  EXPECT_EQ(Checkpoint::open(out).get("w").to_f32_vector(), before);
  disk.leave_free(64 << 20);
  save_checkpoint(out, big, 8 << 20);
  EXPECT_EQ(names_in(out), (std::set<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"}));
  EXPECT_EQ(Checkpoint::open(out).get("w").to_f32_vector(), after);
}

// As in Transformers, the last step is checkpointed when it is a multiple of save_steps.
TEST(SFTSaving, LastStepIsCheckpointedWhenAMultipleOfSaveSteps) {
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  SFTConfig c = small_config(t.dir.file("five"));
  c.max_steps = 5;
  c.save_steps = 1;
  SFTTrainer(t.model, tok, text_rows(), c).train();
  EXPECT_EQ(checkpoint_folders(c.output_dir), (std::set<std::string>{"checkpoint-1", "checkpoint-2", "checkpoint-3", "checkpoint-4", "checkpoint-5"}));
  expect_complete_checkpoint(c.output_dir + "/checkpoint-5", 5);
  c.output_dir = t.dir.file("four");
  c.max_steps = 4;
  c.save_steps = 2;
  SFTTrainer(t.model, tok, text_rows(), c).train();
  EXPECT_EQ(checkpoint_folders(c.output_dir), (std::set<std::string>{"checkpoint-2", "checkpoint-4"}));
  c.output_dir = t.dir.file("three");
  c.max_steps = 3;  // not a multiple: no checkpoint-3
  SFTTrainer(t.model, tok, text_rows(), c).train();
  EXPECT_EQ(checkpoint_folders(c.output_dir), (std::set<std::string>{"checkpoint-2"}));
}

// A bf16 model trained in bf16 is saved as its masters rounded to bf16 (the compute copies, written by AdamW from
// the masters, are saved as they are): bit for bit what converting the masters gives.
TEST(SFTSaving, Bf16ModelSavesItsMastersRoundedToBf16) {
  test::TempDir dir;
  InitOptions o;
  o.preset = "tiny";
  o.dtype = DType::BF16;
  o.seed = 5;
  const CausalLM model = init_model(o, dir.file("m"));
  SFTConfig c = small_config(dir.file("o"));
  c.bf16 = true;
  c.max_steps = 2;
  c.learning_rate = 1e-2;
  SFTTrainer tr(model, test::qwen3_tokenizer(), text_rows(), c);
  tr.train();
  const CausalLM saved = CausalLM::from_pretrained(dir.file("o"));
  size_t moved = 0;
  for (const auto& [name, w] : tr.master_weights()) {
    const Tensor want = w.to(DType::BF16), got = saved.weights().at(name);
    ASSERT_EQ(got.dtype(), DType::BF16) << name;
    ASSERT_EQ(got.nbytes(), want.nbytes()) << name;
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0) << name;
    moved += std::memcmp(got.data(), model.weights().at(name).data(), want.nbytes()) != 0;
  }
  EXPECT_GT(moved, 0u);  // the steps changed the weights
}

void expect_log_matches_state(const std::string& out, size_t expected_entries) {
  const std::vector<ojson> lines = jsonl_lines(out + "/log.jsonl"), history = state_log_history(out + "/trainer_state.json");
  EXPECT_EQ(history.size(), expected_entries);
  ASSERT_EQ(lines.size(), history.size());
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i], history[i]) << "entry " << i;
}

// A second run in the same output_dir starts a new log.jsonl instead of appending to the first run's.
TEST(SFTLog, FreshRunStartsANewLog) {
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  SFTConfig c = small_config(t.dir.file("out"));
  c.max_steps = 3;
  SFTTrainer(t.model, tok, text_rows(), c).train();
  expect_log_matches_state(c.output_dir, 3);
  c.max_steps = 2;
  SFTTrainer(t.model, tok, text_rows(), c).train();
  expect_log_matches_state(c.output_dir, 2);
}

// A rerun that fails before its first entry leaves the earlier run's files as they were; one that fails after it
// has taken them over (no earlier trainer_state.json beside its log), so log.jsonl equals the trainer_state.json
// beside it whenever there is one (issue 37, defect 6).
TEST(SFTLog, AFailedRerunLeavesNoLogThatDisagreesWithItsState) {
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  SFTConfig c = small_config(t.dir.file("out"));
  c.max_steps = 3;
  SFTTrainer(t.model, tok, text_rows(), c).train();
  expect_log_matches_state(c.output_dir, 3);
  for (const int64_t failing_step : {1, 2}) {
    SFTTrainer tr(t.model, tok, text_rows(), c);
    int64_t step = 0;
    tr.on_step = [&](const ojson&) {
      if (++step == failing_step) throw Error("a failure in step " + std::to_string(step));
    };
    EXPECT_THROW(tr.train(), Error);
    if (failing_step == 1) {
      expect_log_matches_state(c.output_dir, 3);  // untouched
    } else {
      EXPECT_FALSE(std::filesystem::exists(c.output_dir + "/trainer_state.json"));
      EXPECT_EQ(jsonl_lines(c.output_dir + "/log.jsonl").size(), 1u);  // the failed run's step 1
    }
  }
  SFTTrainer(t.model, tok, text_rows(), c).train();
  expect_log_matches_state(c.output_dir, 3);
}

// After a 6-step run (evaluated every 3 steps), resuming from checkpoint-2 keeps the log entries of steps 1-2 and
// logs steps 3-6 again: log.jsonl holds no entry of the abandoned steps.
TEST(SFTLog, ResumeKeepsTheCheckpointsEntriesOnly) {
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  SFTConfig c = small_config(t.dir.file("out"));
  c.max_steps = 6;
  c.save_steps = 2;
  c.eval_strategy = "steps";
  c.eval_steps = 3;
  SFTTrainer(t.model, tok, text_rows(), c, text_rows()).train();
  expect_log_matches_state(c.output_dir, 6 + 2);
  c.resume_from_checkpoint = c.output_dir + "/checkpoint-2";
  SFTTrainer(t.model, tok, text_rows(), c, text_rows()).train();
  expect_log_matches_state(c.output_dir, 6 + 2);
  std::vector<int64_t> steps;
  for (const ojson& e : jsonl_lines(c.output_dir + "/log.jsonl")) steps.push_back(e.at("step").get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 3, 4, 5, 6, 6}));  // train entries, with an eval entry after steps 3 and 6
}

// Each bad value is rejected when the trainer is constructed, naming the option and the value.
TEST(SFTConfigValidation, RejectsEachKindOfBadValue) {
  test::TinyModel t;
  const Tokenizer& tok = test::qwen3_tokenizer();
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    std::function<void(SFTConfig&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[&](SFTConfig& c) { c.learning_rate = inf; }, "learning_rate must be a finite number >= 0, got inf"},
      {[&](SFTConfig& c) { c.learning_rate = nan; }, "learning_rate must be a finite number >= 0, got nan"},
      {[&](SFTConfig& c) { c.learning_rate = -1e-5; }, "learning_rate must be a finite number >= 0, got -1e-05"},
      {[&](SFTConfig& c) { c.adam_beta1 = 1.5; }, "adam_beta1 must be in [0, 1), got 1.5"},
      {[&](SFTConfig& c) { c.adam_beta1 = -0.1; }, "adam_beta1 must be in [0, 1), got -0.1"},
      {[&](SFTConfig& c) { c.adam_beta2 = 1; }, "adam_beta2 must be in [0, 1), got 1"},
      {[&](SFTConfig& c) { c.adam_beta2 = nan; }, "adam_beta2 must be in [0, 1), got nan"},
      {[&](SFTConfig& c) { c.weight_decay = -3; }, "weight_decay must be a finite number >= 0, got -3"},
      {[&](SFTConfig& c) { c.weight_decay = inf; }, "weight_decay must be a finite number >= 0, got inf"},
      {[&](SFTConfig& c) { c.adam_epsilon = 0; }, "adam_epsilon must be a finite number > 0, got 0"},
      {[&](SFTConfig& c) { c.adam_epsilon = inf; }, "adam_epsilon must be a finite number > 0, got inf"},
      {[&](SFTConfig& c) { c.max_grad_norm = nan; }, "max_grad_norm must be a finite number >= 0, got nan"},
      {[&](SFTConfig& c) { c.max_grad_norm = -1; }, "max_grad_norm must be a finite number >= 0, got -1"},
      {[&](SFTConfig& c) { c.warmup_ratio = 1.5; }, "warmup_ratio must be in [0, 1], got 1.5"},
      {[&](SFTConfig& c) { c.num_train_epochs = inf; }, "num_train_epochs must be a finite number > 0, got inf"},
      {[&](SFTConfig& c) { c.num_train_epochs = 0; }, "num_train_epochs must be a finite number > 0, got 0"},
      {[&](SFTConfig& c) { c.seed = static_cast<uint64_t>(-1); }, "seed must be in [0, 4294967295], got 18446744073709551615"},
      {[&](SFTConfig& c) { c.eos_token = "<notatoken>"; }, "eos_token '<notatoken>' is not a single token"},
  };
  for (const Case& k : cases) {
    SFTConfig c = small_config(t.dir.file("out"));
    k.set(c);
    try {
      SFTTrainer tr(t.model, tok, text_rows(), c);
      ADD_FAILURE() << "accepted: expected \"" << k.message << "\"";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("SFTConfig: " + k.message), std::string::npos) << e.what();
    }
  }
  // The edges of each range, and a real eos token, are accepted.
  SFTConfig ok = small_config(t.dir.file("out"));
  ok.learning_rate = 0, ok.adam_beta1 = 0, ok.adam_beta2 = 0.999999, ok.weight_decay = 0, ok.adam_epsilon = 1e-30, ok.max_grad_norm = 0;
  ok.warmup_ratio = 1, ok.seed = 4294967295ull, ok.eos_token = "<|endoftext|>";
  EXPECT_NO_THROW(SFTTrainer(t.model, tok, text_rows(), ok));
}

// training_report.html has a run summary; without evaluation it shows no evaluation legend; charts name their axes.
TEST(SFTReport, SummaryAxesAndOnlyLegendsWithData) {
  test::TinyModel t;
  const Tokenizer& tok = test::qwen3_tokenizer();
  SFTConfig c = small_config(t.dir.file("out"));
  c.max_steps = 3;
  c.report = true;
  const TrainOutput out = SFTTrainer(t.model, tok, text_rows(), c).train();
  const std::string html = read_text_file(c.output_dir + "/training_report.html");
  for (const std::string& s : {std::string("Run summary"), t.dir.file("model"), std::string("words.jsonl"), std::string("3 / 3"),
                               std::string("loss (nats/token)"), std::string(">step<"), std::string(">learning rate<"), std::string(">gradient norm<"),
                               std::string(">accuracy<"), fmt::format("<th>programs compiled</th><td>{} ", out.programs.compilations)})
    EXPECT_NE(html.find(s), std::string::npos) << "no '" << s << "' in the report";
  EXPECT_EQ(html.find("evaluation"), std::string::npos) << "an evaluation legend without evaluation";
  EXPECT_EQ(html.find("eval loss"), std::string::npos);
  // With evaluation: its legend and the best/last eval loss in the summary.
  c.output_dir = t.dir.file("eval");
  c.eval_strategy = "steps";
  c.eval_steps = 1;
  c.model_name_or_path = "Qwen/Qwen3-tiny-test";
  c.dataset_name = "my/words";
  SFTTrainer(t.model, tok, text_rows(), c, text_rows()).train();
  const std::string ev = read_text_file(c.output_dir + "/training_report.html");
  for (const char* s : {"evaluation loss", "best eval loss", "last eval loss", "Qwen/Qwen3-tiny-test", "my/words"})
    EXPECT_NE(ev.find(s), std::string::npos) << "no '" << s << "' in the report with evaluation";
}

}  // namespace
}  // namespace trl

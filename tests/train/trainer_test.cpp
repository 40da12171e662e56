// The Trainer's own checks: a run that cannot fit in memory is refused before its first step, with the figures and
// the options that would make it fit; the check compiles the largest program without allocating its arena.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "trl/core/error.h"
#include "trl/train/dpo_trainer.h"
#include "trl/train/sft_trainer.h"

namespace trl {
namespace {

using ojson = nlohmann::ordered_json;

// Sets an environment variable for the scope of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

Dataset texts(int n) {
  Dataset d;
  for (int i = 0; i < n; ++i) {
    d.rows.push_back(ojson{{"text", "row " + std::to_string(i) + " of a small language modelling dataset"}});
    d.where.push_back("texts.jsonl:" + std::to_string(i + 1));
  }
  return d;
}

// Transformers' schedules at points where their formulas have closed forms: 10 steps, 2 of warm-up, base 1.
TEST(TrainerSchedule, CosineWithMinLrAndNumCyclesAsTransformers) {
  EXPECT_DOUBLE_EQ(scheduled_lr("cosine_with_min_lr", 1, 1, 10, 2, 0.1), 0.5);   // warm-up: step / warmup
  EXPECT_DOUBLE_EQ(scheduled_lr("cosine_with_min_lr", 1, 2, 10, 2, 0.1), 1.0);   // progress 0
  EXPECT_DOUBLE_EQ(scheduled_lr("cosine_with_min_lr", 1, 6, 10, 2, 0.1), 0.55);  // progress 1/2: (1 + 0.1) / 2
  EXPECT_DOUBLE_EQ(scheduled_lr("cosine_with_min_lr", 1, 10, 10, 2, 0.1), 0.1);  // the end: min_lr_rate
  EXPECT_NEAR(scheduled_lr("cosine", 1, 6, 10, 2), 0.5, 1e-15);                    // plain cosine: the same with rate 0
  EXPECT_NEAR(scheduled_lr("cosine", 1, 6, 10, 2, 0, 1.0), 0.0, 1e-15);            // num_cycles 1: a full wave down at the middle
  EXPECT_NEAR(scheduled_lr("cosine", 1, 10, 10, 2, 0, 1.0), 1.0, 1e-15);           // ... and up again at the end
  TrainingArguments a;
  a.learning_rate = 2e-4;
  a.lr_scheduler_type = "cosine_with_min_lr";
  a.lr_scheduler_kwargs = {{"min_lr", 2e-5}};
  EXPECT_NEAR(scheduler_rates(a).first, 0.1, 1e-15);  // min_lr / learning_rate
  check_training_arguments(a, "TrainingArguments");
  for (const auto& [kwargs, want] : std::vector<std::pair<nlohmann::ordered_json, std::string>>{
           {nlohmann::ordered_json::object(), "takes exactly one of min_lr and min_lr_rate"},
           {{{"min_lr", 1e-5}, {"min_lr_rate", 0.1}}, "takes exactly one of min_lr and min_lr_rate"},
           {{{"min_lr_rate", -1}}, "'min_lr_rate' must be a number >= 0"},
           {{{"warmup_lr_rate", 0.1}}, "'warmup_lr_rate' is not an argument of the cosine_with_min_lr schedule"}}) {
    a.lr_scheduler_kwargs = kwargs;
    EXPECT_NE(test::error_of([&] { check_training_arguments(a, "TrainingArguments"); }).find(want), std::string::npos) << kwargs.dump();
  }
  a.lr_scheduler_type = "linear";
  a.lr_scheduler_kwargs = {{"num_cycles", 1}};
  EXPECT_NE(test::error_of([&] { check_training_arguments(a, "TrainingArguments"); }).find("not an argument of the linear schedule"), std::string::npos);
  a.lr_scheduler_kwargs = nlohmann::ordered_json::object();
  a.optim = "paged_adamw_8bit";
  EXPECT_NE(test::error_of([&] { check_training_arguments(a, "TrainingArguments"); }).find("optim 'paged_adamw_8bit' is not available"), std::string::npos);
  a.optim = "adamw_torch_fused";
  check_training_arguments(a, "TrainingArguments");
}

TEST(TrainerMemory, ARunThatCannotFitIsRefusedWithTheFigures) {
  test::TinyModel t;
  const Tokenizer& tok = test::qwen3_tokenizer();
  SFTConfig c;
  c.output_dir = t.dir.file("o");
  c.max_steps = 1;
  c.per_device_train_batch_size = 4;
  c.gradient_accumulation_steps = 2;
  c.progress = false;
  c.report = false;
  {
    const ScopedEnv limit("TRL_MEMORY_LIMIT", "20MB");  // the tiny model's masters alone are ~40 MB
    SFTTrainer tr(t.model, tok, texts(8), c);
    try {
      tr.train();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string m = e.what();
      for (const char* want : {"SFT: this run does not fit in memory", "AdamW moments", "gradient accumulation", "largest program's working memory",
                               "(4 × ", "20 MB is available (TRL_MEMORY_LIMIT)", "--gradient_checkpointing", "--per_device_train_batch_size",
                               "--gradient_accumulation_steps"})
        EXPECT_NE(m.find(want), std::string::npos) << want << " in: " << m;
    }
    EXPECT_FALSE(std::filesystem::exists(t.dir.file("o/log.jsonl")));  // refused before the first step
  }
  {
    const ScopedEnv limit("TRL_MEMORY_LIMIT", "100GB");
    SFTTrainer tr(t.model, tok, texts(8), c);
    const TrainOutput o = tr.train();
    EXPECT_EQ(o.global_step, 1);
    EXPECT_EQ(o.programs.compilations, 1);  // the check's own compile is not one of the run's programs
  }
}

// The bytes in "needs 123 MB more" of a refusal (as format_bytes writes them).
uint64_t needed_bytes(const std::string& message) {
  const size_t at = message.find("needs ");
  if (at == std::string::npos) return 0;
  std::istringstream in(message.substr(at + 6));
  double value = 0;
  std::string unit;
  in >> value >> unit;
  return static_cast<uint64_t>(value * (unit == "GB" ? 1e9 : unit == "MB" ? 1e6 : 1e3));
}

// What a 1-step SFT run of micro-batches of `batch` rows needs beyond what it holds (from the refusal under a
// tiny limit).
uint64_t needed_for(const test::TinyModel& t, const Dataset& data, SFTConfig c, int64_t batch) {
  const ScopedEnv limit("TRL_MEMORY_LIMIT", "1KB");
  c.per_device_train_batch_size = batch;
  c.auto_find_batch_size = false;
  SFTTrainer tr(t.model, test::qwen3_tokenizer(), data, c);
  try {
    tr.train();
  } catch (const Error& e) {
    return needed_bytes(e.what());
  }
  return 0;
}

// auto_find_batch_size: under a limit between what 1 row and 16 rows need, the run trains with the largest batch
// that fits (one more row would not), found from the plans before the first step; without it the run is refused.
TEST(TrainerMemory, AutoFindBatchSizePicksTheLargestBatchThatFits) {
  test::TinyModel t;
  Dataset data;
  for (int i = 0; i < 32; ++i) {
    std::string text = "row " + std::to_string(i) + ":";
    for (int k = 0; k < 40; ++k) text += " word" + std::to_string((i * 7 + k) % 50);
    data.rows.push_back(ojson{{"text", text}});
    data.where.push_back("long.jsonl:" + std::to_string(i + 1));
  }
  SFTConfig c;
  c.output_dir = t.dir.file("auto");
  c.max_steps = 1;
  c.progress = false;
  c.report = false;
  const uint64_t one = needed_for(t, data, c, 1), sixteen = needed_for(t, data, c, 16);
  ASSERT_GT(one, 0u);
  ASSERT_GT(sixteen, one + 4'000'000) << "the arena should grow with the batch";
  const std::string limit = std::to_string((one + sixteen) / 2 / 1000) + "KB";
  const ScopedEnv env("TRL_MEMORY_LIMIT", limit.c_str());
  c.per_device_train_batch_size = 16;
  EXPECT_THROW(SFTTrainer(t.model, test::qwen3_tokenizer(), data, c).train(), Error);
  c.auto_find_batch_size = true;
  SFTTrainer tr(t.model, test::qwen3_tokenizer(), data, c);
  EXPECT_EQ(tr.train().global_step, 1);
  const ojson state = ojson::parse(test::read_file(t.dir.file("auto/trainer_state.json")));
  const int64_t found = state["train_batch_size"].get<int64_t>();
  EXPECT_GE(found, 1);
  EXPECT_LT(found, 16);
  SFTConfig more = c;
  more.auto_find_batch_size = false;
  more.output_dir = t.dir.file("more");
  more.per_device_train_batch_size = found + 1;
  EXPECT_THROW(SFTTrainer(t.model, test::qwen3_tokenizer(), data, more).train(), Error) << found + 1 << " rows should not fit in " << limit;
  // When not even one row fits, the refusal gives one row's figures.
  const ScopedEnv tiny("TRL_MEMORY_LIMIT", "1KB");
  SFTConfig none = c;
  none.output_dir = t.dir.file("none");
  try {
    SFTTrainer(t.model, test::qwen3_tokenizer(), data, none).train();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(1 × 128 tokens)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trl

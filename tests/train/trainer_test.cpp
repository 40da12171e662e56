// The Trainer's own checks: a run that cannot fit in memory is refused before its first step, with the figures and
// the options that would make it fit; the check compiles the largest program without allocating its arena.
#include <gtest/gtest.h>

#include <cstdlib>
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

}  // namespace
}  // namespace trl

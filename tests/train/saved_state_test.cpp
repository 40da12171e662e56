// A checkpoint's trainer_state.json as a resume reads it (src/train/saved_state.h): every field the run continues
// from is checked before any tensor is loaded, so a damaged file is named with its field instead of failing after
// training with the JSON library's words (issue 37's sweep: log_history entries whose loss or step were text).
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train/saved_state.h"

namespace trl {
namespace {

using ojson = nlohmann::ordered_json;

const ojson kState = ojson::parse(R"({"global_step": 2, "log_history": [{"loss": 1.5, "step": 1}, {"loss": 1.25, "step": 2}],
  "trl_cpp": {"optimizer_steps": 2, "num_tokens": 40, "per_device_train_batch_size": 2, "data_parallel_size": 1}})");

std::string read_error(const ojson& state) {
  test::TempDir dir;
  test::write_file(dir.file("trainer_state.json"), state.dump());
  return test::error_of([&] { (void)read_trainer_state(dir.file("trainer_state.json")); });
}

TEST(SavedState, ReadsTheProgressAndNamesEveryDamagedField) {
  test::TempDir dir;
  test::write_file(dir.file("trainer_state.json"), kState.dump());
  const SavedTrainerState s = read_trainer_state(dir.file("trainer_state.json"));
  EXPECT_EQ(s.global_step, 2);
  EXPECT_EQ(s.optimizer_steps, 2);
  EXPECT_EQ(s.num_tokens, 40);
  EXPECT_EQ(s.log_history.size(), 2u);
  EXPECT_EQ(s.per_device_train_batch_size, 2);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"/log_history/0/loss", "log_history[0]: 'loss' must be a number, got a list"},
      {"/log_history/1/step", "log_history[1]: field 'step' must be a whole number, got \"x\" (a string)"},
      {"/global_step", "field 'global_step' must be a whole number"},
      {"/trl_cpp/num_tokens", "trl_cpp: field 'num_tokens' must be a whole number"},
      {"/trl_cpp/per_device_train_batch_size", "trl_cpp: field 'per_device_train_batch_size' must be a whole number"},
  };
  for (const auto& [pointer, want] : bad) {
    ojson state = kState;
    state[ojson::json_pointer(pointer)] = pointer == "/log_history/0/loss" ? ojson::array({1}) : ojson("x");
    const std::string e = read_error(state);
    EXPECT_NE(e.find(want), std::string::npos) << pointer << " -> " << e;
    EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;
  }
  ojson negative = kState;
  negative["trl_cpp"]["data_parallel_size"] = 0;
  EXPECT_NE(read_error(negative).find("must be >= 1"), std::string::npos);
}

}  // namespace
}  // namespace trl

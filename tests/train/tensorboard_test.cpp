// TensorBoard event files (src/train/tensorboard.h): the checksum against its published test vectors, the tags as
// Transformers' TensorBoardCallback names them, and a file that TensorBoard's own reader parsed
// (tests/reference/tensorboard_events.py; its output is committed beside the file).
#include "train/tensorboard.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace trl {
namespace {

const std::string kData = std::string(TRL_TEST_DATA_DIR) + "/tensorboard/";

TEST(TensorBoard, Crc32cMatchesKnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC catalogue's check value for CRC-32C
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720, B.4
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(TensorBoard, TagsFollowTransformersRewriteLogs) {
  EXPECT_EQ(tensorboard_tag("loss"), "train/loss");
  EXPECT_EQ(tensorboard_tag("learning_rate"), "train/learning_rate");
  EXPECT_EQ(tensorboard_tag("eval_loss"), "eval/loss");
  EXPECT_EQ(tensorboard_tag("eval_rewards/accuracies"), "eval/rewards/accuracies");
  EXPECT_EQ(tensorboard_tag("test_loss"), "test/loss");
  EXPECT_EQ(tensorboard_tag("rewards/chosen"), "train/rewards/chosen");
}

// The values below written at a fixed time are byte for byte the committed file; TensorBoard read that file into the
// committed JSON. Set TRL_WRITE_TENSORBOARD_GOLDEN=1 to rewrite the file, then run the reference script on it.
TEST(TensorBoard, EventFilesAreWhatTensorBoardReads) {
  test::TempDir dir;
  std::string path;
  {
    TensorBoardWriter w(dir.path(), 1700000000.25);
    w.add_text("args", "{\n  \"learning_rate\": 0.001\n}", 0, 1700000000.25);
    w.add_log_entry(nlohmann::ordered_json{{"loss", 2.5}, {"learning_rate", 0.001}, {"epoch", 0.5}, {"step", 1}}, 1700000001.5);
    w.add_log_entry(nlohmann::ordered_json{{"loss", 2.25}, {"grad_norm", 0.75}, {"step", 2}}, 1700000002.5);
    w.add_log_entry(nlohmann::ordered_json{{"eval_loss", 3.0}, {"note", "text is not a scalar"}, {"step", 2}}, 1700000003.5);
    w.add_scalar("train/big_step", -1.0, int64_t{1} << 40, 1700000004.5);
    path = w.path();
  }
  EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.1700000000.", 0), 0u) << path;
  const std::string bytes = test::read_file(path);
  if (std::getenv("TRL_WRITE_TENSORBOARD_GOLDEN") != nullptr) test::write_file(kData + "events.golden", bytes);
  EXPECT_EQ(bytes, test::read_file(kData + "events.golden")) << "the writer's bytes changed: rewrite the golden and read it with TensorBoard again";

  const nlohmann::json tb = nlohmann::json::parse(test::read_file(kData + "events.golden.json"));
  EXPECT_EQ(tb["file_version"], "brain.Event:2");
  EXPECT_EQ(tb["events"], 9);  // the version, the text, the entries' 6 numbers and the scalar of the large step
  const nlohmann::json want_scalars = {{"train/loss", {{1, 2.5}, {2, 2.25}}},
                                       {"train/learning_rate", {{1, 0.0010000000474974513}}},  // the float TensorBoard keeps
                                       {"train/epoch", {{1, 0.5}}},
                                       {"train/grad_norm", {{2, 0.75}}},
                                       {"eval/loss", {{2, 3.0}}},
                                       {"train/big_step", {{int64_t{1} << 40, -1.0}}}};
  EXPECT_EQ(tb["scalars"], want_scalars);
  EXPECT_EQ(tb["texts"], nlohmann::json({{"args/text_summary", {{0, {"{\n  \"learning_rate\": 0.001\n}"}}}}}));
}

}  // namespace
}  // namespace trl

// TensorBoard event files (`--report_to tensorboard`, docs/TRAINING.md "Logs"): what torch's SummaryWriter writes for
// Transformers' TensorBoardCallback, so that TensorBoard shows a trl.cpp run as it shows a Trainer's.
//
// A file events.out.tfevents.<seconds>.<host>.<pid>.<n> is a sequence of records, each
//   uint64 length, uint32 masked CRC-32C of the length, `length` bytes of an Event protobuf, uint32 masked CRC-32C of them
// (little-endian; masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8). The first Event holds file_version
// "brain.Event:2"; each scalar is an Event {wall_time, step, summary {value {tag, simple_value}}}; text is a value
// with the text plugin's metadata and a DT_STRING tensor of one element (torch's add_text).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace trl {

// CRC-32C (Castagnoli), the checksum of TFRecord files. No Debian 12 package provides it (docs/DEPENDENCIES.md).
uint32_t crc32c(const void* data, size_t size);

// Transformers' rewrite_logs: "eval_loss" -> "eval/loss", "test_loss" -> "test/loss", anything else "train/<key>".
std::string tensorboard_tag(const std::string& key);

class TensorBoardWriter {
 public:
  // Creates `dir` and a new event file in it (the name torch gives it) holding the file_version record.
  TensorBoardWriter(const std::string& dir, double wall_time);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time);
  void add_text(const std::string& tag, const std::string& text, int64_t step, double wall_time);
  // Every number of a log entry (loss, learning_rate, eval_loss, ...; not "step") as a scalar at its "step".
  void add_log_entry(const nlohmann::ordered_json& entry, double wall_time);
  const std::string& path() const { return path_; }

  // The file name torch's writer gives (events.out.tfevents.<seconds>.<host>.<pid>.<n>).
  static std::string file_name(double wall_time, int n);

 private:
  void write_event(const std::string& event);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace trl

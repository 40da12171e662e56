// A checkpoint's trainer_state.json as a resume reads it: every field the run continues from, read and checked
// before any tensor is loaded (errors name the file and the field, in trl.cpp's words).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trl {

struct SavedTrainerState {
  nlohmann::ordered_json trl_cpp;  // the trl_cpp section as written (a resume compares its layout fields)
  int64_t global_step = 0;
  int64_t optimizer_steps = 0;
  int64_t num_tokens = 0;
  std::vector<nlohmann::ordered_json> log_history;
  // The batch layout, when the checkpoint recorded it: rows per micro-batch = data-parallel ranks × batch.
  std::optional<int64_t> per_device_train_batch_size;
  int64_t data_parallel_size = 1;      // data_parallel_size, else world_size (older checkpoints), else 1
  bool data_parallel_recorded = false;  // data_parallel_size itself was written
};

// Reads `path` (a checkpoint's trainer_state.json). Errors read "<path>: ...".
SavedTrainerState read_trainer_state(const std::string& path);

}  // namespace trl

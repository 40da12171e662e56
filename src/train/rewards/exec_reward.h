// exec:COMMAND rewards (include/trl/train/rewards.h): a long-lived child process that answers one JSON line per
// batch. Any failure (it exits, it hangs past the timeout, it answers the wrong count or a non-number) is a
// trl::Error naming the command, the batch and what happened; the child is then stopped and never reused.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "trl/train/rewards.h"

namespace trl {

class ExecReward {
 public:
  ExecReward(std::string command, double timeout_seconds);
  ~ExecReward();
  ExecReward(const ExecReward&) = delete;
  ExecReward& operator=(const ExecReward&) = delete;
  // Starts the command on the first call.
  std::vector<std::optional<double>> score(const RewardInputs& in);

 private:
  void start();
  void stop();
  void kill_group();  // SIGKILL to the command's process group (the command and every process it started)
  // Why the child is gone ("exited with status 3", "was killed by signal 9"), waiting briefly for it.
  std::string exit_reason();
  [[noreturn]] void failure(int64_t batch, const std::string& what);
  std::string command_;
  double timeout_;
  pid_t pid_ = -1;
  pid_t pgid_ = -1;  // its process group (= its pid), kept after exit_reason() reaps the command
  int fd_ = -1;
  std::string buffered_;  // bytes read past the last answer's newline
  bool broken_ = false;
};

}  // namespace trl

#include "train/rewards/exec_reward.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "trl/core/error.h"

namespace trl {

namespace {

using Clock = std::chrono::steady_clock;
using ojson = nlohmann::ordered_json;

// Milliseconds left before `deadline` (0 when past it), for poll().
int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

ojson request(const RewardInputs& in) {
  ojson j = ojson::object();
  j["prompts"] = in.prompts;
  j["completions"] = in.completions;
  j["completion_ids"] = in.completion_ids;
  for (const auto& [name, values] : in.columns)
    if (name != "prompts" && name != "completions" && name != "completion_ids") j[name] = values;
  return j;
}

}  // namespace

ExecReward::ExecReward(std::string command, double timeout_seconds) : command_(std::move(command)), timeout_(timeout_seconds) {
  if (!(timeout_ > 0)) fail("reward function 'exec:{}': the timeout must be > 0 seconds, got {}", command_, timeout_);
}

ExecReward::~ExecReward() { stop(); }

void ExecReward::start() {
  int sv[2];
  // One socket for the child's stdin and stdout: writes to it never raise SIGPIPE (MSG_NOSIGNAL) when the child is gone.
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    fail("reward function 'exec:{}': cannot create its socket: {}", command_, std::strerror(errno));
  const pid_t pid = fork();
  if (pid < 0) {
    close(sv[0]), close(sv[1]);
    fail("reward function 'exec:{}': cannot start it: {}", command_, std::strerror(errno));
  }
  if (pid == 0) {  // the child: only async-signal-safe calls until exec
    // Its own process group: a timeout or the end of the run stops the command and everything it started (a
    // `sh -c` wrapper's children would otherwise live on, holding the caller's output open).
    setpgid(0, 0);
    dup2(sv[1], 0);
    dup2(sv[1], 1);
    execl("/bin/sh", "sh", "-c", command_.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so that the group exists before any kill_group() (whichever runs first wins)
  close(sv[1]);
  fd_ = sv[0];
  pid_ = pgid_ = pid;
  fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

std::string ExecReward::exit_reason() {
  if (pid_ < 0) return "is not running";
  int status = 0;
  for (int i = 0; i < 100; ++i) {  // up to a second for it to finish exiting
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      if (WIFEXITED(status)) {
        const int code = WEXITSTATUS(status);
        return code == 127 ? "exited with status 127 (the shell did not find the command)" : fmt::format("exited with status {}", code);
      }
      if (WIFSIGNALED(status)) return fmt::format("was killed by signal {}", WTERMSIG(status));
      return "stopped";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "closed its output";
}

void ExecReward::kill_group() {
  if (pgid_ > 0) kill(-pgid_, SIGKILL);
}

void ExecReward::stop() {
  if (fd_ >= 0) close(fd_), fd_ = -1;  // the child reads EOF on stdin
  int status = 0;
  if (pid_ > 0)
    for (int i = 0; i < 50 && waitpid(pid_, &status, WNOHANG) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // Whatever the command left running (its children, or itself if it ignored EOF) goes with its group, also when
  // exit_reason() has already reaped the command itself.
  kill_group();
  pgid_ = -1;
  if (pid_ > 0) {
    if (waitpid(pid_, &status, WNOHANG) == 0) waitpid(pid_, &status, 0);
    pid_ = -1;
  }
}

void ExecReward::failure(int64_t batch, const std::string& what) {
  broken_ = true;
  stop();
  fail("reward function 'exec:{}' (batch {}): {}", command_, batch, what);
}

std::vector<std::optional<double>> ExecReward::score(const RewardInputs& in) {
  if (broken_) fail("reward function 'exec:{}' (batch {}): it failed on an earlier batch and is not restarted", command_, in.batch);
  if (pid_ < 0) start();
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_));
  const std::string line = request(in).dump() + "\n";
  // Write the request.
  for (size_t sent = 0; sent < line.size();) {
    pollfd p{fd_, POLLOUT, 0};
    const int r = poll(&p, 1, ms_left(deadline));
    if (r == 0) {
      kill_group();
      failure(in.batch, fmt::format("it did not read its input within {} s (exec_timeout_seconds); it was stopped", timeout_));
    }
    if (r < 0 && errno == EINTR) continue;
    const ssize_t n = send(fd_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      failure(in.batch, fmt::format("it {} before reading the batch", exit_reason()));
    }
    sent += static_cast<size_t>(n);
  }
  // Read one line back.
  size_t newline;
  while ((newline = buffered_.find('\n')) == std::string::npos) {
    pollfd p{fd_, POLLIN, 0};
    const int r = poll(&p, 1, ms_left(deadline));
    if (r == 0) {
      kill_group();
      failure(in.batch, fmt::format("no answer within {} s (exec_timeout_seconds); it was stopped", timeout_));
    }
    if (r < 0 && errno == EINTR) continue;
    char buf[65536];
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) failure(in.batch, fmt::format("it {} without answering (it must print one JSON line per batch)", exit_reason()));
    buffered_.append(buf, static_cast<size_t>(n));
  }
  const std::string answer = buffered_.substr(0, newline);
  buffered_.erase(0, newline + 1);
  ojson j;
  try {
    j = ojson::parse(answer);
  } catch (const ojson::exception&) {
    failure(in.batch, fmt::format("its answer is not JSON: '{}'", answer.substr(0, 200)));
  }
  if (!j.is_array() || j.size() != in.size())
    failure(in.batch, fmt::format("it must answer an array of {} numbers or nulls (one per completion), got {}", in.size(), answer.substr(0, 200)));
  std::vector<std::optional<double>> out;
  for (size_t i = 0; i < j.size(); ++i) {
    if (j[i].is_null()) out.emplace_back(std::nullopt);
    else if (j[i].is_number() && std::isfinite(j[i].get<double>())) out.emplace_back(j[i].get<double>());
    else failure(in.batch, fmt::format("reward {} of its answer is {}, not a number or null", i, j[i].dump()));
  }
  return out;
}

}  // namespace trl

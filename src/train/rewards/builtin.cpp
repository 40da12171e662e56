// The built-in reward functions by name (include/trl/train/rewards.h) and RewardInputs' accessors.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <memory>

#include <fmt/format.h>

#include "train/rewards/exec_reward.h"
#include "trl/core/error.h"
#include "trl/train/rewards.h"

namespace trl {

namespace {

using ojson = nlohmann::ordered_json;
using Rewards = std::vector<std::optional<double>>;

constexpr const char* kKnown =
    "length:N, accuracy_reward, reasoning_accuracy_reward, think_format_reward, soft_overlong_punishment:MAX:CACHE "
    "(get_soft_overlong_punishment: 1280:256, as TRL's script), regex:PATTERN, exec:COMMAND, or a reward model's folder";

// Characters as Python's len() counts them: code points (UTF-8 bytes that do not continue a sequence).
int64_t code_points(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

int64_t parse_int(const std::string& text, const std::string& spec, const char* what) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0)
    fail("reward function '{}': {} must be a whole number, got '{}' (built-ins: {})", spec, what, text, kKnown);
  return v;
}

// A compiled PCRE2 pattern (UTF, with the options given) shared by the copies of a reward function.
class Pattern {
 public:
  Pattern(const std::string& pattern, uint32_t options, const std::string& spec) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | options, &err, &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("reward function '{}': cannot compile the pattern /{}/ at offset {}: {}", spec, pattern, offset, reinterpret_cast<char*>(msg));
    }
  }
  ~Pattern() { pcre2_code_free(code_); }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;
  // A match anywhere in `s` (a match at the start only, for an anchored pattern). Invalid UTF-8 never matches.
  bool matches(const std::string& s) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md, nullptr);
    pcre2_match_data_free(md);
    return rc >= 0;
  }

 private:
  pcre2_code* code_ = nullptr;
};

// The content of the last \boxed{...} (braces balanced), or "" when there is none.
std::string last_boxed(const std::string& s) {
  const size_t at = s.rfind("\\boxed{");
  if (at == std::string::npos) return "";
  int depth = 1;
  const size_t from = at + 7;
  for (size_t i = from; i < s.size(); ++i) {
    if (s[i] == '{') ++depth;
    if (s[i] == '}' && --depth == 0) return s.substr(from, i - from);
  }
  return "";
}

// The last number in s (digits with optional sign, thousands commas, decimals or a fraction), or "".
std::string last_number(const std::string& s) {
  std::string best;
  for (size_t i = 0; i < s.size();) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) {
      ++i;
      continue;
    }
    size_t b = i;
    if (b > 0 && s[b - 1] == '-') --b;
    size_t e = i;
    while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) ||
                            ((s[e] == '.' || s[e] == ',' || s[e] == '/') && e + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[e + 1])))))
      ++e;
    best = s.substr(b, e - b);
    i = e;
  }
  return best;
}

// Whitespace, $, \left / \right, thin spaces, thousands commas and a final period removed; \dfrac and \tfrac
// written \frac.
std::string normalize_answer(std::string s) {
  auto erase_all = [&](const std::string& what) {
    for (size_t p; (p = s.find(what)) != std::string::npos;) s.erase(p, what.size());
  };
  auto replace_all = [&](const std::string& what, const std::string& with) {
    for (size_t p = 0; (p = s.find(what, p)) != std::string::npos; p += with.size()) s.replace(p, what.size(), with);
  };
  for (const char* w : {"\\left", "\\right", "\\!", "\\,", "\\;", "$"}) erase_all(w);
  replace_all("\\dfrac", "\\frac");
  replace_all("\\tfrac", "\\frac");
  s.erase(std::remove_if(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c) != 0; }), s.end());
  // 1,000 -> 1000 (a comma between digits)
  for (size_t p = 1; p + 1 < s.size(); ++p)
    if (s[p] == ',' && std::isdigit(static_cast<unsigned char>(s[p - 1])) && std::isdigit(static_cast<unsigned char>(s[p + 1]))) s.erase(p, 1);
  while (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// A completion's answer: its last \boxed{...}, else its last number, else its text.
std::string final_answer(const std::string& text) {
  std::string a = last_boxed(text);
  if (a.empty()) a = last_number(text);
  if (a.empty()) a = text;
  return normalize_answer(a);
}

// The solution's answer: its last \boxed{...}, else the whole solution (a bare answer such as \frac{1}{3}).
std::string gold_answer(const std::string& text) {
  const std::string a = last_boxed(text);
  return normalize_answer(a.empty() ? text : a);
}

std::optional<double> as_number(const std::string& s) {
  if (s.empty()) return std::nullopt;
  const size_t slash = s.find('/');
  char* end = nullptr;
  if (slash != std::string::npos) {
    const std::optional<double> n = as_number(s.substr(0, slash)), d = as_number(s.substr(slash + 1));
    if (!n || !d || *d == 0) return std::nullopt;
    return *n / *d;
  }
  const double v = std::strtod(s.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

bool same_answer(const std::string& a, const std::string& b) {
  if (a == b) return true;
  const auto x = as_number(a), y = as_number(b);
  return x && y && std::fabs(*x - *y) <= 1e-9 * std::max(1.0, std::fabs(*y));
}

// With `reasoning`: only the text after the last </think> is the answer, and a completion without one scores 0
// (TRL's reasoning_accuracy_reward penalises unfinished reasoning).
Rewards accuracy(const RewardInputs& in, const std::string& spec, bool reasoning = false) {
  const auto* solution = in.column("solution");
  if (!solution)
    fail("reward function '{}' (batch {}): the dataset has no 'solution' column to compare the completions with", spec, in.batch);
  Rewards out;
  for (size_t i = 0; i < in.size(); ++i) {
    const ojson& s = (*solution)[i];
    const std::string gold = gold_answer(s.is_string() ? s.get<std::string>() : s.dump());
    if (gold.empty()) {
      out.emplace_back(std::nullopt);  // nothing to compare with: no opinion (TRL returns None)
      continue;
    }
    std::string text = in.completion_text(i);
    if (reasoning) {
      const size_t end = text.rfind("</think>");
      if (end == std::string::npos) {
        out.emplace_back(0.0);
        continue;
      }
      text = text.substr(end + 8);
    }
    out.emplace_back(same_answer(final_answer(text), gold) ? 1.0 : 0.0);
  }
  return out;
}

}  // namespace

std::string RewardInputs::completion_text(size_t i) const {
  const ojson& c = completions.at(i);
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array() && !c.empty() && c[0].is_object() && c[0].contains("content") && c[0]["content"].is_string())
    return c[0]["content"].get<std::string>();
  fail("reward inputs: completion {} is neither text nor a list of messages with content: {}", i, c.dump());
}

const std::vector<nlohmann::ordered_json>* RewardInputs::column(const std::string& name) const {
  for (const auto& [n, values] : columns)
    if (n == name) return &values;
  return nullptr;
}

NamedRewardFunction reward_function(const std::string& spec, const RewardFunctionOptions& options) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon), arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  auto need_arg = [&](const char* form) {
    if (colon == std::string::npos || arg.empty()) fail("reward function '{}' needs an argument: {}", spec, form);
  };
  if (kind == "length") {
    need_arg("length:N (the target length in characters)");
    const int64_t target = parse_int(arg, spec, "N");
    if (target < 0) fail("reward function '{}': N is the target length in characters, so it must be >= 0, got {}", spec, target);
    return {"reward_len", [target](const RewardInputs& in) {
              Rewards out;
              for (size_t i = 0; i < in.size(); ++i)
                out.emplace_back(-std::fabs(static_cast<double>(target - code_points(in.completion_text(i)))) / 100.0);
              return out;
            }};
  }
  if (kind == "accuracy_reward" && colon == std::string::npos)
    return {"accuracy_reward", [spec](const RewardInputs& in) { return accuracy(in, spec); }};
  if (kind == "reasoning_accuracy_reward" && colon == std::string::npos)
    return {"reasoning_accuracy_reward", [spec](const RewardInputs& in) { return accuracy(in, spec, true); }};
  if (kind == "get_soft_overlong_punishment" && colon == std::string::npos)  // TRL's script registers it with these
    return reward_function("soft_overlong_punishment:1280:256", options);
  if (kind == "think_format_reward" && colon == std::string::npos) {
    // TRL's pattern, matched at the start: ^<think>(?!.*<think>)(.*?)</think>.*$ with DOTALL and MULTILINE.
    auto p = std::make_shared<Pattern>("^<think>(?!.*<think>)(.*?)</think>.*$", PCRE2_ANCHORED | PCRE2_DOTALL | PCRE2_MULTILINE, spec);
    return {"think_format_reward", [p](const RewardInputs& in) {
              Rewards out;
              for (size_t i = 0; i < in.size(); ++i) out.emplace_back(p->matches(in.completion_text(i)) ? 1.0 : 0.0);
              return out;
            }};
  }
  if (kind == "soft_overlong_punishment") {
    need_arg("soft_overlong_punishment:MAX:CACHE (max_completion_len and soft_punish_cache, in tokens)");
    const size_t c2 = arg.find(':');
    if (c2 == std::string::npos) fail("reward function '{}': expected soft_overlong_punishment:MAX:CACHE", spec);
    const int64_t max_len = parse_int(arg.substr(0, c2), spec, "MAX"), cache = parse_int(arg.substr(c2 + 1), spec, "CACHE");
    if (max_len < 1 || cache < 0 || cache > max_len)
      fail("reward function '{}': needs MAX >= 1 and 0 <= CACHE <= MAX, got MAX {} and CACHE {}", spec, max_len, cache);
    return {"soft_overlong_punishment_reward", [max_len, cache](const RewardInputs& in) {
              Rewards out;
              for (size_t i = 0; i < in.size(); ++i) {
                const int64_t n = static_cast<int64_t>(in.completion_ids.at(i).size());
                if (n <= max_len - cache) out.emplace_back(0.0);
                else if (n <= max_len) out.emplace_back(static_cast<double>(max_len - cache - n) / static_cast<double>(cache));
                else out.emplace_back(-1.0);
              }
              return out;
            }};
  }
  if (kind == "regex") {
    need_arg("regex:PATTERN (a PCRE2 pattern)");
    auto p = std::make_shared<Pattern>(arg, 0, spec);
    return {"regex", [p](const RewardInputs& in) {
              Rewards out;
              for (size_t i = 0; i < in.size(); ++i) out.emplace_back(p->matches(in.completion_text(i)) ? 1.0 : 0.0);
              return out;
            }};
  }
  if (kind == "exec") {
    need_arg("exec:COMMAND (a shell command line)");
    auto proc = std::make_shared<ExecReward>(arg, options.exec_timeout_seconds);
    return {"exec", [proc](const RewardInputs& in) { return proc->score(in); }};
  }
  fail("unknown reward function '{}'; the built-ins are {}", spec, kKnown);
}

}  // namespace trl

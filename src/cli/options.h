// One option layer for every `trl` command, reading command lines as Transformers' HfArgumentParser and TRL do:
//   - every name takes underscores or dashes (--max_new_tokens, --max-new-tokens);
//   - a boolean alone means true; `true|false|yes|no|1|0` (any case, also t/f/y/n) as the next word or after `=`
//     set it (`--bf16 False`, `--packing=false`);
//   - optional values (std::optional<T>) take `None` to mean unset;
//   - a repeated option keeps its last value, as argparse does (lists take every value);
//   - numbers are checked as they are read: "'abc' is not a number", "--max_new_tokens must be at least 1, got 0";
//   - `--help` shows every default, booleans included (or a text such as "generation_config.json, else 256");
//   - `--config file.yaml` feeds YAML keys through the same parsers (the command line wins).
//
//   Options o(cmd);
//   o.add("max_new_tokens", f.max_new_tokens, "Tokens to generate").min(1).default_text("generation_config.json, else 256");
//   o.add("model,model_name_or_path", f.model, "Model folder or id").required();
#pragma once

#include <climits>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trl/core/error.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace trl::cli {

// A usage error: an option missing, unknown or of a wrong value, on the command line or in --config. `trl` exits 2
// for these, as argparse does (docs/CLI.md); other errors exit 1.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(message) {}
};
template <typename... Args>
[[noreturn]] void usage_fail(fmt::format_string<Args...> format, Args&&... args) {
  throw UsageError(fmt::format(format, std::forward<Args>(args)...));
}

// How one option reads text into its target, and what it accepts.
struct OptionSpec {
  enum class Kind { Bool, Int, Float, Text };
  std::string name;                 // the first name, with underscores ("max_new_tokens")
  std::vector<std::string> aliases;  // every name, with underscores
  Kind kind = Kind::Text;
  bool optional = false;  // std::optional target: "None" resets it
  bool list = false;      // std::vector target: every value is kept
  bool json = false;      // text holding a JSON object (Opt::json_object): a YAML mapping is given as its JSON text
  bool json_list = false;  // text holding a JSON list (Opt::json_list): a YAML list (of mappings) is given as its JSON text
  // The typed setters (one is set, by kind); read() parses and checks the text first.
  std::function<void(bool)> set_bool;
  std::function<void(int64_t)> set_int;
  std::function<void(long double)> set_number;
  std::function<void(const std::string&)> set_text;
  std::function<void()> reset;                  // None / the start of a list
  std::string help;                             // the description, without the default
  std::function<std::string()> shown_default;   // the target's value at registration, as --help shows it
  bool integer_only = false;
  std::optional<long double> lo, hi;
  bool lo_open = false, hi_open = false;
  std::vector<std::string> choices;
  int64_t int_min = INT64_MIN, int_max = INT64_MAX;  // the target type's range
  std::string default_override;                     // Opt::default_text
  CLI::Option* option = nullptr;
  CLI::Option* negation = nullptr;  // a boolean's --no_<name> (HfArgumentParser's form), which sets it false

  // Checks `text` against the kind, range and choices; throws trl::Error with a message naming the option.
  void read(const std::string& text);
  std::string flag() const { return "--" + name; }
};

class Options;

// The handle add() returns: constraints and help, chained.
class Opt {
 public:
  Opt(OptionSpec* spec, CLI::Option* option) : s_(spec), o_(option) {}
  Opt& min(long double v);       // value >= v
  Opt& above(long double v);     // value > v
  Opt& max(long double v);       // value <= v
  Opt& below(long double v);     // value < v
  Opt& choices(std::vector<std::string> names);
  Opt& required();
  Opt& default_text(const std::string& text);  // what --help names as the default, when it is not the value itself
  Opt& excludes(const Opt& other);
  Opt& json_object();  // the text is a JSON object; in a YAML config the value may be a mapping
  Opt& json_list();    // the text is a JSON list; in a YAML config the value may be a list of mappings
  CLI::Option* option() const { return o_; }
  const OptionSpec& spec() const { return *s_; }

 private:
  OptionSpec* s_;
  CLI::Option* o_;
};

class Options {
 public:
  explicit Options(CLI::App* cmd);
  Opt add(const std::string& names, bool& target, const std::string& help);
  Opt add(const std::string& names, std::optional<bool>& target, const std::string& help);
  Opt add(const std::string& names, int32_t& target, const std::string& help);
  Opt add(const std::string& names, int64_t& target, const std::string& help);
  Opt add(const std::string& names, uint64_t& target, const std::string& help);
  Opt add(const std::string& names, std::optional<int32_t>& target, const std::string& help);
  Opt add(const std::string& names, std::optional<int64_t>& target, const std::string& help);
  Opt add(const std::string& names, std::optional<uint64_t>& target, const std::string& help);
  Opt add(const std::string& names, float& target, const std::string& help);
  Opt add(const std::string& names, double& target, const std::string& help);
  Opt add(const std::string& names, std::optional<float>& target, const std::string& help);
  Opt add(const std::string& names, std::optional<double>& target, const std::string& help);
  Opt add(const std::string& names, std::string& target, const std::string& help);
  Opt add(const std::string& names, std::optional<std::string>& target, const std::string& help);
  Opt add(const std::string& names, std::vector<int32_t>& target, const std::string& help);
  Opt add(const std::string& names, std::vector<std::string>& target, const std::string& help);
  Opt add(const std::string& names, std::vector<double>& target, const std::string& help);

  // `--config FILE`: every key must name an option; a key also given on the command line keeps the command line's
  // value; null keeps the default. Errors name the file and the key.
  void apply_yaml(const std::string& path);
  // Keys of a --config file that are not options of the command: read by the launcher before the command runs
  // (env, num_processes, accelerate_config; cli/launch.h), so apply_yaml passes over them.
  static bool launcher_key(const std::string& key);
  // Whether the option was given on the command line (or by apply_yaml).
  bool given(const std::string& name) const;
  CLI::App* app() const { return cmd_; }

 private:
  Opt add_spec(OptionSpec spec, const std::string& names, const std::string& help);
  OptionSpec* find(const std::string& name) const;
  CLI::App* cmd_;
  std::shared_ptr<std::deque<OptionSpec>> specs_;  // shared with the CLI11 callbacks, which outlive this object
};

// The option tables of the commands made while a collector is set: the Python package reads them to make its
// Config classes (each option's name, kind and default), so that a Python keyword and a command-line flag are one.
struct CommandOptions {
  std::string command;  // "sft", "grpo", ...
  std::shared_ptr<const std::deque<OptionSpec>> specs;
};
std::vector<CommandOptions>*& option_collector();

// The CLI11 calls a command's file makes, defined in options.cpp: only options.cpp and main.cpp include CLI11's
// header, which costs 12 s of compile time in every file that does (CLI11 2.1 is header-only).
CLI::App* add_command(CLI::App& parent, const std::string& name, const std::string& description);
void on_run(CLI::App* cmd, std::function<void()> run);  // what the command does once its options are read
void require_subcommand(CLI::App* cmd);                  // a group such as `trl bench`: one of its commands is needed
// A required positional argument (`trl dataset-info NAME`).
void add_positional(CLI::App* cmd, const std::string& name, std::string& target, const std::string& help);

// Parsers shared with YAML and tests: HfArgumentParser's boolean words; integers and numbers that say what is wrong.
bool parse_bool_word(const std::string& text, const std::string& flag);
int64_t parse_integer(const std::string& text, const std::string& flag);
long double parse_number(const std::string& text, const std::string& flag);
bool is_none(const std::string& text);

// The option TRL or Transformers renamed `name` to, with the version that did it ("max_length (TRL 0.20 renamed
// max_seq_length)"), or "" when `name` is not a known old name. Used by the unknown-option messages.
std::string renamed_option_hint(const std::string& name);

}  // namespace trl::cli

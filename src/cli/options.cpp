#include "cli/options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "trl/core/error.h"

namespace trl::cli {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string underscored(std::string s) {
  for (char& c : s) {
    if (c == '-') c = '_';
  }
  return s;
}

std::string dashed(std::string s) {
  for (char& c : s) {
    if (c == '_') c = '-';
  }
  return s;
}

[[noreturn]] void invalid(const std::string& msg) { throw CLI::ValidationError(msg); }

std::string show_number(long double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::floor(v) && std::fabs(v) < 1e18L) return fmt::format("{}", static_cast<long long>(v));
  return fmt::format("{}", static_cast<double>(v));
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : sep) + x;
  return out;
}

}  // namespace

bool is_none(const std::string& text) { return text == "None" || text == "none" || text == "null"; }

bool parse_bool_word(const std::string& text, const std::string& flag) {
  const std::string t = lower(text);
  if (t.empty() || t == "true" || t == "t" || t == "yes" || t == "y" || t == "1") return true;
  if (t == "false" || t == "f" || t == "no" || t == "n" || t == "0") return false;
  invalid(fmt::format("{}: expected true or false (or yes/no, 1/0), got '{}'", flag, text));
}

int64_t parse_integer(const std::string& text, const std::string& flag) {
  if (text.empty()) invalid(fmt::format("{}: expected an integer, got nothing", flag));
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0') {
    char* fend = nullptr;
    std::strtold(text.c_str(), &fend);
    if (fend != text.c_str() && *fend == '\0') invalid(fmt::format("{}: '{}' is not an integer", flag, text));
    invalid(fmt::format("{}: '{}' is not a number", flag, text));
  }
  if (errno == ERANGE) invalid(fmt::format("{}: {} is too large (the limit is {})", flag, text, text[0] == '-' ? INT64_MIN : INT64_MAX));
  return v;
}

long double parse_number(const std::string& text, const std::string& flag) {
  if (text.empty()) invalid(fmt::format("{}: expected a number, got nothing", flag));
  char* end = nullptr;
  const long double v = std::strtold(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0') invalid(fmt::format("{}: '{}' is not a number", flag, text));
  if (std::isnan(v)) invalid(fmt::format("{} must be a number, got {}", flag, text));
  if (std::isinf(v)) invalid(fmt::format("{} must be a finite number, got {}", flag, text));
  return v;
}

// The range of a number as the messages say it: "at least 1", "greater than 0", "in [0, 1)".
static std::string range_words(const OptionSpec& s) {
  if (s.lo && s.hi) {
    return fmt::format("in {}{}, {}{}", s.lo_open ? "(" : "[", show_number(*s.lo), show_number(*s.hi), s.hi_open ? ")" : "]");
  }
  if (s.lo) return fmt::format("{} {}", s.lo_open ? "greater than" : "at least", show_number(*s.lo));
  return fmt::format("{} {}", s.hi_open ? "less than" : "at most", show_number(*s.hi));
}

void OptionSpec::read(const std::string& text) {
  if (optional && is_none(text)) {
    reset();
    return;
  }
  switch (kind) {
    case Kind::Bool:
      set_bool(parse_bool_word(text, flag()));
      return;
    case Kind::Int:
    case Kind::Float: {
      const long double v = kind == Kind::Int ? static_cast<long double>(parse_integer(text, flag())) : parse_number(text, flag());
      const bool low = lo && (lo_open ? v <= *lo : v < *lo);
      const bool high = hi && (hi_open ? v >= *hi : v > *hi);
      if (low || high) invalid(fmt::format("{} must be {}, got {}", flag(), range_words(*this), text));
      if (kind == Kind::Int) {
        if (v < static_cast<long double>(int_min) || v > static_cast<long double>(int_max))
          invalid(fmt::format("{}: {} is out of range ({} to {})", flag(), text, int_min, int_max));
        set_int(static_cast<int64_t>(v));
      } else {
        set_number(v);
      }
      return;
    }
    case Kind::Text:
      if (!choices.empty() && std::find(choices.begin(), choices.end(), text) == choices.end())
        invalid(fmt::format("{}: '{}' is not one of {}", flag(), text, join(choices, ", ")));
      set_text(text);
      return;
  }
}

// ---- Opt ----

static void refresh_help(OptionSpec& s) {
  std::string shown = s.default_override.empty() ? s.shown_default() : s.default_override;
  std::string text = s.help;
  if (!s.choices.empty() && s.help.find(s.choices[0]) == std::string::npos) text += " (" + join(s.choices, " | ") + ")";
  if (!shown.empty()) text += " [default: " + shown + "]";
  s.option->description(text);
}

Opt& Opt::min(long double v) {
  s_->lo = v;
  s_->lo_open = false;
  return *this;
}
Opt& Opt::above(long double v) {
  s_->lo = v;
  s_->lo_open = true;
  return *this;
}
Opt& Opt::max(long double v) {
  s_->hi = v;
  s_->hi_open = false;
  return *this;
}
Opt& Opt::below(long double v) {
  s_->hi = v;
  s_->hi_open = true;
  return *this;
}
Opt& Opt::choices(std::vector<std::string> names) {
  s_->choices = std::move(names);
  refresh_help(*s_);
  return *this;
}
Opt& Opt::required() {
  o_->required();
  return *this;
}
Opt& Opt::default_text(const std::string& text) {
  s_->default_override = text;
  refresh_help(*s_);
  return *this;
}
Opt& Opt::excludes(const Opt& other) {
  o_->excludes(other.o_);
  return *this;
}

Opt& Opt::json_object() {
  s_->json = true;
  return *this;
}

Opt& Opt::json_list() {
  s_->json_list = true;
  return *this;
}

// ---- Options ----

CLI::App* add_command(CLI::App& parent, const std::string& name, const std::string& description) {
  return parent.add_subcommand(name, description);
}
void on_run(CLI::App* cmd, std::function<void()> run) { cmd->callback(std::move(run)); }
void require_subcommand(CLI::App* cmd) { cmd->require_subcommand(1); }
void add_positional(CLI::App* cmd, const std::string& name, std::string& target, const std::string& help) {
  cmd->add_option(name, target, help)->required();
}

std::vector<CommandOptions>*& option_collector() {
  static thread_local std::vector<CommandOptions>* collector = nullptr;
  return collector;
}

Options::Options(CLI::App* cmd) : cmd_(cmd), specs_(std::make_shared<std::deque<OptionSpec>>()) {
  if (option_collector() != nullptr) option_collector()->push_back({cmd->get_name(), specs_});
}

Opt Options::add_spec(OptionSpec spec, const std::string& names, const std::string& help) {
  std::string cli_names;
  for (const auto& n : CLI::detail::split(names, ',')) {
    const std::string u = underscored(n);
    spec.aliases.push_back(u);
    cli_names += (cli_names.empty() ? "" : ",") + ("--" + u);
    if (dashed(u) != u) cli_names += ",--" + dashed(u);
  }
  spec.name = spec.aliases.front();
  spec.help = help;
  specs_->push_back(std::move(spec));
  OptionSpec* s = &specs_->back();
  auto keep = specs_;
  CLI::Option* o = cmd_->add_option(
      cli_names,
      [s, keep](const CLI::results_t& results) {
        if (s->list) s->reset();
        for (const auto& r : results) s->read(r);
        return true;
      },
      help);
  const char* type = s->kind == OptionSpec::Kind::Bool ? "[BOOL]" : s->kind == OptionSpec::Kind::Int ? "INT" : s->kind == OptionSpec::Kind::Float ? "FLOAT" : "TEXT";
  o->type_name(type);
  o->type_size(1);
  if (s->list) {
    o->expected(1, CLI::detail::expected_max_vector_size)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->allow_extra_args(true);
    if (s->kind == OptionSpec::Kind::Int) o->delimiter(',');
  } else {
    o->expected(s->kind == OptionSpec::Kind::Bool ? 0 : 1, 1)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  s->option = o;
  if (s->kind == OptionSpec::Kind::Bool && !s->list) {
    // HfArgumentParser's negation, for every boolean here: --no_bf16 sets bf16 false. Hidden from --help.
    std::string no_names;
    for (const std::string& u : s->aliases) no_names += (no_names.empty() ? "" : ",") + ("--no_" + u + ",--no-" + dashed(u));
    // An option of 0 or 1 values, so that a value given to it (--no_bf16=false, --no_bf16 true) is refused in these
    // words rather than CLI11's (argparse refuses it too).
    s->negation = cmd_->add_option(
        no_names,
        [s, keep](const CLI::results_t& results) {
          if (!results.empty() && !(results.size() == 1 && results[0].empty()))
            invalid(fmt::format("--no_{0} takes no value (it sets --{0} false), got '{1}'", s->name, results[0]));
          if (s->option->count() > 0) invalid(fmt::format("--{0} and --no_{0} are both given: give one", s->name));
          s->set_bool(false);
          return true;
        },
        "Sets --" + s->name + " false");
    s->negation->expected(0, 1)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    s->negation->group("");
  }
  refresh_help(*s);
  return Opt(s, o);
}

namespace {

template <class T>
std::string show_value(const T& v) {
  if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
  else if constexpr (std::is_same_v<T, std::string>) return v;  // empty: no default shown
  else if constexpr (std::is_floating_point_v<T>) return fmt::format("{}", v);
  else return std::to_string(v);
}

template <class T>
OptionSpec::Kind kind_of() {
  if constexpr (std::is_same_v<T, bool>) return OptionSpec::Kind::Bool;
  else if constexpr (std::is_integral_v<T>) return OptionSpec::Kind::Int;
  else if constexpr (std::is_floating_point_v<T>) return OptionSpec::Kind::Float;
  else return OptionSpec::Kind::Text;
}

// The setter of a target `assign` for a value type T.
template <class T>
void set_setter(OptionSpec& s, std::function<void(T)> assign) {
  if constexpr (std::is_same_v<T, bool>) {
    s.set_bool = assign;
  } else if constexpr (std::is_integral_v<T>) {
    s.int_min = static_cast<int64_t>(std::numeric_limits<T>::min());
    s.int_max = std::numeric_limits<T>::max() > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(std::numeric_limits<T>::max());
    s.set_int = [assign](int64_t v) { assign(static_cast<T>(v)); };
  } else if constexpr (std::is_floating_point_v<T>) {
    s.set_number = [assign](long double v) { assign(static_cast<T>(v)); };
  } else {
    s.set_text = [assign](const std::string& v) { assign(v); };
  }
}

template <class T>
OptionSpec plain_spec(T& target) {
  OptionSpec s;
  s.kind = kind_of<T>();
  const std::string shown = show_value(target);
  s.shown_default = [shown] { return shown; };
  set_setter<T>(s, [&target](T v) { target = v; });
  s.reset = [] {};
  return s;
}

template <class T>
OptionSpec optional_spec(std::optional<T>& target) {
  OptionSpec s;
  s.kind = kind_of<T>();
  s.optional = true;
  const std::string shown = target ? show_value(*target) : "None";
  s.shown_default = [shown] { return shown; };
  set_setter<T>(s, [&target](T v) { target = v; });
  s.reset = [&target] { target.reset(); };
  return s;
}

template <class T>
OptionSpec list_spec(std::vector<T>& target) {
  OptionSpec s;
  s.kind = kind_of<T>();
  s.list = true;
  std::string shown;
  for (const auto& x : target) shown += (shown.empty() ? "" : ",") + show_value(x);
  s.shown_default = [shown] { return shown.empty() ? std::string("none") : shown; };
  set_setter<T>(s, [&target](T v) { target.push_back(v); });
  s.reset = [&target] { target.clear(); };
  return s;
}

}  // namespace

Opt Options::add(const std::string& n, bool& t, const std::string& h) { return add_spec(plain_spec(t), n, h); }
Opt Options::add(const std::string& n, std::optional<bool>& t, const std::string& h) { return add_spec(optional_spec(t), n, h); }
Opt Options::add(const std::string& n, int32_t& t, const std::string& h) { return add_spec(plain_spec(t), n, h); }
Opt Options::add(const std::string& n, int64_t& t, const std::string& h) { return add_spec(plain_spec(t), n, h); }
Opt Options::add(const std::string& n, uint64_t& t, const std::string& h) { return add_spec(plain_spec(t), n, h).min(0); }
Opt Options::add(const std::string& n, std::optional<int32_t>& t, const std::string& h) { return add_spec(optional_spec(t), n, h); }
Opt Options::add(const std::string& n, std::optional<int64_t>& t, const std::string& h) { return add_spec(optional_spec(t), n, h); }
Opt Options::add(const std::string& n, std::optional<uint64_t>& t, const std::string& h) { return add_spec(optional_spec(t), n, h).min(0); }
Opt Options::add(const std::string& n, float& t, const std::string& h) { return add_spec(plain_spec(t), n, h); }
Opt Options::add(const std::string& n, double& t, const std::string& h) { return add_spec(plain_spec(t), n, h); }
Opt Options::add(const std::string& n, std::optional<float>& t, const std::string& h) { return add_spec(optional_spec(t), n, h); }
Opt Options::add(const std::string& n, std::optional<double>& t, const std::string& h) { return add_spec(optional_spec(t), n, h); }
Opt Options::add(const std::string& n, std::string& t, const std::string& h) { return add_spec(plain_spec(t), n, h); }
Opt Options::add(const std::string& n, std::optional<std::string>& t, const std::string& h) { return add_spec(optional_spec(t), n, h); }
Opt Options::add(const std::string& n, std::vector<int32_t>& t, const std::string& h) { return add_spec(list_spec(t), n, h); }
Opt Options::add(const std::string& n, std::vector<std::string>& t, const std::string& h) { return add_spec(list_spec(t), n, h); }
Opt Options::add(const std::string& n, std::vector<double>& t, const std::string& h) { return add_spec(list_spec(t), n, h); }

OptionSpec* Options::find(const std::string& name) const {
  const std::string u = underscored(name);
  for (auto& s : *specs_) {
    if (std::find(s.aliases.begin(), s.aliases.end(), u) != s.aliases.end()) return &s;
  }
  return nullptr;
}

bool Options::given(const std::string& name) const {
  const OptionSpec* s = find(name);
  return s != nullptr && (s->option->count() > 0 || (s->negation != nullptr && s->negation->count() > 0));
}

bool Options::launcher_key(const std::string& key) {
  for (const char* k : {"env", "num_processes", "nproc_per_node", "accelerate_config", "num_machines", "mixed_precision", "main_process_port"})
    if (underscored(key) == k) return true;
  return false;
}

std::string renamed_option_hint(const std::string& name) {
  struct Renamed {
    const char *old_name, *hint;
  };
  static const Renamed table[] = {
      {"max_seq_length", "--max_length (TRL's SFTConfig renamed max_seq_length to max_length)"},
      {"evaluation_strategy", "--eval_strategy (Transformers renamed evaluation_strategy to eval_strategy)"},
      {"per_gpu_train_batch_size", "--per_device_train_batch_size (Transformers' current name)"},
      {"per_gpu_eval_batch_size", "--per_device_eval_batch_size (Transformers' current name)"},
  };
  const std::string u = underscored(name);
  for (const Renamed& r : table)
    if (u == r.old_name) return r.hint;
  return "";
}

namespace {
// A YAML mapping given to an option that takes JSON text (chat_template_kwargs): scalars become true/false, null,
// numbers or strings as YAML reads them.
nlohmann::ordered_json yaml_to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    nlohmann::ordered_json o = nlohmann::ordered_json::object();
    for (const auto& kv : n) {
      if (!kv.first.IsScalar()) fail("a mapping's keys must be plain words, not lists or mappings");
      o[kv.first.as<std::string>()] = yaml_to_json(kv.second);
    }
    return o;
  }
  if (n.IsSequence()) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (const auto& x : n) a.push_back(yaml_to_json(x));
    return a;
  }
  if (n.IsNull()) return nullptr;
  const std::string v = n.as<std::string>();
  if (n.Tag() != "!") {  // unquoted
    if (v == "true" || v == "True") return true;
    if (v == "false" || v == "False") return false;
    if (v == "null" || v == "~" || v == "None") return nullptr;
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (!v.empty() && *end == '\0' && std::isfinite(d)) {  // "inf" and "nan" stay text; whole numbers in range are integers
      const bool whole = v.find_first_not_of("+-0123456789") == std::string::npos;
      if (whole && std::fabs(d) < 9.2e18) return static_cast<int64_t>(d);
      return d;
    }
  }
  return v;
}
}  // namespace

void Options::apply_yaml(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) usage_fail("--config {}: is a folder; expected a YAML file such as sft.yaml", path);
  if (!std::filesystem::exists(path, ec)) usage_fail("--config {}: no such file", path);
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    usage_fail("--config {}: cannot open", path);
  } catch (const YAML::Exception& e) {
    usage_fail("--config {}: not valid YAML (line {}, column {}): {}", path, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  if (root.IsNull()) return;
  if (!root.IsMap()) usage_fail("--config {}: the file must be a mapping of option: value", path);
  for (const auto& kv : root) {
    const int line = kv.first.Mark().line + 1;
    if (!kv.first.IsScalar()) usage_fail("--config {}:{}: an option name must be a plain word, not a list or a mapping", path, line);
    const std::string key = kv.first.as<std::string>();
    if (launcher_key(key)) continue;
    OptionSpec* s = find(key);
    if (s == nullptr || s->name == "config") {
      const std::string hint = renamed_option_hint(key);
      usage_fail("--config {}:{}: unknown option '{}'{}", path, line, key, hint.empty() ? "" : "; use " + hint);
    }
    if (given(s->name)) continue;  // the command line wins
    if (kv.second.IsNull()) {              // null: None for optional values, else the default
      if (s->optional) s->reset();
      continue;
    }
    std::vector<std::string> values;
    if (kv.second.IsScalar()) values.push_back(kv.second.as<std::string>());
    else if ((kv.second.IsMap() && s->json) || (kv.second.IsSequence() && s->json_list)) {  // chat_template_kwargs: {...}, datasets: [...]
      try {
        values.push_back(yaml_to_json(kv.second).dump());
      } catch (const nlohmann::json::exception&) {  // found by fuzzing
        usage_fail("--config {}:{}: '{}' holds text that is not UTF-8", path, line, key);
      } catch (const Error& e) {
        usage_fail("--config {}:{}: '{}': {}", path, line, key, e.what());
      }
    } else if (kv.second.IsSequence() && s->list) {
      for (const auto& x : kv.second) {
        if (!x.IsScalar()) usage_fail("--config {}:{}: '{}' must be a list of plain values, not of lists or mappings", path, line, key);
        values.push_back(x.as<std::string>());
      }
    }
    else if (s->json_list) usage_fail("--config {}:{}: '{}' must be a list (of mappings), not a {}", path, line, key, kv.second.IsMap() ? "mapping" : "single value");
    else usage_fail("--config {}:{}: '{}' must be a single value{}, not a {}", path, line, key, s->list ? " or a list" : "",
              kv.second.IsMap() ? "mapping" : "list");
    try {
      if (s->list) s->reset();
      for (const auto& v : values) s->read(v);
    } catch (const CLI::Error& e) {
      usage_fail("--config {}:{}: {}", path, line, e.what());
    }
  }
}

}  // namespace trl::cli

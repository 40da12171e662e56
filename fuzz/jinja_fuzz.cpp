// libFuzzer target: Jinja chat templates and the data they render (docs/TESTING.md, "Fuzzing"). The input is a
// template, a NUL byte, and a JSON object of variables (messages, tools, add_generation_prompt, ...); without a NUL
// the whole input is the template and the variables are one user message. Anything but text or a trl::Error (a
// TemplateError is one) is a finding; a template that loops forever is a time-out finding.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "tokenizer/jinja.h"
#include "trl/core/error.h"

TRL_FUZZ_TARGET(jinja) {
  const std::string all = trl::fuzz::text(data, size);
  const size_t nul = all.find('\0');
  const std::string source = all.substr(0, nul);
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  if (nul != std::string::npos) {
    vars = nlohmann::ordered_json::parse(all.substr(nul + 1), nullptr, false);
    if (!vars.is_object()) return 0;  // the data is JSON from a dataset: its parser is fuzzed elsewhere
  } else {
    vars["messages"] = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "Hi"}}});
    vars["add_generation_prompt"] = true;
  }
  try {
    const trl::jinja::Template t(source, "chat_template");
    (void)t.render(trl::jinja::Value::from_json(vars));
  } catch (const trl::Error&) {
  }
  return 0;
}

// Chat templates against Python's jinja2 in Transformers' environment (fixtures: tests/reference/chat_templates.py).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "assets/assets.h"
#include "trl/core/error.h"
#include "core/fs.h"
#include "trl/models/init.h"
#include "test_util.h"
#include "trl/tokenizer/chat_template.h"
#include "tokenizer/jinja.h"
#include "tokenizer/unicode.h"

namespace trl {
namespace {

using json = nlohmann::ordered_json;
const std::string kChat = std::string(TRL_TEST_DATA_DIR) + "/chat/";

std::string template_source(const std::string& name) {
  if (name == "qwen3") return std::string(asset("chat_template.jinja"));
  return read_text_file(kChat + (name == "generation" ? "qwen3_generation" : name) + ".jinja");
}

// Byte offset -> code point offset (Python's str indices).
size_t cp_index(const std::string& s, size_t byte) {
  size_t n = 0;
  for (size_t i = 0; i < byte && i < s.size(); ++i) n += (static_cast<unsigned char>(s[i]) & 0xc0) != 0x80;
  return n;
}

TEST(ChatTemplate, MatchesJinja2OnEveryFixture) {
  const nlohmann::ordered_json fixtures = nlohmann::ordered_json::parse(read_text_file(kChat + "renders.json"));
  std::map<std::string, int> per_template;
  int compared = 0;
  for (const auto& c : fixtures["cases"]) {
    const std::string name = c["template"].get<std::string>();
    ASSERT_FALSE(c.contains("error")) << c["error"];
    const jinja::Template tpl(template_source(name), name);
    const jinja::RenderResult r = tpl.render(jinja::Value::from_json(c["context"]));
    ASSERT_EQ(r.text, c["text"].get<std::string>()) << name << " with " << c["context"].dump().substr(0, 600);
    nlohmann::ordered_json spans = nlohmann::ordered_json::array();
    for (const auto& [b, e] : r.generation_spans) spans.push_back({cp_index(r.text, b), cp_index(r.text, e)});
    EXPECT_EQ(spans, c["generation_spans"]) << name;
    ++per_template[name];
    ++compared;
  }
  EXPECT_GE(per_template["qwen3"], 50);
  EXPECT_GE(per_template["chatml"], 10);
  EXPECT_GE(per_template["llama3"], 10);
  std::printf("[ chat ] %d renderings byte-equal to jinja2 %s\n", compared, fixtures["jinja2"].get<std::string>().c_str());
}

const Tokenizer& qwen3() { return test::qwen3_tokenizer(); }

TEST(ChatTemplate, Qwen3ThroughTheTokenizer) {
  const json msgs = json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])");
  // Qwen3's example rendering (docs/TOKENIZER.md).
  EXPECT_EQ(apply_chat_template(qwen3(), msgs).text,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nYo<|im_end|>\n");
  ChatTemplateOptions o;
  o.add_generation_prompt = true;
  o.extra["enable_thinking"] = false;
  EXPECT_EQ(apply_chat_template(qwen3(), json::parse(R"([{"role": "user", "content": "Hi"}])"), o).text,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  const ChatEncoding enc = apply_chat_template_ids(qwen3(), msgs);
  EXPECT_EQ(enc.input_ids, qwen3().encode(enc.text, false));
  EXPECT_EQ(enc.input_ids.front(), 151644);
}

TEST(ChatTemplate, ContinueFinalMessage) {
  ChatTemplateOptions o;
  o.continue_final_message = true;
  o.chat_template = template_source("chatml");
  const json msgs = json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is"}])");
  EXPECT_EQ(apply_chat_template(qwen3(), msgs, o).text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nThe answer is");
  o.add_generation_prompt = true;
  EXPECT_THROW(apply_chat_template(qwen3(), msgs, o), Error);
}

// A message whose content is neither text, a list of parts nor null is named with its index and role, before the
// template sees it (issue 37, defect 11).
TEST(ChatTemplate, ContentOfTheWrongKindIsNamed) {
  const std::string e = test::error_of([] { apply_chat_template(qwen3(), json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": 3}])")); });
  EXPECT_NE(e.find("message 1 ('assistant'): 'content' must be text or a list of parts, got 3"), std::string::npos) << e;
  // null reaches the template as Transformers passes it (Qwen3's then fails as Jinja2 does, in its own words).
  const std::string null = test::error_of([] { apply_chat_template(qwen3(), json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": null}])")); });
  EXPECT_EQ(null.find("'content' must be text"), std::string::npos) << null;
}

TEST(ChatTemplate, AssistantMasksFromGenerationBlocks) {
  ChatTemplateOptions o;
  o.chat_template = template_source("generation");
  const json msgs = json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}, {"role": "user", "content": "Again"}, {"role": "assistant", "content": "<think>hmm</think>Sure"}])");
  const ChatEncoding enc = apply_chat_template_ids(qwen3(), msgs, o);
  ASSERT_EQ(enc.assistant_masks.size(), enc.input_ids.size());
  // The masked tokens decode exactly to the assistant outputs.
  std::vector<int32_t> assistant, rest;
  for (size_t i = 0; i < enc.input_ids.size(); ++i) (enc.assistant_masks[i] ? assistant : rest).push_back(enc.input_ids[i]);
  EXPECT_EQ(qwen3().decode(assistant), "<think>\n\n</think>\n\nYo<|im_end|><think>\nhmm\n</think>\n\nSure<|im_end|>");
  EXPECT_EQ(qwen3().decode(rest), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n\n");
}

std::string render_error(const std::string& source, const json& ctx = json::object()) {
  try {
    jinja::Template(source, "t").render(jinja::Value::from_json(ctx));
  } catch (const jinja::TemplateError& e) {
    return e.what();
  }
  return "";
}

TEST(Jinja, ErrorsSayWhatAndWhere) {
  EXPECT_NE(render_error("line one\n{% if x %}unclosed").find("line 2"), std::string::npos);
  EXPECT_NE(render_error("{% if x %}unclosed").find("endif"), std::string::npos);
  EXPECT_NE(render_error("ok\n  {{ 1 + }}").find("line 2, column"), std::string::npos);
  EXPECT_NE(render_error("{{ raise_exception('Only user and assistant roles') }}").find("Only user and assistant roles"), std::string::npos);
  EXPECT_NE(render_error("{{ x.y }}").find("'x' is undefined"), std::string::npos);
  EXPECT_NE(render_error("{{ [1] | nosuchfilter }}").find("nosuchfilter"), std::string::npos);
  EXPECT_NE(render_error("{% set l = [1] %}{{ l.append(2) }}").find("immutable"), std::string::npos);
  EXPECT_NE(render_error("{{ 'a' + 1 }}").find("unsupported operand"), std::string::npos);
  EXPECT_NE(render_error("{% frobnicate %}").find("unknown statement 'frobnicate'"), std::string::npos);
  EXPECT_NE(render_error("{{ 'unterminated }}").find("unterminated string"), std::string::npos);
}

// What the bad-input sweep and the fuzzer found a template could do to the process (issue 37): numbers beyond 64
// bits, lists and strings beyond memory, endless recursion, INT64_MIN // -1, \x without hex digits. Each is a
// template error that names its place, never an exception of the standard library, a crash or a trap.
TEST(Jinja, TemplatesCannotExhaustTheProcess) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{{ 1e999 }}", "number literal 1e999 is beyond a double"},
      {"{{ 99999999999999999999999 }}", "integer literal 99999999999999999999999 is beyond 64 bits"},
      {"{% for i in range(10**12) %}x{% endfor %}", "range() of 1000000000000 items is more than a template may make"},
      {"{{ 'x' * 100000000000 }}", "a string repeated 100000000000 times"},
      {"{{ 'x' | center(1000000000000) }}", "center width 1000000000000"},
      {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "calls nested deeper than 256"},
      {"{{ (-9223372036854775807 - 1) // -1 }}", "integer overflow in '//'"},
      {"{{ 9223372036854775807 + 1 }}", "integer overflow in '+'"},
      {"{{ '\\xZZ' }}", "needs 2 hex digits"},
      {"{{ 'a b'.split('') }}", "split(): empty separator"},  // a method's own error gets the call's line and column
      {"{{ 'a'.startswith(1) }}", "startswith(): argument must be a string"},
      // Found by fuzzing: a value of another kind where a method wanted a string was read through a null pointer,
      // and brackets nested without end exhausted the parser's stack.
      {"{{ 'a,b'.split(1) }}", "expected a str, got int"},
      {"{{ " + std::string(5000, '[') + " }}", "expressions or blocks nested deeper than 100"},
      {"{{ " + std::string(5000, '-') + "1 }}", "expressions or blocks nested deeper than 100"},
      // Found by fuzzing (the campaign of 2026-12-07): an empty subscript left a null index node, and '**' on
      // integers overflowed (and counted its exponent one by one: 1 ** 10**18 ran for ages).
      {"{{ m[] }}", "empty subscript '[]'"},
      {"{{ [1, 2][0 1] }}", "expected ':' or ']' in a subscript"},
      {"{{ 2 ** 106 }}", "integer overflow in '**'"},
      {"{{ (-3) ** 41 }}", "integer overflow in '**'"},
      {[] {
         std::string t;
         for (int i = 0; i < 300; ++i) t += "{% if 1 %}";
         return t;
       }(),
       "expressions or blocks nested deeper than 100"},
  };
  for (const auto& [src, want] : cases) {
    const std::string e = render_error(src);
    EXPECT_NE(e.find(want), std::string::npos) << src << " -> " << e;
    EXPECT_NE(e.find("line 1"), std::string::npos) << src << " -> " << e;
  }
  auto r = [](const std::string& src) { return jinja::Template(src).render(jinja::Value(jinja::Dict{})).text; };
  EXPECT_EQ(r("{{ (-9223372036854775807 - 1) % -1 }}"), "0");
  EXPECT_EQ(r("{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 3 ** 0 }} {{ 1 ** 1000000000000000000 }} {{ (-1) ** 999999999999999999 }} {{ 0 ** 7 }}"),
            "4611686018427387904 -9223372036854775808 1 1 -1 0");  // Python's values, at once
  EXPECT_EQ(r("{{ [1, 2, 3][1:] }} {{ [1, 2, 3][::2] }} {{ 'abc'[1] }}"), "[2, 3] [1, 3] b");
  EXPECT_EQ(r("{{ [1, 2].99999999999999999999 }}"), "");  // an index beyond 64 bits is undefined, as any missing item
}

// Whitespace control around raw blocks and +/- modifiers; expected strings are jinja2 3.1.2's output with
// trim_blocks and lstrip_blocks.
TEST(Jinja, WhitespaceControlLikeJinja2) {
  auto r = [](const std::string& src) { return jinja::Template(src).render(jinja::Value(jinja::Dict{})).text; };
  EXPECT_EQ(r("a\n{%- raw %}x{% endraw %}b"), "axb");
  EXPECT_EQ(r("a\n  {% raw %}x{% endraw %}b"), "a\nxb");
  EXPECT_EQ(r("a {% raw -%}  x  {%- endraw %} b"), "a x b");
  EXPECT_EQ(r("a {% raw %}\nx\n  {% endraw %}\nb"), "a \nx\nb");
  EXPECT_EQ(r("a {%- raw -%} x {%- endraw -%} b"), "axb");
  EXPECT_EQ(r("a\n  {%+ raw %}x{% endraw %}b"), "a\n  xb");
  EXPECT_EQ(r("x  {%- if 1 %}y{% endif %}"), "xy");
  EXPECT_EQ(r("{% if 1 +%}\nkeep{% endif %}\n"), "\nkeep");
  EXPECT_EQ(r("  {% if 1 %}\n  x\n  {% endif %}\n"), "  x\n");
}

TEST(Jinja, PythonFormatting) {
  auto r = [](const std::string& src) { return jinja::Template(src).render(jinja::Value(jinja::Dict{})).text; };
  EXPECT_EQ(r("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ -2.5e-10 }}"),
            "1.0 0.30000000000000004 1e+16 1000000000000000.0 0.0001 1e-05 -2.5e-10");
  EXPECT_EQ(r("{{ {'a': 'é', 'b': [1, 2.0, none, true]} | tojson }}"), "{\"a\": \"é\", \"b\": [1, 2.0, null, true]}");
  EXPECT_EQ(r("{{ 'tab\\there' | tojson }}"), "\"tab\\there\"");
  EXPECT_EQ(r("{{ \"q'uote\" }} {{ [\"q'\"] }}"), "q'uote [\"q'\"]");
}

}  // namespace
}  // namespace trl

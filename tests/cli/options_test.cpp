// The shared option layer (src/cli/options.h), one test per kind of option: booleans as HfArgumentParser reads them,
// None for optional values, repeated options, integer and number checks, choices, lists, --help defaults and YAML.
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include "cli/options.h"
#include "test_util.h"

namespace trl::cli {
namespace {

// Parses `args` (after the program name) into a fresh app holding one subcommand "cmd"; returns the error text
// (empty on success).
struct Harness {
  CLI::App app{"test", "trl"};
  CLI::App* cmd = app.add_subcommand("cmd", "test command");
  Options opts{cmd};
  std::string parse(std::vector<std::string> args) {
    args.insert(args.begin(), "cmd");
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    try {
      app.parse(reversed);
    } catch (const CLI::Error& e) {
      return e.what();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }
};

TEST(Options, BooleansReadLikeHfArgumentParser) {
  struct Case {
    std::vector<std::string> args;
    bool want;
  };
  const std::vector<Case> cases = {
      {{"--bf16"}, true},          {{"--bf16", "False"}, false}, {{"--bf16", "false"}, false}, {{"--bf16=false"}, false},
      {{"--bf16", "True"}, true},  {{"--bf16", "no"}, false},    {{"--bf16", "yes"}, true},    {{"--bf16", "0"}, false},
      {{"--bf16=1"}, true},        {{"--bf16", "FALSE"}, false}, {{}, true},                   // the default (true) stays
      {{"--bf16", "false", "--bf16"}, true},                                                    // the last one wins
      {{"--bf16", "--bf16", "false"}, false},
  };
  for (const Case& c : cases) {
    Harness h;
    bool bf16 = true, packing = false;
    h.opts.add("bf16", bf16, "bf16");
    h.opts.add("packing", packing, "packing");
    std::string joined;
    for (const auto& a : c.args) joined += a + " ";
    ASSERT_EQ(h.parse(c.args), "") << joined;
    EXPECT_EQ(bf16, c.want) << joined;
    EXPECT_FALSE(packing) << joined;
  }
  // Two booleans side by side: the second is a flag, not a value of the first.
  Harness h;
  bool packing = false, padding_free = false;
  h.opts.add("packing", packing, "p");
  h.opts.add("padding_free", padding_free, "pf");
  ASSERT_EQ(h.parse({"--packing", "--padding-free"}), "");
  EXPECT_TRUE(packing);
  EXPECT_TRUE(padding_free);
  Harness bad;
  bool x = false;
  bad.opts.add("packing", x, "p");
  EXPECT_NE(bad.parse({"--packing", "maybe"}).find("--packing: expected true or false"), std::string::npos);
}

// HfArgumentParser writes --no_<flag> for booleans that default to true; here every boolean has it, in both spellings.
// It counts as given (a YAML value does not override it) and is not listed by --help.
TEST(Options, EveryBooleanHasItsNegation) {
  struct Case {
    std::vector<std::string> args;
    bool bf16, packing;
    std::optional<bool> loss;
  };
  const std::vector<Case> cases = {
      {{"--no_bf16"}, false, false, std::nullopt},
      {{"--no-bf16", "--packing"}, false, true, std::nullopt},
      {{"--no_packing", "--no_completion_only_loss"}, true, false, false},
      {{"--no-completion-only-loss"}, true, false, false},
  };
  for (const Case& c : cases) {
    Harness h;
    bool bf16 = true, packing = false;
    std::optional<bool> loss;
    h.opts.add("bf16", bf16, "bf16");
    h.opts.add("packing", packing, "packing");
    h.opts.add("completion_only_loss", loss, "loss");
    ASSERT_EQ(h.parse(c.args), "") << c.args[0];
    EXPECT_EQ(bf16, c.bf16) << c.args[0];
    EXPECT_EQ(packing, c.packing) << c.args[0];
    EXPECT_EQ(loss, c.loss) << c.args[0];
  }
  Harness h;
  bool bf16 = true;
  h.opts.add("bf16", bf16, "bf16");
  ASSERT_EQ(h.parse({"--no_bf16"}), "");
  EXPECT_TRUE(h.opts.given("bf16"));
  test::TempDir dir;
  test::write_file(dir.file("c.yaml"), "bf16: true\n");
  h.opts.apply_yaml(dir.file("c.yaml"));
  EXPECT_FALSE(bf16) << "the command line's --no_bf16 wins over the YAML value";
  EXPECT_EQ(h.app.get_subcommand("cmd")->help().find("no_bf16"), std::string::npos);
  Harness both;
  bool b = true;
  both.opts.add("bf16", b, "bf16");
  EXPECT_NE(both.parse({"--bf16", "--no_bf16"}), "") << "a flag and its negation together are refused";
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--no_bf16=false"}, {"--no_bf16", "true"}}) {
    Harness v;
    bool x = true;
    v.opts.add("bf16", x, "bf16");
    EXPECT_NE(v.parse(args).find("--no_bf16 takes no value (it sets --bf16 false)"), std::string::npos) << args[0];
  }
}

// TRL's launcher keys in a YAML config (env, num_processes, accelerate_config, ...) are read by the launcher
// (launch_test.cpp), so the options pass over them; an old option name points to the new one, as a usage error.
TEST(Options, YamlPassesLauncherKeysAndNamesRenamedOptions) {
  test::TempDir dir;
  test::write_file(dir.file("c.yaml"), "env:\n  X: 1\nnum_processes: 2\naccelerate_config: zero2\nmixed_precision: bf16\nmax_steps: 3\n");
  Harness h;
  int64_t steps = 0;
  h.opts.add("max_steps", steps, "s");
  ASSERT_EQ(h.parse({}), "");
  h.opts.apply_yaml(dir.file("c.yaml"));
  EXPECT_EQ(steps, 3);
  test::write_file(dir.file("old.yaml"), "max_steps: 3\nmax_seq_length: 512\n");
  try {
    h.opts.apply_yaml(dir.file("old.yaml"));
    ADD_FAILURE() << "max_seq_length was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("old.yaml:2: unknown option 'max_seq_length'; use --max_length"), std::string::npos) << e.what();
  }
  EXPECT_EQ(renamed_option_hint("max-seq-length").rfind("--max_length", 0), 0u);
  EXPECT_EQ(renamed_option_hint("max_length"), "");
}

TEST(Options, OptionalValuesTakeNone) {
  Harness h;
  std::optional<int64_t> limit = 5;
  std::optional<bool> col = true;
  std::optional<std::string> name = "x";
  h.opts.add("save_total_limit", limit, "n");
  h.opts.add("completion_only_loss", col, "c");
  h.opts.add("hub_model_id", name, "h");
  ASSERT_EQ(h.parse({"--save_total_limit", "None", "--completion_only_loss", "None", "--hub_model_id=None"}), "");
  EXPECT_FALSE(limit.has_value());
  EXPECT_FALSE(col.has_value());
  EXPECT_FALSE(name.has_value());
  Harness g;
  std::optional<int64_t> l2;
  std::optional<bool> c2;
  g.opts.add("save_total_limit", l2, "n");
  g.opts.add("completion_only_loss", c2, "c");
  ASSERT_EQ(g.parse({"--save_total_limit", "3", "--completion_only_loss", "--save_total_limit", "7"}), "");
  EXPECT_EQ(l2, 7);  // repeated: the last value
  EXPECT_EQ(c2, true);
  // A plain (non-optional) integer does not take None.
  Harness p;
  int64_t steps = 1;
  p.opts.add("max_steps", steps, "s");
  EXPECT_NE(p.parse({"--max_steps", "None"}).find("'None' is not a number"), std::string::npos);
}

TEST(Options, IntegersSayWhatIsWrong) {
  struct Case {
    std::string value, want;
  };
  const std::vector<Case> cases = {
      {"0", "--max_new_tokens must be at least 1, got 0"},
      {"abc", "--max_new_tokens: 'abc' is not a number"},
      {"1.5", "--max_new_tokens: '1.5' is not an integer"},
      {"99999999999999999999", "--max_new_tokens: 99999999999999999999 is too large"},
      {"3000000000", "--max_new_tokens: 3000000000 is out of range (-2147483648 to 2147483647)"},
      {"", "--max_new_tokens"},
  };
  for (const Case& c : cases) {
    Harness h;
    int32_t n = 8;
    h.opts.add("max_new_tokens", n, "n").min(1);
    const std::string err = h.parse({"--max_new_tokens=" + c.value});
    EXPECT_NE(err.find(c.want), std::string::npos) << c.value << ": " << err;
    EXPECT_LT(err.size(), 120u) << err;  // a sentence, not a dump of the range
    EXPECT_EQ(n, 8);
  }
  Harness h;
  int64_t n = 0;
  uint64_t seed = 42;
  h.opts.add("max_new_tokens", n, "n").min(1);
  h.opts.add("seed", seed, "s");
  ASSERT_EQ(h.parse({"--max-new-tokens", "12", "--seed", "7"}), "");
  EXPECT_EQ(n, 12);
  EXPECT_EQ(seed, 7u);
  Harness neg;
  uint64_t s2 = 42;
  neg.opts.add("seed", s2, "s");
  EXPECT_NE(neg.parse({"--seed", "-1"}).find("--seed must be at least 0, got -1"), std::string::npos);
}

TEST(Options, NumbersAreFiniteAndInRange) {
  struct Case {
    std::string flag, value, want;
  };
  const std::vector<Case> cases = {
      {"--learning_rate", "inf", "--learning_rate must be a finite number, got inf"},
      {"--learning_rate", "nan", "--learning_rate must be a number, got nan"},
      {"--learning_rate", "fast", "--learning_rate: 'fast' is not a number"},
      {"--learning_rate", "-1e-5", "--learning_rate must be at least 0, got -1e-5"},
      {"--adam_beta1", "1.5", "--adam_beta1 must be in [0, 1), got 1.5"},
      {"--adam_beta1", "1", "--adam_beta1 must be in [0, 1), got 1"},
      {"--adam_epsilon", "0", "--adam_epsilon must be greater than 0, got 0"},
  };
  for (const Case& c : cases) {
    Harness h;
    double lr = 2e-5, beta1 = 0.9, eps = 1e-8;
    h.opts.add("learning_rate", lr, "lr").min(0);
    h.opts.add("adam_beta1", beta1, "b1").min(0).below(1);
    h.opts.add("adam_epsilon", eps, "eps").above(0);
    const std::string err = h.parse({c.flag, c.value});
    EXPECT_NE(err.find(c.want), std::string::npos) << c.flag << " " << c.value << ": " << err;
  }
  Harness h;
  double lr = 0;
  float t = 1;
  h.opts.add("learning_rate", lr, "lr").min(0);
  h.opts.add("temperature", t, "t").above(0);
  ASSERT_EQ(h.parse({"--learning_rate", "2.0e-5", "--temperature=0.7"}), "");
  EXPECT_DOUBLE_EQ(lr, 2e-5);
  EXPECT_FLOAT_EQ(t, 0.7f);
}

TEST(Options, ChoicesAndLists) {
  Harness h;
  std::string sched = "linear";
  std::vector<int32_t> eos;
  std::vector<std::string> stop;
  h.opts.add("lr_scheduler_type", sched, "s").choices({"linear", "cosine"});
  h.opts.add("eos_token_id", eos, "e").min(0);
  h.opts.add("stop", stop, "stop");
  ASSERT_EQ(h.parse({"--lr_scheduler_type", "cosine", "--eos_token_id", "1,2", "3", "--stop", "a, b", "--stop", "c"}), "");
  EXPECT_EQ(sched, "cosine");
  EXPECT_EQ(eos, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(stop, (std::vector<std::string>{"a, b", "c"}));
  Harness bad;
  std::string s2 = "linear";
  bad.opts.add("lr_scheduler_type", s2, "s").choices({"linear", "cosine"});
  EXPECT_NE(bad.parse({"--lr_scheduler_type", "wavy"}).find("'wavy' is not one of linear, cosine"), std::string::npos);
  Harness neg;
  std::vector<int32_t> e2;
  neg.opts.add("eos_token_id", e2, "e").min(0);
  EXPECT_NE(neg.parse({"--eos_token_id", "1,-5"}).find("--eos_token_id must be at least 0, got -5"), std::string::npos);
}

TEST(Options, HelpShowsEveryDefault) {
  Harness h;
  bool bf16 = true, packing = false;
  int64_t steps = -1;
  double lr = 2e-5;
  std::optional<int64_t> limit;
  std::optional<int64_t> new_tokens;
  std::string out = "trainer_output";
  h.opts.add("bf16", bf16, "bf16 compute");
  h.opts.add("packing", packing, "pack");
  h.opts.add("max_steps", steps, "steps");
  h.opts.add("learning_rate", lr, "lr");
  h.opts.add("save_total_limit", limit, "limit");
  h.opts.add("max_new_tokens", new_tokens, "n").default_text("generation_config.json's, else 256");
  h.opts.add("output_dir", out, "out");
  const std::string help = h.cmd->help();
  for (const char* want : {"bf16 compute [default: true]", "pack [default: false]", "steps [default: -1]", "lr [default: 2e-05]",
                           "limit [default: None]", "[default: generation_config.json's, else 256]", "out [default: trainer_output]",
                           "--max-new-tokens"})
    EXPECT_NE(help.find(want), std::string::npos) << want << "\n" << help;
}

// YAML shapes a config never has (found by fuzzing, issue 37): named with the file, the line and the key, never a
// yaml-cpp or JSON library exception; numbers that fit no integer stay numbers, inf and nan stay text.
TEST(Options, YamlShapesOfTheWrongKindAreNamed) {
  test::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"? [a, b]\n: 1\n", "c.yaml:1: an option name must be a plain word"},
      {"targets: [[a], b]\n", "c.yaml:1: 'targets' must be a list of plain values"},
      {"kwargs: {[a]: 1}\n", "c.yaml:1: 'kwargs': a mapping's keys must be plain words"},
      {"kwargs: {a: \x9f}\n", "c.yaml:1: 'kwargs' holds text that is not UTF-8"},
      // A mapping is JSON text only for an option that takes a JSON object; a plain text option refuses it (it
      // became the text '{"a":1}').
      {"name: {a: 1}\n", "c.yaml:1: 'name' must be a single value, not a mapping"},
      {"targets: {a: 1}\n", "c.yaml:1: 'targets' must be a single value or a list, not a mapping"},
  };
  for (const auto& [text, want] : bad) {
    test::write_file(dir.file("c.yaml"), text);
    Harness h;
    std::vector<std::string> targets;
    std::string kwargs, name;
    h.opts.add("targets", targets, "t");
    h.opts.add("kwargs", kwargs, "k").json_object();
    h.opts.add("name", name, "n");
    ASSERT_EQ(h.parse({}), "");
    const std::string e = test::error_of([&] { h.opts.apply_yaml(dir.file("c.yaml")); });
    EXPECT_NE(e.find(want), std::string::npos) << text << " -> " << e;
  }
  test::write_file(dir.file("c.yaml"), "kwargs: {x: inf, n: 99999999999999999999999, k: -12}\n");
  Harness h;
  std::string kwargs;
  h.opts.add("kwargs", kwargs, "k").json_object();
  ASSERT_EQ(h.parse({}), "");
  h.opts.apply_yaml(dir.file("c.yaml"));
  EXPECT_EQ(kwargs, R"({"x":"inf","n":9.999999999999999e+22,"k":-12})");  // the double nearest 1e23 - 1
}

TEST(Options, YamlGoesThroughTheSameParsers) {
  test::TempDir dir;
  test::write_file(dir.file("c.yaml"), "bf16: false\nmax_steps: 7\nsave_total_limit: null\nlearning_rate: 1.0e-4\neos_token_id: [1, 2]\n");
  Harness h;
  bool bf16 = true;
  int64_t steps = -1;
  std::optional<int64_t> limit = 3;
  double lr = 0;
  std::vector<int32_t> eos;
  h.opts.add("bf16", bf16, "b");
  h.opts.add("max_steps", steps, "s");
  h.opts.add("save_total_limit", limit, "l");
  h.opts.add("learning_rate", lr, "lr").min(0);
  h.opts.add("eos_token_id", eos, "e");
  ASSERT_EQ(h.parse({"--max_steps", "2"}), "");
  h.opts.apply_yaml(dir.file("c.yaml"));
  EXPECT_FALSE(bf16);
  EXPECT_EQ(steps, 2);  // the command line wins
  EXPECT_FALSE(limit.has_value());
  EXPECT_DOUBLE_EQ(lr, 1e-4);
  EXPECT_EQ(eos, (std::vector<int32_t>{1, 2}));
  // Bad values and unknown keys name the file, the line and the option; a folder is not a YAML file.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"max_steps: 1\nlearning_rate: inf\n", "c2.yaml:2: --learning_rate must be a finite number, got inf"},
      {"max_steps: 1\nlearning_rat: 1\n", "c2.yaml:2: unknown option 'learning_rat'"},
      {"bf16: maybe\n", "c2.yaml:1: --bf16: expected true or false"},
      {"max_steps: [1, 2]\n", "'max_steps' must be a single value"},
  };
  for (const auto& [text, want] : bad) {
    test::write_file(dir.file("c2.yaml"), text);
    Harness g;
    double lr2 = 0;
    int64_t steps2 = 0;
    bool b2 = false;
    g.opts.add("learning_rate", lr2, "lr");
    g.opts.add("max_steps", steps2, "s");
    g.opts.add("bf16", b2, "b");
    ASSERT_EQ(g.parse({}), "");
    try {
      g.opts.apply_yaml(dir.file("c2.yaml"));
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  Harness f;
  try {
    f.opts.apply_yaml(dir.path());
    ADD_FAILURE() << "a folder was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("is a folder"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trl::cli

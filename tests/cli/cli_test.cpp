// End-to-end checks of the `trl` binary: output formats, option spellings and error messages.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/cpu_features.h"
#include "test_util.h"

namespace trl {
namespace {

using json = nlohmann::json;

std::string trl_cmd(const std::string& args) { return std::string(TRL_BINARY) + " " + args; }

TEST(Cli, EnvJson) {
  std::string out;
  ASSERT_EQ(test::run_command(trl_cmd("env --json"), &out), 0) << out;
  const json j = json::parse(out);
  for (const char* key : {"version", "build_type", "isa", "devices", "device_memory", "visible_cores", "threads", "onednn", "cache_dir"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_TRUE(j["isa"] == "avx512bf16" || j["isa"] == "avx512" || j["isa"] == "avx2" || j["isa"] == "scalar");
  EXPECT_EQ(j["devices"][0], "cpu");
  ASSERT_EQ(test::run_command("TRL_VISIBLE_CORES=0 TRL_CACHE_DIR=/tmp/x " + trl_cmd("env --json"), &out), 0) << out;
  EXPECT_EQ(json::parse(out)["visible_cores"], "0");
  EXPECT_EQ(json::parse(out)["openmp_threads"], 1);  // the loops outside programs follow the visible cores too
  EXPECT_EQ(json::parse(out)["cache_dir"], "/tmp/x");
  EXPECT_NE(test::run_command("TRL_VISIBLE_CORES=0-9999 " + trl_cmd("env"), &out), 0);
  EXPECT_NE(out.find("TRL_VISIBLE_CORES"), std::string::npos) << out;
}

// `trl env` names the kernel family of each hot op; as on a CPU with AVX2 only (oneDNN capped at AVX2, this
// project's AVX-512 kernels off), bf16 GEMMs run on the packed GEMM, never on a oneDNN primitive the CPU lacks.
TEST(Cli, EnvNamesTheKernelOfEachHotOp) {
  std::string out;
  ASSERT_EQ(test::run_command(trl_cmd("env --json"), &out), 0) << out;
  const json k = json::parse(out).at("cpu_kernels");
  for (const char* op : {"gemm f32", "gemm bf16", "gemv (decoding)", "exp, softmax, swiglu", "row kernels", "adamw"})
    EXPECT_TRUE(k.contains(op) && !k[op].get<std::string>().empty()) << op << " in " << k.dump();
  if (!cpu_features().avx2) GTEST_SKIP() << "this CPU has no AVX2";
  ASSERT_EQ(test::run_command("ONEDNN_MAX_CPU_ISA=AVX2 TRL_NO_AVX512=1 " + trl_cmd("env --json"), &out), 0) << out;
  const json j = json::parse(out);
  EXPECT_EQ(j["isa"], "avx2");
  EXPECT_EQ(j["cpu_kernels"]["gemm f32"], "onednn (avx2)");
  EXPECT_EQ(j["cpu_kernels"]["gemm bf16"], "avx2 (packed, bf16 converted in the packing)");
  EXPECT_EQ(j["cpu_kernels"]["exp, softmax, swiglu"], "avx2");
  EXPECT_EQ(j["cpu_kernels"]["adamw"], "avx2");
  ASSERT_EQ(test::run_command("ONEDNN_MAX_CPU_ISA=AVX2 TRL_NO_AVX512=1 " + trl_cmd("env"), &out), 0) << out;
  EXPECT_NE(out.find("gemm bf16: avx2 (packed"), std::string::npos) << out;
}

TEST(Cli, InitModelThenScore) {
  test::TempDir dir;
  std::string out;
  // Dashes and underscores are both accepted.
  ASSERT_EQ(test::run_command(trl_cmd("init-model --preset tiny --dtype f32 --seed 3 --initializer-range 0.1 --out " + dir.path()), &out), 0) << out;
  ASSERT_EQ(test::run_command(trl_cmd("score --model " + dir.path() + " --ids 785,8585,49041,7506,5302"), &out), 0) << out;
  const json j = json::parse(out);
  EXPECT_EQ(j["n_tokens"], 5);
  EXPECT_EQ(j["n_scored"], 4);
  ASSERT_EQ(j["token_logprobs"].size(), 4u);
  double sum = 0;
  for (const auto& lp : j["token_logprobs"]) {
    EXPECT_LT(lp.get<double>(), 0.0);
    sum -= lp.get<double>();
  }
  EXPECT_NEAR(j["nll"].get<double>(), sum, 1e-9);
  EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(sum / 4), 1e-6 * std::exp(sum / 4));

  // JSON lines in, one JSON line out per input; the same sequence scores the same.
  test::write_file(dir.file("in.jsonl"), "{\"ids\": [785, 8585, 49041, 7506, 5302]}\n\n{\"ids\": [1, 2]}\n");
  ASSERT_EQ(test::run_command(trl_cmd("score --model_name_or_path " + dir.path() + " --jsonl " + dir.file("in.jsonl") + " --batch-size 2"), &out), 0)
      << out;
  std::vector<json> lines;
  size_t start = 0;
  for (size_t nl; (nl = out.find('\n', start)) != std::string::npos; start = nl + 1) lines.push_back(json::parse(out.substr(start, nl - start)));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NEAR(lines[0]["nll"].get<double>(), sum, 1e-6);
  EXPECT_EQ(lines[1]["n_scored"], 1);
}

TEST(Cli, ErrorsAreClear) {
  test::TempDir dir;
  std::string out;
  ASSERT_EQ(test::run_command(trl_cmd("init-model --preset tiny --out " + dir.path()), &out), 0) << out;
  struct Case {
    std::string args;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"score --model " + dir.path() + " --ids 1,x,3", "element 2 ('x')"},
      {"score --model " + dir.path() + " --ids 1,200000", "score: sequence 0 holds token id 200000, outside the vocabulary [0, 151936)"},
      {"score --model " + dir.path() + " --jsonl " + dir.file("badtext.jsonl"), "\"text\" must be a string"},
      {"tokenize --model " + dir.path() + " --chat", "--jsonl"},
      {"score --model " + dir.path() + " --jsonl " + dir.file("bad.jsonl"), "bad.jsonl:2"},
      {"score --model " + dir.path() + " --bogus 1", "--bogus"},
      {"score --model " + dir.path() + " --ids 1,2 --device cuda", "backend 'cuda' is not built into this binary (available: cpu, reference, or auto)"},
      {"generate --model " + dir.path() + " --prompt hi --device tpu", "unknown backend 'tpu' (available: cpu, reference, or auto)"},
      {"sft --model_name_or_path " + dir.path() + " --dataset_name " + dir.file("text.jsonl") + " --device cuda --output_dir " + dir.file("o"),
       "backend 'cuda' is not built into this binary (available: cpu, reference, or auto)"},
      {"score --model no/such-model --ids 1,2", "never downloads"},
      {"init-model --preset huge --out " + dir.file("x"), "preset"},
      {"init-model --vocab_size 300 --out " + dir.file("x"), "vocab_size 300 is out of range: a cut of the Qwen3 tokenizer has 512 to 151669 tokens"},
      {"frobnicate", "frobnicate"},
  };
  test::write_file(dir.file("bad.jsonl"), "{\"ids\": [1, 2]}\n{\"ids\": [1, 2\n");
  test::write_file(dir.file("badtext.jsonl"), "{\"text\": 5}\n");
  test::write_file(dir.file("text.jsonl"), "{\"text\": \"a b c\"}\n");
  for (const Case& c : cases) {
    EXPECT_NE(test::run_command(trl_cmd(c.args), &out), 0) << c.args;
    EXPECT_NE(out.find(c.expect), std::string::npos) << c.args << " ->\n" << out;
    EXPECT_EQ(out.find("terminate called"), std::string::npos) << out;
  }
}

// `init-model --vocab_size`: a model with a cut vocabulary and its tokenizer, which the commands use as they are.
TEST(Cli, InitModelWithACutVocabulary) {
  test::TempDir dir;
  std::string out;
  ASSERT_EQ(test::run_command(trl_cmd("init-model --preset tiny --vocab_size 1024 --out " + dir.path()), &out), 0) << out;
  const json config = json::parse(test::read_file(dir.file("config.json")));
  EXPECT_EQ(config["vocab_size"], 1024);
  EXPECT_EQ(config["eos_token_id"], 1024 - 26 + 2);  // <|im_end|>, the third special token
  test::write_file(dir.file("chat.jsonl"), "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"add_generation_prompt\": true}\n");
  ASSERT_EQ(test::run_command(trl_cmd("tokenize --jsonl --chat --model " + dir.path()) + " < " + dir.file("chat.jsonl"), &out), 0) << out;
  const json j = json::parse(out);
  EXPECT_EQ(j["ids"][0], 1024 - 26 + 1);  // <|im_start|>
  for (const json& id : j["ids"]) EXPECT_LT(id.get<int64_t>(), 1024);
  ASSERT_EQ(test::run_command(trl_cmd("generate --model " + dir.path() + " --prompt 'The French Bread' --max_new_tokens 4 --do_sample false"), &out), 0) << out;
  ASSERT_EQ(test::run_command(trl_cmd("score --model " + dir.path() + " --text 'The French Bread Law states'"), &out), 0) << out;
  EXPECT_TRUE(std::isfinite(json::parse(out)["nll"].get<double>())) << out;
}

TEST(Cli, TokenizeAndScoreText) {
  test::TempDir dir;
  std::string out;
  ASSERT_EQ(test::run_command(trl_cmd("init-model --preset tiny --out " + dir.path()), &out), 0) << out;
  ASSERT_EQ(test::run_command("printf 'The French Bread Law states' | " + trl_cmd("tokenize --model " + dir.path()), &out), 0) << out;
  EXPECT_EQ(out, "785,8585,49041,7506,5302\n");
  ASSERT_EQ(test::run_command("echo 785,8585,49041 | " + trl_cmd("tokenize --decode --model " + dir.path()), &out), 0) << out;
  EXPECT_EQ(out, "The French Bread\n");
  test::write_file(dir.file("chat.jsonl"),
                   "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"add_generation_prompt\": true, \"enable_thinking\": false}\n");
  ASSERT_EQ(test::run_command(trl_cmd("tokenize --jsonl --chat --model " + dir.path()) + " < " + dir.file("chat.jsonl"), &out), 0) << out;
  const json j = json::parse(out);
  EXPECT_EQ(j["text"], "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(j["ids"][0], 151644);
  // score --text tokenizes with the model's tokenizer: same result as the ids.
  ASSERT_EQ(test::run_command(trl_cmd("score --model " + dir.path() + " --text 'The French Bread Law states'"), &out), 0) << out;
  const double nll_text = json::parse(out)["nll"].get<double>();
  ASSERT_EQ(test::run_command(trl_cmd("score --model " + dir.path() + " --ids 785,8585,49041,7506,5302"), &out), 0) << out;
  EXPECT_DOUBLE_EQ(nll_text, json::parse(out)["nll"].get<double>());
}

TEST(Cli, HelpListsOptionsWithDefaults) {
  std::string out;
  ASSERT_EQ(test::run_command(trl_cmd("init-model --help"), &out), 0) << out;
  EXPECT_NE(out.find("--preset"), std::string::npos);
  EXPECT_NE(out.find("tiny"), std::string::npos);
  EXPECT_NE(out.find("--max-shard-size"), std::string::npos);
}

TEST(Cli, Demo) {
  test::TempDir dir;
  std::string out;
  // A short run (the full demo trains 100 steps; the learning itself is tested in tests/train/sft_test.cpp).
  ASSERT_EQ(test::run_command(trl_cmd("demo --max_steps 3 --out " + dir.file("m")), &out), 0) << out;
  EXPECT_NE(out.find("SFT on 16 chat examples"), std::string::npos) << out;
  EXPECT_NE(out.find("step    3  loss"), std::string::npos) << out;
  EXPECT_NE(out.find("of 16 answers exact"), std::string::npos) << out;
  for (const char* f : {"sft/model.safetensors", "sft/config.json", "sft/tokenizer.json", "sft/trainer_state.json", "sft/training_report.html",
                        "sft/log.jsonl", "base/model.safetensors"})
    EXPECT_TRUE(std::filesystem::exists(dir.file("m") + "/" + f)) << f;
}

}  // namespace
}  // namespace trl

namespace trl {
namespace {

TEST(Cli, GenerateStreamsBatchesAndChats) {
  test::TempDir dir;
  std::string out;
  ASSERT_EQ(test::run_command(std::string(TRL_BINARY) + " init-model --preset tiny --out " + dir.file("m"), &out), 0) << out;
  const std::string trl = std::string(TRL_BINARY);
  // Greedy: the same text twice, and the counters say two programs.
  std::string a, b;
  ASSERT_EQ(test::run_command(trl + " generate --model " + dir.file("m") + " --prompt 'Hello there' --max_new_tokens 6 --do_sample false --verbose 2>&1", &a), 0) << a;
  ASSERT_EQ(test::run_command(trl + " generate --model " + dir.file("m") + " --prompt 'Hello there' --max-new-tokens 6 --do-sample false", &b), 0) << b;
  EXPECT_NE(a.find("programs compiled 2"), std::string::npos) << a;
  EXPECT_NE(a.find(b.substr(0, b.size() - 1)), std::string::npos) << a << "\n---\n" << b;
  // A file of prompts in, one JSON line per completion out (written atomically).
  test::write_file(dir.file("p.jsonl"), "{\"prompt\": \"one\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"two\"}]}\n{\"ids\": [1, 2, 3]}\n");
  ASSERT_EQ(test::run_command(trl + " generate --model " + dir.file("m") + " --input " + dir.file("p.jsonl") + " --output " + dir.file("o.jsonl") +
                                  " --max_new_tokens 4 --num_return_sequences 2 --seed 5",
                              &out),
            0)
      << out;
  std::istringstream lines(test::read_file(dir.file("o.jsonl")));
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["completion_ids"].size(), 4u) << line;
    EXPECT_EQ(j["finish_reason"], "length") << line;
  }
  EXPECT_EQ(n, 6);
  // Chat: commands and turns from a pipe.
  ASSERT_EQ(test::run_command("printf 'hi\\n/system Be brief.\\nhello again\\n/clear\\n/exit\\nnot read\\n' | " + trl + " chat --model " + dir.file("m") +
                                  " --max_new_tokens 3 --verbose 2>&1",
                              &out),
            0)
      << out;
  EXPECT_NE(out.find("[system message set"), std::string::npos) << out;
  EXPECT_NE(out.find("[conversation cleared]"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n') >= 4, true) << out;
  // Errors name what is wrong.
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"generate --model " + dir.file("m") + " --prompt hi --bogus 1", "--bogus"},
           {"generate --model " + dir.file("m") + " --prompt ''", "--prompt"},
           {"generate --model " + dir.file("m") + " --prompt hi --max_new_tokens 50000", "max_position_embeddings"},
           {"generate --model " + dir.file("m") + " --prompt hi --cache_implementation paged", "cache_implementation"},
           {"generate --model " + dir.file("nothing") + " --prompt hi", "nothing"}}) {
    EXPECT_NE(test::run_command(trl + " " + args + " 2>&1", &out), 0) << args;
    EXPECT_NE(out.find(want), std::string::npos) << args << ": " << out;
  }
}

}  // namespace
}  // namespace trl

namespace trl {
namespace {

TEST(Cli, SftFromFlagsAndYaml) {
  test::TempDir dir;
  std::string out;
  const std::string trl = std::string(TRL_BINARY);
  ASSERT_EQ(test::run_command(trl + " init-model --preset tiny --out " + dir.file("m"), &out), 0) << out;
  test::write_file(dir.file("d.jsonl"), "{\"text\": \"one two three\"}\n{\"prompt\": \"a\", \"completion\": \" b c\"}\n");
  test::write_file(dir.file("sft.yaml"), "model_name_or_path: " + dir.file("m") + "\ndataset_name: " + dir.file("d.jsonl") + "\noutput_dir: " +
                                             dir.file("o") + "\nmax_steps: 3\nlearning_rate: 1.0e-3\nlr_scheduler_type: constant\n"
                                             "save_total_limit: null\nbf16: false\n");
  // The YAML gives everything; the command line overrides max_steps.
  ASSERT_EQ(test::run_command(trl + " sft --config " + dir.file("sft.yaml") + " --max_steps 2 --logging_steps 1 2>&1", &out), 0) << out;
  EXPECT_NE(out.find("\"global_step\": 2"), std::string::npos) << out;
  const auto state = nlohmann::json::parse(test::read_file(dir.file("o/trainer_state.json")));
  EXPECT_EQ(state["log_history"].size(), 2u);
  EXPECT_DOUBLE_EQ(state["log_history"][0]["learning_rate"].get<double>(), 1e-3);
  for (const char* f : {"o/model.safetensors", "o/config.json", "o/tokenizer.json", "o/generation_config.json", "o/log.jsonl", "o/training_report.html"})
    EXPECT_TRUE(std::filesystem::exists(dir.file(f))) << f;
  // Errors name the option, the file and the line.
  test::write_file(dir.file("bad.jsonl"), "{\"text\": \"fine\"}\n{\"text\": \n");
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"sft --config " + dir.file("sft.yaml") + " --learning_rat 1", "--learning_rat"},
           {"sft --config " + dir.file("sft.yaml") + " --lr_scheduler_type wavy", "lr_scheduler_type"},
           {"sft --config " + dir.file("sft.yaml") + " --pad_to_multiple_of twelve", "pad_to_multiple_of"},
           {"sft --config " + dir.file("sft.yaml") + " --dataset_name " + dir.file("bad.jsonl"), "bad.jsonl:2"},
           {"sft --config " + dir.file("nope.yaml"), "nope.yaml"},
           {"sft --dataset_name " + dir.file("d.jsonl"), "--model_name_or_path is required"}}) {
    EXPECT_NE(test::run_command(trl + " " + args + " 2>&1", &out), 0) << args;
    EXPECT_NE(out.find(want), std::string::npos) << args << ": " << out;
  }
}

// `trl dpo` as TRL's quickstart runs it: a YAML config with a command-line override; conversational pairs with an
// implicit prompt beside standard ones with an explicit prompt; a precomputed reference; bad rows and options name
// where they are.
TEST(Cli, DpoFromFlagsAndYaml) {
  test::TempDir dir;
  std::string out;
  const std::string trl = std::string(TRL_BINARY);
  ASSERT_EQ(test::run_command(trl + " init-model --preset tiny --out " + dir.file("m"), &out), 0) << out;
  test::write_file(dir.file("pairs.jsonl"),
                   "{\"prompt\": \"The sky is\", \"chosen\": \" blue\", \"rejected\": \" green\"}\n"
                   "{\"chosen\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello!\"}], "
                   "\"rejected\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Go away.\"}]}\n");
  test::write_file(dir.file("dpo.yaml"), "model_name_or_path: " + dir.file("m") + "\ndataset_name: " + dir.file("pairs.jsonl") + "\noutput_dir: " +
                                             dir.file("o") + "\nmax_steps: 3\nlearning_rate: 1.0e-3\nbeta: 0.2\nloss_type: [sigmoid, sft]\n"
                                             "loss_weights: [1.0, 0.5]\nper_device_train_batch_size: 2\nbf16: false\n");
  ASSERT_EQ(test::run_command(trl + " dpo --config " + dir.file("dpo.yaml") + " --max_steps 2 --logging_steps 1 --precompute_ref_log_probs 2>&1", &out), 0)
      << out;
  EXPECT_NE(out.find("\"global_step\": 2"), std::string::npos) << out;
  const auto state = nlohmann::json::parse(test::read_file(dir.file("o/trainer_state.json")));
  ASSERT_EQ(state["log_history"].size(), 2u);
  for (const char* key : {"loss", "rewards/chosen", "rewards/margins", "logps/rejected", "logits/chosen", "logits/rejected", "entropy"})
    EXPECT_TRUE(state["log_history"][0].contains(key)) << key;
  EXPECT_EQ(state["trl_cpp"]["method"], "DPO");
  // TR-DPO and LD-DPO options from the command line (a live reference: sync_ref_model cannot precompute).
  ASSERT_EQ(test::run_command(trl + " dpo --config " + dir.file("dpo.yaml") + " --loss_type sigmoid --loss_weights 1 --max_steps 2 --sync_ref_model true "
                                  "--ref_model_sync_steps 1 --ref_model_mixup_alpha 0.9 --ld_alpha 0.5 --auto_find_batch_size true --output_dir " +
                                  dir.file("tr") + " 2>&1", &out), 0)
      << out;
  for (const char* f : {"o/model.safetensors", "o/config.json", "o/tokenizer.json", "o/log.jsonl", "o/training_report.html"})
    EXPECT_TRUE(std::filesystem::exists(dir.file(f))) << f;
  test::write_file(dir.file("bad.jsonl"), "{\"prompt\": \"a\", \"chosen\": \" b\", \"rejected\": \" c\"}\n{\"prompt\": \"a\", \"chosen\": \" b\"}\n");
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"dpo --config " + dir.file("dpo.yaml") + " --dataset_name " + dir.file("bad.jsonl"), "bad.jsonl:2"},
           {"dpo --config " + dir.file("dpo.yaml") + " --loss_type wavy", "unknown loss type 'wavy'"},
           {"dpo --config " + dir.file("dpo.yaml") + " --beta 0", "--beta"},
           {"dpo --config " + dir.file("dpo.yaml") + " --ld_alpha 2", "ld_alpha must be in [0, 1]"},
           {"dpo --config " + dir.file("dpo.yaml") + " --sync_ref_model true --precompute_ref_log_probs true", "sync_ref_model needs a live reference"},
           {"dpo --config " + dir.file("dpo.yaml") + " --loss_weights 1", "loss_weights: 1 weights for 2 loss types"},
           {"dpo --config " + dir.file("dpo.yaml") + " --ref_model_name_or_path " + dir.file("none"), "none"},
           {"dpo --dataset_name " + dir.file("pairs.jsonl"), "--model_name_or_path is required"}}) {
    EXPECT_NE(test::run_command(trl + " " + args + " 2>&1", &out), 0) << args;
    EXPECT_NE(out.find(want), std::string::npos) << args << ": " << out;
  }
}

// `trl grpo` and `trl rloo` from a TRL-style YAML file (reward_funcs as a list, chat_template_kwargs as a mapping,
// conversational prompts) and from flags (an exec: reward); bad options and rewards as errors.
TEST(Cli, GrpoAndRlooFromFlagsAndYaml) {
  test::TempDir dir;
  std::string out;
  const std::string trl = std::string(TRL_BINARY);
  ASSERT_EQ(test::run_command(trl + " init-model --preset tiny --out " + dir.file("m"), &out), 0) << out;
  test::write_file(dir.file("prompts.jsonl"),
                   "{\"prompt\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], \"solution\": \"4\"}\n"
                   "{\"prompt\": [{\"role\": \"user\", \"content\": \"What is 3+3?\"}], \"solution\": \"6\"}\n");
  test::write_file(dir.file("grpo.yaml"), "model_name_or_path: " + dir.file("m") + "\ndataset_name: " + dir.file("prompts.jsonl") +
                                              "\noutput_dir: " + dir.file("o") +
                                              "\nreward_funcs: [accuracy_reward, think_format_reward]\nreward_weights: [1.0, 0.5]\n"
                                              "chat_template_kwargs: {enable_thinking: false}\nper_device_train_batch_size: 4\nnum_generations: 4\n"
                                              "max_completion_length: 8\nmax_steps: 2\nlogging_steps: 1\nbf16: false\nbeta: 0.04\nlog_completions: true\n"
                                              "use_vllm: false\n");
  ASSERT_EQ(test::run_command(trl + " grpo --config " + dir.file("grpo.yaml") + " --loss_type grpo 2>&1", &out), 0) << out;
  EXPECT_NE(out.find("\"global_step\": 2"), std::string::npos) << out;
  EXPECT_NE(out.find("\"generation_programs_compiled\": 2"), std::string::npos) << out;
  const auto state = nlohmann::json::parse(test::read_file(dir.file("o/trainer_state.json")));
  EXPECT_EQ(state["trl_cpp"]["method"], "GRPO");
  for (const char* key : {"rewards/accuracy_reward/mean", "rewards/think_format_reward/mean", "reward", "kl", "entropy", "completions/mean_length",
                          "clip_ratio/region_mean", "time/generation"})
    EXPECT_TRUE(state["log_history"][0].contains(key)) << key;
  EXPECT_TRUE(std::filesystem::exists(dir.file("o/completions.jsonl")));
  // log_completions writes every row with the dataset's prompt (the conversation, as the reward functions see it).
  EXPECT_NE(test::read_file(dir.file("o/completions.jsonl")).find("What is 2+2?"), std::string::npos);
  const std::string script = "exec:while read -r l; do echo '[1, 0, 0.5, null]'; done";
  ASSERT_EQ(test::run_command(trl + " rloo --model_name_or_path " + dir.file("m") + " --dataset_name " + dir.file("prompts.jsonl") +
                                  " --output_dir " + dir.file("r") + " --reward_funcs \"" + script +
                                  "\" --per_device_train_batch_size 4 --num_generations 4 --max_completion_length 8 --max_steps 1 --bf16 false "
                                  "--reward_clip_range -1 1 --normalize_advantages 2>&1",
                              &out),
            0)
      << out;
  EXPECT_EQ(nlohmann::json::parse(test::read_file(dir.file("r/trainer_state.json")))["trl_cpp"]["method"], "RLOO");
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"grpo --config " + dir.file("grpo.yaml") + " --reward_funcs rewardz", "unknown reward function 'rewardz'"},
           {"grpo --config " + dir.file("grpo.yaml") + " --num_generations 3", "multiple of num_generations (3)"},
           {"grpo --config " + dir.file("grpo.yaml") + " --loss_type ppo", "--loss_type"},
           {"grpo --config " + dir.file("grpo.yaml") + " --chat_template_kwargs '{bad'", "--chat_template_kwargs '{bad': not valid JSON at line 1, column 2: unexpected 'b' after '{'"},
           {"grpo --config " + dir.file("grpo.yaml") + " --reward_weights 1", "reward_weights has 1 values for 2 reward functions"},
           {"rloo --model_name_or_path " + dir.file("m") + " --dataset_name " + dir.file("prompts.jsonl") + " --reward_funcs length:5 --reward_clip_range 1",
            "--reward_clip_range takes two numbers"},
           {"grpo --model_name_or_path " + dir.file("m") + " --dataset_name " + dir.file("prompts.jsonl"), "--reward_funcs"}}) {
    EXPECT_NE(test::run_command(trl + " " + args + " 2>&1", &out), 0) << args;
    EXPECT_NE(out.find(want), std::string::npos) << args << ": " << out;
  }
}

// `trl kto` on a paired file (unpaired as TRL does) and on unpaired rows; TRL's rules as errors.
TEST(Cli, KtoFromFlags) {
  test::TempDir dir;
  std::string out;
  const std::string trl = std::string(TRL_BINARY);
  ASSERT_EQ(test::run_command(trl + " init-model --preset tiny --out " + dir.file("m"), &out), 0) << out;
  test::write_file(dir.file("pairs.jsonl"), "{\"prompt\": \"The sky is\", \"chosen\": \" blue\", \"rejected\": \" green\"}\n"
                                            "{\"prompt\": \"Grass is\", \"chosen\": \" green\", \"rejected\": \" blue\"}\n");
  test::write_file(dir.file("rows.jsonl"), "{\"prompt\": \"The sky is\", \"completion\": \" blue\", \"label\": true}\n"
                                           "{\"prompt\": \"Grass is\", \"completion\": \" blue\", \"label\": false}\n"
                                           "{\"prompt\": \"Snow is\", \"completion\": \" white\", \"label\": \"yes\"}\n");
  const std::string base = trl + " kto --model_name_or_path " + dir.file("m") + " --output_dir " + dir.file("o") +
                           " --max_steps 2 --logging_steps 1 --per_device_train_batch_size 2 --bf16 false --report false";
  ASSERT_EQ(test::run_command(base + " --dataset_name " + dir.file("pairs.jsonl") + " 2>&1", &out), 0) << out;
  const auto state = nlohmann::json::parse(test::read_file(dir.file("o/trainer_state.json")));
  ASSERT_EQ(state["log_history"].size(), 2u);
  EXPECT_EQ(state["trl_cpp"]["method"], "KTO");
  EXPECT_EQ(state["trl_cpp"]["train_items"], 4);  // 2 pairs -> 4 rows
  // Unpaired in TRL's order and read sequentially: step 1 sees the two chosen rows, step 2 the two rejected ones.
  for (const char* key : {"loss", "kl", "entropy", "rewards/chosen"}) EXPECT_TRUE(state["log_history"][0].contains(key)) << key;
  EXPECT_FALSE(state["log_history"][0].contains("rewards/rejected"));
  EXPECT_TRUE(state["log_history"][1].contains("rewards/rejected"));
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {" --dataset_name " + dir.file("rows.jsonl"), "rows.jsonl:3: \"label\" must be true or false"},
           {" --dataset_name " + dir.file("pairs.jsonl") + " --per_device_train_batch_size 1", "per_device_train_batch_size must be > 1"},
           {" --dataset_name " + dir.file("pairs.jsonl") + " --train_sampling_strategy random", "needs train_sampling_strategy sequential"},
           {" --dataset_name " + dir.file("pairs.jsonl") + " --loss_type kto_pair", "--loss_type"}}) {
    EXPECT_NE(test::run_command(base + args + " 2>&1", &out), 0) << args;
    EXPECT_NE(out.find(want), std::string::npos) << args << ": " << out;
  }
}

// `trl reward` from a causal LM (a new head) to a sequence-classification folder, then `trl score` with it; a
// checkpoint with two labels is refused.
// A tiny model (m) and two preference pairs with margins (pairs.jsonl) for `trl reward`.
struct RewardFixture {
  test::TempDir dir;
  const std::string trl = TRL_BINARY;
  RewardFixture() {
    std::string out;
    EXPECT_EQ(test::run_command(trl + " init-model --preset tiny --out " + dir.file("m"), &out), 0) << out;
    test::write_file(dir.file("pairs.jsonl"), "{\"prompt\": \"The sky is\", \"chosen\": \" blue\", \"rejected\": \" green\", \"margin\": 1.0}\n"
                                              "{\"prompt\": \"Grass is\", \"chosen\": \" green\", \"rejected\": \" blue\", \"margin\": 0.5}\n");
  }
  // `trl reward` of 2 steps from m into `out` with `extra` options; returns whether it succeeded, its output in `log`.
  bool train(const std::string& out, const std::string& extra, std::string* log) const {
    return test::run_command(trl + " reward --model_name_or_path " + dir.file("m") + " --dataset_name " + dir.file("pairs.jsonl") + " --output_dir " +
                                 dir.file(out) + " --max_steps 2 --logging_steps 1 --per_device_train_batch_size 2 --bf16 false --report false " +
                                 extra + " 2>&1",
                             log) == 0;
  }
};

TEST(Cli, RewardThenScoreWithTheRewardModel) {
  const RewardFixture f;
  const test::TempDir& dir = f.dir;
  const std::string& trl = f.trl;
  std::string out;
  ASSERT_TRUE(f.train("rm", "--center_rewards_coefficient 0.01", &out)) << out;
  const auto config = nlohmann::json::parse(test::read_file(dir.file("rm/config.json")));
  EXPECT_EQ(config["architectures"][0], "Qwen3ForSequenceClassification");
  const auto state = nlohmann::json::parse(test::read_file(dir.file("rm/trainer_state.json")));
  for (const char* key : {"loss", "accuracy", "margin", "min_reward", "mean_reward", "max_reward"}) EXPECT_TRUE(state["log_history"][0].contains(key)) << key;
  ASSERT_EQ(test::run_command(trl + " score --model " + dir.file("rm") + " --text 'The sky is blue<|im_end|>' 2>&1", &out), 0) << out;
  const auto scored = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_TRUE(scored.contains("reward") && std::isfinite(scored["reward"].get<double>())) << out;
  // Resuming the reward run from its saved folder (a sequence-classification checkpoint) keeps its head.
  ASSERT_EQ(test::run_command(trl + " reward --model_name_or_path " + dir.file("rm") + " --dataset_name " + dir.file("pairs.jsonl") + " --output_dir " +
                                  dir.file("rm2") + " --max_steps 1 --per_device_train_batch_size 2 --bf16 false --report false 2>&1",
                              &out),
            0)
      << out;
  EXPECT_NE(out.find("its score head"), std::string::npos) << out;
  auto two = config;
  two["id2label"] = {{"0", "LABEL_0"}, {"1", "LABEL_1"}};
  test::write_file(dir.file("rm/config.json"), two.dump(2));
  EXPECT_NE(test::run_command(trl + " reward --model_name_or_path " + dir.file("rm") + " --dataset_name " + dir.file("pairs.jsonl") + " 2>&1", &out), 0);
  EXPECT_NE(out.find("field 'id2label' has 2 labels"), std::string::npos) << out;
}

// A reward adapter (trl reward --use_peft) merges into a reward model that keeps its trained head (issue 37, defect
// 2), scores as the adapter does, and serves as GRPO's reward as the adapter folder itself does; a plain causal LM is
// refused as a reward model (defect 1); merge-adapter never writes into the base's or the adapter's folder (defect 3).
TEST(Cli, RewardAdapterMergesIntoARewardModel) {
  const RewardFixture f;
  const test::TempDir& dir = f.dir;
  const std::string& trl = f.trl;
  std::string out;
  ASSERT_TRUE(f.train("ra", "--use_peft --lora_target_modules all-linear --learning_rate 1e-2", &out)) << out;
  const std::string text = " --text 'The sky is blue<|im_end|>' 2>&1";
  auto reward = [&](const std::string& model) {
    std::string o;
    EXPECT_EQ(test::run_command(trl + " score --model " + model + text, &o), 0) << o;
    const auto j = nlohmann::json::parse(o.substr(o.find('{')));
    return j.value("reward", std::nan(""));
  };
  const std::string before = test::read_file(dir.file("m/model.safetensors"));
  ASSERT_EQ(test::run_command(trl + " merge-adapter --adapter " + dir.file("ra") + " --output_dir " + dir.file("merged") + " 2>&1", &out), 0) << out;
  const auto config = nlohmann::json::parse(test::read_file(dir.file("merged/config.json")));
  EXPECT_EQ(config["architectures"][0], "Qwen3ForSequenceClassification");
  const double adapter = reward(dir.file("ra")), merged = reward(dir.file("merged"));
  EXPECT_TRUE(std::isfinite(adapter) && std::fabs(adapter - merged) <= 1e-4 * std::max(1.0, std::fabs(adapter))) << adapter << " vs " << merged;
  // The adapter folder (no config.json) and the merged folder are GRPO rewards; the causal LM is not.
  test::write_file(dir.file("prompts.jsonl"), "{\"prompt\": \"The sky is\"}\n{\"prompt\": \"Grass is\"}\n");
  const std::string grpo = trl + " grpo --model_name_or_path " + dir.file("m") + " --dataset_name " + dir.file("prompts.jsonl") +
                           " --max_steps 1 --per_device_train_batch_size 2 --num_generations 2 --max_completion_length 4 --bf16 false --report false";
  for (const std::string& rm : {dir.file("ra"), dir.file("merged")})
    EXPECT_EQ(test::run_command(grpo + " --output_dir " + dir.file("g") + " --reward_funcs " + rm + " 2>&1", &out), 0) << rm << "\n" << out;
  EXPECT_NE(test::run_command(grpo + " --output_dir " + dir.file("g2") + " --reward_funcs " + dir.file("m") + " 2>&1", &out), 0);
  EXPECT_NE(out.find("is not a reward model: its config.json names Qwen3ForCausalLM"), std::string::npos) << out;
  // Into the base's folder or the adapter's: refused, nothing written.
  EXPECT_NE(test::run_command(trl + " merge-adapter --adapter " + dir.file("ra") + " --output_dir " + dir.file("m") + " 2>&1", &out), 0);
  EXPECT_NE(out.find("is the base model's folder"), std::string::npos) << out;
  EXPECT_NE(test::run_command(trl + " merge-adapter --adapter " + dir.file("ra") + " --output_dir " + dir.file("ra") + "/ 2>&1", &out), 0);
  EXPECT_NE(out.find("is the adapter's folder"), std::string::npos) << out;
  EXPECT_EQ(test::read_file(dir.file("m/model.safetensors")), before);
  EXPECT_FALSE(std::filesystem::exists(dir.file("ra/model.safetensors")));
}

}  // namespace
}  // namespace trl

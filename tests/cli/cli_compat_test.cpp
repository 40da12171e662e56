// The `trl` binary as a new user meets it: TRL command lines pasted unchanged, the README's command lines, a chat
// that survives errors and Ctrl-C, and inputs that are wrong in ways that must be named (file, line, field).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <cctype>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "trl/io/safetensors.h"

namespace trl {
namespace {

using json = nlohmann::json;

const std::string kTrl = TRL_BINARY;

int run(const std::string& args, std::string* out) { return test::run_command(kTrl + " " + args + " 2>&1", out); }

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

// A tiny model with the cut vocabulary (its generation_config.json names no max_new_tokens, like many real ones) and
// a small chat dataset.
struct Fixture {
  test::TempDir dir;
  std::string model = dir.file("m"), data = dir.file("chat.jsonl"), folder = dir.file("ds");  // folder: train and test splits
  Fixture() {
    std::string out;
    EXPECT_EQ(run(fmt::format("init-model --preset tiny --vocab_size {} --out {}", test::kCutVocab, model), &out), 0) << out;
    std::string rows;
    for (const char* q : {"What color is the sky?", "Who wrote Hamlet?", "What is 2 plus 2?", "Name a fruit."})
      rows += json{{"messages", {{{"role", "user"}, {"content", q}}, {{"role", "assistant"}, {"content", "An answer."}}}}}.dump() + "\n";
    test::write_file(data, rows);
    std::filesystem::create_directories(folder);
    test::write_file(folder + "/train.jsonl", rows);
    test::write_file(folder + "/test.jsonl", rows);
  }
  void set_config(const std::string& key, const json& value) const {
    const std::string p = model + "/config.json";
    json c = json::parse(test::read_file(p));
    c[key] = value;
    test::write_file(p, c.dump(2));
  }
};

// The reproduction: the second question ended the chat (max_length 20 left no room for a longer prompt).
TEST(CliCompat, ChatAnswersEveryQuestionWithTheDefaultLength) {
  Fixture f;
  std::string out;
  ASSERT_EQ(test::run_command("printf 'What color is the sky?\\nWho wrote Hamlet?\\n' | " + kTrl + " chat --model " + f.model +
                                  " --do_sample false --enable_thinking false --verbose 2>&1",
                              &out),
            0)
      << out;
  EXPECT_EQ(count(out, "new tokens in"), 2u) << out;
  EXPECT_EQ(out.find("error"), std::string::npos) << out;
  // generate --chat with a prompt longer than 20 tokens.
  ASSERT_EQ(run("generate --model " + f.model + " --chat --do_sample false --max_new_tokens 4 --prompt 'Please tell me, in as many words as you like, "
                "why the sky looks blue on a clear day and red at sunset.'",
                &out),
            0)
      << out;
  ASSERT_EQ(run("generate --model " + f.model + " --chat --do_sample false --verbose --prompt 'Please tell me, in as many words as you like, "
                "why the sky looks blue on a clear day and red at sunset.'",
                &out),
            0)
      << out;
  // "[trl] ... N new tokens in ..." (read by hand: GCC 12's std::regex trips -Wmaybe-uninitialized under ASan)
  const size_t at = out.find(" new tokens in");
  ASSERT_NE(at, std::string::npos) << out;
  size_t from = at;
  while (from > 0 && std::isdigit(static_cast<unsigned char>(out[from - 1]))) --from;
  ASSERT_LT(from, at) << out;
  EXPECT_GT(std::stoi(out.substr(from, at - from)), 20) << "the 256-token default, not max_length 20: " << out;
}

TEST(CliCompat, AnErrorInsideATurnDoesNotEndTheChat) {
  Fixture f;
  f.set_config("max_position_embeddings", 256);
  std::string longq;
  for (int i = 0; i < 150; ++i) longq += "word ";
  std::string out;
  ASSERT_EQ(test::run_command("printf 'Hi\\n" + longq + "\\nWho wrote Hamlet?\\n' | " + kTrl + " chat --model " + f.model +
                                  " --do_sample false --max_new_tokens 16 --verbose 2>&1",
                              &out),
            0)
      << out;
  EXPECT_NE(out.find("max_position_embeddings (256)"), std::string::npos) << out;
  EXPECT_NE(out.find("not added to the conversation"), std::string::npos) << out;
  EXPECT_EQ(count(out, "new tokens in"), 2u) << "the first and third questions are answered: " << out;
}

TEST(CliCompat, CtrlCStopsTheAnswerNotTheChat) {
  Fixture f;
  // A long answer (no EOS id the model produces), interrupted twice while it streams; then /exit ends the session
  // normally. Each wait is bounded (60 s) and reports which step did not happen.
  const std::string d = f.dir.path();
  test::write_file(f.dir.file("ctrlc.sh"),
                   "cd " + d + " && mkfifo in\n" + kTrl + " chat --model " + f.model +
                       " --do_sample false --max_new_tokens 30000 --eos_token_id " + std::to_string(test::kCutVocab - 1) + " < in > out 2>&1 &\n"
                       "pid=$!\n"
                       "exec 3> in\n"
                       "size() { wc -c < out; }\n"
                       "grow() { local from=$1; for i in $(seq 600); do [ $(size) -gt $((from + 40)) ] && return 0; sleep 0.1; done; return 1; }\n"
                       "stopped() { for i in $(seq 600); do [ \"$(grep -c 'answer stopped' out)\" -ge $1 ] && return 0; sleep 0.1; done; return 1; }\n"
                       "for i in $(seq 600); do grep -q 'trl chat:' out && break; sleep 0.1; done\n"
                       "n=$(size); echo 'first question' >&3; grow $n || echo TIMEOUT-first-answer; kill -INT $pid; stopped 1 || echo TIMEOUT-first-stop\n"
                       "n=$(size); echo 'second question' >&3; grow $n || echo TIMEOUT-second-answer; kill -INT $pid; stopped 2 || echo TIMEOUT-second-stop\n"
                       "echo /exit >&3; exec 3>&-\n"
                       "wait $pid; echo rc=$?\n"
                       "cat out\n");
  std::string out;
  test::run_command("bash " + f.dir.file("ctrlc.sh"), &out);
  EXPECT_EQ(out.find("TIMEOUT"), std::string::npos) << out;
  EXPECT_EQ(count(out, "[answer stopped]"), 2u) << out;
  EXPECT_NE(out.find("rc=0"), std::string::npos) << out;
}

TEST(CliCompat, SamplingWithoutASeedDiffersFromRunToRun) {
  Fixture f;
  std::string a, b, c, d;
  const std::string args = "generate --model " + f.model + " --prompt 'Once upon a time' --do_sample true --temperature 1.5 --top_k 0 --max_new_tokens 24";
  ASSERT_EQ(test::run_command(kTrl + " " + args, &a), 0) << a;
  ASSERT_EQ(test::run_command(kTrl + " " + args, &b), 0) << b;
  EXPECT_NE(a, b) << "two unseeded runs sampled the same 24 tokens";
  ASSERT_EQ(test::run_command(kTrl + " " + args + " --seed 3", &c), 0) << c;
  ASSERT_EQ(test::run_command(kTrl + " " + args + " --seed 3", &d), 0) << d;
  EXPECT_EQ(c, d);
}

// TRL's documented command lines (trl sft ...), with our paths and a step limit, run unchanged.
TEST(CliCompat, TrlCommandLinesRunUnchanged) {
  Fixture f;
  const std::string base = "sft --model_name_or_path " + f.model + " --dataset_name " + f.data + " --max_steps 2 --logging_steps 1";
  const std::vector<std::string> lines = {
      // TRL's SFT script example (docs: "sft.py"), eval and hub push included.
      "sft --model_name_or_path " + f.model + " --dataset_name " + f.folder + " --max_steps 2 --logging_steps 1" +
          " --learning_rate 2.0e-5 --num_train_epochs 1 --packing --per_device_train_batch_size 2 --gradient_accumulation_steps 8"
          " --gradient_checkpointing --eos_token '<|im_end|>' --eval_strategy steps --eval_steps 100 --output_dir " + f.dir.file("o1") + " --push_to_hub",
      // HfArgumentParser booleans with values, and a repeated flag.
      base + " --bf16 False --packing false --gradient_checkpointing True --output_dir " + f.dir.file("o2") + " --max_steps 1 --max_steps 2",
      base + " --packing --padding_free --bf16=false --report_to none --torch_dtype float32 --attn_implementation eager --output_dir " + f.dir.file("o3"),
      base + " --save_total_limit None --completion_only_loss None --seed 7 --run_name x --logging_dir logs --output_dir " + f.dir.file("o4"),
  };
  for (const std::string& line : lines) {
    std::string out;
    ASSERT_EQ(run(line, &out), 0) << line << "\n" << out;
    EXPECT_NE(out.find("\"global_step\": 2"), std::string::npos) << line << "\n" << out;
  }
  // A TRL YAML config (keys as in TRL's docs), with null and booleans written as YAML does.
  test::write_file(f.dir.file("sft.yaml"), "model_name_or_path: " + f.model + "\ndataset_name: " + f.data +
                                               "\nlearning_rate: 2.0e-5\nnum_train_epochs: 1\npacking: true\nbf16: false\n"
                                               "gradient_checkpointing: true\nreport_to: none\nsave_total_limit: null\nmax_steps: 2\n"
                                               "output_dir: " + f.dir.file("o5") + "\n");
  std::string out;
  ASSERT_EQ(run("sft --config " + f.dir.file("sft.yaml"), &out), 0) << out;
  EXPECT_NE(out.find("\"global_step\": 2"), std::string::npos) << out;
  // TRL's LoRA command line trains and saves a PEFT adapter; DoRA is named as missing, not silently ignored.
  ASSERT_EQ(run(base + " --use_peft --lora_r 32 --lora_alpha 16 --lora_target_modules q_proj k_proj --output_dir " + f.dir.file("o6"), &out), 0) << out;
  const nlohmann::json adapter = nlohmann::json::parse(test::read_file(f.dir.file("o6/adapter_config.json")));
  EXPECT_EQ(adapter["r"], 32);
  EXPECT_EQ(adapter["lora_alpha"], 16);
  EXPECT_EQ(adapter["target_modules"], nlohmann::json({"q_proj", "k_proj"}));
  EXPECT_NE(run(base + " --use_peft --use_dora --output_dir " + f.dir.file("o7"), &out), 0);
  EXPECT_NE(out.find("--use_dora"), std::string::npos) << out;
}

// Issue 38: what TRL's documentation writes that trl.cpp did not take. Every usage error exits 2 (argparse's code),
// with the project's words; an error of the run itself exits 1.
TEST(CliCompat, UsageErrorsExitTwoAndSayWhatToUse) {
  Fixture f;
  const std::string base = "sft --model_name_or_path " + f.model + " --dataset_name " + f.data + " --max_steps 1 --output_dir " + f.dir.file("o");
  test::write_file(f.dir.file("unknown.yaml"), "model_name_or_path: " + f.model + "\ndataset_name: " + f.data + "\nmax_seq_length: 64\n");
  test::write_file(f.dir.file("env.yaml"), "env: [1, 2]\n");
  struct Case {
    std::string args, want;
  };
  const std::vector<Case> cases = {
      {"sft --model_name_or_path " + f.model, "--dataset_name is required"},
      {"grpo --model_name_or_path " + f.model + " --dataset_name " + f.data, "--reward_funcs (or --reward_model_name_or_path) is required"},
      {"sft --config " + f.dir.file("unknown.yaml"), "unknown.yaml:3: unknown option 'max_seq_length'; use --max_length"},
      {"sft --config " + f.dir.file("env.yaml"), "env.yaml:1: env must be a mapping of VARIABLE: value"},
      {base + " --max_seq_length 64", "unknown option --max_seq_length: use --max_length"},
      {base + " --evaluation_strategy steps", "use --eval_strategy"},
      {base + " --load_in_4bit", "--load_in_4bit: quantized base weights (QLoRA, bitsandbytes) are not implemented"},
      {base + " --load_in_8bit --use_peft", "train a LoRA adapter on the bf16 model instead"},
      {base + " --packing --packing_strategy wrapped", "--packing_strategy wrapped: trl.cpp packs with bfd only"},
      {base + " --bf16 --no_bf16", "--bf16 and --no_bf16 are both given"},
      {base + " --num_processes 0", "--num_processes 0: expected a whole number >= 1"},
      {base + " --num_processes 2 --nproc_per_node 3", "give one process count"},
      {base + " --accelerate_config zero9", "neither a file nor one of TRL's presets (zero1, zero2, zero3, fsdp1, fsdp2, multi_gpu, single_gpu)"},
      {"generate --model " + f.model + " --prompt hi --accelerate_config zero2", "only the training commands"},
      {base + " --optim paged_adamw_8bit", "trl sft: optim 'paged_adamw_8bit' is not available: trl.cpp trains with AdamW"},
      {base + " --lr_scheduler_kwargs '{\"min_lr\": 1e-6}'", "trl sft: lr_scheduler_kwargs 'min_lr' is not an argument of the linear schedule"},
      {base + " --lr_scheduler_kwargs 3", "--lr_scheduler_kwargs: expected a JSON object"},
  };
  for (const Case& c : cases) {
    std::string out;
    EXPECT_EQ(run(c.args, &out), 2) << c.args << "\n" << out;
    EXPECT_NE(out.find(c.want), std::string::npos) << c.args << "\n" << out;
  }
  std::string out;
  EXPECT_EQ(run("sft --model_name_or_path " + f.dir.file("absent") + " --dataset_name " + f.data, &out), 1) << out;  // not a usage error
}

// Transformers v5 and HfArgumentParser forms in TRL's docs: a fractional warmup_steps is a ratio of the steps,
// logging_first_step logs step 1, --no_<flag> negates any boolean, and a YAML config's env:, num_processes: and
// accelerate_config: keys (TRL's launcher keys) are taken.
TEST(CliCompat, TransformersV5AndLauncherFormsTrain) {
  Fixture f;
  const std::string base = "sft --model_name_or_path " + f.model + " --dataset_name " + f.data +
                           " --max_steps 10 --logging_steps 1 --learning_rate 1e-3 --per_device_train_batch_size 2 --report false";
  const auto learning_rates = [&](const std::string& dir) {
    std::vector<double> lr;
    std::istringstream in(test::read_file(f.dir.file(dir + "/log.jsonl")));
    for (std::string line; std::getline(in, line);) {
      const json e = json::parse(line);
      if (e.contains("learning_rate") && e.contains("loss")) lr.push_back(e["learning_rate"].get<double>());
    }
    return lr;
  };
  std::string out;
  ASSERT_EQ(run(base + " --warmup_steps 0.2 --output_dir " + f.dir.file("ratio"), &out), 0) << out;
  ASSERT_EQ(run(base + " --warmup_steps 2 --output_dir " + f.dir.file("steps"), &out), 0) << out;
  ASSERT_EQ(run(base + " --output_dir " + f.dir.file("none"), &out), 0) << out;
  const std::vector<double> ratio = learning_rates("ratio"), steps = learning_rates("steps"), none = learning_rates("none");
  ASSERT_EQ(ratio.size(), 10u);
  EXPECT_EQ(ratio, steps) << "warmup_steps 0.2 of 10 steps is 2 warm-up steps (Transformers' get_warmup_steps)";
  EXPECT_NE(ratio, none);
  EXPECT_LT(ratio[0], ratio[1]) << "the first steps warm up";

  // cosine_with_min_lr ends at min_lr_rate × learning_rate; the AdamW names and dataset_num_proc are taken.
  ASSERT_EQ(run(base + " --lr_scheduler_type cosine_with_min_lr --lr_scheduler_kwargs '{\"min_lr_rate\": 0.1}' --optim adamw_torch_fused "
                       "--dataset_num_proc 4 --output_dir " + f.dir.file("minlr"), &out), 0) << out;
  const std::vector<double> minlr = learning_rates("minlr");
  ASSERT_EQ(minlr.size(), 10u);
  EXPECT_NEAR(minlr[9], 1e-3 * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 9 / 10))), 1e-12) << "the last step's rate (step index 9 of 10)";

  // logging_first_step: step 1 is logged beside every 5th.
  ASSERT_EQ(run(base + " --max_steps 5 --logging_steps 5 --logging_first_step --no_remove_unused_columns --no-gradient-checkpointing --output_dir " +
                    f.dir.file("first"), &out), 0) << out;
  std::vector<int64_t> logged;
  std::istringstream in(test::read_file(f.dir.file("first/log.jsonl")));
  for (std::string line; std::getline(in, line);) {
    const json e = json::parse(line);
    if (e.contains("loss")) logged.push_back(e["step"].get<int64_t>());
  }
  EXPECT_EQ(logged, (std::vector<int64_t>{1, 5}));

  // TRL's example config shape: env: is set before the run (TRL_LOG_RECOMPILES makes the compiler speak), the
  // launcher keys are read, and the accelerate config is said to mean data parallel over one rank here.
  test::write_file(f.dir.file("trl.yaml"), "env:\n  TRL_LOG_RECOMPILES: 1\nnum_processes: 1\naccelerate_config: multi_gpu\nmodel_name_or_path: " + f.model +
                                               "\ndataset_name: " + f.data + "\nmax_steps: 1\nreport: false\noutput_dir: " + f.dir.file("yaml") + "\n");
  ASSERT_EQ(run("sft --config " + f.dir.file("trl.yaml"), &out), 0) << out;
  EXPECT_NE(out.find("[trl] compiling program #1"), std::string::npos) << out;
  EXPECT_NE(out.find("accelerate_config multi_gpu: plain data parallel over 1 rank"), std::string::npos) << out;
  ASSERT_EQ(run(base + " --max_steps 1 --num_processes 1 --accelerate_config zero2 --output_dir " + f.dir.file("zero2"), &out), 0) << out;
  EXPECT_NE(out.find("DeepSpeed ZeRO-2 runs as trl.cpp's sharded data parallel over 1 rank"), std::string::npos) << out;
}

// TRL's dataset mixtures in a YAML config (`datasets:`, `test_split_size`), as TRL's docs write them: both entries are
// read, the mixture split into train and test, and evaluation runs on the test rows.
TEST(CliCompat, DatasetMixturesFromTrlYaml) {
  Fixture f;
  test::write_file(f.dir.file("mix.yaml"), "model_name_or_path: " + f.model + "\ndatasets:\n  - path: " + f.data + "\n    columns: [messages]\n  - path: " +
                                               f.folder + "\n    split: test\ntest_split_size: 0.25\neval_strategy: steps\neval_steps: 1\n"
                                               "max_steps: 2\nlogging_steps: 1\nreport: false\noutput_dir: " + f.dir.file("mix") + "\n");
  std::string out;
  ASSERT_EQ(run("sft --config " + f.dir.file("mix.yaml"), &out), 0) << out;
  EXPECT_NE(out.find("on a mixture of " + f.data + " + " + f.folder + " (6 rows)"), std::string::npos) << "8 rows, ceil(0.25 * 8) = 2 for test: " << out;
  EXPECT_NE(test::read_file(f.dir.file("mix/log.jsonl")).find("\"eval_loss\""), std::string::npos);
  test::write_file(f.dir.file("bad.yaml"), "model_name_or_path: " + f.model + "\ndatasets:\n  - name: x\n");
  EXPECT_EQ(run("sft --config " + f.dir.file("bad.yaml"), &out), 2) << out;
  EXPECT_NE(out.find("--datasets: datasets[0]: 'path' is required"), std::string::npos) << out;
}

// report_to tensorboard writes TensorBoard's event files (their format: tests/train/tensorboard_test.cpp), one scalar
// per logged number; integrations that need a network are noted, unknown ones refused.
TEST(CliCompat, ReportToTensorBoardWritesEventFiles) {
  Fixture f;
  const std::string base = "sft --model_name_or_path " + f.model + " --dataset_name " + f.data + " --max_steps 3 --logging_steps 1 --report false";
  std::string out;
  ASSERT_EQ(run(base + " --report_to tensorboard --logging_dir " + f.dir.file("tb") + " --output_dir " + f.dir.file("o"), &out), 0) << out;
  EXPECT_NE(out.find("[trl] TensorBoard: " + f.dir.file("tb") + "/events.out.tfevents."), std::string::npos) << out;
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(f.dir.file("tb"))) files.push_back(e.path().string());
  ASSERT_EQ(files.size(), 1u);
  const std::string events = test::read_file(files[0]);
  EXPECT_EQ(count(events, "train/loss"), 3u) << "one scalar per logged step";
  EXPECT_EQ(count(events, "train/learning_rate"), 3u);
  EXPECT_EQ(count(events, "args/text_summary"), 1u);
  // Without logging_dir: Transformers' default, output_dir/runs/<date>_<host>.
  ASSERT_EQ(run(base + " --report_to all --output_dir " + f.dir.file("o2"), &out), 0) << out;
  EXPECT_NE(out.find("[trl] TensorBoard: " + f.dir.file("o2/runs/")), std::string::npos) << out;
  ASSERT_EQ(run(base + " --report_to wandb --output_dir " + f.dir.file("o3"), &out), 0) << out;
  EXPECT_NE(out.find("--report_to wandb: not available here"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(f.dir.file("o3/runs")));
  // A logging_dir that cannot be a folder fails before the first step: the earlier run in output_dir keeps its files.
  const std::string log_before = test::read_file(f.dir.file("o/log.jsonl"));
  test::write_file(f.dir.file("a_file"), "x");
  EXPECT_EQ(run(base + " --report_to tensorboard --logging_dir " + f.dir.file("a_file/tb") + " --output_dir " + f.dir.file("o"), &out), 1) << out;
  EXPECT_NE(out.find("--logging_dir " + f.dir.file("a_file/tb") + ": " + f.dir.file("a_file") + " is not a folder"), std::string::npos) << out;
  EXPECT_EQ(test::read_file(f.dir.file("o/log.jsonl")), log_before);
  EXPECT_TRUE(std::filesystem::exists(f.dir.file("o/trainer_state.json")));
  ASSERT_EQ(run(base + " --report_to tensorboard,wandb --output_dir " + f.dir.file("o5"), &out), 0) << out;  // a list with commas
  EXPECT_NE(out.find("[trl] TensorBoard: "), std::string::npos) << out;
  EXPECT_EQ(run(base + " --report_to tensorbored --output_dir " + f.dir.file("o4"), &out), 2) << out;
  EXPECT_NE(out.find("--report_to tensorbored: no such integration"), std::string::npos) << out;
}

// The README's command lines (with a temporary folder for models/).
TEST(CliCompat, ReadmeCommandLinesRun) {
  Fixture f;
  const std::string m = f.dir.file("models/tiny");
  const std::vector<std::string> lines = {
      "env",
      "env --json",
      "init-model --preset tiny --dtype f32 --seed 0 --out " + m,
      "score --model " + m + " --ids 785,8585,49041,7506,5302",
      "generate --model " + m + " --prompt 'The French Bread Law states' --max_new_tokens 30 --do_sample false",
      "generate --model " + m + " --prompt 'Hi' --chat --temperature 0.7 --top_p 0.9 --seed 1 --verbose --max_new_tokens 8",
      "score --model " + m + " --text 'Hello world' --tokens",
  };
  for (const std::string& line : lines) {
    std::string out;
    EXPECT_EQ(run(line, &out), 0) << line << "\n" << out;
  }
  std::string out;
  EXPECT_EQ(test::run_command("TRL_CACHE_DIR=" + f.dir.file("cache") + " " + kTrl + " compile --preset tiny --per_device_train_batch_size 1 --max_length 128 --pad_to_multiple_of 64 2>&1", &out), 0) << out;
  EXPECT_EQ(test::run_command("printf 'The French Bread Law states' | " + kTrl + " tokenize --model " + m, &out), 0);
  EXPECT_EQ(out, "785,8585,49041,7506,5302\n");
  EXPECT_EQ(test::run_command("printf 'hi\\n/exit\\n' | " + kTrl + " chat --model " + m + " --system 'You are terse.' --max_new_tokens 4", &out), 0) << out;
}

TEST(CliCompat, BadInputIsNamed) {
  Fixture f;
  std::string out;
  // A wrong field type in generation_config.json names the field.
  const std::string gc = f.model + "/generation_config.json";
  const std::string original = test::read_file(gc);
  json g = json::parse(original);
  g["temperature"] = "hot";
  test::write_file(gc, g.dump());
  EXPECT_NE(run("generate --model " + f.model + " --prompt hi --max_new_tokens 2", &out), 0);
  EXPECT_NE(out.find("field 'temperature' must be a number, got \"hot\""), std::string::npos) << out;
  // A value out of range there is named with the file it came from (not with the option the user did not give).
  g = json::parse(original);
  g["top_p"] = 2;
  g["do_sample"] = true;
  test::write_file(gc, g.dump());
  EXPECT_NE(run("generate --model " + f.model + " --prompt hi --max_new_tokens 2", &out), 0);
  EXPECT_NE(out.find("top_p must be in (0, 1], got 2 (from " + gc + ")"), std::string::npos) << out;
  EXPECT_NE(run("generate --model " + f.model + " --prompt hi --max_new_tokens 2 --top_p 3", &out), 0);
  EXPECT_NE(out.find("--top_p must be"), std::string::npos) << out;  // the user's own value: the option's check
  test::write_file(gc, original);

  test::write_file(f.dir.file("p.jsonl"), "{\"prompt\": \"fine\"}\n{\"messages\": [{\"role\": \"user\"}]}\n");
  test::write_file(f.dir.file("ids.jsonl"), "{\"ids\": [1, 2]}\n{\"ids\": [1, 3000000000]}\n");
  test::write_file(f.dir.file("tok.jsonl"), "{\"ids\": [4294967297]}\n");
  test::write_file(f.dir.file("far.jsonl"), fmt::format("{{\"ids\": [1, 2]}}\n\n{{\"ids\": [1, {}]}}\n", test::kCutVocab));
  test::write_file(f.dir.file("two.jsonl"), "{\"ids\": [1, 2]}\n{\"ids\": [1, 2, 3]}\n{\"ids\": [4]}\n");
  struct Case {
    std::string args, want;
  };
  const std::vector<Case> cases = {
      {"generate --model " + f.model + " --input " + f.dir.file("p.jsonl") + " --max_new_tokens 2", "p.jsonl:2"},
      {"generate --model " + f.model + " --input " + f.dir.file("ids.jsonl") + " --max_new_tokens 2", "ids.jsonl:2: \"ids\": ids[1] = 3000000000 is not a token id"},
      {"tokenize --model " + f.model + " --jsonl --decode < " + f.dir.file("tok.jsonl"), "stdin:1: ids[0] = 4294967297 is not a token id"},
      // --input errors name the file's line, not the place in a batch.
      {"generate --model " + f.model + " --input " + f.dir.file("far.jsonl") + " --max_new_tokens 2",
       fmt::format("far.jsonl:3: token id {} is outside the model's vocabulary [0, {})", test::kCutVocab, test::kCutVocab)},
      {"generate --model " + f.model + " --input " + f.dir.file("two.jsonl") + " --batch_size 2 --max_new_tokens 1000000",
       "two.jsonl: lines 1 to 2 (--batch_size 2; the longest prompt, 3 tokens, is line 2): generate: a prompt of 3 tokens"},
      {"score --model " + f.model + " --ids 5", "nothing to score"},
      {"score --model " + f.model + " --text a", "nothing to score"},
      {"sft --config " + f.dir.path(), "is a folder"},
      {"sft --output_dir " + f.dir.file("bad_out") + " --model_name_or_path " + f.model + " --dataset_name " + f.data + " --torch_dtype half", "'half' is not one of auto, f32, float32, bf16, bfloat16"},
      {"sft --output_dir " + f.dir.file("bad_out") + " --model_name_or_path " + f.model + " --dataset_name " + f.data + " --learning_rate inf", "--learning_rate must be a finite number, got inf"},
      {"sft --output_dir " + f.dir.file("bad_out") + " --model_name_or_path " + f.model + " --dataset_name " + f.data + " --adam_beta1 1.5", "--adam_beta1 must be in [0, 1), got 1.5"},
      {"sft --output_dir " + f.dir.file("bad_out") + " --model_name_or_path " + f.model + " --dataset_name " + f.data + " --weight_decay -3", "--weight_decay must be at least 0, got -3"},
      {"sft --output_dir " + f.dir.file("bad_out") + " --model_name_or_path " + f.model + " --dataset_name " + f.data + " --adam_epsilon 0", "--adam_epsilon must be greater than 0, got 0"},
      {"sft --output_dir " + f.dir.file("bad_out") + " --model_name_or_path " + f.model + " --dataset_name " + f.data + " --seed -1", "--seed must be at least 0, got -1"},
      {"generate --model " + f.model + " --prompt hi --max_new_tokens 0", "--max_new_tokens must be at least 1, got 0"},
      {"generate --model " + f.model + " --prompt hi --top_k abc", "--top_k: 'abc' is not a number"},
      {"sft --output_dir " + f.dir.file("bad_out") + " --model_name_or_path " + f.model + " --dataset_name " + f.data + " --learning_rat 1", "unknown option --learning_rat (did you mean --learning_rate?)"},
  };
  for (const Case& c : cases) {
    EXPECT_NE(test::run_command(kTrl + " " + c.args + " 2>&1", &out), 0) << c.args;
    EXPECT_NE(out.find(c.want), std::string::npos) << c.args << "\n" << out;
  }
}

// Issue 37's sweeps: messages that named the wrong thing or no place now name the file, the line or the variable.
TEST(CliCompat, BadInputNamesTheRightPlace) {
  Fixture f;
  std::string out;
  test::write_file(f.dir.file("role.jsonl"), "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n{\"messages\": [{\"role\": 5, \"content\": \"hi\"}]}\n");
  const std::string train = "sft --output_dir " + f.dir.file("o") + " --model_name_or_path " + f.model + " --dataset_name " + f.data + " --max_steps 1";
  struct Case {
    std::string command, want;
  };
  const std::vector<Case> cases = {
      {kTrl + " tokenize --model " + f.model + " --jsonl --chat < " + f.dir.file("role.jsonl"), "stdin:2: apply_chat_template: message 0: 'role' must be text"},
      {kTrl + " distill --output_dir " + f.dir.file("d") + " --model_name_or_path " + f.model + " --teacher_model_name_or_path " + f.model +
           " --dataset_name " + f.data + " --chat_template_kwargs '[1]'",
       "--chat_template_kwargs must be a JSON object of template variables"},
      {"TRL_MEMORY_LIMIT=abc " + kTrl + " " + train, "the environment variable TRL_MEMORY_LIMIT: invalid size 'abc'"},
  };
  for (const Case& c : cases) {
    EXPECT_NE(test::run_command(c.command + " 2>&1", &out), 0) << c.command;
    EXPECT_NE(out.find(c.want), std::string::npos) << c.command << "\n" << out;
  }
  // tokenizer_config.json's chat_template of the wrong kind is named; without one, chat data is told what to do.
  const std::string cfg_file = f.model + "/tokenizer_config.json";
  json cfg = json::parse(test::read_file(cfg_file));
  cfg["chat_template"] = 5;
  test::write_file(cfg_file, cfg.dump());
  EXPECT_NE(run(train, &out), 0);
  EXPECT_NE(out.find("tokenizer_config.json: 'chat_template' must be the template's text"), std::string::npos) << out;
  cfg.erase("chat_template");
  test::write_file(cfg_file, cfg.dump());
  std::filesystem::remove(f.model + "/chat_template.jinja");
  EXPECT_NE(run(train, &out), 0);
  EXPECT_NE(out.find("this tokenizer has no chat template"), std::string::npos) << out;
  EXPECT_NE(out.find("give the data as text"), std::string::npos) << out;
}

TEST(CliCompat, WeightsMustFitTheArchitecture) {
  Fixture f;
  std::string out;
  // Fewer layers in the config than in the checkpoint: the extra tensors are reported by name.
  f.set_config("num_hidden_layers", 1);
  ASSERT_EQ(run("score --model " + f.model + " --ids 1,2,3", &out), 0) << out;
  EXPECT_NE(out.find("not used by this qwen3 config"), std::string::npos) << out;
  EXPECT_NE(out.find("model.layers.1."), std::string::npos) << out;
  // More layers than the checkpoint has: refused, naming the missing tensor.
  f.set_config("num_hidden_layers", 3);
  EXPECT_NE(run("score --model " + f.model + " --ids 1,2,3", &out), 0);
  EXPECT_NE(out.find("missing tensor 'model.layers.2."), std::string::npos) << out;
  // A width that does not match: refused, naming the tensor and both shapes.
  f.set_config("num_hidden_layers", 2);
  f.set_config("intermediate_size", 96);
  EXPECT_NE(run("score --model " + f.model + " --ids 1,2,3", &out), 0);
  EXPECT_NE(out.find("mlp"), std::string::npos) << out;
  EXPECT_NE(out.find("but the config implies"), std::string::npos) << out;
}

// A tensor stored as integers cannot be the weight it names, whatever --dtype converts to (issue 37, defect 10).
TEST(CliCompat, AnIntegerWeightIsRefusedByName) {
  Fixture f;
  const std::string file = f.model + "/model.safetensors";
  TensorMap w;
  {
    const SafeTensorsFile st = SafeTensorsFile::open(file);
    for (const std::string& name : st.names()) w[name] = st.get(name).clone();
  }
  w["model.norm.weight"] = Tensor::zeros(DType::I32, w.at("model.norm.weight").shape());
  save_safetensors(file, w);
  std::string out;
  for (const char* dtype : {"", " --dtype bf16", " --dtype f32"}) {
    EXPECT_NE(run("score --model " + f.model + " --ids 1,2,3" + dtype, &out), 0) << dtype;
    EXPECT_NE(out.find("tensor 'model.norm.weight' has dtype i32; weights must be floating point"), std::string::npos) << dtype << "\n" << out;
  }
}

// `datasets.Dataset.to_json` writes JSON lines into a .json file: accepted, as is a .json array.
TEST(CliCompat, JsonFilesHoldingJsonLines) {
  Fixture f;
  std::string lines = test::read_file(f.data);
  test::write_file(f.dir.file("lines.json"), lines);
  std::string array = "[";
  std::istringstream in(lines);
  bool first = true;
  for (std::string l; std::getline(in, l);) {
    array += (first ? "" : ",\n") + l;
    first = false;
  }
  test::write_file(f.dir.file("array.json"), array + "]\n");
  for (const char* file : {"lines.json", "array.json"}) {
    std::string out;
    ASSERT_EQ(run("sft --model_name_or_path " + f.model + " --dataset_name " + f.dir.file(file) + " --max_steps 1 --output_dir " + f.dir.file(std::string("o_") + file), &out), 0)
        << file << "\n" << out;
    EXPECT_NE(out.find("(4 rows)"), std::string::npos) << file << "\n" << out;
  }
}

}  // namespace
}  // namespace trl

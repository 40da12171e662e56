// `trl demo-grpo`: online RL end to end in about a minute on a fresh machine: a tiny Qwen3 learns by SFT to count
// (" one two ... k" for a random k), then GRPO with a format reward (regex:^ one two three$) teaches it to answer
// exactly " one two three"; the reward of each logged step and a sample of completions before and after.
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "cli/options.h"
#include "core/fs.h"
#include "trl/data/dataset.h"
#include "trl/models/init.h"
#include "trl/train/grpo_trainer.h"
#include "trl/train/sft_trainer.h"

namespace trl::cli {

void register_demo_grpo(CLI::App& app) {
  auto* cmd = add_command(app, "demo-grpo", "GRPO on a tiny Qwen3: a format reward rises from about 0.5 to 1 in a minute");
  struct Args {
    std::string out = "demo-grpo";
    int64_t max_steps = 24;
  };
  auto a = std::make_shared<Args>();
  Options opts(cmd);
  opts.add("out,output_dir", a->out, "Folder for the models, the datasets and the logs");
  opts.add("max_steps", a->max_steps, "GRPO steps").min(1);
  on_run(cmd, [a] {
    namespace stdfs = std::filesystem;
    using ojson = nlohmann::ordered_json;
    const stdfs::path out(a->out);
    stdfs::create_directories(out);
    InitOptions o;
    o.preset = "tiny";
    o.seed = 3;
    o.initializer_range = 0.1;
    init_model(o, (out / "base").string());
    const CausalLM base = CausalLM::from_pretrained((out / "base").string());
    const Tokenizer tok = Tokenizer::from_pretrained((out / "base").string());
    // " one two ... k" completions for a random k (a fixed LCG: the same data on every machine).
    const char* words[] = {"one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"};
    std::string sft_rows, prompt_rows;
    uint64_t x = 12345;
    for (int i = 0; i < 64; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const size_t k = 1 + (x >> 33) % 12;
      std::string c;
      for (size_t w = 0; w < k; ++w) c += std::string(" ") + words[w];
      sft_rows += ojson{{"prompt", "Count:"}, {"completion", c}}.dump() + "\n";
      prompt_rows += ojson{{"prompt", "Count:"}}.dump() + "\n";
    }
    write_text_file_atomic((out / "count.jsonl").string(), sft_rows);
    write_text_file_atomic((out / "prompts.jsonl").string(), prompt_rows);
    std::printf("1. SFT: a tiny Qwen3 learns to count (\" one two ... k\", k random from 1 to 12), 40 steps\n");
    SFTConfig sc;
    sc.output_dir = (out / "sft").string();
    sc.learning_rate = 1e-2;
    sc.per_device_train_batch_size = 8;
    sc.max_steps = 40;
    sc.logging_steps = 10;
    sc.save_steps = 1000000;
    sc.bf16 = false;
    sc.progress = false;
    const TrainOutput so = SFTTrainer(base, tok, load_dataset((out / "count.jsonl").string()), sc).train();
    std::printf("   loss %.3f -> %.3f\n", so.log_history.front()["loss"].get<double>(), so.log_history.back()["loss"].get<double>());
    const CausalLM tuned = CausalLM::from_pretrained(sc.output_dir);
    std::printf("2. GRPO: reward 1 for exactly \" one two three\" (--reward_funcs 'regex:^ one two three$'), 1 prompt x 8 completions per step\n");
    GRPOConfig c;
    c.output_dir = (out / "grpo").string();
    c.bf16 = false;
    c.per_device_train_batch_size = 8;
    c.num_generations = 8;
    c.max_completion_length = 24;
    c.max_steps = a->max_steps;
    c.logging_steps = 3;
    c.learning_rate = 5e-3;
    c.save_steps = 1000000;
    c.progress = false;
    c.pad_to_multiple_of = "32";
    c.log_completions = true;
    c.num_completions_to_print = 0;
    GRPOTrainer t(tuned, tok, {reward_function("regex:^ one two three$")}, load_dataset((out / "prompts.jsonl").string()), c);
    std::vector<std::string> first, last;
    t.on_rollout = [&](const RolloutRecord& r) {
      if (first.empty()) first = r.completions;
      last = r.completions;
    };
    const TrainOutput go = t.train();
    for (const auto& e : go.log_history)
      if (e.contains("reward"))
        std::printf("   step %3lld  reward %.3f  mean length %.1f tokens  (%.2f s: generation %.2f, training %.2f)\n",
                    static_cast<long long>(e["step"].get<int64_t>()), e["reward"].get<double>(), e["completions/mean_length"].get<double>(),
                    e["step_time"].get<double>(), e["time/generation"].get<double>(), e["time/training"].get<double>());
    auto show = [](const char* when, const std::vector<std::string>& v) {
      std::printf("   %s:", when);
      for (size_t i = 0; i < std::min<size_t>(v.size(), 4); ++i) std::printf(" \"%s\"", v[i].c_str());
      std::printf("\n");
    };
    show("completions at step 1", first);
    show("completions at the last step", last);
    std::printf("   %lld training programs and %lld generation programs compiled; log, completions.jsonl and the model in %s\n",
                static_cast<long long>(go.programs.compilations), static_cast<long long>(t.generation_program_stats().compilations), c.output_dir.c_str());
  });
}

}  // namespace trl::cli

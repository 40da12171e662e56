// `trl demo`: the project's main job on a built-in default, end to end on a fresh machine in a few minutes:
// create a tiny Qwen3, fine-tune it with SFT on a small chat dataset shipped inside the binary (16 questions
// and answers), show the loss falling, then ask it the questions and print its answers next to the expected ones.
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "assets/assets.h"
#include "cli/cli_util.h"
#include "cli/options.h"
#include "core/fs.h"
#include "trl/data/dataset.h"
#include "trl/generation/generate.h"
#include "trl/models/init.h"
#include "trl/tokenizer/chat_template.h"
#include "trl/train/sft_trainer.h"

namespace trl::cli {

void register_demo(CLI::App& app) {
  auto* cmd = add_command(app, "demo", "Fine-tune a tiny Qwen3 on a built-in chat dataset, then ask it the questions");
  struct Args {
    std::string out = "demo";
    uint64_t seed = 0;
    int64_t max_steps = 100;
  };
  auto a = std::make_shared<Args>();
  Options opts(cmd);
  opts.add("out,output_dir", a->out, "Folder for the base model, the dataset and the fine-tuned model");
  opts.add("seed", a->seed, "Random seed of the initial weights");
  opts.add("max_steps", a->max_steps, "Training steps").min(1);
  on_run(cmd, [a] {
    namespace stdfs = std::filesystem;
    const std::string base = (stdfs::path(a->out) / "base").string(), data = (stdfs::path(a->out) / "chat.jsonl").string(),
                      tuned = (stdfs::path(a->out) / "sft").string();
    InitOptions o;
    o.preset = "tiny";
    o.seed = a->seed;
    init_model(o, base);
    stdfs::create_directories(a->out);
    write_text_file_atomic(data, std::string(asset("demo/chat.jsonl")));
    const CausalLM model = CausalLM::from_pretrained(base);
    const Tokenizer tok = Tokenizer::from_pretrained(base);
    std::printf("1. a tiny Qwen3 (%lld parameters, %lld layers, hidden %lld, the real 151936-token vocabulary) in %s\n",
                static_cast<long long>(model.num_parameters()), static_cast<long long>(model.config().num_hidden_layers),
                static_cast<long long>(model.config().hidden_size), base.c_str());
    const Dataset ds = load_dataset(data);
    std::printf("2. SFT on %zu chat examples (%s), %lld steps; the loss every 10 steps:\n", ds.size(), data.c_str(), static_cast<long long>(a->max_steps));
    SFTConfig c;
    c.output_dir = tuned;
    c.learning_rate = 1e-2;
    c.lr_scheduler_type = "constant_with_warmup";
    c.warmup_steps = 5;
    c.per_device_train_batch_size = 16;
    c.max_steps = a->max_steps;
    c.logging_steps = 10;
    c.save_steps = 1000000;
    c.padding_free = true;
    c.progress = false;
    SFTTrainer trainer(model, tok, ds, c);
    trainer.on_step = nullptr;
    const TrainOutput out = trainer.train();
    for (const auto& e : out.log_history)
      if (e.contains("loss"))
        std::printf("   step %4lld  loss %.4f\n", static_cast<long long>(e["step"].get<int64_t>()), e["loss"].get<double>());
    std::printf("   %lld training programs compiled, %lld cache hits; model, checkpoints, log and training_report.html in %s\n",
                static_cast<long long>(out.programs.compilations), static_cast<long long>(out.programs.hits), tuned.c_str());
    std::printf("3. the fine-tuned model answers (greedy, static KV cache):\n");
    const CausalLM tuned_model = CausalLM::from_pretrained(tuned);
    Generator gen(tuned_model);
    int right = 0;
    for (const ChatAnswer& ans : greedy_chat_answers(gen, tok, ds.rows, 12)) {
      right += ans.exact;
      std::printf("   %s %-46s -> %s\n", ans.exact ? "ok" : "--", ans.question.c_str(), ans.answer.c_str());
    }
    std::printf("   %d of %zu answers exact. Chat with it: trl chat --model %s --do_sample false --enable_thinking false\n", right, ds.size(),
                tuned.c_str());
  });
}

}  // namespace trl::cli

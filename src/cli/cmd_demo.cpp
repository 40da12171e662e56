// `trl demo`: the project's main job on a built-in default. For now: create the tiny model, run it on a prompt
// and print its next-token logits. (Later issues turn this into fine-tune-then-generate.)
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "cli/cli_util.h"
#include "models/init.h"
#include "models/score.h"
#include "tokenizer/tokenizer.h"

namespace trl::cli {

void register_demo(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "Create a tiny Qwen3 model and print its logits for a prompt");
  auto out = std::make_shared<std::string>("demo-model");
  auto seed = std::make_shared<uint64_t>(0);
  cmd->add_option(flag("out") + "," + flag("output_dir"), *out, "Where to write the tiny model")->capture_default_str();
  cmd->add_option(flag("seed"), *seed, "Random seed")->capture_default_str();
  cmd->callback([out, seed] {
    InitOptions o;
    o.preset = "tiny";
    o.seed = *seed;
    o.initializer_range = 0.2;  // wide enough that the logits visibly differ between tokens
    init_model(o, *out);
    CausalLM model = CausalLM::from_pretrained(*out);
    std::printf("model: %s (%s, %lld parameters, %lld layers, hidden %lld, vocab %lld)\n", out->c_str(),
                model.config().model_type.c_str(), static_cast<long long>(model.num_parameters()),
                static_cast<long long>(model.config().num_hidden_layers), static_cast<long long>(model.config().hidden_size),
                static_cast<long long>(model.config().vocab_size));
    const Tokenizer tok = Tokenizer::from_pretrained(*out);
    const std::string text = "The French Bread Law states";
    const std::vector<int32_t> prompt = tok.encode(text);
    Batch batch;
    batch.input_ids = Tensor::from_i32(prompt, {1, static_cast<int64_t>(prompt.size())});
    auto backend = make_cpu_backend();
    const Tensor logits = model.forward(batch, *backend);
    const int64_t V = model.config().vocab_size;
    std::printf("prompt: \"%s\" -> ids ", text.c_str());
    for (int32_t id : prompt) std::printf("%d ", id);
    std::printf("\nlogits [1, %zu, %lld] on the %s backend; top 5 next tokens per position:\n", prompt.size(), static_cast<long long>(V),
                backend->name().c_str());
    for (size_t t = 0; t < prompt.size(); ++t) {
      const float* row = logits.data_as<float>() + static_cast<int64_t>(t) * V;
      std::vector<int32_t> idx(static_cast<size_t>(V));
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](int32_t x, int32_t y) { return row[x] > row[y]; });
      std::printf("  after %-10s ->", ("\"" + tok.decode(std::vector<int32_t>{prompt[t]}) + "\"").c_str());
      for (int k = 0; k < 5; ++k) {
        const int32_t id = idx[static_cast<size_t>(k)];
        std::string piece = nlohmann::json(tok.decode(std::vector<int32_t>{id})).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        std::printf("  %s %+.3f", piece.c_str(), row[id]);
      }
      std::printf("\n");
    }
    const SequenceScore s = score_sequences(model, {prompt}, *backend).at(0);
    std::printf("nll %.4f over %lld tokens, perplexity %.1f (an untrained model: the top tokens are noise)\n", s.nll,
                static_cast<long long>(s.n_scored), s.perplexity());
  });
}

}  // namespace trl::cli

// `trl init-model`: a randomly initialised model folder in the Hugging Face layout.
#include <cstdio>


#include <fmt/ranges.h>

#include "cli/cli_util.h"
#include "cli/options.h"
#include "trl/core/error.h"
#include "trl/core/byte_size.h"
#include "trl/io/safetensors.h"
#include "trl/models/init.h"

namespace trl::cli {

void register_init_model(CLI::App& app) {
  auto* cmd = add_command(app, "init-model", "Write a randomly initialised Qwen3 model folder (config, safetensors, tokenizer)");
  struct Args {
    std::string preset = "tiny", dtype = "f32", out, max_shard_size = "5GB";
    uint64_t seed = 0;
    double initializer_range = 0;
    bool randomize_norms = false;
    int64_t layers = 0, vocab_size = 0;
  };
  auto a = std::make_shared<Args>();
  Options opts(cmd);
  opts.add("preset", a->preset, fmt::format("{}", fmt::join(model_presets(), " | "))).choices(model_presets());
  opts.add("dtype", a->dtype, "f32 | bf16").choices({"f32", "bf16", "float32", "bfloat16"});
  opts.add("seed", a->seed, "Random seed");
  opts.add("out,output_dir", a->out, "Output folder").required();
  opts.add("initializer_range", a->initializer_range, "Std of the normal init").min(0).default_text("the config's, 0.02");
  opts.add("randomize_norms", a->randomize_norms, "Norm weights 1 + N(0, std) instead of 1 (for port tests)");
  opts.add("max_shard_size", a->max_shard_size, "Largest safetensors shard, e.g. 5GB, 500MB");
  opts.add("layers,num_hidden_layers", a->layers, "Override the number of layers (same widths), 0 = the preset's").min(0);
  opts.add("vocab_size", a->vocab_size,
           "A cut vocabulary: the tokenizer's first vocab_size - 26 tokens and its 26 special tokens (fast experiments), 0 = the preset's 151936")
      .min(0);
  on_run(cmd, [a] {
    InitOptions o;
    o.preset = a->preset;
    o.dtype = *dtype_from_name(a->dtype);
    o.seed = a->seed;
    o.initializer_range = a->initializer_range;
    o.randomize_norms = a->randomize_norms;
    o.max_shard_bytes = parse_byte_size(a->max_shard_size);
    o.num_hidden_layers = a->layers;
    o.vocab_size = a->vocab_size;
    CausalLM m = init_model(o, a->out);
    std::printf("wrote %s: %s preset, %s, %lld parameters, seed %llu\n", a->out.c_str(), a->preset.c_str(),
                std::string(dtype_name(m.dtype())).c_str(), static_cast<long long>(m.num_parameters()),
                static_cast<unsigned long long>(a->seed));
  });
}

}  // namespace trl::cli

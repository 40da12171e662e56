// Uses only the installed public API (<trl/trl.h>): makes a tiny random Qwen3 model folder, loads it and its
// tokenizer as Transformers would, scores a prompt on the best backend and greedily generates 8 tokens with the
// static KV cache. Exit status 0 when everything worked.
#include <cmath>
#include <cstdio>
#include <string>

#include <trl/trl.h>

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "consumer-model";
  try {
    trl::InitOptions init;
    init.preset = "tiny";
    init.seed = 1;
    trl::init_model(init, dir);
    const trl::CausalLM model = trl::AutoModelForCausalLM::from_pretrained(dir);
    const trl::Tokenizer tok = trl::AutoTokenizer::from_pretrained(dir);
    const std::vector<int32_t> ids = tok.encode("The French Bread Law states");

    auto backend = trl::make_backend("auto");
    trl::Batch batch{.input_ids = trl::Tensor::from_i32(ids, {1, static_cast<int64_t>(ids.size())})};
    const trl::Tensor logits = model.forward(batch, *backend);  // [1, n, vocab] f32
    for (float v : logits.to_f32_vector())
      if (!std::isfinite(v)) throw trl::Error("non-finite logit");

    trl::GenerationConfig cfg;
    cfg.max_new_tokens = 8;
    cfg.do_sample = false;
    const trl::GenerationOutput out = trl::generate(model, {ids}, cfg);
    std::printf("backend %s, logits %s, generated %zu tokens: %s\n", backend->name().c_str(), trl::shape_str(logits.shape()).c_str(),
                out.generated[0].size(), tok.decode(out.generated[0]).c_str());
    return out.generated[0].size() == 8 ? 0 : 1;
  } catch (const trl::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}

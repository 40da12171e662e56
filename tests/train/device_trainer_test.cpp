// The trainers on the stand-in device ("reference-device": the oracle's kernels on tensors the host may not read):
// the same losses and weights as on the host oracle, and only the batch going up and the losses and metrics coming
// down once the weights are on the device (the transfer counters).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "trl/train/sft_trainer.h"

namespace trl {
namespace {

using ojson = nlohmann::ordered_json;

Dataset sentences() {
  Dataset d;
  const char* texts[] = {"the cat sat on the mat", "one two three", "a much longer sentence with a few more tokens", "x y z",
                         "hello there", "short", "what is this", "green eggs and ham"};
  for (const char* t : texts) d.rows.push_back(ojson{{"text", t}}), d.where.push_back("test");
  return d;
}

SFTConfig config(const std::string& out, bool bf16) {
  SFTConfig c;
  c.output_dir = out;
  c.bf16 = bf16;
  c.learning_rate = 1e-3;
  c.logging_steps = 1;
  c.save_steps = 1000;
  c.report = false;
  c.progress = false;
  c.per_device_train_batch_size = 2;
  c.gradient_accumulation_steps = 2;
  c.max_steps = 2;
  c.max_grad_norm = 0.5;  // clipping runs (on the device)
  return c;
}

// Losses to 1e-6 and weights to 1e-5 of the host oracle's (the same kernels: in practice equal), f32 and bf16.
TEST(DeviceTrainer, SftEqualsTheHostOracleAndMovesOnlyTheBatchAndTheScalars) {
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  for (bool bf16 : {false, true}) {
    if (bf16 && test::kSanitized) continue;  // the oracle's bf16 run twice: f32 covers the path under the sanitizers
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    SFTConfig host_cfg = config(t.dir.file(bf16 ? "host16" : "host32"), bf16);
    host_cfg.torch_compile = false;  // the host oracle ("reference")
    SFTTrainer host(t.model, tok, sentences(), host_cfg);
    const TrainOutput want = host.train();

    const CausalLM on_device = CausalLM::from_pretrained(t.dir.file("model"), LoadOptions{.device = "reference-device"});
    SFTTrainer dev(on_device, tok, sentences(), config(t.dir.file(bf16 ? "dev16" : "dev32"), bf16));
    // The weights went up once: one upload per master and per distinct compute weight, nothing down.
    const Backend::Transfers start = dev.transfers();
    const size_t params = dev.master_weights().size();
    EXPECT_EQ(start.uploads, static_cast<int64_t>(bf16 ? 2 * params : params));
    EXPECT_EQ(start.downloads, 0);
    for (const auto& [name, w] : dev.master_weights()) EXPECT_TRUE(w.is_device()) << name;

    const TrainOutput got = dev.train();
    ASSERT_EQ(got.log_history.size(), want.log_history.size());
    for (size_t i = 0; i + 1 < want.log_history.size(); ++i) {  // the step entries (the last is the run's summary)
      for (const char* key : {"loss", "grad_norm", "entropy", "mean_token_accuracy"}) {
        const double a = got.log_history[i][key].get<double>(), b = want.log_history[i][key].get<double>();
        EXPECT_TRUE(std::isfinite(a) && std::fabs(a - b) <= 1e-6 * std::max(1.0, std::fabs(b))) << key << " step " << i << ": " << a << " vs " << b;
      }
    }
    const TensorMap w_dev = dev.master_weights_on_host();
    double worst = 0;
    for (const auto& [name, w] : host.master_weights()) {
      const std::vector<float> a = w_dev.at(name).to_f32_vector(), b = w.to_f32_vector();
      for (size_t i = 0; i < a.size(); ++i) worst = test::nan_max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
    }
    EXPECT_LE(worst, 1e-5);

    // Per micro-batch (2 steps × 2): its 5 batch tensors up, its loss and two per-token metrics down; the final
    // save downloads the trained weights once (and the test's read of the masters above, once more each).
    const Backend::Transfers end = dev.transfers();
    const int64_t micro = 2 * 2;
    EXPECT_EQ(end.uploads - start.uploads, 5 * micro);
    EXPECT_EQ(end.downloads - start.downloads, 3 * micro + static_cast<int64_t>(params) + static_cast<int64_t>(params));
  }
}

}  // namespace
}  // namespace trl

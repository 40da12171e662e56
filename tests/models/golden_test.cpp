// Qwen3 logits against PyTorch goldens (tests/reference/qwen3_reference.py, an independent implementation).
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "assets/assets.h"
#include "core/fs.h"
#include "trl/backend/cpu/cpu_backend.h"
#include "trl/models/causal_lm.h"
#include "trl/models/init.h"
#include "test_util.h"

namespace trl {
namespace {

using json = nlohmann::json;

struct GoldenModel {
  const char* preset;
  DType dtype;
  const char* suffix;     // "" = PyTorch eager in the model's dtype; "_emulated" = f64 with the same rounding points
  double max_tolerance;   // max |ours - golden| / max(1, |golden|) over every compared number
  double mean_tolerance;  // the same, averaged over every compared logit
};

// Keep in sync with tests/reference/make_goldens.sh (seed 1234, initializer_range 0.1, randomized norms).
//
// f32 against PyTorch f32: 1e-4, as the issue asks (we see ~1e-5: only the f32 summation order differs).
//
// bf16 is checked twice:
//  - against PyTorch computing in f64 and rounding to bf16 at exactly the points where eager Transformers stores a
//    bf16 activation ("_emulated"): 1e-4. Both sides accumulate in f64, so rounding never flips differently and
//    the match is tight; this pins down *where* we round.
//  - against PyTorch's own eager bf16 run. Its bf16 matmuls accumulate in f32 in a blocked order, so a value
//    that lands near a rounding boundary rounds one bf16 step (2^-8 relative) away from ours, and such flips
//    propagate through the layers. The errors are therefore of bf16's own size: we allow a max of 0.1 (about 25
//    bf16 steps at the logits' scale) and a mean of 0.006 (tiny) / 0.018 (small; we see 0.004 / 0.014), and check the mean is not vacuous: PyTorch's f32
//    model is farther from PyTorch's bf16 model than we are (BF16EmulationIsCloserThanF32 below).
const GoldenModel kGoldenModels[] = {
    {"tiny", DType::F32, "", 1e-4, 1e-5},
    {"small", DType::F32, "", 1e-4, 1e-5},
    {"tiny", DType::BF16, "_emulated", 1e-4, 1e-5},
    {"small", DType::BF16, "_emulated", 1e-4, 1e-5},
    {"tiny", DType::BF16, "", 0.1, 0.006},
    {"small", DType::BF16, "", 0.1, 0.018},
};

void PrintTo(const GoldenModel& g, std::ostream* os) { *os << g.preset << " " << dtype_name(g.dtype) << g.suffix; }

std::string golden_path(const GoldenModel& g) {
  return std::string(TRL_TEST_DATA_DIR) + "/goldens/qwen3_" + g.preset + "_" + std::string(dtype_name(g.dtype)) + g.suffix + ".json";
}

CausalLM make_model(const GoldenModel& g, const test::TempDir& dir) {
  InitOptions o;
  o.preset = g.preset;
  o.dtype = g.dtype;
  o.seed = 1234;
  o.initializer_range = 0.1;
  o.randomize_norms = true;
  init_model(o, dir.path());
  return CausalLM::from_pretrained(dir.path());
}

Tensor ints_to_tensor(const json& rows) {
  const int64_t B = static_cast<int64_t>(rows.size()), T = static_cast<int64_t>(rows[0].size());
  std::vector<int32_t> v;
  for (const auto& r : rows)
    for (const auto& x : r) v.push_back(x.get<int32_t>());
  return Tensor::from_i32(v, {B, T});
}

double rel_err(double ours, double golden) { return std::fabs(ours - golden) / std::max(1.0, std::fabs(golden)); }

void check_golden(const GoldenModel& g, Backend& backend);

class Golden : public ::testing::TestWithParam<GoldenModel> {};

TEST_P(Golden, LogitsMatchPyTorch) {
  auto backend = make_reference_backend();
  check_golden(GetParam(), *backend);
}

// The CPU backend against the same f32 goldens (its f32 accumulation order differs from PyTorch's as much as the
// reference's f64 does, so the same 1e-4 applies).
TEST(Golden, CpuBackendLogitsMatchPyTorch) {
  auto backend = make_cpu_backend();
  check_golden(kGoldenModels[0], *backend);
  check_golden(kGoldenModels[1], *backend);
}

// The golden's weight samples against `model`: equal (tolerance 0), or within `tolerance` (a retrained model).
void check_weight_samples(const json& golden, const CausalLM& model, double tolerance, const char* what) {
  for (auto it = golden["weight_samples"].begin(); it != golden["weight_samples"].end(); ++it) {
    ASSERT_TRUE(model.weights().count(it.key())) << it.key();
    const std::vector<float> w = model.weights().at(it.key()).to_f32_vector();
    for (const auto& s : it.value()) {
      if (tolerance == 0) {
        ASSERT_EQ(static_cast<double>(w.at(s[0].get<size_t>())), s[1].get<double>()) << it.key() << "[" << s[0] << "]: " << what;
        continue;
      }
      ASSERT_NEAR(static_cast<double>(w.at(s[0].get<size_t>())), s[1].get<double>(), tolerance) << it.key() << "[" << s[0] << "]: " << what;
    }
  }
}

void check_logits(const json& golden, const CausalLM& model, const GoldenModel& g, Backend& backend_ref);

void check_golden(const GoldenModel& g, Backend& backend_ref) {
  const json golden = json::parse(read_text_file(golden_path(g)));
  test::TempDir dir;
  const CausalLM model = make_model(g, dir);
  ASSERT_EQ(model.dtype(), g.dtype);
  // The model we generated is the one the goldens were made from.
  check_weight_samples(golden, model, 0, "init-model changed");
  check_logits(golden, model, g, backend_ref);
}

void check_logits(const json& golden, const CausalLM& model, const GoldenModel& g, Backend& backend_ref) {
  const std::vector<int64_t> columns = golden["columns"].get<std::vector<int64_t>>();
  const int64_t V = model.config().vocab_size;
  Backend* backend = &backend_ref;
  double worst = 0, sum_err = 0;
  int compared = 0, n_err = 0;
  for (const json& c : golden["cases"]) {
    Batch batch;
    batch.input_ids = ints_to_tensor(c["input_ids"]);
    batch.attention_mask = ints_to_tensor(c["attention_mask"]);
    const int64_t T = batch.input_ids.size(1);
    const Tensor logits = model.forward(batch, *backend);
    for (const json& p : c["positions"]) {
      const float* row = logits.data_as<float>() + (p["b"].get<int64_t>() * T + p["t"].get<int64_t>()) * V;
      double mx = -INFINITY, sum = 0, sumsq = 0, se = 0;
      int64_t argmax = 0;
      for (int64_t v = 0; v < V; ++v) {
        if (row[v] > mx) mx = row[v], argmax = v;
        sum += row[v];
        sumsq += static_cast<double>(row[v]) * row[v];
      }
      for (int64_t v = 0; v < V; ++v) se += std::exp(row[v] - mx);
      const double lse = mx + std::log(se);
      const std::string where = fmt::format("case pad={} b={} t={}", c["pad_side"].get<std::string>(), p["b"].get<int>(), p["t"].get<int>());
      worst = test::nan_max(worst, rel_err(lse, p["logsumexp"].get<double>()));
      EXPECT_LE(rel_err(lse, p["logsumexp"].get<double>()), g.max_tolerance) << where << " logsumexp";
      // Sums over the whole row: compare relative to the row's scale.
      const double row_scale = std::sqrt(p["sumsq"].get<double>());
      EXPECT_LE(std::fabs(sum - p["sum"].get<double>()) / std::max(1.0, row_scale), g.max_tolerance) << where << " sum";
      EXPECT_LE(std::fabs(sumsq - p["sumsq"].get<double>()) / std::max(1.0, p["sumsq"].get<double>()), 2 * g.max_tolerance) << where << " sumsq";
      // The golden argmax is (within tolerance) as large as our maximum.
      EXPECT_LE(rel_err(row[p["argmax"].get<int64_t>()], mx), g.max_tolerance) << where << " argmax " << argmax;
      for (size_t k = 0; k < columns.size(); ++k) {
        const double e = rel_err(row[columns[k]], p["columns"][k].get<double>());
        worst = test::nan_max(worst, e);
        sum_err += e;
        ++n_err;
        EXPECT_LE(e, g.max_tolerance) << where << " column " << columns[k];
      }
      ++compared;
    }
  }
  EXPECT_GT(compared, 50);
  EXPECT_LE(sum_err / std::max(1, n_err), g.mean_tolerance);
  std::printf("[ golden ] %s %s: %d positions, max relative error %.3g (tolerance %.3g), mean %.3g\n", g.preset,
              (std::string(dtype_name(g.dtype)) + g.suffix).c_str(), compared, worst, g.max_tolerance, sum_err / std::max(1, n_err));
}

INSTANTIATE_TEST_SUITE_P(Qwen3, Golden, ::testing::ValuesIn(kGoldenModels), [](const auto& param_info) {
  std::string suffix = param_info.param.suffix;
  return std::string(param_info.param.preset) + "_" + std::string(dtype_name(param_info.param.dtype)) + (suffix.empty() ? "_eager" : suffix);
});

// A folder saved by `trl sft` is a Hugging Face model folder that PyTorch loads (tests/reference/qwen3_reference.py
// --hf-folder checks its files, config fields, tensor names, shapes and dtype, then computes logits). The same run
// (tests/data/sft/golden_recipe.yaml: 4 f32 steps on the tiny golden model and the demo chat data) is repeated here
// and the saved folder must give PyTorch's logits. f32 training on another CPU differs in summation order only:
// weight samples within 2e-5, logits within the f32 goldens' 1e-4 (we see 2e-6, also with oneDNN limited to AVX2).
TEST(Golden, SftSavedFolderLoadsInPyTorch) {
  const json golden = json::parse(read_text_file(std::string(TRL_TEST_DATA_DIR) + "/goldens/qwen3_tiny_sft.json"));
  ASSERT_TRUE(golden.contains("hf_folder_files"));
  test::TempDir dir;
  const GoldenModel base{"tiny", DType::F32, "", 1e-4, 1e-5};
  InitOptions o;
  o.preset = "tiny";
  o.dtype = DType::F32;
  o.seed = 1234;
  o.initializer_range = 0.1;
  o.randomize_norms = true;
  init_model(o, dir.file("base"));
  test::write_file(dir.file("chat.jsonl"), std::string(asset("demo/chat.jsonl")));
  std::string out;
  ASSERT_EQ(test::run_command(std::string(TRL_BINARY) + " sft --config " + TRL_TEST_DATA_DIR + "/sft/golden_recipe.yaml --model_name_or_path " +
                                  dir.file("base") + " --dataset_name " + dir.file("chat.jsonl") + " --output_dir " + dir.file("out") + " 2>&1",
                              &out),
            0)
      << out;
  for (const auto& f : golden["hf_folder_files"]) {
    const std::string name = f.get<std::string>();
    EXPECT_TRUE(std::filesystem::exists(dir.file("out/" + name))) << name;
  }
  const CausalLM tuned = CausalLM::from_pretrained(dir.file("out"));
  ASSERT_EQ(tuned.dtype(), DType::F32);
  check_weight_samples(golden, tuned, 2e-5, "the retrained weights differ from the golden run's");
  auto backend = make_cpu_backend();
  check_logits(golden, tuned, base, *backend);
}

// The eager-bf16 mean tolerance is meaningful: PyTorch's f32 model is farther from PyTorch's bf16 model than the
// tolerance, so a backend that ignored bf16 rounding altogether would fail the eager-bf16 check.
TEST(Golden, BF16EmulationIsCloserThanF32) {
  for (const GoldenModel& g : {kGoldenModels[4], kGoldenModels[5]}) {
    const std::string preset = g.preset;
    const json f32 = json::parse(read_text_file(std::string(TRL_TEST_DATA_DIR) + "/goldens/qwen3_" + preset + "_f32.json"));
    const json bf16 = json::parse(read_text_file(std::string(TRL_TEST_DATA_DIR) + "/goldens/qwen3_" + preset + "_bf16.json"));
    double sum = 0;
    int n = 0;
    for (size_t c = 0; c < f32["cases"].size(); ++c) {
      for (size_t p = 0; p < f32["cases"][c]["positions"].size(); ++p) {
        const auto& a = f32["cases"][c]["positions"][p]["columns"];
        const auto& b = bf16["cases"][c]["positions"][p]["columns"];
        for (size_t k = 0; k < a.size(); ++k, ++n) sum += rel_err(a[k].get<double>(), b[k].get<double>());
      }
    }
    EXPECT_GT(sum / n, g.mean_tolerance) << preset;
  }
}

}  // namespace
}  // namespace trl

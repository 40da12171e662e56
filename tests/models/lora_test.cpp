// LoRA adapters in PEFT's format (trl/models/lora.h, docs/LORA.md) against tests/reference/lora_reference.py, an
// independent PyTorch implementation of PEFT's adapted linear layers and merge: an adapter in PEFT's layout written
// by that script loads here with PyTorch's logits; the adapter `trl sft --use_peft` saves loads there (its files,
// names, shapes and dtypes checked by the script) with the same logits; 3 SFT AdamW steps of the adapter alone match
// PyTorch's. Then the properties: a fresh adapter (B = 0) leaves the logits unchanged, merged == unmerged, the
// trainer keeps no masters for the frozen base, and adapter configs that change the math are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "golden_util.h"
#include "test_util.h"
#include "train/optim/adamw.h"
#include "assets/assets.h"
#include "trl/backend/cpu/cpu_backend.h"
#include "trl/io/safetensors.h"
#include "trl/models/lora.h"
#include "trl/train/objectives.h"
#include "trl/train/sft_trainer.h"

namespace trl {
namespace {

using json = nlohmann::json;

json lora_golden() { return json::parse(read_text_file(std::string(TRL_TEST_DATA_DIR) + "/goldens/lora_tiny.json")); }
std::string peft_adapter_dir() { return TRL_TEST_DATA_DIR "/lora/peft_tiny"; }

// The golden's logits (lora_reference.py's summary of each position: logsumexp and chosen columns) against `model`'s.
void expect_logits(const json& golden, const CausalLM& model, double tolerance, const std::string& what) {
  auto backend = make_cpu_backend();
  const std::vector<int64_t> columns = golden["columns"].get<std::vector<int64_t>>();
  const int64_t V = model.config().vocab_size;
  double worst = 0;
  int compared = 0;
  for (const json& c : golden["cases"]) {
    Batch batch;
    auto ints = [](const json& rows) {
      const int64_t B = static_cast<int64_t>(rows.size()), T = static_cast<int64_t>(rows[0].size());
      Tensor t = Tensor::zeros(DType::I32, {B, T});
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < T; ++i) t.mutable_data_as<int32_t>()[b * T + i] = rows[static_cast<size_t>(b)][static_cast<size_t>(i)].get<int32_t>();
      return t;
    };
    batch.input_ids = ints(c["input_ids"]);
    batch.attention_mask = ints(c["attention_mask"]);
    const int64_t T = batch.input_ids.size(1);
    const Tensor logits = model.forward(batch, *backend);
    for (const json& p : c["positions"]) {
      const float* row = logits.data_as<float>() + (p["b"].get<int64_t>() * T + p["t"].get<int64_t>()) * V;
      double mx = -INFINITY, se = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      for (int64_t v = 0; v < V; ++v) se += std::exp(row[v] - mx);
      const double lse = mx + std::log(se), scale = std::max(1.0, std::fabs(p["logsumexp"].get<double>()));
      worst = test::nan_max(worst, std::fabs(lse - p["logsumexp"].get<double>()) / scale);
      for (size_t k = 0; k < columns.size(); ++k)
        worst = test::nan_max(worst, std::fabs(row[columns[k]] - p["columns"][k].get<double>()) / std::max(1.0, std::fabs(p["columns"][k].get<double>())));
      ++compared;
    }
  }
  EXPECT_GT(compared, 10) << what;
  EXPECT_LE(worst, tolerance) << what << ": worst relative error " << worst;  // fails on NaN
  std::printf("[ lora golden ] %s: %d positions, worst relative error %.3g\n", what.c_str(), compared, worst);
}

TEST(LoraGolden, PeftAdapterGivesPyTorchLogitsMergedOrNot) {
  const json golden = lora_golden();
  test::GoldenModel base;
  const LoraAdapter adapter = load_adapter(peft_adapter_dir(), base.model.config());
  EXPECT_EQ(adapter.modules.size(), 8u);  // q_proj, v_proj, up_proj, down_proj of 2 layers
  EXPECT_DOUBLE_EQ(adapter.config.scaling(), 2.0);
  const CausalLM adapted = base.model.with_adapter(adapter);
  expect_logits(golden["peft"], adapted, 1e-4, "PEFT adapter, unmerged");
  expect_logits(golden["peft"], adapted.merged(), 1e-4, "PEFT adapter, merged");
}

// The recipe of tests/data/lora/lora_recipe.yaml (f32, all linear layers, dropout 0.05) on the golden model and the
// demo chat data, as make_goldens.sh runs it; PyTorch loaded what it saved.
TEST(LoraGolden, AdapterSavedByTrlSftLoadsInPyTorch) {
  const json golden = lora_golden();
  test::GoldenModel base;
  test::write_file(base.dir.file("chat.jsonl"), std::string(asset("demo/chat.jsonl")));
  std::string out;
  ASSERT_EQ(test::run_command(std::string(TRL_BINARY) + " sft --config " + TRL_TEST_DATA_DIR + "/lora/lora_recipe.yaml --model_name_or_path " +
                                  base.dir.file("m") + " --dataset_name " + base.dir.file("chat.jsonl") + " --output_dir " + base.dir.file("out") + " 2>&1",
                              &out),
            0)
      << out;
  const std::string dir = base.dir.file("out");
  for (const auto& f : golden["trl_adapter_files"]) EXPECT_TRUE(std::filesystem::exists(dir + "/" + f.get<std::string>())) << f;
  EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors")) << "an adapter run saves the adapter, not the model";
  // Only adapter tensors, named as PEFT names them, f32.
  const SafeTensorsFile f = SafeTensorsFile::open(dir + "/adapter_model.safetensors");
  EXPECT_EQ(f.names().size(), 2u * 7 * 2);  // lora_A and lora_B of 7 linear layers in 2 decoder layers
  for (const std::string& n : f.names()) {
    EXPECT_TRUE(n.starts_with("base_model.model.model.layers.") && (n.ends_with(".lora_A.weight") || n.ends_with(".lora_B.weight"))) << n;
    EXPECT_EQ(f.info(n).dtype, DType::F32) << n;
  }
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const json config = json::parse(read_text_file(dir + "/adapter_config.json"));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 8);
  EXPECT_EQ(config["lora_alpha"], 16);
  EXPECT_EQ(config["task_type"], "CAUSAL_LM");
  EXPECT_EQ(config["base_model_name_or_path"], base.dir.file("m"));
  // Loaded from the adapter folder alone (its base through base_model_name_or_path): PyTorch's logits.
  const CausalLM tuned = CausalLM::from_pretrained(dir);
  ASSERT_NE(tuned.lora(), nullptr);
  for (const auto& [name, samples] : golden["trl_adapter_samples"].items()) {
    const std::vector<float> w = tuned.weights().at(name).to_f32_vector();
    for (const auto& s : samples) EXPECT_NEAR(w.at(s[0].get<size_t>()), s[1].get<double>(), 2e-5) << name << "[" << s[0] << "]";
  }
  expect_logits(golden["trl"], tuned, 1e-4, "adapter saved by trl sft");
}

// 3 AdamW steps on lora_A and lora_B alone, the base frozen: the programs return gradients of the adapter only.
TEST(LoraGolden, ThreeSftStepsOfTheAdapterMatchPyTorch) {
  const json golden = lora_golden()["train"];
  test::GoldenModel base;
  const CausalLM model = base.model.with_adapter(load_adapter(peft_adapter_dir(), base.model.config()));
  const std::vector<std::string> trained = model.trainable_parameters();
  ASSERT_EQ(trained.size(), 16u);
  // The batch of qwen3_train_reference.py: right-padded rows, loss = −Σ log p / tokens.
  const json& rows = golden["rows"];
  const int64_t B = static_cast<int64_t>(rows.size());
  int64_t T = 0, items = 0;
  for (const auto& r : rows) T = std::max<int64_t>(T, static_cast<int64_t>(r.size())), items += static_cast<int64_t>(r.size()) - 1;
  Tensor ids = Tensor::zeros(DType::I32, {B, T}), mask = Tensor::zeros(DType::I32, {B, T}), labels = Tensor::zeros(DType::I32, {B, T});
  Tensor weights = Tensor::zeros(DType::F32, {B, T});
  for (int64_t b = 0; b < B; ++b) {
    const auto& r = rows[static_cast<size_t>(b)];
    for (size_t t = 0; t < r.size(); ++t) {
      const int64_t i = b * T + static_cast<int64_t>(t);
      ids.mutable_data_as<int32_t>()[i] = r[t].get<int32_t>();
      mask.mutable_data_as<int32_t>()[i] = 1;
      if (t + 1 < r.size()) labels.mutable_data_as<int32_t>()[i] = r[t + 1].get<int32_t>(), weights.mutable_data_as<float>()[i] = -1.0f / static_cast<float>(items);
    }
  }
  const graph::Graph g = training_graph(model, B, T);
  for (const auto& [name, index] : g.output_indices()) {  // no gradient of a base weight is computed
    if (name.starts_with("grad.")) {
      EXPECT_TRUE(std::find(trained.begin(), trained.end(), name.substr(5)) != trained.end()) << name;
    }
  }
  auto program = make_cpu_backend()->compile(g);
  TensorMap params;
  for (const std::string& n : trained) params[n] = model.weights().at(n).to(DType::F32).clone();
  auto run = [&] {
    TensorMap in = model.weights();
    for (const auto& [n, t] : params) in[n] = t;
    in["input_ids"] = ids, in["attention_mask"] = mask, in["position_ids"] = default_position_ids(mask), in["labels"] = labels;
    in["loss_weights"] = weights;
    return program->run(in);
  };
  AdamW opt(AdamWConfig{golden["betas"][0].get<double>(), golden["betas"][1].get<double>(), golden["eps"].get<double>(), golden["weight_decay"].get<double>()});
  for (size_t step = 0; step < 3; ++step) {
    const std::vector<Tensor> out = run();
    const double loss = load_element(out[0].data(), out[0].dtype(), 0);
    EXPECT_NEAR(loss, golden["losses"][step].get<double>(), 1e-5 * std::fabs(loss)) << "step " << step;
    TensorMap grads;
    for (const std::string& n : trained) grads[n] = out.at(g.output_index("grad." + n));
    if (step == 0) {
      for (const std::string& n : trained) {
        const json& want = golden["grads"][n];
        const std::vector<float> got = grads.at(n).to_f32_vector();
        double sumsq = 0;
        for (float x : got) sumsq += static_cast<double>(x) * x;
        const double norm = std::sqrt(want["sumsq"].get<double>());
        EXPECT_NEAR(std::sqrt(sumsq), norm, 1e-4 * norm + 1e-9) << n;
        for (const auto& s : want["samples"]) EXPECT_NEAR(got.at(s[0].get<size_t>()), s[1].get<double>(), 1e-4 * norm + 1e-9) << n << "[" << s[0] << "]";
      }
    }
    opt.step(params, grads, golden["lr"].get<double>(), *make_cpu_backend());
  }
  const std::vector<Tensor> out = run();
  EXPECT_NEAR(load_element(out[0].data(), out[0].dtype(), 0), golden["final_loss"].get<double>(), 1e-5 * golden["final_loss"].get<double>());
  for (const auto& [name, samples] : golden["params_after"].items())
    for (const auto& s : samples) EXPECT_NEAR(params.at(name).data_as<float>()[s[0].get<int64_t>()], s[1].get<double>(), 2e-6) << name;
}

// B = 0 at initialisation: the adapted model computes exactly what the base does, in f32 and bf16.
TEST(Lora, FreshAdapterLeavesTheLogitsUnchanged) {
  test::GoldenModel base;
  auto backend = make_cpu_backend();
  Batch batch;
  batch.input_ids = Tensor::from_i32(std::vector<int32_t>{785, 8585, 49041, 7506, 5302, 13, 151644, 872}, {2, 4});
  for (DType dt : {DType::F32, DType::BF16}) {
    const CausalLM m = dt == DType::F32 ? base.model : base.model.with_weights([&] {
      TensorMap w;
      for (const auto& [n, t] : base.model.weights()) w[n] = t.to(DType::BF16);
      return w;
    }(), "bf16");
    LoraConfig c;
    c.target_modules = {"all-linear"};
    c.r = 4;
    const CausalLM adapted = m.with_adapter(init_lora(m.config(), c, 7));
    EXPECT_EQ(adapted.lora_modules().size(), 14u);
    const Tensor a = m.forward(batch, *backend), b = adapted.forward(batch, *backend);
    ASSERT_EQ(a.numel(), b.numel());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << dtype_name(dt);
  }
}

// A fresh adapter's A is PEFT's kaiming_uniform(a = √5): uniform in ±1/√in (mean 0, variance 1/(3·in)), B is zero.
TEST(Lora, InitialisationIsPeftsKaimingUniformAndZeroB) {
  test::GoldenModel base;
  LoraConfig c;
  c.target_modules = {"q_proj", "down_proj"};
  c.r = 16;
  const LoraAdapter a = init_lora(base.model.config(), c, 1);
  ASSERT_EQ(a.modules.size(), 4u);
  for (const std::string& m : a.modules) {
    const std::vector<float> A = a.weights.at(m + ".lora_A.weight").to_f32_vector(), B = a.weights.at(m + ".lora_B.weight").to_f32_vector();
    const double in = static_cast<double>(lora_module_shape(base.model.config(), m)[1]), bound = 1 / std::sqrt(in);
    double sum = 0, sq = 0;
    for (float x : A) {
      ASSERT_TRUE(std::fabs(x) <= bound) << m << ": " << x;
      sum += x, sq += static_cast<double>(x) * x;
    }
    const double n = static_cast<double>(A.size()), var = sq / n;
    EXPECT_NEAR(sum / n, 0, 4 * std::sqrt(bound * bound / 3 / n)) << m;
    EXPECT_NEAR(var, bound * bound / 3, 0.1 * bound * bound / 3) << m;
    for (float x : B) ASSERT_EQ(x, 0.0f) << m;
  }
  // Another seed, another A; the same seed, the same A.
  EXPECT_EQ(init_lora(base.model.config(), c, 1).weights.at(a.modules[0] + ".lora_A.weight").to_f32_vector(),
            a.weights.at(a.modules[0] + ".lora_A.weight").to_f32_vector());
  EXPECT_NE(init_lora(base.model.config(), c, 2).weights.at(a.modules[0] + ".lora_A.weight").to_f32_vector(),
            a.weights.at(a.modules[0] + ".lora_A.weight").to_f32_vector());
}

// Adapter configs and folders that trl cannot compute as PEFT would are refused with what and how to fix it.
TEST(Lora, ConfigsThatChangeTheMathAndBrokenFoldersAreErrors) {
  test::GoldenModel base;
  const ModelConfig& mc = base.model.config();
  auto config_error = [&](const std::string& extra) {
    json j = json::parse(read_text_file(peft_adapter_dir() + "/adapter_config.json"));
    j.merge_patch(json::parse(extra));
    return test::error_of([&] { (void)LoraConfig::from_json(j, "adapter_config.json"); });
  };
  EXPECT_NE(config_error(R"({"use_dora": true})").find("DoRA"), std::string::npos);
  EXPECT_NE(config_error(R"({"rank_pattern": {"q_proj": 8}})").find("rank_pattern"), std::string::npos);
  EXPECT_NE(config_error(R"({"layers_to_transform": [0]})").find("layers_to_transform"), std::string::npos);
  EXPECT_NE(config_error(R"({"bias": "all"})").find("bias"), std::string::npos);
  EXPECT_NE(config_error(R"({"peft_type": "IA3"})").find("IA3"), std::string::npos);
  // Of the wrong kind, named as such (it was called "missing"); a base model name that is not text is named too.
  EXPECT_NE(config_error(R"({"peft_type": 7})").find("peft_type must be text (\"LORA\"), got a whole number"), std::string::npos);
  EXPECT_NE(config_error(R"({"base_model_name_or_path": 7})").find("'base_model_name_or_path' must be text, got a whole number"), std::string::npos);
  EXPECT_NE(config_error(R"({"task_type": ["CAUSAL_LM"]})").find("'task_type' must be text, got a list"), std::string::npos);
  EXPECT_NE(config_error(R"({"r": 0})").find("r must be"), std::string::npos);
  // null as PEFT reads it (issue 37, defect 9): the numbers of the arithmetic are refused (PEFT fails on them), the
  // fields PEFT writes as null for options left unset load as unset.
  auto with_nulls = [&](const std::vector<std::string>& keys) {
    json j = json::parse(read_text_file(peft_adapter_dir() + "/adapter_config.json"));
    for (const std::string& k : keys) j[k] = nullptr;
    return j;
  };
  for (const char* key : {"r", "lora_alpha", "lora_dropout"}) {
    const std::string e = test::error_of([&] { (void)LoraConfig::from_json(with_nulls({key}), "adapter_config.json"); });
    EXPECT_NE(e.find(std::string("adapter_config.json: '") + key + "' is null; an adapter needs its value"), std::string::npos) << e;
  }
  EXPECT_NE(test::error_of([&] { (void)LoraConfig::from_json(with_nulls({"bias"}), "adapter_config.json"); }).find("bias is null"), std::string::npos);
  const LoraConfig unset = LoraConfig::from_json(
      with_nulls({"use_rslora", "use_dora", "fan_in_fan_out", "target_modules", "modules_to_save", "layers_to_transform", "layers_pattern", "rank_pattern",
                  "alpha_pattern", "task_type", "base_model_name_or_path", "revision", "megatron_config", "loftq_config", "exclude_modules"}),
      "adapter_config.json");
  EXPECT_FALSE(unset.use_rslora);
  EXPECT_TRUE(unset.target_modules.empty());  // the model type's default (q_proj, v_proj)
  EXPECT_TRUE(unset.modules_to_save.empty());
  EXPECT_EQ(unset.task_type, "CAUSAL_LM");
  EXPECT_DOUBLE_EQ(unset.scaling(), LoraConfig::from_json(with_nulls({}), "adapter_config.json").scaling());
  LoraConfig c;
  c.target_modules = {"qkv"};
  EXPECT_NE(test::error_of([&] { (void)lora_target_modules(mc, c); }).find("'qkv' matches none"), std::string::npos);
  c.target_modules = {"lm_head"};
  EXPECT_NE(test::error_of([&] { (void)lora_target_modules(mc, c); }).find("modules_to_save"), std::string::npos);
  c.target_regex = "model\\.layers\\.1\\..*(q|v)_proj";
  EXPECT_EQ(lora_target_modules(mc, c), (std::vector<std::string>{"model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"}));
  c.target_regex = "(";
  EXPECT_NE(test::error_of([&] { (void)lora_target_modules(mc, c); }).find("cannot compile"), std::string::npos);
  c = LoraConfig{};
  c.modules_to_save = {"lm_head"};  // tied embeddings: no lm_head
  EXPECT_NE(test::error_of([&] { (void)lora_saved_parameters(c, {"model.embed_tokens.weight"}); }).find("embed_tokens"), std::string::npos);
  // A folder whose tensors do not fit the model, or that lacks one.
  test::TempDir dir;
  LoraAdapter a = load_adapter(peft_adapter_dir(), mc);
  TensorMap w = a.weights;
  w.erase("model.layers.0.self_attn.q_proj.lora_B.weight");
  save_adapter(dir.path(), a.config, w);
  EXPECT_NE(test::error_of([&] { (void)load_adapter(dir.path(), mc); }).find("no tensor for 'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight'"),
            std::string::npos);
  w = a.weights;
  w["model.layers.0.self_attn.q_proj.lora_B.weight"] = Tensor::zeros(DType::F32, {5, 4});
  save_adapter(dir.path(), a.config, w);
  EXPECT_NE(test::error_of([&] { (void)load_adapter(dir.path(), mc); }).find("another model"), std::string::npos);
  // PEFT's SEQ_CLS configs name "classifier" beside "score": a module this model lacks is dropped on load.
  LoraConfig seq = a.config;
  seq.modules_to_save = {"classifier"};
  save_adapter(dir.path(), seq, a.weights);
  EXPECT_TRUE(load_adapter(dir.path(), mc).config.modules_to_save.empty());
  std::filesystem::remove(dir.file("adapter_model.safetensors"));
  EXPECT_NE(test::error_of([&] { (void)load_adapter(dir.path(), mc); }).find("no adapter_model.safetensors"), std::string::npos);
}

// The trainer with an adapter: masters and gradients for the adapter (and modules_to_save) only, and the saved
// adapter holds exactly those tensors. (That the frozen base shares the model's tensors is not observable through
// the public API and is not tested here; the memory figures in docs/PERFORMANCE.md show it.)
TEST(Lora, TrainerKeepsMastersForTheAdapterOnly) {
  test::GoldenModel base;
  test::write_file(base.dir.file("chat.jsonl"), std::string(asset("demo/chat.jsonl")));
  SFTConfig c;
  c.output_dir = base.dir.file("out");
  c.bf16 = false;
  c.max_steps = 2;
  c.per_device_train_batch_size = 2;
  c.report = false;
  c.progress = false;
  c.save_steps = 1000;
  c.peft_config = LoraConfig{};
  c.peft_config->target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  c.peft_config->modules_to_save = {"model.norm"};
  SFTTrainer tr(base.model, test::qwen3_tokenizer(), load_dataset(base.dir.file("chat.jsonl")), c);
  std::vector<std::string> masters;
  for (const auto& [name, w] : tr.master_weights()) masters.push_back(name);
  EXPECT_EQ(masters.size(), 2u * 4 * 2 + 1);
  for (const std::string& n : masters) EXPECT_TRUE(n.ends_with(".lora_A.weight") || n.ends_with(".lora_B.weight") || n == "model.norm.weight") << n;
  int64_t steps = 0;
  tr.on_pre_optimizer_step = [&](int64_t, const TensorMap& grads) {
    ++steps;
    EXPECT_EQ(grads.size(), masters.size());
    double sq = 0;
    for (const auto& [n, g] : grads)
      for (float x : g.to_f32_vector()) sq += static_cast<double>(x) * x;
    EXPECT_TRUE(std::isfinite(sq) && sq > 0);
  };
  tr.train();
  EXPECT_EQ(steps, 2);
  // The saved adapter holds the adapted modules and the saved norm, and says so in its config.
  const LoraAdapter saved = load_adapter(c.output_dir, base.model.config());
  EXPECT_EQ(saved.config.modules_to_save, std::vector<std::string>{"model.norm"});
  EXPECT_TRUE(saved.weights.count("model.norm.weight"));
  EXPECT_EQ(saved.weights.size(), masters.size());
}

}  // namespace
}  // namespace trl

namespace trl {
namespace {

std::vector<double> scored(const std::string& out) {
  const json j = json::parse(out.substr(0, out.find('\n')));
  return j["token_logprobs"].get<std::vector<double>>();
}

// The commands that use an adapter: score and generate with --adapter (or the adapter folder as --model), and
// merge-adapter, whose merged folder scores and generates as the adapter does; bad folders are named.
TEST(LoraCli, AdapterScoresAndGeneratesMergedOrNot) {
  test::GoldenModel base;
  const std::string trl = TRL_BINARY, m = base.dir.file("m"), a = peft_adapter_dir(), merged = base.dir.file("merged");
  std::string out;
  ASSERT_EQ(test::run_command(trl + " merge-adapter --adapter " + a + " --model " + m + " --output_dir " + merged + " 2>&1", &out), 0) << out;
  EXPECT_NE(out.find("\"merged_modules\": 8"), std::string::npos) << out;
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) EXPECT_TRUE(std::filesystem::exists(merged + "/" + f)) << f;
  EXPECT_FALSE(std::filesystem::exists(merged + "/.merge.tmp"));
  const std::string text = " --text 'The quick brown fox jumps over the lazy dog'";
  std::string with_adapter, with_merged, plain;
  ASSERT_EQ(test::run_command(trl + " score --model " + m + " --adapter " + a + text + " 2>/dev/null", &with_adapter), 0) << with_adapter;
  ASSERT_EQ(test::run_command(trl + " score --model " + merged + text + " 2>/dev/null", &with_merged), 0) << with_merged;
  ASSERT_EQ(test::run_command(trl + " score --model " + m + text + " 2>/dev/null", &plain), 0) << plain;
  const std::vector<double> x = scored(with_adapter), y = scored(with_merged), z = scored(plain);
  ASSERT_EQ(x.size(), y.size());
  double gap = 0, moved = 0;
  for (size_t i = 0; i < x.size(); ++i) gap = test::nan_max(gap, std::fabs(x[i] - y[i])), moved = test::nan_max(moved, std::fabs(x[i] - z[i]));
  EXPECT_LE(gap, 1e-4);   // merged == unmerged (f32)
  EXPECT_GT(moved, 1e-3);  // and the adapter changes the model
  std::string g1, g2;
  const std::string gen = " --prompt 'Hello there' --max_new_tokens 6 --do_sample false 2>/dev/null";
  ASSERT_EQ(test::run_command(trl + " generate --model " + m + " --adapter " + a + gen, &g1), 0) << g1;
  ASSERT_EQ(test::run_command(trl + " generate --model " + merged + gen, &g2), 0) << g2;
  EXPECT_EQ(g1, g2);
  // The adapter's base_model_name_or_path ("tiny-golden") is in no folder or cache: named, with the fix.
  EXPECT_NE(test::run_command(trl + " merge-adapter --adapter " + a + " --output_dir " + base.dir.file("x") + " 2>&1", &out), 0);
  EXPECT_NE(out.find("the adapter's base model 'tiny-golden' (base_model_name_or_path in adapter_config.json) did not load"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(base.dir.file("x/model.safetensors")));
  EXPECT_NE(test::run_command(trl + " score --model " + m + " --adapter " + m + text + " 2>&1", &out), 0);
  EXPECT_NE(out.find("not a PEFT adapter folder"), std::string::npos) << out;
}

}  // namespace
}  // namespace trl

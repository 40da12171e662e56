// LoRA on a mixture of experts against PEFT itself (tests/reference/qwen3_moe_lora_reference.py): an adapter PEFT
// made on tests/data/moe/topk_norm that targets q_proj (a module) and, as target_parameters, the router and both
// stacked expert parameters, with random lora_B. trl loads PEFT's folder (the experts' adapters nested as PEFT
// nests them, lora_B in PEFT's [out, r·E] layout), and matches the adapted model's logits, loss, aux loss and every
// adapter tensor's gradient, writes the folder back with PEFT's names and bytes, and merges as merge_and_unload().
// Then the option's errors, and an SFT run that trains the experts' adapters.
#include <cmath>
#include <cstring>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "graph/autodiff.h"
#include "models/moe_golden.h"
#include "test_util.h"
#include "trl/backend/registry.h"
#include "trl/core/error.h"
#include "trl/io/safetensors.h"
#include "trl/models/causal_lm.h"
#include "trl/models/init.h"
#include "trl/models/lora.h"
#include "trl/train/sft_trainer.h"

namespace trl {
namespace {

using json = nlohmann::json;
using graph::kNone;
using graph::ValueId;

const json& golden() {
  static const json g = json::parse(read_text_file(std::string(TRL_TEST_DATA_DIR) + "/goldens/qwen3_moe_lora.json"));
  return g;
}
std::string moe_dir(const std::string& name) { return fmt::format("{}/moe/{}", TRL_TEST_DATA_DIR, name); }

using Rows = PaddedBatch;
Rows golden_rows() { return golden_batch(golden()["rows"]); }

// The largest |got − want| / max(1, |want|) over every real position's logits; NaN gives NaN.
double logits_gap(const Tensor& logits, const json& want, const Rows& p) {
  const int64_t V = logits.size(2);
  double worst = 0;
  for (int64_t b = 0; b < p.B; ++b)
    for (size_t t = 0; t < want[static_cast<size_t>(b)].size(); ++t)
      for (int64_t v = 0; v < V; ++v) {
        const double w = want[static_cast<size_t>(b)][t][static_cast<size_t>(v)].get<double>();
        const double got = logits.data_as<float>()[(b * p.T + static_cast<int64_t>(t)) * V + v];
        const double gap = std::fabs(got - w) / std::max(1.0, std::fabs(w));
        if (!(gap <= worst)) worst = gap;
      }
  return worst;
}

CausalLM adapted() {
  const CausalLM base = CausalLM::from_pretrained(moe_dir("topk_norm"));
  return base.with_adapter(load_adapter(moe_dir("lora_topk_norm"), base.config()));
}

TEST(MoeLora, LoadsPeftsTargetParametersAdapter) {
  const CausalLM model = adapted();
  const std::vector<std::string> want = {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.gate", "model.layers.0.mlp.experts.gate_up_proj",
                                         "model.layers.0.mlp.experts.down_proj", "model.layers.1.self_attn.q_proj", "model.layers.1.mlp.gate",
                                         "model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"};
  EXPECT_EQ(model.lora_modules(), want);
  const TensorMap& w = model.weights();
  EXPECT_EQ(w.at("model.layers.0.mlp.experts.gate_up_proj.lora_A.weight").shape(), (Shape{8 * 4, 32}));  // [E·r, C]
  EXPECT_EQ(w.at("model.layers.0.mlp.experts.gate_up_proj.lora_B.weight").shape(), (Shape{8, 32, 4}));  // [E, 2F, r]
  EXPECT_EQ(w.at("model.layers.0.mlp.experts.down_proj.lora_A.weight").shape(), (Shape{8 * 4, 16}));     // [E·r, F]
  EXPECT_EQ(w.at("model.layers.0.mlp.gate.lora_B.weight").shape(), (Shape{8, 4}));                      // [E, r]
}

// Logits within 1e-4 of PEFT's adapted model (relative to max(1, |logit|)), on the CPU and reference backends.
TEST(MoeLora, LogitsMatchPeft) {
  const CausalLM model = adapted();
  const Rows p = golden_rows();
  for (const std::string backend_name : {"cpu", "reference"}) {
    const Tensor logits = model.forward(Batch{p.ids, p.mask, p.positions}, *make_backend(backend_name));
    EXPECT_LE(logits_gap(logits, golden()["logits"], p), 1e-4) << backend_name;
  }
}

// loss = mean cross-entropy + router_aux_loss_coef·aux and the gradient of every adapter tensor, against autograd
// through PEFT's ParamWrapper. The gradients are compared by PEFT's names: written as an adapter (save_adapter maps
// the names and permutes the experts' lora_B into PEFT's layout), then read back.
TEST(MoeLora, LossAndAdapterGradientsMatchPeft) {
  const CausalLM model = adapted();
  const Rows p = golden_rows();
  graph::Builder b;
  ValueId head = kNone, aux = kNone;
  const ValueId h = model.build_training_hidden(b, p.B, p.T, &head, false, &aux);
  const ValueId ce = b.weighted_sum(b.token_logprobs(h, head, b.input("labels", {p.B, p.T}, DType::I32)), b.input("weights", {p.B, p.T}, DType::F32));
  const ValueId loss = b.add(ce, b.scale_by(aux, b.fill({}, DType::F32, model.config().moe.router_aux_loss_coef), DType::F32));
  const std::vector<std::string> params = model.lora_parameters();
  ASSERT_EQ(params.size(), 16u);
  const auto grads = graph::add_backward(b, loss, params, DType::F32);
  b.output(loss, "loss");
  b.output(aux, "aux");
  for (const std::string& n : params) b.output(grads.at(n), n);
  const graph::Graph graph = b.finish();
  TensorMap in = model.weights();
  in["input_ids"] = p.ids, in["attention_mask"] = p.mask, in["position_ids"] = p.positions, in["labels"] = p.labels, in["weights"] = p.weights;
  for (const std::string backend_name : {"cpu", "reference"}) {
    const std::vector<Tensor> out = make_backend(backend_name)->compile(graph)->run(in);
    const double want_loss = golden()["loss"].get<double>(), want_aux = golden()["aux_loss"].get<double>();
    EXPECT_NEAR(out[0].data_as<float>()[0], want_loss, 1e-5 * std::fabs(want_loss)) << backend_name;
    EXPECT_NEAR(out[1].data_as<float>()[0], want_aux, 1e-5 * std::fabs(want_aux)) << backend_name;
    TensorMap named;
    for (size_t k = 0; k < params.size(); ++k) named[params[k]] = out[2 + k].clone();
    test::TempDir dir;
    save_adapter(dir.path(), LoraConfig{}, named);
    const SafeTensorsFile f = SafeTensorsFile::open(dir.file("adapter_model.safetensors"));
    ASSERT_EQ(f.names().size(), golden()["grads"].size()) << backend_name;
    for (const std::string& name : f.names()) {
      ASSERT_TRUE(golden()["grads"].contains(name)) << name << " is not one of PEFT's adapter tensors";
      const json& want = golden()["grads"][name];
      const Tensor got = f.get(name).to(DType::F32);
      ASSERT_EQ(got.shape(), Shape(want["shape"].get<std::vector<int64_t>>())) << name;
      double scale = 0, worst = 0;
      for (const auto& v : want["values"]) scale = std::max(scale, std::fabs(v.get<double>()));
      for (int64_t i = 0; i < got.numel(); ++i) {
        const double gap = std::fabs(got.data_as<float>()[i] - want["values"][static_cast<size_t>(i)].get<double>());
        if (!(gap <= worst)) worst = gap;
      }
      EXPECT_GT(scale, 0) << name;
      EXPECT_LE(worst, 1e-4 * scale) << backend_name << " " << name;
    }
  }
}

// save_adapter writes PEFT's folder back: the same tensor names (the experts' nested as PEFT nests them) and the
// same bytes; adapter_config.json keeps target_parameters, and the folder loads again.
TEST(MoeLora, SavesPeftsNamesAndLayout) {
  const CausalLM base = CausalLM::from_pretrained(moe_dir("topk_norm"));
  const LoraAdapter a = load_adapter(moe_dir("lora_topk_norm"), base.config());
  test::TempDir dir;
  save_adapter(dir.path(), a.config, a.weights);
  const SafeTensorsFile peft = SafeTensorsFile::open(moe_dir("lora_topk_norm") + "/adapter_model.safetensors"),
                        ours = SafeTensorsFile::open(dir.file("adapter_model.safetensors"));
  const std::vector<std::string> names = peft.names(), our_names = ours.names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), std::set<std::string>(our_names.begin(), our_names.end()));
  for (const std::string& n : names) {
    const Tensor x = peft.get(n), y = ours.get(n);
    ASSERT_EQ(x.shape(), y.shape()) << n;
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.nbytes()), 0) << n;
  }
  const json cfg = json::parse(read_text_file(dir.file("adapter_config.json")));
  EXPECT_EQ(cfg["target_parameters"].size(), 3u) << cfg.dump();
  const LoraAdapter again = load_adapter(dir.path(), base.config());
  EXPECT_EQ(again.modules, a.modules);
}

// merge_lora folds every adapter in, the experts' per expert: the logits of PEFT's merge_and_unload().
TEST(MoeLora, MergeMatchesPeftsMergeAndUnload) {
  const CausalLM base = CausalLM::from_pretrained(moe_dir("topk_norm"));
  const LoraAdapter a = load_adapter(moe_dir("lora_topk_norm"), base.config());
  const CausalLM merged = CausalLM::from_weights(base.config(), merge_lora(base.weights(), a), "merged");
  const Rows p = golden_rows();
  const Tensor logits = merged.forward(Batch{p.ids, p.mask, p.positions}, *make_backend("cpu"));
  EXPECT_LE(logits_gap(logits, golden()["merged_logits"], p), 1e-4);
}

TEST(MoeLora, TargetParameterErrorsNameTheProblem) {
  const ModelConfig config = CausalLM::from_pretrained(moe_dir("topk_norm")).config();
  auto error = [&](const LoraConfig& c) { return test::error_of([&] { (void)lora_target_modules(config, c); }); };
  LoraConfig c;
  c.target_parameters = {"mlp.experts.gate_up_proj"};
  c.lora_dropout = 0.05;  // TRL's default
  EXPECT_NE(error(c).find("set lora_dropout to 0"), std::string::npos) << error(c);
  c.lora_dropout = 0;
  c.target_parameters = {"mlp.experts.up_proj"};
  EXPECT_NE(error(c).find("'mlp.experts.up_proj' matches no parameter"), std::string::npos) << error(c);
  c.target_parameters = {"input_layernorm.weight"};
  EXPECT_NE(error(c).find("which trl cannot adapt"), std::string::npos) << error(c);
  c.target_parameters = {"mlp.gate.weight"};
  c.target_modules = {"gate"};  // the router is not an nn.Linear in Transformers 5: a module name does not reach it
  EXPECT_NE(error(c).find("--lora_target_parameters mlp.gate.weight"), std::string::npos) << error(c);
  c.target_modules = {};
  EXPECT_EQ(lora_target_modules(config, c), (std::vector<std::string>{"model.layers.0.mlp.gate", "model.layers.1.mlp.gate"}));  // no q/v default
}

// SFT with --use_peft on every linear module (all-linear), the experts and the router: the adapters train (every
// lora_B leaves zero), and the saved adapter has PEFT's names and loads back (all-linear is written as the linear
// modules' names, the parameters stay in target_parameters).
TEST(MoeLora, SftTrainsTheExpertsAdapters) {
  const Tokenizer& tok = test::cut_tokenizer();
  test::TempDir dir;
  InitOptions io;
  io.preset = "tiny-moe";
  io.vocab_size = test::kCutVocab;
  init_model(io, dir.file("moe"));
  const CausalLM model = CausalLM::from_pretrained(dir.file("moe"));
  SFTConfig c;
  c.output_dir = dir.file("out");
  c.bf16 = false;
  c.max_steps = 2;
  c.learning_rate = 1e-2;
  c.per_device_train_batch_size = 2;
  c.report = false;
  c.progress = false;
  LoraConfig lora;
  lora.r = 4;
  lora.target_modules = {"all-linear"};
  lora.target_parameters = {"mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
  c.peft_config = lora;
  Dataset d;
  for (int i = 0; i < 4; ++i) {
    d.rows.push_back(json{{"prompt", "Name a colour."}, {"completion", i % 2 ? " red" : " blue"}});
    d.where.push_back("rows.jsonl:" + std::to_string(i + 1));
  }
  SFTTrainer trainer(model, tok, d, c);
  const TrainOutput out = trainer.train();
  for (const auto& e : out.log_history) {
    if (e.contains("loss")) {
      EXPECT_TRUE(std::isfinite(e["loss"].get<double>())) << e.dump();
    }
  }
  const SafeTensorsFile f = SafeTensorsFile::open(c.output_dir + "/adapter_model.safetensors");
  int experts_b = 0;
  for (const std::string& n : f.names()) {
    if (n.find("lora_B") == std::string::npos) continue;
    const Tensor t = f.get(n).to(DType::F32);
    double norm = 0;
    for (int64_t i = 0; i < t.numel(); ++i) norm += std::fabs(t.data_as<float>()[i]);
    EXPECT_GT(norm, 0) << n << " did not train";
    EXPECT_TRUE(std::isfinite(norm)) << n;
    experts_b += n.find(".mlp.experts.") != std::string::npos;
  }
  int sparse = 0;
  for (int64_t i = 0; i < model.config().num_hidden_layers; ++i) sparse += model.config().sparse_layer(i);
  EXPECT_EQ(experts_b, 2 * sparse);  // gate_up (base_layer) and down of every sparse layer
  EXPECT_GT(sparse, 0);
  EXPECT_TRUE(f.names().size() > 0);
  const std::vector<std::string> names = f.names();
  EXPECT_TRUE(std::set<std::string>(names.begin(), names.end()).count("base_model.model.model.layers.0.mlp.experts.base_layer.lora_B.weight"));
  const json saved = json::parse(read_text_file(c.output_dir + "/adapter_config.json"));
  EXPECT_EQ(saved["target_modules"], json({"q_proj", "k_proj", "v_proj", "o_proj"})) << saved.dump();
  const LoraAdapter back = load_adapter(c.output_dir, model.config());
  EXPECT_EQ(back.modules.size(), static_cast<size_t>(4 * model.config().num_hidden_layers + 3 * sparse));
}

}  // namespace
}  // namespace trl

// Reward models as reward functions (include/trl/train/rewards.h, reward_model_function).
#include <filesystem>

#include "trl/backend/program_cache.h"
#include "trl/backend/registry.h"
#include "trl/core/error.h"
#include "trl/io/hub.h"
#include "trl/models/lora.h"
#include "trl/models/reward_model.h"
#include "trl/tokenizer/chat_template.h"
#include "trl/tokenizer/tokenizer.h"
#include "trl/train/rewards.h"

namespace trl {

namespace {
using ojson = nlohmann::ordered_json;
}  // namespace

NamedRewardFunction reward_model_function(std::shared_ptr<const RewardModel> model, std::shared_ptr<const Tokenizer> tok, const std::string& name,
                                          ojson chat_template_kwargs) {
  struct Scorer {
    std::shared_ptr<const RewardModel> model;
    std::shared_ptr<const Tokenizer> tok;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<ProgramCache> programs;
    TensorMap weights;  // in the backend's memory, once
    ojson kwargs;
  };
  auto s = std::make_shared<Scorer>();
  s->model = std::move(model), s->tok = std::move(tok), s->kwargs = std::move(chat_template_kwargs);
  s->backend = make_backend(s->model->backbone.device(), BackendOptions{.share_arena = true});
  s->programs = std::make_unique<ProgramCache>(*s->backend, 16);
  s->weights = reward_weights(*s->model, *s->backend);
  return {name, [s, name](const RewardInputs& in) {
            std::vector<std::vector<int32_t>> seqs;
            ChatTemplateOptions co;
            co.extra = s->kwargs;
            for (size_t i = 0; i < in.size(); ++i) {
              const ojson& p = in.prompts[i];
              if (p.is_array()) {
                ojson messages = p;
                messages.push_back(ojson{{"role", "assistant"}, {"content", in.completion_text(i)}});
                seqs.push_back(apply_chat_template_ids(*s->tok, messages, co).input_ids);
              } else {
                seqs.push_back(s->tok->encode((p.is_string() ? p.get<std::string>() : p.dump()) + in.completion_text(i), false));
              }
              if (seqs.back().empty()) seqs.back().push_back(s->model->pad_token_id);
            }
            std::vector<std::optional<double>> out;
            for (double r : reward_scores(*s->model, seqs, *s->programs, 8, &s->weights)) out.emplace_back(r);
            return out;
          }};
}

// A folder or id names a reward model; anything else is a built-in reward or an exec: program (reward_function).
NamedRewardFunction reward_from_spec(const std::string& spec, const RewardFunctionOptions& options, bool bf16, ojson chat_template_kwargs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // A reward adapter (`trl reward --use_peft`'s output) has adapter_config.json instead of config.json.
  const bool adapter = fs::is_directory(spec, ec) && is_sequence_classification_adapter(spec);
  std::string dir;
  if (adapter || fs::is_regular_file(fs::path(spec) / "config.json", ec)) dir = spec;
  else if (spec.find(':') == std::string::npos && spec.find('/') != std::string::npos) dir = resolve_model_dir(spec);  // an id: the local cache
  if (dir.empty()) return reward_function(spec, options);
  // A causal-LM checkpoint has no trained score head: Transformers would draw one at random (with a warning) and the
  // run would train on random rewards.
  if (!adapter && !is_sequence_classification_config(dir)) {
    const ModelConfig c = ModelConfig::load((fs::path(dir) / "config.json").string());
    fail("--reward_funcs {}: {} is not a reward model: its config.json names {} and it has no trained score head (score.weight), so its "
         "rewards would come from a random head. Give a reward model (the output of trl reward, a ...ForSequenceClassification checkpoint, "
         "or trl reward --use_peft's adapter folder) or a built-in reward such as length:200",
         spec, dir, c.architectures.empty() ? std::string("no architecture") : c.architectures.front());
  }
  LoadOptions lo;
  if (bf16) lo.dtype = DType::BF16;
  const std::string tokenizer_dir =
      adapter && !fs::is_regular_file(fs::path(dir) / "tokenizer.json", ec) ? adapter_base_model(dir) : dir;
  auto tok = std::make_shared<const Tokenizer>(Tokenizer::from_pretrained(tokenizer_dir));
  auto model = std::make_shared<const RewardModel>(load_reward_model(dir, lo, tok->pad_token_id()));
  std::string name = fs::path(spec).filename().string();
  if (name.empty()) name = fs::path(spec).parent_path().filename().string();
  return reward_model_function(std::move(model), std::move(tok), name, std::move(chat_template_kwargs));
}

}  // namespace trl

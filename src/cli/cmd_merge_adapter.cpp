// `trl merge-adapter`: a PEFT LoRA adapter merged into its base model (W + scaling·B·A), written as a Hugging Face
// model folder (PEFT's merge_and_unload + save_pretrained).
#include <cstdio>
#include <filesystem>

#include "cli/cli_util.h"
#include "cli/options.h"
#include "core/fs.h"
#include "trl/core/byte_size.h"
#include "trl/core/error.h"
#include "trl/io/hub.h"
#include "trl/models/init.h"
#include "trl/models/lora.h"
#include "trl/models/reward_model.h"

namespace trl::cli {

namespace fs = std::filesystem;

namespace {

// The merged model never goes into the base model's folder (it would replace the base in place) or the adapter's
// (it would mix a full model into the adapter folder that other runs load).
void refuse_output_in_place(const std::string& output_dir, const std::string& base_dir, const std::string& adapter_dir) {
  std::error_code ec;
  const fs::path out = fs::weakly_canonical(output_dir, ec);
  auto same = [&](const std::string& dir) {
    std::error_code e;
    return !dir.empty() && fs::exists(dir, e) && fs::equivalent(out, dir, e);
  };
  if (same(base_dir))
    usage_fail("--output_dir {} is the base model's folder ({}): merging there would overwrite the base model in place; give another folder", output_dir,
         base_dir);
  if (same(adapter_dir))
    usage_fail("--output_dir {} is the adapter's folder: merging there would write a whole model into the adapter; give another folder", output_dir);
}

}  // namespace

void register_merge_adapter(CLI::App& app) {
  auto* cmd = add_command(app, "merge-adapter", "Merge a LoRA adapter into its base model: trl merge-adapter --adapter DIR --output_dir OUT");
  struct Args {
    std::string adapter, model, output_dir, dtype, revision = "main", max_shard_size = "5GB";
  };
  auto a = std::make_shared<Args>();
  Options opts(cmd);
  opts.add("adapter", a->adapter, "The PEFT adapter folder (adapter_config.json, adapter_model.safetensors)").required();
  opts.add("model,model_name_or_path", a->model, "The base model (folder or Hugging Face id)").default_text("the adapter's base_model_name_or_path");
  opts.add("output_dir,out", a->output_dir, "Where the merged model goes").required();
  opts.add("dtype,torch_dtype", a->dtype, "Save the weights as").choices({"f32", "float32", "bf16", "bfloat16"}).default_text("the base model's");
  opts.add("revision", a->revision, "Hub cache revision of the base");
  opts.add("max_shard_size", a->max_shard_size, "Largest safetensors shard, e.g. 5GB, 500MB");
  on_run(cmd, [a] {
    LoadOptions lo;
    lo.revision = a->revision;
    if (!a->dtype.empty()) lo.dtype = (a->dtype == "bf16" || a->dtype == "bfloat16") ? DType::BF16 : DType::F32;
    // A reward adapter (task_type SEQ_CLS, trl reward --use_peft) merges into a reward model with the head it saved.
    const bool reward = is_sequence_classification_adapter(a->adapter);
    const CausalLM adapted = a->model.empty() ? load_inference_model(a->adapter, "", lo, false) : load_inference_model(a->model, a->adapter, lo, false);
    refuse_output_in_place(a->output_dir, adapted.path(), a->adapter);
    const uint64_t shard = parse_byte_size(a->max_shard_size);
    // Written into OUT/.merge.tmp, then moved into OUT file by file: a failure leaves no partial model in OUT.
    const fs::path out(a->output_dir), tmp = out / ".merge.tmp";
    std::error_code ec;
    fs::create_directories(out, ec);
    if (ec) fail("--output_dir {}: cannot create the folder: {}", a->output_dir, ec.message());
    try {
      fs::remove_all(tmp, ec);
      if (reward) {
        const RewardModel rm = reward_model_from_adapter(adapted, a->adapter);
        TensorMap weights = rm.backbone.weights();
        weights["score.weight"] = rm.score;
        save_reward_model(tmp.string(), rm.backbone.config(), weights, rm.pad_token_id, rm.backbone.dtype());
      } else {
        adapted.merged().save_pretrained(tmp.string(), shard);
      }
      // The tokenizer and generation files: the adapter's (a trl adapter folder has them), else the base's.
      const std::string base_dir = adapted.path();
      bool tokenizer = false;
      for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "generation_config.json",
                            "vocab.json", "merges.txt"})
        for (const std::string& from : {a->adapter, base_dir})
          if (!from.empty() && fs::is_regular_file(fs::path(from) / f)) {
            write_text_file_atomic((tmp / f).string(), read_text_file((fs::path(from) / f).string()));
            tokenizer = tokenizer || std::string(f) == "tokenizer.json";
            break;
          }
      if (!tokenizer) write_tokenizer_files(tmp.string());
      for (const auto& e : fs::directory_iterator(tmp)) fs::rename(e.path(), out / e.path().filename());
      fs::remove(tmp, ec);
    } catch (const std::exception& e) {
      fs::remove_all(tmp, ec);
      fail("merge-adapter: writing {} failed: {} (nothing was written there)", a->output_dir, e.what());
    }
    std::printf("{\"output_dir\": \"%s\", \"merged_modules\": %zu}\n", a->output_dir.c_str(), adapted.lora_modules().size());
  });
}

}  // namespace trl::cli

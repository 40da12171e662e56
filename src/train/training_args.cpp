// TrainingArguments as JSON (training_args.h): the fields by their Transformers names.
#include "trl/train/training_args.h"

namespace trl {

nlohmann::ordered_json training_arguments_json(const TrainingArguments& a) {
  nlohmann::ordered_json j{
      {"output_dir", a.output_dir},
      {"learning_rate", a.learning_rate},
      {"per_device_train_batch_size", a.per_device_train_batch_size},
      {"per_device_eval_batch_size", a.per_device_eval_batch_size},
      {"gradient_accumulation_steps", a.gradient_accumulation_steps},
      {"num_train_epochs", a.num_train_epochs},
      {"max_steps", a.max_steps},
      {"lr_scheduler_type", a.lr_scheduler_type},
      {"warmup_ratio", a.warmup_ratio},
      {"warmup_steps", a.warmup_steps},
      {"weight_decay", a.weight_decay},
      {"adam_beta1", a.adam_beta1},
      {"adam_beta2", a.adam_beta2},
      {"adam_epsilon", a.adam_epsilon},
      {"max_grad_norm", a.max_grad_norm},
      {"logging_steps", a.logging_steps},
      {"logging_first_step", a.logging_first_step},
      {"save_steps", a.save_steps},
      {"save_total_limit", a.save_total_limit ? nlohmann::ordered_json(*a.save_total_limit) : nlohmann::ordered_json()},
      {"eval_strategy", a.eval_strategy},
      {"eval_steps", a.eval_steps ? nlohmann::ordered_json(*a.eval_steps) : nlohmann::ordered_json()},
      {"seed", a.seed},
      {"train_sampling_strategy", a.train_sampling_strategy},
      {"bf16", a.bf16},
      {"torch_compile", a.torch_compile},
      {"gradient_checkpointing", a.gradient_checkpointing},
      {"auto_find_batch_size", a.auto_find_batch_size},
      {"dataloader_drop_last", a.dataloader_drop_last},
      {"resume_from_checkpoint", a.resume_from_checkpoint.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(a.resume_from_checkpoint)},
      {"report_to", a.report_to},
      {"logging_dir", a.logging_dir},
      {"model_name_or_path", a.model_name_or_path},
      {"dataset_name", a.dataset_name},
      {"tp_size", a.distributed.tp_size},
      {"ep_size", a.distributed.ep_size},
      {"enable_expert_parallel", a.distributed.enable_expert_parallel},
      {"fsdp_size", a.distributed.fsdp_size},
  };
  j["peft_config"] = a.peft_config ? a.peft_config->to_json() : nlohmann::ordered_json();
  return j;
}

}  // namespace trl

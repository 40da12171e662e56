// Finding a model folder: a local path, or a Hugging Face id ("Qwen/Qwen3-0.6B") already present in the local hub
// cache. trl.cpp never downloads anything.
//
// Cache layout (huggingface_hub): <cache>/models--<org>--<name>/refs/<revision> holds a commit hash, and
// <cache>/models--<org>--<name>/snapshots/<commit>/ holds the files. The cache is, in order: $HF_HUB_CACHE,
// $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub.
#pragma once

#include <string>
#include <vector>

namespace trl {

// The cache folders to search, in order, from the environment.
std::vector<std::string> hub_cache_dirs();

// The snapshot folder of a cache repository folder (`<cache>/models--org--name`, `datasets--org--name`) for
// `revision`: the commit refs/<revision> names, or the revision itself as a commit. The folder may not exist. A ref
// that is empty or names no single folder under snapshots/ (a path, "..") is an error naming the ref file, and so is
// such a revision.
std::string hub_snapshot(const std::string& repo_dir, const std::string& revision);

// Returns the folder that holds the model (a folder counts when it has `required_file`). `revision` is a
// branch/tag name under refs/ or a commit hash. Throws trl::Error listing every place it looked when the model is
// not found.
std::string resolve_model_dir(const std::string& name_or_path, const std::string& revision = "main",
                              const std::string& required_file = "config.json");

}  // namespace trl

#include "trl/io/hub.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include <fmt/ranges.h>

#include "trl/core/error.h"
#include "core/fs.h"

namespace trl {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool looks_like_repo_id(const std::string& s) {
  // "org/name" or "name": no leading '.', '/', '~', at most one '/', no empty parts.
  if (s.empty() || s[0] == '.' || s[0] == '/' || s[0] == '~') return false;
  size_t slash = s.find('/');
  if (slash == std::string::npos) return true;
  return slash > 0 && slash + 1 < s.size() && s.find('/', slash + 1) == std::string::npos;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

std::vector<std::string> hub_cache_dirs() {
  std::vector<std::string> dirs;
  auto add = [&](const std::string& d) {
    if (!d.empty() && std::find(dirs.begin(), dirs.end(), d) == dirs.end()) dirs.push_back(d);
  };
  add(env("HF_HUB_CACHE"));
  if (!env("HF_HOME").empty()) add((fs::path(env("HF_HOME")) / "hub").string());
  if (!env("XDG_CACHE_HOME").empty()) add((fs::path(env("XDG_CACHE_HOME")) / "huggingface" / "hub").string());
  if (!env("HOME").empty()) add((fs::path(env("HOME")) / ".cache" / "huggingface" / "hub").string());
  return dirs;
}

std::string hub_snapshot(const std::string& repo_dir, const std::string& revision) {
  // A commit names one folder under snapshots/: never empty, ".", "..", or a path (which would leave the repository).
  auto single_folder = [](const std::string& c) { return !c.empty() && c != "." && c != ".." && c.find('/') == std::string::npos && c.find('\\') == std::string::npos; };
  const fs::path repo(repo_dir), ref = repo / "refs" / revision;
  std::error_code ec;
  std::string commit = revision;
  if (revision.find("..") == std::string::npos && fs::is_regular_file(ref, ec)) {
    commit = trim(read_text_file(ref.string()));
    if (!single_folder(commit))
      fail("{}: this Hub-cache ref should hold the commit hash of a folder in {}, but holds '{}' (an interrupted or damaged download): "
           "download the repository again, or delete the ref and pass --revision with the commit",
           ref.string(), (repo / "snapshots").string(), commit);
    return (repo / "snapshots" / commit).string();
  }
  if (!single_folder(commit)) fail("revision '{}': not a branch, tag or commit of {} (a revision names one folder under snapshots/)", revision, repo_dir);
  return (repo / "snapshots" / commit).string();
}

std::string resolve_model_dir(const std::string& name_or_path, const std::string& revision, const std::string& required_file) {
  std::error_code ec;
  std::vector<std::string> looked;
  if (fs::is_directory(name_or_path, ec)) {
    if (!fs::exists(fs::path(name_or_path) / required_file)) {
      fail("{}: this folder has no {}; a model folder holds config.json, model.safetensors and the tokenizer files", name_or_path,
           required_file);
    }
    return name_or_path;
  }
  if (fs::exists(name_or_path, ec)) fail("{}: is a file; pass the model folder that holds config.json", name_or_path);
  looked.push_back(fmt::format("{} (no such local folder)", name_or_path));

  if (looks_like_repo_id(name_or_path)) {
    std::string repo_folder = "models--" + name_or_path;
    for (size_t p = repo_folder.find('/'); p != std::string::npos; p = repo_folder.find('/')) repo_folder.replace(p, 1, "--");
    for (const std::string& cache : hub_cache_dirs()) {
      const fs::path repo = fs::path(cache) / repo_folder;
      const fs::path snapshots = repo / "snapshots";
      const fs::path ref = repo / "refs" / revision;
      if (!fs::is_directory(repo, ec)) {
        looked.push_back((snapshots / revision).string());
        continue;
      }
      const fs::path snap = hub_snapshot(repo.string(), revision);
      if (fs::is_directory(snap, ec) && fs::exists(snap / required_file, ec)) return snap.string();
      if (fs::is_directory(snapshots, ec) && !fs::is_regular_file(ref, ec)) {
        // No ref for this revision: use the snapshot if there is exactly one.
        std::vector<fs::path> all;
        for (const auto& e : fs::directory_iterator(snapshots, ec)) {
          if (e.is_directory() && fs::exists(e.path() / required_file)) all.push_back(e.path());
        }
        if (all.size() == 1 && revision == "main") return all[0].string();
      }
      looked.push_back(snap.string());
    }
  }
  throw NotFoundError(fmt::format("model '{}' not found. Looked in:\n  {}\ntrl.cpp never downloads: pass a local folder, or fetch the model into the Hugging Face "
       "cache first (for example `huggingface-cli download {}`), or set HF_HUB_CACHE / HF_HOME.",
       name_or_path, fmt::join(looked, "\n  "), name_or_path));
}

}  // namespace trl

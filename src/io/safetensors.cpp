#include "trl/io/safetensors.h"
#include "core/json_text.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "trl/core/error.h"
#include "core/fs.h"

namespace trl {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit

uint64_t read_u64_le(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint64_t>(p[i]);
  return v;
}

uint64_t json_u64(const json& j, const std::string& where) {
  if (!j.is_number_integer() && !j.is_number_unsigned()) fail("{}: expected a non-negative integer, got {}", where, j.dump());
  if (j.is_number_integer() && !j.is_number_unsigned() && j.get<int64_t>() < 0) fail("{}: expected a non-negative integer, got {}", where, j.dump());
  return j.get<uint64_t>();
}

}  // namespace

SafeTensorsFile SafeTensorsFile::open(const std::string& path) {
  SafeTensorsFile st;
  st.file_ = MappedFile::open(path);
  const std::byte* bytes = st.file_->data();
  const uint64_t size = st.file_->size();
  if (size < 8) fail("{}: truncated safetensors file: {} bytes, but the 8-byte header length alone needs 8", path, size);
  const uint64_t header_len = read_u64_le(bytes);
  if (header_len > size - 8) {
    fail("{}: header length {} goes beyond the end of the file ({} bytes); the file is truncated or not safetensors", path, header_len, size);
  }
  if (header_len > kMaxHeaderBytes) fail("{}: header length {} exceeds the {}-byte limit", path, header_len, kMaxHeaderBytes);
  if (header_len < 2) fail("{}: header of {} bytes cannot hold a JSON object", path, header_len);
  const char* header = reinterpret_cast<const char*>(bytes + 8);
  if (header[0] != '{') fail("{}: header does not start with a JSON object ('{{'); not a safetensors file", path);
  const json root = parse_json(std::string_view(header, header_len), path + ": the header");
  if (!root.is_object()) fail("{}: header is not a JSON object", path);
  st.data_start_ = 8 + header_len;
  const uint64_t data_size = size - st.data_start_;

  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("{}: __metadata__ must be an object of strings", path);
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) fail("{}: __metadata__ value for '{}' must be a string, got {}", path, m.key(), m.value().dump());
        st.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = fmt::format("{}: tensor '{}'", path, name);
    if (name.empty()) fail("{}: a tensor has an empty name", path);
    if (!entry.is_object()) fail("{}: entry must be an object with dtype, shape and data_offsets", where);
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      if (!entry.contains(key)) fail("{}: missing '{}'", where, key);
    }
    TensorInfo info;
    info.name = name;
    if (!entry["dtype"].is_string()) fail("{}: dtype must be a string", where);
    const std::string dtype = entry["dtype"].get<std::string>();
    auto dt = dtype_from_safetensors_name(dtype);
    if (!dt) fail("{}: unsupported dtype '{}' (supported: F32, BF16, F16, F64, I32, I64)", where, dtype);
    info.dtype = *dt;
    if (!entry["shape"].is_array()) fail("{}: shape must be an array of integers", where);
    for (const json& d : entry["shape"]) {
      uint64_t v = json_u64(d, where + ": shape");
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) fail("{}: shape dimension {} is too large", where, v);
      info.shape.push_back(static_cast<int64_t>(v));
    }
    const json& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2) fail("{}: data_offsets must be [begin, end]", where);
    info.begin = json_u64(offsets[0], where + ": data_offsets");
    info.end = json_u64(offsets[1], where + ": data_offsets");
    if (info.begin > info.end) fail("{}: data_offsets [{}, {}] has begin after end", where, info.begin, info.end);
    if (info.end > data_size) {
      fail("{}: data_offsets [{}, {}] lie outside the data buffer of {} bytes (the file is truncated or the header is wrong)", where,
           info.begin, info.end, data_size);
    }
    int64_t numel = 0;
    try {
      numel = shape_numel(info.shape);
    } catch (const Error& e) {
      fail("{}: {}", where, e.what());
    }
    const uint64_t expected = static_cast<uint64_t>(numel) * dtype_size(info.dtype);
    if (numel != 0 && expected / static_cast<uint64_t>(numel) != dtype_size(info.dtype)) fail("{}: shape is too large", where);
    if (info.end - info.begin != expected) {
      fail("{}: shape {} x {} bytes = {} bytes, but data_offsets [{}, {}] span {} bytes", where, shape_str(info.shape),
           dtype_size(info.dtype), expected, info.begin, info.end, info.end - info.begin);
    }
    st.tensors_.emplace(name, std::move(info));
  }

  // The buffer must be covered exactly once: sort by offset and walk it.
  std::vector<const TensorInfo*> order;
  for (const auto& [name, info] : st.tensors_) order.push_back(&info);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : order) {
    if (t->begin < covered) {
      fail("{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", path, prev->name, prev->begin, prev->end, t->name, t->begin, t->end);
    }
    if (t->begin > covered) {
      fail("{}: bytes [{}, {}) of the data buffer belong to no tensor (before tensor '{}')", path, covered, t->begin, t->name);
    }
    covered = t->end;
    prev = t;
  }
  if (covered != data_size) fail("{}: {} bytes after the last tensor belong to no tensor", path, data_size - covered);
  return st;
}

std::vector<std::string> SafeTensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

const TensorInfo& SafeTensorsFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("{}: no tensor named '{}'", path(), name);
  return it->second;
}

Tensor SafeTensorsFile::get(const std::string& name) const {
  const TensorInfo& ti = info(name);
  const std::byte* p = file_->data() + data_start_ + ti.begin;
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(ti.dtype) != 0) {
    // A file written without alignment: copy instead of handing out a misaligned pointer.
    Tensor owned = Tensor::zeros(ti.dtype, ti.shape);
    std::memcpy(owned.mutable_data(), p, ti.end - ti.begin);
    return owned;
  }
  return Tensor::view(p, ti.dtype, ti.shape, file_, StorageKind::Mapped);
}

void save_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata) {
  std::vector<std::pair<const std::string*, const Tensor*>> order;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__") fail("{}: invalid tensor name '{}'", path, name);
    if (!t.is_contiguous()) fail("{}: tensor '{}' is not contiguous", path, name);
    order.emplace_back(&name, &t);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return dtype_size(a.second->dtype()) > dtype_size(b.second->dtype());
  });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : order) {
    json entry;
    entry["dtype"] = std::string(dtype_safetensors_name(t->dtype()));
    entry["shape"] = t->shape();
    entry["data_offsets"] = {offset, offset + t->nbytes()};
    header[*name] = std::move(entry);
    offset += t->nbytes();
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  write_file_atomic(path, [&](int fd) {
    unsigned char len[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    write_all(fd, len, 8, path);
    write_all(fd, text.data(), text.size(), path);
    for (const auto& [name, t] : order) write_all(fd, t->data(), t->nbytes(), path);
  });
}

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint ck;
  fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    fs::path index = p / "model.safetensors.index.json";
    fs::path single = p / "model.safetensors";
    if (fs::exists(index)) {
      const std::string index_path = index.string();
      json j = json::parse(read_text_file(index_path), nullptr, false);
      if (j.is_discarded() || !j.is_object()) fail("{}: not valid JSON", index_path);
      if (!j.contains("weight_map") || !j["weight_map"].is_object()) fail("{}: missing the 'weight_map' object", index_path);
      std::map<std::string, size_t> file_index;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string()) fail("{}: weight_map['{}'] must be a file name", index_path, it.key());
        const std::string file = it.value().get<std::string>();
        if (file.find('/') != std::string::npos || file == ".." || file.empty()) {
          fail("{}: weight_map['{}'] = '{}' is not a file name in this folder", index_path, it.key(), file);
        }
        auto f = file_index.find(file);
        if (f == file_index.end()) {
          ck.files_.push_back(SafeTensorsFile::open((p / file).string()));
          f = file_index.emplace(file, ck.files_.size() - 1).first;
        }
        if (!ck.files_[f->second].contains(it.key())) {
          fail("{}: tensor '{}' is listed in {} but is not in it", index_path, it.key(), ck.files_[f->second].path());
        }
        ck.where_[it.key()] = f->second;
      }
      ck.description_ = index_path;
      return ck;
    }
    if (!fs::exists(single)) fail("{}: no model.safetensors or model.safetensors.index.json in this folder", path);
    p = single;
  }
  ck.files_.push_back(SafeTensorsFile::open(p.string()));
  for (const std::string& name : ck.files_[0].names()) ck.where_[name] = 0;
  ck.description_ = p.string();
  return ck;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, i] : where_) out.push_back(name);
  return out;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail("{}: missing tensor '{}'", description_, name);
  return files_[it->second].info(name);
}

Tensor Checkpoint::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail("{}: missing tensor '{}'", description_, name);
  return files_[it->second].get(name);
}

const std::string& Checkpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail("{}: missing tensor '{}'", description_, name);
  return files_[it->second].path();
}

std::vector<std::string> save_checkpoint(const std::string& dir, const TensorMap& tensors, uint64_t max_shard_bytes,
                                         const Metadata& metadata) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("{}: cannot create the folder: {}", dir, ec.message());
  // Group tensors into shards in name order (as Transformers does), starting a new shard when the next tensor
  // would overflow the current one.
  std::vector<TensorMap> shards(1);
  std::vector<uint64_t> shard_bytes(1, 0);
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t n = t.nbytes();
    if (max_shard_bytes > 0 && shard_bytes.back() > 0 && shard_bytes.back() + n > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes.push_back(0);
    }
    shards.back().emplace(name, t);
    shard_bytes.back() += n;
    total += n;
  }
  // What an earlier save left behind is removed only once the new files are all written (a failed save leaves the
  // old checkpoint whole), so that a folder never mixes two checkpoints.
  auto remove_stale = [&](const std::vector<std::string>& keep) {
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string f = entry.path().filename().string();
      const bool weights = (f.rfind("model-", 0) == 0 && f.size() > 12 && f.substr(f.size() - 12) == ".safetensors") ||
                           f == "model.safetensors.index.json" || f == "model.safetensors";
      const bool kept = std::any_of(keep.begin(), keep.end(), [&](const std::string& k) { return fs::path(k).filename() == f; });
      if (weights && !kept) fs::remove(entry.path(), ec);
    }
  };
  std::vector<std::string> written;
  if (shards.size() == 1) {
    const std::string path = (fs::path(dir) / "model.safetensors").string();
    save_safetensors(path, shards[0], metadata);
    written.push_back(path);
    remove_stale(written);
    return written;
  }
  json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    const std::string path = (fs::path(dir) / file).string();
    save_safetensors(path, shards[i], metadata);
    written.push_back(path);
    for (const auto& [name, t] : shards[i]) index["weight_map"][name] = file;
  }
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  write_text_file_atomic(index_path, index.dump(2) + "\n");
  written.push_back(index_path);
  remove_stale(written);
  return written;
}

}  // namespace trl

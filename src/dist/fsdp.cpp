#include "dist/fsdp.h"

#include <algorithm>
#include <cstring>

#include "trl/core/error.h"

namespace trl::dist {

namespace {

constexpr int64_t kBucketBytes = 25 << 20;  // staging per collective, as the data-parallel gradient buckets

// Elements per rank in one collective of `shards` ranks with elements of `bytes` bytes.
int64_t chunk_elements(int shards, size_t bytes) {
  return std::max<int64_t>(1, kBucketBytes / static_cast<int64_t>(bytes) / shards);
}

}  // namespace

FlatShards::FlatShards(std::vector<std::pair<std::string, int64_t>> params, int shards, int index)
    : params_(std::move(params)), shards_(shards), index_(index) {
  if (shards < 1 || index < 0 || index >= shards) fail("FSDP: shard {} of {} does not exist", index, shards);
  starts_.reserve(params_.size() + 1);
  for (const auto& [name, n] : params_) starts_.push_back(total_), total_ += n;
  starts_.push_back(total_);
  shard_ = (total_ + shards - 1) / shards;
  const int64_t begin = index * shard_;
  for_each_run(begin, begin + shard_, [&](size_t p, int64_t offset, int64_t length, int64_t flat) {
    pieces_.push_back(Piece{params_[p].first, offset, length, flat - begin});
  });
}

void FlatShards::for_each_run(int64_t begin, int64_t end, const std::function<void(size_t, int64_t, int64_t, int64_t)>& fn) const {
  end = std::min(end, total_);
  if (begin >= end) return;
  // The parameter holding `begin`: the last start <= begin (an empty parameter's start equals the next one's).
  size_t p = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end() - 1, begin) - starts_.begin()) - 1;
  for (int64_t at = begin; at < end; ++p) {
    const int64_t stop = std::min(end, starts_[p + 1]);
    if (stop > at) fn(p, at - starts_[p], stop - at, at);
    at = std::max(at, stop);
  }
}

void reduce_scatter_flat(Communicator& group, const FlatShards& fs, const std::map<std::string, Tensor>& grads, float* shard) {
  const int F = fs.shards();
  const int64_t S = fs.shard_size(), chunk = chunk_elements(F, sizeof(float));
  std::vector<const float*> src(fs.num_params());
  for (size_t p = 0; p < src.size(); ++p) {
    const auto it = grads.find(fs.name(p));
    if (it == grads.end() || it->second.dtype() != DType::F32) fail("FSDP: no f32 gradient for {}", fs.name(p));
    src[p] = it->second.data_as<float>();
  }
  std::vector<float> send;
  for (int64_t c0 = 0; c0 < S; c0 += chunk) {
    const int64_t len = std::min(chunk, S - c0);
    send.assign(static_cast<size_t>(F * len), 0.0f);  // the padding past N stays 0
    // send:[F, len]: block j is elements [c0, c0 + len) of shard j.
    for (int j = 0; j < F; ++j) {
      const int64_t base = j * S + c0;
      fs.for_each_run(base, base + len, [&](size_t p, int64_t offset, int64_t length, int64_t flat) {
        std::memcpy(send.data() + j * len + (flat - base), src[p] + offset, static_cast<size_t>(length) * sizeof(float));
      });
    }
    group.reduce_scatter(send.data(), shard + c0, len, DType::F32);
  }
}

void all_gather_flat(Communicator& group, const FlatShards& fs, std::map<std::string, Tensor>& whole) {
  if (fs.num_params() == 0) return;
  const int F = fs.shards();
  std::vector<char*> data(fs.num_params());
  const DType dtype = whole.at(fs.name(0)).dtype();
  for (size_t p = 0; p < data.size(); ++p) {
    Tensor& t = whole.at(fs.name(p));
    if (t.dtype() != dtype) fail("FSDP: the compute weights mix {} and {} ({})", dtype_name(dtype), dtype_name(t.dtype()), fs.name(p));
    data[p] = static_cast<char*>(t.mutable_data());
  }
  const size_t es = dtype_size(dtype);
  const int64_t S = fs.shard_size(), chunk = chunk_elements(F, es);
  std::vector<char> send, recv;
  for (int64_t c0 = 0; c0 < S; c0 += chunk) {
    const int64_t len = std::min(chunk, S - c0);
    send.assign(static_cast<size_t>(len) * es, 0);
    recv.resize(static_cast<size_t>(F * len) * es);
    const int64_t own = fs.index() * S + c0;
    fs.for_each_run(own, own + len, [&](size_t p, int64_t offset, int64_t length, int64_t flat) {
      std::memcpy(send.data() + (flat - own) * static_cast<int64_t>(es), data[p] + offset * static_cast<int64_t>(es), static_cast<size_t>(length) * es);
    });
    // recv:[F, len]: block j is elements [c0, c0 + len) of shard j.
    group.all_gather(send.data(), recv.data(), len, dtype);
    for (int j = 0; j < F; ++j) {
      if (j == fs.index()) continue;
      const int64_t base = j * S + c0;
      fs.for_each_run(base, base + len, [&](size_t p, int64_t offset, int64_t length, int64_t flat) {
        std::memcpy(data[p] + offset * static_cast<int64_t>(es), recv.data() + (j * len + flat - base) * static_cast<int64_t>(es),
                    static_cast<size_t>(length) * es);
      });
    }
  }
}

std::map<std::string, Tensor> gather_whole(Communicator& group, const FlatShards& fs, const std::map<std::string, Tensor>& pieces,
                                           const std::map<std::string, Shape>& shapes) {
  const int F = fs.shards();
  const bool root = group.rank() == 0;
  std::map<std::string, Tensor> whole;
  std::vector<float*> dst(fs.num_params(), nullptr);
  if (root)
    for (size_t p = 0; p < dst.size(); ++p) {
      Tensor& t = whole[fs.name(p)] = Tensor::zeros(DType::F32, shapes.at(fs.name(p)));
      dst[p] = t.mutable_data_as<float>();
    }
  // Where each of this rank's pieces starts in its parameter.
  std::map<std::string, std::pair<const float*, int64_t>> own;
  for (const FlatShards::Piece& piece : fs.pieces()) {
    const auto it = pieces.find(piece.name);
    if (it == pieces.end() || it->second.numel() != piece.length) fail("FSDP: this rank holds no piece of {} of {} elements", piece.name, piece.length);
    own[piece.name] = {it->second.data_as<float>(), piece.offset};
  }
  const int64_t S = fs.shard_size(), chunk = chunk_elements(F, sizeof(float));
  std::vector<float> send, recv;
  for (int64_t c0 = 0; c0 < S; c0 += chunk) {
    const int64_t len = std::min(chunk, S - c0);
    send.assign(static_cast<size_t>(len), 0.0f);
    recv.resize(static_cast<size_t>(F * len));
    const int64_t base_own = fs.index() * S + c0;
    fs.for_each_run(base_own, base_own + len, [&](size_t p, int64_t offset, int64_t length, int64_t flat) {
      const auto& [src, first] = own.at(fs.name(p));
      std::memcpy(send.data() + (flat - base_own), src + (offset - first), static_cast<size_t>(length) * sizeof(float));
    });
    group.all_gather(send.data(), recv.data(), len, DType::F32);
    if (!root) continue;
    for (int j = 0; j < F; ++j) {
      const int64_t base = j * S + c0;
      fs.for_each_run(base, base + len, [&](size_t p, int64_t offset, int64_t length, int64_t flat) {
        std::memcpy(dst[p] + offset, recv.data() + j * len + (flat - base), static_cast<size_t>(length) * sizeof(float));
      });
    }
  }
  return whole;
}

}  // namespace trl::dist

// FSDP's sharded training state (docs/DISTRIBUTED.md, "FSDP").
//
// The trained parameters, in name order (a std::map's, the same on every rank), are one flat space of N f32
// elements, padded to a multiple of the shard group's size F and cut into F equal shards of S = ceil(N / F)
// elements: rank j of the group owns elements [j·S, (j+1)·S). A rank keeps the f32 masters, the gradient and the
// AdamW moments of its shard only; the compute weights stay whole on every rank (the compiled programs read them),
// and after each step every rank's updated shard is all-gathered into them. As in PyTorch's FSDP with flat
// parameters, a shard may start or end inside a tensor: a rank's share of a tensor is one contiguous run of its
// elements (a "piece"), held as a 1-D tensor under the parameter's name, so AdamW's per-name rules (weight decay)
// apply unchanged.
//
// Collectives run in buckets of about 25 MB, as the data-parallel all-reduce does, so their staging memory does not
// grow with the model.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "trl/core/tensor.h"
#include "trl/dist/communicator.h"

namespace trl::dist {

class FlatShards {
 public:
  // params: (name, element count) in the order every rank agrees on; `shards` ranks, this one owning `index`.
  FlatShards(std::vector<std::pair<std::string, int64_t>> params, int shards, int index);

  int64_t total() const { return total_; }        // N: the trained elements
  int64_t shard_size() const { return shard_; }   // S: the elements of one shard (the last one's padding included)
  int shards() const { return shards_; }
  int index() const { return index_; }
  size_t num_params() const { return params_.size(); }
  const std::string& name(size_t p) const { return params_[p].first; }

  // Elements [offset, offset + length) of parameter `name` are elements [at, at + length) of this rank's shard.
  struct Piece {
    std::string name;
    int64_t offset = 0, length = 0, at = 0;
  };
  const std::vector<Piece>& pieces() const { return pieces_; }

  // fn(param, offset, length, flat): the runs of parameters that cover the flat range [begin, end) (clamped to N;
  // the padding has no parameter), in order; elements [offset, offset + length) of parameter `param` are flat
  // elements [flat, flat + length).
  void for_each_run(int64_t begin, int64_t end, const std::function<void(size_t param, int64_t offset, int64_t length, int64_t flat)>& fn) const;

 private:
  std::vector<std::pair<std::string, int64_t>> params_;
  std::vector<int64_t> starts_;  // starts_[p]: flat index of parameter p's first element; starts_.back() == N
  int64_t total_ = 0, shard_ = 0;
  int shards_ = 1, index_ = 0;
  std::vector<Piece> pieces_;
};

// grads: every trained parameter's whole f32 gradient on this rank (by name) -> shard:[S] f32, this rank's shard of
// their sum over `group` (reduce-scatter; the padding sums to 0).
void reduce_scatter_flat(Communicator& group, const FlatShards& fs, const std::map<std::string, Tensor>& grads, float* shard);

// whole: every trained parameter's whole tensor (f32 or bf16, one dtype), whose elements of this rank's shard are
// up to date -> every element up to date on every rank of `group` (all-gather).
void all_gather_flat(Communicator& group, const FlatShards& fs, std::map<std::string, Tensor>& whole);

// pieces: this rank's pieces (f32, by name, as FlatShards::pieces) -> the whole tensors (f32, of `shapes`) on rank
// 0 of `group`, an empty map on the others. Collective: every rank of the group calls it.
std::map<std::string, Tensor> gather_whole(Communicator& group, const FlatShards& fs, const std::map<std::string, Tensor>& pieces,
                                           const std::map<std::string, Shape>& shapes);

}  // namespace trl::dist

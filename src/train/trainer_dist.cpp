// What the Trainer's ranks share (trainer_state.h; docs/DISTRIBUTED.md): the tensor-parallel and data-parallel
// groups, the bucketed gradient all-reduce, the metrics and weights the data-parallel ranks agree on, FSDP's shards,
// and the joins of tensor-parallel slices into whole tensors.
#include <chrono>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "train/trainer_state.h"
#include "trl/core/collectives.h"
#include "trl/core/error.h"

namespace trl {

namespace {
using ojson = nlohmann::ordered_json;
}  // namespace

Trainer::State::State(const CausalLM& m, const TrainingArguments& c, const char* name)
    : cfg(c), config_name(name), model(m), save_dtype(m.dtype()), source_dir(m.path()),
      opt(AdamWConfig{cfg.adam_beta1, cfg.adam_beta2, cfg.adam_epsilon, cfg.weight_decay}),
      model_name(cfg.model_name_or_path.empty() ? m.path() : cfg.model_name_or_path), comm(dist::world()), dp(&comm) {
  if (cfg.distributed.ep_size > 1 || cfg.distributed.enable_expert_parallel) {
    bool sparse = false;
    for (int64_t i = 0; i < m.config().num_hidden_layers; ++i) sparse = sparse || m.config().sparse_layer(i);
    if (!sparse)
      fail("{}: {} splits a mixture of experts' experts, but the model ({}) has none; use tp_size for tensor parallel", config_name,
           cfg.distributed.ep_size > 1 ? fmt::format("ep_size {}", cfg.distributed.ep_size) : std::string("enable_expert_parallel"),
           m.config().model_type);
  }
  if (tp() == 1) return;
  const int r = comm.rank(), T = static_cast<int>(tp());
  tp_group = comm.split(r / T, r);  // consecutive ranks: on one machine where they can be
  dp_group = comm.split(r % T, r);
  dp = dp_group.get();
  set_collective_group(kTensorParallelGroup, [this](void* data, int64_t n, DType dtype) {
    const auto t0 = std::chrono::steady_clock::now();
    tp_group->all_reduce(data, n, dtype, dist::ReduceOp::Sum);
    tp_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  model = m.tensor_parallel_shard(TensorParallel{tp(), tp_group->rank(), kTensorParallelGroup});
}

Trainer::State::~State() {
  if (tp_group) set_collective_group(kTensorParallelGroup, nullptr);
}

// A cheap fingerprint of weights (every 61st 16-bit word of every tensor): data-parallel ranks apply the same update
// to the same weights, so their fingerprints must agree.
uint64_t weights_fingerprint(const TensorMap& weights) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& [name, w] : weights) {
    const uint16_t* x = static_cast<const uint16_t*>(w.data());
    const int64_t words = static_cast<int64_t>(w.nbytes() / 2);
    for (int64_t i = 0; i < words; i += 61) h = (h ^ x[i]) * 1099511628211ull;
  }
  return h;
}

// The logging window's means over every data-parallel rank's micro-batches (each rank's per-name sums and counts,
// summed; tensor-parallel ranks share their micro-batches and metrics).
ojson Trainer::State::global_means(const MetricWindow& metrics) const {
  if (dp->size() == 1) return metrics.means();
  const ojson own = metrics.sums();
  ojson merged = ojson::object();
  for (int root = 0; root < dp->size(); ++root) {
    const ojson part = ojson::parse(dp->broadcast_string(own.dump(), root));
    for (const auto& [name, sc] : part.items()) {
      if (!merged.contains(name)) merged[name] = ojson::array({0.0, 0});
      merged[name][0] = merged[name][0].get<double>() + sc[0].get<double>();
      merged[name][1] = merged[name][1].get<int64_t>() + sc[1].get<int64_t>();
    }
  }
  ojson out = ojson::object();
  for (const auto& [name, sc] : merged.items()) out[name] = sc[0].get<double>() / static_cast<double>(std::max<int64_t>(1, sc[1].get<int64_t>()));
  return out;
}

// Data-parallel ranks must hold the same weights after every step (the same summed gradients, the same update); under
// tensor parallel, the ranks that hold the same slice.
void Trainer::State::check_ranks_agree() const {
  if (dp->size() == 1) return;
  TensorMap whole_weights;  // under FSDP the whole weights are the compute copies (the masters are pieces)
  if (fsdp())
    for (const auto& [name, shape] : trained) whole_weights[name] = compute.at(name);
  int64_t h = 0;
  if (backend->host_memory()) {
    h = static_cast<int64_t>(weights_fingerprint(fsdp() ? whole_weights : master) >> 1);
  } else {  // on a device: the masters' sum of squares, summed where they are (the same bits for the same weights)
    std::vector<Tensor> all;
    for (const auto& [name, w] : master) all.push_back(w);
    if (all.empty()) return;
    const double sq = backend->sum_of_squares(all, std::vector<int>(all.size(), 0)).at(0);
    std::memcpy(&h, &sq, sizeof h);
    h >>= 1;
  }
  if (dp->min(h) != dp->max(h))
    fail("after step {} the ranks' weights differ: the data-parallel ranks must apply the same update (a rank with a different build, "
         "model or options?)", global_step);
}

// FSDP: the flat shard layout over the trained parameters, the groups, and this rank's pieces of the masters (in
// an f32 run views of the compute weights; in a bf16 one owned f32 copies, the whole masters then freed).
void Trainer::State::shard_state() {
  const int F = static_cast<int>(cfg.distributed.fsdp_size), r = dp->rank();
  shard_group = dp->split(r / F, r);  // data-parallel ranks [g·F, (g+1)·F) shard the state between them
  replicas = dp->split(r % F, r);     // the ranks holding the same shard in each group
  std::vector<std::pair<std::string, int64_t>> params;
  for (const auto& [name, shape] : trained) params.emplace_back(name, shape_numel(shape));
  shards = std::make_unique<dist::FlatShards>(std::move(params), F, shard_group->rank());
  TensorMap pieces;
  for (const dist::FlatShards::Piece& p : shards->pieces()) {
    const Tensor& w = master.at(p.name);
    const Tensor piece = w.reshape({w.numel()}).slice_flat(p.offset, {p.length});
    pieces[p.name] = cfg.bf16 ? piece.clone() : piece;
    if (cfg.bf16) {
      const Tensor& c = compute.at(p.name);
      compute_pieces[p.name] = c.reshape({c.numel()}).slice_flat(p.offset, {p.length});
    }
  }
  master = std::move(pieces);
  shard_grad = Tensor::zeros(DType::F32, {shards->shard_size()});
}

// FSDP: the step's whole gradients on this rank -> `grads` = this rank's pieces of their sum over every rank
// (reduce-scattered in the shard group, then summed over the replicas).
void Trainer::State::reduce_gradients_to_shard() {
  float* g = shard_grad.mutable_data_as<float>();
  dist::reduce_scatter_flat(*shard_group, *shards, grads, g);
  if (replicas->size() > 1) replicas->all_reduce(g, shards->shard_size(), DType::F32, dist::ReduceOp::Sum);
  grads.clear();
  for (const dist::FlatShards::Piece& p : shards->pieces()) grads[p.name] = shard_grad.slice_flat(p.at, {p.length});
}

// FSDP: every rank prints the bytes of its f32 masters and AdamW moments beside the unsharded figure (tests and
// bench/run_dp.sh read this line).
void Trainer::State::report_shard() const {
  uint64_t held = 0, unsharded = 0;
  for (const TensorMap* m : {&master, &opt.exp_avg(), &opt.exp_avg_sq()})
    for (const auto& [name, t] : *m) held += t.nbytes();
  for (const auto& [name, shape] : trained) unsharded += 12 * static_cast<uint64_t>(shape_numel(shape));
  std::fprintf(stderr, "[trl] %sFSDP shard %d of %d: f32 masters and AdamW moments %llu bytes on this rank (%s), %llu unsharded\n",
               dist::rank_prefix().c_str(), shards->index(), shards->shards(), static_cast<unsigned long long>(held), format_bytes(held).c_str(),
               static_cast<unsigned long long>(unsharded));
}

// `pieces` (f32 masters or moments of the trained parameters) whole on this rank: themselves, or under FSDP
// gathered onto the first rank of each data-parallel group (a collective of its shard group; the other ranks get an
// empty map). Under tensor parallel, this rank's slices (join_slices makes them whole).
TensorMap Trainer::State::whole(const TensorMap& pieces) const {
  if (!fsdp()) return to_host(pieces);  // shallow on a host backend: the same storage
  if (dp->rank() >= shards->shards()) return {};
  return dist::gather_whole(*shard_group, *shards, pieces, trained);
}

// Tensor parallel: the slices of the first tensor-parallel group (ranks 0 .. tp_size − 1) joined into whole
// tensors on rank 0, one tensor at a time (every rank of that group calls it with the same names; the others get an
// empty map). The tensors whole on every rank are rank 0's. Without tensor parallel: `local` itself.
TensorMap Trainer::State::join_slices(const TensorMap& local) const {
  if (tp() == 1) return local;
  if (comm.rank() >= tp()) return {};
  TensorMap out;
  for (const auto& [name, t] : local) {
    const int axis = tensor_parallel_axis(name);
    if (axis < 0) {
      if (is_main()) out[name] = t;
      continue;
    }
    // all_gather: the ranks' slices one after the other ([tp, ...slice]).
    Tensor all = Tensor::uninitialized(t.dtype(), {tp() * t.numel()});
    tp_group->all_gather(t.data(), all.mutable_data(), t.numel(), t.dtype());
    if (!is_main()) continue;
    Shape shape = t.shape();
    shape[static_cast<size_t>(axis)] *= tp();
    if (axis == 0) {
      out[name] = all.reshape(shape);
      continue;
    }
    // Columns: row i of the whole tensor is row i of every rank's slice, in rank order.
    const int64_t R = t.size(0), part = t.size(1);
    const size_t es = dtype_size(t.dtype()), row_bytes = static_cast<size_t>(part) * es;
    Tensor joined = Tensor::uninitialized(t.dtype(), shape);
    const char* from = static_cast<const char*>(all.data());
    char* to = static_cast<char*>(joined.mutable_data());
    for (int64_t k = 0; k < tp(); ++k)
      for (int64_t i = 0; i < R; ++i)
        std::memcpy(to + static_cast<size_t>(i * tp() + k) * row_bytes, from + static_cast<size_t>(k * R + i) * row_bytes, row_bytes);
    out[name] = std::move(joined);
  }
  return out;
}

}  // namespace trl

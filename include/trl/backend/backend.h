// A backend compiles a Graph (traced for one shape) into a Program and runs it. Programs take their inputs by
// name (data inputs and weights alike) and return the graph's outputs in order.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trl/backend/policy_loss.h"
#include "trl/backend/sampling.h"
#include "trl/core/tensor.h"
#include "trl/graph/graph.h"

namespace trl {

namespace dist {
class Communicator;
}  // namespace dist

using TensorMap = std::map<std::string, Tensor>;

class Program {
 public:
  virtual ~Program() = default;
  // Every graph input must be bound in `inputs` with its exact dtype and shape (a clear error otherwise).
  virtual std::vector<Tensor> run(const TensorMap& inputs) = 0;
  // A two-stage program (graph::Graph::seed_inputs): stage 0 binds every input but the seeds, runs the nodes
  // before graph::stage_boundary and returns the outputs they produce (the others are empty tensors); stage 1
  // binds the seeds and runs the rest, returning every output. The stage-0 inputs must stay alive and unchanged
  // until stage 1 has run, and the program must not run anything else in between (on a backend whose programs
  // share an arena, neither may any other program of that backend: stage 1 then fails and names the cause).
  // run() is both stages at once. The default implementation refuses: a backend opts in by overriding it.
  virtual std::vector<Tensor> run_stage(const TensorMap& inputs, int stage);
  // Bytes of the program's planned working memory (its arena); 0 where the backend does not plan one.
  virtual size_t arena_bytes() const { return 0; }
  // The program's plan in a form the backend can reuse for the same graph (the on-disk cache keeps it); empty
  // where the backend has nothing worth keeping.
  virtual std::string plan_blob() const { return {}; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The bucket of pad_to_multiple_of = "auto" on this backend: 128 where a compile is expensive (Neuron-style
  // backends), finer where it is cheap. Sequences padded to it keep the number of distinct programs small.
  virtual int64_t auto_pad_multiple() const { return 128; }

  // Where programs read their tensors. A host backend (cpu, reference) runs on host memory: run() uses the bound
  // tensors in place, and upload/download return them as they are. A device backend keeps parameters, optimizer
  // state and KV caches in its own memory: the caller uploads each once, binds the returned tensors on every run
  // (programs update them in place there, as the CPU does on the host), and downloads only what the host reads.
  virtual bool host_memory() const { return true; }
  // `name` labels the device tensor in errors ("'lm_head.weight' in cuda:0 memory").
  virtual Tensor upload(const Tensor& host, const std::string& name = "") {
    (void)name;
    return host;
  }
  virtual Tensor download(const Tensor& tensor) { return tensor; }
  // Host values written into an existing tensor of this backend's memory (same dtype and element count), so every
  // holder of that tensor sees them: a resumed checkpoint's masters and compute copies. On the host a copy.
  virtual void upload_into(Tensor& dst, const Tensor& host) { dst.copy_from(host); }
  // What crossed between the host and this backend's memory since it was made (host backends: nothing).
  struct Transfers {
    int64_t uploads = 0, upload_bytes = 0, downloads = 0, download_bytes = 0;
    int64_t largest_upload = 0, largest_download = 0;  // bytes of the largest single tensor each way
  };
  virtual Transfers transfers() const { return {}; }
  // The memory this backend's tensors and programs draw on: for the host backends the process's budget (MemAvailable,
  // a cgroup limit, or TRL_MEMORY_LIMIT), for a device its free and total bytes. The trainers' memory check and
  // auto_find_batch_size plan against it; `trl env` prints it.
  struct Memory {
    uint64_t available = 0, total = 0;  // bytes; 0: unknown
    std::string source;                 // what the figures came from ("MemAvailable", "cudaMemGetInfo", ...)
  };
  virtual Memory memory() const;

  // Work between programs, on tensors in this backend's memory (f32, contiguous): the trainer's gradient
  // accumulation and global-norm clipping. Host backends run them as vectorised loops on the host; a device
  // backend runs them where the tensors live, and only the scalars come back.
  //   accumulate: acc = x (first) or acc += x, same shape.
  //   sum_of_squares: Σ x² of each tensor, accumulated in f64 (NaN and Inf propagate), added into the sum of its
  //   group in the tensors' order (group_of[i] in [0, G); G sums come back); group_of empty: a sum per tensor.
  //   scale: x *= factor, every tensor.
  virtual void accumulate(Tensor& acc, const Tensor& x, bool first);
  virtual std::vector<double> sum_of_squares(const std::vector<Tensor>& xs, const std::vector<int>& group_of);
  virtual void scale(std::vector<Tensor>& xs, float factor);

  //   all_reduce: each tensor summed over the ranks of `comm` in place, where the tensors are (data parallel's
  //   gradients; every rank calls with the same tensors in the same order). The host backends pack the smaller
  //   tensors into buckets of about 25 MB (torch DDP's bucket_cap_mb) for the communicator; a device backend runs
  //   its own collectives on its memory, so no gradient crosses to the host.
  virtual void all_reduce(std::vector<Tensor>& xs, dist::Communicator& comm);

  // A tensor in this backend's memory, its contents undefined (the optimizer's moments are made with it; `name`
  // labels it in errors).
  virtual Tensor allocate(DType dtype, const Shape& shape, const std::string& name = "");

  // One AdamW step of one parameter, torch.optim.AdamW's arithmetic in f32 (decoupled weight decay):
  //   m = m + (1-b1)(g-m);  v = b2·v + (1-b2)·g²;  w = w·keep - step_size·m / (sqrt(v)·inv_sqrt_bc2 + eps)
  // with keep = 1 - lr·weight_decay, step_size = lr / (1 - b1^t), inv_sqrt_bc2 = 1 / sqrt(1 - b2^t) computed by
  // the caller (src/train/optim/adamw.cpp). fresh: m and v start at zero (their contents are not read). compute
  // (optional, bf16): receives the updated weight rounded to bf16 in the same pass (mixed precision's copy).
  // grad, exp_avg, exp_avg_sq and weight are f32 of one shape; every backend gives the same bits (no FMA).
  struct AdamWStep {
    float keep = 1, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, step_size = 0, inv_sqrt_bc2 = 1;
    bool fresh = false;
  };
  virtual void adamw_step(const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, Tensor& weight, Tensor* compute, const AdamWStep& step);
  // Sets every byte of `t` (in this backend's memory) to zero: a static KV cache before its prefill.
  virtual void zero(Tensor& t);
  // A copy of `t` in this backend's memory (device to device; on the host a clone): an output kept past the next
  // run of its program's arena, a weight that must not change with its source.
  virtual Tensor copy(const Tensor& t, const std::string& name = "") {
    (void)name;
    return t.clone();
  }
  // TR-DPO's reference update: a new tensor in this backend's memory with target's dtype (f32 or bf16) and shape,
  // each element alpha·source + (1 - alpha)·target computed in f32 and rounded once to the dtype (source: f32 or
  // bf16, target's shape). Never in place: a given reference's tensors may be the caller's or a mapped file.
  virtual Tensor mix(const Tensor& target, const Tensor& source, float alpha, const std::string& name = "");
  // generate()'s next token of each row, chosen where the logits are, so only the ids reach the host. Row b's
  // scores are row b·row_stride + row_offset of `logits` (in this backend's memory; a float tensor whose last
  // dimension is the vocabulary, seen as [R, V]), processed as process_logits and picked as pick_token do
  // (trl/backend/sampling.h): row b of `context` is the ids so far (i32 [rows, T] in this backend's memory, read only
  // with a repetition penalty), uniforms[b] the draw (host scalars, as the AdamW step's constants; read only when
  // sampling). Every backend gives the same ids.
  struct SampleRequest {
    int64_t rows = 0, row_stride = 1, row_offset = 0;
    SamplingParams params;
    std::vector<double> uniforms;
    const Tensor* context = nullptr;
  };
  virtual std::vector<int32_t> sample(const Tensor& logits, const SampleRequest& request);
  // Per-sequence sums of per-token values where they are, so only the sums reach the host (DPO's and KTO's summed
  // log-probs and their metrics): for each span {row, begin, end} of `values` [R, T] (f32), the sum over t in
  // [begin, end) of weights[row, t] · factors[row, t] · values[row, t] in f64, skipping tokens whose weight is 0,
  // added in order (every backend gives the same bits). weights: optional f32 [R, T] (none: every token of a span
  // counts once, a one-token span reads one value); factors: optional f32 [R, T] (1).
  struct Span {
    int64_t row = 0, begin = 0, end = 0;
  };
  virtual std::vector<double> span_sums(const Tensor& values, const Tensor* weights, const Tensor* factors, const std::vector<Span>& spans);
  // GRPO's and RLOO's per-token loss where the log-probs are (trl/backend/policy_loss.h), so only the loss and the
  // metrics reach the host: reads the [B, C] f32 tensors of the request (in this backend's memory), writes
  // seed[b, c] = share · dL/dlogp[b, c] (f32 [B, C], this backend's memory, every element) and returns the metrics
  // with the loss times share. Computed in f64 as grpo_loss / rloo_loss are; every backend gives the same bits.
  struct PolicyLossRequest {
    bool rloo = false;  // RLOO's sequence ratio (options' epsilons and micro_batches), else GRPO's options
    GrpoLossOptions options;
    double share = 1;                  // a rank's share of a loss that is a mean over the micro-batch's rows
    const Tensor* logp = nullptr;      // the policy's per-token log-probs
    const Tensor* mask = nullptr;      // the loss mask
    const Tensor* entropy = nullptr;   // optional: the metric's per-token entropies
    const Tensor* old_logp = nullptr;  // optional: generation time's (absent: logp itself)
    const Tensor* ref_logp = nullptr;  // the reference's: required when options.beta ≠ 0 (GRPO)
    std::vector<double> advantages;    // [B], host values (as AdamW's step constants)
  };
  virtual PolicyLossMetrics policy_loss(const PolicyLossRequest& request, Tensor& seed);
  // Rows copied inside this backend's memory (device to device): dst[dst_rows[k]] = src[src_rows[k]] along the first
  // dimension, src and dst of one dtype and one row shape (src may be another backend's tensor of the same memory).
  virtual void copy_rows(const Tensor& src, const std::vector<int64_t>& src_rows, Tensor& dst, const std::vector<int64_t>& dst_rows);
  // The kernel adamw_step runs on this machine ("avx512", "avx2", "portable"): `trl env` prints it.
  virtual std::string adamw_kernel() const { return "portable"; }

  virtual std::unique_ptr<Program> compile(const graph::Graph& graph) = 0;
  // Compiles `graph` reusing `plan` (a plan_blob() of an earlier compile of the same graph). A plan that does not
  // fit the graph is not used: the program is planned anew and *used is false.
  virtual std::unique_ptr<Program> compile_with_plan(const graph::Graph& graph, const std::string& plan, bool* used) {
    (void)plan;
    *used = false;
    return compile(graph);
  }
};

// The oracle: plain loops, f64 accumulation, rounding to each value's dtype exactly where Transformers rounds.
// Callers that pick a backend by name use make_backend() (backend/registry.h).
std::unique_ptr<Backend> make_reference_backend();
// The same programs on tensors the host may not read (backend "reference-device"): it stands for a device backend in
// tests on any machine. upload/download copy and are counted (transfers()); programs take device tensors only and
// return device tensors.
std::unique_ptr<Backend> make_reference_device_backend();

// Where a program's inputs must live: in host memory (the host backends) or in the backend's device memory.
enum class InputMemory { Host, Device };
// Looks up and checks the binding of every graph input (shared by all backends): name, dtype, shape, contiguity,
// and the memory it is in (a device tensor bound on a host backend, or a host tensor on a device backend, is an
// error naming the input and what to do).
// A host tensor that a program on `backend` reads (a batch, a seed): uploaded to a device backend, the tensor
// itself on a host backend.
inline Tensor to_backend(Backend& backend, const Tensor& host, const std::string& name = "") {
  return backend.host_memory() ? host : backend.upload(host, name);
}
// The tensors a program binds by name (a model's weights) in `backend`'s memory: on a device backend those on the
// host uploaded, each once under its name, and those already there kept; on a host backend the map as it is.
TensorMap to_backend(Backend& backend, const TensorMap& tensors);
// A program's output that the host reads (a loss, per-token values): downloaded from a device, else itself.
inline Tensor to_host(Backend& backend, const Tensor& t) { return t.is_device() ? backend.download(t) : t; }

// The checks of Backend::sample's arguments (shapes, rows in range, one uniform per row, the context's shape).
void check_sample_request(const Tensor& logits, const Backend::SampleRequest& request);
// The checks of Backend::policy_loss's and Backend::copy_rows's arguments (shapes, dtypes, rows in range).
void check_policy_loss_request(const Backend::PolicyLossRequest& request, const Tensor& seed);
void check_copy_rows(const Tensor& src, const std::vector<int64_t>& src_rows, const Tensor& dst, const std::vector<int64_t>& dst_rows);
// The checks of Backend::adamw_step's arguments (dtypes, shapes, contiguity), shared by every backend's override.
void check_adamw_step(const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& weight, const Tensor* compute);

std::vector<Tensor> bind_inputs(const graph::Graph& graph, const TensorMap& inputs, InputMemory memory = InputMemory::Host);
// The same for the inputs of one stage of a two-stage program (stage 0: all but the seeds; stage 1: the seeds);
// the others are left as empty tensors.
std::vector<Tensor> bind_stage_inputs(const graph::Graph& graph, const TensorMap& inputs, int stage, InputMemory memory = InputMemory::Host);

}  // namespace trl

// The reference backend: obviously correct loops that run any graph. It is the oracle every optimised kernel is
// tested against, so it favours clarity over speed: f64 accumulation, and rounding to the value's dtype at the
// points where Transformers' eager Qwen3 rounds (so a bf16 model is emulated faithfully).
#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace trl {

namespace {

using graph::Graph;
using graph::kNone;
using graph::Node;
using graph::Op;

// Round a value to what storing it in `dtype` would keep.
double rnd(DType dtype, double v) {
  switch (dtype) {
    case DType::BF16: return round_bf16(static_cast<float>(v));
    case DType::F16: return f16_to_f32(f32_to_f16(static_cast<float>(v)));
    case DType::F32: return static_cast<float>(v);
    default: return v;
  }
}

std::vector<float> as_f32(const Tensor& t) { return t.to_f32_vector(); }

// ids:[B,T] i32, table:[V,C] -> out:[B,T,C]
void embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  const int64_t V = table.size(0), C = table.size(1);
  const int32_t* id = ids.data_as<int32_t>();
  void* o = out.mutable_data();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    if (id[i] < 0 || id[i] >= V) fail("embedding: token id {} at flat position {} is out of range for a vocabulary of {}", id[i], i, V);
    for (int64_t c = 0; c < C; ++c) store_element(o, out.dtype(), i * C + c, load_element(table.data(), table.dtype(), id[i] * C + c));
  }
}

// x:[M,K], w:[N,K], bias:[N] or none -> out:[M,N]
void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) {
  const int64_t K = x.size(-1), M = x.numel() / std::max<int64_t>(K, 1), N = w.size(0);
  const std::vector<float> wf = as_f32(w);  // exact for f32/bf16/f16 storage
  const std::vector<float> xf = as_f32(x);
  std::vector<float> bf = bias ? as_f32(*bias) : std::vector<float>();
  void* o = out.mutable_data();
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = xf.data() + m * K;
    for (int64_t n = 0; n < N; ++n) {
      const float* wr = wf.data() + n * K;
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(xr[k]) * wr[k];
      if (bias) acc += bf[static_cast<size_t>(n)];
      store_element(o, out.dtype(), m * N + n, acc);
    }
  }
}

// x:[R,C], w:[C] -> out:[R,C].  y = w · cast(x / sqrt(mean(x²) + eps)), the cast being to x's dtype.
void rms_norm(const Tensor& x, const Tensor& w, double eps, Tensor& out) {
  const int64_t C = x.size(-1), R = x.numel() / std::max<int64_t>(C, 1);
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) {
      double v = load_element(x.data(), x.dtype(), r * C + c);
      ss += v * v;
    }
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    for (int64_t c = 0; c < C; ++c) {
      double y = rnd(x.dtype(), load_element(x.data(), x.dtype(), r * C + c) * inv);
      store_element(out.mutable_data(), out.dtype(), r * C + c, y * load_element(w.data(), w.dtype(), c));
    }
  }
}

// x:[B,T,H,D], positions:[B,T] -> out:[B,T,H,D].  out = x·cos + rotate_half(x)·sin, rotate_half(x) = [-x2, x1].
// cos/sin follow Transformers: angle = f32(pos · inv_freq) in f32, cos/sin rounded to the activation dtype.
void rope(const Tensor& x, const Tensor& positions, const graph::Attrs& a, Tensor& out) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3), half = D / 2;
  const DType dt = x.dtype();
  const int32_t* pos = positions.data_as<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const float p = static_cast<float>(pos[b * T + t]);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = ((b * T + t) * H + h) * D;
        for (int64_t j = 0; j < D; ++j) {
          const float angle = p * a.inv_freq[static_cast<size_t>(j % half)];
          const double c = rnd(dt, std::cos(static_cast<double>(angle)) * a.rope_scaling);
          const double s = rnd(dt, std::sin(static_cast<double>(angle)) * a.rope_scaling);
          const double xj = load_element(x.data(), dt, base + j);
          const double rot = j < half ? -load_element(x.data(), dt, base + j + half) : load_element(x.data(), dt, base + j - half);
          store_element(out.mutable_data(), out.dtype(), base + j, rnd(dt, xj * c) + rnd(dt, rot * s));
        }
      }
    }
  }
}

// q:[B,T,H,D], k,v:[B,S,Hkv,D], key_mask:[B,S] or none -> out:[B,T,H,D]
// Query t sits at key index t + (S - T); with `causal` it sees keys 0..that index whose mask is 1. A query that
// sees no key at all (a padding row) gets zeros. As in Transformers' eager attention, the scores q·kᵀ, the scaled
// scores and the probabilities are stored in the activation dtype (softmax itself runs in higher precision).
void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* mask, const graph::Attrs& a, Tensor& out) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), S = k.size(1), Hkv = k.size(2);
  const int64_t rep = H / Hkv, offset = S - T;
  const std::vector<float> qf = as_f32(q), kf = as_f32(k), vf = as_f32(v);
  std::vector<double> p(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / rep;
      for (int64_t t = 0; t < T; ++t) {
        const float* qr = qf.data() + ((b * T + t) * H + h) * D;
        double mx = -INFINITY;
        for (int64_t s = 0; s < S; ++s) {
          bool allowed = (!a.causal || s <= t + offset) && (mask == nullptr || mask->data_as<int32_t>()[b * S + s] != 0);
          if (!allowed) {
            p[static_cast<size_t>(s)] = -INFINITY;
            continue;
          }
          const float* kr = kf.data() + ((b * S + s) * Hkv + hk) * D;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qr[d]) * kr[d];
          p[static_cast<size_t>(s)] = rnd(q.dtype(), rnd(q.dtype(), dot) * a.scale);
          mx = std::max(mx, p[static_cast<size_t>(s)]);
        }
        const int64_t obase = ((b * T + t) * H + h) * D;
        if (mx == -INFINITY) {
          for (int64_t d = 0; d < D; ++d) store_element(out.mutable_data(), out.dtype(), obase + d, 0.0);
          continue;
        }
        double sum = 0;
        for (int64_t s = 0; s < S; ++s) {
          double e = p[static_cast<size_t>(s)] == -INFINITY ? 0.0 : std::exp(p[static_cast<size_t>(s)] - mx);
          p[static_cast<size_t>(s)] = e;
          sum += e;
        }
        for (int64_t s = 0; s < S; ++s) p[static_cast<size_t>(s)] = rnd(q.dtype(), p[static_cast<size_t>(s)] / sum);
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t s = 0; s < S; ++s) {
            if (p[static_cast<size_t>(s)] != 0) acc += p[static_cast<size_t>(s)] * vf[static_cast<size_t>(((b * S + s) * Hkv + hk) * D + d)];
          }
          store_element(out.mutable_data(), out.dtype(), obase + d, acc);
        }
      }
    }
  }
}

// gate,up:[...,F] -> silu(gate)·up, with silu's result rounded to the dtype first (as an eager bf16 model does).
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  for (int64_t i = 0; i < gate.numel(); ++i) {
    const double g = load_element(gate.data(), gate.dtype(), i);
    const double s = rnd(gate.dtype(), g / (1.0 + std::exp(-g)));
    store_element(out.mutable_data(), out.dtype(), i, s * load_element(up.data(), up.dtype(), i));
  }
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  for (int64_t i = 0; i < a.numel(); ++i) {
    store_element(out.mutable_data(), out.dtype(), i, load_element(a.data(), a.dtype(), i) + load_element(b.data(), b.dtype(), i));
  }
}

class ReferenceProgram final : public Program {
 public:
  explicit ReferenceProgram(Graph graph) : graph_(std::move(graph)) {}

  std::vector<Tensor> run(const TensorMap& inputs) override {
    std::vector<Tensor> bound = bind_inputs(graph_, inputs);
    std::vector<Tensor> values(graph_.nodes.size());
    for (size_t i = 0; i < graph_.inputs.size(); ++i) values[static_cast<size_t>(graph_.inputs[i])] = bound[i];
    auto in = [&](const Node& n, size_t i) -> const Tensor& { return values[static_cast<size_t>(n.inputs[i])]; };
    auto opt = [&](const Node& n, size_t i) -> const Tensor* {
      return n.inputs.size() > i && n.inputs[i] != kNone ? &values[static_cast<size_t>(n.inputs[i])] : nullptr;
    };
    for (size_t id = 0; id < graph_.nodes.size(); ++id) {
      const Node& n = graph_.nodes[id];
      if (n.op == Op::Input) continue;
      if (n.op == Op::Reshape) {
        values[id] = in(n, 0).reshape(n.shape);
        continue;
      }
      if (n.op == Op::Cast) {
        values[id] = in(n, 0).to(n.dtype);
        continue;
      }
      Tensor out = Tensor::zeros(n.dtype, n.shape);
      try {
        switch (n.op) {
          case Op::Embedding: embedding(in(n, 0), in(n, 1), out); break;
          case Op::MatMul: matmul(in(n, 0), in(n, 1), opt(n, 2), out); break;
          case Op::RmsNorm: rms_norm(in(n, 0), in(n, 1), n.attrs.eps, out); break;
          case Op::Rope: rope(in(n, 0), in(n, 1), n.attrs, out); break;
          case Op::Attention: attention(in(n, 0), in(n, 1), in(n, 2), opt(n, 3), n.attrs, out); break;
          case Op::SwiGLU: swiglu(in(n, 0), in(n, 1), out); break;
          case Op::Add: add(in(n, 0), in(n, 1), out); break;
          default: fail("reference backend: op {} is not implemented", graph::op_name(n.op));
        }
      } catch (const Error& e) {
        fail("{} ({}): {}", n.name.empty() ? graph::op_name(n.op) : n.name, graph::op_name(n.op), e.what());
      }
      values[id] = std::move(out);
      // Free values no later node reads (keeps the oracle's memory at the working set, not the whole graph).
      release_dead(values, id);
    }
    std::vector<Tensor> outputs;
    for (graph::ValueId v : graph_.outputs) outputs.push_back(values[static_cast<size_t>(v)]);
    return outputs;
  }

 private:
  void release_dead(std::vector<Tensor>& values, size_t current) {
    if (last_use_.empty()) {
      last_use_.assign(graph_.nodes.size(), 0);
      for (size_t i = 0; i < graph_.nodes.size(); ++i) {
        for (graph::ValueId in : graph_.nodes[i].inputs) {
          if (in != kNone) last_use_[static_cast<size_t>(in)] = i;
        }
      }
      for (graph::ValueId v : graph_.outputs) last_use_[static_cast<size_t>(v)] = graph_.nodes.size();
    }
    for (graph::ValueId in : graph_.nodes[current].inputs) {
      if (in != kNone && last_use_[static_cast<size_t>(in)] == current && graph_.node(in).op != Op::Input) {
        values[static_cast<size_t>(in)] = Tensor();
      }
    }
  }

  Graph graph_;
  std::vector<size_t> last_use_;
};

class ReferenceBackend final : public Backend {
 public:
  std::string name() const override { return "reference"; }
  std::unique_ptr<Program> compile(const Graph& graph) override { return std::make_unique<ReferenceProgram>(graph); }
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace trl

// Vector kernels of the CPU backend (vec.cpp; the distillation rows and max in vec_distill.cpp): one row at a time, f32 arithmetic, run-time ISA dispatch.
// Names: x, y rows of n elements; w a weight row of K elements; M rows of x stored one after the other.
#pragma once

#include <cstdint>

namespace trl::cpu::vec {

// Σ a[i]·b[i] over n.
float dot(const float* a, const float* b, int64_t n);
// Σ a[i]·b[i] over n with a bf16 b.
float dot_bf16(const float* a, const uint16_t* b, int64_t n);
// out[m] = x[m, :]·w for m < M <= 8 (M > 8 is treated as 8), reading the bf16 row w once.
void dots_bf16(const float* x, int64_t M, int64_t K, const uint16_t* w, float* out);
#if defined(__x86_64__)
// The same with bf16 rows of x, on AVX512-BF16 (vdpbf16ps). Only where dots_bf16bf16_available().
void dots_bf16bf16(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, float* out);
#endif
// Whether dots_bf16bf16 may run: the CPU has AVX512-BF16 and TRL_NO_AVX512BF16=1 does not turn it off (checked once).
bool dots_bf16bf16_available();
// Σ x[i] over n.
float sum(const float* x, int64_t n);
// y[i] += a·x[i] over n with a bf16 x.
void axpy_bf16(float* y, float a, const uint16_t* x, int64_t n);

// Attention's scores for one query row before the softmax: x ← scale·x with the rounding of the model dtype (bf16:
// round(round(x)·scale), as eager Transformers stores bf16 scores), -inf where key_seg[j] != seg (key_seg null: no
// mask). Returns the row's maximum.
float attention_scores(float* x, int64_t n, float scale, bool bf16, const int32_t* key_seg, int32_t seg);
// x ← x·inv (rounded to bf16 when bf16), and its bf16 bits into out16 when given: the softmax's normalisation.
void scale_round(float* x, int64_t n, float inv, bool bf16, uint16_t* out16);
// The softmax backward of one row: d ← p∘(d − p·d)·scale, and its bf16 bits into out16 when given.
void softmax_backward_row(const float* p, float* d, int64_t n, float scale, uint16_t* out16);
// SwiGLU on bf16 rows (bf16 training), on AVX-512 or AVX2 + FMA (swiglu_bf16_available()): out = bf16(bf16(silu(g))·u), and
// the backward dg = bf16(dy·u·σ(g)·(1 + g·(1 − σ(g)))), du = bf16(dy·g·σ(g)); σ from the polynomial exp.
bool swiglu_bf16_available();
void swiglu_bf16(const uint16_t* g, const uint16_t* u, int64_t n, uint16_t* out);
void swiglu_backward_bf16(const uint16_t* g, const uint16_t* u, const uint16_t* dy, int64_t n, uint16_t* dg, uint16_t* du);
// The family the exponentials and the bf16 SwiGLU run on this CPU: "avx512", "avx2" (8 lanes, the same bits per
// lane) or "portable" (the generic loops, no bf16 SwiGLU kernel).
const char* exp_kernel();
// x[i] ← e^(x[i] − shift) for x[i] <= shift (the row's maximum); -inf gives 0.
void exp_shift(float* x, int64_t n, float shift);
// The same, returning Σ e^(x − shift).
float exp_shift_sum(float* x, int64_t n, float shift);
// The same, also *ey = Σ e^(x − shift)·(x − shift) (entropy) over the terms with e > 0 (a -inf x adds 0): one pass.
float exp_shift_sum_ey(float* x, int64_t n, float shift, float* ey);
// x[i] ← round_bf16(x[i]) (nearest even; NaN stays NaN).
void round_to_bf16(float* x, int64_t n);
// out[i] = the upper 16 bits of x[i] (exactly its bf16 value when x is already rounded to bf16).
void bf16_bits(const float* x, int64_t n, uint16_t* out);
// out[i] = bf16(x[i]) (nearest even; NaN stays NaN): the vectorised f32 → bf16 cast.
void to_bf16(const float* x, int64_t n, uint16_t* out);
// out[i] = bf16(a·x[i]) (the product in f32, rounded once).
void scale_to_bf16(const float* x, int64_t n, float a, uint16_t* out);
// out[i] = bf16(a[i] + b[i]) for bf16 a, b (the sum in f32, rounded once).
void add_bf16(const uint16_t* a, const uint16_t* b, int64_t n, uint16_t* out);

// The largest element (-inf for n = 0).
float max(const float* x, int64_t n);
// Distillation (ops_distill.cpp), one row of a chunk of the student's logits zs and the teacher's zt:
// pass 1: *ss = Σ e^(zs − ms), *st = Σ e^(zt − mt), and *a = Σ e^(zt − mt)·(zt − zs) (mode 0, forward KL),
// Σ e^(zs − ms)·(zs − zt) (mode 1, reverse KL) or 0 (other modes).
void jsd_pass1_row(const float* zs, const float* zt, int64_t n, float ms, float mt, int mode, double* ss, double* st, double* a);
// With shift = {lse hi, lse lo, lse_t hi, lse_t lo, lse_t − lse}: ls = zs − lse, lt = zt − lse_t, S = e^ls, T = e^lt,
// M = (1 − beta)·S + beta·T. pass 2: *kt = Σ T·(lt − log M), *ks = Σ S·(ls − log M).
void jsd_pass2_row(const float* zs, const float* zt, int64_t n, const float* shift, float beta, double* kt, double* ks);
// The backward: zs ← g·∂J/∂zs: g·(S − T) (beta 0), g·S·(ls − lt − kl) (beta 1), g·(1 − beta)·S·(ls − log M − kl)
// (else), kl = kl_hi + kl_lo.
void jsd_grad_row(float* zs, const float* zt, int64_t n, const float* shift, float beta, float g, float kl_hi, float kl_lo);

}  // namespace trl::cpu::vec

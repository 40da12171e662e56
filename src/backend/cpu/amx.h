// The AMX-BF16 GEMV of decoding (amx.cpp): y[m, n] = x[m, :]·w[n, :] for a few bf16 rows x (M <= 16) against a
// bf16 weight in nn.Linear layout, on the tile unit of Intel Xeons since Sapphire Rapids. Only on a CPU where
// cpu_features().amx_bf16 (CPUID, the OS's XTILEDATA state, and Linux's per-process permission, all at run time).
//
// Why tiles: AVX512-BF16 computes one 32-element dot product per vdpbf16ps, so 8 rows of x against a weight row
// are compute-bound (~100 GFLOP/s per core); TDPBF16PS multiplies 16 weight rows by 32 columns of x in one
// instruction, which leaves the GEMV bound by the weight's memory traffic again.
//
// Layout, for one k-block of 32 columns (kb = k / 32, kp = the column pair within it):
//   A tile (16 rows x 64 bytes) = 16 weight rows w[n0 + r, 32·kb .. 32·kb + 31], read in place (stride 2K bytes);
//   B tile (16 rows x 4M bytes) = xp[kb][kp][m] = the pair x[m, 32·kb + 2kp], x[m, 32·kb + 2kp + 1] (pack_x);
//   C tile (16 rows x 4M bytes) += A·B: C[r][m] = y[m, n0 + r] over the block's 32 columns (f32 accumulation).
#pragma once

#include <cstddef>
#include <cstdint>

namespace trl::cpu::amx {

// Rows of x per call, and weight rows per C tile.
constexpr int64_t kMaxRows = 16;
constexpr int64_t kBlockRows = 16;

// Elements (uint16) of the packed x for M rows: the whole k-blocks only (K / 32 of them).
size_t packed_x_size(int64_t M, int64_t K);
// xp ← x[M, K] (row-major bf16) in the B tiles' layout above, for the first 32·(K / 32) columns.
void pack_x(const uint16_t* x, int64_t M, int64_t K, uint16_t* xp);

// Holds the tile configuration for M rows of x on this thread: ldtilecfg on construction, tilerelease on
// destruction. dots() runs only inside one.
class TileScope {
 public:
  explicit TileScope(int64_t M);
  ~TileScope();
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// c[r·16 + m] = Σ over the whole k-blocks of x[m, k]·w[r, k] for r < blocks·16 weight rows (w row-major with K
// columns; the last 32-column block is complete: K % 32 columns are the caller's), m < M. blocks·16 weight rows
// must exist; c holds blocks·256 floats.
void dots(const uint16_t* xp, int64_t M, int64_t K, const uint16_t* w, int64_t blocks, float* c);

}  // namespace trl::cpu::amx

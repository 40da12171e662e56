// The AMX-BF16 GEMV of decoding; the layout of its tiles is in amx.h. Compiled for the tile instructions per
// function (GCC target attributes), so the rest of the binary stays baseline x86-64; callers check
// cpu_features().amx_bf16 first.
#include "backend/cpu/amx.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace trl::cpu::amx {

size_t packed_x_size(int64_t M, int64_t K) { return static_cast<size_t>((K / 32) * 32 * M); }

// xp[kb][kp][m][j] = x[m, 32·kb + 2·kp + j]: one 32-bit pair per (k-pair, row), rows of the B tile are k-pairs.
void pack_x(const uint16_t* x, int64_t M, int64_t K, uint16_t* xp) {
  const int64_t pairs = K / 32 * 16;
  for (int64_t p = 0; p < pairs; ++p)
    for (int64_t m = 0; m < M; ++m) std::memcpy(xp + (p * M + m) * 2, x + m * K + 2 * p, 4);
}

#if defined(__x86_64__)

namespace {

// The 64-byte operand of ldtilecfg (palette 1): bytes per row and rows of each of the 8 tiles.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Tiles: tmm0..3 accumulate four blocks of 16 weight rows (C), tmm4 holds the k-block of x (B), tmm5..7 take
// the weight rows (A), rotating so a load need not wait for the multiply that reads the previous one.
constexpr int kCTiles = 4;

// Tell the compiler that the tile instructions (inline asm without memory operands) read and write memory.
inline void memory_barrier() { __asm__ volatile("" ::: "memory"); }

// (Free functions: GCC 12 does not inline the tile intrinsics into a constructor with a target attribute.)
__attribute__((target("amx-tile"))) void load_tile_config(int64_t M) {
  TileConfig cfg;
  const auto row_bytes = static_cast<uint16_t>(4 * M);
  for (int t = 0; t < kCTiles; ++t) cfg.colsb[t] = row_bytes, cfg.rows[t] = 16;
  cfg.colsb[4] = row_bytes, cfg.rows[4] = 16;
  for (int t = 5; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  // (Not _tile_loadconfig: its asm names only the first 8 bytes as read, so GCC drops the other stores to cfg.)
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}
__attribute__((target("amx-tile"))) void release_tiles() { _tile_release(); }

}  // namespace

TileScope::TileScope(int64_t M) { load_tile_config(M); }
TileScope::~TileScope() { release_tiles(); }

// c[r·16 + m], blocks of 16 weight rows: four at a time (one x tile load per four multiplies), then one at a time.
// Shapes per k-block: A 16x32 bf16 (w rows), B 16 pairs x M (xp), C 16 x M f32.
__attribute__((target("amx-tile,amx-bf16"))) void dots(const uint16_t* xp, int64_t M, int64_t K, const uint16_t* w, int64_t blocks, float* c) {
  const int64_t kblocks = K / 32, w_stride = 2 * K, x_stride = 4 * M, x_block = 32 * M, w_block = 16 * K;
  memory_barrier();
  int64_t b = 0;
  for (; b + kCTiles <= blocks; b += kCTiles) {
    const uint16_t* w0 = w + b * w_block;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      const uint16_t* a = w0 + kb * 32;
      _tile_loadd(4, xp + kb * x_block, x_stride);
      _tile_loadd(5, a, w_stride);
      _tile_dpbf16ps(0, 5, 4);
      _tile_loadd(6, a + w_block, w_stride);
      _tile_dpbf16ps(1, 6, 4);
      _tile_loadd(7, a + 2 * w_block, w_stride);
      _tile_dpbf16ps(2, 7, 4);
      _tile_loadd(5, a + 3 * w_block, w_stride);
      _tile_dpbf16ps(3, 5, 4);
    }
    float* cb = c + b * 256;
    _tile_stored(0, cb, 64);
    _tile_stored(1, cb + 256, 64);
    _tile_stored(2, cb + 512, 64);
    _tile_stored(3, cb + 768, 64);
  }
  for (; b < blocks; ++b) {
    const uint16_t* w0 = w + b * w_block;
    _tile_zero(0);
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      _tile_loadd(4, xp + kb * x_block, x_stride);
      _tile_loadd(5, w0 + kb * 32, w_stride);
      _tile_dpbf16ps(0, 5, 4);
    }
    _tile_stored(0, c + b * 256, 64);
  }
  memory_barrier();
}

#else

// Never reached: cpu_features().amx_bf16 is false off x86-64.
TileScope::TileScope(int64_t) { __builtin_trap(); }
TileScope::~TileScope() {}
void dots(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, float*) { __builtin_trap(); }

#endif

}  // namespace trl::cpu::amx


// 4-bit linear layer: y = x @ W.T (+ bias) straight from GGUF's
// Q4_0 / Q4_1 blocks, so a decode step reads 5 bits per weight instead of int8's 8.
//
// Why by hand: batch-1 decode is memory bound, and no library multiplies GGUF's 32-weight
// blocks (a 4-bit code, an f16 scale d and minimum m per block) with the batch invariance the
// engine needs.
//
// Numerics. The weights are exactly the file's: W[n][k] = d[n][b] * q[n][k] + m[n][b], q in
// 0..15, b = k / 32 (Q4_0 is q - 8 with m = -8d). Activations are quantized per row and block
// of 32 (as llama.cpp's Q8_1, with a second, 4-bit term): s = max(max|x|, 1e-30) / 127,
// t = x / s, hi = round(t), lo = round((t - hi) * 16) in -8..8, so x ~ s * (hi + lo / 16),
// about 11 bits per block. The integer sum C = sum 16q*hi + sum q*lo (|C| < 2^20) is exact;
// then, block after block in order, one rounding per operation:
//     v = float(C) * (s / 16)
//     acc = d * v + acc                           (FMA)
//     acc = m * S + acc                           (FMA), S = s * (sum hi + sum lo / 16)
// and y = acc (+ bias). Every path (the level's dot products for a few rows, simd.h, as
// C = 16 * sum q*hi + sum q*lo; AMX tiles for more rows at the amx level) computes the same exact
// C and then these operations in this order, so a row's output is bit-identical alone, in any
// batch, on either path. (Without FMA, on the generic level, each FMA is two roundings.)
//
// Weight layout ("packed"): [N16][B][320 bytes], N16 = ceil(N / 16), B = K / 32. Of the 320
// bytes of output group g and block b: four 64-byte vectors v = 0..3 whose byte (lane * 4 + i)
// holds q[16g + lane][32b + 4v + i] in its low nibble and q[16g + lane][32b + 16 + 4v + i] in
// its high nibble (vpdpbusd's operand order: 16 outputs x 4 k-steps), then d (16 f16) and m
// (16 f16). Padding outputs have q = d = m = 0. The AMX path unpacks a group's blocks into
// B tiles of 16 rows: the eight k-steps of 16q (against hi), then the eight of q (against lo).
//
// Activations ("a"): [M][B][64] signed bytes, a block's 32 hi then its 32 lo (one AMX A-tile
// row); per row and block the floats (s / 16, S).

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

namespace {

using namespace simd;

constexpr float kTiny = 1e-30f;
constexpr int64_t kGroupBytes = 320;  // one block of 16 outputs: 256 nibble bytes, 16 d, 16 m
constexpr int64_t kAmxMinRows = 32;  // below this VNNI is as fast (bench_int8_linear.py)
constexpr int kMaxRows = 4;
constexpr int kSub = 16 / kW;  // vectors per group of 16 outputs
constexpr int kGroups = kW == 16 ? 2 : 1;  // groups per register block

// One row of x [K] (K a multiple of 32) -> its activation bytes a [B][64] and floats sc [B][2].
void quantize_row(const float* x, int64_t K, int8_t* a, float* sc) {
  const vf v16 = set1(16.0f);
  for (int64_t b = 0; b < K / 32; ++b) {
    vf vmax = zero();
    for (int i = 0; i < 32; i += kW) vmax = max(vmax, abs(load(x + 32 * b + i)));
    float amax = reduce_max(vmax);
    float s = (amax > kTiny ? amax : kTiny) / 127.0f;
    const vf vs = set1(s);
    vf hsum = zero(), lsum = zero();
    for (int i = 0; i < 32; i += kW) {
      vf t = div(load(x + 32 * b + i), vs);
      vf h = round(t);
      vf l = round(mul(sub(t, h), v16));
      hsum = add(hsum, h);  // small integers: exact in any order
      lsum = add(lsum, l);
      store_bytes(a + 64 * b + i, to_int(h), 0);
      store_bytes(a + 64 * b + 32 + i, to_int(l), 0);
    }
    sc[2 * b] = s * (1.0f / 16.0f);
    sc[2 * b + 1] = s * (reduce_add(hsum) + reduce_add(lsum) * (1.0f / 16.0f));
  }
}

// acc += the block's contribution, from its exact integer sum (the order the header states).
inline vf block_epilogue(vf acc, vi C, vf d, vf m, const float* sc) {
  vf v = mul(to_float(C), set1(sc[0]));
  acc = fmadd(d, v, acc);
  return fmadd(m, set1(sc[1]), acc);
}

inline void store_out(vf acc, const float* bias, float* y, int64_t n, int64_t N) {
  if (n >= N) return;
  if (bias) acc = add(acc, load_n(bias + n, N - n));
  store_n(y + n, acc, N - n);
}

inline vf load_half(const uint8_t* p) { return load_f16((const uint16_t*)p); }

// R rows x NG groups of 16 outputs: per block, H = sum q*hi and L = sum q*lo (exact), then
// C = 16 H + L and the epilogue.
template <int R, int NG>
void dot_block(const int8_t* a, const float* sc, int64_t K, const uint8_t* w,
               const float* bias, float* y, int64_t ldy, int64_t n0, int64_t N) {
  constexpr int V = NG * kSub;
  const int64_t B = K / 32, group_stride = B * kGroupBytes;
  vf acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = zero();
  for (int64_t b = 0; b < B; ++b) {
    vi H[R][V], L[R][V];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) H[r][v] = L[r][v] = izero();
    for (int k = 0; k < 4; ++k) {
      vi q0[V], q1[V];  // k-steps k and k + 4 of the block
      for (int v = 0; v < V; ++v) {
        vi raw = iload(w + (v / kSub) * group_stride + b * kGroupBytes + k * 64
                       + (v % kSub) * 4 * kW);
        q0[v] = low_nibbles(raw);
        q1[v] = high_nibbles(raw);
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* ab = a + (r * B + b) * 64 + 4 * k;
        vi h0 = bcast4(ab), h1 = bcast4(ab + 16), l0 = bcast4(ab + 32), l1 = bcast4(ab + 48);
        for (int v = 0; v < V; ++v) {
          H[r][v] = dot_q4x2(H[r][v], q0[v], h0, q1[v], h1);
          L[r][v] = dot_q4x2(L[r][v], q0[v], l0, q1[v], l1);
        }
      }
    }
    for (int v = 0; v < V; ++v) {
      const uint8_t* dm = w + (v / kSub) * group_stride + b * kGroupBytes + 256
                          + (v % kSub) * 2 * kW;
      vf d = load_half(dm), m = load_half(dm + 32);
      for (int r = 0; r < R; ++r)
        acc[r][v] = block_epilogue(acc[r][v], iadd(ishl4(H[r][v]), L[r][v]), d, m,
                                   sc + 2 * (r * B + b));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v)
      store_out(acc[r][v], bias, y + r * ldy, n0 + 16 * (v / kSub) + (v % kSub) * kW, N);
}

template <int NG>
void dot_rows_ng(int rows, const int8_t* a, const float* sc, int64_t K, const uint8_t* w,
                 const float* bias, float* y, int64_t ldy, int64_t n0, int64_t N) {
  switch (rows) {
    case 1: dot_block<1, NG>(a, sc, K, w, bias, y, ldy, n0, N); break;
    case 2: dot_block<2, NG>(a, sc, K, w, bias, y, ldy, n0, N); break;
    case 3: dot_block<3, NG>(a, sc, K, w, bias, y, ldy, n0, N); break;
    default: dot_block<4, NG>(a, sc, K, w, bias, y, ldy, n0, N); break;
  }
}

// `groups` (1 or 2) groups of 16 outputs, kGroups at a time.
void dot_rows(int groups, int rows, const int8_t* a, const float* sc, int64_t K,
              const uint8_t* w, const float* bias, float* y, int64_t ldy, int64_t n0,
              int64_t N) {
  if (kGroups == 2 && groups == 2) {
    dot_rows_ng<2>(rows, a, sc, K, w, bias, y, ldy, n0, N);
    return;
  }
  for (int g = 0; g < groups; ++g)
    dot_rows_ng<1>(rows, a, sc, K, w + g * (K / 32) * kGroupBytes, bias, y, ldy, n0 + 16 * g, N);
}

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
// Tiles (amx_configure, simd.h: all 16 rows x 64 bytes): tmm0/1 sums, tmm4/5 activations,
// tmm6/7 weights, for even/odd blocks.

// One group's packed blocks -> B tiles [B][16 rows][64]: 16q for k-steps 0..7, then q.
void unpack_group(const uint8_t* w, int64_t B, uint8_t* out) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), high4 = _mm512_set1_epi8((char)0xF0);
  for (int64_t b = 0; b < B; ++b) {
    uint8_t* dst = out + b * 1024;
    for (int v = 0; v < 4; ++v) {
      __m512i raw = _mm512_loadu_si512((const void*)(w + b * kGroupBytes + v * 64));
      _mm512_store_si512((void*)(dst + v * 64),
                         _mm512_and_si512(_mm512_slli_epi16(raw, 4), high4));
      _mm512_store_si512((void*)(dst + (4 + v) * 64), _mm512_and_si512(raw, high4));
      _mm512_store_si512((void*)(dst + (8 + v) * 64), _mm512_and_si512(raw, low4));
      _mm512_store_si512((void*)(dst + (12 + v) * 64),
                         _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4));
    }
  }
}

// One group x one 16-row tile (padding rows are zeros): per block one tile product, then the
// same epilogue as the VNNI path with the 16 rows' accumulators in registers. Even and odd
// blocks use their own tiles and buffer, so one block's tile work overlaps the other's
// epilogue.
void amx_group(int rows, const int8_t* a, const float* sc, int64_t K, const uint8_t* w,
               const uint8_t* tiles, const float* bias, float* y, int64_t ldy, int64_t n0,
               int64_t N) {
  const int64_t B = K / 32;
  alignas(64) int32_t c[2][16][16];
  __m512 acc[16];
  for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < B; ++b) {
    if (b & 1) {
      _tile_loadd(5, a + b * 64, 2 * K);
      _tile_loadd(7, tiles + b * 1024, 64);
      _tile_zero(1);
      _tile_dpbsud(1, 5, 7);
      _tile_stored(1, c[1], 64);
    } else {
      _tile_loadd(4, a + b * 64, 2 * K);
      _tile_loadd(6, tiles + b * 1024, 64);
      _tile_zero(0);
      _tile_dpbsud(0, 4, 6);
      _tile_stored(0, c[0], 64);
    }
    const uint8_t* dm = w + b * kGroupBytes + 256;
    const vf d = load_half(dm), m = load_half(dm + 32);
    for (int r = 0; r < 16; ++r)
      acc[r] = block_epilogue(acc[r], iload(c[b & 1][r]), d, m, sc + 2 * (r * B + b));
  }
  for (int r = 0; r < rows; ++r) store_out(acc[r], bias, y + r * ldy, n0, N);
}
#endif

}  // namespace

extern "C" {

// q [N, K] uint8 codes 0..15, d and m [N, K / 32] f16 bits -> packed (see the header).
void rs_q4_pack(const uint8_t* q, const uint16_t* d, const uint16_t* m, int64_t N, int64_t K,
                uint8_t* packed) {
  const int64_t N16 = (N + 15) / 16, B = K / 32;
  memset(packed, 0, (size_t)(N16 * B * kGroupBytes));
  for (int64_t n = 0; n < N; ++n) {
    const int64_t g = n / 16, lane = n % 16;
    for (int64_t b = 0; b < B; ++b) {
      uint8_t* dst = packed + (g * B + b) * kGroupBytes;
      const uint8_t* src = q + n * K + b * 32;
      for (int v = 0; v < 4; ++v)
        for (int i = 0; i < 4; ++i)
          dst[v * 64 + lane * 4 + i] = (uint8_t)((src[4 * v + i] & 0x0F)
                                                 | (src[16 + 4 * v + i] & 0x0F) << 4);
      memcpy(dst + 256 + 2 * lane, d + n * B + b, 2);
      memcpy(dst + 288 + 2 * lane, m + n * B + b, 2);
    }
  }
}

// x [M, K] float32 (K a multiple of 32) -> y [M, N] float32 (row stride ldy); bias [N] or NULL.
// Returns 0, or 1 when scratch cannot be allocated.
int rs_q4_linear(const float* x, int64_t M, int64_t K, const uint8_t* packed, const float* bias,
                 int64_t N, float* y, int64_t ldy) {
  const int64_t B = K / 32, N16 = (N + 15) / 16;
  const bool amx = rs_amx_enabled() && M >= kAmxMinRows;
  const int64_t Mp = amx ? (M + 15) / 16 * 16 : M;  // AMX reads whole 16-row tiles
  int8_t* a = (int8_t*)aligned_alloc(64, (size_t)(Mp * 2 * K));
  float* sc = (float*)malloc((size_t)(Mp * B * 2) * sizeof(float));
  if (!a || !sc) {
    free(a);
    free(sc);
    return 1;
  }
  if (Mp > M) {
    memset(a + M * 2 * K, 0, (size_t)((Mp - M) * 2 * K));
    memset(sc + M * B * 2, 0, (size_t)((Mp - M) * B * 2) * sizeof(float));
  }
#pragma omp parallel for schedule(static) if (M >= 16)
  for (int64_t r = 0; r < M; ++r) quantize_row(x + r * K, K, a + r * 2 * K, sc + r * B * 2);
  const int64_t pairs = (N16 + 1) / 2;
  const int chunk = (int)(pairs / 16 > 1 ? pairs / 16 : 1);  // dynamic: see int8_linear.cpp
  int failed = 0;
#pragma omp parallel
  {
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
    uint8_t* tiles = amx ? (uint8_t*)aligned_alloc(64, (size_t)(2 * B * 1024)) : nullptr;
    if (amx && !tiles) {
#pragma omp atomic write
      failed = 1;
    }
    if (tiles) amx_configure();
#endif
#pragma omp for schedule(dynamic, chunk)
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t g0 = 2 * p;
      const int groups = g0 + 1 < N16 ? 2 : 1;
      const uint8_t* w = packed + g0 * B * kGroupBytes;
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
      if (amx) {
        if (!tiles) continue;
        for (int g = 0; g < groups; ++g) unpack_group(w + g * B * kGroupBytes, B,
                                                      tiles + g * B * 1024);
        for (int64_t r0 = 0; r0 < M; r0 += 16)
          for (int g = 0; g < groups; ++g)
            amx_group((int)(M - r0 < 16 ? M - r0 : 16), a + r0 * 2 * K, sc + r0 * B * 2, K,
                      w + g * B * kGroupBytes, tiles + g * B * 1024, bias, y + r0 * ldy, ldy,
                      (g0 + g) * 16, N);
        continue;
      }
#endif
      for (int64_t r0 = 0; r0 < M; r0 += kMaxRows) {
        const int rows = (int)(M - r0 < kMaxRows ? M - r0 : kMaxRows);
        const int8_t* ar = a + r0 * 2 * K;
        const float* sr = sc + r0 * B * 2;
        float* yr = y + r0 * ldy;
        dot_rows(groups, rows, ar, sr, K, w, bias, yr, ldy, g0 * 16, N);
      }
    }
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
    if (tiles) {
      _tile_release();
      free(tiles);
    }
#endif
  }
  free(a);
  free(sc);
  return failed;
}

}  // extern "C"

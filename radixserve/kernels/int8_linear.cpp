// Int8 linear layer: y = x @ W.T (+ bias), the numerics of
// radixserve/layers/int8_linear.py in one call (row quantization, both int8 terms through the
// weights in one pass, the epilogue), bit for bit.
//
// Why by hand: the eager version is ~14 torch ops per linear (121 linears per decode step), and
// oneDNN's int8 GEMM is slow at the one or two rows of a decode step; here each linear is one
// call that streams its weights once.
//
// Numerics (see the Python module for the scheme): per row, s = max(max|x|, 1e-30) / 127,
// t = x / s, hi = round(t), lo = round((t - hi) * 254) (round half to even); int32 sums of hi·w
// and lo·w are exact; then y = (f(hi·w) * ws + f(lo·w) * ws * (1/254)) * s + bias with one
// float rounding per operation, in the same order as the eager ops (no FMA contraction:
// compiled with -ffp-contract=off).
//
// Weight layout ("packed"): [N16][K4][16][4] int8, N16 = ceil(N / 16), K4 = Kp / 4 with K
// padded to Kp = a multiple of 64, zeros in the padding; bytes (lane * 4 + i) of vector (nb, j)
// hold W[nb * 16 + lane][4 * j + i]. That is the operand order of vpdpbusd (one 64-byte load
// feeds 16 outputs with 4 k-steps each, a row's 4 activation bytes broadcast) and, 16 vectors
// at a time, an AMX B tile (16 rows of 4 k-steps x 16 outputs). Both multiply unsigned by
// signed bytes, so activations are stored as q + 128 and 128 * sum_k W[n][k] is subtracted from
// each sum ("comp"). The generic level keeps the same bytes row-major instead, [N16 * 16][Kp]
// (see row_major_block).
//
// The same exact int32 sums on every path, so the same bits at every level: the level's int8
// dot products (simd.h: VNNI, AVX2's maddubs, or plain vector code; a 16-output block is
// 16 / kW vectors) for a few rows (memory bound: the weights stream once), and at the amx level
// AMX tiles (16 rows x 64 k-bytes x 16 outputs per instruction) from kAmxMinRows rows up, where
// VNNI would be compute bound.

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "scratch.h"
#include "simd.h"

namespace {

using namespace simd;

constexpr float kLoScale = 254.0f;
constexpr float kTiny = 1e-30f;
constexpr int kSub = 16 / kW;  // vectors per block of 16 outputs
// Rows per register block: AVX-512 2 terms x 4 rows x 2 blocks = 16 zmm; AVX2 2 x 2 rows x 2
// halves = 8 ymm (4 rows spill: 811 -> 732 ms per 512-row step, bench_linear.py); the
// generic loops keep 4 rows per pass over a weight row.
#if defined(RS_ROW_MAJOR_INT8)
constexpr int kMaxRows = 4;
#else
constexpr int kMaxRows = kW == 16 ? 4 : 2;
#endif
constexpr int kBlocks = kW == 16 ? 2 : 1;  // blocks of 16 outputs per register block
constexpr int64_t kAmxMinRows = 8;  // below this the VNNI path (measured: bench_linear.py)
bool g_amx = false;  // set by rs_init once the kernel may use AMX tiles

// One row of x [K] -> hi and lo bytes (q + 128) [Kp], zero padded (byte 128); returns s.
float quantize_row(const float* x, int64_t K, int64_t Kp, uint8_t* hi, uint8_t* lo) {
  vf vmax = zero();
  int64_t k = 0;
  for (; k + kW <= K; k += kW) vmax = max(vmax, abs(load(x + k)));
  if (k < K) vmax = max(vmax, abs(load_n(x + k, K - k)));
  float amax = reduce_max(vmax);
  float s = (amax > kTiny ? amax : kTiny) / 127.0f;
  const vf vs = set1(s), vlo = set1(kLoScale);
  for (k = 0; k < Kp; k += kW) {
    vf t = div(load_n(x + k, K - k), vs);
    vf h = round(t);
    vf l = round(mul(sub(t, h), vlo));
    store_bytes_n(hi + k, to_int(h), 128, Kp - k);
    store_bytes_n(lo + k, to_int(l), 128, Kp - k);
  }
  return s;
}

// The epilogue for `rows` rows of one block of 16 outputs from int32 sums (row stride 16).
void epilogue16(int rows, const int32_t* acc_hi, const int32_t* acc_lo, const int32_t* comp,
                const float* ws, const float* bias, const float* scales, float* y, int64_t ldy,
                int64_t n, int64_t N) {
  if (n >= N) return;
  const vf inv_lo = set1(1.0f / kLoScale);
  for (int s = 0; s < kSub; ++s) {
    const int64_t ns = n + s * kW;
    if (ns >= N) return;
    vi c = iload(comp + ns);
    vf vw = load(ws + ns);
    vf vb = bias ? load_n(bias + ns, N - ns) : zero();
    for (int r = 0; r < rows; ++r) {
      vf fh = mul(to_float(isub(iload(acc_hi + 16 * r + s * kW), c)), vw);
      vf fl = mul(to_float(isub(iload(acc_lo + 16 * r + s * kW), c)), vw);
      vf v = mul(add(fh, mul(fl, inv_lo)), set1(scales[r]));
      if (bias) v = add(v, vb);
      store_n(y + r * ldy + ns, v, N - ns);
    }
  }
}

#if !defined(RS_ROW_MAJOR_INT8)
// R rows x NB blocks of 16 outputs: int32 sums over all of K, then the epilogue into y.
template <int R, int NB>
void block(const uint8_t* qhi, const uint8_t* qlo, int64_t Kp, const int8_t* w_blocks,
           const int32_t* comp, const float* ws, const float* bias, const float* scales,
           float* y, int64_t ldy, int64_t n0, int64_t N) {
  constexpr int V = NB * kSub;  // weight vectors per k-step
  vi acc_hi[R][V], acc_lo[R][V];
  for (int v = 0; v < V; ++v) {
    const vi start = kDotNeedsComp ? iload(comp + n0 + v * kW) : izero();
    for (int r = 0; r < R; ++r) acc_hi[r][v] = acc_lo[r][v] = start;
  }
  const int64_t K4 = Kp / 4, block_stride = K4 * 64;
  for (int64_t j = 0; j < K4; ++j) {
    vi w[V];
    for (int v = 0; v < V; ++v)
      w[v] = iload(w_blocks + (v / kSub) * block_stride + j * 64 + (v % kSub) * 4 * kW);
    for (int r = 0; r < R; ++r) {
      vi xh = bcast_u8(qhi + r * Kp + 4 * j);
      vi xl = bcast_u8(qlo + r * Kp + 4 * j);
      for (int v = 0; v < V; ++v) {
        acc_hi[r][v] = dot_u8s8(acc_hi[r][v], xh, w[v]);
        acc_lo[r][v] = dot_u8s8(acc_lo[r][v], xl, w[v]);
      }
    }
  }
  alignas(64) int32_t c[2][NB][R][16];
  for (int v = 0; v < V; ++v)
    for (int r = 0; r < R; ++r) {
      istore(&c[0][v / kSub][r][(v % kSub) * kW], acc_hi[r][v]);
      istore(&c[1][v / kSub][r][(v % kSub) * kW], acc_lo[r][v]);
    }
  for (int b = 0; b < NB; ++b)
    epilogue16(R, c[0][b][0], c[1][b][0], comp, ws, bias, scales, y, ldy, n0 + 16 * b, N);
}

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
// 16 rows (hi and lo) x NB blocks of 16 outputs with AMX: tmm0..3 sums (hi/lo x block),
// tmm4/5 the hi/lo activations, tmm6/7 the weights. Sums go to c [2][NB][16][16].
template <int NB>
void amx_block(const uint8_t* qhi, const uint8_t* qlo, int64_t Kp, const int8_t* w_blocks,
               int32_t* c) {
  const int64_t block_stride = Kp / 4 * 64;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k = 0; k < Kp; k += 64) {
    _tile_loadd(4, qhi + k, Kp);
    _tile_loadd(5, qlo + k, Kp);
    _tile_loadd(6, w_blocks + k * 16, 64);
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(2, 5, 6);
    if (NB == 2) {
      _tile_loadd(7, w_blocks + block_stride + k * 16, 64);
      _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(3, 5, 7);
    }
  }
  _tile_stored(0, c, 64);
  _tile_stored(2, c + NB * 256, 64);
  if (NB == 2) {
    _tile_stored(1, c + 256, 64);
    _tile_stored(3, c + 3 * 256, 64);
  }
}
#endif

template <int NB>
void rows_block_nb(int rows, const uint8_t* qhi, const uint8_t* qlo, int64_t Kp, const int8_t* w,
                const int32_t* comp, const float* ws, const float* bias, const float* scales,
                float* y, int64_t ldy, int64_t n0, int64_t N) {
  switch (rows) {
    case 1: block<1, NB>(qhi, qlo, Kp, w, comp, ws, bias, scales, y, ldy, n0, N); break;
    case 2: block<2, NB>(qhi, qlo, Kp, w, comp, ws, bias, scales, y, ldy, n0, N); break;
    case 3: block<3, NB>(qhi, qlo, Kp, w, comp, ws, bias, scales, y, ldy, n0, N); break;
    default: block<4, NB>(qhi, qlo, Kp, w, comp, ws, bias, scales, y, ldy, n0, N); break;
  }
}
#endif

#if defined(RS_ROW_MAJOR_INT8)
// R rows x one block of 16 outputs from row-major weights w [16][Kp]: each weight row read once
// for all R rows, the same exact sums as vpdpbusd's, then the epilogue.
template <int R>
void row_major_block(const uint8_t* qhi, const uint8_t* qlo, int64_t Kp, const int8_t* w,
                     const int32_t* comp, const float* ws, const float* bias,
                     const float* scales, float* y, int64_t ldy, int64_t n0, int64_t N) {
  alignas(64) int32_t c[2][R][16];
  for (int o = 0; o < 16; ++o) {
    const int8_t* wr = w + o * Kp;
    int32_t sh[R] = {}, sl[R] = {};
    for (int64_t k = 0; k < Kp; ++k) {
      const int16_t wk = wr[k];
      for (int r = 0; r < R; ++r) {
        sh[r] += (int16_t)qhi[r * Kp + k] * wk;
        sl[r] += (int16_t)qlo[r * Kp + k] * wk;
      }
    }
    for (int r = 0; r < R; ++r) c[0][r][o] = sh[r], c[1][r][o] = sl[r];
  }
  epilogue16(R, c[0][0], c[1][0], comp, ws, bias, scales, y, ldy, n0, N);
}
#endif

// `nblocks` (1 or 2) blocks of 16 outputs, kBlocks at a time.
void rows_block(int nblocks, int rows, const uint8_t* qhi, const uint8_t* qlo, int64_t Kp,
                const int8_t* w, const int32_t* comp, const float* ws, const float* bias,
                const float* scales, float* y, int64_t ldy, int64_t n0, int64_t N) {
#if defined(RS_ROW_MAJOR_INT8)
  for (int b = 0; b < nblocks; ++b) {
    const int8_t* wb = w + b * 16 * Kp;
    const int64_t nb = n0 + 16 * b;
    switch (rows) {
      case 1: row_major_block<1>(qhi, qlo, Kp, wb, comp, ws, bias, scales, y, ldy, nb, N); break;
      case 2: row_major_block<2>(qhi, qlo, Kp, wb, comp, ws, bias, scales, y, ldy, nb, N); break;
      case 3: row_major_block<3>(qhi, qlo, Kp, wb, comp, ws, bias, scales, y, ldy, nb, N); break;
      default: row_major_block<4>(qhi, qlo, Kp, wb, comp, ws, bias, scales, y, ldy, nb, N);
    }
  }
#else
  if (kBlocks == 2 && nblocks == 2) {
    rows_block_nb<2>(rows, qhi, qlo, Kp, w, comp, ws, bias, scales, y, ldy, n0, N);
    return;
  }
  for (int b = 0; b < nblocks; ++b)
    rows_block_nb<1>(rows, qhi, qlo, Kp, w + b * (Kp / 4) * 64, comp, ws, bias, scales, y, ldy,
                     n0 + 16 * b, N);
#endif
}

}  // namespace

bool rs_amx_enabled() { return g_amx; }

extern "C" {

// Returns the version of this file's interface; the loader checks it.
int rs_abi_version() { return 20; }

// The instruction-set level this library was built for (simd.h).
const char* rs_level() { return simd::kLevel; }

#ifndef RS_SOURCE_HASH
#define RS_SOURCE_HASH "unknown"
#endif
// The hash of the sources it was built from (levels.source_hash), so a stale build is noticed.
const char* rs_source_hash() { return RS_SOURCE_HASH; }

// Asks the kernel for AMX tile state (Linux grants it per process); returns 1 if AMX is used.
int rs_init(int want_amx) {
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
  const long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  g_amx = want_amx && syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  (void)want_amx;
  g_amx = false;
#endif
  return g_amx ? 1 : 0;
}

// W [N, K] int8 row-major -> packed [N16][K4][16][4] (zeroed padding) and comp[N16 * 16].
void rs_int8_pack(const int8_t* W, int64_t N, int64_t K, int8_t* packed, int32_t* comp) {
  const int64_t N16 = (N + 15) / 16, K4 = (K + 63) / 64 * 16;
  memset(packed, 0, (size_t)(N16 * K4 * 64));
  memset(comp, 0, (size_t)(N16 * 16) * sizeof(int32_t));
  for (int64_t n = 0; n < N; ++n) {
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      int8_t v = W[n * K + k];
      sum += v;
#if defined(RS_ROW_MAJOR_INT8)
      packed[n * K4 * 4 + k] = v;  // [N16 * 16][Kp]: the same size
#else
      packed[((n / 16) * K4 + k / 4) * 64 + (n % 16) * 4 + k % 4] = v;
#endif
    }
    comp[n] = 128 * sum;
  }
}

// x [M, K] float32 row-major -> y [M, N] float32 (row stride ldy). ws [N16 * 16] (padded),
// bias [N] or NULL. Scratch is allocated here (2 * M16 * Kp bytes + M floats). Returns 0, or 1
// when the scratch cannot be allocated.
int rs_int8_linear(const float* x, int64_t M, int64_t K, const int8_t* packed,
                   const int32_t* comp, const float* ws, const float* bias, int64_t N,
                   float* y, int64_t ldy) {
  const int64_t Kp = (K + 63) / 64 * 64, N16 = (N + 15) / 16, K4 = Kp / 4;
  const bool amx = g_amx && M >= kAmxMinRows;
  const int64_t Mp = amx ? (M + 15) / 16 * 16 : M;  // AMX reads whole 16-row tiles
  uint8_t* q = (uint8_t*)scratch::get(scratch::kInt8Activations, (size_t)(2 * Mp * Kp));
  float* scales = (float*)scratch::get(scratch::kInt8Scales, (size_t)M * sizeof(float));
  if (!q || !scales) return 1;
  uint8_t* qhi = q;
  uint8_t* qlo = q + Mp * Kp;
  if (Mp > M) memset(qhi + M * Kp, 128, (size_t)((Mp - M) * Kp));
  if (Mp > M) memset(qlo + M * Kp, 128, (size_t)((Mp - M) * Kp));
#pragma omp parallel for schedule(static) if (M >= 16)
  for (int64_t r = 0; r < M; ++r)
    scales[r] = quantize_row(x + r * K, K, Kp, qhi + r * Kp, qlo + r * Kp);
  const int64_t pairs = (N16 + 1) / 2;
  // Dynamic chunks: a thread that loses its core for a while (the grammar-mask thread, the API
  // process) does not hold the others up at the end of the loop. Which thread computes an
  // output never changes its value.
  const int chunk = (int)(pairs / 16 > 1 ? pairs / 16 : 1);
#pragma omp parallel
  {
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
    alignas(64) int32_t c[2 * 2 * 256];
    if (amx) amx_configure();
#endif
#pragma omp for schedule(dynamic, chunk)
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t nb = 2 * p;
      const int nblocks = nb + 1 < N16 ? 2 : 1;
      const int8_t* w = packed + nb * K4 * 64;
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
      if (amx) {
        for (int64_t r0 = 0; r0 < M; r0 += 16) {
          int rows = (int)(M - r0 < 16 ? M - r0 : 16);
          const uint8_t* h = qhi + r0 * Kp;
          const uint8_t* l = qlo + r0 * Kp;
          if (nblocks == 2) amx_block<2>(h, l, Kp, w, c);
          else amx_block<1>(h, l, Kp, w, c);
          for (int b = 0; b < nblocks; ++b)
            epilogue16(rows, c + b * 256, c + (nblocks + b) * 256, comp, ws, bias, scales + r0,
                       y + r0 * ldy, ldy, (nb + b) * 16, N);
        }
        continue;
      }
#endif
      for (int64_t r0 = 0; r0 < M; r0 += kMaxRows) {
        int rows = (int)(M - r0 < kMaxRows ? M - r0 : kMaxRows);
        const uint8_t* h = qhi + r0 * Kp;
        const uint8_t* l = qlo + r0 * Kp;
        float* yr = y + r0 * ldy;
        rows_block(nblocks, rows, h, l, Kp, w, comp, ws, bias, scales + r0, yr, ldy, nb * 16, N);
      }
    }
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
    if (amx) _tile_release();
#endif
  }
  return 0;
}

}  // extern "C"

// 16-bit linear parts: y = x @ W.T (+ bias) with W kept as the checkpoint's F16 or BF16 values
// (GGUF's F16 / BF16 matrices, a safetensors folder's float16 / bfloat16 weights) and x, y in
// float32. The weights are widened to float32 in registers (F16C's cvtph, bf16 by a 16-bit
// shift), exactly, and never held in float32 beyond one work item's strip.
//
// Numerics: per output, one float32 accumulator over k = 0, 1, ..., K-1 in that order,
//     acc = fma(x[k], w[k], acc)          (acc starts at 0; generic level: a multiply, an add)
// then y = acc (+ bias). Nothing else touches the sum, so a row's output is bit-identical alone
// or in any batch, in any chunk and on either path below (register widening or the item's
// widened strip: the same exact float32 weights), and agrees bit for bit between the avx2,
// avx512 and amx levels (the same fused operations in the same order). No activation is
// rounded: the products are float32 x float32 (AVX512_BF16's vdpbf16ps would round x to bf16,
// so it is not used).
//
// Packed layout: [N16][K][16] 16-bit elements, N16 = ceil(N / 16) groups of 16 outputs;
// element (g, k, lane) is W[16g + lane][k] as stored (no conversion, the file's bits), padding
// outputs zero. One vector load at k gives a vector's outputs' weights; any K works (no blocks).
//
// Tiling: a work item is up to kHalfGroups groups x kHalfRows rows (block_linear.cpp hands
// them to threads). One row (decode) runs every output vector of the item at once, so kOneVecs
// independent FMA chains hide the FMA latency and the weights stream once (bandwidth bound);
// more rows run kTileRows x kTileVecs register blocks over the strip, and from kHalfWidenRows
// rows the strip is widened once into per-thread scratch (compute bound, no conversion in the
// inner loop: a packed-B float GEMM micro-kernel).

#include "half_linear.h"

#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace {

// The vocabulary, per level: hv holds kL floats. simd.h's generic vf is 8 floats, two SSE2 or
// NEON registers, which GCC keeps in memory across a loop; the generic level here uses native
// 4-float vectors instead.
#if defined(__AVX512F__)
constexpr int kL = 16;
using hv = __m512;
constexpr int kOneVecs = 4, kTileRows = 6, kTileVecs = 4;  // 32 registers
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n > 0 ? n : 0)) - 1);
}
inline hv hzero() { return _mm512_setzero_ps(); }
inline hv bcast(float x) { return _mm512_set1_ps(x); }
inline hv hload(const float* p) { return _mm512_loadu_ps(p); }
inline void hstore(float* p, hv v) { _mm512_storeu_ps(p, v); }
inline hv hfma(hv a, hv b, hv c) { return _mm512_fmadd_ps(a, b, c); }
inline void hstore_cols(hv acc, const float* bias, float* y, int64_t n) {  // n lanes
  const __mmask16 m = first_lanes(n);
  if (bias) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, bias));
  _mm512_mask_storeu_ps(y, m, acc);
}
inline hv widen_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}
inline hv widen_bf16(const uint16_t* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
constexpr bool kBf16Pairs = false;
inline void widen_bf16_pairs(const uint16_t*, hv&, hv&) {}
inline void interleave(hv, hv, hv&, hv&) {}
#elif defined(__AVX2__)
constexpr int kL = 8;
using hv = __m256;
constexpr int kOneVecs = 8, kTileRows = 6, kTileVecs = 2;  // 16 registers
inline hv hzero() { return _mm256_setzero_ps(); }
inline hv bcast(float x) { return _mm256_set1_ps(x); }
inline hv hload(const float* p) { return _mm256_loadu_ps(p); }
inline void hstore(float* p, hv v) { _mm256_storeu_ps(p, v); }
inline hv hfma(hv a, hv b, hv c) { return _mm256_fmadd_ps(a, b, c); }
inline void hstore_cols(hv acc, const float* bias, float* y, int64_t n) {
  const int c = n >= 8 ? 8 : (int)n;
  const __m256i m =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  if (bias) acc = _mm256_add_ps(acc, _mm256_maskload_ps(bias, m));
  _mm256_maskstore_ps(y, m, acc);
}
inline hv widen_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}
inline hv widen_bf16(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
// 2 kL bf16 weights in one load, without shuffles: `even` holds elements 0, 2, ..., `odd`
// 1, 3, ...; `interleave` puts two such accumulators back in element order.
constexpr bool kBf16Pairs = true;
inline void widen_bf16_pairs(const uint16_t* p, hv& even, hv& odd) {
  const __m256i w = _mm256_loadu_si256((const __m256i*)p);
  even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xFFFF0000u)));
}
inline void interleave(hv even, hv odd, hv& first, hv& second) {
  const hv lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
  first = _mm256_permute2f128_ps(lo, hi, 0x20);
  second = _mm256_permute2f128_ps(lo, hi, 0x31);
}
#else
// Portable vector arithmetic (SSE2 on x86-64, NEON on aarch64); the widenings are integer bit
// moves (f16 on aarch64: NEON's fcvtl), exact and independent of the float unit's denormal
// mode. No FMA: -ffp-contract=off keeps a multiply and an add.
constexpr int kL = 4;
typedef float hv __attribute__((vector_size(16)));
typedef uint32_t hu __attribute__((vector_size(16)));
typedef int32_t hs __attribute__((vector_size(16)));
typedef uint16_t hh __attribute__((vector_size(8)));
#if defined(__aarch64__)
constexpr int kOneVecs = 8, kTileRows = 4, kTileVecs = 4;  // 32 registers
#else
constexpr int kOneVecs = 8, kTileRows = 2, kTileVecs = 4;  // 16 registers
#endif
inline hv hzero() { return hv{}; }
inline hv bcast(float x) { return hv{x, x, x, x}; }
inline hv hload(const float* p) {
  hv v;
  memcpy(&v, p, sizeof v);
  return v;
}
inline void hstore(float* p, hv v) { memcpy(p, &v, sizeof v); }
inline hv hfma(hv a, hv b, hv c) { return a * b + c; }
inline void hstore_cols(hv acc, const float* bias, float* y, int64_t n) {
  for (int i = 0; i < kL && i < n; ++i) y[i] = bias ? acc[i] + bias[i] : acc[i];
}
inline hv as_float(hu u) {
  hv f;
  memcpy(&f, &u, sizeof f);
  return f;
}
inline hu as_bits(hv f) {
  hu u;
  memcpy(&u, &f, sizeof u);
  return u;
}
inline hu widen_u16(const uint16_t* p) {
  hh h;
  memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, hu);
}
inline hv widen_bf16(const uint16_t* p) { return as_float(widen_u16(p) << 16); }
#if defined(__aarch64__)
// NEON's fcvtl (base Armv8-A): one instruction for four, exact for every half, subnormals
// included (Arm's conversions do not flush half inputs; tests/models/test_other_arch_levels.py
// checks every subnormal)
inline hv widen_f16(const uint16_t* p) {
  const float32x4_t f = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
  hv v;
  memcpy(&v, &f, sizeof v);
  return v;
}
#else
inline hv widen_f16(const uint16_t* p) {
  const hu h = widen_u16(p), sign = (h & 0x8000u) << 16, exp = h & 0x7C00u, man = h & 0x3FFu;
  const hu normal = ((h & 0x7FFFu) << 13) + ((127u - 15u) << 23);  // rebias the exponent
  const hu special = 0x7F800000u | man << 13;  // inf, NaN
  // zero and subnormals: man * 2^-24, exact in float32 (a small integer times a power of 2)
  const hu tiny = as_bits(__builtin_convertvector((hs)man, hv) * 5.9604644775390625e-8f);
  const hu bits = exp == 0 ? tiny : exp == 0x7C00u ? special : normal;
  return as_float(sign | bits);
}
#endif
constexpr bool kBf16Pairs = true;
inline void widen_bf16_pairs(const uint16_t* p, hv& even, hv& odd) {
  hu w;
  memcpy(&w, p, sizeof w);
  even = as_float(w << 16);
  odd = as_float(w & 0xFFFF0000u);
}
inline void interleave(hv even, hv odd, hv& first, hv& second) {
  first = __builtin_shufflevector(even, odd, 0, 4, 1, 5);
  second = __builtin_shufflevector(even, odd, 2, 6, 3, 7);
}
#endif

constexpr int kSub = 16 / kL;  // vectors per group of 16 outputs
static_assert(kOneVecs % kSub == 0 && kTileVecs % kSub == 0, "tiles are whole groups");
enum Kind { kFloat, kF16, kBF16 };

template <int Kd>
inline hv wload(const void* w, int64_t i) {  // kL weights from element i
  if constexpr (Kd == kFloat) return hload((const float*)w + i);
  else if constexpr (Kd == kF16) return widen_f16((const uint16_t*)w + i);
  else return widen_bf16((const uint16_t*)w + i);
}

template <int Kd>
inline const void* advance(const void* w, int64_t i) {
  return Kd == kFloat ? (const void*)((const float*)w + i)
                      : (const void*)((const uint16_t*)w + i);
}

inline void store_cols(hv acc, const float* bias, float* y, int64_t n, int64_t N) {
  if (n < N) hstore_cols(acc, bias ? bias + n : nullptr, y + n, N - n);
}

// R rows x V vectors (V / kSub whole groups from w, group stride gs elements) over all of K.
// Below AVX-512, bf16 weights load two vectors' worth at once (widen_bf16_pairs): such a pair of
// accumulators then holds even and odd outputs, put back in order at the store; each output's
// sum is the same either way.
template <int Kd, int R, int V>
void tile(const float* x, int64_t K, const void* w, int64_t gs, const float* bias, float* y,
          int64_t ldy, int64_t n0, int64_t N) {
  constexpr bool kPairs = Kd == kBF16 && kBf16Pairs;
  hv acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = hzero();
  for (int64_t k = 0; k < K; ++k) {
    hv wv[V];
    if constexpr (kPairs) {
      for (int v = 0; v < V; v += 2)
        widen_bf16_pairs((const uint16_t*)w + (v / kSub) * gs + 16 * k + (v % kSub) * kL,
                         wv[v], wv[v + 1]);
    } else {
      for (int v = 0; v < V; ++v)
        wv[v] = wload<Kd>(w, (v / kSub) * gs + 16 * k + (v % kSub) * kL);
    }
    for (int r = 0; r < R; ++r) {  // one broadcast live at a time: R x V + V + 1 registers
      const hv xr = bcast(x[r * K + k]);
      for (int v = 0; v < V; ++v) acc[r][v] = hfma(xr, wv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    if constexpr (kPairs) {
      for (int v = 0; v < V; v += 2) interleave(acc[r][v], acc[r][v + 1], acc[r][v], acc[r][v + 1]);
    }
    for (int v = 0; v < V; ++v)
      store_cols(acc[r][v], bias, y + r * ldy, n0 + 16 * (v / kSub) + (v % kSub) * kL, N);
  }
}

// tile<Kd, nr, nv> for 1 <= nr <= RMax, nv <= VMax a multiple of kSub (whole groups).
template <int Kd, int R, int VMax>
void tile_v(int nv, const float* x, int64_t K, const void* w, int64_t gs, const float* bias,
            float* y, int64_t ldy, int64_t n0, int64_t N) {
  if constexpr (VMax > 0) {
    if (nv == VMax) return tile<Kd, R, VMax>(x, K, w, gs, bias, y, ldy, n0, N);
    tile_v<Kd, R, VMax - kSub>(nv, x, K, w, gs, bias, y, ldy, n0, N);
  }
}

template <int Kd, int RMax, int VMax>
void tile_rv(int nr, int nv, const float* x, int64_t K, const void* w, int64_t gs,
             const float* bias, float* y, int64_t ldy, int64_t n0, int64_t N) {
  if constexpr (RMax > 0) {
    if (nr == RMax) return tile_v<Kd, RMax, VMax>(nv, x, K, w, gs, bias, y, ldy, n0, N);
    tile_rv<Kd, RMax - 1, VMax>(nr, nv, x, K, w, gs, bias, y, ldy, n0, N);
  }
}

template <int Kd>
void item(int groups, int64_t M, const float* x, int64_t K, const void* w, const float* bias,
          float* y, int64_t ldy, int64_t n0, int64_t N) {
  const int nvec = groups * kSub;
  const int64_t gs = 16 * K;
  if (M == 1) {
    for (int v0 = 0; v0 < nvec; v0 += kOneVecs)
      tile_rv<Kd, 1, kOneVecs>(1, nvec - v0 < kOneVecs ? nvec - v0 : kOneVecs, x, K,
                               advance<Kd>(w, v0 / kSub * gs), gs, bias, y, ldy,
                               n0 + 16 * (v0 / kSub), N);
    return;
  }
  for (int64_t r0 = 0; r0 < M; r0 += kTileRows) {
    const int nr = (int)(M - r0 < kTileRows ? M - r0 : kTileRows);
    for (int v0 = 0; v0 < nvec; v0 += kTileVecs)
      tile_rv<Kd, kTileRows, kTileVecs>(nr, nvec - v0 < kTileVecs ? nvec - v0 : kTileVecs,
                                        x + r0 * K, K, advance<Kd>(w, v0 / kSub * gs), gs,
                                        bias, y + r0 * ldy, ldy, n0 + 16 * (v0 / kSub), N);
  }
}

template <int Kd>
void widen_strip(int groups, int64_t K, const uint16_t* w, float* out) {
  const int64_t n = (int64_t)groups * 16 * K;
  for (int64_t i = 0; i < n; i += kL) hstore(out + i, wload<Kd>(w, i));
}

}  // namespace

void half_linear_item(bool bf16, int groups, int64_t M, const float* x, int64_t K,
                      const uint16_t* w, float* scratch, const float* bias, float* y,
                      int64_t ldy, int64_t n0, int64_t N) {
  if (scratch && M >= kHalfWidenRows) {
    if (bf16) widen_strip<kBF16>(groups, K, w, scratch);
    else widen_strip<kF16>(groups, K, w, scratch);
    return item<kFloat>(groups, M, x, K, scratch, bias, y, ldy, n0, N);
  }
  if (bf16) item<kBF16>(groups, M, x, K, w, bias, y, ldy, n0, N);
  else item<kF16>(groups, M, x, K, w, bias, y, ldy, n0, N);
}

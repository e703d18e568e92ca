// Block-quantized linear layer: y = x @ W.T (+ bias) straight from GGUF's quantized blocks,
// every type the loader accepts (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), so a model
// takes the memory of its file and its weights are exactly the file's. A layer's parts may
// also be F16 / BF16 matrices: those run on float32 activations in half_linear.cpp (its own
// layout and numerics), beside the block parts in the same call.
//
// Why by hand: no library multiplies GGUF's blocks, and batch-1 decode is memory bound: the
// kernel must read the stored bits once, not a float or int8 copy of them.
//
// Weights. Every format is, per sub-block of 32 weights (16 for Q6_K), W = d * q + m with an
// unsigned code q of 4, 5, 6 or 8 bits (models/gguf_quant.py splits each file type into this
// form losslessly: Q4_0 is q - 8, so m = -8d; Q8_0 is q + 128 with m = -128d, multiplied as
// the file's signed bytes, simd.h dot_s8, where m is 0 below AVX-512; a K-quant's d is
// its super-block's f16 d times the sub-block's 6-bit scale, m = -dmin * min, Q6_K's m = -32d).
// d and m are formed in float from the stored fields, exactly (an f16 times a small integer).
//
// Activations are quantized per row and block of 32, as llama.cpp's Q8_1: s = max(max|x|,
// 1e-30) / 127, hi = round(x / s) in -127..127, S = s * sum hi over each sub-block. (A second,
// 4-bit term per block, as the int8 linear has, brought the embedded model's KL to the float
// model on the same weights from 0.0039 to 2e-5 but cost 1.4-1.8x the batched and prefill
// time at avx2, 1.3-1.45x at avx512, bench_linear.py; one term is llama.cpp's fidelity.) Per
// sub-block the integer sum C = 16 * sum q*hi is exact (|C| < 2^24 for 8-bit codes; the 16 is
// the AMX path's, whose weight tiles hold 16q), then, sub-block after sub-block in order, one
// rounding per operation:
//     v = float(C) * (s / 16)
//     acc = d * v + acc                           (FMA)
//     acc = m * S + acc                           (FMA)
// and y = acc (+ bias). Every path (the level's dot products for a few rows; AMX tiles for more
// rows at the amx level, 4-bit legacy formats only) computes the same exact C and then these
// operations in this order, so a row's output is bit-identical alone, in any batch, on either
// path. (Without FMA, on the generic level, each FMA is two roundings.)
//
// K-quants (Q4_K, Q5_K, Q6_K) fold their sub-block scales (small integers) into exact integer
// sums over a super-block of 256, so the activations' steps there must be powers of two of
// one step: per row and super-block s = max(max|x|, 1e-30) / 127 (llama.cpp's Q8_K), and per
// block of 32 the step s / 2^e, e the largest of 0..3 with max|x over the block| * 2^e <=
// max|x over the super-block|; hi = round(x / (s / 2^e)) in -127..127, sh = 3 - e. With the
// block's C = sum q*hi and h = sum hi (h0, h1: its halves'),
//     Q4_K / Q5_K:  I = sum over blocks of (sc * C) << sh,   Mi = sum of mn * (h << sh)
//     Q6_K:         I = sum over blocks of (sc0 * (C0 - 32 h0) + sc1 * (C1 - 32 h1)) << sh
// all exact in int32 (|I| <= 8 * 8 * 63 * 32 * 31 * 127 < 2^29 for Q5_K, < 2^30 for Q6_K;
// h << sh within int16 for the mins' vpdpwssd), then per super-block, in order,
//     acc = float(I) * (D * (s / 8)) + acc         (the product one rounding, then an FMA)
//     acc = float(Mi) * (-Dmin * (s / 8)) + acc    (Q4_K / Q5_K)
// One float step per 256 weights instead of three per 32: the fused multiply-adds share the
// execution ports of the integer dot products (AMD Zen 5: each costs one vpdpbusd), and made
// the legacy epilogue a quarter of the work. Every path (packed or decoded weights, any row
// count) computes the same integers and these steps, so rows stay batch invariant.
// Measured (bench_gemv.py-shaped 3B matrices, AMD EPYC Zen 5, 2 threads, rows 16 / 64 / 256,
// GMAC/s, per-32 float epilogue before -> now): AVX-512 Q4_K 611 -> 622, 616 -> 657, 623 ->
// 654; Q6_K 400 -> 419, 425 -> 552, 470 -> 591; AVX2 Q4_K 197 -> 225, 214 -> 228, 232 -> 234;
// Q6_K 135 -> 147, 153 -> 172, 161 -> 167. Fidelity (benchmarks/fidelity.py, Gemma 3 270M
// Q4_K_M, KL to the float model over llama-server's top 10): per-32 steps 0.00153, these
// 0.00178, one step per 256 alone (e = 0) 0.00328, llama-server 0.00365. One step per 256
// is 8-12 % faster again at AVX-512 (no shift) but doubles the KL: left out.
//
// Packed layout, per format: [N16][units][unit bytes], N16 = ceil(N / 16) groups of 16 outputs,
// a unit = U blocks of 32 k (U = 1 for the legacy formats, 8 = one super-block of 256 for the
// K-quants). A unit is
//     [U][256]  the low nibbles of the codes: vector v = 0..3 of a block, byte (lane * 4 + i)
//               holds q[16g + lane][32b + 4v + i] in its low nibble and q[..][32b + 16 + 4v + i]
//               in its high nibble (vpdpbusd's operand order: 16 outputs x 4 k-steps)
//     [U][P]    the codes' high bits, the same byte addressing: 5-bit (P = 64): bit 2v + h of
//               the byte is bit 4 of the code of vector v, half h; 6-bit (P = 128): two 64-byte
//               vectors, vector v / 2 holding bits 4-5 at bit 2 * (2 * (v % 2) + h).
//               Q8_0 instead holds whole signed bytes (q - 128, the file's int8): the first 256
//               bytes the block's first 16 k, the next 256 (P) its second 16
//     [U][S]    per-block fields, 16 outputs each: legacy d (f16) [and m (f16)]; Q4_K/Q5_K the
//               6-bit scale and min (bytes); Q6_K the two sub-blocks' int8 scales
//     [T]       per-unit fields: Q4_K/Q5_K d and dmin (f16 x 16 each), Q6_K d (f16 x 16)
// Padding outputs have zero codes and scales.
//
// Activations ("a"): [M][B][64] signed bytes, a block's 32 hi then 32 zeros (one AMX A-tile row,
// against the tile rows of q); per row and block four floats: s / 16, S, and S of the first and
// second 16 (K-quants: KAct, the same 16 bytes).

#include <omp.h>
#include <stdint.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "half_linear.h"
#include "scratch.h"
#include "simd.h"
#include "tile_linear.h"

namespace {

using namespace simd;

constexpr float kTiny = 1e-30f;
constexpr int64_t kAmxMinRows = 32;  // below this VNNI is as fast (bench_linear.py)
constexpr int kSub = 16 / kW;        // vectors per group of 16 outputs
constexpr int kGroups = kW == 16 ? 2 : 1;  // groups per register block
constexpr int kActFloats = 4;
// A block part's rows are taken in chunks whose 8-bit activations (64 bytes a block a row) are
// about this many bytes (a core's L2), chunk after chunk, each chunk's groups handed out in
// turn. All M rows per group streamed the activations from L3 once per group: bench_gemv.py,
// AMD EPYC Zen 5 (1 MB L2), 2 threads, 2048 rows, GMAC/s unchunked -> chunked: AVX-512 Q4_K
// 447 -> 559, Q6_K 416 -> 496, Q4_0 436 -> 544, Q8_0 506 -> 493; AVX2 Q4_K 198 -> 219, Q6_K
// 151 -> 163, Q4_0 185 -> 203, Q8_0 134 -> 146 (256 rows ran 646 unchunked). A row's result
// does not depend on its chunk: each row's sums are its own, as in any batch.
#ifndef RS_ACT_CHUNK_BYTES
#define RS_ACT_CHUNK_BYTES (1 << 20)
#endif
constexpr int64_t kActChunkBytes = RS_ACT_CHUNK_BYTES;
#ifndef RS_PREFETCH
#define RS_PREFETCH 4096
#endif
constexpr int64_t kPrefetch = RS_PREFETCH;  // bytes ahead a single row's GEMV prefetches
// (Fmt::kAhead: Q6_K twice as far, a unit of it being 1.5 times a Q4_K unit: the 3B shape's
// batch-1 decode, AMD EPYC Zen 4, avx512, 2 threads, the libraries rotated in one process, 48
// steps, medians of 8 and of 16: 16.8 -> 17.6, 17.0 -> 17.9 tok/s; bench_gemv.py-shaped Q6_K
// matrices, 1 row, 31-32 -> 32-34 GB/s against a probed 31-35, in the host's faster minutes
// 37 -> 46 of 48. AVX2's Q6_K measured even so, Q4_K 2-3 % slower.)

// The formats, by the ids the Python side uses (layers/block_linear.py: FORMATS).
// kF16 and kBF16 are 16-bit parts (half_linear.cpp: their own layout, float32 activations);
// the ids from kFirstTileFormat on are the types tile_linear.cpp decodes to int8 tiles.
enum Format : int64_t { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kQ4_K, kQ5_K, kQ6_K, kF16, kBF16,
                        kNumFormats = kEndTileFormat };
static_assert(kBF16 + 1 == kFirstTileFormat, "the tile formats follow the 16-bit ones");

inline bool is_half(int64_t f) { return f == kF16 || f == kBF16; }
inline bool is_kquant(int64_t f) { return f == kQ4_K || f == kQ5_K || f == kQ6_K; }

// Compile-time description of a format (see the header's layout).
template <int64_t F>
struct Fmt {
  static constexpr bool kSuper = F == kQ4_K || F == kQ5_K || F == kQ6_K;
  static constexpr int U = kSuper ? 8 : 1;
  static constexpr int kBits = F == kQ8_0 ? 8 : F == kQ6_K ? 6
                               : (F == kQ5_0 || F == kQ5_1 || F == kQ5_K) ? 5 : 4;
  static constexpr int P = kBits == 4 ? 0 : kBits == 5 ? 64 : kBits == 6 ? 128 : 256;
  static constexpr int S = (F == kQ4_1 || F == kQ5_1) ? 64 : 32;
  static constexpr int T = F == kQ6_K ? 32 : kSuper ? 64 : 0;
  static constexpr int64_t kUnitBytes = U * (256 + P + S) + T;
  static constexpr int64_t kAhead = F == kQ6_K ? 2 * kPrefetch : kPrefetch;  // (kPrefetch)
  static constexpr bool kHalves = F == kQ6_K;  // two sub-blocks of 16 per block
  static constexpr bool kBytes = kBits == 8;  // whole signed bytes (simd.h dot_s8)
  // rows per register block: 16 registers below AVX-512 hold 2, or 4 with VNNI's one
  // instruction a product and one sum a block (NH in dot_kquant) but not Q6_K's halves
  // (bench_gemv.py, AMD EPYC Zen 5, 2 threads, avxvnni, paired: 4 rows against 2 at 16 / 64
  // rows Q4_K 237 / 239 vs 206 / 213 GMAC/s, Q5_K 223 / 255 vs 183 / 213, Q4_0 257 / 256 vs
  // 212 / 232; Q6_K 147 vs 167 at 16: slower)
  // Below VNNI, 4-bit codes sum in int16 pairs (kPairSums) and hold 4 rows too (bench_gemv-
  // shaped 3B matrices, AMD EPYC Zen 5, 2 threads, avx2, paired: Q4_K 16 / 128 rows 195 / 224
  // GMAC/s at 2 rows, 214 / 262 at 4, 203 / 251 at 3).
  static constexpr int kRows = kW == 16 || (kVnni && !kHalves) || (kPairSums && kBits == 4)
                                   ? 4 : 2;
};

int64_t unit_bytes(int64_t f) {
  switch (f) {
    case kQ4_0: return Fmt<kQ4_0>::kUnitBytes;
    case kQ4_1: return Fmt<kQ4_1>::kUnitBytes;
    case kQ5_0: return Fmt<kQ5_0>::kUnitBytes;
    case kQ5_1: return Fmt<kQ5_1>::kUnitBytes;
    case kQ8_0: return Fmt<kQ8_0>::kUnitBytes;
    case kQ4_K: return Fmt<kQ4_K>::kUnitBytes;
    case kQ5_K: return Fmt<kQ5_K>::kUnitBytes;
    case kQ6_K: return Fmt<kQ6_K>::kUnitBytes;
  }
  return 0;
}

int64_t unit_blocks(int64_t f) { return f >= kQ4_K ? 8 : 1; }

// One row of x [K] (K a multiple of 32) -> its activation bytes a [B][64] and floats sc [B][4].
// One block of 32 x at step s -> its bytes a [64] (hi = round(x / s), then 32 zeros) and the
// sums of hi over its first and second 16 (small integers: exact in any order).
inline void round_block(const float* x, float s, int8_t* a, float& h0, float& h1) {
  const vf vs = set1(s);
  vf hsum[2] = {zero(), zero()};
  for (int i = 0; i < 32; i += kW) {
    vf h = round(div(load(x + i), vs));
    hsum[i / 16] = add(hsum[i / 16], h);
    store_bytes(a + i, to_int(h), 0);
  }
  memset(a + 32, 0, 32);
  h0 = reduce_add(hsum[0]);
  h1 = reduce_add(hsum[1]);
}

void quantize_row(const float* x, int64_t K, int8_t* a, float* sc) {
  for (int64_t b = 0; b < K / 32; ++b) {
    vf vmax = zero();
    for (int i = 0; i < 32; i += kW) vmax = max(vmax, abs(load(x + 32 * b + i)));
    float amax = reduce_max(vmax);
    float s = (amax > kTiny ? amax : kTiny) / 127.0f;
    float h0, h1;
    round_block(x + 32 * b, s, a + 64 * b, h0, h1);
    float* f = sc + kActFloats * b;
    f[0] = s * (1.0f / 16.0f);
    f[1] = s * (h0 + h1);
    f[2] = s * h0;
    f[3] = s * h1;
  }
}

inline vf load_half(const uint8_t* p) { return load_f16((const uint16_t*)p); }

// A legacy block's multipliers d and offsets m for the kW outputs at `lane0` of a group:
// block j of the unit at `u` (d[1], m[1] unused: one sub-block). K-quants: dot_kquant.
template <int64_t F>
inline void block_scales(const uint8_t* u, int j, int lane0, vf d[2], vf m[2]) {
  using Q = Fmt<F>;
  static_assert(!Q::kSuper, "K-quants fold their scales in integers (dot_kquant)");
  const uint8_t* s = u + Q::U * (256 + Q::P) + j * Q::S;
  if constexpr (F == kQ4_1 || F == kQ5_1) {
    d[0] = load_half(s + 2 * lane0);
    m[0] = load_half(s + 32 + 2 * lane0);
  } else {
    d[0] = load_half(s + 2 * lane0);
    m[0] = mul(d[0], set1(F == kQ4_0 ? -8.0f : F == kQ5_0 ? -16.0f : -(float)kQ8Offset));
  }
}

// The codes of vector k (0..3) of block j for the kW outputs at byte offset `off` of a group:
// q0 for the block's first 16 k (4 k-steps), q1 for its second 16 (Q8_0: signed bytes).
template <int64_t F>
inline void block_codes(const uint8_t* u, int j, int k, int off, vi& q0, vi& q1) {
  using Q = Fmt<F>;
  vi raw = iload(u + j * 256 + k * 64 + off);
  const uint8_t* hb = u + Q::U * 256 + j * Q::P;
  if constexpr (Q::kBytes) {
    q0 = raw;
    q1 = iload(hb + k * 64 + off);
    return;
  }
  q0 = low_nibbles(raw);
  q1 = high_nibbles(raw);
  if constexpr (Q::kBits == 5) {
    vi h = iload(hb + off);
    q0 = ior(q0, code_high_bits(h, 2 * k, 1));
    q1 = ior(q1, code_high_bits(h, 2 * k + 1, 1));
  } else if constexpr (Q::kBits == 6) {
    vi h = iload(hb + (k / 2) * 64 + off);
    q0 = ior(q0, code_high_bits(h, 4 * (k % 2), 3));
    q1 = ior(q1, code_high_bits(h, 4 * (k % 2) + 2, 3));
  }
}

inline vf sub_block(vf acc, vi C, vf d, vf m, float s16, float S) {
  vf v = mul(to_float(C), set1(s16));
  acc = fmadd(d, v, acc);
  return fmadd(m, set1(S), acc);
}

inline void store_out(vf acc, const float* bias, float* y, int64_t n, int64_t N) {
  if (n >= N) return;
  if (bias) acc = add(acc, load_n(bias + n, N - n));
  store_n(y + n, acc, N - n);
}

// ---- K-quants: integer sums over a super-block, one float step per super-block ------------
// (the header's "K-quants" paragraph). Activations per row and block of 32: the super-block's
// step and the block's shift and sums of hi (KAct, the same 16 bytes a block as the legacy
// floats).
struct KAct {
  float s;         // the super-block's s / 8: hi * 2^sh * s is the block's value
  int16_t h0, h1;  // the sums of hi over the block's first 16 and second 16
  int32_t sh;      // 0..3
  int32_t hp;      // in an even block: its and the next block's 2^sh * sum hi as int16 pairs
};
static_assert(sizeof(KAct) == kActFloats * sizeof(float), "a row's KAct and floats align");

// One row of x [K] (K a multiple of 256) -> its activation bytes a [B][64] (as quantize_row's)
// and ka [B].
void quantize_row_k(const float* x, int64_t K, int8_t* a, KAct* ka) {
  for (int64_t u = 0; u < K / 256; ++u) {
    vf vmax = zero();
    for (int i = 0; i < 256; i += kW) vmax = max(vmax, abs(load(x + 256 * u + i)));
    float bmax[8], amax = 0.0f;
    for (int j = 0; j < 8; ++j) {
      vf m = zero();
      for (int i = 0; i < 32; i += kW) m = max(m, abs(load(x + 256 * u + 32 * j + i)));
      bmax[j] = reduce_max(m);
      amax = bmax[j] > amax ? bmax[j] : amax;
    }
    const float s = (amax > kTiny ? amax : kTiny) / 127.0f;
    int32_t hs[8];  // 2^sh * sum hi per block
    for (int j = 0; j < 8; ++j) {
      const int64_t b = 8 * u + j;
      int e = 0;  // the block's step s / 2^e, 2^e <= amax / bmax (its hi stay in -127..127)
      while (e < 3 && bmax[j] * (float)(2 << e) <= amax) ++e;
      float f0, f1;
      round_block(x + 32 * b, s * (1.0f / (float)(1 << e)), a + 64 * b, f0, f1);
      const int32_t h0 = (int32_t)f0, h1 = (int32_t)f1;
      ka[b] = KAct{s * 0.125f, (int16_t)h0, (int16_t)h1, 3 - e, 0};
      hs[j] = (h0 + h1) * (1 << (3 - e));  // |.| <= 32 * 127 * 8 < 2^15
    }
    for (int j = 0; j < 8; j += 2)
      ka[8 * u + j].hp = (int32_t)((uint16_t)hs[j] | (uint32_t)(uint16_t)hs[j + 1] << 16);
  }
}

// A K-quant group decoded (decode_kgroup): per block kDecBlock bytes, codes [4 k][q0, q1][64]
// then int32 lanes [2][16] (Q4_K / Q5_K: scale, min; Q6_K: the halves' scales); after the B
// blocks, per super-block kDecUnit bytes: floats [2][16], D and -Dmin (Q6_K: D), then the
// mins as int16 pairs [4][16] (k_min_pairs').
constexpr int64_t kDecBlock = 640, kDecUnit = 384;
inline int64_t dec_group_bytes(int64_t B) { return B * kDecBlock + B / 8 * kDecUnit; }

// The codes of vector k of block j of unit `un` (kDecoded: decode_kgroup's bytes).
template <int64_t F, bool kDecoded>
inline void k_codes(const uint8_t* g, int64_t un, int j, int k, int off, vi& q0, vi& q1) {
  if constexpr (kDecoded) {
    const uint8_t* q = g + (un * 8 + j) * kDecBlock + k * 128 + off;
    q0 = iload(q);
    q1 = iload(q + 64);
  } else {
    block_codes<F>(g + un * Fmt<F>::kUnitBytes, j, k, off, q0, q1);
  }
}

// Block j's int32 lanes at lane0: sc[0] the scale (Q6_K: the first half's), sc[1] the min
// (Q6_K: the second half's scale).
template <int64_t F, bool kDecoded>
inline void k_scales(const uint8_t* g, int64_t un, int j, int lane0, vi sc[2]) {
  if constexpr (kDecoded) {
    const uint8_t* p = g + (un * 8 + j) * kDecBlock + 512 + 4 * lane0;
    sc[0] = iload(p);
    sc[1] = iload(p + 64);
  } else {
    using Q = Fmt<F>;
    const uint8_t* s = g + un * Q::kUnitBytes + Q::U * (256 + Q::P) + j * Q::S + lane0;
    if constexpr (F == kQ6_K) {
      sc[0] = iload_i8((const int8_t*)s);
      sc[1] = iload_i8((const int8_t*)s + 16);
    } else {
      sc[0] = iload_u8(s);
      sc[1] = iload_u8(s + 16);
    }
  }
}

// Unit un's D and -Dmin (Q6_K: D only) at lane0.
template <int64_t F, bool kDecoded>
inline void k_unit(const uint8_t* g, int64_t B, int64_t un, int lane0, vf& d, vf& nm) {
  if constexpr (kDecoded) {
    const float* f = (const float*)(g + B * kDecBlock + un * kDecUnit) + lane0;
    d = load(f);
    nm = load(f + 16);
  } else {
    using Q = Fmt<F>;
    const uint8_t* t = g + un * Q::kUnitBytes + Q::U * (256 + Q::P + Q::S);
    d = load_half(t + 2 * lane0);
    nm = F == kQ6_K ? zero() : sub(zero(), load_half(t + 32 + 2 * lane0));
  }
}

// Unit un's mins (Q4_K, Q5_K) at lane0 as int16 pairs: mp[i] = (min of block 2i, of 2i + 1).
template <int64_t F, bool kDecoded>
inline void k_min_pairs(const uint8_t* g, int64_t B, int64_t un, int lane0, vi mp[4]) {
  if constexpr (kDecoded) {
    const uint8_t* p = g + B * kDecBlock + un * kDecUnit + 128 + 4 * lane0;
    for (int i = 0; i < 4; ++i) mp[i] = iload(p + 64 * i);
  } else {
    using Q = Fmt<F>;
    const uint8_t* s = g + un * Q::kUnitBytes + Q::U * (256 + Q::P) + 16 + lane0;
    for (int i = 0; i < 4; ++i) mp[i] = u8_pairs(s + 2 * i * Q::S, s + (2 * i + 1) * Q::S);
  }
}

// One K-quant group's B blocks -> dec_group_bytes(B) bytes (kDecBlock's layout).
template <int64_t F>
void decode_kgroup(const uint8_t* w, int64_t B, uint8_t* out) {
  constexpr int64_t kPerBlock = Fmt<F>::kUnitBytes / 8;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t un = b / 8;
    const int j = (int)(b % 8);
    uint8_t* o = out + b * kDecBlock;
    for (int64_t at = 0; at < kPerBlock; at += 64)  // as dot_kquant does
      __builtin_prefetch((const char*)w + un * Fmt<F>::kUnitBytes + j * kPerBlock +
                         Fmt<F>::kAhead + at);
    for (int k = 0; k < 4; ++k)
      for (int v = 0; v < kSub; ++v) {
        vi q0, q1;
        k_codes<F, false>(w, un, j, k, v * 4 * kW, q0, q1);
        istore(o + k * 128 + v * 4 * kW, q0);
        istore(o + k * 128 + 64 + v * 4 * kW, q1);
      }
    for (int v = 0; v < kSub; ++v) {
      vi sc[2];
      k_scales<F, false>(w, un, j, v * kW, sc);
      istore(o + 512 + 4 * v * kW, sc[0]);
      istore(o + 576 + 4 * v * kW, sc[1]);
    }
  }
  for (int64_t un = 0; un < B / 8; ++un) {
    uint8_t* o = out + B * kDecBlock + un * kDecUnit;
    for (int v = 0; v < kSub; ++v) {
      vf d, nm;
      k_unit<F, false>(w, B, un, v * kW, d, nm);
      store((float*)o + v * kW, d);
      store((float*)o + 16 + v * kW, nm);
      if constexpr (F != kQ6_K) {
        vi mp[4];
        k_min_pairs<F, false>(w, B, un, v * kW, mp);
        for (int i = 0; i < 4; ++i) istore(o + 128 + 64 * i + 4 * v * kW, mp[i]);
      }
    }
  }
}

// One row's float step for a super-block (the header's K-quant order): its integer sum CI
// times D * s, then (NS == 1: Q4_K, Q5_K) its mins' sum from the mins' pairs mp times -Dmin * s;
// x: the row's KAct of the super-block's first block.
template <int NS>
inline vf super_block_step(vf acc, vi CI, vf d, vf nm, const vi mp[4], const KAct* x) {
  const vf s = set1(x->s);
  acc = fmadd(to_float(CI), mul(d, s), acc);
  if constexpr (NS == 1) {
    vi mi = izero();
    for (int i = 0; i < 4; ++i) mi = dot_i16(mi, mp[i], bcast4(&x[2 * i].hp));
    acc = fmadd(to_float(mi), mul(nm, s), acc);
  }
  return acc;
}

// R rows x NG groups of 16 outputs of a K-quant over all of K (the header's K-quant order):
// per block the exact integer sums H, folded into the super-block's integer sum with the
// block's integer scale; per super-block one conversion and a fused multiply-add each for the
// scales and the mins. From the packed weights at w, or (kDecoded) decode_kgroup's bytes.
template <int64_t F, int R, int NG, bool kDecoded>
void dot_kquant(const int8_t* a, const float* sc, int64_t K, const uint8_t* w,
                const float* bias, float* y, int64_t ldy, int64_t n0, int64_t N) {
  using Q = Fmt<F>;
  constexpr int V = NG * kSub;
  constexpr int NS = Q::kHalves ? 2 : 1;
  // Below VNNI, 4-bit codes: a block's eight maddubs summed in int16 pairs (simd.h
  // q4x2_pairs, |sum| <= 30,480), then the pairs times the block's scale << sh (<= 504, an
  // int16 pair too) in one madd (dot_i16): the same exact integer as widening, multiplying
  // and shifting in int32, with one multiply instead of four widenings and a vpmulld.
  constexpr bool kPairs = kPairSums && Q::kBits == 4;
  // Where that madd is one instruction (kPairScale: AVX2), Q5_K and Q6_K too, each as far as
  // int16 holds: Q5_K a half's four maddubs (|sum| <= 4 * 2 * 31 * 127 = 31,496) times the
  // scale << sh; Q6_K a half's two (2 * 2 * 63 * 127 = 32,004) times its scale (|sc| <= 128),
  // folded into int32 every second k-step, and its -32 * (h0 sc0 + h1 sc1) in one more madd
  // of the row's (h0, h1) pair against (sc0, sc1). The same integers as the int32 steps.
  // Paired (the 3B shape's matrices, AMD EPYC Zen 5, 2 threads, avx2, 16 / 128 rows, GMAC/s):
  // Q6_K 100 / 114 -> 121 / 141, Q5_K 144 / 171 -> 160 / 192 (4 rows a block: slower).
  constexpr bool kPairs5 = kPairSums && kPairScale && Q::kBits == 5;
  constexpr bool kPairs6 = kPairSums && kPairScale && NS == 2;
  // integer sums per block: Q6_K's halves apart; with AVX-512 VNNI the first and second 16's
  // apart too (two dependency chains a tile hide vpdpbusd's latency: Q4_K +8 %); below it one
  // (dot_q4x2 adds the two in int16 first: fewer instructions, fewer registers), and one with
  // AVX-VNNI (16 registers: four rows' chains instead, Fmt::kRows)
  constexpr int NH = Q::kHalves || (kW == 16 && kVnni) ? 2 : 1;
  const KAct* ka = (const KAct*)sc;
  const int64_t B = K / 32, units = B / 8;
  const int64_t group_stride = kDecoded ? dec_group_bytes(B) : units * Q::kUnitBytes;
  vf acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = zero();
  for (int64_t un = 0; un < units; ++un) {
    vi CI[R][V];  // sum over the unit's blocks of scale * H (Q6_K: of (H - 32 sum hi))
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) CI[r][v] = izero();
    for (int j = 0; j < 8; ++j) {
      const int64_t b = un * 8 + j;
      if constexpr (!kDecoded && Fmt<F>::kAhead > 0) {  // as dot_block
        constexpr int64_t kPerBlock = Q::kUnitBytes / 8;
        for (int g = 0; g < NG; ++g) {
          const char* p = (const char*)w + g * group_stride + un * Q::kUnitBytes +
                          j * kPerBlock + Fmt<F>::kAhead;
          for (int64_t o = 0; o < kPerBlock; o += 64) __builtin_prefetch(p + o);
        }
      }
      vi H[R][V][kPairs5 ? 2 : NH];
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v)
          for (int h = 0; h < (kPairs5 ? 2 : NH); ++h) H[r][v][h] = izero();
      vi S6[kPairs6 ? V : 1][2], T[kPairs6 ? R : 1][kPairs6 ? V : 1];
      if constexpr (kPairs6) {  // the halves' scales as int16 pairs, and int32 sums
        for (int v = 0; v < V; ++v) {
          vi s[2];
          k_scales<F, kDecoded>(w + (v / kSub) * group_stride, un, j, (v % kSub) * kW, s);
          S6[v][0] = i16_pairs(s[0], s[0]);
          S6[v][1] = i16_pairs(s[1], s[1]);
        }
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < V; ++v) T[r][v] = izero();
      }
      for (int k = 0; k < 4; ++k) {
        vi q0[V], q1[V];
        for (int v = 0; v < V; ++v)
          k_codes<F, kDecoded>(w + (v / kSub) * group_stride, un, j, k, (v % kSub) * 4 * kW,
                               q0[v], q1[v]);
        for (int r = 0; r < R; ++r) {
          const int8_t* ab = a + (r * B + b) * 64 + 4 * k;
          vi h0 = bcast4(ab), h1 = bcast4(ab + 16);
          for (int v = 0; v < V; ++v) {
            if constexpr (kPairs) {
              H[r][v][0] = q4x2_pairs(H[r][v][0], q0[v], h0, q1[v], h1);
              pin(H[r][v][0]);
            } else if constexpr (kPairs5 || kPairs6) {
              H[r][v][0] = code_pairs(H[r][v][0], q0[v], h0);
              H[r][v][1] = code_pairs(H[r][v][1], q1[v], h1);
              pin(H[r][v][0]);
              pin(H[r][v][1]);
              if constexpr (kPairs6) {
                if (k % 2 == 1) {
                  T[r][v] = dot_i16(dot_i16(T[r][v], H[r][v][0], S6[v][0]), H[r][v][1],
                                    S6[v][1]);
                  pin(T[r][v]);
                  H[r][v][0] = H[r][v][1] = izero();
                }
              }
            } else if constexpr (NH == 1) {
              H[r][v][0] = dot_q4x2(H[r][v][0], q0[v], h0, q1[v], h1);
            } else {
              H[r][v][0] = dot_codes(H[r][v][0], q0[v], h0);
              H[r][v][1] = dot_codes(H[r][v][1], q1[v], h1);
            }
          }
        }
      }
      for (int v = 0; v < V; ++v) {
        vi s[2];
        k_scales<F, kDecoded>(w + (v / kSub) * group_stride, un, j, (v % kSub) * kW, s);
        if constexpr ((kPairs && kPairScale) || kPairs5) s[0] = i16_pairs(s[0], s[0]);
        if constexpr (kPairs6) s[0] = i16_pairs(s[0], s[1]);  // (sc0, sc1)
        for (int r = 0; r < R; ++r) {
          const KAct& x = ka[r * B + b];
          if constexpr ((kPairs && kPairScale) || kPairs5) {  // Q4_K one pair sum, Q5_K two
            const vi sp = ishl(s[0], x.sh);
            for (int h = 0; h < (kPairs5 ? 2 : 1); ++h)
              CI[r][v] = dot_i16(CI[r][v], H[r][v][h], sp);
            continue;
          }
          if constexpr (kPairs6) {  // x.h0, x.h1: the row's (h0, h1) int16 pair
            const vi c = dot_i16(izero(), bcast4(&x.h0), s[0]);
            CI[r][v] = iadd(CI[r][v], ishl(isub(T[r][v], ishl(c, 5)), x.sh));
            continue;
          }
          vi t;
          if constexpr (NS == 2) {
            t = iadd(imul(isub(H[r][v][0], iset1(32 * x.h0)), s[0]),
                     imul(isub(H[r][v][1], iset1(32 * x.h1)), s[1]));
          } else {
            const vi h = kPairs ? widen_pairs(H[r][v][0])
                                : NH == 1 ? H[r][v][0] : iadd(H[r][v][0], H[r][v][NH - 1]);
            t = imul(h, s[0]);
          }
          CI[r][v] = iadd(CI[r][v], ishl(t, x.sh));
        }
      }
    }
    for (int v = 0; v < V; ++v) {
      const uint8_t* g = w + (v / kSub) * group_stride;
      const int lane0 = (v % kSub) * kW;
      vf d, nm;
      k_unit<F, kDecoded>(g, B, un, lane0, d, nm);
      vi mp[4];  // the unit's blocks' mins (Q4_K, Q5_K)
      if constexpr (NS == 1) k_min_pairs<F, kDecoded>(g, B, un, lane0, mp);
      for (int r = 0; r < R; ++r)
        acc[r][v] = super_block_step<NS>(acc[r][v], CI[r][v], d, nm, mp, ka + r * B + un * 8);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v)
      store_out(acc[r][v], bias, y + r * ldy, n0 + 16 * (v / kSub) + (v % kSub) * kW, N);
}

// Up to kHeldRows rows x NG groups of a K-quant from the packed weights, each block's codes
// unpacked once into registers and held there while every row's integer sums are taken (rows
// inner; the rows' sums in memory): dot_kquant unpacks them once per kRows rows, and Q5_K's
// and Q6_K's high bits cost more instructions than the dot products of four rows. Only where
// a block's codes fit the registers (AVX-512: 16 of 32). The same integers and the same
// float steps per row in the same order as dot_kquant, so the same bits. Measured on
// bench_gemv.py's matrices, the two builds alternated in one process, AMD EPYC Zen 5, 2
// threads, rows 8 / 16 / 24, GMAC/s (medians of 5): Q6_K 291 -> 323, 318 -> 378, 343 -> 444; Q5_K
// (8, 16, 24) 334 -> 389, 388 -> 476, 422 -> 514. Q4_K too: the 3B shape's four Q4_K
// matrices (4096 / 3072 / 16384 x 3072, 3072 x 8192), the two paths alternated 20 times in
// one process, 2 threads, medians at 6 / 10 / 16 / 24 / 32 / 64 rows: 386 -> 413, 355 -> 375,
// 339 -> 376, 439 -> 466, 470 -> 490, 446 -> 475 GMAC/s (8 rows: 368 -> 360, even; the host
// swings 30 % from minute to minute, the pairs far less). From 32 rows the decoded path
// (decodes()) is as fast for Q5_K and Q6_K; Q4_K decodes from 96.
constexpr int kHeldRows = 32;
template <int64_t F>
constexpr bool kHeld = kW == 16 && (F == kQ4_K || F == kQ5_K || F == kQ6_K);
// fewer rows: dot_kquant's register blocks. 5 rows (a block of 4 and a lone row) measured
// slower than held (paired, the 3B shape's matrices, 2 threads, GMAC/s blocks vs held: Q4_K
// 235 vs 258, Q5_K 166 vs 190, Q6_K 156 vs 174); 2-4 rows faster or even (4: Q4_K 246 vs 223,
// Q5_K 211 vs 201, Q6_K 143 vs 151)
constexpr int64_t kHeldMinRows = 5;

template <int64_t F, int NG>
void dot_kquant_held(int64_t M, const int8_t* a, const float* sc, int64_t K, const uint8_t* w,
                     const float* bias, float* y, int64_t ldy, int64_t n0, int64_t N) {
  using Q = Fmt<F>;
  constexpr int V = NG * kSub;
  constexpr int NS = Q::kHalves ? 2 : 1;
  const KAct* ka = (const KAct*)sc;
  const int64_t B = K / 32, units = B / 8, group_stride = units * Q::kUnitBytes;
  alignas(64) vf acc[kHeldRows][V];
  alignas(64) vi CI[kHeldRows][V];
  for (int64_t r = 0; r < M; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = zero();
  for (int64_t un = 0; un < units; ++un) {
    for (int64_t r = 0; r < M; ++r)
      for (int v = 0; v < V; ++v) CI[r][v] = izero();
    for (int j = 0; j < 8; ++j) {
      const int64_t b = un * 8 + j;
      if constexpr (Fmt<F>::kAhead > 0) {
        constexpr int64_t kPerBlock = Q::kUnitBytes / 8;
        for (int g = 0; g < NG; ++g) {
          const char* p = (const char*)w + g * group_stride + un * Q::kUnitBytes +
                          j * kPerBlock + Fmt<F>::kAhead;
          for (int64_t o = 0; o < kPerBlock; o += 64) __builtin_prefetch(p + o);
        }
      }
      vi q0[V][4], q1[V][4], s[V][2];
      for (int v = 0; v < V; ++v) {
        const uint8_t* g = w + (v / kSub) * group_stride;
        for (int k = 0; k < 4; ++k)
          k_codes<F, false>(g, un, j, k, (v % kSub) * 4 * kW, q0[v][k], q1[v][k]);
        k_scales<F, false>(g, un, j, (v % kSub) * kW, s[v]);
      }
      for (int64_t r = 0; r < M; ++r) {
        const int8_t* ab = a + (r * B + b) * 64;
        const KAct& x = ka[r * B + b];
        for (int v = 0; v < V; ++v) {
          vi H0 = izero(), H1 = izero();
          for (int k = 0; k < 4; ++k) {
            H0 = dot_codes(H0, q0[v][k], bcast4(ab + 4 * k));
            H1 = dot_codes(H1, q1[v][k], bcast4(ab + 16 + 4 * k));
          }
          vi t;
          if constexpr (NS == 2)
            t = iadd(imul(isub(H0, iset1(32 * x.h0)), s[v][0]),
                     imul(isub(H1, iset1(32 * x.h1)), s[v][1]));
          else
            t = imul(iadd(H0, H1), s[v][0]);
          CI[r][v] = iadd(CI[r][v], ishl(t, x.sh));
        }
      }
    }
    for (int v = 0; v < V; ++v) {
      const uint8_t* g = w + (v / kSub) * group_stride;
      const int lane0 = (v % kSub) * kW;
      vf d, nm;
      k_unit<F, false>(g, B, un, lane0, d, nm);
      vi mp[4];
      if constexpr (NS == 1) k_min_pairs<F, false>(g, B, un, lane0, mp);
      for (int64_t r = 0; r < M; ++r)
        acc[r][v] = super_block_step<NS>(acc[r][v], CI[r][v], d, nm, mp, ka + r * B + un * 8);
    }
  }
  for (int64_t r = 0; r < M; ++r)
    for (int v = 0; v < V; ++v)
      store_out(acc[r][v], bias, y + r * ldy, n0 + 16 * (v / kSub) + (v % kSub) * kW, N);
}

// Below VNNI (kPairScale: AVX2), Q6_K from kHeldPairsMinRows rows: dot_kquant_held's order,
// one vector of 8 outputs at a time. A block's eight code vectors and its halves' scales as
// int16 pairs (11 of the 16 registers) are unpacked once from the packed weights and held
// while every row takes its sums, dot_kquant's kPairs6 integers: per half, two maddubs added
// in int16 (<= 2 * 16,002) times the half's scale in one madd, then -32 * (h0 sc0 + h1 sc1) in
// one madd of the row's (h0, h1) against (sc0, sc1), and the shift; the same float steps, so
// the same bits. dot_kquant's register blocks (2 rows x 4 vectors, some 40 live vectors)
// spilled, and the decoded path read the codes back from L2 for every 2 rows. Paired on the
// 3B shape's matrices (AMD EPYC Zen 4, 2 threads, GMAC/s, before -> held): 3 rows 66 -> 83,
// 4: 61 -> 100, 8: 86 -> 117, 16: 112 -> 132, 32: 125 -> 141, 128: 133 -> 136; 2 rows stay in
// blocks (66 vs 61). Q4_K and Q5_K held this way measured slower or even (16 / 64 rows: Q4_K
// 174 / 194 -> 126 / 145, Q5_K 106 / 179 -> 109 / 160): a broadcast of the row's bytes per
// maddubs instead of one per four vectors, and their blocks, with fewer high bits to unpack,
// spill less.
constexpr int64_t kHeldPairsMinRows = 3;
template <int64_t F>
constexpr bool kHeldPairs = kPairScale && F == kQ6_K;

template <int NG>
void dot_q6k_held_pairs(int64_t M, const int8_t* a, const float* sc, int64_t K,
                        const uint8_t* w, const float* bias, float* y, int64_t ldy, int64_t n0,
                        int64_t N) {
  constexpr int64_t F = kQ6_K;
  using Q = Fmt<F>;
  constexpr int V = NG * kSub;
  const KAct* ka = (const KAct*)sc;
  const int64_t B = K / 32, units = B / 8, group_stride = units * Q::kUnitBytes;
  alignas(64) vf acc[kHeldRows][V];
  alignas(64) vi CI[kHeldRows][V];
  for (int64_t r = 0; r < M; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = zero();
  for (int64_t un = 0; un < units; ++un) {
    for (int64_t r = 0; r < M; ++r)
      for (int v = 0; v < V; ++v) CI[r][v] = izero();
    for (int j = 0; j < 8; ++j) {
      const int64_t b = un * 8 + j;
      if constexpr (Fmt<F>::kAhead > 0) {  // as dot_kquant_held
        constexpr int64_t kPerBlock = Q::kUnitBytes / 8;
        for (int g = 0; g < NG; ++g) {
          const char* p = (const char*)w + g * group_stride + un * Q::kUnitBytes +
                          j * kPerBlock + Fmt<F>::kAhead;
          for (int64_t o = 0; o < kPerBlock; o += 64) __builtin_prefetch(p + o);
        }
      }
      for (int v = 0; v < V; ++v) {
        const uint8_t* g = w + (v / kSub) * group_stride;
        vi q[2][4], s[2];
        for (int k = 0; k < 4; ++k)
          k_codes<F, false>(g, un, j, k, (v % kSub) * 4 * kW, q[0][k], q[1][k]);
        k_scales<F, false>(g, un, j, (v % kSub) * kW, s);
        const vi sp[2] = {i16_pairs(s[0], s[0]), i16_pairs(s[1], s[1])};
        const vi s01 = i16_pairs(s[0], s[1]);
        for (int64_t r = 0; r < M; ++r) {
          const int8_t* ab = a + (r * B + b) * 64;
          const KAct& x = ka[r * B + b];
          vi t = izero();
          for (int h = 0; h < 2; ++h)
            for (int k = 0; k < 4; k += 2) {
              vi p = code_pairs(izero(), q[h][k], bcast4(ab + 16 * h + 4 * k));
              p = code_pairs(p, q[h][k + 1], bcast4(ab + 16 * h + 4 * k + 4));
              t = dot_i16(t, p, sp[h]);
            }
          const vi c = dot_i16(izero(), bcast4(&x.h0), s01);
          CI[r][v] = iadd(CI[r][v], ishl(isub(t, ishl(c, 5)), x.sh));
        }
      }
    }
    for (int v = 0; v < V; ++v) {
      const uint8_t* g = w + (v / kSub) * group_stride;
      vf d, nm;
      k_unit<F, false>(g, B, un, (v % kSub) * kW, d, nm);
      vi mp[4];  // (Q6_K has no mins)
      for (int64_t r = 0; r < M; ++r)
        acc[r][v] = super_block_step<2>(acc[r][v], CI[r][v], d, nm, mp, ka + r * B + un * 8);
    }
  }
  for (int64_t r = 0; r < M; ++r)
    for (int v = 0; v < V; ++v)
      store_out(acc[r][v], bias, y + r * ldy, n0 + 16 * (v / kSub) + (v % kSub) * kW, N);
}

// Up to kHeldRows rows of a K-quant with each block's codes held in registers: AVX-512's
// dot_kquant_held, or AVX2's Q6_K (dot_q6k_held_pairs).
template <int64_t F, int NG>
inline void dot_held(int64_t M, const int8_t* a, const float* sc, int64_t K, const uint8_t* w,
                     const float* bias, float* y, int64_t ldy, int64_t n0, int64_t N) {
  if constexpr (kHeldPairs<F>)
    dot_q6k_held_pairs<NG>(M, a, sc, K, w, bias, y, ldy, n0, N);
  else
    dot_kquant_held<F, NG>(M, a, sc, K, w, bias, y, ldy, n0, N);
}

// R rows x NG groups of 16 outputs of a legacy format over all of K: per block the exact
// integer sums, then the epilogue (the header's order).
template <int64_t F, int R, int NG>
void dot_block(const int8_t* a, const float* sc, int64_t K, const uint8_t* w,
               const float* bias, float* y, int64_t ldy, int64_t n0, int64_t N) {
  using Q = Fmt<F>;
  constexpr int V = NG * kSub;
  constexpr int NS = Q::kHalves ? 2 : 1;  // integer sums per block: halves or the whole
  // Below VNNI, 4-bit codes: a block's four k-steps summed in int16 pairs (exact: simd.h
  // q4x2_pairs), widened once: avx2 GEMV +14 % (2 threads) / +18 % (1). Each step pinned
  // (simd.h pin): left alone the compiler reassociated the sums into a tree of every product
  // at once, spilled, which had measured more rows slower (128 rows: 145 -> 120 GMAC/s).
  // Pinned, with 4 rows a register block, paired on bench_gemv-shaped 3B matrices (AMD EPYC
  // Zen 5, 2 threads, 16 / 128 rows, GMAC/s): Q4_0 95 / 163 -> 121 / 216 (the decoded path,
  // dot_decoded, pairs too), Q4_1 137 / 164 -> 176 / 213. 5-bit codes and Q6_K's halves (two
  // k-steps a widening) measured no faster / slower: they keep the int32 step.
  constexpr bool kPairs = kPairSums && Q::kBits == 4;
  const int64_t B = K / 32, units = B / Q::U, group_stride = units * Q::kUnitBytes;
  vf acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = zero();
  for (int64_t un = 0; un < units; ++un) {
    for (int j = 0; j < Q::U; ++j) {
      const int64_t b = un * Q::U + j;
      if constexpr (Fmt<F>::kAhead > 0) {
        // the first pass over a group reads each weight byte once, from memory: ask for the
        // bytes kAhead ahead, a block's worth per block, in every group's stream (a GEMV
        // on AMD EPYC Zen 5, 2 threads: Q4_K 32 -> ~40 GB/s at AVX-512, 22 -> ~40 at AVX2)
        constexpr int64_t kPerBlock = Q::kUnitBytes / Q::U;
        for (int g = 0; g < NG; ++g) {
          const char* p = (const char*)w + g * group_stride + un * Q::kUnitBytes +
                          j * kPerBlock + Fmt<F>::kAhead;
          for (int64_t o = 0; o < kPerBlock; o += 64) __builtin_prefetch(p + o);
        }
      }
      vi H[R][V][NS];  // int32 sums (kPairs: int16 pair sums until widened)
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v)
          for (int h = 0; h < NS; ++h) H[r][v][h] = izero();
      for (int k = 0; k < 4; ++k) {
        vi q0[V], q1[V];
        for (int v = 0; v < V; ++v)
          block_codes<F>(w + (v / kSub) * group_stride + un * Q::kUnitBytes, j, k,
                         (v % kSub) * 4 * kW, q0[v], q1[v]);
        for (int r = 0; r < R; ++r) {
          const int8_t* ab = a + (r * B + b) * 64 + 4 * k;
          vi h0 = bcast4(ab), h1 = bcast4(ab + 16);
          for (int v = 0; v < V; ++v) {
            if constexpr (kPairs) {
              H[r][v][0] = q4x2_pairs(H[r][v][0], q0[v], h0, q1[v], h1);
              pin(H[r][v][0]);
            } else if constexpr (Q::kBytes) {
              H[r][v][0] = dot_s8(dot_s8(H[r][v][0], q0[v], h0), q1[v], h1);
            } else {
              H[r][v][0] = dot_q4x2(H[r][v][0], q0[v], h0, q1[v], h1);
            }
          }
        }
      }
      if constexpr (kPairs)
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < V; ++v) H[r][v][0] = widen_pairs(H[r][v][0]);
      for (int v = 0; v < V; ++v) {
        vf d[2], m[2];
        block_scales<F>(w + (v / kSub) * group_stride + un * Q::kUnitBytes, j,
                        (v % kSub) * kW, d, m);
        for (int r = 0; r < R; ++r) {
          const float* f = sc + kActFloats * (r * B + b);
          for (int h = 0; h < NS; ++h)
            acc[r][v] = sub_block(acc[r][v], ishl4(H[r][v][h]), d[h], m[h], f[0],
                                  NS == 2 ? f[2 + h] : f[1]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v)
      store_out(acc[r][v], bias, y + r * ldy, n0 + 16 * (v / kSub) + (v % kSub) * kW, N);
}

// ---- Many rows: each work item's weights decoded once ---------------------------------------
// With kDecodeRows rows or more, a work item first decodes its groups' codes to bytes and
// their per-block multipliers and offsets to floats (decode_group, into a buffer of its
// thread's), and every register block of rows reads those (dot_decoded): the nibble and
// high-bit unpacking and the scale arithmetic run once per item, not once per kRows rows.
// (Chunks of 8 or 32 blocks along K, the decoded chunk in L1 and the accumulators kept in y
// between chunks, measured 5-20 % slower than whole rows.) The integer sums and the epilogue
// are the same operations on the same values in the same order, so a row's output is
// bit-identical to the undecoded path's (fewer rows, or one alone). Measured (bench_gemv.py,
// AMD EPYC Zen 5, 2 threads), 128 rows: AVX-512 Q4_K +8 %, Q6_K +13 %, Q5_K +32 %; AVX2 +16 %,
// +36 %, +61 %; at 16 rows AVX2 gains 7-35 % but AVX-512 loses ~10 % (the decoded bytes come
// from L2, the packed ones were in L1): hence the threshold per level.
constexpr int64_t kDecodeRows = kW == 16 ? 96 : kVnni ? 64 : 12;
// AVX2's 4-bit legacy formats since their int16 pair sums and 4-row register blocks (dot_block)
// from 32 rows (paired as below, GMAC/s undecoded vs decoded: Q4_0 12 rows 203 vs 177, 16: 216
// vs 200, 32: 224 vs 215, 64: 192 vs 207, 128: 219 vs 236; Q4_1 12: 220 vs 183, 16: 223 vs
// 197, 32: 225 vs 223); generic's stay at 12 (Q4_0 12 / 32 rows: 20 vs 21).
constexpr int64_t kDecodeRows4 = kPairScale ? 32 : kDecodeRows;
// The 5-bit legacy formats (Q5_0, Q5_1) decode sooner than the 4-bit ones where the dot
// product is one instruction (paired as below, packed vs decoded GMAC/s): AVX-512 from 32
// (Q5_0 16 rows 446 vs 363, 32: 449 vs 446, 64: 473 vs 517; Q5_1 64: 429 vs 482; Q4_0 stays
// packed, 64: 543 vs 503); AVX-VNNI from 12 (Q5_0 8: 123 vs 109, 12: 169 vs 178, 16: 172 vs
// 197, 32: 184 vs 231; Q5_1 16: 183 vs 203, 32: 203 vs 234; Q4_0 stays at 64, 16: 224 vs 199).
constexpr int64_t kDecodeRows5 = kW == 16 ? 32 : kVnni ? 12 : kDecodeRows;
// K-quants fold their scales in integers (dot_kquant), so decoding pays from other row counts
// (bench_gemv.py, AMD EPYC Zen 5, 2 threads): AVX-512 Q5_K / Q6_K from 32 rows (Q6_K at 64:
// 587 vs 443 GMAC/s), Q4_K at about 96 (at 64 undecoded 685 vs 598); AVX2 Q4_K from 64 (at 16
// undecoded 229 vs 193), Q5_K / Q6_K from 12 (at 16: 191 vs 157, 152 vs 133). AVX-VNNI
// (256-bit vpdpbusd, same machine, paired): Q4_K never (512 rows undecoded 261 vs 224, 64 rows
// 264 vs 220), Q5_K / Q6_K from 12 (16 rows decoded 187 vs 154, 178 vs 137), the legacy
// formats from 64 (Q4_0 at 16 rows undecoded 245 vs 216, equal from 64).
// Fewer rows (a speculative verify step, a few streams), the 3B shape's matrices paired in one
// process (AMD EPYC Zen 5, 2 threads, medians of 9, GMAC/s undecoded vs decoded): AVX2 Q6_K
// decodes from 4 rows (4: 69 vs 78, 6: 77 vs 100, 8: 73 vs 106, 10: 78 vs 117; 3 rows and
// fewer lose), Q5_K from 8 (4: 126 vs 108, 6: 122 vs 124, 8: 112 vs 126, 10: 120 vs 143);
// AVX-VNNI Q6_K from 8 (4: 96 vs 88, 6: 110 vs 111, 8: 109 vs 122), Q5_K still from 12 (its
// 4-row register blocks: 4 rows 196 vs 122, 10: 159 vs 168); generic both from 4 (Q6_K 4: 10
// vs 13, 8: 10 vs 16; Q5_K 4: 12 vs 15, 8: 12 vs 19). The Arm dotprod level takes AVX-VNNI's
// (not measured on Arm). AVX2's Q6_K no longer decodes: from 3 rows dot_q6k_held_pairs holds
// each block's codes in registers, faster than both (and no slower from 32 rows).
constexpr int64_t kNever = INT64_MAX;
constexpr int64_t kDecodeRowsK4 = kW == 16 ? 96 : kVnni ? kNever : 64;
constexpr int64_t kDecodeRowsK5 = kW == 16 ? 32 : kVnni ? 12 : kPairScale ? 8 : 4;
constexpr int64_t kDecodeRowsK6 = kW == 16 ? 32 : kVnni ? 8 : kPairScale ? kNever : 4;

template <int64_t F>
struct Dec {
  static constexpr int NS = Fmt<F>::kHalves ? 2 : 1;
  static constexpr int64_t kBlock = 512 + NS * 2 * 64;  // codes [4 k][q0, q1][64], d, m
};
// two groups of the largest decoded block
inline int64_t dec_buffer_bytes(int64_t B) {
  return 2 * dec_group_bytes(B);
}

// Where the core runs AVX-512 in two 256-bit halves and loads two 256-bit halves a cycle (AMD
// Zen 4; Zen 5 and Intel's AVX-512 cores load two 512-bit vectors), a Q4_K or Q5_K code block
// unpacked into registers once for 32 rows (dot_kquant_held) beats decoded bytes read back
// from L2 at every row count: bench_gemv.py's 3B-shaped matrices, AMD EPYC Zen 4, 2 threads,
// paired, decoded vs held GMAC/s, Q4_K 96 / 160 / 512 rows 311 / 311 / 320 vs 333 / 329 / 332,
// 1024 rows 308 vs 322; Q5_K 48 / 128 / 1024 rows 275 / 292 / 286 vs 308 / 319 / 310 (Q6_K
// even: it still decodes). A 128-token prefill of the 3B shape, alternated 10 times in one
// process: 1.31 -> 1.26 s. Zen 4 is told by CPUID: AMD, family 19h, in an AVX-512 build (which
// loads only where the CPU has AVX-512: Zen 3, the other 19h cores, has none). rs_held_kquants
// reads it and sets it (the tests take both ways).
bool zen4() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  const bool amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "AuthenticAMD"
  if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return false;
  const unsigned family = ((a >> 8) & 0xF) + ((a >> 20) & 0xFF);
  return family == 0x19;
#else
  return false;
#endif
}
bool g_held_kquants = kW == 16 && zen4();

inline bool decodes(int64_t f, int64_t M) {
  if (f == kQ4_K) return !g_held_kquants && M >= kDecodeRowsK4;
  if (f == kQ5_K) return !g_held_kquants && M >= kDecodeRowsK5;
  if (f == kQ6_K) return M >= kDecodeRowsK6;
  if (f == kQ4_0 || f == kQ4_1) return M >= kDecodeRows4;
  if (f == kQ5_0 || f == kQ5_1) return M >= kDecodeRows5;
  return M >= kDecodeRows && f != kQ8_0;
}

// One group's B blocks -> [B][Dec<F>::kBlock]: per k-step q0 and q1
// (block_codes' bytes), then d[NS][16], m[NS][16] (block_scales').
template <int64_t F>
void decode_group(const uint8_t* w, int64_t B, uint8_t* out) {
  using Q = Fmt<F>;
  constexpr int NS = Dec<F>::NS;
  constexpr int64_t kPerBlock = Q::kUnitBytes / Q::U;
  for (int64_t b = 0; b < B; ++b) {
    const uint8_t* u = w + (b / Q::U) * Q::kUnitBytes;
    const int j = (int)(b % Q::U);
    uint8_t* o = out + b * Dec<F>::kBlock;
    for (int64_t at = 0; at < kPerBlock; at += 64)  // as dot_block does
      __builtin_prefetch((const char*)u + j * kPerBlock + Fmt<F>::kAhead + at);
    for (int k = 0; k < 4; ++k)
      for (int v = 0; v < kSub; ++v) {
        vi q0, q1;
        block_codes<F>(u, j, k, v * 4 * kW, q0, q1);
        istore(o + k * 128 + v * 4 * kW, q0);
        istore(o + k * 128 + 64 + v * 4 * kW, q1);
      }
    float* f = (float*)(o + 512);
    for (int v = 0; v < kSub; ++v) {
      vf d[2], m[2];
      block_scales<F>(u, j, v * kW, d, m);
      for (int h = 0; h < NS; ++h) {
        store(f + h * 16 + v * kW, d[h]);
        store(f + (NS + h) * 16 + v * kW, m[h]);
      }
    }
  }
}

// dot_block's work on decode_group's bytes and floats (dec: the first group's, the next B
// blocks on).
template <int64_t F, int R, int NG>
void dot_decoded(const int8_t* a, const float* sc, int64_t K, const uint8_t* dec,
                 const float* bias, float* y, int64_t ldy, int64_t n0, int64_t N) {
  constexpr int V = NG * kSub, NS = Dec<F>::NS;
  constexpr bool kPairs = kPairSums && Fmt<F>::kBits == 4;  // as dot_block
  constexpr int64_t DB = Dec<F>::kBlock;
  const int64_t B = K / 32, group_stride = B * DB;
  vf acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = zero();
  for (int64_t b = 0; b < B; ++b) {
    const uint8_t* db = dec + b * DB;
    vi H[R][V][NS];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v)
        for (int h = 0; h < NS; ++h) H[r][v][h] = izero();
    for (int k = 0; k < 4; ++k) {
      vi q0[V], q1[V];
      for (int v = 0; v < V; ++v) {
        const uint8_t* q = db + (v / kSub) * group_stride + k * 128 + (v % kSub) * 4 * kW;
        q0[v] = iload(q);
        q1[v] = iload(q + 64);
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* ab = a + (r * B + b) * 64 + 4 * k;
        vi h0 = bcast4(ab), h1 = bcast4(ab + 16);
        for (int v = 0; v < V; ++v) {
          if constexpr (NS == 2) {
            H[r][v][0] = dot_codes(H[r][v][0], q0[v], h0);
            H[r][v][1] = dot_codes(H[r][v][1], q1[v], h1);
          } else if constexpr (kPairs) {
            H[r][v][0] = q4x2_pairs(H[r][v][0], q0[v], h0, q1[v], h1);
            pin(H[r][v][0]);
          } else {
            H[r][v][0] = dot_q4x2(H[r][v][0], q0[v], h0, q1[v], h1);
          }
        }
      }
    }
    if constexpr (kPairs)
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) H[r][v][0] = widen_pairs(H[r][v][0]);
    for (int v = 0; v < V; ++v) {
      const float* f = (const float*)(db + (v / kSub) * group_stride + 512) + (v % kSub) * kW;
      for (int r = 0; r < R; ++r) {
        const float* x = sc + kActFloats * (r * B + b);
        for (int h = 0; h < NS; ++h)
          acc[r][v] = sub_block(acc[r][v], ishl4(H[r][v][h]), load(f + h * 16),
                                load(f + (NS + h) * 16), x[0], NS == 2 ? x[2 + h] : x[1]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v)
      store_out(acc[r][v], bias, y + r * ldy, n0 + 16 * (v / kSub) + (v % kSub) * kW, N);
}

// R rows x NG groups from the packed weights at src, or (kDecoded) from their decoded bytes.
template <int64_t F, int R, int NG, bool kDecoded>
inline void dot_rows(const int8_t* a, const float* sc, int64_t K, const uint8_t* src,
                     const float* bias, float* y, int64_t ldy, int64_t n0, int64_t N) {
  if constexpr (Fmt<F>::kSuper)
    dot_kquant<F, R, NG, kDecoded>(a, sc, K, src, bias, y, ldy, n0, N);
  else if constexpr (kDecoded)
    dot_decoded<F, R, NG>(a, sc, K, src, bias, y, ldy, n0, N);
  else
    dot_block<F, R, NG>(a, sc, K, src, bias, y, ldy, n0, N);
}

template <int64_t F, int NG, bool kDecoded>
void rows_ng(int rows, const int8_t* a, const float* sc, int64_t K, const uint8_t* src,
             const float* bias, float* y, int64_t ldy, int64_t n0, int64_t N) {
  constexpr int R = Fmt<F>::kRows;
  switch (rows < R ? rows : R) {
    case 1: dot_rows<F, 1, NG, kDecoded>(a, sc, K, src, bias, y, ldy, n0, N); break;
    case 2:
      if constexpr (R >= 2) dot_rows<F, 2, NG, kDecoded>(a, sc, K, src, bias, y, ldy, n0, N);
      break;
    case 3:
      if constexpr (R >= 3) dot_rows<F, 3, NG, kDecoded>(a, sc, K, src, bias, y, ldy, n0, N);
      break;
    default:
      if constexpr (R >= 4) dot_rows<F, 4, NG, kDecoded>(a, sc, K, src, bias, y, ldy, n0, N);
      break;
  }
}

// Up to this many rows a work item's two groups are taken one after the other, not side by
// side in one register block: a single stream of weights at a time, which the prefetchers
// follow better when the bytes, not the dot products, set the pace. AVX-512, AMD EPYC Zen 5,
// 2 threads: the 3B shape's batch-1 decode (the offline API, 256 tokens, alternated twice)
// 17.0 / 16.4 -> 19.9 / 19.0 tok/s; bench_gemv.py paired, 1 / 2 / 3 rows Q4_K 38 vs 35 GB/s,
// 136 vs 130, 180 vs 175 GMAC/s, Q6_K 43 vs 39 GB/s, 92 vs 89, 133 vs 127; from 4 rows side by
// side is as fast or faster (8 rows Q4_K 387 vs 357).
constexpr int64_t kOneGroupRows = 3;

// `groups` (1 or 2) groups of 16 outputs at src, `stride` bytes apart, for all M rows, kRows
// at a time.
template <int64_t F, bool kDecoded>
void row_blocks(int groups, int64_t M, const int8_t* a, const float* sc, int64_t K,
                const uint8_t* src, int64_t stride, const float* bias, float* y, int64_t ldy,
                int64_t n0, int64_t N) {
  constexpr int R = Fmt<F>::kRows;
  const int64_t B = K / 32;
  for (int64_t r0 = 0; r0 < M; r0 += R) {
    const int rows = (int)(M - r0 < R ? M - r0 : R);
    const int8_t* ar = a + r0 * 2 * K;
    const float* sr = sc + r0 * B * kActFloats;
    float* yr = y + r0 * ldy;
    if (kGroups == 2 && groups == 2 && M > kOneGroupRows) {
      rows_ng<F, 2, kDecoded>(rows, ar, sr, K, src, bias, yr, ldy, n0, N);
      continue;
    }
    for (int g = 0; g < groups; ++g)
      rows_ng<F, 1, kDecoded>(rows, ar, sr, K, src + g * stride, bias, yr, ldy, n0 + 16 * g,
                              N);
  }
}

// One work item: `groups` (1 or 2) groups of 16 outputs at w for all M rows; with `dec`
// (dec_buffer_bytes, given where decodes() holds) through their decoded bytes.
template <int64_t F>
void dot_groups(int groups, int64_t M, const int8_t* a, const float* sc, int64_t K,
                const uint8_t* w, uint8_t* dec, const float* bias, float* y, int64_t ldy,
                int64_t n0, int64_t N) {
  const int64_t B = K / 32, group_stride = B / Fmt<F>::U * Fmt<F>::kUnitBytes;
  if constexpr (F != kQ8_0) {
    if (dec) {
      const int64_t dec_stride = Fmt<F>::kSuper ? dec_group_bytes(B) : B * Dec<F>::kBlock;
      for (int g = 0; g < groups; ++g) {
        if constexpr (Fmt<F>::kSuper)
          decode_kgroup<F>(w + g * group_stride, B, dec + g * dec_stride);
        else
          decode_group<F>(w + g * group_stride, B, dec + g * dec_stride);
      }
      return row_blocks<F, true>(groups, M, a, sc, K, dec, dec_stride, bias, y, ldy, n0, N);
    }
  }
  if constexpr (kHeld<F> || kHeldPairs<F>) {
    if (M >= (kHeld<F> ? kHeldMinRows : kHeldPairsMinRows)) {
      for (int64_t r0 = 0; r0 < M; r0 += kHeldRows) {
        const int64_t rows = M - r0 < kHeldRows ? M - r0 : kHeldRows;
        const int8_t* ar = a + r0 * 2 * K;
        const float* sr = sc + r0 * B * kActFloats;
        if (groups == 2)
          dot_held<F, 2>(rows, ar, sr, K, w, bias, y + r0 * ldy, ldy, n0, N);
        else
          dot_held<F, 1>(rows, ar, sr, K, w, bias, y + r0 * ldy, ldy, n0, N);
      }
      return;
    }
  }
  row_blocks<F, false>(groups, M, a, sc, K, w, group_stride, bias, y, ldy, n0, N);
}

void dispatch(int64_t f, int groups, int64_t M, const int8_t* a, const float* sc, int64_t K,
              const uint8_t* w, uint8_t* dec, const float* bias, float* y, int64_t ldy,
              int64_t n0, int64_t N) {
  switch (f) {
    case kQ4_0: return dot_groups<kQ4_0>(groups, M, a, sc, K, w, dec, bias, y, ldy, n0, N);
    case kQ4_1: return dot_groups<kQ4_1>(groups, M, a, sc, K, w, dec, bias, y, ldy, n0, N);
    case kQ5_0: return dot_groups<kQ5_0>(groups, M, a, sc, K, w, dec, bias, y, ldy, n0, N);
    case kQ5_1: return dot_groups<kQ5_1>(groups, M, a, sc, K, w, dec, bias, y, ldy, n0, N);
    case kQ8_0: return dot_groups<kQ8_0>(groups, M, a, sc, K, w, dec, bias, y, ldy, n0, N);
    case kQ4_K: return dot_groups<kQ4_K>(groups, M, a, sc, K, w, dec, bias, y, ldy, n0, N);
    case kQ5_K: return dot_groups<kQ5_K>(groups, M, a, sc, K, w, dec, bias, y, ldy, n0, N);
    case kQ6_K: return dot_groups<kQ6_K>(groups, M, a, sc, K, w, dec, bias, y, ldy, n0, N);
  }
}

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
// Tiles (amx_configure, simd.h: all 16 rows x 64 bytes): tmm0/1 sums, tmm4/5 activations,
// tmm6/7 weights, for even/odd blocks. The legacy 4-bit formats only (U = 1, no high bits).

// One group's blocks -> B tiles [B][16 rows][64]: 16q for k-steps 0..7, then q.
void unpack_group(const uint8_t* w, int64_t B, int64_t unit, uint8_t* out) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), high4 = _mm512_set1_epi8((char)0xF0);
  for (int64_t b = 0; b < B; ++b) {
    uint8_t* dst = out + b * 1024;
    for (int v = 0; v < 4; ++v) {
      __m512i raw = _mm512_loadu_si512((const void*)(w + b * unit + v * 64));
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
// same epilogue as the VNNI path. Even and odd blocks use their own tiles and buffer, so one
// block's tile work overlaps the other's epilogue.
template <int64_t F>
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
    vf d[2], m[2];
    block_scales<F>(w + b * Fmt<F>::kUnitBytes, 0, 0, d, m);
    for (int r = 0; r < 16; ++r) {
      const float* f = sc + kActFloats * (r * B + b);
      acc[r] = sub_block(acc[r], iload(c[b & 1][r]), d[0], m[0], f[0], f[1]);
    }
  }
  for (int r = 0; r < rows; ++r) store_out(acc[r], bias, y + r * ldy, n0, N);
}

template <int64_t F>
void amx_groups(int groups, int64_t M, const int8_t* a, const float* sc, int64_t K,
                const uint8_t* w, uint8_t* tiles, const float* bias, float* y, int64_t ldy,
                int64_t n0, int64_t N) {
  const int64_t B = K / 32, stride = B * Fmt<F>::kUnitBytes;
  for (int g = 0; g < groups; ++g) unpack_group(w + g * stride, B, Fmt<F>::kUnitBytes,
                                                tiles + g * B * 1024);
  for (int64_t r0 = 0; r0 < M; r0 += 16)
    for (int g = 0; g < groups; ++g)
      amx_group<F>((int)(M - r0 < 16 ? M - r0 : 16), a + r0 * 2 * K, sc + r0 * B * kActFloats,
                   K, w + g * stride, tiles + g * B * 1024, bias, y + r0 * ldy, ldy,
                   n0 + 16 * g, N);
}
#endif

}  // namespace

extern "C" {

// One part of a linear layer: N outputs of one format, written at the next columns of y.
struct BlockPart {
  int64_t format;
  const uint8_t* packed;
  int64_t n;
  const float* bias;  // [n] or NULL
};

// Whether Q4_K and Q5_K keep their codes in registers at every row count instead of decoding
// from kDecodeRowsK4 / K5 rows (AVX-512 builds on AMD Zen 4; see zen4()): set < 0 asks,
// 0 / 1 sets (tests; AVX-512 builds only, elsewhere it stays 0). The bits are the same either way.
int rs_held_kquants(int set) {
  if (set >= 0 && kW == 16) g_held_kquants = set != 0;
  return g_held_kquants ? 1 : 0;
}

// The packed size of an N x K matrix of `format` (K a multiple of 32, of 256 for K-quants; any
// K >= 1 for F16 / BF16); 0 for an unknown format or a K that does not fit.
int64_t rs_block_packed_bytes(int64_t format, int64_t N, int64_t K) {
  if (format < 0 || format >= kNumFormats || K < 1) return 0;
  if (is_half(format)) return (N + 15) / 16 * 16 * K * 2;
  if (is_tile(format)) return (N + 15) / 16 * 16 * tile_row_bytes(format, K);
  if (K % (32 * unit_blocks(format))) return 0;
  return (N + 15) / 16 * (K / 32 / unit_blocks(format)) * unit_bytes(format);
}

// x [M, K] float32 (K a multiple of 32 where a part is block quantized) -> y [M, sum of the
// parts' n] float32 (row stride ldy), the parts' outputs side by side. Returns 0, 1 when
// scratch cannot be allocated, 2 for a bad format or K, 3 for a codebook type before
// rs_tile_grids.
int rs_block_linear(const float* x, int64_t M, int64_t K, const BlockPart* parts,
                    int64_t nparts, float* y, int64_t ldy) {
  // legacy, K-quant, 16-bit and tile parts
  bool quantized = false, kquants = false, half = false, tiled = false;
  for (int64_t p = 0; p < nparts; ++p) {
    const int64_t f = parts[p].format;
    if (!rs_block_packed_bytes(f, 1, K)) return 2;
    (is_half(f) ? half : is_kquant(f) ? kquants : is_tile(f) ? tiled : quantized) = true;
  }
  const int64_t B = K / 32;
  const bool amx = quantized && rs_amx_enabled() && M >= kAmxMinRows;
  const int64_t Mp = amx ? (M + 15) / 16 * 16 : M;  // AMX reads whole 16-row tiles
  // tile parts by AMX from as many rows (tile_item: 2 where the legacy parts' tiles are set up)
  const int tile_amx = tiled && rs_amx_enabled() && M >= kAmxMinRows ? (amx ? 2 : 1) : 0;
  // the activations in 8 bits: per block for the legacy parts (a, sc), per super-block for
  // the K-quants (ak, ka)
  using scratch::get;
  int8_t* a = quantized ? (int8_t*)get(scratch::kActivations, (size_t)(Mp * 2 * K)) : nullptr;
  float* sc = quantized ? (float*)get(scratch::kActScales,
                                      (size_t)(Mp * B * kActFloats) * sizeof(float))
                        : nullptr;
  int8_t* ak = kquants ? (int8_t*)get(scratch::kKActivations, (size_t)(M * 2 * K)) : nullptr;
  KAct* ka = kquants ? (KAct*)get(scratch::kKScales, (size_t)(M * B) * sizeof(KAct)) : nullptr;
  int8_t* at = tiled ? (int8_t*)get(scratch::kTileActivations, (size_t)(M * K)) : nullptr;
  TileAct* ta = tiled ? (TileAct*)get(scratch::kTileScales, (size_t)(M * B) * sizeof(TileAct))
                      : nullptr;
  int64_t* first = (int64_t*)get(scratch::kItems, (size_t)(nparts + 1) * 2 * sizeof(int64_t));
  if ((quantized && (!a || !sc)) || (kquants && (!ak || !ka)) || (tiled && (!at || !ta)) ||
      !first)
    return 1;
  if (Mp > M) {
    memset(a + M * 2 * K, 0, (size_t)((Mp - M) * 2 * K));
    memset(sc + M * B * kActFloats, 0, (size_t)((Mp - M) * B * kActFloats) * sizeof(float));
  }
  if (quantized || kquants || tiled) {
#pragma omp parallel for schedule(static) if (M >= 16)
    for (int64_t r = 0; r < M; ++r) {
      if (quantized) quantize_row(x + r * K, K, a + r * 2 * K, sc + r * B * kActFloats);
      if (kquants) quantize_row_k(x + r * K, K, ak + r * 2 * K, ka + r * B);
      if (tiled) tile_quantize_row(x + r * K, K, at + r * K, ta + r * B);
    }
  }
  // work items, part after part: a block part's are row chunks of `block_rows` rows x pairs of
  // groups of 16 outputs, the pairs of one row chunk consecutive; a 16-bit part's are
  // kHalfGroups groups x kHalfRows rows, row chunks of one strip consecutive.
  // first[p] = the part's first item, first[nparts + 1 + p] = its first output column
  const int64_t row_chunks = (M + kHalfRows - 1) / kHalfRows;
  int64_t block_rows = kActChunkBytes / (B * 64 > 0 ? B * 64 : 1) / 16 * 16;
  block_rows = block_rows < 16 ? 16 : block_rows;
  block_rows = block_rows > Mp ? Mp : block_rows;  // AMX: whole 16-row tiles
  const int64_t block_chunks = (M + block_rows - 1) / block_rows;
  // a tile part's items: pairs of groups of 16 outputs x chunks of rows whose activations (K
  // bytes a row) are about kActChunkBytes, the pair's decoded tiles read by every row of the
  // chunk
  int64_t tile_rows = kActChunkBytes / K;
  tile_rows = tile_rows < 16 ? 16 : tile_rows;
  const int64_t tile_chunks = (M + tile_rows - 1) / tile_rows;
  int64_t* col = first + nparts + 1;
  first[0] = 0;
  for (int64_t p = 0, c = 0; p < nparts; ++p) {
    col[p] = c;
    c += parts[p].n;
    const int64_t N16 = (parts[p].n + 15) / 16;
    first[p + 1] = first[p] + (is_half(parts[p].format)
                                   ? (N16 + kHalfGroups - 1) / kHalfGroups * row_chunks
                               : is_tile(parts[p].format) ? (N16 + 1) / 2 * tile_chunks
                                                          : (N16 + 1) / 2 * block_chunks);
  }
  const int64_t items = first[nparts];
  const int chunk = (int)(items / 16 > 1 ? items / 16 : 1);  // dynamic: see int8_linear.cpp
  const bool widen = half && M >= kHalfWidenRows;
  int failed = 0;
#pragma omp parallel
  {
    float* strip = widen ? (float*)get(scratch::kHalfStrip,
                                       (size_t)(kHalfGroups * 16 * K) * sizeof(float))
                         : nullptr;
    if (widen && !strip) {
#pragma omp atomic write
      failed = 1;
    }
    // decode_group's buffer, where a part decodes
    bool any_decodes = false;
    for (int64_t p = 0; p < nparts; ++p)
      any_decodes |= !is_half(parts[p].format) && !is_tile(parts[p].format) &&
                     decodes(parts[p].format, M);
    uint8_t* tile_dec = tiled ? (uint8_t*)get(scratch::kTileDecoded,
                                              (size_t)(2 * tile_decoded_bytes(K)))
                              : nullptr;
    if (tiled && !tile_dec) {
#pragma omp atomic write
      failed = 1;
    }
    uint8_t* dec = any_decodes ? (uint8_t*)get(scratch::kDecoded, (size_t)dec_buffer_bytes(B))
                               : nullptr;
    if (any_decodes && !dec) {
#pragma omp atomic write
      failed = 1;
    }
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
    uint8_t* tiles = amx ? (uint8_t*)get(scratch::kTiles, (size_t)(2 * B * 1024)) : nullptr;
    if (amx && !tiles) {
#pragma omp atomic write
      failed = 1;
    }
    if (tiles) amx_configure();
#endif
#pragma omp for schedule(dynamic, chunk)
    for (int64_t it = 0; it < items; ++it) {
      int64_t p = 0;
      while (first[p + 1] <= it) ++p;
      const BlockPart& part = parts[p];
      const int64_t N16 = (part.n + 15) / 16;
      float* yp = y + col[p];
      if (is_half(part.format)) {
        if (widen && !strip) continue;
        const int64_t g0 = (it - first[p]) / row_chunks * kHalfGroups;
        const int64_t r0 = (it - first[p]) % row_chunks * kHalfRows;
        const int groups = (int)(N16 - g0 < kHalfGroups ? N16 - g0 : kHalfGroups);
        half_linear_item(part.format == kBF16, groups, M - r0 < kHalfRows ? M - r0 : kHalfRows,
                         x + r0 * K, K, (const uint16_t*)part.packed + g0 * 16 * K, strip,
                         part.bias, yp + r0 * ldy, ldy, g0 * 16, part.n);
        continue;
      }
      if (is_tile(part.format)) {
        if (!tile_dec) continue;
        const int64_t pairs = (N16 + 1) / 2;
        const int64_t g = 2 * ((it - first[p]) % pairs), r0 = (it - first[p]) / pairs * tile_rows;
        if (!tile_item(part.format, g + 1 < N16 ? 2 : 1, M - r0 < tile_rows ? M - r0 : tile_rows,
                       at + r0 * K, ta + r0 * B, K,
                       part.packed + g * 16 * tile_row_bytes(part.format, K), tile_dec,
                       part.bias, yp + r0 * ldy, ldy, g * 16, part.n, tile_amx)) {
#pragma omp atomic write
          failed = 3;
        }
        continue;
      }
      const int64_t pairs = (N16 + 1) / 2;
      const int64_t g0 = 2 * ((it - first[p]) % pairs);
      const int64_t r0 = (it - first[p]) / pairs * block_rows;
      const int64_t rows = M - r0 < block_rows ? M - r0 : block_rows;
      const int groups = g0 + 1 < N16 ? 2 : 1;
      const int64_t stride = B / unit_blocks(part.format) * unit_bytes(part.format);
      const uint8_t* w = part.packed + g0 * stride;
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
      if (amx && (part.format == kQ4_0 || part.format == kQ4_1)) {
        if (!tiles) continue;
        const int8_t* ar = a + r0 * 2 * K;
        const float* sr = sc + r0 * B * kActFloats;
        float* yr = yp + r0 * ldy;
        if (part.format == kQ4_0)
          amx_groups<kQ4_0>(groups, rows, ar, sr, K, w, tiles, part.bias, yr, ldy, g0 * 16,
                            part.n);
        else
          amx_groups<kQ4_1>(groups, rows, ar, sr, K, w, tiles, part.bias, yr, ldy, g0 * 16,
                            part.n);
        continue;
      }
#endif
      if (any_decodes && !dec) continue;
      const bool kq = is_kquant(part.format);
      dispatch(part.format, groups, rows, (kq ? ak : a) + r0 * 2 * K,
               kq ? (const float*)(ka + r0 * B) : sc + r0 * B * kActFloats, K, w,
               decodes(part.format, rows) ? dec : nullptr, part.bias, yp + r0 * ldy, ldy, g0 * 16,
               part.n);
    }
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
    if (tiles) _tile_release();
#endif
  }
  return failed;
}

}  // extern "C"

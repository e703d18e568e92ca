// The rest of GGUF's types, as stored: Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0,
// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, multiplied by one int8 kernel.
//
// Why by hand: no library multiplies these blocks, and their bits must be read as stored
// (a float or int8 copy would take 2-8x the file's memory and bandwidth).
//
// Every one of these types is, per sub-block of 16 or 32 weights, W = d * q + m with a signed
// 8-bit integer q and floats d, m formed exactly from the stored fields (an f16 times a small
// integer, or a power of two): Q2_K q = 0..3, d = D * sc, m = -Dmin * min (the only type with
// an m); Q3_K q = -4..3, d = D * (sc - 32); IQ4_NL / IQ4_XS q = the 16-value codebook's entry
// (-127..113), d = D (IQ4_XS: D * (sc - 32)); MXFP4 q = twice the e2m1 value (-12..12), d = the
// e8m0 scale / 2; TQ1_0 / TQ2_0 q = -1..1, d = D; IQ2 / IQ3 q = a codebook entry (gguf-py's
// grids, given at start by rs_tile_grids) times its sign, d = D * (0.5 + sc) / 4 (IQ3_XXS / 2,
// IQ3_S D * (1 + 2 sc)); IQ1_S / IQ1_M q = 8 * grid (-1, 0, 1) + sign(delta), d = D * (2 sc +
// 1) / 8 (the +-1/8 delta folded into the integer).
//
// A work item is one group of 16 outputs over M rows. It first decodes the group's blocks,
// all of K, into an int8 tile [K / 4][16 outputs][4 k] (vpdpbusd's operand order: 16 outputs
// x 4 k-steps a vector) and the floats d, m [K / sub][16] (decode_group, in a buffer of its
// thread's), then multiplies every row of the item with that tile (dot_rows): the decoding,
// where these types spend their time, runs once per item, not once per row - ik_llama.cpp's
// idea of converting any type to one interleaved int8 layout for one GEMM.
//
// Numerics. Activations are rounded per row and block of 32, as llama.cpp's Q8_1: s =
// max(max|x|, 1e-30) / 127, hi = round(x / s) (tile_quantize_row). Per sub-block the sum C =
// sum q * hi is exact in int32, then, sub-block after sub-block in k order, per output:
//     acc = d * (float(C) * s) + acc          (the product one rounding, then an FMA)
//     acc = m * (s * sum hi) + acc            (Q2_K only)
// and y = acc (+ bias). The tile order is fixed by K alone: every row runs the same integer
// sums and these float steps in this order whatever its batch, chunk or register block, so a
// row's output is bit-identical alone or in any batch (M = 1 is the same code as M = 2,048).
#include "tile_linear.h"

#include <omp.h>
#include <stdint.h>
#include <string.h>

#include <initializer_list>
#include <utility>

#include "simd.h"

namespace {

using namespace simd;

enum : int64_t { kQ2_K = 10, kQ3_K, kIQ4_NL, kIQ4_XS, kMXFP4, kTQ1_0, kTQ2_0, kIQ2_XXS,
                 kIQ2_XS, kIQ2_S, kIQ3_XXS, kIQ3_S, kIQ1_S, kIQ1_M };

// Per format: weights a block, bytes a block, weights a sub-block (one d and m), codebooks.
template <int64_t F>
struct Tile {
  static constexpr int kBlock = (F == kIQ4_NL || F == kMXFP4) ? 32 : 256;
  static constexpr int kBytes = F == kQ2_K ? 84 : F == kQ3_K ? 110 : F == kIQ4_NL ? 18
                                : F == kIQ4_XS ? 136 : F == kMXFP4 ? 17 : F == kTQ1_0 ? 54
                                : F == kTQ2_0 ? 66 : F == kIQ2_XXS ? 66 : F == kIQ2_XS ? 74
                                : F == kIQ2_S ? 82 : F == kIQ3_XXS ? 98 : F == kIQ3_S ? 110
                                : F == kIQ1_S ? 50 : 56;
  static constexpr int kSub = (F == kQ2_K || F == kQ3_K || F == kIQ2_XS || F == kIQ2_S ||
                               F == kIQ1_M) ? 16 : 32;
  static constexpr bool kMins = F == kQ2_K;
  static constexpr bool kGrids = F >= kIQ2_XXS;
};

// gguf-py's codebooks (rs_tile_grids), as signed bytes: IQ2 8 values an entry, IQ3 4, IQ1 8.
int8_t g_iq2xxs[256 * 8], g_iq2xs[512 * 8], g_iq2s[1024 * 8], g_iq3xxs[256 * 4],
    g_iq3s[512 * 4], g_iq1s[2048 * 8];
uint8_t g_ksigns[128];
bool g_have_grids = false;
// The 4-bit codebooks are part of the formats' definitions (ggml-common.h's kvalues).
constexpr int8_t kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1, 13, 25, 38, 53, 69, 89, 113};
constexpr int8_t kMxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

inline float f16(const uint8_t* p) {  // an IEEE half at p, exactly
  uint16_t h;
  memcpy(&h, p, 2);
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  float f;
  if (e == 0) {
    f = (float)m * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -f : f;
  }
  const uint32_t bits = sign | (e == 31 ? 0x7F800000u | (m << 13) : ((e + 112) << 23) | (m << 13));
  memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t u16(const uint8_t* p) { uint16_t v; memcpy(&v, p, 2); return v; }
inline uint32_t u32(const uint8_t* p) { uint32_t v; memcpy(&v, p, 4); return v; }

// Eight codebook values at g with the signs of the bits of `signs` (bit i: value i negated).
inline void signed8(const int8_t* g, unsigned signs, int8_t* q) {
  for (int i = 0; i < 8; ++i) q[i] = (signs >> i) & 1 ? (int8_t)-g[i] : g[i];
}

// Block b of a row -> its kBlock codes q, and per sub-block d (and m).
template <int64_t F>
inline void decode_block(const uint8_t* b, int8_t* q, float* d, float* m) {
  if constexpr (F == kQ2_K || F == kTQ2_0 || F == kQ3_K) {
    const uint8_t* qs = F == kQ3_K ? b + 32 : F == kQ2_K ? b + 16 : b;
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < 4; ++s)
        for (int i = 0; i < 32; ++i) {
          const int e = 128 * h + 32 * s + i;
          int v = (qs[32 * h + i] >> (2 * s)) & 3;
          if constexpr (F == kQ3_K) v -= ((b[i] >> (e / 32)) & 1) ? 0 : 4;
          if constexpr (F == kTQ2_0) v -= 1;
          q[e] = (int8_t)v;
        }
    if constexpr (F == kQ2_K) {
      const float D = f16(b + 80), Dmin = f16(b + 82);
      for (int j = 0; j < 16; ++j) {
        d[j] = D * (float)(b[j] & 15);
        m[j] = -(Dmin * (float)(b[j] >> 4));
      }
    } else if constexpr (F == kQ3_K) {
      const uint8_t* sc = b + 96;
      const float D = f16(b + 108);
      for (int j = 0; j < 16; ++j) {
        const int lo = j < 8 ? sc[j] & 15 : sc[j - 8] >> 4;
        const int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        d[j] = D * (float)((lo | hi << 4) - 32);
      }
    } else {
      for (int j = 0; j < 8; ++j) d[j] = f16(b + 64);
    }
  } else if constexpr (F == kTQ1_0) {
    static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
    auto trit = [](uint8_t byte, int n) {  // the n-th base-3 digit, as ggml stores it
      const uint8_t t = (uint8_t)(byte * kPow3[n]);
      return (int8_t)(((uint16_t)t * 3 >> 8) - 1);
    };
    for (int n = 0; n < 5; ++n)
      for (int i = 0; i < 32; ++i) q[32 * n + i] = trit(b[i], n);
    for (int n = 0; n < 5; ++n)
      for (int i = 0; i < 16; ++i) q[160 + 16 * n + i] = trit(b[32 + i], n);
    for (int n = 0; n < 4; ++n)
      for (int i = 0; i < 4; ++i) q[240 + 4 * n + i] = trit(b[48 + i], n);
    for (int j = 0; j < 8; ++j) d[j] = f16(b + 52);
  } else if constexpr (F == kIQ4_NL || F == kMXFP4) {
    const int8_t* kv = F == kIQ4_NL ? kIq4nl : kMxfp4;
    const uint8_t* qs = b + (F == kIQ4_NL ? 2 : 1);
    for (int i = 0; i < 16; ++i) {
      q[i] = kv[qs[i] & 15];
      q[16 + i] = kv[qs[i] >> 4];
    }
    if constexpr (F == kIQ4_NL) {
      d[0] = f16(b);
    } else {  // e8m0 / 2: 2^(e - 128), e = 0 and 1 subnormal
      const uint32_t bits = b[0] < 2 ? 0x00200000u << b[0] : (uint32_t)(b[0] - 1) << 23;
      memcpy(&d[0], &bits, 4);
    }
  } else if constexpr (F == kIQ4_XS) {
    const float D = f16(b);
    const uint16_t sh = u16(b + 2);
    for (int j = 0; j < 8; ++j) {
      const uint8_t* qs = b + 8 + 16 * j;
      for (int i = 0; i < 16; ++i) {
        q[32 * j + i] = kIq4nl[qs[i] & 15];
        q[32 * j + 16 + i] = kIq4nl[qs[i] >> 4];
      }
      const int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4);
      d[j] = D * (float)(ls - 32);
    }
  } else if constexpr (F == kIQ2_XXS || F == kIQ3_XXS) {
    const float D = f16(b);
    for (int j = 0; j < 8; ++j) {
      const uint32_t aux = F == kIQ2_XXS ? u32(b + 2 + 8 * j + 4) : u32(b + 66 + 4 * j);
      for (int l = 0; l < 4; ++l) {
        const unsigned signs = g_ksigns[(aux >> (7 * l)) & 127];
        if constexpr (F == kIQ2_XXS) {
          signed8(g_iq2xxs + 8 * b[2 + 8 * j + l], signs, q + 32 * j + 8 * l);
        } else {
          int8_t g[8];
          memcpy(g, g_iq3xxs + 4 * b[2 + 8 * j + 2 * l], 4);
          memcpy(g + 4, g_iq3xxs + 4 * b[2 + 8 * j + 2 * l + 1], 4);
          signed8(g, signs, q + 32 * j + 8 * l);
        }
      }
      d[j] = D * (0.5f + (float)(aux >> 28)) * (F == kIQ2_XXS ? 0.25f : 0.5f);
    }
  } else if constexpr (F == kIQ2_XS || F == kIQ2_S) {
    const float D = f16(b);
    const uint8_t* sc = b + (F == kIQ2_XS ? 66 : 74);
    for (int i = 0; i < 32; ++i) {
      unsigned idx, signs;
      if constexpr (F == kIQ2_XS) {
        const uint16_t v = u16(b + 2 + 2 * i);
        idx = v & 511;
        signs = g_ksigns[v >> 9];
        signed8(g_iq2xs + 8 * idx, signs, q + 8 * i);
      } else {
        idx = b[2 + i] | (((b[66 + i / 4] >> (2 * (i % 4))) & 3) << 8);
        signs = b[34 + i];
        signed8(g_iq2s + 8 * idx, signs, q + 8 * i);
      }
    }
    for (int j = 0; j < 16; ++j)
      d[j] = D * (0.5f + (float)((sc[j / 2] >> (4 * (j % 2))) & 15)) * 0.25f;
  } else if constexpr (F == kIQ3_S) {
    const float D = f16(b);
    for (int i = 0; i < 64; i += 2) {
      int8_t g[8];
      for (int t = 0; t < 2; ++t) {
        const unsigned idx = b[2 + i + t] | (((b[66 + (i + t) / 8] >> ((i + t) % 8)) & 1) << 8);
        memcpy(g + 4 * t, g_iq3s + 4 * idx, 4);
      }
      signed8(g, b[74 + i / 2], q + 4 * i);
    }
    for (int j = 0; j < 8; ++j) d[j] = D * (float)(1 + 2 * ((b[106 + j / 2] >> (4 * (j % 2))) & 15));
  } else if constexpr (F == kIQ1_S) {
    const float D = f16(b);
    for (int j = 0; j < 8; ++j) {
      const uint16_t h = u16(b + 34 + 2 * j);
      const int8_t delta = h & 0x8000 ? -1 : 1;
      for (int l = 0; l < 4; ++l) {
        const int8_t* g = g_iq1s + 8 * (b[2 + 4 * j + l] | (((h >> (3 * l)) & 7) << 8));
        for (int i = 0; i < 8; ++i) q[32 * j + 8 * l + i] = (int8_t)(8 * g[i] + delta);
      }
      d[j] = D * (float)(2 * ((h >> 12) & 7) + 1) * 0.125f;
    }
  } else if constexpr (F == kIQ1_M) {
    uint16_t sc[4];
    for (int i = 0; i < 4; ++i) sc[i] = u16(b + 48 + 2 * i);
    const uint16_t dbits = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) |
                                      ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000));
    uint8_t dh[2];
    memcpy(dh, &dbits, 2);
    const float D = f16(dh);
    for (int i = 0; i < 32; ++i) {
      const int nib = (b[32 + i / 2] >> (4 * (i % 2))) & 15;
      const int8_t* g = g_iq1s + 8 * (b[i] | ((nib & 7) << 8));
      const int8_t delta = nib & 8 ? -1 : 1;
      for (int t = 0; t < 8; ++t) q[8 * i + t] = (int8_t)(8 * g[t] + delta);
    }
    for (int j = 0; j < 16; ++j)
      d[j] = D * (float)(2 * ((sc[j / 4] >> (3 * (j % 4))) & 7) + 1) * 0.125f;
  }
}

// The decoded group: codes [K / 4][16][4], then d [K / sub][16], then (Q2_K) m [K / sub][16].
template <int64_t F>
void decode_group(const uint8_t* group, int64_t K, uint8_t* dec) {
  using T = Tile<F>;
  constexpr int kSubs = T::kBlock / T::kSub;
  const int64_t blocks = K / T::kBlock;
  int32_t* codes = (int32_t*)dec;
  float* d = (float*)(dec + 4 * K * 4);
  float* m = d + K / T::kSub * 16;
  alignas(64) int8_t q[256];
  float dd[16], mm[16];
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const uint8_t* src = group + blk * 16 * T::kBytes;
    for (int64_t at = 0; at < 16 * T::kBytes; at += 64)  // the next block's 16 rows
      __builtin_prefetch((const char*)src + 16 * T::kBytes + at);
    for (int r = 0; r < 16; ++r) {
      decode_block<F>(src + r * T::kBytes, q, dd, mm);
      int32_t* c = codes + blk * (T::kBlock / 4) * 16 + r;
      for (int s = 0; s < T::kBlock / 4; ++s) memcpy(c + 16 * s, q + 4 * s, 4);
      for (int j = 0; j < kSubs; ++j) {
        d[(blk * kSubs + j) * 16 + r] = dd[j];
        if constexpr (T::kMins) m[(blk * kSubs + j) * 16 + r] = mm[j];
      }
    }
  }
}

constexpr int kV = 16 / kW;  // vectors across a group's 16 outputs

// R rows x the group's 16 outputs over all of K from the decoded tile (the header's order).
template <int64_t F, int R>
void dot_rows(const int8_t* a, const TileAct* t, int64_t K, const uint8_t* dec,
              const float* bias, float* y, int64_t ldy, int64_t n0, int64_t N) {
  using T = Tile<F>;
  const int64_t B = K / 32;
  const uint8_t* codes = dec;
  const float* d = (const float*)(dec + 4 * K * 4);
  const float* m = d + K / T::kSub * 16;
  vf acc[R][kV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kV; ++v) acc[r][v] = zero();
  for (int64_t j = 0; j < K / T::kSub; ++j) {
    vi H[R][kV];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < kV; ++v) H[r][v] = izero();
    for (int s = 0; s < T::kSub / 4; ++s) {
      const uint8_t* qs = codes + (j * (T::kSub / 4) + s) * 64;
      vi q[kV];
      for (int v = 0; v < kV; ++v) q[v] = iload(qs + 4 * kW * v);
      for (int r = 0; r < R; ++r) {
        const vi x = bcast4(a + r * K + j * T::kSub + 4 * s);
        for (int v = 0; v < kV; ++v) H[r][v] = dot_s8(H[r][v], q[v], x);
      }
    }
    for (int r = 0; r < R; ++r) {
      const TileAct& x = t[r * B + j * T::kSub / 32];
      const bool second = T::kSub == 16 && (j & 1);
      const int h = T::kSub == 32 ? x.h0 + x.h1 : second ? x.h1 : x.h0;
      const vf s = set1(x.s);
      for (int v = 0; v < kV; ++v) {
        const vi C = kQ8Offset ? isub(H[r][v], iset1(kQ8Offset * h)) : H[r][v];
        acc[r][v] = fmadd(load(d + j * 16 + v * kW), mul(to_float(C), s), acc[r][v]);
        if constexpr (T::kMins)
          acc[r][v] = fmadd(load(m + j * 16 + v * kW), set1(second ? x.S1 : x.S0), acc[r][v]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kV; ++v) {
      const int64_t n = n0 + v * kW;
      if (n >= N) continue;
      vf out = acc[r][v];
      if (bias) out = add(out, load_n(bias + n, N - n));
      store_n(y + r * ldy + n, out, N - n);
    }
}

// Rows per register block: AVX-512 holds 4 rows' sums and accumulators of one vector each;
// below it a group is two vectors a row.
constexpr int kRows = kW == 16 ? 4 : 2;

template <int64_t F>
void item(int64_t M, const int8_t* a, const TileAct* t, int64_t K, const uint8_t* group,
          uint8_t* dec, const float* bias, float* y, int64_t ldy, int64_t n0, int64_t N) {
  decode_group<F>(group, K, dec);
  const int64_t B = K / 32;
  int64_t r = 0;
  for (; r + kRows <= M; r += kRows)
    dot_rows<F, kRows>(a + r * K, t + r * B, K, dec, bias, y + r * ldy, ldy, n0, N);
  for (; r < M; ++r) dot_rows<F, 1>(a + r * K, t + r * B, K, dec, bias, y + r * ldy, ldy, n0, N);
}

template <int64_t F>
void pack(const uint8_t* raw, int64_t N, int64_t K, uint8_t* out) {
  using T = Tile<F>;
  const int64_t blocks = K / T::kBlock, groups = (N + 15) / 16;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* dst = out + g * 16 * blocks * T::kBytes;
    for (int lane = 0; lane < 16; ++lane) {
      const int64_t row = 16 * g + lane;
      for (int64_t b = 0; b < blocks; ++b) {
        uint8_t* to = dst + (b * 16 + lane) * T::kBytes;
        if (row < N)
          memcpy(to, raw + (row * blocks + b) * T::kBytes, T::kBytes);
        else
          memset(to, 0, T::kBytes);
      }
    }
  }
}

template <template <int64_t> class Fn, typename... Args>
inline bool by_format(int64_t f, Args... args) {
  switch (f) {
    case kQ2_K: Fn<kQ2_K>::run(args...); return true;
    case kQ3_K: Fn<kQ3_K>::run(args...); return true;
    case kIQ4_NL: Fn<kIQ4_NL>::run(args...); return true;
    case kIQ4_XS: Fn<kIQ4_XS>::run(args...); return true;
    case kMXFP4: Fn<kMXFP4>::run(args...); return true;
    case kTQ1_0: Fn<kTQ1_0>::run(args...); return true;
    case kTQ2_0: Fn<kTQ2_0>::run(args...); return true;
    case kIQ2_XXS: Fn<kIQ2_XXS>::run(args...); return true;
    case kIQ2_XS: Fn<kIQ2_XS>::run(args...); return true;
    case kIQ2_S: Fn<kIQ2_S>::run(args...); return true;
    case kIQ3_XXS: Fn<kIQ3_XXS>::run(args...); return true;
    case kIQ3_S: Fn<kIQ3_S>::run(args...); return true;
    case kIQ1_S: Fn<kIQ1_S>::run(args...); return true;
    case kIQ1_M: Fn<kIQ1_M>::run(args...); return true;
  }
  return false;
}

template <int64_t F>
struct ItemFn {
  static void run(int64_t M, const int8_t* a, const TileAct* t, int64_t K, const uint8_t* g,
                  uint8_t* dec, const float* bias, float* y, int64_t ldy, int64_t n0,
                  int64_t N) {
    item<F>(M, a, t, K, g, dec, bias, y, ldy, n0, N);
  }
};
template <int64_t F>
struct PackFn {
  static void run(const uint8_t* raw, int64_t N, int64_t K, uint8_t* out) {
    pack<F>(raw, N, K, out);
  }
};
template <int64_t F>
struct SizeFn {
  static void run(int64_t K, int64_t* bytes) {
    *bytes = K % Tile<F>::kBlock ? 0 : K / Tile<F>::kBlock * Tile<F>::kBytes;
  }
};

}  // namespace

int64_t tile_row_bytes(int64_t f, int64_t K) {
  int64_t bytes = 0;
  if (K <= 0 || !by_format<SizeFn>(f, K, &bytes)) return 0;
  return bytes;
}

void tile_quantize_row(const float* x, int64_t K, int8_t* a, TileAct* t) {
  for (int64_t b = 0; b < K / 32; ++b) {
    const float* xb = x + 32 * b;
    vf vmax = zero();
    for (int i = 0; i < 32; i += kW) vmax = max(vmax, abs(load(xb + i)));
    const float amax = reduce_max(vmax);
    const float s = (amax > 1e-30f ? amax : 1e-30f) / 127.0f;
    const vf vs = set1(s);
    vf hsum[2] = {zero(), zero()};
    for (int i = 0; i < 32; i += kW) {
      const vf h = round(div(load(xb + i), vs));
      hsum[i / 16] = add(hsum[i / 16], h);
      store_bytes(a + 32 * b + i, to_int(h), 0);
    }
    const float h0 = reduce_add(hsum[0]), h1 = reduce_add(hsum[1]);  // small integers: exact
    t[b] = TileAct{s, s * h0, s * h1, (int16_t)h0, (int16_t)h1};
  }
}

int64_t tile_decoded_bytes(int64_t K) { return 4 * K * 4 + 2 * (K / 16) * 16 * 4; }

bool tile_item(int64_t f, int64_t M, const int8_t* a, const TileAct* t, int64_t K,
               const uint8_t* group, uint8_t* dec, const float* bias, float* y, int64_t ldy,
               int64_t n0, int64_t N) {
  if (f >= kIQ2_XXS && !g_have_grids) return false;
  return by_format<ItemFn>(f, M, a, t, K, group, dec, bias, y, ldy, n0, N);
}

void tile_pack(int64_t f, const uint8_t* raw, int64_t N, int64_t K, uint8_t* out) {
  by_format<PackFn>(f, raw, N, K, out);
}

extern "C" {

// gguf-py's codebooks as signed bytes, one after another: iq2xxs [256][8], iq2xs [512][8],
// iq2s [1024][8], iq3xxs [256][4], iq3s [512][4], iq1s [2048][8] (-1, 0, 1), then ksigns
// [128] (bytes); copied once per library (layers/tile_grids.py).
void rs_tile_grids(const int8_t* all) {
  const int8_t* p = all;
  for (auto [dst, n] : {std::pair<int8_t*, int>{g_iq2xxs, 256 * 8}, {g_iq2xs, 512 * 8},
                        {g_iq2s, 1024 * 8}, {g_iq3xxs, 256 * 4}, {g_iq3s, 512 * 4},
                        {g_iq1s, 2048 * 8}}) {
    memcpy(dst, p, (size_t)n);
    p += n;
  }
  memcpy(g_ksigns, p, 128);
  g_have_grids = true;
}

}  // extern "C"

// The tile formats' blocks decoded one row at a time, as gguf-py's reference decodes them
// (gguf.quants): the codes q and the per-sub-block d, m of W = d * q + m (tile_linear.cpp's
// header states them per type). The portable path of every level; tile_simd.h decodes 16 rows
// at once where the level has the vector instructions for it.
#pragma once

#include <stdint.h>
#include <string.h>

namespace tile {
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

// How a block's bytes lie in the packed layout (tile_linear.cpp's pack; layers/tile_layout.py
// reads it back): each format's block is one or two sections of fields of one size (the f16 d,
// MXFP4's exponent byte, 4-byte words for the rest), and a unit of 16 rows' blocks holds each
// section in turn with its elements interleaved across the rows (element e of row r at
// 16 e + r): a vector load then takes one 4-byte word of every row, with no gather, and the
// unit is exactly 16 blocks' bytes.
struct Section {
  int start, bytes, elem;
};
template <int64_t F>
struct Layout {
  static constexpr Section kS[2] = {
      F == kQ3_K ? Section{0, 108, 4} : F == kTQ1_0 ? Section{0, 52, 4}
      : F == kTQ2_0 ? Section{0, 64, 4} : F == kMXFP4 ? Section{0, 1, 1}
      : (F == kQ2_K || F == kIQ4_XS || F == kIQ1_M) ? Section{0, Tile<F>::kBytes, 4}
      : Section{0, 2, 2},
      F == kQ3_K ? Section{108, 2, 2} : F == kTQ1_0 ? Section{52, 2, 2}
      : F == kTQ2_0 ? Section{64, 2, 2} : F == kMXFP4 ? Section{1, 16, 4}
      : (F == kQ2_K || F == kIQ4_XS || F == kIQ1_M) ? Section{Tile<F>::kBytes, 0, 4}
      : Section{2, Tile<F>::kBytes - 2, 4}};
  // where byte `off` of row `r`'s block lies in the unit
  static constexpr int64_t at(int off, int r) {
    const Section& s = off < kS[1].start ? kS[0] : kS[1];
    const int64_t before = off < kS[1].start ? 0 : 16 * kS[0].bytes;
    const int e = (off - s.start) / s.elem;
    return before + (16 * e + r) * s.elem + (off - s.start) % s.elem;
  }
};

// Row r's block out of its unit, as the file has it.
template <int64_t F>
inline void unpack_row(const uint8_t* unit, int r, uint8_t* out) {
  for (const Section& s : Layout<F>::kS)
    for (int e = 0; e < s.bytes / s.elem; ++e)
      memcpy(out + s.start + e * s.elem, unit + Layout<F>::at(s.start + e * s.elem, r), s.elem);
}

// gguf-py's codebooks (rs_tile_grids), as signed bytes: IQ2 8 values an entry, IQ3 4, IQ1 8.
inline int8_t g_iq2xxs[256 * 8], g_iq2xs[512 * 8], g_iq2s[1024 * 8], g_iq3xxs[256 * 4],
    g_iq3s[512 * 4], g_iq1s[2048 * 8];
inline uint8_t g_ksigns[132];  // 128, and room for a 4-byte read of the last
inline bool g_have_grids = false;
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

}  // namespace tile

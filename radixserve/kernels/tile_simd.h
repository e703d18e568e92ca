// The tile formats' blocks decoded 16 rows at a time in vector registers, on the x86 levels
// (AVX2 and up): the lanes are rows. One load takes the same 4-byte word of every row's block
// (the packed layout interleaves the rows' words: tile_decode.h Layout), and the byte
// operations then give a whole k-step of codes for kL rows at once: 4 codes a lane, already in
// the tile's [k-step][16 rows][4] order; the IQ types gather each row's codebook entry. The codes and the floats d, m are those
// tile_decode.h's scalar decode_block gives, by the same operations (the floats: one rounding
// each, in the same order), so the two paths' tiles are byte for byte the same.
//
// Decoding is what these types spend their time on at one or a few rows (a 4096 x 3072 Q3_K
// matrix, one row, one thread, Sapphire Rapids: the scalar decode ran at 2.1 GB/s; gathering
// the rows' words from the file's own block layout instead of loading them interleaved, about
// a quarter of the decode's time waited at the gathers).
#pragma once

#include <stdint.h>

#if defined(__AVX2__)
#include <immintrin.h>

#include "tile_decode.h"

namespace tile {

#if defined(__AVX512F__)
using wv = __m512i;
using fv = __m512;
constexpr int kL = 16;
inline wv gat(const uint8_t* p, wv rows) { return _mm512_i32gather_epi32(rows, p, 1); }
inline wv srl(wv v, int n) { return _mm512_srlv_epi32(v, _mm512_set1_epi32(n)); }
inline wv sll(wv v, int n) { return _mm512_sllv_epi32(v, _mm512_set1_epi32(n)); }
inline wv and8(wv v, int b) { return _mm512_and_si512(v, _mm512_set1_epi8((char)b)); }
inline wv and32(wv v, int32_t x) { return _mm512_and_si512(v, _mm512_set1_epi32(x)); }
inline wv orv(wv a, wv b) { return _mm512_or_si512(a, b); }
inline wv xorv(wv a, wv b) { return _mm512_xor_si512(a, b); }
inline wv sub8(wv v, int b) { return _mm512_sub_epi8(v, _mm512_set1_epi8((char)b)); }
inline wv sub32(wv v, int32_t x) { return _mm512_sub_epi32(v, _mm512_set1_epi32(x)); }
inline wv lut(const int8_t* table, wv i) {  // bytes 0..15 -> table's entries
  return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)table)), i);
}
// The tile keeps q + 128 (unsigned) where the level's dot product takes unsigned bytes
// (simd.h kQ8Offset: vpdpbusd), else q.
inline void put(int32_t* p, wv v) {
  _mm512_storeu_si512(p, simd::kQ8Offset ? _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)) : v);
}
inline void putf(float* p, fv v) { _mm512_storeu_ps(p, v); }
inline fv half_lo(wv w) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w)); }
inline fv to_f(wv w) { return _mm512_cvtepi32_ps(w); }
inline fv fmul(fv a, fv b) { return _mm512_mul_ps(a, b); }
inline fv fneg(fv a) { return _mm512_xor_ps(a, _mm512_set1_ps(-0.0f)); }
inline fv e8m0_half(wv e) {  // 2^(e - 128) exactly; e = 0, 1 subnormal
  const __mmask16 small = _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2));
  const wv bits = _mm512_mask_blend_epi32(small, _mm512_slli_epi32(sub32(e, 1), 23),
                                          _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e));
  return _mm512_castsi512_ps(bits);
}
#else
using wv = __m256i;
using fv = __m256;
constexpr int kL = 8;
inline wv gat(const uint8_t* p, wv rows) {
  return _mm256_i32gather_epi32((const int*)p, rows, 1);
}
inline wv srl(wv v, int n) { return _mm256_srlv_epi32(v, _mm256_set1_epi32(n)); }
inline wv sll(wv v, int n) { return _mm256_sllv_epi32(v, _mm256_set1_epi32(n)); }
inline wv and8(wv v, int b) { return _mm256_and_si256(v, _mm256_set1_epi8((char)b)); }
inline wv and32(wv v, int32_t x) { return _mm256_and_si256(v, _mm256_set1_epi32(x)); }
inline wv orv(wv a, wv b) { return _mm256_or_si256(a, b); }
inline wv xorv(wv a, wv b) { return _mm256_xor_si256(a, b); }
inline wv sub8(wv v, int b) { return _mm256_sub_epi8(v, _mm256_set1_epi8((char)b)); }
inline wv sub32(wv v, int32_t x) { return _mm256_sub_epi32(v, _mm256_set1_epi32(x)); }
inline wv lut(const int8_t* table, wv i) {
  return _mm256_shuffle_epi8(
      _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)table)), i);
}
inline void put(int32_t* p, wv v) {
  _mm256_storeu_si256((__m256i*)p,
                      simd::kQ8Offset ? _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)) : v);
}
inline void putf(float* p, fv v) { _mm256_storeu_ps(p, v); }
inline fv half_lo(wv w) {  // the low 16 bits of each lane as halves
  const __m256i lows = _mm256_shuffle_epi8(
      w, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                          0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1));
  return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(lows, 0x08)));
}
inline fv to_f(wv w) { return _mm256_cvtepi32_ps(w); }
inline fv fmul(fv a, fv b) { return _mm256_mul_ps(a, b); }
inline fv fneg(fv a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
inline fv e8m0_half(wv e) {
  const wv small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
  const wv bits = _mm256_blendv_epi8(_mm256_slli_epi32(sub32(e, 1), 23),
                                     _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e), small);
  return _mm256_castsi256_ps(bits);
}
#endif
inline wv lo16(wv w) { return and32(w, 0xFFFF); }
inline wv hi16(wv w) { return srl(w, 16); }
inline wv mul32(wv a, int32_t x) {
#if defined(__AVX512F__)
  return _mm512_mullo_epi32(a, _mm512_set1_epi32(x));
#else
  return _mm256_mullo_epi32(a, _mm256_set1_epi32(x));
#endif
}
inline wv add8(wv a, wv b) {
#if defined(__AVX512F__)
  return _mm512_add_epi8(a, b);
#else
  return _mm256_add_epi8(a, b);
#endif
}
inline fv fadd(fv a, fv b) {
#if defined(__AVX512F__)
  return _mm512_add_ps(a, b);
#else
  return _mm256_add_ps(a, b);
#endif
}
// Bytes i = 0..3 of each lane of g negated where bit i of the lane's `bits` is set.
inline wv signs4(wv g, wv bits) {
  const wv rep = mul32(and32(bits, 15), 0x01010101);
#if defined(__AVX512F__)
  const __mmask64 neg = _mm512_test_epi8_mask(rep, _mm512_set1_epi32(0x08040201));
  return _mm512_mask_sub_epi8(g, neg, _mm512_setzero_si512(), g);
#else
  const wv sel = _mm256_set1_epi32(0x08040201);
  const wv neg = _mm256_cmpeq_epi8(_mm256_and_si256(rep, sel), sel);
  return _mm256_sub_epi8(_mm256_xor_si256(g, neg), neg);
#endif
}
// 8 g + delta per byte, delta -1 where the lane's bit `flag` is 1, else +1 (IQ1's codes).
inline wv iq1_codes(wv g, wv flag) {
  const wv g8 = add8(add8(add8(g, g), add8(g, g)), add8(add8(g, g), add8(g, g)));
  return add8(g8, sub32(mul32(flag, (int32_t)0xFEFEFEFE), -0x01010101));  // -1 or +1 a byte
}
// Word `off` of the rows v * kL .. of a unit, their f16 at `off` as floats, their byte.
template <int64_t F>
inline wv word(const uint8_t* unit, int v, int off) {
#if defined(__AVX512F__)
  return _mm512_loadu_si512(unit + Layout<F>::at(off, v * kL));
#else
  return _mm256_loadu_si256((const __m256i*)(unit + Layout<F>::at(off, v * kL)));
#endif
}
template <int64_t F>
inline fv half(const uint8_t* unit, int v, int off) {
  const uint8_t* p = unit + Layout<F>::at(off, v * kL);
#if defined(__AVX512F__)
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
#else
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
#endif
}
template <int64_t F>
inline wv byte(const uint8_t* unit, int v, int off) {
  const uint8_t* p = unit + Layout<F>::at(off, v * kL);
#if defined(__AVX512F__)
  return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
#else
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
#endif
}

inline wv byte_of(wv w, int k) { return and32(srl(w, 8 * k), 0xFF); }
inline wv byte_at(const wv w[], int k) { return byte_of(w[k / 4], k % 4); }
inline fv splat(float x) {
#if defined(__AVX512F__)
  return _mm512_set1_ps(x);
#else
  return _mm256_set1_ps(x);
#endif
}

template <int64_t F>
constexpr bool kSimd = true;

// TQ1_0's base-3 digit n of every byte of w, as ggml stores it: t = byte * 3^n (mod 256), the
// digit (t * 3) >> 8, minus 1 (tile_decode.h's trit), in 16-bit lanes, even bytes then odd.
inline wv trits(wv w, int pow3) {
#if defined(__AVX512F__)
  const wv lo = _mm512_set1_epi16(0xFF), p = _mm512_set1_epi16((short)pow3);
  const wv three = _mm512_set1_epi16(3);
  const wv te = _mm512_and_si512(_mm512_mullo_epi16(_mm512_and_si512(w, lo), p), lo);
  const wv to = _mm512_and_si512(_mm512_mullo_epi16(_mm512_srli_epi16(w, 8), p), lo);
  const wv ve = _mm512_srli_epi16(_mm512_mullo_epi16(te, three), 8);
  const wv vo = _mm512_srli_epi16(_mm512_mullo_epi16(to, three), 8);
  return sub8(_mm512_or_si512(ve, _mm512_slli_epi16(vo, 8)), 1);
#else
  const wv lo = _mm256_set1_epi16(0xFF), p = _mm256_set1_epi16((short)pow3);
  const wv three = _mm256_set1_epi16(3);
  const wv te = _mm256_and_si256(_mm256_mullo_epi16(_mm256_and_si256(w, lo), p), lo);
  const wv to = _mm256_and_si256(_mm256_mullo_epi16(_mm256_srli_epi16(w, 8), p), lo);
  const wv ve = _mm256_srli_epi16(_mm256_mullo_epi16(te, three), 8);
  const wv vo = _mm256_srli_epi16(_mm256_mullo_epi16(to, three), 8);
  return sub8(_mm256_or_si256(ve, _mm256_slli_epi16(vo, 8)), 1);
#endif
}

// ksigns[i] (gguf-py's table) for 7-bit i in every lane: i with its parity as bit 7, so that
// the 8 signs have an even count; computed, not gathered (a gather a k-step cost more).
inline wv ksigns(wv i) {
  wv p = i;
  p = xorv(p, srl(p, 4));
  p = xorv(p, srl(p, 2));
  p = xorv(p, srl(p, 1));
  return orv(i, sll(and32(p, 1), 7));
}

// d = D * (0.5 + ls) * f, as decode_block forms it (IQ2: f = 1/4, IQ3_XXS: 1/2)
inline fv iq_scale(fv D, wv ls, float f) {
  return fmul(fmul(D, fadd(splat(0.5f), to_f(ls))), splat(f));
}
// d = D * (2 ls + 1) * f (IQ3_S: f = 1; IQ1: 1/8)
inline fv odd_scale(fv D, wv ls, float f) {
  const fv v = fmul(D, to_f(sub32(sll(ls, 1), -1)));
  return f == 1.0f ? v : fmul(v, splat(f));
}

// The codebook types (IQ2, IQ3, IQ1): each lane's grid entry gathered from the codebook by
// its index, 4 values (one k-step) a gather, then signed (tile_decode.h's decode_block).
template <int64_t F>
void decode16_grid(const uint8_t* unit, int v, int32_t* c, float* dv) {
  auto W = [&](int off) { return word<F>(unit, v, off); };
  auto put_step = [&](int step, wv q) { put(c + 16 * step, q); };
  if constexpr (F == kIQ2_XXS) {
    const fv D = half<F>(unit, v, 0);
    for (int j = 0; j < 8; ++j) {
      const wv a0 = W(2 + 8 * j), a1 = W(6 + 8 * j);
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l) {
        const wv at = sll(and32(srl(a0, 8 * l), 0xFF), 3);
        const wv sg = ksigns(and32(srl(a1, 7 * l), 127));
        for (int t = 0; t < 2; ++t)
          put_step(8 * j + 2 * l + t, signs4(gat((const uint8_t*)g_iq2xxs + 4 * t, at),
                                             srl(sg, 4 * t)));
      }
      putf(dv + 16 * j, iq_scale(D, srl(a1, 28), 0.25f));
    }
  } else if constexpr (F == kIQ3_XXS) {
    const fv D = half<F>(unit, v, 0);
    for (int j = 0; j < 8; ++j) {
      const wv aux = W(66 + 4 * j);
      for (int q = 0; q < 2; ++q) {
        const wv idx = W(2 + 8 * j + 4 * q);
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
          const int l = (4 * q + u) / 2, t = u % 2;
          const wv sg = ksigns(and32(srl(aux, 7 * l), 127));
          const wv g = gat((const uint8_t*)g_iq3xxs, sll(and32(srl(idx, 8 * u), 0xFF), 2));
          put_step(8 * j + 4 * q + u, signs4(g, srl(sg, 4 * t)));
        }
      }
      putf(dv + 16 * j, iq_scale(D, srl(aux, 28), 0.5f));
    }
  } else if constexpr (F == kIQ2_XS || F == kIQ2_S) {
    const fv D = half<F>(unit, v, 0);
    const int8_t* grid = F == kIQ2_XS ? g_iq2xs : g_iq2s;
    for (int i = 0; i < 32; ++i) {  // 8 values, 2 k-steps, a grid entry
      wv idx, sg;
      if constexpr (F == kIQ2_XS) {
        const wv w = W(2 + 4 * (i / 2)), u16 = i % 2 ? hi16(w) : lo16(w);
        idx = and32(u16, 511);
        sg = ksigns(srl(u16, 9));
      } else {
        const wv qh = and32(srl(W(66 + 4 * (i / 16)), 8 * ((i / 4) % 4)), 0xFF);
        idx = orv(byte_of(W(2 + 4 * (i / 4)), i % 4),
                  sll(and32(srl(qh, 2 * (i % 4)), 3), 8));
        sg = byte_of(W(34 + 4 * (i / 4)), i % 4);
      }
      for (int t = 0; t < 2; ++t)
        put_step(2 * i + t, signs4(gat((const uint8_t*)grid + 4 * t, sll(idx, 3)),
                                   srl(sg, 4 * t)));
    }
    const int at = F == kIQ2_XS ? 66 : 74;
    const wv sc[2] = {W(at), W(at + 4)};
    for (int j = 0; j < 16; ++j)
      putf(dv + 16 * j, iq_scale(D, and32(srl(sc[j / 8], 4 * (j % 8)), 15), 0.25f));
  } else if constexpr (F == kIQ3_S) {
    const fv D = half<F>(unit, v, 0);
    for (int p = 0; p < 16; ++p) {  // grid indices 4p .. 4p + 3, one k-step each
      const wv qs = W(2 + 4 * p), qh = W(66 + 4 * (p / 8));
      const wv sw = W(74 + 4 * (p / 2));
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        const int i = 4 * p + u;
        const wv hb = and32(srl(qh, 8 * ((i / 8) % 4) + i % 8), 1);
        const wv idx = orv(and32(srl(qs, 8 * u), 0xFF), sll(hb, 8));
        const wv sg = srl(sw, 8 * ((i / 2) % 4) + 4 * (i % 2));
        put_step(i, signs4(gat((const uint8_t*)g_iq3s, sll(idx, 2)), sg));
      }
    }
    const wv sc = W(106);
    for (int j = 0; j < 8; ++j) putf(dv + 16 * j, odd_scale(D, and32(srl(sc, 4 * j), 15), 1.0f));
  } else if constexpr (F == kIQ1_S) {
    const fv D = half<F>(unit, v, 0);
    for (int j = 0; j < 8; ++j) {
      const wv hw = W(34 + 4 * (j / 2)), h = j % 2 ? hi16(hw) : lo16(hw);
      const wv qs = W(2 + 4 * j), flag = srl(h, 15);
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l) {
        const wv idx = orv(and32(srl(qs, 8 * l), 0xFF), sll(and32(srl(h, 3 * l), 7), 8));
        for (int t = 0; t < 2; ++t)
          put_step(8 * j + 2 * l + t,
                   iq1_codes(gat((const uint8_t*)g_iq1s + 4 * t, sll(idx, 3)), flag));
      }
      putf(dv + 16 * j, odd_scale(D, and32(srl(h, 12), 7), 0.125f));
    }
  } else if constexpr (F == kIQ1_M) {
    const wv w0 = W(48), w1 = W(52);
    const wv sc[4] = {lo16(w0), hi16(w0), lo16(w1), hi16(w1)};
    const wv dbits = orv(orv(srl(sc[0], 12), and32(srl(sc[1], 8), 0xF0)),
                         orv(and32(srl(sc[2], 4), 0xF00), and32(sc[3], 0xF000)));
    const fv D = half_lo(dbits);
    for (int p = 0; p < 8; ++p) {  // grid indices 4p .. 4p + 3, 8 values each
      const wv qs = W(4 * p), qh = W(32 + 4 * (p / 2));
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        const int i = 4 * p + u;
        const wv nib = and32(srl(qh, 8 * ((i / 2) % 4) + 4 * (i % 2)), 15);
        const wv idx = orv(and32(srl(qs, 8 * u), 0xFF), sll(and32(nib, 7), 8));
        for (int t = 0; t < 2; ++t)
          put_step(2 * i + t,
                   iq1_codes(gat((const uint8_t*)g_iq1s + 4 * t, sll(idx, 3)), srl(nib, 3)));
      }
    }
    for (int j = 0; j < 16; ++j)
      putf(dv + 16 * j, odd_scale(D, and32(srl(sc[j / 4], 3 * (j % 4)), 7), 0.125f));
  }
}

// One block of 16 rows (`blk`: 16 x kBytes, as packed) -> its k-steps' codes, step s of row r
// at codes[16 s + r] (4 bytes), d [subs][16] and m [subs][16] (Q2_K).
template <int64_t F>
void decode16(const uint8_t* blk, int32_t* codes, float* d, float* m) {
  using T = Tile<F>;
  for (int v = 0; v < 16 / kL; ++v) {
    auto W = [&](int off) { return word<F>(blk, v, off); };
    auto H = [&](int off) { return half<F>(blk, v, off); };
    int32_t* c = codes + v * kL;
    float* dv = d + v * kL;
    if constexpr (Tile<F>::kGrids) {
      decode16_grid<F>(blk, v, c, dv);
    } else if constexpr (F == kTQ1_0) {
      // qs[0..31]: digit n of byte i is value 32 n + i; qs[32..47]: 160 + 16 n + (i - 32);
      // qh[0..3]: 240 + 4 n + i (4 digits)
      static constexpr int kPow3[5] = {1, 3, 9, 27, 81};
      for (int u = 0; u < 8; ++u) {
        const wv w = W(4 * u);
#pragma GCC unroll 5
        for (int n = 0; n < 5; ++n) put(c + 16 * (8 * n + u), trits(w, kPow3[n]));
      }
      for (int u = 0; u < 4; ++u) {
        const wv w = W(32 + 4 * u);
#pragma GCC unroll 5
        for (int n = 0; n < 5; ++n) put(c + 16 * (40 + 4 * n + u), trits(w, kPow3[n]));
      }
      const wv qh = W(48);
#pragma GCC unroll 4
      for (int n = 0; n < 4; ++n) put(c + 16 * (60 + n), trits(qh, kPow3[n]));
      const fv D = H(52);
      for (int j = 0; j < 8; ++j) putf(dv + 16 * j, D);
    } else if constexpr (F == kQ2_K || F == kQ3_K || F == kTQ2_0) {
      const int qs = F == kQ3_K ? 32 : F == kQ2_K ? 16 : 0;
      // word u of each half h of the codes: k = 128 h + 32 s + 4 u + i (Q3_K: the high bits,
      // hmask's word u, bit 4 h + s)
      for (int u = 0; u < 8; ++u) {
        const wv hm = F == kQ3_K ? W(4 * u) : wv{};
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const wv w = W(qs + 32 * h + 4 * u);
#pragma GCC unroll 4
          for (int s = 0; s < 4; ++s) {
            wv q = and8(srl(w, 2 * s), 3);
            if constexpr (F == kQ3_K) q = sub8(orv(q, sll(and8(srl(hm, 4 * h + s), 1), 2)), 4);
            if constexpr (F == kTQ2_0) q = sub8(q, 1);
            put(c + 16 * (32 * h + 8 * s + u), q);
          }
        }
      }
      if constexpr (F == kQ2_K) {
        const wv sc[4] = {W(0), W(4), W(8), W(12)};
        const wv dd = W(80);
        const fv D = half_lo(dd), Dmin = half_lo(srl(dd, 16));
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j) {
          const wv s = byte_at(sc, j);
          putf(dv + 16 * j, fmul(D, to_f(and32(s, 15))));
          putf(m + v * kL + 16 * j, fneg(fmul(Dmin, to_f(srl(s, 4)))));
        }
      } else if constexpr (F == kQ3_K) {
        const wv sc[3] = {W(96), W(100), W(104)};
        const fv D = H(108);
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j) {
          const wv lo = j < 8 ? and32(byte_at(sc, j), 15) : srl(byte_at(sc, j - 8), 4);
          const wv hi = and32(srl(byte_at(sc, 8 + j % 4), 2 * (j / 4)), 3);
          putf(dv + 16 * j, fmul(D, to_f(sub32(orv(lo, sll(hi, 4)), 32))));
        }
      } else {
        const fv D = H(64);
        for (int j = 0; j < 8; ++j) putf(dv + 16 * j, D);
      }
    } else if constexpr (F == kIQ4_NL || F == kMXFP4) {
      const int8_t* table = F == kIQ4_NL ? kIq4nl : kMxfp4;
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        const wv w = W((F == kIQ4_NL ? 2 : 1) + 4 * t);
        put(c + 16 * t, lut(table, and8(w, 15)));
        put(c + 16 * (t + 4), lut(table, and8(srl(w, 4), 15)));
      }
      putf(dv, F == kIQ4_NL ? H(0) : e8m0_half(byte<F>(blk, v, 0)));
    } else if constexpr (F == kIQ4_XS) {
      const wv head = W(0), sl = W(4);
      const fv D = half_lo(head);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
          const wv w = W(8 + 16 * j + 4 * u);
          put(c + 16 * (8 * j + u), lut(kIq4nl, and8(w, 15)));
          put(c + 16 * (8 * j + 4 + u), lut(kIq4nl, and8(srl(w, 4), 15)));
        }
        const wv ls = orv(and32(srl(sl, 4 * j), 15), sll(and32(srl(head, 16 + 2 * j), 3), 4));
        putf(dv + 16 * j, fmul(D, to_f(sub32(ls, 32))));
      }
    }
  }
}

}  // namespace tile

#else
namespace tile {
template <int64_t F>
constexpr bool kSimd = false;
template <int64_t F>
void decode16(const uint8_t*, int32_t*, float*, float*) {}
}  // namespace tile
#endif

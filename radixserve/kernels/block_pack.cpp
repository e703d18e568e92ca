// Repacking at load: a GGUF matrix's blocks, as the file stores them, -> block_linear.cpp's
// packed layout (stated in that file's header: groups of 16 outputs, units of 1 or 8 blocks of
// 32 k, code planes in vpdpbusd's operand order, then the high-bit planes, the per-block and the
// per-unit fields). Bit for bit what tests/block_pack_reference.py writes with numpy; done here
// because that takes seconds per GB in Python and a 7B file must start in seconds.
//
// The GGUF block formats (ggml-common.h), per block of 32 weights (256 for the K-quants):
//   Q4_0  d f16, 16 bytes: q[i] = byte i low nibble, q[i + 16] = its high nibble
//   Q4_1  d f16, m f16, the same 16 bytes
//   Q5_0  d f16, qh u32 (bit i = bit 4 of q[i]), 16 bytes as Q4_0
//   Q5_1  d f16, m f16, qh u32, 16 bytes
//   Q8_0  d f16, 32 signed bytes
//   Q4_K  d f16, dmin f16, 12 bytes of 8 six-bit (scale, min) pairs, 128 bytes: sub-blocks
//         2j and 2j + 1 are the low and high nibbles of bytes 32j..32j + 31
//   Q5_K  as Q4_K, with 32 bytes qh after the scales (bit s of byte l: bit 4 of sub-block s's
//         code l)
//   Q6_K  128 bytes ql, 64 bytes qh, 16 int8 scales (one per 16 weights), d f16 last; per
//         half of 128: code l of quarter c = nibble (c / 2) of ql[l + 32 (c % 2)] plus bits
//         2c..2c + 1 of qh[l] as bits 4-5
// Codes are unsigned (Q8_0: the file's signed byte), fields are copied bit for bit.

#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "tile_linear.h"

namespace {

enum Format : int64_t { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kQ4_K, kQ5_K, kQ6_K };

struct Layout {
  int64_t block_bytes;  // the file's bytes per block (super-block for the K-quants)
  int U, P, S, T;       // block_linear.cpp's Fmt: blocks per unit, plane, block, unit fields
  int bits;
};

bool layout_of(int64_t f, Layout* l) {
  switch (f) {
    case kQ4_0: *l = {18, 1, 0, 32, 0, 4}; return true;
    case kQ4_1: *l = {20, 1, 0, 64, 0, 4}; return true;
    case kQ5_0: *l = {22, 1, 64, 32, 0, 5}; return true;
    case kQ5_1: *l = {24, 1, 64, 64, 0, 5}; return true;
    case kQ8_0: *l = {34, 1, 256, 32, 0, 8}; return true;
    case kQ4_K: *l = {144, 8, 0, 32, 64, 4}; return true;
    case kQ5_K: *l = {176, 8, 64, 32, 64, 5}; return true;
    case kQ6_K: *l = {210, 8, 128, 32, 32, 6}; return true;
  }
  return false;
}

inline uint16_t u16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }
inline void put16(uint8_t* p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }

// ggml's get_scale_min_k4: sub-block j's 6-bit scale and min.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// One unit (the file's block, or super-block) of output `lane`: its codes and fields written
// into the packed unit at `u` (zeroed before).
template <int64_t F>
void pack_unit(const Layout& L, const uint8_t* src, int lane, uint8_t* u) {
  constexpr int U = F >= kQ4_K ? 8 : 1;
  constexpr int bits = F == kQ8_0 ? 8 : F == kQ6_K ? 6
                       : (F == kQ5_0 || F == kQ5_1 || F == kQ5_K) ? 5 : 4;
  uint8_t q[256];
  uint8_t* S = u + U * (256 + L.P);
  uint8_t* T = S + U * L.S;
  if constexpr (F == kQ4_0 || F == kQ4_1 || F == kQ5_0 || F == kQ5_1) {
    constexpr bool has_m = F == kQ4_1 || F == kQ5_1, five = F == kQ5_0 || F == kQ5_1;
    const uint8_t* qs = src + (has_m ? 4 : 2) + (five ? 4 : 0);
    uint32_t qh = 0;
    if (five) memcpy(&qh, src + (has_m ? 4 : 2), 4);
    for (int i = 0; i < 16; ++i) {
      q[i] = (uint8_t)((qs[i] & 15) | (five ? ((qh >> i) & 1) << 4 : 0));
      q[i + 16] = (uint8_t)((qs[i] >> 4) | (five ? ((qh >> (i + 16)) & 1) << 4 : 0));
    }
    put16(S + 2 * lane, u16(src));
    if (has_m) put16(S + 32 + 2 * lane, u16(src + 2));
  } else if constexpr (F == kQ8_0) {
    memcpy(q, src + 2, 32);
    put16(S + 2 * lane, u16(src));
  } else if constexpr (F == kQ4_K || F == kQ5_K) {
    constexpr bool five = F == kQ5_K;
    const uint8_t* scales = src + 4;
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + (five ? 48 : 16);
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) {
        q[64 * j + l] = (uint8_t)((qs[32 * j + l] & 15) |
                                  (five ? ((qh[l] >> (2 * j)) & 1) << 4 : 0));
        q[64 * j + 32 + l] = (uint8_t)((qs[32 * j + l] >> 4) |
                                       (five ? ((qh[l] >> (2 * j + 1)) & 1) << 4 : 0));
      }
    for (int j = 0; j < 8; ++j)
      scale_min_k4(j, scales, S + j * L.S + lane, S + j * L.S + 16 + lane);
    put16(T + 2 * lane, u16(src));
    put16(T + 32 + 2 * lane, u16(src + 2));
  } else {  // Q6_K
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const int8_t* sc = (const int8_t*)(src + 192);
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l) {
        const uint8_t* a = ql + 64 * h;
        const uint8_t b = qh[32 * h + l];
        q[128 * h + l] = (uint8_t)((a[l] & 15) | ((b & 3) << 4));
        q[128 * h + l + 32] = (uint8_t)((a[l + 32] & 15) | (((b >> 2) & 3) << 4));
        q[128 * h + l + 64] = (uint8_t)((a[l] >> 4) | (((b >> 4) & 3) << 4));
        q[128 * h + l + 96] = (uint8_t)((a[l + 32] >> 4) | (((b >> 6) & 3) << 4));
      }
    for (int j = 0; j < 8; ++j) {  // block j = weights 32j.. : scales 2j and 2j + 1
      S[j * L.S + lane] = (uint8_t)sc[2 * j];
      S[j * L.S + 16 + lane] = (uint8_t)sc[2 * j + 1];
    }
    put16(T + 2 * lane, u16(src + 208));
  }
  // the codes: block j, k = 16 half + 4 v + i -> byte v * 64 + lane * 4 + i of the planes
  for (int j = 0; j < U; ++j) {
    const uint8_t* c = q + 32 * j;
    uint8_t* plane = u + j * 256 + lane * 4;
    uint8_t* high = u + U * 256 + j * L.P + lane * 4;  // one vector (two for 6 bits)
    for (int v = 0; v < 4; ++v)
      for (int i = 0; i < 4; ++i) {
        const uint8_t c0 = c[4 * v + i], c1 = c[16 + 4 * v + i];
        if constexpr (bits == 8) {
          plane[v * 64 + i] = c0;
          high[v * 64 + i] = c1;
          continue;
        }
        plane[v * 64 + i] = (uint8_t)((c0 & 15) | (c1 << 4));
        if constexpr (bits == 5)
          high[i] |= (uint8_t)((((c0 >> 4) & 1) << (2 * v)) | (((c1 >> 4) & 1) << (2 * v + 1)));
        else if constexpr (bits == 6)
          high[(v / 2) * 64 + i] |= (uint8_t)((((c0 >> 4) & 3) << (4 * (v % 2))) |
                                              (((c1 >> 4) & 3) << (4 * (v % 2) + 2)));
      }
  }
}

using PackUnit = void (*)(const Layout&, const uint8_t*, int, uint8_t*);

PackUnit pack_unit_of(int64_t f) {
  switch (f) {
    case kQ4_0: return pack_unit<kQ4_0>;
    case kQ4_1: return pack_unit<kQ4_1>;
    case kQ5_0: return pack_unit<kQ5_0>;
    case kQ5_1: return pack_unit<kQ5_1>;
    case kQ8_0: return pack_unit<kQ8_0>;
    case kQ4_K: return pack_unit<kQ4_K>;
    case kQ5_K: return pack_unit<kQ5_K>;
    case kQ6_K: return pack_unit<kQ6_K>;
  }
  return nullptr;
}

}  // namespace

extern "C" {

// raw: N rows of K weights in `format`'s GGUF blocks ([N][K / block * block bytes]) -> out:
// block_linear.cpp's packed bytes (rs_block_packed_bytes(format, N, K) of them). Returns 0, or
// 2 for a format without blocks or a K that is not a multiple of its unit.
int rs_block_pack(int64_t format, const uint8_t* raw, int64_t N, int64_t K, uint8_t* out) {
  if (is_tile(format)) {  // the file's blocks regrouped 16 rows at a time (tile_linear.h)
    if (!tile_row_bytes(format, K)) return 2;
    tile_pack(format, raw, N, K, out);
    return 0;
  }
  Layout L;
  if (!layout_of(format, &L) || K <= 0 || K % (32 * L.U)) return 2;
  const int64_t units = K / (32 * L.U);
  const int64_t unit_bytes = L.U * (256 + L.P + L.S) + L.T;
  const int64_t row_bytes = units * L.block_bytes, groups = (N + 15) / 16;
  const PackUnit unit = pack_unit_of(format);
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* dst = out + g * units * unit_bytes;
    memset(dst, 0, (size_t)(units * unit_bytes));
    for (int lane = 0; lane < 16; ++lane) {
      if (16 * g + lane < N) {
        const uint8_t* row = raw + (16 * g + lane) * row_bytes;
        for (int64_t un = 0; un < units; ++un)
          unit(L, row + un * L.block_bytes, lane, dst + un * unit_bytes);
      } else if (L.bits == 8) {  // a padding output's code 0 is the signed byte -128
        for (int64_t un = 0; un < units; ++un)
          for (int p = 0; p < 2; ++p)
            for (int v = 0; v < 4; ++v)
              memset(dst + un * unit_bytes + p * 256 + v * 64 + lane * 4, 0x80, 4);
      }
    }
  }
  return 0;
}

}  // extern "C"

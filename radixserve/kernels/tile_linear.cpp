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
#include "tile_decode.h"
#include "tile_simd.h"

namespace {

using namespace simd;

using namespace tile;

// One block of the group's 16 rows (`src`) -> its k-steps' codes [block / 4][16][4] and d, m
// [subs][16]: in vector registers where the level has tile_simd.h's decoder, else row by row.
template <int64_t F>
inline void decode_rows16(const uint8_t* src, int32_t* codes, float* d, float* m) {
  using T = Tile<F>;
  if constexpr (kSimd<F>) {
    decode16<F>(src, codes, d, m);
  } else {
    alignas(64) int8_t q[256];
    uint8_t row[T::kBytes];
    float dd[16], mm[16];
    for (int r = 0; r < 16; ++r) {
      unpack_row<F>(src, r, row);
      decode_block<F>(row, q, dd, mm);
      if constexpr (kQ8Offset != 0)  // the tile's unsigned q + 128 (dot_span)
        for (int i = 0; i < T::kBlock; ++i) q[i] = (int8_t)(q[i] ^ 0x80);
      for (int s = 0; s < T::kBlock / 4; ++s) memcpy(codes + 16 * s + r, q + 4 * s, 4);
      for (int j = 0; j < T::kBlock / T::kSub; ++j) {
        d[16 * j + r] = dd[j];
        if constexpr (T::kMins) m[16 * j + r] = mm[j];
      }
    }
  }
}

// Block blk's 16 rows, asking for the bytes kAhead on (a block's worth: the first pass reads
// each byte once, from memory). One block ahead was too close: a 4096 x 3072 IQ4_XS GEMV,
// one thread, Sapphire Rapids, spent half its time waiting at the prefetches.
#ifndef RS_TILE_AHEAD
#define RS_TILE_AHEAD 6144
#endif
template <int64_t F>
inline const uint8_t* block_rows(const uint8_t* group, int64_t blk) {
  constexpr int64_t kRowsBytes = 16 * Tile<F>::kBytes;
  const uint8_t* src = group + blk * kRowsBytes;
  for (int64_t at = 0; at < kRowsBytes; at += 64) __builtin_prefetch(src + RS_TILE_AHEAD + at);
  return src;
}

// The decoded group: codes [K / 4][16][4] (q + kQ8Offset, as bytes), then d [K / sub][16], then (Q2_K) m [K / sub][16].
template <int64_t F>
void decode_group(const uint8_t* group, int64_t K, uint8_t* dec) {
  using T = Tile<F>;
  constexpr int kSubs = T::kBlock / T::kSub;
  int32_t* codes = (int32_t*)dec;
  float* d = (float*)(dec + 4 * K * 4);
  float* m = d + K / T::kSub * 16;
  for (int64_t blk = 0; blk < K / T::kBlock; ++blk)
    decode_rows16<F>(block_rows<F>(group, blk), codes + blk * (T::kBlock / 4) * 16,
                     d + blk * kSubs * 16, m + blk * kSubs * 16);
}

constexpr int kV = 16 / kW;  // vectors across a group's 16 outputs

// Where a work item's NG groups' decoded codes and floats lie: group g's codes at
// codes + g * cstride (bytes), its d at d + g * fstride, its m at m + g * fstride (floats).
struct Tiles {
  const uint8_t* codes;
  int64_t cstride;
  const float *d, *m;
  int64_t fstride;
};

// R rows x NG groups of 16 outputs, sub-blocks j0 .. j0 + subs - 1 (the header's order), from
// their decoded tiles (`w`: sub-block j0's), into acc. Each activation broadcast serves the
// NG groups' vectors.
template <int64_t F, int R, int NG>
inline void dot_span(const int8_t* a, const TileAct* t, int64_t K, int64_t j0, int64_t subs,
                     const Tiles& w, vf (&acc)[R][NG * kV]) {
  using T = Tile<F>;
  constexpr int V = NG * kV;
  const int64_t B = K / 32;
  for (int64_t jj = 0; jj < subs; ++jj) {
    const int64_t j = j0 + jj;
    vi H[R][V];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) H[r][v] = izero();
    for (int s = 0; s < T::kSub / 4; ++s) {
      const uint8_t* qs = w.codes + (jj * (T::kSub / 4) + s) * 64;
      vi q[V];
      for (int v = 0; v < V; ++v) q[v] = iload(qs + (v / kV) * w.cstride + 4 * kW * (v % kV));
      for (int r = 0; r < R; ++r) {
        const vi x = bcast4(a + r * K + j * T::kSub + 4 * s);
        for (int v = 0; v < V; ++v)  // the sums of q + kQ8Offset
          H[r][v] = kQ8Offset ? dot_codes(H[r][v], q[v], x) : dot_s8(H[r][v], q[v], x);
      }
    }
    for (int r = 0; r < R; ++r) {
      const TileAct& x = t[r * B + j * T::kSub / 32];
      const bool second = T::kSub == 16 && (j & 1);
      const int h = T::kSub == 32 ? x.h0 + x.h1 : second ? x.h1 : x.h0;
      const vf s = set1(x.s);
      for (int v = 0; v < V; ++v) {
        const int64_t at = (v / kV) * w.fstride + jj * 16 + (v % kV) * kW;
        const vi C = kQ8Offset ? isub(H[r][v], iset1(kQ8Offset * h)) : H[r][v];
        acc[r][v] = fmadd(load(w.d + at), mul(to_float(C), s), acc[r][v]);
        if constexpr (T::kMins)
          acc[r][v] = fmadd(load(w.m + at), set1(second ? x.S1 : x.S0), acc[r][v]);
      }
    }
  }
}

template <int R, int NG>
inline void store_rows(const vf (&acc)[R][NG * kV], const float* bias, float* y, int64_t ldy,
                       int64_t n0, int64_t N) {
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NG * kV; ++v) {
      const int64_t n = n0 + 16 * (v / kV) + (v % kV) * kW;
      if (n >= N) continue;
      vf out = acc[r][v];
      if (bias) out = add(out, load_n(bias + n, N - n));
      store_n(y + r * ldy + n, out, N - n);
    }
}

template <int R, int NG>
inline void zero_acc(vf (&acc)[R][NG * kV]) {
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NG * kV; ++v) acc[r][v] = zero();
}

// R rows over all of K from the NG decoded groups (decode_group's, one after another).
template <int64_t F, int R, int NG>
void dot_rows(const int8_t* a, const TileAct* t, int64_t K, const uint8_t* dec,
              const float* bias, float* y, int64_t ldy, int64_t n0, int64_t N) {
  using T = Tile<F>;
  const float* d = (const float*)(dec + 4 * K * 4);
  const int64_t stride = tile_decoded_bytes(K);
  vf acc[R][NG * kV];
  zero_acc<R, NG>(acc);
  dot_span<F, R, NG>(a, t, K, 0, K / T::kSub,
                     Tiles{dec, stride, d, d + K / T::kSub * 16, stride / 4}, acc);
  store_rows<R, NG>(acc, bias, y, ldy, n0, N);
}

// R rows (at most one register block) block by block: each block of the NG groups decoded
// into a buffer in L1 and multiplied at once, the sums kept in registers (a GEMV: the decoded
// codes never go out to L2). The same sums and float steps in the same order as dot_rows.
template <int64_t F, int R, int NG>
void stream_rows(const int8_t* a, const TileAct* t, int64_t K, const uint8_t* group,
                 int64_t group_bytes, const float* bias, float* y, int64_t ldy, int64_t n0,
                 int64_t N) {
  using T = Tile<F>;
  constexpr int kSubs = T::kBlock / T::kSub;
  alignas(64) int32_t codes[NG][T::kBlock / 4 * 16];
  alignas(64) float d[NG][kSubs * 16], m[NG][kSubs * 16];
  vf acc[R][NG * kV];
  zero_acc<R, NG>(acc);
  for (int64_t blk = 0; blk < K / T::kBlock; ++blk) {
    for (int g = 0; g < NG; ++g)
      decode_rows16<F>(block_rows<F>(group + g * group_bytes, blk), codes[g], d[g], m[g]);
    dot_span<F, R, NG>(a, t, K, blk * kSubs, kSubs,
                       Tiles{(const uint8_t*)codes[0], sizeof codes[0], d[0], m[0], kSubs * 16},
                       acc);
  }
  store_rows<R, NG>(acc, bias, y, ldy, n0, N);
}

// Rows per register block: AVX-512 holds 4 rows' sums and accumulators of two groups' vectors;
// below it a group is two vectors a row.
constexpr int kRows = kW == 16 ? 4 : 2;

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
// The amx level, many rows: 16 rows at a time, each sub-block's integer sums for the 16 rows x
// NG groups by one tile product (tdpbsud: the activations' signed bytes times the tile's
// q + 128), then dot_span's float steps on them, in its order: the same integers and floats,
// so a row's output is the VNNI path's bit for bit. Two sets of tiles, one for even and one
// for odd sub-blocks (the groups' sums 16 x 16 int32, the activations 16 rows x sub bytes, the
// codes sub / 4 k-steps x 64 bytes), so the next sub-block's products run while this one's
// float steps do. `restore`: the caller's standard configuration (simd.h amx_configure) is in
// force and is put back after; else the tiles are released.
template <int64_t F>
inline void amx_config() {
  struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int set = 0; set < 2; ++set) {
    const int base = 4 * set;  // sums base, base + 1; activations base + 2; codes base + 3
    cfg.rows[base] = cfg.rows[base + 1] = cfg.rows[base + 2] = 16;
    cfg.colsb[base] = cfg.colsb[base + 1] = cfg.colsb[base + 3] = 64;
    cfg.colsb[base + 2] = Tile<F>::kSub;
    cfg.rows[base + 3] = Tile<F>::kSub / 4;
  }
  _tile_loadconfig(&cfg);
}

// Sub-block j's products for 16 rows into tile set kSet (the tile numbers must be literals:
// the intrinsics write them into the instruction).
#define RS_TILE_PRODUCTS(S0, S1, A, Q)                                \
  _tile_loadd(A, a + j * kSub, K);                                    \
  _tile_loadd(Q, codes + j * (kSub / 4) * 64, 64);                    \
  _tile_zero(S0);                                                     \
  _tile_dpbsud(S0, A, Q);                                             \
  if constexpr (NG == 2) {                                            \
    _tile_loadd(Q, codes + cstride + j * (kSub / 4) * 64, 64);        \
    _tile_zero(S1);                                                   \
    _tile_dpbsud(S1, A, Q);                                           \
  }
template <int64_t F, int NG, int kSet>
inline void amx_products(const int8_t* a, int64_t K, const uint8_t* codes, int64_t cstride,
                         int64_t j) {
  constexpr int kSub = Tile<F>::kSub;
  if constexpr (kSet == 0) {
    RS_TILE_PRODUCTS(0, 1, 2, 3)
  } else {
    RS_TILE_PRODUCTS(4, 5, 6, 7)
  }
}
#undef RS_TILE_PRODUCTS

template <int NG, int kSet>
inline void amx_sums(int32_t (&C)[2][16][16]) {
  if constexpr (kSet == 0) {
    _tile_stored(0, C[0], 64);
    if constexpr (NG == 2) _tile_stored(1, C[1], 64);
  } else {
    _tile_stored(4, C[0], 64);
    if constexpr (NG == 2) _tile_stored(5, C[1], 64);
  }
}

template <int64_t F, int NG>
void amx_rows(int64_t M, const int8_t* a, const TileAct* t, int64_t K, const uint8_t* dec,
              const float* bias, float* y, int64_t ldy, int64_t n0, int64_t N, bool restore) {
  using T = Tile<F>;
  amx_config<F>();
  const int64_t B = K / 32, stride = tile_decoded_bytes(K), subs = K / T::kSub;
  const float* d = (const float*)(dec + 4 * K * 4);
  const Tiles w{dec, stride, d, d + subs * 16, stride / 4};
  alignas(64) int32_t C[2][16][16];
  alignas(64) float acc[16][NG * kV][kW];
  for (int64_t r0 = 0; r0 + 16 <= M; r0 += 16) {
    const int8_t* ar = a + r0 * K;
    memset(acc, 0, sizeof acc);
    amx_products<F, NG, 0>(ar, K, w.codes, w.cstride, 0);
    for (int64_t j = 0; j < subs; ++j) {
      if (j & 1) {
        if (j + 1 < subs) amx_products<F, NG, 0>(ar, K, w.codes, w.cstride, j + 1);
        amx_sums<NG, 1>(C);
      } else {
        if (j + 1 < subs) amx_products<F, NG, 1>(ar, K, w.codes, w.cstride, j + 1);
        amx_sums<NG, 0>(C);
      }
      for (int r = 0; r < 16; ++r) {
        const TileAct& x = t[(r0 + r) * B + j * T::kSub / 32];
        const bool second = T::kSub == 16 && (j & 1);
        const int h = T::kSub == 32 ? x.h0 + x.h1 : second ? x.h1 : x.h0;
        const vf s = set1(x.s);
        for (int v = 0; v < NG * kV; ++v) {
          const int64_t at = (v / kV) * w.fstride + j * 16 + (v % kV) * kW;
          const vi Cv = isub(iload(&C[v / kV][r][(v % kV) * kW]), iset1(kQ8Offset * h));
          vf sum = fmadd(load(w.d + at), mul(to_float(Cv), s), load(acc[r][v]));
          if constexpr (T::kMins) sum = fmadd(load(w.m + at), set1(second ? x.S1 : x.S0), sum);
          store(acc[r][v], sum);
        }
      }
    }
    for (int r = 0; r < 16; ++r) {
      vf out[1][NG * kV];
      for (int v = 0; v < NG * kV; ++v) out[0][v] = load(acc[r][v]);
      store_rows<1, NG>(out, bias, y + (r0 + r) * ldy, ldy, n0, N);
    }
  }
  if (restore)
    amx_configure();
  else
    _tile_release();
}
#endif

template <int64_t F, int NG>
void item_groups(int64_t M, const int8_t* a, const TileAct* t, int64_t K, const uint8_t* group,
                 uint8_t* dec, const float* bias, float* y, int64_t ldy, int64_t n0,
                 int64_t N, int amx) {
  const int64_t B = K / 32, group_bytes = K / Tile<F>::kBlock * 16 * Tile<F>::kBytes;
  // one register block: decode and multiply block by block
  if (M == 1) return stream_rows<F, 1, NG>(a, t, K, group, group_bytes, bias, y, ldy, n0, N);
  if (M == 2) return stream_rows<F, 2, NG>(a, t, K, group, group_bytes, bias, y, ldy, n0, N);
  if constexpr (kRows == 4) {
    if (M == 3) return stream_rows<F, 3, NG>(a, t, K, group, group_bytes, bias, y, ldy, n0, N);
    if (M == 4) return stream_rows<F, 4, NG>(a, t, K, group, group_bytes, bias, y, ldy, n0, N);
  }
  for (int g = 0; g < NG; ++g)
    decode_group<F>(group + g * group_bytes, K, dec + g * tile_decoded_bytes(K));
  int64_t r = 0;
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
  // whole 16-row tiles by AMX, the rest below: types of 32-weight sub-blocks only (the 3B
  // shape's 4096 x 3072 at 128 rows, one thread, Sapphire Rapids, GMAC/s VNNI vs AMX: IQ4_XS
  // 200-214 vs 270-281; Q3_K 155-167 vs 154-162, Q2_K 133-145 vs 123-132: a tile product over
  // 16 k and twice the float steps gain nothing)
  if (amx && Tile<F>::kSub == 32) {
    amx_rows<F, NG>(M, a, t, K, dec, bias, y, ldy, n0, N, amx == 2);
    r = M / 16 * 16;
  }
#endif
  for (; r + kRows <= M; r += kRows)
    dot_rows<F, kRows, NG>(a + r * K, t + r * B, K, dec, bias, y + r * ldy, ldy, n0, N);
  for (; r < M; ++r)
    dot_rows<F, 1, NG>(a + r * K, t + r * B, K, dec, bias, y + r * ldy, ldy, n0, N);
}

// One work item: M rows x `groups` (1 or 2) groups of 16 outputs.
template <int64_t F>
void item(int groups, int64_t M, const int8_t* a, const TileAct* t, int64_t K,
          const uint8_t* group, uint8_t* dec, const float* bias, float* y, int64_t ldy,
          int64_t n0, int64_t N, int amx) {
  if (groups == 2)
    item_groups<F, 2>(M, a, t, K, group, dec, bias, y, ldy, n0, N, amx);
  else
    item_groups<F, 1>(M, a, t, K, group, dec, bias, y, ldy, n0, N, amx);
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
        uint8_t* unit = dst + b * 16 * T::kBytes;
        const uint8_t* from = raw + (row * blocks + b) * T::kBytes;
        for (const Section& s : Layout<F>::kS)
          for (int e = 0; e < s.bytes / s.elem; ++e) {
            uint8_t* to = unit + Layout<F>::at(s.start + e * s.elem, lane);
            if (row < N)
              memcpy(to, from + s.start + e * s.elem, s.elem);
            else
              memset(to, 0, s.elem);
          }
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
  static void run(int groups, int64_t M, const int8_t* a, const TileAct* t, int64_t K,
                  const uint8_t* g, uint8_t* dec, const float* bias, float* y, int64_t ldy,
                  int64_t n0, int64_t N, int amx) {
    item<F>(groups, M, a, t, K, g, dec, bias, y, ldy, n0, N, amx);
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

bool tile_item(int64_t f, int groups, int64_t M, const int8_t* a, const TileAct* t, int64_t K,
               const uint8_t* group, uint8_t* dec, const float* bias, float* y, int64_t ldy,
               int64_t n0, int64_t N, int amx) {
  if (f >= kIQ2_XXS && !g_have_grids) return false;
  return by_format<ItemFn>(f, groups, M, a, t, K, group, dec, bias, y, ldy, n0, N, amx);
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

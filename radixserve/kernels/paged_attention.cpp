// Attention over the paged KV pool, read in place (no gathered copy of K/V per layer), for
// every query row of a step: decodes, chunks and whole prompts alike.
//
// Query row t belongs to sequence row_seq[t] and attends to its first row_len[t] tokens (the
// causal limit; a sliding-window layer: only the last `window` of them), whose KV lives in the
// pool blocks table[row_seq[t], 0..]. A prompt's rows (up to 32 consecutive rows of one
// sequence: a tile) and each row's grouped query heads (H / KVH per KV head) share each K and V
// load, widened to float32 once for all of them; one work item per (tile, KV head). Each row
// keeps a fixed order of operations of its own: scores q.k * scale token by token, an exact
// two-pass softmax (max, then exp and sum) and the weighted sum of V, in float32, the same
// whichever rows share its tile. So a row's result depends only on its query and its context,
// never on how the step was batched, chunked, or which part of the context came from the
// prefix cache.
//
// Attention sinks (gpt-oss): a learned logit per query head that joins each row's softmax
// denominator only (no value): p_j = exp(s_j - M) / (sum_i exp(s_i - M) + exp(sink - M)), M the
// largest of the scores and the sink. A chunked row's sink joins once, where its chunks merge.
//
// Pool layout, as radixserve/runner/kv_cache.py allocates it: [num_blocks, block_size, KVH, dp],
// of float32, float16 or bfloat16 (dp = d; --kv-cache-dtype; read widened to float32, exactly),
// or int8 with dp = d + 4: each head's row holds its d values as int8 of one scale per row
// (s = max|x| / 127, q = round(x / s), as llama.cpp's q8_0 KV but one block per head row) and
// then s as 4 float bytes; read as q * s (K: the widened row, V: each row's weights).

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "scratch.h"
#include "simd.h"

namespace {

using namespace simd;

// An int8 pool element; a head row of them ends in its float scale (the header's layout).
struct q8 {
  int8_t v;
};
template <typename KV>
constexpr int64_t kRowExtra = std::is_same_v<KV, q8> ? 4 : 0;  // pool row pitch dp = d + this

using simd::load_kv;  // the float / f16 / bf16 overloads beside this one
inline vf load_kv(const q8* p, int64_t n) {
  if (n >= kW) return load_i8((const int8_t*)p);
  alignas(64) int8_t tmp[kW] = {};
  if (n > 0) memcpy(tmp, p, (size_t)n);
  return load_i8(tmp);
}
inline float row_scale(const q8* row, int64_t d) {
  float s;
  memcpy(&s, row + d, 4);
  return s;
}
// One token's KVH head rows [KVH, d] floats -> [KVH, d + 4] int8 rows with their scales.
inline void store_token(q8* dst, const float* src, int64_t KVH, int64_t d) {
  for (int64_t h = 0; h < KVH; ++h, dst += d + 4, src += d) {
    float amax = 0.0f;
    for (int64_t i = 0; i < d; ++i) amax = fabsf(src[i]) > amax ? fabsf(src[i]) : amax;
    const float s = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t i = 0; i < d; ++i) dst[i].v = (int8_t)nearbyintf(src[i] * inv);
    memcpy(dst + d, &s, 4);
  }
}
template <typename KV>
inline void store_token(KV* dst, const float* src, int64_t KVH, int64_t d) {
  store_kv(dst, src, KVH * d);
}

// Asks for one head's rows of a sequence's tokens from `at` (a token index in its pool blocks
// `blocks`) to the end of that block, at most `left` of them: the next block's rows, while
// this one's are used. Once the pool has been in use a while, a sequence's blocks lie anywhere
// and the hardware prefetcher does not follow it from one block to the next; waiting on each
// block's misses, decode attention read scattered blocks at about half the speed of adjacent
// ones. The rows are asked for one at a time (row(i)), between the current block's rows, not
// all at once: a burst of a block's prefetches fills the core's miss buffers and stalls the
// loop until they drain. (always_inline: GCC 12 drops calls to a function whose only effect is
// a prefetch.)
template <typename KV>
struct NextRows {
  const char* first = nullptr;  // the next block's first wanted row
  int64_t n = 0, pitch = 0, bytes = 0;  // rows, bytes from one to the next, bytes of each
  NextRows() = default;
  NextRows(const KV* pool, const int64_t* blocks, int64_t at, int64_t left, int64_t bs,
           int64_t token_stride, int64_t d) {
    if (left <= 0) return;
    const int64_t off = at % bs;
    n = left < bs - off ? left : bs - off;
    pitch = token_stride * (int64_t)sizeof(KV);
    bytes = (d + kRowExtra<KV>) * (int64_t)sizeof(KV);
    first = (const char*)(pool + (blocks[at / bs] * bs + off) * token_stride);
  }
  __attribute__((always_inline)) inline void row(int64_t i) const {
    if (i >= n) return;
    const char* p = first + i * pitch;
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 2);
  }
  // Rows from `i` on: those the current block had no row of its own to ask beside.
  __attribute__((always_inline)) inline void rest(int64_t i) const {
    for (; i < n; ++i) row(i);
  }
};

// n pool rows from `rows` (token_stride apart) widened to float into wide (vpitch floats
// apart, dv vectors each, the last dlast wide; int8 rows times their scale), asking `next` for
// the next block's row i0 + i beside row i.
template <typename KV>
__attribute__((always_inline)) inline void widen_rows(const KV* rows, int n, int64_t token_stride,
                                                      const NextRows<KV>& next, int64_t i0,
                                                      int dv, int64_t dlast, int64_t d, float* wide,
                                                      int64_t vpitch) {
  for (int i = 0; i < n; ++i) {
    next.row(i0 + i);
    const KV* row = rows + i * token_stride;
    for (int c = 0; c < dv; ++c) {
      vf x = load_kv(row + kW * c, c == dv - 1 ? dlast : kW);
      if constexpr (std::is_same_v<KV, q8>) x = mul(x, set1(row_scale(row, d)));
      store(wide + i * vpitch + kW * c, x);
    }
  }
}

constexpr int kMaxGroup = 16;  // query heads per KV head
constexpr int kMaxDim = 256;  // head_dim
constexpr int kMaxDimVecs = kMaxDim / kW;
constexpr int kTileRows = 32;  // query rows of one sequence that share each K / V load
constexpr int kVTokens = 32;  // V rows widened at a time for a tile's rows

// Head-dim vectors of V per pass for G heads: as many as keep G of them of sums in about
// three quarters of the vector registers (a power of two, at most dv); 0 when G or dv is 0.
constexpr int kAccRegs = kW == 16 ? 24 : 12;
constexpr int v_block(int G, int dv) {
  if (G <= 0 || dv <= 0) return 0;
  int cb = 1;
  while (cb * 2 <= dv && cb * 2 * G <= kAccRegs) cb *= 2;
  return cb;
}
// The same for a row alone, which holds a V row's cb vectors beside its G * cb sums: as many
// as keep (G + 1) * cb within the registers less a few (AVX-512: 32 of them, AVX2: 16). The
// generic level's vectors are the compiler's, each two or four machine registers, kept in
// memory either way: all of a head in one pass there (passes only cost it time).
#if defined(__AVX2__)
constexpr int kAloneRegs = kW == 16 ? 28 : 14;
#else
constexpr int kAloneRegs = 1 << 20;
#endif
constexpr int v_block_alone(int G, int dv) {
  if (G <= 0 || dv <= 0) return 0;
  int cb = 1;
  while (cb * 2 <= dv && cb * 2 * (G + 1) <= kAloneRegs) cb *= 2;
  return cb;
}

// G heads' sums of head-dim vectors c0 .. c0 + cn - 1, into acc[g * cb + c]: zeros before a
// row's first token, else those carried in keep [g][vpitch] from its earlier tokens; and back.
inline void load_sums(vf* acc, const float* keep, int G, int cn, int cb, int64_t vpitch, int c0,
                      bool first) {
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < cn; ++c)
      acc[g * cb + c] = first ? zero() : load(keep + g * vpitch + kW * (c0 + c));
}
inline void store_sums(const vf* acc, float* keep, int G, int cn, int cb, int64_t vpitch,
                       int c0) {
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < cn; ++c) store(keep + g * vpitch + kW * (c0 + c), acc[g * cb + c]);
}

// One query row of a tile: its group's G heads of queries q [G, d], how many of the span's
// tokens it attends to (its first `len`), and where its result goes: head g at out + g *
// out_stride; with `ml` null the attention output, else this chunk's unnormalised sum of
// exp(score - max) * v, with head g's max score and sum of exp at ml[g * ml_stride], +1
// (merged by merge_chunks).
struct TileRow {
  const float* q;
  int64_t len;
  float* out;
  int64_t out_stride;
  float* ml;
  int64_t ml_stride;
};

// R query rows of one sequence (a tile) and NH consecutive KV heads over the context span
// starting at blocks[0] token `first`; row r attends to its first rows[r].len tokens of it.
// KV head h's pool rows start h * head_off elements after k_pool / v_pool, its G query heads'
// at rows[r].q + h * G * d, their results at out / ml + h * G * the row's stride. Each K and V
// row is loaded (and a 16-bit pool's widened) once for all the tile's rows and heads. Row r's
// operations are exactly those it runs alone (R = 1), in the same order, and each KV head's
// those it runs alone (NH = 1): scores kW tokens at a time (kW partial sums over the head dim
// folded by hsum_lanes), times scale, an exact two-pass softmax over its own tokens, then
// out += p * v token by token from its first. Which rows and heads share the call never
// reaches a row's arithmetic. NH > 1 (a decode row's every KV head, block by block: each pool
// block read whole, front to back, which the memory reads far faster than one head's rows
// strided through it) only with R = 1.
// sinks: the sink logits of the call's NH * G query heads (head h * G + g at sinks[h * G + g]),
// added to the denominator of the rows whose result is the output (ml null; a chunk's partials
// leave the sink to merge_chunks), or null for none.
// Scratch: scores [R][NH * G][score_stride >= the longest len], acc [R][NH * G][dv * kW].
// kG / kDV > 0 fix the group size and the kW-float vectors per head at compile time (so the
// queries and sums stay in registers); 0 takes them from G and d at run time.
template <typename KV, int kG, int kDV>
void attend(const TileRow* rows, int R, int NH, const KV* k_pool, const KV* v_pool,
            int64_t head_off, const int64_t* blocks, int64_t first, int G_, int64_t d,
            int64_t bs, int64_t token_stride, float scale, float softcap, const float* sinks,
            float* scores, int64_t score_stride, float* acc_buf) {
  const int G = kG ? kG : G_;
  const int HG = NH * G;  // a row's query heads here
  const int dv = kDV ? kDV : (int)((d + kW - 1) / kW);
  const int64_t dlast = d - kW * (dv - 1);  // floats in a head's last vector
  const int64_t vpitch = (int64_t)kW * dv;  // a widened row's floats
  int64_t span = 0;
  for (int r = 0; r < R; ++r) span = rows[r].len > span ? rows[r].len : span;
  // Scores, kW tokens at a time per query head: kW partial-sum vectors folded into one vector
  // of kW dot products (hsum_lanes), block by block (no division per token).
  const vf ninf = set1(-INFINITY);
  alignas(64) float kwide[kW * kMaxDim];  // K rows as floats
  vf vmax[kTileRows * kMaxGroup];  // [r][h * G + g]; R * NH * G fit (the caller's check)
  for (int i = 0; i < R * HG; ++i) vmax[i] = ninf;
  for (int64_t t0 = 0; t0 < span;) {  // t0: the token's index in the span, first + t0 in all
    const int64_t off = (first + t0) % bs;  // where the span starts in this block
    const int64_t n_block = span - t0 < bs - off ? span - t0 : bs - off;
    for (int h = 0; h < NH; ++h) {
      const KV* kb =
          k_pool + h * head_off + (blocks[(first + t0) / bs] * bs + off) * token_stride;
      const NextRows<KV> next =  // the next block's K rows, else the first block's V rows
          t0 + n_block < span
              ? NextRows<KV>(k_pool + h * head_off, blocks, first + t0 + n_block,
                             span - t0 - n_block, bs, token_stride, d)
              : NextRows<KV>(v_pool + h * head_off, blocks, first, span, bs, token_stride, d);
      for (int64_t i0 = 0; i0 < n_block; i0 += kW) {
        const int n = (int)(n_block - i0 < kW ? n_block - i0 : kW);
        // The n K rows, widened once here for all rows and query heads (exactly: the same
        // floats, so the same bits as widening per head), zeros after them.
        widen_rows(kb + i0 * token_stride, n, token_stride, next, i0, dv, dlast, d, kwide,
                   vpitch);
        for (int i = n; i < kW; ++i)
          for (int c = 0; c < dv; ++c) store(kwide + i * vpitch + kW * c, zero());
        for (int r = 0; r < R; ++r) {
          const int64_t left = rows[r].len - (t0 + i0);
          if (left <= 0) continue;
          const int nr = left < n ? (int)left : n;  // this row's tokens of these n
          for (int g = 0; g < G; ++g) {
            // Token i's kW partial sums: the query's head-dim vector c times its K row's, in
            // order of c (the kW tokens interleaved: independent chains).
            const float* q = rows[r].q + (h * G + g) * d;
            vf part[kW];
            if constexpr (kW == 16) {  // 32 registers: the query's vectors stay in them
              vf qv[kDV ? kDV : kMaxDimVecs];
              for (int c = 0; c < dv; ++c) qv[c] = load_n(q + kW * c, c == dv - 1 ? dlast : kW);
              for (int i = 0; i < kW; ++i) part[i] = mul(qv[0], load(kwide + i * vpitch));
              for (int c = 1; c < dv; ++c)
                for (int i = 0; i < kW; ++i)
                  part[i] = fmadd(qv[c], load(kwide + i * vpitch + kW * c), part[i]);
            } else {  // 16 registers: the sums, and the query's vector c loaded as it goes
              vf qc = load_n(q, dv == 1 ? dlast : kW);
              for (int i = 0; i < kW; ++i) part[i] = mul(qc, load(kwide + i * vpitch));
              for (int c = 1; c < dv; ++c) {
                qc = load_n(q + kW * c, c == dv - 1 ? dlast : kW);
                for (int i = 0; i < kW; ++i)
                  part[i] = fmadd(qc, load(kwide + i * vpitch + kW * c), part[i]);
              }
            }
            vf sc = mul(hsum_lanes(part), set1(scale));
            float* dst = scores + (r * HG + h * G + g) * score_stride + t0 + i0;
            store_n(dst, sc, nr);
            if (softcap > 0.0f) {  // Gemma 2: cap * tanh(score / cap), before the softmax
              for (int i = 0; i < nr; ++i) dst[i] = softcap * tanhf(dst[i] / softcap);
              sc = load_n(dst, nr);
            }
            vmax[r * HG + h * G + g] = max(vmax[r * HG + h * G + g], keep_n(sc, nr, ninf));
          }
        }
      }
      next.rest(n_block);
    }
    t0 += n_block;
  }
  // Softmax per row and head over its own tokens: exp(score - max) in place, and the sum.
  float inv_sum[kTileRows * kMaxGroup];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < HG; ++g) {  // g: the query head h * G + g' here
      const int64_t len = rows[r].len;
      float* sg = scores + (r * HG + g) * score_stride;
      float row_max = reduce_max(vmax[r * HG + g]);
      const bool sink = sinks && !rows[r].ml;  // this row's denominator takes the sink here
      if (sink && sinks[g] > row_max) row_max = sinks[g];
      const vf m = set1(row_max);
      vf sum = zero();
      for (int64_t t = 0; t < len; t += kW) {
        vf e = keep_n(exp_ps(sub(load_n(sg + t, len - t), m)), len - t, zero());
        store_n(sg + t, e, len - t);
        sum = add(sum, e);
      }
      const float total = reduce_add(sum) + (sink ? expf(sinks[g] - row_max) : 0.0f);
      float* ml = rows[r].ml;
      inv_sum[r * HG + g] = ml ? 1.0f : 1.0f / total;
      if (ml) ml[g * rows[r].ml_stride] = row_max, ml[g * rows[r].ml_stride + 1] = total;
    }
  // out += p * v, token by token, into acc_buf. A row alone (a decode row): each V row widened
  // in registers, the sums kept in them. A tile: kVTokens V rows at a time, widened once for
  // all its rows; per row kCB head-dim vectors at a time for all its heads (the sums in
  // registers), carried in acc_buf between them. The same operations per row either way.
  const bool alone = R == 1;
  if (alone) {  // kCBA head-dim vectors of all G heads' sums at a time, in registers
    constexpr int kCBA = v_block_alone(kG, kDV);
    const int CBA = kCBA ? kCBA : v_block_alone(G, dv);
    for (int64_t t0 = 0; t0 < span;) {
      const int64_t off = (first + t0) % bs;
      const int64_t n = span - t0 < bs - off ? span - t0 : bs - off;
      for (int h = 0; h < NH; ++h) {
        const KV* vb =
            v_pool + h * head_off + (blocks[(first + t0) / bs] * bs + off) * token_stride;
        const NextRows<KV> next(v_pool + h * head_off, blocks, first + t0 + n, span - t0 - n, bs,
                                token_stride, d);
        float* keep = acc_buf + h * G * vpitch;
        const float* ps = scores + h * G * score_stride;
        for (int c0 = 0; c0 < dv; c0 += CBA) {
          const int cn = kCBA && kDV % kCBA == 0 ? kCBA : (dv - c0 < CBA ? dv - c0 : CBA);
          vf acc[kCBA ? kG * kCBA : kMaxGroup * kMaxDimVecs];  // [g][c - c0]
          load_sums(acc, keep, G, cn, CBA, vpitch, c0, t0 == 0);
          const KV* v = vb;
          for (int64_t i = 0; i < n; ++i, v += token_stride) {
            if (c0 == 0) next.row(i);
            vf vv[kCBA ? kCBA : kMaxDimVecs];
            for (int c = 0; c < cn; ++c)
              vv[c] = load_kv(v + kW * (c0 + c), c0 + c == dv - 1 ? dlast : kW);
            if constexpr (std::is_same_v<KV, q8>) {
              const vf sv = set1(row_scale(v, d));
              for (int c = 0; c < cn; ++c) vv[c] = mul(vv[c], sv);
            }
            for (int g = 0; g < G; ++g) {
              const vf p = set1(ps[g * score_stride + t0 + i]);
              for (int c = 0; c < cn; ++c) acc[g * CBA + c] = fmadd(p, vv[c], acc[g * CBA + c]);
            }
          }
          store_sums(acc, keep, G, cn, CBA, vpitch, c0);
        }
        next.rest(n);
      }
      t0 += n;
    }
  }
  alignas(64) float vwide[kVTokens * kMaxDim];
  constexpr int kCB = v_block(kG, kDV);
  const int CB = kCB ? kCB : v_block(G, dv);
  for (int64_t t0 = 0; !alone && t0 < span;) {  // a tile's rows
    const int64_t off = (first + t0) % bs;
    const KV* vb = v_pool + (blocks[(first + t0) / bs] * bs + off) * token_stride;
    const int64_t n_block = span - t0 < bs - off ? span - t0 : bs - off;
    const NextRows<KV> next(v_pool, blocks, first + t0 + n_block, span - t0 - n_block, bs,
                            token_stride, d);  // the next block's V rows
    for (int64_t i0 = 0; i0 < n_block; i0 += kVTokens) {
      const int n = (int)(n_block - i0 < kVTokens ? n_block - i0 : kVTokens);
      widen_rows(vb + i0 * token_stride, n, token_stride, next, i0, dv, dlast, d, vwide, vpitch);
      const int64_t at = t0 + i0;  // the first of these tokens in the span
      for (int r = 0; r < R; ++r) {
        const int64_t left = rows[r].len - at;
        if (left <= 0) continue;
        const int nr = left < n ? (int)left : n;
        float* keep = acc_buf + r * HG * vpitch;  // NH = 1 here: HG = G
        const float* p = scores + r * HG * score_stride + at;
        for (int c0 = 0; c0 < dv; c0 += CB) {
          const int cn = kCB && kDV % kCB == 0 ? kCB : (dv - c0 < CB ? dv - c0 : CB);
          vf acc[kCB ? kG * kCB : kMaxGroup * kMaxDimVecs];  // [g][c - c0]
          load_sums(acc, keep, G, cn, CB, vpitch, c0, at == 0);
          for (int i = 0; i < nr; ++i) {
            const float* v = vwide + i * vpitch + kW * c0;
            for (int g = 0; g < G; ++g) {
              const vf pg = set1(p[g * score_stride + i]);
              for (int c = 0; c < cn; ++c)
                acc[g * CB + c] = fmadd(pg, load(v + kW * c), acc[g * CB + c]);
            }
          }
          store_sums(acc, keep, G, cn, CB, vpitch, c0);
        }
      }
    }
    next.rest(n_block);
    t0 += n_block;
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < HG; ++g) {
      const float* a = acc_buf + (r * HG + g) * vpitch;
      const vf is = set1(inv_sum[r * HG + g]);
      float* out = rows[r].out + g * rows[r].out_stride;
      for (int c = 0; c < dv; ++c)
        store_n(out + kW * c, rows[r].ml ? load(a + kW * c) : mul(load(a + kW * c), is),
                c == dv - 1 ? dlast : kW);
    }
}

// One query head's output from its chunks' partials (acc [n][d], ml [n][2]), chunk by chunk in
// order: M = max m_c, w_c = exp(m_c - M), out = (sum w_c * acc_c) * (1 / sum w_c * l_c). With a
// sink logit (non-null `sink`): M also over it, and exp(sink - M) added to the denominator.
void merge_chunks(const float* acc, const float* ml, int64_t n, int64_t stride, int64_t d,
                  const float* sink, float* out) {
  float M = -INFINITY;
  for (int64_t c = 0; c < n; ++c) M = ml[c * 2] > M ? ml[c * 2] : M;
  if (sink && *sink > M) M = *sink;
  float total = sink ? expf(*sink - M) : 0.0f;
  for (int64_t i = 0; i < d; ++i) out[i] = 0.0f;
  for (int64_t c = 0; c < n; ++c) {
    const float w = expf(ml[c * 2] - M);
    total += w * ml[c * 2 + 1];
    for (int64_t i = 0; i < d; ++i) out[i] += w * acc[c * stride + i];
  }
  const float inv = 1.0f / total;
  for (int64_t i = 0; i < d; ++i) out[i] *= inv;
}

template <typename KV>
using AttendFn = void (*)(const TileRow*, int, int, const KV*, const KV*, int64_t,
                          const int64_t*, int64_t, int, int64_t, int64_t, int64_t, float, float,
                          const float*, float*, int64_t, float*);

// Context chunk of a row, in tokens: contexts longer than this are split into chunks attended
// as separate work items (balance across threads at batch 1, each chunk's K/V read once per KV
// head) and merged in order. A row's chunks depend only on its own length, so its bits do not
// depend on the batch; a context of at most one chunk is computed exactly as without chunks.
constexpr int64_t kChunkTokens = 512;

// Specialised for head_dim 64 and 128 with up to 8 query heads per KV head; else generic.
template <typename KV>
AttendFn<KV> pick_attend(int64_t G, int64_t d) {
  if (d == 64 || d == 128) {
    const bool wide = d == 128;
    switch (G) {
      case 1: return wide ? attend<KV, 1, 128 / kW> : attend<KV, 1, 64 / kW>;
      case 2: return wide ? attend<KV, 2, 128 / kW> : attend<KV, 2, 64 / kW>;
      case 3: return wide ? attend<KV, 3, 128 / kW> : attend<KV, 3, 64 / kW>;
      case 4: return wide ? attend<KV, 4, 128 / kW> : attend<KV, 4, 64 / kW>;
      case 5: return wide ? attend<KV, 5, 128 / kW> : attend<KV, 5, 64 / kW>;
      case 6: return wide ? attend<KV, 6, 128 / kW> : attend<KV, 6, 64 / kW>;
      case 7: return wide ? attend<KV, 7, 128 / kW> : attend<KV, 7, 64 / kW>;
      case 8: return wide ? attend<KV, 8, 128 / kW> : attend<KV, 8, 64 / kW>;
      default: break;
    }
  }
  return attend<KV, 0, 0>;
}

// rs_paged_attention for a pool of KV elements.
template <typename KV>
int paged_attention(const float* q, int64_t ldq, const float* k_new, int64_t ldk,
                    const float* v_new, int64_t ldv, const int64_t* slots, KV* k_pool,
                    KV* v_pool, const int64_t* table, int64_t table_stride,
                    const int64_t* row_seq, const int64_t* row_len, const int64_t* row_pos,
                    int64_t T, int64_t H, int64_t KVH, int64_t d, int64_t bs, float scale,
                    int64_t window, float softcap, const float* sinks, float* out) {
  const int64_t G = H / KVH;
  if (G * KVH != H || G > kMaxGroup || d > kMaxDim || d < 1) return 1;
  const int64_t dp = d + kRowExtra<KV>, width = KVH * dp;  // a pool row's pitch, a token's
  for (int64_t t = 0; t < T; ++t) {
    store_token(k_pool + slots[t] * width, k_new + t * ldk, KVH, d);
    store_token(v_pool + slots[t] * width, v_new + t * ldv, KVH, d);
  }
  const int64_t chunk = (kChunkTokens / bs > 0 ? kChunkTokens / bs : 1) * bs;
  // Row t attends to the tokens [lo(t), row_len[t]): all of them, or with a sliding window
  // those after p - window, p its position (transformers' mask: key j for the query at p when
  // p - window < j <= p). row_pos null: p = row_len - 1 (causal rows); a row whose limit goes
  // past its position (Gemma 3's image rows see their whole image) still counts its window
  // back from its position (transformers' AND of the window and OR(causal, image)).
  auto lo = [&](int64_t t) {
    const int64_t end = row_pos ? row_pos[t] + 1 : row_len[t];
    return window > 0 && end > window ? end - window : (int64_t)0;
  };
  auto span_of = [&](int64_t t) { return row_len[t] - lo(t); };
  auto chunks_of = [&](int64_t t) { return (span_of(t) + chunk - 1) / chunk; };
  // Tiles: runs of up to kTileRows consecutive rows of one sequence whose spans all start at
  // its first token (a prompt's rows; a row cut by its window is a tile of its own), so their
  // chunks begin at the same tokens. Work items (tile, first query head, chunk), ordered tile,
  // KV head, chunk, query heads. Partials of a chunked row: [row's offset + head * n + chunk].
  int64_t grouped_items = 0, partial_rows = 0, tiles = 0;
  int64_t* part_off =
      (int64_t*)scratch::get(scratch::kAttnOffsets, (size_t)(T > 0 ? T : 1) * 3 * sizeof(int64_t));
  if (!part_off) return 1;
  int64_t* tile_first = part_off + T;  // [tiles] the tile's first row
  int64_t* tile_chunks = part_off + 2 * T;  // [tiles] its longest row's chunks
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = chunks_of(t);
    part_off[t] = partial_rows;
    if (n > 1) partial_rows += H * n;
    const int64_t tf = tiles ? tile_first[tiles - 1] : -1;
    if (tf >= 0 && t - tf < kTileRows && row_seq[t] == row_seq[tf] && lo(t) == 0 && lo(tf) == 0) {
      tile_chunks[tiles - 1] = n > tile_chunks[tiles - 1] ? n : tile_chunks[tiles - 1];
    } else {
      tile_first[tiles] = t;
      tile_chunks[tiles++] = n;
    }
  }
  int64_t tile_rows = 1;  // the largest tile's rows: the scratch each thread needs
  for (int64_t i = 0; i < tiles; ++i) {
    grouped_items += KVH * tile_chunks[i];
    const int64_t rows = (i + 1 < tiles ? tile_first[i + 1] : T) - tile_first[i];
    tile_rows = rows > tile_rows ? rows : tile_rows;
  }
  // Few items (a batch-1 decode: 3 KV heads for 2 threads): one item per query head instead,
  // for balance. Rows alone (decodes) and enough of them: one item for all KV heads of a row's
  // chunk, its pool blocks read whole. Each query head's operations are the same either way,
  // so are its bits.
  const int threads = omp_get_max_threads();
  const bool per_head = G > 1 && grouped_items < 4 * threads;
  const bool all_heads = !per_head && KVH > 1 && tile_rows == 1 && H <= kTileRows * kMaxGroup &&
                         grouped_items / KVH >= 4 * threads;
  const AttendFn<KV> attend_fn = pick_attend<KV>(per_head ? 1 : G, d);
  const int64_t group = per_head ? 1 : G;
  const int64_t NH = all_heads ? KVH : 1;  // KV heads of an item
  const int64_t items = grouped_items * G / group / NH;
  int64_t* item_row = (int64_t*)scratch::get(
      scratch::kAttnItems, (size_t)(items > 0 ? items : 1) * 3 * sizeof(int64_t));
  float* partials = (float*)scratch::get(scratch::kAttnPartials,
                                         (size_t)(partial_rows * (d + 2) + 1) * sizeof(float));
  if (!item_row || !partials) return 1;
  int64_t max_span = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t span = chunks_of(t) > 1 ? chunk : span_of(t);
    max_span = span > max_span ? span : max_span;
  }
  for (int64_t tile = 0, i = 0; tile < tiles; ++tile)
    for (int64_t kvh = 0; kvh < KVH; kvh += NH)
      for (int64_t c = 0; c < tile_chunks[tile]; ++c)
        for (int64_t j = 0; j < G / group; ++j, ++i) {
          item_row[3 * i] = tile;
          item_row[3 * i + 1] = kvh * G + j * group;
          item_row[3 * i + 2] = c;
        }
  float* acc_part = partials;  // [partial_rows][d]
  float* ml_part = partials + partial_rows * d;  // [partial_rows][2]
  const int64_t dpad = (d + kW - 1) / kW * kW;
  const int item_chunk = tile_rows > 1 || all_heads ? 1 : 4;  // big items one at a time
  int failed = 0;
#pragma omp parallel
  {
    // scores [tile_rows][NH * group][max_span], sums [tile_rows][NH * group][dpad]
    float* scores = (float*)scratch::get(
        scratch::kAttnScores,
        (size_t)(tile_rows * NH * group * (max_span + dpad) + kW) * sizeof(float));
    if (!scores) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(dynamic, item_chunk)
    for (int64_t item = 0; item < items; ++item) {
      if (!scores) continue;
      const int64_t tile = item_row[3 * item], head = item_row[3 * item + 1];
      const int64_t c = item_row[3 * item + 2];
      const int64_t t_first = tile_first[tile];
      const int64_t t_end = tile + 1 < tiles ? tile_first[tile + 1] : T;
      const int64_t h = head / G;  // the KV head
      TileRow rows[kTileRows];
      int R = 0;
      for (int64_t t = t_first; t < t_end; ++t) {
        const int64_t span = span_of(t), n = chunks_of(t);
        if (c >= n) continue;  // shorter than this chunk
        TileRow& row = rows[R++];
        row.q = q + t * ldq + head * d;
        if (n == 1) {
          row.len = span;
          row.out = out + (t * H + head) * d, row.out_stride = d;
          row.ml = nullptr, row.ml_stride = 0;
        } else {
          const int64_t begin = c * chunk;
          const int64_t p = part_off[t] + head * n + c;  // head `head`, chunk c; next head +n
          row.len = span - begin < chunk ? span - begin : chunk;
          row.out = acc_part + p * d, row.out_stride = n * d;
          row.ml = ml_part + 2 * p, row.ml_stride = 2 * n;
        }
      }
      const int64_t* blocks = table + row_seq[t_first] * table_stride;
      attend_fn(rows, R, (int)NH, k_pool + h * dp, v_pool + h * dp, dp, blocks,
                lo(t_first) + c * chunk, (int)group, d, bs, width, scale, softcap,
                sinks ? sinks + head : nullptr, scores, max_span,
                scores + tile_rows * NH * group * max_span);
    }
#pragma omp for schedule(static)
    for (int64_t th = 0; th < T * H; ++th) {
      const int64_t t = th / H, head = th % H;
      const int64_t n = (span_of(t) + chunk - 1) / chunk;
      if (n == 1) continue;
      const int64_t p = part_off[t] + head * n;
      merge_chunks(acc_part + p * d, ml_part + 2 * p, n, d, d, sinks ? sinks + head : nullptr,
                   out + (t * H + head) * d);
    }
  }
  return failed;
}

}  // namespace

extern "C" {

// First stores the step's new K/V rows (k_new/v_new [T, KVH * d], row strides ldk/ldv) at their
// pool slots [T], then attends. q [T, H * d] (row stride ldq), out [T, H, d] contiguous; pools
// [num_blocks, bs, KVH, d] (int8: d + 4); table [S, table_stride] int64 block ids; row_seq [T]
// int64 (< S), row_len [T] int64 (>= 1), row_pos [T] int64 each row's position (null: row_len
// - 1; a window counts back from it). H / KVH <= 16, d <= 256. kv_dtype: the pools'
// elements, 0 float32, 1 float16, 2 bfloat16 (new rows rounded to nearest even when stored),
// 3 int8 with a scale per head row (the header). window > 0: each row attends to its last
// `window` tokens only (a sliding-window layer), 0: to all; softcap > 0: scores become
// softcap * tanh(score / softcap) before the softmax (Gemma 2), 0: unchanged; sinks [H] float:
// each query head's sink logit in its softmax's denominator (gpt-oss, the header), null: none.
// Returns 0, or 1 on bad shapes, an unknown kv_dtype or no memory.
int rs_paged_attention(const float* q, int64_t ldq, const float* k_new, int64_t ldk,
                       const float* v_new, int64_t ldv, const int64_t* slots, void* k_pool,
                       void* v_pool, int64_t kv_dtype, const int64_t* table,
                       int64_t table_stride, const int64_t* row_seq, const int64_t* row_len,
                       const int64_t* row_pos, int64_t T, int64_t H, int64_t KVH, int64_t d,
                       int64_t bs, float scale, int64_t window, float softcap,
                       const float* sinks, float* out) {
  auto run = [&](auto* kind) {  // the pools as elements of kind's type
    using KV = std::remove_pointer_t<decltype(kind)>;
    return paged_attention(q, ldq, k_new, ldk, v_new, ldv, slots, (KV*)k_pool, (KV*)v_pool,
                           table, table_stride, row_seq, row_len, row_pos, T, H, KVH, d, bs,
                           scale, window, softcap, sinks, out);
  };
  switch (kv_dtype) {
    case 0: return run((float*)nullptr);
    case 1: return run((f16*)nullptr);
    case 2: return run((bf16*)nullptr);
    case 3: return run((q8*)nullptr);
    default: return 1;
  }
}

}  // extern "C"

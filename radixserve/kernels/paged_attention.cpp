// Attention over the paged KV pool, read in place (no gathered copy of K/V per layer), for
// every query row of a step: decodes, chunks and whole prompts alike.
//
// Query row t belongs to sequence row_seq[t] and attends to its first row_len[t] tokens (the
// causal limit; a sliding-window layer: only the last `window` of them), whose KV lives in the
// pool blocks table[row_seq[t], 0..]; the row's grouped
// query heads (H / KVH per KV head) share each K and V load. One work item per (row, KV head)
// with a fixed order of operations: scores q.k * scale token by token, an exact two-pass
// softmax (max, then exp and sum) and the weighted sum of V, in float32. So a row's result
// depends only on its query and its context, never on how the step was batched, chunked, or
// which part of the context came from the prefix cache.
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

constexpr int kMaxGroup = 16;  // query heads per KV head
constexpr int kMaxDim = 256;  // head_dim
constexpr int kMaxDimVecs = kMaxDim / kW;

// One (row, KV head) over `len` context tokens starting at blocks[0]: q [G, d] (the row's heads
// of this group), out [G, d]; scores scratch [G, len]. With `ml` null, out is the attention
// output; otherwise this is one chunk of a longer context: out gets the unnormalised sum of
// exp(score - max) * v and ml[2g], ml[2g + 1] head g's max score and sum of exp (merged by
// merge_chunks). kG / kDV > 0 fix the group size and the kW-float vectors per head at compile
// time (so the queries and sums stay in registers); 0 takes them from G and d at run time.
template <typename KV, int kG, int kDV>
void attend(const float* q, const KV* k_pool, const KV* v_pool, const int64_t* blocks,
            int64_t first, int64_t len, int G_, int64_t d, int64_t bs, int64_t token_stride,
            float scale, float softcap, float* scores, float* out, float* ml) {
  const int G = kG ? kG : G_;
  const int dv = kDV ? kDV : (int)((d + kW - 1) / kW);
  const int64_t dlast = d - kW * (dv - 1);  // floats in a head's last vector
  vf qv[kG ? kG : kMaxGroup][kDV ? kDV : kMaxDimVecs];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < dv; ++c) qv[g][c] = load_n(q + g * d + kW * c, c == dv - 1 ? dlast : kW);
  // Scores, kW tokens at a time per query head: kW partial-sum vectors folded into one vector
  // of kW dot products (hsum_lanes), block by block (no division per token).
  const vf ninf = set1(-INFINITY);
  alignas(64) float kwide[std::is_same_v<KV, float> ? 1 : kW * kMaxDim];  // widened K rows
  vf vmax[kG ? kG : kMaxGroup];
  for (int g = 0; g < G; ++g) vmax[g] = ninf;
  for (int64_t t0 = 0; t0 < len;) {  // t0: the token's index in the span, first + t0 in all
    const int64_t off = (first + t0) % bs;  // where the span starts in this block
    const KV* kb = k_pool + (blocks[(first + t0) / bs] * bs + off) * token_stride;
    const int64_t n_block = len - t0 < bs - off ? len - t0 : bs - off;
    for (int64_t i0 = 0; i0 < n_block; i0 += kW) {
      const int n = (int)(n_block - i0 < kW ? n_block - i0 : kW);
      // A 16-bit pool's rows are widened once here for all G query heads (exactly: the same
      // floats, so the same bits as widening per head).
      const KV* krows = kb + i0 * token_stride;
      int64_t kstride = token_stride;
      if constexpr (!std::is_same_v<KV, float>) {
        for (int i = 0; i < n; ++i) {
          const KV* row = krows + i * token_stride;
          for (int c = 0; c < dv; ++c) {
            vf x = load_kv(row + kW * c, c == dv - 1 ? dlast : kW);
            if constexpr (std::is_same_v<KV, q8>) x = mul(x, set1(row_scale(row, d)));
            store(kwide + i * kW * dv + kW * c, x);
          }
        }
        kstride = kW * dv;
      }
      for (int g = 0; g < G; ++g) {
        vf part[kW];
        for (int i = 0; i < kW; ++i) {
          if (i >= n) {
            part[i] = zero();
            continue;
          }
          if constexpr (std::is_same_v<KV, float>) {
            const float* k = krows + i * kstride;
            vf acc = mul(qv[g][0], load_n(k, dv == 1 ? dlast : kW));
            for (int c = 1; c < dv; ++c)
              acc = fmadd(qv[g][c], load_n(k + kW * c, c == dv - 1 ? dlast : kW), acc);
            part[i] = acc;
          } else {  // widened rows: whole vectors, zeros past d
            const float* k = kwide + i * kstride;
            vf acc = mul(qv[g][0], load(k));
            for (int c = 1; c < dv; ++c) acc = fmadd(qv[g][c], load(k + kW * c), acc);
            part[i] = acc;
          }
        }
        vf sc = mul(hsum_lanes(part), set1(scale));
        float* dst = scores + g * len + t0 + i0;
        store_n(dst, sc, n);
        if (softcap > 0.0f) {  // Gemma 2: cap * tanh(score / cap), before the softmax
          for (int i = 0; i < n; ++i) dst[i] = softcap * tanhf(dst[i] / softcap);
          sc = load_n(dst, n);
        }
        vmax[g] = max(vmax[g], keep_n(sc, n, ninf));
      }
    }
    t0 += n_block;
  }
  float row_max[kMaxGroup];
  for (int g = 0; g < G; ++g) row_max[g] = reduce_max(vmax[g]);
  float inv_sum[kMaxGroup];
  for (int g = 0; g < G; ++g) {
    float* sg = scores + g * len;
    const vf m = set1(row_max[g]);
    vf sum = zero();
    for (int64_t t = 0; t < len; t += kW) {
      vf e = keep_n(exp_ps(sub(load_n(sg + t, len - t), m)), len - t, zero());
      store_n(sg + t, e, len - t);
      sum = add(sum, e);
    }
    const float total = reduce_add(sum);
    inv_sum[g] = ml ? 1.0f : 1.0f / total;
    if (ml) ml[2 * g] = row_max[g], ml[2 * g + 1] = total;
  }
  vf acc[kG ? kG : kMaxGroup][kDV ? kDV : kMaxDimVecs];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < dv; ++c) acc[g][c] = zero();
  for (int64_t t0 = 0; t0 < len;) {
    const int64_t off = (first + t0) % bs;
    const KV* v = v_pool + (blocks[(first + t0) / bs] * bs + off) * token_stride;
    const int64_t n = len - t0 < bs - off ? len - t0 : bs - off;
    for (int64_t i = 0; i < n; ++i, v += token_stride) {
      vf vv[kDV ? kDV : kMaxDimVecs];
      for (int c = 0; c < dv; ++c) vv[c] = load_kv(v + kW * c, c == dv - 1 ? dlast : kW);
      if constexpr (std::is_same_v<KV, q8>) {
        const vf sv = set1(row_scale(v, d));
        for (int c = 0; c < dv; ++c) vv[c] = mul(vv[c], sv);
      }
      for (int g = 0; g < G; ++g) {
        vf p = set1(scores[g * len + t0 + i]);
        for (int c = 0; c < dv; ++c) acc[g][c] = fmadd(p, vv[c], acc[g][c]);
      }
    }
    t0 += n;
  }
  for (int g = 0; g < G; ++g) {
    vf is = set1(inv_sum[g]);
    for (int c = 0; c < dv; ++c)
      store_n(out + g * d + kW * c, ml ? acc[g][c] : mul(acc[g][c], is),
              c == dv - 1 ? dlast : kW);
  }
}

// One query head's output from its chunks' partials (acc [n][d], ml [n][2]), chunk by chunk in
// order: M = max m_c, w_c = exp(m_c - M), out = (sum w_c * acc_c) * (1 / sum w_c * l_c).
void merge_chunks(const float* acc, const float* ml, int64_t n, int64_t stride, int64_t d,
                  float* out) {
  float M = -INFINITY;
  for (int64_t c = 0; c < n; ++c) M = ml[c * 2] > M ? ml[c * 2] : M;
  float total = 0.0f;
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
using AttendFn = void (*)(const float*, const KV*, const KV*, const int64_t*, int64_t, int64_t,
                          int, int64_t, int64_t, int64_t, float, float, float*, float*, float*);

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
                    const int64_t* row_seq, const int64_t* row_len, int64_t T, int64_t H,
                    int64_t KVH, int64_t d, int64_t bs, float scale, int64_t window,
                    float softcap, float* out) {
  const int64_t G = H / KVH;
  if (G * KVH != H || G > kMaxGroup || d > kMaxDim || d < 1) return 1;
  const int64_t dp = d + kRowExtra<KV>, width = KVH * dp;  // a pool row's pitch, a token's
  for (int64_t t = 0; t < T; ++t) {
    store_token(k_pool + slots[t] * width, k_new + t * ldk, KVH, d);
    store_token(v_pool + slots[t] * width, v_new + t * ldv, KVH, d);
  }
  const int64_t chunk = (kChunkTokens / bs > 0 ? kChunkTokens / bs : 1) * bs;
  // Row t attends to the tokens [lo(t), row_len[t]): all of them, or with a sliding window
  // the last `window` (transformers' mask: key j for the query at p when p - window < j <= p).
  auto lo = [&](int64_t t) {
    return window > 0 && row_len[t] > window ? row_len[t] - window : (int64_t)0;
  };
  auto span_of = [&](int64_t t) { return row_len[t] - lo(t); };
  // Work items (row, first query head, chunk), ordered row, KV head, chunk, query heads: the
  // heads of one KV head follow each other on a chunk, which they then read from cache.
  // Partials of a chunked row: [row's offset + head * n + chunk].
  int64_t grouped_items = 0, partial_rows = 0;
  int64_t* part_off = (int64_t*)malloc((size_t)(T > 0 ? T : 1) * sizeof(int64_t));
  if (!part_off) return 1;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = (span_of(t) + chunk - 1) / chunk;
    grouped_items += KVH * n;
    part_off[t] = partial_rows;
    if (n > 1) partial_rows += H * n;
  }
  // Few items (a batch-1 decode: 3 KV heads for 2 threads): one item per query head instead,
  // for balance. Each query head's operations are the same either way, so are its bits.
  const bool per_head = G > 1 && grouped_items < 4 * omp_get_max_threads();
  const AttendFn<KV> attend_fn = pick_attend<KV>(per_head ? 1 : G, d);
  const int64_t group = per_head ? 1 : G;
  const int64_t items = grouped_items * G / group;
  int64_t* item_row = (int64_t*)malloc((size_t)(items > 0 ? items : 1) * 3 * sizeof(int64_t));
  float* partials = (float*)malloc((size_t)(partial_rows * (d + 2) + 1) * sizeof(float));
  if (!item_row || !partials) {
    free(part_off);
    free(item_row);
    free(partials);
    return 1;
  }
  int64_t max_span = 0;
  for (int64_t t = 0, i = 0; t < T; ++t) {
    const int64_t n = (span_of(t) + chunk - 1) / chunk;
    const int64_t span = n > 1 ? chunk : span_of(t);
    max_span = span > max_span ? span : max_span;
    for (int64_t kvh = 0; kvh < KVH; ++kvh)
      for (int64_t c = 0; c < n; ++c)
        for (int64_t j = 0; j < G / group; ++j, ++i) {
          item_row[3 * i] = t;
          item_row[3 * i + 1] = kvh * G + j * group;
          item_row[3 * i + 2] = c;
        }
  }
  float* acc_part = partials;  // [partial_rows][d]
  float* ml_part = partials + partial_rows * d;  // [partial_rows][2]
  int failed = 0;
#pragma omp parallel
  {
    float* scores = (float*)malloc((size_t)(G * max_span + kW) * sizeof(float));
    if (!scores) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(dynamic, 4)
    for (int64_t item = 0; item < items; ++item) {
      if (!scores) continue;
      const int64_t t = item_row[3 * item], first = item_row[3 * item + 1];
      const int64_t c = item_row[3 * item + 2];
      const int64_t h = first / G;  // the KV head
      const int64_t span = span_of(t), n = (span + chunk - 1) / chunk;
      const int64_t* blocks = table + row_seq[t] * table_stride;
      if (n == 1) {
        attend_fn(q + t * ldq + first * d, k_pool + h * dp, v_pool + h * dp, blocks, lo(t), span,
                  (int)group, d, bs, width, scale, softcap, scores, out + (t * H + first) * d,
                  nullptr);
        continue;
      }
      const int64_t begin = c * chunk;
      const int64_t len = span - begin < chunk ? span - begin : chunk;
      const int64_t p = part_off[t] + first * n + c;  // head `first`, chunk c; next head +n
      float ml[2 * kMaxGroup];
      float* acc = acc_part + p * d;
      alignas(64) float tmp[kMaxGroup * kMaxDim];
      attend_fn(q + t * ldq + first * d, k_pool + h * dp, v_pool + h * dp, blocks,
                lo(t) + begin, len, (int)group, d, bs, width, scale, softcap, scores, tmp, ml);
      for (int64_t g = 0; g < group; ++g) {
        memcpy(acc + g * n * d, tmp + g * d, (size_t)d * sizeof(float));
        ml_part[2 * (p + g * n)] = ml[2 * g];
        ml_part[2 * (p + g * n) + 1] = ml[2 * g + 1];
      }
    }
    free(scores);
#pragma omp for schedule(static)
    for (int64_t th = 0; th < T * H; ++th) {
      const int64_t t = th / H, head = th % H;
      const int64_t n = (span_of(t) + chunk - 1) / chunk;
      if (n == 1) continue;
      const int64_t p = part_off[t] + head * n;
      merge_chunks(acc_part + p * d, ml_part + 2 * p, n, d, d, out + (t * H + head) * d);
    }
  }
  free(part_off);
  free(item_row);
  free(partials);
  return failed;
}

}  // namespace

extern "C" {

// First stores the step's new K/V rows (k_new/v_new [T, KVH * d], row strides ldk/ldv) at their
// pool slots [T], then attends. q [T, H * d] (row stride ldq), out [T, H, d] contiguous; pools
// [num_blocks, bs, KVH, d] (int8: d + 4); table [S, table_stride] int64 block ids; row_seq [T]
// int64 (< S), row_len [T] int64 (>= 1). H / KVH <= 16, d <= 256. kv_dtype: the pools'
// elements, 0 float32, 1 float16, 2 bfloat16 (new rows rounded to nearest even when stored),
// 3 int8 with a scale per head row (the header). window > 0: each row attends to its last
// `window` tokens only (a sliding-window layer), 0: to all; softcap > 0: scores become
// softcap * tanh(score / softcap) before the softmax (Gemma 2), 0: unchanged. Returns 0, or 1
// on bad shapes, an unknown kv_dtype or no memory.
int rs_paged_attention(const float* q, int64_t ldq, const float* k_new, int64_t ldk,
                       const float* v_new, int64_t ldv, const int64_t* slots, void* k_pool,
                       void* v_pool, int64_t kv_dtype, const int64_t* table,
                       int64_t table_stride, const int64_t* row_seq, const int64_t* row_len,
                       int64_t T, int64_t H, int64_t KVH, int64_t d, int64_t bs, float scale,
                       int64_t window, float softcap, float* out) {
  auto run = [&](auto* kind) {  // the pools as elements of kind's type
    using KV = std::remove_pointer_t<decltype(kind)>;
    return paged_attention(q, ldq, k_new, ldk, v_new, ldv, slots, (KV*)k_pool, (KV*)v_pool,
                           table, table_stride, row_seq, row_len, T, H, KVH, d, bs, scale, window,
                           softcap, out);
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

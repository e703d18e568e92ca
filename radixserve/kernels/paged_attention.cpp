// Attention over the paged KV pool, read in place (no gathered copy of K/V per layer), for
// every query row of a step: decodes, chunks and whole prompts alike.
//
// Query row t belongs to sequence row_seq[t] and attends to its first row_len[t] tokens (the
// causal limit), whose KV lives in the pool blocks table[row_seq[t], 0..]; the row's grouped
// query heads (H / KVH per KV head) share each K and V load. One work item per (row, KV head)
// with a fixed order of operations: scores q.k * scale token by token, an exact two-pass
// softmax (max, then exp and sum) and the weighted sum of V, in float32. So a row's result
// depends only on its query and its context, never on how the step was batched, chunked, or
// which part of the context came from the prefix cache.
//
// Pool layout, as radixserve/runner/kv_cache.py allocates it: [num_blocks, block_size, KVH, d].

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

namespace {

// Lane i of the result = the sum of the 16 lanes of a[i] (a 16 x 16 transpose-and-add).
inline __m512 hsum16(const __m512 a[16]) {
  __m512 s1[8], s2[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3]
    s1[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                          _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: the lane's sums of a[4i .. 4i+3]
    s2[i] = _mm512_add_ps(_mm512_shuffle_ps(s1[2 * i], s1[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                          _mm512_shuffle_ps(s1[2 * i], s1[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 t01 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[0], s2[1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(s2[0], s2[1], _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 t23 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[2], s2[3], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(s2[2], s2[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(t01, t23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(t01, t23, _MM_SHUFFLE(3, 1, 3, 1)));
}

constexpr int kMaxGroup = 16;  // query heads per KV head
constexpr int kMaxDimVecs = 16;  // head_dim up to 256

// One (row, KV head): q [G, d] (row's heads of this group), out [G, d]; scores scratch [G, len].
// kG / kDV > 0 fix the group size and the 16-float vectors per head at compile time (so the
// queries and sums stay in registers); 0 takes them from G and d at run time.
template <int kG, int kDV>
void attend(const float* q, const float* k_pool, const float* v_pool, const int64_t* blocks,
            int64_t len, int G_, int64_t d, int64_t bs, int64_t token_stride, float scale,
            float* scores, float* out) {
  const int G = kG ? kG : G_;
  const int dv = kDV ? kDV : (int)((d + 15) / 16);
  const __mmask16 dmask = tail_mask(d - 16 * (dv - 1));
  __m512 qv[kG ? kG : kMaxGroup][kDV ? kDV : kMaxDimVecs];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < dv; ++c)
      qv[g][c] = _mm512_maskz_loadu_ps(c == dv - 1 ? dmask : (__mmask16)0xFFFF, q + g * d + 16 * c);
  // Scores, 16 tokens at a time per query head: 16 partial-sum vectors folded into one vector
  // of 16 dot products (hsum16), block by block (no division per token).
  __m512 vmax[kG ? kG : kMaxGroup];
  for (int g = 0; g < G; ++g) vmax[g] = _mm512_set1_ps(-INFINITY);
  for (int64_t t0 = 0; t0 < len; t0 += bs) {
    const float* kb = k_pool + blocks[t0 / bs] * bs * token_stride;
    const int64_t n_block = len - t0 < bs ? len - t0 : bs;
    for (int64_t i0 = 0; i0 < n_block; i0 += 16) {
      const int n = (int)(n_block - i0 < 16 ? n_block - i0 : 16);
      const __mmask16 tm = tail_mask(n);
      for (int g = 0; g < G; ++g) {
        __m512 part[16];
        for (int i = 0; i < 16; ++i) {
          if (i >= n) {
            part[i] = _mm512_setzero_ps();
            continue;
          }
          const float* k = kb + (i0 + i) * token_stride;
          __m512 acc = _mm512_mul_ps(
              qv[g][0], _mm512_maskz_loadu_ps(dv == 1 ? dmask : (__mmask16)0xFFFF, k));
          for (int c = 1; c < dv; ++c)
            acc = _mm512_fmadd_ps(
                qv[g][c], _mm512_maskz_loadu_ps(c == dv - 1 ? dmask : (__mmask16)0xFFFF, k + 16 * c),
                acc);
          part[i] = acc;
        }
        __m512 sc = _mm512_mul_ps(hsum16(part), _mm512_set1_ps(scale));
        _mm512_mask_storeu_ps(scores + g * len + t0 + i0, tm, sc);
        vmax[g] = _mm512_mask_max_ps(vmax[g], tm, vmax[g], sc);
      }
    }
  }
  float row_max[kMaxGroup];
  for (int g = 0; g < G; ++g) row_max[g] = _mm512_reduce_max_ps(vmax[g]);
  float inv_sum[kMaxGroup];
  for (int g = 0; g < G; ++g) {
    float* sg = scores + g * len;
    const __m512 m = _mm512_set1_ps(row_max[g]);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < len; t += 16) {
      __mmask16 tm = tail_mask(len - t);
      __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tm, sg + t), m));
      e = _mm512_maskz_mov_ps(tm, e);
      _mm512_mask_storeu_ps(sg + t, tm, e);
      sum = _mm512_add_ps(sum, e);
    }
    inv_sum[g] = 1.0f / _mm512_reduce_add_ps(sum);
  }
  __m512 acc[kG ? kG : kMaxGroup][kDV ? kDV : kMaxDimVecs];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < dv; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t t0 = 0; t0 < len; t0 += bs) {
    const float* v = v_pool + blocks[t0 / bs] * bs * token_stride;
    const int64_t n = len - t0 < bs ? len - t0 : bs;
    for (int64_t i = 0; i < n; ++i, v += token_stride) {
      __m512 vv[kDV ? kDV : kMaxDimVecs];
      for (int c = 0; c < dv; ++c)
        vv[c] = _mm512_maskz_loadu_ps(c == dv - 1 ? dmask : (__mmask16)0xFFFF, v + 16 * c);
      for (int g = 0; g < G; ++g) {
        __m512 p = _mm512_set1_ps(scores[g * len + t0 + i]);
        for (int c = 0; c < dv; ++c) acc[g][c] = _mm512_fmadd_ps(p, vv[c], acc[g][c]);
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    __m512 is = _mm512_set1_ps(inv_sum[g]);
    for (int c = 0; c < dv; ++c)
      _mm512_mask_storeu_ps(out + g * d + 16 * c, c == dv - 1 ? dmask : (__mmask16)0xFFFF,
                            _mm512_mul_ps(acc[g][c], is));
  }
}

using AttendFn = void (*)(const float*, const float*, const float*, const int64_t*, int64_t,
                         int, int64_t, int64_t, int64_t, float, float*, float*);

// Specialised for head_dim 64 and 128 with up to 8 query heads per KV head; else generic.
AttendFn pick_attend(int64_t G, int64_t d) {
  if (d == 64 || d == 128) {
    const bool wide = d == 128;
    switch (G) {
      case 1: return wide ? attend<1, 8> : attend<1, 4>;
      case 2: return wide ? attend<2, 8> : attend<2, 4>;
      case 3: return wide ? attend<3, 8> : attend<3, 4>;
      case 4: return wide ? attend<4, 8> : attend<4, 4>;
      case 5: return wide ? attend<5, 8> : attend<5, 4>;
      case 6: return wide ? attend<6, 8> : attend<6, 4>;
      case 7: return wide ? attend<7, 8> : attend<7, 4>;
      case 8: return wide ? attend<8, 8> : attend<8, 4>;
      default: break;
    }
  }
  return attend<0, 0>;
}

}  // namespace

extern "C" {

// First stores the step's new K/V rows (k_new/v_new [T, KVH * d], row strides ldk/ldv) at their
// pool slots [T], then attends. q [T, H * d] (row stride ldq), out [T, H, d] contiguous; pools
// [num_blocks, bs, KVH, d]; table [S, table_stride] int64 block ids; row_seq [T] int64 (< S),
// row_len [T] int64 (>= 1). H / KVH <= 16, d <= 256. Returns 0, or 1 on bad shapes or no memory.
int rs_paged_attention(const float* q, int64_t ldq, const float* k_new, int64_t ldk,
                       const float* v_new, int64_t ldv, const int64_t* slots, float* k_pool,
                       float* v_pool, const int64_t* table, int64_t table_stride,
                       const int64_t* row_seq, const int64_t* row_len, int64_t T, int64_t H,
                       int64_t KVH, int64_t d, int64_t bs, float scale, float* out) {
  const int64_t G = H / KVH;
  if (G * KVH != H || G > kMaxGroup || d > 16 * kMaxDimVecs || d < 1) return 1;
  const int64_t width = KVH * d;
  for (int64_t t = 0; t < T; ++t) {
    memcpy(k_pool + slots[t] * width, k_new + t * ldk, (size_t)width * sizeof(float));
    memcpy(v_pool + slots[t] * width, v_new + t * ldv, (size_t)width * sizeof(float));
  }
  int64_t max_len = 0;
  for (int64_t t = 0; t < T; ++t) max_len = row_len[t] > max_len ? row_len[t] : max_len;
  // Few rows (a batch-1 decode: 3 KV heads for 2 threads): one item per query head instead,
  // for balance. Each query head's operations are the same either way, so are its bits.
  const bool per_head = G > 1 && T * KVH < 4 * omp_get_max_threads();
  const AttendFn attend_fn = pick_attend(per_head ? 1 : G, d);
  const int64_t group = per_head ? 1 : G, items = T * (H / group);
  int failed = 0;
#pragma omp parallel
  {
    float* scores = (float*)malloc((size_t)(G * max_len + 16) * sizeof(float));
    if (!scores) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(dynamic, 4)
    for (int64_t item = 0; item < items; ++item) {
      if (!scores) continue;
      const int64_t t = item / (H / group), first = item % (H / group) * group;
      const int64_t h = first / G;  // the KV head
      attend_fn(q + t * ldq + first * d, k_pool + h * d, v_pool + h * d,
                table + row_seq[t] * table_stride, row_len[t], (int)group, d, bs, KVH * d,
                scale, scores, out + (t * H + first) * d);
    }
    free(scores);
  }
  return failed;
}

}  // extern "C"

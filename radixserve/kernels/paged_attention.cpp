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

namespace {

// exp(x) for x <= 0 (Cephes' polynomial, ~1 ulp); exp(-inf) and anything below -103 give 0.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-103.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  __m512 y = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

constexpr int kMaxGroup = 16;  // query heads per KV head
constexpr int kMaxDimVecs = 16;  // head_dim up to 256

// One (row, KV head): q [G, d] (row's heads of this group), out [G, d]; scores scratch [G, len].
void attend(const float* q, const float* k_pool, const float* v_pool, const int64_t* blocks,
            int64_t len, int G, int64_t d, int64_t bs, int64_t token_stride, float scale,
            float* scores, float* out) {
  const int dv = (int)((d + 15) / 16);
  const __mmask16 dmask = tail_mask(d - 16 * (dv - 1));
  __m512 qv[kMaxGroup][kMaxDimVecs];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < dv; ++c)
      qv[g][c] = _mm512_maskz_loadu_ps(c == dv - 1 ? dmask : (__mmask16)0xFFFF, q + g * d + 16 * c);
  float row_max[kMaxGroup];
  for (int g = 0; g < G; ++g) row_max[g] = -INFINITY;
  for (int64_t t = 0; t < len; ++t) {
    const float* k = k_pool + (blocks[t / bs] * bs + t % bs) * token_stride;
    __m512 kv[kMaxDimVecs];
    for (int c = 0; c < dv; ++c)
      kv[c] = _mm512_maskz_loadu_ps(c == dv - 1 ? dmask : (__mmask16)0xFFFF, k + 16 * c);
    for (int g = 0; g < G; ++g) {
      __m512 acc = _mm512_mul_ps(qv[g][0], kv[0]);
      for (int c = 1; c < dv; ++c) acc = _mm512_fmadd_ps(qv[g][c], kv[c], acc);
      float s = _mm512_reduce_add_ps(acc) * scale;
      scores[g * len + t] = s;
      row_max[g] = s > row_max[g] ? s : row_max[g];
    }
  }
  float inv_sum[kMaxGroup];
  for (int g = 0; g < G; ++g) {
    float* sg = scores + g * len;
    const __m512 m = _mm512_set1_ps(row_max[g]);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < len; t += 16) {
      __mmask16 tm = tail_mask(len - t);
      __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(tm, sg + t), m));
      e = _mm512_maskz_mov_ps(tm, e);
      _mm512_mask_storeu_ps(sg + t, tm, e);
      sum = _mm512_add_ps(sum, e);
    }
    inv_sum[g] = 1.0f / _mm512_reduce_add_ps(sum);
  }
  __m512 acc[kMaxGroup][kMaxDimVecs];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < dv; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < len; ++t) {
    const float* v = v_pool + (blocks[t / bs] * bs + t % bs) * token_stride;
    __m512 vv[kMaxDimVecs];
    for (int c = 0; c < dv; ++c)
      vv[c] = _mm512_maskz_loadu_ps(c == dv - 1 ? dmask : (__mmask16)0xFFFF, v + 16 * c);
    for (int g = 0; g < G; ++g) {
      __m512 p = _mm512_set1_ps(scores[g * len + t]);
      for (int c = 0; c < dv; ++c) acc[g][c] = _mm512_fmadd_ps(p, vv[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) {
    __m512 is = _mm512_set1_ps(inv_sum[g]);
    for (int c = 0; c < dv; ++c)
      _mm512_mask_storeu_ps(out + g * d + 16 * c, c == dv - 1 ? dmask : (__mmask16)0xFFFF,
                            _mm512_mul_ps(acc[g][c], is));
  }
}

}  // namespace

extern "C" {

// q, out [T, H, d]; pools [num_blocks, bs, KVH, d]; table [S, table_stride] int64 block ids;
// row_seq [T] int64 (< S), row_len [T] int64 (>= 1). H / KVH <= 16, d <= 256.
// Returns 0, or 1 on bad shapes or no memory.
int rs_paged_attention(const float* q, const float* k_pool, const float* v_pool,
                       const int64_t* table, int64_t table_stride, const int64_t* row_seq,
                       const int64_t* row_len, int64_t T, int64_t H, int64_t KVH, int64_t d,
                       int64_t bs, float scale, float* out) {
  const int64_t G = H / KVH;
  if (G * KVH != H || G > kMaxGroup || d > 16 * kMaxDimVecs || d < 1) return 1;
  int64_t max_len = 0;
  for (int64_t t = 0; t < T; ++t) max_len = row_len[t] > max_len ? row_len[t] : max_len;
  int failed = 0;
#pragma omp parallel
  {
    float* scores = (float*)malloc((size_t)(G * max_len + 16) * sizeof(float));
    if (!scores) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(dynamic, 4)
    for (int64_t item = 0; item < T * KVH; ++item) {
      if (!scores) continue;
      const int64_t t = item / KVH, h = item % KVH;
      attend(q + (t * H + h * G) * d, k_pool + h * d, v_pool + h * d,
             table + row_seq[t] * table_stride, row_len[t], (int)G, d, bs, KVH * d, scale,
             scores, out + (t * H + h * G) * d);
    }
    free(scores);
  }
  return failed;
}

}  // extern "C"

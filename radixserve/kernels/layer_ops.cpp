// The small per-layer operations of a Llama block, one call each instead of 3-10 torch ops:
// RMSNorm (optionally fused with the residual add before it), rotary embedding in place on q
// and k, and SwiGLU's silu(gate) * up. Float32, row by row: a row's result never depends on
// the other rows of the batch.
//
// Rotary is bit-identical to layers/rotary.py (x * cos + rotate_half(x) * sin, each product and
// the sum rounded once). RMSNorm and SiLU sum and exponentiate in their own order, so they match
// the torch versions to float rounding only; a process uses one or the other throughout.

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "simd.h"

namespace {

void norm_row(const float* x, const float* w, int64_t K, float eps, float* out) {
  __m512 ss = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    __m512 v = _mm512_maskz_loadu_ps(tail_mask(K - k), x + k);
    ss = _mm512_fmadd_ps(v, v, ss);
  }
  const float r = 1.0f / sqrtf(_mm512_reduce_add_ps(ss) / (float)K + eps);
  const __m512 vr = _mm512_set1_ps(r);
  for (int64_t k = 0; k < K; k += 16) {
    __mmask16 m = tail_mask(K - k);
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + k), vr);
    _mm512_mask_storeu_ps(out + k, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + k), v));
  }
}

// Heads of one row in place: x [heads, d], cos/sin rows [d] (the two halves repeat).
void rotate_row(float* x, int64_t heads, int64_t d, const float* cos, const float* sin) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h, x += d) {
    for (int64_t j = 0; j < half; j += 16) {
      __mmask16 m = tail_mask(half - j);
      __m512 a = _mm512_maskz_loadu_ps(m, x + j), b = _mm512_maskz_loadu_ps(m, x + half + j);
      __m512 c1 = _mm512_maskz_loadu_ps(m, cos + j), s1 = _mm512_maskz_loadu_ps(m, sin + j);
      __m512 c2 = _mm512_maskz_loadu_ps(m, cos + half + j);
      __m512 s2 = _mm512_maskz_loadu_ps(m, sin + half + j);
      __m512 nb = _mm512_sub_ps(_mm512_setzero_ps(), b);  // -b exactly
      _mm512_mask_storeu_ps(x + j, m, _mm512_add_ps(_mm512_mul_ps(a, c1), _mm512_mul_ps(nb, s1)));
      _mm512_mask_storeu_ps(x + half + j, m,
                            _mm512_add_ps(_mm512_mul_ps(b, c2), _mm512_mul_ps(a, s2)));
    }
  }
}

}  // namespace

extern "C" {

// out[r] = w * x[r] / sqrt(mean(x[r]^2) + eps) for M rows of K (row strides ldx, ldo).
void rs_rms_norm(const float* x, int64_t ldx, const float* w, int64_t M, int64_t K, float eps,
                 float* out, int64_t ldo) {
#pragma omp parallel for schedule(static) if (M >= 32)
  for (int64_t r = 0; r < M; ++r) norm_row(x + r * ldx, w, K, eps, out + r * ldo);
}

// residual += x, then out = rms_norm(residual); all [M, K] contiguous.
void rs_add_rms_norm(const float* x, float* residual, const float* w, int64_t M, int64_t K,
                     float eps, float* out) {
#pragma omp parallel for schedule(static) if (M >= 32)
  for (int64_t r = 0; r < M; ++r) {
    float* res = residual + r * K;
    const float* xr = x + r * K;
    for (int64_t k = 0; k < K; k += 16) {
      __mmask16 m = tail_mask(K - k);
      _mm512_mask_storeu_ps(res + k, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, res + k),
                                                      _mm512_maskz_loadu_ps(m, xr + k)));
    }
    norm_row(res, w, K, eps, out + r * K);
  }
}

// Rotary embedding in place: q rows [M] of q_heads x d (row stride ldq), k likewise; the
// tables cos/sin [max_pos, d] are indexed by positions [M]. d even.
void rs_rotary(float* q, int64_t ldq, int64_t q_heads, float* k, int64_t ldk, int64_t k_heads,
               int64_t M, int64_t d, const int64_t* positions, const float* cos,
               const float* sin) {
#pragma omp parallel for schedule(static) if (M >= 32)
  for (int64_t r = 0; r < M; ++r) {
    const float* c = cos + positions[r] * d;
    const float* s = sin + positions[r] * d;
    rotate_row(q + r * ldq, q_heads, d, c, s);
    rotate_row(k + r * ldk, k_heads, d, c, s);
  }
}

// out [M, I] = silu(gu[:, :I]) * gu[:, I:], gu [M, 2I] contiguous.
void rs_silu_mul(const float* gu, int64_t M, int64_t I, float* out) {
#pragma omp parallel for schedule(static) if (M >= 32)
  for (int64_t r = 0; r < M; ++r) {
    const float* g = gu + r * 2 * I;
    const float* u = g + I;
    float* o = out + r * I;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < I; i += 16) {
      __mmask16 m = tail_mask(I - i);
      __m512 x = _mm512_maskz_loadu_ps(m, g + i);
      __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x))));
      _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(_mm512_mul_ps(x, sig), _mm512_maskz_loadu_ps(m, u + i)));
    }
  }
}

}  // extern "C"

// The small per-layer operations of a Llama or Gemma block, one call each instead of 3-10 torch
// ops: RMSNorm (optionally fused with the residual add before it; per head for q/k norms),
// rotary embedding in place on q and k, SwiGLU's silu(gate) * up and GeGLU's
// gelu_tanh(gate) * up. Float32, row by row: a row's result never depends on the other rows of
// the batch.
//
// Rotary is bit-identical to layers/rotary.py (x * cos + rotate_half(x) * sin, each product and
// the sum rounded once). RMSNorm, SiLU and GELU sum and exponentiate in their own order, so they
// match the torch versions to float rounding only; a process uses one or the other throughout.

#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "simd.h"

namespace {

using namespace simd;

void norm_row(const float* x, const float* w, int64_t K, float eps, float* out) {
  vf ss = zero();
  for (int64_t k = 0; k < K; k += kW) {
    vf v = load_n(x + k, K - k);
    ss = fmadd(v, v, ss);
  }
  const float r = 1.0f / sqrtf(reduce_add(ss) / (float)K + eps);
  const vf vr = set1(r);
  for (int64_t k = 0; k < K; k += kW)
    store_n(out + k, mul(load_n(w + k, K - k), mul(load_n(x + k, K - k), vr)), K - k);
}

// Heads of one row in place: x [heads, d], cos/sin rows [d] (the two halves repeat).
void rotate_row(float* x, int64_t heads, int64_t d, const float* cos, const float* sin) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h, x += d) {
    for (int64_t j = 0; j < half; j += kW) {
      const int64_t n = half - j;
      vf a = load_n(x + j, n), b = load_n(x + half + j, n);
      vf c1 = load_n(cos + j, n), s1 = load_n(sin + j, n);
      vf c2 = load_n(cos + half + j, n), s2 = load_n(sin + half + j, n);
      vf nb = sub(zero(), b);  // -b exactly
      store_n(x + j, add(mul(a, c1), mul(nb, s1)), n);
      store_n(x + half + j, add(mul(b, c2), mul(a, s2)), n);
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
    for (int64_t k = 0; k < K; k += kW)
      store_n(res + k, add(load_n(res + k, K - k), load_n(xr + k, K - k)), K - k);
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
    const vf one = set1(1.0f);
    for (int64_t i = 0; i < I; i += kW) {
      vf x = load_n(g + i, I - i);
      vf sig = div(one, add(one, exp_ps(sub(zero(), x))));
      store_n(o + i, mul(mul(x, sig), load_n(u + i, I - i)), I - i);
    }
  }
}

// q/k norms: each head of M rows of `heads` x d (row strides ldx, ldo; heads contiguous) is
// normed on its own with w [d]. In place when out == x and ldo == ldx.
void rs_head_rms_norm(const float* x, int64_t ldx, const float* w, int64_t M, int64_t heads,
                      int64_t d, float eps, float* out, int64_t ldo) {
#pragma omp parallel for schedule(static) if (M >= 32)
  for (int64_t r = 0; r < M; ++r)
    for (int64_t h = 0; h < heads; ++h)
      norm_row(x + r * ldx + h * d, w, d, eps, out + r * ldo + h * d);
}

// out [M, I] = gelu_tanh(gu[:, :I]) * gu[:, I:], gu [M, 2I] contiguous (Gemma's GeGLU).
// gelu_tanh(x) = 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2 / pi), computed as
// x / (1 + exp(-2c (x + 0.044715 x^3))) (0.5 (1 + tanh(y)) = sigmoid(2y)): the same exp_ps as
// SiLU, no tanh of its own; torch's tanh formula to float rounding.
void rs_gelu_tanh_mul(const float* gu, int64_t M, int64_t I, float* out) {
#pragma omp parallel for schedule(static) if (M >= 32)
  for (int64_t r = 0; r < M; ++r) {
    const float* g = gu + r * 2 * I;
    const float* u = g + I;
    float* o = out + r * I;
    const vf one = set1(1.0f), kappa = set1(0.044715f);
    const vf minus_2c = set1(-1.5957691216057308f);  // -2 sqrt(2 / pi)
    for (int64_t i = 0; i < I; i += kW) {
      vf x = load_n(g + i, I - i);
      vf inner = add(x, mul(kappa, mul(mul(x, x), x)));
      vf gelu = div(x, add(one, exp_ps(mul(minus_2c, inner))));
      store_n(o + i, mul(gelu, load_n(u + i, I - i)), I - i);
    }
  }
}

}  // extern "C"

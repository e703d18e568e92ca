// The token mixers of a Gated DeltaNet layer (Qwen3.5 / Qwen3-Next), over a packed batch of
// sequences whose states live in pool rows (contracts: layers/gated_deltanet.py; argument
// checks: recurrent_ops.py):
//
//   rs_causal_conv       act(causal depthwise conv + bias), act silu or none, each
//                        sequence's last K-1 inputs kept in its pool row [K-1, C]
//   rs_gated_delta_rule  per token: S *= exp(g); delta = (v - S^T k) beta; S += k delta^T;
//                        out = S^T q, with q, k l2-normalized here (q also scaled by Dk^-1/2);
//                        S the float32 state [Dk, Dv] of one value head
//
// A delta-rule task is (sequence, value head): it walks that sequence's tokens in chunks, and
// since the rule is independent column by column (column j of S sees only k, q, g, beta and
// v[j]) each chunk goes through the state a block of kCols columns at a time, the block's
// Dk x kCols tile (32 KB at Dk 128 on AVX-512) hot in L1. Tasks share nothing but read-only
// inputs, so OpenMP (torch's thread pool) runs them in any order. The conv's tasks are blocks
// of rows (its outputs are independent).
//
// NOTE: the engine's rule: a sequence's outputs and states are bitwise the same however its
// tokens are split across calls and whatever else is in the call. Every token is computed
// by the same instructions in the same order from the same state, whatever the call (no
// reduction spans tokens or sequences; a column's lanes do not depend on its block), so it
// holds; the float order differs from the torch reference, which these match to rounding.

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "packed_layout.h"
#include "simd.h"

namespace {

using namespace simd;
using packed::Mark;

constexpr int kNV = 4;  // vectors a column block (the S^T k pass: 2 x 4 sums in flight)
constexpr int64_t kCols = kNV * kW;
constexpr int64_t kChunk = 32;  // tokens whose q and k a delta-rule task normalizes at once
constexpr int64_t kConvRows = 16;  // rows a conv task
constexpr float kL2Eps = 1e-6f;  // transformers' l2norm
// Below this many multiply-adds a call runs on the calling thread (a decode step of a small
// model): waking the pool would cost more.
constexpr int64_t kSerialWork = 1 << 16;

// -- causal conv --------------------------------------------------------------------------

// A sequence's extended rows: its old window (K-1 rows of its pool row, oldest first), then its
// tokens. Token t's taps are ext rows t .. t+K-1; its window after n tokens rows n .. n+K-2.
struct ConvSeq {
  const float* window;  // [K-1, C]
  const float* x;  // its first token's row
  int64_t hist, C;
  const float* ext(int64_t m) const { return m < hist ? window + m * C : x + (m - hist) * C; }
};

// out row = act(sum over taps j of wt[j] * ext(t + j), then + bias where given), channel by
// channel, taps in order; act silu where is_silu, else none.
void conv_row(const ConvSeq& s, int64_t t, const float* wt, int64_t K, const float* bias,
              bool is_silu, float* out) {
  const vf one = set1(1.0f);
  for (int64_t c = 0; c < s.C; c += kW) {
    const int64_t n = s.C - c;
    vf acc = mul(load_n(s.ext(t) + c, n), load_n(wt + c, n));
    for (int64_t j = 1; j < K; ++j)
      acc = add(acc, mul(load_n(s.ext(t + j) + c, n), load_n(wt + j * s.C + c, n)));
    if (bias) acc = add(acc, load_n(bias + c, n));
    store_n(out + c, is_silu ? div(acc, add(one, exp_ps(sub(zero(), acc)))) : acc, n);
  }
}

// -- gated delta rule ---------------------------------------------------------------------

struct DeltaArgs {
  const float *q, *k, *v, *g, *beta;  // q, k [T, Hk, Dk], v [T, Hv, Dv] (row strides below)
  int64_t ldq, ldk, ldv;
  int64_t Hk, Hv, Dk, Dv;
  float* states;  // [S, Hv, Dk, Dv]
  float* out;  // [T, Hv, Dv]
};

// dst = src * scale / sqrt(sum(src^2) + eps), Dk floats.
void l2norm(const float* src, int64_t d, float scale, float* dst) {
  vf ss = zero();
  for (int64_t i = 0; i < d; i += kW) {
    vf x = load_n(src + i, d - i);
    ss = fmadd(x, x, ss);
  }
  const vf r = set1(scale / sqrtf(reduce_add(ss) + kL2Eps));
  for (int64_t i = 0; i < d; i += kW) store_n(dst + i, mul(load_n(src + i, d - i), r), d - i);
}

// Vector v of NV from p; the last holds `tail` lanes where kTail.
template <int NV, bool kTail>
inline vf ld(const float* p, int v, int64_t tail) {
  return kTail && v == NV - 1 ? load_n(p + v * kW, tail) : load(p + v * kW);
}

// A chunk of one sequence's tokens as one value head sees them: k and q l2-normalized (q also
// scaled), [count, Dk] each, the decays exp(g) and the betas.
struct Chunk {
  const float *kn, *qn, *decay, *beta;
  int64_t t0, count;  // its first row of the batch, its number of tokens
};

// The chunk's tokens through columns j0 .. j0 + NV*kW of value head h (the last vector `tail`
// lanes wide where kTail), whose state is `tile` (rows kCols apart, hot in L1): two passes a
// token, S^T k, then the update and S^T q.
template <int NV, bool kTail>
void delta_cols(const DeltaArgs& a, int64_t h, const Chunk& c, float* tile, int64_t j0,
                int64_t tail) {
  const int64_t Dk = a.Dk, Dv = a.Dv;
  for (int64_t n = 0; n < c.count; ++n) {
    const float *kn = c.kn + n * Dk, *qn = c.qn + n * Dk;
    const vf decay = set1(c.decay[n]), beta = set1(c.beta[n]);
    // kv = (decay S)^T k, as decay (S^T k): rows in two interleaved sums
    vf kv0[NV], kv1[NV];
    for (int v = 0; v < NV; ++v) kv0[v] = kv1[v] = zero();
    int64_t i = 0;
    for (; i + 1 < Dk; i += 2) {
      const float* r = tile + i * kCols;
      const vf k0 = set1(kn[i]), k1 = set1(kn[i + 1]);
      for (int v = 0; v < NV; ++v) {
        kv0[v] = fmadd(load(r + v * kW), k0, kv0[v]);
        kv1[v] = fmadd(load(r + kCols + v * kW), k1, kv1[v]);
      }
    }
    for (; i < Dk; ++i)
      for (int v = 0; v < NV; ++v)
        kv0[v] = fmadd(load(tile + i * kCols + v * kW), set1(kn[i]), kv0[v]);
    const float* vt = a.v + (c.t0 + n) * a.ldv + h * Dv + j0;
    vf delta[NV], o[NV];
    for (int v = 0; v < NV; ++v) {
      delta[v] = mul(sub(ld<NV, kTail>(vt, v, tail), mul(add(kv0[v], kv1[v]), decay)), beta);
      o[v] = zero();
    }
    // S = decay S + k delta^T, and out = S^T q, row by row
    for (i = 0; i < Dk; ++i) {
      float* r = tile + i * kCols;
      const vf ki = set1(kn[i]), qi = set1(qn[i]);
      for (int v = 0; v < NV; ++v) {
        const vf s = fmadd(ki, delta[v], mul(load(r + v * kW), decay));
        store(r + v * kW, s);
        o[v] = fmadd(s, qi, o[v]);
      }
    }
    float* out = a.out + ((c.t0 + n) * a.Hv + h) * Dv + j0;
    for (int v = 0; v < NV; ++v) {
      if (kTail && v == NV - 1) store_n(out + v * kW, o[v], tail);
      else store(out + v * kW, o[v]);
    }
  }
}

// One sequence (rows start .. end) through value head h, its state S ([Dk, Dv] in the pool)
// copied into dense tiles, one per block of kCols columns ([Dk, kCols]: in place, rows Dv
// apart, a block would fall on a fraction of L1's sets), in chunks of kChunk tokens (ending
// where a snapshot is taken) whose q and k are normalized once for every block.
//   scratch  [ tiles: blocks x Dk x kCols | kn, qn: kChunk x Dk each | decay, beta: kChunk ]
void delta_head(const DeltaArgs& a, int64_t h, float* S, int64_t start, int64_t end,
                const std::vector<Mark>& marks, float* scratch) {
  const int64_t Dk = a.Dk, Dv = a.Dv, hk = h / (a.Hv / a.Hk);
  const float q_scale = 1.0f / sqrtf((float)Dk);
  float* tiles = scratch;
  float* kn = tiles + (Dv + kCols - 1) / kCols * Dk * kCols;
  float *qn = kn + kChunk * Dk, *decay = qn + kChunk * Dk, *beta = decay + kChunk;
  auto copy = [&](float* pool, bool to_pool) {  // S (rows Dv apart) <-> the tiles
    for (int64_t j0 = 0; j0 < Dv; j0 += kCols) {
      const int64_t cols = std::min(kCols, Dv - j0);
      float* tile = tiles + j0 * Dk;
      for (int64_t i = 0; i < Dk; ++i) {
        float *p = pool + i * Dv + j0, *t = tile + i * kCols;
        memcpy(to_pool ? p : t, to_pool ? t : p, cols * sizeof(float));
      }
    }
  };
  copy(S, false);
  size_t next = 0;
  for (int64_t t0 = start; t0 < end;) {
    int64_t t1 = std::min(end, t0 + kChunk);
    if (next < marks.size()) t1 = std::min(t1, start + marks[next].n);
    for (int64_t t = t0; t < t1; ++t) {
      l2norm(a.k + t * a.ldk + hk * Dk, Dk, 1.0f, kn + (t - t0) * Dk);
      l2norm(a.q + t * a.ldq + hk * Dk, Dk, q_scale, qn + (t - t0) * Dk);
      decay[t - t0] = expf(a.g[t * a.Hv + h]);
      beta[t - t0] = a.beta[t * a.Hv + h];
    }
    const Chunk c{kn, qn, decay, beta, t0, t1 - t0};
    for (int64_t j0 = 0; j0 < Dv; j0 += kCols) {  // a whole block at once, a partial one by vector
      float* tile = tiles + j0 * Dk;
      if (j0 + kCols <= Dv) {
        delta_cols<kNV, false>(a, h, c, tile, j0, kW);
        continue;
      }
      for (int64_t j = j0; j < Dv; j += kW) {
        if (j + kW <= Dv) delta_cols<1, false>(a, h, c, tile + (j - j0), j, kW);
        else delta_cols<1, true>(a, h, c, tile + (j - j0), j, Dv - j);
      }
    }
    for (; next < marks.size() && start + marks[next].n == t1; ++next)
      copy(a.states + (marks[next].dst * a.Hv + h) * Dk * Dv, true);
    t0 = t1;
  }
  copy(S, true);
}

}  // namespace

extern "C" {

// x [T, C], weight [C, K], bias [C] or null, conv_states [S, K-1, C], out [T, C], all float32
// contiguous; activation 1: silu, 0: none; cu_seqlens [B+1], slots [B], snapshots [N, 3]
// (b, n, dst) int64. 0, or a code (packed_layout.h). Rows are independent (the windows are
// read-only until every row is done), so the tasks are blocks of rows, streamed whole.
int rs_causal_conv(const float* x, int64_t T, int64_t C, const float* weight, int64_t K,
                   const float* bias, int activation, float* conv_states, int64_t S,
                   const int64_t* cu_seqlens, const int64_t* slots, int64_t B,
                   const int64_t* snapshots, int64_t N, float* out) {
  std::vector<std::vector<Mark>> marks;
  if (int err = packed::layout(cu_seqlens, slots, B, T, S, snapshots, N, marks)) return err;
  const int64_t hist = K - 1;
  std::vector<float> wt(K * C);  // the taps [K, C]
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < K; ++j) wt[j * C + c] = weight[c * K + j];
  auto seq = [&](int64_t b) {
    return ConvSeq{conv_states + slots[b] * hist * C, x + cu_seqlens[b] * C, hist, C};
  };
#pragma omp parallel for schedule(dynamic, 1) if (T * C * K >= kSerialWork)
  for (int64_t r0 = 0; r0 < T; r0 += kConvRows) {
    int64_t b = std::upper_bound(cu_seqlens, cu_seqlens + B + 1, r0) - cu_seqlens - 1;
    for (int64_t r = r0; r < std::min(T, r0 + kConvRows); ++r) {
      while (r >= cu_seqlens[b + 1]) ++b;  // past the empty sequences
      conv_row(seq(b), r - cu_seqlens[b], wt.data(), K, bias, activation == 1, out + r * C);
    }
  }
  // The snapshots first (their sources may be a slot's old window), then each slot's new
  // window through a copy (it may shift rows of the old one)
  std::vector<float> window(hist * C);
  for (int64_t b = 0; b < B; ++b) {
    const ConvSeq s = seq(b);
    for (const Mark& mk : marks[b])
      for (int64_t m = 0; m < hist; ++m)
        memcpy(conv_states + (mk.dst * hist + m) * C, s.ext(mk.n + m), C * sizeof(float));
    const int64_t len = cu_seqlens[b + 1] - cu_seqlens[b];
    for (int64_t m = 0; m < hist; ++m)
      memcpy(window.data() + m * C, s.ext(len + m), C * sizeof(float));
    memcpy(conv_states + slots[b] * hist * C, window.data(), hist * C * sizeof(float));
  }
  return 0;
}

// q [T, Hk, Dk] (row stride ldq), k likewise (ldk), v [T, Hv, Dv] (ldv), g and beta [T, Hv],
// states [S, Hv, Dk, Dv], out [T, Hv, Dv], all float32, each row's heads contiguous; Hv a
// multiple of Hk; cu_seqlens, slots, snapshots as rs_causal_conv's. 0, or a code.
int rs_gated_delta_rule(const float* q, int64_t ldq, const float* k, int64_t ldk,
                        const float* v, int64_t ldv, const float* g, const float* beta,
                        int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv,
                        float* states, int64_t S, const int64_t* cu_seqlens,
                        const int64_t* slots, int64_t B, const int64_t* snapshots, int64_t N,
                        float* out) {
  std::vector<std::vector<Mark>> marks;
  if (int err = packed::layout(cu_seqlens, slots, B, T, S, snapshots, N, marks)) return err;
  const DeltaArgs a{q, k, v, g, beta, ldq, ldk, ldv, Hk, Hv, Dk, Dv, states, out};
#pragma omp parallel if (T * Hv * Dk * Dv >= kSerialWork)
  {
    const int64_t tiles = (Dv + kCols - 1) / kCols * Dk * kCols;
    std::vector<float> buffer(tiles + 2 * kChunk * (Dk + 1) + 16);  // + 16: room to align
    float* scratch = (float*)(((uintptr_t)buffer.data() + 63) & ~(uintptr_t)63);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * Hv; ++task) {
      const int64_t b = task / Hv, h = task % Hv;
      delta_head(a, h, states + (slots[b] * Hv + h) * Dk * Dv, cu_seqlens[b],
                 cu_seqlens[b + 1], marks[b], scratch);
    }
  }
  return 0;
}

// The DeltaNet's per-head gates from its projections a, b [T, H] (row strides lda, ldb):
// beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) (softplus(x) = x above 20, as
// torch's), into g, beta [T, H] contiguous. Scalar on purpose (no vector body with a scalar
// tail): each value's rounding is the same wherever it sits in the batch.
__attribute__((optimize("no-tree-vectorize")))
void rs_gdn_gates(const float* a, int64_t lda, const float* b, int64_t ldb,
                  const float* A_log, const float* dt_bias, int64_t T, int64_t H, float* g,
                  float* beta) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      beta[t * H + h] = 1.0f / (1.0f + expf(-b[t * ldb + h]));
      const float x = a[t * lda + h] + dt_bias[h];
      const float sp = x > 20.0f ? x : log1pf(expf(x));
      g[t * H + h] = -expf(A_log[h]) * sp;
    }
}

// x [T, W] times sigmoid(gate) [T, W] (row stride ldg) into out [T, W], scalar like
// rs_gdn_gates (the gated attention's output gate).
__attribute__((optimize("no-tree-vectorize")))
void rs_sigmoid_mul(const float* x, const float* gate, int64_t ldg, int64_t T, int64_t W,
                    float* out) {
#pragma omp parallel for if (T * W >= kSerialWork)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < W; ++j)
      out[t * W + j] = x[t * W + j] / (1.0f + expf(-gate[t * ldg + j]));
}

}  // extern "C"

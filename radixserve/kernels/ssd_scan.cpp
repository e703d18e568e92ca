// The Mamba2 (SSD) mixer's kernels, over a packed batch of sequences whose states live in pool
// rows (contracts: layers/mamba2.py; argument checks: recurrent_ops.py; the packed layout and
// snapshots: packed_layout.h):
//
//   rs_ssd_scan         per token and head h (group g = h / (H/G)), on the float32 state S
//                       [P, N] of (sequence, h):
//                         dt = clamp(softplus(dt + dt_bias), lo, hi);  S = S exp(dt A) +
//                         (dt x) B[g]^T;  y = S C[g] + D x
//   rs_gated_rms_norm   the output norm: w * rms_norm(y * silu(z)) over each group of
//                       channels of a row
//
// A scan task is (sequence, head): it walks the sequence's tokens in order on the head's state,
// in place in its pool row (contiguous, P x N floats: 32 KB at the usual 64 x 128, hot in L1
// across the tokens), the recurrent form: prefill costs what decode costs a token. Tasks share
// nothing but read-only inputs, so OpenMP (torch's thread pool) runs them in any order.
//
// NOTE: the engine's rule (a sequence's outputs and states bitwise the same however its tokens
// are split and whatever shares the call) holds: a token's dt, decay and update are computed by
// the same scalar and vector instructions from the same state whatever the call, each row's sum
// over N in a fixed order. The float order differs from the torch reference (to rounding).

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

constexpr int kRows = 4;  // state rows a pass (independent sums in flight)
// Below this many multiply-adds a call runs on the calling thread (a decode step of a small
// model): waking the pool would cost more.
constexpr int64_t kSerialWork = 1 << 16;

struct ScanArgs {
  const float *x, *dt, *A, *B, *C, *D, *dt_bias;  // x [T, H, P], dt [T, H], B, C [T, G, N]
  int64_t ldx, lddt, ldb, ldc;  // their row strides
  int64_t H, P, G, N;
  float dt_min, dt_max;
  float* states;  // [S, H, P, N]
  float* out;  // [T, H, P]
};

// torch's softplus (threshold 20: x itself above), scalar: a value's rounding never depends on
// its place in the batch.
inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Rows p0 .. p0 + R of the state through one token: row = row * decay + B * dx[p], and
// y[p] = row . C + D x[p]; each row's sum over N as kW-lane partial sums in order, then
// reduce_add.
template <int R>
void scan_rows(float* S, int64_t p0, int64_t N, const float* x, float dt, vf decay,
               const float* B, const float* C, float D, float* y) {
  vf acc[R], dx[R];
  for (int r = 0; r < R; ++r) acc[r] = zero(), dx[r] = set1(dt * x[p0 + r]);
  for (int64_t n = 0; n < N; n += kW) {
    const int64_t m = N - n;
    const vf b = load_n(B + n, m), c = load_n(C + n, m);
    for (int r = 0; r < R; ++r) {
      float* row = S + (p0 + r) * N + n;
      const vf s = fmadd(b, dx[r], mul(load_n(row, m), decay));
      store_n(row, s, m);
      acc[r] = fmadd(s, c, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[p0 + r] = reduce_add(acc[r]) + D * x[p0 + r];
}

// One sequence (rows start .. end) through head h, its state S [P, N] in place; the snapshots
// copied out after their token.
void scan_head(const ScanArgs& a, int64_t h, float* S, int64_t start, int64_t end,
               const std::vector<Mark>& marks) {
  const int64_t P = a.P, N = a.N, g = h / (a.H / a.G);
  const float A = a.A[h], D = a.D[h], bias = a.dt_bias[h];
  size_t next = 0;
  for (int64_t t = start; t < end; ++t) {
    const float dt = std::min(std::max(softplus(a.dt[t * a.lddt + h] + bias), a.dt_min),
                              a.dt_max);
    const vf decay = set1(expf(dt * A));
    const float* x = a.x + t * a.ldx + h * P;
    const float *B = a.B + t * a.ldb + g * N, *C = a.C + t * a.ldc + g * N;
    float* y = a.out + (t * a.H + h) * P;
    int64_t p = 0;
    for (; p + kRows <= P; p += kRows) scan_rows<kRows>(S, p, N, x, dt, decay, B, C, D, y);
    for (; p < P; ++p) scan_rows<1>(S, p, N, x, dt, decay, B, C, D, y);
    for (; next < marks.size() && start + marks[next].n == t + 1; ++next)
      memcpy(a.states + (marks[next].dst * a.H + h) * P * N, S, P * N * sizeof(float));
  }
}

}  // namespace

extern "C" {

// x [T, H, P] (row stride ldx, each row's heads contiguous), dt [T, H] (lddt: raw, before
// dt_bias and softplus), A, D, dt_bias [H], B and C [T, G, N] (ldb, ldc), states
// [S, H, P, N], out [T, H, P] contiguous, all float32; H a multiple of G; cu_seqlens [B+1],
// slots [B], snapshots [num_snaps, 3] (b, n, dst) int64. 0, or a code (packed_layout.h).
int rs_ssd_scan(const float* x, int64_t ldx, const float* dt, int64_t lddt, const float* A,
                const float* B, int64_t ldb, const float* C, int64_t ldc, const float* D,
                const float* dt_bias, float dt_min, float dt_max, int64_t T, int64_t H,
                int64_t P, int64_t G, int64_t N, float* states, int64_t S,
                const int64_t* cu_seqlens, const int64_t* slots, int64_t num_seqs,
                const int64_t* snapshots, int64_t num_snaps, float* out) {
  std::vector<std::vector<Mark>> marks;
  if (int err = packed::layout(cu_seqlens, slots, num_seqs, T, S, snapshots, num_snaps, marks))
    return err;
  const ScanArgs a{x, dt, A, B, C, D, dt_bias, ldx, lddt, ldb, ldc, H, P, G, N,
                   dt_min, dt_max, states, out};
#pragma omp parallel for schedule(dynamic, 1) if (T * H * P * N >= kSerialWork)
  for (int64_t task = 0; task < num_seqs * H; ++task) {
    const int64_t b = task / H, h = task % H;
    scan_head(a, h, states + (slots[b] * H + h) * P * N, cu_seqlens[b], cu_seqlens[b + 1],
              marks[b]);
  }
  return 0;
}

// out = w * (v / sqrt(mean over its group(v^2) + eps)) with v = y * silu(z), for rows y
// [T, W] (contiguous) and z [T, W] (row stride ldz), w [W], each row's W channels in groups
// of `group` (W a multiple of it), into out [T, W]. A row's result never depends on the
// other rows (every channel takes the same instructions whatever the batch).
void rs_gated_rms_norm(const float* y, const float* z, int64_t ldz, const float* w, int64_t T,
                       int64_t W, int64_t group, float eps, float* out) {
  const vf one = set1(1.0f);
#pragma omp parallel for schedule(static) if (T * W >= kSerialWork)
  for (int64_t t = 0; t < T; ++t) {
    const float *yr = y + t * W, *zr = z + t * ldz;
    float* o = out + t * W;
    for (int64_t g0 = 0; g0 < W; g0 += group) {
      vf ss = zero();
      for (int64_t c = g0; c < g0 + group; c += kW) {
        const int64_t n = std::min<int64_t>(kW, g0 + group - c);
        const vf zz = load_n(zr + c, n);
        const vf v = mul(load_n(yr + c, n), div(zz, add(one, exp_ps(sub(zero(), zz)))));
        store_n(o + c, v, n);
        ss = fmadd(v, v, ss);
      }
      const vf r = set1(1.0f / sqrtf(reduce_add(ss) / (float)group + eps));
      for (int64_t c = g0; c < g0 + group; c += kW) {
        const int64_t n = std::min<int64_t>(kW, g0 + group - c);
        store_n(o + c, mul(load_n(w + c, n), mul(load_n(o + c, n), r)), n);
      }
    }
  }
}

}  // extern "C"

// Batched LoRA, one adapter per row ("BGMV", as punica's and vLLM's CPU path): each row of a
// packed batch takes its own adapter's matrices, picked by its slot.
//
//   shrink:  t[m, j]  = sum_k x[m, k] * A_s[j, k]                 j < r_s, s = row_slot[m]
//   expand:  y[m, n] += scale_s * sum_j t[m, j] * B_s[n, j]       n < N
//
// A_s [r_s, K] and B_s [N, r_s] float32, row-major, one pointer each per slot; a row whose slot
// is -1, or whose slot has no matrices (null pointer) for this linear, is left untouched.
//
// NOTE: batch invariance by construction. Every output element is one dot product over K (or
// r) in a fixed order: kW-wide fused multiply-adds along K (load_n zero-fills the tail), then
// the fixed transpose-and-add of hsum_lanes, whose order depends only on the element's place
// j (or n) mod kW in its block. Nothing in it reads another row, so a row's result is
// bit-identical alone or in any batch of any adapters; and each dot product runs whole on one
// thread (the threads split rows x output blocks), so it does not depend on the thread count.

#include <omp.h>
#include <stdint.h>

#include "simd.h"

namespace {

using namespace simd;

// out[i] = dot(v[:len], rows[i][:len]) (row stride ld) for i < num (<= kW).
inline vf dot_block(const float* v, const float* rows, int64_t ld, int64_t num, int64_t len) {
  vf acc[kW];
  for (int i = 0; i < kW; ++i) acc[i] = zero();
  for (int64_t k = 0; k < len; k += kW) {
    const vf vk = load_n(v + k, len - k);
    for (int64_t i = 0; i < num; ++i)
      acc[i] = fmadd(vk, load_n(rows + i * ld + k, len - k), acc[i]);
  }
  return hsum_lanes(acc);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

extern "C" {

// t [M, ldt] (ldt >= the largest rank): the row's first r_s columns are written, the others
// left as they are. x [M, K] (row stride ldx). a_ptrs / ranks: [num_slots].
void rs_lora_shrink(const float* x, int64_t ldx, int64_t M, int64_t K, const int32_t* row_slot,
                    const int64_t* a_ptrs, const int64_t* ranks, int64_t num_slots, float* t,
                    int64_t ldt) {
  int64_t max_rank = 0;
  for (int64_t s = 0; s < num_slots; ++s) max_rank = ranks[s] > max_rank ? ranks[s] : max_rank;
  const int64_t blocks = ceil_div(max_rank, kW);
#pragma omp parallel for collapse(2) schedule(static) if (M * blocks * K >= 65536)
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int32_t s = row_slot[m];
      if (s < 0 || s >= num_slots || a_ptrs[s] == 0) continue;
      const int64_t j = b * kW, num = ranks[s] - j;
      if (num <= 0) continue;
      const float* a = (const float*)a_ptrs[s] + j * K;
      store_n(t + m * ldt + j, dot_block(x + m * ldx, a, K, num < kW ? num : kW, K), num);
    }
  }
}

// y [M, N] (row stride ldy) += scale_s * t_row . B_s rows; t [M, ldt] from rs_lora_shrink.
// scales: [num_slots], or null for 1 (the scale already folded into B).
void rs_lora_expand(const float* t, int64_t ldt, int64_t M, int64_t N, const int32_t* row_slot,
                    const int64_t* b_ptrs, const int64_t* ranks, const float* scales,
                    int64_t num_slots, float* y, int64_t ldy) {
  const int64_t blocks = ceil_div(N, kW);
  int64_t max_rank = 1;
  for (int64_t s = 0; s < num_slots; ++s) max_rank = ranks[s] > max_rank ? ranks[s] : max_rank;
#pragma omp parallel for collapse(2) schedule(static) if (M * N * max_rank >= 65536)
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int32_t s = row_slot[m];
      if (s < 0 || s >= num_slots || b_ptrs[s] == 0) continue;
      const int64_t n = b * kW, num = N - n < kW ? N - n : kW, r = ranks[s];
      const float* bs = (const float*)b_ptrs[s] + n * r;
      vf d = dot_block(t + m * ldt, bs, r, num, r);
      if (scales) d = mul(d, set1(scales[s]));
      float* yr = y + m * ldy + n;
      store_n(yr, add(load_n(yr, num), d), num);
    }
  }
}

}  // extern "C"

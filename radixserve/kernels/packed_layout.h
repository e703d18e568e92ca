// The packed layout the recurrent-layer kernels share (delta_rule.cpp, ssd_scan.cpp): a batch
// of B sequences in T rows (cu_seqlens [B+1]), sequence b's state in pool row slots[b] of S,
// and snapshots [N, 3] rows (b, n, dst): after the call, pool row dst holds sequence b's state
// after its first n tokens of the call (contracts: layers/gated_deltanet.py).
#pragma once

#include <stdint.h>

#include <algorithm>
#include <vector>

namespace packed {

// Return codes (recurrent_ops.py _ERRORS).
constexpr int kBadSeqlens = 1, kBadSlot = 2, kBadSnapshot = 3;

struct Mark {  // a snapshot: after n tokens of its sequence, into pool row dst
  int64_t n, dst;
};

// Checks cu_seqlens, slots and snapshots against T rows and a pool of S rows; fills each
// sequence's snapshots in token order. 0, or a code.
inline int layout(const int64_t* cu, const int64_t* slots, int64_t B, int64_t T, int64_t S,
                  const int64_t* snaps, int64_t N, std::vector<std::vector<Mark>>& marks) {
  if (cu[0] != 0 || cu[B] != T) return kBadSeqlens;
  for (int64_t b = 0; b < B; ++b) {
    if (cu[b + 1] < cu[b]) return kBadSeqlens;
    if (slots[b] < 0 || slots[b] >= S) return kBadSlot;
  }
  marks.assign(B, {});
  for (int64_t i = 0; i < N; ++i) {
    const int64_t b = snaps[3 * i], n = snaps[3 * i + 1], dst = snaps[3 * i + 2];
    if (b < 0 || b >= B || n < 1 || n > cu[b + 1] - cu[b] || dst < 0 || dst >= S)
      return kBadSnapshot;
    if (std::find(slots, slots + B, dst) != slots + B) return kBadSnapshot;
    marks[b].push_back({n, dst});
  }
  for (auto& m : marks)
    std::stable_sort(m.begin(), m.end(), [](Mark a, Mark b) { return a.n < b.n; });
  return 0;
}

}  // namespace packed

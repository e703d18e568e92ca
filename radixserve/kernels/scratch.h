// Per-thread scratch buffers that outlive a call. Each slot grows to the largest size asked on
// its thread and is kept, so the hot kernels (a few hundred calls a decode step) do not map and
// clear fresh pages on every call: glibc serves large blocks with mmap and returns them on
// free, and the kernel's page clearing was 2-4 % of a 3B model's batched decode (perf, AMD EPYC
// Zen 5). The cost: each thread keeps its largest buffers (a 2,048-row prefill's activations at
// K = 8192: 32 MB on the calling thread).
#pragma once

#include <stddef.h>
#include <stdlib.h>

namespace scratch {

// One slot per use; a call may hold several slots at once, never one slot twice.
enum Slot { kActivations, kActScales, kKActivations, kKScales, kItems, kDecoded, kHalfStrip,
            kTiles, kInt8Activations, kInt8Scales, kAttnOffsets, kAttnItems, kAttnPartials,
            kAttnScores, kTileActivations, kTileScales, kTileDecoded, kNumSlots };

// A 64-byte aligned buffer of at least `bytes` for `slot` on the calling thread, valid until
// the next get of that slot on this thread; NULL when it cannot be allocated.
inline void* get(Slot slot, size_t bytes) {
  struct Buffers {
    void* p[kNumSlots] = {};
    size_t n[kNumSlots] = {};
    ~Buffers() {
      for (void* q : p) free(q);
    }
  };
  thread_local Buffers b;
  if (bytes == 0) bytes = 1;
  if (bytes > b.n[slot]) {
    free(b.p[slot]);
    const size_t size = (bytes + 63) / 64 * 64;
    b.p[slot] = aligned_alloc(64, size);
    b.n[slot] = b.p[slot] ? size : 0;
  }
  return b.p[slot];
}

}  // namespace scratch

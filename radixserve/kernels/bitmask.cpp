// Grammar bitmask applied to logits in place: -inf wherever a row's bit is 0. Word w, bit b
// (least significant first) is token 32 * w + b, llguidance's layout. One pass over the packed
// mask (a word of all ones, the common case inside JSON strings, costs one compare) instead of
// unpacking it to one bool per token.

#include <math.h>
#include <stdint.h>

#include "simd.h"

extern "C" {

// logits [*, ld] float32; rows [R] (row of logits for bitmask row r); bitmask [R, words] int32.
void rs_apply_bitmask(float* logits, int64_t ld, const int64_t* rows, int64_t R,
                      const int32_t* bitmask, int64_t words, int64_t V) {
  for (int64_t r = 0; r < R; ++r) {
    float* row = logits + rows[r] * ld;
    const uint32_t* mask = (const uint32_t*)(bitmask + r * words);
    for (int64_t w = 0; w < words; ++w) {
      uint32_t banned = ~mask[w];
      if (!banned) continue;
      const int64_t t = 32 * w;
      if (t + 32 > V) banned &= V - t >= 32 ? 0xFFFFFFFFu : ((1u << (V - t)) - 1);
#if defined(__AVX512F__)
      _mm512_mask_storeu_ps(row + t, (__mmask16)(banned & 0xFFFF), _mm512_set1_ps(-INFINITY));
      _mm512_mask_storeu_ps(row + t + 16, (__mmask16)(banned >> 16), _mm512_set1_ps(-INFINITY));
#else
      for (; banned; banned &= banned - 1) row[t + __builtin_ctz(banned)] = -INFINITY;
#endif
    }
  }
}

}  // extern "C"

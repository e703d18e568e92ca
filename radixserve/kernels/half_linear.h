// The 16-bit (F16 / BF16) parts of the block linear (block_linear.cpp calls them; the kernel is
// half_linear.cpp, its layout and numerics stated there).
#pragma once

#include <stdint.h>

// Work item of a 16-bit part: up to kHalfGroups groups of 16 outputs for up to kHalfRows rows.
constexpr int kHalfGroups = 4;
constexpr int64_t kHalfRows = 64;
// From this many rows an item widens its weights to float once, into per-thread scratch of
// kHalfGroups * 16 * K floats, instead of in every register block (the same values: the
// results are bit-identical either way).
constexpr int64_t kHalfWidenRows = 8;

// `groups` groups of 16 outputs at `w` (the part's packed 16-bit weights from this item's first
// group; `bf16` picks the element type) for M rows of x [M, K] (row stride K) -> y (row stride
// ldy), columns n0.. of the part's N (bias [N] or NULL). `scratch`: kHalfGroups * 16 * K floats,
// or NULL when M < kHalfWidenRows.
void half_linear_item(bool bf16, int groups, int64_t M, const float* x, int64_t K,
                      const uint16_t* w, float* scratch, const float* bias, float* y,
                      int64_t ldy, int64_t n0, int64_t N);

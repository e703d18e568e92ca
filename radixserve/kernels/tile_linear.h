// The GGUF types multiplied through int8 tiles (tile_linear.cpp): Q2_K, Q3_K, IQ4_NL, IQ4_XS,
// MXFP4, TQ1_0, TQ2_0, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, by the format
// ids block_linear.cpp continues with (layers/block_linear.py: FORMATS). block_linear.cpp
// hands their parts' work items here.
#pragma once

#include <stdint.h>

constexpr int64_t kFirstTileFormat = 10, kEndTileFormat = 24;
inline bool is_tile(int64_t f) { return f >= kFirstTileFormat && f < kEndTileFormat; }

// The bytes of one row of K weights as the file stores them; 0 when K is not a multiple of
// the type's block (32 for IQ4_NL and MXFP4, 256 for the others).
int64_t tile_row_bytes(int64_t f, int64_t K);

// One row's activations: per block of 32 the step s (the row's bytes are round(x / s)), the
// sums of those bytes over its first and second 16 (h0, h1) and s times them (S0, S1).
struct TileAct {
  float s, S0, S1;
  int16_t h0, h1;
};
void tile_quantize_row(const float* x, int64_t K, int8_t* a, TileAct* t);

// The scratch a work item decodes one group of 16 outputs into (an item of two groups: twice).
int64_t tile_decoded_bytes(int64_t K);

// M rows (a: [M][K] bytes, t: [M][K / 32]) x `groups` (1 or 2) consecutive groups of 16
// outputs of format f (`group`: the first group's packed bytes), outputs n0.. of N written to
// y (row stride ldy), bias added. `amx`: 0 the level's dot products only; else whole 16-row
// tiles by AMX (the amx level; the same bits), 2 where the caller has simd.h's amx_configure in
// force (put back after), 1 where it has not (the tiles released after). False when the format
// needs the codebooks and rs_tile_grids has not been given them.
bool tile_item(int64_t f, int groups, int64_t M, const int8_t* a, const TileAct* t, int64_t K,
               const uint8_t* group, uint8_t* dec, const float* bias, float* y, int64_t ldy,
               int64_t n0, int64_t N, int amx);

// raw [N][tile_row_bytes] -> out [ceil(N / 16)][K / block][16][block bytes] (padding zero).
void tile_pack(int64_t f, const uint8_t* raw, int64_t N, int64_t K, uint8_t* out);

// The vector vocabulary every kernel in this folder is written in, for each instruction-set
// level the package builds (native.py: one library per level, picked at run time):
//
//   level    kW  floats                int8 dot products (u8 x s8 -> i32, 4 bytes a lane)
//   amx      16  AVX-512               AVX-512 VNNI (the linear kernels add AMX tiles)
//   avx512   16  AVX-512               AVX-512 VNNI
//   avxvnni   8  AVX2 + FMA + F16C     AVX-VNNI (vpdpbusd on 256 bits: Intel Alder Lake and
//                                      later without AVX-512, AMD Zen 5)
//   avx2      8  AVX2 + FMA + F16C     maddubs on |w| and sign(x, w), then madd: exact, since
//                                      no operand is -128 (llama.cpp's way without VNNI)
//   dotprod   8  GCC vector extensions Armv8.2's sdot (aarch64 with the dot product
//                (NEON)                extension: Graviton 2+, Ampere, Apple M, Cortex-A76+)
//   generic   8  GCC vector extensions plain integer loops the compiler vectorizes
//                (SSE2 on x86-64, NEON on aarch64)
//
// Within a level every operation is the same for every row, so a row's result never depends
// on its batch. Across levels the elementwise float operations agree bit for bit; reductions
// (sums over a vector's lanes, dot products) run in another order, and exp_ps differs by ~1
// ulp on the generic level (no fused multiply-add there), so results agree to rounding.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#if defined(__AVX512F__) && !(defined(__AVX512BW__) && defined(__AVX512VNNI__))
#error "the AVX-512 level needs AVX-512 BW and VNNI"
#endif
#if defined(__AVX2__) && !(defined(__FMA__) && defined(__F16C__))
#error "the AVX2 level needs FMA and F16C"
#endif

// Whether the linear kernels may use AMX tiles (set once by rs_init; false below the amx level).
bool rs_amx_enabled();

namespace simd {

// ---------------------------------------------------------------------------------------------
#if defined(__AVX512F__)
constexpr int kW = 16;
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
constexpr const char* kLevel = "amx";
#else
constexpr const char* kLevel = "avx512";
#endif
using vf = __m512;
using vi = __m512i;  // kW int32 lanes

inline __mmask16 lanes(int64_t n) {  // the first n lanes (none when n <= 0, all when >= 16)
  if (n <= 0) return (__mmask16)0;
  return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}
inline vf zero() { return _mm512_setzero_ps(); }
inline vf set1(float x) { return _mm512_set1_ps(x); }
inline vf load(const float* p) { return _mm512_loadu_ps(p); }
inline vf load_n(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(lanes(n), p); }
inline void store(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline void store_n(float* p, vf v, int64_t n) { _mm512_mask_storeu_ps(p, lanes(n), v); }
inline vf add(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf div(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }  // a * b + c, fused
inline vf fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b, fused
inline vf max(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf min(vf a, vf b) { return _mm512_min_ps(a, b); }
inline vf abs(vf a) { return _mm512_abs_ps(a); }
inline vf round(vf a) {  // to nearest, ties to even
  return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline vf keep_n(vf v, int64_t n, vf fill) { return _mm512_mask_mov_ps(fill, lanes(n), v); }
inline float reduce_add(vf a) { return _mm512_reduce_add_ps(a); }
inline float reduce_max(vf a) { return _mm512_reduce_max_ps(a); }
inline vf scale2(vf y, vf n) { return _mm512_scalef_ps(y, n); }  // y * 2^n, n integral

inline vi izero() { return _mm512_setzero_si512(); }
inline vi iload(const void* p) { return _mm512_loadu_si512(p); }
inline void istore(void* p, vi v) { _mm512_storeu_si512(p, v); }
inline vi iadd(vi a, vi b) { return _mm512_add_epi32(a, b); }
inline vi isub(vi a, vi b) { return _mm512_sub_epi32(a, b); }
inline vi ishl4(vi a) { return _mm512_slli_epi32(a, 4); }
inline vf to_float(vi a) { return _mm512_cvtepi32_ps(a); }
inline vi to_int(vf a) { return _mm512_cvtps_epi32(a); }  // a integral: exact
// kW int32 lanes (each -128..127 after `offset` is added) -> kW bytes at p.
inline void store_bytes(void* p, vi v, int offset) {
  _mm_storeu_si128((__m128i*)p,
                   _mm512_cvtepi32_epi8(_mm512_add_epi32(v, _mm512_set1_epi32(offset))));
}
inline void store_bytes_n(void* p, vi v, int offset, int64_t n) {
  _mm_mask_storeu_epi8(p, lanes(n),
                      _mm512_cvtepi32_epi8(_mm512_add_epi32(v, _mm512_set1_epi32(offset))));
}
inline vf load_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}

// Lane l of acc += sum_i u[4l + i] * w[4l + i], u unsigned and w signed bytes (vpdpbusd);
// u4 is four bytes broadcast to every lane by bcast_u8 (bcast4: as they are).
constexpr bool kDotNeedsComp = false;  // sums are of u itself
inline vi bcast4(const void* p) { return _mm512_set1_epi32(*(const int32_t*)p); }
inline vi bcast_u8(const void* p) { return bcast4(p); }  // dot_u8s8's u operand
inline vi dot_u8s8(vi acc, vi u4, vi w) { return _mm512_dpbusd_epi32(acc, u4, w); }
// Codes 0..63 (q0, q1) against signed bytes (a0, a1): acc += sum q0 * a0 + sum q1 * a1
// (dot_codes: one pair).
inline vi dot_q4x2(vi acc, vi q0, vi a0, vi q1, vi a1) {
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc, q0, a0), q1, a1);
}
inline vi dot_codes(vi acc, vi q, vi a) { return _mm512_dpbusd_epi32(acc, q, a); }
inline vi code_pairs(vi acc, vi q, vi a) { return dot_codes(acc, q, a); }  // (AVX2's)
// 4-bit codes' sums kept in int16 pairs over a block (q4x2_pairs) and widened once
// (widen_pairs): only where the int32 step costs instructions (below VNNI; block_linear.cpp).
constexpr bool kVnni = true;  // whether an int8 dot product is one instruction (vpdpbusd)
constexpr bool kPairSums = false;
inline vi q4x2_pairs(vi acc, vi q0, vi a0, vi q1, vi a1) { return dot_q4x2(acc, q0, a0, q1, a1); }
inline vi widen_pairs(vi acc) { return acc; }
inline void pin(vi&) {}  // (the AVX2 level's: an opaque step)
constexpr bool kPairScale = false;
// Signed bytes q against signed bytes a (-127..127): acc += sum (q + kQ8Offset) * a, exact;
// here q + 128 as the unsigned operand (the caller offsets by -128 * sum a).
constexpr int kQ8Offset = 128;
inline vi dot_s8(vi acc, vi q, vi a) {
  return _mm512_dpbusd_epi32(acc, _mm512_xor_si512(q, _mm512_set1_epi8((char)0x80)), a);
}
inline vi low_nibbles(vi raw) { return _mm512_and_si512(raw, _mm512_set1_epi8(0x0F)); }
inline vi high_nibbles(vi raw) {
  return _mm512_and_si512(_mm512_srli_epi16(raw, 4), _mm512_set1_epi8(0x0F));
}
// Per byte: ((raw >> shift) & mask) << 4, the high bits of a 5- or 6-bit code (mask <= 15).
inline vi code_high_bits(vi raw, int shift, int mask) {
  return _mm512_slli_epi16(
      _mm512_and_si512(_mm512_srl_epi16(raw, _mm_cvtsi32_si128(shift)),
                       _mm512_set1_epi8((char)mask)), 4);
}
inline vi ior(vi a, vi b) { return _mm512_or_si512(a, b); }
// kW bytes at p (unsigned / signed) as floats.
inline vf load_u8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
inline vf load_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
// kW bytes at p (unsigned / signed) as int32 lanes; a * b in int32 (the low 32 bits); x in
// every lane.
inline vi iload_u8(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
}
inline vi iload_i8(const int8_t* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p));
}
inline vi imul(vi a, vi b) { return _mm512_mullo_epi32(a, b); }
inline vi iset1(int32_t x) { return _mm512_set1_epi32(x); }
inline vi ishl(vi a, int n) { return _mm512_sllv_epi32(a, _mm512_set1_epi32(n)); }
// acc += a.lo * b.lo + a.hi * b.hi, the int16 halves of each int32 lane (vpdpwssd).
inline vi dot_i16(vi acc, vi a, vi b) { return _mm512_dpwssd_epi32(acc, a, b); }
// kW lanes of 16-bit pairs (lo[i], hi[i]) from two runs of kW bytes.
inline vi u8_pairs(const uint8_t* lo, const uint8_t* hi) {
  return _mm512_or_si512(iload_u8(lo), _mm512_slli_epi32(iload_u8(hi), 16));
}
// Each lane's low 16 bits of lo and of hi as an int16 pair (lo, hi).
inline vi i16_pairs(vi lo, vi hi) {
  return _mm512_mask_blend_epi16((__mmask32)0xAAAAAAAAu, lo, _mm512_slli_epi32(hi, 16));
}

// Lane i of the result = the sum of the lanes of a[i] (a 16 x 16 transpose-and-add).
inline vf hsum_lanes(const vf a[16]) {
  __m512 s1[8], s2[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3]
    s1[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                          _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: the lane's sums of a[4i .. 4i+3]
    s2[i] = _mm512_add_ps(_mm512_shuffle_ps(s1[2 * i], s1[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                          _mm512_shuffle_ps(s1[2 * i], s1[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 t01 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[0], s2[1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(s2[0], s2[1], _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 t23 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[2], s2[3], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(s2[2], s2[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(t01, t23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(t01, t23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// ---------------------------------------------------------------------------------------------
#elif defined(__AVX2__)
constexpr int kW = 8;
#if defined(__AVXVNNI__)
constexpr const char* kLevel = "avxvnni";
#else
constexpr const char* kLevel = "avx2";
#endif
using vf = __m256;
using vi = __m256i;

inline __m256i lanes(int64_t n) {  // all-ones in the first n lanes
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int c = n <= 0 ? 0 : (n >= 8 ? 8 : (int)n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), idx);
}
inline vf zero() { return _mm256_setzero_ps(); }
inline vf set1(float x) { return _mm256_set1_ps(x); }
inline vf load(const float* p) { return _mm256_loadu_ps(p); }
inline vf load_n(const float* p, int64_t n) {
  return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes(n));
}
inline void store(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline void store_n(float* p, vf v, int64_t n) {
  if (n >= 8) _mm256_storeu_ps(p, v);
  else if (n > 0) _mm256_maskstore_ps(p, lanes(n), v);
}
inline vf add(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf div(vf a, vf b) { return _mm256_div_ps(a, b); }
inline vf fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf fnmadd(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
inline vf max(vf a, vf b) { return _mm256_max_ps(a, b); }
inline vf min(vf a, vf b) { return _mm256_min_ps(a, b); }
inline vf abs(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
inline vf round(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vf keep_n(vf v, int64_t n, vf fill) {
  return _mm256_blendv_ps(fill, v, _mm256_castsi256_ps(lanes(n)));
}
inline float reduce_add(vf a) {  // the same pairing as AVX-512's reduce: halves, then pairs
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float reduce_max(vf a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
inline vf pow2i(__m256i n) {  // 2^n for -126 <= n <= 127
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
}
inline vf scale2(vf y, vf n) {  // y * 2^n in two exact steps (each factor a normal float)
  __m256i ni = _mm256_cvtps_epi32(n);
  __m256i n1 = _mm256_srai_epi32(ni, 1);
  return _mm256_mul_ps(_mm256_mul_ps(y, pow2i(n1)), pow2i(_mm256_sub_epi32(ni, n1)));
}

inline vi izero() { return _mm256_setzero_si256(); }
inline vi iload(const void* p) { return _mm256_loadu_si256((const __m256i*)p); }
inline void istore(void* p, vi v) { _mm256_storeu_si256((__m256i*)p, v); }
inline vi iadd(vi a, vi b) { return _mm256_add_epi32(a, b); }
inline vi isub(vi a, vi b) { return _mm256_sub_epi32(a, b); }
inline vi ishl4(vi a) { return _mm256_slli_epi32(a, 4); }
inline vf to_float(vi a) { return _mm256_cvtepi32_ps(a); }
inline vi to_int(vf a) { return _mm256_cvtps_epi32(a); }
inline uint64_t pack_bytes(vi v, int offset) {  // 8 int32 in -128..127 (+offset) -> 8 bytes
  v = _mm256_add_epi32(v, _mm256_set1_epi32(offset));
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        -1, -1);
  __m256i b = _mm256_shuffle_epi8(v, pick);
  return (uint64_t)(uint32_t)_mm256_extract_epi32(b, 0)
         | (uint64_t)(uint32_t)_mm256_extract_epi32(b, 4) << 32;
}
inline void store_bytes(void* p, vi v, int offset) {
  uint64_t b = pack_bytes(v, offset);
  memcpy(p, &b, 8);
}
inline void store_bytes_n(void* p, vi v, int offset, int64_t n) {
  uint64_t b = pack_bytes(v, offset);
  memcpy(p, &b, (size_t)(n <= 0 ? 0 : (n >= 8 ? 8 : n)));
}
inline vf load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}

#if defined(__AVXVNNI__)
// The AVX-512 level's dot products on 256 bits (the same integers: all sums are exact).
constexpr bool kDotNeedsComp = false;
inline vi bcast4(const void* p) { return _mm256_set1_epi32(*(const int32_t*)p); }
inline vi bcast_u8(const void* p) { return bcast4(p); }
inline vi dot_u8s8(vi acc, vi u4, vi w) { return _mm256_dpbusd_avx_epi32(acc, u4, w); }
inline vi dot_q4x2(vi acc, vi q0, vi a0, vi q1, vi a1) {
  return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, q0, a0), q1, a1);
}
inline vi dot_codes(vi acc, vi q, vi a) { return _mm256_dpbusd_avx_epi32(acc, q, a); }
inline vi code_pairs(vi acc, vi q, vi a) { return dot_codes(acc, q, a); }  // (AVX2's)
constexpr bool kVnni = true;  // whether an int8 dot product is one instruction (vpdpbusd)
constexpr bool kPairSums = false;
inline vi q4x2_pairs(vi acc, vi q0, vi a0, vi q1, vi a1) { return dot_q4x2(acc, q0, a0, q1, a1); }
inline vi widen_pairs(vi acc) { return acc; }
inline void pin(vi&) {}  // (the AVX2 level's: an opaque step)
constexpr bool kPairScale = false;
constexpr int kQ8Offset = 128;
inline vi dot_s8(vi acc, vi q, vi a) {
  return _mm256_dpbusd_avx_epi32(acc, _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)), a);
}
inline vi dot_i16(vi acc, vi a, vi b) { return _mm256_dpwssd_avx_epi32(acc, a, b); }
#else
// No VNNI: the sums are of u - 128 (signed, never -128) times w, through maddubs(|w|,
// sign(x, w)) whose byte-pair sums stay within int16 (2 * 128 * 127 < 2^15). Callers start
// the accumulators at 128 * sum(w) ("comp") so that they hold the same sums as vpdpbusd.
constexpr bool kDotNeedsComp = true;
inline vi bcast4(const void* p) { return _mm256_set1_epi32(*(const int32_t*)p); }
inline vi bcast_u8(const void* p) {  // u - 128 as signed bytes
  return _mm256_xor_si256(bcast4(p), _mm256_set1_epi8((char)0x80));
}
inline vi dot_u8s8(vi acc, vi x4, vi w) {
  __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x4, w));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}
// Codes 0..63 against signed bytes -127..127: each maddubs pair sum is at most 2 * 63 * 127,
// so two of them add in int16 before one madd.
inline vi dot_q4x2(vi acc, vi q0, vi a0, vi q1, vi a1) {
  __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(q0, a0), _mm256_maddubs_epi16(q1, a1));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}
// 4-bit codes: a block's four k-steps summed in int16 pairs (4 * 2 * (2 * 15 * 127) = 30,480 <
// 2^15, exact), then one madd to int32 (widen_pairs) instead of one a k-step.
constexpr bool kVnni = false;  // whether an int8 dot product is one instruction (vpdpbusd)
constexpr bool kPairSums = true;
inline vi q4x2_pairs(vi acc, vi q0, vi a0, vi q1, vi a1) {
  return _mm256_add_epi16(acc, _mm256_add_epi16(_mm256_maddubs_epi16(q0, a0),
                                                _mm256_maddubs_epi16(q1, a1)));
}
inline vi widen_pairs(vi acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
// An opaque step for the compiler: integer sums would otherwise be reassociated into trees of
// all a block's products at once (the pair sums: 32 maddubs live, spilled; 23 % slower).
inline void pin(vi& v) { __asm__("" : "+x"(v)); }
// Whether a block's pair sums take their scale in one madd (dot_i16): yes here.
constexpr bool kPairScale = true;
// Codes up to 63 fit too: 2 * (2 * 63 * 127) < 2^15.
inline vi dot_codes(vi acc, vi q, vi a) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q, a),
                                                 _mm256_set1_epi16(1)));
}
// Codes against signed bytes, the products' pair sums added in int16 (the caller keeps them in
// range: codes 0..63 with |a| <= 127 give at most 16,002 a maddubs).
inline vi code_pairs(vi acc, vi q, vi a) {
  return _mm256_add_epi16(acc, _mm256_maddubs_epi16(q, a));
}
// |q| (-128 gives 128 as unsigned, still exact) against sign(a, q): 2 * 128 * 127 < 2^15.
constexpr int kQ8Offset = 0;
inline vi dot_s8(vi acc, vi q, vi a) {
  __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}
inline vi dot_i16(vi acc, vi a, vi b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
#endif
inline vi low_nibbles(vi raw) { return _mm256_and_si256(raw, _mm256_set1_epi8(0x0F)); }
inline vi high_nibbles(vi raw) {
  return _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0F));
}
inline vi code_high_bits(vi raw, int shift, int mask) {
  return _mm256_slli_epi16(
      _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(shift)),
                       _mm256_set1_epi8((char)mask)), 4);
}
inline vi ior(vi a, vi b) { return _mm256_or_si256(a, b); }
inline vf load_u8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
inline vf load_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
inline vi iload_u8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
}
inline vi iload_i8(const int8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p));
}
inline vi imul(vi a, vi b) { return _mm256_mullo_epi32(a, b); }
inline vi iset1(int32_t x) { return _mm256_set1_epi32(x); }
inline vi ishl(vi a, int n) { return _mm256_sllv_epi32(a, _mm256_set1_epi32(n)); }
inline vi u8_pairs(const uint8_t* lo, const uint8_t* hi) {
  return _mm256_or_si256(iload_u8(lo), _mm256_slli_epi32(iload_u8(hi), 16));
}
inline vi i16_pairs(vi lo, vi hi) { return _mm256_blend_epi16(lo, _mm256_slli_epi32(hi, 16), 0xAA); }

inline vf hsum_lanes(const vf a[8]) {  // an 8 x 8 transpose-and-add
  __m256 s1[4], s2[2];
  for (int i = 0; i < 4; ++i)
    s1[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                          _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 2; ++i)
    s2[i] = _mm256_add_ps(_mm256_shuffle_ps(s1[2 * i], s1[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                          _mm256_shuffle_ps(s1[2 * i], s1[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_add_ps(_mm256_permute2f128_ps(s2[0], s2[1], 0x20),
                       _mm256_permute2f128_ps(s2[0], s2[1], 0x31));
}

// ---------------------------------------------------------------------------------------------
#else
constexpr int kW = 8;
#if defined(__ARM_FEATURE_DOTPROD)
constexpr const char* kLevel = "dotprod";
#else
constexpr const char* kLevel = "generic";
#endif
// The int8 linear keeps its weights row-major here: a plain loop over one weight row is what
// compilers turn into widening multiply-adds (pmaddwd on SSE2; on aarch64 widenings, mul and
// saddw: its activations are unsigned bytes, so not sdot, even at the dotprod level).
#define RS_ROW_MAJOR_INT8 1
typedef float vf __attribute__((vector_size(32), aligned(4)));
typedef int32_t vi __attribute__((vector_size(32), aligned(4)));
typedef int8_t v32i8 __attribute__((vector_size(32)));
typedef uint8_t v32u8 __attribute__((vector_size(32)));
typedef int16_t v16i16 __attribute__((vector_size(32)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef uint32_t vu __attribute__((vector_size(32), aligned(4)));
typedef uint8_t v8u8 __attribute__((vector_size(8), aligned(1)));
typedef int8_t v8i8 __attribute__((vector_size(8), aligned(1)));
typedef uint16_t v8u16 __attribute__((vector_size(16), aligned(2)));

inline vf zero() { return vf{}; }
inline vf set1(float x) { return vf{x, x, x, x, x, x, x, x}; }
inline vf load(const float* p) {
  vf v;
  memcpy(&v, p, sizeof v);
  return v;
}
inline vf load_n(const float* p, int64_t n) {
  if (n >= kW) return load(p);
  vf v = {};
  for (int64_t i = 0; i < n; ++i) v[i] = p[i];
  return v;
}
inline void store(float* p, vf v) { memcpy(p, &v, sizeof v); }
inline void store_n(float* p, vf v, int64_t n) {
  if (n >= kW) return store(p, v);
  for (int64_t i = 0; i < n; ++i) p[i] = v[i];
}
inline vf add(vf a, vf b) { return a + b; }
inline vf sub(vf a, vf b) { return a - b; }
inline vf mul(vf a, vf b) { return a * b; }
inline vf div(vf a, vf b) { return a / b; }
inline vf fmadd(vf a, vf b, vf c) { return a * b + c; }  // two roundings (no FMA assumed)
inline vf fnmadd(vf a, vf b, vf c) { return c - a * b; }
inline vf max(vf a, vf b) { return a > b ? a : b; }
inline vf min(vf a, vf b) { return a < b ? a : b; }
inline vf abs(vf a) { return a < zero() ? -a : a; }
inline vf round(vf a) {  // 2^23 forces the rounding; larger floats are integers already
  const vf big = set1(8388608.0f);
  vf m = abs(a);
  vf r = (m + big) - big;
  r = m >= big ? m : r;
  return a < zero() ? -r : r;
}
inline vf keep_n(vf v, int64_t n, vf fill) {
  for (int64_t i = n < 0 ? 0 : n; i < kW; ++i) v[i] = fill[i];
  return v;
}
inline float reduce_add(vf a) {  // halves, then pairs (as the other levels)
  float s[4];
  for (int i = 0; i < 4; ++i) s[i] = a[i] + a[i + 4];
  return (s[0] + s[2]) + (s[1] + s[3]);
}
inline float reduce_max(vf a) {
  float m = a[0];
  for (int i = 1; i < kW; ++i) m = a[i] > m ? a[i] : m;
  return m;
}
inline vf pow2i(vi n) {
  vi bits = (n + 127) << 23;
  vf f;
  memcpy(&f, &bits, sizeof f);
  return f;
}
inline vi to_int(vf a) { return __builtin_convertvector(a, vi); }  // a integral: exact
inline vf scale2(vf y, vf n) {
  vi ni = to_int(n), n1 = ni >> 1;
  return (y * pow2i(n1)) * pow2i(ni - n1);
}

inline vi izero() { return vi{}; }
inline vi iload(const void* p) {
  vi v;
  memcpy(&v, p, sizeof v);
  return v;
}
inline void istore(void* p, vi v) { memcpy(p, &v, sizeof v); }
inline vi iadd(vi a, vi b) { return a + b; }
inline vi isub(vi a, vi b) { return a - b; }
inline vi ishl4(vi a) { return a << 4; }
inline vf to_float(vi a) { return __builtin_convertvector(a, vf); }
inline void store_bytes_n(void* p, vi v, int offset, int64_t n) {
  uint8_t* b = (uint8_t*)p;
  for (int64_t i = 0; i < n && i < kW; ++i) b[i] = (uint8_t)(v[i] + offset);
}
inline void store_bytes(void* p, vi v, int offset) { store_bytes_n(p, v, offset, kW); }
inline float half_to_float(uint16_t h) {  // IEEE binary16 -> binary32, exact
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | man << 13;
  } else if (exp != 0) {
    bits = sign | (exp + 112) << 23 | man << 13;
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: value man * 2^-24, exact in float
    float f = (float)man * 5.9604644775390625e-8f;
    memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
// kW halves -> floats, exact. aarch64: NEON's fcvtl (base Armv8-A), four a register (exact for
// every half, subnormals included: Arm's conversions do not flush half inputs). Elsewhere
// without a branch a lane (half_linear.cpp's generic widening, on kW lanes): normal halves are
// their bits moved to float's place with the exponent rebiased, subnormal ones their mantissa
// times 2^-24, infinities and NaNs their bits under float's all-ones exponent.
#if defined(__aarch64__)
inline vf load_f16(const uint16_t* p) {
  const float32x4_t lo = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
  const float32x4_t hi = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4)));
  vf f;
  memcpy(&f, &lo, sizeof lo);
  memcpy((char*)&f + sizeof lo, &hi, sizeof hi);
  return f;
}
#else
inline vf load_f16(const uint16_t* p) {
  v8u16 h;
  memcpy(&h, p, sizeof h);
  const vi x = __builtin_convertvector(h, vi), e = x & 0x7C00, mag = (x & 0x7FFF) << 13;
  const vf tiny = to_float(x & 0x3FF) * 5.9604644775390625e-8f;  // 2^-24
  vi tiny_bits;
  memcpy(&tiny_bits, &tiny, sizeof tiny_bits);
  vi bits = e == 0 ? tiny_bits : e == 0x7C00 ? (mag | 0x7F800000) : mag + ((127 - 15) << 23);
  bits |= (x & 0x8000) << 16;
  vf f;
  memcpy(&f, &bits, sizeof f);
  return f;
}
#endif

// Codes 0..63 times signed bytes -127..127, 4 a lane, in vector arithmetic (the block linear's
// dot products; the int8 linear uses its own row-major loops, RS_ROW_MAJOR_INT8): products in
// int16, byte pairs summed in int16 (two pairs: |sum| <= 4 * 63 * 127), then in int32. A byte
// pair is one 16-bit lane (little-endian: the even byte low): the bytes are taken out by shifts
// and masks on 16-bit lanes, and pairs of 16-bit lanes summed by shifts on 32-bit lanes, not by
// lane shuffles, which SSE2 has no instruction for (GCC spilled them to memory) and NEON does
// not need.
inline vi bcast4(const void* p) {
  int32_t x;
  memcpy(&x, p, 4);
  return vi{} + x;
}
inline v16i16 even_s8(vi a) { return (v16i16)((v16u16)a << 8) >> 8; }  // sign-extended
inline v16i16 odd_s8(vi a) { return (v16i16)a >> 8; }
inline v16i16 even_u7(vi a) { return (v16i16)((v16u16)a & 0xFF); }  // bytes 0..127
inline v16i16 odd_u7(vi a) { return (v16i16)((v16u16)a >> 8); }
inline v16i16 pair_products(vi a, vi b) {  // signed bytes a, b
  return even_s8(a) * even_s8(b) + odd_s8(a) * odd_s8(b);
}
inline v16i16 code_pair_products(vi q, vi a) {  // codes 0..63 q, signed bytes a
  return even_u7(q) * even_s8(a) + odd_u7(q) * odd_s8(a);
}
inline vi pairs_to_lanes(v16i16 pairs) {
  const vi w = (vi)pairs;
  return ((vi)((vu)w << 16) >> 16) + (w >> 16);
}
#if defined(__ARM_FEATURE_DOTPROD)
// Armv8.2's dot product (sdot: 4 signed byte products summed into each int32 lane, one
// instruction a register), on the vector's two NEON registers: the same exact sums as the
// generic arithmetic below (codes are below 128, so signed), hence the same bits.
inline vi sdot(vi acc, vi q, vi a) {
  int32x4_t c[2];
  int8x16_t x[2], y[2];
  memcpy(c, &acc, sizeof c);
  memcpy(x, &q, sizeof x);
  memcpy(y, &a, sizeof y);
  c[0] = vdotq_s32(c[0], x[0], y[0]);
  c[1] = vdotq_s32(c[1], x[1], y[1]);
  memcpy(&acc, c, sizeof acc);
  return acc;
}
inline vi dot_q4x2(vi acc, vi q0, vi a0, vi q1, vi a1) { return sdot(sdot(acc, q0, a0), q1, a1); }
inline vi dot_codes(vi acc, vi q, vi a) { return sdot(acc, q, a); }
inline vi code_pairs(vi acc, vi q, vi a) { return dot_codes(acc, q, a); }  // (AVX2's)
constexpr bool kVnni = true;  // whether an int8 dot product is one instruction (vpdpbusd, sdot)
constexpr bool kPairSums = false;
inline vi q4x2_pairs(vi acc, vi q0, vi a0, vi q1, vi a1) { return dot_q4x2(acc, q0, a0, q1, a1); }
inline vi widen_pairs(vi acc) { return acc; }
inline void pin(vi&) {}  // (the AVX2 level's: an opaque step)
constexpr bool kPairScale = false;
constexpr int kQ8Offset = 0;  // signed bytes against signed bytes
inline vi dot_s8(vi acc, vi q, vi a) { return sdot(acc, q, a); }
#else
inline vi dot_q4x2(vi acc, vi q0, vi a0, vi q1, vi a1) {
  return acc + pairs_to_lanes(code_pair_products(q0, a0) + code_pair_products(q1, a1));
}
inline vi dot_codes(vi acc, vi q, vi a) { return acc + pairs_to_lanes(code_pair_products(q, a)); }
inline vi code_pairs(vi acc, vi q, vi a) { return (vi)((v16i16)acc + code_pair_products(q, a)); }
// As on AVX2: a block's 4-bit sums in int16 pairs (|sum| <= 30,480), widened once.
constexpr bool kVnni = false;  // whether an int8 dot product is one instruction (vpdpbusd)
constexpr bool kPairSums = true;
inline vi q4x2_pairs(vi acc, vi q0, vi a0, vi q1, vi a1) {
  return (vi)((v16i16)acc + code_pair_products(q0, a0) + code_pair_products(q1, a1));
}
inline vi widen_pairs(vi acc) { return pairs_to_lanes((v16i16)acc); }
inline void pin(vi&) {}  // (the AVX2 level's: an opaque step)
// No: dot_i16 is four shifts and two multiplies here; widening, one multiply (M = 1: 17 vs 12
// GMAC/s, the 3B shape's Q4_K matrices, 2 threads).
constexpr bool kPairScale = false;
constexpr int kQ8Offset = 0;  // signed bytes: |products| <= 128 * 127, pairs within int16
inline vi dot_s8(vi acc, vi q, vi a) { return acc + pairs_to_lanes(pair_products(q, a)); }
#endif
inline vi low_nibbles(vi raw) { return (vi)((v32u8)raw & (uint8_t)0x0F); }
inline vi high_nibbles(vi raw) { return (vi)((v32u8)raw >> 4); }
inline vi code_high_bits(vi raw, int shift, int mask) {
  return (vi)((((v32u8)raw >> (uint8_t)shift) & (uint8_t)mask) << (uint8_t)4);
}
inline vi ior(vi a, vi b) { return a | b; }
inline vi iload_u8(const uint8_t* p) {
  v8u8 b;
  memcpy(&b, p, sizeof b);
  return __builtin_convertvector(b, vi);
}
inline vi iload_i8(const int8_t* p) {
  v8i8 b;
  memcpy(&b, p, sizeof b);
  return __builtin_convertvector(b, vi);
}
inline vf load_u8(const uint8_t* p) { return to_float(iload_u8(p)); }
inline vf load_i8(const int8_t* p) { return to_float(iload_i8(p)); }
inline vi imul(vi a, vi b) { return a * b; }
inline vi iset1(int32_t x) { return vi{} + x; }
inline vi ishl(vi a, int n) { return a << n; }  // one count for every lane (SSE2: pslld)
inline vi dot_i16(vi acc, vi a, vi b) {  // the int16 halves' products summed a lane
  const vi a_lo = (vi)((vu)a << 16) >> 16, b_lo = (vi)((vu)b << 16) >> 16;
  return acc + a_lo * b_lo + (a >> 16) * (b >> 16);
}
inline vi u8_pairs(const uint8_t* lo, const uint8_t* hi) {
  return (vi)((vu)iload_u8(lo) | (vu)iload_u8(hi) << 16);
}
inline vi i16_pairs(vi lo, vi hi) { return (vi)(((vu)lo & 0xFFFFu) | (vu)hi << 16); }

// Lane i = reduce_add(a[i]), the same sums in the same order ((a0 + a4) + (a2 + a6)) +
// ((a1 + a5) + (a3 + a7)), as an 8 x 8 transpose-and-add: lane by lane, each lane's store and
// the vector's reload stalled store forwarding, and attention's scores ran at a fifth of
// their speed.
typedef float v4f __attribute__((vector_size(16)));
inline vf hsum_lanes(const vf a[8]) {
  v4f h[8], q[4];
  for (int i = 0; i < 8; ++i)  // [a0 + a4, a1 + a5, a2 + a6, a3 + a7]
    h[i] = __builtin_shufflevector(a[i], a[i], 0, 1, 2, 3) +
           __builtin_shufflevector(a[i], a[i], 4, 5, 6, 7);
  for (int i = 0; i < 4; ++i)  // [x0 + x2, y0 + y2, x1 + x3, y1 + y3] of x = h[2i], y = h[2i+1]
    q[i] = __builtin_shufflevector(h[2 * i], h[2 * i + 1], 0, 4, 1, 5) +
           __builtin_shufflevector(h[2 * i], h[2 * i + 1], 2, 6, 3, 7);
  const v4f lo = __builtin_shufflevector(q[0], q[1], 0, 1, 4, 5) +
                 __builtin_shufflevector(q[0], q[1], 2, 3, 6, 7);
  const v4f hi = __builtin_shufflevector(q[2], q[3], 0, 1, 4, 5) +
                 __builtin_shufflevector(q[2], q[3], 2, 3, 6, 7);
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7);
}
#endif

// KV pool elements: float32, IEEE half (f16) or bfloat16, each 16-bit one as its bits. Loads
// widen exactly; stores round to nearest even (scalar: once per new token, not in the hot loop).
struct f16 {
  uint16_t bits;
};
struct bf16 {
  uint16_t bits;
};

inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40);  // NaN stays NaN
  return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1)) >> 16);
}

inline uint16_t float_to_f16(float f) {
#if defined(__F16C__)
  return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0));
  if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // rounds to infinity
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal half, rounded in float arithmetic
    float a;
    memcpy(&a, &ax, 4);
    const float r = (a * 16777216.0f + 8388608.0f) - 8388608.0f;  // a * 2^24, to nearest even
    return (uint16_t)(sign | (uint32_t)r);
  }
  return (uint16_t)(sign | ((ax + 0x0FFFu + ((ax >> 13) & 1)) - 0x38000000u) >> 13);
#endif
}

inline void store_kv(float* dst, const float* src, int64_t n) {
  memcpy(dst, src, (size_t)n * sizeof(float));
}
inline void store_kv(f16* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i].bits = float_to_f16(src[i]);
}
inline void store_kv(bf16* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i].bits = float_to_bf16(src[i]);
}

inline vf load_kv(const float* p, int64_t n) { return load_n(p, n); }
#if defined(__AVX512F__)
inline vf load_kv(const f16* p, int64_t n) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes(n), p));
}
inline vf load_kv(const bf16* p, int64_t n) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes(n), p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
#elif defined(__AVX2__)
inline __m128i load_halves(const void* p, int64_t n) {  // n 16-bit lanes, zeros after
  if (n >= 8) return _mm_loadu_si128((const __m128i*)p);
  alignas(16) uint16_t tmp[8] = {};
  if (n > 0) memcpy(tmp, p, (size_t)n * 2);
  return _mm_load_si128((const __m128i*)tmp);
}
inline vf load_kv(const f16* p, int64_t n) { return _mm256_cvtph_ps(load_halves(p, n)); }
inline vf load_kv(const bf16* p, int64_t n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load_halves(p, n)), 16));
}
#else
inline vf load_kv(const f16* p, int64_t n) {
  vf v = {};
  for (int64_t i = 0; i < n && i < kW; ++i) v[i] = half_to_float(p[i].bits);
  return v;
}
inline vf load_kv(const bf16* p, int64_t n) {
  vf v = {};
  for (int64_t i = 0; i < n && i < kW; ++i) {
    const uint32_t bits = (uint32_t)p[i].bits << 16;
    memcpy(&v[i], &bits, 4);
  }
  return v;
}
#endif

// exp(x) on all lanes (Cephes' polynomial, ~1 ulp); overflows to inf, underflows to 0
// (exp(-inf) = 0).
inline vf exp_ps(vf x) {
  x = min(max(x, set1(-103.0f)), set1(89.0f));
  vf n = round(mul(x, set1(1.44269504088896341f)));
  vf r = fnmadd(n, set1(0.693359375f), x);
  r = fnmadd(n, set1(-2.12194440e-4f), r);
  vf p = set1(1.9875691500e-4f);
  p = fmadd(p, r, set1(1.3981999507e-3f));
  p = fmadd(p, r, set1(8.3334519073e-3f));
  p = fmadd(p, r, set1(4.1665795894e-2f));
  p = fmadd(p, r, set1(1.6666665459e-1f));
  p = fmadd(p, r, set1(5.0000001201e-1f));
  vf y = fmadd(mul(p, r), r, add(r, set1(1.0f)));
  return scale2(y, n);
}

}  // namespace simd

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
#include <immintrin.h>

// Configures every AMX tile as 16 rows x 64 bytes (the layout both linear kernels use), for
// the calling thread.
inline void amx_configure() {
  struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}
#endif

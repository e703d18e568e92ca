// The machine's int8 dot-product ceiling: each level's instruction for u8 x s8 products
// (AVX-512 VNNI and AVX-VNNI vpdpbusd; AVX2 vpmaddubsw with an int16 add, the cheapest sound
// accumulation there) issued back to back on independent accumulators on every OpenMP thread,
// nothing else in the loop. What a GEMM of the block kernels' kind can at best approach
// (benchmarks/real_size.py prints it beside the rates a workload takes). Levels the CPU lacks
// are skipped. Build: g++ -O2 -fopenmp int8_peak.cpp; prints "level GMAC/s" per line.
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>

#include <chrono>

namespace {

constexpr long kIters = 40'000'000;  // per thread, 8 instructions each

template <typename F>
double rate(F body, double macs_per_iter) {
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
    body();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double r = omp_get_max_threads() * kIters * macs_per_iter / s / 1e9;
    best = r > best ? r : best;
  }
  return best;
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) void vnni512() {
  // no two accumulators alike
  __m512i a0 = _mm512_set1_epi32(0), a1 = _mm512_set1_epi32(1);
  __m512i a2 = _mm512_set1_epi32(2), a3 = _mm512_set1_epi32(3);
  __m512i a4 = _mm512_set1_epi32(4), a5 = _mm512_set1_epi32(5);
  __m512i a6 = _mm512_set1_epi32(6), a7 = _mm512_set1_epi32(7);
  __m512i b = _mm512_set1_epi8(1), c = _mm512_set1_epi8(2);
  asm volatile("" : "+v"(b), "+v"(c));
  for (long n = 0; n < kIters; ++n) {
    asm volatile("" : "+v"(b), "+v"(c));  // nothing the loop may hoist
    a0 = _mm512_dpbusd_epi32(a0, b, c); a1 = _mm512_dpbusd_epi32(a1, b, c);
    a2 = _mm512_dpbusd_epi32(a2, b, c); a3 = _mm512_dpbusd_epi32(a3, b, c);
    a4 = _mm512_dpbusd_epi32(a4, b, c); a5 = _mm512_dpbusd_epi32(a5, b, c);
    a6 = _mm512_dpbusd_epi32(a6, b, c); a7 = _mm512_dpbusd_epi32(a7, b, c);
  }
  asm volatile("" : : "v"(a0), "v"(a1), "v"(a2), "v"(a3));
  asm volatile("" : : "v"(a4), "v"(a5), "v"(a6), "v"(a7));
}

__attribute__((target("avx2,avxvnni"))) void vnni256() {
  // no two accumulators alike
  __m256i a0 = _mm256_set1_epi32(0), a1 = _mm256_set1_epi32(1);
  __m256i a2 = _mm256_set1_epi32(2), a3 = _mm256_set1_epi32(3);
  __m256i a4 = _mm256_set1_epi32(4), a5 = _mm256_set1_epi32(5);
  __m256i a6 = _mm256_set1_epi32(6), a7 = _mm256_set1_epi32(7);
  __m256i b = _mm256_set1_epi8(1), c = _mm256_set1_epi8(2);
  asm volatile("" : "+x"(b), "+x"(c));
  for (long n = 0; n < kIters; ++n) {
    asm volatile("" : "+x"(b), "+x"(c));  // nothing the loop may hoist
    a0 = _mm256_dpbusd_avx_epi32(a0, b, c); a1 = _mm256_dpbusd_avx_epi32(a1, b, c);
    a2 = _mm256_dpbusd_avx_epi32(a2, b, c); a3 = _mm256_dpbusd_avx_epi32(a3, b, c);
    a4 = _mm256_dpbusd_avx_epi32(a4, b, c); a5 = _mm256_dpbusd_avx_epi32(a5, b, c);
    a6 = _mm256_dpbusd_avx_epi32(a6, b, c); a7 = _mm256_dpbusd_avx_epi32(a7, b, c);
  }
  asm volatile("" : : "x"(a0), "x"(a1), "x"(a2), "x"(a3));
  asm volatile("" : : "x"(a4), "x"(a5), "x"(a6), "x"(a7));
}

__attribute__((target("avx2"))) void maddubs256() {
  __m256i a0 = _mm256_set1_epi32(0), a1 = _mm256_set1_epi32(1), a2 = _mm256_set1_epi32(2),
          a3 = _mm256_set1_epi32(3), a4 = _mm256_set1_epi32(4), a5 = _mm256_set1_epi32(5),
          a6 = _mm256_set1_epi32(6), a7 = _mm256_set1_epi32(7);
  // eight different products an iteration (four u8 operands against two s8: no two the same)
  __m256i b0 = _mm256_set1_epi8(1), b1 = _mm256_set1_epi8(2), b2 = _mm256_set1_epi8(3),
          b3 = _mm256_set1_epi8(4), c0 = _mm256_set1_epi8(5), c1 = _mm256_set1_epi8(6);
  for (long n = 0; n < kIters; ++n) {
    asm volatile("" : "+x"(b0), "+x"(b1), "+x"(b2), "+x"(b3), "+x"(c0), "+x"(c1));
    a0 = _mm256_add_epi16(a0, _mm256_maddubs_epi16(b0, c0));
    a1 = _mm256_add_epi16(a1, _mm256_maddubs_epi16(b1, c0));
    a2 = _mm256_add_epi16(a2, _mm256_maddubs_epi16(b2, c0));
    a3 = _mm256_add_epi16(a3, _mm256_maddubs_epi16(b3, c0));
    a4 = _mm256_add_epi16(a4, _mm256_maddubs_epi16(b0, c1));
    a5 = _mm256_add_epi16(a5, _mm256_maddubs_epi16(b1, c1));
    a6 = _mm256_add_epi16(a6, _mm256_maddubs_epi16(b2, c1));
    a7 = _mm256_add_epi16(a7, _mm256_maddubs_epi16(b3, c1));
  }
  asm volatile("" : : "x"(a0), "x"(a1), "x"(a2), "x"(a3));
  asm volatile("" : : "x"(a4), "x"(a5), "x"(a6), "x"(a7));
}

}  // namespace

int main() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw"))
    printf("avx512 %.0f\n", rate(vnni512, 8 * 64));
  if (__builtin_cpu_supports("avxvnni")) printf("avxvnni %.0f\n", rate(vnni256, 8 * 32));
  if (__builtin_cpu_supports("avx2")) printf("avx2 %.0f\n", rate(maddubs256, 8 * 32));
  return 0;
}

/* The register-only FMA loops behind `ctuner bench peak`: the float32
 * multiply-add rate a core reaches with no memory traffic at all, the ceiling
 * an SGEMM is measured against (docs/gemm.md); and the bf16 dot-product rate
 * (vdpbf16ps, "avx512bf16"), the ceiling of ct_sgemm_bf16.
 *
 * Each ISA's loop keeps ACC independent vector accumulators (more than FMA
 * latency x FMA pipes, so the pipes never wait on a result) and updates every
 * one with acc = acc * m + c per iteration; m and c keep the values bounded
 * and normal, and the result is returned so the compiler cannot drop the
 * loop. Functions carry their target attribute; the caller checks the CPU
 * (ct_fma_peak_has).
 * Not here: timing and threads (src/cli/cmd_bench_peak.c).
 */
#include <immintrin.h>
#include <string.h>

#include "ctuner/kernels.h"

#define ACC512 16 /* of 32 zmm registers */
#define ACC256 12 /* of 16 ymm registers */

__attribute__((target("avx512f"))) static float loop512(long iters, float m, float c) {
  __m512 acc[ACC512];
  __m512 vm = _mm512_set1_ps(m), vc = _mm512_set1_ps(c);
#pragma GCC unroll 16
  for (int i = 0; i < ACC512; i++) acc[i] = _mm512_set1_ps((float)i);
  for (long it = 0; it < iters; it++) {
#pragma GCC unroll 16
    for (int i = 0; i < ACC512; i++) acc[i] = _mm512_fmadd_ps(acc[i], vm, vc);
  }
  __m512 s = acc[0];
#pragma GCC unroll 16
  for (int i = 1; i < ACC512; i++) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float loop256(long iters, float m, float c) {
  __m256 acc[ACC256];
  __m256 vm = _mm256_set1_ps(m), vc = _mm256_set1_ps(c);
#pragma GCC unroll 16
  for (int i = 0; i < ACC256; i++) acc[i] = _mm256_set1_ps((float)i);
  for (long it = 0; it < iters; it++) {
#pragma GCC unroll 16
    for (int i = 0; i < ACC256; i++) acc[i] = _mm256_fmadd_ps(acc[i], vm, vc);
  }
  __m256 s = acc[0];
#pragma GCC unroll 16
  for (int i = 1; i < ACC256; i++) s = _mm256_add_ps(s, acc[i]);
  float v[8];
  _mm256_storeu_ps(v, s);
  return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}

/* vdpbf16ps: per 32-bit lane acc += a0*b0 + a1*b1 (2 products, 2 adds). With
 * a = (1, 1) and b = (x, -x) every update adds exactly zero, so the
 * accumulators stay bounded; the instruction does not know that. */
__attribute__((target("avx512f,avx512bf16"))) static float loop_bf16(long iters, float x) {
  __m512 acc[ACC512];
  __m512bh va = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1.0f), _mm512_set1_ps(1.0f));
  __m512bh vb = (__m512bh)_mm512_set1_epi32((int)(0xBF80u << 16 | 0x3F80u)); /* (1, -1) */
#pragma GCC unroll 16
  for (int i = 0; i < ACC512; i++) acc[i] = _mm512_set1_ps(x * (float)i);
  for (long it = 0; it < iters; it++) {
#pragma GCC unroll 16
    for (int i = 0; i < ACC512; i++) acc[i] = _mm512_dpbf16_ps(acc[i], va, vb);
  }
  __m512 s = acc[0];
#pragma GCC unroll 16
  for (int i = 1; i < ACC512; i++) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

int ct_fma_peak_has(const char *isa) {
  __builtin_cpu_init();
  if (!strcmp(isa, "avx512")) return __builtin_cpu_supports("avx512f");
  if (!strcmp(isa, "avx2")) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!strcmp(isa, "avx512bf16"))
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return 0;
}

double ct_fma_peak_loop(const char *isa, long iters, float *sink) {
  if (!ct_fma_peak_has(isa) || iters <= 0) return 0.0;
  /* m, c from the sink so the compiler knows nothing of them */
  float m = 0.999f + 0.0f * *sink, c = 1e-3f;
  if (!strcmp(isa, "avx512bf16")) { /* 16 lanes x 2 products x 2 FLOPs */
    *sink += loop_bf16(iters, c);
    return 4.0 * 16 * ACC512 * (double)iters;
  }
  if (!strcmp(isa, "avx512")) {
    *sink += loop512(iters, m, c);
    return 2.0 * 16 * ACC512 * (double)iters;
  }
  *sink += loop256(iters, m, c);
  return 2.0 * 8 * ACC256 * (double)iters;
}

/* The AVX-512 SGEMM's register tile, cache blocks and packing (private; a
 * template like gemm_driver.h): included by gemm_avx512.c (float32) and by
 * gemm_bf16.c, which packs the same panels and then rounds them to bf16 pairs
 * (docs/gemm.md). Every function is static and carries the AVX-512 target
 * attribute; the includer defines nothing before it.
 */
#ifndef CT_KERNELS_GEMM_AVX512_PACK_H
#define CT_KERNELS_GEMM_AVX512_PACK_H

#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))

/* Register tile: MR rows of C by NV zmm vectors (NR = 16 * NV columns). The
 * defaults were measured best on the development CPU (docs/gemm.md). */
#ifndef GEMM_MR
#define GEMM_MR 8
#endif
#ifndef GEMM_NV
#define GEMM_NV 3
#endif
#define MR GEMM_MR
#define NV GEMM_NV
#define NR (16 * NV)
/* Cache blocks: a KC x NR panel of B stays in L1, an MC x KC block of A in L2,
 * a KC x NC block of B in L3. Upper bounds; actual blocks split evenly. */
#ifndef GEMM_KC
#define GEMM_KC 512
#endif
#ifndef GEMM_MC
#define GEMM_MC 192
#endif
#ifndef GEMM_NC
#define GEMM_NC 3072
#endif

static inline int imin(int a, int b) {
  return a < b ? a : b;
}
static inline int cdiv(int a, int b) {
  return (a + b - 1) / b;
}

/* ---------------------------------------------------------------- packing */

/* Mask of the first n lanes (n <= 0: none, n >= 16: all). */
AVX512 static inline __mmask16 lanes(int n) {
  if (n >= 16) return (__mmask16)0xFFFF;
  return n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/* dst[c * ldd + r] = src[r * lds + c] for an 8 x 8 block: the packing of
 * row-major A (rows -> k-major panels) and of transposed B (rows of the stored
 * matrix -> columns of op(B)) are both this transpose. */
AVX512 static inline void transpose8x8(const float *src, size_t lds, float *dst, size_t ldd) {
  __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lds);
  __m256 r2 = _mm256_loadu_ps(src + 2 * lds), r3 = _mm256_loadu_ps(src + 3 * lds);
  __m256 r4 = _mm256_loadu_ps(src + 4 * lds), r5 = _mm256_loadu_ps(src + 5 * lds);
  __m256 r6 = _mm256_loadu_ps(src + 6 * lds), r7 = _mm256_loadu_ps(src + 7 * lds);
  __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  _mm256_storeu_ps(dst, _mm256_permute2f128_ps(s0, s4, 0x20));
  _mm256_storeu_ps(dst + ldd, _mm256_permute2f128_ps(s1, s5, 0x20));
  _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(s2, s6, 0x20));
  _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(s3, s7, 0x20));
  _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(s0, s4, 0x31));
  _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(s1, s5, 0x31));
  _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(s2, s6, 0x31));
  _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(s3, s7, 0x31));
}

/* Scalar transpose of an r x c block (r, c <= 8 or any size), for edges. */
static void transpose_edge(const float *src, size_t lds, int r, int c, float *dst, size_t ldd) {
  for (int i = 0; i < r; i++)
    for (int j = 0; j < c; j++) dst[(size_t)j * ldd + i] = src[(size_t)i * lds + j];
}

/* Rows [i0, i0+mc) x depth [k0, k0+kc) of op(A) into MR-row panels: panel p
 * holds op(A)[i0+p+i][k0+k] at [p*kc + k*MR + i]; rows past mc are zero so
 * the micro-kernel never branches on the row count. */
AVX512 static void pack_a(int transA, const float *A, int lda, int i0, int k0, int mc, int kc,
                          float *restrict ap) {
  if (transA) { /* op(A)[i][k] = A[k][i] */
    int p0 = 0;
#if MR == 8
    /* two panels (16 stored columns) at a time, two stored rows per step:
     * the rows' low halves are the first panel's slots k and k+1, the high
     * halves the second's, each panel written front to back */
    for (; p0 + 2 * MR <= mc; p0 += 2 * MR) {
      const float *src = A + (size_t)k0 * lda + i0 + p0;
      float *d0 = ap + (size_t)p0 * kc, *d1 = d0 + (size_t)MR * kc;
      int k = 0;
      for (; k + 2 <= kc; k += 2) {
        __m512 r0 = _mm512_loadu_ps(src + (size_t)k * lda);
        __m512 r1 = _mm512_loadu_ps(src + (size_t)(k + 1) * lda);
        _mm512_storeu_ps(d0 + (size_t)k * MR, _mm512_shuffle_f32x4(r0, r1, 0x44));
        _mm512_storeu_ps(d1 + (size_t)k * MR, _mm512_shuffle_f32x4(r0, r1, 0xEE));
      }
      for (; k < kc; k++) {
        __m512 r0 = _mm512_loadu_ps(src + (size_t)k * lda);
        _mm256_storeu_ps(d0 + (size_t)k * MR, _mm512_castps512_ps256(r0));
        _mm256_storeu_ps(d1 + (size_t)k * MR, _mm512_extractf32x8_ps(r0, 1));
      }
    }
#endif
    /* the rest: walk stored rows in order, dealing MR floats to each panel */
    for (int k = 0; k < kc; k++) {
      const float *src = A + (size_t)(k0 + k) * lda + i0;
      for (int p = p0; p < mc; p += MR) {
        float *dst = ap + (size_t)p * kc + (size_t)k * MR;
#if MR <= 16
        _mm512_mask_storeu_ps(dst, lanes(MR), _mm512_maskz_loadu_ps(lanes(mc - p), src + p));
#else
        for (int i = 0; i < MR; i++) dst[i] = p + i < mc ? src[p + i] : 0.0f;
#endif
      }
    }
    return;
  }
  for (int p = 0; p < mc; p += MR) {
    int mr = imin(MR, mc - p);
    float *dst = ap + (size_t)p * kc;
    /* row-major A: 8 x 8 transposes of (rows, k) into (k, rows) */
    const float *src = A + (size_t)(i0 + p) * lda + k0;
    if (mr < MR)
      for (int k = 0; k < kc; k++)
        for (int i = mr; i < MR; i++) dst[(size_t)k * MR + i] = 0.0f;
    for (int i = 0; i < mr; i += 8) {
      int r = imin(8, mr - i), k = 0;
      if (r == 8)
        for (; k + 8 <= kc; k += 8)
          transpose8x8(src + (size_t)i * lda + k, (size_t)lda, dst + (size_t)k * MR + i, MR);
      transpose_edge(src + (size_t)i * lda + k, (size_t)lda, r, kc - k, dst + (size_t)k * MR + i,
                     MR);
    }
  }
}

/* Rows [k0+ka, k0+kb) of op(B) = B (not transposed), columns [j0, j0+nc),
 * into the NR-wide panels of a kc-deep block: each stored row is read once,
 * front to back (one memory stream), and dealt to the panels. */
AVX512 __attribute__((unused)) static void pack_b_rows(const float *B, int ldb, int k0, int ka,
                                                       int kb, int kc, int j0, int nc,
                                                       float *restrict bp) {
  for (int k = ka; k < kb; k++) {
    const float *src = B + (size_t)(k0 + k) * ldb + j0;
    for (int q = 0; q * NR < nc; q++) {
      float *dst = bp + (size_t)q * kc * NR + (size_t)k * NR;
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++)
        _mm512_store_ps(dst + 16 * v,
                        _mm512_maskz_loadu_ps(lanes(nc - q * NR - 16 * v), src + q * NR + 16 * v));
    }
  }
}

/* Columns [j0, j0+nr) (nr <= NR) x depth [k0, k0+kc) of op(B) = B^T (B stored
 * transposed) into one panel: op(B)[k0+k][j0+j] at [k*NR + j], zero past nr. */
AVX512 static void pack_bt_panel(const float *B, int ldb, int k0, int kc, int j0, int nr,
                                 float *restrict dst) {
  /* op(B)[k][j] = B[j][k]: 8 x 8 transposes of (stored rows j, k) */
  const float *src = B + (size_t)j0 * ldb + k0;
  for (int j = 0; j < nr; j += 8) {
    int r = imin(8, nr - j), k = 0;
    if (r == 8)
      for (; k + 8 <= kc; k += 8)
        transpose8x8(src + (size_t)j * ldb + k, (size_t)ldb, dst + (size_t)k * NR + j, NR);
    transpose_edge(src + (size_t)j * ldb + k, (size_t)ldb, r, kc - k, dst + (size_t)k * NR + j, NR);
  }
  if (nr < NR)
    for (int k = 0; k < kc; k++)
      for (int j = nr; j < NR; j++) dst[(size_t)k * NR + j] = 0.0f;
}

#endif

/* AVX2 + FMA SGEMM: the AVX-512 kernel's design (gemm_avx512.c) on 256-bit
 * registers, for CPUs without AVX-512.
 *
 * Same blocking (gemm_driver.h): op(B) packed into NR-wide k-major panels per
 * (column block, K block) and shared by the threads, op(A) packed per task
 * into MR-row panels, a register-tile micro-kernel swept over the MR x NR
 * tiles. The tile is 4 rows x 24 columns (3 ymm vectors): 12 accumulators, 3
 * B vectors and one broadcast fill the 16 ymm registers AVX2 has. Edges use
 * zero-padded panels and masked loads/stores of C (vmaskmov).
 *
 * Bits: every element of C gets the same operations as on the AVX-512 path
 * (FMA over k ascending within K blocks of the same size, then
 * alpha*acc + beta*C by one FMA), so both paths give identical results, for
 * any thread count (tests/test_gemm.c checks it where both exist).
 * Every function carries the AVX2 target attribute so the library builds
 * without -march flags; gemm.c calls in here only after a CPU check.
 * Not here: dispatch, degenerate shapes, packing buffers (gemm.c); the block
 * loops (gemm_driver.h).
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "gemm.h"

#define AVX2 __attribute__((target("avx2,fma")))

#define MR 4
#define NV 3
#define NR (8 * NV)
/* K blocks must match the AVX-512 path's for identical bits; rows and
 * columns are free (they only change which thread computes an element). */
#define GEMM_KC 512
#define GEMM_MC 192
#define GEMM_NC 3072

static inline int imin(int a, int b) {
  return a < b ? a : b;
}
static inline int cdiv(int a, int b) {
  return (a + b - 1) / b;
}

/* ---------------------------------------------------------------- packing */

static const int32_t mask_tab[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

/* Mask of the first n lanes of 8 (n <= 0: none, n >= 8: all). */
AVX2 static inline __m256i lanes(int n) {
  n = n < 0 ? 0 : n > 8 ? 8 : n;
  return _mm256_loadu_si256((const __m256i *)(mask_tab + 8 - n));
}

/* dst[c * ldd + r] = src[r * lds + c] for an 8 x 8 block. */
AVX2 static inline void transpose8x8(const float *src, size_t lds, float *dst, size_t ldd) {
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

/* 4 rows x 8 k of row-major A into 8 consecutive k-slots of a 4-row panel
 * (dst[k * 4 + r] = src[r * lds + k], 32 floats written contiguously). */
AVX2 static inline void transpose4x8(const float *src, size_t lds, float *dst) {
  __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lds);
  __m256 r2 = _mm256_loadu_ps(src + 2 * lds), r3 = _mm256_loadu_ps(src + 3 * lds);
  __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44),
         s1 = _mm256_shuffle_ps(t0, t2, 0xEE); /* k0|k4, k1|k5 */
  __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44),
         s3 = _mm256_shuffle_ps(t1, t3, 0xEE); /* k2|k6, k3|k7 */
  _mm256_storeu_ps(dst, _mm256_permute2f128_ps(s0, s1, 0x20));
  _mm256_storeu_ps(dst + 8, _mm256_permute2f128_ps(s2, s3, 0x20));
  _mm256_storeu_ps(dst + 16, _mm256_permute2f128_ps(s0, s1, 0x31));
  _mm256_storeu_ps(dst + 24, _mm256_permute2f128_ps(s2, s3, 0x31));
}

/* Scalar transpose of an r x c block, for edges. */
static void transpose_edge(const float *src, size_t lds, int r, int c, float *dst, size_t ldd) {
  for (int i = 0; i < r; i++)
    for (int j = 0; j < c; j++) dst[(size_t)j * ldd + i] = src[(size_t)i * lds + j];
}

/* Rows [i0, i0+mc) x depth [k0, k0+kc) of op(A) into MR-row panels: panel p
 * holds op(A)[i0+p+i][k0+k] at [p*kc + k*MR + i]; rows past mc are zero. */
AVX2 static void pack_a(int transA, const float *A, int lda, int i0, int k0, int mc, int kc,
                        float *restrict ap) {
  if (transA) { /* op(A)[i][k] = A[k][i]: two panels (8 stored columns) at a
                 * time, two stored rows per step: [row k | row k+1] halves
                 * are the panels' slots k and k+1, written front to back */
    int p = 0;
    for (; p + 2 * MR <= mc; p += 2 * MR) {
      const float *src = A + (size_t)k0 * lda + i0 + p;
      float *d0 = ap + (size_t)p * kc, *d1 = d0 + (size_t)MR * kc;
      int k = 0;
      for (; k + 2 <= kc; k += 2) {
        __m256 r0 = _mm256_loadu_ps(src + (size_t)k * lda);
        __m256 r1 = _mm256_loadu_ps(src + (size_t)(k + 1) * lda);
        _mm256_storeu_ps(d0 + (size_t)k * MR, _mm256_permute2f128_ps(r0, r1, 0x20));
        _mm256_storeu_ps(d1 + (size_t)k * MR, _mm256_permute2f128_ps(r0, r1, 0x31));
      }
      for (; k < kc; k++) {
        __m256 r0 = _mm256_loadu_ps(src + (size_t)k * lda);
        _mm_storeu_ps(d0 + (size_t)k * MR, _mm256_castps256_ps128(r0));
        _mm_storeu_ps(d1 + (size_t)k * MR, _mm256_extractf128_ps(r0, 1));
      }
    }
    for (; p < mc; p += MR) /* the last one or two panels, zero past mc */
      for (int k = 0; k < kc; k++) {
        const float *src = A + (size_t)(k0 + k) * lda + i0;
        float *dst = ap + (size_t)p * kc + (size_t)k * MR;
        for (int i = 0; i < MR; i++) dst[i] = p + i < mc ? src[p + i] : 0.0f;
      }
    return;
  }
  for (int p = 0; p < mc; p += MR) {
    int mr = imin(MR, mc - p), k = 0;
    float *dst = ap + (size_t)p * kc;
    const float *src = A + (size_t)(i0 + p) * lda + k0;
    if (mr < MR)
      for (int kk = 0; kk < kc; kk++)
        for (int i = mr; i < MR; i++) dst[(size_t)kk * MR + i] = 0.0f;
    if (mr == MR)
      for (; k + 8 <= kc; k += 8) transpose4x8(src + k, (size_t)lda, dst + (size_t)k * MR);
    transpose_edge(src + k, (size_t)lda, mr, kc - k, dst + (size_t)k * MR, MR);
  }
}

/* Rows [k0+ka, k0+kb) of op(B) = B, columns [j0, j0+nc), into the NR-wide
 * panels of a kc-deep block, each stored row read once front to back. */
AVX2 static void pack_b_rows(const float *B, int ldb, int k0, int ka, int kb, int kc, int j0,
                             int nc, float *restrict bp) {
  for (int k = ka; k < kb; k++) {
    const float *src = B + (size_t)(k0 + k) * ldb + j0;
    for (int q = 0; q * NR < nc; q++) {
      float *dst = bp + (size_t)q * kc * NR + (size_t)k * NR;
      const float *s = src + q * NR;
      int left = nc - q * NR;
      if (left >= NR) {
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) _mm256_store_ps(dst + 8 * v, _mm256_loadu_ps(s + 8 * v));
      } else {
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
          _mm256_store_ps(dst + 8 * v, _mm256_maskload_ps(s + 8 * v, lanes(left - 8 * v)));
      }
    }
  }
}

/* Columns [j0, j0+nr) (nr <= NR) x depth [k0, k0+kc) of op(B) = B^T into one
 * panel: op(B)[k0+k][j0+j] at [k*NR + j], zero past nr. */
AVX2 static void pack_bt_panel(const float *B, int ldb, int k0, int kc, int j0, int nr,
                               float *restrict dst) {
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

/* ----------------------------------------------------------- micro-kernel */

/* C[0:mr, 0:nr] = alpha * (a-panel . b-panel) + (first ? beta * C : C), with
 * beta == 0 on the first block never reading C. a: kc x MR, b: kc x NR. */
AVX2 static void ukernel(int kc, const float *restrict a, const float *restrict b,
                         float *restrict c, int ldc, int mr, int nr, float alpha, float beta,
                         int first) {
  __m256 acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) acc[i][v] = _mm256_setzero_ps();
  for (int i = 0; i < mr; i++)
    for (int v = 0; v < NR; v += 16)
      _mm_prefetch((const char *)(c + (size_t)i * ldc + v), _MM_HINT_T0);
#pragma GCC unroll 4
  for (int k = 0; k < kc; k++, a += MR, b += NR) {
    __m256 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) bv[v] = _mm256_load_ps(b + 8 * v);
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
      __m256 ai = _mm256_broadcast_ss(a + i);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[i][v] = _mm256_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
  __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  int skip_c = first && beta == 0.0f, scale_c = first && beta != 1.0f;
  if (nr == NR) { /* a whole tile: plain loads and stores */
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
      if (i >= mr) break;
      float *ci = c + (size_t)i * ldc;
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) {
        __m256 old = _mm256_setzero_ps();
        if (!skip_c) old = _mm256_loadu_ps(ci + 8 * v);
        if (scale_c && !skip_c) old = _mm256_mul_ps(vb, old);
        _mm256_storeu_ps(ci + 8 * v, _mm256_fmadd_ps(va, acc[i][v], old));
      }
    }
    return;
  }
  __m256i m[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; v++) m[v] = lanes(nr - 8 * v);
#pragma GCC unroll 16
  for (int i = 0; i < MR; i++) {
    if (i >= mr) break;
    float *ci = c + (size_t)i * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
      __m256 old = _mm256_setzero_ps();
      if (!skip_c) old = _mm256_maskload_ps(ci + 8 * v, m[v]);
      if (scale_c && !skip_c) old = _mm256_mul_ps(vb, old);
      _mm256_maskstore_ps(ci + 8 * v, m[v], _mm256_fmadd_ps(va, acc[i][v], old));
    }
  }
}

/* ----------------------------------------------------------------- driver */

#define GEMM_ISA AVX2
#define GEMM_ENTRY ct_sgemm_avx2
#define GEMM_ENTRY_W ct_sgemm_avx2_w
#include "gemm_driver.h"

/* ct_sgemm dispatch: our AVX-512 kernel when the CPU has it, OpenBLAS otherwise.
 *
 * The choice is made once per process: __builtin_cpu_supports("avx512f") and the
 * environment variable CT_GEMM ("blas" forces OpenBLAS, for comparisons; any
 * other value or none means "best available"). Degenerate shapes (K == 0 or
 * alpha == 0) are handled here so both paths give C = beta * C with the BLAS
 * rule that beta == 0 writes zeros without reading C.
 * ct_sgemm_deterministic keeps that thread-count independence on the OpenBLAS
 * path too, at some speed: fixed blocks of GEMM_ROWS rows of C, one
 * single-threaded cblas_sgemm each (OpenBLAS's OpenMP build does not thread
 * inside a parallel region). Letting OpenBLAS split the whole product gives
 * results that change with the thread count; fixed blocks do not.
 * Not here: the blocking and the micro-kernel (gemm_avx512.c).
 */
#include "gemm.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

enum { PATH_UNSET = 0, PATH_AVX512 = 1, PATH_BLAS = 2 };

static int path_decide(void) {
  const char *env = getenv("CT_GEMM");
  if (env && !strcmp(env, "blas")) return PATH_BLAS;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") ? PATH_AVX512 : PATH_BLAS;
}

/* Decided on first use; a race only computes the same answer twice. */
static int path_get(void) {
  static int path = PATH_UNSET;
  int p = __atomic_load_n(&path, __ATOMIC_RELAXED);
  if (p == PATH_UNSET) {
    p = path_decide();
    __atomic_store_n(&path, p, __ATOMIC_RELAXED);
  }
  return p;
}

const char *ct_sgemm_path(void) {
  return path_get() == PATH_AVX512 ? "avx512" : "blas";
}

/* C = beta * C; beta == 0 writes zeros (never multiplies a NaN). */
static void scale_c(int M, int N, float beta, float *C, int ldc) {
  for (int i = 0; i < M; i++) {
    float *c = C + (size_t)i * ldc;
    if (beta == 0.0f)
      memset(c, 0, (size_t)N * sizeof(float));
    else if (beta != 1.0f)
      for (int j = 0; j < N; j++) c[j] *= beta;
  }
}

void ct_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || alpha == 0.0f) {
    scale_c(M, N, beta, C, ldc);
    return;
  }
  if (path_get() == PATH_AVX512) {
    ct_sgemm_avx512(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
              M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#define GEMM_ROWS 64

void ct_sgemm_deterministic(int transA, int transB, int M, int N, int K, float alpha,
                            const float *A, int lda, const float *B, int ldb, float beta, float *C,
                            int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || alpha == 0.0f) {
    scale_c(M, N, beta, C, ldc);
    return;
  }
  if (path_get() == PATH_AVX512) { /* thread-count deterministic by construction */
    ct_sgemm_avx512(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const int nb = (M + GEMM_ROWS - 1) / GEMM_ROWS;
#pragma omp parallel for schedule(static) if (nb > 1)
  for (int blk = 0; blk < nb; blk++) {
    int r0 = blk * GEMM_ROWS, rows = M - r0 < GEMM_ROWS ? M - r0 : GEMM_ROWS;
    /* rows [r0, r0 + rows) of op(A): stored rows, or stored columns when transposed */
    const float *a = transA ? A + r0 : A + (size_t)r0 * (size_t)lda;
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
                transB ? CblasTrans : CblasNoTrans, rows, N, K, alpha, a, lda, B, ldb, beta,
                C + (size_t)r0 * (size_t)ldc, ldc);
  }
}

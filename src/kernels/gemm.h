/* Single-precision GEMM used by the kernels (declared in ctuner/kernels.h; this
 * header adds the AVX-512 entry point, private to src/kernels, also read by the
 * benchmarks).
 *
 * ct_sgemm computes C = alpha * op(A) * op(B) + beta * C on row-major matrices,
 * with the argument meaning of cblas_sgemm(CblasRowMajor, ...): op(A) is M x K,
 * op(B) is K x N, C is M x N; transA/transB != 0 mean the stored matrix is the
 * transpose (A stored K x M, B stored N x K). beta == 0 overwrites C without
 * reading it (NaN in C is ignored, as in BLAS).
 *
 * On CPUs with AVX-512F it runs our own blocked kernel (gemm_avx512.c, see
 * docs/gemm.md), whose speed does not depend on OpenBLAS's core-type choice
 * (OPENBLAS_CORETYPE). Its results are bitwise identical for every thread
 * count: threads split only independent blocks of C, and every element sums K
 * in the same fixed order of blocks — OpenBLAS does not guarantee this.
 * Without AVX-512, or with the environment variable CT_GEMM=blas, it calls
 * OpenBLAS's cblas_sgemm instead.
 *
 * Called outside a parallel region it uses omp_get_max_threads() threads;
 * inside one (e.g. per attention tile) it runs on the calling thread only.
 */
#ifndef CT_KERNELS_GEMM_H
#define CT_KERNELS_GEMM_H

#include "ctuner/kernels.h" /* ct_sgemm, ct_sgemm_path */

/* The AVX-512 path itself (gemm_avx512.c). Requires M, N, K >= 1 and an
 * AVX-512F CPU; callers go through ct_sgemm. */
void ct_sgemm_avx512(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc);

#endif

/* The SGEMM kernels behind ct_sgemm (private to the kernels, also read by the
 * benchmarks and tests). ct_sgemm, ct_sgemm_path and ct_sgemm_deterministic
 * are public (include/ctuner/kernels.h); this header adds the kernels
 * themselves.
 *
 * On CPUs with AVX-512F ct_sgemm runs our own blocked kernel (gemm_avx512.c),
 * on CPUs with AVX2 + FMA but no AVX-512 the same design with 256-bit
 * registers (gemm_avx2.c); see docs/gemm.md. Their speed does not depend on
 * OpenBLAS's core-type choice (OPENBLAS_CORETYPE). Their results are bitwise
 * identical for every thread count, and to each other: threads split only
 * independent blocks of C, and every element sums K in the same fixed order of
 * blocks — OpenBLAS does not guarantee this. Without AVX2, or with the
 * environment variable CT_GEMM=blas, it calls OpenBLAS's cblas_sgemm instead.
 * ct_sgemm_bf16 (public) runs gemm_bf16.c, the same driver with the operands
 * rounded to bf16 and vdpbf16ps, on CPUs with AVX512-BF16.
 */
#ifndef CT_KERNELS_GEMM_H
#define CT_KERNELS_GEMM_H

#include "ctuner/kernels.h"

/* The AVX-512 path itself (gemm_avx512.c). Requires M, N, K >= 1 and an
 * AVX-512F CPU; callers go through ct_sgemm. */
void ct_sgemm_avx512(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* The AVX2 + FMA path (gemm_avx2.c), same contract on an AVX2 CPU. */
void ct_sgemm_avx2(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* The AVX512-BF16 path (gemm_bf16.c): operands rounded to bf16, products
 * summed in float32; same contract on a CPU with AVX512-BF16. */
void ct_sgemm_bf16_avx512(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                          int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* The same paths with B a bf16 / int8 weight view (ct_sgemm_w), widened or
 * dequantised tile by tile while B is packed (gemm_driver.h). */
void ct_sgemm_avx512_w(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                       int lda, const ct_wview *B, int ldb, float beta, float *C, int ldc);
void ct_sgemm_avx2_w(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                     int lda, const ct_wview *B, int ldb, float beta, float *C, int ldc);
void ct_sgemm_bf16_avx512_w(int transA, int transB, int M, int N, int K, float alpha,
                            const float *A, int lda, const ct_wview *B, int ldb, float beta,
                            float *C, int ldc);

/* OpenBLAS over dequantised blocks of 64 weight rows (any CPU). */
void ct_sgemm_blas_w(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                     int lda, const ct_wview *B, int ldb, float beta, float *C, int ldc);
/* One of them by name ("avx512", "avx2", "bf16": operands rounded to bf16
 * as ct_sgemm_bf16, "blas"), NULL where the CPU lacks it; same contract as
 * ct_sgemm_path_fn's functions (M, N, K >= 1, alpha != 0, B not float32). */
typedef void (*ct_sgemm_w_fn)(int transA, int transB, int M, int N, int K, float alpha,
                              const float *A, int lda, const ct_wview *B, int ldb, float beta,
                              float *C, int ldc);
ct_sgemm_w_fn ct_sgemm_w_path_fn(const char *name);

/* This thread's packing buffer `which` (0: A block, 1: B block, 2: the
 * dequantised tile of a weight view), at least
 * nfloat floats, 64-byte aligned; kept for the thread's life (aborts with a
 * message when out of memory: kernels have no status return). */
float *ct_gemm_packbuf(int which, size_t nfloat);

#endif

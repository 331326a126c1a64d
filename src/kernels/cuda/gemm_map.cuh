// gemm_map.cuh: the host-and-device helpers of the CUDA matrix products
// (gemm.cu) and attention (attention.cu), kept apart so that the host self-test
// (gemm_selftest.cu, tests/test_cuda_gemm_host.c) runs the very code the device
// runs: the row-major to column-major mapping handed to cuBLASLt, bf16 rounding
// (round to nearest even, NaN stays a quiet NaN: ct_f32_to_bf16's rule) and the
// dequantisation of a weight view (ct_wview_at's arithmetic).
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CU_HD __host__ __device__ __forceinline__

// ---- bf16 ----------------------------------------------------------------
CU_HD uint32_t cu_f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

CU_HD float cu_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

// bf16 bits of f, round to nearest even; NaN -> quiet NaN (ct_f32_to_bf16)
CU_HD uint16_t cu_bf16_bits(float f) {
  uint32_t u = cu_f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

CU_HD float cu_bf16_to_f32(uint16_t h) {
  return cu_bits_f32((uint32_t)h << 16);
}

// f rounded to bf16 and widened back (ct_bf16_round)
CU_HD float cu_bf16_round(float f) {
  return cu_bf16_to_f32(cu_bf16_bits(f));
}

// ---- weight views --------------------------------------------------------
// element i of a view's data (dtype 0 float32, 1 bf16 bits, 2 int8) in row r,
// dequantised as ct_wview_at does: int8 is (float)q * scales[r] in float32.
CU_HD float cu_wview_elem(int dtype, const void *data, const float *scales, size_t i, size_t r) {
  if (dtype == 1) return cu_bf16_to_f32(((const uint16_t *)data)[i]);
  if (dtype == 2) return (float)((const int8_t *)data)[i] * scales[r];
  return ((const float *)data)[i];
}

// ---- row-major C = op(A) op(B) as a column-major product -----------------
// A row-major matrix X (rows x cols, leading dim ld) is, read column-major, the
// cols x rows matrix X^T with the same ld. So row-major C (M x N, ldc) =
// op(A) op(B) is column-major C^T (N x M, ldc) = op(B)^T op(A)^T: the
// column-major product takes B as its first operand and A as its second, with
// the same transpose flags (B stored K x N is, column-major, N x K = op(B)^T
// untransposed; B stored N x K (transB) is column-major K x N, to transpose).
struct cu_mm_map {
  int op_a, op_b;           // column-major transposes (1 = CUBLAS_OP_T) of the first/second operand
  int m, n, k;              // column-major product: (m x k) (k x n) = m x n
  int first_is_b;           // 1: the first operand is the caller's B (always, by the mapping)
  int a_rows, a_cols, lda;  // the first operand as stored, column-major
  int b_rows, b_cols, ldb;  // the second operand as stored, column-major
  int c_rows, c_cols, ldc;  // the output, column-major
};

CU_HD cu_mm_map cu_rowmajor_map(int transA, int transB, int M, int N, int K, int lda, int ldb,
                                int ldc) {
  cu_mm_map p;
  p.first_is_b = 1;
  p.op_a = transB ? 1 : 0;
  p.op_b = transA ? 1 : 0;
  p.m = N;
  p.n = M;
  p.k = K;
  // first operand = caller's B: op = N means stored m x k column-major, T means k x m
  p.a_rows = p.op_a ? K : N;
  p.a_cols = p.op_a ? N : K;
  p.lda = ldb;
  // second operand = caller's A: op = N means stored k x n, T means n x k
  p.b_rows = p.op_b ? M : K;
  p.b_cols = p.op_b ? K : M;
  p.ldb = lda;
  p.c_rows = N;
  p.c_cols = M;
  p.ldc = ldc;
  return p;
}

// the stored shape of a row-major operand (rows x cols) of the caller's call:
// A is M x K (K x M when transA), B is K x N (N x K when transB)
CU_HD void cu_stored_a(int transA, int M, int K, int *rows, int *cols) {
  *rows = transA ? K : M;
  *cols = transA ? M : K;
}
CU_HD void cu_stored_b(int transB, int N, int K, int *rows, int *cols) {
  *rows = transB ? N : K;
  *cols = transB ? K : N;
}

// byte alignment of a pointer as cuBLASLt's MIN_ALIGNMENT preferences count it (at most 16; a
// leading dimension that breaks it lowers it too: row r starts at p + r * ld * elem)
CU_HD unsigned cu_align_of(const void *p, size_t ld_bytes) {
  size_t a = (size_t)p | ld_bytes | 16u;
  return (unsigned)(a & (~a + 1));  // lowest set bit
}

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

// ---- convolutions (conv.cu): im2col and its adjoint, one element at a time ----
// the conv2d shape as plain ints (ct_conv2d_shape's fields, kernels.h)
struct cu_conv {
  int B, Cin, H, W, Cout, k, stride, pad_t, pad_l, pad_b, pad_r, Ho, Wo;
};

// element (ckk, p) of one image's column matrix (Cin*k*k, rows*Wo) for the band of output rows
// from r0 (conv.c's im2col): x at (c, i, j) or 0 in the padding
CU_HD float cu_im2col_at(const cu_conv &s, const float *x, int r0, int ckk, int p) {
  const int k = s.k, c = ckk / (k * k), ki = (ckk / k) % k, kj = ckk % k;
  const int r = p / s.Wo, q = p - r * s.Wo;
  const int i = (r0 + r) * s.stride - s.pad_t + ki, j = q * s.stride - s.pad_l + kj;
  if (i < 0 || i >= s.H || j < 0 || j >= s.W) return 0.0f;
  return x[((size_t)c * s.H + i) * s.W + j];
}

// what the band's column gradient dcol (Cin*k*k, rows*Wo) adds to dx at (c, i, j): conv.c's
// col2im_acc as a gather over the k*k taps in order (no two threads write one element)
CU_HD float cu_col2im_at(const cu_conv &s, const float *dcol, int r0, int rows, int c, int i,
                         int j) {
  const int k = s.k, n = rows * s.Wo;
  float acc = 0.0f;
  for (int kk = 0; kk < k * k; kk++) {
    const int ki = kk / k, kj = kk % k;
    const int ti = i + s.pad_t - ki, tj = j + s.pad_l - kj;  // (r0 + r) * stride, q * stride
    if (ti < 0 || tj < 0 || ti % s.stride || tj % s.stride) continue;
    const int r = ti / s.stride - r0, q = tj / s.stride;
    if (r < 0 || r >= rows || q >= s.Wo) continue;
    acc += dcol[((size_t)c * k * k + kk) * n + (size_t)r * s.Wo + q];
  }
  return acc;
}

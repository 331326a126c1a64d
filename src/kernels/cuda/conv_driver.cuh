// conv_driver.cuh: the 2-D convolution's loop (conv.c's, band by band of output
// rows, through im2col and the matrix product) over an Ops policy, so that the
// device (conv.cu: kernels and cuBLASLt) and the host self-test
// (gemm_selftest.cu: the same element helpers and ct_sgemm) run one driver.
// Ops: bias_planes(B, Cout, HWo, b, y); im2col(s, xb, r0, rows, col);
// col2im_acc(s, dcol, r0, rows, dxb); zero(p, n); db_acc(B, Cout, HWo, dy, db);
// mm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc).
#pragma once

#include "gemm_map.cuh"

extern "C" {
#include "ctuner/kernels.h"
}

inline cu_conv cu_conv_of(const ct_conv2d_shape *s) {
  cu_conv c = {s->B,     s->Cin,   s->H,     s->W,     s->Cout, s->k, s->stride,
               s->pad_t, s->pad_l, s->pad_b, s->pad_r, 0,       0};
  c.Ho = ct_conv2d_out(s->H, s->k, s->stride, s->pad_t, s->pad_b);
  c.Wo = ct_conv2d_out(s->W, s->k, s->stride, s->pad_l, s->pad_r);
  return c;
}

inline bool cu_conv_pointwise(const cu_conv &s) {
  return s.k == 1 && s.stride == 1 && !s.pad_t && !s.pad_l && !s.pad_b && !s.pad_r;
}

template <class Ops>
void cu_conv_fwd_drive(Ops &ops, const ct_conv2d_shape *sh, const float *x, const float *w,
                       const float *b, float *y, float *col) {
  const cu_conv s = cu_conv_of(sh);
  const int KK = s.Cin * s.k * s.k, HWo = s.Ho * s.Wo;
  if (s.B <= 0 || s.Ho <= 0 || s.Wo <= 0 || s.Cout <= 0) return;
  const int band = ct_conv2d_band_rows(sh);
  if (b) ops.bias_planes(s.B, s.Cout, HWo, b, y);
  for (int bi = 0; bi < s.B; bi++) {
    const float *xb = x + (size_t)bi * s.Cin * s.H * s.W;
    float *yb = y + (size_t)bi * s.Cout * HWo;
    if (cu_conv_pointwise(s)) {  // 1x1: x is its own column matrix
      ops.mm(0, 0, s.Cout, HWo, KK, 1.0f, w, KK, xb, HWo, b ? 1.0f : 0.0f, yb, HWo);
      continue;
    }
    for (int r0 = 0; r0 < s.Ho; r0 += band) {
      const int rows = s.Ho - r0 < band ? s.Ho - r0 : band;
      ops.im2col(s, xb, r0, rows, col);
      ops.mm(0, 0, s.Cout, rows * s.Wo, KK, 1.0f, w, KK, col, rows * s.Wo, b ? 1.0f : 0.0f,
             yb + (size_t)r0 * s.Wo, HWo);
    }
  }
}

// dx overwritten (NULL: skipped), dw and db "+=" (NULL: skipped)
template <class Ops>
void cu_conv_bwd_drive(Ops &ops, const ct_conv2d_shape *sh, const float *x, const float *w,
                       const float *dy, float *dx, float *dw, float *db, float *col) {
  const cu_conv s = cu_conv_of(sh);
  const int KK = s.Cin * s.k * s.k, HWo = s.Ho * s.Wo;
  if (s.B <= 0 || s.Ho <= 0 || s.Wo <= 0 || s.Cout <= 0) return;
  const int band = ct_conv2d_band_rows(sh);
  const size_t xplane = (size_t)s.Cin * s.H * s.W;
  if (dx) ops.zero(dx, (size_t)s.B * xplane);
  if (db) ops.db_acc(s.B, s.Cout, HWo, dy, db);
  for (int bi = 0; bi < s.B; bi++) {
    const float *xb = x + (size_t)bi * xplane;
    const float *dyb = dy + (size_t)bi * s.Cout * HWo;
    float *dxb = dx ? dx + (size_t)bi * xplane : NULL;
    if (cu_conv_pointwise(s)) {
      if (dw) ops.mm(0, 1, s.Cout, KK, HWo, 1.0f, dyb, HWo, xb, HWo, 1.0f, dw, KK);
      if (dxb) ops.mm(1, 0, KK, HWo, s.Cout, 1.0f, w, KK, dyb, HWo, 0.0f, dxb, HWo);
      continue;
    }
    for (int r0 = 0; r0 < s.Ho; r0 += band) {
      const int rows = s.Ho - r0 < band ? s.Ho - r0 : band, n = rows * s.Wo;
      if (dw) {
        ops.im2col(s, xb, r0, rows, col);
        ops.mm(0, 1, s.Cout, KK, n, 1.0f, dyb + (size_t)r0 * s.Wo, HWo, col, n, 1.0f, dw, KK);
      }
      if (dxb) {
        ops.mm(1, 0, KK, n, s.Cout, 1.0f, w, KK, dyb + (size_t)r0 * s.Wo, HWo, 0.0f, col, n);
        ops.col2im_acc(s, col, r0, rows, dxb);
      }
    }
  }
}

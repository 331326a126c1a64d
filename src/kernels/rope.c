/* Rotary position embedding: the angle table, rotation of row-major
 * activations, and the fused query/key preparation (RMSNorm + RoPE + transpose
 * into heads) that feeds attention.
 *
 * Design: the table holds (cos, sin) per position and pair, with angles computed
 * in double and rounded to float, as the PyTorch peer does. Rotations are a
 * per-row loop over pairs (rows in parallel). ct_qkv_heads_* read a Linear's
 * (rows, 3*H*hd) output once and write q, k, v in (B, H, Lt, hd); the backward
 * writes dqkv in one pass over rows, and sums the norm-scale gradients in a
 * second phase where each task owns (q or k, a block of columns) and visits the
 * rows in a fixed order, so the sums do not depend on the thread count.
 * QK-norm eps is the model's fixed 1e-6.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "ctuner/kernels.h"
#include "fastmath.h"

#define QK_EPS 1e-6f
#define QK_COLBLK 16 /* columns (even: whole pairs) per task in the scale gradients */

void ct_rope_table(int L, const int *pos, const int axes[3], float theta, float *pe) {
  int half = (axes[0] + axes[1] + axes[2]) / 2;
  for (int l = 0; l < L; l++) {
    float *row = pe + (size_t)l * half * 2;
    int p = 0;
    for (int i = 0; i < 3; i++) {
      for (int j = 0; j < axes[i] / 2; j++, p++) {
        double omega = 1.0 / pow((double)theta, (double)(2 * j) / (double)axes[i]);
        double a = (double)pos[l * 3 + i] * omega;
        row[2 * p] = (float)cos(a);
        row[2 * p + 1] = (float)sin(a);
      }
    }
  }
}

/* y = R x for one row of D elements (D/2 pairs); y == x allowed */
static inline void rot_row(int D, const float *pe, const float *x, float *y) {
  for (int j = 0; j < D / 2; j++) {
    float c = pe[2 * j], s = pe[2 * j + 1];
    float x0 = x[2 * j], x1 = x[2 * j + 1];
    y[2 * j] = c * x0 - s * x1;
    y[2 * j + 1] = s * x0 + c * x1;
  }
}

/* y = R^T x */
static inline void rot_row_t(int D, const float *pe, const float *x, float *y) {
  for (int j = 0; j < D / 2; j++) {
    float c = pe[2 * j], s = pe[2 * j + 1];
    float x0 = x[2 * j], x1 = x[2 * j + 1];
    y[2 * j] = c * x0 + s * x1;
    y[2 * j + 1] = c * x1 - s * x0;
  }
}

void ct_rope_fwd(int N, int L, int D, const float *pe, const float *x, int ldx, float *y, int ldy) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > 16384)
  for (int r = 0; r < N; r++)
    rot_row(D, pe + (size_t)(r % L) * D, x + (size_t)r * ldx, y + (size_t)r * ldy);
}

void ct_rope_bwd(int N, int L, int D, const float *pe, const float *dy, int lddy, float *dx,
                 int lddx) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > 16384)
  for (int r = 0; r < N; r++)
    rot_row_t(D, pe + (size_t)(r % L) * D, dy + (size_t)r * lddy, dx + (size_t)r * lddx);
}

/* out = R (x * r * s), returns r = rstd of x */
static inline float norm_rope(int hd, const float *x, const float *s, const float *pe, float *out) {
  float ss;
  CT_SUM_LANES(float, ss, hd, j, x[j] * x[j]);
  float r = 1.0f / sqrtf(ss / (float)hd + QK_EPS);
  for (int j = 0; j < hd / 2; j++) {
    float c = pe[2 * j], sn = pe[2 * j + 1];
    float x0 = x[2 * j] * r * s[2 * j], x1 = x[2 * j + 1] * r * s[2 * j + 1];
    out[2 * j] = c * x0 - sn * x1;
    out[2 * j + 1] = sn * x0 + c * x1;
  }
  return r;
}

void ct_qkv_heads_fwd(int B, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                      const float *qscale, const float *kscale, const float *pe, float *q, float *k,
                      float *v, float *rstd_q, float *rstd_k) {
  int N = B * Ls, D3 = 3 * H * hd;
#pragma omp parallel for schedule(static) if ((size_t)N * D3 > 16384)
  for (int rr = 0; rr < N; rr++) {
    int b = rr / Ls, p = off + rr % Ls;
    const float *row = qkv + (size_t)rr * D3;
    const float *pel = pe + (size_t)p * hd;
    for (int h = 0; h < H; h++) {
      size_t o = (((size_t)b * H + h) * Lt + p) * hd;
      rstd_q[(size_t)rr * H + h] = norm_rope(hd, row + (size_t)h * hd, qscale, pel, q + o);
      rstd_k[(size_t)rr * H + h] = norm_rope(hd, row + (size_t)(H + h) * hd, kscale, pel, k + o);
      memcpy(v + o, row + (size_t)(2 * H + h) * hd, (size_t)hd * sizeof(float));
    }
  }
}

/* dx = RMSNorm backward of g = R^T dout (overwrite) */
static inline void norm_rope_bwd(int hd, const float *x, const float *s, const float *pe, float r,
                                 const float *dout, float *dx) {
  float dot;
  CT_SUM_LANES(float, dot, hd / 2, j,
               (pe[2 * j] * dout[2 * j] + pe[2 * j + 1] * dout[2 * j + 1]) * s[2 * j] * x[2 * j] +
                   (pe[2 * j] * dout[2 * j + 1] - pe[2 * j + 1] * dout[2 * j]) * s[2 * j + 1] *
                       x[2 * j + 1]);
  float cc = r * r * r * dot / (float)hd;
  for (int j = 0; j < hd / 2; j++) {
    float c = pe[2 * j], sn = pe[2 * j + 1];
    float g0 = c * dout[2 * j] + sn * dout[2 * j + 1];
    float g1 = c * dout[2 * j + 1] - sn * dout[2 * j];
    dx[2 * j] = r * s[2 * j] * g0 - x[2 * j] * cc;
    dx[2 * j + 1] = r * s[2 * j + 1] * g1 - x[2 * j + 1] * cc;
  }
}

void ct_qkv_heads_bwd(int B, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                      const float *qscale, const float *kscale, const float *pe,
                      const float *rstd_q, const float *rstd_k, const float *dq, const float *dk,
                      const float *dv, float *dqkv, float *dqscale, float *dkscale) {
  int N = B * Ls, D3 = 3 * H * hd;
  int nblk = (hd + QK_COLBLK - 1) / QK_COLBLK;
#pragma omp parallel if ((size_t)N * D3 > 16384)
  {
#pragma omp for schedule(static)
    for (int rr = 0; rr < N; rr++) {
      int b = rr / Ls, p = off + rr % Ls;
      const float *row = qkv + (size_t)rr * D3;
      float *drow = dqkv + (size_t)rr * D3;
      const float *pel = pe + (size_t)p * hd;
      for (int h = 0; h < H; h++) {
        size_t o = (((size_t)b * H + h) * Lt + p) * hd;
        norm_rope_bwd(hd, row + (size_t)h * hd, qscale, pel, rstd_q[(size_t)rr * H + h], dq + o,
                      drow + (size_t)h * hd);
        norm_rope_bwd(hd, row + (size_t)(H + h) * hd, kscale, pel, rstd_k[(size_t)rr * H + h],
                      dk + o, drow + (size_t)(H + h) * hd);
        memcpy(drow + (size_t)(2 * H + h) * hd, dv + o, (size_t)hd * sizeof(float));
      }
    }
    /* dscale_j = sum over rows (b, l, h) in order of g_j x_j r */
#pragma omp for schedule(static)
    for (int t = 0; t < 2 * nblk; t++) {
      int which = t / nblk; /* 0: q, 1: k */
      float *dsc = which ? dkscale : dqscale;
      if (!dsc) continue;
      const float *dsrc = which ? dk : dq;
      const float *rstd = which ? rstd_k : rstd_q;
      int c0 = (t % nblk) * QK_COLBLK, nc = hd - c0 < QK_COLBLK ? hd - c0 : QK_COLBLK;
      float a[QK_COLBLK] = {0};
      for (int rr = 0; rr < N; rr++) {
        int b = rr / Ls, p = off + rr % Ls;
        const float *pel = pe + (size_t)p * hd + c0;
        for (int h = 0; h < H; h++) {
          const float *x = qkv + (size_t)rr * D3 + (size_t)(which * H + h) * hd + c0;
          const float *d = dsrc + (((size_t)b * H + h) * Lt + p) * hd + c0;
          float r = rstd[(size_t)rr * H + h];
          for (int j = 0; j < nc / 2; j++) {
            float c = pel[2 * j], sn = pel[2 * j + 1];
            float g0 = c * d[2 * j] + sn * d[2 * j + 1];
            float g1 = c * d[2 * j + 1] - sn * d[2 * j];
            a[2 * j] += g0 * x[2 * j] * r;
            a[2 * j + 1] += g1 * x[2 * j + 1] * r;
          }
        }
      }
      for (int j = 0; j < nc; j++) dsc[c0 + j] += a[j];
    }
  }
}

/* Normalisations: LayerNorm with adaLN modulation (ln_mod), affine LayerNorm
 * (text encoder, forward only) and RMSNorm with a learned scale.
 *
 * Design: one task per row for everything that is a per-row computation
 * (`omp for` over rows, inner loops over contiguous columns written to
 * auto-vectorise; row sums go through fastmath.h's CT_SUM_LANES, 16 partial
 * sums whatever the SIMD width, so the bits do not depend on the machine). Parameter gradients are
 * sums over rows; they are computed in a second phase of the same parallel region where each task
 * owns a block of columns (and, for ln_mod, one batch item) and sums its rows in order, so the
 * result does not depend on the thread count and needs no scratch memory.
 * Variance is the biased one (as torch.nn.functional.layer_norm).
 */
#include <math.h>
#include <stddef.h>

#include "ctuner/kernels.h"
#include "fastmath.h"

#define COLBLK 64 /* columns per task in the parameter-gradient reductions */

static inline int min_int(int a, int b) {
  return a < b ? a : b;
}

/* mean and rstd of one row (two passes: mean, then centred sum of squares) */
static inline float row_moments(int D, const float *x, float eps, float *rstd) {
  float s, v;
  CT_SUM_LANES(float, s, D, j, x[j]);
  const float mean = s / (float)D;
  CT_SUM_LANES(float, v, D, j, (x[j] - mean) * (x[j] - mean));
  *rstd = 1.0f / sqrtf(v / (float)D + eps);
  return mean;
}

void ct_ln_mod_fwd(int B, int L, int D, const float *x, int ldx, const float *shift,
                   const float *scale, int ldm, float eps, float *xhat, float *rstd, float *h,
                   int ldh) {
  int N = B * L;
#pragma omp parallel for schedule(static) if ((size_t)N * D > 16384)
  for (int r = 0; r < N; r++) {
    const float *xr = x + (size_t)r * ldx;
    float *xh = xhat + (size_t)r * D;
    float *hr = h + (size_t)r * ldh;
    size_t bo = (size_t)(r / L) * ldm;
    float rs;
    float mean = row_moments(D, xr, eps, &rs);
    rstd[r] = rs;
    if (shift && scale) {
      const float *sh = shift + bo, *sc = scale + bo;
      for (int j = 0; j < D; j++) {
        float v = (xr[j] - mean) * rs;
        xh[j] = v;
        hr[j] = (1.0f + sc[j]) * v + sh[j];
      }
    } else {
      for (int j = 0; j < D; j++) xh[j] = (xr[j] - mean) * rs;
      for (int j = 0; j < D; j++) {
        float a = scale ? 1.0f + scale[bo + j] : 1.0f;
        float c = shift ? shift[bo + j] : 0.0f;
        hr[j] = a * xh[j] + c;
      }
    }
  }
}

void ct_ln_mod_bwd(int B, int L, int D, const float *xhat, const float *rstd, const float *scale,
                   int ldm, const float *dh, int lddh, float *dx, int lddx, float *dshift,
                   float *dscale) {
  int N = B * L;
  int nblk = (D + COLBLK - 1) / COLBLK;
#pragma omp parallel if ((size_t)N * D > 16384)
  {
    if (dx) {
#pragma omp for schedule(static)
      for (int r = 0; r < N; r++) {
        const float *xh = xhat + (size_t)r * D;
        const float *g = dh + (size_t)r * lddh;
        const float *sc = scale ? scale + (size_t)(r / L) * ldm : NULL;
        float *dxr = dx + (size_t)r * lddx;
        float s1, s2;
        if (sc) {
          CT_SUM_LANES(float, s1, D, j, g[j] * (1.0f + sc[j]));
          CT_SUM_LANES(float, s2, D, j, g[j] * (1.0f + sc[j]) * xh[j]);
        } else {
          CT_SUM_LANES(float, s1, D, j, g[j]);
          CT_SUM_LANES(float, s2, D, j, g[j] * xh[j]);
        }
        float m1 = s1 / (float)D, m2 = s2 / (float)D, rs = rstd[r];
        if (sc) {
          for (int j = 0; j < D; j++) dxr[j] += rs * (g[j] * (1.0f + sc[j]) - m1 - xh[j] * m2);
        } else {
          for (int j = 0; j < D; j++) dxr[j] += rs * (g[j] - m1 - xh[j] * m2);
        }
      }
    }
    if (dshift || dscale) {
      /* one task per (batch item, column block); rows summed in order */
#pragma omp for schedule(static)
      for (int t = 0; t < B * nblk; t++) {
        int b = t / nblk, c0 = (t % nblk) * COLBLK, nc = min_int(COLBLK, D - c0);
        float a1[COLBLK] = {0}, a2[COLBLK] = {0};
        for (int l = 0; l < L; l++) {
          size_t r = (size_t)b * L + l;
          const float *g = dh + r * lddh + c0;
          const float *xh = xhat + r * D + c0;
          for (int j = 0; j < nc; j++) {
            a1[j] += g[j];
            a2[j] += g[j] * xh[j];
          }
        }
        if (dshift)
          for (int j = 0; j < nc; j++) dshift[(size_t)b * ldm + c0 + j] += a1[j];
        if (dscale)
          for (int j = 0; j < nc; j++) dscale[(size_t)b * ldm + c0 + j] += a2[j];
      }
    }
  }
}

void ct_layernorm_affine_fwd(int N, int D, const float *x, int ldx, const float *gamma,
                             const float *beta, float eps, float *y, int ldy) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > 16384)
  for (int r = 0; r < N; r++) {
    const float *xr = x + (size_t)r * ldx;
    float *yr = y + (size_t)r * ldy;
    float rs;
    float mean = row_moments(D, xr, eps, &rs);
    for (int j = 0; j < D; j++) {
      float v = (xr[j] - mean) * rs;
      v = gamma ? v * gamma[j] : v;
      yr[j] = beta ? v + beta[j] : v;
    }
  }
}

void ct_rmsnorm_fwd(int N, int D, const float *x, int ldx, const float *scale, float eps, float *y,
                    int ldy, float *rstd) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > 16384)
  for (int r = 0; r < N; r++) {
    const float *xr = x + (size_t)r * ldx;
    float *yr = y + (size_t)r * ldy;
    float ss;
    CT_SUM_LANES(float, ss, D, j, xr[j] * xr[j]);
    float rs = 1.0f / sqrtf(ss / (float)D + eps);
    rstd[r] = rs;
    for (int j = 0; j < D; j++) yr[j] = xr[j] * rs * scale[j];
  }
}

/* y_j = x_j r s_j, r = (mean(x^2) + eps)^-1/2:
 * dx_j = r s_j dy_j - x_j r^3 / D * sum_k dy_k s_k x_k;  dscale_j = sum_rows dy_j x_j r. */
void ct_rmsnorm_bwd(int N, int D, const float *x, int ldx, const float *scale, const float *rstd,
                    const float *dy, int lddy, float *dx, int lddx, float *dscale) {
  int nblk = (D + COLBLK - 1) / COLBLK;
#pragma omp parallel if ((size_t)N * D > 16384)
  {
    if (dx) {
#pragma omp for schedule(static)
      for (int r = 0; r < N; r++) {
        const float *xr = x + (size_t)r * ldx;
        const float *g = dy + (size_t)r * lddy;
        float *dxr = dx + (size_t)r * lddx;
        float s;
        CT_SUM_LANES(float, s, D, j, g[j] * scale[j] * xr[j]);
        float rs = rstd[r], c = rs * rs * rs * s / (float)D;
        for (int j = 0; j < D; j++) dxr[j] += rs * scale[j] * g[j] - xr[j] * c;
      }
    }
    if (dscale) {
#pragma omp for schedule(static)
      for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * COLBLK, nc = min_int(COLBLK, D - c0);
        float a[COLBLK] = {0};
        for (int r = 0; r < N; r++) {
          const float *xr = x + (size_t)r * ldx + c0;
          const float *g = dy + (size_t)r * lddy + c0;
          float rs = rstd[r];
          for (int j = 0; j < nc; j++) a[j] += g[j] * xr[j] * rs;
        }
        for (int j = 0; j < nc; j++) dscale[c0 + j] += a[j];
      }
    }
  }
}

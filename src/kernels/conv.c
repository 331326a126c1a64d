/* conv.c: the VAE's image kernels on NCHW float32 tensors — 2-D convolution
 * (im2col + ct_sgemm, in bands of output rows so the column buffer stays
 * bounded), GroupNorm, nearest ×2 upsampling, the NCHW <-> (B, HW, C)
 * transposes that put spatial attention on the existing attention kernels,
 * and the linear blend of overlapping tiles (tiled encode/decode).
 *
 * Determinism: every sum runs in a fixed order whatever the thread count —
 * GEMMs through ct_sgemm (see gemm.h), weight and bias gradients accumulated
 * band by band and image by image in order, GroupNorm statistics in double
 * per (image, group), its parameter gradients per channel over images in
 * order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/kernels.h"
#include "gemm.h"

int ct_conv2d_out(int in, int k, int stride, int pad_lo, int pad_hi) {
  const int span = in + pad_lo + pad_hi - k;
  return span < 0 ? 0 : span / stride + 1;
}

/* Output rows per band: the column buffer of a band holds at most
 * CT_CONV_COL_FLOATS floats (and at least one row). */
/* CTUNER_CONV_COL_FLOATS overrides the band size (tests force several bands on small images). */
static size_t col_limit(void) {
  const char *e = getenv("CTUNER_CONV_COL_FLOATS");
  const long long v = e ? atoll(e) : 0;
  return v > 0 ? (size_t)v : CT_CONV_COL_FLOATS;
}

int ct_conv2d_band_rows(const ct_conv2d_shape *s) {
  const int Ho = ct_conv2d_out(s->H, s->k, s->stride, s->pad_t, s->pad_b);
  const int Wo = ct_conv2d_out(s->W, s->k, s->stride, s->pad_l, s->pad_r);
  const size_t per_row = (size_t)s->Cin * (size_t)s->k * (size_t)s->k * (size_t)(Wo > 0 ? Wo : 1);
  size_t rows = col_limit() / (per_row ? per_row : 1);
  if (rows < 1) rows = 1;
  if (rows > (size_t)(Ho > 0 ? Ho : 1)) rows = (size_t)(Ho > 0 ? Ho : 1);
  return (int)rows;
}

size_t ct_conv2d_col_floats(const ct_conv2d_shape *s) {
  const int Wo = ct_conv2d_out(s->W, s->k, s->stride, s->pad_l, s->pad_r);
  return (size_t)s->Cin * (size_t)s->k * (size_t)s->k * (size_t)ct_conv2d_band_rows(s) *
         (size_t)(Wo > 0 ? Wo : 1);
}

/* col (Cin*k*k, rows*Wo) for output rows [r0, r0 + rows) of one image. */
static void im2col(const ct_conv2d_shape *s, const float *x, int r0, int rows, int Wo, float *col) {
  const int k = s->k, H = s->H, W = s->W, st = s->stride;
  const int n = rows * Wo;
#pragma omp parallel for schedule(static) if ((size_t)s->Cin * k * k * n > 32768)
  for (int ckk = 0; ckk < s->Cin * k * k; ckk++) {
    const int c = ckk / (k * k), ki = (ckk / k) % k, kj = ckk % k;
    const float *xc = x + (size_t)c * H * W;
    float *out = col + (size_t)ckk * n;
    for (int r = 0; r < rows; r++) {
      const int i = (r0 + r) * st - s->pad_t + ki;
      float *o = out + (size_t)r * Wo;
      if (i < 0 || i >= H) {
        memset(o, 0, (size_t)Wo * sizeof(float));
        continue;
      }
      const float *xr = xc + (size_t)i * W;
      for (int q = 0; q < Wo; q++) {
        const int j = q * st - s->pad_l + kj;
        o[q] = j >= 0 && j < W ? xr[j] : 0.0f;
      }
    }
  }
}

/* dx += col2im(dcol): parallel over input channels (each owns its plane). */
static void col2im_acc(const ct_conv2d_shape *s, const float *dcol, int r0, int rows, int Wo,
                       float *dx) {
  const int k = s->k, H = s->H, W = s->W, st = s->stride;
  const int n = rows * Wo;
#pragma omp parallel for schedule(static) if ((size_t)s->Cin * k * k * n > 32768)
  for (int c = 0; c < s->Cin; c++) {
    float *dxc = dx + (size_t)c * H * W;
    for (int kk = 0; kk < k * k; kk++) { /* fixed order: the same sums for any thread count */
      const int ki = kk / k, kj = kk % k;
      const float *in = dcol + ((size_t)c * k * k + kk) * n;
      for (int r = 0; r < rows; r++) {
        const int i = (r0 + r) * st - s->pad_t + ki;
        if (i < 0 || i >= H) continue;
        float *dr = dxc + (size_t)i * W;
        const float *g = in + (size_t)r * Wo;
        for (int q = 0; q < Wo; q++) {
          const int j = q * st - s->pad_l + kj;
          if (j >= 0 && j < W) dr[j] += g[q];
        }
      }
    }
  }
}

static int is_pointwise(const ct_conv2d_shape *s) {
  return s->k == 1 && s->stride == 1 && !s->pad_t && !s->pad_l && !s->pad_b && !s->pad_r;
}

/* The forward and backward with the matrix products of mm: ct_sgemm, or
 * ct_sgemm_bf16 for the bf16 compute of --mixed_precision bf16. */
static void conv_fwd(ct_sgemm_fn mm, const ct_conv2d_shape *s, const float *x, const float *w,
                     const float *b, float *y, float *col) {
  const int Ho = ct_conv2d_out(s->H, s->k, s->stride, s->pad_t, s->pad_b);
  const int Wo = ct_conv2d_out(s->W, s->k, s->stride, s->pad_l, s->pad_r);
  const int KK = s->Cin * s->k * s->k, HWo = Ho * Wo;
  if (Ho <= 0 || Wo <= 0 || s->Cout <= 0) return;
  const int band = ct_conv2d_band_rows(s);
  for (int bi = 0; bi < s->B; bi++) {
    const float *xb = x + (size_t)bi * s->Cin * s->H * s->W;
    float *yb = y + (size_t)bi * s->Cout * HWo;
    if (b) {
#pragma omp parallel for schedule(static) if ((size_t)s->Cout * HWo > 32768)
      for (int o = 0; o < s->Cout; o++)
        for (int p = 0; p < HWo; p++) yb[(size_t)o * HWo + p] = b[o];
    }
    if (is_pointwise(s)) { /* 1x1: x is its own column matrix */
      mm(0, 0, s->Cout, HWo, KK, 1.0f, w, KK, xb, HWo, b ? 1.0f : 0.0f, yb, HWo);
      continue;
    }
    for (int r0 = 0; r0 < Ho; r0 += band) {
      const int rows = Ho - r0 < band ? Ho - r0 : band;
      im2col(s, xb, r0, rows, Wo, col);
      mm(0, 0, s->Cout, rows * Wo, KK, 1.0f, w, KK, col, rows * Wo, b ? 1.0f : 0.0f,
         yb + (size_t)r0 * Wo, HWo);
    }
  }
}

static void conv_bwd(ct_sgemm_fn mm, const ct_conv2d_shape *s, const float *x, const float *w,
                     const float *dy, float *dx, float *dw, float *db, float *col) {
  const int Ho = ct_conv2d_out(s->H, s->k, s->stride, s->pad_t, s->pad_b);
  const int Wo = ct_conv2d_out(s->W, s->k, s->stride, s->pad_l, s->pad_r);
  const int KK = s->Cin * s->k * s->k, HWo = Ho * Wo;
  if (Ho <= 0 || Wo <= 0 || s->Cout <= 0) return;
  const int band = ct_conv2d_band_rows(s);
  const size_t xplane = (size_t)s->Cin * s->H * s->W;
  if (dx) memset(dx, 0, (size_t)s->B * xplane * sizeof(float));
  for (int bi = 0; bi < s->B; bi++) {
    const float *xb = x + (size_t)bi * xplane;
    const float *dyb = dy + (size_t)bi * s->Cout * HWo;
    float *dxb = dx ? dx + (size_t)bi * xplane : NULL;
    if (db) { /* per channel, in double, images in order */
#pragma omp parallel for schedule(static) if ((size_t)s->Cout * HWo > 32768)
      for (int o = 0; o < s->Cout; o++) {
        double acc = 0;
        const float *g = dyb + (size_t)o * HWo;
        for (int p = 0; p < HWo; p++) acc += (double)g[p];
        db[o] = (float)((double)db[o] + acc);
      }
    }
    if (is_pointwise(s)) {
      if (dw) mm(0, 1, s->Cout, KK, HWo, 1.0f, dyb, HWo, xb, HWo, 1.0f, dw, KK);
      if (dxb) mm(1, 0, KK, HWo, s->Cout, 1.0f, w, KK, dyb, HWo, 0.0f, dxb, HWo);
      continue;
    }
    for (int r0 = 0; r0 < Ho; r0 += band) {
      const int rows = Ho - r0 < band ? Ho - r0 : band, n = rows * Wo;
      if (dw) {
        im2col(s, xb, r0, rows, Wo, col);
        mm(0, 1, s->Cout, KK, n, 1.0f, dyb + (size_t)r0 * Wo, HWo, col, n, 1.0f, dw, KK);
      }
      if (dxb) {
        mm(1, 0, KK, n, s->Cout, 1.0f, w, KK, dyb + (size_t)r0 * Wo, HWo, 0.0f, col, n);
        col2im_acc(s, col, r0, rows, Wo, dxb);
      }
    }
  }
}

void ct_conv2d_fwd(const ct_conv2d_shape *s, const float *x, const float *w, const float *b,
                   float *y, float *col) {
  conv_fwd(ct_sgemm, s, x, w, b, y, col);
}

void ct_conv2d_bwd(const ct_conv2d_shape *s, const float *x, const float *w, const float *dy,
                   float *dx, float *dw, float *db, float *col) {
  conv_bwd(ct_sgemm, s, x, w, dy, dx, dw, db, col);
}

void ct_conv2d_fwd_bf16(const ct_conv2d_shape *s, const float *x, const float *w, const float *b,
                        float *y, float *col) {
  conv_fwd(ct_sgemm_bf16, s, x, w, b, y, col);
}

void ct_conv2d_bwd_bf16(const ct_conv2d_shape *s, const float *x, const float *w, const float *dy,
                        float *dx, float *dw, float *db, float *col) {
  conv_bwd(ct_sgemm_bf16, s, x, w, dy, dx, dw, db, col);
}

/* ---------------------------------------------------------- GroupNorm */

void ct_groupnorm_fwd(int B, int C, int HW, int G, float eps, const float *x, const float *gamma,
                      const float *beta, float *y, float *mean, float *rstd) {
  const int cg = C / G;
  const size_t n = (size_t)cg * HW;
#pragma omp parallel for schedule(static) if ((size_t)B * C * HW > 32768)
  for (int bg = 0; bg < B * G; bg++) {
    const int bi = bg / G, g = bg % G;
    const float *xg = x + ((size_t)bi * C + (size_t)g * cg) * HW;
    double s1 = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) s1 += (double)xg[i];
    const double mu = s1 / (double)n;
    for (size_t i = 0; i < n; i++) {
      const double d = (double)xg[i] - mu;
      s2 += d * d;
    }
    const double rs = 1.0 / sqrt(s2 / (double)n + (double)eps);
    mean[bg] = (float)mu;
    rstd[bg] = (float)rs;
    float *yg = y + ((size_t)bi * C + (size_t)g * cg) * HW;
    for (int c = 0; c < cg; c++) {
      const int ch = g * cg + c;
      const float a = (float)rs * (gamma ? gamma[ch] : 1.0f);
      const float bb = (beta ? beta[ch] : 0.0f) - (float)mu * a;
      const float *xc = xg + (size_t)c * HW;
      float *yc = yg + (size_t)c * HW;
      for (int p = 0; p < HW; p++) yc[p] = xc[p] * a + bb;
    }
  }
}

void ct_groupnorm_bwd(int B, int C, int HW, int G, const float *x, const float *gamma,
                      const float *mean, const float *rstd, const float *dy, float *dx,
                      float *dgamma, float *dbeta) {
  const int cg = C / G;
  const size_t n = (size_t)cg * HW;
  if (dgamma || dbeta) {
#pragma omp parallel for schedule(static) if ((size_t)B * C * HW > 32768)
    for (int ch = 0; ch < C; ch++) {
      const int g = ch / cg;
      double sg = 0, sb = 0;
      for (int bi = 0; bi < B; bi++) {
        const float *xc = x + ((size_t)bi * C + ch) * HW, *gc = dy + ((size_t)bi * C + ch) * HW;
        const double mu = mean[bi * G + g], rs = rstd[bi * G + g];
        for (int p = 0; p < HW; p++) {
          sg += (double)gc[p] * ((double)xc[p] - mu) * rs;
          sb += (double)gc[p];
        }
      }
      if (dgamma) dgamma[ch] = (float)((double)dgamma[ch] + sg);
      if (dbeta) dbeta[ch] = (float)((double)dbeta[ch] + sb);
    }
  }
  if (!dx) return;
    /* dx = rstd (dxh - mean(dxh) - xhat mean(dxh xhat)), dxh = dy gamma */
#pragma omp parallel for schedule(static) if ((size_t)B * C * HW > 32768)
  for (int bg = 0; bg < B * G; bg++) {
    const int bi = bg / G, g = bg % G;
    const size_t off = ((size_t)bi * C + (size_t)g * cg) * HW;
    const double mu = mean[bg], rs = rstd[bg];
    double s1 = 0, s2 = 0;
    for (int c = 0; c < cg; c++) {
      const double ga = gamma ? gamma[g * cg + c] : 1.0;
      const float *xc = x + off + (size_t)c * HW, *gc = dy + off + (size_t)c * HW;
      for (int p = 0; p < HW; p++) {
        const double dxh = (double)gc[p] * ga, xh = ((double)xc[p] - mu) * rs;
        s1 += dxh;
        s2 += dxh * xh;
      }
    }
    const double m1 = s1 / (double)n, m2 = s2 / (double)n;
    for (int c = 0; c < cg; c++) {
      const double ga = gamma ? gamma[g * cg + c] : 1.0;
      const float *xc = x + off + (size_t)c * HW, *gc = dy + off + (size_t)c * HW;
      float *dc = dx + off + (size_t)c * HW;
      for (int p = 0; p < HW; p++) {
        const double xh = ((double)xc[p] - mu) * rs;
        dc[p] = (float)(rs * ((double)gc[p] * ga - m1 - xh * m2));
      }
    }
  }
}

/* ------------------------------------------------- upsample, transposes */

void ct_upsample2x_fwd(int BC, int H, int W, const float *x, float *y) {
#pragma omp parallel for schedule(static) if ((size_t)BC * H * W > 32768)
  for (int p = 0; p < BC; p++) {
    const float *xp = x + (size_t)p * H * W;
    float *yp = y + (size_t)p * 4 * H * W;
    for (int i = 0; i < H; i++) {
      float *r0 = yp + (size_t)(2 * i) * 2 * W, *r1 = r0 + 2 * W;
      for (int j = 0; j < W; j++) r0[2 * j] = r0[2 * j + 1] = xp[(size_t)i * W + j];
      memcpy(r1, r0, (size_t)2 * W * sizeof(float));
    }
  }
}

void ct_upsample2x_bwd(int BC, int H, int W, const float *dy, float *dx) {
#pragma omp parallel for schedule(static) if ((size_t)BC * H * W > 32768)
  for (int p = 0; p < BC; p++) {
    const float *gp = dy + (size_t)p * 4 * H * W;
    float *dp = dx + (size_t)p * H * W;
    for (int i = 0; i < H; i++) {
      const float *r0 = gp + (size_t)(2 * i) * 2 * W, *r1 = r0 + 2 * W;
      for (int j = 0; j < W; j++)
        dp[(size_t)i * W + j] = (r0[2 * j] + r0[2 * j + 1]) + (r1[2 * j] + r1[2 * j + 1]);
    }
  }
}

void ct_nchw_to_nlc(int B, int C, int L, const float *x, float *y) {
#pragma omp parallel for schedule(static) if ((size_t)B * C * L > 32768)
  for (int bl = 0; bl < B * L; bl++) {
    const int bi = bl / L, l = bl % L;
    const float *xb = x + (size_t)bi * C * L + l;
    float *yr = y + (size_t)bl * C;
    for (int c = 0; c < C; c++) yr[c] = xb[(size_t)c * L];
  }
}

void ct_nlc_to_nchw(int B, int C, int L, const float *x, float *y) {
#pragma omp parallel for schedule(static) if ((size_t)B * C * L > 32768)
  for (int bc = 0; bc < B * C; bc++) {
    const int bi = bc / C, c = bc % C;
    const float *xb = x + (size_t)bi * L * C + c;
    float *yr = y + (size_t)bc * L;
    for (int l = 0; l < L; l++) yr[l] = xb[(size_t)l * C];
  }
}

void ct_tile_blend(int planes, int rows, int cols, int e, int vertical, const float *a,
                   size_t plane_a, int lda, float *b, size_t plane_b, int ldb) {
#pragma omp parallel for schedule(static) if ((size_t)planes * rows * cols > 65536)
  for (int p = 0; p < planes; p++)
    for (int y = 0; y < rows; y++) {
      const float *ar = a + (size_t)p * plane_a + (size_t)y * lda;
      float *br = b + (size_t)p * plane_b + (size_t)y * ldb;
      if (vertical) {
        const float t = (float)y / (float)e;
        for (int x = 0; x < cols; x++) br[x] = ar[x] * (1 - t) + br[x] * t;
      } else {
        for (int x = 0; x < cols; x++) {
          const float t = (float)x / (float)e;
          br[x] = ar[x] * (1 - t) + br[x] * t;
        }
      }
    }
}

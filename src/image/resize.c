/* resize.c: Lanczos-3 resampling, a transcription of Pillow's Resample.c
 * (Image.resize(size, Image.LANCZOS) on an RGB image, no box, no reducing_gap).
 *
 * Separable: a horizontal pass into an 8-bit intermediate over only the rows
 * the vertical pass needs, then a vertical pass. When shrinking, the filter is
 * stretched by the scale factor (antialiasing). Weights are computed in double,
 * normalised to sum 1, then rounded to 22-bit fixed point exactly as Pillow
 * does, and each pass accumulates in int32 with the same rounding and clipping,
 * so output matches Pillow to the bit on this machine (measured in
 * tests/test_image.c against Pillow references; docs/images.md).
 * Not here: other filters, premultiplied alpha (our images have none).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "image/image_int.h"

#define PRECISION_BITS (32 - 8 - 2)

static double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= M_PI;
  return sin(x) / x;
}

static double lanczos(double x) {
  if (-3.0 <= x && x < 3.0) return sinc(x) * sinc(x / 3);
  return 0.0;
}

/* Fixed-point weights for out_size outputs from in_size inputs: ksize per
 * output, bounds[2*i] = first input, bounds[2*i+1] = count. Returns ksize or 0
 * on allocation failure. */
static int coeffs(int in_size, int out_size, int **boundsp, int32_t **kkp) {
  double scale = (double)in_size / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
  double support = 3.0 * filterscale;
  int ksize = (int)ceil(support) * 2 + 1;
  double *pre = malloc(sizeof(double) * (size_t)out_size * ksize);
  int32_t *kk = malloc(sizeof(int32_t) * (size_t)out_size * ksize);
  int *bounds = malloc(sizeof(int) * 2 * (size_t)out_size);
  if (!pre || !kk || !bounds) {
    free(pre);
    free(kk);
    free(bounds);
    return 0;
  }
  for (int xx = 0; xx < out_size; xx++) {
    double center = (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / filterscale;
    int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
    if (xmin < 0) xmin = 0;
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double *k = pre + (size_t)xx * ksize;
    int x;
    for (x = 0; x < xmax; x++) {
      double w = lanczos((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (x = 0; x < xmax; x++)
      if (ww != 0.0) k[x] /= ww;
    for (; x < ksize; x++) k[x] = 0;
    bounds[2 * xx] = xmin;
    bounds[2 * xx + 1] = xmax;
  }
  for (size_t i = 0; i < (size_t)out_size * ksize; i++)
    kk[i] = pre[i] < 0 ? (int32_t)(-0.5 + pre[i] * (1 << PRECISION_BITS))
                       : (int32_t)(0.5 + pre[i] * (1 << PRECISION_BITS));
  free(pre);
  *boundsp = bounds;
  *kkp = kk;
  return ksize;
}

static inline uint8_t clip8(int32_t v) {
  if (v >= (1 << PRECISION_BITS << 8)) return 255;
  if (v <= 0) return 0;
  return (uint8_t)(v >> PRECISION_BITS);
}

/* dst (dw x rows) from src rows [y0, y0+rows) of width sw. */
static void pass_h(const uint8_t *src, int sw, int y0, uint8_t *dst, int dw, int rows, int ksize,
                   const int *bounds, const int32_t *kk) {
#pragma omp parallel for schedule(static) if (rows * dw > 65536)
  for (int y = 0; y < rows; y++) {
    const uint8_t *s = src + (size_t)(y0 + y) * sw * 3;
    uint8_t *d = dst + (size_t)y * dw * 3;
    for (int xx = 0; xx < dw; xx++) {
      int xmin = bounds[2 * xx], xmax = bounds[2 * xx + 1];
      const int32_t *k = kk + (size_t)xx * ksize;
      int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
      for (int x = 0; x < xmax; x++) {
        const uint8_t *p = s + (size_t)(x + xmin) * 3;
        s0 += p[0] * k[x];
        s1 += p[1] * k[x];
        s2 += p[2] * k[x];
      }
      d[3 * xx] = clip8(s0);
      d[3 * xx + 1] = clip8(s1);
      d[3 * xx + 2] = clip8(s2);
    }
  }
}

/* dst (w x dh) from src (w x ...), bounds relative to src row 0. */
static void pass_v(const uint8_t *src, int w, uint8_t *dst, int dh, int ksize, const int *bounds,
                   const int32_t *kk) {
#pragma omp parallel for schedule(static) if (w * dh > 65536)
  for (int yy = 0; yy < dh; yy++) {
    int ymin = bounds[2 * yy], ymax = bounds[2 * yy + 1];
    const int32_t *k = kk + (size_t)yy * ksize;
    uint8_t *d = dst + (size_t)yy * w * 3;
    for (int xx = 0; xx < w * 3; xx++) {
      int32_t s = 1 << (PRECISION_BITS - 1);
      for (int y = 0; y < ymax; y++) s += src[(size_t)(y + ymin) * w * 3 + xx] * k[y];
      d[xx] = clip8(s);
    }
  }
}

ct_status ct_image_resize(const ct_image *src, int w, int h, ct_image *dst, ct_err *err) {
  ct_status st = CT_OK;
  int *bh = NULL, *bv = NULL;
  int32_t *kh = NULL, *kv = NULL;
  ct_image tmp = {0}, res = {0};
  if (!src || !src->px || !dst)
    return ct_errf(err, CT_ERR_INVALID, "ct_image_resize: NULL argument");
  if ((st = ct_image_alloc(w, h, &res, err))) {
    ct_err_prefix(err, "resize %dx%d -> %dx%d: ", src->w, src->h, w, h);
    return st;
  }
  if (w == src->w && h == src->h) {
    memcpy(res.px, src->px, (size_t)w * h * 3);
    *dst = res;
    return CT_OK;
  }
  int ksh = coeffs(src->w, w, &bh, &kh), ksv = coeffs(src->h, h, &bv, &kv);
  if (!ksh || !ksv) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory for resize weights");
    goto out;
  }
  const ct_image *cur = src;
  if (w != src->w) {
    if (h == src->h) {
      pass_h(src->px, src->w, 0, res.px, w, h, ksh, bh, kh);
      cur = &res;
    } else {
      /* Only the source rows the vertical pass reads. */
      int first = bv[0], last = bv[2 * h - 2] + bv[2 * h - 1];
      for (int i = 0; i < h; i++) bv[2 * i] -= first;
      if ((st = ct_image_alloc(w, last - first, &tmp, err))) goto out;
      pass_h(src->px, src->w, first, tmp.px, w, last - first, ksh, bh, kh);
      cur = &tmp;
    }
  }
  if (h != src->h) pass_v(cur->px, w, res.px, h, ksv, bv, kv);
  *dst = res;
  res.px = NULL;
out:
  ct_image_free(&res);
  ct_image_free(&tmp);
  free(bh);
  free(bv);
  free(kh);
  free(kv);
  return st;
}

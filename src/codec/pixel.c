/* The pixel codec: space-to-depth of RGB scaled to [-1, 1] (codec.h).
 *
 * Encoding maps a byte u to u / 127.5 - 1; decoding maps v back with
 * round((v + 1) * 127.5) after clamping to [-1, 1]. In float32 the round trip
 * is exact for all 256 values (tested), so decode(encode(img)) == img.
 * Channel c*s*s + py*s + px at latent (y, x) is colour c of pixel
 * (y*s + py, x*s + px): the MMDiT's patchify order (c ph pw).
 * Not here: learned codecs (the VAE).
 */
#include <math.h>

#include "ctuner/codec.h"

int ct_pixel_channels(int s) {
  return (s == 1 || s == 2 || s == 4) ? 3 * s * s : 0;
}

static ct_status check(const void *a, const void *b, int w, int h, int s, const char *op,
                       ct_err *err) {
  if (s != 1 && s != 2 && s != 4)
    return ct_errf(err, CT_ERR_INVALID, "pixel codec %s: scale factor s must be 1, 2 or 4 (got %d)",
                   op, s);
  if (w < 1 || h < 1 || w % s || h % s)
    return ct_errf(
        err, CT_ERR_SHAPE,
        "pixel codec %s: image %dx%d must be non-empty with width and height multiples of s = %d "
        "(crop or resize to %dx%d)",
        op, w, h, s, w / s * s, h / s * s);
  if ((size_t)w * (size_t)h > ((size_t)1 << 31))
    return ct_errf(err, CT_ERR_RANGE, "pixel codec %s: image %dx%d is too large", op, w, h);
  if (!a || !b) return ct_errf(err, CT_ERR_INVALID, "pixel codec %s: NULL buffer", op);
  return CT_OK;
}

ct_status ct_pixel_encode(const uint8_t *rgb, int w, int h, int s, float *lat, ct_err *err) {
  ct_status st = check(rgb, lat, w, h, s, "encode", err);
  if (st) return st;
  int lw = w / s, lh = h / s;
  size_t plane = (size_t)lw * lh;
#pragma omp parallel for schedule(static) if ((size_t)w * h > 65536)
  for (int y = 0; y < h; y++) {
    int ly = y / s, py = y % s;
    for (int x = 0; x < w; x++) {
      int lx = x / s, px = x % s;
      const uint8_t *p = rgb + ((size_t)y * w + x) * 3;
      for (int c = 0; c < 3; c++)
        lat[(size_t)(c * s * s + py * s + px) * plane + (size_t)ly * lw + lx] =
            (float)p[c] / 127.5f - 1.0f;
    }
  }
  return CT_OK;
}

ct_status ct_pixel_decode(const float *lat, int w, int h, int s, uint8_t *rgb, ct_err *err) {
  ct_status st = check(lat, rgb, w, h, s, "decode", err);
  if (st) return st;
  int lw = w / s, lh = h / s;
  size_t plane = (size_t)lw * lh, n = plane * 3 * (size_t)s * s;
  /* NaN has no colour; report it instead of writing an arbitrary byte. */
  for (size_t i = 0; i < n; i++)
    if (isnan(lat[i]))
      return ct_errf(err, CT_ERR_NUMERIC,
                     "pixel codec decode: latent value %zu (channel %zu) is NaN", i, i / plane);
#pragma omp parallel for schedule(static) if ((size_t)w * h > 65536)
  for (int y = 0; y < h; y++) {
    int ly = y / s, py = y % s;
    for (int x = 0; x < w; x++) {
      int lx = x / s, px = x % s;
      uint8_t *p = rgb + ((size_t)y * w + x) * 3;
      for (int c = 0; c < 3; c++) {
        float v = lat[(size_t)(c * s * s + py * s + px) * plane + (size_t)ly * lw + lx];
        v = v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
        p[c] = (uint8_t)lrintf((v + 1.0f) * 127.5f);
      }
    }
  }
  return CT_OK;
}

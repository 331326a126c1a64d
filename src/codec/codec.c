/* codec.c: the latent codec interface (codec.h) over the pixel codec and the
 * VAE (docs/vae.md). The VAE's workspace is not re-entrant, so its calls
 * take a mutex; its kernels parallelise internally. */
#include "ctuner/codec.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/hash.h"
#include "ctuner/rng.h"
#include "ctuner/vae.h"

#define CT_STREAM_VAE_SAMPLE 0x5641454353414d50ull

typedef struct vae_ctx {
  ct_vae *vae;
  int tile;
  uint64_t seed;
  pthread_mutex_t mu;
} vae_ctx;

ct_status ct_codec_pixel(int s, ct_codec *out, ct_err *err) {
  memset(out, 0, sizeof *out);
  if (!ct_pixel_channels(s))
    return ct_errf(err, CT_ERR_INVALID, "pixel codec scale %d is not 1, 2 or 4", s);
  snprintf(out->kind, sizeof out->kind, "pixel");
  out->channels = ct_pixel_channels(s);
  out->factor = s;
  snprintf(out->tag, sizeof out->tag, "pixel:%d", s);
  return CT_OK;
}

ct_status ct_codec_vae(const char *dir, int tile, uint64_t seed, ct_codec *out, ct_err *err) {
  memset(out, 0, sizeof *out);
  vae_ctx *v = calloc(1, sizeof *v);
  if (!v) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = ct_vae_from_pretrained(dir, &v->vae, err);
  if (st) {
    free(v);
    return st;
  }
  const ct_vae_config *c = ct_vae_cfg(v->vae);
  if (c->in_channels != 3 || c->out_channels != 3) { /* the images are RGB */
    st = ct_errf(
        err, CT_ERR_UNSUPPORTED,
        "%s: in_channels %d, out_channels %d: the codec encodes RGB images, so the VAE must "
        "have 3 of each",
        dir, c->in_channels, c->out_channels);
    ct_vae_free(v->vae);
    free(v);
    return st;
  }
  v->tile = tile;
  v->seed = seed;
  pthread_mutex_init(&v->mu, NULL);
  snprintf(out->kind, sizeof out->kind, "vae");
  out->channels = c->latent_channels;
  out->factor = ct_vae_factor(c);
  out->serial = 1;
  out->ctx = v;
  /* the tag: a digest of the weights and of the scaling, so another VAE (or
   * another scaling) never reads these cache entries */
  const float *w = ct_vae_params(v->vae);
  char hex[65], buf[64];
  ct_sha256_hex(w, ct_vae_numel(v->vae) * sizeof(float), hex);
  snprintf(buf, sizeof buf, "%.9g/%.9g/%llu", c->scaling_factor, c->shift_factor,
           (unsigned long long)seed);
  char hb[65];
  ct_sha256_hex(buf, strlen(buf), hb);
  snprintf(out->tag, sizeof out->tag, "vae:%.16s%.8s", hex, hb);
  return CT_OK;
}

void ct_codec_free(ct_codec *c) {
  if (!c || !c->ctx) return;
  vae_ctx *v = c->ctx;
  ct_vae_free(v->vae);
  pthread_mutex_destroy(&v->mu);
  free(v);
  c->ctx = NULL;
}

static ct_status bad_size(int w, int h, int f, ct_err *err) {
  return ct_errf(err, CT_ERR_SHAPE,
                 "VAE codec: image %dx%d is not a multiple of the VAE's factor %d", w, h, f);
}

static ct_status encode(const ct_codec *c, const uint8_t *rgb, int w, int h, uint64_t key,
                        int sample, float *lat, ct_err *err);

ct_status ct_codec_encode(const ct_codec *c, const uint8_t *rgb, int w, int h, uint64_t key,
                          float *lat, ct_err *err) {
  return encode(c, rgb, w, h, key, 1, lat, err);
}

ct_status ct_codec_encode_mean(const ct_codec *c, const uint8_t *rgb, int w, int h, float *lat,
                               ct_err *err) {
  return encode(c, rgb, w, h, 0, 0, lat, err);
}

static ct_status encode(const ct_codec *c, const uint8_t *rgb, int w, int h, uint64_t key,
                        int sample, float *lat, ct_err *err) {
  if (!c->ctx) return ct_pixel_encode(rgb, w, h, c->factor, lat, err);
  vae_ctx *v = c->ctx;
  const ct_vae_config *vc = ct_vae_cfg(v->vae);
  const int f = c->factor;
  if (w % f || h % f) return bad_size(w, h, f, err);
  const size_t npx = (size_t)3 * w * h, nl = (size_t)c->channels * (w / f) * (h / f);
  /* x holds the image, then the sample's noise: a latent may be the larger
   * (16 channels at factor 2, as the tiny FLUX.1 test VAE) */
  float *x = ct_alloc(CT_MEM_BUFFERS, (npx > nl ? npx : nl) * sizeof(float)),
        *lv = ct_alloc(CT_MEM_BUFFERS, nl * sizeof(float));
  ct_status st =
      x && lv ? ct_pixel_encode(rgb, w, h, 1, x, err) : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  if (!st) {
    pthread_mutex_lock(&v->mu);
    st = ct_vae_encode_tiled(v->vae, 1, h, w, x, v->tile, lat, lv, err);
    pthread_mutex_unlock(&v->mu);
  }
  if (!st) {
    /* z = mean + exp(logvar / 2) eps, then (z - shift) * scale */
    if (sample)
      ct_rng_fill_normal(x, nl, v->seed, CT_STREAM_VAE_SAMPLE, key * (uint64_t)nl, 0.0f, 1.0f);
    for (size_t i = 0; i < nl; i++)
      lat[i] = (lat[i] + (sample ? expf(0.5f * lv[i]) * x[i] : 0.0f) - vc->shift_factor) *
               vc->scaling_factor;
  }
  ct_free(x);
  ct_free(lv);
  return st;
}

ct_status ct_codec_decode(const ct_codec *c, const float *lat, int w, int h, uint8_t *rgb,
                          ct_err *err) {
  if (!c->ctx) return ct_pixel_decode(lat, w, h, c->factor, rgb, err);
  vae_ctx *v = c->ctx;
  const ct_vae_config *vc = ct_vae_cfg(v->vae);
  const int f = c->factor;
  if (w % f || h % f) return bad_size(w, h, f, err);
  const size_t npx = (size_t)3 * w * h, nl = (size_t)c->channels * (w / f) * (h / f);
  float *z = ct_alloc(CT_MEM_BUFFERS, nl * sizeof(float)),
        *x = ct_alloc(CT_MEM_BUFFERS, npx * sizeof(float));
  ct_status st = z && x ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; !st && i < nl; i++) z[i] = lat[i] / vc->scaling_factor + vc->shift_factor;
  if (!st) {
    pthread_mutex_lock(&v->mu);
    st = ct_vae_decode_tiled(v->vae, 1, h / f, w / f, z, v->tile, x, err);
    pthread_mutex_unlock(&v->mu);
  }
  if (!st) st = ct_pixel_decode(x, w, h, 1, rgb, err);
  ct_free(z);
  ct_free(x);
  return st;
}

/* vae_tiled.c: tiled encode and decode, as diffusers' AutoencoderKL
 * tiled_encode/tiled_decode: tiles of `tile` input pixels (or latents)
 * every 3/4 tile, each output tile blended linearly with its upper and left
 * neighbours over 1/4 of an output tile, then cropped to 3/4 of one. Memory
 * then follows the tile, not the image. The mid block's attention sees one
 * tile at a time, as in diffusers. Tiles are cut, blended and placed with
 * the VAE's compute backend (copy_2d, tile_blend). */
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "vae/vae_int.h"

typedef ct_status (*tile_fn)(ct_vae *v, int B, int h, int w, const float *in, float *out,
                             ct_err *err);

typedef struct vtile {
  float *p;
  int h, w;
} vtile;

/* b's first rows take a's last ones: b = a (1 - y/e) + b (y/e) */
static void blend_v(const ct_backend_ops *be, int BC, const vtile *a, vtile *b, int extent) {
  int e = a->h < b->h ? a->h : b->h;
  if (extent < e) e = extent;
  be->tile_blend(BC, e, b->w, e, 1, a->p + (size_t)(a->h - e) * a->w, (size_t)a->h * a->w, a->w,
                 b->p, (size_t)b->h * b->w, b->w);
}

static void blend_h(const ct_backend_ops *be, int BC, const vtile *a, vtile *b, int extent) {
  int e = a->w < b->w ? a->w : b->w;
  if (extent < e) e = extent;
  be->tile_blend(BC, b->h, e, e, 0, a->p + (a->w - e), (size_t)a->h * a->w, a->w, b->p,
                 (size_t)b->h * b->w, b->w);
}

/* in (B, Cin, H, W) -> out (B, Cout, H*num/den, W*num/den) */
static ct_status tiled(ct_vae *v, int B, int Cin, int H, int W, const float *in, int tin, int Cout,
                       int num, int den, tile_fn fn, float *out, ct_err *err) {
  const int tout = tin * num / den, overlap = (int)(tin * 0.75), blend = (int)(tout * 0.25),
            limit = tout - blend;
  const int Ho = H * num / den, Wo = W * num / den;
  if (overlap < 1 || limit < 1)
    return ct_errf(err, CT_ERR_INVALID, "VAE tile of %d is too small", tin);
  const int nr = (H + overlap - 1) / overlap, nc = (W + overlap - 1) / overlap;
  const ct_backend_ops *be = v->be;
  vtile *t = calloc((size_t)nr * nc, sizeof *t);
  float *sub = be->alloc(CT_MEM_BUFFERS, (size_t)B * Cin * tin * tin * sizeof(float));
  ct_status st = t && sub ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory for VAE tiles");
  for (int i = 0; !st && i < nr; i++)
    for (int j = 0; !st && j < nc; j++) {
      const int y0 = i * overlap, x0 = j * overlap;
      const int th = H - y0 < tin ? H - y0 : tin, tw = W - x0 < tin ? W - x0 : tin;
      for (int p = 0; p < B * Cin; p++)
        be->copy_2d(th, tw, in + ((size_t)p * H + y0) * W + x0, W, sub + (size_t)p * th * tw, tw);
      vtile *o = &t[i * nc + j];
      o->h = th * num / den, o->w = tw * num / den;
      o->p = be->alloc(CT_MEM_BUFFERS, (size_t)B * Cout * o->h * o->w * sizeof(float));
      st = o->p ? fn(v, B, th, tw, sub, o->p, err)
                : ct_errf(err, CT_ERR_NOMEM, "out of memory for VAE tiles");
    }
  for (int i = 0; !st && i < nr; i++)
    for (int j = 0; j < nc; j++) {
      vtile *o = &t[i * nc + j];
      if (i > 0) blend_v(be, B * Cout, &t[(i - 1) * nc + j], o, blend);
      if (j > 0) blend_h(be, B * Cout, &t[i * nc + j - 1], o, blend);
      const int ch = o->h < limit ? o->h : limit, cw = o->w < limit ? o->w : limit;
      const int oy = i * limit, ox = j * limit, rows = oy + ch <= Ho ? ch : Ho - oy;
      for (int p = 0; p < B * Cout && rows > 0; p++)
        be->copy_2d(rows, ox + cw <= Wo ? cw : Wo - ox, o->p + (size_t)p * o->h * o->w, o->w,
                    out + ((size_t)p * Ho + oy) * Wo + ox, Wo);
    }
  for (int k = 0; t && k < nr * nc; k++) be->free(t[k].p);
  free(t);
  be->free(sub);
  return st;
}

static ct_status enc_tile(ct_vae *v, int B, int h, int w, const float *in, float *out,
                          ct_err *err) {
  const float *mom = NULL;
  ct_status st = ct_vae_encode_moments(v, B, h, w, in, &mom, err);
  const int f = ct_vae_factor(&v->cfg);
  if (!st)
    v->be->copy(out, mom,
                (size_t)B * 2 * v->cfg.latent_channels * (h / f) * (w / f) * sizeof(float));
  return st;
}

static ct_status dec_tile(ct_vae *v, int B, int h, int w, const float *in, float *out,
                          ct_err *err) {
  return ct_vae_decode(v, B, h, w, in, out, err);
}

ct_status ct_vae_encode_tiled(ct_vae *v, int B, int H, int W, const float *x, int tile, float *mean,
                              float *logvar, ct_err *err) {
  const int f = ct_vae_factor(&v->cfg), lc = v->cfg.latent_channels;
  if (tile <= 0 || (H <= tile && W <= tile)) return ct_vae_encode(v, B, H, W, x, mean, logvar, err);
  if (tile % (4 * f))
    return ct_errf(err, CT_ERR_INVALID,
                   "vae tile size %d must be a multiple of 4 x the VAE's factor %d", tile, f);
  if (H % f || W % f)
    return ct_errf(err, CT_ERR_SHAPE, "VAE encode: %dx%d is not a multiple of the VAE's factor %d",
                   W, H, f);
  const size_t plane = (size_t)(H / f) * (size_t)(W / f);
  float *mom = v->be->alloc(CT_MEM_BUFFERS, (size_t)B * 2 * lc * plane * sizeof(float));
  if (!mom) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = tiled(v, B, v->cfg.in_channels, H, W, x, tile, 2 * lc, 1, f, enc_tile, mom, err);
  if (!st) ct_vae_split_moments(v->be, B, lc, plane, mom, mean, logvar);
  v->be->free(mom);
  return st;
}

ct_status ct_vae_decode_tiled(ct_vae *v, int B, int h, int w, const float *z, int tile, float *x,
                              ct_err *err) {
  const int f = ct_vae_factor(&v->cfg);
  if (tile <= 0 || (h * f <= tile && w * f <= tile)) return ct_vae_decode(v, B, h, w, z, x, err);
  if (tile % (4 * f))
    return ct_errf(err, CT_ERR_INVALID,
                   "vae tile size %d must be a multiple of 4 x the VAE's factor %d", tile, f);
  return tiled(v, B, v->cfg.latent_channels, h, w, z, tile / f, v->cfg.out_channels, f, 1, dec_tile,
               x, err);
}

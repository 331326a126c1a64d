/* Sampling a StableDiffusionXLPipeline directory as diffusers'
 * StableDiffusionXLPipeline.__call__ (0.42.1,
 * pipelines/stable_diffusion_xl/pipeline_stable_diffusion_xl.py) does
 * (`ctuner sample --pretrained DIR` of an SDXL pipeline, docs/sdxl.md):
 *
 * - the U-net as a ct_denoise_fn (the sdxl row's open_denoiser in family.c):
 *   ct_unet_forward without a tape, every sample at the same timestep;
 * - encode_prompt (sdxl_text.c) for the prompt and the negative prompt; with
 *   no negative prompt and force_zeros_for_empty_prompt the negative
 *   conditioning is zeros (encode_prompt's zero_out_negative_prompt);
 * - add_time_ids = original_size + crops_coords_top_left + target_size with
 *   original_size = target_size = (height, width) and crop (0, 0) (the
 *   pipeline's defaults), the same for the negative side;
 * - the loop (sdxl_sample.c), then vae.decode(latents / scaling_factor) and
 *   the image processor's (x / 2 + 0.5).clamp(0, 1) * 255, rounded. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/diffusion.h"
#include "ctuner/image.h"
#include "ctuner/rng.h"
#include "ctuner/unet.h"
#include "ctuner/vae.h"
#include "train_int.h"

/* ---- the U-net as a ct_denoise_fn ---- */

typedef struct unet_den {
  ct_unet *u;
  int owned; /* 0: borrowed (a training run's U-net), not freed on close */
} unet_den;

/* The inputs in the U-net backend's memory: the host buffers themselves, or
 * (a device backend) copies made here and freed on return. */
static ct_status unet_call(ct_unet *u, const ct_unet_inputs *h, size_t nx, size_t nt, size_t np,
                           float *out, ct_err *err) {
  const ct_backend_ops *be = ct_unet_backend(u);
  if (be->host_memory) return ct_unet_forward(u, h, out, NULL, err);
  const int B = h->B;
  const size_t n[6] = {nx, (size_t)B, nt, np, (size_t)B * 6, nx};
  const float *src[5] = {h->sample, h->timesteps, h->encoder_hidden_states, h->text_embeds,
                         h->time_ids};
  float *d[6] = {0};
  ct_status st = CT_OK;
  for (int i = 0; i < 6 && !st; i++)
    if (!(d[i] = be->alloc(CT_MEM_BUFFERS, n[i] * sizeof(float))))
      st = ct_errf(err, CT_ERR_NOMEM, "U-net inputs on %s", be->name);
  for (int i = 0; i < 5 && !st; i++) be->copy_in(d[i], src[i], n[i] * sizeof(float));
  ct_unet_inputs in = *h;
  in.sample = d[0], in.timesteps = d[1], in.encoder_hidden_states = d[2];
  in.text_embeds = d[3], in.time_ids = d[4];
  if (!st) st = ct_unet_forward(u, &in, d[5], NULL, err);
  if (!st) be->copy_out(out, d[5], nx * sizeof(float));
  for (int i = 0; i < 6; i++) be->free(d[i]);
  return st;
}

static ct_status unet_denoise(void *user, const float *x, int B, int C, int H, int W, float t,
                              const ct_denoise_cond *c, float *out, ct_err *err) {
  unet_den *d = user;
  const ct_unet_config *uc = ct_unet_cfg(d->u);
  if (C != uc->in_channels || c->Dtxt != uc->cross_attention_dim ||
      (uc->text_time && c->Dpool != ct_unet_pooled_dim(uc)))
    return ct_errf(err, CT_ERR_SHAPE,
                   "the U-net takes %d latent channels, text width %d, pooled %d; the sampler "
                   "gives %d, %d, %d",
                   uc->in_channels, uc->cross_attention_dim, ct_unet_pooled_dim(uc), C, c->Dtxt,
                   c->Dpool);
  float tt[8];
  if (B > 8) return ct_errf(err, CT_ERR_INVALID, "U-net denoiser: batch %d > 8", B);
  for (int b = 0; b < B; b++) tt[b] = t;
  const ct_unet_inputs in = {.B = B,
                             .H = H,
                             .W = W,
                             .sample = x,
                             .timesteps = tt,
                             .Lk = c->Ttxt,
                             .encoder_hidden_states = c->text,
                             .text_embeds = uc->text_time ? c->pooled : NULL,
                             .time_ids = uc->text_time ? c->time_ids : NULL};
  return unet_call(d->u, &in, (size_t)B * C * H * W, (size_t)B * c->Ttxt * c->Dtxt,
                   (size_t)B * c->Dpool, out, err);
}

static void unet_close(void *user) {
  unet_den *d = user;
  if (!d) return;
  if (d->owned) ct_unet_free(d->u);
  free(d);
}

ct_status ct_sdxl_unet_denoiser(const char *dir, ct_denoise_fn *fn, void **user,
                                void (**close)(void *user), ct_err *err) {
  *user = NULL;
  unet_den *d = calloc(1, sizeof *d);
  if (!d) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = ct_unet_from_pretrained(dir, &d->u, err);
  if (st) {
    free(d);
    return st;
  }
  d->owned = 1;
  *fn = unet_denoise, *user = d, *close = unet_close;
  return CT_OK;
}

ct_status ct_sdxl_unet_as_denoiser(struct ct_unet *u, ct_denoise_fn *fn, void **user,
                                   void (**close)(void *user), ct_err *err) {
  *user = NULL;
  unet_den *d = calloc(1, sizeof *d);
  if (!d) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  d->u = u;
  *fn = unet_denoise, *user = d, *close = unet_close;
  return CT_OK;
}

/* ---- the pipeline ---- */

struct ct_sdxl_sampler {
  const ct_sdxl_pipe *p; /* &own, or a borrowed one (a training run's) */
  ct_sdxl_pipe own;
  int own_open;
  ct_denoise_fn fn;
  void *user;
  void (*close)(void *user);
  int multiple; /* image sides: multiples of the VAE factor x 2^(levels - 1) */
  int vae_factor, C;
  int default_px; /* the pipeline's default side: unet sample_size x the VAE factor */
  /* the progress line per step (stderr) */
  int progress, step, steps;
};

void ct_sdxl_sampler_free(ct_sdxl_sampler *s) {
  if (!s) return;
  if (s->close) s->close(s->user);
  if (s->own_open) ct_sdxl_pipe_close(&s->own);
  free(s);
}

/* The pipeline (pipe borrowed, or opened from root) and its U-net: unet
 * (borrowed) or opened from unet_dir. */
static ct_status sampler_open(const char *root, const ct_sdxl_pipe *pipe, const char *unet_dir,
                              ct_unet *unet, ct_sdxl_sampler **out, ct_err *err) {
  *out = NULL;
  ct_sdxl_sampler *s = calloc(1, sizeof *s);
  if (!s) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = CT_OK;
  if (pipe) {
    s->p = pipe, root = pipe->root;
  } else {
    st = ct_sdxl_pipe_open(root, &s->own, err);
    s->own_open = !st, s->p = &s->own;
  }
  if (!st && unet) st = ct_sdxl_unet_as_denoiser(unet, &s->fn, &s->user, &s->close, err);
  if (!st && !unet)
    st = ct_sdxl_unet_denoiser(unet_dir ? unet_dir : s->p->unet_dir, &s->fn, &s->user, &s->close,
                               err);
  if (!st) {
    const ct_unet_config *uc = ct_unet_cfg(((unet_den *)s->user)->u);
    const ct_vae_config *vc = ct_vae_cfg(s->p->vae);
    int T, D, P;
    ct_sdxl_text_dims(s->p->text, &T, &D, &P);
    s->vae_factor = ct_vae_factor(vc), s->C = uc->in_channels;
    s->multiple = s->vae_factor << (uc->nblocks - 1);
    s->default_px = uc->sample_size * s->vae_factor;
    if (uc->in_channels != vc->latent_channels || uc->cross_attention_dim != D ||
        (uc->text_time && ct_unet_pooled_dim(uc) != P))
      st = ct_errf(err, CT_ERR_SHAPE,
                   "%s: the U-net (%d channels, cross_attention_dim %d, pooled %d) does not fit "
                   "the VAE (%d latent channels) and text encoders (%d, pooled %d)",
                   root, uc->in_channels, uc->cross_attention_dim, ct_unet_pooled_dim(uc),
                   vc->latent_channels, D, P);
  }
  if (st) {
    ct_sdxl_sampler_free(s);
    return st;
  }
  *out = s;
  return CT_OK;
}

ct_status ct_sdxl_sampler_open(const char *root, const char *unet_dir, ct_sdxl_sampler **out,
                               ct_err *err) {
  return sampler_open(root, NULL, unet_dir, NULL, out, err);
}

ct_status ct_sdxl_sampler_open_unet(const char *root, struct ct_unet *unet, ct_sdxl_sampler **out,
                                    ct_err *err) {
  return sampler_open(root, NULL, NULL, unet, out, err);
}

ct_status ct_sdxl_sampler_open_pipe(const ct_sdxl_pipe *pipe, struct ct_unet *unet,
                                    ct_sdxl_sampler **out, ct_err *err) {
  return sampler_open(NULL, pipe, NULL, unet, out, err);
}

const ct_ddpm_config *ct_sdxl_sampler_sched(const ct_sdxl_sampler *s) {
  return &s->p->sched;
}

void ct_sdxl_sampler_geometry(const ct_sdxl_sampler *s, int *multiple, int *vae_factor, int *C,
                              int *default_px) {
  if (default_px) *default_px = s->default_px;
  if (multiple) *multiple = s->multiple;
  if (vae_factor) *vae_factor = s->vae_factor;
  if (C) *C = s->C;
}

void ct_sdxl_sampler_noise(uint64_t seed, uint64_t index, size_t lat, float *x) {
  ct_rng_fill_normal(x, lat, seed, CT_STREAM_SAMPLE_NOISE, index * lat, 0.0f, 1.0f);
}

void ct_sdxl_sampler_progress(ct_sdxl_sampler *s, int on) {
  s->progress = on;
}

/* The U-net, with the progress line. */
static ct_status progress_fn(void *user, const float *x, int B, int C, int H, int W, float t,
                             const ct_denoise_cond *c, float *out, ct_err *err) {
  ct_sdxl_sampler *s = user;
  ct_status st = s->fn(s->user, x, B, C, H, W, t, c, out, err);
  if (!st && s->progress) {
    s->step++;
    fprintf(stderr, "\rsample: step %d/%d (t %g)%s", s->step, s->steps, (double)t,
            s->step == s->steps ? "\n" : "");
    fflush(stderr);
  }
  return st;
}

/* encode_prompt for the pair: the prompt's, and the negative prompt's or
 * zeros (force_zeros_for_empty_prompt with no negative prompt). */
static ct_status encode_pair(ct_sdxl_sampler *s, const char *prompt, const char *negative,
                             int zeros, float *te, float *pe, size_t nt, size_t np, ct_err *err) {
  const char *pp[2] = {prompt, negative ? negative : ""};
  memset(te + nt, 0, nt * sizeof(float));
  memset(pe + np, 0, np * sizeof(float));
  return ct_sdxl_encode_prompt(s->p->text, pp, zeros ? 1 : 2, te, pe, NULL, NULL, err);
}

/* vae.decode(latents / scaling_factor), then the image processor's uint8. */
static ct_status decode(ct_sdxl_sampler *s, const float *x, int width, int height, ct_image *out,
                        ct_err *err) {
  const ct_vae_config *vc = ct_vae_cfg(s->p->vae);
  const int h = height / s->vae_factor, w = width / s->vae_factor;
  const size_t nl = (size_t)s->C * h * w, hw = (size_t)width * height;
  float *z = malloc(nl * sizeof *z), *px = malloc(3 * hw * sizeof *px);
  ct_status st = z && px ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory while decoding");
  for (size_t i = 0; !st && i < nl; i++) z[i] = x[i] / vc->scaling_factor;
  if (!st) st = ct_vae_decode(s->p->vae, 1, h, w, z, px, err);
  if (!st) st = ct_image_alloc(width, height, out, err);
  for (size_t i = 0; !st && i < hw; i++)
    for (int c = 0; c < 3; c++) {
      float v = px[(size_t)c * hw + i] / 2.0f + 0.5f;
      v = v < 0 ? 0 : v > 1 ? 1 : v;
      out->px[i * 3 + c] = (uint8_t)lrintf(v * 255.0f);
    }
  free(z), free(px);
  return st;
}

ct_status ct_sdxl_sampler_run(ct_sdxl_sampler *s, const ct_sdxl_run *r, float *x, ct_image *out,
                              ct_err *err) {
  const int m = s->multiple;
  if (r->width <= 0 || r->height <= 0 || r->width % m || r->height % m)
    return ct_errf(err, CT_ERR_INVALID,
                   "image size %dx%d must be positive multiples of %d (the VAE's factor x 2^(U-net "
                   "levels - 1))",
                   r->width, r->height, m);
  if (r->opts.steps < 1 || r->opts.steps > 1000)
    return ct_errf(err, CT_ERR_INVALID, "steps must be 1..1000");
  int T, D, P;
  ct_sdxl_text_dims(s->p->text, &T, &D, &P);
  const size_t nt = (size_t)T * D, np = (size_t)P;
  const int zeros = !r->negative && s->p->force_zeros_for_empty_prompt;
  float *te = malloc(2 * nt * sizeof *te), *pe = malloc(2 * np * sizeof *pe);
  ct_status st = te && pe ? encode_pair(s, r->prompt, r->negative, zeros, te, pe, nt, np, err)
                          : ct_errf(err, CT_ERR_NOMEM, "out of memory while sampling");
  float ids[6];
  ct_sdxl_time_ids(r->height, r->width, 0, 0, r->height / s->vae_factor, r->width / s->vae_factor,
                   s->vae_factor, 0, ids);
  const ct_denoise_cond uncond = {te + nt, pe + np, ids, T, D, P}, cond = {te, pe, ids, T, D, P};
  s->step = 0, s->steps = r->opts.steps;
  if (!st)
    st =
        ct_sdxl_denoise(r->sched ? r->sched : &s->p->sched, &r->opts, progress_fn, s, &cond,
                        &uncond, s->C, r->height / s->vae_factor, r->width / s->vae_factor, x, err);
  if (!st && out) st = decode(s, x, r->width, r->height, out, err);
  free(te), free(pe);
  return st;
}

/* StableDiffusionXLPipeline.__call__'s denoising loop (diffusers 0.42.1
 * pipelines/stable_diffusion_xl/pipeline_stable_diffusion_xl.py) over any
 * denoiser (ctuner/diffusion.h ct_denoise_fn):
 *
 *   latents = noise * init_noise_sigma                       (prepare_latents)
 *   per timestep t:
 *     in  = scale_model_input(cat([latents] * 2) with CFG, else latents, t)
 *     eps = denoiser(in, t, negative then positive conditioning)
 *     eps = uncond + guidance_scale (text - uncond)           (guidance_scale > 1)
 *     eps = rescale_noise_cfg(eps, text, guidance_rescale)    (guidance_rescale > 0)
 *     latents = scheduler.step(eps, t, latents)
 *
 * Float32 elementwise as torch; no FMA contraction. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/diffusion.h"

/* torch's unbiased std (Bessel's correction), accumulated in double. */
static double std_of(const float *x, size_t n) {
  if (n < 2) return NAN;
  double mean = 0, m2 = 0;
  for (size_t i = 0; i < n; i++) { /* Welford, as torch's std_var kernel */
    const double d = (double)x[i] - mean;
    mean += d / (double)(i + 1);
    m2 += d * ((double)x[i] - mean);
  }
  return sqrt(m2 / (double)(n - 1));
}

void ct_rescale_noise_cfg(float *cfg, const float *text, size_t n, double guidance_rescale) {
  const float st = (float)std_of(text, n), sc = (float)std_of(cfg, n);
  const float ratio = st / sc, g = (float)guidance_rescale, keep = (float)(1.0 - guidance_rescale);
  for (size_t i = 0; i < n; i++) {
    const float r = cfg[i] * ratio;
    cfg[i] = g * r + keep * cfg[i];
  }
}

/* The pair's conditioning as one batch of 2 (uncond first), into buf. */
static ct_status batch_cond(const ct_denoise_cond *c, const ct_denoise_cond *u, float **buf,
                            ct_denoise_cond *out, ct_err *err) {
  if (u->Ttxt != c->Ttxt || u->Dtxt != c->Dtxt || u->Dpool != c->Dpool)
    return ct_errf(err, CT_ERR_SHAPE,
                   "negative conditioning (%d x %d, pooled %d) differs from the prompt's (%d x %d, "
                   "pooled %d)",
                   u->Ttxt, u->Dtxt, u->Dpool, c->Ttxt, c->Dtxt, c->Dpool);
  const size_t nt = (size_t)c->Ttxt * c->Dtxt, np = (size_t)c->Dpool;
  *buf = malloc((2 * nt + 2 * np + 12) * sizeof(float));
  if (!*buf) return ct_errf(err, CT_ERR_NOMEM, "CFG conditioning");
  float *t = *buf, *p = t + 2 * nt, *ids = p + 2 * np;
  memcpy(t, u->text, nt * sizeof(float));
  memcpy(t + nt, c->text, nt * sizeof(float));
  memcpy(p, u->pooled, np * sizeof(float));
  memcpy(p + np, c->pooled, np * sizeof(float));
  memcpy(ids, u->time_ids, 6 * sizeof(float));
  memcpy(ids + 6, c->time_ids, 6 * sizeof(float));
  *out = (ct_denoise_cond){t, p, ids, c->Ttxt, c->Dtxt, c->Dpool};
  return CT_OK;
}

/* One timestep: the model input, the denoiser, guidance, the step. */
static ct_status one_step(ct_dsched *s, const ct_sdxl_sample_opts *o, ct_denoise_fn fn, void *user,
                          const ct_denoise_cond *bc, int cfg, int C, int H, int W, float *x,
                          float *in, float *eps, ct_err *err) {
  const size_t n = (size_t)C * H * W;
  const float t = s->timesteps[s->step_index];
  ct_dsched_scale_input(s, x, n, in);
  if (cfg) ct_dsched_scale_input(s, x, n, in + n);
  ct_status st = fn(user, in, cfg ? 2 : 1, C, H, W, t, bc, eps, err);
  if (st) return st;
  if (cfg) {
    const float g = (float)o->guidance_scale;
    float *u = eps, *tx = eps + n;
    for (size_t i = 0; i < n; i++) u[i] = u[i] + g * (tx[i] - u[i]);
    if (o->guidance_rescale > 0) ct_rescale_noise_cfg(u, tx, n, o->guidance_rescale);
  }
  for (size_t i = 0; i < n; i++)
    if (!isfinite(eps[i]))
      return ct_errf(err, CT_ERR_NUMERIC, "the denoiser's output is not finite at step %d (t %g)",
                     s->step_index, (double)t);
  return ct_dsched_step(s, eps, x, n, err);
}

ct_status ct_sdxl_denoise(const ct_ddpm_config *cfg, const ct_sdxl_sample_opts *o, ct_denoise_fn fn,
                          void *user, const ct_denoise_cond *cond, const ct_denoise_cond *uncond,
                          int C, int H, int W, float *x, ct_err *err) {
  const int use_cfg = o->guidance_scale > 1.0;
  if (use_cfg && !uncond)
    return ct_errf(err, CT_ERR_INVALID, "guidance_scale %g needs the negative conditioning",
                   o->guidance_scale);
  if (!(o->guidance_rescale >= 0 && o->guidance_rescale <= 1))
    return ct_errf(err, CT_ERR_RANGE, "guidance_rescale must be in [0, 1], got %g",
                   o->guidance_rescale);
  ct_dsched *s = malloc(sizeof *s);
  if (!s) return ct_errf(err, CT_ERR_NOMEM, "sampler");
  ct_status st = ct_dsched_init(s, cfg, o->steps, err);
  const size_t n = (size_t)C * H * W;
  float *in = NULL, *eps = NULL, *cbuf = NULL;
  ct_denoise_cond bc = *cond;
  if (!st && use_cfg) st = batch_cond(cond, uncond, &cbuf, &bc, err);
  if (!st) {
    in = malloc(2 * n * sizeof(float));
    eps = malloc(2 * n * sizeof(float));
    if (!in || !eps) st = ct_errf(err, CT_ERR_NOMEM, "sampling buffers");
  }
  if (!st)
    for (size_t i = 0; i < n; i++) x[i] = x[i] * s->init_noise_sigma;
  while (!st && s->step_index < s->n)
    st = one_step(s, o, fn, user, &bc, use_cfg, C, H, W, x, in, eps, err);
  free(in);
  free(eps);
  free(cbuf);
  ct_dsched_free(s);
  free(s);
  return st;
}

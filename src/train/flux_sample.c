/* Sampling a FLUX.1 pipeline directory as diffusers' FluxPipeline.__call__
 * does (`ctuner sample --pretrained DIR`): prompts through CLIP-L + T5
 * (textcond.c), the sigmas and timesteps of its FlowMatchEulerDiscreteScheduler
 * (fm_sched.c: linspace(1, 1/N, N), dynamic shifting with mu from the image's
 * token count, or the static shift), Euler steps x += (sigma_next - sigma) v, the guidance input
 * for guidance_embeds models (FluxPipeline's guidance_scale; no CFG pass), then the VAE. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ctuner/alloc.h"
#include "ctuner/codec.h"
#include "ctuner/lora_tools.h"
#include "ctuner/rng.h"
#include "ctuner/train.h"
#include "train/flux_pipe.h"
#include "train/textcond.h"
#include "train_int.h"

struct ct_flux_sampler {
  ct_flux_pipe p;
  ct_textcond *tc;
  ct_mmdit *m;
  ct_codec codec;
  float *ref; /* Kontext: the reference latent (C, rh, rw), or NULL */
  int rh, rw;
};

void ct_flux_sampler_free(ct_flux_sampler *s) {
  if (!s) return;
  ct_textcond_free(s->tc);
  ct_mmdit_free(s->m);
  ct_codec_free(&s->codec);
  free(s->ref);
  free(s);
}

static ct_status open_transformer(ct_flux_sampler *s, const char *tdir, ct_err *err) {
  if (tdir) return ct_mmdit_open_diffusers(tdir, 0, &s->m, err);
  if (!s->p.transformer_bfl) return ct_mmdit_open_diffusers(s->p.transformer, 0, &s->m, err);
  ct_status st = ct_mmdit_new(&s->p.tcfg, 0, 0, &s->m, err);
  return st ? st : ct_mmdit_load(s->m, s->p.transformer, s->p.bfl_prefix, err);
}

ct_status ct_flux_sampler_open(const char *dir, const char *flavour, int max_sequence_length,
                               const char *transformer_dir, ct_flux_sampler **out, ct_err *err) {
  *out = NULL;
  ct_flux_sampler *s = calloc(1, sizeof *s);
  if (!s) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_config cfg;
  ct_config_defaults(&cfg);
  ct_status st = ct_config_set(&cfg, "pretrained_model_name_or_path", dir, err);
  if (!st && flavour) st = ct_config_set(&cfg, "model_flavour", flavour, err);
  if (!st) st = ct_train_resolve_hub(&cfg, 1, err); /* a hub id (docs/hub.md) */
  if (!st) st = ct_config_validate(&cfg, err);
  if (!st) st = ct_flux_pipe_open(&cfg, 0, &s->p, err);
  ct_config_free(&cfg);
  if (!st && max_sequence_length > 0) s->p.max_sequence_length = max_sequence_length;
  if (!st) st = ct_textcond_flux(&s->p, 0, &s->tc, err);
  if (!st) st = open_transformer(s, transformer_dir, err);
  if (!st && transformer_dir) { /* a trained transformer: the same widths as the pipeline's */
    const ct_mmdit_config *c = ct_mmdit_cfg(s->m);
    if (c->context_in_dim != s->p.tcfg.context_in_dim || c->vec_in_dim != s->p.tcfg.vec_in_dim ||
        c->in_channels != s->p.tcfg.in_channels)
      st = ct_errf(err, CT_ERR_SHAPE, "%s does not fit the pipeline %s (other widths)",
                   transformer_dir, dir);
  }
  if (!st) st = ct_codec_vae(s->p.vae, 0, 0, &s->codec, err);
  if (st) {
    ct_flux_sampler_free(s);
    return st;
  }
  *out = s;
  return CT_OK;
}

void ct_flux_sampler_noise(uint64_t seed, uint64_t index, size_t lat, float *x) {
  ct_rng_fill_normal(x, lat, seed, CT_STREAM_SAMPLE_NOISE, index * lat, 0.0f, 1.0f);
}

ct_status ct_flux_sampler_lora(ct_flux_sampler *s, const char *path, double lora_scale,
                               ct_err *err) {
  return ct_lora_merge_file(s->m, path, lora_scale, err);
}

/* FluxKontextPipeline's image: encoded with the latent mean (_encode_vae_image,
 * sample_mode "argmax"), (mean - shift_factor) * scaling_factor; its resizing
 * is the caller's (ct_kontext_reference_size). */
ct_status ct_flux_sampler_reference(ct_flux_sampler *s, const ct_image *ref, ct_err *err) {
  const int f = s->codec.factor, C = ct_mmdit_cfg(s->m)->in_channels;
  if (ref->w % (2 * f) || ref->h % (2 * f))
    return ct_errf(err, CT_ERR_INVALID,
                   "reference image %dx%d: FluxKontextPipeline would resize it to multiples of %d",
                   ref->w, ref->h, 2 * f);
  float *lat = malloc((size_t)C * (ref->h / f) * (ref->w / f) * sizeof *lat);
  if (!lat) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = ct_codec_encode_mean(&s->codec, ref->px, ref->w, ref->h, lat, err);
  if (st) {
    free(lat);
    return st;
  }
  free(s->ref);
  s->ref = lat, s->rh = ref->h / f, s->rw = ref->w / f;
  return CT_OK;
}

int ct_flux_sampler_factor(const ct_flux_sampler *s) {
  return s->codec.factor;
}

ct_status ct_flux_sampler_run(ct_flux_sampler *s, const char *const *prompts, int n, int width,
                              int height, int steps, float guidance, float *x, ct_image *out,
                              ct_err *err) {
  const ct_mmdit_config *mc = ct_mmdit_cfg(s->m);
  const int f = s->codec.factor, C = mc->in_channels, T = s->tc->T;
  if (width <= 0 || height <= 0 || width % (2 * f) || height % (2 * f))
    return ct_errf(err, CT_ERR_INVALID, "image size %dx%d must be positive multiples of %d", width,
                   height, 2 * f);
  if (steps < 1 || steps > 1000) return ct_errf(err, CT_ERR_INVALID, "steps must be 1..1000");
  const int h = height / f, w = width / f;
  const size_t lat = (size_t)C * h * w;
  float *txt = ct_alloc(CT_MEM_BUFFERS, (size_t)n * T * s->tc->d * sizeof(float));
  float *y = ct_alloc(CT_MEM_BUFFERS, (size_t)n * s->tc->dp * sizeof(float));
  float *v = ct_alloc(CT_MEM_BUFFERS, (size_t)n * lat * sizeof(float));
  float *tt = malloc((size_t)n * sizeof *tt), *gg = malloc((size_t)n * sizeof *gg);
  float *sg = malloc(((size_t)steps + 1) * sizeof *sg), *ts = malloc((size_t)steps * sizeof *ts);
  uint8_t *rgb = malloc((size_t)width * height * 3);
  /* Kontext: the reference latent for every prompt (prepare_latents repeats it) */
  const size_t rl = s->ref ? (size_t)C * s->rh * s->rw : 0;
  float *refs = rl ? malloc((size_t)n * rl * sizeof *refs) : NULL;
  for (int b = 0; refs && b < n; b++) memcpy(refs + (size_t)b * rl, s->ref, rl * sizeof *refs);
  ct_status st = txt && y && v && tt && gg && sg && ts && rgb && (!rl || refs)
                     ? ct_textcond_encode(s->tc, prompts, n, txt, y, err)
                     : ct_errf(err, CT_ERR_NOMEM, "out of memory while sampling");
  if (!st) /* the scheduler's sigmas (fm_sched.c): mu from the packed image's token count */
    st = ct_fm_flux_timesteps(&s->p.sched, steps, (long)(h / 2) * (w / 2), sg, ts, err);
  for (int k = 0; k < steps && !st; k++) {
    /* the pipeline passes timestep / 1000 in float32 */
    const float t = ts[k] / 1000.0f;
    for (int b = 0; b < n; b++) tt[b] = t, gg[b] = guidance;
    ct_mmdit_batch in = {.B = n,
                         .H = h,
                         .W = w,
                         .T = T,
                         .x = x,
                         .t = tt,
                         .txt = txt,
                         .y = y,
                         .guidance = mc->guidance_embed ? gg : NULL};
    st = ct_mmdit_forward_ref(s->m, &in, refs, s->rh, s->rw, v, err);
    if (!st) ct_fm_step(sg, k, v, x, (size_t)n * lat);
  }
  for (int i = 0; out && i < n && !st; i++) {
    st = ct_codec_decode(&s->codec, x + (size_t)i * lat, width, height, rgb, err);
    if (!st) st = ct_image_alloc(width, height, &out[i], err);
    if (!st) memcpy(out[i].px, rgb, (size_t)width * height * 3);
    if (st)
      for (int j = 0; j < i; j++) ct_image_free(&out[j]);
  }
  ct_free(txt), ct_free(y), ct_free(v);
  free(tt), free(gg), free(sg), free(ts), free(rgb), free(refs);
  return st;
}

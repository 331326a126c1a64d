/* Euler sampling of the rectified flow with classifier-free guidance
 * (MODEL.md): x <- x + (t_next - t) v from t = 1 to 0, v = v_u + g (v_c - v_u),
 * then the pixel codec decodes the latent. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/backend.h"
#include "ctuner/codec.h"
#include "ctuner/rng.h"
#include "ctuner/train.h"
#include "train_int.h"

float ct_flow_shift_t(float t, float shift) {
  if (shift == 1.0f || shift <= 0.0f) return t; /* 0: no static shift (SimpleTuner) */
  return shift * t / (1.0f + (shift - 1.0f) * t);
}

/* FluxPipeline's calculate_shift: mu linear in the image token count from
 * (256, 0.5) to (4096, 1.15); its time_shift(mu, 1, t) is the static shift
 * with s = e^mu, which is what SimpleTuner's flow_schedule_auto_shift uses. */
float ct_flow_auto_shift(long tokens) {
  const double m = (1.15 - 0.5) / (4096.0 - 256.0), b = 0.5 - m * 256.0;
  return (float)exp(m * (double)tokens + b);
}

ct_status ct_encode_prompts(ct_textenc *te, int T, const char *const *prompts, int n, float *txt,
                            float *y, ct_err *err) {
  int32_t *ids = malloc((size_t)n * T * sizeof *ids);
  if (!ids) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (int i = 0; i < n; i++) ct_textenc_tokenize(te, prompts[i], T, ids + (size_t)i * T);
  ct_status st = ct_textenc_encode(te, ids, n, T, txt, y, err);
  free(ids);
  return st;
}

ct_status ct_sample_images_with(ct_mmdit *m, ct_prompt_encode_fn encode, void *ctx, int T,
                                const ct_codec *codec, const char *const *prompts, int n,
                                uint64_t index0, const ct_sample_opts *o, ct_image *out,
                                ct_err *err) {
  const ct_mmdit_config *mc = ct_mmdit_cfg(m);
  const int C = mc->in_channels, d = mc->context_in_dim, dv = mc->vec_in_dim, s = codec->factor;
  if (C != codec->channels)
    return ct_errf(err, CT_ERR_SHAPE, "model has %d latent channels; the %s codec (%s) gives %d", C,
                   codec->kind, codec->tag, codec->channels);
  if (o->width <= 0 || o->height <= 0 || o->width % (2 * s) || o->height % (2 * s))
    return ct_errf(err, CT_ERR_INVALID, "image size %dx%d must be positive multiples of %d",
                   o->width, o->height, 2 * s);
  if (o->steps < 1) return ct_errf(err, CT_ERR_INVALID, "sampling steps must be >= 1");
  const int h = o->height / s, w = o->width / s;
  const size_t lat = (size_t)C * h * w;
  const int gemb = mc->guidance_embed; /* distilled guidance: an input, no CFG pass */
  const int cfg = !gemb && o->guidance > 1.0f && !o->sched; /* FluxPipeline: no CFG pass */
  const int B = cfg ? 2 * n : n; /* conditional rows first, then unconditional */
  ct_status st = CT_OK;
  float *x = ct_alloc(CT_MEM_BUFFERS, (size_t)n * lat * sizeof(float));
  float *xin = ct_alloc(CT_MEM_BUFFERS, (size_t)B * lat * sizeof(float));
  float *v = ct_alloc(CT_MEM_BUFFERS, (size_t)B * lat * sizeof(float));
  float *txt = ct_alloc(CT_MEM_BUFFERS, (size_t)B * T * d * sizeof(float));
  float *y = ct_alloc(CT_MEM_BUFFERS, (size_t)B * dv * sizeof(float));
  float *tt = ct_alloc(CT_MEM_BUFFERS, (size_t)B * sizeof(float));
  float *gg = ct_alloc(CT_MEM_BUFFERS, (size_t)B * sizeof(float));
  uint8_t *rgb = malloc((size_t)o->width * o->height * 3);
  const char **all = malloc((size_t)B * sizeof *all);
  float *sg = malloc(((size_t)o->steps + 1) * sizeof *sg),
        *ts = malloc((size_t)o->steps * sizeof *ts);
  /* the model's inputs and output in its backend's memory: the host buffers
   * themselves, or (no host memory) twins the host ones are copied through */
  const ct_backend_ops *be = ct_mmdit_backend(m);
  const int twins = !be->host_memory;
  float *dbuf[6] = {0}; /* xin, v, txt, y, tt, gg */
  const size_t dn[6] = {(size_t)B * lat, (size_t)B * lat, (size_t)B * T * d,
                        (size_t)B * dv,  (size_t)B,       (size_t)B};
  for (int i = 0; twins && i < 6; i++)
    if (!(dbuf[i] = be->alloc(CT_MEM_BUFFERS, dn[i] * sizeof(float)))) st = CT_ERR_NOMEM;
  if (!x || !xin || !v || !txt || !y || !tt || !gg || !rgb || !all || !sg || !ts || st) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory while sampling %d images", n);
    goto done;
  }
  for (int i = 0; i < n; i++) {
    all[i] = prompts[i];
    if (cfg) all[n + i] = o->negative ? o->negative : "";
    ct_rng_fill_normal(x + (size_t)i * lat, lat, o->seed, CT_STREAM_SAMPLE_NOISE,
                       (index0 + (uint64_t)i) * lat, 0.0f, 1.0f);
  }
  st = encode(ctx, all, B, txt, y, err);
  if (st) goto done;
  if (twins) {
    be->copy_in(dbuf[2], txt, dn[2] * sizeof(float));
    be->copy_in(dbuf[3], y, dn[3] * sizeof(float));
  }
  const float shift = o->auto_shift ? ct_flow_auto_shift((long)(h / 2) * (w / 2)) : o->flow_shift;
  if (o->sched) /* FluxPipeline's schedule: mu from the packed image's token count */
    st = ct_fm_flux_timesteps(o->sched, o->steps, (long)(h / 2) * (w / 2), sg, ts, err);
  for (int k = 0; k < o->steps && !st; k++) {
    /* the pipeline passes timestep / 1000 in float32 */
    float t = o->sched ? ts[k] / 1000.0f : ct_flow_shift_t(1.0f - (float)k / o->steps, shift);
    float tn = o->sched ? sg[k + 1] : ct_flow_shift_t(1.0f - (float)(k + 1) / o->steps, shift);
    memcpy(xin, x, (size_t)n * lat * sizeof(float));
    if (cfg) memcpy(xin + (size_t)n * lat, x, (size_t)n * lat * sizeof(float));
    for (int b = 0; b < B; b++) tt[b] = t, gg[b] = o->guidance;
    for (int i = 0; twins && i < 6; i++)
      if (i == 0 || i >= 4) be->copy_in(dbuf[i], i == 0 ? xin : i == 4 ? tt : gg, dn[i] * 4);
    ct_mmdit_batch in = {.B = B,
                         .H = h,
                         .W = w,
                         .T = T,
                         .x = twins ? dbuf[0] : xin,
                         .t = twins ? dbuf[4] : tt,
                         .txt = twins ? dbuf[2] : txt,
                         .y = twins ? dbuf[3] : y,
                         .guidance = gemb ? (twins ? dbuf[5] : gg) : NULL};
    st = ct_mmdit_forward(m, &in, twins ? dbuf[1] : v, err);
    if (st) break;
    if (twins) be->copy_out(v, dbuf[1], dn[1] * sizeof(float));
    const float g = o->guidance, dt = tn - t;
    if (o->sched) { /* the scheduler's step, as FluxPipeline (no CFG pass) */
      ct_fm_step(sg, k, v, x, (size_t)n * lat);
      continue;
    }
    for (size_t i = 0; i < (size_t)n * lat; i++) {
      float vi = v[i];
      if (cfg) {
        float vu = v[(size_t)n * lat + i];
        vi = vu + g * (vi - vu);
      }
      x[i] += dt * vi;
    }
  }
  for (int i = 0; i < n && !st; i++) {
    st = ct_codec_decode(codec, x + (size_t)i * lat, o->width, o->height, rgb, err);
    if (!st) st = ct_image_alloc(o->width, o->height, &out[i], err);
    if (!st) memcpy(out[i].px, rgb, (size_t)o->width * o->height * 3);
    if (st)
      for (int j = 0; j < i; j++) ct_image_free(&out[j]);
  }
done:
  for (int i = 0; i < 6; i++) be->free(dbuf[i]);
  ct_free(x);
  ct_free(xin);
  ct_free(v);
  ct_free(txt);
  ct_free(y);
  ct_free(tt);
  ct_free(gg);
  free(rgb);
  free(all);
  free(sg);
  free(ts);
  return st;
}

typedef struct te_ctx {
  ct_textenc *te;
  int T;
} te_ctx;

static ct_status te_encode(void *ctx, const char *const *prompts, int n, float *txt, float *y,
                           ct_err *err) {
  const te_ctx *c = ctx;
  return ct_encode_prompts(c->te, c->T, prompts, n, txt, y, err);
}

ct_status ct_sample_images(ct_mmdit *m, ct_textenc *te, int T, const ct_codec *codec,
                           const char *const *prompts, int n, uint64_t index0,
                           const ct_sample_opts *o, ct_image *out, ct_err *err) {
  const ct_mmdit_config *mc = ct_mmdit_cfg(m);
  if (mc->context_in_dim != mc->vec_in_dim)
    return ct_errf(err, CT_ERR_SHAPE,
                   "context_in_dim %d != vec_in_dim %d: one text encoder cannot feed both",
                   mc->context_in_dim, mc->vec_in_dim);
  te_ctx c = {te, T};
  return ct_sample_images_with(m, te_encode, &c, T, codec, prompts, n, index0, o, out, err);
}

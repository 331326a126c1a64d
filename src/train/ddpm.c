/* DDPMScheduler's noise schedule and SimpleTuner's epsilon / v_prediction
 * objective (ctuner/diffusion.h, docs/sdxl.md), float32 where torch computes
 * in float32:
 *
 *   betas "scaled_linear" = linspace(sqrt(beta_start), sqrt(beta_end), N)^2,
 *         "linear"        = linspace(beta_start, beta_end, N)
 *         (diffusers 0.42.1 schedulers/scheduling_ddpm.py DDPMScheduler.__init__;
 *          torch's CPU linspace: start + step i below N/2, end - step (N-1-i) above)
 *   alphas_cumprod = cumprod(1 - betas)  (torch's CPU cumprod accumulates in double)
 *   add_noise    = sqrt(ac[t]) x0 + sqrt(1 - ac[t]) noise        (DDPMScheduler.add_noise)
 *   get_velocity = sqrt(ac[t]) noise - sqrt(1 - ac[t]) x0        (DDPMScheduler.get_velocity)
 *   snr          = (sqrt(ac) / sqrt(1 - ac))^2                   (training_utils.compute_snr)
 *   weight       = min(snr, snr_gamma) / snr   (epsilon), / (snr + 1) (v_prediction)
 *                  (SimpleTuner simpletuner/helpers/models/common.py, the min-SNR branch of
 *                   the loss: torch.stack([snr, snr_gamma * ones]).min(dim=1)[0] / snr_divisor)
 *   loss         = mean over (b, c, h, w) of weight[b] (pred - target)^2
 *
 * No FMA contraction (torch does none on these elementwise ops). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif
#include <math.h>
#include <string.h>

#include "ctuner/diffusion.h"
#include "ctuner/rng.h"

/* Philox streams of the objective's draws (train_int.h's are the MMDiT's). */
#define STREAM_DDPM_T 0x4444504d54000000ull       /* "DDPMT": the timestep */
#define STREAM_DDPM_NOISE 0x4444504d4e000000ull   /* "DDPMN": eps, offset id * n */
#define STREAM_DDPM_OFFSET 0x4444504d4f000000ull  /* "DDPMO": noise_offset, id * (C + 1) */
#define STREAM_DDPM_PERTURB 0x4444504d50000000ull /* "DDPMP": input_perturbation, id * n */

void ct_ddpm_config_sdxl(ct_ddpm_config *c) {
  memset(c, 0, sizeof *c);
  c->num_train_timesteps = 1000;
  c->beta_start = 0.00085;
  c->beta_end = 0.012;
  c->beta_schedule = CT_BETA_SCALED_LINEAR;
  c->prediction_type = CT_PRED_EPSILON;
  c->timestep_spacing = CT_SPACING_LEADING;
  c->steps_offset = 1;
  c->set_alpha_to_one = 0;
  c->kind = CT_SCHED_EULER;
}

/* torch.linspace(a, b, n, dtype=float32) on the CPU. */
static void linspace_f32(float a, float b, int n, float *out) {
  if (n == 1) {
    out[0] = a;
    return;
  }
  const float step = (b - a) / (float)(n - 1);
  const int half = n / 2;
  for (int i = 0; i < n; i++)
    out[i] = i < half ? a + step * (float)i : b - step * (float)(n - 1 - i);
}

ct_status ct_ddpm_alphas_cumprod(const ct_ddpm_config *c, float *ac, ct_err *err) {
  const int n = c->num_train_timesteps;
  if (n < 1 || n > CT_DDPM_MAX_STEPS)
    return ct_errf(err, CT_ERR_RANGE, "num_train_timesteps %d is outside [1, %d]", n,
                   CT_DDPM_MAX_STEPS);
  if (!(c->beta_start > 0 && c->beta_end >= c->beta_start && c->beta_end < 1))
    return ct_errf(err, CT_ERR_RANGE,
                   "betas must satisfy 0 < beta_start <= beta_end < 1, got %g, %g", c->beta_start,
                   c->beta_end);
  if (c->beta_schedule == CT_BETA_SCALED_LINEAR) {
    /* beta_start**0.5 is a Python float (double), cast once to float32 */
    linspace_f32((float)sqrt(c->beta_start), (float)sqrt(c->beta_end), n, ac);
    for (int i = 0; i < n; i++) ac[i] = ac[i] * ac[i];
  } else {
    linspace_f32((float)c->beta_start, (float)c->beta_end, n, ac);
  }
  double prod = 1.0;
  for (int i = 0; i < n; i++) {
    const float alpha = 1.0f - ac[i];
    prod *= (double)alpha;
    ac[i] = (float)prod;
  }
  return CT_OK;
}

void ct_ddpm_add_noise(const float *ac, const long *t, int B, size_t n, const float *x0,
                       const float *noise, float *out) {
  for (int b = 0; b < B; b++) {
    const float sa = sqrtf(ac[t[b]]), so = sqrtf(1.0f - ac[t[b]]);
    const size_t o = (size_t)b * n;
    for (size_t i = 0; i < n; i++) out[o + i] = sa * x0[o + i] + so * noise[o + i];
  }
}

void ct_ddpm_velocity(const float *ac, const long *t, int B, size_t n, const float *x0,
                      const float *noise, float *out) {
  for (int b = 0; b < B; b++) {
    const float sa = sqrtf(ac[t[b]]), so = sqrtf(1.0f - ac[t[b]]);
    const size_t o = (size_t)b * n;
    for (size_t i = 0; i < n; i++) out[o + i] = sa * noise[o + i] - so * x0[o + i];
  }
}

float ct_ddpm_snr(const float *ac, long t) {
  const float a = sqrtf(ac[t]), s = sqrtf(1.0f - ac[t]);
  const float r = a / s;
  return r * r;
}

float ct_ddpm_loss_weight(const ct_ddpm_objective *o, const float *ac, long t) {
  if (!(o->snr_gamma > 0)) return (float)o->snr_weight;
  const float snr = ct_ddpm_snr(ac, t), gamma = (float)o->snr_gamma;
  const float div = o->prediction_type == CT_PRED_V ? snr + 1.0f : snr;
  return (snr < gamma ? snr : gamma) / div;
}

double ct_ddpm_perturbation(const ct_ddpm_objective *o, long global_step) {
  double s = o->input_perturbation;
  if (!(s > 0)) return 0;
  if (o->input_perturbation_steps > 0)
    s = global_step < o->input_perturbation_steps
            ? s * (1.0 - (double)global_step / (double)o->input_perturbation_steps)
            : 0.0;
  return s > 0 ? s : 0;
}

void ct_ddpm_draw(const ct_ddpm_objective *o, int num_train_timesteps, uint64_t seed, uint64_t id,
                  long global_step, int C, size_t hw, long *t, float *noise, float *noise_in) {
  const size_t n = (size_t)C * hw;
  long ti = (long)(ct_rng_uniform(seed, STREAM_DDPM_T, id) * (float)num_train_timesteps);
  *t = ti < 0 ? 0 : ti >= num_train_timesteps ? num_train_timesteps - 1 : ti;
  ct_rng_fill_normal(noise, n, seed, STREAM_DDPM_NOISE, id * n, 0.0f, 1.0f);
  const uint64_t ob = id * (uint64_t)(C + 1);
  if (o->noise_offset > 0 &&
      (o->noise_offset_probability >= 1.0 ||
       ct_rng_uniform(seed, STREAM_DDPM_OFFSET, ob) < (float)o->noise_offset_probability)) {
    for (int c = 0; c < C; c++) {
      const float off =
          (float)o->noise_offset * ct_rng_normal(seed, STREAM_DDPM_OFFSET, ob + 1 + c);
      for (size_t i = 0; i < hw; i++) noise[(size_t)c * hw + i] += off;
    }
  }
  const double p = ct_ddpm_perturbation(o, global_step);
  if (noise_in == noise) return;
  if (!(p > 0)) {
    memcpy(noise_in, noise, n * sizeof(float));
    return;
  }
  ct_rng_fill_normal(noise_in, n, seed, STREAM_DDPM_PERTURB, id * n, 0.0f, 1.0f);
  for (size_t i = 0; i < n; i++) noise_in[i] = noise[i] + (float)p * noise_in[i];
}

void ct_ddpm_target(const ct_ddpm_objective *o, const float *ac, const long *t, int B, size_t n,
                    const float *x0, const float *noise, float *out) {
  if (o->prediction_type == CT_PRED_V)
    ct_ddpm_velocity(ac, t, B, n, x0, noise, out);
  else
    memcpy(out, noise, (size_t)B * n * sizeof(float));
}

double ct_ddpm_loss(const ct_ddpm_objective *o, const float *ac, const long *t, int B, size_t n,
                    const float *pred, const float *target, float *grad) {
  double total = 0;
  const double inv = 1.0 / ((double)B * (double)n);
  for (int b = 0; b < B; b++) {
    const double w = ct_ddpm_loss_weight(o, ac, t[b]);
    double s = 0;
    const size_t off = (size_t)b * n;
    for (size_t i = 0; i < n; i++) {
      const double d = (double)pred[off + i] - (double)target[off + i];
      s += d * d;
      if (grad) grad[off + i] = (float)(2.0 * w * d * inv);
    }
    total += w * s;
  }
  return total * inv;
}

void ct_sdxl_time_ids(int inter_h, int inter_w, int crop_top, int crop_left, int lat_h, int lat_w,
                      int vae_factor, int dropped, float out[6]) {
  const float v[6] = {(float)inter_h,
                      (float)inter_w,
                      (float)crop_top,
                      (float)crop_left,
                      (float)(lat_h * vae_factor),
                      (float)(lat_w * vae_factor)};
  for (int i = 0; i < 6; i++) out[i] = dropped ? 0.0f : v[i];
}

/* StableDiffusionXLPipeline's sampling schedulers (ctuner/diffusion.h,
 * docs/sdxl.md), diffusers 0.42.1, as StableDiffusionXLPipeline drives them
 * (set_timesteps, init_noise_sigma, scale_model_input, step):
 *
 * - EulerDiscreteScheduler (schedulers/scheduling_euler_discrete.py): sigmas
 *   sqrt((1 - ac) / ac) interpolated (np.interp) at the timesteps, a final 0;
 *   init_noise_sigma sqrt(max sigma^2 + 1) ("leading") or max sigma; input
 *   scaled by 1/sqrt(sigma^2 + 1); x0 = x - sigma eps (epsilon) or
 *   -sigma/sqrt(sigma^2+1) v + x/(sigma^2+1) (v_prediction); x += (x - x0)/sigma dt.
 *   s_churn 0, so no noise is added.
 * - DDIMScheduler (scheduling_ddim.py), eta 0: x0 from eps or v, then
 *   sqrt(ac_prev) x0 + sqrt(1 - ac_prev) eps; ac_prev of t - T/N, or the
 *   final alpha (1 with set_alpha_to_one, else ac[0]).
 * - DPMSolverMultistepScheduler (scheduling_dpmsolver_multistep.py) as
 *   "DPM++ 2M": algorithm dpmsolver++, order 2, midpoint, lower_order_final,
 *   final sigma 0; x0 predictions, first order at the first and last step.
 *
 * Timesteps by timestep_spacing exactly as set_timesteps spells them
 * (numpy's round is half to even: rint). Elementwise in float32 as torch,
 * without FMA contraction; the set-up in double where numpy is. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/diffusion.h"

/* sigmas = float32(sqrt((1 - ac) / ac)) (torch), then np.interp(ts) in double. */
static void interp_sigmas(const float *ac, int T, const double *ts, int n, float *out) {
  for (int i = 0; i < n; i++) {
    double x = ts[i];
    if (x <= 0) x = 0;
    if (x >= T - 1) x = T - 1;
    int j = (int)floor(x);
    if (j >= T - 1) j = T - 2 < 0 ? 0 : T - 2;
    const double f0 = sqrtf((1.0f - ac[j]) / ac[j]);
    const double f1 = T > 1 ? sqrtf((1.0f - ac[j + 1]) / ac[j + 1]) : f0;
    double v = x == (double)j ? f0 : (f1 - f0) * (x - (double)j) + f0; /* numpy's interp */
    if (x == (double)(j + 1)) v = f1;
    out[i] = (float)v;
  }
  out[n] = 0.0f; /* final_sigmas_type "zero" */
}

/* The timesteps of set_timesteps(n) (doubles, as numpy holds them before
 * the cast); dpm: DPMSolverMultistep's leading/linspace over n + 1 points. */
static void spaced(const ct_ddpm_config *c, int n, int dpm, double *ts) {
  const int T = c->num_train_timesteps;
  if (c->timestep_spacing == CT_SPACING_LINSPACE) {
    /* np.linspace(0, T - 1, m): i * step, the last exactly T - 1; reversed
     * (DPM: m = n + 1 and the final 0 dropped). Euler keeps it as float32,
     * DDIM and DPM round it. */
    const int m = dpm ? n + 1 : n;
    const double hi = T - 1, step = m > 1 ? hi / (double)(m - 1) : 0;
    for (int i = 0; i < m; i++) {
      const double v = i == m - 1 && m > 1 ? hi : (double)i * step;
      if (m - 1 - i < n) ts[m - 1 - i] = c->kind == CT_SCHED_EULER ? (double)(float)v : rint(v);
    }
  } else if (c->timestep_spacing == CT_SPACING_LEADING) {
    const long ratio = dpm ? T / (n + 1) : T / n;
    for (int i = 0; i < n; i++) ts[i] = (double)((long)(n - 1 - i + dpm) * ratio + c->steps_offset);
  } else { /* trailing: np.arange(T, 0, -T/n).round() - 1 */
    const double ratio = (double)T / (double)n;
    for (int i = 0; i < n; i++) ts[i] = rint((double)T - (double)i * ratio) - 1.0;
  }
}

ct_status ct_dsched_init(ct_dsched *s, const ct_ddpm_config *cfg, int steps, ct_err *err) {
  memset(s, 0, sizeof *s);
  s->cfg = *cfg;
  const int T = cfg->num_train_timesteps;
  ct_status st = ct_ddpm_alphas_cumprod(cfg, s->ac, err);
  if (st) return st;
  if (steps < 1 || steps > T)
    return ct_errf(err, CT_ERR_RANGE, "%d inference steps: must be in [1, num_train_timesteps %d]",
                   steps, T);
  double *ts = malloc((size_t)(steps + 2) * sizeof *ts);
  if (!ts) return ct_errf(err, CT_ERR_NOMEM, "sampler timesteps");
  const int dpm = cfg->kind == CT_SCHED_DPMPP_2M;
  spaced(cfg, steps, dpm, ts);
  s->n = steps;
  for (int i = 0; i < steps; i++) {
    if (ts[i] < 0 || ts[i] > T - 1) {
      const double bad = ts[i];
      free(ts);
      return ct_errf(err, CT_ERR_RANGE,
                     "timestep %g of %d steps is outside [0, %d) (steps_offset %d with %s spacing)",
                     bad, steps, T, cfg->steps_offset,
                     cfg->timestep_spacing == CT_SPACING_LEADING ? "leading" : "this");
    }
    s->timesteps[i] = (float)ts[i];
  }
  if (cfg->kind != CT_SCHED_DDIM) interp_sigmas(s->ac, T, ts, steps, s->sigmas);
  free(ts);
  s->init_noise_sigma = 1.0f;
  if (cfg->kind == CT_SCHED_EULER) {
    float mx = 0;
    for (int i = 0; i <= steps; i++) mx = s->sigmas[i] > mx ? s->sigmas[i] : mx;
    s->init_noise_sigma = cfg->timestep_spacing == CT_SPACING_LEADING ? sqrtf(mx * mx + 1.0f) : mx;
  }
  return CT_OK;
}

void ct_dsched_free(ct_dsched *s) {
  free(s->prev);
  s->prev = NULL;
}

void ct_dsched_scale_input(const ct_dsched *s, const float *x, size_t n, float *out) {
  if (s->cfg.kind != CT_SCHED_EULER) {
    if (out != x) memcpy(out, x, n * sizeof *x);
    return;
  }
  const float sg = s->sigmas[s->step_index];
  const float d = sqrtf(sg * sg + 1.0f);
  for (size_t i = 0; i < n; i++) out[i] = x[i] / d;
}

static void euler_step(const ct_dsched *s, const float *eps, float *x, size_t n) {
  const float sg = s->sigmas[s->step_index], dt = s->sigmas[s->step_index + 1] - sg;
  const float sq = sg * sg + 1.0f, c = -sg / sqrtf(sq);
  for (size_t i = 0; i < n; i++) {
    const float x0 =
        s->cfg.prediction_type == CT_PRED_V ? eps[i] * c + x[i] / sq : x[i] - sg * eps[i];
    const float der = (x[i] - x0) / sg;
    x[i] = x[i] + der * dt;
  }
}

static void ddim_step(const ct_dsched *s, const float *out, float *x, size_t n) {
  const int T = s->cfg.num_train_timesteps;
  const long t = (long)s->timesteps[s->step_index], prev = t - T / s->n;
  const float at = s->ac[t];
  const float ap = prev >= 0 ? s->ac[prev] : s->cfg.set_alpha_to_one ? 1.0f : s->ac[0];
  const float bt = 1.0f - at, sa = sqrtf(at), sb = sqrtf(bt);
  const float sap = sqrtf(ap), dir = sqrtf(1.0f - ap - 0.0f);
  for (size_t i = 0; i < n; i++) {
    float x0, e;
    if (s->cfg.prediction_type == CT_PRED_V) {
      x0 = sa * x[i] - sb * out[i];
      e = sa * out[i] + sb * x[i];
    } else {
      x0 = (x[i] - sb * out[i]) / sa;
      e = out[i];
    }
    x[i] = sap * x0 + dir * e;
  }
}

/* _sigma_to_alpha_sigma_t and lambda = log(alpha) - log(sigma). */
static void alpha_sigma(float sigma, float *a, float *sg, float *lambda) {
  *a = 1.0f / sqrtf(sigma * sigma + 1.0f);
  *sg = sigma * *a;
  *lambda = logf(*a) - logf(*sg);
}

static ct_status dpm_step(ct_dsched *s, const float *out, float *x, size_t n, ct_err *err) {
  const int i = s->step_index, N = s->n;
  if (!s->prev || s->prev_n != n) {
    free(s->prev);
    s->prev = calloc(n * 2, sizeof(float));
    if (!s->prev) return ct_errf(err, CT_ERR_NOMEM, "DPM++ 2M history");
    s->prev_n = n;
    s->lower_order_nums = 0;
  }
  float *m1 = s->prev, *m0 = s->prev + n; /* the previous and this step's x0 predictions */
  float a0, sg0, l0, at, sgt, lt;
  alpha_sigma(s->sigmas[i], &a0, &sg0, &l0);
  alpha_sigma(s->sigmas[i + 1], &at, &sgt, &lt);
  memcpy(m1, m0, n * sizeof(float)); /* model_outputs shifted */
  for (size_t k = 0; k < n; k++)
    m0[k] =
        s->cfg.prediction_type == CT_PRED_V ? a0 * x[k] - sg0 * out[k] : (x[k] - sg0 * out[k]) / a0;
  const int last = i == N - 1; /* lower_order_final: the final sigma is 0 */
  const float h = lt - l0, ratio = sgt / sg0, c = at * (expf(-h) - 1.0f);
  if (s->lower_order_nums < 1 || last) {
    for (size_t k = 0; k < n; k++) x[k] = ratio * x[k] - c * m0[k];
  } else {
    /* solver_order 2: the second-order update (lower_order_second too) */
    float a1, sg1, l1;
    alpha_sigma(s->sigmas[i - 1], &a1, &sg1, &l1);
    const float h0 = l0 - l1, r0 = h0 / h, inv = 1.0f / r0, half = 0.5f * c;
    for (size_t k = 0; k < n; k++) {
      const float d1 = inv * (m0[k] - m1[k]);
      x[k] = ratio * x[k] - c * m0[k] - half * d1;
    }
  }
  if (s->lower_order_nums < 2) s->lower_order_nums++;
  return CT_OK;
}

ct_status ct_dsched_step(ct_dsched *s, const float *model_output, float *x, size_t n, ct_err *err) {
  if (s->step_index >= s->n)
    return ct_errf(err, CT_ERR_RANGE, "sampler step %d after the last of %d", s->step_index, s->n);
  ct_status st = CT_OK;
  if (s->cfg.kind == CT_SCHED_EULER)
    euler_step(s, model_output, x, n);
  else if (s->cfg.kind == CT_SCHED_DDIM)
    ddim_step(s, model_output, x, n);
  else
    st = dpm_step(s, model_output, x, n, err);
  if (!st) s->step_index++;
  return st;
}

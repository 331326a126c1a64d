/* An SDXL pipeline's scheduler/scheduler_config.json (ctuner/diffusion.h):
 * the fields of EulerDiscreteScheduler, DDIMScheduler,
 * DPMSolverMultistepScheduler and DDPMScheduler that ctuner follows; the
 * options it does not do are refused by name, every problem in one error,
 * unknown fields draw one warning. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ctuner/diffusion.h"
#include "ctuner/jfields.h"
#include "ctuner/json.h"
#include "ctuner/log.h"

static void read_class(const ct_json *j, ct_ddpm_config *c, ct_jf_probs *p) {
  const char *cls = ct_jf_str(j, "_class_name", p);
  if (!cls || !strcmp(cls, "EulerDiscreteScheduler"))
    c->kind = CT_SCHED_EULER;
  else if (!strcmp(cls,
                   "DDPMScheduler")) { /* its schedule trains; its ancestral sampler is not here */
    c->kind = CT_SCHED_EULER;
    CT_WARN(
        "DDPMScheduler: its schedule is read; DDPM's ancestral sampling is not offered, "
        "sampling uses EulerDiscreteScheduler over the same schedule (or pick ddim / dpm++2m)");
  } else if (!strcmp(cls, "DDIMScheduler"))
    c->kind = CT_SCHED_DDIM;
  else if (!strcmp(cls, "DPMSolverMultistepScheduler"))
    c->kind = CT_SCHED_DPMPP_2M;
  else
    ct_jf_prob(p, "_class_name",
               "is not EulerDiscreteScheduler, DDIMScheduler, DPMSolverMultistepScheduler or "
               "DDPMScheduler");
}

static void read_keys(const ct_json *j, ct_ddpm_config *c, ct_jf_probs *p) {
  read_class(j, c, p);
  double ntt = c->num_train_timesteps, off = c->steps_offset;
  ct_jf_num(j, "num_train_timesteps", &ntt, 0, p);
  if (ntt != floor(ntt) || ntt < 1 || ntt > CT_DDPM_MAX_STEPS)
    ct_jf_prob(p, "num_train_timesteps", "must be an integer in [1, 4096]");
  c->num_train_timesteps = (int)ntt;
  ct_jf_num(j, "beta_start", &c->beta_start, 0, p);
  ct_jf_num(j, "beta_end", &c->beta_end, 0, p);
  ct_jf_num(j, "steps_offset", &off, 0, p);
  if (off != floor(off) || off < 0 || off > 1000)
    ct_jf_prob(p, "steps_offset", "must be an integer >= 0");
  c->steps_offset = (int)off;
  const char *bs = ct_jf_str(j, "beta_schedule", p), *pt = ct_jf_str(j, "prediction_type", p),
             *sp = ct_jf_str(j, "timestep_spacing", p);
  if (bs && strcmp(bs, "scaled_linear") && strcmp(bs, "linear"))
    ct_jf_prob(p, "beta_schedule", "must be \"scaled_linear\" or \"linear\"");
  c->beta_schedule = bs && !strcmp(bs, "linear") ? CT_BETA_LINEAR : CT_BETA_SCALED_LINEAR;
  if (pt && strcmp(pt, "epsilon") && strcmp(pt, "v_prediction"))
    ct_jf_prob(p, "prediction_type", "must be \"epsilon\" or \"v_prediction\"");
  c->prediction_type = pt && !strcmp(pt, "v_prediction") ? CT_PRED_V : CT_PRED_EPSILON;
  if (sp && strcmp(sp, "leading") && strcmp(sp, "trailing") && strcmp(sp, "linspace"))
    ct_jf_prob(p, "timestep_spacing", "must be \"leading\", \"trailing\" or \"linspace\"");
  c->timestep_spacing = !sp || !strcmp(sp, "leading") ? CT_SPACING_LEADING
                        : !strcmp(sp, "trailing")     ? CT_SPACING_TRAILING
                                                      : CT_SPACING_LINSPACE;
  c->set_alpha_to_one = ct_jf_flag(j, "set_alpha_to_one", c->set_alpha_to_one, p);
  static const char *const refused[] = {
      "use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",        "use_lu_lambdas",
      "clip_sample",       "thresholding",           "rescale_betas_zero_snr", "euler_at_final"};
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
    if (ct_jf_flag(j, refused[i], 0, p)) ct_jf_prob(p, refused[i], "is not supported (only false)");
  if (!ct_jf_flag(j, "lower_order_final", 1, p)) ct_jf_prob(p, "lower_order_final", "must be true");
  const ct_json *tb = ct_json_get(j, "trained_betas");
  if (tb && tb->type != CT_JSON_NULL)
    ct_jf_prob(p, "trained_betas", "is not supported (only null)");
  double order = 2;
  ct_jf_num(j, "solver_order", &order, 0, p);
  if (c->kind == CT_SCHED_DPMPP_2M && order != 2)
    ct_jf_prob(p, "solver_order", "must be 2 (DPM++ 2M)");
  ct_jf_only(j, "algorithm_type", "dpmsolver++", "DPM++ 2M", p);
  ct_jf_only(j, "solver_type", "midpoint", "DPM++ 2M", p);
  ct_jf_only(j, "final_sigmas_type", "zero", "a final sigma of 0", p);
  ct_jf_only(j, "interpolation_type", "linear", "linear interpolation of sigmas", p);
  ct_jf_only(j, "timestep_type", "discrete", "discrete timesteps", p);
  ct_jf_only(j, "variance_type", "fixed_small", "DDPM's fixed_small", p);
}

static const char *const KNOWN[] = {
    "_class_name", "_diffusers_version", "num_train_timesteps", "beta_start", "beta_end",
    "beta_schedule", "prediction_type", "timestep_spacing", "steps_offset", "set_alpha_to_one",
    "use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "use_lu_lambdas",
    "clip_sample", "thresholding", "rescale_betas_zero_snr", "euler_at_final", "lower_order_final",
    "trained_betas", "solver_order", "algorithm_type", "solver_type", "final_sigmas_type",
    "interpolation_type", "timestep_type", "variance_type",
    /* no effect with the values above: PNDM's, clipping's and thresholding's knobs */
    "skip_prk_steps", "sample_max_value", "clip_sample_range", "dynamic_thresholding_ratio",
    "sigma_min", "sigma_max", "lambda_min_clipped"};

ct_status ct_ddpm_config_read(const char *path, ct_ddpm_config *c, ct_err *err) {
  ct_json *j = NULL;
  ct_ddpm_config_sdxl(c);
  c->steps_offset = 0; /* the classes' own default; SDXL's file says 1 */
  ct_status st = ct_json_parse_file(path, 1 << 20, &j, err);
  if (st) return st;
  ct_jf_probs p = {.n = 0};
  if (j->type != CT_JSON_OBJECT) {
    ct_jf_prob(&p, "the file", "is not a JSON object");
  } else {
    read_keys(j, c, &p);
    char unknown[300] = "";
    for (size_t i = 0; i < j->n; i++) {
      int k = 0;
      for (size_t m = 0; m < sizeof KNOWN / sizeof *KNOWN && !k; m++)
        k = !strcmp(KNOWN[m], j->keys[i]);
      size_t l = strlen(unknown);
      if (!k && l + strlen(j->keys[i]) + 4 < sizeof unknown)
        snprintf(unknown + l, sizeof unknown - l, "%s%s", l ? ", " : "", j->keys[i]);
    }
    if (unknown[0]) CT_WARN("%s: fields ctuner does not read (no effect): %s", path, unknown);
  }
  ct_json_free(j);
  if (p.n)
    return ct_errf(err, CT_ERR_INVALID, "%s: %d problem%s: %s", path, p.n, p.n > 1 ? "s" : "",
                   p.buf);
  return CT_OK;
}

ct_status ct_dsched_kind_parse(const char *name, ct_dsched_kind *k, ct_err *err) {
  if (name && !strcmp(name, "euler"))
    *k = CT_SCHED_EULER;
  else if (name && !strcmp(name, "ddim"))
    *k = CT_SCHED_DDIM;
  else if (name &&
           (!strcmp(name, "dpm++2m") || !strcmp(name, "dpmsolver") || !strcmp(name, "dpm++")))
    *k = CT_SCHED_DPMPP_2M;
  else
    return ct_errf(err, CT_ERR_INVALID,
                   "sampler '%s' is not offered for SDXL; use euler, ddim or dpm++2m (dpmsolver)",
                   name ? name : "");
  return CT_OK;
}

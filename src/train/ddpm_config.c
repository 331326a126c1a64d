/* An SDXL pipeline's scheduler/scheduler_config.json (ctuner/diffusion.h):
 * the fields of EulerDiscreteScheduler, DDIMScheduler,
 * DPMSolverMultistepScheduler and DDPMScheduler that ctuner follows; the
 * options it does not do are refused by name, every problem in one error,
 * unknown fields draw one warning. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ctuner/diffusion.h"
#include "ctuner/json.h"
#include "ctuner/log.h"

typedef struct probs {
  char buf[900];
  int n;
} probs;

static void prob(probs *p, const char *key, const char *what) {
  size_t l = strlen(p->buf);
  if (l + strlen(key) + strlen(what) + 16 < sizeof p->buf)
    snprintf(p->buf + l, sizeof p->buf - l, "%s%s %s", p->n ? "; " : "", key, what);
  p->n++;
}

static const char *str(const ct_json *j, const char *key, probs *p) {
  const ct_json *v = ct_json_get(j, key);
  if (!v || v->type == CT_JSON_NULL) return NULL;
  if (v->type != CT_JSON_STRING) {
    prob(p, key, "must be a string");
    return NULL;
  }
  return v->str;
}

static void num(const ct_json *j, const char *key, double *out, probs *p) {
  const ct_json *v = ct_json_get(j, key);
  if (!v) return;
  if (v->type != CT_JSON_NUMBER || !isfinite(v->num))
    prob(p, key, "must be a number");
  else
    *out = v->num;
}

/* A flag that must hold want (false for what ctuner does not do). */
static int flag(const ct_json *j, const char *key, int def, probs *p) {
  const ct_json *v = ct_json_get(j, key);
  if (!v || v->type == CT_JSON_NULL) return def;
  if (v->type != CT_JSON_BOOL) {
    prob(p, key, "must be true or false");
    return def;
  }
  return v->boolean;
}

/* value of key must be one of list ("a|b"), or absent / null. */
static void only(const ct_json *j, const char *key, const char *list, const char *why, probs *p) {
  const char *s = str(j, key, p);
  if (!s) return;
  char l[128];
  snprintf(l, sizeof l, "|%s|", list);
  char w[96];
  snprintf(w, sizeof w, "|%s|", s);
  if (!strstr(l, w)) {
    char m[256];
    snprintf(m, sizeof m, "\"%s\" is not supported (%s)", s, why);
    prob(p, key, m);
  }
}

static void read_class(const ct_json *j, ct_ddpm_config *c, probs *p) {
  const char *cls = str(j, "_class_name", p);
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
    prob(p, "_class_name",
         "is not EulerDiscreteScheduler, DDIMScheduler, DPMSolverMultistepScheduler or "
         "DDPMScheduler");
}

static void read_keys(const ct_json *j, ct_ddpm_config *c, probs *p) {
  read_class(j, c, p);
  double ntt = c->num_train_timesteps, off = c->steps_offset;
  num(j, "num_train_timesteps", &ntt, p);
  if (ntt != floor(ntt) || ntt < 1 || ntt > CT_DDPM_MAX_STEPS)
    prob(p, "num_train_timesteps", "must be an integer in [1, 4096]");
  c->num_train_timesteps = (int)ntt;
  num(j, "beta_start", &c->beta_start, p);
  num(j, "beta_end", &c->beta_end, p);
  num(j, "steps_offset", &off, p);
  if (off != floor(off) || off < 0 || off > 1000)
    prob(p, "steps_offset", "must be an integer >= 0");
  c->steps_offset = (int)off;
  const char *bs = str(j, "beta_schedule", p), *pt = str(j, "prediction_type", p),
             *sp = str(j, "timestep_spacing", p);
  if (bs && strcmp(bs, "scaled_linear") && strcmp(bs, "linear"))
    prob(p, "beta_schedule", "must be \"scaled_linear\" or \"linear\"");
  c->beta_schedule = bs && !strcmp(bs, "linear") ? CT_BETA_LINEAR : CT_BETA_SCALED_LINEAR;
  if (pt && strcmp(pt, "epsilon") && strcmp(pt, "v_prediction"))
    prob(p, "prediction_type", "must be \"epsilon\" or \"v_prediction\"");
  c->prediction_type = pt && !strcmp(pt, "v_prediction") ? CT_PRED_V : CT_PRED_EPSILON;
  if (sp && strcmp(sp, "leading") && strcmp(sp, "trailing") && strcmp(sp, "linspace"))
    prob(p, "timestep_spacing", "must be \"leading\", \"trailing\" or \"linspace\"");
  c->timestep_spacing = !sp || !strcmp(sp, "leading") ? CT_SPACING_LEADING
                        : !strcmp(sp, "trailing")     ? CT_SPACING_TRAILING
                                                      : CT_SPACING_LINSPACE;
  c->set_alpha_to_one = flag(j, "set_alpha_to_one", c->set_alpha_to_one, p);
  static const char *const refused[] = {
      "use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",        "use_lu_lambdas",
      "clip_sample",       "thresholding",           "rescale_betas_zero_snr", "euler_at_final"};
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
    if (flag(j, refused[i], 0, p)) prob(p, refused[i], "is not supported (only false)");
  if (!flag(j, "lower_order_final", 1, p)) prob(p, "lower_order_final", "must be true");
  const ct_json *tb = ct_json_get(j, "trained_betas");
  if (tb && tb->type != CT_JSON_NULL) prob(p, "trained_betas", "is not supported (only null)");
  double order = 2;
  num(j, "solver_order", &order, p);
  if (c->kind == CT_SCHED_DPMPP_2M && order != 2) prob(p, "solver_order", "must be 2 (DPM++ 2M)");
  only(j, "algorithm_type", "dpmsolver++", "DPM++ 2M", p);
  only(j, "solver_type", "midpoint", "DPM++ 2M", p);
  only(j, "final_sigmas_type", "zero", "a final sigma of 0", p);
  only(j, "interpolation_type", "linear", "linear interpolation of sigmas", p);
  only(j, "timestep_type", "discrete", "discrete timesteps", p);
  only(j, "variance_type", "fixed_small", "DDPM's fixed_small", p);
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
  probs p = {.n = 0};
  if (j->type != CT_JSON_OBJECT) {
    prob(&p, "the file", "is not a JSON object");
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

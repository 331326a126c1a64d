/* diffusers' FlowMatchEulerDiscreteScheduler (0.42.1) as FluxPipeline drives
 * it, as plain functions over float arrays:
 *
 *   in     = np.linspace(1, 1/N, N)              (float64, cast to float32)
 *   mu     = calculate_shift(image_seq_len)      (float64)
 *   sigma  = e^mu / (e^mu + (1/t - 1))           use_dynamic_shifting, exponential
 *          = mu / (mu + (1/t - 1))               ... linear
 *          = s t / (1 + (s - 1) t)               otherwise (s = shift)
 *   shift_terminal: sigma = 1 - (1 - sigma) (1 - terminal) / (1 - sigma[N-1])
 *   timesteps = sigma * num_train_timesteps; sigmas get a final 0
 *   invert_sigmas: sigma = 1 - sigma, timesteps from it, a final 1
 *   step i: x += (sigma[i+1] - sigma[i]) v
 *
 * Each operation is done in float32 where numpy/torch do it in float32 (the
 * constants are Python floats, weak under NumPy 2's promotion), so the
 * schedule equals diffusers' bit for bit (tests/test_fm_sched.c); no FMA
 * contraction, which numpy and torch do not do either.
 */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/jfields.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/train.h"

void ct_fm_sched_config_default(ct_fm_sched_config *c) {
  memset(c, 0, sizeof *c);
  c->num_train_timesteps = 1000;
  c->shift = 1.0;
  c->base_shift = 0.5;
  c->max_shift = 1.15;
  c->base_image_seq_len = 256;
  c->max_image_seq_len = 4096;
}

static void read_keys(const ct_json *j, ct_fm_sched_config *c, ct_jf_probs *p) {
  long ntt = c->num_train_timesteps;
  const ct_json *cls = ct_json_get(j, "_class_name");
  if (cls && (cls->type != CT_JSON_STRING || strcmp(cls->str, "FlowMatchEulerDiscreteScheduler")))
    ct_jf_prob(p, "_class_name",
               "is not FlowMatchEulerDiscreteScheduler (the only scheduler here)");
  ct_jf_posint(j, "num_train_timesteps", &ntt, p);
  c->num_train_timesteps = (int)ntt;
  ct_jf_num(j, "shift", &c->shift, 0, p);
  c->use_dynamic_shifting = ct_jf_flag(j, "use_dynamic_shifting", 0, p);
  ct_jf_num(j, "base_shift", &c->base_shift, 0, p);
  ct_jf_num(j, "max_shift", &c->max_shift, 0, p);
  ct_jf_posint(j, "base_image_seq_len", &c->base_image_seq_len, p);
  ct_jf_posint(j, "max_image_seq_len", &c->max_image_seq_len, p);
  ct_jf_num(j, "shift_terminal", &c->shift_terminal, 1, p);
  c->invert_sigmas = ct_jf_flag(j, "invert_sigmas", 0, p);
  const ct_json *tst = ct_json_get(j, "time_shift_type");
  if (tst && (tst->type != CT_JSON_STRING ||
              (strcmp(tst->str, "exponential") && strcmp(tst->str, "linear"))))
    ct_jf_prob(p, "time_shift_type", "must be \"exponential\" or \"linear\"");
  c->time_shift_linear = tst && tst->type == CT_JSON_STRING && !strcmp(tst->str, "linear");
  static const char *const refused[] = {"use_karras_sigmas", "use_exponential_sigmas",
                                        "use_beta_sigmas", "stochastic_sampling",
                                        "use_flow_sigmas"};
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
    if (ct_jf_flag(j, refused[i], 0, p)) ct_jf_prob(p, refused[i], "is not supported (only false)");
}

static const char *const KNOWN[] = {"_class_name",
                                    "_diffusers_version",
                                    "num_train_timesteps",
                                    "shift",
                                    "use_dynamic_shifting",
                                    "base_shift",
                                    "max_shift",
                                    "base_image_seq_len",
                                    "max_image_seq_len",
                                    "time_shift_type",
                                    "shift_terminal",
                                    "invert_sigmas",
                                    "use_karras_sigmas",
                                    "use_exponential_sigmas",
                                    "use_beta_sigmas",
                                    "stochastic_sampling",
                                    "use_flow_sigmas"};

ct_status ct_fm_sched_config_read(const char *path, ct_fm_sched_config *c, ct_err *err) {
  ct_json *j = NULL;
  ct_fm_sched_config_default(c);
  ct_status st = ct_json_parse_file(path, 1 << 20, &j, err);
  if (st) return st;
  ct_jf_probs p = {.n = 0};
  if (j->type != CT_JSON_OBJECT) {
    ct_jf_prob(&p, "the file", "is not a JSON object");
  } else {
    read_keys(j, c, &p);
    char unknown[400] = "";
    int nu = 0;
    for (size_t i = 0; i < j->n; i++) {
      size_t k = 0;
      while (k < sizeof KNOWN / sizeof *KNOWN && strcmp(KNOWN[k], j->keys[i])) k++;
      if (k < sizeof KNOWN / sizeof *KNOWN) continue;
      size_t l = strlen(unknown);
      if (l + strlen(j->keys[i]) + 8 < sizeof unknown)
        snprintf(unknown + l, sizeof unknown - l, "%s%s", nu ? ", " : "", j->keys[i]);
      nu++;
    }
    if (nu && !p.n)
      CT_WARN("%s: ignoring %d field%s ctuner does not know: %s", path, nu, nu > 1 ? "s" : "",
              unknown);
    if (c->use_dynamic_shifting && c->base_image_seq_len == c->max_image_seq_len)
      ct_jf_prob(&p, "base_image_seq_len",
                 "equals max_image_seq_len (calculate_shift divides by their "
                 "difference)");
  }
  st = p.n ? ct_errf(err, CT_ERR_FORMAT, "%s: %s", path, p.buf) : CT_OK;
  ct_json_free(j);
  return st;
}

double ct_fm_calculate_shift(const ct_fm_sched_config *c, long image_seq_len) {
  double m =
      (c->max_shift - c->base_shift) / (double)(c->max_image_seq_len - c->base_image_seq_len);
  double b = c->base_shift - m * (double)c->base_image_seq_len;
  return (double)image_seq_len * m + b;
}

ct_status ct_fm_set_timesteps(const ct_fm_sched_config *c, int N, const float *in, double mu,
                              float *sigmas, float *timesteps, ct_err *err) {
  if (N < 1 || N > (1 << 20))
    return ct_errf(err, CT_ERR_RANGE, "scheduler: %d inference steps (need 1 to 2^20)", N);
  float em = (float)exp(mu), fmu = (float)mu, fs = (float)c->shift, fs1 = (float)(c->shift - 1.0);
  for (int i = 0; i < N; i++) {
    float t = in[i], s;
    if (c->use_dynamic_shifting) {
      float x = 1.0f / t;
      x = x - 1.0f; /* (1/t - 1) ** 1.0 */
      if (c->time_shift_linear) {
        float d = fmu + x;
        s = fmu / d;
      } else {
        float d = em + x;
        s = em / d;
      }
    } else {
      float a = fs * t, b = fs1 * t;
      b = 1.0f + b;
      s = a / b;
    }
    sigmas[i] = s;
  }
  if (c->shift_terminal != 0.0) {
    float last = 1.0f - sigmas[N - 1];
    float scale = last / (float)(1.0 - c->shift_terminal);
    if (!(scale != 0.0f) || !isfinite(scale))
      return ct_errf(err, CT_ERR_INVALID,
                     "scheduler: shift_terminal %g with a last sigma of %g divides by zero "
                     "(diffusers gives NaN sigmas here; use more steps)",
                     c->shift_terminal, (double)sigmas[N - 1]);
    for (int i = 0; i < N; i++) {
      float omz = 1.0f - sigmas[i];
      omz = omz / scale;
      sigmas[i] = 1.0f - omz;
    }
  }
  float ntt = (float)c->num_train_timesteps;
  for (int i = 0; i < N; i++) {
    if (c->invert_sigmas) sigmas[i] = 1.0f - sigmas[i];
    timesteps[i] = sigmas[i] * ntt;
  }
  sigmas[N] = c->invert_sigmas ? 1.0f : 0.0f;
  return CT_OK;
}

ct_status ct_fm_flux_timesteps(const ct_fm_sched_config *c, int N, long image_seq_len,
                               float *sigmas, float *timesteps, ct_err *err) {
  if (N < 1 || N > (1 << 20))
    return ct_errf(err, CT_ERR_RANGE, "scheduler: %d inference steps (need 1 to 2^20)", N);
  float *in = malloc((size_t)N * sizeof *in);
  if (!in) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  /* np.linspace(1.0, 1 / N, N): start + i * step in float64, the last exactly 1/N */
  double stop = 1.0 / N, step = N > 1 ? (stop - 1.0) / (N - 1) : 0.0;
  for (int i = 0; i < N; i++) in[i] = (float)((double)i * step + 1.0);
  in[N - 1] = (float)stop;
  ct_status st = ct_fm_set_timesteps(c, N, in, ct_fm_calculate_shift(c, image_seq_len), sigmas,
                                     timesteps, err);
  free(in);
  return st;
}

void ct_fm_step(const float *sigmas, int i, const float *v, float *x, size_t n) {
  float dt = sigmas[i + 1] - sigmas[i];
  for (size_t k = 0; k < n; k++) {
    float d = dt * v[k];
    x[k] = x[k] + d;
  }
}

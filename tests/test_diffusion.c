/* The DDPM objective and SDXL's samplers (ctuner/diffusion.h) against
 * diffusers 0.42.1 (scripts/sdxl_sched_golden.py,
 * tests/data/sdxl_sched_golden.json): DDPMScheduler's alphas_cumprod,
 * add_noise, get_velocity, compute_snr, SimpleTuner's min-SNR weights and
 * loss; Euler, DDIM and DPM++ 2M driven as StableDiffusionXLPipeline drives
 * them (CFG with the negative conditioning, guidance_rescale) over a stand-in
 * denoiser, every step's latents; the scheduler_config.json reader; the
 * objective's draws. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/diffusion.h"
#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "harness.h"

static ct_json *golden(void) {
  const char *p = getenv("CT_SDXL_SCHED_GOLDEN"); /* make interop: a fresh set */
  ct_json *j = NULL;
  ct_err e = {0};
  if (ct_json_parse_file(p && p[0] ? p : ct_test_data("sdxl_sched_golden.json"), 64 << 20, &j, &e))
    return NULL;
  return j;
}

/* A JSON array of numbers as floats (malloc'd); n its length. */
static float *floats(const ct_json *a, size_t *n) {
  *n = a && a->type == CT_JSON_ARRAY ? a->n : 0;
  float *f = malloc((*n + 1) * sizeof *f);
  for (size_t i = 0; f && i < *n; i++) f[i] = (float)a->items[i].num;
  return f;
}

/* max |a - b| / max(1, |b|) over n (NaN-sticky). */
static double err_of(const float *a, const float *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = fabs((double)a[i] - (double)b[i]) / fmax(1.0, fabs((double)b[i]));
    m = ct_test_max(m, d);
  }
  return m;
}

/* The case's "config" object written as scheduler_config.json and read back. */
static ct_status read_config(const ct_json *cfg, ct_ddpm_config *c, ct_err *err) {
  char path[4096];
  if (ct_test_write_flat_json(cfg, "scheduler_config.json", path, sizeof path))
    return ct_errf(err, CT_ERR_IO, "cannot write the case's scheduler_config.json");
  return ct_ddpm_config_read(path, c, err);
}

static void ddpm_case(int *ct_failed_, const ct_json *k) {
  ct_ddpm_config c;
  ct_err e = {0};
  CHECKF(!read_config(ct_json_get(k, "config"), &c, &e), "%s", e.msg);
  static float ac[CT_DDPM_MAX_STEPS];
  REQUIRE(!ct_ddpm_alphas_cumprod(&c, ac, &e));
  size_t n, nt, nx;
  float *want = floats(ct_json_get(k, "alphas_cumprod"), &n);
  REQUIRE(n == 1000);
  const double e_ac = err_of(ac, want, n);
  CHECKF(e_ac < 1e-6, "alphas_cumprod error %g", e_ac);
  free(want);
  float *tf = floats(ct_json_get(k, "t"), &nt);
  float *x0 = floats(ct_json_get(k, "x0"), &nx), *nz = floats(ct_json_get(k, "noise"), &nx);
  float *pred = floats(ct_json_get(k, "pred"), &nx);
  long t[16];
  const int B = (int)nt;
  const size_t per = nx / nt;
  for (int b = 0; b < B; b++) t[b] = (long)tf[b];
  float *got = malloc(nx * sizeof *got), *tgt = malloc(nx * sizeof *tgt);
  ct_ddpm_add_noise(ac, t, B, per, x0, nz, got);
  want = floats(ct_json_get(k, "add_noise"), &n);
  CHECKF(err_of(got, want, nx) < 2e-6, "add_noise error %g", err_of(got, want, nx));
  free(want);
  ct_ddpm_velocity(ac, t, B, per, x0, nz, got);
  want = floats(ct_json_get(k, "velocity"), &n);
  CHECKF(err_of(got, want, nx) < 2e-6, "get_velocity error %g", err_of(got, want, nx));
  free(want);
  want = floats(ct_json_get(k, "snr"), &n);
  for (int b = 0; b < B; b++)
    CHECKF(fabs(ct_ddpm_snr(ac, t[b]) - want[b]) <= 1e-5 * fmax(1, fabs(want[b])), "snr t %ld",
           t[b]);
  free(want);
  const ct_json *ls = ct_json_get(k, "losses");
  for (size_t i = 0; ls && i < ls->n; i++) {
    const ct_json *L = &ls->items[i];
    ct_ddpm_objective o = {.snr_weight = 1};
    o.prediction_type = !strcmp(ct_json_get(L, "prediction_type")->str, "v_prediction")
                            ? CT_PRED_V
                            : CT_PRED_EPSILON;
    o.snr_gamma = ct_json_get(L, "snr_gamma")->num;
    want = floats(ct_json_get(L, "weights"), &n);
    for (int b = 0; b < B; b++)
      CHECKF(fabs(ct_ddpm_loss_weight(&o, ac, t[b]) - want[b]) <= 1e-5 * fmax(1, fabs(want[b])),
             "weight t %ld gamma %g", t[b], o.snr_gamma);
    free(want);
    ct_ddpm_target(&o, ac, t, B, per, x0, nz, tgt);
    const double loss = ct_ddpm_loss(&o, ac, t, B, per, pred, tgt, NULL);
    const double wl = ct_json_get(L, "loss")->num;
    CHECKF(fabs(loss - wl) <= 1e-5 * fmax(1, fabs(wl)), "loss %g vs %g", loss, wl);
  }
  free(got);
  free(tgt);
  free(tf);
  free(x0);
  free(nz);
  free(pred);
}

CT_TEST(diffusion, ddpm_objective) {
  ct_json *j = golden();
  if (!j) CT_SKIP("no tests/data/sdxl_sched_golden.json");
  const ct_json *d = ct_json_get(j, "ddpm");
  REQUIRE(d && d->n == 2);
  for (size_t i = 0; i < d->n; i++) ddpm_case(ct_failed_, &d->items[i]);
  ct_json_free(j);
}

/* The stand-in denoiser of scripts/sdxl_sched_golden.py:
 * 0.7 x / (1 + |x|) + 0.3 pooled[b, c] + (0.0005 t) text[b, 0, c]. */
static ct_status stand_in(void *user, const float *x, int B, int C, int H, int W, float t,
                          const ct_denoise_cond *cond, float *out, ct_err *err) {
  (void)user;
  (void)err;
  const size_t hw = (size_t)H * W;
  const float k = (float)(0.0005 * (double)t);
  for (int b = 0; b < B; b++)
    for (int c = 0; c < C; c++) {
      const float p = cond->pooled[(size_t)b * cond->Dpool + c];
      const float tx = cond->text[(size_t)b * cond->Ttxt * cond->Dtxt + c];
      for (size_t i = 0; i < hw; i++) {
        const size_t o = ((size_t)b * C + c) * hw + i;
        const float s = x[o] / (1.0f + fabsf(x[o]));
        out[o] = 0.7f * s + 0.3f * p + k * tx;
      }
    }
  return CT_OK;
}

/* Step by step: the golden loop's latents after each step, through the
 * same scheduler and the same CFG (recorded as its own trajectory). */
typedef struct traj_user {
  ct_dsched *s;
} traj_user;

static void sample_case(int *ct_failed_, const ct_json *k, int idx) {
  ct_ddpm_config c;
  ct_err e = {0};
  CHECKF(!read_config(ct_json_get(k, "config"), &c, &e), "case %d: %s", idx, e.msg);
  const int steps = (int)ct_json_get(k, "steps")->num;
  ct_dsched *s = malloc(sizeof *s);
  REQUIRE(s && !ct_dsched_init(s, &c, steps, &e));
  size_t n, m;
  float *ts = floats(ct_json_get(k, "timesteps"), &n);
  CHECKF(n == (size_t)steps && err_of(s->timesteps, ts, n) == 0, "case %d: timesteps", idx);
  free(ts);
  float *sg = floats(ct_json_get(k, "sigmas"), &n);
  if (n)
    CHECKF(err_of(s->sigmas, sg, n) < 1e-6, "case %d: sigmas %g", idx, err_of(s->sigmas, sg, n));
  free(sg);
  const double ins = ct_json_get(k, "init_noise_sigma")->num;
  CHECKF(fabs(s->init_noise_sigma - ins) <= 1e-6 * ins, "case %d: init_noise_sigma", idx);
  ct_dsched_free(s);
  free(s);
  float *x = floats(ct_json_get(k, "noise"), &n);
  float *text = floats(ct_json_get(k, "text"), &m), *pooled = floats(ct_json_get(k, "pooled"), &m);
  const int C = 4, H = 3, W = 5, TT = 2, DT = 4, DP = 4;
  const float ids[6] = {1024, 1024, 0, 0, 1024, 1024};
  ct_denoise_cond unc = {text, pooled, ids, TT, DT, DP};
  ct_denoise_cond cond = {text + TT * DT, pooled + DP, ids, TT, DT, DP};
  ct_sdxl_sample_opts o = {steps, ct_json_get(k, "guidance_scale")->num,
                           ct_json_get(k, "guidance_rescale")->num};
  /* every prefix of the trajectory: denoise with 1..steps steps is not the
   * same schedule, so the full run is compared at the end and each step
   * through the scheduler directly below */
  CHECKF(!ct_sdxl_denoise(&c, &o, stand_in, NULL, &cond, &unc, C, H, W, x, &e), "case %d: %s", idx,
         e.msg);
  const ct_json *lat = ct_json_get(k, "latents");
  float *want = floats(&lat->items[lat->n - 1], &n);
  const double fe = err_of(x, want, n);
  CHECKF(fe < 2e-5, "case %d (%s, %d steps): final latents error %g", idx,
         ct_json_get(ct_json_get(k, "config"), "_class_name")->str, steps, fe);
  free(want);
  free(x);
  free(text);
  free(pooled);
}

/* Each step of a case, through ct_dsched_* directly with the loop written
 * out here (CFG on): every intermediate latent against the golden. */
static void stepwise_case(int *ct_failed_, const ct_json *k, int idx) {
  ct_ddpm_config c;
  ct_err e = {0};
  REQUIRE(!read_config(ct_json_get(k, "config"), &c, &e));
  const int steps = (int)ct_json_get(k, "steps")->num;
  const double g = ct_json_get(k, "guidance_scale")->num,
               r = ct_json_get(k, "guidance_rescale")->num;
  ct_dsched *s = malloc(sizeof *s);
  REQUIRE(s && !ct_dsched_init(s, &c, steps, &e));
  size_t n, m;
  float *x = floats(ct_json_get(k, "noise"), &n);
  float *text = floats(ct_json_get(k, "text"), &m), *pooled = floats(ct_json_get(k, "pooled"), &m);
  const float ids[12] = {0};
  ct_denoise_cond bc = {text, pooled, ids, 2, 4, 4}, one = {text + 8, pooled + 4, ids, 2, 4, 4};
  float *in = malloc(2 * n * sizeof *in), *eps = malloc(2 * n * sizeof *eps);
  for (size_t i = 0; i < n; i++) x[i] *= s->init_noise_sigma;
  const ct_json *lat = ct_json_get(k, "latents");
  double worst = 0;
  for (int i = 0; i < steps; i++) {
    const int cfg = g > 1;
    ct_dsched_scale_input(s, x, n, in);
    if (cfg) ct_dsched_scale_input(s, x, n, in + n);
    REQUIRE(!stand_in(NULL, in, cfg ? 2 : 1, 4, 3, 5, s->timesteps[i], cfg ? &bc : &one, eps, &e));
    if (cfg) {
      for (size_t q = 0; q < n; q++) eps[q] = eps[q] + (float)g * (eps[n + q] - eps[q]);
      if (r > 0) ct_rescale_noise_cfg(eps, eps + n, n, r);
    }
    REQUIRE(!ct_dsched_step(s, eps, x, n, &e));
    float *want = floats(&lat->items[i], &m);
    worst = ct_test_max(worst, err_of(x, want, n));
    free(want);
  }
  CHECKF(worst < 2e-5, "case %d: worst step error %g", idx, worst);
  CHECK(ct_dsched_step(s, eps, x, n, &e) == CT_ERR_RANGE); /* past the last step */
  ct_dsched_free(s);
  free(s);
  free(in);
  free(eps);
  free(x);
  free(text);
  free(pooled);
}

CT_TEST(diffusion, samplers) {
  ct_json *j = golden();
  if (!j) CT_SKIP("no tests/data/sdxl_sched_golden.json");
  const ct_json *cases = ct_json_get(j, "sample");
  REQUIRE(cases && cases->n >= 15);
  for (size_t i = 0; i < cases->n; i++) {
    sample_case(ct_failed_, &cases->items[i], (int)i);
    stepwise_case(ct_failed_, &cases->items[i], (int)i);
  }
  ct_json_free(j);
}

CT_TEST(diffusion, config_errors) {
  ct_err err = {0};
  ct_ddpm_config c;
  char path[4096];
  snprintf(path, sizeof path, "%s/ddpm_bad.json", ct_test_tmpdir());
  const char *bad =
      "{\"_class_name\": \"PNDMScheduler\", \"use_karras_sigmas\": true, \"beta_schedule\": "
      "\"squaredcos_cap_v2\", \"prediction_type\": \"sample\", \"trained_betas\": [0.1], "
      "\"solver_type\": \"heun\", \"rescale_betas_zero_snr\": true, \"timestep_spacing\": 3}";
  REQUIRE(!ct_write_file_atomic(path, bad, strlen(bad), &err));
  ct_status st = ct_ddpm_config_read(path, &c, &err);
  CHECKF(st && strstr(err.msg, "_class_name") && strstr(err.msg, "use_karras_sigmas") &&
             strstr(err.msg, "beta_schedule") && strstr(err.msg, "prediction_type") &&
             strstr(err.msg, "trained_betas") && strstr(err.msg, "solver_type") &&
             strstr(err.msg, "rescale_betas_zero_snr") && strstr(err.msg, "timestep_spacing"),
         "%s", st ? err.msg : "accepted");
  ct_dsched_kind k;
  CHECK(!ct_dsched_kind_parse("dpmsolver", &k, &err) && k == CT_SCHED_DPMPP_2M);
  CHECK(ct_dsched_kind_parse("unipc", &k, &err) == CT_ERR_INVALID && strstr(err.msg, "unipc"));
  ct_ddpm_config_sdxl(&c);
  ct_dsched *s = malloc(sizeof *s);
  REQUIRE(s);
  CHECK(ct_dsched_init(s, &c, 0, &err) == CT_ERR_RANGE);
  CHECK(ct_dsched_init(s, &c, 1001, &err) == CT_ERR_RANGE);
  free(s);
}

CT_TEST(diffusion, draws_and_time_ids) {
  ct_ddpm_objective o = {.snr_weight = 1,
                         .noise_offset = 0.1,
                         .noise_offset_probability = 1,
                         .input_perturbation = 0.2,
                         .input_perturbation_steps = 100};
  enum { C = 4, HW = 64 };
  float a[C * HW], b[C * HW], pa[C * HW];
  long ta, tb;
  ct_ddpm_draw(&o, 1000, 7, 3, 0, C, HW, &ta, a, pa);
  ct_ddpm_draw(&o, 1000, 7, 3, 0, C, HW, &tb, b, b);
  CHECK(ta == tb && ta >= 0 && ta < 1000);
  CHECK(!memcmp(a, b, sizeof a)); /* a pure function of (seed, id) */
  double dmax = 0;
  for (int i = 0; i < C * HW; i++) dmax = fmax(dmax, fabs(pa[i] - a[i]));
  CHECK(dmax > 0); /* perturbed at step 0 */
  CHECK_NEAR(ct_ddpm_perturbation(&o, 50), 0.1, 1e-12);
  CHECK(ct_ddpm_perturbation(&o, 100) == 0 && ct_ddpm_perturbation(&o, 500) == 0);
  ct_ddpm_draw(&o, 1000, 7, 3, 100, C, HW, &tb, b, pa);
  CHECK(!memcmp(b, pa, sizeof b)); /* past the decay: the noise itself */
  /* noise_offset: one shift per channel, the same over the channel's pixels */
  ct_ddpm_objective plain = o;
  plain.noise_offset = 0;
  ct_ddpm_draw(&plain, 1000, 7, 3, 0, C, HW, &tb, b, b);
  for (int c = 0; c < C; c++) {
    const float d0 = a[c * HW] - b[c * HW];
    for (int i = 1; i < HW; i++) CHECK(fabsf((a[c * HW + i] - b[c * HW + i]) - d0) < 1e-6f);
  }
  float ids[6];
  ct_sdxl_time_ids(1200, 800, 40, 16, 128, 96, 8, 0, ids);
  const float want[6] = {1200, 800, 40, 16, 1024, 768};
  CHECK(!memcmp(ids, want, sizeof ids));
  ct_sdxl_time_ids(1200, 800, 40, 16, 128, 96, 8, 1, ids);
  for (int i = 0; i < 6; i++) CHECK(ids[i] == 0.0f);
}

/* ct_ddpm_loss's gradient against central differences (min-SNR weights on). */
CT_TEST(diffusion, loss_gradient) {
  ct_ddpm_config c;
  ct_ddpm_config_sdxl(&c);
  static float ac[CT_DDPM_MAX_STEPS];
  ct_err e = {0};
  REQUIRE(!ct_ddpm_alphas_cumprod(&c, ac, &e));
  ct_ddpm_objective o = {.prediction_type = CT_PRED_V, .snr_gamma = 5, .snr_weight = 1};
  enum { B = 3, N = 8 };
  const long t[B] = {3, 500, 990};
  float pred[B * N], tgt[B * N], g[B * N];
  for (int i = 0; i < B * N; i++) {
    pred[i] = (float)sin(0.7 * i);
    tgt[i] = (float)cos(1.3 * i);
  }
  ct_ddpm_loss(&o, ac, t, B, N, pred, tgt, g);
  double worst = 0;
  for (int i = 0; i < B * N; i++) {
    const float keep = pred[i], h = 1e-2f;
    pred[i] = keep + h;
    const double up = ct_ddpm_loss(&o, ac, t, B, N, pred, tgt, NULL);
    pred[i] = keep - h;
    const double dn = ct_ddpm_loss(&o, ac, t, B, N, pred, tgt, NULL);
    pred[i] = keep;
    worst = ct_test_max(worst, fabs((up - dn) / (2.0 * h) - g[i]));
  }
  CHECKF(worst < 1e-5, "gradient error %g", worst);
  /* the weights are min(snr, 5) / (snr + 1): below 1 at every t */
  for (int b = 0; b < B; b++) CHECK(ct_ddpm_loss_weight(&o, ac, t[b]) < 1.0f);
}

/* FlowMatchEulerDiscreteScheduler as FluxPipeline drives it, against
 * diffusers 0.42.1 (scripts/fm_sched_golden.py, tests/data/fm_sched_golden.json):
 * sigmas, timesteps and Euler steps equal bit for bit for 8 configs (FLUX.1
 * dev and schnell, static shift, linear time shift, shift_terminal, inverted
 * sigmas, other num_train_timesteps and seq-len ends, the class defaults),
 * 1 to 50 steps and image_seq_len 64 to 4352; config.json errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/train.h"
#include "harness.h"

static const char *golden_path(void) {
  const char *p = getenv("CT_FM_SCHED_GOLDEN"); /* make interop: a fresh set */
  return p && p[0] ? p : ct_test_data("fm_sched_golden.json");
}

/* The case's scheduler_config.json through the reader (written to a file). */
static ct_status case_config(const ct_json *cfg, ct_fm_sched_config *c, ct_err *err) {
  char path[4096];
  if (ct_test_write_flat_json(cfg, "scheduler_config.json", path, sizeof path))
    return ct_errf(err, CT_ERR_IO, "cannot write the case's scheduler_config.json");
  return ct_fm_sched_config_read(path, c, err);
}

static int same_floats(const float *a, const ct_json *arr, int n) {
  if (!arr || arr->n != (size_t)n) return 0;
  for (int i = 0; i < n; i++) {
    float w = (float)arr->items[i].num;
    if (memcmp(&a[i], &w, sizeof w)) return 0;
  }
  return 1;
}

CT_TEST(fm_sched, matches_diffusers) {
  ct_json *g = NULL;
  ct_err err = {0};
  REQUIRE(!ct_json_parse_file(golden_path(), 16u << 20, &g, &err));
  const ct_json *cases = ct_json_get(g, "cases");
  REQUIRE(cases && cases->n >= 50);
  int bad = 0, refused = 0, stepped = 0;
  for (size_t k = 0; k < cases->n; k++) {
    const ct_json *c = &cases->items[k];
    ct_fm_sched_config sc;
    int N = (int)ct_json_get(c, "N")->i64;
    long seq = (long)ct_json_get(c, "image_seq_len")->i64;
    const char *name = ct_json_get(c, "name")->str;
    if (case_config(ct_json_get(c, "config"), &sc, &err)) {
      bad++;
      fprintf(stderr, "  %s: %s\n", name, err.msg);
      continue;
    }
    double mu = ct_fm_calculate_shift(&sc, seq);
    float *sig = malloc(sizeof(float) * (N + 1)), *ts = malloc(sizeof(float) * N);
    const ct_json *gs = ct_json_get(c, "sigmas");
    int nan = gs->items[0].type != CT_JSON_NUMBER; /* diffusers' NaN (written as NaN) */
    ct_status st = ct_fm_flux_timesteps(&sc, N, seq, sig, ts, &err);
    int ok = mu == ct_json_get(c, "mu")->num;
    if (nan) {
      ok = ok && st == CT_ERR_INVALID && strstr(err.msg, "shift_terminal");
      refused += ok;
    } else {
      ok = ok && !st && same_floats(sig, gs, N + 1) &&
           same_floats(ts, ct_json_get(c, "timesteps"), N);
      const ct_json *x0 = ct_json_get(c, "x0"), *v = ct_json_get(c, "v");
      if (ok && x0) {
        float x[12], vv[12];
        for (int i = 0; i < 12; i++) x[i] = (float)x0->items[i].num;
        for (int s = 0; s < N; s++) {
          for (int i = 0; i < 12; i++) vv[i] = (float)v->items[s].items[i].num;
          ct_fm_step(sig, s, vv, x, 12);
        }
        ok = same_floats(x, ct_json_get(c, "x_final"), 12);
        stepped++;
      }
    }
    if (!ok && bad++ < 6)
      fprintf(stderr, "  %s N=%d seq=%ld differs (mu %.17g, sigma0 %.9g, st %d)\n", name, N, seq,
              mu, (double)sig[0], (int)st);
    free(sig);
    free(ts);
  }
  CHECKF(bad == 0, "%d of %zu cases differ from diffusers", bad, cases->n);
  fprintf(stderr,
          "  %zu cases equal to diffusers bit for bit (%d with Euler steps), %d NaN schedules "
          "refused\n",
          cases->n - (size_t)bad, stepped, refused);
  ct_json_free(g);
}

CT_TEST(fm_sched, config_errors) {
  ct_err err = {0};
  ct_fm_sched_config c;
  char path[4096];
  snprintf(path, sizeof path, "%s/sched_bad.json", ct_test_tmpdir());
  const char *bad =
      "{\"_class_name\": \"EulerDiscreteScheduler\", \"use_karras_sigmas\": true, "
      "\"stochastic_sampling\": true, \"time_shift_type\": \"cosine\", \"shift\": "
      "\"3\", \"num_train_timesteps\": 0}";
  REQUIRE(!ct_write_file_atomic(path, bad, strlen(bad), &err));
  ct_status st = ct_fm_sched_config_read(path, &c, &err);
  CHECKF(st && strstr(err.msg, "_class_name") && strstr(err.msg, "use_karras_sigmas") &&
             strstr(err.msg, "stochastic_sampling") && strstr(err.msg, "time_shift_type") &&
             strstr(err.msg, "shift must") && strstr(err.msg, "num_train_timesteps"),
         "%s", st ? err.msg : "accepted");
  /* false flags, null shift_terminal and unknown fields are fine */
  const char *ok =
      "{\"use_karras_sigmas\": false, \"shift_terminal\": null, \"future\": 1, "
      "\"use_dynamic_shifting\": true}";
  REQUIRE(!ct_write_file_atomic(path, ok, strlen(ok), &err));
  CHECKF(!ct_fm_sched_config_read(path, &c, &err), "%s", err.msg);
  CHECK(c.use_dynamic_shifting && c.shift_terminal == 0 && c.num_train_timesteps == 1000);
  /* FLUX.1-dev at 1024x1024 (4096 image tokens): mu = 1.15, 28 steps from 1 */
  float sig[29], ts[28];
  REQUIRE(!ct_fm_flux_timesteps(&c, 28, 4096, sig, ts, &err));
  CHECK(fabs(ct_fm_calculate_shift(&c, 4096) - 1.15) < 1e-12);
  CHECK(sig[0] == 1.0f && ts[0] == 1000.0f && sig[28] == 0.0f);
  for (int i = 0; i < 28; i++) CHECK(sig[i + 1] < sig[i]);
  CHECK(ct_fm_flux_timesteps(&c, 0, 4096, sig, ts, &err) == CT_ERR_RANGE);
}

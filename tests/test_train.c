/* Trainer helpers without a training run: metrics.jsonl trimmed for a
 * resume (the steps past the checkpoint must go, or a resumed run writes
 * them twice), and secrets wiped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/alloc.h"
#include "ctuner/config.h"
#include "harness.h"
#include "train/train_int.h"

static int count_lines(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  int n = 0, c;
  while ((c = fgetc(f)) != EOF) n += c == '\n';
  fclose(f);
  return n;
}

static void write_metrics(const char *path, int steps) {
  FILE *f = fopen(path, "wb");
  for (int s = 1; s <= steps; s++) fprintf(f, "{\"step\": %d, \"loss\": 0.5}\n", s);
  fprintf(f, "{\"step\": 2, \"validation_psnr\": 20.0}\n");
  fclose(f);
}

CT_TEST(train, metrics_trimmed_for_a_resume) {
  char dir[4096], p[4200];
  snprintf(dir, sizeof dir, "%s/metrics", ct_test_tmpdir());
  mkdir(dir, 0755);
  snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
  write_metrics(p, 5);
  FILE *f = ct_train_open_metrics(dir, 3);
  CHECK(f != NULL);
  if (f) fclose(f);
  CHECK(count_lines(p) == 4);        /* steps 1-3 and the validation line of step 2 */
  f = ct_train_open_metrics(dir, 0); /* a new run starts it empty */
  CHECK(f != NULL);
  if (f) fclose(f);
  CHECK(count_lines(p) == 0);
}

CT_TEST(train, metrics_trim_failure_is_an_error) {
  /* the temporary file cannot be made (a directory stands in its place):
   * appending to the untrimmed file would repeat steps 4-5, so it fails */
  char dir[4096], p[4200], t[4300];
  snprintf(dir, sizeof dir, "%s/metrics_fail", ct_test_tmpdir());
  mkdir(dir, 0755);
  snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
  snprintf(t, sizeof t, "%s.tmp", p);
  write_metrics(p, 5);
  mkdir(t, 0755);
  FILE *f = ct_train_open_metrics(dir, 3);
  CHECK(f == NULL);
  if (f) fclose(f);
  CHECK(count_lines(p) == 6); /* untouched */
  rmdir(t);
}

CT_TEST(train, secrets_wiped) {
  char buf[16];
  memset(buf, 'k', sizeof buf);
  ct_wipe(buf, 8);
  for (int i = 0; i < 8; i++) CHECK(buf[i] == 0);
  CHECK(buf[8] == 'k');
  ct_wipe(NULL, 4); /* no-op */
  ct_free_secret(NULL);
  char *s = malloc(7);
  memcpy(s, "secret", 7);
  ct_free_secret(s);
}

/* flow_schedule_auto_shift: e^mu of FluxPipeline's calculate_shift (base 256
 * tokens -> mu 0.5, max 4096 -> mu 1.15), and the static shift it feeds;
 * flow_shift 0 means no shift (SimpleTuner), not t -> 0. */
CT_TEST(train, flow_shift_auto_and_zero) {
  CHECK(fabsf(ct_flow_auto_shift(256) - expf(0.5f)) < 1e-5f);
  CHECK(fabsf(ct_flow_auto_shift(4096) - expf(1.15f)) < 1e-5f);
  CHECK(fabsf(ct_flow_auto_shift(1024) - expf(0.5f + 0.65f * 768.0f / 3840.0f)) < 1e-5f);
  CHECK(ct_flow_shift_t(0.3f, 0.0f) == 0.3f);
  CHECK(ct_flow_shift_t(0.3f, 1.0f) == 0.3f);
  const float s = 3.0f, t = 0.3f;
  CHECK(fabsf(ct_flow_shift_t(t, s) - s * t / (1 + (s - 1) * t)) < 1e-7f);
  ct_config c;
  ct_err err = {0};
  ct_config_defaults(&c);
  REQUIRE(ct_config_set(&c, "flow_schedule_auto_shift", "true", &err) == CT_OK);
  CHECK(ct_config_validate(&c, &err) == CT_ERR_INVALID && strstr(err.msg, "flow_shift"));
  REQUIRE(ct_config_set(&c, "flow_schedule_shift", "0", &err) == CT_OK);
  CHECKF(ct_config_validate(&c, &err) == CT_OK, "%s", err.msg);
  ct_config_free(&c);
}

/* Health tests: webhook_config validation, event bodies (raw and Discord),
 * fault verdicts on NVML readings, the assignment of GPUs to ranks, the
 * breaker opening on the fake NVML library (tests/fake/fake_nvml.c), the
 * sender's bounded shutdown against a dead endpoint, disk checks, and the
 * redaction of auth tokens in the saved configuration. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctuner/config.h"
#include "ctuner/json.h"
#include "harness.h"
#include "health/health_int.h"

static const char *tmpfile_with(const char *name, const char *text) {
  static char path[1024];
  snprintf(path, sizeof path, "%s/%s", ct_test_tmpdir(), name);
  FILE *f = fopen(path, "w");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
  return path;
}

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

CT_TEST(health, webhook_config) {
  ct_hook *h = NULL;
  int n = 0;
  ct_err err = {0};
  /* an object, inline */
  REQUIRE(
      ct_hooks_parse("{\"webhook_type\": \"discord\", \"webhook_url\": \"https://example.com/x\"}",
                     &h, &n, &err) == CT_OK);
  CHECK(n == 1 && h[0].type == CT_HOOK_DISCORD && h[0].log_level == CT_SEV_INFO &&
        !h[0].auth_token);
  ct_hooks_free(h, n);
  /* a list from a file, with {env:VAR} in the token */
  setenv("CT_TEST_HOOK_TOKEN", "tok-123", 1);
  const char *p = tmpfile_with(
      "hooks.json",
      "[{\"webhook_type\": \"raw\", \"callback_url\": \"http://127.0.0.1:9/cb\", "
      "\"auth_token\": \"{env:CT_TEST_HOOK_TOKEN}\", \"log_level\": \"warning\", "
      "\"ssl_no_verify\": true},"
      " {\"webhook_type\": \"discord\", \"webhook_url\": \"https://d/x\", \"message_prefix\": "
      "\"run\"}]");
  REQUIRE(ct_hooks_parse(p, &h, &n, &err) == CT_OK);
  CHECK(n == 2);
  CHECK(h[0].type == CT_HOOK_RAW && !strcmp(h[0].url, "http://127.0.0.1:9/cb"));
  CHECK(h[0].auth_token && !strcmp(h[0].auth_token, "tok-123"));
  CHECK(h[0].log_level == CT_SEV_WARNING && h[0].ssl_no_verify == 1);
  CHECK(!strcmp(h[1].message_prefix, "run"));
  ct_hooks_free(h, n);
  /* errors name the entry and the key */
  static const struct {
    const char *json, *want;
  } bad[] = {
      {"{\"webhook_url\": \"https://x\"}", "entry 0: webhook_type is required"},
      {"{\"webhook_type\": \"slack\", \"webhook_url\": \"https://x\"}",
       "webhook_type 'slack' is not supported"},
      {"{\"webhook_type\": \"discord\"}", "needs webhook_url"},
      {"[{\"webhook_type\": \"discord\", \"webhook_url\": \"https://x\"}, {\"webhook_type\": "
       "\"raw\"}]",
       "entry 1: a raw webhook needs callback_url"},
      {"{\"webhook_type\": \"raw\", \"callback_url\": \"ftp://x\"}",
       "must start with http:// or https://"},
      {"{\"webhook_type\": \"raw\", \"callback_url\": \"http://x\", \"log_level\": \"loud\"}",
       "log_level 'loud'"},
      {"{\"webhook_type\": \"raw\", \"callback_url\": \"http://x\", \"ssl_no_verify\": \"yes\"}",
       "ssl_no_verify must be true or false"},
      {"{\"webhook_type\": \"raw\", \"callback_url\": 5}", "callback_url must be a string"},
      {"[]", "an empty list"},
      {"[1]", "entry 0 must be an object"},
      {"{\"webhook_type\": ", "inline JSON"},
      {"/nonexistent/hooks.json", "webhook_config file not found: /nonexistent/hooks.json"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memset(&err, 0, sizeof err);
    CHECKF(ct_hooks_parse(bad[i].json, &h, &n, &err) != CT_OK, "%s accepted", bad[i].json);
    CHECKF(strstr(err.msg, bad[i].want) != NULL, "%s: '%s' lacks '%s'", bad[i].json, err.msg,
           bad[i].want);
  }
}

CT_TEST(health, event_bodies) {
  ct_hook raw = {CT_HOOK_RAW, "http://x", NULL, CT_SEV_INFO, NULL, 0};
  ct_hook dis = {CT_HOOK_DISCORD, "http://x", "proj run", CT_SEV_INFO, NULL, 0};
  ct_event ev = {"training.checkpoint", CT_SEV_INFO,
                 ", \"title\": \"t\", \"checkpoint\": {\"path\": \"a\\\"b\", \"is_final\": true}",
                 "Checkpoint \"saved\"", 1769000000.25};
  char *b = ct_event_body(&ev, &raw, "job-7");
  REQUIRE(b);
  ct_json *j = NULL;
  ct_err err = {0};
  REQUIRE(ct_json_parse(b, strlen(b), &j, &err) == CT_OK);
  CHECK(!strcmp(ct_json_get(j, "type")->str, "training.checkpoint"));
  CHECK(!strcmp(ct_json_get(j, "severity")->str, "info"));
  CHECK(!strcmp(ct_json_get(j, "job_id")->str, "job-7"));
  /* ISO 8601 in UTC with microseconds, as Python's isoformat() */
  CHECKF(!strcmp(ct_json_get(j, "timestamp")->str, "2026-01-21T12:53:20.250000+00:00"), "%s",
         ct_json_get(j, "timestamp")->str);
  CHECK(!strcmp(ct_json_get(ct_json_get(j, "checkpoint"), "path")->str, "a\"b"));
  ct_json_free(j);
  free(b);
  b = ct_event_body(&ev, &raw, "");
  REQUIRE(b && ct_json_parse(b, strlen(b), &j, &err) == CT_OK);
  CHECK(ct_json_get(j, "job_id")->type == CT_JSON_NULL);
  ct_json_free(j);
  free(b);
  /* Discord: content only, the prefix as SimpleTuner writes it */
  b = ct_event_body(&ev, &dis, "job-7");
  REQUIRE(b && ct_json_parse(b, strlen(b), &j, &err) == CT_OK);
  CHECK(j->n == 1 && !strcmp(ct_json_get(j, "content")->str, "`(proj run)` Checkpoint \"saved\""));
  ct_json_free(j);
  free(b);
  /* at most 2000 characters, cut between UTF-8 characters */
  char *big = malloc(3 * 2100 + 1);
  for (int i = 0; i < 2100; i++) memcpy(big + 3 * i, "\xe2\x82\xac", 3); /* the euro sign */
  big[3 * 2100] = 0;
  ct_event e2 = {"error", CT_SEV_ERROR, NULL, big, 0};
  dis.message_prefix = NULL;
  b = ct_event_body(&e2, &dis, NULL);
  REQUIRE(b && ct_json_parse(b, strlen(b), &j, &err) == CT_OK);
  CHECK(strlen(ct_json_get(j, "content")->str) == 3 * 2000);
  ct_json_free(j);
  free(b);
  free(big);
}

CT_TEST(health, verdicts) {
  ct_gpu_limits lim = {10, 5};
  ct_gpu_reading g = {0, "G", "U", 60, 95, 0, 3, 0, 20.0};
  const char *type;
  char msg[400];
  CHECK(ct_gpu_judge(&g, 3, &lim, &type, msg, sizeof msg) == CT_GPU_OK);
  g.ecc_double = 12; /* 9 new */
  CHECK(ct_gpu_judge(&g, 3, &lim, &type, msg, sizeof msg) == CT_GPU_OK);
  g.ecc_double = 13; /* 10 new */
  CHECK(ct_gpu_judge(&g, 3, &lim, &type, msg, sizeof msg) == CT_GPU_FATAL &&
        !strcmp(type, "ecc_errors"));
  CHECK(strstr(msg, "10 new uncorrectable") != NULL);
  g.ecc_double = -1; /* no ECC on this GPU: never a fault */
  CHECK(ct_gpu_judge(&g, -1, &lim, &type, msg, sizeof msg) == CT_GPU_OK);
  g.temperature = 89;
  CHECK(ct_gpu_judge(&g, -1, &lim, &type, msg, sizeof msg) == CT_GPU_OK);
  g.temperature = 90;
  CHECK(ct_gpu_judge(&g, -1, &lim, &type, msg, sizeof msg) == CT_GPU_FATAL &&
        !strcmp(type, "temperature"));
  g.temperature = 60;
  g.throttle = CT_THROTTLE_SW_POWER_CAP | CT_THROTTLE_SW_THERMAL; /* normal under load */
  CHECK(ct_gpu_judge(&g, -1, &lim, &type, msg, sizeof msg) == CT_GPU_OK);
  g.throttle = CT_THROTTLE_HW_THERMAL;
  CHECK(ct_gpu_judge(&g, -1, &lim, &type, msg, sizeof msg) == CT_GPU_WARNING &&
        !strcmp(type, "thermal"));
  g.throttle = CT_THROTTLE_HW_SLOWDOWN | CT_THROTTLE_HW_THERMAL;
  CHECK(ct_gpu_judge(&g, -1, &lim, &type, msg, sizeof msg) == CT_GPU_FATAL &&
        !strcmp(type, "throttle"));
  g.throttle = CT_THROTTLE_HW_POWER_BRAKE;
  CHECK(ct_gpu_judge(&g, -1, &lim, &type, msg, sizeof msg) == CT_GPU_FATAL &&
        !strcmp(type, "throttle"));
  char names[256];
  ct_throttle_names(0x48, names, sizeof names);
  CHECK(!strcmp(names, "\"hw_slowdown\", \"hw_thermal_slowdown\""));
}

/* keys[r][k] for ct_gpu_assign */
static void set_key(char *keys, int max, size_t kl, int r, int k, const char *v) {
  snprintf(keys + ((size_t)r * (size_t)max + (size_t)k) * kl, kl, "%s", v);
}

CT_TEST(health, gpu_assignment) {
  enum { MAX = 4, KL = 32 };
  char keys[3 * MAX * KL];
  int mine[MAX];
  /* two ranks seeing the same two GPUs: one each */
  memset(keys, 0, sizeof keys);
  set_key(keys, MAX, KL, 0, 0, "h/A"), set_key(keys, MAX, KL, 0, 1, "h/B");
  set_key(keys, MAX, KL, 1, 0, "h/A"), set_key(keys, MAX, KL, 1, 1, "h/B");
  ct_gpu_assign(keys, 2, MAX, KL, 0, mine);
  CHECK(mine[0] == 1 && mine[1] == 0);
  ct_gpu_assign(keys, 2, MAX, KL, 1, mine);
  CHECK(mine[0] == 0 && mine[1] == 1);
  /* per-rank CUDA_VISIBLE_DEVICES: each its own */
  memset(keys, 0, sizeof keys);
  set_key(keys, MAX, KL, 0, 0, "h/A"), set_key(keys, MAX, KL, 1, 0, "h/B");
  ct_gpu_assign(keys, 2, MAX, KL, 1, mine);
  CHECK(mine[0] == 1);
  /* three ranks, one GPU: watched once, by rank 0 */
  memset(keys, 0, sizeof keys);
  for (int r = 0; r < 3; r++) set_key(keys, MAX, KL, r, 0, "h/A");
  int total = 0;
  for (int r = 0; r < 3; r++) {
    ct_gpu_assign(keys, 3, MAX, KL, r, mine);
    total += mine[0];
    if (r == 0) CHECK(mine[0] == 1);
  }
  CHECK(total == 1);
  /* the same UUID on two hosts is two GPUs */
  memset(keys, 0, sizeof keys);
  set_key(keys, MAX, KL, 0, 0, "h1/A"), set_key(keys, MAX, KL, 1, 0, "h2/A");
  ct_gpu_assign(keys, 2, MAX, KL, 1, mine);
  CHECK(mine[0] == 1);
}

static void health_cfg(ct_config *cfg, const char *state) {
  ct_config_defaults(cfg);
  char lib[1200];
  snprintf(lib, sizeof lib, "%s/libnvidia-ml-fake.so", CT_BINARY_DIR);
  free(cfg->health_nvml_library);
  cfg->health_nvml_library = strdup(lib);
  cfg->health_poll_interval = 0.02;
  setenv("CTUNER_FAKE_NVML_STATE", state, 1);
}

CT_TEST(health, breaker_on_fake_nvml) {
  char state[1024];
  snprintf(state, sizeof state, "%s/nvml_state", ct_test_tmpdir());
  tmpfile_with("nvml_state", "count 2\ngpu 0 ecc_dbe 4\n");
  ct_config cfg;
  health_cfg(&cfg, state);
  unsetenv("CUDA_VISIBLE_DEVICES");
  ct_health *h = NULL;
  ct_err err = {0};
  REQUIRE(ct_health_open(&cfg, NULL, &h, &err) == CT_OK);
  usleep(100000);
  CHECK(!ct_health_is_open(h));
  /* a thermal slowdown is a warning: the breaker stays closed */
  tmpfile_with("nvml_state", "count 2\ngpu 0 ecc_dbe 4\ngpu 1 throttle 0x40\n");
  usleep(150000);
  CHECK(!ct_health_is_open(h));
  /* 10 uncorrected errors more than at start on GPU 0: open */
  tmpfile_with("nvml_state", "count 2\ngpu 0 ecc_dbe 14\n");
  double t0 = mono();
  while (!ct_health_is_open(h) && mono() - t0 < 60) usleep(10000);
  CHECK(ct_health_is_open(h));
  CHECKF(
      strstr(ct_health_reason(h), "GPU 0") && strstr(ct_health_reason(h), "10 new uncorrectable"),
      "%s", ct_health_reason(h));
  /* it never closes again */
  tmpfile_with("nvml_state", "count 2\n");
  usleep(100000);
  CHECK(ct_health_is_open(h));
  ct_health_close(h);
  /* CUDA_VISIBLE_DEVICES=1: only GPU 1 is watched; GPU 0's temperature is not ours */
  tmpfile_with("nvml_state", "count 2\ngpu 0 temp 94\n");
  setenv("CUDA_VISIBLE_DEVICES", "1", 1);
  REQUIRE(ct_health_open(&cfg, NULL, &h, &err) == CT_OK);
  usleep(150000);
  CHECK(!ct_health_is_open(h));
  tmpfile_with("nvml_state", "count 2\ngpu 1 temp 91\n");
  t0 = mono();
  while (!ct_health_is_open(h) && mono() - t0 < 60) usleep(10000);
  CHECKF(ct_health_is_open(h) && strstr(ct_health_reason(h), "shutdown temperature"), "%s",
         ct_health_reason(h));
  ct_health_close(h);
  /* by UUID, as CUDA_VISIBLE_DEVICES may name them */
  setenv("CUDA_VISIBLE_DEVICES", "GPU-fake-0000-0001", 1);
  tmpfile_with("nvml_state", "count 2\ngpu 1 throttle 0x80\n");
  REQUIRE(ct_health_open(&cfg, NULL, &h, &err) == CT_OK);
  t0 = mono();
  while (!ct_health_is_open(h) && mono() - t0 < 60) usleep(10000);
  CHECKF(ct_health_is_open(h) && strstr(ct_health_reason(h), "GPU 1"), "%s", ct_health_reason(h));
  ct_health_close(h);
  unsetenv("CUDA_VISIBLE_DEVICES");
  /* no NVML at all: nothing monitored, never open */
  free(cfg.health_nvml_library);
  cfg.health_nvml_library = strdup("/nonexistent/libnvidia-ml.so.1");
  REQUIRE(ct_health_open(&cfg, NULL, &h, &err) == CT_OK);
  usleep(50000);
  CHECK(!ct_health_is_open(h));
  /* a runtime fault opens it */
  ct_health_runtime_fault(h, "runtime_error", "MemoryError", "out of memory for the batch buffers",
                          1);
  CHECK(ct_health_is_open(h) && strstr(ct_health_reason(h), "out of memory"));
  ct_health_close(h);
  ct_config_free(&cfg);
}

CT_TEST(health, sender_never_blocks) {
  /* a port nobody listens on: every attempt fails at once */
  ct_hook *h = NULL;
  int n = 0;
  ct_err err = {0};
  REQUIRE(ct_hooks_parse("{\"webhook_type\": \"raw\", \"callback_url\": \"http://127.0.0.1:9/x\"}",
                         &h, &n, &err) == CT_OK);
  ct_sender_opts o = {1.0, 50, 0.05, 4, 0};
  ct_sender *s = NULL;
  REQUIRE(ct_sender_start(h, n, &o, "j", &s, &err) == CT_OK);
  double t0 = mono();
  for (int i = 0; i < 100; i++) { /* a full queue drops; posting never waits */
    ct_event ev = {"training.status", CT_SEV_INFO, strdup(""), strdup("x"), 0};
    ct_sender_post(s, &ev);
  }
  CHECK(mono() - t0 < 2.0); /* (microseconds; 2 s for a loaded machine under ASan) */
  long sent = -1, failed = -1, dropped = -1;
  t0 = mono();
  ct_sender_stop(s, 0.3, &sent, &failed,
                 &dropped); /* 50 retries would take minutes: cut at the grace */
  /* the grace (0.3 s) and one attempt's timeout (1 s) at most; 5 s for a loaded machine */
  CHECKF(mono() - t0 < 5.0, "stop took %.2f s", mono() - t0);
  CHECK(sent == 0);
  CHECKF(dropped >= 95 && failed + dropped == 100, "failed %ld dropped %ld", failed, dropped);
  /* a fault is never dropped for status events: the oldest info event makes room */
  REQUIRE(ct_hooks_parse("{\"webhook_type\": \"raw\", \"callback_url\": \"http://127.0.0.1:9/x\"}",
                         &h, &n, &err) == CT_OK);
  ct_sender_opts o2 = {1.0, 0, 0.05, 4, 1}; /* paused: the queue only fills */
  REQUIRE(ct_sender_start(h, n, &o2, "j", &s, &err) == CT_OK);
  for (int i = 0; i < 10; i++) {
    ct_event ev = {"training.status", CT_SEV_INFO, strdup(""), strdup("x"), 0};
    ct_sender_post(s, &ev);
  }
  CHECK(ct_sender_queued(s, CT_SEV_DEBUG) == 4 && ct_sender_queued(s, CT_SEV_WARNING) == 0);
  ct_event fault = {"gpu.fault", CT_SEV_CRITICAL, strdup(""), strdup("x"), 0};
  ct_sender_post(s, &fault);
  CHECK(ct_sender_queued(s, CT_SEV_DEBUG) == 4 && ct_sender_queued(s, CT_SEV_CRITICAL) == 1);
  ct_sender_stop(s, 1.0, &sent, &failed, &dropped);
  CHECKF(dropped == 7 && failed == 4, "failed %ld dropped %ld", failed, dropped);
}

CT_TEST(health, disk_check) {
  ct_config cfg;
  char state[1024];
  snprintf(state, sizeof state, "%s/nvml_state2", ct_test_tmpdir());
  health_cfg(&cfg, state);
  ct_health *h = NULL;
  ct_err err = {0};
  cfg.disk_low_threshold = strdup("1K");
  REQUIRE(ct_health_open(&cfg, NULL, &h, &err) == CT_OK);
  CHECK(ct_health_disk_verdict(h, ct_test_tmpdir(), 0, &err) == 0);
  ct_health_close(h);
  free(cfg.disk_low_threshold);
  cfg.disk_low_threshold = strdup("1000000T"); /* more than any disk */
  REQUIRE(ct_health_open(&cfg, NULL, &h, &err) == CT_OK);
  CHECK(ct_health_disk_verdict(h, ct_test_tmpdir(), 0, &err) == 2);
  CHECK(strstr(err.msg, "below disk_low_threshold") && strstr(err.msg, "not written"));
  ct_health_close(h);
  /* wait: asks to poll again, every round */
  free(cfg.disk_low_action);
  cfg.disk_low_action = strdup("wait");
  REQUIRE(ct_health_open(&cfg, NULL, &h, &err) == CT_OK);
  CHECK(ct_health_disk_verdict(h, ct_test_tmpdir(), 0, &err) == 1);
  CHECK(ct_health_disk_verdict(h, ct_test_tmpdir(), 1, &err) == 1);
  ct_health_close(h);
  /* script: it runs (with the free bytes in its environment), then the space is checked again */
  char marker[1100], script[2300];
  snprintf(marker, sizeof marker, "%s/script_ran", ct_test_tmpdir());
  snprintf(script, sizeof script, "echo \"$CTUNER_FREE_BYTES\" > '%s'", marker);
  free(cfg.disk_low_action);
  cfg.disk_low_action = strdup("script");
  cfg.disk_low_script = strdup(script);
  REQUIRE(ct_health_open(&cfg, NULL, &h, &err) == CT_OK);
  CHECK(ct_health_disk_verdict(h, ct_test_tmpdir(), 0, &err) == 2);
  ct_health_close(h);
  size_t len = 0;
  char *got = ct_test_slurp(marker, &len);
  CHECK(got && atoll(got) > 0);
  free(got);
  ct_config_free(&cfg);
  CHECK(ct_parse_bytes("10G") == 10LL << 30);
  CHECK(ct_parse_bytes("500M") == 500LL << 20);
  CHECK(ct_parse_bytes("1.5GiB") == 3LL << 29);
  CHECK(ct_parse_bytes("1048576") == 1048576);
  CHECK(ct_parse_bytes("12B") == 12);
  CHECK(ct_parse_bytes("10Q") == -1 && ct_parse_bytes("") == -1 && ct_parse_bytes("-5") == -1);
}

CT_TEST(health, config_redacts_tokens) {
  ct_config cfg;
  ct_config_defaults(&cfg);
  ct_err err = {0};
  REQUIRE(
      ct_config_set(&cfg, "webhook_config",
                    "[{\"webhook_type\": \"raw\", \"callback_url\": "
                    "\"http://u:pw@ops.example:8080/cb?key=k3y\", "
                    "\"auth_token\": \"s3cr3t\"}, {\"webhook_type\": \"discord\", \"webhook_url\": "
                    "\"https://discord.com/api/webhooks/123/T0KEN\"}]",
                    &err) == CT_OK);
  REQUIRE(ct_config_validate(&cfg, &err) == CT_OK);
  char *j = ct_config_to_json(&cfg);
  REQUIRE(j);
  CHECKF(!strstr(j, "s3cr3t") && !strstr(j, "k3y") && !strstr(j, "T0KEN") && !strstr(j, "pw@"),
         "%s", j);
  CHECK(strstr(j, "http://ops.example:8080/<redacted>") &&
        strstr(j, "https://discord.com/<redacted>"));
  free(j);
  /* a URL where the config goes is refused without echoing it */
  CHECK(ct_health_check_webhooks("https://discord.com/api/webhooks/123/T0KEN", &err) ==
        CT_ERR_INVALID);
  CHECK(!strstr(err.msg, "T0KEN") && strstr(err.msg, "looks like a URL"));
  /* the values the health keys accept */
  CHECK(ct_config_set(&cfg, "disk_low_action", "panic", &err) == CT_OK);
  CHECK(ct_config_validate(&cfg, &err) == CT_ERR_INVALID && strstr(err.msg, "disk_low_action"));
  ct_config_free(&cfg);
}

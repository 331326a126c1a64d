/* test_core.c: suite `core` — status names, error context, allocation
 * accounting, overflow-checked sizes, Philox RNG (known answers, thread-count
 * independence, moments), logging sinks and thread settings. */
#include <omp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctuner/alloc.h"
#include "ctuner/fs.h"
#include "ctuner/log.h"
#include "ctuner/parallel.h"
#include "ctuner/rng.h"
#include "ctuner/status.h"
#include "harness.h"

CT_TEST(core, status_names) {
  CHECK(!strcmp(ct_status_name(CT_OK), "CT_OK"));
  CHECK(!strcmp(ct_status_name(CT_ERR_IO), "CT_ERR_IO"));
  CHECK(!strcmp(ct_status_name(CT_ERR_INTERNAL), "CT_ERR_INTERNAL"));
  CHECK(!strcmp(ct_status_name((ct_status)999), "CT_UNKNOWN"));
  CHECK(!strcmp(ct_status_desc(CT_ERR_NOMEM), "out of memory"));
  CHECK(!strcmp(ct_status_desc(CT_ERR_FORMAT), "malformed input"));
  CHECK(CT_ERR_FORMAT == 3 && CT_ERR_TOLERANCE == 10);
}

CT_TEST(core, errf_prefix_clear) {
  ct_err e = {0};
  ct_status st = ct_errf(&e, CT_ERR_IO, "cannot open %s: %s", "x.bin", "No such file");
  CHECK(st == CT_ERR_IO);
  CHECK(e.status == CT_ERR_IO);
  CHECK(!strcmp(e.msg, "cannot open x.bin: No such file"));
  ct_err_prefix(&e, "loading %s: ", "model");
  CHECK(!strcmp(e.msg, "loading model: cannot open x.bin: No such file"));
  /* NULL err is allowed and still returns the status. */
  CHECK(ct_errf(NULL, CT_ERR_RANGE, "x") == CT_ERR_RANGE);
  ct_err_prefix(NULL, "y");
  /* Long messages truncate, never overflow. */
  char big[3000];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  ct_errf(&e, CT_ERR_INVALID, "%s", big);
  CHECK(strlen(e.msg) == sizeof e.msg - 1);
  ct_err_prefix(&e, "%s", "pre: ");
  CHECK(strlen(e.msg) == sizeof e.msg - 1);
  CHECK(!strncmp(e.msg, "pre: aaa", 8));
  ct_err_clear(&e);
  CHECK(e.status == CT_OK && e.msg[0] == '\0');
}

CT_TEST(core, alloc_accounting) {
  ct_mem_stats s0, s1, s2, s3;
  ct_mem_get_stats(&s0);
  ct_mem_reset_peak();
  ct_mem_get_stats(&s0);
  CHECK(s0.total_peak == s0.total_current);
  float *a = ct_alloc(CT_MEM_PARAMS, 1000);
  float *b = ct_calloc(CT_MEM_GRADS, 250, 8);
  REQUIRE(a && b);
  CHECK(((uintptr_t)a % 64) == 0);
  CHECK(((uintptr_t)b % 64) == 0);
  for (int i = 0; i < 500; i++) CHECK(((char *)b)[i] == 0);
  memset(a, 1, 1000);
  ct_mem_get_stats(&s1);
  CHECK(s1.current[CT_MEM_PARAMS] == s0.current[CT_MEM_PARAMS] + 1000);
  CHECK(s1.current[CT_MEM_GRADS] == s0.current[CT_MEM_GRADS] + 2000);
  CHECK(s1.total_current == s0.total_current + 3000);
  CHECK(s1.peak[CT_MEM_PARAMS] >= s1.current[CT_MEM_PARAMS]);
  CHECK(s1.total_peak == s1.total_current);
  ct_free(a);
  ct_mem_get_stats(&s2);
  CHECK(s2.current[CT_MEM_PARAMS] == s0.current[CT_MEM_PARAMS]);
  CHECK(s2.total_current == s0.total_current + 2000);
  CHECK(s2.peak[CT_MEM_PARAMS] == s1.peak[CT_MEM_PARAMS]); /* peak stays */
  CHECK(s2.total_peak == s1.total_peak);
  ct_free(b);
  ct_mem_reset_peak();
  ct_mem_get_stats(&s3);
  CHECK(s3.total_current == s0.total_current);
  CHECK(s3.total_peak == s3.total_current);
  CHECK(s3.peak[CT_MEM_GRADS] == s3.current[CT_MEM_GRADS]);
  ct_free(NULL);
  CHECK(ct_alloc(CT_MEM_OTHER, 0) == NULL);
  CHECK(ct_calloc(CT_MEM_OTHER, SIZE_MAX / 2, 4) == NULL);
  CHECK(!strcmp(ct_mem_cat_name(CT_MEM_PARAMS), "params"));
  CHECK(!strcmp(ct_mem_cat_name(CT_MEM_OPTIMIZER), "optimizer"));
  CHECK(!strcmp(ct_mem_cat_name(CT_MEM_ACTIVATIONS), "activations"));
}

CT_TEST(core, alloc_concurrent) {
  ct_mem_stats s0, s1;
  ct_mem_get_stats(&s0);
#pragma omp parallel for num_threads(2) schedule(static)
  for (int i = 0; i < 2000; i++) {
    void *p = ct_alloc(CT_MEM_BUFFERS, (size_t)(i % 97) + 1);
    ct_free(p);
  }
  ct_mem_get_stats(&s1);
  CHECK(s1.current[CT_MEM_BUFFERS] == s0.current[CT_MEM_BUFFERS]);
  CHECK(s1.total_current == s0.total_current);
}

CT_TEST(core, mul_size) {
  size_t r = 0;
  CHECK(ct_mul_size(3, 4, &r) == 0 && r == 12);
  CHECK(ct_mul_size(0, SIZE_MAX, &r) == 0 && r == 0);
  CHECK(ct_mul_size(SIZE_MAX, 1, &r) == 0 && r == SIZE_MAX);
  CHECK(ct_mul_size(SIZE_MAX / 2 + 1, 2, &r) == -1);
  CHECK(ct_mul_size((size_t)1 << 32, (size_t)1 << 32, &r) == -1);
  CHECK(ct_mul_size(((size_t)1 << 32) - 1, ((size_t)1 << 32) + 1, &r) == 0 && r == SIZE_MAX);
}

/* Random123 kat_vectors for philox4x32_10: counter words, key words, output. */
CT_TEST(core, philox_kat) {
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
       0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
       0x94fdcceb, 0x5001e420, 0x24126ea1},
  };
  for (int v = 0; v < 3; v++) {
    uint32_t out[4], out2[4];
    ct_philox4x32_raw(kat[v], kat[v] + 4, out);
    for (int i = 0; i < 4; i++)
      CHECKF(out[i] == kat[v][6 + i], "vector %d word %d: %08x", v, i, out[i]);
    /* Same vector through the (seed, stream, index) mapping:
     * ctr = (index lo, index hi, stream lo, stream hi), key = (seed lo, seed hi). */
    uint64_t index = (uint64_t)kat[v][1] << 32 | kat[v][0];
    uint64_t stream = (uint64_t)kat[v][3] << 32 | kat[v][2];
    uint64_t seed = (uint64_t)kat[v][5] << 32 | kat[v][4];
    ct_philox4x32(seed, stream, index, out2);
    for (int i = 0; i < 4; i++) CHECK(out2[i] == kat[v][6 + i]);
  }
}

CT_TEST(core, rng_uniform_normal_scalar) {
  uint32_t w[4];
  ct_philox4x32(42, 7, 1234, w);
  float u = ct_rng_uniform(42, 7, 1234);
  CHECK(u == (float)(w[0] >> 8) / 16777216.0f);
  CHECK(u >= 0.0f && u < 1.0f);
  /* Distinct streams and seeds give distinct values. */
  CHECK(ct_rng_uniform(42, 7, 1234) != ct_rng_uniform(42, 8, 1234));
  CHECK(ct_rng_uniform(42, 7, 1234) != ct_rng_uniform(43, 7, 1234));
  CHECK(ct_rng_normal(1, 2, 3) == ct_rng_normal(1, 2, 3));
  float mn = 1.0f, mx = 0.0f;
  for (uint64_t i = 0; i < 100000; i++) {
    float x = ct_rng_uniform(5, 0, i);
    if (x < mn) mn = x;
    if (x > mx) mx = x;
    float z = ct_rng_normal(5, 0, i);
    if (!isfinite(z)) {
      CHECK(isfinite(z));
      break;
    }
  }
  CHECK(mn >= 0.0f && mn < 1e-3f && mx < 1.0f && mx > 0.999f);
}

CT_TEST(core, rng_fill_thread_independent) {
  const size_t n = 100003;
  float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
  float *c = malloc(n * sizeof(float));
  REQUIRE(a && b && c);
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  ct_rng_fill_normal(a, n, 99, 3, 1000, 0.5f, 2.0f);
  omp_set_num_threads(2);
  ct_rng_fill_normal(b, n, 99, 3, 1000, 0.5f, 2.0f);
  CHECK(memcmp(a, b, n * sizeof(float)) == 0);
  /* Offset semantics: element i is index offset + i. */
  CHECK(a[5] == 0.5f + 2.0f * ct_rng_normal(99, 3, 1005));
  /* A fill split in two pieces equals one fill. */
  ct_rng_fill_normal(c, 50000, 99, 3, 1000, 0.5f, 2.0f);
  ct_rng_fill_normal(c + 50000, n - 50000, 99, 3, 1000 + 50000, 0.5f, 2.0f);
  CHECK(memcmp(a, c, n * sizeof(float)) == 0);
  omp_set_num_threads(1);
  ct_rng_fill_uniform(a, n, 11, 0, 0, -1.0f, 3.0f);
  omp_set_num_threads(2);
  ct_rng_fill_uniform(b, n, 11, 0, 0, -1.0f, 3.0f);
  CHECK(memcmp(a, b, n * sizeof(float)) == 0);
  int inrange = 1;
  for (size_t i = 0; i < n; i++) inrange &= (a[i] >= -1.0f && a[i] < 3.0f);
  CHECK(inrange);
  omp_set_num_threads(saved);
  free(a);
  free(b);
  free(c);
}

CT_TEST(core, rng_moments) {
  const size_t n = 1000000;
  float *x = malloc(n * sizeof(float));
  REQUIRE(x);
  ct_rng_fill_normal(x, n, 2024, 1, 0, 0.0f, 1.0f);
  double s = 0, s2 = 0, s3 = 0, s4 = 0;
  size_t tail = 0;
  for (size_t i = 0; i < n; i++) {
    double v = x[i];
    s += v;
    s2 += v * v;
    s3 += v * v * v;
    s4 += v * v * v * v;
    if (fabs(v) > 1.959964) tail++;
  }
  double mean = s / n, var = s2 / n - mean * mean;
  CHECK_NEAR(mean, 0.0, 0.005);  /* sd of the mean is 0.001 */
  CHECK_NEAR(var, 1.0, 0.01);    /* sd of the variance is ~0.0014 */
  CHECK_NEAR(s3 / n, 0.0, 0.02); /* skewness */
  CHECK_NEAR(s4 / n, 3.0, 0.05); /* kurtosis */
  CHECK_NEAR((double)tail / n, 0.05, 0.002);
  ct_rng_fill_uniform(x, n, 2024, 2, 0, 0.0f, 1.0f);
  s = s2 = 0;
  for (size_t i = 0; i < n; i++) {
    s += x[i];
    s2 += (double)x[i] * x[i];
  }
  CHECK_NEAR(s / n, 0.5, 0.002);
  CHECK_NEAR(s2 / n - (s / n) * (s / n), 1.0 / 12.0, 0.001);
  free(x);
}

typedef struct sink_rec {
  int calls;
  ct_log_level last;
  char msg[256];
} sink_rec;

static void test_sink(ct_log_level level, const char *msg, void *user) {
  sink_rec *r = user;
  r->calls++;
  r->last = level;
  snprintf(r->msg, sizeof r->msg, "%s", msg);
}

CT_TEST(core, log_sink_and_level) {
  sink_rec r = {0};
  ct_log_level saved = ct_log_get_level();
  ct_log_set_sink(test_sink, &r);
  ct_log_set_level(CT_LOG_INFO);
  CHECK(ct_log_get_level() == CT_LOG_INFO);
  CT_DEBUG("hidden %d", 1);
  CHECK(r.calls == 0);
  CT_INFO("step %d loss %.2f", 3, 0.5);
  CHECK(r.calls == 1 && r.last == CT_LOG_INFO);
  CHECK(!strcmp(r.msg, "step 3 loss 0.50"));
  CT_ERROR("boom");
  CHECK(r.calls == 2 && r.last == CT_LOG_ERROR);
  ct_log_set_level(CT_LOG_OFF);
  CT_ERROR("silenced");
  CHECK(r.calls == 2);
  ct_log_set_sink(NULL, NULL);
  ct_log_set_level(saved);
  CHECK(ct_log_level_parse("debug") == CT_LOG_DEBUG);
  CHECK(ct_log_level_parse("warn") == CT_LOG_WARN);
  CHECK(ct_log_level_parse("off") == CT_LOG_OFF);
  CHECK(ct_log_level_parse("loud") == -1);
  CHECK(ct_log_level_parse(NULL) == -1);
}

CT_TEST(core, threads_and_time) {
  int saved = ct_threads_get();
  ct_threads_set(1);
  CHECK(ct_threads_get() == 1);
  ct_threads_set(2);
  CHECK(ct_threads_get() == 2);
  ct_threads_set(0);
  CHECK(ct_threads_get() == omp_get_num_procs());
  ct_threads_set(saved);
  double t0 = ct_time_now(), t1 = ct_time_now();
  CHECK(t0 > 0 && t1 >= t0);
}

/* Run fn in a child with stderr captured; returns the child's wait status. */
static int run_captured(void (*fn)(void), char *out, size_t cap) {
  int fds[2];
  int status = -1;
  out[0] = '\0';
  if (pipe(fds) != 0) return -1;
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    fn();
    _exit(0);
  }
  close(fds[1]);
  size_t n = 0;
  ssize_t r;
  while (n + 1 < cap && (r = read(fds[0], out + n, cap - 1 - n)) > 0) n += (size_t)r;
  out[n] = '\0';
  close(fds[0]);
  waitpid(pid, &status, 0);
  return status;
}

static void child_warn(void) {
  ct_log_set_sink(NULL, NULL);
  ct_log_set_level(CT_LOG_INFO);
  CT_WARN("disk %d%% full", 93);
  CT_DEBUG("not shown");
}

static void child_assert(void) {
  int x = 1;
  CT_ASSERT(x == 2);
}

CT_TEST(core, default_sink_format) {
  char buf[512];
  int st = run_captured(child_warn, buf, sizeof buf);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  CHECKF(!strcmp(buf, "[ctuner] WARN disk 93% full\n"), "got '%s'", buf);
}

CT_TEST(core, assert_aborts_with_location) {
  char buf[512];
  int st = run_captured(child_assert, buf, sizeof buf);
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
  CHECKF(strstr(buf, "ctuner: assertion failed: x == 2 at ") != NULL, "got '%s'", buf);
  CHECKF(strstr(buf, "test_core.c:") != NULL, "got '%s'", buf);
}

CT_TEST(core, read_file_bounds) {
  ct_err err = {0};
  char p[1024];
  snprintf(p, sizeof p, "%s/ten.bin", ct_test_tmpdir());
  REQUIRE(ct_write_file_atomic(p, "0123456789", 10, &err) == CT_OK);
  char *d = NULL;
  size_t n = 0;
  REQUIRE(ct_read_file(p, 10, &d, &n, &err) == CT_OK);
  CHECK(n == 10 && !memcmp(d, "0123456789", 10) && d[10] == 0);
  free(d);
  CHECK(ct_read_file(p, 9, &d, &n, &err) == CT_ERR_RANGE);
  CHECK(strstr(err.msg, "larger than 9 bytes") != NULL);
  REQUIRE(ct_read_file(p, (size_t)1 << 30, &d, &n, &err) ==
          CT_OK); /* a large bound costs nothing */
  CHECK(n == 10);
  free(d);
  snprintf(p, sizeof p, "%s/none.bin", ct_test_tmpdir());
  CHECK(ct_read_file(p, 10, &d, &n, &err) == CT_ERR_NOT_FOUND);
  CHECK(ct_read_file("/proc/self/status", 1 << 20, &d, &n, &err) ==
        CT_OK); /* size 0 in stat, content > 0 */
  CHECK(n > 0 && strstr(d, "Name:") != NULL);
  free(d);
}

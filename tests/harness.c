/* Test registry and runner: `ct_tests [SUITE [NAME]]`; exit 0 iff all ran tests pass. */
#include "harness.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctuner/log.h"
#include "ctuner/safetensors.h"

#define MAX_TESTS 1024
static struct {
  const char *suite, *name;
  ct_test_fn fn;
} tests[MAX_TESTS];
static int ntests;

void ct_test_register(const char *suite, const char *name, ct_test_fn fn) {
  if (ntests < MAX_TESTS) {
    tests[ntests].suite = suite;
    tests[ntests].name = name;
    tests[ntests].fn = fn;
    ntests++;
  }
}

const char *ct_test_data(const char *name) {
  static char buf[4096];
  snprintf(buf, sizeof buf, "%s/tests/data/%s", CT_SOURCE_DIR, name);
  return buf;
}

const char *ct_test_data_in(const char *env, const char *sub, const char *rel) {
  static char buf[4][4096];
  static int k;
  const char *dir = getenv(env);
  char *b = buf[k++ % 4];
  if (dir)
    snprintf(b, 4096, "%s/%s", dir, rel);
  else
    snprintf(b, 4096, "%s/tests/data/%s/%s", CT_SOURCE_DIR, sub, rel);
  return b;
}

float *ct_test_tensor(const ct_st_file *f, const char *name, size_t *n) {
  const ct_st_tensor *t = ct_st_find(f, name);
  if (!t) return NULL;
  float *v = malloc(t->numel * sizeof *v);
  ct_err e;
  if (v && ct_st_to_f32(t, v, t->numel, &e)) {
    free(v);
    return NULL;
  }
  if (n) *n = t->numel;
  return v;
}

double ct_test_rel_err(const float *a, const float *b, size_t n) {
  double d = 0, r = 0;
  for (size_t i = 0; i < n; i++) {
    double x = fabs((double)a[i] - b[i]), y = fabs((double)b[i]);
    d = x > d ? x : d;
    r = y > r ? y : r;
  }
  return r > 0 ? d / r : d;
}

void *ct_test_slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long l = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = l >= 0 ? malloc((size_t)l + 1) : NULL;
  if (s && fread(s, 1, (size_t)l, f) != (size_t)l) {
    free(s);
    s = NULL;
  }
  fclose(f);
  if (s) s[l] = 0, *n = (size_t)l;
  return s;
}

const char *ct_test_tmpdir(void) {
  static char dir[256];
  if (!dir[0]) {
    snprintf(dir, sizeof dir, "/tmp/ct_tests.XXXXXX");
    if (!mkdtemp(dir)) {
      perror("mkdtemp");
      exit(2);
    }
  }
  return dir;
}

int main(int argc, char **argv) {
  const char *suite = argc > 1 ? argv[1] : NULL;
  const char *name = argc > 2 ? argv[2] : NULL;
  int ran = 0, failed = 0;
  if (!getenv("CT_TEST_VERBOSE")) ct_log_set_level(CT_LOG_WARN);
  for (int i = 0; i < ntests; i++) {
    if (suite && strcmp(suite, tests[i].suite)) continue;
    if (name && strcmp(name, tests[i].name)) continue;
    int f = 0;
    fprintf(stderr, "[ RUN  ] %s.%s\n", tests[i].suite, tests[i].name);
    tests[i].fn(&f);
    fprintf(stderr, "[ %s ] %s.%s\n", f ? "FAIL" : " OK ", tests[i].suite, tests[i].name);
    ran++;
    failed += f;
  }
  fprintf(stderr, "%d test(s) run, %d failed\n", ran, failed);
  if (ran == 0) {
    fprintf(stderr, "no test matched '%s%s%s'\n", suite ? suite : "", name ? "." : "",
            name ? name : "");
    return 2;
  }
  return failed ? 1 : 0;
}

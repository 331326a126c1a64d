/* Test registry and runner: `ct_tests [SUITE [NAME]]`; exit 0 when every test
 * that ran passed, 1 when one failed, 77 when every one that ran was skipped. */
#include "harness.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/safetensors.h"

static struct test_entry {
  const char *suite, *name;
  ct_test_fn fn;
} * tests;
static int ntests, cap;
static int skipped_whole, skipped_parts; /* of the running test */

/* Runs from constructors before main: grows the registry, or stops the
 * process (a test dropped without a word would pass by not running). */
void ct_test_register(const char *suite, const char *name, ct_test_fn fn) {
  if (ntests == cap) {
    int ncap = cap ? 2 * cap : 256;
    struct test_entry *t = realloc(tests, (size_t)ncap * sizeof *t);
    if (!t) {
      fprintf(stderr, "ct_tests: out of memory registering %s.%s\n", suite, name);
      exit(2);
    }
    tests = t, cap = ncap;
  }
  tests[ntests].suite = suite;
  tests[ntests].name = name;
  tests[ntests].fn = fn;
  ntests++;
}

void ct_test_skip(int part, const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "  %s:%d: %s: ", file, line, part ? "part skipped" : "skipped");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  if (part)
    skipped_parts++;
  else
    skipped_whole = 1;
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
    d = ct_test_max(d, fabs((double)a[i] - b[i]));
    r = ct_test_max(r, fabs((double)b[i]));
  }
  if (isnan(d) || isnan(r)) return NAN;
  return r > 0 ? d / r : d;
}

double ct_test_max_abs_err(const float *a, const float *b, size_t n) {
  double d = 0;
  for (size_t i = 0; i < n; i++) d = ct_test_max(d, fabs((double)a[i] - b[i]));
  return d;
}

int ct_test_all_finite(const float *a, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(a[i])) return 0;
  return 1;
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
  int ran = 0, failed = 0, skipped = 0, parts = 0;
  if (!getenv("CT_TEST_VERBOSE")) ct_log_set_level(CT_LOG_WARN);
  for (int i = 0; i < ntests; i++) {
    if (suite && strcmp(suite, tests[i].suite)) continue;
    if (name && strcmp(name, tests[i].name)) continue;
    int f = 0;
    skipped_whole = skipped_parts = 0;
    fprintf(stderr, "[ RUN  ] %s.%s\n", tests[i].suite, tests[i].name);
    tests[i].fn(&f);
    f = f != 0;
    if ((skipped_whole || skipped_parts) && getenv("CT_NO_SKIP")) {
      fprintf(stderr, "  CT_NO_SKIP is set: a skip fails the test\n");
      f = 1;
    }
    const char *tag = f ? "FAIL" : skipped_whole ? "SKIP" : " OK ";
    if (skipped_parts && !skipped_whole)
      fprintf(stderr, "[ %s ] %s.%s (%d part(s) skipped)\n", tag, tests[i].suite, tests[i].name,
              skipped_parts);
    else
      fprintf(stderr, "[ %s ] %s.%s\n", tag, tests[i].suite, tests[i].name);
    ran++;
    failed += f;
    skipped += !f && skipped_whole;
    parts += skipped_parts;
  }
  fprintf(stderr, "%d test(s) run, %d failed, %d skipped, %d part(s) skipped\n", ran, failed,
          skipped, parts);
  if (ran == 0) {
    fprintf(stderr, "no test matched '%s%s%s'\n", suite ? suite : "", name ? "." : "",
            name ? name : "");
    return 2;
  }
  return failed ? 1 : skipped == ran ? 77 : 0;
}

int ct_test_write_flat_json(const struct ct_json *obj, const char *name, char *path, size_t n) {
  char buf[4096];
  size_t l = (size_t)snprintf(buf, sizeof buf, "{");
  for (size_t i = 0; i < obj->n && l < sizeof buf - 200; i++) {
    const ct_json *v = &obj->items[i];
    l += (size_t)snprintf(buf + l, sizeof buf - l, "%s\"%s\": ", i ? ", " : "", obj->keys[i]);
    if (v->type == CT_JSON_STRING)
      l += (size_t)snprintf(buf + l, sizeof buf - l, "\"%s\"", v->str);
    else if (v->type == CT_JSON_BOOL)
      l += (size_t)snprintf(buf + l, sizeof buf - l, "%s", v->boolean ? "true" : "false");
    else if (v->type == CT_JSON_NULL)
      l += (size_t)snprintf(buf + l, sizeof buf - l, "null");
    else
      l += (size_t)snprintf(buf + l, sizeof buf - l, "%.17g", v->num);
  }
  if (l >= sizeof buf - 200) return -1;
  snprintf(buf + l, sizeof buf - l, "}");
  snprintf(path, n, "%s/%s", ct_test_tmpdir(), name);
  ct_err e = {0};
  return ct_write_file_atomic(path, buf, strlen(buf), &e) ? -1 : 0;
}

const char *ct_test_write_tmp(const char *name, const char *text) {
  static char path[4][1024];
  static int k;
  char *p = path[k++ % 4];
  snprintf(p, 1024, "%s/%s", ct_test_tmpdir(), name);
  ct_err e = {0};
  ct_write_file_atomic(p, text, strlen(text), &e);
  return p;
}

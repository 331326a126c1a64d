/* Test registry and runner: `ct_tests [SUITE [NAME]]`; exit 0 iff all ran tests pass. */
#include "harness.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctuner/log.h"

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

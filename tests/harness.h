/* A tiny test harness with one registry.
 *
 * CT_TEST(suite, name) { ... } registers a test at load time. `ct_tests SUITE`
 * runs one suite, `ct_tests SUITE NAME` one test, `ct_tests` all. CHECK marks the
 * test failed and continues; REQUIRE returns from it.
 */
#ifndef CT_TEST_HARNESS_H
#define CT_TEST_HARNESS_H

#include <math.h>
#include <stdio.h>

typedef void (*ct_test_fn)(int *failed);
void ct_test_register(const char *suite, const char *name, ct_test_fn fn);

#define CT_TEST(suite, name)                                            \
  static void test_##suite##_##name(int *ct_failed_);                   \
  __attribute__((constructor)) static void reg_##suite##_##name(void) { \
    ct_test_register(#suite, #name, test_##suite##_##name);             \
  }                                                                     \
  static void test_##suite##_##name(int *ct_failed_)

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      *ct_failed_ = 1;                                                           \
    }                                                                            \
  } while (0)
#define CHECKF(cond, ...)                                                        \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "  %s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                              \
      fputc('\n', stderr);                                                       \
      *ct_failed_ = 1;                                                           \
    }                                                                            \
  } while (0)
#define REQUIRE(cond)                                                              \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      fprintf(stderr, "  %s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
      *ct_failed_ = 1;                                                             \
      return;                                                                      \
    }                                                                              \
  } while (0)
#define CHECK_NEAR(a, b, tol)                                                                 \
  do {                                                                                        \
    double a_ = (a), b_ = (b);                                                                \
    if (!(fabs(a_ - b_) <= (tol))) {                                                          \
      fprintf(stderr, "  %s:%d: CHECK_NEAR failed: %s = %.9g, %s = %.9g, tol %g\n", __FILE__, \
              __LINE__, #a, a_, #b, b_, (double)(tol));                                       \
      *ct_failed_ = 1;                                                                        \
    }                                                                                         \
  } while (0)

/* Path of a file under tests/data (static buffer). */
const char *ct_test_data(const char *name);
/* $ENV/rel when the environment variable env is set (make interop's fresh
 * goldens), else tests/data/sub/rel; four results stay valid at once. */
const char *ct_test_data_in(const char *env, const char *sub, const char *rel);
/* A safetensors tensor as malloc'd float32 (*n elements), NULL if missing. */
struct ct_st_file;
float *ct_test_tensor(const struct ct_st_file *f, const char *name, size_t *n);
/* max |a - b| / max |b| (max |a - b| when b is all zero). */
double ct_test_rel_err(const float *a, const float *b, size_t n);
/* A whole file, malloc'd and NUL-terminated (n excludes the NUL); NULL if unreadable. */
void *ct_test_slurp(const char *path, size_t *n);
/* A fresh temporary directory for this test process (created once). */
const char *ct_test_tmpdir(void);

#endif

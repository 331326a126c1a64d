/* A tiny test harness with one registry.
 *
 * CT_TEST(suite, name) { ... } registers a test at load time. `ct_tests SUITE`
 * runs one suite, `ct_tests SUITE NAME` one test, `ct_tests` all. CHECK marks the
 * test failed and continues; REQUIRE returns from it.
 *
 * Skips. A test that cannot run here (no such CPU feature, no GPU, no tool)
 * says so with CT_SKIP("why", ...): it prints the reason, returns from the test
 * and reports it as [ SKIP ], never as OK. A test that runs but leaves out a
 * part (one of several kernel paths this CPU lacks) calls CT_SKIP_PART("why",
 * ...) and goes on; it reports OK with the count of skipped parts. The closing
 * line counts both: "N test(s) run, F failed, S skipped, P part(s) skipped".
 * Exit status: 1 if any test failed; else 77 when every test that ran was
 * skipped (ctest registers 77 as SKIP_RETURN_CODE, so such a suite shows as
 * "Skipped", never "Passed"); else 0. A failed CHECK before CT_SKIP still fails.
 * CT_NO_SKIP=1 in the environment makes every skip a failure (a machine that
 * must run everything: the GPU runner, a CPU with every ISA). CT_SKIP returns,
 * so it belongs in the test body; a helper can call CT_SKIP_PART.
 *
 *   CT_TEST(cuda, gemm) {
 *     if (!have_device()) CT_SKIP("no CUDA device");  // the whole suite: exit 77
 *     ...
 *   }
 *
 * Comparisons. Every error maximum goes through ct_test_max (or the helpers
 * built on it): a NaN or infinite term makes the maximum NaN, and NaN fails any
 * `e < tol` or `e > tol` check, so outputs poisoned with NaN and never written,
 * or overflowing, cannot pass. fmax() and `x > m ? x : m` drop NaN: do not use
 * them for errors.
 */
#ifndef CT_TEST_HARNESS_H
#define CT_TEST_HARNESS_H

#include <math.h>
#include <stdio.h>

typedef void (*ct_test_fn)(int *failed);
void ct_test_register(const char *suite, const char *name, ct_test_fn fn);
/* Records a skip of the running test (whole: part = 0) and prints the reason. */
void ct_test_skip(int part, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

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
#define CT_SKIP(...)                                  \
  do {                                                \
    ct_test_skip(0, __FILE__, __LINE__, __VA_ARGS__); \
    return;                                           \
  } while (0)
#define CT_SKIP_PART(...) ct_test_skip(1, __FILE__, __LINE__, __VA_ARGS__)
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
/* NaN-sticky maximum of two error terms: NaN when either is NaN or infinite
 * (so the final `e < tol` fails), else the larger. Start accumulators at 0. */
static inline double ct_test_max(double m, double x) {
  if (!isfinite(m) || !isfinite(x)) return NAN;
  return x > m ? x : m;
}
/* max |a - b| / max |b| (max |a - b| when b is all zero); NaN when any element of
 * a or b is NaN or infinite. */
double ct_test_rel_err(const float *a, const float *b, size_t n);
/* max |a - b|; NaN when any element is NaN or infinite. */
double ct_test_max_abs_err(const float *a, const float *b, size_t n);
/* 1 when every element of a is finite (neither NaN nor infinite). */
int ct_test_all_finite(const float *a, size_t n);
/* A whole file, malloc'd and NUL-terminated (n excludes the NUL); NULL if unreadable. */
void *ct_test_slurp(const char *path, size_t *n);
/* A fresh temporary directory for this test process (created once). */
const char *ct_test_tmpdir(void);
/* text written to ct_test_tmpdir()/name; its path (valid for the next 3 calls too). */
const char *ct_test_write_tmp(const char *name, const char *text);
struct ct_json;
/* A flat JSON object (strings, numbers, booleans, nulls) written to
 * ct_test_tmpdir()/name; its path into path. 0, or -1 if it was not written. */
int ct_test_write_flat_json(const struct ct_json *obj, const char *name, char *path, size_t n);

#endif

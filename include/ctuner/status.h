/* ctuner status codes and error context.
 *
 * Every library call returns a ct_status; 0 (CT_OK) is success. The X-macro
 * keeps codes, names and descriptions in one place; values are never renumbered.
 * Human detail goes into a ct_err context the caller owns (curl failf style):
 * the message names the file, key or value that was wrong and what to do.
 */
#ifndef CTUNER_STATUS_H
#define CTUNER_STATUS_H

#include <stddef.h>

#define CT_STATUS_MAP(X)                                     \
  X(OK, 0, "success")                                        \
  X(ERR_NOMEM, 1, "out of memory")                           \
  X(ERR_IO, 2, "input/output error")                         \
  X(ERR_FORMAT, 3, "malformed input")                        \
  X(ERR_INVALID, 4, "invalid argument")                      \
  X(ERR_NOT_FOUND, 5, "not found")                           \
  X(ERR_SHAPE, 6, "shape mismatch")                          \
  X(ERR_UNSUPPORTED, 7, "unsupported")                       \
  X(ERR_RANGE, 8, "value out of range")                      \
  X(ERR_NUMERIC, 9, "numerical error (NaN or Inf)")          \
  X(ERR_TOLERANCE, 10, "result outside tolerance")           \
  X(ERR_INTERNAL, 11, "internal error")                      \
  X(ERR_COMM, 12, "communication between ranks failed")      \
  X(ERR_TIMEOUT, 14, "a collective timed out")               \
  X(ERR_STOPPED, 15, "stopped on request")                   \
  X(ERR_HEALTH, 13, "stopped by the health circuit breaker") \
  X(ERR_DEVICE, 16, "compute device error")

typedef enum ct_status {
#define CT_X(name, val, desc) CT_##name = val,
  CT_STATUS_MAP(CT_X)
#undef CT_X
} ct_status;

/* "CT_ERR_IO" etc.; "CT_UNKNOWN" for values outside the map. */
const char *ct_status_name(ct_status st);
/* "input/output error" etc. */
const char *ct_status_desc(ct_status st);

/* Error context: the last failing call's human message. Zero-initialise it. */
typedef struct ct_err {
  ct_status status;
  char msg[1024];
} ct_err;

/* Record a failure in err (may be NULL) and return st, so that
 * `return ct_errf(err, CT_ERR_IO, "cannot open %s: %s", path, strerror(errno));`
 * reads naturally. A later call overwrites an earlier message. */
ct_status ct_errf(ct_err *err, ct_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prepend context ("loading model.safetensors: ") to an existing message. */
void ct_err_prefix(ct_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ct_err_clear(ct_err *err);

/* Broken invariants (bugs, not bad input) abort with file:line. */
void ct_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define CT_ASSERT(x) ((x) ? (void)0 : ct_assert_fail(#x, __FILE__, __LINE__))

#endif

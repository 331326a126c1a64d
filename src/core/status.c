/* status.c: names and descriptions of ct_status codes, and the ct_err context.
 *
 * Codes, names and descriptions come from one X-macro (CT_STATUS_MAP in
 * status.h), so they cannot drift apart. ct_errf / ct_err_prefix fill the
 * caller-owned ct_err (curl failf style); messages are truncated, never
 * overflowed. ct_assert_fail is the one place that aborts: it is for bugs, not
 * for bad input.
 */
#include "ctuner/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *ct_status_name(ct_status st) {
  const char *name = "CT_UNKNOWN";
  switch (st) {
#define CT_X(n, val, desc) \
  case CT_##n:             \
    name = "CT_" #n;       \
    break;
    CT_STATUS_MAP(CT_X)
#undef CT_X
    default:
      break;
  }
  return name;
}

const char *ct_status_desc(ct_status st) {
  const char *d = "unknown status";
  switch (st) {
#define CT_X(n, val, desc) \
  case CT_##n:             \
    d = desc;              \
    break;
    CT_STATUS_MAP(CT_X)
#undef CT_X
    default:
      break;
  }
  return d;
}

ct_status ct_errf(ct_err *err, ct_status st, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    if (n < 0) err->msg[0] = '\0';
    err->status = st;
  }
  return st;
}

void ct_err_prefix(ct_err *err, const char *fmt, ...) {
  char pre[sizeof err->msg];
  char old[sizeof err->msg];
  va_list ap;
  if (!err) return;
  va_start(ap, fmt);
  int n = vsnprintf(pre, sizeof pre, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  memcpy(old, err->msg, sizeof old);
  old[sizeof old - 1] = '\0';
  size_t plen = strlen(pre);
  size_t olen = strlen(old);
  size_t cap = sizeof err->msg - 1;
  if (plen > cap) plen = cap;
  memcpy(err->msg, pre, plen);
  if (olen > cap - plen) olen = cap - plen;
  memcpy(err->msg + plen, old, olen);
  err->msg[plen + olen] = '\0';
}

void ct_err_clear(ct_err *err) {
  if (!err) return;
  err->status = CT_OK;
  err->msg[0] = '\0';
}

void ct_assert_fail(const char *expr, const char *file, int line) {
  fprintf(stderr, "ctuner: assertion failed: %s at %s:%d\n", expr, file, line);
  fflush(stderr);
  abort();
}

/* parse.c: {env:VAR} expansion and byte sizes, the two value parsers that the
 * config, the data backends and the health checks share (ctuner/parse.h).
 * Plain string work: no I/O besides getenv, no logging. */
#include "ctuner/parse.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

ct_status ct_expand_env(const char *in, const char *where, char **out, ct_err *err) {
  if (!where) where = "";
  size_t cap = strlen(in) + 1, len = 0;
  char *buf = malloc(cap);
  if (!buf) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  const char *p = in;
  while (*p) {
    if (!strncmp(p, "{env:", 5)) {
      const char *end = strchr(p + 5, '}');
      if (!end) {
        free(buf);
        return ct_errf(err, CT_ERR_INVALID, "%sunterminated '{env:' in \"%s\"", where, in);
      }
      char var[256];
      size_t vl = (size_t)(end - (p + 5));
      if (vl == 0 || vl >= sizeof var) {
        free(buf);
        return ct_errf(err, CT_ERR_INVALID, "%sbad environment reference in \"%s\"", where, in);
      }
      memcpy(var, p + 5, vl);
      var[vl] = 0;
      const char *val = getenv(var);
      if (!val) {
        free(buf);
        return ct_errf(err, CT_ERR_INVALID,
                       "%s{env:%s} is used but the environment variable %s is not set", where, var,
                       var);
      }
      size_t need = len + strlen(val) + strlen(end + 1) + 1;
      if (need > cap) {
        char *nb = realloc(buf, need);
        if (!nb) {
          free(buf);
          return ct_errf(err, CT_ERR_NOMEM, "out of memory");
        }
        buf = nb, cap = need;
      }
      memcpy(buf + len, val, strlen(val));
      len += strlen(val);
      p = end + 1;
    } else {
      if (len + 2 > cap) {
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
          free(buf);
          return ct_errf(err, CT_ERR_NOMEM, "out of memory");
        }
        buf = nb, cap *= 2;
      }
      buf[len++] = *p++;
    }
  }
  buf[len] = 0;
  *out = buf;
  return CT_OK;
}

long long ct_parse_bytes(const char *s) {
  if (!s) return -1;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || errno || !(v >= 0)) return -1;
  double mul = 1;
  if (*end) {
    switch (*end == 0 ? 0 : (end[0] | 0x20)) {
      case 'k':
        mul = 1024.0;
        break;
      case 'm':
        mul = 1024.0 * 1024;
        break;
      case 'g':
        mul = 1024.0 * 1024 * 1024;
        break;
      case 't':
        mul = 1024.0 * 1024 * 1024 * 1024;
        break;
      case 'b':
        mul = 1;
        end--;
        break;
      default:
        return -1;
    }
    end++;
    if ((*end | 0x20) == 'i') end++;
    if ((*end | 0x20) == 'b') end++;
    if (*end) return -1;
  }
  v *= mul;
  return v < 9.2e18 ? (long long)v : -1;
}

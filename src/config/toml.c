/* toml.c: a strict reader for the TOML that SimpleTuner's config.toml holds
 * (top-level `key = value` options), as a ct_json object so that it goes
 * through the same key table as config.json.
 *
 * Read as TOML 1.0 reads them (checked against Python's tomllib,
 * tests/data/toml): bare and quoted keys, basic strings with every escape,
 * literal strings, integers (decimal, 0x, 0o, 0b, '_' between digits),
 * floats (fraction, exponent, inf, nan), booleans, arrays of these over
 * several lines with comments and a trailing comma, comments, LF or CRLF.
 * What a flat option file has no use for is refused by name with its line
 * and column rather than half-read: tables, arrays of tables, dotted keys,
 * inline tables, multi-line strings, dates and times, integers past 64 bits.
 * Debian ships no C TOML library (only C++ ones), hence this file. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_int.h"

typedef struct tp {
  const char *s;
  size_t len, pos, line_start;
  int line, depth;
  ct_err *err;
} tp;

static ct_status fail(tp *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ct_status fail(tp *p, const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ct_errf(p->err, CT_ERR_FORMAT, "line %d, column %d: %s", p->line,
                 (int)(p->pos - p->line_start) + 1, msg);
}

static int peek(const tp *p, size_t k) {
  return p->pos + k < p->len ? (unsigned char)p->s[p->pos + k] : -1;
}

static void skip_ws(tp *p) {
  while (peek(p, 0) == ' ' || peek(p, 0) == '\t') p->pos++;
}

/* A newline (LF or CRLF) at pos: consumed, 1; else 0. */
static int newline(tp *p) {
  if (peek(p, 0) == '\n') {
    p->pos++;
  } else if (peek(p, 0) == '\r' && peek(p, 1) == '\n') {
    p->pos += 2;
  } else {
    return 0;
  }
  p->line++;
  p->line_start = p->pos;
  return 1;
}

static int is_control(int c) {
  return (c >= 0 && c < 0x20 && c != '\t') || c == 0x7f;
}

/* A comment at pos (if any), up to the end of its line. */
static ct_status comment(tp *p) {
  if (peek(p, 0) != '#') return CT_OK;
  while (p->pos < p->len && peek(p, 0) != '\n') {
    if (peek(p, 0) == '\r' && peek(p, 1) == '\n') break;
    if (is_control(peek(p, 0))) return fail(p, "control character in a comment");
    p->pos++;
  }
  return CT_OK;
}

/* Blanks, comments and newlines (inside arrays). */
static ct_status skip_all(tp *p) {
  for (;;) {
    skip_ws(p);
    ct_status st = comment(p);
    if (st) return st;
    if (!newline(p)) return CT_OK;
  }
}

/* Appends code point u as UTF-8. */
static size_t put_utf8(char *o, unsigned long u) {
  if (u < 0x80) return o[0] = (char)u, 1;
  if (u < 0x800) return o[0] = (char)(0xC0 | (u >> 6)), o[1] = (char)(0x80 | (u & 0x3F)), 2;
  if (u < 0x10000) {
    o[0] = (char)(0xE0 | (u >> 12)), o[1] = (char)(0x80 | ((u >> 6) & 0x3F));
    o[2] = (char)(0x80 | (u & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | (u >> 18)), o[1] = (char)(0x80 | ((u >> 12) & 0x3F));
  o[2] = (char)(0x80 | ((u >> 6) & 0x3F)), o[3] = (char)(0x80 | (u & 0x3F));
  return 4;
}

/* \uXXXX or \UXXXXXXXX after the backslash and letter. */
static ct_status unicode_escape(tp *p, int digits, char *o, size_t *k) {
  unsigned long u = 0;
  for (int i = 0; i < digits; i++) {
    int c = peek(p, (size_t)i);
    int v = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (v < 0) return fail(p, "\\%c needs %d hex digits", digits == 4 ? 'u' : 'U', digits);
    u = u * 16 + (unsigned long)v;
  }
  if (u > 0x10FFFF || (u >= 0xD800 && u <= 0xDFFF))
    return fail(p, "\\%c%0*lX is not a Unicode scalar value", digits == 4 ? 'u' : 'U', digits, u);
  p->pos += (size_t)digits;
  *k += put_utf8(o + *k, u);
  return CT_OK;
}

/* A single-line basic ("...") or literal ('...') string at pos. */
static ct_status string(tp *p, char **out, size_t *outlen) {
  const int q = peek(p, 0);
  if (peek(p, 1) == q && peek(p, 2) == q)
    return fail(p, "multi-line strings (%c%c%c) are not read here; write the value on one line", q,
                q, q);
  p->pos++;
  char *o = malloc(p->len - p->pos + 1); /* the text never grows when unescaped */
  size_t k = 0;
  ct_status st = CT_OK;
  if (!o) return ct_errf(p->err, CT_ERR_NOMEM, "out of memory");
  for (;;) {
    const int c = peek(p, 0);
    if (c < 0 || c == '\n' || (c == '\r' && peek(p, 1) == '\n')) {
      st = fail(p, "the string is not closed on this line");
      goto out;
    }
    if (c == q) {
      p->pos++;
      break;
    }
    if (is_control(c)) {
      st = fail(p, "control character 0x%02X in a string (escape it)", c);
      goto out;
    }
    if (c != '\\' || q == '\'') {
      o[k++] = (char)c;
      p->pos++;
      continue;
    }
    const int e = peek(p, 1);
    static const char from[] = "btnfr\"\\", to[] = "\b\t\n\f\r\"\\";
    const char *f = e > 0 ? strchr(from, e) : NULL;
    if (f) {
      o[k++] = to[f - from];
      p->pos += 2;
    } else if (e == 'u' || e == 'U') {
      p->pos += 2;
      if ((st = unicode_escape(p, e == 'u' ? 4 : 8, o, &k))) goto out;
    } else {
      st = fail(p, "invalid escape \\%c", e > 0x20 && e < 0x7f ? e : '?');
      goto out;
    }
  }
  o[k] = 0;
  *out = o;
  *outlen = k;
  o = NULL;
out:
  free(o);
  return st;
}

/* Digits with single '_' between them, in base b, from s[0..n). 1 if well formed. */
static int digits_ok(const char *s, size_t n, int base) {
  if (!n || s[0] == '_' || s[n - 1] == '_') return 0;
  for (size_t i = 0; i < n; i++) {
    const char c = s[i];
    if (c == '_') {
      if (s[i + 1] == '_') return 0;
      continue;
    }
    int v = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : 99;
    if (v >= base) return 0;
  }
  return 1;
}

/* s[0..n) without its underscores, into buf (n < 128). */
static void strip_us(const char *s, size_t n, char *buf) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] != '_') buf[k++] = s[i];
  buf[k] = 0;
}

/* Length of the prefix of s[0..n) without any character of set. */
static size_t span_not(const char *s, size_t n, const char *set) {
  size_t i = 0;
  while (i < n && !strchr(set, s[i])) i++;
  return i;
}

/* 1 if the token looks like a date or time (1979-05-27, 07:32:00). */
static int is_datetime(const char *t, size_t n) {
  int d = 0;
  while ((size_t)d < n && t[d] >= '0' && t[d] <= '9') d++;
  return (d == 4 && (size_t)d < n && t[d] == '-') || (d == 2 && (size_t)d < n && t[d] == ':');
}

/* An integer or float token t[0..n) into v. */
static ct_status number(tp *p, const char *t, size_t n, ct_json *v) {
  char buf[128];
  v->type = CT_JSON_NUMBER;
  if (n >= 128) return fail(p, "number too long");
  size_t i = (t[0] == '+' || t[0] == '-') ? 1 : 0;
  const int neg = t[0] == '-';
  if (n - i == 3 && (!strncmp(t + i, "inf", 3) || !strncmp(t + i, "nan", 3))) {
    v->num = t[i] == 'i' ? (neg ? -INFINITY : INFINITY) : NAN;
    return CT_OK;
  }
  if (n - i > 2 && t[i] == '0' && (t[i + 1] == 'x' || t[i + 1] == 'o' || t[i + 1] == 'b')) {
    const int base = t[i + 1] == 'x' ? 16 : t[i + 1] == 'o' ? 8 : 2;
    if (i) return fail(p, "a sign is not allowed on a 0%c integer", t[i + 1]);
    if (!digits_ok(t + 2, n - 2, base)) return fail(p, "invalid integer '%.*s'", (int)n, t);
    strip_us(t + 2, n - 2, buf);
    errno = 0;
    unsigned long long u = strtoull(buf, NULL, base);
    if (errno || u > (unsigned long long)INT64_MAX)
      return fail(p, "integer '%.*s' is too large (past 64 bits)", (int)n, t);
    v->is_int = 1, v->i64 = (int64_t)u, v->num = (double)u;
    return CT_OK;
  }
  /* decimal: int part, then .frac and/or e exp */
  const char *a = t + i;
  const size_t ni = span_not(a, n - i, ".eE");
  if (!digits_ok(a, ni, 10) || (ni > 1 && a[0] == '0'))
    return fail(p, "invalid number '%.*s'", (int)n, t);
  size_t j = i + ni;
  int is_float = 0;
  if (j < n && t[j] == '.') {
    const size_t nf = span_not(t + j + 1, n - j - 1, "eE");
    if (!digits_ok(t + j + 1, nf, 10)) return fail(p, "invalid float '%.*s'", (int)n, t);
    j += 1 + nf, is_float = 1;
  }
  if (j < n && (t[j] == 'e' || t[j] == 'E')) {
    size_t k = j + 1 + (j + 1 < n && (t[j + 1] == '+' || t[j + 1] == '-'));
    if (!digits_ok(t + k, n - k, 10)) return fail(p, "invalid float '%.*s'", (int)n, t);
    j = n, is_float = 1;
  }
  if (j != n) return fail(p, "invalid number '%.*s'", (int)n, t);
  strip_us(t, n, buf);
  errno = 0;
  if (is_float) {
    v->num = strtod(buf, NULL);
    return CT_OK;
  }
  long long x = strtoll(buf, NULL, 10);
  if (errno) return fail(p, "integer '%.*s' is too large (past 64 bits)", (int)n, t);
  v->is_int = 1, v->i64 = x, v->num = (double)x;
  return CT_OK;
}

static ct_status value(tp *p, ct_json *v);

/* [a, b, ...] over lines, comments and a trailing comma allowed. */
static ct_status array(tp *p, ct_json *v) {
  ct_status st = CT_OK;
  size_t cap = 0;
  v->type = CT_JSON_ARRAY;
  if (++p->depth > CT_JSON_MAX_DEPTH) return fail(p, "arrays nested too deep");
  p->pos++;
  for (;;) {
    if ((st = skip_all(p))) return st;
    if (peek(p, 0) == ']') break;
    if (v->n == cap) {
      cap = cap ? cap * 2 : 8;
      ct_json *ni = realloc(v->items, cap * sizeof *ni);
      if (!ni) return ct_errf(p->err, CT_ERR_NOMEM, "out of memory");
      v->items = ni;
    }
    memset(&v->items[v->n], 0, sizeof v->items[0]);
    ct_json *it = &v->items[v->n++];
    if ((st = value(p, it))) return st;
    if ((st = skip_all(p))) return st;
    if (peek(p, 0) == ',') {
      p->pos++;
      continue;
    }
    if (peek(p, 0) != ']') return fail(p, "expected ',' or ']' in an array");
    break;
  }
  p->pos++;
  p->depth--;
  return CT_OK;
}

static ct_status value(tp *p, ct_json *v) {
  v->line = p->line;
  v->col = (int)(p->pos - p->line_start) + 1;
  const int c = peek(p, 0);
  if (c == '"' || c == '\'') {
    v->type = CT_JSON_STRING;
    return string(p, &v->str, &v->len);
  }
  if (c == '[') return array(p, v);
  if (c == '{')
    return fail(p,
                "inline tables ({...}) are not read here: SimpleTuner's options are flat "
                "`key = value` lines");
  size_t n = 0;
  while (p->pos + n < p->len && !strchr(" \t\r\n,]#", p->s[p->pos + n])) n++;
  const char *t = p->s + p->pos;
  if (!n) return fail(p, "expected a value");
  ct_status st = CT_OK;
  if ((n == 4 && !strncmp(t, "true", 4)) || (n == 5 && !strncmp(t, "false", 5))) {
    v->type = CT_JSON_BOOL;
    v->boolean = n == 4;
  } else if (is_datetime(t, n)) {
    st = fail(p, "dates and times ('%.*s') are not read here: no SimpleTuner option takes one",
              (int)(n > 40 ? 40 : n), t);
  } else if ((t[0] >= '0' && t[0] <= '9') || t[0] == '+' || t[0] == '-' || t[0] == 'i' ||
             t[0] == 'n') {
    st = number(p, t, n, v);
  } else {
    st = fail(p, "'%.*s' is not a TOML value (strings need quotes)", (int)(n > 40 ? 40 : n), t);
  }
  if (!st) p->pos += n;
  return st;
}

/* A bare or quoted key at pos. */
static ct_status key(tp *p, char **out) {
  const int c = peek(p, 0);
  size_t n = 0;
  if (c == '"' || c == '\'') {
    if (peek(p, 1) == c && peek(p, 2) == c) return fail(p, "a key cannot be a multi-line string");
    return string(p, out, &n);
  }
  while (p->pos + n < p->len) {
    const char k = p->s[p->pos + n];
    if (!((k >= 'a' && k <= 'z') || (k >= 'A' && k <= 'Z') || (k >= '0' && k <= '9') || k == '_' ||
          k == '-'))
      break;
    n++;
  }
  if (!n) return fail(p, "expected a key");
  *out = strndup(p->s + p->pos, n);
  if (!*out) return ct_errf(p->err, CT_ERR_NOMEM, "out of memory");
  p->pos += n;
  return CT_OK;
}

/* One `key = value` line into obj. */
static ct_status keyval(tp *p, ct_json *obj, size_t *cap) {
  char *k = NULL;
  const size_t kpos = p->pos;
  ct_status st = key(p, &k);
  if (st) return st;
  skip_ws(p);
  if (peek(p, 0) == '.') {
    free(k);
    return fail(p, "dotted keys (a.b = ...) make tables; SimpleTuner's options are flat");
  }
  for (size_t i = 0; i < obj->n; i++)
    if (!strcmp(obj->keys[i], k)) {
      p->pos = kpos;
      st = fail(p, "key '%s' is defined twice", k);
      free(k);
      return st;
    }
  if (peek(p, 0) != '=') {
    free(k);
    return fail(p, "expected '=' after the key");
  }
  p->pos++;
  skip_ws(p);
  if (obj->n == *cap) {
    size_t nc = *cap ? *cap * 2 : 32;
    ct_json *ni = realloc(obj->items, nc * sizeof *ni);
    if (ni) obj->items = ni;
    char **nk = ni ? realloc(obj->keys, nc * sizeof *nk) : NULL;
    if (nk) obj->keys = nk;
    if (!ni || !nk) {
      free(k);
      return ct_errf(p->err, CT_ERR_NOMEM, "out of memory");
    }
    *cap = nc;
  }
  memset(&obj->items[obj->n], 0, sizeof obj->items[0]);
  obj->keys[obj->n] = k;
  st = value(p, &obj->items[obj->n++]);
  if (st) return st;
  skip_ws(p);
  if ((st = comment(p))) return st;
  if (p->pos < p->len && !newline(p))
    return fail(p, "expected the end of the line after the value");
  return CT_OK;
}

ct_status ct_config_toml_parse(const char *text, size_t len, ct_json **out, ct_err *err) {
  tp p = {text, len, 0, 0, 1, 0, err};
  ct_status st = CT_OK;
  size_t cap = 0;
  ct_json *obj = calloc(1, sizeof *obj);
  *out = NULL;
  if (!obj) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  obj->type = CT_JSON_OBJECT;
  obj->line = obj->col = 1;
  if (!ct_utf8_valid(text, len)) {
    st = ct_errf(err, CT_ERR_FORMAT, "line 1, column 1: the file is not valid UTF-8");
    goto out;
  }
  while (!st && p.pos < len) {
    skip_ws(&p);
    const int c = peek(&p, 0);
    if (c < 0) break;
    if (c == '#') {
      st = comment(&p);
    } else if (newline(&p)) {
      continue;
    } else if (c == '[') {
      st = fail(&p, "%s are not read here: SimpleTuner's config.toml is flat `key = value` lines",
                peek(&p, 1) == '[' ? "arrays of tables ([[...]])" : "tables ([...])");
    } else if (c == '\r' || is_control(c)) {
      st = fail(&p, "control character 0x%02X", c);
    } else {
      st = keyval(&p, obj, &cap);
      continue;
    }
    if (!st && p.pos < len && !newline(&p)) st = fail(&p, "expected the end of the line");
  }
out:
  if (st) {
    ct_json_free(obj);
    obj = NULL;
  }
  *out = obj;
  return st;
}

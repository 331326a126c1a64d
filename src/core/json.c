/* json.c: strict RFC 8259 JSON reader building a DOM (ct_json tree).
 *
 * Recursive descent over a (pointer, length) buffer that is NOT NUL-terminated:
 * every read is checked against `len`. Nesting is bounded by CT_JSON_MAX_DEPTH,
 * so recursion depth is bounded too. Strings are decoded in two passes (find
 * the closing quote, then decode into a buffer no longer than the raw text),
 * validating UTF-8, escapes and surrogate pairs. Numbers are checked against
 * the RFC grammar by hand, then converted with strtod on a bounded NUL-
 * terminated copy (we never call setlocale, so '.' is the decimal point);
 * integer literals that fit int64 are also converted exactly.
 *
 * Errors carry "line L, column C: ..." (1-based; the column counts bytes).
 * Implementation limits (allowed by RFC 8259 section 9): object keys may not
 * contain U+0000 (keys are C strings); numbers must fit a double.
 * A leading UTF-8 byte order mark is skipped (RFC 8259 section 8.1).
 * Duplicate keys are kept; ct_json_get returns the last one.
 * Memory: one ct_json (80 bytes) per value, so a document of tiny values such as
 * "[0,0,0,...]" costs up to ~40x its length; callers bound the input size
 * (safetensors headers: CT_ST_MAX_HEADER).
 * Not here: writing JSON, comments, trailing commas, NaN/Infinity literals.
 */
#include "ctuner/json.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/fs.h"

typedef struct parser {
  const char *s;
  size_t len, pos;
  size_t line, line_start;
  int depth;
  ct_err *err;
} parser;

static int clamp_int(size_t v) {
  return v > (size_t)INT_MAX ? INT_MAX : (int)v;
}

/* Record a format error at byte offset `at`. */
static ct_status fail_at(parser *p, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ct_status fail_at(parser *p, size_t at, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  size_t col = at >= p->line_start ? at - p->line_start + 1 : 1;
  return ct_errf(p->err, CT_ERR_FORMAT, "line %d, column %d: %s", clamp_int(p->line),
                 clamp_int(col), buf);
}

static ct_status fail_nomem(parser *p) {
  return ct_errf(p->err, CT_ERR_NOMEM, "out of memory while parsing JSON (line %d)",
                 clamp_int(p->line));
}

/* Describe the byte at `at` for an error message: 'x' or byte 0xNN. */
static const char *describe(const parser *p, size_t at, char buf[16]) {
  unsigned char c = (unsigned char)p->s[at];
  if (c >= 0x20 && c < 0x7f)
    snprintf(buf, 16, "'%c'", c);
  else
    snprintf(buf, 16, "byte 0x%02X", c);
  return buf;
}

static void skip_ws(parser *p) {
  while (p->pos < p->len) {
    char c = p->s[p->pos];
    if (c == '\n') {
      p->line++;
      p->line_start = p->pos + 1;
    } else if (c != ' ' && c != '\t' && c != '\r') {
      break;
    }
    p->pos++;
  }
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Read 4 hex digits at s[i..i+3], all before `end`; -1 if not possible. */
static long hex4(const char *s, size_t i, size_t end) {
  long v = 0;
  if (end < i || end - i < 4) return -1;
  for (int k = 0; k < 4; k++) {
    int h = hexval(s[i + (size_t)k]);
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

static size_t put_utf8(char *o, unsigned long cp) {
  size_t n;
  if (cp < 0x80) {
    o[0] = (char)cp;
    n = 1;
  } else if (cp < 0x800) {
    o[0] = (char)(0xC0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3F));
    n = 2;
  } else if (cp < 0x10000) {
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    n = 3;
  } else {
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    n = 4;
  }
  return n;
}

/* Length of the valid UTF-8 sequence starting at s[i] (lead byte >= 0x80)
 * that ends before `end`; 0 if invalid (overlong, surrogate, > U+10FFFF). */
static size_t utf8_seq(const unsigned char *s, size_t i, size_t end) {
  unsigned char c = s[i];
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (end - i < n) return 0;
  if (s[i + 1] < lo || s[i + 1] > hi) return 0;
  for (size_t k = 2; k < n; k++)
    if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
  return n;
}

/* Parse a string at p->pos (which is '"'); *out is malloc'd, NUL-terminated. */
static ct_status parse_string(parser *p, char **out, size_t *out_len) {
  ct_status st = CT_OK;
  const char *s = p->s;
  size_t start = p->pos + 1, end = start;
  char *buf = NULL;
  size_t o = 0;
  /* Pass 1: find the closing quote. */
  while (end < p->len && s[end] != '"') end += (s[end] == '\\') ? 2 : 1;
  if (end >= p->len) {
    st = fail_at(p, p->len, "unexpected end of input in string (missing closing '\"')");
    goto out;
  }
  buf = malloc(end - start + 1);
  if (!buf) {
    st = fail_nomem(p);
    goto out;
  }
  /* Pass 2: decode and validate. */
  for (size_t i = start; i < end;) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x20) {
      st = fail_at(p, i, "control character U+%04X in string must be escaped", c);
      goto out;
    }
    if (c == '\\') {
      char e = s[i + 1]; /* i + 1 < end: pass 1 skipped escapes in pairs */
      switch (e) {
        case '"':
        case '\\':
        case '/':
          buf[o++] = e;
          break;
        case 'b':
          buf[o++] = '\b';
          break;
        case 'f':
          buf[o++] = '\f';
          break;
        case 'n':
          buf[o++] = '\n';
          break;
        case 'r':
          buf[o++] = '\r';
          break;
        case 't':
          buf[o++] = '\t';
          break;
        case 'u': {
          long cp = hex4(s, i + 2, end);
          if (cp < 0) {
            st = fail_at(p, i, "invalid \\u escape: expected 4 hex digits");
            goto out;
          }
          if (cp >= 0xDC00 && cp <= 0xDFFF) {
            st = fail_at(p, i, "lone low surrogate \\u%04lX in string", cp);
            goto out;
          }
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            long lo = -1;
            if (end - (i + 6) >= 6 && s[i + 6] == '\\' && s[i + 7] == 'u') lo = hex4(s, i + 8, end);
            if (lo < 0xDC00 || lo > 0xDFFF) {
              st = fail_at(p, i,
                           "lone high surrogate \\u%04lX in string (expected a low surrogate "
                           "\\uDC00-\\uDFFF right after it)",
                           cp);
              goto out;
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            i += 6;
          }
          o += put_utf8(buf + o, (unsigned long)cp);
          i += 6;
          continue;
        }
        default: {
          char d[16];
          st = fail_at(p, i, "invalid escape: backslash followed by %s", describe(p, i + 1, d));
          goto out;
        }
      }
      i += 2;
      continue;
    }
    if (c >= 0x80) {
      size_t n = utf8_seq((const unsigned char *)s, i, end);
      if (!n) {
        st = fail_at(p, i, "invalid UTF-8 byte 0x%02X in string", c);
        goto out;
      }
      memcpy(buf + o, s + i, n);
      o += n;
      i += n;
      continue;
    }
    buf[o++] = (char)c;
    i++;
  }
  buf[o] = '\0';
  p->pos = end + 1;
  *out = buf;
  *out_len = o;
  buf = NULL;
out:
  free(buf);
  return st;
}

static ct_status parse_number(parser *p, ct_json *v) {
  ct_status st = CT_OK;
  const char *s = p->s;
  size_t start = p->pos, i = p->pos;
  int is_int = 1;
  char small[64];
  char *copy = small;
  if (s[i] == '-') i++;
  if (i >= p->len) {
    st = fail_at(p, i, "unexpected end of input in number");
    goto out;
  }
  if (s[i] == '0') {
    i++;
    if (i < p->len && s[i] >= '0' && s[i] <= '9') {
      st = fail_at(p, start, "leading zeros are not allowed in numbers");
      goto out;
    }
  } else if (s[i] >= '1' && s[i] <= '9') {
    while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
  } else {
    char d[16];
    st = fail_at(p, i, "expected a digit in number, found %s", describe(p, i, d));
    goto out;
  }
  if (i < p->len && s[i] == '.') {
    is_int = 0;
    i++;
    if (i >= p->len || s[i] < '0' || s[i] > '9') {
      st = fail_at(p, i, "expected a digit after the decimal point");
      goto out;
    }
    while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
  }
  if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
    is_int = 0;
    i++;
    if (i < p->len && (s[i] == '+' || s[i] == '-')) i++;
    if (i >= p->len || s[i] < '0' || s[i] > '9') {
      st = fail_at(p, i, "expected a digit in the exponent");
      goto out;
    }
    while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
  }
  size_t n = i - start;
  if (n >= sizeof small) {
    copy = malloc(n + 1);
    if (!copy) {
      st = fail_nomem(p);
      goto out;
    }
  }
  memcpy(copy, s + start, n);
  copy[n] = '\0';
  double d = strtod(copy, NULL);
  if (isinf(d)) {
    st =
        fail_at(p, start, "number %.40s%s is out of range for a double", copy, n > 40 ? "..." : "");
    goto out;
  }
  v->type = CT_JSON_NUMBER;
  v->num = d;
  v->is_int = 0;
  if (is_int) {
    int neg = s[start] == '-';
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
    uint64_t acc = 0;
    int ok = 1;
    for (size_t k = start + (size_t)neg; k < i; k++) {
      unsigned dg = (unsigned)(s[k] - '0');
      if (acc > (limit - dg) / 10) {
        ok = 0;
        break;
      }
      acc = acc * 10 + dg;
    }
    if (ok) {
      v->is_int = 1;
      v->i64 = neg ? (acc == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)acc) : (int64_t)acc;
    }
  }
  p->pos = i;
out:
  if (copy != small) free(copy);
  return st;
}

static ct_status parse_value(parser *p, ct_json *v);

static ct_status grow(parser *p, ct_json *v, size_t *cap, int with_keys) {
  ct_status st = CT_OK;
  if (v->n < *cap) goto out;
  size_t ncap = *cap ? *cap * 2 : 4;
  if (ncap < *cap || ncap > SIZE_MAX / sizeof(ct_json)) {
    st = fail_nomem(p);
    goto out;
  }
  ct_json *items = realloc(v->items, ncap * sizeof(ct_json));
  if (!items) {
    st = fail_nomem(p);
    goto out;
  }
  v->items = items;
  if (with_keys) {
    char **keys = realloc(v->keys, ncap * sizeof(char *));
    if (!keys) {
      st = fail_nomem(p);
      goto out;
    }
    v->keys = keys;
  }
  *cap = ncap;
out:
  return st;
}

static ct_status parse_array(parser *p, ct_json *v) {
  ct_status st = CT_OK;
  size_t cap = 0;
  v->type = CT_JSON_ARRAY;
  if (++p->depth > CT_JSON_MAX_DEPTH) {
    st = fail_at(p, p->pos, "nesting deeper than %d levels", CT_JSON_MAX_DEPTH);
    goto out;
  }
  p->pos++; /* '[' */
  skip_ws(p);
  if (p->pos >= p->len) {
    st = fail_at(p, p->pos, "unexpected end of input: expected a value or ']'");
    goto out;
  }
  if (p->s[p->pos] == ']') {
    p->pos++;
    goto out;
  }
  for (;;) {
    if ((st = grow(p, v, &cap, 0))) goto out;
    memset(&v->items[v->n], 0, sizeof(ct_json));
    v->n++;
    if ((st = parse_value(p, &v->items[v->n - 1]))) goto out;
    skip_ws(p);
    if (p->pos >= p->len) {
      st = fail_at(p, p->pos, "unexpected end of input: expected ',' or ']' after array element");
      goto out;
    }
    char c = p->s[p->pos];
    if (c == ']') {
      p->pos++;
      break;
    }
    if (c != ',') {
      st = fail_at(p, p->pos, "expected ',' or ']' after array element");
      goto out;
    }
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ']') {
      st = fail_at(p, p->pos, "trailing comma before ']'");
      goto out;
    }
  }
out:
  p->depth--;
  return st;
}

static ct_status parse_object(parser *p, ct_json *v) {
  ct_status st = CT_OK;
  size_t cap = 0;
  v->type = CT_JSON_OBJECT;
  if (++p->depth > CT_JSON_MAX_DEPTH) {
    st = fail_at(p, p->pos, "nesting deeper than %d levels", CT_JSON_MAX_DEPTH);
    goto out;
  }
  p->pos++; /* '{' */
  skip_ws(p);
  if (p->pos >= p->len) {
    st = fail_at(p, p->pos, "unexpected end of input: expected a string key or '}'");
    goto out;
  }
  if (p->s[p->pos] == '}') {
    p->pos++;
    goto out;
  }
  for (;;) {
    char *key = NULL;
    size_t klen = 0;
    if (p->pos >= p->len) {
      st = fail_at(p, p->pos, "unexpected end of input: expected a string key");
      goto out;
    }
    if (p->s[p->pos] != '"') {
      char d[16];
      st = fail_at(p, p->pos, "expected a string key in object, found %s", describe(p, p->pos, d));
      goto out;
    }
    size_t kpos = p->pos;
    if ((st = parse_string(p, &key, &klen))) goto out;
    if (strlen(key) != klen) {
      free(key);
      st = fail_at(p, kpos, "object key contains U+0000, which is not supported");
      goto out;
    }
    if ((st = grow(p, v, &cap, 1))) {
      free(key);
      goto out;
    }
    memset(&v->items[v->n], 0, sizeof(ct_json));
    v->keys[v->n] = key;
    v->n++;
    skip_ws(p);
    if (p->pos >= p->len) {
      st = fail_at(p, p->pos, "unexpected end of input: expected ':' after object key");
      goto out;
    }
    if (p->s[p->pos] != ':') {
      st = fail_at(p, p->pos, "expected ':' after object key");
      goto out;
    }
    p->pos++;
    if ((st = parse_value(p, &v->items[v->n - 1]))) goto out;
    skip_ws(p);
    if (p->pos >= p->len) {
      st = fail_at(p, p->pos, "unexpected end of input: expected ',' or '}' after object member");
      goto out;
    }
    char c = p->s[p->pos];
    if (c == '}') {
      p->pos++;
      break;
    }
    if (c != ',') {
      st = fail_at(p, p->pos, "expected ',' or '}' after object member");
      goto out;
    }
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == '}') {
      st = fail_at(p, p->pos, "trailing comma before '}'");
      goto out;
    }
  }
out:
  p->depth--;
  return st;
}

static ct_status parse_literal(parser *p, ct_json *v, const char *word, size_t n) {
  ct_status st = CT_OK;
  if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) {
    st = fail_at(p, p->pos, "invalid literal; expected true, false or null");
    goto out;
  }
  p->pos += n;
out:
  (void)v;
  return st;
}

static ct_status parse_value(parser *p, ct_json *v) {
  ct_status st = CT_OK;
  skip_ws(p);
  v->line = clamp_int(p->line);
  v->col = clamp_int(p->pos - p->line_start + 1);
  if (p->pos >= p->len) {
    st = fail_at(p, p->pos, "unexpected end of input: expected a value");
    goto out;
  }
  switch (p->s[p->pos]) {
    case '{':
      st = parse_object(p, v);
      break;
    case '[':
      st = parse_array(p, v);
      break;
    case '"':
      v->type = CT_JSON_STRING;
      st = parse_string(p, &v->str, &v->len);
      break;
    case 't':
      v->type = CT_JSON_BOOL;
      v->boolean = 1;
      st = parse_literal(p, v, "true", 4);
      break;
    case 'f':
      v->type = CT_JSON_BOOL;
      v->boolean = 0;
      st = parse_literal(p, v, "false", 5);
      break;
    case 'n':
      v->type = CT_JSON_NULL;
      st = parse_literal(p, v, "null", 4);
      break;
    default: {
      char c = p->s[p->pos];
      if (c == '-' || (c >= '0' && c <= '9')) {
        st = parse_number(p, v);
      } else {
        char d[16];
        st = fail_at(p, p->pos, "unexpected %s; expected a value", describe(p, p->pos, d));
      }
    }
  }
out:
  return st;
}

static void free_value(ct_json *v) {
  if (v->type == CT_JSON_ARRAY || v->type == CT_JSON_OBJECT) {
    for (size_t i = 0; i < v->n; i++) {
      free_value(&v->items[i]);
      if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
  }
  free(v->str);
}

ct_status ct_json_parse(const char *text, size_t len, ct_json **out, ct_err *err) {
  ct_status st = CT_OK;
  ct_json *root = NULL;
  parser p = {.s = text, .len = len, .pos = 0, .line = 1, .line_start = 0, .depth = 0, .err = err};
  if (!out || (!text && len)) {
    st = ct_errf(err, CT_ERR_INVALID, "ct_json_parse: NULL argument");
    goto out;
  }
  *out = NULL;
  root = calloc(1, sizeof *root);
  if (!root) {
    st = fail_nomem(&p);
    goto out;
  }
  if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) p.pos = p.line_start = 3;
  if ((st = parse_value(&p, root))) goto out;
  skip_ws(&p);
  if (p.pos < p.len) {
    char d[16];
    st = fail_at(&p, p.pos, "unexpected %s after the JSON value", describe(&p, p.pos, d));
    goto out;
  }
  *out = root;
  root = NULL;
out:
  ct_json_free(root);
  return st;
}

ct_status ct_json_parse_file(const char *path, size_t max, ct_json **out, ct_err *err) {
  *out = NULL;
  char *text = NULL;
  size_t n = 0;
  ct_status st = ct_read_file(path, max, &text, &n, err);
  if (st) return st;
  st = ct_json_parse(text, n, out, err);
  free(text);
  if (st) ct_err_prefix(err, "%s: ", path);
  return st;
}

void ct_json_fput_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    const unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
}

void ct_json_free(ct_json *j) {
  if (!j) return;
  free_value(j);
  free(j);
}

const ct_json *ct_json_get(const ct_json *obj, const char *key) {
  const ct_json *r = NULL;
  if (!obj || !key || obj->type != CT_JSON_OBJECT) goto out;
  for (size_t i = obj->n; i-- > 0;) {
    if (!strcmp(obj->keys[i], key)) {
      r = &obj->items[i];
      break;
    }
  }
out:
  return r;
}

const char *ct_json_type_name(ct_json_type t) {
  switch (t) {
    case CT_JSON_NULL:
      return "null";
    case CT_JSON_BOOL:
      return "boolean";
    case CT_JSON_NUMBER:
      return "number";
    case CT_JSON_STRING:
      return "string";
    case CT_JSON_ARRAY:
      return "array";
    case CT_JSON_OBJECT:
      return "object";
  }
  return "unknown";
}

int ct_utf8_valid(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  int ok = 1;
  for (size_t i = 0; i < n;) {
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    size_t k = utf8_seq(u, i, n);
    if (!k) {
      ok = 0;
      break;
    }
    i += k;
  }
  return ok;
}

/* A small, bounded JSON reader (DOM) for configs and safetensors headers.
 *
 * Strict RFC 8259 (no comments, no trailing commas), UTF-8 strings with \u
 * escapes decoded (surrogate pairs joined), nesting depth bounded. Errors
 * report line and column (1-based) in the ct_err message:
 *   "line 3, column 17: expected ',' or '}' after object member".
 * Numbers keep their double value; when the literal is an integer that fits
 * int64 it is also exact in `i64` with is_int = 1.
 */
#ifndef CTUNER_JSON_H
#define CTUNER_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ctuner/status.h"

typedef enum ct_json_type {
  CT_JSON_NULL = 0,
  CT_JSON_BOOL,
  CT_JSON_NUMBER,
  CT_JSON_STRING,
  CT_JSON_ARRAY,
  CT_JSON_OBJECT
} ct_json_type;

typedef struct ct_json {
  ct_json_type type;
  int line, col; /* where the value starts, for error messages */
  int boolean;   /* CT_JSON_BOOL */
  double num;    /* CT_JSON_NUMBER */
  int is_int;    /* number literal is an integer that fits int64 */
  int64_t i64;
  char *str; /* CT_JSON_STRING: NUL-terminated (may contain NULs; see len) */
  size_t len;
  size_t n;              /* ARRAY/OBJECT: number of items */
  struct ct_json *items; /* n values */
  char **keys;           /* OBJECT: n keys (NUL-terminated) */
} ct_json;

#define CT_JSON_MAX_DEPTH 64

ct_status ct_json_parse(const char *text, size_t len, ct_json **out, ct_err *err);
/* Reads (at most max bytes) and parses a file; errors start with the path
 * (CT_ERR_NOT_FOUND if it is missing). */
ct_status ct_json_parse_file(const char *path, size_t max, ct_json **out, ct_err *err);
/* Writes s as a JSON string literal (quotes, escapes) to f. */
void ct_json_fput_str(FILE *f, const char *s);
void ct_json_free(ct_json *j);
/* Object member by key (last one wins on duplicates); NULL if absent or not an object. */
const ct_json *ct_json_get(const ct_json *obj, const char *key);
const char *ct_json_type_name(ct_json_type t);
/* 1 if s[0..n) is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
int ct_utf8_valid(const char *s, size_t n);

#endif

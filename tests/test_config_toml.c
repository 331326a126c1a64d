/* The TOML reader of config.toml (src/config/toml.c) against Python's
 * tomllib: every fixture of tests/data/toml/valid reads to the value tree
 * tomllib gave (valid/NAME.json, written by scripts/toml_expect.py), every
 * one of invalid/ is refused with a line and column, every one of refused/
 * (TOML that tomllib reads but a flat option file has no use for) is refused
 * naming what it is. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/config.h"
#include "ctuner/json.h"
#include "harness.h"

#define DIR_TOML CT_SOURCE_DIR "/tests/data/toml"

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  char *b = NULL;
  *len = 0;
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long n = ftell(f);
    rewind(f);
    b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b) {
      *len = fread(b, 1, (size_t)n, f);
      b[*len] = 0;
    }
  }
  fclose(f);
  return b;
}

/* 1 if ctuner's value v equals tomllib's tagged value t. */
static int same(const ct_json *v, const ct_json *t, char *why, size_t n) {
  if (t->type == CT_JSON_ARRAY) {
    if (v->type != CT_JSON_ARRAY || v->n != t->n)
      return snprintf(why, n, "line %d: array of %zu, want %zu", v->line, v->n, t->n), 0;
    for (size_t i = 0; i < t->n; i++)
      if (!same(&v->items[i], &t->items[i], why, n)) return 0;
    return 1;
  }
  const ct_json *ty = ct_json_get(t, "type"), *val = ct_json_get(t, "value");
  if (!ty || !val) return snprintf(why, n, "bad expectation"), 0;
  const char *want = val->str;
  if (!strcmp(ty->str, "string")) {
    if (v->type != CT_JSON_STRING || v->len != val->len || memcmp(v->str, want, v->len))
      return snprintf(why, n, "line %d: string differs from \"%s\"", v->line, want), 0;
  } else if (!strcmp(ty->str, "bool")) {
    if (v->type != CT_JSON_BOOL || v->boolean != !strcmp(want, "true"))
      return snprintf(why, n, "line %d: want bool %s", v->line, want), 0;
  } else if (!strcmp(ty->str, "integer")) {
    char got[32];
    snprintf(got, sizeof got, "%lld", (long long)v->i64);
    if (v->type != CT_JSON_NUMBER || !v->is_int || strcmp(got, want))
      return snprintf(why, n, "line %d: integer %s, want %s", v->line, got, want), 0;
  } else {
    const double w = strtod(want, NULL);
    const int ok = v->type == CT_JSON_NUMBER && !v->is_int &&
                   (isnan(w) ? isnan(v->num) : v->num == w && signbit(v->num) == signbit(w));
    if (!ok) return snprintf(why, n, "line %d: float %.17g, want %s", v->line, v->num, want), 0;
  }
  return 1;
}

/* Each fixture NAME.toml of sub, with its text. */
typedef void (*visit_fn)(int *ct_failed_, const char *dir, const char *name, const char *text,
                         size_t len);
static int each(int *ct_failed_, const char *sub, visit_fn fn) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/%s", DIR_TOML, sub);
  DIR *d = opendir(dir);
  int count = 0;
  CHECKF(d != NULL, "%s", dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    const size_t l = strlen(e->d_name);
    if (l < 6 || strcmp(e->d_name + l - 5, ".toml")) continue;
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    size_t len;
    char *text = slurp(path, &len);
    CHECKF(text != NULL, "%s", path);
    if (text) fn(ct_failed_, dir, e->d_name, text, len);
    free(text);
    count++;
  }
  if (d) closedir(d);
  return count;
}

static void valid_one(int *ct_failed_, const char *dir, const char *name, const char *text,
                      size_t len) {
  ct_json *got = NULL, *want = NULL;
  ct_err err = {0};
  char path[2048], why[300] = "";
  snprintf(path, sizeof path, "%s/%.*s.json", dir, (int)(strlen(name) - 5), name);
  CHECKF(ct_config_toml_parse(text, len, &got, &err) == CT_OK, "%s: %s", name, err.msg);
  CHECKF(ct_json_parse_file(path, 1 << 20, &want, &err) == CT_OK, "%s: %s", path, err.msg);
  if (got && want) {
    CHECKF(got->n == want->n, "%s: %zu keys, tomllib %zu", name, got->n, want->n);
    for (size_t i = 0; i < want->n && i < got->n; i++) {
      CHECKF(!strcmp(got->keys[i], want->keys[i]), "%s: key %zu '%s', want '%s'", name, i,
             got->keys[i], want->keys[i]);
      CHECKF(same(&got->items[i], &want->items[i], why, sizeof why), "%s: %s: %s", name,
             want->keys[i], why);
    }
  }
  ct_json_free(got);
  ct_json_free(want);
}

static void invalid_one(int *ct_failed_, const char *dir, const char *name, const char *text,
                        size_t len) {
  (void)dir;
  ct_json *got = NULL;
  ct_err err = {0};
  int line, col;
  CHECKF(ct_config_toml_parse(text, len, &got, &err) != CT_OK, "%s is read; tomllib refuses it",
         name);
  CHECKF(sscanf(err.msg, "line %d, column %d:", &line, &col) == 2, "%s: %s", name, err.msg);
  ct_json_free(got);
}

static void refused_one(int *ct_failed_, const char *dir, const char *name, const char *text,
                        size_t len) {
  (void)dir;
  ct_json *got = NULL;
  ct_err err = {0};
  char what[128] = "";
  sscanf(text, "# refused: %127[^\n]", what);
  CHECKF(ct_config_toml_parse(text, len, &got, &err) == CT_ERR_FORMAT, "%s is read", name);
  CHECKF(what[0] && strstr(err.msg, what) && !strncmp(err.msg, "line ", 5), "%s: '%s' lacks '%s'",
         name, err.msg, what);
  ct_json_free(got);
}

CT_TEST(config_toml, valid_as_tomllib_reads_them) {
  CHECK(each(ct_failed_, "valid", valid_one) >= 7);
}

CT_TEST(config_toml, invalid_refused_with_position) {
  CHECK(each(ct_failed_, "invalid", invalid_one) >= 25);
}

CT_TEST(config_toml, unsupported_refused_by_name) {
  CHECK(each(ct_failed_, "refused", refused_one) >= 10);
}

/* test_json.c: suite `json` — valid documents (nesting, escapes, unicode,
 * numbers), each error class with its line/column, the depth limit, and
 * truncated/mutated inputs that must fail cleanly (run under ASan too). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "harness.h"

/* Parse from an exactly-sized heap copy so ASan catches any read past len. */
static ct_status parse_exact(const char *s, size_t n, ct_json **out, ct_err *err) {
  char *copy = malloc(n ? n : 1);
  if (!copy) return CT_ERR_NOMEM;
  if (n) memcpy(copy, s, n);
  ct_status st = ct_json_parse(copy, n, out, err);
  free(copy);
  return st;
}

static ct_json *parse_ok(const char *s) {
  ct_json *j = NULL;
  ct_err e = {0};
  if (parse_exact(s, strlen(s), &j, &e)) {
    fprintf(stderr, "  unexpected parse error for %s: %s\n", s, e.msg);
    return NULL;
  }
  return j;
}

CT_TEST(json, valid_document) {
  const char *doc =
      "{\n"
      "  \"name\": \"flux\",\n"
      "  \"layers\": [1, 2, 3],\n"
      "  \"opt\": {\"lr\": 1e-4, \"betas\": [0.9, 0.999], \"decay\": false},\n"
      "  \"empty_a\": [], \"empty_o\": {},\n"
      "  \"nothing\": null, \"yes\": true,\n"
      "  \"neg\": -17, \"zero\": 0, \"negzero\": -0, \"frac\": -12.5E+1\n"
      "}";
  ct_json *j = parse_ok(doc);
  REQUIRE(j);
  CHECK(j->type == CT_JSON_OBJECT && j->n == 11);
  CHECK(j->line == 1 && j->col == 1);
  const ct_json *v = ct_json_get(j, "name");
  REQUIRE(v && v->type == CT_JSON_STRING);
  CHECK(!strcmp(v->str, "flux") && v->len == 4);
  CHECK(v->line == 2 && v->col == 11);
  v = ct_json_get(j, "layers");
  REQUIRE(v && v->type == CT_JSON_ARRAY && v->n == 3);
  CHECK(v->items[2].is_int && v->items[2].i64 == 3 && v->items[2].num == 3.0);
  const ct_json *opt = ct_json_get(j, "opt");
  REQUIRE(opt && opt->type == CT_JSON_OBJECT);
  v = ct_json_get(opt, "lr");
  REQUIRE(v && v->type == CT_JSON_NUMBER);
  CHECK(v->num == 1e-4 && !v->is_int);
  v = ct_json_get(opt, "betas");
  REQUIRE(v && v->n == 2);
  CHECK(v->items[1].num == 0.999);
  v = ct_json_get(opt, "decay");
  CHECK(v && v->type == CT_JSON_BOOL && v->boolean == 0);
  v = ct_json_get(j, "yes");
  CHECK(v && v->type == CT_JSON_BOOL && v->boolean == 1);
  v = ct_json_get(j, "nothing");
  CHECK(v && v->type == CT_JSON_NULL);
  v = ct_json_get(j, "empty_a");
  CHECK(v && v->type == CT_JSON_ARRAY && v->n == 0);
  v = ct_json_get(j, "empty_o");
  CHECK(v && v->type == CT_JSON_OBJECT && v->n == 0);
  v = ct_json_get(j, "neg");
  CHECK(v && v->is_int && v->i64 == -17);
  v = ct_json_get(j, "negzero");
  CHECK(v && v->is_int && v->i64 == 0 && v->num == 0.0 && signbit(v->num));
  v = ct_json_get(j, "frac");
  CHECK(v && !v->is_int && v->num == -125.0);
  CHECK(ct_json_get(j, "missing") == NULL);
  CHECK(ct_json_get(ct_json_get(j, "layers"), "x") == NULL); /* not an object */
  CHECK(ct_json_get(NULL, "x") == NULL);
  ct_json_free(j);
  ct_json_free(NULL);
}

CT_TEST(json, scalars_and_whitespace) {
  ct_json *j = parse_ok(" \t\r\n 42 \n");
  REQUIRE(j);
  CHECK(j->type == CT_JSON_NUMBER && j->is_int && j->i64 == 42);
  CHECK(j->line == 2 && j->col == 2);
  ct_json_free(j);
  j = parse_ok("\"just a string\"");
  REQUIRE(j);
  CHECK(j->type == CT_JSON_STRING && !strcmp(j->str, "just a string"));
  ct_json_free(j);
  j = parse_ok("null");
  REQUIRE(j);
  CHECK(j->type == CT_JSON_NULL);
  ct_json_free(j);
  j = parse_ok("\xEF\xBB\xBF[true]"); /* a leading BOM is ignored */
  REQUIRE(j);
  CHECK(j->type == CT_JSON_ARRAY && j->n == 1);
  ct_json_free(j);
}

CT_TEST(json, integers) {
  ct_json *j = parse_ok(
      "[9223372036854775807, -9223372036854775808, 9223372036854775808, "
      "-9223372036854775809, 1.0, 1e2, 123456789012]");
  REQUIRE(j && j->n == 7);
  CHECK(j->items[0].is_int && j->items[0].i64 == INT64_MAX);
  CHECK(j->items[1].is_int && j->items[1].i64 == INT64_MIN);
  CHECK(!j->items[2].is_int && j->items[2].num == 9223372036854775808.0);
  CHECK(!j->items[3].is_int);
  CHECK(!j->items[4].is_int && j->items[4].num == 1.0);
  CHECK(!j->items[5].is_int && j->items[5].num == 100.0);
  CHECK(j->items[6].is_int && j->items[6].i64 == 123456789012LL);
  ct_json_free(j);
  /* A long (but valid) literal goes through the heap copy. */
  char buf[400];
  memset(buf, '0', sizeof buf);
  buf[0] = '1';
  buf[1] = '.';
  buf[sizeof buf - 2] = '5';
  buf[sizeof buf - 1] = '\0';
  j = parse_ok(buf);
  REQUIRE(j);
  CHECK(j->type == CT_JSON_NUMBER && j->num == 1.0 && !j->is_int);
  ct_json_free(j);
}

CT_TEST(json, strings_and_unicode) {
  ct_json *j = parse_ok(
      "[\"a\\\"b\\\\c\\/d\\be\\ff\\ng\\rh\\ti\", \"\\u00e9\\u20AC\", "
      "\"\\ud83d\\ude00\", \"x\\u0000y\", \"caf\xC3\xA9 \xF0\x9F\x98\x80\", "
      "\"\\uFFFF\"]");
  REQUIRE(j && j->n == 6);
  CHECK(!strcmp(j->items[0].str, "a\"b\\c/d\be\ff\ng\rh\ti"));
  CHECK(!strcmp(j->items[1].str, "\xC3\xA9\xE2\x82\xAC")); /* é € */
  CHECK(!strcmp(j->items[2].str, "\xF0\x9F\x98\x80"));     /* U+1F600 */
  CHECK(j->items[2].len == 4);
  CHECK(j->items[3].len == 3 && !memcmp(j->items[3].str, "x\0y", 3));
  CHECK(!strcmp(j->items[4].str, "caf\xC3\xA9 \xF0\x9F\x98\x80"));
  CHECK(!strcmp(j->items[5].str, "\xEF\xBF\xBF"));
  ct_json_free(j);
}

CT_TEST(json, duplicate_keys_last_wins) {
  ct_json *j = parse_ok("{\"k\": 1, \"other\": 2, \"k\": 3}");
  REQUIRE(j);
  CHECK(j->n == 3);
  const ct_json *v = ct_json_get(j, "k");
  CHECK(v && v->i64 == 3);
  ct_json_free(j);
}

typedef struct err_case {
  const char *text;
  const char *want; /* substring of the message */
} err_case;

CT_TEST(json, error_positions) {
  static const err_case cases[] = {
      {"{\"a\": 1 \"b\": 2}", "line 1, column 9: expected ',' or '}' after object member"},
      {"{\n  \"a\": 1,\n  \"b\": 2\n  \"c\": 3}",
       "line 4, column 3: expected ',' or '}' after object member"},
      {"{\n  \"a\": [1,\n    2 3]\n}", "line 3, column 7: expected ',' or ']' after array element"},
      {"[1, 2,]", "line 1, column 7: trailing comma before ']'"},
      {"{\"a\":1,}", "line 1, column 8: trailing comma before '}'"},
      {"{\"a\" 1}", "line 1, column 6: expected ':' after object key"},
      {"{1: 2}", "line 1, column 2: expected a string key in object, found '1'"},
      {"[01]", "line 1, column 2: leading zeros are not allowed"},
      {"-012", "line 1, column 1: leading zeros are not allowed"},
      {"[\"a\\qb\"]", "line 1, column 4: invalid escape: backslash followed by 'q'"},
      {"[\"a\tb\"]", "line 1, column 4: control character U+0009 in string must be escaped"},
      {"\"\n\"", "line 1, column 2: control character U+000A"},
      {"\"\\ud800\"", "line 1, column 2: lone high surrogate \\uD800"},
      {"\"\\ud800\\u0041\"", "line 1, column 2: lone high surrogate"},
      {"\"ab\\udc00\"", "line 1, column 4: lone low surrogate \\uDC00"},
      {"\"\\u12g4\"", "line 1, column 2: invalid \\u escape: expected 4 hex digits"},
      {"\"\\u12\"", "invalid \\u escape"},
      {"{\"a\": ", "line 1, column 7: unexpected end of input: expected a value"},
      {"", "line 1, column 1: unexpected end of input: expected a value"},
      {"   \n  ", "line 2, column 3: unexpected end of input: expected a value"},
      {"[", "line 1, column 2: unexpected end of input: expected a value or ']'"},
      {"[1", "line 1, column 3: unexpected end of input: expected ',' or ']'"},
      {"{", "line 1, column 2: unexpected end of input: expected a string key or '}'"},
      {"{\"a\"", "line 1, column 5: unexpected end of input: expected ':'"},
      {"{\"a\":1", "line 1, column 7: unexpected end of input: expected ',' or '}'"},
      {"\"abc", "line 1, column 5: unexpected end of input in string"},
      {"tru", "line 1, column 1: invalid literal"},
      {"nul", "line 1, column 1: invalid literal"},
      {"[falsy]", "line 1, column 2: invalid literal"},
      {"1.", "line 1, column 3: expected a digit after the decimal point"},
      {"1.e5", "line 1, column 3: expected a digit after the decimal point"},
      {"1e", "line 1, column 3: expected a digit in the exponent"},
      {"1e+", "line 1, column 4: expected a digit in the exponent"},
      {"-", "line 1, column 2: unexpected end of input in number"},
      {"-a", "line 1, column 2: expected a digit in number, found 'a'"},
      {"+1", "line 1, column 1: unexpected '+'; expected a value"},
      {".5", "line 1, column 1: unexpected '.'"},
      {"1 2", "line 1, column 3: unexpected '2' after the JSON value"},
      {"{} x", "line 1, column 4: unexpected 'x' after the JSON value"},
      {"1e999", "line 1, column 1: number 1e999 is out of range"},
      {"-1e999", "out of range"},
      {"NaN", "line 1, column 1: unexpected 'N'"},
      {"[Infinity]", "line 1, column 2: unexpected 'I'"},
      {"// comment\n1", "line 1, column 1: unexpected '/'"},
      {"{'a': 1}", "line 1, column 2: expected a string key in object, found '''"},
      {"\"\xC3\x28\"", "line 1, column 2: invalid UTF-8 byte 0xC3"},
      {"\"\xC0\x80\"", "invalid UTF-8 byte 0xC0"},
      {"\"\xED\xA0\x80\"", "invalid UTF-8 byte 0xED"},
      {"\"\xF4\x90\x80\x80\"", "invalid UTF-8 byte 0xF4"},
      {"\"ab\xE2\x82\"", "line 1, column 4: invalid UTF-8 byte 0xE2"},
      {"\xFF", "line 1, column 1: unexpected byte 0xFF"},
      {"{\"a\\u0000b\": 1}", "line 1, column 2: object key contains U+0000"},
      {"[1,\n\n  ,2]", "line 3, column 3: unexpected ','; expected a value"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ct_json *j = (ct_json *)1;
    ct_err e = {0};
    ct_status st = parse_exact(cases[i].text, strlen(cases[i].text), &j, &e);
    CHECKF(st == CT_ERR_FORMAT && e.status == CT_ERR_FORMAT, "case %zu: status %s", i,
           ct_status_name(st));
    CHECKF(j == NULL, "case %zu: out not cleared", i);
    CHECKF(strstr(e.msg, cases[i].want) != NULL, "case %zu (%s):\n    got  '%s'\n    want '%s'", i,
           cases[i].text, e.msg, cases[i].want);
  }
  /* An embedded NUL byte is not the end of the input. */
  ct_json *j = NULL;
  ct_err e = {0};
  CHECK(parse_exact("[1]\0", 4, &j, &e) == CT_ERR_FORMAT);
  CHECK(strstr(e.msg, "line 1, column 4: unexpected byte 0x00 after the JSON value") != NULL);
  CHECK(parse_exact("[\"a\0b\"]", 7, &j, &e) == CT_ERR_FORMAT);
  CHECK(strstr(e.msg, "control character U+0000") != NULL);
}

static char *nested(int depth, char open, char close) {
  char *s = malloc((size_t)depth * 2 + 1);
  for (int i = 0; i < depth; i++) {
    s[i] = open;
    s[depth * 2 - 1 - i] = close;
  }
  s[depth * 2] = '\0';
  return s;
}

CT_TEST(json, depth_limit) {
  ct_json *j = NULL;
  ct_err e = {0};
  char *ok = nested(CT_JSON_MAX_DEPTH, '[', ']');
  char *bad = nested(CT_JSON_MAX_DEPTH + 1, '[', ']');
  REQUIRE(ok && bad);
  CHECK(parse_exact(ok, strlen(ok), &j, &e) == CT_OK);
  const ct_json *v = j;
  int d = 0;
  while (v && v->type == CT_JSON_ARRAY) {
    d++;
    v = v->n ? &v->items[0] : NULL;
  }
  CHECK(d == CT_JSON_MAX_DEPTH);
  ct_json_free(j);
  j = NULL;
  CHECK(parse_exact(bad, strlen(bad), &j, &e) == CT_ERR_FORMAT);
  CHECKF(strstr(e.msg, "line 1, column 65: nesting deeper than 64 levels") != NULL, "%s", e.msg);
  free(ok);
  free(bad);
  /* Objects count too, and a huge depth fails fast without deep recursion. */
  size_t n = 100000;
  char *deep = malloc(n * 6 + 1);
  REQUIRE(deep);
  for (size_t i = 0; i < n; i++) memcpy(deep + 6 * i, "{\"a\":[", 6);
  deep[n * 6] = '\0';
  CHECK(parse_exact(deep, n * 6, &j, &e) == CT_ERR_FORMAT);
  CHECK(strstr(e.msg, "nesting deeper than 64 levels") != NULL);
  free(deep);
}

static const char *k_valid_doc =
    "{\"model\": {\"depth\": 19, \"heads\": [24, 24], \"theta\": 1.0e4, \"name\": "
    "\"fl\\u00fcx\"},\n"
    " \"data\": [{\"path\": \"/tmp/a b\", \"repeat\": -3, \"ok\": true, \"n\": null},\n"
    "          {\"emoji\": \"\\ud83d\\ude00\", \"raw\": \"\xC3\xA9\", \"esc\": \"\\\"\\\\\\n\"}],\n"
    " \"lr\": -0.5E-3, \"flags\": [false, [], {}]}";

CT_TEST(json, truncated_prefixes_fail) {
  size_t n = strlen(k_valid_doc);
  ct_json *j = NULL;
  ct_err e = {0};
  REQUIRE(parse_exact(k_valid_doc, n, &j, &e) == CT_OK);
  ct_json_free(j);
  for (size_t len = 0; len < n; len++) {
    j = (ct_json *)1;
    ct_status st = parse_exact(k_valid_doc, len, &j, &e);
    CHECKF(st == CT_ERR_FORMAT, "prefix %zu parsed (status %d)", len, st);
    CHECKF(j == NULL, "prefix %zu: out set", len);
    CHECKF(!strncmp(e.msg, "line ", 5), "prefix %zu: message '%s'", len, e.msg);
    if (st == CT_OK) ct_json_free(j);
  }
}

CT_TEST(json, mutations_never_crash) {
  size_t n = strlen(k_valid_doc);
  static const unsigned char subst[] = {0,   '"', '\\', '{', '}',  '[',  ']',  ',',  ':',
                                        '0', 'e', '-',  'u', 0x80, 0xC3, 0xFF, '\n', ' '};
  char *buf = malloc(n);
  REQUIRE(buf);
  int ok = 0, failed = 0;
  for (size_t i = 0; i < n; i++) {
    for (size_t k = 0; k < sizeof subst; k++) {
      memcpy(buf, k_valid_doc, n);
      buf[i] = (char)subst[k];
      ct_json *j = NULL;
      ct_err e = {0};
      ct_status st = ct_json_parse(buf, n, &j, &e);
      if (st == CT_OK) {
        ok++;
        ct_json_free(j);
      } else {
        failed++;
        CHECK(st == CT_ERR_FORMAT && !strncmp(e.msg, "line ", 5));
      }
    }
  }
  CHECK(ok > 0 && failed > 0);
  free(buf);
}

CT_TEST(json, type_names) {
  CHECK(!strcmp(ct_json_type_name(CT_JSON_OBJECT), "object"));
  CHECK(!strcmp(ct_json_type_name(CT_JSON_STRING), "string"));
  CHECK(!strcmp(ct_json_type_name(CT_JSON_NUMBER), "number"));
  ct_json *j = NULL;
  CHECK(ct_json_parse(NULL, 1, &j, NULL) == CT_ERR_INVALID);
}

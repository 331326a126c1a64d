/* test_yaml.c: suite `yaml` — ct_yaml_parse against PyYAML's safe_load:
 * scalar resolution (YAML 1.1 nulls, booleans, ints, floats; quoted and tagged
 * scalars), flow and block collections, anchors, aliases and merge keys,
 * repeated keys; the expected trees were written by PyYAML 6.0
 * (yaml.safe_load, keys sorted). Then the refusals: syntax errors with their
 * line, unknown tags, undefined aliases, an alias bomb, two documents. */
#include <stdlib.h>
#include <string.h>

#include "ctuner/yaml.h"
#include "harness.h"

/* Canonical text of a tree: keys sorted, ints bare, floats "f:%.17g". */
static void canon(const ct_json *j, char *out, size_t cap) {
  size_t n = strlen(out);
  char *o = out + n;
  cap -= n;
  switch (j->type) {
    case CT_JSON_NULL:
      snprintf(o, cap, "null");
      break;
    case CT_JSON_BOOL:
      snprintf(o, cap, "%s", j->boolean ? "true" : "false");
      break;
    case CT_JSON_NUMBER:
      if (j->is_int)
        snprintf(o, cap, "%lld", (long long)j->i64);
      else
        snprintf(o, cap, "f:%.17g", j->num);
      break;
    case CT_JSON_STRING:
      snprintf(o, cap, "\"%s\"", j->str);
      break;
    case CT_JSON_ARRAY:
      snprintf(o, cap, "[");
      for (size_t i = 0; i < j->n; i++) {
        if (i) strncat(out, ",", cap - 1);
        canon(&j->items[i], out, cap + n);
      }
      strncat(out, "]", cap - 1);
      break;
    case CT_JSON_OBJECT: {
      size_t idx[64], m = j->n < 64 ? j->n : 64;
      for (size_t i = 0; i < m; i++) idx[i] = i;
      for (size_t i = 1; i < m; i++)
        for (size_t k = i; k > 0 && strcmp(j->keys[idx[k - 1]], j->keys[idx[k]]) > 0; k--) {
          size_t t = idx[k];
          idx[k] = idx[k - 1];
          idx[k - 1] = t;
        }
      snprintf(o, cap, "{");
      for (size_t i = 0; i < m; i++) {
        if (i) strncat(out, ",", cap - 1);
        strncat(out, j->keys[idx[i]], cap - 1);
        strncat(out, ":", cap - 1);
        canon(&j->items[idx[i]], out, cap + n);
      }
      strncat(out, "}", cap - 1);
      break;
    }
  }
}

static const struct {
  const char *doc, *want;
} cases[] = {
    {"v: ~", "null"},
    {"v: null", "null"},
    {"v: Null", "null"},
    {"v: NULL", "null"},
    {"v: ", "null"},
    {"v: yes", "true"},
    {"v: No", "false"},
    {"v: ON", "true"},
    {"v: off", "false"},
    {"v: True", "true"},
    {"v: FALSE", "false"},
    {"v: y", "\"y\""},
    {"v: n", "\"n\""},
    {"v: Yes please", "\"Yes please\""},
    {"v: 0", "0"},
    {"v: -0", "0"},
    {"v: +12", "12"},
    {"v: 012", "10"},
    {"v: 0o12", "\"0o12\""},
    {"v: 09", "\"09\""},
    {"v: 0x1F", "31"},
    {"v: 0b101", "5"},
    {"v: 1_000", "1000"},
    {"v: 1:30", "90"},
    {"v: 190:20:30", "685230"},
    {"v: 1.5", "f:1.5"},
    {"v: -1.5", "f:-1.5"},
    {"v: 1.", "f:1"},
    {"v: 1e5", "\"1e5\""},
    {"v: 1.0e5", "\"1.0e5\""},
    {"v: 1.0e+5", "f:100000"},
    {"v: 1.0e-5", "f:1.0000000000000001e-05"},
    {"v: .5", "f:0.5"},
    {"v: -.5", "\"-.5\""},
    {"v: +.5", "\"+.5\""},
    {"v: .inf", "f:inf"},
    {"v: -.Inf", "f:-inf"},
    {"v: .NaN", "f:nan"},
    {"v: 6.8523015e+5", "f:685230.15000000002"},
    {"v: 0.01", "f:0.01"},
    {"v: 'quoted'", "\"quoted\""},
    {"v: \"no\"", "\"no\""},
    {"v: !!str yes", "\"yes\""},
    {"v: !!int '42'", "42"},
    {"v: !!float 3", "f:3"},
    {"v: !!bool 'on'", "true"},
    {"v: !!null ''", "null"},
    {"v: bf16", "\"bf16\""},
    {"v: 10.0.0.1", "\"10.0.0.1\""},
    {"v: 1.2.3", "\"1.2.3\""},
    {"v: 0.0.0.0", "\"0.0.0.0\""},
    {"v: 29500", "29500"},
    {"a: [1, 'two', {b: c}]\nd:\n  - x\n  - null\n", "{a:[1,\"two\",{b:\"c\"}],d:[\"x\",null]}"},
    {"base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  y: 3\n", "{base:{x:1,y:2},use:{x:1,y:3}}"},
    {"m1: &m1 {a: 1}\nm2: &m2 {a: 2, b: 2}\nboth:\n  <<: [*m1, *m2]\n  c: 3\n",
     "{both:{a:1,b:2,c:3},m1:{a:1},m2:{a:2,b:2}}"},
    {"s: &s hello\nt: *s\n", "{s:\"hello\",t:\"hello\"}"},
    {"k: 1\nk: 2\nj: 3\n", "{j:3,k:2}"},
    {"block: |\n  line1\n  line2\nfolded: >\n  a\n  b\n",
     "{block:\"line1\nline2\n\",folded:\"a b\n\"}"},
    {"# comment\n---\nx: 1 # trailing\n...\n", "{x:1}"},
    {"nested:\n  deeper:\n    deepest: [a, [b, c]]\n",
     "{nested:{deeper:{deepest:[\"a\",[\"b\",\"c\"]]}}}"},
    {"empty_map: {}\nempty_list: []\nempty_val:\n", "{empty_list:[],empty_map:{},empty_val:null}"},
    {"'quoted key': 1\n\"dq\\tkey\": 2\n", "{dq\tkey:2,quoted key:1}"},
};

CT_TEST(yaml, matches_pyyaml) {
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ct_json *j = NULL;
    ct_err e = {0};
    const size_t n = strlen(cases[i].doc);
    char *copy = malloc(n + 1); /* exactly sized: ASan sees a read past the end */
    REQUIRE(copy);
    memcpy(copy, cases[i].doc, n);
    ct_status st = ct_yaml_parse(copy, n, &j, &e);
    free(copy);
    CHECKF(st == CT_OK, "%s: %s", cases[i].doc, e.msg);
    if (st) continue;
    char got[1024] = "";
    /* single-key documents "v: X" compare the value alone */
    const ct_json *v = !strncmp(cases[i].doc, "v: ", 3) ? ct_json_get(j, "v") : j;
    canon(v, got, sizeof got);
    CHECKF(!strcmp(got, cases[i].want), "%s -> %s, PyYAML %s", cases[i].doc, got, cases[i].want);
    ct_json_free(j);
  }
}

CT_TEST(yaml, scalars_keep_their_text_and_line) {
  ct_json *j = NULL;
  ct_err e = {0};
  const char *doc = "# c\nport: 027500\nflag: Off\nip: '10.0.0.1'\n";
  REQUIRE(ct_yaml_parse(doc, strlen(doc), &j, &e) == CT_OK);
  const ct_json *p = ct_json_get(j, "port"), *f = ct_json_get(j, "flag");
  REQUIRE(p && f);
  CHECK(p->type == CT_JSON_NUMBER && p->i64 == 027500 && !strcmp(p->str, "027500"));
  CHECK(p->line == 2 && p->col == 7);
  CHECK(f->type == CT_JSON_BOOL && !f->boolean && !strcmp(f->str, "Off") && f->line == 3);
  ct_json_free(j);
  REQUIRE(ct_yaml_parse("", 0, &j, &e) == CT_OK); /* empty: null, as safe_load gives None */
  CHECK(j && j->type == CT_JSON_NULL);
  ct_json_free(j);
}

CT_TEST(yaml, refusals_name_the_place) {
  static const struct {
    const char *doc, *msg;
  } bad[] = {
      {"a: 1\n b: 2\n", "line 2, column 3"},
      {"a: [1, 2\n", "line 2"},
      {"a: !!python/object:os.system x\n", "tag !!python/object:os.system on a scalar"},
      {"a: !custom x\n", "tag !custom"},
      {"a: *nowhere\n", "alias *nowhere names no anchor"},
      {"a: 1\n---\nb: 2\n", "line 2, column 1: a second document"},
      {"a: !!int abc\n", "'abc' is not a valid !!int"},
      {"? [a, b]\n: 1\n", "a key must be a scalar"},
      {"x: &x [1]\ny: {<<: *x}\n", "a merge key (<<) takes a map"},
      {"a: \"\\0\"\n", "NUL"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    ct_json *j = NULL;
    ct_err e = {0};
    ct_status st = ct_yaml_parse(bad[i].doc, strlen(bad[i].doc), &j, &e);
    CHECKF(st != CT_OK && strstr(e.msg, bad[i].msg), "%s: status %d, '%s' lacks '%s'", bad[i].doc,
           (int)st, e.msg, bad[i].msg);
    CHECK(!j);
  }
}

CT_TEST(yaml, alias_bomb_and_depth_are_bounded) {
  /* 9 levels of 10 aliases each: 10^9 nodes if expanded */
  char doc[2048] = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int l = 1; l < 10; l++) {
    char line[200];
    snprintf(line, sizeof line, "a%d: &a%d [*a%d,*a%d,*a%d,*a%d,*a%d,*a%d,*a%d,*a%d,*a%d,*a%d]\n",
             l, l, l - 1, l - 1, l - 1, l - 1, l - 1, l - 1, l - 1, l - 1, l - 1, l - 1);
    strcat(doc, line);
  }
  ct_json *j = NULL;
  ct_err e = {0};
  CHECK(ct_yaml_parse(doc, strlen(doc), &j, &e) == CT_ERR_RANGE && strstr(e.msg, "nodes"));
  char deep[400];
  size_t k = 0;
  for (int d = 0; d < 100; d++) deep[k++] = '[';
  for (int d = 0; d < 100; d++) deep[k++] = ']';
  CHECK(ct_yaml_parse(deep, k, &j, &e) == CT_ERR_RANGE && strstr(e.msg, "nested deeper"));
  CHECK(ct_yaml_parse_file("/nonexistent/x.yaml", 1 << 20, &j, &e) == CT_ERR_NOT_FOUND);
}

/* YAML 1.1 into a ct_json tree (include/ctuner/yaml.h), over libyaml's event
 * parser.
 *
 * libyaml does the syntax (flow and block styles, quoting, escapes, comments,
 * indentation) and reports errors with their line and column; this file builds
 * the tree from the events and gives plain scalars their types with the rules
 * of PyYAML's SafeLoader, so a file means here what it means to Accelerate.
 * The event API is used rather than libyaml's document loader because the
 * loader gives every untagged scalar the tag !!str, so `!!str yes` (a string)
 * could not be told from `yes` (a boolean).
 *
 * Anchors keep a copy of their node; an alias copies it again, counted against
 * CT_YAML_MAX_NODES (a few lines of nested aliases can otherwise ask for
 * billions of nodes). Not done: recursive aliases (an alias inside the node
 * its anchor names is "undefined" here), YAML 1.2's changed scalar rules.
 */
#include "ctuner/yaml.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "ctuner/fs.h"
#include "ctuner/log.h"

#define STD_TAG "tag:yaml.org,2002:"

typedef struct anchor {
  char *name;
  ct_json val;
} anchor;

typedef struct builder {
  yaml_parser_t p;
  ct_err *err;
  const char *name; /* the file, for warnings ("YAML" for a string) */
  anchor *anchors;
  size_t nanchors;
  size_t nodes; /* created so far, copies included */
} builder;

static ct_status at(builder *b, const yaml_mark_t *m, ct_status st, const char *what,
                    const char *detail) {
  return ct_errf(b->err, st, "line %zu, column %zu: %s%s", m->line + 1, m->column + 1, what,
                 detail ? detail : "");
}

static ct_status next(builder *b, yaml_event_t *ev) {
  ct_status st = CT_OK;
  if (!yaml_parser_parse(&b->p, ev)) {
    if (b->p.error == YAML_MEMORY_ERROR) {
      st = ct_errf(b->err, CT_ERR_NOMEM, "out of memory reading YAML");
    } else {
      const yaml_mark_t *m = &b->p.problem_mark;
      st = ct_errf(b->err, CT_ERR_FORMAT, "line %zu, column %zu: %s%s%s", m->line + 1,
                   m->column + 1, b->p.problem ? b->p.problem : "invalid YAML",
                   b->p.context ? " " : "", b->p.context ? b->p.context : "");
    }
    memset(ev, 0, sizeof *ev);
  }
  return st;
}

static ct_status count_node(builder *b, const yaml_mark_t *m) {
  if (++b->nodes <= CT_YAML_MAX_NODES) return CT_OK;
  return at(b, m, CT_ERR_RANGE,
            "more than "
            "100000"
            " nodes (aliases expand to copies)",
            NULL);
}

static char *memdup0(const char *s, size_t n) {
  char *r = malloc(n + 1);
  if (r) {
    memcpy(r, s, n);
    r[n] = 0;
  }
  return r;
}

/* Deep copy of src into dst (fresh), counted. */
static ct_status copy_value(builder *b, const yaml_mark_t *m, ct_json *dst, const ct_json *src) {
  ct_status st = count_node(b, m);
  if (st) return st;
  *dst = *src;
  dst->str = NULL;
  dst->items = NULL;
  dst->keys = NULL;
  dst->n = 0;
  if (src->str && !(dst->str = memdup0(src->str, src->len))) return CT_ERR_NOMEM;
  if (src->type != CT_JSON_ARRAY && src->type != CT_JSON_OBJECT) return CT_OK;
  if (src->n) {
    dst->items = calloc(src->n, sizeof *dst->items);
    if (!dst->items) return CT_ERR_NOMEM;
    if (src->keys && !(dst->keys = calloc(src->n, sizeof *dst->keys))) return CT_ERR_NOMEM;
  }
  for (size_t i = 0; i < src->n && !st; i++) {
    if (src->keys && !(dst->keys[i] = strdup(src->keys[i]))) st = CT_ERR_NOMEM;
    if (!st) st = copy_value(b, m, &dst->items[i], &src->items[i]);
    dst->n = i + 1;
  }
  return st;
}

static void free_value(ct_json *v) { /* contents only; ct_json_free frees the node too */
  ct_json *box = malloc(sizeof *box);
  if (!box) return; /* out of memory while cleaning up: leak rather than crash */
  *box = *v;
  ct_json_free(box);
  memset(v, 0, sizeof *v);
}

/* ---- scalars: PyYAML's implicit resolvers (YAML 1.1) ---- */

static int is_null(const char *s, size_t n) {
  return n == 0 || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
         !strcmp(s, "NULL");
}

static int parse_bool(const char *s, int *v) {
  static const char *const t[] = {"yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"};
  static const char *const f[] = {"no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"};
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
    if (!strcmp(s, t[i])) return *v = 1, 1;
    if (!strcmp(s, f[i])) return *v = 0, 1;
  }
  return 0;
}

/* Digits of base `base` and '_' (at least one digit); value in *v (double when large). */
static int digits(const char *s, int base, double *v) {
  int any = 0;
  *v = 0;
  for (; *s; s++) {
    int d;
    if (*s == '_') continue;
    if (*s >= '0' && *s <= '9')
      d = *s - '0';
    else if (*s >= 'a' && *s <= 'f')
      d = *s - 'a' + 10;
    else if (*s >= 'A' && *s <= 'F')
      d = *s - 'A' + 10;
    else
      return 0;
    if (d >= base) return 0;
    *v = *v * base + d;
    any = 1;
  }
  return any;
}

/* Sexagesimal "1:30:05" (first part [1-9][0-9_]*, then :[0-5]?[0-9]); 1 if it is one. */
static int sexagesimal(const char *s, double *v) {
  const char *c = strchr(s, ':');
  if (!c || *s < '1' || *s > '9') return 0;
  char head[64];
  if ((size_t)(c - s) >= sizeof head) return 0;
  memcpy(head, s, (size_t)(c - s));
  head[c - s] = 0;
  if (!digits(head, 10, v)) return 0;
  while (c && *c == ':') {
    const char *p = c + 1;
    int part = 0, nd = 0;
    while (*p >= '0' && *p <= '9' && nd < 2) part = part * 10 + (*p++ - '0'), nd++;
    if (!nd || (nd == 2 && p[-2] > '5') || (*p && *p != ':')) return 0;
    *v = *v * 60 + part;
    c = *p ? p : NULL;
  }
  return 1;
}

static int parse_int(const char *s, ct_json *j) {
  int neg = 0;
  double v = 0;
  if (*s == '-' || *s == '+') neg = *s++ == '-';
  int ok;
  if (s[0] == '0' && s[1] == 'b')
    ok = digits(s + 2, 2, &v);
  else if (s[0] == '0' && s[1] == 'x')
    ok = digits(s + 2, 16, &v);
  else if (s[0] == '0' && s[1])
    ok = digits(s + 1, 8, &v);
  else if (s[0] == '0')
    ok = 1, v = 0;
  else if (s[0] >= '1' && s[0] <= '9')
    ok = strchr(s, ':') ? sexagesimal(s, &v) : digits(s, 10, &v);
  else
    ok = 0;
  if (!ok) return 0;
  j->type = CT_JSON_NUMBER;
  j->num = neg ? -v : v;
  j->is_int = v < 9.2e18; /* exact below 2^53; larger ones re-read below */
  if (j->is_int) {
    char buf[96];
    size_t k = 0;
    for (const char *p = s; *p && k < sizeof buf - 1; p++)
      if (*p != '_') buf[k++] = *p;
    buf[k] = 0;
    int base = s[0] == '0' && s[1] == 'b'   ? 2
               : s[0] == '0' && s[1] == 'x' ? 16
               : s[0] == '0'                ? 8
                                            : 10;
    const char *digs = base == 2 || base == 16 ? buf + 2 : buf;
    j->i64 = strchr(s, ':') ? (int64_t)v : (int64_t)strtoull(digs, NULL, base);
    if (neg) j->i64 = -j->i64;
  }
  return 1;
}

static int parse_float(const char *s, ct_json *j) {
  const char *p = s;
  double v;
  if (!strcmp(s, ".nan") || !strcmp(s, ".NaN") || !strcmp(s, ".NAN")) {
    v = NAN;
    goto done;
  }
  if (*p == '-' || *p == '+') p++;
  if (!strcmp(p, ".inf") || !strcmp(p, ".Inf") || !strcmp(p, ".INF")) {
    v = *s == '-' ? -INFINITY : INFINITY;
    goto done;
  }
  /* [-+]?[0-9][0-9_]*\.[0-9_]*([eE][-+][0-9]+)?  or  \.[0-9][0-9_]*(...)? (no sign) */
  char buf[128];
  size_t k = 0;
  int lead = *p >= '0' && *p <= '9';
  if (!lead && (p != s || p[0] != '.' || !(p[1] >= '0' && p[1] <= '9'))) return 0;
  if (lead && strchr(p, ':')) return 0; /* sexagesimal floats: not taken (rare); a string */
  while ((*p >= '0' && *p <= '9') || *p == '_') p++;
  if (*p != '.') return 0;
  p++;
  while ((*p >= '0' && *p <= '9') || *p == '_') p++;
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p != '-' && *p != '+') return 0;
    p++;
    if (!(*p >= '0' && *p <= '9')) return 0;
    while (*p >= '0' && *p <= '9') p++;
  }
  if (*p) return 0;
  for (const char *q = s; *q && k < sizeof buf - 1; q++)
    if (*q != '_') buf[k++] = *q;
  buf[k] = 0;
  v = strtod(buf, NULL);
done:
  j->type = CT_JSON_NUMBER;
  j->num = v;
  return 1;
}

/* Gives j (whose str holds the text) its type: tag = the explicit tag or NULL. */
static ct_status resolve(builder *b, const yaml_mark_t *m, const char *tag, int plain, ct_json *j) {
  const char *s = j->str;
  const char *kind = NULL; /* "null", "bool", "int", "float", "str" */
  if (tag && strcmp(tag, "!")) {
    if (strncmp(tag, STD_TAG, strlen(STD_TAG)))
      return ct_errf(b->err, CT_ERR_UNSUPPORTED,
                     "line %zu, column %zu: tag %s: only YAML's standard tags are read (as "
                     "PyYAML's safe_load)",
                     m->line + 1, m->column + 1, tag);
    kind = tag + strlen(STD_TAG);
    if (!strcmp(kind, "binary") || !strcmp(kind, "timestamp")) kind = "str";
  } else if (!plain || (tag && !strcmp(tag, "!"))) {
    kind = "str";
  }
  ct_json t = {0};
  int bv;
  if (!kind) { /* plain, untagged: the implicit resolvers in PyYAML's order */
    if (is_null(s, j->len))
      j->type = CT_JSON_NULL;
    else if (parse_bool(s, &bv))
      j->type = CT_JSON_BOOL, j->boolean = bv;
    else if (parse_int(s, &t) || parse_float(s, &t))
      j->type = CT_JSON_NUMBER, j->num = t.num, j->is_int = t.is_int, j->i64 = t.i64;
    else
      j->type = CT_JSON_STRING;
    return CT_OK;
  }
  int ok = 1;
  if (!strcmp(kind, "str"))
    j->type = CT_JSON_STRING;
  else if (!strcmp(kind, "null"))
    j->type = CT_JSON_NULL, ok = is_null(s, j->len);
  else if (!strcmp(kind, "bool"))
    j->type = CT_JSON_BOOL, ok = parse_bool(s, &bv), j->boolean = ok && bv;
  else if (!strcmp(kind, "int") || !strcmp(kind, "float")) {
    ok = parse_int(s, &t) || parse_float(s, &t);
    if (ok && !strcmp(kind, "float")) t.is_int = 0;
    j->type = CT_JSON_NUMBER, j->num = t.num, j->is_int = t.is_int, j->i64 = t.i64;
  } else {
    return ct_errf(b->err, CT_ERR_UNSUPPORTED,
                   "line %zu, column %zu: tag !!%s on a scalar: only str, int, float, bool, "
                   "null, binary and timestamp are read",
                   m->line + 1, m->column + 1, kind);
  }
  if (!ok)
    return ct_errf(b->err, CT_ERR_FORMAT, "line %zu, column %zu: '%s' is not a valid !!%s",
                   m->line + 1, m->column + 1, s, kind);
  return CT_OK;
}

/* ---- the tree ---- */

static ct_status build(builder *b, yaml_event_t *ev, int depth, ct_json *dst);

static ct_status remember(builder *b, const char *name, const yaml_mark_t *m, const ct_json *v) {
  ct_json copy;
  ct_status st = copy_value(b, m, &copy, v);
  if (st) {
    free_value(&copy);
    return st;
  }
  for (size_t i = 0; i < b->nanchors; i++)
    if (!strcmp(b->anchors[i].name, name)) { /* redefined: later aliases mean the new one */
      free_value(&b->anchors[i].val);
      b->anchors[i].val = copy;
      return CT_OK;
    }
  anchor *a = realloc(b->anchors, (b->nanchors + 1) * sizeof *a);
  char *nm = strdup(name);
  if (a) b->anchors = a;
  if (!a || !nm) {
    free(nm);
    free_value(&copy);
    return CT_ERR_NOMEM;
  }
  b->anchors[b->nanchors].name = nm;
  b->anchors[b->nanchors++].val = copy;
  return CT_OK;
}

static ct_status push(ct_json *seq, int with_keys, ct_json **slot, char ***kslot) {
  ct_json *it = realloc(seq->items, (seq->n + 1) * sizeof *it);
  if (!it) return CT_ERR_NOMEM;
  seq->items = it;
  memset(&it[seq->n], 0, sizeof *it);
  if (with_keys) {
    char **k = realloc(seq->keys, (seq->n + 1) * sizeof *k);
    if (!k) return CT_ERR_NOMEM;
    seq->keys = k;
    k[seq->n] = NULL;
    *kslot = &k[seq->n];
  }
  *slot = &it[seq->n++];
  return CT_OK;
}

static ct_status build_seq(builder *b, int depth, ct_json *dst) {
  ct_status st = CT_OK;
  yaml_event_t ev;
  while (!st && !(st = next(b, &ev))) {
    if (ev.type == YAML_SEQUENCE_END_EVENT) {
      yaml_event_delete(&ev);
      break;
    }
    ct_json *slot;
    char **unused;
    st = push(dst, 0, &slot, &unused);
    if (!st) st = build(b, &ev, depth + 1, slot);
    yaml_event_delete(&ev);
  }
  return st;
}

/* key (a scalar's text) -> value into the map; a repeated key keeps its first
 * place and takes the new value (a Python dict), with a warning. */
static ct_status map_put(builder *b, ct_json *map, const char *key, ct_json *val, int explicit) {
  for (size_t i = 0; i < map->n; i++)
    if (!strcmp(map->keys[i], key)) {
      if (!explicit) { /* merged (<<) keys never override */
        free_value(val);
        return CT_OK;
      }
      CT_WARN("%s: line %d: key '%s' is given again (line %d); the later value wins, as in PyYAML",
              b->name, val->line, key, map->items[i].line);
      free_value(&map->items[i]);
      map->items[i] = *val;
      memset(val, 0, sizeof *val);
      return CT_OK;
    }
  ct_json *slot;
  char **kslot;
  ct_status st = push(map, 1, &slot, &kslot);
  if (!st && !(*kslot = strdup(key))) st = CT_ERR_NOMEM;
  if (st) {
    if (map->n && !map->keys[map->n - 1]) map->n--;
    free_value(val);
    return st;
  }
  *slot = *val;
  memset(val, 0, sizeof *val);
  return CT_OK;
}

/* The value of a merge key: a map, or a sequence of maps. map_put skips keys
 * already there, so the map's own keys and earlier merged maps win. */
static ct_status merge(builder *b, ct_json *map, ct_json *src, const yaml_mark_t *m) {
  ct_status st = CT_OK;
  const size_t nsrc = src->type == CT_JSON_ARRAY ? src->n : 1;
  for (size_t s = 0; s < nsrc && !st; s++) {
    ct_json *from = src->type == CT_JSON_ARRAY ? &src->items[s] : src;
    if (from->type != CT_JSON_OBJECT)
      return at(b, m, CT_ERR_FORMAT, "a merge key (<<) takes a map or a list of maps", NULL);
    for (size_t i = 0; i < from->n && !st; i++) {
      ct_json v = from->items[i];
      memset(&from->items[i], 0, sizeof v);
      st = map_put(b, map, from->keys[i], &v, 0);
    }
  }
  return st;
}

static ct_status build_map(builder *b, int depth, ct_json *dst) {
  ct_status st = CT_OK;
  ct_json merges = {.type = CT_JSON_ARRAY}; /* values of << keys, merged at the end */
  yaml_event_t ev;
  yaml_mark_t merge_mark = {0};
  while (!st && !(st = next(b, &ev))) {
    if (ev.type == YAML_MAPPING_END_EVENT) {
      yaml_event_delete(&ev);
      break;
    }
    ct_json key = {0}, val = {0};
    st = build(b, &ev, depth + 1, &key);
    const yaml_mark_t km = ev.start_mark;
    const int is_merge = ev.type == YAML_SCALAR_EVENT && ev.data.scalar.plain_implicit &&
                         !ev.data.scalar.tag && !strcmp((char *)ev.data.scalar.value, "<<");
    yaml_event_delete(&ev);
    if (!st && key.type != CT_JSON_STRING && key.type != CT_JSON_NULL && key.type != CT_JSON_BOOL &&
        key.type != CT_JSON_NUMBER)
      st = at(b, &km, CT_ERR_UNSUPPORTED,
              "a key must be a scalar (a map or list as a key is not read)", NULL);
    if (!st) st = next(b, &ev);
    if (!st) {
      st = build(b, &ev, depth + 1, &val);
      yaml_event_delete(&ev);
    }
    if (!st && is_merge) {
      ct_json *slot;
      char **unused;
      merge_mark = km;
      st = push(&merges, 0, &slot, &unused);
      if (!st) *slot = val, memset(&val, 0, sizeof val);
    } else if (!st) {
      st = map_put(b, dst, key.str, &val, 1);
    }
    free_value(&key);
    free_value(&val);
  }
  for (size_t i = 0; i < merges.n && !st; i++) st = merge(b, dst, &merges.items[i], &merge_mark);
  free_value(&merges);
  return st;
}

static ct_status build(builder *b, yaml_event_t *ev, int depth, ct_json *dst) {
  ct_status st = CT_OK;
  const yaml_mark_t *m = &ev->start_mark;
  const char *anchor_name = NULL;
  const char *tag = NULL;
  memset(dst, 0, sizeof *dst);
  dst->line = (int)m->line + 1;
  dst->col = (int)m->column + 1;
  if (depth > CT_JSON_MAX_DEPTH)
    return at(b, m, CT_ERR_RANGE,
              "nested deeper than "
              "64"
              " levels",
              NULL);
  switch (ev->type) {
    case YAML_ALIAS_EVENT: {
      const char *name = (const char *)ev->data.alias.anchor;
      for (size_t i = b->nanchors; i-- > 0;)
        if (!strcmp(b->anchors[i].name, name)) {
          st = copy_value(b, m, dst, &b->anchors[i].val);
          dst->line = (int)m->line + 1;
          dst->col = (int)m->column + 1;
          return st;
        }
      return ct_errf(b->err, CT_ERR_FORMAT,
                     "line %zu, column %zu: alias *%s names no anchor (&%s) defined before it",
                     m->line + 1, m->column + 1, name, name);
    }
    case YAML_SCALAR_EVENT:
      if ((st = count_node(b, m))) return st;
      anchor_name = (const char *)ev->data.scalar.anchor;
      dst->str = memdup0((const char *)ev->data.scalar.value, ev->data.scalar.length);
      dst->len = ev->data.scalar.length;
      if (!dst->str) return CT_ERR_NOMEM;
      if (strlen(dst->str) != dst->len)
        return at(b, m, CT_ERR_FORMAT, "a scalar holds a NUL character", NULL);
      st = resolve(b, m, (const char *)ev->data.scalar.tag, ev->data.scalar.plain_implicit, dst);
      break;
    case YAML_SEQUENCE_START_EVENT:
      if ((st = count_node(b, m))) return st;
      anchor_name = (const char *)ev->data.sequence_start.anchor;
      tag = (const char *)ev->data.sequence_start.tag;
      if (tag && strcmp(tag, "!") && strcmp(tag, STD_TAG "seq"))
        return ct_errf(b->err, CT_ERR_UNSUPPORTED,
                       "line %zu, column %zu: tag %s on a list is not read", m->line + 1,
                       m->column + 1, tag);
      dst->type = CT_JSON_ARRAY;
      st = build_seq(b, depth, dst);
      break;
    case YAML_MAPPING_START_EVENT:
      if ((st = count_node(b, m))) return st;
      anchor_name = (const char *)ev->data.mapping_start.anchor;
      tag = (const char *)ev->data.mapping_start.tag;
      if (tag && strcmp(tag, "!") && strcmp(tag, STD_TAG "map"))
        return ct_errf(b->err, CT_ERR_UNSUPPORTED,
                       "line %zu, column %zu: tag %s on a map is not read", m->line + 1,
                       m->column + 1, tag);
      dst->type = CT_JSON_OBJECT;
      st = build_map(b, depth, dst);
      break;
    default:
      return at(b, m, CT_ERR_FORMAT, "unexpected YAML event", NULL);
  }
  if (!st && anchor_name) st = remember(b, anchor_name, m, dst);
  return st;
}

static ct_status parse_stream(builder *b, ct_json *root) {
  ct_status st;
  yaml_event_t ev;
  int docs = 0;
  root->type = CT_JSON_NULL;
  root->line = root->col = 1;
  if ((st = next(b, &ev))) return st; /* STREAM-START */
  yaml_event_delete(&ev);
  for (;;) {
    if ((st = next(b, &ev))) return st;
    if (ev.type == YAML_STREAM_END_EVENT) {
      yaml_event_delete(&ev);
      return CT_OK;
    }
    if (ev.type != YAML_DOCUMENT_START_EVENT) {
      yaml_event_delete(&ev);
      return ct_errf(b->err, CT_ERR_FORMAT, "unexpected YAML event at the top level");
    }
    const yaml_mark_t m = ev.start_mark;
    yaml_event_delete(&ev);
    if (++docs > 1)
      return at(b, &m, CT_ERR_FORMAT,
                "a second document (---): one document is read, as PyYAML's safe_load", NULL);
    if ((st = next(b, &ev))) return st;
    st = build(b, &ev, 1, root);
    yaml_event_delete(&ev);
    if (st) return st;
    if ((st = next(b, &ev))) return st; /* DOCUMENT-END */
    yaml_event_delete(&ev);
  }
}

static ct_status parse_named(const char *text, size_t len, const char *name, ct_json **out,
                             ct_err *err) {
  ct_status st = CT_OK;
  builder b = {.err = err, .name = name};
  ct_json *root = NULL;
  int inited = 0;
  if (!out || (!text && len)) {
    st = ct_errf(err, CT_ERR_INVALID, "ct_yaml_parse: NULL argument");
    goto out;
  }
  *out = NULL;
  root = calloc(1, sizeof *root);
  if (!root || !yaml_parser_initialize(&b.p)) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory reading YAML");
    goto out;
  }
  inited = 1;
  yaml_parser_set_input_string(&b.p, (const unsigned char *)(text ? text : ""), len);
  st = parse_stream(&b, root);
  if (st == CT_ERR_NOMEM) ct_errf(err, st, "out of memory reading YAML");
  if (!st) {
    *out = root;
    root = NULL;
  }
out:
  if (inited) yaml_parser_delete(&b.p);
  for (size_t i = 0; i < b.nanchors; i++) {
    free(b.anchors[i].name);
    free_value(&b.anchors[i].val);
  }
  free(b.anchors);
  ct_json_free(root);
  return st;
}

ct_status ct_yaml_parse(const char *text, size_t len, ct_json **out, ct_err *err) {
  return parse_named(text, len, "YAML", out, err);
}

ct_status ct_yaml_parse_file(const char *path, size_t max, ct_json **out, ct_err *err) {
  *out = NULL;
  char *text = NULL;
  size_t n = 0;
  ct_status st = ct_read_file(path, max, &text, &n, err);
  if (st) return st;
  st = parse_named(text, n, path, out, err);
  free(text);
  if (st) ct_err_prefix(err, "%s: ", path);
  return st;
}

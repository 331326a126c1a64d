/* test_parquet.c: suite `parquet` — the Parquet reader against files written
 * by DuckDB and parquet-wasm (arrow-rs) in tests/data/parquet (every value
 * compared with the writer's own JSON export; see tests/data/README.md), a
 * 500k-row file generated here (bounded memory, many pages), nested and
 * repeated columns, and malformed input: truncation, bad magic, footer length,
 * page header, unsupported codec, and a byte-mutation sweep (run under ASan). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/json.h"
#include "ctuner/parquet.h"
#include "harness.h"

/* ---- comparing with the writers' JSON lines ---- */

typedef struct cmp_ctx {
  ct_parquet *pq;
  const int *cols;
  int ncols;
  char **lines;
  size_t nlines;
  int64_t rows;
  int mismatches;
  int nulls, strings, empties, utf8;
} cmp_ctx;

static int value_matches(const ct_pq_value *v, const ct_json *j, int is_float) {
  switch (v->kind) {
    case CT_PQ_NULL:
      return j->type == CT_JSON_NULL;
    case CT_PQ_BOOL:
      return j->type == CT_JSON_BOOL && j->boolean == (int)v->i;
    case CT_PQ_INT:
      return j->type == CT_JSON_NUMBER && j->is_int && j->i64 == v->i;
    case CT_PQ_DOUBLE:
      if (j->type != CT_JSON_NUMBER) return 0;
      return is_float ? (float)j->num == (float)v->d : j->num == v->d;
    case CT_PQ_BYTES:
      return j->type == CT_JSON_STRING && j->len == v->len && !memcmp(j->str, v->s, v->len);
  }
  return 0;
}

static int cmp_row(void *ctx, int64_t row, const ct_pq_value *vals) {
  cmp_ctx *c = ctx;
  if (row != c->rows || (size_t)row >= c->nlines) {
    c->mismatches++;
    return 1;
  }
  c->rows++;
  ct_json *j = NULL;
  ct_err e = {0};
  if (ct_json_parse(c->lines[row], strlen(c->lines[row]), &j, &e)) {
    fprintf(stderr, "  JSON line %lld: %s\n", (long long)row, e.msg);
    c->mismatches++;
    return 1;
  }
  for (int k = 0; k < c->ncols; k++) {
    ct_pq_column_info ci;
    ct_parquet_column_info(c->pq, c->cols[k], &ci);
    const ct_json *jv = ct_json_get(j, ci.name);
    const ct_pq_value *v = &vals[k];
    if (!jv || !value_matches(v, jv, ci.is_float)) {
      if (c->mismatches++ < 5)
        fprintf(stderr, "  row %lld column %s: kind %d i=%lld d=%.17g s=%.*s vs JSON %s\n",
                (long long)row, ci.name, (int)v->kind, (long long)v->i, v->d,
                v->kind == CT_PQ_BYTES ? (int)v->len : 0, v->kind == CT_PQ_BYTES ? v->s : "",
                c->lines[row]);
    }
    if (v->kind == CT_PQ_NULL) c->nulls++;
    if (v->kind == CT_PQ_BYTES) {
      c->strings++;
      c->empties += v->len == 0;
      for (size_t i = 0; i < v->len; i++)
        if ((unsigned char)v->s[i] >= 0x80) {
          c->utf8++;
          break;
        }
    }
  }
  ct_json_free(j);
  return 0;
}

/* Split a JSON-lines file into lines (in place). */
static char **split_lines(char *text, size_t n, size_t *count) {
  size_t cap = 16, k = 0;
  char **v = malloc(cap * sizeof *v);
  char *p = text, *end = text + n;
  while (v && p < end) {
    char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) nl = end;
    *nl = 0;
    if (nl > p) {
      if (k == cap) {
        cap *= 2;
        char **nv = realloc(v, cap * sizeof *v);
        if (!nv) {
          free(v);
          return NULL;
        }
        v = nv;
      }
      v[k++] = p;
    }
    p = nl + 1;
  }
  *count = k;
  return v;
}

static const char *fixtures[] = {"duckdb_v1_none",
                                 "duckdb_v1_snappy",
                                 "duckdb_v1_gzip",
                                 "duckdb_v2_zstd",
                                 "duckdb_v2_snappy_nodict",
                                 "duckdb_v1_zstd_nodict",
                                 "duckdb_tiny",
                                 "pwasm_v1_none",
                                 "pwasm_v1_snappy_nodict",
                                 "pwasm_v2_gzip",
                                 "pwasm_v2_zstd_nodict",
                                 "pwasm_v2_none_nodict",
                                 "pwasm_v1_snappy_fallback",
                                 "pwasm_tiny"};

/* Reads fixture `name` (all columns, or cols) and compares with its JSON. */
static int check_fixture(const char *name, const int *cols, int ncols, cmp_ctx *out) {
  char path[512], jpath[512];
  snprintf(path, sizeof path, "%s", ct_test_data("parquet/"));
  snprintf(path + strlen(path), sizeof path - strlen(path), "%s.parquet", name);
  snprintf(jpath, sizeof jpath, "%.*s.json", (int)(strlen(path) - 8), path);
  size_t jn;
  char *json = (char *)ct_test_slurp(jpath, &jn);
  if (!json) {
    fprintf(stderr, "  %s: missing (run scripts/parquet_fixtures.sh)\n", jpath);
    return -1;
  }
  ct_parquet *pq = NULL;
  ct_err err = {0};
  int rc = -1;
  cmp_ctx c = {0};
  c.lines = split_lines(json, jn, &c.nlines);
  if (ct_parquet_open(path, &pq, &err)) {
    fprintf(stderr, "  %s: %s\n", name, err.msg);
    goto out;
  }
  int all[64];
  if (!cols) {
    ncols = ct_parquet_num_columns(pq);
    for (int i = 0; i < ncols && i < 64; i++) all[i] = i;
    cols = all;
  }
  c.pq = pq;
  c.cols = cols;
  c.ncols = ncols;
  if (ct_parquet_scan(pq, cols, ncols, cmp_row, &c, &err)) {
    fprintf(stderr, "  %s: %s\n", name, err.msg);
    goto out;
  }
  if ((size_t)c.rows != c.nlines || ct_parquet_num_rows(pq) != c.rows) {
    fprintf(stderr, "  %s: %lld rows read, %zu JSON lines, footer %lld\n", name, (long long)c.rows,
            c.nlines, (long long)ct_parquet_num_rows(pq));
    goto out;
  }
  if (c.mismatches) {
    fprintf(stderr, "  %s: %d mismatches\n", name, c.mismatches);
    goto out;
  }
  rc = 0;
out:
  if (out) *out = c;
  ct_parquet_free(pq);
  free(c.lines);
  free(json);
  return rc;
}

CT_TEST(parquet, fixtures_match_writer_json) {
  for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) {
    cmp_ctx c;
    int rc = check_fixture(fixtures[i], NULL, 0, &c);
    CHECKF(rc == 0, "%s", fixtures[i]);
    /* each file has nulls, strings (with empty and non-ASCII ones) */
    CHECKF(c.nulls > 0 && c.strings > 0 && c.empties > 0 && c.utf8 > 0, "%s: nulls %d strings %d",
           fixtures[i], c.nulls, c.strings);
  }
}

CT_TEST(parquet, schema_and_column_subset) {
  ct_parquet *pq = NULL;
  ct_err err = {0};
  char path[512];
  snprintf(path, sizeof path, "%s", ct_test_data("parquet/pwasm_v2_gzip.parquet"));
  REQUIRE(ct_parquet_open(path, &pq, &err) == CT_OK);
  CHECK(ct_parquet_num_rows(pq) == 64);
  CHECK(ct_parquet_num_row_groups(pq) == 3);
  CHECK(ct_parquet_num_columns(pq) == 8);
  CHECK(!strcmp(ct_parquet_column_name(pq, 0), "id"));
  CHECK(ct_parquet_column_name(pq, 8) == NULL);
  CHECK(ct_parquet_column_index(pq, "tag") == 7);
  CHECK(ct_parquet_column_index(pq, "nope") == -1);
  ct_pq_column_info ci;
  REQUIRE(ct_parquet_column_info(pq, 0, &ci) == CT_OK);
  CHECK(!strcmp(ci.physical, "INT64") && !ci.optional && ci.supported);
  REQUIRE(ct_parquet_column_info(pq, 5, &ci) == CT_OK);
  CHECK(!strcmp(ci.physical, "BYTE_ARRAY") && ci.optional && ci.is_string &&
        !strcmp(ci.logical, "STRING"));
  REQUIRE(ct_parquet_column_info(pq, 4, &ci) == CT_OK);
  CHECK(ci.is_float && !strcmp(ci.physical, "FLOAT"));
  CHECK(ct_parquet_column_info(pq, 99, &ci) == CT_ERR_RANGE);
  int bad = 42;
  CHECK(ct_parquet_scan(pq, &bad, 1, NULL, NULL, &err) != CT_OK);
  ct_parquet_free(pq);
  ct_parquet_free(NULL);
  /* a subset in another order, for both writers */
  int cols[2] = {5, 0};
  CHECK(check_fixture("pwasm_v2_gzip", cols, 2, NULL) == 0);
  CHECK(check_fixture("duckdb_v2_zstd", cols, 2, NULL) == 0);
  int one = 6;
  CHECK(check_fixture("pwasm_v2_zstd_nodict", &one, 1, NULL) == 0);
}

static int stop_after_5(void *ctx, int64_t row, const ct_pq_value *v) {
  (*(int *)ctx)++;
  return row == 4;
}

typedef struct count_src {
  const uint8_t *data;
  size_t max_n, calls;
} count_src;

static ct_status count_read(void *ctx, uint64_t off, void *buf, size_t n, ct_err *err) {
  count_src *s = ctx;
  memcpy(buf, s->data + off, n);
  if (n > s->max_n) s->max_n = n;
  s->calls++;
  return CT_OK;
}

CT_TEST(parquet, early_stop_mem_and_source) {
  size_t n;
  uint8_t *data = ct_test_slurp(ct_test_data("parquet/duckdb_v1_snappy.parquet"), &n);
  REQUIRE(data);
  ct_parquet *pq = NULL;
  ct_err err = {0};
  REQUIRE(ct_parquet_open_mem(data, n, &pq, &err) == CT_OK);
  int seen = 0;
  CHECK(ct_parquet_scan(pq, NULL, 0, stop_after_5, &seen, &err) == CT_OK);
  CHECK(seen == 5);
  ct_parquet_free(pq);
  count_src cs = {data, 0, 0};
  ct_pq_source src = {&cs, n, count_read};
  REQUIRE(ct_parquet_open_source(&src, "s3://bucket/x.parquet", &pq, &err) == CT_OK);
  seen = 0;
  CHECK(ct_parquet_scan(pq, NULL, 0, stop_after_5, &seen, &err) == CT_OK);
  CHECK(seen == 5 && cs.calls > 2 && cs.max_n < n);
  ct_parquet_free(pq);
  free(data);
}

/* ---- a small Parquet writer for generated files (Thrift compact by hand) ---- */

typedef struct wbuf {
  uint8_t *p;
  size_t n, cap;
} wbuf;

static void put(wbuf *b, const void *d, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 1024;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
}
static void put8(wbuf *b, uint8_t v) {
  put(b, &v, 1);
}
static void put32le(wbuf *b, uint32_t v) {
  uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  put(b, x, 4);
}
static void uv(wbuf *b, uint64_t v) {
  while (v >= 0x80) {
    put8(b, (uint8_t)(v | 0x80));
    v >>= 7;
  }
  put8(b, (uint8_t)v);
}
static void zz(wbuf *b, int64_t v) {
  uv(b, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
}
static void fld(wbuf *b, int *last, int id, int type) {
  int d = id - *last;
  if (d > 0 && d <= 15) {
    put8(b, (uint8_t)(d << 4 | type));
  } else {
    put8(b, (uint8_t)type);
    zz(b, id);
  }
  *last = id;
}
static void f_int(wbuf *b, int *last, int id, int type, int64_t v) {
  fld(b, last, id, type);
  zz(b, v);
}
static void f_bin(wbuf *b, int *last, int id, const char *s) {
  fld(b, last, id, 8);
  uv(b, strlen(s));
  put(b, s, strlen(s));
}
static void list_hdr(wbuf *b, size_t n, int et) {
  if (n < 15) {
    put8(b, (uint8_t)(n << 4 | (size_t)et));
  } else {
    put8(b, (uint8_t)(0xf0 | et));
    uv(b, n);
  }
}
/* An unknown field the reader must skip: a struct holding a list of structs,
 * a map of i32 -> list<double> and booleans. */
static void f_junk(wbuf *b, int *last, int id) {
  fld(b, last, id, 12);
  int l = 0;
  fld(b, &l, 1, 9);
  list_hdr(b, 2, 12);
  for (int i = 0; i < 2; i++) {
    int l2 = 0;
    f_bin(b, &l2, 1, "key");
    fld(b, &l2, 2, 1); /* bool true */
    put8(b, 0);
  }
  fld(b, &l, 2, 11);
  uv(b, 1);
  put8(b, 5 << 4 | 9);
  zz(b, 7);
  list_hdr(b, 1, 7);
  put(b, "\0\0\0\0\0\0\xf0\x3f", 8);
  fld(b, &l, 40, 2);
  put8(b, 0);
}

/* RLE/bit-packed hybrid: one bit-packed run of n values (padded to 8). */
static void rle_bitpacked(wbuf *b, const int *v, int n, int bw) {
  int groups = (n + 7) / 8;
  uv(b, (uint64_t)groups << 1 | 1);
  size_t nbytes = (size_t)groups * (size_t)bw, start = b->n;
  for (size_t i = 0; i < nbytes; i++) put8(b, 0);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < bw; k++)
      if (v[i] >> k & 1)
        b->p[start + (size_t)(i * bw + k) / 8] |= (uint8_t)(1u << ((i * bw + k) % 8));
}

typedef struct gen_opts {
  int rows, page_rows;
  int huge_page; /* first page of 'id' claims INT32_MAX bytes */
  int nested;    /* add a repeated leaf 'nums' (garbage data) and group 'st' with leaf 'a' */
} gen_opts;

typedef struct chunk_pos {
  int64_t off, size, nvals;
} chunk_pos;

static void page_header(wbuf *b, int64_t usize, int64_t csize, int nvals) {
  int l = 0;
  f_int(b, &l, 1, 5, 0);
  f_int(b, &l, 2, 5, usize);
  f_int(b, &l, 3, 5, csize);
  fld(b, &l, 5, 12);
  int l2 = 0;
  f_int(b, &l2, 1, 5, nvals);
  f_int(b, &l2, 2, 5, 0);
  f_int(b, &l2, 3, 5, 3);
  f_int(b, &l2, 4, 5, 3);
  put8(b, 0);
  f_junk(b, &l, 21);
  put8(b, 0);
}

/* Column k of the generated file, rows [r0, r1): levels + PLAIN values. */
static void page_body(wbuf *pb, int k, int r0, int r1) {
  int n = r1 - r0;
  int *lv = malloc((size_t)(n ? n : 1) * sizeof *lv);
  if (k == 1 || k == 3) { /* optional: definition levels */
    for (int i = 0; i < n; i++) {
      int r = r0 + i;
      lv[i] = k == 1 ? (r % 10 != 9) : r % 3; /* st.a: 0 st null, 1 a null, 2 value */
    }
    wbuf lb = {0};
    rle_bitpacked(&lb, lv, n, k == 1 ? 1 : 2);
    put32le(pb, (uint32_t)lb.n);
    put(pb, lb.p, lb.n);
    free(lb.p);
  }
  for (int i = 0; i < n; i++) {
    int r = r0 + i;
    if (k == 0) {
      uint64_t v = (uint64_t)r * 1000003u;
      put(pb, &v, 8);
    } else if (k == 1 && lv[i]) {
      char s[32];
      int len = snprintf(s, sizeof s, "r%d", r);
      put32le(pb, (uint32_t)len);
      put(pb, s, (size_t)len);
    } else if (k == 3 && lv[i] == 2) {
      put32le(pb, (uint32_t)(r * 3));
    }
  }
  free(lv);
}

static uint8_t *gen_file(const gen_opts *o, size_t *size) {
  wbuf b = {0};
  put(&b, "PAR1", 4);
  int ncol = o->nested ? 4 : 2;
  chunk_pos cp[4];
  for (int k = 0; k < ncol; k++) {
    cp[k].off = (int64_t)b.n;
    cp[k].nvals = o->rows;
    if (k == 2) { /* the repeated leaf: never read, so its bytes are junk */
      put(&b, "\xff\xff\xff\xff\x01\x02", 6);
    } else {
      for (int r0 = 0, pg = 0; r0 < o->rows; r0 += o->page_rows, pg++) {
        int r1 = r0 + o->page_rows < o->rows ? r0 + o->page_rows : o->rows;
        wbuf pb = {0};
        page_body(&pb, k, r0, r1);
        int64_t cs = (int64_t)pb.n;
        page_header(&b, cs, k == 0 && pg == 0 && o->huge_page ? INT32_MAX : cs, r1 - r0);
        put(&b, pb.p, pb.n);
        free(pb.p);
      }
    }
    cp[k].size = (int64_t)b.n - cp[k].off;
  }
  /* footer */
  size_t fstart = b.n;
  int l = 0;
  f_int(&b, &l, 1, 5, 1);
  fld(&b, &l, 2, 9);
  list_hdr(&b, o->nested ? 6 : 3, 12);
  struct {
    const char *name;
    int type, rep, nchild, conv;
  } els[6] = {{"schema", -1, -1, ncol == 4 ? 4 : 2, -1},
              {"id", 2, 0, 0, -1},
              {"name", 6, 1, 0, 0},
              {"nums", 1, 2, 0, -1},
              {"st", -1, 1, 1, -1},
              {"a", 1, 1, 0, -1}};
  for (int i = 0; i < (o->nested ? 6 : 3); i++) {
    int l2 = 0;
    if (els[i].type >= 0) f_int(&b, &l2, 1, 5, els[i].type);
    if (els[i].rep >= 0) f_int(&b, &l2, 3, 5, els[i].rep);
    f_bin(&b, &l2, 4, els[i].name);
    if (els[i].nchild) f_int(&b, &l2, 5, 5, els[i].nchild);
    if (els[i].conv >= 0) f_int(&b, &l2, 6, 5, els[i].conv);
    put8(&b, 0);
  }
  f_int(&b, &l, 3, 6, o->rows);
  fld(&b, &l, 4, 9);
  list_hdr(&b, 1, 12);
  {
    int lr = 0;
    fld(&b, &lr, 1, 9);
    list_hdr(&b, (size_t)ncol, 12);
    const int types[4] = {2, 6, 1, 1};
    for (int k = 0; k < ncol; k++) {
      int lc = 0;
      f_int(&b, &lc, 2, 6, cp[k].off);
      fld(&b, &lc, 3, 12);
      int lm = 0;
      f_int(&b, &lm, 1, 5, types[k]);
      fld(&b, &lm, 2, 9);
      list_hdr(&b, 1, 5);
      zz(&b, 0);
      fld(&b, &lm, 3, 9);
      list_hdr(&b, 1, 8);
      uv(&b, 1);
      put8(&b, 'x');
      f_int(&b, &lm, 4, 5, 0);
      f_int(&b, &lm, 5, 6, cp[k].nvals);
      f_int(&b, &lm, 6, 6, cp[k].size);
      f_int(&b, &lm, 7, 6, cp[k].size);
      f_int(&b, &lm, 9, 6, cp[k].off);
      f_junk(&b, &lm, 77);
      put8(&b, 0);
      put8(&b, 0);
    }
    f_int(&b, &lr, 2, 6, 0);
    f_int(&b, &lr, 3, 6, o->rows);
    put8(&b, 0);
  }
  f_junk(&b, &l, 30);
  put8(&b, 0);
  put32le(&b, (uint32_t)(b.n - fstart));
  put(&b, "PAR1", 4);
  *size = b.n;
  return b.p;
}

typedef struct gen_check {
  int64_t rows;
  int bad;
  int nested;
} gen_check;

static int gen_row(void *ctx, int64_t row, const ct_pq_value *v) {
  gen_check *g = ctx;
  char s[32];
  int len = snprintf(s, sizeof s, "r%lld", (long long)row);
  int ok = v[0].kind == CT_PQ_INT && v[0].i == row * 1000003;
  if (row % 10 == 9)
    ok = ok && v[1].kind == CT_PQ_NULL;
  else
    ok = ok && v[1].kind == CT_PQ_BYTES && v[1].len == (size_t)len &&
         !memcmp(v[1].s, s, (size_t)len);
  if (g->nested)
    ok = ok &&
         (row % 3 == 2 ? v[2].kind == CT_PQ_INT && v[2].i == row * 3 : v[2].kind == CT_PQ_NULL);
  if (!ok && g->bad++ < 3) fprintf(stderr, "  generated file: row %lld differs\n", (long long)row);
  g->rows++;
  return 0;
}

CT_TEST(parquet, large_file_bounded_memory) {
  gen_opts o = {500000, 60000, 0, 0};
  size_t n;
  uint8_t *data = gen_file(&o, &n);
  char path[512];
  snprintf(path, sizeof path, "%s/big.parquet", ct_test_tmpdir());
  FILE *f = fopen(path, "wb");
  REQUIRE(f && fwrite(data, 1, n, f) == n);
  fclose(f);
  free(data);
  ct_parquet *pq = NULL;
  ct_err err = {0};
  REQUIRE(ct_parquet_open(path, &pq, &err) == CT_OK);
  CHECK(ct_parquet_num_rows(pq) == 500000 && ct_parquet_num_columns(pq) == 2);
  ct_mem_stats s0, s1;
  ct_mem_get_stats(&s0);
  ct_mem_reset_peak();
  gen_check g = {0};
  CHECKF(ct_parquet_scan(pq, NULL, 0, gen_row, &g, &err) == CT_OK, "%s", err.msg);
  ct_mem_get_stats(&s1);
  CHECK(g.rows == 500000 && g.bad == 0);
  size_t peak = s1.peak[CT_MEM_BUFFERS] - s0.current[CT_MEM_BUFFERS];
  CHECKF(peak < n / 5 && peak < (3u << 20), "peak buffers %zu bytes for a %zu-byte file", peak, n);
  CHECK(s1.current[CT_MEM_BUFFERS] == s0.current[CT_MEM_BUFFERS]); /* all freed */
  if (getenv("CT_PQ_VERBOSE"))
    fprintf(stderr, "  peak buffers %zu bytes, file %zu bytes\n", peak, n);
  ct_parquet_free(pq);
  remove(path);
}

CT_TEST(parquet, nested_and_repeated_columns) {
  gen_opts o = {1000, 300, 0, 1};
  size_t n;
  uint8_t *data = gen_file(&o, &n);
  ct_parquet *pq = NULL;
  ct_err err = {0};
  REQUIRE(ct_parquet_open_mem(data, n, &pq, &err) == CT_OK);
  CHECK(ct_parquet_num_columns(pq) == 4);
  CHECK(ct_parquet_column_index(pq, "st.a") == 3);
  ct_pq_column_info ci;
  ct_parquet_column_info(pq, 2, &ci);
  CHECK(!ci.supported && !strcmp(ci.name, "nums"));
  ct_parquet_column_info(pq, 3, &ci);
  CHECK(ci.supported && ci.optional);
  int cols[3] = {0, 1, 3};
  gen_check g = {0, 0, 1};
  CHECKF(ct_parquet_scan(pq, cols, 3, gen_row, &g, &err) == CT_OK, "%s", err.msg);
  CHECK(g.rows == 1000 && g.bad == 0);
  int rep = 2;
  CHECK(ct_parquet_scan(pq, &rep, 1, gen_row, &g, &err) == CT_ERR_UNSUPPORTED);
  CHECKF(strstr(err.msg, "column 'nums' is repeated") != NULL, "%s", err.msg);
  ct_parquet_free(pq);
  free(data);
}

static int count_rows(void *ctx, int64_t row, const ct_pq_value *v) {
  (*(int64_t *)ctx)++;
  return 0;
}

/* Open + scan all supported columns; the status, message in err. */
static ct_status open_scan(const uint8_t *d, size_t n, ct_err *err) {
  uint8_t *copy = malloc(n ? n : 1);
  memcpy(copy, d, n);
  ct_parquet *pq = NULL;
  ct_status st = ct_parquet_open_mem(copy, n, &pq, err);
  if (!st) {
    int cols[64], nc = 0;
    for (int i = 0; i < ct_parquet_num_columns(pq) && nc < 64; i++) {
      ct_pq_column_info ci;
      ct_parquet_column_info(pq, i, &ci);
      if (ci.supported) cols[nc++] = i;
    }
    int64_t rows = 0;
    st = ct_parquet_scan(pq, cols, nc, count_rows, &rows, err);
  }
  ct_parquet_free(pq);
  free(copy);
  return st;
}

CT_TEST(parquet, malformed_files) {
  size_t n;
  uint8_t *d = ct_test_slurp(ct_test_data("parquet/duckdb_v1_gzip.parquet"), &n);
  REQUIRE(d && n > 100);
  ct_err err = {0};
  CHECK(open_scan(d, n, &err) == CT_OK);
  /* truncated: every length must fail cleanly with a message */
  for (size_t cut = 0; cut < n; cut += (cut < 64 ? 1 : 37)) {
    memset(&err, 0, sizeof err);
    ct_status st = open_scan(d, cut, &err);
    CHECKF(st == CT_ERR_FORMAT && err.msg[0], "cut at %zu: %s", cut, err.msg);
  }
  CHECK(open_scan(d, 5, &err) == CT_ERR_FORMAT && strstr(err.msg, "too short"));
  /* truncated by a few bytes: the tail magic is gone */
  CHECK(open_scan(d, n - 3, &err) == CT_ERR_FORMAT && strstr(err.msg, "PAR1"));
  /* bad magic */
  uint8_t *m = malloc(n);
  memcpy(m, d, n);
  m[0] = 'X';
  CHECK(open_scan(m, n, &err) == CT_ERR_FORMAT && strstr(err.msg, "magic at the start"));
  /* corrupted footer length */
  memcpy(m, d, n);
  m[n - 8] = 0xf0;
  m[n - 5] = 0x7f;
  CHECK(open_scan(m, n, &err) == CT_ERR_FORMAT && strstr(err.msg, "footer length"));
  memcpy(m, d, n);
  m[n - 8] = (uint8_t)(m[n - 8] - 1); /* footer one byte short: misparse */
  CHECK(open_scan(m, n, &err) == CT_ERR_FORMAT);
  free(m);
  free(d);
  /* a page header claiming more bytes than the chunk holds */
  gen_opts o = {100, 40, 1, 0};
  uint8_t *g = gen_file(&o, &n);
  ct_status st = open_scan(g, n, &err);
  CHECKF(
      st == CT_ERR_FORMAT &&
          strstr(err.msg,
                 "column 'id' row group 0: page 0 header claims 2147483647 bytes, more than the"),
      "%s", err.msg);
  free(g);
  /* garbage page header bytes */
  o.huge_page = 0;
  g = gen_file(&o, &n);
  memset(g + 4, 0xff, 12);
  st = open_scan(g, n, &err);
  CHECKF(st == CT_ERR_FORMAT && strstr(err.msg, "column 'id' row group 0: page 0 header"), "%s",
         err.msg);
  free(g);
  /* unsupported codec, written by parquet-wasm */
  ct_parquet *pq = NULL;
  REQUIRE(ct_parquet_open(ct_test_data("parquet/pwasm_lz4raw.parquet"), &pq, &err) == CT_OK);
  int64_t rows = 0;
  st = ct_parquet_scan(pq, NULL, 0, count_rows, &rows, &err);
  CHECKF(
      st == CT_ERR_UNSUPPORTED && strstr(err.msg, "column 'id' row group 0: compression LZ4_RAW"),
      "%s", err.msg);
  ct_parquet_free(pq);
  /* not a file */
  CHECK(ct_parquet_open("/nonexistent/x.parquet", &pq, &err) == CT_ERR_NOT_FOUND && !pq);
}

/* Every byte of small files, XOR-ed with a few patterns: no crash, no leak, a
 * message on every failure (ASan/UBSan builds make this a memory-safety test). */
CT_TEST(parquet, mutation_sweep) {
  const char *names[] = {"parquet/duckdb_tiny.parquet", "parquet/pwasm_tiny.parquet"};
  int failures = 0, ok = 0;
  for (int f = 0; f < 2; f++) {
    size_t n;
    uint8_t *d = ct_test_slurp(ct_test_data(names[f]), &n);
    REQUIRE(d);
    uint8_t *m = malloc(n);
    const uint8_t pats[3] = {0x01, 0x80, 0xff};
    for (size_t i = 0; i < n; i++) {
      for (int p = 0; p < 3; p++) {
        memcpy(m, d, n);
        m[i] ^= pats[p];
        ct_err err = {0};
        ct_status st = open_scan(m, n, &err);
        if (st == CT_OK) {
          ok++;
        } else if (!err.msg[0] || (st != CT_ERR_FORMAT && st != CT_ERR_UNSUPPORTED)) {
          if (failures++ < 3)
            fprintf(stderr, "  %s byte %zu ^%02x: %s (%s)\n", names[f], i, pats[p],
                    ct_status_name(st), err.msg);
        }
      }
    }
    free(m);
    free(d);
  }
  CHECK(failures == 0);
  CHECK(ok > 0);
}

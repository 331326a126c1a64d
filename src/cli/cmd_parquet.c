/* `ctuner dataset parquet FILE`: prints the rows of a Parquet file as JSON
 * lines (column name -> value, null for nulls) through the library's own
 * reader (src/data/parquet.c), or with --schema its columns, types and row
 * count. Used by tests/parquet_interop.sh to compare with other writers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "ctuner/parquet.h"

void ct_cmd_dataset_parquet_help(FILE *f) {
  fprintf(f,
          "usage: ctuner dataset parquet FILE [--columns a,b] [--limit N] [--schema]\n"
          "\n"
          "Prints one JSON object per row of a Parquet file: column name -> value\n"
          "(null for nulls; BYTE_ARRAY values as strings). --columns selects and orders\n"
          "columns (default: all flat columns), --limit stops after N rows. --schema\n"
          "prints one JSON line with the row count, row groups and each column's name,\n"
          "physical and logical type and nullability instead. See docs/parquet.md.\n");
}

typedef struct print_ctx {
  int n;
  const char **names;
  const int *is_float;
  long limit;
  long done;
  char *sbuf;
  size_t scap;
} print_ctx;

/* Shortest %g form that reads back as the same double (or float). */
static void print_num(double d, int is_float) {
  char b[40];
  if (d != d || d - d != 0) { /* NaN, Inf: not JSON */
    fputs("null", stdout);
    return;
  }
  for (int prec = is_float ? 6 : 15; prec <= 17; prec++) {
    snprintf(b, sizeof b, "%.*g", prec, d);
    double back = strtod(b, NULL);
    if (is_float ? (float)back == (float)d : back == d) break;
  }
  /* keep it a JSON number that reads as floating point */
  fputs(b, stdout);
}

static int valid_utf8(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    size_t k;
    if (c == 0) return 0;
    if (c < 0x80)
      k = 0;
    else if ((c & 0xe0) == 0xc0 && c >= 0xc2)
      k = 1;
    else if ((c & 0xf0) == 0xe0)
      k = 2;
    else if ((c & 0xf8) == 0xf0 && c <= 0xf4)
      k = 3;
    else
      return 0;
    if (k > n - i - 1) return 0;
    for (size_t j = 1; j <= k; j++)
      if ((s[i + j] & 0xc0) != 0x80) return 0;
    i += k + 1;
  }
  return 1;
}

/* Strings via ct_cli_json_str; bytes that are not NUL-free UTF-8 are written
 * with each invalid byte as \u00XX (Latin-1), so the line stays valid JSON. */
static int print_bytes(print_ctx *p, const char *s, size_t len) {
  if (valid_utf8((const unsigned char *)s, len)) {
    if (len + 1 > p->scap) {
      char *nb = realloc(p->sbuf, len + 1);
      if (!nb) return -1;
      p->sbuf = nb;
      p->scap = len + 1;
    }
    memcpy(p->sbuf, s, len);
    p->sbuf[len] = 0;
    ct_cli_json_str(stdout, p->sbuf);
    return 0;
  }
  putchar('"');
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\')
      printf("\\%c", c);
    else if (c < 0x20 || c >= 0x80)
      printf("\\u%04x", c);
    else
      putchar(c);
  }
  putchar('"');
  return 0;
}

static int print_row(void *ctx, int64_t row, const ct_pq_value *v) {
  print_ctx *p = ctx;
  if (p->limit >= 0 && p->done >= p->limit) return 1;
  putchar('{');
  for (int k = 0; k < p->n; k++) {
    if (k) putchar(',');
    ct_cli_json_str(stdout, p->names[k]);
    putchar(':');
    switch (v[k].kind) {
      case CT_PQ_NULL:
        fputs("null", stdout);
        break;
      case CT_PQ_BOOL:
        fputs(v[k].i ? "true" : "false", stdout);
        break;
      case CT_PQ_INT:
        printf("%lld", (long long)v[k].i);
        break;
      case CT_PQ_DOUBLE:
        print_num(v[k].d, p->is_float[k]);
        break;
      case CT_PQ_BYTES:
        if (print_bytes(p, v[k].s, v[k].len)) return 1;
        break;
    }
  }
  fputs("}\n", stdout);
  p->done++;
  return 0;
}

static int print_schema(const ct_parquet *pq) {
  printf("{\"rows\":%lld,\"row_groups\":%d,\"columns\":[", (long long)ct_parquet_num_rows(pq),
         ct_parquet_num_row_groups(pq));
  for (int i = 0; i < ct_parquet_num_columns(pq); i++) {
    ct_pq_column_info ci;
    ct_parquet_column_info(pq, i, &ci);
    printf("%s{\"name\":", i ? "," : "");
    ct_cli_json_str(stdout, ci.name);
    printf(",\"physical\":\"%s\"", ci.physical);
    if (ci.type_length) printf(",\"length\":%d", ci.type_length);
    if (ci.logical[0]) printf(",\"logical\":\"%s\"", ci.logical);
    printf(",\"nullable\":%s", ci.optional ? "true" : "false");
    if (!ci.supported) printf(",\"supported\":false");
    putchar('}');
  }
  printf("]}\n");
  return 0;
}

int ct_cmd_dataset_parquet(int argc, char **argv) {
  const char *file = NULL, *cols_arg = NULL, *v;
  long limit = -1;
  int schema = 0, rc = 1;
  ct_parquet *pq = NULL;
  int *cols = NULL;
  const char **names = NULL;
  int *is_float = NULL;
  char *list = NULL;
  print_ctx p = {0};
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_dataset_parquet_help(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--schema")) {
      schema = 1;
    } else if ((r = ct_cli_opt(argc, argv, &i, "columns", &cols_arg))) {
      if (r < 0) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "limit", &v))) {
      if (r < 0 || ct_cli_int("limit", v, 0, 0x7fffffffffffffffL, &limit)) return 2;
    } else if (argv[i][0] == '-' || file) {
      fprintf(stderr, "ctuner dataset parquet: unexpected argument '%s'\n", argv[i]);
      ct_cmd_dataset_parquet_help(stderr);
      return 2;
    } else {
      file = argv[i];
    }
  }
  if (!file) {
    fprintf(stderr, "ctuner dataset parquet: FILE is required\n");
    ct_cmd_dataset_parquet_help(stderr);
    return 2;
  }
  ct_err err = {0};
  if (ct_parquet_open(file, &pq, &err)) {
    fprintf(stderr, "ctuner dataset parquet: %s\n", err.msg);
    goto out;
  }
  if (schema) {
    rc = print_schema(pq);
    goto out;
  }
  int nc = ct_parquet_num_columns(pq), n = 0;
  cols = calloc((size_t)nc + 1, sizeof *cols);
  names = calloc((size_t)nc + 1, sizeof *names);
  is_float = calloc((size_t)nc + 1, sizeof *is_float);
  if (!cols || !names || !is_float) {
    fprintf(stderr, "ctuner dataset parquet: out of memory\n");
    goto out;
  }
  if (cols_arg) {
    list = strdup(cols_arg);
    if (!list) goto out;
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
      int c = ct_parquet_column_index(pq, tok);
      if (c < 0) {
        fprintf(stderr, "ctuner dataset parquet: %s has no column '%s' (columns:", file, tok);
        for (int i = 0; i < nc; i++) fprintf(stderr, " %s", ct_parquet_column_name(pq, i));
        fprintf(stderr, ")\n");
        goto out;
      }
      if (n == nc) {
        fprintf(stderr, "ctuner dataset parquet: --columns lists more columns than the file has\n");
        goto out;
      }
      cols[n++] = c;
    }
  } else {
    for (int i = 0; i < nc; i++) {
      ct_pq_column_info ci;
      ct_parquet_column_info(pq, i, &ci);
      if (ci.supported) cols[n++] = i;
    }
  }
  for (int k = 0; k < n; k++) {
    ct_pq_column_info ci;
    ct_parquet_column_info(pq, cols[k], &ci);
    names[k] = ci.name;
    is_float[k] = ci.is_float;
  }
  p.n = n;
  p.names = names;
  p.is_float = is_float;
  p.limit = limit;
  if (ct_parquet_scan(pq, cols, n, print_row, &p, &err)) {
    fflush(stdout);
    fprintf(stderr, "ctuner dataset parquet: %s\n", err.msg);
    goto out;
  }
  rc = 0;
out:
  if (fflush(stdout) != 0 && rc == 0) rc = 1;
  free(p.sbuf);
  free(list);
  free(cols);
  free(names);
  free(is_float);
  ct_parquet_free(pq);
  return rc;
}

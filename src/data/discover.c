/* discover.c: the images of one dataset, their captions and sizes.
 *
 * Every read goes through the dataset's ct_storage (a local directory or an
 * S3 bucket, ctuner/storage.h): one code path for both. Reads are batched
 * with ct_storage_get_many (S3 runs a batch over its connection pool): the
 * first 64 KiB of each image (more when the header needs it) and the .txt
 * captions, a chunk of items per call.
 *
 * Two metadata backends fill the same list of items:
 *   discovery  the image directory is listed (recursively, sorted); the
 *              files are split into contiguous shares, one per rank, and each
 *              rank reads its share's image headers (no pixel decoding) and
 *              captions with a thread per core; the results are all-gathered
 *              so every rank holds the same list.
 *   parquet    a .parquet (own reader, ctuner/parquet.h) or .jsonl table gives
 *              file names, captions and sizes; rows pointing outside the
 *              directory, duplicates and missing files are skipped and counted.
 * With preserve_data_backend_cache and SimpleTuner's
 * aspect_ratio_bucket_metadata_<id>.json present, sizes come from it instead
 * of the headers. Bad items (unreadable, no caption, ...) are skipped and
 * counted in ct_data_stats, never fatal.
 */
#include "data/discover.h"

#include <dirent.h>
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "ctuner/comm.h"
#include "ctuner/fs.h"
#include "ctuner/image.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/parquet.h"

static int is_image_name(const char *n) {
  static const char *const ext[] = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", NULL};
  const char *dot = strrchr(n, '.');
  if (!dot) return 0;
  for (int i = 0; ext[i]; i++)
    if (!strcasecmp(dot, ext[i])) return 1;
  return 0;
}

/* A listed key below the image directory: no hidden file or directory, an
 * image extension. */
static int wanted(const char *rel) {
  for (const char *p = rel; p; p = strchr(p, '/')) {
    if (*p == '/') p++;
    if (*p == '.') return 0;
  }
  return is_image_name(rel);
}

/* The local fast path (measured 2.4x faster on 10,000 JPEGs than the
 * generic one through the local storage backend, whose listing stats every
 * file and whose reads go through stdio): readdir with d_type, and headers
 * by ct_image_probe_info. Tests set it to 1 to run the generic path (what S3
 * datasets use) on local directories. */
int ct_disc_force_generic = 0;

typedef struct strlist {
  char **s;
  size_t n, cap;
} strlist;

static int sl_push(strlist *l, char *s) {
  if (!s) return -1;
  if (l->n == l->cap) {
    size_t nc = l->cap ? l->cap * 2 : 256;
    char **np = realloc(l->s, nc * sizeof *np);
    if (!np) {
      free(s);
      return -1;
    }
    l->s = np, l->cap = nc;
  }
  l->s[l->n++] = s;
  return 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Relative paths of the images under dir/sub, recursively (local fast path). */
static ct_status list_rel(const char *dir, const char *sub, strlist *out, int depth, ct_err *err) {
  char path[4096];
  if (ct_pathf(path, sizeof path, "%s%s%s", dir, *sub ? "/" : "", sub))
    return ct_errf(err, CT_ERR_RANGE, "path too long under %s", dir);
  DIR *d = opendir(path);
  if (!d) return ct_errf(err, CT_ERR_IO, "cannot open directory %s: %s", path, strerror(errno));
  struct dirent *e;
  ct_status st = CT_OK;
  while ((e = readdir(d)) && !st) {
    if (e->d_name[0] == '.') continue;
    char rel[4096];
    if (ct_pathf(rel, sizeof rel, "%s%s%s", sub, *sub ? "/" : "", e->d_name)) continue;
    int isdir = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN || e->d_type == DT_LNK) {
      char full[8192];
      struct stat sb;
      snprintf(full, sizeof full, "%s/%s", dir, rel);
      isdir = stat(full, &sb) == 0 && S_ISDIR(sb.st_mode);
    }
    if (isdir) {
      if (depth < 64) st = list_rel(dir, rel, out, depth + 1, err);
    } else if (is_image_name(e->d_name)) {
      if (sl_push(out, strdup(rel)))
        st = ct_errf(err, CT_ERR_NOMEM, "out of memory listing %s", dir);
    }
  }
  closedir(d);
  return st;
}

/* dir/rel (dir "" : rel) into buf; -1 if it does not fit. */
static int join_key(char *buf, size_t n, const char *dir, const char *rel) {
  return ct_pathf(buf, n, "%s%s%s", dir, *dir ? "/" : "", rel);
}

/* Caption lines: trimmed, non-empty. Returns the count (0: none). */
static int split_lines(const char *text, char ***lines) {
  int n = 0, cap = 4;
  char **l = malloc((size_t)cap * sizeof *l);
  char *copy = strdup(text);
  if (!l || !copy) {
    free(l);
    free(copy);
    *lines = NULL;
    return 0;
  }
  char *save = NULL;
  for (char *p = strtok_r(copy, "\r\n", &save); p; p = strtok_r(NULL, "\r\n", &save)) {
    while (*p == ' ' || *p == '\t') p++;
    size_t len = strlen(p);
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) p[--len] = 0;
    if (!len) continue;
    if (n == cap) {
      char **nl = realloc(l, (size_t)(cap *= 2) * sizeof *nl);
      if (!nl) break;
      l = nl;
    }
    if ((l[n] = strdup(p))) n++;
  }
  free(copy);
  *lines = l;
  return n;
}

/* SimpleTuner's filename strategy: the stem with '_' and '-' as spaces. */
static char *caption_from_name(const char *rel) {
  const char *b = strrchr(rel, '/');
  char *s = strdup(b ? b + 1 : rel);
  if (!s) return NULL;
  char *dot = strrchr(s, '.');
  if (dot) *dot = 0;
  for (char *p = s; *p; p++)
    if (*p == '_' || *p == '-') *p = ' ';
  return s;
}

/* The caption text of an item by strategy, or NULL (counted as no_caption);
 * textfile: the fetched .txt (taken over). */
static char *caption_text(const ct_ds_config *c, const char *rel, const char *table_caption,
                          char **txt) {
  switch (c->caption_strategy) {
    case CT_CAP_FILENAME:
      return caption_from_name(rel);
    case CT_CAP_INSTANCEPROMPT:
      return strdup(c->instance_prompt);
    case CT_CAP_PARQUET:
      return table_caption && *table_caption ? strdup(table_caption) : NULL;
    case CT_CAP_TEXTFILE: {
      char *t = *txt;
      *txt = NULL;
      return t;
    }
  }
  return NULL;
}

/* The .txt key of an image key. */
static int caption_key(char *buf, size_t n, const char *key) {
  if (ct_pathf(buf, n, "%s", key)) return -1;
  char *dot = strrchr(buf, '.'), *slash = strrchr(buf, '/');
  if (dot && (!slash || dot > slash)) *dot = 0;
  size_t l = strlen(buf);
  if (l + 5 > n) return -1;
  memcpy(buf + l, ".txt", 5);
  return 0;
}

/* ---- per-item results exchanged between ranks ----
 * record: int32 w, h, reason; uint32 caption bytes; caption text. */

static void put32(char **p, uint32_t v) {
  memcpy(*p, &v, 4);
  *p += 4;
}
static uint32_t get32(const char **p) {
  uint32_t v;
  memcpy(&v, *p, 4);
  *p += 4;
  return v;
}

void ct_disc_free(ct_disc *d) {
  if (!d) return;
  for (size_t i = 0; i < d->n; i++) {
    free(d->it[i].rel);
    free(d->it[i].caption);
  }
  free(d->it);
  memset(d, 0, sizeof *d);
}

ct_status ct_ds_list_dir(const char *dir, ct_ds_listing *out, ct_err *err) {
  memset(out, 0, sizeof *out);
  ct_ds_config c;
  memset(&c, 0, sizeof c);
  c.id = "bench";
  c.type = "local";
  c.instance_data_dir = (char *)dir;
  c.caption_strategy = CT_CAP_TEXTFILE;
  ct_storage *sto = NULL;
  ct_disc d = {0};
  ct_status st = ct_ds_open_storage(&c, &sto, err);
  if (!st) st = ct_discover(&c, sto, "", dir, NULL, NULL, &d, err);
  if (!st && d.n && !(out->rel = calloc(d.n, sizeof *out->rel)))
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; !st && i < d.n; i++) {
    out->rel[i] = d.it[i].rel; /* moved: ct_disc_free frees what is left */
    d.it[i].rel = NULL;
    out->bad += d.it[i].why != CT_DISC_OK;
  }
  if (!st) out->n = d.n;
  ct_disc_free(&d);
  ct_storage_free(sto);
  if (st) ct_ds_listing_free(out);
  return st;
}

void ct_ds_listing_free(ct_ds_listing *l) {
  if (!l) return;
  for (size_t i = 0; i < l->n; i++) free(l->rel[i]);
  free(l->rel);
  memset(l, 0, sizeof *l);
}

static ct_status add_item(ct_disc *d, char *rel, int w, int h, char *caption) {
  if (d->n == d->cap) {
    size_t nc = d->cap ? d->cap * 2 : 256;
    ct_disc_item *ni = realloc(d->it, nc * sizeof *ni);
    if (!ni) {
      free(rel);
      free(caption);
      return CT_ERR_NOMEM;
    }
    d->it = ni, d->cap = nc;
  }
  d->it[d->n++] = (ct_disc_item){rel, w, h, caption, 0};
  return CT_OK;
}

/* Rows of a parquet/JSONL table. */
typedef struct table_ctx {
  ct_disc *d;
  const ct_ds_config *c;
  int cf, cc, cfc, cw, ch; /* column positions in the scan, -1 absent */
  ct_status st;
} table_ctx;

static char *val_str(const ct_pq_value *v) {
  if (!v || v->kind != CT_PQ_BYTES) return NULL;
  char *s = malloc(v->len + 1);
  if (!s) return NULL;
  memcpy(s, v->s, v->len);
  s[v->len] = 0;
  return s;
}
static int val_int(const ct_pq_value *v) {
  if (!v) return 0;
  if (v->kind == CT_PQ_INT) return v->i > 0 && v->i < 1 << 30 ? (int)v->i : 0;
  if (v->kind == CT_PQ_DOUBLE) return v->d > 0 && v->d < 1e9 ? (int)v->d : 0;
  return 0;
}

static ct_status table_row(table_ctx *t, char *name, char *cap, char *fallback, int w, int h) {
  const ct_ds_config *c = t->c;
  if (!name || !*name) {
    free(name);
    free(cap);
    free(fallback);
    t->d->metadata_missing++;
    return CT_OK;
  }
  if ((!cap || !*cap) && fallback) {
    free(cap);
    cap = fallback;
    fallback = NULL;
  }
  free(fallback);
  if (!c->parquet.identifier_includes_extension) { /* SimpleTuner assumes .png */
    size_t l = strlen(name);
    char *n2 = realloc(name, l + 5);
    if (!n2) {
      free(name);
      free(cap);
      return CT_ERR_NOMEM;
    }
    name = n2;
    memcpy(name + l, ".png", 5);
  }
  return add_item(t->d, name, w, h, cap) ? CT_ERR_NOMEM : CT_OK;
}

static int pq_row(void *ctx, int64_t row, const ct_pq_value *v) {
  table_ctx *t = ctx;
  (void)row;
  char *name = val_str(&v[t->cf]);
  char *cap = t->cc >= 0 ? val_str(&v[t->cc]) : NULL;
  char *fb = t->cfc >= 0 ? val_str(&v[t->cfc]) : NULL;
  int w = t->cw >= 0 ? val_int(&v[t->cw]) : 0, h = t->ch >= 0 ? val_int(&v[t->ch]) : 0;
  t->st = table_row(t, name, cap, fb, w, h);
  return t->st != CT_OK;
}

/* A table: a local file is mapped by the reader; an object is fetched whole
 * (at most TABLE_MAX bytes) and read from memory. */
#define TABLE_MAX ((size_t)4 << 30)

static ct_status read_parquet(const char *path, const char *data, size_t len, const ct_ds_config *c,
                              ct_disc *d, ct_err *err) {
  ct_parquet *pq = NULL;
  ct_status st = data ? ct_parquet_open_mem(data, len, &pq, err) : ct_parquet_open(path, &pq, err);
  if (st) {
    if (data) ct_err_prefix(err, "%s: ", path);
    return st;
  }
  const char *names[5] = {c->parquet.filename_column, c->parquet.caption_column,
                          c->parquet.fallback_caption_column, c->parquet.width_column,
                          c->parquet.height_column};
  int cols[5], n = 0, pos[5];
  for (int i = 0; i < 5; i++) {
    pos[i] = -1;
    if (!names[i]) continue;
    int ci = ct_parquet_column_index(pq, names[i]);
    if (ci < 0) {
      if (i == 0 || (i == 1 && c->caption_strategy == CT_CAP_PARQUET && !names[2])) {
        st = ct_errf(err, CT_ERR_INVALID,
                     "%s: dataset '%s': parquet.%s \"%s\" is not a column of the file", path, c->id,
                     i == 0 ? "filename_column" : "caption_column", names[i]);
        break;
      }
      continue;
    }
    pos[i] = n;
    cols[n++] = ci;
  }
  table_ctx t = {d, c, pos[0], pos[1], pos[2], pos[3], pos[4], CT_OK};
  if (!st) st = ct_parquet_scan(pq, cols, n, pq_row, &t, err);
  if (!st && t.st) st = ct_errf(err, t.st, "out of memory reading %s", path);
  ct_parquet_free(pq);
  return st;
}

static ct_status read_jsonl(const char *path, char *text, size_t n, const ct_ds_config *c,
                            ct_disc *d, ct_err *err) {
  table_ctx t = {d, c, 0, 1, 2, 3, 4, CT_OK};
  long lineno = 0;
  ct_status st = CT_OK;
  for (char *line = text, *end = text + n; !st && line < end;) {
    char *nl = memchr(line, '\n', (size_t)(end - line));
    size_t len = nl ? (size_t)(nl - line) : (size_t)(end - line);
    char *next = nl ? nl + 1 : end;
    lineno++;
    while (len && (line[len - 1] == '\r' || line[len - 1] == ' ')) len--;
    if (!len) {
      line = next;
      continue;
    }
    ct_json *j = NULL;
    ct_err je = {0};
    if (ct_json_parse(line, len, &j, &je) || j->type != CT_JSON_OBJECT) {
      CT_WARN("%s: line %ld: not a JSON object (%s); skipped", path, lineno,
              je.msg[0] ? je.msg : "wrong type");
      d->metadata_missing++;
      ct_json_free(j);
      line = next;
      continue;
    }
    const char *names[5] = {c->parquet.filename_column, c->parquet.caption_column,
                            c->parquet.fallback_caption_column, c->parquet.width_column,
                            c->parquet.height_column};
    ct_pq_value v[5];
    for (int i = 0; i < 5; i++) {
      const ct_json *x = names[i] ? ct_json_get(j, names[i]) : NULL;
      v[i].kind = CT_PQ_NULL;
      if (x && x->type == CT_JSON_STRING) v[i] = (ct_pq_value){CT_PQ_BYTES, 0, 0, x->str, x->len};
      if (x && x->type == CT_JSON_NUMBER) v[i] = (ct_pq_value){CT_PQ_DOUBLE, 0, x->num, NULL, 0};
    }
    pq_row(&t, lineno, v);
    st = t.st ? ct_errf(err, t.st, "out of memory reading %s", path) : CT_OK;
    ct_json_free(j);
    line = next;
  }
  return st;
}

/* The parquet.path table: an absolute path is a local file; a relative one a
 * key below the image directory of the dataset's storage. */
static ct_status read_table(const ct_ds_config *c, ct_storage *sto, const char *dir,
                            const char *name, ct_disc *d, ct_err *err) {
  char key[4096], local[4096], shown[8400];
  const char *path = NULL;
  const size_t l = strlen(c->parquet.path);
  const int jsonl = l > 6 && !strcasecmp(c->parquet.path + l - 6, ".jsonl");
  if (c->parquet.path[0] == '/') {
    path = c->parquet.path;
  } else {
    if (join_key(key, sizeof key, dir, c->parquet.path))
      return ct_errf(err, CT_ERR_RANGE, "dataset '%s': parquet.path is too long", c->id);
    if (!ct_storage_is_remote(sto) && !ct_storage_local_path(sto, key, local, sizeof local))
      path = local;
  }
  snprintf(shown, sizeof shown, "%s", path ? path : "");
  if (!path) snprintf(shown, sizeof shown, "%s/%s", name, c->parquet.path);
  char *data = NULL;
  size_t n = 0;
  ct_status st = CT_OK;
  if (path && jsonl)
    st = ct_read_file(path, TABLE_MAX, &data, &n, err);
  else if (!path)
    st = ct_storage_get(sto, key, TABLE_MAX, &data, &n, err);
  if (st == CT_ERR_NOT_FOUND)
    return ct_errf(err, st, "%s: dataset '%s': parquet.path: not found", shown, c->id);
  if (st) return st;
  st = jsonl ? read_jsonl(shown, data, n, c, d, err) : read_parquet(shown, data, n, c, d, err);
  free(data);
  return st;
}

/* A table row's file name must stay inside the directory. */
static int outside(const char *rel) {
  if (rel[0] == '/' || rel[0] == '\\') return 1;
  const char *p = rel;
  while (*p) {
    const char *e = strchr(p, '/');
    size_t l = e ? (size_t)(e - p) : strlen(p);
    if (l == 2 && p[0] == '.' && p[1] == '.') return 1;
    if (!e) break;
    p = e + 1;
  }
  return 0;
}

static int cmp_item(const void *a, const void *b) {
  return strcmp(((const ct_disc_item *)a)->rel, ((const ct_disc_item *)b)->rel);
}

/* Sizes from a preserved aspect_ratio_bucket_metadata_<id>.json beside the images. */
static int load_preserved(ct_storage *sto, const char *dir, const char *id, ct_keyset *s) {
  char rel[300], key[4400];
  char *text = NULL;
  size_t n = 0;
  ct_err e = {0};
  ct_json *j = NULL;
  memset(s, 0, sizeof *s);
  snprintf(rel, sizeof rel, "aspect_ratio_bucket_metadata_%s.json", id);
  if (join_key(key, sizeof key, dir, rel)) return 0;
  ct_status st = ct_storage_get(sto, key, (size_t)1 << 32, &text, &n, &e);
  if (st == CT_ERR_NOT_FOUND) return 0;
  if (!st) st = ct_json_parse(text, n, &j, &e);
  free(text);
  if (!st) st = ct_keyset_from_json(j, s, &e);
  if (st) {
    CT_WARN("%s: %s: %s; not used", ct_storage_describe(sto), key, e.msg);
    return 0;
  }
  return 1;
}

/* ---- this rank's share: sizes and captions, a chunk of items at a time ---- */

#define PROBE_BYTES ((size_t)64 << 10)
#define PROBE_MAX ((size_t)64 << 20) /* a header that needs more than this is unreadable */

typedef struct share {
  const ct_ds_config *c;
  ct_storage *sto;
  const char *dir;
  ct_disc *d;
  const ct_keyset *pres;
  int need_size, remote;
  int *res;    /* (w, h, why) per item of the share */
  char **caps; /* caption text per item */
} share;

static void free_reqs(ct_storage_req *r, size_t n) {
  for (size_t i = 0; i < n; i++) free(r[i].data), free((char *)r[i].key);
}

/* Items [a, b) of the d's list (share-relative i0 = a - lo). A failure of the
 * storage itself (not a missing or bad file) on a remote storage is returned:
 * images must not vanish from a dataset because the network did. */

/* The size preserved metadata recorded for rel (original_size), into r[0..1]. */
static int preserved_size(const share *sh, const char *rel, int *r) {
  const ct_json *m = ct_keyset_find(sh->pres, rel);
  const ct_json *os = m ? ct_json_get(m, "original_size") : NULL;
  if (!os || os->type != CT_JSON_ARRAY || os->n != 2 || !os->items[0].is_int ||
      !os->items[1].is_int)
    return 0;
  r[0] = (int)os->items[0].i64, r[1] = (int)os->items[1].i64;
  return 1;
}

static ct_status probe_chunk_local(share *sh, size_t lo, size_t a, size_t b) {
  const ct_ds_config *c = sh->c;
  for (size_t i = a; i < b; i++) {
    ct_disc_item *it = &sh->d->it[i];
    int *r = &sh->res[3 * (i - lo)];
    char key[4096], path[8192];
    r[0] = it->w, r[1] = it->h, r[2] = CT_DISC_OK;
    if (join_key(key, sizeof key, sh->dir, it->rel) ||
        ct_storage_local_path(sh->sto, key, path, sizeof path)) {
      r[2] = CT_DISC_NOT_FOUND;
      continue;
    }
    const int known = preserved_size(sh, it->rel, r);
    if (!known && (sh->need_size || it->w <= 0 || it->h <= 0)) {
      ct_image_info info;
      ct_err e = {0};
      ct_status ps = ct_image_probe_info(path, &info, &e);
      if (ps == CT_ERR_NOT_FOUND)
        r[2] = CT_DISC_NOT_FOUND;
      else if (ps)
        r[2] = CT_DISC_UNREADABLE;
      else
        r[0] = info.w, r[1] = info.h;
      if (ps && ps != CT_ERR_NOT_FOUND) CT_DEBUG("dataset '%s': %s", c->id, e.msg);
    } else if (!known) {
      struct stat fs;
      if (stat(path, &fs) != 0) r[2] = CT_DISC_NOT_FOUND;
    }
    if (r[2] != CT_DISC_OK) continue;
    char *txt = NULL;
    if (c->caption_strategy == CT_CAP_TEXTFILE) {
      char tp[8192];
      size_t tn;
      ct_err e = {0};
      if (!caption_key(tp, sizeof tp, path) && ct_read_file(tp, 1 << 20, &txt, &tn, &e)) txt = NULL;
    }
    sh->caps[i - lo] = caption_text(c, it->rel, it->caption, &txt);
    free(txt);
    if (!sh->caps[i - lo]) r[2] = CT_DISC_NO_CAPTION;
  }
  return CT_OK;
}

static ct_status probe_chunk(share *sh, size_t lo, size_t a, size_t b, ct_err *err) {
  if (!sh->remote && !ct_disc_force_generic) return probe_chunk_local(sh, lo, a, b);
  const size_t n = b - a;
  const ct_ds_config *c = sh->c;
  ct_storage_req *rq = calloc(2 * n + 1, sizeof *rq);
  int *kind = calloc(n + 1, sizeof *kind); /* 0: size known, 1: probe, 2: existence */
  ct_status st = rq && kind ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  const int textfile = c->caption_strategy == CT_CAP_TEXTFILE;
  for (size_t i = 0; !st && i < n; i++) {
    ct_disc_item *it = &sh->d->it[a + i];
    int *r = &sh->res[3 * (a + i - lo)];
    r[0] = it->w, r[1] = it->h, r[2] = CT_DISC_OK;
    char key[4096], tk[4096];
    if (join_key(key, sizeof key, sh->dir, it->rel) ||
        (textfile && caption_key(tk, sizeof tk, key))) {
      r[2] = CT_DISC_NOT_FOUND;
      continue;
    }
    const int known = preserved_size(sh, it->rel, r);
    if (!known && (sh->need_size || it->w <= 0 || it->h <= 0)) {
      kind[i] = 1;
      rq[i].len = PROBE_BYTES;
    } else if (!known) {
      kind[i] = 2; /* sizes from the table: the file must exist */
      rq[i].len = 1;
    }
    if (kind[i]) rq[i].key = strdup(key);
    if (textfile) rq[n + i].key = strdup(tk), rq[n + i].max = (size_t)1 << 20;
    if ((kind[i] && !rq[i].key) || (textfile && !rq[n + i].key))
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  /* one call for the headers and captions; requests without a key are skipped by packing */
  ct_storage_req *pk = st ? NULL : calloc(2 * n + 1, sizeof *pk);
  size_t *map = st ? NULL : calloc(2 * n + 1, sizeof *map), np = 0;
  if (!st && (!pk || !map)) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; !st && i < 2 * n; i++)
    if (rq[i].key) map[np] = i, pk[np++] = rq[i];
  for (int round = 0; !st && np; round++) {
    ct_err e = {0};
    ct_status gs = ct_storage_get_many(sh->sto, pk, np, &e);
    /* the network or memory failing ends discovery (no image is dropped for
     * it); one object too large or refused is that image's problem only */
    if (sh->remote && (gs == CT_ERR_IO || gs == CT_ERR_NOMEM)) {
      st = ct_errf(err, gs, "dataset '%s': %s", c->id, e.msg);
      for (size_t k = 0; k < np; k++) free(pk[k].data), pk[k].data = NULL;
      break;
    }
    for (size_t k = 0; k < np; k++) {
      const size_t i = map[k];
      char *key = (char *)rq[i].key;
      rq[i] = pk[k];
      rq[i].key = key;
    }
    /* headers that continue past what was read: fetch that many and probe again */
    size_t again = 0;
    for (size_t k = 0; k < np; k++) {
      const size_t i =
          map[k];           /* again <= k: map and pk are rewritten behind the reading position */
      if (i >= n) continue; /* a caption */
      int *r = &sh->res[3 * (a + i - lo)];
      if (rq[i].st == CT_ERR_NOT_FOUND) {
        r[2] = CT_DISC_NOT_FOUND;
      } else if (rq[i].st) {
        r[2] = CT_DISC_UNREADABLE;
      } else if (kind[i] == 1) {
        ct_image_info info;
        size_t need = 0;
        ct_err pe = {0};
        ct_status ps = ct_image_probe_mem(rq[i].data, rq[i].n, &info, &need, &pe);
        if (!ps) {
          r[0] = info.w, r[1] = info.h;
        } else if (need > rq[i].n && rq[i].n == rq[i].len && need <= PROBE_MAX && round < 12) {
          /* need is where parsing stopped, not the header's end: at least double */
          free(rq[i].data);
          rq[i].data = NULL;
          rq[i].len = need > 2 * rq[i].len ? need : 2 * rq[i].len;
          if (rq[i].len > PROBE_MAX) rq[i].len = PROBE_MAX;
          map[again] = i, pk[again++] = rq[i];
        } else {
          CT_DEBUG("dataset '%s': %s: %s", c->id, rq[i].key, pe.msg);
          r[2] = CT_DISC_UNREADABLE;
        }
      }
    }
    np = again;
  }
  for (size_t i = 0; !st && i < n; i++) {
    int *r = &sh->res[3 * (a + i - lo)];
    if (r[2] != CT_DISC_OK) continue;
    if (textfile && rq[n + i].st && rq[n + i].st != CT_ERR_NOT_FOUND &&
        rq[n + i].st != CT_ERR_RANGE)
      CT_DEBUG("dataset '%s': caption of %s unreadable", c->id, sh->d->it[a + i].rel);
    sh->caps[a + i - lo] =
        caption_text(c, sh->d->it[a + i].rel, sh->d->it[a + i].caption, &rq[n + i].data);
    if (!sh->caps[a + i - lo]) r[2] = CT_DISC_NO_CAPTION;
  }
  if (rq) free_reqs(rq, 2 * n);
  free(rq);
  free(pk);
  free(map);
  free(kind);
  return st;
}

/* The candidate list (identical on every rank): the table's rows (outside
 * the directory and duplicates skipped and counted), a preserved file list, or
 * the directory's image files, sorted by path. */
static ct_status list_candidates(const ct_ds_config *c, ct_storage *sto, const char *dir,
                                 const char *name, const ct_keyset *listed, int remote, ct_disc *d,
                                 ct_err *err) {
  ct_status st = CT_OK;
  if (c->metadata_backend == CT_META_PARQUET || c->caption_strategy == CT_CAP_PARQUET) {
    st = read_table(c, sto, dir, name, d, err);
    if (st) return st;
    /* outside the directory, duplicates */
    size_t k = 0;
    for (size_t i = 0; i < d->n; i++) {
      if (outside(d->it[i].rel)) {
        CT_WARN("dataset '%s': %s: row %zu names '%s', outside instance_data_dir; skipped", c->id,
                c->parquet.path, i, d->it[i].rel);
        d->outside_dir++;
        free(d->it[i].rel);
        free(d->it[i].caption);
        continue;
      }
      d->it[k++] = d->it[i];
    }
    d->n = k;
    qsort(d->it, d->n, sizeof *d->it, cmp_item);
    k = 0;
    for (size_t i = 0; i < d->n; i++) {
      if (k && !strcmp(d->it[k - 1].rel, d->it[i].rel)) {
        d->duplicate++;
        free(d->it[i].rel);
        free(d->it[i].caption);
        continue;
      }
      d->it[k++] = d->it[i];
    }
    d->n = k;
  } else if (listed && listed->n) {
    /* a preserved all_image_files_<id>.json: its paths under the directory, not a listing */
    const size_t dl = strlen(name);
    for (size_t i = 0; i < listed->n && !st; i++) {
      const char *k = ct_keyset_key(listed, i);
      if (strncmp(k, name, dl) || k[dl] != '/' || outside(k + dl + 1) || !is_image_name(k + dl + 1))
        continue;
      char *rel = strdup(k + dl + 1);
      st = rel ? add_item(d, rel, 0, 0, NULL) : CT_ERR_NOMEM; /* add_item frees rel on failure */
    }
    if (st) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    CT_INFO(
        "dataset '%s': %zu image(s) from the preserved file list (instance_data_dir not listed)",
        c->id, d->n);
  } else if (!remote && !ct_disc_force_generic) {
    char root[4096];
    strlist fl = {0};
    if (ct_storage_local_path(sto, dir, root, sizeof root))
      st = ct_errf(err, CT_ERR_RANGE, "%s: too long", name);
    if (!st) st = list_rel(root, "", &fl, 0, err);
    if (!st) qsort(fl.s, fl.n, sizeof *fl.s, cmp_str);
    for (size_t i = 0; i < fl.n; i++) {
      if (!st)
        st = add_item(d, fl.s[i], 0, 0, NULL) ? ct_errf(err, CT_ERR_NOMEM, "out of memory") : CT_OK;
      else
        free(fl.s[i]);
    }
    free(fl.s);
    if (st) return st;
  } else {
    ct_storage_list files = {0};
    st = ct_storage_list_dir(sto, dir, &files, err);
    if (st) {
      ct_storage_list_free(&files);
      return st;
    }
    const size_t dl = *dir ? strlen(dir) + 1 : 0; /* keys are relative to the storage's root */
    for (size_t i = 0; i < files.n && !st; i++) {
      const char *rel = files.keys[i] + dl;
      if (strlen(files.keys[i]) <= dl || !wanted(rel)) continue;
      char *r = strdup(rel);
      st = r ? add_item(d, r, 0, 0, NULL) : CT_ERR_NOMEM;
    }
    ct_storage_list_free(&files);
    if (st) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    /* the listing is sorted by key; the common prefix keeps the rel order, but a
     * storage may not sort: make sure */
    qsort(d->it, d->n, sizeof *d->it, cmp_item);
  }
  return st;
}

/* This rank's share [lo, hi) of the candidates: sizes (header, table or
 * preserved) and captions, packed for the all-gather into *out (malloc'd). */
static ct_status probe_share(const ct_ds_config *c, ct_storage *sto, const char *dir, int remote,
                             ct_disc *d, size_t lo, size_t hi, char **out, size_t *outn,
                             ct_err *err) {
  ct_status st = CT_OK;
  ct_keyset pres = {0};
  if (c->preserve_data_backend_cache) load_preserved(sto, dir, c->id, &pres);
  int *res = calloc((hi - lo) * 3 + 1, sizeof *res);
  char **caps = calloc(hi - lo + 1, sizeof *caps);
  if (!res || !caps) {
    free(res);
    free(caps);
    ct_keyset_free(&pres);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  share sh = {c, sto, dir, d, &pres, c->metadata_backend == CT_META_DISCOVERY, remote, res, caps};
  /* local: chunks spread over the cores; S3: one chunk at a time, its
   * requests spread over the connection pool */
  const size_t chunk = remote ? 256 : 32, nch = (hi - lo + chunk - 1) / chunk;
  ct_err ferr = {0};
  ct_status fst = CT_OK;
#pragma omp parallel for schedule(dynamic, 1) if (!remote)
  for (long ch = 0; ch < (long)nch; ch++) {
    ct_err e = {0};
    const size_t a = lo + (size_t)ch * chunk, b = a + chunk < hi ? a + chunk : hi;
    ct_status cs = fst ? CT_OK : probe_chunk(&sh, lo, a, b, &e);
    if (cs) {
#pragma omp critical(ct_discover_fail)
      if (!fst) fst = cs, ferr = e;
    }
  }
  if (fst) {
    for (size_t i = 0; i < hi - lo; i++) free(caps[i]);
    free(caps);
    free(res);
    ct_keyset_free(&pres);
    if (err) *err = ferr;
    return fst;
  }
  size_t bl = 0;
  for (size_t i = 0; i < hi - lo; i++) bl += 16 + (caps[i] ? strlen(caps[i]) : 0);
  char *blob = *out = malloc(bl + 1);
  if (!blob) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  } else {
    char *p = blob;
    for (size_t i = 0; i < hi - lo; i++) {
      size_t cl = caps[i] ? strlen(caps[i]) : 0;
      put32(&p, (uint32_t)res[3 * i]), put32(&p, (uint32_t)res[3 * i + 1]),
          put32(&p, (uint32_t)res[3 * i + 2]);
      put32(&p, (uint32_t)cl);
      memcpy(p, caps[i] ? caps[i] : "", cl);
      p += cl;
    }
    *outn = (size_t)(p - blob);
  }
  for (size_t i = 0; i < hi - lo; i++) free(caps[i]);
  free(caps);
  free(res);
  ct_keyset_free(&pres);
  return st;
}

/* Everyone's results [all, end), in rank order = item order, into d's items. */
static ct_status unpack_results(const ct_ds_config *c, const char *all, const char *end, ct_disc *d,
                                ct_err *err) {
  const char *p = all;
  for (size_t i = 0; i < d->n; i++) {
    if (end - p < 16) {
      return ct_errf(err, CT_ERR_INTERNAL, "discovery results of dataset '%s' are short", c->id);
    }
    ct_disc_item *it = &d->it[i];
    it->w = (int)get32(&p), it->h = (int)get32(&p), it->why = (int)get32(&p);
    uint32_t cl = get32(&p);
    if ((size_t)(end - p) < cl) {
      return ct_errf(err, CT_ERR_INTERNAL, "discovery results of dataset '%s' are short", c->id);
    }
    free(it->caption);
    it->caption = malloc(cl + 1);
    if (!it->caption) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    memcpy(it->caption, p, cl);
    it->caption[cl] = 0;
    p += cl;
  }
  return CT_OK;
}

ct_status ct_discover(const ct_ds_config *c, ct_storage *sto, const char *dir, const char *name,
                      const ct_keyset *listed, struct ct_comm *comm, ct_disc *d, ct_err *err) {
  ct_status st = CT_OK;
  char *blob = NULL, *all = NULL;
  size_t *off = NULL, bl = 0;
  memset(d, 0, sizeof *d);
  const int remote = ct_storage_is_remote(sto);
  if (!remote) {
    char p[4096];
    struct stat sb;
    if (ct_storage_local_path(sto, dir, p, sizeof p) || stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))
      return ct_errf(err, CT_ERR_NOT_FOUND,
                     "dataset '%s': instance_data_dir '%s' is not a directory (%s)", c->id, name,
                     stat(p, &sb) ? strerror(errno) : "a file");
  }
  /* 1. the candidate list (identical on every rank) */
  st = list_candidates(c, sto, dir, name, listed, remote, d, err);
  if (st) goto out;
  d->total = d->n + d->outside_dir + d->duplicate + d->metadata_missing;
  /* 2. this rank's share: sizes (header, table or preserved) and captions */
  const int size = comm ? ct_comm_size(comm) : 1, rank = comm ? ct_comm_rank(comm) : 0;
  const size_t lo = d->n * (size_t)rank / (size_t)size,
               hi = d->n * (size_t)(rank + 1) / (size_t)size;
  st = probe_share(c, sto, dir, remote, d, lo, hi, &blob, &bl, err);
  if (st) goto out;
  /* 3. everyone's results, in rank order = item order */
  st = ct_data_allgatherv(comm, blob, bl, &all, &off, err);
  if (!st) st = unpack_results(c, all, all + off[size], d, err);
out:
  free(blob);
  free(all);
  free(off);
  if (st) ct_disc_free(d);
  return st;
}

int ct_caption_lines(const char *text, char ***lines) {
  return split_lines(text, lines);
}

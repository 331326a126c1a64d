/* discover.c: the images of one dataset, their captions and sizes.
 *
 * Two metadata backends fill the same list of items:
 *   discovery  the instance_data_dir is listed (recursively, sorted); the
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
#include "data/discover.h"

static int is_image_name(const char *n) {
  static const char *const ext[] = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", NULL};
  const char *dot = strrchr(n, '.');
  if (!dot) return 0;
  for (int i = 0; ext[i]; i++)
    if (!strcasecmp(dot, ext[i])) return 1;
  return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

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

/* Relative paths of the images under dir/sub, recursively. */
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
      if (sl_push(out, strdup(rel))) st = ct_errf(err, CT_ERR_NOMEM, "out of memory listing %s", dir);
    }
  }
  closedir(d);
  return st;
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

/* The caption text of an item by strategy, or NULL (counted as no_caption). */
static char *caption_text(const ct_ds_config *c, const char *dir, const char *rel, const char *table_caption) {
  switch (c->caption_strategy) {
  case CT_CAP_FILENAME:
    return caption_from_name(rel);
  case CT_CAP_INSTANCEPROMPT:
    return strdup(c->instance_prompt);
  case CT_CAP_PARQUET:
    return table_caption && *table_caption ? strdup(table_caption) : NULL;
  case CT_CAP_TEXTFILE: {
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    char *dot = strrchr(p, '.'), *slash = strrchr(p, '/');
    if (dot && (!slash || dot > slash)) *dot = 0;
    strncat(p, ".txt", sizeof p - strlen(p) - 1);
    char *text = NULL;
    size_t n;
    ct_err e = {0};
    if (ct_read_file(p, 1 << 20, &text, &n, &e)) return NULL;
    return text;
  }
  }
  return NULL;
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

static ct_status read_parquet(const char *path, const ct_ds_config *c, ct_disc *d, ct_err *err) {
  ct_parquet *pq = NULL;
  ct_status st = ct_parquet_open(path, &pq, err);
  if (st) return st;
  const char *names[5] = {c->parquet.filename_column, c->parquet.caption_column, c->parquet.fallback_caption_column,
                          c->parquet.width_column, c->parquet.height_column};
  int cols[5], n = 0, pos[5];
  for (int i = 0; i < 5; i++) {
    pos[i] = -1;
    if (!names[i]) continue;
    int ci = ct_parquet_column_index(pq, names[i]);
    if (ci < 0) {
      if (i == 0 || (i == 1 && c->caption_strategy == CT_CAP_PARQUET && !names[2])) {
        st = ct_errf(err, CT_ERR_INVALID, "%s: dataset '%s': parquet.%s \"%s\" is not a column of the file", path,
                     c->id, i == 0 ? "filename_column" : "caption_column", names[i]);
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

static ct_status read_jsonl(const char *path, const ct_ds_config *c, ct_disc *d, ct_err *err) {
  FILE *f = fopen(path, "rb");
  if (!f) return ct_errf(err, CT_ERR_NOT_FOUND, "%s: dataset '%s': cannot open: %s", path, c->id, strerror(errno));
  table_ctx t = {d, c, 0, 1, 2, 3, 4, CT_OK};
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  long lineno = 0;
  ct_status st = CT_OK;
  while (!st && (len = getline(&line, &cap, f)) > 0) {
    lineno++;
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ')) line[--len] = 0;
    if (!len) continue;
    ct_json *j = NULL;
    ct_err je = {0};
    if (ct_json_parse(line, (size_t)len, &j, &je) || j->type != CT_JSON_OBJECT) {
      CT_WARN("%s: line %ld: not a JSON object (%s); skipped", path, lineno, je.msg[0] ? je.msg : "wrong type");
      d->metadata_missing++;
      ct_json_free(j);
      continue;
    }
    const char *names[5] = {c->parquet.filename_column, c->parquet.caption_column,
                            c->parquet.fallback_caption_column, c->parquet.width_column, c->parquet.height_column};
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
  }
  free(line);
  if (!st && ferror(f)) st = ct_errf(err, CT_ERR_IO, "%s: read error", path);
  fclose(f);
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

/* Sizes from a preserved aspect_ratio_bucket_metadata_<id>.json. */
static int load_preserved(const char *dir, const char *id, ct_keyset *s) {
  char p[8192];
  snprintf(p, sizeof p, "%s/aspect_ratio_bucket_metadata_%s.json", dir, id);
  return ct_keyset_load(p, s);
}

ct_status ct_discover(const ct_ds_config *c, const char *dir, const ct_keyset *listed, struct ct_comm *comm,
                      ct_disc *d, ct_err *err) {
  ct_status st = CT_OK;
  strlist files = {0};
  char *blob = NULL, *all = NULL;
  size_t *off = NULL;
  ct_keyset pres = {0};
  memset(d, 0, sizeof *d);
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    return ct_errf(err, CT_ERR_NOT_FOUND, "dataset '%s': instance_data_dir '%s' is not a directory (%s)", c->id, dir,
                   stat(dir, &sb) ? strerror(errno) : "a file");
  }
  /* 1. the candidate list (identical on every rank) */
  if (c->metadata_backend == CT_META_PARQUET || c->caption_strategy == CT_CAP_PARQUET) {
    char tp[8192];
    if (c->parquet.path[0] == '/')
      snprintf(tp, sizeof tp, "%s", c->parquet.path);
    else
      snprintf(tp, sizeof tp, "%s/%s", dir, c->parquet.path);
    size_t l = strlen(tp);
    st = l > 6 && !strcasecmp(tp + l - 6, ".jsonl") ? read_jsonl(tp, c, d, err) : read_parquet(tp, c, d, err);
    if (st) goto out;
    /* outside the directory, duplicates */
    size_t k = 0;
    for (size_t i = 0; i < d->n; i++) {
      if (outside(d->it[i].rel)) {
        CT_WARN("dataset '%s': %s: row %zu names '%s', outside instance_data_dir; skipped", c->id, c->parquet.path,
                i, d->it[i].rel);
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
    /* a preserved all_image_files_<id>.json: its paths under dir, not a walk */
    const size_t dl = strlen(dir);
    for (size_t i = 0; i < listed->n && !st; i++) {
      const char *k = ct_keyset_key(listed, i);
      if (strncmp(k, dir, dl) || k[dl] != '/' || outside(k + dl + 1) || !is_image_name(k + dl + 1)) continue;
      char *rel = strdup(k + dl + 1);
      st = rel ? add_item(d, rel, 0, 0, NULL) : CT_ERR_NOMEM; /* add_item frees rel on failure */
    }
    if (st) {
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
      goto out;
    }
    CT_INFO("dataset '%s': %zu image(s) from the preserved file list (instance_data_dir not listed)", c->id,
            d->n);
  } else {
    st = list_rel(dir, "", &files, 0, err);
    if (st) goto out;
    qsort(files.s, files.n, sizeof *files.s, cmp_str);
    for (size_t i = 0; i < files.n && !st; i++) {
      st = add_item(d, files.s[i], 0, 0, NULL);
      files.s[i] = NULL;
    }
    if (st) {
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
      goto out;
    }
  }
  d->total = d->n + d->outside_dir + d->duplicate + d->metadata_missing;
  /* 2. this rank's share: sizes (header, table or preserved) and captions */
  const int size = comm ? ct_comm_size(comm) : 1, rank = comm ? ct_comm_rank(comm) : 0;
  const size_t lo = d->n * (size_t)rank / (size_t)size, hi = d->n * (size_t)(rank + 1) / (size_t)size;
  if (c->preserve_data_backend_cache) load_preserved(dir, c->id, &pres);
  const int need_size = c->metadata_backend == CT_META_DISCOVERY;
  size_t cap = 64;
  for (size_t i = lo; i < hi; i++) cap += 16 + (d->it[i].caption ? strlen(d->it[i].caption) : 0);
  int *res = calloc((hi - lo) * 3 + 1, sizeof *res);
  char **caps = calloc(hi - lo + 1, sizeof *caps);
  if (!res || !caps) {
    free(res);
    free(caps);
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    goto out;
  }
#pragma omp parallel for schedule(dynamic, 16)
  for (long li = 0; li < (long)(hi - lo); li++) {
    ct_disc_item *it = &d->it[lo + (size_t)li];
    char path[8192];
    int w = it->w, h = it->h, why = CT_DISC_OK;
    snprintf(path, sizeof path, "%s/%s", dir, it->rel);
    const ct_json *m = ct_keyset_find(&pres, it->rel);
    const ct_json *os = m ? ct_json_get(m, "original_size") : NULL;
    if (os && os->type == CT_JSON_ARRAY && os->n == 2 && os->items[0].is_int && os->items[1].is_int) {
      w = (int)os->items[0].i64, h = (int)os->items[1].i64;
    } else if (need_size || w <= 0 || h <= 0) {
      ct_image_info info;
      ct_err e = {0};
      ct_status ps = ct_image_probe_info(path, &info, &e);
      if (ps == CT_ERR_NOT_FOUND) why = CT_DISC_NOT_FOUND;
      else if (ps) why = CT_DISC_UNREADABLE;
      else w = info.w, h = info.h;
      if (ps && ps != CT_ERR_NOT_FOUND) CT_DEBUG("dataset '%s': %s", c->id, e.msg);
    } else {
      struct stat fs;
      if (stat(path, &fs) != 0) why = CT_DISC_NOT_FOUND;
    }
    char *text = NULL;
    if (why == CT_DISC_OK) {
      text = caption_text(c, dir, it->rel, it->caption);
      if (!text) why = CT_DISC_NO_CAPTION;
    }
    res[3 * li] = w, res[3 * li + 1] = h, res[3 * li + 2] = why;
    caps[li] = text;
  }
  size_t bl = 0;
  for (size_t i = 0; i < hi - lo; i++) bl += 16 + (caps[i] ? strlen(caps[i]) : 0);
  blob = malloc(bl + 1);
  if (!blob) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  } else {
    char *p = blob;
    for (size_t i = 0; i < hi - lo; i++) {
      size_t cl = caps[i] ? strlen(caps[i]) : 0;
      put32(&p, (uint32_t)res[3 * i]), put32(&p, (uint32_t)res[3 * i + 1]), put32(&p, (uint32_t)res[3 * i + 2]);
      put32(&p, (uint32_t)cl);
      memcpy(p, caps[i] ? caps[i] : "", cl);
      p += cl;
    }
    bl = (size_t)(p - blob);
  }
  for (size_t i = 0; i < hi - lo; i++) free(caps[i]);
  free(caps);
  free(res);
  if (st) goto out;
  /* 3. everyone's results, in rank order = item order */
  st = ct_data_allgatherv(comm, blob, bl, &all, &off, err);
  if (st) goto out;
  const char *p = all, *end = all + off[size];
  for (size_t i = 0; i < d->n; i++) {
    if (end - p < 16) {
      st = ct_errf(err, CT_ERR_INTERNAL, "discovery results of dataset '%s' are short", c->id);
      goto out;
    }
    ct_disc_item *it = &d->it[i];
    it->w = (int)get32(&p), it->h = (int)get32(&p), it->why = (int)get32(&p);
    uint32_t cl = get32(&p);
    if ((size_t)(end - p) < cl) {
      st = ct_errf(err, CT_ERR_INTERNAL, "discovery results of dataset '%s' are short", c->id);
      goto out;
    }
    free(it->caption);
    it->caption = malloc(cl + 1);
    if (!it->caption) {
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
      goto out;
    }
    memcpy(it->caption, p, cl);
    it->caption[cl] = 0;
    p += cl;
  }
out:
  for (size_t i = 0; i < files.n; i++) free(files.s[i]);
  free(files.s);
  free(blob);
  free(all);
  free(off);
  ct_keyset_free(&pres);
  if (st) ct_disc_free(d);
  return st;
}

int ct_caption_lines(const char *text, char ***lines) { return split_lines(text, lines); }

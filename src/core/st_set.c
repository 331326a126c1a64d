/* A model's tensors on disk, shared by every loader (the CLIP and T5 text
 * encoders, the Flux transformer): one safetensors file or the shards its
 * index names, and the one error that lists every missing, wrongly shaped and
 * unexpected tensor. What a model expects (names, shapes, aliases, tensors to
 * ignore) stays with the model; this file only opens, finds and reports.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/safetensors.h"

#define LIST_CAP 4096

void ct_st_set_close(ct_st_set *s) {
  for (size_t i = 0; i < s->nf; i++) {
    ct_st_close(s->f[i]);
    free(s->fname[i]);
  }
  free(s->f);
  free(s->fname);
  ct_json_free(s->index);
  memset(s, 0, sizeof *s);
}

/* Append file `name` (opened as dir/name, or name itself when dir is NULL). */
static ct_status set_add(ct_st_set *s, const char *dir, const char *name, ct_err *err) {
  char path[4096];
  ct_st_file **nf = realloc(s->f, (s->nf + 1) * sizeof *nf);
  if (nf) s->f = nf;
  char **nn = realloc(s->fname, (s->nf + 1) * sizeof *nn);
  if (nn) s->fname = nn;
  if (!nf || !nn) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  if (ct_pathf(path, sizeof path, "%s%s%s", dir ? dir : "", dir ? "/" : "", name))
    return ct_errf(err, CT_ERR_INVALID, "%s: path too long", dir ? dir : name);
  s->fname[s->nf] = strdup(name);
  if (!s->fname[s->nf]) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  s->f[s->nf] = NULL;
  s->nf++;
  return ct_st_open(path, &s->f[s->nf - 1], err);
}

/* A shard name from an index: a plain file name inside the directory. */
static int shard_name_ok(const char *n) {
  size_t l = strlen(n);
  return l > 12 && l < 256 && n[0] != '.' && !strchr(n, '/') && !strchr(n, '\\') &&
         !strcmp(n + l - 12, ".safetensors");
}

static ct_status open_index(ct_st_set *s, const char *dir, const char *ipath, ct_err *err) {
  ct_status st = ct_json_parse_file(ipath, 64 << 20, &s->index, err);
  if (st) return st;
  s->wmap = ct_json_get(s->index, "weight_map");
  if (!s->wmap || s->wmap->type != CT_JSON_OBJECT || !s->wmap->n)
    return ct_errf(err, CT_ERR_FORMAT, "%s: no weight_map object (tensor name -> shard file)",
                   ipath);
  for (size_t i = 0; i < s->wmap->n; i++) {
    const ct_json *v = &s->wmap->items[i];
    if (v->type != CT_JSON_STRING || !shard_name_ok(v->str))
      return ct_errf(err, CT_ERR_FORMAT,
                     "%s: weight_map[\"%s\"] must name a .safetensors file inside %s (no path)",
                     ipath, s->wmap->keys[i], dir);
    size_t k = 0;
    while (k < s->nf && strcmp(s->fname[k], v->str)) k++;
    if (k == s->nf && (st = set_add(s, dir, v->str, err))) return st;
  }
  /* Complete both ways: every mapped tensor is in its shard, every shard tensor is mapped there. */
  for (size_t i = 0; i < s->wmap->n; i++) {
    size_t k = 0;
    while (strcmp(s->fname[k], s->wmap->items[i].str)) k++;
    if (!ct_st_find(s->f[k], s->wmap->keys[i]))
      return ct_errf(err, CT_ERR_FORMAT, "%s: weight_map puts %s in %s, which does not have it",
                     ipath, s->wmap->keys[i], s->fname[k]);
  }
  for (size_t k = 0; k < s->nf; k++)
    for (size_t i = 0; i < s->f[k]->ntensors; i++) {
      const ct_json *v = ct_json_get(s->wmap, s->f[k]->tensors[i].name);
      if (!v || strcmp(v->str, s->fname[k]))
        return ct_errf(err, CT_ERR_FORMAT,
                       "%s: %s of %s is not in the weight_map (or is mapped to another shard)",
                       ipath, s->f[k]->tensors[i].name, s->fname[k]);
    }
  return CT_OK;
}

ct_status ct_st_set_open(ct_st_set *s, const char *path, const char *base, ct_err *err) {
  char ipath[4096], spath[4096];
  struct stat sb;
  ct_status st;
  memset(s, 0, sizeof *s);
  if (stat(path, &sb))
    return ct_errf(err, CT_ERR_NOT_FOUND,
                   "%s does not exist (ctuner does not download; fetch it with "
                   "huggingface-cli download REPO --local-dir X and pass X)",
                   path);
  if (S_ISREG(sb.st_mode)) {
    st = set_add(s, NULL, path, err);
  } else if (ct_pathf(ipath, sizeof ipath, "%s/%s.index.json", path, base) ||
             ct_pathf(spath, sizeof spath, "%s/%s", path, base)) {
    st = ct_errf(err, CT_ERR_INVALID, "%s: path too long", path);
  } else if (!stat(ipath, &sb)) {
    st = open_index(s, path, ipath, err);
  } else if (stat(spath, &sb)) {
    st = ct_errf(err, CT_ERR_NOT_FOUND, "%s has neither %s nor %s.index.json", path, base, base);
  } else {
    st = set_add(s, path, base, err);
  }
  if (st) ct_st_set_close(s);
  return st;
}

const ct_st_tensor *ct_st_set_find(const ct_st_set *s, const char *name, const char **file) {
  size_t k = 0;
  if (s->wmap) {
    const ct_json *v = ct_json_get(s->wmap, name);
    if (!v) return NULL;
    while (k < s->nf && strcmp(s->fname[k], v->str)) k++;
    if (k == s->nf) return NULL;
    if (file) *file = s->fname[k];
    return ct_st_find(s->f[k], name);
  }
  for (; k < s->nf; k++) {
    const ct_st_tensor *t = ct_st_find(s->f[k], name);
    if (t) {
      if (file) *file = s->fname[k];
      return t;
    }
  }
  return NULL;
}

/* ---- the report ---- */

struct ct_st_check {
  char lists[3][LIST_CAP]; /* missing, wrongly shaped, unexpected */
  int n[3];
};

static void list_add(ct_st_check *c, int which, const char *item) {
  char *buf = c->lists[which];
  size_t len = strlen(buf);
  if (len + strlen(item) + 40 < LIST_CAP)
    snprintf(buf + len, LIST_CAP - len, "%s%s", c->n[which] ? ", " : "", item);
  else if (len + 8 < LIST_CAP && !strstr(buf, ", ..."))
    snprintf(buf + len, LIST_CAP - len, ", ...");
  c->n[which]++;
}

ct_status ct_st_check_new(ct_st_check **out, ct_err *err) {
  *out = calloc(1, sizeof **out);
  return *out ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory");
}

static void dims(char *buf, size_t cap, int ndim, const int64_t *shape) {
  size_t l = 0;
  buf[0] = 0;
  for (int k = 0; k < ndim && l + 24 < cap; k++)
    l += (size_t)snprintf(buf + l, cap - l, "%s%lld", k ? ", " : "", (long long)shape[k]);
}

int ct_st_check_tensor(ct_st_check *c, const ct_st_tensor *t, const char *name, const char *file,
                       int ndim, const int64_t *shape) {
  if (!t) {
    list_add(c, 0, name);
    return 0;
  }
  int ok = t->ndim == ndim &&
           (t->dtype == CT_DTYPE_F32 || t->dtype == CT_DTYPE_F16 || t->dtype == CT_DTYPE_BF16);
  for (int k = 0; ok && k < ndim; k++) ok = t->shape[k] == shape[k];
  if (ok) return 1;
  char item[512], got[128], need[128];
  dims(got, sizeof got, t->ndim, t->shape);
  dims(need, sizeof need, ndim, shape);
  snprintf(item, sizeof item, "%s%s%s (has %s [%s], needs F32/F16/BF16 [%s])", name,
           file ? " in " : "", file ? file : "", ct_dtype_name(t->dtype), got, need);
  list_add(c, 1, item);
  return 0;
}

void ct_st_check_unexpected(ct_st_check *c, const char *name, const char *file) {
  char item[512];
  snprintf(item, sizeof item, "%s%s%s", name, file ? " in " : "", file ? file : "");
  list_add(c, 2, item);
}

int ct_st_check_count(const ct_st_check *c) {
  return c->n[0] + c->n[1] + c->n[2];
}

ct_status ct_st_check_done(ct_st_check *c, ct_err *err, const char *what_fmt, ...) {
  if (!c) return CT_OK;
  ct_status st = CT_OK;
  if (ct_st_check_count(c)) {
    char what[1024];
    va_list ap;
    va_start(ap, what_fmt);
    vsnprintf(what, sizeof what, what_fmt, ap);
    va_end(ap);
    int *n = c->n;
    st = ct_errf(
        err, CT_ERR_SHAPE, "%s: %d missing%s%s%s; %d wrongly shaped%s%s%s; %d unexpected%s%s%s",
        what, n[0], n[0] ? " [" : "", c->lists[0], n[0] ? "]" : "", n[1], n[1] ? " [" : "",
        c->lists[1], n[1] ? "]" : "", n[2], n[2] ? " [" : "", c->lists[2], n[2] ? "]" : "");
  }
  free(c);
  return st;
}

/* storage.c: the calls of ctuner/storage.h that every backend shares, and the
 * local-directory backend. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/fs.h"
#include "storage/storage_int.h"

int ct_storage_key_ok(const char *key) {
  if (!key || !key[0] || key[0] == '/') return 0;
  const char *p = key;
  while (*p) {
    const char *e = strchr(p, '/');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return 0;
    if (!e) break;
    p = e + 1;
    if (!*p) return 0; /* trailing '/' */
  }
  return 1;
}

static int dir_ok(const char *dir) {
  return !dir || !dir[0] || ct_storage_key_ok(dir);
}

int ct_storage_list_push(ct_storage_list *l, size_t *cap, char *key, uint64_t size) {
  if (l->n == *cap) {
    size_t nc = *cap ? *cap * 2 : 256;
    char **k = realloc(l->keys, nc * sizeof *k);
    if (!k) return free(key), -1;
    l->keys = k;
    uint64_t *z = realloc(l->sizes, nc * sizeof *z);
    if (!z) return free(key), -1;
    l->sizes = z;
    *cap = nc;
  }
  l->keys[l->n] = key;
  l->sizes[l->n++] = size;
  return 0;
}

typedef struct {
  char *k;
  uint64_t z;
} kz;
static int cmp_kz(const void *a, const void *b) {
  return strcmp(((const kz *)a)->k, ((const kz *)b)->k);
}

void ct_storage_list_sort(ct_storage_list *l) {
  if (l->n < 2) return;
  kz *t = malloc(l->n * sizeof *t);
  if (!t) return; /* callers sort again if they must; S3 already lists in order */
  for (size_t i = 0; i < l->n; i++) t[i] = (kz){l->keys[i], l->sizes[i]};
  qsort(t, l->n, sizeof *t, cmp_kz);
  for (size_t i = 0; i < l->n; i++) l->keys[i] = t[i].k, l->sizes[i] = t[i].z;
  free(t);
}

void ct_storage_list_free(ct_storage_list *l) {
  if (!l) return;
  for (size_t i = 0; i < l->n; i++) free(l->keys[i]);
  free(l->keys);
  free(l->sizes);
  memset(l, 0, sizeof *l);
}

void ct_storage_free(ct_storage *s) {
  if (!s) return;
  if (s->ops && s->ops->free) s->ops->free(s);
  pthread_mutex_destroy(&s->stat_mu);
  free(s->desc);
  free(s->root);
  free(s);
}

int ct_storage_is_remote(const ct_storage *s) {
  return s && s->remote;
}
const char *ct_storage_describe(const ct_storage *s) {
  return s ? s->desc : "(none)";
}

int ct_storage_local_path(const ct_storage *s, const char *key, char *buf, size_t n) {
  if (!s || s->remote) return -1;
  if (!key || !key[0]) return ct_pathf(buf, n, "%s", s->root);
  return ct_pathf(buf, n, "%s/%s", s->root, key);
}

#define KEY_CHECK(key)                                                                \
  if (!ct_storage_key_ok(key))                                                        \
    return ct_errf(err, CT_ERR_INVALID,                                               \
                   "%s: invalid object key '%s' (relative, '/'-separated, no '.' or " \
                   "'..' segments)",                                                  \
                   s->desc, key ? key : "(null)");

ct_status ct_storage_get_many(ct_storage *s, ct_storage_req *r, size_t n, ct_err *err) {
  for (size_t i = 0; i < n; i++) {
    r[i].data = NULL, r[i].n = 0, r[i].st = CT_ERR_INTERNAL;
    KEY_CHECK(r[i].key);
  }
  return n ? s->ops->get_many(s, r, n, err) : CT_OK;
}

/* One read through get_many; a missing object gets a message here. */
static ct_status get_one(ct_storage *s, ct_storage_req *r, char **data, size_t *n, ct_err *err) {
  ct_status st = ct_storage_get_many(s, r, 1, err);
  if (!st && r->st == CT_ERR_NOT_FOUND)
    st = ct_errf(err, CT_ERR_NOT_FOUND, "%s: %s: not found", s->desc, r->key);
  if (st) return free(r->data), st;
  *data = r->data;
  if (n) *n = r->n;
  return CT_OK;
}

ct_status ct_storage_get(ct_storage *s, const char *key, size_t max, char **data, size_t *n,
                         ct_err *err) {
  ct_storage_req r = {.key = key, .max = max ? max : ((size_t)1 << 30)};
  return get_one(s, &r, data, n, err);
}

ct_status ct_storage_get_range(ct_storage *s, const char *key, uint64_t off, size_t len,
                               char **data, size_t *n, ct_err *err) {
  if (len == 0) {
    *data = calloc(1, 1);
    if (n) *n = 0;
    return *data ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  ct_storage_req r = {.key = key, .off = off, .len = len};
  return get_one(s, &r, data, n, err);
}

ct_status ct_storage_put(ct_storage *s, const char *key, const void *data, size_t n, int durable,
                         ct_err *err) {
  KEY_CHECK(key);
  return s->ops->put(s, key, data, n, durable, err);
}

ct_status ct_storage_put_many(ct_storage *s, ct_storage_put_req *r, size_t n, int durable,
                              ct_err *err) {
  for (size_t i = 0; i < n; i++) {
    r[i].st = CT_ERR_INTERNAL;
    KEY_CHECK(r[i].key);
  }
  if (s->ops->put_many) return n ? s->ops->put_many(s, r, n, durable, err) : CT_OK;
  ct_status first = CT_OK;
  for (size_t i = 0; i < n; i++) {
    ct_err e = {0};
    r[i].st = s->ops->put(s, r[i].key, r[i].data, r[i].n, durable, &e);
    if (r[i].st && !first) {
      first = r[i].st;
      if (err) *err = e;
    }
  }
  return first;
}

ct_status ct_storage_head(ct_storage *s, const char *key, uint64_t *size, ct_err *err) {
  KEY_CHECK(key);
  return s->ops->head(s, key, size, err);
}

ct_status ct_storage_delete(ct_storage *s, const char *key, ct_err *err) {
  KEY_CHECK(key);
  return s->ops->del(s, key, err);
}

ct_status ct_storage_list_dir(ct_storage *s, const char *dir, ct_storage_list *out, ct_err *err) {
  memset(out, 0, sizeof *out);
  if (!dir_ok(dir))
    return ct_errf(err, CT_ERR_INVALID, "%s: invalid directory '%s' to list", s->desc, dir);
  ct_status st = s->ops->list(s, dir ? dir : "", out, err);
  if (st)
    ct_storage_list_free(out);
  else
    ct_storage_list_sort(out);
  return st;
}

void ct_storage_get_stats(const ct_storage *s, ct_storage_stats *out) {
  pthread_mutex_lock((pthread_mutex_t *)&s->stat_mu);
  *out = s->stats;
  pthread_mutex_unlock((pthread_mutex_t *)&s->stat_mu);
}

int ct_storage_parse_s3_url(const char *s, char **bucket, char **prefix) {
  *bucket = *prefix = NULL;
  if (!s || strncmp(s, "s3://", 5) != 0) return 0;
  const char *b = s + 5, *e = strchr(b, '/');
  size_t bn = e ? (size_t)(e - b) : strlen(b);
  *bucket = strndup(b, bn);
  const char *p = e ? e + 1 : "";
  size_t pn = strlen(p);
  while (pn && p[pn - 1] == '/') pn--;
  *prefix = strndup(p, pn);
  if (!*bucket || !*prefix) {
    free(*bucket), free(*prefix);
    *bucket = *prefix = NULL;
    return 0;
  }
  return 1;
}

/* ---- local directory ---- */

static ct_status local_path(ct_storage *s, const char *key, char *buf, size_t n, ct_err *err) {
  if (ct_storage_local_path(s, key, buf, n))
    return ct_errf(err, CT_ERR_RANGE, "%s: key too long: %.200s", s->desc, key);
  return CT_OK;
}

static ct_status local_get_one(ct_storage *s, ct_storage_req *r, ct_err *err) {
  char p[4096];
  ct_status st = local_path(s, r->key, p, sizeof p, err);
  if (st) return st;
  if (r->len == 0) {
    st = ct_read_file(p, r->max ? r->max : ((size_t)1 << 30), &r->data, &r->n, err);
    return st;
  }
  FILE *f = fopen(p, "rb");
  if (!f) {
    if (errno == ENOENT || errno == ENOTDIR) return CT_ERR_NOT_FOUND;
    return ct_errf(err, CT_ERR_IO, "%s: cannot open: %s", p, strerror(errno));
  }
  r->data = malloc(r->len + 1);
  if (!r->data) return fclose(f), ct_errf(err, CT_ERR_NOMEM, "out of memory reading %s", p);
  size_t got = 0;
  if (fseeko(f, (off_t)r->off, SEEK_SET) == 0) got = fread(r->data, 1, r->len, f);
  int bad = ferror(f);
  fclose(f);
  if (bad) return ct_errf(err, CT_ERR_IO, "%s: read failed", p);
  r->data[got] = 0;
  r->n = got;
  return CT_OK;
}

static ct_status local_get_many(ct_storage *s, ct_storage_req *r, size_t n, ct_err *err) {
  ct_status first = CT_OK;
  for (size_t i = 0; i < n; i++) {
    ct_err e = {0};
    r[i].st = local_get_one(s, &r[i], &e);
    if (r[i].st) {
      free(r[i].data);
      r[i].data = NULL, r[i].n = 0;
    }
    if (r[i].st && r[i].st != CT_ERR_NOT_FOUND && !first) {
      first = r[i].st;
      if (err) *err = e;
    }
    if (!r[i].st) {
      pthread_mutex_lock(&s->stat_mu);
      s->stats.requests++, s->stats.bytes_in += r[i].n;
      pthread_mutex_unlock(&s->stat_mu);
    }
  }
  return first;
}

static ct_status local_put(ct_storage *s, const char *key, const void *data, size_t n, int durable,
                           ct_err *err) {
  char p[4096];
  ct_status st = local_path(s, key, p, sizeof p, err);
  if (st) return st;
  char *slash = strrchr(p, '/');
  if (slash) {
    *slash = 0;
    st = ct_mkdir_p(p, err);
    *slash = '/';
    if (st) return st;
  }
  st = durable ? ct_write_file_atomic(p, data, n, err) : ct_write_file_replace(p, data, n, err);
  if (!st) {
    pthread_mutex_lock(&s->stat_mu);
    s->stats.requests++, s->stats.bytes_out += n;
    pthread_mutex_unlock(&s->stat_mu);
  }
  return st;
}

static ct_status local_head(ct_storage *s, const char *key, uint64_t *size, ct_err *err) {
  char p[4096];
  ct_status st = local_path(s, key, p, sizeof p, err);
  if (st) return st;
  struct stat sb;
  if (stat(p, &sb) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return CT_ERR_NOT_FOUND;
    return ct_errf(err, CT_ERR_IO, "%s: %s", p, strerror(errno));
  }
  if (!S_ISREG(sb.st_mode)) return CT_ERR_NOT_FOUND;
  if (size) *size = (uint64_t)sb.st_size;
  return CT_OK;
}

static ct_status local_del(ct_storage *s, const char *key, ct_err *err) {
  char p[4096];
  ct_status st = local_path(s, key, p, sizeof p, err);
  if (st) return st;
  if (unlink(p) != 0 && errno != ENOENT && errno != ENOTDIR)
    return ct_errf(err, CT_ERR_IO, "%s: cannot remove: %s", p, strerror(errno));
  return CT_OK;
}

static ct_status local_walk(ct_storage *s, const char *rel, ct_storage_list *out, size_t *cap,
                            int depth, ct_err *err) {
  char p[4096];
  if (ct_storage_local_path(s, rel, p, sizeof p))
    return ct_errf(err, CT_ERR_RANGE, "%s: path too long", s->desc);
  if (depth > 64) return ct_errf(err, CT_ERR_RANGE, "%s: directories nested deeper than 64", p);
  DIR *d = opendir(p);
  if (!d) {
    if (depth == 0 && (errno == ENOENT || errno == ENOTDIR)) return CT_OK; /* nothing under it */
    return ct_errf(err, CT_ERR_IO, "%s: cannot list: %s", p, strerror(errno));
  }
  ct_status st = CT_OK;
  struct dirent *e;
  while (!st && (e = readdir(d))) {
    if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
    char k[4096];
    if (ct_pathf(k, sizeof k, rel[0] ? "%s/%s" : "%s%s", rel, e->d_name)) {
      st = ct_errf(err, CT_ERR_RANGE, "%s: path too long", p);
      break;
    }
    char full[4096];
    if (ct_storage_local_path(s, k, full, sizeof full)) {
      st = ct_errf(err, CT_ERR_RANGE, "%s: path too long", p);
      break;
    }
    struct stat sb;
    if (stat(full, &sb) != 0) continue; /* vanished or a dangling link */
    if (S_ISDIR(sb.st_mode)) {
      st = local_walk(s, k, out, cap, depth + 1, err);
    } else if (S_ISREG(sb.st_mode)) {
      char *dup = strdup(k);
      if (!dup || ct_storage_list_push(out, cap, dup, (uint64_t)sb.st_size))
        st = ct_errf(err, CT_ERR_NOMEM, "out of memory listing %s", p);
    }
  }
  closedir(d);
  return st;
}

static ct_status local_list(ct_storage *s, const char *dir, ct_storage_list *out, ct_err *err) {
  size_t cap = 0;
  ct_status st = local_walk(s, dir, out, &cap, 0, err);
  if (!st) {
    pthread_mutex_lock(&s->stat_mu);
    s->stats.requests++;
    pthread_mutex_unlock(&s->stat_mu);
  }
  return st;
}

static const ct_storage_ops local_ops = {local_get_many, local_put,  NULL, local_head,
                                         local_del,      local_list, NULL};

ct_status ct_storage_open_local(const char *root, ct_storage **out, ct_err *err) {
  *out = NULL;
  if (!root || !root[0]) return ct_errf(err, CT_ERR_INVALID, "local storage: empty directory");
  ct_storage *s = calloc(1, sizeof *s);
  if (!s) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  size_t n = strlen(root);
  while (n > 1 && root[n - 1] == '/') n--;
  s->root = strndup(root, n);
  s->desc = strndup(root, n);
  s->ops = &local_ops;
  pthread_mutex_init(&s->stat_mu, NULL);
  if (!s->root || !s->desc) {
    ct_storage_free(s);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  *out = s;
  return CT_OK;
}

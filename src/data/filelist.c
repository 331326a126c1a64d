/* filelist.c: sorted key sets over JSON objects, and SimpleTuner's file lists
 * in output_dir (all_image_files_<id>.json, all_vae_cache_files_<id>.json,
 * all_text_cache_files_<id>.json: a JSON object {path: false}).
 *
 * The lists record what a finished discovery or cache build produced. They
 * are deleted when a run starts unless the dataset sets
 * preserve_data_backend_cache; with it, a listed image directory is not
 * walked again and listed cache entries are not read back to be validated
 * before training (they are still validated when a batch reads them, and
 * rebuilt then if bad). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctuner/fs.h"
#include "ctuner/log.h"
#include "data/data_int.h"

typedef struct kv {
  const char *k;
  const ct_json *v;
} kv;

static int cmp_kv(const void *a, const void *b) {
  return strcmp(((const kv *)a)->k, ((const kv *)b)->k);
}

ct_status ct_keyset_from_json(ct_json *obj, ct_keyset *s, ct_err *err) {
  memset(s, 0, sizeof *s);
  if (!obj || obj->type != CT_JSON_OBJECT) {
    ct_json_free(obj);
    return ct_errf(err, CT_ERR_FORMAT, "not a JSON object");
  }
  kv *a = malloc((obj->n + 1) * sizeof *a);
  if (!a) {
    ct_json_free(obj);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < obj->n; i++) a[i].k = obj->keys[i], a[i].v = &obj->items[i];
  qsort(a, obj->n, sizeof *a, cmp_kv);
  size_t k = 0;
  for (size_t i = 0; i < obj->n; i++) {
    if (k && !strcmp(a[k - 1].k, a[i].k)) continue; /* a duplicate key: one is enough for a set */
    a[k++] = a[i];
  }
  s->kv = a;
  s->n = k;
  s->owner = obj;
  return CT_OK;
}

const ct_json *ct_keyset_find(const ct_keyset *s, const char *key) {
  if (!s || !s->n) return NULL;
  const kv *a = s->kv;
  size_t lo = 0, hi = s->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(a[mid].k, key);
    if (!c) return a[mid].v;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

const char *ct_keyset_key(const ct_keyset *s, size_t i) {
  return ((const kv *)s->kv)[i].k;
}

void ct_keyset_free(ct_keyset *s) {
  if (!s) return;
  free(s->kv);
  ct_json_free(s->owner);
  memset(s, 0, sizeof *s);
}

int ct_keyset_load(const char *path, ct_keyset *s) {
  memset(s, 0, sizeof *s);
  ct_err e = {0};
  ct_json *j = NULL;
  ct_status st = ct_json_parse_file(path, (size_t)1 << 32, &j, &e);
  if (st == CT_ERR_NOT_FOUND) return 0;
  if (!st && (st = ct_keyset_from_json(j, s, &e))) ct_err_prefix(&e, "%s: ", path);
  if (st) {
    CT_WARN("%s; not used", e.msg);
    return 0;
  }
  return 1;
}

int ct_filelist_path(char *buf, size_t n, const char *outdir, const char *kind, const char *id) {
  return ct_pathf(buf, n, "%s/all_%s_files_%s.json", outdir, kind, id);
}

void ct_filelist_remove(const char *outdir, const char *kind, const char *id) {
  char p[4200];
  if (ct_filelist_path(p, sizeof p, outdir, kind, id)) return;
  if (unlink(p) == 0) CT_DEBUG("%s removed (preserve_data_backend_cache is off)", p);
}

ct_status ct_filelist_write(const char *outdir, const char *kind, const char *id,
                            const char *prefix, const char *const *keys, size_t n, int merge,
                            ct_err *err) {
  char p[4200];
  if (ct_filelist_path(p, sizeof p, outdir, kind, id))
    return ct_errf(err, CT_ERR_INVALID, "output_dir '%s' is too long for a file list path", outdir);
  ct_status st = ct_mkdir_p(outdir, err);
  if (st) return st;
  ct_keyset old = {0};
  if (merge) ct_keyset_load(p, &old);
  char *buf = NULL;
  size_t bn = 0;
  FILE *f = open_memstream(&buf, &bn);
  if (!f) {
    ct_keyset_free(&old);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  fputc('{', f);
  size_t w = 0;
  char full[8400];
  for (size_t i = 0; i < old.n; i++) { /* what an earlier writer of this run listed */
    fputs(w++ ? ",\n " : "\n ", f);
    ct_json_fput_str(f, ct_keyset_key(&old, i));
    fputs(": false", f);
  }
  for (size_t i = 0; i < n; i++) {
    snprintf(full, sizeof full, "%s%s", prefix ? prefix : "", keys[i]);
    if (old.n && ct_keyset_find(&old, full)) continue;
    fputs(w++ ? ",\n " : "\n ", f);
    ct_json_fput_str(f, full);
    fputs(": false", f);
  }
  fputs(w ? "\n}\n" : "}\n", f);
  fclose(f);
  ct_keyset_free(&old);
  st = buf ? ct_write_file_atomic(p, buf, bn, err) : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  free(buf);
  return st;
}

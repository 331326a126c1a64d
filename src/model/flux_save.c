/* Writing ctuner's MMDiT in diffusers' FluxTransformer2DModel layout
 * (config.json, diffusion_pytorch_model.safetensors or shards with their
 * index, as save_pretrained writes them) through the name map, atomically
 * (docs/flux.md).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/fs.h"
#include "ctuner/mmdit.h"
#include "ctuner/safetensors.h"

/* One diffusers tensor: its data (into the flat buffer, or an own copy) and shard. */
typedef struct out_t {
  const char *name;
  int ndim;
  int64_t shape[2];
  const float *data;
  float *own;
  size_t bytes;
  int shard;
} out_t;

/* The diffusers tensors of the map, in its order; pieces of one name gathered. */
static ct_status gather(const ct_mmdit *m, const ct_flux_name *map, size_t n, ct_dtype dt, out_t *o,
                        size_t *no, ct_err *err) {
  const float *w = ct_mmdit_params((ct_mmdit *)m);
  size_t k = 0;
  for (size_t i = 0; i < n; k++) {
    const ct_flux_name *e = &map[i];
    size_t j = i + 1, cols = e->cols ? (size_t)e->cols : 1;
    while (j < n && !strcmp(map[j].dif, e->dif)) j++;
    out_t *t = &o[k];
    memset(t, 0, sizeof *t);
    t->name = e->dif;
    t->ndim = e->cols ? 2 : 1;
    t->shape[0] = e->dif_rows;
    t->shape[1] = e->cols;
    t->bytes = (size_t)e->dif_rows * cols * ct_dtype_size(dt);
    const ct_param *p = ct_mmdit_find(m, e->bfl);
    if (j == i + 1 && e->dif_row == 0 && e->rows == e->dif_rows) {
      t->data = w + p->offset + (size_t)e->bfl_row * cols;
    } else {
      t->own = malloc((size_t)e->dif_rows * cols * sizeof(float));
      if (!t->own) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
      for (size_t q = i; q < j; q++)
        memcpy(t->own + (size_t)map[q].dif_row * cols,
               w + ct_mmdit_find(m, map[q].bfl)->offset + (size_t)map[q].bfl_row * cols,
               (size_t)map[q].rows * cols * sizeof(float));
      t->data = t->own;
    }
    i = j;
  }
  *no = k;
  return CT_OK;
}

static int by_name(const void *a, const void *b) {
  return strcmp((*(const out_t *const *)a)->name, (*(const out_t *const *)b)->name);
}

/* diffusion_pytorch_model.safetensors.index.json: total_size and the sorted weight_map. */
static ct_status write_index(const char *dir, out_t *o, size_t n, int nshards, ct_err *err) {
  ct_status st = CT_OK;
  size_t total = 0, cap = 256 + n * 200, len = 0;
  out_t **sorted = malloc(n * sizeof *sorted);
  char *s = malloc(cap), path[4096];
  if (!sorted || !s) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    sorted[i] = &o[i];
    total += o[i].bytes;
  }
  qsort(sorted, n, sizeof *sorted, by_name);
  len += (size_t)snprintf(
      s + len, cap - len,
      "{\n  \"metadata\": {\n    \"total_size\": %zu\n  },\n  \"weight_map\": {", total);
  for (size_t i = 0; i < n; i++)
    len += (size_t)snprintf(s + len, cap - len,
                            "%s\n    \"%s\": \"diffusion_pytorch_model-%05d-of-%05d.safetensors\"",
                            i ? "," : "", sorted[i]->name, sorted[i]->shard + 1, nshards);
  len += (size_t)snprintf(s + len, cap - len, "\n  }\n}\n");
  if (ct_pathf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors.index.json", dir))
    st = ct_errf(err, CT_ERR_INVALID, "%s: path too long", dir);
  else
    st = ct_write_file_atomic(path, s, len, err);
out:
  free(sorted);
  free(s);
  return st;
}

static ct_status write_shards(const char *dir, out_t *o, size_t n, int nshards, ct_dtype dt,
                              ct_err *err) {
  ct_status st = CT_OK;
  char path[4096];
  for (int sh = 0; sh < nshards && !st; sh++) {
    ct_st_writer *w = NULL;
    if (ct_st_writer_new(&w)) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n && !st; i++)
      if (o[i].shard == sh)
        st = ct_st_writer_add_f32(w, o[i].name, o[i].ndim, o[i].shape, o[i].data, dt, err);
    if (!st) st = ct_st_writer_meta(w, "format", "pt", err);
    int bad =
        nshards == 1
            ? ct_pathf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir)
            : ct_pathf(path, sizeof path, "%s/diffusion_pytorch_model-%05d-of-%05d.safetensors",
                       dir, sh + 1, nshards);
    if (!st && bad) st = ct_errf(err, CT_ERR_INVALID, "%s: path too long", dir);
    if (!st) st = ct_st_writer_write(w, path, err);
    ct_st_writer_free(w);
  }
  if (!st && nshards > 1) st = write_index(dir, o, n, nshards, err);
  return st;
}

/* dir must not exist or be an empty directory (removed before the rename). */
static ct_status check_target(const char *dir, ct_err *err) {
  struct stat sb;
  if (stat(dir, &sb)) return CT_OK;
  if (!S_ISDIR(sb.st_mode) || rmdir(dir))
    return ct_errf(err, CT_ERR_INVALID,
                   "%s exists and is not an empty directory; ctuner writes a transformer "
                   "directory only where none is",
                   dir);
  return CT_OK;
}

ct_status ct_mmdit_save_diffusers(const ct_mmdit *m, const char *dir, size_t max_shard_bytes,
                                  ct_dtype dt, ct_err *err) {
  ct_flux_name *map = NULL;
  out_t *o = NULL;
  size_t n = 0, no = 0;
  char tmp[4096], path[4096], *cfg = NULL;
  ct_status st = CT_OK;
  if (!ct_mmdit_params((ct_mmdit *)m))
    return ct_errf(err, CT_ERR_INVALID, "%s: the model's parameters are sharded; gather them first",
                   dir);
  if (dt != CT_DTYPE_F32 && dt != CT_DTYPE_F16 && dt != CT_DTYPE_BF16)
    return ct_errf(err, CT_ERR_INVALID, "save dtype must be F32, F16 or BF16");
  if (ct_pathf(tmp, sizeof tmp, "%s.tmp.%d", dir, (int)getpid()) ||
      ct_pathf(path, sizeof path, "%s/config.json", tmp))
    return ct_errf(err, CT_ERR_INVALID, "%s: path too long", dir);
  if ((st = ct_flux_config_json(ct_mmdit_cfg(m), &cfg, err))) goto out;
  if ((st = ct_flux_name_map(ct_mmdit_cfg(m), &map, &n, err))) goto out;
  o = calloc(n, sizeof *o);
  if (!o) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    goto out;
  }
  if ((st = gather(m, map, n, dt, o, &no, err))) goto out;
  int shard = 0;
  size_t used = 0;
  for (size_t i = 0; i < no; i++) { /* greedy, in order, as save_pretrained */
    if (max_shard_bytes && used && used + o[i].bytes > max_shard_bytes) {
      shard++;
      used = 0;
    }
    o[i].shard = shard;
    used += o[i].bytes;
  }
  if ((st = ct_rm_rf(tmp, err)) || (st = ct_mkdir_p(tmp, err))) goto out;
  if ((st = ct_write_file_atomic(path, cfg, strlen(cfg), err))) goto out;
  if ((st = write_shards(tmp, o, no, shard + 1, dt, err))) goto out;
  if ((st = ct_fsync_dir(tmp, err)) || (st = check_target(dir, err))) goto out;
  if (rename(tmp, dir)) {
    st = ct_errf(err, CT_ERR_IO, "cannot rename %s to %s: %s", tmp, dir, strerror(errno));
    goto out;
  }
  char parent[4096];
  snprintf(parent, sizeof parent, "%s", dir);
  char *slash = strrchr(parent, '/');
  if (slash && slash != parent)
    *slash = 0;
  else
    snprintf(parent, sizeof parent, "%s", slash ? "/" : ".");
  st = ct_fsync_dir(parent, err);
out:
  if (st) {
    ct_err e2;
    ct_rm_rf(tmp, &e2);
  }
  for (size_t i = 0; o && i < no; i++) free(o[i].own);
  free(o);
  free(map);
  free(cfg);
  return st;
}

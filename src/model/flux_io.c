/* diffusers' FluxTransformer2DModel on disk: load a transformer directory
 * (config.json + diffusion_pytorch_model.safetensors, or shards and their
 * index) into ctuner's flat buffer through the name map (flux_names.c), write
 * one back in the same layout, and describe a BFL single file as a config.
 * Errors name the file and every tensor at fault at once (docs/flux.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/mmdit.h"
#include "ctuner/safetensors.h"

#define ST_NAME "diffusion_pytorch_model.safetensors"
#define INDEX_NAME "diffusion_pytorch_model.safetensors.index.json"
#define LIST_CAP 4096

/* The tensors of a transformer directory: one file, or shards behind an index. */
typedef struct src {
  size_t nf;
  ct_st_file **f;
  char **fname; /* as written in the index (basenames) */
  ct_json *index;
  const ct_json *wmap; /* index's weight_map, or NULL for one file */
} src;

static void src_close(src *s) {
  for (size_t i = 0; i < s->nf; i++) {
    ct_st_close(s->f[i]);
    free(s->fname[i]);
  }
  free(s->f);
  free(s->fname);
  ct_json_free(s->index);
  memset(s, 0, sizeof *s);
}

static ct_status src_add(src *s, const char *dir, const char *name, ct_err *err) {
  char path[4096];
  ct_st_file **nf = realloc(s->f, (s->nf + 1) * sizeof *nf);
  if (nf) s->f = nf;
  char **nn = realloc(s->fname, (s->nf + 1) * sizeof *nn);
  if (nn) s->fname = nn;
  if (!nf || !nn) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  if (ct_pathf(path, sizeof path, "%s/%s", dir, name))
    return ct_errf(err, CT_ERR_INVALID, "%s: path too long", dir);
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

static ct_status src_open_index(src *s, const char *dir, const char *ipath, ct_err *err) {
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
    if (k == s->nf && (st = src_add(s, dir, v->str, err))) return st;
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
                       "%s: %s of %s is not in the weight_map (or is mapped "
                       "to another shard)",
                       ipath, s->f[k]->tensors[i].name, s->fname[k]);
    }
  return CT_OK;
}

/* dir: a transformer directory, or one .safetensors file with diffusers' names. */
static ct_status src_open(src *s, const char *dir, ct_err *err) {
  char ipath[4096], spath[4096];
  struct stat sb;
  memset(s, 0, sizeof *s);
  if (stat(dir, &sb))
    return ct_errf(err, CT_ERR_NOT_FOUND,
                   "%s does not exist (ctuner does not download; fetch it "
                   "with huggingface-cli download REPO --local-dir X and pass X)",
                   dir);
  if (S_ISREG(sb.st_mode)) {
    s->f = calloc(1, sizeof *s->f);
    s->fname = calloc(1, sizeof *s->fname);
    if (!s->f || !s->fname || !(s->fname[0] = strdup(dir)))
      return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    s->nf = 1;
    return ct_st_open(dir, &s->f[0], err);
  }
  if (ct_pathf(ipath, sizeof ipath, "%s/%s", dir, INDEX_NAME) ||
      ct_pathf(spath, sizeof spath, "%s/%s", dir, ST_NAME))
    return ct_errf(err, CT_ERR_INVALID, "%s: path too long", dir);
  if (!stat(ipath, &sb)) return src_open_index(s, dir, ipath, err);
  if (stat(spath, &sb))
    return ct_errf(err, CT_ERR_NOT_FOUND, "%s has neither %s nor %s", dir, ST_NAME, INDEX_NAME);
  return src_add(s, dir, ST_NAME, err);
}

static const ct_st_tensor *src_find(const src *s, const char *name, const char **file) {
  size_t k = 0;
  if (s->wmap) {
    const ct_json *v = ct_json_get(s->wmap, name);
    if (!v) return NULL;
    while (k < s->nf && strcmp(s->fname[k], v->str)) k++;
    if (k == s->nf) return NULL;
  }
  *file = s->fname[k];
  return ct_st_find(s->f[k], name);
}

static void list_add(char *buf, int *count, const char *item) {
  size_t len = strlen(buf);
  if (len + strlen(item) + 40 < LIST_CAP)
    snprintf(buf + len, LIST_CAP - len, "%s%s", *count ? ", " : "", item);
  else if (len + 8 < LIST_CAP && !strstr(buf, ", ..."))
    snprintf(buf + len, LIST_CAP - len, ", ...");
  (*count)++;
}

static int in_map(const ct_flux_name *map, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(map[i].dif, name)) return 1;
  return 0;
}

/* Every diffusers tensor the map needs is there with its shape and a float
 * dtype, and nothing else is: else one error listing all of them. */
static ct_status check_tensors(const src *s, const char *dir, const ct_flux_name *map, size_t n,
                               ct_err *err) {
  ct_status st = CT_OK;
  char *miss = calloc(3, LIST_CAP), *wrong = miss + LIST_CAP, *extra = wrong + LIST_CAP;
  int nm = 0, nw = 0, nx = 0;
  if (!miss) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    const ct_flux_name *e = &map[i];
    if (i && !strcmp(map[i - 1].dif, e->dif)) continue;
    const char *file = "";
    const ct_st_tensor *t = src_find(s, e->dif, &file);
    if (!t) {
      list_add(miss, &nm, e->dif);
      continue;
    }
    int nd = e->cols ? 2 : 1;
    if (t->ndim != nd || t->shape[0] != e->dif_rows || (nd == 2 && t->shape[1] != e->cols) ||
        (t->dtype != CT_DTYPE_F32 && t->dtype != CT_DTYPE_F16 && t->dtype != CT_DTYPE_BF16)) {
      char item[400], got[96] = "";
      size_t gl = 0;
      for (int k = 0; k < t->ndim && gl < 80; k++)
        gl += snprintf(got + gl, sizeof got - gl, "%s%lld", k ? ", " : "", (long long)t->shape[k]);
      if (nd == 2)
        snprintf(item, sizeof item, "%s in %s (has %s [%s], needs F32/F16/BF16 [%lld, %lld])",
                 e->dif, file, ct_dtype_name(t->dtype), got, (long long)e->dif_rows,
                 (long long)e->cols);
      else
        snprintf(item, sizeof item, "%s in %s (has %s [%s], needs F32/F16/BF16 [%lld])", e->dif,
                 file, ct_dtype_name(t->dtype), got, (long long)e->dif_rows);
      list_add(wrong, &nw, item);
    }
  }
  for (size_t k = 0; k < s->nf; k++)
    for (size_t i = 0; i < s->f[k]->ntensors; i++)
      if (!in_map(map, n, s->f[k]->tensors[i].name)) {
        char item[400];
        snprintf(item, sizeof item, "%s in %s", s->f[k]->tensors[i].name, s->fname[k]);
        list_add(extra, &nx, item);
      }
  if (nm || nw || nx)
    st = ct_errf(err, CT_ERR_SHAPE,
                 "%s does not match its config.json: %d missing%s%s%s; %d wrongly shaped%s%s%s; "
                 "%d unexpected%s%s%s",
                 dir, nm, nm ? " [" : "", miss, nm ? "]" : "", nw, nw ? " [" : "", wrong,
                 nw ? "]" : "", nx, nx ? " [" : "", extra, nx ? "]" : "");
  free(miss);
  return st;
}

static int cfg_equal(const ct_mmdit_config *a, const ct_mmdit_config *b) {
  return a->in_channels == b->in_channels && a->patch == b->patch && a->hidden == b->hidden &&
         a->heads == b->heads && a->axes_dim[0] == b->axes_dim[0] &&
         a->axes_dim[1] == b->axes_dim[1] && a->axes_dim[2] == b->axes_dim[2] &&
         a->depth_double == b->depth_double && a->depth_single == b->depth_single &&
         a->mlp_ratio == b->mlp_ratio && a->context_in_dim == b->context_in_dim &&
         a->vec_in_dim == b->vec_in_dim && a->qkv_bias == b->qkv_bias &&
         a->guidance_embed == b->guidance_embed && a->theta == b->theta;
}

/* dir's config.json (when dir is a directory) must describe c. */
static ct_status check_dir_config(const ct_mmdit_config *c, const char *dir, ct_err *err) {
  struct stat sb;
  if (stat(dir, &sb) || !S_ISDIR(sb.st_mode)) return CT_OK;
  char cpath[4096];
  ct_mmdit_config dc;
  if (ct_pathf(cpath, sizeof cpath, "%s/config.json", dir))
    return ct_errf(err, CT_ERR_INVALID, "%s: path too long", dir);
  ct_status st = ct_flux_config_read(cpath, &dc, err);
  if (st) return st;
  if (!cfg_equal(&dc, c))
    return ct_errf(err, CT_ERR_SHAPE, "%s describes another model than the one being loaded",
                   cpath);
  return CT_OK;
}

ct_status ct_flux_check_diffusers(const ct_mmdit_config *c, const char *dir, ct_err *err) {
  ct_flux_name *map = NULL;
  size_t n = 0;
  src s = {0};
  ct_status st = check_dir_config(c, dir, err);
  if (!st) st = ct_flux_name_map(c, &map, &n, err);
  if (!st) st = src_open(&s, dir, err);
  if (!st) st = check_tensors(&s, dir, map, n, err);
  src_close(&s);
  free(map);
  return st;
}

ct_status ct_mmdit_load_diffusers_range(const ct_mmdit *m, const char *dir, size_t lo, size_t hi,
                                        float *out, ct_err *err) {
  const ct_mmdit_config *c = ct_mmdit_cfg(m);
  ct_flux_name *map = NULL;
  size_t n = 0;
  src s = {0};
  ct_status st = check_dir_config(c, dir, err);
  if (st) return st;
  if ((st = ct_flux_name_map(c, &map, &n, err))) goto out;
  if ((st = src_open(&s, dir, err))) goto out;
  if ((st = check_tensors(&s, dir, map, n, err))) goto out;
  for (size_t i = 0; i < n && !st; i++) { /* each row range, cut to [lo, hi) */
    const ct_flux_name *e = &map[i];
    const char *file;
    const ct_param *p = ct_mmdit_find(m, e->bfl);
    const size_t cols = e->cols ? (size_t)e->cols : 1;
    const size_t a = p->offset + (size_t)e->bfl_row * cols, b = a + (size_t)e->rows * cols;
    const size_t a2 = a > lo ? a : lo, b2 = b < hi ? b : hi;
    if (a2 >= b2) continue;
    st = ct_st_to_f32_range(src_find(&s, e->dif, &file), (size_t)e->dif_row * cols + (a2 - a),
                            b2 - a2, out + (a2 - lo), err);
  }
out:
  src_close(&s);
  free(map);
  return st;
}

ct_status ct_mmdit_load_diffusers(ct_mmdit *m, const char *dir, ct_err *err) {
  float *w = ct_mmdit_params(m);
  if (!w) return ct_errf(err, CT_ERR_INVALID, "%s: the model's parameters are sharded", dir);
  return ct_mmdit_load_diffusers_range(m, dir, 0, ct_mmdit_numel(m), w, err);
}

ct_status ct_mmdit_open_diffusers(const char *dir, int flags, ct_mmdit **out, ct_err *err) {
  char cpath[4096];
  ct_mmdit_config c;
  ct_mmdit *m = NULL;
  if (ct_pathf(cpath, sizeof cpath, "%s/config.json", dir))
    return ct_errf(err, CT_ERR_INVALID, "%s: path too long", dir);
  ct_status st = ct_flux_config_read(cpath, &c, err);
  if (!st) st = ct_mmdit_new(&c, 0, flags, &m, err);
  if (!st) st = ct_mmdit_load_diffusers(m, dir, err);
  if (st) {
    ct_mmdit_free(m);
    m = NULL;
  }
  *out = m;
  return st;
}

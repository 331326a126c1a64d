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

static int in_map(const ct_flux_name *map, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(map[i].dif, name)) return 1;
  return 0;
}

/* Every diffusers tensor the map needs is there with its shape and a float
 * dtype, and nothing else is: else one error listing all of them. */
static ct_status check_tensors(const ct_st_set *s, const char *dir, const ct_flux_name *map,
                               size_t n, ct_err *err) {
  ct_st_check *chk = NULL;
  ct_status st = ct_st_check_new(&chk, err);
  if (st) return st;
  for (size_t i = 0; i < n; i++) {
    const ct_flux_name *e = &map[i];
    if (i && !strcmp(map[i - 1].dif, e->dif)) continue;
    const char *file = "";
    const ct_st_tensor *t = ct_st_set_find(s, e->dif, &file);
    int64_t shape[2] = {e->dif_rows, e->cols};
    ct_st_check_tensor(chk, t, e->dif, file, e->cols ? 2 : 1, shape);
  }
  for (size_t k = 0; k < s->nf; k++)
    for (size_t i = 0; i < s->f[k]->ntensors; i++)
      if (!in_map(map, n, s->f[k]->tensors[i].name))
        ct_st_check_unexpected(chk, s->f[k]->tensors[i].name, s->fname[k]);
  return ct_st_check_done(chk, err, "%s does not match its config.json", dir);
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
  ct_st_set s = {0};
  ct_status st = check_dir_config(c, dir, err);
  if (!st) st = ct_flux_name_map(c, &map, &n, err);
  if (!st) st = ct_st_set_open(&s, dir, ST_NAME, err);
  if (!st) st = check_tensors(&s, dir, map, n, err);
  ct_st_set_close(&s);
  free(map);
  return st;
}

ct_status ct_mmdit_load_diffusers_range(const ct_mmdit *m, const char *dir, size_t lo, size_t hi,
                                        float *out, ct_err *err) {
  const ct_mmdit_config *c = ct_mmdit_cfg(m);
  ct_flux_name *map = NULL;
  size_t n = 0;
  ct_st_set s = {0};
  ct_status st = check_dir_config(c, dir, err);
  if (st) return st;
  if ((st = ct_flux_name_map(c, &map, &n, err))) goto out;
  if ((st = ct_st_set_open(&s, dir, ST_NAME, err))) goto out;
  if ((st = check_tensors(&s, dir, map, n, err))) goto out;
  for (size_t i = 0; i < n && !st; i++) { /* each row range, cut to [lo, hi) */
    const ct_flux_name *e = &map[i];
    const char *file;
    const ct_param *p = ct_mmdit_find(m, e->bfl);
    const size_t cols = e->cols ? (size_t)e->cols : 1;
    const size_t a = p->offset + (size_t)e->bfl_row * cols, b = a + (size_t)e->rows * cols;
    const size_t a2 = a > lo ? a : lo, b2 = b < hi ? b : hi;
    if (a2 >= b2) continue;
    st = ct_st_to_f32_range(ct_st_set_find(&s, e->dif, &file), (size_t)e->dif_row * cols + (a2 - a),
                            b2 - a2, out + (a2 - lo), err);
  }
out:
  ct_st_set_close(&s);
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

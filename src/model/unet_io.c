/* unet_io.c: the U-net's weights on disk in diffusers' layout
 * (diffusion_pytorch_model.safetensors, one file or sharded with its
 * .index.json) and unet/config.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/safetensors.h"
#include "unet_int.h"

#define ST_NAME "diffusion_pytorch_model.safetensors"

static int in_table(const ct_unet *u, const char *name) {
  for (size_t i = 0; i < u->np; i++)
    if (!strcmp(u->params[i].name, name)) return 1;
  return 0;
}

static ct_status check(const ct_unet *u, const ct_st_set *s, const char *path, ct_err *err) {
  ct_st_check *chk = NULL;
  ct_status st = ct_st_check_new(&chk, err);
  if (st) return st;
  for (size_t i = 0; i < u->np; i++) {
    const char *file = "";
    const ct_unet_param *p = &u->params[i];
    ct_st_check_tensor(chk, ct_st_set_find(s, p->name, &file), p->name, file, p->ndim, p->shape);
  }
  for (size_t k = 0; k < s->nf; k++)
    for (size_t i = 0; i < s->f[k]->ntensors; i++)
      if (!in_table(u, s->f[k]->tensors[i].name))
        ct_st_check_unexpected(chk, s->f[k]->tensors[i].name, s->fname[k]);
  return ct_st_check_done(chk, err, "%s does not match the U-net of its config.json", path);
}

ct_status ct_unet_load(ct_unet *u, const char *path, ct_err *err) {
  ct_st_set s = {0};
  ct_status st = ct_st_set_open(&s, path, ST_NAME, err);
  if (st) return st;
  st = check(u, &s, path, err);
  size_t big = 1;
  for (size_t i = 0; i < u->np; i++) big = u->params[i].numel > big ? u->params[i].numel : big;
  float *h = st ? NULL : malloc(big * sizeof(float));
  if (!st && !h) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; !st && i < u->np; i++) {
    const ct_unet_param *p = &u->params[i];
    st = ct_st_to_f32(ct_st_set_find(&s, p->name, NULL), h, p->numel, err);
    if (!st) u->be->copy_in(u->w + p->offset, h, p->numel * sizeof(float));
  }
  free(h);
  ct_st_set_close(&s);
  return st;
}

/* the weights read from the host: u->w itself when the host can (the CPU
 * backend, or a host copy swapped in), else a copy (*own) */
ct_status ct_unet_save(const ct_unet *u, const char *path, ct_err *err) {
  const int direct = u->be->host_memory || u->swapped;
  float *own = direct ? NULL : malloc((u->numel ? u->numel : 1) * sizeof(float));
  const float *h = direct ? u->w : own;
  ct_st_writer *w = NULL;
  if ((!direct && !own) || ct_st_writer_new(&w)) {
    free(own);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  if (own) u->be->copy_out(own, u->w, u->numel * sizeof(float));
  ct_status st = CT_OK;
  for (size_t i = 0; !st && i < u->np; i++) {
    const ct_unet_param *p = &u->params[i];
    st = ct_st_writer_add_f32(w, p->name, p->ndim, p->shape, h + p->offset, CT_DTYPE_F32, err);
  }
  if (!st) st = ct_st_writer_meta(w, "format", "pt", err);
  if (!st) st = ct_st_writer_write(w, path, err);
  ct_st_writer_free(w);
  free(own);
  return st;
}

ct_status ct_unet_from_pretrained(const char *dir, ct_unet **out, ct_err *err) {
  *out = NULL;
  char cfgp[4200];
  snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
  ct_unet_config c;
  ct_status st = ct_unet_config_load(cfgp, &c, err);
  if (!st) st = ct_unet_new(&c, 0, out, err);
  if (!st) st = ct_unet_load(*out, dir, err);
  if (st) {
    ct_unet_free(*out);
    *out = NULL;
  }
  return st;
}

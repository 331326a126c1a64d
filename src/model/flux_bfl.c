/* A BFL single file (flux1-dev.safetensors names, as ComfyUI and BFL ship the
 * transformer) described as a ct_mmdit_config from its tensor shapes, so it
 * can be loaded with ct_mmdit_load and converted to diffusers' layout
 * (`ctuner model convert`, docs/flux.md). The RoPE split (axes) shows in no
 * shape: the caller gives it, or FLUX.1's 16,56,56 is taken for head_dim 128.
 */
#include <stdio.h>
#include <string.h>

#include "ctuner/mmdit.h"
#include "ctuner/safetensors.h"

static const ct_st_tensor *get(const ct_st_file *f, const char *prefix, const char *name) {
  char full[256];
  snprintf(full, sizeof full, "%s%s", prefix, name);
  return ct_st_find(f, full);
}

static int count_blocks(const ct_st_file *f, const char *prefix, const char *fmt) {
  char n[128];
  int k = 0;
  for (;; k++) {
    snprintf(n, sizeof n, fmt, k);
    if (!get(f, prefix, n)) return k;
  }
}

static ct_status read_shapes(const ct_st_file *f, const char *path, const char *px,
                             ct_mmdit_config *c, int *hd, ct_err *err) {
  const ct_st_tensor *img = get(f, px, "img_in.weight"), *txt = get(f, px, "txt_in.weight"),
                     *vec = get(f, px, "vector_in.in_layer.weight"), *qn = NULL, *mlp = NULL;
  if (!img || !txt || !vec || img->ndim != 2 || txt->ndim != 2 || vec->ndim != 2)
    return ct_errf(err, CT_ERR_FORMAT,
                   "%s: not a BFL Flux transformer (needs 2-D img_in.weight, txt_in.weight and "
                   "vector_in.in_layer.weight)",
                   path);
  c->hidden = (int)img->shape[0];
  c->in_channels = (int)(img->shape[1] / 4);
  c->context_in_dim = (int)txt->shape[1];
  c->vec_in_dim = (int)vec->shape[1];
  c->depth_double = count_blocks(f, px, "double_blocks.%d.img_mod.lin.weight");
  c->depth_single = count_blocks(f, px, "single_blocks.%d.modulation.lin.weight");
  c->guidance_embed = get(f, px, "guidance_in.in_layer.weight") != NULL;
  if (c->depth_double) {
    qn = get(f, px, "double_blocks.0.img_attn.norm.query_norm.scale");
    mlp = get(f, px, "double_blocks.0.img_mlp.0.weight");
    if (mlp) c->mlp_ratio = (int)(mlp->shape[0] / c->hidden);
  } else if (c->depth_single) {
    qn = get(f, px, "single_blocks.0.norm.query_norm.scale");
    mlp = get(f, px, "single_blocks.0.linear1.weight");
    if (mlp) c->mlp_ratio = (int)((mlp->shape[0] - 3 * c->hidden) / c->hidden);
  }
  if (!qn || qn->ndim != 1 || qn->shape[0] < 2 || !mlp)
    return ct_errf(err, CT_ERR_FORMAT,
                   "%s: cannot tell the head size (no block 0 query_norm.scale or mlp weight)",
                   path);
  *hd = (int)qn->shape[0];
  c->heads = c->hidden / *hd;
  return CT_OK;
}

ct_status ct_flux_bfl_config(const char *path, const int *axes, ct_mmdit_config *c, char *prefix,
                             size_t prefix_cap, ct_err *err) {
  ct_st_file *f = NULL;
  int hd = 0;
  static const char *const px_try[] = {"", "model.diffusion_model."};
  const char *px = NULL;
  ct_status st = ct_st_open(path, &f, err);
  if (st) return st;
  for (int i = 0; i < 2 && !px; i++)
    if (get(f, px_try[i], "img_in.weight")) px = px_try[i];
  memset(c, 0, sizeof *c);
  c->patch = 2;
  c->qkv_bias = 1;
  c->theta = 10000.f;
  st = read_shapes(f, path, px ? px : "", c, &hd, err);
  if (st) goto out;
  if (axes) {
    memcpy(c->axes_dim, axes, 3 * sizeof(int));
  } else if (hd == 128) {
    c->axes_dim[0] = 16;
    c->axes_dim[1] = c->axes_dim[2] = 56;
  } else {
    st = ct_errf(err, CT_ERR_INVALID,
                 "%s: head_dim is %d, not FLUX.1's 128: give the RoPE split (axes_dims_rope, "
                 "three even numbers summing to %d)",
                 path, hd, hd);
    goto out;
  }
  st = ct_mmdit_config_validate(c, err);
  if (st) {
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    st = ct_errf(err, st, "%s: %s", path, msg);
    goto out;
  }
  snprintf(prefix, prefix_cap, "%s", px ? px : "");
out:
  ct_st_close(f);
  return st;
}

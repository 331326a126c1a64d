/* unet_params.c: the U-net's parameter table in diffusers' names and
 * registration order (UNet2DConditionModel.__init__: conv_in,
 * time_embedding, add_embedding, down_blocks, up_blocks, mid_block,
 * conv_norm_out, conv_out; unet_2d_blocks.py, resnet.py,
 * transformer_2d.py, attention.py), allocation and initialisation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/rng.h"
#include "unet_int.h"

static ct_status add(ct_unet *u, const char *pre, const char *suf, int ndim, const int64_t *shape,
                     size_t *off, ct_err *err) {
  if (u->np == u->cap) {
    size_t nc = u->cap ? u->cap * 2 : 512;
    ct_unet_param *np = realloc(u->params, nc * sizeof *np);
    if (!np) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    u->params = np, u->cap = nc;
  }
  ct_unet_param *p = &u->params[u->np++];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%.96s%s", pre, suf);
  p->ndim = ndim;
  p->numel = 1;
  for (int i = 0; i < ndim; i++) p->shape[i] = shape[i], p->numel *= (size_t)shape[i];
  p->offset = u->numel;
  u->numel += p->numel;
  *off = p->offset;
  return CT_OK;
}

static ct_status add_conv(ct_unet *u, const char *pre, int cin, int cout, int k, uconv *c,
                          ct_err *err) {
  const int64_t ws[4] = {cout, cin, k, k}, bs[1] = {cout};
  c->cin = cin, c->cout = cout, c->k = k;
  ct_status st = add(u, pre, ".weight", 4, ws, &c->w, err);
  return st ? st : add(u, pre, ".bias", 1, bs, &c->b, err);
}

static ct_status add_norm(ct_unet *u, const char *pre, int C, unorm *n, ct_err *err) {
  const int64_t s[1] = {C};
  n->C = C;
  ct_status st = add(u, pre, ".weight", 1, s, &n->g, err);
  return st ? st : add(u, pre, ".bias", 1, s, &n->b, err);
}

/* conv1x1: the weight stored (out, in, 1, 1) (proj_in/proj_out without
 * use_linear_projection); the same floats as a Linear's (out, in) */
static ct_status add_lin(ct_unet *u, const char *pre, int in, int out, int bias, int conv1x1,
                         ulin *l, ct_err *err) {
  const int64_t ws[4] = {out, in, 1, 1}, bs[1] = {out};
  l->in = in, l->out = out, l->b = UNET_NO_BIAS;
  ct_status st = add(u, pre, ".weight", conv1x1 ? 4 : 2, ws, &l->w, err);
  return st || !bias ? st : add(u, pre, ".bias", 1, bs, &l->b, err);
}

static ct_status add_res(ct_unet *u, const char *pre, int cin, int cout, ures *r, ct_err *err) {
  char n[112];
  r->cin = cin, r->cout = cout, r->has_sc = cin != cout;
  const int temb = 4 * u->cfg.block_out_channels[0];
  ct_status st = CT_OK;
  snprintf(n, sizeof n, "%.90s.norm1", pre);
  if (!st) st = add_norm(u, n, cin, &r->n1, err);
  snprintf(n, sizeof n, "%.90s.conv1", pre);
  if (!st) st = add_conv(u, n, cin, cout, 3, &r->c1, err);
  snprintf(n, sizeof n, "%.90s.time_emb_proj", pre);
  if (!st) st = add_lin(u, n, temb, cout, 1, 0, &r->temb, err);
  snprintf(n, sizeof n, "%.90s.norm2", pre);
  if (!st) st = add_norm(u, n, cout, &r->n2, err);
  snprintf(n, sizeof n, "%.90s.conv2", pre);
  if (!st) st = add_conv(u, n, cout, cout, 3, &r->c2, err);
  snprintf(n, sizeof n, "%.90s.conv_shortcut", pre);
  if (!st && r->has_sc) st = add_conv(u, n, cin, cout, 1, &r->sc, err);
  return st;
}

static ct_status add_attn(ct_unet *u, const char *pre, int C, int kv, uattn *a, ct_err *err) {
  char n[112];
  static const char *const nm[4] = {"to_q", "to_k", "to_v", "to_out.0"};
  ulin *l[4] = {&a->q, &a->k, &a->v, &a->o};
  ct_status st = CT_OK;
  for (int i = 0; !st && i < 4; i++) {
    snprintf(n, sizeof n, "%.90s.%s", pre, nm[i]);
    st = add_lin(u, n, i == 1 || i == 2 ? kv : C, C, i == 3, 0, l[i], err);
  }
  return st;
}

static ct_status add_blk(ct_unet *u, const char *pre, int C, ublk *b, ct_err *err) {
  char n[112];
  ct_status st = CT_OK;
  unorm *norms[3] = {&b->n1, &b->n2, &b->n3};
  for (int i = 0; !st && i < 3; i++) {
    snprintf(n, sizeof n, "%.90s.norm%d", pre, i + 1);
    st = add_norm(u, n, C, norms[i], err);
    if (st || i == 2) break;
    snprintf(n, sizeof n, "%.90s.attn%d", pre, i + 1);
    st = add_attn(u, n, C, i ? u->cfg.cross_attention_dim : C, i ? &b->a2 : &b->a1, err);
  }
  /* registration order is norm1, attn1, norm2, attn2, norm3, ff */
  snprintf(n, sizeof n, "%.90s.ff.net.0.proj", pre);
  if (!st) st = add_lin(u, n, C, 8 * C, 1, 0, &b->ff1, err);
  snprintf(n, sizeof n, "%.90s.ff.net.2", pre);
  if (!st) st = add_lin(u, n, 4 * C, C, 1, 0, &b->ff2, err);
  return st;
}

static ct_status add_xf(ct_unet *u, const char *pre, int C, int heads, int layers, uxf *x,
                        ct_err *err) {
  char n[112];
  const int conv = !u->cfg.use_linear_projection;
  x->C = C, x->heads = heads, x->nblk = layers;
  x->blk = calloc((size_t)layers, sizeof *x->blk);
  if (!x->blk) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  snprintf(n, sizeof n, "%.90s.norm", pre);
  ct_status st = add_norm(u, n, C, &x->norm, err);
  snprintf(n, sizeof n, "%.90s.proj_in", pre);
  if (!st) st = add_lin(u, n, C, C, 1, conv, &x->pin, err);
  for (int i = 0; !st && i < layers; i++) {
    snprintf(n, sizeof n, "%.80s.transformer_blocks.%d", pre, i);
    st = add_blk(u, n, C, &x->blk[i], err);
  }
  snprintf(n, sizeof n, "%.90s.proj_out", pre);
  if (!st) st = add_lin(u, n, C, C, 1, conv, &x->pout, err);
  return st;
}

static ct_status add_down(ct_unet *u, int i, ct_err *err) {
  const ct_unet_config *c = &u->cfg;
  ublock *b = &u->down[i];
  const int out = c->block_out_channels[i], in = i ? c->block_out_channels[i - 1] : out;
  char pre[112];
  ct_status st = CT_OK;
  b->nres = c->layers_per_block, b->cross = c->down_cross[i], b->has_sampler = i < c->nblocks - 1;
  for (int j = 0; !st && b->cross && j < b->nres; j++) {
    snprintf(pre, sizeof pre, "down_blocks.%d.attentions.%d", i, j);
    st = add_xf(u, pre, out, c->heads[i], c->transformer_layers[i], &b->attn[j], err);
  }
  for (int j = 0; !st && j < b->nres; j++) {
    snprintf(pre, sizeof pre, "down_blocks.%d.resnets.%d", i, j);
    st = add_res(u, pre, j ? out : in, out, &b->res[j], err);
  }
  snprintf(pre, sizeof pre, "down_blocks.%d.downsamplers.0.conv", i);
  if (!st && b->has_sampler) st = add_conv(u, pre, out, out, 3, &b->sampler, err);
  return st;
}

/* up block i (deepest first): diffusers' reversed channels, heads, layers */
static ct_status add_up(ct_unet *u, int i, ct_err *err) {
  const ct_unet_config *c = &u->cfg;
  const int n = c->nblocks, r = n - 1 - i; /* the down block it mirrors */
  ublock *b = &u->up[i];
  const int out = c->block_out_channels[r], prev = c->block_out_channels[i ? r + 1 : r];
  const int skip_in = c->block_out_channels[r > 0 ? r - 1 : 0];
  char pre[112];
  ct_status st = CT_OK;
  b->nres = c->layers_per_block + 1, b->cross = c->up_cross[i], b->has_sampler = i < n - 1;
  for (int j = 0; !st && b->cross && j < b->nres; j++) {
    snprintf(pre, sizeof pre, "up_blocks.%d.attentions.%d", i, j);
    st = add_xf(u, pre, out, c->heads[r], c->transformer_layers[r], &b->attn[j], err);
  }
  for (int j = 0; !st && j < b->nres; j++) {
    const int res_skip = j == b->nres - 1 ? skip_in : out, rin = j ? out : prev;
    snprintf(pre, sizeof pre, "up_blocks.%d.resnets.%d", i, j);
    st = add_res(u, pre, rin + res_skip, out, &b->res[j], err);
  }
  snprintf(pre, sizeof pre, "up_blocks.%d.upsamplers.0.conv", i);
  if (!st && b->has_sampler) st = add_conv(u, pre, out, out, 3, &b->sampler, err);
  return st;
}

ct_status ct_unet_build(ct_unet *u, ct_err *err) {
  const ct_unet_config *c = &u->cfg;
  const int c0 = c->block_out_channels[0], temb = 4 * c0, n = c->nblocks;
  const int top = c->block_out_channels[n - 1];
  ct_status st = add_conv(u, "conv_in", c->in_channels, c0, 3, &u->conv_in, err);
  if (!st) st = add_lin(u, "time_embedding.linear_1", c0, temb, 1, 0, &u->t1, err);
  if (!st) st = add_lin(u, "time_embedding.linear_2", temb, temb, 1, 0, &u->t2, err);
  if (!st && c->text_time)
    st = add_lin(u, "add_embedding.linear_1", c->projection_class_embeddings_input_dim, temb, 1, 0,
                 &u->a1, err);
  if (!st && c->text_time) st = add_lin(u, "add_embedding.linear_2", temb, temb, 1, 0, &u->a2, err);
  for (int i = 0; !st && i < n; i++) st = add_down(u, i, err);
  for (int i = 0; !st && i < n; i++) st = add_up(u, i, err);
  if (!st)
    st = add_xf(u, "mid_block.attentions.0", top, c->heads[n - 1], c->transformer_layers[n - 1],
                &u->mid_attn, err);
  if (!st) st = add_res(u, "mid_block.resnets.0", top, top, &u->mid_r0, err);
  if (!st) st = add_res(u, "mid_block.resnets.1", top, top, &u->mid_r1, err);
  if (!st) st = add_norm(u, "conv_norm_out", c0, &u->norm_out, err);
  if (!st) st = add_conv(u, "conv_out", c0, c->out_channels, 3, &u->conv_out, err);
  return st;
}

void ct_unet_unbuild(ct_unet *u) {
  for (int i = 0; i < CT_UNET_MAX_BLOCKS; i++)
    for (int j = 0; j < UNET_MAX_LAYERS; j++) {
      free(u->down[i].attn[j].blk), u->down[i].attn[j].blk = NULL;
      free(u->up[i].attn[j].blk), u->up[i].attn[j].blk = NULL;
    }
  free(u->mid_attn.blk), u->mid_attn.blk = NULL;
  free(u->params), u->params = NULL;
  u->np = u->cap = u->numel = 0;
}

ct_status ct_unet_count(const ct_unet_config *c, size_t *numel, size_t *ntensors, ct_err *err) {
  ct_status st = ct_unet_config_validate(c, err);
  if (st) return st;
  ct_unet u = {0};
  u.cfg = *c;
  st = ct_unet_build(&u, err);
  if (!st) *numel = u.numel, *ntensors = u.np;
  ct_unet_unbuild(&u);
  return st;
}

static int is_norm(const char *name) {
  return strstr(name, "norm") != NULL; /* norm1/2/3, norm, conv_norm_out */
}

ct_status ct_unet_new(const ct_unet_config *cfg, uint64_t seed, ct_unet **out, ct_err *err) {
  *out = NULL;
  ct_status st = ct_unet_config_validate(cfg, err);
  if (st) return st;
  ct_unet *u = calloc(1, sizeof *u);
  if (!u) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  u->cfg = *cfg;
  u->be = ct_backend_default();
  st = ct_unet_build(u, err);
  float *host = st ? NULL : malloc(u->numel * sizeof(float));
  if (!st && (!host || !(u->w = u->be->alloc(CT_MEM_PARAMS, u->numel * sizeof(float)))))
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory for the U-net's %zu parameters", u->numel);
  for (size_t i = 0; !st && i < u->np; i++) {
    const ct_unet_param *p = &u->params[i];
    float *d = host + p->offset;
    const size_t nl = strlen(p->name);
    if (is_norm(p->name) && p->ndim == 1) {
      const float v = nl > 7 && !strcmp(p->name + nl - 7, ".weight") ? 1.0f : 0.0f;
      for (size_t k = 0; k < p->numel; k++) d[k] = v;
      continue;
    }
    const ct_unet_param *wp = p->ndim == 1 && i > 0 ? &u->params[i - 1] : p;
    size_t fan_in = 1;
    for (int k = 1; k < wp->ndim; k++) fan_in *= (size_t)wp->shape[k];
    const float bound = 1.0f / sqrtf((float)fan_in);
    ct_rng_fill_uniform(d, p->numel, seed, 0x0E7000000ull + i, 0, -bound, bound);
  }
  if (!st) u->be->copy_in(u->w, host, u->numel * sizeof(float));
  free(host);
  if (st) {
    ct_unet_free(u);
    return st;
  }
  *out = u;
  return CT_OK;
}

float *ct_unet_swap_params(ct_unet *u, float *w) {
  float *old = u->w;
  if (!u->swapped) u->swapped = old;
  u->w = w;
  if (w == u->swapped) u->swapped = NULL; /* swapped back */
  return old;
}

void ct_unet_free(ct_unet *u) {
  if (!u) return;
  u->be->free(u->swapped ? u->swapped : u->w);
  u->be->free(u->g);
  u->be->free(u->col);
  ct_unet_unbuild(u);
  free(u);
}

const ct_unet_config *ct_unet_cfg(const ct_unet *u) {
  return &u->cfg;
}
const ct_backend_ops *ct_unet_backend(const ct_unet *u) {
  return u->be;
}
const ct_unet_param *ct_unet_table(const ct_unet *u, size_t *n) {
  *n = u->np;
  return u->params;
}
float *ct_unet_params(ct_unet *u) {
  return u->w;
}
size_t ct_unet_numel(const ct_unet *u) {
  return u->numel;
}

float *ct_unet_grads(ct_unet *u) {
  if (!u->g) {
    u->g = u->be->alloc(CT_MEM_GRADS, u->numel * sizeof(float));
    if (u->g) u->be->zero(u->numel, u->g);
  }
  return u->g;
}

ct_status ct_unet_set_backend(ct_unet *u, const ct_backend_ops *be, ct_err *err) {
  if (!be) be = ct_backend_default();
  if (be == u->be) return CT_OK;
  if (u->swapped)
    return ct_errf(err, CT_ERR_INVALID, "the U-net's parameters are swapped for a host copy");
  const char *lacks = ct_backend_lacks(be, CT_UNET_OPS);
  if (lacks)
    return ct_errf(err, CT_ERR_UNSUPPORTED, "the U-net cannot run on backend %s: it has no %s",
                   be->name, lacks);
  const size_t bytes = u->numel * sizeof(float);
  ct_status st = ct_backend_move(u->be, be, CT_MEM_PARAMS, bytes, (void **)&u->w, err);
  if (!st && u->g) {
    st = ct_backend_move(u->be, be, CT_MEM_GRADS, bytes, (void **)&u->g, err);
    if (st) {
      ct_err ignored = {0};
      ct_status back = ct_backend_move(be, u->be, CT_MEM_PARAMS, bytes, (void **)&u->w, &ignored);
      CT_ASSERT(back == CT_OK);
    }
  }
  if (st) return st;
  u->be->free(u->col);
  u->col = NULL, u->col_n = 0;
  u->be = be;
  return CT_OK;
}

ct_status ct_unet_need_col(ct_unet *u, const ct_conv2d_shape *s, ct_err *err) {
  const size_t n = u->be->conv2d_col_floats(s);
  if (n <= u->col_n) return CT_OK;
  u->be->free(u->col);
  u->col = u->be->alloc(CT_MEM_BUFFERS, n * sizeof(float));
  u->col_n = u->col ? n : 0;
  return u->col
             ? CT_OK
             : ct_errf(err, CT_ERR_NOMEM, "out of memory for a convolution's %zu-float scratch", n);
}

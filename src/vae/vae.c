/* vae.c: diffusers' AutoencoderKL — configuration, parameter table in
 * state_dict order, PyTorch-style initialisation, safetensors load/save, and
 * the inference forward of encoder and decoder (docs/vae.md).
 *
 * The network is described once, as block structs holding the offsets of
 * their tensors in the flat buffer; the forward walks them over a workspace
 * of four activation buffers sized for the largest tensor of the call. Every
 * op and buffer goes through the VAE's compute backend (v->be,
 * include/ctuner/backend.h). */
#define _GNU_SOURCE /* asprintf */
#include "ctuner/vae.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/rng.h"
#include "ctuner/safetensors.h"
#include "vae/vae_int.h"

/* ---------------------------------------------------------------- config */

void ct_vae_config_defaults(ct_vae_config *c) {
  memset(c, 0, sizeof *c);
  c->in_channels = c->out_channels = 3;
  c->nblocks = 1;
  c->block_out_channels[0] = 64;
  c->layers_per_block = 1;
  c->latent_channels = 4;
  c->norm_num_groups = 32;
  c->use_quant_conv = c->use_post_quant_conv = 1;
  c->mid_block_add_attention = 1;
  c->scaling_factor = 0.18215f;
  c->shift_factor = 0;
}

int ct_vae_factor(const ct_vae_config *c) {
  return 1 << (c->nblocks - 1);
}

ct_status ct_vae_config_validate(const ct_vae_config *c, ct_err *err) {
  if (c->nblocks < 1 || c->nblocks > CT_VAE_MAX_BLOCKS)
    return ct_errf(err, CT_ERR_INVALID, "block_out_channels must have 1 to %d entries, got %d",
                   CT_VAE_MAX_BLOCKS, c->nblocks);
  if (c->in_channels < 1 || c->out_channels < 1 || c->latent_channels < 1 ||
      c->layers_per_block < 1 || c->norm_num_groups < 1)
    return ct_errf(err, CT_ERR_INVALID,
                   "in_channels, out_channels, latent_channels, layers_per_block and "
                   "norm_num_groups must be >= 1");
  for (int i = 0; i < c->nblocks; i++)
    if (c->block_out_channels[i] < 1 || c->block_out_channels[i] % c->norm_num_groups)
      return ct_errf(err, CT_ERR_INVALID,
                     "block_out_channels[%d] = %d is not a positive multiple of norm_num_groups %d",
                     i, c->block_out_channels[i], c->norm_num_groups);
  if (!(c->scaling_factor > 0) || !isfinite(c->shift_factor))
    return ct_errf(err, CT_ERR_INVALID, "scaling_factor must be > 0 and shift_factor finite");
  return CT_OK;
}

static ct_status cfg_int(const ct_json *j, const char *path, const char *key, int lo, int hi,
                         int *out, ct_err *err) {
  const ct_json *v = ct_json_get(j, key);
  if (!v || v->type == CT_JSON_NULL) return CT_OK;
  if (v->type != CT_JSON_NUMBER || !v->is_int || v->i64 < lo || v->i64 > hi)
    return ct_errf(err, CT_ERR_INVALID, "%s: %s must be an integer between %d and %d", path, key,
                   lo, hi);
  *out = (int)v->i64;
  return CT_OK;
}

static ct_status cfg_bool(const ct_json *j, const char *path, const char *key, int *out,
                          ct_err *err) {
  const ct_json *v = ct_json_get(j, key);
  if (!v || v->type == CT_JSON_NULL) return CT_OK;
  if (v->type != CT_JSON_BOOL)
    return ct_errf(err, CT_ERR_INVALID, "%s: %s must be true or false", path, key);
  *out = v->boolean;
  return CT_OK;
}

static ct_status cfg_num(const ct_json *j, const char *path, const char *key, float *out,
                         ct_err *err) {
  const ct_json *v = ct_json_get(j, key);
  if (!v || v->type == CT_JSON_NULL) return CT_OK; /* shift_factor: null means 0 */
  if (v->type != CT_JSON_NUMBER)
    return ct_errf(err, CT_ERR_INVALID, "%s: %s must be a number", path, key);
  *out = (float)v->num;
  return CT_OK;
}

ct_status ct_vae_config_load(const char *path, ct_vae_config *c, ct_err *err) {
  ct_vae_config_defaults(c);
  ct_json *j = NULL;
  ct_status st = ct_json_parse_file(path, 1 << 20, &j, err);
  if (st) return st;
  if (j->type != CT_JSON_OBJECT) st = ct_errf(err, CT_ERR_FORMAT, "%s: not a JSON object", path);
  const ct_json *cls = ct_json_get(j, "_class_name");
  if (!st && cls && cls->type == CT_JSON_STRING && strcmp(cls->str, "AutoencoderKL"))
    st = ct_errf(err, CT_ERR_UNSUPPORTED, "%s: _class_name is %s; ctuner loads AutoencoderKL VAEs",
                 path, cls->str);
  const ct_json *boc = ct_json_get(j, "block_out_channels");
  if (!st && boc) {
    if (boc->type != CT_JSON_ARRAY || boc->n < 1 || boc->n > CT_VAE_MAX_BLOCKS)
      st = ct_errf(err, CT_ERR_INVALID, "%s: block_out_channels must be a list of 1 to %d integers",
                   path, CT_VAE_MAX_BLOCKS);
    for (size_t i = 0; !st && i < boc->n; i++) {
      if (boc->items[i].type != CT_JSON_NUMBER || !boc->items[i].is_int || boc->items[i].i64 < 1 ||
          boc->items[i].i64 > 1 << 16)
        st = ct_errf(err, CT_ERR_INVALID, "%s: block_out_channels[%zu] must be a positive integer",
                     path, i);
      else
        c->block_out_channels[i] = (int)boc->items[i].i64;
    }
    if (!st) c->nblocks = (int)boc->n;
  }
  static const char *const kinds[2][2] = {{"down_block_types", "DownEncoderBlock2D"},
                                          {"up_block_types", "UpDecoderBlock2D"}};
  for (int k = 0; !st && k < 2; k++) {
    const ct_json *t = ct_json_get(j, kinds[k][0]);
    if (!t) continue;
    if (t->type != CT_JSON_ARRAY || (int)t->n != c->nblocks)
      st = ct_errf(err, CT_ERR_INVALID,
                   "%s: %s must list %d blocks (one per block_out_channels entry)", path,
                   kinds[k][0], c->nblocks);
    for (size_t i = 0; !st && i < t->n; i++)
      if (t->items[i].type != CT_JSON_STRING || strcmp(t->items[i].str, kinds[k][1]))
        st = ct_errf(err, CT_ERR_UNSUPPORTED, "%s: %s[%zu] must be %s (AutoencoderKL's)", path,
                     kinds[k][0], i, kinds[k][1]);
  }
  const ct_json *actfn = ct_json_get(j, "act_fn");
  if (!st && actfn && (actfn->type != CT_JSON_STRING || strcmp(actfn->str, "silu")))
    st = ct_errf(err, CT_ERR_UNSUPPORTED, "%s: act_fn must be \"silu\"", path);
  if (!st) st = cfg_int(j, path, "in_channels", 1, 64, &c->in_channels, err);
  if (!st) st = cfg_int(j, path, "out_channels", 1, 64, &c->out_channels, err);
  if (!st) st = cfg_int(j, path, "layers_per_block", 1, 16, &c->layers_per_block, err);
  if (!st) st = cfg_int(j, path, "latent_channels", 1, 1024, &c->latent_channels, err);
  if (!st) st = cfg_int(j, path, "norm_num_groups", 1, 1024, &c->norm_num_groups, err);
  if (!st) st = cfg_bool(j, path, "use_quant_conv", &c->use_quant_conv, err);
  if (!st) st = cfg_bool(j, path, "use_post_quant_conv", &c->use_post_quant_conv, err);
  if (!st) st = cfg_bool(j, path, "mid_block_add_attention", &c->mid_block_add_attention, err);
  if (!st) st = cfg_num(j, path, "scaling_factor", &c->scaling_factor, err);
  if (!st) st = cfg_num(j, path, "shift_factor", &c->shift_factor, err);
  ct_json_free(j);
  if (!st) {
    st = ct_vae_config_validate(c, err);
    if (st) ct_err_prefix(err, "%s: ", path);
  }
  return st;
}

char *ct_vae_config_json(const ct_vae_config *c) {
  char boc[256] = "", down[512] = "", up[512] = "";
  size_t a = 0, b = 0, d = 0;
  for (int i = 0; i < c->nblocks; i++) {
    a += (size_t)snprintf(boc + a, sizeof boc - a, "%s%d", i ? ", " : "", c->block_out_channels[i]);
    b += (size_t)snprintf(down + b, sizeof down - b, "%s\"DownEncoderBlock2D\"", i ? ", " : "");
    d += (size_t)snprintf(up + d, sizeof up - d, "%s\"UpDecoderBlock2D\"", i ? ", " : "");
  }
  char *out = NULL;
  if (asprintf(
          &out,
          "{\n  \"_class_name\": \"AutoencoderKL\",\n  \"act_fn\": \"silu\",\n  "
          "\"block_out_channels\": [%s],\n"
          "  \"down_block_types\": [%s],\n  \"up_block_types\": [%s],\n  \"in_channels\": %d,\n"
          "  \"out_channels\": %d,\n  \"latent_channels\": %d,\n  \"layers_per_block\": %d,\n"
          "  \"norm_num_groups\": %d,\n  \"scaling_factor\": %.9g,\n  \"shift_factor\": %.9g,\n"
          "  \"use_quant_conv\": %s,\n  \"use_post_quant_conv\": %s,\n  "
          "\"mid_block_add_attention\": %s\n}\n",
          boc, down, up, c->in_channels, c->out_channels, c->latent_channels, c->layers_per_block,
          c->norm_num_groups, c->scaling_factor, c->shift_factor,
          c->use_quant_conv ? "true" : "false", c->use_post_quant_conv ? "true" : "false",
          c->mid_block_add_attention ? "true" : "false") < 0)
    out = NULL;
  return out;
}

/* ------------------------------------------------------ the parameter table */

static ct_status add(ct_vae *v, const char *name, int ndim, const int64_t *shape, size_t *off,
                     ct_err *err) {
  if (v->np == v->cap) {
    size_t nc = v->cap ? v->cap * 2 : 256;
    ct_vae_param *np = realloc(v->params, nc * sizeof *np);
    if (!np) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    v->params = np, v->cap = nc;
  }
  ct_vae_param *p = &v->params[v->np++];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name);
  p->ndim = ndim;
  p->numel = 1;
  for (int i = 0; i < ndim; i++) p->shape[i] = shape[i], p->numel *= (size_t)shape[i];
  p->offset = v->numel;
  v->numel += p->numel;
  *off = p->offset;
  return CT_OK;
}

static ct_status add_conv(ct_vae *v, const char *pre, int cin, int cout, int k, vconv *c,
                          ct_err *err) {
  char n[112];
  int64_t ws[4] = {cout, cin, k, k}, bs[1] = {cout};
  c->cin = cin, c->cout = cout, c->k = k;
  snprintf(n, sizeof n, "%.80s.weight", pre);
  ct_status st = add(v, n, 4, ws, &c->w, err);
  snprintf(n, sizeof n, "%.80s.bias", pre);
  return st ? st : add(v, n, 1, bs, &c->b, err);
}

static ct_status add_gn(ct_vae *v, const char *pre, int C, vgn *g, ct_err *err) {
  char n[112];
  int64_t s[1] = {C};
  g->C = C;
  snprintf(n, sizeof n, "%.80s.weight", pre);
  ct_status st = add(v, n, 1, s, &g->g, err);
  snprintf(n, sizeof n, "%.80s.bias", pre);
  return st ? st : add(v, n, 1, s, &g->b, err);
}

static ct_status add_lin(ct_vae *v, const char *pre, int C, vlin *l, ct_err *err) {
  char n[112];
  int64_t ws[2] = {C, C}, bs[1] = {C};
  snprintf(n, sizeof n, "%.80s.weight", pre);
  ct_status st = add(v, n, 2, ws, &l->w, err);
  snprintf(n, sizeof n, "%.80s.bias", pre);
  return st ? st : add(v, n, 1, bs, &l->b, err);
}

/* ResnetBlock2D: norm1, conv1, norm2, conv2, conv_shortcut (registration order) */
static ct_status add_res(ct_vae *v, const char *pre, int cin, int cout, vres *r, ct_err *err) {
  char n[112];
  r->cin = cin, r->cout = cout, r->has_sc = cin != cout;
  snprintf(n, sizeof n, "%.80s.norm1", pre);
  ct_status st = add_gn(v, n, cin, &r->n1, err);
  snprintf(n, sizeof n, "%.80s.conv1", pre);
  if (!st) st = add_conv(v, n, cin, cout, 3, &r->c1, err);
  snprintf(n, sizeof n, "%.80s.norm2", pre);
  if (!st) st = add_gn(v, n, cout, &r->n2, err);
  snprintf(n, sizeof n, "%.80s.conv2", pre);
  if (!st) st = add_conv(v, n, cout, cout, 3, &r->c2, err);
  snprintf(n, sizeof n, "%.80s.conv_shortcut", pre);
  if (!st && r->has_sc) st = add_conv(v, n, cin, cout, 1, &r->sc, err);
  return st;
}

/* UNetMidBlock2D: attentions (group_norm, to_q, to_k, to_v, to_out.0), then resnets */
static ct_status add_mid(ct_vae *v, const char *pre, int C, int attn, vmid *m, ct_err *err) {
  char n[112];
  ct_status st = CT_OK;
  m->has_attn = attn;
  m->attn.C = C;
  if (attn) {
    snprintf(n, sizeof n, "%.80s.attentions.0.group_norm", pre);
    st = add_gn(v, n, C, &m->attn.gn, err);
    snprintf(n, sizeof n, "%.80s.attentions.0.to_q", pre);
    if (!st) st = add_lin(v, n, C, &m->attn.q, err);
    snprintf(n, sizeof n, "%.80s.attentions.0.to_k", pre);
    if (!st) st = add_lin(v, n, C, &m->attn.k, err);
    snprintf(n, sizeof n, "%.80s.attentions.0.to_v", pre);
    if (!st) st = add_lin(v, n, C, &m->attn.v, err);
    snprintf(n, sizeof n, "%.80s.attentions.0.to_out.0", pre);
    if (!st) st = add_lin(v, n, C, &m->attn.o, err);
  }
  snprintf(n, sizeof n, "%.80s.resnets.0", pre);
  if (!st) st = add_res(v, n, C, C, &m->r0, err);
  snprintf(n, sizeof n, "%.80s.resnets.1", pre);
  if (!st) st = add_res(v, n, C, C, &m->r1, err);
  return st;
}

static ct_status build(ct_vae *v, ct_err *err) {
  const ct_vae_config *c = &v->cfg;
  const int nb = c->nblocks, *boc = c->block_out_channels, G = c->norm_num_groups;
  (void)G;
  char n[112];
  ct_status st = add_conv(v, "encoder.conv_in", c->in_channels, boc[0], 3, &v->e_in, err);
  int prev = boc[0];
  for (int i = 0; !st && i < nb; i++) {
    vblock *b = &v->e_blocks[i];
    b->nres = c->layers_per_block;
    for (int j = 0; !st && j < b->nres; j++) {
      snprintf(n, sizeof n, "encoder.down_blocks.%d.resnets.%d", i, j);
      st = add_res(v, n, j ? boc[i] : prev, boc[i], &b->res[j], err);
    }
    b->has_sampler = i < nb - 1;
    snprintf(n, sizeof n, "encoder.down_blocks.%d.downsamplers.0.conv", i);
    if (!st && b->has_sampler) st = add_conv(v, n, boc[i], boc[i], 3, &b->sampler, err);
    prev = boc[i];
  }
  if (!st)
    st = add_mid(v, "encoder.mid_block", boc[nb - 1], c->mid_block_add_attention, &v->e_mid, err);
  if (!st) st = add_gn(v, "encoder.conv_norm_out", boc[nb - 1], &v->e_norm, err);
  if (!st)
    st = add_conv(v, "encoder.conv_out", boc[nb - 1], 2 * c->latent_channels, 3, &v->e_out, err);
  /* decoder: conv_in, up_blocks, mid_block, conv_norm_out, conv_out (registration order) */
  if (!st) st = add_conv(v, "decoder.conv_in", c->latent_channels, boc[nb - 1], 3, &v->d_in, err);
  prev = boc[nb - 1];
  for (int i = 0; !st && i < nb; i++) {
    const int out = boc[nb - 1 - i];
    vblock *b = &v->d_blocks[i];
    b->nres = c->layers_per_block + 1;
    for (int j = 0; !st && j < b->nres; j++) {
      snprintf(n, sizeof n, "decoder.up_blocks.%d.resnets.%d", i, j);
      st = add_res(v, n, j ? out : prev, out, &b->res[j], err);
    }
    b->has_sampler = i < nb - 1;
    snprintf(n, sizeof n, "decoder.up_blocks.%d.upsamplers.0.conv", i);
    if (!st && b->has_sampler) st = add_conv(v, n, out, out, 3, &b->sampler, err);
    prev = out;
  }
  if (!st)
    st = add_mid(v, "decoder.mid_block", boc[nb - 1], c->mid_block_add_attention, &v->d_mid, err);
  if (!st) st = add_gn(v, "decoder.conv_norm_out", boc[0], &v->d_norm, err);
  if (!st) st = add_conv(v, "decoder.conv_out", boc[0], c->out_channels, 3, &v->d_out, err);
  if (!st && c->use_quant_conv)
    st = add_conv(v, "quant_conv", 2 * c->latent_channels, 2 * c->latent_channels, 1, &v->quant,
                  err);
  if (!st && c->use_post_quant_conv)
    st = add_conv(v, "post_quant_conv", c->latent_channels, c->latent_channels, 1, &v->post_quant,
                  err);
  return st;
}

ct_status ct_vae_new(const ct_vae_config *cfg, uint64_t seed, ct_vae **out, ct_err *err) {
  *out = NULL;
  ct_status st = ct_vae_config_validate(cfg, err);
  if (st) return st;
  if (cfg->layers_per_block + 1 > 17)
    return ct_errf(err, CT_ERR_INVALID, "layers_per_block must be at most 16");
  ct_vae *v = calloc(1, sizeof *v);
  if (!v) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  v->cfg = *cfg;
  v->be = ct_backend_default();
  st = build(v, err);
  if (!st && !(v->w = v->be->alloc(CT_MEM_PARAMS, v->numel * sizeof(float))))
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory for the VAE's %zu parameters", v->numel);
  if (st) {
    ct_vae_free(v);
    return st;
  }
  /* PyTorch's defaults: kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(fan_in), +) for
   * weights, the same bound for biases; GroupNorm weight 1, bias 0 */
  for (size_t i = 0; i < v->np; i++) {
    const ct_vae_param *p = &v->params[i];
    float *d = v->w + p->offset;
    const size_t nl = strlen(p->name);
    const int is_norm = strstr(p->name, ".norm1.") || strstr(p->name, ".norm2.") ||
                        strstr(p->name, "group_norm.") || strstr(p->name, "conv_norm_out.");
    if (is_norm) {
      const float val = nl > 7 && !strcmp(p->name + nl - 7, ".weight") ? 1.0f : 0.0f;
      for (size_t k = 0; k < p->numel; k++) d[k] = val;
      continue;
    }
    /* fan_in: of the weight this tensor belongs to */
    size_t fan_in = 1;
    const ct_vae_param *wp =
        p->ndim == 1 && i > 0 ? &v->params[i - 1] : p; /* a bias follows its weight */
    for (int k = 1; k < wp->ndim; k++) fan_in *= (size_t)wp->shape[k];
    const float bound = 1.0f / sqrtf((float)fan_in);
    ct_rng_fill_uniform(d, p->numel, seed, 0x7AE0000ull + i, 0, -bound, bound);
  }
  *out = v;
  return CT_OK;
}

/* The workspace of the last call (activations, im2col scratch, statistics). */
static void free_workspace(ct_vae *v) {
  for (int i = 0; i < 6; i++) v->be->free(v->buf[i]), v->buf[i] = NULL;
  v->be->free(v->col);
  v->be->free(v->mean);
  v->be->free(v->rstd);
  v->col = v->mean = v->rstd = NULL;
  v->buf_n = v->col_n = v->stat_n = 0;
}

void ct_vae_free(ct_vae *v) {
  if (!v) return;
  free_workspace(v);
  v->be->free(v->w);
  v->be->free(v->g);
  free(v->params);
  free(v);
}

const ct_backend_ops *ct_vae_backend(const ct_vae *v) {
  return v->be;
}

ct_status ct_vae_set_backend(ct_vae *v, const ct_backend_ops *be, ct_err *err) {
  if (!be) be = ct_backend_default();
  if (be == v->be) return CT_OK;
  const size_t bytes = v->numel * sizeof(float);
  ct_status st = ct_backend_move(v->be, be, CT_MEM_PARAMS, bytes, (void **)&v->w, err);
  if (!st && v->g) {
    st = ct_backend_move(v->be, be, CT_MEM_GRADS, bytes, (void **)&v->g, err);
    if (st) { /* put the parameters back: the VAE stays on its backend */
      ct_err ignored = {0};
      ct_status back = ct_backend_move(be, v->be, CT_MEM_PARAMS, bytes, (void **)&v->w, &ignored);
      CT_ASSERT(back == CT_OK);
    }
  }
  if (st) return st;
  free_workspace(v); /* on the old backend; the next call allocates on the new one */
  v->be = be;
  return CT_OK;
}

const ct_vae_config *ct_vae_cfg(const ct_vae *v) {
  return &v->cfg;
}
void ct_vae_set_scaling(ct_vae *v, float scaling_factor, float shift_factor) {
  v->cfg.scaling_factor = scaling_factor;
  v->cfg.shift_factor = shift_factor;
}
const ct_vae_param *ct_vae_table(const ct_vae *v, size_t *n) {
  *n = v->np;
  return v->params;
}
float *ct_vae_params(ct_vae *v) {
  return v->w;
}
size_t ct_vae_numel(const ct_vae *v) {
  return v->numel;
}

/* ------------------------------------------------------------- load, save */

/* The older diffusers attention names: query/key/value/proj_attn. */
static const char *legacy_name(const char *name, char *buf, size_t n) {
  static const char *const map[4][2] = {{".to_q.", ".query."},
                                        {".to_k.", ".key."},
                                        {".to_v.", ".value."},
                                        {".to_out.0.", ".proj_attn."}};
  for (int i = 0; i < 4; i++) {
    const char *p = strstr(name, map[i][0]);
    if (!p) continue;
    snprintf(buf, n, "%.*s%s%s", (int)(p - name), name, map[i][1], p + strlen(map[i][0]));
    return buf;
  }
  return NULL;
}

static void list_add(char *buf, size_t cap, int *count, const char *item) {
  size_t len = strlen(buf);
  (*count)++;
  if (len + strlen(item) + 8 >= cap) {
    if (len + 5 < cap && strcmp(buf + (len > 3 ? len - 3 : 0), "...")) strcat(buf, ", ...");
    return;
  }
  snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", item);
}

static void shape_str(int ndim, const int64_t *s, char *out, size_t n) {
  size_t w = (size_t)snprintf(out, n, "[");
  for (int k = 0; k < ndim && w < n; k++)
    w += (size_t)snprintf(out + w, n - w, "%s%lld", k ? ", " : "", (long long)s[k]);
  if (w < n) snprintf(out + w, n - w, "]");
}

ct_status ct_vae_load(ct_vae *v, const char *path, ct_err *err) {
  ct_st_file *f = NULL;
  ct_status st = ct_st_open(path, &f, err);
  if (st) return st;
  const size_t cap = 8192;
  char *missing = calloc(1, cap), *wrong = calloc(1, cap), *extra = calloc(1, cap);
  int nm = 0, nw = 0, ne = 0;
  unsigned char *used = calloc(f->ntensors + 1, 1);
  if (!missing || !wrong || !extra || !used) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < v->np; i++) {
    const ct_vae_param *p = &v->params[i];
    char alt[160];
    const ct_st_tensor *t = ct_st_find(f, p->name);
    if (!t && legacy_name(p->name, alt, sizeof alt)) t = ct_st_find(f, alt);
    if (!t) {
      list_add(missing, cap, &nm, p->name);
      continue;
    }
    used[t - f->tensors] = 1;
    /* attention projections stored as 1x1 convolutions (C, C, 1, 1) are matrices */
    int ok = t->numel == p->numel && (t->ndim == p->ndim || (p->ndim == 2 && t->ndim == 4 &&
                                                             t->shape[2] == 1 && t->shape[3] == 1));
    for (int k = 0; ok && k < p->ndim; k++) ok = t->shape[k] == p->shape[k];
    const int dt =
        t->dtype == CT_DTYPE_F32 || t->dtype == CT_DTYPE_F16 || t->dtype == CT_DTYPE_BF16;
    if (!ok || !dt) {
      char got[96], want[96], item[400];
      shape_str(t->ndim, t->shape, got, sizeof got);
      shape_str(p->ndim, p->shape, want, sizeof want);
      snprintf(item, sizeof item, "%s (file: %s %s, model: F32/F16/BF16 %s)", p->name,
               ct_dtype_name(t->dtype), got, want);
      list_add(wrong, cap, &nw, item);
      continue;
    }
    st = ct_st_to_f32(t, v->w + p->offset, p->numel, err);
    if (st) goto out;
  }
  for (size_t i = 0; i < f->ntensors; i++)
    if (!used[i]) list_add(extra, cap, &ne, f->tensors[i].name);
  if (nm || nw || ne)
    st =
        ct_errf(err, CT_ERR_SHAPE,
                "%s does not match the VAE of its config (%zu tensors): %d missing%s%s%s; %d "
                "wrongly shaped%s%s%s; "
                "%d unexpected%s%s%s. Check block_out_channels, layers_per_block, latent_channels, "
                "norm_num_groups, use_quant_conv and use_post_quant_conv in config.json",
                path, v->np, nm, nm ? " [" : "", missing, nm ? "]" : "", nw, nw ? " [" : "", wrong,
                nw ? "]" : "", ne, ne ? " [" : "", extra, ne ? "]" : "");
out:
  free(missing);
  free(wrong);
  free(extra);
  free(used);
  ct_st_close(f);
  return st;
}

ct_status ct_vae_save(const ct_vae *v, const char *path, ct_err *err) {
  ct_st_writer *w = NULL;
  if (ct_st_writer_new(&w)) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = CT_OK;
  for (size_t i = 0; !st && i < v->np; i++) {
    const ct_vae_param *p = &v->params[i];
    st = ct_st_writer_add_f32(w, p->name, p->ndim, p->shape, v->w + p->offset, CT_DTYPE_F32, err);
  }
  if (!st) st = ct_st_writer_meta(w, "format", "pt", err);
  if (!st) st = ct_st_writer_write(w, path, err);
  ct_st_writer_free(w);
  return st;
}

ct_status ct_vae_from_pretrained(const char *path, ct_vae **out, ct_err *err) {
  *out = NULL;
  char cfgp[4200], wp[4200];
  const size_t l = strlen(path);
  if (l > 12 && !strcmp(path + l - 12, ".safetensors")) {
    snprintf(wp, sizeof wp, "%s", path);
    const char *slash = strrchr(path, '/');
    snprintf(cfgp, sizeof cfgp, "%.*sconfig.json", slash ? (int)(slash - path + 1) : 0, path);
  } else {
    snprintf(wp, sizeof wp, "%s/diffusion_pytorch_model.safetensors", path);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", path);
  }
  ct_vae_config c;
  ct_status st = ct_vae_config_load(cfgp, &c, err);
  if (!st) st = ct_vae_new(&c, 0, out, err);
  if (!st) st = ct_vae_load(*out, wp, err);
  if (st) {
    ct_vae_free(*out);
    *out = NULL;
  }
  return st;
}

/* ---------------------------------------------------------------- forward */

ct_status ct_vae_need_col(ct_vae *v, const ct_conv2d_shape *s, ct_err *err) {
  const size_t n = v->be->conv2d_col_floats(s);
  if (n <= v->col_n) return CT_OK;
  v->be->free(v->col);
  v->col = v->be->alloc(CT_MEM_BUFFERS, n * sizeof(float));
  v->col_n = v->col ? n : 0;
  return v->col
             ? CT_OK
             : ct_errf(err, CT_ERR_NOMEM, "out of memory for a convolution's %zu-float scratch", n);
}

/* y = conv(x); pads: same (k/2 all round), or diffusers' downsample (right/bottom 1, stride 2) */
static ct_status conv(ct_vae *v, int B, const vconv *c, const act *x, int down, act *y,
                      ct_err *err) {
  ct_conv2d_shape s = {B, c->cin, x->H, x->W, c->cout, c->k, down ? 2 : 1, 0, 0, 0, 0};
  if (down)
    s.pad_b = s.pad_r = 1;
  else
    s.pad_t = s.pad_l = s.pad_b = s.pad_r = c->k / 2;
  ct_status st = ct_vae_need_col(v, &s, err);
  if (st) return st;
  y->C = c->cout;
  y->H = ct_conv2d_out(x->H, c->k, s.stride, s.pad_t, s.pad_b);
  y->W = ct_conv2d_out(x->W, c->k, s.stride, s.pad_l, s.pad_r);
  v->be->conv2d_fwd(&s, x->p, v->w + c->w, v->w + c->b, y->p, v->col);
  return CT_OK;
}

static void gn_silu(ct_vae *v, int B, const vgn *g, const act *x, act *y, int silu) {
  v->be->groupnorm_fwd(B, g->C, x->H * x->W, v->cfg.norm_num_groups, GN_EPS, x->p, v->w + g->g,
                       v->w + g->b, y->p, v->mean, v->rstd);
  y->C = x->C, y->H = x->H, y->W = x->W;
  if (silu) v->be->silu_fwd(B * x->C, x->H * x->W, y->p, x->H * x->W, y->p, x->H * x->W);
}

/* y = x + conv2(silu(gn2(conv1(silu(gn1(x)))))) [+ shortcut]; t1, t2 scratch */
static ct_status resnet(ct_vae *v, int B, const vres *r, const act *x, act *y, act *t1, act *t2,
                        ct_err *err) {
  gn_silu(v, B, &r->n1, x, t1, 1);
  ct_status st = conv(v, B, &r->c1, t1, 0, t2, err);
  if (st) return st;
  gn_silu(v, B, &r->n2, t2, t1, 1);
  st = conv(v, B, &r->c2, t1, 0, y, err);
  if (st) return st;
  const size_t n = (size_t)B * y->C * y->H * y->W;
  if (r->has_sc) {
    st = conv(v, B, &r->sc, x, 0, t2, err);
    if (st) return st;
    v->be->add_inplace(n, y->p, t2->p);
  } else {
    v->be->add_inplace(n, y->p, x->p);
  }
  return CT_OK;
}

/* x += to_out(attention(gn(x))) over the H*W positions, one head. Scratch:
 * t1, t2, spare (each >= B*L*C), q, k, lse (B*L). */
static void attention(ct_vae *v, int B, const vattn *a, act *x, act *t1, act *t2, float *spare,
                      float *q, float *k, float *lse) {
  const int C = a->C, L = x->H * x->W;
  gn_silu(v, B, &a->gn, x, t1, 0);
  v->be->nchw_to_nlc(B, C, L, t1->p, t2->p);
  v->be->linear_fwd(B * L, C, C, t2->p, C, v->w + a->q.w, v->w + a->q.b, q, C);
  v->be->linear_fwd(B * L, C, C, t2->p, C, v->w + a->k.w, v->w + a->k.b, k, C);
  v->be->linear_fwd(B * L, C, C, t2->p, C, v->w + a->v.w, v->w + a->v.b, spare, C);
  v->be->attention_fwd(B, 1, L, C, 1.0f / sqrtf((float)C), 0, q, k, spare, t1->p, lse);
  v->be->linear_fwd(B * L, C, C, t1->p, C, v->w + a->o.w, v->w + a->o.b, t2->p, C);
  v->be->nlc_to_nchw(B, C, L, t2->p, spare);
  v->be->add_inplace((size_t)B * C * L, x->p, spare);
}

/* buffers: 0, 1 ping-pong; 2, 3 scratch; 4, 5 attention q and k */
static ct_status workspace(ct_vae *v, size_t need, int B, size_t lse_n, ct_err *err) {
  if (need > v->buf_n) {
    for (int i = 0; i < 6; i++) {
      v->be->free(v->buf[i]);
      v->buf[i] = v->be->alloc(CT_MEM_BUFFERS, need * sizeof(float));
      if (!v->buf[i]) {
        v->buf_n = 0;
        return ct_errf(err, CT_ERR_NOMEM,
                       "out of memory for the VAE's activations (6 x %zu floats)", need);
      }
    }
    v->buf_n = need;
  }
  const size_t sn = (size_t)B * (size_t)v->cfg.norm_num_groups + lse_n + 1;
  if (sn > v->stat_n) {
    v->be->free(v->mean);
    v->be->free(v->rstd);
    v->mean = v->be->alloc(CT_MEM_BUFFERS, sn * sizeof(float));
    v->rstd = v->be->alloc(CT_MEM_BUFFERS, sn * sizeof(float));
    v->stat_n = v->mean && v->rstd ? sn : 0;
    if (!v->stat_n) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  return CT_OK;
}

typedef struct ws {
  act a, b, t1, t2;
  act *cur, *nxt;
} ws;

static void ws_init(ct_vae *v, ws *w) {
  w->a = (act){v->buf[0], 0, 0, 0};
  w->b = (act){v->buf[1], 0, 0, 0};
  w->t1 = (act){v->buf[2], 0, 0, 0};
  w->t2 = (act){v->buf[3], 0, 0, 0};
  w->cur = &w->a, w->nxt = &w->b;
}
static void swap(ws *w) {
  act *t = w->cur;
  w->cur = w->nxt, w->nxt = t;
}

static ct_status run_res(ct_vae *v, int B, const vres *r, ws *w, ct_err *err) {
  ct_status st = resnet(v, B, r, w->cur, w->nxt, &w->t1, &w->t2, err);
  if (!st) swap(w);
  return st;
}

static ct_status run_mid(ct_vae *v, int B, const vmid *m, ws *w, ct_err *err) {
  ct_status st = run_res(v, B, &m->r0, w, err);
  if (st) return st;
  if (m->has_attn)
    attention(v, B, &m->attn, w->cur, &w->t1, &w->t2, w->nxt->p, v->buf[4], v->buf[5],
              v->rstd + (size_t)B * v->cfg.norm_num_groups);
  return run_res(v, B, &m->r1, w, err);
}

static size_t maxz(size_t a, size_t b) {
  return a > b ? a : b;
}

/* The encoder through quant_conv: (B, 2 latent, H/f, W/f) moments in the
 * workspace (valid until the next call). */
ct_status ct_vae_encode_moments(ct_vae *v, int B, int H, int W, const float *x,
                                const float **moments, ct_err *err) {
  const ct_vae_config *c = &v->cfg;
  const int f = ct_vae_factor(c), nb = c->nblocks, *boc = c->block_out_channels;
  if (B < 1 || H < f || W < f || H % f || W % f)
    return ct_errf(err, CT_ERR_SHAPE,
                   "VAE encode: %dx%d is not a positive multiple of the VAE's factor %d", W, H, f);
  size_t need = (size_t)B * (size_t)c->in_channels * H * W;
  for (int i = 0; i < nb; i++) {
    const size_t px = (size_t)(H >> i) * (size_t)(W >> i);
    need = maxz(
        need, (size_t)B * (size_t)(boc[i] > boc[i ? i - 1 : 0] ? boc[i] : boc[i ? i - 1 : 0]) * px);
  }
  const size_t Lm = (size_t)(H / f) * (size_t)(W / f);
  need = maxz(need, (size_t)B * 2 * (size_t)c->latent_channels * Lm);
  ct_status st = workspace(v, need, B, (size_t)B * Lm, err);
  if (st) return st;
  ws w;
  ws_init(v, &w);
  act in = {(float *)x, c->in_channels, H, W};
  st = conv(v, B, &v->e_in, &in, 0, w.cur, err);
  for (int i = 0; !st && i < nb; i++) {
    const vblock *b = &v->e_blocks[i];
    for (int j = 0; !st && j < b->nres; j++) st = run_res(v, B, &b->res[j], &w, err);
    if (!st && b->has_sampler) {
      st = conv(v, B, &b->sampler, w.cur, 1, w.nxt, err);
      swap(&w);
    }
  }
  if (!st) st = run_mid(v, B, &v->e_mid, &w, err);
  if (st) return st;
  gn_silu(v, B, &v->e_norm, w.cur, &w.t1, 1);
  st = conv(v, B, &v->e_out, &w.t1, 0, w.cur, err);
  if (!st && c->use_quant_conv) {
    st = conv(v, B, &v->quant, w.cur, 0, w.nxt, err);
    swap(&w);
  }
  if (st) return st;
  *moments = w.cur->p;
  return CT_OK;
}

/* mean = channels [0, latent), logvar = [latent, 2 latent) clamped to [-30, 20] */
void ct_vae_split_moments(const ct_backend_ops *be, int B, int lc, size_t plane, const float *mom,
                          float *mean, float *logvar) {
  const size_t n = (size_t)lc * plane;
  CT_ASSERT(2 * n <= INT_MAX);
  if (mean) be->copy_2d(B, (int)n, mom, (int)(2 * n), mean, (int)n);
  if (logvar) be->clamp_fwd(B, (int)n, mom + n, (int)(2 * n), -30.0f, 20.0f, logvar, (int)n);
}

ct_status ct_vae_encode(ct_vae *v, int B, int H, int W, const float *x, float *mean, float *logvar,
                        ct_err *err) {
  const float *mom = NULL;
  ct_status st = ct_vae_encode_moments(v, B, H, W, x, &mom, err);
  if (!st) {
    const int f = ct_vae_factor(&v->cfg);
    ct_vae_split_moments(v->be, B, v->cfg.latent_channels, (size_t)(H / f) * (size_t)(W / f), mom,
                         mean, logvar);
  }
  return st;
}

ct_status ct_vae_decode(ct_vae *v, int B, int h, int w_, const float *z, float *x, ct_err *err) {
  const ct_vae_config *c = &v->cfg;
  const int nb = c->nblocks, *boc = c->block_out_channels;
  if (B < 1 || h < 1 || w_ < 1)
    return ct_errf(err, CT_ERR_SHAPE, "VAE decode: empty latent %dx%d", w_, h);
  size_t need = (size_t)B * (size_t)c->latent_channels * h * w_;
  int prev = boc[nb - 1];
  for (int i = 0; i < nb; i++) {
    const int out = boc[nb - 1 - i];
    const size_t px = (size_t)(h << i) * (size_t)(w_ << i);
    need = maxz(need, (size_t)B * (size_t)(prev > out ? prev : out) * px);
    if (i < nb - 1) need = maxz(need, (size_t)B * (size_t)out * px * 4);
    prev = out;
  }
  const size_t full = (size_t)(h << (nb - 1)) * (size_t)(w_ << (nb - 1));
  need = maxz(need, (size_t)B * (size_t)c->out_channels * full);
  ct_status st = workspace(v, need, B, (size_t)B * h * w_, err);
  if (st) return st;
  ws w;
  ws_init(v, &w);
  act in = {(float *)z, c->latent_channels, h, w_};
  if (c->use_post_quant_conv) {
    st = conv(v, B, &v->post_quant, &in, 0, &w.t1, err);
    if (!st) st = conv(v, B, &v->d_in, &w.t1, 0, w.cur, err);
  } else {
    st = conv(v, B, &v->d_in, &in, 0, w.cur, err);
  }
  if (!st) st = run_mid(v, B, &v->d_mid, &w, err);
  for (int i = 0; !st && i < nb; i++) {
    const vblock *b = &v->d_blocks[i];
    for (int j = 0; !st && j < b->nres; j++) st = run_res(v, B, &b->res[j], &w, err);
    if (!st && b->has_sampler) {
      act *u = &w.t1;
      v->be->upsample2x_fwd(B * w.cur->C, w.cur->H, w.cur->W, w.cur->p, u->p);
      u->C = w.cur->C, u->H = 2 * w.cur->H, u->W = 2 * w.cur->W;
      st = conv(v, B, &b->sampler, u, 0, w.nxt, err);
      swap(&w);
    }
  }
  if (st) return st;
  gn_silu(v, B, &v->d_norm, w.cur, &w.t1, 1);
  act out = {x, 0, 0, 0};
  return conv(v, B, &v->d_out, &w.t1, 0, &out, err);
}

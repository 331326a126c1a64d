/* unet_config.c: the U-net's configuration from diffusers' unet/config.json
 * (UNet2DConditionModel.__init__'s arguments, diffusers
 * src/diffusers/models/unets/unet_2d_condition.py), its defaults, SDXL's
 * values, and the refusal by name of what ctuner does not implement. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "unet_int.h"

void ct_unet_config_defaults(ct_unet_config *c) {
  memset(c, 0, sizeof *c);
  c->in_channels = c->out_channels = 4;
  c->nblocks = 4; /* diffusers' own default: (320, 640, 1280, 1280), cross, cross, cross, down */
  const int boc[4] = {320, 640, 1280, 1280};
  for (int i = 0; i < 4; i++) {
    c->block_out_channels[i] = boc[i];
    c->down_cross[i] = i < 3;
    c->up_cross[i] = i > 0;
    c->transformer_layers[i] = 1;
    c->heads[i] = 8;
  }
  c->layers_per_block = 2;
  c->cross_attention_dim = 1280;
  c->norm_num_groups = 32;
  c->norm_eps = 1e-5f;
  c->flip_sin_to_cos = 1;
  c->sample_size = 64;
}

void ct_unet_config_sdxl(ct_unet_config *c) {
  ct_unet_config_defaults(c);
  c->nblocks = 3;
  const int boc[3] = {320, 640, 1280}, tl[3] = {1, 2, 10}, heads[3] = {5, 10, 20};
  for (int i = 0; i < 3; i++) {
    c->block_out_channels[i] = boc[i];
    c->down_cross[i] = i > 0;
    c->up_cross[i] = i < 2;
    c->transformer_layers[i] = tl[i];
    c->heads[i] = heads[i];
  }
  c->cross_attention_dim = 2048;
  c->use_linear_projection = 1;
  c->text_time = 1;
  c->addition_time_embed_dim = 256;
  c->projection_class_embeddings_input_dim = 2816;
  c->sample_size = 128;
}

int ct_unet_pooled_dim(const ct_unet_config *c) {
  return c->projection_class_embeddings_input_dim - 6 * c->addition_time_embed_dim;
}

ct_status ct_unet_config_validate(const ct_unet_config *c, ct_err *err) {
  if (c->nblocks < 1 || c->nblocks > CT_UNET_MAX_BLOCKS)
    return ct_errf(err, CT_ERR_INVALID, "block_out_channels must list 1 to %d blocks",
                   CT_UNET_MAX_BLOCKS);
  if (c->layers_per_block < 1 || c->layers_per_block + 1 > UNET_MAX_LAYERS)
    return ct_errf(err, CT_ERR_INVALID, "layers_per_block must be 1 to %d", UNET_MAX_LAYERS - 1);
  if (c->in_channels < 1 || c->out_channels < 1 || c->norm_num_groups < 1 ||
      c->cross_attention_dim < 1 || !(c->norm_eps > 0))
    return ct_errf(err, CT_ERR_INVALID,
                   "in_channels, out_channels, norm_num_groups, cross_attention_dim and "
                   "norm_eps must be positive");
  for (int i = 0; i < c->nblocks; i++) {
    const int C = c->block_out_channels[i];
    if (C < 1 || C % c->norm_num_groups)
      return ct_errf(err, CT_ERR_INVALID,
                     "block_out_channels[%d] = %d is not a positive multiple of norm_num_groups %d",
                     i, C, c->norm_num_groups);
    if (c->heads[i] < 1 || C % c->heads[i])
      return ct_errf(err, CT_ERR_INVALID,
                     "block %d: %d channels do not split into %d heads (config.json's "
                     "attention_head_dim is diffusers' number of heads)",
                     i, C, c->heads[i]);
    if (c->transformer_layers[i] < 1 || c->transformer_layers[i] > 64)
      return ct_errf(err, CT_ERR_INVALID, "transformer_layers_per_block[%d] must be 1 to 64", i);
  }
  if (c->text_time && (c->addition_time_embed_dim < 2 || c->addition_time_embed_dim % 2 ||
                       ct_unet_pooled_dim(c) < 1))
    return ct_errf(err, CT_ERR_INVALID,
                   "addition_embed_type text_time needs an even addition_time_embed_dim and "
                   "projection_class_embeddings_input_dim > 6 * addition_time_embed_dim");
  if (c->block_out_channels[0] % 2)
    return ct_errf(err, CT_ERR_INVALID, "block_out_channels[0] must be even (time embedding)");
  if (!c->flip_sin_to_cos)
    return ct_errf(err, CT_ERR_UNSUPPORTED, "flip_sin_to_cos false is not implemented");
  return CT_OK;
}

/* ---- config.json ---- */

static ct_status get_int(const ct_json *v, const char *path, const char *key, int lo, int hi,
                         int *out, ct_err *err) {
  if (v->type != CT_JSON_NUMBER || !v->is_int || v->i64 < lo || v->i64 > hi)
    return ct_errf(err, CT_ERR_INVALID, "%s: %s must be an integer from %d to %d", path, key, lo,
                   hi);
  *out = (int)v->i64;
  return CT_OK;
}

/* an int or a list of nblocks ints, into out[nblocks] */
static ct_status int_or_list(const ct_json *j, const char *path, const char *key, int n, int *out,
                             ct_err *err) {
  const ct_json *v = ct_json_get(j, key);
  if (!v || v->type == CT_JSON_NULL) return CT_OK;
  if (v->type == CT_JSON_NUMBER) {
    int x = 0;
    ct_status st = get_int(v, path, key, 1, 1 << 16, &x, err);
    for (int i = 0; !st && i < n; i++) out[i] = x;
    return st;
  }
  if (v->type != CT_JSON_ARRAY || (int)v->n != n)
    return ct_errf(err, CT_ERR_INVALID, "%s: %s must be an integer or a list of %d integers", path,
                   key, n);
  for (int i = 0; i < n; i++) {
    ct_status st = get_int(&v->items[i], path, key, 1, 1 << 16, &out[i], err);
    if (st) return st;
  }
  return CT_OK;
}

static ct_status block_types(const ct_json *j, const char *path, const char *key, int n,
                             const char *plain, const char *cross, int *out, ct_err *err) {
  const ct_json *t = ct_json_get(j, key);
  if (!t) return CT_OK;
  if (t->type != CT_JSON_ARRAY || (int)t->n != n)
    return ct_errf(err, CT_ERR_INVALID, "%s: %s must list %d blocks (one per block_out_channels)",
                   path, key, n);
  for (int i = 0; i < n; i++) {
    const ct_json *s = &t->items[i];
    if (s->type == CT_JSON_STRING && !strcmp(s->str, plain))
      out[i] = 0;
    else if (s->type == CT_JSON_STRING && !strcmp(s->str, cross))
      out[i] = 1;
    else
      return ct_errf(err, CT_ERR_UNSUPPORTED, "%s: %s[%d] %s is not implemented (only %s, %s)",
                     path, key, i, s->type == CT_JSON_STRING ? s->str : "(not a string)", plain,
                     cross);
  }
  return CT_OK;
}

/* Keys whose only implemented value is diffusers' default: a JSON literal
 * ("null", "false", a number or a string) compared with the file's value. */
static const char *const fixed_keys[][2] = {
    {"center_input_sample", "false"},
    {"time_embedding_type", "positional"},
    {"class_embed_type", "null"},
    {"encoder_hid_dim", "null"},
    {"encoder_hid_dim_type", "null"},
    {"num_class_embeds", "null"},
    {"dual_cross_attention", "false"},
    {"only_cross_attention", "false"},
    {"mid_block_type", "UNetMidBlock2DCrossAttn"},
    {"act_fn", "silu"},
    {"resnet_time_scale_shift", "default"},
    {"conv_in_kernel", "3"},
    {"conv_out_kernel", "3"},
    {"timestep_post_act", "null"},
    {"time_cond_proj_dim", "null"},
    {"resnet_skip_time_act", "false"},
    {"resnet_out_scale_factor", "1"},
    {"mid_block_only_cross_attention", "null"},
    {"cross_attention_norm", "null"},
    {"attention_type", "default"},
    {"dropout", "0"},
    {"class_embeddings_concat", "false"},
    {"downsample_padding", "1"},
    {"mid_block_scale_factor", "1"},
    {"time_embedding_dim", "null"},
    {"time_embedding_act_fn", "null"},
    {"num_attention_heads", "null"},
    {"reverse_transformer_layers_per_block", "null"},
    {"freq_shift", "0"},
};

static int json_is(const ct_json *v, const char *lit) {
  if (!strcmp(lit, "null")) return v->type == CT_JSON_NULL;
  if (!strcmp(lit, "false")) return v->type == CT_JSON_BOOL && !v->boolean;
  if (v->type == CT_JSON_NUMBER) return v->num == atof(lit);
  return v->type == CT_JSON_STRING && !strcmp(v->str, lit);
}

static ct_status check_fixed(const ct_json *j, const char *path, ct_err *err) {
  for (size_t k = 0; k < sizeof fixed_keys / sizeof fixed_keys[0]; k++) {
    const ct_json *v = ct_json_get(j, fixed_keys[k][0]);
    if (!v || json_is(v, fixed_keys[k][1])) continue;
    /* a "null" default also accepts false for the boolean-or-null keys */
    if (!strcmp(fixed_keys[k][1], "null") && v->type == CT_JSON_BOOL && !v->boolean) continue;
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: %s other than %s is not implemented by ctuner's U-net", path,
                   fixed_keys[k][0], fixed_keys[k][1]);
  }
  return CT_OK;
}

static ct_status parse(const ct_json *j, const char *path, ct_unet_config *c, ct_err *err) {
  const ct_json *cls = ct_json_get(j, "_class_name");
  if (cls && cls->type == CT_JSON_STRING && strcmp(cls->str, "UNet2DConditionModel"))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: _class_name is %s; ctuner loads UNet2DConditionModel", path, cls->str);
  ct_status st = check_fixed(j, path, err);
  if (st) return st;
  const ct_json *boc = ct_json_get(j, "block_out_channels");
  if (boc) {
    if (boc->type != CT_JSON_ARRAY || boc->n < 1 || boc->n > CT_UNET_MAX_BLOCKS)
      return ct_errf(err, CT_ERR_INVALID, "%s: block_out_channels must list 1 to %d integers", path,
                     CT_UNET_MAX_BLOCKS);
    for (size_t i = 0; i < boc->n; i++)
      if ((st = get_int(&boc->items[i], path, "block_out_channels", 1, 1 << 16,
                        &c->block_out_channels[i], err)))
        return st;
    c->nblocks = (int)boc->n;
  }
  const int n = c->nblocks;
  if ((st = block_types(j, path, "down_block_types", n, "DownBlock2D", "CrossAttnDownBlock2D",
                        c->down_cross, err)) ||
      (st = block_types(j, path, "up_block_types", n, "UpBlock2D", "CrossAttnUpBlock2D",
                        c->up_cross, err)))
    return st;
  if ((st = int_or_list(j, path, "transformer_layers_per_block", n, c->transformer_layers, err)) ||
      (st = int_or_list(j, path, "attention_head_dim", n, c->heads, err)))
    return st;
  static const char *const ints[] = {"in_channels",
                                     "out_channels",
                                     "layers_per_block",
                                     "cross_attention_dim",
                                     "norm_num_groups",
                                     "addition_time_embed_dim",
                                     "projection_class_embeddings_input_dim",
                                     "sample_size"};
  int *dst[] = {&c->in_channels,
                &c->out_channels,
                &c->layers_per_block,
                &c->cross_attention_dim,
                &c->norm_num_groups,
                &c->addition_time_embed_dim,
                &c->projection_class_embeddings_input_dim,
                &c->sample_size};
  for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
    const ct_json *v = ct_json_get(j, ints[k]);
    if (v && v->type != CT_JSON_NULL && (st = get_int(v, path, ints[k], 0, 1 << 20, dst[k], err)))
      return st;
  }
  static const char *const bools[] = {"use_linear_projection", "flip_sin_to_cos",
                                      "upcast_attention"};
  int *bdst[] = {&c->use_linear_projection, &c->flip_sin_to_cos, &c->upcast_attention};
  for (size_t k = 0; k < 3; k++) {
    const ct_json *v = ct_json_get(j, bools[k]);
    if (!v || v->type == CT_JSON_NULL) continue;
    if (v->type != CT_JSON_BOOL)
      return ct_errf(err, CT_ERR_INVALID, "%s: %s must be true or false", path, bools[k]);
    *bdst[k] = v->boolean;
  }
  const ct_json *eps = ct_json_get(j, "norm_eps");
  if (eps && eps->type == CT_JSON_NUMBER) c->norm_eps = (float)eps->num;
  const ct_json *aet = ct_json_get(j, "addition_embed_type");
  if (aet && aet->type == CT_JSON_STRING && !strcmp(aet->str, "text_time"))
    c->text_time = 1;
  else if (aet && aet->type != CT_JSON_NULL)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: addition_embed_type %s is not implemented (only \"text_time\" or null)",
                   path, aet->type == CT_JSON_STRING ? aet->str : "(not a string)");
  return CT_OK;
}

ct_status ct_unet_config_load(const char *path, ct_unet_config *c, ct_err *err) {
  ct_unet_config_defaults(c);
  ct_json *j = NULL;
  ct_status st = ct_json_parse_file(path, 1 << 20, &j, err);
  if (st) return st;
  if (j->type != CT_JSON_OBJECT)
    st = ct_errf(err, CT_ERR_FORMAT, "%s: not a JSON object", path);
  else
    st = parse(j, path, c, err);
  ct_json_free(j);
  if (!st && (st = ct_unet_config_validate(c, err))) ct_err_prefix(err, "%s: ", path);
  return st;
}

/* ---- config.json out ---- */

typedef struct jbuf {
  char *s;
  size_t n, cap;
  int oom;
} jbuf;

static void jput(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jput(jbuf *b, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (b->s && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t nc = (b->cap + (size_t)k + 1) * 2;
    char *ns = realloc(b->s, nc);
    if (!ns) {
      b->oom = 1;
      return;
    }
    b->s = ns, b->cap = nc;
  }
}

static void jlist(jbuf *b, const char *key, const int *v, int n, const char *s0, const char *s1) {
  jput(b, "  \"%s\": [", key);
  for (int i = 0; i < n; i++) {
    if (s0)
      jput(b, "%s\"%s\"", i ? ", " : "", v[i] ? s1 : s0);
    else
      jput(b, "%s%d", i ? ", " : "", v[i]);
  }
  jput(b, "],\n");
}

char *ct_unet_config_json(const ct_unet_config *c) {
  jbuf b = {0};
  const int n = c->nblocks;
  jput(&b, "{\n  \"_class_name\": \"UNet2DConditionModel\",\n  \"act_fn\": \"silu\",\n");
  if (c->text_time)
    jput(&b,
         "  \"addition_embed_type\": \"text_time\",\n  \"addition_time_embed_dim\": %d,\n"
         "  \"projection_class_embeddings_input_dim\": %d,\n",
         c->addition_time_embed_dim, c->projection_class_embeddings_input_dim);
  else
    jput(&b, "  \"addition_embed_type\": null,\n");
  jlist(&b, "attention_head_dim", c->heads, n, NULL, NULL);
  jlist(&b, "block_out_channels", c->block_out_channels, n, NULL, NULL);
  jlist(&b, "down_block_types", c->down_cross, n, "DownBlock2D", "CrossAttnDownBlock2D");
  jlist(&b, "up_block_types", c->up_cross, n, "UpBlock2D", "CrossAttnUpBlock2D");
  jlist(&b, "transformer_layers_per_block", c->transformer_layers, n, NULL, NULL);
  jput(&b,
       "  \"center_input_sample\": false,\n  \"cross_attention_dim\": %d,\n"
       "  \"flip_sin_to_cos\": true,\n  \"freq_shift\": 0,\n  \"in_channels\": %d,\n"
       "  \"layers_per_block\": %d,\n  \"mid_block_type\": \"UNetMidBlock2DCrossAttn\",\n"
       "  \"norm_eps\": %g,\n  \"norm_num_groups\": %d,\n  \"out_channels\": %d,\n"
       "  \"resnet_time_scale_shift\": \"default\",\n  \"sample_size\": %d,\n"
       "  \"upcast_attention\": %s,\n  \"use_linear_projection\": %s\n}\n",
       c->cross_attention_dim, c->in_channels, c->layers_per_block, (double)c->norm_eps,
       c->norm_num_groups, c->out_channels, c->sample_size, c->upcast_attention ? "true" : "false",
       c->use_linear_projection ? "true" : "false");
  if (b.oom) free(b.s), b.s = NULL;
  return b.s;
}

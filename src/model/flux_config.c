/* diffusers' FluxTransformer2DModel config.json <-> ct_mmdit_config.
 *
 * diffusers packs the 16-channel latent 2x2 before the model (in_channels 64,
 * patch_size 1); ctuner packs inside (in_channels 16, patch 2) — the same
 * weights. Every field is checked; a field ctuner does not know, or a value it
 * cannot honour, is refused by name (docs/flux.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "ctuner/mmdit.h"

#define FLUX_CLASS "FluxTransformer2DModel"
#define FLUX_DIFFUSERS_VERSION "0.42.1"

/* Fields written by save_pretrained that carry no model shape. */
static const char *const ignored[] = {"_diffusers_version", "_name_or_path"};

static ct_status get_int(const ct_json *o, const char *where, const char *key, int lo, int *out,
                         ct_err *err) {
  const ct_json *v = ct_json_get(o, key);
  if (!v) return ct_errf(err, CT_ERR_FORMAT, "%s: field %s is missing", where, key);
  if (v->type != CT_JSON_NUMBER || !v->is_int || v->i64 < lo || v->i64 > 1000000)
    return ct_errf(err, CT_ERR_FORMAT, "%s: %s must be an integer >= %d (line %d)", where, key, lo,
                   v->line);
  *out = (int)v->i64;
  return CT_OK;
}

static ct_status check_fields(const ct_json *o, const char *where, ct_err *err) {
  static const char *const known[] = {
      "_class_name",           "patch_size",          "in_channels",
      "out_channels",          "num_layers",          "num_single_layers",
      "attention_head_dim",    "num_attention_heads", "joint_attention_dim",
      "pooled_projection_dim", "guidance_embeds",     "axes_dims_rope"};
  for (size_t i = 0; i < o->n; i++) {
    int ok = 0;
    for (size_t k = 0; k < sizeof known / sizeof known[0] && !ok; k++)
      ok = !strcmp(o->keys[i], known[k]);
    for (size_t k = 0; k < sizeof ignored / sizeof ignored[0] && !ok; k++)
      ok = !strcmp(o->keys[i], ignored[k]);
    if (!ok)
      return ct_errf(err, CT_ERR_UNSUPPORTED,
                     "%s: field %s (line %d) is not supported by ctuner's Flux transformer "
                     "(known: patch_size, in_channels, out_channels, num_layers, "
                     "num_single_layers, attention_head_dim, num_attention_heads, "
                     "joint_attention_dim, pooled_projection_dim, guidance_embeds, axes_dims_rope)",
                     where, o->keys[i], o->items[i].line);
  }
  const ct_json *cls = ct_json_get(o, "_class_name");
  if (!cls || cls->type != CT_JSON_STRING || strcmp(cls->str, FLUX_CLASS))
    return ct_errf(err, CT_ERR_UNSUPPORTED, "%s: _class_name is %s%s%s; ctuner loads %s", where,
                   cls && cls->type == CT_JSON_STRING ? "\"" : "",
                   !cls                          ? "missing"
                   : cls->type == CT_JSON_STRING ? cls->str
                                                 : "not a string",
                   cls && cls->type == CT_JSON_STRING ? "\"" : "", FLUX_CLASS);
  return CT_OK;
}

static ct_status read_axes(const ct_json *o, const char *where, ct_mmdit_config *c, ct_err *err) {
  const ct_json *ax = ct_json_get(o, "axes_dims_rope");
  if (!ax) return ct_errf(err, CT_ERR_FORMAT, "%s: field axes_dims_rope is missing", where);
  if (ax->type != CT_JSON_ARRAY || ax->n != 3)
    return ct_errf(err, CT_ERR_FORMAT, "%s: axes_dims_rope must be a list of 3 integers (line %d)",
                   where, ax->line);
  for (int i = 0; i < 3; i++) {
    const ct_json *v = &ax->items[i];
    if (v->type != CT_JSON_NUMBER || !v->is_int || v->i64 < 0 || v->i64 > 100000)
      return ct_errf(err, CT_ERR_FORMAT, "%s: axes_dims_rope[%d] must be an integer >= 0", where,
                     i);
    c->axes_dim[i] = (int)v->i64;
  }
  return CT_OK;
}

static ct_status from_json(const ct_json *o, const char *where, ct_mmdit_config *c, ct_err *err) {
  ct_status st;
  int patch = 0, in = 0, out = 0, hd = 0, heads = 0;
  if (o->type != CT_JSON_OBJECT)
    return ct_errf(err, CT_ERR_FORMAT, "%s: the config must be a JSON object", where);
  if ((st = check_fields(o, where, err))) return st;
  memset(c, 0, sizeof *c);
  if ((st = get_int(o, where, "patch_size", 1, &patch, err)) ||
      (st = get_int(o, where, "in_channels", 1, &in, err)) ||
      (st = get_int(o, where, "num_layers", 0, &c->depth_double, err)) ||
      (st = get_int(o, where, "num_single_layers", 0, &c->depth_single, err)) ||
      (st = get_int(o, where, "attention_head_dim", 2, &hd, err)) ||
      (st = get_int(o, where, "num_attention_heads", 1, &heads, err)) ||
      (st = get_int(o, where, "joint_attention_dim", 1, &c->context_in_dim, err)) ||
      (st = get_int(o, where, "pooled_projection_dim", 1, &c->vec_in_dim, err)))
    return st;
  if (patch != 1)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: patch_size %d is not supported (FLUX.1 packs 2x2 outside the model: "
                   "patch_size 1, in_channels 64)",
                   where, patch);
  if (in % 4)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: in_channels %d is not a 2x2-packed latent (a multiple of 4)", where, in);
  const ct_json *oc = ct_json_get(o, "out_channels");
  out = in;
  if (oc && oc->type != CT_JSON_NULL) {
    if (oc->type != CT_JSON_NUMBER || !oc->is_int)
      return ct_errf(err, CT_ERR_FORMAT, "%s: out_channels must be an integer or null", where);
    out = (int)oc->i64;
  }
  if (out != in)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: out_channels %d differs from in_channels %d; ctuner predicts the latent "
                   "it is given",
                   where, out, in);
  const ct_json *g = ct_json_get(o, "guidance_embeds");
  if (g && g->type != CT_JSON_BOOL)
    return ct_errf(err, CT_ERR_FORMAT, "%s: guidance_embeds must be true or false", where);
  if ((st = read_axes(o, where, c, err))) return st;
  if ((int64_t)hd * heads > 1000000)
    return ct_errf(err, CT_ERR_RANGE, "%s: attention_head_dim x num_attention_heads too large",
                   where);
  c->in_channels = in / 4;
  c->patch = 2;
  c->hidden = hd * heads;
  c->heads = heads;
  c->mlp_ratio = 4;
  c->qkv_bias = 1;
  c->guidance_embed = g ? g->boolean : 0;
  c->theta = 10000.f;
  st = ct_mmdit_config_validate(c, err);
  if (st) {
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    st = ct_errf(err, st, "%s: %s", where, msg);
  }
  return st;
}

ct_status ct_flux_config_parse(const char *json, size_t len, const char *where,
                               ct_mmdit_config *cfg, ct_err *err) {
  ct_json *j = NULL;
  ct_status st = ct_json_parse(json, len, &j, err);
  if (st) {
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    return ct_errf(err, st, "%s: %s", where, msg);
  }
  st = from_json(j, where, cfg, err);
  ct_json_free(j);
  return st;
}

ct_status ct_flux_config_read(const char *path, ct_mmdit_config *cfg, ct_err *err) {
  ct_json *j = NULL;
  ct_status st = ct_json_parse_file(path, 1 << 20, &j, err);
  if (st) return st;
  st = from_json(j, path, cfg, err);
  ct_json_free(j);
  return st;
}

ct_status ct_flux_config_json(const ct_mmdit_config *c, char **out, ct_err *err) {
  ct_status st = ct_mmdit_config_validate(c, err);
  if (st) return st;
  if (c->patch != 2 || c->mlp_ratio != 4 || !c->qkv_bias || c->theta != 10000.f)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "diffusers' FluxTransformer2DModel has patch 2 (outside), mlp_ratio 4, qkv "
                   "bias and RoPE theta 10000; this model has %d, %d, %d, %g",
                   c->patch, c->mlp_ratio, c->qkv_bias, (double)c->theta);
  char *s = malloc(1024);
  if (!s) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  snprintf(s, 1024,
           "{\n  \"_class_name\": \"%s\",\n  \"_diffusers_version\": \"%s\",\n"
           "  \"attention_head_dim\": %d,\n  \"axes_dims_rope\": [\n    %d,\n    %d,\n    %d\n"
           "  ],\n  \"guidance_embeds\": %s,\n  \"in_channels\": %d,\n"
           "  \"joint_attention_dim\": %d,\n  \"num_attention_heads\": %d,\n"
           "  \"num_layers\": %d,\n  \"num_single_layers\": %d,\n  \"out_channels\": null,\n"
           "  \"patch_size\": 1,\n  \"pooled_projection_dim\": %d\n}\n",
           FLUX_CLASS, FLUX_DIFFUSERS_VERSION, c->hidden / c->heads, c->axes_dim[0], c->axes_dim[1],
           c->axes_dim[2], c->guidance_embed ? "true" : "false", c->in_channels * 4,
           c->context_in_dim, c->heads, c->depth_double, c->depth_single, c->vec_in_dim);
  *out = s;
  return CT_OK;
}

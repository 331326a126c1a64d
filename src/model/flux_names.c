/* The name map between ctuner's (BFL, flux1-dev.safetensors) parameter names and
 * diffusers' FluxTransformer2DModel ones: one table of rules, checked against
 * diffusers' own conversion (scripts/convert_flux_to_diffusers.py,
 * convert_flux_transformer_checkpoint_to_diffusers) and against diffusers
 * itself by tests/test_flux.c on scripts/flux_golden.py's goldens.
 *
 * A rule maps a BFL tensor (the part after "double_blocks.N." / "single_blocks.N."
 * or the whole name, without ".weight"/".bias") to 1..4 diffusers tensors that
 * are consecutive row ranges of it; SWAP maps the two halves crosswise (the
 * final modulation: BFL shift;scale, diffusers scale;shift).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/mmdit.h"

enum { WHOLE, QKV, LIN1, SWAP };

typedef struct rule {
  int where; /* 0 top level, 1 double block, 2 single block */
  const char *bfl;
  int kind;
  const char *dif[4];
} rule;

/* Norm scales: BFL ".scale" <-> diffusers ".weight" (the rule names carry them). */
static const rule rules[] = {
    {0, "img_in", WHOLE, {"x_embedder"}},
    {0, "time_in.in_layer", WHOLE, {"time_text_embed.timestep_embedder.linear_1"}},
    {0, "time_in.out_layer", WHOLE, {"time_text_embed.timestep_embedder.linear_2"}},
    {0, "vector_in.in_layer", WHOLE, {"time_text_embed.text_embedder.linear_1"}},
    {0, "vector_in.out_layer", WHOLE, {"time_text_embed.text_embedder.linear_2"}},
    {0, "guidance_in.in_layer", WHOLE, {"time_text_embed.guidance_embedder.linear_1"}},
    {0, "guidance_in.out_layer", WHOLE, {"time_text_embed.guidance_embedder.linear_2"}},
    {0, "txt_in", WHOLE, {"context_embedder"}},
    {0, "final_layer.linear", WHOLE, {"proj_out"}},
    {0, "final_layer.adaLN_modulation.1", SWAP, {"norm_out.linear"}},
    {1, "img_mod.lin", WHOLE, {"norm1.linear"}},
    {1, "txt_mod.lin", WHOLE, {"norm1_context.linear"}},
    {1, "img_attn.qkv", QKV, {"attn.to_q", "attn.to_k", "attn.to_v"}},
    {1, "txt_attn.qkv", QKV, {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"}},
    {1, "img_attn.norm.query_norm.scale", WHOLE, {"attn.norm_q.weight"}},
    {1, "img_attn.norm.key_norm.scale", WHOLE, {"attn.norm_k.weight"}},
    {1, "txt_attn.norm.query_norm.scale", WHOLE, {"attn.norm_added_q.weight"}},
    {1, "txt_attn.norm.key_norm.scale", WHOLE, {"attn.norm_added_k.weight"}},
    {1, "img_attn.proj", WHOLE, {"attn.to_out.0"}},
    {1, "txt_attn.proj", WHOLE, {"attn.to_add_out"}},
    {1, "img_mlp.0", WHOLE, {"ff.net.0.proj"}},
    {1, "img_mlp.2", WHOLE, {"ff.net.2"}},
    {1, "txt_mlp.0", WHOLE, {"ff_context.net.0.proj"}},
    {1, "txt_mlp.2", WHOLE, {"ff_context.net.2"}},
    {2, "linear1", LIN1, {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"}},
    {2, "linear2", WHOLE, {"proj_out"}},
    {2, "norm.query_norm.scale", WHOLE, {"attn.norm_q.weight"}},
    {2, "norm.key_norm.scale", WHOLE, {"attn.norm_k.weight"}},
    {2, "modulation.lin", WHOLE, {"norm.linear"}},
};

static const char *const block_prefix[3][2] = {{"", ""},
                                               {"double_blocks.", "transformer_blocks."},
                                               {"single_blocks.", "single_transformer_blocks."}};

/* Split a table name into (where, block, stem, suffix). suffix is ".weight",
 * ".bias" or "" (a norm scale, whose stem ends in ".scale"). */
static int split_name(const char *name, int *where, int *block, char *stem, size_t cap,
                      const char **suffix) {
  const char *p = name;
  *where = 0;
  *block = -1;
  for (int w = 1; w <= 2; w++) {
    size_t l = strlen(block_prefix[w][0]);
    if (!strncmp(name, block_prefix[w][0], l)) {
      char *end;
      long b = strtol(name + l, &end, 10);
      if (end == name + l || *end != '.') return -1;
      *where = w;
      *block = (int)b;
      p = end + 1;
    }
  }
  size_t n = strlen(p);
  *suffix = "";
  if (n > 7 && !strcmp(p + n - 7, ".weight")) {
    *suffix = ".weight";
    n -= 7;
  } else if (n > 5 && !strcmp(p + n - 5, ".bias")) {
    *suffix = ".bias";
    n -= 5;
  }
  if (n + 1 > cap) return -1;
  memcpy(stem, p, n);
  stem[n] = 0;
  return 0;
}

static void put(ct_flux_name *e, const ct_param *p, int where, int block, const char *dif,
                const char *suffix, int64_t bfl_row, int64_t dif_row, int64_t rows,
                int64_t dif_rows) {
  memset(e, 0, sizeof *e);
  snprintf(e->bfl, sizeof e->bfl, "%s", p->name);
  if (where)
    snprintf(e->dif, sizeof e->dif, "%s%d.%s%s", block_prefix[where][1], block, dif, suffix);
  else
    snprintf(e->dif, sizeof e->dif, "%s%s", dif, suffix);
  e->bfl_row = bfl_row;
  e->dif_row = dif_row;
  e->rows = rows;
  e->dif_rows = dif_rows;
  e->cols = p->ndim == 2 ? p->shape[1] : 0;
}

/* Append the map rows of table entry p; returns how many (0: no rule). */
static int map_one(const ct_mmdit_config *c, const ct_param *p, ct_flux_name *e) {
  int where, block, d = c->hidden;
  char stem[96];
  const char *suffix;
  if (split_name(p->name, &where, &block, stem, sizeof stem, &suffix)) return 0;
  for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
    const rule *r = &rules[i];
    if (r->where != where || strcmp(r->bfl, stem)) continue;
    int64_t R = p->shape[0];
    switch (r->kind) {
      case WHOLE:
        put(e, p, where, block, r->dif[0], suffix, 0, 0, R, R);
        return 1;
      case SWAP: /* BFL rows [shift; scale], diffusers [scale; shift] */
        put(&e[0], p, where, block, r->dif[0], suffix, 0, R / 2, R / 2, R);
        put(&e[1], p, where, block, r->dif[0], suffix, R / 2, 0, R / 2, R);
        return 2;
      case QKV:
        for (int k = 0; k < 3; k++) put(&e[k], p, where, block, r->dif[k], suffix, k * d, 0, d, d);
        return 3;
      case LIN1:
        for (int k = 0; k < 3; k++) put(&e[k], p, where, block, r->dif[k], suffix, k * d, 0, d, d);
        put(&e[3], p, where, block, r->dif[3], suffix, 3 * d, 0, R - 3 * d, R - 3 * d);
        return 4;
    }
  }
  return 0;
}

ct_status ct_flux_name_map(const ct_mmdit_config *cfg, ct_flux_name **out, size_t *n, ct_err *err) {
  ct_param *t = NULL;
  size_t np = 0, numel = 0, k = 0;
  ct_flux_name *m = NULL;
  ct_status st = ct_mmdit_param_table(cfg, &t, &np, &numel, err);
  if (st) goto out;
  m = calloc(np * 4, sizeof *m);
  if (!m) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < np; i++) {
    int got = map_one(cfg, &t[i], m + k);
    if (!got) {
      st = ct_errf(err, CT_ERR_INTERNAL, "no diffusers name for ctuner's tensor %s", t[i].name);
      goto out;
    }
    k += (size_t)got;
  }
  *out = m;
  *n = k;
  m = NULL;
out:
  free(m);
  free(t);
  return st;
}

/* FluxPipeline._pack_latents: (B, C, H, W) -> (B, H/2 * W/2, C * 4), token
 * (row, col) row-major, features (c, ph, pw). */
void ct_flux_pack(int B, int C, int H, int W, const float *x, float *out) {
  int h2 = H / 2, w2 = W / 2;
  for (int b = 0; b < B; b++)
    for (int i = 0; i < h2; i++)
      for (int j = 0; j < w2; j++)
        for (int c = 0; c < C; c++)
          for (int p = 0; p < 4; p++)
            out[(((size_t)b * h2 + i) * w2 + j) * 4 * C + c * 4 + p] =
                x[(((size_t)b * C + c) * H + 2 * i + p / 2) * W + 2 * j + p % 2];
}

void ct_flux_unpack(int B, int C, int H, int W, const float *in, float *x) {
  int h2 = H / 2, w2 = W / 2;
  for (int b = 0; b < B; b++)
    for (int i = 0; i < h2; i++)
      for (int j = 0; j < w2; j++)
        for (int c = 0; c < C; c++)
          for (int p = 0; p < 4; p++)
            x[(((size_t)b * C + c) * H + 2 * i + p / 2) * W + 2 * j + p % 2] =
                in[(((size_t)b * h2 + i) * w2 + j) * 4 * C + c * 4 + p];
}

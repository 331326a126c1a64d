/* An adapter in kohya's Flux key layout (include/ctuner/lora_tools.h,
 * docs/lora.md): `ctuner lora export --format comfyui`. ctuner's adapters
 * follow diffusers' modules (to_q, to_k, to_v); the BFL weights kohya names
 * fuse some of them (qkv, linear1), so the adapters of one BFL weight become
 * one LoRA of rank n r with a concatenated down and a block-diagonal up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/log.h"
#include "ctuner/lora_tools.h"
#include "ctuner/safetensors.h"

/* "double_blocks.0.img_attn.qkv.weight" -> "lora_unet_double_blocks_0_img_attn_qkv" */
static void kohya_name(const char *base, char *out, size_t cap) {
  size_t n = strlen(base);
  if (n > 7 && !strcmp(base + n - 7, ".weight")) n -= 7;
  int k = snprintf(out, cap, "lora_unet_%.*s", (int)n, base);
  for (char *p = out + 10; k > 0 && *p; p++)
    if (*p == '.') *p = '_';
}

/* One BFL weight's adapters [first, first + n) of the group list g. */
typedef struct group {
  const char *base;
  int rows; /* of the BFL weight */
  int in, n;
  size_t *idx; /* adapter indices */
} group;

static ct_status build_groups(const ct_lora_adapter *ad, size_t nad, group *g, size_t *ng,
                              size_t *idx, ct_err *err) {
  size_t k = 0;
  int *of = malloc((nad ? nad : 1) * sizeof *of); /* adapter -> its group */
  if (!of) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < nad; i++) { /* the groups, in first-appearance order, and their sizes */
    size_t j = 0;
    while (j < k && strcmp(g[j].base, ad[i].base)) j++;
    if (j == k) g[k++] = (group){ad[i].base, 0, ad[i].in, 0, NULL};
    if (g[j].in != ad[i].in) {
      free(of);
      return ct_errf(err, CT_ERR_SHAPE, "adapters on %s disagree on its width", ad[i].base);
    }
    of[i] = (int)j;
    g[j].n++;
    for (int p = 0; p < ad[i].npieces; p++) {
      const int end = (int)(ad[i].piece[p].bfl_row + ad[i].piece[p].rows);
      if (end > g[j].rows) g[j].rows = end;
    }
  }
  size_t used = 0;
  for (size_t j = 0; j < k; j++) {
    g[j].idx = idx + used;
    used += (size_t)g[j].n;
    g[j].n = 0;
  }
  for (size_t i = 0; i < nad; i++) g[of[i]].idx[g[of[i]].n++] = i;
  free(of);
  *ng = k;
  return CT_OK;
}

/* down [n r, in] and up [rows, n r] of group g (scale s folded into up). */
static void fill(const group *g, const ct_lora_adapter *ad, const float *w, int r, float s,
                 float *down, float *up) {
  const size_t nr = (size_t)g->n * (size_t)r;
  memset(up, 0, (size_t)g->rows * nr * sizeof *up);
  for (int i = 0; i < g->n; i++) {
    const ct_lora_adapter *a = &ad[g->idx[i]];
    memcpy(down + (size_t)i * r * g->in, w + a->a_off, (size_t)r * g->in * sizeof *down);
    const float *B = w + a->b_off;
    for (int p = 0; p < a->npieces; p++) {
      const ct_lora_piece *pc = &a->piece[p];
      for (int64_t row = 0; row < pc->rows; row++)
        for (int c = 0; c < r; c++)
          up[(size_t)(pc->bfl_row + row) * nr + (size_t)i * r + c] =
              s * B[(size_t)(pc->dif_row + row) * r + c];
    }
  }
}

/* Rows of each group's BFL weight from cfg's parameter table. */
static ct_status base_rows(const ct_mmdit_config *cfg, group *g, size_t ng, ct_err *err) {
  ct_param *tab = NULL;
  size_t n = 0, numel = 0;
  ct_status st = ct_mmdit_param_table(cfg, &tab, &n, &numel, err);
  for (size_t k = 0; k < ng && !st; k++) {
    size_t i = 0;
    while (i < n && strcmp(tab[i].name, g[k].base)) i++;
    if (i == n || tab[i].ndim != 2 || tab[i].shape[1] != g[k].in || tab[i].shape[0] < g[k].rows)
      st = ct_errf(err, CT_ERR_SHAPE, "the adapter on %s does not fit this transformer", g[k].base);
    else
      g[k].rows = (int)tab[i].shape[0];
  }
  free(tab);
  return st;
}

/* What diffusers 0.42.1's kohya converter cannot read back (ComfyUI can):
 * one warning each. */
static void warn_readers(const ct_mmdit_config *cfg, const group *g, size_t ng) {
  int outside = 0, lin1 = 0;
  const char *first = NULL;
  for (size_t k = 0; k < ng; k++) {
    if (strncmp(g[k].base, "double_blocks.", 14) && strncmp(g[k].base, "single_blocks.", 14))
      first = first ? first : g[k].base, outside++;
    lin1 += strstr(g[k].base, ".linear1.") != NULL;
  }
  if (outside)
    CT_WARN(
        "%d LoRA(s) outside the blocks (e.g. %s): ComfyUI applies them, diffusers' "
        "load_lora_weights of a kohya file drops them silently (its converter omits the "
        "transformer. prefix there)",
        outside, first);
  if (lin1 && cfg->hidden != 3072)
    CT_WARN(
        "single-block linear1 LoRAs of a model %d wide: ComfyUI applies them, diffusers' "
        "kohya converter splits linear1 at FLUX.1's widths (3072) and refuses this file",
        cfg->hidden);
}

ct_status ct_lora_export_kohya(const ct_mmdit_config *cfg, const ct_lora *l, double multiplier,
                               const char *path, int dtype, ct_err *err) {
  ct_status st = ct_lora_check_multiplier(multiplier, err);
  if (st) return st;
  size_t nad, ng = 0;
  const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
  const float *w = ct_lora_params((ct_lora *)l);
  const int r = ct_lora_options(l)->rank;
  const float s = (float)(multiplier * (double)ct_lora_scale(l));
  group *g = calloc(nad ? nad : 1, sizeof *g);
  size_t *idx = calloc(nad ? nad : 1, sizeof *idx);
  float **bufs = calloc(2 * (nad ? nad : 1), sizeof *bufs);
  float *alphas = calloc(nad ? nad : 1, sizeof *alphas);
  ct_st_writer *wr = NULL;
  if (!g || !idx || !bufs || !alphas || ct_st_writer_new(&wr)) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    goto out;
  }
  if (!w) {
    st = ct_errf(err, CT_ERR_INVALID, "ct_lora_export_kohya: the adapter has no parameters");
    goto out;
  }
  st = build_groups(ad, nad, g, &ng, idx, err);
  if (!st) st = base_rows(cfg, g, ng, err);
  char name[160], tn[200];
  for (size_t k = 0; k < ng && !st; k++) {
    const size_t nr = (size_t)g[k].n * (size_t)r;
    float *down = bufs[2 * k] = malloc(nr * (size_t)g[k].in * sizeof(float));
    float *up = bufs[2 * k + 1] = malloc((size_t)g[k].rows * nr * sizeof(float));
    if (!down || !up) {
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
      break;
    }
    fill(&g[k], ad, w, r, s, down, up);
    alphas[k] = (float)nr; /* alpha / rank = 1: the scale is in up */
    kohya_name(g[k].base, name, sizeof name);
    const int64_t sd[2] = {(int64_t)nr, g[k].in}, su[2] = {g[k].rows, (int64_t)nr};
    snprintf(tn, sizeof tn, "%s.lora_down.weight", name);
    st = ct_st_writer_add_f32(wr, tn, 2, sd, down, (ct_dtype)dtype, err);
    snprintf(tn, sizeof tn, "%s.lora_up.weight", name);
    if (!st) st = ct_st_writer_add_f32(wr, tn, 2, su, up, (ct_dtype)dtype, err);
    snprintf(tn, sizeof tn, "%s.alpha", name);
    if (!st) st = ct_st_writer_add_f32(wr, tn, 0, NULL, &alphas[k], (ct_dtype)dtype, err);
  }
  if (!st) warn_readers(cfg, g, ng);
  char meta[64];
  snprintf(meta, sizeof meta, "%d", r);
  if (!st) st = ct_st_writer_meta(wr, "format", "pt", err);
  if (!st) st = ct_st_writer_meta(wr, "ss_network_module", "networks.lora_flux", err);
  if (!st) st = ct_st_writer_meta(wr, "ctuner_lora_rank_per_module", meta, err);
  if (!st) st = ct_st_writer_write(wr, path, err);
out:
  for (size_t k = 0; bufs && k < 2 * ng; k++) free(bufs[k]);
  ct_st_writer_free(wr);
  free(bufs), free(alphas), free(idx), free(g);
  return st;
}

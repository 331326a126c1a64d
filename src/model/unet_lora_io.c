/* unet_lora_io.c: U-net LoRA files (include/ctuner/unet.h) in the layout
 * StableDiffusionXLPipeline.save_lora_weights writes and load_lora_weights
 * reads (diffusers loaders/lora_pipeline.py, StableDiffusionXLLoraLoaderMixin):
 * unet.<module>.lora_A.weight [r, in] / lora_B.weight [out, r], and the
 * LoraConfig as "lora_adapter_metadata" with keys prefixed "unet.", which
 * load_lora_weights hands to peft's LoraConfig (so lora_alpha survives). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "ctuner/safetensors.h"
#include "unet_int.h"

static int app(char **b, size_t *n, size_t *cap, const char *s) {
  const size_t k = strlen(s);
  if (*n + k + 1 > *cap) {
    size_t nc = *cap ? *cap * 2 : 1024;
    while (nc < *n + k + 1) nc *= 2;
    char *p = realloc(*b, nc);
    if (!p) return 0;
    *b = p, *cap = nc;
  }
  memcpy(*b + *n, s, k + 1);
  *n += k;
  return 1;
}

/* peft's LoraConfig as diffusers stores it; target_modules: the exact modules */
static char *config_json(const ct_unet_lora *l) {
  char *b = NULL, tmp[200];
  size_t n = 0, cap = 0;
  snprintf(tmp, sizeof tmp,
           "{\"unet.bias\": \"none\", \"unet.lora_alpha\": %.17g, \"unet.lora_dropout\": 0.0, "
           "\"unet.r\": %d, \"unet.target_modules\": [",
           l->alpha, l->rank);
  int ok = app(&b, &n, &cap, tmp);
  for (size_t i = 0; ok && i < l->nad; i++) {
    snprintf(tmp, sizeof tmp, "%s\"%s\"", i ? ", " : "", l->ad[i].lin.name);
    ok = app(&b, &n, &cap, tmp);
  }
  ok = ok && app(&b, &n, &cap, "], \"unet.use_dora\": false}");
  if (!ok) free(b), b = NULL;
  return b;
}

static void tname(const char *prefix, const ct_unet_adapter *a, int which_b, char *out,
                  size_t cap) {
  snprintf(out, cap, "%s%s.lora_%c.weight", prefix, a->lin.name, which_b ? 'B' : 'A');
}

ct_status ct_unet_lora_save(const ct_unet_lora *l, const char *path, ct_err *err) {
  const int direct = l->be->host_memory || l->swapped;
  float *own = direct ? NULL : malloc((l->numel ? l->numel : 1) * sizeof(float));
  if (!direct && !own) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  if (own) l->be->copy_out(own, l->w, l->numel * sizeof(float));
  const float *h = direct ? l->w : own;
  ct_st_writer *wr = NULL;
  char *meta = config_json(l);
  ct_status st =
      meta && !ct_st_writer_new(&wr) ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  char name[160];
  for (size_t i = 0; !st && i < l->nad; i++) {
    const ct_unet_adapter *a = &l->ad[i];
    const int64_t sa[2] = {l->rank, a->lin.in}, sb[2] = {a->lin.out, l->rank};
    tname("unet.", a, 0, name, sizeof name);
    st = ct_st_writer_add_f32(wr, name, 2, sa, h + a->a_off, CT_DTYPE_F32, err);
    tname("unet.", a, 1, name, sizeof name);
    if (!st) st = ct_st_writer_add_f32(wr, name, 2, sb, h + a->b_off, CT_DTYPE_F32, err);
  }
  if (!st) st = ct_st_writer_meta(wr, "format", "pt", err);
  if (!st) st = ct_st_writer_meta(wr, "lora_adapter_metadata", meta, err);
  if (!st) st = ct_st_writer_write(wr, path, err);
  ct_st_writer_free(wr);
  free(meta), free(own);
  return st;
}

/* the file's lora_adapter_metadata (if any) must agree with our rank and alpha */
static ct_status check_meta(const ct_unet_lora *l, const ct_st_file *f, const char *path,
                            ct_err *err) {
  const char *m = ct_st_meta(f, "lora_adapter_metadata");
  if (!m) return CT_OK; /* files without it: the shapes decide */
  ct_json *j = NULL;
  if (ct_json_parse(m, strlen(m), &j, err))
    return ct_errf(err, CT_ERR_FORMAT, "%s: its lora_adapter_metadata is not JSON", path);
  const ct_json *r = ct_json_get(j, "unet.r"), *a = ct_json_get(j, "unet.lora_alpha");
  ct_status st = CT_OK;
  if (r && r->type == CT_JSON_NUMBER && (int)r->num != l->rank)
    st = ct_errf(err, CT_ERR_INVALID, "%s: an adapter of rank %d, not lora_rank %d", path,
                 (int)r->num, l->rank);
  else if (a && a->type == CT_JSON_NUMBER && fabs(a->num - l->alpha) > 1e-9 * fabs(l->alpha))
    st = ct_errf(err, CT_ERR_INVALID,
                 "%s: its lora_alpha is %g, not %g: set lora_alpha to %g to continue it", path,
                 a->num, l->alpha, a->num);
  ct_json_free(j);
  return st;
}

static int ours(const ct_unet_lora *l, const char *prefix, const char *tn) {
  char name[160];
  for (size_t i = 0; i < l->nad; i++)
    for (int b = 0; b < 2; b++) {
      tname(prefix, &l->ad[i], b, name, sizeof name);
      if (!strcmp(name, tn)) return 1;
    }
  return 0;
}

/* ---- kohya's files (sd-scripts' networks/lora.py: lora_unet_<module, dots
 * as _>.lora_down.weight [r, in] / lora_up.weight [out, r] / .alpha, scale
 * alpha / r per module). For SDXL its modules are named in SGM's layout
 * (input_blocks.N.1 = down_blocks.i.attentions.j, N = 1 + i (L + 1) + j;
 * middle_block.1; output_blocks.N.1 = up_blocks.i.attentions.j, N = i (L + 1)
 * + j; L = layers_per_block), as diffusers' _maybe_map_sgm_blocks_to_diffusers
 * maps them back; names in diffusers' layout are read too. */

/* module (a diffusers name) as kohya names it: SGM's layout (sgm 1) or diffusers' */
static int kohya_name(const ct_unet_config *c, const char *mod, int sgm, const char *suffix,
                      char *out, size_t cap) {
  char m[160];
  int i, j, n = 0;
  const int per = c->layers_per_block + 1;
  if (!sgm)
    snprintf(m, sizeof m, "%s", mod);
  else if (sscanf(mod, "down_blocks.%d.attentions.%d.%n", &i, &j, &n) == 2 && n)
    snprintf(m, sizeof m, "input_blocks.%d.1.%s", 1 + i * per + j, mod + n);
  else if (sscanf(mod, "up_blocks.%d.attentions.%d.%n", &i, &j, &n) == 2 && n)
    snprintf(m, sizeof m, "output_blocks.%d.1.%s", i * per + j, mod + n);
  else if (!strncmp(mod, "mid_block.attentions.0.", 23))
    snprintf(m, sizeof m, "middle_block.1.%s", mod + 23);
  else
    return 0;
  int k = snprintf(out, cap, "lora_unet_%s", m);
  for (int x = 10; x < k && (size_t)x < cap; x++)
    if (out[x] == '.') out[x] = '_';
  snprintf(out + k, cap - (size_t)k, ".%s", suffix);
  return 1;
}

/* adapter a's kohya tensor (suffix), SGM's name first; its name into name */
static const ct_st_tensor *kohya_find(const ct_unet_lora *l, const ct_st_file *f,
                                      const ct_unet_adapter *a, const char *suffix, char *name,
                                      size_t cap) {
  for (int sgm = 1; sgm >= 0; sgm--) {
    if (!kohya_name(&l->cfg, a->lin.name, sgm, suffix, name, cap)) continue;
    const ct_st_tensor *t = ct_st_find(f, name);
    if (t) return t;
  }
  return NULL;
}

static ct_status kohya_load(const ct_unet_lora *l, const ct_st_file *f, const char *path, size_t lo,
                            size_t hi, float *out, ct_err *err) {
  ct_st_check *chk = NULL;
  ct_status st = ct_st_check_new(&chk, err);
  char *used = st ? NULL : calloc(f->ntensors + 1, 1);
  if (!st && !used) {
    ct_st_check_done(chk, NULL, "-");
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  char name[200];
  for (size_t i = 0; !st && i < l->nad; i++) {
    const ct_unet_adapter *a = &l->ad[i];
    const char *sfx[3] = {"lora_down.weight", "lora_up.weight", "alpha"};
    for (int b = 0; b < 3; b++) {
      const ct_st_tensor *t = kohya_find(l, f, a, sfx[b], name, sizeof name);
      if (t) used[t - f->tensors] = 1;
      if (b == 2) { /* optional: absent, kohya's scale is 1 (alpha = rank) */
        if (t && t->numel != 1) ct_st_check_tensor(chk, t, name, path, 0, NULL);
        continue;
      }
      if (!t && !kohya_name(&l->cfg, a->lin.name, 1, sfx[b], name, sizeof name))
        kohya_name(&l->cfg, a->lin.name, 0, sfx[b], name, sizeof name);
      const int64_t sh[2] = {b ? a->lin.out : l->rank, b ? l->rank : a->lin.in};
      ct_st_check_tensor(chk, t, name, path, 2, sh);
    }
  }
  for (size_t i = 0; !st && i < f->ntensors; i++)
    if (!used[i]) ct_st_check_unexpected(chk, f->tensors[i].name, path);
  free(used);
  if (!st)
    st = ct_st_check_done(chk, err,
                          "%s (kohya's names) is not an adapter for this U-net and lora_target "
                          "(ctuner's SDXL LoRA adapts the U-net only)",
                          path);
  for (size_t i = 0; !st && i < l->nad; i++)
    for (int b = 0; !st && b < 2; b++) {
      const ct_unet_adapter *a = &l->ad[i];
      const size_t off = b ? a->b_off : a->a_off,
                   n = (size_t)l->rank * (b ? a->lin.out : a->lin.in);
      const size_t x0 = off > lo ? off : lo, x1 = off + n < hi ? off + n : hi;
      if (x0 >= x1) continue;
      float alpha = (float)l->rank, *o = out + (x0 - lo);
      const ct_st_tensor *at = kohya_find(l, f, a, "alpha", name, sizeof name);
      if (at) st = ct_st_to_f32(at, &alpha, 1, err);
      const ct_st_tensor *t =
          kohya_find(l, f, a, b ? "lora_up.weight" : "lora_down.weight", name, sizeof name);
      if (!st) st = ct_st_to_f32_range(t, x0 - off, x1 - x0, o, err);
      /* up: kohya's scale alpha_k / r folded in, ours divided out */
      const float k = b ? alpha / (float)l->rank / l->scale : 1.0f;
      for (size_t x = 0; !st && b && x < x1 - x0; x++) o[x] *= k;
    }
  return st;
}

ct_status ct_unet_lora_load_range(const ct_unet_lora *l, const char *path, size_t lo, size_t hi,
                                  float *out, ct_err *err) {
  ct_st_file *f = NULL;
  ct_status st = ct_st_open(path, &f, err);
  if (st) return st;
  st = check_meta(l, f, path, err);
  for (size_t i = 0; !st && i < f->ntensors; i++)
    if (!strncmp(f->tensors[i].name, "lora_unet_", 10) ||
        !strncmp(f->tensors[i].name, "lora_te", 7)) {
      st = kohya_load(l, f, path, lo, hi, out, err);
      ct_st_close(f);
      return st;
    }
  /* diffusers' names carry "unet."; peft's own state dict (get_peft_model_state_dict) none */
  const char *prefix = f->ntensors && strncmp(f->tensors[0].name, "unet.", 5) ? "" : "unet.";
  ct_st_check *chk = NULL;
  if (!st) st = ct_st_check_new(&chk, err);
  char name[160];
  for (size_t i = 0; !st && i < l->nad; i++)
    for (int b = 0; b < 2; b++) {
      const int64_t sh[2] = {b ? l->ad[i].lin.out : l->rank, b ? l->rank : l->ad[i].lin.in};
      tname(prefix, &l->ad[i], b, name, sizeof name);
      ct_st_check_tensor(chk, ct_st_find(f, name), name, path, 2, sh);
    }
  for (size_t i = 0; !st && i < f->ntensors; i++)
    if (!ours(l, prefix, f->tensors[i].name)) ct_st_check_unexpected(chk, f->tensors[i].name, path);
  if (!st)
    st = ct_st_check_done(chk, err, "%s is not an adapter for this U-net and lora_target", path);
  for (size_t i = 0; !st && i < l->nad; i++)
    for (int b = 0; !st && b < 2; b++) {
      const ct_unet_adapter *a = &l->ad[i];
      const size_t off = b ? a->b_off : a->a_off,
                   n = (size_t)l->rank * (b ? a->lin.out : a->lin.in);
      const size_t x0 = off > lo ? off : lo, x1 = off + n < hi ? off + n : hi;
      tname(prefix, a, b, name, sizeof name);
      if (x0 < x1)
        st = ct_st_to_f32_range(ct_st_find(f, name), x0 - off, x1 - x0, out + (x0 - lo), err);
    }
  ct_st_close(f);
  return st;
}

ct_status ct_unet_lora_load(ct_unet_lora *l, const char *path, ct_err *err) {
  float *h = malloc((l->numel ? l->numel : 1) * sizeof(float));
  if (!h) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = ct_unet_lora_load_range(l, path, 0, l->numel, h, err);
  if (!st) l->be->copy_in(l->w, h, l->numel * sizeof(float));
  free(h);
  return st;
}

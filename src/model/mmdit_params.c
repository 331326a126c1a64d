/* MMDiT presets, config validation, the parameter table, initialisation and
 * Flux-layout safetensors load/save.
 *
 * The table lists tensors in the order of the PyTorch reference's
 * named_parameters(): img_in, time_in, vector_in, guidance_in (optional),
 * txt_in, double_blocks.*, single_blocks.*, final_layer.*. Every block is thus
 * one contiguous range of the flat buffer. Offsets are rounded up to 16 floats
 * (64 bytes) so each tensor starts cache-line aligned.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/mmdit.h"
#include "ctuner/rng.h"
#include "ctuner/safetensors.h"
#include "model/mmdit_int.h"

static const ct_mmdit_preset presets[] = {
    {"tiny", {4, 2, 64, 2, {8, 12, 12}, 1, 1, 4, 32, 32, 1, 0, 10000.f}, 2, 4, 6, 5},
    {"small", {12, 2, 192, 3, {16, 24, 24}, 2, 4, 4, 128, 128, 1, 0, 10000.f}, 32, 16, 16, 32},
    /* make demo's model (examples/demo): small's text width, 2/3 of its
     * hidden size, 4 blocks instead of 6 — about 0.3x its FLOPs per token */
    {"demo", {12, 2, 128, 2, {16, 24, 24}, 2, 2, 4, 128, 128, 1, 0, 10000.f}, 32, 16, 16, 16},
    {"bench", {4, 2, 384, 6, {16, 24, 24}, 4, 8, 4, 256, 256, 1, 0, 10000.f}, 16, 16, 16, 16},
    {"flux-dev", {16, 2, 3072, 24, {16, 56, 56}, 19, 38, 4, 4096, 768, 1, 1, 10000.f}, 0, 0, 0, 0},
};

const ct_mmdit_preset *ct_mmdit_preset_find(const char *name) {
  for (size_t i = 0; name && i < sizeof presets / sizeof presets[0]; i++)
    if (!strcmp(presets[i].name, name)) return &presets[i];
  return NULL;
}

const char *ct_mmdit_preset_names(void) {
  return "tiny, small, demo, bench, flux-dev";
}

ct_status ct_mmdit_config_validate(const ct_mmdit_config *c, ct_err *err) {
  if (c->in_channels < 1)
    return ct_errf(err, CT_ERR_INVALID, "in_channels must be >= 1 (got %d)", c->in_channels);
  if (c->patch != 2) return ct_errf(err, CT_ERR_UNSUPPORTED, "patch must be 2 (got %d)", c->patch);
  if (c->hidden < 1 || c->heads < 1 || c->hidden % c->heads)
    return ct_errf(err, CT_ERR_INVALID, "hidden (%d) must be a positive multiple of heads (%d)",
                   c->hidden, c->heads);
  int hd = c->hidden / c->heads;
  if (hd % 2) return ct_errf(err, CT_ERR_INVALID, "head_dim = hidden/heads = %d must be even", hd);
  for (int i = 0; i < 3; i++)
    if (c->axes_dim[i] < 0 || c->axes_dim[i] % 2)
      return ct_errf(err, CT_ERR_INVALID, "axes_dim[%d] = %d must be even and >= 0", i,
                     c->axes_dim[i]);
  if (c->axes_dim[0] + c->axes_dim[1] + c->axes_dim[2] != hd)
    return ct_errf(err, CT_ERR_INVALID,
                   "axes_dim %d,%d,%d must sum to head_dim = hidden/heads = %d", c->axes_dim[0],
                   c->axes_dim[1], c->axes_dim[2], hd);
  if (c->depth_double < 0 || c->depth_single < 0 || c->depth_double + c->depth_single < 1)
    return ct_errf(err, CT_ERR_INVALID, "depth_double (%d) + depth_single (%d) must be >= 1",
                   c->depth_double, c->depth_single);
  if (c->mlp_ratio < 1)
    return ct_errf(err, CT_ERR_INVALID, "mlp_ratio must be >= 1 (got %d)", c->mlp_ratio);
  if (c->context_in_dim < 1 || c->vec_in_dim < 1)
    return ct_errf(err, CT_ERR_INVALID, "context_in_dim (%d) and vec_in_dim (%d) must be >= 1",
                   c->context_in_dim, c->vec_in_dim);
  if (!c->qkv_bias) return ct_errf(err, CT_ERR_UNSUPPORTED, "qkv_bias = false is not supported");
  if (!(c->theta > 0)) return ct_errf(err, CT_ERR_INVALID, "theta must be > 0");
  return CT_OK;
}

/* ---- table builder ---- */

typedef struct tb {
  ct_param *p;
  size_t n, cap, off;
  int oom;
} tb;

static void tb_add(tb *t, const char *name, int ndim, int64_t d0, int64_t d1) {
  if (t->oom) return;
  if (t->n == t->cap) {
    size_t nc = t->cap ? 2 * t->cap : 64;
    ct_param *np = realloc(t->p, nc * sizeof *np);
    if (!np) {
      t->oom = 1;
      return;
    }
    t->p = np;
    t->cap = nc;
  }
  ct_param *p = &t->p[t->n++];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name);
  p->ndim = ndim;
  p->shape[0] = d0;
  p->shape[1] = ndim > 1 ? d1 : 1;
  p->numel = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1);
  p->offset = t->off;
  t->off += (p->numel + 15) & ~(size_t)15;
}

static void tb_linear(tb *t, const char *prefix, int in, int out) {
  char n[96];
  snprintf(n, sizeof n, "%s.weight", prefix);
  tb_add(t, n, 2, out, in);
  snprintf(n, sizeof n, "%s.bias", prefix);
  tb_add(t, n, 1, out, 1);
}

static void tb_scale(tb *t, const char *name, int d) {
  tb_add(t, name, 1, d, 1);
}

ct_status ct_mmdit_param_table(const ct_mmdit_config *c, ct_param **out, size_t *n, size_t *numel,
                               ct_err *err) {
  ct_status st = ct_mmdit_config_validate(c, err);
  if (st) return st;
  tb t = {0};
  int d = c->hidden, hd = d / c->heads, P = c->in_channels * c->patch * c->patch,
      mh = c->mlp_ratio * d;
  char n1[96];
  tb_linear(&t, "img_in", P, d);
  tb_linear(&t, "time_in.in_layer", 256, d);
  tb_linear(&t, "time_in.out_layer", d, d);
  tb_linear(&t, "vector_in.in_layer", c->vec_in_dim, d);
  tb_linear(&t, "vector_in.out_layer", d, d);
  if (c->guidance_embed) {
    tb_linear(&t, "guidance_in.in_layer", 256, d);
    tb_linear(&t, "guidance_in.out_layer", d, d);
  }
  tb_linear(&t, "txt_in", c->context_in_dim, d);
  for (int i = 0; i < c->depth_double; i++) {
    static const char *sn[2] = {"img", "txt"};
    for (int s = 0; s < 2; s++) {
      snprintf(n1, sizeof n1, "double_blocks.%d.%s_mod.lin", i, sn[s]);
      tb_linear(&t, n1, d, 6 * d);
      snprintf(n1, sizeof n1, "double_blocks.%d.%s_attn.qkv", i, sn[s]);
      tb_linear(&t, n1, d, 3 * d);
      snprintf(n1, sizeof n1, "double_blocks.%d.%s_attn.norm.query_norm.scale", i, sn[s]);
      tb_scale(&t, n1, hd);
      snprintf(n1, sizeof n1, "double_blocks.%d.%s_attn.norm.key_norm.scale", i, sn[s]);
      tb_scale(&t, n1, hd);
      snprintf(n1, sizeof n1, "double_blocks.%d.%s_attn.proj", i, sn[s]);
      tb_linear(&t, n1, d, d);
      snprintf(n1, sizeof n1, "double_blocks.%d.%s_mlp.0", i, sn[s]);
      tb_linear(&t, n1, d, mh);
      snprintf(n1, sizeof n1, "double_blocks.%d.%s_mlp.2", i, sn[s]);
      tb_linear(&t, n1, mh, d);
    }
  }
  for (int i = 0; i < c->depth_single; i++) {
    snprintf(n1, sizeof n1, "single_blocks.%d.linear1", i);
    tb_linear(&t, n1, d, 3 * d + mh);
    snprintf(n1, sizeof n1, "single_blocks.%d.linear2", i);
    tb_linear(&t, n1, d + mh, d);
    snprintf(n1, sizeof n1, "single_blocks.%d.norm.query_norm.scale", i);
    tb_scale(&t, n1, hd);
    snprintf(n1, sizeof n1, "single_blocks.%d.norm.key_norm.scale", i);
    tb_scale(&t, n1, hd);
    snprintf(n1, sizeof n1, "single_blocks.%d.modulation.lin", i);
    tb_linear(&t, n1, d, 3 * d);
  }
  tb_linear(&t, "final_layer.linear", d, P);
  tb_linear(&t, "final_layer.adaLN_modulation.1", d, 2 * d);
  if (t.oom) {
    free(t.p);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory building the parameter table");
  }
  *out = t.p;
  *n = t.n;
  *numel = t.off;
  return CT_OK;
}

static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

/* MODEL.md: weights N(0, 0.02), biases 0, norm scales 1, every modulation lin and
 * final_layer.linear zero (adaLN-Zero). Tensor i draws from Philox stream i, so a
 * tensor's values do not depend on the others or on the thread count. */
void ct_mmdit_init_range(const ct_mmdit *m, uint64_t seed, size_t lo, size_t hi, float *out) {
  for (size_t i = 0; i < m->nparams; i++) {
    const ct_param *p = &m->params[i];
    size_t a = p->offset > lo ? p->offset : lo,
           b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
    if (a >= b) continue;
    float *w = out + (a - lo);
    const size_t n = b - a, first = a - p->offset;
    int zero = strstr(p->name, "_mod.lin.") || strstr(p->name, "modulation.lin.") ||
               strstr(p->name, "adaLN_modulation.1.") || strstr(p->name, "final_layer.linear.");
    if (ends_with(p->name, ".scale")) {
      for (size_t j = 0; j < n; j++) w[j] = 1.0f;
    } else if (ends_with(p->name, ".bias") || zero) {
      memset(w, 0, n * sizeof(float));
    } else {
      ct_rng_fill_normal(w, n, seed, 0x4d4d444954ull + i, first, 0.0f, 0.02f);
    }
  }
}

void ct_mmdit_init_params(ct_mmdit *m, uint64_t seed) {
  ct_mmdit_init_range(m, seed, 0, m->numel, m->w);
}

const ct_param *ct_mmdit_find(const ct_mmdit *m, const char *name) {
  for (size_t i = 0; i < m->nparams; i++)
    if (!strcmp(m->params[i].name, name)) return &m->params[i];
  return NULL;
}

/* Append to a bounded list message; "... and N more" once full. */
static void list_add(char *buf, size_t cap, int *count, const char *fmt, const char *a,
                     const char *b) {
  size_t len = strlen(buf);
  (*count)++;
  if (len + 200 >= cap) return;
  snprintf(buf + len, cap - len, fmt, a, b);
}

ct_status ct_mmdit_load(ct_mmdit *m, const char *path, const char *prefix, ct_err *err) {
  if (!m->w)
    return ct_errf(err, CT_ERR_INVALID, "%s: the model's parameters are sharded; load a range",
                   path);
  return ct_mmdit_load_range(m, path, prefix, 0, m->numel, m->w, err);
}

ct_status ct_mmdit_load_range(const ct_mmdit *m, const char *path, const char *prefix, size_t lo,
                              size_t hi, float *out, ct_err *err) {
  ct_status st = CT_OK;
  ct_st_file *f = NULL;
  char *missing = NULL, *wrong = NULL, *extra = NULL;
  int nmissing = 0, nwrong = 0, nextra = 0;
  size_t plen = strlen(prefix);
  const size_t cap = 4096;
  char full[160], shp[64];

  st = ct_st_open(path, &f, err);
  if (st) goto out;
  missing = calloc(1, cap);
  wrong = calloc(1, cap);
  extra = calloc(1, cap);
  if (!missing || !wrong || !extra) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < m->nparams; i++) {
    const ct_param *p = &m->params[i];
    snprintf(full, sizeof full, "%s%s", prefix, p->name);
    const ct_st_tensor *t = ct_st_find(f, full);
    if (!t) {
      list_add(missing, cap, &nmissing, "%s%s", nmissing ? ", " : "", p->name);
      continue;
    }
    int ok = t->ndim == p->ndim && t->shape[0] == p->shape[0] &&
             (p->ndim == 1 || t->shape[1] == p->shape[1]);
    if (!ok ||
        (t->dtype != CT_DTYPE_F32 && t->dtype != CT_DTYPE_F16 && t->dtype != CT_DTYPE_BF16)) {
      char got[96] = "";
      size_t gl = 0;
      for (int k = 0; k < t->ndim && gl < 80; k++)
        gl += snprintf(got + gl, sizeof got - gl, "%s%lld", k ? ", " : "", (long long)t->shape[k]);
      if (p->ndim == 2)
        snprintf(shp, sizeof shp, "[%lld, %lld]", (long long)p->shape[0], (long long)p->shape[1]);
      else
        snprintf(shp, sizeof shp, "[%lld]", (long long)p->shape[0]);
      char item[300];
      snprintf(item, sizeof item, "%s%s (file has %s [%s], model needs F32/F16/BF16 %s)",
               nwrong ? ", " : "", p->name, ct_dtype_name(t->dtype), got, shp);
      list_add(wrong, cap, &nwrong, "%s%s", item, "");
    }
  }
  for (size_t i = 0; i < f->ntensors; i++) {
    const char *tn = f->tensors[i].name;
    if (strncmp(tn, prefix, plen)) continue;
    if (!ct_mmdit_find(m, tn + plen)) list_add(extra, cap, &nextra, "%s%s", nextra ? ", " : "", tn);
  }
  if (nmissing || nwrong || nextra) {
    st = ct_errf(
        err, CT_ERR_SHAPE,
        "%s does not match the model (%zu tensors): %d missing%s%s%s; %d wrongly shaped%s%s%s; "
        "%d unexpected%s%s%s. Check that the file's model config (hidden, heads, depths, "
        "in_channels, context/vec dims, guidance_embed) matches",
        path, m->nparams, nmissing, nmissing ? " [" : "", missing, nmissing ? "]" : "", nwrong,
        nwrong ? " [" : "", wrong, nwrong ? "]" : "", nextra, nextra ? " [" : "", extra,
        nextra ? "]" : "");
    goto out;
  }
  for (size_t i = 0; i < m->nparams; i++) {
    const ct_param *p = &m->params[i];
    size_t a = p->offset > lo ? p->offset : lo,
           b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
    if (a >= b) continue;
    snprintf(full, sizeof full, "%s%s", prefix, p->name);
    st = ct_st_to_f32_range(ct_st_find(f, full), a - p->offset, b - a, out + (a - lo), err);
    if (st) goto out;
  }
out:
  free(missing);
  free(wrong);
  free(extra);
  ct_st_close(f);
  return st;
}

ct_status ct_mmdit_save(const ct_mmdit *m, const char *path, ct_err *err) {
  if (!m->w)
    return ct_errf(err, CT_ERR_INVALID, "%s: the model's parameters are sharded; gather them first",
                   path);
  ct_st_writer *w = NULL;
  ct_status st = ct_st_writer_new(&w);
  if (st) return ct_errf(err, st, "out of memory");
  for (size_t i = 0; i < m->nparams && !st; i++) {
    const ct_param *p = &m->params[i];
    st = ct_st_writer_add_f32(w, p->name, p->ndim, p->shape, m->w + p->offset, CT_DTYPE_F32, err);
  }
  if (!st) st = ct_st_writer_write(w, path, err);
  ct_st_writer_free(w);
  return st;
}

/* Adapter files in the layouts other tools write (docs/lora.md, "Adapter
 * files ctuner reads"), folded into a transformer's weights: kohya / ComfyUI
 * (lora_unet_<BFL name, '.' as '_'>.lora_down/lora_up/alpha, fused qkv and
 * linear1 included; ComfyUI's diffusion_model.<BFL name>.lora_down), BFL
 * names with peft tensors (diffusion_model.double_blocks.0.img_attn.qkv
 * .lora_A.weight), diffusers' "mixture" names (lora_transformer_<module>),
 * and LyCORIS files (lycoris_<module>: LoCon, LoHa, LoKr; or LyCORIS on BFL
 * names, lora_unet_...hada_w1_a). Each module's weight difference ΔW is
 * rebuilt as ComfyUI's weight adapters and LyCORIS's modules rebuild it, and
 * added to the BFL weight it names (kohya / BFL names: every row, in BFL's
 * order) or, for diffusers' module names, to the rows the name map gives it.
 * peft files (transformer.<module>.lora_A.weight with diffusers' metadata)
 * take lora_merge.c's route. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "ctuner/kernels.h"
#include "ctuner/log.h"
#include "ctuner/lora_tools.h"
#include "ctuner/safetensors.h"

/* The per-module tensor keys, after "<module>." */
enum {
  K_DOWN,
  K_UP,
  K_ALPHA,
  K_H1A,
  K_H1B,
  K_H2A,
  K_H2B,
  K_W1,
  K_W1A,
  K_W1B,
  K_W2,
  K_W2A,
  K_W2B,
  NK
};
static const char *const KEY[NK][2] = {
    {"lora_down.weight", "lora_A.weight"},
    {"lora_up.weight", "lora_B.weight"},
    {"alpha", NULL},
    {"hada_w1_a", NULL},
    {"hada_w1_b", NULL},
    {"hada_w2_a", NULL},
    {"hada_w2_b", NULL},
    {"lokr_w1", NULL},
    {"lokr_w1_a", NULL},
    {"lokr_w1_b", NULL},
    {"lokr_w2", NULL},
    {"lokr_w2_a", NULL},
    {"lokr_w2_b", NULL},
};

/* Keys of other adapters, refused with what they are. */
static const char *const REFUSED[][2] = {
    {"dora_scale", "DoRA's magnitude (LyCORIS / kohya weight decomposition)"},
    {"lora_magnitude_vector", "DoRA's magnitude"},
    {"hada_t1", "a LoHa Tucker core (convolutions)"},
    {"hada_t2", "a LoHa Tucker core (convolutions)"},
    {"lokr_t1", "a LoKr Tucker core (convolutions)"},
    {"lokr_t2", "a LoKr Tucker core (convolutions)"},
    {"lora_mid.weight", "a LoCon Tucker core (convolutions)"},
    {"diff", "a full weight difference (LyCORIS full / diff)"},
    {"diff_b", "a bias difference"},
    {"lora_A.bias", "a LoRA bias (BFL control LoRA)"},
    {"lora_B.bias", "a LoRA bias (BFL control LoRA)"},
    {"on_input", "LyCORIS IA3"},
    {"oft_blocks", "LyCORIS OFT"},
    {"oft_diag", "LyCORIS OFT"},
};

typedef struct amod {
  char name[200]; /* the module as the file names it */
  const ct_st_tensor *t[NK];
  int peft;          /* named lora_A / lora_B (peft's keys) */
  double dflt_alpha; /* without an alpha tensor: lora_adapter_metadata's lora_alpha (0: none) */
} amod;

static int ends_with(const char *s, const char *suffix) {
  const size_t n = strlen(s), k = strlen(suffix);
  return n > k && s[n - k - 1] == '.' && !strcmp(s + n - k, suffix);
}

/* Text-encoder adapters: ctuner applies the transformer's only. */
static int text_encoder_name(const char *n) {
  static const char *const te[] = {
      "lora_te_",      "lora_te1_",       "lora_te2_",      "lora_te3_",
      "text_encoder.", "text_encoder_2.", "text_encoders.", "te."};
  for (size_t i = 0; i < sizeof te / sizeof te[0]; i++)
    if (!strncmp(n, te[i], strlen(te[i]))) return 1;
  return 0;
}

/* Groups the file's tensors by module (mods: f->ntensors entries). */
static ct_status group(const ct_st_file *f, const char *path, amod *mods, size_t *nmods,
                       int *skipped, ct_err *err) {
  size_t n = 0;
  for (size_t i = 0; i < f->ntensors; i++) {
    const ct_st_tensor *t = &f->tensors[i];
    if (text_encoder_name(t->name)) {
      ++*skipped;
      continue;
    }
    for (size_t r = 0; r < sizeof REFUSED / sizeof REFUSED[0]; r++)
      if (ends_with(t->name, REFUSED[r][0]))
        return ct_errf(err, CT_ERR_UNSUPPORTED,
                       "%s: %s is %s, which ctuner does not apply (LoRA, LoCon, LoHa and LoKr "
                       "on Linear layers only)",
                       path, t->name, REFUSED[r][1]);
    int key = -1;
    size_t klen = 0;
    for (int k = 0; k < NK && key < 0; k++)
      for (int v = 0; v < 2 && key < 0; v++)
        if (KEY[k][v] && ends_with(t->name, KEY[k][v])) key = k, klen = strlen(KEY[k][v]);
    if (key < 0)
      return ct_errf(err, CT_ERR_FORMAT,
                     "%s: tensor %s is not an adapter tensor ctuner knows (lora_down/lora_up/"
                     "lora_A/lora_B .weight, alpha, hada_w*, lokr_w*)",
                     path, t->name);
    const size_t ml = strlen(t->name) - klen - 1;
    if (ml >= sizeof mods[0].name)
      return ct_errf(err, CT_ERR_FORMAT, "%s: tensor name %s is too long", path, t->name);
    size_t j = 0;
    while (j < n && (strlen(mods[j].name) != ml || strncmp(mods[j].name, t->name, ml))) j++;
    if (j == n) {
      memset(&mods[n], 0, sizeof mods[n]);
      memcpy(mods[n].name, t->name, ml);
      n++;
    }
    if (mods[j].t[key])
      return ct_errf(err, CT_ERR_FORMAT, "%s: module %s has two %s tensors", path, mods[j].name,
                     KEY[key][0]);
    mods[j].t[key] = t;
    mods[j].peft |= (key == K_DOWN || key == K_UP) && ends_with(t->name, KEY[key][1]);
  }
  *nmods = n;
  return CT_OK;
}

/* dotted[0 .. len) with '.' read as '_' equals us. */
static int us_eq(const char *dotted, size_t len, const char *us) {
  size_t i = 0;
  for (; i < len && us[i]; i++)
    if ((dotted[i] == '.' ? '_' : dotted[i]) != us[i]) return 0;
  return i == len && !us[i];
}

/* The name map entry the module name resolves to (its first), or -1; *bfl:
 * 1 when it names a BFL weight (all its rows), 0 a diffusers module. */
static long resolve(const ct_flux_name *map, size_t nm, const char *mod, const char *lyco_prefix,
                    int *bfl) {
  static const char *const pfx[][2] = {
      /* prefix, 'b' BFL / 'd' diffusers, 'u' underscores / '.' dots */
      {"lora_unet_", "bu"},
      {"diffusion_model.", "b."},
      {"lora_transformer_", "du"},
      {"transformer.", "d."},
      {"base_model.model.", "d."},
      {"", "b."},
      {"", "d."},
  };
  char lp[64];
  snprintf(lp, sizeof lp, "%s_", lyco_prefix);
  for (size_t p = 0; p <= sizeof pfx / sizeof pfx[0]; p++) {
    const char *pre = p < sizeof pfx / sizeof pfx[0] ? pfx[p][0] : lp;
    const char *how = p < sizeof pfx / sizeof pfx[0] ? pfx[p][1] : "du";
    if (strncmp(mod, pre, strlen(pre))) continue;
    const char *rest = mod + strlen(pre);
    for (size_t i = 0; i < nm; i++) {
      const char *full = how[0] == 'b' ? map[i].bfl : map[i].dif;
      const size_t fl = strlen(full);
      if (!map[i].cols || fl < 8 || strcmp(full + fl - 7, ".weight")) continue;
      const int hit = how[1] == 'u' ? us_eq(full, fl - 7, rest)
                                    : strlen(rest) == fl - 7 && !strncmp(full, rest, fl - 7);
      if (hit) {
        *bfl = how[0] == 'b';
        return (long)i;
      }
    }
  }
  return -1;
}

/* Tensor k of md as a [rows, cols] float32 matrix (malloc'd), shape checked
 * (rows/cols < 0: any). */
static float *mat(const amod *md, int k, int64_t rows, int64_t cols, const char *path, ct_err *err,
                  ct_status *st) {
  const ct_st_tensor *t = md->t[k];
  if (*st) return NULL;
  if (!t) {
    *st =
        ct_errf(err, CT_ERR_FORMAT, "%s: module %s lacks its %s tensor", path, md->name, KEY[k][0]);
    return NULL;
  }
  if (t->ndim != 2 || (rows >= 0 && t->shape[0] != rows) || (cols >= 0 && t->shape[1] != cols)) {
    *st = ct_errf(err, CT_ERR_SHAPE,
                  "%s: %s is [%lld, %lld], the module's other tensors need [%lld, %lld]", path,
                  t->name, (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0),
                  (long long)rows, (long long)cols);
    return NULL;
  }
  float *v = malloc((size_t)t->numel * sizeof *v);
  if (!v)
    *st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  else if ((*st = ct_st_to_f32(t, v, t->numel, err)))
    free(v), v = NULL;
  return v;
}

/* LyCORIS's (and ComfyUI's) scale alpha / dim; no alpha, or 0: 1 — or, for
 * peft-keyed modules without one, the metadata's lora_alpha / dim (peft). */
static ct_status scale_of(const amod *md, int64_t dim, const char *path, double *s, ct_err *err) {
  *s = 1;
  const ct_st_tensor *a = md->t[K_ALPHA];
  if (!a && md->peft && md->dflt_alpha > 0 && dim > 0) *s = md->dflt_alpha / (double)dim;
  if (!a) return CT_OK;
  float v = 0;
  if (a->numel != 1 || ct_st_to_f32(a, &v, 1, err) || !isfinite(v))
    return ct_errf(err, CT_ERR_FORMAT, "%s: %s is not one finite number", path, a->name);
  if (v != 0 && dim > 0) *s = v / (double)dim;
  return CT_OK;
}

/* LoRA / LoCon: up [out, r] down [r, in] * alpha / r (kohya's rank = down's rows). */
static float *delta_lora(const amod *md, const char *path, int64_t *out, int64_t *in, ct_err *err,
                         ct_status *st) {
  const ct_st_tensor *d = md->t[K_DOWN];
  float *down = mat(md, K_DOWN, -1, -1, path, err, st);
  const int64_t r = down ? d->shape[0] : 0;
  float *up = mat(md, K_UP, -1, r, path, err, st);
  double s = 1;
  if (!*st) *st = scale_of(md, r, path, &s, err);
  float *dw = NULL;
  if (!*st) {
    *out = md->t[K_UP]->shape[0], *in = d->shape[1];
    dw = calloc((size_t)(*out * *in), sizeof *dw);
    if (!dw) *st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  if (dw)
    ct_sgemm(0, 0, (int)*out, (int)*in, (int)r, (float)s, up, (int)r, down, (int)*in, 0.0f, dw,
             (int)*in);
  free(down), free(up);
  return dw;
}

/* a [m, k] b [k, n] -> [m, n] (malloc'd), shapes from the file. */
static float *product(const amod *md, int ka, int kb, int64_t *m, int64_t *n, const char *path,
                      ct_err *err, ct_status *st) {
  float *a = mat(md, ka, -1, -1, path, err, st);
  const int64_t k = a ? md->t[ka]->shape[1] : 0;
  float *b = mat(md, kb, k, -1, path, err, st);
  float *c = NULL;
  if (!*st) {
    *m = md->t[ka]->shape[0], *n = md->t[kb]->shape[1];
    c = malloc((size_t)(*m * *n) * sizeof *c);
    if (!c)
      *st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    else
      ct_sgemm(0, 0, (int)*m, (int)*n, (int)k, 1.0f, a, (int)k, b, (int)*n, 0.0f, c, (int)*n);
  }
  free(a), free(b);
  return c;
}

/* LoHa: (w1_a w1_b) ⊙ (w2_a w2_b) * alpha / dim, dim = w1_b's rows (LyCORIS
 * loha.py, ComfyUI's LoHaAdapter). */
static float *delta_loha(const amod *md, const char *path, int64_t *out, int64_t *in, ct_err *err,
                         ct_status *st) {
  int64_t m1 = 0, n1 = 0, m2 = 0, n2 = 0;
  float *p1 = product(md, K_H1A, K_H1B, &m1, &n1, path, err, st);
  float *p2 = product(md, K_H2A, K_H2B, &m2, &n2, path, err, st);
  double s = 1;
  if (!*st && (m1 != m2 || n1 != n2))
    *st = ct_errf(err, CT_ERR_SHAPE,
                  "%s: LoHa module %s: its two products are [%lld, %lld] and "
                  "[%lld, %lld]",
                  path, md->name, (long long)m1, (long long)n1, (long long)m2, (long long)n2);
  if (!*st) *st = scale_of(md, md->t[K_H1B]->shape[0], path, &s, err);
  if (*st) {
    free(p1), free(p2);
    return NULL;
  }
  for (size_t i = 0; i < (size_t)(m1 * n1); i++) p1[i] = (float)((double)p1[i] * p2[i] * s);
  free(p2);
  *out = m1, *in = n1;
  return p1;
}

/* One LoKr factor: whole (k) or a product (ka kb); *dim its rank when split. */
static float *lokr_factor(const amod *md, int k, int ka, int kb, int64_t *m, int64_t *n,
                          int64_t *dim, const char *path, ct_err *err, ct_status *st) {
  if (md->t[k]) {
    float *w = mat(md, k, -1, -1, path, err, st);
    if (w) *m = md->t[k]->shape[0], *n = md->t[k]->shape[1];
    return w;
  }
  float *w = product(md, ka, kb, m, n, path, err, st);
  if (w) *dim = md->t[kb]->shape[0];
  return w;
}

/* LoKr: kron(w1, w2) * alpha / dim; both factors whole: scale 1 (LyCORIS
 * lokr.py: "if self.use_w2 and self.use_w1: alpha = lora_dim"; ComfyUI's
 * LoKrAdapter: no dim, alpha 1). */
static float *delta_lokr(const amod *md, const char *path, int64_t *out, int64_t *in, ct_err *err,
                         ct_status *st) {
  int64_t ol = 0, im = 0, ok = 0, inn = 0, dim = 0;
  float *w1 = lokr_factor(md, K_W1, K_W1A, K_W1B, &ol, &im, &dim, path, err, st);
  float *w2 = lokr_factor(md, K_W2, K_W2A, K_W2B, &ok, &inn, &dim, path, err, st);
  double s = 1;
  if (!*st && dim) *st = scale_of(md, dim, path, &s, err);
  float *dw = NULL;
  if (!*st) {
    *out = ol * ok, *in = im * inn;
    dw = malloc((size_t)(*out * *in) * sizeof *dw);
    if (!dw) *st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  for (int64_t i = 0; dw && i < ol; i++)
    for (int64_t k = 0; k < ok; k++)
      for (int64_t j = 0; j < im; j++)
        for (int64_t l = 0; l < inn; l++)
          dw[(i * ok + k) * *in + j * inn + l] = (float)(s * w1[i * im + j] * w2[k * inn + l]);
  free(w1), free(w2);
  return dw;
}

/* The module's ΔW [out, in] (malloc'd), by which tensors it has. */
static float *delta(const amod *md, const char *path, int64_t *out, int64_t *in, char *algo,
                    ct_err *err, ct_status *st) {
  const int lora = md->t[K_DOWN] || md->t[K_UP];
  const int loha = md->t[K_H1A] || md->t[K_H1B] || md->t[K_H2A] || md->t[K_H2B];
  const int lokr =
      md->t[K_W1] || md->t[K_W1A] || md->t[K_W1B] || md->t[K_W2] || md->t[K_W2A] || md->t[K_W2B];
  if (lora + loha + lokr != 1) {
    *st = ct_errf(err, CT_ERR_FORMAT, "%s: module %s has %s", path, md->name,
                  lora + loha + lokr ? "tensors of several algorithms (LoRA / LoHa / LoKr)"
                                     : "only an alpha");
    return NULL;
  }
  *algo = lora ? 'r' : loha ? 'h' : 'k';
  return lora   ? delta_lora(md, path, out, in, err, st)
         : loha ? delta_loha(md, path, out, in, err, st)
                : delta_lokr(md, path, out, in, err, st);
}

/* W += mult ΔW on the weight(s) the map entry e names. */
static ct_status add_delta(ct_mmdit *m, const ct_flux_name *map, size_t nm, size_t e, int bfl,
                           const float *dw, int64_t out, int64_t in, double mult, const char *path,
                           const char *mod, ct_err *err) {
  float *w = ct_mmdit_params(m);
  const float s = (float)mult;
  const ct_param *p = ct_mmdit_find(m, map[e].bfl);
  const int64_t want = bfl ? (p ? p->shape[0] : -1) : map[e].dif_rows;
  if (!p || p->ndim != 2 || out != want || in != p->shape[1])
    return ct_errf(err, CT_ERR_SHAPE,
                   "%s: module %s changes a [%lld, %lld] weight; this transformer's %s is [%lld, "
                   "%lld] (an adapter for another model)",
                   path, mod, (long long)out, (long long)in, bfl ? map[e].bfl : map[e].dif,
                   (long long)want, (long long)(p ? p->shape[1] : 0));
  if (bfl) {
    for (size_t i = 0; i < (size_t)(out * in); i++) w[p->offset + i] += s * dw[i];
    return CT_OK;
  }
  for (size_t j = e; j < nm; j++) { /* every piece of this diffusers weight */
    if (strcmp(map[j].dif, map[e].dif)) continue;
    const ct_param *q = ct_mmdit_find(m, map[j].bfl);
    if (!q) return ct_errf(err, CT_ERR_SHAPE, "%s: no weight %s", path, map[j].bfl);
    for (int64_t r = 0; r < map[j].rows; r++)
      for (int64_t c = 0; c < in; c++)
        w[q->offset + (size_t)((map[j].bfl_row + r) * in + c)] +=
            s * dw[(size_t)((map[j].dif_row + r) * in + c)];
  }
  return CT_OK;
}

/* diffusers' lora_adapter_metadata (a peft file whose text-encoder tensors
 * send it here): its lora_alpha for the peft-keyed modules; DoRA and
 * per-module ranks / alphas refused as lora_merge.c refuses them. */
static ct_status peft_meta(const ct_st_file *f, const char *path, double *alpha, ct_err *err) {
  *alpha = 0;
  const char *m = ct_st_meta(f, "lora_adapter_metadata");
  ct_json *j = NULL;
  if (!m) return CT_OK;
  if (ct_json_parse(m, strlen(m), &j, err))
    return ct_errf(err, CT_ERR_FORMAT, "%s: its lora_adapter_metadata is not JSON", path);
  const ct_json *a = ct_json_get(j, "transformer.lora_alpha"),
                *dora = ct_json_get(j, "transformer.use_dora"),
                *rp = ct_json_get(j, "transformer.rank_pattern"),
                *ap = ct_json_get(j, "transformer.alpha_pattern");
  ct_status st = CT_OK;
  if (dora && dora->type == CT_JSON_BOOL && dora->boolean)
    st = ct_errf(err, CT_ERR_UNSUPPORTED, "%s: a DoRA adapter (use_dora true): not merged", path);
  else if ((rp && rp->type == CT_JSON_OBJECT && rp->n) ||
           (ap && ap->type == CT_JSON_OBJECT && ap->n))
    st = ct_errf(err, CT_ERR_UNSUPPORTED,
                 "%s: per-module ranks or alphas (rank_pattern / alpha_pattern) are not supported",
                 path);
  else if (a && a->type == CT_JSON_NUMBER && a->num > 0)
    *alpha = a->num;
  ct_json_free(j);
  return st;
}

/* LyCORIS's apply_preset.lora_prefix from the file's lycoris_config metadata. */
static void lyco_prefix(const ct_st_file *f, char *out, size_t cap) {
  snprintf(out, cap, "lycoris");
  const char *m = ct_st_meta(f, "lycoris_config");
  ct_json *j = NULL;
  ct_err e;
  if (!m || ct_json_parse(m, strlen(m), &j, &e)) return;
  const ct_json *p = ct_json_get(j, "apply_preset");
  const ct_json *lp = p ? ct_json_get(p, "lora_prefix") : NULL;
  if (lp && lp->type == CT_JSON_STRING && lp->str[0] && strlen(lp->str) < cap - 2)
    snprintf(out, cap, "%s", lp->str);
  ct_json_free(j);
}

/* The modules of mods merged into m, one by one. */
static ct_status merge_mods(ct_mmdit *m, const amod *mods, size_t n, const char *prefix,
                            double mult, const char *path, ct_lora_file_info *info, ct_err *err) {
  ct_flux_name *map = NULL;
  size_t nm = 0;
  ct_status st = ct_flux_name_map(ct_mmdit_cfg(m), &map, &nm, err);
  for (size_t i = 0; i < n && !st; i++) {
    int bfl = 0;
    const long e = resolve(map, nm, mods[i].name, prefix, &bfl);
    if (e < 0) {
      st = ct_errf(err, CT_ERR_SHAPE,
                   "%s: module %s is not a Linear layer of this transformer (kohya lora_unet_<BFL "
                   "name>, diffusion_model.<BFL name>, %s_<diffusers module>, lora_transformer_"
                   "<diffusers module> or transformer.<diffusers module> expected)",
                   path, mods[i].name, prefix);
      break;
    }
    int64_t out = 0, in = 0;
    char algo = 0;
    float *dw = delta(&mods[i], path, &out, &in, &algo, err, &st);
    if (!st) st = add_delta(m, map, nm, (size_t)e, bfl, dw, out, in, mult, path, mods[i].name, err);
    free(dw);
    if (!st) {
      info->modules++;
      info->bfl_named += bfl;
      info->lora += algo == 'r', info->loha += algo == 'h', info->lokr += algo == 'k';
    }
  }
  free(map);
  return st;
}

ct_status ct_lora_merge_any(ct_mmdit *m, const char *path, double multiplier,
                            ct_lora_file_info *info, ct_err *err) {
  ct_lora_file_info dummy;
  if (!info) info = &dummy;
  memset(info, 0, sizeof *info);
  ct_status st = ct_lora_check_multiplier(multiplier, err);
  if (st) return st;
  if (!ct_mmdit_params(m)) return ct_errf(err, CT_ERR_INVALID, "ct_lora_merge_any: no parameters");
  ct_st_file *f = NULL;
  if ((st = ct_st_open(path, &f, err))) return st;
  amod *mods = calloc(f->ntensors ? f->ntensors : 1, sizeof *mods);
  size_t n = 0;
  char prefix[48];
  lyco_prefix(f, prefix, sizeof prefix);
  st = mods ? group(f, path, mods, &n, &info->skipped_text_encoder, err)
            : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  double alpha = 0;
  if (!st) st = peft_meta(f, path, &alpha, err);
  for (size_t i = 0; !st && i < n; i++) mods[i].dflt_alpha = alpha;
  if (!st && !n)
    st = ct_errf(err, CT_ERR_FORMAT, "%s holds no transformer adapter tensors%s", path,
                 info->skipped_text_encoder ? " (only text-encoder ones)" : "");
  if (!st) st = merge_mods(m, mods, n, prefix, multiplier, path, info, err);
  if (!st && info->skipped_text_encoder)
    CT_WARN(
        "%s: %d text-encoder adapter tensors not applied (ctuner applies the transformer's "
        "adapters only)",
        path, info->skipped_text_encoder);
  free(mods);
  ct_st_close(f);
  return st;
}

int ct_lora_file_is_peft(const char *path) {
  ct_st_file *f = NULL;
  ct_err e;
  if (ct_st_open(path, &f, &e)) return 1; /* the peft route reports the error */
  int peft = f->ntensors > 0 || ct_st_meta(f, "lora_adapter_metadata");
  for (size_t i = 0; i < f->ntensors && peft; i++) {
    const char *n = f->tensors[i].name;
    peft = !strncmp(n, "transformer.", 12) &&
           (ends_with(n, "lora_A.weight") || ends_with(n, "lora_B.weight") ||
            ends_with(n, "lora_magnitude_vector"));
  }
  ct_st_close(f);
  return peft;
}

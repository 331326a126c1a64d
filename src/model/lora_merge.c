/* An adapter file opened onto a transformer, and folded into its weights
 * (include/ctuner/lora_tools.h, docs/lora.md): `ctuner lora merge`,
 * `ctuner sample --lora`. The file says what it adapts (its tensor names and
 * A's rows, its lora_adapter_metadata's lora_alpha), so any file
 * FluxPipeline.save_lora_weights or ctuner writes opens without knowing the
 * run's flux_lora_target. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "ctuner/kernels.h"
#include "ctuner/lora_tools.h"
#include "ctuner/safetensors.h"

#define PFX "transformer."
#define SFX_A ".lora_A.weight"
#define SFX_B ".lora_B.weight"

static int ends_with(const char *s, const char *suffix) {
  const size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* rank, alpha, use_dora and patterns from lora_adapter_metadata (if any). */
static ct_status read_meta(const ct_st_file *f, const char *path, int *rank, double *alpha,
                           ct_err *err) {
  const char *m = ct_st_meta(f, "lora_adapter_metadata");
  if (!m) return CT_OK;
  ct_json *j = NULL;
  if (ct_json_parse(m, strlen(m), &j, err))
    return ct_errf(err, CT_ERR_FORMAT, "%s: its lora_adapter_metadata is not JSON", path);
  const ct_json *r = ct_json_get(j, PFX "r"), *a = ct_json_get(j, PFX "lora_alpha");
  const ct_json *dora = ct_json_get(j, PFX "use_dora");
  const ct_json *rp = ct_json_get(j, PFX "rank_pattern"), *ap = ct_json_get(j, PFX "alpha_pattern");
  ct_status st = CT_OK;
  if (dora && dora->type == CT_JSON_BOOL && dora->boolean)
    st = ct_errf(err, CT_ERR_UNSUPPORTED,
                 "%s: a DoRA adapter (use_dora true); ctuner merges and "
                 "samples standard LoRA only",
                 path);
  else if ((rp && rp->type == CT_JSON_OBJECT && rp->n) ||
           (ap && ap->type == CT_JSON_OBJECT && ap->n))
    st = ct_errf(err, CT_ERR_UNSUPPORTED,
                 "%s: per-module ranks or alphas (rank_pattern / alpha_pattern) are not supported",
                 path);
  if (!st && r && r->type == CT_JSON_NUMBER) *rank = (int)r->num;
  if (!st && a && a->type == CT_JSON_NUMBER) *alpha = a->num;
  ct_json_free(j);
  return st;
}

/* The modules of the file's lora_A tensors (NULL-terminated list of exact
 * names), its rank; kohya names and mixed ranks refused. */
static ct_status file_modules(const ct_st_file *f, const char *path, char ***mods, int *rank,
                              ct_err *err) {
  char **m = calloc(f->ntensors + 1, sizeof *m);
  if (!m) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  size_t n = 0;
  ct_status st = CT_OK;
  for (size_t i = 0; i < f->ntensors && !st; i++) {
    const ct_st_tensor *t = &f->tensors[i];
    if (strstr(t->name, "lora_down") || strstr(t->name, "lora_up") || ends_with(t->name, ".alpha"))
      st = ct_errf(err, CT_ERR_FORMAT,
                   "%s holds kohya/ComfyUI names (%s): ctuner reads diffusers/peft adapter files "
                   "(transformer.<module>.lora_A.weight, as pytorch_lora_weights.safetensors)",
                   path, t->name);
    else if (strncmp(t->name, PFX, strlen(PFX)) ||
             !(ends_with(t->name, SFX_A) || ends_with(t->name, SFX_B)))
      st = ct_errf(err, CT_ERR_FORMAT,
                   "%s: tensor %s is not a transformer LoRA tensor "
                   "(transformer.<module>.lora_A.weight / lora_B.weight)",
                   path, t->name);
    else if (ends_with(t->name, SFX_A)) {
      const int r = t->ndim == 2 ? (int)t->shape[0] : -1;
      if (r < 1)
        st = ct_errf(err, CT_ERR_SHAPE, "%s: %s is not a 2-D [rank, in] tensor", path, t->name);
      else if (*rank > 0 && r != *rank)
        st = ct_errf(err, CT_ERR_UNSUPPORTED,
                     "%s: %s has rank %d, other adapters rank %d: adapters of mixed ranks are not "
                     "supported",
                     path, t->name, r, *rank);
      *rank = r;
      const size_t k = strlen(t->name) - strlen(PFX) - strlen(SFX_A);
      if (!st && !(m[n] = strndup(t->name + strlen(PFX), k)))
        st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
      n += !st;
    }
  }
  if (!st && !n) st = ct_errf(err, CT_ERR_FORMAT, "%s holds no lora_A tensors", path);
  if (st) {
    for (size_t i = 0; i < n; i++) free(m[i]);
    free(m);
    return st;
  }
  *mods = m;
  return CT_OK;
}

/* Modules of the file this transformer lacks: one error naming them. */
static ct_status check_modules(const ct_lora *l, char **mods, const char *path, ct_err *err) {
  size_t nad;
  const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
  char list[600] = "";
  int miss = 0;
  for (char **m = mods; *m; m++) {
    int found = 0;
    for (size_t i = 0; i < nad && !found; i++) found = !strcmp(ad[i].module, *m);
    if (found) continue;
    const size_t k = strlen(list);
    if (miss++ < 5) snprintf(list + k, sizeof list - k, "%s%s", k ? ", " : "", *m);
  }
  if (!miss) return CT_OK;
  return ct_errf(err, CT_ERR_SHAPE,
                 "%s is an adapter for another model: %d of its modules are not in this "
                 "transformer [%s%s]",
                 path, miss, list, miss > 5 ? ", ..." : "");
}

ct_status ct_lora_open_file(const ct_mmdit_config *cfg, const char *path, ct_lora **out,
                            ct_err *err) {
  *out = NULL;
  ct_st_file *f = NULL;
  ct_status st = ct_st_open(path, &f, err);
  if (st) return st;
  int rank = 0, mrank = 0;
  double alpha = 0;
  char **mods = NULL;
  st = read_meta(f, path, &mrank, &alpha, err);
  if (!st) st = file_modules(f, path, &mods, &rank, err);
  ct_st_close(f);
  if (!st && mrank > 0 && mrank != rank)
    st = ct_errf(err, CT_ERR_FORMAT, "%s: its metadata says rank %d, its tensors rank %d", path,
                 mrank, rank);
  if (st) return st;
  const ct_lora_opts o = {rank, alpha > 0 ? alpha : (double)rank, 0.0, 0, 0}; /* DoRA refused */
  ct_lora *l = NULL;
  st = ct_lora_new(cfg, (const char *const *)mods, &o, 0, &l, err);
  if (st) ct_err_prefix(err, "%s: ", path);
  if (!st) st = check_modules(l, mods, path, err);
  if (!st) st = ct_lora_load(l, path, 0, ct_lora_numel(l), ct_lora_params(l), err);
  for (char **m = mods; *m; m++) free(*m);
  free(mods);
  if (st) {
    ct_lora_free(l);
    return st;
  }
  *out = l;
  return CT_OK;
}

ct_status ct_lora_check_multiplier(double multiplier, ct_err *err) {
  if (!isfinite(multiplier))
    return ct_errf(err, CT_ERR_INVALID,
                   "lora_scale %g must be a finite number (1: the adapter "
                   "as trained, 0: the base)",
                   multiplier);
  return CT_OK;
}

ct_status ct_lora_merge(ct_mmdit *m, const ct_lora *l, double multiplier, ct_err *err) {
  ct_status st = ct_lora_check_multiplier(multiplier, err);
  if (st) return st;
  float *w = ct_mmdit_params(m);
  const float *lw = ct_lora_params((ct_lora *)l);
  if (!w || !lw) return ct_errf(err, CT_ERR_INVALID, "ct_lora_merge: no parameters to merge");
  size_t nad;
  const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
  const int r = ct_lora_options(l)->rank;
  const float s = (float)(multiplier * (double)ct_lora_scale(l));
  for (size_t i = 0; i < nad; i++) {
    const ct_lora_adapter *a = &ad[i];
    const ct_param *p = ct_mmdit_find(m, a->base);
    if (!p || p->ndim != 2 || p->shape[1] != a->in)
      return ct_errf(err, CT_ERR_SHAPE, "adapter %s does not fit this transformer's %s", a->module,
                     a->base);
    for (int k = 0; k < a->npieces; k++) {
      const ct_lora_piece *pc = &a->piece[k];
      if (pc->bfl_row + pc->rows > p->shape[0])
        return ct_errf(err, CT_ERR_SHAPE, "adapter %s does not fit this transformer's %s",
                       a->module, a->base);
      /* W[bfl_row .. +rows) += s B[dif_row .. +rows) A */
      ct_sgemm(0, 0, (int)pc->rows, a->in, r, s, lw + a->b_off + (size_t)pc->dif_row * r, r,
               lw + a->a_off, a->in, 1.0f, w + p->offset + (size_t)pc->bfl_row * a->in, a->in);
    }
  }
  return CT_OK;
}

ct_status ct_lora_merge_file(ct_mmdit *m, const char *path, double multiplier, ct_err *err) {
  ct_status st = ct_lora_check_multiplier(multiplier, err);
  if (!st && !ct_lora_file_is_peft(path)) return ct_lora_merge_any(m, path, multiplier, NULL, err);
  ct_lora *l = NULL;
  if (!st) st = ct_lora_open_file(ct_mmdit_cfg(m), path, &l, err);
  if (!st) st = ct_lora_merge(m, l, multiplier, err);
  ct_lora_free(l);
  return st;
}

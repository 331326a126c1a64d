/* The MMDiT behind the model interface (model.h): its flat buffer, table and
 * segments (inputs, each block, the final layer) with their hooks, and its
 * checkpoint file model.safetensors under Flux names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctuner/backend.h"
#include "ctuner/mmdit.h"
#include "model.h"

static float *params(ct_model *m) {
  return ct_mmdit_params(m->impl);
}
static float *grads(ct_model *m) {
  return ct_mmdit_grads(m->impl);
}
static int nsegments(const ct_model *m) {
  return ct_mmdit_nsegments(m->impl);
}
static void segment(const ct_model *m, int s, size_t *off, size_t *n) {
  ct_mmdit_segment(m->impl, s, off, n);
}
static void use_params(ct_model *m, float *w) {
  ct_mmdit_use_params(m->impl, w);
}
static void use_grads(ct_model *m, float *g) {
  ct_mmdit_use_grads(m->impl, g);
}
static void mfree(void *impl) {
  ct_mmdit_free(impl);
}

static void set_hooks(ct_model *m, const ct_model_hooks *h) {
  if (!h) {
    ct_mmdit_set_hooks(m->impl, NULL);
    return;
  }
  const ct_mmdit_hooks mh = {h->user, h->enter, h->leave};
  ct_mmdit_set_hooks(m->impl, &mh);
}

static void init_range(const ct_model *m, uint64_t seed, size_t lo, size_t hi, float *out) {
  ct_mmdit_init_range(m->impl, seed, lo, hi, out);
}

static ct_status load(ct_model *m, const char *dir, size_t lo, size_t hi, float *out, ct_err *err) {
  char p[4200];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  return out ? ct_mmdit_load_range(m->impl, p, "", lo, hi, out, err)
             : ct_mmdit_load(m->impl, p, "", err);
}

static ct_status save(const ct_model *m, const char *dir, ct_err *err) {
  char p[4200];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  return ct_mmdit_save(m->impl, p, err);
}

static ct_status set_backend(ct_model *m, const ct_backend_ops *be, ct_err *err) {
  return ct_mmdit_set_backend(m->impl, be, err);
}
static float *swap_params(ct_model *m, float *w) {
  return ct_mmdit_swap_params(m->impl, w);
}

static const ct_model_ops ops = {"mmdit",     params,     grads,      nsegments, segment, set_hooks,
                                 use_params,  use_grads,  init_range, load,      save,    mfree,
                                 NULL,        NULL,       NULL, /* no frozen storage */
                                 set_backend, swap_params};

/* A FLUX.1 pipeline's transformer trained in float32: the checkpoint's
 * weights are its transformer/ (diffusers layout, float32, sharded past
 * 10 GiB) and nothing else, so they are stored once. A checkpoint written
 * before (model.safetensors beside transformer/) still loads. */
static ct_status load_flux(ct_model *m, const char *dir, size_t lo, size_t hi, float *out,
                           ct_err *err) {
  char p[4200];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  if (access(p, R_OK) == 0) return load(m, dir, lo, hi, out, err);
  snprintf(p, sizeof p, "%s/transformer", dir);
  return out ? ct_mmdit_load_diffusers_range(m->impl, p, lo, hi, out, err)
             : ct_mmdit_load_diffusers(m->impl, p, err);
}

static ct_status save_flux(const ct_model *m, const char *dir, ct_err *err) {
  char p[4200];
  snprintf(p, sizeof p, "%s/transformer", dir);
  return ct_mmdit_save_diffusers(m->impl, p, (size_t)10 << 30, CT_DTYPE_F32, err);
}

static const ct_model_ops flux_ops = {
    "mmdit",     params,     grads,     nsegments, segment, set_hooks, use_params, use_grads,
    init_range,  load_flux,  save_flux, mfree,     NULL,    NULL,      NULL, /* no frozen storage */
    set_backend, swap_params};

ct_status ct_model_mmdit(ct_mmdit *mm, ct_model **out, ct_err *err) {
  return ct_model_mmdit_as(mm, 0, out, err);
}

ct_status ct_model_mmdit_as(ct_mmdit *mm, int flux_dir, ct_model **out, ct_err *err) {
  size_t np;
  const ct_param *t = ct_mmdit_table(mm, &np);
  ct_model_param *tab = calloc(np ? np : 1, sizeof *tab);
  if (!tab) {
    ct_mmdit_free(mm);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < np; i++) {
    snprintf(tab[i].name, sizeof tab[i].name, "%s", t[i].name);
    tab[i].ndim = t[i].ndim;
    for (int k = 0; k < t[i].ndim && k < 2; k++) tab[i].shape[k] = t[i].shape[k];
    tab[i].offset = t[i].offset;
    tab[i].numel = t[i].numel;
  }
  return ct_model_wrap(flux_dir ? &flux_ops : &ops, mm, tab, np, ct_mmdit_numel(mm), out, err);
}

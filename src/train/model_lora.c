/* LoRA adapters behind the model interface (model.h, docs/lora.md): the
 * flat buffer is the adapters (ct_lora), the MMDiT under them is frozen:
 * its storage is the model's frozen storage (ct_model_ops.frozen_segment:
 * the MMDiT segments as byte ranges), whole on every rank, or at ZeRO-3
 * sharded by zero.c and supplied per segment (hooks.enter_frozen). The
 * adapters' segments are the MMDiT segments that hold some; their hooks are
 * called from the MMDiT's own, so ZeRO-2/3 (zero.c) reduce and gather the
 * adapters as they would a model's segments. The checkpoint file is
 * pytorch_lora_weights.safetensors (peft's names). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/backend.h"
#include "ctuner/lora.h"
#include "ctuner/mmdit.h"
#include "model.h"

typedef struct lora_impl {
  ct_mmdit *m;
  ct_lora *l;
  ct_model_hooks h; /* the strategy's hooks over the adapter segments */
  char init[32];    /* lora_init_type */
} lora_impl;

static lora_impl *impl(const ct_model *m) {
  return m->impl;
}
static float *params(ct_model *m) {
  return ct_lora_params(impl(m)->l);
}
static float *grads(ct_model *m) {
  return ct_lora_grads(impl(m)->l);
}
static int nsegments(const ct_model *m) {
  return ct_lora_nsegments(impl(m)->l);
}
static void segment(const ct_model *m, int s, size_t *off, size_t *n) {
  ct_lora_segment(impl(m)->l, s, off, n);
}
static void use_params(ct_model *m, float *w) {
  ct_lora_use_params(impl(m)->l, w);
}
static void use_grads(ct_model *m, float *g) {
  ct_lora_use_grads(impl(m)->l, g);
}

/* The frozen segment the MMDiT runs after s: the forward goes up to the last
 * (then the backward re-enters it); the backward stops at the first segment
 * holding adapters, after which the next micro-step's forward starts at 0. */
static int next_segment(const lora_impl *x, int s, int backward) {
  const int last = ct_mmdit_nsegments(x->m) - 1, lo = ct_lora_first_mmdit_segment(x->l);
  if (!backward) return s < last ? s + 1 : -1;
  return s > lo ? s - 1 : s > 0 ? 0 : -1;
}

/* MMDiT segment s: its frozen weights (the strategy's, when sharded), then
 * the adapters' segment k (if any) -> the strategy's hook. */
static ct_status enter(void *user, int s, int backward, float **w, float **g, ct_err *err) {
  lora_impl *x = user;
  const int k = ct_lora_segment_of(x->l, s);
  *w = *g = NULL; /* the MMDiT's own (frozen) weights */
  ct_status st = CT_OK;
  if (x->h.enter_frozen) {
    void *fw = NULL;
    if ((st = x->h.enter_frozen(x->h.user, s, next_segment(x, s, backward), &fw, err))) return st;
    *w = fw; /* the MMDiT's float32 storage: bytes [4 off, 4 (off + n)) */
  }
  if (k < 0 || !x->h.enter) return CT_OK;
  float *lw = NULL, *lg = NULL;
  st = x->h.enter(x->h.user, k, backward, &lw, &lg, err);
  if (!st) ct_lora_bind_segment(x->l, k, lw, lg);
  return st;
}

static ct_status leave(void *user, int s, int backward, ct_err *err) {
  lora_impl *x = user;
  const int k = ct_lora_segment_of(x->l, s);
  if (k < 0 || !x->h.leave) return CT_OK;
  return x->h.leave(x->h.user, k, backward, err);
}

static void set_hooks(ct_model *m, const ct_model_hooks *h) {
  lora_impl *x = impl(m);
  if (!h) {
    memset(&x->h, 0, sizeof x->h);
    ct_mmdit_set_hooks(x->m, NULL);
    for (int k = 0; k < ct_lora_nsegments(x->l); k++) ct_lora_bind_segment(x->l, k, NULL, NULL);
    return;
  }
  x->h = *h;
  const ct_mmdit_hooks mh = {x, enter, leave};
  ct_mmdit_set_hooks(x->m, &mh);
}

/* The frozen storage: the MMDiT's flat float32 buffer, its segments as bytes. */
static int frozen_nsegments(const ct_model *m) {
  return ct_mmdit_nsegments(impl(m)->m);
}
static void frozen_segment(const ct_model *m, int s, size_t *off, size_t *nbytes) {
  size_t o, n;
  ct_mmdit_segment(impl(m)->m, s, &o, &n);
  *off = o * sizeof(float);
  *nbytes = n * sizeof(float);
}
static void use_frozen(ct_model *m, void *w) {
  ct_mmdit_use_params(impl(m)->m, w);
}

static void init_range(const ct_model *m, uint64_t seed, size_t lo, size_t hi, float *out) {
  ct_err e;
  ct_status st = ct_lora_init_range(impl(m)->l, impl(m)->init, seed, lo, hi, out, &e);
  CT_ASSERT(st == CT_OK); /* the init type was checked when the model was made */
}

static ct_status load(ct_model *m, const char *dir, size_t lo, size_t hi, float *out, ct_err *err) {
  char p[4200];
  snprintf(p, sizeof p, "%s/pytorch_lora_weights.safetensors", dir);
  ct_lora *l = impl(m)->l;
  if (!out) return ct_lora_load(l, p, 0, ct_lora_numel(l), ct_lora_params(l), err);
  return ct_lora_load(l, p, lo, hi, out, err);
}

static ct_status save(const ct_model *m, const char *dir, ct_err *err) {
  char p[4200];
  snprintf(p, sizeof p, "%s/pytorch_lora_weights.safetensors", dir);
  ct_lora *l = impl(m)->l;
  return ct_lora_save(l, ct_lora_params(l), p, err);
}

static void mfree(void *p) {
  lora_impl *x = p;
  if (!x) return;
  ct_mmdit_free(x->m);
  ct_lora_free(x->l);
  free(x);
}

/* The frozen MMDiT (its base, bf16/int8 storage included) and the adapters. */
static ct_status set_backend(ct_model *m, const ct_backend_ops *be, ct_err *err) {
  lora_impl *x = impl(m);
  const ct_backend_ops *was = ct_lora_backend(x->l);
  ct_status st = ct_lora_set_backend(x->l, be, err);
  if (!st) st = ct_mmdit_set_backend(x->m, be, err);
  if (st) {
    ct_err ignored = {0};
    ct_lora_set_backend(x->l, was, &ignored);
  }
  return st;
}
static float *swap_params(ct_model *m, float *w) {
  return ct_lora_swap_params(impl(m)->l, w);
}

static const ct_model_ops ops = {
    "lora",           params,         grads,      nsegments,   segment,    set_hooks,
    use_params,       use_grads,      init_range, load,        save,       mfree,
    frozen_nsegments, frozen_segment, use_frozen, set_backend, swap_params};

ct_status ct_model_lora(struct ct_mmdit *mm, struct ct_lora *l, const char *init_type,
                        uint64_t seed, ct_model **out, ct_err *err) {
  lora_impl *x = calloc(1, sizeof *x);
  size_t nad;
  const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
  size_t nt = 0;
  for (size_t i = 0; i < nad; i++) nt += (size_t)ad[i].nt;
  ct_model_param *tab = calloc(nt + 1, sizeof *tab);
  if (!x || !tab) {
    free(x);
    free(tab);
    ct_mmdit_free(mm);
    ct_lora_free(l);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  *x = (lora_impl){.m = mm, .l = l};
  snprintf(x->init, sizeof x->init, "%s", init_type);
  size_t j = 0;
  for (size_t i = 0; i < nad; i++)
    for (int k = 0; k < ad[i].nt; k++) {
      ct_model_param *t = &tab[j++];
      ct_lora_tensor_fullname(l, &ad[i], k, t->name, sizeof t->name);
      const int vec = !ct_lora_is_lycoris(l) && k == 2; /* DoRA's magnitude: 1-D */
      t->ndim = vec ? 1 : 2;
      t->shape[0] = ad[i].t[k].rows;
      t->shape[1] = vec ? 0 : ad[i].t[k].cols;
      t->offset = ad[i].t[k].off;
      t->numel = (size_t)ad[i].t[k].rows * (size_t)ad[i].t[k].cols;
    }
  float *w = ct_lora_params(l);
  if (w) {
    ct_status st = ct_lora_init_range(l, init_type, seed, 0, ct_lora_numel(l), w, err);
    if (st) {
      mfree(x);
      free(tab);
      return st;
    }
  }
  return ct_model_wrap(&ops, x, tab, nt, ct_lora_numel(l), out, err);
}

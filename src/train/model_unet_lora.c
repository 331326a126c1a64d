/* LoRA adapters on SDXL's U-net behind the model interface (model.h,
 * docs/lora.md "SDXL"), as model_lora.c is for the MMDiT: the flat buffer
 * is the adapters (ct_unet_lora), the U-net under them frozen (no gradient
 * buffer). The U-net has no segments yet, so ZeRO-2/3 and bf16 storage are
 * refused for it as for the full U-net; plain data parallel, ZeRO-1, EMA and
 * checkpoints work on the adapters. The checkpoint file is
 * pytorch_lora_weights.safetensors in StableDiffusionXLPipeline's layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/backend.h"
#include "ctuner/unet.h"
#include "model.h"

typedef struct unet_lora_impl {
  ct_unet *u;
  ct_unet_lora *l;
  char init[32]; /* lora_init_type */
} unet_lora_impl;

static unet_lora_impl *impl(const ct_model *m) {
  return m->impl;
}
static float *params(ct_model *m) {
  return ct_unet_lora_params(impl(m)->l);
}
static float *grads(ct_model *m) {
  return ct_unet_lora_grads(impl(m)->l);
}

static void init_range(const ct_model *m, uint64_t seed, size_t lo, size_t hi, float *out) {
  ct_err e;
  ct_status st = ct_unet_lora_init_range(impl(m)->l, impl(m)->init, seed, lo, hi, out, &e);
  CT_ASSERT(st == CT_OK); /* the init type was checked when the model was made */
}

static ct_status load(ct_model *m, const char *dir, size_t lo, size_t hi, float *out, ct_err *err) {
  char p[4200];
  snprintf(p, sizeof p, "%s/pytorch_lora_weights.safetensors", dir);
  ct_unet_lora *l = impl(m)->l;
  return out ? ct_unet_lora_load_range(l, p, lo, hi, out, err) : ct_unet_lora_load(l, p, err);
}

static ct_status save(const ct_model *m, const char *dir, ct_err *err) {
  char p[4200];
  snprintf(p, sizeof p, "%s/pytorch_lora_weights.safetensors", dir);
  return ct_unet_lora_save(impl(m)->l, p, err);
}

static void mfree(void *p) {
  unet_lora_impl *x = p;
  if (!x) return;
  ct_unet_free(x->u);
  ct_unet_lora_free(x->l);
  free(x);
}

/* the frozen U-net and the adapters, together or neither */
static ct_status set_backend(ct_model *m, const ct_backend_ops *be, ct_err *err) {
  unet_lora_impl *x = impl(m);
  const ct_backend_ops *was = ct_unet_backend(x->u);
  ct_status st = ct_unet_lora_set_backend(x->l, be, err);
  if (!st) st = ct_unet_set_backend(x->u, be, err);
  ct_err ignored = {0};
  if (st) ct_unet_lora_set_backend(x->l, was, &ignored);
  return st ? st : ct_unet_set_lora(x->u, x->l, err);
}
static float *swap_params(ct_model *m, float *w) {
  return ct_unet_lora_swap_params(impl(m)->l, w);
}

static const ct_model_ops ops = {"unet_lora", params, grads,      NULL,        NULL,       NULL,
                                 NULL,        NULL,   init_range, load,        save,       mfree,
                                 NULL,        NULL,   NULL,       set_backend, swap_params};

ct_status ct_model_unet_lora(struct ct_unet *u, struct ct_unet_lora *l, const char *init_type,
                             uint64_t seed, ct_model **out, ct_err *err) {
  unet_lora_impl *x = calloc(1, sizeof *x);
  size_t nad;
  const ct_unet_adapter *ad = ct_unet_lora_adapters(l, &nad);
  ct_model_param *tab = calloc(2 * nad + 1, sizeof *tab);
  if (!x || !tab) {
    free(x), free(tab);
    ct_unet_free(u);
    ct_unet_lora_free(l);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  *x = (unet_lora_impl){.u = u, .l = l};
  snprintf(x->init, sizeof x->init, "%s", init_type ? init_type : "default");
  const int r = ct_unet_lora_rank(l);
  for (size_t i = 0; i < nad; i++)
    for (int b = 0; b < 2; b++) {
      ct_model_param *t = &tab[2 * i + (size_t)b];
      snprintf(t->name, sizeof t->name, "unet.%s.lora_%c.weight", ad[i].lin.name, b ? 'B' : 'A');
      t->ndim = 2;
      t->shape[0] = b ? ad[i].lin.out : r;
      t->shape[1] = b ? r : ad[i].lin.in;
      t->offset = b ? ad[i].b_off : ad[i].a_off;
      t->numel = (size_t)r * (size_t)(b ? ad[i].lin.out : ad[i].lin.in);
    }
  ct_status st = ct_unet_lora_init(l, x->init, seed, err);
  if (!st) st = ct_unet_set_lora(u, l, err);
  if (st) {
    mfree(x);
    free(tab);
    return st;
  }
  ct_unet_set_frozen(u, 1);
  return ct_model_wrap(&ops, x, tab, 2 * nad, ct_unet_lora_numel(l), out, err);
}

/* SDXL's U-net behind the model interface (model.h): its flat buffer and
 * table (diffusers' names). No segment hooks yet, so ZeRO-2/3 and bf16
 * storage are refused for it as for the VAE; set_backend moves it onto a
 * compute backend (ct_unet_set_backend). Its checkpoint files are diffusers' layout:
 * unet/config.json and unet/diffusion_pytorch_model.safetensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/fs.h"
#include "ctuner/unet.h"
#include "model.h"

static float *params(ct_model *m) {
  return ct_unet_params(m->impl);
}
static float *grads(ct_model *m) {
  return ct_unet_grads(m->impl);
}
static void ufree(void *impl) {
  ct_unet_free(impl);
}

static ct_status load(ct_model *m, const char *dir, size_t lo, size_t hi, float *out, ct_err *err) {
  char p[4200];
  snprintf(p, sizeof p, "%s/unet/diffusion_pytorch_model.safetensors", dir);
  return out ? ct_model_load_flat(m, p, lo, hi, out, err) : ct_unet_load(m->impl, p, err);
}

static ct_status save_weights(const void *obj, const char *path, ct_err *err) {
  return ct_unet_save(obj, path, err);
}
static char *config_json(const void *obj) {
  return ct_unet_config_json(ct_unet_cfg(obj));
}

ct_status ct_model_unet_save_dir(const struct ct_unet *u, const char *dir, ct_err *err) {
  return ct_model_save_component(dir, u, save_weights, config_json, err);
}

static ct_status save(const ct_model *m, const char *dir, ct_err *err) {
  char p[4200];
  snprintf(p, sizeof p, "%s/unet", dir);
  return ct_model_unet_save_dir(m->impl, p, err);
}

static ct_status set_backend(ct_model *m, const ct_backend_ops *be, ct_err *err) {
  return ct_unet_set_backend(m->impl, be, err);
}
static float *swap_params(ct_model *m, float *w) {
  return ct_unet_swap_params(m->impl, w);
}

static const ct_model_ops ops = {"unet", params, grads, NULL,        NULL,       NULL,
                                 NULL,   NULL,   NULL,  load,        save,       ufree,
                                 NULL,   NULL,   NULL,  set_backend, swap_params};

ct_status ct_model_unet(ct_unet *u, ct_model **out, ct_err *err) {
  size_t np;
  const ct_unet_param *t = ct_unet_table(u, &np);
  ct_model_param *tab = calloc(np ? np : 1, sizeof *tab);
  if (!tab) {
    ct_unet_free(u);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < np; i++) {
    snprintf(tab[i].name, sizeof tab[i].name, "%s", t[i].name);
    tab[i].ndim = t[i].ndim;
    memcpy(tab[i].shape, t[i].shape, sizeof tab[i].shape);
    tab[i].offset = t[i].offset;
    tab[i].numel = t[i].numel;
  }
  return ct_model_wrap(&ops, u, tab, np, ct_unet_numel(u), out, err);
}

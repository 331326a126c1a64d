/* The AutoencoderKL behind the model interface (model.h): its flat buffer
 * and table (diffusers names, 4-D convolution weights). It has no segment
 * hooks, so ZeRO-2/3 and bf16 storage are refused for it (config checks);
 * its checkpoint files are diffusers' layout, vae/config.json and
 * vae/diffusion_pytorch_model.safetensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/fs.h"
#include "ctuner/vae.h"
#include "model.h"

static float *params(ct_model *m) {
  return ct_vae_params(m->impl);
}
static float *grads(ct_model *m) {
  return ct_vae_grads(m->impl);
}
static void vfree(void *impl) {
  ct_vae_free(impl);
}

static ct_status load(ct_model *m, const char *dir, size_t lo, size_t hi, float *out, ct_err *err) {
  char p[4200];
  snprintf(p, sizeof p, "%s/vae/diffusion_pytorch_model.safetensors", dir);
  return out ? ct_model_load_flat(m, p, lo, hi, out, err) : ct_vae_load(m->impl, p, err);
}

static ct_status save_weights(const void *obj, const char *path, ct_err *err) {
  return ct_vae_save(obj, path, err);
}
static char *config_json(const void *obj) {
  return ct_vae_config_json(ct_vae_cfg(obj));
}

/* dir/vae: the weights and config.json (with the scaling the VAE has now). */
ct_status ct_model_vae_save_dir(const struct ct_vae *v, const char *dir, ct_err *err) {
  return ct_model_save_component(dir, v, save_weights, config_json, err);
}

static ct_status save(const ct_model *m, const char *dir, ct_err *err) {
  char p[4200];
  snprintf(p, sizeof p, "%s/vae", dir);
  return ct_model_vae_save_dir(m->impl, p, err);
}

static const ct_model_ops ops = {
    "vae", params, grads, NULL,  NULL, NULL, NULL, NULL,
    NULL,  load,   save,  vfree, NULL, NULL, NULL, /* stays on the cpu: */
    NULL,  NULL};

ct_status ct_model_vae(ct_vae *v, ct_model **out, ct_err *err) {
  size_t np;
  const ct_vae_param *t = ct_vae_table(v, &np);
  ct_model_param *tab = calloc(np ? np : 1, sizeof *tab);
  if (!tab) {
    ct_vae_free(v);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < np; i++) {
    snprintf(tab[i].name, sizeof tab[i].name, "%s", t[i].name);
    tab[i].ndim = t[i].ndim;
    memcpy(tab[i].shape, t[i].shape, sizeof tab[i].shape);
    tab[i].offset = t[i].offset;
    tab[i].numel = t[i].numel;
  }
  return ct_model_wrap(&ops, v, tab, np, ct_vae_numel(v), out, err);
}

/* The trainer's side of the model-family registry (ctuner/family.h holds
 * the rows as data; docs/models.md): per family the task that trains it
 * (objective, validation, checkpoint files: task_<family>.c) and its memory
 * plan's geometry (`ctuner bench memory --plan`). A family whose task is
 * NULL is known but refused before anything is opened, with its row's note. */
#include "ctuner/family.h"

#include <string.h>

#include "ctuner/diffusion.h"
#include "trainer_int.h"

/* FLUX.1's geometry: the MMDiT a config trains, the codec factor, T tokens. */
static ct_status flux_model_config(const ct_config *cfg, ct_mmdit_config *mc, int *codec_scale,
                                   int *T, ct_err *err) {
  ct_geometry g;
  ct_status st = ct_geometry_from_config(cfg, &g, err);
  if (st) return st;
  *mc = g.mc;
  if (codec_scale) *codec_scale = g.codec_scale;
  if (T) *T = g.T;
  return CT_OK;
}

typedef struct train_family {
  const char *name;        /* the ctuner/family.h row */
  const ct_task_ops *task; /* model_type full / lora; NULL: not trainable yet */
  ct_status (*model_config)(const ct_config *cfg, ct_mmdit_config *mc, int *codec_scale, int *T,
                            ct_err *err); /* the MMDiT's geometry; NULL: not an MMDiT */
  /* the memory plan's denoiser (memplan.c): its table and one step's
   * activations (`ctuner bench memory --plan`); NULL: none yet */
  ct_status (*plan)(const ct_config *cfg, int batch, long res, int tokens, int ckpt,
                    ct_plan_denoiser *o, ct_err *err);
  /* the denoiser as ct_denoise_fn, for the DDPM samplers (sdxl_sample.c);
   * NULL: the family samples through its own path (FLUX.1) or has none yet */
  ct_denoiser_open_fn open_denoiser;
} train_family;

static const train_family ROWS[] = {
    {"flux", &ct_task_mmdit, flux_model_config, ct_plan_flux, NULL},
    /* SDXL: the U-net's full fine-tune (task_sdxl.c); its denoiser is
     * ct_unet_forward as a ct_denoise_fn (sdxl_sampler.c); its memory plan
     * the U-net's table and ct_unet_plan_memory (memplan.c). */
    {"sdxl", &ct_task_sdxl, NULL, ct_plan_sdxl, ct_sdxl_unet_denoiser},
};

static const train_family *row(const char *name) {
  for (size_t i = 0; name && i < sizeof ROWS / sizeof ROWS[0]; i++)
    if (!strcmp(ROWS[i].name, name)) return &ROWS[i];
  return NULL;
}

int ct_train_family_rows(const char **names, int max) {
  int n = 0;
  for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++)
    if (n < max) names[n++] = ROWS[i].name;
  return n;
}

const ct_task_ops *ct_task_pick(const ct_config *cfg) {
  if (cfg->model_type && !strcmp(cfg->model_type, "vae")) return &ct_task_vae;
  const train_family *r = row(cfg->model_family);
  return r && r->task ? r->task : &ct_task_mmdit;
}

ct_status ct_train_family_check(const ct_config *cfg, ct_err *err) {
  if (cfg->model_type && !strcmp(cfg->model_type, "vae")) return CT_OK; /* no family's task */
  const ct_family *f = ct_family_find(cfg->model_family);
  const train_family *r = row(cfg->model_family);
  if (!f || !r) return ct_family_check(cfg->model_family, err);
  if (!r->task || !f->trainable)
    return ct_errf(err, CT_ERR_UNSUPPORTED, "model_family %s: %s cannot be trained yet: %s",
                   f->name, f->title, f->trainable_note ? f->trainable_note : "no task");
  if (cfg->model_flavour && f->reference_flavours && f->reference_train_note &&
      ct_family_in_list(f->reference_flavours, cfg->model_flavour))
    return ct_errf(err, CT_ERR_UNSUPPORTED, "model_flavour %s: %s", cfg->model_flavour,
                   f->reference_train_note);
  return CT_OK;
}

ct_status ct_train_model_config(const ct_config *cfg, ct_mmdit_config *mc, int *codec_scale, int *T,
                                ct_err *err) {
  const train_family *r = row(cfg->model_family);
  if (!r) return ct_family_check(cfg->model_family, err);
  if (!r->model_config)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "model_family %s has no MMDiT (its memory plan: ct_train_plan_denoiser)",
                   r->name);
  return r->model_config(cfg, mc, codec_scale, T, err);
}

ct_status ct_train_plan_denoiser(const ct_config *cfg, int batch, long resolution, int tokens,
                                 int ckpt, ct_plan_denoiser *out, ct_err *err) {
  memset(out, 0, sizeof *out);
  const train_family *r = row(cfg->model_family);
  if (!r) return ct_family_check(cfg->model_family, err);
  if (!r->plan)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "model_family %s has no memory plan yet (its denoiser's parameter table)",
                   r->name);
  if (batch < 1) return ct_errf(err, CT_ERR_INVALID, "memory plan: batch %d", batch);
  return r->plan(cfg, batch, resolution, tokens, ckpt, out, err);
}

ct_status ct_train_family_denoiser(const char *family, ct_denoiser_open_fn *open, ct_err *err) {
  const train_family *r = row(family);
  *open = r ? r->open_denoiser : NULL;
  if (*open) return CT_OK;
  const ct_family *f = ct_family_find(family);
  return ct_errf(err, CT_ERR_UNSUPPORTED,
                 "model_family %s has no denoiser for the DDPM samplers%s%s",
                 family ? family : "(unset)", f && f->trainable_note ? ": " : "",
                 f && f->trainable_note ? f->trainable_note : "");
}

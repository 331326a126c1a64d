/* The inference pipeline of a checkpoint (`ctuner sample`, validation
 * elsewhere): its config, codec (the checkpoint's own VAE copy if it has
 * one), the MMDiT with the live or EMA weights, and the text encoder with
 * the tokenizer saved beside it. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/log.h"
#include "ctuner/lora_tools.h"
#include "train/flux_pipe.h"
#include "train/lora_base.h"
#include "trainer_int.h"

/* The checkpoint's MMDiT: its model (or EMA) weights, or for a model_type
 * lora run its base with its adapter (or EMA adapter) folded in; lora (if
 * not NULL) is folded in instead of the run's own adapter, or on top of a
 * full run's weights, times lora_scale. */
static ct_status load_model(ct_pipeline *p, const ct_geometry *g, const char *dir, int use_ema,
                            const char *lora, double lora_scale, ct_err *err) {
  ct_status st = ct_lora_check_multiplier(lora_scale, err);
  if (st) return st;
  if (ct_lora_run_checkpoint(&p->cfg)) {
    ct_lora *l = NULL;
    const int lyco = ct_lora_run_lycoris(&p->cfg); /* its own file through ct_lora_merge_any */
    st = ct_lora_run_open(&p->cfg, dir, use_ema, &p->model, lora || lyco ? NULL : &l, err);
    if (!st && l) st = ct_lora_merge(p->model, l, lora_scale, err);
    if (!st && lyco && !lora)
      st = ct_lora_run_merge_lycoris(dir, use_ema, p->model, lora_scale, err);
    ct_lora_free(l);
  } else {
    char path[4200];
    st = ct_mmdit_new(&g->mc, 0, 0, &p->model, err);
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, use_ema ? "ema" : "model");
    if (!st && use_ema && access(path, R_OK) != 0)
      st = ct_errf(err, CT_ERR_NOT_FOUND,
                   "%s: no EMA weights in this checkpoint (trained without use_ema)", path);
    if (!st) st = ct_mmdit_load(p->model, path, "", err);
  }
  if (!st && lora) st = ct_lora_merge_file(p->model, lora, lora_scale, err);
  return st;
}

/* ---- inference pipeline from a checkpoint ---- */
ct_status ct_pipeline_from_checkpoint(const char *dir, int use_ema, ct_pipeline *p, ct_err *err) {
  return ct_pipeline_from_checkpoint_lora(dir, use_ema, NULL, 1.0, p, err);
}

ct_status ct_pipeline_from_checkpoint_lora(const char *dir, int use_ema, const char *lora,
                                           double lora_scale, ct_pipeline *p, ct_err *err) {
  memset(p, 0, sizeof *p);
  ct_config_defaults(&p->cfg);
  char path[4200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  ct_status st = ct_config_load_file(&p->cfg, path, err);
  if (!st && ct_flux_pipe_wanted(&p->cfg))
    st = ct_errf(err, CT_ERR_UNSUPPORTED,
                 "%s is a checkpoint of a FLUX.1 pipeline run: sample it with ctuner sample "
                 "--pretrained %s --checkpoint %s (docs/flux.md)",
                 dir, p->cfg.pretrained_model_name_or_path, dir);
  if (!st && p->cfg.codec && !strcmp(p->cfg.codec, "vae")) {
    /* the checkpoint's own copy of the VAE (vae/), else the directory its config names */
    char vdir[4200];
    struct stat sb;
    snprintf(vdir, sizeof vdir, "%s/vae/config.json", dir);
    if (stat(vdir, &sb) == 0) {
      snprintf(vdir, sizeof vdir, "%s/vae", dir);
      char *c = strdup(vdir);
      if (!c)
        st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
      else {
        free(p->cfg.pretrained_vae_model_name_or_path);
        p->cfg.pretrained_vae_model_name_or_path = c;
      }
    }
  }
  ct_geometry g;
  if (!st) st = ct_geometry_from_config(&p->cfg, &g, err);
  if (st) goto fail;
  p->T = g.T;
  p->codec_scale = g.codec_scale;
  if (p->cfg.codec && !strcmp(p->cfg.codec, "vae")) {
    st = ct_codec_vae(p->cfg.pretrained_vae_model_name_or_path, (int)p->cfg.vae_tile,
                      (uint64_t)p->cfg.seed, &p->codec, err);
  } else {
    st = ct_codec_pixel(g.codec_scale, &p->codec, err);
  }
  if (st) goto fail;
  st = load_model(p, &g, dir, use_ema, lora, lora_scale, err);
  if (st) goto fail;
  st = ct_textenc_from_config(&p->cfg, g.mc.context_in_dim, dir, &p->te, err);
  if (st) goto fail;
  return CT_OK;
fail:
  ct_pipeline_free(p);
  return st;
}

void ct_pipeline_free(ct_pipeline *p) {
  ct_codec_free(&p->codec);
  ct_mmdit_free(p->model);
  ct_textenc_free(p->te);
  ct_config_free(&p->cfg);
  memset(p, 0, sizeof *p);
}

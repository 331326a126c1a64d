/* The transformer an adapter applies to (docs/lora.md): `ctuner lora merge`,
 * `ctuner lora export`, and a model_type lora run's checkpoint, which holds
 * the adapter but not the frozen base. The base is what the run trained on:
 * the FLUX.1 pipeline's transformer, pretrained_model_path, else the seeded
 * init (ct_mmdit_new with the run's seed, as task_mmdit.c builds it). */
#include "train/lora_base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ctuner/lora_tools.h"
#include "train/flux_pipe.h"
#include "trainer_int.h"

static int exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

int ct_lora_run_checkpoint(const ct_config *cfg) {
  return cfg->model_type && !strcmp(cfg->model_type, "lora");
}

int ct_lora_run_lycoris(const ct_config *cfg) {
  return ct_lora_run_checkpoint(cfg) && cfg->lora_type && !strcmp(cfg->lora_type, "lycoris");
}

ct_status ct_lora_run_merge_lycoris(const char *dir, int use_ema, ct_mmdit *m, double mult,
                                    ct_err *err) {
  char path[4200];
  if (use_ema)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: --ema with a lora_type lycoris run is not implemented (its ema.safetensors "
                   "holds no alphas); sample its live adapter, or give --lora FILE",
                   dir);
  snprintf(path, sizeof path, "%s/pytorch_lora_weights.safetensors", dir);
  if (!exists(path)) return ct_errf(err, CT_ERR_NOT_FOUND, "%s: not in this checkpoint", path);
  return ct_lora_merge_any(m, path, mult, NULL, err);
}

ct_status ct_lora_run_adapter(const ct_config *cfg, const ct_mmdit_config *mc, const char *dir,
                              int use_ema, ct_lora **out, ct_err *err) {
  *out = NULL;
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir,
           use_ema ? "ema.safetensors" : "pytorch_lora_weights.safetensors");
  if (!exists(path))
    return ct_errf(err, CT_ERR_NOT_FOUND, "%s: not in this checkpoint%s", path,
                   use_ema ? " (trained without use_ema)" : "");
  if (cfg->lora_type && !strcmp(cfg->lora_type, "lycoris"))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: a lora_type lycoris run's adapter (%s, LyCORIS names): ctuner sample "
                   "and lora merge fold it in; lora export converts peft adapters only",
                   dir, path);
  const ct_lora_opts o = {(int)cfg->lora_rank,
                          cfg->lora_alpha > 0 ? cfg->lora_alpha : (double)cfg->lora_rank, 0.0, 0,
                          cfg->use_dora};
  ct_lora *l = NULL;
  ct_status st = ct_lora_new(mc, ct_lora_preset(cfg->flux_lora_target), &o, 0, &l, err);
  if (!st) st = ct_lora_load(l, path, 0, ct_lora_numel(l), ct_lora_params(l), err);
  if (st) {
    ct_lora_free(l);
    return st;
  }
  *out = l;
  return CT_OK;
}

/* A FLUX.1 pipeline directory's transformer (diffusers directory or BFL
 * file), or a bare diffusers transformer directory. */
static ct_status open_pretrained(const char *dir, ct_mmdit **out, ct_err *err) {
  char p[4200];
  snprintf(p, sizeof p, "%s/model_index.json", dir);
  if (!exists(p)) {
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (exists(p)) return ct_mmdit_open_diffusers(dir, 0, out, err);
    return ct_errf(err, CT_ERR_NOT_FOUND,
                   "%s is neither a FluxPipeline directory (model_index.json) nor a "
                   "FluxTransformer2DModel directory (config.json)",
                   dir);
  }
  ct_config cfg;
  ct_config_defaults(&cfg);
  ct_flux_pipe fp;
  ct_status st = ct_config_set(&cfg, "pretrained_model_name_or_path", dir, err);
  if (!st) st = ct_config_validate(&cfg, err);
  if (!st) st = ct_flux_pipe_open(&cfg, 0, &fp, err);
  ct_config_free(&cfg);
  if (st) return st;
  if (!fp.transformer_bfl) return ct_mmdit_open_diffusers(fp.transformer, 0, out, err);
  st = ct_mmdit_new(&fp.tcfg, 0, 0, out, err);
  if (!st) st = ct_mmdit_load(*out, fp.transformer, fp.bfl_prefix, err);
  if (st) ct_mmdit_free(*out), *out = NULL;
  return st;
}

ct_status ct_lora_pretrained_config(const char *dir, ct_mmdit_config *mc, ct_err *err) {
  char p[4200];
  snprintf(p, sizeof p, "%s/model_index.json", dir);
  if (!exists(p)) {
    snprintf(p, sizeof p, "%s/config.json", dir);
    return ct_flux_config_read(p, mc, err);
  }
  ct_config cfg;
  ct_config_defaults(&cfg);
  ct_flux_pipe fp;
  ct_status st = ct_config_set(&cfg, "pretrained_model_name_or_path", dir, err);
  if (!st) st = ct_config_validate(&cfg, err);
  if (!st) st = ct_flux_pipe_open(&cfg, 0, &fp, err);
  ct_config_free(&cfg);
  if (!st) *mc = fp.tcfg;
  return st;
}

/* A FLUX.1 pipeline run's full checkpoint: the shape from its
 * transformer/config.json, the float32 weights from its model.safetensors (a
 * bf16 run's masters beside its bf16 transformer/; or ema.safetensors), else
 * transformer/ itself (a float32 run may keep its weights only there). */
static ct_status open_pipeline_run(const char *dir, int use_ema, ct_mmdit **m, ct_err *err) {
  char p[4200];
  ct_mmdit_config mc;
  snprintf(p, sizeof p, "%s/transformer/config.json", dir);
  ct_status st = ct_flux_config_read(p, &mc, err);
  if (!st) st = ct_mmdit_new(&mc, 0, 0, m, err);
  snprintf(p, sizeof p, "%s/%s.safetensors", dir, use_ema ? "ema" : "model");
  if (!st && !use_ema && !exists(p)) {
    snprintf(p, sizeof p, "%s/transformer", dir);
    return ct_mmdit_load_diffusers(*m, p, err);
  }
  if (!st && !exists(p))
    st = ct_errf(err, CT_ERR_NOT_FOUND, "%s: not in this checkpoint%s", p,
                 use_ema ? " (trained without use_ema)" : "");
  if (!st) st = ct_mmdit_load(*m, p, "", err);
  return st;
}

ct_status ct_lora_run_open(const ct_config *cfg, const char *dir, int use_ema, ct_mmdit **m,
                           ct_lora **l, ct_err *err) {
  ct_geometry g;
  ct_status st = ct_geometry_from_config(cfg, &g, err);
  if (!st) st = ct_mmdit_new(&g.mc, (uint64_t)cfg->seed, 0, m, err);
  if (!st && cfg->pretrained_model_path)
    st = ct_mmdit_load(*m, cfg->pretrained_model_path, "", err);
  if (!st && l) st = ct_lora_run_adapter(cfg, &g.mc, dir, use_ema, l, err);
  return st;
}

ct_status ct_lora_base_open(const char *pretrained, const char *ckpt_dir, int use_ema,
                            ct_mmdit **model, ct_lora **adapter, ct_err *err) {
  *model = NULL;
  if (adapter) *adapter = NULL; /* NULL: the base only */
  ct_status st = CT_OK;
  char p[4200];
  if (pretrained && ckpt_dir) { /* a FLUX.1 pipeline run: its transformer/ or its adapter */
    snprintf(p, sizeof p, "%s/transformer", ckpt_dir);
    if (exists(p))
      st = open_pipeline_run(ckpt_dir, use_ema, model, err);
    else
      st = open_pretrained(pretrained, model, err);
    snprintf(p, sizeof p, "%s/pytorch_lora_weights.safetensors", ckpt_dir);
    if (!st && adapter && exists(p)) st = ct_lora_open_file(ct_mmdit_cfg(*model), p, adapter, err);
  } else if (pretrained) {
    st = open_pretrained(pretrained, model, err);
  } else {
    ct_config cfg;
    ct_config_defaults(&cfg);
    snprintf(p, sizeof p, "%s/config.json", ckpt_dir);
    st = ct_config_load_file(&cfg, p, err);
    if (!st && ct_flux_pipe_wanted(&cfg)) {
      const char *root = cfg.pretrained_model_name_or_path;
      st = root ? ct_lora_base_open(root, ckpt_dir, use_ema, model, adapter, err)
                : ct_errf(err, CT_ERR_INVALID,
                          "%s: a FLUX.1 pipeline run without "
                          "pretrained_model_name_or_path: give --pretrained",
                          ckpt_dir);
    } else if (!st && ct_lora_run_checkpoint(&cfg)) {
      st = ct_lora_run_open(&cfg, ckpt_dir, use_ema, model, adapter, err);
    } else if (!st) {
      ct_pipeline pl;
      st = ct_pipeline_from_checkpoint(ckpt_dir, use_ema, &pl, err);
      if (!st) *model = pl.model, pl.model = NULL;
      if (!st) ct_pipeline_free(&pl);
    }
    ct_config_free(&cfg);
  }
  if (st) {
    ct_mmdit_free(*model);
    *model = NULL;
    if (adapter) ct_lora_free(*adapter), *adapter = NULL;
  }
  return st;
}

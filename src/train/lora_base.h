/* A model_type lora run's checkpoint (src/train/lora_base.c): private to src/train. */
#ifndef CT_TRAIN_LORA_BASE_H
#define CT_TRAIN_LORA_BASE_H

#include "ctuner/config.h"
#include "ctuner/lora.h"
#include "ctuner/mmdit.h"

/* The run is model_type lora. */
int ct_lora_run_checkpoint(const ct_config *cfg);
/* Its adapter in checkpoint dir (pytorch_lora_weights.safetensors, or with
 * use_ema ema.safetensors) with the run's flux_lora_target, rank and alpha. */
ct_status ct_lora_run_adapter(const ct_config *cfg, const ct_mmdit_config *mc, const char *dir,
                              int use_ema, ct_lora **out, ct_err *err);
/* The run is lora_type lycoris (its adapter file: LyCORIS names). */
int ct_lora_run_lycoris(const ct_config *cfg);
/* A lora_type lycoris run's own adapter (dir/pytorch_lora_weights.safetensors,
 * with its alphas) folded into m at multiplier mult (ct_lora_merge_any);
 * use_ema is refused by name (ema.safetensors holds no alphas). */
ct_status ct_lora_run_merge_lycoris(const char *dir, int use_ema, ct_mmdit *m, double mult,
                                    ct_err *err);
/* A preset run's checkpoint: the base it trained on (pretrained_model_path,
 * else the seeded init) and its adapter (l NULL: not read). */
ct_status ct_lora_run_open(const ct_config *cfg, const char *dir, int use_ema, ct_mmdit **m,
                           ct_lora **l, ct_err *err);

#endif

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
/* A preset run's checkpoint: the base it trained on (pretrained_model_path,
 * else the seeded init) and its adapter (l NULL: not read). */
ct_status ct_lora_run_open(const ct_config *cfg, const char *dir, int use_ema, ct_mmdit **m,
                           ct_lora **l, ct_err *err);

#endif

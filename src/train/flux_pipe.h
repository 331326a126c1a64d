/* A diffusers FluxPipeline directory as training reads it (docs/flux.md,
 * "Training a FLUX.1 pipeline"): model_index.json and the classes of its
 * components, the transformer (or SimpleTuner's overrides: another
 * directory, a BFL single file), CLIP-L and T5 with their tokenizers, the
 * VAE, the scheduler's shift settings, and SimpleTuner's Flux defaults
 * (model_flavour, the T5 length). Private to src/train. */
#ifndef CT_FLUX_PIPE_H
#define CT_FLUX_PIPE_H

#include "ctuner/config.h"
#include "ctuner/mmdit.h"
#include "ctuner/status.h"
#include "ctuner/train.h"

#define CT_FLUX_PATH 4096

typedef struct ct_flux_pipe {
  char root[CT_FLUX_PATH - 128];  /* pretrained_model_name_or_path */
  char transformer[CT_FLUX_PATH]; /* a diffusers transformer directory, or a BFL file */
  int transformer_bfl;            /* 1: BFL single file */
  char bfl_prefix[64];            /* "model.diffusion_model." or "" */
  char text_encoder[CT_FLUX_PATH], tokenizer[CT_FLUX_PATH];
  char text_encoder_2[CT_FLUX_PATH], tokenizer_2[CT_FLUX_PATH];
  char vae[CT_FLUX_PATH];
  ct_mmdit_config tcfg; /* the transformer's config */
  int schnell;          /* model_flavour schnell */
  int max_sequence_length;
  char clip_precision[16];  /* text_encoder_1_precision: how CLIP-L is stored */
  char t5_precision[16];    /* text_encoder_2_precision: how the T5 is stored */
  int t5_d, clip_d;         /* widths of the two encoders */
  int vae_factor, vae_ch;   /* the VAE's downsampling and latent channels */
  ct_fm_sched_config sched; /* scheduler/scheduler_config.json */
} ct_flux_pipe;

/* The config trains a FLUX.1 pipeline (pretrained_model_name_or_path or
 * pretrained_transformer_model_name_or_path set). */
int ct_flux_pipe_wanted(const ct_config *cfg);
/* Validate everything that can be checked without reading weights; every
 * problem found goes into ONE error. lead: log the warnings (one rank). */
ct_status ct_flux_pipe_open(const ct_config *cfg, int lead, ct_flux_pipe *p, ct_err *err);

#endif

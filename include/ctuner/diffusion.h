/* DDPM-family diffusion as SDXL trains and samples it (docs/sdxl.md), as
 * plain functions over float arrays, float32 as diffusers computes:
 *
 * - the noise schedule of diffusers' DDPMScheduler (betas "scaled_linear" or
 *   "linear", alphas_cumprod), add_noise, get_velocity, SNR, and the training
 *   objective as SimpleTuner defines it for an epsilon / v_prediction model:
 *   uniform timesteps, noise_offset, input_perturbation, min-SNR weights
 *   (snr_gamma) — ddpm.c;
 * - the sampling schedulers of StableDiffusionXLPipeline: EulerDiscrete,
 *   DDIM (eta 0) and DPMSolverMultistep (DPM++ 2M) — sdxl_sched.c;
 * - the pipeline's denoising loop: classifier-free guidance with the negative
 *   prompt and guidance_rescale, over a denoiser given as a function
 *   (ct_denoise_fn: the SDXL U-net, or a stand-in in the tests) —
 *   sdxl_sample.c.
 */
#ifndef CTUNER_DIFFUSION_H
#define CTUNER_DIFFUSION_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/status.h"

struct ct_vae;
struct ct_image;

#define CT_DDPM_MAX_STEPS 4096 /* num_train_timesteps at most */

typedef enum { CT_BETA_SCALED_LINEAR, CT_BETA_LINEAR } ct_beta_schedule;
typedef enum { CT_PRED_EPSILON, CT_PRED_V } ct_prediction;
typedef enum { CT_SPACING_LEADING, CT_SPACING_TRAILING, CT_SPACING_LINSPACE } ct_spacing;
typedef enum { CT_SCHED_EULER, CT_SCHED_DDIM, CT_SCHED_DPMPP_2M } ct_dsched_kind;

/* A scheduler_config.json as the SDXL schedulers read it (diffusers' names). */
typedef struct ct_ddpm_config {
  int num_train_timesteps;     /* 1000 */
  double beta_start, beta_end; /* 0.00085, 0.012 (SDXL) */
  ct_beta_schedule beta_schedule;
  ct_prediction prediction_type;
  ct_spacing timestep_spacing; /* SDXL: leading */
  int steps_offset;            /* SDXL: 1 */
  int set_alpha_to_one;        /* DDIM's final alpha; SDXL: false */
  ct_dsched_kind kind;         /* the _class_name */
} ct_ddpm_config;

/* SDXL 1.0 base's scheduler/scheduler_config.json (EulerDiscreteScheduler,
 * scaled_linear 0.00085..0.012, 1000 steps, epsilon, leading, offset 1). */
void ct_ddpm_config_sdxl(ct_ddpm_config *c);
/* Read scheduler_config.json: _class_name EulerDiscreteScheduler,
 * DDIMScheduler, DPMSolverMultistepScheduler or DDPMScheduler (its schedule;
 * sampling then uses Euler, with one warning saying so); anything ctuner does not do (karras
 * sigmas, trained_betas, thresholding, clip_sample, rescale_betas_zero_snr, other solver types) is
 * refused by name; unknown fields draw one warning. */
ct_status ct_ddpm_config_read(const char *path, ct_ddpm_config *c, ct_err *err);
/* "euler" | "ddim" | "dpm++2m" (SimpleTuner's validation_noise_scheduler
 * names "euler", "ddim", "dpmsolver" too) -> kind. */
ct_status ct_dsched_kind_parse(const char *name, ct_dsched_kind *k, ct_err *err);

/* ---- the schedule (ddpm.c) ---- */
/* alphas_cumprod[0..num_train_timesteps) as DDPMScheduler.__init__ makes it
 * (float32 betas, a double-accumulated cumprod stored float32). */
ct_status ct_ddpm_alphas_cumprod(const ct_ddpm_config *c, float *ac, ct_err *err);
/* DDPMScheduler.add_noise: out = sqrt(ac[t]) x0 + sqrt(1 - ac[t]) noise, per
 * sample b (t[b]) over n values each. */
void ct_ddpm_add_noise(const float *ac, const long *t, int B, size_t n, const float *x0,
                       const float *noise, float *out);
/* DDPMScheduler.get_velocity: v = sqrt(ac[t]) noise - sqrt(1 - ac[t]) x0. */
void ct_ddpm_velocity(const float *ac, const long *t, int B, size_t n, const float *x0,
                      const float *noise, float *out);
/* diffusers.training_utils.compute_snr: (sqrt(ac) / sqrt(1 - ac))^2. */
float ct_ddpm_snr(const float *ac, long t);

/* SimpleTuner's objective for an epsilon / v_prediction model. */
typedef struct ct_ddpm_objective {
  ct_prediction prediction_type;
  double snr_gamma;                /* 0: none (the loss is snr_weight x MSE) */
  double snr_weight;               /* 1 */
  double noise_offset;             /* offset_noise's strength; 0: none */
  double noise_offset_probability; /* 1: every sample */
  double input_perturbation;       /* 0: none */
  long input_perturbation_steps;   /* 0: no decay */
} ct_ddpm_objective;

/* min-SNR weight of timestep t: min(snr, gamma) / snr (epsilon) or
 * / (snr + 1) (v_prediction); snr_weight when snr_gamma is 0. */
float ct_ddpm_loss_weight(const ct_ddpm_objective *o, const float *ac, long t);
/* The input_perturbation strength at global_step (linear decay to 0 over
 * input_perturbation_steps when > 0). */
double ct_ddpm_perturbation(const ct_ddpm_objective *o, long global_step);
/* One training sample's draws, from Philox (seed, stream, id) as ctuner's
 * other draws: t uniform in [0, num_train_timesteps), noise (n = C*hw
 * values) N(0,1) plus noise_offset x N(0,1) per channel when drawn,
 * noise_in: the noise that is added to the latents (noise plus
 * input_perturbation x N(0,1) at global_step; may equal noise). */
void ct_ddpm_draw(const ct_ddpm_objective *o, int num_train_timesteps, uint64_t seed, uint64_t id,
                  long global_step, int C, size_t hw, long *t, float *noise, float *noise_in);
/* The target of the prediction: noise (epsilon) or get_velocity (v). */
void ct_ddpm_target(const ct_ddpm_objective *o, const float *ac, const long *t, int B, size_t n,
                    const float *x0, const float *noise, float *out);
/* SimpleTuner's loss over B samples of n values: mean over everything of
 * weight(t_b) (pred - target)^2; grad (or NULL): d loss / d pred. */
double ct_ddpm_loss(const ct_ddpm_objective *o, const float *ac, const long *t, int B, size_t n,
                    const float *pred, const float *target, float *grad);

/* ---- SDXL's added conditioning ---- */
/* add_time_ids as SimpleTuner computes them for a training sample
 * (simpletuner/helpers/training/collate.py compute_time_ids and
 * gather_conditional_sdxl_size_features): (intermediary height, width — the
 * size before the crop, SimpleTuner's "original size" —, crop top, left —
 * its crop_coordinates —, latent height x f, latent width x f); all zeros when
 * the sample's caption was dropped. ct_img_geom (data.h) holds the inputs:
 * inter_h, inter_w, crop_y, crop_x. */
void ct_sdxl_time_ids(int inter_h, int inter_w, int crop_top, int crop_left, int lat_h, int lat_w,
                      int vae_factor, int dropped, float out[6]);

/* ---- SDXL's text conditioning (sdxl_text.c) ---- */
/* StableDiffusionXLPipeline.encode_prompt over a pipeline directory's
 * text_encoder (CLIPTextModel) + tokenizer and text_encoder_2
 * (CLIPTextModelWithProjection) + tokenizer_2: each tokenizer pads to its
 * model_max_length (77; tokenizer_2 pads with its own pad token, "!"), each
 * encoder's hidden_states[-2] (no final layer norm), the two concatenated on
 * the feature axis (768 + 1280 = 2048 for SDXL 1.0), and the pooled vector
 * text_embeds of text_encoder_2 (1280). Every problem of the four folders in
 * one error. */
typedef struct ct_sdxl_text ct_sdxl_text;
ct_status ct_sdxl_text_open(const char *root, ct_sdxl_text **out, ct_err *err);
/* T tokens, D = d1 + d2 features, P pooled features. */
void ct_sdxl_text_dims(const ct_sdxl_text *t, int *T, int *D, int *P);
/* n prompts -> embeds (n, T, D) and pooled (n, P) (either may be NULL); ids1,
 * ids2 (n, T) or NULL: the token ids used. */
ct_status ct_sdxl_encode_prompt(ct_sdxl_text *t, const char *const *prompts, int n, float *embeds,
                                float *pooled, int32_t *ids1, int32_t *ids2, ct_err *err);
void ct_sdxl_text_free(ct_sdxl_text *t);

/* ---- a StableDiffusionXLPipeline directory (sdxl_pipe.c) ---- */
typedef struct ct_sdxl_pipe {
  char root[3072];
  char unet_dir[3200];              /* root/unet: config.json + weights, read by the U-net */
  int force_zeros_for_empty_prompt; /* model_index.json's (default true): no negative -> zeros */
  ct_ddpm_config sched;             /* scheduler/scheduler_config.json */
  ct_sdxl_text *text;               /* both encoders and tokenizers, opened */
  struct ct_vae *vae;               /* the VAE, opened */
} ct_sdxl_pipe;
/* Open root as the sdxl row of the family registry describes it:
 * model_index.json (_class_name StableDiffusionXLPipeline, every component
 * with the class ctuner reads, null entries such as feature_extractor
 * allowed), the scheduler config, both text encoders and tokenizers, the
 * VAE (4 latent channels; scaling_factor from its config, 0.13025 for SDXL,
 * no shift) and the unet/ folder's config.json (UNet2DConditionModel) and
 * weights present. Every problem in one error. */
ct_status ct_sdxl_pipe_open(const char *root, ct_sdxl_pipe *p, ct_err *err);
void ct_sdxl_pipe_close(ct_sdxl_pipe *p);

/* ---- the single-file layout (sdxl_single.c) ---- */
/* sd_xl_base_1.0.safetensors (Stability's SGM names) -> diffusers /
 * transformers names, as diffusers' single_file_utils converts them. */
typedef enum {
  CT_SDXL_SF_UNKNOWN = -1, /* no rule: the caller lists it */
  CT_SDXL_SF_IGNORED = 0,  /* a buffer with no weights (position_ids, logit_scale) */
  CT_SDXL_SF_TEXT1,        /* text_encoder (CLIPTextModel) */
  CT_SDXL_SF_TEXT2,        /* text_encoder_2 (CLIPTextModelWithProjection) */
  CT_SDXL_SF_VAE,          /* vae (AutoencoderKL) */
  CT_SDXL_SF_UNET          /* unet: names[0] is the key under model.diffusion_model., for the
                              U-net's own name map */
} ct_sdxl_sf_part;
typedef enum {
  CT_SDXL_SF_COPY,
  CT_SDXL_SF_TRANSPOSE, /* OpenCLIP's text_projection (width, proj) -> (proj, width) */
  CT_SDXL_SF_QKV,       /* in_proj rows split in thirds: names[0..2] = q, k, v */
  CT_SDXL_SF_CONV1X1    /* the VAE attention's 1x1 convs (o, i, 1, 1) -> linear (o, i) */
} ct_sdxl_sf_op;
/* key -> part, names (up to 3, 192 chars) and the tensor operation;
 * vae_blocks: len(block_out_channels) of the VAE (4 for SDXL), which
 * reverses the decoder's up-block index. */
ct_sdxl_sf_part ct_sdxl_single_map(const char *key, int vae_blocks, char names[3][192],
                                   ct_sdxl_sf_op *op);

/* ---- sampling schedulers (sdxl_sched.c) ---- */
typedef struct ct_dsched {
  ct_ddpm_config cfg;
  float ac[CT_DDPM_MAX_STEPS];
  int n; /* inference steps */
  float timesteps[CT_DDPM_MAX_STEPS];
  float sigmas[CT_DDPM_MAX_STEPS + 1]; /* Euler, DPM: n + 1 (the last 0) */
  float init_noise_sigma;
  int step_index;
  /* DPM++ 2M: the previous converted output (x0 prediction) */
  float *prev;
  size_t prev_n;
  int lower_order_nums;
} ct_dsched;

/* set_timesteps(steps) of cfg.kind; *s is owned by the caller
 * (ct_dsched_free). */
ct_status ct_dsched_init(ct_dsched *s, const ct_ddpm_config *cfg, int steps, ct_err *err);
void ct_dsched_free(ct_dsched *s);
/* scale_model_input: x / sqrt(sigma^2 + 1) (Euler), the identity otherwise;
 * out may equal x. */
void ct_dsched_scale_input(const ct_dsched *s, const float *x, size_t n, float *out);
/* step(model_output, timesteps[step_index], x): x becomes prev_sample;
 * step_index advances. */
ct_status ct_dsched_step(ct_dsched *s, const float *model_output, float *x, size_t n, ct_err *err);

/* ---- the denoising loop (sdxl_sample.c) ---- */
/* The denoiser: out (B, C, H, W) from x (B, C, H, W) at timestep t (each of
 * the B samples the same), conditioned on text (B, Ttxt, Dtxt) — SDXL's
 * encoder_hidden_states —, pooled (B, Dpool) — text_embeds — and time_ids
 * (B, 6). The SDXL U-net's forward has this shape. */
typedef struct ct_denoise_cond {
  const float *text, *pooled, *time_ids;
  int Ttxt, Dtxt, Dpool;
} ct_denoise_cond;
typedef ct_status (*ct_denoise_fn)(void *user, const float *x, int B, int C, int H, int W, float t,
                                   const ct_denoise_cond *cond, float *out, ct_err *err);

/* A family's denoiser opened from its pipeline folder (unet/ for SDXL):
 * *fn and *user to call, *close to free user. The family registry's trainer
 * row holds one (src/train/family.c; NULL until the family's model lands). */
typedef ct_status (*ct_denoiser_open_fn)(const char *dir, ct_denoise_fn *fn, void **user,
                                         void (**close)(void *user), ct_err *err);

typedef struct ct_sdxl_sample_opts {
  int steps;
  double guidance_scale;   /* > 1: classifier-free guidance */
  double guidance_rescale; /* 0: none */
} ct_sdxl_sample_opts;

/* StableDiffusionXLPipeline's loop for one image: x (C, H, W) holds the
 * initial N(0, 1) noise and becomes the final latents (x * init_noise_sigma
 * first). cond: the prompt's conditioning; uncond: the negative prompt's
 * (the pipeline's zeros for no negative prompt), used when guidance_scale
 * > 1, the pair evaluated as one batch of 2 (uncond first). */
ct_status ct_sdxl_denoise(const ct_ddpm_config *cfg, const ct_sdxl_sample_opts *o, ct_denoise_fn fn,
                          void *user, const ct_denoise_cond *cond, const ct_denoise_cond *uncond,
                          int C, int H, int W, float *x, ct_err *err);
/* diffusers' rescale_noise_cfg on one sample of n values: cfg is rescaled
 * towards the text prediction's standard deviation (unbiased std). */
void ct_rescale_noise_cfg(float *cfg, const float *text, size_t n, double guidance_rescale);

/* ---- sampling a pipeline directory (sdxl_sampler.c) ---- */
/* The SDXL U-net as a ct_denoise_fn: dir (unet/) opened with
 * ct_unet_from_pretrained, ct_unet_forward without a tape (the sdxl row's
 * open_denoiser, family.c). */
ct_status ct_sdxl_unet_denoiser(const char *dir, ct_denoise_fn *fn, void **user,
                                void (**close)(void *user), ct_err *err);

/* The same over a U-net already in memory (a training run's, for its
 * validation images): borrowed, never freed by close. */
struct ct_unet;
ct_status ct_sdxl_unet_as_denoiser(struct ct_unet *u, ct_denoise_fn *fn, void **user,
                                   void (**close)(void *user), ct_err *err);

/* StableDiffusionXLPipeline over a pipeline directory: its text encoders,
 * U-net (unet_dir, or NULL: root/unet) and VAE. */
typedef struct ct_sdxl_sampler ct_sdxl_sampler;
ct_status ct_sdxl_sampler_open(const char *root, const char *unet_dir, ct_sdxl_sampler **out,
                               ct_err *err);
/* The same with unet (borrowed: a training run's, for its validation
 * images, the parameters as they are at each call) in place of root/unet. */
ct_status ct_sdxl_sampler_open_unet(const char *root, struct ct_unet *unet, ct_sdxl_sampler **out,
                                    ct_err *err);
/* The same over an open pipeline too (borrowed: a training run's, whose text
 * encoders and VAE it then shares; open for the sampler's life). */
ct_status ct_sdxl_sampler_open_pipe(const ct_sdxl_pipe *pipe, struct ct_unet *unet,
                                    ct_sdxl_sampler **out, ct_err *err);
void ct_sdxl_sampler_free(ct_sdxl_sampler *s);
/* The pipeline's scheduler_config.json. */
const ct_ddpm_config *ct_sdxl_sampler_sched(const ct_sdxl_sampler *s);
/* Image sides must be multiples of *multiple (VAE factor x 2^(levels - 1));
 * latents are (*C, height / *vae_factor, width / *vae_factor); *default_px:
 * the pipeline's default side (unet sample_size x VAE factor: 1024 for SDXL
 * 1.0). Any pointer may be NULL. */
void ct_sdxl_sampler_geometry(const ct_sdxl_sampler *s, int *multiple, int *vae_factor, int *C,
                              int *default_px);
/* Image index's initial latents (lat values): N(0, 1) from Philox (seed,
 * the sampling stream), as ctuner's other samplers draw them. */
void ct_sdxl_sampler_noise(uint64_t seed, uint64_t index, size_t lat, float *x);
/* 1: a progress line per step on stderr. */
void ct_sdxl_sampler_progress(ct_sdxl_sampler *s, int on);

typedef struct ct_sdxl_run {
  const char *prompt;
  const char *negative;        /* NULL: none (zeros with force_zeros_for_empty_prompt) */
  int width, height;           /* pixels; original size = target size, crop (0, 0) */
  const ct_ddpm_config *sched; /* NULL: the pipeline's */
  ct_sdxl_sample_opts opts;
} ct_sdxl_run;
/* One image: x (C, h, w) holds the initial N(0, 1) latents (the pipeline's
 * `latents`) and becomes the final latents; out (or NULL): the decoded image
 * (ct_image_free). */
ct_status ct_sdxl_sampler_run(ct_sdxl_sampler *s, const ct_sdxl_run *r, float *x,
                              struct ct_image *out, ct_err *err);

#endif

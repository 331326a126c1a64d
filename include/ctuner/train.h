/* The flow-matching training loop, checkpoints and sampling.
 *
 * ct_train_run builds everything from a validated ct_config (model, text
 * encoder, codec, data, optimizer, schedule, EMA), resumes from a checkpoint
 * if asked, trains, checkpoints and validates at the configured intervals.
 * It never prints to stdout: per-step progress goes to a callback (the CLI
 * draws the bar) and to output_dir/metrics.jsonl.
 */
#ifndef CTUNER_TRAIN_H
#define CTUNER_TRAIN_H

#include <stdint.h>

#include "ctuner/codec.h"
#include "ctuner/comm.h"
#include "ctuner/config.h"
#include "ctuner/image.h"
#include "ctuner/mmdit.h"
#include "ctuner/status.h"
#include "ctuner/textenc.h"

typedef struct ct_step_info {
  long step, total; /* optimizer steps done (1-based after this step), planned */
  long epoch;
  double loss, lr, grad_norm;
  double seconds; /* this step's wall time */
  double samples_per_s;
  int skipped;       /* 1 if NaN/Inf made this step a no-op */
  const char *event; /* NULL, or "checkpoint <path>" / "validation <n> images" */
} ct_step_info;

typedef void (*ct_step_cb)(const ct_step_info *info, void *user);

typedef struct ct_train_summary {
  long start_step, end_step, total_steps;
  long skipped_nonfinite; /* steps skipped for NaN/Inf over the run */
  double last_loss;
  double seconds;
  double loop_seconds, data_wait_seconds; /* the training loop, and its time waiting for batches */
  size_t images, images_skipped;
  size_t params; /* trainable parameters of the model (Ψ) */
  char last_checkpoint[1024];
  int joint_stop; /* the error was reached by every rank at the same point (breaker, disk): no abort
                     needed */
} ct_train_summary;

/* Hub ids in pretrained_model_name_or_path, pretrained_transformer_model_name_or_path
 * and pretrained_vae_model_name_or_path replaced by their snapshot directories in
 * the Hugging Face cache (download 1: missing files fetched from the hub; 0: the
 * cache only), with revision and variant (docs/hub.md); local paths unchanged
 * (with variant: the variant view of a directory). */
ct_status ct_train_resolve_hub(ct_config *cfg, int download, ct_err *err);

/* comm: the ranks to train on (NULL: this process alone). With N ranks each
 * takes train_batch_size samples of every global micro-batch of N x
 * train_batch_size; gradients are averaged over the ranks (docs/distributed.md),
 * so N ranks train the same model as 1 rank with N times the batch. Rank 0
 * alone writes metrics, validation images and checkpoints, and alone calls cb. */
/* Builds the data caches of cfg (discovery, latents, text embeddings; every
 * rank of comm together) without training; stats as the loader counted them. */
struct ct_data_stats;
ct_status ct_cache_run(const ct_config *cfg, ct_comm *comm, struct ct_data_stats *stats,
                       ct_err *err);
ct_status ct_train_run(const ct_config *cfg, ct_comm *comm, ct_step_cb cb, void *user,
                       ct_train_summary *sum, ct_err *err);

/* Opens and checks the files cfg names as training will read them, before
 * any data or cache: the FLUX.1 pipeline directory (no weights read), the
 * LyCORIS config, the VAE's config (model_type vae, codec vae), the BPE
 * tokenizer, pretrained_model_path / text_encoder_path / init_lora, the
 * webhooks. Every problem goes into probs, filed under its key at the place
 * the key came from. `ctuner config check` and training both call it, so the
 * two never disagree about a file (issue 32). CT_OK when it added no error. */
struct ct_config_problems;
ct_status ct_train_check_files(const ct_config *cfg, struct ct_config_problems *probs);

/* ---- memory planning (`ctuner bench memory --plan`, docs/performance.md) ---- */
/* The MMDiT configuration a training config trains (the preset with the
 * codec's input channels), the codec factor and the text tokens per caption. */
ct_status ct_train_model_config(const ct_config *cfg, ct_mmdit_config *mc, int *codec_scale, int *T,
                                ct_err *err);

/* The trained denoiser as the memory plan sees it: the family row's plan hook
 * (family.c) fills it from a config — model_family, pretrained_model_name_or_path
 * (FLUX.1: preset; SDXL: the pipeline's unet/config.json, else SDXL 1.0 base's
 * geometry built in) — for one step of batch images of resolution pixels. */
typedef struct ct_plan_denoiser {
  const char *kind;          /* "mmdit", "unet" */
  char geometry[4200];       /* where the geometry came from: a config.json, "built in" */
  size_t numel, psi, maxseg; /* floats of the flat buffer, Ψ, the largest segment (tensor) */
  int hidden;                /* reduce_bucket_size's default is hidden^2 */
  int codec_scale, tokens;   /* the codec's factor, text tokens per caption */
  long resolution;           /* pixels of the planned step (0 asked: the family's default) */
  int latent;                /* its latent side */
  double activations;        /* CT_MEM_ACTIVATIONS of one step at its peak */
  double scratch;            /* CT_MEM_BUFFERS the denoiser's step holds (U-net: im2col) */
} ct_plan_denoiser;
/* batch >= 1; resolution, tokens 0: the family's defaults; ckpt:
 * gradient_checkpointing_interval (0 off). CT_ERR_UNSUPPORTED for a family
 * with no plan, or what its plan cannot compute (SDXL: checkpointing). */
ct_status ct_train_plan_denoiser(const ct_config *cfg, int batch, long resolution, int tokens,
                                 int ckpt, ct_plan_denoiser *out, ct_err *err);

typedef struct ct_memplan_opts {
  size_t numel;           /* floats of the flat parameter buffer (16-float aligned tensors) */
  size_t psi;             /* trainable parameters Ψ (the formula's) */
  int ranks, stage, bf16; /* world size, zero_stage, mixed_precision bf16 */
  int nstate;             /* optimizer state arrays per parameter (AdamW 2) */
  int ema;                /* use_ema */
  int offload_optimizer;  /* offload_optimizer nvme */
  int offload_param;      /* offload_param nvme (stage 3, float32) */
  size_t offload_buffer;  /* offload_buffer_size (floats; 0: the default) */
  size_t maxseg;          /* floats of the largest segment (ct_mmdit_max_segment) */
  size_t bucket;          /* reduce_bucket_size (floats; 0: hidden^2, the default) */
  int hidden;
  /* model_type lora: the frozen base's storage (bytes; 0: none) and its largest
   * segment (bytes); category params, at stage 3 this rank's byte range */
  size_t frozen_bytes, frozen_maxseg, frozen_psi; /* frozen_psi: the base's parameters */
} ct_memplan_opts;

/* Bytes per rank — the largest rank's (rank 0's) — by accounting category,
 * as the trainer allocates them; nothing is allocated. */
typedef struct ct_memplan {
  double params, grads, optimizer; /* in memory while training (optimizer: state, bf16 master
                                      weights, EMA, offload buffers) */
  double startup_params, startup_optimizer; /* the peaks: with offload the float32 shard and
                                               the state are in memory (beside the swap file's
                                               buffers) before they are written to the file */
  double swap;                              /* bytes per rank in the offload swap file instead */
  double offload_buffers;                   /* of optimizer: offload.c's three sub-group buffers */
  double formula_params, formula_grads, formula_optimizer; /* ZeRO's formula over Ψ */
  double zero_buffers; /* category buffers, zero.c: stage 2-3 buckets, stage 3 slots, bf16
                          segment scratch and float32 gradient range, offload_param pieces */
  double gather_rank0; /* category buffers, rank 0 only, while validating or checkpointing:
                          the full float32 weights (and EMA) gathered from the shards */
  size_t range, shard, offload_sub; /* floats: rank 0's optimizer range, the shard, a sub-group */
  double base;         /* of params: the frozen base (whole, or this rank's bytes at stage 3) */
  double formula_base; /* of formula_params: 4 bytes per base parameter, / N at stage 3 */
  double gather_base_rank0; /* category buffers, rank 0, validating: the whole base gathered */
} ct_memplan;
ct_status ct_memplan_trainable(const ct_memplan_opts *o, ct_memplan *p, ct_err *err);

/* A stop asked for from outside (SIGTERM, SIGINT or SIGUSR1 in ctuner train;
 * a scheduler's preemption, the web UI's Stop): the running loop finishes the
 * step it is in, every rank agrees at the step's end, a checkpoint of that
 * step is written (unless it was just written) and ct_train_run returns
 * CT_ERR_STOPPED with sum->joint_stop set; resuming continues bit for bit.
 * Async-signal-safe. Returns 1 if a training loop is running and will stop,
 * 0 if none is running or a stop was already asked for (the caller then does
 * what the signal would do by default: a second Ctrl-C ends the process). */
int ct_train_request_stop(int sig);
/* Exit code of `ctuner train` after such a stop, checkpoint written (docs/training.md). */
#define CT_EXIT_STOPPED 5

/* ---- checkpoints ---- */
/* Newest checkpoint-<N> under output_dir with a .guard holding "complete";
 * unguarded and temporary directories are ignored. CT_ERR_NOT_FOUND if none. */
ct_status ct_checkpoint_latest(const char *output_dir, char *path, size_t n, long *step,
                               ct_err *err);

/* ---- inference ---- */
/* Everything sampling needs, rebuilt from a checkpoint directory (its
 * config.json, model or EMA weights, text encoder). */
typedef struct ct_pipeline {
  ct_config cfg;
  ct_mmdit *model;
  ct_textenc *te;
  int T;           /* text tokens */
  int codec_scale; /* latent factor (pixel codec s or VAE f) */
  ct_codec codec;  /* the checkpoint's codec */
} ct_pipeline;

ct_status ct_pipeline_from_checkpoint(const char *dir, int use_ema, ct_pipeline *p, ct_err *err);
/* The same with an adapter file (docs/lora.md; NULL: none) folded into the
 * model times lora_scale: on top of a full run's weights, or instead of a
 * model_type lora run's own adapter (whose base is pretrained_model_path or
 * the seeded init; without lora its own adapter gets lora_scale). */
ct_status ct_pipeline_from_checkpoint_lora(const char *dir, int use_ema, const char *lora,
                                           double lora_scale, ct_pipeline *p, ct_err *err);
void ct_pipeline_free(ct_pipeline *p);

/* The transformer an adapter applies to (`ctuner lora merge|export`,
 * docs/lora.md): pretrained (a FluxPipeline directory, or a diffusers
 * FluxTransformer2DModel directory), and/or a checkpoint directory: a full
 * run's model (EMA with use_ema); a model_type lora run's base (the
 * pipeline's transformer, pretrained_model_path, else the seeded init) with
 * *adapter its own adapter (EMA with use_ema), else *adapter NULL.
 * adapter NULL: the base only (its own adapter not read). */
struct ct_lora;
ct_status ct_lora_base_open(const char *pretrained, const char *ckpt_dir, int use_ema,
                            ct_mmdit **model, struct ct_lora **adapter, ct_err *err);
/* Only the transformer's shape of pretrained (as above), no weights read. */
ct_status ct_lora_pretrained_config(const char *pretrained, ct_mmdit_config *cfg, ct_err *err);

typedef struct ct_sample_opts {
  int width, height; /* pixels; multiples of 2 x codec scale */
  int steps;         /* Euler steps */
  float guidance;    /* CFG scale; <= 1 disables the unconditional pass */
  float flow_shift;  /* static shift; 0 or 1: none */
  uint64_t seed;
  int auto_shift; /* 1: the shift from the image's token count (flow_schedule_auto_shift) */
  /* a FLUX.1 pipeline's scheduler (fm_sched.c): when set, its sigmas and
   * timesteps as FluxPipeline computes them replace flow_shift/auto_shift */
  const struct ct_fm_sched_config *sched;
  const char *negative; /* the CFG pass's prompt (NULL: ""); FluxPipeline (sched) makes none */
} ct_sample_opts;

/* n images; image i uses prompts[i] and noise (seed, index0 + i). out[] are
 * allocated here (ct_image_free each). */
ct_status ct_sample_images(ct_mmdit *m, ct_textenc *te, int T, const ct_codec *codec,
                           const char *const *prompts, int n, uint64_t index0,
                           const ct_sample_opts *o, ct_image *out, ct_err *err);

/* ---- FlowMatchEulerDiscreteScheduler as FluxPipeline drives it (fm_sched.c,
 * docs/flux.md "Scheduler"); pure functions, float32 as diffusers computes. */
typedef struct ct_fm_sched_config {
  int num_train_timesteps; /* 1000 */
  double shift;            /* 1.0; used without dynamic shifting */
  int use_dynamic_shifting;
  double base_shift, max_shift;               /* 0.5, 1.15: calculate_shift's ends */
  long base_image_seq_len, max_image_seq_len; /* 256, 4096 */
  int time_shift_linear;                      /* time_shift_type: 0 "exponential", 1 "linear" */
  double shift_terminal;                      /* 0: none */
  int invert_sigmas;
} ct_fm_sched_config;

/* diffusers' defaults (the class's __init__). */
void ct_fm_sched_config_default(ct_fm_sched_config *c);
/* scheduler/scheduler_config.json; karras / exponential / beta sigmas and
 * stochastic_sampling are refused by name, unknown fields draw one warning,
 * every problem is listed in one error. */
ct_status ct_fm_sched_config_read(const char *path, ct_fm_sched_config *c, ct_err *err);
/* FluxPipeline's calculate_shift: mu linear in image_seq_len (double). */
double ct_fm_calculate_shift(const ct_fm_sched_config *c, long image_seq_len);
/* set_timesteps(sigmas=in[0..N), mu): sigmas (N+1, the last 0 — 1 when
 * inverted) and timesteps (N). mu is used with use_dynamic_shifting only. */
ct_status ct_fm_set_timesteps(const ct_fm_sched_config *c, int N, const float *in, double mu,
                              float *sigmas, float *timesteps, ct_err *err);
/* FluxPipeline: in = linspace(1, 1/N, N), mu = calculate_shift(image_seq_len),
 * then set_timesteps. */
ct_status ct_fm_flux_timesteps(const ct_fm_sched_config *c, int N, long image_seq_len,
                               float *sigmas, float *timesteps, ct_err *err);
/* step i (0 <= i < N): x += (sigmas[i+1] - sigmas[i]) v over n values. */
void ct_fm_step(const float *sigmas, int i, const float *v, float *x, size_t n);

/* ---- a FLUX.1 pipeline directory (docs/flux.md) ---- */
/* Sampling as diffusers' FluxPipeline: dir is a FluxPipeline directory,
 * flavour "dev"/"krea"/"schnell" or NULL (its T5 length: 512, schnell 256,
 * or max_sequence_length when > 0); transformer_dir (a checkpoint's
 * transformer/) replaces the pipeline's transformer, or NULL. */
typedef struct ct_flux_sampler ct_flux_sampler;
ct_status ct_flux_sampler_open(const char *dir, const char *flavour, int max_sequence_length,
                               const char *transformer_dir, ct_flux_sampler **out, ct_err *err);
/* Fold an adapter file (peft names, docs/lora.md) into the transformer,
 * times lora_scale (diffusers' joint_attention_kwargs {"scale": s}). */
ct_status ct_flux_sampler_lora(ct_flux_sampler *s, const char *path, double lora_scale,
                               ct_err *err);
/* Pixels per latent (the VAE's factor). */
int ct_flux_sampler_factor(const ct_flux_sampler *s);
/* FLUX.1 Kontext (docs/kontext.md): the reference image every later run
 * conditions on, as FluxKontextPipeline's `image` (VAE latent mean); its size
 * must be a multiple of 2 x the factor (the pipeline would resize others:
 * refused by name). */
ct_status ct_flux_sampler_reference(ct_flux_sampler *s, const ct_image *ref, ct_err *err);
/* FluxKontextPipeline's sizes: the output (w, h) becomes round(sqrt(max_area
 * * w/h)) x round(sqrt(max_area / (w/h))) floored to multiple (its __call__);
 * with auto_resize the reference (rw, rh) becomes the entry of
 * PREFERRED_KONTEXT_RESOLUTIONS nearest its aspect ratio, then floored to
 * multiple. Returns 1 when the reference would be resized. */
int ct_kontext_sizes(long max_area, int multiple, int auto_resize, int *w, int *h, int *rw,
                     int *rh);
/* n prompts; x (n, 16, height/f, width/f): the initial noise, unpacked
 * (ct_flux_unpack of FluxPipeline's latents), overwritten with the final
 * latents. steps Euler steps over the scheduler's sigmas; guidance: the
 * guidance input of a guidance_embeds transformer (FluxPipeline's
 * guidance_scale), unused otherwise. out: n images decoded by the VAE
 * (ct_image_free each), or NULL. */
ct_status ct_flux_sampler_run(ct_flux_sampler *s, const char *const *prompts, int n, int width,
                              int height, int steps, float guidance, float *x, ct_image *out,
                              ct_err *err);
/* The initial noise of image index (x: lat floats), N(0, 1) from Philox by
 * (seed, index) as ctuner's other sampling draws it. */
void ct_flux_sampler_noise(uint64_t seed, uint64_t index, size_t lat, float *x);
void ct_flux_sampler_free(ct_flux_sampler *s);

#endif

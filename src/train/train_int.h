/* Internal pieces shared by the trainer, checkpoints and sampling. */
#ifndef CT_TRAIN_INT_H
#define CT_TRAIN_INT_H

#include <stdio.h>

#include "ctuner/data.h"
#include "ctuner/fs.h"
#include "ctuner/train.h"

/* Philox streams of the trainer's random draws: each draw is a pure function
 * of (seed, stream, sample id), so accumulation splits and resumes never
 * change which numbers a sample gets. */
#define CT_STREAM_NOISE 0x4e4f495345000000ull        /* eps, offset sample*latent */
#define CT_STREAM_TIMESTEP 0x54494d4500000000ull     /* t */
#define CT_STREAM_SAMPLE_NOISE 0x53414d5000000000ull /* sampling noise */
#define CT_STREAM_GUIDANCE 0x4755494400000000ull     /* flux_guidance_mode random-range */

float ct_flow_shift_t(float t, float shift);
float ct_flow_auto_shift(long tokens); /* e^mu of FluxPipeline's calculate_shift */
ct_status ct_encode_prompts(ct_textenc *te, int T, const char *const *prompts, int n, float *txt,
                            float *y, ct_err *err);

/* Euler sampling over any text conditioning: encode(ctx, prompts, n, txt, y)
 * gives (n, T, d) and (n, dp). A model with guidance_embed takes o->guidance
 * as its guidance input (FluxPipeline's guidance_scale, no CFG pass);
 * otherwise guidance > 1 is classifier-free guidance against "". */
typedef ct_status (*ct_prompt_encode_fn)(void *ctx, const char *const *prompts, int n, float *txt,
                                         float *y, ct_err *err);
ct_status ct_sample_images_with(ct_mmdit *m, ct_prompt_encode_fn encode, void *ctx, int T,
                                const ct_codec *codec, const char *const *prompts, int n,
                                uint64_t index0, const ct_sample_opts *o, ct_image *out,
                                ct_err *err);

/* Build the model config, text encoder config and geometry from a config. */
typedef struct ct_geometry {
  ct_mmdit_config mc;
  int T, codec_scale, resolution;
} ct_geometry;
ct_status ct_geometry_from_config(const ct_config *cfg, ct_geometry *g, ct_err *err);
/* The text encoder (and its tokenizer) of a config; with ckpt_dir, weights and
 * tokenizer files come from that checkpoint instead of the config's paths. */
#define CT_CKPT_TOKENIZER_VOCAB "tokenizer_vocab.json"
#define CT_CKPT_TOKENIZER_MERGES "tokenizer_merges.txt"
ct_status ct_textenc_from_config(const ct_config *cfg, int hidden, const char *ckpt_dir,
                                 ct_textenc **te, ct_err *err);

/* The data loader's view of the frozen text encoder (the text-embedding
 * cache): ct_text_fn_init fills fn with cb as its context and a tag that
 * digests the encoder's output on probe captions. */
struct ct_textcond;
typedef struct ct_text_cb {
  struct ct_textcond *tc; /* textcond.h */
  int T;
} ct_text_cb;
ct_status ct_text_fn_init(ct_text_cb *cb, int d, int dp, ct_text_encoder_fn *fn, ct_err *err);

/* Everything besides tensors that a checkpoint must restore for an exact resume. */
typedef struct ct_train_state {
  long global_step;   /* optimizer steps attempted (skipped ones included) */
  long opt_steps;     /* optimizer steps applied (bias correction count) */
  long epoch;         /* 0-based */
  long epoch_pos;     /* samples consumed in this epoch */
  long samples_seen;  /* global sample id counter (RNG index) */
  long nonfinite_run; /* consecutive skipped steps */
  long nonfinite_total;
  double last_loss;
  char digest[17];
  char optimizer[32];
} ct_train_state;

struct ct_model;
typedef struct ct_ckpt_io {
  struct ct_model *model; /* model.h: its own files, table, flat buffer */
  const float *ema;       /* NULL without EMA */
  float *ema_out;         /* for loading */
  struct ct_optim *opt;   /* NULL: a rank without an optimizer range (nothing saved or loaded) */
  /* the task's other files (text encoder, tokenizer, ...) into a checkpoint directory; may be NULL
   */
  ct_status (*extra)(void *user, const char *dir, ct_err *err);
  void *extra_user;
  const ct_config *cfg;
  /* ZeRO (docs/distributed.md): the optimizer covers [opt_offset, opt_offset +
   * numel) of the flat parameter buffer (0 without sharding). Loading reads
   * that range of a whole-model optimizer.safetensors or of every rank's
   * fragments, whichever the checkpoint has. */
  size_t opt_offset;
  /* Offloaded optimizer state: the arrays to save from / load into instead
   * of the optimizer's own (NULL otherwise). */
  float *const *opt_states;
  /* ZeRO-3 loading: the model's weights (and the EMA, into ema_out) are read
   * only for [w_lo, w_hi) of the flat buffer, into w_shard. NULL otherwise. */
  float *w_shard;
  size_t w_lo, w_hi;
  /* The data sampler's position (sampler_state.json): saved from
   * sampler_json; a load stores a malloc'd copy in *sampler_out (NULL when
   * the checkpoint predates it). */
  const char *sampler_json;
  char **sampler_out;
  /* Saving: the EMA and the optimizer's own state arrays are read through
   * this (a compute backend's copy_out, chunk by chunk) instead of as host
   * memory; NULL: host memory. */
  void (*read)(void *host_dst, const void *src, size_t bytes);
} ct_ckpt_io;

#define CT_CKPT_ZERO_DIR "zero"
/* Write output_dir/checkpoint-<step> atomically (temporary directory, fsync,
 * rename, .guard last), then rotate to keep `limit` (0 = all). One process. */
ct_status ct_checkpoint_save(const char *output_dir, const ct_ckpt_io *io, const ct_train_state *s,
                             long limit, char *path, size_t n, ct_err *err);
ct_status ct_checkpoint_load(const char *dir, const ct_ckpt_io *io, ct_train_state *s, ct_err *err);
/* The same in steps, for ranks that each write a part (sharded optimizers):
 * rank 0 prepares checkpoint-<step>-tmp (with the zero/ directory) and tmp
 * gets its path; after a barrier every rank writes its fragments and rank 0
 * the rest (write_main with fragments = 1: no optimizer.safetensors); once all
 * ranks' files are durable (a collective), rank 0 commits: fsync, rename,
 * .guard, rotation. */
ct_status ct_checkpoint_prepare(const char *out, long step, char *tmp, size_t n, ct_err *err);
ct_status ct_checkpoint_write_fragments(const char *tmp, const ct_ckpt_io *io,
                                        const ct_train_state *s, int rank, int world, ct_err *err);
ct_status ct_checkpoint_write_main(const char *tmp, const ct_ckpt_io *io, const ct_train_state *s,
                                   int fragments, ct_err *err);
ct_status ct_checkpoint_commit(const char *out, const char *tmp, long step, long limit, char *path,
                               size_t pn, ct_err *err);
/* Remove leftovers of interrupted writes (checkpoint-*-tmp). */
void ct_checkpoint_clean_tmp(const char *output_dir);
/* "checkpoint-<digits>" exactly: the step, else -1. */
long ct_checkpoint_step(const char *name);
/* What a checkpoint's .guard holds once it is complete (local and in a bucket). */
#define CT_CKPT_GUARD "complete"

/* setup.c helpers shared by the tasks */
struct ct_sched;
ct_status ct_train_build_sched(const ct_config *cfg, long total, struct ct_sched *s, ct_err *err);
double ct_train_sumsq(const float *g, size_t n); /* deterministic, in double */
/* The optimizer hyperparameters of a config (adam_*, optimizer_momentum, muon_*). */
#include "ctuner/optim.h"
void ct_train_optim_hp(const ct_config *cfg, ct_optim_kind kind, ct_optim_hp *hp);
/* metrics.jsonl opened for appending, keeping the lines of steps <= upto. */
FILE *ct_train_open_metrics(const char *out, long upto);

#endif

/* The model interface the trainer works through (docs/architecture.md): a
 * trainable model is one flat float32 buffer of parameters described by a
 * table (name, shape, offset), with a gradient buffer of the same layout.
 * A model that also cuts its buffer into segments and calls enter/leave
 * hooks around each in its forward and backward supports ZeRO-2/3 and bf16
 * storage (zero.c); one that does not still gets plain data parallel,
 * ZeRO-1, 1-bit optimizers, offloaded optimizer state, EMA and checkpoints.
 *
 * Adding a model family: a model_<family>.c filling ct_model_ops, and a
 * task (task_<family>.c) with its objective. The model's own code stays in
 * its module (src/model, src/vae); the adapter translates. */
#ifndef CT_TRAIN_MODEL_H
#define CT_TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/safetensors.h"
#include "ctuner/status.h"

typedef struct ct_model_param {
  char name[112];
  int ndim;
  int64_t shape[4];
  size_t offset, numel; /* in floats, within the flat buffer */
} ct_model_param;

/* Segment hooks (the MMDiT's ct_mmdit_hooks, for any model): before segment s
 * runs in the forward (backward = 0) or the backward (1) enter may supply its
 * parameters (*w) and gradient storage (*g); leave follows it. */
typedef struct ct_model_hooks {
  void *user;
  ct_status (*enter)(void *user, int s, int backward, float **w, float **g, ct_err *err);
  ct_status (*leave)(void *user, int s, int backward, ct_err *err);
  /* Frozen storage (ops.frozen_segment; NULL: the model's own): before
   * frozen segment s runs, forward or backward, supply its bytes (*w, valid
   * until the next call); next: the frozen segment the model runs after it
   * (-1: none known), for prefetching. */
  ct_status (*enter_frozen)(void *user, int s, int next, void **w, ct_err *err);
} ct_model_hooks;

typedef struct ct_model ct_model;
struct ct_backend_ops;
/* Every operation takes the model; adapters reach their object as m->impl. */
typedef struct ct_model_ops {
  const char *family;
  float *(*params)(ct_model *m); /* NULL when the storage comes through hooks */
  float *(*grads)(ct_model *m);  /* NULL without gradients */
  /* Segments and hooks; NULL when the model has none (no ZeRO-2/3, no bf16). */
  int (*nsegments)(const ct_model *m);
  void (*segment)(const ct_model *m, int s, size_t *off, size_t *numel);
  void (*set_hooks)(ct_model *m, const ct_model_hooks *h);
  void (*use_params)(ct_model *m, float *w);
  void (*use_grads)(ct_model *m, float *g);
  /* The initial values of floats [lo, hi) into out (a shard without own storage). */
  void (*init_range)(const ct_model *m, uint64_t seed, size_t lo, size_t hi, float *out);
  /* Weights file of the checkpoint directory dir: floats [lo, hi) into out,
   * or (out NULL) all of them into the model's own buffer. */
  ct_status (*load)(ct_model *m, const char *dir, size_t lo, size_t hi, float *out, ct_err *err);
  /* The model's own files into the checkpoint directory dir (its layout). */
  ct_status (*save)(const ct_model *m, const char *dir, ct_err *err);
  void (*free)(void *impl);
  /* Frozen weights that take no gradient (LoRA's base), optional: one storage
   * buffer of bytes in any dtype, cut into segments in execution order (the
   * forward runs 0, 1, ..., the backward down from the last), segment s at
   * bytes [off, off + n); ZeRO-3 shards it by byte ranges and supplies each
   * segment through hooks.enter_frozen. use_frozen: the whole storage at w
   * (borrowed), or NULL for none (hooks must supply every segment). */
  int (*frozen_nsegments)(const ct_model *m);
  void (*frozen_segment)(const ct_model *m, int s, size_t *off, size_t *nbytes);
  void (*use_frozen)(ct_model *m, void *w);
  /* Compute residency (docs/training.md, "Compute backends and residency"),
   * optional (NULL: the model stays on the CPU backend). set_backend moves
   * the model's own buffers (and its frozen storage) onto be, whose ops it
   * computes with from then on. swap_params puts w (host memory) in place of
   * the parameter pointer without freeing or owning anything and returns the
   * previous pointer: the model's writers (save) then read w; swapped back
   * before the model computes again. */
  ct_status (*set_backend)(ct_model *m, const struct ct_backend_ops *be, ct_err *err);
  float *(*swap_params)(ct_model *m, float *w);
} ct_model_ops;

struct ct_model {
  const ct_model_ops *ops;
  void *impl; /* ct_mmdit *, ct_vae * */
  ct_model_param *tab;
  size_t ntab, numel;
};

/* Wrap impl and tab (malloc'd), taking ownership of both, also on failure. */
ct_status ct_model_wrap(const ct_model_ops *ops, void *impl, ct_model_param *tab, size_t ntab,
                        size_t numel, ct_model **out, ct_err *err);
void ct_model_free(ct_model *m);
static inline size_t ct_model_numel(const ct_model *m) {
  return m->numel;
}
static inline float *ct_model_params(ct_model *m) {
  return m->ops->params(m);
}
static inline float *ct_model_grads(ct_model *m) {
  return m->ops->grads(m);
}
static inline int ct_model_has_segments(const ct_model *m) {
  return m->ops->nsegments != NULL;
}
const ct_model_param *ct_model_find(const ct_model *m, const char *name);

/* A flat buffer under the model's tensor names (float32 safetensors). */
ct_status ct_model_save_flat(const ct_model *m, const char *path, const float *buf, ct_err *err);
/* The same with buf read through read in chunks (a compute backend's copy_out; NULL: host). */
ct_status ct_model_save_flat_read(const ct_model *m, const char *path, const float *buf,
                                  ct_st_read_fn read, ct_err *err);
/* Floats [lo, hi) of a safetensors file with the model's tensor names into
 * out; every missing or wrongly shaped tensor is listed in one error. */
ct_status ct_model_load_flat(const ct_model *m, const char *path, size_t lo, size_t hi, float *out,
                             ct_err *err);
/* A diffusers component directory (vae/, unet/): dir made, then
 * dir/diffusion_pytorch_model.safetensors by save_weights(obj) and
 * dir/config.json from config_json(obj) (malloc'd; NULL: out of memory). */
ct_status ct_model_save_component(const char *dir, const void *obj,
                                  ct_status (*save_weights)(const void *obj, const char *path,
                                                            ct_err *err),
                                  char *(*config_json)(const void *obj), ct_err *err);

/* The adapters. */
struct ct_mmdit;
struct ct_vae;
struct ct_lora;
struct ct_unet;
ct_status ct_model_mmdit(struct ct_mmdit *m, ct_model **out, ct_err *err);
/* flux_dir 1: a FLUX.1 pipeline's transformer trained in float32, whose
 * checkpoint files are transformer/ (diffusers layout) instead of
 * model.safetensors (which is still read when present). */
ct_status ct_model_mmdit_as(struct ct_mmdit *m, int flux_dir, ct_model **out, ct_err *err);
/* The adapters l on the frozen m (both owned from here, also on failure);
 * with own parameters they are initialised (lora_init_type, seed). */
ct_status ct_model_lora(struct ct_mmdit *m, struct ct_lora *l, const char *init_type, uint64_t seed,
                        ct_model **out, ct_err *err);
ct_status ct_model_vae(struct ct_vae *v, ct_model **out, ct_err *err);
/* The VAE in diffusers' layout into dir (config.json and the weights). */
ct_status ct_model_vae_save_dir(const struct ct_vae *v, const char *dir, ct_err *err);
/* SDXL's U-net (owned from here, also on failure). */
ct_status ct_model_unet(struct ct_unet *u, ct_model **out, ct_err *err);
/* The U-net in diffusers' layout into dir (config.json and the weights). */
ct_status ct_model_unet_save_dir(const struct ct_unet *u, const char *dir, ct_err *err);
struct ct_unet_lora;
/* LoRA adapters l on the frozen U-net u (both owned from here, also on
 * failure; l made for u's config, on u's backend), initialised as
 * init_type says (peft's "default" or "gaussian"; NULL: default) from seed.
 * Its file: pytorch_lora_weights.safetensors, diffusers' names. */
ct_status ct_model_unet_lora(struct ct_unet *u, struct ct_unet_lora *l, const char *init_type,
                             uint64_t seed, ct_model **out, ct_err *err);

#endif

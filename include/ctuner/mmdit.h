/* The Flux-style MMDiT denoiser (docs/model.md): configuration,
 * presets, parameter table over one flat buffer, forward and backward.
 *
 * Parameters live in one contiguous float buffer `w`; each tensor is a view
 * (name, shape, offset) in the order PyTorch's named_parameters() gives for the
 * reference model, so every block is one contiguous range (ZeRO-3 gathers per
 * block). Gradients mirror it in `g`. Activations of a forward pass live in one
 * arena sized for the batch shape; backward reads them and ACCUMULATES into `g`
 * (callers zero `g` at the start of an optimizer step).
 */
#ifndef CTUNER_MMDIT_H
#define CTUNER_MMDIT_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/backend.h"
#include "ctuner/safetensors.h"
#include "ctuner/status.h"

typedef struct ct_mmdit_config {
  int in_channels; /* latent channels C */
  int patch;       /* 2 */
  int hidden;      /* d */
  int heads;       /* H; head_dim = d / H */
  int axes_dim[3]; /* sum = head_dim */
  int depth_double;
  int depth_single;
  int mlp_ratio; /* 4 */
  int context_in_dim;
  int vec_in_dim;
  int qkv_bias;       /* 1 */
  int guidance_embed; /* 0 */
  float theta;        /* 10000 */
} ct_mmdit_config;

/* A preset: the model config plus the bench/golden batch shape. */
typedef struct ct_mmdit_preset {
  const char *name;
  ct_mmdit_config cfg;
  int batch, lat_h, lat_w, txt_len; /* 0 for shape-only presets (flux-dev) */
} ct_mmdit_preset;

/* Presets: tiny, small, demo, bench, flux-dev. NULL if unknown. */
const ct_mmdit_preset *ct_mmdit_preset_find(const char *name);
/* Comma-separated preset names, for messages. */
const char *ct_mmdit_preset_names(void);
/* Check a config's invariants; the message names the field. */
ct_status ct_mmdit_config_validate(const ct_mmdit_config *cfg, ct_err *err);

typedef struct ct_param {
  char name[96];
  int ndim;
  int64_t shape[2];
  size_t offset, numel; /* in floats, within the flat buffer */
} ct_param;

/* Parameter table without allocating the model (flux-dev sizes, memory planning). */
ct_status ct_mmdit_param_table(const ct_mmdit_config *cfg, ct_param **out, size_t *n, size_t *numel,
                               ct_err *err);

/* One training/inference batch. All pointers are row-major float32. */
typedef struct ct_mmdit_batch {
  int B, H, W, T;        /* batch, latent height/width (even), text tokens */
  const float *x;        /* (B, C, H, W) noisy latents x_t */
  const float *t;        /* (B) timesteps in [0,1] */
  const float *txt;      /* (B, T, context_in_dim) */
  const float *y;        /* (B, vec_in_dim) */
  const float *guidance; /* (B) or NULL; used iff guidance_embed */
} ct_mmdit_batch;

typedef struct ct_mmdit ct_mmdit;

/* Allocate parameters (and gradients if flags has CT_MMDIT_GRADS; 1 works) and
 * initialise per MODEL.md (weights N(0, 0.02), biases 0, norm scales 1,
 * modulations and final linear 0). With CT_MMDIT_NO_PARAMS nothing is
 * allocated: a sharded model (ZeRO-3) whose storage comes through hooks; use
 * ct_mmdit_init_range / ct_mmdit_load_range for the shard. */
#define CT_MMDIT_GRADS 1
#define CT_MMDIT_NO_PARAMS 2
ct_status ct_mmdit_new(const ct_mmdit_config *cfg, uint64_t seed, int flags, ct_mmdit **out,
                       ct_err *err);
/* The initial values of floats [lo, hi) of the flat buffer into out[0 .. hi-lo):
 * the same numbers ct_mmdit_new gives them. */
void ct_mmdit_init_range(const ct_mmdit *m, uint64_t seed, size_t lo, size_t hi, float *out);
void ct_mmdit_free(ct_mmdit *m);

const ct_mmdit_config *ct_mmdit_cfg(const ct_mmdit *m);
size_t ct_mmdit_numel(const ct_mmdit *m);
float *ct_mmdit_params(ct_mmdit *m);
float *ct_mmdit_grads(ct_mmdit *m); /* NULL without gradients */
const ct_param *ct_mmdit_table(const ct_mmdit *m, size_t *n);
const ct_param *ct_mmdit_find(const ct_mmdit *m, const char *name);
/* Floats of the largest segment (ct_mmdit_segment) of a parameter table from
 * ct_mmdit_param_table: what ZeRO-3 gathers into a slot, without a model. */
size_t ct_mmdit_max_segment(const ct_mmdit_config *cfg, const ct_param *tab, size_t n,
                            size_t numel);
/* Bytes of the activation arena currently reserved. */
size_t ct_mmdit_activation_bytes(const ct_mmdit *m);

/* ---- a frozen base in its stored / quantised dtype (docs/lora.md) ----
 * base_model_precision as SimpleTuner spells it: "no_change" (float32),
 * "bf16", "int8-quanto" (optimum-quanto qint8 weights), "int8-torchao"
 * (torchao int8_weight_only). Which 2-D linear weights a precision stores
 * narrow: all of them for bf16; for int8 all but final_layer.linear
 * (diffusers' proj_out, which SimpleTuner's quanto call excludes), that one
 * as default_bf16 says (bf16, else float32). Biases and norm scales stay
 * float32. ct_mmdit_quant_dtype is the storage of parameter p (CT_WDT_F32:
 * kept float32); -1 for an unknown precision. */
int ct_mmdit_quant_dtype(const ct_param *p, const char *precision, int default_bf16);
/* Bytes the parameters of a table take stored that way (the plan of
 * `bench memory`): elements at their width, int8 rows' float32 scales, each
 * of the three parts 64-byte aligned, as ct_mmdit_quantize allocates. */
size_t ct_mmdit_quant_bytes(const ct_param *tab, size_t n, const char *precision, int default_bf16);
/* Converts a frozen model's own float32 parameters (loaded, on the CPU
 * backend, without gradients) to that storage — one buffer counted as
 * params — and frees the float32 buffer: ct_mmdit_params is NULL afterwards,
 * the forward and the dX backward read the weights through weight views
 * (ct_linear_fwd_w), there are no weight gradients. "no_change" does
 * nothing. Errors name the precision or the state that forbids it. */
ct_status ct_mmdit_quantize(ct_mmdit *m, const char *precision, int default_bf16, ct_err *err);
/* The same for a model made with CT_MMDIT_NO_PARAMS, its float32 values
 * read one segment at a time (floats [lo, hi) of the flat buffer into out:
 * ct_mmdit_load_range, ct_mmdit_load_diffusers_range, ct_mmdit_init_range)
 * into a scratch buffer of the largest segment (category buffers, freed):
 * the whole base is never held in float32. */
typedef ct_status (*ct_mmdit_reader)(void *user, size_t lo, size_t hi, float *out, ct_err *err);
ct_status ct_mmdit_quantize_from(ct_mmdit *m, const char *precision, int default_bf16,
                                 ct_mmdit_reader rd, void *user, ct_err *err);
/* The storage of the model's parameters in bytes (float32: 4 per element). */
size_t ct_mmdit_param_bytes(const ct_mmdit *m);

/* ---- segments and hooks (ZeRO-2/3, docs/distributed.md) ----
 * The flat buffer is cut into contiguous segments in the order of the table:
 * 0 = the input embeddings (img_in, time_in, vector_in, guidance_in, txt_in),
 * 1..D the double blocks, D+1..D+S the single blocks, D+S+1 the final layer.
 * The forward runs them 0, 1, ..., last; the backward last, ..., 0, so the
 * gradients complete from the end of the buffer towards its start. */
int ct_mmdit_nsegments(const ct_mmdit *m);
void ct_mmdit_segment(const ct_mmdit *m, int s, size_t *off, size_t *numel);

typedef struct ct_mmdit_hooks {
  void *user;
  /* Before segment s runs in the forward (backward = 0) or the backward (1).
   * It may set *w to the segment's parameters and (backward) *g to where its
   * gradients accumulate — numel floats each, laid out as in the flat buffer —
   * or leave them NULL for the model's own buffers. They must stay valid
   * until leave. */
  ct_status (*enter)(void *user, int s, int backward, float **w, float **g, ct_err *err);
  /* After segment s: its forward is done, or (backward) its gradients are complete. */
  ct_status (*leave)(void *user, int s, int backward, ct_err *err);
} ct_mmdit_hooks;

/* ---- compute backend (include/ctuner/backend.h) ----
 * Every op of the forward and backward goes through the model's backend:
 * ct_backend_default() from ct_mmdit_new, or the one set here. Setting one
 * moves the model's own parameter and gradient buffers to it, and a base
 * stored bf16 / int8 (its bytes, the views rebased; the backend needs
 * linear_fwd_w / linear_bwd_w) (the activation arena is re-planned by the
 * next forward); buffers the caller supplies
 * (ct_mmdit_use_params/_grads, hooks, the batch, v and dv) must be that
 * backend's memory — host memory for the CPU backend. NULL: the default. On
 * failure the model stays where it was. */
ct_status ct_mmdit_set_backend(ct_mmdit *m, const ct_backend_ops *be, ct_err *err);
const ct_backend_ops *ct_mmdit_backend(const ct_mmdit *m);

/* ---- gradient checkpointing (SimpleTuner's gradient_checkpointing,
 * gradient_checkpointing_interval; docs/model.md) ----
 * every = N > 0: blocks 0, N, 2N, ... of the double list and of the single
 * list (diffusers' index % N == 0) keep only their output (the next block's
 * input) from the forward — unless that is one block of its list only, which
 * runs plain (it would save nothing); the backward recomputes such a block's activations,
 * into one block's worth of shared arena, right after entering its segment
 * (so under hooks its weights are present) and before its backward — but for
 * the last checkpointed block of each list, whose activations the shared
 * arena still holds from the forward. The same
 * kernels run on the same inputs, so the outputs, the loss and every gradient
 * are bit-identical to every = 0 (off, the default); it costs one more
 * forward of the checkpointed blocks. Changing it drops the arena (the next
 * forward re-plans it). */
void ct_mmdit_set_checkpointing(ct_mmdit *m, int every);
/* The interval set (0: off); *ndouble, *nsingle (each may be NULL): how many
 * blocks of each list are checkpointed. */
int ct_mmdit_checkpointing(const ct_mmdit *m, int *ndouble, int *nsingle);

/* Bytes of the activation arena a forward + backward of this batch shape
 * reserves (category activations), with gradient checkpointing every Nth block
 * (0: off) — the same plan ct_mmdit_forward lays out, counted without a model
 * or any allocation (memory planning, `ctuner bench memory --plan`). 0 if out
 * of memory. */
size_t ct_mmdit_activation_plan(const ct_mmdit_config *cfg, int every, int B, int H, int W, int T);

/* Installs hooks (copied), or removes them (NULL: back to the own buffers). */
void ct_mmdit_set_hooks(ct_mmdit *m, const ct_mmdit_hooks *h);
/* Replaces the parameter (gradient) storage by w (g): numel floats, borrowed,
 * or NULL for none — then hooks must supply every segment. Frees the model's
 * own buffer. */
void ct_mmdit_use_params(ct_mmdit *m, float *w);
/* w in place of the parameter pointer, nothing freed or owned, the previous
 * pointer returned: a host copy of a device-resident model's weights for its
 * writers (ct_mmdit_save, ct_mmdit_save_diffusers), swapped back before the
 * model computes again. */
float *ct_mmdit_swap_params(ct_mmdit *m, float *w);
void ct_mmdit_use_grads(ct_mmdit *m, float *g);

/* Load parameters from a Flux-layout safetensors file; tensor names are
 * prefix + parameter name (prefix "" for model files, "param." for golden files).
 * Missing, unexpected (with the prefix) or wrongly shaped tensors give ONE error
 * listing all of them. F32, F16 and BF16 are accepted. */
ct_status ct_mmdit_load(ct_mmdit *m, const char *path, const char *prefix, ct_err *err);
/* The same checks, but only floats [lo, hi) of the flat buffer are read, into
 * out[0 .. hi-lo) (a ZeRO-3 shard, or a file with the model's tensor names). */
ct_status ct_mmdit_load_range(const ct_mmdit *m, const char *path, const char *prefix, size_t lo,
                              size_t hi, float *out, ct_err *err);
/* Write parameters (Flux names) atomically. */
ct_status ct_mmdit_save(const ct_mmdit *m, const char *path, ct_err *err);

/* Forward: v (B, C, H, W). Keeps activations for ct_mmdit_backward; the batch's
 * txt and y arrays are borrowed and must stay valid until the backward. */
ct_status ct_mmdit_forward(ct_mmdit *m, const ct_mmdit_batch *in, float *v, ct_err *err);
/* FLUX.1 Kontext (docs/kontext.md): the forward with a reference latent ref
 * (B, C, RH, RW; RH, RW even), or NULL (= ct_mmdit_forward). Its 2x2 tokens
 * follow each item's image tokens with position ids (1, row, col) of their
 * own grid, as diffusers' FluxKontextPipeline; v (B, C, H, W) is the
 * prediction of the target tokens only, and the backward's dL/dv has no
 * reference part (the loss covers the target). */
ct_status ct_mmdit_forward_ref(ct_mmdit *m, const ct_mmdit_batch *in, const float *ref, int RH,
                               int RW, float *v, ct_err *err);
/* Backward of the last forward given dL/dv (B, C, H, W); accumulates into grads. */
ct_status ct_mmdit_backward(ct_mmdit *m, const float *dv, ct_err *err);

/* Floating-point operations of one forward (fwd) and one backward (bwd) for a
 * batch shape, counting GEMMs (2·M·N·K) and attention products only; the
 * backward counts dX and dW products (no dX for input embeddings) and the
 * attention's four products (not the score recompute). */
void ct_mmdit_flops(const ct_mmdit_config *cfg, int B, int H, int W, int T, double *fwd,
                    double *bwd);

/* ---- diffusers' FluxTransformer2DModel layout (src/model/flux_*.c, docs/flux.md) ----
 * diffusers packs the latent 2x2 before the model (in_channels 64 = 16 x 2 x 2,
 * patch_size 1); ctuner packs inside (in_channels 16, patch 2): the same weights. */

/* A diffusers transformer/config.json (text) into cfg, validated. `_class_name`
 * must be FluxTransformer2DModel; a field ctuner does not know, or a value it
 * cannot honour (patch_size != 1, out_channels != in_channels), is refused by
 * name. `where` names the source in messages. */
ct_status ct_flux_config_parse(const char *json, size_t len, const char *where,
                               ct_mmdit_config *cfg, ct_err *err);
ct_status ct_flux_config_read(const char *path, ct_mmdit_config *cfg, ct_err *err);
/* cfg as diffusers' config.json (malloc'd, NUL-terminated). cfg must have
 * mlp_ratio 4, qkv_bias, theta 10000 (diffusers has no fields for them). */
ct_status ct_flux_config_json(const ct_mmdit_config *cfg, char **out, ct_err *err);

/* One row of the name map: rows [bfl_row, bfl_row + rows) of ctuner's (BFL-named)
 * tensor `bfl` are rows [dif_row, dif_row + rows) of diffusers' tensor `dif`,
 * whose shape is [dif_rows, cols] (cols 0: a 1-D tensor of dif_rows). A fused
 * BFL tensor gives several rows (qkv -> to_q/to_k/to_v; linear1 -> to_q/to_k/
 * to_v/proj_mlp); final_layer.adaLN_modulation.1 gives two with its halves
 * swapped (BFL shift;scale, diffusers norm_out.linear scale;shift). */
typedef struct ct_flux_name {
  char bfl[96], dif[112];
  int64_t bfl_row, dif_row, rows, dif_rows, cols;
} ct_flux_name;
/* The map for cfg, in the order of ctuner's parameter table (malloc'd). */
ct_status ct_flux_name_map(const ct_mmdit_config *cfg, ct_flux_name **out, size_t *n, ct_err *err);

/* FluxPipeline's 2x2 packing: (B, C, H, W) <-> (B, H/2 * W/2, 4C), tokens
 * row-major, features (c, dy, dx) — diffusers' hidden_states layout. */
void ct_flux_pack(int B, int C, int H, int W, const float *x, float *out);
void ct_flux_unpack(int B, int C, int H, int W, const float *in, float *x);

/* Load a diffusers transformer directory (config.json + diffusion_pytorch_model
 * .safetensors, or shards listed by diffusion_pytorch_model.safetensors.index.json,
 * every shard inside the directory) into m, whose config must equal the
 * directory's. F32/F16/BF16. Missing, wrongly shaped and unexpected tensors:
 * ONE error naming file and tensor. */
ct_status ct_mmdit_load_diffusers(ct_mmdit *m, const char *dir, ct_err *err);
/* The same checks, but only floats [lo, hi) of the flat buffer are read, into
 * out[0 .. hi-lo) (a ZeRO-3 shard); the model may have no parameters. */
ct_status ct_mmdit_load_diffusers_range(const ct_mmdit *m, const char *dir, size_t lo, size_t hi,
                                        float *out, ct_err *err);
/* Only the checks (config.json, index, every tensor's name, shape and dtype by
 * the file headers): ONE error naming file and tensor, nothing read. */
ct_status ct_flux_check_diffusers(const ct_mmdit_config *cfg, const char *dir, ct_err *err);
/* Read dir/config.json, make the model (flags as ct_mmdit_new) and load it. */
ct_status ct_mmdit_open_diffusers(const char *dir, int flags, ct_mmdit **out, ct_err *err);
/* Write m in diffusers' layout into dir (which must not exist, or be empty):
 * config.json and diffusion_pytorch_model.safetensors, or shards of at most
 * max_shard_bytes (0: never shard; a tensor larger than the limit gets a shard
 * of its own) named diffusion_pytorch_model-0000i-of-0000N.safetensors with
 * the index, as diffusers' save_pretrained. Tensors stored as dtype (F32, F16,
 * BF16). Atomic: written into dir.tmp.<pid>, fsynced, renamed to dir. */
ct_status ct_mmdit_save_diffusers(const ct_mmdit *m, const char *dir, size_t max_shard_bytes,
                                  ct_dtype dtype, ct_err *err);
/* A BFL single file (flux1-dev.safetensors names, optional "model.diffusion_model."
 * prefix, written to *prefix) described as a config: sizes and depths from the
 * tensor shapes, heads from the q/k norm size; axes (the RoPE split, which no
 * shape shows) from `axes` or, if NULL, FLUX.1's 16,56,56 when head_dim is 128. */
ct_status ct_flux_bfl_config(const char *path, const int *axes, ct_mmdit_config *cfg, char *prefix,
                             size_t prefix_cap, ct_err *err);

/* ---- parity against a golden file of the PyTorch peer ---- */
typedef struct ct_mmdit_check_report {
  ct_mmdit_config cfg;
  int B, H, W, T;
  size_t nparams, numel;
  double loss, loss_ref;
  /* max |ours - ref| / max |ref| per tensor */
  double err_xt, err_v, err_loss, err_grad;
  char worst_grad[96];
} ct_mmdit_check_report;

/* Read the config (metadata lat, hidden, heads, axes, nd, ns, ctx, vec, B, hw, T),
 * weights and inputs of a golden file, run forward and backward, and fill the
 * report. Tolerances are the caller's business. */
ct_status ct_mmdit_check_golden(const char *path, ct_mmdit_check_report *r, ct_err *err);

#endif

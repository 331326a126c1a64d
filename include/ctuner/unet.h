/* The U-net of Stable Diffusion XL: diffusers' UNet2DConditionModel as the
 * SDXL pipelines configure it (docs/unet.md).
 *
 * Parameters live in one flat float32 buffer with a table of (name, shape,
 * offset) in diffusers' names (the state_dict keys), so
 * diffusion_pytorch_model.safetensors (one file or sharded with its index)
 * loads as it is. The forward records a tape; its backward gives the
 * gradients of every parameter and of the latent input (and of the text
 * states). Ops go through the U-net's compute backend (include/ctuner/backend.h),
 * and every buffer passed in or out is that backend's memory.
 */
#ifndef CTUNER_UNET_H
#define CTUNER_UNET_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/backend.h"
#include "ctuner/status.h"

#define CT_UNET_MAX_BLOCKS 6

typedef struct ct_unet_config {
  int in_channels, out_channels; /* 4, 4 */
  int nblocks;                   /* len(block_out_channels) */
  int block_out_channels[CT_UNET_MAX_BLOCKS];
  /* 1: CrossAttnDownBlock2D, 0: DownBlock2D (down_block_types, in order) */
  int down_cross[CT_UNET_MAX_BLOCKS];
  /* 1: CrossAttnUpBlock2D, 0: UpBlock2D (up_block_types, in order: deepest first) */
  int up_cross[CT_UNET_MAX_BLOCKS];
  int layers_per_block; /* 2 */
  /* transformer_layers_per_block per down block (the up blocks take them
   * reversed, the mid block the last) */
  int transformer_layers[CT_UNET_MAX_BLOCKS];
  /* Attention heads per block. diffusers' quirk: config.json's
   * attention_head_dim is the number of HEADS (num_attention_heads =
   * num_attention_heads or attention_head_dim, unet_2d_condition.py); the
   * head dimension is channels / heads (SDXL: 5, 10, 20 heads of 64). */
  int heads[CT_UNET_MAX_BLOCKS];
  int cross_attention_dim;   /* 2048 */
  int use_linear_projection; /* 1: proj_in/proj_out Linear; 0: 1x1 Conv2d */
  int norm_num_groups;       /* 32 */
  float norm_eps;            /* 1e-5 */
  int flip_sin_to_cos;       /* 1 ([cos, sin]); 0 refused */
  /* addition_embed_type "text_time" (1, SDXL) or null (0: no added conditioning) */
  int text_time;
  int addition_time_embed_dim;               /* 256 */
  int projection_class_embeddings_input_dim; /* 2816 = pooled 1280 + 6 * 256 */
  int upcast_attention;                      /* accepted; no effect in float32 */
  int sample_size;                           /* 128 (informational) */
} ct_unet_config;

/* diffusers' defaults for what config.json leaves out (UNet2DConditionModel's
 * __init__) with SDXL's block layout. */
void ct_unet_config_defaults(ct_unet_config *c);
/* SDXL 1.0 base's unet/config.json, as values. */
void ct_unet_config_sdxl(ct_unet_config *c);
/* Parses a diffusers unet/config.json; a value ctuner does not implement is
 * refused by its key (e.g. "resnet_time_scale_shift \"scale_shift\""). */
ct_status ct_unet_config_load(const char *path, ct_unet_config *c, ct_err *err);
ct_status ct_unet_config_validate(const ct_unet_config *c, ct_err *err);
/* The config as diffusers writes it (malloc'd JSON; NULL if out of memory). */
char *ct_unet_config_json(const ct_unet_config *c);
/* The pooled text width the config implies (projection input - 6 * time dim). */
int ct_unet_pooled_dim(const ct_unet_config *c);

typedef struct ct_unet_param {
  char name[112];
  int ndim;
  int64_t shape[4];
  size_t offset, numel;
} ct_unet_param;

/* The parameter count of a config without allocating it. */
ct_status ct_unet_count(const ct_unet_config *c, size_t *numel, size_t *ntensors, ct_err *err);

typedef struct ct_unet ct_unet;

/* Allocates the parameters on the default backend, initialised from seed
 * (U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases, norms 1 and 0). */
ct_status ct_unet_new(const ct_unet_config *cfg, uint64_t seed, ct_unet **out, ct_err *err);
void ct_unet_free(ct_unet *u);
const ct_unet_config *ct_unet_cfg(const ct_unet *u);
/* Moves the parameters and gradients to be (NULL: the default); refuses a
 * backend lacking an op the U-net needs, by the op's name. */
ct_status ct_unet_set_backend(ct_unet *u, const ct_backend_ops *be, ct_err *err);
const ct_backend_ops *ct_unet_backend(const ct_unet *u);
const ct_unet_param *ct_unet_table(const ct_unet *u, size_t *n);
float *ct_unet_params(ct_unet *u);
size_t ct_unet_numel(const ct_unet *u);
/* w (host memory, numel floats) in place of the parameter pointer, nothing
 * freed or owned, the previous pointer returned: a host copy of a
 * backend-resident U-net's weights for ct_unet_save; swapped back (with the
 * pointer returned) before the U-net computes again. */
float *ct_unet_swap_params(ct_unet *u, float *w);
/* The gradient buffer (the parameters' layout), zeroed on first use;
 * ct_unet_backward ACCUMULATES into it. NULL if out of memory. */
float *ct_unet_grads(ct_unet *u);

/* Loads diffusers' weights: a directory holding
 * diffusion_pytorch_model.safetensors or its .index.json and shards, or one
 * .safetensors file (F32/F16/BF16). Every missing, wrongly shaped and
 * unexpected tensor is listed in one error. */
ct_status ct_unet_load(ct_unet *u, const char *path, ct_err *err);
/* Writes the weights (F32) as one safetensors file, diffusers' names. */
ct_status ct_unet_save(const ct_unet *u, const char *path, ct_err *err);
/* A unet/ directory: config.json and the weights. */
ct_status ct_unet_from_pretrained(const char *dir, ct_unet **out, ct_err *err);

/* One forward's inputs, all in the U-net backend's memory. */
typedef struct ct_unet_inputs {
  int B, H, W;            /* latents (B, in_channels, H, W); H, W multiples of 2^(nblocks-1) */
  const float *sample;    /* (B, in_channels, H, W) */
  const float *timesteps; /* (B), the scheduler's timesteps (0..999) */
  int Lk;                 /* text tokens (77) */
  const float *encoder_hidden_states; /* (B, Lk, cross_attention_dim) */
  const float *text_embeds;           /* (B, pooled dim): added conditioning (text_time) */
  const float *time_ids;              /* (B, 6): original size, crop top-left, target size */
} ct_unet_inputs;

typedef struct ct_unet_tape ct_unet_tape;

/* out (B, out_channels, H, W). With tape non-NULL the activations are kept
 * on *tape for ct_unet_backward; with NULL they are freed on return. */
ct_status ct_unet_forward(ct_unet *u, const ct_unet_inputs *in, float *out, ct_unet_tape **tape,
                          ct_err *err);
/* dout: the loss's gradient of out. Parameter gradients accumulate into
 * ct_unet_grads; dsample (B, in_channels, H, W) and dencoder (B, Lk,
 * cross_attention_dim) are overwritten (NULL: skipped). One backward per tape. */
ct_status ct_unet_backward(ct_unet *u, ct_unet_tape *tape, const float *dout, float *dsample,
                           float *dencoder, ct_err *err);
void ct_unet_tape_free(ct_unet_tape *tape);

/* ---- memory plan (unet_plan.c) ----
 * The bytes one forward (tape kept) and its backward allocate on the
 * U-net's backend, found by running them on a backend that computes nothing
 * (no weights are allocated): what the CPU backend's accounting measures. */
typedef struct ct_unet_plan {
  size_t params_bytes;     /* the float32 parameters */
  size_t inference_peak;   /* a forward without a tape: its peak (activations, scratch) */
  size_t grads_bytes;      /* their gradients */
  size_t forward_bytes;    /* activations + scratch held when the forward returns */
  size_t activations_peak; /* CT_MEM_ACTIVATIONS at its peak (the backward's end) */
  size_t buffers_peak;     /* CT_MEM_BUFFERS (im2col scratch) at its peak */
  size_t total_peak;       /* the run's allocations (gradients too) at their peak, parameters not */
  size_t numel, ntensors;  /* the parameter table: floats (no padding) and tensors */
  size_t max_tensor;       /* floats of its largest tensor */
} ct_unet_plan;
ct_status ct_unet_plan_memory(const ct_unet_config *c, int B, int H, int W, int Lk,
                              ct_unet_plan *out, ct_err *err);

/* ---- LoRA targets (unet_lora.c) ----
 * A Linear layer of the U-net: its module name (the parameter names less
 * ".weight"/".bias"), shape, and offsets in the parameter buffer (b:
 * (size_t)-1 without a bias). */
typedef struct ct_unet_linear {
  char name[112];
  int in, out;
  size_t w, b;
} ct_unet_linear;
/* SimpleTuner's SDXL LoRA targets (DEFAULT_LORA_TARGET): every attention
 * projection, self- and cross-attention. */
#define CT_UNET_LORA_DEFAULT "to_k,to_q,to_v,to_out.0"
/* The Linear layers of c's U-net that targets (comma-separated peft
 * target_modules: a module name or a dotted suffix of one, e.g. "to_q",
 * "attn2.to_k", "proj_in", "ff.net.0.proj"; NULL or "": the default) names,
 * in parameter order, each once (*out malloc'd). A target matching nothing,
 * or a convolution or norm, is refused by name. */
ct_status ct_unet_lora_targets(const ct_unet_config *c, const char *targets, ct_unet_linear **out,
                               size_t *n, ct_err *err);

/* ---- LoRA adapters (unet_lora.c, unet_lora_io.c; docs/lora.md, "SDXL") ----
 * peft's LoRA on the targeted Linear layers: y = W x + b + (alpha / r) B (A x),
 * A [r, in], B [out, r]. All adapters live in one flat buffer (A then B per
 * adapter, in parameter order) on the U-net's backend, with a gradient
 * buffer of the same layout. No dropout (lora_dropout > 0 is refused). */
typedef struct ct_unet_lora ct_unet_lora;
typedef struct ct_unet_adapter {
  ct_unet_linear lin;  /* the adapted module (name, in, out, base offsets) */
  size_t a_off, b_off; /* floats within the adapter buffer */
} ct_unet_adapter;
/* Adapters of rank on every Linear targets names (ct_unet_lora_targets),
 * parameters zero (ct_unet_lora_init or ct_unet_lora_load fill them), on
 * the default backend. Refused by name: a rank above a module's smaller
 * side, alpha <= 0. */
ct_status ct_unet_lora_new(const ct_unet_config *c, const char *targets, int rank, double alpha,
                           ct_unet_lora **out, ct_err *err);
void ct_unet_lora_free(ct_unet_lora *l);
const ct_unet_adapter *ct_unet_lora_adapters(const ct_unet_lora *l, size_t *n);
int ct_unet_lora_rank(const ct_unet_lora *l);
double ct_unet_lora_alpha(const ct_unet_lora *l);
size_t ct_unet_lora_numel(const ct_unet_lora *l);
float *ct_unet_lora_params(ct_unet_lora *l);
/* zeroed on first use; the U-net's backward ACCUMULATES into it (NULL: out of memory) */
float *ct_unet_lora_grads(ct_unet_lora *l);
/* Moves parameters and gradients to be (NULL: the default backend). */
ct_status ct_unet_lora_set_backend(ct_unet_lora *l, const ct_backend_ops *be, ct_err *err);
/* w (host) in place of the parameter pointer, the previous one returned (ct_unet_swap_params). */
float *ct_unet_lora_swap_params(ct_unet_lora *l, float *w);
/* peft's init_lora_weights into floats [lo, hi) of out (host): "default"
 * (True: A kaiming-uniform, bound 1/sqrt(in); B zero) or "gaussian" (A ~
 * N(0, 1/r); B zero), as ct_lora_init_range for FLUX.1; others refused. */
ct_status ct_unet_lora_init_range(const ct_unet_lora *l, const char *init_type, uint64_t seed,
                                  size_t lo, size_t hi, float *out, ct_err *err);
/* The same into the adapters' own buffer. */
ct_status ct_unet_lora_init(ct_unet_lora *l, const char *init_type, uint64_t seed, ct_err *err);
/* pytorch_lora_weights.safetensors as StableDiffusionXLPipeline.save_lora_weights
 * writes it: unet.<module>.lora_A.weight / lora_B.weight (F32) and the
 * LoraConfig as "lora_adapter_metadata" (keys "unet."-prefixed). Atomic. */
ct_status ct_unet_lora_save(const ct_unet_lora *l, const char *path, ct_err *err);
/* A LoRA file into the adapters: diffusers' names (unet.<module>.lora_A.weight),
 * peft's own state dict's (no "unet."), or kohya's (sd-scripts:
 * lora_unet_<module, dots as _>.lora_down.weight / lora_up.weight / .alpha,
 * the module in SGM's block layout, input_blocks.N.1..., or diffusers'; its
 * alpha / r folded into B). Missing, unexpected (a text encoder's lora_te*
 * included) or wrongly shaped tensors, or a rank/alpha in its metadata other
 * than ours: one error. */
ct_status ct_unet_lora_load(ct_unet_lora *l, const char *path, ct_err *err);
/* The same checks; floats [lo, hi) of the adapter buffer into out (host). */
ct_status ct_unet_lora_load_range(const ct_unet_lora *l, const char *path, size_t lo, size_t hi,
                                  float *out, ct_err *err);
/* Attach l (the same config's; NULL: detach): the forward adds every
 * adapter, the backward accumulates its gradients into ct_unet_lora_grads.
 * l must be on the U-net's backend. */
ct_status ct_unet_set_lora(ct_unet *u, ct_unet_lora *l, ct_err *err);
/* frozen 1: the backward computes no base-weight gradient (no gradient
 * buffer is needed); the adapters' and the inputs' still flow. */
void ct_unet_set_frozen(ct_unet *u, int frozen);
/* Merges (sign 1) or unmerges (-1) the adapters into the base weights:
 * W += sign (alpha / r) B A, as peft's merge_adapter / unmerge_adapter. */
ct_status ct_unet_lora_merge(ct_unet *u, const ct_unet_lora *l, int sign, ct_err *err);

/* The ops the U-net calls (ct_backend_lacks' list). */
#define CT_UNET_OPS                                                                              \
  "conv2d_col_floats conv2d_fwd conv2d_bwd groupnorm_fwd groupnorm_bwd silu_fwd silu_bwd "       \
  "linear_fwd linear_bwd ln_mod_fwd ln_mod_bwd attention_fwd attention_bwd attention_cross_fwd " \
  "attention_cross_bwd gelu_erf_fwd gelu_erf_bwd upsample2x_fwd upsample2x_bwd nchw_to_nlc "     \
  "nlc_to_nchw copy_2d add_inplace mul_inplace zero sgemm timestep_embedding"

#endif

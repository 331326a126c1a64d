/* The VAE latent codec: diffusers' AutoencoderKL (docs/vae.md).
 *
 * Parameters live in one flat float buffer with a table of (name, shape,
 * offset) in diffusers' state_dict order and names, so the SD, SDXL and Flux
 * VAE weights load as they are. Images are (B, 3, H, W) in [-1, 1]; latents
 * (B, latent_channels, H/f, W/f) with f = 2^(len(block_out_channels) - 1).
 */
#ifndef CTUNER_VAE_H
#define CTUNER_VAE_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/backend.h"
#include "ctuner/status.h"

#define CT_VAE_MAX_BLOCKS 8

typedef struct ct_vae_config {
  int in_channels, out_channels; /* 3, 3 */
  int nblocks;                   /* len(block_out_channels) */
  int block_out_channels[CT_VAE_MAX_BLOCKS];
  int layers_per_block;                    /* 2 */
  int latent_channels;                     /* 4 (SD), 16 (Flux) */
  int norm_num_groups;                     /* 32 */
  int use_quant_conv, use_post_quant_conv; /* 1, 1 */
  int mid_block_add_attention;             /* 1 */
  float scaling_factor, shift_factor;      /* 0.18215, 0 (SD) */
} ct_vae_config;

/* diffusers' defaults for the fields config.json leaves out. */
void ct_vae_config_defaults(ct_vae_config *c);
/* Parse a diffusers config.json (path); errors name the file and the key. */
ct_status ct_vae_config_load(const char *path, ct_vae_config *c, ct_err *err);
ct_status ct_vae_config_validate(const ct_vae_config *c, ct_err *err);
/* The config as diffusers writes it (malloc'd JSON). */
char *ct_vae_config_json(const ct_vae_config *c);
/* Spatial downsampling factor f. */
int ct_vae_factor(const ct_vae_config *c);

typedef struct ct_vae_param {
  char name[112];
  int ndim;
  int64_t shape[4];
  size_t offset, numel;
} ct_vae_param;

typedef struct ct_vae ct_vae;

/* Allocates the parameters, initialised as PyTorch does (conv and linear
 * weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)), GroupNorm 1 and 0)
 * from seed. */
ct_status ct_vae_new(const ct_vae_config *cfg, uint64_t seed, ct_vae **out, ct_err *err);
void ct_vae_free(ct_vae *v);
const ct_vae_config *ct_vae_cfg(const ct_vae *v);
/* The compute backend of every encode, decode and backward
 * (include/ctuner/backend.h): ct_backend_default() from ct_vae_new, or the
 * one set here, which moves the parameters and gradients to it (the
 * workspace is reallocated by the next call). The images, latents and their
 * gradients given to the calls below are then that backend's memory (host
 * memory for the CPU backend); a tape is freed on the backend it was made on,
 * and its backward needs the VAE still there. NULL: the default. On failure the VAE stays where it
 * was. */
ct_status ct_vae_set_backend(ct_vae *v, const ct_backend_ops *be, ct_err *err);
const ct_backend_ops *ct_vae_backend(const ct_vae *v);
/* Sets scaling_factor and shift_factor (measured latent statistics). */
void ct_vae_set_scaling(ct_vae *v, float scaling_factor, float shift_factor);
const ct_vae_param *ct_vae_table(const ct_vae *v, size_t *n);
float *ct_vae_params(ct_vae *v);
size_t ct_vae_numel(const ct_vae *v);
/* Loads diffusers-layout safetensors (F32/F16/BF16). Every missing,
 * unexpected or wrongly shaped tensor is listed in one error. */
ct_status ct_vae_load(ct_vae *v, const char *path, ct_err *err);
/* Writes the weights (F32) atomically. */
ct_status ct_vae_save(const ct_vae *v, const char *path, ct_err *err);
/* Loads a directory holding config.json and diffusion_pytorch_model.safetensors
 * (or a .safetensors path with config.json beside it). */
ct_status ct_vae_from_pretrained(const char *path, ct_vae **out, ct_err *err);

/* Encoder: x (B, in_channels, H, W), H and W multiples of f. mean and logvar
 * (B, latent, H/f, W/f); either may be NULL. logvar is clamped to [-30, 20]. */
ct_status ct_vae_encode(ct_vae *v, int B, int H, int W, const float *x, float *mean, float *logvar,
                        ct_err *err);
/* Decoder: z (B, latent, h, w) -> x (B, out_channels, h*f, w*f). z is the
 * unscaled latent (post_quant_conv's input). */
ct_status ct_vae_decode(ct_vae *v, int B, int h, int w, const float *z, float *x, ct_err *err);

/* Tiled (diffusers' tiled_encode/tiled_decode, overlap 1/4, linear blends):
 * `tile` image pixels per tile, a multiple of 4 f; images no larger than one
 * tile (or tile 0) go through untiled. Memory follows the tile size. */
ct_status ct_vae_encode_tiled(ct_vae *v, int B, int H, int W, const float *x, int tile, float *mean,
                              float *logvar, ct_err *err);
ct_status ct_vae_decode_tiled(ct_vae *v, int B, int h, int w, const float *z, int tile, float *x,
                              ct_err *err);

/* ---- training: a recorded forward and its backward (vae_train.c) ---- */
typedef struct ct_vae_tape ct_vae_tape;
/* The gradient buffer (same layout as the parameters), allocated zeroed on
 * first use; backward passes ACCUMULATE into it. NULL if out of memory. */
float *ct_vae_grads(ct_vae *v);
/* As ct_vae_encode, keeping the activations on *tape for the backward. */
ct_status ct_vae_encode_fwd(ct_vae *v, int B, int H, int W, const float *x, float *mean,
                            float *logvar, ct_vae_tape **tape, ct_err *err);
/* dmean, dlogvar: gradients of the loss (NULL: zero); dx: of the input (NULL: skipped). */
ct_status ct_vae_encode_bwd(ct_vae *v, ct_vae_tape *tape, const float *dmean, const float *dlogvar,
                            float *dx, ct_err *err);
ct_status ct_vae_decode_fwd(ct_vae *v, int B, int h, int w, const float *z, float *x,
                            ct_vae_tape **tape, ct_err *err);
ct_status ct_vae_decode_bwd(ct_vae *v, ct_vae_tape *tape, const float *dout, float *dz,
                            ct_err *err);
void ct_vae_tape_free(ct_vae_tape *tape);

#endif

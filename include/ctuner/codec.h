/* Latent codecs. `pixel`: space-to-depth by s in {1,2,4} of RGB scaled to
 * [-1, 1]; decoding is its exact inverse (round-trips every uint8 image).
 *
 * Channel c·s² + py·s + px of latent (h/s, w/s) holds colour c of pixel
 * (y·s + py, x·s + px), the same order as the MMDiT's patchify (c ph pw).
 */
#ifndef CTUNER_CODEC_H
#define CTUNER_CODEC_H

#include <stdint.h>

#include "ctuner/status.h"

/* Latent channels of the pixel codec: 3 s² (0 if s is not 1, 2 or 4). */
int ct_pixel_channels(int s);
/* rgb (h, w, 3) uint8 interleaved -> lat (3 s², h/s, w/s); w, h multiples of s. */
ct_status ct_pixel_encode(const uint8_t *rgb, int w, int h, int s, float *lat, ct_err *err);
/* lat -> rgb, clamped to [-1, 1] and rounded to the nearest uint8; a NaN gives
 * CT_ERR_NUMERIC. */
ct_status ct_pixel_decode(const float *lat, int w, int h, int s, uint8_t *rgb, ct_err *err);

/* A latent codec behind one interface (pixel, or a VAE: docs/vae.md). The
 * VAE's latents are stored and used scaled: (z - shift_factor) *
 * scaling_factor, z = mean + std * eps with eps from Philox by (seed, key). */
typedef struct ct_codec {
  char kind[8];         /* "pixel" or "vae" */
  int channels, factor; /* latent channels; pixels per latent */
  char tag[64];         /* cache metadata: "pixel:<s>" or "vae:<digest>" */
  int serial; /* 1: call from one thread at a time (the VAE's workspace); kernels use every core */
  void *ctx;
} ct_codec;

/* The pixel codec with scale s. */
ct_status ct_codec_pixel(int s, ct_codec *out, ct_err *err);
/* A VAE directory (config.json + diffusion_pytorch_model.safetensors);
 * tile: pixels per tile for encode/decode (0: untiled); seed: of the
 * latent sample's noise. */
ct_status ct_codec_vae(const char *dir, int tile, uint64_t seed, ct_codec *out, ct_err *err);
void ct_codec_free(ct_codec *c);
/* rgb (h, w, 3) -> lat (channels, h/factor, w/factor); key: the image's
 * noise stream (the VAE's sample). Thread-safe (a VAE serialises). */
ct_status ct_codec_encode(const ct_codec *c, const uint8_t *rgb, int w, int h, uint64_t key,
                          float *lat, ct_err *err);
/* The same with the latent distribution's mean (diffusers' retrieve_latents
 * sample_mode "argmax": FluxKontextPipeline's reference image), no noise. */
ct_status ct_codec_encode_mean(const ct_codec *c, const uint8_t *rgb, int w, int h, float *lat,
                               ct_err *err);
/* lat (channels, h/factor, w/factor) -> rgb (h, w, 3). Thread-safe. */
ct_status ct_codec_decode(const ct_codec *c, const float *lat, int w, int h, uint8_t *rgb,
                          ct_err *err);

#endif

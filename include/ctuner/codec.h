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

#endif

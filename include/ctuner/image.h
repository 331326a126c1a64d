/* Images: PNG (libpng) and JPEG (libjpeg-turbo) decode/encode, resize, crop.
 *
 * Every image in memory is 8-bit RGB, interleaved, row-major, no padding.
 * Decoding normalises everything else (grey, palette, 16-bit, alpha — alpha is
 * dropped, as Pillow's convert("RGB") does; CMYK JPEG) and rejects corrupt or
 * truncated files with a clear error naming the file, never a crash.
 */
#ifndef CTUNER_IMAGE_H
#define CTUNER_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/status.h"

typedef struct ct_image {
  int w, h;
  uint8_t *px; /* w*h*3 bytes, ct_alloc(CT_MEM_BUFFERS) */
} ct_image;

/* Limits against decompression bombs: each side <= 32768, w*h <= 2^28. */
ct_status ct_image_alloc(int w, int h, ct_image *out, ct_err *err);
void ct_image_free(ct_image *img);

/* Format by signature, not extension. */
ct_status ct_image_load(const char *path, ct_image *out, ct_err *err);
ct_status ct_image_decode(const void *data, size_t n, ct_image *out, ct_err *err);
/* As ct_image_decode with a tighter pixel budget (w*h <= max_pixels), for
 * callers that know their images are small (fuzzing, thumbnails). */
ct_status ct_image_decode_limit(const void *data, size_t n, long max_pixels, ct_image *out,
                                ct_err *err);
/* Size without decoding pixels (for bucketing and metadata caches). */
ct_status ct_image_probe(const char *path, int *w, int *h, ct_err *err);

/* Written atomically (temporary file, fsync, rename). */
ct_status ct_image_save_png(const char *path, const ct_image *img, ct_err *err);
ct_status ct_image_save_jpeg(const char *path, const ct_image *img, int quality, ct_err *err);

/* Resample to w x h with a Lanczos-3 (antialiased when shrinking) filter, as
 * Pillow's Image.resize(..., LANCZOS). */
ct_status ct_image_resize(const ct_image *src, int w, int h, ct_image *dst, ct_err *err);
ct_status ct_image_crop(const ct_image *src, int x, int y, int w, int h, ct_image *dst, ct_err *err);

#endif

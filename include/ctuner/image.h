/* Images: PNG, JPEG, WebP, BMP and GIF decoding (PNG and JPEG encoding),
 * header-only probing, resize, crop.
 *
 * Every image in memory is 8-bit RGB, interleaved, row-major, no padding.
 * Decoding normalises everything else (grey, palette, 16-bit, alpha — alpha is
 * dropped, as Pillow's convert("RGB") does; CMYK JPEG; a GIF's first frame),
 * applies the EXIF orientation (as Pillow's ImageOps.exif_transpose), and
 * rejects corrupt or truncated files with a clear error naming the file, never
 * a crash.
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

/* Format by signature, not extension. The result is as displayed: EXIF
 * orientation applied, so its size is ct_image_probe's. */
ct_status ct_image_load(const char *path, ct_image *out, ct_err *err);
ct_status ct_image_decode(const void *data, size_t n, ct_image *out, ct_err *err);
/* As ct_image_decode with a tighter pixel budget (w*h <= max_pixels), for
 * callers that know their images are small (fuzzing, thumbnails). */
ct_status ct_image_decode_limit(const void *data, size_t n, long max_pixels, ct_image *out,
                                ct_err *err);
/* Displayed size (after EXIF orientation) without decoding pixels (for
 * bucketing and metadata caches); a wrapper of ct_image_probe_info. */
ct_status ct_image_probe(const char *path, int *w, int *h, ct_err *err);

typedef enum ct_image_format {
  CT_IMAGE_PNG = 1,
  CT_IMAGE_JPEG,
  CT_IMAGE_WEBP,
  CT_IMAGE_BMP,
  CT_IMAGE_GIF
} ct_image_format;

typedef struct ct_image_info {
  int w, h;               /* as displayed: after EXIF orientation (5..8 swap the sides) */
  int stored_w, stored_h; /* as stored in the file */
  int orientation;        /* EXIF 1..8; 1 if none or invalid */
  ct_image_format format;
} ct_image_info;

/* Geometry from the first n bytes of a file, reading headers only (never
 * pixels). On success every size is within the decoder limits. Bad input gives
 * CT_ERR_FORMAT / CT_ERR_UNSUPPORTED / CT_ERR_RANGE with a message. When the
 * header continues past the n bytes, the status is CT_ERR_FORMAT and *need
 * (if need is not NULL) is set to the byte count that would let parsing go on
 * (> n; a caller may have to call again with that many, e.g. for a JPEG whose
 * APPn segments push SOF further); otherwise *need is 0. */
ct_status ct_image_probe_mem(const void *data, size_t n, ct_image_info *out, size_t *need,
                             ct_err *err);
/* As ct_image_probe_mem on a file: one pread of up to 64 KiB, and seeks past
 * large segments (JPEG APPn, WebP chunks) rather than reading them. */
ct_status ct_image_probe_info(const char *path, ct_image_info *out, ct_err *err);

/* Written atomically (temporary file, fsync, rename). */
ct_status ct_image_save_png(const char *path, const ct_image *img, ct_err *err);
ct_status ct_image_save_jpeg(const char *path, const ct_image *img, int quality, ct_err *err);

/* Resample to w x h with a Lanczos-3 (antialiased when shrinking) filter, as
 * Pillow's Image.resize(..., LANCZOS). */
ct_status ct_image_resize(const ct_image *src, int w, int h, ct_image *dst, ct_err *err);
ct_status ct_image_crop(const ct_image *src, int x, int y, int w, int h, ct_image *dst,
                        ct_err *err);

#endif

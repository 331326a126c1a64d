/* image_int.h: helpers shared by the image module's .c files (not public API). */
#ifndef CTUNER_IMAGE_INT_H
#define CTUNER_IMAGE_INT_H

#include <stdint.h>
#include <stdio.h>

#include "ctuner/image.h"

#define CT_IMAGE_MAX_SIDE 32768
#define CT_IMAGE_MAX_PIXELS (1L << 28)
/* Largest file ct_image_load reads into memory. */
#define CT_IMAGE_MAX_FILE ((size_t)1 << 30)

/* CT_OK if w x h is within the limits (and max_pixels); else an error naming the size. */
ct_status ct_image_check_dims(long w, long h, long max_pixels, const char *fmt, ct_err *err);

ct_status ct_png_decode(const uint8_t *data, size_t n, long max_pixels, ct_image *out, ct_err *err);
ct_status ct_png_probe(FILE *fp, int *w, int *h, ct_err *err);
ct_status ct_png_write(FILE *fp, const ct_image *img, ct_err *err);

ct_status ct_jpeg_decode(const uint8_t *data, size_t n, long max_pixels, ct_image *out,
                         ct_err *err);
ct_status ct_jpeg_probe(FILE *fp, int *w, int *h, ct_err *err);
ct_status ct_jpeg_write(FILE *fp, const ct_image *img, int quality, ct_err *err);

#endif

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

/* Format by signature: a ct_image_format, 0 if none matches, -1 if the n bytes
 * are a prefix of some signature (too few to tell). */
int ct_image_sniff(const uint8_t *p, size_t n);
const char *ct_image_format_name(int fmt);

/* Replaces *img by its EXIF-oriented version (orientation 1..8; 1 is a no-op). */
ct_status ct_image_orient(ct_image *img, int orientation, ct_err *err);

ct_status ct_png_decode(const uint8_t *data, size_t n, long max_pixels, ct_image *out, ct_err *err);
ct_status ct_png_write(FILE *fp, const ct_image *img, ct_err *err);

ct_status ct_jpeg_decode(const uint8_t *data, size_t n, long max_pixels, ct_image *out,
                         ct_err *err);
ct_status ct_jpeg_write(FILE *fp, const ct_image *img, int quality, ct_err *err);

ct_status ct_webp_decode(const uint8_t *data, size_t n, long max_pixels, ct_image *out,
                         ct_err *err);
ct_status ct_gif_decode(const uint8_t *data, size_t n, long max_pixels, ct_image *out, ct_err *err);

/* BMP geometry from the file header and the first 20 bytes of the info header
 * (the first 26 bytes for a 12-byte core header); refuses what ct_bmp_decode
 * cannot decode (RLE, other compressions, bit depths). */
typedef struct ct_bmp_header {
  int w, h;             /* h > 0 */
  int topdown;          /* the stored height was negative */
  int bpp;              /* 1, 4, 8, 16, 24, 32 */
  uint32_t hsize;       /* info header size */
  uint32_t offbits;     /* pixel data offset from the file header */
  uint32_t compression; /* 0 (BI_RGB) or 3 (BI_BITFIELDS) */
} ct_bmp_header;
ct_status ct_bmp_parse_header(const uint8_t *p, size_t n, ct_bmp_header *h, ct_err *err);
ct_status ct_bmp_decode(const uint8_t *data, size_t n, long max_pixels, ct_image *out, ct_err *err);

#endif

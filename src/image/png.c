/* png.c: PNG decoding, probing and encoding with libpng.
 *
 * Every colour type and bit depth becomes 8-bit RGB the way Pillow's
 * convert("RGB") sees it: palette expanded, grey replicated, 16-bit channels
 * reduced to their high byte (Pillow's RGB;16B), alpha and tRNS dropped, not
 * composited; Adam7 interlacing handled by libpng. (One deliberate difference:
 * Pillow clips 16-bit grey to 255 via its "I" mode; we take the high byte.)
 *
 * libpng reports errors by longjmp; every call that may fail runs after a
 * setjmp whose handler frees what was allocated. All state that lives across
 * the setjmp is in a struct whose address is taken, so nothing is clobbered.
 * Before allocating pixels the header is checked against the size limits and
 * against deflate's largest possible ratio (1032:1), so a tiny file cannot make
 * us allocate gigabytes for an image whose data is not there.
 */
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/log.h"
#include "image/image_int.h"

typedef struct {
  const uint8_t *p;
  size_t n, off;
  char msg[256];
  uint8_t *px;     /* output pixels */
  png_bytep *rows; /* row pointers */
} pngdec;

static void on_error(png_structp png, png_const_charp msg) {
  pngdec *d = png_get_error_ptr(png);
  if (d) snprintf(d->msg, sizeof d->msg, "%s", msg);
  png_longjmp(png, 1);
}

static void on_warning(png_structp png, png_const_charp msg) {
  (void)png;
  CT_DEBUG("libpng warning: %s", msg);
}

static void read_mem(png_structp png, png_bytep out, size_t len) {
  pngdec *d = png_get_io_ptr(png);
  if (len > d->n - d->off) png_error(png, "unexpected end of data (truncated PNG)");
  memcpy(out, d->p + d->off, len);
  d->off += len;
}

ct_status ct_png_decode(const uint8_t *data, size_t n, long max_pixels, ct_image *out,
                        ct_err *err) {
  volatile ct_status st = CT_OK;
  pngdec d = {.p = data, .n = n};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &d, on_error, on_warning);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  if (!png || !info) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory creating the PNG decoder");
    goto out;
  }
  if (setjmp(png_jmpbuf(png))) {
    st = ct_errf(err, CT_ERR_FORMAT, "corrupt or truncated PNG: %s", d.msg);
    goto out;
  }
  png_set_read_fn(png, &d, read_mem);
  /* Our own limits are checked below with a clearer message. */
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
  png_read_info(png, info);
  png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  int depth = png_get_bit_depth(png, info), ctype = png_get_color_type(png, info);
  int chans = png_get_channels(png, info);
  if ((st = ct_image_check_dims((long)w, (long)h, max_pixels, "PNG", err))) goto out;
  /* Deflate cannot expand more than 1032:1: a file shorter than that bound
   * cannot hold the pixels it claims. */
  double raw = (double)h * (1.0 + ((double)w * chans * depth + 7) / 8);
  if (raw / 1032.0 > (double)n + 64) {
    st = ct_errf(err, CT_ERR_FORMAT,
                 "truncated PNG: a %ux%u image needs at least %.0f bytes of compressed data, the "
                 "file has %zu",
                 (unsigned)w, (unsigned)h, raw / 1032.0, n);
    goto out;
  }
  if (depth == 16) png_set_strip_16(png);
  if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (ctype == PNG_COLOR_TYPE_GRAY || ctype == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_strip_alpha(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_channels(png, info) != 3 || png_get_bit_depth(png, info) != 8 ||
      png_get_rowbytes(png, info) != (size_t)w * 3) {
    st = ct_errf(err, CT_ERR_UNSUPPORTED,
                 "PNG colour type %d, bit depth %d did not convert to 8-bit RGB", ctype, depth);
    goto out;
  }
  d.px = ct_alloc(CT_MEM_BUFFERS, (size_t)w * h * 3);
  d.rows = malloc(sizeof(png_bytep) * h);
  if (!d.px || !d.rows) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory for a %ux%u PNG", (unsigned)w, (unsigned)h);
    goto out;
  }
  for (png_uint_32 y = 0; y < h; y++) d.rows[y] = d.px + (size_t)y * w * 3;
  png_read_image(png, d.rows);
  png_read_end(png, NULL);
  out->w = (int)w;
  out->h = (int)h;
  out->px = d.px;
  d.px = NULL;
out:
  if (png) png_destroy_read_struct(&png, info ? &info : NULL, NULL);
  ct_free(d.px);
  free(d.rows);
  return st;
}

ct_status ct_png_write(FILE *fp, const ct_image *img, ct_err *err) {
  volatile ct_status st = CT_OK;
  pngdec d = {0};
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &d, on_error, on_warning);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  if (!png || !info) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory creating the PNG encoder");
    goto out;
  }
  if (setjmp(png_jmpbuf(png))) {
    st = ct_errf(err, CT_ERR_IO, "PNG encoder: %s", d.msg);
    goto out;
  }
  png_init_io(png, fp);
  png_set_IHDR(png, info, (png_uint_32)img->w, (png_uint_32)img->h, 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < img->h; y++) png_write_row(png, img->px + (size_t)y * img->w * 3);
  png_write_end(png, NULL);
out:
  if (png) png_destroy_write_struct(&png, info ? &info : NULL);
  return st;
}

/* jpeg.c: JPEG decoding, probing and encoding with libjpeg(-turbo).
 *
 * Decoding uses libjpeg's default settings (islow IDCT, fancy upsampling), the
 * same as Pillow, which links the same library — so pixels agree with Pillow
 * exactly. Grey is replicated to RGB; CMYK and YCCK are decoded as CMYK and
 * converted with Pillow's formula (Adobe files store inverted CMYK).
 *
 * libjpeg's default error handler calls exit(); ours formats the message and
 * longjmps back, so a corrupt file returns an error. Warnings are logged at
 * debug level and tolerated (as Pillow does), except the premature end of
 * data, which would otherwise be filled with grey: a truncated file is an
 * error. A progress monitor caps the number of scans (a progressive file with
 * thousands of tiny scans is a CPU bomb); a memory cap bounds libjpeg's own
 * buffers.
 */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* jpeglib.h needs stdio.h (FILE, size_t) first. */
#include <jerror.h>
#include <jpeglib.h>

#include "ctuner/alloc.h"
#include "ctuner/log.h"
#include "image/image_int.h"

#define MAX_SCANS 1000
#define MAX_LIBJPEG_MEMORY (1024L * 1024 * 1024)

typedef struct {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX + 64];
  struct jpeg_progress_mgr progress;
  uint8_t *px;
  uint8_t *row; /* one decoded row when conversion is needed */
} jdec;

static void on_error_exit(j_common_ptr c) {
  jdec *d = (jdec *)c->err;
  char buf[JMSG_LENGTH_MAX];
  c->err->format_message(c, buf);
  snprintf(d->msg, sizeof d->msg, "%s", buf);
  longjmp(d->jb, 1);
}

static void on_emit(j_common_ptr c, int level) {
  jdec *d = (jdec *)c->err;
  if (level >= 0) return; /* trace messages */
  char buf[JMSG_LENGTH_MAX];
  c->err->format_message(c, buf);
  if (c->err->msg_code == JWRN_JPEG_EOF) {
    snprintf(d->msg, sizeof d->msg, "%s (truncated file)", buf);
    longjmp(d->jb, 1);
  }
  if (c->err->num_warnings++ == 0) CT_DEBUG("libjpeg warning: %s", buf);
}

static void on_output(j_common_ptr c) {
  char buf[JMSG_LENGTH_MAX];
  c->err->format_message(c, buf);
  CT_DEBUG("libjpeg: %s", buf);
}

static void on_progress(j_common_ptr c) {
  if (c->is_decompressor && ((j_decompress_ptr)c)->input_scan_number > MAX_SCANS) {
    jdec *d = (jdec *)c->err;
    snprintf(d->msg, sizeof d->msg, "more than %d scans (refusing a CPU bomb)", MAX_SCANS);
    longjmp(d->jb, 1);
  }
}

static void init_errors(jdec *d) {
  jpeg_std_error(&d->pub);
  d->pub.error_exit = on_error_exit;
  d->pub.emit_message = on_emit;
  d->pub.output_message = on_output;
  d->progress.progress_monitor = on_progress;
}

/* Pillow's cmyk2rgb: r = (255-k) - (c*(255-k))/255 with its rounding MULDIV255. */
static inline uint8_t muldiv255(int a, int b) {
  int t = a * b + 128;
  return (uint8_t)(((t >> 8) + t) >> 8);
}

ct_status ct_jpeg_decode(const uint8_t *data, size_t n, long max_pixels, ct_image *out,
                         ct_err *err) {
  volatile ct_status st = CT_OK;
  struct jpeg_decompress_struct cinfo;
  jdec d;
  memset(&d, 0, sizeof d);
  memset(&cinfo, 0, sizeof cinfo);
  init_errors(&d);
  cinfo.err = &d.pub;
  if (setjmp(d.jb)) {
    st = ct_errf(err, CT_ERR_FORMAT, "corrupt or truncated JPEG: %s", d.msg);
    goto out;
  }
  jpeg_create_decompress(&cinfo);
  cinfo.progress = &d.progress;
  cinfo.mem->max_memory_to_use = MAX_LIBJPEG_MEMORY;
  jpeg_mem_src(&cinfo, data, (unsigned long)n);
  jpeg_read_header(&cinfo, TRUE);
  if ((st = ct_image_check_dims((long)cinfo.image_width, (long)cinfo.image_height, max_pixels,
                                "JPEG", err)))
    goto out;
  int cmyk = 0;
  switch (cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE:
      cinfo.out_color_space = JCS_GRAYSCALE;
      break;
    case JCS_CMYK:
    case JCS_YCCK:
      cinfo.out_color_space = JCS_CMYK;
      cmyk = 1;
      break;
    default:
      cinfo.out_color_space = JCS_RGB;
      break;
  }
  jpeg_start_decompress(&cinfo);
  int w = (int)cinfo.output_width, h = (int)cinfo.output_height;
  int nc = cinfo.output_components;
  if ((st = ct_image_check_dims(w, h, max_pixels, "JPEG", err))) goto out;
  d.px = ct_alloc(CT_MEM_BUFFERS, (size_t)w * h * 3);
  d.row = malloc((size_t)w * (size_t)nc);
  if (!d.px || !d.row) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory for a %dx%d JPEG", w, h);
    goto out;
  }
  while (cinfo.output_scanline < cinfo.output_height) {
    size_t y = cinfo.output_scanline;
    uint8_t *dst = d.px + y * (size_t)w * 3;
    JSAMPROW rp = nc == 3 ? dst : d.row;
    if (jpeg_read_scanlines(&cinfo, &rp, 1) != 1) continue;
    if (nc == 1) {
      for (int x = 0; x < w; x++) dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = d.row[x];
    } else if (cmyk) {
      for (int x = 0; x < w; x++) {
        const uint8_t *s = d.row + 4 * x;
        /* Adobe CMYK is stored inverted; Pillow reads it as "CMYK;I". */
        int c = s[0], m = s[1], yy = s[2], k = s[3];
        if (cinfo.saw_Adobe_marker) {
          c = 255 - c;
          m = 255 - m;
          yy = 255 - yy;
          k = 255 - k;
        }
        int nk = 255 - k;
        dst[3 * x] = (uint8_t)(nk - muldiv255(c, nk));
        dst[3 * x + 1] = (uint8_t)(nk - muldiv255(m, nk));
        dst[3 * x + 2] = (uint8_t)(nk - muldiv255(yy, nk));
      }
    }
  }
  jpeg_finish_decompress(&cinfo);
  out->w = w;
  out->h = h;
  out->px = d.px;
  d.px = NULL;
out:
  jpeg_destroy_decompress(&cinfo);
  ct_free(d.px);
  free(d.row);
  return st;
}

ct_status ct_jpeg_write(FILE *fp, const ct_image *img, int quality, ct_err *err) {
  volatile ct_status st = CT_OK;
  struct jpeg_compress_struct cinfo;
  jdec d;
  memset(&d, 0, sizeof d);
  memset(&cinfo, 0, sizeof cinfo);
  init_errors(&d);
  cinfo.err = &d.pub;
  if (setjmp(d.jb)) {
    st = ct_errf(err, CT_ERR_IO, "JPEG encoder: %s", d.msg);
    goto out;
  }
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, fp);
  cinfo.image_width = (JDIMENSION)img->w;
  cinfo.image_height = (JDIMENSION)img->h;
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW rp = img->px + (size_t)cinfo.next_scanline * img->w * 3;
    jpeg_write_scanlines(&cinfo, &rp, 1);
  }
  jpeg_finish_compress(&cinfo);
out:
  jpeg_destroy_compress(&cinfo);
  return st;
}

/* image.c: the image module's front door — allocation, format dispatch by
 * signature, loading files, EXIF orientation after decoding, atomic saving,
 * and cropping.
 *
 * Decoders live in png.c (libpng), jpeg.c (libjpeg-turbo), webp.c (libwebp),
 * gif.c (giflib) and bmp.c (our own); header-only probing and the EXIF
 * orientation reader in probe.c, the transposition in orient.c, the resampler
 * in resize.c. Files are read whole into memory (bounded by CT_IMAGE_MAX_FILE)
 * and decoded from there, so the decoders never see a FILE that could block or
 * change under them. Every decode first probes the header (cheap) for the
 * orientation, so a decoded image is what Pillow's exif_transpose(img)
 * .convert("RGB") gives and its size is what ct_image_probe reports. Saving
 * writes a temporary file beside the target, fsyncs it and renames it over the
 * target; a reader never sees a half-written image.
 * Not here: colour management (ICC profiles and gamma are ignored, as Pillow's
 * convert("RGB") does), formats other than PNG, JPEG, WebP, BMP and GIF.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/alloc.h"
#include "ctuner/log.h"
#include "image/image_int.h"

ct_status ct_image_check_dims(long w, long h, long max_pixels, const char *fmt, ct_err *err) {
  if (w <= 0 || h <= 0)
    return ct_errf(err, CT_ERR_FORMAT, "%s size %ldx%ld is empty or negative", fmt, w, h);
  if (w > CT_IMAGE_MAX_SIDE || h > CT_IMAGE_MAX_SIDE)
    return ct_errf(err, CT_ERR_RANGE,
                   "%s header claims %ldx%ld pixels; a side may be at most %d (refusing a "
                   "possible decompression bomb)",
                   fmt, w, h, CT_IMAGE_MAX_SIDE);
  if (max_pixels > CT_IMAGE_MAX_PIXELS || max_pixels <= 0) max_pixels = CT_IMAGE_MAX_PIXELS;
  if ((long long)w * h > max_pixels)
    return ct_errf(err, CT_ERR_RANGE,
                   "%s header claims %ldx%ld = %lld pixels; the limit is %ld (refusing a "
                   "possible decompression bomb)",
                   fmt, w, h, (long long)w * h, max_pixels);
  return CT_OK;
}

ct_status ct_image_alloc(int w, int h, ct_image *out, ct_err *err) {
  ct_status st;
  if (!out) return ct_errf(err, CT_ERR_INVALID, "ct_image_alloc: NULL output");
  out->w = out->h = 0;
  out->px = NULL;
  if ((st = ct_image_check_dims(w, h, CT_IMAGE_MAX_PIXELS, "image", err))) return st;
  size_t n = (size_t)w * (size_t)h * 3;
  out->px = ct_alloc(CT_MEM_BUFFERS, n);
  if (!out->px) return ct_errf(err, CT_ERR_NOMEM, "out of memory for a %dx%d image", w, h);
  out->w = w;
  out->h = h;
  return CT_OK;
}

void ct_image_free(ct_image *img) {
  if (!img) return;
  ct_free(img->px);
  img->px = NULL;
  img->w = img->h = 0;
}

ct_status ct_image_decode_limit(const void *data, size_t n, long max_pixels, ct_image *out,
                                ct_err *err) {
  const uint8_t *p = data;
  ct_status st = CT_OK;
  if (!out) return ct_errf(err, CT_ERR_INVALID, "ct_image_decode: NULL output");
  out->w = out->h = 0;
  out->px = NULL;
  if (!p && n) return ct_errf(err, CT_ERR_INVALID, "ct_image_decode: NULL data");
  if (n == 0) return ct_errf(err, CT_ERR_FORMAT, "empty file (0 bytes), not an image");
  int fmt = ct_image_sniff(p, n);
  if (fmt <= 0)
    return ct_errf(err, fmt < 0 ? CT_ERR_FORMAT : CT_ERR_UNSUPPORTED,
                   "not a PNG, JPEG, WebP, BMP or GIF file (%zu bytes, first bytes %02x %02x %02x "
                   "%02x)",
                   n, p[0], n > 1 ? p[1] : 0, n > 2 ? p[2] : 0, n > 3 ? p[3] : 0);
  /* The header probe gives the EXIF orientation and refuses a bomb early; if
   * it fails for another reason the decoder reports the problem in its words. */
  ct_image_info info;
  ct_err perr = {0};
  ct_status ps = ct_image_probe_mem(p, n, &info, NULL, &perr);
  if (ps == CT_ERR_RANGE) return ct_errf(err, ps, "%s", perr.msg);
  switch (fmt) {
    case CT_IMAGE_PNG:
      st = ct_png_decode(p, n, max_pixels, out, err);
      break;
    case CT_IMAGE_JPEG:
      st = ct_jpeg_decode(p, n, max_pixels, out, err);
      break;
    case CT_IMAGE_WEBP:
      st = ct_webp_decode(p, n, max_pixels, out, err);
      break;
    case CT_IMAGE_BMP:
      st = ct_bmp_decode(p, n, max_pixels, out, err);
      break;
    default:
      st = ct_gif_decode(p, n, max_pixels, out, err);
      break;
  }
  if (st || ps) return st;
  if ((st = ct_image_orient(out, info.orientation, err))) ct_image_free(out);
  return st;
}

ct_status ct_image_decode(const void *data, size_t n, ct_image *out, ct_err *err) {
  return ct_image_decode_limit(data, n, CT_IMAGE_MAX_PIXELS, out, err);
}

/* Reads the whole file (at most CT_IMAGE_MAX_FILE bytes) into a malloc'd buffer. */
static ct_status read_file(const char *path, uint8_t **buf, size_t *n, ct_err *err) {
  ct_status st = CT_OK;
  uint8_t *b = NULL;
  struct stat sb;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  *buf = NULL;
  *n = 0;
  if (fd < 0) {
    st = ct_errf(err, errno == ENOENT ? CT_ERR_NOT_FOUND : CT_ERR_IO, "cannot open: %s",
                 strerror(errno));
    goto out;
  }
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    st = ct_errf(err, CT_ERR_IO, "not a regular file");
    goto out;
  }
  if ((unsigned long long)sb.st_size > CT_IMAGE_MAX_FILE) {
    st = ct_errf(err, CT_ERR_RANGE, "file is %lld bytes; image files may be at most %zu bytes",
                 (long long)sb.st_size, CT_IMAGE_MAX_FILE);
    goto out;
  }
  size_t want = (size_t)sb.st_size, got = 0;
  b = malloc(want ? want : 1);
  if (!b) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory reading %zu bytes", want);
    goto out;
  }
  while (got < want) {
    ssize_t r = read(fd, b + got, want - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      st = ct_errf(err, CT_ERR_IO, "read error: %s", strerror(errno));
      goto out;
    }
    if (r == 0) break; /* shrank while reading: decode what is there */
    got += (size_t)r;
  }
  *buf = b;
  *n = got;
  b = NULL;
out:
  if (fd >= 0) close(fd);
  free(b);
  return st;
}

ct_status ct_image_load(const char *path, ct_image *out, ct_err *err) {
  uint8_t *buf = NULL;
  size_t n = 0;
  ct_status st;
  if (!path || !out) return ct_errf(err, CT_ERR_INVALID, "ct_image_load: NULL argument");
  out->w = out->h = 0;
  out->px = NULL;
  st = read_file(path, &buf, &n, err);
  if (!st) st = ct_image_decode(buf, n, out, err);
  if (st) ct_err_prefix(err, "%s: ", path);
  free(buf);
  return st;
}

/* ---- atomic save ---- */

static void fsync_dir_of(const char *path) {
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash) {
    snprintf(dir, sizeof dir, ".");
  } else {
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    if (n >= sizeof dir) return;
    memcpy(dir, path, n);
    dir[n] = '\0';
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS)
    CT_WARN("%s: could not fsync directory %s: %s", path, dir, strerror(errno));
  close(fd);
}

typedef enum { SAVE_PNG, SAVE_JPEG } save_fmt;

static ct_status save_atomic(const char *path, const ct_image *img, save_fmt fmt, int quality,
                             ct_err *err) {
  ct_status st = CT_OK;
  char *tmp = NULL;
  FILE *fp = NULL;
  int fd = -1;
  if (!path || !path[0] || !img || !img->px) {
    st = ct_errf(err, CT_ERR_INVALID, "ct_image_save: NULL argument or empty path");
    goto out;
  }
  if ((st = ct_image_check_dims(img->w, img->h, CT_IMAGE_MAX_PIXELS, "image", err))) goto out;
  size_t plen = strlen(path);
  tmp = malloc(plen + 16);
  if (!tmp) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    goto out;
  }
  snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
  fd = mkstemp(tmp);
  if (fd < 0) {
    st = ct_errf(err, CT_ERR_IO, "cannot create a temporary file %s: %s", tmp, strerror(errno));
    tmp[0] = '\0';
    goto out;
  }
  (void)fchmod(fd, 0644);
  fp = fdopen(fd, "wb");
  if (!fp) {
    st = ct_errf(err, CT_ERR_IO, "fdopen %s: %s", tmp, strerror(errno));
    goto out;
  }
  fd = -1;
  st = fmt == SAVE_PNG ? ct_png_write(fp, img, err) : ct_jpeg_write(fp, img, quality, err);
  if (st) goto out;
  if (fflush(fp) != 0 || ferror(fp) || fsync(fileno(fp)) != 0) {
    st = ct_errf(err, CT_ERR_IO, "writing %s: %s", tmp, strerror(errno));
    goto out;
  }
  int rc = fclose(fp);
  fp = NULL;
  if (rc != 0) {
    st = ct_errf(err, CT_ERR_IO, "closing %s: %s", tmp, strerror(errno));
    goto out;
  }
  if (rename(tmp, path) != 0) {
    st = ct_errf(err, CT_ERR_IO, "cannot rename %s over it: %s", tmp, strerror(errno));
    goto out;
  }
  tmp[0] = '\0';
  fsync_dir_of(path);
out:
  if (fp) fclose(fp);
  if (fd >= 0) close(fd);
  if (tmp && tmp[0]) unlink(tmp);
  free(tmp);
  if (st && path) ct_err_prefix(err, "%s: ", path);
  return st;
}

ct_status ct_image_save_png(const char *path, const ct_image *img, ct_err *err) {
  return save_atomic(path, img, SAVE_PNG, 0, err);
}

ct_status ct_image_save_jpeg(const char *path, const ct_image *img, int quality, ct_err *err) {
  if (quality < 1 || quality > 100)
    return ct_errf(err, CT_ERR_INVALID, "%s: JPEG quality %d is outside 1..100", path ? path : "",
                   quality);
  return save_atomic(path, img, SAVE_JPEG, quality, err);
}

ct_status ct_image_crop(const ct_image *src, int x, int y, int w, int h, ct_image *dst,
                        ct_err *err) {
  ct_status st;
  if (!src || !src->px || !dst) return ct_errf(err, CT_ERR_INVALID, "ct_image_crop: NULL argument");
  if (x < 0 || y < 0 || w <= 0 || h <= 0 || x > src->w - w || y > src->h - h)
    return ct_errf(err, CT_ERR_RANGE, "crop box %dx%d at (%d, %d) is not inside the %dx%d image", w,
                   h, x, y, src->w, src->h);
  if ((st = ct_image_alloc(w, h, dst, err))) return st;
  for (int r = 0; r < h; r++)
    memcpy(dst->px + (size_t)r * w * 3, src->px + ((size_t)(y + r) * src->w + x) * 3,
           (size_t)w * 3);
  return CT_OK;
}

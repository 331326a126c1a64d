/* webp.c: WebP decoding with libwebp — lossy (VP8), lossless (VP8L), extended
 * (VP8X, with alpha) and the first frame of an animation.
 *
 * Pillow 9.4 reads every WebP through libwebp's WebPAnimDecoder in RGBA mode
 * and convert("RGB") then drops alpha. For a still image that is the plain
 * decode (no blending), so we ask libwebp for RGB directly: the colour channels
 * are the same numbers, alpha is never materialised, and the decode goes into
 * our buffer (WebPDecodeRGBInto) with no copy. For an animation the first
 * frame is a key frame: WebPAnimDecoder decodes it onto a canvas cleared to
 * transparent black, so pixels outside the frame rectangle are (0, 0, 0). We
 * find the first ANMF chunk ourselves (libwebp decodes its ALPH+VP8/VP8L
 * payload directly) rather than link libwebpdemux for it.
 * Not here: ICC profiles (ignored, as convert("RGB") does), later frames.
 */
#include <string.h>
#include <webp/decode.h>

#include "ctuner/alloc.h"
#include "image/image_int.h"

static uint32_t le24(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
}
static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static const char *vp8_status(VP8StatusCode c) {
  switch (c) {
    case VP8_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
      return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
      return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return "unsupported feature";
    case VP8_STATUS_SUSPENDED:
      return "suspended";
    case VP8_STATUS_USER_ABORT:
      return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return "not enough data (truncated file)";
    default:
      return "error";
  }
}

/* The first ANMF frame of an animated file: where it goes and its payload. */
static ct_status first_frame(const uint8_t *p, size_t n, long cw, long ch, long *fx, long *fy,
                             const uint8_t **fd, size_t *fn, ct_err *err) {
  size_t end = 8 + (size_t)le32(p + 4);
  if (end > n) end = n;
  size_t off = 12;
  while (off + 8 <= end) {
    uint32_t len = le32(p + off + 4);
    if (len > end - off - 8) break;
    if (!memcmp(p + off, "ANMF", 4)) {
      if (len < 16) return ct_errf(err, CT_ERR_FORMAT, "WebP ANMF chunk is too short");
      const uint8_t *a = p + off + 8;
      *fx = 2 * (long)le24(a);
      *fy = 2 * (long)le24(a + 3);
      long w = (long)le24(a + 6) + 1, h = (long)le24(a + 9) + 1;
      if (*fx + w > cw || *fy + h > ch)
        return ct_errf(err, CT_ERR_FORMAT,
                       "WebP animation frame %ldx%ld at (%ld, %ld) lies outside the %ldx%ld canvas",
                       w, h, *fx, *fy, cw, ch);
      *fd = a + 16;
      *fn = len - 16;
      return CT_OK;
    }
    off += 8 + (size_t)len + (len & 1);
  }
  return ct_errf(err, CT_ERR_FORMAT, "animated WebP has no complete first frame (truncated?)");
}

ct_status ct_webp_decode(const uint8_t *data, size_t n, long max_pixels, ct_image *out,
                         ct_err *err) {
  ct_status st = CT_OK;
  WebPBitstreamFeatures f;
  uint8_t *px = NULL, *frame = NULL;
  VP8StatusCode vs = WebPGetFeatures(data, n, &f);
  if (vs != VP8_STATUS_OK) {
    st = ct_errf(err, CT_ERR_FORMAT, "corrupt or truncated WebP header: %s", vp8_status(vs));
    goto out;
  }
  if ((st = ct_image_check_dims(f.width, f.height, max_pixels, "WebP", err))) goto out;
  size_t w = (size_t)f.width, h = (size_t)f.height;
  if (!f.has_animation) {
    px = ct_alloc(CT_MEM_BUFFERS, w * h * 3);
    if (!px) {
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory for a %zux%zu WebP", w, h);
      goto out;
    }
    if (!WebPDecodeRGBInto(data, n, px, w * h * 3, (int)(w * 3))) {
      st = ct_errf(err, CT_ERR_FORMAT, "corrupt or truncated WebP image data (%s)",
                   f.format == 2 ? "lossless" : "lossy");
      goto out;
    }
  } else {
    long fx = 0, fy = 0;
    const uint8_t *fd = NULL;
    size_t fn = 0;
    if ((st = first_frame(data, n, (long)w, (long)h, &fx, &fy, &fd, &fn, err))) goto out;
    int fw = 0, fh = 0;
    if (!WebPGetInfo(fd, fn, &fw, &fh) || (long)fx + fw > (long)w || (long)fy + fh > (long)h) {
      st = ct_errf(err, CT_ERR_FORMAT, "corrupt WebP animation frame header");
      goto out;
    }
    px = ct_calloc(CT_MEM_BUFFERS, w * h, 3);
    frame = ct_alloc(CT_MEM_BUFFERS, (size_t)fw * fh * 3);
    if (!px || !frame) {
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory for a %zux%zu WebP", w, h);
      goto out;
    }
    if (!WebPDecodeRGBInto(fd, fn, frame, (size_t)fw * fh * 3, fw * 3)) {
      st = ct_errf(err, CT_ERR_FORMAT, "corrupt or truncated WebP animation frame");
      goto out;
    }
    for (int y = 0; y < fh; y++)
      memcpy(px + ((size_t)(fy + y) * w + fx) * 3, frame + (size_t)y * fw * 3, (size_t)fw * 3);
  }
  out->w = (int)w;
  out->h = (int)h;
  out->px = px;
  px = NULL;
out:
  ct_free(px);
  ct_free(frame);
  return st;
}

/* bmp.c: a small Windows BMP decoder (no library) and the header parser the
 * prober shares with it.
 *
 * Handles what Pillow's BmpImagePlugin reads without RLE: BITMAPCOREHEADER
 * (12 bytes, BGR palette) and BITMAPINFOHEADER and its successors (40, 52, 56,
 * 64, 108, 124 bytes, BGRX palette); 1-, 4- and 8-bit palettes, 16-bit (5-5-5
 * by default), 24-bit BGR, 32-bit BGRX, and BI_BITFIELDS masks for 16/24/32
 * bits; bottom-up rows, or top-down when the height is negative. Alpha is
 * dropped as Pillow's convert("RGB") does.
 *
 * Pillow's quirks we follow: a palette of fewer than 2^bits entries (biClrUsed)
 * leaves the other indices grey (i, i, i), as Pillow's palette does (so do
 * entries the file ends before: Pillow reads the 2^bits entries a core header
 * implies even when they overlap the pixel data, and so do we); when the
 * pixel offset points right after the header of a palette image, the palette
 * is skipped (Pillow's fix-up for writers that forget it); a mask field of k
 * bits is scaled to 8 bits by v * 255 / (2^k - 1), truncating (Pillow's BGR;15
 * and BGR;16 unpackers).
 * Not here: RLE4/RLE8, embedded JPEG/PNG, BI_ALPHABITFIELDS, colour spaces —
 * all refused with CT_ERR_UNSUPPORTED.
 */
#include <string.h>

#include "ctuner/alloc.h"
#include "image/image_int.h"

static uint16_t le16(const uint8_t *p) {
  return (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

ct_status ct_bmp_parse_header(const uint8_t *p, size_t n, ct_bmp_header *h, ct_err *err) {
  memset(h, 0, sizeof *h);
  if (n < 18 || p[0] != 'B' || p[1] != 'M')
    return ct_errf(err, CT_ERR_FORMAT, "truncated BMP header (%zu bytes)", n);
  h->hsize = le32(p + 14);
  h->offbits = le32(p + 10);
  long w, hh;
  if (h->hsize == 12) {
    if (n < 26) return ct_errf(err, CT_ERR_FORMAT, "truncated BMP core header (%zu bytes)", n);
    w = le16(p + 18);
    hh = le16(p + 20);
    h->bpp = le16(p + 24);
    h->compression = 0;
  } else if (h->hsize == 40 || h->hsize == 52 || h->hsize == 56 || h->hsize == 64 ||
             h->hsize == 108 || h->hsize == 124) {
    if (n < 34) return ct_errf(err, CT_ERR_FORMAT, "truncated BMP info header (%zu bytes)", n);
    w = (int32_t)le32(p + 18);
    hh = (int32_t)le32(p + 22);
    h->bpp = le16(p + 28);
    h->compression = le32(p + 30);
  } else {
    return ct_errf(err, CT_ERR_UNSUPPORTED, "BMP info header of %u bytes is not supported",
                   (unsigned)h->hsize);
  }
  if (hh < 0) {
    h->topdown = 1;
    hh = -hh;
  }
  if (h->bpp != 1 && h->bpp != 4 && h->bpp != 8 && h->bpp != 16 && h->bpp != 24 && h->bpp != 32)
    return ct_errf(err, CT_ERR_UNSUPPORTED, "BMP bit depth %d is not supported", h->bpp);
  if (h->compression == 1 || h->compression == 2)
    return ct_errf(err, CT_ERR_UNSUPPORTED, "RLE-compressed BMP (RLE%d) is not supported",
                   h->compression == 1 ? 8 : 4);
  if (h->compression == 3 && h->bpp < 16)
    return ct_errf(err, CT_ERR_FORMAT, "BMP bit fields need 16, 24 or 32 bits per pixel, not %d",
                   h->bpp);
  if (h->compression != 0 && h->compression != 3)
    return ct_errf(err, CT_ERR_UNSUPPORTED, "BMP compression %u is not supported",
                   (unsigned)h->compression);
  ct_status st = ct_image_check_dims(w, hh, CT_IMAGE_MAX_PIXELS, "BMP", err);
  if (st) return st;
  h->w = (int)w;
  h->h = (int)hh;
  return CT_OK;
}

typedef struct {
  uint32_t mask;
  int shift;
  uint32_t max; /* mask >> shift */
} field;

static field make_field(uint32_t mask) {
  field f = {mask, 0, 0};
  if (!mask) return f;
  while (!((mask >> f.shift) & 1)) f.shift++;
  f.max = mask >> f.shift;
  return f;
}

static inline uint8_t get_field(const field *f, uint32_t v) {
  if (!f->max) return 0;
  uint32_t x = (v & f->mask) >> f->shift;
  return f->max == 255 ? (uint8_t)x : (uint8_t)((uint64_t)x * 255 / f->max);
}

ct_status ct_bmp_decode(const uint8_t *data, size_t n, long max_pixels, ct_image *out,
                        ct_err *err) {
  ct_status st = CT_OK;
  ct_bmp_header h;
  uint8_t pal[256][3];
  field fr, fg, fb;
  uint8_t *px = NULL;
  if ((st = ct_bmp_parse_header(data, n, &h, err))) goto out;
  if ((st = ct_image_check_dims(h.w, h.h, max_pixels, "BMP", err))) goto out;
  uint64_t offbits = h.offbits;
  if (h.bpp <= 8) {
    uint64_t colors = 0;
    if (h.hsize >= 40) {
      if (n < 50) {
        st = ct_errf(err, CT_ERR_FORMAT, "truncated BMP info header (%zu bytes)", n);
        goto out;
      }
      colors = le32(data + 46);
    }
    if (!colors) colors = 1u << h.bpp;
    if (colors > 65536) {
      st = ct_errf(err, CT_ERR_FORMAT, "BMP palette of %llu colours is invalid",
                   (unsigned long long)colors);
      goto out;
    }
    for (int i = 0; i < 256; i++) pal[i][0] = pal[i][1] = pal[i][2] = (uint8_t)i;
    unsigned esz = h.hsize == 12 ? 3 : 4, use = colors > 256 ? 256 : (unsigned)colors;
    uint64_t poff = 14ull + h.hsize;
    /* Entries past the end of the file stay grey: Pillow reads what is there. */
    if (poff >= n)
      use = 0;
    else if ((uint64_t)use * esz > n - poff)
      use = (unsigned)((n - poff) / esz);
    for (unsigned i = 0; i < use; i++) {
      const uint8_t *e = data + poff + (size_t)i * esz;
      pal[i][0] = e[2];
      pal[i][1] = e[1];
      pal[i][2] = e[0];
    }
    if (offbits == 14ull + h.hsize) offbits += 4 * colors;
  } else {
    uint32_t mr, mg, mb;
    if (h.bpp == 16) {
      mr = 0x7c00, mg = 0x03e0, mb = 0x001f;
    } else {
      mr = 0xff0000, mg = 0xff00, mb = 0xff;
    }
    if (h.compression == 3) {
      if (n < 66) {
        st = ct_errf(err, CT_ERR_FORMAT, "truncated BMP: bit field masks past the file");
        goto out;
      }
      uint32_t r = le32(data + 54), g = le32(data + 58), b = le32(data + 62);
      if (r | g | b) mr = r, mg = g, mb = b; /* all zero: Pillow reads BGRA */
    }
    fr = make_field(mr);
    fg = make_field(mg);
    fb = make_field(mb);
  }
  uint64_t stride = (((uint64_t)h.w * h.bpp + 31) >> 5) * 4;
  uint64_t last = ((uint64_t)h.w * h.bpp + 7) >> 3;
  uint64_t end = offbits + stride * (uint64_t)(h.h - 1) + last;
  if (end > n) {
    st = ct_errf(err, CT_ERR_FORMAT,
                 "truncated BMP: %dx%d pixels at %d bits need %llu bytes from offset %llu, the "
                 "file has %zu",
                 h.w, h.h, h.bpp, (unsigned long long)(end - offbits), (unsigned long long)offbits,
                 n);
    goto out;
  }
  px = ct_alloc(CT_MEM_BUFFERS, (size_t)h.w * h.h * 3);
  if (!px) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory for a %dx%d BMP", h.w, h.h);
    goto out;
  }
  for (int y = 0; y < h.h; y++) {
    const uint8_t *row = data + offbits + stride * (uint64_t)(h.topdown ? y : h.h - 1 - y);
    uint8_t *d = px + (size_t)y * h.w * 3;
    switch (h.bpp) {
      case 1:
      case 4:
      case 8: {
        int per = 8 / h.bpp, mask = (1 << h.bpp) - 1;
        for (int x = 0; x < h.w; x++) {
          int shift = (per - 1 - x % per) * h.bpp;
          int idx = (row[x / per] >> shift) & mask;
          memcpy(d + 3 * x, pal[idx], 3);
        }
        break;
      }
      default: {
        int bytes = h.bpp / 8;
        for (int x = 0; x < h.w; x++) {
          const uint8_t *s = row + (size_t)x * bytes;
          uint32_t v = s[0] | (uint32_t)s[1] << 8;
          if (bytes >= 3) v |= (uint32_t)s[2] << 16;
          if (bytes == 4) v |= (uint32_t)s[3] << 24;
          d[3 * x] = get_field(&fr, v);
          d[3 * x + 1] = get_field(&fg, v);
          d[3 * x + 2] = get_field(&fb, v);
        }
        break;
      }
    }
  }
  out->w = h.w;
  out->h = h.h;
  out->px = px;
  px = NULL;
out:
  ct_free(px);
  return st;
}

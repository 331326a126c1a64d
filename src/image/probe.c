/* probe.c: image geometry from headers alone — format, stored size, EXIF
 * orientation and displayed size — for PNG, JPEG, WebP, BMP and GIF.
 *
 * Design: every parser reads through one small byte source, `at(src, off,
 * len)`, that either points into a caller's memory or keeps a window of a file
 * filled by pread(). Parsers only ask for a few bytes at a time (a marker, a
 * chunk header, a 12-byte IFD entry), so skipping a large JPEG APPn segment or
 * a WebP image chunk is a seek, not a read: a typical file costs one fstat and
 * one pread of at most 64 KiB. A request past the end of memory records how
 * many bytes would have been needed (`need`), so ct_image_probe_mem tells a
 * caller holding a prefix of a file how much more to read.
 *
 * What each format checks mirrors the decoder that will later read the file
 * (libpng's IHDR rules and CRC, libjpeg's marker walk up to SOS, libwebp's
 * VP8/VP8L/VP8X header checks, giflib's record walk up to the first image, our
 * BMP decoder's header rules), so that a probe that succeeds gives the size the
 * decoder will produce. EXIF orientation is read where Pillow reads it: the
 * first APP1 "Exif\0\0" of a JPEG (before SOS), a PNG eXIf chunk before IDAT,
 * a VP8X WebP's EXIF chunk. Invalid EXIF means orientation 1, never an error.
 *
 * Not here: pixel data (never decoded or checksummed), XMP orientation (Pillow
 * only consults it for PNG iTXt), a PNG eXIf after IDAT (Pillow reads it on
 * load(); reaching it would mean walking every IDAT chunk), a WebP EXIF chunk
 * whose VP8X flag is not set (we only walk the chunks when it is).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "ctuner/alloc.h"
#include "image/image_int.h"

#define WINDOW (64u * 1024u)
/* Bounds on walks over untrusted structure. */
#define MAX_CHUNKS 100000
#define MAX_JPEG_GARBAGE (1u << 20)

typedef struct {
  const uint8_t *mem; /* memory source, or NULL for a file */
  uint64_t size;      /* bytes available (memory) or file size */
  int fd;
  uint8_t *buf; /* file window [base, base + len) */
  uint64_t base;
  size_t len;
  uint64_t need; /* largest end offset asked for beyond size */
  int io_errno;
} src;

/* Pointer to bytes [off, off+len) or NULL (then need or io_errno says why). */
static const uint8_t *at(src *s, uint64_t off, size_t len) {
  if (off > s->size || len > s->size - off) {
    uint64_t end = off + len < off ? UINT64_MAX : off + len;
    if (end > s->need) s->need = end;
    return NULL;
  }
  if (s->mem) return s->mem + off;
  if (off >= s->base && off + len <= s->base + s->len) return s->buf + (off - s->base);
  if (len > WINDOW) return NULL; /* parsers never ask for more */
  size_t want = s->size - off < WINDOW ? (size_t)(s->size - off) : WINDOW, got = 0;
  while (got < want) {
    ssize_t r = pread(s->fd, s->buf + got, want - got, (off_t)(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      s->io_errno = errno;
      s->len = 0;
      return NULL;
    }
    if (r == 0) break; /* shrank under us */
    got += (size_t)r;
  }
  s->base = off;
  s->len = got;
  if (got < len) {
    if (off + len > s->need) s->need = off + len;
    return NULL;
  }
  return s->buf;
}

static uint16_t be16(const uint8_t *p) {
  return (uint16_t)(p[0] << 8 | p[1]);
}
static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static uint16_t le16(const uint8_t *p) {
  return (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t le24(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
}
static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The error for a failed at(): truncation (with the byte count needed) or I/O. */
static ct_status short_read(src *s, const char *fmt, const char *what, ct_err *err) {
  if (s->io_errno)
    return ct_errf(err, CT_ERR_IO, "read error in the %s header: %s", fmt, strerror(s->io_errno));
  return ct_errf(err, CT_ERR_FORMAT,
                 "truncated %s header: the %s needs %llu bytes, %s %llu (truncated file?)", fmt,
                 what, (unsigned long long)s->need, s->mem ? "have" : "the file has",
                 (unsigned long long)s->size);
}

/* ---- EXIF (a TIFF structure): orientation tag 0x0112 of IFD0 ---- */

/* Orientation 1..8 from the TIFF data at [off, off+len): 1 when absent or
 * invalid. Returns -1 if bytes inside the declared range are missing. */
static int exif_orientation(src *s, uint64_t off, uint64_t len) {
  const uint8_t *p = at(s, off, len < 8 ? (size_t)len : 8);
  if (!p) return -1;
  if (len < 8) return 1;
  int le;
  if (!memcmp(p, "II\x2a\x00", 4))
    le = 1;
  else if (!memcmp(p, "MM\x00\x2a", 4))
    le = 0;
  else
    return 1;
  uint32_t ifd = le ? le32(p + 4) : be32(p + 4);
  if ((uint64_t)ifd + 2 > len) return 1;
  if (!(p = at(s, off + ifd, 2))) return -1;
  uint32_t count = le ? le16(p) : be16(p);
  uint64_t room = (len - ifd - 2) / 12;
  if (count > room) count = (uint32_t)room;
  for (uint32_t i = 0; i < count; i++) {
    if (!(p = at(s, off + ifd + 2 + 12ull * i, 12))) return -1;
    uint16_t tag = le ? le16(p) : be16(p);
    if (tag != 0x0112) continue;
    uint16_t type = le ? le16(p + 2) : be16(p + 2);
    uint32_t cnt = le ? le32(p + 4) : be32(p + 4);
    long v;
    if (cnt != 1) return 1;
    switch (type) {
      case 1: /* BYTE */
        v = p[8];
        break;
      case 3: /* SHORT */
        v = le ? le16(p + 8) : be16(p + 8);
        break;
      case 8: /* SSHORT */
        v = (int16_t)(le ? le16(p + 8) : be16(p + 8));
        break;
      case 4: /* LONG */
      case 9: /* SLONG */
        v = (long)(le ? le32(p + 8) : be32(p + 8));
        break;
      default:
        return 1;
    }
    return v >= 1 && v <= 8 ? (int)v : 1;
  }
  return 1;
}

/* ---- PNG ---- */

static ct_status probe_png(src *s, ct_image_info *o, ct_err *err) {
  const uint8_t *p = at(s, 0, 33);
  if (!p) return short_read(s, "PNG", "IHDR chunk", err);
  if (be32(p + 8) != 13 || memcmp(p + 12, "IHDR", 4))
    return ct_errf(err, CT_ERR_FORMAT, "PNG does not start with a 13-byte IHDR chunk");
  if ((uint32_t)crc32(crc32(0, NULL, 0), p + 12, 17) != be32(p + 29))
    return ct_errf(err, CT_ERR_FORMAT, "corrupt PNG header: IHDR: CRC error");
  uint32_t w = be32(p + 16), h = be32(p + 20);
  int depth = p[24], ctype = p[25];
  int ok_depth = 0;
  switch (ctype) {
    case 0:
      ok_depth = depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16;
      break;
    case 3:
      ok_depth = depth == 1 || depth == 2 || depth == 4 || depth == 8;
      break;
    case 2:
    case 4:
    case 6:
      ok_depth = depth == 8 || depth == 16;
      break;
    default:
      return ct_errf(err, CT_ERR_FORMAT, "PNG colour type %d is invalid", ctype);
  }
  if (!ok_depth)
    return ct_errf(err, CT_ERR_FORMAT, "PNG bit depth %d is invalid for colour type %d", depth,
                   ctype);
  if (p[26] != 0 || p[27] != 0 || p[28] > 1)
    return ct_errf(err, CT_ERR_FORMAT,
                   "PNG compression %d, filter %d or interlace method %d is invalid", p[26], p[27],
                   p[28]);
  if (w > 0x7fffffffu || h > 0x7fffffffu)
    return ct_errf(err, CT_ERR_FORMAT, "PNG size %ux%u is invalid", (unsigned)w, (unsigned)h);
  o->stored_w = (int)(w > INT32_MAX ? INT32_MAX : w);
  o->stored_h = (int)(h > INT32_MAX ? INT32_MAX : h);
  ct_status st = ct_image_check_dims((long)w, (long)h, CT_IMAGE_MAX_PIXELS, "PNG", err);
  if (st) return st;
  /* Chunks up to the first IDAT: an eXIf there carries the orientation. */
  uint64_t off = 33;
  for (int i = 0; i < MAX_CHUNKS; i++) {
    if (!(p = at(s, off, 8))) return short_read(s, "PNG", "chunk list before IDAT", err);
    uint32_t len = be32(p);
    if (len > 0x7fffffffu)
      return ct_errf(err, CT_ERR_FORMAT, "PNG chunk at byte %llu has invalid length %u",
                     (unsigned long long)off, (unsigned)len);
    if (!memcmp(p + 4, "IDAT", 4) || !memcmp(p + 4, "IEND", 4)) break;
    if (!memcmp(p + 4, "eXIf", 4)) {
      int ori = exif_orientation(s, off + 8, len);
      if (ori < 0) return short_read(s, "PNG", "eXIf chunk", err);
      o->orientation = ori;
      break;
    }
    off += 12ull + len;
  }
  return CT_OK;
}

/* ---- JPEG ---- */

static ct_status probe_jpeg(src *s, ct_image_info *o, ct_err *err) {
  uint64_t off = 2; /* after SOI */
  int have_sof = 0, have_exif = 0;
  for (int i = 0; i < MAX_CHUNKS; i++) {
    /* Find the next marker as libjpeg does: skip bytes up to 0xFF, fill 0xFFs,
     * and 0xFF00 (a stuffed zero). */
    const uint8_t *p;
    int m = -1;
    uint64_t start = off;
    while (m < 0) {
      if (off - start > MAX_JPEG_GARBAGE)
        return ct_errf(err, CT_ERR_FORMAT, "JPEG has more than %u bytes of garbage between markers",
                       MAX_JPEG_GARBAGE);
      if (!(p = at(s, off, 2))) return short_read(s, "JPEG", "marker list up to SOS", err);
      if (p[0] != 0xFF) {
        off++;
        continue;
      }
      if (p[1] == 0xFF) {
        off++;
        continue;
      }
      if (p[1] == 0x00) {
        off += 2;
        continue;
      }
      m = p[1];
      off += 2;
    }
    if (m == 0xD8) return ct_errf(err, CT_ERR_FORMAT, "JPEG has a second SOI marker");
    if (m == 0xD9) return ct_errf(err, CT_ERR_FORMAT, "JPEG ends (EOI) before any image data");
    if ((m >= 0xD0 && m <= 0xD7) || m == 0x01) continue; /* no length */
    if (!(p = at(s, off, 2))) return short_read(s, "JPEG", "marker list up to SOS", err);
    uint32_t len = be16(p);
    if (len < 2)
      return ct_errf(err, CT_ERR_FORMAT, "JPEG marker 0x%02X at byte %llu has length %u", m,
                     (unsigned long long)off - 2, (unsigned)len);
    if (m == 0xDA) {
      if (!have_sof) return ct_errf(err, CT_ERR_FORMAT, "JPEG has SOS before any SOF marker");
      return CT_OK;
    }
    if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
      if (have_sof) return ct_errf(err, CT_ERR_FORMAT, "JPEG has two SOF markers");
      if (len < 8) return ct_errf(err, CT_ERR_FORMAT, "JPEG SOF segment is too short (%u)", len);
      if (!(p = at(s, off + 2, 6))) return short_read(s, "JPEG", "SOF segment", err);
      long h = be16(p + 1), w = be16(p + 3);
      if (p[5] == 0) return ct_errf(err, CT_ERR_FORMAT, "JPEG SOF declares no components");
      ct_status st = ct_image_check_dims(w, h, CT_IMAGE_MAX_PIXELS, "JPEG", err);
      if (st) return st;
      o->stored_w = (int)w;
      o->stored_h = (int)h;
      have_sof = 1;
    } else if (m == 0xE1 && !have_exif && len >= 2 + 5) {
      size_t k = len >= 2 + 6 ? 6 : 5;
      if (!(p = at(s, off + 2, k))) return short_read(s, "JPEG", "APP1 segment", err);
      if (!memcmp(p, "Exif\0", 5)) {
        have_exif = 1; /* Pillow reads only the first APP1 starting "Exif\0" */
        if (k == 6 && p[5] == 0) {
          int ori = exif_orientation(s, off + 8, len - 8);
          if (ori < 0) return short_read(s, "JPEG", "EXIF segment", err);
          o->orientation = ori;
        }
      }
    }
    off += len;
  }
  return ct_errf(err, CT_ERR_FORMAT, "JPEG has more than %d markers before SOS", MAX_CHUNKS);
}

/* ---- WebP ---- */

static ct_status probe_webp(src *s, ct_image_info *o, ct_err *err) {
  const uint8_t *p = at(s, 0, 30);
  if (!p) return short_read(s, "WebP", "first chunk", err);
  uint32_t riff = le32(p + 4), csize = le32(p + 16);
  long w = 0, h = 0;
  ct_status st;
  if (riff < 12 || riff > 0xfffffff6u)
    return ct_errf(err, CT_ERR_FORMAT, "WebP RIFF size %u is invalid", (unsigned)riff);
  if (!memcmp(p + 12, "VP8 ", 4)) {
    /* Frame tag (3 bytes), start code 9d 01 2a, 14-bit width and height. */
    uint32_t bits = le24(p + 20);
    if (csize < 10) return ct_errf(err, CT_ERR_FORMAT, "WebP VP8 chunk is too short");
    if (bits & 1) return ct_errf(err, CT_ERR_FORMAT, "WebP VP8 frame is not a key frame");
    if (((bits >> 1) & 7) > 3 || !((bits >> 4) & 1) || (bits >> 5) >= csize)
      return ct_errf(err, CT_ERR_FORMAT, "WebP VP8 frame header is invalid");
    if (memcmp(p + 23, "\x9d\x01\x2a", 3))
      return ct_errf(err, CT_ERR_FORMAT, "WebP VP8 frame lacks its start code");
    w = le16(p + 26) & 0x3fff;
    h = le16(p + 28) & 0x3fff;
  } else if (!memcmp(p + 12, "VP8L", 4)) {
    if (csize < 5 || p[20] != 0x2f)
      return ct_errf(err, CT_ERR_FORMAT, "WebP VP8L chunk lacks its signature");
    uint32_t b = le32(p + 21);
    if (b >> 29) return ct_errf(err, CT_ERR_FORMAT, "WebP VP8L version %u is unknown", b >> 29);
    w = (long)(b & 0x3fff) + 1;
    h = (long)((b >> 14) & 0x3fff) + 1;
  } else if (!memcmp(p + 12, "VP8X", 4)) {
    if (csize < 10) return ct_errf(err, CT_ERR_FORMAT, "WebP VP8X chunk is too short");
    int flags = p[20];
    w = (long)le24(p + 24) + 1;
    h = (long)le24(p + 27) + 1;
    if ((st = ct_image_check_dims(w, h, CT_IMAGE_MAX_PIXELS, "WebP", err))) return st;
    o->stored_w = (int)w;
    o->stored_h = (int)h;
    /* With the EXIF flag set, find the chunk: it usually follows the image data,
     * so this is a walk over chunk headers (seeks, for a file). */
    uint64_t off = 20 + (uint64_t)csize + (csize & 1), end = 8 + (uint64_t)riff;
    for (int i = 0; (flags & 0x08) && i < MAX_CHUNKS && off + 8 <= end; i++) {
      if (!(p = at(s, off, 8))) return short_read(s, "WebP", "chunk list", err);
      uint32_t len = le32(p + 4);
      if (!memcmp(p, "EXIF", 4)) {
        uint64_t d = off + 8, n = len;
        const uint8_t *q = at(s, d, n >= 6 ? 6 : (size_t)n);
        if (!q) return short_read(s, "WebP", "EXIF chunk", err);
        if (n >= 6 && !memcmp(q, "Exif\0\0", 6)) d += 6, n -= 6; /* as Pillow */
        int ori = exif_orientation(s, d, n);
        if (ori < 0) return short_read(s, "WebP", "EXIF chunk", err);
        o->orientation = ori;
        break;
      }
      off += 8ull + len + (len & 1);
    }
    return CT_OK;
  } else {
    return ct_errf(
        err, CT_ERR_FORMAT, "WebP first chunk '%c%c%c%c' is not VP8, VP8L or VP8X",
        p[12] >= 32 && p[12] < 127 ? p[12] : '?', p[13] >= 32 && p[13] < 127 ? p[13] : '?',
        p[14] >= 32 && p[14] < 127 ? p[14] : '?', p[15] >= 32 && p[15] < 127 ? p[15] : '?');
  }
  if ((st = ct_image_check_dims(w, h, CT_IMAGE_MAX_PIXELS, "WebP", err))) return st;
  o->stored_w = (int)w;
  o->stored_h = (int)h;
  return CT_OK;
}

/* ---- BMP ---- */

static ct_status probe_bmp(src *s, ct_image_info *o, ct_err *err) {
  const uint8_t *p = at(s, 0, 18);
  if (!p) return short_read(s, "BMP", "file and info headers", err);
  uint32_t hs = le32(p + 14);
  if (hs != 12 && hs != 40 && hs != 52 && hs != 56 && hs != 64 && hs != 108 && hs != 124)
    return ct_errf(err, CT_ERR_UNSUPPORTED, "BMP info header of %u bytes is not supported",
                   (unsigned)hs);
  if (!(p = at(s, 0, 14 + (hs == 12 ? 12 : 20)))) return short_read(s, "BMP", "info header", err);
  ct_bmp_header bh;
  ct_status st = ct_bmp_parse_header(p, 14 + (hs == 12 ? 12 : 20), &bh, err);
  if (st) return st;
  o->stored_w = bh.w;
  o->stored_h = bh.h;
  return CT_OK;
}

/* ---- GIF ---- */

static ct_status probe_gif(src *s, ct_image_info *o, ct_err *err) {
  const uint8_t *p = at(s, 0, 13);
  if (!p) return short_read(s, "GIF", "logical screen descriptor", err);
  long w = le16(p + 6), h = le16(p + 8);
  uint64_t off = 13;
  if (p[10] & 0x80) off += 3u << ((p[10] & 7) + 1);
  /* Pillow (and our decoder) grow the screen to hold the first frame. */
  for (int i = 0; i < MAX_CHUNKS; i++) {
    if (!(p = at(s, off, 1))) return short_read(s, "GIF", "blocks before the first image", err);
    if (p[0] == 0x2C) {
      if (!(p = at(s, off, 10))) return short_read(s, "GIF", "image descriptor", err);
      long x1 = (long)le16(p + 1) + le16(p + 5), y1 = (long)le16(p + 3) + le16(p + 7);
      if (x1 > w) w = x1;
      if (y1 > h) h = y1;
      ct_status st = ct_image_check_dims(w, h, CT_IMAGE_MAX_PIXELS, "GIF", err);
      if (st) return st;
      o->stored_w = (int)w;
      o->stored_h = (int)h;
      return CT_OK;
    }
    if (p[0] == 0x3B) return ct_errf(err, CT_ERR_FORMAT, "GIF ends before its first image");
    if (p[0] != 0x21)
      return ct_errf(err, CT_ERR_FORMAT, "GIF has an unknown block type 0x%02X at byte %llu", p[0],
                     (unsigned long long)off);
    off += 2; /* introducer, label; then sub-blocks up to a zero length */
    for (;;) {
      if (!(p = at(s, off, 1))) return short_read(s, "GIF", "extension block", err);
      off += 1u + p[0];
      if (p[0] == 0) break;
    }
  }
  return ct_errf(err, CT_ERR_FORMAT, "GIF has more than %d blocks before its first image",
                 MAX_CHUNKS);
}

/* ---- front door ---- */

int ct_image_sniff(const uint8_t *p, size_t n) {
  static const struct {
    const char *sig;
    size_t len;
    int fmt;
  } sigs[] = {{"\x89PNG\r\n\x1a\n", 8, CT_IMAGE_PNG},
              {"\xff\xd8\xff", 3, CT_IMAGE_JPEG},
              {"GIF87a", 6, CT_IMAGE_GIF},
              {"GIF89a", 6, CT_IMAGE_GIF},
              {"BM", 2, CT_IMAGE_BMP}};
  int maybe = 0;
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
    size_t k = n < sigs[i].len ? n : sigs[i].len;
    if (memcmp(p, sigs[i].sig, k)) continue;
    if (k == sigs[i].len) return sigs[i].fmt;
    maybe = 1;
  }
  /* RIFF....WEBP */
  size_t k = n < 4 ? n : 4;
  if (!memcmp(p, "RIFF", k)) {
    if (n < 12) return -1;
    if (!memcmp(p + 8, "WEBP", 4)) return CT_IMAGE_WEBP;
  }
  return maybe ? -1 : 0;
}

const char *ct_image_format_name(int fmt) {
  switch (fmt) {
    case CT_IMAGE_PNG:
      return "PNG";
    case CT_IMAGE_JPEG:
      return "JPEG";
    case CT_IMAGE_WEBP:
      return "WebP";
    case CT_IMAGE_BMP:
      return "BMP";
    case CT_IMAGE_GIF:
      return "GIF";
    default:
      return "unknown";
  }
}

static ct_status probe_src(src *s, ct_image_info *o, ct_err *err) {
  memset(o, 0, sizeof *o);
  o->orientation = 1;
  const uint8_t *p = at(s, 0, s->size < 12 ? (size_t)s->size : 12);
  if (!p) return short_read(s, "image", "signature", err);
  if (s->size == 0) {
    s->need = 12;
    return ct_errf(err, CT_ERR_FORMAT, "empty file (0 bytes), not an image");
  }
  int fmt = ct_image_sniff(p, (size_t)(s->size < 12 ? s->size : 12));
  if (fmt < 0) {
    s->need = 12;
    return ct_errf(err, CT_ERR_FORMAT, "%llu bytes are too few to tell the image format",
                   (unsigned long long)s->size);
  }
  if (fmt == 0)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "not a PNG, JPEG, WebP, BMP or GIF file (first bytes %02x %02x %02x %02x)", p[0],
                   s->size > 1 ? p[1] : 0, s->size > 2 ? p[2] : 0, s->size > 3 ? p[3] : 0);
  ct_status st;
  switch (fmt) {
    case CT_IMAGE_PNG:
      st = probe_png(s, o, err);
      break;
    case CT_IMAGE_JPEG:
      st = probe_jpeg(s, o, err);
      break;
    case CT_IMAGE_WEBP:
      st = probe_webp(s, o, err);
      break;
    case CT_IMAGE_BMP:
      st = probe_bmp(s, o, err);
      break;
    default:
      st = probe_gif(s, o, err);
      break;
  }
  if (st) {
    int ori = o->orientation;
    memset(o, 0, sizeof *o);
    o->orientation = ori;
    return st;
  }
  o->format = (ct_image_format)fmt;
  int swap = o->orientation >= 5;
  o->w = swap ? o->stored_h : o->stored_w;
  o->h = swap ? o->stored_w : o->stored_h;
  return CT_OK;
}

ct_status ct_image_probe_mem(const void *data, size_t n, ct_image_info *out, size_t *need,
                             ct_err *err) {
  if (need) *need = 0;
  if (!out || (!data && n))
    return ct_errf(err, CT_ERR_INVALID, "ct_image_probe_mem: NULL argument");
  src s = {.mem = data ? data : (const uint8_t *)"", .size = n, .fd = -1};
  ct_status st = probe_src(&s, out, err);
  if (st && need && s.need > n) *need = s.need > SIZE_MAX ? SIZE_MAX : (size_t)s.need;
  return st;
}

ct_status ct_image_probe_info(const char *path, ct_image_info *out, ct_err *err) {
  ct_status st = CT_OK;
  src s = {.fd = -1};
  struct stat sb;
  if (!path || !out) return ct_errf(err, CT_ERR_INVALID, "ct_image_probe_info: NULL argument");
  memset(out, 0, sizeof *out);
  s.fd = open(path, O_RDONLY | O_CLOEXEC);
  if (s.fd < 0) {
    st = ct_errf(err, errno == ENOENT ? CT_ERR_NOT_FOUND : CT_ERR_IO, "cannot open: %s",
                 strerror(errno));
    goto out;
  }
  if (fstat(s.fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    st = ct_errf(err, CT_ERR_IO, "not a regular file");
    goto out;
  }
  s.size = (uint64_t)sb.st_size;
  s.buf = ct_alloc(CT_MEM_BUFFERS, WINDOW);
  if (!s.buf) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory for a %u-byte read buffer", WINDOW);
    goto out;
  }
  st = probe_src(&s, out, err);
out:
  if (s.fd >= 0) close(s.fd);
  ct_free(s.buf);
  if (st) ct_err_prefix(err, "%s: ", path);
  return st;
}

ct_status ct_image_probe(const char *path, int *w, int *h, ct_err *err) {
  ct_image_info info;
  if (!path || !w || !h) return ct_errf(err, CT_ERR_INVALID, "ct_image_probe: NULL argument");
  *w = *h = 0;
  ct_status st = ct_image_probe_info(path, &info, err);
  if (st) return st;
  *w = info.w;
  *h = info.h;
  return CT_OK;
}

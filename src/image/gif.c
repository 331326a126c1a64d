/* gif.c: the first frame of a GIF, with giflib, as Pillow 9.4 shows it.
 *
 * Pillow's Image.open(f).convert("RGB") of a GIF is frame 0 on a canvas the
 * size of the logical screen, grown if the frame reaches beyond it; pixels the
 * frame does not cover hold the frame's transparent index when a graphic
 * control extension gives one, else index 0 (not the background colour, which
 * Pillow only uses when disposing of later frames). Every frame pixel is
 * written, transparent or not, and indices are mapped through the frame's
 * local palette or else the global one; indices past the palette's end are
 * grey (i, i, i), as are all indices when there is no palette at all.
 *
 * We walk records with giflib's low-level API and stop after the first image,
 * so an animation's later frames are never decoded. Interlaced rows are put in
 * place here (DGifGetLine returns them in stored order).
 */
#include <gif_lib.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "image/image_int.h"

typedef struct {
  const uint8_t *p;
  size_t n, off;
} memsrc;

static int read_mem(GifFileType *gif, GifByteType *buf, int len) {
  memsrc *m = gif->UserData;
  if (len < 0) return 0;
  size_t k = (size_t)len;
  if (k > m->n - m->off) k = m->n - m->off;
  memcpy(buf, m->p + m->off, k);
  m->off += k;
  return (int)k;
}

static ct_status gif_fail(ct_err *err, int code, const char *what) {
  const char *s = GifErrorString(code);
  return ct_errf(err, CT_ERR_FORMAT, "corrupt or truncated GIF (%s): %s", what,
                 s ? s : "unknown giflib error");
}

ct_status ct_gif_decode(const uint8_t *data, size_t n, long max_pixels, ct_image *out,
                        ct_err *err) {
  ct_status st = CT_OK;
  memsrc m = {data, n, 0};
  int code = 0, transparent = -1;
  GifFileType *gif = DGifOpen(&m, read_mem, &code);
  uint8_t *idx = NULL, *line = NULL, *px = NULL;
  if (!gif) {
    st = gif_fail(err, code, "header");
    goto out;
  }
  for (;;) {
    GifRecordType rt;
    if (DGifGetRecordType(gif, &rt) == GIF_ERROR) {
      st = gif_fail(err, gif->Error, "record type");
      goto out;
    }
    if (rt == TERMINATE_RECORD_TYPE) {
      st = ct_errf(err, CT_ERR_FORMAT, "GIF ends before its first image");
      goto out;
    }
    if (rt == EXTENSION_RECORD_TYPE) {
      int ext_code;
      GifByteType *ext;
      if (DGifGetExtension(gif, &ext_code, &ext) == GIF_ERROR) {
        st = gif_fail(err, gif->Error, "extension");
        goto out;
      }
      if (ext_code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4 && (ext[1] & 1))
        transparent = ext[4];
      while (ext) {
        if (DGifGetExtensionNext(gif, &ext) == GIF_ERROR) {
          st = gif_fail(err, gif->Error, "extension");
          goto out;
        }
      }
      continue;
    }
    if (rt != IMAGE_DESC_RECORD_TYPE) continue;
    if (DGifGetImageDesc(gif) == GIF_ERROR) {
      st = gif_fail(err, gif->Error, "image descriptor");
      goto out;
    }
    break;
  }
  GifImageDesc *d = &gif->Image;
  long fx = d->Left, fy = d->Top, fw = d->Width, fh = d->Height;
  long cw = gif->SWidth, ch = gif->SHeight;
  if (fx + fw > cw) cw = fx + fw;
  if (fy + fh > ch) ch = fy + fh;
  if ((st = ct_image_check_dims(cw, ch, max_pixels, "GIF", err))) goto out;
  /* Palette: local, else global; missing entries grey. */
  uint8_t pal[256][3];
  for (int i = 0; i < 256; i++) pal[i][0] = pal[i][1] = pal[i][2] = (uint8_t)i;
  const ColorMapObject *cm = d->ColorMap ? d->ColorMap : gif->SColorMap;
  if (cm && cm->Colors) {
    int k = cm->ColorCount < 256 ? cm->ColorCount : 256;
    for (int i = 0; i < k; i++) {
      pal[i][0] = cm->Colors[i].Red;
      pal[i][1] = cm->Colors[i].Green;
      pal[i][2] = cm->Colors[i].Blue;
    }
  }
  size_t npx = (size_t)cw * (size_t)ch;
  idx = malloc(npx);
  line = malloc(fw > 0 ? (size_t)fw : 1);
  if (!idx || !line) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory for a %ldx%ld GIF", cw, ch);
    goto out;
  }
  memset(idx, transparent >= 0 ? transparent : 0, npx);
  if (fw > 0 && fh > 0) {
    static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
    int passes = d->Interlace ? 4 : 1;
    for (int pass = 0; pass < passes; pass++) {
      int y0 = d->Interlace ? start[pass] : 0, dy = d->Interlace ? step[pass] : 1;
      for (long y = y0; y < fh; y += dy) {
        if (DGifGetLine(gif, line, (int)fw) == GIF_ERROR) {
          st = gif_fail(err, gif->Error, "image data");
          goto out;
        }
        memcpy(idx + (size_t)(fy + y) * cw + fx, line, (size_t)fw);
      }
    }
  }
  px = ct_alloc(CT_MEM_BUFFERS, npx * 3);
  if (!px) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory for a %ldx%ld GIF", cw, ch);
    goto out;
  }
  for (size_t i = 0; i < npx; i++) memcpy(px + 3 * i, pal[idx[i]], 3);
  out->w = (int)cw;
  out->h = (int)ch;
  out->px = px;
  px = NULL;
out:
  if (gif) DGifCloseFile(gif, &code);
  free(idx);
  free(line);
  ct_free(px);
  return st;
}

/* orient.c: EXIF orientation applied to a decoded image, as Pillow's
 * ImageOps.exif_transpose does it.
 *
 * Orientation o says how the stored pixels must be transformed for display:
 * 2 mirror left-right, 3 rotate 180, 4 mirror top-bottom, 5 transpose (mirror
 * across the main diagonal), 6 rotate 90 degrees clockwise, 7 transverse
 * (mirror across the anti-diagonal), 8 rotate 90 degrees counter-clockwise.
 * Each is written as "which stored pixel lands at displayed (x, y)" and copied
 * into a new buffer in one pass; 5..8 swap width and height.
 */
#include "ctuner/alloc.h"
#include "image/image_int.h"

ct_status ct_image_orient(ct_image *img, int o, ct_err *err) {
  ct_image dst = {0};
  ct_status st;
  if (o <= 1 || o > 8) return CT_OK;
  int sw = img->w, sh = img->h, swap = o >= 5;
  if ((st = ct_image_alloc(swap ? sh : sw, swap ? sw : sh, &dst, err))) return st;
  for (int y = 0; y < dst.h; y++) {
    uint8_t *d = dst.px + (size_t)y * dst.w * 3;
    for (int x = 0; x < dst.w; x++, d += 3) {
      int sx, sy;
      switch (o) {
        case 2:
          sx = sw - 1 - x, sy = y;
          break;
        case 3:
          sx = sw - 1 - x, sy = sh - 1 - y;
          break;
        case 4:
          sx = x, sy = sh - 1 - y;
          break;
        case 5:
          sx = y, sy = x;
          break;
        case 6:
          sx = y, sy = sh - 1 - x;
          break;
        case 7:
          sx = sw - 1 - y, sy = sh - 1 - x;
          break;
        default: /* 8 */
          sx = sw - 1 - y, sy = x;
          break;
      }
      const uint8_t *s = img->px + ((size_t)sy * sw + sx) * 3;
      d[0] = s[0];
      d[1] = s[1];
      d[2] = s[2];
    }
  }
  ct_image_free(img);
  *img = dst;
  return CT_OK;
}

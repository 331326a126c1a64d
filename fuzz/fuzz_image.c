/* fuzz_image.c: libFuzzer target for the image decoders (libpng,
 * libjpeg-turbo, libwebp, giflib and our BMP reader behind ct_image_decode,
 * with the EXIF orientation applied).
 *
 * Each input is decoded from an exact-size heap copy (so ASan sees over-reads)
 * with a 4-megapixel budget, so that a header claiming a huge image is refused
 * rather than exhausting the fuzzer's RSS limit. Every failure must carry a
 * message; every success must give a consistent image, which is then resized
 * (down and up) and cropped to exercise those paths on arbitrary sizes. When
 * the header probe also succeeds, the decoded size must be the probe's
 * displayed size (the promise discovery relies on).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  memcpy(copy, data, size);
  ct_image img = {0}, r = {0};
  ct_err err = {0};
  if (ct_image_decode_limit(copy, size, 1L << 22, &img, &err) != CT_OK) {
    if (err.msg[0] == '\0' || img.px != NULL) abort();
    free(copy);
    return 0;
  }
  if (img.w <= 0 || img.h <= 0 || !img.px) abort();
  ct_image_info info;
  if (ct_image_probe_mem(copy, size, &info, NULL, &err) == CT_OK &&
      (info.w != img.w || info.h != img.h))
    abort();
  volatile unsigned sum = 0;
  for (size_t i = 0; i < (size_t)img.w * img.h * 3; i++) sum += img.px[i]; /* reads all */
  if (img.w * img.h <= 1 << 16) {
    /* within ct_image_alloc's limit of 32768 per side: a 1 x 32023 image
     * (EXIF-rotated) must not ask for a 1 x 64047 one, which is refused by
     * design, not a defect */
    int w = img.w / 3 + 1, h = img.h * 2 + 1;
    if (h > 32768) h = 32768;
    if (ct_image_resize(&img, w, h, &r, &err) != CT_OK) abort();
    ct_image_free(&r);
    if (ct_image_crop(&img, img.w / 2, img.h / 2, img.w - img.w / 2, img.h - img.h / 2, &r, &err))
      abort();
    ct_image_free(&r);
  }
  ct_image_free(&img);
  free(copy);
  return 0;
}

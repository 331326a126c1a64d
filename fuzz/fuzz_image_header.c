/* fuzz_image_header.c: libFuzzer target for the header-only prober
 * (ct_image_probe_mem over PNG, JPEG, WebP, BMP and GIF headers and EXIF).
 *
 * Each input is probed from an exact-size heap copy (so ASan sees any read
 * past the end) and then checked: on success the stored size is within the
 * decoder limits, the orientation is 1..8, the displayed size is the stored
 * one with the sides swapped exactly when the orientation is 5..8, and the
 * format is one of the five; on failure there is a message, the output size
 * is cleared, and `need` is 0 or more than the input. A failure with `need`
 * must not turn into a different answer for a longer input that agrees on the
 * first n bytes (probed again on the input padded with zeros to `need`).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const ct_image_info *in, ct_status st, const ct_err *err, size_t n, size_t need) {
  if (st != CT_OK) {
    if (err->msg[0] == '\0' || in->w != 0 || in->h != 0) abort();
    if (need != 0 && need <= n) abort();
    return;
  }
  if (need != 0) abort();
  if (in->stored_w <= 0 || in->stored_h <= 0 || in->stored_w > 32768 || in->stored_h > 32768 ||
      (long long)in->stored_w * in->stored_h > (1LL << 28))
    abort();
  if (in->orientation < 1 || in->orientation > 8) abort();
  int swap = in->orientation >= 5;
  if (in->w != (swap ? in->stored_h : in->stored_w) ||
      in->h != (swap ? in->stored_w : in->stored_h))
    abort();
  if (in->format < CT_IMAGE_PNG || in->format > CT_IMAGE_GIF) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  memcpy(copy, data, size);
  ct_image_info info;
  ct_err err = {0};
  size_t need = 0;
  ct_status st = ct_image_probe_mem(copy, size, &info, &need, &err);
  check(&info, st, &err, size, need);
  /* Follow one `need` with zero padding: still consistent, never a crash. */
  if (st != CT_OK && need > size && need <= size + (1u << 16)) {
    uint8_t *more = calloc(1, need);
    if (more) {
      memcpy(more, data, size);
      ct_err e2 = {0};
      size_t need2 = 0;
      ct_status st2 = ct_image_probe_mem(more, need, &info, &need2, &e2);
      check(&info, st2, &e2, need, need2);
      free(more);
    }
  }
  free(copy);
  return 0;
}

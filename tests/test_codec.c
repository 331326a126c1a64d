/* Pixel codec tests: exact round trip of every uint8 value and of random
 * images for s = 1, 2, 4; the channel layout matches ct_patchify; clamping;
 * clear errors for bad sizes, scale factors and NaN. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/codec.h"
#include "ctuner/kernels.h"
#include "ctuner/rng.h"
#include "harness.h"

CT_TEST(codec, channels) {
  CHECK(ct_pixel_channels(1) == 3);
  CHECK(ct_pixel_channels(2) == 12);
  CHECK(ct_pixel_channels(4) == 48);
  CHECK(ct_pixel_channels(3) == 0);
  CHECK(ct_pixel_channels(0) == 0);
}

CT_TEST(codec, all_byte_values_round_trip) {
  /* 256 pixels x 3 channels, every byte value in every colour. */
  enum { W = 16, H = 16 };
  uint8_t rgb[W * H * 3], back[W * H * 3];
  for (int i = 0; i < W * H; i++) {
    rgb[i * 3 + 0] = (uint8_t)i;
    rgb[i * 3 + 1] = (uint8_t)(255 - i);
    rgb[i * 3 + 2] = (uint8_t)(i * 7 + 3);
  }
  float lat[W * H * 3];
  ct_err err = {0};
  for (int s = 1; s <= 4; s *= 2) {
    REQUIRE(ct_pixel_encode(rgb, W, H, s, lat, &err) == CT_OK);
    float lo = 1, hi = -1;
    for (int i = 0; i < W * H * 3; i++) {
      lo = lat[i] < lo ? lat[i] : lo;
      hi = lat[i] > hi ? lat[i] : hi;
    }
    CHECK(lo == -1.0f && hi == 1.0f); /* 0 -> -1, 255 -> 1 exactly */
    memset(back, 0xAA, sizeof back);
    REQUIRE(ct_pixel_decode(lat, W, H, s, back, &err) == CT_OK);
    CHECKF(!memcmp(rgb, back, sizeof rgb), "s=%d", s);
  }
}

CT_TEST(codec, random_images_and_layout) {
  ct_err err = {0};
  const int sizes[3][2] = {{8, 12}, {20, 4}, {64, 36}};
  for (int k = 0; k < 3; k++) {
    int w = sizes[k][0], h = sizes[k][1];
    size_t n = (size_t)w * h * 3;
    uint8_t *rgb = malloc(n), *back = malloc(n);
    float *lat = malloc(n * sizeof(float)), *chw = malloc(n * sizeof(float)),
          *pt = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) rgb[i] = (uint8_t)(ct_rng_uniform(11, k, i) * 256.0f);
    for (int s = 1; s <= 4; s *= 2) {
      REQUIRE(ct_pixel_encode(rgb, w, h, s, lat, &err) == CT_OK);
      REQUIRE(ct_pixel_decode(lat, w, h, s, back, &err) == CT_OK);
      CHECKF(!memcmp(rgb, back, n), "%dx%d s=%d", w, h, s);
      /* Layout: the latent equals patchify of the (3, h, w) image by s, i.e.
       * channel c s^2 + py s + px at (y, x) is colour c of pixel (y s + py, x s + px). */
      for (int c = 0; c < 3; c++)
        for (int i = 0; i < w * h; i++)
          chw[(size_t)c * w * h + i] = rgb[(size_t)i * 3 + c] / 127.5f - 1.0f;
      if (s > 1) {
        ct_patchify(1, 3, h, w, s, chw, pt); /* (h/s * w/s, 3 s^2) */
        int L = (h / s) * (w / s), C = 3 * s * s, bad = 0;
        for (int l = 0; l < L; l++)
          for (int ch = 0; ch < C; ch++) bad += pt[(size_t)l * C + ch] != lat[(size_t)ch * L + l];
        CHECKF(bad == 0, "%dx%d s=%d: %d values differ from patchify", w, h, s, bad);
      } else {
        CHECK(!memcmp(chw, lat, n * sizeof(float)));
      }
    }
    free(rgb);
    free(back);
    free(lat);
    free(chw);
    free(pt);
  }
}

CT_TEST(codec, decode_clamps_and_rounds) {
  float lat[3] = {-5.0f, 7.0f, 0.0f}; /* 1x1 image, s = 1 */
  uint8_t rgb[3];
  ct_err err = {0};
  REQUIRE(ct_pixel_decode(lat, 1, 1, 1, rgb, &err) == CT_OK);
  CHECK(rgb[0] == 0 && rgb[1] == 255 && rgb[2] == 128); /* 127.5 rounds to even */
  lat[0] = -INFINITY;
  lat[1] = INFINITY;
  lat[2] = 2.0f / 255.0f - 1.0f + 0.003f; /* nearest byte 1 */
  REQUIRE(ct_pixel_decode(lat, 1, 1, 1, rgb, &err) == CT_OK);
  CHECK(rgb[0] == 0 && rgb[1] == 255 && rgb[2] == 1);
  lat[1] = NAN;
  CHECK(ct_pixel_decode(lat, 1, 1, 1, rgb, &err) == CT_ERR_NUMERIC);
  CHECKF(strstr(err.msg, "NaN") != NULL, "%s", err.msg);
}

CT_TEST(codec, errors) {
  uint8_t rgb[10 * 6 * 3] = {0};
  float lat[10 * 6 * 3];
  ct_err err = {0};
  CHECK(ct_pixel_encode(rgb, 10, 6, 4, lat, &err) == CT_ERR_SHAPE);
  CHECKF(strstr(err.msg, "10x6") && strstr(err.msg, "s = 4") && strstr(err.msg, "8x4"), "%s",
         err.msg);
  CHECK(ct_pixel_decode(lat, 10, 6, 4, rgb, &err) == CT_ERR_SHAPE);
  CHECK(ct_pixel_encode(rgb, 9, 6, 2, lat, &err) == CT_ERR_SHAPE);
  CHECK(ct_pixel_encode(rgb, 10, 5, 2, lat, &err) == CT_ERR_SHAPE);
  CHECK(ct_pixel_encode(rgb, 10, 6, 2, lat, &err) == CT_OK);
  CHECK(ct_pixel_encode(rgb, 10, 6, 3, lat, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "1, 2 or 4") != NULL, "%s", err.msg);
  CHECK(ct_pixel_encode(rgb, 0, 6, 1, lat, &err) == CT_ERR_SHAPE);
  CHECK(ct_pixel_encode(NULL, 10, 6, 1, lat, &err) == CT_ERR_INVALID);
  CHECK(ct_pixel_decode(lat, 10, 6, 1, NULL, &err) == CT_ERR_INVALID);
}

/* Image module tests: decode every fixture against Pillow's pixels, resize
 * against Pillow's LANCZOS, corrupt inputs, limits, atomic save round trips. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/image.h"
#include "harness.h"

static uint8_t *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc(sz > 0 ? (size_t)sz : 1);
  *n = b ? fread(b, 1, (size_t)sz, f) : 0;
  fclose(f);
  return b;
}

static const char *img_path(const char *name) {
  static char buf[4096];
  snprintf(buf, sizeof buf, "%s", ct_test_data("images/"));
  strncat(buf, name, sizeof buf - strlen(buf) - 1);
  return buf;
}

/* Largest per-channel difference and the number of differing channel values. */
static int maxdiff(const uint8_t *a, const uint8_t *b, size_t n, size_t *ndiff) {
  int m = 0;
  *ndiff = 0;
  for (size_t i = 0; i < n; i++) {
    int d = abs((int)a[i] - (int)b[i]);
    if (d) (*ndiff)++;
    if (d > m) m = d;
  }
  return m;
}

static void check_fixture(int *ct_failed_, const char *name, int w, int h, int tol) {
  ct_image img = {0};
  ct_err err = {0};
  char path[4096], refp[4200];
  snprintf(path, sizeof path, "%s", img_path(name));
  snprintf(refp, sizeof refp, "%s.rgb", path);
  ct_status st = ct_image_load(path, &img, &err);
  CHECKF(st == CT_OK, "%s: %s", name, err.msg);
  if (st) return;
  CHECKF(img.w == w && img.h == h, "%s: %dx%d, want %dx%d", name, img.w, img.h, w, h);
  int pw = 0, ph = 0;
  CHECKF(ct_image_probe(path, &pw, &ph, &err) == CT_OK && pw == w && ph == h, "probe %s: %s", name,
         err.msg);
  size_t n = 0, nd = 0;
  uint8_t *ref = slurp(refp, &n);
  CHECKF(ref && n == (size_t)w * h * 3, "%s: reference %s missing or wrong size", name, refp);
  if (ref && n == (size_t)w * h * 3) {
    int m = maxdiff(img.px, ref, n, &nd);
    CHECKF(m <= tol, "%s: max diff %d (%zu of %zu values differ), tolerance %d", name, m, nd, n,
           tol);
  }
  free(ref);
  ct_image_free(&img);
}

CT_TEST(image, png_variants_match_pillow) {
  const char *names[] = {"rgb.png",   "rgba.png",       "palette.png",
                         "grey.png",  "grey_alpha.png", "bilevel.png",
                         "rgb16.png", "interlaced.png", "interlaced_rgba.png"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    check_fixture(ct_failed_, names[i], 23, 17, 0);
}

CT_TEST(image, jpeg_variants_match_pillow) {
  /* Same libjpeg-turbo, same default settings: exact. */
  const char *names[] = {"baseline.jpg", "progressive.jpg", "grey.jpg", "cmyk.jpg", "q95_444.jpg"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    check_fixture(ct_failed_, names[i], 37, 29, 0);
}

static void expect_error(int *ct_failed_, const char *name, const char *needle) {
  ct_image img = {0};
  ct_err err = {0};
  ct_status st = ct_image_load(img_path(name), &img, &err);
  CHECKF(st != CT_OK, "%s decoded", name);
  CHECKF(img.px == NULL && img.w == 0, "%s: output not cleared", name);
  CHECKF(strstr(err.msg, name) != NULL, "%s: message does not name the file: %s", name, err.msg);
  CHECKF(strstr(err.msg, needle) != NULL, "%s: message lacks '%s': %s", name, needle, err.msg);
  /* From memory too (fuzz path). */
  size_t n = 0;
  uint8_t *b = slurp(img_path(name), &n);
  ct_err e2 = {0};
  CHECK(ct_image_decode(b, n, &img, &e2) != CT_OK && e2.msg[0]);
  free(b);
}

CT_TEST(image, corrupt_files_fail_clearly) {
  expect_error(ct_failed_, "bad_truncated.png", "truncated");
  expect_error(ct_failed_, "bad_truncated.jpg", "truncated");
  expect_error(ct_failed_, "bad_garbage.png", "not a PNG or JPEG");
  expect_error(ct_failed_, "bad_empty.png", "empty file");
  expect_error(ct_failed_, "bad_crc.png", "CRC");
  expect_error(ct_failed_, "bad_bomb_100000.png", "100000x100000");
  expect_error(ct_failed_, "bad_bomb_20000.png", "limit");
  expect_error(ct_failed_, "bad_bomb_16000.png", "truncated PNG");
  expect_error(ct_failed_, "does_not_exist.png", "cannot open");
  int w, h;
  ct_err err = {0};
  CHECK(ct_image_probe(img_path("bad_bomb_100000.png"), &w, &h, &err) == CT_ERR_RANGE);
  CHECK(ct_image_probe(img_path("bad_garbage.png"), &w, &h, &err) == CT_ERR_UNSUPPORTED);
  /* A corrupted (not truncated) JPEG: libjpeg may recover, as Pillow does; no crash,
   * and a failure must say why. */
  ct_image img = {0};
  err.msg[0] = '\0';
  if (ct_image_load(img_path("bad_corrupt.jpg"), &img, &err) == CT_OK) {
    CHECK(img.w == 37 && img.h == 29);
    ct_image_free(&img);
  } else {
    CHECK(err.msg[0] != '\0');
  }
}

CT_TEST(image, every_prefix_is_safe) {
  /* Every truncation of a PNG and a progressive JPEG fails cleanly or decodes. */
  const char *names[] = {"interlaced.png", "progressive.jpg", "palette.png"};
  for (int f = 0; f < 3; f++) {
    size_t n = 0;
    uint8_t *b = slurp(img_path(names[f]), &n);
    REQUIRE(b);
    int fails = 0;
    for (size_t k = 0; k < n; k += (k < 64 ? 1 : 7)) {
      uint8_t *c = malloc(k ? k : 1);
      memcpy(c, b, k);
      ct_image img = {0};
      ct_err err = {0};
      ct_status st = ct_image_decode(c, k, &img, &err);
      if (st) {
        fails++;
        CHECKF(err.msg[0], "%s[:%zu] failed silently", names[f], k);
      }
      ct_image_free(&img);
      free(c);
    }
    CHECK(fails > 0);
    free(b);
  }
}

CT_TEST(image, limits) {
  ct_image img = {0};
  ct_err err = {0};
  CHECK(ct_image_alloc(0, 5, &img, &err) != CT_OK);
  CHECK(ct_image_alloc(40000, 5, &img, &err) == CT_ERR_RANGE);
  CHECK(ct_image_alloc(32768, 32768, &img, &err) == CT_ERR_RANGE);
  CHECK(img.px == NULL);
  REQUIRE(ct_image_alloc(7, 3, &img, &err) == CT_OK);
  ct_image_free(&img);
  ct_image_free(&img); /* idempotent */
  ct_image_free(NULL);
  size_t n = 0;
  uint8_t *b = slurp(img_path("rgb.png"), &n);
  CHECK(ct_image_decode_limit(b, n, 100, &img, &err) == CT_ERR_RANGE);
  CHECK(ct_image_decode_limit(b, n, 23 * 17, &img, &err) == CT_OK);
  ct_image_free(&img);
  free(b);
}

CT_TEST(image, resize_matches_pillow_lanczos) {
  size_t n = 0;
  uint8_t *src = slurp(ct_test_data("images/resize_src_40x30.rgb"), &n);
  REQUIRE(src && n == 40 * 30 * 3);
  ct_image s = {40, 30, src};
  int sizes[][2] = {{17, 13}, {40, 15}, {20, 30}, {97, 61}, {11, 47}, {64, 64}, {3, 2}};
  size_t total = 0, totdiff = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    int w = sizes[i][0], h = sizes[i][1];
    char name[64];
    snprintf(name, sizeof name, "images/resize_%dx%d.rgb", w, h);
    size_t rn = 0, nd = 0;
    uint8_t *ref = slurp(ct_test_data(name), &rn);
    CHECKF(ref && rn == (size_t)w * h * 3, "%s missing", name);
    ct_image d = {0};
    ct_err err = {0};
    CHECKF(ct_image_resize(&s, w, h, &d, &err) == CT_OK, "%s", err.msg);
    if (ref && d.px && rn == (size_t)w * h * 3) {
      int m = maxdiff(d.px, ref, rn, &nd);
      CHECKF(m <= 1, "%dx%d: max diff %d", w, h, m);
      total += rn;
      totdiff += nd;
    }
    ct_image_free(&d);
    free(ref);
  }
  /* Same algorithm and fixed-point arithmetic as Pillow: expect bit-exact. */
  CHECKF(totdiff == 0, "%zu of %zu values differ by 1 from Pillow", totdiff, total);
  /* Identity and a uniform image stay exact. */
  ct_image d = {0}, u = {0};
  ct_err err = {0};
  REQUIRE(ct_image_resize(&s, 40, 30, &d, &err) == CT_OK);
  CHECK(!memcmp(d.px, src, n));
  ct_image_free(&d);
  REQUIRE(ct_image_alloc(9, 5, &u, &err) == CT_OK);
  memset(u.px, 77, 9 * 5 * 3);
  REQUIRE(ct_image_resize(&u, 31, 2, &d, &err) == CT_OK);
  int same = 1;
  for (int i = 0; i < 31 * 2 * 3; i++) same &= d.px[i] == 77;
  CHECK(same);
  CHECK(ct_image_resize(&u, 0, 4, &d, &err) != CT_OK);
  ct_image_free(&u);
  ct_image_free(&d);
  free(src);
}

CT_TEST(image, crop) {
  ct_image s = {0}, c = {0};
  ct_err err = {0};
  REQUIRE(ct_image_alloc(5, 4, &s, &err) == CT_OK);
  for (int i = 0; i < 5 * 4 * 3; i++) s.px[i] = (uint8_t)i;
  REQUIRE(ct_image_crop(&s, 1, 2, 3, 2, &c, &err) == CT_OK);
  CHECK(c.w == 3 && c.h == 2);
  CHECK(c.px[0] == (2 * 5 + 1) * 3 && c.px[3 * 3] == (3 * 5 + 1) * 3);
  ct_image_free(&c);
  CHECK(ct_image_crop(&s, 3, 0, 3, 1, &c, &err) == CT_ERR_RANGE);
  CHECK(strstr(err.msg, "not inside") != NULL);
  CHECK(ct_image_crop(&s, -1, 0, 1, 1, &c, &err) == CT_ERR_RANGE);
  ct_image_free(&s);
}

CT_TEST(image, save_round_trip) {
  ct_image s = {0}, r = {0};
  ct_err err = {0};
  REQUIRE(ct_image_alloc(33, 21, &s, &err) == CT_OK);
  for (int i = 0; i < 33 * 21 * 3; i++) s.px[i] = (uint8_t)(i * 7 + (i / 99));
  char path[512];
  snprintf(path, sizeof path, "%s/rt.png", ct_test_tmpdir());
  REQUIRE(ct_image_save_png(path, &s, &err) == CT_OK);
  REQUIRE(ct_image_load(path, &r, &err) == CT_OK);
  CHECK(r.w == 33 && r.h == 21 && !memcmp(r.px, s.px, 33 * 21 * 3));
  ct_image_free(&r);
  /* overwrite in place; no temporary files left behind */
  REQUIRE(ct_image_save_png(path, &s, &err) == CT_OK);
  snprintf(path, sizeof path, "%s/rt.jpg", ct_test_tmpdir());
  for (int i = 0; i < 33 * 21 * 3; i++) s.px[i] = (uint8_t)(100 + (i % 3) * 40);
  REQUIRE(ct_image_save_jpeg(path, &s, 95, &err) == CT_OK);
  REQUIRE(ct_image_load(path, &r, &err) == CT_OK);
  size_t nd;
  CHECK(r.w == 33 && r.h == 21 && maxdiff(r.px, s.px, 33 * 21 * 3, &nd) <= 3);
  ct_image_free(&r);
  int w, h;
  CHECK(ct_image_probe(path, &w, &h, &err) == CT_OK && w == 33 && h == 21);
  CHECK(ct_image_save_jpeg(path, &s, 0, &err) == CT_ERR_INVALID);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "ls %s | grep -q tmp", ct_test_tmpdir());
  CHECK(system(cmd) != 0);
  /* unwritable directory: an error naming the path */
  CHECK(ct_image_save_png("/nonexistent-dir/x.png", &s, &err) == CT_ERR_IO);
  CHECK(strstr(err.msg, "/nonexistent-dir/x.png") != NULL);
  ct_image_free(&s);
}

/* Image module tests: decode every fixture against Pillow's pixels (PNG,
 * JPEG, WebP, BMP, GIF; EXIF orientation as exif_transpose), header probes
 * against probe.json and against every prefix of each file, resize against
 * Pillow's LANCZOS, corrupt inputs, limits, atomic save round trips. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/image.h"
#include "ctuner/json.h"
#include "harness.h"

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
  uint8_t *ref = ct_test_slurp(refp, &n);
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
  uint8_t *b = ct_test_slurp(img_path(name), &n);
  ct_err e2 = {0};
  CHECK(ct_image_decode(b, n, &img, &e2) != CT_OK && e2.msg[0]);
  free(b);
}

CT_TEST(image, corrupt_files_fail_clearly) {
  expect_error(ct_failed_, "bad_truncated.png", "truncated");
  expect_error(ct_failed_, "bad_truncated.jpg", "truncated");
  expect_error(ct_failed_, "bad_garbage.png", "not a PNG, JPEG, WebP, BMP or GIF");
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
  const char *names[] = {"interlaced.png",         "progressive.jpg", "palette.png", "lossy.webp",
                         "alpha_lossless.webp",    "anim.webp",       "pal4.bmp",    "rgb555.bmp",
                         "offset_transparent.gif", "exif_6.jpg"};
  for (size_t f = 0; f < sizeof names / sizeof *names; f++) {
    size_t n = 0;
    uint8_t *b = ct_test_slurp(img_path(names[f]), &n);
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
  uint8_t *b = ct_test_slurp(img_path("rgb.png"), &n);
  CHECK(ct_image_decode_limit(b, n, 100, &img, &err) == CT_ERR_RANGE);
  CHECK(ct_image_decode_limit(b, n, 23 * 17, &img, &err) == CT_OK);
  ct_image_free(&img);
  free(b);
}

CT_TEST(image, resize_matches_pillow_lanczos) {
  size_t n = 0;
  uint8_t *src = ct_test_slurp(ct_test_data("images/resize_src_40x30.rgb"), &n);
  REQUIRE(src && n == 40 * 30 * 3);
  ct_image s = {40, 30, src};
  int sizes[][2] = {{17, 13}, {40, 15}, {20, 30}, {97, 61}, {11, 47}, {64, 64}, {3, 2}};
  size_t total = 0, totdiff = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    int w = sizes[i][0], h = sizes[i][1];
    char name[64];
    snprintf(name, sizeof name, "images/resize_%dx%d.rgb", w, h);
    size_t rn = 0, nd = 0;
    uint8_t *ref = ct_test_slurp(ct_test_data(name), &rn);
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

/* ---- header probes and the formats beyond PNG/JPEG ---- */

static ct_json *load_probe_json(void) {
  size_t n = 0;
  uint8_t *b = ct_test_slurp(img_path("probe.json"), &n);
  ct_json *j = NULL;
  ct_err err = {0};
  if (b && ct_json_parse((const char *)b, n, &j, &err) != CT_OK) j = NULL;
  free(b);
  return j;
}

/* Expected (w, h, orientation, format) of fixture i of probe.json. */
static int probe_entry(const ct_json *j, size_t i, ct_image_info *want) {
  const ct_json *a = &j->items[i];
  if (a->type != CT_JSON_ARRAY || a->n != 4) return 0;
  want->w = (int)a->items[0].i64;
  want->h = (int)a->items[1].i64;
  want->orientation = (int)a->items[2].i64;
  want->format = (ct_image_format)a->items[3].i64;
  return 1;
}

static int same_info(const ct_image_info *a, const ct_image_info *b) {
  return a->w == b->w && a->h == b->h && a->orientation == b->orientation && a->format == b->format;
}

CT_TEST(image, probe_matches_pillow) {
  ct_json *j = load_probe_json();
  REQUIRE(j && j->type == CT_JSON_OBJECT && j->n >= 40);
  int formats_seen[6] = {0};
  for (size_t i = 0; i < j->n; i++) {
    const char *name = j->keys[i];
    ct_image_info want = {0}, got = {0}, gm = {0};
    ct_err err = {0};
    int ok = probe_entry(j, i, &want);
    CHECKF(ok, "probe.json: bad entry %s", name);
    if (!ok) continue;
    ct_status st = ct_image_probe_info(img_path(name), &got, &err);
    CHECKF(st == CT_OK, "probe %s: %s", name, err.msg);
    if (st) continue;
    CHECKF(same_info(&got, &want), "%s: probe %dx%d o%d f%d, want %dx%d o%d f%d", name, got.w,
           got.h, got.orientation, got.format, want.w, want.h, want.orientation, want.format);
    int swap = got.orientation >= 5;
    CHECKF(got.stored_w == (swap ? got.h : got.w) && got.stored_h == (swap ? got.w : got.h),
           "%s: stored %dx%d vs displayed %dx%d", name, got.stored_w, got.stored_h, got.w, got.h);
    if (got.format >= 1 && got.format <= 5) formats_seen[got.format] = 1;
    /* The memory variant agrees, and so does the size-only wrapper. */
    size_t n = 0, need = 7;
    uint8_t *b = ct_test_slurp(img_path(name), &n);
    CHECKF(ct_image_probe_mem(b, n, &gm, &need, &err) == CT_OK && same_info(&gm, &got) && need == 0,
           "probe_mem %s: %s", name, err.msg);
    free(b);
    int w = 0, h = 0;
    CHECK(ct_image_probe(img_path(name), &w, &h, &err) == CT_OK && w == want.w && h == want.h);
  }
  for (int f = 1; f <= 5; f++) CHECKF(formats_seen[f], "no fixture of format %d", f);
  ct_json_free(j);
}

CT_TEST(image, all_formats_match_pillow) {
  /* Every fixture of probe.json decodes to Pillow's
   * exif_transpose(img).convert("RGB") exactly (lossy WebP included: Pillow
   * links the same libwebp 1.2.4), at the size the probe reported. */
  ct_json *j = load_probe_json();
  REQUIRE(j && j->type == CT_JSON_OBJECT);
  for (size_t i = 0; i < j->n; i++) {
    ct_image_info want = {0};
    if (!probe_entry(j, i, &want)) continue;
    check_fixture(ct_failed_, j->keys[i], want.w, want.h, 0);
  }
  ct_json_free(j);
}

CT_TEST(image, orientation_transforms) {
  /* exif_1.jpg is the upright decode; each other orientation is a known
   * transform of the same stored pixels (all eight JPEGs hold the same scan). */
  ct_image up = {0};
  ct_err err = {0};
  REQUIRE(ct_image_load(img_path("exif_1.jpg"), &up, &err) == CT_OK);
  int w = up.w, h = up.h;
  for (int o = 2; o <= 8; o++) {
    char name[32];
    snprintf(name, sizeof name, "exif_%d.jpg", o);
    ct_image im = {0};
    REQUIRE(ct_image_load(img_path(name), &im, &err) == CT_OK);
    int swap = o >= 5;
    CHECKF(im.w == (swap ? h : w) && im.h == (swap ? w : h), "%s: %dx%d", name, im.w, im.h);
    int bad = 0;
    for (int y = 0; y < im.h && !bad; y++)
      for (int x = 0; x < im.w && !bad; x++) {
        /* displayed (x, y) shows stored (sx, sy) */
        int sx = x, sy = y;
        switch (o) {
          case 2:
            sx = w - 1 - x;
            break;
          case 3:
            sx = w - 1 - x, sy = h - 1 - y;
            break;
          case 4:
            sy = h - 1 - y;
            break;
          case 5:
            sx = y, sy = x;
            break;
          case 6:
            sx = y, sy = h - 1 - x;
            break;
          case 7:
            sx = w - 1 - y, sy = h - 1 - x;
            break;
          case 8:
            sx = w - 1 - y, sy = x;
            break;
        }
        bad = memcmp(im.px + ((size_t)y * im.w + x) * 3, up.px + ((size_t)sy * w + sx) * 3, 3);
      }
    CHECKF(!bad, "%s: pixels are not orientation %d of exif_1.jpg", name, o);
    ct_image_free(&im);
  }
  ct_image_free(&up);
}

/* Probing a prefix: an error (with need 0 or more than the prefix), or the
 * full file's answer; following `need` reaches the full answer. */
CT_TEST(image, probe_every_prefix) {
  ct_json *j = load_probe_json();
  REQUIRE(j && j->type == CT_JSON_OBJECT);
  for (size_t i = 0; i < j->n; i++) {
    const char *name = j->keys[i];
    size_t n = 0;
    uint8_t *b = ct_test_slurp(img_path(name), &n);
    ct_image_info full, got;
    ct_err err = {0};
    REQUIRE(b && ct_image_probe_mem(b, n, &full, NULL, &err) == CT_OK);
    int bad = 0;
    for (size_t k = 0; k < n && !bad; k += k < 64 ? 1 : 13) {
      uint8_t *c = malloc(k ? k : 1); /* exact size: ASan sees over-reads */
      memcpy(c, b, k);
      size_t need = 0;
      err.msg[0] = '\0';
      ct_status st = ct_image_probe_mem(c, k, &got, &need, &err);
      free(c);
      if (st == CT_OK) {
        if (!same_info(&got, &full)) bad = 1;
        CHECKF(!bad, "%s[:%zu]: probe %dx%d o%d, full file %dx%d o%d", name, k, got.w, got.h,
               got.orientation, full.w, full.h, full.orientation);
        continue;
      }
      CHECKF(err.msg[0], "%s[:%zu]: failed silently", name, k);
      /* A prefix of a good file always asks for more. */
      CHECKF(need > k, "%s[:%zu]: need %zu (%s)", name, k, need, err.msg);
      CHECKF(got.w == 0 && got.h == 0, "%s[:%zu]: size left set on failure", name, k);
      /* Follow need: it must lead to the full answer within the file. */
      size_t have = k;
      int steps = 0;
      while (st && need > have && need <= n && steps++ < 100) {
        have = need;
        st = ct_image_probe_mem(b, have, &got, &need, &err);
      }
      if (need > n) continue; /* a prefix too short to tell is fine */
      if (st == CT_OK) {
        CHECKF(same_info(&got, &full), "%s: following need from %zu gives a different answer", name,
               k);
      } else {
        CHECKF(st == CT_OK, "%s: following need from %zu ends in: %s", name, k, err.msg);
        bad = 1;
      }
    }
    free(b);
  }
  ct_json_free(j);
}

static void put_be16(uint8_t *p, unsigned v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}

CT_TEST(image, probe_jpeg_big_app_segments) {
  /* SOI, an Exif APP1 of 65533 bytes whose IFD0 sits at its end (orientation
   * 6), two 65533-byte APP2 segments, then exif_1.jpg's own segments (the SOF
   * lies ~196 KiB in), then 100 kB of zeros. The file probe seeks past the
   * segments. */
  size_t n = 0;
  uint8_t *b = ct_test_slurp(img_path("exif_1.jpg"), &n);
  REQUIRE(b && n > 4);
  size_t seg = 65535, total = 2 + 3 * (seg + 2) + (n - 2) + 100000; /* + zeros after EOI */
  uint8_t *f = calloc(1, total);
  REQUIRE(f);
  uint8_t *p = f;
  *p++ = 0xFF, *p++ = 0xD8;
  *p++ = 0xFF, *p++ = 0xE1;
  put_be16(p, (unsigned)seg);
  memcpy(p + 2, "Exif\0\0MM\0\x2a", 10);
  size_t ifd = seg - 2 - 6 - 40; /* TIFF-relative offset of IFD0 */
  uint8_t *t = p + 2 + 6;
  t[4] = (uint8_t)(ifd >> 24), t[5] = (uint8_t)(ifd >> 16), t[6] = (uint8_t)(ifd >> 8),
  t[7] = (uint8_t)ifd;
  uint8_t *e = t + ifd;
  put_be16(e, 1);
  put_be16(e + 2, 0x0112), put_be16(e + 4, 3), e[9] = 1, put_be16(e + 10, 6);
  p += seg;
  for (int k = 0; k < 2; k++) {
    *p++ = 0xFF, *p++ = 0xE2;
    put_be16(p, (unsigned)seg);
    memset(p + 2, 0xAB, seg - 2);
    p += seg;
  }
  /* exif_1.jpg after its SOI; its own Exif APP1 comes second and is ignored. */
  memcpy(p, b + 2, n - 2);
  char path[512];
  snprintf(path, sizeof path, "%s/big_app.jpg", ct_test_tmpdir());
  FILE *fp = fopen(path, "wb");
  REQUIRE(fp);
  CHECK(fwrite(f, 1, total, fp) == total);
  fclose(fp);
  ct_image_info info;
  ct_err err = {0};
  CHECKF(ct_image_probe_info(path, &info, &err) == CT_OK, "%s", err.msg);
  CHECKF(info.w == 17 && info.h == 23 && info.orientation == 6 && info.format == CT_IMAGE_JPEG,
         "%dx%d o%d", info.w, info.h, info.orientation);
  /* From a 64 KiB prefix: asks for more; a caller reading need plus 4 KiB each
   * time (need names the next byte the walk reads, marker by marker) gets
   * there in a few steps without the whole file. */
  size_t need = 0, have = 65536;
  int steps = 0;
  ct_status st = ct_image_probe_mem(f, have, &info, &need, &err);
  CHECK(st != CT_OK && need > have);
  while (st && need > have && need <= total && steps++ < 10) {
    have = need + 4096 < total ? need + 4096 : total;
    st = ct_image_probe_mem(f, have, &info, &need, &err);
  }
  CHECKF(st == CT_OK && info.orientation == 6 && steps <= 4, "%d steps: %s", steps, err.msg);
  CHECKF(have < total, "needed the whole file (%zu bytes)", have);
  /* Decodes to exif_6.jpg's pixels (same scan, same orientation). */
  ct_image a = {0}, c = {0};
  CHECKF(ct_image_load(path, &a, &err) == CT_OK, "%s", err.msg);
  REQUIRE(ct_image_load(img_path("exif_6.jpg"), &c, &err) == CT_OK);
  CHECK(a.w == c.w && a.h == c.h && a.px && !memcmp(a.px, c.px, (size_t)a.w * a.h * 3));
  ct_image_free(&a);
  ct_image_free(&c);
  free(f);
  free(b);
}

CT_TEST(image, probe_rejects_bad_headers) {
  ct_image_info info;
  ct_err err = {0};
  size_t need = 0;
  /* Bombs and empties are refused from the header, for every format. */
  static const uint8_t gif_big[] = "GIF89a\xff\x7f\xff\x7f\x00\x00\x00\x2c\0\0\0\0\1\0\1\0\0";
  CHECK(ct_image_probe_mem(gif_big, sizeof gif_big - 1, &info, &need, &err) == CT_ERR_RANGE);
  uint8_t bmp[54] = "BM";
  bmp[14] = 40;
  bmp[18] = 0x20, bmp[19] = 0x4e;                                 /* w 20000 */
  bmp[22] = 0xe0, bmp[23] = 0xb1, bmp[24] = 0xff, bmp[25] = 0xff; /* h -20000: top-down */
  bmp[28] = 24;
  CHECK(ct_image_probe_mem(bmp, sizeof bmp, &info, &need, &err) == CT_ERR_RANGE);
  CHECK(strstr(err.msg, "20000x20000") != NULL);
  bmp[18] = 5, bmp[19] = 0;
  CHECKF(ct_image_probe_mem(bmp, sizeof bmp, &info, &need, &err) == CT_OK && info.w == 5 &&
             info.h == 20000,
         "%s", err.msg);
  bmp[30] = 1; /* RLE8 */
  CHECK(ct_image_probe_mem(bmp, sizeof bmp, &info, &need, &err) == CT_ERR_UNSUPPORTED);
  uint8_t webp[30] = "RIFF\x16\0\0\0WEBPVP8L\x0a\0\0\0\x2f";
  webp[21] = 0xff, webp[22] = 0xff, webp[23] = 0xff, webp[24] = 0x0f; /* 16384 x 16384 */
  CHECKF(ct_image_probe_mem(webp, sizeof webp, &info, &need, &err) == CT_OK && info.w == 16384 &&
             info.h == 16384 && info.format == CT_IMAGE_WEBP,
         "%s", err.msg); /* exactly 2^28 pixels: allowed */
  webp[24] = 0x2f;       /* version bits set */
  CHECK(ct_image_probe_mem(webp, sizeof webp, &info, &need, &err) == CT_ERR_FORMAT);
  uint8_t vp8x[30] = "RIFF\x16\0\0\0WEBPVP8X\x0a\0\0\0";
  vp8x[24] = 0x3f, vp8x[25] = 0x9c; /* canvas 40000 x 1 */
  CHECK(ct_image_probe_mem(vp8x, sizeof vp8x, &info, &need, &err) == CT_ERR_RANGE);
  static const uint8_t jpeg_sos_first[] = "\xff\xd8\xff\xda\0\x02";
  CHECK(ct_image_probe_mem(jpeg_sos_first, 6, &info, &need, &err) == CT_ERR_FORMAT && need == 0);
  CHECK(ct_image_probe_mem("hello world, not an image", 25, &info, &need, &err) ==
        CT_ERR_UNSUPPORTED);
  CHECK(ct_image_probe_mem("\x89PN", 3, &info, &need, &err) == CT_ERR_FORMAT && need > 3);
  CHECK(ct_image_probe_mem("", 0, &info, &need, &err) == CT_ERR_FORMAT);
  CHECK(ct_image_probe_info(img_path("bad_crc.png"), &info, &err) == CT_ERR_FORMAT);
  CHECK(strstr(err.msg, "CRC") && strstr(err.msg, "bad_crc.png"));
  CHECK(ct_image_probe_info(img_path("nope.gif"), &info, &err) == CT_ERR_NOT_FOUND);
}

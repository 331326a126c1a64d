/* test_safetensors.c: suite `safetensors` — converters (exhaustive round trips,
 * nearest-even checks), writer/reader round trip with metadata, atomic write,
 * a file written by Python (numpy/torch) read back, and every malformed-input
 * class returning an error whose message names the problem. */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/fs.h"
#include "ctuner/rng.h"
#include "ctuner/safetensors.h"
#include "harness.h"

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

CT_TEST(safetensors, converters_known_values) {
  CHECK(ct_f32_to_bf16(1.0f) == 0x3F80);
  CHECK(ct_f32_to_bf16(-2.0f) == 0xC000);
  CHECK(ct_f32_to_bf16(bitsf(0x3F808000)) == 0x3F80); /* tie to even, down */
  CHECK(ct_f32_to_bf16(bitsf(0x3F818000)) == 0x3F82); /* tie to even, up */
  CHECK(ct_f32_to_bf16(bitsf(0x3F808001)) == 0x3F81);
  CHECK(ct_f32_to_bf16(bitsf(0x7F7FFFFF)) == 0x7F80); /* rounds to inf */
  CHECK(ct_f32_to_bf16(INFINITY) == 0x7F80 && ct_f32_to_bf16(-INFINITY) == 0xFF80);
  CHECK(isnan(ct_bf16_to_f32(ct_f32_to_bf16(NAN))));
  CHECK(isnan(ct_bf16_to_f32(ct_f32_to_bf16(bitsf(0x7F800001))))); /* low-payload NaN */
  CHECK(isnan(ct_bf16_to_f32(ct_f32_to_bf16(bitsf(0xFFFFFFFF)))));
  CHECK(ct_bf16_to_f32(0x3F80) == 1.0f);

  CHECK(ct_f32_to_f16(1.0f) == 0x3C00);
  CHECK(ct_f32_to_f16(-2.0f) == 0xC000);
  CHECK(ct_f32_to_f16(65504.0f) == 0x7BFF);
  CHECK(ct_f32_to_f16(65519.0f) == 0x7BFF);
  CHECK(ct_f32_to_f16(65520.0f) == 0x7C00);
  CHECK(ct_f32_to_f16(1e10f) == 0x7C00 && ct_f32_to_f16(-INFINITY) == 0xFC00);
  CHECK(ct_f32_to_f16(0x1p-14f) == 0x0400);            /* smallest normal */
  CHECK(ct_f32_to_f16(0x1p-24f) == 0x0001);            /* smallest subnormal */
  CHECK(ct_f32_to_f16(0x1p-25f) == 0x0000);            /* tie -> even (0) */
  CHECK(ct_f32_to_f16(0x1.000002p-25f) == 0x0001);     /* just above the tie */
  CHECK(ct_f32_to_f16(0x3p-25f) == 0x0002);            /* tie -> even (2) */
  CHECK(ct_f32_to_f16(0x1p-14f - 0x1p-25f) == 0x0400); /* tie at the normal edge */
  CHECK(ct_f32_to_f16(-0.0f) == 0x8000);
  CHECK(ct_f32_to_f16(1.0f + 0x1p-11f) == 0x3C00);
  CHECK(ct_f32_to_f16(1.0f + 0x3p-11f) == 0x3C02);
  CHECK(isnan(ct_f16_to_f32(ct_f32_to_f16(NAN))));
  CHECK(isnan(ct_f16_to_f32(ct_f32_to_f16(bitsf(0x7F800001)))));
  CHECK(ct_f16_to_f32(0x0001) == 0x1p-24f);
  CHECK(ct_f16_to_f32(0x83FF) == -0x3FFp-24f);
  CHECK(ct_f16_to_f32(0x7C00) == INFINITY);
  CHECK(ct_f16_to_f32(0x3555) == 0x1.554p-2f);
}

CT_TEST(safetensors, converters_exhaustive) {
  int bad16 = 0, badb = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = ct_f16_to_f32((uint16_t)h);
    int nan = ((h & 0x7C00) == 0x7C00) && (h & 0x3FF);
    if (nan ? !isnan(f) || !isnan(ct_f16_to_f32(ct_f32_to_f16(f))) : ct_f32_to_f16(f) != h) bad16++;
    float g = ct_bf16_to_f32((uint16_t)h);
    int nanb = ((h & 0x7F80) == 0x7F80) && (h & 0x7F);
    if (nanb ? !isnan(g) || !isnan(ct_bf16_to_f32(ct_f32_to_bf16(g))) : ct_f32_to_bf16(g) != h)
      badb++;
  }
  CHECK(bad16 == 0);
  CHECK(badb == 0);
  /* Nearest (ties to even) for random finite floats in range, by brute force
   * against the two neighbouring representable values. */
  int wrong16 = 0, wrongb = 0;
  for (uint64_t i = 0; i < 300000; i++) {
    uint32_t w[4];
    ct_philox4x32(7, 7, i, w);
    float x = bitsf((w[0] & 0x8FFFFFFFu) | 0x30000000u); /* |x| in ~[2^-31, 2^33) */
    if (!isfinite(x) || fabsf(x) >= 65504.0f) continue;
    uint16_t h = ct_f32_to_f16(x);
    double r = ct_f16_to_f32(h), e = fabs((double)x - r);
    double up = ct_f16_to_f32((uint16_t)(h + 1)), dn = ct_f16_to_f32((uint16_t)(h - 1));
    if ((h & 0x7FFF) != 0x7BFF && fabs((double)x - up) < e) wrong16++;
    if ((h & 0x7FFF) != 0 && fabs((double)x - dn) < e) wrong16++;
    if ((fabs((double)x - up) == e || fabs((double)x - dn) == e) && (h & 1) && e > 0) wrong16++;
    uint16_t b = ct_f32_to_bf16(x);
    double rb = ct_bf16_to_f32(b), eb = fabs((double)x - rb);
    double ub = ct_bf16_to_f32((uint16_t)(b + 1)), db = ct_bf16_to_f32((uint16_t)(b - 1));
    if (fabs((double)x - ub) < eb || fabs((double)x - db) < eb) wrongb++;
    if ((fabs((double)x - ub) == eb || fabs((double)x - db) == eb) && (b & 1) && eb > 0) wrongb++;
  }
  CHECK(wrong16 == 0);
  CHECK(wrongb == 0);
}

static int count_tmp_files(const char *dir) {
  int n = 0;
  DIR *d = opendir(dir);
  struct dirent *e;
  if (!d) return -1;
  while ((e = readdir(d)))
    if (strstr(e->d_name, ".tmp.")) n++;
  closedir(d);
  return n;
}

static const char *tmp_path(const char *name) {
  static char buf[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", ct_test_tmpdir(), name);
  return buf[k];
}

CT_TEST(safetensors, roundtrip) {
  float a[6] = {1.5f, -2.0f, 3.25f, 0.1f, 1e-3f, -7.0f};
  float b[4] = {0.1f, 1.0f / 3.0f, 300.7f, -1e-20f};
  float c[6] = {65504.0f, 70000.0f, 1e-6f, -0.5f, 3.14159f, 0.0f};
  float s[1] = {42.0f};
  int64_t sa[2] = {2, 3}, sb[1] = {4}, sc[3] = {3, 1, 2}, se[2] = {0, 5};
  ct_st_writer *w = NULL;
  ct_err err = {0};
  const char *path = tmp_path("rt.safetensors");
  REQUIRE(ct_st_writer_new(&w) == CT_OK);
  CHECK(ct_st_writer_add_f32(w, "blocks.0.attn.qkv.weight", 2, sa, a, CT_DTYPE_F32, &err) == 0);
  CHECK(ct_st_writer_add_f32(w, "b \"quoted\" \xC3\xA9", 1, sb, b, CT_DTYPE_BF16, &err) == 0);
  CHECK(ct_st_writer_add_f32(w, "c/half", 3, sc, c, CT_DTYPE_F16, &err) == 0);
  CHECK(ct_st_writer_add_f32(w, "scalar", 0, NULL, s, CT_DTYPE_F32, &err) == 0);
  CHECK(ct_st_writer_add_f32(w, "empty", 2, se, NULL, CT_DTYPE_BF16, &err) == 0);
  CHECK(ct_st_writer_meta(w, "format", "pt", &err) == 0);
  CHECK(ct_st_writer_meta(w, "tricky \"key\"\n\t\\", "v\xC3\xA4lue\x01 \xF0\x9F\x98\x80", &err) ==
        0);
  /* Rejections: duplicate name, reserved name, bad dtype, duplicate metadata. */
  CHECK(ct_st_writer_add_f32(w, "c/half", 1, sb, b, CT_DTYPE_F32, &err) == CT_ERR_INVALID);
  CHECK(strstr(err.msg, "'c/half' was already added") != NULL);
  CHECK(ct_st_writer_add_f32(w, "__metadata__", 1, sb, b, CT_DTYPE_F32, &err) == CT_ERR_INVALID);
  CHECK(ct_st_writer_add_f32(w, "bad\xFF", 1, sb, b, CT_DTYPE_F32, &err) == CT_ERR_INVALID);
  CHECK(ct_st_writer_add_f32(w, "i", 1, sb, b, CT_DTYPE_I32, &err) == CT_ERR_UNSUPPORTED);
  int64_t neg[1] = {-1};
  CHECK(ct_st_writer_add_f32(w, "neg", 1, neg, b, CT_DTYPE_F32, &err) == CT_ERR_INVALID);
  CHECK(ct_st_writer_meta(w, "format", "again", &err) == CT_ERR_INVALID);
  REQUIRE(ct_st_writer_write(w, path, &err) == CT_OK);
  ct_st_writer_free(w);
  CHECK(count_tmp_files(ct_test_tmpdir()) == 0);

  ct_st_file *f = NULL;
  REQUIRE(ct_st_open(path, &f, &err) == CT_OK);
  CHECK(f->ntensors == 5);
  CHECK(f->path && !strcmp(f->path, path));
  /* Header padded to a multiple of 8 with spaces; offsets contiguous, sorted. */
  const unsigned char *m = f->map;
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | m[i];
  CHECK(hl % 8 == 0);
  for (size_t i = 1; i < f->ntensors; i++) CHECK(f->tensors[i].begin >= f->tensors[i - 1].begin);
  CHECK(f->tensors[f->ntensors - 1].end == f->map_size - 8 - hl);

  const ct_st_tensor *t = ct_st_find(f, "blocks.0.attn.qkv.weight");
  REQUIRE(t);
  CHECK(t->dtype == CT_DTYPE_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3);
  CHECK(t->numel == 6 && t->end - t->begin == 24);
  float out[8];
  REQUIRE(ct_st_to_f32(t, out, 6, &err) == CT_OK);
  CHECK(memcmp(out, a, sizeof a) == 0);
  CHECK(t->begin == 0); /* insertion order: first tensor first */

  t = ct_st_find(f, "b \"quoted\" \xC3\xA9");
  REQUIRE(t);
  CHECK(t->dtype == CT_DTYPE_BF16 && t->numel == 4 && t->begin == 24);
  REQUIRE(ct_st_to_f32(t, out, 4, &err) == CT_OK);
  for (int i = 0; i < 4; i++) CHECK(out[i] == ct_bf16_to_f32(ct_f32_to_bf16(b[i])));
  CHECK(out[2] != b[2]); /* really stored at reduced precision */

  t = ct_st_find(f, "c/half");
  REQUIRE(t);
  CHECK(t->dtype == CT_DTYPE_F16 && t->ndim == 3 && t->shape[2] == 2 && t->numel == 6);
  REQUIRE(ct_st_to_f32(t, out, 6, &err) == CT_OK);
  for (int i = 0; i < 6; i++) CHECK(out[i] == ct_f16_to_f32(ct_f32_to_f16(c[i])));
  CHECK(out[0] == 65504.0f && isinf(out[1]));

  t = ct_st_find(f, "scalar");
  REQUIRE(t);
  CHECK(t->ndim == 0 && t->numel == 1);
  REQUIRE(ct_st_to_f32(t, out, 1, &err) == CT_OK);
  CHECK(out[0] == 42.0f);
  t = ct_st_find(f, "empty");
  REQUIRE(t);
  CHECK(t->numel == 0 && t->begin == t->end && t->shape[1] == 5);
  CHECK(ct_st_to_f32(t, out, 0, &err) == CT_OK);
  CHECK(ct_st_to_f32(t, out, 3, &err) == CT_ERR_SHAPE);
  CHECK(ct_st_find(f, "nope") == NULL);

  CHECK(f->nmeta == 2);
  CHECK(ct_st_meta(f, "format") && !strcmp(ct_st_meta(f, "format"), "pt"));
  const char *v = ct_st_meta(f, "tricky \"key\"\n\t\\");
  CHECK(v && !strcmp(v, "v\xC3\xA4lue\x01 \xF0\x9F\x98\x80"));
  CHECK(ct_st_meta(f, "absent") == NULL);
  ct_st_close(f);
  ct_st_close(NULL);

  /* An empty writer produces a valid file with no tensors. */
  REQUIRE(ct_st_writer_new(&w) == CT_OK);
  REQUIRE(ct_st_writer_write(w, tmp_path("empty.safetensors"), &err) == CT_OK);
  ct_st_writer_free(w);
  REQUIRE(ct_st_open(tmp_path("empty.safetensors"), &f, &err) == CT_OK);
  CHECK(f->ntensors == 0 && f->nmeta == 0);
  ct_st_close(f);
}

static ct_status write_one(const char *path, float val, ct_err *err) {
  ct_st_writer *w = NULL;
  int64_t shape[1] = {1};
  ct_status st = ct_st_writer_new(&w);
  if (!st) st = ct_st_writer_add_f32(w, "v", 1, shape, &val, CT_DTYPE_F32, err);
  if (!st) st = ct_st_writer_write(w, path, err);
  ct_st_writer_free(w);
  return st;
}

static float read_one(const char *path) {
  ct_st_file *f = NULL;
  float v = NAN;
  if (ct_st_open(path, &f, NULL) == CT_OK) {
    const ct_st_tensor *t = ct_st_find(f, "v");
    if (t) ct_st_to_f32(t, &v, 1, NULL);
    ct_st_close(f);
  }
  return v;
}

CT_TEST(safetensors, atomic_write) {
  ct_err err = {0};
  const char *path = tmp_path("atomic.safetensors");
  REQUIRE(write_one(path, 1.0f, &err) == CT_OK);
  CHECK(read_one(path) == 1.0f);
  /* Overwrite replaces the content. */
  REQUIRE(write_one(path, 2.0f, &err) == CT_OK);
  CHECK(read_one(path) == 2.0f);
  CHECK(count_tmp_files(ct_test_tmpdir()) == 0);
  /* Directory that does not exist: error naming the path, nothing created. */
  const char *nodir = tmp_path("no/such/dir/x.safetensors");
  CHECK(write_one(nodir, 3.0f, &err) == CT_ERR_IO);
  CHECKF(strstr(err.msg, "cannot create") && strstr(err.msg, nodir), "%s", err.msg);
  /* Target is a directory: the rename fails, the temp file is removed and the
   * directory is untouched. */
  const char *dirpath = tmp_path("adir.safetensors");
  REQUIRE(mkdir(dirpath, 0755) == 0);
  CHECK(write_one(dirpath, 4.0f, &err) == CT_ERR_IO);
  CHECKF(strstr(err.msg, "cannot rename") != NULL, "%s", err.msg);
  struct stat sb;
  CHECK(stat(dirpath, &sb) == 0 && S_ISDIR(sb.st_mode));
  CHECK(count_tmp_files(ct_test_tmpdir()) == 0);
  rmdir(dirpath);
  /* A file in the working directory (no slash in the path). */
  char cwd[1024];
  REQUIRE(getcwd(cwd, sizeof cwd));
  REQUIRE(chdir(ct_test_tmpdir()) == 0);
  CHECK(write_one("plain.safetensors", 5.0f, &err) == CT_OK);
  CHECK(read_one("plain.safetensors") == 5.0f);
  REQUIRE(chdir(cwd) == 0);
  CHECK(read_one(path) == 2.0f);
}

/* The committed file written by tests/data/gen_st_python.py (numpy + torch). */
CT_TEST(safetensors, python_written_file) {
  ct_st_file *f = NULL;
  ct_err err = {0};
  REQUIRE(ct_st_open(ct_test_data("st_python.safetensors"), &f, &err) == CT_OK);
  CHECK(f->ntensors == 6);
  CHECK(ct_st_meta(f, "format") && !strcmp(ct_st_meta(f, "format"), "pt"));
  const char *note = ct_st_meta(f, "note");
  CHECK(note && !strcmp(note, "caf\xC3\xA9 \"quoted\"\n\xF0\x9F\x98\x80"));
  const ct_st_tensor *t32 = ct_st_find(f, "weights.f32");
  const ct_st_tensor *t16 = ct_st_find(f, "weights.f16");
  const ct_st_tensor *tb = ct_st_find(f, "weights.bf16");
  const ct_st_tensor *ti = ct_st_find(f, "ids.i64");
  REQUIRE(t32 && t16 && tb && ti);
  CHECK(t32->dtype == CT_DTYPE_F32 && t32->ndim == 2 && t32->shape[0] == 8 && t32->numel == 64);
  CHECK(t16->dtype == CT_DTYPE_F16 && t16->ndim == 1 && t16->numel == 64);
  CHECK(tb->dtype == CT_DTYPE_BF16 && tb->ndim == 2 && tb->shape[1] == 16 && tb->numel == 64);
  CHECK(ti->dtype == CT_DTYPE_I64 && ti->numel == 3);
  /* Sorted by offset: the data was written in reverse name order. */
  CHECK(!strcmp(f->tensors[0].name, "scalar"));
  for (size_t i = 1; i < f->ntensors; i++) CHECK(f->tensors[i].begin >= f->tensors[i - 1].begin);
  float src[64], h[64], b[64];
  REQUIRE(ct_st_to_f32(t32, src, 64, &err) == CT_OK);
  REQUIRE(ct_st_to_f32(t16, h, 64, &err) == CT_OK);
  REQUIRE(ct_st_to_f32(tb, b, 64, &err) == CT_OK);
  CHECK(src[2] == 1.0f && src[3] == -2.5f && isnan(src[19]));
  /* numpy's float16 and torch's bfloat16 rounding agree with ours, bit for bit. */
  const unsigned char *p16 = t16->data, *pb = tb->data;
  int mism16 = 0, mismb = 0;
  for (int i = 0; i < 64; i++) {
    uint16_t want16 = (uint16_t)(p16[2 * i] | p16[2 * i + 1] << 8);
    uint16_t wantb = (uint16_t)(pb[2 * i] | pb[2 * i + 1] << 8);
    if (isnan(src[i])) {
      CHECK(isnan(h[i]) && isnan(b[i]));
      continue;
    }
    if (ct_f32_to_f16(src[i]) != want16) {
      mism16++;
      fprintf(stderr, "  f16 %d: %a -> ours %04x numpy %04x\n", i, src[i], ct_f32_to_f16(src[i]),
              want16);
    }
    if (ct_f32_to_bf16(src[i]) != wantb) {
      mismb++;
      fprintf(stderr, "  bf16 %d: %a -> ours %04x torch %04x\n", i, src[i], ct_f32_to_bf16(src[i]),
              wantb);
    }
    if (fbits(h[i]) != fbits(ct_f16_to_f32(want16))) mism16++;
    if (fbits(b[i]) != fbits(ct_bf16_to_f32(wantb))) mismb++;
  }
  CHECK(mism16 == 0);
  CHECK(mismb == 0);
  CHECK(h[6] == 65504.0f && isinf(h[8]) && h[12] == 0x1p-24f && h[13] == 0.0f);
  int64_t ids[3];
  memcpy(ids, ti->data, sizeof ids);
  CHECK(ids[0] == 1 && ids[1] == -2 && ids[2] == 3);
  float tmp[3];
  CHECK(ct_st_to_f32(ti, tmp, 3, &err) == CT_ERR_UNSUPPORTED);
  CHECK(strstr(err.msg, "I64") != NULL);
  const ct_st_tensor *sc = ct_st_find(f, "scalar");
  REQUIRE(sc);
  CHECK(sc->ndim == 0 && ct_st_to_f32(sc, tmp, 1, &err) == CT_OK && tmp[0] == 42.5f);
  ct_st_close(f);
}

/* Build "u64 header length | header | data_size zero bytes" in an exact-size buffer. */
static unsigned char *make_st(const char *header, uint64_t claimed_len, size_t data_size,
                              size_t *size) {
  size_t hl = strlen(header);
  *size = 8 + hl + data_size;
  unsigned char *buf = calloc(1, *size);
  if (!buf) return NULL;
  uint64_t L = claimed_len == UINT64_MAX ? hl : claimed_len;
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(L >> (8 * i));
  memcpy(buf + 8, header, hl);
  return buf;
}

typedef struct bad_case {
  const char *header;
  size_t data_size;
  const char *want;
} bad_case;

#define T(dt, shape, b, e) \
  "{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" b "," e "]}"

CT_TEST(safetensors, malformed_headers) {
  static const bad_case cases[] = {
      {"{\"x.weight\":" T("F32", "[1024]", "0", "4096") "}", 2048,
       "<memory>: tensor 'x.weight': data_offsets [0, 4096] end past the data section (2048 "
       "bytes)"},
      {"{\"a\":" T("F32", "[4]", "0", "16") ",\"b\":" T("F32", "[4]", "8", "24") "}", 24,
       "<memory>: tensors 'a' [0, 16] and 'b' [8, 24] overlap"},
      {"{\"b\":" T("F32", "[4]", "8", "24") ",\"a\":" T("F32", "[4]", "0", "16") "}", 24,
       "tensors 'a' [0, 16] and 'b' [8, 24] overlap"},
      {"{\"a\":" T("F32", "[8]", "0", "32") ",\"m\":" T("F32", "[1]", "4", "8") ",\"z\":" T(
           "F32", "[1]", "32", "36") "}",
       36, "tensors 'a' [0, 32] and 'm' [4, 8] overlap"},
      {"{\"w\":" T("F32", "[2, \"3\"]", "0", "24") "}", 24,
       "<memory>: tensor 'w': shape entry 1 is not a non-negative integer"},
      {"{\"w\":" T("F32", "[-1, 4]", "0", "16") "}", 16,
       "tensor 'w': shape entry 0 is not a non-negative integer"},
      {"{\"w\":" T("F32", "[2.0]", "0", "8") "}", 8, "shape entry 0 is not a non-negative integer"},
      {"{\"w\":" T("F32", "[null]", "0", "4") "}", 4, "shape entry 0 is not a non-negative"},
      {"{\"w\":" T("F32", "[3, 4]", "0", "40") "}", 48,
       "<memory>: tensor 'w': F32 shape [3, 4] needs 48 bytes but data_offsets span 40"},
      {"{\"w\":" T("BF16", "[3]", "0", "4") "}", 8,
       "BF16 shape [3] needs 6 bytes but data_offsets span 4"},
      {"{\"w\":" T("F32", "[4294967296, 4294967296, 16]", "0", "8") "}", 8,
       "tensor 'w': F32 shape [4294967296, 4294967296, 16] is too large (size overflows)"},
      {"{\"w\":" T("F32", "[1,1,1,1,1,1,1,1,1]", "0", "4") "}", 4,
       "shape has 9 dimensions; at most 8"},
      {"{\"w\":" T("F8_E4M3", "[4]", "0", "4") "}", 4,
       "<memory>: tensor 'w': unknown or unsupported dtype 'F8_E4M3'"},
      {"{\"w\":{\"dtype\":\"F32\\u0000x\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
       "unknown or unsupported dtype 'F32'"},
      {"{\"w\":" T("F32", "[1]", "0", "4") ",\"w\":" T("F32", "[1]", "4", "8") "}", 8,
       "<memory>: tensor 'w' appears more than once in the header (duplicate key)"},
      {"{\"__metadata__\":{\"a\":1}}", 0,
       "<memory>: __metadata__ value for key 'a' is a number; it must be a string"},
      {"{\"__metadata__\":[\"a\"]}", 0, "__metadata__ is an array; it must be an object"},
      {"{\"__metadata__\":{\"a\":\"x\",\"a\":\"y\"}}", 0,
       "__metadata__ key 'a' appears more than once"},
      {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, "\"__metadata__\" appears 2 times"},
      {"{\"__metadata__\":{\"a\":\"x\\u0000y\"}}", 0, "contains U+0000"},
      {"[1, 2]", 0,
       "<memory>: header does not start with '{' (found '['); a safetensors header is "
       "a JSON object"},
      {" {}", 0, "header does not start with '{' (found ' ')"},
      {"", 0, "header does not start with '{' (the header is empty)"},
      {"{\"w\": }", 0, "<memory>: header JSON: line 1, column 7: unexpected '}'; expected a value"},
      {"{\"w\":1} x", 0, "header JSON: line 1, column 9: unexpected 'x' after the JSON value"},
      {"{\"w\":5}", 0, "<memory>: tensor 'w': entry is a number; it must be an object"},
      {"{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w': missing \"dtype\""},
      {"{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype is not a string"},
      {"{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor 'w': missing \"shape\""},
      {"{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}", 4,
       "shape is not an array"},
      {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'w': missing \"data_offsets\""},
      {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
       "data_offsets must be an array of two non-negative integers"},
      {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 8,
       "data_offsets must be an array of two non-negative integers"},
      {"{\"w\":" T("F32", "[1]", "8", "4") "}", 8, "data_offsets [8, 4] has begin after end"},
      {"{\"w\":" T("F32", "[1]", "18446744073709551612", "18446744073709551616") "}", 8,
       "data_offsets must be an array of two non-negative integers"},
      {"{\"a\\u0001b\":" T("F32", "[1]", "0", "8") "}", 8, "tensor 'a\\x01b': F32 shape [1]"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t size;
    unsigned char *buf = make_st(cases[i].header, UINT64_MAX, cases[i].data_size, &size);
    REQUIRE(buf);
    ct_st_file *f = (ct_st_file *)1;
    ct_err err = {0};
    ct_status st = ct_st_parse(buf, size, &f, &err);
    CHECKF(st != CT_OK && err.status == st, "case %zu: status %s", i, ct_status_name(st));
    CHECKF(f == NULL, "case %zu: out not cleared", i);
    CHECKF(strstr(err.msg, cases[i].want) != NULL, "case %zu:\n    got  '%s'\n    want '%s'", i,
           err.msg, cases[i].want);
    if (st == CT_OK) ct_st_close(f);
    free(buf);
  }
}

CT_TEST(safetensors, valid_edge_cases) {
  /* Empty tensors may share offsets with each other and sit inside others;
   * holes are allowed; trailing spaces after the JSON are fine. */
  const char *hdr =
      "{\"a\":" T("F32", "[4]", "0", "16") ",\"e1\":" T("F32", "[0]", "4", "4") ",\"e2\":" T(
          "BF16", "[0, 3]", "4", "4") ",\"b\":" T("U8", "[3]", "20",
                                                  "23") ",\"__metadata__\":{}}      ";
  size_t size;
  unsigned char *buf = make_st(hdr, UINT64_MAX, 23, &size);
  REQUIRE(buf);
  buf[8 + strlen(hdr) + 20] = 7;
  ct_st_file *f = NULL;
  ct_err err = {0};
  ct_status st = ct_st_parse(buf, size, &f, &err);
  CHECKF(st == CT_OK, "%s", err.msg);
  if (st == CT_OK) {
    CHECK(f->ntensors == 4 && f->nmeta == 0 && f->path == NULL);
    const ct_st_tensor *b = ct_st_find(f, "b");
    CHECK(b && b->dtype == CT_DTYPE_U8 && ((const unsigned char *)b->data)[0] == 7);
    CHECK(b && (const unsigned char *)b->data == buf + 8 + strlen(hdr) + 20);
    CHECK(ct_st_find(f, "e1") && ct_st_find(f, "e2") && ct_st_find(f, "a"));
    ct_st_close(f);
  }
  free(buf);
}

CT_TEST(safetensors, malformed_files) {
  ct_err err = {0};
  ct_st_file *f = NULL;
  /* Empty file. */
  const char *p = tmp_path("empty_file.safetensors");
  FILE *fp = fopen(p, "wb");
  REQUIRE(fp);
  fclose(fp);
  CHECK(ct_st_open(p, &f, &err) == CT_ERR_FORMAT && f == NULL);
  CHECKF(strstr(err.msg, p) == err.msg && strstr(err.msg, "file is empty (0 bytes)"), "%s",
         err.msg);
  /* 5 bytes. */
  p = tmp_path("five.safetensors");
  fp = fopen(p, "wb");
  REQUIRE(fp);
  fwrite("abcde", 1, 5, fp);
  fclose(fp);
  CHECK(ct_st_open(p, &f, &err) == CT_ERR_FORMAT);
  CHECKF(strstr(err.msg, ": file is 5 bytes, shorter than the 8-byte header length") != NULL, "%s",
         err.msg);
  /* Header length of 8 GB. */
  size_t size;
  unsigned char *buf = make_st("{}", 8589934592ull, 0, &size);
  REQUIRE(buf);
  p = tmp_path("huge_header.safetensors");
  fp = fopen(p, "wb");
  REQUIRE(fp);
  fwrite(buf, 1, size, fp);
  fclose(fp);
  free(buf);
  CHECK(ct_st_open(p, &f, &err) == CT_ERR_FORMAT);
  char want[700];
  snprintf(want, sizeof want, "%s: header length 8589934592 exceeds the 104857600-byte limit", p);
  CHECKF(!strcmp(err.msg, want), "%s", err.msg);
  /* Header length past the end of the file. */
  buf = make_st("{}", 1000, 0, &size);
  REQUIRE(buf);
  CHECK(ct_st_parse(buf, size, &f, &err) == CT_ERR_FORMAT);
  CHECKF(strstr(err.msg, "<memory>: header length 1000 runs past the end of the file (10 bytes)"),
         "%s", err.msg);
  free(buf);
  /* Missing file. */
  CHECK(ct_st_open(tmp_path("missing.safetensors"), &f, &err) == CT_ERR_NOT_FOUND);
  CHECK(strstr(err.msg, "cannot open") != NULL);
  /* A directory. */
  CHECK(ct_st_open(ct_test_tmpdir(), &f, &err) == CT_ERR_IO);
  CHECK(strstr(err.msg, "not a regular file") != NULL);
}

CT_TEST(safetensors, truncated_files) {
  /* Every truncation of a real file fails cleanly; most with the two messages below. */
  ct_err err = {0};
  ct_st_file *f = NULL;
  const char *path = ct_test_data("st_python.safetensors");
  FILE *fp = fopen(path, "rb");
  REQUIRE(fp);
  unsigned char whole[4096];
  size_t n = fread(whole, 1, sizeof whole, fp);
  fclose(fp);
  REQUIRE(n > 100 && n < sizeof whole);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | whole[i];
  for (size_t len = 0; len < n; len++) {
    unsigned char *buf = malloc(len ? len : 1);
    REQUIRE(buf);
    memcpy(buf, whole, len);
    ct_status st = ct_st_parse(buf, len, &f, &err);
    CHECKF(st == CT_ERR_FORMAT, "length %zu: %s", len, ct_status_name(st));
    if (st == CT_OK) ct_st_close(f);
    if (len >= 8 && len < 8 + hl) CHECK(strstr(err.msg, "runs past the end of the file"));
    if (len >= 8 + hl) CHECK(strstr(err.msg, "end past the data section"));
    free(buf);
  }
  /* And through ct_st_open on a truncated copy. */
  const char *tp = tmp_path("truncated.safetensors");
  fp = fopen(tp, "wb");
  REQUIRE(fp);
  fwrite(whole, 1, n - 10, fp);
  fclose(fp);
  CHECK(ct_st_open(tp, &f, &err) == CT_ERR_FORMAT);
  CHECKF(strstr(err.msg, tp) == err.msg && strstr(err.msg, "end past the data section"), "%s",
         err.msg);
}

CT_TEST(safetensors, dtype_names) {
  ct_dtype d;
  CHECK(ct_dtype_parse("BF16", &d) == 0 && d == CT_DTYPE_BF16);
  CHECK(ct_dtype_parse("bf16", &d) == -1);
  CHECK(ct_dtype_parse("F8_E5M2", &d) == -1);
  CHECK(!strcmp(ct_dtype_name(CT_DTYPE_I64), "I64"));
  CHECK(ct_dtype_size(CT_DTYPE_F64) == 8 && ct_dtype_size(CT_DTYPE_BOOL) == 1);
  CHECK(ct_dtype_size(CT_DTYPE_F16) == 2 && ct_dtype_size(CT_DTYPE_COUNT) == 0);
}

/* ct_st_set: one file, a directory's file, shards behind an index (checked
 * both ways); ct_st_check: the one error with every problem. */
static int write_pair(const char *path, const char *name, const char *name2, ct_err *err) {
  ct_st_writer *w = NULL;
  float v[6] = {1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3};
  if (ct_st_writer_new(&w)) return 0;
  int ok = !ct_st_writer_add_f32(w, name, 2, shape, v, CT_DTYPE_BF16, err) &&
           (!name2 || !ct_st_writer_add_f32(w, name2, 1, shape, v, CT_DTYPE_F32, err)) &&
           !ct_st_writer_write(w, path, err);
  ct_st_writer_free(w);
  return ok;
}

static int write_str(const char *path, const char *s) {
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  fputs(s, f);
  return fclose(f) == 0;
}

CT_TEST(safetensors, set_and_check) {
  ct_err err = {0};
  char dir[2048], p[4096];
  ct_st_set s;
  const char *file = NULL;
  snprintf(dir, sizeof dir, "%s/st_set", ct_test_tmpdir());
  mkdir(dir, 0755);
  /* no file at all, then one model.safetensors */
  ct_status st = ct_st_set_open(&s, dir, "model.safetensors", &err);
  CHECKF(st == CT_ERR_NOT_FOUND && strstr(err.msg, "neither model.safetensors nor"), "%s", err.msg);
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  REQUIRE(write_pair(p, "a.weight", "a.bias", &err));
  REQUIRE(!ct_st_set_open(&s, dir, "model.safetensors", &err));
  CHECK(s.nf == 1 && ct_st_set_find(&s, "a.bias", &file) && !strcmp(file, "model.safetensors"));
  ct_st_set_close(&s);
  REQUIRE(!ct_st_set_open(&s, p, "ignored", &err)); /* a file path */
  CHECK(s.nf == 1 && ct_st_set_find(&s, "a.weight", NULL) && !ct_st_set_find(&s, "x", NULL));
  /* the report: one missing, one misshaped (BF16 [2, 3] for [3, 2]), one unexpected */
  ct_st_check *c = NULL;
  REQUIRE(!ct_st_check_new(&c, &err));
  int64_t want[2] = {3, 2};
  CHECK(!ct_st_check_tensor(c, ct_st_set_find(&s, "b.weight", NULL), "b.weight", NULL, 2, want));
  const ct_st_tensor *t = ct_st_set_find(&s, "a.weight", &file);
  CHECK(t && !strcmp(file, p)); /* one file by path: named by its path */
  CHECK(!ct_st_check_tensor(c, t, "a.weight", "model.safetensors", 2, want));
  want[0] = 2, want[1] = 3;
  CHECK(ct_st_check_tensor(c, ct_st_set_find(&s, "a.weight", NULL), "a.weight", NULL, 2, want));
  ct_st_check_unexpected(c, "a.bias", "model.safetensors");
  CHECK(ct_st_check_count(c) == 3);
  st = ct_st_check_done(c, &err, "%s is not %s", "X", "Y");
  CHECKF(st == CT_ERR_SHAPE &&
             !strcmp(err.msg,
                     "X is not Y: 1 missing [b.weight]; 1 wrongly shaped [a.weight in "
                     "model.safetensors (has BF16 [2, 3], needs F32/F16/BF16 [3, 2])]; "
                     "1 unexpected [a.bias in model.safetensors]"),
         "%s", err.msg);
  REQUIRE(!ct_st_check_new(&c, &err));
  CHECK(ct_st_check_done(c, &err, "nothing") == CT_OK);
  ct_st_set_close(&s);
  /* shards: the index wins over model.safetensors; both directions checked */
  snprintf(p, sizeof p, "%s/m-1.safetensors", dir);
  REQUIRE(write_pair(p, "a.weight", NULL, &err));
  snprintf(p, sizeof p, "%s/m-2.safetensors", dir);
  REQUIRE(write_pair(p, "b.weight", NULL, &err));
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  REQUIRE(write_str(p,
                    "{\"weight_map\": {\"a.weight\": \"m-1.safetensors\", \"b.weight\": "
                    "\"m-2.safetensors\"}}"));
  REQUIRE(!ct_st_set_open(&s, dir, "model.safetensors", &err));
  CHECK(s.nf == 2 && ct_st_set_find(&s, "b.weight", &file) && !strcmp(file, "m-2.safetensors"));
  ct_st_set_close(&s);
  REQUIRE(write_str(p, "{\"weight_map\": {\"a.weight\": \"model.safetensors\"}}"));
  st = ct_st_set_open(&s, dir, "model.safetensors", &err);
  CHECKF(st == CT_ERR_FORMAT && strstr(err.msg, "a.bias of model.safetensors is not in the"), "%s",
         st ? err.msg : "accepted");
  REQUIRE(write_str(p,
                    "{\"weight_map\": {\"a.weight\": \"m-2.safetensors\", \"b.weight\": "
                    "\"m-2.safetensors\"}}"));
  st = ct_st_set_open(&s, dir, "model.safetensors", &err);
  CHECKF(st == CT_ERR_FORMAT && strstr(err.msg, "puts a.weight in m-2.safetensors"), "%s",
         st ? err.msg : "accepted");
  REQUIRE(write_str(p, "{\"weight_map\": {\"a.weight\": \"../m-1.safetensors\"}}"));
  st = ct_st_set_open(&s, dir, "model.safetensors", &err);
  CHECKF(st == CT_ERR_FORMAT && strstr(err.msg, "inside"), "%s", st ? err.msg : "accepted");
  snprintf(p, sizeof p, "%s/nope", dir);
  st = ct_st_set_open(&s, p, "model.safetensors", &err);
  CHECKF(st == CT_ERR_NOT_FOUND && strstr(err.msg, "does not download"), "%s", err.msg);
}

/* A writer with a reader (a compute backend's copy_out) reads the data
 * through it in chunks and writes the very bytes a host-memory writer does,
 * for float32 and narrowed dtypes, across the 8 MiB chunk boundary. */
static size_t reader_calls;
static void reader(void *dst, const void *src, size_t bytes) {
  reader_calls++;
  memcpy(dst, src, bytes);
}
CT_TEST(safetensors, writer_reader) {
  const size_t n = ((size_t)8 << 20) / sizeof(float) + 1000; /* two chunks */
  float *x = malloc(n * sizeof *x);
  REQUIRE(x != NULL);
  for (size_t i = 0; i < n; i++) x[i] = (float)i * 0.37f - 1000.0f;
  const int64_t shape[1] = {(int64_t)n};
  char *bytes[2] = {NULL, NULL};
  size_t len[2] = {0, 0};
  ct_err err = {0};
  for (int k = 0; k < 2; k++) {
    ct_st_writer *w;
    REQUIRE(ct_st_writer_new(&w) == CT_OK);
    if (k) ct_st_writer_set_reader(w, reader);
    CHECK(ct_st_writer_add_f32(w, "a", 1, shape, x, CT_DTYPE_F32, &err) == CT_OK);
    CHECK(ct_st_writer_add_f32(w, "b", 1, shape, x, CT_DTYPE_BF16, &err) == CT_OK);
    CHECK(ct_st_writer_add_f32(w, "c", 1, shape, x, CT_DTYPE_F16, &err) == CT_OK);
    const char *path = tmp_path(k ? "reader.safetensors" : "plain.safetensors");
    REQUIRE(ct_st_writer_write(w, path, &err) == CT_OK);
    ct_st_writer_free(w);
    REQUIRE(ct_read_file(path, (size_t)1 << 28, &bytes[k], &len[k], &err) == CT_OK);
  }
  CHECK(reader_calls == 6 && len[0] == len[1] && !memcmp(bytes[0], bytes[1], len[0]));
  free(bytes[0]);
  free(bytes[1]);
  free(x);
}

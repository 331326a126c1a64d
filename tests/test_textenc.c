/* Text encoder tests: parity with the plain-torch CLIP reference
 * (scripts/textenc_golden.py), the seeded init keeps captions apart, load/save
 * and its one-error-lists-all message, encode argument errors, the byte
 * tokenizer, thread-count independence and speed. */
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/parallel.h"
#include "ctuner/safetensors.h"
#include "ctuner/textenc.h"
#include "harness.h"

static int meta_int(const ct_st_file *f, const char *key) {
  const char *s = ct_st_meta(f, key);
  return s ? atoi(s) : -1;
}

/* max |a - b| / max |b|: the error relative to the reference's scale. */
static double rel_err(const float *a, const float *b, size_t n) {
  return ct_test_rel_err(a, b, n); /* NaN-aware */
}

static float *load_f32(const ct_st_file *f, const char *name, size_t n) {
  const ct_st_tensor *t = ct_st_find(f, name);
  if (!t || t->numel != n || t->dtype != CT_DTYPE_F32) return NULL;
  float *out = malloc(n * sizeof(float));
  memcpy(out, t->data, n * sizeof(float));
  return out;
}

CT_TEST(textenc, golden_parity) {
  const char *path = ct_test_data("textenc_golden.safetensors");
  ct_st_file *f = NULL;
  ct_err err = {0};
  REQUIRE(ct_st_open(path, &f, &err) == CT_OK);
  ct_textenc_config c;
  ct_textenc_config_default(meta_int(f, "hidden"), &c);
  c.vocab = meta_int(f, "vocab");
  c.max_pos = meta_int(f, "max_pos");
  c.heads = meta_int(f, "heads");
  c.layers = meta_int(f, "layers");
  c.intermediate = meta_int(f, "intermediate");
  int B = meta_int(f, "B"), T = meta_int(f, "T"), d = c.hidden;
  const ct_st_tensor *tid = ct_st_find(f, "input.ids");
  REQUIRE(tid && tid->dtype == CT_DTYPE_I32 && tid->numel == (size_t)B * T);
  const int32_t *ids = tid->data;
  float *seq_ref = load_f32(f, "output.seq", (size_t)B * T * d);
  float *pool_ref = load_f32(f, "output.pooled", (size_t)B * d);
  float *seq = malloc(sizeof(float) * B * T * d), *pool = malloc(sizeof(float) * B * d);
  ct_textenc *te = NULL;
  CHECK(seq_ref && pool_ref);
  /* The byte tokenizer gives the reference's ids for every caption. */
  for (int b = 0; b < B; b++) {
    char key[32];
    snprintf(key, sizeof key, "caption%d", b);
    const char *cap = ct_st_meta(f, key);
    if (!cap) continue;
    int32_t mine[64];
    ct_tokenize_bytes(cap, T, mine);
    CHECKF(!memcmp(mine, ids + (size_t)b * T, sizeof(int32_t) * T), "caption %d '%s'", b, cap);
  }
  if (!seq_ref || !pool_ref) goto out;
  CHECKF(ct_textenc_new(&c, 1, &te, &err) == CT_OK, "%s", err.msg);
  if (!te) goto out;
  CHECKF(ct_textenc_load(te, path, &err) == CT_OK, "%s", err.msg);
  CHECKF(ct_textenc_encode(te, ids, B, T, seq, pool, &err) == CT_OK, "%s", err.msg);
  double es = rel_err(seq, seq_ref, (size_t)B * T * d), ep = rel_err(pool, pool_ref, (size_t)B * d);
  fprintf(stderr, "  textenc golden: rel err seq %.2e pooled %.2e\n", es, ep);
  CHECK(es <= 1e-4);
  CHECK(ep <= 1e-4);
  /* Pooled only (seq = NULL) gives the same pooled vectors. */
  float *pool2 = malloc(sizeof(float) * B * d);
  CHECK(ct_textenc_encode(te, ids, B, T, NULL, pool2, &err) == CT_OK);
  CHECK(!memcmp(pool, pool2, sizeof(float) * B * d));
  free(pool2);
out:
  ct_textenc_free(te);
  free(seq_ref);
  free(pool_ref);
  free(seq);
  free(pool);
  ct_st_close(f);
}

static double cosine(const float *a, const float *b, int n) {
  double ab = 0, aa = 0, bb = 0;
  for (int i = 0; i < n; i++) {
    ab += (double)a[i] * b[i];
    aa += (double)a[i] * a[i];
    bb += (double)b[i] * b[i];
  }
  return ab / sqrt(aa * bb);
}

CT_TEST(textenc, seeded_captions_differ) {
  const char *caps[] = {"a red cube", "a blue sphere", "a red cubes", "two cats on a sofa", ""};
  enum { NC = 5, T = 32 };
  ct_textenc_config c;
  ct_textenc_config_default(128, &c);
  ct_textenc *te = NULL, *te2 = NULL;
  ct_err err = {0};
  REQUIRE(ct_textenc_new(&c, 42, &te, &err) == CT_OK);
  int32_t ids[NC * T];
  for (int i = 0; i < NC; i++) ct_tokenize_bytes(caps[i], T, ids + i * T);
  float pool[NC * 128], pool2[NC * 128];
  REQUIRE(ct_textenc_encode(te, ids, NC, T, NULL, pool, &err) == CT_OK);
  double worst = -1, mean = 0;
  for (int i = 0; i < NC; i++) {
    for (int j = 0; j < 128; j++) CHECK(isfinite(pool[i * 128 + j]));
    for (int k = i + 1; k < NC; k++) {
      double cs = cosine(pool + i * 128, pool + k * 128, 128);
      mean += cs / (NC * (NC - 1) / 2);
      worst = ct_test_max(worst, cs);
    }
  }
  fprintf(stderr,
          "  seeded init: pooled cosine between different captions: largest %.3f, mean %.3f\n",
          worst, mean);
  /* A collapsed encoder gives cosines near 1. The largest is "a red cube" vs
   * "a red cubes" (one byte apart, about 0.94); unrelated captions sit near 0.5. */
  CHECK(worst < 0.97);
  CHECK(mean < 0.75);
  /* Same seed, same weights; another seed, other weights. */
  REQUIRE(ct_textenc_new(&c, 42, &te2, &err) == CT_OK);
  REQUIRE(ct_textenc_encode(te2, ids, NC, T, NULL, pool2, &err) == CT_OK);
  CHECK(!memcmp(pool, pool2, sizeof pool));
  ct_textenc_free(te2);
  REQUIRE(ct_textenc_new(&c, 43, &te2, &err) == CT_OK);
  REQUIRE(ct_textenc_encode(te2, ids, NC, T, NULL, pool2, &err) == CT_OK);
  CHECK(memcmp(pool, pool2, sizeof pool) != 0);
  ct_textenc_free(te2);
  ct_textenc_free(te);
}

CT_TEST(textenc, thread_count_independent) {
  enum { B = 8, T = 24, D = 64 };
  ct_textenc_config c;
  ct_textenc_config_default(D, &c);
  ct_textenc *te = NULL;
  ct_err err = {0};
  REQUIRE(ct_textenc_new(&c, 7, &te, &err) == CT_OK);
  int32_t ids[B * T];
  for (int i = 0; i < B * T; i++) ids[i] = (i * 37 + 11) % CT_TOK_BYTE_VOCAB;
  float *a = malloc(sizeof(float) * B * T * D), *b = malloc(sizeof(float) * B * T * D);
  int nt = ct_threads_get();
  /* Same thread count: bit-identical. 1 vs 2 threads: OpenBLAS's SGEMM blocks
   * differently, so rounding-level agreement (as the MMDiT's test). */
  ct_threads_set(2);
  CHECK(ct_textenc_encode(te, ids, B, T, a, NULL, &err) == CT_OK);
  CHECK(ct_textenc_encode(te, ids, B, T, b, NULL, &err) == CT_OK);
  CHECK(!memcmp(a, b, sizeof(float) * B * T * D));
  ct_threads_set(1);
  CHECK(ct_textenc_encode(te, ids, B, T, b, NULL, &err) == CT_OK);
  ct_threads_set(nt);
  double e;
  e = ct_test_max_abs_err(a, b, (size_t)B * T * D);
  CHECKF(e <= 1e-5, "1 vs 2 threads: max diff %g", e);
  free(a);
  free(b);
  ct_textenc_free(te);
}

/* Repeated encodes of one batch (reused scratch) give bit-identical outputs. */
CT_TEST(textenc, repeat_encode_identical) {
  enum { B = 32, T = 32, D = 128 };
  ct_textenc_config c;
  ct_textenc_config_default(D, &c);
  ct_textenc *te = NULL;
  ct_err err = {0};
  REQUIRE(ct_textenc_new(&c, 1, &te, &err) == CT_OK);
  int32_t ids[B * T];
  for (int b = 0; b < B; b++) {
    char cap[64];
    snprintf(cap, sizeof cap, "caption number %d of the batch", b);
    ct_tokenize_bytes(cap, T, ids + b * T);
  }
  float *seq = malloc(sizeof(float) * B * T * D), *seq2 = malloc(sizeof(float) * B * T * D);
  float pool[B * D], pool2[B * D];
  REQUIRE(seq && seq2);
  REQUIRE(ct_textenc_encode(te, ids, B, T, seq, pool, &err) == CT_OK);
  for (int r = 0; r < 3; r++) {
    REQUIRE(ct_textenc_encode(te, ids, B, T, seq2, pool2, &err) == CT_OK);
    CHECK(!memcmp(seq, seq2, sizeof(float) * B * T * D));
    CHECK(!memcmp(pool, pool2, sizeof pool));
  }
  free(seq);
  free(seq2);
  ct_textenc_free(te);
}

CT_TEST(textenc, save_load_roundtrip) {
  ct_textenc_config c;
  ct_textenc_config_default(32, &c);
  c.max_pos = 16;
  ct_textenc *a = NULL, *b = NULL;
  ct_err err = {0};
  REQUIRE(ct_textenc_new(&c, 3, &a, &err) == CT_OK);
  REQUIRE(ct_textenc_new(&c, 4, &b, &err) == CT_OK);
  char path[512];
  snprintf(path, sizeof path, "%s/te_rt.safetensors", ct_test_tmpdir());
  CHECKF(ct_textenc_save(a, path, &err) == CT_OK, "%s", err.msg);
  CHECKF(ct_textenc_load(b, path, &err) == CT_OK, "%s", err.msg);
  int32_t ids[16];
  ct_tokenize_bytes("hello", 16, ids);
  float pa[16 * 32], pb[16 * 32];
  CHECK(ct_textenc_encode(a, ids, 1, 16, pa, NULL, &err) == CT_OK);
  CHECK(ct_textenc_encode(b, ids, 1, 16, pb, NULL, &err) == CT_OK);
  CHECK(!memcmp(pa, pb, sizeof pa));
  /* The saved file uses HF names with the prefix. */
  ct_st_file *f = NULL;
  REQUIRE(ct_st_open(path, &f, &err) == CT_OK);
  CHECK(ct_st_find(f, "text_model.encoder.layers.1.self_attn.k_proj.weight") != NULL);
  CHECK(ct_st_find(f, "text_model.final_layer_norm.bias") != NULL);
  CHECK(f->ntensors == 4 + 16 * 2);
  ct_st_close(f);
  ct_textenc_free(a);
  ct_textenc_free(b);
}

/* Write every parameter of a fresh encoder under `prefix`, as `dt`, with the
 * given name dropped / reshaped / added. */
static ct_status write_variant(const ct_textenc_config *c, const char *path, const char *prefix,
                               ct_dtype dt, const char *drop, const char *reshape, const char *add,
                               ct_err *err) {
  ct_textenc *te = NULL;
  ct_status st = ct_textenc_new(c, 9, &te, err);
  if (st) return st;
  char tmp[512];
  snprintf(tmp, sizeof tmp, "%s/te_tmp.safetensors", ct_test_tmpdir());
  st = ct_textenc_save(te, tmp, err);
  ct_st_file *f = NULL;
  ct_st_writer *w = NULL;
  float *copy = NULL, *buf = NULL;
  if (!st) st = ct_st_open(tmp, &f, err);
  if (!st) st = ct_st_writer_new(&w);
  if (!st) copy = buf = malloc(sizeof(float) * 100000); /* the small configs below fit */
  for (size_t i = 0; !st && i < f->ntensors; i++) {
    const ct_st_tensor *t = &f->tensors[i];
    const char *base = t->name + strlen("text_model.");
    if (drop && !strcmp(base, drop)) continue;
    char nm[160];
    snprintf(nm, sizeof nm, "%s%s", prefix, base);
    int64_t shape[2] = {t->shape[0], t->ndim > 1 ? t->shape[1] : 0};
    int ndim = t->ndim;
    memcpy(buf, t->data, t->numel * sizeof(float));
    if (reshape && !strcmp(base, reshape)) shape[0] -= 1;
    /* The writer borrows data until write: each tensor gets its own copy. */
    st = ct_st_writer_add_f32(w, nm, ndim, shape, buf, dt, err);
    buf += t->numel;
  }
  float one[4] = {1, 2, 3, 4};
  int64_t s4[1] = {4};
  char nm[160];
  if (!st && add) {
    snprintf(nm, sizeof nm, "%s%s", prefix, add);
    st = ct_st_writer_add_f32(w, nm, 1, s4, one, dt, err);
  }
  if (!st) st = ct_st_writer_write(w, path, err);
  ct_st_writer_free(w);
  ct_st_close(f);
  ct_textenc_free(te);
  free(copy);
  return st;
}

CT_TEST(textenc, load_formats_and_errors) {
  ct_textenc_config c;
  ct_textenc_config_default(16, &c);
  c.max_pos = 8;
  c.layers = 1;
  c.intermediate = 24;
  ct_textenc *te = NULL, *ref = NULL;
  ct_err err = {0};
  REQUIRE(ct_textenc_new(&c, 1, &te, &err) == CT_OK);
  REQUIRE(ct_textenc_new(&c, 9, &ref, &err) == CT_OK);
  char path[512];
  snprintf(path, sizeof path, "%s/te_var.safetensors", ct_test_tmpdir());
  int32_t ids[8];
  ct_tokenize_bytes("ab", 8, ids);
  float pr[16], pt[16];
  REQUIRE(ct_textenc_encode(ref, ids, 1, 8, NULL, pr, &err) == CT_OK);

  /* Without the prefix, F32: identical. */
  REQUIRE(write_variant(&c, path, "", CT_DTYPE_F32, NULL, NULL, NULL, &err) == CT_OK);
  CHECKF(ct_textenc_load(te, path, &err) == CT_OK, "%s", err.msg);
  CHECK(ct_textenc_encode(te, ids, 1, 8, NULL, pt, &err) == CT_OK);
  CHECK(!memcmp(pr, pt, sizeof pr));
  /* With the prefix, BF16 and F16: close. */
  ct_dtype dts[2] = {CT_DTYPE_BF16, CT_DTYPE_F16};
  for (int k = 0; k < 2; k++) {
    REQUIRE(write_variant(&c, path, "text_model.", dts[k], NULL, NULL, NULL, &err) == CT_OK);
    CHECKF(ct_textenc_load(te, path, &err) == CT_OK, "%s", err.msg);
    CHECK(ct_textenc_encode(te, ids, 1, 8, NULL, pt, &err) == CT_OK);
    double e;
    e = ct_test_max_abs_err(pt, pr, 16);
    CHECKF(e < 0.1 && e > 0, "%s max diff %g", ct_dtype_name(dts[k]), e);
  }
  /* The HF position_ids buffer is accepted and ignored. */
  REQUIRE(write_variant(&c, path, "text_model.", CT_DTYPE_F32, NULL, NULL,
                        "embeddings.position_ids", &err) == CT_OK);
  CHECKF(ct_textenc_load(te, path, &err) == CT_OK, "%s", err.msg);
  /* Missing + wrong shape + unexpected: one error naming all three. */
  REQUIRE(write_variant(&c, path, "text_model.", CT_DTYPE_F32, "encoder.layers.0.mlp.fc2.bias",
                        "embeddings.position_embedding.weight", "encoder.layers.0.extra.weight",
                        &err) == CT_OK);
  ct_status st = ct_textenc_load(te, path, &err);
  CHECK(st == CT_ERR_SHAPE);
  CHECKF(strstr(err.msg, "1 missing [encoder.layers.0.mlp.fc2.bias]") != NULL, "%s", err.msg);
  CHECKF(strstr(err.msg,
                "1 wrongly shaped [embeddings.position_embedding.weight (has F32 [7, 16], needs "
                "F32/F16/BF16 [8, 16])]") != NULL,
         "%s", err.msg);
  CHECKF(strstr(err.msg, "1 unexpected [text_model.encoder.layers.0.extra.weight]") != NULL, "%s",
         err.msg);
  /* A failed load leaves the weights untouched. */
  CHECK(ct_textenc_encode(te, ids, 1, 8, NULL, pt, &err) == CT_OK);
  CHECK(!memcmp(pr, pt, sizeof pr));
  /* A config that does not match (2 layers) lists every missing tensor. */
  ct_textenc *te2 = NULL;
  c.layers = 2;
  REQUIRE(ct_textenc_new(&c, 1, &te2, &err) == CT_OK);
  REQUIRE(write_variant(&c, path, "", CT_DTYPE_F32, NULL, NULL, NULL, &err) == CT_OK);
  c.layers = 1;
  ct_textenc_free(te2);
  te2 = NULL;
  REQUIRE(ct_textenc_new(&c, 1, &te2, &err) == CT_OK);
  CHECK(ct_textenc_load(te2, path, &err) == CT_ERR_SHAPE);
  CHECKF(strstr(err.msg, "16 unexpected") != NULL, "%s", err.msg);
  CHECK(ct_textenc_load(te2, "/nonexistent/x.safetensors", &err) != CT_OK);
  ct_textenc_free(te2);
  ct_textenc_free(te);
  ct_textenc_free(ref);
}

CT_TEST(textenc, config_and_encode_errors) {
  ct_textenc_config c;
  ct_textenc_config_default(128, &c);
  CHECK(c.vocab == 259 && c.max_pos == 77 && c.heads == 2 && c.layers == 2 &&
        c.intermediate == 512);
  ct_textenc_config_default(48, &c);
  CHECK(c.heads == 1);
  ct_textenc_config_default(200, &c); /* 200/64 = 3 does not divide 200 */
  CHECK(c.heads == 2 && 200 % c.heads == 0);
  ct_err err = {0};
  CHECK(ct_textenc_config_validate(&c, &err) == CT_OK);
  c.heads = 3;
  CHECK(ct_textenc_config_validate(&c, &err) == CT_ERR_INVALID);
  CHECK(strstr(err.msg, "heads") != NULL);
  ct_textenc *te = NULL;
  CHECK(ct_textenc_new(&c, 1, &te, &err) == CT_ERR_INVALID && te == NULL);
  ct_textenc_config_default(16, &c);
  c.max_pos = 8;
  REQUIRE(ct_textenc_new(&c, 1, &te, &err) == CT_OK);
  int32_t ids[9] = {256, 1, 2, 257, 258, 258, 258, 258, 258};
  float out[9 * 16];
  CHECK(ct_textenc_encode(te, ids, 1, 9, out, NULL, &err) == CT_ERR_RANGE);
  CHECK(strstr(err.msg, "max_pos") != NULL);
  ids[2] = 259;
  CHECK(ct_textenc_encode(te, ids, 1, 8, out, NULL, &err) == CT_ERR_RANGE);
  CHECKF(strstr(err.msg, "259 at caption 0 position 2") != NULL, "%s", err.msg);
  ids[2] = -1;
  CHECK(ct_textenc_encode(te, ids, 1, 8, out, NULL, &err) == CT_ERR_RANGE);
  CHECK(ct_textenc_encode(te, ids, 0, 8, out, NULL, &err) == CT_ERR_RANGE);
  ct_textenc_free(te);
}

CT_TEST(textenc, pooled_at_first_eos_or_last) {
  ct_textenc_config c;
  ct_textenc_config_default(16, &c);
  c.max_pos = 8;
  ct_textenc *te = NULL;
  ct_err err = {0};
  REQUIRE(ct_textenc_new(&c, 5, &te, &err) == CT_OK);
  int32_t ids[16] = {256, 65, 257, 257, 258, 258, 258, 258, /* EOS twice: first wins */
                     256, 65, 66,  67,  68,  69,  70,  71}; /* no EOS: last position */
  float seq[16 * 16], pool[2 * 16];
  REQUIRE(ct_textenc_encode(te, ids, 2, 8, seq, pool, &err) == CT_OK);
  CHECK(!memcmp(pool, seq + 2 * 16, sizeof(float) * 16));
  CHECK(!memcmp(pool + 16, seq + 15 * 16, sizeof(float) * 16));
  ct_textenc_free(te);
}

CT_TEST(textenc, tokenizer_bytes) {
  int32_t ids[8];
  CHECK(ct_tokenize_bytes("ab", 8, ids) == 4);
  int32_t want[8] = {CT_TOK_BOS, 'a',        'b',        CT_TOK_EOS,
                     CT_TOK_PAD, CT_TOK_PAD, CT_TOK_PAD, CT_TOK_PAD};
  CHECK(!memcmp(ids, want, sizeof want));
  /* Empty and NULL: BOS EOS PAD... */
  CHECK(ct_tokenize_bytes("", 4, ids) == 2);
  CHECK(ids[0] == CT_TOK_BOS && ids[1] == CT_TOK_EOS && ids[2] == CT_TOK_PAD &&
        ids[3] == CT_TOK_PAD);
  CHECK(ct_tokenize_bytes(NULL, 3, ids) == 2 && ids[2] == CT_TOK_PAD);
  /* Exactly fitting: no PAD. Too long: truncated, EOS last. */
  CHECK(ct_tokenize_bytes("abcd", 6, ids) == 6 && ids[4] == 'd' && ids[5] == CT_TOK_EOS);
  CHECK(ct_tokenize_bytes("abcdefgh", 6, ids) == 6);
  int32_t trunc[6] = {CT_TOK_BOS, 'a', 'b', 'c', 'd', CT_TOK_EOS};
  CHECK(!memcmp(ids, trunc, sizeof trunc));
  CHECK(ct_tokenize_bytes("abc", 2, ids) == 2 && ids[0] == CT_TOK_BOS && ids[1] == CT_TOK_EOS);
  /* UTF-8: "é☕" is C3 A9 E2 98 95, ids are the bytes (0-255, never negative). */
  CHECK(ct_tokenize_bytes("\xc3\xa9\xe2\x98\x95", 8, ids) == 7);
  int32_t utf[7] = {CT_TOK_BOS, 0xC3, 0xA9, 0xE2, 0x98, 0x95, CT_TOK_EOS};
  CHECK(!memcmp(ids, utf, sizeof utf) && ids[7] == CT_TOK_PAD);
  /* Byte ids are below BOS for every byte value. */
  char all[256];
  for (int i = 0; i < 255; i++) all[i] = (char)(i + 1);
  all[255] = 0;
  int32_t big[260];
  CHECK(ct_tokenize_bytes(all, 260, big) == 257);
  for (int i = 1; i < 256; i++) CHECK(big[i] == i);
  CHECK(big[256] == CT_TOK_EOS && big[257] == CT_TOK_PAD);
}

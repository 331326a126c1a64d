/* T5 tests: the SentencePiece Unigram tokenizer read from spiece.model and
 * from tokenizer.json against transformers' T5TokenizerFast on 1,322 captions
 * (tests/data/t5/tok_golden.json, scripts/t5_golden.py), padding and
 * truncation as FluxPipeline calls it, relative position buckets against
 * HF's _relative_position_bucket, the encoder against T5EncoderModel (bf16
 * sharded checkpoint), and refusals of bad input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/bf16.h"
#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/kernels.h"
#include "ctuner/safetensors.h"
#include "ctuner/t5.h"
#include "harness.h"

/* The data directory: tests/data/t5, or CT_T5_DATA (make interop points it at
 * a fresh set written by scripts/t5_golden.py --seed N). */
static const char *t5_data(const char *name) {
  static char buf[8][1024];
  static int k;
  const char *dir = getenv("CT_T5_DATA");
  char *b = buf[k++ % 8];
  snprintf(b, sizeof buf[0], "%s/%s", dir && dir[0] ? dir : ct_test_data("t5"), name);
  return b;
}

static ct_json *golden(void) {
  ct_json *j = NULL;
  ct_err err = {0};
  if (ct_json_parse_file(t5_data("tok_golden.json"), 16u << 20, &j, &err)) {
    fprintf(stderr, "  %s\n", err.msg);
    return NULL;
  }
  return j;
}

/* Every caption's ids (with </s>) equal T5TokenizerFast's; returns mismatches. */
static int check_ids(const ct_spm *s, const ct_json *g, const char *what) {
  const ct_json *caps = ct_json_get(g, "captions"), *ids = ct_json_get(g, "ids");
  int bad = 0;
  int32_t *buf = malloc(4096 * sizeof *buf);
  for (size_t i = 0; i < caps->n; i++) {
    int n = 0;
    ct_err err = {0};
    const ct_json *want = &ids->items[i];
    int ok = ct_spm_tokens(s, caps->items[i].str, buf, 4095, &n, &err) == CT_OK && n < 4095;
    buf[n] = ct_spm_eos(s);
    ok = ok && (size_t)n + 1 == want->n;
    for (size_t k = 0; ok && k < want->n; k++) ok = buf[k] == want->items[k].i64;
    if (!ok && bad++ < 5) {
      fprintf(stderr, "  %s: caption %zu \"%.60s\": %d tokens, want %zu:", what, i,
              caps->items[i].str, n + 1, want->n);
      for (int k = 0; k <= n && k < 24; k++) fprintf(stderr, " %d", buf[k]);
      fprintf(stderr, " | want");
      for (size_t k = 0; k < want->n && k < 24; k++)
        fprintf(stderr, " %d", (int)want->items[k].i64);
      fprintf(stderr, "\n");
    }
  }
  free(buf);
  return bad;
}

CT_TEST(t5, tokenizer_json_matches_transformers) {
  ct_json *g = golden();
  REQUIRE(g);
  ct_spm *s = NULL;
  ct_err err = {0};
  REQUIRE(ct_spm_load_json(t5_data("tokenizer_2/tokenizer.json"), &s, &err) == CT_OK);
  CHECK(ct_spm_eos(s) == 1 && ct_spm_pad(s) == 0 && ct_spm_unk(s) == 2);
  int V = ct_spm_vocab_size(s);
  CHECK(ct_spm_piece_id(s, "<extra_id_0>") == V - 1 &&
        ct_spm_piece_id(s, "<extra_id_99>") == V - 100);
  int bad = check_ids(s, g, "tokenizer.json");
  CHECKF(bad == 0, "%d of %zu captions differ from T5TokenizerFast", bad,
         ct_json_get(g, "captions")->n);
  ct_spm_free(s);
  ct_json_free(g);
}

CT_TEST(t5, spiece_model_matches_transformers) {
  ct_json *g = golden();
  REQUIRE(g);
  ct_spm *s = NULL;
  ct_err err = {0};
  REQUIRE(ct_spm_load_model(t5_data("tokenizer_2/spiece.model"), &s, &err) == CT_OK);
  CHECK(ct_spm_eos(s) == 1 && ct_spm_pad(s) == 0 && ct_spm_unk(s) == 2);
  CHECK(ct_spm_piece_id(s, "<extra_id_0>") == ct_spm_vocab_size(s) - 1);
  int bad = check_ids(s, g, "spiece.model");
  CHECKF(bad == 0, "%d of %zu captions differ from T5TokenizerFast", bad,
         ct_json_get(g, "captions")->n);
  ct_spm_free(s);
  ct_json_free(g);
}

/* An older tokenizer.json layout (no charsmap; Replace " {2,}" by " ", Strip
 * both sides, WhitespaceSplit then Metaspace with add_prefix_space) written by
 * the tokenizers library, on the first 300 captions. */
CT_TEST(t5, tokenizer_json_variant) {
  ct_json *g = golden();
  REQUIRE(g);
  ct_spm *s = NULL;
  ct_err err = {0};
  REQUIRE(ct_spm_load_json(t5_data("tokenizer_variant.json"), &s, &err) == CT_OK);
  const ct_json *caps = ct_json_get(g, "captions"), *want = ct_json_get(g, "variant_ids");
  REQUIRE(want && want->n == 300);
  int bad = 0, n = 0;
  int32_t ids[4096];
  for (size_t i = 0; i < want->n; i++) {
    const ct_json *w = &want->items[i];
    int ok = ct_spm_tokens(s, caps->items[i].str, ids, 4095, &n, &err) == CT_OK && n < 4095;
    ids[n] = ct_spm_eos(s);
    ok = ok && (size_t)n + 1 == w->n;
    for (size_t k = 0; ok && k < w->n; k++) ok = ids[k] == w->items[k].i64;
    bad += !ok;
  }
  CHECKF(bad == 0, "%d of 300 captions differ from the tokenizers library", bad);
  ct_spm_free(s);
  ct_json_free(g);
}

/* padding="max_length", truncation=True at 16, 77, 256 and 512 */
CT_TEST(t5, padding_and_truncation) {
  ct_json *g = golden();
  REQUIRE(g);
  ct_spm *s = NULL;
  ct_err err = {0};
  REQUIRE(ct_spm_load_dir(t5_data("tokenizer_2"), &s, &err) == CT_OK);
  const ct_json *caps = ct_json_get(g, "captions"), *pad = ct_json_get(g, "padded");
  int bad = 0, n = 0;
  int32_t ids[512];
  for (size_t i = 0; i < pad->n; i++) {
    const ct_json *c = &pad->items[i], *want = ct_json_get(c, "ids");
    int L = (int)ct_json_get(c, "max_length")->i64;
    REQUIRE(L <= 512 && (size_t)L == want->n);
    REQUIRE(ct_spm_encode(s, caps->items[ct_json_get(c, "caption")->i64].str, L, ids, &n, &err) ==
            CT_OK);
    int ok = 1;
    for (int k = 0; k < L; k++) ok &= ids[k] == want->items[k].i64;
    bad += !ok;
  }
  CHECKF(bad == 0, "%d of %zu padded cases differ", bad, pad->n);
  CHECK(ct_spm_encode(s, "a photo of a cat", 1, ids, &n, &err) == CT_OK && ids[0] == 1 && n == 1);
  CHECK(ct_spm_encode(s, "x", 0, ids, &n, &err) == CT_ERR_RANGE);
  CHECK(ct_spm_tokens(s, "bad \xC3\x28 utf8", ids, 512, &n, &err) == CT_ERR_INVALID);
  ct_spm_free(s);
  ct_json_free(g);
}

static int write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = fwrite(data, 1, n, f);
  fclose(f);
  return w == n ? 0 : -1;
}

/* Truncated or corrupted protobuf is refused with a message, never read past
 * its end (ASan would see it); a BPE tokenizer.json is refused by name. */
CT_TEST(t5, tokenizer_bad_input) {
  char *data = NULL, tmp[256];
  size_t n = 0;
  ct_err err = {0};
  ct_spm *s = NULL;
  REQUIRE(ct_read_file(t5_data("tokenizer_2/spiece.model"), 1 << 24, &data, &n, &err) == CT_OK);
  snprintf(tmp, sizeof tmp, "%s/t5_bad.model", CT_BINARY_DIR);
  size_t cuts[] = {1, 7, 100, 5000, n / 2, n - 3};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    REQUIRE(write_file(tmp, data, cuts[i]) == 0);
    ct_status st = ct_spm_load_model(tmp, &s, &err);
    CHECKF(st != CT_OK && s == NULL, "a spiece.model cut at %zu bytes was accepted", cuts[i]);
  }
  /* flip bytes: must fail or load, never crash */
  for (size_t i = 0; i < 64; i++) {
    char *c = malloc(n);
    memcpy(c, data, n);
    c[(i * 7919) % n] ^= (char)(0x5A + i);
    REQUIRE(write_file(tmp, c, n) == 0);
    if (ct_spm_load_model(tmp, &s, &err) == CT_OK) {
      int k = 0;
      int32_t ids[64];
      ct_spm_tokens(s, "a photo of a cat, café 123", ids, 64, &k, &err);
      ct_spm_free(s);
      s = NULL;
    }
    free(c);
  }
  free(data);
  remove(tmp);
  snprintf(tmp, sizeof tmp, "%s/t5_bad.json", CT_BINARY_DIR);
  const char *bpe = "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}";
  REQUIRE(write_file(tmp, bpe, strlen(bpe)) == 0);
  CHECK(ct_spm_load_json(tmp, &s, &err) == CT_ERR_UNSUPPORTED);
  CHECKF(strstr(err.msg, "'BPE'"), "message: %s", err.msg);
  const char *nfd =
      "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"<unk>\", 0], "
      "[\"</s>\", 0]]}, \"normalizer\": {\"type\": \"NFD\"}}";
  REQUIRE(write_file(tmp, nfd, strlen(nfd)) == 0);
  CHECK(ct_spm_load_json(tmp, &s, &err) == CT_ERR_UNSUPPORTED);
  CHECKF(strstr(err.msg, "'NFD'"), "message: %s", err.msg);
  remove(tmp);
  CHECK(ct_spm_load_dir(CT_BINARY_DIR, &s, &err) == CT_ERR_NOT_FOUND);
}

CT_TEST(t5, position_buckets_match_transformers) {
  ct_st_file *f = NULL;
  ct_err err = {0};
  REQUIRE(ct_st_open(t5_data("enc_golden.safetensors"), &f, &err) == CT_OK);
  const int cfgs[3][2] = {{32, 128}, {64, 100}, {16, 20}};
  for (int c = 0; c < 3; c++) {
    char name[64];
    snprintf(name, sizeof name, "buckets.%d_%d", cfgs[c][0], cfgs[c][1]);
    const ct_st_tensor *t = ct_st_find(f, name);
    REQUIRE(t && t->dtype == CT_DTYPE_I32 && t->numel == 1201);
    const int32_t *b = t->data;
    int bad = 0;
    for (int r = -600; r <= 600; r++) bad += ct_t5_bucket(r, cfgs[c][0], cfgs[c][1]) != b[r + 600];
    CHECKF(bad == 0, "%s: %d of 1201 distances in another bucket", name, bad);
  }
  ct_st_close(f);
}

static double max_abs(const float *a, const float *b, size_t n) {
  return ct_test_max_abs_err(a, b, n); /* NaN-aware */
}

CT_TEST(t5, encoder_matches_transformers) {
  ct_st_file *f = NULL;
  ct_t5 *t = NULL;
  ct_err err = {0};
  REQUIRE(ct_st_open(t5_data("enc_golden.safetensors"), &f, &err) == CT_OK);
  ct_status st = ct_t5_load(t5_data("text_encoder_2"), &t, &err);
  CHECKF(st == CT_OK, "%s", err.msg);
  REQUIRE(st == CT_OK);
  const ct_t5_config *c = ct_t5_cfg(t);
  CHECK(c->d_model == 64 && c->heads == 4 && c->layers == 2 && c->d_ff == 128 &&
        c->num_buckets == 32 && c->max_distance == 128);
  const char *cases[] = {"a", "b"};
  for (int k = 0; k < 2; k++) {
    char in[32], out[32];
    snprintf(in, sizeof in, "input.ids_%s", cases[k]);
    snprintf(out, sizeof out, "output.%s", cases[k]);
    const ct_st_tensor *ids = ct_st_find(f, in), *ref = ct_st_find(f, out);
    REQUIRE(ids && ref && ids->ndim == 2 && ref->numel == ids->numel * 64);
    int B = (int)ids->shape[0], T = (int)ids->shape[1];
    float *seq = malloc(ref->numel * sizeof(float));
    CHECK(ct_t5_encode(t, ids->data, B, T, seq, &err) == CT_OK);
    double e = max_abs(seq, ref->data, ref->numel);
    fprintf(stderr, "  T5 encoder vs T5EncoderModel, %d x %d tokens: max abs diff %.3g\n", B, T, e);
    CHECKF(e < 1e-4, "case %s: max abs diff %g", cases[k], e);
    free(seq);
  }
  int32_t bad_id = c->vocab;
  float y[64];
  CHECK(ct_t5_encode(t, &bad_id, 1, 1, y, &err) == CT_ERR_RANGE);
  ct_t5_free(t);
  ct_st_close(f);
}

/* A checkpoint that does not match its config lists every problem at once;
 * the original T5's ReLU FFN is refused by name. */
CT_TEST(t5, encoder_bad_input) {
  char dir[256], p[300];
  ct_err err = {0};
  ct_t5 *t = NULL;
  snprintf(dir, sizeof dir, "%s/t5_bad_enc", CT_BINARY_DIR);
  REQUIRE(ct_mkdir_p(dir, &err) == CT_OK);
  char *cfg = NULL;
  size_t n = 0;
  REQUIRE(ct_read_file(t5_data("text_encoder_2/config.json"), 1 << 20, &cfg, &n, &err) == CT_OK);
  snprintf(p, sizeof p, "%s/config.json", dir);
  /* one layer more than the shards hold, and a wider d_ff */
  char *l = strstr(cfg, "\"num_layers\": 2"), *ff = strstr(cfg, "\"d_ff\": 128");
  REQUIRE(l && ff);
  l[14] = '3';
  memcpy(ff + 8, "256", 3);
  REQUIRE(write_file(p, cfg, n) == 0);
  char *idx = NULL;
  size_t ni = 0;
  REQUIRE(ct_read_file(t5_data("text_encoder_2/model.safetensors.index.json"), 1 << 20, &idx, &ni,
                       &err) == CT_OK);
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  REQUIRE(write_file(p, idx, ni) == 0);
  for (int k = 1; k <= 2; k++) {
    char src[300], *d = NULL;
    size_t nd = 0;
    snprintf(src, sizeof src, "text_encoder_2/model-0000%d-of-00002.safetensors", k);
    REQUIRE(ct_read_file(t5_data(src), 1 << 24, &d, &nd, &err) == CT_OK);
    snprintf(p, sizeof p, "%s/model-0000%d-of-00002.safetensors", dir, k);
    REQUIRE(write_file(p, d, nd) == 0);
    free(d);
  }
  CHECK(ct_t5_load(dir, &t, &err) == CT_ERR_SHAPE && !t);
  CHECKF(strstr(err.msg, "encoder.block.2.layer.0.SelfAttention.q.weight") &&
             strstr(err.msg, "wi_0.weight") && strstr(err.msg, "9 missing"),
         "message: %s", err.msg);
  char *g = strstr(cfg, "\"gated-gelu\"");
  REQUIRE(g);
  memcpy(g, "\"relu\"      ", 12);
  snprintf(p, sizeof p, "%s/config.json", dir);
  REQUIRE(write_file(p, cfg, n) == 0);
  CHECK(ct_t5_load(dir, &t, &err) == CT_ERR_UNSUPPORTED);
  CHECKF(strstr(err.msg, "\"relu\""), "message: %s", err.msg);
  free(cfg);
  free(idx);
  ct_rm_rf(dir, &err);
}

/* ---- stored bf16 / int8 (text_encoder_2_precision) ---- */

static int is_linear(const ct_st_tensor *x) {
  return x->ndim == 2 && strcmp(x->name, "shared.weight") &&
         strcmp(x->name, "encoder.embed_tokens.weight") && !strstr(x->name, "relative_attention");
}

/* dir <- the golden encoder rewritten as one F32 file, its linear weights
 * replaced by their dequantised values under precision prec (NULL: as stored). */
static void write_twin(int *ct_failed_, const char *dir, const char *prec) {
  char p[1400];
  snprintf(p, sizeof p, "mkdir -p %s && cp %s %s/", dir, t5_data("text_encoder_2/config.json"),
           dir);
  REQUIRE(system(p) == 0);
  ct_st_set s;
  ct_err e = {0};
  REQUIRE(!ct_st_set_open(&s, t5_data("text_encoder_2"), "model.safetensors", &e));
  ct_st_writer *w = NULL;
  REQUIRE(!ct_st_writer_new(&w));
  float *keep[128]; /* the writer borrows each tensor's floats until it writes */
  size_t nk = 0;
  for (size_t k = 0; k < s.nf; k++)
    for (size_t i = 0; i < s.f[k]->ntensors && nk < 128; i++) {
      const ct_st_tensor *x = &s.f[k]->tensors[i];
      float *v = keep[nk++] = malloc(x->numel * sizeof(float));
      REQUIRE(v && !ct_st_to_f32(x, v, x->numel, &e));
      if (prec && is_linear(x) && !strcmp(prec, "bf16")) {
        for (size_t j = 0; j < x->numel; j++) v[j] = ct_bf16_to_f32(ct_f32_to_bf16(v[j]));
      } else if (prec && is_linear(x)) {
        const int R = (int)x->shape[0], C = (int)x->shape[1];
        int8_t *q = malloc(x->numel);
        float *sc = malloc((size_t)R * sizeof(float));
        REQUIRE(q && sc);
        ct_quantize_int8(strcmp(prec, "int8-torchao") ? CT_QUANT_QUANTO : CT_QUANT_TORCHAO, R, C, v,
                         q, sc);
        for (size_t j = 0; j < x->numel; j++) v[j] = (float)q[j] * sc[j / (size_t)C];
        free(q), free(sc);
      }
      CHECK(!ct_st_writer_add_f32(w, x->name, x->ndim, x->shape, v, CT_DTYPE_F32, &e));
    }
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  CHECKF(!ct_st_writer_write(w, p, &e), "%s", e.msg);
  ct_st_writer_free(w);
  while (nk) free(keep[--nk]);
  ct_st_set_close(&s);
}

static double max_abs_ref(const float *a, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = ct_test_max(m, fabs((double)a[i]));
  return m;
}

/* The bf16 / int8 T5 gives the bits of the float32 T5 whose linear weights
 * are the dequantised ones (the GEMM packs the same panels), from the BF16
 * files and from an F32 copy alike; against transformers' float32 output it
 * stays within the quantisation's error (measured: printed). Its weights take
 * the planned bytes: 1 per linear parameter + a float32 scale per row under
 * int8, the embedding as stored (mapped BF16), norms and the bias table float32. */
CT_TEST(t5, encoder_stored_bf16_int8_equals_dequantised) {
  static const char *const precs[] = {"bf16", "int8-quanto", "int8-torchao"};
  static const double tol[] = {1e-5, 3e-2,
                               3e-2}; /* of max |golden|; measured 3.9e-7, 0.018, 0.021 */
  ct_st_file *f = NULL;
  ct_err e = {0};
  REQUIRE(ct_st_open(t5_data("enc_golden.safetensors"), &f, &e) == CT_OK);
  const ct_st_tensor *ids = ct_st_find(f, "input.ids_a"), *ref = ct_st_find(f, "output.a");
  REQUIRE(ids && ref && ids->ndim == 2);
  const int B = (int)ids->shape[0], T = (int)ids->shape[1];
  const double rmax = max_abs_ref(ref->data, ref->numel);
  char f32dir[512], twin[512];
  snprintf(f32dir, sizeof f32dir, "%s/t5_prec_f32", ct_test_tmpdir());
  write_twin(ct_failed_, f32dir, NULL);
  float *yq = malloc(ref->numel * sizeof(float)), *yt = malloc(ref->numel * sizeof(float)),
        *y2 = malloc(ref->numel * sizeof(float));
  REQUIRE(yq && yt && y2);
  for (int k = 0; k < 3; k++) {
    snprintf(twin, sizeof twin, "%s/t5_prec_%d", ct_test_tmpdir(), k);
    write_twin(ct_failed_, twin, precs[k]);
    ct_t5 *q = NULL, *q2 = NULL, *t = NULL;
    CHECKF(!ct_t5_load_prec(t5_data("text_encoder_2"), precs[k], &q, &e), "%s", e.msg);
    CHECKF(!ct_t5_load_prec(f32dir, precs[k], &q2, &e), "%s", e.msg);
    CHECKF(!ct_t5_load(twin, &t, &e), "%s", e.msg);
    REQUIRE(q && q2 && t);
    CHECK(ct_t5_mapped(q) == 1 && ct_t5_mapped(q2) == 0 && ct_t5_mapped(t) == 0);
    REQUIRE(!ct_t5_encode(q, ids->data, B, T, yq, &e) && !ct_t5_encode(t, ids->data, B, T, yt, &e));
    REQUIRE(!ct_t5_encode(q2, ids->data, B, T, y2, &e));
    CHECKF(!memcmp(yq, yt, ref->numel * sizeof(float)), "%s: differs from the dequantised twin",
           precs[k]);
    CHECKF(!memcmp(yq, y2, ref->numel * sizeof(float)), "%s: BF16 and F32 files differ", precs[k]);
    const double rel = max_abs(yq, ref->data, ref->numel) / rmax;
    fprintf(stderr, "  T5 %s vs T5EncoderModel float32: max abs diff / max |ref| %.3g\n", precs[k],
            rel);
    CHECKF(rel < tol[k], "%s: relative error %g", precs[k], rel);
    /* the weight bytes */
    const ct_t5_config *c = ct_t5_cfg(q);
    const size_t d = (size_t)c->d_model, in = (size_t)c->heads * c->d_kv, F = (size_t)c->d_ff,
                 L = (size_t)c->layers;
    const size_t lin = L * (4 * in * d + 3 * F * d), rows = L * (3 * in + 2 * d + 2 * F);
    const size_t fl = (L * 2 + 1) * d + (size_t)c->num_buckets * c->heads, emb = c->vocab * d;
    const size_t want =
        k ? emb * 2 + fl * 4 + ((rows * 4 + 63) & ~(size_t)63) + lin : emb * 2 + fl * 4 + lin * 2;
    CHECKF(ct_t5_weight_bytes(q) == want, "%s: %zu weight bytes, planned %zu", precs[k],
           ct_t5_weight_bytes(q), want);
    fprintf(stderr, "  T5 %s: %zu weight bytes for %zu parameters (linear %zu: %.3f bytes each)\n",
            precs[k], ct_t5_weight_bytes(q), ct_t5_numel(q), lin,
            (double)(ct_t5_weight_bytes(q) - emb * 2 - fl * 4) / (double)lin);
    ct_t5_free(q), ct_t5_free(q2), ct_t5_free(t);
  }
  ct_t5 *bad = NULL;
  CHECK(ct_t5_load_prec(f32dir, "fp8-quanto", &bad, &e) == CT_ERR_INVALID && !bad);
  CHECKF(strstr(e.msg, "fp8-quanto") != NULL, "%s", e.msg);
  free(yq), free(yt), free(y2);
  ct_st_close(f);
}

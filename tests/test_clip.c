/* FLUX's CLIP text encoder and tokenizer against transformers 4.46.3
 * (scripts/clip_golden.py, tests/data/clip): CLIPTokenizer's and
 * CLIPTokenizerFast's ids on 1,200 captions and FluxPipeline's padded calls, CLIPTextModel
 * directories (F16 single file with the legacy eos_token_id 2 pooling; BF16 shards with gelu and
 * first-EOS pooling) to last_hidden_state / pooler_output, and the directory readers' errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/bf16.h"
#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/kernels.h"
#include "ctuner/safetensors.h"
#include "ctuner/textenc.h"
#include "harness.h"

/* tests/data/clip, or CT_CLIP_DATA (make interop: a fresh set). */
static const char *clip_data(const char *name) {
  static char buf[8][1024];
  static int k;
  const char *dir = getenv("CT_CLIP_DATA");
  char *b = buf[k++ % 8];
  snprintf(b, sizeof buf[0], "%s/%s", dir && dir[0] ? dir : ct_test_data("clip"), name);
  return b;
}

static int ids_equal(const int32_t *got, int n, const ct_json *want) {
  if (want->n != (size_t)n) return 0;
  for (int i = 0; i < n; i++)
    if (got[i] != (int32_t)want->items[i].i64) return 0;
  return 1;
}

CT_TEST(clip, tokenizer_matches_transformers) {
  ct_err err = {0};
  ct_json *g = NULL;
  ct_bpe *b = NULL;
  REQUIRE(!ct_json_parse_file(clip_data("tok_golden.json"), 16u << 20, &g, &err));
  CHECKF(!ct_bpe_load_dir(clip_data("tokenizer"), &b, &err), "%s", err.msg);
  if (!b) goto out;
  CHECK(ct_bpe_max_length(b) == 77 && ct_bpe_pad(b) == ct_bpe_eos(b));
  const ct_json *caps = ct_json_get(g, "captions"), *slow = ct_json_get(g, "slow"),
                *fast = ct_json_get(g, "fast"), *padded = ct_json_get(g, "padded");
  REQUIRE(caps && slow && fast && padded && caps->n >= 1000 && slow->n == caps->n);
  int bad = 0, fast_differs = 0;
  enum { CAP = 4096 };
  int32_t *ids = malloc(CAP * sizeof *ids);
  for (size_t i = 0; i < caps->n; i++) {
    const char *c = caps->items[i].str;
    ids[0] = ct_bpe_bos(b);
    int n = ct_bpe_tokens(b, c, ids + 1, CAP - 2);
    REQUIRE(n < CAP - 2);
    ids[n + 1] = ct_bpe_eos(b);
    if (!ids_equal(ids, n + 2, &slow->items[i])) {
      if (bad++ < 8) {
        fprintf(stderr, "  caption %zu \"%.80s\": %d ids, want %zu:", i, c, n + 2,
                slow->items[i].n);
        for (int k = 0; k < n + 2 && k < 16; k++) fprintf(stderr, " %d", ids[k]);
        fprintf(stderr, " / want");
        for (size_t k = 0; k < slow->items[i].n && k < 16; k++)
          fprintf(stderr, " %lld", (long long)slow->items[i].items[k].i64);
        fprintf(stderr, "\n");
      }
    }
    fast_differs += !ids_equal(ids, n + 2, &fast->items[i]);
  }
  CHECKF(bad == 0, "%d of %zu captions differ from CLIPTokenizer", bad, caps->n);
  /* the same files with CLIPTokenizerFast's rules */
  ct_bpe_set_rules(b, CT_BPE_CLIP_FAST);
  int fbad = 0;
  for (size_t i = 0; i < caps->n; i++) {
    const char *c = caps->items[i].str;
    ids[0] = ct_bpe_bos(b);
    int n = ct_bpe_tokens(b, c, ids + 1, CAP - 2);
    ids[n + 1] = ct_bpe_eos(b);
    if (!ids_equal(ids, n + 2, &fast->items[i]) && fbad++ < 8) {
      fprintf(stderr, "  fast: caption %zu \"%.80s\": %d ids, want %zu:", i, c, n + 2,
              fast->items[i].n);
      for (int k = 0; k < n + 2 && k < 16; k++) fprintf(stderr, " %d", ids[k]);
      fprintf(stderr, " / want");
      for (size_t k = 0; k < fast->items[i].n && k < 16; k++)
        fprintf(stderr, " %lld", (long long)fast->items[i].items[k].i64);
      fprintf(stderr, "\n");
    }
  }
  CHECKF(fbad == 0, "%d of %zu captions differ from CLIPTokenizerFast", fbad, caps->n);
  ct_bpe_set_rules(b, CT_BPE_CLIP);
  fprintf(stderr,
          "  %zu captions: %zu equal to CLIPTokenizer (slow, no ftfy), %zu to CLIPTokenizerFast "
          "(the two differ on %d)\n",
          caps->n, caps->n - (size_t)bad, caps->n - (size_t)fbad, fast_differs);
  /* FluxPipeline's call: padding="max_length", truncation */
  int pbad = 0;
  for (size_t i = 0; i < padded->n; i++) {
    const ct_json *p = &padded->items[i];
    int T = (int)ct_json_get(p, "max_length")->i64;
    ct_bpe_encode(b, ct_json_get(p, "caption")->str, T, ids);
    pbad += !ids_equal(ids, T, ct_json_get(p, "ids"));
  }
  CHECKF(pbad == 0, "%d of %zu padded calls differ", pbad, padded->n);
  free(ids);
out:
  ct_bpe_free(b);
  ct_json_free(g);
}

static double rel_err(const float *a, const float *b, size_t n) {
  return ct_test_rel_err(a, b, n); /* NaN-aware */
}

static void check_model(int *ct_failed_, const char *name, int want_pool, int want_act) {
  ct_err err = {0};
  ct_st_file *f = NULL;
  ct_textenc *te = NULL;
  char key[128];
  REQUIRE(!ct_st_open(clip_data("enc_golden.safetensors"), &f, &err));
  CHECKF(!ct_textenc_open_dir(clip_data(name), &te, &err), "%s", err.msg);
  if (!te) goto out;
  const ct_textenc_config *c = ct_textenc_cfg(te);
  CHECK(c->pool == want_pool && c->act == want_act && c->vocab == 2014 && c->max_pos == 77);
  snprintf(key, sizeof key, "%s.ids", name);
  const ct_st_tensor *ti = ct_st_find(f, key);
  snprintf(key, sizeof key, "%s.last_hidden_state", name);
  const ct_st_tensor *ts = ct_st_find(f, key);
  snprintf(key, sizeof key, "%s.pooler_output", name);
  const ct_st_tensor *tp = ct_st_find(f, key);
  REQUIRE(ti && ts && tp && ti->ndim == 2);
  int B = (int)ti->shape[0], T = (int)ti->shape[1], d = c->hidden;
  float *seq = malloc(sizeof(float) * B * T * d), *pool = malloc(sizeof(float) * B * d);
  CHECKF(!ct_textenc_encode(te, ti->data, B, T, seq, pool, &err), "%s", err.msg);
  double es = rel_err(seq, ts->data, (size_t)B * T * d),
         ep = rel_err(pool, tp->data, (size_t)B * d);
  fprintf(stderr, "  %s: %d x %d tokens, rel err last_hidden_state %.2e, pooler_output %.2e\n",
          name, B, T, es, ep);
  CHECK(es <= 1e-4 && ep <= 1e-4);
  free(seq);
  free(pool);
out:
  ct_textenc_free(te);
  ct_st_close(f);
}

CT_TEST(clip, encoder_matches_transformers) {
  check_model(ct_failed_, "text_encoder", CT_TEXTENC_POOL_ARGMAX_ID, CT_TEXTENC_ACT_QUICK_GELU);
  check_model(ct_failed_, "text_encoder_gelu", CT_TEXTENC_POOL_FIRST_EOS, CT_TEXTENC_ACT_GELU);
}

/* text_encoder_1_precision: CLIP-L stored bf16 / int8 (ct_textenc_store)
 * gives the bits of the float32 encoder loaded with the dequantised linear
 * weights (the file written here), within the quantisation's error of
 * transformers' float32 (measured: printed), in the planned bytes. */
CT_TEST(clip, stored_bf16_int8_equals_dequantised) {
  static const char *const precs[] = {"bf16", "int8-quanto", "int8-torchao"};
  static const double tol[] = {1e-2, 3e-2, 3e-2}; /* rel err vs golden; see the printed values */
  ct_err e = {0};
  ct_st_file *f = NULL;
  REQUIRE(!ct_st_open(clip_data("enc_golden.safetensors"), &f, &e));
  const ct_st_tensor *ti = ct_st_find(f, "text_encoder.ids"),
                     *ts = ct_st_find(f, "text_encoder.last_hidden_state");
  REQUIRE(ti && ts && ti->ndim == 2);
  const int B = (int)ti->shape[0], T = (int)ti->shape[1];
  float *ya = malloc(ts->numel * sizeof(float)), *yb = malloc(ts->numel * sizeof(float));
  REQUIRE(ya && yb);
  for (int k = 0; k < 3; k++) {
    ct_st_set s;
    REQUIRE(!ct_st_set_open(&s, clip_data("text_encoder"), "model.safetensors", &e));
    ct_st_writer *w = NULL;
    REQUIRE(!ct_st_writer_new(&w));
    float *keep[128];
    size_t nk = 0, lin = 0, rows = 0, other = 0;
    for (size_t j = 0; j < s.nf; j++)
      for (size_t i = 0; i < s.f[j]->ntensors && nk < 128; i++) {
        const ct_st_tensor *x = &s.f[j]->tensors[i];
        if (x->dtype == CT_DTYPE_I64) continue; /* position_ids */
        float *v = keep[nk++] = malloc(x->numel * sizeof(float));
        REQUIRE(v && !ct_st_to_f32(x, v, x->numel, &e));
        if (x->ndim == 2 && !strstr(x->name, "embedding")) {
          const int R = (int)x->shape[0], C = (int)x->shape[1];
          lin += x->numel, rows += (size_t)R;
          if (k == 0) {
            for (size_t c = 0; c < x->numel; c++) v[c] = ct_bf16_to_f32(ct_f32_to_bf16(v[c]));
          } else {
            int8_t *q = malloc(x->numel);
            float *sc = malloc((size_t)R * sizeof(float));
            REQUIRE(q && sc);
            ct_quantize_int8(k == 2 ? CT_QUANT_TORCHAO : CT_QUANT_QUANTO, R, C, v, q, sc);
            for (size_t c = 0; c < x->numel; c++) v[c] = (float)q[c] * sc[c / (size_t)C];
            free(q), free(sc);
          }
        } else {
          other += x->numel;
        }
        CHECK(!ct_st_writer_add_f32(w, x->name, x->ndim, x->shape, v, CT_DTYPE_F32, &e));
      }
    char twin[600];
    snprintf(twin, sizeof twin, "%s/clip_prec_%d.safetensors", ct_test_tmpdir(), k);
    CHECKF(!ct_st_writer_write(w, twin, &e), "%s", e.msg);
    ct_st_writer_free(w);
    while (nk) free(keep[--nk]);
    ct_st_set_close(&s);
    ct_textenc *a = NULL, *b = NULL;
    REQUIRE(!ct_textenc_open_dir(clip_data("text_encoder"), &a, &e));
    REQUIRE(!ct_textenc_open_dir(clip_data("text_encoder"), &b, &e));
    CHECKF(!ct_textenc_store(a, precs[k], &e), "%s", e.msg);
    CHECKF(!ct_textenc_load(b, twin, &e), "%s", e.msg);
    CHECK(ct_textenc_load(a, twin, &e) == CT_ERR_INVALID); /* stored: no float32 to load into */
    REQUIRE(!ct_textenc_encode(a, ti->data, B, T, ya, NULL, &e));
    REQUIRE(!ct_textenc_encode(b, ti->data, B, T, yb, NULL, &e));
    CHECKF(!memcmp(ya, yb, ts->numel * sizeof(float)), "%s: differs from the dequantised twin",
           precs[k]);
    const double r = rel_err(ya, ts->data, ts->numel);
    const size_t want = other * 4 + (k ? ((rows * 4 + 63) & ~(size_t)63) + lin : lin * 2);
    fprintf(stderr, "  CLIP %s: rel err vs CLIPTextModel float32 %.2e; %zu weight bytes (%zu)\n",
            precs[k], r, ct_textenc_weight_bytes(a), want);
    CHECKF(r < tol[k], "%s: rel err %g", precs[k], r);
    CHECK(ct_textenc_weight_bytes(a) == want);
    ct_textenc_free(a), ct_textenc_free(b);
  }
  ct_textenc *c = NULL;
  REQUIRE(!ct_textenc_open_dir(clip_data("text_encoder"), &c, &e));
  CHECK(ct_textenc_store(c, "fp8-quanto", &e) == CT_ERR_INVALID);
  ct_textenc_free(c);
  free(ya), free(yb);
  ct_st_close(f);
}

/* The tokenizer feeding the encoder: FluxPipeline's prompt path, end to end
 * (caption -> ids padded to model_max_length -> pooler_output). */
static void prompt_path(int *ct_failed_, const char *model, int attach_ok) {
  ct_err err = {0};
  ct_bpe *b = NULL;
  ct_textenc *te = NULL;
  ct_json *g = NULL;
  ct_st_file *f = NULL;
  char key[128];
  REQUIRE(!ct_bpe_load_dir(clip_data("tokenizer"), &b, &err));
  REQUIRE(!ct_textenc_open_dir(clip_data(model), &te, &err));
  ct_status st = ct_textenc_set_bpe(te, b, &err);
  CHECKF(attach_ok ? !st : st == CT_ERR_SHAPE, "%s: %s", model, st ? err.msg : "accepted");
  if (st) goto out;
  REQUIRE(!ct_json_parse_file(clip_data("tok_golden.json"), 16u << 20, &g, &err));
  REQUIRE(!ct_st_open(clip_data("enc_golden.safetensors"), &f, &err));
  snprintf(key, sizeof key, "%s.pooler_output", model);
  const ct_st_tensor *tp = ct_st_find(f, key);
  const ct_json *caps = ct_json_get(g, "captions");
  int d = ct_textenc_cfg(te)->hidden, T = ct_bpe_max_length(ct_textenc_bpe(te));
  REQUIRE(tp && caps && T == 77);
  int nc = (int)tp->shape[0] - 1; /* the golden's rows: captions, then a raw row */
  int32_t *ids = malloc(sizeof(int32_t) * nc * T);
  float *pool = malloc(sizeof(float) * nc * d);
  for (int i = 0; i < nc; i++) ct_textenc_tokenize(te, caps->items[i].str, T, ids + i * T);
  CHECKF(!ct_textenc_encode(te, ids, nc, T, NULL, pool, &err), "%s", err.msg);
  double e = rel_err(pool, tp->data, (size_t)nc * d);
  CHECKF(e <= 1e-4, "%s: captions to pooled: rel err %.2e", model, e);
  free(ids);
  free(pool);
out:
  ct_st_close(f);
  ct_json_free(g);
  ct_textenc_free(te);
}

CT_TEST(clip, prompt_to_pooled) {
  prompt_path(ct_failed_, "text_encoder", 1);      /* eos_token_id 2: argmax pooling */
  prompt_path(ct_failed_, "text_encoder_gelu", 1); /* eos_token_id = <|endoftext|> */
}

static int write_text(const char *path, const char *s) {
  ct_err err;
  return ct_write_file_atomic(path, s, strlen(s), &err) == CT_OK;
}

CT_TEST(clip, directory_errors) {
  ct_err err = {0};
  char dir[2048], path[4096];
  ct_textenc *te = NULL;
  snprintf(dir, sizeof dir, "%s/clip_bad", ct_test_tmpdir());
  REQUIRE(!ct_mkdir_p(dir, &err));
  /* every config problem in one error */
  snprintf(path, sizeof path, "%s/config.json", dir);
  REQUIRE(write_text(path,
                     "{\"hidden_act\": \"relu\", \"hidden_size\": -3, \"model_type\": "
                     "\"clip\", \"pruned_heads\": {\"0\": [1]}, \"vocab_size\": 10}"));
  ct_status st = ct_textenc_open_dir(dir, &te, &err);
  CHECKF(st && strstr(err.msg, "relu") && strstr(err.msg, "hidden_size") &&
             strstr(err.msg, "model_type") && strstr(err.msg, "pruned_heads") &&
             strstr(err.msg, "eos_token_id"),
         "%s", st ? err.msg : "accepted");
  /* a config that does not match the weights: every tensor at fault named */
  REQUIRE(write_text(path,
                     "{\"vocab_size\": 2014, \"hidden_size\": 32, \"intermediate_size\": "
                     "48, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, "
                     "\"eos_token_id\": 2, \"future_field\": 1}"));
  char src[4096], dst[4096];
  snprintf(src, sizeof src, "%s", clip_data("text_encoder/model.safetensors"));
  snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
  size_t n = 0;
  void *buf = ct_test_slurp(src, &n);
  REQUIRE(buf && !ct_write_file_atomic(dst, buf, n, &err));
  free(buf);
  st = ct_textenc_open_dir(dir, &te, &err);
  CHECKF(st == CT_ERR_SHAPE && strstr(err.msg, "16 missing [encoder.layers.2.") &&
             strstr(err.msg,
                    "6 wrongly shaped [encoder.layers.0.mlp.fc1.weight (has F16 [64, "
                    "32], needs F32/F16/BF16 [48, 32])"),
         "%s", st ? err.msg : "accepted");
  /* no weights at all */
  remove(dst);
  st = ct_textenc_open_dir(dir, &te, &err);
  CHECKF(st == CT_ERR_NOT_FOUND && strstr(err.msg, "model.safetensors"), "%s",
         st ? err.msg : "accepted");
  /* a tokenizer whose pad token is not in the vocabulary */
  ct_bpe *b = NULL;
  snprintf(src, sizeof src, "%s", clip_data("tokenizer/vocab.json"));
  snprintf(dst, sizeof dst, "%s/vocab.json", dir);
  buf = ct_test_slurp(src, &n);
  REQUIRE(buf && !ct_write_file_atomic(dst, buf, n, &err));
  free(buf);
  snprintf(src, sizeof src, "%s", clip_data("tokenizer/merges.txt"));
  snprintf(dst, sizeof dst, "%s/merges.txt", dir);
  buf = ct_test_slurp(src, &n);
  REQUIRE(buf && !ct_write_file_atomic(dst, buf, n, &err));
  free(buf);
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  REQUIRE(write_text(path, "{\"pad_token\": {\"content\": \"<pad>\"}, \"model_max_length\": 77}"));
  st = ct_bpe_load_dir(dir, &b, &err);
  CHECKF(st && strstr(err.msg, "pad_token \"<pad>\" is not in the vocabulary"), "%s",
         st ? err.msg : "accepted");
  /* pad "!" (as Stable Diffusion 2's tokenizer) and another length */
  REQUIRE(write_text(path, "{\"pad_token\": \"!\", \"model_max_length\": 20}"));
  CHECKF(!ct_bpe_load_dir(dir, &b, &err), "%s", err.msg);
  if (b) {
    int32_t ids[20];
    CHECK(ct_bpe_max_length(b) == 20 && ct_bpe_pad(b) != ct_bpe_eos(b));
    int k = ct_bpe_encode(b, "a cat", 20, ids);
    CHECK(k >= 3 && k < 20 && ids[k - 1] == ct_bpe_eos(b) && ids[k] == ct_bpe_pad(b) &&
          ids[19] == ct_bpe_pad(b));
  }
  ct_bpe_free(b);
}

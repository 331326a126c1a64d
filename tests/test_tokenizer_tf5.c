/* A FluxPipeline saved by transformers 5 / diffusers 0.42
 * (scripts/tokenizer_tf5_golden.py, tests/data/flux_pipe_tf5): tokenizer/ as
 * tokenizer.json + tokenizer_config.json only (no vocab.json / merges.txt:
 * ct_bpe_load_dir reads tokenizer.json's BPE model), tokenizer_2/ the same
 * (no spiece.model: tokenizer.json's Unigram model), model_index.json naming
 * tokenizer_2 "T5Tokenizer". The ids ctuner's tokenizers give equal the
 * pipeline's own tokenizers' on the golden captions (Unicode, CJK, emoji,
 * control characters, specials in the text, truncation), and a pipeline made
 * of tests/data/flux_pipe/dev's models with these files opens and encodes
 * dev's prompts as dev's golden says. CT_TOKENIZER_TF5_DATA overrides the
 * data directory (make interop). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctuner/config.h"
#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/safetensors.h"
#include "ctuner/t5.h"
#include "ctuner/textenc.h"
#include "harness.h"
#include "train/flux_pipe.h"
#include "train/textcond.h"

#define tdata(rel) ct_test_data_in("CT_TOKENIZER_TF5_DATA", "flux_pipe_tf5", rel)
#define DEV CT_SOURCE_DIR "/tests/data/flux_pipe/dev"

/* The golden's captions (metadata "captions") and one ids tensor [n, T]. */
static int golden(const char *key, char ***caps, int32_t **ids, int *T) {
  ct_st_file *g = NULL;
  ct_err e;
  if (ct_st_open(tdata("golden.safetensors"), &g, &e)) return 0;
  const char *js = ct_st_meta(g, "captions");
  const ct_st_tensor *t = ct_st_find(g, key);
  ct_json *j = NULL;
  int n = 0;
  if (js && t && t->dtype == CT_DTYPE_I32 && t->ndim == 2 &&
      !ct_json_parse(js, strlen(js), &j, &e) && (size_t)t->shape[0] == j->n) {
    n = (int)j->n;
    *T = (int)t->shape[1];
    *caps = calloc((size_t)n, sizeof **caps);
    *ids = malloc((size_t)t->numel * sizeof **ids);
    memcpy(*ids, t->data, (size_t)t->numel * sizeof **ids);
    for (int i = 0; i < n; i++) (*caps)[i] = strdup(j->items[i].str);
  }
  ct_json_free(j);
  ct_st_close(g);
  return n;
}

static void free_caps(char **caps, int n) {
  for (int i = 0; i < n; i++) free(caps[i]);
  free(caps);
}

CT_TEST(tokenizer_tf5, clip_from_tokenizer_json) {
  char **caps = NULL;
  int32_t *want = NULL;
  int T = 0;
  const int n = golden("clip_ids", &caps, &want, &T);
  REQUIRE(n > 0 && T == 77);
  REQUIRE(access(tdata("tokenizer/vocab.json"), F_OK) != 0); /* tokenizer.json alone */
  ct_bpe *b = NULL;
  ct_err e = {0};
  CHECKF(!ct_bpe_load_dir(tdata("tokenizer"), &b, &e), "%s", e.msg);
  REQUIRE(b);
  int bad = 0;
  int32_t ids[77];
  for (int i = 0; i < n; i++) {
    ct_bpe_encode(b, caps[i], T, ids);
    if (memcmp(ids, want + (size_t)i * T, sizeof ids)) {
      if (bad++ < 3) {
        int k = 0;
        while (k < T && ids[k] == want[(size_t)i * T + k]) k++;
        fprintf(stderr, "  caption %d \"%.40s\": id %d is %d, transformers 5 says %d\n", i, caps[i],
                k, ids[k], want[(size_t)i * T + k]);
      }
    }
  }
  CHECKF(bad == 0, "%d of %d captions differ from transformers 5's CLIPTokenizer", bad, n);
  ct_bpe_free(b);
  free_caps(caps, n), free(want);
}

CT_TEST(tokenizer_tf5, t5_from_tokenizer_json) {
  char **caps = NULL;
  int32_t *want = NULL;
  int T = 0;
  const int n = golden("t5_ids", &caps, &want, &T);
  REQUIRE(n > 0 && T == 64);
  REQUIRE(access(tdata("tokenizer_2/spiece.model"), F_OK) != 0);
  ct_spm *s = NULL;
  ct_err e = {0};
  CHECKF(!ct_spm_load_dir(tdata("tokenizer_2"), &s, &e), "%s", e.msg);
  REQUIRE(s);
  int bad = 0;
  int32_t ids[64];
  for (int i = 0; i < n; i++) {
    CHECKF(!ct_spm_encode(s, caps[i], T, ids, NULL, &e), "%s", e.msg);
    bad += memcmp(ids, want + (size_t)i * T, sizeof ids) != 0;
  }
  CHECKF(bad == 0, "%d of %d captions differ from transformers 5's T5Tokenizer", bad, n);
  ct_spm_free(s);
  free_caps(caps, n), free(want);
}

/* dev's models with the transformers 5 tokenizers and model_index.json. */
static int make_pipe(char *dir, size_t cap) {
  snprintf(dir, cap, "%s/tf5_pipe", ct_test_tmpdir());
  ct_err e;
  if (ct_mkdir_p(dir, &e)) return 0;
  static const char *const dev[] = {"transformer", "text_encoder", "text_encoder_2", "vae",
                                    "scheduler"};
  static const char *const tf5[] = {"tokenizer", "tokenizer_2", "model_index.json"};
  char a[4400], l[4400];
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) {
    snprintf(a, sizeof a, DEV "/%s", dev[i]);
    snprintf(l, sizeof l, "%s/%s", dir, dev[i]);
    if (symlink(a, l)) return 0;
  }
  for (size_t i = 0; i < sizeof tf5 / sizeof tf5[0]; i++) {
    const char *src = tdata(tf5[i]);
    if (src[0] != '/') {
      char cwd[4096];
      if (!getcwd(cwd, sizeof cwd)) return 0;
      snprintf(a, sizeof a, "%s/%s", cwd, src);
    } else
      snprintf(a, sizeof a, "%s", src);
    snprintf(l, sizeof l, "%s/%s", dir, tf5[i]);
    if (symlink(a, l)) return 0;
  }
  return 1;
}

CT_TEST(tokenizer_tf5, pipeline_opens_and_encodes) {
  char dir[4200];
  REQUIRE(make_pipe(dir, sizeof dir));
  ct_config c;
  ct_err e = {0};
  ct_flux_pipe p;
  ct_config_defaults(&c);
  REQUIRE(!ct_config_set(&c, "pretrained_model_name_or_path", dir, &e));
  REQUIRE(!ct_config_set(&c, "model_flavour", "dev", &e));
  const ct_status st = ct_flux_pipe_open(&c, 0, &p, &e);
  CHECKF(!st, "%s", e.msg);
  ct_config_free(&c);
  if (st) return;
  /* dev's prompts encoded through these tokenizers: dev's golden embeddings */
  ct_st_file *g = NULL;
  REQUIRE(!ct_st_open(DEV "/golden.safetensors", &g, &e));
  const char *js = ct_st_meta(g, "prompts");
  ct_json *j = NULL;
  REQUIRE(js && !ct_json_parse(js, strlen(js), &j, &e) && j->n == 3);
  const char *pr[3] = {j->items[0].str, j->items[1].str, j->items[2].str};
  p.max_sequence_length = atoi(ct_st_meta(g, "max_sequence_length"));
  size_t ne = 0, np = 0;
  float *pe = ct_test_tensor(g, "text.prompt_embeds", &ne),
        *pooled = ct_test_tensor(g, "text.pooled", &np);
  ct_textcond *tc = NULL;
  CHECKF(!ct_textcond_flux(&p, 0, &tc, &e), "%s", e.msg);
  REQUIRE(tc && pe && pooled && ne == (size_t)3 * p.max_sequence_length * 64 && np == 3 * 32);
  float *txt = calloc(ne, sizeof *txt), *y = calloc(np, sizeof *y);
  CHECKF(!ct_textcond_encode(tc, pr, 3, txt, y, &e), "%s", e.msg);
  const double et = ct_test_rel_err(txt, pe, ne), ey = ct_test_rel_err(y, pooled, np);
  CHECKF(et < 1e-4 && ey < 1e-4, "prompt_embeds %.3g, pooled %.3g vs dev's golden", et, ey);
  fprintf(stderr,
          "  dev's prompts through the transformers 5 files: prompt_embeds %.2g, pooled %.2g\n", et,
          ey);
  ct_textcond_free(tc);
  free(txt), free(y), free(pe), free(pooled);
  ct_json_free(j);
  ct_st_close(g);
}

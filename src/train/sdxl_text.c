/* StableDiffusionXLPipeline.encode_prompt (ctuner/diffusion.h; diffusers
 * 0.42.1 pipelines/stable_diffusion_xl/pipeline_stable_diffusion_xl.py
 * encode_prompt, clip_skip None): per (tokenizer, text_encoder) pair the ids
 * padded to max_length, text_encoder(ids, output_hidden_states=True), the
 * sequence hidden_states[-2]; the pooled vector is output[0] of the first
 * encoder whose output[0] is 2-D, i.e. text_encoder_2's text_embeds; the
 * sequences concatenated on the last axis. The CLIP encoders and tokenizers
 * are ctuner's own (src/text, docs/text_encoder.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/diffusion.h"
#include "ctuner/fs.h"
#include "ctuner/textenc.h"

struct ct_sdxl_text {
  ct_textenc *te[2];
  ct_bpe *tok[2];
  int T, d[2], P;
};

void ct_sdxl_text_free(ct_sdxl_text *t) {
  if (!t) return;
  for (int i = 0; i < 2; i++) {
    ct_textenc_free(t->te[i]);
    ct_bpe_free(t->tok[i]);
  }
  free(t);
}

/* One folder's problem appended to msg (every problem in one error). */
static void note(char *msg, size_t n, int *count, const char *what) {
  size_t l = strlen(msg);
  if (l + strlen(what) + 4 < n) snprintf(msg + l, n - l, "%s%s", *count ? "; " : "", what);
  (*count)++;
}

static void open_parts(ct_sdxl_text *t, const char *root, char *msg, size_t mn, int *bad) {
  static const char *const enc[2] = {"text_encoder", "text_encoder_2"};
  static const char *const tok[2] = {"tokenizer", "tokenizer_2"};
  for (int i = 0; i < 2; i++) {
    char dir[4096];
    ct_err e = {0};
    if (ct_pathf(dir, sizeof dir, "%s/%s", root, enc[i]) ||
        (i ? ct_textenc_open_dir_projection(dir, &t->te[i], &e)
           : ct_textenc_open_dir(dir, &t->te[i], &e)))
      note(msg, mn, bad, e.msg[0] ? e.msg : "path too long");
    e = (ct_err){0};
    if (ct_pathf(dir, sizeof dir, "%s/%s", root, tok[i]) || ct_bpe_load_dir(dir, &t->tok[i], &e))
      note(msg, mn, bad, e.msg[0] ? e.msg : "path too long");
  }
}

/* The pair's sizes: the same max length, within the encoders' positions and vocabularies. */
static void check_pairs(ct_sdxl_text *t, char *msg, size_t mn, int *bad) {
  char w[300];
  t->T = ct_bpe_max_length(t->tok[0]);
  for (int i = 0; i < 2; i++) {
    const ct_textenc_config *c = ct_textenc_cfg(t->te[i]);
    t->d[i] = c->hidden;
    if (ct_bpe_max_length(t->tok[i]) != t->T || t->T > c->max_pos || t->T < 2) {
      snprintf(w, sizeof w,
               "tokenizer%s model_max_length %d: both tokenizers must give the same length, at "
               "most the encoder's max_position_embeddings %d",
               i ? "_2" : "", ct_bpe_max_length(t->tok[i]), c->max_pos);
      note(msg, mn, bad, w);
    }
    if (ct_bpe_vocab_size(t->tok[i]) > c->vocab) {
      snprintf(w, sizeof w, "tokenizer%s ids reach %d, past text_encoder%s's vocab_size %d",
               i ? "_2" : "", ct_bpe_vocab_size(t->tok[i]) - 1, i ? "_2" : "", c->vocab);
      note(msg, mn, bad, w);
    }
    if (c->layers < 2) {
      snprintf(w, sizeof w, "text_encoder%s has %d layer(s): hidden_states[-2] needs 2",
               i ? "_2" : "", c->layers);
      note(msg, mn, bad, w);
    }
  }
  t->P = ct_textenc_cfg(t->te[1])->projection_dim;
}

ct_status ct_sdxl_text_open(const char *root, ct_sdxl_text **out, ct_err *err) {
  *out = NULL;
  ct_sdxl_text *t = calloc(1, sizeof *t);
  if (!t) return ct_errf(err, CT_ERR_NOMEM, "SDXL text encoders");
  char msg[1800] = "";
  int bad = 0;
  open_parts(t, root, msg, sizeof msg, &bad);
  if (!bad) check_pairs(t, msg, sizeof msg, &bad);
  if (bad) {
    ct_sdxl_text_free(t);
    return ct_errf(err, CT_ERR_INVALID, "SDXL text encoders in %s: %d problem%s: %s", root, bad,
                   bad > 1 ? "s" : "", msg);
  }
  *out = t;
  return CT_OK;
}

void ct_sdxl_text_dims(const ct_sdxl_text *t, int *T, int *D, int *P) {
  if (T) *T = t->T;
  if (D) *D = t->d[0] + t->d[1];
  if (P) *P = t->P;
}

/* Encoder i on n prompts: ids (n, T), hidden_states[-2] into seq (n, T, d). */
static ct_status encode_one(ct_sdxl_text *t, int i, const char *const *prompts, int n, int32_t *ids,
                            float *seq, float *pooled, ct_err *err) {
  for (int b = 0; b < n; b++)
    ct_bpe_encode(t->tok[i], prompts[b] ? prompts[b] : "", t->T, ids + (size_t)b * t->T);
  const int layer = ct_textenc_cfg(t->te[i])->layers - 1;
  return ct_textenc_encode_hidden(t->te[i], ids, n, t->T, layer, seq, pooled, err);
}

ct_status ct_sdxl_encode_prompt(ct_sdxl_text *t, const char *const *prompts, int n, float *embeds,
                                float *pooled, int32_t *ids1, int32_t *ids2, ct_err *err) {
  if (n < 1) return ct_errf(err, CT_ERR_RANGE, "SDXL encode_prompt: %d prompts", n);
  const size_t rows = (size_t)n * t->T;
  int32_t *ids = malloc(2 * rows * sizeof *ids);
  float *s1 = malloc(rows * (size_t)t->d[0] * sizeof *s1);
  float *s2 = malloc(rows * (size_t)t->d[1] * sizeof *s2);
  ct_status st = ids && s1 && s2 ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "SDXL encode_prompt");
  if (!st) st = encode_one(t, 0, prompts, n, ids, s1, NULL, err);
  if (!st) st = encode_one(t, 1, prompts, n, ids + rows, s2, pooled, err);
  if (!st && embeds) { /* torch.concat(prompt_embeds_list, dim=-1) */
    const int D = t->d[0] + t->d[1];
    for (size_t r = 0; r < rows; r++) {
      memcpy(embeds + r * D, s1 + r * t->d[0], (size_t)t->d[0] * sizeof(float));
      memcpy(embeds + r * D + t->d[0], s2 + r * t->d[1], (size_t)t->d[1] * sizeof(float));
    }
  }
  if (!st && ids1) memcpy(ids1, ids, rows * sizeof *ids);
  if (!st && ids2) memcpy(ids2, ids + rows, rows * sizeof *ids);
  free(ids);
  free(s1);
  free(s2);
  return st;
}

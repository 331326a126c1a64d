/* The trainer's text conditioning (textcond.h): ctuner's own encoder, or
 * FluxPipeline's CLIP-L (pooled) + T5 (sequence) pair as
 * FluxPipeline.encode_prompt computes them. */
#include "train/textcond.h"

#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/t5.h"
#include "train/flux_pipe.h"
#include "train_int.h"

ct_status ct_textcond_builtin(const ct_config *cfg, int hidden, const char *ckpt_dir, int T,
                              ct_textcond **out, ct_err *err) {
  ct_textcond *c = calloc(1, sizeof *c);
  if (!c) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = ct_textenc_from_config(cfg, hidden, ckpt_dir, &c->te, err);
  if (st) {
    free(c);
    return st;
  }
  c->kind = CT_TEXTCOND_BUILTIN;
  c->T = T, c->d = c->dp = hidden;
  *out = c;
  return CT_OK;
}

ct_status ct_textcond_flux(const ct_flux_pipe *p, int t5_zero, ct_textcond **out, ct_err *err) {
  ct_textcond *c = calloc(1, sizeof *c);
  if (!c) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  c->kind = CT_TEXTCOND_FLUX;
  c->T = p->max_sequence_length, c->d = p->tcfg.context_in_dim, c->dp = p->tcfg.vec_in_dim;
  c->t5_zero = t5_zero;
  /* CLIPTokenizer (transformers' rules, its model_max_length) and CLIPTextModel */
  ct_status st = ct_bpe_load_dir(p->tokenizer, &c->bpe, err);
  if (!st) c->clip_len = ct_bpe_max_length(c->bpe);
  if (!st) st = ct_textenc_open_dir(p->text_encoder, &c->te, err);
  if (!st) st = ct_textenc_store(c->te, p->clip_precision[0] ? p->clip_precision : NULL, err);
  if (!st && ct_bpe_vocab_size(c->bpe) > ct_textenc_cfg(c->te)->vocab)
    st = ct_errf(err, CT_ERR_SHAPE, "%s has ids up to %d; %s's vocab_size is %d", p->tokenizer,
                 ct_bpe_vocab_size(c->bpe) - 1, p->text_encoder, ct_textenc_cfg(c->te)->vocab);
  if (!st && c->clip_len > ct_textenc_cfg(c->te)->max_pos)
    st = ct_errf(err, CT_ERR_SHAPE, "%s: model_max_length %d > the text encoder's %d positions",
                 p->tokenizer, c->clip_len, ct_textenc_cfg(c->te)->max_pos);
  if (!st) st = ct_spm_load_dir(p->tokenizer_2, &c->spm, err);
  if (!st) st = ct_t5_load_prec(p->text_encoder_2, p->t5_precision, &c->t5, err);
  if (!st && ct_spm_vocab_size(c->spm) > ct_t5_cfg(c->t5)->vocab)
    st = ct_errf(err, CT_ERR_SHAPE, "%s has %d tokens; %s's vocab_size is %d", p->tokenizer_2,
                 ct_spm_vocab_size(c->spm), p->text_encoder_2, ct_t5_cfg(c->t5)->vocab);
  if (st) {
    ct_textcond_free(c);
    return st;
  }
  *out = c;
  return CT_OK;
}

/* FluxPipeline.encode_prompt: CLIP (padding max_length, its pooled output)
 * and T5 (padding max_length, no attention mask, last_hidden_state). */
static ct_status flux_encode(ct_textcond *c, const char *const *prompts, int n, float *txt,
                             float *y, ct_err *err) {
  const int L = c->clip_len, T = c->T;
  int32_t *ids = calloc((size_t)n * (size_t)(L > T ? L : T) + 1, sizeof *ids);
  int *len = malloc((size_t)n * sizeof *len);
  ct_status st = ids && len ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (int i = 0; i < n && !st; i++) ct_bpe_encode(c->bpe, prompts[i], L, ids + (size_t)i * L);
  if (!st) st = ct_textenc_encode(c->te, ids, n, L, NULL, y, err);
  for (int i = 0; i < n && !st; i++)
    st = ct_spm_encode(c->spm, prompts[i], T, ids + (size_t)i * T, &len[i], err);
  if (!st) st = ct_t5_encode(c->t5, ids, n, T, txt, err);
  if (!st && c->t5_zero) /* SimpleTuner's t5_padding zero: embeds * attention mask */
    for (int i = 0; i < n; i++)
      memset(txt + ((size_t)i * T + (size_t)len[i]) * c->d, 0,
             (size_t)(T - len[i]) * (size_t)c->d * sizeof(float));
  free(ids);
  free(len);
  return st;
}

ct_status ct_textcond_encode(ct_textcond *c, const char *const *prompts, int n, float *txt,
                             float *y, ct_err *err) {
  if (c->kind == CT_TEXTCOND_BUILTIN)
    return ct_encode_prompts(c->te, c->T, prompts, n, txt, y, err);
  if (c->t5) return flux_encode(c, prompts, n, txt, y, err);
  const size_t Td = (size_t)c->T * (size_t)c->d;
  for (int i = 0; i < n; i++) { /* released: the memo only */
    int k = 0;
    while (k < c->nmemo && strcmp(c->memo[k], prompts[i])) k++;
    if (k == c->nmemo)
      return ct_errf(err, CT_ERR_INVALID,
                     "prompt '%.80s' was not encoded before the FLUX.1 text encoders were freed",
                     prompts[i]);
    memcpy(txt + (size_t)i * Td, c->memo_txt + (size_t)k * Td, Td * sizeof(float));
    memcpy(y + (size_t)i * c->dp, c->memo_y + (size_t)k * c->dp, (size_t)c->dp * sizeof(float));
  }
  return CT_OK;
}

size_t ct_textcond_tokens(const ct_textcond *c, const char *caption) {
  if (c->kind == CT_TEXTCOND_FLUX) {
    int n = 0;
    ct_err e = {0};
    return ct_spm_tokens(c->spm, caption, NULL, 0, &n, &e) ? 0 : (size_t)n;
  }
  const ct_bpe *b = ct_textenc_bpe(c->te);
  return b ? (size_t)ct_bpe_tokens(b, caption, NULL, 0) : strlen(caption);
}

size_t ct_textcond_t5_bytes(const ct_textcond *c) {
  return c->t5 ? ct_t5_weight_bytes(c->t5) : 0;
}

int ct_textcond_specials(const ct_textcond *c) {
  return c->kind == CT_TEXTCOND_FLUX ? 1 : 2;
}

const char *ct_textcond_unit(const ct_textcond *c) {
  if (c->kind == CT_TEXTCOND_FLUX) return "T5 tokens";
  return ct_textenc_bpe(c->te) ? "BPE tokens" : "bytes";
}

ct_status ct_textcond_release(ct_textcond *c, const char *const *keep, int n, ct_err *err) {
  if (c->kind != CT_TEXTCOND_FLUX || !c->t5) return CT_OK;
  const size_t Td = (size_t)c->T * (size_t)c->d;
  c->memo = calloc((size_t)n + 1, sizeof *c->memo);
  c->memo_txt = ct_alloc(CT_MEM_BUFFERS, ((size_t)n + 1) * Td * sizeof(float));
  c->memo_y = ct_alloc(CT_MEM_BUFFERS, ((size_t)n + 1) * (size_t)c->dp * sizeof(float));
  if (!c->memo || !c->memo_txt || !c->memo_y) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = CT_OK;
  for (int i = 0; i < n && !st; i++) { /* one at a time: T5's activations stay small */
    st = flux_encode(c, keep + i, 1, c->memo_txt + (size_t)i * Td, c->memo_y + (size_t)i * c->dp,
                     err);
    if (!st && !(c->memo[i] = strdup(keep[i]))) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    if (!st) c->nmemo = i + 1;
  }
  if (st) return st;
  ct_t5_free(c->t5);
  c->t5 = NULL;
  ct_textenc_free(c->te);
  c->te = NULL;
  return CT_OK;
}

void ct_textcond_free(ct_textcond *c) {
  if (!c) return;
  ct_textenc_free(c->te);
  ct_t5_free(c->t5);
  ct_spm_free(c->spm);
  ct_bpe_free(c->bpe);
  for (int i = 0; i < c->nmemo; i++) free(c->memo[i]);
  free(c->memo);
  ct_free(c->memo_txt);
  ct_free(c->memo_y);
  free(c);
}

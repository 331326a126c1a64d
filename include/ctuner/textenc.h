/* The frozen text encoder: a CLIP text transformer (Hugging Face CLIPTextModel
 * layout and names), causal mask, quick-GELU, pre-LN; and its tokenizers.
 *
 * Weights are drawn from a fixed seed or loaded from safetensors; they never
 * train, so only a forward pass exists. Outputs are the final-LN sequence
 * (context for the MMDiT's txt_in) and the pooled vector (final-LN hidden state
 * at the first EOS token, input of vector_in).
 */
#ifndef CTUNER_TEXTENC_H
#define CTUNER_TEXTENC_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/status.h"

typedef struct ct_textenc_config {
  int vocab;        /* 259 for the byte tokenizer */
  int max_pos;      /* position embeddings (77) */
  int hidden;       /* width d (= MMDiT context_in_dim and vec_in_dim) */
  int heads;
  int layers;
  int intermediate; /* MLP width (4 d) */
  float ln_eps;     /* 1e-5 */
} ct_textenc_config;

/* Defaults for a width: vocab 259, max_pos 77, heads max(1, d/64) dividing d,
 * layers 2, intermediate 4 d. */
void ct_textenc_config_default(int hidden, ct_textenc_config *cfg);
ct_status ct_textenc_config_validate(const ct_textenc_config *cfg, ct_err *err);

typedef struct ct_textenc ct_textenc;

/* Seed-drawn weights (docs/text_encoder.md gives the distribution). */
ct_status ct_textenc_new(const ct_textenc_config *cfg, uint64_t seed, ct_textenc **out, ct_err *err);
/* Replace the weights from a CLIPTextModel safetensors file (names with or
 * without a "text_model." prefix); one error lists every missing, unexpected or
 * wrongly shaped tensor. */
ct_status ct_textenc_load(ct_textenc *te, const char *path, ct_err *err);
ct_status ct_textenc_save(const ct_textenc *te, const char *path, ct_err *err);
void ct_textenc_free(ct_textenc *te);
const ct_textenc_config *ct_textenc_cfg(const ct_textenc *te);

/* ids (B, T) int32 with T <= max_pos -> seq (B, T, hidden), pooled (B, hidden);
 * either output may be NULL. Pooled takes the first position whose id is the
 * tokenizer's EOS (257), or the last position if there is none. */
ct_status ct_textenc_encode(ct_textenc *te, const int32_t *ids, int B, int T, float *seq,
                            float *pooled, ct_err *err);

/* ---- tokenizers ---- */
enum { CT_TOK_BOS = 256, CT_TOK_EOS = 257, CT_TOK_PAD = 258, CT_TOK_BYTE_VOCAB = 259 };

/* Byte tokenizer: BOS, the UTF-8 bytes of text, EOS, then PAD up to T.
 * Longer texts are truncated so that EOS is always the last kept token.
 * T >= 2. Returns the number of non-PAD tokens. */
int ct_tokenize_bytes(const char *text, int T, int32_t *ids);

#endif

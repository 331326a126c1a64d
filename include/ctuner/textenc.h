/* The frozen text encoder: a CLIP text transformer (Hugging Face CLIPTextModel
 * layout and names), causal mask, quick-GELU (or GELU), pre-LN; and its
 * tokenizers. FLUX's text_encoder/ and tokenizer/ open with
 * ct_textenc_open_dir and ct_bpe_load_dir (docs/text_encoder.md).
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

#include "ctuner/backend.h"
#include "ctuner/status.h"

typedef struct ct_textenc_config {
  int vocab;   /* 259 for the byte tokenizer */
  int max_pos; /* position embeddings (77) */
  int hidden;  /* width d (= MMDiT context_in_dim and vec_in_dim) */
  int heads;
  int layers;
  int intermediate; /* MLP width (4 d) */
  float ln_eps;     /* 1e-5 */
  int eos_id;       /* token whose first position gives the pooled output (257; CLIP BPE 49407) */
  int act;          /* CT_TEXTENC_ACT_*: the MLP's activation (hidden_act) */
  int pool;         /* CT_TEXTENC_POOL_*: which position gives the pooled output */
  /* CLIPTextModelWithProjection's text_projection (projection_dim x hidden,
   * no bias, named "text_projection.weight" outside text_model.); 0: none
   * (CLIPTextModel) */
  int projection_dim;
} ct_textenc_config;

enum {
  CT_TEXTENC_ACT_QUICK_GELU = 0, /* x sigmoid(1.702 x): "quick_gelu", CLIP's */
  CT_TEXTENC_ACT_GELU = 1        /* exact (erf) GELU: "gelu" */
};
enum {
  /* ctuner's own: the first eos_id, else the last position (seeded encoders) */
  CT_TEXTENC_POOL_FIRST_EOS_OR_LAST = 0,
  /* transformers' CLIPTextTransformer with eos_token_id == 2 (the legacy rule
   * kept for configs written before transformers PR #24773, FLUX's among
   * them): the position of the largest id, the first one if tied */
  CT_TEXTENC_POOL_ARGMAX_ID = 1,
  /* transformers with any other eos_token_id: the first eos_id, else 0 */
  CT_TEXTENC_POOL_FIRST_EOS = 2
};

/* Defaults for a width: vocab 259, max_pos 77, heads max(1, d/64) dividing d,
 * layers 2, intermediate 4 d, eos_id 257, quick_gelu, pool at the first EOS
 * or the last position. */
void ct_textenc_config_default(int hidden, ct_textenc_config *cfg);
ct_status ct_textenc_config_validate(const ct_textenc_config *cfg, ct_err *err);

typedef struct ct_textenc ct_textenc;

/* Seed-drawn weights (docs/text_encoder.md gives the distribution). */
ct_status ct_textenc_new(const ct_textenc_config *cfg, uint64_t seed, ct_textenc **out,
                         ct_err *err);
/* Replace the weights from a CLIPTextModel safetensors file, or a
 * directory's model.safetensors or the shards its
 * model.safetensors.index.json names (names with or without a "text_model."
 * prefix); one error lists every missing, unexpected or wrongly shaped
 * tensor, and the weights are then left unchanged. */
ct_status ct_textenc_load(ct_textenc *te, const char *path, ct_err *err);
ct_status ct_textenc_save(const ct_textenc *te, const char *path, ct_err *err);
/* text_encoder_1_precision: store the linear weights (q, k, v, out_proj, fc1,
 * fc2) bf16 (rounded) or int8-quanto / int8-torchao (per output row,
 * ct_quantize_int8), read through weight views the GEMM dequantises in
 * float32 tiles; the float32 copies are freed (embeddings, norms and biases
 * stay float32). no_change does nothing. After it the encoder is neither
 * loaded into, saved nor moved to another backend. */
ct_status ct_textenc_store(ct_textenc *te, const char *precision, ct_err *err);
/* Bytes the weights occupy (float32 part + stored narrow part). */
size_t ct_textenc_weight_bytes(const ct_textenc *te);

/* A transformers CLIPTextModel directory (FLUX's text_encoder/): config.json
 * (CLIPTextConfig: vocab_size, hidden_size, intermediate_size,
 * num_hidden_layers, num_attention_heads, max_position_embeddings, hidden_act
 * quick_gelu|gelu, layer_norm_eps, eos_token_id; bookkeeping fields ignored,
 * fields that would change the math refused by name, unknown ones one warning)
 * and model.safetensors or the shards of model.safetensors.index.json (F32,
 * F16, BF16; a full CLIPModel's vision tower is ignored). Every problem of the
 * config, then every missing / misshaped / unexpected tensor, in one error.
 * Pooling follows transformers (eos_token_id 2: argmax of the ids). */
ct_status ct_textenc_open_dir(const char *dir, ct_textenc **out, ct_err *err);
/* The same for a CLIPTextModelWithProjection directory (SDXL's
 * text_encoder_2/): projection_dim from config.json and text_projection.weight
 * from the weights, both required. */
ct_status ct_textenc_open_dir_projection(const char *dir, ct_textenc **out, ct_err *err);
/* Just the config.json part of ct_textenc_open_dir (projection_dim stays 0). */
ct_status ct_textenc_config_read(const char *path, ct_textenc_config *cfg, ct_err *err);
void ct_textenc_free(ct_textenc *te);
/* The compute backend of the forward (include/ctuner/backend.h):
 * ct_backend_default() from ct_textenc_new, or the one set here, which moves
 * the weights to it. seq and pooled given to ct_textenc_encode are then that
 * backend's memory (host memory for the CPU backend), ids stay on the host.
 * NULL: the default. On failure the encoder stays where it was. */
ct_status ct_textenc_set_backend(ct_textenc *te, const ct_backend_ops *be, ct_err *err);
const ct_backend_ops *ct_textenc_backend(const ct_textenc *te);
const ct_textenc_config *ct_textenc_cfg(const ct_textenc *te);

/* ids (B, T) int32 with T <= max_pos -> seq (B, T, hidden), pooled (B, hidden);
 * either output may be NULL: last_hidden_state and pooler_output of
 * CLIPTextModel called without attention_mask (as FluxPipeline calls it).
 * Pooled takes the position cfg.pool says. */
ct_status ct_textenc_encode(ct_textenc *te, const int32_t *ids, int B, int T, float *seq,
                            float *pooled, ct_err *err);
/* The outputs StableDiffusionXLPipeline.encode_prompt reads of
 * CLIPTextModel(WithProjection)(ids, output_hidden_states=True):
 * hidden (B, T, hidden) = hidden_states[layer], the residual stream after
 * `layer` encoder layers (0: the embeddings; layers - 1: SDXL's
 * hidden_states[-2]; no final layer norm), and embeds = output[0] past the
 * sequence: text_embeds (B, projection_dim), the pooled vector through
 * text_projection, or without a projection the pooler_output (B, hidden).
 * Either may be NULL. */
ct_status ct_textenc_encode_hidden(ct_textenc *te, const int32_t *ids, int B, int T, int layer,
                                   float *hidden, float *embeds, ct_err *err);

/* The tokenizer captions go through: the byte tokenizer unless a CLIP BPE
 * tokenizer was attached (the encoder then owns it and frees it). Attaching
 * checks that the BPE ids fit the vocabulary and that its <|endoftext|> is
 * the encoder's eos_id (not needed with CT_TEXTENC_POOL_ARGMAX_ID, FLUX's
 * case) and sets nothing else: build the encoder with vocab =
 * ct_bpe_vocab_size and eos_id = ct_bpe_eos. */
typedef struct ct_bpe ct_bpe;
ct_status ct_textenc_set_bpe(ct_textenc *te, ct_bpe *b, ct_err *err);
const ct_bpe *ct_textenc_bpe(const ct_textenc *te);
/* Token ids (B x T rows) of one text with the encoder's tokenizer; returns the
 * number of non-padding tokens. */
int ct_textenc_tokenize(const ct_textenc *te, const char *text, int T, int32_t *ids);

/* ---- tokenizers ---- */
enum { CT_TOK_BOS = 256, CT_TOK_EOS = 257, CT_TOK_PAD = 258, CT_TOK_BYTE_VOCAB = 259 };

/* Byte tokenizer: BOS, the UTF-8 bytes of text, EOS, then PAD up to T.
 * Longer texts are truncated so that EOS is always the last kept token.
 * T >= 2. Returns the number of non-PAD tokens. */
int ct_tokenize_bytes(const char *text, int T, int32_t *ids);

/* CLIP BPE tokenizer (docs/text_encoder.md): a user's vocab.json ({"symbol": id})
 * and merges.txt ("left right" per line, optional "#version" first line), with
 * <|startoftext|> and <|endoftext|> in the vocabulary. Errors name the file,
 * line and column. */
ct_status ct_bpe_load(const char *vocab_json, const char *merges_txt, ct_bpe **out, ct_err *err);
/* A transformers CLIPTokenizer directory (FLUX's tokenizer/): vocab.json,
 * merges.txt — or, as transformers 5 saves it, tokenizer.json alone (its
 * model.vocab and model.merges; a BPE model with CLIP's "</w>" suffix, else
 * refused; CT_BPE_CLIP_FAST rules, which transformers 5's tokenizers-backed
 * CLIPTokenizer follows) — and from tokenizer_config.json (else special_tokens_map.json)
 * model_max_length and the pad / unk tokens (bos and eos must be CLIP's).
 * It tokenizes as transformers 4.46.3's CLIPTokenizer does without ftfy
 * (docs/text_encoder.md): added tokens split out of the raw text, then
 * BasicTokenizer's clean-up, CJK spacing, NFC and lowercasing with Python's
 * Unicode data, CLIP's pattern with \p{L} / \p{N}, BPE. */
ct_status ct_bpe_load_dir(const char *dir, ct_bpe **out, ct_err *err);
void ct_bpe_free(ct_bpe *b);
/* Which rules a tokenizer follows: ct_bpe_load gives CT_BPE_CTUNER (ctuner's
 * older, ASCII-only rules), ct_bpe_load_dir CT_BPE_CLIP (transformers'
 * CLIPTokenizer, FluxPipeline's); CT_BPE_CLIP_FAST is CLIPTokenizerFast
 * (AutoTokenizer's default): NFC, whitespace runs, per-character lowercase,
 * no control-character removal, no CJK spacing. */
enum { CT_BPE_CTUNER = 0, CT_BPE_CLIP = 1, CT_BPE_CLIP_FAST = 2 };
void ct_bpe_set_rules(ct_bpe *b, int rules);
int ct_bpe_rules(const ct_bpe *b);
int ct_bpe_pad(const ct_bpe *b);        /* pad_token's id (<|endoftext|> unless configured) */
int ct_bpe_max_length(const ct_bpe *b); /* model_max_length (77 unless configured) */
int ct_bpe_vocab_size(const ct_bpe *b); /* largest id + 1 */
int ct_bpe_bos(const ct_bpe *b);
int ct_bpe_eos(const ct_bpe *b);
/* Token ids of text without BOS/EOS: writes at most cap, returns how many there are. */
int ct_bpe_tokens(const ct_bpe *b, const char *text, int32_t *ids, int cap);
/* BOS, the tokens, EOS, then the pad token up to T; longer texts are
 * truncated so that EOS is the last kept token: FluxPipeline's
 * tokenizer(padding="max_length", max_length=T, truncation=True). T >= 2.
 * Returns the number of tokens up to and including the EOS. */
int ct_bpe_encode(const ct_bpe *b, const char *text, int T, int32_t *ids);

#endif

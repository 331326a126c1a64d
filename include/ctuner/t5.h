/* T5 v1.1 text encoder (Hugging Face T5EncoderModel: FLUX's text_encoder_2)
 * and its SentencePiece Unigram tokenizer (T5TokenizerFast: tokenizer_2), as
 * diffusers' FluxPipeline uses them (docs/text_encoder.md, "T5").
 *
 * The tokenizer reads spiece.model (SentencePiece's protobuf ModelProto) or a
 * Hugging Face tokenizer.json (model type Unigram) and gives the ids
 * T5TokenizerFast gives: special tokens split out of the raw text, the
 * precompiled normalizer (NFKC and friends, from the model's own charsmap),
 * trailing whitespace stripped, runs of spaces collapsed, U+2581 for spaces
 * with a prefix, Viterbi over the pieces, </s> appended, truncation and
 * padding to a fixed length.
 *
 * The encoder reads a text_encoder_2 directory (config.json and one or
 * sharded safetensors files, F32/F16/BF16) — keeping the matrices in the
 * memory-mapped files when all are BF16, else in float32 — and runs the
 * forward pass on a compute backend. Frozen: no backward.
 */
#ifndef CTUNER_T5_H
#define CTUNER_T5_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/backend.h"
#include "ctuner/status.h"

/* ---- tokenizer ---- */
typedef struct ct_spm ct_spm;

/* spiece.model: pieces, scores and types, trainer_spec (model type must be
 * Unigram; unk/eos/pad ids), normalizer_spec's precompiled charsmap. The
 * pipeline around the model is the one transformers builds for
 * T5TokenizerFast from it (100 <extra_id_N> tokens after the pieces). */
ct_status ct_spm_load_model(const char *path, ct_spm **out, ct_err *err);
/* tokenizer.json: model Unigram (vocab [[piece, score]], unk_id,
 * byte_fallback false), normalizer Precompiled / Strip / Replace / Sequence,
 * pre_tokenizer Metaspace / WhitespaceSplit / Sequence, added_tokens; any
 * other component is refused by name. */
ct_status ct_spm_load_json(const char *path, ct_spm **out, ct_err *err);
/* A tokenizer_2 directory: tokenizer.json if present, else spiece.model. */
ct_status ct_spm_load_dir(const char *dir, ct_spm **out, ct_err *err);
void ct_spm_free(ct_spm *s);
int ct_spm_vocab_size(const ct_spm *s); /* pieces + added tokens (largest id + 1) */
int ct_spm_eos(const ct_spm *s);        /* </s>: 1 for T5 */
int ct_spm_pad(const ct_spm *s);        /* <pad>: 0 */
int ct_spm_unk(const ct_spm *s);        /* <unk>: 2 */
/* The id of a piece or added token, -1 if there is none. */
int ct_spm_piece_id(const ct_spm *s, const char *piece);
const char *ct_spm_piece(const ct_spm *s, int id); /* NULL out of range */

/* Token ids of text (valid UTF-8) without </s>: writes at most cap of them,
 * *n = how many there are. */
ct_status ct_spm_tokens(const ct_spm *s, const char *text, int32_t *ids, int cap, int *n,
                        ct_err *err);
/* As FluxPipeline calls the tokenizer (padding="max_length",
 * truncation=True, max_length=T): the tokens, cut to T-1, then </s>, then
 * <pad> up to T. T >= 1. *n (may be NULL) = tokens before the padding. */
ct_status ct_spm_encode(const ct_spm *s, const char *text, int T, int32_t *ids, int *n,
                        ct_err *err);

/* ---- encoder ---- */
typedef struct ct_t5_config {
  int vocab;        /* vocab_size (32128 for T5 v1.1) */
  int d_model;      /* 4096 for t5-v1_1-xxl */
  int d_kv;         /* per-head width (64) */
  int d_ff;         /* gated FFN width (10240) */
  int layers;       /* num_layers (24) */
  int heads;        /* num_heads (64) */
  int num_buckets;  /* relative_attention_num_buckets (32) */
  int max_distance; /* relative_attention_max_distance (128) */
  float eps;        /* layer_norm_epsilon (1e-6) */
} ct_t5_config;

/* config.json of a T5EncoderModel; feed_forward_proj must be "gated-gelu"
 * (T5 v1.1; "relu" is the original T5 and is refused by name). */
ct_status ct_t5_config_read(const char *path, ct_t5_config *cfg, ct_err *err);
ct_status ct_t5_config_validate(const ct_t5_config *cfg, ct_err *err);

typedef struct ct_t5 ct_t5;
/* dir/config.json and dir/model.safetensors, or the shards named by
 * dir/model.safetensors.index.json; one error lists every missing, unexpected
 * or wrongly shaped tensor. */
ct_status ct_t5_load(const char *dir, ct_t5 **out, ct_err *err);
/* As ct_t5_load with text_encoder_2_precision (NULL: no_change): bf16 reads
 * the linear layers through bf16 views (a BF16 file's mapped matrices, an
 * F32 file's rounded, one matrix at a time); int8-quanto / int8-torchao
 * quantise each linear weight per output row from its stored values (one
 * matrix widened at a time, ct_quantize_int8) and read it through int8 views,
 * dequantised in the GEMM's float32 tiles. The embedding stays as stored
 * (mapped when BF16, else float32), as quanto and torchao quantise only the
 * nn.Linear layers; norms and the bias table are float32. */
ct_status ct_t5_load_prec(const char *dir, const char *precision, ct_t5 **out, ct_err *err);
/* Bytes the weights occupy: float32 part, owned int8/bf16 part and the
 * bytes read from the mapped files. */
size_t ct_t5_weight_bytes(const ct_t5 *t);
void ct_t5_free(ct_t5 *t);
const ct_t5_config *ct_t5_cfg(const ct_t5 *t);
size_t ct_t5_numel(const ct_t5 *t);
/* 1 when weights are read from the memory-mapped BF16 files (no_change with
 * every matrix stored BF16: 2 bytes per parameter, read through bf16 weight
 * views; under int8 the embedding alone), 0 when nothing is. */
int ct_t5_mapped(const ct_t5 *t);
/* Move the weights to backend be (NULL: the default); seq given to
 * ct_t5_encode is then that backend's memory, ids stay on the host. */
ct_status ct_t5_set_backend(ct_t5 *t, const ct_backend_ops *be, ct_err *err);
/* ids (B, T) -> seq (B, T, d_model): last_hidden_state of T5EncoderModel
 * called without attention_mask, as FluxPipeline._get_t5_prompt_embeds calls
 * it (padding positions attend and are attended to). */
ct_status ct_t5_encode(ct_t5 *t, const int32_t *ids, int B, int T, float *seq, ct_err *err);

/* HF T5Attention._relative_position_bucket, bidirectional, for a key at
 * distance rel = key - query (float32 arithmetic as torch does it). */
int ct_t5_bucket(int rel, int num_buckets, int max_distance);

#endif

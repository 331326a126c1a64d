/* A transformers CLIPTextModel directory (FLUX's text_encoder/): config.json
 * read as CLIPTextConfig, weights through the shared loader (st_set.c).
 * Every field of config.json is accounted for: the ones that set the shape
 * and the math are read, bookkeeping and training-only ones ignored, ones
 * that would change the forward refused by name, and any other named in one
 * warning. Every config problem is reported in one error.
 */
#include <stdio.h>
#include <string.h>

#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/textenc.h"
#include "text/textenc_int.h"

/* Read, or harmless for a frozen forward pass in eval mode. */
static const char *const IGNORED[] = {
    "projection_dim", "bos_token_id", "pad_token_id", "attention_dropout", "dropout",
    "initializer_factor", "initializer_range", "architectures", "torch_dtype", "dtype",
    "transformers_version", "_name_or_path", "_commit_hash", "_attn_implementation_autoset",
    "model_type", "pruned_heads", "output_attentions", "output_hidden_states", "return_dict",
    "use_bfloat16", "torchscript", "tie_word_embeddings", "tokenizer_class", "is_decoder",
    "add_cross_attention", "chunk_size_feed_forward", "id2label", "label2id", "problem_type",
    "finetuning_task", "prefix", "task_specific_params", "tie_encoder_decoder",
    "is_encoder_decoder", "cross_attention_hidden_size", "tf_legacy_loss",
    /* generation settings: CLIP's text tower never generates */
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "sep_token_id", "decoder_start_token_id"};

static const char *const READ[] = {
    "vocab_size",        "hidden_size",         "intermediate_size",
    "num_hidden_layers", "num_attention_heads", "max_position_embeddings",
    "hidden_act",        "layer_norm_eps",      "eos_token_id"};

typedef struct problems {
  char buf[900];
  int n;
} problems;

static void problem(problems *p, const char *fmt, const char *key, const char *val) {
  size_t l = strlen(p->buf);
  char item[256];
  snprintf(item, sizeof item, fmt, key, val);
  if (l + strlen(item) + 8 < sizeof p->buf)
    snprintf(p->buf + l, sizeof p->buf - l, "%s%s", p->n ? "; " : "", item);
  else if (!strstr(p->buf, "; ..."))
    snprintf(p->buf + l, sizeof p->buf - l, "; ...");
  p->n++;
}

static int get_int(const ct_json *j, const char *key, int def, int lo, problems *pr) {
  const ct_json *v = ct_json_get(j, key);
  if (!v) {
    if (def == -1) problem(pr, "\"%s\" is missing%s", key, "");
    return def;
  }
  if (v->type != CT_JSON_NUMBER || !v->is_int || v->i64 < lo || v->i64 > (1 << 24)) {
    problem(pr, "\"%s\" must be an integer in [%s, 2^24]", key, lo ? "1" : "0");
    return def;
  }
  return (int)v->i64;
}

static int listed(const char *const *list, size_t n, const char *key) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(list[i], key)) return 1;
  return 0;
}

static void read_fields(const ct_json *j, ct_textenc_config *c, problems *pr) {
  /* CLIPTextConfig's defaults where transformers has one the file may omit */
  c->vocab = get_int(j, "vocab_size", 49408, 1, pr);
  c->hidden = get_int(j, "hidden_size", 512, 1, pr);
  c->intermediate = get_int(j, "intermediate_size", 2048, 1, pr);
  c->layers = get_int(j, "num_hidden_layers", 12, 1, pr);
  c->heads = get_int(j, "num_attention_heads", 8, 1, pr);
  c->max_pos = get_int(j, "max_position_embeddings", 77, 1, pr);
  c->eos_id = get_int(j, "eos_token_id", 49407, 0, pr);
  c->ln_eps = 1e-5f;
  const ct_json *v = ct_json_get(j, "layer_norm_eps");
  if (v && (v->type != CT_JSON_NUMBER || !(v->num > 0)))
    problem(pr, "\"%s\" must be a positive number%s", "layer_norm_eps", "");
  else if (v)
    c->ln_eps = (float)v->num;
  c->act = CT_TEXTENC_ACT_QUICK_GELU;
  v = ct_json_get(j, "hidden_act");
  if (v && v->type != CT_JSON_STRING)
    problem(pr, "\"%s\" must be a string%s", "hidden_act", "");
  else if (v && !strcmp(v->str, "gelu"))
    c->act = CT_TEXTENC_ACT_GELU;
  else if (v && strcmp(v->str, "quick_gelu"))
    problem(pr, "hidden_act \"%2$s\" is not supported (quick_gelu or gelu)%1$s", "", v->str);
  /* transformers' CLIPTextTransformer: eos_token_id 2 keeps the rule of
   * configs from before PR #24773 (argmax of the ids) */
  c->pool = c->eos_id == 2 ? CT_TEXTENC_POOL_ARGMAX_ID : CT_TEXTENC_POOL_FIRST_EOS;
  v = ct_json_get(j, "model_type");
  if (v && (v->type != CT_JSON_STRING || strcmp(v->str, "clip_text_model")))
    problem(pr,
            "model_type \"%2$s\" is not a CLIPTextModel's (\"clip_text_model\"; a full CLIPModel's "
            "config nests it under text_config)%1$s",
            "", v->type == CT_JSON_STRING ? v->str : "?");
  v = ct_json_get(j, "pruned_heads");
  if (v && !(v->type == CT_JSON_OBJECT && v->n == 0))
    problem(pr, "\"%s\" is set: pruned attention heads are not supported%s", "pruned_heads", "");
  if (c->vocab > 0 && c->eos_id >= c->vocab)
    problem(pr, "eos_token_id is outside the vocabulary%s%s", "", "");
}

ct_status ct_textenc_config_read(const char *path, ct_textenc_config *c, ct_err *err) {
  ct_json *j = NULL;
  ct_status st = ct_json_parse_file(path, 1 << 20, &j, err);
  if (st) return st;
  problems pr = {.n = 0};
  ct_textenc_config_default(64, c);
  if (j->type != CT_JSON_OBJECT) {
    problem(&pr, "not a JSON object%s%s", "", "");
  } else {
    read_fields(j, c, &pr);
    char unknown[512] = "";
    int nu = 0;
    for (size_t i = 0; i < j->n; i++) {
      const char *k = j->keys[i];
      if (listed(READ, sizeof READ / sizeof *READ, k) ||
          listed(IGNORED, sizeof IGNORED / sizeof *IGNORED, k))
        continue;
      size_t l = strlen(unknown);
      if (l + strlen(k) + 8 < sizeof unknown)
        snprintf(unknown + l, sizeof unknown - l, "%s%s", nu ? ", " : "", k);
      nu++;
    }
    if (nu && !pr.n)
      CT_WARN("%s: %d field%s that ctuner does not know and ignores: %s", path, nu,
              nu > 1 ? "s" : "", unknown);
  }
  if (!pr.n && ct_textenc_config_validate(c, err)) problem(&pr, "%s%s", err->msg, "");
  st = pr.n ? ct_errf(err, CT_ERR_FORMAT, "%s: %s", path, pr.buf) : CT_OK;
  ct_json_free(j);
  return st;
}

/* projection_dim of a CLIPTextModelWithProjection's config.json (required). */
static ct_status read_projection(const char *path, ct_textenc_config *c, ct_err *err) {
  ct_json *j = NULL;
  ct_status st = ct_json_parse_file(path, 1 << 20, &j, err);
  if (st) return st;
  const ct_json *v = ct_json_get(j, "projection_dim");
  if (!v || v->type != CT_JSON_NUMBER || !v->is_int || v->i64 < 1 || v->i64 > (1 << 16))
    st = ct_errf(err, CT_ERR_FORMAT,
                 "%s: \"projection_dim\" (a positive integer) is required for "
                 "CLIPTextModelWithProjection",
                 path);
  else
    c->projection_dim = (int)v->i64;
  ct_json_free(j);
  return st;
}

static ct_status open_dir(const char *dir, int with_projection, ct_textenc **out, ct_err *err) {
  char path[4096];
  ct_textenc_config c;
  *out = NULL;
  if (ct_pathf(path, sizeof path, "%s/config.json", dir))
    return ct_errf(err, CT_ERR_INVALID, "%s: path too long", dir);
  ct_status st = ct_textenc_config_read(path, &c, err);
  if (!st && with_projection) st = read_projection(path, &c, err);
  if (!st) st = ct_textenc_alloc(&c, out, err);
  if (!st) st = ct_textenc_load(*out, dir, err);
  if (st) {
    ct_textenc_free(*out);
    *out = NULL;
  }
  return st;
}

ct_status ct_textenc_open_dir(const char *dir, ct_textenc **out, ct_err *err) {
  return open_dir(dir, 0, out, err);
}

ct_status ct_textenc_open_dir_projection(const char *dir, ct_textenc **out, ct_err *err) {
  return open_dir(dir, 1, out, err);
}

/* Loading the SentencePiece Unigram tokenizer (spm.c runs it) from
 * spiece.model or from a Hugging Face tokenizer.json.
 *
 * spiece.model is a protobuf ModelProto, read here by a minimal, bounded
 * wire-format reader: varints of at most 10 bytes, lengths checked against
 * the enclosing message, groups refused, unknown fields skipped. It takes the
 * pieces (1: piece, score, type), trainer_spec (2: model_type, byte_fallback,
 * unk_id) and normalizer_spec (3: precompiled_charsmap), and builds the
 * pipeline transformers' T5 converter builds: Precompiled, Strip right,
 * Replace " {2,}" by U+2581, Metaspace (prepend always, split), </s> appended,
 * <pad> </s> <unk> and 100 <extra_id_N> as added tokens.
 * tokenizer.json gives the same things spelled out; components this reader
 * does not know are refused by name rather than ignored.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "spm_int.h"

/* ---- protobuf wire format ---- */
typedef struct pb {
  const uint8_t *p, *end;
} pb;

static int pb_varint(pb *r, uint64_t *v) {
  uint64_t x = 0;
  for (int i = 0; i < 10; i++) {
    if (r->p >= r->end) return -1;
    uint8_t b = *r->p++;
    x |= (uint64_t)(b & 0x7F) << (7 * i);
    if (!(b & 0x80)) {
      *v = x;
      return 0;
    }
  }
  return -1;
}

/* Next field: number, wire type, varint / fixed value or (wire 2) the bytes. */
static int pb_next(pb *r, uint32_t *field, int *wire, uint64_t *val, pb *sub) {
  uint64_t key;
  if (pb_varint(r, &key) || key >> 32) return -1;
  *field = (uint32_t)(key >> 3);
  *wire = (int)(key & 7);
  *val = 0;
  switch (*wire) {
    case 0:
      return pb_varint(r, val);
    case 1:
      if (r->end - r->p < 8) return -1;
      memcpy(val, r->p, 8); /* little-endian hosts (x86-64, arm64) */
      r->p += 8;
      return 0;
    case 5: {
      uint32_t v32;
      if (r->end - r->p < 4) return -1;
      memcpy(&v32, r->p, 4);
      *val = v32;
      r->p += 4;
      return 0;
    }
    case 2: {
      uint64_t n;
      if (pb_varint(r, &n) || n > (uint64_t)(r->end - r->p)) return -1;
      sub->p = r->p;
      sub->end = r->p + n;
      r->p += n;
      return 0;
    }
    default:
      return -1; /* groups (3, 4) and reserved types */
  }
}

static char *pb_str(const pb *s) {
  size_t n = (size_t)(s->end - s->p);
  char *c = malloc(n + 1);
  if (c) {
    memcpy(c, s->p, n);
    c[n] = 0;
  }
  return c;
}

static ct_status bad(ct_err *err, const char *path, const char *what) {
  return ct_errf(err, CT_ERR_FORMAT, "%s: not a SentencePiece model (%s)", path, what);
}

static ct_status grow_pieces(ct_spm *s, int *cap, const char *path, ct_err *err) {
  if (s->npieces < *cap) return CT_OK;
  if (s->npieces >= SPM_MAX_PIECES)
    return ct_errf(err, CT_ERR_RANGE, "%s: more than %d pieces", path, SPM_MAX_PIECES);
  int nc = *cap ? 2 * *cap : 1024;
  char **p = realloc(s->piece, (size_t)nc * sizeof *p);
  if (!p) return ct_errf(err, CT_ERR_NOMEM, "out of memory (%s)", path);
  s->piece = p;
  float *sc = realloc(s->score, (size_t)nc * sizeof *sc);
  if (!sc) return ct_errf(err, CT_ERR_NOMEM, "out of memory (%s)", path);
  s->score = sc;
  *cap = nc;
  return CT_OK;
}

static ct_status read_piece(ct_spm *s, pb m, int *types_ok, const char *path, ct_err *err) {
  uint32_t f;
  int w;
  uint64_t v;
  pb sub;
  char *piece = NULL;
  float score = 0.0f;
  uint64_t type = 1;
  while (m.p < m.end) {
    if (pb_next(&m, &f, &w, &v, &sub)) {
      free(piece);
      return bad(err, path, "a piece does not parse");
    }
    if (f == 1 && w == 2) {
      free(piece);
      piece = pb_str(&sub);
      if (!piece) return ct_errf(err, CT_ERR_NOMEM, "out of memory (%s)", path);
    } else if (f == 2 && w == 5) {
      uint32_t b = (uint32_t)v;
      memcpy(&score, &b, 4);
    } else if (f == 3 && w == 0) {
      type = v;
    }
  }
  int id = s->npieces;
  if (!piece || !piece[0] || strlen(piece) > SPM_MAX_PIECE_BYTES ||
      !ct_utf8_valid(piece, strlen(piece))) {
    free(piece);
    return ct_errf(err, CT_ERR_FORMAT, "%s: piece %d is empty, longer than %d bytes or not UTF-8",
                   path, id, SPM_MAX_PIECE_BYTES);
  }
  if (type == 6) *types_ok = 0; /* BYTE: byte fallback */
  s->piece[id] = piece;
  s->score[id] = score;
  s->npieces++;
  return CT_OK;
}

static ct_status add_token(ct_spm *s, const char *content, int id, const char *path, ct_err *err) {
  char **a = realloc(s->added, (size_t)(s->nadded + 1) * sizeof *a);
  if (!a) return ct_errf(err, CT_ERR_NOMEM, "out of memory (%s)", path);
  s->added = a;
  int *ai = realloc(s->added_id, (size_t)(s->nadded + 1) * sizeof *ai);
  if (!ai) return ct_errf(err, CT_ERR_NOMEM, "out of memory (%s)", path);
  s->added_id = ai;
  s->added[s->nadded] = strdup(content);
  if (!s->added[s->nadded]) return ct_errf(err, CT_ERR_NOMEM, "out of memory (%s)", path);
  s->added_id[s->nadded++] = id;
  return CT_OK;
}

/* T5TokenizerFast's pipeline around a Unigram model (see the file comment). */
static ct_status t5_pipeline(ct_spm *s, const char *path, ct_err *err) {
  spm_norm *n = s->norm;
  int k = 0;
  if (s->ntrie) n[k++].kind = SPM_NORM_PRECOMPILED;
  n[k].kind = SPM_NORM_STRIP, n[k].right = 1, k++;
  n[k].kind = SPM_NORM_REPLACE, n[k].pat = strdup(" "), n[k].min_run = 2,
  n[k].content = strdup("\xE2\x96\x81");
  s->nnorm = k + 1;
  if (!n[k].pat || !n[k].content) return ct_errf(err, CT_ERR_NOMEM, "out of memory (%s)", path);
  s->pre[0] = (spm_pre){.kind = SPM_PRE_METASPACE, .prepend = SPM_PREPEND_ALWAYS, .split = 1};
  strcpy(s->pre[0].repl, "\xE2\x96\x81");
  s->npre = 1;
  return CT_OK;
}

static ct_status read_model_proto(ct_spm *s, const uint8_t *data, size_t size, const char *path,
                                  ct_err *err) {
  ct_status st = CT_OK;
  pb r = {data, data + size}, sub;
  uint32_t f;
  int w, cap = 0, types_ok = 1;
  uint64_t v, model_type = 1, byte_fallback = 0;
  int64_t unk_id = 0; /* trainer_spec's default */
  while (r.p < r.end && !st) {
    if (pb_next(&r, &f, &w, &v, &sub))
      return bad(err, path, "the top-level message does not parse");
    if (f == 1 && w == 2) {
      st = grow_pieces(s, &cap, path, err);
      if (!st) st = read_piece(s, sub, &types_ok, path, err);
    } else if ((f == 2 || f == 3) && w == 2) {
      pb m = sub, x;
      while (m.p < m.end) {
        uint32_t g;
        if (pb_next(&m, &g, &w, &v, &x))
          return bad(err, path,
                     f == 2 ? "trainer_spec does not parse" : "normalizer_spec does not parse");
        if (f == 2 && g == 3 && w == 0) model_type = v;
        if (f == 2 && g == 35 && w == 0) byte_fallback = v;
        if (f == 2 && g == 40 && w == 0) unk_id = (int64_t)v;
        if (f == 3 && g == 2 && w == 2) {
          free(s->trie), free(s->normalized);
          s->trie = NULL, s->normalized = NULL, s->ntrie = 0;
          st = spm_set_charsmap(s, x.p, (size_t)(x.end - x.p), path, err);
          if (st) return st;
        }
      }
    }
  }
  if (st) return st;
  if (model_type != 1)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: SentencePiece model type %s; ctuner reads Unigram models (T5's)", path,
                   model_type == 2   ? "BPE"
                   : model_type == 3 ? "WORD"
                                     : "CHAR");
  if (byte_fallback || !types_ok)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: byte fallback pieces are not supported (T5's tokenizer has none)", path);
  if (!s->npieces) return bad(err, path, "no pieces");
  s->unk = unk_id >= 0 && unk_id < s->npieces ? (int)unk_id : -1;
  return CT_OK;
}

static int piece_index(const ct_spm *s, const char *p) {
  for (int i = 0; i < s->npieces; i++)
    if (!strcmp(s->piece[i], p)) return i;
  return -1;
}

ct_status ct_spm_load_model(const char *path, ct_spm **out, ct_err *err) {
  ct_status st = CT_OK;
  char *data = NULL;
  size_t size = 0;
  ct_spm *s = calloc(1, sizeof *s);
  *out = NULL;
  if (!s) return ct_errf(err, CT_ERR_NOMEM, "out of memory (%s)", path);
  st = ct_read_file(path, SPM_MAX_FILE, &data, &size, err);
  if (st) goto out;
  st = read_model_proto(s, (const uint8_t *)data, size, path, err);
  if (st) goto out;
  s->eos = piece_index(s, "</s>");
  s->pad = piece_index(s, "<pad>");
  const char *special[] = {"<pad>", "</s>", "<unk>"};
  for (int i = 0; i < 3 && !st; i++) {
    int id = piece_index(s, special[i]);
    if (id >= 0) st = add_token(s, special[i], id, path, err);
  }
  for (int i = 0; i < 100 && !st; i++) {
    char name[32];
    snprintf(name, sizeof name, "<extra_id_%d>", i);
    st = add_token(s, name, s->npieces + 99 - i, path, err);
  }
  if (!st) st = t5_pipeline(s, path, err);
  if (!st) st = spm_finish(s, path, err);
  if (st) goto out;
  *out = s;
  s = NULL;
out:
  free(data);
  ct_spm_free(s);
  return st;
}

/* ---- tokenizer.json ---- */

static int b64val(int c) {
  return c >= 'A' && c <= 'Z'   ? c - 'A'
         : c >= 'a' && c <= 'z' ? c - 'a' + 26
         : c >= '0' && c <= '9' ? c - '0' + 52
         : c == '+'             ? 62
         : c == '/'             ? 63
                                : -1;
}

/* Standard base64 with '=' padding; NULL on a bad character. */
static uint8_t *b64dec(const char *s, size_t n, size_t *out_n) {
  uint8_t *o = malloc(n / 4 * 3 + 3);
  size_t k = 0;
  uint32_t acc = 0;
  int bits = 0;
  if (!o) return NULL;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '=') break;
    int v = b64val((unsigned char)s[i]);
    if (v < 0) {
      free(o);
      return NULL;
    }
    acc = (acc << 6) | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      o[k++] = (uint8_t)(acc >> bits);
    }
  }
  *out_n = k;
  return o;
}

static const char *jstr(const ct_json *o, const char *key) {
  const ct_json *v = ct_json_get(o, key);
  return v && v->type == CT_JSON_STRING ? v->str : NULL;
}

static ct_status refuse(ct_err *err, const char *path, const char *where, const char *what) {
  return ct_errf(err, CT_ERR_UNSUPPORTED,
                 "%s: %s '%s' is not supported (ctuner reads T5's tokenizer: Unigram model, "
                 "Precompiled/Strip/Replace normalizers, Metaspace/WhitespaceSplit "
                 "pre-tokenizers)",
                 path, where, what ? what : "?");
}

static ct_status json_norm(ct_spm *s, const ct_json *n, const char *path, ct_err *err) {
  const char *type = jstr(n, "type");
  if (type && !strcmp(type, "Sequence")) {
    const ct_json *list = ct_json_get(n, "normalizers");
    if (!list || list->type != CT_JSON_ARRAY) return refuse(err, path, "normalizer", "Sequence");
    for (size_t i = 0; i < list->n; i++) {
      ct_status st = json_norm(s, &list->items[i], path, err);
      if (st) return st;
    }
    return CT_OK;
  }
  if (s->nnorm == SPM_MAX_STEPS) return refuse(err, path, "normalizer", "more than 8 steps");
  spm_norm *st = &s->norm[s->nnorm];
  if (type && !strcmp(type, "Precompiled")) {
    const char *b = jstr(n, "precompiled_charsmap");
    if (!b) return CT_OK; /* no charsmap: identity */
    size_t len = 0;
    uint8_t *blob = b64dec(b, strlen(b), &len);
    if (!blob) return ct_errf(err, CT_ERR_FORMAT, "%s: precompiled_charsmap is not base64", path);
    ct_status r = spm_set_charsmap(s, blob, len, path, err);
    free(blob);
    if (r) return r;
    st->kind = SPM_NORM_PRECOMPILED;
  } else if (type && !strcmp(type, "Strip")) {
    const ct_json *l = ct_json_get(n, "strip_left"), *r = ct_json_get(n, "strip_right");
    st->kind = SPM_NORM_STRIP;
    st->left = l && l->type == CT_JSON_BOOL && l->boolean;
    st->right = r && r->type == CT_JSON_BOOL && r->boolean;
  } else if (type && !strcmp(type, "Replace")) {
    const ct_json *pat = ct_json_get(n, "pattern");
    const char *lit = jstr(pat, "String"), *re = jstr(pat, "Regex"), *content = jstr(n, "content");
    int run = 0;
    char c[8] = "";
    /* a literal, or the regex "X{n,}" with X one plain character */
    if (re && !(strlen(re) >= 4 && strchr(" _-,", re[0]) && sscanf(re + 1, "{%d,}", &run) == 1 &&
                run >= 1 && re[strlen(re) - 1] == '}' && strchr(re, ',')[1] == '}'))
      return refuse(err, path, "Replace pattern", re);
    if ((!lit && !re) || !content) return refuse(err, path, "normalizer", "Replace");
    if (re) c[0] = re[0];
    st->kind = SPM_NORM_REPLACE;
    st->pat = strdup(re ? c : lit);
    st->min_run = re ? run : 0;
    st->content = strdup(content);
    if (!st->pat || !st->content) return ct_errf(err, CT_ERR_NOMEM, "out of memory (%s)", path);
  } else {
    return refuse(err, path, "normalizer", type);
  }
  s->nnorm++;
  return CT_OK;
}

static ct_status json_pre(ct_spm *s, const ct_json *p, const char *path, ct_err *err) {
  const char *type = jstr(p, "type");
  if (type && !strcmp(type, "Sequence")) {
    const ct_json *list = ct_json_get(p, "pretokenizers");
    if (!list || list->type != CT_JSON_ARRAY) return refuse(err, path, "pre_tokenizer", "Sequence");
    for (size_t i = 0; i < list->n; i++) {
      ct_status st = json_pre(s, &list->items[i], path, err);
      if (st) return st;
    }
    return CT_OK;
  }
  if (s->npre == SPM_MAX_STEPS) return refuse(err, path, "pre_tokenizer", "more than 8 steps");
  spm_pre *st = &s->pre[s->npre];
  if (type && !strcmp(type, "WhitespaceSplit")) {
    st->kind = SPM_PRE_WHITESPACE_SPLIT;
  } else if (type && !strcmp(type, "Metaspace")) {
    const char *repl = jstr(p, "replacement"), *scheme = jstr(p, "prepend_scheme");
    const ct_json *aps = ct_json_get(p, "add_prefix_space"), *split = ct_json_get(p, "split");
    if (!repl || strlen(repl) >= sizeof st->repl || !repl[0])
      return refuse(err, path, "Metaspace replacement", repl);
    st->kind = SPM_PRE_METASPACE;
    strcpy(st->repl, repl);
    st->split = !(split && split->type == CT_JSON_BOOL && !split->boolean);
    if (scheme)
      st->prepend = !strcmp(scheme, "always")  ? SPM_PREPEND_ALWAYS
                    : !strcmp(scheme, "first") ? SPM_PREPEND_FIRST
                    : !strcmp(scheme, "never") ? SPM_PREPEND_NEVER
                                               : -1;
    else
      st->prepend = aps && aps->type == CT_JSON_BOOL && !aps->boolean ? SPM_PREPEND_NEVER
                                                                      : SPM_PREPEND_ALWAYS;
    if (st->prepend < 0) return refuse(err, path, "Metaspace prepend_scheme", scheme);
  } else {
    return refuse(err, path, "pre_tokenizer", type);
  }
  s->npre++;
  return CT_OK;
}

/* model: Unigram vocab [[piece, score]], unk_id, no byte fallback. */
static ct_status json_model(ct_spm *s, const ct_json *m, const char *path, ct_err *err) {
  const char *type = jstr(m, "type");
  const ct_json *vocab = ct_json_get(m, "vocab"), *unk = ct_json_get(m, "unk_id"),
                *bf = ct_json_get(m, "byte_fallback");
  int cap = 0;
  if (!type || strcmp(type, "Unigram")) return refuse(err, path, "model type", type);
  if (bf && bf->type == CT_JSON_BOOL && bf->boolean)
    return refuse(err, path, "Unigram option", "byte_fallback");
  if (!vocab || vocab->type != CT_JSON_ARRAY || !vocab->n)
    return ct_errf(err, CT_ERR_FORMAT, "%s: model.vocab is not a non-empty array", path);
  for (size_t i = 0; i < vocab->n; i++) {
    const ct_json *e = &vocab->items[i];
    if (e->type != CT_JSON_ARRAY || e->n != 2 || e->items[0].type != CT_JSON_STRING ||
        e->items[1].type != CT_JSON_NUMBER || !e->items[0].len ||
        e->items[0].len > SPM_MAX_PIECE_BYTES || strlen(e->items[0].str) != e->items[0].len)
      return ct_errf(err, CT_ERR_FORMAT,
                     "%s: model.vocab[%zu] (line %d) is not [piece, score] with a piece of 1 to "
                     "%d bytes",
                     path, i, e->line, SPM_MAX_PIECE_BYTES);
    ct_status st = grow_pieces(s, &cap, path, err);
    if (st) return st;
    s->piece[s->npieces] = strdup(e->items[0].str);
    if (!s->piece[s->npieces]) return ct_errf(err, CT_ERR_NOMEM, "out of memory (%s)", path);
    s->score[s->npieces++] = (float)e->items[1].num;
  }
  if (!unk || unk->type != CT_JSON_NUMBER || !unk->is_int)
    return ct_errf(err, CT_ERR_FORMAT, "%s: model.unk_id must be an integer (T5: 2)", path);
  s->unk = unk->i64 >= 0 && unk->i64 < s->npieces ? (int)unk->i64 : -1;
  return CT_OK;
}

/* post_processor: TemplateProcessing "$A </s>" (T5's); the token it appends is eos. */
static ct_status json_post(ct_spm *s, const ct_json *p, const char *path, ct_err *err) {
  const ct_json *single = ct_json_get(p, "single");
  const char *type = jstr(p, "type");
  if (!type || strcmp(type, "TemplateProcessing") || !single || single->type != CT_JSON_ARRAY ||
      single->n != 2 || !ct_json_get(&single->items[0], "Sequence") ||
      !ct_json_get(&single->items[1], "SpecialToken"))
    return refuse(err, path, "post_processor (need TemplateProcessing \"$A </s>\")",
                  type ? type : "null");
  const char *tok = jstr(ct_json_get(&single->items[1], "SpecialToken"), "id");
  s->eos = tok ? ct_spm_piece_id(s, tok) : -1;
  return CT_OK;
}

ct_status ct_spm_load_json(const char *path, ct_spm **out, ct_err *err) {
  ct_status st = CT_OK;
  ct_json *j = NULL;
  ct_spm *s = calloc(1, sizeof *s);
  *out = NULL;
  if (!s) return ct_errf(err, CT_ERR_NOMEM, "out of memory (%s)", path);
  st = ct_json_parse_file(path, SPM_MAX_FILE, &j, err);
  if (st) goto out;
  st = json_model(s, ct_json_get(j, "model"), path, err);
  const ct_json *added = ct_json_get(j, "added_tokens");
  for (size_t i = 0; !st && added && added->type == CT_JSON_ARRAY && i < added->n; i++) {
    const ct_json *a = &added->items[i], *id = ct_json_get(a, "id");
    const char *content = jstr(a, "content");
    if (!content || !content[0] || !id || !id->is_int || id->i64 < 0 || id->i64 >= SPM_MAX_PIECES)
      st = ct_errf(err, CT_ERR_FORMAT, "%s: added_tokens[%zu] needs a content and an id", path, i);
    else
      st = add_token(s, content, (int)id->i64, path, err);
  }
  const ct_json *norm = ct_json_get(j, "normalizer"), *pre = ct_json_get(j, "pre_tokenizer");
  if (!st && norm && norm->type != CT_JSON_NULL) st = json_norm(s, norm, path, err);
  if (!st && pre && pre->type != CT_JSON_NULL) st = json_pre(s, pre, path, err);
  s->pad = piece_index(s, "<pad>");
  if (!st) st = spm_finish(s, path, err); /* the hash table json_post looks eos up in */
  if (!st) st = json_post(s, ct_json_get(j, "post_processor"), path, err);
  if (!st && s->eos < 0)
    st = ct_errf(err, CT_ERR_FORMAT, "%s: the post_processor's token is not in the vocabulary",
                 path);
  if (st) goto out;
  *out = s;
  s = NULL;
out:
  ct_json_free(j);
  ct_spm_free(s);
  return st;
}

ct_status ct_spm_load_dir(const char *dir, ct_spm **out, ct_err *err) {
  char p[4096];
  if (snprintf(p, sizeof p, "%s/tokenizer.json", dir) >= (int)sizeof p)
    return ct_errf(err, CT_ERR_RANGE, "path too long: %s", dir);
  FILE *f = fopen(p, "rb");
  if (f) {
    fclose(f);
    return ct_spm_load_json(p, out, err);
  }
  snprintf(p, sizeof p, "%s/spiece.model", dir);
  f = fopen(p, "rb");
  if (!f)
    return ct_errf(err, CT_ERR_NOT_FOUND,
                   "%s has neither tokenizer.json nor spiece.model (a T5 tokenizer_2 directory)",
                   dir);
  fclose(f);
  return ct_spm_load_model(p, out, err);
}

/* The CLIP BPE tokenizer (OpenAI CLIP / Hugging Face CLIPTokenizer) over a
 * user's vocab.json + merges.txt.
 *
 * text -> collapse whitespace runs to one space, strip, lowercase (ASCII)
 *      -> split into pieces: <|startoftext|>, <|endoftext|>, 's 't 're 've 'm 'll 'd,
 *         letter runs, single digits, runs of other non-space characters
 *      -> each piece: bytes mapped to printable code points (bytes_to_unicode),
 *         "</w>" appended to the last, then merges applied lowest rank first
 *      -> vocabulary ids (a symbol missing from the vocabulary becomes the
 *         unknown token, which for CLIP is <|endoftext|>).
 * Those are the older rules of ct_bpe_load, kept so that existing text caches
 * do not change; their approximations (docs/text_encoder.md): non-ASCII bytes
 * count as letters (\p{L}), non-ASCII text is neither NFC-normalised nor
 * lowercased. A tokenizer directory (ct_bpe_load_dir) tokenizes exactly as
 * transformers' CLIPTokenizer without ftfy: exact_tokens, over clip_norm.c.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/textenc.h"
#include "text/bpe_int.h"

/* ---- string -> int hash map (open addressing, FNV-1a) ---- */
typedef struct smap {
  char **keys;
  int *vals;
  size_t cap, n;
} smap;

static uint64_t fnv(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
  return h;
}

static int smap_find(const smap *m, const char *k, size_t n) {
  if (!m->cap) return -1;
  for (size_t i = fnv(k, n) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    if (!m->keys[i]) return -1;
    if (strlen(m->keys[i]) == n && !memcmp(m->keys[i], k, n)) return m->vals[i];
  }
}

/* Insert or overwrite (last wins, as in a Python dict built from the file). */
static int smap_put(smap *m, const char *k, size_t n, int v) {
  if (2 * (m->n + 1) > m->cap) {
    size_t nc = m->cap ? 2 * m->cap : 1024;
    char **nk = calloc(nc, sizeof *nk);
    int *nv = calloc(nc, sizeof *nv);
    if (!nk || !nv) {
      free(nk);
      free(nv);
      return -1;
    }
    for (size_t i = 0; i < m->cap; i++)
      if (m->keys[i]) {
        size_t j = fnv(m->keys[i], strlen(m->keys[i])) & (nc - 1);
        while (nk[j]) j = (j + 1) & (nc - 1);
        nk[j] = m->keys[i];
        nv[j] = m->vals[i];
      }
    free(m->keys);
    free(m->vals);
    m->keys = nk;
    m->vals = nv;
    m->cap = nc;
  }
  size_t i = fnv(k, n) & (m->cap - 1);
  for (; m->keys[i]; i = (i + 1) & (m->cap - 1))
    if (strlen(m->keys[i]) == n && !memcmp(m->keys[i], k, n)) {
      m->vals[i] = v;
      return 0;
    }
  m->keys[i] = malloc(n + 1);
  if (!m->keys[i]) return -1;
  memcpy(m->keys[i], k, n);
  m->keys[i][n] = 0;
  m->vals[i] = v;
  m->n++;
  return 0;
}

static void smap_free(smap *m) {
  for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
  free(m->keys);
  free(m->vals);
}

struct ct_bpe {
  smap vocab; /* symbol -> id */
  smap ranks; /* "left right" -> merge rank */
  int nvocab; /* max id + 1 */
  int bos, eos, pad, unk;
  int max_len;           /* model_max_length */
  int rules;             /* CT_BPE_*: ctuner's older rules, CLIPTokenizer, CLIPTokenizerFast */
  char byte_sym[256][4]; /* bytes_to_unicode as UTF-8 */
};

/* CLIP's bytes_to_unicode: printable Latin-1 bytes map to themselves, the rest
 * to 256, 257, ... in byte order. */
static void byte_table(ct_bpe *b) {
  int n = 0;
  for (int c = 0; c < 256; c++) {
    int keep = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
    int cp = keep ? c : 256 + n++;
    char *o = b->byte_sym[c];
    if (cp < 0x80) {
      o[0] = (char)cp;
      o[1] = 0;
    } else { /* all code points here are < 0x800: two bytes */
      o[0] = (char)(0xC0 | (cp >> 6));
      o[1] = (char)(0x80 | (cp & 0x3F));
      o[2] = 0;
    }
  }
}

static char *read_all(const char *path, size_t *len, ct_err *err) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    ct_errf(err, CT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  while (buf) {
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (n < cap) break;
    if (cap >= ((size_t)1 << 30)) { /* 1 GiB: no tokenizer file is that large */
      free(buf);
      buf = NULL;
      ct_errf(err, CT_ERR_INVALID, "%s: larger than 1 GiB; not a tokenizer file", path);
      fclose(f);
      return NULL;
    }
    char *nb = realloc(buf, 2 * cap + 1);
    if (!nb) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = nb;
    cap *= 2;
  }
  int bad = ferror(f);
  fclose(f);
  if (!buf) {
    ct_errf(err, CT_ERR_NOMEM, "%s: out of memory", path);
    return NULL;
  }
  if (bad) {
    free(buf);
    ct_errf(err, CT_ERR_IO, "%s: read error", path);
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

void ct_bpe_free(ct_bpe *b) {
  if (!b) return;
  smap_free(&b->vocab);
  smap_free(&b->ranks);
  free(b);
}

ct_status ct_bpe_set_merges(ct_bpe *b, const char *text, size_t len, const char *name,
                            ct_err *err) {
  smap ranks = {0};
  ct_status st = CT_OK;
  int rank = 0, line = 0;
  const char *end = memchr(text, 0, len); /* the text ends at the first NUL, as a C string */
  if (!end) end = text + len;
  for (const char *p = text; p < end;) {
    const char *e = memchr(p, '\n', (size_t)(end - p));
    size_t n = e ? (size_t)(e - p) : (size_t)(end - p);
    line++;
    if (n && p[n - 1] == '\r') n--;
    if (line == 1 && n >= 8 && !memcmp(p, "#version", 8)) {
      /* header line of CLIP's merges file */
    } else if (n) {
      const char *sp = memchr(p, ' ', n);
      if (!sp || sp == p || sp == p + n - 1 || memchr(sp + 1, ' ', (size_t)(p + n - sp - 1))) {
        st = ct_errf(err, CT_ERR_FORMAT,
                     "%s:%d: expected two symbols separated by one space: \"%.*s\"", name, line,
                     (int)(n > 60 ? 60 : n), p);
        goto out;
      }
      if (smap_find(&ranks, p, n) < 0 && smap_put(&ranks, p, n, rank)) {
        st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
        goto out;
      }
      rank++;
    }
    if (!e) break;
    p = e + 1;
  }
out:
  if (st) {
    smap_free(&ranks);
  } else {
    smap_free(&b->ranks);
    b->ranks = ranks;
  }
  return st;
}

/* The vocabulary {"token": id, ...} (vocab.json, or tokenizer.json's
 * model.vocab) into b, with CLIP's bos/eos. */
static ct_status set_vocab(ct_bpe *b, const ct_json *j, const char *name, ct_err *err) {
  if (j->type != CT_JSON_OBJECT || j->n == 0)
    return ct_errf(err, CT_ERR_FORMAT, "%s: expected a JSON object {\"token\": id, ...}", name);
  for (size_t i = 0; i < j->n; i++) {
    const ct_json *v = &j->items[i];
    if (v->type != CT_JSON_NUMBER || !v->is_int || v->i64 < 0 || v->i64 >= (1 << 22))
      return ct_errf(err, CT_ERR_FORMAT,
                     "%s:%d:%d: the id of token \"%.40s\" must be an integer in [0, 4194304)", name,
                     v->line, v->col, j->keys[i]);
    if (smap_put(&b->vocab, j->keys[i], strlen(j->keys[i]), (int)v->i64))
      return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    if ((int)v->i64 + 1 > b->nvocab) b->nvocab = (int)v->i64 + 1;
  }
  b->bos = smap_find(&b->vocab, "<|startoftext|>", 15);
  b->eos = b->pad = b->unk = smap_find(&b->vocab, "<|endoftext|>", 13);
  b->max_len = 77;
  if (b->bos < 0 || b->eos < 0)
    return ct_errf(err, CT_ERR_INVALID, "%s: the vocabulary lacks %s (CLIP's special tokens)", name,
                   b->bos < 0 ? "<|startoftext|>" : "<|endoftext|>");
  return CT_OK;
}

ct_status ct_bpe_load(const char *vocab_path, const char *merges_path, ct_bpe **out, ct_err *err) {
  *out = NULL;
  ct_bpe *b = calloc(1, sizeof *b);
  if (!b) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  byte_table(b);
  ct_status st = CT_OK;
  size_t len;
  ct_json *j = NULL;
  char *text = read_all(vocab_path, &len, err);
  if (!text) {
    st = err->status ? err->status : CT_ERR_IO;
    goto fail;
  }
  ct_err jerr = {0};
  if (ct_json_parse(text, len, &j, &jerr)) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: %s", vocab_path, jerr.msg);
    goto fail;
  }
  st = set_vocab(b, j, vocab_path, err);
  if (st) goto fail;
  ct_json_free(j);
  j = NULL;
  free(text);
  text = read_all(merges_path, &len, err);
  if (!text) {
    st = err->status ? err->status : CT_ERR_IO;
    goto fail;
  }
  st = ct_bpe_set_merges(b, text, len, merges_path, err);
  if (st) goto fail;
  free(text);
  *out = b;
  return CT_OK;
fail:
  ct_json_free(j);
  free(text);
  ct_bpe_free(b);
  return st;
}

/* tokenizer.json's model.merges ("a b" strings, or ["a", "b"] pairs as
 * tokenizers >= 0.20 writes them) as merges.txt's lines, into b. */
static ct_status json_merges(ct_bpe *b, const ct_json *m, const char *name, ct_err *err) {
  if (!m || m->type != CT_JSON_ARRAY)
    return ct_errf(err, CT_ERR_FORMAT, "%s: model.merges is not an array", name);
  size_t cap = 1, n = 0;
  for (size_t i = 0; i < m->n; i++) {
    const ct_json *e = &m->items[i];
    if (e->type == CT_JSON_STRING)
      cap += strlen(e->str) + 1;
    else if (e->type == CT_JSON_ARRAY && e->n == 2 && e->items[0].type == CT_JSON_STRING &&
             e->items[1].type == CT_JSON_STRING)
      cap += strlen(e->items[0].str) + strlen(e->items[1].str) + 2;
    else
      return ct_errf(err, CT_ERR_FORMAT,
                     "%s:%d:%d: a merge must be \"a b\" or [\"a\", \"b\"] (merge %zu)", name,
                     e->line, e->col, i + 1);
  }
  char *text = malloc(cap);
  if (!text) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < m->n; i++) {
    const ct_json *e = &m->items[i];
    n += (size_t)(e->type == CT_JSON_STRING
                      ? sprintf(text + n, "%s\n", e->str)
                      : sprintf(text + n, "%s %s\n", e->items[0].str, e->items[1].str));
  }
  ct_status st = ct_bpe_set_merges(b, text, n, name, err);
  free(text);
  return st;
}

/* A CLIP BPE tokenizer from tokenizer.json alone (transformers 5 saves
 * CLIPTokenizer so: no vocab.json / merges.txt): its model section must be
 * CLIP's (BPE, end_of_word_suffix "</w>", no continuing_subword_prefix). */
static ct_status load_tokenizer_json(const char *path, ct_bpe **out, ct_err *err) {
  ct_json *j = NULL;
  ct_status st = ct_json_parse_file(path, (size_t)1 << 28, &j, err);
  if (st) return st;
  const ct_json *m = ct_json_get(j, "model");
  const ct_json *type = m ? ct_json_get(m, "type") : NULL,
                *eow = m ? ct_json_get(m, "end_of_word_suffix") : NULL,
                *csp = m ? ct_json_get(m, "continuing_subword_prefix") : NULL;
  ct_bpe *b = calloc(1, sizeof *b);
  if (!b) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  if (!st && (!type || type->type != CT_JSON_STRING || strcmp(type->str, "BPE")))
    st = ct_errf(err, CT_ERR_UNSUPPORTED,
                 "%s: model.type is %s; a CLIP tokenizer is BPE (tokenizer/ of a FluxPipeline)",
                 path, type && type->type == CT_JSON_STRING ? type->str : "missing");
  if (!st && (!eow || eow->type != CT_JSON_STRING || strcmp(eow->str, "</w>") ||
              (csp && csp->type == CT_JSON_STRING && csp->str[0])))
    st = ct_errf(err, CT_ERR_UNSUPPORTED,
                 "%s: a BPE model without CLIP's end_of_word_suffix \"</w>\" (or with a "
                 "continuing_subword_prefix): not a CLIP tokenizer",
                 path);
  if (!st) {
    byte_table(b);
    const ct_json *v = ct_json_get(m, "vocab");
    st = v ? set_vocab(b, v, path, err)
           : ct_errf(err, CT_ERR_FORMAT, "%s: model.vocab is missing", path);
  }
  if (!st) st = json_merges(b, ct_json_get(m, "merges"), path, err);
  ct_json_free(j);
  if (st) {
    ct_bpe_free(b);
    return st;
  }
  *out = b;
  return CT_OK;
}

int ct_bpe_vocab_size(const ct_bpe *b) {
  return b->nvocab;
}
int ct_bpe_bos(const ct_bpe *b) {
  return b->bos;
}
int ct_bpe_eos(const ct_bpe *b) {
  return b->eos;
}
void ct_bpe_set_rules(ct_bpe *b, int rules) {
  CT_ASSERT(rules >= CT_BPE_CTUNER && rules <= CT_BPE_CLIP_FAST);
  b->rules = rules;
}
int ct_bpe_rules(const ct_bpe *b) {
  return b->rules;
}
int ct_bpe_pad(const ct_bpe *b) {
  return b->pad;
}
int ct_bpe_max_length(const ct_bpe *b) {
  return b->max_len;
}

/* A special token of tokenizer_config.json / special_tokens_map.json: a
 * string or an AddedToken object {"content": ...}; its id, -2 if absent, -1
 * if it is not in the vocabulary or not a token. */
static int special_id(const ct_bpe *b, const ct_json *cfg, const char *key, const char **name) {
  const ct_json *v = cfg ? ct_json_get(cfg, key) : NULL;
  if (v && v->type == CT_JSON_OBJECT) v = ct_json_get(v, "content");
  if (!v || v->type == CT_JSON_NULL) return -2;
  if (v->type != CT_JSON_STRING) return -1;
  *name = v->str;
  return smap_find(&b->vocab, v->str, strlen(v->str));
}

/* tokenizer_config.json, then special_tokens_map.json for what it lacks. */
static ct_status read_tok_config(ct_bpe *b, const char *dir, ct_err *err) {
  static const char *const files[] = {"tokenizer_config.json", "special_tokens_map.json"};
  static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
  int done[4] = {0}, *slot[4] = {&b->bos, &b->eos, &b->unk, &b->pad};
  for (int f = 0; f < 2; f++) {
    char path[4096];
    ct_json *j = NULL;
    if (ct_pathf(path, sizeof path, "%s/%s", dir, files[f]))
      return ct_errf(err, CT_ERR_INVALID, "%s: path too long", dir);
    FILE *probe = fopen(path, "rb");
    if (!probe) continue;
    fclose(probe);
    ct_status st = ct_json_parse_file(path, 1 << 24, &j, err);
    if (st) return st;
    for (int k = 0; k < 4 && !st; k++) {
      const char *name = "?";
      int id = done[k] ? -2 : special_id(b, j, keys[k], &name);
      if (id == -1)
        st = ct_errf(err, CT_ERR_FORMAT, "%s: %s \"%s\" is not in the vocabulary", path, keys[k],
                     name);
      else if (id >= 0)
        *slot[k] = id, done[k] = 1;
    }
    const ct_json *ml = ct_json_get(j, "model_max_length");
    if (!st && f == 0 && ml) {
      if (ml->type != CT_JSON_NUMBER || !ml->is_int || ml->i64 < 2 || ml->i64 > (1 << 16))
        st = ct_errf(err, CT_ERR_FORMAT,
                     "%s: model_max_length must be an integer in [2, 65536] (FluxPipeline pads "
                     "CLIP prompts to it: 77)",
                     path);
      else
        b->max_len = (int)ml->i64;
    }
    ct_json_free(j);
    if (st) return st;
  }
  if (b->bos != smap_find(&b->vocab, "<|startoftext|>", 15) ||
      b->eos != smap_find(&b->vocab, "<|endoftext|>", 13))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: bos/eos tokens other than <|startoftext|> / <|endoftext|> are not "
                   "supported (CLIP's pattern and pooling rely on them)",
                   dir);
  return CT_OK;
}

ct_status ct_bpe_load_dir(const char *dir, ct_bpe **out, ct_err *err) {
  char v[4096], m[4096], t[4096];
  *out = NULL;
  if (ct_pathf(v, sizeof v, "%s/vocab.json", dir) || ct_pathf(m, sizeof m, "%s/merges.txt", dir) ||
      ct_pathf(t, sizeof t, "%s/tokenizer.json", dir))
    return ct_errf(err, CT_ERR_INVALID, "%s: path too long", dir);
  ct_bpe *b = NULL;
  ct_status st;
  /* vocab.json + merges.txt (FLUX.1's repositories, transformers 4), else
   * tokenizer.json alone (what transformers 5 saves: its CLIPTokenizer is the
   * tokenizers-backed one, whose rules are CLIPTokenizerFast's — no CJK
   * spacing, control characters kept: tests/test_tokenizer_tf5.c) */
  const int fast = access(v, F_OK) && access(m, F_OK) && !access(t, F_OK);
  if (fast)
    st = load_tokenizer_json(t, &b, err);
  else
    st = ct_bpe_load(v, m, &b, err);
  if (!st) st = read_tok_config(b, dir, err);
  if (st) {
    ct_bpe_free(b);
    return st;
  }
  b->rules = fast ? CT_BPE_CLIP_FAST : CT_BPE_CLIP;
  *out = b;
  return CT_OK;
}

/* The ids of a text, written up to cap and counted past it. */
typedef struct emitter {
  int32_t *ids;
  int cap, n;
} emitter;

static void push(emitter *e, int id) {
  if (e->n < e->cap) e->ids[e->n] = id;
  e->n++;
}

/* Rank of the merge (off[i], len[i]) + (off[i+1], len[i+1]) in buf, or -1. */
static int pair_rank(const ct_bpe *b, const char *buf, const int *off, const int *len, int i) {
  char key[512];
  int kl = len[i] + 1 + len[i + 1];
  if (kl >= (int)sizeof key) return -1;
  memcpy(key, buf + off[i], (size_t)len[i]);
  key[len[i]] = ' ';
  memcpy(key + len[i] + 1, buf + off[i + 1], (size_t)len[i + 1]);
  return smap_find(&b->ranks, key, (size_t)kl);
}

/* BPE of one piece; emits ids through push. Symbols are kept as (offset, len)
 * into one growing string of the piece's mapped characters; rk[i] caches the
 * rank of the pair (i, i+1), so a merge pass looks up only the pairs next to
 * the symbols it made (the piece's merges cost O(n) lookups, not O(n^2)). */
static void bpe_piece(const ct_bpe *b, const char *s, size_t n, emitter *e) {
  /* mapped text: every byte's symbol, then "</w>" belongs to the last symbol */
  size_t cap = n * 2 + 5;
  char stackbuf[1024];
  int stackoff[512], stacklen[512], stackrk[512];
  unsigned char stacknew[512];
  char *buf = cap <= sizeof stackbuf ? stackbuf : malloc(cap);
  int *off = n <= 512 ? stackoff : malloc(n * sizeof *off);
  int *len = n <= 512 ? stacklen : malloc(n * sizeof *len);
  int *rk = n <= 512 ? stackrk : malloc(n * sizeof *rk);
  unsigned char *made = n <= 512 ? stacknew : malloc(n);
  if (!buf || !off || !len || !rk || !made) { /* out of memory: the piece becomes unknown */
    push(e, b->eos);
    goto done;
  }
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    const char *sym = b->byte_sym[(uint8_t)s[i]];
    off[i] = (int)m;
    len[i] = (int)strlen(sym);
    memcpy(buf + m, sym, (size_t)len[i]);
    m += (size_t)len[i];
  }
  memcpy(buf + m, "</w>", 4);
  len[n - 1] += 4;
  /* Symbols are contiguous in buf, so a merged symbol is (off[i], len[i] + len[i+1]). */
  int ns = (int)n;
  for (int i = 0; i + 1 < ns; i++) rk[i] = pair_rank(b, buf, off, len, i);
  for (;;) {
    int best = -1, bestrank = 0x7fffffff;
    for (int i = 0; i + 1 < ns; i++)
      if (rk[i] >= 0 && rk[i] < bestrank) bestrank = rk[i], best = i;
    if (best < 0) break;
    /* merge every occurrence of that pair, left to right (as CLIP does) */
    int la = len[best], lb = len[best + 1];
    const char *A = buf + off[best], *Bs = buf + off[best + 1];
    char pa[256], pb[256];
    if (la >= 256 || lb >= 256) break;
    memcpy(pa, A, (size_t)la);
    memcpy(pb, Bs, (size_t)lb);
    int w = 0;
    for (int i = 0; i < ns;) {
      if (i + 1 < ns && len[i] == la && len[i + 1] == lb && !memcmp(buf + off[i], pa, (size_t)la) &&
          !memcmp(buf + off[i + 1], pb, (size_t)lb)) {
        off[w] = off[i];
        len[w] = la + lb;
        made[w] = 1;
        i += 2;
      } else {
        off[w] = off[i];
        len[w] = len[i];
        made[w] = 0;
        rk[w] = rk[i]; /* the pair (i, i+1) stays (w, w+1) unless w+1 is a new symbol */
        i++;
      }
      w++;
    }
    ns = w;
    if (ns == 1) break;
    for (int i = 0; i + 1 < ns; i++)
      if (made[i] || made[i + 1]) rk[i] = pair_rank(b, buf, off, len, i);
  }
  for (int i = 0; i < ns; i++) {
    int id = smap_find(&b->vocab, buf + off[i], (size_t)len[i]);
    push(e, id >= 0 ? id : b->unk);
  }
done:
  if (buf != stackbuf) free(buf);
  if (off != stackoff) free(off);
  if (len != stacklen) free(len);
  if (rk != stackrk) free(rk);
  if (made != stacknew) free(made);
}

/* ---- transformers' CLIPTokenizer (no ftfy), code point for code point ---- */

static size_t put_utf8(char *o, uint32_t c) {
  if (c < 0x80) return o[0] = (char)c, 1;
  if (c < 0x800) return o[0] = (char)(0xC0 | c >> 6), o[1] = (char)(0x80 | (c & 0x3F)), 2;
  if (c < 0x10000)
    return o[0] = (char)(0xE0 | c >> 12), o[1] = (char)(0x80 | ((c >> 6) & 0x3F)),
           o[2] = (char)(0x80 | (c & 0x3F)), 3;
  return o[0] = (char)(0xF0 | c >> 18), o[1] = (char)(0x80 | ((c >> 12) & 0x3F)),
         o[2] = (char)(0x80 | ((c >> 6) & 0x3F)), o[3] = (char)(0x80 | (c & 0x3F)), 4;
}

/* Does the ASCII string lit start at cp[0..n)? */
static int at_ascii(const uint32_t *cp, size_t n, const char *lit) {
  size_t l = strlen(lit);
  if (l > n) return 0;
  for (size_t k = 0; k < l; k++)
    if (cp[k] != (uint32_t)(unsigned char)lit[k]) return 0;
  return 1;
}

static int at_special(const uint32_t *cp, size_t n) {
  return at_ascii(cp, n, "<|startoftext|>") || at_ascii(cp, n, "<|endoftext|>");
}

/* The class a character has in CLIP's pattern: 'L' continues [\p{L}]+, 'N'
 * is one [\p{N}], 'O' continues [^\s\p{L}\p{N}]+, 0 is taken by none
 * (skipped). The slow tokenizer's classes are the IGNORECASE pattern's
 * (U+0345 is in none), the fast one's the plain ones. */
static int char_class(uint32_t c, int fast) {
  int f = ct_clip_flags(c);
  if (fast) return f & CT_CLIP_PL ? 'L' : f & CT_CLIP_PN ? 'N' : f & CT_CLIP_WHITE ? 0 : 'O';
  return f & CT_CLIP_LETTER ? 'L' : f & CT_CLIP_NUMBER ? 'N' : f & CT_CLIP_OTHER ? 'O' : 0;
}

/* Normalized text through CLIP's pattern
 * <|startoftext|>|<|endoftext|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
 * (findall), each match through BPE. Slow: the specials are alternatives of
 * the pattern (tried where a match starts) and IGNORECASE makes 'ſ a
 * contraction. Fast: the specials were split out before the pattern, so a
 * run also ends where one starts. */
static void clip_split(const ct_bpe *b, const uint32_t *cp, size_t n, int fast, emitter *e) {
  static const char *const contr[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
  char *u = malloc(4 * n + 1);
  if (!u) { /* out of memory: the text becomes unknown */
    push(e, b->unk);
    return;
  }
  for (size_t i = 0; i < n;) {
    if (at_special(cp + i, n - i)) {
      int start = cp[i + 2] == 's';
      push(e, start ? b->bos : b->eos);
      i += start ? 15 : 13;
      continue;
    }
    size_t j = i;
    for (size_t k = 0; k < sizeof contr / sizeof *contr && j == i; k++)
      if (at_ascii(cp + i, n - i, contr[k])) j = i + strlen(contr[k]);
    if (!fast && j == i && cp[i] == '\'' && i + 1 < n && cp[i + 1] == 0x17F)
      j = i + 2; /* IGNORECASE: 's also matches 'ſ (long s folds to s) */
    int cls = char_class(cp[i], fast);
    if (j == i && !cls) { /* whitespace, or (slow) U+0345 */
      i++;
      continue;
    }
    if (j == i) {
      j = i + 1;
      while (cls != 'N' && j < n && char_class(cp[j], fast) == cls &&
             !(fast && at_special(cp + j, n - j)))
        j++;
    }
    size_t m = 0;
    for (size_t k = i; k < j; k++) m += put_utf8(u + m, cp[k]);
    bpe_piece(b, u, m, e);
    i = j;
  }
  free(u);
}

/* CLIPTokenizer: the raw text is split on its added tokens first (exact,
 * case-sensitive), then each piece gets BasicTokenizer's clean-up
 * (clip_norm.c) and the pattern. */
static void exact_tokens(const ct_bpe *b, const char *text, emitter *e) {
  for (const char *p = text;;) {
    const char *s1 = strstr(p, "<|startoftext|>"), *s2 = strstr(p, "<|endoftext|>");
    const char *q = s1 && (!s2 || s1 < s2) ? s1 : s2;
    size_t n;
    uint32_t *cp = ct_clip_basic(p, q ? (size_t)(q - p) : strlen(p), &n);
    if (cp)
      clip_split(b, cp, n, 0, e);
    else
      push(e, b->unk);
    free(cp);
    if (!q) break;
    push(e, q == s1 ? b->bos : b->eos);
    p = q + (q == s1 ? 15 : 13);
  }
}

/* CLIPTokenizerFast (tokenizers, as transformers converts CLIPTokenizer):
 * the normalizer over the whole text, the added tokens (normalized: true)
 * split out of the result, then Split(CLIP's pattern, removed, inverted),
 * ByteLevel (whose GPT-2 split changes none of those pieces), BPE. */
static void fast_tokens(const ct_bpe *b, const char *text, emitter *e) {
  size_t n;
  uint32_t *cp = ct_clip_fast_norm(text, strlen(text), &n);
  if (cp)
    clip_split(b, cp, n, 1, e);
  else
    push(e, b->unk);
  free(cp);
}

static int is_letter(unsigned char c) {
  return isalpha(c) || c >= 0x80;
}

int ct_bpe_tokens(const ct_bpe *b, const char *text, int32_t *ids, int cap) {
  emitter e = {ids, cap, 0};
  if (b->rules == CT_BPE_CLIP) {
    exact_tokens(b, text, &e);
    return e.n;
  }
  if (b->rules == CT_BPE_CLIP_FAST) {
    fast_tokens(b, text, &e);
    return e.n;
  }
  /* normalise: whitespace runs -> one space, strip, ASCII lowercase */
  size_t n = strlen(text);
  char *t = malloc(n + 1);
  if (!t) return 0;
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)text[i];
    if (isspace(c)) {
      if (m && t[m - 1] != ' ') t[m++] = ' ';
    } else {
      t[m++] = (char)tolower(c);
    }
  }
  while (m && t[m - 1] == ' ') m--;
  t[m] = 0;
  static const char *const contr[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
  for (size_t i = 0; i < m;) {
    unsigned char c = (unsigned char)t[i];
    if (c == ' ') {
      i++;
      continue;
    }
    size_t j = i;
    if (c == '<' && !strncmp(t + i, "<|startoftext|>", 15)) {
      push(&e, b->bos);
      i += 15;
      continue;
    }
    if (c == '<' && !strncmp(t + i, "<|endoftext|>", 13)) {
      push(&e, b->eos);
      i += 13;
      continue;
    }
    int matched = 0;
    for (size_t k = 0; c == '\'' && k < sizeof contr / sizeof *contr && !matched; k++) {
      size_t l = strlen(contr[k]);
      if (!strncmp(t + i, contr[k], l)) j = i + l, matched = 1;
    }
    if (!matched) {
      if (is_letter(c)) {
        while (j < m && is_letter((unsigned char)t[j])) j++;
      } else if (isdigit(c)) {
        j = i + 1;
      } else {
        /* special tokens are split out wherever they are (as Hugging Face's added tokens) */
        while (j < m && t[j] != ' ' && !is_letter((unsigned char)t[j]) &&
               !isdigit((unsigned char)t[j]) &&
               !(j > i && t[j] == '<' &&
                 (!strncmp(t + j, "<|startoftext|>", 15) || !strncmp(t + j, "<|endoftext|>", 13))))
          j++;
      }
    }
    bpe_piece(b, t + i, j - i, &e);
    i = j;
  }
  free(t);
  return e.n;
}

int ct_bpe_encode(const ct_bpe *b, const char *text, int T, int32_t *ids) {
  CT_ASSERT(T >= 2);
  int n = ct_bpe_tokens(b, text, ids + 1, T - 2);
  if (n > T - 2) n = T - 2;
  ids[0] = b->bos;
  ids[n + 1] = b->eos;
  for (int i = n + 2; i < T; i++) ids[i] = b->pad; /* CLIP's pad token: <|endoftext|> */
  return n + 2;
}

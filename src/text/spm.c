/* The SentencePiece Unigram tokenizer of T5 as transformers' T5TokenizerFast
 * (the tokenizers library) runs it; loading is in spm_load.c.
 *
 * text -> split out the added (special) tokens: <pad>, </s>, <unk>,
 *         <extra_id_N>, matched longest first in the raw text
 *      -> each other segment: the normalizer steps in order —
 *         Precompiled: the model's charsmap (a darts-clone double-array trie
 *         from byte strings to replacement strings) applied per grapheme
 *         cluster as tokenizers does (a cluster under 6 bytes is replaced by
 *         the value of the shortest key that prefixes it; otherwise each code
 *         point by its own entry); Strip (Unicode White_Space); Replace (a
 *         literal or a run " {n,}")
 *      -> pre-tokenizer steps: WhitespaceSplit; Metaspace (spaces become
 *         U+2581, U+2581 prepended, split before each U+2581)
 *      -> each word: Viterbi over the pieces (best sum of log-probabilities;
 *         a code point no piece starts with costs min score - 10 as <unk>;
 *         consecutive <unk> fused into one)
 * Approximation (docs/text_encoder.md): grapheme clusters are found with a
 * short list of extending code points (combining marks, variation selectors,
 * ZWJ sequences, emoji modifiers, kana voicing marks, Hangul jamo, regional
 * indicator pairs), not the full Unicode segmentation tables.
 * Not here: BPE (bpe.c), byte fallback (T5 has none; refused when loading).
 */
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "spm_int.h"

/* ---- growable buffers ---- */
typedef struct buf {
  char *p;
  size_t n, cap;
} buf;

static int buf_put(buf *b, const void *s, size_t n) {
  if (n > ((size_t)1 << 40) - b->n) return -1;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p, b->cap = cap;
  }
  if (n) memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
  return 0;
}

typedef struct ibuf {
  int32_t *p;
  size_t n, cap;
} ibuf;

static int ibuf_put(ibuf *b, int32_t v) {
  if (b->n == b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 64;
    int32_t *p = realloc(b->p, cap * sizeof *p);
    if (!p) return -1;
    b->p = p, b->cap = cap;
  }
  b->p[b->n++] = v;
  return 0;
}

/* ---- UTF-8 ---- */
static size_t u8len(unsigned char c) {
  return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

static uint32_t u8dec(const char *s, size_t *len) {
  const unsigned char *u = (const unsigned char *)s;
  size_t n = u8len(u[0]);
  uint32_t c = n == 1 ? u[0] : n == 2 ? u[0] & 0x1Fu : n == 3 ? u[0] & 0x0Fu : u[0] & 0x07u;
  for (size_t i = 1; i < n; i++) c = (c << 6) | (u[i] & 0x3Fu);
  *len = n;
  return c;
}

/* Unicode White_Space (Rust's char::is_whitespace). */
static int is_ws(uint32_t c) {
  return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

/* Code points that extend the grapheme cluster before them (approximation of
 * UAX #29's Extend, SpacingMark and ZWJ). */
static int is_extend(uint32_t c) {
  return (c >= 0x300 && c <= 0x36F) || (c >= 0x483 && c <= 0x489) || (c >= 0x591 && c <= 0x5BD) ||
         (c >= 0x610 && c <= 0x61A) || (c >= 0x64B && c <= 0x65F) || (c >= 0x900 && c <= 0x903) ||
         (c >= 0x93A && c <= 0x94F) || (c >= 0x1AB0 && c <= 0x1AFF) ||
         (c >= 0x1DC0 && c <= 0x1DFF) || c == 0x200C || c == 0x200D ||
         (c >= 0x20D0 && c <= 0x20FF) || (c >= 0x3099 && c <= 0x309A) ||
         (c >= 0xFE00 && c <= 0xFE0F) || (c >= 0xFE20 && c <= 0xFE2F) ||
         (c >= 0x1F3FB && c <= 0x1F3FF) || (c >= 0xE0020 && c <= 0xE007F) ||
         (c >= 0xE0100 && c <= 0xE01EF);
}

static int is_pictographic(uint32_t c) {
  return (c >= 0x2600 && c <= 0x27BF) || (c >= 0x1F000 && c <= 0x1FAFF);
}

/* End (byte offset) of the grapheme cluster starting at i. */
static size_t grapheme_end(const char *s, size_t n, size_t i) {
  size_t l;
  uint32_t prev = u8dec(s + i, &l);
  size_t j = i + l;
  int ri = prev >= 0x1F1E6 && prev <= 0x1F1FF;
  if (prev == '\r' && j < n && s[j] == '\n') return j + 1;
  while (j < n) {
    uint32_t c = u8dec(s + j, &l);
    int join = is_extend(c) || (prev == 0x200D && is_pictographic(c)) ||
               (ri == 1 && c >= 0x1F1E6 && c <= 0x1F1FF) ||
               (prev >= 0x1100 && prev <= 0x115F && c >= 0x1160 && c <= 0x11FF) ||
               (prev >= 0x1160 && prev <= 0x11A7 && c >= 0x11A8 && c <= 0x11FF);
    if (!join) break;
    if (ri == 1) ri = 2;
    prev = c;
    j += l;
  }
  return j;
}

/* ---- precompiled charsmap ---- */

/* darts-clone: the value of the shortest key that prefixes p[0..n), as an
 * offset into the strings, or -1. Every index is checked against the array. */
static long trie_first_prefix(const ct_spm *s, const unsigned char *p, size_t n) {
  const uint32_t *u = s->trie;
  size_t pos = 0;
  if (!s->ntrie) return -1;
  uint32_t unit = u[0];
  pos ^= (size_t)((unit >> 10) << ((unit & (1u << 9)) >> 6));
  for (size_t i = 0; i < n; i++) {
    pos ^= p[i];
    if (pos >= s->ntrie) return -1;
    unit = u[pos];
    if ((unit & ((1u << 31) | 0xFFu)) != p[i]) return -1;
    pos ^= (size_t)((unit >> 10) << ((unit & (1u << 9)) >> 6));
    if ((unit >> 8) & 1u) {
      if (pos >= s->ntrie) return -1;
      return (long)(u[pos] & 0x7FFFFFFFu);
    }
  }
  return -1;
}

/* The replacement of p[0..n) (shortest prefix key), or NULL. */
static const char *transform(const ct_spm *s, const char *p, size_t n, size_t *len) {
  long off = trie_first_prefix(s, (const unsigned char *)p, n);
  if (off < 0 || (size_t)off >= s->nnormalized) return NULL;
  const char *r = s->normalized + off;
  const char *e = memchr(r, 0, s->nnormalized - (size_t)off);
  *len = e ? (size_t)(e - r) : s->nnormalized - (size_t)off;
  return r;
}

static int precompiled(const ct_spm *s, const char *in, size_t n, buf *out) {
  size_t i = 0, len;
  while (i < n) {
    size_t g = grapheme_end(in, n, i);
    const char *r;
    if (g - i < 6 && (r = transform(s, in + i, g - i, &len))) {
      if (buf_put(out, r, len)) return -1;
      i = g;
      continue;
    }
    while (i < g) {
      size_t l = u8len((unsigned char)in[i]);
      r = transform(s, in + i, l, &len);
      if (r ? buf_put(out, r, len) : buf_put(out, in + i, l)) return -1;
      i += l;
    }
  }
  return 0;
}

/* ---- normalizer steps ---- */

static int strip(const char *in, size_t n, int left, int right, buf *out) {
  size_t a = 0, b = n, l;
  while (left && a < b && is_ws(u8dec(in + a, &l))) a += l;
  while (right && b > a) {
    size_t k = b - 1;
    while (k > a && ((unsigned char)in[k] & 0xC0) == 0x80) k--;
    if (!is_ws(u8dec(in + k, &l))) break;
    b = k;
  }
  return buf_put(out, in + a, b - a);
}

static int replace(const spm_norm *st, const char *in, size_t n, buf *out) {
  size_t pl = strlen(st->pat), cl = strlen(st->content), i = 0;
  if (!pl) return buf_put(out, in, n);
  while (i < n) {
    size_t run = 0;
    while (i + (run + 1) * pl <= n && !memcmp(in + i + run * pl, st->pat, pl)) {
      run++;
      if (!st->min_run) break;
    }
    if (run && run >= (size_t)(st->min_run ? st->min_run : 1)) {
      if (buf_put(out, st->content, cl)) return -1;
      i += run * pl;
    } else {
      if (buf_put(out, in + i, 1)) return -1;
      i++;
    }
  }
  return 0;
}

static int normalize(const ct_spm *s, const char *in, size_t n, buf *a, buf *b) {
  a->n = 0;
  if (buf_put(a, in, n)) return -1;
  for (int k = 0; k < s->nnorm; k++) {
    const spm_norm *st = &s->norm[k];
    b->n = 0;
    if (buf_put(b, "", 0)) return -1;
    int rc = st->kind == SPM_NORM_PRECOMPILED ? precompiled(s, a->p, a->n, b)
             : st->kind == SPM_NORM_STRIP     ? strip(a->p, a->n, st->left, st->right, b)
                                              : replace(st, a->p, a->n, b);
    if (rc) return -1;
    buf t = *a;
    *a = *b, *b = t;
  }
  return 0;
}

/* ---- pieces ---- */

static uint64_t fnv(const char *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
  return h;
}

static int lookup(const ct_spm *s, const char *p, size_t n) {
  size_t m = s->nslot - 1, h = (size_t)fnv(p, n) & m;
  for (;;) {
    int id = s->slot[h];
    if (id < 0) return -1;
    if (strlen(s->piece[id]) == n && !memcmp(s->piece[id], p, n)) return id;
    h = (h + 1) & m;
  }
}

int ct_spm_piece_id(const ct_spm *s, const char *piece) {
  for (int i = 0; i < s->nadded; i++)
    if (!strcmp(s->added[i], piece)) return s->added_id[i];
  return lookup(s, piece, strlen(piece));
}

const char *ct_spm_piece(const ct_spm *s, int id) {
  if (id < 0 || id >= s->vocab) return NULL;
  for (int i = 0; i < s->nadded; i++)
    if (s->added_id[i] == id) return s->added[i];
  return id < s->npieces ? s->piece[id] : NULL;
}

ct_status spm_finish(ct_spm *s, const char *path, ct_err *err) {
  float mn = 0.0f;
  s->nslot = 16;
  while (s->nslot < 2 * (size_t)s->npieces) s->nslot *= 2;
  s->slot = malloc(s->nslot * sizeof *s->slot);
  if (!s->slot) return ct_errf(err, CT_ERR_NOMEM, "out of memory (%s)", path);
  memset(s->slot, 0xFF, s->nslot * sizeof *s->slot);
  s->max_piece = 1;
  for (int i = 0; i < s->npieces; i++) {
    size_t n = strlen(s->piece[i]);
    if (!n) return ct_errf(err, CT_ERR_FORMAT, "%s: piece %d is empty", path, i);
    if (lookup(s, s->piece[i], n) >= 0)
      return ct_errf(err, CT_ERR_FORMAT, "%s: piece %d ('%s') appears twice", path, i, s->piece[i]);
    size_t h = (size_t)fnv(s->piece[i], n) & (s->nslot - 1);
    while (s->slot[h] >= 0) h = (h + 1) & (s->nslot - 1);
    s->slot[h] = i;
    if ((int)n > s->max_piece) s->max_piece = (int)n;
    if (i == 0 || s->score[i] < mn) mn = s->score[i];
  }
  s->unk_score = mn - 10.0f;
  s->vocab = s->npieces;
  for (int i = 0; i < s->nadded; i++)
    if (s->added_id[i] + 1 > s->vocab) s->vocab = s->added_id[i] + 1;
  if (s->unk < 0 || s->unk >= s->npieces || s->eos < 0 || s->eos >= s->vocab || s->pad < 0 ||
      s->pad >= s->vocab)
    return ct_errf(err, CT_ERR_FORMAT,
                   "%s: unk id %d, eos id %d, pad id %d must be pieces (the model has %d)", path,
                   s->unk, s->eos, s->pad, s->npieces);
  return CT_OK;
}

ct_status spm_set_charsmap(ct_spm *s, const uint8_t *blob, size_t n, const char *path,
                           ct_err *err) {
  if (!n) return CT_OK;
  if (n < 4) return ct_errf(err, CT_ERR_FORMAT, "%s: precompiled charsmap of %zu bytes", path, n);
  uint32_t tsize = (uint32_t)blob[0] | (uint32_t)blob[1] << 8 | (uint32_t)blob[2] << 16 |
                   (uint32_t)blob[3] << 24;
  if (tsize % 4 || tsize > n - 4 || tsize == 0)
    return ct_errf(err, CT_ERR_FORMAT,
                   "%s: precompiled charsmap: trie of %u bytes does not fit its %zu bytes", path,
                   tsize, n);
  s->ntrie = tsize / 4;
  s->nnormalized = n - 4 - tsize;
  s->trie = malloc(tsize);
  s->normalized = malloc(s->nnormalized + 1);
  if (!s->trie || !s->normalized) return ct_errf(err, CT_ERR_NOMEM, "out of memory (%s)", path);
  for (size_t i = 0; i < s->ntrie; i++) {
    const uint8_t *q = blob + 4 + 4 * i;
    s->trie[i] = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
  }
  memcpy(s->normalized, blob + 4 + tsize, s->nnormalized);
  s->normalized[s->nnormalized] = 0;
  return CT_OK;
}

/* ---- Viterbi ---- */

typedef struct node {
  int id, from; /* piece and start of the best path's last piece; from < 0: unreached */
  double score;
} node;

static int viterbi(const ct_spm *s, const char *w, size_t n, node *best, ibuf *out) {
  for (size_t i = 0; i <= n; i++) best[i].from = -1, best[i].id = -1, best[i].score = 0.0;
  best[0].from = 0;
  for (size_t i = 0; i < n; i = i + u8len((unsigned char)w[i])) {
    if (best[i].from < 0 && i) continue;
    size_t cl = u8len((unsigned char)w[i]);
    int single = 0;
    for (size_t j = i + cl; j - i <= (size_t)s->max_piece;) {
      int id = lookup(s, w + i, j - i);
      if (id >= 0) {
        double c = best[i].score + s->score[id];
        if (best[j].from < 0 || c > best[j].score) best[j] = (node){id, (int)i, c};
        if (j - i == cl) single = 1;
      }
      if (j >= n) break;
      j += u8len((unsigned char)w[j]);
    }
    if (!single) {
      double c = best[i].score + s->unk_score;
      if (best[i + cl].from < 0 || c > best[i + cl].score) best[i + cl] = (node){s->unk, (int)i, c};
    }
  }
  /* backtrack into the tail of out, then reverse; fuse runs of <unk> */
  size_t start = out->n;
  for (size_t j = n; j > 0; j = (size_t)best[j].from) {
    int id = best[j].id;
    if (id == s->unk && out->n > start && out->p[out->n - 1] == s->unk) continue;
    if (ibuf_put(out, id)) return -1;
  }
  for (size_t a = start, b = out->n; a + 1 < b; a++, b--) {
    int32_t t = out->p[a];
    out->p[a] = out->p[b - 1];
    out->p[b - 1] = t;
  }
  return 0;
}

/* ---- pre-tokenizer and segments ---- */

typedef struct words {
  size_t *off, *len; /* into a buffer */
  size_t n, cap;
} words;

static int words_put(words *w, size_t off, size_t len) {
  if (!len) return 0; /* tokenizers drops empty splits */
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 16;
    size_t *o = realloc(w->off, cap * sizeof *o);
    if (!o) return -1;
    w->off = o;
    size_t *l = realloc(w->len, cap * sizeof *l);
    if (!l) return -1;
    w->len = l, w->cap = cap;
  }
  w->off[w->n] = off, w->len[w->n] = len, w->n++;
  return 0;
}

/* Applies one pre-tokenizer step to the words of src (text in a), writing the
 * new words and their text into dst / b. first: the segment starts the text. */
static int pre_step(const spm_pre *p, const buf *a, const words *src, buf *b, words *dst,
                    int first) {
  size_t rl = strlen(p->repl), l;
  for (size_t k = 0; k < src->n; k++) {
    const char *w = a->p + src->off[k];
    size_t n = src->len[k];
    if (p->kind == SPM_PRE_WHITESPACE_SPLIT) {
      size_t i = 0;
      while (i < n) {
        while (i < n && is_ws(u8dec(w + i, &l))) i += l;
        size_t s0 = i;
        while (i < n && !is_ws(u8dec(w + i, &l))) i += l;
        size_t o = b->n;
        if (buf_put(b, w + s0, i - s0) || words_put(dst, o, i - s0)) return -1;
      }
      continue;
    }
    size_t o = b->n;
    int pre = p->prepend == SPM_PREPEND_ALWAYS || (p->prepend == SPM_PREPEND_FIRST && first && !k);
    /* spaces become the replacement first, so a leading space is the prefix */
    if (pre && n && w[0] != ' ' && !(n >= rl && !memcmp(w, p->repl, rl)) && buf_put(b, p->repl, rl))
      return -1;
    for (size_t i = 0; i < n; i++)
      if (w[i] == ' ' ? buf_put(b, p->repl, rl) : buf_put(b, w + i, 1)) return -1;
    size_t e = b->n, s0 = o;
    if (!p->split) {
      if (words_put(dst, o, e - o)) return -1;
      continue;
    }
    for (size_t i = o + 1; i <= e; i++)
      if (i == e || (e - i >= rl && !memcmp(b->p + i, p->repl, rl))) {
        if (words_put(dst, s0, i - s0)) return -1;
        s0 = i;
      }
  }
  return 0;
}

typedef struct work {
  buf a, b, c;
  words w1, w2;
  node *best;
  size_t nbest;
} work;

static int segment(const ct_spm *s, const char *in, size_t n, int first, work *k, ibuf *out) {
  if (normalize(s, in, n, &k->a, &k->b)) return -1;
  k->w1.n = 0;
  if (words_put(&k->w1, 0, k->a.n)) return -1;
  buf *text = &k->a, *spare = &k->c;
  for (int i = 0; i < s->npre; i++) {
    spare->n = 0;
    k->w2.n = 0;
    if (buf_put(spare, "", 0) || pre_step(&s->pre[i], text, &k->w1, spare, &k->w2, first))
      return -1;
    words t = k->w1;
    k->w1 = k->w2, k->w2 = t;
    buf *tb = text;
    text = spare, spare = tb;
  }
  for (size_t i = 0; i < k->w1.n; i++) {
    size_t wl = k->w1.len[i];
    if (wl + 1 > k->nbest) {
      node *nb = realloc(k->best, (wl + 1) * sizeof *nb);
      if (!nb) return -1;
      k->best = nb, k->nbest = wl + 1;
    }
    if (viterbi(s, text->p + k->w1.off[i], wl, k->best, out)) return -1;
  }
  return 0;
}

static int tokenize(const ct_spm *s, const char *text, ibuf *out) {
  work k = {0};
  int rc = 0;
  size_t n = strlen(text), seg = 0, i = 0;
  while (i < n && !rc) {
    int best = -1;
    size_t bl = 0;
    for (int a = 0; a < s->nadded; a++) {
      size_t l = strlen(s->added[a]);
      if (l > bl && l <= n - i && !memcmp(text + i, s->added[a], l)) best = a, bl = l;
    }
    if (best < 0) {
      i += u8len((unsigned char)text[i]);
      continue;
    }
    if (i > seg) rc = segment(s, text + seg, i - seg, seg == 0, &k, out);
    if (!rc) rc = ibuf_put(out, s->added_id[best]);
    i += bl;
    seg = i;
  }
  if (!rc && n > seg) rc = segment(s, text + seg, n - seg, seg == 0, &k, out);
  free(k.a.p), free(k.b.p), free(k.c.p);
  free(k.w1.off), free(k.w1.len), free(k.w2.off), free(k.w2.len);
  free(k.best);
  return rc;
}

ct_status ct_spm_tokens(const ct_spm *s, const char *text, int32_t *ids, int cap, int *n,
                        ct_err *err) {
  ibuf out = {0};
  ct_status st = CT_OK;
  *n = 0;
  if (!ct_utf8_valid(text, strlen(text))) {
    st = ct_errf(err, CT_ERR_INVALID, "T5 tokenizer: the text is not valid UTF-8");
    goto out;
  }
  if (tokenize(s, text, &out)) {
    st =
        ct_errf(err, CT_ERR_NOMEM, "out of memory (T5 tokenizer, text of %zu bytes)", strlen(text));
    goto out;
  }
  if (out.n > (size_t)1 << 30) {
    st = ct_errf(err, CT_ERR_RANGE, "T5 tokenizer: %zu tokens", out.n);
    goto out;
  }
  for (size_t i = 0; i < out.n && (int)i < cap; i++) ids[i] = out.p[i];
  *n = (int)out.n;
out:
  free(out.p);
  return st;
}

ct_status ct_spm_encode(const ct_spm *s, const char *text, int T, int32_t *ids, int *n,
                        ct_err *err) {
  int total = 0;
  if (T < 1) return ct_errf(err, CT_ERR_RANGE, "T5 tokenizer: max_length %d; need >= 1", T);
  ct_status st = ct_spm_tokens(s, text, ids, T - 1, &total, err);
  if (st) return st;
  int k = total < T - 1 ? total : T - 1;
  ids[k++] = s->eos;
  if (n) *n = k;
  for (; k < T; k++) ids[k] = s->pad;
  return CT_OK;
}

int ct_spm_vocab_size(const ct_spm *s) {
  return s->vocab;
}
int ct_spm_eos(const ct_spm *s) {
  return s->eos;
}
int ct_spm_pad(const ct_spm *s) {
  return s->pad;
}
int ct_spm_unk(const ct_spm *s) {
  return s->unk;
}

void ct_spm_free(ct_spm *s) {
  if (!s) return;
  for (int i = 0; i < s->npieces; i++) free(s->piece[i]);
  for (int i = 0; i < s->nadded; i++) free(s->added[i]);
  for (int i = 0; i < s->nnorm; i++) free(s->norm[i].pat), free(s->norm[i].content);
  free(s->piece), free(s->score), free(s->slot), free(s->added), free(s->added_id);
  free(s->trie), free(s->normalized);
  free(s);
}

/* The text clean-up transformers' CLIPTokenizer does when ftfy is not
 * installed (the path FluxPipeline takes): BasicTokenizer(do_lower_case=True,
 * tokenize_chinese_chars=True, strip_accents=False, do_split_on_punc=False)
 * .tokenize(text), joined by single spaces. That is, in order:
 *
 *   _clean_text:   drop U+0000, U+FFFD and category C* except \t \n \r;
 *                  \t \n \r and Zs become a space
 *   CJK:           a space before and after every CJK ideograph (the
 *                  _is_chinese_char blocks)
 *   NFC            (unicodedata.normalize)
 *   split on str.isspace, then str.lower per word (full mappings, and the
 *                  final sigma of its context inside the word)
 *
 * The Unicode data (clip_unicode_tab.h) is generated from the Python and
 * `regex` module transformers runs on (scripts/clip_unicode.py). Invalid
 * UTF-8 decodes to U+FFFD, which the clean-up drops (Python never sees it).
 * ct_clip_fast_norm is CLIPTokenizerFast's normalizer instead.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/bpe_int.h"
#include "text/clip_unicode_tab.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Index of the last start <= cp in a sorted array of range starts. */
static size_t range_at(const uint32_t *start, size_t n, uint32_t cp) {
  size_t lo = 0, hi = n; /* start[lo] <= cp < start[hi] */
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (start[mid] <= cp)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

int ct_clip_flags(uint32_t cp) {
  if (cp >= 0x110000) return CU_CTRL;
  return cu_flag_val[range_at(cu_flag_start, N_OF(cu_flag_start), cp)];
}

static int ccc(uint32_t cp) {
  if (cp < cu_ccc_start[0] || cp >= 0x110000) return 0;
  return cu_ccc_val[range_at(cu_ccc_start, N_OF(cu_ccc_start), cp)];
}

/* Row of a sorted [n][k] table whose first column is cp, or NULL. */
static const uint32_t *row_of(const uint32_t *tab, size_t n, size_t k, uint32_t cp) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    uint32_t v = tab[mid * k];
    if (v == cp) return tab + mid * k;
    if (v < cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

/* Hangul syllables (Unicode ch. 3.12) */
enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7 };
enum { LCOUNT = 19, VCOUNT = 21, TCOUNT = 28, NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT };

/* A growable code point buffer. */
typedef struct cpbuf {
  uint32_t *v;
  size_t n, cap;
  int oom;
} cpbuf;

static void put(cpbuf *b, uint32_t cp) {
  if (b->n == b->cap) {
    size_t nc = b->cap ? 2 * b->cap : 64;
    uint32_t *nv = realloc(b->v, nc * sizeof *nv);
    if (!nv) {
      b->oom = 1;
      return;
    }
    b->v = nv;
    b->cap = nc;
  }
  b->v[b->n++] = cp;
}

static uint32_t utf8_next(const unsigned char *s, size_t len, size_t *i) {
  unsigned c = s[*i];
  int need = c < 0x80             ? 0
             : (c & 0xE0) == 0xC0 ? 1
             : (c & 0xF0) == 0xE0 ? 2
             : (c & 0xF8) == 0xF0 ? 3
                                  : -1;
  uint32_t cp = need == 0 ? c : need == 1 ? c & 0x1F : need == 2 ? c & 0x0F : c & 0x07;
  static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
  if (need < 0 || *i + (size_t)need >= len + (need ? 0 : 1)) {
    (*i)++;
    return 0xFFFD;
  }
  for (int k = 1; k <= need; k++) {
    if ((s[*i + k] & 0xC0) != 0x80) {
      *i += (size_t)k;
      return 0xFFFD;
    }
    cp = (cp << 6) | (s[*i + k] & 0x3F);
  }
  *i += (size_t)need + 1;
  if (cp < min[need] || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return 0xFFFD;
  return cp;
}

static int is_cjk(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/* With basic: _clean_text and _tokenize_chinese_chars; then NFD (canonical
 * decomposition and ordering), the first half of NFC. */
static void clean_decompose(const char *text, size_t len, int basic, cpbuf *out) {
  const unsigned char *s = (const unsigned char *)text;
  for (size_t i = 0; i < len;) {
    uint32_t cp = utf8_next(s, len, &i);
    int f = ct_clip_flags(cp);
    if (basic && (f & CU_CTRL)) continue;
    if (basic && (f & CU_SPACE_CLEAN)) {
      put(out, ' ');
      continue;
    }
    int cjk = basic && is_cjk(cp);
    if (cjk) put(out, ' ');
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
      uint32_t si = cp - SBASE;
      put(out, LBASE + si / NCOUNT);
      put(out, VBASE + (si % NCOUNT) / TCOUNT);
      if (si % TCOUNT) put(out, TBASE + si % TCOUNT);
    } else {
      const uint32_t *d = row_of(&cu_decomp[0][0], N_OF(cu_decomp), 5, cp);
      if (!d) {
        put(out, cp);
      } else {
        for (int k = 1; k < 5 && d[k]; k++) put(out, d[k]);
      }
    }
    if (cjk) put(out, ' ');
  }
  /* canonical ordering: a stable sort of each run of non-starters by class */
  for (size_t i = 1; i < out->n; i++) {
    uint32_t c = out->v[i];
    int cc = ccc(c);
    if (!cc) continue;
    size_t j = i;
    while (j > 0 && ccc(out->v[j - 1]) > cc) {
      out->v[j] = out->v[j - 1];
      j--;
    }
    out->v[j] = c;
  }
}

static uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
    return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
  if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE &&
      b < TBASE + TCOUNT)
    return a + (b - TBASE);
  size_t lo = 0, hi = N_OF(cu_comp);
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    const uint32_t *r = cu_comp[mid];
    if (r[0] == a && r[1] == b) return r[2];
    if (r[0] < a || (r[0] == a && r[1] < b))
      lo = mid + 1;
    else
      hi = mid;
  }
  return 0;
}

/* Canonical composition in place (Unicode's reference algorithm). */
static void compose_all(cpbuf *b) {
  if (!b->n) return;
  size_t starter = 0, w = 1;
  int last = ccc(b->v[0]) ? 256 : 0;
  for (size_t i = 1; i < b->n; i++) {
    uint32_t c = b->v[i];
    int cc = ccc(c);
    uint32_t comp = compose(b->v[starter], c);
    if (comp && (last < cc || last == 0)) {
      b->v[starter] = comp;
      continue;
    }
    if (!cc) starter = w;
    last = cc;
    b->v[w++] = c;
  }
  b->n = w;
}

/* str.lower of a word (final_sigma: Python's context rule for Σ), or Rust's
 * char::to_lowercase per character (not final_sigma: Σ -> σ always). */
static void lower_into(const uint32_t *word, size_t n, int final_sigma, cpbuf *out) {
  for (size_t i = 0; i < n; i++) {
    uint32_t c = word[i];
    if (c == 0x3A3 && final_sigma) { /* Σ: ς at the end of a cased word (Python's Final_Sigma) */
      size_t j = i;
      while (j > 0 && (ct_clip_flags(word[j - 1]) & CU_IGNORABLE)) j--;
      int fin = j > 0 && (ct_clip_flags(word[j - 1]) & CU_CASED);
      if (fin) {
        j = i + 1;
        while (j < n && (ct_clip_flags(word[j]) & CU_IGNORABLE)) j++;
        fin = j == n || !(ct_clip_flags(word[j]) & CU_CASED);
      }
      put(out, fin ? 0x3C2 : 0x3C3);
      continue;
    }
    const uint32_t *r = row_of(&cu_lower[0][0], N_OF(cu_lower), 3, c);
    put(out, r ? r[1] : c);
    if (r && r[2]) put(out, r[2]);
  }
}

uint32_t *ct_clip_basic(const char *text, size_t len, size_t *n) {
  cpbuf a = {0}, out = {0};
  clean_decompose(text, len, 1, &a);
  compose_all(&a);
  for (size_t i = 0; i < a.n;) {
    if (ct_clip_flags(a.v[i]) & CU_ISSPACE) {
      i++;
      continue;
    }
    size_t j = i;
    while (j < a.n && !(ct_clip_flags(a.v[j]) & CU_ISSPACE)) j++;
    if (out.n) put(&out, ' ');
    lower_into(a.v + i, j - i, 1, &out);
    i = j;
  }
  free(a.v);
  if (a.oom || out.oom) {
    free(out.v);
    *n = 0;
    return NULL;
  }
  *n = out.n;
  if (!out.v) out.v = malloc(sizeof *out.v); /* empty text: a valid, empty buffer */
  return out.v;
}

/* CLIPTokenizerFast's normalizer (tokenizers): NFC, Replace(\s+ -> " "),
 * Lowercase (per character). */
uint32_t *ct_clip_fast_norm(const char *text, size_t len, size_t *n) {
  cpbuf a = {0}, out = {0};
  clean_decompose(text, len, 0, &a);
  compose_all(&a);
  for (size_t i = 0; i < a.n;) {
    if (ct_clip_flags(a.v[i]) & CU_WHITE) {
      put(&out, ' ');
      while (i < a.n && (ct_clip_flags(a.v[i]) & CU_WHITE)) i++;
      continue;
    }
    lower_into(a.v + i, 1, 0, &out);
    i++;
  }
  free(a.v);
  if (a.oom || out.oom) {
    free(out.v);
    *n = 0;
    return NULL;
  }
  *n = out.n;
  if (!out.v) out.v = malloc(sizeof *out.v);
  return out.v;
}

/* bpe_int.h: the BPE tokenizer's merges parser on its own, for bpe.c and the
 * fuzz target (fuzz/fuzz_bpe.c), which loads the vocabulary once and feeds
 * each input's merges here instead of reloading vocab.json per input. */
#ifndef CT_TEXT_BPE_INT_H
#define CT_TEXT_BPE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/textenc.h"

/* Replace b's merge table with the merges.txt text (len bytes; it ends at the
 * first NUL if any). name is for messages ("merges.txt:3: ..."). On failure
 * b keeps its previous table. */
ct_status ct_bpe_set_merges(ct_bpe *b, const char *text, size_t len, const char *name, ct_err *err);

/* clip_norm.c: transformers' CLIPTokenizer clean-up without ftfy
 * (BasicTokenizer: clean, CJK spacing, NFC, split, lowercase), words joined
 * by one space: malloc'd code points, *n of them; NULL when out of memory. */
uint32_t *ct_clip_basic(const char *text, size_t len, size_t *n);
/* CLIPTokenizerFast's normalizer: NFC, whitespace runs -> one space,
 * lowercase per character. */
uint32_t *ct_clip_fast_norm(const char *text, size_t len, size_t *n);
/* CU_* flags of a code point (clip_unicode_tab.h). */
int ct_clip_flags(uint32_t cp);
enum {
  CT_CLIP_LETTER = 8,
  CT_CLIP_NUMBER = 16,
  CT_CLIP_OTHER = 128,
  CT_CLIP_WHITE = 256,
  CT_CLIP_PL = 512,
  CT_CLIP_PN = 1024
}; /* = CU_* */

#endif

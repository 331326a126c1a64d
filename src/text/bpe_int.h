/* bpe_int.h: the BPE tokenizer's merges parser on its own, for bpe.c and the
 * fuzz target (fuzz/fuzz_bpe.c), which loads the vocabulary once and feeds
 * each input's merges here instead of reloading vocab.json per input. */
#ifndef CT_TEXT_BPE_INT_H
#define CT_TEXT_BPE_INT_H

#include <stddef.h>

#include "ctuner/textenc.h"

/* Replace b's merge table with the merges.txt text (len bytes; it ends at the
 * first NUL if any). name is for messages ("merges.txt:3: ..."). On failure
 * b keeps its previous table. */
ct_status ct_bpe_set_merges(ct_bpe *b, const char *text, size_t len, const char *name, ct_err *err);

#endif

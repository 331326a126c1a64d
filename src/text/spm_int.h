/* Private to src/text: the SentencePiece Unigram tokenizer's state, shared by
 * its loaders (spm_load.c: spiece.model protobuf, tokenizer.json) and its
 * encoder (spm.c: normalizer, pre-tokenizer, Viterbi). */
#ifndef CT_TEXT_SPM_INT_H
#define CT_TEXT_SPM_INT_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/t5.h"

/* Bounds on what a tokenizer file may hold (the real T5 has 32,000 pieces,
 * 100 added tokens and a 240 KB charsmap). */
#define SPM_MAX_PIECES (1 << 20)
#define SPM_MAX_PIECE_BYTES 256
#define SPM_MAX_FILE (64u << 20)
#define SPM_MAX_STEPS 8

enum { SPM_NORM_PRECOMPILED = 1, SPM_NORM_STRIP, SPM_NORM_REPLACE };
enum { SPM_PRE_METASPACE = 1, SPM_PRE_WHITESPACE_SPLIT };
enum { SPM_PREPEND_NEVER = 0, SPM_PREPEND_ALWAYS, SPM_PREPEND_FIRST };

typedef struct spm_norm {
  int kind;
  int left, right; /* STRIP */
  char *pat;       /* REPLACE: the literal, or " " repeated for a regex " {min,}" */
  int min_run;     /* REPLACE: 0 for a literal, else the regex's minimum run of pat */
  char *content;   /* REPLACE */
} spm_norm;

typedef struct spm_pre {
  int kind;
  char repl[8]; /* METASPACE replacement (U+2581) */
  int prepend;  /* SPM_PREPEND_* */
  int split;
} spm_pre;

struct ct_spm {
  int npieces; /* pieces of the Unigram model, ids [0, npieces) */
  char **piece;
  float *score;
  int unk, eos, pad;
  float unk_score; /* min score - 10, as sentencepiece and tokenizers */
  int max_piece;   /* longest piece in bytes */
  /* piece -> id (open addressing; also holds nothing else) */
  int *slot;
  size_t nslot;
  /* added (special) tokens, matched in the raw text before normalization */
  int nadded;
  char **added;
  int *added_id;
  int vocab; /* largest id + 1 */
  /* precompiled charsmap: darts-clone double array, then NUL-terminated strings */
  uint32_t *trie;
  size_t ntrie;
  char *normalized;
  size_t nnormalized;
  spm_norm norm[SPM_MAX_STEPS];
  int nnorm;
  spm_pre pre[SPM_MAX_STEPS];
  int npre;
};

/* spm.c: finish a loaded model (hash table, unk score, longest piece); checks
 * the ids. path names the file in messages. */
ct_status spm_finish(ct_spm *s, const char *path, ct_err *err);
/* spm.c: split a charsmap blob (uint32 trie size, trie, strings) into s. */
ct_status spm_set_charsmap(ct_spm *s, const uint8_t *blob, size_t n, const char *path, ct_err *err);

#endif

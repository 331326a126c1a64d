/* fuzz_bpe.c: libFuzzer target for the CLIP BPE tokenizer (merges.txt parser
 * and encoding). Input = merges.txt bytes, a NUL, then the text to tokenize.
 * The vocabulary is tests/data/bpe/vocab.json (run from the repository root,
 * as scripts/fuzz.sh does), loaded once: each input replaces only the merge
 * table (ct_bpe_set_merges, the parser ct_bpe_load uses), since re-parsing
 * the 31 KB vocabulary per input held the target to ~90 runs/s. A parse
 * failure must carry a message and leave the previous table; every id must
 * lie in the vocabulary; encode must start with BOS and end in EOS. The text
 * also goes through the transformers-exact tokenizer (tests/data/clip/tokenizer,
 * its own merges: UTF-8 decoding, clean-up, NFC, lowercasing, the pattern),
 * with CLIPTokenizer's rules and with CLIPTokenizerFast's. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/textenc.h"
#include "text/bpe_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ct_bpe *tokenizer(void) {
  static ct_bpe *b;
  if (!b) {
    ct_err err = {0};
    FILE *f = fopen("tests/data/bpe/merges.txt", "rb");
    if (!f) abort();
    fclose(f);
    if (ct_bpe_load("tests/data/bpe/vocab.json", "tests/data/bpe/merges.txt", &b, &err) != CT_OK) {
      fprintf(stderr, "fuzz_bpe: %s (run from the repository root)\n", err.msg);
      abort();
    }
  }
  return b;
}

static ct_bpe *exact_tokenizer(void) {
  static ct_bpe *b;
  ct_err err = {0};
  if (!b && ct_bpe_load_dir("tests/data/clip/tokenizer", &b, &err) != CT_OK) {
    fprintf(stderr, "fuzz_bpe: %s (run from the repository root)\n", err.msg);
    abort();
  }
  return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ct_bpe *b = tokenizer();
  const uint8_t *nul = memchr(data, 0, size);
  size_t mlen = nul ? (size_t)(nul - data) : size;
  ct_err err = {0};
  if (ct_bpe_set_merges(b, (const char *)data, mlen, "merges.txt", &err) != CT_OK) {
    if (!err.msg[0]) abort();
    return 0;
  }
  size_t tlen = nul ? size - mlen - 1 : 0;
  char *text = malloc(tlen + 1);
  if (!text) abort();
  if (tlen) memcpy(text, nul + 1, tlen);
  text[tlen] = 0;
  int32_t ids[256];
  int n = ct_bpe_tokens(b, text, ids, 256);
  if (n < 0) abort();
  for (int i = 0; i < n && i < 256; i++)
    if (ids[i] < 0 || ids[i] >= ct_bpe_vocab_size(b)) abort();
  int32_t enc[77];
  int k = ct_bpe_encode(b, text, 77, enc);
  if (k < 2 || k > 77 || enc[0] != ct_bpe_bos(b) || enc[k - 1] != ct_bpe_eos(b)) abort();
  ct_bpe *x = exact_tokenizer();
  for (int rules = CT_BPE_CLIP; rules <= CT_BPE_CLIP_FAST; rules++) {
    ct_bpe_set_rules(x, rules);
    n = ct_bpe_tokens(x, text, ids, 256);
    for (int i = 0; i < n && i < 256; i++)
      if (ids[i] < 0 || ids[i] >= ct_bpe_vocab_size(x)) abort();
    k = ct_bpe_encode(x, text, 77, enc);
    if (k < 2 || k > 77 || enc[0] != ct_bpe_bos(x) || enc[k - 1] != ct_bpe_eos(x)) abort();
  }
  free(text);
  return 0;
}

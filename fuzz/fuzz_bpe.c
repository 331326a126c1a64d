/* fuzz_bpe.c: libFuzzer target for the CLIP BPE tokenizer (merges.txt parser
 * and encoding). Input = merges.txt bytes, a NUL, then the text to tokenize.
 * The vocabulary is tests/data/bpe/vocab.json (run from the repository root,
 * as scripts/fuzz.sh does). A load failure must carry a message; every id must
 * lie in the vocabulary; encode must start with BOS and end in EOS. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctuner/textenc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static char merges[64];
  if (!merges[0]) snprintf(merges, sizeof merges, "/tmp/fuzz_bpe_%d.txt", (int)getpid());
  const uint8_t *nul = memchr(data, 0, size);
  size_t mlen = nul ? (size_t)(nul - data) : size;
  FILE *f = fopen(merges, "wb");
  if (!f) abort();
  fwrite(data, 1, mlen, f);
  fclose(f);
  ct_bpe *b = NULL;
  ct_err err = {0};
  if (ct_bpe_load("tests/data/bpe/vocab.json", merges, &b, &err) != CT_OK) {
    if (!err.msg[0] || b) abort();
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
  free(text);
  ct_bpe_free(b);
  return 0;
}

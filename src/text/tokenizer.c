/* The byte tokenizer: ids 0-255 are the UTF-8 bytes of the text, 256 BOS,
 * 257 EOS, 258 PAD (vocab 259).
 *
 * Every caption becomes BOS, its bytes, EOS, then PAD up to T. A caption that
 * does not fit keeps its first T-2 bytes, so EOS (where the pooled vector is
 * read) is always present. Truncation is per byte, not per character: the
 * model sees bytes, and a cut multi-byte character is just a shorter prefix.
 * Not here: the CLIP BPE tokenizer (vocab.json + merges.txt): bpe.c.
 */
#include <string.h>

#include "ctuner/textenc.h"

int ct_tokenize_bytes(const char *text, int T, int32_t *ids) {
  CT_ASSERT(T >= 2 && ids);
  size_t len = text ? strlen(text) : 0;
  int n = len > (size_t)(T - 2) ? T - 2 : (int)len;
  ids[0] = CT_TOK_BOS;
  for (int i = 0; i < n; i++) ids[1 + i] = (int32_t)(unsigned char)text[i];
  ids[n + 1] = CT_TOK_EOS;
  for (int i = n + 2; i < T; i++) ids[i] = CT_TOK_PAD;
  return n + 2;
}

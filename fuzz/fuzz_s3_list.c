/* fuzz_s3_list.c: libFuzzer target for the ListObjectsV2 reply parser of the
 * S3 backend (ct_s3_list_page: the XML a bucket's endpoint sends back, so
 * outside input). The first byte picks the key prefix ("", "p/", "a b/"),
 * the rest is the document (NUL-terminated copy). Checked: every listed key
 * is a valid key (relative, no empty/"."/".." segment), sizes came with it,
 * a continuation token only when the page says it is truncated, and nothing
 * leaks (ASan). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "storage/storage_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char *const prefixes[] = {"", "p/", "a b/"};
  if (size < 1) return 0;
  const char *prefix = prefixes[data[0] % 3];
  char *doc = malloc(size);
  if (!doc) return 0;
  memcpy(doc, data + 1, size - 1);
  doc[size - 1] = 0;
  ct_storage_list l = {0};
  size_t cap = 0;
  int more = -1;
  char *token = NULL;
  ct_err err = {0};
  ct_status st = ct_s3_list_page(doc, size - 1, prefix, &l, &cap, &more, &token, &err);
  if (st != CT_OK && st != CT_ERR_FORMAT && st != CT_ERR_NOMEM) abort();
  if (st && !err.msg[0]) abort();
  if (!st && more != 0 && more != 1) abort();
  if (token && !more) abort();
  if (l.n > cap) abort();
  for (size_t i = 0; i < l.n; i++)
    if (!ct_storage_key_ok(l.keys[i])) abort();
  free(token);
  ct_storage_list_free(&l);
  free(doc);
  return 0;
}

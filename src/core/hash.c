/* hash.c: digests of ctuner/hash.h — FNV-1a for in-memory keys, SHA-256 and
 * MD5 hex (cache file names, content tags) through libcrypto's EVP interface. */
#include "ctuner/hash.h"

#include <openssl/evp.h>
#include <stdio.h>

uint64_t ct_hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static void digest_hex(const EVP_MD *md, const void *data, size_t n, char *out) {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data, n, d, &len, md, NULL);
  for (unsigned i = 0; i < len; i++) sprintf(out + 2 * i, "%02x", d[i]);
  out[2 * len] = '\0';
}

void ct_sha256_hex(const void *data, size_t n, char out[65]) {
  digest_hex(EVP_sha256(), data, n, out);
}
void ct_md5_hex(const void *data, size_t n, char out[33]) {
  digest_hex(EVP_md5(), data, n, out);
}

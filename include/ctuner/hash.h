/* Digests: FNV-1a 64 of a string (stable across runs and machines; not
 * cryptographic), and SHA-256 / MD5 as lowercase hex (libcrypto). */
#ifndef CTUNER_HASH_H
#define CTUNER_HASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t ct_hash_str(const char *s);
void ct_sha256_hex(const void *data, size_t n, char out[65]);
void ct_md5_hex(const void *data, size_t n, char out[33]);

#endif

/* Allocation with per-category byte accounting (Redis zmalloc style).
 *
 * Every large block goes through ct_alloc with a category so that memory can be
 * reported (and ZeRO savings shown, not guessed). Blocks are 64-byte aligned.
 * Counters are atomic; peak is tracked per category and in total.
 */
#ifndef CTUNER_ALLOC_H
#define CTUNER_ALLOC_H

#include <stddef.h>

typedef enum ct_mem_cat {
  CT_MEM_PARAMS = 0,
  CT_MEM_GRADS,
  CT_MEM_OPTIMIZER,
  CT_MEM_ACTIVATIONS,
  CT_MEM_BUFFERS,
  CT_MEM_OTHER,
  CT_MEM_NCAT
} ct_mem_cat;

/* 64-byte aligned; NULL on failure or if n == 0. */
void *ct_alloc(ct_mem_cat cat, size_t n);
/* As ct_alloc, zero-filled; NULL if count*size overflows. */
void *ct_calloc(ct_mem_cat cat, size_t count, size_t size);
/* ct_free(NULL) is a no-op. The category is remembered in a header. */
void ct_free(void *p);
/* Overwrite n bytes of a secret (a key, a token) with a write the compiler
 * may not drop as dead before a free (explicit_bzero); ct_free_secret wipes a
 * malloc'd string, then frees it (NULL: no-op). */
void ct_wipe(void *p, size_t n);
void ct_free_secret(char *s);

typedef struct ct_mem_stats {
  size_t current[CT_MEM_NCAT];
  size_t peak[CT_MEM_NCAT];
  size_t total_current, total_peak;
} ct_mem_stats;

void ct_mem_get_stats(ct_mem_stats *out);
void ct_mem_reset_peak(void); /* host and device peaks */

/* A compute device's memory (a backend whose memory the host cannot touch:
 * CUDA, the sealed test backend), counted apart from the host's in the same
 * categories: the backend calls ct_mem_device_add on each allocation and
 * ct_mem_device_sub on each free. */
void ct_mem_device_add(ct_mem_cat cat, size_t bytes);
void ct_mem_device_sub(ct_mem_cat cat, size_t bytes);
void ct_mem_get_device_stats(ct_mem_stats *out);
const char *ct_mem_cat_name(ct_mem_cat cat); /* "params", "grads", ... */

/* Overflow-checked a*b; returns 0 on success, -1 on overflow. */
int ct_mul_size(size_t a, size_t b, size_t *out);

#endif

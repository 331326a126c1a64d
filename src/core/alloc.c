/* alloc.c: 64-byte aligned allocation with per-category byte accounting.
 *
 * Each block is preceded by a 64-byte header holding a magic number, the
 * category and the requested size, so ct_free needs no category argument and
 * the returned pointer keeps 64-byte alignment. Counters are C11 atomics;
 * peaks (per category and total) are raised with compare-and-swap loops, so
 * the accounting is exact under concurrent use. A bad pointer passed to
 * ct_free (no magic) is a bug and aborts via CT_ASSERT.
 */
#include "ctuner/alloc.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/status.h"

#define ALIGN 64
#define MAGIC 0x63744d656d426c6bull /* "ctMemBlk" */
#define MAGIC_FREED 0x6672656564426c6bull

typedef struct block_hdr {
  uint64_t magic;
  uint64_t cat;
  uint64_t size;
  unsigned char pad[ALIGN - 3 * sizeof(uint64_t)];
} block_hdr;

_Static_assert(sizeof(block_hdr) == ALIGN, "block header must keep alignment");

static atomic_size_t g_cur[CT_MEM_NCAT];
static atomic_size_t g_peak[CT_MEM_NCAT];
static atomic_size_t g_total_cur;
static atomic_size_t g_total_peak;
/* the same for device memory (ct_mem_device_add) */
static atomic_size_t d_cur[CT_MEM_NCAT], d_peak[CT_MEM_NCAT], d_total_cur, d_total_peak;

static void raise_peak(atomic_size_t *peak, size_t v) {
  size_t old = atomic_load(peak);
  while (old < v && !atomic_compare_exchange_weak(peak, &old, v)) {
  }
}

int ct_mul_size(size_t a, size_t b, size_t *out) {
  int r = 0;
  if (a != 0 && b > SIZE_MAX / a) {
    r = -1;
  } else if (out) {
    *out = a * b;
  }
  return r;
}

void *ct_alloc(ct_mem_cat cat, size_t n) {
  void *raw = NULL;
  void *p = NULL;
  if (n == 0 || (unsigned)cat >= CT_MEM_NCAT) goto out;
  if (n > SIZE_MAX - sizeof(block_hdr)) goto out;
  if (posix_memalign(&raw, ALIGN, sizeof(block_hdr) + n) != 0) goto out;
  block_hdr *h = raw;
  h->magic = MAGIC;
  h->cat = (uint64_t)cat;
  h->size = (uint64_t)n;
  size_t c = atomic_fetch_add(&g_cur[cat], n) + n;
  raise_peak(&g_peak[cat], c);
  size_t t = atomic_fetch_add(&g_total_cur, n) + n;
  raise_peak(&g_total_peak, t);
  p = (unsigned char *)raw + sizeof(block_hdr);
out:
  return p;
}

void *ct_calloc(ct_mem_cat cat, size_t count, size_t size) {
  size_t n;
  void *p = NULL;
  if (ct_mul_size(count, size, &n)) goto out;
  p = ct_alloc(cat, n);
  if (p) memset(p, 0, n);
out:
  return p;
}

void ct_free(void *p) {
  if (!p) return;
  block_hdr *h = (block_hdr *)((unsigned char *)p - sizeof(block_hdr));
  CT_ASSERT(h->magic == MAGIC && h->cat < CT_MEM_NCAT);
  atomic_fetch_sub(&g_cur[h->cat], (size_t)h->size);
  atomic_fetch_sub(&g_total_cur, (size_t)h->size);
  h->magic = MAGIC_FREED;
  free(h);
}

void ct_mem_get_stats(ct_mem_stats *out) {
  if (!out) return;
  for (int c = 0; c < CT_MEM_NCAT; c++) {
    out->current[c] = atomic_load(&g_cur[c]);
    out->peak[c] = atomic_load(&g_peak[c]);
  }
  out->total_current = atomic_load(&g_total_cur);
  out->total_peak = atomic_load(&g_total_peak);
}

void ct_mem_reset_peak(void) {
  for (int c = 0; c < CT_MEM_NCAT; c++) {
    atomic_store(&g_peak[c], atomic_load(&g_cur[c]));
    atomic_store(&d_peak[c], atomic_load(&d_cur[c]));
  }
  atomic_store(&g_total_peak, atomic_load(&g_total_cur));
  atomic_store(&d_total_peak, atomic_load(&d_total_cur));
}

void ct_mem_device_add(ct_mem_cat cat, size_t bytes) {
  if ((unsigned)cat >= CT_MEM_NCAT) return;
  raise_peak(&d_peak[cat], atomic_fetch_add(&d_cur[cat], bytes) + bytes);
  raise_peak(&d_total_peak, atomic_fetch_add(&d_total_cur, bytes) + bytes);
}

void ct_mem_device_sub(ct_mem_cat cat, size_t bytes) {
  if ((unsigned)cat >= CT_MEM_NCAT) return;
  atomic_fetch_sub(&d_cur[cat], bytes);
  atomic_fetch_sub(&d_total_cur, bytes);
}

void ct_mem_get_device_stats(ct_mem_stats *out) {
  if (!out) return;
  for (int c = 0; c < CT_MEM_NCAT; c++) {
    out->current[c] = atomic_load(&d_cur[c]);
    out->peak[c] = atomic_load(&d_peak[c]);
  }
  out->total_current = atomic_load(&d_total_cur);
  out->total_peak = atomic_load(&d_total_peak);
}

const char *ct_mem_cat_name(ct_mem_cat cat) {
  static const char *names[CT_MEM_NCAT] = {"params",      "grads",   "optimizer",
                                           "activations", "buffers", "other"};
  return (unsigned)cat < CT_MEM_NCAT ? names[cat] : "unknown";
}

void ct_wipe(void *p, size_t n) {
  if (p && n) explicit_bzero(p, n);
}

void ct_free_secret(char *s) {
  if (!s) return;
  ct_wipe(s, strlen(s));
  free(s);
}

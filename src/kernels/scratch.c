/* Scratch allocation for kernels that need temporary tiles (see scratch.h).
 * Kernels return void, so an allocation failure here cannot be reported as a
 * status: it aborts with a message naming the buffer and its size. */
#include "scratch.h"

#include <stdio.h>
#include <stdlib.h>

void *ct_kernels_scratch(size_t bytes, const char *what) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "ctuner: out of memory allocating %zu bytes for the %s\n", bytes, what);
    abort();
  }
  return p;
}

/* Scratch memory for kernels (private). Kernels have no status return: the
 * few that need temporary buffers (attention score tiles) take them from here,
 * which aborts with a message if the allocation fails. */
#ifndef CT_KERNELS_SCRATCH_H
#define CT_KERNELS_SCRATCH_H

#include <stddef.h>

void *ct_kernels_scratch(size_t bytes, const char *what);

#endif

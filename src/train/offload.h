/* Optimizer state offloaded to a file (ZeRO-Infinity's "NVMe offload"; see
 * offload.c and docs/distributed.md, "Offload"). */
#ifndef CT_TRAIN_OFFLOAD_H
#define CT_TRAIN_OFFLOAD_H

#include <stddef.h>

#include "ctuner/status.h"

typedef struct ct_offload ct_offload;

/* A swap file `dir`/optimizer.swap for nstate arrays of n floats, moved in
 * sub-groups of `sub` floats (rounded up to 1024) through two buffers; pin
 * mlocks the buffers (a warning if the limit forbids it). dir is created. */
ct_status ct_offload_open(const char *dir, size_t n, size_t nstate, size_t sub, int pin,
                          ct_offload **out, ct_err *err);
/* Whole arrays to / from the file (start-up, checkpoints): arrays[i] holds n
 * floats; for store, NULL means zeros; for load, NULL skips that array. */
ct_status ct_offload_store_all(ct_offload *o, float *const *arrays, ct_err *err);
ct_status ct_offload_load_all(ct_offload *o, float *const *arrays, ct_err *err);
/* One pass over the sub-groups in order: fn gets [a, a + len) with the states
 * of that range in memory (state i at states[i]) and may change them; they
 * are written back. The next sub-group is read while fn works on the current
 * one, and writes go behind. */
typedef ct_status (*ct_offload_fn)(void *user, size_t a, size_t len, float *const *states,
                                   ct_err *err);
ct_status ct_offload_foreach(ct_offload *o, ct_offload_fn fn, void *user, ct_err *err);
/* Floats [a, b) of array arr into dst (a ZeRO-3 parameter piece), once the
 * writes of the sub-groups it touches are done. */
ct_status ct_offload_read_range(ct_offload *o, size_t arr, size_t a, size_t b, float *dst,
                                ct_err *err);
/* Seconds the caller spent waiting for reads (I/O not hidden), bytes moved. */
double ct_offload_wait_s(const ct_offload *o);
double ct_offload_bytes(const ct_offload *o);
/* "O_DIRECT" or "buffered": how the file is accessed. */
const char *ct_offload_mode(const ct_offload *o);
/* Stops the I/O thread, removes the file. NULL is fine. */
void ct_offload_close(ct_offload *o);

#endif

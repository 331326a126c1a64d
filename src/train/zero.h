/* ZeRO stages 2 and 3 over the model's segment hooks (see zero.c). Stage 1
 * needs none of this: the trainer reduce-scatters the full gradient. */
#ifndef CT_TRAIN_ZERO_H
#define CT_TRAIN_ZERO_H

#include "ctuner/comm.h"
#include "ctuner/mmdit.h"

typedef struct zero_ctx {
  ct_comm *comm;
  ct_mmdit *m;
  int stage, nseg;
  size_t n, shard, lo, hi, maxseg;
  float *gsh;            /* stage >= 2: this rank's gradient shard (shard floats) */
  float *wsh;            /* stage 3: this rank's parameter shard (borrowed) */
  /* gradient buckets: [bot, top) of the flat buffer, stored at the end of bucket[cur] */
  float *bucket[2];
  size_t cap, top, bot;
  int cur;
  ct_comm_req *breq[2];
  /* stage 3 parameter slots (maxseg floats), the segment each holds (-1 none) */
  float *slot[2];
  int slot_seg[2], cur_slot;
  ct_comm_req *sreq[2];
  long buckets, misses;
  double wait_s;         /* seconds blocked in waits (communication not hidden) */  /* reduce-scatters started; segments gathered without prefetch */
} zero_ctx;

/* Stages 2 and 3 install the hooks and allocate the gradient shard, two buckets
 * of max(bucket, largest segment) floats and (stage 3) two parameter slots.
 * Stages 0 and 1 only fill the shard geometry. */
ct_status zero_init(zero_ctx *z, ct_comm *comm, ct_mmdit *m, int stage, size_t bucket, ct_err *err);
/* Stage 3: wsh (shard floats, this rank's [lo, hi)) becomes the parameters;
 * the model's full buffer is freed. */
ct_status zero_shard_params(zero_ctx *z, float *wsh, ct_err *err);
/* Zero the gradient shard (start of an optimizer step). */
void zero_begin_step(zero_ctx *z);
/* The shard changed (after the optimizer step): slots are stale. */
ct_status zero_params_changed(zero_ctx *z, ct_err *err);
/* Stage 3: every rank sends its shard; rank 0 gets the full parameters in
 * *full and the model points at them without hooks (validation, checkpoints)
 * until zero_release. Other stages and other ranks: *full = NULL. */
ct_status zero_materialize(zero_ctx *z, float **full, ct_err *err);
void zero_release(zero_ctx *z, float *full);
void zero_free(zero_ctx *z);

#endif

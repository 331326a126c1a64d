/* ZeRO stages 2 and 3, and bf16 storage at any stage, over the model's
 * segment hooks (see zero.c). Stage 1 in float32 needs none of this: the
 * trainer reduce-scatters the full gradient. */
#ifndef CT_TRAIN_ZERO_H
#define CT_TRAIN_ZERO_H

#include <stdint.h>

#include "ctuner/backend.h"
#include "ctuner/comm.h"
#include "train/model.h"

/* Stage 3 with the parameters offloaded: reads floats [a, b) of this rank's
 * range (offsets from lo) into dst. */
typedef ct_status (*zero_read_fn)(void *user, size_t a, size_t b, float *dst, ct_err *err);

/* Stage 3: the model's frozen storage (ct_model_ops.frozen_segment, LoRA's
 * base) sharded by byte ranges — whatever its dtype — and gathered per
 * segment into two slots, the next segment prefetched; no reduction. */
typedef struct zero_frozen {
  int on, nseg;
  size_t bytes, shard, lo, hi, maxseg; /* bytes; this rank holds [lo, hi) */
  const void *mine;                    /* those bytes (borrowed); NULL: offloaded (read) */
  zero_read_fn read; /* offload_param: floats [a, b) of this rank's range from the file */
  void *read_user;
  float *piece[2]; /* ... read into these, one per slot */
  void *slot[2];
  int slot_seg[2], cur;
  ct_comm_req *req[2];
  long misses; /* segments gathered without prefetch */
} zero_frozen;

typedef struct zero_ctx {
  const ct_backend_ops *be; /* where the bf16 storage, segment scratch and gradient shard live */
  ct_comm *comm;
  ct_model *m;
  int stage, nseg, bf16;
  size_t n, shard, lo, hi, maxseg;
  size_t mlo, mhi; /* the master / optimizer range: [lo, hi), or all at stage 0 */
  float *master;   /* float32 weights of [mlo, mhi) (borrowed): fp32 stage 3, or bf16 */
  /* float32 storage (stages 2-3) */
  float *gsh; /* this rank's gradient shard (shard floats) */
  /* bf16 storage */
  uint16_t *w16;      /* parameters: all n (stages 0-2) or this rank's shard (stage 3) */
  uint16_t *g16;      /* gradients: all n (stages 0-1) or this rank's shard (stages 2-3) */
  float *wseg, *gseg; /* one segment in float32: its parameters, its gradient */
  float *g32;         /* the step's float32 gradient of [mlo, mhi) */
  void *gdst;         /* bf16 stages 2-3: where the current segment's gradient goes in its bucket */
  /* gradient buckets: [bot, top) of the flat buffer, stored at the end of bucket[cur] */
  void *bucket[2];
  size_t cap, top, bot;
  int cur;
  ct_comm_req *breq[2];
  /* stage 3 parameter slots (maxseg elements), the segment each holds (-1 none) */
  void *slot[2];
  int slot_seg[2], cur_slot;
  ct_comm_req *sreq[2];
  zero_read_fn read; /* parameters offloaded: master is NULL, pieces come from here ... */
  void *read_user;
  float *piece[2];      /* ... into these, one per slot */
  long buckets, misses; /* reduce-scatters started; segments gathered without prefetch */
  double wait_s;        /* seconds blocked in waits (communication not hidden) */
  zero_frozen fz;       /* stage 3: the frozen storage's shard */
} zero_ctx;

/* This rank's byte range [lo, hi) of a frozen storage of `bytes` bytes over
 * N ranks: shards of 4 * ct_comm_shard_len(ceil(bytes / 4), N) bytes (64-byte
 * aligned; a float storage's shards are whole floats). */
void zero_frozen_range(size_t bytes, int N, int rank, size_t *shard, size_t *lo, size_t *hi);
/* Stage 3 after zero_init: the model's frozen storage is this rank's bytes
 * [lo, hi) at mine (borrowed, shard bytes allocated); every segment is
 * gathered through hooks.enter_frozen. */
ct_status zero_set_frozen(zero_ctx *z, const void *mine, ct_err *err);
/* offload_param: the frozen shard lives elsewhere (a swap file of shard / 4
 * floats); each gather reads the floats covering this rank's bytes of the
 * segment through fn first, and mine is no longer used. */
ct_status zero_set_frozen_reader(zero_ctx *z, zero_read_fn fn, void *user, ct_err *err);
/* Completes the outstanding frozen gathers (before other collectives that
 * not every rank's hooks see, e.g. validation's gather). */
ct_status zero_frozen_idle(zero_ctx *z, ct_err *err);

/* Stages 2-3 or bf16: installs the hooks and allocates what the mode needs
 * (gradient shard and two buckets of max(bucket, largest segment) elements;
 * stage 3 two parameter slots; bf16 the bf16 parameters and gradients and
 * float32 segment scratch). master: float32 weights of [mlo, mhi) — needed
 * for stage 3 and bf16, NULL otherwise; bf16 rounds it into the bf16
 * parameters (every rank must call this: stages 1-2 all-gather them). be:
 * the compute backend of the bf16 storage and scratch (NULL: the CPU's).
 * Stages 0-1 in float32 only fill the geometry. */
ct_status zero_init(zero_ctx *z, ct_comm *comm, ct_model *m, int stage, int bf16, size_t bucket,
                    float *master, const ct_backend_ops *be, ct_err *err);
/* Stage 3 (float32): the parameters live elsewhere (offload); each gather
 * reads this rank's piece through fn first. */
ct_status zero_set_reader(zero_ctx *z, zero_read_fn fn, void *user, ct_err *err);
/* Zero the gradient storage (start of an optimizer step). */
void zero_begin_step(zero_ctx *z);
/* bf16, after the micro-steps: reduces the bf16 gradient (stage 0 all-reduce,
 * stage 1 reduce-scatter; stages 2-3 already did) and returns this rank's
 * float32 gradient of [mlo, mhi). */
ct_status zero_bf16_grads(zero_ctx *z, float **g32, ct_err *err);
/* After the optimizer changed the master weights: bf16 rounds them into the
 * bf16 parameters (stages 1-2 all-gather them); stage 3 marks the slots stale. */
ct_status zero_params_changed(zero_ctx *z, ct_err *err);
/* Remove (0) or reinstall (1) the hooks, e.g. around validation on rank 0. */
void zero_hooks(zero_ctx *z, int on);
void zero_free(zero_ctx *z);

#endif

/* zero.c: ZeRO stages 2 and 3 through the model's segment hooks
 * (docs/distributed.md, "ZeRO-2 and ZeRO-3").
 *
 * Stage 2: the backward writes each segment's gradient into a bucket buffer
 * instead of a full-size gradient buffer. Segments complete from the end of
 * the flat buffer towards its start, so a bucket is the contiguous range
 * [bot, top) growing downwards; when the next segment would make it larger
 * than the bucket capacity, the bucket's reduce-scatter starts (non-blocking)
 * and the other bucket buffer takes over, after its own reduction (two
 * buckets back) has completed. Every segment boundary tests the outstanding
 * operations, so MPI progresses them while the backward computes. The
 * reductions accumulate into this rank's gradient shard, which is all the
 * gradient a rank keeps.
 *
 * Stage 3: parameters live only as this rank's shard. Before a segment runs
 * (forward or backward) its parameters are all-gathered into one of two slots;
 * the next segment in execution order is prefetched into the other slot at
 * the same time. A slot that already holds the segment is reused (the final
 * layer from forward to backward, the input embeddings from one micro-step to
 * the next) until the optimizer changes the shard.
 */
#include <string.h>
#include <time.h>

#include "ctuner/alloc.h"
#include "ctuner/log.h"
#include "train/zero.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static ct_status z_wait(zero_ctx *z, ct_comm_req **r, ct_err *err) {
  if (!*r) return CT_OK;
  const double t0 = now();
  ct_status st = ct_comm_wait(z->comm, *r, err);
  z->wait_s += now() - t0;
  *r = NULL;
  return st;
}

/* Starts the current bucket's reduce-scatter and frees the other buffer. */
static ct_status flush(zero_ctx *z, ct_err *err) {
  if (z->top == z->bot) return CT_OK;
  float *base = z->bucket[z->cur] + z->cap - (z->top - z->bot);
  ct_status st = ct_comm_ireduce_scatter(z->comm, base, z->bot, z->top, z->shard, z->gsh, &z->breq[z->cur], err);
  if (st) return st;
  z->buckets++;
  z->cur ^= 1;
  z->top = z->bot = 0;
  return z_wait(z, &z->breq[z->cur], err);
}

static ct_status grad_enter(zero_ctx *z, size_t off, size_t n, float **g, ct_err *err) {
  ct_status st;
  if (z->top != z->bot && z->top - off > z->cap && (st = flush(z, err))) return st;
  if (z->top == z->bot) z->top = z->bot = off + n;
  CT_ASSERT(off + n == z->bot); /* segments complete downwards, without gaps */
  float *dst = z->bucket[z->cur] + z->cap - (z->top - off);
  memset(dst, 0, n * sizeof(float));
  z->bot = off;
  *g = dst;
  return CT_OK;
}

static ct_status gather_into(zero_ctx *z, int k, int s, ct_err *err) {
  size_t off, n;
  ct_mmdit_segment(z->m, s, &off, &n);
  ct_status st = z_wait(z, &z->sreq[k], err);
  if (!st) st = ct_comm_iallgather(z->comm, z->wsh, off, off + n, z->shard, z->slot[k], &z->sreq[k], err);
  z->slot_seg[k] = st ? -1 : s;
  return st;
}

static ct_status param_enter(zero_ctx *z, int s, int backward, float **w, ct_err *err) {
  ct_status st = CT_OK;
  int k = z->slot_seg[0] == s ? 0 : z->slot_seg[1] == s ? 1 : -1;
  if (k < 0) { /* not prefetched: gather now */
    k = z->cur_slot;
    z->misses++;
    if ((st = gather_into(z, k, s, err))) return st;
  }
  if ((st = z_wait(z, &z->sreq[k], err))) return st;
  z->cur_slot = k;
  const int next = backward ? s - 1 : s + 1;
  if (next >= 0 && next < z->nseg && z->slot_seg[k ^ 1] != next && (st = gather_into(z, k ^ 1, next, err)))
    return st;
  *w = z->slot[k];
  return CT_OK;
}

static ct_status progress(zero_ctx *z, ct_err *err) {
  ct_comm_req *rs[4] = {z->breq[0], z->breq[1], z->sreq[0], z->sreq[1]};
  for (int i = 0; i < 4; i++) {
    int done;
    ct_status st = ct_comm_test(z->comm, rs[i], &done, err);
    if (st) return st;
  }
  return CT_OK;
}

static ct_status z_enter(void *user, int s, int backward, float **w, float **g, ct_err *err) {
  zero_ctx *z = user;
  size_t off, n;
  ct_mmdit_segment(z->m, s, &off, &n);
  ct_status st = CT_OK;
  if (z->stage >= 3) st = param_enter(z, s, backward, w, err);
  if (!st && backward && z->stage >= 2) st = grad_enter(z, off, n, g, err);
  return st;
}

static ct_status z_leave(void *user, int s, int backward, ct_err *err) {
  zero_ctx *z = user;
  ct_status st = progress(z, err);
  if (!st && backward && s == 0 && z->stage >= 2) { /* the backward is over: finish every reduction */
    st = flush(z, err);
    if (!st) st = z_wait(z, &z->breq[0], err);
    if (!st) st = z_wait(z, &z->breq[1], err);
  }
  return st;
}

ct_status zero_init(zero_ctx *z, ct_comm *comm, ct_mmdit *m, int stage, size_t bucket, ct_err *err) {
  memset(z, 0, sizeof *z);
  z->comm = comm;
  z->m = m;
  z->stage = stage;
  z->n = ct_mmdit_numel(m);
  z->shard = ct_comm_shard_len(z->n, ct_comm_size(comm));
  z->lo = (size_t)ct_comm_rank(comm) * z->shard;
  if (z->lo > z->n) z->lo = z->n;
  z->hi = z->lo + z->shard < z->n ? z->lo + z->shard : z->n;
  z->nseg = ct_mmdit_nsegments(m);
  z->slot_seg[0] = z->slot_seg[1] = -1;
  if (stage < 2) return CT_OK;
  for (int s = 0; s < z->nseg; s++) {
    size_t off, n;
    ct_mmdit_segment(m, s, &off, &n);
    if (n > z->maxseg) z->maxseg = n;
  }
  z->cap = bucket > z->maxseg ? bucket : z->maxseg; /* a segment is one piece */
  z->gsh = ct_calloc(CT_MEM_GRADS, z->shard ? z->shard : 1, sizeof(float));
  z->bucket[0] = ct_alloc(CT_MEM_BUFFERS, z->cap * sizeof(float));
  z->bucket[1] = ct_alloc(CT_MEM_BUFFERS, z->cap * sizeof(float));
  if (!z->gsh || !z->bucket[0] || !z->bucket[1])
    return ct_errf(err, CT_ERR_NOMEM, "out of memory for ZeRO-%d gradient buffers (%zu + 2 x %zu floats)", stage,
                   z->shard, z->cap);
  if (stage >= 3) {
    z->slot[0] = ct_alloc(CT_MEM_BUFFERS, z->maxseg * sizeof(float));
    z->slot[1] = ct_alloc(CT_MEM_BUFFERS, z->maxseg * sizeof(float));
    if (!z->slot[0] || !z->slot[1])
      return ct_errf(err, CT_ERR_NOMEM, "out of memory for ZeRO-3 parameter slots (2 x %zu floats)", z->maxseg);
  }
  ct_mmdit_hooks h = {z, z_enter, z_leave};
  ct_mmdit_set_hooks(m, &h);
  return CT_OK;
}

ct_status zero_shard_params(zero_ctx *z, float *wsh, ct_err *err) {
  (void)err;
  CT_ASSERT(z->stage >= 3);
  z->wsh = wsh;
  ct_mmdit_use_params(z->m, NULL);
  return CT_OK;
}

void zero_begin_step(zero_ctx *z) {
  if (z->stage >= 2) memset(z->gsh, 0, z->shard * sizeof(float));
}

ct_status zero_params_changed(zero_ctx *z, ct_err *err) {
  ct_status st = CT_OK;
  for (int k = 0; k < 2; k++) {
    ct_status s2 = z_wait(z, &z->sreq[k], err);
    if (!st) st = s2;
    z->slot_seg[k] = -1;
  }
  return st;
}

ct_status zero_materialize(zero_ctx *z, float **full, ct_err *err) {
  *full = NULL;
  if (z->stage < 3) return CT_OK;
  ct_status st = zero_params_changed(z, err);
  const int lead = ct_comm_rank(z->comm) == 0;
  if (!st && lead) {
    *full = ct_alloc(CT_MEM_BUFFERS, z->n * sizeof(float));
    if (!*full) st = ct_errf(err, CT_ERR_NOMEM, "out of memory gathering the %zu parameters", z->n);
  }
  /* every rank takes part even if rank 0 failed: the CLI then aborts the job */
  ct_status s2 = ct_comm_gather_f32(z->comm, z->wsh, *full, z->shard, z->n, 0, err);
  if (!st) st = s2;
  if (!st && lead) {
    ct_mmdit_set_hooks(z->m, NULL);
    ct_mmdit_use_params(z->m, *full);
  }
  return st;
}

void zero_release(zero_ctx *z, float *full) {
  if (z->stage < 3) return;
  if (full) {
    ct_mmdit_use_params(z->m, NULL);
    ct_mmdit_hooks h = {z, z_enter, z_leave};
    ct_mmdit_set_hooks(z->m, &h);
  }
  ct_free(full);
}

void zero_free(zero_ctx *z) {
  if (!z->comm) return;
  ct_err e = {0};
  for (int k = 0; k < 2; k++) {
    ct_comm_wait(z->comm, z->breq[k], &e);
    ct_comm_wait(z->comm, z->sreq[k], &e);
    ct_free(z->bucket[k]);
    ct_free(z->slot[k]);
  }
  ct_free(z->gsh);
  if (z->m && z->stage >= 2) ct_mmdit_set_hooks(z->m, NULL);
  memset(z, 0, sizeof *z);
}

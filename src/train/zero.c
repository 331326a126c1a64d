/* zero.c: ZeRO stages 2 and 3, and bf16 storage, through the model's segment
 * hooks (docs/distributed.md, "ZeRO-2 and ZeRO-3", "bf16").
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
 *
 * Stage 3 with a frozen storage (LoRA's base, ct_model_ops.frozen_segment):
 * each rank keeps only its byte range of it; a frozen segment's bytes are
 * all-gathered into one of two more slots before it runs, the next one the
 * model names prefetched, as for the parameters — never reduced, never stale.
 *
 * bf16 (any stage): parameters, gradients, buckets and slots hold bf16; the
 * float32 master weights and optimizer state cover [mlo, mhi). A segment's
 * parameters are widened to float32 scratch when it is entered and its float32
 * gradient is rounded into the bf16 storage when it is left, so the kernels
 * always compute in float32. Stages 0-1 keep all bf16 parameters and
 * gradients and reduce once per step (all-reduce or reduce-scatter in bf16).
 *
 * The bf16 storage, its float32 segment scratch, the step's float32 gradient
 * and the stage 2-3 gradient shard are the compute backend's memory (z->be),
 * widened, narrowed and zeroed by its ops; the buckets, slots and pieces that
 * MPI reads and writes stay host memory (a backend without host memory runs
 * one rank at stage 0: reside.c).
 */
#include "train/zero.h"

#include <string.h>
#include <time.h>

#include "ctuner/alloc.h"
#include "ctuner/log.h"
#include "ctuner/safetensors.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t es(const zero_ctx *z) {
  return z->bf16 ? 2 : 4;
}
static ct_comm_dtype dt(const zero_ctx *z) {
  return z->bf16 ? CT_COMM_BF16 : CT_COMM_F32;
}

/* bf16 storage through the compute backend's ops (the CPU's: the loops they replaced) */
static void widen(const zero_ctx *z, const uint16_t *src, float *dst, size_t n) {
  z->be->bf16_widen(n, src, dst);
}

static void narrow(const zero_ctx *z, const float *src, uint16_t *dst, size_t n) {
  z->be->bf16_narrow(n, src, dst);
}

/* bf16 storage of n elements, allocated as whole floats so be->zero clears it */
static uint16_t *alloc16(const zero_ctx *z, ct_mem_cat cat, size_t n) {
  const size_t nf = (n + 1) / 2 ? (n + 1) / 2 : 1;
  uint16_t *p = z->be->alloc(cat, nf * sizeof(float));
  if (p) z->be->zero(nf, (float *)p);
  return p;
}
static void zero16(const zero_ctx *z, uint16_t *p, size_t n) {
  if (n) z->be->zero((n + 1) / 2, (float *)p);
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
  char *base = (char *)z->bucket[z->cur] + (z->cap - (z->top - z->bot)) * es(z);
  void *acc = z->bf16 ? (void *)z->g16 : (void *)z->gsh;
  ct_status st = ct_comm_ireduce_scatter_t(z->comm, dt(z), CT_COMM_ACCUMULATE, base, z->bot, z->top,
                                           z->shard, acc, &z->breq[z->cur], err);
  if (st) return st;
  z->buckets++;
  z->cur ^= 1;
  z->top = z->bot = 0;
  return z_wait(z, &z->breq[z->cur], err);
}

/* The place of segment [off, off + n) in the current bucket. */
static ct_status grad_place(zero_ctx *z, size_t off, size_t n, void **dst, ct_err *err) {
  ct_status st;
  if (z->top != z->bot && z->top - off > z->cap && (st = flush(z, err))) return st;
  if (z->top == z->bot) z->top = z->bot = off + n;
  CT_ASSERT(off + n == z->bot); /* segments complete downwards, without gaps */
  *dst = (char *)z->bucket[z->cur] + (z->cap - (z->top - off)) * es(z);
  z->bot = off;
  return CT_OK;
}

static ct_status gather_into(zero_ctx *z, int k, int s, ct_err *err) {
  size_t off, n;
  z->m->ops->segment(z->m, s, &off, &n);
  ct_status st = z_wait(z, &z->sreq[k], err);
  if (!st && z->read) { /* offloaded: this rank's piece from the swap file first */
    const size_t pa = off > z->lo ? off : z->lo, pb = off + n < z->hi ? off + n : z->hi;
    if (pb > pa) st = z->read(z->read_user, pa - z->lo, pb - z->lo, z->piece[k], err);
    if (!st)
      st = ct_comm_iallgather_piece(z->comm, CT_COMM_F32, z->piece[k], off, off + n, z->shard,
                                    z->slot[k], &z->sreq[k], err);
    z->slot_seg[k] = st ? -1 : s;
    return st;
  }
  const void *mine = z->bf16 ? (const void *)z->w16 : (const void *)z->master;
  if (!st)
    st = ct_comm_iallgather_t(z->comm, dt(z), mine, off, off + n, z->shard, z->slot[k], &z->sreq[k],
                              err);
  z->slot_seg[k] = st ? -1 : s;
  return st;
}

/* Stage 3: segment s's parameters in a slot (waiting for its gather), the
 * next segment's gather started. */
static ct_status param_slot(zero_ctx *z, int s, int backward, void **slot, ct_err *err) {
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
  if (next >= 0 && next < z->nseg && z->slot_seg[k ^ 1] != next &&
      (st = gather_into(z, k ^ 1, next, err)))
    return st;
  *slot = z->slot[k];
  return CT_OK;
}

/* ---- the frozen storage (stage 3) ---- */

static ct_status frozen_gather(zero_ctx *z, int k, int s, ct_err *err) {
  zero_frozen *f = &z->fz;
  size_t off, n;
  z->m->ops->frozen_segment(z->m, s, &off, &n);
  ct_status st = z_wait(z, &f->req[k], err);
  if (!st && f->read) { /* offloaded: the floats covering this rank's bytes, from the file */
    const size_t pa = off > f->lo ? off : f->lo, pb = off + n < f->hi ? off + n : f->hi;
    const size_t a = (pa - f->lo) / 4, b = (pb - f->lo + 3) / 4;
    if (pb > pa) st = f->read(f->read_user, a, b, f->piece[k], err);
    const char *mine = (const char *)f->piece[k] + (pb > pa ? (pa - f->lo) % 4 : 0);
    if (!st)
      st = ct_comm_iallgather_piece(z->comm, CT_COMM_U8, mine, off, off + n, f->shard, f->slot[k],
                                    &f->req[k], err);
  } else if (!st) {
    st = ct_comm_iallgather_t(z->comm, CT_COMM_U8, f->mine, off, off + n, f->shard, f->slot[k],
                              &f->req[k], err);
  }
  f->slot_seg[k] = st ? -1 : s;
  return st;
}

static ct_status z_enter_frozen(void *user, int s, int next, void **w, ct_err *err) {
  zero_ctx *z = user;
  zero_frozen *f = &z->fz;
  ct_status st = CT_OK;
  int k = f->slot_seg[0] == s ? 0 : f->slot_seg[1] == s ? 1 : -1;
  if (k < 0) { /* not prefetched: gather now, into the slot the last segment used */
    k = f->cur;
    f->misses++;
    if ((st = frozen_gather(z, k, s, err))) return st;
  }
  if ((st = z_wait(z, &f->req[k], err))) return st;
  f->cur = k;
  if (next >= 0 && next < f->nseg && next != s && f->slot_seg[k ^ 1] != next &&
      (st = frozen_gather(z, k ^ 1, next, err)))
    return st;
  *w = f->slot[k];
  return CT_OK;
}

void zero_frozen_range(size_t bytes, int N, int rank, size_t *shard, size_t *lo, size_t *hi) {
  *shard = 4 * ct_comm_shard_len((bytes + 3) / 4, N);
  *lo = (size_t)rank * *shard;
  if (*lo > bytes) *lo = bytes;
  *hi = *lo + *shard < bytes ? *lo + *shard : bytes;
}

ct_status zero_set_frozen(zero_ctx *z, const void *mine, ct_err *err) {
  CT_ASSERT(z->comm && z->stage >= 3 && z->m->ops->frozen_segment);
  zero_frozen *f = &z->fz;
  memset(f, 0, sizeof *f);
  f->nseg = z->m->ops->frozen_nsegments(z->m);
  for (int s = 0; s < f->nseg; s++) {
    size_t off, n;
    z->m->ops->frozen_segment(z->m, s, &off, &n);
    if (n > f->maxseg) f->maxseg = n;
    if (off + n > f->bytes) f->bytes = off + n;
  }
  zero_frozen_range(f->bytes, ct_comm_size(z->comm), ct_comm_rank(z->comm), &f->shard, &f->lo,
                    &f->hi);
  f->slot_seg[0] = f->slot_seg[1] = -1;
  for (int k = 0; k < 2; k++) {
    f->slot[k] = ct_alloc(CT_MEM_BUFFERS, f->maxseg ? f->maxseg : 1);
    if (!f->slot[k])
      return ct_errf(err, CT_ERR_NOMEM,
                     "out of memory for ZeRO-3 frozen-weight slots (2 x %zu bytes)", f->maxseg);
  }
  f->mine = mine;
  f->on = 1;
  z->m->ops->use_frozen(z->m, NULL);
  zero_hooks(z, 1);
  return CT_OK;
}

ct_status zero_set_frozen_reader(zero_ctx *z, zero_read_fn fn, void *user, ct_err *err) {
  zero_frozen *f = &z->fz;
  CT_ASSERT(f->on);
  const size_t cap = (f->maxseg < f->shard ? f->maxseg : f->shard) + 8; /* whole floats */
  ct_status st = zero_frozen_idle(z, err);
  for (int k = 0; k < 2 && !st; k++) {
    f->piece[k] = ct_alloc(CT_MEM_BUFFERS, cap);
    if (!f->piece[k])
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory for frozen-weight pieces (%zu bytes)", cap);
  }
  if (st) return st;
  f->read = fn;
  f->read_user = user;
  f->mine = NULL;
  return CT_OK;
}

ct_status zero_frozen_idle(zero_ctx *z, ct_err *err) {
  ct_status st = CT_OK;
  for (int k = 0; k < 2; k++) {
    ct_status s2 = z_wait(z, &z->fz.req[k], err);
    if (!st) st = s2;
  }
  return st;
}

static ct_status progress(zero_ctx *z, ct_err *err) {
  ct_comm_req *rs[6] = {z->breq[0], z->breq[1], z->sreq[0], z->sreq[1], z->fz.req[0], z->fz.req[1]};
  for (int i = 0; i < 6; i++) {
    int done;
    ct_status st = ct_comm_test(z->comm, rs[i], &done, err);
    if (st) return st;
  }
  return CT_OK;
}

static ct_status z_enter(void *user, int s, int backward, float **w, float **g, ct_err *err) {
  zero_ctx *z = user;
  size_t off, n;
  z->m->ops->segment(z->m, s, &off, &n);
  ct_status st = CT_OK;
  /* parameters */
  if (z->stage >= 3) {
    void *slot;
    if ((st = param_slot(z, s, backward, &slot, err))) return st;
    if (z->bf16)
      widen(z, slot, z->wseg, n);
    else
      *w = slot;
  } else if (z->bf16) {
    widen(z, z->w16 + off, z->wseg, n);
  }
  if (z->bf16) *w = z->wseg;
  if (!backward) return CT_OK;
  /* gradients */
  if (z->bf16) {
    z->be->zero(n, z->gseg);
    *g = z->gseg;
    if (z->stage >= 2) st = grad_place(z, off, n, &z->gdst, err);
  } else if (z->stage >= 2) {
    void *dst;
    st = grad_place(z, off, n, &dst, err);
    if (!st) {
      memset(dst, 0, n * sizeof(float));
      *g = dst;
    }
  }
  return st;
}

static ct_status z_leave(void *user, int s, int backward, ct_err *err) {
  zero_ctx *z = user;
  if (backward && z->bf16) { /* the segment's float32 gradient into bf16 storage */
    size_t off, n;
    z->m->ops->segment(z->m, s, &off, &n);
    const float *gs = z->gseg;
    if (z->stage >= 2)
      narrow(z, gs, z->gdst, n);
    else
      z->be->bf16_narrow_acc(n, gs, z->g16 + off);
  }
  ct_status st = progress(z, err);
  if (!st && backward && s == 0 &&
      z->stage >= 2) { /* the backward is over: finish every reduction */
    st = flush(z, err);
    if (!st) st = z_wait(z, &z->breq[0], err);
    if (!st) st = z_wait(z, &z->breq[1], err);
  }
  return st;
}

void zero_hooks(zero_ctx *z, int on) {
  if (!z->comm || (z->stage < 2 && !z->bf16)) return;
  ct_model_hooks h = {z, z_enter, z_leave, z->fz.on ? z_enter_frozen : NULL};
  z->m->ops->set_hooks(z->m, on ? &h : NULL);
}

ct_status zero_init(zero_ctx *z, ct_comm *comm, ct_model *m, int stage, int bf16, size_t bucket,
                    float *master, const ct_backend_ops *be, ct_err *err) {
  memset(z, 0, sizeof *z);
  z->be = be ? be : ct_backend_default();
  z->comm = comm;
  z->m = m;
  z->stage = stage;
  z->bf16 = bf16;
  z->master = master;
  z->n = ct_model_numel(m);
  z->shard = ct_comm_shard_len(z->n, ct_comm_size(comm));
  z->lo = (size_t)ct_comm_rank(comm) * z->shard;
  if (z->lo > z->n) z->lo = z->n;
  z->hi = z->lo + z->shard < z->n ? z->lo + z->shard : z->n;
  z->mlo = stage >= 1 ? z->lo : 0;
  z->mhi = stage >= 1 ? z->hi : z->n;
  z->nseg = m->ops->nsegments(m);
  z->slot_seg[0] = z->slot_seg[1] = -1;
  if (stage < 2 && !bf16) return CT_OK;
  for (int s = 0; s < z->nseg; s++) {
    size_t off, n;
    m->ops->segment(m, s, &off, &n);
    if (n > z->maxseg) z->maxseg = n;
  }
  const size_t e = es(z), sh = z->shard ? z->shard : 1;
  if (stage >= 2) {
    z->cap = bucket > z->maxseg ? bucket : z->maxseg; /* a segment is one piece */
    z->bucket[0] = ct_alloc(CT_MEM_BUFFERS, z->cap * e);
    z->bucket[1] = ct_alloc(CT_MEM_BUFFERS, z->cap * e);
    if (!z->bucket[0] || !z->bucket[1])
      return ct_errf(err, CT_ERR_NOMEM, "out of memory for two gradient buckets of %zu elements",
                     z->cap);
  }
  if (stage >= 3) {
    z->slot[0] = ct_alloc(CT_MEM_BUFFERS, z->maxseg * e);
    z->slot[1] = ct_alloc(CT_MEM_BUFFERS, z->maxseg * e);
    if (!z->slot[0] || !z->slot[1])
      return ct_errf(err, CT_ERR_NOMEM,
                     "out of memory for ZeRO-3 parameter slots (2 x %zu elements)", z->maxseg);
  }
  if (bf16) {
    const size_t nw16 = stage >= 3 ? sh : z->n, ng16 = stage >= 2 ? sh : z->n;
    z->w16 = alloc16(z, CT_MEM_PARAMS, nw16);
    z->g16 = alloc16(z, CT_MEM_GRADS, ng16);
    z->wseg = z->be->alloc(CT_MEM_BUFFERS, (z->maxseg ? z->maxseg : 1) * sizeof(float));
    z->gseg = z->be->alloc(CT_MEM_BUFFERS, (z->maxseg ? z->maxseg : 1) * sizeof(float));
    z->g32 = z->be->alloc(CT_MEM_BUFFERS, (z->mhi - z->mlo ? z->mhi - z->mlo : 1) * sizeof(float));
    if (!z->w16 || !z->g16 || !z->wseg || !z->gseg || !z->g32)
      return ct_errf(err, CT_ERR_NOMEM, "out of memory for the bf16 parameters and gradients");
  } else {
    z->gsh = z->be->alloc(CT_MEM_GRADS, sh * sizeof(float));
    if (z->gsh) z->be->zero(sh, z->gsh);
    if (!z->gsh)
      return ct_errf(err, CT_ERR_NOMEM, "out of memory for the gradient shard (%zu floats)", sh);
  }
  m->ops->use_grads(m, NULL);
  if (stage >= 3 || bf16) m->ops->use_params(m, NULL);
  zero_hooks(z, 1);
  return bf16 ? zero_params_changed(z, err) : CT_OK;
}

ct_status zero_set_reader(zero_ctx *z, zero_read_fn fn, void *user, ct_err *err) {
  CT_ASSERT(z->stage >= 3 && !z->bf16);
  const size_t cap = z->maxseg < z->shard ? z->maxseg : z->shard;
  for (int k = 0; k < 2; k++) {
    z->piece[k] = ct_alloc(CT_MEM_BUFFERS, (cap ? cap : 1) * sizeof(float));
    if (!z->piece[k])
      return ct_errf(err, CT_ERR_NOMEM, "out of memory for parameter pieces (%zu floats)", cap);
  }
  z->read = fn;
  z->read_user = user;
  z->master = NULL;
  return zero_params_changed(z, err);
}

void zero_begin_step(zero_ctx *z) {
  if (z->bf16)
    zero16(z, z->g16, z->stage >= 2 ? z->shard : z->n);
  else if (z->stage >= 2)
    z->be->zero(z->shard, z->gsh);
}

ct_status zero_bf16_grads(zero_ctx *z, float **g32, ct_err *err) {
  ct_status st = CT_OK;
  const double t0 = now();
  if (z->stage == 0)
    st = ct_comm_allreduce_bf16(z->comm, z->g16, z->n, err);
  else if (z->stage == 1)
    st = ct_comm_reduce_scatter_bf16(z->comm, z->g16, z->n, z->shard, err);
  z->wait_s += now() - t0;
  if (st) return st;
  /* stages 0-1 hold all n (this rank's range at [mlo, ...)); 2-3 the shard */
  widen(z, z->g16 + (z->stage >= 2 ? 0 : z->mlo), z->g32, z->mhi - z->mlo);
  *g32 = z->g32;
  return CT_OK;
}

ct_status zero_params_changed(zero_ctx *z, ct_err *err) {
  ct_status st = CT_OK;
  for (int k = 0; k < 2; k++) { /* stage 3: the slots hold old values */
    ct_status s2 = z_wait(z, &z->sreq[k], err);
    if (!st) st = s2;
    z->slot_seg[k] = -1;
  }
  if (st || !z->bf16) return st;
  const size_t n = z->mhi - z->mlo;
  narrow(z, z->master, z->w16 + (z->stage >= 3 ? 0 : z->mlo), n);
  if (z->stage == 1 || z->stage == 2) {
    const double t0 = now();
    st = ct_comm_allgather_bf16(z->comm, z->w16, z->n, z->shard, err);
    z->wait_s += now() - t0;
  }
  return st;
}

void zero_free(zero_ctx *z) {
  if (!z->comm) return;
  ct_err e = {0};
  for (int k = 0; k < 2; k++) {
    ct_comm_wait(z->comm, z->breq[k], &e);
    ct_comm_wait(z->comm, z->sreq[k], &e);
    ct_free(z->bucket[k]);
    ct_free(z->slot[k]);
    ct_free(z->piece[k]);
    ct_comm_wait(z->comm, z->fz.req[k], &e);
    ct_free(z->fz.slot[k]);
    ct_free(z->fz.piece[k]);
  }
  z->be->free(z->gsh);
  z->be->free(z->w16);
  z->be->free(z->g16);
  z->be->free(z->wseg);
  z->be->free(z->gseg);
  z->be->free(z->g32);
  zero_hooks(z, 0);
  memset(z, 0, sizeof *z);
}

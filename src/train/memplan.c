/* Memory planning without allocating (`ctuner bench memory --plan`): the bytes
 * per rank of the trainable model's parameters, gradients and optimizer state
 * as the trainer allocates them — loop.c (ct_trainer_shard: the float32 range
 * or master weights), zero.c (the gradient shard, bf16 parameters and
 * gradients), optim.c (state arrays at a 16-float stride), offload.c (three
 * sub-group buffers) — and the model geometry a config trains. */
#include <string.h>

#include "ctuner/comm.h"
#include "trainer_int.h"

/* ct_train_model_config: the family row's geometry (family.c). */

static size_t round16(size_t n) {
  return (n + 15) & ~(size_t)15;
}

/* offload.c's sub-group length for a range of n floats (update.c's default). */
static size_t offload_sub(size_t n, size_t asked) {
  size_t sub = n / 8;
  sub = sub < ((size_t)1 << 18) ? (size_t)1 << 18 : sub > ((size_t)1 << 22) ? (size_t)1 << 22 : sub;
  if (asked > 0) sub = asked;
  sub = (sub + 1023) / 1024 * 1024;
  if (sub < 1024) sub = 1024;
  return sub;
}

/* zero.c's buffers (zero_start, zero_set_reader) and dp_zero.c's gather for a
 * checkpoint or validation on rank 0 (ct_dp_gather_full). */
static void zero_buffers(const ct_memplan_opts *o, ct_memplan *p, size_t shard, size_t range) {
  const size_t n = o->numel, e = o->bf16 ? 2 : 4, ms = o->maxseg;
  const int own = o->stage >= 3 || o->bf16;
  double z = 0;
  if (o->stage >= 2 || o->bf16) {
    size_t bucket = o->bucket ? o->bucket : (size_t)o->hidden * (size_t)o->hidden;
    if (o->stage >= 2) z += 2.0 * (double)(bucket > ms ? bucket : ms) * (double)e;
    if (o->stage >= 3) z += 2.0 * (double)ms * (double)e;
    if (o->bf16) z += 2.0 * (double)ms * 4.0 + 4.0 * (double)(o->stage >= 1 ? range : n);
    if (o->offload_param) z += 2.0 * (double)(ms < shard ? ms : shard) * 4.0;
  }
  p->zero_buffers = z;
  if (own && range < n) p->gather_rank0 = 4.0 * (double)n * (o->ema ? 2 : 1);
  if (o->offload_param) p->gather_rank0 += 4.0 * (double)range;
}

/* model_type lora's frozen base (task_mmdit.c, zero.c): whole on every rank,
 * or at stage 3 this rank's byte range (zero_frozen_range) plus two slots of
 * its largest segment, gathered whole to rank 0 for validation. */
static void frozen_base(const ct_memplan_opts *o, ct_memplan *p) {
  const size_t b = o->frozen_bytes;
  const int sharded = o->stage >= 3;
  size_t shard, lo, hi;
  zero_frozen_range(b, o->ranks, 0, &shard, &lo, &hi);
  p->base = (double)(sharded ? shard : b);
  p->params += p->base;
  p->startup_params += p->base;
  p->formula_base = 4.0 * (double)o->frozen_psi / (sharded ? o->ranks : 1);
  p->formula_params += p->formula_base;
  if (sharded) p->zero_buffers += 2.0 * (double)o->frozen_maxseg;
  if (sharded && shard < b) p->gather_base_rank0 = 4.0 * (double)((b + 3) / 4);
  if (!sharded || !o->offload_param) return;
  /* offload_param (update.c): the shard into a swap file of its own, opened
   * after the optimizer state left memory; two pieces for the gathers */
  const size_t ms = o->frozen_maxseg < shard ? o->frozen_maxseg : shard;
  p->zero_buffers += 2.0 * (double)(ms + 8);
  p->swap += p->base;
  p->params -= p->base;
  const double fb = 3.0 * ((double)p->offload_sub * 4.0 + 4096.0); /* NBUF, ALIGN */
  p->optimizer += fb;
  p->offload_buffers += fb;
  if (p->optimizer > p->startup_optimizer) p->startup_optimizer = p->optimizer;
}

ct_status ct_memplan_trainable(const ct_memplan_opts *o, ct_memplan *p, ct_err *err) {
  memset(p, 0, sizeof *p);
  if (o->ranks < 1 || o->stage < 0 || o->stage > 3 || o->numel == 0)
    return ct_errf(err, CT_ERR_INVALID, "memory plan: ranks %d, stage %d, %zu floats", o->ranks,
                   o->stage, o->numel);
  if (o->offload_param && (o->stage != 3 || o->bf16))
    return ct_errf(err, CT_ERR_INVALID,
                   "offload_param nvme needs zero_stage 3 with float32 storage (as ctuner train)");
  const size_t n = o->numel, N = (size_t)o->ranks;
  const size_t shard = ct_comm_shard_len(n, o->ranks);
  /* rank 0 holds the largest range: [0, min(shard, n)) when sharded */
  const size_t range = o->stage >= 1 ? (shard < n ? shard : n) : n;
  const int own = o->stage >= 3 || o->bf16;
  double w = 0, g = 0, opt = 0;
  if (o->bf16) {
    w = 2.0 * (double)(o->stage >= 3 ? shard : n);
    g = 2.0 * (double)(o->stage >= 2 ? shard : n);
    opt = 4.0 * (double)range; /* float32 master weights */
  } else {
    w = 4.0 * (double)(own ? range : n);
    g = 4.0 * (double)(o->stage >= 2 ? shard : n);
  }
  const double state = 4.0 * (double)o->nstate * (double)round16(range);
  p->range = range;
  p->shard = shard;
  if (o->ema) opt += 4.0 * (double)(own ? range : n);
  opt += state;
  /* update.c: the swap file is opened (its three buffers allocated) while the
   * state and the float32 shard are still in memory; then they are written to
   * it and freed. The start-up peaks hold both. */
  const int offst = o->offload_optimizer && o->nstate > 0;
  const size_t narr = (offst ? (size_t)o->nstate : 0) + (size_t) !!o->offload_param;
  if (narr) {
    const size_t sub = offload_sub(range, o->offload_buffer);
    p->offload_sub = sub;
    p->offload_buffers = 3.0 * ((double)narr * (double)sub * 4.0 + 4096.0); /* NBUF, ALIGN */
    opt += p->offload_buffers;
  }
  p->startup_params = w;
  p->startup_optimizer = opt;
  if (offst) {
    p->swap += state;
    opt -= state;
  }
  if (o->offload_param) {
    p->swap += w; /* the float32 shard leaves memory */
    w = 0;
  }
  p->params = w;
  p->grads = g;
  p->optimizer = opt;
  zero_buffers(o, p, shard, range);
  /* the ZeRO paper's formula over Ψ (no alignment), as `bench memory` prints it */
  const double psi = (double)o->psi;
  double fp = (o->bf16 ? 2 : 4) * psi, fg = (o->bf16 ? 2 : 4) * psi,
         fo = (o->bf16 ? 4 + 4.0 * o->nstate : 4.0 * o->nstate) * psi;
  if (o->stage >= 1) fo /= (double)N;
  if (o->stage >= 2) fg /= (double)N;
  if (o->stage >= 3) fp /= (double)N;
  p->formula_params = fp;
  p->formula_grads = fg;
  p->formula_optimizer = fo;
  if (o->frozen_bytes) frozen_base(o, p);
  return CT_OK;
}

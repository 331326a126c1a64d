/* ZeRO stages 2 and 3, and bf16 storage at any stage (docs/distributed.md):
 * the model's segment hooks (zero.c) reduce-scatter gradient buckets during
 * the backward (stages 2-3), gather each segment's parameters before it runs
 * (stage 3), and keep bf16 parameters and gradients with float32 master
 * weights of this rank's range (bf16). When the trainer holds only a range
 * of the weights (stage 3, bf16: `own`), ct_dp_gather_full assembles the
 * whole float32 model on rank 0 for validation and checkpoints. */
#include <math.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/kernels.h"
#include "ctuner/log.h"
#include "trainer_int.h"

static ct_status start(trainer *tr, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  size_t bucket = (size_t)cfg->reduce_bucket_size;
  if (!bucket) bucket = (size_t)tr->g.mc.hidden * (size_t)tr->g.mc.hidden;
  ct_status st = zero_init(&tr->z, tr->comm, tr->model, tr->stage, tr->bf16, bucket,
                           tr->own ? tr->wsh : NULL, ct_trainer_be(tr), err);
  if (!st && tr->fsh) st = zero_set_frozen(&tr->z, tr->fsh, err); /* LoRA's base at stage 3 */
  if (st) return st;
  const size_t nw = ct_model_numel(tr->model);
  if (tr->rank == 0 && tr->fsh)
    CT_INFO(
        "ZeRO-3: the frozen base sharded by bytes: %zu of %zu bytes per rank, each block gathered "
        "before it runs (the next one prefetched) into 2 slots of %zu bytes",
        tr->z.fz.shard, tr->z.fz.bytes, tr->z.fz.maxseg);
  if (tr->rank == 0 && tr->stage >= 2)
    CT_INFO(
        "ZeRO-%d: %zu of %zu parameters per rank; gradients reduced in buckets of %zu elements "
        "during the "
        "backward%s",
        tr->stage, tr->hi - tr->lo, nw, tr->z.cap,
        tr->stage >= 3
            ? "; each block's parameters gathered before it runs, the next one prefetched"
            : "");
  if (tr->rank == 0 && tr->bf16)
    CT_INFO(
        "mixed_precision bf16: bf16 parameters, gradients and communication; float32 master "
        "weights and "
        "optimizer state for %zu parameters per rank; the linear layers' products with bf16 "
        "operands and float32 sums (%s), everything else float32",
        tr->hi - tr->lo, ct_sgemm_bf16_path());
  return CT_OK;
}

static void begin_step(trainer *tr) {
  zero_begin_step(&tr->z);
}

static ct_status reduce(trainer *tr, long opt_step, double *parts, int np, float **g, double *gn,
                        ct_err *err) {
  ct_status st = CT_OK;
  double red[CT_TASK_PARTS + 1];
  memcpy(red, parts, (size_t)np * sizeof *red);
  if (tr->bf16) { /* bf16 gradients reduced (zero.c), this rank's range in float32 */
    st = zero_bf16_grads(&tr->z, g, err);
    if (st) return st;
    /* stage 0: every rank holds the whole (identical) gradient */
    red[np] = tr->stage == 0 && tr->rank > 0 ? 0 : ct_trainer_be(tr)->sumsq(tr->hi - tr->lo, *g);
  } else { /* reduced during the backward, bucket by bucket (zero.c) */
    red[np] = ct_trainer_be(tr)->sumsq(tr->hi - tr->lo, tr->z.gsh);
    *g = tr->z.gsh;
  }
  st = ct_comm_allreduce_f64(tr->comm, red, (size_t)np + 1, err);
  if (st) return st;
  memcpy(parts, red, (size_t)np * sizeof *red);
  *gn = sqrt(red[np]);
  return CT_OK;
}

static ct_status step(trainer *tr, float *g, float lr, long opt_step, const float *ema_dcy,
                      ct_err *err) {
  float *w = ct_model_params(tr->model);
  ct_status st = ct_update_step(tr, tr->own ? tr->wsh : w + tr->lo, g, lr, opt_step, ema_dcy, err);
  if (!st && tr->zero && !tr->own &&
      tr->world > 1) /* stage 2: every rank gets every updated shard */
    st = ct_comm_allgather_f32(tr->comm, w + tr->lo, w, tr->shard, ct_model_numel(tr->model), err);
  if (!st && tr->own)
    st = zero_params_changed(&tr->z, err); /* bf16 rounding and sharing; stale slots */
  return st;
}

static void report(const trainer *tr) {
  if (tr->z.comm && tr->z.fz.on)
    CT_INFO(
        "ZeRO-%d: %ld bucket reductions, %ld parameter gathers not prefetched, %ld frozen-weight "
        "gathers not prefetched, %.3f s waiting for communication",
        tr->stage, tr->z.buckets, tr->z.misses, tr->z.fz.misses, tr->z.wait_s);
  else if (tr->z.comm)
    CT_INFO(
        "ZeRO-%d: %ld bucket reductions, %ld parameter gathers not prefetched, %.3f s waiting for "
        "communication",
        tr->stage, tr->z.buckets, tr->z.misses, tr->z.wait_s);
}

const ct_dp_ops ct_dp_zero = {"ZeRO-2/3, bf16", start, begin_step, reduce, step, report};

/* The frozen storage (LoRA's base at stage 3) whole on rank 0: gathered, or
 * this rank's own when one rank holds all of it. */
static ct_status gather_frozen(trainer *tr, full_view *fv, ct_err *err) {
  const zero_frozen *f = &tr->z.fz;
  ct_status st = zero_frozen_idle(&tr->z, err);
  if (st) return st;
  const void *mine = f->mine;
  if (tr->foff) { /* offload_param: this rank's bytes from the swap file */
    fv->base_mine = ct_alloc(CT_MEM_BUFFERS, f->shard ? f->shard : 4);
    float *arr[1] = {fv->base_mine};
    st = fv->base_mine ? ct_offload_load_all(tr->foff, arr, err)
                       : ct_errf(err, CT_ERR_NOMEM, "out of memory reading the frozen base back");
    if (st) return st; /* the CLI aborts the job: nobody waits in a gather */
    mine = fv->base_mine;
  }
  if (f->hi - f->lo == f->bytes) {
    fv->base = tr->rank == 0 ? (void *)mine : NULL;
    return CT_OK;
  }
  const size_t nf = (f->bytes + 3) / 4; /* whole floats: the shards are 64-byte aligned */
  if (tr->rank == 0) {
    fv->base = ct_alloc(CT_MEM_BUFFERS, nf * sizeof(float));
    fv->base_owned = 1;
    if (!fv->base) st = ct_errf(err, CT_ERR_NOMEM, "out of memory gathering the frozen base");
  }
  ct_status s2 = ct_comm_gather_f32(tr->comm, mine, fv->base, f->shard / 4, nf, 0, err);
  return st ? st : s2;
}

ct_status ct_dp_gather_full(trainer *tr, full_view *fv, int frozen, ct_err *err) {
  memset(fv, 0, sizeof *fv);
  if (!tr->own) return CT_OK;
  const size_t nw = ct_model_numel(tr->model);
  const int lead = tr->rank == 0;
  ct_status st = CT_OK;
  const float *wsrc = tr->wsh;
  if (tr->widx >= 0) { /* offload_param: this rank's weights from the swap file */
    fv->mine = ct_alloc(CT_MEM_BUFFERS, (tr->hi - tr->lo ? tr->hi - tr->lo : 1) * sizeof(float));
    float *arr[8] = {0};
    arr[tr->widx] = fv->mine;
    st = fv->mine ? ct_offload_load_all(tr->off, arr, err)
                  : ct_errf(err, CT_ERR_NOMEM, "out of memory reading the offloaded weights back");
    if (st) return st; /* the CLI aborts the job: nobody waits in a gather */
    wsrc = fv->mine;
  }
  if (tr->hi - tr->lo == nw) { /* one rank at stage 3, or bf16 stage 0: every rank holds all */
    fv->w = lead ? (float *)wsrc : NULL;
    fv->e = lead ? tr->ema : NULL;
  } else {
    fv->owned = 1;
    if (lead) {
      fv->w = ct_alloc(CT_MEM_BUFFERS, nw * sizeof(float));
      fv->e = tr->ema ? ct_alloc(CT_MEM_BUFFERS, nw * sizeof(float)) : NULL;
      if (!fv->w || (tr->ema && !fv->e))
        st = ct_errf(err, CT_ERR_NOMEM, "out of memory gathering the weights");
    }
    /* every rank takes part even if rank 0 failed: the CLI then aborts the job */
    ct_status s2 = ct_comm_gather_f32(tr->comm, wsrc, fv->w, tr->shard, nw, 0, err);
    if (!st) st = s2;
    if (tr->ema) {
      s2 = ct_comm_gather_f32(tr->comm, tr->ema, fv->e, tr->shard, nw, 0, err);
      if (!st) st = s2;
    }
  }
  if (frozen && tr->z.fz.on) {
    ct_status s2 = gather_frozen(tr, fv, err);
    if (!st) st = s2;
  }
  if (!st && lead) {
    zero_hooks(&tr->z, 0);
    tr->model->ops->use_params(tr->model, fv->w);
    if (fv->base) tr->model->ops->use_frozen(tr->model, fv->base);
  }
  return st;
}

void ct_dp_release_full(trainer *tr, full_view *fv) {
  if (!tr->own) return;
  if (tr->rank == 0 && fv->w) {
    tr->model->ops->use_params(tr->model, NULL);
    if (fv->base) tr->model->ops->use_frozen(tr->model, NULL);
    zero_hooks(&tr->z, 1);
  }
  if (fv->base_owned) ct_free(fv->base);
  ct_free(fv->base_mine);
  if (fv->owned) {
    ct_free(fv->w);
    ct_free(fv->e);
  }
  ct_free(fv->mine);
  memset(fv, 0, sizeof *fv);
}

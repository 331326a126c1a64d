/* ZeRO-1 in float32: every rank holds the whole model and gradient but only
 * its shard [lo, hi) of the optimizer state. The gradient is reduce-scattered
 * in place (this rank's slot receives its reduced shard), the shard is
 * stepped, and the updated shards are all-gathered into every rank's weights. */
#include <math.h>
#include <string.h>

#include "ctuner/log.h"
#include "trainer_int.h"

static ct_status start(trainer *tr, ct_err *err) {
  return CT_OK;
}

static ct_status reduce(trainer *tr, long opt_step, double *parts, int np, float **g, double *gn,
                        ct_err *err) {
  float *gr = ct_model_grads(tr->model);
  const size_t nw = ct_model_numel(tr->model);
  double red[CT_TASK_PARTS + 1];
  memcpy(red, parts, (size_t)np * sizeof *red);
  ct_status st = ct_comm_reduce_scatter_f32(tr->comm, gr, nw, gr + tr->lo, tr->shard, err);
  red[np] = ct_train_sumsq(gr + tr->lo, tr->hi - tr->lo);
  if (!st) st = ct_comm_allreduce_f64(tr->comm, red, (size_t)np + 1, err);
  if (st) return st;
  memcpy(parts, red, (size_t)np * sizeof *red);
  *gn = sqrt(red[np]);
  *g = gr + tr->lo;
  return CT_OK;
}

static ct_status step(trainer *tr, float *g, float lr, long opt_step, const float *ema_dcy,
                      ct_err *err) {
  float *w = ct_model_params(tr->model);
  ct_status st = ct_update_step(tr, w + tr->lo, g, lr, opt_step, ema_dcy, err);
  if (!st && tr->world > 1) /* every rank gets every updated shard, in place */
    st = ct_comm_allgather_f32(tr->comm, w + tr->lo, w, tr->shard, ct_model_numel(tr->model), err);
  return st;
}

static void report(const trainer *tr) {}

const ct_dp_ops ct_dp_zero1 = {"ZeRO-1", start, ct_dp_clear_grads, reduce, step, report};

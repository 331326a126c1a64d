/* Plain data parallel (zero_stage 0, float32): every rank holds the whole
 * model, gradient and optimizer state; the gradient is all-reduced (rank-order
 * deterministic) and every rank takes the same step. One rank is the special
 * case world = 1 with no communication at all. */
#include <math.h>
#include <string.h>

#include "ctuner/log.h"
#include "trainer_int.h"

static ct_status start(trainer *tr, ct_err *err) {
  return CT_OK;
}

/* The whole float32 gradient zeroed on the compute backend (shared with ZeRO-1 and the 1-bit
 * family). */
void ct_dp_clear_grads(trainer *tr) {
  ct_trainer_be(tr)->zero(ct_model_numel(tr->model), ct_model_grads(tr->model));
}

/* Shared with the 1-bit family's full-precision steps. */
ct_status ct_dp_allreduce(trainer *tr, double *parts, int np, float **g, double *gn, ct_err *err) {
  float *gr = ct_model_grads(tr->model);
  const size_t nw = ct_model_numel(tr->model);
  if (tr->world > 1) {
    ct_status st = ct_comm_allreduce_f32(tr->comm, gr, nw, err);
    if (!st) st = ct_comm_allreduce_f64(tr->comm, parts, (size_t)np, err);
    if (st) return st;
  }
  *gn = sqrt(ct_trainer_be(tr)->sumsq(nw, gr)); /* ct_train_sumsq's chunks, on the backend */
  *g = gr;
  return CT_OK;
}

static ct_status reduce(trainer *tr, long opt_step, double *parts, int np, float **g, double *gn,
                        ct_err *err) {
  return ct_dp_allreduce(tr, parts, np, g, gn, err);
}

static ct_status step(trainer *tr, float *g, float lr, long opt_step, const float *ema_dcy,
                      ct_err *err) {
  return ct_update_step(tr, ct_model_params(tr->model), g, lr, opt_step, ema_dcy, err);
}

static void report(const trainer *tr) {}

const ct_dp_ops ct_dp_plain = {"data parallel", start, ct_dp_clear_grads, reduce, step, report};

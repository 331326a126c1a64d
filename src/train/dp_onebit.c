/* The 1-bit family (optimizer onebitadam, zerooneadam, onebitlamb; onebit.c):
 * data parallel over float32 where the optimizer communicates itself. During
 * the warm-up (and 0/1 Adam's variance steps) the gradient is all-reduced as
 * in plain data parallel; afterwards each rank steps with its own mean
 * gradient and onebit.c exchanges the 1-bit compressed momentum. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/log.h"
#include "trainer_int.h"

ct_status ct_dp_allreduce(trainer *tr, double *parts, int np, float **g, double *gn,
                          ct_err *err); /* dp_plain.c */

static void announce(const trainer *tr, int zo, int lb, long opt_steps) {
  const ct_config *cfg = tr->cfg;
  if (lb)
    CT_INFO(
        "OneBitLamb: Lamb warm-up for %ld steps (trust ratios averaged), then 1-bit compressed "
        "momentum with "
        "the frozen trust ratios scaled by the re-estimated variance",
        cfg->freeze_step);
  if (!zo && !lb)
    CT_INFO(
        "OneBitAdam: full-precision warm-up for %ld steps, then 1-bit compressed momentum (error "
        "feedback starts at zero%s)",
        cfg->freeze_step, opt_steps ? "; a resume resets it, as DeepSpeed" : "");
  if (zo)
    CT_INFO(
        "ZeroOneAdam: variance updated at doubling intervals (x2 every %ld updates) until step "
        "%ld, 1-bit "
        "gradients between; then local steps, synchronised every 1, 2, ... %ld steps (x2 every "
        "%ld)%s",
        cfg->var_update_scaler, cfg->var_freeze_step, cfg->local_step_clipper,
        cfg->local_step_scaler, opt_steps ? "; a resume restarts the schedules, as DeepSpeed" : "");
}

/* Loaded and resumed: the moments are tr->opt's Adam state. */
static ct_status start(trainer *tr, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  if (!tr->opt) return CT_OK;
  const size_t np = tr->model->ntab;
  const ct_model_param *tab = tr->model->tab;
  size_t *offs = malloc((np + 1) * sizeof *offs), *lens = malloc((np + 1) * sizeof *lens);
  ct_status st = offs && lens ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; !st && i < np; i++) offs[i] = tab[i].offset, lens[i] = tab[i].numel;
  if (!st)
    st = ct_onebit_new(tr->comm, ct_model_numel(tr->model), offs, lens, np,
                       ct_optim_state(tr->opt, 0, NULL), ct_optim_state(tr->opt, 1, NULL),
                       (float)cfg->adam_beta1, (float)cfg->adam_beta2, (float)cfg->adam_epsilon,
                       (float)cfg->adam_weight_decay, cfg->freeze_step, &tr->ob, err);
  free(offs);
  free(lens);
  const ct_optim_onebit kind = ct_optim_onebit_of(cfg->optimizer);
  const int zo = kind == CT_OPTIM_ONEBIT_ZEROONE_ADAM, lb = kind == CT_OPTIM_ONEBIT_LAMB;
  if (!st && zo) {
    ct_zeroone_hp zh = {cfg->var_freeze_step, cfg->var_update_scaler, cfg->local_step_scaler,
                        cfg->local_step_clipper};
    st = ct_onebit_zeroone(tr->ob, &zh, err);
  }
  if (!st && lb) {
    ct_onebit_lamb_hp lh = {(float)cfg->lamb_max_coeff,  (float)cfg->lamb_min_coeff,
                            (float)cfg->lamb_coeff_beta, (float)cfg->lamb_factor_max,
                            (float)cfg->lamb_factor_min, (float)cfg->lamb_factor_threshold};
    st = ct_onebit_lamb(tr->ob, &lh, err);
    if (!st && tr->opt_steps0 >= cfg->freeze_step) {
      /* the frozen trust ratios are not checkpointed: warm up again from the loaded moments */
      ct_onebit_set_freeze(tr->ob, tr->opt_steps0 + cfg->freeze_step);
      if (tr->rank == 0)
        CT_WARN(
            "OneBitLamb resumed at step %ld, past freeze_step %ld: its trust-ratio state is not in "
            "the "
            "checkpoint, so %ld more full-precision warm-up steps re-estimate it",
            tr->opt_steps0, cfg->freeze_step, cfg->freeze_step);
    }
  }
  if (!st && tr->rank == 0) announce(tr, zo, lb, tr->opt_steps0);
  return st;
}

static ct_status reduce(trainer *tr, long opt_step, double *parts, int np, float **g, double *gn,
                        ct_err *err) {
  if (!tr->ob || ct_onebit_full_gradient(tr->ob, opt_step))
    return ct_dp_allreduce(tr, parts, np, g, gn, err);
  /* 1-bit Adam after freeze_step, 0/1 Adam outside its variance steps: no
   * gradient all-reduce; each rank steps with its own mean gradient (world x
   * its share), the norm reported and clipped is the RMS over ranks */
  float *gr = ct_model_grads(tr->model);
  const size_t nw = ct_model_numel(tr->model);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < nw; i++) gr[i] *= (float)tr->world;
  double red[CT_TASK_PARTS + 1];
  memcpy(red, parts, (size_t)np * sizeof *red);
  red[np] = ct_train_sumsq(gr, nw);
  ct_status st = ct_comm_allreduce_f64(tr->comm, red, (size_t)np + 1, err);
  if (st) return st;
  memcpy(parts, red, (size_t)np * sizeof *red);
  *gn = sqrt(red[np] / tr->world);
  *g = gr;
  return CT_OK;
}

static ct_status step(trainer *tr, float *g, float lr, long opt_step, const float *ema_dcy,
                      ct_err *err) {
  return tr->ob ? ct_onebit_step(tr->ob, ct_model_params(tr->model), g, lr, opt_step, err) : CT_OK;
}

static void report(const trainer *tr) {
  if (!tr->ob) return;
  double sent, full, sa, fa;
  long ns, na;
  ct_onebit_bytes(tr->ob, &sent, &full, &ns);
  ct_onebit_bytes_all(tr->ob, &sa, &fa, &na);
  const char *nm = ct_optim_onebit_name(ct_optim_onebit_of(tr->cfg->optimizer));
  if (ns)
    CT_INFO(
        "%s: %ld compressed round(s): %.3f MB sent per rank instead of %.3f MB of float32 "
        "all-reduce (%.1fx less)",
        nm, ns, sent / 1e6, full / 1e6, sent > 0 ? full / sent : 0.0);
  if (na)
    CT_INFO(
        "%s: all %ld step(s): %.3f MB sent per rank for gradients and momentum instead of %.3f MB "
        "with a "
        "float32 all-reduce every step (%.1fx less)",
        nm, na, sa / 1e6, fa / 1e6, sa > 0 ? fa / sa : 0.0);
}

const ct_dp_ops ct_dp_onebit = {"1-bit", start, ct_dp_clear_grads, reduce, step, report};

/* The training loop (docs/training.md, docs/architecture.md). Per optimizer
 * step, as pseudocode:
 *
 *   lr = schedule(step)
 *   strategy.begin_step                     zero the gradient storage
 *   repeat gradient_accumulation_steps:
 *     task.micro_batch                      next batch, forward, loss, backward
 *   strategy.reduce                         global loss, this rank's gradient, norm
 *   breaker agreed by every rank            a fault anywhere stops all here
 *   if loss or norm not finite: skip        (max_nonfinite_steps in a row: stop)
 *   else: clip, strategy.step, EMA          the update and the weights' sharing
 *   metrics, status; validation and checkpoint at their intervals
 *   stop asked for (a signal)? agreed by every rank: checkpoint, stop
 *
 * The strategy (dp_*.c behind ct_dp_ops) hides every ZeRO, bf16, 1-bit and
 * offload difference; the task (task_mmdit.c) the objective; run_ckpt.c the
 * checkpoints and the resume; validation.c the grids. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctuner/alloc.h"
#include "ctuner/kernels.h"
#include "ctuner/log.h"
#include "ctuner/lora.h"
#include "trainer_int.h"

void ct_trainer_free(trainer *tr) {
  ct_health_close(tr->h); /* sends what is queued, within webhook_timeout */
  ct_onebit_free(tr->ob);
  ct_offload_close(tr->foff);
  if (tr->off) {
    ct_offload_close(tr->off);
    ct_err e = {0};
    ct_rm_rf(tr->swap_dir, &e);
    char *slash = strrchr(tr->swap_dir, '/');
    if (slash) *slash = 0, rmdir(tr->swap_dir); /* the run's directory, once empty */
  }
  zero_free(&tr->z);
  if (tr->task) tr->task->free(tr);
  ct_model_free(tr->model);
  const ct_backend_ops *cpu = ct_backend_default(); /* host (ct_alloc) until reside moved them */
  (tr->wsh_moved ? ct_trainer_be(tr) : cpu)->free(tr->wsh);
  ct_free(tr->fsh);
  ct_dataset_free(tr->ds);
  ct_optim_free(tr->opt);
  (tr->ema_moved ? ct_trainer_be(tr) : cpu)->free(tr->ema);
  if (tr->metrics) fclose(tr->metrics);
  ct_tboard_close(tr);
}

ct_status ct_trainer_shard(trainer *tr, ct_err *err) {
  const size_t nw = ct_model_numel(tr->model);
  tr->shard = ct_comm_shard_len(nw, tr->world);
  tr->lo = tr->zero ? (size_t)tr->rank * tr->shard : 0;
  if (tr->lo > nw) tr->lo = nw;
  tr->hi = tr->zero ? (tr->lo + tr->shard < nw ? tr->lo + tr->shard : nw) : nw;
  if (!tr->own) return CT_OK;
  if (!ct_model_has_segments(tr->model) || !tr->model->ops->init_range)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "the %s model has no segment hooks: zero_stage 3 and mixed_precision "
                   "bf16 need them",
                   tr->model->ops->family);
  /* bf16: master weights, counted with the optimizer state as in ZeRO's 12 bytes */
  tr->wsh = ct_calloc(tr->bf16 ? CT_MEM_OPTIMIZER : CT_MEM_PARAMS,
                      tr->hi - tr->lo ? tr->hi - tr->lo : 1, sizeof(float));
  if (!tr->wsh)
    return ct_errf(err, CT_ERR_NOMEM, "out of memory for the %zu float32 weights of this rank",
                   tr->hi - tr->lo);
  tr->model->ops->init_range(tr->model, (uint64_t)tr->cfg->seed, tr->lo, tr->hi, tr->wsh);
  return CT_OK;
}

ct_status ct_trainer_optim_table(trainer *tr, ct_optim **out, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  const ct_optim_info *oi = ct_optim_lookup(cfg->optimizer, err);
  if (!oi) return err ? err->status : CT_ERR_INVALID;
  ct_optim_hp hp;
  ct_train_optim_hp(cfg, oi->kind, &hp);
  const size_t np = tr->model->ntab;
  const ct_model_param *tab = tr->model->tab;
  ct_optim_tensor *ot = calloc(np + 1, sizeof *ot);
  if (!ot) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  size_t k = 0;
  ct_status st = CT_OK;
  for (size_t i = 0; i < np && !st; i++) {
    const ct_model_param *p = &tab[i];
    int cols = 0;
    if (p->ndim >= 2) {
      cols = 1;
      for (int d = 1; d < p->ndim; d++) cols *= (int)p->shape[d];
    }
    const size_t a = p->offset > tr->lo ? p->offset : tr->lo;
    const size_t b = p->offset + p->numel < tr->hi ? p->offset + p->numel : tr->hi;
    if (a >= b) continue;
    ct_optim_tensor x = {p->name, a - tr->lo, b - a, p->ndim >= 2 ? (int)p->shape[0] : 0,
                         cols,    1,          1};
    if ((a != p->offset || b != p->offset + p->numel) && !ct_optim_can_cut(oi->kind, &x))
      st = ct_errf(err, CT_ERR_UNSUPPORTED,
                   "optimizer '%s' updates whole tensors, and the ZeRO shard boundary cuts '%s'; "
                   "use zero_stage 0 with this optimizer",
                   cfg->optimizer, p->name);
    ot[k++] = x;
  }
  if (!st) st = ct_optim_new(oi->kind, &hp, ot, k, tr->hi - tr->lo, out, err);
  free(ot);
  return st;
}

/* The model (the task makes it and this rank's range [lo, hi) of it), the
 * optimizer over the range, the schedule and the EMA. */
static ct_status setup_model(trainer *tr, ct_train_summary *sum, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  tr->zero = cfg->zero_stage >= 1;
  tr->stage = (int)cfg->zero_stage;
  tr->bf16 = !strcmp(cfg->mixed_precision, "bf16");
  tr->own = tr->stage >= 3 || tr->bf16;
  ct_status st = tr->task->new_model(tr, err);
  if (st) return st;
  const size_t nw = ct_model_numel(tr->model);
  for (size_t i = 0; i < tr->model->ntab; i++) sum->params += tr->model->tab[i].numel;
  if (tr->hi > tr->lo) st = tr->task->build_optim(tr, &tr->opt, err);
  if (!st && tr->zero && tr->hi <= tr->lo)
    st = ct_errf(err, CT_ERR_INVALID,
                 "the model's %zu parameters are too few to shard over %d ranks", nw, tr->world);
  if (!st) st = ct_train_build_sched(cfg, tr->total, &tr->sched, err);
  if (st || !cfg->use_ema) return st;
  const size_t ne = tr->own ? tr->hi - tr->lo : nw; /* own: this rank's range of it */
  tr->ema = ct_calloc(CT_MEM_OPTIMIZER, ne ? ne : 1, sizeof(float));
  if (!tr->ema) return ct_errf(err, CT_ERR_NOMEM, "out of memory for the EMA weights");
  memcpy(tr->ema, tr->own ? tr->wsh : ct_model_params(tr->model), ne * sizeof(float));
  return CT_OK;
}

/* The circuit breaker, agreed by every rank: a fault anywhere stops every
 * rank here, before this step changes the weights, without a checkpoint. */
static ct_status breaker_gate(trainer *tr, long step, ct_train_summary *sum, ct_err *err) {
  if (!tr->h) return CT_OK;
  double open = ct_health_is_open(tr->h);
  ct_status st = tr->world > 1 ? ct_comm_allreduce_f64(tr->comm, &open, 1, err) : CT_OK;
  if (st || open <= 0) return st;
  sum->joint_stop = 1;
  return ct_health_is_open(tr->h)
             ? ct_errf(err, CT_ERR_HEALTH,
                       "circuit breaker open before step %ld: %s; stopped without a checkpoint "
                       "(the newest one, if any, resumes)",
                       step, ct_health_reason(tr->h))
             : ct_errf(err, CT_ERR_HEALTH,
                       "circuit breaker open on %.0f other rank(s) before step %ld; stopped "
                       "without a checkpoint (the newest one, if any, resumes)",
                       open, step);
}

/* A step whose loss or gradient norm is not finite changes nothing; too many
 * in a row stop every rank (the loss is reduced, so all see it at once). */
static ct_status skip_nonfinite(trainer *tr, ct_train_state *s, ct_step_info *info,
                                ct_train_summary *sum, ct_err *err) {
  s->nonfinite_run++;
  s->nonfinite_total++;
  info->skipped = 1;
  CT_WARN("step %ld: %s is not finite; step skipped (%ld in a row, %ld in all)", info->step,
          isfinite(info->loss) ? "the gradient norm" : "the loss", s->nonfinite_run,
          s->nonfinite_total);
  if (s->nonfinite_run < tr->cfg->max_nonfinite_steps) return CT_OK;
  ct_status st =
      ct_errf(err, CT_ERR_HEALTH,
              "stopping: %ld consecutive steps had NaN/Inf loss or gradients (max_nonfinite_steps "
              "= %ld); the newest checkpoint predates the trouble; lower learning_rate or set "
              "max_grad_norm",
              s->nonfinite_run, tr->cfg->max_nonfinite_steps);
  ct_health_runtime_fault(tr->h, "nonfinite_loss", "FloatingPointError", err ? err->msg : "",
                          tr->rank == 0);
  sum->joint_stop = 1;
  return st;
}

/* grad_clip_method norm: the whole gradient scaled to the global L2 norm
 * max_grad_norm (torch's clip_grad_norm_, eps 1e-6); value: each element of
 * this rank's range clamped to [-max, max] (clip_grad_value_), so every
 * strategy clips its own range alike. On the compute backend: clamp_fwd in
 * place over rows of 2^20 floats, scale_inplace. */
static void clip(const ct_backend_ops *be, float *g, size_t n, double gn, double max_norm,
                 int by_value) {
  if (!(max_norm > 0)) return;
  if (by_value) {
    const float c = (float)max_norm;
    const size_t cols = (size_t)1 << 20, rows = n / cols, rest = n - rows * cols;
    for (size_t r0 = 0; r0 < rows; r0 += (size_t)1 << 10) { /* rows x cols < 2^31 per call */
      const size_t nr = rows - r0 < ((size_t)1 << 10) ? rows - r0 : ((size_t)1 << 10);
      float *p = g + r0 * cols;
      be->clamp_fwd((int)nr, (int)cols, p, (int)cols, -c, c, p, (int)cols);
    }
    if (rest)
      be->clamp_fwd(1, (int)rest, g + rows * cols, (int)rest, -c, c, g + rows * cols, (int)rest);
    return;
  }
  if (gn > max_norm) be->scale_inplace(n, g, (float)(max_norm / (gn + 1e-6)));
}

/* EMA of this rank's weights (all of them unless the trainer holds a range);
 * with the weights in the swap file the update did it as they passed. */
static void ema_update(trainer *tr, float dcy) {
  if (tr->widx >= 0) return;
  const float *src = tr->own ? tr->wsh : ct_model_params(tr->model);
  ct_trainer_be(tr)->ema_update(tr->own ? tr->hi - tr->lo : ct_model_numel(tr->model), tr->ema, src,
                                dcy);
}

static void log_step(trainer *tr, const ct_step_info *info, long epoch, const double *parts) {
  char extra[256], line[1024];
  tr->task->metrics(tr, parts, extra, sizeof extra);
  snprintf(line, sizeof line,
           "{\"step\": %ld, \"epoch\": %ld, \"loss\": %.9g, %s\"lr\": %.9g, \"grad_norm\": %.9g, "
           "\"seconds\": %.4f, \"samples_per_s\": %.3f, \"data_wait_s\": %.4f, \"skipped\": %s}\n",
           info->step, epoch + 1, info->loss, extra, info->lr, info->grad_norm, info->seconds,
           info->samples_per_s, tr->data_wait - tr->wait_logged, info->skipped ? "true" : "false");
  tr->wait_logged = tr->data_wait;
  ct_trainer_log_metrics(tr, info->step, line); /* and to TensorBoard */
}

static void event(ct_step_cb cb, void *user, const ct_step_info *info, const char *what) {
  if (!cb) return;
  ct_step_info e = *info;
  e.event = what;
  cb(&e, user);
}

/* Validation on the full model (rank 0; every rank helps gather it). */
static ct_status validation_due(trainer *tr, const ct_step_info *info, ct_step_cb cb, void *user,
                                ct_err *err) {
  int nimg = 0;
  full_view fv;
  float *ema_mine = tr->ema;
  ct_status st = ct_dp_gather_full(tr, &fv, 1, err); /* own: the full model on rank 0 */
  char where[4300], ev[4400];
  if (!st && tr->rank == 0) {
    if (tr->own) tr->ema = fv.e;
    st = tr->task->validate(tr, info->step, &nimg, where, sizeof where, ev, sizeof ev, err);
    tr->ema = ema_mine;
  }
  ct_dp_release_full(tr, &fv);
  if (st || !nimg) return st;
  ct_tboard_validation(tr, info->step);
  ct_health_validation(tr->h, info->step, nimg, where);
  event(cb, user, info, ev);
  return CT_OK;
}

/* A checkpoint: every rank holds the same weights. ZeRO: the optimizer state
 * is gathered for rank 0 or written in fragments (docs/distributed.md). */
static ct_status checkpoint_due(trainer *tr, ct_ckpt_io *io, const ct_train_state *s,
                                const ct_step_info *info, ct_step_cb cb, void *user,
                                ct_train_summary *sum, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  ct_status st = ct_run_checkpoint_gate(tr, info->step, sum,
                                        err); /* free space, no fault since the step began */
  if (st) return st;
  ct_health_stage(tr->h, "checkpoint_save", "Saving checkpoint", "running", 0);
  full_view fv;
  host_stage hs = {0};
  float **ost = NULL;
  st = ct_dp_gather_full(tr, &fv, 0, err);
  if (tr->own) io->ema = fv.e;
  if (!st) st = ct_update_offload_states(tr, &ost, err);
  io->opt_states = ost;
  if (!st) st = ct_trainer_stage_out(tr, io, &hs, err); /* device memory: host copies to write */
  char *sj = ct_dataset_state_json(tr->ds);
  io->sampler_json = sj;
  if (!st)
    st = sj ? ct_run_save_checkpoint(tr, io, s, sum, err)
            : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  io->sampler_json = NULL;
  free(sj);
  ct_trainer_stage_release(tr, io, &hs);
  if (!st)
    st = ct_trainer_check(tr, "writing the checkpoint", err); /* its reads through copy_out */
  io->opt_states = NULL;
  ct_update_free_states(tr, ost);
  ct_dp_release_full(tr, &fv);
  io->ema = tr->own ? NULL : tr->ema;
  if (!st && tr->task->checkpoint_done)
    st = tr->task->checkpoint_done(tr, sum->last_checkpoint, info->step == tr->total, err);
  if (st) return st;
  if (tr->rank == 0 && tr->remote) { /* a failed upload warns; the end of the run tries once more */
    ct_err ue = {0};
    ct_status us = ct_remote_push_checkpoint(tr->remote, sum->last_checkpoint,
                                             cfg->checkpoints_total_limit, &ue);
    if (!us) us = ct_remote_push_outputs(tr->remote, cfg->output_dir, &ue);
    if (us) CT_WARN("%s (the local copy is intact; retried at the end of the run)", ue.msg);
    snprintf(tr->remote_pending, sizeof tr->remote_pending, "%s", us ? sum->last_checkpoint : "");
  }
  ct_health_stage(tr->h, "checkpoint_save", "Saving checkpoint", "completed", 100);
  ct_health_checkpoint(tr->h, sum->last_checkpoint, info->step, info->step == tr->total);
  if (tr->rank == 0) {
    char ev[4300];
    snprintf(ev, sizeof ev, "checkpoint: %s", sum->last_checkpoint);
    event(cb, user, info, ev);
  }
  return CT_OK;
}

/* A stop asked for from outside: the signal (0: none), and whether a loop
 * runs to take it. Written by a signal handler, read at step ends. */
static volatile sig_atomic_t stop_sig, loop_running;

int ct_train_request_stop(int sig) {
  if (!loop_running || stop_sig) return 0;
  stop_sig = sig ? sig : SIGTERM;
  return 1;
}

/* At a step's end: has any rank been asked to stop? Every rank agrees (one
 * small all-reduce), so all stop after the same step. */
static ct_status stop_agreed(trainer *tr, int *stop, ct_err *err) {
  double asked = stop_sig != 0;
  ct_status st = tr->world > 1 ? ct_comm_allreduce_f64(tr->comm, &asked, 1, err) : CT_OK;
  *stop = !st && asked > 0;
  return st;
}

/* The stop itself, after step info->step: its checkpoint (unless the step
 * just wrote one), then CT_ERR_STOPPED, which every rank reaches here. */
static ct_status stop_here(trainer *tr, ct_ckpt_io *io, const ct_train_state *s,
                           const ct_step_info *info, int saved, ct_step_cb cb, void *user,
                           ct_train_summary *sum, ct_err *err) {
  ct_status st = CT_OK;
  if (tr->rank == 0)
    CT_INFO("stop asked for (signal %d): step %ld is the last; writing its checkpoint",
            (int)stop_sig, info->step);
  if (!saved && s->nonfinite_run == 0) st = checkpoint_due(tr, io, s, info, cb, user, sum, err);
  if (st) return st;
  sum->joint_stop = 1;
  return ct_errf(err, CT_ERR_STOPPED, "stopped on request after step %ld of %ld%s%s", info->step,
                 tr->total, sum->last_checkpoint[0] ? "; resume from " : "", sum->last_checkpoint);
}

/* The steps, from the (resumed) state s to tr->total. */
static ct_status run_steps(trainer *tr, ct_ckpt_io *io, ct_train_state *s, ct_step_cb cb,
                           void *user, ct_train_summary *sum, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  const ct_dp_ops *dp = tr->dp;
  const ct_task_ops *task = tr->task;
  const int lead = tr->rank == 0, accum = (int)cfg->gradient_accumulation_steps;
  const size_t GB = (size_t)cfg->train_batch_size * (size_t)tr->world;
  const long first_step = s->global_step;
  ct_status st = CT_OK;
  double last_status = ct_now_s();
  ct_health_status(tr->h, "running", s->global_step, tr->total, -1, NAN);
  while (!st && s->global_step < tr->total) {
    ct_fault_step_delay(); /* a test hook, before the step's clock starts */
    const double t0 = ct_now_s();
    const long step = s->global_step + 1;
    ct_comm_set_step(tr->comm, step); /* for the watchdog's message */
    const double lr = ct_sched_lr(&tr->sched, s->global_step);
    dp->begin_step(tr);
    double parts[CT_TASK_PARTS] = {0};
    for (int a = 0; a < accum && !st; a++) {
      st = task->micro_batch(tr, s, accum, step, parts, err);
      if (!st) st = ct_trainer_check(tr, "a micro-batch", err); /* asynchronous device errors */
    }
    float *g = NULL; /* this rank's range of the reduced gradient */
    double gn = 0;
    if (!st) st = dp->reduce(tr, s->opt_steps + 1, parts, task->nparts, &g, &gn, err);
    if (!st) st = breaker_gate(tr, step, sum, err);
    if (st) break;
    const double loss = task->loss(tr, parts);
    ct_step_info info = {step, tr->total, s->epoch, loss, lr, gn, 0, 0, 0, NULL};
    if (!isfinite(loss) || !isfinite(gn)) {
      st = skip_nonfinite(tr, s, &info, sum, err);
      if (st) break;
    } else {
      s->nonfinite_run = 0;
      clip(ct_trainer_be(tr), g, tr->hi - tr->lo, gn, cfg->max_grad_norm,
           !strcmp(cfg->grad_clip_method, "value"));
      s->opt_steps++;
      const double dcy0 = (1.0 + s->opt_steps) / (10.0 + s->opt_steps);
      const float dcy = (float)(dcy0 < cfg->ema_decay ? dcy0 : cfg->ema_decay);
      const int ema_due = tr->ema && s->opt_steps % cfg->ema_update_interval == 0;
      st = dp->step(tr, g, (float)lr, s->opt_steps, ema_due ? &dcy : NULL, err);
      if (st) break;
      if (ema_due) ema_update(tr, dcy);
      st = ct_trainer_check(tr, "the optimizer step", err);
      if (st) break;
      s->last_loss = sum->last_loss = loss;
    }
    s->global_step = step;
    info.seconds = ct_now_s() - t0;
    sum->loop_seconds += info.seconds; /* steps only: not validation or checkpoints */
    info.samples_per_s = (double)GB * accum / (info.seconds > 0 ? info.seconds : 1e-9);
    if (lead) log_step(tr, &info, s->epoch, parts);
    if (cb && lead) cb(&info, user);
    const int last = s->global_step == tr->total;
    if (tr->h && lead && (last || ct_now_s() - last_status >= cfg->webhook_status_interval)) {
      const double per = sum->loop_seconds / (double)(step - first_step);
      ct_health_status(tr->h, "running", step, tr->total, per * (double)(tr->total - step), loss);
      last_status = ct_now_s();
    }
    if ((cfg->validation_step_interval && step % cfg->validation_step_interval == 0) || last)
      st = validation_due(tr, &info, cb, user, err);
    const int due =
        (cfg->checkpoint_step_interval && step % cfg->checkpoint_step_interval == 0) || last;
    if (!st && due &&
        s->nonfinite_run > 0) /* the newest checkpoint stays one from before the trouble */
      CT_WARN("step %ld: checkpoint skipped: the last %ld step(s) were not finite", step,
              s->nonfinite_run);
    else if (!st && due)
      st = checkpoint_due(tr, io, s, &info, cb, user, sum, err);
    int stop = 0;
    if (!st && !last) st = stop_agreed(tr, &stop, err);
    if (!st && stop) st = stop_here(tr, io, s, &info, due, cb, user, sum, err);
  }
  return st;
}

/* After the loop, whatever its outcome: the end-of-run checks every rank
 * agrees on, the last upload, and the events. */
static ct_status finish(trainer *tr, const ct_train_state *s, ct_status st, ct_train_summary *sum,
                        ct_err *err) {
  const ct_config *cfg = tr->cfg;
  const int lead = tr->rank == 0;
  if (lead && tr->dp) tr->dp->report(tr);
  if (tr->off && lead)
    CT_INFO("offload: %.1f MB moved, %.3f s waiting for reads (%s)",
            ct_offload_bytes(tr->off) / 1e6, ct_offload_wait_s(tr->off), ct_offload_mode(tr->off));
  if (st == CT_OK && tr->h) { /* a fault during the last step's validation or checkpoint */
    double open = ct_health_is_open(tr->h);
    if (tr->world > 1) st = ct_comm_allreduce_f64(tr->comm, &open, 1, err);
    if (!st && open > 0) {
      sum->joint_stop = 1;
      st = ct_errf(err, CT_ERR_HEALTH, "circuit breaker open at the end of training%s%s",
                   ct_health_is_open(tr->h) ? ": " : " (on another rank)", ct_health_reason(tr->h));
    }
  }
  /* A rank alone short of memory or cut off from the others is a runtime
   * fault too: the breaker opens and the CLI ends the job with its code. */
  if (tr->h && (st == CT_ERR_NOMEM || st == CT_ERR_COMM)) {
    ct_health_runtime_fault(tr->h, "runtime_error",
                            st == CT_ERR_NOMEM ? "MemoryError" : "CollectiveError",
                            err ? err->msg : "", 1);
    st = CT_ERR_HEALTH;
  }
  const int stopped = st == CT_ERR_STOPPED; /* asked for: its checkpoint goes up too */
  if ((st == CT_OK || stopped) && lead && tr->remote && tr->remote_pending[0]) {
    ct_err pe = {0}; /* after every collective */
    ct_status ps = ct_remote_push_checkpoint(tr->remote, tr->remote_pending,
                                             cfg->checkpoints_total_limit, &pe);
    if (!ps) ps = ct_remote_push_outputs(tr->remote, cfg->output_dir, &pe);
    if (ps) {
      st = ps;
      if (err) *err = pe;
      ct_err_prefix(err, "the last checkpoint is only local (%s): ", tr->remote_pending);
    }
  }
  if (st == CT_OK) {
    ct_health_stage(tr->h, "training_complete", "Training complete", "completed", 100);
  } else if (st == CT_ERR_STOPPED) { /* not a failure: no error event */
    ct_health_stage(tr->h, "training_stopped", "Training stopped on request", "completed",
                    100 * (double)s->global_step / (double)(tr->total ? tr->total : 1));
  } else if (tr->h) {
    ct_health_stage(tr->h, "training_abort", "Training stopped", "failed",
                    100 * (double)s->global_step / (double)(tr->total ? tr->total : 1));
    if (!sum->joint_stop || lead) { /* one error event for a stop every rank made */
      char title[96];
      snprintf(title, sizeof title, "Training failed: %s", ct_status_name(st));
      ct_health_error(tr->h, title, err ? err->msg : "");
    }
  }
  sum->end_step = s->global_step;
  sum->skipped_nonfinite = s->nonfinite_total;
  sum->data_wait_seconds = tr->data_wait;
  if (sum->loop_seconds > 0 && lead)
    CT_INFO("data: waited %.2f s for batches in %.2f s of training steps (%.1f%%)", tr->data_wait,
            sum->loop_seconds, 100.0 * tr->data_wait / sum->loop_seconds);
  return st;
}

/* Everything before the first step: data, model, optimizer, resume, strategy. */
static ct_status prepare(trainer *tr, ct_ckpt_io *io, ct_train_state *s, ct_train_summary *sum,
                         ct_err *err) {
  const ct_config *cfg = tr->cfg;
  ct_status st =
      ct_health_open(cfg, tr->comm, &tr->h, err); /* collective: GPUs are assigned to ranks */
  if (!st) st = ct_trainer_pick_backend(tr, err); /* compute_backend, and what it refuses */
  if (st) return st;
  ct_health_stage(tr->h, "init_data_backend", "Loading data backends and caches", "running", 0);
  st = ct_trainer_open_data(tr, err);
  if (st) return st;
  ct_health_stage(tr->h, "init_data_backend", "Loading data backends and caches", "completed", 100);
  ct_data_stats ds;
  ct_dataset_stats(tr->ds, &ds);
  sum->images = ds.kept;
  sum->images_skipped = ds.unreadable + ds.no_caption + ds.not_found + ds.duplicate +
                        ds.outside_dir + ds.metadata_missing + ds.unpaired;
  const int B = (int)cfg->train_batch_size, accum = (int)cfg->gradient_accumulation_steps;
  if (tr->rank == 0)
    CT_INFO(
        "effective batch %zu = train_batch_size %d x %d rank(s) x gradient_accumulation_steps %d "
        "(%d OpenMP thread(s) per rank)",
        (size_t)B * (size_t)tr->world * (size_t)accum, B, tr->world, accum, omp_get_max_threads());
  long per_epoch = ct_dataset_steps_per_epoch(tr->ds);
  if (per_epoch < 1) per_epoch = 1;
  tr->total = cfg->max_train_steps ? cfg->max_train_steps : per_epoch * cfg->num_train_epochs;
  sum->total_steps = tr->total;
  st = setup_model(tr, sum, err);
  if (st) return st;
  ct_config_digest(cfg, s->digest);
  ct_optim_kind kind;
  ct_err e2 = {0};
  snprintf(
      s->optimizer, sizeof s->optimizer, "%s",
      ct_optim_kind_parse(cfg->optimizer, &kind, &e2) ? cfg->optimizer : ct_optim_kind_name(kind));
  *io = (ct_ckpt_io){.model = tr->model,
                     .ema = tr->ema,
                     .ema_out = tr->ema,
                     .opt = tr->opt,
                     .extra = tr->task->extra,
                     .extra_user = tr,
                     .cfg = cfg,
                     .opt_offset = tr->lo,
                     .w_shard = tr->own ? tr->wsh : NULL,
                     .w_lo = tr->lo,
                     .w_hi = tr->hi};
  st = ct_run_resume(tr, io, s, err);
  if (st) return st;
  sum->start_step = s->global_step;
  tr->opt_steps0 = s->opt_steps;
  st = ct_trainer_reside(tr, err); /* loaded and resumed on the host: onto the backend */
  if (st) return st;
  io->ema = io->ema_out = tr->ema; /* moved: the checkpoints' (staged) sources */
  io->w_shard = tr->own ? tr->wsh : NULL;
  tr->dp = ct_dp_pick(cfg);
  st = tr->dp->start(tr, err); /* loaded and resumed: now shard, round to bf16, compress */
  const int nvme = (cfg->offload_optimizer && !strcmp(cfg->offload_optimizer, "nvme")) ||
                   (cfg->offload_param && !strcmp(cfg->offload_param, "nvme"));
  if (!st && tr->opt && nvme)
    st = ct_update_start_offload(tr, err); /* loaded, resumed, sharded: to the swap file */
  if (st) return st;
  if (tr->rank == 0 && !(tr->metrics = ct_train_open_metrics(cfg->output_dir, s->global_step)))
    return ct_errf(err, CT_ERR_IO, "%s/metrics.jsonl: cannot open: %s", cfg->output_dir,
                   strerror(errno));
  st = ct_tboard_open(tr, s->global_step, err);
  return st ? st : tr->task->alloc(tr, err);
}

ct_status ct_trainer_run(const ct_config *cfg, ct_remote *remote, ct_comm *comm, ct_step_cb cb,
                         void *user, ct_train_summary *sum, ct_err *err) {
  const double t_start = ct_now_s();
  memset(sum, 0, sizeof *sum);
  trainer tr = {.cfg = cfg, .remote = remote, .comm = comm, .widx = -1, .task = ct_task_pick(cfg)};
  tr.rank = ct_comm_rank(comm);
  tr.world = ct_comm_size(comm);
  ct_train_state s = {0};
  ct_ckpt_io io;
  ct_status st = prepare(&tr, &io, &s, sum, err);
  stop_sig = 0;
  loop_running = 1;
  if (!st) st = run_steps(&tr, &io, &s, cb, user, sum, err);
  loop_running = 0;
  st = finish(&tr, &s, st, sum, err);
  sum->seconds = ct_now_s() - t_start;
  ct_trainer_free(&tr);
  return st;
}

/* This rank's optimizer update: ct_optim_step on its range in memory, or —
 * offload_optimizer / offload_param nvme — the state (and the stage-3 float32
 * weights) in a swap file under offload_param_path/ctuner-swap-<hash of
 * output_dir>/rank-R (a stale one of an earlier run is removed first), stepped
 * sub-group by sub-group as offload.c streams them. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctuner/alloc.h"
#include "ctuner/hash.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/rng.h"
#include "ctuner/vae.h"
#include "trainer_int.h"

/* offload_optimizer nvme: the optimizer's state moves into a swap file under
 * offload_param_path/ctuner-swap-<hash of output_dir>/rank-R (a stale one of
 * an earlier run is removed first) and the optimizer steps it sub-group by
 * sub-group. */
static ct_status par_read(void *user, size_t a, size_t b, float *dst, ct_err *err) {
  trainer *tr = user;
  return ct_offload_read_range(tr->off, tr->widx, a, b, dst, err);
}

static ct_status frozen_read(void *user, size_t a, size_t b, float *dst, ct_err *err) {
  trainer *tr = user;
  return ct_offload_read_range(tr->foff, 0, a, b, dst, err);
}

/* offload_param with model_type lora: this rank's bytes of the frozen base
 * (zero.c) into a swap file of their own, beside the trainable weights', read
 * piece by piece before each segment's gather. */
static ct_status offload_frozen(trainer *tr, size_t sub, ct_err *err) {
  char dir[4400];
  if (ct_pathf(dir, sizeof dir, "%s/frozen", tr->swap_dir))
    return ct_errf(err, CT_ERR_RANGE, "offload_param_path is too long: %s",
                   tr->cfg->offload_param_path);
  const size_t n = tr->z.fz.shard / 4;
  ct_status st =
      ct_offload_open(dir, n ? n : 1, 1, sub, tr->cfg->offload_pin_memory, &tr->foff, err);
  float *arr[1] = {tr->fsh};
  if (!st) st = ct_offload_store_all(tr->foff, arr, err);
  if (!st) st = zero_set_frozen_reader(&tr->z, frozen_read, tr, err);
  if (st) return st;
  ct_free(tr->fsh);
  tr->fsh = NULL;
  if (tr->rank == 0)
    CT_INFO("offload nvme: the frozen base's %zu bytes per rank in %s", tr->z.fz.shard, dir);
  return CT_OK;
}

ct_status ct_update_start_offload(trainer *tr, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  ct_optim_kind kind = ct_optim_get_kind(tr->opt);
  const int want_opt = cfg->offload_optimizer && !strcmp(cfg->offload_optimizer, "nvme");
  const int par = cfg->offload_param && !strcmp(cfg->offload_param, "nvme");
  if (!(ct_optim_kind_info(kind)->flags & CT_OPTIM_CAN_OFFLOAD)) /* config refuses it first */
    return ct_errf(
        err, CT_ERR_UNSUPPORTED,
        "offload %s nvme: optimizer '%s' updates whole tensors and cannot step in pieces; use an "
        "elementwise optimizer (adamw, adam, adagrad, lion, sgd, mu*) or offload none",
        par ? "param" : "optimizer", ct_optim_kind_name(kind));
  const size_t nst = want_opt ? ct_optim_nstate(tr->opt) : 0;
  if (want_opt && !nst && tr->rank == 0)
    CT_INFO("offload_optimizer nvme: optimizer '%s' keeps no state here; nothing to offload",
            ct_optim_kind_name(kind));
  if (!nst && !par) return CT_OK;
  const uint64_t h = ct_hash_str(cfg->output_dir); /* one swap directory per run directory */
  if (ct_pathf(tr->swap_dir, sizeof tr->swap_dir, "%s/ctuner-swap-%016llx/rank-%d",
               cfg->offload_param_path, (unsigned long long)h, tr->rank))
    return ct_errf(err, CT_ERR_RANGE, "offload_param_path is too long: %s",
                   cfg->offload_param_path);
  ct_status st = ct_rm_rf(tr->swap_dir, err); /* a stale swap of an earlier run */
  if (st) return st;
  /* One swap file: the optimizer's state arrays (offload_optimizer), then the
   * float32 weights of this rank's range (offload_param, stage 3). */
  const size_t n = tr->hi - tr->lo, narr = nst + (size_t)par;
  /* auto: an eighth of the range (so reading, stepping and writing overlap),
   * between 256 Ki and 4 Mi floats per array */
  size_t sub = n / 8;
  sub = sub < ((size_t)1 << 18) ? (size_t)1 << 18 : sub > ((size_t)1 << 22) ? (size_t)1 << 22 : sub;
  if (cfg->offload_buffer_size > 0) sub = (size_t)cfg->offload_buffer_size;
  sub = (sub + 1023) / 1024 * 1024; /* whole 4 KiB pages per array (O_DIRECT) */
  st = ct_offload_open(tr->swap_dir, n, narr, sub, cfg->offload_pin_memory, &tr->off, err);
  if (st) return st;
  float *arr[8] = {0};
  CT_ASSERT(nst < 8); /* the swap file's arrays: the states and the weights */
  for (size_t i = 0; i < nst; i++) arr[i] = ct_optim_state(tr->opt, i, NULL);
  if (par) arr[nst] = tr->wsh;
  st = ct_offload_store_all(tr->off, arr, err);
  if (st) return st;
  tr->opt_off = nst > 0;
  if (tr->opt_off) ct_optim_release_state(tr->opt);
  if (par) { /* the gathers read this rank's pieces from the file from now on */
    tr->widx = (int)nst;
    st = zero_set_reader(&tr->z, par_read, tr, err);
    if (st) return st;
    ct_free(tr->wsh);
    tr->wsh = NULL;
  }
  if (tr->rank == 0)
    CT_INFO("offload nvme: %s%s%s of %zu floats per rank in %s (%s I/O, sub-groups of %zu)",
            nst ? "the optimizer state" : "", nst && par ? " and " : "",
            par ? "the float32 weights" : "", n, tr->swap_dir, ct_offload_mode(tr->off), sub);
  return par && tr->fsh ? offload_frozen(tr, sub, err) : CT_OK;
}

typedef struct off_step {
  trainer *tr;
  float *w; /* in memory, or NULL: in the file (offload_param) */
  const float *g;
  float lr;
  long step;
  float *ema; /* offload_param: the EMA is updated here (NULL: not this step) */
  float dcy;
} off_step;

static ct_status off_step_fn(void *user, size_t a, size_t len, float *const *states, ct_err *err) {
  off_step *s = user;
  trainer *tr = s->tr;
  float *w = tr->widx >= 0 ? states[tr->widx] : s->w + a;
  float *st[2] = {NULL, NULL};
  for (size_t i = 0; i < ct_optim_nstate(tr->opt) && i < 2; i++)
    st[i] = tr->opt_off ? states[i] : ct_optim_state(tr->opt, i, NULL) + a;
  ct_status rc = ct_optim_step_slice(tr->opt, a, len, w, s->g + a, st, s->lr, s->step, err);
  if (!rc && s->ema) {
    float *e = s->ema + a;
    const float d = s->dcy;
    for (size_t i = 0; i < len; i++) e[i] = d * e[i] + (1.0f - d) * w[i];
  }
  return rc;
}

/* The offloaded optimizer state in memory for a checkpoint (arrays of the range). */
ct_status ct_update_offload_states(trainer *tr, float ***out, ct_err *err) {
  *out = NULL;
  if (!tr->opt_off) return CT_OK;
  const size_t nst = ct_optim_nstate(tr->opt), n = ct_optim_numel(tr->opt);
  float **a = calloc(nst ? nst : 1, sizeof *a);
  if (!a) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  *out = a;
  for (size_t i = 0; i < nst; i++) {
    a[i] = ct_alloc(CT_MEM_BUFFERS, (n ? n : 1) * sizeof(float));
    if (!a[i])
      return ct_errf(err, CT_ERR_NOMEM, "out of memory reading the offloaded optimizer state back");
  }
  float *arr[8] = {0}; /* the weights' array (if any) is skipped */
  CT_ASSERT(nst < 8);
  for (size_t i = 0; i < nst; i++) arr[i] = a[i];
  return ct_offload_load_all(tr->off, arr, err);
}

void ct_update_free_states(trainer *tr, float **a) {
  if (!a) return;
  for (size_t i = 0; i < ct_optim_nstate(tr->opt); i++) ct_free(a[i]);
  free(a);
}

ct_status ct_update_step(trainer *tr, float *w, const float *g, float lr, long opt_step,
                         const float *ema_dcy, ct_err *err) {
  if (tr->off) { /* offload_param: the EMA follows each sub-group of weights as it passes */
    off_step os = {
        tr, w, g, lr, opt_step, tr->widx >= 0 && ema_dcy ? tr->ema : NULL, ema_dcy ? *ema_dcy : 0};
    return ct_offload_foreach(tr->off, off_step_fn, &os, err);
  }
  return tr->opt ? ct_optim_step(tr->opt, w, g, lr, opt_step, err) : CT_OK;
}

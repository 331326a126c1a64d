/* The parallel strategies (src/train/dp_*.c behind ct_dp_ops; NVMe offload
 * through update.c) on the tiny MMDiT, driven by hand without a dataset: the
 * trainer is built as the loop builds it (config defaults + preset tiny, the
 * MMDiT and the optimizer through the task, the strategy through ct_dp_pick),
 * and each optimizer step is begin_step, micro-batches of a fixed random
 * global batch (rank r takes samples [r*B, (r+1)*B) of each, the gradient
 * scaled by 1/world as the task does), reduce, clip, step — loop.c's order.
 *
 * On one process every strategy is compared with plain data parallel; under
 * mpirun (tests/cli_dist.sh runs this suite at 2 and 3 ranks) each strategy
 * at N ranks is compared with one rank taking the whole global batch, and the
 * ZeRO shard ranges must tile the model. What must be bit-identical and what
 * only close is written at each comparison. Under mpirun the suite owns MPI
 * (one MPI_Init per process): run it alone, `ct_tests strategy`. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctuner/comm.h"
#include "ctuner/config.h"
#include "ctuner/rng.h"
#include "harness.h"
#include "train/trainer_int.h"

enum { GB = 6, STEPS = 3, LH = 4, LW = 4 }; /* global micro-batch of 6: 1, 2 or 3 ranks */
#define SEED 7u
#define LR 1e-3f
#define MAX_NORM 0.93 /* the first two steps clip (norms ~0.95), the third not (~0.91) */
#define S_X0 0x7830000000000000ull
#define S_EPS 0x6570730000000000ull
#define S_T 0x7400000000000000ull
#define S_TXT 0x7478740000000000ull
#define S_Y 0x7900000000000000ull

/* ---- the communicator of the process (MPI under mpirun) ---- */
static ct_comm *world_c;
static void world_free(void) {
  ct_comm_free(world_c);
}
static ct_comm *world_comm(void) {
  static int tried;
  if (!tried) {
    tried = 1;
    ct_err e = {0};
    if (ct_comm_init(0, &world_c, &e))
      fprintf(stderr, "  communicator: %s\n", e.msg);
    else
      atexit(world_free);
  }
  return world_c;
}

/* ---- one configuration of the trainer ---- */
typedef struct variant {
  const char *name, *optimizer;
  int stage, bf16;
  const ct_dp_ops *dp; /* what ct_dp_pick must choose */
  int nvme; /* 1: offload_optimizer nvme; 2: and offload_param nvme (update.c, offload.c) */
} variant;

static const variant V_PLAIN = {"plain", "adamw", 0, 0, &ct_dp_plain, 0};
static const variant V_ZERO[] = {
    {"zero1", "adamw", 1, 0, &ct_dp_zero1, 0},
    {"zero2", "adamw", 2, 0, &ct_dp_zero, 0},
    {"zero3", "adamw", 3, 0, &ct_dp_zero, 0},
    {"zero1-nvme", "adamw", 1, 0, &ct_dp_zero1, 1},
    {"zero3-nvme-param", "adamw", 3, 0, &ct_dp_zero, 2},
};
static const variant V_BF16[] = {
    {"bf16", "adamw", 0, 1, &ct_dp_zero, 0},
    {"zero1-bf16", "adamw", 1, 1, &ct_dp_zero, 0},
    {"zero2-bf16", "adamw", 2, 1, &ct_dp_zero, 0},
    {"zero3-bf16", "adamw", 3, 1, &ct_dp_zero, 0},
};
static const variant V_ONEBIT = {"onebitadam", "onebitadam", 0, 0, &ct_dp_onebit, 0};

typedef struct fx {
  ct_config cfg;
  trainer tr;
  int accum; /* micro-batches per optimizer step */
  size_t nw, lat;
  float *x0, *eps, *xt, *v, *dv, *t, *txt, *y; /* this rank's micro-batch */
} fx;

/* What a run produced: every step's reduced loss and gradient norm, the
 * full reduced gradient (before clipping) of every step, and the full float32
 * weights after the last step. */
typedef struct result {
  double loss[STEPS], gn[STEPS];
  float *grad; /* STEPS x nw */
  float *w;    /* nw */
  size_t nw;
} result;

static void result_free(result *r) {
  free(r->grad);
  free(r->w);
  memset(r, 0, sizeof *r);
}

static void fx_close(fx *f) {
  ct_trainer_free(&f->tr); /* removes the swap files and their run directory */
  if (f->cfg.offload_param_path) rmdir(f->cfg.offload_param_path);
  ct_config_free(&f->cfg);
  float **b[] = {&f->x0, &f->eps, &f->xt, &f->v, &f->dv, &f->t, &f->txt, &f->y};
  for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) free(*b[i]), *b[i] = NULL;
}

/* The trainer of variant v on comm, as loop.c's setup_model and prepare make
 * it (minus data, schedule, EMA, metrics). The offload swap files go under
 * this process's temporary directory, in sub-groups of 4096 floats. */
static ct_status fx_open(fx *f, ct_comm *comm, const variant *v, int accum, long freeze_step,
                         ct_err *err) {
  memset(f, 0, sizeof *f);
  ct_config_defaults(&f->cfg);
  f->accum = accum;
  const int world = ct_comm_size(comm);
  char stage[8], bs[8], fz[24], ac[8], swap[300], out[300];
  snprintf(swap, sizeof swap, "%s/swap", ct_test_tmpdir());
  snprintf(out, sizeof out, "%s/out-%s", ct_test_tmpdir(), v->name);
  snprintf(ac, sizeof ac, "%d", accum);
  snprintf(stage, sizeof stage, "%d", v->stage);
  snprintf(bs, sizeof bs, "%d", GB / world);
  snprintf(fz, sizeof fz, "%ld", freeze_step);
  const char *kv[][2] = {{"preset", "tiny"},
                         {"seed", "7"},
                         {"learning_rate", "1e-3"},
                         {"max_grad_norm", "0.93"},
                         {"optimizer", v->optimizer},
                         {"zero_stage", stage},
                         {"mixed_precision", v->bf16 ? "bf16" : "no"},
                         {"train_batch_size", bs},
                         {"gradient_accumulation_steps", ac},
                         {"freeze_step", fz},
                         {"output_dir", out},
                         {"offload_param_path", swap},
                         {"offload_buffer_size", "4096"},
                         {"offload_optimizer", v->nvme ? "nvme" : "none"},
                         {"offload_param", v->nvme > 1 ? "nvme" : "none"}};
  ct_status st = CT_OK;
  for (size_t i = 0; !st && i < sizeof kv / sizeof kv[0]; i++)
    st = ct_config_set(&f->cfg, kv[i][0], kv[i][1], err);
  if (st) return st;
  trainer *tr = &f->tr;
  *tr = (trainer){.cfg = &f->cfg, .comm = comm, .widx = -1, .task = &ct_task_mmdit};
  tr->rank = ct_comm_rank(comm);
  tr->world = world;
  tr->zero = v->stage >= 1;
  tr->stage = v->stage;
  tr->bf16 = v->bf16;
  tr->own = tr->stage >= 3 || tr->bf16;
  st = tr->task->configure(tr, err);
  if (!st) st = tr->task->new_model(tr, err);
  if (!st && tr->hi > tr->lo) st = tr->task->build_optim(tr, &tr->opt, err);
  if (st) return st;
  tr->dp = ct_dp_pick(&f->cfg);
  if (tr->dp != v->dp)
    return ct_errf(err, CT_ERR_INVALID, "%s: ct_dp_pick chose '%s'", v->name, tr->dp->name);
  st = tr->dp->start(tr, err);
  if (!st && v->nvme && tr->opt) st = ct_update_start_offload(tr, err);
  if (st) return st;
  f->nw = ct_model_numel(tr->model);
  const ct_mmdit_config *mc = &tr->g.mc;
  const size_t B = (size_t)(GB / world), T = (size_t)tr->g.T;
  f->lat = (size_t)mc->in_channels * LH * LW;
  f->x0 = malloc(B * f->lat * sizeof(float));
  f->eps = malloc(B * f->lat * sizeof(float));
  f->xt = malloc(B * f->lat * sizeof(float));
  f->v = malloc(B * f->lat * sizeof(float));
  f->dv = malloc(B * f->lat * sizeof(float));
  f->t = malloc(B * sizeof(float));
  f->txt = malloc(B * T * (size_t)mc->context_in_dim * sizeof(float));
  f->y = malloc(B * (size_t)mc->vec_in_dim * sizeof(float));
  if (!f->x0 || !f->eps || !f->xt || !f->v || !f->dv || !f->t || !f->txt || !f->y)
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  return CT_OK;
}

/* Micro-batch a of optimizer step `step`: this rank's slice of the global
 * batch (samples keyed by global id), forward, MSE as the task computes it,
 * backward; parts[0] gets this rank's loss / accum as the task adds it. */
static ct_status micro(fx *f, long step, int a, double *parts, ct_err *err) {
  trainer *tr = &f->tr;
  const ct_mmdit_config *mc = &tr->g.mc;
  const int B = GB / tr->world, T = tr->g.T;
  const size_t lat = f->lat, nt = (size_t)T * (size_t)mc->context_in_dim,
               ny = (size_t)mc->vec_in_dim;
  for (int b = 0; b < B; b++) {
    const uint64_t id =
        (uint64_t)((step - 1) * f->accum + a) * GB + (uint64_t)tr->rank * (uint64_t)B + (uint64_t)b;
    ct_rng_fill_normal(f->x0 + b * lat, lat, SEED, S_X0, id * lat, 0.0f, 1.0f);
    ct_rng_fill_normal(f->eps + b * lat, lat, SEED, S_EPS, id * lat, 0.0f, 1.0f);
    ct_rng_fill_normal(f->txt + b * nt, nt, SEED, S_TXT, id * nt, 0.0f, 1.0f);
    ct_rng_fill_normal(f->y + b * ny, ny, SEED, S_Y, id * ny, 0.0f, 1.0f);
    f->t[b] = ct_rng_uniform(SEED, S_T, id);
    const float *x0 = f->x0 + b * lat, *e = f->eps + b * lat;
    for (size_t i = 0; i < lat; i++) f->xt[b * lat + i] = (1.0f - f->t[b]) * x0[i] + f->t[b] * e[i];
  }
  ct_mmdit_batch in = {
      .B = B, .H = LH, .W = LW, .T = T, .x = f->xt, .t = f->t, .txt = f->txt, .y = f->y};
  ct_status st = ct_mmdit_forward(tr->m, &in, f->v, err);
  if (st) return st;
  const size_t tot = (size_t)B * lat;
  const float scale = 2.0f / ((float)tot * (float)f->accum * (float)tr->world);
  double l = 0;
  for (size_t i = 0; i < tot; i++) {
    const float diff = f->v[i] - (f->eps[i] - f->x0[i]);
    l += (double)diff * diff;
    f->dv[i] = scale * diff;
  }
  st = ct_mmdit_backward(tr->m, f->dv, err);
  parts[0] += l / (double)tot / f->accum;
  return st;
}

/* This rank's range [lo, hi) of a buffer into full (nw floats) on every rank. */
static ct_status gather_range(fx *f, const float *mine, float *full, ct_err *err) {
  trainer *tr = &f->tr;
  if (tr->hi - tr->lo == f->nw) {
    memcpy(full, mine, f->nw * sizeof(float));
    return CT_OK;
  }
  return ct_comm_allgather_f32(tr->comm, mine, full, tr->shard, f->nw, err);
}

static void clip(float *g, size_t n, double gn, double max_norm) { /* as loop.c */
  if (!(max_norm > 0 && gn > max_norm)) return;
  const float c = (float)(max_norm / (gn + 1e-6));
  for (size_t i = 0; i < n; i++) g[i] *= c;
}

/* The full float32 weights into out (every rank): the model's own, or —
 * where the trainer holds only its range (stage 3, bf16) — rank 0's from
 * ct_dp_gather_full (which reads offloaded weights back from the swap file),
 * broadcast; it must equal the ranges all-gathered from the trainers. */
static ct_status weights(fx *f, float *out, int *gather_ok, ct_err *err) {
  trainer *tr = &f->tr;
  *gather_ok = 1;
  if (!tr->own) {
    memcpy(out, ct_model_params(tr->model), f->nw * sizeof(float));
    return CT_OK;
  }
  full_view fv;
  ct_status st = ct_dp_gather_full(tr, &fv, 0, err);
  if (!st && tr->rank == 0) {
    *gather_ok = fv.w && ct_model_params(tr->model) == fv.w;
    if (fv.w) memcpy(out, fv.w, f->nw * sizeof(float));
  }
  if (!st) ct_dp_release_full(tr, &fv);
  if (!st && tr->world > 1) st = ct_comm_broadcast(tr->comm, out, f->nw * sizeof(float), 0, err);
  float *mine = tr->wsh ? malloc(f->nw * sizeof(float)) : NULL;
  if (!st && mine) st = gather_range(f, tr->wsh, mine, err);
  if (!st && mine) *gather_ok &= !memcmp(mine, out, f->nw * sizeof(float));
  free(mine);
  return st;
}

/* One optimizer step as loop.c's run_steps takes it (no EMA, constant lr).
 * hook: 1-bit tests replace dp->step by a reference update (NULL: dp->step). */
typedef ct_status (*step_fn)(fx *f, float *g, long step, void *user, ct_err *err);

static ct_status run(fx *f, result *r, step_fn alt, void *user, int *gather_ok, ct_err *err) {
  trainer *tr = &f->tr;
  r->nw = f->nw;
  r->grad = malloc((size_t)STEPS * f->nw * sizeof(float));
  r->w = malloc(f->nw * sizeof(float));
  if (!r->grad || !r->w) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = CT_OK;
  *gather_ok = 1;
  for (long step = 1; !st && step <= STEPS; step++) {
    tr->dp->begin_step(tr);
    double parts[CT_TASK_PARTS] = {0};
    for (int a = 0; a < f->accum && !st; a++) st = micro(f, step, a, parts, err);
    float *g = NULL;
    double gn = 0;
    if (!st) st = tr->dp->reduce(tr, step, parts, tr->task->nparts, &g, &gn, err);
    if (st) break;
    r->loss[step - 1] = tr->task->loss(tr, parts);
    r->gn[step - 1] = gn;
    if (getenv("CT_TEST_VERBOSE") && tr->rank == 0)
      fprintf(stderr, "  %s step %ld: loss %.6g, grad norm %.6g\n", tr->dp->name, step,
              r->loss[step - 1], gn);
    st = gather_range(f, g, r->grad + (size_t)(step - 1) * f->nw, err);
    if (st) break;
    clip(g, tr->hi - tr->lo, gn, MAX_NORM);
    st = alt ? alt(f, g, step, user, err) : tr->dp->step(tr, g, LR, step, NULL, err);
    int ok = 1;
    if (!st && tr->own) st = weights(f, r->w, &ok, err); /* gather_full between steps, then go on */
    *gather_ok &= ok;
  }
  int ok = 1;
  if (!st) st = weights(f, r->w, &ok, err);
  *gather_ok &= ok;
  return st;
}

static ct_status run_variant(ct_comm *comm, const variant *v, int accum, long freeze_step,
                             result *r, int *gather_ok, ct_err *err) {
  fx f;
  ct_status st = fx_open(&f, comm, v, accum, freeze_step, err);
  if (!st) st = run(&f, r, NULL, NULL, gather_ok, err);
  fx_close(&f);
  return st;
}

/* ---- comparisons ---- */
static double rel(double a, double b) {
  if (!isfinite(a) || !isfinite(b)) return NAN; /* fails every tolerance */
  return a == b ? 0 : fabs(a - b) / fmax(fabs(b), 1e-30);
}

/* ||a - b|| / ||b|| (the usual relative error of a tensor), in double */
static double rel_l2(const float *a, const float *b, size_t n) {
  double d = 0, s = 0;
  for (size_t i = 0; i < n; i++) {
    const double x = (double)a[i] - (double)b[i];
    d += x * x;
    s += (double)b[i] * b[i];
  }
  if (!isfinite(d) || !isfinite(s)) return NAN; /* a NaN or Inf anywhere */
  return d == 0 ? 0 : sqrt(d) / fmax(sqrt(s), 1e-30);
}

typedef struct tol {
  double loss, gn, grad, w; /* relative; 0: bit-identical */
} tol;

/* a against the reference b: every step's loss and gradient norm, every
 * step's reduced gradient, the final weights. Returns 1 when within tol. */
static int same(const char *what, const result *a, const result *b, tol t) {
  int ok = 1;
  double el = 0, eg = 0, egr = 0, ew;
  int bits = 1;
  for (int k = 0; k < STEPS; k++) {
    el = ct_test_max(el, rel(a->loss[k], b->loss[k]));
    eg = ct_test_max(eg, rel(a->gn[k], b->gn[k]));
    egr = ct_test_max(egr, rel_l2(a->grad + (size_t)k * a->nw, b->grad + (size_t)k * b->nw, a->nw));
    bits &=
        a->loss[k] == b->loss[k] && a->gn[k] == b->gn[k] &&
        !memcmp(a->grad + (size_t)k * a->nw, b->grad + (size_t)k * b->nw, a->nw * sizeof(float));
  }
  ew = rel_l2(a->w, b->w, a->nw);
  bits &= !memcmp(a->w, b->w, a->nw * sizeof(float));
  if (getenv("CT_TEST_VERBOSE"))
    fprintf(stderr, "  %s: %s; loss %.3g, grad norm %.3g, gradient %.3g, weights %.3g\n", what,
            bits ? "bit-identical" : "differs", el, eg, egr, ew);
  if (t.loss == 0 && t.gn == 0 && t.grad == 0 && t.w == 0) {
    if (!bits)
      fprintf(stderr,
              "  %s: not bit-identical: loss %.3g, grad norm %.3g, gradient %.3g, weights %.3g\n",
              what, el, eg, egr, ew);
    return bits;
  }
  if (!(el <= t.loss && eg <= t.gn && egr <= t.grad && ew <= t.w)) { /* NaN fails */
    fprintf(stderr,
            "  %s: relative errors loss %.3g (tol %g), grad norm %.3g (%g), gradient %.3g (%g), "
            "weights %.3g (%g)\n",
            what, el, t.loss, eg, t.gn, egr, t.grad, ew, t.w);
    ok = 0;
  }
  return ok;
}

static const tol EXACT = {0, 0, 0, 0};
/* bf16 parameters and gradients (8 significant bits, 2^-8 = 3.9e-3) against
 * float32, 3 steps: measured at 1-3 ranks loss 7e-5, grad norm 3e-4,
 * gradient 9e-3, weights 2e-3 (Adam turns a gradient's rounding into a
 * change of sign(g)-sized updates where g is small). */
static const tol BF16 = {1e-3, 3e-3, 2e-2, 5e-3};
static const tol RANKS = {1e-5, 1e-5, 1e-5, 1e-5};

/* ---- the tests ---- */

/* One process: every float32 strategy equals plain data parallel. With one
 * micro-batch per step all of them are bit-identical. With gradient
 * accumulation ZeRO-1 still is (it reduces the same full gradient buffer),
 * but ZeRO-2/3 are not: plain data parallel's backward kernels add the second
 * micro-batch into a gradient that already holds the first, while ZeRO-2/3
 * compute each micro-batch's segment gradient in a zeroed bucket and add it
 * to the shard afterwards (zero.c), a different rounding order — measured
 * ~3e-8 relative in the gradient, 4e-9 in the weights; 1e-6 allowed. */
CT_TEST(strategy, one_rank_equal) {
  ct_err err = {0};
  ct_comm *one = NULL;
  REQUIRE(ct_comm_init(1, &one, &err) == CT_OK);
  ct_status st = CT_OK;
  for (int accum = 1; accum <= 2 && !st; accum++) {
    result ref = {0};
    int gok = 1;
    st = run_variant(one, &V_PLAIN, accum, 100, &ref, &gok, &err);
    CHECKF(st == CT_OK, "plain: %s", err.msg);
    for (size_t i = 0; !st && i < sizeof V_ZERO / sizeof V_ZERO[0]; i++) {
      const variant *v = &V_ZERO[i];
      result r = {0};
      st = run_variant(one, v, accum, 100, &r, &gok, &err);
      CHECKF(st == CT_OK, "%s: %s", v->name, err.msg);
      char what[96];
      snprintf(what, sizeof what, "%s vs plain at one rank, accumulation %d", v->name, accum);
      const int exact = accum == 1 || v->stage == 1;
      if (!st) CHECK(same(what, &r, &ref, exact ? EXACT : (tol){1e-6, 1e-6, 1e-6, 1e-6}));
      CHECKF(gok, "%s: ct_dp_gather_full differs from the weights", v->name);
      result_free(&r);
    }
    result_free(&ref);
  }
  ct_comm_free(one);
}

/* One process: bf16 storage (stages 0-3) within bf16 tolerance of float32. */
CT_TEST(strategy, one_rank_bf16) {
  ct_err err = {0};
  ct_comm *one = NULL;
  REQUIRE(ct_comm_init(1, &one, &err) == CT_OK);
  result ref = {0};
  int gok = 1;
  ct_status st = run_variant(one, &V_PLAIN, 2, 100, &ref, &gok, &err);
  CHECKF(st == CT_OK, "plain: %s", err.msg);
  for (size_t i = 0; !st && i < sizeof V_BF16 / sizeof V_BF16[0]; i++) {
    result r = {0};
    st = run_variant(one, &V_BF16[i], 2, 100, &r, &gok, &err);
    CHECKF(st == CT_OK, "%s: %s", V_BF16[i].name, err.msg);
    if (!st)
      CHECKF(same(V_BF16[i].name, &r, &ref, BF16), "%s vs float32 at one rank", V_BF16[i].name);
    CHECKF(gok, "%s: ct_dp_gather_full differs from the weights", V_BF16[i].name);
    result_free(&r);
  }
  result_free(&ref);
  ct_comm_free(one);
}

/* 1-bit Adam's warm-up is DeepSpeed's Adam without bias correction,
 * w -= lr (m / (sqrt(v) + eps) + wd w), over the plain all-reduced gradient
 * (docs/distributed.md): the reference applies that update to plain data
 * parallel's reduced gradient with moments of its own. */
typedef struct ds_adam {
  float *m, *v;
} ds_adam;

static ct_status deepspeed_adam(fx *f, float *g, long step, void *user, ct_err *err) {
  ds_adam *d = user;
  const ct_config *c = &f->cfg;
  const float b1 = (float)c->adam_beta1, b2 = (float)c->adam_beta2, eps = (float)c->adam_epsilon;
  const float wd = (float)c->adam_weight_decay;
  float *w = ct_model_params(f->tr.model);
  for (size_t i = 0; i < f->nw; i++) {
    d->m[i] = b1 * d->m[i] + (1.0f - b1) * g[i];
    d->v[i] = b2 * d->v[i] + (1.0f - b2) * g[i] * g[i];
  }
  for (size_t i = 0; i < f->nw; i++) w[i] -= LR * (d->m[i] / (sqrtf(d->v[i]) + eps) + wd * w[i]);
  return CT_OK;
}

/* The moments of a 1-bit run (tr->opt's Adam state) into m, v (nw floats). */
static ct_status run_onebit(ct_comm *comm, long freeze_step, result *r, float *m, float *v,
                            ct_err *err) {
  fx f;
  int gok;
  ct_status st = fx_open(&f, comm, &V_ONEBIT, 2, freeze_step, err);
  if (!st) st = run(&f, r, NULL, NULL, &gok, err);
  if (!st && m) {
    memcpy(m, ct_optim_state(f.tr.opt, 0, NULL), f.nw * sizeof(float));
    memcpy(v, ct_optim_state(f.tr.opt, 1, NULL), f.nw * sizeof(float));
  }
  fx_close(&f);
  return st;
}

CT_TEST(strategy, onebit_warmup) {
  ct_err err = {0};
  ct_comm *one = NULL;
  REQUIRE(ct_comm_init(1, &one, &err) == CT_OK);
  fx f;
  result ref = {0}, r = {0};
  ds_adam d = {0};
  int gok;
  ct_status st = fx_open(&f, one, &V_PLAIN, 2, 100, &err);
  if (!st) {
    d.m = calloc(f.nw, sizeof(float));
    d.v = calloc(f.nw, sizeof(float));
    st = d.m && d.v ? run(&f, &ref, deepspeed_adam, &d, &gok, &err) : CT_ERR_NOMEM;
  }
  CHECKF(st == CT_OK, "reference: %s", err.msg);
  const size_t nw = f.nw;
  fx_close(&f);
  float *m = malloc(nw * sizeof(float)), *v = malloc(nw * sizeof(float));
  if (!st) st = m && v ? run_onebit(one, 100, &r, m, v, &err) : CT_ERR_NOMEM;
  CHECKF(st == CT_OK, "onebitadam: %s", err.msg);
  if (!st) {
    /* The first step's reduce is plain data parallel's (the same weights,
     * ct_dp_allreduce): bit-identical. The update is the same arithmetic in
     * another file, which the compiler may contract differently (FMA): 1e-6
     * from there on (bit-identical in the Release build). */
    CHECKF(r.loss[0] == ref.loss[0] && r.gn[0] == ref.gn[0] &&
               !memcmp(r.grad, ref.grad, nw * sizeof(float)),
           "1-bit warm-up: the first reduce differs from plain data parallel's");
    CHECK(same("onebitadam warm-up vs DeepSpeed Adam", &r, &ref, (tol){1e-6, 1e-6, 1e-6, 1e-6}));
    CHECKF(rel_l2(m, d.m, nw) <= 1e-6 && rel_l2(v, d.v, nw) <= 1e-6, "moments: m %.3g, v %.3g",
           rel_l2(m, d.m, nw), rel_l2(v, d.v, nw));
  }
  free(m);
  free(v);
  free(d.m);
  free(d.v);
  result_free(&ref);
  result_free(&r);
  ct_comm_free(one);
}

/* Every rank: the ZeRO ranges [lo, hi) tile the model in rank order, the
 * optimizer covers exactly this rank's range, and zero.c agrees. */
CT_TEST(strategy, shards_tile_model) {
  ct_err err = {0};
  ct_comm *c = world_comm();
  REQUIRE(c);
  const int N = ct_comm_size(c), R = ct_comm_rank(c);
  const variant *vs[] = {&V_PLAIN,   &V_ZERO[0], &V_ZERO[1], &V_ZERO[2], &V_ZERO[3],
                         &V_ZERO[4], &V_BF16[0], &V_BF16[1], &V_BF16[2], &V_BF16[3]};
  double *r = calloc(2 * (size_t)N, sizeof *r);
  REQUIRE(r);
  for (size_t k = 0; k < sizeof vs / sizeof vs[0]; k++) {
    const variant *v = vs[k];
    fx f;
    ct_status st = fx_open(&f, c, v, 2, 100, &err);
    CHECKF(st == CT_OK, "%s: %s", v->name, err.msg);
    if (st) {
      fx_close(&f);
      break;
    }
    const trainer *tr = &f.tr;
    memset(r, 0, 2 * (size_t)N * sizeof *r);
    r[2 * R] = (double)tr->lo;
    r[2 * R + 1] = (double)tr->hi;
    CHECK(ct_comm_allreduce_f64(c, r, 2 * (size_t)N, &err) == CT_OK);
    if (!v->stage) { /* every rank steps all of it */
      for (int p = 0; p < N; p++)
        CHECKF(r[2 * p] == 0 && r[2 * p + 1] == (double)f.nw, "%s: rank %d", v->name, p);
    } else {
      CHECKF(tr->shard == ct_comm_shard_len(f.nw, N), "%s", v->name);
      CHECKF(r[0] == 0 && r[2 * N - 1] == (double)f.nw, "%s: [%g, %g) of %zu", v->name, r[0],
             r[2 * N - 1], f.nw);
      for (int p = 0; p < N; p++) {
        CHECKF(r[2 * p + 1] > r[2 * p], "%s: rank %d's range is empty", v->name, p);
        CHECKF(p == N - 1 || r[2 * p + 1] == r[2 * p + 2], "%s: ranks %d and %d: gap or overlap",
               v->name, p, p + 1);
        CHECKF(r[2 * p] == (double)p * (double)tr->shard, "%s: rank %d starts at %g", v->name, p,
               r[2 * p]);
      }
    }
    CHECKF(tr->opt && ct_optim_numel(tr->opt) == tr->hi - tr->lo,
           "%s: optimizer over %zu floats, range %zu", v->name,
           tr->opt ? ct_optim_numel(tr->opt) : 0, tr->hi - tr->lo);
    if (tr->dp == &ct_dp_zero)
      CHECKF(tr->z.mlo == tr->lo && tr->z.mhi == tr->hi && tr->z.shard == tr->shard,
             "%s: zero.c's range [%zu, %zu)", v->name, tr->z.mlo, tr->z.mhi);
    /* own: float32 weights of the range in memory, or (offload_param) in the swap file */
    CHECKF(!tr->own == !(tr->wsh || tr->widx >= 0), "%s: own %d", v->name, tr->own);
    CHECKF(!v->nvme == !tr->off && (v->nvme < 2) == (tr->widx < 0), "%s: offload", v->name);
    fx_close(&f);
  }
  free(r);
}

/* N ranks (mpirun; one rank under ctest): each strategy on its slices equals
 * one rank taking the whole global batch — float32 within 1e-5 (a GEMM over
 * B rows rounds differently from one over N·B, and the reductions add in
 * rank order), bf16 within its tolerance of float32. */
CT_TEST(strategy, ranks_equal_one) {
  ct_err err = {0};
  ct_comm *c = world_comm(), *one = NULL;
  REQUIRE(c);
  REQUIRE(ct_comm_init(1, &one, &err) == CT_OK);
  const int N = ct_comm_size(c);
  result ref = {0}, ref_ob = {0};
  int gok = 1;
  ct_status st = run_variant(one, &V_PLAIN, 2, 100, &ref, &gok, &err);
  if (!st) st = run_onebit(one, 100, &ref_ob, NULL, NULL, &err);
  CHECKF(st == CT_OK, "one rank: %s", err.msg);
  const variant *vs[] = {&V_PLAIN,   &V_ZERO[0], &V_ZERO[1], &V_ZERO[2], &V_ZERO[3], &V_ZERO[4],
                         &V_BF16[0], &V_BF16[1], &V_BF16[2], &V_BF16[3], &V_ONEBIT};
  for (size_t k = 0; !st && k < sizeof vs / sizeof vs[0]; k++) {
    const variant *v = vs[k];
    result r = {0};
    st = run_variant(c, v, 2, 100, &r, &gok, &err);
    CHECKF(st == CT_OK, "%s at %d ranks: %s", v->name, N, err.msg);
    char what[96];
    snprintf(what, sizeof what, "%s at %d rank(s) vs one", v->name, N);
    if (!st) CHECK(same(what, &r, v == &V_ONEBIT ? &ref_ob : &ref, v->bf16 ? BF16 : RANKS));
    CHECKF(gok, "%s: ct_dp_gather_full differs from the weights", v->name);
    result_free(&r);
  }
  result_free(&ref);
  result_free(&ref_ob);
  ct_comm_free(one);
}

/* N ranks, 1-bit Adam past freeze_step (compressed momentum): the gradient is
 * no longer all-reduced, yet every rank ends each step with the same weights. */
CT_TEST(strategy, onebit_compressed_ranks_agree) {
  ct_err err = {0};
  ct_comm *c = world_comm();
  REQUIRE(c);
  result r = {0};
  ct_status st = run_onebit(c, 1, &r, NULL, NULL, &err);
  CHECKF(st == CT_OK, "%s", err.msg);
  if (!st) {
    for (int k = 0; k < STEPS; k++)
      CHECKF(isfinite(r.loss[k]) && isfinite(r.gn[k]), "step %d", k + 1);
    float *w0 = malloc(r.nw * sizeof(float));
    REQUIRE(w0);
    memcpy(w0, r.w, r.nw * sizeof(float));
    CHECK(ct_comm_broadcast(c, w0, r.nw * sizeof(float), 0, &err) == CT_OK);
    CHECKF(!memcmp(w0, r.w, r.nw * sizeof(float)), "rank %d's weights differ from rank 0's",
           ct_comm_rank(c));
    free(w0);
  }
  result_free(&r);
}

/* Optimizers and learning-rate schedules over a (sub)range of a flat buffer.
 *
 * An optimizer sees float ranges (params, grads, its own state) plus a table of
 * the tensors inside the range, never a model: the same code serves a whole
 * buffer or one ZeRO shard. Tensor-wise rules (Lamb's trust ratio, Muon's
 * Newton–Schulz on 2-D weights, µP width scaling) use the table.
 *
 * Semantics follow PyTorch's optimizers (torch.optim.*) where PyTorch has one;
 * Muon follows the public reference (Keller Jordan) and µP follows the `mup`
 * package (MuAdam, MuAdamW, MuSGD). docs/optimizers.md states every formula.
 */
#ifndef CTUNER_OPTIM_H
#define CTUNER_OPTIM_H

#include <stddef.h>

#include "ctuner/status.h"

/* ---- the legacy single-call AdamW (bench) ---- */
typedef struct ct_adamw_hp {
  float lr, beta1, beta2, eps, weight_decay;
} ct_adamw_hp;

/* One AdamW step (decoupled weight decay, bias-corrected, PyTorch semantics)
 * on n elements; step is 1-based. m and v are the first/second moments. */
void ct_adamw_step(size_t n, float *w, const float *g, float *m, float *v, const ct_adamw_hp *hp,
                   long step);

/* ---- optimizers ---- */
#define CT_OPTIM_MAP(X)      \
  X(ADAMW, "adamw")          \
  X(ADAM, "adam")            \
  X(ADAGRAD, "adagrad")      \
  X(LAMB, "lamb")            \
  X(LION, "lion")            \
  X(SGD, "sgd")              \
  X(MUON, "muon")            \
  X(MUADAM, "muadam")        \
  X(MUADAMW, "muadamw")      \
  X(MUSGD, "musgd")

typedef enum ct_optim_kind {
#define CT_X(id, name) CT_OPTIM_##id,
  CT_OPTIM_MAP(CT_X)
#undef CT_X
  CT_OPTIM_NKINDS
} ct_optim_kind;

const char *ct_optim_kind_name(ct_optim_kind k);
/* Case-insensitive; also accepts SimpleTuner spellings ("adamw_bf16" -> adamw,
 * "optimi-lion" -> lion, ...). Unknown names fail with a "did you mean". */
ct_status ct_optim_kind_parse(const char *s, ct_optim_kind *out, ct_err *err);

typedef struct ct_optim_hp {
  float beta1, beta2, eps, weight_decay; /* Adam family, Lamb, Lion (beta1/2), Adagrad eps */
  float momentum, dampening;             /* SGD, MuSGD */
  int nesterov;                          /* SGD, MuSGD, Muon */
  float adagrad_lr_decay, adagrad_initial_accumulator;
  float muon_momentum;   /* Muon's momentum for 2-D weights (0.95) */
  int muon_ns_steps;     /* Newton–Schulz iterations (5) */
  float muon_adamw_lr;   /* lr scale of the AdamW part of Muon, relative to lr (1) */
} ct_optim_hp;

/* Defaults of the kind (PyTorch's, or the reference's). */
void ct_optim_hp_default(ct_optim_kind k, ct_optim_hp *hp);

/* One tensor inside the optimizer's range. rows x cols is the 2-D weight
 * [out, in]; cols == 0 for vectors (biases, norm scales). in_mult/out_mult are
 * µP width multipliers fan_in/base_fan_in and fan_out/base_fan_out (1 = no
 * scaling; used only by the Mu* kinds). */
typedef struct ct_optim_tensor {
  const char *name;
  size_t offset, numel; /* floats, relative to the range start */
  int rows, cols;
  float in_mult, out_mult;
} ct_optim_tensor;

typedef struct ct_optim ct_optim;

/* n floats; tensors (copied) must tile [0, n) in order without gaps or overlap
 * (alignment padding between tensors may appear as extra "tensors" of cols 0). */
ct_status ct_optim_new(ct_optim_kind k, const ct_optim_hp *hp, const ct_optim_tensor *t, size_t nt,
                       size_t n, ct_optim **out, ct_err *err);
void ct_optim_free(ct_optim *o);
ct_optim_kind ct_optim_get_kind(const ct_optim *o);

/* One step: w -= update(g) with learning rate lr; step is 1-based (the count
 * of steps taken including this one; bias correction uses it). */
ct_status ct_optim_step(ct_optim *o, float *w, const float *g, float lr, long step, ct_err *err);

/* State buffers, for checkpoints: index i < ct_optim_nstate(o) gives a name
 * ("exp_avg", "exp_avg_sq", "momentum_buffer", "sum", ...) and n floats each. */
size_t ct_optim_nstate(const ct_optim *o);
float *ct_optim_state(ct_optim *o, size_t i, const char **name);
size_t ct_optim_numel(const ct_optim *o);

/* Offload (docs/distributed.md): the state lives outside the optimizer.
 * ct_optim_release_state frees the optimizer's own state block
 * (ct_optim_state then returns NULL, ct_optim_step fails); step_slice steps
 * floats [a, a + n) of the range with the caller's state buffers (state i at
 * states[i], n floats) — elementwise kinds only (not Lamb, Muon). A range
 * stepped in slices gives exactly what one ct_optim_step gives. */
void ct_optim_release_state(ct_optim *o);
ct_status ct_optim_step_slice(ct_optim *o, size_t a, size_t n, float *w, const float *g, float *const *states,
                              float lr, long step, ct_err *err);

/* ---- learning-rate schedules ---- */
#define CT_SCHED_MAP(X)                              \
  X(CONSTANT, "constant")                            \
  X(CONSTANT_WITH_WARMUP, "constant_with_warmup")    \
  X(LINEAR, "linear")                                \
  X(COSINE, "cosine")                                \
  X(POLYNOMIAL, "polynomial")                        \
  X(WARMUP_LR, "WarmupLR")                           \
  X(WARMUP_DECAY_LR, "WarmupDecayLR")

typedef enum ct_sched_kind {
#define CT_X(id, name) CT_SCHED_##id,
  CT_SCHED_MAP(CT_X)
#undef CT_X
  CT_SCHED_NKINDS
} ct_sched_kind;

typedef struct ct_sched {
  ct_sched_kind kind;
  double lr;            /* base (peak) learning rate */
  long warmup_steps;    /* diffusers-style kinds */
  long total_steps;     /* linear, cosine, polynomial */
  double num_cycles;    /* cosine: 0.5 = half a cosine (diffusers default) */
  double lr_end, power; /* polynomial (1e-7, 1.0) */
  /* DeepSpeed WarmupLR / WarmupDecayLR */
  double warmup_min_lr, warmup_max_lr;
  long warmup_num_steps, total_num_steps;
  int warmup_log; /* warmup_type "log" (1, DeepSpeed default) or "linear" (0) */
} ct_sched;

const char *ct_sched_kind_name(ct_sched_kind k);
ct_status ct_sched_kind_parse(const char *s, ct_sched_kind *out, ct_err *err);
/* Check fields (e.g. total_steps > 0 where needed); message names the field. */
ct_status ct_sched_validate(const ct_sched *s, ct_err *err);
/* Learning rate for the optimizer step that follows `done` completed steps
 * (done = 0 for the first step), as diffusers' get_scheduler / DeepSpeed's
 * scheduler would give after `done` scheduler.step() calls. */
double ct_sched_lr(const ct_sched *s, long done);

/* ---- additions (after the interface was fixed) ---- */
/* Check hyperparameters for kind k (betas in [0,1), eps/weight_decay >= 0,
 * nesterov needs momentum > 0 and dampening 0, ...); the message names the
 * field. ct_optim_new calls it. */
ct_status ct_optim_hp_validate(ct_optim_kind k, const ct_optim_hp *hp, ct_err *err);
/* Zero s and fill the defaults of kind k with peak learning rate lr
 * (num_cycles 0.5, lr_end 1e-7, power 1, DeepSpeed warmup_max_lr = lr,
 * warmup_num_steps 1000, warmup_log 1). */
void ct_sched_default(ct_sched_kind k, double lr, ct_sched *s);

#endif

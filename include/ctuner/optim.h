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
#define CT_OPTIM_MAP(X) \
  X(ADAMW, "adamw")     \
  X(ADAM, "adam")       \
  X(ADAGRAD, "adagrad") \
  X(LAMB, "lamb")       \
  X(LION, "lion")       \
  X(SGD, "sgd")         \
  X(MUON, "muon")       \
  X(MUADAM, "muadam")   \
  X(MUADAMW, "muadamw") \
  X(MUSGD, "musgd")

typedef enum ct_optim_kind {
#define CT_X(id, name) CT_OPTIM_##id,
  CT_OPTIM_MAP(CT_X)
#undef CT_X
      CT_OPTIM_NKINDS
} ct_optim_kind;

const char *ct_optim_kind_name(ct_optim_kind k);
/* The local optimizer a name stands for: ct_optim_lookup(s)->kind. The 1-bit
 * family is no local kind (it communicates itself: see ct_optim_info) and
 * fails with CT_ERR_UNSUPPORTED saying so; unknown names fail as in
 * ct_optim_lookup. */
ct_status ct_optim_kind_parse(const char *s, ct_optim_kind *out, ct_err *err);

/* ---- the registry: every accepted optimizer name and what it can do ----
 * One row per accepted spelling (canonical names, SimpleTuner / DeepSpeed /
 * library aliases, the 1-bit family), so the trainer and the config ask the
 * row instead of testing kinds. docs/optimizers.md has the table. */
typedef enum ct_optim_granularity {
  CT_OPTIM_ELEMENTWISE, /* every float's update depends on that float alone (and the step) */
  CT_OPTIM_TENSORWISE   /* updates read whole tensors (Lamb's trust ratio, Muon's 2-D weights) */
} ct_optim_granularity;

/* Which 1-bit optimizer (DeepSpeed's names; train/onebit.c runs them). */
typedef enum ct_optim_onebit {
  CT_OPTIM_ONEBIT_NONE = 0, /* a local optimizer (ct_optim_new) */
  CT_OPTIM_ONEBIT_ADAM, /* OneBitAdam: warm-up, then 1-bit compressed momentum, frozen variance */
  CT_OPTIM_ONEBIT_ZEROONE_ADAM, /* ZeroOneAdam (0/1 Adam): variance updated on a schedule, local
                                   steps */
  CT_OPTIM_ONEBIT_LAMB /* OneBitLamb: 1-bit Adam's momentum with Lamb's frozen trust ratios */
} ct_optim_onebit;

/* Capability flags of a row. */
enum {
  /* A range may end inside any tensor: a ZeRO shard may cut tensors into
   * fragments (elementwise kinds). Without it, a shard must hold whole
   * tensors (ct_optim_can_cut says which). */
  CT_OPTIM_CAN_SLICE = 1u << 0,
  /* Steps in pieces with the caller's state (ct_optim_step_slice):
   * offload_optimizer nvme and offload_param nvme. */
  CT_OPTIM_CAN_OFFLOAD = 1u << 1,
  /* Trains bf16-stored weights (mixed_precision bf16; the optimizer steps a
   * float32 master copy, its state stays float32 for every kind). */
  CT_OPTIM_CAN_BF16 = 1u << 2,
  /* Communicates itself (1-bit compressed momentum over the data-parallel
   * ranks, train/onebit.c): replaces the gradient all-reduce, so zero_stage
   * 0 and float32 only; `onebit` says which. */
  CT_OPTIM_ONEBIT = 1u << 3
};

typedef struct ct_optim_info {
  const char *name; /* the spelling this row accepts (matched ignoring case, '-' = '_') */
  const char
      *canonical; /* the optimizer it is ("adamw" for "adamw_bf16"); == name for canonical rows */
  ct_optim_kind kind; /* the local optimizer that steps it and holds its state; the 1-bit
                       * family keeps Adam's two moments in a CT_OPTIM_ADAM (onebit.c steps them) */
  ct_optim_onebit onebit;
  ct_optim_granularity granularity;
  unsigned flags; /* CT_OPTIM_CAN_SLICE | ... */
  int nstate; /* state arrays of n floats (ct_optim_nstate); sgd, musgd: 1 with momentum != 0, else
                 0 */
  const char *desc;
} ct_optim_info;

/* The row of a name (case-insensitive, '-' and '_' alike). NULL for a name
 * recognised but not implemented (CT_ERR_UNSUPPORTED, with the reason and
 * what to use instead) or unknown (CT_ERR_INVALID: "did you mean", and the
 * valid names). */
const ct_optim_info *ct_optim_lookup(const char *name, ct_err *err);
/* Every row (aliases included), for help and docs; *n rows. */
const ct_optim_info *ct_optim_registry(size_t *n);
/* The canonical row of a local kind (NULL outside the enum). */
const ct_optim_info *ct_optim_kind_info(ct_optim_kind k);
/* The 1-bit variant of a name; CT_OPTIM_ONEBIT_NONE for local optimizers
 * and for names the registry does not accept. */
ct_optim_onebit ct_optim_onebit_of(const char *name);
/* DeepSpeed's class name of a 1-bit variant ("OneBitAdam", "ZeroOneAdam",
 * "OneBitLamb"; "none"). */
const char *ct_optim_onebit_name(ct_optim_onebit v);

typedef struct ct_optim_hp {
  float beta1, beta2, eps, weight_decay; /* Adam family, Lamb, Lion (beta1/2), Adagrad eps */
  float momentum, dampening;             /* SGD, MuSGD */
  int nesterov;                          /* SGD, MuSGD, Muon */
  float adagrad_lr_decay, adagrad_initial_accumulator;
  float muon_momentum; /* Muon's momentum for 2-D weights (0.95) */
  int muon_ns_steps;   /* Newton–Schulz iterations (5) */
  float muon_adamw_lr; /* lr scale of the AdamW part of Muon, relative to lr (1) */
  /* 0 (default): Adam's bias correction, as PyTorch. 1: none — m and v enter
   * the update as they are (DeepSpeed's bias_correction: false); Adam-family
   * kinds (Adam, AdamW, Mu*Adam*, Muon's AdamW part) and Lamb. */
  int bias_correction_off;
  /* Lamb: clamp the trust ratio to [lamb_min_coeff, lamb_max_coeff] as
   * DeepSpeed's FusedLamb does (max_coeff, min_coeff); 0 = no bound (the
   * default: the plain ratio, as the paper). */
  float lamb_max_coeff, lamb_min_coeff;
  /* 1: SimpleTuner's AdamWBF16 update (its optimizer adamw_bf16): the first
   * moment is not bias-corrected and the second moment's correction scales
   * the whole step, w -= lr sqrt(1 - b2^t) m / (sqrt(v) + eps) (Adam-family
   * kinds; docs/optimizers.md). 0: bias_correction_off decides. */
  int adamw_bf16;
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

/* Whether a range of kind k may end inside tensor t (t a fragment then):
 * always for CT_OPTIM_CAN_SLICE kinds; Muon for the tensors it gives to its
 * AdamW part (not rows > 0 && cols > 0); Lamb never. */
int ct_optim_can_cut(ct_optim_kind k, const ct_optim_tensor *t);

typedef struct ct_optim ct_optim;

/* n floats; tensors (copied) must tile [0, n) in order without gaps or overlap
 * (alignment padding between tensors may appear as extra "tensors" of cols 0). */
ct_status ct_optim_new(ct_optim_kind k, const ct_optim_hp *hp, const ct_optim_tensor *t, size_t nt,
                       size_t n, ct_optim **out, ct_err *err);
void ct_optim_free(ct_optim *o);
ct_optim_kind ct_optim_get_kind(const ct_optim *o);

/* Moves the optimizer state onto compute backend be (NULL: the CPU backend),
 * whose update ops (adam_update, lion_update, ...) then step it: the weights
 * and gradients ct_optim_step takes must be be's memory, and the state
 * arrays ct_optim_state returns are be's memory too. A backend without host
 * memory takes the elementwise kinds only (AdamW, Adam, Adagrad, Lion, SGD):
 * the others are refused by name, as is a backend lacking the op. */
struct ct_backend_ops;
ct_status ct_optim_set_backend(ct_optim *o, const struct ct_backend_ops *be, ct_err *err);
const struct ct_backend_ops *ct_optim_backend(const ct_optim *o);

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
ct_status ct_optim_step_slice(ct_optim *o, size_t a, size_t n, float *w, const float *g,
                              float *const *states, float lr, long step, ct_err *err);

/* ---- learning-rate schedules ---- */
#define CT_SCHED_MAP(X)                           \
  X(CONSTANT, "constant")                         \
  X(CONSTANT_WITH_WARMUP, "constant_with_warmup") \
  X(LINEAR, "linear")                             \
  X(COSINE, "cosine")                             \
  X(POLYNOMIAL, "polynomial")                     \
  X(WARMUP_LR, "WarmupLR")                        \
  X(WARMUP_DECAY_LR, "WarmupDecayLR")             \
  X(SINE, "sine")                                 \
  X(DIFFUSERS_COSINE, "diffusers_cosine")

typedef enum ct_sched_kind {
#define CT_X(id, name) CT_SCHED_##id,
  CT_SCHED_MAP(CT_X)
#undef CT_X
      CT_SCHED_NKINDS
} ct_sched_kind;

/* "cosine" and "sine" are SimpleTuner's own schedules (its custom_schedule.py
 * Cosine and Sine, not diffusers'): no warm-up; lr_warmup_steps is their
 * half-period W and lr_end their floor, lr(k) = lr_end + (lr - lr_end) *
 * (1 + cos(pi k / W)) / 2, resp. (1 + sin(pi k / W)) / 2, truncated to 1e-9.
 * "diffusers_cosine" is diffusers' get_cosine_schedule_with_warmup.
 * docs/optimizers.md has every formula. */
typedef struct ct_sched {
  ct_sched_kind kind;
  double lr;            /* base (peak) learning rate */
  long warmup_steps;    /* diffusers-style kinds; cosine/sine: the half-period */
  long total_steps;     /* linear, diffusers_cosine, polynomial */
  double num_cycles;    /* diffusers_cosine: 0.5 = half a cosine (diffusers default) */
  double lr_end, power; /* polynomial (1e-7, 1.0); lr_end: cosine/sine's floor */
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

/* ---- SimpleTuner's optimizer names (src/optim/optim_st.c) ----
 * SimpleTuner builds each of its optimizers from a fixed table of settings
 * (optimizer_choices in simpletuner/helpers/training/optimizer_param.py)
 * and never reads the adam_* keys for them (only a DeepSpeed optimizer
 * does); its optimizer_config ("eps=1e-6,weight_decay=0") and
 * optimizer_beta1/optimizer_beta2 override the table. A preset is that row
 * for a name ctuner runs; docs/optimizers.md lists them. */
enum {
  CT_OPTIM_SET_BETAS = 1u << 0,
  CT_OPTIM_SET_EPS = 1u << 1,
  CT_OPTIM_SET_WD = 1u << 2,
  CT_OPTIM_SET_MOMENTUM = 1u << 3,
  CT_OPTIM_SET_DAMPENING = 1u << 4,
  CT_OPTIM_SET_NESTEROV = 1u << 5,
  CT_OPTIM_SET_LR_DECAY = 1u << 6,
  CT_OPTIM_SET_INIT_ACC = 1u << 7
};
typedef struct ct_optim_preset {
  const char *name;   /* SimpleTuner's name (== the registry row's name) */
  const char *source; /* where SimpleTuner's table sets it ("optimizer_param.py:197") */
  unsigned set;       /* the CT_OPTIM_SET_* settings its table gives */
  unsigned takes;     /* the CT_OPTIM_SET_* arguments its class takes (optimizer_config) */
  float beta1, beta2, eps, weight_decay, momentum, dampening, lr_decay, initial_accumulator;
  int nesterov;
  int adamw_bf16; /* AdamWBF16's update (ct_optim_hp.adamw_bf16) */
} ct_optim_preset;

/* The preset of an optimizer name (any spelling ct_optim_lookup accepts),
 * or NULL when it is not one of SimpleTuner's names (adamw, lamb, muon,
 * DeepSpeed's names: those read the adam_* keys). */
const ct_optim_preset *ct_optim_preset_of(const char *name);
/* Every preset, for tests and docs; *n rows. */
const ct_optim_preset *ct_optim_presets(size_t *n);
/* hp as SimpleTuner runs preset p on local kind `kind`: the kind's defaults,
 * the preset's settings, then optimizer_config (SimpleTuner's
 * convert_arg_to_parameters: "k=v,k=v"; NULL or "" for none) or, without
 * it, betas[0..1] when betas is non-NULL (optimizer_beta1/2 both given).
 * optimizer_config keys the class does not take are dropped as SimpleTuner
 * drops them: their names go comma-separated into dropped (may be NULL).
 * Keys ctuner cannot honour fail with the key named. */
ct_status ct_optim_preset_hp(const ct_optim_preset *p, ct_optim_kind kind,
                             const char *optimizer_config, const float *betas, ct_optim_hp *hp,
                             char *dropped, size_t dropped_cap, ct_err *err);
/* "betas 0.9/0.999, eps 1e-06, weight_decay 0.01" for hp's settings that
 * preset p's class takes, into out. */
void ct_optim_preset_describe(const ct_optim_preset *p, const ct_optim_hp *hp, char *out,
                              size_t cap);

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

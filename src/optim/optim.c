/* The optimizer object: the registry of names and capabilities, defaults and
 * validation, the tensor table and state buffers, and the step that walks the
 * table.
 *
 * The registry has one row per accepted spelling (canonical kinds, aliases,
 * the 1-bit family that train/onebit.c runs): granularity, state count and
 * capability flags (ZeRO slicing, offload, bf16 storage, 1-bit), so callers
 * ask the row instead of testing kinds.
 *
 * An optimizer owns one CT_MEM_OPTIMIZER block holding its state buffers
 * (PyTorch's names: exp_avg, exp_avg_sq, sum, momentum_buffer), each n floats
 * at a 16-float stride, so a checkpoint can save them by name. The step hands
 * whole slices to the elementwise kernels when one rule covers the range
 * (AdamW, Adam, Adagrad, Lion, SGD) and walks the tensor table when the rule
 * is per tensor (Lamb's trust ratio, Muon's 2-D weights, µP's per-tensor
 * learning rates); consecutive tensors that share a rule go as one slice.
 * Not here: the arithmetic (optim_elem.c, optim_tensor.c), schedules (sched.c).
 * Every formula, default and the µP rule: docs/optimizers.md.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "optim_int.h"

/* ---- names and the registry ---- */

static const char *const kind_names[] = {
#define CT_X(id, name) name,
    CT_OPTIM_MAP(CT_X)
#undef CT_X
};

const char *ct_optim_kind_name(ct_optim_kind k) {
  return (unsigned)k < CT_OPTIM_NKINDS ? kind_names[k] : "unknown";
}

/* Capabilities: elementwise local kinds step any slice (ZeRO fragments,
 * offload); tensor-wise ones need whole tensors; the 1-bit family
 * communicates itself (data parallel, zero_stage 0, float32). */
#define ELEM CT_OPTIM_ELEMENTWISE, CT_OPTIM_CAN_SLICE | CT_OPTIM_CAN_OFFLOAD | CT_OPTIM_CAN_BF16
#define TENS CT_OPTIM_TENSORWISE, CT_OPTIM_CAN_BF16
#define NO1 CT_OPTIM_ONEBIT_NONE
/* {name, canonical, kind, onebit, granularity, flags, nstate, desc} */
static const ct_optim_info rows[] = {
    /* canonical local kinds, in enum order (ct_optim_kind_info indexes them) */
    {"adamw", "adamw", CT_OPTIM_ADAMW, NO1, ELEM, 2,
     "AdamW, decoupled weight decay (torch.optim.AdamW)"},
    {"adam", "adam", CT_OPTIM_ADAM, NO1, ELEM, 2, "Adam, L2 weight decay (torch.optim.Adam)"},
    {"adagrad", "adagrad", CT_OPTIM_ADAGRAD, NO1, ELEM, 1, "Adagrad (torch.optim.Adagrad)"},
    {"lamb", "lamb", CT_OPTIM_LAMB, NO1, TENS, 2,
     "Lamb: Adam's update scaled by a per-tensor trust ratio"},
    {"lion", "lion", CT_OPTIM_LION, NO1, ELEM, 1, "Lion: sign of an interpolated momentum"},
    {"sgd", "sgd", CT_OPTIM_SGD, NO1, ELEM, 1,
     "SGD with optional momentum and Nesterov (torch.optim.SGD)"},
    {"muon", "muon", CT_OPTIM_MUON, NO1, TENS, 2,
     "Muon: Newton-Schulz orthogonalised momentum on 2-D weights, AdamW on the rest"},
    {"muadam", "muadam", CT_OPTIM_MUADAM, NO1, ELEM, 2,
     "Adam with muP per-tensor learning rates (mup.MuAdam)"},
    {"muadamw", "muadamw", CT_OPTIM_MUADAMW, NO1, ELEM, 2,
     "AdamW with muP per-tensor learning rates (mup.MuAdamW)"},
    {"musgd", "musgd", CT_OPTIM_MUSGD, NO1, ELEM, 1,
     "SGD with muP per-tensor learning rates (mup.MuSGD)"},
    /* the 1-bit family (DeepSpeed; train/onebit.c) */
    {"onebitadam", "onebitadam", CT_OPTIM_ADAM, CT_OPTIM_ONEBIT_ADAM, CT_OPTIM_ELEMENTWISE,
     CT_OPTIM_ONEBIT, 2,
     "1-bit Adam (DeepSpeed OneBitAdam): full-precision warm-up, then 1-bit compressed momentum"},
    {"zerooneadam", "zerooneadam", CT_OPTIM_ADAM, CT_OPTIM_ONEBIT_ZEROONE_ADAM,
     CT_OPTIM_ELEMENTWISE, CT_OPTIM_ONEBIT, 2,
     "0/1 Adam (DeepSpeed ZeroOneAdam): scheduled variance updates and local steps"},
    {"onebitlamb", "onebitlamb", CT_OPTIM_ADAM, CT_OPTIM_ONEBIT_LAMB, CT_OPTIM_TENSORWISE,
     CT_OPTIM_ONEBIT, 2,
     "1-bit Lamb (DeepSpeed OneBitLamb): 1-bit momentum with frozen per-tensor trust ratios"},
    /* SimpleTuner / DeepSpeed / library spellings */
    {"adamw_bf16", "adamw", CT_OPTIM_ADAMW, NO1, ELEM, 2,
     "SimpleTuner's bf16 AdamW (state is float32 here)"},
    {"optimi-adamw", "adamw", CT_OPTIM_ADAMW, NO1, ELEM, 2, "torch-optimi's AdamW"},
    {"bnb-adamw", "adamw", CT_OPTIM_ADAMW, NO1, ELEM, 2, "bitsandbytes' 32-bit AdamW"},
    {"bnb-adamw-paged", "adamw", CT_OPTIM_ADAMW, NO1, ELEM, 2, "bitsandbytes' paged AdamW"},
    {"torch-adamw", "adamw", CT_OPTIM_ADAMW, NO1, ELEM, 2, "torch.optim.AdamW"},
    {"deepspeed-adamw", "adamw", CT_OPTIM_ADAMW, NO1, ELEM, 2, "DeepSpeed's AdamW"},
    {"fusedadam", "adamw", CT_OPTIM_ADAMW, NO1, ELEM, 2, "DeepSpeed's FusedAdam (AdamW mode)"},
    {"cpuadam", "adamw", CT_OPTIM_ADAMW, NO1, ELEM, 2, "DeepSpeed's CPUAdam (AdamW mode)"},
    {"optimi-adam", "adam", CT_OPTIM_ADAM, NO1, ELEM, 2, "torch-optimi's Adam"},
    {"bnb-adam", "adam", CT_OPTIM_ADAM, NO1, ELEM, 2, "bitsandbytes' 32-bit Adam"},
    {"bnb-adagrad", "adagrad", CT_OPTIM_ADAGRAD, NO1, ELEM, 1, "bitsandbytes' 32-bit Adagrad"},
    {"optimi-lamb", "lamb", CT_OPTIM_LAMB, NO1, TENS, 2, "torch-optimi's Lamb"},
    {"optimi-lion", "lion", CT_OPTIM_LION, NO1, ELEM, 1, "torch-optimi's Lion"},
    {"bnb-lion", "lion", CT_OPTIM_LION, NO1, ELEM, 1, "bitsandbytes' 32-bit Lion"},
    {"bnb-lion-paged", "lion", CT_OPTIM_LION, NO1, ELEM, 1, "bitsandbytes' paged Lion"},
    {"optimi-sgd", "sgd", CT_OPTIM_SGD, NO1, ELEM, 1, "torch-optimi's SGD"},
    {"torch-adam", "adam", CT_OPTIM_ADAM, NO1, ELEM, 2, "torch.optim.Adam"},
    {"torch-sgd", "sgd", CT_OPTIM_SGD, NO1, ELEM, 1, "torch.optim.SGD"},
    {"torch-adagrad", "adagrad", CT_OPTIM_ADAGRAD, NO1, ELEM, 1, "torch.optim.Adagrad"},
    {"1bitadam", "onebitadam", CT_OPTIM_ADAM, CT_OPTIM_ONEBIT_ADAM, CT_OPTIM_ELEMENTWISE,
     CT_OPTIM_ONEBIT, 2, "1-bit Adam"},
    {"onebit_adam", "onebitadam", CT_OPTIM_ADAM, CT_OPTIM_ONEBIT_ADAM, CT_OPTIM_ELEMENTWISE,
     CT_OPTIM_ONEBIT, 2, "1-bit Adam"},
    {"01adam", "zerooneadam", CT_OPTIM_ADAM, CT_OPTIM_ONEBIT_ZEROONE_ADAM, CT_OPTIM_ELEMENTWISE,
     CT_OPTIM_ONEBIT, 2, "0/1 Adam"},
    {"zeroone_adam", "zerooneadam", CT_OPTIM_ADAM, CT_OPTIM_ONEBIT_ZEROONE_ADAM,
     CT_OPTIM_ELEMENTWISE, CT_OPTIM_ONEBIT, 2, "0/1 Adam"},
    {"1bitlamb", "onebitlamb", CT_OPTIM_ADAM, CT_OPTIM_ONEBIT_LAMB, CT_OPTIM_TENSORWISE,
     CT_OPTIM_ONEBIT, 2, "1-bit Lamb"},
    {"onebit_lamb", "onebitlamb", CT_OPTIM_ADAM, CT_OPTIM_ONEBIT_LAMB, CT_OPTIM_TENSORWISE,
     CT_OPTIM_ONEBIT, 2, "1-bit Lamb"},
};
#define NROWS (sizeof rows / sizeof rows[0])
#undef ELEM
#undef TENS
#undef NO1

/* Names recognised but not implemented, with the reason shown to the user. */
static const struct {
  const char *name;
  const char *why;
} refused[] = {
    {"adamw_schedulefree",
     "schedule-free AdamW (an averaged iterate that replaces the lr "
     "schedule) is not implemented; use 'adamw' with a schedule"},
    {"adamw_schedulefree+aggressive", "schedule-free AdamW is not implemented; use 'adamw'"},
    {"adamw_schedulefree+no_kahan", "schedule-free AdamW is not implemented; use 'adamw'"},
    {"ao-adamw8bit", "8-bit optimizer states are not implemented (state is float32); use 'adamw'"},
    {"ao-adamw4bit", "4-bit optimizer states are not implemented (state is float32); use 'adamw'"},
    {"ao-adamfp8", "fp8 optimizer states are not implemented (state is float32); use 'adam'"},
    {"ao-adamwfp8", "fp8 optimizer states are not implemented (state is float32); use 'adamw'"},
    {"bnb-adamw8bit", "8-bit optimizer states are not implemented (state is float32); use 'adamw'"},
    {"bnb-adamw8bit-paged", "8-bit optimizer states are not implemented; use 'adamw'"},
    {"bnb-adam8bit", "8-bit optimizer states are not implemented (state is float32); use 'adam'"},
    {"bnb-lion8bit", "8-bit optimizer states are not implemented (state is float32); use 'lion'"},
    {"bnb-lion8bit-paged", "8-bit optimizer states are not implemented; use 'lion'"},
    {"bnb-adagrad8bit", "8-bit optimizer states are not implemented; use 'adagrad'"},
    {"optimi-stableadamw", "StableAdamW is not implemented; use 'adamw'"},
    {"optimi-radam", "RAdam is not implemented; use 'adam' with warmup"},
    {"optimi-ranger", "Ranger is not implemented; use 'adamw'"},
    {"optimi-adan", "Adan is not implemented; use 'adamw'"},
    {"bnb-ademamix", "AdEMAMix is not implemented; use 'adamw'"},
    {"prodigy", "Prodigy (learning-rate-free) is not implemented; use 'adamw'"},
    {"soap", "SOAP is not implemented; use 'adamw' or 'muon'"},
    /* the rest of SimpleTuner's optimizer_choices (optimizer_param.py, commit
     * 06b96af: torch-* at lines 113-196, bnb-ademamix* at 620-671) and the
     * names it removed (deprecated_optimizers, line 721) */
    {"torch-radam", "RAdam is not implemented; use 'torch-adam' with warmup"},
    {"torch-nadam", "NAdam is not implemented; use 'torch-adam'"},
    {"torch-rmsprop", "RMSprop is not implemented; use 'torch-adam'"},
    {"torch-adadelta", "Adadelta is not implemented; use 'torch-adagrad' or 'torch-adam'"},
    {"torch-adafactor", "Adafactor is not implemented; use 'torch-adamw'"},
    {"torch-adamax", "Adamax is not implemented; use 'torch-adam'"},
    {"torch-asgd", "averaged SGD is not implemented; use 'torch-sgd'"},
    {"torch-sparseadam", "SparseAdam (sparse gradients) is not implemented; use 'torch-adam'"},
    {"bnb-ademamix8bit", "AdEMAMix is not implemented (nor 8-bit states); use 'adamw'"},
    {"bnb-ademamix-paged", "AdEMAMix is not implemented; use 'adamw'"},
    {"bnb-ademamix8bit-paged", "AdEMAMix is not implemented (nor 8-bit states); use 'adamw'"},
    {"adafactor",
     "SimpleTuner removed it as well (for optimi-stableadamw, which ctuner lacks); "
     "use 'adamw_bf16' or 'optimi-adamw'"},
    {"dadaptation", "SimpleTuner removed it as well; use 'adamw_bf16' with a schedule"},
    {"adamw8bit", "SimpleTuner removed it as well; use 'adamw_bf16' or 'optimi-adamw'"},
};
#define NREFUSED (sizeof refused / sizeof refused[0])

/* Lower case, '-' and '_' alike; at most cap-1 characters. */
static void normalise(const char *s, char *out, size_t cap) {
  size_t i = 0;
  for (; s[i] && i + 1 < cap; i++) {
    char c = (char)tolower((unsigned char)s[i]);
    out[i] = c == '-' ? '_' : c;
  }
  out[i] = 0;
}

static int edit_distance(const char *a, const char *b) {
  int la = (int)strlen(a), lb = (int)strlen(b), row[64];
  if (la > 63) la = 63;
  if (lb > 63) lb = 63;
  for (int j = 0; j <= lb; j++) row[j] = j;
  for (int i = 1; i <= la; i++) {
    int diag = row[0];
    row[0] = i;
    for (int j = 1; j <= lb; j++) {
      int up = row[j];
      int best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[lb];
}

/* Closest name among `names` (n of them) to the normalised input. */
static const char *closest(const char *in, const char *const *names, size_t n) {
  const char *best = NULL;
  int bd = 1 << 30;
  for (size_t i = 0; i < n; i++) {
    char nn[64];
    normalise(names[i], nn, sizeof nn);
    int d = edit_distance(in, nn);
    if (d < bd) {
      bd = d;
      best = names[i];
    }
  }
  return best;
}

static ct_status find(const char *s, const ct_optim_info **out, ct_err *err) {
  char in[64], nn[64];
  *out = NULL;
  if (!s || !*s) return ct_errf(err, CT_ERR_INVALID, "empty optimizer name");
  normalise(s, in, sizeof in);
  for (size_t i = 0; i < NROWS; i++) {
    normalise(rows[i].name, nn, sizeof nn);
    if (!strcmp(in, nn)) {
      *out = &rows[i];
      return CT_OK;
    }
  }
  for (size_t i = 0; i < NREFUSED; i++) {
    normalise(refused[i].name, nn, sizeof nn);
    if (!strcmp(in, nn))
      return ct_errf(err, CT_ERR_UNSUPPORTED, "optimizer '%s' is not supported: %s", s,
                     refused[i].why);
  }
  /* did you mean: every accepted spelling; choices: the canonical names */
  const char *cand[NROWS];
  char choices[512] = "";
  size_t len = 0;
  for (size_t i = 0; i < NROWS; i++) {
    cand[i] = rows[i].name;
    if (strcmp(rows[i].name, rows[i].canonical)) continue;
    int w = snprintf(choices + len, sizeof choices - len, "%s%s", len ? ", " : "", rows[i].name);
    if (w > 0 && (size_t)w < sizeof choices - len) len += (size_t)w;
  }
  return ct_errf(err, CT_ERR_INVALID, "unknown optimizer '%s'; did you mean '%s'? (choices: %s)", s,
                 closest(in, cand, NROWS), choices);
}

const ct_optim_info *ct_optim_lookup(const char *name, ct_err *err) {
  const ct_optim_info *r;
  find(name, &r, err);
  return r;
}

const ct_optim_info *ct_optim_registry(size_t *n) {
  *n = NROWS;
  return rows;
}

const ct_optim_info *ct_optim_kind_info(ct_optim_kind k) {
  return (unsigned)k < CT_OPTIM_NKINDS ? &rows[k] : NULL;
}

ct_optim_onebit ct_optim_onebit_of(const char *name) {
  const ct_optim_info *r;
  return find(name, &r, NULL) == CT_OK ? r->onebit : CT_OPTIM_ONEBIT_NONE;
}

const char *ct_optim_onebit_name(ct_optim_onebit v) {
  switch (v) {
    case CT_OPTIM_ONEBIT_ADAM:
      return "OneBitAdam";
    case CT_OPTIM_ONEBIT_ZEROONE_ADAM:
      return "ZeroOneAdam";
    case CT_OPTIM_ONEBIT_LAMB:
      return "OneBitLamb";
    default:
      return "none";
  }
}

ct_status ct_optim_kind_parse(const char *s, ct_optim_kind *out, ct_err *err) {
  const ct_optim_info *r;
  ct_status st = find(s, &r, err);
  if (st) return st;
  if (r->flags & CT_OPTIM_ONEBIT)
    return ct_errf(
        err, CT_ERR_UNSUPPORTED,
        "optimizer '%s' is %s: it communicates its own 1-bit compressed momentum, so the "
        "data-parallel trainer runs it (train/onebit.c); it is not a local optimizer kind",
        s, ct_optim_onebit_name(r->onebit));
  *out = r->kind;
  return CT_OK;
}

/* ---- hyperparameters ---- */

void ct_optim_hp_default(ct_optim_kind k, ct_optim_hp *hp) {
  memset(hp, 0, sizeof *hp);
  hp->beta1 = 0.9f;
  hp->beta2 = 0.999f;
  hp->eps = 1e-8f;
  hp->muon_momentum = 0.95f;
  hp->muon_ns_steps = 5;
  hp->muon_adamw_lr = 1.0f;
  switch (k) {
    case CT_OPTIM_ADAMW:
    case CT_OPTIM_MUADAMW:
      hp->weight_decay = 1e-2f;
      break;
    case CT_OPTIM_ADAGRAD:
      hp->eps = 1e-10f;
      break;
    case CT_OPTIM_LAMB:
      hp->eps = 1e-6f;
      break;
    case CT_OPTIM_LION:
      hp->beta2 = 0.99f;
      break;
    case CT_OPTIM_MUON:
      hp->beta2 = 0.95f;
      hp->eps = 1e-10f;
      hp->nesterov = 1;
      break;
    default:
      break;
  }
}

static int bad(float x) {
  return !isfinite(x);
}

ct_status ct_optim_hp_validate(ct_optim_kind k, const ct_optim_hp *hp, ct_err *err) {
  if ((unsigned)k >= CT_OPTIM_NKINDS)
    return ct_errf(err, CT_ERR_INVALID, "invalid optimizer kind %d", (int)k);
  const char *kn = kind_names[k];
  int adam_like = k == CT_OPTIM_ADAMW || k == CT_OPTIM_ADAM || k == CT_OPTIM_LAMB ||
                  k == CT_OPTIM_LION || k == CT_OPTIM_MUON || k == CT_OPTIM_MUADAM ||
                  k == CT_OPTIM_MUADAMW;
  int sgd_like = k == CT_OPTIM_SGD || k == CT_OPTIM_MUSGD;
  if (adam_like) {
    if (bad(hp->beta1) || hp->beta1 < 0 || hp->beta1 >= 1)
      return ct_errf(err, CT_ERR_INVALID, "%s: beta1 (adam_beta1) = %g must be in [0, 1)", kn,
                     hp->beta1);
    if (bad(hp->beta2) || hp->beta2 < 0 || hp->beta2 >= 1)
      return ct_errf(err, CT_ERR_INVALID, "%s: beta2 (adam_beta2) = %g must be in [0, 1)", kn,
                     hp->beta2);
  }
  if ((adam_like && k != CT_OPTIM_LION) || k == CT_OPTIM_ADAGRAD) {
    if (bad(hp->eps) || hp->eps < 0)
      return ct_errf(err, CT_ERR_INVALID, "%s: eps (adam_epsilon) = %g must be >= 0", kn, hp->eps);
  }
  if (bad(hp->weight_decay) || hp->weight_decay < 0)
    return ct_errf(err, CT_ERR_INVALID, "%s: weight_decay (adam_weight_decay) = %g must be >= 0",
                   kn, hp->weight_decay);
  if (sgd_like) {
    if (bad(hp->momentum) || hp->momentum < 0)
      return ct_errf(err, CT_ERR_INVALID, "%s: momentum = %g must be >= 0", kn, hp->momentum);
    if (bad(hp->dampening))
      return ct_errf(err, CT_ERR_INVALID, "%s: dampening = %g must be finite", kn, hp->dampening);
    if (hp->nesterov && (hp->momentum <= 0 || hp->dampening != 0))
      return ct_errf(
          err, CT_ERR_INVALID,
          "%s: nesterov needs momentum > 0 and dampening = 0 (momentum %g, dampening %g)", kn,
          hp->momentum, hp->dampening);
  }
  if (k == CT_OPTIM_ADAGRAD) {
    if (bad(hp->adagrad_lr_decay) || hp->adagrad_lr_decay < 0)
      return ct_errf(err, CT_ERR_INVALID, "adagrad: adagrad_lr_decay = %g must be >= 0",
                     hp->adagrad_lr_decay);
    if (bad(hp->adagrad_initial_accumulator) || hp->adagrad_initial_accumulator < 0)
      return ct_errf(err, CT_ERR_INVALID, "adagrad: adagrad_initial_accumulator = %g must be >= 0",
                     hp->adagrad_initial_accumulator);
  }
  if (k == CT_OPTIM_LAMB && (bad(hp->lamb_max_coeff) || bad(hp->lamb_min_coeff) ||
                             hp->lamb_min_coeff < 0 || hp->lamb_max_coeff < 0 ||
                             (hp->lamb_max_coeff > 0 && hp->lamb_min_coeff > hp->lamb_max_coeff)))
    return ct_errf(err, CT_ERR_INVALID,
                   "lamb: lamb_min_coeff (%g) and lamb_max_coeff (%g) must be >= 0 with min <= max "
                   "(0: no bound)",
                   hp->lamb_min_coeff, hp->lamb_max_coeff);
  if (k == CT_OPTIM_MUON) {
    if (bad(hp->muon_momentum) || hp->muon_momentum < 0 || hp->muon_momentum >= 1)
      return ct_errf(err, CT_ERR_INVALID, "muon: muon_momentum = %g must be in [0, 1)",
                     hp->muon_momentum);
    if (hp->muon_ns_steps < 1 || hp->muon_ns_steps > 100)
      return ct_errf(err, CT_ERR_INVALID, "muon: muon_ns_steps = %d must be in [1, 100]",
                     hp->muon_ns_steps);
    if (bad(hp->muon_adamw_lr) || hp->muon_adamw_lr < 0)
      return ct_errf(err, CT_ERR_INVALID, "muon: muon_adamw_lr = %g must be >= 0",
                     hp->muon_adamw_lr);
  }
  return CT_OK;
}

/* ---- lifecycle ---- */

static int is_mu(ct_optim_kind k) {
  return k == CT_OPTIM_MUADAM || k == CT_OPTIM_MUADAMW || k == CT_OPTIM_MUSGD;
}

/* Muon's rule for 2-D weights applies to tensors with rows > 0 and cols > 0. */
static int muon_2d(const ct_optim_tensor *t) {
  return t->rows > 0 && t->cols > 0;
}

int ct_optim_can_cut(ct_optim_kind k, const ct_optim_tensor *t) {
  if ((unsigned)k >= CT_OPTIM_NKINDS) return 0;
  if (rows[k].flags & CT_OPTIM_CAN_SLICE) return 1;
  return k == CT_OPTIM_MUON && !muon_2d(t);
}

static ct_status check_table(ct_optim_kind k, const ct_optim_tensor *t, size_t nt, size_t n,
                             ct_err *err) {
  size_t at = 0;
  for (size_t i = 0; i < nt; i++) {
    const char *nm = t[i].name ? t[i].name : "(unnamed)";
    if (t[i].offset != at)
      return ct_errf(
          err, CT_ERR_INVALID,
          "optimizer table: tensor %zu '%s' starts at %zu, expected %zu (tensors must tile "
          "the range in order)",
          i, nm, t[i].offset, at);
    if (t[i].numel > n - at)
      return ct_errf(err, CT_ERR_INVALID,
                     "optimizer table: tensor '%s' ends at %zu, past the range of %zu", nm,
                     t[i].offset + t[i].numel, n);
    at += t[i].numel;
    if (t[i].rows < 0 || t[i].cols < 0)
      return ct_errf(err, CT_ERR_INVALID, "optimizer table: tensor '%s' has negative rows/cols",
                     nm);
    if (k == CT_OPTIM_MUON && muon_2d(&t[i]) && (size_t)t[i].rows * (size_t)t[i].cols != t[i].numel)
      return ct_errf(
          err, CT_ERR_SHAPE,
          "muon: tensor '%s' is %d x %d but holds %zu floats; Muon needs whole 2-D weights "
          "(pass cols = 0 to give a tensor or fragment to AdamW)",
          nm, t[i].rows, t[i].cols, t[i].numel);
    if (is_mu(k) &&
        (bad(t[i].in_mult) || bad(t[i].out_mult) || t[i].in_mult < 0 || t[i].out_mult < 0))
      return ct_errf(err, CT_ERR_INVALID,
                     "%s: tensor '%s' has width multipliers in %g, out %g (need > 0)",
                     kind_names[k], nm, t[i].in_mult, t[i].out_mult);
  }
  if (at != n)
    return ct_errf(err, CT_ERR_INVALID, "optimizer table covers %zu of %zu floats", at, n);
  return CT_OK;
}

ct_status ct_optim_new(ct_optim_kind k, const ct_optim_hp *hp, const ct_optim_tensor *t, size_t nt,
                       size_t n, ct_optim **out, ct_err *err) {
  ct_status st = CT_OK;
  ct_optim *o = NULL;
  *out = NULL;
  if ((st = ct_optim_hp_validate(k, hp, err))) goto out;
  if (nt && !t) {
    st = ct_errf(err, CT_ERR_INVALID, "optimizer table is NULL with %zu tensors", nt);
    goto out;
  }
  if (nt && (st = check_table(k, t, nt, n, err))) goto out;
  o = calloc(1, sizeof *o);
  if (!o) goto nomem;
  o->kind = k;
  o->hp = *hp;
  o->be = ct_backend_default();
  o->n = n;
  o->stride = (n + 15) & ~(size_t)15;
  /* No table: the range is one vector-like tensor. */
  o->nt = nt ? nt : 1;
  o->t = calloc(o->nt, sizeof *o->t);
  if (!o->t) goto nomem;
  if (nt) {
    size_t nb = 0;
    for (size_t i = 0; i < nt; i++) nb += strlen(t[i].name ? t[i].name : "") + 1;
    o->names = malloc(nb);
    if (!o->names) goto nomem;
    char *p = o->names;
    for (size_t i = 0; i < nt; i++) {
      const char *nm = t[i].name ? t[i].name : "";
      size_t l = strlen(nm) + 1;
      memcpy(p, nm, l);
      o->t[i] = t[i];
      o->t[i].name = p;
      p += l;
    }
  } else {
    o->t[0].name = "(range)";
    o->t[0].numel = n;
  }
  switch (k) {
    case CT_OPTIM_ADAGRAD:
      o->nstate = 1;
      o->state_name[0] = "sum";
      break;
    case CT_OPTIM_LION:
      o->nstate = 1;
      o->state_name[0] = "exp_avg";
      break;
    case CT_OPTIM_SGD:
    case CT_OPTIM_MUSGD:
      o->nstate = hp->momentum != 0 ? 1 : 0;
      o->state_name[0] = "momentum_buffer";
      break;
    case CT_OPTIM_MUON:
      /* momentum_buffer of 2-D weights and exp_avg of the AdamW tensors share buffer 0 */
      o->nstate = 2;
      o->state_name[0] = "momentum_buffer";
      o->state_name[1] = "exp_avg_sq";
      break;
    default:
      o->nstate = 2;
      o->state_name[0] = "exp_avg";
      o->state_name[1] = "exp_avg_sq";
      break;
  }
  if (o->nstate && n) {
    o->state_block = ct_calloc(CT_MEM_OPTIMIZER, o->nstate * o->stride, sizeof(float));
    if (!o->state_block) goto nomem;
  }
  if (k == CT_OPTIM_ADAGRAD && hp->adagrad_initial_accumulator != 0) {
    for (size_t i = 0; i < n; i++) o->state_block[i] = hp->adagrad_initial_accumulator;
  }
  if (k == CT_OPTIM_MUON) {
    for (size_t i = 0; i < o->nt; i++) {
      if (!muon_2d(&o->t[i])) continue;
      size_t s = ct_optim_muon_scratch(o->t[i].rows, o->t[i].cols);
      if (s > o->ns_floats) o->ns_floats = s;
    }
    if (o->ns_floats) {
      o->ns = ct_alloc(CT_MEM_BUFFERS, o->ns_floats * sizeof(float));
      if (!o->ns) goto nomem;
    }
  }
  *out = o;
  o = NULL;
  goto out;
nomem:
  st = ct_errf(err, CT_ERR_NOMEM, "%s: cannot allocate optimizer state for %zu floats",
               ct_optim_kind_name(k), n);
out:
  ct_optim_free(o);
  return st;
}

void ct_optim_free(ct_optim *o) {
  if (!o) return;
  o->be->free(o->state_block);
  ct_free(o->ns);
  free(o->names);
  free(o->t);
  free(o);
}

ct_optim_kind ct_optim_get_kind(const ct_optim *o) {
  return o->kind;
}
size_t ct_optim_nstate(const ct_optim *o) {
  return o->nstate;
}
size_t ct_optim_numel(const ct_optim *o) {
  return o->n;
}

float *ct_optim_state(ct_optim *o, size_t i, const char **name) {
  if (i >= o->nstate) {
    if (name) *name = NULL;
    return NULL;
  }
  if (name) *name = o->state_name[i];
  return o->state_block ? o->state_block + i * o->stride : NULL;
}

/* ---- step ---- */

static double mult(float m) {
  return m == 0.0f ? 1.0 : (double)m;
}

/* µP (the `mup` package, Yang et al. 2022): lr and weight-decay factors of one
 * tensor. A dimension is "infinite" when its width multiplier is not 1; a
 * vector's only dimension is its out dimension. See docs/optimizers.md. */
static void mup_factors(ct_optim_kind k, const ct_optim_tensor *t, double *flr, double *fwd) {
  double in = t->cols > 0 ? mult(t->in_mult) : 1.0, outm = mult(t->out_mult);
  int in_inf = in != 1.0, out_inf = outm != 1.0, ninf = in_inf + out_inf;
  double width = in_inf ? in : (out_inf ? outm : 1.0); /* the last infinite dim: fan_in first */
  *flr = *fwd = 1.0;
  if (k == CT_OPTIM_MUSGD) {
    if (ninf == 1) {
      *flr = width;
      *fwd = 1.0 / width;
    } else if (ninf == 2) {
      double ratio = in / outm;
      *flr = 1.0 / ratio;
      *fwd = ratio;
    }
  } else if (ninf == 2) {
    *flr = 1.0 / width;
    *fwd = width;
  }
}

/* Adam (decoupled 0) or AdamW (1) on a slice in hp's bias-correction mode.
 * hp->adamw_bf16 is SimpleTuner's AdamWBF16 (its optimizer adamw_bf16:
 * simpletuner/helpers/training/optimizers/adamw_bfloat16/__init__.py,
 * _make_step): w -= lr sqrt(1 - b2^t) m / (sqrt(v) + eps), the first moment
 * not bias-corrected. The kernel computes the corrected
 * w -= lr/(1 - b1^t) m / (sqrt(v)/sqrt(1 - b2^t) + eps); with
 * lr' = lr (1 - b1^t), eps' = eps / sqrt(1 - b2^t) that is AdamWBF16's step,
 * and wd' = wd / (1 - b1^t) keeps the decoupled decay lr' wd' = lr wd
 * (AdamWBF16 accumulates that decay and applies it in lumps of at least
 * 5e-3 to survive bf16 rounding; ctuner's float32 weights take it every
 * step). */
static void adam_call(const ct_optim *o, size_t n, float *w, const float *g, float *m, float *v,
                      float lr, float wd, int decoupled, long step) {
  const ct_optim_hp *hp = &o->hp;
  if (!hp->adamw_bf16) {
    ct_optim_adam_slice(o->be, n, w, g, m, v, lr, hp->beta1, hp->beta2, hp->eps, wd, decoupled,
                        ct_optim_bc_step(hp, step));
    return;
  }
  const double bc1 = 1.0 - pow((double)hp->beta1, (double)step);
  const double bc2s = sqrt(1.0 - pow((double)hp->beta2, (double)step));
  ct_optim_adam_slice(o->be, n, w, g, m, v, (float)((double)lr * bc1), hp->beta1, hp->beta2,
                      (float)((double)hp->eps / bc2s), decoupled ? (float)((double)wd / bc1) : wd,
                      decoupled, step);
}

/* Floats [a, a + n) of the range for the elementwise kinds; w, g, s0, s1
 * point at float a. */
static void elem_range(const ct_optim *o, size_t a, size_t n, float *w, const float *g, float *s0,
                       float *s1, float lr, long step) {
  const ct_optim_hp *hp = &o->hp;
  switch (o->kind) {
    case CT_OPTIM_ADAMW:
    case CT_OPTIM_ADAM:
      adam_call(o, n, w, g, s0, s1, lr, hp->weight_decay, o->kind == CT_OPTIM_ADAMW, step);
      break;
    case CT_OPTIM_ADAGRAD:
      ct_optim_adagrad_slice(o->be, n, w, g, s0, lr, hp->adagrad_lr_decay, hp->eps,
                             hp->weight_decay, step);
      break;
    case CT_OPTIM_LION:
      ct_optim_lion_slice(o->be, n, w, g, s0, lr, hp->beta1, hp->beta2, hp->weight_decay);
      break;
    case CT_OPTIM_SGD:
      ct_optim_sgd_slice(o->be, n, w, g, s0, lr, hp->momentum, hp->dampening, hp->nesterov,
                         hp->weight_decay, step);
      break;
    case CT_OPTIM_MUADAM:
    case CT_OPTIM_MUADAMW:
    case CT_OPTIM_MUSGD:
      for (size_t i = 0; i < o->nt;) {
        double flr, fwd, f2, w2;
        mup_factors(o->kind, &o->t[i], &flr, &fwd);
        size_t j = i + 1, ta = o->t[i].offset, len = o->t[i].numel;
        while (j < o->nt) { /* a run with the same factors */
          mup_factors(o->kind, &o->t[j], &f2, &w2);
          if (f2 != flr || w2 != fwd) break;
          len += o->t[j++].numel;
        }
        i = j;
        size_t lo = ta > a ? ta : a, hi = ta + len < a + n ? ta + len : a + n;
        if (lo >= hi) continue;
        const size_t d = lo - a, cnt = hi - lo;
        const float tlr = (float)((double)lr * flr), twd = (float)((double)hp->weight_decay * fwd);
        if (o->kind == CT_OPTIM_MUSGD)
          ct_optim_sgd_slice(o->be, cnt, w + d, g + d, s0 ? s0 + d : NULL, tlr, hp->momentum,
                             hp->dampening, hp->nesterov, twd, step);
        else
          adam_call(o, cnt, w + d, g + d, s0 + d, s1 + d, tlr, twd, o->kind == CT_OPTIM_MUADAMW,
                    step);
      }
      break;
    default:
      break;
  }
}

static ct_status step_check(const ct_optim *o, float lr, long step, ct_err *err) {
  if (!isfinite(lr) || lr < 0)
    return ct_errf(err, CT_ERR_INVALID, "%s: learning rate %g must be finite and >= 0",
                   ct_optim_kind_name(o->kind), lr);
  if (step < 1)
    return ct_errf(err, CT_ERR_INVALID, "%s: step %ld must be >= 1 (1-based)",
                   ct_optim_kind_name(o->kind), step);
  return CT_OK;
}

ct_status ct_optim_step(ct_optim *o, float *w, const float *g, float lr, long step, ct_err *err) {
  ct_status st = step_check(o, lr, step, err);
  if (st) return st;
  if (!o->n) return CT_OK;
  if (!w || !g)
    return ct_errf(err, CT_ERR_INVALID, "%s: NULL parameters or gradients",
                   ct_optim_kind_name(o->kind));
  if (o->nstate && !o->state_block)
    return ct_errf(err, CT_ERR_INVALID, "%s: the state lives elsewhere (offloaded); step slices",
                   ct_optim_kind_name(o->kind));
  const ct_optim_hp *hp = &o->hp;
  float *s0 = o->nstate > 0 ? o->state_block : NULL;
  float *s1 = o->nstate > 1 ? o->state_block + o->stride : NULL;
  switch (o->kind) {
    case CT_OPTIM_LAMB:
      for (size_t i = 0; i < o->nt; i++) {
        size_t a = o->t[i].offset;
        if (o->t[i].numel)
          ct_optim_lamb_tensor(o->t[i].numel, w + a, g + a, s0 + a, s1 + a, lr, hp,
                               ct_optim_bc_step(hp, step));
      }
      break;
    case CT_OPTIM_MUON: {
      const float alr = (float)((double)lr * (double)hp->muon_adamw_lr);
      for (size_t i = 0; i < o->nt;) {
        const ct_optim_tensor *t = &o->t[i];
        size_t a = t->offset;
        if (muon_2d(t)) {
          ct_optim_muon_tensor(t->rows, t->cols, w + a, g + a, s0 + a, lr, hp, o->ns);
          i++;
          continue;
        }
        size_t j = i, len = 0; /* a run of AdamW tensors */
        while (j < o->nt && !muon_2d(&o->t[j])) len += o->t[j++].numel;
        adam_call(o, len, w + a, g + a, s0 + a, s1 + a, alr, hp->weight_decay, 1, step);
        i = j;
      }
      break;
    }
    default:
      elem_range(o, 0, o->n, w, g, s0, s1, lr, step);
      break;
  }
  return CT_OK;
}

ct_status ct_optim_step_slice(ct_optim *o, size_t a, size_t n, float *w, const float *g,
                              float *const *states, float lr, long step, ct_err *err) {
  ct_status st = step_check(o, lr, step, err);
  if (st) return st;
  if (!(rows[o->kind].flags & CT_OPTIM_CAN_OFFLOAD))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s updates whole tensors and cannot step a slice (offload needs an "
                   "elementwise optimizer: AdamW, Adam, Adagrad, Lion, SGD or a Mu* kind)",
                   ct_optim_kind_name(o->kind));
  if (a > o->n || n > o->n - a)
    return ct_errf(err, CT_ERR_RANGE, "slice [%zu, %zu) outside the optimizer's %zu floats", a,
                   a + n, o->n);
  if (!n) return CT_OK;
  elem_range(o, a, n, w, g, o->nstate > 0 ? states[0] : NULL, o->nstate > 1 ? states[1] : NULL, lr,
             step);
  return CT_OK;
}

ct_status ct_optim_set_backend(ct_optim *o, const ct_backend_ops *be, ct_err *err) {
  if (!be) be = ct_backend_default();
  if (be == o->be) return CT_OK;
  static const struct {
    ct_optim_kind k;
    const char *op;
  } elem[] = {{CT_OPTIM_ADAMW, "adam_update"},
              {CT_OPTIM_ADAM, "adam_update"},
              {CT_OPTIM_ADAGRAD, "adagrad_update"},
              {CT_OPTIM_LION, "lion_update"},
              {CT_OPTIM_SGD, "sgd_update"}};
  const char *op = NULL;
  for (size_t i = 0; i < sizeof elem / sizeof elem[0]; i++)
    if (elem[i].k == o->kind) op = elem[i].op;
  if (!be->host_memory && !op)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "optimizer %s does not run on compute backend %s (its per-tensor rules read the "
                   "weights on the host); use AdamW, Adam, Lion, SGD or Adagrad there",
                   ct_optim_kind_name(o->kind), be->name);
  const char *lacks = op ? ct_backend_lacks(be, op) : NULL;
  if (lacks)
    return ct_errf(err, CT_ERR_UNSUPPORTED, "optimizer %s: compute backend %s has no %s",
                   ct_optim_kind_name(o->kind), be->name, lacks);
  ct_status st = ct_backend_move(o->be, be, CT_MEM_OPTIMIZER, o->nstate * o->stride * sizeof(float),
                                 (void **)&o->state_block, err);
  if (!st) o->be = be;
  return st;
}

const ct_backend_ops *ct_optim_backend(const ct_optim *o) {
  return o->be;
}

void ct_optim_release_state(ct_optim *o) {
  o->be->free(o->state_block);
  o->state_block = NULL;
}

/* Learning-rate schedules: diffusers' get_scheduler lambdas, SimpleTuner's own
 * cosine and sine, and DeepSpeed's WarmupLR / WarmupDecayLR, as pure
 * functions of the number of completed scheduler steps.
 *
 * diffusers kinds are LambdaLR(lr_lambda): the lr for the optimizer step after
 * `done` scheduler.step() calls is lr * lambda(done). DeepSpeed's schedulers
 * set lr at construction with last_batch_iteration = -1 (= warmup_min_lr) and
 * each step() increments it, so after `done` calls the iteration is done - 1.
 * Formulas and edge cases: docs/optimizers.md. Nothing here keeps state.
 */
#include <ctype.h>
#include <math.h>
#include <string.h>

#include "ctuner/optim.h"

static const char *const sched_names[] = {
#define CT_X(id, name) name,
    CT_SCHED_MAP(CT_X)
#undef CT_X
};

const char *ct_sched_kind_name(ct_sched_kind k) {
  return (unsigned)k < CT_SCHED_NKINDS ? sched_names[k] : "unknown";
}

/* Lower case without '-' and '_', so "warmup_decay_lr" finds WarmupDecayLR. */
static void squash(const char *s, char *out, size_t cap) {
  size_t o = 0;
  for (; *s && o + 1 < cap; s++)
    if (*s != '-' && *s != '_') out[o++] = (char)tolower((unsigned char)*s);
  out[o] = 0;
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
      int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[lb];
}

static const struct {
  const char *name, *why;
} unsupported[] = {
    {"cosine_with_restarts",
     "SimpleTuner's cosine_with_restarts keeps the learning rate constant (its cycle position is "
     "step % steps_per_epoch with steps_per_epoch -1, always 0; SimpleTuner warns that it "
     "misbehaves); use 'constant' for what it does, or 'cosine' / 'sine'"},
    {"cosine_with_hard_restarts", "not implemented; use 'diffusers_cosine' with lr_num_cycles"},
    {"inverse_sqrt", "not implemented; use 'polynomial' with lr_power 0.5"},
    {"reduce_lr_on_plateau", "it needs the validation loss; not implemented"},
    {"piecewise_constant", "not implemented"},
    {"WarmupCosineLR", "DeepSpeed's WarmupCosineLR is not implemented; use 'cosine'"},
    {"OneCycle", "DeepSpeed's OneCycle is not implemented"},
    {"LRRangeTest", "DeepSpeed's LRRangeTest is not implemented"},
};

ct_status ct_sched_kind_parse(const char *s, ct_sched_kind *out, ct_err *err) {
  char in[64], nn[64];
  if (!s || !*s) return ct_errf(err, CT_ERR_INVALID, "empty lr_scheduler name");
  squash(s, in, sizeof in);
  for (int k = 0; k < CT_SCHED_NKINDS; k++) {
    squash(sched_names[k], nn, sizeof nn);
    if (!strcmp(in, nn)) {
      *out = (ct_sched_kind)k;
      return CT_OK;
    }
  }
  for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
    squash(unsupported[i].name, nn, sizeof nn);
    if (!strcmp(in, nn))
      return ct_errf(err, CT_ERR_UNSUPPORTED, "lr_scheduler '%s' is not supported: %s", s,
                     unsupported[i].why);
  }
  int best = 0, bd = 1 << 30;
  char choices[256] = "";
  for (int k = 0; k < CT_SCHED_NKINDS; k++) {
    squash(sched_names[k], nn, sizeof nn);
    int d = edit_distance(in, nn);
    if (d < bd) {
      bd = d;
      best = k;
    }
    if (k) strcat(choices, ", ");
    strcat(choices, sched_names[k]);
  }
  return ct_errf(err, CT_ERR_INVALID, "unknown lr_scheduler '%s'; did you mean '%s'? (choices: %s)",
                 s, sched_names[best], choices);
}

void ct_sched_default(ct_sched_kind k, double lr, ct_sched *s) {
  memset(s, 0, sizeof *s);
  s->kind = k;
  s->lr = lr;
  s->num_cycles = 0.5;
  s->lr_end = 1e-7;
  s->power = 1.0;
  s->warmup_min_lr = 0.0;
  s->warmup_max_lr = lr;
  s->warmup_num_steps = 1000;
  s->warmup_log = 1;
}

static int nonneg(double x) {
  return isfinite(x) && x >= 0;
}

ct_status ct_sched_validate(const ct_sched *s, ct_err *err) {
  if ((unsigned)s->kind >= CT_SCHED_NKINDS)
    return ct_errf(err, CT_ERR_INVALID, "invalid lr_scheduler kind %d", (int)s->kind);
  const char *kn = sched_names[s->kind];
  if (!nonneg(s->lr))
    return ct_errf(err, CT_ERR_INVALID, "%s: lr (learning_rate) = %g must be finite and >= 0", kn,
                   s->lr);
  switch (s->kind) {
    case CT_SCHED_CONSTANT:
      break;
    case CT_SCHED_COSINE:
    case CT_SCHED_SINE:
      if (s->warmup_steps < 0 || (s->kind == CT_SCHED_SINE && s->warmup_steps == 0))
        return ct_errf(err, CT_ERR_INVALID,
                       "%s: warmup_steps (lr_warmup_steps) = %ld is SimpleTuner's period of the "
                       "wave and must be %s",
                       kn, s->warmup_steps,
                       s->kind == CT_SCHED_SINE ? "> 0 (SimpleTuner's Sine refuses 0)"
                                                : ">= 0 (0: 1000 steps, as SimpleTuner)");
      if (!nonneg(s->lr_end) || s->lr_end > s->lr)
        return ct_errf(err, CT_ERR_INVALID, "%s: lr_end (%g) must be >= 0 and <= lr (%g)", kn,
                       s->lr_end, s->lr);
      break;
    case CT_SCHED_CONSTANT_WITH_WARMUP:
    case CT_SCHED_LINEAR:
    case CT_SCHED_DIFFUSERS_COSINE:
    case CT_SCHED_POLYNOMIAL:
      if (s->warmup_steps < 0)
        return ct_errf(err, CT_ERR_INVALID, "%s: warmup_steps (lr_warmup_steps) = %ld must be >= 0",
                       kn, s->warmup_steps);
      if (s->kind == CT_SCHED_CONSTANT_WITH_WARMUP) break;
      if (s->total_steps <= 0)
        return ct_errf(err, CT_ERR_INVALID, "%s: total_steps (max_train_steps) = %ld must be > 0",
                       kn, s->total_steps);
      if (s->kind == CT_SCHED_DIFFUSERS_COSINE && !nonneg(s->num_cycles))
        return ct_errf(err, CT_ERR_INVALID,
                       "diffusers_cosine: num_cycles (lr_num_cycles) = %g must be >= 0",
                       s->num_cycles);
      if (s->kind == CT_SCHED_POLYNOMIAL) {
        if (!nonneg(s->power))
          return ct_errf(err, CT_ERR_INVALID, "polynomial: power (lr_power) = %g must be >= 0",
                         s->power);
        if (!nonneg(s->lr_end) || !(s->lr > s->lr_end))
          return ct_errf(err, CT_ERR_INVALID,
                         "polynomial: lr_end (%g) must be >= 0 and smaller than lr (%g)", s->lr_end,
                         s->lr);
        if (s->total_steps <= s->warmup_steps)
          return ct_errf(err, CT_ERR_INVALID,
                         "polynomial: total_steps (%ld) must be larger than warmup_steps (%ld)",
                         s->total_steps, s->warmup_steps);
      }
      break;
    case CT_SCHED_WARMUP_LR:
    case CT_SCHED_WARMUP_DECAY_LR:
      if (!nonneg(s->warmup_min_lr))
        return ct_errf(err, CT_ERR_INVALID, "%s: warmup_min_lr = %g must be finite and >= 0", kn,
                       s->warmup_min_lr);
      if (!nonneg(s->warmup_max_lr))
        return ct_errf(err, CT_ERR_INVALID, "%s: warmup_max_lr = %g must be finite and >= 0", kn,
                       s->warmup_max_lr);
      if (s->warmup_num_steps < 0)
        return ct_errf(err, CT_ERR_INVALID, "%s: warmup_num_steps = %ld must be >= 0", kn,
                       s->warmup_num_steps);
      if (s->kind == CT_SCHED_WARMUP_DECAY_LR && s->total_num_steps <= 0)
        return ct_errf(err, CT_ERR_INVALID, "WarmupDecayLR: total_num_steps = %ld must be > 0",
                       s->total_num_steps);
      break;
    default:
      break;
  }
  return CT_OK;
}

static double warmup(long step, long w) {
  return (double)step / (double)(w > 1 ? w : 1);
}

double ct_sched_lr(const ct_sched *s, long done) {
  const long W = s->warmup_steps, T = s->total_steps, st = done;
  double f = 1.0;
  switch (s->kind) {
    case CT_SCHED_CONSTANT:
      break;
    case CT_SCHED_CONSTANT_WITH_WARMUP:
      f = st < W ? warmup(st, W) : 1.0;
      break;
    case CT_SCHED_LINEAR:
      if (st < W) {
        f = warmup(st, W);
      } else {
        f = (double)(T - st) / (double)(T - W > 1 ? T - W : 1);
        if (f < 0) f = 0;
      }
      break;
    case CT_SCHED_COSINE:
    case CT_SCHED_SINE: {
      /* SimpleTuner's Cosine/Sine under Accelerate: T_0 = W x processes and
       * the scheduler is stepped once per process per optimizer step, so the
       * phase after k steps is pi k / W on any world size. Its Cosine's cycle
       * position is -step (steps_per_epoch -1), so it never restarts: a
       * periodic cosine of half-period W. W = 0: Cosine takes T_0 = 1000. */
      const double per = W > 0 ? (double)W : 1000.0, x = M_PI * (double)st / per;
      const double d = s->lr - s->lr_end; /* the operations in SimpleTuner's order */
      const double lr = s->kind == CT_SCHED_COSINE ? s->lr_end + d * (1.0 + cos(x)) / 2
                                                   : s->lr_end + d * (0.5 * (1.0 + sin(x)));
      return floor(lr * 1e9) / 1e9; /* SimpleTuner truncates what it sets */
    }
    case CT_SCHED_DIFFUSERS_COSINE:
      if (st < W) {
        f = warmup(st, W);
      } else {
        double progress = (double)(st - W) / (double)(T - W > 1 ? T - W : 1);
        f = 0.5 * (1.0 + cos(M_PI * s->num_cycles * 2.0 * progress));
        if (f < 0) f = 0;
      }
      break;
    case CT_SCHED_POLYNOMIAL:
      if (st < W) {
        f = warmup(st, W);
      } else if (st > T) {
        return s->lr_end;
      } else {
        double range = s->lr - s->lr_end, decay_steps = (double)(T - W);
        double pct = 1.0 - (double)(st - W) / decay_steps;
        return range * pow(pct, s->power) + s->lr_end;
      }
      break;
    case CT_SCHED_WARMUP_LR:
    case CT_SCHED_WARMUP_DECAY_LR: {
      const long it = done - 1; /* DeepSpeed's last_batch_iteration */
      const double lo = s->warmup_min_lr, hi = s->warmup_max_lr;
      if (it < 0) return lo;
      const long wn = s->warmup_num_steps > 2 ? s->warmup_num_steps : 2;
      double gamma;
      if (it < wn) {
        gamma = s->warmup_log ? log((double)(it + 1)) / log((double)wn) : (double)it / (double)wn;
      } else if (s->kind == CT_SCHED_WARMUP_LR) {
        gamma = 1.0;
      } else {
        const long tn = s->total_num_steps, span = tn - wn;
        gamma = (double)(tn - it) / (span > 1 ? (double)span : 1.0);
        if (gamma < 0) gamma = 0;
      }
      return lo + (hi - lo) * gamma;
    }
    default:
      return 0.0;
  }
  return s->lr * f;
}

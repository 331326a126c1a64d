/* SimpleTuner's optimizer names and the settings it runs them with
 * (ctuner/optim.h, "SimpleTuner's optimizer names"; docs/optimizers.md).
 *
 * SimpleTuner builds an optimizer from its table optimizer_choices
 * (simpletuner/helpers/training/optimizer_param.py, read at commit 06b96af;
 * the line of each row is given below): the row's default_settings, then
 * convert_arg_to_parameters(args) (line 728): optimizer_config's
 * "k=v,k=v" pairs when set, else betas from optimizer_beta1/optimizer_beta2
 * when both are set; arguments its class does not take are dropped with a
 * warning (_sanitize_optimizer_kwargs). The adam_* keys reach an optimizer
 * only through a DeepSpeed optimizer block (determine_optimizer_class_with_config),
 * never for these names. Each preset below is such a row for a name ctuner
 * runs; the names SimpleTuner has and ctuner does not run are refused by the
 * registry (optim.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "optim_int.h"

#define BETAS CT_OPTIM_SET_BETAS
#define EPS CT_OPTIM_SET_EPS
#define WD CT_OPTIM_SET_WD
#define MOM CT_OPTIM_SET_MOMENTUM
#define DAMP CT_OPTIM_SET_DAMPENING
#define NEST CT_OPTIM_SET_NESTEROV
#define LRD CT_OPTIM_SET_LR_DECAY
#define ACC CT_OPTIM_SET_INIT_ACC
#define ADAM_TAKES (BETAS | EPS | WD)
#define SGD_TAKES (MOM | DAMP | NEST | WD)
#define ADAGRAD_TAKES (LRD | ACC | EPS | WD)
#define LION_TAKES (BETAS | WD)

/* {name, source, set, takes, beta1, beta2, eps, weight_decay, momentum,
 *  dampening, lr_decay, initial_accumulator, nesterov, adamw_bf16} */
static const ct_optim_preset PRESETS[] = {
    /* torch.optim (optimizer_param.py:83, 93, 103, 142) */
    {"torch-adam", "optimizer_param.py:83", ADAM_TAKES, ADAM_TAKES, 0.9f, 0.999f, 1e-8f, 0, 0, 0, 0,
     0, 0, 0},
    {"torch-adamw", "optimizer_param.py:93", ADAM_TAKES, ADAM_TAKES, 0.9f, 0.999f, 1e-8f, 1e-2f, 0,
     0, 0, 0, 0, 0},
    {"torch-sgd", "optimizer_param.py:103", MOM | WD | DAMP | NEST, SGD_TAKES, 0, 0, 0, 0, 0, 0, 0,
     0, 0, 0},
    {"torch-adagrad", "optimizer_param.py:142", LRD | WD | EPS, ADAGRAD_TAKES, 0, 0, 1e-10f, 0, 0,
     0, 0, 0, 0, 0},
    /* SimpleTuner's AdamWBF16 (optimizer_param.py:197; the class ignores its
     * own eps default 1e-8: the table passes 1e-6) */
    {"adamw_bf16", "optimizer_param.py:197", ADAM_TAKES, ADAM_TAKES, 0.9f, 0.999f, 1e-6f, 1e-2f, 0,
     0, 0, 0, 0, 1},
    /* torch-optimi (optimizer_param.py:296, 308, 363, 376); kahan_sum only
     * compensates bf16 parameters, which ctuner steps in float32 */
    {"optimi-adamw", "optimizer_param.py:296", ADAM_TAKES, ADAM_TAKES, 0.9f, 0.99f, 1e-6f, 0, 0, 0,
     0, 0, 0, 0},
    {"optimi-lion", "optimizer_param.py:308", BETAS | WD, LION_TAKES, 0.9f, 0.99f, 0, 0, 0, 0, 0, 0,
     0, 0},
    {"optimi-adam", "optimizer_param.py:363", ADAM_TAKES, ADAM_TAKES, 0.9f, 0.99f, 1e-6f, 0, 0, 0,
     0, 0, 0, 0},
    {"optimi-sgd", "optimizer_param.py:376", MOM | WD | DAMP, SGD_TAKES, 0, 0, 0, 0, 0, 0, 0, 0, 0,
     0},
    /* bitsandbytes, 32-bit states (optimizer_param.py:494, 518, 542, 560, 578, 596) */
    {"bnb-adagrad", "optimizer_param.py:494", LRD | WD | ACC | EPS, ADAGRAD_TAKES, 0, 0, 1e-10f, 0,
     0, 0, 0, 0, 0, 0},
    {"bnb-adam", "optimizer_param.py:518", ADAM_TAKES, ADAM_TAKES, 0.9f, 0.999f, 1e-8f, 0, 0, 0, 0,
     0, 0, 0},
    {"bnb-adamw", "optimizer_param.py:542", ADAM_TAKES, ADAM_TAKES, 0.9f, 0.999f, 1e-6f, 1e-2f, 0,
     0, 0, 0, 0, 0},
    {"bnb-adamw-paged", "optimizer_param.py:560", ADAM_TAKES, ADAM_TAKES, 0.9f, 0.999f, 1e-6f,
     1e-2f, 0, 0, 0, 0, 0, 0},
    {"bnb-lion", "optimizer_param.py:578", BETAS | WD, LION_TAKES, 0.9f, 0.99f, 0, 0, 0, 0, 0, 0, 0,
     0},
    {"bnb-lion-paged", "optimizer_param.py:596", BETAS | WD, LION_TAKES, 0.9f, 0.99f, 0, 0, 0, 0, 0,
     0, 0, 0},
};
#define NPRESETS (sizeof PRESETS / sizeof PRESETS[0])

const ct_optim_preset *ct_optim_presets(size_t *n) {
  *n = NPRESETS;
  return PRESETS;
}

const ct_optim_preset *ct_optim_preset_of(const char *name) {
  const ct_optim_info *r = name ? ct_optim_lookup(name, NULL) : NULL;
  if (!r) return NULL;
  for (size_t i = 0; i < NPRESETS; i++)
    if (!strcmp(PRESETS[i].name, r->name)) return &PRESETS[i];
  return NULL;
}

/* optimizer_config arguments of the classes above that ctuner runs as the
 * class does only at one value (SimpleTuner's default for the class), with
 * that value; any other value is refused. */
static const struct {
  const char *key;
  const char *value; /* "false", "true", "none", "100" */
  const char *what;
} FIXED[] = {
    {"amsgrad", "false", "AMSGrad"},
    {"decouple_lr", "false", "optimi's decouple_lr (weight decay independent of the lr)"},
    {"max_lr", "none", "optimi's max_lr"},
    {"decouple_wd", "false", "optimi's decoupled weight decay for Adam/SGD (use an AdamW name)"},
    {"torch_init", "false", "optimi's torch_init"},
    {"percentile_clipping", "100", "bitsandbytes' percentile clipping"},
    {"gradient_release", "false", "optimi's gradient release"},
    {"foreach", NULL, NULL},       /* a torch kernel choice: any value, no effect */
    {"kahan_sum", NULL, NULL},     /* compensates bf16 parameters: ctuner steps float32 */
    {"min_8bit_size", NULL, NULL}, /* 8-bit states for big tensors only: ctuner's are float32 */
    {"fused", NULL, NULL},
};

/* SimpleTuner's parse of one optimizer_config value (convert_arg_to_parameters,
 * optimizer_param.py:734-747): '.' -> float, digits -> int, true/false,
 * none, "e-" -> float, else the string. *num gets the number of a number or
 * bool (1/0); returns 'n' (number), 'b' (bool), 'z' (None) or 's'. */
static int st_value(const char *v, double *num) {
  if (strchr(v, '.') || (strstr(v, "e-"))) {
    char *end;
    *num = strtod(v, &end);
    return *end || end == v ? 's' : 'n'; /* SimpleTuner's float() would raise: refused below */
  }
  if (*v && strspn(v, "0123456789") == strlen(v)) {
    *num = strtod(v, NULL);
    return 'n';
  }
  if (!strcasecmp(v, "true")) return *num = 1, 'b';
  if (!strcasecmp(v, "false")) return *num = 0, 'b';
  if (!strcasecmp(v, "none")) return 'z';
  return 's';
}

static void note_dropped(char *out, size_t cap, const char *key, size_t kl) {
  if (!out || !cap) return;
  const size_t n = strlen(out);
  snprintf(out + n, cap - n, "%s%.*s", n ? "," : "", (int)kl, key);
}

ct_status ct_optim_preset_hp(const ct_optim_preset *p, ct_optim_kind kind,
                             const char *optimizer_config, const float *betas, ct_optim_hp *hp,
                             char *dropped, size_t dropped_cap, ct_err *err) {
  ct_optim_hp_default(kind, hp);
  if (dropped && dropped_cap) dropped[0] = 0;
  if (p->set & BETAS) hp->beta1 = p->beta1, hp->beta2 = p->beta2;
  if (p->set & EPS) hp->eps = p->eps;
  if (p->set & WD) hp->weight_decay = p->weight_decay;
  if (p->set & MOM) hp->momentum = p->momentum;
  if (p->set & DAMP) hp->dampening = p->dampening;
  if (p->set & NEST) hp->nesterov = p->nesterov;
  if (p->set & LRD) hp->adagrad_lr_decay = p->lr_decay;
  if (p->set & ACC) hp->adagrad_initial_accumulator = p->initial_accumulator;
  hp->adamw_bf16 = p->adamw_bf16;
  if (!optimizer_config || !*optimizer_config) {
    if (betas) {
      if (!(p->takes & BETAS)) {
        note_dropped(dropped, dropped_cap, "betas", 5);
      } else {
        hp->beta1 = betas[0];
        hp->beta2 = betas[1];
      }
    }
    return CT_OK;
  }
  /* "k=v,k=v": split on ',' then '=' as SimpleTuner does (a value cannot hold a comma) */
  for (const char *s = optimizer_config; *s;) {
    const size_t len = strcspn(s, ",");
    char item[256], *eq;
    if (len >= sizeof item)
      return ct_errf(err, CT_ERR_INVALID, "optimizer_config: '%.40s...' is too long", s);
    memcpy(item, s, len);
    item[len] = 0;
    s += len + (s[len] == ',');
    if (!(eq = strchr(item, '=')))
      return ct_errf(err, CT_ERR_INVALID,
                     "optimizer_config: '%s' is not key=value (SimpleTuner's parser fails on it)",
                     item);
    *eq = 0;
    const char *k = item, *v = eq + 1;
    double x = 0;
    const int t = st_value(v, &x);
    static const struct {
      const char *key;
      unsigned bit;
    } NUMERIC[] = {{"eps", EPS},
                   {"weight_decay", WD},
                   {"momentum", MOM},
                   {"dampening", DAMP},
                   {"nesterov", NEST},
                   {"lr_decay", LRD},
                   {"initial_accumulator_value", ACC}};
    unsigned bit = 0;
    for (size_t i = 0; i < sizeof NUMERIC / sizeof NUMERIC[0]; i++)
      if (!strcmp(k, NUMERIC[i].key)) bit = NUMERIC[i].bit;
    if (!strcmp(k, "betas"))
      return ct_errf(err, CT_ERR_INVALID,
                     "optimizer_config: betas cannot be written there (SimpleTuner splits the "
                     "value on its commas); set optimizer_beta1 and optimizer_beta2 instead");
    if (bit) {
      if (!(p->takes & bit)) { /* SimpleTuner drops what the class does not take */
        note_dropped(dropped, dropped_cap, k, strlen(k));
        continue;
      }
      if ((t != 'n' && t != 'b') || !isfinite(x))
        return ct_errf(err, CT_ERR_INVALID, "optimizer_config: %s=%s is not a number", k, v);
      switch (bit) {
        case EPS:
          hp->eps = (float)x;
          break;
        case WD:
          hp->weight_decay = (float)x;
          break;
        case MOM:
          hp->momentum = (float)x;
          break;
        case DAMP:
          hp->dampening = (float)x;
          break;
        case NEST:
          hp->nesterov = x != 0;
          break;
        case LRD:
          hp->adagrad_lr_decay = (float)x;
          break;
        default:
          hp->adagrad_initial_accumulator = (float)x;
          break;
      }
      continue;
    }
    size_t f = 0;
    while (f < sizeof FIXED / sizeof FIXED[0] && strcmp(FIXED[f].key, k)) f++;
    if (f == sizeof FIXED / sizeof FIXED[0])
      return ct_errf(err, CT_ERR_UNSUPPORTED,
                     "optimizer_config: %s is not an argument ctuner implements for %s (it takes "
                     "eps, weight_decay, momentum, dampening, nesterov, lr_decay, "
                     "initial_accumulator_value where the class has them)",
                     k, p->name);
    if (!FIXED[f].value) { /* no effect on float32 state and weights */
      note_dropped(dropped, dropped_cap, k, strlen(k));
      continue;
    }
    double want = 0;
    const int tw = st_value(FIXED[f].value, &want);
    if (t != tw || ((t == 'n' || t == 'b') && x != want))
      return ct_errf(err, CT_ERR_UNSUPPORTED,
                     "optimizer_config: %s=%s: %s is not implemented (only %s=%s)", k, v,
                     FIXED[f].what, k, FIXED[f].value);
  }
  return CT_OK;
}

void ct_optim_preset_describe(const ct_optim_preset *p, const ct_optim_hp *hp, char *out,
                              size_t cap) {
  size_t n = 0;
  if (cap) out[0] = 0;
#define PUT(...)                                                            \
  do {                                                                      \
    int w_ = snprintf(out + n, cap > n ? cap - n : 0, "%s", n ? ", " : ""); \
    if (w_ > 0) n += (size_t)w_;                                            \
    w_ = snprintf(out + n, cap > n ? cap - n : 0, __VA_ARGS__);             \
    if (w_ > 0) n += (size_t)w_;                                            \
  } while (0)
  if (p->takes & BETAS) PUT("betas %g/%g", hp->beta1, hp->beta2);
  if (p->takes & EPS) PUT("eps %g", hp->eps);
  PUT("weight_decay %g", hp->weight_decay);
  if (p->takes & MOM) PUT("momentum %g", hp->momentum);
  if (p->takes & DAMP) PUT("dampening %g", hp->dampening);
  if (p->takes & NEST) PUT("nesterov %s", hp->nesterov ? "true" : "false");
  if (p->takes & LRD) PUT("lr_decay %g", hp->adagrad_lr_decay);
  if (p->takes & ACC) PUT("initial_accumulator_value %g", hp->adagrad_initial_accumulator);
  if (hp->adamw_bf16) PUT("AdamWBF16's bias correction");
#undef PUT
}

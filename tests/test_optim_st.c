/* SimpleTuner's optimizer names (issue 32; ctuner/optim.h "SimpleTuner's
 * optimizer names", docs/optimizers.md): every name of SimpleTuner's
 * optimizer_choices either runs with SimpleTuner's own settings or is
 * refused by name. The expected settings below are transcribed from
 * simpletuner/helpers/training/optimizer_param.py (commit 06b96af, the line
 * of each row given) independently of src/optim/optim_st.c, and checked
 * through the function the trainer builds its optimizer with
 * (ct_train_optim_hp), with every adam_* key set to something else: they
 * must not reach these names, and each draws one warning. Then
 * optimizer_config and optimizer_beta1/2 as SimpleTuner reads them,
 * AdamWBF16's update, and adamw_bf16 on a quantised LoRA base. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ctuner/config.h"
#include "ctuner/optim.h"
#include "harness.h"
#include "train/train_int.h"

/* One row of SimpleTuner's table as ctuner must run it. */
typedef struct st_row {
  const char *name;
  int line; /* optimizer_param.py */
  ct_optim_kind kind;
  float beta1, beta2, eps, wd, momentum, dampening;
  int nesterov;
  float lr_decay, init_acc;
  int adamw_bf16;
} st_row;

/* kind defaults for fields a class does not take (Lion's eps, SGD's betas)
 * are ct_optim_hp_default's: compared only where the class has them */
static const st_row ROWS[] = {
    {"torch-adam", 83, CT_OPTIM_ADAM, 0.9f, 0.999f, 1e-8f, 0.0f, 0, 0, 0, 0, 0, 0},
    {"torch-adamw", 93, CT_OPTIM_ADAMW, 0.9f, 0.999f, 1e-8f, 1e-2f, 0, 0, 0, 0, 0, 0},
    {"torch-sgd", 103, CT_OPTIM_SGD, 0, 0, 0, 0.0f, 0.0f, 0.0f, 0, 0, 0, 0},
    {"torch-adagrad", 142, CT_OPTIM_ADAGRAD, 0, 0, 1e-10f, 0.0f, 0, 0, 0, 0.0f, 0.0f, 0},
    {"adamw_bf16", 197, CT_OPTIM_ADAMW, 0.9f, 0.999f, 1e-6f, 1e-2f, 0, 0, 0, 0, 0, 1},
    {"optimi-adamw", 296, CT_OPTIM_ADAMW, 0.9f, 0.99f, 1e-6f, 0.0f, 0, 0, 0, 0, 0, 0},
    {"optimi-lion", 308, CT_OPTIM_LION, 0.9f, 0.99f, 0, 0.0f, 0, 0, 0, 0, 0, 0},
    {"optimi-adam", 363, CT_OPTIM_ADAM, 0.9f, 0.99f, 1e-6f, 0.0f, 0, 0, 0, 0, 0, 0},
    {"optimi-sgd", 376, CT_OPTIM_SGD, 0, 0, 0, 0.0f, 0.0f, 0.0f, 0, 0, 0, 0},
    {"bnb-adagrad", 494, CT_OPTIM_ADAGRAD, 0, 0, 1e-10f, 0.0f, 0, 0, 0, 0.0f, 0.0f, 0},
    {"bnb-adam", 518, CT_OPTIM_ADAM, 0.9f, 0.999f, 1e-8f, 0.0f, 0, 0, 0, 0, 0, 0},
    {"bnb-adamw", 542, CT_OPTIM_ADAMW, 0.9f, 0.999f, 1e-6f, 1e-2f, 0, 0, 0, 0, 0, 0},
    {"bnb-adamw-paged", 560, CT_OPTIM_ADAMW, 0.9f, 0.999f, 1e-6f, 1e-2f, 0, 0, 0, 0, 0, 0},
    {"bnb-lion", 578, CT_OPTIM_LION, 0.9f, 0.99f, 0, 0.0f, 0, 0, 0, 0, 0, 0},
    {"bnb-lion-paged", 596, CT_OPTIM_LION, 0.9f, 0.99f, 0, 0.0f, 0, 0, 0, 0, 0, 0},
};
#define NROWS (sizeof ROWS / sizeof ROWS[0])

/* The rest of SimpleTuner's optimizer_choices (and its removed names):
 * refused by name. muon is SimpleTuner's MuonClip and ctuner's own Muon:
 * accepted with a warning (optim_st.muon_is_named). */
static const char *const REFUSED[] = {
    "torch-radam",
    "torch-nadam",
    "torch-rmsprop",
    "torch-adadelta",
    "torch-adafactor",
    "torch-adamax",
    "torch-asgd",
    "torch-sparseadam",
    "ao-adamw8bit",
    "ao-adamw4bit",
    "ao-adamfp8",
    "ao-adamwfp8",
    "adamw_schedulefree",
    "adamw_schedulefree+aggressive",
    "adamw_schedulefree+no_kahan",
    "optimi-stableadamw",
    "optimi-radam",
    "optimi-ranger",
    "optimi-adan",
    "soap",
    "bnb-adagrad8bit",
    "bnb-adam8bit",
    "bnb-adamw8bit",
    "bnb-adamw8bit-paged",
    "bnb-lion8bit",
    "bnb-lion8bit-paged",
    "bnb-ademamix",
    "bnb-ademamix8bit",
    "bnb-ademamix-paged",
    "bnb-ademamix8bit-paged",
    "prodigy",
    "adafactor",
    "dadaptation",
    "adamw8bit",
};

static void set(ct_config *c, const char *k, const char *v) {
  ct_err e = {0};
  if (ct_config_set(c, k, v, &e)) fprintf(stderr, "  set %s=%s: %s\n", k, v, e.msg);
}

/* Warnings of the config check naming key k. */
static int warnings_on(const ct_config_problems *p, const char *k) {
  int n = 0;
  for (size_t i = 0; i < p->n; i++) n += p->v[i].warning && !strcmp(p->v[i].key, k);
  return n;
}

CT_TEST(optim_st, every_simpletuner_name_runs_its_settings) {
  static const char *const ADAM_KEYS[][2] = {
      {"adam_beta1", "0.5"},         {"adam_beta2", "0.5"},
      {"adam_epsilon", "0.25"},      {"adam_weight_decay", "0.375"},
      {"optimizer_momentum", "0.5"}, {"optimizer_nesterov", "true"}};
  for (size_t i = 0; i < NROWS; i++) {
    const st_row *r = &ROWS[i];
    const ct_optim_preset *p = ct_optim_preset_of(r->name);
    REQUIRE(p != NULL);
    char line[32];
    snprintf(line, sizeof line, ":%d", r->line);
    CHECKF(strstr(p->source, line) != NULL, "%s: source %s, want line %d", r->name, p->source,
           r->line);
    for (int with_adam = 0; with_adam < 2; with_adam++) {
      ct_config c;
      ct_config_defaults(&c);
      set(&c, "optimizer", r->name);
      if (with_adam)
        for (size_t k = 0; k < sizeof ADAM_KEYS / sizeof ADAM_KEYS[0]; k++)
          set(&c, ADAM_KEYS[k][0], ADAM_KEYS[k][1]);
      const ct_optim_info *oi = ct_optim_lookup(c.optimizer, NULL);
      REQUIRE(oi != NULL);
      CHECKF(oi->kind == r->kind, "%s: kind %d, want %d", r->name, oi->kind, r->kind);
      ct_optim_hp hp;
      ct_train_optim_hp(&c, oi->kind, &hp);
      const int adam = r->kind == CT_OPTIM_ADAM || r->kind == CT_OPTIM_ADAMW;
      const int lion = r->kind == CT_OPTIM_LION, sgd = r->kind == CT_OPTIM_SGD;
      const int ada = r->kind == CT_OPTIM_ADAGRAD;
      if (adam || lion)
        CHECKF(hp.beta1 == r->beta1 && hp.beta2 == r->beta2, "%s (adam_* %d): betas %g/%g", r->name,
               with_adam, hp.beta1, hp.beta2);
      if (adam || ada)
        CHECKF(hp.eps == r->eps, "%s (adam_* %d): eps %g, want %g", r->name, with_adam, hp.eps,
               r->eps);
      CHECKF(hp.weight_decay == r->wd, "%s (adam_* %d): weight_decay %g, want %g", r->name,
             with_adam, hp.weight_decay, r->wd);
      if (sgd)
        CHECKF(hp.momentum == r->momentum && hp.dampening == r->dampening &&
                   hp.nesterov == r->nesterov,
               "%s (adam_* %d): momentum %g dampening %g nesterov %d", r->name, with_adam,
               hp.momentum, hp.dampening, hp.nesterov);
      if (ada)
        CHECKF(hp.adagrad_lr_decay == r->lr_decay && hp.adagrad_initial_accumulator == r->init_acc,
               "%s: lr_decay %g, initial accumulator %g", r->name, hp.adagrad_lr_decay,
               hp.adagrad_initial_accumulator);
      CHECKF(hp.adamw_bf16 == r->adamw_bf16 && hp.bias_correction_off == 0, "%s: bf16 %d", r->name,
             hp.adamw_bf16);
      CHECK(ct_optim_hp_validate(oi->kind, &hp, NULL) == CT_OK);
      /* one warning per adam_* key given: SimpleTuner never reads them for this name */
      ct_config_problems probs = {0};
      CHECKF(ct_config_check(&c, &probs) == CT_OK, "%s: %s", r->name,
             probs.n ? probs.v[0].msg : "");
      for (size_t k = 0; k < sizeof ADAM_KEYS / sizeof ADAM_KEYS[0]; k++) {
        const int n = warnings_on(&probs, ADAM_KEYS[k][0]);
        CHECKF(n == with_adam, "%s: %d warnings on %s", r->name, n, ADAM_KEYS[k][0]);
      }
      if (with_adam) {
        for (size_t k = 0; k < probs.n; k++)
          if (!strcmp(probs.v[k].key, "adam_epsilon"))
            CHECKF(strstr(probs.v[k].msg, "has no effect with optimizer") &&
                       strstr(probs.v[k].msg, p->source) &&
                       strstr(probs.v[k].msg, "optimizer_config"),
                   "%s", probs.v[k].msg);
      }
      ct_config_problems_free(&probs);
      ct_config_free(&c);
    }
  }
  /* ctuner's and DeepSpeed's names still read adam_* (no preset, no warning) */
  ct_config c;
  ct_config_defaults(&c);
  set(&c, "optimizer", "adamw");
  set(&c, "adam_epsilon", "0.25");
  CHECK(ct_config_optimizer_preset(&c, NULL) == NULL);
  ct_optim_hp hp;
  ct_train_optim_hp(&c, CT_OPTIM_ADAMW, &hp);
  CHECK(hp.eps == 0.25f && hp.adamw_bf16 == 0);
  ct_config_problems probs = {0};
  CHECK(ct_config_check(&c, &probs) == CT_OK && warnings_on(&probs, "adam_epsilon") == 0);
  ct_config_problems_free(&probs);
  ct_config_free(&c);
}

CT_TEST(optim_st, names_simpletuner_has_and_ctuner_lacks_are_refused) {
  for (size_t i = 0; i < sizeof REFUSED / sizeof REFUSED[0]; i++) {
    ct_err e = {0};
    CHECKF(ct_optim_lookup(REFUSED[i], &e) == NULL && e.status == CT_ERR_UNSUPPORTED &&
               strstr(e.msg, REFUSED[i]) && strstr(e.msg, "not supported"),
           "%s: %d %s", REFUSED[i], e.status, e.msg);
    CHECK(ct_optim_preset_of(REFUSED[i]) == NULL);
  }
  /* every preset is a row of the registry, and a row of the table above */
  size_t n;
  const ct_optim_preset *p = ct_optim_presets(&n);
  CHECK(n == NROWS);
  for (size_t i = 0; i < n; i++) {
    const ct_optim_info *oi = ct_optim_lookup(p[i].name, NULL);
    CHECKF(oi && !strcmp(oi->name, p[i].name), "%s is no registry row", p[i].name);
    int found = 0;
    for (size_t k = 0; k < NROWS; k++) found |= !strcmp(ROWS[k].name, p[i].name);
    CHECKF(found, "%s has no expected row", p[i].name);
  }
}

CT_TEST(optim_st, muon_is_named) {
  ct_config c;
  ct_config_defaults(&c);
  set(&c, "optimizer", "muon");
  ct_config_problems probs = {0};
  CHECK(ct_config_check(&c, &probs) == CT_OK && warnings_on(&probs, "optimizer") == 1);
  for (size_t i = 0; i < probs.n; i++)
    if (!strcmp(probs.v[i].key, "optimizer"))
      CHECKF(strstr(probs.v[i].msg, "MuonClip") && strstr(probs.v[i].msg, "ctuner's Muon"), "%s",
             probs.v[i].msg);
  ct_config_problems_free(&probs);
  ct_config_free(&c);
}

/* optimizer_config over the fixed settings, as convert_arg_to_parameters
 * reads it; optimizer_beta1/2 only both together and only without it. */
CT_TEST(optim_st, optimizer_config_and_betas) {
  static const struct {
    const char *opt, *oc, *b1, *b2;
    int error;            /* the config check refuses it */
    const char *warn_key; /* a warning on this key, or NULL */
    float beta1, beta2, eps, wd, momentum;
    int nesterov;
  } C[] = {
      {"adamw_bf16", "eps=1e-8,weight_decay=0", NULL, NULL, 0, NULL, 0.9f, 0.999f, 1e-8f, 0, 0, 0},
      {"optimi-adamw", "weight_decay=0.1", "0.8", "0.9", 0, "optimizer_beta1", 0.9f, 0.99f, 1e-6f,
       0.1f, 0, 0},
      {"optimi-adamw", NULL, "0.8", "0.95", 0, NULL, 0.8f, 0.95f, 1e-6f, 0, 0, 0},
      {"optimi-adamw", NULL, "0.8", NULL, 0, "optimizer_beta1", 0.9f, 0.99f, 1e-6f, 0, 0, 0},
      {"optimi-lion", "eps=1e-6,weight_decay=0.5", NULL, NULL, 0, "optimizer_config", 0.9f, 0.99f,
       0, 0.5f, 0, 0},
      {"optimi-lion", "kahan_sum=True,foreach=False", NULL, NULL, 0, "optimizer_config", 0.9f,
       0.99f, 0, 0, 0, 0},
      {"torch-sgd", "momentum=0.9,nesterov=true", NULL, NULL, 0, NULL, 0, 0, 0, 0, 0.9f, 1},
      {"torch-sgd", "nesterov=true", NULL, NULL, 1, NULL, 0, 0, 0, 0, 0, 0}, /* needs momentum */
      {"optimi-adam", "amsgrad=true", NULL, NULL, 1, NULL, 0, 0, 0, 0, 0, 0},
      {"optimi-adam", "amsgrad=false,decouple_lr=False", NULL, NULL, 0, NULL, 0.9f, 0.99f, 1e-6f, 0,
       0, 0},
      {"optimi-adam", "betas=0.9", NULL, NULL, 1, NULL, 0, 0, 0, 0, 0, 0},
      {"optimi-adam", "eps", NULL, NULL, 1, NULL, 0, 0, 0, 0, 0, 0},
      {"optimi-adam", "eps=tiny", NULL, NULL, 1, NULL, 0, 0, 0, 0, 0, 0},
      {"optimi-adam", "cautious=true", NULL, NULL, 1, NULL, 0, 0, 0, 0, 0, 0},
      {"adamw", "eps=1e-6", NULL, NULL, 1, NULL, 0, 0, 0, 0, 0, 0}, /* not SimpleTuner's name */
      {"adamw", NULL, "0.8", "0.9", 0, "optimizer_beta1", 0.9f, 0.999f, 1e-8f, 1e-2f, 0.9f, 0},
  };
  for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
    ct_config c;
    ct_config_defaults(&c);
    set(&c, "optimizer", C[i].opt);
    if (C[i].oc) set(&c, "optimizer_config", C[i].oc);
    if (C[i].b1) set(&c, "optimizer_beta1", C[i].b1);
    if (C[i].b2) set(&c, "optimizer_beta2", C[i].b2);
    ct_config_problems probs = {0};
    const ct_status st = ct_config_check(&c, &probs);
    CHECKF((st != CT_OK) == C[i].error, "case %zu (%s %s): st %d: %s", i, C[i].opt,
           C[i].oc ? C[i].oc : "", st, probs.n ? probs.v[0].msg : "");
    if (C[i].error) {
      CHECKF(probs.errors == 1 && (!strcmp(probs.v[0].key, "optimizer_config")), "case %zu: %s %s",
             i, probs.n ? probs.v[0].key : "", probs.n ? probs.v[0].msg : "");
    } else {
      CHECKF(C[i].warn_key ? warnings_on(&probs, C[i].warn_key) == 1 : probs.n == 0,
             "case %zu: %zu problems: %s", i, probs.n, probs.n ? probs.v[0].msg : "");
      const ct_optim_info *oi = ct_optim_lookup(c.optimizer, NULL);
      ct_optim_hp hp;
      ct_train_optim_hp(&c, oi->kind, &hp);
      if (oi->kind != CT_OPTIM_SGD)
        CHECKF(hp.beta1 == C[i].beta1 && hp.beta2 == C[i].beta2, "case %zu: betas %g/%g", i,
               hp.beta1, hp.beta2);
      if (oi->kind == CT_OPTIM_ADAM || oi->kind == CT_OPTIM_ADAMW)
        CHECKF(hp.eps == C[i].eps, "case %zu: eps %g", i, hp.eps);
      CHECKF(hp.weight_decay == C[i].wd && hp.momentum == C[i].momentum &&
                 hp.nesterov == C[i].nesterov,
             "case %zu: wd %g momentum %g nesterov %d", i, hp.weight_decay, hp.momentum,
             hp.nesterov);
    }
    ct_config_problems_free(&probs);
    ct_config_free(&c);
  }
}

/* AdamWBF16 (SimpleTuner's adamw_bf16, adamw_bfloat16/__init__.py _make_step):
 * w -= lr sqrt(1 - b2^t) m / (sqrt(v) + eps) after the decoupled decay,
 * the first moment uncorrected; 4 steps against that formula in double. */
CT_TEST(optim_st, adamw_bf16_update) {
  enum { N = 7, STEPS = 4 };
  float w[N], g[N];
  double rw[N], rm[N] = {0}, rv[N] = {0};
  for (int i = 0; i < N; i++) w[i] = (float)(0.3 * (i - 3)), rw[i] = w[i];
  ct_optim_hp hp;
  const ct_optim_preset *p = ct_optim_preset_of("adamw_bf16");
  REQUIRE(p && ct_optim_preset_hp(p, CT_OPTIM_ADAMW, NULL, NULL, &hp, NULL, 0, NULL) == CT_OK);
  hp.weight_decay = 0.5f; /* large, to see the decay */
  ct_optim *o = NULL;
  ct_err e = {0};
  REQUIRE(ct_optim_new(CT_OPTIM_ADAMW, &hp, NULL, 0, N, &o, &e) == CT_OK);
  double emax = 0;
  for (int t = 1; t <= STEPS; t++) {
    const float lr = 1e-2f * (float)t;
    for (int i = 0; i < N; i++) g[i] = (float)(0.1 * ((i * 5 + t * 3) % 7 - 3) + 0.01 * t);
    REQUIRE(ct_optim_step(o, w, g, lr, t, &e) == CT_OK);
    const double b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps;
    for (int i = 0; i < N; i++) {
      rw[i] *= 1.0 - (double)lr * hp.weight_decay;
      rm[i] = b1 * rm[i] + (1 - b1) * g[i];
      rv[i] = b2 * rv[i] + (1 - b2) * (double)g[i] * g[i];
      rw[i] -= (double)lr * sqrt(1 - pow(b2, t)) * rm[i] / (sqrt(rv[i]) + eps);
      const double d = fabs(w[i] - rw[i]) / fmax(fabs(rw[i]), 1e-3);
      if (!(d <= emax)) emax = d; /* NaN-aware */
    }
  }
  CHECKF(emax < 1e-5, "AdamWBF16 vs formula: %g", emax);
  /* and it is not torch's AdamW: the first step differs by the 1/(1 - b1) = 10x step */
  ct_optim_hp tp;
  ct_optim_hp_default(CT_OPTIM_ADAMW, &tp);
  CHECK(tp.adamw_bf16 == 0);
  ct_optim_free(o);
}

/* SimpleTuner switches adamw_bf16 to optimi-adamw on a quantised base
 * without bf16 weights (optimizer_param.py determine_optimizer_class_with_config). */
CT_TEST(optim_st, adamw_bf16_on_a_quantised_base) {
  ct_config c;
  ct_config_defaults(&c);
  set(&c, "optimizer", "adamw_bf16");
  set(&c, "model_type", "lora");
  set(&c, "base_model_precision", "int8-quanto");
  int sw = 0;
  const ct_optim_preset *p = ct_config_optimizer_preset(&c, &sw);
  CHECK(p && sw && !strcmp(p->name, "optimi-adamw"));
  ct_optim_hp hp;
  ct_train_optim_hp(&c, CT_OPTIM_ADAMW, &hp);
  CHECK(hp.beta2 == 0.99f && hp.eps == 1e-6f && hp.weight_decay == 0 && !hp.adamw_bf16);
  ct_config_problems probs = {0};
  CHECK(ct_config_check(&c, &probs) == CT_OK && warnings_on(&probs, "optimizer") == 1);
  ct_config_problems_free(&probs);
  set(&c, "mixed_precision", "bf16");
  p = ct_config_optimizer_preset(&c, &sw);
  CHECK(p && !sw && !strcmp(p->name, "adamw_bf16"));
  ct_config_free(&c);
}

/* Config: one table (CT_CONFIG_KEYS) drives defaults, parsing, type checks,
 * each key's own validation rule and the model types it applies to, the
 * canonical dump and help, so a key is declared exactly once. Rules between
 * keys run after the table (rules.c); every problem is collected
 * (ct_config_problems), none stops the others. */
#include "ctuner/config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_int.h"
#include "ctuner/family.h"
#include "ctuner/hash.h"
#include "ctuner/json.h"
#include "ctuner/optim.h"
#include "ctuner/storage.h"

typedef enum { K_INT, K_NUM, K_BOOL, K_STR } ktype;

/* A key's own rule (the check column of CT_CONFIG_KEYS). */
typedef enum {
  V_ANY,
  V_FN,
  V_INT_GE,
  V_INT_IN,
  V_INT_ONE_OF,
  V_NUM_GE,
  V_NUM_GT,
  V_NUM_IN,
  V_NUM_BETWEEN,
  V_ONE_OF,
  V_ONE_OF_QUOTED,
  V_NONE_OR,
  V_USE
} vkind;
typedef struct vspec {
  vkind kind;
  double lo, hi;
  const char *shape; /* V_NUM_IN/V_NUM_BETWEEN: "[)" etc. */
  const char *list;  /* '|'-separated choices */
  const char *note;  /* after the bound: " seconds", " (0: auto)" */
  ct_status (*fn)(const ct_config *c, ct_err *err);
} vspec;
#define CT_CHECK_ANY \
  { .kind = V_ANY }
#define CT_CHECK_FN(f) \
  { .kind = V_FN, .fn = f }
#define CT_CHECK_INT_GE(l) \
  { .kind = V_INT_GE, .lo = (l), .note = "" }
#define CT_CHECK_INT_GE_UNIT(l, u) \
  { .kind = V_INT_GE, .lo = (l), .note = u }
#define CT_CHECK_INT_IN(l, h) \
  { .kind = V_INT_IN, .lo = (l), .hi = (h) }
#define CT_CHECK_INT_ONE_OF(s) \
  { .kind = V_INT_ONE_OF, .list = s }
#define CT_CHECK_NUM_GE(l) \
  { .kind = V_NUM_GE, .lo = (l), .note = "" }
#define CT_CHECK_NUM_GE_UNIT(l, u) \
  { .kind = V_NUM_GE, .lo = (l), .note = u }
#define CT_CHECK_NUM_GT(l) \
  { .kind = V_NUM_GT, .lo = (l) }
#define CT_CHECK_NUM_IN(b, l, h) \
  { .kind = V_NUM_IN, .shape = b, .lo = (l), .hi = (h) }
#define CT_CHECK_NUM_BETWEEN(b, l, h, u) \
  { .kind = V_NUM_BETWEEN, .shape = b, .lo = (l), .hi = (h), .note = u }
#define CT_CHECK_ONE_OF(s) \
  { .kind = V_ONE_OF, .list = s }
#define CT_CHECK_ONE_OF_QUOTED(s) \
  { .kind = V_ONE_OF_QUOTED, .list = s }
#define CT_CHECK_NONE_OR(s) \
  { .kind = V_NONE_OR, .list = s }
#define CT_CHECK_USE(s) \
  { .kind = V_USE, .list = s }

/* The FN(...) rules (defined with ct_config_check below). */
static ct_status check_model_type(const ct_config *c, ct_err *err);
static ct_status check_model_family(const ct_config *c, ct_err *err);
static ct_status check_model_flavour(const ct_config *c, ct_err *err);
static ct_status check_use_dora(const ct_config *c, ct_err *err);
static ct_status check_base_model_precision(const ct_config *c, ct_err *err);
static ct_status check_te1_precision(const ct_config *c, ct_err *err);
static ct_status check_te2_precision(const ct_config *c, ct_err *err);
static ct_status check_controlnet(const ct_config *c, ct_err *err);
static ct_status check_resolution_type(const ct_config *c, ct_err *err);
static ct_status check_prompt_library(const ct_config *c, ct_err *err);
static ct_status check_lora_type(const ct_config *c, ct_err *err);
static ct_status check_preset(const ct_config *c, ct_err *err);
static ct_status check_output_dir(const ct_config *c, ct_err *err);
static ct_status check_bytes(const ct_config *c, ct_err *err);
static ct_status check_learning_rate(const ct_config *c, ct_err *err);
static ct_status check_lr_scheduler(const ct_config *c, ct_err *err);
static ct_status check_optimizer(const ct_config *c, ct_err *err);
static ct_status check_optimizer_config(const ct_config *c, ct_err *err);
static ct_status check_tokenizer_max_length(const ct_config *c, ct_err *err);
static ct_status check_codec_scale(const ct_config *c, ct_err *err);
static ct_status check_mixed_precision(const ct_config *c, ct_err *err);
static ct_status check_resume(const ct_config *c, ct_err *err);

typedef struct key_def {
  const char *name;
  ktype type;
  const char *def;
  const char *help;
  size_t off;
  unsigned models; /* ct_model_types bits */
  vspec check;
} key_def;

static const key_def KEYS[] = {
#define CT_X(k, type, d, m, c, h) \
  {#k, K_##type, d, h, offsetof(ct_config, k), CT_MODEL_##m, CT_CHECK_##c},
    CT_CONFIG_KEYS(CT_X)
#undef CT_X
};
#define NKEYS (sizeof KEYS / sizeof KEYS[0])

/* SimpleTuner spellings that mean the same key. */
static const struct {
  const char *alias, *key;
} ALIASES[] = {
    {"checkpointing_steps", "checkpoint_step_interval"},
    {"validation_steps", "validation_step_interval"},
    {"flow_schedule_shift", "flow_shift"},
    {"model_preset", "preset"},
    {"gradient_accumulation", "gradient_accumulation_steps"},
    {"lr_warmup", "lr_warmup_steps"},
    {"nccl_timeout", "distributed_timeout"},      /* SimpleTuner's (and finetrainers') name */
    {"validation_disable", "disable_validation"}, /* SimpleTuner's current name */
};

const char *ct_cfg_alias_at(size_t i, const char **key) {
  if (i >= sizeof ALIASES / sizeof ALIASES[0]) return NULL;
  if (key) *key = ALIASES[i].key;
  return ALIASES[i].alias;
}

static const char *type_name(ktype t) {
  switch (t) {
    case K_INT:
      return "an integer";
    case K_NUM:
      return "a number";
    case K_BOOL:
      return "a boolean (true/false)";
    default:
      return "a string";
  }
}

static const char *strip_dashes(const char *k) {
  while (*k == '-') k++;
  return k;
}

static const key_def *find_key(const char *key) {
  key = strip_dashes(key);
  for (size_t i = 0; i < sizeof ALIASES / sizeof ALIASES[0]; i++)
    if (!strcmp(key, ALIASES[i].alias)) key = ALIASES[i].key;
  for (size_t i = 0; i < NKEYS; i++)
    if (!strcmp(key, KEYS[i].name)) return &KEYS[i];
  return NULL;
}

const char *ct_config_help(const char *key) {
  const key_def *k = find_key(key);
  return k ? k->help : NULL;
}

/* Note a no-effect key once in cfg->no_effect; 1 if key is one. */
static int note_no_effect(ct_config *cfg, const char *key) {
  if (!ct_config_no_effect(key)) return 0;
  char *l = cfg->no_effect;
  const size_t kl = strlen(key);
  for (const char *p = l; (p = strstr(p, key)); p += kl)
    if ((p == l || p[-1] == ',') && (p[kl] == ',' || !p[kl])) return 1; /* already noted */
  const size_t n = strlen(l);
  snprintf(l + n, sizeof cfg->no_effect - n, "%s%s", n ? "," : "", key);
  return 1;
}

/* An unknown key: a SimpleTuner option is a warning (no effect here) or
 * refused with what ctuner does (names.c), anything else an error with the
 * key it probably means. value: its text ("true", "none", "[...]") or NULL. */
static ct_status unknown_key(ct_config *cfg, const char *key, const char *value, const cfg_src *src,
                             ct_config_problems *probs) {
  const char *f = src->file, *why = NULL;
  switch (ct_cfg_st_option(key, value, &why)) {
    case CT_ST_REFUSED:
      if (value && strlen(value) < 64)
        ct_config_problems_add(probs, 0, CT_ERR_UNSUPPORTED, src->origin, f, src->line, src->col,
                               key, NULL, "key '%s' (SimpleTuner's option) set to '%s': %s", key,
                               value, why);
      else
        ct_config_problems_add(probs, 0, CT_ERR_UNSUPPORTED, src->origin, f, src->line, src->col,
                               key, NULL, "key '%s' (SimpleTuner's option): %s", key, why);
      return CT_ERR_UNSUPPORTED;
    case CT_ST_NO_EFFECT:
      note_no_effect(cfg, key);
      ct_config_problems_add(
          probs, 1, CT_OK, src->origin, f, src->line, src->col, key, NULL,
          "key '%s' (%s) has no effect here: %s", key,
          strncmp(key, "deepspeed_config.", 17) ? "SimpleTuner's option" : "DeepSpeed's field",
          why);
      return CT_OK;
    default:
      break;
  }
  /* a hint costs a distance to every key: not for a file of thousands of unknown keys */
  const char *s = probs && probs->n > 200 ? NULL : ct_config_suggest(key);
  if (s)
    ct_config_problems_add(probs, 0, CT_ERR_INVALID, src->origin, f, src->line, src->col, key, s,
                           "unknown key '%s'; did you mean '%s'?", key, s);
  else
    ct_config_problems_add(probs, 0, CT_ERR_INVALID, src->origin, f, src->line, src->col, key, NULL,
                           "unknown key '%s' (docs/config.md lists every key)", key);
  return CT_ERR_INVALID;
}

static int in_list(const char *s, const char *list);

static ct_status set_str(char **field, const char *v, const char *where, ct_err *err) {
  char *s = NULL;
  if (v) {
    ct_status st = ct_expand_env(v, where, &s, err);
    if (st) return st;
  }
  free(*field);
  *field = s;
  return CT_OK;
}

/* Set from text: used for defaults and the command line. */
static ct_status set_text(ct_config *cfg, const key_def *k, const char *v, const char *where,
                          ct_err *err) {
  char *base = (char *)cfg + k->off;
  char *end;
  errno = 0;
  switch (k->type) {
    case K_INT: {
      long x = strtol(v, &end, 10);
      if (errno == ERANGE && end != v && !*end)
        return ct_errf(err, CT_ERR_RANGE,
                       "%skey '%s': %s is too large for an integer (magnitude below 2^63)", where,
                       k->name, v);
      if (errno || end == v || *end)
        return ct_errf(err, CT_ERR_INVALID, "%skey '%s' expects an integer, got '%s'", where,
                       k->name, v);
      *(long *)base = x;
      return CT_OK;
    }
    case K_NUM: {
      double x = strtod(v, &end);
      if (errno || end == v || *end)
        return ct_errf(err, CT_ERR_INVALID, "%skey '%s' expects a number, got '%s'", where, k->name,
                       v);
      *(double *)base = x;
      return CT_OK;
    }
    case K_BOOL:
      if (!strcasecmp(v, "true") || !strcmp(v, "1") || !strcasecmp(v, "yes"))
        *(int *)base = 1;
      else if (!strcasecmp(v, "false") || !strcmp(v, "0") || !strcasecmp(v, "no"))
        *(int *)base = 0;
      else
        return ct_errf(err, CT_ERR_INVALID, "%skey '%s' expects true or false, got '%s'", where,
                       k->name, v);
      return CT_OK;
    case K_STR:
      if (!strcasecmp(v, "none") || !strcasecmp(v, "null")) {
        /* "none" means unset for optional strings; resume keeps it verbatim, and so does a
         * key whose own choices include "none" (ema_validation: SimpleTuner's "none") */
        if (!strcmp(k->name, "resume_from_checkpoint") ||
            (!strcasecmp(v, "none") &&
             (k->check.kind == V_ONE_OF || k->check.kind == V_ONE_OF_QUOTED) &&
             in_list("none", k->check.list)))
          return set_str((char **)base, "none", where, err);
        return set_str((char **)base, NULL, where, err);
      }
      return set_str((char **)base, v, where, err);
  }
  return CT_ERR_INTERNAL;
}

void ct_config_defaults(ct_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  for (size_t i = 0; i < NKEYS; i++) {
    if (!KEYS[i].def) continue;
    ct_status st = set_text(cfg, &KEYS[i], KEYS[i].def, "", NULL);
    CT_ASSERT(st == CT_OK);
  }
}

void ct_config_free(ct_config *cfg) {
  for (size_t i = 0; i < NKEYS; i++)
    if (KEYS[i].type == K_STR) {
      char **p = (char **)((char *)cfg + KEYS[i].off);
      free(*p);
      *p = NULL;
    }
}

/* Keys real SimpleTuner configs often leave out, whose defaults here are
 * SimpleTuner's (issue 21): logged at start with the value in effect. */
static const char *const ST_DEFAULTED[] = {
    "flow_shift",    "lr_scheduler",      "lr_warmup_steps", "lr_end",     "lr_power",
    "max_grad_norm", "adam_weight_decay", "adam_beta1",      "adam_beta2", "adam_epsilon"};

void ct_config_defaults_note(const ct_config *cfg, char *out, size_t cap) {
  size_t n = 0;
  if (cap) out[0] = 0;
  const char *mt = cfg->model_type ? cfg->model_type : "full";
  /* SimpleTuner's optimizer names do not read the adam_* keys: their settings instead */
  const ct_optim_preset *p = ct_config_optimizer_preset(cfg, NULL);
  for (size_t i = 0; i < sizeof ST_DEFAULTED / sizeof ST_DEFAULTED[0]; i++) {
    const key_def *k = find_key(ST_DEFAULTED[i]);
    CT_ASSERT(k && k->def);
    if (cfg->given[k - KEYS] || ct_config_key_applies(k->name, mt) != 1) continue;
    if (p && !strncmp(k->name, "adam_", 5)) continue;
    int w = snprintf(out + n, cap > n ? cap - n : 0, "%s%s %s", n ? ", " : "", k->name, k->def);
    if (w > 0) n += (size_t)w;
    if (n >= cap) return;
  }
  const ct_optim_info *oi = p ? ct_optim_lookup(p->name, NULL) : NULL;
  ct_optim_hp hp;
  char set[256];
  if (oi && !cfg->given[CT_KEY_optimizer_config] && !cfg->given[CT_KEY_optimizer_beta1] &&
      !cfg->given[CT_KEY_optimizer_beta2] &&
      !ct_optim_preset_hp(p, oi->kind, NULL, NULL, &hp, NULL, 0, NULL)) {
    ct_optim_preset_describe(p, &hp, set, sizeof set);
    snprintf(out + n, cap > n ? cap - n : 0, "%soptimizer %s's settings %s (%s)", n ? ", " : "",
             p->name, set, p->source);
  }
}

/* Records where key k's value came from. */
static void mark(ct_config *cfg, const key_def *k, const cfg_src *src) {
  const size_t i = (size_t)(k - KEYS);
  cfg->given[i] = (unsigned char)src->origin;
  cfg->line[i] = src->line;
  cfg->col[i] = src->col;
}

/* A failed set as a problem at src. */
static ct_status set_failed(ct_status st, const key_def *k, const cfg_src *src, const ct_err *e,
                            ct_config_problems *probs) {
  ct_config_problems_add(probs, 0, st, src->origin, src->file, src->line, src->col, k->name, NULL,
                         "%s", e->msg);
  return st;
}

ct_status ct_cfg_set_text(ct_config *cfg, const char *key, const char *value, const cfg_src *src,
                          ct_config_problems *probs) {
  const key_def *k = find_key(key);
  if (!k) return unknown_key(cfg, strip_dashes(key), value, src, probs);
  ct_err e = {0};
  ct_status st = set_text(cfg, k, value, "", &e);
  if (st) return set_failed(st, k, src, &e, probs);
  mark(cfg, k, src);
  return CT_OK;
}

ct_status ct_config_set_arg(ct_config *cfg, const char *key, const char *value,
                            ct_config_problems *probs) {
  const cfg_src src = {CT_ORIGIN_CLI, NULL, 0, 0};
  return ct_cfg_set_text(cfg, key, value, &src, probs);
}

ct_status ct_config_set(ct_config *cfg, const char *key, const char *value, ct_err *err) {
  ct_config_problems probs = {0};
  ct_status st = ct_config_set_arg(cfg, key, value, &probs);
  if (st) ct_config_problems_to_err(&probs, err);
  ct_config_problems_free(&probs);
  return st;
}

/* JSON text of v (for keys that take an inline object); 0 on success. */
static int json_write(const ct_json *v, char **buf, size_t *len, size_t *cap);
static int put(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
  if (*len + n + 1 > *cap) {
    size_t nc = (*cap ? *cap * 2 : 256) + n;
    char *nb = realloc(*buf, nc);
    if (!nb) return -1;
    *buf = nb, *cap = nc;
  }
  memcpy(*buf + *len, s, n);
  *len += n;
  (*buf)[*len] = 0;
  return 0;
}
static int put_str(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
  if (put(buf, len, cap, "\"", 1)) return -1;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    char esc[8];
    if (ch == '"' || ch == '\\')
      snprintf(esc, sizeof esc, "\\%c", ch);
    else if (ch < 0x20)
      snprintf(esc, sizeof esc, "\\u%04x", ch);
    else
      esc[0] = (char)ch, esc[1] = 0;
    if (put(buf, len, cap, esc, strlen(esc))) return -1;
  }
  return put(buf, len, cap, "\"", 1);
}
static int json_write(const ct_json *v, char **buf, size_t *len, size_t *cap) {
  char num[64];
  switch (v->type) {
    case CT_JSON_NULL:
      return put(buf, len, cap, "null", 4);
    case CT_JSON_BOOL:
      return put(buf, len, cap, v->boolean ? "true" : "false", v->boolean ? 4 : 5);
    case CT_JSON_NUMBER:
      if (v->is_int)
        snprintf(num, sizeof num, "%lld", (long long)v->i64);
      else
        snprintf(num, sizeof num, "%.17g", v->num);
      return put(buf, len, cap, num, strlen(num));
    case CT_JSON_STRING:
      return put_str(buf, len, cap, v->str, v->len);
    case CT_JSON_ARRAY:
    case CT_JSON_OBJECT: {
      const int obj = v->type == CT_JSON_OBJECT;
      if (put(buf, len, cap, obj ? "{" : "[", 1)) return -1;
      for (size_t i = 0; i < v->n; i++) {
        if (i && put(buf, len, cap, ", ", 2)) return -1;
        if (obj &&
            (put_str(buf, len, cap, v->keys[i], strlen(v->keys[i])) || put(buf, len, cap, ": ", 2)))
          return -1;
        if (json_write(&v->items[i], buf, len, cap)) return -1;
      }
      return put(buf, len, cap, obj ? "}" : "]", 1);
    }
  }
  return -1;
}

static ct_status set_json(ct_config *cfg, const key_def *k, const ct_json *v, const char *where,
                          ct_err *err) {
  char *base = (char *)cfg + k->off;
  const char *got = ct_json_type_name(v->type);
  switch (k->type) {
    case K_INT:
      if (v->type == CT_JSON_NUMBER && v->is_int) {
        *(long *)base = (long)v->i64;
        return CT_OK;
      }
      if (v->type == CT_JSON_NUMBER && v->num == floor(v->num) && fabs(v->num) > 9.2e18)
        return ct_errf(err, CT_ERR_RANGE,
                       "%skey '%s': %.6g is too large for an integer (magnitude below 2^63)", where,
                       k->name, v->num);
      if (v->type == CT_JSON_STRING) return set_text(cfg, k, v->str, where, err);
      break;
    case K_NUM:
      if (v->type == CT_JSON_NUMBER) {
        *(double *)base = v->num;
        return CT_OK;
      }
      if (v->type == CT_JSON_STRING) return set_text(cfg, k, v->str, where, err);
      break;
    case K_BOOL:
      if (v->type == CT_JSON_BOOL) {
        *(int *)base = v->boolean;
        return CT_OK;
      }
      if (v->type == CT_JSON_STRING) return set_text(cfg, k, v->str, where, err);
      break;
    case K_STR:
      if (v->type == CT_JSON_STRING) return set_text(cfg, k, v->str, where, err);
      if (v->type == CT_JSON_NULL) return set_str((char **)base, NULL, where, err);
      if ((v->type == CT_JSON_OBJECT && !strcmp(k->name, "deepspeed_config")) ||
          ((v->type == CT_JSON_OBJECT || v->type == CT_JSON_ARRAY) &&
           !strcmp(k->name, "webhook_config"))) {
        /* inline JSON: kept as text */
        char *buf = NULL;
        size_t len = 0, cap = 0;
        if (json_write(v, &buf, &len, &cap)) {
          free(buf);
          return ct_errf(err, CT_ERR_NOMEM, "out of memory");
        }
        free(*(char **)base);
        *(char **)base = buf;
        return CT_OK;
      }
      if (v->type == CT_JSON_NUMBER) { /* e.g. "validation_resolution": 512 */
        char buf[64];
        if (v->is_int)
          snprintf(buf, sizeof buf, "%lld", (long long)v->i64);
        else
          snprintf(buf, sizeof buf, "%.17g", v->num);
        return set_str((char **)base, buf, where, err);
      }
      break;
  }
  if (v->type == CT_JSON_NUMBER && k->type == K_INT) got = "a non-integer number";
  return ct_errf(err, CT_ERR_INVALID, "%skey '%s' expects %s, got %s", where, k->name,
                 type_name(k->type), got);
}

/* A JSON value as the text an option's value has on the command line:
 * "true", "1e-06", the string, "none" for null, "[...]"/"{...}" ("[]"/"{}"
 * when empty). */
static void json_text(const ct_json *v, char *out, size_t cap) {
  switch (v->type) {
    case CT_JSON_NULL:
      snprintf(out, cap, "none");
      break;
    case CT_JSON_BOOL:
      snprintf(out, cap, "%s", v->boolean ? "true" : "false");
      break;
    case CT_JSON_NUMBER:
      if (v->is_int)
        snprintf(out, cap, "%lld", (long long)v->i64);
      else
        snprintf(out, cap, "%g", v->num);
      break;
    case CT_JSON_STRING:
      snprintf(out, cap, "%s", v->str);
      break;
    case CT_JSON_ARRAY:
      snprintf(out, cap, "%s", v->n ? "[...]" : "[]");
      break;
    default:
      snprintf(out, cap, "%s", v->n ? "{...}" : "{}");
      break;
  }
}

ct_status ct_cfg_set_value(ct_config *cfg, const char *key, const ct_json *v, const cfg_src *src,
                           ct_config_problems *probs) {
  const key_def *k = find_key(key);
  if (!k) {
    char text[96];
    json_text(v, text, sizeof text);
    return unknown_key(cfg, strip_dashes(key), text, src, probs);
  }
  ct_err e = {0};
  ct_status st = set_json(cfg, k, v, "", &e);
  if (st) return set_failed(st, k, src, &e, probs);
  mark(cfg, k, src);
  return CT_OK;
}

static int is_one_of(const char *s, const char *const *choices) {
  for (; *choices; choices++)
    if (!strcmp(s, *choices)) return 1;
  return 0;
}

#define BAD(...) return ct_errf(err, CT_ERR_INVALID, __VA_ARGS__)

/* ---- the FN(...) rules of the table ---- */

/* model_family and model_flavour: rows of the family registry (family.c). */
static ct_status check_model_family(const ct_config *c, ct_err *err) {
  return ct_family_check(c->model_family, err);
}

static ct_status check_model_flavour(const ct_config *c, ct_err *err) {
  return ct_family_check_flavour(c->model_family, c->model_flavour, err);
}

static ct_status check_model_type(const ct_config *c, ct_err *err) {
  if (!c->model_type || (strcmp(c->model_type, "full") && strcmp(c->model_type, "vae") &&
                         strcmp(c->model_type, "lora")))
    BAD("model_type '%s' is not supported; use \"full\" (the MMDiT), \"lora\" (adapters on a "
        "frozen MMDiT) or \"vae\"",
        c->model_type ? c->model_type : "");
  return CT_OK;
}

static ct_status check_lora_type(const ct_config *c, ct_err *err) {
  if (!c->lora_type || (strcmp(c->lora_type, "standard") && strcmp(c->lora_type, "lycoris")))
    BAD("lora_type '%s' is not supported; use \"standard\" (peft LoRA) or \"lycoris\"",
        c->lora_type ? c->lora_type : "");
  if (!strcmp(c->lora_type, "lycoris") && c->model_type && !strcmp(c->model_type, "lora") &&
      (!c->lycoris_config || !*c->lycoris_config))
    BAD("lora_type lycoris needs lycoris_config (the LyCORIS config JSON)");
  return CT_OK;
}

static ct_status check_use_dora(const ct_config *c, ct_err *err) {
  if (!c->use_dora || !c->model_type || strcmp(c->model_type, "lora")) return CT_OK;
  if (c->lora_type && !strcmp(c->lora_type, "lycoris"))
    BAD("use_dora applies to lora_type standard (LyCORIS's dora_wd is not implemented)");
  if (c->lora_dropout > 0)
    BAD("use_dora with lora_dropout %g is not implemented (peft's DoRA then computes the base on "
        "the dropped input); set lora_dropout 0",
        c->lora_dropout);
  if (c->zero_stage >= 3)
    BAD("use_dora with zero_stage 3 is not implemented (ZeRO-3 shards the frozen base, whose rows "
        "DoRA reads); use zero_stage 0-2");
  return CT_OK;
}

static ct_status check_resolution_type(const ct_config *c, ct_err *err) {
  if (c->resolution_type && !strcmp(c->resolution_type, "area"))
    BAD("resolution_type area at the top level would make resolution megapixels, but ctuner's "
        "resolution is an edge in pixels: use pixel_area, or set resolution_type area with a "
        "megapixel resolution on the datasets in the data backend config");
  if (!c->resolution_type ||
      (strcmp(c->resolution_type, "pixel") && strcmp(c->resolution_type, "pixel_area")))
    BAD("resolution_type must be pixel_area or pixel, got '%s'",
        c->resolution_type ? c->resolution_type : "");
  return CT_OK;
}

/* SimpleTuner's base_model_precision values: what ctuner stores, what it
 * does not build (named), and a quantised base only under LoRA (a full
 * fine-tune keeps float32 master weights; SimpleTuner refuses it too). */
static ct_status check_base_model_precision(const ct_config *c, ct_err *err) {
  static const char *const unbuilt[] = {
      "int4-quanto",  "int2-quanto", "fp8-quanto",          "fp8uz-quanto",        "fp8-torchao",
      "int4-torchao", "nf4-bnb",     "fp8-torchao-compile", "int8-torchao-compile"};
  const char *p = c->base_model_precision;
  const size_t pl = strlen(p);
  const int sdnq = pl > 5 && !strcmp(p + pl - 5, "-sdnq"); /* SimpleTuner's SD.Next quantisation */
  for (size_t i = 0; i < sizeof unbuilt / sizeof *unbuilt; i++)
    if (sdnq || !strcmp(p, unbuilt[i]))
      BAD("base_model_precision %s is not implemented: ctuner stores a frozen base as no_change, "
          "bf16, int8-quanto or int8-torchao",
          p);
  if (strcmp(p, "no_change") && strcmp(p, "bf16") && strcmp(p, "int8-quanto") &&
      strcmp(p, "int8-torchao"))
    BAD("base_model_precision must be no_change, bf16, int8-quanto or int8-torchao, got '%s'", p);
  if (!strncmp(p, "int8", 4) && strcmp(c->model_type, "lora"))
    BAD("base_model_precision %s needs model_type lora: a quantised base is frozen, and a %s "
        "fine-tune trains float32 weights",
        p, c->model_type);
  return CT_OK;
}

/* text_encoder_{1,2}_precision: a pipeline's CLIP-L and T5 stored as read
 * (no_change), bf16 or weight-only int8 (src/text/textenc.c, t5.c;
 * docs/flux.md). */
static ct_status te_precision(int k, const char *v, ct_err *err) {
  if (strcmp(v, "no_change") && strcmp(v, "bf16") && strcmp(v, "int8-quanto") &&
      strcmp(v, "int8-torchao"))
    BAD("text_encoder_%d_precision %s is not implemented: the text encoders are stored as "
        "no_change, bf16, int8-quanto or int8-torchao",
        k, v);
  return CT_OK;
}
static ct_status check_te1_precision(const ct_config *c, ct_err *err) {
  return te_precision(1, c->text_encoder_1_precision, err);
}
static ct_status check_te2_precision(const ct_config *c, ct_err *err) {
  return te_precision(2, c->text_encoder_2_precision, err);
}
static ct_status check_controlnet(const ct_config *c, ct_err *err) {
  if (c->controlnet) BAD("controlnet: ControlNet training is not implemented");
  return CT_OK;
}

static ct_status check_prompt_library(const ct_config *c, ct_err *err) {
  if (c->validation_prompt_library)
    BAD("validation_prompt_library: SimpleTuner's built-in prompt library is not shipped with "
        "ctuner; list the prompts in user_prompt_library");
  return CT_OK;
}

static ct_status check_preset(const ct_config *c, ct_err *err) {
  if (!c->preset) BAD("preset is required (tiny, small, demo, bench)");
  return CT_OK;
}

static ct_status check_output_dir(const ct_config *c, ct_err *err) {
  if (!c->output_dir || !*c->output_dir) BAD("output_dir must be a directory path");
  if (!strncmp(c->output_dir, "s3://", 5)) {
    char *b = NULL, *pf = NULL;
    int ok = ct_storage_parse_s3_url(c->output_dir, &b, &pf) && b[0] &&
             (!pf[0] || ct_storage_key_ok(pf));
    free(b), free(pf);
    if (!ok)
      BAD("output_dir '%s' must be s3://bucket/prefix (a prefix without empty, '.' or '..' "
          "segments)",
          c->output_dir);
  }
  return CT_OK;
}

static ct_status check_bytes(const ct_config *c, ct_err *err) {
  if (c->disk_low_threshold && ct_parse_bytes(c->disk_low_threshold) < 0)
    BAD("disk_low_threshold must be a size such as 10G, 500M or 1048576 (bytes), got '%s'",
        c->disk_low_threshold);
  return CT_OK;
}

static ct_status check_learning_rate(const ct_config *c, ct_err *err) {
  if (!(c->learning_rate >= 0) || !isfinite(c->learning_rate))
    BAD("learning_rate must be a finite number >= 0, got %g", c->learning_rate);
  return CT_OK;
}

static ct_status check_lr_scheduler(const ct_config *c, ct_err *err) {
  ct_sched_kind sk;
  if (!c->lr_scheduler) BAD("lr_scheduler is required");
  ct_status st = ct_sched_kind_parse(c->lr_scheduler, &sk, err);
  if (st) ct_err_prefix(err, "lr_scheduler: ");
  if (!st && sk == CT_SCHED_SINE && c->lr_warmup_steps == 0)
    BAD("lr_scheduler sine takes its period from lr_warmup_steps, which is 0 (SimpleTuner's Sine "
        "refuses that too); set lr_warmup_steps > 0");
  return st;
}

static ct_status check_optimizer(const ct_config *c, ct_err *err) {
  if (!c->optimizer) BAD("optimizer is required");
  if (!ct_optim_lookup(c->optimizer, err)) {
    ct_err_prefix(err, "optimizer: ");
    return err ? err->status : CT_ERR_INVALID;
  }
  return CT_OK;
}

const struct ct_optim_preset *ct_config_optimizer_preset(const ct_config *cfg, int *switched) {
  if (switched) *switched = 0;
  const ct_optim_preset *p = cfg->optimizer ? ct_optim_preset_of(cfg->optimizer) : NULL;
  /* SimpleTuner: enable_adamw_bf16 = weight_dtype is bf16 (trainer.py init_precision); on a
   * quantised base without it, determine_optimizer_class_with_config (optimizer_param.py)
   * logs "AdamWBF16 may not be used. Switching to AdamW." and builds optimi-adamw */
  if (p && p->adamw_bf16 && cfg->model_type && !strcmp(cfg->model_type, "lora") &&
      cfg->base_model_precision && !strncmp(cfg->base_model_precision, "int8", 4) &&
      !(cfg->mixed_precision && !strcmp(cfg->mixed_precision, "bf16"))) {
    if (switched) *switched = 1;
    return ct_optim_preset_of("optimi-adamw");
  }
  return p;
}

/* optimizer_config: only for SimpleTuner's names, every key one ctuner honours. */
static ct_status check_optimizer_config(const ct_config *c, ct_err *err) {
  if (!c->optimizer_config || !*c->optimizer_config) return CT_OK;
  const ct_optim_info *oi = c->optimizer ? ct_optim_lookup(c->optimizer, NULL) : NULL;
  if (!oi) return CT_OK; /* its own rule (check_optimizer) says why */
  const ct_optim_preset *p = ct_config_optimizer_preset(c, NULL);
  if (!p)
    BAD("optimizer_config applies to SimpleTuner's optimizer names (adamw_bf16, optimi-*, bnb-*, "
        "torch-*: docs/optimizers.md); optimizer %s reads the adam_* keys instead",
        c->optimizer);
  ct_optim_hp hp;
  ct_status st = ct_optim_preset_hp(p, oi->kind, c->optimizer_config, NULL, &hp, NULL, 0, err);
  if (!st) st = ct_optim_hp_validate(oi->kind, &hp, err);
  if (st && err) ct_err_prefix(err, "optimizer %s: ", c->optimizer);
  return st;
}

static ct_status check_tokenizer_max_length(const ct_config *c, ct_err *err) {
  /* a FLUX.1 pipeline ignores it with a warning, as SimpleTuner (its configs say 512) */
  if (c->pretrained_model_name_or_path && c->tokenizer_max_length >= 0) return CT_OK;
  if (c->tokenizer_max_length < 0 || c->tokenizer_max_length > 77 || c->tokenizer_max_length == 1)
    BAD("tokenizer_max_length must be 0 (preset) or between 2 and 77, got %ld",
        c->tokenizer_max_length);
  return CT_OK;
}

static ct_status check_codec_scale(const ct_config *c, ct_err *err) {
  if (c->codec_scale != 0 && c->codec_scale != 1 && c->codec_scale != 2 && c->codec_scale != 4)
    BAD("codec_scale must be 0 (from the preset), 1, 2 or 4, got %ld", c->codec_scale);
  return CT_OK;
}

static ct_status check_mixed_precision(const ct_config *c, ct_err *err) {
  if (!c->mixed_precision ||
      (strcmp(c->mixed_precision, "no") && strcmp(c->mixed_precision, "fp32") &&
       strcmp(c->mixed_precision, "bf16")))
    BAD("mixed_precision '%s' is not supported; use \"no\" (float32) or \"bf16\"%s",
        c->mixed_precision ? c->mixed_precision : "",
        c->mixed_precision && !strcmp(c->mixed_precision, "fp16")
            ? " (fp16 needs loss scaling ctuner does not do)"
            : "");
  return CT_OK;
}

static ct_status check_resume(const ct_config *c, ct_err *err) {
  if (!c->resume_from_checkpoint) BAD("resume_from_checkpoint must be latest, none or a path");
  return CT_OK;
}

/* ---- the declarative rules ---- */

/* 1 if s is one of the '|'-separated words of list. */
static int in_list(const char *s, const char *list) {
  const size_t n = strlen(s);
  for (const char *p = list; *p;) {
    const char *e = strchr(p, '|');
    const size_t l = e ? (size_t)(e - p) : strlen(p);
    if (l == n && !strncmp(p, s, n)) return 1;
    p += l + (e != NULL);
  }
  return 0;
}

/* "a, b or c" (quoted: "\"a\", \"b\" or \"c\"") into buf. */
static const char *say_list(const char *list, int quoted, char *buf, size_t n) {
  size_t len = 0;
  buf[0] = 0;
  for (const char *p = list; *p && len < n;) {
    const char *e = strchr(p, '|');
    const int l = e ? (int)(e - p) : (int)strlen(p);
    const char *sep = p == list ? "" : e ? ", " : " or ";
    int w = snprintf(buf + len, n - len, quoted ? "%s\"%.*s\"" : "%s%.*s", sep, l, p);
    len += w > 0 ? (size_t)w : 0;
    p += l + (e != NULL);
  }
  return buf;
}

/* 1 if x is inside the interval "[)"-style shape from lo to hi. */
static int inside(double x, const char *shape, double lo, double hi) {
  const int lo_ok = shape[0] == '[' ? x >= lo : x > lo, hi_ok = shape[1] == ']' ? x <= hi : x < hi;
  return lo_ok && hi_ok;
}

/* The key's own rule from the table. */
static ct_status check_key(const ct_config *c, const key_def *k, ct_err *err) {
  const vspec *v = &k->check;
  const char *base = (const char *)c + k->off;
  const long i = k->type == K_INT ? *(const long *)base : 0;
  const double x = k->type == K_NUM ? *(const double *)base : 0;
  const char *s = k->type == K_STR ? *(char *const *)base : NULL;
  char says[160];
  switch (v->kind) {
    case V_ANY:
      return CT_OK;
    case V_FN:
      return v->fn(c, err);
    case V_INT_GE:
      if (i < (long)v->lo) BAD("%s must be >= %ld%s, got %ld", k->name, (long)v->lo, v->note, i);
      return CT_OK;
    case V_INT_IN:
      if (i < (long)v->lo || i > (long)v->hi)
        BAD("%s must be between %ld and %ld, got %ld", k->name, (long)v->lo, (long)v->hi, i);
      return CT_OK;
    case V_INT_ONE_OF: {
      char num[32];
      snprintf(num, sizeof num, "%ld", i);
      if (!in_list(num, v->list))
        BAD("%s must be %s, got %ld", k->name, say_list(v->list, 0, says, sizeof says), i);
      return CT_OK;
    }
    case V_NUM_GE:
      if (!(x >= v->lo)) BAD("%s must be >= %g%s, got %g", k->name, v->lo, v->note, x);
      return CT_OK;
    case V_NUM_GT:
      if (!(x > v->lo)) BAD("%s must be > %g, got %g", k->name, v->lo, x);
      return CT_OK;
    case V_NUM_IN:
      if (!inside(x, v->shape, v->lo, v->hi))
        BAD("%s must be in %c%g, %g%c, got %g", k->name, v->shape[0], v->lo, v->hi, v->shape[1], x);
      return CT_OK;
    case V_NUM_BETWEEN:
      if (!inside(x, v->shape, v->lo, v->hi) && !strcmp(v->shape, "[]"))
        BAD("%s must be between %g and %g%s, got %g", k->name, v->lo, v->hi, v->note, x);
      /* an open end in words: "more than 0 and at most 600" */
      if (!inside(x, v->shape, v->lo, v->hi))
        BAD("%s must be %s %g and %s %g%s, got %g", k->name,
            v->shape[0] == '(' ? "more than" : "at least", v->lo,
            v->shape[1] == ')' ? "less than" : "at most", v->hi, v->note, x);
      return CT_OK;
    case V_ONE_OF:
    case V_ONE_OF_QUOTED:
      if (!s || !in_list(s, v->list))
        BAD("%s must be %s, got '%s'", k->name,
            say_list(v->list, v->kind == V_ONE_OF_QUOTED, says, sizeof says), s ? s : "");
      return CT_OK;
    case V_NONE_OR: /* "none" reads as unset (NULL) */
      if (s && !in_list(s, v->list)) {
        char more[150];
        BAD("%s must be none, %s, got '%s'", k->name, say_list(v->list, 0, more, sizeof more), s);
      }
      return CT_OK;
    case V_USE:
      if (!s || !in_list(s, v->list))
        BAD("%s '%s' is not supported; use %s", k->name, s ? s : "",
            say_list(v->list, 1, says, sizeof says));
      return CT_OK;
  }
  return CT_OK;
}

/* A failed rule about key k as a problem where k's value came from. */
static void rule_failed(const ct_config *c, const key_def *k, const ct_err *e,
                        ct_config_problems *probs) {
  const size_t i = (size_t)(k - KEYS);
  const ct_config_origin o = (ct_config_origin)c->given[i];
  const int in_file = o == CT_ORIGIN_FILE;
  ct_config_problems_add(probs, 0, e->status ? e->status : CT_ERR_INVALID, o,
                         in_file ? c->file : NULL, in_file ? c->line[i] : 0,
                         in_file ? c->col[i] : 0, k->name, NULL, "%s", e->msg);
}

static unsigned model_bit(const char *model_type);

/* A warning about key k where its value came from. */
static void warn_key(const ct_config *c, const key_def *k, ct_config_problems *probs,
                     const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void warn_key(const ct_config *c, const key_def *k, ct_config_problems *probs,
                     const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const size_t i = (size_t)(k - KEYS);
  const ct_config_origin o = (ct_config_origin)c->given[i];
  const int in_file = o == CT_ORIGIN_FILE;
  ct_config_problems_add(probs, 1, CT_OK, o, in_file ? c->file : NULL, in_file ? c->line[i] : 0,
                         in_file ? c->col[i] : 0, k->name, NULL, "%s", msg);
}

/* What SimpleTuner's optimizer names do with the optimizer keys (issue 32):
 * they run from fixed settings and never read adam_* (optimizer_param.py,
 * optimizer_choices and determine_optimizer_class_with_config), so a given
 * adam_* key draws one warning saying so; optimizer_beta1/2 and the
 * optimizer_config arguments that change nothing say so too. */
static void optimizer_notes(const ct_config *c, ct_config_problems *probs) {
  const ct_optim_info *oi = c->optimizer ? ct_optim_lookup(c->optimizer, NULL) : NULL;
  if (!oi) return; /* check_optimizer says why */
  int sw = 0;
  const ct_optim_preset *p = ct_config_optimizer_preset(c, &sw);
  const key_def *ko = &KEYS[CT_KEY_optimizer];
  const int b1 = c->given[CT_KEY_optimizer_beta1] != 0, b2 = c->given[CT_KEY_optimizer_beta2] != 0;
  const int has_oc = c->optimizer_config && *c->optimizer_config;
  if (sw)
    warn_key(c, ko, probs,
             "optimizer %s on a quantised base (base_model_precision %s) without mixed_precision "
             "bf16 runs as optimi-adamw, as SimpleTuner switches it (its AdamWBF16 takes bf16 "
             "weights only)",
             c->optimizer, c->base_model_precision);
  if (oi->kind == CT_OPTIM_MUON && !p)
    warn_key(c, ko, probs,
             "optimizer %s is ctuner's Muon (Keller Jordan's reference: momentum %g, Nesterov, "
             "%ld Newton-Schulz steps, AdamW on the other tensors; docs/optimizers.md), not "
             "SimpleTuner's MuonClip (weight decay 0.1, RMS scale 0.2, QK-clip): a SimpleTuner "
             "config naming muon trains differently here",
             c->optimizer, c->muon_momentum, c->muon_ns_steps);
  if (!p) {
    if (b1 || b2)
      warn_key(c, &KEYS[b1 ? CT_KEY_optimizer_beta1 : CT_KEY_optimizer_beta2], probs,
               "key '%s' applies to SimpleTuner's optimizer names only; optimizer %s reads "
               "adam_beta1 and adam_beta2",
               b1 ? "optimizer_beta1" : "optimizer_beta2", c->optimizer);
    return;
  }
  ct_optim_hp hp;
  char dropped[256] = "", settings[256];
  const float betas[2] = {(float)c->optimizer_beta1, (float)c->optimizer_beta2};
  const int use_betas = b1 && b2 && !has_oc;
  if (ct_optim_preset_hp(p, oi->kind, has_oc ? c->optimizer_config : NULL, use_betas ? betas : NULL,
                         &hp, dropped, sizeof dropped, NULL))
    return; /* check_optimizer_config says why */
  ct_optim_preset_describe(p, &hp, settings, sizeof settings);
  static const int ADAM_KEYS[] = {CT_KEY_adam_beta1,
                                  CT_KEY_adam_beta2,
                                  CT_KEY_adam_epsilon,
                                  CT_KEY_adam_weight_decay,
                                  CT_KEY_optimizer_momentum,
                                  CT_KEY_optimizer_nesterov,
                                  CT_KEY_optimizer_bias_correction};
  for (size_t i = 0; i < sizeof ADAM_KEYS / sizeof ADAM_KEYS[0]; i++) {
    const key_def *k = &KEYS[ADAM_KEYS[i]];
    if (!c->given[k - KEYS]) continue;
    warn_key(c, k, probs,
             "key '%s' has no effect with optimizer %s: SimpleTuner runs it with its fixed "
             "settings (%s: %s) and never reads the adam_* keys; change them with "
             "optimizer_config (docs/optimizers.md)",
             k->name, c->optimizer, p->source, settings);
  }
  if ((b1 || b2) && !use_betas)
    warn_key(c, &KEYS[b1 ? CT_KEY_optimizer_beta1 : CT_KEY_optimizer_beta2], probs,
             "key '%s' has no effect: SimpleTuner uses optimizer_beta1 and optimizer_beta2 only "
             "both together and only without optimizer_config",
             b1 ? "optimizer_beta1" : "optimizer_beta2");
  if (use_betas && !(p->takes & CT_OPTIM_SET_BETAS))
    warn_key(c, &KEYS[CT_KEY_optimizer_beta1], probs,
             "optimizer_beta1/optimizer_beta2 have no effect with optimizer %s (its class takes "
             "no betas; SimpleTuner drops them)",
             c->optimizer);
  else if (dropped[0])
    warn_key(c, &KEYS[CT_KEY_optimizer_config], probs,
             "optimizer_config: %s ha%s no effect with optimizer %s (SimpleTuner drops arguments "
             "its class does not take; the others only matter for bf16 or 8-bit storage, and "
             "ctuner steps float32)",
             dropped, strchr(dropped, ',') ? "ve" : "s", c->optimizer);
}

ct_status ct_config_check(const ct_config *c, ct_config_problems *probs) {
  const size_t before = probs->errors;
  const unsigned mb = model_bit(c->model_type);
  for (size_t i = 0; i < NKEYS; i++) {
    ct_err e = {0};
    if (check_key(c, &KEYS[i], &e)) rule_failed(c, &KEYS[i], &e, probs);
    /* a key of another model type: one warning naming it */
    if (mb && c->given[i] && !(KEYS[i].models & mb) && (KEYS[i].models & CT_MODEL_LORA)) {
      const ct_config_origin o = (ct_config_origin)c->given[i];
      const int in_file = o == CT_ORIGIN_FILE;
      ct_config_problems_add(probs, 1, CT_OK, o, in_file ? c->file : NULL, in_file ? c->line[i] : 0,
                             in_file ? c->col[i] : 0, KEYS[i].name, NULL,
                             "key '%s' applies to model_type lora only; ignored for model_type %s",
                             KEYS[i].name, c->model_type);
    }
  }
  optimizer_notes(c, probs);
  const char *key;
  for (size_t i = 0; ct_cfg_rule_at(i, c, &key, NULL) != CT_ERR_RANGE; i++) {
    ct_err e = {0};
    if (ct_cfg_rule_at(i, c, &key, &e)) rule_failed(c, find_key(key), &e, probs);
  }
  return probs->errors > before ? CT_ERR_INVALID : CT_OK;
}

ct_status ct_config_validate(const ct_config *c, ct_err *err) {
  ct_config_problems probs = {0};
  ct_status st = ct_config_check(c, &probs);
  if (st) st = ct_config_problems_to_err(&probs, err);
  ct_config_problems_free(&probs);
  return st;
}

#undef BAD

/* ---- model types ---- */

const char *ct_config_models_name(unsigned models) {
  switch (models & CT_MODEL_ALL) {
    case CT_MODEL_FULL:
      return "full";
    case CT_MODEL_VAE:
      return "vae";
    case CT_MODEL_LORA:
      return "lora";
    case CT_MODEL_ALL:
      return "all";
    default:
      return "none";
  }
}

static unsigned model_bit(const char *model_type) {
  if (!model_type) return 0;
  return !strcmp(model_type, "full")   ? CT_MODEL_FULL
         : !strcmp(model_type, "lora") ? CT_MODEL_FULL | CT_MODEL_LORA
         : !strcmp(model_type, "vae")  ? CT_MODEL_VAE
                                       : 0;
}

int ct_config_key_applies(const char *key, const char *model_type) {
  const key_def *k = find_key(key);
  const unsigned m = model_bit(model_type);
  if (!k || !m) return -1;
  return (k->models & m) != 0;
}

const char *ct_config_first_inapplicable(const ct_config *cfg) {
  const unsigned m = model_bit(cfg->model_type);
  for (size_t i = 0; m && i < NKEYS; i++)
    if (cfg->given[i] && !(KEYS[i].models & m)) return KEYS[i].name;
  return NULL;
}

int ct_config_key_info_at(size_t i, ct_config_key_info *out) {
  static const char *const tn[] = {"int", "number", "bool", "string"};
  if (i >= NKEYS) return 0;
  const key_def *k = &KEYS[i];
  const int listed = k->check.kind == V_ONE_OF || k->check.kind == V_ONE_OF_QUOTED ||
                     k->check.kind == V_NONE_OR || k->check.kind == V_USE ||
                     k->check.kind == V_INT_ONE_OF;
  const char *choices = listed ? k->check.list : NULL;
  if (!strcmp(k->name, "model_type")) choices = "full|lora|vae";   /* FN rules with a fixed set */
  if (!strcmp(k->name, "model_family")) choices = CT_FAMILY_NAMES; /* the family registry */
  if (!strcmp(k->name, "model_flavour")) choices = CT_FAMILY_FLAVOURS;
  *out = (ct_config_key_info){k->name, tn[k->type], k->def, k->help, k->models, choices};
  return 1;
}

/* Append with growth; on allocation failure the dump is truncated (it is
 * diagnostic text and a digest input, never parsed back). */
typedef struct sbuf {
  char *p;
  size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t nc = (b->cap ? b->cap : 1024);
    while (nc < b->n + n + 1) nc *= 2;
    char *np = realloc(b->p, nc);
    if (!np) return;
    b->p = np, b->cap = nc;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) {
  sb_add(b, s, strlen(s));
}

static void sb_json_string(sbuf *b, const char *s) {
  sb_str(b, "\"");
  for (; *s; s++) {
    char e[8];
    if (*s == '"' || *s == '\\') {
      e[0] = '\\', e[1] = *s;
      sb_add(b, e, 2);
    } else if ((unsigned char)*s < 0x20) {
      snprintf(e, sizeof e, "\\u%04x", (unsigned char)*s);
      sb_str(b, e);
    } else {
      sb_add(b, s, 1);
    }
  }
  sb_str(b, "\"");
}

/* Keys that do not change the numbers a run computes. */
static int cosmetic(const char *k) {
  static const char *const c[] = {"output_dir",
                                  "output_dir_local",
                                  "output_aws_endpoint_url",
                                  "output_aws_region_name",
                                  "output_aws_addressing_style",
                                  "checkpoint_step_interval",
                                  "checkpoints_total_limit",
                                  "resume_from_checkpoint",
                                  "validation_prompt",
                                  "user_prompt_library",
                                  "validation_step_interval",
                                  "validation_num_inference_steps",
                                  "validation_guidance",
                                  "validation_resolution",
                                  "num_validation_images",
                                  "validation_seed",
                                  "disable_validation",
                                  "disable_progress_bar",
                                  "distributed_timeout",
                                  "ema_validation",
                                  "dataloader_prefetch",
                                  "dataloader_prefetch_qlen",
                                  "compress_disk_cache",
                                  "disk_cache_compression",
                                  "webhook_config",
                                  "webhook_timeout",
                                  "webhook_retries",
                                  "webhook_status_interval",
                                  "health_poll_interval",
                                  "health_ecc_threshold",
                                  "health_temp_margin",
                                  "health_nvml_library",
                                  "health_memory_low_percent",
                                  "disk_low_threshold",
                                  "disk_low_action",
                                  "disk_low_script",
                                  "gradient_checkpointing", /* bit-identical numbers either way */
                                  "gradient_checkpointing_interval",
                                  "compute_backend", /* cpu and sealed: the same bits */
                                  NULL};
  return is_one_of(k, c);
}

/* Inline webhook_config JSON with every auth_token value replaced and
 * webhook URLs cut to scheme://host (configs are written into checkpoints
 * and logs; secrets must not be). NULL: not inline JSON, write it as it is. */
static void redact_walk(ct_json *v) {
  if (v->type != CT_JSON_OBJECT && v->type != CT_JSON_ARRAY) return;
  for (size_t i = 0; i < v->n; i++) {
    ct_json *it = &v->items[i];
    const int url = v->type == CT_JSON_OBJECT && it->type == CT_JSON_STRING &&
                    (!strcmp(v->keys[i], "webhook_url") || !strcmp(v->keys[i], "callback_url"));
    if (url) { /* scheme://host only: a Discord webhook URL is itself a secret */
      const char *p = strstr(it->str, "://"), *host = p ? p + 3 : it->str;
      size_t hl = strcspn(host, "/?#");
      const char *at = memchr(host, '@', hl); /* user:password@ goes too */
      if (at) hl -= (size_t)(at + 1 - host), host = at + 1;
      char *r = malloc(hl + 40);
      if (r) {
        snprintf(r, hl + 40, "%.*s%.*s/<redacted>", p ? (int)(p + 3 - it->str) : 0, it->str,
                 (int)hl, host);
        free(it->str);
        it->str = r;
        it->len = strlen(r);
      }
    } else if (v->type == CT_JSON_OBJECT && !strcmp(v->keys[i], "auth_token") &&
               it->type == CT_JSON_STRING) {
      char *r = strdup("<redacted>");
      if (r) {
        free(it->str);
        it->str = r;
        it->len = strlen(r);
      }
    } else {
      redact_walk(it);
    }
  }
}
static char *redact_tokens(const char *s) {
  if (!s) return NULL;
  while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
  if (*s != '{' && *s != '[') return NULL;
  ct_json *j = NULL;
  ct_err e = {0};
  if (ct_json_parse(s, strlen(s), &j, &e)) return strdup("<webhook_config: not valid JSON>");
  redact_walk(j);
  char *buf = NULL;
  size_t len = 0, cap = 0;
  if (json_write(j, &buf, &len, &cap)) {
    free(buf);
    buf = strdup("<webhook_config>");
  }
  ct_json_free(j);
  return buf;
}

static char *dump(const ct_config *cfg, int math_only) {
  sbuf b = {0};
  sb_str(&b, "{");
  int first = 1;
  for (size_t i = 0; i < NKEYS; i++) {
    const key_def *k = &KEYS[i];
    if (math_only && cosmetic(k->name)) continue;
    const char *base = (const char *)cfg + k->off;
    char v[64];
    if (!first) sb_str(&b, ", ");
    first = 0;
    sb_json_string(&b, k->name);
    sb_str(&b, ": ");
    switch (k->type) {
      case K_INT:
        snprintf(v, sizeof v, "%ld", *(const long *)base);
        sb_str(&b, v);
        break;
      case K_NUM:
        snprintf(v, sizeof v, "%.17g", *(const double *)base);
        sb_str(&b, v);
        break;
      case K_BOOL:
        sb_str(&b, *(const int *)base ? "true" : "false");
        break;
      case K_STR: {
        const char *s = *(char *const *)base;
        char *red = !strcmp(k->name, "webhook_config") ? redact_tokens(s) : NULL;
        if (red)
          sb_json_string(&b, red);
        else if (s)
          sb_json_string(&b, s);
        else
          sb_str(&b, "null");
        free(red);
        break;
      }
    }
  }
  sb_str(&b, "}");
  return b.p;
}

char *ct_config_to_json(const ct_config *cfg) {
  return dump(cfg, 0);
}

void ct_config_digest(const ct_config *cfg, char out[17]) {
  char *s = dump(cfg, 1);
  uint64_t h = ct_hash_str(s ? s : "");
  free(s);
  snprintf(out, 17, "%016llx", (unsigned long long)h);
}

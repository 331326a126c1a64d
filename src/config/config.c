/* Config: one table (CT_CONFIG_KEYS) drives defaults, parsing, type checks,
 * the canonical dump and help, so a key is declared exactly once. */
#include "ctuner/config.h"
#include "ctuner/storage.h"
#include "ctuner/hash.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ctuner/json.h"
#include "ctuner/optim.h"

typedef enum { K_INT, K_NUM, K_BOOL, K_STR } ktype;

typedef struct key_def {
  const char *name;
  ktype type;
  const char *def;
  const char *help;
  size_t off;
} key_def;

static const key_def KEYS[] = {
#define CT_X(k, type, d, h) {#k, K_##type, d, h, offsetof(ct_config, k)},
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
};

static const char *type_name(ktype t) {
  switch (t) {
  case K_INT: return "an integer";
  case K_NUM: return "a number";
  case K_BOOL: return "a boolean (true/false)";
  default: return "a string";
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

static size_t edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 64 || lb > 64) return (size_t)-1;
  size_t row[65];
  for (size_t j = 0; j <= lb; j++) row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    size_t prev = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t cur = row[j];
      size_t sub = prev + (a[i - 1] != b[j - 1]);
      size_t del = row[j] + 1, ins = row[j - 1] + 1;
      row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
      prev = cur;
    }
  }
  return row[lb];
}

const char *ct_config_suggest(const char *key) {
  key = strip_dashes(key);
  const char *best = NULL;
  size_t bd = (size_t)-1;
  for (size_t i = 0; i < NKEYS; i++) {
    size_t d = edit_distance(key, KEYS[i].name);
    if (d < bd) bd = d, best = KEYS[i].name;
  }
  for (size_t i = 0; i < sizeof ALIASES / sizeof ALIASES[0]; i++) {
    size_t d = edit_distance(key, ALIASES[i].alias);
    if (d < bd) bd = d, best = ALIASES[i].alias;
  }
  /* Close enough to be a typo: a third of the length, at least 2 edits. */
  size_t lim = strlen(key) / 3;
  if (lim < 2) lim = 2;
  return bd <= lim ? best : NULL;
}

const char *ct_config_help(const char *key) {
  const key_def *k = find_key(key);
  return k ? k->help : NULL;
}

static ct_status unknown_key(const char *src, const char *key, ct_err *err) {
  const char *s = ct_config_suggest(key);
  if (s)
    return ct_errf(err, CT_ERR_INVALID, "%sunknown key '%s'; did you mean '%s'?", src, key, s);
  return ct_errf(err, CT_ERR_INVALID, "%sunknown key '%s' (docs/config.md lists every key)", src,
                 key);
}

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
    if (errno || end == v || *end)
      return ct_errf(err, CT_ERR_INVALID, "%skey '%s' expects an integer, got '%s'", where,
                     k->name, v);
    *(long *)base = x;
    return CT_OK;
  }
  case K_NUM: {
    double x = strtod(v, &end);
    if (errno || end == v || *end)
      return ct_errf(err, CT_ERR_INVALID, "%skey '%s' expects a number, got '%s'", where,
                     k->name, v);
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
      /* "none" means unset for optional strings; resume keeps it verbatim. */
      if (!strcmp(k->name, "resume_from_checkpoint")) return set_str((char **)base, "none", where, err);
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

ct_status ct_config_set(ct_config *cfg, const char *key, const char *value, ct_err *err) {
  const key_def *k = find_key(key);
  if (!k) return unknown_key("command line: ", strip_dashes(key), err);
  return set_text(cfg, k, value, "command line: ", err);
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
    if (ch == '"' || ch == '\\') snprintf(esc, sizeof esc, "\\%c", ch);
    else if (ch < 0x20) snprintf(esc, sizeof esc, "\\u%04x", ch);
    else esc[0] = (char)ch, esc[1] = 0;
    if (put(buf, len, cap, esc, strlen(esc))) return -1;
  }
  return put(buf, len, cap, "\"", 1);
}
static int json_write(const ct_json *v, char **buf, size_t *len, size_t *cap) {
  char num[64];
  switch (v->type) {
  case CT_JSON_NULL: return put(buf, len, cap, "null", 4);
  case CT_JSON_BOOL: return put(buf, len, cap, v->boolean ? "true" : "false", v->boolean ? 4 : 5);
  case CT_JSON_NUMBER:
    if (v->is_int) snprintf(num, sizeof num, "%lld", (long long)v->i64);
    else snprintf(num, sizeof num, "%.17g", v->num);
    return put(buf, len, cap, num, strlen(num));
  case CT_JSON_STRING: return put_str(buf, len, cap, v->str, v->len);
  case CT_JSON_ARRAY:
  case CT_JSON_OBJECT: {
    const int obj = v->type == CT_JSON_OBJECT;
    if (put(buf, len, cap, obj ? "{" : "[", 1)) return -1;
    for (size_t i = 0; i < v->n; i++) {
      if (i && put(buf, len, cap, ", ", 2)) return -1;
      if (obj && (put_str(buf, len, cap, v->keys[i], strlen(v->keys[i])) || put(buf, len, cap, ": ", 2)))
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
        ((v->type == CT_JSON_OBJECT || v->type == CT_JSON_ARRAY) && !strcmp(k->name, "webhook_config"))) {
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
  return ct_errf(err, CT_ERR_INVALID, "%sline %d, column %d: key '%s' expects %s, got %s",
                 where, v->line, v->col, k->name, type_name(k->type), got);
}

ct_status ct_config_load_file(ct_config *cfg, const char *path, ct_err *err) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return ct_errf(err, CT_ERR_IO, "%s: cannot open the config file: %s", path, strerror(errno));
  char *text = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len + 4096 + 1 > cap) {
      cap = cap ? cap * 2 : 8192;
      if (cap > (64u << 20)) {
        free(text);
        fclose(f);
        return ct_errf(err, CT_ERR_RANGE, "%s: config file larger than 64 MB", path);
      }
      char *nt = realloc(text, cap);
      if (!nt) {
        free(text);
        fclose(f);
        return ct_errf(err, CT_ERR_NOMEM, "out of memory");
      }
      text = nt;
    }
    size_t r = fread(text + len, 1, 4096, f);
    len += r;
    if (r < 4096) break;
  }
  int rerr = ferror(f);
  fclose(f);
  if (rerr) {
    free(text);
    return ct_errf(err, CT_ERR_IO, "%s: read error", path);
  }
  ct_json *j = NULL;
  ct_status st = ct_json_parse(text, len, &j, err);
  free(text);
  if (st) {
    ct_err_prefix(err, "%s: ", path);
    return st;
  }
  if (j->type != CT_JSON_OBJECT) {
    const char *got = ct_json_type_name(j->type); /* a static string; read before the free */
    ct_json_free(j);
    return ct_errf(err, CT_ERR_FORMAT, "%s: expected a JSON object of options, got %s", path, got);
  }
  char where[600];
  snprintf(where, sizeof where, "%s: ", path);
  for (size_t i = 0; i < j->n && !st; i++) {
    const key_def *k = find_key(j->keys[i]);
    if (!k) {
      st = unknown_key(where, j->keys[i], err);
      break;
    }
    st = set_json(cfg, k, &j->items[i], where, err);
  }
  ct_json_free(j);
  return st;
}

/* 1 onebitadam, 2 zerooneadam, 3 onebitlamb (any spelling), else 0: the same
 * names as ct_onebit_name (src/train/onebit.c), which config cannot call since
 * train sits above it; both give way when the 1-bit family joins the optimizer
 * registry (issue 17, item 5). */
static int onebit_kind(const char *s) {
  static const char *const names[3][3] = {{"onebitadam", "1bitadam", "onebit_adam"},
                                          {"zerooneadam", "01adam", "zeroone_adam"},
                                          {"onebitlamb", "1bitlamb", "onebit_lamb"}};
  char low[32];
  size_t n = 0;
  for (; s && s[n] && n + 1 < sizeof low; n++) low[n] = (char)tolower((unsigned char)s[n]);
  low[n] = 0;
  for (int k = 0; k < 3; k++)
    for (int a = 0; a < 3; a++)
      if (s && !strcmp(low, names[k][a])) return k + 1;
  return 0;
}

static int is_one_of(const char *s, const char *const *choices) {
  for (; *choices; choices++)
    if (!strcmp(s, *choices)) return 1;
  return 0;
}

#define BAD(...) return ct_errf(err, CT_ERR_INVALID, __VA_ARGS__)

ct_status ct_config_validate(const ct_config *c, ct_err *err) {
  static const char *const families[] = {"flux", NULL};
  if (!c->model_family || !is_one_of(c->model_family, families))
    BAD("model_family '%s' is not supported; use \"flux\"", c->model_family ? c->model_family : "");
  if (!c->model_type || (strcmp(c->model_type, "full") && strcmp(c->model_type, "vae")))
    BAD("model_type '%s' is not supported; use \"full\" (the MMDiT) or \"vae\" (LoRA is not implemented yet)",
        c->model_type ? c->model_type : "");
  if (!strcmp(c->model_type, "vae") && !c->vae_config && !c->pretrained_vae_model_name_or_path)
    BAD("model_type vae needs vae_config (a diffusers config.json to train from scratch) or "
        "pretrained_vae_model_name_or_path (a VAE directory to fine-tune)");
  if (!c->vae_loss || (strcmp(c->vae_loss, "l1") && strcmp(c->vae_loss, "l2")))
    BAD("vae_loss must be l1 or l2, got '%s'", c->vae_loss ? c->vae_loss : "");
  if (!(c->vae_kl_weight >= 0)) BAD("vae_kl_weight must be >= 0, got %g", c->vae_kl_weight);
  if (c->vae_stats_images < 1) BAD("vae_stats_images must be >= 1, got %ld", c->vae_stats_images);
  if (!c->preset) BAD("preset is required (tiny, small, bench)");
  if (!c->output_dir || !*c->output_dir) BAD("output_dir must be a directory path");
  if (!strncmp(c->output_dir, "s3://", 5)) {
    char *b = NULL, *pf = NULL;
    int ok = ct_storage_parse_s3_url(c->output_dir, &b, &pf) && b[0] && (!pf[0] || ct_storage_key_ok(pf));
    free(b), free(pf);
    if (!ok) BAD("output_dir '%s' must be s3://bucket/prefix (a prefix without empty, '.' or '..' segments)", c->output_dir);
    if (c->model_type && !strcmp(c->model_type, "vae"))
      BAD("output_dir s3://... is supported for the MMDiT trainer only; for model_type vae use a local output_dir");
  }
  if (!c->output_aws_addressing_style || (strcmp(c->output_aws_addressing_style, "auto") &&
                                          strcmp(c->output_aws_addressing_style, "path") &&
                                          strcmp(c->output_aws_addressing_style, "virtual")))
    BAD("output_aws_addressing_style must be auto, path or virtual, got '%s'",
        c->output_aws_addressing_style ? c->output_aws_addressing_style : "");
  if (c->seed < 0) BAD("seed must be >= 0, got %ld", c->seed);
  if (c->resolution < 0 || c->resolution > 4096)
    BAD("resolution must be between 0 and 4096, got %ld", c->resolution);
  if (c->aspect_bucket_alignment != 8 && c->aspect_bucket_alignment != 16 && c->aspect_bucket_alignment != 24 &&
      c->aspect_bucket_alignment != 32 && c->aspect_bucket_alignment != 64)
    BAD("aspect_bucket_alignment must be 8, 16, 24, 32 or 64, got %ld", c->aspect_bucket_alignment);
  if (c->aspect_bucket_rounding < 0 || c->aspect_bucket_rounding > 6)
    BAD("aspect_bucket_rounding must be between 0 and 6, got %ld", c->aspect_bucket_rounding);
  {
    static const char *const comps[] = {"gzip", "zstd", NULL};
    if (!c->disk_cache_compression || !is_one_of(c->disk_cache_compression, comps))
      BAD("disk_cache_compression must be gzip or zstd, got '%s'",
          c->disk_cache_compression ? c->disk_cache_compression : "");
  }
  if (!(c->webhook_timeout > 0 && c->webhook_timeout <= 600))
    BAD("webhook_timeout must be between 0 and 600 seconds, got %g", c->webhook_timeout);
  if (!(c->webhook_status_interval >= 0))
    BAD("webhook_status_interval must be >= 0 seconds, got %g", c->webhook_status_interval);
  if (c->webhook_retries < 0 || c->webhook_retries > 20)
    BAD("webhook_retries must be between 0 and 20, got %ld", c->webhook_retries);
  if (!(c->health_poll_interval >= 0.01 && c->health_poll_interval <= 3600))
    BAD("health_poll_interval must be between 0.01 and 3600 seconds, got %g", c->health_poll_interval);
  if (c->health_ecc_threshold < 1) BAD("health_ecc_threshold must be >= 1, got %ld", c->health_ecc_threshold);
  if (!(c->health_temp_margin >= 0 && c->health_temp_margin <= 100))
    BAD("health_temp_margin must be between 0 and 100 degrees, got %g", c->health_temp_margin);
  if (!(c->health_memory_low_percent >= 0 && c->health_memory_low_percent < 100))
    BAD("health_memory_low_percent must be between 0 and 100, got %g", c->health_memory_low_percent);
  if (c->disk_low_threshold && ct_parse_bytes(c->disk_low_threshold) < 0)
    BAD("disk_low_threshold must be a size such as 10G, 500M or 1048576 (bytes), got '%s'", c->disk_low_threshold);
  {
    static const char *const acts[] = {"stop", "wait", "script", NULL};
    if (!c->disk_low_action || !is_one_of(c->disk_low_action, acts))
      BAD("disk_low_action must be stop, wait or script, got '%s'", c->disk_low_action ? c->disk_low_action : "");
    if (!strcmp(c->disk_low_action, "script") && (!c->disk_low_script || !c->disk_low_script[0]))
      BAD("disk_low_action=script needs disk_low_script (the command to run)");
  }
  if (c->dataloader_prefetch_qlen < 1 || c->dataloader_prefetch_qlen > 256)
    BAD("dataloader_prefetch_qlen must be between 1 and 256, got %ld", c->dataloader_prefetch_qlen);
  if (c->train_batch_size < 1 || c->train_batch_size > 4096)
    BAD("train_batch_size must be between 1 and 4096, got %ld", c->train_batch_size);
  if (c->gradient_accumulation_steps < 1)
    BAD("gradient_accumulation_steps must be >= 1, got %ld", c->gradient_accumulation_steps);
  if (c->max_train_steps < 0) BAD("max_train_steps must be >= 0, got %ld", c->max_train_steps);
  if (c->max_train_steps == 0 && c->num_train_epochs < 1)
    BAD("set max_train_steps or num_train_epochs (>= 1)");
  if (!(c->learning_rate >= 0) || !isfinite(c->learning_rate))
    BAD("learning_rate must be a finite number >= 0, got %g", c->learning_rate);
  ct_sched_kind sk;
  if (!c->lr_scheduler) BAD("lr_scheduler is required");
  ct_status st = ct_sched_kind_parse(c->lr_scheduler, &sk, err);
  if (st) {
    ct_err_prefix(err, "lr_scheduler: ");
    return st;
  }
  if (c->lr_warmup_steps < 0) BAD("lr_warmup_steps must be >= 0, got %ld", c->lr_warmup_steps);
  if (!c->warmup_type || (strcmp(c->warmup_type, "log") && strcmp(c->warmup_type, "linear")))
    BAD("warmup_type must be \"log\" or \"linear\", got '%s'", c->warmup_type ? c->warmup_type : "");
  ct_optim_kind ok = CT_OPTIM_ADAMW;
  if (!c->optimizer) BAD("optimizer is required");
  if (c->freeze_step < 0) BAD("freeze_step must be >= 0, got %ld", c->freeze_step);
  if (c->var_freeze_step < 0) BAD("var_freeze_step must be >= 0, got %ld", c->var_freeze_step);
  if (c->var_update_scaler < 1) BAD("var_update_scaler must be >= 1, got %ld", c->var_update_scaler);
  if (c->local_step_scaler < 1) BAD("local_step_scaler must be >= 1, got %ld", c->local_step_scaler);
  if (c->local_step_clipper < 1) BAD("local_step_clipper must be >= 1, got %ld", c->local_step_clipper);
  if (onebit_kind(c->optimizer)) { /* 1-bit Adam, 0/1 Adam: data parallel over float32 */
    if (!(c->lamb_min_coeff > 0 && c->lamb_max_coeff >= c->lamb_min_coeff))
      BAD("lamb_min_coeff (%g) must be > 0 and <= lamb_max_coeff (%g)", c->lamb_min_coeff, c->lamb_max_coeff);
    if (!(c->lamb_coeff_beta >= 0 && c->lamb_coeff_beta < 1))
      BAD("lamb_coeff_beta must be in [0, 1), got %g", c->lamb_coeff_beta);
    if (!(c->lamb_factor_min > 0 && c->lamb_factor_max >= c->lamb_factor_min && c->lamb_factor_threshold >= 0))
      BAD("lamb_factor_min (%g) must be > 0 and <= lamb_factor_max (%g), lamb_factor_threshold >= 0 (%g)",
          c->lamb_factor_min, c->lamb_factor_max, c->lamb_factor_threshold);
    if (onebit_kind(c->optimizer) != 2 && c->freeze_step < 1)
      BAD("optimizer onebitadam needs freeze_step >= 1: the frozen variance comes from the warm-up steps");
    if (c->zero_stage != 0)
      BAD("optimizer %s communicates the momentum itself and works with zero_stage 0 only (as in "
          "DeepSpeed), got %ld",
          c->optimizer, c->zero_stage);
    if (c->mixed_precision && !strcmp(c->mixed_precision, "bf16"))
      BAD("optimizer %s keeps float32 storage; set mixed_precision no", c->optimizer);
    if (c->offload_optimizer && !strcmp(c->offload_optimizer, "nvme"))
      BAD("optimizer %s cannot offload its state; set offload_optimizer none", c->optimizer);
  }
  st = onebit_kind(c->optimizer) ? CT_OK : ct_optim_kind_parse(c->optimizer, &ok, err);
  if (st) {
    ct_err_prefix(err, "optimizer: ");
    return st;
  }
  if (!(c->adam_beta1 >= 0 && c->adam_beta1 < 1)) BAD("adam_beta1 must be in [0, 1), got %g", c->adam_beta1);
  if (!(c->adam_beta2 >= 0 && c->adam_beta2 < 1)) BAD("adam_beta2 must be in [0, 1), got %g", c->adam_beta2);
  if (!(c->adam_epsilon >= 0)) BAD("adam_epsilon must be >= 0, got %g", c->adam_epsilon);
  if (!(c->adam_weight_decay >= 0)) BAD("adam_weight_decay must be >= 0, got %g", c->adam_weight_decay);
  if (!(c->optimizer_momentum >= 0 && c->optimizer_momentum < 1))
    BAD("optimizer_momentum must be in [0, 1), got %g", c->optimizer_momentum);
  if (c->muon_ns_steps < 1 || c->muon_ns_steps > 20)
    BAD("muon_ns_steps must be between 1 and 20, got %ld", c->muon_ns_steps);
  if (!(c->muon_momentum >= 0 && c->muon_momentum < 1))
    BAD("muon_momentum must be in [0, 1), got %g", c->muon_momentum);
  if (!(c->muon_adamw_lr >= 0 && c->muon_adamw_lr <= 1e3))
    BAD("muon_adamw_lr must be in [0, 1000], got %g", c->muon_adamw_lr);
  if (c->mup_base_hidden < 0) BAD("mup_base_hidden must be >= 0, got %ld", c->mup_base_hidden);
  if (!(c->max_grad_norm >= 0)) BAD("max_grad_norm must be >= 0 (0 disables), got %g", c->max_grad_norm);
  if (c->max_nonfinite_steps < 1) BAD("max_nonfinite_steps must be >= 1, got %ld", c->max_nonfinite_steps);
  if (c->zero_stage < 0 || c->zero_stage > 3) BAD("zero_stage must be 0, 1, 2 or 3, got %ld", c->zero_stage);
  /* "none" reads as unset (NULL) */
  static const char *const offd[] = {"cpu", "nvme", NULL};
  if (c->offload_optimizer && !is_one_of(c->offload_optimizer, offd))
    BAD("offload_optimizer must be none, cpu or nvme, got '%s'", c->offload_optimizer);
  if (c->offload_param && !is_one_of(c->offload_param, offd))
    BAD("offload_param must be none, cpu or nvme, got '%s'", c->offload_param);
  const int onv = c->offload_optimizer && !strcmp(c->offload_optimizer, "nvme");
  const int pnv = c->offload_param && !strcmp(c->offload_param, "nvme");
  if (pnv && c->zero_stage != 3)
    BAD("offload_param nvme needs zero_stage 3 (parameters are sharded there; below it every rank holds all "
        "of them), got zero_stage %ld",
        c->zero_stage);
  if (pnv && c->mixed_precision && !strcmp(c->mixed_precision, "bf16"))
    BAD("offload_param nvme works with float32 storage; set mixed_precision no");
  if ((onv || pnv) && (!c->offload_param_path || !*c->offload_param_path))
    BAD("offload_%s nvme needs offload_param_path: a directory on the device for the swap files",
        onv ? "optimizer" : "param");
  if (c->offload_buffer_size < 0) BAD("offload_buffer_size must be >= 0 (0: auto), got %ld", c->offload_buffer_size);
  if (c->reduce_bucket_size < 0) BAD("reduce_bucket_size must be >= 0 (0: auto), got %ld", c->reduce_bucket_size);
  if (!(c->ema_decay >= 0 && c->ema_decay < 1)) BAD("ema_decay must be in [0, 1), got %g", c->ema_decay);
  if (c->ema_update_interval < 1) BAD("ema_update_interval must be >= 1, got %ld", c->ema_update_interval);
  static const char *const emav[] = {"none", "ema_only", "comparison", NULL};
  if (!c->ema_validation || !is_one_of(c->ema_validation, emav))
    BAD("ema_validation must be none, ema_only or comparison, got '%s'",
        c->ema_validation ? c->ema_validation : "");
  if (c->checkpoint_step_interval < 0) BAD("checkpoint_step_interval must be >= 0, got %ld", c->checkpoint_step_interval);
  if (c->checkpoints_total_limit < 0) BAD("checkpoints_total_limit must be >= 0, got %ld", c->checkpoints_total_limit);
  if (c->validation_step_interval < 0) BAD("validation_step_interval must be >= 0, got %ld", c->validation_step_interval);
  if (c->validation_num_inference_steps < 1 || c->validation_num_inference_steps > 1000)
    BAD("validation_num_inference_steps must be between 1 and 1000, got %ld", c->validation_num_inference_steps);
  if (!(c->validation_guidance >= 0)) BAD("validation_guidance must be >= 0, got %g", c->validation_guidance);
  if (c->num_validation_images < 1 || c->num_validation_images > 64)
    BAD("num_validation_images must be between 1 and 64, got %ld", c->num_validation_images);
  if (!(c->caption_dropout_probability >= 0 && c->caption_dropout_probability <= 1))
    BAD("caption_dropout_probability must be in [0, 1], got %g", c->caption_dropout_probability);
  static const char *const ts[] = {"logit_normal", "uniform", NULL};
  if (!c->timestep_sampling || !is_one_of(c->timestep_sampling, ts))
    BAD("timestep_sampling must be logit_normal or uniform, got '%s'",
        c->timestep_sampling ? c->timestep_sampling : "");
  if (!(c->logit_std > 0)) BAD("logit_std must be > 0, got %g", c->logit_std);
  if (!(c->flow_shift > 0 && c->flow_shift < 1000)) BAD("flow_shift must be in (0, 1000), got %g", c->flow_shift);
  if (!c->text_encoder || (strcmp(c->text_encoder, "clip-byte") && strcmp(c->text_encoder, "clip-bpe")))
    BAD("text_encoder '%s' is not supported; use \"clip-byte\" or \"clip-bpe\"",
        c->text_encoder ? c->text_encoder : "");
  if (!strcmp(c->text_encoder, "clip-bpe") && (!c->tokenizer_vocab || !c->tokenizer_merges))
    BAD("text_encoder \"clip-bpe\" needs tokenizer_vocab (vocab.json) and tokenizer_merges (merges.txt)");
  if (c->text_encoder_layers < 1 || c->text_encoder_layers > 48)
    BAD("text_encoder_layers must be between 1 and 48, got %ld", c->text_encoder_layers);
  if (c->tokenizer_max_length < 0 || c->tokenizer_max_length > 77 || c->tokenizer_max_length == 1)
    BAD("tokenizer_max_length must be 0 (preset) or between 2 and 77, got %ld", c->tokenizer_max_length);
  if (c->codec && !strcmp(c->codec, "vae") && !c->pretrained_vae_model_name_or_path)
    BAD("codec vae needs pretrained_vae_model_name_or_path (a VAE directory: config.json + "
        "diffusion_pytorch_model.safetensors, e.g. the output_dir/vae of a model_type vae run)");
  if (c->vae_tile < 0 || c->vae_tile > 16384) BAD("vae_tile must be between 0 and 16384, got %ld", c->vae_tile);
  if (!c->codec || (strcmp(c->codec, "pixel") && strcmp(c->codec, "vae")))
    BAD("codec '%s' is not supported; use \"pixel\" or \"vae\"",
        c->codec ? c->codec : "");
  if (c->codec_scale != 0 && c->codec_scale != 1 && c->codec_scale != 2 && c->codec_scale != 4)
    BAD("codec_scale must be 0 (from the preset), 1, 2 or 4, got %ld", c->codec_scale);
  if (!c->mixed_precision ||
      (strcmp(c->mixed_precision, "no") && strcmp(c->mixed_precision, "fp32") && strcmp(c->mixed_precision, "bf16")))
    BAD("mixed_precision '%s' is not supported; use \"no\" (float32) or \"bf16\"%s",
        c->mixed_precision ? c->mixed_precision : "",
        c->mixed_precision && !strcmp(c->mixed_precision, "fp16") ? " (fp16 needs loss scaling ctuner does not do)" : "");
  if (c->num_threads < 0 || c->num_threads > 1024) BAD("num_threads must be between 0 and 1024, got %ld", c->num_threads);
  if (!c->resume_from_checkpoint) BAD("resume_from_checkpoint must be latest, none or a path");
  return CT_OK;
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

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

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
  static const char *const c[] = {"output_dir", "output_dir_local", "output_aws_endpoint_url",
                                  "output_aws_region_name", "output_aws_addressing_style", "checkpoint_step_interval", "checkpoints_total_limit",
                                  "resume_from_checkpoint", "validation_prompt", "user_prompt_library",
                                  "validation_step_interval", "validation_num_inference_steps",
                                  "validation_guidance", "validation_resolution",
                                  "num_validation_images", "validation_seed", "disable_validation",
                                  "disable_progress_bar", "ema_validation", "dataloader_prefetch",
                                  "dataloader_prefetch_qlen", "compress_disk_cache", "disk_cache_compression",
                                  "webhook_config", "webhook_timeout", "webhook_retries", "webhook_status_interval", "health_poll_interval",
                                  "health_ecc_threshold", "health_temp_margin", "health_nvml_library",
                                  "health_memory_low_percent", "disk_low_threshold", "disk_low_action",
                                  "disk_low_script", NULL};
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
        snprintf(r, hl + 40, "%.*s%.*s/<redacted>", p ? (int)(p + 3 - it->str) : 0, it->str, (int)hl, host);
        free(it->str);
        it->str = r;
        it->len = strlen(r);
      }
    } else if (v->type == CT_JSON_OBJECT && !strcmp(v->keys[i], "auth_token") && it->type == CT_JSON_STRING) {
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

char *ct_config_to_json(const ct_config *cfg) { return dump(cfg, 0); }

void ct_config_digest(const ct_config *cfg, char out[17]) {
  char *s = dump(cfg, 1);
  uint64_t h = ct_hash_str(s ? s : "");
  free(s);
  snprintf(out, 17, "%016llx", (unsigned long long)h);
}

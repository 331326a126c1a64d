/* deepspeed.c: a DeepSpeed config (deepspeed_config: a JSON file or an inline
 * object) read, validated and folded into the trainer's own keys
 * (docs/distributed.md, "deepspeed_config").
 *
 * "auto" keeps the trainer's value; absent sections are filled from the
 * trainer's keys (AdamW, the configured schedule); optimizer names are
 * case-insensitive, and cpuadam/fusedadam/unknown names become AdamW with a
 * warning naming the original. What ctuner cannot do (fp16, NVMe parameter
 * offload, the 1-bit optimizers) is an error that says so.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ctuner/config.h"
#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/log.h"

static int is_auto(const ct_json *v) {
  return v && v->type == CT_JSON_STRING && !strcasecmp(v->str, "auto");
}

/* A number (or "auto": *set = 0). */
static ct_status num(const ct_json *o, const char *key, const char *where, double *out, int *set,
                     ct_err *err) {
  *set = 0;
  const ct_json *v = o ? ct_json_get(o, key) : NULL;
  if (!v || is_auto(v)) return CT_OK;
  if (v->type != CT_JSON_NUMBER)
    return ct_errf(err, CT_ERR_INVALID,
                   "deepspeed_config: %s%s: expected a number or \"auto\", got %s (line %d)", where,
                   key, ct_json_type_name(v->type), v->line);
  *out = v->num;
  *set = 1;
  return CT_OK;
}

static ct_status posint(const ct_json *o, const char *key, const char *where, long *out, int *set,
                        ct_err *err) {
  double d = 0;
  ct_status st = num(o, key, where, &d, set, err);
  if (st || !*set) return st;
  if (d < 1 || d > 1e9 || d != floor(d))
    return ct_errf(err, CT_ERR_INVALID,
                   "deepspeed_config: %s%s: expected a positive integer, got %g", where, key, d);
  *out = (long)d;
  return CT_OK;
}

static ct_status enabled(const ct_json *root, const char *sect, int *on, ct_err *err) {
  *on = 0;
  const ct_json *s = ct_json_get(root, sect);
  if (!s) return CT_OK;
  const ct_json *e = s->type == CT_JSON_OBJECT ? ct_json_get(s, "enabled") : NULL;
  if (s->type != CT_JSON_OBJECT || (e && e->type != CT_JSON_BOOL && !is_auto(e)))
    return ct_errf(err, CT_ERR_INVALID, "deepspeed_config: %s: expected {\"enabled\": true|false}",
                   sect);
  *on = e && e->type == CT_JSON_BOOL && e->boolean;
  return CT_OK;
}

static ct_status set_key(ct_config *cfg, const char *key, const char *val, ct_err *err) {
  ct_status st = ct_config_set(cfg, key, val, err);
  if (st) ct_err_prefix(err, "deepspeed_config: ");
  return st;
}

/* For each (DeepSpeed key, ctuner key): a number in o (not "auto") sets the ctuner key. */
static ct_status copy_numbers(ct_config *cfg, const ct_json *o, const char *where,
                              const char *const (*pairs)[2], size_t n, ct_err *err) {
  ct_status st = CT_OK;
  for (size_t i = 0; i < n && !st; i++) {
    double d;
    int set;
    st = num(o, pairs[i][0], where, &d, &set, err);
    if (!st && set) {
      char buf[64];
      snprintf(buf, sizeof buf, "%.17g", d);
      st = set_key(cfg, pairs[i][1], buf, err);
    }
  }
  return st;
}

static ct_status apply_optimizer(ct_config *cfg, const ct_json *o, ct_err *err) {
  if (o->type != CT_JSON_OBJECT)
    return ct_errf(err, CT_ERR_INVALID, "deepspeed_config: optimizer: expected an object");
  const ct_json *t = ct_json_get(o, "type");
  if (!t || t->type != CT_JSON_STRING)
    return ct_errf(err, CT_ERR_INVALID,
                   "deepspeed_config: optimizer.type: expected a string such as \"AdamW\"");
  char low[64];
  size_t n = 0;
  for (const char *p = t->str; *p && n + 1 < sizeof low; p++)
    if (*p != '_' && *p != '-') low[n++] = (char)tolower((unsigned char)*p);
  low[n] = 0;
  const char *mapped = NULL;
  static const char *const same[] = {"adamw", "adam",   "adagrad", "lamb",  "lion", "sgd",
                                     "muon",  "muadam", "muadamw", "musgd", NULL};
  for (const char *const *s = same; *s; s++)
    if (!strcmp(low, *s)) mapped = *s;
  /* DeepSpeed's "Adam" is AdamW unless adam_w_mode is false (its default is true) */
  if (mapped && !strcmp(mapped, "adam")) {
    const ct_json *pp = ct_json_get(o, "params");
    const ct_json *wm = pp && pp->type == CT_JSON_OBJECT ? ct_json_get(pp, "adam_w_mode") : NULL;
    mapped = wm && wm->type == CT_JSON_BOOL && !wm->boolean ? "adam" : "adamw";
  }
  if (!strcmp(low, "onebitadam")) mapped = "onebitadam";
  if (!strcmp(low, "zerooneadam")) mapped = "zerooneadam";
  if (!strcmp(low, "onebitlamb")) mapped = "onebitlamb";
  if (!mapped) {
    CT_WARN("deepspeed_config: optimizer '%s' is not one of ctuner's; using AdamW (%s)", t->str,
            !strcmp(low, "cpuadam") || !strcmp(low, "fusedadam") || !strcmp(low, "deepspeedcpuadam")
                ? "a device-specific Adam implementation"
                : "unknown name");
    mapped = "adamw";
  }
  ct_status st = set_key(cfg, "optimizer", mapped, err);
  const ct_json *p = ct_json_get(o, "params");
  if (st || !p) return st;
  if (p->type != CT_JSON_OBJECT)
    return ct_errf(err, CT_ERR_INVALID, "deepspeed_config: optimizer.params: expected an object");
  char buf[64];
  static const char *const pairs[][2] = {{"lr", "learning_rate"},
                                         {"eps", "adam_epsilon"},
                                         {"weight_decay", "adam_weight_decay"},
                                         {"momentum", "optimizer_momentum"}};
  st = copy_numbers(cfg, p, "optimizer.params.", pairs, 4, err);
  static const char *const fz[][2] = {{"freeze_step", "freeze_step"},
                                      {"var_freeze_step", "var_freeze_step"},
                                      {"var_update_scaler", "var_update_scaler"},
                                      {"local_step_scaler", "local_step_scaler"},
                                      {"local_step_clipper", "local_step_clipper"},
                                      {"max_coeff", "lamb_max_coeff"},
                                      {"min_coeff", "lamb_min_coeff"},
                                      {"coeff_beta", "lamb_coeff_beta"},
                                      {"factor_max", "lamb_factor_max"},
                                      {"factor_min", "lamb_factor_min"},
                                      {"factor_threshold", "lamb_factor_threshold"}};
  if (!st) st = copy_numbers(cfg, p, "optimizer.params.", fz, 11, err);
  const ct_json *b = ct_json_get(p, "betas");
  if (!st && b && !is_auto(b)) {
    if (b->type != CT_JSON_ARRAY || b->n != 2 || b->items[0].type != CT_JSON_NUMBER ||
        b->items[1].type != CT_JSON_NUMBER)
      return ct_errf(err, CT_ERR_INVALID,
                     "deepspeed_config: optimizer.params.betas: expected [beta1, beta2]");
    snprintf(buf, sizeof buf, "%.17g", b->items[0].num);
    st = set_key(cfg, "adam_beta1", buf, err);
    snprintf(buf, sizeof buf, "%.17g", b->items[1].num);
    if (!st) st = set_key(cfg, "adam_beta2", buf, err);
  }
  return st;
}

static ct_status apply_scheduler(ct_config *cfg, const ct_json *s, ct_err *err) {
  const ct_json *t = s->type == CT_JSON_OBJECT ? ct_json_get(s, "type") : NULL;
  if (!t || t->type != CT_JSON_STRING)
    return ct_errf(err, CT_ERR_INVALID,
                   "deepspeed_config: scheduler.type: expected \"WarmupLR\" or \"WarmupDecayLR\"");
  const char *kind = !strcasecmp(t->str, "WarmupLR")        ? "WarmupLR"
                     : !strcasecmp(t->str, "WarmupDecayLR") ? "WarmupDecayLR"
                                                            : NULL;
  if (!kind)
    return ct_errf(
        err, CT_ERR_UNSUPPORTED,
        "deepspeed_config: scheduler %s is not supported; use WarmupLR or WarmupDecayLR (or leave "
        "the scheduler out and set lr_scheduler)",
        t->str);
  ct_status st = set_key(cfg, "lr_scheduler", kind, err);
  const ct_json *p = ct_json_get(s, "params");
  if (st || !p) return st;
  if (p->type != CT_JSON_OBJECT)
    return ct_errf(err, CT_ERR_INVALID, "deepspeed_config: scheduler.params: expected an object");
  double d;
  int set;
  char buf[64];
  static const char *const pairs[][2] = {{"warmup_min_lr", "warmup_min_lr"},
                                         {"warmup_max_lr", "learning_rate"},
                                         {"warmup_num_steps", "lr_warmup_steps"}};
  st = copy_numbers(cfg, p, "scheduler.params.", pairs, 3, err);
  const ct_json *wt = ct_json_get(p, "warmup_type");
  if (!st && wt && !is_auto(wt)) {
    if (wt->type != CT_JSON_STRING || (strcmp(wt->str, "log") && strcmp(wt->str, "linear")))
      return ct_errf(
          err, CT_ERR_INVALID,
          "deepspeed_config: scheduler.params.warmup_type: expected \"log\" or \"linear\"");
    st = set_key(cfg, "warmup_type", wt->str, err);
  }
  if (!st) {
    st = num(p, "total_num_steps", "scheduler.params.", &d, &set, err);
    if (!st && set) {
      if (cfg->max_train_steps && (long)d != cfg->max_train_steps)
        CT_WARN(
            "deepspeed_config: scheduler total_num_steps %.0f differs from max_train_steps %ld; "
            "the "
            "schedule decays over max_train_steps",
            d, cfg->max_train_steps);
      else if (!cfg->max_train_steps) {
        snprintf(buf, sizeof buf, "%.0f", d);
        st = set_key(cfg, "max_train_steps", buf, err);
      }
    }
  }
  return st;
}

ct_status ct_deepspeed_apply(ct_config *cfg, int world, ct_err *err) {
  const char *src = cfg->deepspeed_config;
  if (!src || !*src) return CT_OK;
  char *text = NULL;
  size_t len = 0;
  const char *p = src;
  while (isspace((unsigned char)*p)) p++;
  ct_status st;
  if (*p == '{') {
    text = strdup(p);
    len = text ? strlen(text) : 0;
    if (!text) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  } else {
    st = ct_read_file(src, 1 << 20, &text, &len, err);
    if (st) {
      ct_err_prefix(err, "deepspeed_config: ");
      return st;
    }
  }
  ct_json *j = NULL;
  st = ct_json_parse(text, len, &j, err);
  free(text);
  if (st) {
    ct_err_prefix(err, "deepspeed_config %s: ", *p == '{' ? "(inline)" : src);
    return st;
  }
  if (j->type != CT_JSON_OBJECT) {
    ct_json_free(j);
    return ct_errf(err, CT_ERR_FORMAT, "deepspeed_config: expected a JSON object");
  }
  int on = 0;
  st = enabled(j, "bf16", &on, err);
  if (!st && on) st = set_key(cfg, "mixed_precision", "bf16", err);
  if (!st) st = enabled(j, "fp16", &on, err);
  if (!st && on)
    st = ct_errf(err, CT_ERR_UNSUPPORTED,
                 "deepspeed_config: fp16.enabled: fp16 is not supported (it needs loss "
                 "scaling); use \"bf16\": {\"enabled\": true} or false");
  long micro = cfg->train_batch_size, accum = cfg->gradient_accumulation_steps, total = 0;
  int set_m = 0, set_a = 0, set_t = 0;
  if (!st) st = posint(j, "train_micro_batch_size_per_gpu", "", &micro, &set_m, err);
  if (!st) st = posint(j, "gradient_accumulation_steps", "", &accum, &set_a, err);
  if (!st) st = posint(j, "train_batch_size", "", &total, &set_t, err);
  if (!st && set_t) {
    if (!set_m && set_a && total % (accum * world) == 0) micro = total / (accum * world), set_m = 1;
    if (!set_a && set_m && total % (micro * world) == 0) accum = total / (micro * world), set_a = 1;
    if ((double)micro * (double)accum * (double)world != (double)total)
      st = ct_errf(err, CT_ERR_INVALID,
                   "deepspeed_config: train_batch_size %ld != train_micro_batch_size_per_gpu %ld x "
                   "gradient_accumulation_steps %ld x %d rank(s) = %ld; fix one of them (or set it "
                   "to \"auto\")",
                   total, micro, accum, world, micro * accum * world);
  }
  char buf[64];
  if (!st && set_m)
    snprintf(buf, sizeof buf, "%ld", micro), st = set_key(cfg, "train_batch_size", buf, err);
  if (!st && set_a)
    snprintf(buf, sizeof buf, "%ld", accum),
        st = set_key(cfg, "gradient_accumulation_steps", buf, err);
  static const char *const clip[][2] = {{"gradient_clipping", "max_grad_norm"}};
  if (!st) st = copy_numbers(cfg, j, "", clip, 1, err);
  double d;
  int set;
  const ct_json *z = ct_json_get(j, "zero_optimization");
  if (!st && z) {
    if (z->type != CT_JSON_OBJECT) {
      st = ct_errf(err, CT_ERR_INVALID, "deepspeed_config: zero_optimization: expected an object");
    } else {
      long stage = 0;
      st = num(z, "stage", "zero_optimization.", &d, &set, err);
      if (!st && set && (d != floor(d) || d < 0 || d > 3))
        st = ct_errf(err, CT_ERR_INVALID,
                     "deepspeed_config: zero_optimization.stage: expected 0, 1, 2 or 3, got %g", d);
      if (!st && set) {
        stage = (long)d;
        snprintf(buf, sizeof buf, "%ld", stage);
        st = set_key(cfg, "zero_stage", buf, err);
      }
      static const char *const off[] = {"offload_optimizer", "offload_param"};
      for (int i = 0; i < 2 && !st; i++) {
        const ct_json *o = ct_json_get(z, off[i]);
        const ct_json *dev = o && o->type == CT_JSON_OBJECT ? ct_json_get(o, "device") : NULL;
        if (!dev) continue;
        if (dev->type != CT_JSON_STRING)
          st = ct_errf(err, CT_ERR_INVALID,
                       "deepspeed_config: zero_optimization.%s.device: expected a string", off[i]);
        else if (strcmp(dev->str, "nvme") && strcmp(dev->str, "cpu") && strcmp(dev->str, "none"))
          st = ct_errf(
              err, CT_ERR_INVALID,
              "deepspeed_config: zero_optimization.%s.device '%s': expected none, cpu or nvme",
              off[i], dev->str);
        else
          st = set_key(cfg, off[i], dev->str, err);
        if (!st && !strcmp(dev->str, "cpu"))
          CT_INFO(
              "deepspeed_config: %s to cpu: on this CPU backend the state already lives in host "
              "memory",
              off[i]);
        const ct_json *np = ct_json_get(o, "nvme_path");
        if (!st && np) {
          if (np->type != CT_JSON_STRING)
            st = ct_errf(err, CT_ERR_INVALID,
                         "deepspeed_config: zero_optimization.%s.nvme_path: expected a string",
                         off[i]);
          else
            st = set_key(cfg, "offload_param_path", np->str, err);
        }
        const ct_json *pm = ct_json_get(o, "pin_memory");
        if (!st && pm && pm->type == CT_JSON_BOOL && i == 0)
          st = set_key(cfg, "offload_pin_memory", pm->boolean ? "true" : "false", err);
        static const char *const bsz[][2] = {{"buffer_size", "offload_buffer_size"}};
        if (!st && i == 0)
          st = copy_numbers(cfg, o, "zero_optimization.offload_optimizer.", bsz, 1, err);
      }
      /* the prefetch is one block ahead and parameters are never persisted
       * whole (docs/distributed.md): these sizes are checked, not used */
      static const char *const sizes[] = {"stage3_prefetch_bucket_size", "allgather_bucket_size",
                                          "stage3_param_persistence_threshold", NULL};
      for (const char *const *k = sizes; *k && !st; k++)
        st = num(z, *k, "zero_optimization.", &d, &set, err);
      static const char *const bucket[][2] = {{"reduce_bucket_size", "reduce_bucket_size"}};
      if (!st) st = copy_numbers(cfg, z, "zero_optimization.", bucket, 1, err);
    }
  }
  const ct_json *o = ct_json_get(j, "optimizer");
  if (!st && o) st = apply_optimizer(cfg, o, err);
  const ct_json *s = ct_json_get(j, "scheduler");
  if (!st && s) st = apply_scheduler(cfg, s, err);
  ct_json_free(j);
  return st;
}

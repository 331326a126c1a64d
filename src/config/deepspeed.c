/* deepspeed.c: a DeepSpeed config (deepspeed_config: a JSON file or an inline
 * object) read, validated and folded into the trainer's own keys
 * (docs/distributed.md, "deepspeed_config").
 *
 * "auto" keeps the trainer's value (Accelerate fills "auto" from the trainer);
 * an absent section (optimizer, scheduler) leaves the trainer's own; a field
 * the file leaves out inside a section it has takes DeepSpeed's default, not
 * ctuner's: no gradient_clipping is no clipping, an optimizer's missing params
 * are its DeepSpeed class defaults (FusedAdam: weight_decay 0, ...).
 * train_batch_size alone gives gradient accumulation 1 and the micro batch
 * train_batch_size / world, as DeepSpeed derives it. Optimizer names are
 * case-insensitive; cpuadam/fusedadam/unknown names become AdamW with a
 * warning naming the original. What ctuner cannot do (fp16, ZenFlow,
 * progressive layer drop, data efficiency, bf16 master weights or optimizer
 * state) is an error that says so; what cannot change the numbers here
 * (prescale_gradients, buffer counts) is accepted with one warning naming it
 * (ct_config_no_effect). The resolved values are logged once.
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

/* The defaults of DeepSpeed's optimizer classes (FusedAdam / DeepSpeedCPUAdam,
 * FusedLamb, FusedLion, DeepSpeedCPUAdagrad, torch.optim.SGD, OnebitAdam,
 * ZeroOneAdam, OnebitLamb) for the params a config leaves out; the file's own
 * params are copied over them afterwards. Muon and the µP kinds keep ctuner's
 * (their reference defaults). */
static ct_status optimizer_defaults(ct_config *cfg, const char *kind, const ct_json *p,
                                    ct_err *err) {
  /* DeepSpeed param, ctuner key, value; kinds: the mapped names it applies to */
  static const struct {
    const char *kinds, *param, *key, *val;
  } rows[] = {
      {"adamw adam lamb lion onebitadam zerooneadam onebitlamb", "lr", "learning_rate", "1e-3"},
      {"adagrad", "lr", "learning_rate", "1e-2"},
      {"adamw adam lamb lion onebitadam zerooneadam onebitlamb", "betas", "adam_beta1", "0.9"},
      {"adamw adam lamb lion onebitadam zerooneadam onebitlamb", "betas", "adam_beta2", "0.999"},
      {"adamw adam lamb onebitadam zerooneadam onebitlamb", "eps", "adam_epsilon", "1e-8"},
      {"adagrad", "eps", "adam_epsilon", "1e-10"},
      {"adamw adam lamb lion adagrad sgd onebitadam zerooneadam onebitlamb", "weight_decay",
       "adam_weight_decay", "0"},
      {"adamw adam lamb", "bias_correction", "optimizer_bias_correction", "true"},
      {"sgd", "momentum", "optimizer_momentum", "0"},
      /* FusedLamb always clamps its trust ratio (max_coeff 10, min_coeff 0.01) */
      {"lamb", "max_coeff", "lamb_max_coeff", "10"},
      {"lamb", "min_coeff", "lamb_min_coeff", "0.01"},
      {"onebitadam onebitlamb", "freeze_step", "freeze_step", "100000"},
      {"zerooneadam", "var_freeze_step", "var_freeze_step", "100000"},
  };
  ct_status st = CT_OK;
  const size_t kl = strlen(kind);
  for (size_t i = 0; i < sizeof rows / sizeof rows[0] && !st; i++) {
    const char *k = rows[i].kinds;
    int hit = 0;
    for (const char *q = k; (q = strstr(q, kind)); q += kl)
      if ((q == k || q[-1] == ' ') && (q[kl] == ' ' || !q[kl])) hit = 1;
    if (hit && !(p && ct_json_get(p, rows[i].param)))
      st = set_key(cfg, rows[i].key, rows[i].val, err);
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
  if (p && p->type != CT_JSON_OBJECT)
    return ct_errf(err, CT_ERR_INVALID, "deepspeed_config: optimizer.params: expected an object");
  if (!st) st = optimizer_defaults(cfg, mapped, p, err);
  if (st || !p) return st;
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
  const ct_json *bc = ct_json_get(p, "bias_correction");
  if (!st && bc && !is_auto(bc)) {
    if (bc->type != CT_JSON_BOOL)
      return ct_errf(err, CT_ERR_INVALID,
                     "deepspeed_config: optimizer.params.bias_correction: expected true or false");
    if (!strncmp(mapped, "onebit", 6) || !strcmp(mapped, "zerooneadam"))
      st = set_key(cfg, "deepspeed_config.optimizer.params.bias_correction", "true", err);
    else
      st = set_key(cfg, "optimizer_bias_correction", bc->boolean ? "true" : "false", err);
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

/* A boolean field (absent or "auto": *out unchanged). */
static ct_status boolean(const ct_json *o, const char *key, const char *where, int *out,
                         ct_err *err) {
  const ct_json *v = o && o->type == CT_JSON_OBJECT ? ct_json_get(o, key) : NULL;
  if (!v || is_auto(v)) return CT_OK;
  if (v->type != CT_JSON_BOOL)
    return ct_errf(err, CT_ERR_INVALID, "deepspeed_config: %s%s: expected true or false", where,
                   key);
  *out = v->boolean;
  return CT_OK;
}

/* Batch sizes as DeepSpeed's _set_batch_related_parameters derives them:
 * train_batch_size = micro x gradient_accumulation_steps x world. Given alone,
 * train_batch_size means accumulation 1 (or the trainer's, if set
 * explicitly) and micro = train_batch_size / (accumulation x world); a
 * remainder is refused, as DeepSpeed refuses it. */
static ct_status apply_batch(ct_config *cfg, const ct_json *j, int world, ct_err *err) {
  long micro = cfg->train_batch_size, accum = cfg->gradient_accumulation_steps, total = 0;
  int set_m = 0, set_a = 0, set_t = 0;
  ct_status st = posint(j, "train_micro_batch_size_per_gpu", "", &micro, &set_m, err);
  if (!st) st = posint(j, "gradient_accumulation_steps", "", &accum, &set_a, err);
  if (!st) st = posint(j, "train_batch_size", "", &total, &set_t, err);
  if (st) return st;
  if (set_t) {
    if (!set_m && !set_a && !cfg->given[CT_KEY_gradient_accumulation_steps]) accum = 1, set_a = 1;
    if (!set_m && total % (accum * world) == 0) micro = total / (accum * world), set_m = 1;
    if (!set_a && set_m && total % (micro * world) == 0) accum = total / (micro * world), set_a = 1;
    if ((double)micro * (double)accum * (double)world != (double)total)
      return ct_errf(
          err, CT_ERR_INVALID,
          "deepspeed_config: train_batch_size %ld != train_micro_batch_size_per_gpu %ld x "
          "gradient_accumulation_steps %ld x %d rank(s) = %ld%s; fix one of them (or set it to "
          "\"auto\")",
          total, micro, accum, world, micro * accum * world,
          set_m ? "" : " (it must divide by gradient_accumulation_steps x ranks, as in DeepSpeed)");
  }
  char buf[64];
  if (set_m)
    snprintf(buf, sizeof buf, "%ld", micro), st = set_key(cfg, "train_batch_size", buf, err);
  if (!st && set_a)
    snprintf(buf, sizeof buf, "%ld", accum),
        st = set_key(cfg, "gradient_accumulation_steps", buf, err);
  return st;
}

/* gradient_clipping: a number sets max_grad_norm, "auto" keeps the trainer's,
 * absent is DeepSpeed's default 0 (no clipping; under Accelerate the
 * trainer's own clipping is not called with DeepSpeed). */
static ct_status apply_clipping(ct_config *cfg, const ct_json *j, ct_err *err) {
  const ct_json *v = ct_json_get(j, "gradient_clipping");
  /* DeepSpeed clips by the global norm (SimpleTuner skips its value clipping) */
  if (cfg->given[CT_KEY_grad_clip_method] && strcmp(cfg->grad_clip_method, "norm"))
    CT_WARN(
        "grad_clip_method %s has no effect with a deepspeed_config: DeepSpeed clips the "
        "gradient by its global norm (gradient_clipping)",
        cfg->grad_clip_method);
  ct_status st = set_key(cfg, "grad_clip_method", "norm", err);
  if (st) return st;
  if (v) {
    static const char *const clip[][2] = {{"gradient_clipping", "max_grad_norm"}};
    return copy_numbers(cfg, j, "", clip, 1, err);
  }
  if (cfg->given[CT_KEY_max_grad_norm] && cfg->max_grad_norm != 0)
    CT_WARN(
        "deepspeed_config has no gradient_clipping: DeepSpeed does not clip (its default 0), "
        "so max_grad_norm %g has no effect; set gradient_clipping in the DeepSpeed config to "
        "clip",
        cfg->max_grad_norm);
  return set_key(cfg, "max_grad_norm", "0", err);
}

/* Sections ctuner cannot run are refused by name; those that cannot change
 * the numbers here are noted (one warning at start, ct_config_no_effect). */
static ct_status apply_extras(ct_config *cfg, const ct_json *j, const ct_json *z, ct_err *err) {
  static const struct {
    const char *sect, *why;
  } refused[] = {
      {"progressive_layer_drop",
       "progressive layer drop skips transformer layers at random during training, which the "
       "MMDiT here does not do"},
      {"data_efficiency",
       "curriculum learning / random-LTD reorder and drop training data, which ctuner's sampler "
       "does not do"},
      {"curriculum_learning", "curriculum learning (sequence-length schedules) is not implemented"},
  };
  ct_status st = CT_OK;
  for (size_t i = 0; i < sizeof refused / sizeof refused[0] && !st; i++) {
    int on = 0;
    st = enabled(j, refused[i].sect, &on, err);
    if (!st && on)
      st = ct_errf(err, CT_ERR_UNSUPPORTED,
                   "deepspeed_config: %s.enabled: not supported: %s; set \"enabled\": false or "
                   "remove the section",
                   refused[i].sect, refused[i].why);
  }
  const ct_json *zf = z ? ct_json_get(z, "zenflow") : NULL;
  if (!zf) zf = ct_json_get(j, "zenflow");
  if (!st && zf && zf->type != CT_JSON_NULL)
    st = ct_errf(err, CT_ERR_UNSUPPORTED,
                 "deepspeed_config: zero_optimization.zenflow: not supported: ZenFlow updates the "
                 "less important gradients late and asynchronously on the CPU, which changes "
                 "training and is not implemented here; remove the section");
  /* DeepSpeed's low-precision options: in the bf16 section (or at the top) */
  static const char *const low[] = {"bf16_master_weights_and_grads", "bf16_optimizer_states"};
  const ct_json *b = ct_json_get(j, "bf16");
  for (int i = 0; i < 2 && !st; i++) {
    int on = 0;
    st = boolean(b, low[i], "bf16.", &on, err);
    if (!st) st = boolean(j, low[i], "", &on, err);
    if (!st && on)
      st = ct_errf(err, CT_ERR_UNSUPPORTED,
                   "deepspeed_config: %s: not supported: ctuner keeps float32 master weights, "
                   "gradients and optimizer state with mixed_precision bf16 (only the working "
                   "copy is bf16); storing them in bf16 changes the numbers and is not "
                   "implemented; set it false",
                   low[i]);
  }
  int pre = 0;
  double d = 1;
  int set = 0;
  if (!st) st = boolean(j, "prescale_gradients", "", &pre, err);
  if (!st) st = num(j, "gradient_predivide_factor", "", &d, &set, err);
  if (!st && set && !(d > 0 && isfinite(d)))
    st = ct_errf(err, CT_ERR_INVALID,
                 "deepspeed_config: gradient_predivide_factor: expected a number > 0, got %g", d);
  if (!st && pre) st = set_key(cfg, "deepspeed_config.prescale_gradients", "true", err);
  if (!st && set && d != 1)
    st = set_key(cfg, "deepspeed_config.gradient_predivide_factor", "true", err);
  return st;
}

/* One offload section (offload_optimizer, offload_param): its device ("auto":
 * the trainer's, which Accelerate fills from its own offload_*_device), and
 * the knobs of the one swap file ctuner moves optimizer state and weights
 * through (buffer_size, pin_memory); the rest warn. */
static ct_status apply_offload(ct_config *cfg, const ct_json *z, int i, ct_err *err) {
  static const char *const off[] = {"offload_optimizer", "offload_param"};
  const ct_json *o = ct_json_get(z, off[i]);
  if (!o || o->type != CT_JSON_OBJECT) return CT_OK;
  const ct_json *dev = ct_json_get(o, "device");
  ct_status st = CT_OK;
  if (dev && !is_auto(dev)) {
    if (dev->type != CT_JSON_STRING)
      return ct_errf(err, CT_ERR_INVALID,
                     "deepspeed_config: zero_optimization.%s.device: expected a string", off[i]);
    if (strcmp(dev->str, "nvme") && strcmp(dev->str, "cpu") && strcmp(dev->str, "none"))
      return ct_errf(
          err, CT_ERR_INVALID,
          "deepspeed_config: zero_optimization.%s.device '%s': expected none, cpu, nvme or auto",
          off[i], dev->str);
    st = set_key(cfg, off[i], dev->str, err);
    if (!st && !strcmp(dev->str, "cpu"))
      CT_INFO(
          "deepspeed_config: %s to cpu: on this CPU backend the state already lives in host "
          "memory",
          off[i]);
  }
  const ct_json *np = ct_json_get(o, "nvme_path");
  if (!st && np && !is_auto(np)) {
    if (np->type != CT_JSON_STRING)
      return ct_errf(err, CT_ERR_INVALID,
                     "deepspeed_config: zero_optimization.%s.nvme_path: expected a string", off[i]);
    st = set_key(cfg, "offload_param_path", np->str, err);
  }
  const char *mine = i ? cfg->offload_param : cfg->offload_optimizer;
  if (st || !mine || strcmp(mine, "nvme")) return st; /* the knobs below are NVMe's */
  char where[64];
  snprintf(where, sizeof where, "zero_optimization.%s.", off[i]);
  double d = 0;
  int set = 0, pin = -1;
  st = num(o, "buffer_size", where, &d, &set, err);
  if (!st && set) {
    if (d < 1 || d != floor(d) || d > 1e12)
      return ct_errf(err, CT_ERR_INVALID,
                     "deepspeed_config: %sbuffer_size: expected a positive "
                     "integer (elements), got %g",
                     where, d);
    if (cfg->given[CT_KEY_offload_buffer_size] && cfg->offload_buffer_size != (long)d)
      return ct_errf(err, CT_ERR_INVALID,
                     "deepspeed_config: %sbuffer_size %.0f differs from %ld set before: ctuner "
                     "moves the optimizer state and the weights through one swap file with one "
                     "buffer size; give one value",
                     where, d, cfg->offload_buffer_size);
    char buf[32];
    snprintf(buf, sizeof buf, "%.0f", d);
    st = set_key(cfg, "offload_buffer_size", buf, err);
  }
  if (!st) st = boolean(o, "pin_memory", where, &pin, err);
  if (!st && pin >= 0) {
    if (cfg->given[CT_KEY_offload_pin_memory] && cfg->offload_pin_memory != pin)
      return ct_errf(err, CT_ERR_INVALID,
                     "deepspeed_config: %spin_memory differs from the value set before: ctuner "
                     "pins the buffers of its one swap file or not; give one value",
                     where);
    st = set_key(cfg, "offload_pin_memory", pin ? "true" : "false", err);
  }
  static const char *const idle[] = {"buffer_count", "max_in_cpu"};
  for (int k = 0; k < 2 && !st; k++) {
    char key[96];
    snprintf(key, sizeof key, "deepspeed_config.%s.%s", off[i], idle[k]);
    if (ct_json_get(o, idle[k]) && ct_config_no_effect(key)) st = set_key(cfg, key, "true", err);
  }
  return st;
}

static ct_status apply_zero(ct_config *cfg, const ct_json *z, ct_err *err) {
  if (z->type != CT_JSON_OBJECT)
    return ct_errf(err, CT_ERR_INVALID, "deepspeed_config: zero_optimization: expected an object");
  double d;
  int set;
  char buf[64];
  ct_status st = num(z, "stage", "zero_optimization.", &d, &set, err);
  if (!st && set && (d != floor(d) || d < 0 || d > 3))
    st = ct_errf(err, CT_ERR_INVALID,
                 "deepspeed_config: zero_optimization.stage: expected 0, 1, 2 or 3, got %g", d);
  if (!st && set) {
    snprintf(buf, sizeof buf, "%ld", (long)d);
    st = set_key(cfg, "zero_stage", buf, err);
  }
  /* the devices first: the NVMe knobs of either section depend on both */
  for (int i = 0; i < 2 && !st; i++) {
    const ct_json *o = ct_json_get(z, i ? "offload_param" : "offload_optimizer");
    if (o && o->type != CT_JSON_OBJECT)
      st =
          ct_errf(err, CT_ERR_INVALID, "deepspeed_config: zero_optimization.%s: expected an object",
                  i ? "offload_param" : "offload_optimizer");
  }
  for (int i = 0; i < 2 && !st; i++) st = apply_offload(cfg, z, i, err);
  /* the prefetch is one block ahead and parameters are never persisted
   * whole (docs/distributed.md): these sizes are checked, not used */
  static const char *const sizes[] = {"stage3_prefetch_bucket_size", "allgather_bucket_size",
                                      "stage3_param_persistence_threshold", NULL};
  for (const char *const *k = sizes; *k && !st; k++)
    st = num(z, *k, "zero_optimization.", &d, &set, err);
  static const char *const bucket[][2] = {{"reduce_bucket_size", "reduce_bucket_size"}};
  if (!st) st = copy_numbers(cfg, z, "zero_optimization.", bucket, 1, err);
  return st;
}

/* The values the file resolved to, in one line (every rank computes them; the
 * CLI shows rank 0's). */
static void log_resolved(const ct_config *cfg) {
  CT_INFO(
      "deepspeed_config resolved: train_micro_batch_size_per_gpu %ld, "
      "gradient_accumulation_steps %ld, gradient_clipping %g, zero_stage %ld, optimizer %s "
      "(lr %g, betas [%g, %g], eps %g, weight_decay %g, bias_correction %s), lr_scheduler %s, "
      "mixed_precision %s, offload_optimizer %s, offload_param %s",
      cfg->train_batch_size, cfg->gradient_accumulation_steps, cfg->max_grad_norm, cfg->zero_stage,
      cfg->optimizer, cfg->learning_rate, cfg->adam_beta1, cfg->adam_beta2, cfg->adam_epsilon,
      cfg->adam_weight_decay, cfg->optimizer_bias_correction ? "true" : "false", cfg->lr_scheduler,
      cfg->mixed_precision, cfg->offload_optimizer ? cfg->offload_optimizer : "none",
      cfg->offload_param ? cfg->offload_param : "none");
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
  if (!st) st = apply_batch(cfg, j, world, err);
  if (!st) st = apply_clipping(cfg, j, err);
  const ct_json *z = ct_json_get(j, "zero_optimization");
  if (!st && z) st = apply_zero(cfg, z, err);
  if (!st) st = apply_extras(cfg, j, z && z->type == CT_JSON_OBJECT ? z : NULL, err);
  const ct_json *o = ct_json_get(j, "optimizer");
  if (!st && o) st = apply_optimizer(cfg, o, err);
  const ct_json *s = ct_json_get(j, "scheduler");
  if (!st && s) st = apply_scheduler(cfg, s, err);
  ct_json_free(j);
  if (!st) log_resolved(cfg);
  return st;
}

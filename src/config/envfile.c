/* envfile.c: SimpleTuner's config.env, read as SimpleTuner's own loader
 * reads it (helpers/configuration/env_file.py), not as a shell would.
 *
 * Line by line: blank lines and '#' comments skipped, an `export ` prefix
 * dropped, `KEY=value` sets and `KEY+=value` appends (words joined by one
 * space); quotes around the value are removed and runs of blanks become one
 * space. Known variables map to keys (MODEL_NAME -> pretrained_model_name_or_path,
 * LEARNING_RATE -> learning_rate, ... the table below, SimpleTuner's);
 * "true" passes the flag, "false" leaves the key at its default (SimpleTuner
 * drops the argument). TRAINER_EXTRA_ARGS is split on blanks, no quoting, into
 * --key=value / --key value / --flag arguments, after the mapped variables
 * (so they win), words holding ${...} skipped as SimpleTuner skips them.
 * Where SimpleTuner and a shell disagree (text after a closing quote, an
 * unquoted " # comment", ${VAR} in a mapped value, a quote left open) the line
 * is a problem naming why; variables SimpleTuner's loader does not read are
 * warnings (it ignores them too), the launcher's (TRAINING_NUM_PROCESSES, ...)
 * saying what to use here instead. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_int.h"

/* SimpleTuner's variable -> argument map (env_to_args_map). An argument with
 * "=value" sets that value whatever the variable says (USE_BITFIT). */
static const struct {
  const char *var, *arg;
} MAP[] = {
    {"RESUME_CHECKPOINT", "resume_from_checkpoint"},
    {"DATALOADER_CONFIG", "data_backend_config"},
    {"ASPECT_BUCKET_ROUNDING", "aspect_bucket_rounding"},
    {"TRAINING_SEED", "seed"},
    {"USE_EMA", "use_ema"},
    {"USE_XFORMERS", "enable_xformers_memory_efficient_attention"},
    {"MINIMUM_RESOLUTION", "minimum_image_size"},
    {"OUTPUT_DIR", "output_dir"},
    {"USE_DORA", "use_dora"},
    {"USE_BITFIT", "layer_freeze_strategy=bitfit"},
    {"LORA_TYPE", "lora_type"},
    {"LYCORIS_CONFIG", "lycoris_config"},
    {"PUSH_TO_HUB", "push_to_hub"},
    {"PUSH_CHECKPOINTS", "push_checkpoints_to_hub"},
    {"MAX_NUM_STEPS", "max_train_steps"},
    {"NUM_EPOCHS", "num_train_epochs"},
    {"CHECKPOINTING_STEPS", "checkpointing_steps"},
    {"CHECKPOINTING_LIMIT", "checkpoints_total_limit"},
    {"HUB_MODEL_NAME", "hub_model_id"},
    {"MODEL_CARD_SAFE_FOR_WORK", "model_card_safe_for_work"},
    {"TRACKER_PROJECT_NAME", "tracker_project_name"},
    {"TRACKER_RUN_NAME", "tracker_run_name"},
    {"MODEL_TYPE", "model_type"},
    {"MODEL_NAME", "pretrained_model_name_or_path"},
    {"MODEL_FAMILY", "model_family"},
    {"TRAIN_BATCH_SIZE", "train_batch_size"},
    {"USE_GRADIENT_CHECKPOINTING", "gradient_checkpointing"},
    {"CAPTION_DROPOUT_PROBABILITY", "caption_dropout_probability"},
    {"RESOLUTION_TYPE", "resolution_type"},
    {"RESOLUTION", "resolution"},
    {"VALIDATION_SEED", "validation_seed"},
    {"VALIDATION_STEPS", "validation_steps"},
    {"VALIDATION_RESOLUTION", "validation_resolution"},
    {"VALIDATION_GUIDANCE", "validation_guidance"},
    {"VALIDATION_GUIDANCE_RESCALE", "validation_guidance_rescale"},
    {"VALIDATION_NUM_INFERENCE_STEPS", "validation_num_inference_steps"},
    {"VALIDATION_PROMPT", "validation_prompt"},
    {"ALLOW_TF32", "allow_tf32"},
    {"MIXED_PRECISION", "mixed_precision"},
    {"OPTIMIZER", "optimizer"},
    {"LEARNING_RATE", "learning_rate"},
    {"LR_SCHEDULE", "lr_scheduler"},
    {"LR_WARMUP_STEPS", "lr_warmup_steps"},
    {"BASE_MODEL_PRECISION", "base_model_precision"},
    {"VALIDATION_TORCH_COMPILE", "validation_torch_compile"},
    {"VALIDATION_GUIDANCE_REAL", "validation_guidance_real"},
    {"VALIDATION_NO_CFG_UNTIL_TIMESTEP", "validation_no_cfg_until_timestep"},
    {"TRAINING_SCHEDULER_TIMESTEP_SPACING", "training_scheduler_timestep_spacing"},
    {"INFERENCE_SCHEDULER_TIMESTEP_SPACING", "inference_scheduler_timestep_spacing"},
    {"GRADIENT_ACCUMULATION_STEPS", "gradient_accumulation_steps"},
    {"LR_END", "lr_end"},
    {"FLUX_GUIDANCE_VALUE", "flux_guidance_value"},
    {"FLUX_LORA_TARGET", "flux_lora_target"},
    {"VALIDATION_NEGATIVE_PROMPT", "validation_negative_prompt"},
    {"METADATA_UPDATE_INTERVAL", "metadata_update_interval"},
    {"READ_BATCH_SIZE", "read_batch_size"},
    {"WRITE_BATCH_SIZE", "write_batch_size"},
    {"AWS_MAX_POOL_CONNECTIONS", "aws_max_pool_connections"},
    {"TORCH_NUM_THREADS", "torch_num_threads"},
    {"IMAGE_PROCESSING_BATCH_SIZE", "image_processing_batch_size"},
};

/* Variables SimpleTuner's launcher (train.sh, accelerate) reads, not its
 * trainer: what to do here instead. */
static const struct {
  const char *var, *why;
} LAUNCHER[] = {
    {"TRAINING_NUM_PROCESSES",
     "processes are mpirun's -n here ('ctuner launch' reads an "
     "Accelerate config's num_processes)"},
    {"TRAINING_NUM_MACHINES",
     "machines are mpirun's hosts here ('ctuner launch' reads an "
     "Accelerate config's num_machines)"},
    {"TRAINING_DYNAMO_BACKEND", "no torch.compile: ctuner's kernels are compiled C"},
    {"TRAINER_DYNAMO_BACKEND", "no torch.compile: ctuner's kernels are compiled C"},
    {"ACCELERATE_EXTRA_ARGS", "arguments of accelerate launch; use 'ctuner launch' or mpirun"},
    {"MIXED_PRECISION_ACCELERATE", "arguments of accelerate launch; use 'ctuner launch'"},
};

#define MAX_VARS 512
#define MAX_SEGS 32

/* A value's text and where it started. */
typedef struct seg {
  char *text; /* NULL: the line was not read (bad says why) */
  char *bad;
  int line, col;
} seg;
/* A variable: its segments (one per `=`/`+=` line since the last `=`). */
typedef struct var {
  char name[128];
  seg s[MAX_SEGS];
  int n;
} var;

typedef struct envctx {
  const char *file;
  ct_config *cfg;
  ct_config_problems *probs;
  var *v;
  int n, cap; /* variables read, allocated (at most MAX_VARS) */
} envctx;

static void problem(envctx *c, int warning, int line, int col, const char *key, const char *fmt,
                    ...) __attribute__((format(printf, 6, 7)));
static void problem(envctx *c, int warning, int line, int col, const char *key, const char *fmt,
                    ...) {
  char msg[700];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ct_config_problems_add(c->probs, warning, warning ? CT_OK : CT_ERR_FORMAT, CT_ORIGIN_FILE,
                         c->file, line, col, key, NULL, "%s", msg);
}

/* Words of s joined by single spaces, into a new string. */
static char *squash(const char *s, size_t n) {
  char *o = malloc(n + 1);
  size_t k = 0;
  if (!o) return NULL;
  for (size_t i = 0; i < n; i++) {
    if (isspace((unsigned char)s[i])) {
      if (k && o[k - 1] != ' ') o[k++] = ' ';
    } else {
      o[k++] = s[i];
    }
  }
  while (k && o[k - 1] == ' ') k--;
  o[k] = 0;
  return o;
}

/* The value part of one line (after '=' at column vcol): quotes removed.
 * NULL where SimpleTuner and a shell would read it differently: why (and
 * *wcol) say how; reported only if the variable is used (apply). */
static char *value_of(const char *v, size_t n, int vcol, const char *name, char *why, size_t wn,
                      int *wcol) {
  size_t a = 0;
  while (a < n && isspace((unsigned char)v[a])) a++;
  while (n > a && isspace((unsigned char)v[n - 1])) n--;
  if (a < n && (v[a] == '"' || v[a] == '\'')) {
    const char q = v[a];
    const char *e = memchr(v + a + 1, q, n - a - 1);
    if (!e) {
      *wcol = vcol + (int)a;
      snprintf(why, wn,
               "variable %s: the quote is not closed on this line (SimpleTuner reads config.env "
               "line by line)",
               name);
      return NULL;
    }
    size_t after = (size_t)(e - v) + 1;
    while (after < n && isspace((unsigned char)v[after])) after++;
    if (after < n) {
      *wcol = vcol + (int)after;
      snprintf(why, wn,
               "variable %s: text after the closing quote (a shell would %s it, SimpleTuner keeps "
               "it and the quote in the value); %s",
               name, v[after] == '#' ? "drop" : "join",
               v[after] == '#' ? "put the comment on its own line" : "quote the whole value");
      return NULL;
    }
    return squash(v + a + 1, (size_t)(e - v) - a - 1);
  }
  for (size_t i = a; i + 1 < n; i++)
    if (isspace((unsigned char)v[i]) && v[i + 1] == '#') {
      *wcol = vcol + (int)i + 1;
      snprintf(why, wn,
               "variable %s: a comment after an unquoted value (a shell drops it, SimpleTuner "
               "keeps it in the value); put the comment on its own line",
               name);
      return NULL;
    }
  return squash(v + a, n - a);
}

static var *find_var(const envctx *c, const char *name) {
  for (int i = 0; i < c->n; i++)
    if (!strcmp(c->v[i].name, name)) return &c->v[i];
  return NULL;
}

static void clear_var(var *x) {
  for (int i = 0; i < x->n; i++) free(x->s[i].text), free(x->s[i].bad);
  x->n = 0;
}

/* One `[export] NAME[+]=value` line. */
static void read_line(envctx *c, const char *l, size_t n, int line) {
  size_t i = 0;
  while (i < n && isspace((unsigned char)l[i])) i++;
  if (i == n || l[i] == '#') return;
  if (n - i > 7 && !strncmp(l + i, "export", 6) && (l[i + 6] == ' ' || l[i + 6] == '\t')) i += 7;
  while (i < n && isspace((unsigned char)l[i])) i++;
  const char *eq = memchr(l + i, '=', n - i);
  if (!eq) {
    problem(c, 1, line, (int)i + 1, NULL,
            "not a KEY=value line; SimpleTuner's config.env reader skips it too");
    return;
  }
  size_t ke = (size_t)(eq - l);
  const int append = ke > i && l[ke - 1] == '+';
  if (append) ke--;
  size_t kb = i, kn = ke;
  while (kn > kb && isspace((unsigned char)l[kn - 1])) kn--;
  int ok = kn > kb && kn - kb < 128 && (isalpha((unsigned char)l[kb]) || l[kb] == '_');
  for (size_t k = kb; ok && k < kn; k++) ok = isalnum((unsigned char)l[k]) || l[k] == '_';
  if (!ok) {
    problem(c, 0, line, (int)kb + 1, NULL,
            "'%.*s' is not a variable name (letters, digits and '_')", (int)(kn - kb), l + kb);
    return;
  }
  char name[128];
  snprintf(name, sizeof name, "%.*s", (int)(kn - kb), l + kb);
  const size_t vb = (size_t)(eq - l) + 1;
  char why[600] = "";
  int wcol = 0;
  char *val = value_of(l + vb, n - vb, (int)vb + 1, name, why, sizeof why, &wcol);
  char *bad = val ? NULL : strdup(why);
  var *x = find_var(c, name);
  if (!x) {
    var *nv = c->n == c->cap && c->cap < MAX_VARS
                  ? realloc(c->v, (size_t)(c->cap ? 2 * c->cap : 16) * sizeof *nv)
                  : NULL;
    if (nv) c->v = nv, c->cap = c->cap ? 2 * c->cap : 16;
    if (c->n == c->cap) {
      free(val), free(bad);
      problem(c, 0, line, 1, NULL, "%s",
              c->cap >= MAX_VARS ? "more than 512 variables" : "out of memory");
      return;
    }
    x = &c->v[c->n++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->n = 0;
  }
  if (!append) clear_var(x);
  if (x->n == MAX_SEGS) {
    free(val), free(bad);
    problem(c, 0, line, 1, name, "variable %s: more than 32 += lines", name);
    return;
  }
  int vcol = (int)vb + 1;
  while (vcol <= (int)n && isspace((unsigned char)l[vcol - 1])) vcol++;
  x->s[x->n++] = (seg){val, bad, line, val ? vcol : wcol};
}

/* One --key[=value] argument of TRAINER_EXTRA_ARGS; *used: words taken. */
static void extra_arg(envctx *c, char **w, int nw, int *used, const seg *s, int col) {
  const cfg_src src = {CT_ORIGIN_FILE, c->file, s->line, col};
  char *a = w[0];
  *used = 1;
  if (strncmp(a, "--", 2)) {
    problem(c, 0, s->line, col, NULL,
            "TRAINER_EXTRA_ARGS: '%s' is not an argument (--key=value or --flag)", a);
    return;
  }
  char *eq = strchr(a, '=');
  if (eq) {
    *eq = 0;
    ct_cfg_set_text(c->cfg, a, eq + 1, &src, c->probs);
    *eq = '=';
  } else if (nw > 1 && strncmp(w[1], "--", 2)) {
    ct_cfg_set_text(c->cfg, a, w[1], &src, c->probs);
    *used = 2;
  } else {
    ct_cfg_set_text(c->cfg, a, "true", &src, c->probs);
  }
}

/* TRAINER_EXTRA_ARGS: every segment split on blanks. */
static void extra_args(envctx *c, const var *x) {
  for (int k = 0; k < x->n; k++) {
    const seg *s = &x->s[k];
    char *w[256];
    int col[256], nw = 0;
    for (char *p = s->text; *p && nw < 256;) {
      while (*p == ' ') p++;
      if (!*p) break;
      w[nw] = p, col[nw] = s->col + (int)(p - s->text);
      p += strcspn(p, " ");
      if (*p) *p++ = 0;
      if (strstr(w[nw], "${")) {
        problem(c, 1, s->line, col[nw], NULL,
                "TRAINER_EXTRA_ARGS: '%s' is a shell expansion; skipped, as SimpleTuner skips "
                "it",
                w[nw]);
        continue;
      }
      nw++;
    }
    for (int i = 0; i < nw;) {
      int used = 1;
      extra_arg(c, w + i, nw - i, &used, s, col[i]);
      i += used;
    }
  }
}

/* A mapped variable's value to its key. */
static void mapped(envctx *c, const var *x, const char *arg) {
  char joined[4096] = "";
  size_t len = 0;
  for (int k = 0; k < x->n; k++) {
    int w = snprintf(joined + len, sizeof joined - len, "%s%s", len ? " " : "", x->s[k].text);
    if (w > 0 && (size_t)w < sizeof joined - len) len += (size_t)w;
  }
  const seg *s = &x->s[0];
  const cfg_src src = {CT_ORIGIN_FILE, c->file, s->line, s->col};
  if (!strcasecmp(joined, "false")) return; /* SimpleTuner drops the argument */
  const char *dollar = strchr(joined, '$');
  if (dollar && (dollar[1] == '{' || dollar[1] == '_' || isalpha((unsigned char)dollar[1])) &&
      !ct_config_no_effect(arg) && !ct_cfg_not_here(arg)) {
    problem(c, 0, s->line, s->col, arg,
            "variable %s: '%s' needs a shell; SimpleTuner's config.env reader does not expand "
            "$VAR or ${VAR} (it would pass the text as it is): write the value",
            x->name, joined);
    return;
  }
  const char *eq = strchr(arg, '=');
  if (eq) {
    char key[128];
    snprintf(key, sizeof key, "%.*s", (int)(eq - arg), arg);
    ct_cfg_set_text(c->cfg, key, eq + 1, &src, c->probs);
  } else {
    ct_cfg_set_text(c->cfg, arg, !strcasecmp(joined, "true") ? "true" : joined, &src, c->probs);
  }
}

/* A used variable with lines read differently by a shell: each is an error; 1 if any. */
static int unread(envctx *c, const var *x) {
  int any = 0;
  for (int k = 0; k < x->n; k++)
    if (!x->s[k].text) {
      problem(c, 0, x->s[k].line, x->s[k].col, NULL, "%s", x->s[k].bad ? x->s[k].bad : "");
      any = 1;
    }
  return any;
}

/* CONFIG_BACKEND (or its other spellings) naming json, toml or cmd: then
 * SimpleTuner reads its options from that file and this one only in its
 * launcher. */
static const var *other_backend(envctx *c) {
  static const char *const names[] = {"SIMPLETUNER_CONFIG_BACKEND", "CONFIG_BACKEND",
                                      "CONFIG_TYPE"};
  for (size_t k = 0; k < 3; k++) {
    const var *x = find_var(c, names[k]);
    if (x && x->n && x->s[0].text && strcasecmp(x->s[0].text, "env")) return x;
  }
  return NULL;
}

static void apply(envctx *c) {
  const var *extra = NULL, *ob = other_backend(c);
  if (ob) {
    problem(c, 0, ob->s[0].line, ob->s[0].col, NULL,
            "%s=%s: with it SimpleTuner reads the training options from config/config.%s and "
            "this config.env only in its launcher (train.sh); give ctuner that file instead",
            ob->name, ob->s[0].text, ob->s[0].text);
    return;
  }
  for (int i = 0; i < c->n; i++) {
    const var *x = &c->v[i];
    if (!x->n) continue;
    if (!strcmp(x->name, "TRAINER_EXTRA_ARGS")) {
      extra = x;
      continue;
    }
    const char *arg = NULL, *why = NULL;
    for (size_t k = 0; k < sizeof MAP / sizeof MAP[0] && !arg; k++)
      if (!strcmp(MAP[k].var, x->name)) arg = MAP[k].arg;
    for (size_t k = 0; k < sizeof LAUNCHER / sizeof LAUNCHER[0] && !why; k++)
      if (!strcmp(LAUNCHER[k].var, x->name)) why = LAUNCHER[k].why;
    if (arg) {
      if (!unread(c, x)) mapped(c, x, arg);
    } else if (why)
      problem(c, 1, x->s[0].line, 1, NULL, "variable %s is for SimpleTuner's launcher: %s", x->name,
              why);
    else
      problem(c, 1, x->s[0].line, 1, NULL,
              "variable %s is not one SimpleTuner's config.env reader maps to an option; ignored, "
              "as SimpleTuner ignores it",
              x->name);
  }
  if (extra && !unread(c, extra)) extra_args(c, extra);
}

ct_status ct_cfg_load_env(ct_config *cfg, const char *text, size_t len, const char *file,
                          ct_config_problems *probs) {
  const size_t before = probs->errors;
  envctx c = {file, cfg, probs, NULL, 0, 0};
  int line = 1;
  for (size_t i = 0; i < len; line++) {
    const char *nl = memchr(text + i, '\n', len - i);
    size_t n = nl ? (size_t)(nl - (text + i)) : len - i;
    size_t m = n;
    if (m && text[i + m - 1] == '\r') m--;
    read_line(&c, text + i, m, line);
    i += n + 1;
  }
  apply(&c);
  for (int i = 0; i < c.n; i++) clear_var(&c.v[i]);
  free(c.v);
  return probs->errors > before ? CT_ERR_INVALID : CT_OK;
}

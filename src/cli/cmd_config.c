/* `ctuner config check`: a configuration as ctuner reads it, and every
 * problem at once. Loads the file (config.json, config.env or config.toml),
 * the --KEY=VALUE overrides, the DeepSpeed JSON it names and its
 * multidatabackend.json through the same library calls as `ctuner train`,
 * prints each key's value and where it came from, then every problem with
 * its place. Exit 0 without errors, 2 with any (warnings alone: 0). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "ctuner/config.h"
#include "ctuner/data.h"
#include "ctuner/json.h"
#include "ctuner/train.h"

void ct_cmd_config_check_help(FILE *f) {
  fprintf(
      f,
      "usage: ctuner config check FILE [--data_backend_config F] [--KEY=VALUE | --KEY VALUE ...]\n"
      "\n"
      "Reads FILE as 'ctuner train --config FILE' would (by its extension: .json\n"
      "SimpleTuner's config.json, .env its config.env, .toml its config.toml), then the\n"
      "--KEY=VALUE overrides, the deepspeed_config it names (for one process) and the\n"
      "data_backend_config (multidatabackend.json; --data_backend_config F overrides\n"
      "the file's), and opens the files training would (pipeline directory,\n"
      "lycoris_config, vae_config, tokenizer, init_lora, webhooks). Prints every key with its "
      "value and where it came from (default,\n"
      "file with line:column, cli, deepspeed), then every problem at once, each with\n"
      "its place: FILE:LINE:COL for files, --KEY for the command line. Problems\n"
      "marked 'warning' are accepted (a SimpleTuner key with no effect here says why).\n"
      "Exit status 0 if there is no error, 2 if there is any (docs/config.md).\n");
}

/* The resolved keys: name, value (JSON), origin. */
static void print_keys(const ct_config *cfg) {
  char *js = ct_config_to_json(cfg);
  ct_json *j = NULL;
  ct_err e = {0};
  if (!js || ct_json_parse(js, strlen(js), &j, &e) || j->type != CT_JSON_OBJECT) {
    printf("(the resolved configuration could not be shown: %s)\n", js ? e.msg : "out of memory");
    goto out;
  }
  for (size_t i = 0; i < j->n && i < CT_CONFIG_NKEYS; i++) {
    const ct_json *v = &j->items[i];
    printf("%-34s ", j->keys[i]);
    if (v->type == CT_JSON_STRING)
      ct_json_fput_str(stdout, v->str);
    else if (v->type == CT_JSON_NULL)
      fputs("null", stdout);
    else if (v->type == CT_JSON_BOOL)
      fputs(v->boolean ? "true" : "false", stdout);
    else if (v->is_int)
      printf("%lld", (long long)v->i64);
    else
      printf("%.17g", v->num);
    const ct_config_origin o = (ct_config_origin)cfg->given[i];
    if (o == CT_ORIGIN_FILE && cfg->line[i] > 0)
      printf("  (file %s:%d:%d)\n", cfg->file, cfg->line[i], cfg->col[i]);
    else
      printf("  (%s)\n", ct_config_origin_name(o));
  }
out:
  ct_json_free(j);
  free(js);
}

static void print_problems(const ct_config_problems *p) {
  char where[700];
  size_t warnings = p->n > p->errors ? p->n - p->errors : 0;
  printf("\n%zu error%s, %zu warning%s\n", p->errors, p->errors == 1 ? "" : "s", warnings,
         warnings == 1 ? "" : "s");
  for (size_t i = 0; i < p->n; i++) {
    const ct_config_problem *pr = &p->v[i];
    printf("%s: %s: %s\n", ct_config_problem_where(pr, where, sizeof where),
           pr->warning ? "warning" : "error", pr->msg);
  }
}

/* The DeepSpeed JSON folded in for one process; keys it set are marked. */
static void apply_deepspeed(ct_config *cfg, ct_config_problems *probs) {
  unsigned char before[CT_CONFIG_NKEYS];
  memcpy(before, cfg->given, sizeof before);
  ct_err e = {0};
  if (ct_deepspeed_apply(cfg, 1, &e)) {
    ct_config_problems_add(probs, 0, e.status, CT_ORIGIN_DEEPSPEED, NULL, 0, 0, "deepspeed_config",
                           NULL, "%s", e.msg);
    return;
  }
  for (size_t i = 0; i < CT_CONFIG_NKEYS; i++)
    if (cfg->given[i] != before[i]) cfg->given[i] = CT_ORIGIN_DEEPSPEED;
}

int ct_cmd_config_check(int argc, char **argv) {
  ct_config cfg;
  ct_config_defaults(&cfg);
  ct_config_problems probs = {0};
  ct_backend *be = NULL;
  const char *file = NULL, *dbc = NULL;
  int rc = 2;
  for (int i = 2; i < argc; i++) { /* argv: ctuner's "config" "check" ... */
    const char *v = NULL;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_config_check_help(stdout);
      rc = 0;
      goto out;
    }
    int r = ct_cli_opt(argc, argv, &i, "data_backend_config", &v);
    if (r < 0) goto out;
    if (r) {
      dbc = v;
      continue;
    }
    if (!strncmp(argv[i], "--", 2)) { /* --KEY=VALUE, or --KEY VALUE: its value is no FILE */
      if (!strchr(argv[i], '=') && i + 1 < argc) i++;
      continue;
    }
    if (file) {
      fprintf(stderr, "ctuner config check: one FILE only ('%s' and '%s')\n", file, argv[i]);
      goto out;
    }
    file = argv[i];
  }
  if (!file) {
    fprintf(stderr, "ctuner config check: FILE is required (ctuner config check --help)\n");
    goto out;
  }
  ct_config_load(&cfg, file, &probs);
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = NULL;
    if (strncmp(a, "--", 2) || ct_cli_opt(argc, argv, &i, "data_backend_config", &v)) continue;
    char key[256];
    const char *eq = strchr(a, '=');
    if (eq) {
      snprintf(key, sizeof key, "%.*s", (int)(eq - a), a);
      v = eq + 1;
    } else if (i + 1 < argc) {
      snprintf(key, sizeof key, "%s", a);
      v = argv[++i];
    } else {
      fprintf(stderr, "ctuner config check: option %s needs a value\n", a);
      goto out;
    }
    ct_config_set_arg(&cfg, key, v, &probs);
  }
  if (dbc) ct_config_set_arg(&cfg, "data_backend_config", dbc, &probs);
  if (cfg.deepspeed_config) apply_deepspeed(&cfg, &probs);
  ct_config_check(&cfg, &probs);
  ct_train_check_files(&cfg, &probs); /* the files training opens, as it opens them */
  if (cfg.data_backend_config) {
    const ct_backend_vars vars = {cfg.model_family, cfg.output_dir, cfg.resolution_type,
                                  cfg.minimum_image_size, cfg.model_type};
    ct_backend_load_with(cfg.data_backend_config, &vars, &be, &probs, NULL);
  }
  printf("config: %s\n", file);
  print_keys(&cfg);
  ct_cli_hub_check(&cfg); /* hub ids: the cache, nothing downloaded */
  print_problems(&probs);
  rc = probs.errors ? 2 : 0;
out:
  ct_backend_free(be);
  ct_config_problems_free(&probs);
  ct_config_free(&cfg);
  return rc;
}

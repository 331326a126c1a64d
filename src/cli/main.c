/* ctuner command-line entry point: global options, then dispatch through the
 * command table (commands.c), from which `ctuner --help`, `ctuner help NAME
 * [SUB]` and each group's help (`ctuner bench --help`) are generated; a
 * command's own help comes from its row. Also the option helpers the commands
 * share. The CLI is the only part of the project that prints results to stdout
 * and chooses exit codes (0 success, 1 failure of the job, 2 usage error;
 * train also 3 circuit breaker, 4 collective watchdog). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "ctuner/json.h"
#include "ctuner/log.h"

int ct_cli_opt(int argc, char **argv, int *i, const char *key, const char **val) {
  const char *a = argv[*i];
  size_t kl = strlen(key);
  if (strncmp(a, "--", 2) || strncmp(a + 2, key, kl)) return 0;
  if (a[2 + kl] == '=') {
    *val = a + 3 + kl;
    return 1;
  }
  if (a[2 + kl] != '\0') return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "ctuner: option --%s needs a value\n", key);
    return -1;
  }
  *val = argv[++*i];
  return 1;
}

int ct_cli_int(const char *key, const char *val, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(val, &end, 10);
  if (errno || end == val || *end || v < lo || v > hi) {
    fprintf(stderr, "ctuner: --%s=%s: expected an integer in [%ld, %ld]\n", key, val, lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

int ct_cli_float(const char *key, const char *val, double *out) {
  char *end;
  errno = 0;
  double v = strtod(val, &end);
  if (errno || end == val || *end) {
    fprintf(stderr, "ctuner: --%s=%s: expected a number\n", key, val);
    return -1;
  }
  *out = v;
  return 0;
}

void ct_cli_json_str(FILE *f, const char *s) {
  ct_json_fput_str(f, s);
}

static int is_help(const char *a) {
  return !strcmp(a, "--help") || !strcmp(a, "-h");
}

/* `ctuner --help`: every row of the table under its section. */
static void list_commands(FILE *f) {
  int w = 0;
  for (size_t k = 0; k < ct_cli_ncommands; k++) {
    const ct_cli_cmd *c = &ct_cli_commands[k];
    int l = (int)strlen(c->name) + (c->sub ? 1 + (int)strlen(c->sub) : 0);
    if (l > w) w = l;
  }
  fprintf(
      f,
      "usage: ctuner [--log-level debug|info|warn|error|off] <command> [<subcommand>] [options]\n");
  for (size_t k = 0; k < ct_cli_ncommands; k++) {
    const ct_cli_cmd *c = &ct_cli_commands[k];
    if (!k || strcmp(c->section, ct_cli_commands[k - 1].section)) fprintf(f, "\n%s:\n", c->section);
    char name[128];
    snprintf(name, sizeof name, "%s%s%s", c->name, c->sub ? " " : "", c->sub ? c->sub : "");
    fprintf(f, "  %-*s  %s\n", w, name, c->summary);
  }
  fprintf(
      f,
      "\n"
      "Run 'ctuner <command> [<subcommand>] --help' (or 'ctuner help <command> [<subcommand>]')\n"
      "for its options. Under mpirun -np N, train, cache and bench memory run on N ranks.\n");
}

/* The rows of command `name` (adjacent in the table), or NULL. */
static const ct_cli_cmd *find_group(const char *name, size_t *n) {
  for (size_t k = 0; k < ct_cli_ncommands; k++) {
    if (strcmp(ct_cli_commands[k].name, name)) continue;
    size_t e = k;
    while (e < ct_cli_ncommands && !strcmp(ct_cli_commands[e].name, name)) e++;
    *n = e - k;
    return &ct_cli_commands[k];
  }
  return NULL;
}

static const ct_cli_cmd *find_sub(const ct_cli_cmd *g, size_t n, const char *sub) {
  for (size_t k = 0; k < n; k++)
    if (!strcmp(g[k].sub, sub)) return &g[k];
  return NULL;
}

/* "a|b|c" or "a, b, c": the subcommands of a group. */
static void put_subs(FILE *f, const ct_cli_cmd *g, size_t n, const char *sep) {
  for (size_t k = 0; k < n; k++) fprintf(f, "%s%s", k ? sep : "", g[k].sub);
}

/* `ctuner NAME --help` for a group: its synopsis, then each subcommand's help
 * (once when several rows share one help, as the storage ones do). */
static void group_help(FILE *f, const ct_cli_cmd *g, size_t n) {
  fprintf(f, "usage: ctuner %s <", g->name);
  put_subs(f, g, n, "|");
  fprintf(f, "> [options]\n");
  for (size_t k = 0; k < n; k++) {
    int seen = 0;
    for (size_t j = 0; j < k; j++) seen |= g[j].help == g[k].help;
    if (seen) continue;
    fputc('\n', f);
    g[k].help(f);
  }
}

static int unknown_sub(const char *who, const ct_cli_cmd *g, size_t n, const char *sub) {
  fprintf(stderr, "%s: unknown subcommand '%s' (", who, sub);
  put_subs(stderr, g, n, ", ");
  fprintf(stderr, ")\n");
  return 2;
}

/* `ctuner help [NAME [SUB]]`. */
static int help(int argc, char **argv) {
  if (argc < 2) {
    list_commands(stdout);
    return 0;
  }
  size_t n;
  const ct_cli_cmd *g = find_group(argv[1], &n);
  if (!g) {
    fprintf(stderr, "ctuner help: unknown command '%s'\n\n", argv[1]);
    list_commands(stderr);
    return 2;
  }
  if (!g->sub) {
    g->help(stdout);
    return 0;
  }
  if (argc < 3) {
    group_help(stdout, g, n);
    return 0;
  }
  const ct_cli_cmd *c = find_sub(g, n, argv[2]);
  if (!c) return unknown_sub("ctuner help", g, n, argv[2]);
  c->help(stdout);
  return 0;
}

/* argv[0] is the command's name. */
static int dispatch(int argc, char **argv) {
  size_t n;
  const ct_cli_cmd *g = find_group(argv[0], &n), *c = g;
  if (!g) {
    fprintf(stderr, "ctuner: unknown command '%s'\n\n", argv[0]);
    list_commands(stderr);
    return 2;
  }
  int words = 1;
  if (g->sub) {
    char who[64];
    snprintf(who, sizeof who, "ctuner %s", g->name);
    if (argc < 2) {
      fprintf(stderr, "%s: expected a subcommand (", who);
      put_subs(stderr, g, n, ", ");
      fprintf(stderr, ")\n\n");
      group_help(stderr, g, n);
      return 2;
    }
    if (is_help(argv[1])) {
      group_help(stdout, g, n);
      return 0;
    }
    c = find_sub(g, n, argv[1]);
    if (!c) return unknown_sub(who, g, n, argv[1]);
    words = 2;
  }
  if (argc > words && is_help(argv[words])) {
    c->help(stdout);
    return 0;
  }
  return c->run(argc, argv);
}

int main(int argc, char **argv) {
  int i = 1;
  const char *lv = NULL;
  while (i < argc && !strncmp(argv[i], "--log-level", 11)) {
    int r = ct_cli_opt(argc, argv, &i, "log-level", &lv);
    if (r < 0) return 2;
    int l = ct_log_level_parse(lv);
    if (l < 0) {
      fprintf(stderr, "ctuner: --log-level=%s: expected debug, info, warn, error or off\n", lv);
      return 2;
    }
    ct_log_set_level((ct_log_level)l);
    i++;
  }
  if (i >= argc) {
    list_commands(stderr);
    return 2;
  }
  if (is_help(argv[i])) {
    list_commands(stdout);
    return 0;
  }
  if (!strcmp(argv[i], "help")) return help(argc - i, argv + i);
  return dispatch(argc - i, argv + i);
}

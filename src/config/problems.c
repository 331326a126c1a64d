/* problems.c: the list of a configuration's problems (ct_config_problems).
 * Plain data filled by loading (config.c, envfile.c) and checking; the
 * library never prints it: `ctuner config check` and `ctuner train` print
 * it, another front end may attach each problem to its field by key. Bounded
 * (10000 entries) so a hostile file cannot grow it without end. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_int.h"

#define MAX_PROBLEMS 10000

void ct_config_problems_free(ct_config_problems *p) {
  if (!p) return;
  free(p->v);
  memset(p, 0, sizeof *p);
}

void ct_config_problems_add(ct_config_problems *p, int warning, ct_status st,
                            ct_config_origin origin, const char *file, int line, int col,
                            const char *key, const char *hint, const char *fmt, ...) {
  if (!p) return;
  if (!warning) p->errors++;
  if (p->n >= MAX_PROBLEMS) return;
  if (p->n == p->cap) {
    size_t nc = p->cap ? p->cap * 2 : 16;
    ct_config_problem *nv = realloc(p->v, nc * sizeof *nv);
    if (!nv) return;
    p->v = nv, p->cap = nc;
  }
  ct_config_problem *pr = &p->v[p->n++];
  memset(pr, 0, sizeof *pr);
  pr->status = st;
  pr->warning = warning;
  pr->origin = origin;
  snprintf(pr->file, sizeof pr->file, "%s", file ? file : "");
  pr->line = line, pr->col = col;
  snprintf(pr->key, sizeof pr->key, "%s", key ? key : "");
  snprintf(pr->hint, sizeof pr->hint, "%s", hint ? hint : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pr->msg, sizeof pr->msg, fmt, ap);
  va_end(ap);
}

const char *ct_config_origin_name(ct_config_origin o) {
  switch (o) {
    case CT_ORIGIN_FILE:
      return "file";
    case CT_ORIGIN_CLI:
      return "cli";
    case CT_ORIGIN_DEEPSPEED:
      return "deepspeed";
    default:
      return "default";
  }
}

const char *ct_config_problem_where(const ct_config_problem *pr, char *buf, size_t n) {
  if (pr->file[0] && pr->line > 0 && pr->col > 0)
    snprintf(buf, n, "%s:%d:%d", pr->file, pr->line, pr->col);
  else if (pr->file[0] && pr->line > 0)
    snprintf(buf, n, "%s:%d", pr->file, pr->line);
  else if (pr->file[0])
    snprintf(buf, n, "%s", pr->file);
  else if (pr->origin == CT_ORIGIN_CLI && pr->key[0])
    snprintf(buf, n, "--%s", pr->key);
  else if (pr->origin == CT_ORIGIN_DEEPSPEED && pr->key[0])
    snprintf(buf, n, "deepspeed_config (%s)", pr->key);
  else if (pr->key[0])
    snprintf(buf, n, "%s (default)", pr->key);
  else
    snprintf(buf, n, "config");
  return buf;
}

ct_status ct_config_problems_to_err(const ct_config_problems *p, ct_err *err) {
  const ct_config_problem *first = NULL;
  for (size_t i = 0; i < p->n && !first; i++)
    if (!p->v[i].warning) first = &p->v[i];
  if (!first) return p->errors ? ct_errf(err, CT_ERR_NOMEM, "out of memory") : CT_OK;
  char where[600];
  char tail[96] = "";
  if (p->errors > 1)
    snprintf(tail, sizeof tail, " (and %zu more; 'ctuner config check' lists every problem)",
             p->errors - 1);
  return ct_errf(err, first->status ? first->status : CT_ERR_INVALID, "%s: %s%s",
                 ct_config_problem_where(first, where, sizeof where), first->msg, tail);
}

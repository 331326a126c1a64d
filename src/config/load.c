/* load.c: a config file into a ct_config, by its extension: config.json
 * (ct_json), config.toml (toml.c, as JSON values), config.env (envfile.c).
 * Every problem is collected (ct_config_problems); the first error also as a
 * ct_err for callers that stop at one (ct_config_load_file). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_int.h"
#include "ctuner/fs.h"

ct_status ct_cfg_set_object(ct_config *cfg, const ct_json *obj, const char *file,
                            ct_config_problems *probs) {
  ct_status first = CT_OK;
  for (size_t i = 0; i < obj->n; i++) {
    const cfg_src src = {CT_ORIGIN_FILE, file, obj->items[i].line, obj->items[i].col};
    ct_status st = ct_cfg_set_value(cfg, obj->keys[i], &obj->items[i], &src, probs);
    if (st && !first) first = st;
  }
  return first;
}

const char *ct_cfg_split_pos(const char *msg, int *line, int *col) {
  int n = 0;
  *line = *col = 0;
  if (sscanf(msg, "line %d, column %d: %n", line, col, &n) == 2 && n > 0) return msg + n;
  *line = *col = 0;
  return msg;
}

/* The whole file as text (at most 64 MB), or a problem. */
static ct_status read_text(const char *path, char **text, size_t *len, ct_config_problems *probs) {
  ct_status st = CT_OK;
  *text = NULL;
  *len = 0;
  if (ct_is_dir(path)) { /* fopen opens a directory and fread reads nothing from it */
    static const char *const NAMES[] = {"config.json", "config.toml", "config.env"};
    char inside[1024] = "", p[4200];
    for (size_t i = 0, n = 0; i < 3; i++) {
      snprintf(p, sizeof p, "%s/%s", path, NAMES[i]);
      FILE *t = fopen(p, "rb");
      if (!t) continue;
      fclose(t);
      n += (size_t)snprintf(inside + n, n < sizeof inside ? sizeof inside - n : 0, "%s%s",
                            n ? " or " : "; it holds ", p);
    }
    ct_config_problems_add(probs, 0, CT_ERR_INVALID, CT_ORIGIN_FILE, path, 0, 0, NULL, NULL,
                           "is a directory, not a config file (give a config.json, config.env "
                           "or config.toml%s)",
                           inside[0] ? inside : "");
    return CT_ERR_INVALID;
  }
  FILE *f = fopen(path, "rb");
  if (!f) {
    ct_config_problems_add(probs, 0, CT_ERR_IO, CT_ORIGIN_FILE, path, 0, 0, NULL, NULL,
                           "cannot open the config file: %s", strerror(errno));
    return CT_ERR_IO;
  }
  size_t cap = 0;
  for (;;) {
    if (*len + 4096 + 1 > cap) {
      cap = cap ? cap * 2 : 8192;
      char *nt = cap > (64u << 20) ? NULL : realloc(*text, cap);
      if (!nt) {
        st = cap > (64u << 20) ? CT_ERR_RANGE : CT_ERR_NOMEM;
        ct_config_problems_add(
            probs, 0, st, CT_ORIGIN_FILE, path, 0, 0, NULL, NULL, "%s",
            st == CT_ERR_RANGE ? "config file larger than 64 MB" : "out of memory");
        goto out;
      }
      *text = nt;
    }
    size_t r = fread(*text + *len, 1, 4096, f);
    *len += r;
    if (r < 4096) break;
  }
  (*text)[*len] = 0;
  if (ferror(f)) {
    st = CT_ERR_IO;
    ct_config_problems_add(probs, 0, st, CT_ORIGIN_FILE, path, 0, 0, NULL, NULL, "read error");
  }
out:
  fclose(f);
  if (st) {
    free(*text);
    *text = NULL;
  }
  return st;
}

static int ends_with(const char *s, const char *suffix) {
  const size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcasecmp(s + n - m, suffix);
}

/* config.json or config.toml: a parsed object, then its members. */
static ct_status load_object(ct_config *cfg, const char *path, const char *text, size_t len,
                             int toml, ct_config_problems *probs) {
  ct_json *j = NULL;
  ct_err e = {0};
  ct_status st = toml ? ct_config_toml_parse(text, len, &j, &e) : ct_json_parse(text, len, &j, &e);
  if (st) {
    int line, col;
    const char *m = ct_cfg_split_pos(e.msg, &line, &col);
    ct_config_problems_add(probs, 0, st, CT_ORIGIN_FILE, path, line, col, NULL, NULL, "%s", m);
    return st;
  }
  if (j->type != CT_JSON_OBJECT) {
    st = CT_ERR_FORMAT;
    ct_config_problems_add(probs, 0, st, CT_ORIGIN_FILE, path, j->line, j->col, NULL, NULL,
                           "expected a JSON object of options, got %s", ct_json_type_name(j->type));
  } else {
    st = ct_cfg_set_object(cfg, j, path, probs);
  }
  ct_json_free(j);
  return st;
}

ct_status ct_config_load(ct_config *cfg, const char *path, ct_config_problems *probs) {
  char *text = NULL;
  size_t len = 0;
  ct_status st = read_text(path, &text, &len, probs);
  if (st) return st;
  snprintf(cfg->file, sizeof cfg->file, "%s", path);
  if (ends_with(path, ".env"))
    st = ct_cfg_load_env(cfg, text, len, path, probs);
  else
    st = load_object(cfg, path, text, len, ends_with(path, ".toml"), probs);
  free(text);
  return st;
}

ct_status ct_config_load_file(ct_config *cfg, const char *path, ct_err *err) {
  ct_config_problems probs = {0};
  ct_status st = ct_config_load(cfg, path, &probs);
  if (st) ct_config_problems_to_err(&probs, err);
  ct_config_problems_free(&probs);
  return st;
}

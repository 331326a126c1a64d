/* Hub ids in a config's model paths (ctuner/train.h ct_train_resolve_hub,
 * docs/hub.md): each of pretrained_model_name_or_path,
 * pretrained_transformer_model_name_or_path and
 * pretrained_vae_model_name_or_path that is not a local path but a repo id is
 * replaced by its snapshot directory in the Hugging Face cache, as diffusers'
 * from_pretrained does (pipeline_utils.py: a path that is not a directory is
 * a hub id; SimpleTuner passes revision and variant to every from_pretrained
 * of the model). With variant, the directory the loaders see is the variant
 * view (ct_hub_variant_dir), for local directories too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/hub.h"
#include "ctuner/log.h"
#include "ctuner/train.h"

/* $XDG_CACHE_HOME/ctuner/variants, else ~/.cache/ctuner/variants. */
static int views_root(char *out, size_t n) {
  const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
  if (x && *x) return snprintf(out, n, "%s/ctuner/variants", x) >= (int)n;
  if (h && *h) return snprintf(out, n, "%s/.cache/ctuner/variants", h) >= (int)n;
  return snprintf(out, n, "/tmp/ctuner-variants-%ld", (long)getuid()) >= (int)n;
}

static int replace(char **field, const char *v) {
  char *c = strdup(v);
  if (!c) return -1;
  free(*field);
  *field = c;
  return 0;
}

/* One key: its value as a local directory (or file) for the loaders. */
static ct_status resolve_one(ct_config *cfg, char **field, const char *key, const char *sub,
                             int sub_optional, const char *const *skip, int download, int *hub_ids,
                             ct_err *err) {
  const char *v = *field;
  struct stat sb;
  char dir[CT_HUB_PATH], view[CT_HUB_PATH], root[CT_HUB_PATH];
  ct_status st = CT_OK;
  if (!stat(v, &sb)) { /* a local path, as it always was */
    if (!cfg->variant || !S_ISDIR(sb.st_mode)) return CT_OK;
    snprintf(dir, sizeof dir, "%s", v);
  } else if (!ct_hub_is_repo_id(v)) {
    char cwd[CT_HUB_PATH] = ".";
    if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, ".");
    return ct_errf(err, CT_ERR_NOT_FOUND,
                   "%s '%s': no such file or directory (from %s), and not a hub id (org/name)", key,
                   v, cwd);
  } else {
    const ct_hub_opts o = {cfg->revision, cfg->variant, sub, sub_optional, key, 0, skip};
    (*hub_ids)++;
    st = download ? ct_hub_fetch(v, &o, dir, sizeof dir, err)
                  : ct_hub_lookup(v, &o, dir, sizeof dir, err);
    if (st) return st;
    CT_INFO("%s %s (revision %s): %s", key, v, cfg->revision ? cfg->revision : "main", dir);
  }
  if (cfg->variant) {
    if (views_root(root, sizeof root))
      return ct_errf(err, CT_ERR_RANGE, "the variant views' path is too long");
    st = ct_hub_variant_dir(dir, cfg->variant, root, view, sizeof view, err);
    if (st) {
      char m[sizeof err->msg];
      snprintf(m, sizeof m, "%s: %.900s", key, err->msg);
      memcpy(err->msg, m, sizeof m);
      return st;
    }
    snprintf(dir, sizeof dir, "%s", view);
  }
  return replace(field, dir) ? ct_errf(err, CT_ERR_NOMEM, "out of memory") : CT_OK;
}

ct_status ct_train_resolve_hub(ct_config *cfg, int download, ct_err *err) {
  int ids = 0;
  ct_status st = CT_OK;
  const char *tsub = cfg->pretrained_transformer_subfolder;
  if (tsub && (!*tsub || !strcmp(tsub, "none"))) tsub = NULL;
  /* the pipeline's own transformer or VAE is not fetched when another replaces it */
  const char *skip[3] = {NULL, NULL, NULL};
  int k = 0;
  if (cfg->pretrained_transformer_model_name_or_path) skip[k++] = "transformer";
  if (cfg->pretrained_vae_model_name_or_path) skip[k++] = "vae";
  if (cfg->pretrained_model_name_or_path)
    st = resolve_one(cfg, &cfg->pretrained_model_name_or_path, "pretrained_model_name_or_path",
                     NULL, 0, skip, download, &ids, err);
  if (!st && cfg->pretrained_transformer_model_name_or_path)
    st = resolve_one(cfg, &cfg->pretrained_transformer_model_name_or_path,
                     "pretrained_transformer_model_name_or_path", tsub, 0, NULL, download, &ids,
                     err);
  if (!st && cfg->pretrained_vae_model_name_or_path)
    st = resolve_one(cfg, &cfg->pretrained_vae_model_name_or_path,
                     "pretrained_vae_model_name_or_path", "vae", 1, NULL, download, &ids, err);
  if (!st && !ids && cfg->given[CT_KEY_revision])
    CT_WARN("revision %s has no effect: no model path is a hub id (docs/hub.md)", cfg->revision);
  return st;
}

/* What a run started by the server may touch, checked before it starts (the
 * trainer is another process: it opens paths by name and would follow a
 * link, so the server looks first). A start is refused, by name, when
 *   - the run's config.json is not a regular file (a symbolic link is never
 *     read: the trainer would quote a linked file's text into train.log);
 *   - anything in the run directory is a symbolic link (a checkpoint-N that
 *     resume's "latest" would pick, a linked multidatabackend.json, ...);
 *   - a path the config writes (output_dir_local, logging_dir,
 *     offload_param_path, a dataset's cache_dir / cache_dir_vae) leaves root;
 *   - a path the config reads that lies under root (a dataset, a checkpoint to
 *     resume, data_backend_config, a model) passes through a link or holds
 *     one. Paths it reads outside root (datasets named by absolute path) are
 *     the config author's to choose: docs/webui.md, "Threat model".
 * The dataset problems the builder's check shows (srv_backend_problems) are
 * multidatabackend.json's own rules, as `ctuner config check` reports them,
 * plus: a local image dataset's instance_data_dir must be a directory. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/config.h"
#include "ctuner/data.h"
#include "serve/serve_int.h"

/* Keys of the config holding a path the run reads, and paths it writes. */
static const char *const INPUTS[] = {"data_backend_config",
                                     "resume_from_checkpoint",
                                     "pretrained_model_path",
                                     "pretrained_model_name_or_path",
                                     "pretrained_transformer_model_name_or_path",
                                     "pretrained_vae_model_name_or_path",
                                     "vae_config",
                                     "lycoris_config",
                                     "text_encoder_path",
                                     "user_prompt_library",
                                     "webhook_config",
                                     "deepspeed_config",
                                     "disk_low_script"};
static const char *const OUTPUTS[] = {"output_dir_local", "logging_dir", "offload_param_path"};

void srv_backend_problems(const char *text, size_t n, const char *outdir, const ct_config *cfg,
                          ct_config_problems *probs) {
  const ct_backend_vars vars = {cfg->model_family, outdir, cfg->resolution_type,
                                cfg->minimum_image_size, cfg->model_type};
  ct_backend *be = NULL;
  ct_err err = {0};
  const size_t before = probs->errors;
  ct_status st = ct_backend_parse_with(text, n, "multidatabackend.json", &vars, &be, probs, &err);
  if (st && probs->errors == before)
    ct_config_problems_add(probs, 0, st, CT_ORIGIN_FILE, "multidatabackend.json", 0, 0, NULL, NULL,
                           "%s", err.msg);
  for (int i = 0; be && i < be->n; i++) {
    const ct_ds_config *d = &be->ds[i];
    struct stat sb;
    char p[2 * PATH_MAX];
    if (d->is_aws || d->kind != CT_DS_IMAGE || !d->instance_data_dir || !d->instance_data_dir[0])
      continue;
    snprintf(p, sizeof p, "%s%s%s", d->instance_data_dir[0] == '/' ? "" : outdir,
             d->instance_data_dir[0] == '/' ? "" : "/", d->instance_data_dir);
    const int missing = stat(p, &sb) != 0;
    if (missing || !S_ISDIR(sb.st_mode))
      ct_config_problems_add(probs, 0, CT_ERR_NOT_FOUND, CT_ORIGIN_FILE, "multidatabackend.json", 0,
                             0, "instance_data_dir", NULL,
                             "dataset '%s': instance_data_dir '%s' is not a directory%s%s",
                             d->id ? d->id : "?", d->instance_data_dir, missing ? ": " : "",
                             missing ? strerror(errno) : "");
  }
  ct_backend_free(be);
}

/* One path of the config: 0 if it may be used, else the refusal in r. */
static int check_path(ct_serve *s, const char *run, const char *what, const char *path, int output,
                      srv_reply *r) {
  char rel[2 * PATH_MAX], link[2 * PATH_MAX];
  if (!path || !*path || path[0] == '{' || !strncmp(path, "s3://", 5)) return 0;
  int at = srv_path_inside(s, run, path, rel, sizeof rel);
  if (at < 0) {
    srv_error(r, 400, "%s '%s' is too long", what, path);
  } else if (at == 0 && output) {
    srv_error(r, 403,
              "%s '%s' leaves the served root %s: a run started here writes only inside it "
              "(name a directory under the run, or leave the key out)",
              what, path, s->root);
  } else if (at == 2) {
    srv_error(r, 403,
              "%s '%s' passes through the symbolic link '%s' under the root: the server "
              "follows no links under %s",
              what, path, rel, s->root);
  } else if (at == 1 && !output && srv_find_link(s->rootfd, rel, link, sizeof link) == 1) {
    srv_error(r, 403,
              "%s '%s' holds the symbolic link '%s' under the root: the server follows no "
              "links under %s",
              what, path, link, s->root);
  } else {
    return 0;
  }
  return 1;
}

/* multidatabackend.json named by the config: its datasets' paths. */
static int check_datasets(ct_serve *s, const char *run, const ct_config *cfg, srv_reply *r) {
  char rel[2 * PATH_MAX], outdir[PATH_MAX + 200], *b = NULL, what[300];
  size_t n = 0;
  int bad = 0, at = srv_path_inside(s, run, cfg->data_backend_config, rel, sizeof rel);
  int fd = at == 1 ? srv_open_rel(s->rootfd, rel, O_RDONLY)
                   : open(cfg->data_backend_config, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || srv_read_fd(fd, 0, (size_t)1 << 22, &b, &n)) {
    if (fd >= 0) close(fd);
    return 0; /* the trainer says what is wrong with it */
  }
  close(fd);
  snprintf(outdir, sizeof outdir, "%s/%s", s->root, run);
  const ct_backend_vars vars = {cfg->model_family, outdir, cfg->resolution_type,
                                cfg->minimum_image_size, cfg->model_type};
  ct_backend *be = NULL;
  ct_err err = {0};
  ct_config_problems probs = {0};
  if (!ct_backend_parse_with(b, n, "multidatabackend.json", &vars, &be, &probs, &err)) {
    for (int i = 0; !bad && i < be->n; i++) {
      const ct_ds_config *d = &be->ds[i];
      if (d->is_aws) continue;
      snprintf(what, sizeof what, "dataset '%s': cache_dir_vae", d->id ? d->id : "?");
      bad = check_path(s, run, what, d->cache_dir_vae, 1, r);
      snprintf(what, sizeof what, "dataset '%s': cache_dir", d->id ? d->id : "?");
      if (!bad) bad = check_path(s, run, what, d->cache_dir, 1, r);
      snprintf(what, sizeof what, "dataset '%s': instance_data_dir", d->id ? d->id : "?");
      if (!bad) bad = check_path(s, run, what, d->instance_data_dir, 0, r);
    }
  }
  ct_backend_free(be);
  ct_config_problems_free(&probs);
  free(b);
  return bad;
}

/* The config as the trainer will read it (from the checked text, not the
 * file again); 0 and the paths checked, or the refusal in r. */
static int check_config_paths(ct_serve *s, const char *run, const char *text, size_t n,
                              srv_reply *r) {
  ct_config cfg;
  ct_config_defaults(&cfg);
  ct_config_problems probs = {0};
  char path[64], what[200];
  int bad = 0, fd = memfd_create("config.json", MFD_CLOEXEC);
  if (fd >= 0 && write(fd, text, n) == (ssize_t)n) {
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ct_config_load(&cfg, path, &probs); /* its problems: the trainer reports them */
    char *js = ct_config_to_json(&cfg);
    ct_json *j = NULL;
    ct_err err = {0};
    if (js && !ct_json_parse(js, strlen(js), &j, &err)) {
      const size_t nin = sizeof INPUTS / sizeof *INPUTS, nout = sizeof OUTPUTS / sizeof *OUTPUTS;
      for (size_t i = 0; !bad && i < nin + nout; i++) {
        const int out = i >= nin;
        const char *key = out ? OUTPUTS[i - nin] : INPUTS[i];
        const ct_json *v = ct_json_get(j, key);
        snprintf(what, sizeof what, "key '%s'", key);
        if (v && v->type == CT_JSON_STRING) bad = check_path(s, run, what, v->str, out, r);
      }
    }
    ct_json_free(j);
    free(js);
    if (!bad && cfg.data_backend_config) bad = check_datasets(s, run, &cfg, r);
  }
  if (fd >= 0) close(fd);
  ct_config_problems_free(&probs);
  ct_config_free(&cfg);
  return bad;
}

int srv_launch_check(ct_serve *s, const char *name, int runfd, srv_reply *r) {
  char link[PATH_MAX], *text = NULL;
  size_t n = 0;
  struct stat st;
  int fd = openat(runfd, "config.json", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    srv_error(r, 404, "run '%s' has no saved config.json (POST /api/runs/%s/config first)", name,
              name);
    return 1;
  }
  if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    srv_error(r, 403,
              "config.json of run '%s' is not a regular file (a symbolic link?): the server "
              "follows no links under its root",
              name);
    if (fd >= 0) close(fd);
    return 1;
  }
  int bad = srv_read_fd(fd, 0, (size_t)1 << 22, &text, &n);
  close(fd);
  if (bad) {
    srv_error(r, 500, "cannot read config.json of run '%s': %s", name, strerror(errno));
    return 1;
  }
  int found = srv_find_link(runfd, "", link, sizeof link);
  if (found) {
    if (found > 0)
      srv_error(r, 403,
                "run '%s' holds a symbolic link, '%s': the server follows no links under its "
                "root (remove it to start the run)",
                name, link);
    else
      srv_error(r, 500, "cannot look through run '%s': %s", name, strerror(errno));
    bad = 1;
  }
  if (!bad) bad = check_config_paths(s, name, text, n, r);
  free(text);
  return bad;
}

/* The trainer's TensorBoard logging (report_to tensorboard; docs/tensorboard.md),
 * rank 0 only, over the event-file writer of src/tb:
 *
 *   directory   logging_dir (relative to output_dir unless absolute) /
 *               tracker_project_name, as accelerate's TensorBoardTracker
 *   at start    a new event file starting with session_log START at the
 *               run's first step (global step + 1), so TensorBoard drops what
 *               an earlier attempt wrote from that step on (a resume repeats
 *               the steps after its checkpoint, as metrics.jsonl does); the
 *               resolved config as text at that step
 *   each step   every number of the step's metrics.jsonl line as a scalar of
 *               the same name (loss, lr, grad_norm, samples_per_s, ...), then
 *               a flush
 *   validation  each PNG the step wrote to output_dir/validation_images, its
 *               prompt (the .txt beside it) in the tag
 *
 * A failed write warns once and ends the logging; training goes on. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/fs.h"
#include "ctuner/image.h"
#include "ctuner/log.h"
#include "ctuner/tfevents.h"
#include "trainer_int.h"

static int wants_tensorboard(const char *r) {
  return r && (!strcmp(r, "tensorboard") || !strcmp(r, "all"));
}

/* A failed write: one warning, then no more logging. */
static void give_up(trainer *tr, const ct_err *e) {
  CT_WARN("tensorboard: %s; no more TensorBoard logging in this run (metrics.jsonl goes on)",
          e->msg);
  ct_tb_close(tr->tb, NULL);
  tr->tb = NULL;
}

/* Four spaces before each line: a Markdown code block for the text plugin. */
static char *config_markdown(const ct_config *cfg) {
  char *js = ct_config_to_json(cfg);
  if (!js) return NULL;
  size_t lines = 1;
  for (const char *p = js; *p; p++) lines += *p == '\n';
  const char *run = cfg->tracker_run_name ? cfg->tracker_run_name : "";
  size_t cap = strlen(js) + 4 * lines + strlen(run) + 64;
  char *md = malloc(cap);
  if (md) {
    size_t n = (size_t)snprintf(md, cap, "run: %s\n\n    ", run);
    for (const char *p = js; *p; p++) {
      md[n++] = *p;
      if (*p == '\n' && p[1]) memcpy(md + n, "    ", 4), n += 4;
    }
    md[n] = 0;
  }
  free(js);
  return md;
}

ct_status ct_tboard_open(trainer *tr, long resumed_step, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  if (tr->rank != 0 || !cfg->report_to) return CT_OK;
  if (!wants_tensorboard(cfg->report_to)) {
    CT_WARN(
        "report_to %s: ctuner does not build that tracker; nothing is sent to it (metrics go "
        "to %s/metrics.jsonl; report_to tensorboard writes TensorBoard event files)",
        cfg->report_to, cfg->output_dir);
    return CT_OK;
  }
  if (!strcmp(cfg->report_to, "all"))
    CT_WARN(
        "report_to all: only tensorboard is built into ctuner; wandb and comet_ml get "
        "nothing");
  const char *ld = cfg->logging_dir && *cfg->logging_dir ? cfg->logging_dir : "logs";
  const char *proj = cfg->tracker_project_name ? cfg->tracker_project_name : "";
  char dir[4400];
  if (ct_pathf(dir, sizeof dir, "%s%s%s%s%s", ld[0] == '/' ? "" : cfg->output_dir,
               ld[0] == '/' ? "" : "/", ld, *proj ? "/" : "", proj))
    return ct_errf(err, CT_ERR_RANGE, "logging_dir: path too long");
  if (strchr(proj, '/') || !strcmp(proj, "..") || !strcmp(proj, "."))
    return ct_errf(
        err, CT_ERR_INVALID,
        "tracker_project_name '%s' names one directory under logging_dir: no '/', '.' or '..'",
        proj);
  ct_status st = ct_tb_open(dir, resumed_step + 1, &tr->tb, err);
  if (st) {
    ct_err_prefix(err, "report_to tensorboard: ");
    return st;
  }
  tr->wait_logged = tr->data_wait;
  CT_INFO("tensorboard: %s (view: tensorboard --logdir %s)", ct_tb_path(tr->tb), dir);
  char *md = config_markdown(cfg);
  ct_err e = {0};
  st = md ? ct_tb_text(tr->tb, "config", resumed_step + 1, md, &e)
          : ct_errf(&e, CT_ERR_NOMEM, "out of memory");
  if (!st) st = ct_tb_flush(tr->tb, &e);
  free(md);
  if (st) give_up(tr, &e);
  return CT_OK;
}

/* Each "key": number of a metrics line (ours: a flat object of numbers and
 * booleans; nan/inf as C prints them) except step, as a scalar. */
static ct_status log_numbers(ct_tb *tb, long step, const char *line, ct_err *err) {
  ct_status st = CT_OK;
  const char *p = line;
  while (!st && (p = strchr(p, '"'))) {
    const char *k = p + 1, *q = strchr(k, '"');
    if (!q) break;
    char key[128];
    snprintf(key, sizeof key, "%.*s", (int)(q - k < 127 ? q - k : 127), k);
    p = q + 1;
    while (*p == ' ' || *p == ':') p++;
    char *end = NULL;
    double v = strtod(p, &end);
    if (end != p && strcmp(key, "step")) st = ct_tb_scalar(tb, key, step, v, err);
    p = end != p ? end : p + strcspn(p, ",}");
  }
  return st;
}

void ct_trainer_log_metrics(trainer *tr, long step, const char *line) {
  fputs(line, tr->metrics);
  fflush(tr->metrics);
  if (!tr->tb) return;
  ct_err e = {0};
  ct_status st = log_numbers(tr->tb, step, line, &e);
  if (!st) st = ct_tb_flush(tr->tb, &e);
  if (st) give_up(tr, &e);
}

/* "step_<step>_" or "step_<step, 6 digits>_" ... ".png" (the MMDiT's images
 * and grid, the VAE's reconstruction): the part between, else NULL. */
static const char *image_of_step(const char *name, long step, char *mid, size_t mn) {
  char a[64], b[64];
  snprintf(a, sizeof a, "step_%ld_", step);
  snprintf(b, sizeof b, "step_%06ld_", step);
  const size_t l = strlen(name);
  if (l < 5 || strcmp(name + l - 4, ".png")) return NULL;
  const char *pre = !strncmp(name, a, strlen(a)) ? a : !strncmp(name, b, strlen(b)) ? b : NULL;
  if (!pre || l - 4 <= strlen(pre)) return NULL;
  snprintf(mid, mn, "%.*s", (int)(l - 4 - strlen(pre)), name + strlen(pre));
  return mid;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* One image: its PNG bytes as they are, the prompt beside it in the tag. */
static ct_status log_image(ct_tb *tb, const char *dir, const char *name, const char *mid, long step,
                           ct_err *err) {
  char path[4700], tag[800], prompt[160] = "";
  if (ct_pathf(path, sizeof path, "%s/%s", dir, name))
    return ct_errf(err, CT_ERR_RANGE, "path too long: %s", dir);
  char *png = NULL, *txt = NULL;
  size_t n = 0, tn = 0;
  ct_image_info info;
  ct_status st = ct_read_file(path, (size_t)256 << 20, &png, &n, err);
  if (!st) st = ct_image_probe_mem(png, n, &info, NULL, err);
  strcpy(path + strlen(path) - 4, ".txt");
  ct_err te = {0};
  if (!st && !ct_read_file(path, 4096, &txt, &tn, &te)) {
    snprintf(prompt, sizeof prompt, ": %s", txt);
    for (char *c = prompt; *c; c++)
      if (*c == '/' || *c == '\n' || *c == '\r') *c = ' '; /* '/' would nest the tag */
  }
  snprintf(tag, sizeof tag, "validation/%s%s", mid, prompt);
  if (!st) st = ct_tb_image(tb, tag, step, info.w, info.h, 3, png, n, err);
  free(png);
  free(txt);
  return st;
}

void ct_tboard_validation(trainer *tr, long step) {
  if (!tr->tb) return;
  char dir[4300], mid[512];
  snprintf(dir, sizeof dir, "%s/validation_images", tr->cfg->output_dir);
  DIR *d = opendir(dir);
  if (!d) return;
  char **names = NULL;
  size_t n = 0, cap = 0;
  ct_err e = {0};
  ct_status st = CT_OK;
  for (struct dirent *de; !st && (de = readdir(d));) {
    if (!image_of_step(de->d_name, step, mid, sizeof mid)) continue;
    if (n == cap) {
      char **nn = realloc(names, (cap = cap ? 2 * cap : 16) * sizeof *names);
      if (!nn)
        st = ct_errf(&e, CT_ERR_NOMEM, "out of memory");
      else
        names = nn;
    }
    if (!st && !(names[n++] = strdup(de->d_name))) st = ct_errf(&e, CT_ERR_NOMEM, "out of memory");
  }
  closedir(d);
  if (!st) qsort(names, n, sizeof *names, cmp_names);
  for (size_t i = 0; i < n && !st; i++)
    if (names[i] && image_of_step(names[i], step, mid, sizeof mid))
      st = log_image(tr->tb, dir, names[i], mid, step, &e);
  if (!st) st = ct_tb_flush(tr->tb, &e);
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  if (st) give_up(tr, &e);
}

void ct_tboard_close(trainer *tr) {
  ct_err e = {0};
  if (tr->tb && ct_tb_close(tr->tb, &e)) CT_WARN("tensorboard: %s", e.msg);
  tr->tb = NULL;
}

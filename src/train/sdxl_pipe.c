/* Opening a diffusers StableDiffusionXLPipeline directory (ctuner/diffusion.h,
 * docs/sdxl.md), as the sdxl row of the family registry (ctuner/family.h)
 * describes it: model_index.json, scheduler, text encoders and tokenizers,
 * VAE, and the unet/ folder's presence. Every problem in one error. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ctuner/diffusion.h"
#include "ctuner/family.h"
#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/vae.h"

typedef struct probs {
  char buf[3000];
  int n;
} probs;

static void add(probs *p, const char *fmt, ...) {
  char item[1200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(item, sizeof item, fmt, ap);
  va_end(ap);
  size_t l = strlen(p->buf);
  if (l + strlen(item) + 8 < sizeof p->buf)
    snprintf(p->buf + l, sizeof p->buf - l, "%s%s", p->n ? "; " : "", item);
  p->n++;
}

static void add_err(probs *p, ct_err *e) {
  add(p, "%s", e->msg);
  memset(e, 0, sizeof *e);
}

static int is_file(const char *dir, const char *name) {
  char path[4096];
  struct stat sb;
  return !ct_pathf(path, sizeof path, "%s/%s", dir, name) && !stat(path, &sb) &&
         S_ISREG(sb.st_mode);
}

/* One model_index.json entry against the row's component (cls may be a
 * "|"-list of classes). */
static void check_entry(const ct_family *f, const char *path, const char *k, const ct_json *v,
                        probs *pr) {
  const int null_pair = v->type == CT_JSON_ARRAY && v->n == 2 && v->items[0].type == CT_JSON_NULL &&
                        v->items[1].type == CT_JSON_NULL;
  const char *cls = v->type == CT_JSON_ARRAY && v->n == 2 && v->items[1].type == CT_JSON_STRING
                        ? v->items[1].str
                        : NULL;
  const ct_family_component *c = ct_family_component_find(f, k);
  if (!c) {
    if (!null_pair)
      add(pr, "%s: component %s (%s) is not part of what ctuner reads", path, k, cls ? cls : "?");
    return;
  }
  if (!cls || !ct_family_in_list(c->cls, cls))
    add(pr, "%s: %s is %s; ctuner reads %s", path, k, cls ? cls : "null", c->cls);
}

static void check_index(ct_sdxl_pipe *p, probs *pr) {
  const ct_family *f = ct_family_find("sdxl");
  char path[4096];
  ct_err e = {0};
  ct_json *j = NULL;
  if (ct_pathf(path, sizeof path, "%s/model_index.json", p->root) ||
      !is_file(p->root, "model_index.json")) {
    add(pr, "%s/model_index.json: missing (not a diffusers pipeline directory)", p->root);
    return;
  }
  if (ct_json_parse_file(path, 1 << 20, &j, &e)) {
    add_err(pr, &e);
    return;
  }
  const ct_json *c = ct_json_get(j, "_class_name");
  if (!c || c->type != CT_JSON_STRING || strcmp(c->str, f->pipeline_class))
    add(pr, "%s: _class_name is %s; ctuner reads %s (an SDXL refiner is not yet in ctuner)", path,
        c && c->type == CT_JSON_STRING ? c->str : "(missing)", f->pipeline_class);
  p->force_zeros_for_empty_prompt = 1;
  for (size_t i = 0; j->type == CT_JSON_OBJECT && i < j->n; i++) {
    const char *k = j->keys[i];
    if (k[0] == '_') continue;
    if (!strcmp(k, "force_zeros_for_empty_prompt")) {
      if (j->items[i].type != CT_JSON_BOOL)
        add(pr, "%s: force_zeros_for_empty_prompt must be true or false", path);
      else
        p->force_zeros_for_empty_prompt = j->items[i].boolean;
      continue;
    }
    check_entry(f, path, k, &j->items[i], pr);
  }
  for (int m = 0; m < f->ncomponents; m++)
    if (!ct_json_get(j, f->components[m].name))
      add(pr, "%s: no %s entry", path, f->components[m].name);
  ct_json_free(j);
}

/* unet/: config.json naming UNet2DConditionModel, and weights (one file or an index). */
static void check_unet(ct_sdxl_pipe *p, probs *pr) {
  ct_json *j = NULL;
  ct_err e = {0};
  char path[4096];
  snprintf(p->unet_dir, sizeof p->unet_dir, "%s/unet", p->root);
  if (!is_file(p->unet_dir, "config.json")) {
    add(pr, "%s/config.json: missing", p->unet_dir);
    return;
  }
  if (ct_pathf(path, sizeof path, "%s/config.json", p->unet_dir) ||
      ct_json_parse_file(path, 1 << 20, &j, &e)) {
    add_err(pr, &e);
    return;
  }
  const ct_json *c = ct_json_get(j, "_class_name");
  if (c && (c->type != CT_JSON_STRING || strcmp(c->str, "UNet2DConditionModel")))
    add(pr, "%s: _class_name is not UNet2DConditionModel", path);
  ct_json_free(j);
  if (!is_file(p->unet_dir, "diffusion_pytorch_model.safetensors") &&
      !is_file(p->unet_dir, "diffusion_pytorch_model.safetensors.index.json"))
    add(pr,
        "%s: no diffusion_pytorch_model.safetensors (or its .index.json shards; .bin files are "
        "not read)",
        p->unet_dir);
}

static void open_vae(ct_sdxl_pipe *p, probs *pr) {
  char dir[4096];
  ct_err e = {0};
  if (ct_pathf(dir, sizeof dir, "%s/vae", p->root) || ct_vae_from_pretrained(dir, &p->vae, &e)) {
    add_err(pr, &e);
    return;
  }
  const ct_vae_config *c = ct_vae_cfg(p->vae);
  const int want = ct_family_find("sdxl")->latent_channels;
  if (c->latent_channels != want)
    add(pr, "%s: latent_channels %d; SDXL's U-net takes %d", dir, c->latent_channels, want);
  if (c->shift_factor != 0.0f)
    add(pr, "%s: shift_factor %g; SDXL's VAE has none (a FLUX.1 VAE?)", dir,
        (double)c->shift_factor);
}

ct_status ct_sdxl_pipe_open(const char *root, ct_sdxl_pipe *p, ct_err *err) {
  memset(p, 0, sizeof *p);
  probs pr = {.n = 0};
  ct_err e = {0};
  if (snprintf(p->root, sizeof p->root, "%s", root) >= (int)sizeof p->root)
    return ct_errf(err, CT_ERR_INVALID, "%s: path too long", root);
  check_index(p, &pr);
  char path[4096];
  if (ct_pathf(path, sizeof path, "%s/scheduler/scheduler_config.json", root) ||
      !is_file(root, "scheduler/scheduler_config.json"))
    add(&pr, "%s/scheduler/scheduler_config.json: missing", root);
  else if (ct_ddpm_config_read(path, &p->sched, &e))
    add_err(&pr, &e);
  if (ct_sdxl_text_open(root, &p->text, &e)) add_err(&pr, &e);
  open_vae(p, &pr);
  check_unet(p, &pr);
  if (!pr.n) return CT_OK;
  ct_sdxl_pipe_close(p);
  return ct_errf(err, CT_ERR_INVALID, "SDXL pipeline %s: %d problem%s: %s", root, pr.n,
                 pr.n > 1 ? "s" : "", pr.buf);
}

void ct_sdxl_pipe_close(ct_sdxl_pipe *p) {
  ct_sdxl_text_free(p->text);
  ct_vae_free(p->vae);
  p->text = NULL;
  p->vae = NULL;
}

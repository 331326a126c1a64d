/* preflight.c: the files a training config names, opened and checked as
 * training opens them, before any data or cache (ctuner/train.h,
 * ct_train_check_files). `ctuner config check` and `ctuner train` both call
 * it, so the two never disagree about a file: the FLUX.1 pipeline
 * (flux_pipe.c, every check that needs no weights), the LyCORIS config, the
 * VAE's config (model_type vae, codec vae), the BPE tokenizer, the files of
 * pretrained_model_path / text_encoder_path / init_lora, and the webhooks. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ctuner/diffusion.h"
#include "ctuner/fs.h"
#include "ctuner/health.h"
#include "ctuner/hub.h"
#include "ctuner/lora.h"
#include "ctuner/textenc.h"
#include "ctuner/train.h"
#include "ctuner/vae.h"
#include "train/flux_pipe.h"
#include "train_int.h"

/* A problem filed under key k, at the place its value came from. */
static void problem(const ct_config *cfg, ct_config_problems *probs, int k, const char *name,
                    ct_status st, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void problem(const ct_config *cfg, ct_config_problems *probs, int k, const char *name,
                    ct_status st, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const ct_config_origin o = (ct_config_origin)cfg->given[k];
  const int in_file = o == CT_ORIGIN_FILE;
  ct_config_problems_add(probs, 0, st ? st : CT_ERR_INVALID, o, in_file ? cfg->file : NULL,
                         in_file ? cfg->line[k] : 0, in_file ? cfg->col[k] : 0, name, NULL, "%s",
                         msg);
}

static int is(const char *s, const char *v) {
  return s && !strcmp(s, v);
}

/* A file the trainer reads later: it exists and is a file. */
static void want_file(const ct_config *cfg, ct_config_problems *probs, int k, const char *name,
                      const char *path) {
  struct stat sb;
  if (!path) return;
  if (stat(path, &sb))
    problem(cfg, probs, k, name, CT_ERR_NOT_FOUND, "%s '%s': no such file", name, path);
  else if (S_ISDIR(sb.st_mode))
    problem(cfg, probs, k, name, CT_ERR_INVALID, "%s '%s' is a directory, not a file", name, path);
}

/* A VAE's config.json, as the trainer reads it: its path for a directory or a
 * .safetensors file (ct_vae_from_pretrained's rule), the weights beside it. */
static void check_pretrained_vae(const ct_config *cfg, ct_config_problems *probs) {
  const char *d = cfg->pretrained_vae_model_name_or_path;
  char cp[4200], wp[4200];
  const size_t l = strlen(d);
  if (l > 12 && !strcmp(d + l - 12, ".safetensors")) {
    const char *slash = strrchr(d, '/');
    snprintf(cp, sizeof cp, "%.*sconfig.json", slash ? (int)(slash - d + 1) : 0, d);
    snprintf(wp, sizeof wp, "%s", d);
  } else {
    snprintf(cp, sizeof cp, "%s/config.json", d);
    snprintf(wp, sizeof wp, "%s/diffusion_pytorch_model.safetensors", d);
  }
  ct_vae_config vc;
  ct_err e = {0};
  if (ct_vae_config_load(cp, &vc, &e))
    problem(cfg, probs, CT_KEY_pretrained_vae_model_name_or_path,
            "pretrained_vae_model_name_or_path", e.status, "%s", e.msg);
  want_file(cfg, probs, CT_KEY_pretrained_vae_model_name_or_path,
            "pretrained_vae_model_name_or_path", wp);
}

/* A hub id that is no local path: its files are checked once `train`
 * has resolved it into the Hugging Face cache (ct_train_resolve_hub, then
 * ct_train_run checks again); `config check` prints where it stands
 * (ct_cli_hub_check) without downloading. */
static int hub_id(const char *v) {
  struct stat sb;
  return v && stat(v, &sb) != 0 && ct_hub_is_repo_id(v);
}

ct_status ct_train_check_files(const ct_config *cfg, ct_config_problems *probs) {
  const size_t before = probs->errors;
  ct_err e = {0};
  const int lora = is(cfg->model_type, "lora"), vae = is(cfg->model_type, "vae");
  const int remote = hub_id(cfg->pretrained_model_name_or_path) ||
                     hub_id(cfg->pretrained_transformer_model_name_or_path) ||
                     hub_id(cfg->pretrained_vae_model_name_or_path);
  const int sdxl = !vae && !remote && is(cfg->model_family, "sdxl");
  const int pipe = !vae && !remote && !sdxl && ct_flux_pipe_wanted(cfg);
  if (sdxl && cfg->pretrained_model_name_or_path) { /* a StableDiffusionXLPipeline directory */
    ct_sdxl_pipe *p = calloc(1, sizeof *p);
    if (!p) return CT_ERR_NOMEM;
    if (ct_sdxl_pipe_open(cfg->pretrained_model_name_or_path, p, &e))
      problem(cfg, probs, CT_KEY_pretrained_model_name_or_path, "pretrained_model_name_or_path",
              e.status, "%s", e.msg);
    else
      ct_sdxl_pipe_close(p);
    free(p);
  }
  if (pipe) { /* the pipeline directory: model_index.json, components, configs, widths */
    ct_flux_pipe *p = calloc(1, sizeof *p);
    if (!p) return CT_ERR_NOMEM;
    if (ct_flux_pipe_open(cfg, 0, p, &e))
      problem(cfg, probs,
              cfg->pretrained_model_name_or_path ? CT_KEY_pretrained_model_name_or_path
                                                 : CT_KEY_pretrained_transformer_model_name_or_path,
              cfg->pretrained_model_name_or_path ? "pretrained_model_name_or_path"
                                                 : "pretrained_transformer_model_name_or_path",
              e.status, "%s", e.msg);
    free(p);
  }
  if (lora && is(cfg->lora_type, "lycoris") && cfg->lycoris_config) {
    memset(&e, 0, sizeof e);
    if (ct_lycoris_check(cfg->lycoris_config, &e))
      problem(cfg, probs, CT_KEY_lycoris_config, "lycoris_config", e.status, "lycoris_config: %s",
              e.msg);
  }
  if (remote) {
    /* the models' files: after resolution (hub_id) */
  } else if (vae) {
    if (cfg->pretrained_vae_model_name_or_path) {
      check_pretrained_vae(cfg, probs);
    } else if (cfg->vae_config) {
      ct_vae_config vc;
      memset(&e, 0, sizeof e);
      if (ct_vae_config_load(cfg->vae_config, &vc, &e))
        problem(cfg, probs, CT_KEY_vae_config, "vae_config", e.status, "%s", e.msg);
      else if (vc.in_channels != 3 || vc.out_channels != 3) /* task_vae.c's open_task rule */
        problem(cfg, probs, CT_KEY_vae_config, "vae_config", CT_ERR_UNSUPPORTED,
                "model_type vae: in_channels %d, out_channels %d: training reads RGB images, so "
                "the VAE must have 3 of each",
                vc.in_channels, vc.out_channels);
    }
  } else if (!pipe) { /* ctuner's own MMDiT: the preset's geometry, the VAE codec's config */
    ct_geometry g;
    memset(&e, 0, sizeof e);
    if (cfg->codec && !strcmp(cfg->codec, "vae") && cfg->pretrained_vae_model_name_or_path)
      check_pretrained_vae(cfg, probs);
    else if (cfg->preset && ct_geometry_from_config(cfg, &g, &e))
      problem(cfg, probs, CT_KEY_preset, "preset", e.status, "%s", e.msg);
    if (is(cfg->text_encoder, "clip-bpe") && cfg->tokenizer_vocab && cfg->tokenizer_merges) {
      ct_bpe *bpe = NULL;
      memset(&e, 0, sizeof e);
      if (ct_bpe_load(cfg->tokenizer_vocab, cfg->tokenizer_merges, &bpe, &e))
        problem(cfg, probs, CT_KEY_tokenizer_vocab, "tokenizer_vocab", e.status, "%s", e.msg);
      ct_bpe_free(bpe);
    }
    want_file(cfg, probs, CT_KEY_pretrained_model_path, "pretrained_model_path",
              cfg->pretrained_model_path);
    want_file(cfg, probs, CT_KEY_text_encoder_path, "text_encoder_path", cfg->text_encoder_path);
  }
  if (lora) want_file(cfg, probs, CT_KEY_init_lora, "init_lora", cfg->init_lora);
  if (cfg->webhook_config) {
    memset(&e, 0, sizeof e);
    if (ct_health_check_webhooks(cfg->webhook_config, &e))
      problem(cfg, probs, CT_KEY_webhook_config, "webhook_config", e.status, "%s", e.msg);
  }
  return probs->errors > before ? CT_ERR_INVALID : CT_OK;
}

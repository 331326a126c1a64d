/* Opening a diffusers FluxPipeline directory for training (flux_pipe.h):
 * every check that needs no weights, all problems in one error. */
#include "train/flux_pipe.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/family.h"
#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/t5.h"
#include "ctuner/textenc.h"
#include "ctuner/vae.h"

typedef struct probs {
  char buf[8192];
  size_t len;
  int n;
} probs;

static void add(probs *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(probs *p, const char *fmt, ...) {
  p->n++;
  if (p->len + 8 >= sizeof p->buf) return;
  if (p->len) p->len += (size_t)snprintf(p->buf + p->len, sizeof p->buf - p->len, "; ");
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(p->buf + p->len, sizeof p->buf - p->len, fmt, ap);
  va_end(ap);
  if (k > 0) p->len += (size_t)k;
  if (p->len >= sizeof p->buf) p->len = sizeof p->buf - 1;
}

/* An error's message as a problem (err reset). */
static void add_err(probs *p, ct_err *e) {
  add(p, "%s", e->msg);
  memset(e, 0, sizeof *e);
}

static int is_dir(const char *p) {
  struct stat sb;
  return !stat(p, &sb) && S_ISDIR(sb.st_mode);
}
static int is_file(const char *p) {
  struct stat sb;
  return !stat(p, &sb) && S_ISREG(sb.st_mode);
}
static int file_in(const char *dir, const char *name) {
  char p[CT_FLUX_PATH + 128];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return is_file(p);
}

int ct_flux_pipe_wanted(const ct_config *cfg) {
  return cfg->pretrained_model_name_or_path || cfg->pretrained_transformer_model_name_or_path;
}

/* A path that is not there (hub ids are resolved before: ct_train_resolve_hub). */
static ct_status not_local(const char *key, const char *v, ct_err *err) {
  return ct_errf(err, CT_ERR_NOT_FOUND,
                 "%s '%s' is not a local directory (a hub id is read from the Hugging Face "
                 "cache, or downloaded, by ctuner train and sample: docs/hub.md; or fetch it "
                 "with huggingface-cli download %s --local-dir X and pass X)",
                 key, v, v);
}

/* The components FluxPipeline's model_index.json names, with the classes
 * ctuner reads: the flux row of the family registry (ctuner/family.h). */
static const ct_family *flux_family(void) {
  return ct_family_find("flux");
}

/* A component replaced from elsewhere (the denoiser, the VAE): not checked. */
static int skipped(const ct_family *f, const char *name, int skip_denoiser, int skip_vae) {
  return (skip_denoiser && !strcmp(name, f->denoiser)) || (skip_vae && !strcmp(name, "vae"));
}

/* model_index.json: the pipeline class and each component's [library, class]. */
static void check_index(const char *root, int skip_transformer, int skip_vae, probs *pr) {
  char path[CT_FLUX_PATH + 64];
  snprintf(path, sizeof path, "%s/model_index.json", root);
  ct_json *j = NULL;
  ct_err e = {0};
  if (!is_file(path)) {
    add(pr, "%s: missing (not a diffusers pipeline directory)", path);
    return;
  }
  if (ct_json_parse_file(path, 1 << 20, &j, &e)) {
    add_err(pr, &e);
    return;
  }
  const ct_family *f = flux_family();
  const ct_family_component *comp = f->components;
  const int ncomp = f->ncomponents;
  const ct_json *c = ct_json_get(j, "_class_name");
  if (!c || c->type != CT_JSON_STRING ||
      (strcmp(c->str, f->pipeline_class) &&
       !(f->reference_pipeline_class && !strcmp(c->str, f->reference_pipeline_class))))
    add(pr, "%s: _class_name is %s; ctuner reads %s%s%s", path,
        c && c->type == CT_JSON_STRING ? c->str : "(missing)", f->pipeline_class,
        f->reference_pipeline_class ? " or " : "",
        f->reference_pipeline_class ? f->reference_pipeline_class : "");
  for (size_t i = 0; j->type == CT_JSON_OBJECT && i < j->n; i++) {
    const char *k = j->keys[i];
    if (k[0] == '_') continue;
    const ct_json *v = &j->items[i];
    const char *cls = v->type == CT_JSON_ARRAY && v->n == 2 && v->items[1].type == CT_JSON_STRING
                          ? v->items[1].str
                          : NULL;
    int known = -1;
    for (int m = 0; m < ncomp; m++)
      if (!strcmp(comp[m].name, k)) known = m;
    if (known < 0) {
      if (cls) add(pr, "%s: component %s (%s) is not part of what ctuner trains", path, k, cls);
      continue;
    }
    if (skipped(f, comp[known].name, skip_transformer, skip_vae)) continue;
    if (!cls || !ct_family_in_list(comp[known].cls, cls))
      add(pr, "%s: %s is %s; ctuner reads %s", path, k, cls ? cls : "null", comp[known].cls);
  }
  for (int m = 0; m < ncomp; m++)
    if (!ct_json_get(j, comp[m].name) && !skipped(f, comp[m].name, skip_transformer, skip_vae))
      add(pr, "%s: no %s entry", path, comp[m].name);
  ct_json_free(j);
}

/* scheduler/scheduler_config.json (fm_sched.c reads it, every problem listed). */
static void read_scheduler(ct_flux_pipe *p, probs *pr) {
  char path[CT_FLUX_PATH + 64];
  ct_err e = {0};
  snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", p->root);
  ct_fm_sched_config_default(&p->sched);
  if (!is_file(path))
    add(pr, "%s: missing", path);
  else if (ct_fm_sched_config_read(path, &p->sched, &e))
    add_err(pr, &e);
}

/* The transformer: the pipeline's, or SimpleTuner's override (a directory
 * with pretrained_transformer_subfolder, or a BFL .safetensors file). */
static void find_transformer(const ct_config *cfg, ct_flux_pipe *p, probs *pr) {
  const char *o = cfg->pretrained_transformer_model_name_or_path;
  ct_err e = {0};
  if (!o) {
    snprintf(p->transformer, sizeof p->transformer, "%s/transformer", p->root);
  } else if (is_file(o)) {
    snprintf(p->transformer, sizeof p->transformer, "%s", o);
    p->transformer_bfl = 1;
    /* the RoPE split shows in no shape: the pipeline's own transformer config
     * gives it when there is one, else FLUX.1's (head size 128) */
    char cp[CT_FLUX_PATH + 64];
    ct_mmdit_config rc;
    snprintf(cp, sizeof cp, "%s/transformer/config.json", p->root);
    const int has = is_file(cp) && !ct_flux_config_read(cp, &rc, &e);
    memset(&e, 0, sizeof e);
    if (ct_flux_bfl_config(o, has ? rc.axes_dim : NULL, &p->tcfg, p->bfl_prefix,
                           sizeof p->bfl_prefix, &e))
      add_err(pr, &e);
    return;
  } else if (!is_dir(o)) {
    ct_err ne = {0};
    not_local("pretrained_transformer_model_name_or_path", o, &ne);
    add_err(pr, &ne);
    return;
  } else {
    const char *sub = cfg->pretrained_transformer_subfolder;
    if (!sub || !*sub || !strcmp(sub, "none"))
      snprintf(p->transformer, sizeof p->transformer, "%s", o);
    else
      snprintf(p->transformer, sizeof p->transformer, "%s/%s", o, sub);
  }
  char cp[CT_FLUX_PATH + 64];
  snprintf(cp, sizeof cp, "%s/config.json", p->transformer);
  if (!is_dir(p->transformer)) {
    add(pr, "%s: missing (the transformer)", p->transformer);
  } else if (!is_file(cp)) {
    add(pr, "%s: missing", cp);
  } else if (ct_flux_config_read(cp, &p->tcfg, &e)) {
    add_err(pr, &e);
  } else if (!file_in(p->transformer, "diffusion_pytorch_model.safetensors") &&
             !file_in(p->transformer, "diffusion_pytorch_model.safetensors.index.json")) {
    add(pr,
        "%s: no diffusion_pytorch_model.safetensors (or its sharded index): ctuner reads "
        "safetensors only",
        p->transformer);
  } else if (ct_flux_check_diffusers(&p->tcfg, p->transformer, &e)) {
    add_err(pr, &e);
  }
}

/* The text encoders, tokenizers and VAE: files present, configs read. */
static void find_parts(const ct_config *cfg, ct_flux_pipe *p, probs *pr) {
  ct_err e = {0};
  snprintf(p->text_encoder, sizeof p->text_encoder, "%s/text_encoder", p->root);
  snprintf(p->tokenizer, sizeof p->tokenizer, "%s/tokenizer", p->root);
  snprintf(p->text_encoder_2, sizeof p->text_encoder_2, "%s/text_encoder_2", p->root);
  snprintf(p->tokenizer_2, sizeof p->tokenizer_2, "%s/tokenizer_2", p->root);
  const char *v = cfg->pretrained_vae_model_name_or_path;
  if (!v) {
    snprintf(p->vae, sizeof p->vae, "%s/vae", p->root);
  } else { /* a VAE directory, or a pipeline holding one in vae/ */
    char sub[CT_FLUX_PATH + 64];
    snprintf(sub, sizeof sub, "%s/vae/config.json", v);
    snprintf(p->vae, sizeof p->vae, is_file(sub) ? "%s/vae" : "%s", v);
    if (!is_dir(v) && !is_file(v)) {
      ct_err ne = {0};
      not_local("pretrained_vae_model_name_or_path", v, &ne);
      add_err(pr, &ne);
      return;
    }
  }
  const char *const dirs[] = {p->text_encoder, p->tokenizer, p->text_encoder_2, p->tokenizer_2,
                              p->vae};
  for (size_t i = 0; i < 5; i++)
    if (!is_dir(dirs[i]) && !(i == 4 && is_file(dirs[i]))) add(pr, "%s: missing", dirs[i]);
  if (is_dir(p->text_encoder)) {
    if (!file_in(p->text_encoder, "model.safetensors"))
      add(pr, "%s: no model.safetensors", p->text_encoder);
    char cp[CT_FLUX_PATH + 64];
    ct_textenc_config tc;
    snprintf(cp, sizeof cp, "%s/config.json", p->text_encoder);
    if (ct_textenc_config_read(cp, &tc, &e))
      add_err(pr, &e);
    else
      p->clip_d = tc.hidden;
  }
  if (is_dir(p->tokenizer) && !file_in(p->tokenizer, "tokenizer.json")) {
    /* vocab.json + merges.txt (FLUX.1's repositories), else tokenizer.json alone
     * (transformers 5's save_pretrained) */
    if (!file_in(p->tokenizer, "vocab.json"))
      add(pr, "%s: no vocab.json (nor tokenizer.json)", p->tokenizer);
    if (!file_in(p->tokenizer, "merges.txt"))
      add(pr, "%s: no merges.txt (nor tokenizer.json)", p->tokenizer);
  }
  if (is_dir(p->text_encoder_2)) {
    char cp[CT_FLUX_PATH + 64];
    ct_t5_config tc;
    snprintf(cp, sizeof cp, "%s/config.json", p->text_encoder_2);
    if (!file_in(p->text_encoder_2, "model.safetensors") &&
        !file_in(p->text_encoder_2, "model.safetensors.index.json"))
      add(pr, "%s: no model.safetensors (or its sharded index)", p->text_encoder_2);
    if (ct_t5_config_read(cp, &tc, &e))
      add_err(pr, &e);
    else
      p->t5_d = tc.d_model;
  }
  if (is_dir(p->tokenizer_2) && !file_in(p->tokenizer_2, "tokenizer.json") &&
      !file_in(p->tokenizer_2, "spiece.model"))
    add(pr, "%s: no tokenizer.json or spiece.model", p->tokenizer_2);
  if (is_dir(p->vae)) {
    char cp[CT_FLUX_PATH + 64];
    ct_vae_config vc;
    snprintf(cp, sizeof cp, "%s/config.json", p->vae);
    if (!file_in(p->vae, "diffusion_pytorch_model.safetensors"))
      add(pr, "%s: no diffusion_pytorch_model.safetensors", p->vae);
    if (ct_vae_config_load(cp, &vc, &e)) {
      add_err(pr, &e);
    } else {
      p->vae_factor = ct_vae_factor(&vc);
      p->vae_ch = vc.latent_channels;
    }
  }
}

/* Keys of ctuner's own model path that a pipeline replaces. */
static void check_keys(const ct_config *cfg, probs *pr) {
  static const struct {
    int key;
    const char *name;
  } K[] = {{CT_KEY_preset, "preset"},
           {CT_KEY_pretrained_model_path, "pretrained_model_path"},
           {CT_KEY_text_encoder, "text_encoder"},
           {CT_KEY_text_encoder_path, "text_encoder_path"},
           {CT_KEY_text_encoder_layers, "text_encoder_layers"},
           {CT_KEY_tokenizer_vocab, "tokenizer_vocab"},
           {CT_KEY_tokenizer_merges, "tokenizer_merges"},
           {CT_KEY_codec_scale, "codec_scale"}};
  for (size_t i = 0; i < sizeof K / sizeof K[0]; i++)
    if (cfg->given[K[i].key])
      add(pr,
          "%s does not go with a FLUX.1 pipeline (its transformer, text encoders and VAE are "
          "the pipeline's); remove it",
          K[i].name);
  if (cfg->given[CT_KEY_codec] && strcmp(cfg->codec, "vae"))
    add(pr, "codec %s does not go with a FLUX.1 pipeline (its VAE encodes the latents)",
        cfg->codec);
  if (!cfg->pretrained_model_name_or_path)
    add(pr,
        "pretrained_transformer_model_name_or_path needs pretrained_model_name_or_path: the "
        "pipeline the text encoders, tokenizers, VAE and scheduler come from");
}

/* Widths that must fit each other. */
static void check_widths(const ct_flux_pipe *p, probs *pr) {
  const ct_mmdit_config *c = &p->tcfg;
  if (!c->hidden) return; /* the transformer config already failed */
  if (p->t5_d && c->context_in_dim != p->t5_d)
    add(pr, "the transformer's joint_attention_dim %d != text_encoder_2's d_model %d",
        c->context_in_dim, p->t5_d);
  if (p->clip_d && c->vec_in_dim != p->clip_d)
    add(pr, "the transformer's pooled_projection_dim %d != text_encoder's hidden_size %d",
        c->vec_in_dim, p->clip_d);
  if (p->vae_ch && c->in_channels != p->vae_ch)
    add(pr, "the transformer's in_channels %d (packed 2x2) != 4 x the VAE's latent_channels %d",
        4 * c->in_channels, p->vae_ch);
}

ct_status ct_flux_pipe_open(const ct_config *cfg, int lead, ct_flux_pipe *p, ct_err *err) {
  memset(p, 0, sizeof *p);
  probs *pr = calloc(1, sizeof *pr);
  if (!pr) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  const char *root = cfg->pretrained_model_name_or_path;
  ct_status st = CT_OK;
  if (root && !is_dir(root)) {
    free(pr);
    if (is_file(root))
      return ct_errf(err, CT_ERR_INVALID,
                     "pretrained_model_name_or_path '%s' is a file; it is a FluxPipeline "
                     "directory (a BFL .safetensors file goes to "
                     "pretrained_transformer_model_name_or_path)",
                     root);
    return not_local("pretrained_model_name_or_path", root, err);
  }
  check_keys(cfg, pr);
  if (root) {
    snprintf(p->root, sizeof p->root, "%s", root);
    check_index(root, cfg->pretrained_transformer_model_name_or_path != NULL,
                cfg->pretrained_vae_model_name_or_path != NULL, pr);
    find_transformer(cfg, p, pr);
    find_parts(cfg, p, pr);
    read_scheduler(p, pr);
    check_widths(p, pr);
  }
  p->schnell = cfg->model_flavour && !strcmp(cfg->model_flavour, "schnell");
  p->max_sequence_length = p->schnell ? 256 : 512; /* SimpleTuner's Flux check_user_config */
  snprintf(p->clip_precision, sizeof p->clip_precision, "%s",
           cfg->text_encoder_1_precision ? cfg->text_encoder_1_precision : "no_change");
  snprintf(p->t5_precision, sizeof p->t5_precision, "%s",
           cfg->text_encoder_2_precision ? cfg->text_encoder_2_precision : "no_change");
  if (cfg->flux_guidance_mode && !strcmp(cfg->flux_guidance_mode, "random-range") &&
      cfg->flux_guidance_min > cfg->flux_guidance_max)
    add(pr, "flux_guidance_min %g > flux_guidance_max %g", cfg->flux_guidance_min,
        cfg->flux_guidance_max);
  if (pr->n) {
    st = ct_errf(err, CT_ERR_INVALID, "FLUX.1 pipeline %s: %d problem%s: %s",
                 root ? root : "(none)", pr->n, pr->n > 1 ? "s" : "", pr->buf);
  } else if (lead) {
    if (cfg->given[CT_KEY_tokenizer_max_length])
      CT_WARN(
          "tokenizer_max_length %ld is ignored: FLUX.1 uses %d T5 tokens (model_flavour %s), "
          "as SimpleTuner fixes it",
          cfg->tokenizer_max_length, p->max_sequence_length,
          cfg->model_flavour ? cfg->model_flavour : "unset");
    if (p->schnell && p->tcfg.guidance_embed)
      CT_WARN("model_flavour schnell, but the transformer has guidance_embeds (a dev model?)");
    if (!p->schnell && !p->tcfg.guidance_embed)
      CT_WARN(
          "model_flavour %s, but the transformer has no guidance_embeds (a schnell model? set "
          "model_flavour schnell for its 256 T5 tokens)",
          cfg->model_flavour ? cfg->model_flavour : "unset (dev)");
    if (cfg->aspect_bucket_alignment != 64)
      CT_WARN(
          "aspect_bucket_alignment %ld kept (SimpleTuner forces 64 for Flux; multiples of %d "
          "suffice here: the VAE factor x the 2x2 packing)",
          cfg->aspect_bucket_alignment, 2 * (p->vae_factor ? p->vae_factor : 8));
    if (p->schnell)
      CT_WARN(
          "model_flavour schnell trains with the ordinary flow-matching schedule "
          "(SimpleTuner asks for its flux_fast_schedule, which ctuner does not implement)");
  }
  free(pr);
  return st;
}

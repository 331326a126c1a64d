/* `ctuner bench memory --plan`: the bytes per rank of a training run computed
 * from the parameter table, without allocating the model or training
 * (ct_memplan_trainable, ct_mmdit_activation_plan), plus the frozen parts of a
 * FLUX.1 pipeline in their stored dtype (safetensors headers, or FLUX.1-dev's
 * known shapes). docs/performance.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "ctuner/config.h"
#include "ctuner/family.h"
#include "ctuner/json.h"
#include "ctuner/lora.h"
#include "ctuner/mmdit.h"
#include "ctuner/safetensors.h"
#include "ctuner/train.h"
#include "ctuner/vae.h"

#define MB (1024.0 * 1024.0)

typedef struct frozen {
  const char *name, *cls;
  double params, bytes;
  char dtype[16];
  int present;
} frozen;

/* FLUX.1-dev's frozen parts as black-forest-labs/FLUX.1-dev stores them (bf16):
 * T5 v1.1 XXL encoder (vocab 32128, d_model 4096, 24 layers, 64 heads x 64,
 * d_ff 10240), CLIP ViT-L/14 text model (vocab 49408, 768 wide, 12 layers,
 * MLP 3072, 77 positions), the 16-channel AutoencoderKL (128,256,512,512). */
static void flux_dev_frozen(frozen f[3]) {
  const double d = 4096, ff = 10240, L = 24;
  const double t5 = 32128 * d + L * (4 * d * d + 3 * d * ff + 2 * d) + d + 32 * 64;
  const double c = 768, cm = 3072;
  const double clip =
      49408 * c + 77 * c + 12 * (4 * (c * c + c) + 4 * c + c * cm + cm + cm * c + c) + 2 * c;
  f[0] = (frozen){"text_encoder_2", "T5EncoderModel", t5, 2 * t5, "BF16", 1};
  f[1] = (frozen){"text_encoder", "CLIPTextModel", clip, 2 * clip, "BF16", 1};
  f[2] = (frozen){"vae", "AutoencoderKL", 83819683, 2 * 83819683.0, "BF16", 1};
}

/* Adds one safetensors file's tensors (header only: the file is mapped, not read). */
static int add_file(frozen *f, const char *path) {
  ct_err err = {0};
  ct_st_file *st = NULL;
  if (ct_st_open(path, &st, &err)) {
    fprintf(stderr, "ctuner bench memory: %s\n", err.msg);
    return 1;
  }
  for (size_t i = 0; i < st->ntensors; i++) {
    const ct_st_tensor *t = &st->tensors[i];
    const char *dn = ct_dtype_name(t->dtype);
    f->params += (double)t->numel;
    f->bytes += (double)(t->end - t->begin);
    if (!f->dtype[0])
      snprintf(f->dtype, sizeof f->dtype, "%s", dn);
    else if (strcmp(f->dtype, dn))
      snprintf(f->dtype, sizeof f->dtype, "mixed");
  }
  ct_st_close(st);
  return 0;
}

static int exists(const char *p) {
  struct stat s;
  return stat(p, &s) == 0;
}

/* A component directory of a pipeline: the shards of its index, else its one
 * weights file (transformers' model.safetensors or diffusers'
 * diffusion_pytorch_model.safetensors). Absent directory: not present. */
static int read_component(const char *dir, frozen *f) {
  static const char *const base[] = {"model", "diffusion_pytorch_model"};
  char p[4600];
  if (!exists(dir)) return 0;
  f->present = 1;
  for (int b = 0; b < 2; b++) {
    snprintf(p, sizeof p, "%s/%s.safetensors.index.json", dir, base[b]);
    if (!exists(p)) continue;
    ct_err err = {0};
    ct_json *j = NULL;
    if (ct_json_parse_file(p, 64u << 20, &j, &err)) {
      fprintf(stderr, "ctuner bench memory: %s\n", err.msg);
      return 1;
    }
    const ct_json *wm = ct_json_get(j, "weight_map");
    int rc = wm && wm->type == CT_JSON_OBJECT ? 0 : 1;
    if (rc) fprintf(stderr, "ctuner bench memory: %s: no weight_map object\n", p);
    for (size_t i = 0; !rc && i < wm->n; i++) { /* each shard once */
      int seen = 0;
      for (size_t k = 0; k < i && !seen; k++) seen = !strcmp(wm->items[k].str, wm->items[i].str);
      if (seen || wm->items[i].type != CT_JSON_STRING) continue;
      snprintf(p, sizeof p, "%s/%s", dir, wm->items[i].str);
      rc = add_file(f, p);
    }
    ct_json_free(j);
    return rc;
  }
  for (int b = 0; b < 2; b++) {
    snprintf(p, sizeof p, "%s/%s.safetensors", dir, base[b]);
    if (exists(p)) return add_file(f, p);
  }
  fprintf(stderr,
          "ctuner bench memory: %s has no model.safetensors or "
          "diffusion_pytorch_model.safetensors (or their index)\n",
          dir);
  return 1;
}

typedef struct plan_args {
  const char *preset, *pretrained, *mp, *offopt, *offpar, *mtype, *ltarget;
  long stage, ranks, ckpt, batch, res, tokens, offbuf, ema, lrank;
  /* model_type lora: the base's storage (docs/lora.md), the adapters' dropout */
  const char *lprec, *lddt, *ldrop;
  const char *family, *flavour; /* model_family (flux), model_flavour (NULL: the default) */
} plan_args;

static int parse(int argc, char **argv, plan_args *a) {
  const char *v;
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--plan")) continue;
    if (!strcmp(argv[i], "--use_ema")) {
      a->ema = 1;
    } else if ((r = ct_cli_opt(argc, argv, &i, "preset", &a->preset)) ||
               (r = ct_cli_opt(argc, argv, &i, "pretrained", &a->pretrained)) ||
               (r = ct_cli_opt(argc, argv, &i, "mixed_precision", &a->mp)) ||
               (r = ct_cli_opt(argc, argv, &i, "offload_optimizer", &a->offopt)) ||
               (r = ct_cli_opt(argc, argv, &i, "offload_param", &a->offpar)) ||
               (r = ct_cli_opt(argc, argv, &i, "model_type", &a->mtype)) ||
               (r = ct_cli_opt(argc, argv, &i, "flux_lora_target", &a->ltarget)) ||
               (r = ct_cli_opt(argc, argv, &i, "base_model_precision", &a->lprec)) ||
               (r = ct_cli_opt(argc, argv, &i, "base_model_default_dtype", &a->lddt)) ||
               (r = ct_cli_opt(argc, argv, &i, "lora_dropout", &a->ldrop)) ||
               (r = ct_cli_opt(argc, argv, &i, "model_family", &a->family)) ||
               (r = ct_cli_opt(argc, argv, &i, "model_flavour", &a->flavour))) {
      if (r < 0) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "lora_rank", &v))) {
      if (r < 0 || ct_cli_int("lora_rank", v, 1, 1 << 16, &a->lrank)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "stage", &v))) {
      if (r < 0 || ct_cli_int("stage", v, 0, 3, &a->stage)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "ranks", &v))) {
      if (r < 0 || ct_cli_int("ranks", v, 1, 1 << 20, &a->ranks)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "gradient_checkpointing", &v))) {
      if (r < 0 || ct_cli_int("gradient_checkpointing", v, 0, 1000, &a->ckpt)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "batch", &v))) {
      if (r < 0 || ct_cli_int("batch", v, 1, 1 << 16, &a->batch)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "resolution", &v))) {
      if (r < 0 || ct_cli_int("resolution", v, 1, 1 << 16, &a->res)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "tokens", &v))) {
      if (r < 0 || ct_cli_int("tokens", v, 1, 1 << 16, &a->tokens)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "offload_buffer_size", &v))) {
      if (r < 0 || ct_cli_int("offload_buffer_size", v, 0, 1L << 40, &a->offbuf)) return 2;
    } else {
      fprintf(stderr, "ctuner bench memory --plan: unknown option '%s'\n", argv[i]);
      ct_cmd_bench_memory_help(stderr);
      return 2;
    }
  }
  const char *offs[2] = {a->offopt, a->offpar}, *names[2] = {"offload_optimizer", "offload_param"};
  for (int k = 0; k < 2; k++)
    if (strcmp(offs[k], "none") && strcmp(offs[k], "cpu") && strcmp(offs[k], "nvme")) {
      fprintf(stderr, "ctuner bench memory: --%s %s: use none, cpu or nvme\n", names[k], offs[k]);
      return 2;
    }
  if (strcmp(a->mp, "no") && strcmp(a->mp, "bf16")) {
    fprintf(stderr, "ctuner bench memory: --mixed_precision %s: use no or bf16\n", a->mp);
    return 2;
  }
  if (strcmp(a->mtype, "full") && strcmp(a->mtype, "lora")) {
    fprintf(stderr, "ctuner bench memory: --model_type %s: use full or lora\n", a->mtype);
    return 2;
  }
  return 0;
}

/* Rows of the batch that an adapter on MMDiT weight `base` sees (mmdit.c's
 * calls of ct_lora_fwd/bwd): the image or text tokens, the joint rows of the
 * single blocks, one row per sample for the embeddings of t/y and the
 * modulations. */
static size_t lora_rows(const char *base, size_t B, size_t Li, size_t T) {
  if (strstr(base, "mod.") || strstr(base, "modulation") || strstr(base, "adaLN") ||
      !strncmp(base, "time_in", 7) || !strncmp(base, "vector_in", 9) ||
      !strncmp(base, "guidance_in", 11))
    return B;
  if (!strncmp(base, "single_blocks.", 14)) return B * (Li + T);
  if (strstr(base, ".txt_") || !strncmp(base, "txt_in", 6)) return B * T;
  return B * Li; /* img stream, img_in, final_layer.linear */
}

/* model_type lora: the adapters as the trainable model (numel, Ψ, largest
 * segment) and lora.c's scratch (category activations: the largest of
 * rows x rank x 2, plus rows x in x 2 for the dropout masks, lora_dropout 0.1),
 * without allocating them. */
static int lora_plan(const plan_args *a, const ct_mmdit_config *mc, ct_memplan_opts *o, int B,
                     int Li, int T, double *scratch) {
  ct_err err = {0};
  ct_lora *l = NULL;
  const char *const *tg = ct_lora_preset(a->ltarget);
  if (!tg) {
    fprintf(stderr, "ctuner bench memory: --flux_lora_target %s: use one of %s\n", a->ltarget,
            ct_lora_preset_names());
    return 2;
  }
  const double drop = atof(a->ldrop);
  const ct_lora_opts lo = {(int)a->lrank, (double)a->lrank, drop, 0, 0}; /* standard LoRA */
  if (ct_lora_new(mc, tg, &lo, CT_LORA_NO_PARAMS, &l, &err)) {
    fprintf(stderr, "ctuner bench memory: flux_lora_target %s: %s\n", a->ltarget, err.msg);
    return 2;
  }
  size_t nad;
  const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
  o->numel = ct_lora_numel(l);
  o->psi = o->maxseg = 0;
  *scratch = 0;
  for (size_t i = 0; i < nad; i++) {
    o->psi += (size_t)a->lrank * (size_t)(ad[i].in + ad[i].out);
    const double rows = (double)lora_rows(ad[i].base, (size_t)B, (size_t)Li, (size_t)T);
    const double n = rows * (double)a->lrank * 2 + (drop > 0 ? rows * ad[i].in * 2 : 0);
    if (4 * n > *scratch) *scratch = 4 * n;
  }
  for (int k = 0; k < ct_lora_nsegments(l); k++) {
    size_t off, n;
    ct_lora_segment(l, k, &off, &n);
    if (n > o->maxseg) o->maxseg = n;
  }
  ct_lora_free(l);
  return 0;
}

/* A FluxKontextPipeline directory: its training runs carry reference tokens
 * the plan does not count; said once (docs/kontext.md). */
static void warn_kontext(const char *dir) {
  char p[4400];
  snprintf(p, sizeof p, "%s/model_index.json", dir);
  ct_json *j = NULL;
  ct_err err = {0};
  if (ct_json_parse_file(p, 1u << 20, &j, &err)) return;
  const ct_json *c = ct_json_get(j, "_class_name");
  if (c && c->type == CT_JSON_STRING && !strcmp(c->str, "FluxKontextPipeline"))
    fprintf(stderr,
            "ctuner bench memory: warning: %s is a FluxKontextPipeline; the plan counts the "
            "target's image tokens only, not the reference tokens a model_flavour kontext run "
            "adds (as many again for a reference of the target's size): not planned yet\n",
            dir);
  ct_json_free(j);
}

/* The trainable model (cfg), the codec factor, default tokens, frozen parts. */
static int model_of(const plan_args *a, ct_mmdit_config *mc, int *s, int *T, long *res,
                    frozen fz[3]) {
  ct_err err = {0};
  memset(fz, 0, 3 * sizeof *fz);
  if (a->pretrained) { /* a FLUX.1 pipeline directory (or its transformer/) */
    char p[4400];
    warn_kontext(a->pretrained);
    snprintf(p, sizeof p, "%s/transformer/config.json", a->pretrained);
    if (!exists(p)) snprintf(p, sizeof p, "%s/config.json", a->pretrained);
    if (ct_flux_config_read(p, mc, &err)) {
      fprintf(stderr, "ctuner bench memory: %s\n", err.msg);
      return 1;
    }
    static const char *const comp[3][2] = {{"text_encoder_2", "T5EncoderModel"},
                                           {"text_encoder", "CLIPTextModel"},
                                           {"vae", "AutoencoderKL"}};
    for (int k = 0; k < 3; k++) {
      fz[k].name = comp[k][0];
      fz[k].cls = comp[k][1];
      snprintf(p, sizeof p, "%s/%s", a->pretrained, comp[k][0]);
      if (read_component(p, &fz[k])) return 1;
    }
    *s = 8;
    *res = 1024;
    snprintf(p, sizeof p, "%s/vae/config.json", a->pretrained);
    ct_vae_config vc;
    if (exists(p)) {
      ct_json *j = NULL;
      if (ct_vae_config_load(p, &vc, &err) || ct_json_parse_file(p, 1u << 20, &j, &err)) {
        fprintf(stderr, "ctuner bench memory: %s\n", err.msg);
        return 1;
      }
      *s = ct_vae_factor(&vc);
      const ct_json *ss = ct_json_get(j, "sample_size"); /* the VAE's image size */
      if (ss && ss->type == CT_JSON_NUMBER && ss->num >= 1) *res = (long)ss->num;
      ct_json_free(j);
    }
    *T = 512;
    return 0;
  }
  const ct_mmdit_preset *pr = ct_mmdit_preset_find(a->preset);
  if (!pr) {
    fprintf(stderr, "ctuner bench memory: unknown preset '%s'; presets: %s\n", a->preset,
            ct_mmdit_preset_names());
    return 2;
  }
  if (!pr->batch) { /* flux-dev: FLUX.1-dev's transformer, T5/CLIP/VAE, 8x VAE, 512 tokens */
    *mc = pr->cfg;
    flux_dev_frozen(fz);
    *s = 8;
    *res = 1024;
    *T = 512;
    return 0;
  }
  ct_config cfg; /* a trainable preset: the model `ctuner train` builds (pixel codec) */
  ct_config_defaults(&cfg);
  int rc =
      ct_config_set(&cfg, "preset", a->preset, &err) || ct_train_model_config(&cfg, mc, s, T, &err);
  ct_config_free(&cfg);
  if (rc) fprintf(stderr, "ctuner bench memory: %s\n", err.msg);
  return rc;
}

static void print_frozen(const frozen fz[3], double *total) {
  printf(", \"frozen\": [");
  int first = 1;
  *total = 0;
  for (int k = 0; k < 3; k++) {
    if (!fz[k].present) continue;
    printf(
        "%s{\"name\": \"%s\", \"class\": \"%s\", \"params\": %.0f, \"dtype\": \"%s\", "
        "\"mb\": %.2f, \"f32_mb\": %.2f}",
        first ? "" : ", ", fz[k].name, fz[k].cls, fz[k].params, fz[k].dtype, fz[k].bytes / MB,
        4 * fz[k].params / MB);
    *total += fz[k].bytes;
    first = 0;
  }
  double f32 = 0;
  for (int k = 0; k < 3; k++) f32 += fz[k].present ? 4 * fz[k].params : 0;
  /* ctuner's T5, CLIP and VAE loaders widen the weights to float32 today */
  printf("], \"frozen_mb\": %.2f, \"frozen_f32_mb\": %.2f", *total / MB, f32 / MB);
}

/* SDXL 1.0 base's frozen parts as stabilityai/stable-diffusion-xl-base-1.0
 * stores them (float32): CLIP ViT-L/14's text model (123,060,480), OpenCLIP
 * bigG's text model with its projection (1280 wide, 32 layers, MLP 5120, +
 * 1280 x 1280: 694,659,840), the 4-channel AutoencoderKL (83,653,863). */
static void sdxl_base_frozen(frozen f[3]) {
  const double c = 1280, cm = 5120;
  const double clip_g = 49408 * c + 77 * c +
                        32 * (4 * (c * c + c) + 4 * c + c * cm + cm + cm * c + c) + 2 * c + c * c;
  f[0] = (frozen){"text_encoder", "CLIPTextModel", 123060480, 4 * 123060480.0, "F32", 1};
  f[1] = (frozen){"text_encoder_2", "CLIPTextModelWithProjection", clip_g, 4 * clip_g, "F32", 1};
  f[2] = (frozen){"vae", "AutoencoderKL", 83653863, 4 * 83653863.0, "F32", 1};
}

/* What `ctuner train --model_family sdxl` cannot do yet of a's configuration
 * (task_sdxl.c's refusals), "; "-separated into buf; 0 when it trains. */
static int sdxl_not_yet(const plan_args *a, char *buf, size_t n) {
  int k = 0;
  buf[0] = 0;
  if (a->stage >= 2)
    k += snprintf(buf + k, n - (size_t)k,
                  "%szero_stage %ld (ZeRO-2/3 shard inside the backward through segment hooks "
                  "the U-net does not have yet; zero_stage 0 or 1 train)",
                  k ? "; " : "", a->stage);
  if (!strcmp(a->mp, "bf16") && k < (int)n)
    k += snprintf(buf + k, n - (size_t)k, "%smixed_precision bf16 (float32 only)", k ? "; " : "");
  if (strcmp(a->offpar, "none") && k < (int)n)
    k += snprintf(buf + k, n - (size_t)k, "%soffload_param %s (needs zero_stage 3)", k ? "; " : "",
                  a->offpar);
  return k > 0;
}

/* The frozen parts of a pipeline directory (their safetensors headers), else
 * SDXL 1.0 base's. */
static int sdxl_frozen(const plan_args *a, frozen fz[3]) {
  static const char *const comp[3][2] = {{"text_encoder", "CLIPTextModel"},
                                         {"text_encoder_2", "CLIPTextModelWithProjection"},
                                         {"vae", "AutoencoderKL"}};
  memset(fz, 0, 3 * sizeof *fz);
  if (!a->pretrained) {
    sdxl_base_frozen(fz);
    return 0;
  }
  for (int k = 0; k < 3; k++) {
    char p[4400];
    fz[k].name = comp[k][0];
    fz[k].cls = comp[k][1];
    snprintf(p, sizeof p, "%s/%s", a->pretrained, comp[k][0]);
    if (read_component(p, &fz[k])) return 1;
  }
  return 0;
}

/* The trainable part of a family's plan (ct_train_plan_denoiser): the config
 * the row's hook reads, the denoiser, ZeRO's split of it. */
static int family_denoiser(const plan_args *a, ct_plan_denoiser *d, ct_memplan_opts *o,
                           ct_memplan *p) {
  ct_err err = {0};
  ct_config cfg;
  ct_config_defaults(&cfg);
  ct_status st = ct_config_set(&cfg, "model_family", a->family, &err);
  if (!st && a->flavour) st = ct_config_set(&cfg, "model_flavour", a->flavour, &err);
  if (!st && a->pretrained)
    st = ct_config_set(&cfg, "pretrained_model_name_or_path", a->pretrained, &err);
  if (!st)
    st = ct_train_plan_denoiser(&cfg, (int)a->batch, a->res, (int)a->tokens, (int)a->ckpt, d, &err);
  ct_config_free(&cfg);
  if (!st) {
    *o = (ct_memplan_opts){d->numel,
                           d->psi,
                           (int)a->ranks,
                           (int)a->stage,
                           !strcmp(a->mp, "bf16"),
                           2, /* AdamW */
                           (int)a->ema,
                           !strcmp(a->offopt, "nvme"),
                           !strcmp(a->offpar, "nvme"),
                           (size_t)a->offbuf,
                           d->maxseg,
                           0, /* reduce_bucket_size: the default, hidden^2 */
                           d->hidden,
                           0,
                           0,
                           0};
    st = ct_memplan_trainable(o, p, &err);
  }
  if (st) fprintf(stderr, "ctuner bench memory: %s\n", err.msg);
  return st ? 2 : 0;
}

/* `--plan --model_family sdxl` (a family other than FLUX.1): the U-net's
 * full fine-tune by category as FLUX.1's, plus the bytes per rank a GPU would
 * hold (device) and the host's (the optimizer category under
 * offload_optimizer), and whether this build trains the configuration. */
static int family_plan(const plan_args *a) {
  if (strcmp(a->family, "sdxl")) {
    ct_err err = {0};
    fprintf(stderr, "ctuner bench memory: --model_family %s: %s\n", a->family,
            ct_family_check(a->family, &err) ? err.msg : "no memory plan yet (use flux or sdxl)");
    return 2;
  }
  if (strcmp(a->mtype, "full") || strcmp(a->lprec, "no_change")) {
    fprintf(stderr,
            "ctuner bench memory: --model_family sdxl plans the U-net's full fine-tune "
            "(--model_type full, no --base_model_precision); LoRA for SDXL has no plan yet\n");
    return 2;
  }
  ct_plan_denoiser d;
  ct_memplan_opts o;
  ct_memplan p;
  frozen fz[3];
  int rc = family_denoiser(a, &d, &o, &p);
  if (!rc) rc = sdxl_frozen(a, fz);
  if (rc) return rc;
  char why[512];
  const int not_yet = sdxl_not_yet(a, why, sizeof why);
  if (not_yet)
    fprintf(stderr,
            "ctuner bench memory: note: a plan on paper: ctuner train --model_family sdxl cannot "
            "train this configuration yet in this build: %s\n",
            why);
  /* what ctuner's SDXL run holds of the frozen parts in category params: the
   * VAE in float32 twice, the pipeline's (ct_sdxl_pipe_open, for sampling) and
   * the latent codec's (the text encoders are category other) */
  const double fzp = fz[2].present ? 2.0 * 4.0 * fz[2].params : 0;
  const int offopt = strcmp(a->offopt, "none") != 0;
  const double act = d.activations, tot = p.params + p.grads + p.optimizer,
               ftot = p.formula_params + p.formula_grads + p.formula_optimizer;
  const double host = offopt ? p.optimizer : 0,
               device = tot - host + act + d.scratch + p.zero_buffers;
  printf(
      "{\"plan\": true, \"model_family\": \"sdxl\", \"denoiser\": \"unet\", \"geometry\": \"%s\", "
      "\"ranks\": %ld, \"stage\": %ld, \"mixed_precision\": \"%s\", \"psi\": %zu, \"numel\": %zu, "
      "\"plan_mb\": {\"params\": %.2f, \"grads\": %.2f, \"optimizer\": %.2f, \"total\": %.2f}, "
      "\"formula_mb\": {\"params\": %.2f, \"grads\": %.2f, \"optimizer\": %.2f, \"total\": "
      "%.2f}, \"plan_over_formula\": %.4f, ",
      d.geometry, a->ranks, a->stage, a->mp, o.psi, o.numel, p.params / MB, p.grads / MB,
      p.optimizer / MB, tot / MB, p.formula_params / MB, p.formula_grads / MB,
      p.formula_optimizer / MB, ftot / MB, tot / ftot);
  printf(
      "\"buffers_mb\": {\"zero\": %.2f, \"gather_rank0\": %.2f, \"unet_scratch\": %.2f}, "
      "\"activations_mb\": %.2f, \"activation_shape\": {\"batch\": %ld, \"resolution\": %ld, "
      "\"latent\": %d, \"tokens\": %d, \"gradient_checkpointing\": 0}, "
      "\"offload\": {\"optimizer\": \"%s\", \"param\": \"%s\", \"swap_mb\": %.2f, "
      "\"buffers_mb\": %.2f, \"startup_params_mb\": %.2f, \"startup_optimizer_mb\": %.2f}, "
      "\"use_ema\": %s, \"per_rank_mb\": {\"device\": %.2f, \"host\": %.2f, \"swap\": %.2f}, "
      "\"trainable_in_this_build\": %s, \"not_yet\": \"%s\", \"frozen_in_params_mb\": %.2f",
      p.zero_buffers / MB, p.gather_rank0 / MB, d.scratch / MB, act / MB, a->batch, d.resolution,
      d.latent, d.tokens, a->offopt, a->offpar, p.swap / MB, p.offload_buffers / MB,
      p.startup_params / MB, p.startup_optimizer / MB, a->ema ? "true" : "false", device / MB,
      host / MB, p.swap / MB, not_yet ? "false" : "true", why, fzp / MB);
  double fr = 0;
  print_frozen(fz, &fr);
  printf(
      ", \"total_mb\": %.2f, \"bytes\": {\"params\": %.0f, \"grads\": %.0f, \"optimizer\": "
      "%.0f, \"activations\": %.0f, \"unet_scratch\": %.0f, \"frozen\": %.0f, \"swap\": %.0f, "
      "\"startup_params\": %.0f, \"startup_optimizer\": %.0f, \"zero_buffers\": %.0f, "
      "\"gather_rank0\": %.0f, \"device\": %.0f, \"host\": %.0f, \"frozen_in_params\": %.0f}}\n",
      (tot + act + d.scratch + fr) / MB, p.params, p.grads, p.optimizer, act, d.scratch, fr, p.swap,
      p.startup_params, p.startup_optimizer, p.zero_buffers, p.gather_rank0, device, host, fzp);
  return 0;
}

int ct_bench_memory_plan(int argc, char **argv) {
  plan_args a = {"bench", NULL, "no", "none", "none", "full",      "all",  0,     1,      0,   1,
                 0,       0,    0,    0,      16,     "no_change", "fp32", "0.1", "flux", NULL};
  int rc = parse(argc, argv, &a);
  if (rc) return rc;
  if (strcmp(a.family, "flux")) return family_plan(&a);
  ct_mmdit_config mc;
  frozen fz[3];
  int s = 1, T = 0;
  long res = 64; /* the measured mode's bucket: 16x16 images up to 64 pixels */
  if ((rc = model_of(&a, &mc, &s, &T, &res, fz))) return rc;
  ct_err err = {0};
  ct_param *tab = NULL;
  size_t ntab = 0, numel = 0, psi = 0;
  if (ct_mmdit_param_table(&mc, &tab, &ntab, &numel, &err)) {
    fprintf(stderr, "ctuner bench memory: %s\n", err.msg);
    return 1;
  }
  for (size_t i = 0; i < ntab; i++) psi += tab[i].numel;
  const size_t maxseg = ct_mmdit_max_segment(&mc, tab, ntab, numel);
  /* base_model_precision (model_type lora): the base's stored bytes */
  const int narrow = strcmp(a.lprec, "no_change") != 0;
  const double qb =
      narrow ? (double)ct_mmdit_quant_bytes(tab, ntab, a.lprec, !strcmp(a.lddt, "bf16")) : 0;
  const int known = ct_mmdit_quant_dtype(&tab[0], a.lprec, 0) >= 0;
  free(tab);
  if (!known || (narrow && strcmp(a.mtype, "lora"))) {
    fprintf(stderr,
            "ctuner bench memory: --base_model_precision %s: use no_change, bf16, int8-quanto or "
            "int8-torchao, with --model_type lora\n",
            a.lprec);
    return 2;
  }
  ct_memplan_opts o = {numel,
                       psi,
                       (int)a.ranks,
                       (int)a.stage,
                       !strcmp(a.mp, "bf16"),
                       2, /* AdamW */
                       (int)a.ema,
                       !strcmp(a.offopt, "nvme"),
                       !strcmp(a.offpar, "nvme"),
                       (size_t)a.offbuf,
                       maxseg,
                       0, /* reduce_bucket_size: the default, hidden^2 */
                       mc.hidden,
                       0,
                       0,
                       0};
  if (a.res) res = a.res;
  if (a.tokens) T = (int)a.tokens;
  if (res % (2 * s)) {
    fprintf(stderr, "ctuner bench memory: --resolution %ld must be a multiple of %d\n", res, 2 * s);
    return 2;
  }
  const int H = (int)(res / s);
  double act = (double)ct_mmdit_activation_plan(&mc, (int)a.ckpt, (int)a.batch, H, H, T);
  const int lora = !strcmp(a.mtype, "lora");
  if (lora) { /* the adapters are trained; the MMDiT is the frozen base (float32 storage) */
    double scratch = 0;
    if ((rc = lora_plan(&a, &mc, &o, (int)a.batch, (H / 2) * (H / 2), T, &scratch))) return rc;
    act += scratch;
    if (!narrow) { /* float32: whole, or this rank's range at stage 3 (memplan.c) */
      o.frozen_bytes = numel * sizeof(float);
      o.frozen_maxseg = maxseg * sizeof(float);
      o.frozen_psi = psi;
    }
  }
  ct_memplan p;
  if (ct_memplan_trainable(&o, &p, &err)) {
    fprintf(stderr, "ctuner bench memory: %s\n", err.msg);
    return 2;
  }
  if (narrow) { /* bf16 / int8 (ct_mmdit_quantize_from): whole on every rank, read
                 * through one float32 segment of scratch (buffers, freed) */
    p.base = p.formula_base = qb;
    p.params += qb;
    p.startup_params += qb;
    p.formula_params += qb;
    p.zero_buffers += 4.0 * (double)maxseg;
  }
  const double tot = p.params + p.grads + p.optimizer,
               ftot = p.formula_params + p.formula_grads + p.formula_optimizer;
  printf(
      "{\"plan\": true, \"%s\": \"%s\", \"ranks\": %ld, \"stage\": %ld, \"mixed_precision\": "
      "\"%s\", \"psi\": %zu, \"numel\": %zu, "
      "\"plan_mb\": {\"params\": %.2f, \"grads\": %.2f, \"optimizer\": %.2f, \"total\": %.2f}, "
      "\"formula_mb\": {\"params\": %.2f, \"grads\": %.2f, \"optimizer\": %.2f, \"total\": "
      "%.2f}, \"plan_over_formula\": %.4f, ",
      a.pretrained ? "pretrained" : "preset", a.pretrained ? a.pretrained : a.preset, a.ranks,
      a.stage, a.mp, o.psi, o.numel, p.params / MB, p.grads / MB, p.optimizer / MB, tot / MB,
      p.formula_params / MB, p.formula_grads / MB, p.formula_optimizer / MB, ftot / MB, tot / ftot);
  printf("\"buffers_mb\": {\"zero\": %.2f, \"gather_rank0\": %.2f}, ", p.zero_buffers / MB,
         p.gather_rank0 / MB);
  if (lora) /* base_mb: of params; the formula's base 4Ψ_base (/N at stage 3), or stored bytes */
    printf(
        "\"model_type\": \"lora\", \"lora_rank\": %ld, \"flux_lora_target\": \"%s\", "
        "\"base_model_precision\": \"%s\", \"base_psi\": %zu, \"base_mb\": %.2f, "
        "\"base_bytes_per_param\": %.4f, \"formula_base_mb\": %.2f, "
        "\"gather_base_rank0_mb\": %.2f, ",
        a.lrank, a.ltarget, a.lprec, psi, p.base / MB,
        p.base / (double)psi * (a.stage >= 3 && !narrow ? (double)a.ranks : 1.0),
        p.formula_base / MB, p.gather_base_rank0 / MB);
  printf(
      "\"activations_mb\": %.2f, \"activation_shape\": {\"batch\": %ld, \"resolution\": %ld, "
      "\"latent\": %d, \"tokens\": %d, \"gradient_checkpointing\": %ld}, "
      "\"offload\": {\"optimizer\": \"%s\", \"param\": \"%s\", \"swap_mb\": %.2f, "
      "\"buffers_mb\": %.2f, \"startup_params_mb\": %.2f, \"startup_optimizer_mb\": %.2f}, "
      "\"use_ema\": %s",
      act / MB, a.batch, res, H, T, a.ckpt, a.offopt, a.offpar, p.swap / MB, p.offload_buffers / MB,
      p.startup_params / MB, p.startup_optimizer / MB, a.ema ? "true" : "false");
  double fr = 0;
  print_frozen(fz, &fr);
  printf(
      ", \"total_mb\": %.2f, \"bytes\": {\"params\": %.0f, \"grads\": %.0f, \"optimizer\": "
      "%.0f, \"activations\": %.0f, \"frozen\": %.0f, \"swap\": %.0f, \"startup_params\": %.0f, "
      "\"startup_optimizer\": %.0f, \"zero_buffers\": %.0f, \"gather_rank0\": %.0f}}\n",
      (tot + act + fr) / MB, p.params, p.grads, p.optimizer, act, fr, p.swap, p.startup_params,
      p.startup_optimizer, p.zero_buffers, p.gather_rank0);
  return 0;
}

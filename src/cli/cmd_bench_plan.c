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
  const char *preset, *pretrained, *mp, *offopt, *offpar;
  long stage, ranks, ckpt, batch, res, tokens, offbuf, ema;
  /* model_type lora (docs/lora.md): the adapters are the trained model, the
   * base is frozen at base_model_precision */
  const char *model_type, *target, *precision, *default_dtype, *dropout;
  long rank;
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
               (r = ct_cli_opt(argc, argv, &i, "model_type", &a->model_type)) ||
               (r = ct_cli_opt(argc, argv, &i, "flux_lora_target", &a->target)) ||
               (r = ct_cli_opt(argc, argv, &i, "base_model_precision", &a->precision)) ||
               (r = ct_cli_opt(argc, argv, &i, "base_model_default_dtype", &a->default_dtype)) ||
               (r = ct_cli_opt(argc, argv, &i, "lora_dropout", &a->dropout))) {
      if (r < 0) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "lora_rank", &v))) {
      if (r < 0 || ct_cli_int("lora_rank", v, 1, 1 << 16, &a->rank)) return 2;
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
  return 0;
}

/* Rows a LoRA adapter on base weight `base` sees per call (lora.c's scratch:
 * 2 N r floats, + 2 N in with dropout): the image, text or joint rows of the
 * batch, or one row per sample for the modulations and embeddings. */
static size_t lora_rows(const char *base, int B, int Li, int T) {
  if (strstr(base, "_mod.") || strstr(base, "modulation") || strstr(base, "adaLN") ||
      !strncmp(base, "time_in", 7) || !strncmp(base, "vector_in", 9) ||
      !strncmp(base, "guidance_in", 11))
    return (size_t)B;
  if (strstr(base, ".txt_") || !strncmp(base, "txt_in", 6)) return (size_t)B * T;
  if (!strncmp(base, "single_blocks", 13)) return (size_t)B * (Li + T);
  return (size_t)B * Li; /* img stream, img_in, final_layer.linear */
}

typedef struct lora_plan {
  size_t numel, maxseg; /* the adapters: floats, largest segment */
  double base, scratch; /* the frozen base's bytes; its read scratch (buffers) */
  double act;           /* the adapters' scratch (activations) */
} lora_plan;

/* The adapters of a->target at a->rank on mc, without allocating them; the
 * base as ct_mmdit_quantize_from stores it. */
static int plan_lora(const plan_args *a, const ct_mmdit_config *mc, const ct_param *tab,
                     size_t ntab, size_t numel, int B, int H, int T, lora_plan *lp) {
  ct_err err = {0};
  const char *const *targets = ct_lora_preset(a->target);
  const double drop = atof(a->dropout);
  if (!targets) {
    fprintf(stderr, "ctuner bench memory: --flux_lora_target %s: use one of %s\n", a->target,
            ct_lora_preset_names());
    return 2;
  }
  ct_lora *l = NULL;
  const ct_lora_opts o = {(int)a->rank, (double)a->rank, drop, 0};
  if (ct_lora_new(mc, targets, &o, CT_LORA_NO_PARAMS, &l, &err)) {
    fprintf(stderr, "ctuner bench memory: %s\n", err.msg);
    return 2;
  }
  memset(lp, 0, sizeof *lp);
  lp->numel = ct_lora_numel(l);
  for (int k = 0; k < ct_lora_nsegments(l); k++) {
    size_t off, n;
    ct_lora_segment(l, k, &off, &n);
    if (n > lp->maxseg) lp->maxseg = n;
  }
  size_t nad, scr = 0;
  const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
  const int Li = (H / 2) * (H / 2);
  for (size_t i = 0; i < nad; i++) {
    const size_t N = lora_rows(ad[i].base, B, Li, T);
    const size_t f = N * (size_t)a->rank * 2 + (drop > 0 ? N * (size_t)ad[i].in * 2 : 0);
    if (f > scr) scr = f;
  }
  lp->act = 4.0 * (double)scr;
  ct_lora_free(l);
  if (!strcmp(a->precision, "no_change")) {
    lp->base = 4.0 * (double)numel;
    return 0;
  }
  lp->base =
      (double)ct_mmdit_quant_bytes(tab, ntab, a->precision, !strcmp(a->default_dtype, "bf16"));
  lp->scratch = 4.0 * (double)ct_mmdit_max_segment(mc, tab, ntab, numel);
  if (lp->base <= 0 || ct_mmdit_quant_dtype(&tab[0], a->precision, 0) < 0) {
    fprintf(stderr,
            "ctuner bench memory: --base_model_precision %s: use no_change, bf16, "
            "int8-quanto or int8-torchao\n",
            a->precision);
    return 2;
  }
  return 0;
}

/* The trainable model (cfg), the codec factor, default tokens, frozen parts. */
static int model_of(const plan_args *a, ct_mmdit_config *mc, int *s, int *T, long *res,
                    frozen fz[3]) {
  ct_err err = {0};
  memset(fz, 0, 3 * sizeof *fz);
  if (a->pretrained) { /* a FLUX.1 pipeline directory (or its transformer/) */
    char p[4400];
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
  /* frozen_f32_mb: the same widened to float32 (CLIP's and the VAE's loaders
   * still do; T5 stays in its mapped BF16 files) */
  printf("], \"frozen_mb\": %.2f, \"frozen_f32_mb\": %.2f", *total / MB, f32 / MB);
}

int ct_bench_memory_plan(int argc, char **argv) {
  plan_args a = {"bench", NULL, "no", "none", "none", 0,           1,      0,     1, 0,
                 0,       0,    0,    "full", "all",  "no_change", "fp32", "0.1", 16};
  int rc = parse(argc, argv, &a);
  if (rc) return rc;
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
  if (a.res) res = a.res;
  if (a.tokens) T = (int)a.tokens;
  if (res % (2 * s)) {
    fprintf(stderr, "ctuner bench memory: --resolution %ld must be a multiple of %d\n", res, 2 * s);
    free(tab);
    return 2;
  }
  const int H = (int)(res / s), lora = !strcmp(a.model_type, "lora");
  lora_plan lp = {numel, maxseg, 0, 0, 0};
  if (lora && (rc = plan_lora(&a, &mc, tab, ntab, numel, (int)a.batch, H, T, &lp))) {
    free(tab);
    return rc;
  }
  if (!lora && (strcmp(a.model_type, "full") || strcmp(a.precision, "no_change"))) {
    fprintf(stderr,
            "ctuner bench memory: --model_type %s --base_model_precision %s: use "
            "--model_type full (float32) or lora\n",
            a.model_type, a.precision);
    free(tab);
    return 2;
  }
  free(tab);
  if (lora) psi = lp.numel;
  ct_memplan_opts o = {lp.numel,
                       psi,
                       (int)a.ranks,
                       (int)a.stage,
                       !strcmp(a.mp, "bf16"),
                       2, /* AdamW */
                       (int)a.ema,
                       !strcmp(a.offopt, "nvme"),
                       !strcmp(a.offpar, "nvme"),
                       (size_t)a.offbuf,
                       lp.maxseg,
                       0, /* reduce_bucket_size: the default, hidden^2 */
                       mc.hidden};
  ct_memplan p;
  if (ct_memplan_trainable(&o, &p, &err)) {
    fprintf(stderr, "ctuner bench memory: %s\n", err.msg);
    return 2;
  }
  const double act =
      (double)ct_mmdit_activation_plan(&mc, (int)a.ckpt, (int)a.batch, H, H, T) + lp.act;
  p.params += lp.base;         /* the frozen base (lora): counted as params, as the trainer does */
  p.formula_params += lp.base; /* whole on every rank: adapters + their state + the base */
  p.zero_buffers += lp.scratch;
  const double tot = p.params + p.grads + p.optimizer,
               ftot = p.formula_params + p.formula_grads + p.formula_optimizer;
  printf(
      "{\"plan\": true, \"%s\": \"%s\", \"ranks\": %ld, \"stage\": %ld, \"mixed_precision\": "
      "\"%s\", \"psi\": %zu, \"numel\": %zu, "
      "\"plan_mb\": {\"params\": %.2f, \"grads\": %.2f, \"optimizer\": %.2f, \"total\": %.2f}, "
      "\"formula_mb\": {\"params\": %.2f, \"grads\": %.2f, \"optimizer\": %.2f, \"total\": "
      "%.2f}, \"plan_over_formula\": %.4f, ",
      a.pretrained ? "pretrained" : "preset", a.pretrained ? a.pretrained : a.preset, a.ranks,
      a.stage, a.mp, psi, numel, p.params / MB, p.grads / MB, p.optimizer / MB, tot / MB,
      p.formula_params / MB, p.formula_grads / MB, p.formula_optimizer / MB, ftot / MB, tot / ftot);
  printf("\"buffers_mb\": {\"zero\": %.2f, \"gather_rank0\": %.2f}, ", p.zero_buffers / MB,
         p.gather_rank0 / MB);
  printf(
      "\"activations_mb\": %.2f, \"activation_shape\": {\"batch\": %ld, \"resolution\": %ld, "
      "\"latent\": %d, \"tokens\": %d, \"gradient_checkpointing\": %ld}, "
      "\"offload\": {\"optimizer\": \"%s\", \"param\": \"%s\", \"swap_mb\": %.2f, "
      "\"buffers_mb\": %.2f, \"startup_params_mb\": %.2f, \"startup_optimizer_mb\": %.2f}, "
      "\"use_ema\": %s",
      act / MB, a.batch, res, H, T, a.ckpt, a.offopt, a.offpar, p.swap / MB, p.offload_buffers / MB,
      p.startup_params / MB, p.startup_optimizer / MB, a.ema ? "true" : "false");
  if (lora)
    printf(
        ", \"lora\": {\"flux_lora_target\": \"%s\", \"lora_rank\": %ld, \"adapters\": %zu, "
        "\"base_model_precision\": \"%s\", \"base_params\": %zu, \"base_mb\": %.2f, "
        "\"base_f32_mb\": %.2f, \"base_bytes_per_param\": %.4f, \"base_read_scratch_mb\": "
        "%.2f}",
        a.target, a.rank, lp.numel, a.precision, numel, lp.base / MB, 4.0 * (double)numel / MB,
        lp.base / (double)numel, lp.scratch / MB);
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

/* `ctuner lora merge` and `ctuner lora export` (docs/lora.md): an adapter
 * folded into its base and written as a diffusers FluxTransformer2DModel
 * directory, or written in the kohya / ComfyUI key layout. The base is a
 * FluxPipeline or transformer directory (--pretrained) or a checkpoint; the
 * adapter a pytorch_lora_weights.safetensors (--lora) or a LoRA run
 * checkpoint's own. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "ctuner/fs.h"
#include "ctuner/lora_tools.h"
#include "ctuner/parse.h"
#include "ctuner/safetensors.h"
#include "ctuner/train.h"

void ct_cmd_lora_merge_help(FILE *f) {
  fprintf(f,
          "usage: ctuner lora merge (--pretrained DIR | --checkpoint C | both) [--lora FILE]\n"
          "                         [--lora_scale S] --out DIR [--dtype f32|bf16]\n"
          "                         [--max_shard_size SIZE] [--ema]\n"
          "\n"
          "Writes the base with the adapter folded in (W += S * alpha / rank * B A) as a\n"
          "diffusers FluxTransformer2DModel directory (config.json and the weights, sharded\n"
          "past --max_shard_size, default 10G, with their index), which\n"
          "FluxTransformer2DModel.from_pretrained and --pretrained_transformer_model_name_or_path\n"
          "read. The base: --pretrained, a FluxPipeline directory (its transformer) or a\n"
          "transformer directory; --checkpoint, a full run's model (--ema: its EMA) or a\n"
          "model_type lora run's base (pretrained_model_path, its pipeline's transformer, else\n"
          "the seeded init). The adapter: --lora FILE (peft's pytorch_lora_weights.safetensors,\n"
          "kohya/ComfyUI lora_unet_*, BFL names, or a LyCORIS file: LoCon, LoHa, LoKr;\n"
          "docs/lora.md), else the LoRA run checkpoint's own. --lora_scale S (default 1) as\n"
          "diffusers' fuse_lora(lora_scale=S) (LyCORIS: the multiplier).\n");
}

void ct_cmd_lora_export_help(FILE *f) {
  fprintf(
      f,
      "usage: ctuner lora export --format comfyui --out FILE.safetensors\n"
      "                          (--lora FILE (--pretrained DIR | --checkpoint C) | --checkpoint "
      "C)\n"
      "                          [--lora_scale S] [--dtype f32|bf16] [--ema]\n"
      "\n"
      "Writes the adapter in kohya's Flux key layout (lora_unet_double_blocks_0_img_attn_qkv\n"
      ".lora_down.weight / .lora_up.weight / .alpha), which ComfyUI, Forge, kohya's sd-scripts\n"
      "and diffusers' FluxPipeline.load_lora_weights read. Adapters sharing a fused BFL\n"
      "weight (to_q/to_k/to_v on qkv, + proj_mlp on linear1) become one LoRA of their summed\n"
      "rank: down = the A's stacked, up = the B's block-diagonal; alpha / rank = 1 with\n"
      "S * lora_alpha / lora_rank folded into up (docs/lora.md). The transformer's shape comes\n"
      "from --pretrained (a FluxPipeline or transformer directory) or --checkpoint.\n");
}

typedef struct lora_args {
  const char *pretrained, *ckpt, *lora, *out, *dtype, *format, *shard;
  double scale;
  int ema;
} lora_args;

/* Options shared by both commands; returns 0 or the exit code. */
static int parse(int argc, char **argv, const char *cmd, void (*help)(FILE *), lora_args *a) {
  *a = (lora_args){.dtype = "f32", .shard = "10G", .scale = 1.0};
  for (int i = 2; i < argc; i++) {
    int r;
    const char *v;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      help(stdout);
      return -1;
    } else if (!strcmp(argv[i], "--ema")) {
      a->ema = 1;
    } else if ((r = ct_cli_opt(argc, argv, &i, "pretrained", &a->pretrained)) ||
               (r = ct_cli_opt(argc, argv, &i, "checkpoint", &a->ckpt)) ||
               (r = ct_cli_opt(argc, argv, &i, "lora", &a->lora)) ||
               (r = ct_cli_opt(argc, argv, &i, "out", &a->out)) ||
               (r = ct_cli_opt(argc, argv, &i, "dtype", &a->dtype)) ||
               (r = ct_cli_opt(argc, argv, &i, "format", &a->format)) ||
               (r = ct_cli_opt(argc, argv, &i, "max_shard_size", &a->shard))) {
      if (r < 0) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "lora_scale", &v))) {
      if (r < 0 || ct_cli_float("lora_scale", v, &a->scale)) return 2;
    } else {
      fprintf(stderr, "ctuner lora %s: unknown option '%s'\n", cmd, argv[i]);
      help(stderr);
      return 2;
    }
  }
  if ((!a->pretrained && !a->ckpt) || !a->out) {
    fprintf(stderr, "ctuner lora %s: need --out and --pretrained or --checkpoint\n", cmd);
    help(stderr);
    return 2;
  }
  if (strcmp(a->dtype, "f32") && strcmp(a->dtype, "bf16")) {
    fprintf(stderr, "ctuner lora %s: --dtype %s: expected f32 or bf16\n", cmd, a->dtype);
    return 2;
  }
  ct_err err = {0};
  if (ct_lora_check_multiplier(a->scale, &err)) {
    fprintf(stderr, "ctuner lora %s: --%s\n", cmd, err.msg);
    return 2;
  }
  return 0;
}

/* The base and the adapter (--lora, else the checkpoint's own); base_only:
 * --lora is merged later by ct_lora_merge_any (a kohya / BFL / LyCORIS file). */
static int open_both(const char *cmd, const lora_args *a, int base_only, ct_mmdit **m,
                     ct_lora **l) {
  ct_err err = {0};
  char dir[4096];
  if (a->ckpt && ct_cli_checkpoint_dir(cmd, a->ckpt, dir, sizeof dir)) return 1;
  ct_status st =
      ct_lora_base_open(a->pretrained, a->ckpt ? dir : NULL, a->ema, m, a->lora ? NULL : l, &err);
  if (!st && a->lora && !base_only) st = ct_lora_open_file(ct_mmdit_cfg(*m), a->lora, l, &err);
  if (!st && !*l && !base_only)
    st = ct_errf(&err, CT_ERR_INVALID, "no adapter: give --lora FILE (the base %s holds none)",
                 a->ckpt ? dir : a->pretrained);
  if (st) {
    fprintf(stderr, "ctuner %s: %s\n", cmd, err.msg);
    ct_mmdit_free(*m);
    ct_lora_free(*l);
    *m = NULL, *l = NULL;
    return 1;
  }
  return 0;
}

/* The checkpoint's own adapter file when it is not peft's (a lora_type
 * lycoris run's, LyCORIS names): its path in buf, else 0. */
static int own_lycoris(const lora_args *a, char *buf, size_t cap) {
  char dir[4096];
  struct stat sb;
  if (ct_cli_checkpoint_dir("lora merge", a->ckpt, dir, sizeof dir)) return 0;
  if (ct_pathf(buf, cap, "%s/pytorch_lora_weights.safetensors", dir) || stat(buf, &sb)) return 0;
  return !ct_lora_file_is_peft(buf);
}

int ct_cmd_lora_merge(int argc, char **argv) {
  lora_args a;
  int rc = parse(argc, argv, "merge", ct_cmd_lora_merge_help, &a);
  if (rc) return rc < 0 ? 0 : rc;
  if (a.format) {
    fprintf(stderr, "ctuner lora merge: --format is for lora export (merge writes diffusers)\n");
    return 2;
  }
  const long long shard = ct_parse_bytes(a.shard);
  if (shard <= 0) {
    fprintf(stderr, "ctuner lora merge: --max_shard_size %s: expected a size such as 10G\n",
            a.shard);
    return 2;
  }
  ct_mmdit *m = NULL;
  ct_lora *l = NULL;
  char own[4200];
  if (!a.lora && a.ckpt && own_lycoris(&a, own, sizeof own)) {
    if (a.ema) {
      fprintf(stderr,
              "ctuner lora merge: %s is a LyCORIS adapter; --ema with it is not implemented "
              "(its ema.safetensors holds no alphas)\n",
              own);
      return 1;
    }
    a.lora = own; /* a lora_type lycoris run's own adapter, merged as a --lora file */
  }
  const int any = a.lora && !ct_lora_file_is_peft(a.lora); /* kohya, BFL, LyCORIS */
  if (open_both("lora merge", &a, any, &m, &l)) return 1;
  ct_err err = {0};
  size_t nad = 0;
  int rank = 0; /* per module in the other layouts: 0 in the summary */
  double alpha = 0;
  ct_lora_file_info fi;
  ct_status st;
  if (any) {
    st = ct_lora_merge_any(m, a.lora, a.scale, &fi, &err);
    nad = (size_t)fi.modules;
  } else {
    ct_lora_adapters(l, &nad);
    rank = ct_lora_options(l)->rank;
    alpha = ct_lora_options(l)->alpha;
    st = ct_lora_merge(m, l, a.scale, &err);
  }
  if (!st)
    st = ct_mmdit_save_diffusers(m, a.out, (size_t)shard,
                                 strcmp(a.dtype, "bf16") ? CT_DTYPE_F32 : CT_DTYPE_BF16, &err);
  const size_t n = ct_mmdit_numel(m);
  ct_lora_free(l);
  ct_mmdit_free(m);
  if (st) {
    fprintf(stderr, "ctuner lora merge: %s\n", err.msg);
    return 1;
  }
  printf(
      "{\"out\": \"%s\", \"format\": \"diffusers\", \"dtype\": \"%s\", \"adapters\": %zu, "
      "\"rank\": %d, \"alpha\": %g, \"lora_scale\": %g, \"params\": %zu, \"layout\": \"%s\"}\n",
      a.out, a.dtype, nad, rank, alpha, a.scale, n, any ? "kohya/bfl/lycoris" : "peft");
  return 0;
}

int ct_cmd_lora_export(int argc, char **argv) {
  lora_args a;
  int rc = parse(argc, argv, "export", ct_cmd_lora_export_help, &a);
  if (rc) return rc < 0 ? 0 : rc;
  if (!a.format || strcmp(a.format, "comfyui")) {
    fprintf(stderr, "ctuner lora export: --format %s: expected comfyui (kohya's Flux keys)\n",
            a.format ? a.format : "(missing)");
    return 2;
  }
  ct_mmdit *m = NULL;
  ct_lora *l = NULL;
  ct_err err = {0};
  ct_mmdit_config mc;
  if (a.pretrained && a.lora && !a.ckpt) { /* the shape is enough: no weights read */
    if (ct_lora_pretrained_config(a.pretrained, &mc, &err) ||
        ct_lora_open_file(&mc, a.lora, &l, &err)) {
      fprintf(stderr, "ctuner lora export: %s\n", err.msg);
      return 1;
    }
  } else if (a.lora && !ct_lora_file_is_peft(a.lora)) {
    fprintf(stderr,
            "ctuner lora export: %s is not a peft adapter file (transformer.<module>.lora_A/B): "
            "export converts those; a kohya, BFL or LyCORIS file is used as it is (ctuner "
            "sample --lora, lora merge)\n",
            a.lora);
    return 1;
  } else {
    if (open_both("lora export", &a, 0, &m, &l)) return 1;
    mc = *ct_mmdit_cfg(m);
  }
  size_t nad;
  ct_lora_adapters(l, &nad);
  ct_status st = ct_lora_export_kohya(&mc, l, a.scale, a.out,
                                      strcmp(a.dtype, "bf16") ? CT_DTYPE_F32 : CT_DTYPE_BF16, &err);
  ct_lora_free(l);
  ct_mmdit_free(m);
  if (st) {
    fprintf(stderr, "ctuner lora export: %s\n", err.msg);
    return 1;
  }
  printf(
      "{\"out\": \"%s\", \"format\": \"comfyui\", \"dtype\": \"%s\", \"adapters\": %zu, "
      "\"lora_scale\": %g}\n",
      a.out, a.dtype, nad, a.scale);
  return 0;
}

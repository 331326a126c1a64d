/* `ctuner checkpoint export`: the model (or EMA) weights of a checkpoint as one
 * BFL-layout safetensors file (flux1-dev.safetensors names, what ComfyUI
 * loads) or a diffusers FluxTransformer2DModel directory, in float32 or
 * bfloat16. Checkpoints of any world size or ZeRO stage hold the whole model,
 * so this is a conversion, not a reassembly (docs/distributed.md). A
 * checkpoint of a run from a FLUX.1 pipeline holds transformer/ (its config);
 * one of a preset run is rebuilt from its config.json. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "ctuner/config.h"
#include "ctuner/mmdit.h"
#include "ctuner/parse.h"
#include "ctuner/safetensors.h"
#include "ctuner/train.h"

void ct_cmd_checkpoint_export_help(FILE *f) {
  fprintf(
      f,
      "usage: ctuner checkpoint export --checkpoint DIR|latest:OUTPUT_DIR --out PATH\n"
      "                                [--format bfl|diffusers] [--dtype f32|bf16] [--ema]\n"
      "                                [--max_shard_size SIZE]\n"
      "\n"
      "Writes the checkpoint's model weights (--ema: its EMA weights), stored as float32\n"
      "(default) or bfloat16 (round to nearest even):\n"
      "  --format bfl (default)  PATH is one safetensors file with BFL/Flux parameter names\n"
      "                          (flux1-dev.safetensors layout, as ComfyUI loads it; also\n"
      "                          pretrained_model_path and "
      "pretrained_transformer_model_name_or_path)\n"
      "  --format diffusers      PATH is a new directory FluxTransformer2DModel.from_pretrained\n"
      "                          reads: config.json and the weights, sharded past\n"
      "                          --max_shard_size (default 10G) with their index (docs/flux.md)\n"
      "Works for checkpoints of preset runs and of runs from a FLUX.1 pipeline.\n");
}

/* The checkpoint's transformer: from its transformer/ (a run from a FLUX.1
 * pipeline, whose config.json gives the shape, the weights model.safetensors or
 * ema.safetensors); else the preset run's inference pipeline. */
static ct_status open_weights(const char *dir, int ema, ct_pipeline *p, ct_err *err) {
  char tdir[4200], path[4300];
  struct stat sb;
  snprintf(tdir, sizeof tdir, "%s/transformer", dir);
  snprintf(path, sizeof path, "%s/config.json", tdir);
  if (stat(path, &sb) != 0) return ct_pipeline_from_checkpoint(dir, ema, p, err);
  memset(p, 0, sizeof *p);
  ct_config_defaults(&p->cfg);
  /* the shape from transformer/config.json, the weights from the checkpoint's
   * float32 model.safetensors (a bf16 run's masters; its transformer/ is bf16),
   * else transformer/ itself (a float32 run keeps its weights only there) */
  ct_mmdit_config mc;
  ct_status st = ct_flux_config_read(path, &mc, err);
  if (!st) st = ct_mmdit_new(&mc, 0, 0, &p->model, err);
  if (!st) {
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, ema ? "ema" : "model");
    if (!ema && stat(path, &sb) != 0) return ct_mmdit_load_diffusers(p->model, tdir, err);
    st = stat(path, &sb) != 0 ? ct_errf(err, CT_ERR_NOT_FOUND, "%s: not in this checkpoint%s", path,
                                        ema ? " (trained without use_ema)" : "")
                              : ct_mmdit_load(p->model, path, "", err);
  }
  if (st) ct_pipeline_free(p);
  return st;
}

int ct_cmd_checkpoint_export(int argc, char **argv) {
  const char *ckpt = NULL, *out = NULL, *dtype = "f32", *format = "bfl", *shard_s = "10G";
  int ema = 0;
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_checkpoint_export_help(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--ema")) {
      ema = 1;
    } else if ((r = ct_cli_opt(argc, argv, &i, "checkpoint", &ckpt)) ||
               (r = ct_cli_opt(argc, argv, &i, "out", &out)) ||
               (r = ct_cli_opt(argc, argv, &i, "dtype", &dtype)) ||
               (r = ct_cli_opt(argc, argv, &i, "format", &format)) ||
               (r = ct_cli_opt(argc, argv, &i, "max_shard_size", &shard_s))) {
      if (r < 0) return 2;
    } else {
      fprintf(stderr, "ctuner checkpoint export: unknown option '%s'\n", argv[i]);
      ct_cmd_checkpoint_export_help(stderr);
      return 2;
    }
  }
  if (!ckpt || !out) {
    fprintf(stderr, "ctuner checkpoint export: --checkpoint and --out are required\n");
    ct_cmd_checkpoint_export_help(stderr);
    return 2;
  }
  ct_dtype dt;
  if (!strcmp(dtype, "f32"))
    dt = CT_DTYPE_F32;
  else if (!strcmp(dtype, "bf16"))
    dt = CT_DTYPE_BF16;
  else {
    fprintf(stderr, "ctuner checkpoint export: --dtype %s: expected f32 or bf16\n", dtype);
    return 2;
  }
  const int diffusers = !strcmp(format, "diffusers");
  if (!diffusers && strcmp(format, "bfl")) {
    fprintf(stderr, "ctuner checkpoint export: --format %s: expected bfl or diffusers\n", format);
    return 2;
  }
  const long long shard = ct_parse_bytes(shard_s);
  if (shard <= 0) {
    fprintf(stderr, "ctuner checkpoint export: --max_shard_size %s: expected a size such as 10G\n",
            shard_s);
    return 2;
  }
  char dir[4096];
  if (ct_cli_checkpoint_dir("checkpoint export", ckpt, dir, sizeof dir)) return 1;
  ct_err err = {0};
  ct_pipeline p;
  if (open_weights(dir, ema, &p, &err)) {
    fprintf(stderr, "ctuner checkpoint export: %s\n", err.msg);
    return 1;
  }
  size_t np;
  const ct_param *t = ct_mmdit_table(p.model, &np);
  const float *w = ct_mmdit_params(p.model);
  if (diffusers) {
    ct_status ds = ct_mmdit_save_diffusers(p.model, out, (size_t)shard, dt, &err);
    const size_t n = ct_mmdit_numel(p.model);
    ct_pipeline_free(&p);
    if (ds) {
      fprintf(stderr, "ctuner checkpoint export: %s\n", err.msg);
      return 1;
    }
    printf(
        "{\"checkpoint\": \"%s\", \"out\": \"%s\", \"format\": \"diffusers\", \"dtype\": "
        "\"%s\", \"weights\": \"%s\", \"params\": %zu}\n",
        dir, out, dtype, ema ? "ema" : "model", n);
    return 0;
  }
  ct_st_writer *wr = NULL;
  ct_status st = ct_st_writer_new(&wr) ? ct_errf(&err, CT_ERR_NOMEM, "out of memory") : CT_OK;
  if (!st) st = ct_st_writer_meta(wr, "format", "pt", &err);
  if (!st) st = ct_st_writer_meta(wr, "ctuner_weights", ema ? "ema" : "model", &err);
  size_t total = 0;
  for (size_t i = 0; i < np && !st; i++) {
    st = ct_st_writer_add_f32(wr, t[i].name, t[i].ndim, t[i].shape, w + t[i].offset, dt, &err);
    total += t[i].numel;
  }
  if (!st) st = ct_st_writer_write(wr, out, &err);
  ct_st_writer_free(wr);
  ct_pipeline_free(&p);
  if (st) {
    fprintf(stderr, "ctuner checkpoint export: %s\n", err.msg);
    return 1;
  }
  printf(
      "{\"checkpoint\": \"%s\", \"out\": \"%s\", \"format\": \"bfl\", \"dtype\": \"%s\", "
      "\"weights\": \"%s\", "
      "\"tensors\": %zu, "
      "\"params\": %zu}\n",
      dir, out, dtype, ema ? "ema" : "model", np, total);
  return 0;
}

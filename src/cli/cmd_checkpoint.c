/* `ctuner checkpoint export`: the model (or EMA) weights of a checkpoint as one
 * Flux-layout safetensors file, in float32 or bfloat16. Checkpoints of any
 * world size or ZeRO stage hold the whole model, so this is a conversion, not a
 * reassembly (docs/distributed.md). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "ctuner/mmdit.h"
#include "ctuner/safetensors.h"
#include "ctuner/train.h"

void ct_cmd_checkpoint_export_help(FILE *f) {
  fprintf(
      f,
      "usage: ctuner checkpoint export --checkpoint DIR|latest:OUTPUT_DIR --out FILE.safetensors\n"
      "                                [--dtype f32|bf16] [--ema]\n"
      "\n"
      "Writes the checkpoint's model weights (--ema: its EMA weights) as one safetensors\n"
      "file with Flux parameter names, stored as float32 (default) or bfloat16\n"
      "(round to nearest even). The file loads with pretrained_model_path and in\n"
      "PyTorch/diffusers tooling.\n");
}

int ct_cmd_checkpoint_export(int argc, char **argv) {
  const char *ckpt = NULL, *out = NULL, *dtype = "f32";
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
               (r = ct_cli_opt(argc, argv, &i, "dtype", &dtype))) {
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
  char dir[4096];
  if (ct_cli_checkpoint_dir("checkpoint export", ckpt, dir, sizeof dir)) return 1;
  ct_err err = {0};
  ct_pipeline p;
  if (ct_pipeline_from_checkpoint(dir, ema, &p, &err)) {
    fprintf(stderr, "ctuner checkpoint export: %s\n", err.msg);
    return 1;
  }
  size_t np;
  const ct_param *t = ct_mmdit_table(p.model, &np);
  const float *w = ct_mmdit_params(p.model);
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
      "{\"checkpoint\": \"%s\", \"out\": \"%s\", \"dtype\": \"%s\", \"weights\": \"%s\", "
      "\"tensors\": %zu, "
      "\"params\": %zu}\n",
      dir, out, dtype, ema ? "ema" : "model", np, total);
  return 0;
}

/* `ctuner model check`, `ctuner model info` and `ctuner model convert` (diffusers <-> BFL). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "ctuner/fs.h"
#include "ctuner/mmdit.h"
#include "ctuner/parse.h"
#include "ctuner/safetensors.h"

void ct_cmd_model_check_help(FILE *f) {
  fprintf(f,
          "usage: ctuner model check --golden FILE [--tol X]\n"
          "\n"
          "Reads a golden file written by the PyTorch peer\n"
          "  /usr/bin/python3 scripts/mmdit_torch.py golden --preset P [--set F=V ...] --out "
          "FILE\n"
          "(config from its metadata), runs forward and backward, and prints the largest\n"
          "error of x_t, v_pred, the loss and the worst parameter gradient, each relative\n"
          "to the reference tensor's largest magnitude. Exit status 1 if any exceeds the\n"
          "tolerance (default 1e-4).\n");
}

void ct_cmd_model_info_help(FILE *f) {
  fprintf(f,
          "usage: ctuner model info --preset NAME [--table]\n"
          "\n"
          "Prints a preset's configuration and parameter count (presets: %s);\n"
          "--table lists every tensor with its shape and offset.\n",
          ct_mmdit_preset_names());
}

int ct_cmd_model_check(int argc, char **argv) {
  const char *golden = NULL, *v;
  double tol = 1e-4;
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_model_check_help(stdout);
      return 0;
    } else if ((r = ct_cli_opt(argc, argv, &i, "golden", &golden))) {
      if (r < 0) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "tol", &v))) {
      if (r < 0 || ct_cli_float("tol", v, &tol)) return 2;
    } else {
      fprintf(stderr, "ctuner model check: unknown option '%s'\n", argv[i]);
      ct_cmd_model_check_help(stderr);
      return 2;
    }
  }
  if (!golden) {
    fprintf(stderr, "ctuner model check: --golden FILE is required\n");
    ct_cmd_model_check_help(stderr);
    return 2;
  }
  ct_err err = {0};
  ct_mmdit_check_report r;
  if (ct_mmdit_check_golden(golden, &r, &err)) {
    fprintf(stderr, "ctuner model check: %s\n", err.msg);
    return 1;
  }
  const ct_mmdit_config *c = &r.cfg;
  int pass = r.err_v <= tol && r.err_loss <= tol && r.err_grad <= tol && r.err_xt <= tol;
  printf(
      "{\"golden\": \"%s\", \"lat\": %d, \"hidden\": %d, \"heads\": %d, \"axes\": [%d, %d, %d], "
      "\"nd\": %d, "
      "\"ns\": %d, \"ctx\": %d, \"vec\": %d, \"B\": %d, \"hw\": [%d, %d], \"T\": %d, \"params\": "
      "%zu, "
      "\"loss\": %.9g, \"loss_ref\": %.9g, \"err_xt\": %.3g, \"err_v_pred\": %.3g, \"err_loss\": "
      "%.3g, "
      "\"err_grad_max\": %.3g, \"worst_grad\": \"%s\", \"tol\": %g, \"pass\": %s}\n",
      golden, c->in_channels, c->hidden, c->heads, c->axes_dim[0], c->axes_dim[1], c->axes_dim[2],
      c->depth_double, c->depth_single, c->context_in_dim, c->vec_in_dim, r.B, r.H, r.W, r.T,
      r.numel, r.loss, r.loss_ref, r.err_xt, r.err_v, r.err_loss, r.err_grad, r.worst_grad, tol,
      pass ? "true" : "false");
  if (!pass)
    fprintf(stderr,
            "ctuner model check: FAILED: relative error above %g (v_pred %.3g, loss %.3g, grad "
            "%.3g in %s)\n",
            tol, r.err_v, r.err_loss, r.err_grad, r.worst_grad);
  return pass ? 0 : 1;
}

int ct_cmd_model_info(int argc, char **argv) {
  const char *preset = NULL;
  int table = 0;
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_model_info_help(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--table")) {
      table = 1;
    } else if ((r = ct_cli_opt(argc, argv, &i, "preset", &preset))) {
      if (r < 0) return 2;
    } else {
      fprintf(stderr, "ctuner model info: unknown option '%s'\n", argv[i]);
      ct_cmd_model_info_help(stderr);
      return 2;
    }
  }
  const ct_mmdit_preset *p = ct_mmdit_preset_find(preset);
  if (!p) {
    fprintf(stderr, "ctuner model info: unknown or missing --preset '%s'; presets: %s\n",
            preset ? preset : "", ct_mmdit_preset_names());
    return 2;
  }
  ct_err err = {0};
  ct_param *tab;
  size_t n, numel;
  if (ct_mmdit_param_table(&p->cfg, &tab, &n, &numel, &err)) {
    fprintf(stderr, "ctuner model info: %s\n", err.msg);
    return 1;
  }
  size_t real = 0;
  for (size_t i = 0; i < n; i++) real += tab[i].numel;
  const ct_mmdit_config *c = &p->cfg;
  printf(
      "{\"preset\": \"%s\", \"in_channels\": %d, \"hidden\": %d, \"heads\": %d, \"axes_dim\": [%d, "
      "%d, %d], "
      "\"depth_double\": %d, \"depth_single\": %d, \"context_in_dim\": %d, \"vec_in_dim\": %d, "
      "\"guidance_embed\": %s, \"tensors\": %zu, \"params\": %zu, \"fp32_bytes\": %zu}\n",
      p->name, c->in_channels, c->hidden, c->heads, c->axes_dim[0], c->axes_dim[1], c->axes_dim[2],
      c->depth_double, c->depth_single, c->context_in_dim, c->vec_in_dim,
      c->guidance_embed ? "true" : "false", n, real, numel * 4);
  for (size_t i = 0; table && i < n; i++) {
    char shp[64];
    if (tab[i].ndim == 2)
      snprintf(shp, sizeof shp, "[%lld, %lld]", (long long)tab[i].shape[0],
               (long long)tab[i].shape[1]);
    else
      snprintf(shp, sizeof shp, "[%lld]", (long long)tab[i].shape[0]);
    printf("%-56s %-14s offset %zu\n", tab[i].name, shp, tab[i].offset);
  }
  free(tab);
  return 0;
}

void ct_cmd_model_convert_help(FILE *f) {
  fprintf(f,
          "usage: ctuner model convert --from DIR|FILE --to PATH --layout diffusers|bfl\n"
          "                            [--axes_dims_rope A,B,C] [--max_shard_size SIZE]\n"
          "                            [--dtype f32|bf16|f16]\n"
          "\n"
          "Converts a Flux transformer between diffusers' FluxTransformer2DModel layout and\n"
          "BFL's single file (flux1-dev.safetensors names, as ComfyUI loads it). --from is a\n"
          "diffusers transformer directory (config.json + diffusion_pytorch_model.safetensors\n"
          "or shards with their index), a pipeline directory (its transformer/ is used), or a\n"
          "BFL .safetensors file (\"model.diffusion_model.\" prefix accepted; the config is read\n"
          "from the tensor shapes, and the RoPE split from --axes_dims_rope, default 16,56,56\n"
          "for head_dim 128 as FLUX.1). --layout diffusers writes a directory PATH (which must\n"
          "not exist, or be empty) that FluxTransformer2DModel.from_pretrained reads, sharded\n"
          "past --max_shard_size (default 10G, binary units) with its index; --layout bfl\n"
          "writes one F32 file. --dtype (diffusers layout only): how tensors are stored\n"
          "(default f32). Prints one JSON line. docs/flux.md\n"
          "\n"
          "example: ctuner model convert --from FLUX.1-dev/transformer --to flux1-dev.safetensors "
          "--layout bfl\n");
}

/* --from: a transformer dir, a pipeline dir (transformer/), or a BFL file. */
static int convert_open(const char *from, const int *axes, ct_mmdit **m, const char **kind,
                        char *src, size_t cap, ct_err *err) {
  struct stat sb;
  char cfg[4096], prefix[64];
  if (stat(from, &sb)) {
    fprintf(stderr,
            "ctuner model convert: %s does not exist (ctuner does not download; fetch it with "
            "huggingface-cli download REPO --local-dir X and pass X)\n",
            from);
    return 2;
  }
  if (S_ISDIR(sb.st_mode)) {
    *kind = "diffusers";
    snprintf(src, cap, "%s", from);
    if (ct_pathf(cfg, sizeof cfg, "%s/config.json", from) == 0 && stat(cfg, &sb) &&
        ct_pathf(cfg, sizeof cfg, "%s/transformer/config.json", from) == 0 && !stat(cfg, &sb))
      snprintf(src, cap, "%s/transformer", from);
    if (ct_mmdit_open_diffusers(src, 0, m, err)) return 1;
    return 0;
  }
  ct_mmdit_config c;
  *kind = "bfl";
  snprintf(src, cap, "%s", from);
  if (ct_flux_bfl_config(from, axes, &c, prefix, sizeof prefix, err) ||
      ct_mmdit_new(&c, 0, 0, m, err))
    return 1;
  if (ct_mmdit_load(*m, from, prefix, err)) {
    ct_mmdit_free(*m);
    *m = NULL;
    return 1;
  }
  return 0;
}

static int convert_args(int argc, char **argv, const char **opt, int *axes, int *have_axes,
                        long long *shard, ct_dtype *dt) {
  const char *v;
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_model_convert_help(stdout);
      return -1;
    } else if ((r = ct_cli_opt(argc, argv, &i, "from", &opt[0])) ||
               (r = ct_cli_opt(argc, argv, &i, "to", &opt[1])) ||
               (r = ct_cli_opt(argc, argv, &i, "layout", &opt[2]))) {
      if (r < 0) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "axes_dims_rope", &v))) {
      if (r < 0 || sscanf(v, "%d,%d,%d", &axes[0], &axes[1], &axes[2]) != 3) {
        fprintf(stderr, "ctuner model convert: --axes_dims_rope takes A,B,C (got '%s')\n", v);
        return 2;
      }
      *have_axes = 1;
    } else if ((r = ct_cli_opt(argc, argv, &i, "max_shard_size", &v))) {
      if (r < 0 || (*shard = ct_parse_bytes(v)) <= 0) {
        fprintf(stderr, "ctuner model convert: --max_shard_size takes a size such as 5G\n");
        return 2;
      }
    } else if ((r = ct_cli_opt(argc, argv, &i, "dtype", &v))) {
      if (r < 0) return 2;
      if (!strcmp(v, "f32"))
        *dt = CT_DTYPE_F32;
      else if (!strcmp(v, "bf16"))
        *dt = CT_DTYPE_BF16;
      else if (!strcmp(v, "f16"))
        *dt = CT_DTYPE_F16;
      else {
        fprintf(stderr, "ctuner model convert: --dtype is f32, bf16 or f16 (got '%s')\n", v);
        return 2;
      }
    } else {
      fprintf(stderr, "ctuner model convert: unknown option '%s'\n", argv[i]);
      ct_cmd_model_convert_help(stderr);
      return 2;
    }
  }
  if (!opt[0] || !opt[1] || !opt[2] || (strcmp(opt[2], "diffusers") && strcmp(opt[2], "bfl"))) {
    fprintf(stderr, "ctuner model convert: --from, --to and --layout diffusers|bfl are required\n");
    ct_cmd_model_convert_help(stderr);
    return 2;
  }
  return 0;
}

int ct_cmd_model_convert(int argc, char **argv) {
  const char *opt[3] = {NULL, NULL, NULL}, *kind = "";
  int axes[3] = {0, 0, 0}, have_axes = 0;
  long long shard = 10ll << 30;
  ct_dtype dt = CT_DTYPE_F32;
  int rc = convert_args(argc, argv, opt, axes, &have_axes, &shard, &dt);
  if (rc) return rc < 0 ? 0 : rc;
  if (!strcmp(opt[2], "bfl") && dt != CT_DTYPE_F32) {
    fprintf(stderr, "ctuner model convert: --layout bfl writes F32 (--dtype is for diffusers)\n");
    return 2;
  }
  ct_err err = {0};
  ct_mmdit *m = NULL;
  char src[4096];
  rc = convert_open(opt[0], have_axes ? axes : NULL, &m, &kind, src, sizeof src, &err);
  if (!rc &&
      (!strcmp(opt[2], "diffusers") ? ct_mmdit_save_diffusers(m, opt[1], (size_t)shard, dt, &err)
                                    : ct_mmdit_save(m, opt[1], &err)))
    rc = 1;
  if (rc == 1) fprintf(stderr, "ctuner model convert: %s\n", err.msg);
  if (!rc) {
    const ct_mmdit_config *c = ct_mmdit_cfg(m);
    size_t n = 0;
    ct_mmdit_table(m, &n);
    printf(
        "{\"from\": \"%s\", \"from_layout\": \"%s\", \"to\": \"%s\", \"layout\": "
        "\"%s\", \"hidden\": %d, \"heads\": %d, \"num_layers\": %d, "
        "\"num_single_layers\": %d, \"guidance_embeds\": %s, \"tensors\": %zu, "
        "\"params\": %zu}\n",
        src, kind, opt[1], opt[2], c->hidden, c->heads, c->depth_double, c->depth_single,
        c->guidance_embed ? "true" : "false", n, ct_mmdit_numel(m));
  }
  ct_mmdit_free(m);
  return rc;
}

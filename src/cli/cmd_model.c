/* `ctuner model check` and `ctuner model info`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "ctuner/mmdit.h"

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

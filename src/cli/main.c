/* ctuner command-line entry point: parses the subcommand and dispatches.
 * The CLI is the only part of the project that prints results to stdout and
 * chooses exit codes (0 success, 1 failure of the job, 2 usage error). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "ctuner/json.h"
#include "ctuner/log.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ctuner [--log-level debug|info|warn|error] <command> [options]\n"
          "\n"
          "commands:\n"
          "  model check      run forward and backward on a PyTorch golden file and compare\n"
          "  model info       print a preset's configuration and parameter count\n"
          "  bench step       time forward + backward + AdamW of a preset on random data\n"
          "  bench memory     bytes per rank by category beside the ZeRO formula\n"
          "  train            train the MMDiT (flow matching) from a SimpleTuner-style config\n"
          "                   (mpirun -np N ctuner train ...: data parallel / ZeRO over N ranks)\n"
          "  cache            discover the data and build its latent and text caches (docs/data.md)\n"
          "  launch           run train under mpirun as an Accelerate config describes\n"
          "  sample           generate images from a checkpoint\n"
          "  checkpoint export  one Flux-layout safetensors file (f32 or bf16) from a checkpoint\n"
          "  dataset synth    write the synthetic coloured-shapes dataset (images + captions)\n"
          "  dataset prompts  print captions of the synthetic dataset (--held-out: unseen ones)\n"
          "  eval synth       judge colour and shape of images against their prompts\n"
          "  storage          ls/get/put/rm/sync objects in an S3 bucket or a directory; bench the pool\n"
          "\n"
          "Run 'ctuner <command> --help' for a command's options.\n");
}

int ct_cli_opt(int argc, char **argv, int *i, const char *key, const char **val) {
  const char *a = argv[*i];
  size_t kl = strlen(key);
  if (strncmp(a, "--", 2) || strncmp(a + 2, key, kl)) return 0;
  if (a[2 + kl] == '=') {
    *val = a + 3 + kl;
    return 1;
  }
  if (a[2 + kl] != '\0') return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "ctuner: option --%s needs a value\n", key);
    return -1;
  }
  *val = argv[++*i];
  return 1;
}

int ct_cli_int(const char *key, const char *val, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(val, &end, 10);
  if (errno || end == val || *end || v < lo || v > hi) {
    fprintf(stderr, "ctuner: --%s=%s: expected an integer in [%ld, %ld]\n", key, val, lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

int ct_cli_float(const char *key, const char *val, double *out) {
  char *end;
  errno = 0;
  double v = strtod(val, &end);
  if (errno || end == val || *end) {
    fprintf(stderr, "ctuner: --%s=%s: expected a number\n", key, val);
    return -1;
  }
  *out = v;
  return 0;
}

void ct_cli_json_str(FILE *f, const char *s) { ct_json_fput_str(f, s); }

int main(int argc, char **argv) {
  int i = 1;
  const char *lv = NULL;
  while (i < argc && !strncmp(argv[i], "--log-level", 11)) {
    int r = ct_cli_opt(argc, argv, &i, "log-level", &lv);
    if (r < 0) return 2;
    int l = ct_log_level_parse(lv);
    if (l < 0) {
      fprintf(stderr, "ctuner: --log-level=%s: expected debug, info, warn, error or off\n", lv);
      return 2;
    }
    ct_log_set_level((ct_log_level)l);
    i++;
  }
  if (i >= argc) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[i];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "model")) return ct_cmd_model(argc - i, argv + i);
  if (!strcmp(cmd, "bench")) return ct_cmd_bench(argc - i, argv + i);
  if (!strcmp(cmd, "train")) return ct_cmd_train(argc - i, argv + i);
  if (!strcmp(cmd, "cache")) return ct_cmd_cache(argc - i, argv + i);
  if (!strcmp(cmd, "sample")) return ct_cmd_sample(argc - i, argv + i);
  if (!strcmp(cmd, "dataset")) return ct_cmd_dataset(argc - i, argv + i);
  if (!strcmp(cmd, "eval")) return ct_cmd_eval(argc - i, argv + i);
  if (!strcmp(cmd, "launch")) return ct_cmd_launch(argc - i, argv + i);
  if (!strcmp(cmd, "checkpoint")) return ct_cmd_checkpoint(argc - i, argv + i);
  if (!strcmp(cmd, "storage")) return ct_cmd_storage(argc - i, argv + i);
  fprintf(stderr, "ctuner: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return 2;
}

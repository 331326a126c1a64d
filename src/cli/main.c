/* ctuner command-line entry point: parses the subcommand and dispatches.
 * The only place in the project that prints results to stdout or calls exit(). */
#include <stdio.h>
#include <string.h>

#include "ctuner/status.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ctuner <command> [options]\n"
          "\n"
          "commands:\n"
          "  model check   compare forward/backward against a PyTorch golden file\n"
          "  bench step    time one training step of a preset\n"
          "\n"
          "Run 'ctuner <command> --help' for a command's options.\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  fprintf(stderr, "ctuner: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}

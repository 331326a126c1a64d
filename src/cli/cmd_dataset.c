/* `ctuner dataset synth`: writes the synthetic coloured-shapes dataset;
 * `ctuner dataset prompts`: prints captions of drawn specs (e.g. held-out ones);
 * `ctuner dataset parquet`: dumps a Parquet file as JSON lines (cmd_parquet.c). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ctuner/synth.h"

void ct_cmd_dataset_synth_help(FILE *f) {
  fprintf(f,
          "usage: ctuner dataset synth --out DIR --count N [--seed S] [--size WxH] [--force]\n"
          "\n"
          "Writes N images of coloured shapes into DIR (created if missing) as\n"
          "000000.png ... (about 20%% JPEG, quality 95), each with a same-name .txt\n"
          "caption such as \"a small red circle at the top left on a white background\".\n"
          "Sizes vary among 32x32, 48x32, 32x48, 64x64, 64x48, 48x64, 96x64 and 64x96,\n"
          "or are all WxH with --size (each side 8..4096).\n"
          "The same seed (default 0) gives the same files. Held-out combinations of\n"
          "shape, colour and position are never drawn (see docs/synth.md).\n"
          "A non-empty DIR is refused unless --force, which first deletes the files a\n"
          "previous run wrote (NNNNNN.png/.jpg/.txt) and nothing else.\n"
          "Prints one JSON line: out, count, seed, png, jpeg.\n");
}

static int is_ours(const char *n) {
  size_t l = strlen(n);
  if (l != 10) return 0;
  for (int i = 0; i < 6; i++)
    if (n[i] < '0' || n[i] > '9') return 0;
  return !strcmp(n + 6, ".png") || !strcmp(n + 6, ".jpg") || !strcmp(n + 6, ".txt");
}

/* 0 if DIR is missing or empty (after removing our files when force), 1 if it
 * holds something, -1 on error (message printed). */
static int dir_state(const char *dir, int force) {
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return 0;
    fprintf(stderr, "ctuner dataset synth: %s: %s\n", dir, strerror(errno));
    return -1;
  }
  int other = 0, ours = 0;
  struct dirent *e;
  char path[8192];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (force && is_ours(e->d_name)) {
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      if (unlink(path) != 0) {
        fprintf(stderr, "ctuner dataset synth: cannot remove %s: %s\n", path, strerror(errno));
        closedir(d);
        return -1;
      }
      ours++;
    } else {
      other++;
    }
  }
  closedir(d);
  return force ? 0 : other > 0;
}

int ct_cmd_dataset_synth(int argc, char **argv) {
  const char *out = NULL, *v;
  long count = -1, seed = 0;
  int force = 0, fw = 0, fh = 0;
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_dataset_synth_help(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--force")) {
      force = 1;
    } else if ((r = ct_cli_opt(argc, argv, &i, "out", &out))) {
      if (r < 0) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "count", &v))) {
      if (r < 0 || ct_cli_int("count", v, 1, 10000000, &count)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "seed", &v))) {
      if (r < 0 || ct_cli_int("seed", v, 0, 0x7fffffffffffffffL, &seed)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "size", &v))) {
      char tail;
      if (r < 0) return 2;
      if (sscanf(v, "%dx%d%c", &fw, &fh, &tail) != 2 || fw < 8 || fh < 8 || fw > 4096 ||
          fh > 4096) {
        fprintf(stderr,
                "ctuner dataset synth: --size '%s': expected WxH with sides 8..4096, e.g. 64x64\n",
                v);
        return 2;
      }
    } else {
      fprintf(stderr, "ctuner dataset synth: unknown option '%s'\n", argv[i]);
      ct_cmd_dataset_synth_help(stderr);
      return 2;
    }
  }
  if (!out || !out[0] || count < 0) {
    fprintf(stderr, "ctuner dataset synth: --out DIR and --count N are required\n");
    ct_cmd_dataset_synth_help(stderr);
    return 2;
  }
  int ds = dir_state(out, force);
  if (ds < 0) return 1;
  if (ds > 0) {
    fprintf(stderr,
            "ctuner dataset synth: %s is not empty; use --force to overwrite a dataset there\n",
            out);
    return 1;
  }
  ct_err err = {0};
  if (ct_synth_write_dataset(out, (int)count, (uint64_t)seed, fw, fh, &err)) {
    fprintf(stderr, "ctuner dataset synth: %s\n", err.msg);
    return 1;
  }
  long jpeg = 0;
  for (long i = 0; i < count; i++) {
    int w, h, j;
    ct_synth_file_plan((uint64_t)seed, (uint64_t)i, &w, &h, &j);
    jpeg += j;
  }
  printf("{\"out\": ");
  ct_cli_json_str(stdout, out);
  printf(", \"count\": %ld, \"seed\": %ld, \"png\": %ld, \"jpeg\": %ld}\n", count, seed,
         count - jpeg, jpeg);
  return 0;
}

void ct_cmd_dataset_prompts_help(FILE *f) {
  fprintf(f,
          "usage: ctuner dataset prompts --count N [--seed S] [--held-out]\n"
          "\n"
          "Prints N captions of the synthetic dataset, one per line, drawn like\n"
          "'dataset synth' draws them (same seed, same captions). --held-out draws only\n"
          "the held-out shape x colour x position combinations that training never sees\n"
          "(docs/synth.md): prompts for judging how a model generalises.\n");
}

int ct_cmd_dataset_prompts(int argc, char **argv) {
  const char *v;
  long count = -1, seed = 0;
  int held = 0;
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_dataset_prompts_help(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--held-out")) {
      held = 1;
    } else if ((r = ct_cli_opt(argc, argv, &i, "count", &v))) {
      if (r < 0 || ct_cli_int("count", v, 1, 10000000, &count)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "seed", &v))) {
      if (r < 0 || ct_cli_int("seed", v, 0, 0x7fffffffffffffffL, &seed)) return 2;
    } else {
      fprintf(stderr, "ctuner dataset prompts: unknown option '%s'\n", argv[i]);
      ct_cmd_dataset_prompts_help(stderr);
      return 2;
    }
  }
  if (count < 0) {
    fprintf(stderr, "ctuner dataset prompts: --count N is required\n");
    ct_cmd_dataset_prompts_help(stderr);
    return 2;
  }
  for (long i = 0; i < count; i++) {
    ct_synth_spec s;
    char cap[256];
    ct_synth_draw((uint64_t)seed, (uint64_t)i, held, &s);
    ct_synth_caption(&s, cap, sizeof cap);
    printf("%s\n", cap);
  }
  return 0;
}

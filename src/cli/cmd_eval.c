/* `ctuner eval synth`: scores images of the synthetic dataset (ground truth or
 * a model's validation images) with the judge. */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli.h"
#include "ctuner/image.h"
#include "ctuner/synth.h"

void ct_cmd_eval_synth_help(FILE *f) {
  fprintf(f,
          "usage: ctuner eval synth --images DIR [--verbose]\n"
          "\n"
          "Judges every PNG/JPEG in DIR whose prompt is known: from the same-name .txt\n"
          "sidecar (first line), or else from the file name with '_' read as spaces\n"
          "(validation images step_<N>_<shortname>_<idx>_<W>x<H>.png). The judge finds\n"
          "the background from the border, the largest foreground blob, its colour\n"
          "(nearest palette colour) and its shape (normalised moments); see docs/synth.md.\n"
          "Prints JSON: images, color_accuracy, shape_accuracy, skipped (no prompt or\n"
          "unreadable); --verbose adds per_image. Exit status 1 if no image was scored.\n");
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_image(const char *n) {
  const char *dot = strrchr(n, '.');
  return dot && (!strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
}

/* The prompt of image `name` in dir: sidecar first line, else the file name. */
static int prompt_of(const char *dir, const char *name, char *buf, size_t n, int *from_sidecar) {
  char path[8192];
  const char *dot = strrchr(name, '.');
  int stem = (int)(dot - name);
  snprintf(path, sizeof path, "%s/%.*s.txt", dir, stem, name);
  FILE *f = fopen(path, "r");
  *from_sidecar = 0;
  if (f) {
    int ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    if (ok) {
      buf[strcspn(buf, "\r\n")] = '\0';
      *from_sidecar = 1;
      return 0;
    }
  }
  snprintf(buf, n, "%.*s", stem, name);
  for (char *p = buf; *p; p++)
    if (*p == '_' || *p == '-') *p = ' ';
  return 0;
}

int ct_cmd_eval_synth(int argc, char **argv) {
  const char *dir = NULL;
  int verbose = 0;
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_eval_synth_help(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--verbose") || !strcmp(argv[i], "-v")) {
      verbose = 1;
    } else if ((r = ct_cli_opt(argc, argv, &i, "images", &dir))) {
      if (r < 0) return 2;
    } else {
      fprintf(stderr, "ctuner eval synth: unknown option '%s'\n", argv[i]);
      ct_cmd_eval_synth_help(stderr);
      return 2;
    }
  }
  if (!dir) {
    fprintf(stderr, "ctuner eval synth: --images DIR is required\n");
    ct_cmd_eval_synth_help(stderr);
    return 2;
  }
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "ctuner eval synth: cannot open directory %s\n", dir);
    return 1;
  }
  char **names = NULL;
  size_t nn = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!is_image(e->d_name)) continue;
    if (nn == cap) {
      cap = cap ? 2 * cap : 64;
      char **nb = realloc(names, cap * sizeof *names);
      if (!nb) break;
      names = nb;
    }
    names[nn] = strdup(e->d_name);
    if (names[nn]) nn++;
  }
  closedir(d);
  if (nn) qsort(names, nn, sizeof *names, cmp_str);

  /* Per-image records are printed after the summary, so keep them in a memstream. */
  char *per = NULL;
  size_t perlen = 0;
  FILE *pf = open_memstream(&per, &perlen);
  long scored = 0, cok = 0, sok = 0, skipped = 0;
  for (size_t k = 0; k < nn; k++) {
    char path[8192], prompt[512];
    int side;
    ct_synth_spec want;
    ct_image img = {0};
    ct_synth_verdict v;
    ct_err err = {0};
    snprintf(path, sizeof path, "%s/%s", dir, names[k]);
    prompt_of(dir, names[k], prompt, sizeof prompt, &side);
    if (ct_synth_parse(prompt, &want, &err)) {
      fprintf(stderr, "ctuner eval synth: skipping %s: %s\n", names[k], err.msg);
      skipped++;
      continue;
    }
    if (ct_image_load(path, &img, &err) || ct_synth_judge(&img, &want, &v, &err)) {
      fprintf(stderr, "ctuner eval synth: skipping %s\n", err.msg);
      ct_image_free(&img);
      skipped++;
      continue;
    }
    if (pf && verbose) {
      fprintf(pf, "%s\n    {\"file\": ", scored ? "," : "");
      ct_cli_json_str(pf, names[k]);
      fprintf(pf, ", \"prompt\": ");
      ct_cli_json_str(pf, prompt);
      fprintf(
          pf,
          ", \"prompt_from\": \"%s\", \"size\": [%d, %d], \"color\": \"%s\", \"shape\": \"%s\", "
          "\"color_ok\": %s, \"shape_ok\": %s}",
          side ? "sidecar" : "filename", img.w, img.h,
          v.color_found >= 0 ? ct_synth_color_name(v.color_found) : "none",
          v.shape_found >= 0 ? ct_synth_shape_name(v.shape_found) : "none",
          v.color_ok ? "true" : "false", v.shape_ok ? "true" : "false");
    }
    scored++;
    cok += v.color_ok;
    sok += v.shape_ok;
    ct_image_free(&img);
  }
  if (pf) fclose(pf);
  printf("{\"images\": %ld, \"color_accuracy\": %.4f, \"shape_accuracy\": %.4f, \"skipped\": %ld",
         scored, scored ? (double)cok / scored : 0.0, scored ? (double)sok / scored : 0.0, skipped);
  if (verbose) printf(", \"per_image\": [%s\n  ]", per ? per : "");
  printf("}\n");
  free(per);
  for (size_t k = 0; k < nn; k++) free(names[k]);
  free(names);
  if (!scored) {
    fprintf(stderr,
            "ctuner eval synth: no image in %s could be scored (%zu image files, %ld skipped)\n",
            dir, nn, skipped);
    return 1;
  }
  return 0;
}

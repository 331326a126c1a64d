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
          "the background (border median, nearest of white/black/grey), the largest\n"
          "foreground blob, its colour (nearest palette colour), shape (normalised\n"
          "moments), size (side from the area: small/medium/large) and position (centre\n"
          "against the generator's 3x3 grid for that side); see docs/synth.md.\n"
          "Prints JSON: images, color_accuracy, shape_accuracy, size_accuracy,\n"
          "position_accuracy, background_accuracy, all_accuracy (all five right at once),\n"
          "skipped (no prompt or unreadable), and confusion (per attribute: counts[wanted]\n"
          "[found], the last column 'none'); --verbose adds per_image. Exit status 1 if no\n"
          "image was scored.\n");
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

/* The judged attributes: JSON names, labels, palette offset and count. */
enum { NATTR = 5, MAXL = 9 };
static const char *bg_name(int i) {
  return ct_synth_color_name(i);
}
static const struct {
  const char *json, *acc;
  const char *(*name)(int);
  int lo, n;
} ATTR[NATTR] = {
    {"color", "color", ct_synth_color_name, 0, 8},
    {"shape", "shape", ct_synth_shape_name, 0, 3},
    {"size", "size", ct_synth_size_name, 0, 3},
    {"position", "position", ct_synth_position_name, 0, 9},
    {"background", "background", bg_name, 8, 3},
};

static void attrs(const ct_synth_spec *w, const ct_synth_verdict *v, int wanted[NATTR],
                  int found[NATTR], int oks[NATTR]) {
  wanted[0] = w->color, found[0] = v->color_found, oks[0] = v->color_ok;
  wanted[1] = w->shape, found[1] = v->shape_found, oks[1] = v->shape_ok;
  wanted[2] = w->size, found[2] = v->size_found, oks[2] = v->size_ok;
  wanted[3] = w->pos, found[3] = v->pos_found, oks[3] = v->pos_ok;
  wanted[4] = w->bg, found[4] = v->bg_found, oks[4] = v->bg_ok;
}

/* "name": {"labels": [...], "counts": [[per found label..., none], ...]} (rows: wanted). */
static void print_confusion(int a, long conf[MAXL][MAXL + 1]) {
  printf("%s\n  \"%s\": {\"labels\": [", a ? "," : "", ATTR[a].json);
  for (int i = 0; i < ATTR[a].n; i++)
    printf("%s\"%s\"", i ? ", " : "", ATTR[a].name(ATTR[a].lo + i));
  printf("], \"counts\": [");
  for (int i = 0; i < ATTR[a].n; i++) {
    printf("%s[", i ? ", " : "");
    for (int j = 0; j <= ATTR[a].n; j++) printf("%s%ld", j ? ", " : "", conf[i][j]);
    printf("]");
  }
  printf("]}");
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
  long scored = 0, skipped = 0, ok[NATTR + 1] = {0};
  long conf[NATTR][MAXL][MAXL + 1];
  memset(conf, 0, sizeof conf);
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
    int wanted[NATTR], found[NATTR], oks[NATTR];
    attrs(&want, &v, wanted, found, oks);
    if (pf && verbose) {
      fprintf(pf, "%s\n    {\"file\": ", scored ? "," : "");
      ct_cli_json_str(pf, names[k]);
      fprintf(pf, ", \"prompt\": ");
      ct_cli_json_str(pf, prompt);
      fprintf(pf, ", \"prompt_from\": \"%s\", \"size_px\": [%d, %d]", side ? "sidecar" : "filename",
              img.w, img.h);
      for (int a = 0; a < NATTR; a++)
        fprintf(pf, ", \"%s\": \"%s\"", ATTR[a].json,
                found[a] >= 0 ? ATTR[a].name(found[a]) : "none");
      for (int a = 0; a < NATTR; a++)
        fprintf(pf, ", \"%s_ok\": %s", ATTR[a].json, oks[a] ? "true" : "false");
      fprintf(pf, ", \"all_ok\": %s}", v.all_ok ? "true" : "false");
    }
    scored++;
    for (int a = 0; a < NATTR; a++) {
      ok[a] += oks[a];
      int row = wanted[a] - ATTR[a].lo, col = found[a] < 0 ? ATTR[a].n : found[a] - ATTR[a].lo;
      if (row >= 0 && row < ATTR[a].n && col >= 0 && col <= ATTR[a].n) conf[a][row][col]++;
    }
    ok[NATTR] += v.all_ok;
    ct_image_free(&img);
  }
  if (pf) fclose(pf);
  printf("{\"images\": %ld", scored);
  for (int a = 0; a < NATTR; a++)
    printf(", \"%s_accuracy\": %.4f", ATTR[a].acc, scored ? (double)ok[a] / scored : 0.0);
  printf(", \"all_accuracy\": %.4f, \"skipped\": %ld,\n \"confusion\": {",
         scored ? (double)ok[NATTR] / scored : 0.0, skipped);
  for (int a = 0; a < NATTR; a++) print_confusion(a, conf[a]);
  printf("}");
  if (verbose) printf(",\n \"per_image\": [%s\n  ]", per ? per : "");
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

/* `ctuner bench discovery`: images per second of the data loader's discovery
 * (ct_discover: listing, image headers and captions on every core) against
 * decoding every image (ct_image_load, every core), on one directory. Prints
 * one JSON line. Used by scripts/bench_data.sh (docs/performance.md). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "ctuner/data.h"
#include "ctuner/image.h"
#include "ctuner/parallel.h"

void ct_cmd_bench_discovery_help(FILE *f) {
  fprintf(f,
          "usage: ctuner bench discovery --dir DIR [--decode] [--limit N]\n"
          "\n"
          "Runs the data loader's discovery on DIR (image headers and .txt captions,\n"
          "one thread per core) and prints one JSON line: mode, files, seconds,\n"
          "images_per_s, threads. With --decode the sizes come from decoding every\n"
          "image (the cost header-only discovery avoids) on top of the listing and\n"
          "captions; --limit N decodes only the first N.\n");
}

int ct_cmd_bench_discovery(int argc, char **argv) {
  const char *dir = NULL, *v;
  int decode = 0;
  long limit = 0;
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_bench_discovery_help(stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--decode")) {
      decode = 1;
      continue;
    }
    if ((r = ct_cli_opt(argc, argv, &i, "dir", &v))) {
      if (r < 0) return 2;
      dir = v;
      continue;
    }
    if ((r = ct_cli_opt(argc, argv, &i, "limit", &v))) {
      if (r < 0 || ct_cli_int("limit", v, 1, 100000000, &limit)) return 2;
      continue;
    }
    fprintf(stderr, "ctuner bench discovery: unknown argument '%s'\n", argv[i]);
    ct_cmd_bench_discovery_help(stderr);
    return 2;
  }
  if (!dir) {
    ct_cmd_bench_discovery_help(stderr);
    return 2;
  }
  ct_ds_listing d;
  ct_err err = {0};
  double t0 = ct_time_now();
  if (ct_ds_list_dir(dir, &d, &err)) {
    fprintf(stderr, "ctuner bench discovery: %s\n", err.msg);
    return 1;
  }
  double secs = ct_time_now() - t0;
  size_t n = d.n, bad = d.bad;
  if (decode) { /* a discovery that decodes: the listing and captions, plus a decode per image */
    if (limit > 0 && (size_t)limit < n) n = (size_t)limit;
    const double listing = secs * (double)n / (double)(d.n ? d.n : 1);
    t0 = ct_time_now();
#pragma omp parallel for schedule(dynamic, 4) reduction(+ : bad)
    for (long i = 0; i < (long)n; i++) {
      char path[8192];
      snprintf(path, sizeof path, "%s/%s", dir, d.rel[i]);
      ct_image img = {0};
      ct_err e = {0};
      if (ct_image_load(path, &img, &e)) bad++;
      ct_image_free(&img);
    }
    secs = listing + ct_time_now() - t0;
  }
  printf(
      "{\"mode\": \"%s\", \"files\": %zu, \"unreadable\": %zu, \"seconds\": %.4f, "
      "\"images_per_s\": %.1f, "
      "\"threads\": %d}\n",
      decode ? "full_decode" : "discovery_headers", n, bad, secs,
      (double)n / (secs > 0 ? secs : 1e-9), omp_get_max_threads());
  ct_ds_listing_free(&d);
  return 0;
}

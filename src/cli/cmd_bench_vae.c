/* `ctuner bench vae`: time and memory of a VAE encode and decode of one
 * image, tiled or not. Prints one JSON line: the seconds of each, the peak of
 * ctuner's own allocations (ct_mem) and the process's peak RSS. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli/cli.h"
#include "ctuner/alloc.h"
#include "ctuner/parallel.h"
#include "ctuner/rng.h"
#include "ctuner/vae.h"

void ct_cmd_bench_vae_help(FILE *f) {
  fprintf(f,
          "usage: ctuner bench vae [--vae DIR | --sd] [--size N] [--tile T] [--seed S]\n"
          "\n"
          "Encodes an N x N random image (default 1024) and decodes its latent with the\n"
          "VAE in DIR (config.json + diffusion_pytorch_model.safetensors), or with a\n"
          "randomly initialised one of Stable Diffusion's shape (--sd: block_out_channels\n"
          "128, 256, 512, 512; 83.7 M parameters). --tile T: tiled, T pixels per tile\n"
          "(0: untiled; default 512). Prints one JSON line.\n");
}

int ct_cmd_bench_vae(int argc, char **argv) {
  const char *dir = NULL, *v;
  long size = 1024, tile = 512, seed = 0;
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_bench_vae_help(stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--sd")) {
      dir = NULL;
      continue;
    }
    if ((r = ct_cli_opt(argc, argv, &i, "vae", &v))) {
      if (r < 0) return 2;
      dir = v;
      continue;
    }
    if ((r = ct_cli_opt(argc, argv, &i, "size", &v))) {
      if (r < 0 || ct_cli_int("size", v, 8, 16384, &size)) return 2;
      continue;
    }
    if ((r = ct_cli_opt(argc, argv, &i, "tile", &v))) {
      if (r < 0 || ct_cli_int("tile", v, 0, 16384, &tile)) return 2;
      continue;
    }
    if ((r = ct_cli_opt(argc, argv, &i, "seed", &v))) {
      if (r < 0 || ct_cli_int("seed", v, 0, 1L << 40, &seed)) return 2;
      continue;
    }
    fprintf(stderr, "ctuner bench vae: unknown argument '%s'\n", argv[i]);
    ct_cmd_bench_vae_help(stderr);
    return 2;
  }
  ct_err err = {0};
  ct_vae *vae = NULL;
  if (dir) {
    if (ct_vae_from_pretrained(dir, &vae, &err)) {
      fprintf(stderr, "ctuner bench vae: %s\n", err.msg);
      return 1;
    }
  } else {
    ct_vae_config c;
    ct_vae_config_defaults(&c);
    c.nblocks = 4;
    c.block_out_channels[0] = 128, c.block_out_channels[1] = 256, c.block_out_channels[2] = 512,
    c.block_out_channels[3] = 512;
    c.layers_per_block = 2;
    if (ct_vae_new(&c, (uint64_t)seed, &vae, &err)) {
      fprintf(stderr, "ctuner bench vae: %s\n", err.msg);
      return 1;
    }
  }
  const ct_vae_config *c = ct_vae_cfg(vae);
  const int f = ct_vae_factor(c), N = (int)size, lc = c->latent_channels;
  if (N % f) {
    fprintf(stderr, "ctuner bench vae: --size %d is not a multiple of the VAE's factor %d\n", N, f);
    ct_vae_free(vae);
    return 2;
  }
  const size_t npx = (size_t)3 * N * N, nl = (size_t)lc * (N / f) * (N / f);
  float *x = malloc(npx * sizeof(float)), *mean = malloc(nl * sizeof(float)),
        *y = malloc(npx * sizeof(float));
  if (!x || !mean || !y) {
    fprintf(stderr, "ctuner bench vae: out of memory\n");
    return 1;
  }
  ct_rng_fill_uniform(x, npx, (uint64_t)seed, 1, 0, -1.0f, 1.0f);
  ct_mem_stats m0;
  ct_mem_get_stats(&m0);
  ct_mem_reset_peak();
  double t0 = ct_time_now();
  int rc = 0;
  if (ct_vae_encode_tiled(vae, 1, N, N, x, (int)tile, mean, NULL, &err)) rc = 1;
  double t1 = ct_time_now();
  if (!rc && ct_vae_decode_tiled(vae, 1, N / f, N / f, mean, (int)tile, y, &err)) rc = 1;
  double t2 = ct_time_now();
  if (rc) {
    fprintf(stderr, "ctuner bench vae: %s\n", err.msg);
  } else {
    ct_mem_stats m;
    ct_mem_get_stats(&m);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf(
        "{\"size\": %d, \"tile\": %ld, \"params\": %zu, \"encode_s\": %.2f, \"decode_s\": %.2f, "
        "\"peak_ctuner_bytes\": %zu, \"params_bytes\": %zu, \"peak_rss_bytes\": %lld}\n",
        N, tile, ct_vae_numel(vae), t1 - t0, t2 - t1, m.total_peak, m0.total_current,
        (long long)ru.ru_maxrss * 1024);
  }
  free(x), free(mean), free(y);
  ct_vae_free(vae);
  return rc;
}

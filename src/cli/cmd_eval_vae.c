/* `ctuner eval vae`: reconstruction quality of a VAE on a directory of images
 * (e.g. held-out synthetic images): each image is centre-cropped to a
 * multiple of the VAE's factor, encoded (the distribution's mean), decoded,
 * and compared in 8-bit units. Prints JSON: images, psnr (over all pixels),
 * psnr_min (worst image), skipped, latent_rms and logvar_mean (how much of the
 * latent the sampling noise drowns). */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli.h"
#include "ctuner/codec.h"
#include "ctuner/image.h"
#include "ctuner/vae.h"

void ct_cmd_eval_vae_help(FILE *f) {
  fprintf(f,
          "usage: ctuner eval vae --vae DIR --images DIR [--limit N] [--tile T] [--grid OUT.png]\n"
          "\n"
          "Encodes and decodes every PNG/JPEG/WebP in --images with the VAE in DIR\n"
          "(config.json + diffusion_pytorch_model.safetensors, e.g. OUTPUT_DIR/vae after\n"
          "model_type vae training) and prints JSON: images, psnr (dB, over all pixels),\n"
          "psnr_min (the worst image), skipped. --grid writes originals over\n"
          "reconstructions for the first 8 images; --tile T encodes/decodes tiled.\n");
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int ct_cmd_eval_vae(int argc, char **argv) {
  const char *vdir = NULL, *idir = NULL, *grid = NULL, *v;
  long limit = 0, tile = 0;
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_eval_vae_help(stdout);
      return 0;
    }
    if ((r = ct_cli_opt(argc, argv, &i, "vae", &v))) {
      if (r < 0) return 2;
      vdir = v;
    } else if ((r = ct_cli_opt(argc, argv, &i, "images", &v))) {
      if (r < 0) return 2;
      idir = v;
    } else if ((r = ct_cli_opt(argc, argv, &i, "grid", &v))) {
      if (r < 0) return 2;
      grid = v;
    } else if ((r = ct_cli_opt(argc, argv, &i, "limit", &v))) {
      if (r < 0 || ct_cli_int("limit", v, 1, 1L << 30, &limit)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "tile", &v))) {
      if (r < 0 || ct_cli_int("tile", v, 0, 16384, &tile)) return 2;
    } else {
      fprintf(stderr, "ctuner eval vae: unknown argument '%s'\n", argv[i]);
      ct_cmd_eval_vae_help(stderr);
      return 2;
    }
  }
  if (!vdir || !idir) {
    ct_cmd_eval_vae_help(stderr);
    return 2;
  }
  ct_err err = {0};
  ct_vae *vae = NULL;
  if (ct_vae_from_pretrained(vdir, &vae, &err)) {
    fprintf(stderr, "ctuner eval vae: %s\n", err.msg);
    return 1;
  }
  const int f = ct_vae_factor(ct_vae_cfg(vae)), lc = ct_vae_cfg(vae)->latent_channels;
  DIR *d = opendir(idir);
  if (!d) {
    fprintf(stderr, "ctuner eval vae: %s: cannot open directory\n", idir);
    ct_vae_free(vae);
    return 1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    const char *dot = strrchr(e->d_name, '.');
    if (!dot || (strcasecmp(dot, ".png") && strcasecmp(dot, ".jpg") && strcasecmp(dot, ".jpeg") &&
                 strcasecmp(dot, ".webp")))
      continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      char **nn = realloc(names, cap * sizeof *nn);
      if (!nn) break;
      names = nn;
    }
    names[n++] = strdup(e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, cmp_str);
  if (limit && (size_t)limit < n) n = (size_t)limit;
  double se_all = 0, px_all = 0, worst = 1e9, lv_sum = 0, m_sq = 0, nlat = 0;
  long scored = 0, skipped = 0;
  ct_image g = {0};
  int gw = 0, gh = 0, gcount = 0;
  for (size_t k = 0; k < n; k++) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", idir, names[k]);
    ct_image img = {0}, c = {0};
    if (ct_image_load(path, &img, &err)) {
      skipped++;
      continue;
    }
    const int W = img.w / f * f, H = img.h / f * f;
    if (W < f || H < f || ct_image_crop(&img, (img.w - W) / 2, (img.h - H) / 2, W, H, &c, &err)) {
      skipped++;
      ct_image_free(&img);
      continue;
    }
    const size_t npx = (size_t)3 * W * H, nl = (size_t)lc * (W / f) * (H / f);
    float *x = malloc(npx * sizeof(float)), *m = malloc(nl * sizeof(float)),
          *y = malloc(npx * sizeof(float)), *lv = malloc(nl * sizeof(float));
    uint8_t *rgb = malloc(npx);
    int ok = x && m && y && rgb && !ct_pixel_encode(c.px, W, H, 1, x, &err) &&
             !ct_vae_encode_tiled(vae, 1, H, W, x, (int)tile, m, lv, &err) &&
             !ct_vae_decode_tiled(vae, 1, H / f, W / f, m, (int)tile, y, &err) &&
             !ct_pixel_decode(y, W, H, 1, rgb, &err);
    if (ok) {
      for (size_t i = 0; i < nl; i++) lv_sum += lv[i], m_sq += (double)m[i] * m[i], nlat += 1;
      double se = 0;
      for (size_t i = 0; i < npx; i++) {
        const double dd = (double)rgb[i] - c.px[i];
        se += dd * dd;
      }
      const double mse = se / (double)npx, ps = mse > 0 ? 10 * log10(255.0 * 255.0 / mse) : 99;
      if (ps < worst) worst = ps;
      se_all += se, px_all += (double)npx;
      scored++;
      if (grid && gcount < 8) { /* originals over reconstructions, images of the first one's size */
        if (!gcount) {
          gw = W, gh = H;
          if (ct_image_alloc(W * 8, H * 2, &g, &err)) grid = NULL;
        }
        if (grid && W == gw && H == gh) {
          for (int yy = 0; yy < H; yy++) {
            memcpy(g.px + ((size_t)yy * g.w + (size_t)gcount * W) * 3, c.px + (size_t)yy * W * 3,
                   (size_t)W * 3);
            memcpy(g.px + ((size_t)(yy + H) * g.w + (size_t)gcount * W) * 3,
                   rgb + (size_t)yy * W * 3, (size_t)W * 3);
          }
          gcount++;
        }
      }
    } else {
      fprintf(stderr, "ctuner eval vae: %s: %s\n", path, err.msg);
      skipped++;
    }
    free(x), free(m), free(y), free(rgb), free(lv);
    ct_image_free(&img);
    ct_image_free(&c);
  }
  if (grid && gcount && ct_image_save_png(grid, &g, &err))
    fprintf(stderr, "ctuner eval vae: %s\n", err.msg);
  ct_image_free(&g);
  for (size_t k = 0; k < n; k++) free(names[k]);
  free(names);
  ct_vae_free(vae);
  if (!scored) {
    fprintf(stderr, "ctuner eval vae: no image scored in %s\n", idir);
    return 1;
  }
  const double mse = se_all / px_all;
  printf(
      "{\"images\": %ld, \"psnr\": %.3f, \"psnr_min\": %.3f, \"skipped\": %ld, \"latent_rms\": "
      "%.4g, "
      "\"logvar_mean\": %.4g}\n",
      scored, mse > 0 ? 10 * log10(255.0 * 255.0 / mse) : 99.0, worst, skipped, sqrt(m_sq / nlat),
      lv_sum / nlat);
  return 0;
}

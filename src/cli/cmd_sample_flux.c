/* `ctuner sample --pretrained DIR [--checkpoint C]`: images from a FLUX.1
 * pipeline directory, or from a training run's transformer/ on top of it, as
 * diffusers' FluxPipeline makes them (ct_flux_sampler, docs/flux.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "ctuner/image.h"
#include "ctuner/train.h"

int ct_cli_write_sample(const char *out, const char *out_dir, int k, const char *prompt,
                        const ct_image *im) {
  char path[4200];
  ct_err err = {0};
  if (out)
    snprintf(path, sizeof path, "%s", out);
  else
    snprintf(path, sizeof path, "%s/%04d.png", out_dir, k);
  if (ct_image_save_png(path, im, &err)) {
    fprintf(stderr, "ctuner sample: %s\n", err.msg);
    return 1;
  }
  if (out_dir) {
    snprintf(path, sizeof path, "%s/%04d.txt", out_dir, k);
    FILE *f = fopen(path, "w");
    if (f) fputs(prompt, f), fclose(f);
  }
  return 0;
}

/* FluxKontextPipeline's image and sizes: the output as max_area sets it (the
 * pipeline warns when it adjusts; so does this), the reference as it would be
 * resized — refused when it would, as ctuner does not resize it (LANCZOS). */
static int kontext_setup(const ct_flux_sample_args *a, ct_flux_sampler *s, int f, int *w, int *h) {
  ct_err err = {0};
  ct_image ref;
  if (!a->image) { /* FluxKontextPipeline without an image: its output size only */
    const int ow = *w, oh = *h;
    ct_kontext_sizes(a->max_area, 2 * f, a->auto_resize, w, h, NULL, NULL);
    if (*w != ow || *h != oh)
      fprintf(stderr,
              "ctuner sample: warning: height and width adjusted to %d and %d for --max_area %ld "
              "(as FluxKontextPipeline does)\n",
              *h, *w, a->max_area);
    return 0;
  }
  if (ct_image_load(a->image, &ref, &err)) {
    fprintf(stderr, "ctuner sample: --image: %s\n", err.msg);
    return 1;
  }
  int ow = *w, oh = *h, rw = ref.w, rh = ref.h;
  if (ct_kontext_sizes(a->max_area, 2 * f, a->auto_resize, w, h, &rw, &rh)) {
    fprintf(stderr,
            "ctuner sample: --image %s is %dx%d; FluxKontextPipeline would resize it to %dx%d "
            "(%s), which ctuner does not do: give it that size%s\n",
            a->image, ref.w, ref.h, rw, rh,
            a->auto_resize ? "_auto_resize: the nearest PREFERRED_KONTEXT_RESOLUTIONS"
                           : "multiples of 2 x the VAE factor",
            a->auto_resize ? ", or --no_auto_resize" : "");
    ct_image_free(&ref);
    return 1;
  }
  if (*w != ow || *h != oh)
    fprintf(stderr,
            "ctuner sample: warning: height and width adjusted to %d and %d for --max_area %ld "
            "(as FluxKontextPipeline does)\n",
            *h, *w, a->max_area);
  int rc = ct_flux_sampler_reference(s, &ref, &err) != CT_OK;
  if (rc) fprintf(stderr, "ctuner sample: --image: %s\n", err.msg);
  ct_image_free(&ref);
  return rc;
}

int ct_cmd_sample_flux(const ct_flux_sample_args *a, const char *const *prompts, int n) {
  ct_err err = {0};
  char tdir[4200], own[4200];
  struct stat sb;
  const char *lora = a->lora;
  int full = 0; /* the checkpoint holds a transformer (else a LoRA run's adapter) */
  if (a->ckpt_dir) {
    snprintf(tdir, sizeof tdir, "%s/transformer", a->ckpt_dir);
    snprintf(own, sizeof own, "%s/pytorch_lora_weights.safetensors", a->ckpt_dir);
    full = !stat(tdir, &sb) && S_ISDIR(sb.st_mode);
    if (!full && stat(own, &sb)) {
      fprintf(stderr,
              "ctuner sample: %s has neither transformer/ nor pytorch_lora_weights.safetensors "
              "(a FLUX.1 pipeline run's checkpoint)\n",
              a->ckpt_dir);
      return 1;
    }
    if (!full && !lora) lora = own; /* a LoRA run: the pipeline's transformer + its adapter */
  }
  if (a->out_dir && stat(a->out_dir, &sb) != 0 && mkdir(a->out_dir, 0755) != 0) {
    fprintf(stderr, "ctuner sample: cannot create --out-dir %s\n", a->out_dir);
    return 1;
  }
  ct_flux_sampler *s = NULL;
  if (ct_flux_sampler_open(a->pretrained, a->flavour, a->max_sequence_length, full ? tdir : NULL,
                           &s, &err) ||
      (lora && ct_flux_sampler_lora(s, lora, a->lora_scale, &err))) {
    ct_flux_sampler_free(s);
    fprintf(stderr, "ctuner sample: %s\n", err.msg);
    return 1;
  }
  const int f = ct_flux_sampler_factor(s);
  int w = a->width > 0 ? a->width : 128 * f, h = a->height > 0 ? a->height : 128 * f;
  if ((a->image || (a->flavour && !strcmp(a->flavour, "kontext"))) &&
      kontext_setup(a, s, f, &w, &h)) {
    ct_flux_sampler_free(s);
    return 1;
  }
  const int steps = a->steps > 0 ? a->steps : 28;
  const float g = a->guidance >= 0 ? (float)a->guidance : 3.5f;
  const uint64_t seed = a->seed >= 0 ? (uint64_t)a->seed : 0;
  const int per = a->per > 0 ? a->per : 1, total = n * per;
  const size_t lat = (size_t)16 * (size_t)(h / f) * (size_t)(w / f);
  float *x = malloc(lat * sizeof *x);
  int rc = x ? 0 : 1, written = 0;
  for (int k = 0; k < total && !rc; k++) { /* one image at a time: memory of one */
    ct_image im;
    const char *pp[1] = {prompts[k / per]};
    ct_flux_sampler_noise(seed, (uint64_t)k, lat, x);
    if (ct_flux_sampler_run(s, pp, 1, w, h, steps, g, x, &im, &err)) {
      fprintf(stderr, "ctuner sample: %s\n", err.msg);
      rc = 1;
      break;
    }
    rc = ct_cli_write_sample(a->out, a->out_dir, k, pp[0], &im);
    ct_image_free(&im);
    written += !rc;
  }
  if (!rc)
    printf(
        "{\"images\": %d, \"width\": %d, \"height\": %d, \"steps\": %d, \"guidance\": %g, "
        "\"pretrained\": \"%s\", \"transformer\": \"%s\", \"lora\": \"%s\", \"lora_scale\": "
        "%g, \"out\": \"%s\"}\n",
        written, w, h, steps, g, a->pretrained, full ? tdir : "(the pipeline's)", lora ? lora : "",
        lora ? a->lora_scale : 0.0, a->out ? a->out : a->out_dir);
  free(x);
  ct_flux_sampler_free(s);
  return rc;
}

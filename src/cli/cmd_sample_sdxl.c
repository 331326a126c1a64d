/* `ctuner sample --pretrained DIR` of a StableDiffusionXLPipeline directory
 * (or --model_family sdxl): images as diffusers' StableDiffusionXLPipeline
 * makes them (ct_sdxl_sampler, docs/sdxl.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "ctuner/diffusion.h"
#include "ctuner/fs.h"
#include "ctuner/image.h"
#include "ctuner/json.h"

int ct_cli_is_sdxl_pipeline(const char *dir) {
  char path[4200];
  snprintf(path, sizeof path, "%s/model_index.json", dir);
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  char buf[16384];
  const size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  ct_json *j = NULL;
  ct_err err = {0};
  if (ct_json_parse(buf, n, &j, &err)) return 0;
  const ct_json *c = ct_json_get(j, "_class_name");
  const int yes = c && c->type == CT_JSON_STRING && !strcmp(c->str, "StableDiffusionXLPipeline");
  ct_json_free(j);
  return yes;
}

/* The run's settings: the pipeline's defaults where an option is unset. */
static int settings(const ct_sdxl_sample_args *a, ct_sdxl_sampler *s, ct_ddpm_config *sc,
                    ct_sdxl_run *r) {
  ct_err err = {0};
  *sc = *ct_sdxl_sampler_sched(s);
  if (a->scheduler && ct_dsched_kind_parse(a->scheduler, &sc->kind, &err)) {
    fprintf(stderr, "ctuner sample: --scheduler: %s\n", err.msg);
    return 2;
  }
  int px;
  ct_sdxl_sampler_geometry(s, NULL, NULL, NULL, &px);
  /* the pipeline's default: unet sample_size x the VAE factor; 1024 for SDXL 1.0 */
  r->width = a->width > 0 ? a->width : px;
  r->height = a->height > 0 ? a->height : px;
  r->negative = a->negative;
  r->sched = sc;
  r->opts.steps = a->steps > 0 ? a->steps : 50; /* the pipeline's num_inference_steps */
  r->opts.guidance_scale = a->guidance >= 0 ? a->guidance : 5.0;
  r->opts.guidance_rescale = a->guidance_rescale;
  return 0;
}

int ct_cmd_sample_sdxl(const ct_sdxl_sample_args *a, const char *const *prompts, int n) {
  ct_err err = {0};
  struct stat sb;
  if (a->out_dir && stat(a->out_dir, &sb) != 0 && mkdir(a->out_dir, 0755) != 0) {
    fprintf(stderr, "ctuner sample: cannot create --out-dir %s\n", a->out_dir);
    return 1;
  }
  ct_sdxl_sampler *s = NULL;
  if (ct_sdxl_sampler_open(a->pretrained, NULL, &s, &err)) {
    fprintf(stderr, "ctuner sample: %s\n", err.msg);
    return 1;
  }
  ct_ddpm_config sc;
  ct_sdxl_run r = {0};
  int rc = settings(a, s, &sc, &r);
  int f, C;
  ct_sdxl_sampler_geometry(s, NULL, &f, &C, NULL);
  const uint64_t seed = a->seed >= 0 ? (uint64_t)a->seed : 0;
  const int per = a->per > 0 ? a->per : 1, total = n * per;
  const size_t lat = (size_t)C * (size_t)(r.height / f) * (size_t)(r.width / f);
  float *x = rc ? NULL : malloc(lat * sizeof *x);
  if (!rc && !x) rc = 1;
  int written = 0;
  ct_sdxl_sampler_progress(s, 1);
  for (int k = 0; k < total && !rc; k++) { /* one image at a time: memory of one */
    ct_image im;
    r.prompt = prompts[k / per];
    ct_sdxl_sampler_noise(seed, (uint64_t)k, lat, x);
    if (ct_sdxl_sampler_run(s, &r, x, &im, &err)) {
      fprintf(stderr, "ctuner sample: %s\n", err.msg);
      rc = 1;
      break;
    }
    rc = ct_cli_write_sample(a->out, a->out_dir, k, r.prompt, &im);
    ct_image_free(&im);
    written += !rc;
  }
  static const char *KIND[] = {"euler", "ddim", "dpm++2m"};
  if (!rc) {
    printf(
        "{\"images\": %d, \"width\": %d, \"height\": %d, \"steps\": %d, \"guidance_scale\": %g, "
        "\"guidance_rescale\": %g, \"scheduler\": \"%s\", \"negative_prompt\": ",
        written, r.width, r.height, r.opts.steps, r.opts.guidance_scale, r.opts.guidance_rescale,
        KIND[sc.kind]);
    if (a->negative)
      ct_cli_json_str(stdout, a->negative);
    else
      fputs("null", stdout);
    printf(", \"pretrained\": \"%s\", \"out\": \"%s\"}\n", a->pretrained,
           a->out ? a->out : a->out_dir);
  }
  free(x);
  ct_sdxl_sampler_free(s);
  return rc;
}

/* ctuner's SDXL sampling (src/train/sdxl_sampler.c) against diffusers'
 * StableDiffusionXLPipeline on the tiny pipeline tests/data/sdxl_pipe, from
 * the same initial latents (scripts/sdxl_sample_golden.py writes
 * sample_golden.safetensors): Euler (the pipeline's), DDIM and DPM++ 2M from
 * the same config, guidance > 1, a negative prompt, none (zeros) and "",
 * guidance_rescale. Final latents within 1e-3 (relative), images >= 40 dB:
 * the tolerances of FLUX.1's sample check (tests/test_flux_pipe.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/diffusion.h"
#include "ctuner/image.h"
#include "ctuner/json.h"
#include "ctuner/safetensors.h"
#include "ctuner/unet.h"
#include "harness.h"

#define pdata(rel) ct_test_data_in("CT_SDXL_PIPE_DATA", "sdxl_pipe", rel)
#define gt ct_test_tensor
#define rel ct_test_rel_err

static double psnr(const uint8_t *a, const float *ref, size_t n) {
  double se = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = a[i] / 255.0 - ref[i];
    se += d * d;
  }
  if (!isfinite(se)) return NAN; /* a NaN or Inf pixel: fails every >= dB check */
  return se > 0 ? 10 * log10(1.0 / (se / (double)n)) : 200;
}

static const char *jstr(const ct_json *o, const char *key) {
  const ct_json *v = ct_json_get(o, key);
  return v && v->type == CT_JSON_STRING ? v->str : NULL;
}

static double jnum(const ct_json *o, const char *key) {
  const ct_json *v = ct_json_get(o, key);
  return v && v->type == CT_JSON_NUMBER ? v->num : NAN;
}

/* One golden case: its run, its latents and image compared. */
static void check_case(int *ct_failed_, ct_sdxl_sampler *s, const ct_st_file *g, const ct_json *c,
                       int k, int W, int H, int steps) {
  ct_err e = {0};
  char name[64];
  size_t nl = 0, ni = 0;
  snprintf(name, sizeof name, "case%d.latents_in", k);
  float *x = gt(g, name, &nl);
  snprintf(name, sizeof name, "case%d.latents_out", k);
  float *lout = gt(g, name, NULL);
  snprintf(name, sizeof name, "case%d.image", k);
  float *img = gt(g, name, &ni);
  int mult, f, C;
  ct_sdxl_sampler_geometry(s, &mult, &f, &C, NULL);
  REQUIRE(x && lout && img && nl == (size_t)C * (H / f) * (W / f) && ni == (size_t)W * H * 3);
  ct_ddpm_config sc = *ct_sdxl_sampler_sched(s);
  const char *sched = jstr(c, "scheduler");
  REQUIRE(sched);
  CHECKF(!ct_dsched_kind_parse(sched, &sc.kind, &e), "%s", e.msg);
  const ct_json *neg = ct_json_get(c, "negative");
  ct_sdxl_run r = {.prompt = jstr(c, "prompt"),
                   .negative = neg && neg->type == CT_JSON_STRING ? neg->str : NULL,
                   .width = W,
                   .height = H,
                   .sched = &sc,
                   .opts = {steps, jnum(c, "guidance_scale"), jnum(c, "guidance_rescale")}};
  ct_image im = {0};
  CHECKF(!ct_sdxl_sampler_run(s, &r, x, &im, &e), "case %d: %s", k, e.msg);
  const double el = rel(x, lout, nl);
  CHECKF(el < 1e-3, "case %d (%s, g %g, rescale %g): latents %.3g", k, sched, r.opts.guidance_scale,
         r.opts.guidance_rescale, el);
  if (im.px) {
    const double db = psnr(im.px, img, ni);
    CHECKF(db >= 40, "case %d (%s): image %.1f dB", k, sched, db);
    printf("  case %d (%s, g %g, rescale %g): latents rel %.2g, image %.1f dB\n", k, sched,
           r.opts.guidance_scale, r.opts.guidance_rescale, el, db);
  }
  ct_image_free(&im);
  free(x), free(lout), free(img);
}

CT_TEST(sdxl_sample, as_stablediffusionxlpipeline) {
  ct_st_file *g = NULL;
  ct_err e = {0};
  if (ct_st_open(pdata("sample_golden.safetensors"), &g, &e))
    CT_SKIP("no tests/data/sdxl_pipe/sample_golden.safetensors");
  ct_sdxl_sampler *s = NULL;
  CHECKF(!ct_sdxl_sampler_open(pdata(""), NULL, &s, &e), "%s", e.msg);
  REQUIRE(s);
  const char *js = ct_st_meta(g, "cases");
  ct_json *cases = NULL;
  REQUIRE(js && !ct_json_parse(js, strlen(js), &cases, &e) && cases->type == CT_JSON_ARRAY);
  CHECK(cases->n == 4);
  const int W = atoi(ct_st_meta(g, "width")), H = atoi(ct_st_meta(g, "height"));
  const int steps = atoi(ct_st_meta(g, "steps"));
  for (size_t k = 0; k < cases->n; k++)
    check_case(ct_failed_, s, g, &cases->items[k], (int)k, W, H, steps);
  ct_json_free(cases);
  ct_sdxl_sampler_free(s);
  ct_st_close(g);
}

/* Sizes the U-net cannot take, and steps out of range, refused by name. */
CT_TEST(sdxl_sample, refuses) {
  ct_sdxl_sampler *s = NULL;
  ct_err e = {0};
  if (ct_sdxl_sampler_open(pdata(""), NULL, &s, &e)) CT_SKIP("no tests/data/sdxl_pipe: %s", e.msg);
  int mult, f, C, px;
  ct_sdxl_sampler_geometry(s, &mult, &f, &C, &px);
  CHECK(mult == 4 && f == 2 && C == 4 && px == 32); /* sample_size 16 x 2 */
  float x[4 * 16 * 16] = {0};
  ct_sdxl_run r = {.prompt = "a", .width = 30, .height = 32, .opts = {2, 5.0, 0.0}};
  CHECK(ct_sdxl_sampler_run(s, &r, x, NULL, &e) == CT_ERR_INVALID &&
        strstr(e.msg, "multiples of 4"));
  r.width = 32, r.opts.steps = 0;
  CHECK(ct_sdxl_sampler_run(s, &r, x, NULL, &e) == CT_ERR_INVALID && strstr(e.msg, "steps"));
  r.opts.steps = 1, r.opts.guidance_rescale = 2;
  CHECK(ct_sdxl_sampler_run(s, &r, x, NULL, &e) == CT_ERR_RANGE &&
        strstr(e.msg, "guidance_rescale"));
  ct_sdxl_sampler_free(s);
}

/* A training run's U-net (borrowed, as validation samples with it), alone or
 * with its open pipeline: the same images as the pipeline's own unet/, and
 * what is borrowed outlives the sampler. */
CT_TEST(sdxl_sample, borrowed_unet) {
  ct_st_file *g = NULL;
  ct_err e = {0};
  if (ct_st_open(pdata("sample_golden.safetensors"), &g, &e))
    CT_SKIP("no tests/data/sdxl_pipe/sample_golden.safetensors");
  ct_unet *u = NULL;
  CHECKF(!ct_unet_from_pretrained(pdata("unet"), &u, &e), "%s", e.msg);
  REQUIRE(u);
  ct_sdxl_sampler *s = NULL;
  CHECKF(!ct_sdxl_sampler_open_unet(pdata(""), u, &s, &e), "%s", e.msg);
  REQUIRE(s);
  const char *js = ct_st_meta(g, "cases");
  ct_json *cases = NULL;
  REQUIRE(js && !ct_json_parse(js, strlen(js), &cases, &e) && cases->n >= 2);
  const int W = atoi(ct_st_meta(g, "width")), H = atoi(ct_st_meta(g, "height"));
  const int steps = atoi(ct_st_meta(g, "steps"));
  check_case(ct_failed_, s, g, &cases->items[1], 1, W, H, steps);
  ct_sdxl_sampler_free(s);
  CHECK(ct_unet_cfg(u)->in_channels == 4); /* still ours */
  /* over an open pipeline too (a training run's): the same images, both outlive it */
  ct_sdxl_pipe pipe;
  CHECKF(!ct_sdxl_pipe_open(pdata(""), &pipe, &e), "%s", e.msg);
  s = NULL;
  CHECKF(!ct_sdxl_sampler_open_pipe(&pipe, u, &s, &e), "%s", e.msg);
  REQUIRE(s);
  check_case(ct_failed_, s, g, &cases->items[1], 1, W, H, steps);
  ct_sdxl_sampler_free(s);
  CHECK(pipe.text && pipe.vae); /* still open */
  ct_sdxl_pipe_close(&pipe);
  ct_unet_free(u);
  ct_json_free(cases);
  ct_st_close(g);
}

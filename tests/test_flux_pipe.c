/* Training from a diffusers FluxPipeline directory (src/train/flux_pipe.c,
 * textcond.c), against tiny pipelines diffusers saved itself and their
 * goldens (scripts/flux_tiny_pipeline.py, tests/data/flux_pipe): the
 * directory opens with its shapes; FluxPipeline.encode_prompt's T5 sequence
 * and CLIP pooled vector (and t5_padding zero); the VAE latents as
 * SimpleTuner caches them; one flow-matching step's v_pred and loss on the
 * pipeline's transformer; the diffusers range loader (ZeRO-3) equal to the
 * whole load; and every problem of a broken directory in one error.
 * CT_FLUX_PIPE_DATA overrides the data directory (make interop). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/config.h"
#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/mmdit.h"
#include "ctuner/safetensors.h"
#include "ctuner/train.h"
#include "ctuner/vae.h"
#include "harness.h"
#include "train/flux_pipe.h"
#include "train/textcond.h"

#define pdata(rel) ct_test_data_in("CT_FLUX_PIPE_DATA", "flux_pipe", rel)
#define gt ct_test_tensor
#define rel ct_test_rel_err

static ct_status open_pipe(const char *flavour, ct_flux_pipe *p, ct_config *c, ct_err *e) {
  ct_config_defaults(c);
  ct_status st = ct_config_set(c, "pretrained_model_name_or_path", pdata(flavour), e);
  if (!st) st = ct_config_set(c, "model_flavour", flavour, e);
  return st ? st : ct_flux_pipe_open(c, 0, p, e);
}

/* The golden's prompts (metadata "prompts", a JSON list). */
static int prompts(const ct_st_file *g, char **out, int cap) {
  const char *js = ct_st_meta(g, "prompts");
  ct_json *j = NULL;
  ct_err e;
  if (!js || ct_json_parse(js, strlen(js), &j, &e)) return 0;
  int n = 0;
  for (size_t i = 0; i < j->n && n < cap; i++) out[n++] = strdup(j->items[i].str);
  ct_json_free(j);
  return n;
}

static void check_open(int *ct_failed_, const char *flavour) {
  ct_flux_pipe p;
  ct_config c;
  ct_err e = {0};
  CHECKF(!open_pipe(flavour, &p, &c, &e), "%s", e.msg);
  const int dev = !strcmp(flavour, "dev");
  CHECK(p.tcfg.in_channels == 16 && p.tcfg.hidden == 32 && p.tcfg.context_in_dim == 64 &&
        p.tcfg.vec_in_dim == 32 && p.tcfg.guidance_embed == dev);
  CHECK(p.max_sequence_length == (dev ? 512 : 256));
  CHECK(p.vae_factor == 2 && p.vae_ch == 16 && p.t5_d == 64 && p.clip_d == 32);
  CHECK(p.sched.use_dynamic_shifting == dev);
  ct_config_free(&c);
}

CT_TEST(flux_pipe, open_dev_schnell) {
  check_open(ct_failed_, "dev");
  check_open(ct_failed_, "schnell");
}

/* encode_prompt: T5 sequence and CLIP pooled, within 1e-4 of transformers */
static void check_text(int *ct_failed_, const char *flavour) {
  ct_flux_pipe p;
  ct_config c;
  ct_err e = {0};
  char gpath[4200];
  snprintf(gpath, sizeof gpath, "%s/golden.safetensors", pdata(flavour));
  ct_st_file *g = NULL;
  REQUIRE(!ct_st_open(gpath, &g, &e));
  REQUIRE(!open_pipe(flavour, &p, &c, &e));
  const int T = atoi(ct_st_meta(g, "max_sequence_length"));
  p.max_sequence_length = T; /* the golden's length */
  char *pr[8];
  const int n = prompts(g, pr, 8);
  REQUIRE(n == 3);
  size_t ne = 0, np = 0;
  float *pe = gt(g, "text.prompt_embeds", &ne), *pooled = gt(g, "text.pooled", &np);
  REQUIRE(pe && pooled && ne == (size_t)n * T * 64 && np == (size_t)n * 32);
  for (int zero = 0; zero < 2; zero++) {
    ct_textcond *tc = NULL;
    CHECKF(!ct_textcond_flux(&p, zero, &tc, &e), "%s", e.msg);
    REQUIRE(tc);
    float *txt = calloc(ne, sizeof *txt), *y = calloc(np, sizeof *y);
    CHECKF(!ct_textcond_encode(tc, (const char *const *)pr, n, txt, y, &e), "%s", e.msg);
    /* CLIP ids as CLIPTokenizer's (prompt 2's "Ünïcode café" needs Unicode
     * lowercasing), and every prompt's pooled vector */
    const ct_st_tensor *ci = ct_st_find(g, "text.clip_ids");
    REQUIRE(ci && ci->dtype == CT_DTYPE_I32 && ci->numel == (size_t)n * 77);
    int same = 0;
    for (int i = 0; i < n; i++) {
      int32_t ids[77];
      ct_bpe_encode(tc->bpe, pr[i], 77, ids);
      if (memcmp(ids, (const int32_t *)ci->data + (size_t)i * 77, sizeof ids)) continue;
      same++;
      const double ey = rel(y + (size_t)i * 32, pooled + (size_t)i * 32, 32);
      CHECKF(ey < 1e-4, "%s pooled of prompt %d: %.3g", flavour, i, ey);
    }
    CHECKF(same == n, "%s: %d of %d prompts tokenised as CLIPTokenizer", flavour, same, n);
    if (!zero) {
      const double et = rel(txt, pe, ne);
      CHECKF(et < 1e-4, "%s prompt_embeds %.3g", flavour, et);
    } else { /* padding rows are 0, the rest as before */
      int zeros = 0, rows_ok = 1;
      for (int i = 0; i < n; i++)
        for (int t = 0; t < T; t++) {
          const float *r = txt + ((size_t)i * T + t) * 64, *gr = pe + ((size_t)i * T + t) * 64;
          int allz = 1;
          for (int k = 0; k < 64; k++) allz &= r[k] == 0.0f;
          zeros += allz;
          if (!allz && rel(r, gr, 64) > 1e-4) rows_ok = 0;
        }
      CHECKF(zeros > 0 && rows_ok, "%s t5_padding zero: %d zero rows", flavour, zeros);
    }
    /* released: the memo answers its prompts, anything else is an error */
    const char *keep[1] = {pr[0]};
    CHECKF(!ct_textcond_release(tc, keep, 1, &e), "%s", e.msg);
    float *t1 = calloc((size_t)T * 64, sizeof *t1), *y1 = calloc(32, sizeof *y1);
    CHECK(!ct_textcond_encode(tc, keep, 1, t1, y1, &e));
    CHECK(!memcmp(t1, txt, (size_t)T * 64 * sizeof *t1) && !memcmp(y1, y, 32 * sizeof *y1));
    const char *other[1] = {"something else"};
    CHECK(ct_textcond_encode(tc, other, 1, t1, y1, &e) && strstr(e.msg, "not encoded"));
    free(t1), free(y1), free(txt), free(y);
    ct_textcond_free(tc);
  }
  for (int i = 0; i < n; i++) free(pr[i]);
  free(pe), free(pooled);
  ct_st_close(g);
  ct_config_free(&c);
}

CT_TEST(flux_pipe, text_as_encode_prompt) {
  check_text(ct_failed_, "dev");
  check_text(ct_failed_, "schnell");
}

/* VAE latents and one training step's v_pred and loss. */
static void check_step(int *ct_failed_, const char *flavour) {
  ct_flux_pipe p;
  ct_config c;
  ct_err e = {0};
  char gpath[4200];
  snprintf(gpath, sizeof gpath, "%s/golden.safetensors", pdata(flavour));
  ct_st_file *g = NULL;
  REQUIRE(!ct_st_open(gpath, &g, &e));
  REQUIRE(!open_pipe(flavour, &p, &c, &e));
  /* the VAE: (mean - shift) * scale */
  ct_vae *v = NULL;
  CHECKF(!ct_vae_from_pretrained(p.vae, &v, &e), "%s", e.msg);
  size_t nl = 0;
  float *img = gt(g, "vae.image", NULL), *lat = gt(g, "vae.latents", &nl);
  REQUIRE(v && img && lat && nl == 16 * 16 * 16);
  float *mean = calloc(nl, sizeof *mean);
  CHECK(!ct_vae_encode(v, 1, 32, 32, img, mean, NULL, &e));
  const ct_vae_config *vc = ct_vae_cfg(v);
  for (size_t i = 0; i < nl; i++) mean[i] = (mean[i] - vc->shift_factor) * vc->scaling_factor;
  const double el = rel(mean, lat, nl);
  CHECKF(el < 1e-4, "%s vae latents %.3g", flavour, el);
  /* the transformer on the golden's packed x_t, sigma, prompt 0, guidance */
  ct_mmdit *m = NULL;
  CHECKF(!ct_mmdit_open_diffusers(p.transformer, 0, &m, &e), "%s", e.msg);
  REQUIRE(m);
  const int T = atoi(ct_st_meta(g, "max_sequence_length"));
  size_t nx = 0;
  float *xt = gt(g, "train.xt", &nx), *vp = gt(g, "train.v_pred", NULL);
  float *x0 = gt(g, "train.x0", NULL), *noise = gt(g, "train.noise", NULL);
  float *pe = gt(g, "text.prompt_embeds", NULL), *pooled = gt(g, "text.pooled", NULL);
  float *sigma = gt(g, "train.sigma", NULL), *gl = gt(g, "train.loss", NULL);
  float *guid = gt(g, "train.guidance", NULL);
  REQUIRE(xt && vp && x0 && noise && pe && pooled && sigma && gl && nx == 64 * 64);
  CHECK(!guid == !p.tcfg.guidance_embed);
  float *x = malloc(nx * sizeof *x), *out = malloc(nx * sizeof *out), *pk = malloc(nx * 4);
  ct_flux_unpack(1, 16, 16, 16, xt, x);
  ct_mmdit_batch in = {.B = 1,
                       .H = 16,
                       .W = 16,
                       .T = T,
                       .x = x,
                       .t = sigma,
                       .txt = pe,
                       .y = pooled,
                       .guidance = guid};
  CHECKF(!ct_mmdit_forward(m, &in, out, &e), "%s", e.msg);
  ct_flux_pack(1, 16, 16, 16, out, pk);
  const double ev = rel(pk, vp, nx);
  CHECKF(ev < 1e-4, "%s v_pred %.3g", flavour, ev);
  double loss = 0;
  for (size_t i = 0; i < nx; i++) {
    const double d = (double)pk[i] - ((double)noise[i] - x0[i]);
    loss += d * d;
  }
  loss /= (double)nx;
  CHECKF(fabs(loss - gl[0]) < 1e-4 * gl[0], "%s loss %.8g vs %.8g", flavour, loss, gl[0]);
  /* the range loader (ZeRO-3's shard) gives the same floats as the whole load */
  const size_t N = ct_mmdit_numel(m), cut = N / 3 + 7;
  float *r = malloc(N * sizeof *r);
  CHECK(!ct_mmdit_load_diffusers_range(m, p.transformer, 0, cut, r, &e));
  CHECK(!ct_mmdit_load_diffusers_range(m, p.transformer, cut, N, r + cut, &e));
  CHECK(!memcmp(r, ct_mmdit_params(m), N * sizeof *r));
  free(r), free(x), free(out), free(pk), free(xt), free(vp), free(x0), free(noise), free(pe);
  free(pooled), free(sigma), free(gl), free(guid), free(img), free(lat), free(mean);
  ct_mmdit_free(m);
  ct_vae_free(v);
  ct_st_close(g);
  ct_config_free(&c);
}

CT_TEST(flux_pipe, vae_and_step) {
  check_step(ct_failed_, "dev");
  check_step(ct_failed_, "schnell");
}

static void put(int *ct_failed_, const char *path, const char *text) {
  ct_err e;
  CHECK(!ct_write_file_atomic(path, text, strlen(text), &e));
}

/* A broken copy: every problem named in one error; a hub id gets the hint. */
CT_TEST(flux_pipe, problems_listed_at_once) {
  char dir[] = "/tmp/ct_flux_pipe_XXXXXX";
  REQUIRE(mkdtemp(dir));
  char cmd[8400], p[4400];
  snprintf(cmd, sizeof cmd, "cp -rL '%s' '%s/p'", pdata("dev"), dir);
  REQUIRE(system(cmd) == 0);
  snprintf(p, sizeof p, "%s/p/model_index.json", dir); /* a class ctuner does not read */
  put(ct_failed_, p,
      "{\"_class_name\": \"FluxPipeline\", \"scheduler\": [\"diffusers\", "
      "\"FlowMatchEulerDiscreteScheduler\"], \"text_encoder\": [\"transformers\", "
      "\"CLIPTextModelWithProjection\"], \"text_encoder_2\": [\"transformers\", "
      "\"T5EncoderModel\"], \"tokenizer\": [\"transformers\", \"CLIPTokenizer\"], "
      "\"tokenizer_2\": [\"transformers\", \"T5TokenizerFast\"], \"transformer\": "
      "[\"diffusers\", \"FluxTransformer2DModel\"], \"vae\": [\"diffusers\", "
      "\"AutoencoderKL\"]}");
  snprintf(cmd, sizeof cmd,
           "rm -rf '%s/p/tokenizer_2' '%s/p/vae/diffusion_pytorch_model.safetensors'", dir, dir);
  REQUIRE(system(cmd) == 0);
  ct_config c;
  ct_err e = {0};
  ct_flux_pipe fp;
  ct_config_defaults(&c);
  snprintf(p, sizeof p, "%s/p", dir);
  REQUIRE(!ct_config_set(&c, "pretrained_model_name_or_path", p, &e));
  REQUIRE(!ct_config_set(&c, "preset", "tiny", &e));
  CHECK(ct_flux_pipe_open(&c, 0, &fp, &e) == CT_ERR_INVALID);
  CHECKF(strstr(e.msg, "4 problems") && strstr(e.msg, "CLIPTextModelWithProjection") &&
             strstr(e.msg, "tokenizer_2: missing") &&
             strstr(e.msg, "no diffusion_pytorch_model.safetensors") &&
             strstr(e.msg, "preset does not go"),
         "%s", e.msg);
  /* a transformer tensor of the wrong shape: named with its file */
  ct_config_free(&c);
  ct_config_defaults(&c);
  REQUIRE(!ct_config_set(&c, "pretrained_model_name_or_path", "black-forest-labs/FLUX.1-dev", &e));
  CHECK(ct_flux_pipe_open(&c, 0, &fp, &e) == CT_ERR_NOT_FOUND);
  CHECKF(strstr(e.msg, "docs/hub.md") &&
             strstr(e.msg, "huggingface-cli download black-forest-labs/FLUX.1-dev --local-dir X"),
         "%s", e.msg);
  ct_config_free(&c);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

static double psnr(const uint8_t *a, const float *ref, size_t n) {
  double se = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = a[i] / 255.0 - ref[i];
    se += d * d;
  }
  if (!isfinite(se)) return NAN; /* a NaN or Inf pixel: fails every >= dB check */
  return se > 0 ? 10 * log10(1.0 / (se / (double)n)) : 200;
}

/* FluxPipeline(prompts[:2], 32x32, 4 steps, guidance 3.5 / none) from the
 * golden's latents: the final latents within 1e-3, the images >= 40 dB. */
static void check_sample(int *ct_failed_, const char *flavour) {
  ct_err e = {0};
  char gpath[4200];
  snprintf(gpath, sizeof gpath, "%s/golden.safetensors", pdata(flavour));
  ct_st_file *g = NULL;
  REQUIRE(!ct_st_open(gpath, &g, &e));
  ct_flux_sampler *s = NULL;
  const int T = atoi(ct_st_meta(g, "max_sequence_length"));
  CHECKF(!ct_flux_sampler_open(pdata(flavour), flavour, T, NULL, &s, &e), "%s", e.msg);
  REQUIRE(s);
  char *pr[8];
  const int np = prompts(g, pr, 8);
  REQUIRE(np >= 2);
  size_t nl = 0, ni = 0;
  float *lin = gt(g, "sample.latents_in", &nl), *lout = gt(g, "sample.latents_out", NULL);
  float *img = gt(g, "sample.image", &ni);
  REQUIRE(lin && lout && img && nl == 2 * 64 * 64 && ni == 2 * 32 * 32 * 3);
  float *x = malloc(nl * sizeof *x), *pk = malloc(nl * sizeof *pk);
  ct_flux_unpack(2, 16, 16, 16, lin, x);
  ct_image out[2];
  const float gs = (float)atof(ct_st_meta(g, "guidance_scale"));
  CHECKF(!ct_flux_sampler_run(s, (const char *const *)pr, 2, 32, 32, 4, gs, x, out, &e), "%s",
         e.msg);
  ct_flux_pack(2, 16, 16, 16, x, pk);
  const double el = rel(pk, lout, nl);
  CHECKF(el < 1e-3, "%s sample latents %.3g", flavour, el);
  for (int i = 0; i < 2; i++) {
    const double db = psnr(out[i].px, img + (size_t)i * 32 * 32 * 3, 32 * 32 * 3);
    CHECKF(db >= 40, "%s image %d: %.1f dB", flavour, i, db);
    ct_image_free(&out[i]);
  }
  for (int i = 0; i < np; i++) free(pr[i]);
  free(x), free(pk), free(lin), free(lout), free(img);
  ct_flux_sampler_free(s);
  ct_st_close(g);
}

CT_TEST(flux_pipe, sample_as_fluxpipeline) {
  check_sample(ct_failed_, "dev");
  check_sample(ct_failed_, "schnell");
}

/* FLUX.1 Kontext (scripts/flux_kontext_golden.py, tests/data/flux_kontext):
 * FluxKontextPipeline on the dev pipeline with ref.png (24x32) as its image,
 * 32x32, max_area 32*32, _auto_resize False, 4 steps, guidance 3.5, from the
 * golden's latents: the final latents within 1e-3, the images >= 40 dB. */
CT_TEST(flux_pipe, kontext_sample_as_fluxkontextpipeline) {
  ct_err e = {0};
  char gpath[4200], rpath[4200], pipe[4200];
  snprintf(gpath, sizeof gpath, "%s",
           ct_test_data_in("CT_FLUX_KONTEXT_DATA", "flux_kontext", "golden.safetensors"));
  snprintf(rpath, sizeof rpath, "%s",
           ct_test_data_in("CT_FLUX_KONTEXT_DATA", "flux_kontext", "ref.png"));
  snprintf(pipe, sizeof pipe, "%s", pdata("dev"));
  ct_st_file *g = NULL;
  REQUIRE(!ct_st_open(gpath, &g, &e));
  const int T = atoi(ct_st_meta(g, "max_sequence_length"));
  ct_flux_sampler *s = NULL;
  CHECKF(!ct_flux_sampler_open(pipe, "dev", T, NULL, &s, &e), "%s", e.msg);
  REQUIRE(s);
  /* the sizes the pipeline sets: 32x32 kept by max_area 1024, the reference as it is */
  int w = 32, h = 32, rw = 24, rh = 32;
  CHECK(!ct_kontext_sizes(atol(ct_st_meta(g, "max_area")), 4, 0, &w, &h, &rw, &rh));
  CHECK(w == 32 && h == 32 && rw == 24 && rh == 32);
  /* with _auto_resize a 24x32 image becomes 880x1184 (aspect 0.743 nearest 0.75) */
  CHECK(ct_kontext_sizes(1024 * 1024, 16, 1, &w, &h, &rw, &rh) && rw == 880 && rh == 1184);
  CHECK(w == 1024 && h == 1024);
  ct_image ref;
  REQUIRE(!ct_image_load(rpath, &ref, &e));
  REQUIRE(ref.w == 24 && ref.h == 32);
  CHECKF(!ct_flux_sampler_reference(s, &ref, &e), "%s", e.msg);
  char *pr[8];
  REQUIRE(prompts(g, pr, 8) == 2);
  size_t nl = 0, ni = 0;
  float *lin = gt(g, "sample.latents_in", &nl), *lout = gt(g, "sample.latents_out", NULL);
  float *img = gt(g, "sample.image", &ni);
  REQUIRE(lin && lout && img && nl == 2 * 64 * 64 && ni == 2 * 32 * 32 * 3);
  float *x = malloc(nl * sizeof *x), *pk = malloc(nl * sizeof *pk);
  ct_flux_unpack(2, 16, 16, 16, lin, x);
  ct_image out[2];
  const float gs = (float)atof(ct_st_meta(g, "guidance_scale"));
  CHECKF(!ct_flux_sampler_run(s, (const char *const *)pr, 2, 32, 32, 4, gs, x, out, &e), "%s",
         e.msg);
  ct_flux_pack(2, 16, 16, 16, x, pk);
  const double el = rel(pk, lout, nl);
  CHECKF(el < 1e-3, "kontext sample latents %.3g", el);
  for (int i = 0; i < 2; i++) {
    const double db = psnr(out[i].px, img + (size_t)i * 32 * 32 * 3, 32 * 32 * 3);
    CHECKF(db >= 40, "kontext image %d: %.1f dB", i, db);
    ct_image_free(&out[i]);
  }
  fprintf(stderr, "  kontext: final latents %.2g (rel.)\n", el);
  /* a reference the pipeline would resize is refused by name */
  ct_image odd;
  REQUIRE(!ct_image_alloc(26, 32, &odd, &e));
  CHECK(ct_flux_sampler_reference(s, &odd, &e) && strstr(e.msg, "26x32"));
  ct_image_free(&odd);
  for (int i = 0; i < 2; i++) free(pr[i]);
  free(x), free(pk), free(lin), free(lout), free(img);
  ct_image_free(&ref);
  ct_flux_sampler_free(s);
  ct_st_close(g);
}

/* U-net tests (docs/unet.md): diffusers' UNet2DConditionModel, tiny and
 * SDXL-shaped, against the golden files of scripts/unet_golden.py
 * (tests/data/unet: config.json, diffusion_pytorch_model.safetensors,
 * golden.safetensors; `make interop` regenerates them live and points
 * CT_UNET_DATA there): the output, the latents' and text states' gradients
 * and every parameter's gradient; config parsing and its refusals; the real
 * SDXL parameter count; save and reload. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/fs.h"
#include "ctuner/safetensors.h"
#include "ctuner/unet.h"
#include "harness.h"

static const char *data(const char *rel) {
  return ct_test_data_in("CT_UNET_DATA", "unet", rel);
}

static const char *write_tmp(const char *name, const char *text) {
  static char path[1024];
  snprintf(path, sizeof path, "%s/%s", ct_test_tmpdir(), name);
  ct_err e = {0};
  ct_write_file_atomic(path, text, strlen(text), &e);
  return path;
}

/* max |a - ref| / max(max |ref|, floor): NaN-sticky */
static double rel_floor(const float *a, const float *ref, size_t n, double floor_) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < n; i++) {
    md = ct_test_max(md, fabs((double)a[i] - ref[i]));
    mr = ct_test_max(mr, fabs((double)ref[i]));
  }
  return md / ct_test_max(mr, floor_);
}

typedef struct {
  ct_st_file *g;
  ct_unet_inputs in;
  float *sample, *ts, *enc, *te, *ids, *r, *want;
  size_t nout;
} golden;

static int golden_open(golden *gd) {
  ct_err err = {0};
  memset(gd, 0, sizeof *gd);
  if (ct_st_open(data("golden.safetensors"), &gd->g, &err)) return 0;
  size_t n, nenc;
  gd->sample = ct_test_tensor(gd->g, "in.sample", &n);
  gd->ts = ct_test_tensor(gd->g, "in.timesteps", &n);
  gd->enc = ct_test_tensor(gd->g, "in.encoder_hidden_states", &nenc);
  gd->te = ct_test_tensor(gd->g, "in.text_embeds", &n);
  gd->ids = ct_test_tensor(gd->g, "in.time_ids", &n);
  gd->r = ct_test_tensor(gd->g, "in.r", &n);
  gd->want = ct_test_tensor(gd->g, "out.sample", &gd->nout);
  const ct_st_tensor *s = ct_st_find(gd->g, "in.sample"),
                     *e = ct_st_find(gd->g, "in.encoder_hidden_states");
  if (!gd->sample || !gd->enc || !gd->want || !gd->r || !s || !e) return 0;
  gd->in = (ct_unet_inputs){.B = (int)s->shape[0],
                            .H = (int)s->shape[2],
                            .W = (int)s->shape[3],
                            .sample = gd->sample,
                            .timesteps = gd->ts,
                            .Lk = (int)e->shape[1],
                            .encoder_hidden_states = gd->enc,
                            .text_embeds = gd->te,
                            .time_ids = gd->ids};
  return 1;
}

static void golden_close(golden *gd) {
  float *p[] = {gd->sample, gd->ts, gd->enc, gd->te, gd->ids, gd->r, gd->want};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
  ct_st_close(gd->g);
}

CT_TEST(unet, config) {
  ct_unet_config c;
  ct_err err = {0};
  REQUIRE(ct_unet_config_load(data("config.json"), &c, &err) == CT_OK);
  CHECK(c.nblocks == 2 && c.block_out_channels[0] == 8 && c.block_out_channels[1] == 16);
  CHECK(!c.down_cross[0] && c.down_cross[1] && c.up_cross[0] && !c.up_cross[1]);
  CHECK(c.transformer_layers[0] == 1 && c.transformer_layers[1] == 2);
  CHECK(c.heads[0] == 2 && c.heads[1] == 4); /* attention_head_dim: the number of heads */
  CHECK(c.text_time && c.addition_time_embed_dim == 8 && ct_unet_pooled_dim(&c) == 16);
  CHECK(c.use_linear_projection && c.norm_num_groups == 4 && c.cross_attention_dim == 16);
  /* refusals name the key */
  static const char *const bad[][2] = {
      {"{\"resnet_time_scale_shift\": \"scale_shift\"}", "resnet_time_scale_shift"},
      {"{\"down_block_types\": [\"SimpleCrossAttnDownBlock2D\", \"DownBlock2D\", \"DownBlock2D\", "
       "\"DownBlock2D\"]}",
       "SimpleCrossAttnDownBlock2D"},
      {"{\"addition_embed_type\": \"text\"}", "addition_embed_type"},
      {"{\"class_embed_type\": \"timestep\"}", "class_embed_type"},
      {"{\"num_attention_heads\": 8}", "num_attention_heads"},
      {"{\"freq_shift\": 1}", "freq_shift"},
      {"{\"_class_name\": \"UNet2DModel\"}", "UNet2DModel"},
      {"{\"attention_head_dim\": 7}", "heads"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *p = write_tmp("bad_unet.json", bad[i][0]);
    ct_err e = {0};
    CHECKF(ct_unet_config_load(p, &c, &e) != CT_OK && strstr(e.msg, bad[i][1]), "%s: %s", bad[i][0],
           e.msg);
  }
}

/* SDXL 1.0 base's U-net: 2,567,463,684 parameters (diffusers' count), 1680 tensors */
CT_TEST(unet, sdxl_parameter_count) {
  ct_unet_config c;
  ct_unet_config_sdxl(&c);
  size_t n = 0, nt = 0;
  ct_err err = {0};
  REQUIRE(ct_unet_count(&c, &n, &nt, &err) == CT_OK);
  CHECKF(n == 2567463684u, "SDXL U-net: %zu parameters in %zu tensors", n, nt);
}

CT_TEST(unet, golden_forward_backward) {
  golden gd;
  if (!golden_open(&gd)) {
    golden_close(&gd);
    CHECKF(0, "cannot read %s", data("golden.safetensors"));
    return;
  }
  ct_err err = {0};
  ct_unet *u = NULL;
  REQUIRE(ct_unet_from_pretrained(data(""), &u, &err) == CT_OK);
  float *out = malloc(gd.nout * sizeof(float));
  for (size_t i = 0; i < gd.nout; i++) out[i] = NAN;
  ct_unet_tape *tp = NULL;
  REQUIRE(ct_unet_forward(u, &gd.in, out, &tp, &err) == CT_OK);
  const double eo = ct_test_rel_err(out, gd.want, gd.nout);
  CHECKF(eo < 2e-5, "output: %.3g relative error against diffusers", eo);
  size_t ns, ne;
  float *gs = ct_test_tensor(gd.g, "grad.in.sample", &ns),
        *ge = ct_test_tensor(gd.g, "grad.in.encoder_hidden_states", &ne);
  REQUIRE(gs && ge);
  float *ds = malloc(ns * sizeof(float)), *de = malloc(ne * sizeof(float));
  for (size_t i = 0; i < ns; i++) ds[i] = NAN;
  for (size_t i = 0; i < ne; i++) de[i] = NAN;
  REQUIRE(ct_unet_backward(u, tp, gd.r, ds, de, &err) == CT_OK);
  const double es = ct_test_rel_err(ds, gs, ns), ee = ct_test_rel_err(de, ge, ne);
  CHECKF(es < 4e-5 && ee < 4e-5, "gradients: sample %.3g, encoder_hidden_states %.3g", es, ee);
  /* every parameter, relative per tensor against 1e-3 of the largest gradient
   * (the key projections' gradients are ~0: softmax ignores a shared shift) */
  size_t np;
  const ct_unet_param *tab = ct_unet_table(u, &np);
  const float *gw = ct_unet_grads(u);
  double gmax = 0, worst = 0;
  for (size_t i = 0; i < ct_unet_numel(u); i++) gmax = ct_test_max(gmax, fabs(gw[i]));
  const char *wname = "";
  int missing = 0;
  for (size_t i = 0; i < np; i++) {
    char name[160];
    snprintf(name, sizeof name, "grad.%s", tab[i].name);
    size_t n = 0;
    float *ref = ct_test_tensor(gd.g, name, &n);
    if (!ref || n != tab[i].numel) {
      missing++;
      free(ref);
      continue;
    }
    const double e = rel_floor(gw + tab[i].offset, ref, n, 1e-3 * gmax);
    if (!isnan(worst) && !(e <= worst)) worst = e, wname = tab[i].name;
    free(ref);
  }
  CHECKF(missing == 0, "%d parameters have no golden gradient", missing);
  CHECKF(worst < 4e-5, "parameter gradients: worst %.3g relative (%s)", worst, wname);
  fprintf(stderr,
          "  vs diffusers: output %.3g, d sample %.3g, d encoder_hidden_states %.3g, worst "
          "parameter gradient %.3g (%s)\n",
          eo, es, ee, worst, wname);
  /* a tape backs one backward */
  CHECK(ct_unet_backward(u, tp, gd.r, NULL, NULL, &err) == CT_ERR_INVALID);
  ct_unet_tape_free(tp);
  /* without a tape: the same output */
  float *out2 = malloc(gd.nout * sizeof(float));
  REQUIRE(ct_unet_forward(u, &gd.in, out2, NULL, &err) == CT_OK);
  CHECK(!memcmp(out, out2, gd.nout * sizeof(float)));
  free(out), free(out2), free(gs), free(ge), free(ds), free(de);
  ct_unet_free(u);
  golden_close(&gd);
}

/* the table is the file's: saved and reloaded it gives the same bits; a file
 * with a tensor missing is refused naming it */
CT_TEST(unet, save_reload) {
  ct_err err = {0};
  ct_unet *u = NULL, *v = NULL;
  REQUIRE(ct_unet_from_pretrained(data(""), &u, &err) == CT_OK);
  ct_unet_config c = *ct_unet_cfg(u);
  char path[1100];
  snprintf(path, sizeof path, "%s/unet_saved.safetensors", ct_test_tmpdir());
  REQUIRE(ct_unet_save(u, path, &err) == CT_OK);
  REQUIRE(ct_unet_new(&c, 7, &v, &err) == CT_OK);
  REQUIRE(ct_unet_load(v, path, &err) == CT_OK);
  CHECK(!memcmp(ct_unet_params(u), ct_unet_params(v), ct_unet_numel(u) * sizeof(float)));
  ct_unet_free(v);
  c.transformer_layers[1] = 1; /* the file has two layers per transformer */
  REQUIRE(ct_unet_new(&c, 7, &v, &err) == CT_OK);
  ct_err e = {0};
  CHECK(ct_unet_load(v, path, &e) == CT_ERR_SHAPE);
  CHECKF(strstr(e.msg, "transformer_blocks.1.attn1.to_q.weight") != NULL, "%s", e.msg);
  ct_unet_free(v);
  ct_unet_free(u);
}

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

#include "ctuner/alloc.h"
#include "ctuner/fs.h"
#include "ctuner/safetensors.h"
#include "ctuner/unet.h"
#include "harness.h"
#include "train/model.h"

static const char *data(const char *rel) {
  return ct_test_data_in("CT_UNET_DATA", "unet", rel);
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
  size_t nout, nenc;
} golden;

static const char *vdata(const char *var, const char *rel) {
  char r[256];
  snprintf(r, sizeof r, "%s%s", var, rel);
  return data(r);
}

static int golden_open(golden *gd, const char *var) {
  ct_err err = {0};
  memset(gd, 0, sizeof *gd);
  if (ct_st_open(vdata(var, "golden.safetensors"), &gd->g, &err)) return 0;
  size_t n;
  gd->sample = ct_test_tensor(gd->g, "in.sample", &n);
  gd->ts = ct_test_tensor(gd->g, "in.timesteps", &n);
  gd->enc = ct_test_tensor(gd->g, "in.encoder_hidden_states", &gd->nenc);
  gd->te = ct_test_tensor(gd->g, "in.text_embeds", &n);
  gd->ids = ct_test_tensor(gd->g, "in.time_ids", &n);
  gd->r = ct_test_tensor(gd->g, "in.r", &n);
  gd->want = ct_test_tensor(gd->g, "out.sample", &gd->nout);
  const ct_st_tensor *s = ct_st_find(gd->g, "in.sample"),
                     *e = ct_st_find(gd->g, "in.encoder_hidden_states");
  if (!gd->sample || !gd->ts || !gd->enc || !gd->want || !gd->r || !s || !e) return 0;
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
    const char *p = ct_test_write_tmp("bad_unet.json", bad[i][0]);
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

/* var: "" (SDXL's layout) or "sd/" (SD 1.x's: 1x1-conv projections, no added conditioning) */
static void golden_case(int *ct_failed_, const char *var) {
  golden gd;
  if (!golden_open(&gd, var)) {
    golden_close(&gd);
    CHECKF(0, "cannot read %s", vdata(var, "golden.safetensors"));
    return;
  }
  ct_err err = {0};
  ct_unet *u = NULL;
  REQUIRE(ct_unet_from_pretrained(vdata(var, ""), &u, &err) == CT_OK);
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
          "  %s vs diffusers: output %.3g, d sample %.3g, d encoder_hidden_states %.3g, worst "
          "parameter gradient %.3g (%s)\n",
          var[0] ? var : "sdxl/", eo, es, ee, worst, wname);
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

CT_TEST(unet, golden_sdxl) {
  golden_case(ct_failed_, "");
}

CT_TEST(unet, golden_sd) {
  golden_case(ct_failed_, "sd/");
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

/* stabilityai/stable-diffusion-xl-base-1.0's unet/config.json, as published */
static const char sdxl_config[] =
    "{\"_class_name\": \"UNet2DConditionModel\", \"_diffusers_version\": \"0.19.0.dev0\", "
    "\"act_fn\": \"silu\", \"addition_embed_type\": \"text_time\", "
    "\"addition_embed_type_num_heads\": 64, \"addition_time_embed_dim\": 256, "
    "\"attention_head_dim\": [5, 10, 20], \"block_out_channels\": [320, 640, 1280], "
    "\"center_input_sample\": false, \"class_embed_type\": null, \"class_embeddings_concat\": "
    "false, \"conv_in_kernel\": 3, \"conv_out_kernel\": 3, \"cross_attention_dim\": 2048, "
    "\"cross_attention_norm\": null, \"down_block_types\": [\"DownBlock2D\", "
    "\"CrossAttnDownBlock2D\", \"CrossAttnDownBlock2D\"], \"downsample_padding\": 1, "
    "\"dual_cross_attention\": false, \"encoder_hid_dim\": null, \"encoder_hid_dim_type\": null, "
    "\"flip_sin_to_cos\": true, \"freq_shift\": 0, \"in_channels\": 4, \"layers_per_block\": 2, "
    "\"mid_block_only_cross_attention\": null, \"mid_block_scale_factor\": 1, "
    "\"mid_block_type\": \"UNetMidBlock2DCrossAttn\", \"norm_eps\": 1e-05, \"norm_num_groups\": "
    "32, \"num_attention_heads\": null, \"num_class_embeds\": null, \"only_cross_attention\": "
    "false, \"out_channels\": 4, \"projection_class_embeddings_input_dim\": 2816, "
    "\"resnet_out_scale_factor\": 1.0, \"resnet_skip_time_act\": false, "
    "\"resnet_time_scale_shift\": \"default\", \"sample_size\": 128, \"time_cond_proj_dim\": null, "
    "\"time_embedding_act_fn\": null, \"time_embedding_dim\": null, \"time_embedding_type\": "
    "\"positional\", \"timestep_post_act\": null, \"transformer_layers_per_block\": [1, 2, 10], "
    "\"up_block_types\": [\"CrossAttnUpBlock2D\", \"CrossAttnUpBlock2D\", \"UpBlock2D\"], "
    "\"upcast_attention\": null, \"use_linear_projection\": true}";

/* the published config parses to ct_unet_config_sdxl; a config written by
 * ct_unet_config_json parses back to itself */
CT_TEST(unet, sdxl_config_json) {
  ct_unet_config got, want, back;
  ct_err err = {0};
  ct_unet_config_sdxl(&want);
  REQUIRE(ct_unet_config_load(ct_test_write_tmp("sdxl_unet.json", sdxl_config), &got, &err) ==
          CT_OK);
  CHECK(!memcmp(&got, &want, sizeof got));
  char *j = ct_unet_config_json(&got);
  REQUIRE(j);
  REQUIRE(ct_unet_config_load(ct_test_write_tmp("sdxl_unet_back.json", j), &back, &err) == CT_OK);
  CHECKF(!memcmp(&back, &got, sizeof got), "%s", j);
  free(j);
}

/* sharded weights: two shards and diffusers' index load as the single file does */
CT_TEST(unet, sharded_load) {
  ct_err err = {0};
  ct_unet *u = NULL, *v = NULL;
  REQUIRE(ct_unet_from_pretrained(data(""), &u, &err) == CT_OK);
  size_t np;
  const ct_unet_param *tab = ct_unet_table(u, &np);
  char dir[1100], path[1200];
  snprintf(dir, sizeof dir, "%s/unet_sharded", ct_test_tmpdir());
  REQUIRE(ct_mkdir_p(dir, &err) == CT_OK);
  size_t cap = 160 * np + 256, len = 0;
  int first = 1;
  char *idx = malloc(cap);
  len += (size_t)snprintf(idx, cap, "{\"metadata\": {\"total_size\": %zu}, \"weight_map\": {",
                          ct_unet_numel(u) * 4);
  for (int s = 0; s < 2; s++) {
    ct_st_writer *w = NULL;
    REQUIRE(ct_st_writer_new(&w) == CT_OK);
    for (size_t i = (size_t)s; i < np; i += 2) {
      REQUIRE(ct_st_writer_add_f32(w, tab[i].name, tab[i].ndim, tab[i].shape,
                                   ct_unet_params(u) + tab[i].offset, CT_DTYPE_F32, &err) == CT_OK);
      len += (size_t)snprintf(idx + len, cap - len, "%s\"%s\": \"part-%d.safetensors\"",
                              first ? "" : ", ", tab[i].name, s);
      first = 0;
    }
    snprintf(path, sizeof path, "%s/part-%d.safetensors", dir, s);
    REQUIRE(ct_st_writer_write(w, path, &err) == CT_OK);
    ct_st_writer_free(w);
  }
  snprintf(idx + len, cap - len, "}}");
  snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors.index.json", dir);
  REQUIRE(ct_write_file_atomic(path, idx, strlen(idx), &err) == CT_OK);
  free(idx);
  REQUIRE(ct_unet_new(ct_unet_cfg(u), 3, &v, &err) == CT_OK);
  ct_status lst = ct_unet_load(v, dir, &err);
  REQUIRE(lst == CT_OK || (fprintf(stderr, "  %s\n", err.msg), 0));
  CHECK(!memcmp(ct_unet_params(u), ct_unet_params(v), ct_unet_numel(u) * sizeof(float)));
  ct_unet_free(v);
  ct_unet_free(u);
}

/* the trainer's view (src/train/model_unet.c): the same table and buffer;
 * a checkpoint's unet/ directory loads back in ctuner (and diffusers:
 * config.json and the weights in its layout) */
CT_TEST(unet, model_adapter) {
  ct_err err = {0};
  ct_unet *u = NULL, *v = NULL;
  REQUIRE(ct_unet_from_pretrained(data(""), &u, &err) == CT_OK);
  const size_t n = ct_unet_numel(u);
  float *w = ct_unet_params(u);
  ct_model *m = NULL;
  REQUIRE(ct_model_unet(u, &m, &err) == CT_OK);
  CHECK(!strcmp(m->ops->family, "unet") && ct_model_numel(m) == n && ct_model_params(m) == w);
  const ct_model_param *p = ct_model_find(m, "mid_block.attentions.0.proj_in.weight");
  CHECK(p && p->ndim == 2 && p->shape[0] == 16 && p->shape[1] == 16);
  CHECK(ct_model_grads(m) != NULL);
  char dir[1100], sub[1200];
  snprintf(dir, sizeof dir, "%s/unet_ckpt", ct_test_tmpdir());
  REQUIRE(m->ops->save(m, dir, &err) == CT_OK);
  snprintf(sub, sizeof sub, "%s/unet", dir);
  REQUIRE(ct_unet_from_pretrained(sub, &v, &err) == CT_OK);
  CHECK(!memcmp(ct_unet_cfg(v), ct_unet_cfg(m->impl), sizeof(ct_unet_config)));
  CHECK(!memcmp(ct_unet_params(v), w, n * sizeof(float)));
  /* a slice of the checkpoint through the flat loader */
  float *part = malloc(100 * sizeof(float));
  REQUIRE(m->ops->load(m, dir, 1000, 1100, part, &err) == CT_OK);
  CHECK(!memcmp(part, w + 1000, 100 * sizeof(float)));
  free(part);
  ct_unet_free(v);
  /* resident on the sealed backend, saved through a host copy swapped in */
  const ct_backend_ops *se = NULL;
  REQUIRE(ct_backend_get("sealed", &se, &err) == CT_OK);
  float *host = malloc(n * sizeof(float));
  memcpy(host, w, n * sizeof(float));
  REQUIRE(m->ops->set_backend(m, se, &err) == CT_OK && ct_unet_backend(m->impl) == se);
  float *dev = m->ops->swap_params(m, host);
  ct_err e = {0};
  CHECK(ct_unet_forward(m->impl, &(ct_unet_inputs){0}, NULL, NULL, &e) == CT_ERR_INVALID &&
        strstr(e.msg, "swapped"));
  snprintf(dir, sizeof dir, "%s/unet_ckpt_sealed", ct_test_tmpdir());
  REQUIRE(m->ops->save(m, dir, &err) == CT_OK);
  CHECK(m->ops->swap_params(m, dev) == host);
  snprintf(sub, sizeof sub, "%s/unet", dir);
  REQUIRE(ct_unet_from_pretrained(sub, &v, &err) == CT_OK);
  CHECK(!memcmp(ct_unet_params(v), host, n * sizeof(float)));
  ct_unet_free(v);
  /* and without the swap: the U-net copies its weights out itself */
  snprintf(dir, sizeof dir, "%s/unet_ckpt_sealed2", ct_test_tmpdir());
  REQUIRE(m->ops->save(m, dir, &err) == CT_OK);
  snprintf(sub, sizeof sub, "%s/unet", dir);
  REQUIRE(ct_unet_from_pretrained(sub, &v, &err) == CT_OK);
  CHECK(!memcmp(ct_unet_params(v), host, n * sizeof(float)));
  ct_unet_free(v);
  free(host);
  ct_model_free(m);
}

/* SimpleTuner's SDXL LoRA targets on the real SDXL U-net: the four attention
 * projections of both attentions of its 70 transformer blocks */
CT_TEST(unet, lora_targets) {
  ct_unet_config c;
  ct_unet_config_sdxl(&c);
  ct_unet_linear *l = NULL;
  size_t n = 0;
  ct_err err = {0};
  REQUIRE(ct_unet_lora_targets(&c, NULL, &l, &n, &err) == CT_OK);
  CHECKF(n == 70 * 2 * 4, "%zu targets", n);
  size_t cross_k = 0, with_bias = 0;
  for (size_t i = 0; i < n; i++) {
    const size_t nl = strlen(l[i].name);
    if (nl > 10 && !strcmp(l[i].name + nl - 10, "attn2.to_k")) cross_k += l[i].in == 2048;
    with_bias += l[i].b != (size_t)-1;
  }
  CHECK(cross_k == 70 && with_bias == 140); /* to_out.0 has the only bias */
  free(l);
  /* a dotted suffix and a full name; the same module named twice counts once */
  REQUIRE(ct_unet_lora_targets(&c, "attn2.to_k, mid_block.attentions.0.proj_in,ff.net.2,ff.net.2",
                               &l, &n, &err) == CT_OK);
  CHECKF(n == 70 + 1 + 70, "%zu targets", n);
  free(l);
  ct_err e = {0};
  CHECK(ct_unet_lora_targets(&c, "to_q,conv1", &l, &n, &e) == CT_ERR_UNSUPPORTED &&
        strstr(e.msg, "conv1") && !l && !n);
  CHECK(ct_unet_lora_targets(&c, "to_qq", &l, &n, &e) == CT_ERR_NOT_FOUND &&
        strstr(e.msg, "to_qq"));
}

/* a copy of a host array in be's memory */
static float *on(const ct_backend_ops *be, const float *h, size_t n) {
  float *d = be->alloc(CT_MEM_BUFFERS, n * sizeof(float));
  if (d) be->copy_in(d, h, n * sizeof(float));
  return d;
}

/* On the test backend "sealed" (memory the host cannot touch; the CPU's
 * kernels) the U-net gives the CPU's bits: it reaches its buffers through
 * the table only; everything it allocated there is freed. The SD-layout
 * golden: the sealed backend re-protects every block around every op, so
 * its cost grows with ops x buffers. */
CT_TEST(unet, sealed_backend) {
  const ct_backend_ops *se = NULL;
  ct_err err = {0};
  REQUIRE(ct_backend_get("sealed", &se, &err) == CT_OK && !se->host_memory);
  golden gd;
  REQUIRE(golden_open(&gd, "sd/"));
  ct_unet *u = NULL;
  REQUIRE(ct_unet_from_pretrained(vdata("sd/", ""), &u, &err) == CT_OK);
  const size_t nw = ct_unet_numel(u), ns = (size_t)gd.in.B * 4 * gd.in.H * gd.in.W, ne = gd.nenc;
  /* on the CPU */
  float *out = malloc(ns * sizeof(float)), *ds = malloc(ns * sizeof(float)),
        *de = malloc(ne * sizeof(float)), *gw = malloc(nw * sizeof(float));
  ct_unet_tape *tp = NULL;
  REQUIRE(ct_unet_forward(u, &gd.in, out, &tp, &err) == CT_OK);
  REQUIRE(ct_unet_backward(u, tp, gd.r, ds, de, &err) == CT_OK);
  ct_unet_tape_free(tp);
  memcpy(gw, ct_unet_grads(u), nw * sizeof(float));
  ct_unet_free(u);
  /* on the sealed backend */
  ct_mem_stats m0, m1, d0, d1;
  ct_mem_get_stats(&m0);
  ct_mem_get_device_stats(&d0);
  REQUIRE(ct_unet_from_pretrained(vdata("sd/", ""), &u, &err) == CT_OK);
  REQUIRE(ct_unet_set_backend(u, se, &err) == CT_OK && ct_unet_backend(u) == se);
  ct_unet_inputs in = gd.in;
  CHECK(!gd.te && !gd.ids); /* no added conditioning in this layout */
  float *b[] = {on(se, gd.sample, ns),
                on(se, gd.ts, (size_t)in.B),
                on(se, gd.enc, ne),
                NULL,
                NULL,
                on(se, gd.r, ns),
                se->alloc(CT_MEM_BUFFERS, ns * sizeof(float)),
                se->alloc(CT_MEM_BUFFERS, ns * sizeof(float)),
                se->alloc(CT_MEM_BUFFERS, ne * sizeof(float))};
  in.sample = b[0], in.timesteps = b[1], in.encoder_hidden_states = b[2];
  in.text_embeds = b[3], in.time_ids = b[4];
  REQUIRE(ct_unet_forward(u, &in, b[6], &tp, &err) == CT_OK);
  REQUIRE(ct_unet_backward(u, tp, b[5], b[7], b[8], &err) == CT_OK);
  ct_unet_tape_free(tp);
  float *h = malloc(nw * sizeof(float));
  se->copy_out(h, b[6], ns * sizeof(float));
  CHECK(!memcmp(h, out, ns * sizeof(float)));
  se->copy_out(h, b[7], ns * sizeof(float));
  CHECK(!memcmp(h, ds, ns * sizeof(float)));
  se->copy_out(h, b[8], ne * sizeof(float));
  CHECK(!memcmp(h, de, ne * sizeof(float)));
  se->copy_out(h, ct_unet_grads(u), nw * sizeof(float));
  CHECK(!memcmp(h, gw, nw * sizeof(float)));
  for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) se->free(b[i]);
  ct_unet_free(u);
  ct_mem_get_stats(&m1);
  ct_mem_get_device_stats(&d1);
  CHECKF(m1.total_current == m0.total_current && d1.total_current == d0.total_current,
         "bytes left allocated: host %zd, sealed %zd",
         (ssize_t)(m1.total_current - m0.total_current),
         (ssize_t)(d1.total_current - d0.total_current));
  CHECK(d1.total_peak > d0.total_current); /* it did live there */
  free(out), free(ds), free(de), free(gw), free(h);
  golden_close(&gd);
}

/* The memory plan (a dry run: nothing computed, no weights) equals what the
 * CPU backend's accounting measures for the same forward and backward; SDXL's
 * numbers at 1024x1024 (128x128 latents) are printed for docs/unet.md. */
CT_TEST(unet, memory_plan) {
  golden gd;
  REQUIRE(golden_open(&gd, ""));
  ct_err err = {0};
  ct_unet *u = NULL;
  REQUIRE(ct_unet_from_pretrained(data(""), &u, &err) == CT_OK);
  ct_unet_plan plan;
  REQUIRE(ct_unet_plan_memory(ct_unet_cfg(u), gd.in.B, gd.in.H, gd.in.W, gd.in.Lk, &plan, &err) ==
          CT_OK);
  ct_mem_stats m0, m1, m2;
  ct_mem_reset_peak();
  ct_mem_get_stats(&m0);
  REQUIRE(ct_unet_forward(u, &gd.in, NULL, NULL, &err) == CT_OK); /* inference */
  ct_mem_get_stats(&m1);
  const size_t inf = m1.total_peak - m0.total_current;
  CHECKF(plan.inference_peak == inf, "inference: plan %zu, measured %zu", plan.inference_peak, inf);
  CHECKF(plan.inference_peak < plan.forward_bytes / 2, "inference %zu, forward with a tape %zu",
         plan.inference_peak, plan.forward_bytes);
  ct_mem_reset_peak(); /* the convolution scratch stays, counted in forward_bytes */
  ct_unet_tape *tp = NULL;
  REQUIRE(ct_unet_forward(u, &gd.in, NULL, &tp, &err) == CT_OK);
  ct_mem_get_stats(&m1);
  REQUIRE(ct_unet_backward(u, tp, gd.r, NULL, NULL, &err) == CT_OK);
  ct_mem_get_stats(&m2);
  ct_unet_tape_free(tp);
  const size_t fwd = m1.current[CT_MEM_ACTIVATIONS] + m1.current[CT_MEM_BUFFERS] -
                     m0.current[CT_MEM_ACTIVATIONS] - m0.current[CT_MEM_BUFFERS];
  CHECKF(plan.forward_bytes == fwd, "forward: plan %zu, measured %zu", plan.forward_bytes, fwd);
  const size_t act = m2.peak[CT_MEM_ACTIVATIONS] - m0.current[CT_MEM_ACTIVATIONS];
  CHECKF(plan.activations_peak == act, "activations: plan %zu, measured %zu", plan.activations_peak,
         act);
  CHECK(plan.params_bytes == ct_unet_numel(u) * 4 && plan.grads_bytes == plan.params_bytes);
  CHECK(plan.total_peak >= plan.activations_peak + plan.grads_bytes);
  ct_unet_free(u);
  golden_close(&gd);
  ct_unet_config c;
  ct_unet_config_sdxl(&c);
  for (int B = 1; B <= 8; B += 7) {
    REQUIRE(ct_unet_plan_memory(&c, B, 128, 128, 77, &plan, &err) == CT_OK);
    fprintf(stderr,
            "  SDXL 1024x1024, batch %d: params %.2f GiB, grads %.2f GiB, tape after the forward "
            "%.2f GiB, activations at the peak %.2f GiB, everything but the params %.2f GiB; "
            "inference %.2f GiB\n",
            B, plan.params_bytes / 1073741824.0, plan.grads_bytes / 1073741824.0,
            plan.forward_bytes / 1073741824.0, plan.activations_peak / 1073741824.0,
            plan.total_peak / 1073741824.0, plan.inference_peak / 1073741824.0);
    CHECK(plan.params_bytes == 2567463684ull * 4 && plan.forward_bytes > plan.params_bytes / 8);
  }
}

/* VAE tests: diffusers config.json parsing and its errors, the parameter
 * table against the PyTorch golden file (tests/data/vae_golden.safetensors,
 * scripts/vae_golden.py), encoder mean/logvar and decoder output parity,
 * legacy attention names, and one error listing every bad tensor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/fs.h"
#include "ctuner/safetensors.h"
#include "ctuner/vae.h"
#include "harness.h"

/* The golden model: config from the file's metadata, weights copied into a
 * weights-only file (renamed by rename_fn if given, minus `drop`, plus `extra`). */
typedef const char *(*rename_fn)(const char *name, char *buf, size_t n);

static ct_status golden_weights(const ct_st_file *g, const ct_vae *v, const char *path,
                                rename_fn rn, const char *drop, const char *reshape, int extra,
                                ct_err *err) {
  ct_st_writer *w = NULL;
  if (ct_st_writer_new(&w)) return CT_ERR_NOMEM;
  size_t np;
  const ct_vae_param *tab = ct_vae_table(v, &np);
  ct_status st = CT_OK;
  float **bufs = calloc(np + 1, sizeof *bufs);
  for (size_t i = 0; !st && i < np; i++) {
    if (drop && !strcmp(tab[i].name, drop)) continue;
    const ct_st_tensor *t = ct_st_find(g, tab[i].name);
    if (!t) return ct_errf(err, CT_ERR_NOT_FOUND, "golden lacks %s", tab[i].name);
    bufs[i] = malloc(t->numel * sizeof(float));
    st = ct_st_to_f32(t, bufs[i], t->numel, err);
    char nb[200];
    const char *name = rn ? rn(tab[i].name, nb, sizeof nb) : tab[i].name;
    int64_t shape[4];
    int ndim = t->ndim;
    for (int k = 0; k < ndim; k++) shape[k] = t->shape[k];
    if (reshape && !strcmp(tab[i].name, reshape)) shape[0] += 1; /* a wrong shape */
    if (!st && (!reshape || strcmp(tab[i].name, reshape)))
      st = ct_st_writer_add_f32(w, name, ndim, shape, bufs[i], CT_DTYPE_F32, err);
    else if (!st) {
      float *big = calloc(t->numel * 2 + 64, sizeof(float));
      free(bufs[i]);
      bufs[i] = big;
      st = ct_st_writer_add_f32(w, name, ndim, shape, big, CT_DTYPE_F32, err);
    }
  }
  float one = 1;
  int64_t s1[1] = {1};
  if (!st && extra)
    st = ct_st_writer_add_f32(w, "encoder.not_a_layer.weight", 1, s1, &one, CT_DTYPE_F32, err);
  if (!st) st = ct_st_writer_write(w, path, err);
  ct_st_writer_free(w);
  for (size_t i = 0; i < np; i++) free(bufs[i]);
  free(bufs);
  return st;
}

/* max |a - ref| / max(max |ref|, floor) */
static double rel_err_floor(const float *a, const ct_st_tensor *ref, size_t n, double floor_);
static double rel_err(const float *a, const ct_st_tensor *ref, size_t n) {
  return rel_err_floor(a, ref, n, 1e-12);
}
static double rel_err_floor(const float *a, const ct_st_tensor *ref, size_t n, double floor_) {
  float *r = malloc(n * sizeof(float));
  ct_err e = {0};
  if (ct_st_to_f32(ref, r, n, &e)) {
    free(r);
    return 1e9;
  }
  double md = 0, mr = 0;
  for (size_t i = 0; i < n; i++) {
    md = ct_test_max(md, fabs((double)a[i] - r[i]));
    mr = ct_test_max(mr, fabs((double)r[i]));
  }
  free(r);
  return md / ct_test_max(mr, floor_); /* NaN when a or ref holds a NaN or Inf */
}

static const char *legacy(const char *name, char *buf, size_t n) {
  const char *p;
  if ((p = strstr(name, ".to_q.")))
    snprintf(buf, n, "%.*s.query.%s", (int)(p - name), name, p + 6);
  else if ((p = strstr(name, ".to_out.0.")))
    snprintf(buf, n, "%.*s.proj_attn.%s", (int)(p - name), name, p + 10);
  else
    return name;
  return buf;
}

CT_TEST(vae, golden_parity) {
  ct_err err = {0};
  ct_st_file *g = NULL;
  REQUIRE(ct_st_open(ct_test_data("vae_golden.safetensors"), &g, &err) == CT_OK);
  const char *cfgp = ct_test_write_tmp("config.json", ct_st_meta(g, "config"));
  ct_vae_config c;
  REQUIRE(ct_vae_config_load(cfgp, &c, &err) == CT_OK);
  CHECK(c.nblocks == 2 && c.block_out_channels[1] == 16 && c.latent_channels == 4 &&
        c.norm_num_groups == 4);
  CHECK(fabsf(c.scaling_factor - 0.5f) < 1e-7f && fabsf(c.shift_factor - 0.1f) < 1e-7f);
  ct_vae *v = NULL;
  REQUIRE(ct_vae_new(&c, 1, &v, &err) == CT_OK);
  /* the table is the golden file's parameters, name for name and shape for shape */
  size_t np, ngold = 0;
  const ct_vae_param *tab = ct_vae_table(v, &np);
  for (size_t i = 0; i < g->ntensors; i++)
    ngold += strncmp(g->tensors[i].name, "grad.", 5) && strncmp(g->tensors[i].name, "in.", 3) &&
             strncmp(g->tensors[i].name, "out.", 4);
  CHECKF(np == ngold, "%zu parameters, golden has %zu", np, ngold);
  char wpath[1100];
  snprintf(wpath, sizeof wpath, "%s/vae.safetensors", ct_test_tmpdir());
  REQUIRE(golden_weights(g, v, wpath, NULL, NULL, NULL, 0, &err) == CT_OK);
  REQUIRE(ct_vae_load(v, wpath, &err) == CT_OK);
  /* encoder */
  const ct_st_tensor *x = ct_st_find(g, "in.x"), *z = ct_st_find(g, "in.z");
  REQUIRE(x && z && x->ndim == 4 && z->ndim == 4);
  const int B = (int)x->shape[0], H = (int)x->shape[2], W = (int)x->shape[3];
  const int h = (int)z->shape[2], w = (int)z->shape[3];
  float *xf = malloc(x->numel * sizeof(float)), *zf = malloc(z->numel * sizeof(float));
  REQUIRE(ct_st_to_f32(x, xf, x->numel, &err) == CT_OK &&
          ct_st_to_f32(z, zf, z->numel, &err) == CT_OK);
  const size_t nl = (size_t)B * 4 * (H / 2) * (W / 2);
  float *mean = malloc(nl * sizeof(float)), *logvar = malloc(nl * sizeof(float));
  REQUIRE(ct_vae_encode(v, B, H, W, xf, mean, logvar, &err) == CT_OK);
  double e1 = rel_err(mean, ct_st_find(g, "out.mean"), nl),
         e2 = rel_err(logvar, ct_st_find(g, "out.logvar"), nl);
  CHECKF(e1 < 1e-4 && e2 < 1e-4, "encoder: mean %.3g logvar %.3g relative error", e1, e2);
  /* decoder */
  const size_t nd = (size_t)B * 3 * (h * 2) * (w * 2);
  float *dec = malloc(nd * sizeof(float));
  REQUIRE(ct_vae_decode(v, B, h, w, zf, dec, &err) == CT_OK);
  double e3 = rel_err(dec, ct_st_find(g, "out.decoded"), nd);
  CHECKF(e3 < 1e-4, "decoder: %.3g relative error", e3);
  /* a second call reuses the workspace and gives the same bits */
  float *dec2 = malloc(nd * sizeof(float));
  REQUIRE(ct_vae_decode(v, B, h, w, zf, dec2, &err) == CT_OK);
  CHECK(!memcmp(dec, dec2, nd * sizeof(float)));
  /* gradients: the golden loss is sum(mean rm) + sum(logvar rl) + sum(decoded rd) */
  {
    const ct_st_tensor *rm = ct_st_find(g, "in.rm"), *rl = ct_st_find(g, "in.rl"),
                       *rd = ct_st_find(g, "in.rd");
    REQUIRE(rm && rl && rd && rm->numel == nl && rd->numel == nd);
    float *frm = malloc(nl * sizeof(float)), *frl = malloc(nl * sizeof(float)),
          *frd = malloc(nd * sizeof(float));
    REQUIRE(!ct_st_to_f32(rm, frm, nl, &err) && !ct_st_to_f32(rl, frl, nl, &err) &&
            !ct_st_to_f32(rd, frd, nd, &err));
    float *m2 = malloc(nl * sizeof(float)), *l2 = malloc(nl * sizeof(float)),
          *d3 = malloc(nd * sizeof(float));
    float *dx = malloc(x->numel * sizeof(float)), *dz = malloc(z->numel * sizeof(float));
    ct_vae_tape *te = NULL, *td = NULL;
    REQUIRE(ct_vae_encode_fwd(v, B, H, W, xf, m2, l2, &te, &err) == CT_OK);
    REQUIRE(ct_vae_decode_fwd(v, B, h, w, zf, d3, &td, &err) == CT_OK);
    /* the recorded forward computes the same bits as the plain one */
    CHECK(!memcmp(m2, mean, nl * sizeof(float)) && !memcmp(l2, logvar, nl * sizeof(float)));
    CHECK(!memcmp(d3, dec, nd * sizeof(float)));
    REQUIRE(ct_vae_encode_bwd(v, te, frm, frl, dx, &err) == CT_OK);
    REQUIRE(ct_vae_decode_bwd(v, td, frd, dz, &err) == CT_OK);
    ct_vae_tape_free(te);
    ct_vae_tape_free(td);
    double ex = rel_err(dx, ct_st_find(g, "grad.in.x"), x->numel),
           ez = rel_err(dz, ct_st_find(g, "grad.in.z"), z->numel);
    CHECKF(ex < 1e-4 && ez < 1e-4, "input gradients: x %.3g z %.3g", ex, ez);
    const float *gw = ct_vae_grads(v);
    /* relative per tensor; a tensor whose true gradient is ~0 (the key bias:
     * softmax ignores a shift shared by all keys) against 1e-3 of the largest */
    double gmax = 0;
    for (size_t i = 0; i < ct_vae_numel(v); i++) gmax = ct_test_max(gmax, fabs(gw[i]));
    double worst = 0;
    const char *wname = "";
    for (size_t i = 0; i < np; i++) {
      char gname[160];
      snprintf(gname, sizeof gname, "grad.%s", tab[i].name);
      const ct_st_tensor *gt = ct_st_find(g, gname);
      REQUIRE(gt && gt->numel == tab[i].numel);
      double e = rel_err_floor(gw + tab[i].offset, gt, tab[i].numel, 1e-3 * gmax);
      if (!isnan(worst) && !(e <= worst)) worst = e, wname = tab[i].name; /* a NaN sticks */
    }
    CHECKF(worst < 1e-4, "parameter gradients: worst %.3g relative (%s)", worst, wname);
    free(frm), free(frl), free(frd), free(m2), free(l2), free(d3), free(dx), free(dz);
  }
  /* tiled, as diffusers' tiled_encode/tiled_decode (tile 8 px on a 2x VAE) */
  {
    const ct_st_tensor *xt = ct_st_find(g, "in.xt"), *zt = ct_st_find(g, "in.zt");
    REQUIRE(xt && zt);
    const int TH = (int)xt->shape[2], TW = (int)xt->shape[3], th = (int)zt->shape[2],
              tw = (int)zt->shape[3];
    float *fx = malloc(xt->numel * sizeof(float)), *fz = malloc(zt->numel * sizeof(float));
    REQUIRE(!ct_st_to_f32(xt, fx, xt->numel, &err) && !ct_st_to_f32(zt, fz, zt->numel, &err));
    const size_t tl = (size_t)4 * (TH / 2) * (TW / 2), td = (size_t)3 * (th * 2) * (tw * 2);
    float *tm = malloc(tl * sizeof(float)), *tlv = malloc(tl * sizeof(float)),
          *tdec = malloc(td * sizeof(float));
    REQUIRE(ct_vae_encode_tiled(v, 1, TH, TW, fx, 8, tm, tlv, &err) == CT_OK);
    REQUIRE(ct_vae_decode_tiled(v, 1, th, tw, fz, 8, tdec, &err) == CT_OK);
    double a = rel_err(tm, ct_st_find(g, "out.tiled_mean"), tl),
           b2 = rel_err(tlv, ct_st_find(g, "out.tiled_logvar"), tl),
           c2 = rel_err(tdec, ct_st_find(g, "out.tiled_decoded"), td);
    CHECKF(a < 1e-4 && b2 < 1e-4 && c2 < 1e-4, "tiled: mean %.3g logvar %.3g decoded %.3g", a, b2,
           c2);
    /* a tile as large as the image is the untiled path */
    float *um = malloc(tl * sizeof(float));
    REQUIRE(ct_vae_encode_tiled(v, 1, TH, TW, fx, 32, um, NULL, &err) == CT_OK);
    REQUIRE(ct_vae_encode(v, 1, TH, TW, fx, tm, NULL, &err) == CT_OK);
    CHECK(!memcmp(um, tm, tl * sizeof(float)));
    CHECK(ct_vae_encode_tiled(v, 1, TH, TW, fx, 6, tm, NULL, &err) == CT_ERR_INVALID &&
          strstr(err.msg, "multiple of 4"));
    free(fx), free(fz), free(tm), free(tlv), free(tdec), free(um);
  }
  /* the older attention names load too */
  REQUIRE(golden_weights(g, v, wpath, legacy, NULL, NULL, 0, &err) == CT_OK);
  ct_vae *v2 = NULL;
  REQUIRE(ct_vae_new(&c, 2, &v2, &err) == CT_OK);
  CHECKF(ct_vae_load(v2, wpath, &err) == CT_OK, "%s", err.msg);
  REQUIRE(ct_vae_decode(v2, B, h, w, zf, dec2, &err) == CT_OK);
  CHECK(!memcmp(dec, dec2, nd * sizeof(float)));
  /* save + from_pretrained round trip */
  char dir[1100], p2[1200];
  snprintf(dir, sizeof dir, "%s/vae_dir", ct_test_tmpdir());
  REQUIRE(ct_mkdir_p(dir, &err) == CT_OK);
  snprintf(p2, sizeof p2, "%s/diffusion_pytorch_model.safetensors", dir);
  REQUIRE(ct_vae_save(v, p2, &err) == CT_OK);
  char *cj = ct_vae_config_json(&c);
  snprintf(p2, sizeof p2, "%s/config.json", dir);
  REQUIRE(cj && ct_write_file_atomic(p2, cj, strlen(cj), &err) == CT_OK);
  free(cj);
  ct_vae *v3 = NULL;
  REQUIRE(ct_vae_from_pretrained(dir, &v3, &err) == CT_OK);
  REQUIRE(ct_vae_decode(v3, B, h, w, zf, dec2, &err) == CT_OK);
  CHECK(!memcmp(dec, dec2, nd * sizeof(float)));
  /* one error lists every problem: missing, wrongly shaped, unexpected */
  REQUIRE(golden_weights(g, v, wpath, NULL, "decoder.conv_out.bias",
                         "encoder.mid_block.attentions.0.to_k.weight", 1, &err) == CT_OK);
  ct_err e4 = {0};
  CHECK(ct_vae_load(v2, wpath, &e4) == CT_ERR_SHAPE);
  CHECKF(strstr(e4.msg, "1 missing [decoder.conv_out.bias]") &&
             strstr(e4.msg, "1 wrongly shaped") &&
             strstr(e4.msg, "to_k.weight (file: F32 [17, 16], model: F32/F16/BF16 [16, 16])") &&
             strstr(e4.msg, "1 unexpected [encoder.not_a_layer.weight]"),
         "%s", e4.msg);
  ct_vae_free(v);
  ct_vae_free(v2);
  ct_vae_free(v3);
  free(xf), free(zf), free(mean), free(logvar), free(dec), free(dec2);
  ct_st_close(g);
}

CT_TEST(vae, config_errors) {
  ct_vae_config c;
  ct_err err = {0};
  static const struct {
    const char *json, *want;
  } bad[] = {
      {"{\"_class_name\": \"AutoencoderTiny\"}", "ctuner loads AutoencoderKL VAEs"},
      {"{\"block_out_channels\": [64, 100], \"norm_num_groups\": 32}",
       "block_out_channels[1] = 100"},
      {"{\"block_out_channels\": [64], \"down_block_types\": [\"DownBlock2D\"]}",
       "down_block_types[0] must be DownEncoderBlock2D"},
      {"{\"block_out_channels\": [64, 64], \"up_block_types\": [\"UpDecoderBlock2D\"]}",
       "up_block_types must list 2 blocks"},
      {"{\"latent_channels\": 0}", "latent_channels must be an integer between 1 and 1024"},
      {"{\"use_quant_conv\": 1}", "use_quant_conv must be true or false"},
      {"{\"act_fn\": \"gelu\"}", "act_fn must be \"silu\""},
      {"[1]", "not a JSON object"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *p = ct_test_write_tmp("bad_config.json", bad[i].json);
    memset(&err, 0, sizeof err);
    CHECKF(ct_vae_config_load(p, &c, &err) != CT_OK, "%s accepted", bad[i].json);
    CHECKF(strstr(err.msg, bad[i].want) && strstr(err.msg, "bad_config.json"), "%s: %s",
           bad[i].json, err.msg);
  }
  /* SD's config loads with null shift_factor and the defaults */
  const char *p = ct_test_write_tmp(
      "sd_config.json",
      "{\"_class_name\": \"AutoencoderKL\", \"act_fn\": \"silu\", \"block_out_channels\": [128, "
      "256, 512, 512], \"down_block_types\": [\"DownEncoderBlock2D\", \"DownEncoderBlock2D\", "
      "\"DownEncoderBlock2D\", \"DownEncoderBlock2D\"], \"in_channels\": 3, \"latent_channels\": "
      "4, "
      "\"layers_per_block\": 2, \"norm_num_groups\": 32, \"out_channels\": 3, \"sample_size\": "
      "512, "
      "\"scaling_factor\": 0.18215, \"shift_factor\": null, \"up_block_types\": "
      "[\"UpDecoderBlock2D\", \"UpDecoderBlock2D\", \"UpDecoderBlock2D\", \"UpDecoderBlock2D\"]}");
  REQUIRE(ct_vae_config_load(p, &c, &err) == CT_OK);
  CHECK(c.nblocks == 4 && ct_vae_factor(&c) == 8 && c.shift_factor == 0 && c.use_quant_conv &&
        c.layers_per_block == 2);
  /* its parameter count is the SD VAE's 83,653,863 */
  ct_vae *v = NULL;
  REQUIRE(ct_vae_new(&c, 0, &v, &err) == CT_OK);
  CHECKF(ct_vae_numel(v) == 83653863, "%zu parameters", ct_vae_numel(v));
  ct_vae_free(v);
}

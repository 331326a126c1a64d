/* diffusers' FluxTransformer2DModel in and out (src/model/flux_*.c), against
 * goldens written by diffusers itself (scripts/flux_golden.py, tests/data/flux):
 * config.json parsing and writing (byte-identical to save_pretrained's), the
 * name map against diffusers' own BFL converter at FLUX.1's width, forward
 * and every parameter gradient within 1e-4 of diffusers (dev: guidance, BF16
 * weights, one file; schnell: no guidance, F32, sharded with an index), a BFL
 * single file, saving (names, values, shards) and the errors.
 * CT_FLUX_DATA overrides the data directory (make interop: fresh goldens).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ctuner/fs.h"
#include "ctuner/mmdit.h"
#include "ctuner/safetensors.h"
#include "harness.h"

#define data(rel) ct_test_data_in("CT_FLUX_DATA", "flux", rel)
#define tensor ct_test_tensor
#define rel_err ct_test_rel_err

CT_TEST(flux, config_parse_and_refusals) {
  ct_mmdit_config c;
  ct_err e;
  REQUIRE(!ct_flux_config_read(data("dev/transformer/config.json"), &c, &e));
  CHECK(c.in_channels == 4 && c.patch == 2 && c.hidden == 32 && c.heads == 2);
  CHECK(c.depth_double == 2 && c.depth_single == 1 && c.context_in_dim == 32 &&
        c.vec_in_dim == 16 && c.guidance_embed == 1);
  CHECK(c.axes_dim[0] == 4 && c.axes_dim[1] == 6 && c.axes_dim[2] == 6);
  static const struct {
    const char *json, *needle;
  } bad[] = {
      {"{\"_class_name\":\"SD3Transformer2DModel\",\"patch_size\":1}", "SD3Transformer2DModel"},
      {"{\"_class_name\":\"FluxTransformer2DModel\",\"use_rope\":true}", "use_rope"},
      {"{\"_class_name\":\"FluxTransformer2DModel\",\"patch_size\":2,\"in_channels\":64,"
       "\"num_layers\":1,\"num_single_layers\":1,\"attention_head_dim\":16,"
       "\"num_attention_heads\":2,\"joint_attention_dim\":8,\"pooled_projection_dim\":8,"
       "\"axes_dims_rope\":[4,6,6]}",
       "patch_size 2"},
      {"{\"_class_name\":\"FluxTransformer2DModel\",\"patch_size\":1,\"in_channels\":64,"
       "\"out_channels\":32,\"num_layers\":1,\"num_single_layers\":1,\"attention_head_dim\":16,"
       "\"num_attention_heads\":2,\"joint_attention_dim\":8,\"pooled_projection_dim\":8,"
       "\"axes_dims_rope\":[4,6,6]}",
       "out_channels 32"},
      {"{\"_class_name\":\"FluxTransformer2DModel\",\"patch_size\":1,\"in_channels\":62,"
       "\"num_layers\":1,\"num_single_layers\":1,\"attention_head_dim\":16,"
       "\"num_attention_heads\":2,\"joint_attention_dim\":8,\"pooled_projection_dim\":8,"
       "\"axes_dims_rope\":[4,6,6]}",
       "in_channels 62"},
      {"{\"_class_name\":\"FluxTransformer2DModel\",\"patch_size\":1,\"in_channels\":64,"
       "\"num_layers\":1,\"num_single_layers\":1,\"attention_head_dim\":16,"
       "\"num_attention_heads\":2,\"joint_attention_dim\":8,\"pooled_projection_dim\":8,"
       "\"axes_dims_rope\":[4,6,8]}",
       "axes_dim"},
      {"{\"_class_name\":\"FluxTransformer2DModel\",\"patch_size\":1,\"in_channels\":64}",
       "num_layers is missing"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ct_status st = ct_flux_config_parse(bad[i].json, strlen(bad[i].json), "cfg.json", &c, &e);
    CHECKF(st && strstr(e.msg, bad[i].needle) && strstr(e.msg, "cfg.json"), "case %zu: %s", i,
           st ? e.msg : "accepted");
  }
}

/* The config.json ctuner writes is byte for byte the one save_pretrained wrote. */
CT_TEST(flux, config_json_as_diffusers) {
  static const char *const names[] = {"dev", "schnell"};
  for (int k = 0; k < 2; k++) {
    char rel[64], *js = NULL;
    size_t n = 0;
    ct_mmdit_config c;
    ct_err e;
    snprintf(rel, sizeof rel, "%s/transformer/config.json", names[k]);
    char *want = ct_test_slurp(data(rel), &n);
    REQUIRE(want);
    REQUIRE(!ct_flux_config_read(data(rel), &c, &e));
    REQUIRE(!ct_flux_config_json(&c, &js, &e));
    CHECKF(!strcmp(js, want), "%s:\n%s\nvs diffusers':\n%s", names[k], js, want);
    free(js);
    free(want);
  }
}

/* ctuner's map at FLUX.1's width equals what diffusers' converter does (map_flux1.tsv). */
CT_TEST(flux, name_map_is_diffusers_converter) {
  ct_mmdit_config c = {16, 2, 3072, 24, {16, 56, 56}, 1, 1, 4, 4096, 768, 1, 1, 10000.f};
  ct_flux_name *m = NULL;
  size_t n = 0, lines = 0, found = 0;
  ct_err e;
  REQUIRE(!ct_flux_name_map(&c, &m, &n, &e));
  size_t tsv_len = 0;
  char *tsv = ct_test_slurp(data("map_flux1.tsv"), &tsv_len);
  REQUIRE(tsv);
  char *save = NULL;
  for (char *ln = strtok_r(tsv, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save)) {
    char dif[128], bfl[128];
    long long dr, br, rows;
    if (sscanf(ln, "%127s %lld %127s %lld %lld", dif, &dr, bfl, &br, &rows) != 5) continue;
    lines++;
    int hit = 0;
    for (size_t i = 0; i < n && !hit; i++)
      hit = !strcmp(m[i].dif, dif) && !strcmp(m[i].bfl, bfl) && m[i].dif_row == dr &&
            m[i].bfl_row == br && m[i].rows == rows;
    CHECKF(hit, "diffusers' converter: %s — not in ctuner's map", ln);
    found += (size_t)hit;
  }
  CHECKF(lines == n && found == n, "converter rows %zu, ctuner's %zu, matching %zu", lines, n,
         found);
  free(tsv);
  free(m);
}

/* Every parameter gradient of m against the golden's grad.<diffusers name>,
 * relative to the diffusers tensor's largest, within 1e-4. */
static void check_grads(ct_mmdit *m, ct_st_file *g, const char *name, double ev, int *ct_failed_) {
  const ct_mmdit_config *c = ct_mmdit_cfg(m);
  ct_err e;
  ct_flux_name *map = NULL;
  size_t nm = 0, ngrads = 0;
  double worst = 0;
  REQUIRE(!ct_flux_name_map(c, &map, &nm, &e));
  for (size_t i = 0; i < nm; i++) {
    char gn[160];
    snprintf(gn, sizeof gn, "grad.%s", map[i].dif);
    size_t cols = map[i].cols ? (size_t)map[i].cols : 1, n = 0;
    float *ref = tensor(g, gn, &n);
    CHECKF(ref, "%s: golden has no %s", name, gn);
    if (!ref) continue;
    const float *ours = ct_mmdit_grads(m) + ct_mmdit_find(m, map[i].bfl)->offset;
    /* relative to the whole diffusers tensor's largest gradient */
    double d = 0, r = 0;
    for (size_t j = 0; j < n; j++) r = ct_test_max(r, fabs(ref[j]));
    for (int64_t q = 0; q < map[i].rows * (int64_t)cols; q++) {
      double a = ours[map[i].bfl_row * (int64_t)cols + q],
             b = ref[map[i].dif_row * (int64_t)cols + q];
      d = ct_test_max(d, fabs(a - b));
    }
    double er = r > 0 ? d / r : d; /* NaN stays NaN */
    worst = ct_test_max(worst, er);
    CHECKF(er <= 1e-4, "%s: gradient of %s (rows %lld.. of %s) differs by %.3g", name, map[i].dif,
           (long long)map[i].bfl_row, map[i].bfl, er);
    ngrads++;
    free(ref);
  }
  fprintf(stderr, "  %s: v_pred %.2g, worst of %zu gradient pieces %.2g (rel. to max |ref|)\n",
          name, ev, ngrads, worst);
  free(map);
}

/* Run ctuner on a golden's inputs; compare the output and every gradient. */
static void check_golden(const char *name, int *ct_failed_) {
  char rel[128];
  ct_err e;
  ct_mmdit *m = NULL;
  ct_st_file *g = NULL;
  snprintf(rel, sizeof rel, "%s/transformer", name);
  REQUIRE(!ct_mmdit_open_diffusers(data(rel), CT_MMDIT_GRADS, &m, &e) ||
          !fprintf(stderr, "%s\n", e.msg));
  snprintf(rel, sizeof rel, "%s/golden.safetensors", name);
  REQUIRE(!ct_st_open(data(rel), &g, &e));
  const ct_mmdit_config *c = ct_mmdit_cfg(m);
  const ct_st_tensor *hs = ct_st_find(g, "hidden_states"),
                     *eh = ct_st_find(g, "encoder_hidden_states");
  REQUIRE(hs && eh && hs->ndim == 3 && hs->shape[2] == 4 * c->in_channels);
  int B = (int)hs->shape[0], L = (int)hs->shape[1], T = (int)eh->shape[1], C = c->in_channels;
  size_t ni = 0, nt = 0;
  float *img_ids = tensor(g, "img_ids", &ni), *txt_ids = tensor(g, "txt_ids", &nt);
  REQUIRE(img_ids && txt_ids && ni == (size_t)L * 3 && nt == (size_t)T * 3);
  /* diffusers' ids are ctuner's built-in positions: image (0, row, col) row-major, text 0. */
  int H = 2 * ((int)img_ids[3 * (L - 1) + 1] + 1), W = 2 * ((int)img_ids[3 * (L - 1) + 2] + 1);
  REQUIRE(H / 2 * (W / 2) == L);
  for (int l = 0; l < L; l++)
    CHECK(img_ids[3 * l] == 0 && img_ids[3 * l + 1] == l / (W / 2) &&
          img_ids[3 * l + 2] == l % (W / 2));
  for (size_t i = 0; i < nt; i++) CHECK(txt_ids[i] == 0);
  size_t nx = (size_t)B * C * H * W;
  float *packed = tensor(g, "hidden_states", NULL), *x = malloc(nx * 4), *v = malloc(nx * 4),
        *vp = malloc(nx * 4), *out = tensor(g, "out", NULL), *dvp = tensor(g, "dv", NULL),
        *dv = malloc(nx * 4);
  ct_mmdit_batch in = {B,
                       H,
                       W,
                       T,
                       x,
                       tensor(g, "timestep", NULL),
                       tensor(g, "encoder_hidden_states", NULL),
                       tensor(g, "pooled_projections", NULL),
                       tensor(g, "guidance", NULL)};
  REQUIRE(packed && x && v && vp && out && dvp && dv && in.t && in.txt && in.y);
  CHECK(!c->guidance_embed == !in.guidance);
  ct_flux_unpack(B, C, H, W, packed, x);
  REQUIRE(!ct_mmdit_forward(m, &in, v, &e));
  ct_flux_pack(B, C, H, W, v, vp);
  double ev = rel_err(vp, out, nx);
  CHECKF(ev <= 1e-4, "%s: v_pred differs from diffusers by %.3g", name, ev);
  ct_flux_unpack(B, C, H, W, dvp, dv);
  memset(ct_mmdit_grads(m), 0, ct_mmdit_numel(m) * sizeof(float));
  REQUIRE(!ct_mmdit_backward(m, dv, &e));
  check_grads(m, g, name, ev, ct_failed_);
  free(packed);
  free(x);
  free(v);
  free(vp);
  free(out);
  free(dvp);
  free(dv);
  free((void *)in.t);
  free((void *)in.txt);
  free((void *)in.y);
  free((void *)in.guidance);
  free(img_ids);
  free(txt_ids);
  ct_st_close(g);
  ct_mmdit_free(m);
}

CT_TEST(flux, dev_forward_backward_vs_diffusers) {
  check_golden("dev", ct_failed_);
}

CT_TEST(flux, schnell_sharded_forward_backward_vs_diffusers) {
  check_golden("schnell", ct_failed_);
}

/* FLUX.1 Kontext (scripts/flux_golden.py write_kontext): the dev model on a
 * target latent 4x6 followed by a reference latent 6x4 (ids (1, row, col));
 * the prediction of the target tokens and the gradients of a loss over them. */
CT_TEST(flux, kontext_reference_tokens_vs_diffusers) {
  ct_err e;
  ct_mmdit *m = NULL;
  ct_st_file *g = NULL;
  REQUIRE(!ct_mmdit_open_diffusers(data("dev/transformer"), CT_MMDIT_GRADS, &m, &e));
  REQUIRE(!ct_st_open(data("kontext/golden.safetensors"), &g, &e));
  const int C = ct_mmdit_cfg(m)->in_channels, P = 4 * C, B = 2, H = 4, W = 6, RH = 6, RW = 4;
  const int Lx = H / 2 * (W / 2), Lr = RH / 2 * (RW / 2), L = Lx + Lr, T = 5;
  size_t ni = 0, nh = 0, nx = (size_t)B * C * H * W, nr = (size_t)B * C * RH * RW;
  float *ids = tensor(g, "img_ids", &ni), *hs = tensor(g, "hidden_states", &nh);
  REQUIRE(ids && hs && ni == (size_t)L * 3 && nh == (size_t)B * L * P);
  for (int l = 0; l < L; l++) { /* the golden's ids are the ones ctuner builds */
    int r = l - Lx, gw = r < 0 ? W / 2 : RW / 2, k = r < 0 ? l : r;
    CHECKF(ids[3 * l] == (r >= 0) && ids[3 * l + 1] == k / gw && ids[3 * l + 2] == k % gw,
           "img_ids row %d", l);
  }
  float *x = malloc(nx * 4), *ref = malloc(nr * 4), *v = malloc(nx * 4), *vp = malloc(nx * 4),
        *dv = malloc(nx * 4), *dvp = tensor(g, "dv", NULL), *out = tensor(g, "out", NULL);
  REQUIRE(x && ref && v && vp && dv && dvp && out);
  for (int b = 0; b < B; b++) {
    const size_t o = (size_t)b * L * P;
    ct_flux_unpack(1, C, H, W, hs + o, x + (size_t)b * C * H * W);
    ct_flux_unpack(1, C, RH, RW, hs + o + (size_t)Lx * P, ref + (size_t)b * C * RH * RW);
    ct_flux_unpack(1, C, H, W, dvp + o, dv + (size_t)b * C * H * W);
  }
  ct_mmdit_batch in = {B,
                       H,
                       W,
                       T,
                       x,
                       tensor(g, "timestep", NULL),
                       tensor(g, "encoder_hidden_states", NULL),
                       tensor(g, "pooled_projections", NULL),
                       tensor(g, "guidance", NULL)};
  REQUIRE(in.t && in.txt && in.y && in.guidance);
  REQUIRE(!ct_mmdit_forward_ref(m, &in, ref, RH, RW, v, &e) || !fprintf(stderr, "%s\n", e.msg));
  ct_flux_pack(B, C, H, W, v, vp);
  double ev = rel_err(vp, out, nx);
  CHECKF(ev <= 1e-4, "kontext: v_pred differs from diffusers by %.3g", ev);
  memset(ct_mmdit_grads(m), 0, ct_mmdit_numel(m) * sizeof(float));
  REQUIRE(!ct_mmdit_backward(m, dv, &e));
  check_grads(m, g, "kontext", ev, ct_failed_);
  /* gradient checkpointing recomputes the longer sequence: the same bits */
  const size_t np = ct_mmdit_numel(m);
  float *g0 = malloc(np * sizeof *g0), *v0 = malloc(nx * 4);
  REQUIRE(g0 && v0);
  memcpy(g0, ct_mmdit_grads(m), np * sizeof *g0);
  memcpy(v0, v, nx * 4);
  ct_mmdit_set_checkpointing(m, 1);
  memset(ct_mmdit_grads(m), 0, np * sizeof(float));
  REQUIRE(!ct_mmdit_forward_ref(m, &in, ref, RH, RW, v, &e));
  REQUIRE(!ct_mmdit_backward(m, dv, &e));
  int nd = 0;
  CHECK(ct_mmdit_checkpointing(m, &nd, NULL) == 1 && nd > 0);
  CHECK(!memcmp(v0, v, nx * 4) && !memcmp(g0, ct_mmdit_grads(m), np * sizeof *g0));
  free(g0), free(v0);
  /* an odd reference size is refused by name */
  CHECK(ct_mmdit_forward_ref(m, &in, ref, 5, RW, v, &e) && strstr(e.msg, "reference latent 5x4"));
  free(ids), free(hs), free(x), free(ref), free(v), free(vp), free(dv), free(dvp), free(out);
  free((void *)in.t), free((void *)in.txt), free((void *)in.y), free((void *)in.guidance);
  ct_st_close(g);
  ct_mmdit_free(m);
}

/* The BFL single file (names as diffusers' converter reads them) is the schnell model. */
CT_TEST(flux, bfl_file_is_the_same_model) {
  ct_mmdit_config c;
  char prefix[64];
  int axes[3] = {4, 6, 6};
  ct_err e;
  ct_mmdit *a = NULL, *b = NULL;
  REQUIRE(!ct_flux_bfl_config(data("bfl.safetensors"), axes, &c, prefix, sizeof prefix, &e));
  CHECK(!strcmp(prefix, "") && c.hidden == 32 && c.heads == 2 && c.depth_double == 1 &&
        c.depth_single == 1 && !c.guidance_embed && c.in_channels == 4 && c.mlp_ratio == 4);
  /* Without axes and head_dim != 128 the RoPE split is asked for. */
  CHECK(ct_flux_bfl_config(data("bfl.safetensors"), NULL, &c, prefix, sizeof prefix, &e) &&
        strstr(e.msg, "axes_dims_rope"));
  REQUIRE(!ct_flux_bfl_config(data("bfl.safetensors"), axes, &c, prefix, sizeof prefix, &e));
  REQUIRE(!ct_mmdit_new(&c, 7, 0, &a, &e));
  REQUIRE(!ct_mmdit_load(a, data("bfl.safetensors"), prefix, &e));
  REQUIRE(!ct_mmdit_open_diffusers(data("schnell/transformer"), 0, &b, &e));
  REQUIRE(ct_mmdit_numel(a) == ct_mmdit_numel(b));
  CHECK(!memcmp(ct_mmdit_params(a), ct_mmdit_params(b), ct_mmdit_numel(a) * sizeof(float)));
  ct_mmdit_free(a);
  ct_mmdit_free(b);
}

/* Tensor names of a transformer directory (one file or shards), sorted into one string. */
static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *dir_names(const char *dir, int *nfiles) {
  char path[4096], *names[4096], *out = NULL;
  size_t n = 0, len = 0;
  *nfiles = 0;
  for (int k = 0; k <= 99; k++) {
    ct_st_file *f = NULL;
    ct_err e;
    if (k == 0)
      snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    else {
      /* any -0000k-of-0000N naming up to 99 shards */
      int found = 0;
      for (int N = k; N <= 99 && !found; N++) {
        snprintf(path, sizeof path, "%s/diffusion_pytorch_model-%05d-of-%05d.safetensors", dir, k,
                 N);
        struct stat sb;
        found = !stat(path, &sb);
      }
      if (!found) break;
    }
    if (ct_st_open(path, &f, &e)) continue;
    (*nfiles)++;
    for (size_t i = 0; i < f->ntensors && n < 4096; i++) names[n++] = strdup(f->tensors[i].name);
    ct_st_close(f);
  }
  qsort(names, n, sizeof *names, cmp_str);
  for (size_t i = 0; i < n; i++) len += strlen(names[i]) + 1;
  out = calloc(1, len + 1);
  for (size_t i = 0; out && i < n; i++) {
    strcat(out, names[i]);
    strcat(out, "\n");
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  return out;
}

/* ctuner's save: diffusers' names and config bytes, values intact, shards with an index. */
CT_TEST(flux, save_as_diffusers) {
  ct_err e;
  ct_mmdit *a = NULL, *b = NULL;
  char out1[2048], out2[2048], cfgp[4096];
  int nf = 0, nf_ref = 0;
  snprintf(out1, sizeof out1, "%s/flux_dev_out", ct_test_tmpdir());
  snprintf(out2, sizeof out2, "%s/flux_schnell_out", ct_test_tmpdir());
  REQUIRE(!ct_mmdit_open_diffusers(data("dev/transformer"), 0, &a, &e));
  REQUIRE(!ct_mmdit_save_diffusers(a, out1, 0, CT_DTYPE_F32, &e) ||
          !fprintf(stderr, "%s\n", e.msg));
  char *want = dir_names(data("dev/transformer"), &nf_ref), *got = dir_names(out1, &nf);
  REQUIRE(want && got);
  CHECKF(!strcmp(want, got) && nf == 1, "names differ:\n%s\nvs\n%s", got, want);
  free(got);
  free(want);
  snprintf(cfgp, sizeof cfgp, "%s/config.json", out1);
  size_t l1 = 0, l2 = 0;
  char *c1 = ct_test_slurp(cfgp, &l1),
       *c2 = ct_test_slurp(data("dev/transformer/config.json"), &l2);
  CHECK(c1 && c2 && !strcmp(c1, c2));
  free(c1);
  free(c2);
  REQUIRE(!ct_mmdit_open_diffusers(out1, 0, &b, &e));
  CHECK(!memcmp(ct_mmdit_params(a), ct_mmdit_params(b), ct_mmdit_numel(a) * sizeof(float)));
  ct_mmdit_free(b);
  b = NULL;
  /* a directory that exists and is not empty is refused; nothing is left behind */
  ct_status st = ct_mmdit_save_diffusers(a, out1, 0, CT_DTYPE_F32, &e);
  CHECKF(st && strstr(e.msg, "not an empty directory"), "%s", st ? e.msg : "accepted");
  ct_mmdit_free(a);
  a = NULL;

  /* sharded: 60,000-byte shards and the index, read back through the index */
  REQUIRE(!ct_mmdit_open_diffusers(data("schnell/transformer"), 0, &a, &e));
  REQUIRE(!ct_mmdit_save_diffusers(a, out2, 60000, CT_DTYPE_BF16, &e));
  want = dir_names(data("schnell/transformer"), &nf_ref);
  got = dir_names(out2, &nf);
  REQUIRE(want && got);
  CHECKF(!strcmp(want, got) && nf > 1, "%d shards; names differ:\n%s\nvs\n%s", nf, got, want);
  free(got);
  free(want);
  snprintf(cfgp, sizeof cfgp, "%s/diffusion_pytorch_model.safetensors.index.json", out2);
  struct stat sb;
  CHECK(!stat(cfgp, &sb));
  REQUIRE(!ct_mmdit_open_diffusers(out2, 0, &b, &e) || !fprintf(stderr, "%s\n", e.msg));
  double worst = rel_err(ct_mmdit_params(b), ct_mmdit_params(a), ct_mmdit_numel(a));
  CHECKF(worst <= 1.0 / 256, "bf16 save off by %.3g", worst);
  ct_mmdit_free(a);
  ct_mmdit_free(b);
}

/* Missing, wrongly shaped and unexpected tensors named together, with the file;
 * an index that points outside the directory or misses a tensor is refused. */
CT_TEST(flux, errors_name_everything) {
  ct_err e;
  ct_mmdit *a = NULL, *b = NULL;
  char dir[2048], path[4096];
  snprintf(dir, sizeof dir, "%s/flux_bad", ct_test_tmpdir());
  REQUIRE(!ct_mmdit_open_diffusers(data("schnell/transformer"), 0, &a, &e));
  REQUIRE(!ct_mmdit_save_diffusers(a, dir, 0, CT_DTYPE_F32, &e));
  /* rewrite the file: drop x_embedder.bias, shrink proj_out.weight, add an extra tensor */
  snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
  ct_st_file *f = NULL;
  ct_st_writer *w = NULL;
  REQUIRE(!ct_st_open(path, &f, &e) && !ct_st_writer_new(&w));
  float *bufs[1024];
  size_t nb = 0;
  for (size_t i = 0; i < f->ntensors; i++) {
    const ct_st_tensor *t = &f->tensors[i];
    if (!strcmp(t->name, "x_embedder.bias")) continue;
    float *v = tensor(f, t->name, NULL);
    bufs[nb++] = v;
    int64_t shp[2] = {t->shape[0], t->ndim > 1 ? t->shape[1] : 1};
    if (!strcmp(t->name, "proj_out.weight")) shp[0]--;
    REQUIRE(!ct_st_writer_add_f32(w, t->name, t->ndim, shp, v, CT_DTYPE_F32, &e));
  }
  int64_t one = 3;
  REQUIRE(!ct_st_writer_add_f32(w, "lora_A.weight", 1, &one, bufs[0], CT_DTYPE_F32, &e));
  ct_st_close(f);
  REQUIRE(!ct_st_writer_write(w, path, &e));
  ct_st_writer_free(w);
  for (size_t i = 0; i < nb; i++) free(bufs[i]);
  ct_status st = ct_mmdit_open_diffusers(dir, 0, &b, &e);
  CHECKF(st && strstr(e.msg, "1 missing [x_embedder.bias]") &&
             strstr(e.msg,
                    "proj_out.weight in diffusion_pytorch_model.safetensors (has F32 [15, 32]") &&
             strstr(e.msg, "1 unexpected [lora_A.weight in diffusion_pytorch_model.safetensors]"),
         "%s", st ? e.msg : "accepted");
  /* an index whose shard leaves the directory */
  snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors.index.json", dir);
  const char *idx = "{\"metadata\":{},\"weight_map\":{\"x_embedder.bias\":\"../x.safetensors\"}}";
  REQUIRE(!ct_write_file_atomic(path, idx, strlen(idx), &e));
  st = ct_mmdit_open_diffusers(dir, 0, &b, &e);
  CHECKF(st && strstr(e.msg, "inside"), "%s", st ? e.msg : "accepted");
  /* an index that misses tensors of its shard */
  idx =
      "{\"metadata\":{},\"weight_map\":{\"x_embedder.weight\":"
      "\"diffusion_pytorch_model.safetensors\"}}";
  REQUIRE(!ct_write_file_atomic(path, idx, strlen(idx), &e));
  st = ct_mmdit_open_diffusers(dir, 0, &b, &e);
  CHECKF(st && strstr(e.msg, "is not in the weight_map"), "%s", st ? e.msg : "accepted");
  ct_mmdit_free(a);
}

/* A BFL file with the "model.diffusion_model." prefix of single-file checkpoints,
 * and a diffusers directory saved as F16, load to the same model. */
CT_TEST(flux, bfl_prefix_and_f16) {
  ct_err e;
  ct_st_file *f = NULL;
  ct_st_writer *w = NULL;
  ct_mmdit *a = NULL, *b = NULL;
  ct_mmdit_config c;
  char path[2048], dir[2048], prefix[64];
  int axes[3] = {4, 6, 6};
  snprintf(path, sizeof path, "%s/flux_prefixed.safetensors", ct_test_tmpdir());
  snprintf(dir, sizeof dir, "%s/flux_f16", ct_test_tmpdir());
  REQUIRE(!ct_st_open(data("bfl.safetensors"), &f, &e) && !ct_st_writer_new(&w));
  float *bufs[256];
  size_t nb = 0;
  for (size_t i = 0; i < f->ntensors && nb < 256; i++) {
    const ct_st_tensor *t = &f->tensors[i];
    char name[256];
    snprintf(name, sizeof name, "model.diffusion_model.%s", t->name);
    bufs[nb] = tensor(f, t->name, NULL);
    REQUIRE(!ct_st_writer_add_f32(w, name, t->ndim, t->shape, bufs[nb], CT_DTYPE_BF16, &e));
    nb++;
  }
  ct_st_close(f);
  REQUIRE(!ct_st_writer_write(w, path, &e));
  ct_st_writer_free(w);
  for (size_t i = 0; i < nb; i++) free(bufs[i]);
  REQUIRE(!ct_flux_bfl_config(path, axes, &c, prefix, sizeof prefix, &e));
  CHECK(!strcmp(prefix, "model.diffusion_model."));
  REQUIRE(!ct_mmdit_new(&c, 7, 0, &a, &e));
  REQUIRE(!ct_mmdit_load(a, path, prefix, &e));
  REQUIRE(!ct_mmdit_open_diffusers(data("schnell/transformer"), 0, &b, &e));
  double d = rel_err(ct_mmdit_params(a), ct_mmdit_params(b), ct_mmdit_numel(b));
  CHECKF(d > 0 && d <= 1.0 / 128, "bf16 copy of the prefixed file: %.3g", d);
  ct_mmdit_free(a);
  a = NULL;
  REQUIRE(!ct_mmdit_save_diffusers(b, dir, 0, CT_DTYPE_F16, &e));
  REQUIRE(!ct_mmdit_open_diffusers(dir, 0, &a, &e));
  d = rel_err(ct_mmdit_params(a), ct_mmdit_params(b), ct_mmdit_numel(b));
  CHECKF(d > 0 && d <= 1e-3, "f16 save: %.3g", d);
  ct_mmdit_free(a);
  ct_mmdit_free(b);
}

/* Standard LoRA (src/model/lora.c, lora_io.c) against peft on diffusers'
 * FluxTransformer2DModel (scripts/lora_golden.py, tests/data/lora): for each
 * of SimpleTuner's flux_lora_target presets, with peft's adapter file as the
 * initial weights (init_lora), the loss mean((out - target)^2) and every adapter
 * gradient within 1e-4 of peft's (relative to the tensor's largest); the
 * frozen base gets no gradient; the file ctuner saves has peft's names,
 * shapes, values and LoraConfig; peft's initialisations; the errors.
 * CT_LORA_DATA overrides the data directory (make interop: fresh goldens). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "ctuner/lora.h"
#include "ctuner/mmdit.h"
#include "ctuner/safetensors.h"
#include "harness.h"

#define REQUIRE_V(cond, v)                                                         \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      fprintf(stderr, "  %s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
      *ct_failed_ = 1;                                                             \
      return v;                                                                    \
    }                                                                              \
  } while (0)

#define data(rel) ct_test_data_in("CT_LORA_DATA", "lora", rel)
#define tensor ct_test_tensor

static const char *model_of(const char *preset) {
  return !strcmp(preset, "tiny") || !strcmp(preset, "nano") ? "m21" : "m3";
}

static void dirname_of(const char *preset, char *out, size_t cap) {
  snprintf(out, cap, "%s", preset);
  for (char *p = out; *p; p++)
    if (*p == '+') *p = '_';
}

static const ct_lora_opts OPTS = {2, 3.0, 0.0, 0, 0}; /* scripts/lora_golden.py's RANK, ALPHA */

/* Forward + backward of one preset; returns the worst relative gradient error. */
static double check_preset(const char *preset, int *ct_failed_) {
  char rel[256], pd[64];
  ct_err e;
  ct_mmdit *m = NULL;
  ct_lora *l = NULL;
  ct_st_file *in = NULL, *g = NULL;
  dirname_of(preset, pd, sizeof pd);
  snprintf(rel, sizeof rel, "%s/transformer", model_of(preset));
  REQUIRE_V(!ct_mmdit_open_diffusers(data(rel), 0, &m, &e) || !fprintf(stderr, "%s\n", e.msg), 1);
  /* norm_out: not a preset (scripts/lora_golden.py): the swapped halves of norm_out.linear */
  static const char *const norm_out[] = {"norm_out.linear", "norm1.linear", "norm1_context.linear",
                                         "norm.linear", NULL};
  /* dora: peft's use_dora on fused q/k/v, linear1's split, norm_out's halves, a feed-forward */
  static const char *const dora[] = {"to_q",          "to_k",     "to_v",     "to_out.0",
                                     "add_q_proj",    "proj_mlp", "proj_out", "norm_out.linear",
                                     "ff.net.0.proj", NULL};
  const int is_dora = !strcmp(preset, "dora");
  const char *const *targets = !strcmp(preset, "norm_out") ? norm_out
                               : is_dora                   ? dora
                                                           : ct_lora_preset(preset);
  ct_lora_opts o = OPTS;
  o.dora = is_dora;
  REQUIRE_V(!ct_lora_new(ct_mmdit_cfg(m), targets, &o, CT_LORA_GRADS, &l, &e) ||
                !fprintf(stderr, "%s\n", e.msg),
            1);
  snprintf(rel, sizeof rel, "%s/pytorch_lora_weights.safetensors", pd);
  REQUIRE_V(!ct_lora_load(l, data(rel), 0, ct_lora_numel(l), ct_lora_params(l), &e) ||
                !fprintf(stderr, "%s\n", e.msg),
            1);
  ct_mmdit_set_lora(m, l);
  ct_mmdit_set_frozen(m, 1);
  snprintf(rel, sizeof rel, "%s/inputs.safetensors", model_of(preset));
  REQUIRE_V(!ct_st_open(data(rel), &in, &e), 1);
  snprintf(rel, sizeof rel, "%s/golden.safetensors", pd);
  REQUIRE_V(!ct_st_open(data(rel), &g, &e), 1);
  const ct_mmdit_config *c = ct_mmdit_cfg(m);
  const ct_st_tensor *hs = ct_st_find(in, "hidden_states"),
                     *eh = ct_st_find(in, "encoder_hidden_states");
  REQUIRE_V(hs && eh, 1);
  const int B = (int)hs->shape[0], L = (int)hs->shape[1], T = (int)eh->shape[1];
  const int C = c->in_channels, H = 4, W = 4;
  REQUIRE_V(L == H / 2 * (W / 2), 1);
  const size_t nx = (size_t)B * C * H * W;
  float *packed = tensor(in, "hidden_states", NULL), *x = malloc(nx * 4), *v = malloc(nx * 4),
        *vp = malloc(nx * 4), *dvp = tensor(in, "target", NULL), *dv = malloc(nx * 4);
  ct_mmdit_batch b = {B,
                      H,
                      W,
                      T,
                      x,
                      tensor(in, "timestep", NULL),
                      tensor(in, "encoder_hidden_states", NULL),
                      tensor(in, "pooled_projections", NULL),
                      tensor(in, "guidance", NULL)};
  REQUIRE_V(packed && x && v && vp && dvp && dv && b.t && b.txt && b.y && b.guidance, 1);
  ct_flux_unpack(B, C, H, W, packed, x);
  REQUIRE_V(!ct_mmdit_forward(m, &b, v, &e), 1);
  ct_flux_pack(B, C, H, W, v, vp);
  double loss = 0; /* mean((v - target)^2), dL/dv = 2 (v - target) / n */
  for (size_t i = 0; i < nx; i++) {
    loss += ((double)vp[i] - dvp[i]) * ((double)vp[i] - dvp[i]);
    dvp[i] = 2.0f * (vp[i] - dvp[i]) / (float)nx;
  }
  loss /= (double)nx;
  ct_flux_unpack(B, C, H, W, dvp, dv);
  float *lref = tensor(g, "loss", NULL);
  REQUIRE_V(lref, 1);
  const double el = fabs(loss - lref[0]) / fabs(lref[0]);
  CHECKF(el <= 1e-4, "%s: loss %.9g, peft %.9g (%.3g)", preset, loss, lref[0], el);
  REQUIRE_V(!ct_mmdit_backward(m, dv, &e) || !fprintf(stderr, "%s\n", e.msg), 1);
  size_t nad, ngold = 0, nours = 0;
  const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
  for (size_t i = 0; i < g->ntensors; i++) ngold += !strncmp(g->tensors[i].name, "grad.", 5);
  for (size_t i = 0; i < nad; i++) nours += (size_t)ad[i].nt;
  CHECKF(ngold == nours, "%s: peft adapts %zu tensors, ctuner %zu", preset, ngold, nours);
  double worst = 0;
  for (size_t i = 0; i < nad; i++)
    for (int k = 0; k < ad[i].nt; k++) {
      char name[200], gn[220];
      ct_lora_tensor_fullname(l, &ad[i], k, name, sizeof name);
      snprintf(gn, sizeof gn, "grad.%s", name);
      size_t n = 0;
      float *ref = tensor(g, gn, &n);
      CHECKF(ref, "%s: peft has no gradient %s", preset, gn);
      if (!ref) continue;
      const float *ours = ct_lora_grads(l) + ad[i].t[k].off;
      const double er = ct_test_rel_err(ours, ref, n);
      worst = ct_test_max(worst, er);
      CHECKF(er <= 1e-4, "%s: gradient of %s differs from peft's by %.3g", preset, name, er);
      if (er > 5e-5) fprintf(stderr, "  (%s %s: %.3g)\n", preset, name, er);
      free(ref);
    }
  fprintf(stderr, "  %-16s %3zu adapters: loss %.2g, worst gradient %.2g (rel. to max |peft|)\n",
          preset, nad, el, worst);
  free(lref);
  free(packed), free(x), free(v), free(vp), free(dvp), free(dv);
  free((void *)b.t), free((void *)b.txt), free((void *)b.y), free((void *)b.guidance);
  ct_st_close(in);
  ct_st_close(g);
  ct_mmdit_free(m);
  ct_lora_free(l);
  return worst;
}

static const char *const PRESET_NAMES[] = {
    "mmdit", "context", "context+ffs",      "all",      "all+ffs", "ai-toolkit",
    "tiny",  "nano",    "all+ffs+embedder", "norm_out", "dora"};

CT_TEST(lora, every_preset_vs_peft) {
  for (size_t i = 0; i < sizeof PRESET_NAMES / sizeof PRESET_NAMES[0]; i++)
    check_preset(PRESET_NAMES[i], ct_failed_);
}

/* Wrong answers must fail: a scale other than alpha/rank moves the loss. */
CT_TEST(lora, a_wrong_scale_fails) {
  ct_err e;
  ct_mmdit *m = NULL;
  ct_lora *l = NULL;
  REQUIRE(!ct_mmdit_open_diffusers(data("m3/transformer"), 0, &m, &e));
  ct_lora_opts o = OPTS;
  o.alpha = 2.0; /* scale 1 instead of 1.5: the file's metadata says 3 */
  REQUIRE(!ct_lora_new(ct_mmdit_cfg(m), ct_lora_preset("all"), &o, 0, &l, &e));
  ct_status st = ct_lora_load(l, data("all/pytorch_lora_weights.safetensors"), 0, ct_lora_numel(l),
                              ct_lora_params(l), &e);
  CHECK(st && strstr(e.msg, "lora_alpha is 3"));
  ct_lora_free(l);
  ct_mmdit_free(m);
}

/* The base's gradient buffer is untouched with a frozen base (and not needed). */
CT_TEST(lora, frozen_base_gets_no_gradient) {
  ct_err e;
  ct_mmdit *m = NULL;
  ct_lora *l = NULL;
  REQUIRE(!ct_mmdit_open_diffusers(data("m3/transformer"), CT_MMDIT_GRADS, &m, &e));
  REQUIRE(!ct_lora_new(ct_mmdit_cfg(m), ct_lora_preset("all+ffs"), &OPTS, CT_LORA_GRADS, &l, &e));
  REQUIRE(!ct_lora_init_range(l, "default", 3, 0, ct_lora_numel(l), ct_lora_params(l), &e));
  ct_mmdit_set_lora(m, l);
  ct_mmdit_set_frozen(m, 1);
  const int B = 1, H = 4, W = 4, T = 2, C = ct_mmdit_cfg(m)->in_channels;
  const size_t nx = (size_t)B * C * H * W;
  float x[64], v[64], dv[64], t = 0.5f, g = 2.0f, txt[2 * 16], y[8];
  for (size_t i = 0; i < nx; i++) x[i] = sinf((float)i), dv[i] = cosf((float)i);
  for (int i = 0; i < 32; i++) txt[i] = 0.1f * (float)(i % 7);
  for (int i = 0; i < 8; i++) y[i] = 0.2f * (float)i;
  ct_mmdit_batch b = {B, H, W, T, x, &t, txt, y, &g};
  REQUIRE(nx <= 64);
  memset(ct_mmdit_grads(m), 0, ct_mmdit_numel(m) * sizeof(float));
  REQUIRE(!ct_mmdit_forward(m, &b, v, &e));
  REQUIRE(!ct_mmdit_backward(m, dv, &e));
  size_t nz = 0;
  for (size_t i = 0; i < ct_mmdit_numel(m); i++) nz += ct_mmdit_grads(m)[i] != 0;
  CHECKF(nz == 0, "%zu base gradients were written", nz);
  size_t nzl = 0;
  for (size_t i = 0; i < ct_lora_numel(l); i++) nzl += ct_lora_grads(l)[i] != 0;
  CHECK(nzl > 0);
  ct_mmdit_free(m);
  ct_lora_free(l);
}

/* The file ctuner writes: peft's names, shapes and values, the LoraConfig. */
CT_TEST(lora, saved_file_is_peft_file) {
  ct_err e;
  ct_mmdit *m = NULL;
  ct_lora *l = NULL;
  ct_st_file *a = NULL, *b = NULL;
  REQUIRE(!ct_mmdit_open_diffusers(data("m3/transformer"), 0, &m, &e));
  REQUIRE(!ct_lora_new(ct_mmdit_cfg(m), ct_lora_preset("ai-toolkit"), &OPTS, 0, &l, &e));
  const char *src = data("ai-toolkit/pytorch_lora_weights.safetensors");
  REQUIRE(!ct_lora_load(l, src, 0, ct_lora_numel(l), ct_lora_params(l), &e));
  char out[4200]; /* CT_LORA_SAVED: keep it there (make interop loads it with diffusers) */
  snprintf(out, sizeof out, "%s", getenv("CT_LORA_SAVED") ? getenv("CT_LORA_SAVED") : "");
  if (!out[0]) snprintf(out, sizeof out, "%s/lora_saved.safetensors", ct_test_tmpdir());
  REQUIRE(!ct_lora_save(l, ct_lora_params(l), out, &e));
  REQUIRE(!ct_st_open(src, &a, &e) && !ct_st_open(out, &b, &e));
  CHECK(a->ntensors == b->ntensors);
  for (size_t i = 0; i < a->ntensors; i++) {
    const ct_st_tensor *x = &a->tensors[i], *y = ct_st_find(b, x->name);
    CHECKF(y, "saved file lacks %s", x->name);
    if (!y) continue;
    CHECK(y->ndim == 2 && y->shape[0] == x->shape[0] && y->shape[1] == x->shape[1]);
    CHECK(y->dtype == CT_DTYPE_F32 && !memcmp(x->data, y->data, x->numel * 4));
  }
  ct_json *j = NULL;
  const char *meta = ct_st_meta(b, "lora_adapter_metadata");
  REQUIRE(meta && !ct_json_parse(meta, strlen(meta), &j, &e));
  const ct_json *r = ct_json_get(j, "transformer.r"),
                *al = ct_json_get(j, "transformer.lora_alpha"),
                *tm = ct_json_get(j, "transformer.target_modules");
  CHECK(r && r->num == 2 && al && al->num == 3.0 && tm && tm->type == CT_JSON_ARRAY);
  CHECK(tm && tm->n == a->ntensors / 2);
  CHECK(ct_st_meta(b, "format") && !strcmp(ct_st_meta(b, "format"), "pt"));
  ct_json_free(j);
  ct_st_close(a);
  ct_st_close(b);
  ct_lora_free(l);
  ct_mmdit_free(m);
}

/* peft's initialisations: A kaiming-uniform (bound 1/sqrt(in)) or N(0, 1/r), B zero. */
CT_TEST(lora, init_types) {
  ct_err e;
  ct_mmdit *m = NULL;
  ct_lora *l = NULL;
  REQUIRE(!ct_mmdit_open_diffusers(data("m3/transformer"), 0, &m, &e));
  ct_lora_opts o = OPTS;
  o.rank = 8;
  REQUIRE(!ct_lora_new(ct_mmdit_cfg(m), ct_lora_preset("all+ffs"), &o, 0, &l, &e));
  size_t nad, n = ct_lora_numel(l);
  const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
  float *w = ct_lora_params(l);
  REQUIRE(!ct_lora_init_range(l, "default", 7, 0, n, w, &e));
  double amax = 0, bmax = 0, s2 = 0;
  size_t cnt = 0;
  for (size_t i = 0; i < nad; i++) {
    const size_t na = (size_t)o.rank * ad[i].in, nb = (size_t)o.rank * ad[i].out;
    double bound = 1.0 / sqrt((double)ad[i].in);
    for (size_t j = 0; j < na; j++) amax = ct_test_max(amax, fabs(w[ad[i].a_off + j]) / bound);
    for (size_t j = 0; j < nb; j++) bmax = ct_test_max(bmax, fabs(w[ad[i].b_off + j]));
  }
  CHECK(amax <= 1.0 && amax > 0.9 && bmax == 0);
  /* a range equals the same floats of the whole */
  float *part = malloc(100 * sizeof *part);
  REQUIRE(part && !ct_lora_init_range(l, "default", 7, 37, 137, part, &e));
  CHECK(!memcmp(part, w + 37, 100 * sizeof *part));
  free(part);
  REQUIRE(!ct_lora_init_range(l, "gaussian", 7, 0, n, w, &e));
  for (size_t i = 0; i < nad; i++)
    for (size_t j = 0; j < (size_t)o.rank * ad[i].in; j++, cnt++)
      s2 += (double)w[ad[i].a_off + j] * w[ad[i].a_off + j];
  const double sd = sqrt(s2 / (double)cnt);
  CHECKF(fabs(sd - 1.0 / o.rank) < 0.01, "gaussian A std %.4f, peft's 1/r = %.4f", sd,
         1.0 / o.rank);
  CHECK(ct_lora_init_range(l, "pissa", 7, 0, n, w, &e) && strstr(e.msg, "pissa"));
  ct_lora_free(l);
  ct_mmdit_free(m);
}

/* Dropout: the backward redraws the forward's mask (finite differences). */
CT_TEST(lora, dropout_gradient_matches_finite_difference) {
  ct_err e;
  ct_mmdit *m = NULL;
  ct_lora *l = NULL;
  REQUIRE(!ct_mmdit_open_diffusers(data("m3/transformer"), 0, &m, &e));
  ct_lora_opts o = OPTS;
  o.dropout = 0.3;
  REQUIRE(
      !ct_lora_new(ct_mmdit_cfg(m), ct_lora_preset("all+ffs+embedder"), &o, CT_LORA_GRADS, &l, &e));
  REQUIRE(!ct_lora_load(l, data("all_ffs_embedder/pytorch_lora_weights.safetensors"), 0,
                        ct_lora_numel(l), ct_lora_params(l), &e));
  ct_mmdit_set_lora(m, l);
  ct_mmdit_set_frozen(m, 1);
  const uint64_t ids[1] = {5};
  ct_lora_set_batch(l, 1, ids);
  const int B = 1, H = 4, W = 4, T = 2, C = ct_mmdit_cfg(m)->in_channels;
  const size_t nx = (size_t)B * C * H * W;
  float x[64], v[64], dv[64], t = 0.3f, g = 2.0f, txt[32], y[8];
  for (size_t i = 0; i < nx; i++) x[i] = sinf(0.7f * (float)i), dv[i] = cosf((float)i);
  for (int i = 0; i < 32; i++) txt[i] = 0.1f * (float)(i % 5);
  for (int i = 0; i < 8; i++) y[i] = 0.3f - 0.1f * (float)i;
  ct_mmdit_batch b = {B, H, W, T, x, &t, txt, y, &g};
  REQUIRE(!ct_mmdit_forward(m, &b, v, &e));
  REQUIRE(!ct_mmdit_backward(m, dv, &e));
  size_t nad;
  const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
  float *w = ct_lora_params(l);
  /* x_embedder's A[0][1] and the first single block's proj_mlp A[1][2] */
  size_t idx[2] = {ad[0].a_off + 1, 0};
  for (size_t i = 0; i < nad; i++)
    if (strstr(ad[i].module, "single_transformer_blocks.0.proj_mlp")) idx[1] = ad[i].a_off + 18;
  for (int k = 0; k < 2; k++) {
    const double gk = ct_lora_grads(l)[idx[k]], h = 4e-3, w0 = w[idx[k]];
    double f[2];
    for (int s = 0; s < 2; s++) {
      w[idx[k]] = (float)(w0 + (s ? h : -h));
      REQUIRE(!ct_mmdit_forward(m, &b, v, &e));
      f[s] = 0;
      for (size_t i = 0; i < nx; i++) f[s] += (double)v[i] * dv[i];
    }
    w[idx[k]] = (float)w0;
    const double fd = (f[1] - f[0]) / (2 * h);
    CHECKF(fabs(fd - gk) <= 1e-2 * fmax(1.0, fabs(fd)),
           "dropout: d/dA %.6g, finite difference %.6g", gk, fd);
  }
  ct_mmdit_free(m);
  ct_lora_free(l);
}

CT_TEST(lora, errors_name_the_problem) {
  ct_err e;
  ct_mmdit *m = NULL;
  ct_lora *l = NULL;
  REQUIRE(!ct_mmdit_open_diffusers(data("m3/transformer"), 0, &m, &e));
  const ct_mmdit_config *c = ct_mmdit_cfg(m);
  ct_lora_opts o = OPTS;
  /* tiny names single blocks 7 and 20; this model has 2 */
  CHECK(ct_lora_new(c, ct_lora_preset("tiny"), &o, 0, &l, &e) &&
        strstr(e.msg, "single_transformer_blocks.7.proj_out"));
  o.rank = 33; /* above both sides (16 x 16) of attn.to_q */
  CHECK(ct_lora_new(c, ct_lora_preset("all"), &o, 0, &l, &e) && strstr(e.msg, "lora_rank 33") &&
        strstr(e.msg, "attn.to_q"));
  o.rank = 17; /* above min(in, out) = 16 of ff.net.0.proj (16 -> 64) only: valid, one warning */
  static const char *const ff[] = {"ff.net.0.proj", NULL};
  REQUIRE(!ct_lora_new(c, ff, &o, 0, &l, &e));
  ct_lora_free(l);
  l = NULL;
  o = OPTS;
  o.alpha = 0;
  CHECK(ct_lora_new(c, ct_lora_preset("all"), &o, 0, &l, &e) && strstr(e.msg, "lora_alpha"));
  o = OPTS;
  o.rank = 0;
  CHECK(ct_lora_new(c, ct_lora_preset("all"), &o, 0, &l, &e) && strstr(e.msg, "lora_rank"));
  CHECK(!ct_lora_preset("everything"));
  /* an adapter for another model: m21's tiny file on m3's context preset */
  o = OPTS;
  REQUIRE(!ct_lora_new(c, ct_lora_preset("context"), &o, 0, &l, &e));
  CHECK(ct_lora_load(l, data("tiny/pytorch_lora_weights.safetensors"), 0, ct_lora_numel(l),
                     ct_lora_params(l), &e) &&
        strstr(e.msg, "not an adapter for this model") && strstr(e.msg, "missing") &&
        strstr(e.msg, "single_transformer_blocks.7.proj_out.lora_A.weight"));
  /* another rank: shapes named */
  ct_lora_free(l);
  o.rank = 4;
  REQUIRE(!ct_lora_new(c, ct_lora_preset("context"), &o, 0, &l, &e));
  CHECK(ct_lora_load(l, data("context/pytorch_lora_weights.safetensors"), 0, ct_lora_numel(l),
                     ct_lora_params(l), &e) &&
        strstr(e.msg, "rank 2, not lora_rank 4"));
  ct_lora_free(l);
  ct_mmdit_free(m);
}

/* DoRA (use_dora): peft's start, the magnitude = the base's row norms (with
 * B = 0, g = 1: the base's output); the file ctuner saves is peft's (the 1-D
 * lora_magnitude_vector included, use_dora true in the LoraConfig). */
CT_TEST(lora, dora_init_and_file) {
  ct_err e;
  ct_mmdit *m = NULL;
  ct_lora *l = NULL;
  REQUIRE(!ct_mmdit_open_diffusers(data("m3/transformer"), 0, &m, &e));
  static const char *const targets[] = {"to_q", "proj_mlp", "norm_out.linear", NULL};
  ct_lora_opts o = OPTS;
  o.dora = 1;
  REQUIRE(!ct_lora_new(ct_mmdit_cfg(m), targets, &o, 0, &l, &e));
  ct_mmdit_set_lora(m, l); /* binds the base rows DoRA reads */
  REQUIRE(!ct_lora_init_range(l, "default", 3, 0, ct_lora_numel(l), ct_lora_params(l), &e));
  size_t nad;
  const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
  REQUIRE(nad == 7 && ad[0].nt == 3); /* to_q x 4 blocks, proj_mlp x 2, norm_out.linear */
  /* the magnitude of double block 0's to_q = the norms of img_attn.qkv's first rows */
  const ct_param *q = ct_mmdit_find(m, "double_blocks.0.img_attn.qkv.weight");
  REQUIRE(q && !strcmp(ad[0].module, "transformer_blocks.0.attn.to_q"));
  ct_mmdit_set_lora(m, NULL);
  const float *w = ct_mmdit_params(m) + q->offset;
  double worst = 0;
  for (int r = 0; r < ad[0].out; r++) {
    double n2 = 0;
    for (int c = 0; c < ad[0].in; c++) n2 += (double)w[r * ad[0].in + c] * w[r * ad[0].in + c];
    worst = ct_test_max(worst, fabs(ct_lora_params(l)[ad[0].t[2].off + r] - sqrt(n2)) / sqrt(n2));
  }
  CHECKF(worst < 1e-6, "magnitude vs ||W row||: %.3g", worst);
  ct_lora_free(l);
  /* peft's file in, ctuner's file out: the same tensors and a use_dora LoraConfig */
  static const char *const dora[] = {"to_q",          "to_k",     "to_v",     "to_out.0",
                                     "add_q_proj",    "proj_mlp", "proj_out", "norm_out.linear",
                                     "ff.net.0.proj", NULL};
  REQUIRE(!ct_lora_new(ct_mmdit_cfg(m), dora, &o, 0, &l, &e));
  const char *src = data("dora/pytorch_lora_weights.safetensors");
  REQUIRE(!ct_lora_load(l, src, 0, ct_lora_numel(l), ct_lora_params(l), &e) ||
          !fprintf(stderr, "%s\n", e.msg));
  char out[4200];
  snprintf(out, sizeof out, "%s", getenv("CT_LORA_DORA_SAVED") ? getenv("CT_LORA_DORA_SAVED") : "");
  if (!out[0]) snprintf(out, sizeof out, "%s/dora_saved.safetensors", ct_test_tmpdir());
  REQUIRE(!ct_lora_save(l, ct_lora_params(l), out, &e));
  ct_st_file *a = NULL, *b = NULL;
  REQUIRE(!ct_st_open(src, &a, &e) && !ct_st_open(out, &b, &e));
  CHECK(a->ntensors == b->ntensors);
  for (size_t i = 0; i < a->ntensors; i++) {
    const ct_st_tensor *x = &a->tensors[i], *y = ct_st_find(b, x->name);
    CHECKF(y && y->ndim == x->ndim && y->numel == x->numel && x->dtype == CT_DTYPE_F32 &&
               !memcmp(x->data, y->data, x->numel * 4),
           "%s differs", x->name);
  }
  CHECK(strstr(ct_st_meta(b, "lora_adapter_metadata"), "\"transformer.use_dora\": true"));
  ct_st_close(a);
  ct_st_close(b);
  ct_lora_free(l);
  ct_mmdit_free(m);
}

/* U-net LoRA tests (docs/lora.md, "SDXL"): peft's LoRA on the tiny
 * SDXL-shaped U-net of tests/data/unet against the goldens of
 * scripts/unet_lora_golden.py (tests/data/unet/lora: the adapter as
 * StableDiffusionXLPipeline.save_lora_weights writes it, and the output and
 * gradients with it loaded in diffusers): the output, the inputs' and every
 * lora_A / lora_B gradient; the saved file's names are diffusers'; kohya's
 * SDXL file; merge and unmerge; initialisation; refusals; the model adapter;
 * the sealed backend; a few SGD steps on the adapters alone. `make interop`
 * points CT_UNET_DATA at a fresh set and CT_UNET_LORA_SAVED at a directory
 * where the saved adapter is kept for diffusers to load. */
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

#define TARGETS "to_k,to_q,to_v,to_out.0,proj_in,ff.net.2" /* the golden's */

#define REQUIRE_OK(cond, err)     \
  do {                            \
    if (!(cond)) {                \
      CHECKF(0, "%s", (err).msg); \
      return;                     \
    }                             \
  } while (0)

static const char *data(const char *rel) {
  return ct_test_data_in("CT_UNET_DATA", "unet", rel);
}

typedef struct {
  ct_st_file *g;
  ct_unet_inputs in;
  float *f[7]; /* sample, timesteps, encoder, text_embeds, time_ids, r, out */
  size_t n[7];
} golden;

static int golden_open(golden *gd) {
  static const char *const k[7] = {"in.sample",      "in.timesteps", "in.encoder_hidden_states",
                                   "in.text_embeds", "in.time_ids",  "in.r",
                                   "out.sample"};
  ct_err err = {0};
  memset(gd, 0, sizeof *gd);
  if (ct_st_open(data("lora/golden.safetensors"), &gd->g, &err)) return 0;
  for (int i = 0; i < 7; i++)
    if (!(gd->f[i] = ct_test_tensor(gd->g, k[i], &gd->n[i]))) return 0;
  const ct_st_tensor *s = ct_st_find(gd->g, "in.sample"),
                     *e = ct_st_find(gd->g, "in.encoder_hidden_states");
  gd->in = (ct_unet_inputs){.B = (int)s->shape[0],
                            .H = (int)s->shape[2],
                            .W = (int)s->shape[3],
                            .sample = gd->f[0],
                            .timesteps = gd->f[1],
                            .Lk = (int)e->shape[1],
                            .encoder_hidden_states = gd->f[2],
                            .text_embeds = gd->f[3],
                            .time_ids = gd->f[4]};
  return 1;
}

static void golden_close(golden *gd) {
  for (int i = 0; i < 7; i++) free(gd->f[i]);
  ct_st_close(gd->g);
}

/* the base U-net and the golden adapter loaded from diffusers' file */
static int setup(ct_unet **u, ct_unet_lora **l, ct_err *err) {
  if (ct_unet_from_pretrained(data(""), u, err)) return 0;
  if (ct_unet_lora_new(ct_unet_cfg(*u), TARGETS, 4, 8.0, l, err)) return 0;
  return ct_unet_lora_load(*l, data("lora/pytorch_lora_weights.safetensors"), err) == CT_OK;
}

CT_TEST(unet_lora, golden) {
  golden gd;
  REQUIRE(golden_open(&gd));
  ct_err err = {0};
  ct_unet *u = NULL;
  ct_unet_lora *l = NULL;
  REQUIRE_OK(setup(&u, &l, &err), err);
  size_t nad;
  ct_unet_lora_adapters(l, &nad);
  CHECKF(nad == 114, "%zu adapters", nad); /* the golden file's 228 tensors */
  REQUIRE(ct_unet_set_lora(u, l, &err) == CT_OK);
  ct_unet_set_frozen(u, 1);
  const size_t ns = gd.n[0], ne = gd.n[2];
  float *out = malloc(ns * sizeof(float)), *ds = malloc(ns * sizeof(float)),
        *de = malloc(ne * sizeof(float));
  for (size_t i = 0; i < ns; i++) out[i] = ds[i] = NAN;
  ct_unet_tape *tp = NULL;
  REQUIRE(ct_unet_forward(u, &gd.in, out, &tp, &err) == CT_OK);
  const double eo = ct_test_rel_err(out, gd.f[6], ns);
  CHECKF(eo < 2e-5, "output: %.3g relative error against diffusers + peft", eo);
  REQUIRE(ct_unet_backward(u, tp, gd.f[5], ds, de, &err) == CT_OK);
  ct_unet_tape_free(tp);
  size_t n;
  float *gs = ct_test_tensor(gd.g, "grad.in.sample", &n),
        *ge = ct_test_tensor(gd.g, "grad.in.encoder_hidden_states", &n);
  REQUIRE(gs && ge);
  const double es = ct_test_rel_err(ds, gs, ns), ee = ct_test_rel_err(de, ge, ne);
  CHECKF(es < 4e-5 && ee < 4e-5, "gradients: sample %.3g, encoder_hidden_states %.3g", es, ee);
  /* every lora_A / lora_B, per tensor against 1e-3 of the largest (as the U-net's golden) */
  const ct_unet_adapter *ad = ct_unet_lora_adapters(l, &nad);
  const float *g = ct_unet_lora_grads(l);
  double gmax = 0, worst = 0;
  for (size_t i = 0; i < ct_unet_lora_numel(l); i++) gmax = ct_test_max(gmax, fabs(g[i]));
  CHECK(gmax > 0);
  int missing = 0;
  const char *wname = "";
  for (size_t i = 0; i < nad; i++)
    for (int b = 0; b < 2; b++) {
      char name[200];
      snprintf(name, sizeof name, "grad.unet.%s.lora_%c.weight", ad[i].lin.name, b ? 'B' : 'A');
      size_t m = 0;
      float *ref = ct_test_tensor(gd.g, name, &m);
      const float *got = g + (b ? ad[i].b_off : ad[i].a_off);
      const size_t want = (size_t)4 * (b ? ad[i].lin.out : ad[i].lin.in);
      if (!ref || m != want) {
        missing++;
        free(ref);
        continue;
      }
      double md = 0, mr = 0;
      for (size_t k = 0; k < m; k++)
        md = ct_test_max(md, fabs((double)got[k] - ref[k])), mr = ct_test_max(mr, fabs(ref[k]));
      const double e = md / ct_test_max(mr, 1e-3 * gmax);
      if (!isnan(worst) && !(e <= worst)) worst = e, wname = ad[i].lin.name;
      free(ref);
    }
  CHECKF(missing == 0, "%d LoRA tensors have no golden gradient", missing);
  CHECKF(worst < 4e-5, "LoRA gradients: worst %.3g relative (%s)", worst, wname);
  fprintf(stderr,
          "  LoRA vs diffusers + peft: output %.3g, d sample %.3g, d encoder %.3g, worst lora "
          "gradient %.3g (%s)\n",
          eo, es, ee, worst, wname);
  free(out), free(ds), free(de), free(gs), free(ge);
  ct_unet_free(u);
  ct_unet_lora_free(l);
  golden_close(&gd);
}

/* the tensor names of a safetensors file, sorted, joined by newlines */
static char *names_of(const char *path) {
  ct_st_file *f = NULL;
  ct_err err = {0};
  if (ct_st_open(path, &f, &err)) return NULL;
  char *s = calloc(f->ntensors + 1, 200);
  const char **v = calloc(f->ntensors + 1, sizeof *v);
  for (size_t i = 0; s && v && i < f->ntensors; i++) v[i] = f->tensors[i].name;
  for (size_t i = 0; s && v && i < f->ntensors; i++) /* insertion sort: small */
    for (size_t j = i; j > 0 && strcmp(v[j - 1], v[j]) > 0; j--) {
      const char *t = v[j];
      v[j] = v[j - 1], v[j - 1] = t;
    }
  for (size_t i = 0; s && v && i < f->ntensors; i++) strcat(strcat(s, v[i]), "\n");
  free(v);
  ct_st_close(f);
  return s;
}

/* a ctuner file has diffusers' names (the set save_lora_weights wrote) and
 * metadata, and reloads to the same bits; a file of another rank is refused */
CT_TEST(unet_lora, save_names) {
  ct_err err = {0};
  ct_unet *u = NULL;
  ct_unet_lora *l = NULL, *l2 = NULL;
  REQUIRE_OK(setup(&u, &l, &err), err);
  char path[4200];
  snprintf(path, sizeof path, "%s/unet_lora.safetensors", ct_test_tmpdir());
  REQUIRE(ct_unet_lora_save(l, path, &err) == CT_OK);
  /* make interop loads this copy with diffusers' load_lora_weights */
  const char *keep = getenv("CT_UNET_LORA_SAVED");
  if (keep) {
    char kp[4200];
    snprintf(kp, sizeof kp, "%s/pytorch_lora_weights.safetensors", keep);
    CHECK(ct_mkdir_p(keep, &err) == CT_OK && ct_unet_lora_save(l, kp, &err) == CT_OK);
  }
  char *want = names_of(data("lora/pytorch_lora_weights.safetensors")), *got = names_of(path);
  REQUIRE(want && got);
  CHECKF(!strcmp(want, got), "ctuner's names differ from save_lora_weights':\n%.300s", got);
  ct_st_file *f = NULL;
  REQUIRE(ct_st_open(path, &f, &err) == CT_OK);
  const char *m = ct_st_meta(f, "lora_adapter_metadata");
  CHECK(m && strstr(m, "\"unet.r\": 4") && strstr(m, "\"unet.lora_alpha\": 8"));
  ct_st_close(f);
  REQUIRE(ct_unet_lora_new(ct_unet_cfg(u), TARGETS, 4, 8.0, &l2, &err) == CT_OK);
  REQUIRE(ct_unet_lora_load(l2, path, &err) == CT_OK);
  CHECK(!memcmp(ct_unet_lora_params(l), ct_unet_lora_params(l2),
                ct_unet_lora_numel(l) * sizeof(float)));
  ct_unet_lora_free(l2);
  /* another rank: refused by the metadata; other targets: names missing/unexpected */
  REQUIRE(ct_unet_lora_new(ct_unet_cfg(u), TARGETS, 2, 8.0, &l2, &err) == CT_OK);
  CHECK(ct_unet_lora_load(l2, path, &err) != CT_OK && strstr(err.msg, "rank 4"));
  ct_unet_lora_free(l2);
  REQUIRE(ct_unet_lora_new(ct_unet_cfg(u), NULL, 4, 8.0, &l2, &err) == CT_OK);
  CHECK(ct_unet_lora_load(l2, path, &err) != CT_OK && strstr(err.msg, "unexpected") &&
        strstr(err.msg, "proj_in"));
  ct_unet_lora_free(l2);
  free(want), free(got);
  ct_unet_lora_free(l);
  ct_unet_free(u);
}

static void forward(int *ct_failed_, ct_unet *u, const golden *gd, float *out) {
  ct_err err = {0};
  CHECKF(ct_unet_forward(u, &gd->in, out, NULL, &err) == CT_OK, "%s", err.msg);
}

/* merged into the base, the adapter's output without it; unmerged, the base back */
CT_TEST(unet_lora, merge) {
  golden gd;
  REQUIRE(golden_open(&gd));
  ct_err err = {0};
  ct_unet *u = NULL;
  ct_unet_lora *l = NULL;
  REQUIRE_OK(setup(&u, &l, &err), err);
  const size_t ns = gd.n[0], nw = ct_unet_numel(u);
  float *a = malloc(ns * sizeof(float)), *b = malloc(ns * sizeof(float)),
        *w0 = malloc(nw * sizeof(float));
  memcpy(w0, ct_unet_params(u), nw * sizeof(float));
  REQUIRE(ct_unet_set_lora(u, l, &err) == CT_OK);
  forward(ct_failed_, u, &gd, a);
  REQUIRE(ct_unet_set_lora(u, NULL, &err) == CT_OK);
  REQUIRE(ct_unet_lora_merge(u, l, 1, &err) == CT_OK);
  forward(ct_failed_, u, &gd, b);
  const double em = ct_test_rel_err(b, a, ns);
  CHECKF(em < 1e-5, "merged: %.3g relative to the adapter's output", em);
  REQUIRE(ct_unet_lora_merge(u, l, -1, &err) == CT_OK);
  const double ew = ct_test_rel_err(ct_unet_params(u), w0, nw);
  CHECKF(ew < 1e-6, "unmerged weights: %.3g relative to the base", ew);
  free(a), free(b), free(w0);
  ct_unet_lora_free(l);
  ct_unet_free(u);
  golden_close(&gd);
}

/* peft's init_lora_weights: B zero (the output is the base's), A
 * kaiming-uniform (bound 1/sqrt(in)) or N(0, 1/r); others refused by name */
CT_TEST(unet_lora, init) {
  golden gd;
  REQUIRE(golden_open(&gd));
  ct_err err = {0};
  ct_unet *u = NULL;
  ct_unet_lora *l = NULL;
  REQUIRE(ct_unet_from_pretrained(data(""), &u, &err) == CT_OK);
  REQUIRE(ct_unet_lora_new(ct_unet_cfg(u), NULL, 4, 4.0, &l, &err) == CT_OK);
  CHECK(ct_unet_lora_init(l, "pissa", 1, &err) == CT_ERR_UNSUPPORTED && strstr(err.msg, "pissa"));
  REQUIRE(ct_unet_lora_init(l, "default", 1, &err) == CT_OK);
  size_t nad;
  const ct_unet_adapter *ad = ct_unet_lora_adapters(l, &nad);
  CHECK(nad == 96); /* 12 transformer blocks x 2 attentions x 4 projections (the golden file) */
  const float *w = ct_unet_lora_params(l);
  int ok = 1;
  for (size_t i = 0; i < nad; i++) {
    const float bound = 1.0f / sqrtf((float)ad[i].lin.in);
    double amax = 0;
    for (size_t k = 0; k < (size_t)4 * ad[i].lin.in; k++)
      amax = fmax(amax, fabs(w[ad[i].a_off + k]));
    for (size_t k = 0; k < (size_t)4 * ad[i].lin.out; k++) ok &= w[ad[i].b_off + k] == 0.0f;
    ok &= amax <= bound && amax > 0.5 * bound;
  }
  CHECK(ok);
  const size_t ns = gd.n[0];
  float *a = malloc(ns * sizeof(float)), *b = malloc(ns * sizeof(float));
  forward(ct_failed_, u, &gd, a);
  REQUIRE(ct_unet_set_lora(u, l, &err) == CT_OK);
  forward(ct_failed_, u, &gd, b);
  CHECK(!memcmp(a, b, ns * sizeof(float)));
  REQUIRE(ct_unet_lora_init(l, "gaussian", 1, &err) == CT_OK);
  double s2 = 0;
  size_t na = 0;
  for (size_t i = 0; i < nad; i++)
    for (size_t k = 0; k < (size_t)4 * ad[i].lin.in; k++, na++)
      s2 += (double)w[ad[i].a_off + k] * w[ad[i].a_off + k];
  const double sd = sqrt(s2 / (double)na);
  CHECKF(fabs(sd - 0.25) < 0.03, "gaussian A: std %.3f, peft's 1/r = 0.25", sd);
  free(a), free(b);
  ct_unet_lora_free(l);
  ct_unet_free(u);
  golden_close(&gd);
}

CT_TEST(unet_lora, refusals) {
  ct_err err = {0};
  ct_unet_config c;
  REQUIRE(ct_unet_config_load(data("config.json"), &c, &err) == CT_OK);
  ct_unet_lora *l = NULL;
  CHECK(ct_unet_lora_new(&c, NULL, 64, 8.0, &l, &err) == CT_ERR_INVALID &&
        strstr(err.msg, "lora_rank 64") && !l);
  CHECK(ct_unet_lora_new(&c, NULL, 4, 0.0, &l, &err) == CT_ERR_INVALID &&
        strstr(err.msg, "lora_alpha"));
  CHECK(ct_unet_lora_new(&c, "conv1", 4, 4.0, &l, &err) == CT_ERR_UNSUPPORTED &&
        strstr(err.msg, "convolution"));
  /* SDXL 1.0 base: 70 transformer blocks x 2 attentions x 4 projections */
  ct_unet_config sdxl;
  ct_unet_config_sdxl(&sdxl);
  ct_unet_linear *lin = NULL;
  size_t nlin = 0;
  REQUIRE(ct_unet_lora_targets(&sdxl, NULL, &lin, &nlin, &err) == CT_OK);
  CHECKF(nlin == 560, "%zu default targets on SDXL", nlin);
  free(lin);
  ct_unet_config other = c;
  other.cross_attention_dim = 32;
  ct_unet *u = NULL;
  REQUIRE(ct_unet_new(&other, 1, &u, &err) == CT_OK);
  REQUIRE(ct_unet_lora_new(&c, NULL, 4, 4.0, &l, &err) == CT_OK);
  CHECK(ct_unet_set_lora(u, l, &err) == CT_ERR_INVALID && strstr(err.msg, "another U-net"));
  ct_unet_lora_free(l);
  ct_unet_free(u);
}

/* the ct_model adapter: table in diffusers' names, init, save and load
 * (whole and a range); a bad init type refused, the objects freed */
CT_TEST(unet_lora, model_adapter) {
  ct_err err = {0};
  ct_unet *u = NULL;
  ct_unet_lora *l = NULL;
  REQUIRE(ct_unet_from_pretrained(data(""), &u, &err) == CT_OK);
  REQUIRE(ct_unet_lora_new(ct_unet_cfg(u), "to_q,pissa_not", 4, 4.0, &l, &err) == CT_ERR_NOT_FOUND);
  REQUIRE(ct_unet_lora_new(ct_unet_cfg(u), NULL, 4, 4.0, &l, &err) == CT_OK);
  ct_model *m = NULL;
  CHECK(ct_model_unet_lora(u, l, "pissa", 1, &m, &err) == CT_ERR_UNSUPPORTED && !m);
  REQUIRE(ct_unet_from_pretrained(data(""), &u, &err) == CT_OK);
  REQUIRE(ct_unet_lora_new(ct_unet_cfg(u), NULL, 4, 4.0, &l, &err) == CT_OK);
  REQUIRE(ct_model_unet_lora(u, l, "gaussian", 7, &m, &err) == CT_OK);
  CHECK(m->ntab == 192 && ct_model_numel(m) == ct_unet_lora_numel(l));
  const ct_model_param *p =
      ct_model_find(m, "unet.mid_block.attentions.0.transformer_blocks.1.attn2.to_k.lora_A.weight");
  CHECK(p && p->shape[0] == 4 && p->shape[1] == 16); /* cross_attention_dim 16 */
  const size_t n = ct_model_numel(m);
  float *w0 = malloc(n * sizeof(float)), *r = malloc(n * sizeof(float));
  memcpy(w0, ct_model_params(m), n * sizeof(float));
  m->ops->init_range(m, 7, 0, n, r); /* the same draws as the constructor's */
  CHECK(!memcmp(r, w0, n * sizeof(float)));
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/unet_lora_ckpt", ct_test_tmpdir());
  REQUIRE(ct_mkdir_p(dir, &err) == CT_OK);
  REQUIRE(m->ops->save(m, dir, &err) == CT_OK);
  memset(ct_model_params(m), 0, n * sizeof(float));
  REQUIRE(m->ops->load(m, dir, 0, 0, NULL, &err) == CT_OK);
  CHECK(!memcmp(ct_model_params(m), w0, n * sizeof(float)));
  REQUIRE(m->ops->load(m, dir, 10, n - 3, r, &err) == CT_OK);
  CHECK(!memcmp(r, w0 + 10, (n - 13) * sizeof(float)));
  /* a host copy swapped in is what save writes; the forward refuses until swapped back */
  for (size_t i = 0; i < n; i++) r[i] = 0.5f;
  float *own = m->ops->swap_params(m, r);
  REQUIRE(m->ops->save(m, dir, &err) == CT_OK);
  golden gd;
  REQUIRE(golden_open(&gd));
  CHECK(ct_unet_forward(u, &gd.in, NULL, NULL, &err) == CT_ERR_INVALID);
  golden_close(&gd);
  CHECK(m->ops->swap_params(m, own) == r && ct_model_params(m) == own);
  REQUIRE(m->ops->load(m, dir, 0, 0, NULL, &err) == CT_OK);
  CHECK(ct_model_params(m)[0] == 0.5f && ct_model_params(m)[n - 1] == 0.5f);
  free(w0), free(r);
  ct_model_free(m);
}

/* On the sealed test backend (memory the host cannot touch) the adapters'
 * forward and backward give the CPU's bits; nothing is left allocated. */
CT_TEST(unet_lora, sealed_backend) {
  const ct_backend_ops *se = NULL;
  ct_err err = {0};
  REQUIRE(ct_backend_get("sealed", &se, &err) == CT_OK && !se->host_memory);
  golden gd;
  REQUIRE(golden_open(&gd));
  const size_t ns = gd.n[0];
  float *out[2], *gl[2];
  size_t nl = 0;
  ct_mem_stats d0, d1;
  ct_mem_get_device_stats(&d0);
  for (int k = 0; k < 2; k++) {
    ct_unet *u = NULL;
    ct_unet_lora *l = NULL;
    REQUIRE_OK(setup(&u, &l, &err), err);
    nl = ct_unet_lora_numel(l);
    out[k] = malloc(ns * sizeof(float)), gl[k] = malloc(nl * sizeof(float));
    ct_model *m = NULL;
    REQUIRE(ct_model_unet_lora(u, l, NULL, 1, &m, &err) == CT_OK);
    REQUIRE(ct_unet_lora_load(l, data("lora/pytorch_lora_weights.safetensors"), &err) == CT_OK);
    const ct_backend_ops *be = k ? se : ct_backend_default();
    REQUIRE(m->ops->set_backend(m, be, &err) == CT_OK);
    ct_unet_inputs in = gd.in;
    float *b[7];
    for (int i = 0; i < 6; i++) {
      b[i] = be->alloc(CT_MEM_BUFFERS, gd.n[i] * sizeof(float));
      be->copy_in(b[i], gd.f[i], gd.n[i] * sizeof(float));
    }
    b[6] = be->alloc(CT_MEM_BUFFERS, ns * sizeof(float));
    in.sample = b[0], in.timesteps = b[1], in.encoder_hidden_states = b[2];
    in.text_embeds = b[3], in.time_ids = b[4];
    ct_unet_tape *tp = NULL;
    REQUIRE(ct_unet_forward(u, &in, b[6], &tp, &err) == CT_OK);
    REQUIRE(ct_unet_backward(u, tp, b[5], NULL, NULL, &err) == CT_OK);
    ct_unet_tape_free(tp);
    be->copy_out(out[k], b[6], ns * sizeof(float));
    be->copy_out(gl[k], ct_model_grads(m), nl * sizeof(float));
    for (int i = 0; i < 7; i++) be->free(b[i]);
    ct_model_free(m);
  }
  CHECK(!memcmp(out[0], out[1], ns * sizeof(float)));
  CHECK(!memcmp(gl[0], gl[1], nl * sizeof(float)));
  const double e = ct_test_rel_err(out[1], gd.f[6], ns);
  CHECKF(e < 2e-5, "sealed output: %.3g relative to diffusers", e);
  ct_mem_get_device_stats(&d1);
  CHECKF(d1.total_current == d0.total_current, "sealed bytes left allocated: %zd",
         (ssize_t)(d1.total_current - d0.total_current));
  for (int k = 0; k < 2; k++) free(out[k]), free(gl[k]);
  golden_close(&gd);
}

/* kohya's SDXL file (sd-scripts: lora_unet_<SGM module>, lora_down / lora_up /
 * alpha, the golden's alpha 2 against ours 8, which diffusers' loader reads
 * as the same adapter): the same parameters; a text-encoder tensor refused */
CT_TEST(unet_lora, kohya) {
  ct_err err = {0};
  ct_unet *u = NULL;
  ct_unet_lora *l = NULL, *k = NULL;
  REQUIRE_OK(setup(&u, &l, &err), err);
  REQUIRE(ct_unet_lora_new(ct_unet_cfg(u), TARGETS, 4, 8.0, &k, &err) == CT_OK);
  REQUIRE_OK(ct_unet_lora_load(k, data("lora/kohya.safetensors"), &err) == CT_OK, err);
  CHECK(!memcmp(ct_unet_lora_params(l), ct_unet_lora_params(k),
                ct_unet_lora_numel(l) * sizeof(float)));
  /* the same file with a text encoder's adapter tensor added */
  ct_st_file *f = NULL;
  REQUIRE(ct_st_open(data("lora/kohya.safetensors"), &f, &err) == CT_OK);
  ct_st_writer *w = NULL;
  REQUIRE(ct_st_writer_new(&w) == CT_OK);
  float *bufs[512];
  size_t nb = 0;
  for (size_t i = 0; i < f->ntensors && nb < 511; i++) {
    size_t n;
    bufs[nb] = ct_test_tensor(f, f->tensors[i].name, &n);
    REQUIRE(ct_st_writer_add_f32(w, f->tensors[i].name, f->tensors[i].ndim, f->tensors[i].shape,
                                 bufs[nb], CT_DTYPE_F32, &err) == CT_OK);
    nb++;
  }
  static const float one[4] = {1, 2, 3, 4};
  const int64_t sh[2] = {1, 4};
  REQUIRE(ct_st_writer_add_f32(w, "lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight",
                               2, sh, one, CT_DTYPE_F32, &err) == CT_OK);
  char path[4200];
  snprintf(path, sizeof path, "%s/kohya_te.safetensors", ct_test_tmpdir());
  REQUIRE(ct_st_writer_write(w, path, &err) == CT_OK);
  ct_st_writer_free(w);
  for (size_t i = 0; i < nb; i++) free(bufs[i]);
  ct_st_close(f);
  CHECK(ct_unet_lora_load(k, path, &err) == CT_ERR_SHAPE && strstr(err.msg, "1 unexpected") &&
        strstr(err.msg, "lora_te1_text_model") && strstr(err.msg, "U-net only"));
  ct_unet_lora_free(k);
  ct_unet_lora_free(l);
  ct_unet_free(u);
}

/* training: SGD on the adapters alone (base frozen, B from zero) moves the
 * output towards the golden adapter's: the loss falls, the base stays bitwise */
CT_TEST(unet_lora, learns) {
  golden gd;
  REQUIRE(golden_open(&gd));
  ct_err err = {0};
  ct_unet *u = NULL;
  ct_unet_lora *l = NULL;
  REQUIRE(ct_unet_from_pretrained(data(""), &u, &err) == CT_OK);
  REQUIRE(ct_unet_lora_new(ct_unet_cfg(u), TARGETS, 4, 8.0, &l, &err) == CT_OK);
  ct_model *m = NULL;
  REQUIRE(ct_model_unet_lora(u, l, "default", 3, &m, &err) == CT_OK);
  const size_t ns = gd.n[0], nl = ct_model_numel(m), nw = ct_unet_numel(u);
  float *out = malloc(ns * sizeof(float)), *d = malloc(ns * sizeof(float)),
        *w0 = malloc(nw * sizeof(float));
  memcpy(w0, ct_unet_params(u), nw * sizeof(float));
  double first = NAN, last = NAN;
  for (int step = 0; step < 30; step++) {
    ct_unet_tape *tp = NULL;
    REQUIRE(ct_unet_forward(u, &gd.in, out, &tp, &err) == CT_OK);
    double loss = 0; /* mean squared error to the golden adapter's output */
    for (size_t i = 0; i < ns; i++) {
      d[i] = out[i] - gd.f[6][i];
      loss += (double)d[i] * d[i] / (double)ns;
      d[i] *= 2.0f / (float)ns;
    }
    if (step == 0) first = loss;
    last = loss;
    float *g = ct_model_grads(m), *w = ct_model_params(m);
    memset(g, 0, nl * sizeof(float));
    REQUIRE(ct_unet_backward(u, tp, d, NULL, NULL, &err) == CT_OK);
    ct_unet_tape_free(tp);
    for (size_t i = 0; i < nl; i++) w[i] -= 2.0f * g[i];
  }
  fprintf(stderr, "  LoRA SGD, 30 steps: loss %.4g -> %.4g\n", first, last);
  CHECKF(last < 0.7 * first, "the loss fell from %.4g to only %.4g", first, last);
  CHECK(!memcmp(w0, ct_unet_params(u), nw * sizeof(float)));
  free(out), free(d), free(w0);
  ct_model_free(m);
  golden_close(&gd);
}

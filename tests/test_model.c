/* Model tests: parity with the PyTorch peer's golden files, the parameter table
 * (Flux names and the published Flux.1-dev size), load/save, load errors,
 * gradient accumulation and thread-count independence, gradient checkpointing
 * (bit-identical, also through segment hooks). */
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/kernels.h"
#include "ctuner/mmdit.h"
#include "ctuner/parallel.h"
#include "ctuner/rng.h"
#include "ctuner/safetensors.h"
#include "harness.h"

static void check_golden(int *ct_failed_, const char *file) {
  ct_err err = {0};
  ct_mmdit_check_report r;
  ct_status st = ct_mmdit_check_golden(ct_test_data(file), &r, &err);
  CHECKF(st == CT_OK, "%s", err.msg);
  if (st) return;
  fprintf(stderr, "  %s: loss %.7f (ref %.7f) err xt %.2e v %.2e loss %.2e grad %.2e (%s)\n", file,
          r.loss, r.loss_ref, r.err_xt, r.err_v, r.err_loss, r.err_grad, r.worst_grad);
  CHECK(r.err_xt <= 1e-6);
  CHECK(r.err_v <= 1e-4);
  CHECK(r.err_loss <= 1e-4);
  CHECK(r.err_grad <= 1e-4);
}

CT_TEST(model, golden_tiny) {
  check_golden(ct_failed_, "golden_tiny.safetensors");
}
CT_TEST(model, golden_odd_grid) {
  check_golden(ct_failed_, "golden_odd.safetensors");
}

CT_TEST(model, flux_dev_table) {
  const ct_mmdit_preset *p = ct_mmdit_preset_find("flux-dev");
  REQUIRE(p);
  ct_param *tab;
  size_t n, numel, real = 0;
  ct_err err = {0};
  REQUIRE(ct_mmdit_param_table(&p->cfg, &tab, &n, &numel, &err) == CT_OK);
  for (size_t i = 0; i < n; i++) real += tab[i].numel;
  /* FLUX.1-dev's transformer as published: 11,901,408,320 parameters. */
  CHECKF(real == 11901408320ull, "got %zu", real);
  int found = 0;
  for (size_t i = 0; i < n; i++) {
    if (!strcmp(tab[i].name, "double_blocks.18.txt_attn.norm.key_norm.scale") &&
        tab[i].shape[0] == 128)
      found++;
    if (!strcmp(tab[i].name, "single_blocks.37.linear1.weight") && tab[i].shape[0] == 21504 &&
        tab[i].shape[1] == 3072)
      found++;
    if (!strcmp(tab[i].name, "guidance_in.out_layer.bias")) found++;
    if (!strcmp(tab[i].name, "final_layer.adaLN_modulation.1.weight") && tab[i].shape[0] == 6144)
      found++;
    CHECK(tab[i].offset % 16 == 0);
    if (i) CHECK(tab[i].offset >= tab[i - 1].offset + tab[i - 1].numel);
  }
  CHECK(found == 4);
  free(tab);
  CHECK(ct_mmdit_preset_find("nope") == NULL);
}

/* make demo's preset: small's text width and input, narrower and shallower. */
CT_TEST(model, demo_preset) {
  const ct_mmdit_preset *d = ct_mmdit_preset_find("demo"), *s = ct_mmdit_preset_find("small");
  REQUIRE(d && s);
  ct_err err = {0};
  CHECK(ct_mmdit_config_validate(&d->cfg, &err) == CT_OK);
  CHECK(d->cfg.in_channels == s->cfg.in_channels);
  CHECK(d->cfg.context_in_dim == s->cfg.context_in_dim && d->cfg.vec_in_dim == s->cfg.vec_in_dim);
  CHECK(d->cfg.hidden == 128 && d->cfg.heads == 2);
  CHECK(d->cfg.depth_double == 2 && d->cfg.depth_single == 2);
  ct_param *tab;
  size_t n, numel, real = 0;
  REQUIRE(ct_mmdit_param_table(&d->cfg, &tab, &n, &numel, &err) == CT_OK);
  for (size_t i = 0; i < n; i++) real += tab[i].numel;
  free(tab);
  CHECKF(real == 1826864, "got %zu", real); /* small: 5,152,816 */
}

CT_TEST(model, config_errors) {
  ct_mmdit_config c = ct_mmdit_preset_find("tiny")->cfg;
  ct_err err = {0};
  c.axes_dim[0] = 10;
  CHECK(ct_mmdit_config_validate(&c, &err) == CT_ERR_INVALID);
  CHECK(strstr(err.msg, "axes_dim") != NULL);
  c = ct_mmdit_preset_find("tiny")->cfg;
  c.heads = 3;
  CHECK(ct_mmdit_config_validate(&c, &err) == CT_ERR_INVALID);
  CHECK(strstr(err.msg, "heads") != NULL);
}

CT_TEST(model, init_adaln_zero) {
  ct_mmdit *m;
  ct_err err = {0};
  REQUIRE(ct_mmdit_new(&ct_mmdit_preset_find("tiny")->cfg, 5, 0, &m, &err) == CT_OK);
  const float *w = ct_mmdit_params(m);
  const ct_param *p = ct_mmdit_find(m, "double_blocks.0.img_mod.lin.weight");
  REQUIRE(p);
  int nz = 0;
  for (size_t i = 0; i < p->numel; i++) nz += w[p->offset + i] != 0;
  CHECK(nz == 0);
  p = ct_mmdit_find(m, "single_blocks.0.norm.query_norm.scale");
  CHECK(w[p->offset] == 1.0f);
  p = ct_mmdit_find(m, "double_blocks.0.img_attn.qkv.weight");
  double s2 = 0;
  for (size_t i = 0; i < p->numel; i++) s2 += (double)w[p->offset + i] * w[p->offset + i];
  CHECK_NEAR(sqrt(s2 / p->numel), 0.02, 0.002);
  /* An adaLN-Zero model is the identity per block: output = final linear (zero) => 0. */
  ct_mmdit_free(m);
}

/* Random inputs for the tiny preset. */
typedef struct io {
  float x[2 * 4 * 4 * 6], t[2], txt[2 * 5 * 32], y[2 * 32], v[2 * 4 * 4 * 6], dv[2 * 4 * 4 * 6];
} io;

static void make_io(io *d) {
  ct_rng_fill_normal(d->x, 192, 9, 1, 0, 0, 1);
  ct_rng_fill_normal(d->txt, 320, 9, 2, 0, 0, 1);
  ct_rng_fill_normal(d->y, 64, 9, 3, 0, 0, 1);
  ct_rng_fill_normal(d->dv, 192, 9, 4, 0, 0, 1);
  d->t[0] = 0.3f;
  d->t[1] = 0.8f;
}

static ct_status run(ct_mmdit *m, io *d, ct_err *err) {
  ct_mmdit_batch in = {2, 4, 6, 5, d->x, d->t, d->txt, d->y, NULL};
  ct_status st = ct_mmdit_forward(m, &in, d->v, err);
  if (!st) st = ct_mmdit_backward(m, d->dv, err);
  return st;
}

CT_TEST(model, accumulate_and_threads) {
  ct_mmdit *m;
  ct_err err = {0};
  io d;
  make_io(&d);
  REQUIRE(ct_mmdit_new(&ct_mmdit_preset_find("tiny")->cfg, 5, 1, &m, &err) == CT_OK);
  size_t n = ct_mmdit_numel(m);
  ct_rng_fill_normal(ct_mmdit_params(m), n, 3, 0, 0, 0, 0.05f);
  float *g1 = malloc(n * 4), *g2 = malloc(n * 4);
  REQUIRE(g1 && g2);
  int nt = ct_threads_get();
  /* Same thread count: bit-identical. Different thread counts: OpenBLAS's
   * SGEMM blocks differently, so only rounding-level agreement. */
  ct_threads_set(2);
  REQUIRE(run(m, &d, &err) == CT_OK);
  memcpy(g1, ct_mmdit_grads(m), n * 4);
  ct_zero(n, ct_mmdit_grads(m));
  REQUIRE(run(m, &d, &err) == CT_OK);
  CHECKF(!memcmp(g1, ct_mmdit_grads(m), n * 4), "gradients differ between two runs with 2 threads");
  ct_zero(n, ct_mmdit_grads(m));
  ct_threads_set(1);
  REQUIRE(run(m, &d, &err) == CT_OK);
  double md1 = 0, mg = 0;
  for (size_t i = 0; i < n; i++) {
    md1 = ct_test_max(md1, fabs(g1[i] - ct_mmdit_grads(m)[i]));
    mg = ct_test_max(mg, fabs(g1[i]));
  }
  CHECKF(md1 <= 1e-5 * mg, "1 vs 2 threads: max diff %g of max %g", md1, mg);
  ct_zero(n, ct_mmdit_grads(m));
  ct_threads_set(2);
  REQUIRE(run(m, &d, &err) == CT_OK);
  /* a second backward accumulates */
  memcpy(g2, ct_mmdit_grads(m), n * 4);
  REQUIRE(run(m, &d, &err) == CT_OK);
  double md = 0;
  for (size_t i = 0; i < n; i++) md = ct_test_max(md, fabs(ct_mmdit_grads(m)[i] - 2 * g2[i]));
  CHECK(md < 1e-5);
  ct_threads_set(nt);
  free(g1);
  free(g2);
  ct_mmdit_free(m);
}

/* Hooks that move every segment: parameters copied to a scratch buffer on
 * enter, gradients into a separate per-segment buffer; the log records the
 * calls so the order (forward 0..last, backward last..0) is checked. */
typedef struct seg_hooks {
  ct_mmdit *m;
  const float *w;
  float *scratch, *grads; /* numel floats each, at the flat offsets */
  int log[256], nlog, open;
} seg_hooks;

static ct_status hk_enter(void *user, int s, int backward, float **w, float **g, ct_err *err) {
  seg_hooks *h = user;
  size_t off, n;
  ct_mmdit_segment(h->m, s, &off, &n);
  if (h->open >= 0) return ct_errf(err, CT_ERR_INVALID, "segment %d entered inside %d", s, h->open);
  h->open = s;
  memset(h->scratch, 0xff, ct_mmdit_numel(h->m) * sizeof(float)); /* NaN everywhere else */
  memcpy(h->scratch + off, h->w + off, n * sizeof(float));
  *w = h->scratch + off;
  if (backward) *g = h->grads + off;
  if (h->nlog < 256) h->log[h->nlog++] = backward ? -1 - s : s;
  return CT_OK;
}

static ct_status hk_leave(void *user, int s, int backward, ct_err *err) {
  seg_hooks *h = user;
  (void)backward;
  if (h->open != s) return ct_errf(err, CT_ERR_INVALID, "segment %d left but %d open", s, h->open);
  h->open = -1;
  return CT_OK;
}

CT_TEST(model, segment_hooks) {
  ct_mmdit *m;
  ct_err err = {0};
  io d;
  make_io(&d);
  REQUIRE(ct_mmdit_new(&ct_mmdit_preset_find("tiny")->cfg, 5, 1, &m, &err) == CT_OK);
  const size_t n = ct_mmdit_numel(m);
  const int ns = ct_mmdit_nsegments(m);
  const ct_mmdit_config *c = ct_mmdit_cfg(m);
  CHECK(ns == c->depth_double + c->depth_single + 2);
  size_t off, len, at = 0;
  for (int s = 0; s < ns; s++) { /* contiguous, covering, non-empty */
    ct_mmdit_segment(m, s, &off, &len);
    CHECK(off == at && len > 0);
    at = off + len;
  }
  CHECK(at == n);
  ct_mmdit_segment(m, 1, &off, &len);
  CHECK(!strncmp(ct_mmdit_table(m, &len)[0].name, "img_in", 6));
  CHECK(ct_mmdit_find(m, "double_blocks.0.img_mod.lin.weight")->offset == off);

  ct_rng_fill_normal(ct_mmdit_params(m), n, 3, 0, 0, 0, 0.05f);
  float *v0 = malloc(sizeof d.v), *g0 = malloc(n * 4);
  float *w = malloc(n * 4), *scratch = malloc(n * 4), *grads = calloc(n, 4);
  REQUIRE(v0 && g0 && w && scratch && grads);
  REQUIRE(run(m, &d, &err) == CT_OK);
  memcpy(v0, d.v, sizeof d.v);
  memcpy(g0, ct_mmdit_grads(m), n * 4);
  memcpy(w, ct_mmdit_params(m), n * 4);

  /* no own parameters or gradients: everything through the hooks */
  seg_hooks h = {.m = m, .w = w, .scratch = scratch, .grads = grads, .open = -1};
  ct_mmdit_hooks hk = {&h, hk_enter, hk_leave};
  ct_mmdit_use_params(m, NULL);
  ct_mmdit_use_grads(m, NULL);
  memset(d.v, 0, sizeof d.v);
  CHECK(run(m, &d, &err) == CT_ERR_INVALID); /* without hooks nothing to run on */
  ct_mmdit_set_hooks(m, &hk);
  REQUIRE(run(m, &d, &err) == CT_OK);
  CHECK(!memcmp(v0, d.v, sizeof d.v));
  CHECKF(!memcmp(g0, grads, n * 4), "gradients through the hooks differ");
  REQUIRE(h.nlog == 2 * ns);
  int order = 1;
  for (int i = 0; i < ns; i++) order &= h.log[i] == i && h.log[ns + i] == -1 - (ns - 1 - i);
  CHECK(order);
  ct_mmdit_set_hooks(m, NULL);
  free(v0);
  free(g0);
  free(w);
  free(scratch);
  free(grads);
  ct_mmdit_free(m);
}

/* Gradient checkpointing: outputs and every gradient bit-identical to the
 * plain run at intervals 1, 2 and 3 (tiny, and a deeper, wider variant with
 * the same input shapes), a smaller arena, and the same through segment hooks
 * that leave only the entered segment's weights readable (NaN elsewhere): the
 * recompute must run inside its segment's enter/leave. */
static void ckpt_case(int *ct_failed_, const ct_mmdit_config *c) {
  ct_mmdit *m;
  ct_err err = {0};
  io d;
  make_io(&d);
  REQUIRE(ct_mmdit_new(c, 5, 1, &m, &err) == CT_OK);
  const size_t n = ct_mmdit_numel(m);
  const int ns = ct_mmdit_nsegments(m);
  ct_rng_fill_normal(ct_mmdit_params(m), n, 3, 0, 0, 0, 0.05f);
  float *v0 = malloc(sizeof d.v), *g0 = malloc(n * 4), *w = malloc(n * 4);
  float *scratch = malloc(n * 4), *grads = calloc(n, 4);
  REQUIRE(v0 && g0 && w && scratch && grads);
  REQUIRE(run(m, &d, &err) == CT_OK);
  memcpy(v0, d.v, sizeof d.v);
  memcpy(g0, ct_mmdit_grads(m), n * 4);
  memcpy(w, ct_mmdit_params(m), n * 4);
  const size_t full = ct_mmdit_activation_bytes(m);
  for (int every = 1; every <= 3; every++) {
    ct_mmdit_set_checkpointing(m, every);
    int nd, nsg;
    CHECK(ct_mmdit_checkpointing(m, &nd, &nsg) == every);
    ct_zero(n, ct_mmdit_grads(m));
    memset(d.v, 0, sizeof d.v);
    REQUIRE(run(m, &d, &err) == CT_OK);
    CHECKF(!memcmp(v0, d.v, sizeof d.v), "interval %d: the output differs", every);
    CHECKF(!memcmp(g0, ct_mmdit_grads(m), n * 4), "interval %d: gradients differ", every);
    /* a list with one block to checkpoint runs plain: tiny saves nothing */
    if (nd + nsg == 0)
      CHECK(ct_mmdit_activation_bytes(m) == full);
    else
      CHECKF(ct_mmdit_activation_bytes(m) < full, "interval %d: arena %zu not below %zu", every,
             ct_mmdit_activation_bytes(m), full);
    if (every == 1)
      fprintf(stderr, "  arena %zu -> %zu bytes\n", full, ct_mmdit_activation_bytes(m));
  }
  /* through hooks, interval 2: same numbers, same enter/leave order */
  seg_hooks h = {.m = m, .w = w, .scratch = scratch, .grads = grads, .open = -1};
  ct_mmdit_hooks hk = {&h, hk_enter, hk_leave};
  ct_mmdit_set_checkpointing(m, 2);
  ct_mmdit_use_params(m, NULL);
  ct_mmdit_use_grads(m, NULL);
  ct_mmdit_set_hooks(m, &hk);
  memset(d.v, 0, sizeof d.v);
  REQUIRE(run(m, &d, &err) == CT_OK);
  CHECK(!memcmp(v0, d.v, sizeof d.v));
  CHECKF(!memcmp(g0, grads, n * 4), "gradients through the hooks differ with checkpointing");
  REQUIRE(h.nlog == 2 * ns);
  int order = 1;
  for (int i = 0; i < ns; i++) order &= h.log[i] == i && h.log[ns + i] == -1 - (ns - 1 - i);
  CHECK(order);
  ct_mmdit_set_hooks(m, NULL);
  free(v0);
  free(g0);
  free(w);
  free(scratch);
  free(grads);
  ct_mmdit_free(m);
}

CT_TEST(model, gradient_checkpointing) {
  ct_mmdit_config c = ct_mmdit_preset_find("tiny")->cfg;
  ckpt_case(ct_failed_, &c);
  c.hidden = 96; /* heads 3 of 32 */
  c.heads = 3;
  c.depth_double = 3;
  c.depth_single = 5;
  ckpt_case(ct_failed_, &c);
  /* which blocks: 0, N, 2N, ... of each list; a list with one only runs plain */
  ct_mmdit *m;
  ct_err err = {0};
  REQUIRE(ct_mmdit_new(&c, 5, 0, &m, &err) == CT_OK);
  const int want[4][2] = {{0, 0}, {3, 5}, {2, 3}, {0, 2}};
  for (int every = 0; every <= 3; every++) {
    int nd = -1, nsg = -1;
    ct_mmdit_set_checkpointing(m, every);
    CHECK(ct_mmdit_checkpointing(m, &nd, &nsg) == every);
    CHECKF(nd == want[every][0] && nsg == want[every][1], "interval %d: %d double, %d single",
           every, nd, nsg);
  }
  ct_mmdit_free(m);
  c.depth_single = 0; /* double blocks only */
  ckpt_case(ct_failed_, &c);
}

CT_TEST(model, save_load_roundtrip) {
  ct_mmdit *a, *b;
  ct_err err = {0};
  const ct_mmdit_config *c = &ct_mmdit_preset_find("tiny")->cfg;
  REQUIRE(ct_mmdit_new(c, 1, 0, &a, &err) == CT_OK);
  REQUIRE(ct_mmdit_new(c, 2, 0, &b, &err) == CT_OK);
  ct_rng_fill_normal(ct_mmdit_params(a), ct_mmdit_numel(a), 4, 0, 0, 0, 1);
  char path[512];
  snprintf(path, sizeof path, "%s/model.safetensors", ct_test_tmpdir());
  REQUIRE(ct_mmdit_save(a, path, &err) == CT_OK);
  CHECKF(ct_mmdit_load(b, path, "", &err) == CT_OK, "%s", err.msg);
  size_t np;
  const ct_param *tab = ct_mmdit_table(a, &np);
  int same = 1;
  for (size_t i = 0; i < np; i++)
    same &= !memcmp(ct_mmdit_params(a) + tab[i].offset, ct_mmdit_params(b) + tab[i].offset,
                    tab[i].numel * 4);
  CHECK(same);
  ct_mmdit_free(a);
  ct_mmdit_free(b);
}

CT_TEST(model, load_lists_all_problems) {
  /* A file with one tensor missing, one wrongly shaped and one unexpected. */
  ct_mmdit *m;
  ct_err err = {0};
  const ct_mmdit_config *c = &ct_mmdit_preset_find("tiny")->cfg;
  REQUIRE(ct_mmdit_new(c, 1, 0, &m, &err) == CT_OK);
  ct_st_writer *w;
  REQUIRE(ct_st_writer_new(&w) == CT_OK);
  size_t np;
  const ct_param *tab = ct_mmdit_table(m, &np);
  for (size_t i = 0; i < np; i++) {
    if (!strcmp(tab[i].name, "txt_in.bias")) continue; /* missing */
    int64_t shp[2] = {tab[i].shape[0], tab[i].shape[1]};
    if (!strcmp(tab[i].name, "img_in.weight"))
      shp[1] = 8; /* wrong shape: numel must still fit the data */
    size_t need = (size_t)shp[0] * (size_t)(tab[i].ndim == 2 ? shp[1] : 1);
    REQUIRE(need <= tab[i].numel + 4096);
    REQUIRE(ct_st_writer_add_f32(w, tab[i].name, tab[i].ndim, shp,
                                 ct_mmdit_params(m) + tab[i].offset, CT_DTYPE_F32, &err) == CT_OK);
  }
  int64_t one = 4;
  float extra[4] = {0};
  REQUIRE(ct_st_writer_add_f32(w, "double_blocks.7.img_mod.lin.weight", 1, &one, extra,
                               CT_DTYPE_F32, &err) == CT_OK);
  char path[512];
  snprintf(path, sizeof path, "%s/bad_model.safetensors", ct_test_tmpdir());
  REQUIRE(ct_st_writer_write(w, path, &err) == CT_OK);
  ct_st_writer_free(w);
  ct_status st = ct_mmdit_load(m, path, "", &err);
  CHECK(st == CT_ERR_SHAPE);
  CHECKF(strstr(err.msg, "txt_in.bias") && strstr(err.msg, "img_in.weight") &&
             strstr(err.msg, "double_blocks.7.img_mod.lin.weight") &&
             strstr(err.msg, "1 missing") && strstr(err.msg, "1 wrongly shaped") &&
             strstr(err.msg, "1 unexpected"),
         "%s", err.msg);
  ct_mmdit_free(m);
}

/* Memory planning without a model (`bench memory --plan`): the activation
 * arena a forward reserves and the largest segment equal the planned ones. */
CT_TEST(model, memory_plan_matches_model) {
  ct_mmdit_config c = ct_mmdit_preset_find("tiny")->cfg;
  c.depth_double = 3;
  c.depth_single = 4;
  ct_err err = {0};
  ct_mmdit *m;
  REQUIRE(ct_mmdit_new(&c, 3, CT_MMDIT_GRADS, &m, &err) == CT_OK);
  size_t np, numel, nt;
  ct_param *tab;
  REQUIRE(ct_mmdit_param_table(&c, &tab, &nt, &numel, &err) == CT_OK);
  size_t best = 0, off, n;
  for (int s = 0; s < ct_mmdit_nsegments(m); s++) {
    ct_mmdit_segment(m, s, &off, &n);
    if (n > best) best = n;
  }
  CHECKF(ct_mmdit_max_segment(&c, tab, nt, numel) == best, "max segment %zu, model %zu",
         ct_mmdit_max_segment(&c, tab, nt, numel), best);
  (void)ct_mmdit_table(m, &np);
  CHECK(np == nt && numel == ct_mmdit_numel(m));
  free(tab);
  const int B = 2, H = 6, W = 4, T = 3;
  size_t nx = (size_t)B * c.in_channels * H * W;
  float *x = calloc(nx, 4), *v = calloc(nx, 4), *t = calloc(B, 4);
  float *txt = calloc((size_t)B * T * c.context_in_dim, 4),
        *y = calloc((size_t)B * c.vec_in_dim, 4);
  REQUIRE(x && v && t && txt && y);
  for (int every = 0; every <= 2; every++) {
    ct_mmdit_set_checkpointing(m, every);
    ct_mmdit_batch in = {B, H, W, T, x, t, txt, y, NULL};
    REQUIRE(ct_mmdit_forward(m, &in, v, &err) == CT_OK);
    CHECKF(ct_mmdit_activation_plan(&c, every, B, H, W, T) == ct_mmdit_activation_bytes(m),
           "every %d: planned %zu, reserved %zu", every,
           ct_mmdit_activation_plan(&c, every, B, H, W, T), ct_mmdit_activation_bytes(m));
  }
  free(x);
  free(v);
  free(t);
  free(txt);
  free(y);
  ct_mmdit_free(m);
}

/* Device backends against the CPU, at the shapes a model really runs (ggml's
 * test-backend-ops "vs CPU" mode): tests/test_backend.c checks every op
 * against double references on small matrices; this suite takes every
 * listed backend whose memory the host cannot touch (host_memory 0: cuda and
 * cuda-bf16 on a GPU, the sealed test backend everywhere) and compares it with
 * the CPU backend of the same compute (cpu or cpu-bf16) by normalised mean
 * squared error (NMSE = sum (a-b)^2 / sum b^2; NaN fails):
 *   - a FLUX-shaped MMDiT step (head dim 128, a sequence that is no multiple
 *     of any tile) forward and backward: the velocity and every gradient;
 *   - the products and attention at those shapes, bf16/int8 weight views too;
 *   - the same step twice on the device: the same bits (run-to-run
 *     determinism, docs/cuda.md).
 * A backend computing on the host (sealed) gets small shapes and must match the
 * CPU exactly (NMSE 0): the same kernels. A GPU gets the larger shapes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/backend.h"
#include "ctuner/mmdit.h"
#include "ctuner/rng.h"
#include "harness.h"

/* ---------------------------------------------------------------- helpers */

typedef struct dctx {
  const ct_backend_ops *be;
  void *dev[32];
  int nd;
} dctx;

static float *hnormal(size_t n, uint64_t stream, float std) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  if (p) ct_rng_fill_normal(p, n, 42, stream, 0, 0.0f, std);
  return p;
}

static void *dkeep(dctx *c, void *p) {
  if (!p || c->nd == (int)(sizeof c->dev / sizeof c->dev[0])) abort();
  return c->dev[c->nd++] = p;
}
static void *din(dctx *c, const void *h, size_t bytes) {
  void *d = dkeep(c, c->be->alloc(CT_MEM_OTHER, bytes));
  c->be->copy_in(d, h, bytes);
  return d;
}
static float *dzero(dctx *c, size_t n) {
  float *d = dkeep(c, c->be->alloc(CT_MEM_OTHER, n * sizeof(float)));
  c->be->zero(n, d);
  return d;
}
static float *dout(dctx *c, const float *d, size_t n) {
  float *h = malloc((n ? n : 1) * sizeof(float));
  if (!h) abort();
  c->be->copy_out(h, d, n * sizeof(float));
  return h;
}
static void drelease(dctx *c) {
  for (int i = 0; i < c->nd; i++) c->be->free(c->dev[i]);
  c->nd = 0;
}

static double nmse(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)b[i] * (double)b[i];
  }
  return den > 0 ? num / den : num; /* NaN stays NaN */
}

/* The CPU backend that computes like be (cpu or cpu-bf16). */
static const ct_backend_ops *cpu_like(const ct_backend_ops *be) {
  const ct_backend_ops *ref = NULL;
  ct_err err = {0};
  if (ct_backend_with_compute(ct_backend_default(), be->compute, &ref, &err)) return NULL;
  return ref;
}

/* a real device (init) gets the large shapes; a host-side test backend the small ones */
static int big(const ct_backend_ops *be) {
  return be->init != NULL;
}

/* the NMSE a backend may differ from the CPU by: none on the host's own kernels */
static double tol(const ct_backend_ops *be) {
  return be->init == NULL ? 0.0 : be->compute == CT_COMPUTE_BF16 ? 1e-4 : 1e-8;
}

static int ndevice(void) {
  int n = 0;
  for (size_t i = 0; i < ct_backend_count(); i++) n += !ct_backend_at(i)->host_memory;
  return n;
}

/* ---------------------------------------------------------------- a model step */

typedef struct step_out {
  float *v, *g;
  size_t nv, ng;
} step_out;

static void step_out_free(step_out *o) {
  free(o->v);
  free(o->g);
  memset(o, 0, sizeof *o);
}

/* A FLUX-shaped MMDiT (head dim 128, axes 16/56/56, one double and one
 * single block) on a sequence of 23x23 image tokens + 96 text tokens (625,
 * no multiple of 32 or 64), or the small preset's shape on a host backend. */
static void model_shape(int large, ct_mmdit_config *c, int *B, int *H, int *W, int *T) {
  if (large) {
    *c = (ct_mmdit_config){.in_channels = 16,
                           .patch = 2,
                           .hidden = 768,
                           .heads = 6,
                           .axes_dim = {16, 56, 56},
                           .depth_double = 1,
                           .depth_single = 1,
                           .mlp_ratio = 4,
                           .context_in_dim = 512,
                           .vec_in_dim = 256,
                           .qkv_bias = 1,
                           .guidance_embed = 1,
                           .theta = 10000};
    *B = 1, *H = 46, *W = 46, *T = 96;
  } else {
    const ct_mmdit_preset *p = ct_mmdit_preset_find("small");
    *c = p->cfg;
    c->guidance_embed = 1;
    *B = 2, *H = p->lat_h, *W = p->lat_w, *T = p->txt_len;
  }
}

/* forward, MSE-like backward (dv = v), on be at the large or the small shape (the
 * device's choice, for the CPU reference too); the velocity and the gradient come back */
static ct_status model_step(const ct_backend_ops *be, int large, step_out *o, ct_err *err) {
  ct_mmdit_config c;
  int B, H, W, T;
  model_shape(large, &c, &B, &H, &W, &T);
  ct_mmdit *m = NULL;
  dctx d = {.be = be};
  ct_status st = ct_mmdit_new(&c, 0, CT_MMDIT_GRADS, &m, err);
  if (st) return st;
  size_t n = ct_mmdit_numel(m);
  ct_rng_fill_normal(ct_mmdit_params(m), n, 7, 0, 0, 0.0f, 0.02f); /* no zero paths */
  if ((st = ct_mmdit_set_backend(m, be, err))) goto out;
  size_t nx = (size_t)B * c.in_channels * H * W, ntxt = (size_t)B * T * c.context_in_dim;
  size_t ny = (size_t)B * c.vec_in_dim;
  float *x = hnormal(nx, 1, 1), *txt = hnormal(ntxt, 2, 1), *y = hnormal(ny, 3, 1);
  float t[4] = {0.3f, 0.8f, 0.5f, 0.1f}, g[4] = {3.5f, 1.0f, 2.0f, 4.0f};
  ct_mmdit_batch in = {B,
                       H,
                       W,
                       T,
                       din(&d, x, nx * 4),
                       din(&d, t, (size_t)B * 4),
                       din(&d, txt, ntxt * 4),
                       din(&d, y, ny * 4),
                       din(&d, g, (size_t)B * 4)};
  free(x), free(txt), free(y);
  float *v = dzero(&d, nx);
  be->zero(n, ct_mmdit_grads(m));
  if ((st = ct_mmdit_forward(m, &in, v, err))) goto out;
  if ((st = ct_mmdit_backward(m, v, err))) goto out; /* d(0.5 |v|^2)/dv = v */
  o->v = dout(&d, v, nx), o->nv = nx;
  o->g = dout(&d, ct_mmdit_grads(m), n), o->ng = n;
  if (be->check) st = be->check(err);
out:
  drelease(&d);
  ct_mmdit_free(m);
  return st;
}

CT_TEST(device, model_step_vs_cpu) {
  if (!ndevice()) fprintf(stderr, "  no backend without host memory is listed: nothing compared\n");
  for (size_t i = 0; i < ct_backend_count(); i++) {
    const ct_backend_ops *be = ct_backend_at(i), *ref = cpu_like(be);
    if (be->host_memory) continue;
    REQUIRE(ref);
    step_out a = {0}, b = {0};
    ct_err err = {0};
    ct_status st = model_step(be, big(be), &a, &err);
    CHECKF(st == CT_OK, "%s: %s", be->name, err.msg);
    st = model_step(ref, big(be), &b, &err);
    CHECKF(st == CT_OK, "%s: %s", ref->name, err.msg);
    if (a.v && b.v) {
      double ev = nmse(a.v, b.v, b.nv), eg = nmse(a.g, b.g, b.ng);
      fprintf(stderr, "  %s vs %s: velocity NMSE %.3g, gradient NMSE %.3g (tolerance %g)\n",
              be->name, ref->name, ev, eg, tol(be));
      CHECKF(ev <= tol(be) && eg <= tol(be), "%s: velocity %.3g, gradient %.3g", be->name, ev, eg);
    }
    step_out_free(&a);
    step_out_free(&b);
  }
}

CT_TEST(device, model_step_repeatable) {
  for (size_t i = 0; i < ct_backend_count(); i++) {
    const ct_backend_ops *be = ct_backend_at(i);
    if (be->host_memory) continue;
    step_out a = {0}, b = {0};
    ct_err err = {0};
    CHECKF(model_step(be, big(be), &a, &err) == CT_OK, "%s: %s", be->name, err.msg);
    CHECKF(model_step(be, big(be), &b, &err) == CT_OK, "%s: %s", be->name, err.msg);
    if (a.v && b.v)
      CHECKF(!memcmp(a.v, b.v, a.nv * 4) && !memcmp(a.g, b.g, a.ng * 4),
             "%s: two runs of the same step differ", be->name);
    step_out_free(&a);
    step_out_free(&b);
  }
}

/* ---------------------------------------------------------------- products at model shapes */

/* linear forward and backward (float32, bf16 and int8 weight views) and
 * attention forward and backward; every output back on the host in out[] */
enum { NOUT = 12 };
typedef struct ops_out {
  float *v[NOUT];
  size_t n[NOUT];
  const char *name[NOUT];
  int k;
} ops_out;

static void keep_out(dctx *d, ops_out *o, const char *name, const float *p, size_t n) {
  o->name[o->k] = name, o->n[o->k] = n, o->v[o->k++] = dout(d, p, n);
}

static void linear_ops(dctx *d, ops_out *o, int N, int K, int M) {
  const ct_backend_ops *be = d->be;
  float *xh = hnormal((size_t)N * K, 10, 1), *wh = hnormal((size_t)M * K, 11, 0.05f);
  float *bh = hnormal((size_t)M, 12, 0.1f), *dyh = hnormal((size_t)N * M, 13, 1);
  float *x = din(d, xh, (size_t)N * K * 4), *w = din(d, wh, (size_t)M * K * 4);
  float *b = din(d, bh, (size_t)M * 4), *dy = din(d, dyh, (size_t)N * M * 4);
  float *y = dzero(d, (size_t)N * M), *dx = dzero(d, (size_t)N * K);
  float *dw = dzero(d, (size_t)M * K), *db = dzero(d, (size_t)M);
  be->linear_fwd(N, K, M, x, K, w, b, y, M);
  keep_out(d, o, "linear y", y, (size_t)N * M);
  be->linear_bwd(N, K, M, x, K, w, dy, M, dx, K, 0.0f, dw, db);
  keep_out(d, o, "linear dx", dx, (size_t)N * K);
  keep_out(d, o, "linear dw", dw, (size_t)M * K);
  keep_out(d, o, "linear db", db, (size_t)M);
  /* the frozen weight as bf16 bits and as int8 rows (quanto) with scales */
  uint16_t *w16 = malloc((size_t)M * K * 2);
  int8_t *w8 = malloc((size_t)M * K);
  float *sc = malloc((size_t)M * 4);
  ct_to_bf16((size_t)M * K, wh, w16);
  ct_quantize_int8(CT_QUANT_QUANTO, M, K, wh, w8, sc);
  ct_wview v16 = {CT_WDT_BF16, din(d, w16, (size_t)M * K * 2), NULL};
  ct_wview v8 = {CT_WDT_I8, din(d, w8, (size_t)M * K), din(d, sc, (size_t)M * 4)};
  const ct_wview *views[2] = {&v16, &v8};
  const char *yn[2] = {"linear_w bf16 y", "linear_w int8 y"},
             *dn[2] = {"linear_w bf16 dx", "linear_w int8 dx"};
  for (int i = 0; i < 2; i++) {
    be->linear_fwd_w(N, K, M, x, K, views[i], b, y, M);
    keep_out(d, o, yn[i], y, (size_t)N * M);
    be->linear_bwd_w(N, K, M, x, K, views[i], dy, M, dx, K, 0.0f, NULL, NULL);
    keep_out(d, o, dn[i], dx, (size_t)N * K);
  }
  free(xh), free(wh), free(bh), free(dyh), free(w16), free(w8), free(sc);
}

static void attention_ops(dctx *d, ops_out *o, int B, int H, int L, int hd) {
  const ct_backend_ops *be = d->be;
  size_t n = (size_t)B * H * L * hd;
  float *qh = hnormal(n, 20, 1), *kh = hnormal(n, 21, 1), *vh = hnormal(n, 22, 1);
  float *doh = hnormal(n, 23, 1);
  float *q = din(d, qh, n * 4), *k = din(d, kh, n * 4), *v = din(d, vh, n * 4);
  float *dO = din(d, doh, n * 4), *out = dzero(d, n), *lse = dzero(d, (size_t)B * H * L);
  float *dq = dzero(d, n), *dk = dzero(d, n), *dv = dzero(d, n);
  float scale = 1.0f / sqrtf((float)hd);
  be->attention_fwd(B, H, L, hd, scale, 0, q, k, v, out, lse);
  keep_out(d, o, "attention o", out, n);
  keep_out(d, o, "attention lse", lse, (size_t)B * H * L);
  be->attention_bwd(B, H, L, hd, scale, 0, q, k, v, out, lse, dO, dq, dk, dv);
  keep_out(d, o, "attention dq", dq, n);
  keep_out(d, o, "attention dk", dk, n);
  free(qh), free(kh), free(vh), free(doh);
}

static void run_ops(const ct_backend_ops *be, int large, ops_out *o) {
  dctx d = {.be = be};
  memset(o, 0, sizeof *o);
  if (large) {
    linear_ops(&d, o, 625, 3072, 1536); /* tokens, FLUX's hidden in, a projection out */
    attention_ops(&d, o, 1, 4, 1201, 128);
  } else {
    linear_ops(&d, o, 37, 96, 80);
    attention_ops(&d, o, 2, 2, 77, 32);
  }
  drelease(&d);
}

CT_TEST(device, products_vs_cpu) {
  for (size_t i = 0; i < ct_backend_count(); i++) {
    const ct_backend_ops *be = ct_backend_at(i), *ref = cpu_like(be);
    if (be->host_memory) continue;
    const char *lacks = ct_backend_lacks(be,
                                         "linear_fwd linear_bwd linear_fwd_w linear_bwd_w "
                                         "attention_fwd attention_bwd");
    if (lacks) {
      fprintf(stderr, "  %s lacks %s: products not compared\n", be->name, lacks);
      CHECKF(0, "%s has no %s", be->name, lacks);
      continue;
    }
    ops_out a, b;
    run_ops(be, big(be), &a);
    run_ops(ref, big(be), &b);
    for (int j = 0; j < a.k; j++) {
      double e = nmse(a.v[j], b.v[j], a.n[j]);
      CHECKF(e <= tol(be), "%s vs %s: %s NMSE %.3g (tolerance %g)", be->name, ref->name, a.name[j],
             e, tol(be));
      free(a.v[j]);
      free(b.v[j]);
    }
  }
}

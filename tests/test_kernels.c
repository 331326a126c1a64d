/* Tests of the kernels module: forward results against naive double-precision
 * references, finite-difference gradient checks of every backward, the
 * accumulate-vs-overwrite contract, fast-math accuracy, and bitwise equality of
 * results computed with 1 and 2 threads. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/kernels.h"
#include "harness.h"
#include "kernels/fastmath.h"
#include "kernels/gemm.h"

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_s = 1;
static void rng_seed(uint64_t s) {
  rng_s = s * 0x9E3779B97F4A7C15ull + 0x1234567ull;
}
static float frand(void) { /* uniform in [-1, 1) */
  rng_s ^= rng_s << 13;
  rng_s ^= rng_s >> 7;
  rng_s ^= rng_s << 17;
  return (float)((double)(rng_s >> 40) / (double)(1ull << 23) - 1.0);
}
static float *randv(size_t n, float scale) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = scale * frand();
  return p;
}
static float *fillv(size_t n, float v) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = v;
  return p;
}
static float *dupv(const float *a, size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  memcpy(p, a, n * sizeof(float));
  return p;
}
static double *dzeros(size_t n) {
  return calloc(n ? n : 1, sizeof(double));
}

/* sum over a (rows, cols) block of a[i] * b[i] with leading dims, in double */
static double dot2(int rows, int cols, const float *a, int lda, const float *b, int ldb) {
  double s = 0;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) s += (double)a[(size_t)r * lda + c] * b[(size_t)r * ldb + c];
  return s;
}

/* max |a - ref| / max(max |ref|, floor) over a (rows, cols) block */
static double relerr2(int rows, int cols, const float *a, int lda, const double *ref, int ldr,
                      double floor_) {
  double md = 0, mr = 0;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      double x = a[(size_t)r * lda + c], y = ref[(size_t)r * ldr + c];
      md = ct_test_max(md, fabs(x - y));
      mr = ct_test_max(mr, fabs(y));
    }
  return md / ct_test_max(mr, floor_);
}

/* Finite differences: central differences of loss(ctx) with respect to
 * p[i] for every i (or nsample random i when n is larger), compared with the
 * analytic gradient ana[i]. Returns max|a - n| / max(max|n|, 1e-3). */
typedef double (*loss_fn)(void *ctx);
#define FD_EPS 1e-3f
#define GRAD_TOL 1e-2
static double fd_check(float *p, size_t n, const float *ana, loss_fn f, void *ctx, size_t nsample) {
  double maxn = 0, maxd = 0;
  size_t cnt = n <= nsample ? n : nsample;
  for (size_t s = 0; s < cnt; s++) {
    size_t i = n <= nsample ? s : (size_t)((frand() + 1.0f) * 0.5f * (float)n) % n;
    float v = p[i], vp = v + FD_EPS, vm = v - FD_EPS;
    p[i] = vp;
    double lp = f(ctx);
    p[i] = vm;
    double lm = f(ctx);
    p[i] = v;
    double num = (lp - lm) / ((double)vp - (double)vm);
    maxn = ct_test_max(maxn, fabs(num));
    maxd = ct_test_max(maxd, fabs(num - (double)ana[i]));
  }
  return maxd / ct_test_max(maxn, 1e-3);
}
#define CHECK_GRAD(name, p, n, ana, f, ctx, ns)                            \
  do {                                                                     \
    double e_ = fd_check((p), (n), (ana), (f), (ctx), (ns));               \
    CHECKF(e_ < GRAD_TOL, "%s: relative gradient error %.3g", (name), e_); \
  } while (0)

static int saved_threads;
static void threads(int n) {
  if (!saved_threads) saved_threads = omp_get_max_threads();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}
static void threads_restore(void) {
  if (saved_threads) threads(saved_threads);
}
#define SAME(a, b, n) (memcmp((a), (b), (n) * sizeof(float)) == 0)

/* ---------------------------------------------------------------- fast math */

CT_TEST(kernels, fastmath_accuracy) {
  double emax = 0;
  for (double x = -87.0; x <= 88.0; x += 0.000731) {
    double ref = exp((double)(float)x);
    emax = ct_test_max(emax, fabs((double)ct_expf((float)x) - ref) / ref);
  }
  CHECKF(emax < 1e-6, "exp max rel err %.3g", emax);
  double tmax = 0, smax = 0;
  for (double u = -20.0; u <= 20.0; u += 0.0001) {
    float uf = (float)u;
    tmax = ct_test_max(tmax, fabs((double)ct_tanhf(uf) - tanh((double)uf)));
    smax = ct_test_max(smax, fabs((double)ct_sigmoidf(uf) - 1.0 / (1.0 + exp(-(double)uf))));
  }
  CHECKF(tmax < 1e-6, "tanh max abs err %.3g", tmax);
  CHECKF(smax < 1e-6, "sigmoid max abs err %.3g", smax);
  /* limits: no inf, no NaN, exact saturation */
  CHECK(ct_expf(-INFINITY) == 0.0f);
  CHECK(ct_expf(-1000.0f) == 0.0f);
  CHECK(isfinite(ct_expf(1000.0f)) && ct_expf(1000.0f) > 1e38f);
  CHECK(ct_expf(0.0f) == 1.0f);
  CHECK(ct_tanhf(100.0f) == 1.0f && ct_tanhf(-100.0f) == -1.0f);
  CHECK(ct_sigmoidf(-200.0f) >= 0.0f && ct_sigmoidf(-200.0f) < 1e-30f);
  CHECK(ct_sigmoidf(200.0f) == 1.0f);
}

/* ---------------------------------------------------------------- linear */

typedef struct {
  int N, K, M, ldx, ldy;
  float *x, *w, *b, *y, *R;
} lin_ctx;
static double lin_loss(void *c_) {
  lin_ctx *c = c_;
  ct_linear_fwd(c->N, c->K, c->M, c->x, c->ldx, c->w, c->b, c->y, c->ldy);
  return dot2(c->N, c->M, c->y, c->ldy, c->R, c->ldy);
}

CT_TEST(kernels, linear_fwd_ref) {
  rng_seed(1);
  int N = 9, K = 13, M = 11, ldx = 16, ldy = 14;
  float *x = randv((size_t)N * ldx, 1), *w = randv((size_t)M * K, 1), *b = randv(M, 1);
  float *y = fillv((size_t)N * ldy, 7.0f);
  for (int pass = 0; pass < 2; pass++) {
    const float *bb = pass ? NULL : b;
    ct_linear_fwd(N, K, M, x, ldx, w, bb, y, ldy);
    double md = 0;
    for (int r = 0; r < N; r++)
      for (int m = 0; m < M; m++) {
        double s = bb ? bb[m] : 0;
        for (int k = 0; k < K; k++) s += (double)x[r * ldx + k] * w[m * K + k];
        md = ct_test_max(md, fabs(s - y[r * ldy + m]));
      }
    CHECKF(md < 1e-5, "bias %d: max err %.3g", !pass, md);
    for (int r = 0; r < N; r++) /* padding untouched */
      for (int m = M; m < ldy; m++) CHECK(y[r * ldy + m] == 7.0f);
  }
  free(x), free(w), free(b), free(y);
}

CT_TEST(kernels, linear_grad) {
  rng_seed(2);
  lin_ctx c = {.N = 7, .K = 13, .M = 11, .ldx = 15, .ldy = 12};
  c.x = randv((size_t)c.N * c.ldx, 1);
  c.w = randv((size_t)c.M * c.K, 0.5f);
  c.b = randv(c.M, 0.5f);
  c.y = fillv((size_t)c.N * c.ldy, 0);
  c.R = randv((size_t)c.N * c.ldy, 1);
  float *dx = fillv((size_t)c.N * c.ldx, 0), *dw = fillv((size_t)c.M * c.K, 0), *db = fillv(c.M, 0);
  ct_linear_bwd(c.N, c.K, c.M, c.x, c.ldx, c.w, c.R, c.ldy, dx, c.ldx, 0.0f, dw, db);
  CHECK_GRAD("linear dx", c.x, (size_t)c.N * c.ldx, dx, lin_loss, &c, 100000);
  CHECK_GRAD("linear dw", c.w, (size_t)c.M * c.K, dw, lin_loss, &c, 100000);
  CHECK_GRAD("linear db", c.b, (size_t)c.M, db, lin_loss, &c, 100000);

  /* accumulate: dw, db += ; dx = beta*dx + ...; beta 0 ignores garbage (NaN) */
  float *dx2 = fillv((size_t)c.N * c.ldx, 1.0f), *dw2 = fillv((size_t)c.M * c.K, 1.0f),
        *db2 = fillv(c.M, 1.0f);
  ct_linear_bwd(c.N, c.K, c.M, c.x, c.ldx, c.w, c.R, c.ldy, dx2, c.ldx, 1.0f, dw2, db2);
  double md = 0;
  for (int r = 0; r < c.N; r++)
    for (int k = 0; k < c.K; k++)
      md = ct_test_max(md, fabs(dx2[r * c.ldx + k] - 1.0f - dx[r * c.ldx + k]));
  for (int i = 0; i < c.M * c.K; i++) md = ct_test_max(md, fabs(dw2[i] - 1.0f - dw[i]));
  for (int i = 0; i < c.M; i++) md = ct_test_max(md, fabs(db2[i] - 1.0f - db[i]));
  CHECKF(md < 1e-5, "accumulation off by %.3g", md);
  float *dx3 = fillv((size_t)c.N * c.ldx, NAN);
  ct_linear_bwd(c.N, c.K, c.M, c.x, c.ldx, c.w, c.R, c.ldy, dx3, c.ldx, 0.0f, NULL, NULL);
  int ok = 1;
  for (int r = 0; r < c.N; r++)
    for (int k = 0; k < c.K; k++) ok &= fabsf(dx3[r * c.ldx + k] - dx[r * c.ldx + k]) < 1e-5f;
  CHECKF(ok, "beta_dx = 0 must overwrite (garbage in dx)");
  free(c.x), free(c.w), free(c.b), free(c.y), free(c.R);
  free(dx), free(dw), free(db), free(dx2), free(dw2), free(db2), free(dx3);
}

CT_TEST(kernels, linear_threads) {
  rng_seed(3);
  int N = 300, K = 96, M = 200;
  float *x = randv((size_t)N * K, 1), *w = randv((size_t)M * K, 1), *dy = randv((size_t)N * M, 1);
  float *dx[3], *dw[3], *db[3];
  int nt[3] = {1, 2, 2};
  for (int t = 0; t < 3; t++) {
    threads(nt[t]);
    dx[t] = fillv((size_t)N * K, 0), dw[t] = fillv((size_t)M * K, 0.5f), db[t] = fillv(M, 0.5f);
    ct_linear_bwd(N, K, M, x, K, w, dy, M, dx[t], K, 0.0f, dw[t], db[t]);
  }
  threads_restore();
  CHECK(SAME(dx[1], dx[2], (size_t)N * K));
  CHECK(SAME(dw[1], dw[2], (size_t)M * K));
  CHECK(SAME(db[0], db[1], (size_t)M)); /* ours: independent of the thread count */
  CHECK(SAME(db[1], db[2], (size_t)M));
  int dx_same = SAME(dx[0], dx[1], (size_t)N * K), dw_same = SAME(dw[0], dw[1], (size_t)M * K);
  if (!strcmp(ct_sgemm_path(), "avx512")) { /* our SGEMM: independent of the thread count */
    CHECK(dx_same);
    CHECK(dw_same);
  } else { /* OpenBLAS is only required to be deterministic for a fixed thread count */
    fprintf(stderr, "  note: OpenBLAS 1 vs 2 threads bitwise equal: dx %s, dw %s\n",
            dx_same ? "yes" : "no", dw_same ? "yes" : "no");
  }
  for (int t = 0; t < 3; t++) free(dx[t]), free(dw[t]), free(db[t]);
  free(x), free(w), free(dy);
}

/* ---------------------------------------------------------------- LayerNorm + modulation */

typedef struct {
  int B, L, D, ldx, ldm, ldh;
  float *x, *mod, *xhat, *rstd, *h, *R;
} ln_ctx;
static double ln_loss(void *c_) {
  ln_ctx *c = c_;
  ct_ln_mod_fwd(c->B, c->L, c->D, c->x, c->ldx, c->mod, c->mod + c->D, c->ldm, 1e-6f, c->xhat,
                c->rstd, c->h, c->ldh);
  return dot2(c->B * c->L, c->D, c->h, c->ldh, c->R, c->ldh);
}
static ln_ctx ln_make(int B, int L, int D) {
  ln_ctx c = {.B = B, .L = L, .D = D, .ldx = D + 3, .ldm = 3 * D, .ldh = D + 1};
  int N = B * L;
  c.x = randv((size_t)N * c.ldx, 1);
  for (int r = 0; r < N; r++) /* rows with an offset and differing spread */
    for (int j = 0; j < D; j++) c.x[r * c.ldx + j] = c.x[r * c.ldx + j] * (1 + r % 3) + 0.3f * r;
  c.mod = randv((size_t)B * c.ldm, 0.5f);
  c.xhat = fillv((size_t)N * D, 0);
  c.rstd = fillv(N, 0);
  c.h = fillv((size_t)N * c.ldh, 0);
  c.R = randv((size_t)N * c.ldh, 1);
  return c;
}
static void ln_free(ln_ctx *c) {
  free(c->x), free(c->mod), free(c->xhat), free(c->rstd), free(c->h), free(c->R);
}

CT_TEST(kernels, ln_mod_fwd_ref) {
  rng_seed(4);
  ln_ctx c = ln_make(3, 4, 37);
  ln_loss(&c);
  int N = c.B * c.L, D = c.D;
  double *href = dzeros((size_t)N * D), *xref = dzeros((size_t)N * D);
  double rerr = 0;
  for (int r = 0; r < N; r++) {
    const float *xr = c.x + r * c.ldx;
    double m = 0, v = 0;
    for (int j = 0; j < D; j++) m += xr[j];
    m /= D;
    for (int j = 0; j < D; j++) v += (xr[j] - m) * (xr[j] - m);
    v /= D; /* biased */
    double rs = 1 / sqrt(v + 1e-6);
    rerr = ct_test_max(rerr, fabs(c.rstd[r] - rs) / rs);
    const float *sh = c.mod + (r / c.L) * c.ldm, *sc = sh + D;
    for (int j = 0; j < D; j++) {
      xref[r * D + j] = (xr[j] - m) * rs;
      href[r * D + j] = (1 + sc[j]) * xref[r * D + j] + sh[j];
    }
  }
  CHECKF(rerr < 1e-5, "rstd rel err %.3g", rerr);
  CHECKF(relerr2(N, D, c.xhat, D, xref, D, 1) < 1e-5, "xhat");
  CHECKF(relerr2(N, D, c.h, c.ldh, href, D, 1) < 1e-5, "h");
  /* shift/scale NULL => h = xhat */
  ct_ln_mod_fwd(c.B, c.L, D, c.x, c.ldx, NULL, NULL, 0, 1e-6f, c.xhat, c.rstd, c.h, c.ldh);
  CHECKF(relerr2(N, D, c.h, c.ldh, xref, D, 1) < 1e-5, "h without modulation");
  free(href), free(xref);
  ln_free(&c);
}

CT_TEST(kernels, ln_mod_grad) {
  rng_seed(5);
  ln_ctx c = ln_make(2, 3, 24);
  int N = c.B * c.L;
  ln_loss(&c);
  float *dx = fillv((size_t)N * c.ldx, 0), *dmod = fillv((size_t)c.B * c.ldm, 0);
  ct_ln_mod_bwd(c.B, c.L, c.D, c.xhat, c.rstd, c.mod + c.D, c.ldm, c.R, c.ldh, dx, c.ldx, dmod,
                dmod + c.D);
  CHECK_GRAD("ln_mod dx", c.x, (size_t)N * c.ldx, dx, ln_loss, &c, 100000);
  CHECK_GRAD("ln_mod dshift/dscale", c.mod, (size_t)c.B * c.ldm, dmod, ln_loss, &c, 100000);
  /* accumulation into prefilled buffers */
  ln_loss(&c);
  float *dx1 = fillv((size_t)N * c.ldx, 1), *dm1 = fillv((size_t)c.B * c.ldm, 1);
  ct_ln_mod_bwd(c.B, c.L, c.D, c.xhat, c.rstd, c.mod + c.D, c.ldm, c.R, c.ldh, dx1, c.ldx, dm1,
                dm1 + c.D);
  double md = 0;
  for (int r = 0; r < N; r++)
    for (int j = 0; j < c.D; j++)
      md = ct_test_max(md, fabs(dx1[r * c.ldx + j] - 1 - dx[r * c.ldx + j]));
  for (int b = 0; b < c.B; b++)
    for (int j = 0; j < 2 * c.D; j++)
      md = ct_test_max(md, fabs(dm1[b * c.ldm + j] - 1 - dmod[b * c.ldm + j]));
  for (int b = 0; b < c.B; b++) /* the gate third of the modulation is not touched */
    for (int j = 2 * c.D; j < 3 * c.D; j++) CHECK(dm1[b * c.ldm + j] == 1.0f);
  CHECKF(md < 1e-5, "accumulation off by %.3g", md);
  free(dx), free(dmod), free(dx1), free(dm1);
  ln_free(&c);
}

CT_TEST(kernels, ln_mod_threads) {
  rng_seed(6);
  ln_ctx c = ln_make(4, 40, 200);
  int N = c.B * c.L;
  float *h[2], *dx[2], *dm[2];
  for (int t = 0; t < 2; t++) {
    threads(t + 1);
    ln_loss(&c);
    h[t] = dupv(c.h, (size_t)N * c.ldh);
    dx[t] = fillv((size_t)N * c.ldx, 0.25f), dm[t] = fillv((size_t)c.B * c.ldm, 0.25f);
    ct_ln_mod_bwd(c.B, c.L, c.D, c.xhat, c.rstd, c.mod + c.D, c.ldm, c.R, c.ldh, dx[t], c.ldx,
                  dm[t], dm[t] + c.D);
  }
  threads_restore();
  CHECK(SAME(h[0], h[1], (size_t)N * c.ldh));
  CHECK(SAME(dx[0], dx[1], (size_t)N * c.ldx));
  CHECK(SAME(dm[0], dm[1], (size_t)c.B * c.ldm));
  for (int t = 0; t < 2; t++) free(h[t]), free(dx[t]), free(dm[t]);
  ln_free(&c);
}

CT_TEST(kernels, layernorm_affine_ref) {
  rng_seed(7);
  int N = 5, D = 19, ldx = 21, ldy = 20;
  float *x = randv((size_t)N * ldx, 2), *g = randv(D, 1), *be = randv(D, 1);
  float *y = fillv((size_t)N * ldy, 0);
  double *ref = dzeros((size_t)N * D);
  ct_layernorm_affine_fwd(N, D, x, ldx, g, be, 1e-5f, y, ldy);
  for (int r = 0; r < N; r++) {
    double m = 0, v = 0;
    for (int j = 0; j < D; j++) m += x[r * ldx + j];
    m /= D;
    for (int j = 0; j < D; j++) v += (x[r * ldx + j] - m) * (x[r * ldx + j] - m);
    double rs = 1 / sqrt(v / D + 1e-5);
    for (int j = 0; j < D; j++) ref[r * D + j] = (x[r * ldx + j] - m) * rs * g[j] + be[j];
  }
  CHECKF(relerr2(N, D, y, ldy, ref, D, 1) < 1e-5, "layernorm_affine");
  free(x), free(g), free(be), free(y), free(ref);
}

/* ---------------------------------------------------------------- RMSNorm */

typedef struct {
  int N, D, ldx, ldy;
  float *x, *scale, *y, *rstd, *R;
} rms_ctx;
static double rms_loss(void *c_) {
  rms_ctx *c = c_;
  ct_rmsnorm_fwd(c->N, c->D, c->x, c->ldx, c->scale, 1e-6f, c->y, c->ldy, c->rstd);
  return dot2(c->N, c->D, c->y, c->ldy, c->R, c->ldy);
}
static rms_ctx rms_make(int N, int D) {
  rms_ctx c = {.N = N, .D = D, .ldx = D + 2, .ldy = D + 1};
  c.x = randv((size_t)N * c.ldx, 1);
  c.scale = randv(D, 1);
  for (int j = 0; j < D; j++) c.scale[j] += 1.0f;
  c.y = fillv((size_t)N * c.ldy, 0);
  c.rstd = fillv(N, 0);
  c.R = randv((size_t)N * c.ldy, 1);
  return c;
}
static void rms_free(rms_ctx *c) {
  free(c->x), free(c->scale), free(c->y), free(c->rstd), free(c->R);
}

CT_TEST(kernels, rmsnorm) {
  rng_seed(8);
  rms_ctx c = rms_make(6, 16);
  rms_loss(&c);
  double *ref = dzeros((size_t)c.N * c.D);
  for (int r = 0; r < c.N; r++) {
    double ss = 0;
    for (int j = 0; j < c.D; j++) ss += (double)c.x[r * c.ldx + j] * c.x[r * c.ldx + j];
    double rs = 1 / sqrt(ss / c.D + 1e-6);
    for (int j = 0; j < c.D; j++) ref[r * c.D + j] = c.x[r * c.ldx + j] * rs * c.scale[j];
  }
  CHECKF(relerr2(c.N, c.D, c.y, c.ldy, ref, c.D, 1) < 1e-5, "rmsnorm forward");
  float *dx = fillv((size_t)c.N * c.ldx, 0), *ds = fillv(c.D, 0);
  ct_rmsnorm_bwd(c.N, c.D, c.x, c.ldx, c.scale, c.rstd, c.R, c.ldy, dx, c.ldx, ds);
  CHECK_GRAD("rmsnorm dx", c.x, (size_t)c.N * c.ldx, dx, rms_loss, &c, 100000);
  CHECK_GRAD("rmsnorm dscale", c.scale, (size_t)c.D, ds, rms_loss, &c, 100000);
  rms_loss(&c);
  float *dx1 = fillv((size_t)c.N * c.ldx, 1), *ds1 = fillv(c.D, 1);
  ct_rmsnorm_bwd(c.N, c.D, c.x, c.ldx, c.scale, c.rstd, c.R, c.ldy, dx1, c.ldx, ds1);
  double md = 0;
  for (int i = 0; i < c.N * c.ldx; i++) md = ct_test_max(md, fabs(dx1[i] - 1 - dx[i]));
  for (int i = 0; i < c.D; i++) md = ct_test_max(md, fabs(ds1[i] - 1 - ds[i]));
  CHECKF(md < 1e-5, "accumulation off by %.3g", md);
  free(ref), free(dx), free(ds), free(dx1), free(ds1);
  rms_free(&c);
}

CT_TEST(kernels, rmsnorm_threads) {
  rng_seed(9);
  rms_ctx c = rms_make(700, 64);
  float *dx[2], *ds[2];
  for (int t = 0; t < 2; t++) {
    threads(t + 1);
    rms_loss(&c);
    dx[t] = fillv((size_t)c.N * c.ldx, 0), ds[t] = fillv(c.D, 0.5f);
    ct_rmsnorm_bwd(c.N, c.D, c.x, c.ldx, c.scale, c.rstd, c.R, c.ldy, dx[t], c.ldx, ds[t]);
  }
  threads_restore();
  CHECK(SAME(dx[0], dx[1], (size_t)c.N * c.ldx));
  CHECK(SAME(ds[0], ds[1], (size_t)c.D));
  for (int t = 0; t < 2; t++) free(dx[t]), free(ds[t]);
  rms_free(&c);
}

/* ---------------------------------------------------------------- RoPE */

CT_TEST(kernels, rope_table) {
  int pos[9] = {0, 0, 0, 0, 3, 5, 2, 1, 7}, axes[3] = {4, 6, 6};
  float pe[3 * 8 * 2];
  ct_rope_table(3, pos, axes, 10000.0f, pe);
  /* hand-checked angles: position 1, axis 1 pair 0 is 3 rad, axis 2 pair 0 is 5 rad,
   * axis 1 pair 1 is 3 * 10000^(-1/3) = 0.1392476650 rad */
  const float *p1 = pe + 16;
  CHECK_NEAR(p1[0], 1.0, 0);
  CHECK_NEAR(p1[1], 0.0, 0); /* axis 0: position 0 */
  CHECK_NEAR(p1[2 * 2], -0.9899924966, 1e-7);
  CHECK_NEAR(p1[2 * 2 + 1], 0.1411200081, 1e-7);
  CHECK_NEAR(p1[2 * 5], 0.2836621855, 1e-7);
  CHECK_NEAR(p1[2 * 5 + 1], -0.9589242747, 1e-7);
  CHECK_NEAR(p1[2 * 3], cos(0.1392476650), 1e-7);
  CHECK_NEAR(p1[2 * 3 + 1], sin(0.1392476650), 1e-7);
  double md = 0;
  for (int l = 0; l < 3; l++) {
    int pidx = 0;
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < axes[i] / 2; j++, pidx++) {
        double a = pos[l * 3 + i] * exp(-(2.0 * j / axes[i]) * log(10000.0));
        md = ct_test_max(md, fabs(pe[(l * 8 + pidx) * 2] - cos(a)));
        md = ct_test_max(md, fabs(pe[(l * 8 + pidx) * 2 + 1] - sin(a)));
      }
  }
  CHECKF(md < 1e-7, "table max err %.3g", md);
}

typedef struct {
  int N, L, D, ldx, ldy;
  float *pe, *x, *y, *R;
} rope_ctx;
static double rope_loss(void *c_) {
  rope_ctx *c = c_;
  ct_rope_fwd(c->N, c->L, c->D, c->pe, c->x, c->ldx, c->y, c->ldy);
  return dot2(c->N, c->D, c->y, c->ldy, c->R, c->ldy);
}

CT_TEST(kernels, rope) {
  rng_seed(10);
  rope_ctx c = {.N = 10, .L = 5, .D = 16, .ldx = 18, .ldy = 17};
  int pos[15], axes[3] = {4, 6, 6};
  for (int i = 0; i < 15; i++) pos[i] = (i * 7) % 11;
  c.pe = fillv((size_t)c.L * c.D, 0);
  ct_rope_table(c.L, pos, axes, 10000.0f, c.pe);
  c.x = randv((size_t)c.N * c.ldx, 1);
  c.y = fillv((size_t)c.N * c.ldy, 0);
  c.R = randv((size_t)c.N * c.ldy, 1);
  rope_loss(&c);
  double md = 0;
  for (int r = 0; r < c.N; r++)
    for (int j = 0; j < c.D / 2; j++) {
      const float *pe = c.pe + (r % c.L) * c.D + 2 * j;
      double x0 = c.x[r * c.ldx + 2 * j], x1 = c.x[r * c.ldx + 2 * j + 1];
      md = ct_test_max(md, fabs(c.y[r * c.ldy + 2 * j] - (pe[0] * x0 - pe[1] * x1)));
      md = ct_test_max(md, fabs(c.y[r * c.ldy + 2 * j + 1] - (pe[1] * x0 + pe[0] * x1)));
    }
  CHECKF(md < 1e-6, "rope forward err %.3g", md);
  float *dx = fillv((size_t)c.N * c.ldx, 0);
  ct_rope_bwd(c.N, c.L, c.D, c.pe, c.R, c.ldy, dx, c.ldx);
  CHECK_GRAD("rope dx", c.x, (size_t)c.N * c.ldx, dx, rope_loss, &c, 100000);
  /* overwrite, and in place gives the same result */
  float *dx2 = fillv((size_t)c.N * c.ldx, NAN);
  ct_rope_bwd(c.N, c.L, c.D, c.pe, c.R, c.ldy, dx2, c.ldx);
  int ok = 1;
  for (int r = 0; r < c.N; r++)
    for (int j = 0; j < c.D; j++) ok &= dx2[r * c.ldx + j] == dx[r * c.ldx + j];
  CHECKF(ok, "rope_bwd must overwrite");
  float *xi = dupv(c.x, (size_t)c.N * c.ldx);
  ct_rope_fwd(c.N, c.L, c.D, c.pe, xi, c.ldx, xi, c.ldx);
  ok = 1;
  for (int r = 0; r < c.N; r++)
    for (int j = 0; j < c.D; j++) ok &= xi[r * c.ldx + j] == c.y[r * c.ldy + j];
  CHECKF(ok, "in-place rope_fwd differs");
  free(c.pe), free(c.x), free(c.y), free(c.R), free(dx), free(dx2), free(xi);
}

/* ---------------------------------------------------------------- QKV heads */

typedef struct {
  int B, Ls, Lt, off, H, hd;
  float *qkv, *qs, *ks, *pe, *q, *k, *v, *rq, *rk, *Rq, *Rk, *Rv;
} qkv_ctx;
static double qkv_loss(void *c_) {
  qkv_ctx *c = c_;
  ct_qkv_heads_fwd(c->B, c->Ls, c->Lt, c->off, c->H, c->hd, c->qkv, c->qs, c->ks, c->pe, c->q, c->k,
                   c->v, c->rq, c->rk);
  int n = c->B * c->H * c->Lt;
  return dot2(n, c->hd, c->q, c->hd, c->Rq, c->hd) + dot2(n, c->hd, c->k, c->hd, c->Rk, c->hd) +
         dot2(n, c->hd, c->v, c->hd, c->Rv, c->hd);
}
static qkv_ctx qkv_make(int B, int Ls, int Lt, int off, int H, int hd, const int axes[3]) {
  qkv_ctx c = {.B = B, .Ls = Ls, .Lt = Lt, .off = off, .H = H, .hd = hd};
  size_t nh = (size_t)B * H * Lt * hd;
  c.qkv = randv((size_t)B * Ls * 3 * H * hd, 1);
  c.qs = randv(hd, 0.3f), c.ks = randv(hd, 0.3f);
  for (int j = 0; j < hd; j++) c.qs[j] += 1, c.ks[j] += 1;
  int *pos = malloc(sizeof(int) * 3 * Lt);
  for (int i = 0; i < 3 * Lt; i++) pos[i] = (i * 5) % 9;
  c.pe = fillv((size_t)Lt * hd, 0);
  ct_rope_table(Lt, pos, axes, 10000.0f, c.pe);
  free(pos);
  c.q = fillv(nh, 0), c.k = fillv(nh, 0), c.v = fillv(nh, 0);
  c.rq = fillv((size_t)B * Ls * H, 0), c.rk = fillv((size_t)B * Ls * H, 0);
  c.Rq = randv(nh, 1), c.Rk = randv(nh, 1), c.Rv = randv(nh, 1);
  return c;
}
static void qkv_free(qkv_ctx *c) {
  free(c->qkv), free(c->qs), free(c->ks), free(c->pe), free(c->q), free(c->k), free(c->v);
  free(c->rq), free(c->rk), free(c->Rq), free(c->Rk), free(c->Rv);
}

CT_TEST(kernels, qkv_heads) {
  rng_seed(11);
  int axes[3] = {4, 6, 6};
  qkv_ctx c = qkv_make(2, 3, 7, 2, 2, 16, axes);
  int hd = c.hd, H = c.H, D3 = 3 * H * hd;
  qkv_loss(&c);
  /* forward against a naive reference */
  double md = 0;
  for (int b = 0; b < c.B; b++)
    for (int l = 0; l < c.Ls; l++)
      for (int h = 0; h < H; h++)
        for (int w = 0; w < 3; w++) {
          const float *x = c.qkv + (size_t)(b * c.Ls + l) * D3 + (w * H + h) * hd;
          const float *sc = w == 0 ? c.qs : c.ks;
          const float *out = (w == 0   ? c.q
                              : w == 1 ? c.k
                                       : c.v) +
                             (((size_t)b * H + h) * c.Lt + c.off + l) * hd;
          const float *pe = c.pe + (size_t)(c.off + l) * hd;
          double ss = 0;
          for (int j = 0; j < hd; j++) ss += (double)x[j] * x[j];
          double rs = 1 / sqrt(ss / hd + 1e-6);
          for (int j = 0; j < hd / 2; j++) {
            double y0, y1;
            if (w == 2) {
              y0 = x[2 * j], y1 = x[2 * j + 1];
            } else {
              double n0 = x[2 * j] * rs * sc[2 * j], n1 = x[2 * j + 1] * rs * sc[2 * j + 1];
              y0 = pe[2 * j] * n0 - pe[2 * j + 1] * n1;
              y1 = pe[2 * j + 1] * n0 + pe[2 * j] * n1;
            }
            md = ct_test_max(ct_test_max(md, fabs(out[2 * j] - y0)), fabs(out[2 * j + 1] - y1));
          }
          if (w == 0) CHECK_NEAR(c.rq[(b * c.Ls + l) * H + h], rs, 1e-5 * rs);
        }
  CHECKF(md < 2e-6, "qkv_heads forward err %.3g", md);
  /* positions outside [off, off+Ls) are not written */
  CHECK(c.q[0] == 0.0f && c.v[((size_t)c.B * H * c.Lt - 1) * hd] == 0.0f);

  size_t nq = (size_t)c.B * c.Ls * D3;
  float *dqkv = fillv(nq, NAN), *dqs = fillv(hd, 0), *dks = fillv(hd, 0);
  ct_qkv_heads_bwd(c.B, c.Ls, c.Lt, c.off, H, hd, c.qkv, c.qs, c.ks, c.pe, c.rq, c.rk, c.Rq, c.Rk,
                   c.Rv, dqkv, dqs, dks);
  CHECK_GRAD("qkv_heads dqkv", c.qkv, nq, dqkv, qkv_loss, &c, 100000);
  CHECK_GRAD("qkv_heads dqscale", c.qs, (size_t)hd, dqs, qkv_loss, &c, 100000);
  CHECK_GRAD("qkv_heads dkscale", c.ks, (size_t)hd, dks, qkv_loss, &c, 100000);
  qkv_loss(&c);
  float *dqs1 = fillv(hd, 1), *dks1 = fillv(hd, 1);
  ct_qkv_heads_bwd(c.B, c.Ls, c.Lt, c.off, H, hd, c.qkv, c.qs, c.ks, c.pe, c.rq, c.rk, c.Rq, c.Rk,
                   c.Rv, dqkv, dqs1, dks1);
  md = 0;
  for (int j = 0; j < hd; j++)
    md = ct_test_max(ct_test_max(md, fabs(dqs1[j] - 1 - dqs[j])), fabs(dks1[j] - 1 - dks[j]));
  CHECKF(md < 1e-5, "scale-gradient accumulation off by %.3g", md);
  free(dqkv), free(dqs), free(dks), free(dqs1), free(dks1);
  qkv_free(&c);
}

CT_TEST(kernels, qkv_heads_threads) {
  rng_seed(12);
  int axes[3] = {8, 12, 12};
  qkv_ctx c = qkv_make(4, 40, 50, 10, 3, 32, axes);
  size_t nh = (size_t)c.B * c.H * c.Lt * c.hd, nq = (size_t)c.B * c.Ls * 3 * c.H * c.hd;
  float *q[2], *dqkv[2], *ds[2];
  for (int t = 0; t < 2; t++) {
    threads(t + 1);
    qkv_loss(&c);
    q[t] = dupv(c.q, nh);
    dqkv[t] = fillv(nq, 0), ds[t] = fillv(2 * c.hd, 0.5f);
    ct_qkv_heads_bwd(c.B, c.Ls, c.Lt, c.off, c.H, c.hd, c.qkv, c.qs, c.ks, c.pe, c.rq, c.rk, c.Rq,
                     c.Rk, c.Rv, dqkv[t], ds[t], ds[t] + c.hd);
  }
  threads_restore();
  CHECK(SAME(q[0], q[1], nh));
  CHECK(SAME(dqkv[0], dqkv[1], nq));
  CHECK(SAME(ds[0], ds[1], (size_t)2 * c.hd));
  for (int t = 0; t < 2; t++) free(q[t]), free(dqkv[t]), free(ds[t]);
  qkv_free(&c);
}

/* ---------------------------------------------------------------- attention */

typedef struct {
  int B, H, L, hd, causal;
  float scale;
  float *q, *k, *v, *o, *lse, *R;
} att_ctx;
static double att_loss(void *c_) {
  att_ctx *c = c_;
  ct_attention_fwd(c->B, c->H, c->L, c->hd, c->scale, c->causal, c->q, c->k, c->v, c->o, c->lse);
  int w = c->H * c->hd;
  return dot2(c->B * c->L, w, c->o, w, c->R, w);
}
static att_ctx att_make(int B, int H, int L, int hd, int causal) {
  att_ctx c = {.B = B, .H = H, .L = L, .hd = hd, .causal = causal};
  c.scale = 1.0f / sqrtf((float)hd);
  size_t n = (size_t)B * H * L * hd;
  c.q = randv(n, 1.5f), c.k = randv(n, 1.5f), c.v = randv(n, 1);
  c.o = fillv(n, 0), c.lse = fillv((size_t)B * H * L, 0), c.R = randv(n, 1);
  return c;
}
static void att_free(att_ctx *c) {
  free(c->q), free(c->k), free(c->v), free(c->o), free(c->lse), free(c->R);
}

/* naive reference: o (B, L, H*hd), lse (B, H, L) in double */
static void att_ref(const att_ctx *c, double *o, double *lse) {
  int L = c->L, hd = c->hd, H = c->H;
  double *p = dzeros(L);
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < H; h++) {
      size_t ho = ((size_t)b * H + h) * L * hd;
      for (int i = 0; i < L; i++) {
        int n = c->causal ? i + 1 : L;
        double m = -INFINITY;
        for (int j = 0; j < n; j++) {
          double s = 0;
          for (int e = 0; e < hd; e++) s += (double)c->q[ho + i * hd + e] * c->k[ho + j * hd + e];
          p[j] = s * c->scale;
          m = fmax(m, p[j]);
        }
        double sum = 0;
        for (int j = 0; j < n; j++) sum += (p[j] = exp(p[j] - m));
        lse[((size_t)b * H + h) * L + i] = m + log(sum);
        for (int e = 0; e < hd; e++) {
          double a = 0;
          for (int j = 0; j < n; j++) a += p[j] / sum * c->v[ho + j * hd + e];
          o[((size_t)b * L + i) * H * hd + h * hd + e] = a;
        }
      }
    }
  free(p);
}

static void att_case(int *ct_failed_, int B, int H, int L, int hd, int causal, size_t nsample) {
  att_ctx c = att_make(B, H, L, hd, causal);
  size_t n = (size_t)B * H * L * hd;
  double *o = dzeros(n), *lse = dzeros((size_t)B * H * L);
  att_loss(&c);
  att_ref(&c, o, lse);
  double eo = relerr2(B * L, H * hd, c.o, H * hd, o, H * hd, 1);
  double el = relerr2(B * H, L, c.lse, L, lse, L, 1);
  CHECKF(eo < 2e-6 && el < 2e-6, "L=%d causal=%d: forward err o %.3g lse %.3g", L, causal, eo, el);
  float *dq = fillv(n, NAN), *dk = fillv(n, NAN), *dv = fillv(n, NAN); /* overwritten */
  ct_attention_bwd(B, H, L, hd, c.scale, causal, c.q, c.k, c.v, c.o, c.lse, c.R, dq, dk, dv);
  char nm[64];
  snprintf(nm, sizeof nm, "attention L=%d causal=%d dq", L, causal);
  CHECK_GRAD(nm, c.q, n, dq, att_loss, &c, nsample);
  snprintf(nm, sizeof nm, "attention L=%d causal=%d dk", L, causal);
  CHECK_GRAD(nm, c.k, n, dk, att_loss, &c, nsample);
  snprintf(nm, sizeof nm, "attention L=%d causal=%d dv", L, causal);
  CHECK_GRAD(nm, c.v, n, dv, att_loss, &c, nsample);
  free(o), free(lse), free(dq), free(dk), free(dv);
  att_free(&c);
}

CT_TEST(kernels, attention_small) {
  rng_seed(13);
  att_case(ct_failed_, 2, 2, 37, 16, 0, 100000);
  att_case(ct_failed_, 2, 2, 37, 16, 1, 100000);
}

CT_TEST(kernels, attention_multi_tile) {
  /* L larger than the query tile (64): three tiles, the last one partial */
  rng_seed(14);
  att_case(ct_failed_, 1, 2, 150, 8, 0, 300);
  att_case(ct_failed_, 1, 2, 150, 8, 1, 300);
}

CT_TEST(kernels, attention_threads) {
  rng_seed(15);
  for (int causal = 0; causal < 2; causal++) {
    att_ctx c = att_make(2, 3, 150, 32, causal);
    size_t n = (size_t)c.B * c.H * c.L * c.hd;
    float *o[2], *lse[2], *g[2];
    for (int t = 0; t < 2; t++) {
      threads(t + 1);
      att_loss(&c);
      o[t] = dupv(c.o, n), lse[t] = dupv(c.lse, (size_t)c.B * c.H * c.L);
      g[t] = fillv(3 * n, NAN); /* overwritten */
      ct_attention_bwd(c.B, c.H, c.L, c.hd, c.scale, causal, c.q, c.k, c.v, c.o, c.lse, c.R, g[t],
                       g[t] + n, g[t] + 2 * n);
    }
    threads_restore();
    CHECK(SAME(o[0], o[1], n));
    CHECK(SAME(lse[0], lse[1], (size_t)c.B * c.H * c.L));
    CHECK(SAME(g[0], g[1], 3 * n));
    /* the same bits twice prove nothing if they are NaN (never written) or wrong */
    CHECK(ct_test_all_finite(g[0], 3 * n));
    double *ro = dzeros(n), *rl = dzeros((size_t)c.B * c.H * c.L);
    att_ref(&c, ro, rl);
    double eo = relerr2(c.B * c.L, c.H * c.hd, o[0], c.H * c.hd, ro, c.H * c.hd, 1);
    double el = relerr2(c.B * c.H, c.L, lse[0], c.L, rl, c.L, 1);
    CHECKF(eo < 2e-6 && el < 2e-6, "causal=%d: forward err o %.3g lse %.3g", causal, eo, el);
    free(ro), free(rl);
    for (int t = 0; t < 2; t++) free(o[t]), free(lse[t]), free(g[t]);
    att_free(&c);
  }
}

/* ---------------------------------------------------------------- activations */

typedef struct {
  int N, D, ld, which; /* 0 silu, 1 gelu */
  float *x, *y, *R;
} act_ctx;
static double act_loss(void *c_) {
  act_ctx *c = c_;
  if (c->which == 0)
    ct_silu_fwd(c->N, c->D, c->x, c->ld, c->y, c->ld);
  else
    ct_gelu_tanh_fwd(c->N, c->D, c->x, c->ld, c->y, c->ld);
  return dot2(c->N, c->D, c->y, c->ld, c->R, c->ld);
}

CT_TEST(kernels, activations) {
  rng_seed(16);
  for (int which = 0; which < 2; which++) {
    act_ctx c = {.N = 6, .D = 23, .ld = 25, .which = which};
    size_t n = (size_t)c.N * c.ld;
    c.x = randv(n, 4), c.y = fillv(n, 0), c.R = randv(n, 1);
    act_loss(&c);
    double md = 0;
    for (int r = 0; r < c.N; r++)
      for (int j = 0; j < c.D; j++) {
        double x = c.x[r * c.ld + j];
        double ref = which == 0 ? x / (1 + exp(-x))
                                : 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
        md = ct_test_max(md, fabs(c.y[r * c.ld + j] - ref) / fmax(1, fabs(x)));
      }
    CHECKF(md < 1e-6, "%s forward err %.3g", which ? "gelu" : "silu", md);
    float *dx = fillv(n, NAN);
    if (which == 0)
      ct_silu_bwd(c.N, c.D, c.x, c.ld, c.R, c.ld, dx, c.ld);
    else
      ct_gelu_tanh_bwd(c.N, c.D, c.x, c.ld, c.R, c.ld, dx, c.ld);
    for (int r = 0; r < c.N; r++) /* overwrite; padding untouched */
      for (int j = c.D; j < c.ld; j++) dx[r * c.ld + j] = 0;
    CHECK_GRAD(which ? "gelu_tanh dx" : "silu dx", c.x, n, dx, act_loss, &c, 100000);
    free(c.x), free(c.y), free(c.R), free(dx);
  }
  /* GELU at a few points against the tanh formula in double */
  float xs[6] = {-3.0f, -1.0f, -0.1f, 0.0f, 0.5f, 2.5f}, ys[6];
  ct_gelu_tanh_fwd(1, 6, xs, 6, ys, 6);
  for (int i = 0; i < 6; i++) {
    double x = xs[i];
    CHECK_NEAR(ys[i], 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))), 1e-6);
  }
  CHECK_NEAR(ys[4], 0.345714254, 1e-6); /* gelu_tanh(0.5) */
  /* quick GELU */
  ct_quick_gelu_fwd(1, 6, xs, 6, ys, 6);
  for (int i = 0; i < 6; i++) CHECK_NEAR(ys[i], xs[i] / (1 + exp(-1.702 * xs[i])), 1e-6);
  /* exact (erf) GELU */
  ct_gelu_erf_fwd(1, 6, xs, 6, ys, 6);
  for (int i = 0; i < 6; i++) CHECK_NEAR(ys[i], 0.5 * xs[i] * (1 + erf(xs[i] / sqrt(2.0))), 1e-6);
  CHECK_NEAR(ys[4], 0.345731154, 1e-6); /* gelu(0.5) */
}

CT_TEST(kernels, activations_threads) {
  rng_seed(17);
  int N = 100, D = 500;
  size_t n = (size_t)N * D;
  float *x = randv(n, 4), *dy = randv(n, 1), *out[2];
  for (int t = 0; t < 2; t++) {
    threads(t + 1);
    out[t] = fillv(5 * n, 0);
    ct_silu_fwd(N, D, x, D, out[t], D);
    ct_silu_bwd(N, D, x, D, dy, D, out[t] + n, D);
    ct_gelu_tanh_fwd(N, D, x, D, out[t] + 2 * n, D);
    ct_gelu_tanh_bwd(N, D, x, D, dy, D, out[t] + 3 * n, D);
    ct_quick_gelu_fwd(N, D, x, D, out[t] + 4 * n, D);
  }
  threads_restore();
  CHECK(SAME(out[0], out[1], 5 * n));
  free(x), free(dy), free(out[0]), free(out[1]);
}

/* ---------------------------------------------------------------- gated residual */

typedef struct {
  int B, L, D, ld, ldg;
  float *x, *gate, *y, *out, *R;
} gr_ctx;
static double gr_loss(void *c_) {
  gr_ctx *c = c_;
  ct_gate_res_fwd(c->B, c->L, c->D, c->x, c->ld, c->gate, c->ldg, c->y, c->ld, c->out, c->ld);
  return dot2(c->B * c->L, c->D, c->out, c->ld, c->R, c->ld);
}
static gr_ctx gr_make(int B, int L, int D) {
  gr_ctx c = {.B = B, .L = L, .D = D, .ld = D + 2, .ldg = 3 * D};
  size_t n = (size_t)B * L * c.ld;
  c.x = randv(n, 1), c.y = randv(n, 1), c.out = fillv(n, 0), c.R = randv(n, 1);
  c.gate = randv((size_t)B * c.ldg, 1);
  for (size_t i = 0; i < n; i++) /* no loss weight on the padding columns */
    if (i % c.ld >= (size_t)D) c.R[i] = 0;
  return c;
}
static void gr_free(gr_ctx *c) {
  free(c->x), free(c->gate), free(c->y), free(c->out), free(c->R);
}

CT_TEST(kernels, gate_res) {
  rng_seed(18);
  gr_ctx c = gr_make(2, 3, 70);
  size_t n = (size_t)c.B * c.L * c.ld;
  gr_loss(&c);
  double md = 0;
  for (int r = 0; r < c.B * c.L; r++)
    for (int j = 0; j < c.D; j++) {
      size_t i = (size_t)r * c.ld + j;
      md = ct_test_max(md,
                       fabs(c.out[i] - (c.x[i] + (double)c.gate[(r / c.L) * c.ldg + j] * c.y[i])));
    }
  CHECKF(md < 1e-6, "gate_res forward err %.3g", md);
  float *dy = fillv(n, NAN), *dg = fillv((size_t)c.B * c.ldg, 0);
  for (size_t i = 0; i < n; i++)
    if (i % c.ld >= (size_t)c.D) dy[i] = 0;
  ct_gate_res_bwd(c.B, c.L, c.D, c.gate, c.ldg, c.y, c.ld, c.R, c.ld, dy, c.ld, dg);
  CHECK_GRAD("gate_res dy", c.y, n, dy, gr_loss, &c, 100000);
  CHECK_GRAD("gate_res dgate", c.gate, (size_t)c.B * c.ldg, dg, gr_loss, &c, 100000);
  CHECK_GRAD("gate_res dx (= dout)", c.x, n, c.R, gr_loss, &c, 100000);
  float *dg1 = fillv((size_t)c.B * c.ldg, 1);
  ct_gate_res_bwd(c.B, c.L, c.D, c.gate, c.ldg, c.y, c.ld, c.R, c.ld, dy, c.ld, dg1);
  md = 0;
  for (int b = 0; b < c.B; b++)
    for (int j = 0; j < c.D; j++)
      md = ct_test_max(md, fabs(dg1[b * c.ldg + j] - 1 - dg[b * c.ldg + j]));
  CHECKF(md < 1e-5, "dgate accumulation off by %.3g", md);
  /* in place: out == x, and dy == y */
  float *xi = dupv(c.x, n), *ref = dupv(c.out, n);
  ct_gate_res_fwd(c.B, c.L, c.D, xi, c.ld, c.gate, c.ldg, c.y, c.ld, xi, c.ld);
  int ok = 1;
  for (size_t i = 0; i < n; i++) ok &= i % c.ld >= (size_t)c.D || xi[i] == ref[i];
  CHECKF(ok, "in-place gate_res_fwd differs");
  float *yi = dupv(c.y, n), *dg2 = fillv((size_t)c.B * c.ldg, 0);
  ct_gate_res_bwd(c.B, c.L, c.D, c.gate, c.ldg, yi, c.ld, c.R, c.ld, yi, c.ld, dg2);
  ok = 1;
  for (size_t i = 0; i < n; i++) ok &= i % c.ld >= (size_t)c.D || yi[i] == dy[i];
  CHECKF(ok && SAME(dg2, dg, (size_t)c.B * c.ldg), "gate_res_bwd with dy == y differs");
  free(dy), free(dg), free(dg1), free(xi), free(ref), free(yi), free(dg2);
  gr_free(&c);
}

CT_TEST(kernels, gate_res_threads) {
  rng_seed(19);
  gr_ctx c = gr_make(4, 40, 200);
  size_t n = (size_t)c.B * c.L * c.ld;
  float *o[2], *dy[2], *dg[2];
  for (int t = 0; t < 2; t++) {
    threads(t + 1);
    gr_loss(&c);
    o[t] = dupv(c.out, n), dy[t] = fillv(n, 0), dg[t] = fillv((size_t)c.B * c.ldg, 0.5f);
    ct_gate_res_bwd(c.B, c.L, c.D, c.gate, c.ldg, c.y, c.ld, c.R, c.ld, dy[t], c.ld, dg[t]);
  }
  threads_restore();
  CHECK(SAME(o[0], o[1], n));
  CHECK(SAME(dy[0], dy[1], n));
  CHECK(SAME(dg[0], dg[1], (size_t)c.B * c.ldg));
  for (int t = 0; t < 2; t++) free(o[t]), free(dy[t]), free(dg[t]);
  gr_free(&c);
}

/* ---------------------------------------------------------------- embeddings, patches, loss */

CT_TEST(kernels, timestep_embedding) {
  float t[3] = {0.0f, 0.37f, 0.999f};
  int dim = 256, half = 128;
  float *out = fillv(3 * dim, NAN);
  ct_timestep_embedding(3, t, dim, 10000.0f, 1000.0f, out);
  double mf = 0, md = 0;
  for (int b = 0; b < 3; b++)
    for (int k = 0; k < half; k++) {
      /* the peer's float32 operations, then cos/sin in double */
      float f = expf((float)-log(10000.0) * (float)k / (float)half);
      float a = (1000.0f * t[b]) * f;
      mf = ct_test_max(mf, fabs(out[b * dim + k] - cos((double)a)));
      mf = ct_test_max(mf, fabs(out[b * dim + half + k] - sin((double)a)));
      /* the formula in double: differs only by float rounding of the argument */
      double ad = 1000.0 * t[b] * exp(-log(10000.0) * k / half);
      md = ct_test_max(md, fabs(out[b * dim + k] - cos(ad)));
      md = ct_test_max(md, fabs(out[b * dim + half + k] - sin(ad)));
    }
  CHECKF(mf < 2e-7, "vs float32 peer ops: %.3g", mf);
  CHECKF(md < 5e-4, "vs double formula: %.3g", md);
  CHECK(out[0] == 1.0f && out[half] == 0.0f); /* t = 0: cos 1, sin 0 */
  free(out);
}

typedef struct {
  int B, C, H, W, p, inverse;
  float *in, *out, *R;
} patch_ctx;
static double patch_loss(void *c_) {
  patch_ctx *c = c_;
  if (c->inverse)
    ct_unpatchify(c->B, c->C, c->H, c->W, c->p, c->in, c->out);
  else
    ct_patchify(c->B, c->C, c->H, c->W, c->p, c->in, c->out);
  size_t n = (size_t)c->B * c->C * c->H * c->W;
  return dot2(1, (int)n, c->out, 0, c->R, 0);
}

CT_TEST(kernels, patchify) {
  rng_seed(20);
  int B = 2, C = 3, H = 4, W = 6, p = 2, gh = H / p, gw = W / p;
  size_t n = (size_t)B * C * H * W;
  float *x = randv(n, 1), *tok = fillv(n, NAN), *back = fillv(n, NAN);
  ct_patchify(B, C, H, W, p, x, tok);
  int ok = 1; /* b c (h ph) (w pw) -> b (h w) (c ph pw) */
  for (int b = 0; b < B; b++)
    for (int c = 0; c < C; c++)
      for (int hh = 0; hh < gh; hh++)
        for (int ph = 0; ph < p; ph++)
          for (int ww = 0; ww < gw; ww++)
            for (int pw = 0; pw < p; pw++) {
              float xv = x[((b * C + c) * H + hh * p + ph) * W + ww * p + pw];
              float tv =
                  tok[((size_t)b * gh * gw + hh * gw + ww) * C * p * p + (c * p + ph) * p + pw];
              ok &= xv == tv;
            }
  CHECKF(ok, "patchify order");
  ct_unpatchify(B, C, H, W, p, tok, back);
  CHECKF(SAME(x, back, n), "unpatchify(patchify(x)) != x");
  /* each is the other's backward */
  patch_ctx c = {.B = B, .C = C, .H = H, .W = W, .p = p, .in = x, .out = tok, .R = randv(n, 1)};
  float *g = fillv(n, 0);
  ct_unpatchify(B, C, H, W, p, c.R, g);
  CHECK_GRAD("patchify dx", x, n, g, patch_loss, &c, 100000);
  c.inverse = 1;
  c.in = tok, c.out = back;
  ct_patchify(B, C, H, W, p, c.R, g);
  CHECK_GRAD("unpatchify dx", tok, n, g, patch_loss, &c, 100000);
  free(x), free(tok), free(back), free(c.R), free(g);
}

typedef struct {
  size_t n;
  float *pred, *target;
} mse_ctx;
static double mse_loss(void *c_) {
  mse_ctx *c = c_;
  return 0.5 * ct_mse_fwd_bwd(c->n, c->pred, c->target, 0.0f, NULL);
}

CT_TEST(kernels, mse) {
  rng_seed(21);
  mse_ctx c = {.n = 50};
  c.pred = randv(c.n, 1), c.target = randv(c.n, 1);
  float *g = fillv(c.n, NAN);
  float l = ct_mse_fwd_bwd(c.n, c.pred, c.target, 0.5f, g); /* dloss = 0.5 */
  double ref = 0;
  for (size_t i = 0; i < c.n; i++)
    ref += ((double)c.pred[i] - c.target[i]) * (c.pred[i] - c.target[i]);
  CHECK_NEAR(l, ref / c.n, 1e-6 * ref / c.n);
  CHECK_GRAD("mse dpred", c.pred, c.n, g, mse_loss, &c, 100000);
  CHECK(ct_mse_fwd_bwd(0, NULL, NULL, 1.0f, NULL) == 0.0f);
  free(c.pred), free(c.target), free(g);
  /* thread count does not change the loss or the gradient */
  size_t n = 200003;
  float *p = randv(n, 1), *t = randv(n, 1), *d[2], ls[2];
  for (int k = 0; k < 2; k++) {
    threads(k + 1);
    d[k] = fillv(n, 0);
    ls[k] = ct_mse_fwd_bwd(n, p, t, 1.0f, d[k]);
  }
  threads_restore();
  CHECK(ls[0] == ls[1]);
  CHECK(SAME(d[0], d[1], n));
  free(p), free(t), free(d[0]), free(d[1]);
}

CT_TEST(kernels, elementwise) {
  rng_seed(22);
  size_t ns[2] = {37, 300001};
  for (int s = 0; s < 2; s++) {
    size_t n = ns[s];
    float *y = randv(n, 1), *x = randv(n, 1), *y0 = dupv(y, n);
    ct_add_inplace(n, y, x);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= y[i] == y0[i] + x[i];
    CHECKF(ok, "add_inplace n=%zu", n);
    ct_zero(n, y);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= y[i] == 0.0f;
    CHECKF(ok, "zero n=%zu", n);
    free(y), free(x), free(y0);
  }
}

/* ---------------------------------------------------------------- image kernels (VAE) */

typedef struct conv_ctx {
  ct_conv2d_shape s;
  float *x, *w, *b, *y, *R, *col;
} conv_ctx;

static double conv_loss(void *p) {
  conv_ctx *c = p;
  ct_conv2d_fwd(&c->s, c->x, c->w, c->b, c->y, c->col);
  const int Ho = ct_conv2d_out(c->s.H, c->s.k, c->s.stride, c->s.pad_t, c->s.pad_b);
  const int Wo = ct_conv2d_out(c->s.W, c->s.k, c->s.stride, c->s.pad_l, c->s.pad_r);
  return dot2(1, c->s.B * c->s.Cout * Ho * Wo, c->y, 0, c->R, 0);
}

/* naive double reference of one output element */
static double conv_ref(const ct_conv2d_shape *s, const float *x, const float *w, const float *b,
                       int bi, int o, int oi, int oj) {
  double acc = b ? b[o] : 0;
  for (int c = 0; c < s->Cin; c++)
    for (int ki = 0; ki < s->k; ki++)
      for (int kj = 0; kj < s->k; kj++) {
        const int i = oi * s->stride - s->pad_t + ki, j = oj * s->stride - s->pad_l + kj;
        if (i < 0 || j < 0 || i >= s->H || j >= s->W) continue;
        acc += (double)x[(((size_t)bi * s->Cin + c) * s->H + i) * s->W + j] *
               w[(((size_t)o * s->Cin + c) * s->k + ki) * s->k + kj];
      }
  return acc;
}

CT_TEST(kernels, conv2d) {
  /* 3x3 same, diffusers' stride-2 downsample (pad right/bottom only), 1x1,
   * 3x3 stride 2 pad 1, and 5x5 stride 1 */
  static const ct_conv2d_shape shapes[] = {{2, 3, 7, 6, 4, 3, 1, 1, 1, 1, 1},
                                           {2, 3, 8, 6, 4, 3, 2, 0, 0, 1, 1},
                                           {2, 5, 4, 3, 6, 1, 1, 0, 0, 0, 0},
                                           {1, 2, 9, 7, 3, 3, 2, 1, 1, 1, 1},
                                           {1, 2, 6, 6, 2, 5, 1, 2, 2, 2, 2}};
  for (int band = 0; band < 2; band++) {
    /* band 1: a 3-float limit forces one output row per band */
    if (band) setenv("CTUNER_CONV_COL_FLOATS", "3", 1);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
      rng_seed(40 + si);
      conv_ctx c = {.s = shapes[si]};
      const ct_conv2d_shape *s = &c.s;
      const int Ho = ct_conv2d_out(s->H, s->k, s->stride, s->pad_t, s->pad_b);
      const int Wo = ct_conv2d_out(s->W, s->k, s->stride, s->pad_l, s->pad_r);
      const size_t nx = (size_t)s->B * s->Cin * s->H * s->W,
                   nw = (size_t)s->Cout * s->Cin * s->k * s->k,
                   ny = (size_t)s->B * s->Cout * Ho * Wo;
      c.x = randv(nx, 1), c.w = randv(nw, 0.5f), c.b = randv(s->Cout, 0.5f);
      c.y = fillv(ny, NAN), c.R = randv(ny, 1);
      c.col = fillv(ct_conv2d_col_floats(s), NAN);
      ct_conv2d_fwd(s, c.x, c.w, c.b, c.y, c.col);
      double md = 0, mr = 0;
      for (int bi = 0; bi < s->B; bi++)
        for (int o = 0; o < s->Cout; o++)
          for (int i = 0; i < Ho; i++)
            for (int j = 0; j < Wo; j++) {
              const double r = conv_ref(s, c.x, c.w, c.b, bi, o, i, j);
              md = ct_test_max(md, fabs(r - c.y[(((size_t)bi * s->Cout + o) * Ho + i) * Wo + j]));
              mr = ct_test_max(mr, fabs(r));
            }
      CHECKF(md / mr < 1e-5, "conv2d shape %zu band %d: forward error %.3g", si, band, md / mr);
      float *dx = fillv(nx, NAN), *dw = fillv(nw, 0), *db = fillv(s->Cout, 0);
      ct_conv2d_bwd(s, c.x, c.w, c.R, dx, dw, db, c.col);
      char name[64];
      snprintf(name, sizeof name, "conv2d %zu dx", si);
      CHECK_GRAD(name, c.x, nx, dx, conv_loss, &c, 200);
      snprintf(name, sizeof name, "conv2d %zu dw", si);
      CHECK_GRAD(name, c.w, nw, dw, conv_loss, &c, 200);
      snprintf(name, sizeof name, "conv2d %zu db", si);
      CHECK_GRAD(name, c.b, (size_t)s->Cout, db, conv_loss, &c, 200);
      /* dw and db accumulate */
      float *dw2 = fillv(nw, 1), *db2 = fillv(s->Cout, 1);
      ct_conv2d_bwd(s, c.x, c.w, c.R, NULL, dw2, db2, c.col);
      double acc = 0;
      for (size_t i = 0; i < nw; i++) acc = ct_test_max(acc, fabs(dw2[i] - 1 - dw[i]));
      for (int i = 0; i < s->Cout; i++) acc = ct_test_max(acc, fabs(db2[i] - 1 - db[i]));
      CHECKF(acc < 1e-4, "conv2d %zu: accumulation off by %.3g", si, acc);
      /* 1 and 2 threads: the same bits */
      threads(1);
      float *y1 = fillv(ny, 0), *dx1 = fillv(nx, 0), *dw1 = fillv(nw, 0);
      ct_conv2d_fwd(s, c.x, c.w, c.b, y1, c.col);
      ct_conv2d_bwd(s, c.x, c.w, c.R, dx1, dw1, NULL, c.col);
      threads(2);
      float *y2 = fillv(ny, 0), *dx2 = fillv(nx, 0), *dw3 = fillv(nw, 0);
      ct_conv2d_fwd(s, c.x, c.w, c.b, y2, c.col);
      ct_conv2d_bwd(s, c.x, c.w, c.R, dx2, dw3, NULL, c.col);
      threads_restore();
      CHECKF(SAME(y1, y2, ny) && SAME(dx1, dx2, nx) && SAME(dw1, dw3, nw),
             "conv2d %zu: thread count changes bits", si);
      free(c.x), free(c.w), free(c.b), free(c.y), free(c.R), free(c.col);
      free(dx), free(dw), free(db), free(dw2), free(db2), free(y1), free(dx1), free(dw1), free(y2),
          free(dx2), free(dw3);
    }
    unsetenv("CTUNER_CONV_COL_FLOATS");
  }
}

typedef struct gn_ctx {
  int B, C, HW, G;
  float *x, *g, *b, *y, *R, *mean, *rstd;
} gn_ctx;

static double gn_loss(void *p) {
  gn_ctx *c = p;
  ct_groupnorm_fwd(c->B, c->C, c->HW, c->G, 1e-6f, c->x, c->g, c->b, c->y, c->mean, c->rstd);
  return dot2(1, c->B * c->C * c->HW, c->y, 0, c->R, 0);
}

CT_TEST(kernels, groupnorm) {
  rng_seed(77);
  gn_ctx c = {.B = 2, .C = 6, .HW = 10, .G = 3};
  const size_t n = (size_t)c.B * c.C * c.HW;
  c.x = randv(n, 2), c.g = randv(c.C, 1), c.b = randv(c.C, 1), c.y = fillv(n, 0), c.R = randv(n, 1);
  c.mean = fillv((size_t)c.B * c.G, 0), c.rstd = fillv((size_t)c.B * c.G, 0);
  for (size_t i = 0; i < n; i++) c.x[i] += 3.0f; /* an offset the statistics must remove */
  gn_loss(&c);
  /* reference: per (image, group) mean and biased variance in double */
  double md = 0;
  const int cg = c.C / c.G;
  for (int bi = 0; bi < c.B; bi++)
    for (int g = 0; g < c.G; g++) {
      double s1 = 0, s2 = 0;
      const size_t off = ((size_t)bi * c.C + (size_t)g * cg) * c.HW, m = (size_t)cg * c.HW;
      for (size_t i = 0; i < m; i++) s1 += c.x[off + i];
      for (size_t i = 0; i < m; i++) s2 += (c.x[off + i] - s1 / m) * (c.x[off + i] - s1 / m);
      const double rs = 1 / sqrt(s2 / m + 1e-6);
      for (size_t i = 0; i < m; i++) {
        const int ch = g * cg + (int)(i / c.HW);
        const double r = (c.x[off + i] - s1 / m) * rs * c.g[ch] + c.b[ch];
        md = ct_test_max(md, fabs(r - c.y[off + i]));
      }
    }
  CHECKF(md < 1e-5, "groupnorm forward error %.3g", md);
  float *dx = fillv(n, NAN), *dg = fillv(c.C, 0), *db = fillv(c.C, 0);
  ct_groupnorm_bwd(c.B, c.C, c.HW, c.G, c.x, c.g, c.mean, c.rstd, c.R, dx, dg, db);
  CHECK_GRAD("groupnorm dx", c.x, n, dx, gn_loss, &c, 200);
  CHECK_GRAD("groupnorm dgamma", c.g, (size_t)c.C, dg, gn_loss, &c, 200);
  CHECK_GRAD("groupnorm dbeta", c.b, (size_t)c.C, db, gn_loss, &c, 200);
  threads(1);
  float *y1 = fillv(n, 0), *dx1 = fillv(n, 0);
  ct_groupnorm_fwd(c.B, c.C, c.HW, c.G, 1e-6f, c.x, c.g, c.b, y1, c.mean, c.rstd);
  ct_groupnorm_bwd(c.B, c.C, c.HW, c.G, c.x, c.g, c.mean, c.rstd, c.R, dx1, NULL, NULL);
  threads(2);
  float *y2 = fillv(n, 0), *dx2 = fillv(n, 0);
  ct_groupnorm_fwd(c.B, c.C, c.HW, c.G, 1e-6f, c.x, c.g, c.b, y2, c.mean, c.rstd);
  ct_groupnorm_bwd(c.B, c.C, c.HW, c.G, c.x, c.g, c.mean, c.rstd, c.R, dx2, NULL, NULL);
  threads_restore();
  CHECK(SAME(y1, y2, n) && SAME(dx1, dx2, n));
  free(c.x), free(c.g), free(c.b), free(c.y), free(c.R), free(c.mean), free(c.rstd);
  free(dx), free(dg), free(db), free(y1), free(dx1), free(y2), free(dx2);
}

CT_TEST(kernels, upsample_transpose) {
  rng_seed(5);
  const int BC = 3, H = 4, W = 5, n = BC * H * W;
  float *x = randv(n, 1), *y = fillv(4 * n, NAN), *g = randv(4 * n, 1), *dx = fillv(n, NAN);
  ct_upsample2x_fwd(BC, H, W, x, y);
  int ok = 1;
  for (int p = 0; p < BC; p++)
    for (int i = 0; i < 2 * H; i++)
      for (int j = 0; j < 2 * W; j++)
        ok &= y[((size_t)p * 2 * H + i) * 2 * W + j] == x[((size_t)p * H + i / 2) * W + j / 2];
  CHECK(ok);
  /* the backward is the adjoint: <up(x), g> == <x, up'(g)> */
  ct_upsample2x_bwd(BC, H, W, g, dx);
  const double a = dot2(1, 4 * n, y, 0, g, 0), b = dot2(1, n, x, 0, dx, 0);
  CHECKF(fabs(a - b) < 1e-5 * fmax(1, fabs(a)), "upsample adjoint %.9g vs %.9g", a, b);
  /* (B, C, L) <-> (B, L, C) */
  const int B = 2, C = 3, L = 7;
  float *t = randv((size_t)B * C * L, 1), *u = fillv((size_t)B * C * L, 0),
        *v = fillv((size_t)B * C * L, 0);
  ct_nchw_to_nlc(B, C, L, t, u);
  CHECK(u[(1 * L + 4) * C + 2] == t[(1 * C + 2) * L + 4]);
  ct_nlc_to_nchw(B, C, L, u, v);
  CHECK(SAME(t, v, (size_t)B * C * L));
  free(x), free(y), free(g), free(dx), free(t), free(u), free(v);
}

/* The backend suite's residency ops (tests/test_backend.c's op list):
 * bf16_widen, bf16_narrow, bf16_narrow_acc against plain-C bit arithmetic
 * (exact: every backend rounds to nearest even), and LoRA's dropout forward
 * and backward against the mask written out here from the Philox uniforms
 * the contract names (include/ctuner/backend.h). */
#include "backend_check.h"
#include "ctuner/rng.h"

static uint16_t *dev16(bcheck *t, const uint16_t *h, size_t n) {
  uint16_t *d = t->be->alloc(CT_MEM_BUFFERS, (n ? n : 1) * sizeof *d);
  if (!d || t->ndev == (int)(sizeof t->dev / sizeof t->dev[0])) abort();
  t->be->copy_in(d, h, n * sizeof *d);
  return t->dev[t->ndev++] = d;
}
static uint16_t *back16(bcheck *t, const uint16_t *d, size_t n) {
  uint16_t *h = hkeep(t, malloc((n ? n : 1) * sizeof *h));
  t->be->copy_out(h, d, n * sizeof *h);
  return h;
}
static float widen_ref(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static uint16_t narrow_ref(float f) { /* round to nearest, ties to even (finite f) */
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

void backend_op_bf16(bcheck *t) {
  const size_t n = 1003;
  float *x = hrand(t, n, 4);
  uint16_t *h = hkeep(t, malloc(n * sizeof *h)), *acc = hkeep(t, malloc(n * sizeof *acc));
  for (size_t i = 0; i < n; i++) h[i] = narrow_ref(3 * frand(t));
  x[0] = 1.00390625f;      /* a tie: 1 + 2^-8 rounds to even (1) */
  x[1] = 1.01171875f;      /* 1 + 3 * 2^-8: a tie rounding up */
  x[2] = -0.0f, h[3] = 0;  /* signed zero survives */
  float *w = dev(t, x, n); /* pre-filled: widen overwrites */
  t->be->bf16_widen(n, dev16(t, h, n), w);
  float *wh = back(t, w, n);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += memcmp(&wh[i], &(float){widen_ref(h[i])}, 4) != 0;
  EXPECT(t, bad == 0, "bf16_widen: %zu of %zu elements differ", bad, n);
  uint16_t *nd = dev16(t, h, n);
  t->be->bf16_narrow(n, dev(t, x, n), nd);
  uint16_t *nh = back16(t, nd, n);
  bad = 0;
  for (size_t i = 0; i < n; i++) bad += nh[i] != narrow_ref(x[i]);
  EXPECT(t, bad == 0, "bf16_narrow: %zu of %zu elements differ (1 + 2^-8 -> %#x)", bad, n, nh[0]);
  for (size_t i = 0; i < n; i++) acc[i] = narrow_ref(widen_ref(h[i]) + x[i]);
  uint16_t *ad = dev16(t, h, n);
  t->be->bf16_narrow_acc(n, dev(t, x, n), ad);
  uint16_t *ah = back16(t, ad, n);
  bad = 0;
  for (size_t i = 0; i < n; i++) bad += ah[i] != acc[i];
  EXPECT(t, bad == 0, "bf16_narrow_acc: %zu of %zu elements differ", bad, n);
}

void backend_op_dropout(bcheck *t) {
  const int N = 5, D = 37, ldx = 40, lddx = 41;
  const float p = 0.3f, keep = (float)(1.0 / (1.0 - (double)p));
  const uint64_t seed = 1234, stream = 77;
  uint64_t ctr[5];
  for (int n = 0; n < N; n++) ctr[n] = ((uint64_t)(n / 2 + 3) << 40) + (uint64_t)(n % 2) * D;
  float *u = hkeep(t, malloc((size_t)N * D * sizeof *u));
  for (int n = 0; n < N; n++)
    ct_rng_fill_uniform(u + (size_t)n * D, (size_t)D, seed, stream, ctr[n], 0.0f, 1.0f);
  float *x = hrand(t, (size_t)N * ldx, 2), *xd0 = hrand(t, (size_t)N * D, 1);
  double *ref = hd(t, NULL, (size_t)N * D);
  int dropped = 0;
  for (int n = 0; n < N; n++)
    for (int c = 0; c < D; c++) {
      const int off = u[n * D + c] < p;
      dropped += off;
      ref[n * D + c] = off ? 0.0 : (double)(x[n * ldx + c] * keep);
    }
  EXPECT(t, dropped > 0 && dropped < N * D, "the test's mask drops %d of %d", dropped, N * D);
  float *xd = dev(t, xd0, (size_t)N * D);
  t->be->dropout_fwd(N, D, dev(t, x, (size_t)N * ldx), ldx, seed, stream, ctr, p, xd);
  float *xdh = back(t, xd, (size_t)N * D);
  int zeros = 0;
  for (int i = 0; i < N * D; i++) zeros += xdh[i] == 0.0f && ref[i] == 0.0;
  EXPECT(t, zeros == dropped, "dropout_fwd: %d of the %d dropped elements are zero", zeros,
         dropped);
  cmp(t, "dropout_fwd xd", xdh, ref, (size_t)N * D);
  /* backward: dx (padded, pre-filled) += kept dxd * keep; padding untouched */
  float *g = hrand(t, (size_t)N * D, 1), *dx0 = hrand(t, (size_t)N * lddx, 1);
  double *dref = hd(t, dx0, (size_t)N * lddx);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < D; c++)
      if (!(u[n * D + c] < p))
        dref[n * lddx + c] = (double)(dx0[n * lddx + c] + g[n * D + c] * keep);
  float *dx = dev(t, dx0, (size_t)N * lddx);
  t->be->dropout_bwd(N, D, dev(t, g, (size_t)N * D), seed, stream, ctr, p, dx, lddx);
  cmp(t, "dropout_bwd dx", back(t, dx, (size_t)N * lddx), dref, (size_t)N * lddx);
}

/* The comparison harness of the backend suite (tests/test_backend.c,
 * tests/backend_ops_image.c): one op check's context (the backend, its
 * tolerances, the buffers to free), inputs made on the host and copied into
 * backend memory, results copied back, comparison against double-precision
 * references and central finite differences of a scalar loss. */
#ifndef CT_TEST_BACKEND_CHECK_H
#define CT_TEST_BACKEND_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/backend.h"

typedef struct bcheck {
  const ct_backend_ops *be;
  const char *op;
  int fails, quiet;
  double ftol, gtol;
  void *dev[64], *host[256];
  int ndev, nhost;
  uint64_t rng;
} bcheck;

#define EXPECT(t, cond, ...)                                              \
  do {                                                                    \
    if (!(cond)) {                                                        \
      (t)->fails++;                                                       \
      if (!(t)->quiet) {                                                  \
        fprintf(stderr, "  backend %s, op %s: ", (t)->be->name, (t)->op); \
        fprintf(stderr, __VA_ARGS__);                                     \
        fputc('\n', stderr);                                              \
      }                                                                   \
    }                                                                     \
  } while (0)

static inline float frand(bcheck *t) { /* uniform in [-1, 1) */
  t->rng ^= t->rng << 13;
  t->rng ^= t->rng >> 7;
  t->rng ^= t->rng << 17;
  return (float)((double)(t->rng >> 40) / (double)(1ull << 23) - 1.0);
}
static inline void *hkeep(bcheck *t, void *p) {
  if (!p || t->nhost == (int)(sizeof t->host / sizeof t->host[0])) abort();
  return t->host[t->nhost++] = p;
}
static inline float *hrand(bcheck *t, size_t n, float scale) {
  float *p = hkeep(t, malloc((n ? n : 1) * sizeof(float)));
  for (size_t i = 0; i < n; i++) p[i] = scale * frand(t);
  return p;
}
static inline float *hpos(bcheck *t, size_t n, float lo) { /* uniform in [lo, lo + 1) */
  float *p = hkeep(t, malloc((n ? n : 1) * sizeof(float)));
  for (size_t i = 0; i < n; i++) p[i] = lo + 0.5f * (frand(t) + 1.0f);
  return p;
}
static inline float *hcopy(bcheck *t, const float *a, size_t n) {
  float *p = hkeep(t, malloc((n ? n : 1) * sizeof(float)));
  memcpy(p, a, n * sizeof(float));
  return p;
}
static inline double *hd(bcheck *t, const float *init,
                         size_t n) { /* double copy of init (or zeros) */
  double *p = hkeep(t, calloc(n ? n : 1, sizeof(double)));
  for (size_t i = 0; init && i < n; i++) p[i] = init[i];
  return p;
}
/* backend copy of host data */
static inline float *dev(bcheck *t, const float *h, size_t n) {
  float *d = t->be->alloc(CT_MEM_BUFFERS, (n ? n : 1) * sizeof(float));
  if (!d || t->ndev == (int)(sizeof t->dev / sizeof t->dev[0])) abort();
  t->be->copy_in(d, h, n * sizeof(float));
  return t->dev[t->ndev++] = d;
}
/* host copy of backend data */
static inline float *back(bcheck *t, const float *d, size_t n) {
  float *h = hkeep(t, malloc((n ? n : 1) * sizeof(float)));
  t->be->copy_out(h, d, n * sizeof(float));
  return h;
}
static inline float *diff(bcheck *t, const float *a, const float *b, size_t n) { /* a - b */
  float *p = hkeep(t, malloc((n ? n : 1) * sizeof(float)));
  for (size_t i = 0; i < n; i++) p[i] = a[i] - b[i];
  return p;
}
static inline void release(bcheck *t) {
  for (int i = 0; i < t->ndev; i++) t->be->free(t->dev[i]);
  for (int i = 0; i < t->nhost; i++) free(t->host[i]);
  t->ndev = t->nhost = 0;
}

/* max |got - ref| / max(max |ref|, 1e-3) over n floats; NaN fails */
static inline void cmp(bcheck *t, const char *what, const float *got, const double *ref, size_t n) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - ref[i]);
    md = e > md || isnan(e) ? e : md;
    mr = fmax(mr, fabs(ref[i]));
  }
  double rel = md / fmax(mr, 1e-3);
  EXPECT(t, rel <= t->ftol, "%s: relative error %.3g (tolerance %.3g)", what, rel, t->ftol);
}

/* Central differences of loss() in every interior element (rows x cols, leading
 * dim ld) of the float input p, against the analytic gradient ana (same layout). */
typedef double (*loss_fn)(void *ctx);
static inline void fd(bcheck *t, const char *what, float *p, int rows, int cols, int ld,
                      const float *ana, loss_fn loss, void *ctx) {
  double maxn = 0, maxd = 0;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      size_t i = (size_t)r * ld + c;
      float v = p[i], vp = v + 1e-3f, vm = v - 1e-3f;
      p[i] = vp;
      double lp = loss(ctx);
      p[i] = vm;
      double lm = loss(ctx);
      p[i] = v;
      double num = (lp - lm) / ((double)vp - (double)vm), e = fabs(num - (double)ana[i]);
      maxn = fmax(maxn, fabs(num));
      maxd = e > maxd || isnan(e) ? e : maxd;
    }
  double rel = maxd / fmax(maxn, 1e-3);
  EXPECT(t, rel <= t->gtol,
         "gradient %s: relative error %.3g against finite differences "
         "(tolerance %.3g)",
         what, rel, t->gtol);
}
#define FD1(t, what, p, n, ana, loss, ctx) fd(t, what, p, 1, (int)(n), (int)(n), ana, loss, ctx)

/* sum(y r); 0 before r is drawn (a loss evaluated for its forward only) */
static inline double dot(const double *y, const float *r, size_t n) {
  if (!r) return 0;
  double s = 0;
  for (size_t i = 0; i < n; i++) s += y[i] * r[i];
  return s;
}

/* ---- op checks in tests/backend_ops_image.c ---- */
void backend_op_groupnorm(bcheck *t);
void backend_op_conv2d(bcheck *t);
void backend_op_upsample2x(bcheck *t);
void backend_op_patchify(bcheck *t);
void backend_op_nchw_nlc(bcheck *t);
void backend_op_elementwise(bcheck *t);
void backend_op_tile_blend(bcheck *t);
void backend_op_clamp(bcheck *t);
void backend_op_embedding(bcheck *t);
void backend_op_timestep_embedding(bcheck *t);
void backend_op_mse(bcheck *t);
void backend_op_optimizer_updates(bcheck *t);
void backend_op_sumsq(bcheck *t);
void backend_op_bf16(bcheck *t);    /* backend_ops_resident.c */
void backend_op_dropout(bcheck *t); /* backend_ops_resident.c */

#endif

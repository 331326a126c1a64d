/* Backend comparison, second half (see tests/test_backend.c): the image ops
 * (GroupNorm, conv2d, nearest upsampling, patchify and the NCHW/NLC
 * transposes, the tile blend), the small elementwise ops, the clamp, the token and the
 * timestep embeddings, the MSE
 * loss and the optimizer math, each against a double-precision reference. */
#include "backend_check.h"

typedef struct {
  int B, C, HW, G;
  float eps, *x, *g, *b, *r;
  double *y, *mean, *rstd;
} gn_c;
static void gn_ref(gn_c *c) {
  const int cg = c->C / c->G;
  const size_t n = (size_t)cg * c->HW;
  for (int bg = 0; bg < c->B * c->G; bg++) {
    size_t off = ((size_t)(bg / c->G) * c->C + (size_t)(bg % c->G) * cg) * c->HW;
    double mu = 0, var = 0;
    for (size_t i = 0; i < n; i++) mu += c->x[off + i];
    mu /= (double)n;
    for (size_t i = 0; i < n; i++) var += (c->x[off + i] - mu) * (c->x[off + i] - mu);
    double rs = 1.0 / sqrt(var / (double)n + c->eps);
    c->mean[bg] = mu, c->rstd[bg] = rs;
    for (size_t i = 0; i < n; i++) {
      int ch = (bg % c->G) * cg + (int)(i / c->HW);
      c->y[off + i] = (c->x[off + i] - mu) * rs * c->g[ch] + c->b[ch];
    }
  }
}
static double gn_loss(void *p) {
  gn_c *c = p;
  gn_ref(c);
  return dot(c->y, c->r, (size_t)c->B * c->C * c->HW);
}
void backend_op_groupnorm(bcheck *t) {
  gn_c c = {.B = 2, .C = 4, .HW = 6, .G = 2, .eps = 1e-5f};
  size_t n = (size_t)c.B * c.C * c.HW, ns = (size_t)c.B * c.G;
  c.x = hrand(t, n, 1), c.g = hrand(t, c.C, 1), c.b = hrand(t, c.C, 1);
  float *y0 = hrand(t, n, 1), *s0 = hrand(t, ns, 1);
  c.y = hd(t, y0, n), c.mean = hd(t, s0, ns), c.rstd = hd(t, s0, ns);
  gn_ref(&c);
  float *x = dev(t, c.x, n), *g = dev(t, c.g, c.C), *y = dev(t, y0, n), *mean = dev(t, s0, ns),
        *rstd = dev(t, s0, ns);
  t->be->groupnorm_fwd(c.B, c.C, c.HW, c.G, c.eps, x, g, dev(t, c.b, c.C), y, mean, rstd);
  cmp(t, "y", back(t, y, n), c.y, n);
  cmp(t, "mean", back(t, mean, ns), c.mean, ns);
  cmp(t, "rstd", back(t, rstd, ns), c.rstd, ns);
  c.r = hrand(t, n, 1);
  float *dg0 = hrand(t, c.C, 1), *db0 = hrand(t, c.C, 1);
  float *dx = dev(t, hrand(t, n, 1), n), *dg = dev(t, dg0, c.C), *db = dev(t, db0, c.C);
  t->be->groupnorm_bwd(c.B, c.C, c.HW, c.G, x, g, mean, rstd, dev(t, c.r, n), dx, dg, db);
  FD1(t, "dx", c.x, n, back(t, dx, n), gn_loss, &c);
  FD1(t, "dgamma", c.g, c.C, diff(t, back(t, dg, c.C), dg0, c.C), gn_loss, &c);
  FD1(t, "dbeta", c.b, c.C, diff(t, back(t, db, c.C), db0, c.C), gn_loss, &c);
}

/* ---------------------------------------------------------------- convolution, layout */

typedef struct {
  ct_conv2d_shape s;
  int Ho, Wo;
  float *x, *w, *b, *r;
  double *y;
} conv_c;
static void conv_ref(conv_c *c) {
  const ct_conv2d_shape *s = &c->s;
  for (int bi = 0; bi < s->B; bi++)
    for (int o = 0; o < s->Cout; o++)
      for (int i = 0; i < c->Ho; i++)
        for (int j = 0; j < c->Wo; j++) {
          double a = c->b[o];
          for (int ci = 0; ci < s->Cin; ci++)
            for (int ki = 0; ki < s->k; ki++)
              for (int kj = 0; kj < s->k; kj++) {
                int y = i * s->stride - s->pad_t + ki, x = j * s->stride - s->pad_l + kj;
                if (y < 0 || y >= s->H || x < 0 || x >= s->W) continue;
                a += (double)c->w[((o * s->Cin + ci) * s->k + ki) * s->k + kj] *
                     c->x[(((size_t)bi * s->Cin + ci) * s->H + y) * s->W + x];
              }
          c->y[(((size_t)bi * s->Cout + o) * c->Ho + i) * c->Wo + j] = a;
        }
}
static double conv_loss(void *p) {
  conv_c *c = p;
  conv_ref(c);
  return dot(c->y, c->r, (size_t)c->s.B * c->s.Cout * c->Ho * c->Wo);
}
void backend_op_conv2d(bcheck *t) {
  const ct_conv2d_shape shapes[2] = {{2, 3, 5, 6, 4, 3, 2, 1, 1, 0, 1},
                                     {2, 3, 4, 3, 5, 1, 1, 0, 0, 0, 0}};
  for (int sh = 0; sh < 2; sh++) {
    conv_c c = {.s = shapes[sh]};
    const ct_conv2d_shape *s = &c.s;
    c.Ho = ct_conv2d_out(s->H, s->k, s->stride, s->pad_t, s->pad_b);
    c.Wo = ct_conv2d_out(s->W, s->k, s->stride, s->pad_l, s->pad_r);
    size_t nx = (size_t)s->B * s->Cin * s->H * s->W, nw = (size_t)s->Cout * s->Cin * s->k * s->k;
    size_t ny = (size_t)s->B * s->Cout * c.Ho * c.Wo, ncol = t->be->conv2d_col_floats(s);
    c.x = hrand(t, nx, 1), c.w = hrand(t, nw, 0.5f), c.b = hrand(t, s->Cout, 1);
    float *y0 = hrand(t, ny, 1);
    c.y = hd(t, y0, ny);
    conv_ref(&c);
    float *x = dev(t, c.x, nx), *w = dev(t, c.w, nw), *y = dev(t, y0, ny);
    float *col = dev(t, hrand(t, ncol, 1), ncol);
    t->be->conv2d_fwd(s, x, w, dev(t, c.b, s->Cout), y, col);
    cmp(t, sh ? "y (1x1)" : "y (3x3, stride 2, asymmetric padding)", back(t, y, ny), c.y, ny);
    c.r = hrand(t, ny, 1);
    float *dw0 = hrand(t, nw, 1), *db0 = hrand(t, s->Cout, 1);
    float *dx = dev(t, hrand(t, nx, 1), nx), *dw = dev(t, dw0, nw), *db = dev(t, db0, s->Cout);
    t->be->conv2d_bwd(s, x, w, dev(t, c.r, ny), dx, dw, db, col);
    FD1(t, sh ? "dx (1x1)" : "dx", c.x, nx, back(t, dx, nx), conv_loss, &c);
    FD1(t, sh ? "dw (1x1)" : "dw", c.w, nw, diff(t, back(t, dw, nw), dw0, nw), conv_loss, &c);
    FD1(t, sh ? "db (1x1)" : "db", c.b, s->Cout, diff(t, back(t, db, s->Cout), db0, s->Cout),
        conv_loss, &c);
  }
}

/* Ops that move elements (y[i] = x[map(i)]) or sum them (upsample's
 * backward): forward against the map, backward through finite differences of
 * sum(r * y). map(i) is the source index of output i. */
typedef struct {
  size_t nx, ny;
  size_t *map;
  int rep; /* upsample: each output reads one input, each input feeds rep outputs */
  float *x, *r;
  double *y;
} perm_c;
static double perm_loss(void *p) {
  perm_c *c = p;
  for (size_t i = 0; i < c->ny; i++) c->y[i] = c->x[c->map[i]];
  return dot(c->y, c->r, c->ny);
}
typedef void (*move_fn)(const ct_backend_ops *be, const float *x, float *y);
static void perm_case(bcheck *t, const char *name, size_t nx, size_t ny, size_t *map, move_fn fwd,
                      move_fn bwd) {
  perm_c c = {.nx = nx, .ny = ny, .map = map, .x = hrand(t, nx, 1), .r = hrand(t, ny, 1)};
  c.y = hd(t, NULL, ny);
  perm_loss(&c);
  float *y = dev(t, hrand(t, ny, 1), ny), *dx = dev(t, hrand(t, nx, 1), nx);
  fwd(t->be, dev(t, c.x, nx), y);
  char what[64];
  snprintf(what, sizeof what, "%s: y", name);
  cmp(t, what, back(t, y, ny), c.y, ny);
  bwd(t->be, dev(t, c.r, ny), dx);
  snprintf(what, sizeof what, "%s: dx", name);
  FD1(t, what, c.x, nx, back(t, dx, nx), perm_loss, &c);
}

enum { UB = 3, UH = 2, UW = 3, PB = 2, PC = 3, PH = 4, PW = 6, PP = 2, TB = 2, TC = 3, TL = 5 };
static void up_f(const ct_backend_ops *be, const float *x, float *y) {
  be->upsample2x_fwd(UB, UH, UW, x, y);
}
static void up_b(const ct_backend_ops *be, const float *x, float *y) {
  be->upsample2x_bwd(UB, UH, UW, x, y);
}
static void pat_f(const ct_backend_ops *be, const float *x, float *y) {
  be->patchify(PB, PC, PH, PW, PP, x, y);
}
static void pat_b(const ct_backend_ops *be, const float *x, float *y) {
  be->unpatchify(PB, PC, PH, PW, PP, x, y);
}
static void unp_f(const ct_backend_ops *be, const float *x, float *y) {
  be->unpatchify(PB, PC, PH, PW, PP, x, y);
}
static void unp_b(const ct_backend_ops *be, const float *x, float *y) {
  be->patchify(PB, PC, PH, PW, PP, x, y);
}
static void nlc_f(const ct_backend_ops *be, const float *x, float *y) {
  be->nchw_to_nlc(TB, TC, TL, x, y);
}
static void nlc_b(const ct_backend_ops *be, const float *x, float *y) {
  be->nlc_to_nchw(TB, TC, TL, x, y);
}
static void nchw_f(const ct_backend_ops *be, const float *x, float *y) {
  be->nlc_to_nchw(TB, TC, TL, x, y);
}
static void nchw_b(const ct_backend_ops *be, const float *x, float *y) {
  be->nchw_to_nlc(TB, TC, TL, x, y);
}

void backend_op_upsample2x(bcheck *t) {
  size_t n = (size_t)UB * UH * UW, map[4 * UB * UH * UW];
  for (int p = 0; p < UB; p++)
    for (int i = 0; i < 2 * UH; i++)
      for (int j = 0; j < 2 * UW; j++)
        map[((size_t)p * 2 * UH + i) * 2 * UW + j] = ((size_t)p * UH + i / 2) * UW + j / 2;
  perm_case(t, "upsample2x", n, 4 * n, map, up_f, up_b);
}
void backend_op_patchify(bcheck *t) {
  const size_t n = (size_t)PB * PC * PH * PW;
  const int gh = PH / PP, gw = PW / PP, F = PC * PP * PP;
  size_t map[PB * PC * PH * PW], inv[PB * PC * PH * PW];
  for (int b = 0; b < PB; b++)
    for (int c = 0; c < PC; c++)
      for (int h = 0; h < PH; h++)
        for (int w = 0; w < PW; w++) {
          size_t xi = (((size_t)b * PC + c) * PH + h) * PW + w;
          size_t oi = ((size_t)b * gh * gw + (size_t)(h / PP) * gw + w / PP) * F +
                      ((size_t)c * PP + h % PP) * PP + w % PP;
          map[oi] = xi, inv[xi] = oi;
        }
  perm_case(t, "patchify", n, n, map, pat_f, pat_b);
  perm_case(t, "unpatchify", n, n, inv, unp_f, unp_b);
}
void backend_op_nchw_nlc(bcheck *t) {
  const size_t n = (size_t)TB * TC * TL;
  size_t map[TB * TC * TL], inv[TB * TC * TL];
  for (int b = 0; b < TB; b++)
    for (int c = 0; c < TC; c++)
      for (int l = 0; l < TL; l++) {
        size_t xi = ((size_t)b * TC + c) * TL + l, yi = ((size_t)b * TL + l) * TC + c;
        map[yi] = xi, inv[xi] = yi;
      }
  perm_case(t, "nchw_to_nlc", n, n, map, nlc_f, nlc_b);
  perm_case(t, "nlc_to_nchw", n, n, inv, nchw_f, nchw_b);
}

void backend_op_elementwise(bcheck *t) {
  const size_t n = 37;
  float *x = hrand(t, n, 1), *y0 = hrand(t, n, 1);
  double *ref = hd(t, NULL, n);
  float *y = dev(t, y0, n);
  t->be->add_inplace(n, y, dev(t, x, n));
  for (size_t i = 0; i < n; i++) ref[i] = (double)y0[i] + x[i];
  cmp(t, "add_inplace", back(t, y, n), ref, n);
  t->be->copy_in(y, y0, n * sizeof(float));
  t->be->scale_inplace(n, y, 0.37f);
  for (size_t i = 0; i < n; i++) ref[i] = (double)y0[i] * 0.37f;
  cmp(t, "scale_inplace", back(t, y, n), ref, n);
  t->be->copy_in(y, y0, n * sizeof(float));
  t->be->mul_inplace(n, y, dev(t, x, n));
  for (size_t i = 0; i < n; i++) ref[i] = (double)y0[i] * x[i];
  cmp(t, "mul_inplace", back(t, y, n), ref, n);
  t->be->copy_in(y, y0, n * sizeof(float));
  t->be->scale_inplace(n, y, 0.37f);
  t->be->zero(n - 3, y);
  float *z = back(t, y, n);
  for (size_t i = 0; i < n; i++) ref[i] = i < n - 3 ? 0.0 : (double)y0[i] * 0.37f;
  cmp(t, "zero", z, ref, n);
  /* a 3 x 4 block between padded buffers (ld 7 and 5); the rest untouched */
  float *src = hrand(t, 21, 1), *dst0 = hrand(t, 15, 1), *dst = dev(t, dst0, 15);
  double *r2 = hd(t, dst0, 15);
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 4; c++) r2[r * 5 + c] = src[r * 7 + c];
  t->be->copy_2d(3, 4, dev(t, src, 21), 7, dst, 5);
  cmp(t, "copy_2d", back(t, dst, 15), r2, 15);
  /* memory: backend -> backend copy, then back to the host */
  float *w = dev(t, x, n);
  t->be->copy(w, y, n * sizeof(float));
  t->be->synchronize();
  EXPECT(t, !memcmp(back(t, w, n), z, n * sizeof(float)), "copy: backend-to-backend copy differs");
}

typedef struct {
  int rows, cols, ldx, ldy;
  float lo, hi, *x, *r;
  double *y;
} clamp_c;
static void clamp_ref(clamp_c *c) {
  for (int i = 0; i < c->rows; i++)
    for (int j = 0; j < c->cols; j++)
      c->y[i * c->ldy + j] = fmin(fmax(c->x[i * c->ldx + j], c->lo), c->hi);
}
static double clamp_loss(void *p) {
  clamp_c *c = p;
  clamp_ref(c);
  return dot(c->y, c->r, (size_t)c->rows * c->ldy);
}
/* both orientations: a 3 x 4 overlap of 2 planes between padded tiles */
void backend_op_tile_blend(bcheck *t) {
  const int planes = 2, lda = 6, ldb = 5, e = 3;
  const size_t pa = 4 * lda + 1, pb = 5 * ldb + 2, na = planes * pa, nb = planes * pb;
  for (int vertical = 1; vertical >= 0; vertical--) {
    const int rows = vertical ? e : 4, cols = vertical ? 4 : e;
    float *a = hrand(t, na, 1), *b0 = hrand(t, nb, 1);
    double *ref = hd(t, b0, nb);
    for (int p = 0; p < planes; p++)
      for (int y = 0; y < rows; y++)
        for (int x = 0; x < cols; x++) {
          double s = (double)(vertical ? y : x) / e, av = a[p * pa + (size_t)y * lda + x];
          ref[p * pb + (size_t)y * ldb + x] = av * (1 - s) + b0[p * pb + (size_t)y * ldb + x] * s;
        }
    float *b = dev(t, b0, nb);
    t->be->tile_blend(planes, rows, cols, e, vertical, dev(t, a, na), pa, lda, b, pb, ldb);
    cmp(t, vertical ? "b (vertical)" : "b (horizontal)", back(t, b, nb), ref, nb);
  }
}

void backend_op_clamp(bcheck *t) {
  clamp_c c = {.rows = 3, .cols = 5, .ldx = 8, .ldy = 6, .lo = -1.0f, .hi = 1.5f};
  size_t nx = (size_t)c.rows * c.ldx, ny = (size_t)c.rows * c.ldy;
  c.x = hrand(t, nx, 3);
  for (size_t i = 0; i < nx; i++) /* keep finite differences off the kinks */
    if (fabsf(c.x[i] - c.lo) < 0.01f || fabsf(c.x[i] - c.hi) < 0.01f) c.x[i] += 0.05f;
  float *y0 = hrand(t, ny, 1);
  c.y = hd(t, y0, ny);
  clamp_ref(&c);
  float *x = dev(t, c.x, nx), *y = dev(t, y0, ny);
  t->be->clamp_fwd(c.rows, c.cols, x, c.ldx, c.lo, c.hi, y, c.ldy);
  cmp(t, "y", back(t, y, ny), c.y, ny);
  c.r = hrand(t, ny, 1);
  float *dx0 = hrand(t, nx, 1), *dx = dev(t, dx0, nx);
  t->be->clamp_bwd(c.rows, c.cols, x, c.ldx, c.lo, c.hi, dev(t, c.r, ny), c.ldy, dx, c.ldx);
  fd(t, "dx", c.x, c.rows, c.cols, c.ldx, diff(t, back(t, dx, nx), dx0, nx), clamp_loss, &c);
  /* NaN stays NaN and passes no gradient */
  float nan2[2] = {NAN, 0.5f}, one[2] = {1.0f, 1.0f}, *xn = dev(t, nan2, 2), *yn = dev(t, one, 2);
  float *dn = dev(t, one, 2);
  t->be->clamp_fwd(1, 2, xn, 2, c.lo, c.hi, yn, 2);
  t->be->clamp_bwd(1, 2, xn, 2, c.lo, c.hi, dev(t, one, 2), 2, dn, 2);
  float *ynh = back(t, yn, 2), *dnh = back(t, dn, 2);
  EXPECT(t, isnan(ynh[0]) && ynh[1] == 0.5f, "clamp(NaN) = %g, clamp(0.5) = %g", ynh[0], ynh[1]);
  EXPECT(t, dnh[0] == 1.0f && dnh[1] == 2.0f,
         "gradient through NaN %g (want 1: none), through 0.5 %g (want 2)", dnh[0], dnh[1]);
}

void backend_op_embedding(bcheck *t) {
  const int B = 2, T = 3, D = 5, V = 7, N = B * T;
  int32_t ids[6];
  for (int i = 0; i < N; i++) ids[i] = (int32_t)((frand(t) + 1.0f) * 3.5f) % V;
  float *tok = hrand(t, (size_t)V * D, 1), *pos = hrand(t, (size_t)(T + 1) * D, 1);
  float *y0 = hrand(t, (size_t)N * D, 1);
  double *ref = hd(t, NULL, (size_t)N * D);
  for (int r = 0; r < N; r++)
    for (int j = 0; j < D; j++) ref[r * D + j] = (double)tok[ids[r] * D + j] + pos[(r % T) * D + j];
  float *y = dev(t, y0, (size_t)N * D);
  t->be->embedding_fwd(N, T, D, ids, dev(t, tok, (size_t)V * D), dev(t, pos, (size_t)(T + 1) * D),
                       y);
  cmp(t, "y", back(t, y, (size_t)N * D), ref, (size_t)N * D);
}

void backend_op_timestep_embedding(bcheck *t) {
  const int B = 3, dim = 9, half = 4;
  const float max_period = 10000.0f, tf = 100.0f;
  float *ts = hpos(t, B, 0.0f), *o0 = hrand(t, (size_t)B * dim, 1);
  double *ref = hd(t, NULL, (size_t)B * dim);
  for (int b = 0; b < B; b++)
    for (int k = 0; k < half; k++) {
      double a = (double)tf * ts[b] * exp(-log((double)max_period) * k / half);
      ref[b * dim + k] = cos(a), ref[b * dim + half + k] = sin(a);
    }
  float *o = dev(t, o0, (size_t)B * dim);
  t->be->timestep_embedding(B, dev(t, ts, B), dim, max_period, tf, o);
  cmp(t, "embedding", back(t, o, (size_t)B * dim), ref, (size_t)B * dim);
}

typedef struct {
  size_t n;
  float *p, *q, dloss;
} mse_c;
static double mse_loss(void *v) {
  mse_c *c = v;
  double s = 0;
  for (size_t i = 0; i < c->n; i++) s += ((double)c->p[i] - c->q[i]) * ((double)c->p[i] - c->q[i]);
  return c->dloss * s / (double)c->n;
}
void backend_op_mse(bcheck *t) {
  mse_c c = {.n = 50, .dloss = 0.8f};
  c.p = hrand(t, c.n, 1), c.q = hrand(t, c.n, 1);
  float *dp = dev(t, hrand(t, c.n, 1), c.n);
  double got = t->be->mse_fwd_bwd(c.n, dev(t, c.p, c.n), dev(t, c.q, c.n), c.dloss, dp);
  float gotf = (float)(got * c.dloss);
  double ref = mse_loss(&c);
  cmp(t, "loss", &gotf, &ref, 1);
  FD1(t, "dpred", c.p, c.n, back(t, dp, c.n), mse_loss, &c);
}

/* ---------------------------------------------------------------- optimizer math */

void backend_op_optimizer_updates(bcheck *t) {
  const size_t n = 41;
  const float lr = 0.01f, b1 = 0.9f, b2 = 0.99f, eps = 1e-8f, wd = 0.1f;
  for (int kind = 0; kind < 8; kind++) {
    const long step = 1 + kind % 3;
    float *w0 = hrand(t, n, 1), *g = hrand(t, n, 1), *m0 = hpos(t, n, 0.01f),
          *v0 = hpos(t, n, 0.01f);
    double *w = hd(t, w0, n), *m = hd(t, m0, n), *v = hd(t, v0, n);
    float *dw = dev(t, w0, n), *dg = dev(t, g, n), *dm = dev(t, m0, n), *dv = dev(t, v0, n);
    const char *name = "";
    for (size_t i = 0; i < n; i++) {
      double wi = w[i], gi = g[i];
      if (kind <= 1) { /* 0: Adam (L2 in the gradient), 1: AdamW (decoupled) */
        gi += kind ? 0.0 : (double)wd * wi;
        wi *= kind ? 1.0 - (double)lr * wd : 1.0;
        m[i] = b1 * m[i] + (1.0 - b1) * gi;
        v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
        double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
        w[i] = wi - lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + eps);
      } else if (kind == 2) { /* Adagrad, lr_decay 0.05 */
        gi += wd * wi;
        m[i] += gi * gi;
        w[i] = wi - lr / (1.0 + (step - 1) * 0.05) * gi / (sqrt(m[i]) + eps);
      } else if (kind == 3) { /* Lion */
        double c = b1 * m[i] + (1.0 - b1) * gi;
        w[i] = wi * (1.0 - (double)lr * wd) - lr * (c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0);
        m[i] = b2 * m[i] + (1.0 - b2) * gi;
      } else if (kind == 4) { /* SGD without momentum */
        w[i] = wi - lr * (gi + wd * wi);
      } else if (kind <= 6) { /* SGD, momentum 0.9, dampening 0.1; 6: Nesterov */
        double d = gi + wd * wi, add = kind == 6 ? 1.0 : 0.9; /* 1 - dampening */
        m[i] = step == 1 ? d : 0.9 * m[i] + add * d;
        w[i] = wi - lr * (kind == 6 ? d + 0.9 * m[i] : m[i]);
      } else { /* EMA, decay 0.95 */
        m[i] = 0.95 * m[i] + (1.0 - 0.95) * wi;
      }
    }
    switch (kind) {
      case 0:
      case 1:
        name = kind ? "adamw" : "adam";
        t->be->adam_update(n, dw, dg, dm, dv, lr, b1, b2, eps, wd, kind, step);
        break;
      case 2:
        name = "adagrad";
        t->be->adagrad_update(n, dw, dg, dm, lr, 0.05f, eps, wd, step);
        break;
      case 3:
        name = "lion";
        t->be->lion_update(n, dw, dg, dm, lr, b1, b2, wd);
        break;
      case 4:
        name = "sgd";
        t->be->sgd_update(n, dw, dg, NULL, lr, 0.0f, 0.0f, 0, wd, step);
        break;
      case 5:
      case 6:
        name = kind == 6 ? "sgd (nesterov)" : "sgd (momentum)";
        if (kind == 6) { /* Nesterov requires dampening 0 */
          t->be->sgd_update(n, dw, dg, dm, lr, 0.9f, 0.0f, 1, wd, step);
          break;
        }
        t->be->sgd_update(n, dw, dg, dm, lr, 0.9f, 0.1f, 0, wd, step);
        break;
      default:
        name = "ema";
        t->be->ema_update(n, dm, dw, 0.95f);
    }
    char what[64];
    snprintf(what, sizeof what, "%s step %ld: weights", name, step);
    cmp(t, what, back(t, dw, n), w, n);
    snprintf(what, sizeof what, "%s step %ld: first state", name, step);
    cmp(t, what, back(t, dm, n), m, n);
    snprintf(what, sizeof what, "%s step %ld: second state", name, step);
    cmp(t, what, back(t, dv, n), v, n);
  }
}

void backend_op_sumsq(bcheck *t) {
  const size_t n = 70001; /* more than one chunk */
  float *x = hrand(t, n, 1);
  double ref = 0;
  for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
  float got = (float)(t->be->sumsq(n, dev(t, x, n)) / ref); /* relative: ~1 */
  const double one = 1.0;
  cmp(t, "sum of squares / reference", &got, &one, 1);
}

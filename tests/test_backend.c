/* Backend comparison (ggml's test-backend-ops): every op of every registered
 * compute backend (include/ctuner/backend.h) against plain-C references in
 * double written here, on small random shapes with padded leading dimensions.
 *
 * For each backend and each entry of the op table below: inputs are made on
 * the host, copied into backend memory (alloc, copy_in), the op runs there and
 * its outputs come back (copy_out). Forward results must match the reference;
 * outputs start from random values, so an op that accumulates where it should
 * overwrite (or the reverse) or writes outside its rows and columns fails.
 * Backward ops run with dy = r for a random r and must match central finite
 * differences of the scalar loss sum(r * y), y from the double reference.
 * Tolerances follow the backend's precision_bits. A new backend is covered by
 * its registry row alone; a new op needs a field check (BACKEND_OPS) and an
 * entry in ops[]. `backend.detects_broken_op` runs the same suite on a CPU
 * table with two ops sabotaged and requires exactly those to fail.
 * Here: the tests, the op table, GEMM, linear, attention, RoPE, the norms and
 * activations; tests/backend_ops_image.c: the image ops, the small
 * elementwise ops, embedding, loss and optimizer math; tests/backend_check.h:
 * the comparison helpers both use.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend_check.h"
#include "ctuner/backend.h"
#include "ctuner/optim.h"
#include "harness.h"

/* ---------------------------------------------------------------- GEMM, linear */

static void sgemm_case(bcheck *t, int det) {
  const int M = 70, N = 7, K = 9; /* M > 64: several row blocks of sgemm_deterministic */
  const float alpha = 0.7f;
  for (int c = 0; c < 8; c++) {
    int tA = c & 1, tB = (c >> 1) & 1;
    float beta = (c >> 2) ? 0.3f : 0.0f;
    int lda = (tA ? M : K) + 2, ldb = (tB ? K : N) + 1, ldc = N + 3;
    size_t na = (size_t)(tA ? K : M) * lda, nb = (size_t)(tB ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = hrand(t, na, 1), *B = hrand(t, nb, 1), *C = hrand(t, nc, 1);
    double *ref = hd(t, C, nc);
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        double s = 0;
        for (int k = 0; k < K; k++)
          s += (double)(tA ? A[k * lda + i] : A[i * lda + k]) *
               (tB ? B[j * ldb + k] : B[k * ldb + j]);
        ref[i * ldc + j] = alpha * s + (beta != 0.0f ? beta * (double)C[i * ldc + j] : 0.0);
      }
    float *dc = dev(t, C, nc);
    (det ? t->be->sgemm_deterministic : t->be->sgemm)(tA, tB, M, N, K, alpha, dev(t, A, na), lda,
                                                      dev(t, B, nb), ldb, beta, dc, ldc);
    char what[64];
    snprintf(what, sizeof what, "C (transA %d, transB %d, beta %g)", tA, tB, beta);
    cmp(t, what, back(t, dc, nc), ref, nc);
  }
}
static void op_sgemm(bcheck *t) {
  sgemm_case(t, 0);
}
static void op_sgemm_deterministic(bcheck *t) {
  sgemm_case(t, 1);
}

typedef struct {
  int N, K, M, ldx, ldy;
  float *x, *w, *b, *r;
  double *y;
} lin_c;
static void lin_ref(lin_c *c) {
  for (int n = 0; n < c->N; n++)
    for (int m = 0; m < c->M; m++) {
      double s = c->b[m];
      for (int k = 0; k < c->K; k++) s += (double)c->x[n * c->ldx + k] * c->w[m * c->K + k];
      c->y[n * c->ldy + m] = s;
    }
}
static double lin_loss(void *p) {
  lin_c *c = p;
  lin_ref(c);
  return dot(c->y, c->r, (size_t)c->N * c->ldy);
}
static void op_linear(bcheck *t) {
  lin_c c = {.N = 5, .K = 7, .M = 6, .ldx = 9, .ldy = 8};
  size_t nx = (size_t)c.N * c.ldx, ny = (size_t)c.N * c.ldy, nw = (size_t)c.M * c.K;
  c.x = hrand(t, nx, 1), c.w = hrand(t, nw, 0.5f), c.b = hrand(t, c.M, 0.5f);
  float *y0 = hrand(t, ny, 1);
  c.y = hd(t, y0, ny);
  lin_ref(&c);
  float *x = dev(t, c.x, nx), *w = dev(t, c.w, nw), *y = dev(t, y0, ny);
  t->be->linear_fwd(c.N, c.K, c.M, x, c.ldx, w, dev(t, c.b, c.M), y, c.ldy);
  cmp(t, "y", back(t, y, ny), c.y, ny);
  /* dx = 1 * dx + dy w, dw +=, db += */
  c.r = hrand(t, ny, 1);
  float *dx0 = hrand(t, nx, 1), *dw0 = hrand(t, nw, 1), *db0 = hrand(t, c.M, 1);
  float *dx = dev(t, dx0, nx), *dw = dev(t, dw0, nw), *db = dev(t, db0, c.M);
  t->be->linear_bwd(c.N, c.K, c.M, x, c.ldx, w, dev(t, c.r, ny), c.ldy, dx, c.ldx, 1.0f, dw, db);
  fd(t, "dx", c.x, c.N, c.K, c.ldx, diff(t, back(t, dx, nx), dx0, nx), lin_loss, &c);
  FD1(t, "dw", c.w, nw, diff(t, back(t, dw, nw), dw0, nw), lin_loss, &c);
  FD1(t, "db", c.b, c.M, diff(t, back(t, db, c.M), db0, c.M), lin_loss, &c);
}

/* ---------------------------------------------------------------- attention, rope */

typedef struct {
  int B, H, L, hd, causal;
  float scale, *q, *k, *v, *r;
  double *o, *lse;
} att_c;
static void att_ref(att_c *c) {
  const int L = c->L, hd = c->hd, ldo = c->H * hd;
  double *s = malloc((size_t)L * sizeof *s);
  for (int bh = 0; bh < c->B * c->H; bh++)
    for (int i = 0; i < L; i++) {
      int b = bh / c->H, h = bh % c->H, n = c->causal ? i + 1 : L;
      const float *qi = c->q + ((size_t)bh * L + i) * hd;
      double m = -INFINITY, sum = 0;
      for (int j = 0; j < n; j++) {
        double a = 0;
        for (int e = 0; e < hd; e++) a += (double)qi[e] * c->k[((size_t)bh * L + j) * hd + e];
        s[j] = c->scale * a;
        m = fmax(m, s[j]);
      }
      for (int j = 0; j < n; j++) sum += exp(s[j] - m);
      c->lse[(size_t)bh * L + i] = m + log(sum);
      for (int e = 0; e < hd; e++) {
        double a = 0;
        for (int j = 0; j < n; j++) a += exp(s[j] - m) / sum * c->v[((size_t)bh * L + j) * hd + e];
        c->o[((size_t)b * L + i) * ldo + (size_t)h * hd + e] = a;
      }
    }
  free(s);
}
static double att_loss(void *p) {
  att_c *c = p;
  att_ref(c);
  return dot(c->o, c->r, (size_t)c->B * c->L * c->H * c->hd);
}
static void op_attention(bcheck *t) {
  for (int causal = 0; causal < 2; causal++) {
    att_c c = {.B = 2, .H = 2, .L = 5, .hd = 4, .causal = causal, .scale = 0.6f};
    size_t n = (size_t)c.B * c.H * c.L * c.hd, nl = (size_t)c.B * c.H * c.L;
    c.q = hrand(t, n, 1), c.k = hrand(t, n, 1), c.v = hrand(t, n, 1);
    float *o0 = hrand(t, n, 1), *l0 = hrand(t, nl, 1);
    c.o = hd(t, NULL, n), c.lse = hd(t, NULL, nl);
    att_ref(&c);
    float *q = dev(t, c.q, n), *k = dev(t, c.k, n), *v = dev(t, c.v, n);
    float *o = dev(t, o0, n), *lse = dev(t, l0, nl);
    t->be->attention_fwd(c.B, c.H, c.L, c.hd, c.scale, causal, q, k, v, o, lse);
    cmp(t, causal ? "o (causal)" : "o", back(t, o, n), c.o, n);
    cmp(t, causal ? "lse (causal)" : "lse", back(t, lse, nl), c.lse, nl);
    c.r = hrand(t, n, 1);
    float *dq = dev(t, o0, n), *dk = dev(t, o0, n), *dv = dev(t, o0, n); /* overwritten */
    t->be->attention_bwd(c.B, c.H, c.L, c.hd, c.scale, causal, q, k, v, o, lse, dev(t, c.r, n), dq,
                         dk, dv);
    FD1(t, causal ? "dq (causal)" : "dq", c.q, n, back(t, dq, n), att_loss, &c);
    FD1(t, causal ? "dk (causal)" : "dk", c.k, n, back(t, dk, n), att_loss, &c);
    FD1(t, causal ? "dv (causal)" : "dv", c.v, n, back(t, dv, n), att_loss, &c);
  }
}

/* Cross-attention: Lq = 70 queries (two tiles) against Lk = 3 keys and values. */
typedef struct {
  int B, H, Lq, Lk, hd;
  float scale, *q, *k, *v, *r;
  double *o, *lse;
} xatt_c;
static void xatt_ref(xatt_c *c) {
  const int Lq = c->Lq, Lk = c->Lk, hd = c->hd, ldo = c->H * hd;
  double *s = malloc((size_t)Lk * sizeof *s);
  for (int bh = 0; bh < c->B * c->H; bh++)
    for (int i = 0; i < Lq; i++) {
      const int b = bh / c->H, h = bh % c->H;
      const float *qi = c->q + ((size_t)bh * Lq + i) * hd;
      double m = -INFINITY, sum = 0;
      for (int j = 0; j < Lk; j++) {
        double a = 0;
        for (int e = 0; e < hd; e++) a += (double)qi[e] * c->k[((size_t)bh * Lk + j) * hd + e];
        s[j] = c->scale * a;
        m = fmax(m, s[j]);
      }
      for (int j = 0; j < Lk; j++) sum += exp(s[j] - m);
      c->lse[(size_t)bh * Lq + i] = m + log(sum);
      for (int e = 0; e < hd; e++) {
        double a = 0;
        for (int j = 0; j < Lk; j++)
          a += exp(s[j] - m) / sum * c->v[((size_t)bh * Lk + j) * hd + e];
        c->o[((size_t)b * Lq + i) * ldo + (size_t)h * hd + e] = a;
      }
    }
  free(s);
}
static double xatt_loss(void *p) {
  xatt_c *c = p;
  xatt_ref(c);
  return dot(c->o, c->r, (size_t)c->B * c->Lq * c->H * c->hd);
}
static void op_attention_cross(bcheck *t) {
  xatt_c c = {.B = 2, .H = 2, .Lq = 70, .Lk = 3, .hd = 4, .scale = 0.6f};
  const size_t nq = (size_t)c.B * c.H * c.Lq * c.hd, nk = (size_t)c.B * c.H * c.Lk * c.hd,
               nl = (size_t)c.B * c.H * c.Lq;
  c.q = hrand(t, nq, 1), c.k = hrand(t, nk, 1), c.v = hrand(t, nk, 1);
  float *o0 = hrand(t, nq, 1), *l0 = hrand(t, nl, 1);
  c.o = hd(t, NULL, nq), c.lse = hd(t, NULL, nl);
  xatt_ref(&c);
  float *q = dev(t, c.q, nq), *k = dev(t, c.k, nk), *v = dev(t, c.v, nk);
  float *o = dev(t, o0, nq), *lse = dev(t, l0, nl);
  t->be->attention_cross_fwd(c.B, c.H, c.Lq, c.Lk, c.hd, c.scale, q, k, v, o, lse);
  cmp(t, "o", back(t, o, nq), c.o, nq);
  cmp(t, "lse", back(t, lse, nl), c.lse, nl);
  c.r = hrand(t, nq, 1);
  float *dq = dev(t, o0, nq), *dk = dev(t, o0, nk), *dv = dev(t, o0, nk); /* overwritten */
  t->be->attention_cross_bwd(c.B, c.H, c.Lq, c.Lk, c.hd, c.scale, q, k, v, o, lse, dev(t, c.r, nq),
                             dq, dk, dv);
  FD1(t, "dq", c.q, nq, back(t, dq, nq), xatt_loss, &c);
  FD1(t, "dk", c.k, nk, back(t, dk, nk), xatt_loss, &c);
  FD1(t, "dv", c.v, nk, back(t, dv, nk), xatt_loss, &c);
}

/* Masked joint attention (Chroma): L = 70 spans two query tiles; batch 0 has
 * tokens 2, 3 and 40 as padding, batch 1 none. Both meanings of the mask:
 * boolean (padding queries give 0) and additive (m_i m_j added). */
typedef struct {
  int B, H, L, hd, additive;
  float scale, *q, *k, *v, *r, *m;
  double *o, *lse;
} matt_c;
static void matt_ref(matt_c *c) {
  const int L = c->L, hd = c->hd, ldo = c->H * hd;
  double *s = malloc((size_t)L * sizeof *s);
  for (int bh = 0; bh < c->B * c->H; bh++)
    for (int i = 0; i < L; i++) {
      const int b = bh / c->H, h = bh % c->H;
      const float *qi = c->q + ((size_t)bh * L + i) * hd, *m = c->m + (size_t)b * L;
      double mx = -INFINITY, sum = 0;
      for (int j = 0; j < L; j++) {
        double a = 0;
        for (int e = 0; e < hd; e++) a += (double)qi[e] * c->k[((size_t)bh * L + j) * hd + e];
        s[j] = c->scale * a + (c->additive ? (double)m[i] * m[j] : 0.0);
        if (!c->additive && !(m[i] != 0 && m[j] != 0)) s[j] = -INFINITY;
        mx = fmax(mx, s[j]);
      }
      double *orow = c->o + ((size_t)b * L + i) * ldo + (size_t)h * hd;
      if (mx == -INFINITY) { /* a fully masked query: 0, lse 0 */
        c->lse[(size_t)bh * L + i] = 0;
        for (int e = 0; e < hd; e++) orow[e] = 0;
        continue;
      }
      for (int j = 0; j < L; j++) sum += exp(s[j] - mx);
      c->lse[(size_t)bh * L + i] = mx + log(sum);
      for (int e = 0; e < hd; e++) {
        double a = 0;
        for (int j = 0; j < L; j++) a += exp(s[j] - mx) / sum * c->v[((size_t)bh * L + j) * hd + e];
        orow[e] = a;
      }
    }
  free(s);
}
static double matt_loss(void *p) {
  matt_c *c = p;
  matt_ref(c);
  return dot(c->o, c->r, (size_t)c->B * c->L * c->H * c->hd);
}
static void op_attention_mask(bcheck *t) {
  for (int additive = 0; additive < 2; additive++) {
    matt_c c = {.B = 2, .H = 2, .L = 70, .hd = 4, .additive = additive, .scale = 0.6f};
    size_t n = (size_t)c.B * c.H * c.L * c.hd, nl = (size_t)c.B * c.H * c.L, nm = 2 * 70;
    c.q = hrand(t, n, 1), c.k = hrand(t, n, 1), c.v = hrand(t, n, 1);
    c.m = hrand(t, nm, 1);
    for (size_t j = 0; j < nm; j++) c.m[j] = (j == 2 || j == 3 || j == 40) ? 0.0f : 1.0f;
    float *o0 = hrand(t, n, 1), *l0 = hrand(t, nl, 1);
    c.o = hd(t, NULL, n), c.lse = hd(t, NULL, nl);
    matt_ref(&c);
    float *q = dev(t, c.q, n), *k = dev(t, c.k, n), *v = dev(t, c.v, n);
    float *o = dev(t, o0, n), *lse = dev(t, l0, nl), *m = dev(t, c.m, nm);
    t->be->attention_mask_fwd(c.B, c.H, c.L, c.hd, c.scale, m, additive, q, k, v, o, lse);
    cmp(t, additive ? "o (additive)" : "o (boolean)", back(t, o, n), c.o, n);
    cmp(t, additive ? "lse (additive)" : "lse (boolean)", back(t, lse, nl), c.lse, nl);
    c.r = hrand(t, n, 1);
    float *dq = dev(t, o0, n), *dk = dev(t, o0, n), *dv = dev(t, o0, n); /* overwritten */
    t->be->attention_mask_bwd(c.B, c.H, c.L, c.hd, c.scale, m, additive, q, k, v, o, lse,
                              dev(t, c.r, n), dq, dk, dv);
    FD1(t, additive ? "dq (additive)" : "dq (boolean)", c.q, n, back(t, dq, n), matt_loss, &c);
    FD1(t, additive ? "dk (additive)" : "dk (boolean)", c.k, n, back(t, dk, n), matt_loss, &c);
    FD1(t, additive ? "dv (additive)" : "dv (boolean)", c.v, n, back(t, dv, n), matt_loss, &c);
  }
}

static void op_rope_table(bcheck *t) {
  const int L = 4, axes[3] = {2, 4, 2}, half = 4;
  const float theta = 100.0f;
  int pos[12];
  for (int i = 0; i < 12; i++) pos[i] = (int)((frand(t) + 1.0f) * 8.0f);
  float *pe0 = hrand(t, (size_t)L * half * 2, 1);
  double *ref = hd(t, NULL, (size_t)L * half * 2);
  for (int l = 0; l < L; l++)
    for (int i = 0, p = 0; i < 3; i++)
      for (int j = 0; j < axes[i] / 2; j++, p++) {
        double a = pos[l * 3 + i] * pow(theta, -(double)(2 * j) / axes[i]);
        ref[(l * half + p) * 2] = cos(a);
        ref[(l * half + p) * 2 + 1] = sin(a);
      }
  float *pe = dev(t, pe0, (size_t)L * half * 2);
  t->be->rope_table(L, pos, axes, theta, pe);
  cmp(t, "pe", back(t, pe, (size_t)L * half * 2), ref, (size_t)L * half * 2);
}

/* a table of (cos, sin) of random angles: (L, D/2, 2) */
static float *rand_pe(bcheck *t, int L, int D) {
  float *pe = hrand(t, (size_t)L * D, 1);
  for (int i = 0; i < L * D / 2; i++) {
    double a = 3.0 * pe[2 * i];
    pe[2 * i] = (float)cos(a), pe[2 * i + 1] = (float)sin(a);
  }
  return pe;
}

typedef struct {
  int N, L, D, ldx, ldy;
  float *pe, *x, *r;
  double *y;
} rope_c;
static void rope_ref(rope_c *c) {
  for (int n = 0; n < c->N; n++)
    for (int j = 0; j < c->D / 2; j++) {
      const float *pe = c->pe + (size_t)(n % c->L) * c->D + 2 * j,
                  *x = c->x + (size_t)n * c->ldx + 2 * j;
      c->y[n * c->ldy + 2 * j] = (double)pe[0] * x[0] - (double)pe[1] * x[1];
      c->y[n * c->ldy + 2 * j + 1] = (double)pe[1] * x[0] + (double)pe[0] * x[1];
    }
}
static double rope_loss(void *p) {
  rope_c *c = p;
  rope_ref(c);
  return dot(c->y, c->r, (size_t)c->N * c->ldy);
}
static void op_rope(bcheck *t) {
  rope_c c = {.N = 6, .L = 3, .D = 8, .ldx = 10, .ldy = 9};
  size_t nx = (size_t)c.N * c.ldx, ny = (size_t)c.N * c.ldy;
  c.pe = rand_pe(t, c.L, c.D), c.x = hrand(t, nx, 1);
  float *y0 = hrand(t, ny, 1), *dx0 = hrand(t, nx, 1);
  c.y = hd(t, y0, ny);
  rope_ref(&c);
  float *pe = dev(t, c.pe, (size_t)c.L * c.D), *y = dev(t, y0, ny);
  t->be->rope_fwd(c.N, c.L, c.D, pe, dev(t, c.x, nx), c.ldx, y, c.ldy);
  cmp(t, "y", back(t, y, ny), c.y, ny);
  c.r = hrand(t, ny, 1);
  float *dx = dev(t, dx0, nx);
  t->be->rope_bwd(c.N, c.L, c.D, pe, dev(t, c.r, ny), c.ldy, dx, c.ldx);
  fd(t, "dx", c.x, c.N, c.D, c.ldx, back(t, dx, nx), rope_loss, &c);
}

typedef struct {
  int B, Ls, Lt, off, H, hd;
  float *qkv, *qs, *ks, *pe, *rq, *rk, *rv;
  double *q, *k, *v, *sq, *sk;
} qkv_c;
static void qkv_ref(qkv_c *c) {
  const int H = c->H, hd = c->hd;
  for (int rr = 0; rr < c->B * c->Ls; rr++) {
    int b = rr / c->Ls, p = c->off + rr % c->Ls;
    const float *pe = c->pe + (size_t)p * hd;
    for (int h = 0; h < H; h++) {
      size_t o = (((size_t)b * H + h) * c->Lt + p) * hd;
      for (int w = 0; w < 2; w++) {
        const float *x = c->qkv + (size_t)rr * 3 * H * hd + (size_t)(w * H + h) * hd;
        const float *s = w ? c->ks : c->qs;
        double *out = w ? c->k : c->q, ss = 0;
        for (int j = 0; j < hd; j++) ss += (double)x[j] * x[j];
        double rs = 1.0 / sqrt(ss / hd + 1e-6);
        (w ? c->sk : c->sq)[(size_t)rr * H + h] = rs;
        for (int j = 0; j < hd / 2; j++) {
          double x0 = x[2 * j] * rs * s[2 * j], x1 = x[2 * j + 1] * rs * s[2 * j + 1];
          out[o + 2 * j] = pe[2 * j] * x0 - pe[2 * j + 1] * x1;
          out[o + 2 * j + 1] = pe[2 * j + 1] * x0 + pe[2 * j] * x1;
        }
      }
      for (int j = 0; j < hd; j++)
        c->v[o + j] = c->qkv[(size_t)rr * 3 * H * hd + (size_t)(2 * H + h) * hd + j];
    }
  }
}
static double qkv_loss(void *p) {
  qkv_c *c = p;
  qkv_ref(c);
  size_t n = (size_t)c->B * c->H * c->Lt * c->hd;
  return dot(c->q, c->rq, n) + dot(c->k, c->rk, n) + dot(c->v, c->rv, n);
}
static void op_qkv_heads(bcheck *t) {
  qkv_c c = {.B = 2, .Ls = 3, .Lt = 5, .off = 1, .H = 2, .hd = 4};
  size_t nqkv = (size_t)c.B * c.Ls * 3 * c.H * c.hd, n = (size_t)c.B * c.H * c.Lt * c.hd;
  size_t ns = (size_t)c.B * c.Ls * c.H;
  c.qkv = hrand(t, nqkv, 1), c.qs = hrand(t, c.hd, 1), c.ks = hrand(t, c.hd, 1);
  c.pe = rand_pe(t, c.Lt, c.hd);
  float *o0 = hrand(t, n, 1), *s0 = hrand(t, ns, 1);
  c.q = hd(t, o0, n), c.k = hd(t, o0, n), c.v = hd(t, o0, n), c.sq = hd(t, s0, ns),
  c.sk = hd(t, s0, ns);
  qkv_ref(&c);
  float *qkv = dev(t, c.qkv, nqkv), *qs = dev(t, c.qs, c.hd), *ks = dev(t, c.ks, c.hd);
  float *pe = dev(t, c.pe, (size_t)c.Lt * c.hd);
  float *q = dev(t, o0, n), *k = dev(t, o0, n), *v = dev(t, o0, n), *sq = dev(t, s0, ns),
        *sk = dev(t, s0, ns);
  t->be->qkv_heads_fwd(c.B, c.Ls, c.Lt, c.off, c.H, c.hd, qkv, qs, ks, pe, q, k, v, sq, sk);
  cmp(t, "q", back(t, q, n), c.q, n);
  cmp(t, "k", back(t, k, n), c.k, n);
  cmp(t, "v", back(t, v, n), c.v, n);
  cmp(t, "rstd_q", back(t, sq, ns), c.sq, ns);
  cmp(t, "rstd_k", back(t, sk, ns), c.sk, ns);
  c.rq = hrand(t, n, 1), c.rk = hrand(t, n, 1), c.rv = hrand(t, n, 1);
  float *dqkv = dev(t, hrand(t, nqkv, 1), nqkv); /* overwritten */
  float *dqs0 = hrand(t, c.hd, 1), *dks0 = hrand(t, c.hd, 1);
  float *dqs = dev(t, dqs0, c.hd), *dks = dev(t, dks0, c.hd);
  t->be->qkv_heads_bwd(c.B, c.Ls, c.Lt, c.off, c.H, c.hd, qkv, qs, ks, pe, sq, sk, dev(t, c.rq, n),
                       dev(t, c.rk, n), dev(t, c.rv, n), dqkv, dqs, dks);
  FD1(t, "dqkv", c.qkv, nqkv, back(t, dqkv, nqkv), qkv_loss, &c);
  FD1(t, "dqscale", c.qs, c.hd, diff(t, back(t, dqs, c.hd), dqs0, c.hd), qkv_loss, &c);
  FD1(t, "dkscale", c.ks, c.hd, diff(t, back(t, dks, c.hd), dks0, c.hd), qkv_loss, &c);
}

/* ---------------------------------------------------------------- normalisations */

typedef struct {
  int B, L, D, ldx, ldm, ldh, mod;
  float eps, *x, *m, *r; /* m: shift at b*ldm, scale at b*ldm + D */
  double *xhat, *rstd, *h;
} ln_c;
static void ln_ref(ln_c *c) {
  for (int n = 0; n < c->B * c->L; n++) {
    const float *x = c->x + (size_t)n * c->ldx, *m = c->m + (size_t)(n / c->L) * c->ldm;
    double mu = 0, var = 0;
    for (int j = 0; j < c->D; j++) mu += x[j];
    mu /= c->D;
    for (int j = 0; j < c->D; j++) var += (x[j] - mu) * (x[j] - mu);
    double rs = 1.0 / sqrt(var / c->D + c->eps);
    c->rstd[n] = rs;
    for (int j = 0; j < c->D; j++) {
      double xh = (x[j] - mu) * rs;
      c->xhat[(size_t)n * c->D + j] = xh;
      c->h[(size_t)n * c->ldh + j] = c->mod ? (1.0 + m[c->D + j]) * xh + m[j] : xh;
    }
  }
}
static double ln_loss(void *p) {
  ln_c *c = p;
  ln_ref(c);
  return dot(c->h, c->r, (size_t)c->B * c->L * c->ldh);
}
static void op_ln_mod(bcheck *t) {
  for (int mod = 1; mod >= 0; mod--) {
    ln_c c = {.B = 2, .L = 3, .D = 6, .ldx = 8, .ldm = 18, .ldh = 7, .mod = mod, .eps = 1e-5f};
    const int N = c.B * c.L;
    size_t nx = (size_t)N * c.ldx, nh = (size_t)N * c.ldh, nm = (size_t)c.B * c.ldm,
           nxh = (size_t)N * c.D;
    c.x = hrand(t, nx, 1), c.m = hrand(t, nm, 0.5f);
    float *h0 = hrand(t, nh, 1), *xh0 = hrand(t, nxh, 1), *rs0 = hrand(t, N, 1);
    c.h = hd(t, h0, nh), c.xhat = hd(t, xh0, nxh), c.rstd = hd(t, rs0, N);
    ln_ref(&c);
    float *m = dev(t, c.m, nm), *shift = mod ? m : NULL, *scale = mod ? m + c.D : NULL;
    float *xhat = dev(t, xh0, nxh), *rstd = dev(t, rs0, N), *h = dev(t, h0, nh);
    t->be->ln_mod_fwd(c.B, c.L, c.D, dev(t, c.x, nx), c.ldx, shift, scale, c.ldm, c.eps, xhat, rstd,
                      h, c.ldh);
    cmp(t, mod ? "h" : "h (no modulation)", back(t, h, nh), c.h, nh);
    cmp(t, "xhat", back(t, xhat, nxh), c.xhat, nxh);
    cmp(t, "rstd", back(t, rstd, N), c.rstd, N);
    c.r = hrand(t, nh, 1);
    float *dx0 = hrand(t, nx, 1), *dm0 = hrand(t, nm, 1);
    float *dx = dev(t, dx0, nx), *dm = dev(t, dm0, nm);
    t->be->ln_mod_bwd(c.B, c.L, c.D, xhat, rstd, scale, c.ldm, dev(t, c.r, nh), c.ldh, dx, c.ldx,
                      mod ? dm : NULL, mod ? dm + c.D : NULL);
    fd(t, mod ? "dx" : "dx (no modulation)", c.x, N, c.D, c.ldx, diff(t, back(t, dx, nx), dx0, nx),
       ln_loss, &c);
    if (mod)
      fd(t, "dshift, dscale", c.m, c.B, 2 * c.D, c.ldm, diff(t, back(t, dm, nm), dm0, nm), ln_loss,
         &c);
  }
}

static void op_layernorm_affine(bcheck *t) {
  const int N = 4, D = 6, ldx = 8, ldy = 7;
  const float eps = 1e-5f;
  float *x = hrand(t, (size_t)N * ldx, 1), *g = hrand(t, D, 1), *b = hrand(t, D, 1);
  float *y0 = hrand(t, (size_t)N * ldy, 1);
  double *ref = hd(t, y0, (size_t)N * ldy);
  for (int n = 0; n < N; n++) {
    double mu = 0, var = 0;
    for (int j = 0; j < D; j++) mu += x[n * ldx + j];
    mu /= D;
    for (int j = 0; j < D; j++) var += (x[n * ldx + j] - mu) * (x[n * ldx + j] - mu);
    for (int j = 0; j < D; j++)
      ref[n * ldy + j] = (x[n * ldx + j] - mu) / sqrt(var / D + eps) * g[j] + b[j];
  }
  float *y = dev(t, y0, (size_t)N * ldy);
  t->be->layernorm_affine_fwd(N, D, dev(t, x, (size_t)N * ldx), ldx, dev(t, g, D), dev(t, b, D),
                              eps, y, ldy);
  cmp(t, "y", back(t, y, (size_t)N * ldy), ref, (size_t)N * ldy);
}

typedef struct {
  int N, D, ldx, ldy;
  float eps, *x, *s, *r;
  double *y, *rstd;
} rms_c;
static void rms_ref(rms_c *c) {
  for (int n = 0; n < c->N; n++) {
    double ss = 0;
    for (int j = 0; j < c->D; j++) ss += (double)c->x[n * c->ldx + j] * c->x[n * c->ldx + j];
    double rs = 1.0 / sqrt(ss / c->D + c->eps);
    c->rstd[n] = rs;
    for (int j = 0; j < c->D; j++) c->y[n * c->ldy + j] = c->x[n * c->ldx + j] * rs * c->s[j];
  }
}
static double rms_loss(void *p) {
  rms_c *c = p;
  rms_ref(c);
  return dot(c->y, c->r, (size_t)c->N * c->ldy);
}
static void op_rmsnorm(bcheck *t) {
  rms_c c = {.N = 4, .D = 6, .ldx = 8, .ldy = 7, .eps = 1e-5f};
  size_t nx = (size_t)c.N * c.ldx, ny = (size_t)c.N * c.ldy;
  c.x = hrand(t, nx, 1), c.s = hrand(t, c.D, 1);
  float *y0 = hrand(t, ny, 1), *r0 = hrand(t, c.N, 1);
  c.y = hd(t, y0, ny), c.rstd = hd(t, r0, c.N);
  rms_ref(&c);
  float *x = dev(t, c.x, nx), *s = dev(t, c.s, c.D), *y = dev(t, y0, ny), *rstd = dev(t, r0, c.N);
  t->be->rmsnorm_fwd(c.N, c.D, x, c.ldx, s, c.eps, y, c.ldy, rstd);
  cmp(t, "y", back(t, y, ny), c.y, ny);
  cmp(t, "rstd", back(t, rstd, c.N), c.rstd, c.N);
  c.r = hrand(t, ny, 1);
  float *dx0 = hrand(t, nx, 1), *ds0 = hrand(t, c.D, 1), *dx = dev(t, dx0, nx),
        *ds = dev(t, ds0, c.D);
  t->be->rmsnorm_bwd(c.N, c.D, x, c.ldx, s, rstd, dev(t, c.r, ny), c.ldy, dx, c.ldx, ds);
  fd(t, "dx", c.x, c.N, c.D, c.ldx, diff(t, back(t, dx, nx), dx0, nx), rms_loss, &c);
  FD1(t, "dscale", c.s, c.D, diff(t, back(t, ds, c.D), ds0, c.D), rms_loss, &c);
}

/* ---------------------------------------------------------------- activations, elementwise */

enum { ACT_SILU, ACT_GELU, ACT_QUICK, ACT_ERF };
typedef struct {
  int kind, N, D, ldx, ldy;
  float *x, *r;
  double *y;
} act_c;
static double act_f(int kind, double v) {
  if (kind == ACT_SILU) return v / (1.0 + exp(-v));
  if (kind == ACT_QUICK) return v / (1.0 + exp(-1.702 * v));
  if (kind == ACT_ERF) return 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
  return 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
}
static double act_loss(void *p) {
  act_c *c = p;
  for (int n = 0; n < c->N; n++)
    for (int j = 0; j < c->D; j++) c->y[n * c->ldy + j] = act_f(c->kind, c->x[n * c->ldx + j]);
  return c->r ? dot(c->y, c->r, (size_t)c->N * c->ldy)
              : 0; /* r: set for the gradient checks only */
}
static void act_case(bcheck *t, int kind) {
  static const char *names[] = {"silu", "gelu_tanh", "quick_gelu", "gelu_erf"};
  act_c c = {.kind = kind, .N = 3, .D = 5, .ldx = 7, .ldy = 6};
  size_t nx = (size_t)c.N * c.ldx, ny = (size_t)c.N * c.ldy;
  c.x = hrand(t, nx, 3);
  float *y0 = hrand(t, ny, 1);
  c.y = hd(t, y0, ny);
  act_loss(&c);
  float *x = dev(t, c.x, nx), *y = dev(t, y0, ny);
  const ct_backend_ops *be = t->be;
  (kind == ACT_SILU    ? be->silu_fwd
   : kind == ACT_GELU  ? be->gelu_tanh_fwd
   : kind == ACT_QUICK ? be->quick_gelu_fwd
                       : be->gelu_erf_fwd)(c.N, c.D, x, c.ldx, y, c.ldy);
  char what[64];
  snprintf(what, sizeof what, "%s: y", names[kind]);
  cmp(t, what, back(t, y, ny), c.y, ny);
  if (kind == ACT_QUICK) return; /* forward only (text encoder) */
  c.r = hrand(t, ny, 1);
  float *dx = dev(t, hrand(t, nx, 1), nx);
  (kind == ACT_SILU   ? be->silu_bwd
   : kind == ACT_GELU ? be->gelu_tanh_bwd
                      : be->gelu_erf_bwd)(c.N, c.D, x, c.ldx, dev(t, c.r, ny), c.ldy, dx, c.ldx);
  snprintf(what, sizeof what, "%s: dx", names[kind]);
  fd(t, what, c.x, c.N, c.D, c.ldx, back(t, dx, nx), act_loss, &c);
}
static void op_silu(bcheck *t) {
  act_case(t, ACT_SILU);
}
static void op_gelu_tanh(bcheck *t) {
  act_case(t, ACT_GELU);
}
static void op_quick_gelu(bcheck *t) {
  act_case(t, ACT_QUICK);
}
static void op_gelu_erf(bcheck *t) {
  act_case(t, ACT_ERF);
}

typedef struct {
  int B, L, D, ldx, ldg, ldy, ldo;
  float *x, *g, *y, *r;
  double *out;
} gate_c;
static double gate_loss(void *p) {
  gate_c *c = p;
  for (int n = 0; n < c->B * c->L; n++)
    for (int j = 0; j < c->D; j++)
      c->out[n * c->ldo + j] =
          c->x[n * c->ldx + j] + (double)c->g[(n / c->L) * c->ldg + j] * c->y[n * c->ldy + j];
  return dot(c->out, c->r, (size_t)c->B * c->L * c->ldo);
}
static void op_gate_res(bcheck *t) {
  gate_c c = {.B = 2, .L = 3, .D = 5, .ldx = 7, .ldg = 9, .ldy = 6, .ldo = 8};
  const int N = c.B * c.L;
  size_t nx = (size_t)N * c.ldx, ng = (size_t)c.B * c.ldg, ny = (size_t)N * c.ldy,
         no = (size_t)N * c.ldo;
  c.x = hrand(t, nx, 1), c.g = hrand(t, ng, 1), c.y = hrand(t, ny, 1);
  float *o0 = hrand(t, no, 1);
  c.out = hd(t, o0, no);
  gate_loss(&c);
  float *g = dev(t, c.g, ng), *y = dev(t, c.y, ny), *out = dev(t, o0, no);
  t->be->gate_res_fwd(c.B, c.L, c.D, dev(t, c.x, nx), c.ldx, g, c.ldg, y, c.ldy, out, c.ldo);
  cmp(t, "out", back(t, out, no), c.out, no);
  c.r = hrand(t, no, 1);
  float *dg0 = hrand(t, ng, 1), *dy = dev(t, hrand(t, ny, 1), ny), *dg = dev(t, dg0, ng);
  t->be->gate_res_bwd(c.B, c.L, c.D, g, c.ldg, y, c.ldy, dev(t, c.r, no), c.ldo, dy, c.ldy, dg);
  fd(t, "dy", c.y, N, c.D, c.ldy, back(t, dy, ny), gate_loss, &c);
  fd(t, "dgate", c.g, c.B, c.D, c.ldg, diff(t, back(t, dg, ng), dg0, ng), gate_loss, &c);
}

/* Biased attention (T5), forward only: L = 70 spans two query tiles of the
 * kernel; the bias differs per head, query and key. */
static void op_attention_bias(bcheck *t) {
  const int B = 2, H = 3, L = 70, dk = 4, ldo = H * dk;
  const float scale = 0.8f;
  size_t n = (size_t)B * H * L * dk, nb = (size_t)H * L * L;
  float *q = hrand(t, n, 1), *k = hrand(t, n, 1), *v = hrand(t, n, 1), *bias = hrand(t, nb, 2);
  double *ref = hd(t, NULL, n), *s = hd(t, NULL, (size_t)L);
  for (int bh = 0; bh < B * H; bh++)
    for (int i = 0; i < L; i++) {
      int b = bh / H, h = bh % H;
      double m = -INFINITY, sum = 0;
      for (int j = 0; j < L; j++) {
        double a = 0;
        for (int e = 0; e < dk; e++)
          a += (double)q[((size_t)bh * L + i) * dk + e] * k[((size_t)bh * L + j) * dk + e];
        s[j] = scale * a + bias[((size_t)h * L + i) * L + j];
        m = fmax(m, s[j]);
      }
      for (int j = 0; j < L; j++) sum += exp(s[j] - m);
      for (int e = 0; e < dk; e++) {
        double a = 0;
        for (int j = 0; j < L; j++) a += exp(s[j] - m) / sum * v[((size_t)bh * L + j) * dk + e];
        ref[((size_t)b * L + i) * ldo + (size_t)h * dk + e] = a;
      }
    }
  float *o = dev(t, hrand(t, n, 1), n);
  t->be->attention_bias_fwd(B, H, L, dk, scale, dev(t, bias, nb), dev(t, q, n), dev(t, k, n),
                            dev(t, v, n), o);
  cmp(t, "o", back(t, o, n), ref, n);
}

/* ---------------------------------------------------------------- the op table */

typedef void (*op_fn)(bcheck *t);
static const struct {
  const char *name;
  op_fn fn;
  const char *needs; /* the fields it calls: skipped on a backend without one */
} ops[] = {
    {"sgemm", op_sgemm, "sgemm"},
    {"sgemm_deterministic", op_sgemm_deterministic, "sgemm_deterministic"},
    {"linear", op_linear, "linear_fwd linear_bwd linear_fwd_w linear_bwd_w"},
    {"attention", op_attention, "attention_fwd attention_bwd"},
    {"attention_bias", op_attention_bias, "attention_bias_fwd"},
    {"attention_cross", op_attention_cross, "attention_cross_fwd attention_cross_bwd"},
    {"attention_mask", op_attention_mask, "attention_mask_fwd attention_mask_bwd"},
    {"rope_table", op_rope_table, "rope_table"},
    {"rope", op_rope, "rope_table rope_fwd rope_bwd"},
    {"qkv_heads", op_qkv_heads, "rope_table qkv_heads_fwd qkv_heads_bwd"},
    {"ln_mod", op_ln_mod, "ln_mod_fwd ln_mod_bwd"},
    {"layernorm_affine", op_layernorm_affine, "layernorm_affine_fwd"},
    {"rmsnorm", op_rmsnorm, "rmsnorm_fwd rmsnorm_bwd"},
    {"groupnorm", backend_op_groupnorm, "groupnorm_fwd groupnorm_bwd"},
    {"conv2d", backend_op_conv2d, "conv2d_col_floats conv2d_fwd conv2d_bwd"},
    {"upsample2x", backend_op_upsample2x, "upsample2x_fwd upsample2x_bwd"},
    {"tile_blend", backend_op_tile_blend, "tile_blend"},
    {"patchify", backend_op_patchify, "patchify unpatchify"},
    {"nchw_nlc", backend_op_nchw_nlc, "nchw_to_nlc nlc_to_nchw"},
    {"silu", op_silu, "silu_fwd silu_bwd"},
    {"gelu_tanh", op_gelu_tanh, "gelu_tanh_fwd gelu_tanh_bwd"},
    {"quick_gelu", op_quick_gelu, "quick_gelu_fwd"},
    {"gelu_erf", op_gelu_erf, "gelu_erf_fwd gelu_erf_bwd"},
    {"gate_res", op_gate_res, "gate_res_fwd gate_res_bwd"},
    {"elementwise", backend_op_elementwise, "add_inplace scale_inplace mul_inplace copy_2d zero"},
    {"clamp", backend_op_clamp, "clamp_fwd clamp_bwd"},
    {"embedding", backend_op_embedding, "embedding_fwd"},
    {"timestep_embedding", backend_op_timestep_embedding, "timestep_embedding"},
    {"mse", backend_op_mse, "mse_fwd_bwd"},
    {"optimizer_updates", backend_op_optimizer_updates,
     "adam_update adagrad_update lion_update sgd_update ema_update"},
    {"sumsq", backend_op_sumsq, "sumsq"},
    {"bf16", backend_op_bf16, "bf16_widen bf16_narrow bf16_narrow_acc"},
    {"dropout", backend_op_dropout, "dropout_fwd dropout_bwd"},
};
#define NOPS (sizeof ops / sizeof ops[0])

/* Every field of ct_backend_ops: the memory functions, and the ops with the CPU
 * kernel behind each. */
#define BACKEND_MEMORY(X) X(alloc) X(free) X(copy_in) X(copy_out) X(copy) X(synchronize)
// clang-format off
#define BACKEND_OPS(X) \
  X(sgemm, ct_sgemm) \
  X(sgemm_deterministic, ct_sgemm_deterministic) \
  X(linear_fwd, ct_linear_fwd) \
  X(linear_bwd, ct_linear_bwd) \
  X(linear_fwd_w, ct_linear_fwd_w) \
  X(linear_bwd_w, ct_linear_bwd_w) \
  X(attention_fwd, ct_attention_fwd) \
  X(attention_bias_fwd, ct_attention_bias_fwd) \
  X(attention_bwd, ct_attention_bwd) \
  X(attention_cross_fwd, ct_attention_cross_fwd) \
  X(attention_cross_bwd, ct_attention_cross_bwd) \
  X(attention_mask_fwd, ct_attention_mask_fwd) \
  X(attention_mask_bwd, ct_attention_mask_bwd) \
  X(rope_table, ct_rope_table) \
  X(rope_fwd, ct_rope_fwd) \
  X(rope_bwd, ct_rope_bwd) \
  X(qkv_heads_fwd, ct_qkv_heads_fwd) \
  X(qkv_heads_bwd, ct_qkv_heads_bwd) \
  X(ln_mod_fwd, ct_ln_mod_fwd) \
  X(ln_mod_bwd, ct_ln_mod_bwd) \
  X(layernorm_affine_fwd, ct_layernorm_affine_fwd) \
  X(rmsnorm_fwd, ct_rmsnorm_fwd) \
  X(rmsnorm_bwd, ct_rmsnorm_bwd) \
  X(groupnorm_fwd, ct_groupnorm_fwd) \
  X(groupnorm_bwd, ct_groupnorm_bwd) \
  X(conv2d_col_floats, ct_conv2d_col_floats) \
  X(conv2d_fwd, ct_conv2d_fwd) \
  X(conv2d_bwd, ct_conv2d_bwd) \
  X(upsample2x_fwd, ct_upsample2x_fwd) \
  X(upsample2x_bwd, ct_upsample2x_bwd) \
  X(nchw_to_nlc, ct_nchw_to_nlc) \
  X(nlc_to_nchw, ct_nlc_to_nchw) \
  X(tile_blend, ct_tile_blend) \
  X(patchify, ct_patchify) \
  X(unpatchify, ct_unpatchify) \
  X(silu_fwd, ct_silu_fwd) \
  X(silu_bwd, ct_silu_bwd) \
  X(gelu_tanh_fwd, ct_gelu_tanh_fwd) \
  X(gelu_tanh_bwd, ct_gelu_tanh_bwd) \
  X(quick_gelu_fwd, ct_quick_gelu_fwd) \
  X(gelu_erf_fwd, ct_gelu_erf_fwd) \
  X(gelu_erf_bwd, ct_gelu_erf_bwd) \
  X(gate_res_fwd, ct_gate_res_fwd) \
  X(gate_res_bwd, ct_gate_res_bwd) \
  X(add_inplace, ct_add_inplace) \
  X(scale_inplace, ct_scale_inplace) \
  X(mul_inplace, ct_mul_inplace) \
  X(copy_2d, ct_copy_2d) \
  X(zero, ct_zero) \
  X(clamp_fwd, ct_clamp_fwd) \
  X(clamp_bwd, ct_clamp_bwd) \
  X(embedding_fwd, ct_embedding_fwd) \
  X(timestep_embedding, ct_timestep_embedding) \
  X(mse_fwd_bwd, ct_mse_fwd_bwd) \
  X(adam_update, ct_adam_update) \
  X(adagrad_update, ct_adagrad_update) \
  X(lion_update, ct_lion_update) \
  X(sgd_update, ct_sgd_update) \
  X(ema_update, ct_ema_update) \
  X(sumsq, ct_sumsq) \
  X(bf16_widen, ct_bf16_widen) \
  X(bf16_narrow, ct_bf16_narrow) \
  X(bf16_narrow_acc, ct_bf16_narrow_acc) \
  X(dropout_fwd, ct_dropout_fwd) \
  X(dropout_bwd, ct_dropout_bwd)
// clang-format on

/* Runs every op on be; returns the number of failing ops and, in failed (if
 * not NULL), their names joined by spaces. */
static int run_ops(const ct_backend_ops *be, int quiet, char *failed, size_t cap) {
  int nbad = 0;
  if (failed) failed[0] = 0;
  for (size_t i = 0; i < NOPS; i++) {
    const char *lacks = ct_backend_lacks(be, ops[i].needs);
    if (lacks) { /* reported, never counted as passed */
      if (!quiet)
        fprintf(stderr, "  backend %s: op %s not supported (no %s): skipped\n", be->name,
                ops[i].name, lacks);
      continue;
    }
    bcheck t = {
        .be = be, .op = ops[i].name, .quiet = quiet, .rng = 0x9E3779B97F4A7C15ull * (i + 1)};
    /* float32 ops land within ~2e-6 of the references (4e-6 for gradients); a
     * reduced-precision backend gets its rounding's share */
    t.ftol = fmax(2e-5, 8.0 * ldexp(1.0, -be->precision_bits));
    t.gtol = fmax(2e-4, 16.0 * ldexp(1.0, -be->precision_bits));
    ops[i].fn(&t);
    release(&t);
    if (t.fails) {
      nbad++;
      if (failed) {
        size_t len = strlen(failed);
        snprintf(failed + len, cap - len, "%s%s", len ? " " : "", ops[i].name);
      }
    }
  }
  return nbad;
}

/* ---------------------------------------------------------------- tests */

CT_TEST(backend, registry) {
  REQUIRE(ct_backend_count() >= 1);
  CHECK(ct_backend_default() == ct_backend_at(0));
  CHECK(!strcmp(ct_backend_default()->name, "cpu"));
  CHECK(ct_backend_at(ct_backend_count()) == NULL);
  const ct_backend_ops *be = NULL;
  ct_err err = {0};
  CHECK(ct_backend_get("cpu", &be, &err) == CT_OK && be == ct_backend_default());
  CHECK(ct_backend_get("no-such-device", &be, &err) == CT_ERR_NOT_FOUND && be == NULL);
  CHECKF(strstr(err.msg, "no-such-device") && strstr(err.msg, "cpu"), "message: %s", err.msg);
  for (size_t i = 0; i < ct_backend_count(); i++)
    for (size_t j = 0; j < i; j++) CHECK(strcmp(ct_backend_at(i)->name, ct_backend_at(j)->name));
}

/* Asking for a backend that cannot run here says why: "cuda" in a build
 * without CUDA names the build option; in a CUDA build on a machine without
 * a device (CI) it is not listed and the error is init's reason. */
CT_TEST(backend, cuda_absent_explained) {
  const ct_backend_ops *be = NULL;
  ct_err err = {0};
  ct_status st = ct_backend_get("cuda", &be, &err);
  if (st == CT_OK) { /* a GPU machine: listed, with its device in the description */
    CHECK(be && !be->host_memory && be->init && be->check && strstr(be->description, "sm_"));
    return;
  }
#ifdef CT_CUDA
  CHECKF(st == CT_ERR_UNSUPPORTED && strstr(err.msg, "cannot run here") && strstr(err.msg, "CUDA"),
         "%s", err.msg);
#else
  CHECKF(
      st == CT_ERR_NOT_FOUND && strstr(err.msg, "not in this build") && strstr(err.msg, "CT_CUDA"),
      "%s", err.msg);
#endif
  for (size_t i = 0; i < ct_backend_count(); i++)
    CHECK(strncmp(ct_backend_at(i)->name, "cuda", 4) != 0);
  fprintf(stderr, "  cuda: %s\n", err.msg);
}

/* Every backend has its memory functions; a backend with host memory (the
 * CPU backends) has every op, and the CPU backend's ops are the kernels
 * themselves (so its results are the free functions' bits). The test's op
 * list is the header's (CT_BACKEND_OP_FIELDS), and ct_backend_lacks names
 * what is missing. */
CT_TEST(backend, complete) {
  for (size_t i = 0; i < ct_backend_count(); i++) {
    const ct_backend_ops *be = ct_backend_at(i);
    CHECK(be->name && be->description && be->precision_bits > 0);
#define CT_X(field) CHECKF(be->field != NULL, "backend %s lacks %s", be->name, #field);
    BACKEND_MEMORY(CT_X)
#undef CT_X
    if (!be->host_memory) continue;
#define CT_X(field, kernel) CHECKF(be->field != NULL, "backend %s lacks %s", be->name, #field);
    BACKEND_OPS(CT_X)
#undef CT_X
  }
  const ct_backend_ops *cpu = ct_backend_default();
  CHECK(cpu->host_memory == 1 && !cpu->init && !cpu->check);
#define CT_X(field, kernel) \
  CHECKF((void (*)(void))cpu->field == (void (*)(void))kernel, "cpu %s is not %s", #field, #kernel);
  BACKEND_OPS(CT_X)
#undef CT_X
  /* the header's field list is the test's, in the same order */
  const char *const hdr[] = {
#define CT_X(f) #f,
      CT_BACKEND_OP_FIELDS(CT_X)
#undef CT_X
  };
  const char *const mine[] = {
#define CT_X(f, kernel) #f,
      BACKEND_OPS(CT_X)
#undef CT_X
  };
  REQUIRE(sizeof hdr == sizeof mine);
  for (size_t i = 0; i < sizeof hdr / sizeof hdr[0]; i++) CHECK(strcmp(hdr[i], mine[i]) == 0);
  /* ct_backend_lacks: the first missing field, by name; unknown names lack */
  ct_backend_ops partial = *cpu;
  partial.conv2d_bwd = NULL;
  CHECK(ct_backend_lacks(cpu, "conv2d_fwd conv2d_bwd") == NULL);
  const char *l = ct_backend_lacks(&partial, "silu_fwd  conv2d_fwd conv2d_bwd");
  CHECKF(l && !strcmp(l, "conv2d_bwd"), "lacks: %s", l ? l : "(none)");
  l = ct_backend_lacks(cpu, "no_such_op");
  CHECK(l && !strcmp(l, "no_such_op"));
}

CT_TEST(backend, ops) {
  for (size_t i = 0; i < ct_backend_count(); i++) {
    char failed[512];
    int nbad = run_ops(ct_backend_at(i), 0, failed, sizeof failed);
    CHECKF(nbad == 0, "backend %s: %d op(s) differ from the reference: %s", ct_backend_at(i)->name,
           nbad, failed);
  }
}

/* The comparison can fail: a CPU table with two ops sabotaged (silu forward
 * off by 1e-3 relative; linear backward dropping the bias gradient) must fail
 * exactly those two ops. */
static void bad_silu(int N, int D, const float *x, int ldx, float *y, int ldy) {
  ct_silu_fwd(N, D, x, ldx, y, ldy);
  y[ldy + 1] += 0.01f;
}
static void bad_linear_bwd(int N, int K, int M, const float *x, int ldx, const float *w,
                           const float *dy, int lddy, float *dx, int lddx, float beta_dx, float *dw,
                           float *db) {
  ct_linear_bwd(N, K, M, x, ldx, w, dy, lddy, dx, lddx, beta_dx, dw, NULL);
}
CT_TEST(backend, detects_broken_op) {
  ct_backend_ops broken = *ct_backend_default();
  broken.name = "cpu-sabotaged";
  broken.silu_fwd = bad_silu;
  broken.linear_bwd = bad_linear_bwd;
  char failed[512];
  int nbad = run_ops(&broken, 1, failed, sizeof failed);
  CHECKF(nbad == 2 && !strcmp(failed, "linear silu"), "%d op(s) failed: %s (expected: linear silu)",
         nbad, failed);
}

/* The CPU backend's optimizer math is the optimizers', bit for bit
 * (src/optim/optim_elem.c's slices call these kernels). */
CT_TEST(backend, cpu_optimizer_math_bitwise) {
  const ct_backend_ops *be = ct_backend_default();
  const size_t n = 1000;
  const ct_optim_kind kinds[] = {CT_OPTIM_ADAMW, CT_OPTIM_ADAM, CT_OPTIM_ADAGRAD, CT_OPTIM_LION,
                                 CT_OPTIM_SGD};
  bcheck t = {.be = be, .op = "bitwise", .rng = 77};
  for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++) {
    ct_optim_hp hp;
    ct_optim_hp_default(kinds[ki], &hp);
    hp.weight_decay = 0.05f;
    if (kinds[ki] == CT_OPTIM_SGD) hp.momentum = 0.9f, hp.dampening = 0.1f;
    ct_optim *o = NULL;
    ct_err err = {0};
    REQUIRE(ct_optim_new(kinds[ki], &hp, NULL, 0, n, &o, &err) == CT_OK);
    float *w = hrand(&t, n, 1), *w2 = hcopy(&t, w, n), *s[2] = {hcopy(&t, w, n), hcopy(&t, w, n)};
    for (size_t i = 0; i < ct_optim_nstate(o); i++) memset(s[i], 0, n * sizeof(float));
    for (long step = 1; step <= 3; step++) {
      float *g = hrand(&t, n, 1);
      CHECK(ct_optim_step(o, w, g, 1e-3f, step, &err) == CT_OK);
      switch (kinds[ki]) {
        case CT_OPTIM_ADAMW:
        case CT_OPTIM_ADAM:
          be->adam_update(n, w2, g, s[0], s[1], 1e-3f, hp.beta1, hp.beta2, hp.eps, hp.weight_decay,
                          kinds[ki] == CT_OPTIM_ADAMW, step);
          break;
        case CT_OPTIM_ADAGRAD:
          be->adagrad_update(n, w2, g, s[0], 1e-3f, hp.adagrad_lr_decay, hp.eps, hp.weight_decay,
                             step);
          break;
        case CT_OPTIM_LION:
          be->lion_update(n, w2, g, s[0], 1e-3f, hp.beta1, hp.beta2, hp.weight_decay);
          break;
        default:
          be->sgd_update(n, w2, g, s[0], 1e-3f, hp.momentum, hp.dampening, hp.nesterov,
                         hp.weight_decay, step);
      }
    }
    CHECKF(!memcmp(w, w2, n * sizeof(float)), "%s: weights differ from ct_optim_step",
           ct_optim_kind_name(kinds[ki]));
    for (size_t i = 0; i < ct_optim_nstate(o); i++)
      CHECKF(!memcmp(ct_optim_state(o, i, NULL), s[i], n * sizeof(float)), "%s: state %zu differs",
             ct_optim_kind_name(kinds[ki]), i);
    ct_optim_free(o);
  }
  release(&t);
}

/* sgemm_deterministic keeps its promise on the path this machine takes
 * (OpenBLAS without AVX-512 or with CT_GEMM=blas): 1 and 2 threads, same bits. */
CT_TEST(backend, cpu_sgemm_deterministic_threads) {
  const ct_backend_ops *be = ct_backend_default();
  const int M = 300, N = 200, K = 96;
  bcheck t = {.be = be, .op = "sgemm_deterministic", .rng = 5};
  float *A = hrand(&t, (size_t)M * K, 1), *B = hrand(&t, (size_t)N * K, 1);
  float *C[2] = {hrand(&t, (size_t)M * N, 1), NULL};
  C[1] = hcopy(&t, C[0], (size_t)M * N);
  const int saved = omp_get_max_threads();
  for (int i = 0; i < 2; i++) {
    omp_set_num_threads(i + 1);
    openblas_set_num_threads(i + 1);
    be->sgemm_deterministic(0, 1, M, N, K, 0.5f, A, K, B, K, 0.25f, C[i], N);
  }
  omp_set_num_threads(saved);
  openblas_set_num_threads(saved);
  CHECKF(!memcmp(C[0], C[1], (size_t)M * N * sizeof(float)), "path %s: 1 and 2 threads differ",
         ct_sgemm_path());
  release(&t);
}

/* The profiling backend (`ctuner bench step --profile`) wraps every op of the
 * table it is given, computes the same results (the whole comparison suite
 * passes through it), and counts each call under its family and the phase
 * set at the time. */
CT_TEST(backend, profiled_wraps_every_op) {
  const ct_backend_ops *cpu = ct_backend_default(), *pr = ct_backend_profiled(cpu);
#define CT_X(field, kernel)                                                                      \
  CHECKF(pr->field && (void (*)(void))pr->field != (void (*)(void))cpu->field, "%s not wrapped", \
         #field);
  BACKEND_OPS(CT_X)
#undef CT_X
  CHECK(pr->alloc && pr->alloc != cpu->alloc && pr->copy_out != cpu->copy_out);
  ct_prof_reset();
  ct_prof_set_phase(CT_PROF_FORWARD);
  char failed[512];
  int nbad = run_ops(pr, 0, failed, sizeof failed);
  CHECKF(nbad == 0, "through the profiler %d op(s) differ: %s", nbad, failed);
  ct_prof_counts c;
  ct_prof_read(&c);
  for (int f = 0; f < CT_PROF_NFAMILIES; f++)
    CHECKF(c.calls[CT_PROF_FORWARD][f] > 0, "family %s counted no call",
           ct_prof_family_name((ct_prof_family)f));
  CHECK(c.calls[CT_PROF_BACKWARD][CT_PROF_ACTIVATION] == 0);
  /* the phase decides where a call counts; reset clears */
  ct_prof_set_phase(CT_PROF_BACKWARD);
  float x[4] = {1, -2, 3, 0.5f}, y[4];
  pr->silu_fwd(1, 4, x, 4, y, 4);
  ct_prof_read(&c);
  CHECK(c.calls[CT_PROF_BACKWARD][CT_PROF_ACTIVATION] == 1);
  CHECK(c.seconds[CT_PROF_BACKWARD][CT_PROF_ACTIVATION] >= 0);
  ct_prof_reset();
  ct_prof_read(&c);
  CHECK(c.calls[CT_PROF_FORWARD][CT_PROF_GEMM] == 0 &&
        c.seconds[CT_PROF_FORWARD][CT_PROF_GEMM] == 0);
  ct_prof_set_phase(CT_PROF_STEP);
}

/* The bf16-compute sibling of the CPU backend (--mixed_precision bf16): found
 * from "cpu" by ct_backend_with_compute and back; the same memory (moving a
 * buffer between them copies nothing); its products are the bf16 kernels and
 * every other op is the CPU backend's own (checked field by field); through
 * the profiler it keeps its compute. */
CT_TEST(backend, cpu_bf16_sibling) {
  const ct_backend_ops *cpu = ct_backend_default(), *bf = NULL, *back_ = NULL;
  ct_err err = {0};
  REQUIRE(ct_backend_with_compute(cpu, CT_COMPUTE_BF16, &bf, &err) == CT_OK);
  CHECK(!strcmp(bf->name, "cpu-bf16") && bf->compute == CT_COMPUTE_BF16 && bf->precision_bits == 8);
  CHECK(cpu->compute == CT_COMPUTE_F32);
  CHECK(ct_backend_with_compute(bf, CT_COMPUTE_F32, &back_, &err) == CT_OK && back_ == cpu);
  CHECK(ct_backend_with_compute(cpu, CT_COMPUTE_F32, &back_, &err) == CT_OK && back_ == cpu);
  const ct_backend_ops *byname = NULL;
  CHECK(ct_backend_get("cpu-bf16", &byname, &err) == CT_OK && byname == bf);
#define BF16_OP(field, kernel)                                         \
  CHECKF((void (*)(void))bf->field == (void (*)(void))kernel, "%s %s", \
         "cpu-bf16's product is not", #kernel);
  BF16_OP(sgemm, ct_sgemm_bf16)
  BF16_OP(linear_fwd, ct_linear_fwd_bf16)
  BF16_OP(linear_bwd, ct_linear_bwd_bf16)
  BF16_OP(conv2d_fwd, ct_conv2d_fwd_bf16)
  BF16_OP(conv2d_bwd, ct_conv2d_bwd_bf16)
  BF16_OP(attention_fwd, ct_attention_fwd_bf16)
  BF16_OP(attention_bwd, ct_attention_bwd_bf16)
#undef BF16_OP
#define CT_X(field, kernel)                                                                      \
  if (strcmp(#field, "sgemm") && strcmp(#field, "linear_fwd") && strcmp(#field, "linear_bwd") && \
      strcmp(#field, "conv2d_fwd") && strcmp(#field, "conv2d_bwd") &&                            \
      strcmp(#field, "attention_fwd") && strcmp(#field, "attention_bwd"))                        \
    CHECKF((void (*)(void))bf->field == (void (*)(void))cpu->field,                              \
           "cpu-bf16 %s is not the cpu's", #field);
  BACKEND_OPS(CT_X)
#undef CT_X
  CHECK(bf->alloc == cpu->alloc && bf->free == cpu->free && bf->copy == cpu->copy);
  void *p = cpu->alloc(CT_MEM_BUFFERS, 64), *p0 = p;
  CHECK(ct_backend_move(cpu, bf, CT_MEM_BUFFERS, 64, &p, &err) == CT_OK && p == p0);
  cpu->free(p);
  const ct_backend_ops *pr = ct_backend_profiled(bf);
  CHECK(pr->compute == CT_COMPUTE_BF16 && pr->precision_bits == 8);
  ct_backend_profiled(cpu);
  CHECK(pr->compute == CT_COMPUTE_F32);
}

/* The test backend "sealed" (backend_sealed.c): listed, host_memory 0, paired
 * with "sealed-bf16" (same memory); its memory really is out of the host's
 * reach — a child process that reads or writes a sealed buffer outside the
 * table dies of SIGSEGV, and one that hands an op a host buffer aborts — while
 * through the table every op gives the CPU backend's bits. */
static int child_signal(void (*fn)(void *), void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    /* the kernel's verdict, not a sanitizer's: ASan's handler would turn SIGSEGV into an abort */
    signal(SIGSEGV, SIG_DFL);
    signal(SIGBUS, SIG_DFL);
    fn(arg);
    _exit(0); /* survived: the test fails */
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}
static void touch_read(void *p) {
  volatile float x = *(volatile float *)p;
  (void)x;
}
static void touch_write(void *p) {
  *(volatile float *)p = 1.0f;
}
static void host_arg(void *p) {
  const ct_backend_ops *be = p;
  float host[4] = {0};
  freopen("/dev/null", "w", stderr); /* the abort's message is expected */
  be->zero(4, host);
}

CT_TEST(backend, sealed_memory_is_sealed) {
  const ct_backend_ops *se = NULL, *sb = NULL, *cpu = ct_backend_default();
  ct_err err = {0};
  REQUIRE(ct_backend_get("sealed", &se, &err) == CT_OK);
  CHECK(se->host_memory == 0 && se->compute == CT_COMPUTE_F32);
  REQUIRE(ct_backend_with_compute(se, CT_COMPUTE_BF16, &sb, &err) == CT_OK);
  CHECK(!strcmp(sb->name, "sealed-bf16") && sb->host_memory == 0 && sb->alloc == se->alloc);
  ct_mem_stats d0, d1;
  ct_mem_get_device_stats(&d0);
  const size_t n = 5000;
  float *d = se->alloc(CT_MEM_BUFFERS, n * sizeof(float));
  REQUIRE(d != NULL);
  ct_mem_get_device_stats(&d1);
  CHECK(d1.current[CT_MEM_BUFFERS] == d0.current[CT_MEM_BUFFERS] + n * sizeof(float));
  float h[5000], g[5000];
  for (size_t i = 0; i < n; i++) h[i] = (float)i * 0.25f - 3.0f;
  se->copy_in(d, h, sizeof h);
  CHECK(child_signal(touch_read, d) == SIGSEGV);
  CHECK(child_signal(touch_write, d + 100) == SIGSEGV);
  CHECK(child_signal(host_arg, (void *)se) == SIGABRT);
  /* through the table: the CPU backend's bits */
  se->scale_inplace(n, d, 0.3f);
  const double ss = se->sumsq(n, d);
  se->copy_out(g, d, sizeof g);
  ct_scale_inplace(n, h, 0.3f);
  CHECK(!memcmp(g, h, sizeof h) && ss == cpu->sumsq(n, h));
  se->free(d);
  ct_mem_get_device_stats(&d1);
  CHECK(d1.current[CT_MEM_BUFFERS] == d0.current[CT_MEM_BUFFERS]);
  /* ct_backend_move between cpu and sealed copies through the host */
  void *p = cpu->alloc(CT_MEM_BUFFERS, sizeof h);
  memcpy(p, h, sizeof h);
  REQUIRE(ct_backend_move(cpu, se, CT_MEM_BUFFERS, sizeof h, &p, &err) == CT_OK);
  CHECK(child_signal(touch_read, p) == SIGSEGV);
  REQUIRE(ct_backend_move(se, cpu, CT_MEM_BUFFERS, sizeof h, &p, &err) == CT_OK);
  CHECK(!memcmp(p, h, sizeof h));
  cpu->free(p);
}

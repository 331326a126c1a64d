/* Softmax attention with as many keys as the keys' sequence has (Lk), not as
 * many as the queries (Lq): the U-net's cross-attention to the text
 * (diffusers' Attention with encoder_hidden_states). Also the derivative of
 * the erf GELU (GEGLU's gate).
 *
 * Design: one task per (batch item, head), run on one thread each; inside it
 * query tiles of CROSS_TILE rows go through ct_sgemm (on the calling thread
 * inside the parallel region): scores S = scale Q K^T (tile x Lk), the row
 * softmax in float32 with its log-sum-exp kept, O = P V. The backward
 * recomputes P from lse: dP = dO V^T, dS = P (dP - rowsum(dO o O)),
 * dQ = scale dS K, dK += scale dS^T Q, dV += P^T dO, the tiles summed in
 * order, so the result does not depend on the thread count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/kernels.h"
#include "scratch.h"

#define CROSS_TILE 64

static void softmax_rows(int n, int Lk, float *s, float *lse) {
  for (int i = 0; i < n; i++) {
    float *r = s + (size_t)i * Lk, m = -INFINITY;
    for (int j = 0; j < Lk; j++) m = r[j] > m ? r[j] : m;
    double sum = 0;
    for (int j = 0; j < Lk; j++) {
      r[j] = expf(r[j] - m);
      sum += r[j];
    }
    const float inv = (float)(1.0 / sum);
    for (int j = 0; j < Lk; j++) r[j] *= inv;
    if (lse) lse[i] = m + (float)log(sum);
  }
}

void ct_attention_cross_fwd(int B, int H, int Lq, int Lk, int hd, float scale, const float *q,
                            const float *k, const float *v, float *o, float *lse) {
  const int ldo = H * hd;
#pragma omp parallel
  {
    float *s = ct_kernels_scratch((size_t)CROSS_TILE * (Lk > 0 ? Lk : 1) * sizeof(float),
                                  "cross-attention score tile");
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
      const int b = bh / H, h = bh % H;
      const float *kb = k + (size_t)bh * Lk * hd, *vb = v + (size_t)bh * Lk * hd;
      for (int i0 = 0; i0 < Lq; i0 += CROSS_TILE) {
        const int n = Lq - i0 < CROSS_TILE ? Lq - i0 : CROSS_TILE;
        const float *qt = q + ((size_t)bh * Lq + i0) * hd;
        ct_sgemm(0, 1, n, Lk, hd, scale, qt, hd, kb, hd, 0.0f, s, Lk);
        softmax_rows(n, Lk, s, lse + (size_t)bh * Lq + i0);
        ct_sgemm(0, 0, n, hd, Lk, 1.0f, s, Lk, vb, hd, 0.0f,
                 o + ((size_t)b * Lq + i0) * ldo + (size_t)h * hd, ldo);
      }
    }
    free(s);
  }
}

/* P (n x Lk) of one query tile from the scores and the forward's lse */
static void probs(int n, int Lk, float *s, const float *lse) {
  for (int i = 0; i < n; i++) {
    float *r = s + (size_t)i * Lk;
    for (int j = 0; j < Lk; j++) r[j] = expf(r[j] - lse[i]);
  }
}

void ct_attention_cross_bwd(int B, int H, int Lq, int Lk, int hd, float scale, const float *q,
                            const float *k, const float *v, const float *o, const float *lse,
                            const float *dout, float *dq, float *dk, float *dv) {
  const int ldo = H * hd;
#pragma omp parallel
  {
    const size_t nt = (size_t)CROSS_TILE * (Lk > 0 ? Lk : 1);
    float *p = ct_kernels_scratch(nt * sizeof(float), "cross-attention backward tile");
    float *dp = ct_kernels_scratch(nt * sizeof(float), "cross-attention backward tile");
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
      const int b = bh / H, h = bh % H;
      const float *kb = k + (size_t)bh * Lk * hd, *vb = v + (size_t)bh * Lk * hd;
      float *dkb = dk + (size_t)bh * Lk * hd, *dvb = dv + (size_t)bh * Lk * hd;
      memset(dkb, 0, (size_t)Lk * hd * sizeof(float));
      memset(dvb, 0, (size_t)Lk * hd * sizeof(float));
      for (int i0 = 0; i0 < Lq; i0 += CROSS_TILE) {
        const int n = Lq - i0 < CROSS_TILE ? Lq - i0 : CROSS_TILE;
        const float *qt = q + ((size_t)bh * Lq + i0) * hd;
        const float *ot = o + ((size_t)b * Lq + i0) * ldo + (size_t)h * hd;
        const float *dot = dout + ((size_t)b * Lq + i0) * ldo + (size_t)h * hd;
        ct_sgemm(0, 1, n, Lk, hd, scale, qt, hd, kb, hd, 0.0f, p, Lk);
        probs(n, Lk, p, lse + (size_t)bh * Lq + i0);
        ct_sgemm(0, 1, n, Lk, hd, 1.0f, dot, ldo, vb, hd, 0.0f, dp, Lk); /* dP = dO V^T */
        for (int i = 0; i < n; i++) {
          float d = 0; /* rowsum(dP o P) = rowsum(dO o O) */
          for (int e = 0; e < hd; e++) d += dot[(size_t)i * ldo + e] * ot[(size_t)i * ldo + e];
          float *pr = p + (size_t)i * Lk, *dr = dp + (size_t)i * Lk;
          for (int j = 0; j < Lk; j++) dr[j] = pr[j] * (dr[j] - d);
        }
        ct_sgemm(1, 0, Lk, hd, n, 1.0f, p, Lk, dot, ldo, 1.0f, dvb, hd); /* dV += P^T dO */
        ct_sgemm(1, 0, Lk, hd, n, scale, dp, Lk, qt, hd, 1.0f, dkb, hd); /* dK += s dS^T Q */
        ct_sgemm(0, 0, n, hd, Lk, scale, dp, Lk, kb, hd, 0.0f, dq + ((size_t)bh * Lq + i0) * hd,
                 hd); /* dQ = s dS K */
      }
    }
    free(p);
    free(dp);
  }
}

/* GELU(x) = x Phi(x): d/dx = Phi(x) + x phi(x) */
void ct_gelu_erf_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx,
                     int lddx) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > 16384)
  for (int r = 0; r < N; r++) {
    const float *xr = x + (size_t)r * ldx, *g = dy + (size_t)r * lddy;
    float *dxr = dx + (size_t)r * lddx;
    for (int j = 0; j < D; j++) {
      const float v = xr[j];
      const float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
      const float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
      dxr[j] = g[j] * (cdf + v * pdf);
    }
  }
}

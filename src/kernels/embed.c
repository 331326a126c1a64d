/* Timestep embedding, token + position embedding, patchify/unpatchify and
 * the MSE loss.
 *
 * Design: the timestep embedding follows the PyTorch peer operation by
 * operation in float32 (it is B x dim, so libm is fine). Patchify is a pure
 * permutation, parallel over (batch, channel, patch row); unpatchify is its
 * exact inverse and therefore also its backward. The MSE sums squares in
 * double over a fixed number of chunks (set by n only) combined in order, so
 * the loss does not depend on the thread count.
 */
#include <math.h>
#include <stddef.h>

#include "ctuner/kernels.h"
#include "fastmath.h"

#define MSE_CHUNKS 64

void ct_timestep_embedding(int B, const float *t, int dim, float max_period, float time_factor,
                           float *out) {
  int half = dim / 2;
  float c = (float)(-log((double)max_period));
  for (int b = 0; b < B; b++) {
    float tb = time_factor * t[b];
    for (int k = 0; k < half; k++) {
      float f = expf(c * (float)k / (float)half);
      float a = tb * f;
      out[(size_t)b * dim + k] = cosf(a);
      out[(size_t)b * dim + half + k] = sinf(a);
    }
    if (dim % 2) out[(size_t)b * dim + dim - 1] = 0.0f;
  }
}

void ct_embedding_fwd(int N, int T, int D, const int32_t *ids, const float *tok, const float *pos,
                      float *y) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > 16384)
  for (int r = 0; r < N; r++) {
    const float *tr = tok + (size_t)ids[r] * D, *pr = pos + (size_t)(r % T) * D;
    float *yr = y + (size_t)r * D;
    for (int j = 0; j < D; j++) yr[j] = tr[j] + pr[j];
  }
}

/* Shared index walk: for patch grid (gh, gw), x[b][c][hh*p+ph][ww*p+pw] <->
 * out[b][hh*gw+ww][(c*p+ph)*p+pw]. dir 0: x -> out, 1: out -> x. */
static void permute(int B, int C, int H, int W, int p, const float *src, float *dst, int dir) {
  int gh = H / p, gw = W / p, F = C * p * p;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)B * C * H * W > 65536)
  for (int b = 0; b < B; b++)
    for (int c = 0; c < C; c++)
      for (int hh = 0; hh < gh; hh++)
        for (int ph = 0; ph < p; ph++) {
          size_t xrow = (((size_t)b * C + c) * H + (size_t)hh * p + ph) * W;
          for (int ww = 0; ww < gw; ww++) {
            size_t tok =
                ((size_t)b * gh * gw + (size_t)hh * gw + ww) * F + ((size_t)c * p + ph) * p;
            for (int pw = 0; pw < p; pw++) {
              size_t xi = xrow + (size_t)ww * p + pw;
              if (dir == 0)
                dst[tok + pw] = src[xi];
              else
                dst[xi] = src[tok + pw];
            }
          }
        }
}

void ct_patchify(int B, int C, int H, int W, int p, const float *x, float *out) {
  permute(B, C, H, W, p, x, out, 0);
}

void ct_unpatchify(int B, int C, int H, int W, int p, const float *in, float *x) {
  permute(B, C, H, W, p, in, x, 1);
}

float ct_mse_fwd_bwd(size_t n, const float *pred, const float *target, float dloss, float *dpred) {
  if (n == 0) return 0.0f;
  double part[MSE_CHUNKS];
  size_t chunk = (n + MSE_CHUNKS - 1) / MSE_CHUNKS;
  float g = (float)(2.0 * (double)dloss / (double)n);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int c = 0; c < MSE_CHUNKS; c++) {
    size_t i0 = (size_t)c * chunk, i1 = i0 + chunk < n ? i0 + chunk : n;
    double s = 0.0;
    if (i0 < n) {
      const float *p = pred + i0, *q = target + i0;
      CT_SUM_LANES(double, s, i1 - i0, i, (double)(p[i] - q[i]) * (double)(p[i] - q[i]));
      if (dpred)
        for (size_t i = i0; i < i1; i++) dpred[i] = g * (pred[i] - target[i]);
    }
    part[c] = s;
  }
  double tot = 0.0;
  for (int c = 0; c < MSE_CHUNKS; c++) tot += part[c];
  return (float)(tot / (double)n);
}

/* Activations (SiLU, GELU-tanh, quick-GELU, erf GELU: libm's erff), the gated residual, plain
 * elementwise helpers, the clamp and the strided 2-D copy.
 *
 * Design: `omp for` over rows (static schedule), inner loops over contiguous
 * columns that GCC vectorises; transcendental functions come from fastmath.h
 * (vectorisable exp) rather than libm. The gated-residual backward sums
 * dgate over rows in tasks that each own (batch item, column block) and visit
 * their rows in order, so the sum does not depend on the thread count.
 * Buffers may alias where an operation is elementwise (e.g. out == x).
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "ctuner/kernels.h"
#include "fastmath.h"

#define COLBLK 64
#define PAR_MIN 16384               /* below this many elements the loops run on one thread */
#define GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K1 0.044715f

void ct_silu_fwd(int N, int D, const float *x, int ldx, float *y, int ldy) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > PAR_MIN)
  for (int r = 0; r < N; r++) {
    const float *xr = x + (size_t)r * ldx;
    float *yr = y + (size_t)r * ldy;
    for (int j = 0; j < D; j++) yr[j] = xr[j] * ct_sigmoidf(xr[j]);
  }
}

/* silu'(x) = s (1 + x (1 - s)), s = sigmoid(x) */
void ct_silu_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx,
                 int lddx) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > PAR_MIN)
  for (int r = 0; r < N; r++) {
    const float *xr = x + (size_t)r * ldx, *g = dy + (size_t)r * lddy;
    float *dxr = dx + (size_t)r * lddx;
    for (int j = 0; j < D; j++) {
      float s = ct_sigmoidf(xr[j]);
      dxr[j] = g[j] * s * (1.0f + xr[j] * (1.0f - s));
    }
  }
}

void ct_gelu_tanh_fwd(int N, int D, const float *x, int ldx, float *y, int ldy) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > PAR_MIN)
  for (int r = 0; r < N; r++) {
    const float *xr = x + (size_t)r * ldx;
    float *yr = y + (size_t)r * ldy;
    for (int j = 0; j < D; j++) {
      float v = xr[j];
      float t = ct_tanhf(GELU_K0 * (v + GELU_K1 * v * v * v));
      yr[j] = 0.5f * v * (1.0f + t);
    }
  }
}

/* d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k0 (1 + 3 k1 x^2) */
void ct_gelu_tanh_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx,
                      int lddx) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > PAR_MIN)
  for (int r = 0; r < N; r++) {
    const float *xr = x + (size_t)r * ldx, *g = dy + (size_t)r * lddy;
    float *dxr = dx + (size_t)r * lddx;
    for (int j = 0; j < D; j++) {
      float v = xr[j], v2 = v * v;
      float t = ct_tanhf(GELU_K0 * (v + GELU_K1 * v2 * v));
      float d =
          0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_K0 * (1.0f + 3.0f * GELU_K1 * v2);
      dxr[j] = g[j] * d;
    }
  }
}

void ct_quick_gelu_fwd(int N, int D, const float *x, int ldx, float *y, int ldy) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > PAR_MIN)
  for (int r = 0; r < N; r++) {
    const float *xr = x + (size_t)r * ldx;
    float *yr = y + (size_t)r * ldy;
    for (int j = 0; j < D; j++) yr[j] = xr[j] * ct_sigmoidf(1.702f * xr[j]);
  }
}

void ct_gelu_erf_fwd(int N, int D, const float *x, int ldx, float *y, int ldy) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > PAR_MIN)
  for (int r = 0; r < N; r++) {
    const float *xr = x + (size_t)r * ldx;
    float *yr = y + (size_t)r * ldy;
    for (int j = 0; j < D; j++) yr[j] = 0.5f * xr[j] * (1.0f + erff(xr[j] * 0.70710678118654752f));
  }
}

void ct_gate_res_fwd(int B, int L, int D, const float *x, int ldx, const float *gate, int ldg,
                     const float *y, int ldy, float *out, int ldo) {
  int N = B * L;
#pragma omp parallel for schedule(static) if ((size_t)N * D > PAR_MIN)
  for (int r = 0; r < N; r++) {
    const float *xr = x + (size_t)r * ldx, *yr = y + (size_t)r * ldy;
    const float *g = gate + (size_t)(r / L) * ldg;
    float *o = out + (size_t)r * ldo;
    for (int j = 0; j < D; j++) o[j] = xr[j] + g[j] * yr[j];
  }
}

void ct_gate_res_bwd(int B, int L, int D, const float *gate, int ldg, const float *y, int ldy,
                     const float *dout, int lddo, float *dy, int lddy, float *dgate) {
  int nblk = (D + COLBLK - 1) / COLBLK;
#pragma omp parallel for schedule(static) if ((size_t)B * L * D > PAR_MIN)
  for (int t = 0; t < B * nblk; t++) {
    int b = t / nblk, c0 = (t % nblk) * COLBLK, nc = D - c0 < COLBLK ? D - c0 : COLBLK;
    const float *g = gate + (size_t)b * ldg + c0;
    float a[COLBLK] = {0};
    for (int l = 0; l < L; l++) {
      size_t r = (size_t)b * L + l;
      const float *yr = y + r * ldy + c0, *d = dout + r * lddo + c0;
      float *dyr = dy ? dy + r * lddy + c0 : NULL;
      for (int j = 0; j < nc; j++) a[j] += d[j] * yr[j]; /* before dy: dy may alias y */
      if (dyr)
        for (int j = 0; j < nc; j++) dyr[j] = g[j] * d[j];
    }
    if (dgate)
      for (int j = 0; j < nc; j++) dgate[(size_t)b * ldg + c0 + j] += a[j];
  }
}

void ct_add_inplace(size_t n, float *y, const float *x) {
#pragma omp parallel for schedule(static) if (n > 4 * PAR_MIN)
  for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void ct_scale_inplace(size_t n, float *x, float c) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) x[i] *= c;
}

void ct_mul_inplace(size_t n, float *y, const float *x) {
#pragma omp parallel for schedule(static) if (n > 4 * PAR_MIN)
  for (size_t i = 0; i < n; i++) y[i] *= x[i];
}

void ct_copy_2d(int rows, int cols, const float *src, int lds, float *dst, int ldd) {
#pragma omp parallel for schedule(static) if ((size_t)rows * cols > PAR_MIN)
  for (int r = 0; r < rows; r++)
    memcpy(dst + (size_t)r * ldd, src + (size_t)r * lds, (size_t)cols * sizeof(float));
}

void ct_clamp_fwd(int rows, int cols, const float *x, int ldx, float lo, float hi, float *y,
                  int ldy) {
#pragma omp parallel for schedule(static) if ((size_t)rows * cols > PAR_MIN)
  for (int r = 0; r < rows; r++) {
    const float *xr = x + (size_t)r * ldx;
    float *yr = y + (size_t)r * ldy;
    for (int j = 0; j < cols; j++) yr[j] = xr[j] < lo ? lo : xr[j] > hi ? hi : xr[j];
  }
}

void ct_clamp_bwd(int rows, int cols, const float *x, int ldx, float lo, float hi, const float *dy,
                  int lddy, float *dx, int lddx) {
#pragma omp parallel for schedule(static) if ((size_t)rows * cols > PAR_MIN)
  for (int r = 0; r < rows; r++) {
    const float *xr = x + (size_t)r * ldx, *dyr = dy + (size_t)r * lddy;
    float *dxr = dx + (size_t)r * lddx;
    for (int j = 0; j < cols; j++)
      if (xr[j] >= lo && xr[j] <= hi) dxr[j] += dyr[j];
  }
}

void ct_zero(size_t n, float *x) {
  if (n < 4 * PAR_MIN) {
    memset(x, 0, n * sizeof(float));
    return;
  }
  size_t chunk = 1 << 16;
  size_t nchunk = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < nchunk; c++) {
    size_t i0 = c * chunk, m = n - i0 < chunk ? n - i0 : chunk;
    memset(x + i0, 0, m * sizeof(float));
  }
}

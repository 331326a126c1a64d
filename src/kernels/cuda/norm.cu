// norm.cu: LayerNorm + adaLN modulation (ln_mod), affine LayerNorm, RMSNorm and GroupNorm of the
// CUDA backend (contracts: include/ctuner/kernels.h; the CPU twins: src/kernels/norm.c and
// conv.c's GroupNorm). One block of CT_CU_ROW_THREADS per row (per image and group for
// GroupNorm); row statistics by ct_block_sum (a fixed tree). Parameter gradients are sums over
// rows: per-block partials over fixed chunks of rows, then a second pass adding the chunks in
// order (reduce.cuh), never atomics, so every result is the same bits run after run.
#include "reduce.cuh"

extern "C" {
#include "kernels/cuda_elem.h"
}

// ---- LayerNorm + modulation ----
__global__ void ct_k_ln_mod_fwd(int L, int D, const float *x, int ldx, const float *shift,
                                const float *scale, int ldm, float eps, float *xhat, float *rstd,
                                float *h, int ldh) {
  __shared__ float sh[33];
  const int r = blockIdx.x;
  const float *xr = x + (size_t)r * ldx;
  float s = 0.0f;
  for (int j = threadIdx.x; j < D; j += blockDim.x) s += xr[j];
  s = ct_block_sum(s, sh);
  const float mean = s / (float)D;
  float v = 0.0f;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    const float d = xr[j] - mean;
    v += d * d;
  }
  v = ct_block_sum(v, sh);  // its barriers: every thread has read xr before h (may be x) is written
  const float rs = 1.0f / sqrtf(v / (float)D + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  const size_t bo = (size_t)(r / L) * ldm;
  float *xh = xhat + (size_t)r * D, *hr = h + (size_t)r * ldh;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    const float xv = (xr[j] - mean) * rs;
    const float a = scale ? 1.0f + scale[bo + j] : 1.0f;
    const float c = shift ? shift[bo + j] : 0.0f;
    xh[j] = xv;
    hr[j] = a * xv + c;
  }
}

void ct_cu_ln_mod_fwd(int B, int L, int D, const float *x, int ldx, const float *shift,
                      const float *scale, int ldm, float eps, float *xhat, float *rstd, float *h,
                      int ldh) {
  const int N = B * L;
  if (B <= 0 || L <= 0 || D <= 0) return;
  ct_k_ln_mod_fwd<<<(unsigned)N, CT_CU_ROW_THREADS, 0, ct_cu_stream()>>>(
      L, D, x, ldx, shift, scale, ldm, eps, xhat, rstd, h, ldh);
  CU_LAUNCHED("ln_mod_fwd");
}

__global__ void ct_k_ln_mod_bwd_dx(int L, int D, const float *xhat, const float *rstd,
                                   const float *scale, int ldm, const float *dh, int lddh,
                                   float *dx, int lddx) {
  __shared__ float sh[33];
  const int r = blockIdx.x;
  const float *xh = xhat + (size_t)r * D, *g = dh + (size_t)r * lddh;
  const float *sc = scale ? scale + (size_t)(r / L) * ldm : NULL;
  float s1 = 0.0f, s2 = 0.0f;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    const float gs = sc ? g[j] * (1.0f + sc[j]) : g[j];
    s1 += gs;
    s2 += gs * xh[j];
  }
  s1 = ct_block_sum(s1, sh);
  s2 = ct_block_sum(s2, sh);
  const float m1 = s1 / (float)D, m2 = s2 / (float)D, rs = rstd[r];
  float *dxr = dx + (size_t)r * lddx;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    const float gs = sc ? g[j] * (1.0f + sc[j]) : g[j];
    dxr[j] += rs * (gs - m1 - xh[j] * m2);
  }
}

// partials of sum dh (part) and sum dh * xhat (part + B * nch * D) over chunks of rows
__global__ void ct_k_ln_mod_bwd_params(int B, int L, int D, const float *xhat, const float *dh,
                                       int lddh, float *part, int nch) {
  __shared__ float red[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x, chunk = blockIdx.y, b = blockIdx.z;
  const int l0 = chunk * CT_CU_COLSUM_ROWS;
  const int l1 = L - l0 < CT_CU_COLSUM_ROWS ? L : l0 + CT_CU_COLSUM_ROWS;
  float a1 = 0.0f, a2 = 0.0f;
  if (c < D)
    for (int l = l0 + (int)threadIdx.y; l < l1; l += 8) {
      const size_t r = (size_t)b * L + l;
      const float g = dh[r * lddh + c];
      a1 += g;
      a2 += g * xhat[r * D + c];
    }
  ct_colsum_block(a1, red, part, b, nch, chunk, D, c);
  ct_colsum_block(a2, red, part + (size_t)B * nch * D, b, nch, chunk, D, c);
}

void ct_cu_ln_mod_bwd(int B, int L, int D, const float *xhat, const float *rstd, const float *scale,
                      int ldm, const float *dh, int lddh, float *dx, int lddx, float *dshift,
                      float *dscale) {
  if (B <= 0 || L <= 0 || D <= 0) return;
  if (dx) {
    ct_k_ln_mod_bwd_dx<<<(unsigned)(B * L), CT_CU_ROW_THREADS, 0, ct_cu_stream()>>>(
        L, D, xhat, rstd, scale, ldm, dh, lddh, dx, lddx);
    CU_LAUNCHED("ln_mod_bwd (dx)");
  }
  if (!dshift && !dscale) return;
  const int nch = ct_colsum_chunks(L);
  float *part = (float *)ct_cu_scratch(CT_CU_SLOT_PART, (size_t)2 * B * nch * D * sizeof(float));
  if (!part) return;
  dim3 grid((unsigned)((D + 31) / 32), (unsigned)nch, (unsigned)B), block(32, 8);
  ct_k_ln_mod_bwd_params<<<grid, block, 0, ct_cu_stream()>>>(B, L, D, xhat, dh, lddh, part, nch);
  CU_LAUNCHED("ln_mod_bwd (dshift, dscale)");
  ct_colsum_finish(B, D, nch, part, dshift, ldm);
  ct_colsum_finish(B, D, nch, part + (size_t)B * nch * D, dscale, ldm);
}

// ---- affine LayerNorm ----
__global__ void ct_k_layernorm_affine_fwd(int D, const float *x, int ldx, const float *gamma,
                                          const float *beta, float eps, float *y, int ldy) {
  __shared__ float sh[33];
  const int r = blockIdx.x;
  const float *xr = x + (size_t)r * ldx;
  float s = 0.0f;
  for (int j = threadIdx.x; j < D; j += blockDim.x) s += xr[j];
  s = ct_block_sum(s, sh);
  const float mean = s / (float)D;
  float v = 0.0f;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    const float d = xr[j] - mean;
    v += d * d;
  }
  v = ct_block_sum(v, sh);
  const float rs = 1.0f / sqrtf(v / (float)D + eps);
  float *yr = y + (size_t)r * ldy;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    float t = (xr[j] - mean) * rs;
    t = gamma ? t * gamma[j] : t;
    yr[j] = beta ? t + beta[j] : t;
  }
}

void ct_cu_layernorm_affine_fwd(int N, int D, const float *x, int ldx, const float *gamma,
                                const float *beta, float eps, float *y, int ldy) {
  if (N <= 0 || D <= 0) return;
  ct_k_layernorm_affine_fwd<<<(unsigned)N, CT_CU_ROW_THREADS, 0, ct_cu_stream()>>>(
      D, x, ldx, gamma, beta, eps, y, ldy);
  CU_LAUNCHED("layernorm_affine_fwd");
}

// ---- RMSNorm ----
__global__ void ct_k_rmsnorm_fwd(int D, const float *x, int ldx, const float *scale, float eps,
                                 float *y, int ldy, float *rstd) {
  __shared__ float sh[33];
  const int r = blockIdx.x;
  const float *xr = x + (size_t)r * ldx;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < D; j += blockDim.x) ss += xr[j] * xr[j];
  ss = ct_block_sum(ss, sh);
  const float rs = 1.0f / sqrtf(ss / (float)D + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  float *yr = y + (size_t)r * ldy;
  for (int j = threadIdx.x; j < D; j += blockDim.x) yr[j] = xr[j] * rs * scale[j];
}

void ct_cu_rmsnorm_fwd(int N, int D, const float *x, int ldx, const float *scale, float eps,
                       float *y, int ldy, float *rstd) {
  if (N <= 0 || D <= 0) return;
  ct_k_rmsnorm_fwd<<<(unsigned)N, CT_CU_ROW_THREADS, 0, ct_cu_stream()>>>(D, x, ldx, scale, eps, y,
                                                                          ldy, rstd);
  CU_LAUNCHED("rmsnorm_fwd");
}

__global__ void ct_k_rmsnorm_bwd_dx(int D, const float *x, int ldx, const float *scale,
                                    const float *rstd, const float *dy, int lddy, float *dx,
                                    int lddx) {
  __shared__ float sh[33];
  const int r = blockIdx.x;
  const float *xr = x + (size_t)r * ldx, *g = dy + (size_t)r * lddy;
  float s = 0.0f;
  for (int j = threadIdx.x; j < D; j += blockDim.x) s += g[j] * scale[j] * xr[j];
  s = ct_block_sum(s, sh);
  const float rs = rstd[r], c = rs * rs * rs * s / (float)D;
  float *dxr = dx + (size_t)r * lddx;
  for (int j = threadIdx.x; j < D; j += blockDim.x) dxr[j] += rs * scale[j] * g[j] - xr[j] * c;
}

__global__ void ct_k_rmsnorm_bwd_dscale(int N, int D, const float *x, int ldx, const float *rstd,
                                        const float *dy, int lddy, float *part, int nch) {
  __shared__ float red[8][33];
  // chunks on x (up to 2^31 - 1; y stops at 65535), column blocks on y
  const int c = blockIdx.y * 32 + threadIdx.x, chunk = blockIdx.x;
  const int r0 = chunk * CT_CU_COLSUM_ROWS;
  const int r1 = N - r0 < CT_CU_COLSUM_ROWS ? N : r0 + CT_CU_COLSUM_ROWS;
  float a = 0.0f;
  if (c < D)
    for (int r = r0 + (int)threadIdx.y; r < r1; r += 8)
      a += dy[(size_t)r * lddy + c] * x[(size_t)r * ldx + c] * rstd[r];
  ct_colsum_block(a, red, part, 0, nch, chunk, D, c);
}

void ct_cu_rmsnorm_bwd(int N, int D, const float *x, int ldx, const float *scale, const float *rstd,
                       const float *dy, int lddy, float *dx, int lddx, float *dscale) {
  if (N <= 0 || D <= 0) return;
  if (dx) {
    ct_k_rmsnorm_bwd_dx<<<(unsigned)N, CT_CU_ROW_THREADS, 0, ct_cu_stream()>>>(
        D, x, ldx, scale, rstd, dy, lddy, dx, lddx);
    CU_LAUNCHED("rmsnorm_bwd (dx)");
  }
  if (!dscale) return;
  const int nch = ct_colsum_chunks(N);
  float *part = (float *)ct_cu_scratch(CT_CU_SLOT_PART, (size_t)nch * D * sizeof(float));
  if (!part) return;
  dim3 grid((unsigned)nch, (unsigned)((D + 31) / 32), 1), block(32, 8);
  ct_k_rmsnorm_bwd_dscale<<<grid, block, 0, ct_cu_stream()>>>(N, D, x, ldx, rstd, dy, lddy, part,
                                                              nch);
  CU_LAUNCHED("rmsnorm_bwd (dscale)");
  ct_colsum_finish(1, D, nch, part, dscale, D);
}

// ---- GroupNorm (NCHW; statistics in double as the CPU's) ----
// one block per (image, group): its cg * HW elements are contiguous
__global__ void ct_k_groupnorm_fwd(int C, int HW, int G, float eps, const float *x,
                                   const float *gamma, const float *beta, float *y, float *mean,
                                   float *rstd) {
  __shared__ double sh[33];
  const int bg = blockIdx.x, bi = bg / G, g = bg % G, cg = C / G;
  const size_t n = (size_t)cg * HW, off = ((size_t)bi * C + (size_t)g * cg) * HW;
  const float *xg = x + off;
  double s1 = 0.0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) s1 += (double)xg[i];
  s1 = ct_block_sum(s1, sh);
  const double mu = s1 / (double)n;
  double s2 = 0.0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double d = (double)xg[i] - mu;
    s2 += d * d;
  }
  s2 = ct_block_sum(s2, sh);
  const double rs = 1.0 / sqrt(s2 / (double)n + (double)eps);
  if (threadIdx.x == 0) {
    mean[bg] = (float)mu;
    rstd[bg] = (float)rs;
  }
  float *yg = y + off;
  for (int c = 0; c < cg; c++) {
    const int ch = g * cg + c;
    const float a = (float)rs * (gamma ? gamma[ch] : 1.0f);
    const float bb = (beta ? beta[ch] : 0.0f) - (float)mu * a;
    for (int p = threadIdx.x; p < HW; p += blockDim.x)
      yg[(size_t)c * HW + p] = xg[(size_t)c * HW + p] * a + bb;
  }
}

void ct_cu_groupnorm_fwd(int B, int C, int HW, int G, float eps, const float *x, const float *gamma,
                         const float *beta, float *y, float *mean, float *rstd) {
  if (B <= 0 || C <= 0 || HW <= 0 || G <= 0) return;
  ct_k_groupnorm_fwd<<<(unsigned)(B * G), CT_CU_ROW_THREADS, 0, ct_cu_stream()>>>(
      C, HW, G, eps, x, gamma, beta, y, mean, rstd);
  CU_LAUNCHED("groupnorm_fwd");
}

// one block per channel: dgamma, dbeta += sums over images and pixels (double)
__global__ void ct_k_groupnorm_bwd_params(int B, int C, int HW, int G, const float *x,
                                          const float *mean, const float *rstd, const float *dy,
                                          float *dgamma, float *dbeta) {
  __shared__ double sh[33];
  const int ch = blockIdx.x, g = ch / (C / G);
  double sg = 0.0, sb = 0.0;
  for (int bi = 0; bi < B; bi++) {
    const float *xc = x + ((size_t)bi * C + ch) * HW, *gc = dy + ((size_t)bi * C + ch) * HW;
    const double mu = mean[bi * G + g], rs = rstd[bi * G + g];
    for (int p = threadIdx.x; p < HW; p += blockDim.x) {
      sg += (double)gc[p] * ((double)xc[p] - mu) * rs;
      sb += (double)gc[p];
    }
  }
  sg = ct_block_sum(sg, sh);
  sb = ct_block_sum(sb, sh);
  if (threadIdx.x == 0) {
    if (dgamma) dgamma[ch] = (float)((double)dgamma[ch] + sg);
    if (dbeta) dbeta[ch] = (float)((double)dbeta[ch] + sb);
  }
}

__global__ void ct_k_groupnorm_bwd_dx(int C, int HW, int G, const float *x, const float *gamma,
                                      const float *mean, const float *rstd, const float *dy,
                                      float *dx) {
  __shared__ double sh[33];
  const int bg = blockIdx.x, bi = bg / G, g = bg % G, cg = C / G;
  const size_t n = (size_t)cg * HW, off = ((size_t)bi * C + (size_t)g * cg) * HW;
  const double mu = mean[bg], rs = rstd[bg];
  double s1 = 0.0, s2 = 0.0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int c = (int)(i / (size_t)HW);
    const double ga = gamma ? gamma[g * cg + c] : 1.0;
    const double dxh = (double)dy[off + i] * ga, xh = ((double)x[off + i] - mu) * rs;
    s1 += dxh;
    s2 += dxh * xh;
  }
  s1 = ct_block_sum(s1, sh);
  s2 = ct_block_sum(s2, sh);
  const double m1 = s1 / (double)n, m2 = s2 / (double)n;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int c = (int)(i / (size_t)HW);
    const double ga = gamma ? gamma[g * cg + c] : 1.0;
    const double xh = ((double)x[off + i] - mu) * rs;
    dx[off + i] = (float)(rs * ((double)dy[off + i] * ga - m1 - xh * m2));
  }
}

void ct_cu_groupnorm_bwd(int B, int C, int HW, int G, const float *x, const float *gamma,
                         const float *mean, const float *rstd, const float *dy, float *dx,
                         float *dgamma, float *dbeta) {
  if (B <= 0 || C <= 0 || HW <= 0 || G <= 0) return;
  if (dgamma || dbeta) {
    ct_k_groupnorm_bwd_params<<<(unsigned)C, CT_CU_ROW_THREADS, 0, ct_cu_stream()>>>(
        B, C, HW, G, x, mean, rstd, dy, dgamma, dbeta);
    CU_LAUNCHED("groupnorm_bwd (dgamma, dbeta)");
  }
  if (!dx) return;
  ct_k_groupnorm_bwd_dx<<<(unsigned)(B * G), CT_CU_ROW_THREADS, 0, ct_cu_stream()>>>(
      C, HW, G, x, gamma, mean, rstd, dy, dx);
  CU_LAUNCHED("groupnorm_bwd (dx)");
}

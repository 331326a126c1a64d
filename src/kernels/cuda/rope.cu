// rope.cu: the RoPE table, rotations, and the fused query/key preparation (RMSNorm + RoPE + head
// split) of the CUDA backend (contracts: include/ctuner/kernels.h; the CPU twin:
// src/kernels/rope.c). The table's angles are computed in double and rounded once, as the CPU's.
// qkv_heads: one warp per (row, head, q or k), its RMSNorm sum by a warp butterfly; the scale
// gradients: two-pass column sums over (row, head) in order (reduce.cuh), never atomics.
#include "reduce.cuh"

extern "C" {
#include "kernels/cuda_elem.h"
}

#define CT_CU_QK_EPS 1e-6f
#define CT_CU_QK_WARPS 4  // warps per block in qkv_heads

struct ct_f_rope_table {
  const int *pos;
  int a0, a1, a2, half;
  float theta;
  float *pe;
  CT_HD void operator()(int l, int p) const {
    int i = 0, j = p;
    if (j >= a0 / 2) {
      j -= a0 / 2;
      i = 1;
      if (j >= a1 / 2) {
        j -= a1 / 2;
        i = 2;
        if (j >= a2 / 2) return;  // past the pairs the axes give (odd axes): untouched
      }
    }
    const int ax = i == 0 ? a0 : i == 1 ? a1 : a2;
    const double omega = 1.0 / pow((double)theta, (double)(2 * j) / (double)ax);
    const double a = (double)pos[l * 3 + i] * omega;
    float *e = pe + ((size_t)l * half + p) * 2;
    e[0] = (float)cos(a);
    e[1] = (float)sin(a);
  }
};

template <class Run>
static void rope_table_impl(Run run, int L, const int *pos, const int axes[3], float theta,
                            float *pe) {
  const int half = (axes[0] + axes[1] + axes[2]) / 2;
  if (L <= 0 || half <= 0) return;
  const int *dpos = (const int *)run.in(pos, (size_t)L * 3 * sizeof(int));
  if (!dpos) return;
  run.rows("rope_table", L, half,
           ct_f_rope_table{dpos, axes[0], axes[1], axes[2], half, theta, pe});
}
void ct_cu_rope_table(int L, const int *pos, const int axes[3], float theta, float *pe) {
  rope_table_impl(ct_dev_run(), L, pos, axes, theta, pe);
}
void ct_cuh_rope_table(int L, const int *pos, const int axes[3], float theta, float *pe) {
  rope_table_impl(ct_host_run(), L, pos, axes, theta, pe);
}

struct ct_f_rope {
  int L, D;
  const float *pe;
  const float *x;
  int ldx;
  float *y;
  int ldy, transpose;
  CT_HD void operator()(int r, int j) const {
    const float *e = pe + (size_t)(r % L) * D + 2 * j;
    const float c = e[0], s = e[1];
    const float *xr = x + (size_t)r * ldx + 2 * j;
    const float x0 = xr[0], x1 = xr[1];
    float *yr = y + (size_t)r * ldy + 2 * j;
    if (transpose) {  // R^T
      yr[0] = c * x0 + s * x1;
      yr[1] = c * x1 - s * x0;
    } else {
      yr[0] = c * x0 - s * x1;
      yr[1] = s * x0 + c * x1;
    }
  }
};

template <class Run>
static void rope_fwd_impl(Run run, int N, int L, int D, const float *pe, const float *x, int ldx,
                          float *y, int ldy) {
  if (L <= 0) return;
  run.rows("rope_fwd", N, D / 2, ct_f_rope{L, D, pe, x, ldx, y, ldy, 0});
}
void ct_cu_rope_fwd(int N, int L, int D, const float *pe, const float *x, int ldx, float *y,
                    int ldy) {
  rope_fwd_impl(ct_dev_run(), N, L, D, pe, x, ldx, y, ldy);
}
void ct_cuh_rope_fwd(int N, int L, int D, const float *pe, const float *x, int ldx, float *y,
                     int ldy) {
  rope_fwd_impl(ct_host_run(), N, L, D, pe, x, ldx, y, ldy);
}

template <class Run>
static void rope_bwd_impl(Run run, int N, int L, int D, const float *pe, const float *dy, int lddy,
                          float *dx, int lddx) {
  if (L <= 0) return;
  run.rows("rope_bwd", N, D / 2, ct_f_rope{L, D, pe, dy, lddy, dx, lddx, 1});
}
void ct_cu_rope_bwd(int N, int L, int D, const float *pe, const float *dy, int lddy, float *dx,
                    int lddx) {
  rope_bwd_impl(ct_dev_run(), N, L, D, pe, dy, lddy, dx, lddx);
}
void ct_cuh_rope_bwd(int N, int L, int D, const float *pe, const float *dy, int lddy, float *dx,
                     int lddx) {
  rope_bwd_impl(ct_host_run(), N, L, D, pe, dy, lddy, dx, lddx);
}

// ---- qkv_heads ----
// unit u = (rr * H + h) * 2 + which (0: q, 1: k), one warp each
__global__ void ct_k_qkv_fwd(int N, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                             const float *qscale, const float *kscale, const float *pe, float *q,
                             float *k, float *rstd_q, float *rstd_k) {
  const size_t u = (size_t)blockIdx.x * CT_CU_QK_WARPS + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (u >= (size_t)N * H * 2) return;  // the whole warp: u is the warp's
  const int which = (int)(u & 1);
  const size_t rh = u >> 1;
  const int rr = (int)(rh / (size_t)H), h = (int)(rh % (size_t)H);
  const int b = rr / Ls, p = off + rr % Ls;
  const float *x = qkv + (size_t)rr * 3 * H * hd + (size_t)(which * H + h) * hd;
  const float *s = which ? kscale : qscale;
  const float *pel = pe + (size_t)p * hd;
  float ss = 0.0f;
  for (int j = lane; j < hd; j += 32) ss += x[j] * x[j];
  ss = ct_warp_sum(ss);
  const float r = 1.0f / sqrtf(ss / (float)hd + CT_CU_QK_EPS);
  float *out = (which ? k : q) + (((size_t)b * H + h) * Lt + p) * hd;
  for (int j = lane; j < hd / 2; j += 32) {
    const float c = pel[2 * j], sn = pel[2 * j + 1];
    const float x0 = x[2 * j] * r * s[2 * j], x1 = x[2 * j + 1] * r * s[2 * j + 1];
    out[2 * j] = c * x0 - sn * x1;
    out[2 * j + 1] = sn * x0 + c * x1;
  }
  if (lane == 0) (which ? rstd_k : rstd_q)[rh] = r;
}

// v = v_raw, and dqkv's v part = dv: row rh = rr * H + h, column j (dir 0: qkv -> v, 1: dv -> dqkv)
struct ct_f_qkv_v {
  int Ls, Lt, off, H, hd, dir;
  const float *src;
  float *dst;
  CT_HD void operator()(int rh, int j) const {
    const int rr = rh / H, h = rh % H, b = rr / Ls, p = off + rr % Ls;
    const size_t packed = (size_t)rr * 3 * H * hd + (size_t)(2 * H + h) * hd + j;
    const size_t heads = (((size_t)b * H + h) * Lt + p) * hd + j;
    if (dir == 0)
      dst[heads] = src[packed];
    else
      dst[packed] = src[heads];
  }
};

void ct_cu_qkv_heads_fwd(int B, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                         const float *qscale, const float *kscale, const float *pe, float *q,
                         float *k, float *v, float *rstd_q, float *rstd_k) {
  const int N = B * Ls;
  if (B <= 0 || Ls <= 0 || H <= 0 || hd <= 0) return;
  const size_t units = (size_t)N * H * 2;
  const unsigned blocks = (unsigned)((units + CT_CU_QK_WARPS - 1) / CT_CU_QK_WARPS);
  ct_k_qkv_fwd<<<blocks, 32 * CT_CU_QK_WARPS, 0, ct_cu_stream()>>>(
      N, Ls, Lt, off, H, hd, qkv, qscale, kscale, pe, q, k, rstd_q, rstd_k);
  CU_LAUNCHED("qkv_heads_fwd (q, k)");
  ct_launch_rows("qkv_heads_fwd (v)", N * H, hd, ct_f_qkv_v{Ls, Lt, off, H, hd, 0, qkv, v});
}

__global__ void ct_k_qkv_bwd(int N, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                             const float *qscale, const float *kscale, const float *pe,
                             const float *rstd_q, const float *rstd_k, const float *dq,
                             const float *dk, float *dqkv) {
  const size_t u = (size_t)blockIdx.x * CT_CU_QK_WARPS + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (u >= (size_t)N * H * 2) return;
  const int which = (int)(u & 1);
  const size_t rh = u >> 1;
  const int rr = (int)(rh / (size_t)H), h = (int)(rh % (size_t)H);
  const int b = rr / Ls, p = off + rr % Ls;
  const size_t xo = (size_t)rr * 3 * H * hd + (size_t)(which * H + h) * hd;
  const float *x = qkv + xo;
  const float *s = which ? kscale : qscale;
  const float *pel = pe + (size_t)p * hd;
  const float *d = (which ? dk : dq) + (((size_t)b * H + h) * Lt + p) * hd;
  const float r = (which ? rstd_k : rstd_q)[rh];
  float dot = 0.0f;
  for (int j = lane; j < hd / 2; j += 32) {
    const float c = pel[2 * j], sn = pel[2 * j + 1];
    dot += (c * d[2 * j] + sn * d[2 * j + 1]) * s[2 * j] * x[2 * j] +
           (c * d[2 * j + 1] - sn * d[2 * j]) * s[2 * j + 1] * x[2 * j + 1];
  }
  dot = ct_warp_sum(dot);
  const float cc = r * r * r * dot / (float)hd;
  float *dx = dqkv + xo;
  for (int j = lane; j < hd / 2; j += 32) {
    const float c = pel[2 * j], sn = pel[2 * j + 1];
    const float g0 = c * d[2 * j] + sn * d[2 * j + 1];
    const float g1 = c * d[2 * j + 1] - sn * d[2 * j];
    dx[2 * j] = r * s[2 * j] * g0 - x[2 * j] * cc;
    dx[2 * j + 1] = r * s[2 * j + 1] * g1 - x[2 * j + 1] * cc;
  }
}

// partial sums over chunks of rows rh = rr * H + h of g_j x_j r (blockIdx.z: 0 q, 1 k)
__global__ void ct_k_qkv_dscale(int N, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                                const float *pe, const float *rstd_q, const float *rstd_k,
                                const float *dq, const float *dk, float *part, int nch) {
  __shared__ float red[8][33];
  // chunks on x (up to 2^31 - 1; y stops at 65535), column blocks on y
  const int c = blockIdx.y * 32 + threadIdx.x, chunk = blockIdx.x, which = blockIdx.z;
  const int rows = N * H;
  const int r0 = chunk * CT_CU_COLSUM_ROWS;
  const int r1 = rows - r0 < CT_CU_COLSUM_ROWS ? rows : r0 + CT_CU_COLSUM_ROWS;
  const float *dsrc = which ? dk : dq, *rstd = which ? rstd_k : rstd_q;
  const int c0 = c & ~1;  // the pair's first column
  float a = 0.0f;
  if (c < hd && c0 + 1 < hd)
    for (int rh = r0 + (int)threadIdx.y; rh < r1; rh += 8) {
      const int rr = rh / H, h = rh % H, b = rr / Ls, p = off + rr % Ls;
      const float *pel = pe + (size_t)p * hd + c0;
      const float *d = dsrc + (((size_t)b * H + h) * Lt + p) * hd + c0;
      const float x = qkv[(size_t)rr * 3 * H * hd + (size_t)(which * H + h) * hd + c];
      const float cs = pel[0], sn = pel[1];
      const float g = (c & 1) ? cs * d[1] - sn * d[0] : cs * d[0] + sn * d[1];
      a += g * x * rstd[rh];
    }
  ct_colsum_block(a, red, part, which, nch, chunk, hd, c);
}

void ct_cu_qkv_heads_bwd(int B, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                         const float *qscale, const float *kscale, const float *pe,
                         const float *rstd_q, const float *rstd_k, const float *dq, const float *dk,
                         const float *dv, float *dqkv, float *dqscale, float *dkscale) {
  const int N = B * Ls;
  if (B <= 0 || Ls <= 0 || H <= 0 || hd <= 0) return;
  const size_t units = (size_t)N * H * 2;
  const unsigned blocks = (unsigned)((units + CT_CU_QK_WARPS - 1) / CT_CU_QK_WARPS);
  ct_k_qkv_bwd<<<blocks, 32 * CT_CU_QK_WARPS, 0, ct_cu_stream()>>>(
      N, Ls, Lt, off, H, hd, qkv, qscale, kscale, pe, rstd_q, rstd_k, dq, dk, dqkv);
  CU_LAUNCHED("qkv_heads_bwd (dq, dk)");
  ct_launch_rows("qkv_heads_bwd (dv)", N * H, hd, ct_f_qkv_v{Ls, Lt, off, H, hd, 1, dv, dqkv});
  if (!dqscale && !dkscale) return;
  const int nch = ct_colsum_chunks(N * H);
  float *part = (float *)ct_cu_scratch(CT_CU_SLOT_PART, (size_t)2 * nch * hd * sizeof(float));
  if (!part) return;
  dim3 grid((unsigned)nch, (unsigned)((hd + 31) / 32), 2), block(32, 8);
  ct_k_qkv_dscale<<<grid, block, 0, ct_cu_stream()>>>(N, Ls, Lt, off, H, hd, qkv, pe, rstd_q,
                                                      rstd_k, dq, dk, part, nch);
  CU_LAUNCHED("qkv_heads_bwd (dqscale, dkscale)");
  ct_colsum_finish(1, hd, nch, part, dqscale, hd);
  ct_colsum_finish(1, hd, nch, part + (size_t)nch * hd, dkscale, hd);
}

// attention.cu: the CUDA backend's softmax attention, forward and backward
// (kernels.h's ct_attention_fwd/bwd contracts: q, k, v (B, H, L, hd); o and
// dout (B, L, H * hd); lse (B, H, L); dq, dk, dv overwritten), float32 in and
// out, any head dim up to 256, causal or not, any L (the tail tile masked).
//
// Forward (FlashAttention-2 structure): a block of 4 warps per (batch * head,
// 16 queries), 4 queries per warp. The block's queries (pre-scaled: scale q)
// sit in shared memory; per tile of 32 keys, K and V are loaded, lane j
// computes the scores of key j against the warp's 4 queries, the online
// softmax moves each row's max m and sum l (warp reductions), and each lane
// accumulates output dims lane, lane + 32, ... from P (shared, per warp) and
// V. At the end o = acc / l and lse = m + log l, kept for the backward.
//
// Backward, deterministic (no atomics; each output element is written by one
// thread after a fixed sequence of operations): D = rowsum(dO o O) first
// (one warp per row); then one pass per tile of 16 keys (4 per warp) looping
// over every tile of 32 queries (one per lane) that sees them: P = exp(s -
// lse) recomputed, dS = P (dP - D), dV += P^T dO and dK += dS^T Q
// accumulated in registers; and one pass per tile of 16 queries looping over
// the key tiles: dQ += dS K.
//
// attention_bias_fwd (T5) is the forward kernel with bias[h][i][j] added to the
// scores, without lse; float32 in both rows (cpu-bf16 keeps it float32 too).
//
// bf16 (the "cuda-bf16" row): the operands of every product rounded to bf16
// (nearest even) as attention_flash.c does with bf16 = 1: scores bf16(scale q)
// . bf16(k), P V on bf16(P) and bf16(V) (P unnormalised, the sum l of the
// unrounded P), dP = bf16(dO) . bf16(V), dV on bf16(P) and bf16(dO), dK =
// scale (bf16(dS) . bf16(q)), dQ = scale (bf16(dS) . bf16(k)); the softmax, D
// and the accumulators float32. The float32 mode computes dK as dS . (scale q).
//
// Head dims above 256 (the VAE's 512-wide head) take attention.c's score-tile
// algorithm instead (attention_tiles.cuh: cuBLASLt products on chunks of
// queries, a row softmax), float32 in both rows as on the CPU.
//
// Plain fp32 FMA from shared memory (tensor-core mma is a later step). The
// tile loops, mask and recurrences are attention_core.cuh's, which the host
// self-test runs too.
#include <stdio.h>

#include "attention_core.cuh"
#include "attention_tiles.cuh"
#include "common.cuh"

extern "C" void ct_cu_sgemm(int transA, int transB, int M, int N, int K, float alpha,
                            const float *A, int lda, const float *B, int ldb, float beta, float *C,
                            int ldc);

namespace {

constexpr int kThreads = CU_ATT_WARPS * 32;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

// rows [r0, r0 + n) of X (row i at X + i * ld) into S (n rows, sp apart) as c * x
// (bf: rounded), zeros past L or hd up to the padded width
__device__ __forceinline__ void load_rows(float *S, int n, int sp, const float *X, size_t ld,
                                          int r0, int L, int hd, float c, bool bf) {
  int w = sp - 1;
  for (int idx = threadIdx.x; idx < n * w; idx += blockDim.x) {
    int r = idx / w, d = idx - r * w, i = r0 + r;
    float x = i < L && d < hd ? c * X[(size_t)i * ld + d] : 0.0f;
    S[r * sp + d] = cu_att_op(x, bf);
  }
}

// ---- forward ---------------------------------------------------------------
template <bool BF, bool BIAS>
__global__ void __launch_bounds__(kThreads)
    att_fwd_kernel(int H, int L, int hd, float scale, int causal, const float *__restrict__ q,
                   const float *__restrict__ k, const float *__restrict__ v,
                   const float *__restrict__ bias, float *__restrict__ o, float *__restrict__ lse) {
  extern __shared__ float sm[];
  const int nt = (hd + 31) / 32, sp = cu_att_sp(hd);
  float *Qs = sm, *Ks = Qs + CU_ATT_ROWS * sp, *Vs = Ks + CU_ATT_KT * sp;
  float *Ps = Vs + CU_ATT_KT * sp;  // [warp][row][key]
  const int bh = blockIdx.y, b = bh / H, h = bh % H, i0 = blockIdx.x * CU_ATT_ROWS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float *Q = q + cu_att_qoff(bh, 0, L, hd), *K = k + cu_att_qoff(bh, 0, L, hd);
  const float *V = v + cu_att_qoff(bh, 0, L, hd);
  float *P = Ps + warp * CU_ATT_R * CU_ATT_KT;
  load_rows(Qs, CU_ATT_ROWS, sp, Q, hd, i0, L, hd, scale, BF);
  float m[CU_ATT_R], l[CU_ATT_R], acc[CU_ATT_R][CU_ATT_MAXT];
#pragma unroll
  for (int r = 0; r < CU_ATT_R; r++) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int t = 0; t < CU_ATT_MAXT; t++) acc[r][t] = 0.0f;
  }
  const int kend = cu_att_kend(i0, CU_ATT_ROWS, L, causal);
  for (int j0 = 0; j0 < kend; j0 += CU_ATT_KT) {
    __syncthreads();  // the previous tile's readers are done
    load_rows(Ks, CU_ATT_KT, sp, K, hd, j0, L, hd, 1.0f, BF);
    load_rows(Vs, CU_ATT_KT, sp, V, hd, j0, L, hd, 1.0f, BF);
    __syncthreads();
    float s[CU_ATT_R];
#pragma unroll
    for (int r = 0; r < CU_ATT_R; r++) {  // T5's bias (visible scores) is where the sums start
      const int i = i0 + warp * CU_ATT_R + r, j = j0 + lane;
      s[r] = BIAS && cu_att_visible(i, j, L, causal) ? __ldg(bias + cu_att_boff(h, i, j, L)) : 0.0f;
    }
    const float *kr = Ks + lane * sp, *qr = Qs + warp * CU_ATT_R * sp;
    for (int d = 0; d < hd; d++) {
      float kv = kr[d];
#pragma unroll
      for (int r = 0; r < CU_ATT_R; r++) s[r] = fmaf(qr[r * sp + d], kv, s[r]);
    }
    const int j = j0 + lane;
#pragma unroll
    for (int r = 0; r < CU_ATT_R; r++) {
      const int i = i0 + warp * CU_ATT_R + r;
      const bool vis = cu_att_visible(i, j, L, causal);
      float mn = fmaxf(m[r], warp_max(vis ? s[r] : -INFINITY));
      float corr = cu_att_corr(m[r], mn);
      float p = cu_att_p(s[r], mn, vis);
      l[r] = l[r] * corr + warp_sum(p);
      m[r] = mn;
#pragma unroll
      for (int t = 0; t < CU_ATT_MAXT; t++) acc[r][t] *= corr;
      P[r * CU_ATT_KT + lane] = cu_att_op(p, BF);
    }
    __syncwarp();
    const int nk = min(CU_ATT_KT, kend - j0);
    for (int jj = 0; jj < nk; jj++) {
      float pr[CU_ATT_R];
#pragma unroll
      for (int r = 0; r < CU_ATT_R; r++) pr[r] = P[r * CU_ATT_KT + jj];
#pragma unroll
      for (int t = 0; t < CU_ATT_MAXT; t++)
        if (t < nt) {
          float vv = Vs[jj * sp + t * 32 + lane];
#pragma unroll
          for (int r = 0; r < CU_ATT_R; r++) acc[r][t] = fmaf(pr[r], vv, acc[r][t]);
        }
    }
    __syncwarp();
  }
#pragma unroll
  for (int r = 0; r < CU_ATT_R; r++) {
    const int i = i0 + warp * CU_ATT_R + r;
    if (i >= L) continue;
    float inv = 1.0f / l[r];
    float *orow = o + cu_att_ooff(b, h, i, L, H, hd);
#pragma unroll
    for (int t = 0; t < CU_ATT_MAXT; t++) {
      int d = t * 32 + lane;
      if (t < nt && d < hd) orow[d] = acc[r][t] * inv;
    }
    if (!BIAS && lane == 0) lse[(size_t)bh * L + i] = m[r] + logf(l[r]);
  }
}

// ---- backward: D = rowsum(dO o O) ---------------------------------------------
__global__ void att_rowdot_kernel(int BH, int H, int L, int hd, const float *__restrict__ o,
                                  const float *__restrict__ dout, float *__restrict__ D) {
  size_t row = (size_t)blockIdx.x * CU_ATT_WARPS + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= (size_t)BH * L) return;
  int bh = (int)(row / (size_t)L), i = (int)(row - (size_t)bh * L), b = bh / H, h = bh % H;
  size_t off = cu_att_ooff(b, h, i, L, H, hd);
  float acc = 0.0f;
  for (int d = lane; d < hd; d += 32) acc = fmaf(dout[off + d], o[off + d], acc);
  acc = warp_sum(acc);
  if (lane == 0) D[row] = acc;
}

// ---- backward: dK, dV per tile of 16 keys --------------------------------------
template <bool BF>
__global__ void __launch_bounds__(kThreads)
    att_dkdv_kernel(int H, int L, int hd, float scale, int causal, const float *__restrict__ q,
                    const float *__restrict__ k, const float *__restrict__ v,
                    const float *__restrict__ lse, const float *__restrict__ D,
                    const float *__restrict__ dout, float *__restrict__ dk,
                    float *__restrict__ dv) {
  extern __shared__ float sm[];
  const int nt = (hd + 31) / 32, sp = cu_att_sp(hd);
  float *Ks = sm, *Vs = Ks + CU_ATT_ROWS * sp, *Qs = Vs + CU_ATT_ROWS * sp;
  float *dOs = Qs + CU_ATT_KT * sp;
  float *Qd = BF ? dOs + CU_ATT_KT * sp : Qs;  // the dK product's q: bf16(q), or scale q
  float *Ps = (BF ? Qd : dOs) + CU_ATT_KT * sp, *dSs = Ps + CU_ATT_ROWS * CU_ATT_KT;
  float *ls = dSs + CU_ATT_ROWS * CU_ATT_KT, *Ds = ls + CU_ATT_KT;
  const int bh = blockIdx.y, b = bh / H, h = bh % H, j0 = blockIdx.x * CU_ATT_ROWS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t hoff = cu_att_qoff(bh, 0, L, hd), ldo = (size_t)H * hd;
  const float *dO = dout + cu_att_ooff(b, h, 0, L, H, hd);
  float *P = Ps + warp * CU_ATT_R * CU_ATT_KT, *dS = dSs + warp * CU_ATT_R * CU_ATT_KT;
  load_rows(Ks, CU_ATT_ROWS, sp, k + hoff, hd, j0, L, hd, 1.0f, BF);
  load_rows(Vs, CU_ATT_ROWS, sp, v + hoff, hd, j0, L, hd, 1.0f, BF);
  float gk[CU_ATT_R][CU_ATT_MAXT], gv[CU_ATT_R][CU_ATT_MAXT];
#pragma unroll
  for (int r = 0; r < CU_ATT_R; r++)
#pragma unroll
    for (int t = 0; t < CU_ATT_MAXT; t++) gk[r][t] = gv[r][t] = 0.0f;
  for (int q0 = cu_att_qstart(j0, causal); q0 < L; q0 += CU_ATT_KT) {
    __syncthreads();
    load_rows(Qs, CU_ATT_KT, sp, q + hoff, hd, q0, L, hd, scale, BF);
    if (BF) load_rows(Qd, CU_ATT_KT, sp, q + hoff, hd, q0, L, hd, 1.0f, true);
    load_rows(dOs, CU_ATT_KT, sp, dO, ldo, q0, L, hd, 1.0f, BF);
    if (threadIdx.x < CU_ATT_KT) {
      int i = q0 + threadIdx.x;
      ls[threadIdx.x] = i < L ? lse[(size_t)bh * L + i] : 0.0f;
      Ds[threadIdx.x] = i < L ? D[(size_t)bh * L + i] : 0.0f;
    }
    __syncthreads();
    const int i = q0 + lane;
    float s[CU_ATT_R], dp[CU_ATT_R];
#pragma unroll
    for (int r = 0; r < CU_ATT_R; r++) s[r] = dp[r] = 0.0f;
    const float *qr = Qs + lane * sp, *orow = dOs + lane * sp;
    const float *kr = Ks + warp * CU_ATT_R * sp, *vr = Vs + warp * CU_ATT_R * sp;
    for (int d = 0; d < hd; d++) {
      float qv = qr[d], ov = orow[d];
#pragma unroll
      for (int r = 0; r < CU_ATT_R; r++) {
        s[r] = fmaf(qv, kr[r * sp + d], s[r]);
        dp[r] = fmaf(ov, vr[r * sp + d], dp[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < CU_ATT_R; r++) {
      const int j = j0 + warp * CU_ATT_R + r;
      const bool vis = cu_att_visible(i, j, L, causal);
      float p = cu_att_prob(s[r], ls[lane], vis);
      float g = cu_att_ds(p, dp[r], Ds[lane]);
      P[r * CU_ATT_KT + lane] = cu_att_op(p, BF);
      dS[r * CU_ATT_KT + lane] = cu_att_op(g, BF);
    }
    __syncwarp();
    const int nq = min(CU_ATT_KT, L - q0);
    for (int qq = 0; qq < nq; qq++) {
      float pr[CU_ATT_R], gr[CU_ATT_R];
#pragma unroll
      for (int r = 0; r < CU_ATT_R; r++) {
        pr[r] = P[r * CU_ATT_KT + qq];
        gr[r] = dS[r * CU_ATT_KT + qq];
      }
#pragma unroll
      for (int t = 0; t < CU_ATT_MAXT; t++)
        if (t < nt) {
          float ov = dOs[qq * sp + t * 32 + lane], qv = Qd[qq * sp + t * 32 + lane];
#pragma unroll
          for (int r = 0; r < CU_ATT_R; r++) {
            gv[r][t] = fmaf(pr[r], ov, gv[r][t]);
            gk[r][t] = fmaf(gr[r], qv, gk[r][t]);
          }
        }
    }
    __syncwarp();
  }
  const float ks = BF ? scale : 1.0f;
#pragma unroll
  for (int r = 0; r < CU_ATT_R; r++) {
    const int j = j0 + warp * CU_ATT_R + r;
    if (j >= L) continue;
    float *dkr = dk + hoff + (size_t)j * hd, *dvr = dv + hoff + (size_t)j * hd;
#pragma unroll
    for (int t = 0; t < CU_ATT_MAXT; t++) {
      int d = t * 32 + lane;
      if (t < nt && d < hd) {
        dkr[d] = ks * gk[r][t];
        dvr[d] = gv[r][t];
      }
    }
  }
}

// ---- backward: dQ per tile of 16 queries ---------------------------------------
template <bool BF>
__global__ void __launch_bounds__(kThreads)
    att_dq_kernel(int H, int L, int hd, float scale, int causal, const float *__restrict__ q,
                  const float *__restrict__ k, const float *__restrict__ v,
                  const float *__restrict__ lse, const float *__restrict__ D,
                  const float *__restrict__ dout, float *__restrict__ dq) {
  extern __shared__ float sm[];
  const int nt = (hd + 31) / 32, sp = cu_att_sp(hd);
  float *Qs = sm, *dOs = Qs + CU_ATT_ROWS * sp, *Ks = dOs + CU_ATT_ROWS * sp;
  float *Vs = Ks + CU_ATT_KT * sp, *dSs = Vs + CU_ATT_KT * sp;
  float *ls = dSs + CU_ATT_ROWS * CU_ATT_KT, *Ds = ls + CU_ATT_ROWS;
  const int bh = blockIdx.y, b = bh / H, h = bh % H, i0 = blockIdx.x * CU_ATT_ROWS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t hoff = cu_att_qoff(bh, 0, L, hd), ldo = (size_t)H * hd;
  float *dS = dSs + warp * CU_ATT_R * CU_ATT_KT;
  load_rows(Qs, CU_ATT_ROWS, sp, q + hoff, hd, i0, L, hd, scale, BF);
  load_rows(dOs, CU_ATT_ROWS, sp, dout + cu_att_ooff(b, h, 0, L, H, hd), ldo, i0, L, hd, 1.0f, BF);
  if (threadIdx.x < CU_ATT_ROWS) {
    int i = i0 + threadIdx.x;
    ls[threadIdx.x] = i < L ? lse[(size_t)bh * L + i] : 0.0f;
    Ds[threadIdx.x] = i < L ? D[(size_t)bh * L + i] : 0.0f;
  }
  float g[CU_ATT_R][CU_ATT_MAXT];
#pragma unroll
  for (int r = 0; r < CU_ATT_R; r++)
#pragma unroll
    for (int t = 0; t < CU_ATT_MAXT; t++) g[r][t] = 0.0f;
  __syncthreads();
  float lr[CU_ATT_R], Dr[CU_ATT_R];  // the warp's rows' lse and D
#pragma unroll
  for (int r = 0; r < CU_ATT_R; r++) {
    lr[r] = ls[warp * CU_ATT_R + r];
    Dr[r] = Ds[warp * CU_ATT_R + r];
  }
  const int kend = cu_att_kend(i0, CU_ATT_ROWS, L, causal);
  for (int j0 = 0; j0 < kend; j0 += CU_ATT_KT) {
    __syncthreads();
    load_rows(Ks, CU_ATT_KT, sp, k + hoff, hd, j0, L, hd, 1.0f, BF);
    load_rows(Vs, CU_ATT_KT, sp, v + hoff, hd, j0, L, hd, 1.0f, BF);
    __syncthreads();
    const int j = j0 + lane;
    float s[CU_ATT_R], dp[CU_ATT_R];
#pragma unroll
    for (int r = 0; r < CU_ATT_R; r++) s[r] = dp[r] = 0.0f;
    const float *kr = Ks + lane * sp, *vr = Vs + lane * sp;
    const float *qr = Qs + warp * CU_ATT_R * sp, *orow = dOs + warp * CU_ATT_R * sp;
    for (int d = 0; d < hd; d++) {
      float kv = kr[d], vv = vr[d];
#pragma unroll
      for (int r = 0; r < CU_ATT_R; r++) {
        s[r] = fmaf(qr[r * sp + d], kv, s[r]);
        dp[r] = fmaf(orow[r * sp + d], vv, dp[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < CU_ATT_R; r++) {
      const int i = i0 + warp * CU_ATT_R + r;
      const bool vis = cu_att_visible(i, j, L, causal);
      float p = cu_att_prob(s[r], lr[r], vis);
      dS[r * CU_ATT_KT + lane] = cu_att_op(cu_att_ds(p, dp[r], Dr[r]), BF);
    }
    __syncwarp();
    const int nk = min(CU_ATT_KT, kend - j0);
    for (int jj = 0; jj < nk; jj++) {
      float gr[CU_ATT_R];
#pragma unroll
      for (int r = 0; r < CU_ATT_R; r++) gr[r] = dS[r * CU_ATT_KT + jj];
#pragma unroll
      for (int t = 0; t < CU_ATT_MAXT; t++)
        if (t < nt) {
          float kv = Ks[jj * sp + t * 32 + lane];
#pragma unroll
          for (int r = 0; r < CU_ATT_R; r++) g[r][t] = fmaf(gr[r], kv, g[r][t]);
        }
    }
    __syncwarp();
  }
#pragma unroll
  for (int r = 0; r < CU_ATT_R; r++) {
    const int i = i0 + warp * CU_ATT_R + r;
    if (i >= L) continue;
    float *dqr = dq + hoff + (size_t)i * hd;
#pragma unroll
    for (int t = 0; t < CU_ATT_MAXT; t++) {
      int d = t * 32 + lane;
      if (t < nt && d < hd) dqr[d] = scale * g[r][t];
    }
  }
}

// ---- launching -------------------------------------------------------------------
size_t fwd_smem(int hd) {
  return sizeof(float) *
         ((size_t)(CU_ATT_ROWS + 2 * CU_ATT_KT) * cu_att_sp(hd) + CU_ATT_ROWS * CU_ATT_KT);
}
size_t dkdv_smem(int hd, bool bf) {
  return sizeof(float) * ((size_t)(2 * CU_ATT_ROWS + (bf ? 3 : 2) * CU_ATT_KT) * cu_att_sp(hd) +
                          2 * CU_ATT_ROWS * CU_ATT_KT + 2 * CU_ATT_KT);
}
size_t dq_smem(int hd) {
  return sizeof(float) * ((size_t)(2 * CU_ATT_ROWS + 2 * CU_ATT_KT) * cu_att_sp(hd) +
                          CU_ATT_ROWS * CU_ATT_KT + 2 * CU_ATT_ROWS);
}

// lets kernel f use bytes of dynamic shared memory (above the 48 KiB default); false on failure
template <typename F>
bool allow_smem(F f, size_t bytes, const char *name) {
  if (bytes <= 48 * 1024) return true;
  cudaError_t e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
  if (e != cudaSuccess) {
    char what[160];
    snprintf(what, sizeof what, "%s: %zu bytes of shared memory", name, bytes);
    ct_cu_note(e, what, __FILE__, __LINE__);
    return false;
  }
  return true;
}

// tiles: head dims above CU_ATT_MAXHD are allowed (the score-tile path takes them)
bool shape_ok(int B, int H, int L, int hd, bool tiles) {
  if (B <= 0 || H <= 0 || L <= 0 || hd <= 0) return false;
  if ((hd > CU_ATT_MAXHD && !tiles) || (size_t)B * H > 65535u) {
    char what[160];
    snprintf(what, sizeof what, "attention B %d H %d L %d hd %d (head dim up to %d, B*H to 65535)",
             B, H, L, hd, CU_ATT_MAXHD);
    ct_cu_note(cudaErrorInvalidValue, what, __FILE__, __LINE__);
    return false;
  }
  return true;
}

float *D_buf;
size_t D_n;
float *d_scratch(size_t n) {
  if (n <= D_n) return D_buf;
  if (D_buf) {
    CU_CHECK(cudaStreamSynchronize(ct_cu_stream()));
    ct_cu_free(D_buf);
  }
  D_n = 0;
  D_buf = (float *)ct_cu_alloc(CT_MEM_OTHER, n * sizeof(float));
  if (!D_buf) {
    ct_cu_note(cudaErrorMemoryAllocation, "attention backward rowsum(dO o O)", __FILE__, __LINE__);
    return NULL;
  }
  D_n = n;
  return D_buf;
}

// ---- head dims above CU_ATT_MAXHD: the score-tile path (attention_tiles.cuh), float32 ----
// one block per row of S (n x lk): softmax of the keys the row sees in place (the rest 0), lse
__global__ void softmax_rows_kernel(int lk, int i0, int causal, float *__restrict__ S,
                                    float *__restrict__ lse) {
  __shared__ float red[kThreads];
  const int r = blockIdx.x, t = threadIdx.x, cnt = cu_att_row_keys(i0, r, lk, causal);
  float *s = S + (size_t)r * lk;
  float m = -INFINITY;
  for (int j = t; j < cnt; j += kThreads) m = fmaxf(m, s[j]);
  red[t] = m;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (t < w) red[t] = fmaxf(red[t], red[t + w]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();
  float sum = 0.0f;
  for (int j = t; j < cnt; j += kThreads) sum += expf(s[j] - m);
  red[t] = sum;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (t < w) red[t] += red[t + w];
    __syncthreads();
  }
  sum = red[0];
  const float inv = 1.0f / sum;
  for (int j = t; j < lk; j += kThreads) s[j] = j < cnt ? expf(s[j] - m) * inv : 0.0f;
  if (t == 0) lse[r] = m + logf(sum);
}

// P = exp(S - lse) where seen (else 0), dP = P (dP - D), on an n x lk chunk
__global__ void grad_rows_kernel(int n, int lk, int i0, int causal, float *__restrict__ P,
                                 float *__restrict__ dP, const float *__restrict__ lse,
                                 const float *__restrict__ D) {
  const size_t total = (size_t)n * lk;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    const int r = (int)(e / (size_t)lk), j = (int)(e - (size_t)r * lk);
    const float p = cu_att_prob(P[e], lse[r], j < cu_att_row_keys(i0, r, lk, causal));
    P[e] = p;
    dP[e] = cu_att_ds(p, dP[e], D[r]);
  }
}

struct tiles_ops {
  void mm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
          int ldb, float beta, float *C, int ldc) {
    ct_cu_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void softmax_rows(int n, int lk, int i0, int causal, float *S, float *lse) {
    softmax_rows_kernel<<<(unsigned)n, kThreads, 0, ct_cu_stream()>>>(lk, i0, causal, S, lse);
    CU_LAUNCHED("softmax_rows_kernel");
  }
  void grad_rows(int n, int lk, int i0, int causal, float *P, float *dP, const float *lse,
                 const float *D) {
    grad_rows_kernel<<<ct_cu_blocks((size_t)n * lk, 256), 256, 0, ct_cu_stream()>>>(
        n, lk, i0, causal, P, dP, lse, D);
    CU_LAUNCHED("grad_rows_kernel");
  }
  void rowdot(int B, int H, int L, int hd, const float *o, const float *dout, float *D) {
    size_t rows = (size_t)B * H * L;
    att_rowdot_kernel<<<(unsigned)((rows + CU_ATT_WARPS - 1) / CU_ATT_WARPS), kThreads, 0,
                        ct_cu_stream()>>>(B * H, H, L, hd, o, dout, D);
    CU_LAUNCHED("att_rowdot_kernel");
  }
  void zero(float *p, size_t n) {
    CU_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), ct_cu_stream()));
  }
};

// queries per chunk: two chunk buffers of tq x L floats stay near 32 MiB each
int tiles_tq(int L) {
  size_t tq = ((size_t)8 << 20) / (size_t)L;
  return (int)(tq < 1 ? 1 : tq > (size_t)L ? (size_t)L : tq);
}

float *T_buf;
size_t T_n;
float *t_scratch(size_t n) {
  if (n <= T_n) return T_buf;
  if (T_buf) {
    CU_CHECK(cudaStreamSynchronize(ct_cu_stream()));
    ct_cu_free(T_buf);
  }
  T_n = 0;
  T_buf = (float *)ct_cu_alloc(CT_MEM_OTHER, n * sizeof(float));
  if (!T_buf) {
    ct_cu_note(cudaErrorMemoryAllocation, "attention score tiles", __FILE__, __LINE__);
    return NULL;
  }
  T_n = n;
  return T_buf;
}

template <bool BF, bool BIAS>
void fwd(int B, int H, int L, int hd, float scale, int causal, const float *q, const float *k,
         const float *v, const float *bias, float *o, float *lse) {
  if (!shape_ok(B, H, L, hd, !BIAS)) return;
  if (hd > CU_ATT_MAXHD) {  // float32 in both rows, as the CPU's tiles kernel
    int tq = tiles_tq(L);
    float *S = t_scratch((size_t)tq * L);
    tiles_ops ops;
    if (S) cu_att_tiles_fwd(ops, tq, B, H, L, hd, scale, causal, q, k, v, o, lse, S);
    return;
  }
  size_t sm = fwd_smem(hd);
  if (!allow_smem(att_fwd_kernel<BF, BIAS>, sm, "att_fwd_kernel")) return;
  dim3 grid((unsigned)((L + CU_ATT_ROWS - 1) / CU_ATT_ROWS), (unsigned)(B * H));
  att_fwd_kernel<BF, BIAS>
      <<<grid, kThreads, sm, ct_cu_stream()>>>(H, L, hd, scale, causal != 0, q, k, v, bias, o, lse);
  CU_LAUNCHED("att_fwd_kernel");
}

template <bool BF>
void bwd(int B, int H, int L, int hd, float scale, int causal, const float *q, const float *k,
         const float *v, const float *o, const float *lse, const float *dout, float *dq, float *dk,
         float *dv) {
  if (!shape_ok(B, H, L, hd, true)) return;
  size_t rows = (size_t)B * H * L;
  float *D = d_scratch(rows);
  if (!D) return;
  if (hd > CU_ATT_MAXHD) {
    int tq = tiles_tq(L);
    float *P = t_scratch(2 * (size_t)tq * L);
    tiles_ops ops;
    if (P)
      cu_att_tiles_bwd(ops, tq, B, H, L, hd, scale, causal, q, k, v, o, lse, dout, dq, dk, dv, D, P,
                       P + (size_t)tq * L);
    return;
  }
  att_rowdot_kernel<<<(unsigned)((rows + CU_ATT_WARPS - 1) / CU_ATT_WARPS), kThreads, 0,
                      ct_cu_stream()>>>(B * H, H, L, hd, o, dout, D);
  CU_LAUNCHED("att_rowdot_kernel");
  dim3 grid((unsigned)((L + CU_ATT_ROWS - 1) / CU_ATT_ROWS), (unsigned)(B * H));
  size_t s1 = dkdv_smem(hd, BF), s2 = dq_smem(hd);
  if (allow_smem(att_dkdv_kernel<BF>, s1, "att_dkdv_kernel")) {
    att_dkdv_kernel<BF><<<grid, kThreads, s1, ct_cu_stream()>>>(H, L, hd, scale, causal != 0, q, k,
                                                                v, lse, D, dout, dk, dv);
    CU_LAUNCHED("att_dkdv_kernel");
  }
  if (allow_smem(att_dq_kernel<BF>, s2, "att_dq_kernel")) {
    att_dq_kernel<BF><<<grid, kThreads, s2, ct_cu_stream()>>>(H, L, hd, scale, causal != 0, q, k, v,
                                                              lse, D, dout, dq);
    CU_LAUNCHED("att_dq_kernel");
  }
}

}  // namespace

extern "C" void ct_cu_attention_fwd(int B, int H, int L, int hd, float scale, int causal,
                                    const float *q, const float *k, const float *v, float *o,
                                    float *lse) {
  fwd<false, false>(B, H, L, hd, scale, causal, q, k, v, NULL, o, lse);
}

extern "C" void ct_cu_attention_fwd_bf16(int B, int H, int L, int hd, float scale, int causal,
                                         const float *q, const float *k, const float *v, float *o,
                                         float *lse) {
  fwd<true, false>(B, H, L, hd, scale, causal, q, k, v, NULL, o, lse);
}

// T5's biased attention (forward only, no lse, not causal): float32 in both rows, as cpu-bf16
extern "C" void ct_cu_attention_bias_fwd(int B, int H, int L, int hd, float scale,
                                         const float *bias, const float *q, const float *k,
                                         const float *v, float *o) {
  fwd<false, true>(B, H, L, hd, scale, 0, q, k, v, bias, o, NULL);
}

extern "C" void ct_cu_attention_bwd(int B, int H, int L, int hd, float scale, int causal,
                                    const float *q, const float *k, const float *v, const float *o,
                                    const float *lse, const float *dout, float *dq, float *dk,
                                    float *dv) {
  bwd<false>(B, H, L, hd, scale, causal, q, k, v, o, lse, dout, dq, dk, dv);
}

extern "C" void ct_cu_attention_bwd_bf16(int B, int H, int L, int hd, float scale, int causal,
                                         const float *q, const float *k, const float *v,
                                         const float *o, const float *lse, const float *dout,
                                         float *dq, float *dk, float *dv) {
  bwd<true>(B, H, L, hd, scale, causal, q, k, v, o, lse, dout, dq, dk, dv);
}

// elem.cu: activations, the gated residual, the element-wise helpers, the clamp, the 2-D copy,
// bf16 widen/narrow and the LoRA dropout of the CUDA backend (contracts: include/ctuner/kernels.h
// and src/kernels/cuda_elem.h; the CPU twins: src/kernels/act.c, src/model/lora.c dropped()).
// Per-element arithmetic: elem_math.cuh. The gated residual's dgate: two-pass column sums
// (reduce.cuh), no atomics.
#include "elem_math.cuh"
#include "reduce.cuh"

extern "C" {
#include "kernels/cuda_elem.h"
}

// ---- shared pieces of reduce.cuh ----
__global__ void ct_k_colsum_finish(int G, int D, int nch, const float *part, float *dst, int ldd) {
  const size_t n = (size_t)G * D;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const int g = (int)(i / (size_t)D), c = (int)(i % (size_t)D);
    const float *p = part + (size_t)g * nch * D + c;
    float s = p[0];
    for (int k = 1; k < nch; k++) s += p[(size_t)k * D];
    dst[(size_t)g * ldd + c] += s;
  }
}

void ct_colsum_finish(int G, int D, int nch, const float *part, float *dst, int ldd) {
  if (!dst || G <= 0 || D <= 0 || nch <= 0) return;
  const size_t n = (size_t)G * D;
  ct_k_colsum_finish<<<ct_cu_blocks(n, CT_CU_ELEM_THREADS), CT_CU_ELEM_THREADS, 0,
                       ct_cu_stream()>>>(G, D, nch, part, dst, ldd);
  CU_LAUNCHED("column sums (second pass)");
}

void *ct_cu_host_in(const void *host, size_t bytes) {
  void *d = ct_cu_scratch(CT_CU_SLOT_HOST, bytes);
  if (d) ct_cu_copy_in(d, host, bytes);
  return d;
}

// ---- activations ----
// one functor per op: y[r, c] = f(x[r, c]) with leading dimensions
#define CT_CU_ACT_FWD(NAME, EXPR)                                                \
  struct ct_f_##NAME {                                                           \
    const float *x;                                                              \
    int ldx;                                                                     \
    float *y;                                                                    \
    int ldy;                                                                     \
    CT_HD void operator()(int r, int c) const {                                  \
      const float v = x[(size_t)r * ldx + c];                                    \
      y[(size_t)r * ldy + c] = EXPR;                                             \
    }                                                                            \
  };                                                                             \
  void ct_cu_##NAME(int N, int D, const float *x, int ldx, float *y, int ldy) {  \
    ct_launch_rows(#NAME, N, D, ct_f_##NAME{x, ldx, y, ldy});                    \
  }                                                                              \
  void ct_cuh_##NAME(int N, int D, const float *x, int ldx, float *y, int ldy) { \
    ct_host_run().rows(#NAME, N, D, ct_f_##NAME{x, ldx, y, ldy});                \
  }
#define CT_CU_ACT_BWD(NAME, EXPR)                                                                 \
  struct ct_f_##NAME {                                                                            \
    const float *x;                                                                               \
    int ldx;                                                                                      \
    const float *dy;                                                                              \
    int lddy;                                                                                     \
    float *dx;                                                                                    \
    int lddx;                                                                                     \
    CT_HD void operator()(int r, int c) const {                                                   \
      const float v = x[(size_t)r * ldx + c], g = dy[(size_t)r * lddy + c];                       \
      dx[(size_t)r * lddx + c] = EXPR;                                                            \
    }                                                                                             \
  };                                                                                              \
  void ct_cu_##NAME(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx,  \
                    int lddx) {                                                                   \
    ct_launch_rows(#NAME, N, D, ct_f_##NAME{x, ldx, dy, lddy, dx, lddx});                         \
  }                                                                                               \
  void ct_cuh_##NAME(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx, \
                     int lddx) {                                                                  \
    ct_host_run().rows(#NAME, N, D, ct_f_##NAME{x, ldx, dy, lddy, dx, lddx});                     \
  }

CT_CU_ACT_FWD(silu_fwd, ct_cu_silu(v))
CT_CU_ACT_BWD(silu_bwd, ct_cu_silu_bwd(v, g))
CT_CU_ACT_FWD(gelu_tanh_fwd, ct_cu_gelu_tanh(v))
CT_CU_ACT_BWD(gelu_tanh_bwd, ct_cu_gelu_tanh_bwd(v, g))
CT_CU_ACT_FWD(quick_gelu_fwd, ct_cu_quick_gelu(v))
CT_CU_ACT_FWD(gelu_erf_fwd, ct_cu_gelu_erf(v))

// ---- gated residual ----
struct ct_f_gate_res_fwd {
  const float *x;
  int ldx;
  const float *gate;
  int ldg;
  const float *y;
  int ldy;
  float *out;
  int ldo, L;
  CT_HD void operator()(int r, int c) const {
    const float g = gate[(size_t)(r / L) * ldg + c];
    out[(size_t)r * ldo + c] = ct_fa(x[(size_t)r * ldx + c], ct_fm(g, y[(size_t)r * ldy + c]));
  }
};

template <class Run>
static void gate_res_fwd(Run run, int B, int L, int D, const float *x, int ldx, const float *gate,
                         int ldg, const float *y, int ldy, float *out, int ldo) {
  if (B <= 0 || L <= 0) return;
  run.rows("gate_res_fwd", B * L, D, ct_f_gate_res_fwd{x, ldx, gate, ldg, y, ldy, out, ldo, L});
}
void ct_cu_gate_res_fwd(int B, int L, int D, const float *x, int ldx, const float *gate, int ldg,
                        const float *y, int ldy, float *out, int ldo) {
  gate_res_fwd(ct_dev_run(), B, L, D, x, ldx, gate, ldg, y, ldy, out, ldo);
}
void ct_cuh_gate_res_fwd(int B, int L, int D, const float *x, int ldx, const float *gate, int ldg,
                         const float *y, int ldy, float *out, int ldo) {
  gate_res_fwd(ct_host_run(), B, L, D, x, ldx, gate, ldg, y, ldy, out, ldo);
}

// block (32, 8) over (32 columns, CT_CU_COLSUM_ROWS rows of batch item blockIdx.z): dy, and the
// partial sums of dout * y (read before dy is written: dy may alias y)
__global__ void ct_k_gate_res_bwd(int L, int D, const float *gate, int ldg, const float *y, int ldy,
                                  const float *dout, int lddo, float *dy, int lddy, float *part,
                                  int nch) {
  __shared__ float red[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x, chunk = blockIdx.y, b = blockIdx.z;
  const int l0 = chunk * CT_CU_COLSUM_ROWS;
  const int l1 = L - l0 < CT_CU_COLSUM_ROWS ? L : l0 + CT_CU_COLSUM_ROWS;
  float acc = 0.0f;
  if (c < D) {
    const float g = gate[(size_t)b * ldg + c];
    for (int l = l0 + (int)threadIdx.y; l < l1; l += 8) {
      const size_t r = (size_t)b * L + l;
      const float d = dout[r * lddo + c];
      acc += d * y[r * ldy + c];
      if (dy) dy[r * lddy + c] = g * d;
    }
  }
  if (part) ct_colsum_block(acc, red, part, b, nch, chunk, D, c);
}

void ct_cu_gate_res_bwd(int B, int L, int D, const float *gate, int ldg, const float *y, int ldy,
                        const float *dout, int lddo, float *dy, int lddy, float *dgate) {
  if (B <= 0 || L <= 0 || D <= 0 || (!dy && !dgate)) return;
  const int nch = ct_colsum_chunks(L);
  float *part = NULL;
  if (dgate) {
    part = (float *)ct_cu_scratch(CT_CU_SLOT_PART, (size_t)B * nch * D * sizeof(float));
    if (!part) return;
  }
  dim3 grid((unsigned)((D + 31) / 32), (unsigned)nch, (unsigned)B), block(32, 8);
  ct_k_gate_res_bwd<<<grid, block, 0, ct_cu_stream()>>>(L, D, gate, ldg, y, ldy, dout, lddo, dy,
                                                        lddy, part, nch);
  CU_LAUNCHED("gate_res_bwd");
  if (dgate) ct_colsum_finish(B, D, nch, part, dgate, ldg);
}

// ---- element-wise helpers ----
struct ct_f_add {
  float *y;
  const float *x;
  CT_HD void operator()(size_t i) const {
    y[i] = ct_fa(y[i], x[i]);
  }
};
struct ct_f_mul {
  float *y;
  const float *x;
  CT_HD void operator()(size_t i) const {
    y[i] = ct_fm(y[i], x[i]);
  }
};
struct ct_f_scale {
  float *x;
  float c;
  CT_HD void operator()(size_t i) const {
    x[i] = ct_fm(x[i], c);
  }
};

void ct_cu_add_inplace(size_t n, float *y, const float *x) {
  ct_launch_flat("add_inplace", n, ct_f_add{y, x});
}
void ct_cu_mul_inplace(size_t n, float *y, const float *x) {
  ct_launch_flat("mul_inplace", n, ct_f_mul{y, x});
}
void ct_cu_scale_inplace(size_t n, float *x, float c) {
  ct_launch_flat("scale_inplace", n, ct_f_scale{x, c});
}

void ct_cu_zero(size_t n, float *x) {
  if (n) CU_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), ct_cu_stream()));
}

void ct_cu_copy_2d(int rows, int cols, const float *src, int lds, float *dst, int ldd) {
  if (rows <= 0 || cols <= 0) return;
  if (rows == 1) {  // any leading dimension will do (cudaMemcpy2D wants pitches >= the width)
    CU_CHECK(cudaMemcpyAsync(dst, src, (size_t)cols * sizeof(float), cudaMemcpyDeviceToDevice,
                             ct_cu_stream()));
    return;
  }
  CU_CHECK(cudaMemcpy2DAsync(dst, (size_t)ldd * sizeof(float), src, (size_t)lds * sizeof(float),
                             (size_t)cols * sizeof(float), (size_t)rows, cudaMemcpyDeviceToDevice,
                             ct_cu_stream()));
}

struct ct_f_clamp_fwd {
  const float *x;
  int ldx;
  float lo, hi;
  float *y;
  int ldy;
  CT_HD void operator()(int r, int c) const {
    y[(size_t)r * ldy + c] = ct_cu_clamp(x[(size_t)r * ldx + c], lo, hi);
  }
};
struct ct_f_clamp_bwd {
  const float *x;
  int ldx;
  float lo, hi;
  const float *dy;
  int lddy;
  float *dx;
  int lddx;
  CT_HD void operator()(int r, int c) const {
    const float v = x[(size_t)r * ldx + c];
    if (v >= lo && v <= hi)
      dx[(size_t)r * lddx + c] = ct_fa(dx[(size_t)r * lddx + c], dy[(size_t)r * lddy + c]);
  }
};

void ct_cu_clamp_fwd(int rows, int cols, const float *x, int ldx, float lo, float hi, float *y,
                     int ldy) {
  ct_launch_rows("clamp_fwd", rows, cols, ct_f_clamp_fwd{x, ldx, lo, hi, y, ldy});
}
void ct_cu_clamp_bwd(int rows, int cols, const float *x, int ldx, float lo, float hi,
                     const float *dy, int lddy, float *dx, int lddx) {
  ct_launch_rows("clamp_bwd", rows, cols, ct_f_clamp_bwd{x, ldx, lo, hi, dy, lddy, dx, lddx});
}
void ct_cuh_clamp_fwd(int rows, int cols, const float *x, int ldx, float lo, float hi, float *y,
                      int ldy) {
  ct_host_run().rows("clamp_fwd", rows, cols, ct_f_clamp_fwd{x, ldx, lo, hi, y, ldy});
}
void ct_cuh_clamp_bwd(int rows, int cols, const float *x, int ldx, float lo, float hi,
                      const float *dy, int lddy, float *dx, int lddx) {
  ct_host_run().rows("clamp_bwd", rows, cols, ct_f_clamp_bwd{x, ldx, lo, hi, dy, lddy, dx, lddx});
}

// ---- bf16 storage ----
struct ct_f_bf16_widen {
  const uint16_t *src;
  float *dst;
  CT_HD void operator()(size_t i) const {
    dst[i] = ct_cu_bf16_to_f32(src[i]);
  }
};
struct ct_f_bf16_narrow {
  const float *src;
  uint16_t *dst;
  CT_HD void operator()(size_t i) const {
    dst[i] = ct_cu_f32_to_bf16(src[i]);
  }
};
struct ct_f_bf16_narrow_acc {
  const float *src;
  uint16_t *dst;
  CT_HD void operator()(size_t i) const {
    dst[i] = ct_cu_f32_to_bf16(ct_fa(ct_cu_bf16_to_f32(dst[i]), src[i]));
  }
};

void ct_cu_bf16_widen(size_t n, const uint16_t *src, float *dst) {
  ct_launch_flat("bf16_widen", n, ct_f_bf16_widen{src, dst});
}
void ct_cu_bf16_narrow(size_t n, const float *src, uint16_t *dst) {
  ct_launch_flat("bf16_narrow", n, ct_f_bf16_narrow{src, dst});
}
void ct_cu_bf16_narrow_acc(size_t n, const float *src, uint16_t *dst) {
  ct_launch_flat("bf16_narrow_acc", n, ct_f_bf16_narrow_acc{src, dst});
}
void ct_cuh_bf16_widen(size_t n, const uint16_t *src, float *dst) {
  ct_host_run().flat("bf16_widen", n, ct_f_bf16_widen{src, dst});
}
void ct_cuh_bf16_narrow(size_t n, const float *src, uint16_t *dst) {
  ct_host_run().flat("bf16_narrow", n, ct_f_bf16_narrow{src, dst});
}
void ct_cuh_bf16_narrow_acc(size_t n, const float *src, uint16_t *dst) {
  ct_host_run().flat("bf16_narrow_acc", n, ct_f_bf16_narrow_acc{src, dst});
}

// ---- LoRA dropout ----
struct ct_f_dropout_fwd {
  const float *x;
  int ldx, D;
  uint64_t seed, stream;
  const uint64_t *ctr;
  float p, keep;
  float *xd;
  CT_HD void operator()(int n, int c) const {
    xd[(size_t)n * D + c] =
        ct_cu_dropout_fwd_at(x[(size_t)n * ldx + c], seed, stream, ctr[n], c, p, keep);
  }
};
struct ct_f_dropout_bwd {
  const float *dxd;
  int D;
  uint64_t seed, stream;
  const uint64_t *ctr;
  float p, keep;
  float *dx;
  int lddx;
  CT_HD void operator()(int n, int c) const {
    if (ct_cu_dropout_kept(seed, stream, ctr[n], c, p)) {
      float *d = dx + (size_t)n * lddx + c;
      *d = ct_fa(*d, ct_fm(dxd[(size_t)n * D + c], keep));
    }
  }
};

float ct_cu_dropout_keep(float p) {
  return (float)(1.0 / (1.0 - (double)p));
}

template <class Run>
static void dropout_fwd(Run run, int N, int D, const float *x, int ldx, uint64_t seed,
                        uint64_t stream, const uint64_t *ctr, float p, float keep, float *xd) {
  if (N <= 0 || D <= 0) return;
  const uint64_t *dctr = (const uint64_t *)run.in(ctr, (size_t)N * sizeof(uint64_t));
  if (!dctr) return;
  run.rows("dropout_fwd", N, D, ct_f_dropout_fwd{x, ldx, D, seed, stream, dctr, p, keep, xd});
}
template <class Run>
static void dropout_bwd(Run run, int N, int D, const float *dxd, uint64_t seed, uint64_t stream,
                        const uint64_t *ctr, float p, float keep, float *dx, int lddx) {
  if (N <= 0 || D <= 0) return;
  const uint64_t *dctr = (const uint64_t *)run.in(ctr, (size_t)N * sizeof(uint64_t));
  if (!dctr) return;
  run.rows("dropout_bwd", N, D, ct_f_dropout_bwd{dxd, D, seed, stream, dctr, p, keep, dx, lddx});
}

void ct_cu_dropout_fwd(int N, int D, const float *x, int ldx, uint64_t seed, uint64_t stream,
                       const uint64_t *ctr, float p, float *xd) {
  dropout_fwd(ct_dev_run(), N, D, x, ldx, seed, stream, ctr, p, ct_cu_dropout_keep(p), xd);
}
void ct_cu_dropout_bwd(int N, int D, const float *dxd, uint64_t seed, uint64_t stream,
                       const uint64_t *ctr, float p, float *dx, int lddx) {
  dropout_bwd(ct_dev_run(), N, D, dxd, seed, stream, ctr, p, ct_cu_dropout_keep(p), dx, lddx);
}
void ct_cu_dropout_fwd_keep(int N, int D, const float *x, int ldx, uint64_t seed, uint64_t stream,
                            const uint64_t *ctr, float p, float keep, float *xd) {
  dropout_fwd(ct_dev_run(), N, D, x, ldx, seed, stream, ctr, p, keep, xd);
}
void ct_cu_dropout_bwd_keep(int N, int D, const float *dxd, uint64_t seed, uint64_t stream,
                            const uint64_t *ctr, float p, float keep, float *dx, int lddx) {
  dropout_bwd(ct_dev_run(), N, D, dxd, seed, stream, ctr, p, keep, dx, lddx);
}
void ct_cuh_dropout_fwd(int N, int D, const float *x, int ldx, uint64_t seed, uint64_t stream,
                        const uint64_t *ctr, float p, float *xd) {
  dropout_fwd(ct_host_run(), N, D, x, ldx, seed, stream, ctr, p, ct_cu_dropout_keep(p), xd);
}
void ct_cuh_dropout_bwd(int N, int D, const float *dxd, uint64_t seed, uint64_t stream,
                        const uint64_t *ctr, float p, float *dx, int lddx) {
  dropout_bwd(ct_host_run(), N, D, dxd, seed, stream, ctr, p, ct_cu_dropout_keep(p), dx, lddx);
}

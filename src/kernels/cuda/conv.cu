// conv.cu: the CUDA backend's 2-D convolution (kernels.h's ct_conv2d_fwd/bwd
// contracts, NCHW float32): conv.c's algorithm — im2col of a band of output
// rows into the caller's col (conv2d_col_floats = ct_conv2d_col_floats), then
// the matrix product (gemm.cu: float32, or bf16 operands in "cuda-bf16") —
// driven by conv_driver.cuh, which the host self-test runs too. The
// backward's col2im is a gather (each dx element sums its k*k taps in order:
// no atomics), the bias gradient one block per channel reducing in double in
// a fixed tree, added once ("+=").
#include "common.cuh"
#include "conv_driver.cuh"

extern "C" void ct_cu_sgemm(int transA, int transB, int M, int N, int K, float alpha,
                            const float *A, int lda, const float *B, int ldb, float beta, float *C,
                            int ldc);
extern "C" void ct_cu_sgemm_bf16(int transA, int transB, int M, int N, int K, float alpha,
                                 const float *A, int lda, const float *B, int ldb, float beta,
                                 float *C, int ldc);

namespace {

__global__ void im2col_kernel(cu_conv s, const float *__restrict__ x, int r0, int rows,
                              float *__restrict__ col) {
  const size_t n = (size_t)rows * s.Wo, total = (size_t)s.Cin * s.k * s.k * n;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t ckk = i / n;
    col[i] = cu_im2col_at(s, x, r0, (int)ckk, (int)(i - ckk * n));
  }
}

__global__ void col2im_kernel(cu_conv s, const float *__restrict__ dcol, int r0, int rows,
                              float *__restrict__ dx) {
  const size_t hw = (size_t)s.H * s.W, total = (size_t)s.Cin * hw;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    const size_t c = e / hw, rem = e - c * hw;
    const int i = (int)(rem / s.W), j = (int)(rem - (size_t)i * s.W);
    dx[e] += cu_col2im_at(s, dcol, r0, rows, (int)c, i, j);
  }
}

__global__ void bias_planes_kernel(int B, int Cout, int HWo, const float *__restrict__ b,
                                   float *__restrict__ y) {
  const size_t total = (size_t)B * Cout * HWo;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x)
    y[i] = b[(i / (size_t)HWo) % (size_t)Cout];
}

constexpr int kDbThreads = 256;

// db[o] += the sum of channel o over every image and position: one block per channel, each
// thread a fixed strided slice in double, then a fixed tree
__global__ void db_kernel(int B, int Cout, int HWo, const float *__restrict__ dy,
                          float *__restrict__ db) {
  __shared__ double red[kDbThreads];
  const int o = blockIdx.x, t = threadIdx.x;
  double acc = 0.0;
  for (int bi = 0; bi < B; bi++) {
    const float *g = dy + ((size_t)bi * Cout + o) * HWo;
    for (int p = t; p < HWo; p += kDbThreads) acc += (double)g[p];
  }
  red[t] = acc;
  __syncthreads();
  for (int w = kDbThreads / 2; w > 0; w >>= 1) {
    if (t < w) red[t] += red[t + w];
    __syncthreads();
  }
  if (t == 0) db[o] = (float)((double)db[o] + red[0]);
}

struct dev_ops {
  int bf16;
  void bias_planes(int B, int Cout, int HWo, const float *b, float *y) {
    bias_planes_kernel<<<ct_cu_blocks((size_t)B * Cout * HWo, 256), 256, 0, ct_cu_stream()>>>(
        B, Cout, HWo, b, y);
    CU_LAUNCHED("bias_planes_kernel");
  }
  void im2col(const cu_conv &s, const float *xb, int r0, int rows, float *col) {
    size_t n = (size_t)s.Cin * s.k * s.k * rows * s.Wo;
    im2col_kernel<<<ct_cu_blocks(n, 256), 256, 0, ct_cu_stream()>>>(s, xb, r0, rows, col);
    CU_LAUNCHED("im2col_kernel");
  }
  void col2im_acc(const cu_conv &s, const float *dcol, int r0, int rows, float *dxb) {
    size_t n = (size_t)s.Cin * s.H * s.W;
    col2im_kernel<<<ct_cu_blocks(n, 256), 256, 0, ct_cu_stream()>>>(s, dcol, r0, rows, dxb);
    CU_LAUNCHED("col2im_kernel");
  }
  void zero(float *p, size_t n) {
    CU_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), ct_cu_stream()));
  }
  void db_acc(int B, int Cout, int HWo, const float *dy, float *db) {
    db_kernel<<<(unsigned)Cout, kDbThreads, 0, ct_cu_stream()>>>(B, Cout, HWo, dy, db);
    CU_LAUNCHED("db_kernel");
  }
  void mm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
          int ldb, float beta, float *C, int ldc) {
    (bf16 ? ct_cu_sgemm_bf16 : ct_cu_sgemm)(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
};

}  // namespace

extern "C" void ct_cu_conv2d_fwd(const ct_conv2d_shape *s, const float *x, const float *w,
                                 const float *b, float *y, float *col) {
  dev_ops ops = {0};
  cu_conv_fwd_drive(ops, s, x, w, b, y, col);
}

extern "C" void ct_cu_conv2d_fwd_bf16(const ct_conv2d_shape *s, const float *x, const float *w,
                                      const float *b, float *y, float *col) {
  dev_ops ops = {1};
  cu_conv_fwd_drive(ops, s, x, w, b, y, col);
}

extern "C" void ct_cu_conv2d_bwd(const ct_conv2d_shape *s, const float *x, const float *w,
                                 const float *dy, float *dx, float *dw, float *db, float *col) {
  dev_ops ops = {0};
  cu_conv_bwd_drive(ops, s, x, w, dy, dx, dw, db, col);
}

extern "C" void ct_cu_conv2d_bwd_bf16(const ct_conv2d_shape *s, const float *x, const float *w,
                                      const float *dy, float *dx, float *dw, float *db,
                                      float *col) {
  dev_ops ops = {1};
  cu_conv_bwd_drive(ops, s, x, w, dy, dx, dw, db, col);
}

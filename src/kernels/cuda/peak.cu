// peak.cu: the device's own GEMM rate, the yardstick of `ctuner bench peak
// --backend cuda` (docs/cuda.md, docs/performance.md): cuBLASLt on an n x n x n
// product with operands already in the measured precision (bf16 in, float32
// out and sums; or float32 throughout, no TF32), timed with CUDA events over a
// few products after one warm-up, and the device-to-device copy rate. Not an
// op of the table's arithmetic: the models' products go through gemm.cu.
#include <cublasLt.h>

#include "common.cuh"

namespace {

__global__ void fill_kernel(size_t n, float *f, __nv_bfloat16 *h, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 2654435761u ^ seed;
    x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
    float v = (float)(x & 0xffff) / 65536.0f - 0.5f;
    if (f) f[i] = v;
    if (h) h[i] = __float2bfloat16_rn(v);
  }
}

}  // namespace

// GFLOP/s of C = A B^T (n x n x n) in bf16 (bf16 = 1) or float32; 0 on any failure
extern "C" double ct_cu_gemm_peak(int n, int bf16) {
  const size_t nn = (size_t)n * n, es = bf16 ? 2 : 4;
  void *a = NULL, *b = NULL, *ws = NULL;
  float *c = NULL;
  cublasLtHandle_t lt = NULL;
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  const size_t wsb = 32u << 20;
  double rate = 0;
  cudaStream_t s = ct_cu_stream();
  const cudaDataType_t in = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  cublasOperation_t tn = CUBLAS_OP_T, nt = CUBLAS_OP_N;
  cublasLtMatmulHeuristicResult_t h;
  int found = 0;
  float one = 1, zero = 0;
  if (cudaMalloc(&a, nn * es) || cudaMalloc(&b, nn * es) || cudaMalloc(&c, nn * 4) ||
      cudaMalloc(&ws, wsb))
    goto out;
  fill_kernel<<<1024, 256, 0, s>>>(nn, bf16 ? NULL : (float *)a, bf16 ? (__nv_bfloat16 *)a : NULL,
                                   1);
  fill_kernel<<<1024, 256, 0, s>>>(nn, bf16 ? NULL : (float *)b, bf16 ? (__nv_bfloat16 *)b : NULL,
                                   2);
  CU_LAUNCHED("peak fill");
  if (cublasLtCreate(&lt) || cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) ||
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tn, sizeof tn) ||
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt) ||
      cublasLtMatrixLayoutCreate(&la, in, n, n, n) ||
      cublasLtMatrixLayoutCreate(&lb, in, n, n, n) ||
      cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, n, n) ||
      cublasLtMatmulPreferenceCreate(&pref) ||
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                           sizeof wsb) ||
      cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &h, &found) || !found)
    goto out;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int r = 0; r < 6; r++) {
    if (r == 1) cudaEventRecord(e0, s);
    if (cublasLtMatmul(lt, op, &one, a, la, b, lb, &zero, c, lc, c, lc, &h.algo, ws, wsb, s))
      goto out;
  }
  cudaEventRecord(e1, s);
  if (cudaEventSynchronize(e1) == cudaSuccess) {
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (ms > 0) rate = 5 * 2.0 * (double)n * n * n / (ms * 1e-3) / 1e9;
  }
out:
  cudaGetLastError();
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (op) cublasLtMatmulDescDestroy(op);
  if (lt) cublasLtDestroy(lt);
  cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(ws);
  return rate;
}

// GB/s of a device-to-device copy of bytes, counting bytes read and written
extern "C" double ct_cu_copy_peak(size_t bytes) {
  void *a = NULL, *b = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  double rate = 0;
  cudaStream_t s = ct_cu_stream();
  if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess) {
    cudaMemsetAsync(a, 1, bytes, s);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(e0, s);
    for (int r = 0; r < 10; r++) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(e1, s);
    float ms = 0;
    if (cudaEventSynchronize(e1) == cudaSuccess &&
        cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms > 0)
      rate = 10 * 2.0 * (double)bytes / (ms * 1e-3) / 1e9;
  }
  cudaGetLastError();
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  cudaFree(a), cudaFree(b);
  return rate;
}

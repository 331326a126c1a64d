// reduce.cuh: deterministic reductions and launch shapes shared by the element-wise families
// (no atomics anywhere: every sum has one fixed order, set by the shapes and by the fixed block
// sizes below, never by the device or the scheduling).
#pragma once

#include "common.cuh"
#include "elem_math.cuh"

#define CT_CU_ROW_THREADS 256  // threads per block of the one-block-per-row kernels
#define CT_CU_ELEM_THREADS 256
#define CT_CU_COLSUM_ROWS 64  // rows one block sums per column in the column-sum kernels
// scratch slots (ct_cu_scratch) of these families, each used within one op only
#define CT_CU_SLOT_PART 2  // per-block partial sums
#define CT_CU_SLOT_HOST 3  // host arrays copied in (positions, ids, dropout counters)

// warp sum by butterfly: every lane gets the same bits (each step adds the same two values)
template <typename T>
__device__ __forceinline__ T ct_warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread.
// sh: __shared__ T[33]. Safe to call repeatedly with the same sh.
template <typename T>
__device__ __forceinline__ T ct_block_sum(T v, T *sh) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = ct_warp_sum(v);
  __syncthreads();  // a previous call's readers are done with sh
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    T t = lane < nw ? sh[lane] : (T)0;
    t = ct_warp_sum(t);
    if (lane == 0) sh[32] = t;
  }
  __syncthreads();
  return sh[32];
}

// ---- launches ----
// f(r, c) for every r < N, c < D: blocks over (column chunk, row), grid-stride both ways
template <class F>
__global__ void ct_k_rows(int N, int D, F f) {
  for (int r = blockIdx.y; r < N; r += gridDim.y)
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < D; c += gridDim.x * blockDim.x) f(r, c);
}
template <class F>
static void ct_launch_rows(const char *name, int N, int D, const F &f) {
  if (N <= 0 || D <= 0) return;
  unsigned gx = (unsigned)((D + CT_CU_ELEM_THREADS - 1) / CT_CU_ELEM_THREADS);
  if (gx > 64) gx = 64;
  unsigned gy = (unsigned)(N < 65535 ? N : 65535);
  ct_k_rows<<<dim3(gx, gy), CT_CU_ELEM_THREADS, 0, ct_cu_stream()>>>(N, D, f);
  CU_LAUNCHED(name);
}
// f(i) for every i < n
template <class F>
__global__ void ct_k_flat(size_t n, F f) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    f(i);
}
template <class F>
static void ct_launch_flat(const char *name, size_t n, const F &f) {
  if (n == 0) return;
  ct_k_flat<<<ct_cu_blocks(n, CT_CU_ELEM_THREADS), CT_CU_ELEM_THREADS, 0, ct_cu_stream()>>>(n, f);
  CU_LAUNCHED(name);
}

// The entry points are written once over a runner: ct_dev_run launches the functor on the
// stream (the op), ct_host_run calls it on the host over host memory (the host mirrors that
// tests/test_cuda_host.c compares with the CPU kernels, indexing included). Functors' operator()
// is __host__ __device__ for that.
struct ct_dev_run {
  template <class F>
  void rows(const char *name, int N, int D, const F &f) const {
    ct_launch_rows(name, N, D, f);
  }
  template <class F>
  void flat(const char *name, size_t n, const F &f) const {
    ct_launch_flat(name, n, f);
  }
  // host memory the op reads on the device: copied into scratch
  const void *in(const void *host, size_t bytes) const;
};
struct ct_host_run {
  template <class F>
  void rows(const char *, int N, int D, const F &f) const {
    for (int r = 0; r < N; r++)
      for (int c = 0; c < D; c++) f(r, c);
  }
  template <class F>
  void flat(const char *, size_t n, const F &f) const {
    for (size_t i = 0; i < n; i++) f(i);
  }
  const void *in(const void *host, size_t) const {
    return host;
  }
};

// ---- column sums over rows, in two passes ----
// Pass 1 (a kernel of the family): block (32, 8) over (32 columns, one chunk of
// CT_CU_COLSUM_ROWS rows, one group); thread (tx, ty) sums rows ty, ty + 8, ... of the chunk
// in order, then ct_colsum_block adds the 8 partials in order and writes part[(g * nch + chunk)
// * D + c]. Pass 2 (ct_k_colsum_finish): dst[g * ldd + c] += the nch partials, in order.
__device__ __forceinline__ void ct_colsum_block(float acc, float (*red)[33], float *part, int g,
                                                int nch, int chunk, int D, int c) {
  red[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < D) {
    float s = red[0][threadIdx.x];
    for (int t = 1; t < 8; t++) s += red[t][threadIdx.x];
    part[((size_t)g * nch + chunk) * D + c] = s;
  }
  __syncthreads();
}
// launches pass 2 for G groups of D columns (dst may be NULL: nothing)
void ct_colsum_finish(int G, int D, int nch, const float *part, float *dst, int ldd);
static inline int ct_colsum_chunks(int rows) {
  return (rows + CT_CU_COLSUM_ROWS - 1) / CT_CU_COLSUM_ROWS;
}
// host memory into the host-copy scratch slot (NULL when it cannot be had)
void *ct_cu_host_in(const void *host, size_t bytes);
inline const void *ct_dev_run::in(const void *host, size_t bytes) const {
  return ct_cu_host_in(host, bytes);
}

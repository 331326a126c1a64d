/* The CUDA backend's matrix products and attention (src/kernels/cuda/gemm.cu,
 * attention.cu): the table fields they fill, float32 or bf16 products. */
#ifdef CT_CUDA
#include "cuda_rt.h"

void ct_cuda_fill_gemm(ct_backend_ops *t, int bf16) {
  (void)t;
  (void)bf16;
}
#else
typedef int ct_backend_cuda_gemm_not_built; /* CT_CUDA off */
#endif

/* The CUDA backend's matrix products and attention, checked on the host with
 * no device (src/kernels/cuda/gemm_selftest.cu): the bf16 rounding, the
 * row-major to column-major mapping given to cuBLASLt (run by a naive
 * column-major GEMM against ct_sgemm and ct_sgemm_bf16), the weight views'
 * dequantisation and the attention kernels' tile loops (against the CPU's
 * fused kernel, float32 and bf16). Built only with CT_CUDA. */
#include "harness.h"

#ifdef CT_CUDA
#include <stddef.h>

int ct_cu_gemm_selftest_host(char *msg, size_t cap);

CT_TEST(cuda_gemm_host, selftest) {
  char msg[512];
  int rc = ct_cu_gemm_selftest_host(msg, sizeof msg);
  CHECKF(rc == 0, "part %d: %s", rc, msg);
}
#else
CT_TEST(cuda_gemm_host, not_built) {
  CT_SKIP("CUDA is not built (CT_CUDA off): nothing to check");
}
#endif

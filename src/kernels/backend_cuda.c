/* The CUDA compute backend "cuda" and its bf16-compute sibling "cuda-bf16"
 * (docs/cuda.md): the table, assembled from the runtime (cuda/runtime.cu:
 * device, stream, memory, errors) and the kernel families, each of which sets
 * the fields it implements (backend_cuda_elem.c, backend_cuda_gemm.c). A field
 * no family sets stays NULL: unsupported, refused by name by the model or
 * trainer that needs it (ct_backend_lacks), never a CPU fallback.
 * Memory is device memory (host_memory 0): the host reaches it only through
 * copy_in/copy_out. Ops are asynchronous on one stream; copy_out and
 * synchronize wait; a failed op is reported at the next `check`.
 * Listed by the registry only where init finds a device.
 * Not here: kernels (src/kernels/cuda/, one .cu per family), the registry (backend.c).
 */
#ifdef CT_CUDA
#include <stdio.h>
#include <threads.h>

#include "cuda_rt.h"

static char desc[320];
static char desc_bf16[320];

static ct_status cuda_init(ct_err *err) {
  char why[256], dev[256];
  if (ct_cu_init(why, sizeof why, dev, sizeof dev) != 0)
    return ct_errf(err, CT_ERR_UNSUPPORTED, "%s", why);
  snprintf(desc, sizeof desc, "%s (float32)", dev);
  snprintf(desc_bf16, sizeof desc_bf16, "%s (bf16 products, float32 sums)", dev);
  return CT_OK;
}

static ct_status cuda_check(ct_err *err) {
  char msg[512];
  if (!ct_cu_take_error(msg, sizeof msg)) return CT_OK;
  return ct_errf(err, CT_ERR_DEVICE, "%s", msg);
}

static ct_backend_ops cuda_ops, cuda_bf16_ops;
static once_flag cuda_once = ONCE_FLAG_INIT;

static void fill(ct_backend_ops *t, int bf16) {
  t->name = bf16 ? "cuda-bf16" : "cuda";
  t->description = bf16 ? desc_bf16 : desc;
  t->precision_bits = bf16 ? 8 : 24;
  t->compute = bf16 ? CT_COMPUTE_BF16 : CT_COMPUTE_F32;
  t->host_memory = 0;
  t->init = cuda_init;
  t->check = cuda_check;
  t->gemm_peak = ct_cu_gemm_peak;
  t->copy_peak = ct_cu_copy_peak;
  t->alloc = ct_cu_alloc;
  t->free = ct_cu_free;
  t->copy_in = ct_cu_copy_in;
  t->copy_out = ct_cu_copy_out;
  t->copy = ct_cu_copy;
  t->synchronize = ct_cu_synchronize;
  ct_cuda_fill_elem(t);
  ct_cuda_fill_gemm(t, bf16);
}

static void build(void) {
  snprintf(desc, sizeof desc, "NVIDIA GPU through CUDA (float32)");
  snprintf(desc_bf16, sizeof desc_bf16, "NVIDIA GPU through CUDA (bf16 products, float32 sums)");
  fill(&cuda_ops, 0);
  fill(&cuda_bf16_ops, 1);
}

const ct_backend_ops *ct_backend_cuda(void) {
  call_once(&cuda_once, build);
  return &cuda_ops;
}

const ct_backend_ops *ct_backend_cuda_bf16(void) {
  call_once(&cuda_once, build);
  return &cuda_bf16_ops;
}
#else
typedef int ct_backend_cuda_not_built; /* CT_CUDA off: an empty translation unit */
#endif

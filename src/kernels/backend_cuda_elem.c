/* The CUDA backend's element-wise, normalisation, position, layout, loss and
 * optimizer ops (src/kernels/cuda/, one .cu per family): the table fields they fill. */
#ifdef CT_CUDA
#include "cuda_rt.h"

void ct_cuda_fill_elem(ct_backend_ops *t) {
  (void)t;
}
#else
typedef int ct_backend_cuda_elem_not_built; /* CT_CUDA off */
#endif

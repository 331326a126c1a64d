/* The CUDA backend's runtime (src/kernels/cuda/runtime.cu) and its kernel
 * families, as plain C declarations for backend_cuda*.c: no CUDA header is
 * needed to include this. Private to src/kernels; built only with CT_CUDA
 * (docs/cuda.md).
 *
 * One device per process (the local rank's, under CUDA_VISIBLE_DEVICES), one
 * stream every op is issued on in order, one sticky error: a failed launch or
 * a fault is kept (the first one) until ct_cu_take_error reads it, which the
 * table's `check` turns into CT_ERR_DEVICE.
 */
#ifndef CT_KERNELS_CUDA_RT_H
#define CT_KERNELS_CUDA_RT_H

#include <stddef.h>

#include "ctuner/backend.h"

/* 0 when a device is usable (selected and its context made), with desc a one-line description of it
 * ("NVIDIA H100 80GB HBM3, sm_90, 79.1 GiB, device 0 of 1"); else nonzero and why. Runs once per
 * process; later calls repeat the first answer. */
int ct_cu_init(char *why, size_t why_cap, char *desc, size_t desc_cap);
void *ct_cu_alloc(ct_mem_cat cat, size_t bytes); /* device memory, counted; NULL on failure or 0 */
void ct_cu_free(void *p);
void ct_cu_copy_in(void *dst, const void *host_src, size_t bytes);
void ct_cu_copy_out(void *host_dst, const void *src, size_t bytes); /* waits */
void ct_cu_copy(void *dst, const void *src, size_t bytes);
void ct_cu_synchronize(void);
/* 1 with the first error since the last call (cleared), else 0 */
int ct_cu_take_error(char *msg, size_t cap);

/* bench peak's yardsticks (cuda/peak.cu): GFLOP/s of a cuBLASLt n^3 product in bf16 or float32,
 * GB/s of a device copy (read + write); 0 on failure */
double ct_cu_gemm_peak(int n, int bf16);
double ct_cu_copy_peak(size_t bytes);

/* Each kernel family sets the table fields it implements (the rest stay NULL:
 * unsupported, refused by name by whoever needs them). bf16: the products of
 * the "cuda-bf16" row (bf16 operands, float32 sums). */
void ct_cuda_fill_elem(ct_backend_ops *t);           /* backend_cuda_elem.c */
void ct_cuda_fill_gemm(ct_backend_ops *t, int bf16); /* backend_cuda_gemm.c */

#endif

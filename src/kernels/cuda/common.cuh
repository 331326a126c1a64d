// common.cuh: what every CUDA kernel file of the CUDA backend shares
// (docs/cuda.md): the one stream, launch checks into the sticky error, grid
// sizes, device scratch. The op contracts are kernels.h's, entry for entry.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "ctuner/kernels.h"
#include "kernels/cuda_rt.h"
}

// the stream every op is issued on (runtime.cu)
cudaStream_t ct_cu_stream(void);
// records e (when not cudaSuccess) as the sticky error, naming what failed and where
void ct_cu_note(cudaError_t e, const char *what, const char *file, int line);
// grow-only device scratch, one buffer per slot (0..3); the pointer stays valid until the
// same slot is asked for more bytes (the stream is synchronised before it is regrown)
void *ct_cu_scratch(int slot, size_t bytes);

#define CU_CHECK(call) ct_cu_note((call), #call, __FILE__, __LINE__)
// after every kernel launch: a bad configuration is reported, not lost
#define CU_LAUNCHED(name) ct_cu_note(cudaGetLastError(), name, __FILE__, __LINE__)

static inline unsigned ct_cu_blocks(size_t n, unsigned threads) {
  size_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 1 ? 1 : b > 65535u * 16u ? 65535u * 16u : b);
}

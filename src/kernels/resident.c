/* The kernels a device-resident trainer needs besides the model's ops
 * (include/ctuner/kernels.h, "residency"): bf16 storage widened and narrowed
 * (the bf16 parameters and gradients of mixed_precision bf16, zero.c) and
 * LoRA's input dropout with its Philox mask (src/model/lora.c). They are the
 * CPU backend's bf16_widen, bf16_narrow, bf16_narrow_acc, dropout_fwd and
 * dropout_bwd; their arithmetic is what the trainer computed inline before,
 * element for element, so results did not move.
 * Not here: the bf16 conversions themselves (ctuner/bf16.h), Philox (rng.c).
 */
#include <stdlib.h>

#include "ctuner/bf16.h"
#include "ctuner/kernels.h"
#include "ctuner/rng.h"
#include "scratch.h"

void ct_bf16_widen(size_t n, const uint16_t *src, float *dst) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; i++) dst[i] = ct_bf16_to_f32(src[i]);
}

void ct_bf16_narrow(size_t n, const float *src, uint16_t *dst) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; i++) dst[i] = ct_f32_to_bf16(src[i]);
}

void ct_bf16_narrow_acc(size_t n, const float *src, uint16_t *dst) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; i++) dst[i] = ct_f32_to_bf16(ct_bf16_to_f32(dst[i]) + src[i]);
}

static float keep_of(float p) {
  return (float)(1.0 / (1.0 - (double)p));
}

void ct_dropout_fwd(int N, int D, const float *x, int ldx, uint64_t seed, uint64_t stream,
                    const uint64_t *ctr, float p, float *xd) {
  const float keep = keep_of(p);
  for (int n = 0; n < N; n++) {
    float *row = xd + (size_t)n * D; /* the uniforms first, then the row in their place */
    ct_rng_fill_uniform(row, (size_t)D, seed, stream, ctr[n], 0.0f, 1.0f);
    const float *xr = x + (size_t)n * ldx;
    for (int c = 0; c < D; c++) row[c] = row[c] < p ? 0.0f : xr[c] * keep;
  }
}

void ct_dropout_bwd(int N, int D, const float *dxd, uint64_t seed, uint64_t stream,
                    const uint64_t *ctr, float p, float *dx, int lddx) {
  const float keep = keep_of(p);
  float *u = ct_kernels_scratch((D > 0 ? (size_t)D : 1) * sizeof *u, "dropout mask row");
  for (int n = 0; n < N; n++) {
    ct_rng_fill_uniform(u, (size_t)D, seed, stream, ctr[n], 0.0f, 1.0f);
    const float *g = dxd + (size_t)n * D;
    float *o = dx + (size_t)n * lddx;
    for (int c = 0; c < D; c++)
      if (!(u[c] < p)) o[c] += g[c] * keep;
  }
  free(u);
}

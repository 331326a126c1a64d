/* Frozen weights in their stored dtype: weight views (ct_wview, kernels.h),
 * bf16 rounding and the weight-only int8 quantisers of optimum-quanto (qint8)
 * and torchao (int8_weight_only), per output row, symmetric absmax.
 *
 * Design: a view is only a dtype, a pointer and per-row scales; the GEMM
 * (gemm_driver.h) dequantises tiles of it while packing, so nothing here
 * allocates. The quantisers follow the libraries' float32 arithmetic step by
 * step: quanto divides by the scale (absmax / 127), torchao multiplies by the
 * reciprocal of max(absmax / 127.5, FLT_EPSILON); both round half to even
 * (torch.round, nearbyintf in the default rounding mode) and clamp to
 * [-128, 127]. tests/test_gemm.c compares them with the libraries' own
 * tensors (tests/data/quant, scripts/quant_golden.py).
 * Not here: the GEMM itself (gemm.c dispatches ct_sgemm_w), which weights a
 * model stores quantised (the model, e.g. src/model/mmdit_quant.c).
 */
#include <float.h>
#include <math.h>

#include "ctuner/bf16.h"
#include "ctuner/kernels.h"

size_t ct_wdtype_size(ct_wdtype t) {
  return t == CT_WDT_BF16 ? 2 : t == CT_WDT_I8 ? 1 : 4;
}

const char *ct_wdtype_name(ct_wdtype t) {
  return t == CT_WDT_BF16 ? "bf16" : t == CT_WDT_I8 ? "int8" : "float32";
}

ct_wview ct_wview_f32(const float *w) {
  ct_wview v = {CT_WDT_F32, w, NULL};
  return v;
}

ct_wview ct_wview_rows(ct_wview w, int r0, int cols) {
  ct_wview v = w;
  v.data = (const char *)w.data + (size_t)r0 * (size_t)cols * ct_wdtype_size(w.dtype);
  if (w.scales) v.scales = w.scales + r0;
  return v;
}

float ct_wview_at(ct_wview w, int cols, int r, int c) {
  const size_t i = (size_t)r * (size_t)cols + (size_t)c;
  if (w.dtype == CT_WDT_BF16) return ct_bf16_to_f32(((const uint16_t *)w.data)[i]);
  if (w.dtype == CT_WDT_I8) return (float)((const int8_t *)w.data)[i] * w.scales[r];
  return ((const float *)w.data)[i];
}

void ct_to_bf16(size_t n, const float *x, uint16_t *out) {
  for (size_t i = 0; i < n; i++) out[i] = ct_f32_to_bf16(x[i]);
}

static int8_t clamp_q(float v) {
  v = nearbyintf(v);
  return (int8_t)(v < -128.0f ? -128.0f : v > 127.0f ? 127.0f : v);
}

void ct_quantize_int8(ct_quant_kind kind, int rows, int cols, const float *w, int8_t *q,
                      float *scales) {
#pragma omp parallel for schedule(static) if ((size_t)rows * cols > 65536)
  for (int r = 0; r < rows; r++) {
    const float *wr = w + (size_t)r * cols;
    int8_t *qr = q + (size_t)r * cols;
    float amax = 0.0f;
    for (int c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(wr[c]));
    if (kind == CT_QUANT_TORCHAO) {
      float s = amax / 127.5f;
      if (s < FLT_EPSILON) s = FLT_EPSILON;
      const float inv = 1.0f / s;
      for (int c = 0; c < cols; c++) qr[c] = clamp_q(wr[c] * inv);
      scales[r] = s;
    } else {
      const float s = amax / 127.0f;
      for (int c = 0; c < cols; c++) qr[c] = s > 0.0f ? clamp_q(wr[c] / s) : 0;
      scales[r] = s;
    }
  }
}

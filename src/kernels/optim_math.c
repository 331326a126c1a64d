/* Optimizer math on flat float ranges: the elementwise updates (Adam/AdamW,
 * Adagrad, Lion, SGD), the weights' EMA and the deterministic sum of squares
 * behind the gradient norm — the arithmetic a compute backend must provide for
 * the optimizers and the step (include/ctuner/backend.h).
 *
 * Each update is one pass with an OpenMP static partition; every element's
 * arithmetic is independent of the others, so the result does not depend on
 * the thread count or on how a range is sliced. Scalars PyTorch computes in
 * Python double (bias corrections, step sizes, Adagrad's clr) are computed in
 * double here too and rounded to float once. These are the optimizers' own
 * arithmetic: src/optim/optim_elem.c's slices call them, and the trainer's
 * EMA and gradient norm are these (tests/test_backend.c checks the CPU
 * backend's updates against ct_optim_step bit for bit). Formulas:
 * docs/optimizers.md.
 * Not here: tensor-wise rules (Lamb, Muon: src/optim/optim_tensor.c).
 */
#include <math.h>
#include <stdlib.h>

#include "ctuner/kernels.h"
#include "scratch.h"

#define SUMSQ_CHUNK ((size_t)1 << 16)

void ct_adam_update(size_t n, float *w, const float *g, float *m, float *v, float lr, float b1,
                    float b2, float eps, float wd, int decoupled, long step) {
  const double bc1 = 1.0 - pow((double)b1, (double)step), bc2 = 1.0 - pow((double)b2, (double)step);
  const float step_size = (float)((double)lr / bc1), bc2_sqrt = (float)sqrt(bc2);
  const float decay = decoupled ? (float)(1.0 - (double)lr * (double)wd) : 1.0f;
  const float l2 = decoupled ? 0.0f : wd;
  const float a1 = 1.0f - b1, a2 = 1.0f - b2;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float wi = w[i];
    float gi = g[i] + l2 * wi;
    wi *= decay;
    float mi = m[i] * b1 + a1 * gi;
    float vi = v[i] * b2 + a2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
  }
}

void ct_adagrad_update(size_t n, float *w, const float *g, float *sum, float lr, float lr_decay,
                       float eps, float wd, long step) {
  const float clr = (float)((double)lr / (1.0 + (double)(step - 1) * (double)lr_decay));
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float wi = w[i];
    float gi = g[i] + wd * wi;
    float si = sum[i] + gi * gi;
    sum[i] = si;
    w[i] = wi - clr * (gi / (sqrtf(si) + eps));
  }
}

void ct_lion_update(size_t n, float *w, const float *g, float *m, float lr, float b1, float b2,
                    float wd) {
  const float decay = (float)(1.0 - (double)lr * (double)wd);
  const float a1 = 1.0f - b1, a2 = 1.0f - b2;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float gi = g[i], mi = m[i];
    float c = b1 * mi + a1 * gi;
    float s = (float)(c > 0.0f) - (float)(c < 0.0f);
    w[i] = w[i] * decay - lr * s;
    m[i] = b2 * mi + a2 * gi;
  }
}

void ct_sgd_update(size_t n, float *w, const float *g, float *buf, float lr, float momentum,
                   float dampening, int nesterov, float wd, long step) {
  if (momentum == 0.0f || !buf) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
      float wi = w[i];
      w[i] = wi - lr * (g[i] + wd * wi);
    }
    return;
  }
  /* PyTorch creates the buffer as a copy of d_p on the first step (no dampening). */
  const int first = step <= 1;
  const float keep = first ? 0.0f : momentum, add = first ? 1.0f : 1.0f - dampening;
  if (nesterov) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
      float wi = w[i];
      float d = g[i] + wd * wi;
      float b = keep * buf[i] + add * d;
      buf[i] = b;
      w[i] = wi - lr * (d + momentum * b);
    }
  } else {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
      float wi = w[i];
      float b = keep * buf[i] + add * (g[i] + wd * wi);
      buf[i] = b;
      w[i] = wi - lr * b;
    }
  }
}

void ct_ema_update(size_t n, float *e, const float *w, float decay) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) e[i] = decay * e[i] + (1.0f - decay) * w[i];
}

double ct_sumsq(size_t n, const float *x) {
  const size_t nch = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
  double *part = ct_kernels_scratch((nch ? nch : 1) * sizeof *part, "sum of squares partials");
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < nch; c++) {
    size_t a = c * SUMSQ_CHUNK, b = a + SUMSQ_CHUNK < n ? a + SUMSQ_CHUNK : n;
    double s = 0;
    for (size_t i = a; i < b; i++) s += (double)x[i] * x[i];
    part[c] = s;
  }
  double s = 0;
  for (size_t c = 0; c < nch; c++) s += part[c];
  free(part);
  return s;
}

/* AdamW over a flat range, as torch.optim.AdamW (decoupled weight decay):
 *   w -= lr*wd*w;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   w -= lr/(1-b1^t) * m / (sqrt(v/(1-b2^t)) + eps)
 * One pass, OpenMP static partition, vectorisable. */
#include <math.h>

#include "ctuner/optim.h"

void ct_adamw_step(size_t n, float *w, const float *g, float *m, float *v, const ct_adamw_hp *hp,
                   long step) {
  const float b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps;
  const float bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
  const float step_size = hp->lr / bc1, rbc2 = 1.0f / sqrtf(bc2),
              decay = 1.0f - hp->lr * hp->weight_decay;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float gi = g[i];
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * decay - step_size * mi / (sqrtf(vi) * rbc2 + eps);
  }
}

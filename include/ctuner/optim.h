/* Optimizers over a (sub)range of a flat parameter buffer.
 *
 * An optimizer step sees only float ranges (params, grads, states), never a
 * model, so the same code serves a whole buffer or one ZeRO shard.
 */
#ifndef CTUNER_OPTIM_H
#define CTUNER_OPTIM_H

#include <stddef.h>

typedef struct ct_adamw_hp {
  float lr, beta1, beta2, eps, weight_decay;
} ct_adamw_hp;

/* One AdamW step (decoupled weight decay, bias-corrected, PyTorch semantics)
 * on n elements; step is 1-based. m and v are the first/second moments. */
void ct_adamw_step(size_t n, float *w, const float *g, float *m, float *v, const ct_adamw_hp *hp,
                   long step);

#endif

/* Elementwise optimizer updates on a slice: Adam/AdamW, Adagrad, Lion, SGD.
 *
 * The arithmetic lives once, in the kernel layer (src/kernels/optim_math.c:
 * ct_adam_update, ct_adagrad_update, ct_lion_update, ct_sgd_update — the CPU
 * compute backend's optimizer ops); a slice is one call of the optimizer's
 * backend's op (ct_optim_set_backend; the CPU backend's ops are those kernels). Every element's
 * arithmetic is independent of the others, so the result does not depend on
 * the thread count or on the slicing. Formulas: docs/optimizers.md.
 * Not here: anything that needs a per-tensor reduction (optim_tensor.c).
 */
#include "optim_int.h"

void ct_optim_adam_slice(const ct_backend_ops *be, size_t n, float *w, const float *g, float *m,
                         float *v, float lr, float b1, float b2, float eps, float wd, int decoupled,
                         long step) {
  be->adam_update(n, w, g, m, v, lr, b1, b2, eps, wd, decoupled, step);
}

void ct_optim_adagrad_slice(const ct_backend_ops *be, size_t n, float *w, const float *g,
                            float *sum, float lr, float lr_decay, float eps, float wd, long step) {
  be->adagrad_update(n, w, g, sum, lr, lr_decay, eps, wd, step);
}

void ct_optim_lion_slice(const ct_backend_ops *be, size_t n, float *w, const float *g, float *m,
                         float lr, float b1, float b2, float wd) {
  be->lion_update(n, w, g, m, lr, b1, b2, wd);
}

void ct_optim_sgd_slice(const ct_backend_ops *be, size_t n, float *w, const float *g, float *buf,
                        float lr, float momentum, float dampening, int nesterov, float wd,
                        long step) {
  be->sgd_update(n, w, g, buf, lr, momentum, dampening, nesterov, wd, step);
}

/* Private to src/optim: the optimizer object and the per-family kernels.
 *
 * optim.c owns the object (table, state block, parsing, validation, dispatch);
 * optim_elem.c holds the elementwise kernels (Adam/AdamW, Adagrad, Lion, SGD)
 * that work on any slice; optim_tensor.c holds the tensor-wise rules (Lamb's
 * trust ratio, Muon's Newton–Schulz) and the deterministic reductions.
 */
#ifndef CTUNER_OPTIM_INT_H
#define CTUNER_OPTIM_INT_H

#include <limits.h>
#include <stddef.h>

#include "ctuner/backend.h"
#include "ctuner/optim.h"

#define CT_OPTIM_MAX_STATE 2

struct ct_optim {
  ct_optim_kind kind;
  ct_optim_hp hp;
  size_t n;           /* floats in the range */
  size_t stride;      /* n rounded up to 16 floats: distance between state buffers */
  ct_optim_tensor *t; /* (nt) copied table; names point into `names` */
  size_t nt;
  char *names; /* all tensor names, NUL-separated */
  size_t nstate;
  const char *state_name[CT_OPTIM_MAX_STATE];
  float *state_block; /* (nstate * stride) one CT_MEM_OPTIMIZER block */
  float *ns;          /* Muon Newton–Schulz scratch (CT_MEM_BUFFERS), ns_floats */
  /* where state_block lives and the elementwise updates run (the CPU backend
   * unless ct_optim_set_backend moved it) */
  const ct_backend_ops *be;
  size_t ns_floats;
};

/* The step the Adam-family arithmetic gets. Without bias correction it is
 * LONG_MAX: 1 - b^LONG_MAX is exactly 1 in double for every b in [0, 1), so
 * the same kernel computes the uncorrected update bit for bit (step size lr,
 * denominator sqrt(v) + eps) without a second code path. */
static inline long ct_optim_bc_step(const ct_optim_hp *hp, long step) {
  return hp->bias_correction_off ? LONG_MAX : step;
}

/* ---- elementwise kernels on a slice of n floats (optim_elem.c), through be ---- */
/* Adam (decoupled = 0: g += wd w) or AdamW (decoupled = 1: w *= 1 - lr wd). */
void ct_optim_adam_slice(const ct_backend_ops *be, size_t n, float *w, const float *g, float *m,
                         float *v, float lr, float b1, float b2, float eps, float wd, int decoupled,
                         long step);
void ct_optim_adagrad_slice(const ct_backend_ops *be, size_t n, float *w, const float *g,
                            float *sum, float lr, float lr_decay, float eps, float wd, long step);
void ct_optim_lion_slice(const ct_backend_ops *be, size_t n, float *w, const float *g, float *m,
                         float lr, float b1, float b2, float wd);
/* buf may be NULL when momentum == 0. */
void ct_optim_sgd_slice(const ct_backend_ops *be, size_t n, float *w, const float *g, float *buf,
                        float lr, float momentum, float dampening, int nesterov, float wd,
                        long step);

/* ---- tensor-wise rules (optim_tensor.c) ---- */
/* Sum of squares in double over fixed blocks that depend only on n, summed in
 * block order: the same result for any thread count. */
double ct_optim_sumsq(size_t n, const float *x);
void ct_optim_lamb_tensor(size_t n, float *w, const float *g, float *m, float *v, float lr,
                          const ct_optim_hp *hp, long step);
/* Scratch floats Muon needs for a rows x cols weight. */
size_t ct_optim_muon_scratch(int rows, int cols);
void ct_optim_muon_tensor(int rows, int cols, float *w, const float *g, float *buf, float lr,
                          const ct_optim_hp *hp, float *scratch);

#endif

/* 1-bit Adam (DeepSpeed's OneBitAdam; Tang et al. 2021): Adam with full
 * communication for freeze_step warm-up steps, then the variance frozen and
 * only the momentum communicated, as signs with one scale per rank and chunk,
 * with error feedback on the workers and the servers (see onebit.c). */
#ifndef CT_TRAIN_ONEBIT_H
#define CT_TRAIN_ONEBIT_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/comm.h"

/* Which 1-bit optimizer a name is: the registry's ct_optim_onebit_of
 * (ctuner/optim.h). */

/* 0/1 Adam's schedule (DeepSpeed's names). */
typedef struct ct_zeroone_hp {
  long var_freeze_step;    /* the last step whose variance may update */
  long var_update_scaler;  /* the variance interval doubles after this many updates */
  long local_step_scaler;  /* after freezing, the local-step interval doubles after this many steps
                              ... */
  long local_step_clipper; /* ... up to this many */
} ct_zeroone_hp;

typedef struct ct_onebit ct_onebit;

/* n floats of parameters holding nt tensors [offs[i], offs[i] + lens[i])
 * (each compressed with its own scales, as DeepSpeed does per parameter);
 * m and v (n floats each) are the moments, owned by the caller (a
 * checkpointed optimizer's state). */
ct_status ct_onebit_new(ct_comm *comm, size_t n, const size_t *offs, const size_t *lens, size_t nt,
                        float *m, float *v, float beta1, float beta2, float eps, float weight_decay,
                        long freeze_step, ct_onebit **out, ct_err *err);
/* Make it 0/1 Adam (instead of 1-bit Adam) with this schedule; allocates the
 * momentum accumulator of the local steps. */
ct_status ct_onebit_zeroone(ct_onebit *o, const ct_zeroone_hp *hp, ct_err *err);

/* 1-bit Lamb's coefficients (DeepSpeed's names and defaults: 10, 0.01, 0.9, 4, 0.5, 0.1). */
typedef struct ct_onebit_lamb_hp {
  float max_coeff, min_coeff, coeff_beta, factor_max, factor_min, factor_threshold;
} ct_onebit_lamb_hp;
/* Make it 1-bit Lamb; allocates the fresh variance and the per-tensor
 * trust-ratio state. */
ct_status ct_onebit_lamb(ct_onebit *o, const ct_onebit_lamb_hp *hp, ct_err *err);
/* Move the end of the warm-up to after step `freeze_step` (1-bit Adam and Lamb). */
void ct_onebit_set_freeze(ct_onebit *o, long freeze_step);
void ct_onebit_free(ct_onebit *o);
/* Whether step `step` (1-based) takes the ordinary all-reduced gradient
 * (1-bit Adam: the freeze_step warm-up steps; 0/1 Adam: the variance-update
 * steps before var_freeze_step) or each rank's own (0). */
int ct_onebit_full_gradient(const ct_onebit *o, long step);
/* One step. Warm-up: g is the averaged gradient; Adam without bias correction
 * (as DeepSpeed), v updated. Compressed: g is this rank's own mean gradient;
 * the momentum is updated locally and replaced by the 1-bit compressed
 * average over the ranks; v stays frozen. w -= lr * (m / (sqrt(v) + eps) +
 * weight_decay * w). */
ct_status ct_onebit_step(ct_onebit *o, float *w, const float *g, float lr, long step, ct_err *err);
/* Bytes this rank handed to MPI for the optimizer's communication in
 * compressed steps, and what full-precision all-reduces of the same steps
 * would have sent (reduce-scatter + all-gather of n floats). */
void ct_onebit_bytes(const ct_onebit *o, double *sent, double *full, long *compressed_steps);

/* Over every step: bytes through MPI for the gradient and the optimizer,
 * against a float32 all-reduce at every step. */
void ct_onebit_bytes_all(const ct_onebit *o, double *sent, double *full, long *steps);
/* The compressed all-reduce alone (tests): x (n floats) <- the 1-bit
 * error-compensated average over the ranks of x, tensor by tensor (floats
 * outside the tensors are left alone). */
ct_status ct_onebit_allreduce(ct_onebit *o, float *x, ct_err *err);

#endif

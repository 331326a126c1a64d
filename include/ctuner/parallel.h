/* Threading: OpenMP for our loops, OpenBLAS (OpenMP build) for GEMMs, one pool. */
#ifndef CTUNER_PARALLEL_H
#define CTUNER_PARALLEL_H

/* Set the number of threads for ctuner loops and BLAS (n <= 0: all cores). */
void ct_threads_set(int n);
int ct_threads_get(void);
/* Monotonic wall-clock seconds. */
double ct_time_now(void);

#endif

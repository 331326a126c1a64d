/* parallel.c: one thread count for OpenMP loops and OpenBLAS, and a clock.
 *
 * OpenBLAS is the OpenMP build, so both share libgomp's pool; setting both
 * keeps GEMMs and our loops at the same width. Nothing else lives here.
 */
#include "ctuner/parallel.h"

#include <omp.h>
#include <time.h>

/* From OpenBLAS's cblas.h; declared here to avoid pulling the whole header. */
void openblas_set_num_threads(int num_threads);

void ct_threads_set(int n) {
  if (n <= 0) n = omp_get_num_procs();
  if (n < 1) n = 1;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int ct_threads_get(void) {
  return omp_get_max_threads();
}

double ct_time_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

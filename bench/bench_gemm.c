/* GEMM benchmark: ct_sgemm (the path CT_GEMM and the CPU choose: avx512,
 * avx2) against a baseline path (OpenBLAS's cblas_sgemm unless named) at the
 * `bench` preset's linear-layer shapes and at 2048^3.
 *
 * Each linear layer y (N, M) = x (N, K) . w^T is timed as the three products a
 * training step makes: fwd (NT), bwd dX (NN) and bwd dW (TN). The two
 * implementations run alternately, REPS times each, in the same process, so
 * that load from other processes hits both alike; medians are reported. One
 * JSON line per (shape, product):
 *   {"name", "op", "M", "N", "K", "ct_gflops", "base_gflops", "ratio"}
 * with M x N the output and K the summed dimension (cblas naming), ratio =
 * base time / ct time. Not part of the library; threads come from
 * OMP_NUM_THREADS; with one thread the times are the thread's CPU time
 * (CLOCK_THREAD_CPUTIME_ID), which other processes on the machine barely
 * disturb, otherwise wall time. Usage: bench_gemm [reps] [baseline path: blas, avx2,
 * avx512, bf16] [measured path instead of ct_sgemm], e.g. `CT_GEMM=avx2 bench_gemm 15
 * avx512` for AVX2 against AVX-512, `bench_gemm 9 avx512 bf16` for ct_sgemm_bf16's
 * kernel against the float32 AVX-512 one. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/gemm.h"

static int REPS = 15;
static ct_sgemm_fn base_fn, ct_fn = ct_sgemm;

static float *buf(size_t n) {
  float *p = malloc(n * sizeof(float));
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  unsigned s = 12345u + (unsigned)n;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    p[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.2f;
  }
  return p;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* wall time, or this thread's CPU time when running on one thread */
static double now(void) {
  if (omp_get_max_threads() > 1) return omp_get_wtime();
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double median(double *t, int n) {
  qsort(t, (size_t)n, sizeof(double), cmpd);
  return t[n / 2];
}

/* C (M x N) = op(A) . op(B) (+ C when beta = 1), timed alternately. */
static void one(const char *name, const char *op, int tA, int tB, int M, int N, int K, float beta,
                double *sum_ct, double *sum_blas) {
  int lda = tA ? M : K, ldb = tB ? K : N;
  float *A = buf((size_t)M * K), *B = buf((size_t)K * N), *C = buf((size_t)M * N);
  double *tc = malloc(sizeof(double) * (size_t)REPS), *tb = malloc(sizeof(double) * (size_t)REPS);
  for (int w = 0; w < 2; w++) {
    ct_fn(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, beta, C, N);
    base_fn(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, beta, C, N);
  }
  for (int r = 0; r < REPS; r++) {
    double t0 = now();
    ct_fn(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, beta, C, N);
    double t1 = now();
    base_fn(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, beta, C, N);
    double t2 = now();
    tc[r] = t1 - t0;
    tb[r] = t2 - t1;
  }
  double mc = median(tc, REPS), mb = median(tb, REPS), fl = 2.0 * M * N * K;
  *sum_ct += mc;
  *sum_blas += mb;
  printf(
      "{\"name\": \"%s\", \"op\": \"%s\", \"M\": %d, \"N\": %d, \"K\": %d, \"ct_gflops\": %.1f, "
      "\"base_gflops\": %.1f, \"ratio\": %.2f}\n",
      name, op, M, N, K, fl / mc / 1e9, fl / mb / 1e9, mb / mc);
  fflush(stdout);
  free(A), free(B), free(C), free(tc), free(tb);
}

/* The three products of one linear layer with `rows` rows, `in` -> `out`. */
static void linear(const char *name, int rows, int in, int out, double *sc, double *sb) {
  one(name, "fwd_NT", 0, 1, rows, out, in, 1.0f, sc, sb);
  one(name, "bwd_dx_NN", 0, 0, rows, in, out, 0.0f, sc, sb);
  one(name, "bwd_dw_TN", 1, 0, out, in, rows, 1.0f, sc, sb);
}

int main(int argc, char **argv) {
  if (argc > 1) REPS = atoi(argv[1]) > 0 ? atoi(argv[1]) : REPS;
  const char *base = argc > 2 ? argv[2] : "blas";
  if (!(base_fn = ct_sgemm_path_fn(base))) {
    fprintf(stderr, "bench_gemm: baseline path '%s' unknown or not on this CPU\n", base);
    return 2;
  }
  if (argc > 3 && !(ct_fn = ct_sgemm_path_fn(argv[3]))) {
    fprintf(stderr, "bench_gemm: measured path '%s' unknown or not on this CPU\n", argv[3]);
    return 2;
  }
  const char *ct = getenv("OPENBLAS_CORETYPE");
  printf(
      "{\"threads\": %d, \"reps\": %d, \"openblas_coretype\": \"%s\", \"ct_gemm_path\": \"%s\", "
      "\"base_path\": \"%s\"}\n",
      omp_get_max_threads(), REPS, ct ? ct : "", argc > 3 ? argv[3] : ct_sgemm_path(), base);
  enum { D = 384, F = 4 * D, NI = 16 * 64, NT = 16 * 16, NJ = 16 * 80, BZ = 16 };
  double sc = 0, sb = 0;
  linear("double.img.qkv", NI, D, 3 * D, &sc, &sb);
  linear("double.img.proj", NI, D, D, &sc, &sb);
  linear("double.img.mlp0", NI, D, F, &sc, &sb);
  linear("double.img.mlp2", NI, F, D, &sc, &sb);
  linear("double.txt.qkv", NT, D, 3 * D, &sc, &sb);
  linear("double.txt.mlp0", NT, D, F, &sc, &sb);
  linear("double.txt.mlp2", NT, F, D, &sc, &sb);
  linear("single.linear1.qkv", NJ, D, 3 * D, &sc, &sb);
  linear("single.linear1.mlp", NJ, D, F, &sc, &sb);
  linear("single.linear2", NJ, D + F, D, &sc, &sb);
  linear("double.mod", BZ, D, 6 * D, &sc, &sb);
  printf(
      "{\"name\": \"model_shapes_total\", \"ct_ms\": %.3f, \"base_ms\": %.3f, \"ratio\": %.2f}\n",
      sc * 1e3, sb * 1e3, sb / sc);
  double s2c = 0, s2b = 0;
  one("square2048", "NN", 0, 0, 2048, 2048, 2048, 0.0f, &s2c, &s2b);
  one("square2048", "NT", 0, 1, 2048, 2048, 2048, 0.0f, &s2c, &s2b);
  return 0;
}

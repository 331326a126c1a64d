/* `ctuner bench peak`: the cores' float32 FMA peak (a register-only FMA loop,
 * src/kernels/peak.c) per instruction set, and the bf16 dot-product peak
 * (vdpbf16ps), and each SGEMM path's rate on a square product against its
 * ISA's peak (ct_sgemm_bf16 against the bf16 one).
 *
 * Per core, rates are FLOPs per second of the thread's own CPU time
 * (CLOCK_THREAD_CPUTIME_ID) on one thread, so other processes sharing the
 * cores slow neither side; the loop, and every path's one-thread SGEMM, are
 * run alternately REPS times and the medians kept, so the ratio
 * sgemm / peak is read within one run. All cores: the loop on every thread
 * at once and each path on all threads, by wall time (only meaningful on an
 * otherwise idle machine; docs/gemm.md). One JSON line per ISA, then one per
 * SGEMM path.
 */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "ctuner/alloc.h"
#include "ctuner/backend.h"
#include "ctuner/kernels.h"
#include "ctuner/parallel.h"
#include "ctuner/rng.h"

#define REPS 5
#define NISA 3  /* avx512, avx2 (float32 FMA), avx512bf16 (vdpbf16ps) */
#define NPATH 4 /* avx512, avx2, blas (ct_sgemm's paths), bf16 (ct_sgemm_bf16) */

void ct_cmd_bench_peak_help(FILE *f) {
  fprintf(f,
          "usage: ctuner bench peak [--size N] [--threads T] [--backend NAME]\n"
          "                         [--loop_iters K]\n"
          "\n"
          "Measures the float32 FMA peak of this CPU with a register-only FMA loop for\n"
          "each instruction set it has (avx512, avx2; avx512bf16: the vdpbf16ps bf16\n"
          "dot-product loop), per core (one thread, GFLOP/s per\n"
          "second of the thread's CPU time: robust to other load) and for all T threads\n"
          "(wall time: needs an idle machine), then each SGEMM path (avx512, avx2, blas;\n"
          "bf16: ct_sgemm_bf16, operands rounded to bf16, against the avx512bf16 peak)\n"
          "on an N x N x N product (default 2048) the same two ways, timed alternately\n"
          "with the loop; prints one JSON line per ISA and per path with\n"
          "gemm_over_peak_core (the path's per-core rate over its ISA's per-core peak;\n"
          "OpenBLAS against the widest ISA) and gemm_over_peak_all. docs/gemm.md.\n"
          "--loop_iters K: iterations of the FMA loop per timing (default 20000000,\n"
          "~0.2 s; the tests use fewer: unoptimised ASan builds took minutes).\n"
          "--backend NAME (a device: cuda, docs/cuda.md) measures the device instead: the\n"
          "vendor library's bf16 and float32 GEMM on an N x N x N product (default 8192),\n"
          "the backend's own sgemm (float32, and its bf16-compute sibling's) on the same\n"
          "product, and the device copy rate; one JSON line.\n");
}

static double thread_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmpd);
  return v[n / 2];
}

static float sink;
static long loop_iters = 20000000L; /* --loop_iters */

/* GFLOP/s of the loop on one thread per CPU second (~0.2 s of work by default). */
static double peak_core(const char *isa) {
  double t0 = thread_cpu();
  double fl = ct_fma_peak_loop(isa, loop_iters, &sink);
  return fl / (thread_cpu() - t0) / 1e9;
}

/* GFLOP/s of the loop on nth threads at once, by wall time. */
static double peak_all(const char *isa, int nth) {
  double fl = 0, t0 = ct_time_now();
#pragma omp parallel num_threads(nth) reduction(+ : fl)
  {
    float s = 0;
    fl += ct_fma_peak_loop(isa, loop_iters, &s);
#pragma omp critical
    sink += s;
  }
  return fl / (ct_time_now() - t0) / 1e9;
}

typedef struct {
  const char *name, *isa; /* path and the ISA its peak is read against */
  ct_sgemm_fn fn;
  double core[REPS], all[REPS];
} path_t;

/* One product of size n with the path on nth threads: GFLOP/s per thread CPU
 * second (nth == 1) or per wall second. */
static double gemm_rate(const path_t *p, int n, int nth, const float *a, const float *b, float *c) {
  int saved = omp_get_max_threads();
  omp_set_num_threads(nth);
  openblas_set_num_threads(nth);
  double w0 = ct_time_now(), c0 = thread_cpu();
  p->fn(0, 1, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
  double dt = nth == 1 ? thread_cpu() - c0 : ct_time_now() - w0;
  omp_set_num_threads(saved);
  openblas_set_num_threads(saved);
  return 2.0 * n * n * (double)n / dt / 1e9;
}

/* TFLOP/s of be's own sgemm (float32 operands in its memory) on n^3, best of 3 after a warm-up */
static double table_sgemm_tflops(const ct_backend_ops *be, int n) {
  size_t nn = (size_t)n * n;
  float *h = malloc(nn * sizeof(float));
  float *a = be->alloc(CT_MEM_OTHER, nn * 4), *b = be->alloc(CT_MEM_OTHER, nn * 4),
        *c = be->alloc(CT_MEM_OTHER, nn * 4);
  double best = 0;
  if (h && a && b && c && be->sgemm) {
    ct_rng_fill_normal(h, nn, 1, 1, 0, 0, 1);
    be->copy_in(a, h, nn * 4);
    be->copy_in(b, h, nn * 4);
    for (int r = 0; r < 4; r++) {
      be->synchronize();
      double t0 = ct_time_now();
      be->sgemm(0, 1, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      be->synchronize();
      double tf = 2.0 * n * n * (double)n / (ct_time_now() - t0) / 1e12;
      if (r > 0 && tf > best) best = tf;
    }
  }
  free(h);
  be->free(a), be->free(b), be->free(c);
  return best;
}

static int peak_device(const char *name, long n) {
  const ct_backend_ops *be = NULL, *b16 = NULL;
  ct_err err = {0};
  if (ct_backend_get(name, &be, &err)) {
    fprintf(stderr, "ctuner bench peak: %s\n", err.msg);
    return 2;
  }
  if (!be->gemm_peak || !be->copy_peak) {
    fprintf(stderr, "ctuner bench peak: --backend %s: not a device backend (run without it)\n",
            name);
    return 2;
  }
  if (ct_backend_with_compute(be, CT_COMPUTE_BF16, &b16, &err)) b16 = NULL;
  double bf = be->gemm_peak((int)n, 1) / 1e3, f32 = be->gemm_peak((int)n, 0) / 1e3;
  double own = table_sgemm_tflops(be, (int)n), own16 = b16 ? table_sgemm_tflops(b16, (int)n) : 0;
  double copy = be->copy_peak((size_t)1 << 30);
  ct_status st = be->check ? be->check(&err) : CT_OK;
  printf(
      "{\"backend\": \"%s\", \"device\": \"%s\", \"size\": %ld, \"vendor_bf16_tflops\": %.1f, "
      "\"vendor_fp32_tflops\": %.1f, \"sgemm_fp32_tflops\": %.1f, \"sgemm_bf16_tflops\": %.1f, "
      "\"sgemm_bf16_over_vendor\": %.3f, \"copy_gbs\": %.0f%s%s%s}\n",
      be->name, be->description, n, bf, f32, own, own16, bf > 0 ? own16 / bf : 0, copy,
      st ? ", \"error\": \"" : "", st ? err.msg : "", st ? "\"" : "");
  return st ? 1 : 0;
}

int ct_cmd_bench_peak(int argc, char **argv) {
  long n = 0, threads = 0;
  const char *v, *backend = NULL;
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_bench_peak_help(stdout);
      return 0;
    } else if ((r = ct_cli_opt(argc, argv, &i, "size", &v))) {
      if (r < 0 || ct_cli_int("size", v, 64, 8192, &n)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "threads", &v))) {
      if (r < 0 || ct_cli_int("threads", v, 1, 1024, &threads)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "loop_iters", &v))) {
      if (r < 0 || ct_cli_int("loop_iters", v, 1000, 2000000000L, &loop_iters)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "backend", &backend))) {
      if (r < 0) return 2;
    } else {
      fprintf(stderr, "ctuner bench peak: unknown option '%s'\n", argv[i]);
      ct_cmd_bench_peak_help(stderr);
      return 2;
    }
  }
  if (backend && strcmp(backend, "cpu")) return peak_device(backend, n ? n : 8192);
  if (!n) n = 2048;
  ct_threads_set((int)threads);
  int nth = ct_threads_get();
  static const char *const isas[NISA] = {"avx512", "avx2", "avx512bf16"};
  const char *widest = NULL;
  double pc[NISA][REPS] = {{0}}, pa[NISA][REPS] = {{0}};
  path_t paths[NPATH] = {{"avx512", "avx512", NULL, {0}, {0}},
                         {"avx2", "avx2", NULL, {0}, {0}},
                         {"blas", NULL, NULL, {0}, {0}},
                         {"bf16", "avx512bf16", NULL, {0}, {0}}};
  for (int i = 0; i < 2; i++)
    if (!widest && ct_fma_peak_has(isas[i])) widest = isas[i];
  if (!widest) {
    fprintf(stderr, "ctuner bench peak: this CPU has neither AVX-512 nor AVX2 + FMA\n");
    return 1;
  }
  paths[2].isa = widest;
  for (int i = 0; i < NPATH; i++) paths[i].fn = ct_sgemm_path_fn(paths[i].name);
  size_t nn = (size_t)n * (size_t)n;
  float *a = ct_alloc(CT_MEM_BUFFERS, nn * 4), *b = ct_alloc(CT_MEM_BUFFERS, nn * 4),
        *c = ct_alloc(CT_MEM_BUFFERS, nn * 4);
  if (!a || !b || !c) {
    fprintf(stderr, "ctuner bench peak: out of memory for %ld x %ld matrices\n", n, n);
    ct_free(a), ct_free(b), ct_free(c);
    return 1;
  }
  ct_rng_fill_normal(a, nn, 1, 1, 0, 0, 1);
  ct_rng_fill_normal(b, nn, 1, 2, 0, 0, 1);
  for (int i = 0; i < NPATH; i++) /* warm-up: packing buffers, OpenBLAS's threads */
    if (paths[i].fn) gemm_rate(&paths[i], (int)n, nth, a, b, c);
  for (int r = 0; r < REPS; r++) {
    for (int i = 0; i < NISA; i++)
      if (ct_fma_peak_has(isas[i])) {
        pc[i][r] = peak_core(isas[i]);
        pa[i][r] = peak_all(isas[i], nth);
      }
    for (int i = 0; i < NPATH; i++)
      if (paths[i].fn) {
        paths[i].core[r] = gemm_rate(&paths[i], (int)n, 1, a, b, c);
        paths[i].all[r] = gemm_rate(&paths[i], (int)n, nth, a, b, c);
      }
  }
  double peak_c[NISA] = {0}, peak_a[NISA] = {0};
  for (int i = 0; i < NISA; i++) {
    if (!ct_fma_peak_has(isas[i])) continue;
    double lo = pc[i][0], hi = pc[i][0];
    for (int r = 1; r < REPS; r++)
      lo = pc[i][r] < lo ? pc[i][r] : lo, hi = pc[i][r] > hi ? pc[i][r] : hi;
    peak_c[i] = median(pc[i], REPS);
    peak_a[i] = median(pa[i], REPS);
    printf(
        "{\"isa\": \"%s\", \"threads\": %d, \"peak_gflops_core\": %.1f, "
        "\"peak_gflops_core_min\": %.1f, \"peak_gflops_core_max\": %.1f, "
        "\"peak_gflops_all\": %.1f}\n",
        isas[i], nth, peak_c[i], lo, hi, peak_a[i]);
  }
  for (int i = 0; i < NPATH; i++) {
    if (!paths[i].fn) {
      printf("{\"path\": \"%s\", \"available\": false}\n", paths[i].name);
      continue;
    }
    int k = 0;
    while (strcmp(paths[i].isa, isas[k])) k++;
    double gc = median(paths[i].core, REPS), ga = median(paths[i].all, REPS);
    printf(
        "{\"path\": \"%s\", \"size\": %ld, \"threads\": %d, \"gemm_gflops_core\": %.1f, "
        "\"gemm_gflops_all\": %.1f, \"peak_isa\": \"%s\", \"gemm_over_peak_core\": %.3f, "
        "\"gemm_over_peak_all\": %.3f}\n",
        paths[i].name, n, nth, gc, ga, paths[i].isa, gc / peak_c[k], ga / peak_a[k]);
  }
  fflush(stdout);
  ct_free(a), ct_free(b), ct_free(c);
  return sink == 12345.0f; /* never: keeps the loops' results alive */
}

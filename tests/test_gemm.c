/* Tests of ct_sgemm and of every path behind it that this machine has
 * (AVX-512, AVX2, OpenBLAS: ct_sgemm_path_fn) against a naive
 * double-precision reference: all transpose combinations, alpha/beta (beta = 0
 * ignores NaN in C), odd sizes around the register tiles and cache blocks, K
 * across several K blocks, leading dimensions wider than the matrices; bitwise
 * equality of results computed with 1, 2 and 3 threads on our kernels; and
 * the AVX2 and AVX-512 kernels giving the same bits. A path the CPU lacks is
 * reported as skipped. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels/gemm.h"

static uint64_t rng_s = 1;
static float frand(void) { /* uniform in [-1, 1) */
  rng_s ^= rng_s << 13;
  rng_s ^= rng_s >> 7;
  rng_s ^= rng_s << 17;
  return (float)((double)(rng_s >> 40) / (double)(1ull << 23) - 1.0);
}
static float *randv(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = frand();
  return p;
}

/* The bf16 path is checked against the reference of its bf16-ROUNDED
 * operands, so that only the float32 summation differs (same tolerance). */
static int round_ops;

/* Element (i, k) of op(X) for a row-major X with leading dimension ld. */
static double at(const float *X, int ld, int trans, int i, int k) {
  float x = trans ? X[(size_t)k * ld + i] : X[(size_t)i * ld + k];
  return round_ops ? ct_bf16_round(x) : x;
}

/* Runs one ct_sgemm and compares every element (and the padding columns, which
 * must be untouched) against the double reference. Returns 0 if all match. */
/* The function under test: ct_sgemm itself, or one path (NULL: ct_sgemm). */
static ct_sgemm_fn fn_under_test;

static int check_case(int tA, int tB, int M, int N, int K, float alpha, float beta, int pad,
                      int nan_c) {
  int lda = (tA ? M : K) + pad, ldb = (tB ? K : N) + pad, ldc = N + pad;
  size_t na = (size_t)(tA ? K : M) * lda, nb = (size_t)(tB ? N : K) * ldb;
  size_t nc = (size_t)M * ldc;
  float *A = randv(na), *B = randv(nb), *C = randv(nc), *C0 = malloc(nc * sizeof(float));
  if (nan_c)
    for (size_t i = 0; i < nc; i++) C[i] = NAN;
  memcpy(C0, C, nc * sizeof(float));
  /* a path function is called only where its contract holds (gemm.h) */
  if (fn_under_test && M > 0 && N > 0 && K > 0 && alpha != 0.0f)
    fn_under_test(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else if (round_ops)
    ct_sgemm_bf16(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    ct_sgemm(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  int bad = 0;
  double tol_k = 1e-5 * sqrt((double)K + 1);
  for (int i = 0; i < M && bad < 3; i++) {
    for (int j = 0; j < ldc && bad < 3; j++) {
      size_t ij = (size_t)i * ldc + j;
      if (j >= N) { /* padding: must be untouched (NaN compares by bits) */
        if (memcmp(&C[ij], &C0[ij], sizeof(float))) bad++;
        continue;
      }
      double s = 0, sa = 0;
      for (int k = 0; k < K; k++) {
        double p = at(A, lda, tA, i, k) * at(B, ldb, tB, k, j);
        s += p;
        sa += fabs(p);
      }
      double cprev = beta == 0.0f ? 0.0 : (double)beta * C0[ij];
      double ref = (double)alpha * s + cprev;
      double scale = fabs((double)alpha) * sa + fabs(cprev) + 1e-30;
      if (!(fabs((double)C[ij] - ref) <= tol_k * scale)) {
        fprintf(
            stderr,
            "  tA=%d tB=%d M=%d N=%d K=%d alpha=%g beta=%g pad=%d: C[%d][%d] = %.9g, ref %.9g\n",
            tA, tB, M, N, K, alpha, beta, pad, i, j, C[ij], ref);
        bad++;
      }
    }
  }
  free(A), free(B), free(C), free(C0);
  return bad;
}

/* Every path by name; a test body runs once per path present. (ct_sgemm is
 * one of them, and check_case sends the degenerate shapes through it.) */
static const char *const paths[] = {"avx512", "avx2", "blas", "bf16", "bf16_copies"};
#define NPATHS 5
static int path_select(int i) {
  fn_under_test = ct_sgemm_path_fn(paths[i]);
  round_ops = !strncmp(paths[i], "bf16", 4);
  if (!fn_under_test) {
    CT_SKIP_PART("path %s: this CPU lacks it", paths[i]);
    return 0;
  }
  return 1;
}

static int odd_sizes(void) {
  static const int sz[] = {1, 2, 3, 5, 7, 13, 17, 31, 33, 63, 65, 127, 129};
  int n = (int)(sizeof sz / sizeof sz[0]), cases = 0;
  rng_s = 11;
  for (int t = 0; t < 4; t++) {
    int tA = t >> 1, tB = t & 1;
    for (int a = 0; a < n; a++)
      for (int b = 0; b < n; b++) {
        /* all (M, N) pairs, K cycling through the sizes so every one is hit */
        int M = sz[a], N = sz[b], K = sz[(a * 5 + b * 3 + t) % n];
        if (check_case(tA, tB, M, N, K, 1.0f, 0.0f, 0, 0)) return -1;
        cases++;
      }
  }
  return cases == 4 * n * n ? 0 : -1;
}

CT_TEST(gemm, transpose_combos_odd_sizes) {
  for (int i = 0; i < NPATHS; i++)
    if (path_select(i)) CHECKF(odd_sizes() == 0, "path %s", paths[i]);
  fn_under_test = NULL;
  round_ops = 0;
}

CT_TEST(gemm, alpha_beta_and_nan_c) {
  for (int pi = 0; pi < NPATHS; pi++) {
    if (!path_select(pi)) continue;
    rng_s = 12;
    for (int t = 0; t < 4; t++) {
      int tA = t >> 1, tB = t & 1;
      CHECK(check_case(tA, tB, 37, 45, 29, 1.0f, 1.0f, 0, 0) == 0);
      CHECK(check_case(tA, tB, 37, 45, 29, -0.5f, 0.25f, 3, 0) == 0);
      CHECK(check_case(tA, tB, 50, 70, 200, 2.0f, -1.0f, 5, 0) == 0);
      /* beta == 0: C full of NaN must be overwritten, not propagated */
      CHECK(check_case(tA, tB, 19, 33, 17, 0.75f, 0.0f, 2, 1) == 0);
      /* alpha == 0 and K == 0: C = beta * C; beta == 0 clears NaN */
      CHECK(check_case(tA, tB, 9, 40, 16, 0.0f, 0.5f, 1, 0) == 0);
      CHECK(check_case(tA, tB, 9, 40, 16, 0.0f, 0.0f, 1, 1) == 0);
      CHECK(check_case(tA, tB, 9, 40, 0, 1.0f, 0.0f, 1, 1) == 0);
    }
  }
  fn_under_test = NULL;
  round_ops = 0;
}

CT_TEST(gemm, large_k_and_leading_dims) {
  /* not bf16_copies: ct_sgemm on rounded copies, whose blocking the float32
   * paths cover here (one pass less under ASan) */
  for (int pi = 0; pi < NPATHS - 1; pi++) {
    if (!path_select(pi)) continue;
    rng_s = 13;
    /* K crosses several K blocks; sizes not multiples of the register tile */
    CHECK(check_case(0, 1, 67, 93, 1031, 1.0f, 0.0f, 7, 0) == 0);
    CHECK(check_case(0, 0, 130, 70, 1500, 1.0f, 1.0f, 0, 0) == 0);
    CHECK(check_case(1, 0, 45, 150, 1283, 0.5f, 1.0f, 16, 0) == 0);
    CHECK(check_case(1, 1, 200, 33, 777, 1.0f, 0.5f, 1, 0) == 0);
    /* several row blocks (threads share the packing of B's rows) and an odd
     * last K block (1031 = 344 + 344 + 343: bf16 pads its last pair) */
    CHECK(check_case(0, 0, 300, 70, 1031, 1.0f, 0.0f, 3, 0) == 0);
    CHECK(check_case(1, 0, 260, 90, 1031, 1.0f, 1.0f, 0, 0) == 0);
    /* the model's shapes: many rows, wide outputs, a row count below one tile */
    CHECK(check_case(0, 1, 300, 1152, 384, 1.0f, 1.0f, 0, 0) == 0);
    CHECK(check_case(0, 1, 16, 2304, 384, 1.0f, 0.0f, 0, 0) == 0);
  }
  fn_under_test = NULL;
  round_ops = 0;
}

/* C of one product computed by f with `threads` threads (into a fresh buffer). */
static float *run_threads(ct_sgemm_fn f, int threads, int tA, int tB, int M, int N, int K,
                          const float *A, const float *B, const float *C0, float beta) {
  int lda = tA ? M : K, ldb = tB ? K : N;
  float *C = malloc((size_t)M * N * sizeof(float));
  memcpy(C, C0, (size_t)M * N * sizeof(float));
  int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  f(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, beta, C, N);
  omp_set_num_threads(saved);
  return C;
}

/* shapes that give different row blocks and column groups per thread count */
static const int shp[][3] = {
    {523, 301, 700}, {16, 777, 384}, {1000, 96, 300}, {97, 97, 2000}, {400, 130, 1031}};

/* Our kernels (OpenBLAS makes no such promise): 1, 2 and 3 threads, same bits. */
CT_TEST(gemm, bitwise_identical_across_threads) {
  static const char *const ours[] = {"avx512", "avx2", "bf16"};
  for (int pi = 0; pi < 3; pi++) {
    ct_sgemm_fn f = ct_sgemm_path_fn(ours[pi]);
    if (!f) {
      CT_SKIP_PART("path %s: this CPU lacks it", ours[pi]);
      continue;
    }
    rng_s = 14;
    for (int s = 0; s < 5; s++) {
      int M = shp[s][0], N = shp[s][1], K = shp[s][2];
      for (int t = 0; t < 4; t++) {
        int tA = t >> 1, tB = t & 1;
        float *A = randv((size_t)M * K), *B = randv((size_t)K * N), *C0 = randv((size_t)M * N);
        float *c1 = run_threads(f, 1, tA, tB, M, N, K, A, B, C0, 1.0f);
        float *c2 = run_threads(f, 2, tA, tB, M, N, K, A, B, C0, 1.0f);
        float *c3 = run_threads(f, 3, tA, tB, M, N, K, A, B, C0, 1.0f);
        size_t bytes = (size_t)M * N * sizeof(float);
        CHECKF(!memcmp(c1, c2, bytes), "%s M=%d N=%d K=%d tA=%d tB=%d: 1 vs 2 threads", ours[pi], M,
               N, K, tA, tB);
        CHECKF(!memcmp(c1, c3, bytes), "%s M=%d N=%d K=%d tA=%d tB=%d: 1 vs 3 threads", ours[pi], M,
               N, K, tA, tB);
        free(A), free(B), free(C0), free(c1), free(c2), free(c3);
      }
    }
  }
}

/* The AVX2 and AVX-512 kernels give the same bits (same K blocks, same FMA
 * order per element), so a run's numbers do not depend on which one the CPU
 * picks. Also at beta = 0 and 0.5 and with K over several blocks. */
CT_TEST(gemm, avx2_equals_avx512) {
  ct_sgemm_fn f512 = ct_sgemm_path_fn("avx512"), f2 = ct_sgemm_path_fn("avx2");
  if (!f512 || !f2) {
    CT_SKIP("needs both AVX-512 and AVX2 (this CPU: avx512 %s, avx2 %s)", f512 ? "yes" : "no",
            f2 ? "yes" : "no");
  }
  rng_s = 16;
  static const float betas[] = {1.0f, 0.0f, 0.5f};
  for (int s = 0; s < 4; s++) {
    int M = shp[s][0], N = shp[s][1], K = shp[s][2] + 700;
    for (int t = 0; t < 4; t++) {
      int tA = t >> 1, tB = t & 1;
      float *A = randv((size_t)M * K), *B = randv((size_t)K * N), *C0 = randv((size_t)M * N);
      float beta = betas[(s + t) % 3];
      float *c1 = run_threads(f512, 2, tA, tB, M, N, K, A, B, C0, beta);
      float *c2 = run_threads(f2, 2, tA, tB, M, N, K, A, B, C0, beta);
      CHECKF(!memcmp(c1, c2, (size_t)M * N * sizeof(float)),
             "M=%d N=%d K=%d tA=%d tB=%d beta=%g: avx2 and avx512 differ", M, N, K, tA, tB, beta);
      free(A), free(B), free(C0), free(c1), free(c2);
    }
  }
}

/* Called from inside a parallel region (as attention does per tile) it must run
 * on the calling thread only and still be correct. */
CT_TEST(gemm, inside_parallel_region) {
  if (!strcmp(ct_sgemm_path(), "blas")) {
    CT_SKIP("ct_sgemm uses OpenBLAS here (no AVX2 or CT_GEMM=blas)");
  }
  enum { M = 64, N = 80, K = 64, T = 4 };
  rng_s = 15;
  float *A = randv((size_t)T * M * K), *B = randv((size_t)T * K * N);
  float *C = malloc(sizeof(float) * T * M * N), *R = malloc(sizeof(float) * T * M * N);
  for (int t = 0; t < T; t++)
    ct_sgemm(0, 0, M, N, K, 1.0f, A + (size_t)t * M * K, K, B + (size_t)t * K * N, N, 0.0f,
             R + (size_t)t * M * N, N);
#pragma omp parallel for num_threads(2)
  for (int t = 0; t < T; t++)
    ct_sgemm(0, 0, M, N, K, 1.0f, A + (size_t)t * M * K, K, B + (size_t)t * K * N, N, 0.0f,
             C + (size_t)t * M * N, N);
  CHECK(!memcmp(C, R, sizeof(float) * T * M * N));
  free(A), free(B), free(C), free(R);
}

/* Round to nearest even on the bf16 grid (ulp 2^-7 at 1), as torch casts. */
CT_TEST(gemm, bf16_round) {
  const float e = 1.0f / 256.0f; /* half an ulp at 1 */
  CHECK(ct_bf16_round(1.0f) == 1.0f);
  CHECK(ct_bf16_round(1.0f + e) == 1.0f);                 /* tie: to even */
  CHECK(ct_bf16_round(1.0f + 3 * e) == 1.0f + 4 * e);     /* tie: to even */
  CHECK(ct_bf16_round(1.0f + e * 1.25f) == 1.0f + 2 * e); /* above half */
  CHECK(ct_bf16_round(-1.0f - e * 0.75f) == -1.0f);
  CHECK(isinf(ct_bf16_round(3.4e38f)));
  CHECK(isinf(ct_bf16_round(INFINITY)) && isnan(ct_bf16_round(NAN)));
  CHECK(isnan(ct_bf16_round(-NAN)));
}

/* The kernel rounds exactly as ct_bf16_round, ties included: with K = 1 and
 * B = 1, C = bf16(a) exactly. Also an odd K (a zero-padded last pair). */
CT_TEST(gemm, bf16_kernel_rounding) {
  ct_sgemm_fn f = ct_sgemm_path_fn("bf16");
  if (!f) {
    CT_SKIP("this CPU has no AVX512-BF16");
  }
  enum { M = 20, N = 50 };
  const float e = 1.0f / 256.0f;
  float a[M], b[N], c[M * N];
  for (int i = 0; i < M; i++) a[i] = (1.0f + (float)(2 * i + 1) * e) * (i % 2 ? -1.0f : 1.0f);
  for (int j = 0; j < N; j++) b[j] = 1.0f;
  for (int t = 0; t < 4; t++) {
    int tA = t >> 1, tB = t & 1;
    f(tA, tB, M, N, 1, 1.0f, a, tA ? M : 1, b, tB ? 1 : N, 0.0f, c, N);
    int bad = 0;
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) bad += c[i * N + j] != ct_bf16_round(a[i]);
    CHECKF(bad == 0, "tA=%d tB=%d: %d elements not bf16(a)", tA, tB, bad);
  }
  /* products exact in float32, sums of few terms exact: K = 3, all ones */
  float a3[M * 3], b3[3 * N];
  for (int i = 0; i < M * 3; i++) a3[i] = 1.0f + e;     /* rounds to 1 */
  for (int i = 0; i < 3 * N; i++) b3[i] = 2.0f + 2 * e; /* tie: rounds to 2 */
  f(0, 0, M, N, 3, 1.0f, a3, 3, b3, N, 0.0f, c, N);
  int bad = 0;
  for (int i = 0; i < M * N; i++) bad += c[i] != 6.0f;
  CHECKF(bad == 0, "K=3: %d elements not 6", bad);
}

/* The fallback of CPUs without AVX512-BF16 ("bf16_copies": rounded copies in
 * the kernel's order of sums, through the float32 kernel) gives the kernel's
 * bits: every transpose combination, alpha/beta, odd K blocks (K = 1031: two
 * blocks of 516 and 515; K = 2000: 500 each; K = 7), and float32 denormals,
 * which both read as zero. So a bf16 training run's numbers do not depend on
 * whether the CPU has AVX512-BF16. */
CT_TEST(gemm, bf16_copies_equal_kernel) {
  ct_sgemm_fn fk = ct_sgemm_path_fn("bf16"), fc = ct_sgemm_path_fn("bf16_copies");
  if (!fk || strcmp(ct_sgemm_path(), "blas") == 0) {
    CT_SKIP("needs AVX512-BF16 and our float32 kernels (path %s)", ct_sgemm_path());
  }
  rng_s = 17;
  static const float betas[] = {1.0f, 0.0f, 0.5f};
  static const int ks[] = {7, 1031, 2000, 384, 1};
  for (int s = 0; s < 5; s++) {
    int M = shp[s][0] / 2 + 1, N = shp[s][1] / 2 + 3, K = ks[s];
    for (int t = 0; t < 4; t++) {
      int tA = t >> 1, tB = t & 1;
      float *A = randv((size_t)M * K), *B = randv((size_t)K * N), *C0 = randv((size_t)M * N);
      if (s == 0) A[0] = 1e-39f, A[1] = -3e-40f, B[0] = B[1] = 1e30f; /* denormal operands */
      float beta = betas[(s + t) % 3], alpha = t == 3 ? -0.75f : 1.0f;
      float *c1 = malloc((size_t)M * N * sizeof(float)),
            *c2 = malloc((size_t)M * N * sizeof(float));
      memcpy(c1, C0, (size_t)M * N * sizeof(float));
      memcpy(c2, C0, (size_t)M * N * sizeof(float));
      int lda = tA ? M : K, ldb = tB ? K : N;
      fk(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, c1, N);
      fc(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, c2, N);
      size_t nd = 0;
      for (size_t i = 0; i < (size_t)M * N; i++) nd += memcmp(&c1[i], &c2[i], sizeof(float)) != 0;
      CHECKF(nd == 0, "M=%d N=%d K=%d tA=%d tB=%d beta=%g: %zu elements differ", M, N, K, tA, tB,
             beta, nd);
      free(A), free(B), free(C0), free(c1), free(c2);
    }
  }
}

/* ct_linear_fwd_bf16 / ct_linear_bwd_bf16 (the linear layer of the bf16
 * compute backend) against a float64 reference of the bf16-ROUNDED operands:
 * y = bf16(x) bf16(w)^T + b, dx = bf16(dy) bf16(w), dw += bf16(dy)^T bf16(x),
 * db += sum dy (unrounded: the bias gradient stays float32). The float32
 * summation is all that may differ (1e-5 sqrt(K) of sum |terms|); against the
 * unrounded reference the same tolerance fails, so the rounding is there. */
static int lin_cmp(const char *what, const float *got, const double *ref, const double *mag,
                   const double *raw, int n, int k, int *raw_off) {
  int bad = 0;
  double tol = 1e-5 * sqrt((double)k + 1);
  for (int i = 0; i < n; i++) {
    double sc = mag[i] + 1e-30;
    if (!(fabs((double)got[i] - ref[i]) <= tol * sc) && bad++ < 3)
      fprintf(stderr, "  %s[%d] = %.9g, rounded-operand reference %.9g\n", what, i, got[i], ref[i]);
    if (raw && fabs((double)got[i] - raw[i]) > tol * sc) (*raw_off)++;
  }
  return bad;
}

CT_TEST(gemm, bf16_linear_vs_rounded_double) {
  enum { N = 67, K = 45, M = 29, LDX = K + 3, LDY = M + 2 };
  rng_s = 21;
  float *x = randv((size_t)N * LDX), *w = randv((size_t)M * K), *b = randv(M);
  float *dy = randv((size_t)N * LDY), *y = randv((size_t)N * LDY), *dx = randv((size_t)N * LDX);
  float *dw = randv((size_t)M * K), *db = randv(M), *dw0 = malloc(sizeof(float) * M * K);
  float db0[M];
  memcpy(dw0, dw, sizeof(float) * M * K);
  memcpy(db0, db, sizeof db0);
  ct_linear_fwd_bf16(N, K, M, x, LDX, w, b, y, LDY);
  ct_linear_bwd_bf16(N, K, M, x, LDX, w, dy, LDY, dx, LDX, 0.0f, dw, db);
  double *ref = calloc((size_t)N * K + (size_t)M * K + N * M, sizeof(double));
  double *mag = calloc((size_t)N * K + (size_t)M * K + N * M, sizeof(double));
  double *raw = calloc((size_t)N * K + (size_t)M * K + N * M, sizeof(double));
  float yv[N * M], dxv[N * K];
  int bad = 0, raw_off = 0;
  for (int n = 0; n < N; n++) /* y */
    for (int m = 0; m < M; m++) {
      double s = b[m], a = fabs(b[m]), r = b[m];
      for (int k = 0; k < K; k++) {
        double p = (double)ct_bf16_round(x[n * LDX + k]) * ct_bf16_round(w[m * K + k]);
        s += p, a += fabs(p), r += (double)x[n * LDX + k] * w[m * K + k];
      }
      ref[n * M + m] = s, mag[n * M + m] = a, raw[n * M + m] = r, yv[n * M + m] = y[n * LDY + m];
    }
  bad += lin_cmp("y", yv, ref, mag, raw, N * M, K, &raw_off);
  for (int n = 0; n < N; n++) /* dx */
    for (int k = 0; k < K; k++) {
      double s = 0, a = 0, r = 0;
      for (int m = 0; m < M; m++) {
        double p = (double)ct_bf16_round(dy[n * LDY + m]) * ct_bf16_round(w[m * K + k]);
        s += p, a += fabs(p), r += (double)dy[n * LDY + m] * w[m * K + k];
      }
      ref[n * K + k] = s, mag[n * K + k] = a, raw[n * K + k] = r, dxv[n * K + k] = dx[n * LDX + k];
    }
  bad += lin_cmp("dx", dxv, ref, mag, raw, N * K, M, &raw_off);
  for (int m = 0; m < M; m++) /* dw: accumulated onto its old value */
    for (int k = 0; k < K; k++) {
      double s = dw0[m * K + k], a = fabs(dw0[m * K + k]), r = s;
      for (int n = 0; n < N; n++) {
        double p = (double)ct_bf16_round(dy[n * LDY + m]) * ct_bf16_round(x[n * LDX + k]);
        s += p, a += fabs(p), r += (double)dy[n * LDY + m] * x[n * LDX + k];
      }
      ref[m * K + k] = s, mag[m * K + k] = a, raw[m * K + k] = r;
    }
  bad += lin_cmp("dw", dw, ref, mag, raw, M * K, N, &raw_off);
  for (int m = 0; m < M; m++) { /* db: float32 data, unrounded */
    double s = db0[m], a = fabs(db0[m]);
    for (int n = 0; n < N; n++) s += dy[n * LDY + m], a += fabs(dy[n * LDY + m]);
    ref[m] = s, mag[m] = a;
  }
  bad += lin_cmp("db", db, ref, mag, NULL, M, N, &raw_off);
  CHECKF(bad == 0, "%d elements off the rounded-operand reference", bad);
  CHECKF(raw_off > (N * M + N * K + M * K) / 2,
         "only %d elements differ from the unrounded reference: are the operands rounded?",
         raw_off);
  free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db), free(dw0);
  free(ref), free(mag), free(raw);
}

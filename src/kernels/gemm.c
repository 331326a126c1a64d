/* ct_sgemm dispatch: our AVX-512 kernel when the CPU has it, our AVX2 kernel
 * when it has AVX2 and FMA, OpenBLAS otherwise; and the per-thread packing
 * buffers both kernels use.
 *
 * The choice is made once per process: __builtin_cpu_supports and the
 * environment variable CT_GEMM ("blas" forces OpenBLAS, for comparisons;
 * "avx2" the AVX2 kernel where the CPU has it; any other value or none means
 * "best available"). The AVX2 and AVX-512 kernels give the same bits
 * (gemm_driver.h), so the choice changes speed only. Degenerate shapes (K == 0 or
 * alpha == 0) are handled here so both paths give C = beta * C with the BLAS
 * rule that beta == 0 writes zeros without reading C.
 * ct_sgemm_deterministic keeps that thread-count independence on the OpenBLAS
 * path too, at some speed: fixed blocks of GEMM_ROWS rows of C, one
 * single-threaded cblas_sgemm each (OpenBLAS's OpenMP build does not thread
 * inside a parallel region). Letting OpenBLAS split the whole product gives
 * results that change with the thread count; fixed blocks do not.
 * ct_sgemm_bf16 (operands rounded to bf16, float32 sums) dispatches to
 * gemm_bf16.c where the CPU has AVX512-BF16, else rounds copies of the
 * operands for ct_sgemm.
 * Not here: the blocking (gemm_driver.h) and the micro-kernels
 * (gemm_avx512.c, gemm_avx2.c, gemm_bf16.c).
 */
#include "gemm.h"

#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

enum { PATH_UNSET = 0, PATH_AVX512 = 1, PATH_AVX2 = 2, PATH_BLAS = 3, PATH_BF16 = 4 };

static int cpu_has(int path) {
  __builtin_cpu_init();
  if (path == PATH_AVX512) return __builtin_cpu_supports("avx512f");
  if (path == PATH_AVX2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (path == PATH_BF16)
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
  return path == PATH_BLAS;
}

static int path_decide(void) {
  const char *env = getenv("CT_GEMM");
  if (env && !strcmp(env, "blas")) return PATH_BLAS;
  if (env && !strcmp(env, "avx2") && cpu_has(PATH_AVX2)) return PATH_AVX2;
  return cpu_has(PATH_AVX512) ? PATH_AVX512 : cpu_has(PATH_AVX2) ? PATH_AVX2 : PATH_BLAS;
}

/* Decided on first use; a race only computes the same answer twice. */
static int path_get(void) {
  static int path = PATH_UNSET;
  int p = __atomic_load_n(&path, __ATOMIC_RELAXED);
  if (p == PATH_UNSET) {
    p = path_decide();
    __atomic_store_n(&path, p, __ATOMIC_RELAXED);
  }
  return p;
}

static const char *const path_names[] = {"", "avx512", "avx2", "blas", "bf16"};

const char *ct_sgemm_path(void) {
  return path_names[path_get()];
}

static void blas_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                       int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
              M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void bf16_by_copies(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                           int lda, const float *B, int ldb, float beta, float *C, int ldc);

ct_sgemm_fn ct_sgemm_path_fn(const char *name) {
  if (name && !strcmp(name, "bf16_copies")) return bf16_by_copies;
  static const ct_sgemm_fn fns[] = {NULL, ct_sgemm_avx512, ct_sgemm_avx2, blas_sgemm,
                                    ct_sgemm_bf16_avx512};
  for (int p = PATH_AVX512; p <= PATH_BF16; p++)
    if (name && !strcmp(name, path_names[p])) return cpu_has(p) ? fns[p] : NULL;
  return NULL;
}

/* C = beta * C; beta == 0 writes zeros (never multiplies a NaN). */
static void scale_c(int M, int N, float beta, float *C, int ldc) {
  for (int i = 0; i < M; i++) {
    float *c = C + (size_t)i * ldc;
    if (beta == 0.0f)
      memset(c, 0, (size_t)N * sizeof(float));
    else if (beta != 1.0f)
      for (int j = 0; j < N; j++) c[j] *= beta;
  }
}

void ct_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || alpha == 0.0f) {
    scale_c(M, N, beta, C, ldc);
    return;
  }
  int p = path_get();
  if (p == PATH_AVX512)
    ct_sgemm_avx512(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else if (p == PATH_AVX2)
    ct_sgemm_avx2(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    blas_sgemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ------------------------------------------------- weight views */

/* OpenBLAS has no such operand: blocks of WV_ROWS stored rows of the weight
 * are dequantised into a buffer and multiplied there (the forward's column
 * blocks of C, or the dX product's K blocks accumulated with beta 1). */
#define WV_ROWS 64

void ct_sgemm_blas_w(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                     int lda, const ct_wview *B, int ldb, float beta, float *C, int ldc) {
  const int rows = transB ? N : K, cols = transB ? K : N;
  float *t = ct_gemm_packbuf(2, (size_t)WV_ROWS * (size_t)cols);
  for (int r0 = 0; r0 < rows; r0 += WV_ROWS) {
    const int nr = rows - r0 < WV_ROWS ? rows - r0 : WV_ROWS;
    for (int r = 0; r < nr; r++)
      for (int c = 0; c < cols; c++) t[(size_t)r * cols + c] = ct_wview_at(*B, ldb, r0 + r, c);
    if (transB) /* C[:, r0:r0+nr] = op(A) t^T */
      blas_sgemm(transA, 1, M, nr, K, alpha, A, lda, t, cols, beta, C + r0, ldc);
    else /* C += op(A)[:, r0:r0+nr] t */
      blas_sgemm(transA, 0, M, N, nr, alpha, transA ? A + (size_t)r0 * lda : A + r0, lda, t, cols,
                 r0 ? 1.0f : beta, C, ldc);
  }
}

ct_sgemm_w_fn ct_sgemm_w_path_fn(const char *name) {
  if (!name) return NULL;
  if (!strcmp(name, "avx512")) return cpu_has(PATH_AVX512) ? ct_sgemm_avx512_w : NULL;
  if (!strcmp(name, "avx2")) return cpu_has(PATH_AVX2) ? ct_sgemm_avx2_w : NULL;
  if (!strcmp(name, "bf16")) return cpu_has(PATH_BF16) ? ct_sgemm_bf16_avx512_w : NULL;
  if (!strcmp(name, "blas")) return ct_sgemm_blas_w;
  return NULL;
}

void ct_sgemm_w(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                const ct_wview *B, int ldb, float beta, float *C, int ldc) {
  if (B->dtype == CT_WDT_F32) {
    ct_sgemm(transA, transB, M, N, K, alpha, A, lda, B->data, ldb, beta, C, ldc);
    return;
  }
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || alpha == 0.0f) {
    scale_c(M, N, beta, C, ldc);
    return;
  }
  int p = path_get();
  if (p == PATH_AVX512)
    ct_sgemm_avx512_w(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else if (p == PATH_AVX2)
    ct_sgemm_avx2_w(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    ct_sgemm_blas_w(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ------------------------------------------------- bf16 operands */

int ct_sgemm_bf16_available(void) {
  return cpu_has(PATH_BF16);
}

static _Noreturn void oom(size_t bytes);

float ct_bf16_round(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu))
    u = (u | 0x00400000u) & 0xFFFF0000u; /* NaN stays a (quiet) NaN */
  else
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u; /* nearest, ties to even */
  memcpy(&x, &u, sizeof x);
  return x;
}

/* x rounded to bf16 as the kernel's vcvtne2ps2bf16 does: float32 denormals
 * are read as zero (sign kept), everything else as ct_bf16_round. */
static float bf16_daz(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if (!(u & 0x7F800000u)) return (u >> 31) ? -0.0f : 0.0f;
  return ct_bf16_round(x);
}

/* Whether ct_sgemm_bf16 takes the kernel: the CPU has it and CT_GEMM does
 * not ask for an older machine ("avx2", "blas", or "nobf16": the AVX-512
 * float32 kernel with the bf16 products by copies). */
static int bf16_kernel_used(void) {
  static int use = -1;
  int u = __atomic_load_n(&use, __ATOMIC_RELAXED);
  if (u < 0) {
    const char *env = getenv("CT_GEMM");
    u = cpu_has(PATH_BF16) &&
        !(env && (!strcmp(env, "avx2") || !strcmp(env, "blas") || !strcmp(env, "nobf16")));
    __atomic_store_n(&use, u, __ATOMIC_RELAXED);
  }
  return u;
}

void ct_sgemm_bf16(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || alpha == 0.0f) {
    scale_c(M, N, beta, C, ldc);
    return;
  }
  if (bf16_kernel_used())
    ct_sgemm_bf16_avx512(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    bf16_by_copies(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

const char *ct_sgemm_bf16_path(void) {
  return bf16_kernel_used() ? "bf16" : "bf16_copies";
}

/* No AVX512-BF16: the kernel's arithmetic by ct_sgemm on rounded copies, to
 * the bit where our float32 kernels run (not on OpenBLAS). The kernel sums K
 * in the blocks of gemm_driver.h's plan (nkb = ceil(K / 512) blocks of
 * ceil(K / nkb), the last shorter), each from zero, then C = alpha*acc +
 * (first ? beta*C : C); within a block, per pair of k, vdpbf16ps does
 * acc += a[2p+1]*b[2p+1] then acc += a[2p]*b[2p], each rounded (products of
 * bf16 are exact), an odd block's last pair padded with zeros. So per block:
 * copies of op(A) (M x kp) and op(B) (kp x N) with k and k^1 swapped and a
 * zero column/row padding an odd block, and one ct_sgemm (one K block, FMAs in
 * k order) with beta for the first block and 1 after. Differences remain only
 * where vdpbf16ps flushes a denormal partial sum to zero (|sum| < 2^-126). */
static void bf16_by_copies(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                           int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  int nkb = (K + 511) / 512, kc = (K + nkb - 1) / nkb;
  size_t kmax = (size_t)kc + 1;
  size_t abytes = (size_t)M * kmax * sizeof(float), bbytes = kmax * (size_t)N * sizeof(float);
  float *a = malloc(abytes), *b = malloc(bbytes);
  if (!a) oom(abytes);
  if (!b) oom(bbytes);
  for (int pc = 0; pc < K; pc += kc) {
    int kb = K - pc < kc ? K - pc : kc, kp = kb + (kb & 1);
    for (int i = 0; i < M; i++)
      for (int k = 0; k < kp; k++) {
        int src = k ^ 1; /* the pair's partner; past kb: the zero pad */
        float v = 0.0f;
        if (src < kb) v = transA ? A[(size_t)(pc + src) * lda + i] : A[(size_t)i * lda + pc + src];
        a[(size_t)i * kp + k] = bf16_daz(v);
      }
    for (int k = 0; k < kp; k++) {
      int src = k ^ 1;
      for (int j = 0; j < N; j++) {
        float v = 0.0f;
        if (src < kb) v = transB ? B[(size_t)j * ldb + pc + src] : B[(size_t)(pc + src) * ldb + j];
        b[(size_t)k * N + j] = bf16_daz(v);
      }
    }
    ct_sgemm(0, 0, M, N, kp, alpha, a, kp, b, N, pc == 0 ? beta : 1.0f, C, ldc);
  }
  free(a);
  free(b);
}

#define GEMM_ROWS 64

void ct_sgemm_deterministic(int transA, int transB, int M, int N, int K, float alpha,
                            const float *A, int lda, const float *B, int ldb, float beta, float *C,
                            int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || alpha == 0.0f) {
    scale_c(M, N, beta, C, ldc);
    return;
  }
  if (path_get() != PATH_BLAS) { /* thread-count deterministic by construction */
    ct_sgemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const int nb = (M + GEMM_ROWS - 1) / GEMM_ROWS;
#pragma omp parallel for schedule(static) if (nb > 1)
  for (int blk = 0; blk < nb; blk++) {
    int r0 = blk * GEMM_ROWS, rows = M - r0 < GEMM_ROWS ? M - r0 : GEMM_ROWS;
    /* rows [r0, r0 + rows) of op(A): stored rows, or stored columns when transposed */
    const float *a = transA ? A + r0 : A + (size_t)r0 * (size_t)lda;
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
                transB ? CblasTrans : CblasNoTrans, rows, N, K, alpha, a, lda, B, ldb, beta,
                C + (size_t)r0 * (size_t)ldc, ldc);
  }
}

/* ------------------------------------------------- packing buffers */

/* Per-thread packing buffers, grown on demand and kept for the thread's life:
 * GEMMs are called thousands of times per step, so no malloc per call. They
 * hang off a thread-specific key whose destructor frees them when a thread
 * ends (OpenMP shrinks its pool when the thread count drops). */
typedef struct {
  float *buf[3];
  size_t cap[3]; /* in floats */
} packbufs;

static tss_t bufs_key;
static once_flag bufs_once = ONCE_FLAG_INIT;

static void bufs_free(void *p) {
  packbufs *b = p;
  if (!b) return;
  for (int i = 0; i < 3; i++) free(b->buf[i]);
  free(b);
}

static void bufs_key_init(void) {
  if (tss_create(&bufs_key, bufs_free) != thrd_success) {
    fprintf(stderr, "ctuner: cannot create the GEMM buffers' thread-specific key\n");
    abort();
  }
}

static _Noreturn void oom(size_t bytes) {
  fprintf(stderr, "ctuner: out of memory allocating %zu bytes for a GEMM packing buffer\n", bytes);
  abort();
}

float *ct_gemm_packbuf(int which, size_t nfloat) {
  call_once(&bufs_once, bufs_key_init);
  packbufs *b = tss_get(bufs_key);
  if (!b) {
    if (!(b = calloc(1, sizeof *b))) oom(sizeof *b);
    tss_set(bufs_key, b);
  }
  if (nfloat > b->cap[which]) {
    free(b->buf[which]);
    size_t bytes = (nfloat * sizeof(float) + 63) & ~(size_t)63;
    if (!(b->buf[which] = aligned_alloc(64, bytes))) oom(bytes);
    b->cap[which] = nfloat;
  }
  return b->buf[which];
}

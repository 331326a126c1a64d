/* Linear layer y = x w^T + b with w in PyTorch layout [out, in].
 *
 * Design: all the arithmetic is in ct_sgemm (our AVX-512 or AVX2 SGEMM, gemm.h, or
 * OpenBLAS where that is unavailable); it is OpenMP-parallel over blocks of the
 * output and deterministic across thread counts. The forward copies the bias into every row of y
 * and lets one SGEMM accumulate onto it (beta = 1), which saves a second pass over y. The backward
 * is one SGEMM for dx, one for dw (beta = 1: accumulate), and a column sum for db that is parallel
 * over fixed column blocks, each summing its rows in order, so db does not depend on the thread
 * count. Not here: any knowledge of which layer this is or where its weights live.
 */
#include <string.h>

#include "ctuner/kernels.h"
#include "gemm.h"

#define COLBLK 64 /* columns per task in the bias-gradient column sum */

/* y's rows start as the bias (the product then adds with beta 1), or as 0
 * when there is no product (K 0); returns the product's beta. */
static float bias_rows(int N, int K, int M, const float *b, float *y, int ldy) {
  if (b) {
#pragma omp parallel for schedule(static) if ((size_t)N * M > 16384)
    for (int r = 0; r < N; r++) memcpy(y + (size_t)r * ldy, b, (size_t)M * sizeof(float));
    return 1.0f;
  }
  if (K <= 0)
    for (int r = 0; r < N; r++) memset(y + (size_t)r * ldy, 0, (size_t)M * sizeof(float));
  return 0.0f;
}

/* The layer with the matrix products of mm: ct_sgemm, or ct_sgemm_bf16 (the
 * bf16 compute of --mixed_precision bf16; the bias and its gradient stay
 * float32). */
static void lin_fwd(ct_sgemm_fn mm, int N, int K, int M, const float *x, int ldx, const float *w,
                    const float *b, float *y, int ldy) {
  if (N <= 0 || M <= 0) return;
  const float beta = bias_rows(N, K, M, b, y, ldy);
  if (K <= 0) return;
  mm(0, 1, N, M, K, 1.0f, x, ldx, w, K, beta, y, ldy);
}

/* db[j] += sum_r dy[r][j], rows summed in order for every column, in double:
 * a bias gradient sums many terms of both signs (B x L rows), and a float sum's
 * rounding would make a batch split over ranks or micro-batches differ from the
 * whole batch far more than the final rounding does. */
static void colsum_acc(int N, int M, const float *dy, int lddy, float *db) {
  int nblk = (M + COLBLK - 1) / COLBLK;
#pragma omp parallel for schedule(static) if ((size_t)N * M > 16384)
  for (int blk = 0; blk < nblk; blk++) {
    int c0 = blk * COLBLK, nc = M - c0 < COLBLK ? M - c0 : COLBLK;
    double acc[COLBLK] = {0};
    for (int r = 0; r < N; r++) {
      const float *row = dy + (size_t)r * lddy + c0;
      for (int j = 0; j < nc; j++) acc[j] += (double)row[j];
    }
    for (int j = 0; j < nc; j++) db[c0 + j] = (float)((double)db[c0 + j] + acc[j]);
  }
}

static void lin_bwd(ct_sgemm_fn mm, int N, int K, int M, const float *x, int ldx, const float *w,
                    const float *dy, int lddy, float *dx, int lddx, float beta_dx, float *dw,
                    float *db) {
  if (N <= 0 || M <= 0) return;
  if (dx && K > 0) mm(0, 0, N, K, M, 1.0f, dy, lddy, w, K, beta_dx, dx, lddx);
  if (dw && K > 0) mm(1, 0, M, K, N, 1.0f, dy, lddy, x, ldx, 1.0f, dw, K);
  if (db) colsum_acc(N, M, dy, lddy, db);
}

void ct_linear_fwd(int N, int K, int M, const float *x, int ldx, const float *w, const float *b,
                   float *y, int ldy) {
  lin_fwd(ct_sgemm, N, K, M, x, ldx, w, b, y, ldy);
}

void ct_linear_bwd(int N, int K, int M, const float *x, int ldx, const float *w, const float *dy,
                   int lddy, float *dx, int lddx, float beta_dx, float *dw, float *db) {
  lin_bwd(ct_sgemm, N, K, M, x, ldx, w, dy, lddy, dx, lddx, beta_dx, dw, db);
}

void ct_linear_fwd_bf16(int N, int K, int M, const float *x, int ldx, const float *w,
                        const float *b, float *y, int ldy) {
  lin_fwd(ct_sgemm_bf16, N, K, M, x, ldx, w, b, y, ldy);
}

void ct_linear_bwd_bf16(int N, int K, int M, const float *x, int ldx, const float *w,
                        const float *dy, int lddy, float *dx, int lddx, float beta_dx, float *dw,
                        float *db) {
  lin_bwd(ct_sgemm_bf16, N, K, M, x, ldx, w, dy, lddy, dx, lddx, beta_dx, dw, db);
}

/* The same over a weight view (ct_sgemm_w dequantises its tiles while packing). */
void ct_linear_fwd_w(int N, int K, int M, const float *x, int ldx, const ct_wview *w,
                     const float *b, float *y, int ldy) {
  if (w->dtype == CT_WDT_F32) {
    ct_linear_fwd(N, K, M, x, ldx, w->data, b, y, ldy);
    return;
  }
  if (N <= 0 || M <= 0) return;
  const float beta = bias_rows(N, K, M, b, y, ldy);
  if (K <= 0) return;
  ct_sgemm_w(0, 1, N, M, K, 1.0f, x, ldx, w, K, beta, y, ldy);
}

void ct_linear_bwd_w(int N, int K, int M, const float *x, int ldx, const ct_wview *w,
                     const float *dy, int lddy, float *dx, int lddx, float beta_dx, float *dw,
                     float *db) {
  if (w->dtype == CT_WDT_F32) {
    ct_linear_bwd(N, K, M, x, ldx, w->data, dy, lddy, dx, lddx, beta_dx, dw, db);
    return;
  }
  if (N <= 0 || M <= 0) return;
  if (dx && K > 0) ct_sgemm_w(0, 0, N, K, M, 1.0f, dy, lddy, w, K, beta_dx, dx, lddx);
  /* a bf16 / int8 weight is frozen: no dw */
  if (db) colsum_acc(N, M, dy, lddy, db);
}

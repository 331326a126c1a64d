/* The blocking driver shared by the SGEMM kernels (private; a template):
 * gemm_avx512.c, gemm_avx2.c and gemm_bf16.c (whose packing rounds to bf16
 * pairs; its bits are its own) each define their register tile, packing,
 * micro-kernel (and imin, cdiv), then include this file, which adds the loops
 * over column, K and row blocks, the threading and the entry point. Both paths therefore block,
 * split work between threads and order every element's sums the same way (docs/gemm.md).
 *
 * Before including, define:
 *   GEMM_ISA    the function attribute selecting the instruction set
 *   MR, NR      the register tile (rows of C, columns of C)
 *   GEMM_KC, GEMM_MC, GEMM_NC   the cache blocks (upper bounds)
 *   GEMM_ENTRY  the name of the entry point (ct_sgemm_avx512, ...)
 *   GEMM_ENTRY_W (optional) the entry point whose B is a ct_wview (bf16 or
 *               int8 weights, dequantised tile by tile while packing)
 * and the functions ukernel, pack_a, pack_b_rows, pack_bt_panel with the
 * signatures and contracts gemm_avx512.c documents.
 *
 * Determinism: the K blocks depend only on K (and GEMM_KC, which every path
 * keeps at 512), and each element of C is computed as acc = sum_k a*b (FMA, k
 * ascending within a block), then C = alpha*acc + (first block ? beta*C : C) —
 * the same operations whichever thread or tile handles it, so results do not
 * depend on the thread count, nor on the path: the AVX2 and AVX-512 kernels
 * give the same bits.
 */
#ifndef GEMM_ENTRY
#error "gemm_driver.h is a template: define GEMM_ENTRY and the kernel first"
#endif
#include <stdint.h>
#include <string.h>
/* Below this many multiply-adds a call runs on one thread. */
#define GEMM_SERIAL_FMAS (1 << 18)

typedef struct {
  int tA, tB, M, N, K;
  const float *A, *B;
  const ct_wview *wb; /* B as a bf16 / int8 weight view (ct_sgemm_w), else NULL */
  int lda, ldb, ldc;
  float alpha, beta;
  float *C;
  float *bp;      /* shared packed B block, KC_MAX x round_up(NC_MAX, NR) */
  int kc, nc, mc; /* block sizes (K blocks: depend on K only) */
  int nic, ngrp;  /* row blocks, column groups per column block */
} job;

/* ---- B from a weight view (ct_sgemm_w): dequantised while packing ----
 * The stored rows of a bf16 or int8 weight are widened to float32 (bf16: the
 * 16 bits shifted up, exact; int8: (float)q * scale[row], one rounding) into a
 * small per-thread buffer, a tile at a time, and packed from there by the
 * float32 packing: the panels equal those of the dequantised float32 matrix,
 * so the product has its bits (and the thread-count independence), with no
 * float32 copy of the whole weight. */
GEMM_ISA static void wrow(const ct_wview *w, int ld, int r, int c0, int n, float *restrict dst) {
  if (w->dtype == CT_WDT_BF16) {
    const uint16_t *s = (const uint16_t *)w->data + (size_t)r * ld + c0;
    for (int i = 0; i < n; i++) {
      uint32_t u = (uint32_t)s[i] << 16;
      memcpy(dst + i, &u, 4);
    }
  } else {
    const int8_t *s = (const int8_t *)w->data + (size_t)r * ld + c0;
    const float sc = w->scales[r];
    for (int i = 0; i < n; i++) dst[i] = (float)s[i] * sc;
  }
}

/* pack_bt_panel's job for B = the view (forward x W^T): stored rows j0..j0+nr. */
GEMM_ISA static void pack_bt_panel_any(const job *g, int k0, int kc, int j0, int nr, float *dst) {
  if (!g->wb) {
    pack_bt_panel(g->B, g->ldb, k0, kc, j0, nr, dst);
    return;
  }
  float *t = ct_gemm_packbuf(2, (size_t)NR * kc);
  for (int j = 0; j < nr; j++) wrow(g->wb, g->ldb, j0 + j, k0, kc, t + (size_t)j * kc);
  pack_bt_panel(t, kc, 0, kc, 0, nr, dst);
}

/* pack_b_rows' job for B = the view (dX = dy W): one stored row at a time. */
GEMM_ISA static void pack_b_rows_any(const job *g, int k0, int ka, int kb, int kc, int j0, int nc,
                                     float *restrict bp) {
  if (!g->wb) {
    pack_b_rows(g->B, g->ldb, k0, ka, kb, kc, j0, nc, bp);
    return;
  }
  float *t = ct_gemm_packbuf(2, (size_t)nc + 16);
  for (int k = ka; k < kb; k++) {
    wrow(g->wb, g->ldb, k0 + k, j0, nc, t);
    pack_b_rows(t, 0, 0, k, k + 1, kc, 0, nc, bp); /* ldb 0: row k is t */
  }
}

/* Tiles of one task: rows [ic, ic+mc) against B panels [q0, q1). */
GEMM_ISA static void task_tiles(const job *g, const float *ap, int ic, int mc, int jc, int nc,
                                int q0, int q1, int kc, int first) {
  for (int q = q0; q < q1; q++) {
    int nr = imin(NR, nc - q * NR);
    const float *bq = g->bp + (size_t)q * kc * NR;
    float *cq = g->C + (size_t)ic * g->ldc + jc + q * NR;
    for (int p = 0; p < mc; p += MR)
      ukernel(kc, ap + (size_t)p * kc, bq, cq + (size_t)p * g->ldc, g->ldc, imin(MR, mc - p), nr,
              g->alpha, g->beta, first);
  }
}

/* Few rows (one row block): each thread takes a contiguous range of B panels,
 * packs them itself right before use and needs no barrier. Sharing one packed
 * B block would cost a barrier per K block and move every panel between
 * cores, and for so few rows packing B is most of the work. */
GEMM_ISA static void run_narrow(const job *g, int tid, int nth) {
  int npan = cdiv(g->N, NR), q0 = npan * tid / nth, q1 = npan * (tid + 1) / nth;
  if (q0 >= q1) return;
  int j0 = q0 * NR, ncols = imin(q1 * NR, g->N) - j0;
  float *ap = ct_gemm_packbuf(0, (size_t)g->mc * g->kc + 16);
  float *bp = ct_gemm_packbuf(1, (size_t)g->kc * (q1 - q0) * NR);
  for (int pc = 0; pc < g->K; pc += g->kc) {
    int kc = imin(g->kc, g->K - pc);
    pack_a(g->tA, g->A, g->lda, 0, pc, g->M, kc, ap);
    if (g->tB)
      for (int q = q0; q < q1; q++)
        pack_bt_panel_any(g, pc, kc, q * NR, imin(NR, g->N - q * NR),
                          bp + (size_t)(q - q0) * kc * NR);
    else /* whole row segments of this thread's columns: one memory stream */
      pack_b_rows_any(g, pc, 0, kc, kc, j0, ncols, bp);
    for (int q = q0; q < q1; q++) {
      int jq = q * NR, nr = imin(NR, g->N - jq);
      for (int p = 0; p < g->M; p += MR)
        ukernel(kc, ap + (size_t)p * kc, bp + (size_t)(q - q0) * kc * NR,
                g->C + (size_t)p * g->ldc + jq, g->ldc, imin(MR, g->M - p), nr, g->alpha, g->beta,
                pc == 0);
    }
  }
}

/* One thread's share; called by every thread of the team. */
GEMM_ISA static void run(const job *g) {
  int tid = omp_get_thread_num(), nth = omp_get_num_threads();
  if (g->nic == 1) {
    run_narrow(g, tid, nth);
    return;
  }
  float *ap = ct_gemm_packbuf(0, (size_t)g->mc * g->kc + 16);
  for (int jc = 0; jc < g->N; jc += g->nc) {
    int nc = imin(g->nc, g->N - jc), npan = cdiv(nc, NR);
    for (int pc = 0; pc < g->K; pc += g->kc) {
      int kc = imin(g->kc, g->K - pc), first = pc == 0;
      if (g->tB) /* threads take panels: each reads whole stored rows */
        for (int q = tid; q < npan; q += nth)
          pack_bt_panel_any(g, pc, kc, jc + q * NR, imin(NR, nc - q * NR),
                            g->bp + (size_t)q * kc * NR);
      else /* threads take contiguous row ranges */
        pack_b_rows_any(g, pc, kc * tid / nth, kc * (tid + 1) / nth, kc, jc, nc, g->bp);
#pragma omp barrier
      int packed = -1; /* row block currently in ap */
#pragma omp for schedule(dynamic, 1)
      for (int t = 0; t < g->nic * g->ngrp; t++) {
        int ib = t / g->ngrp, grp = t % g->ngrp;
        int ic = ib * g->mc, mc = imin(g->mc, g->M - ic);
        if (packed != ib) {
          pack_a(g->tA, g->A, g->lda, ic, pc, mc, kc, ap);
          packed = ib;
        }
        task_tiles(g, ap, ic, mc, jc, nc, grp * npan / g->ngrp, (grp + 1) * npan / g->ngrp, kc,
                   first);
      }
      /* the implicit barrier keeps bp until every task of this block is done */
    }
  }
}

/* One thread and no OpenMP construct at all: the calls attention makes per
 * tile from inside its own parallel region, and every small product, skip
 * opening a team. The same blocks, tiles and operations as run() on one
 * thread, so the same bits. */
GEMM_ISA static void run_serial(const job *g) {
  if (g->nic == 1) {
    run_narrow(g, 0, 1);
    return;
  }
  float *ap = ct_gemm_packbuf(0, (size_t)g->mc * g->kc + 16);
  for (int jc = 0; jc < g->N; jc += g->nc) {
    int nc = imin(g->nc, g->N - jc), npan = cdiv(nc, NR);
    for (int pc = 0; pc < g->K; pc += g->kc) {
      int kc = imin(g->kc, g->K - pc);
      if (g->tB)
        for (int q = 0; q < npan; q++)
          pack_bt_panel_any(g, pc, kc, jc + q * NR, imin(NR, nc - q * NR),
                            g->bp + (size_t)q * kc * NR);
      else
        pack_b_rows_any(g, pc, 0, kc, kc, jc, nc, g->bp);
      for (int ib = 0; ib < g->nic; ib++) {
        int ic = ib * g->mc, mc = imin(g->mc, g->M - ic);
        pack_a(g->tA, g->A, g->lda, ic, pc, mc, kc, ap);
        task_tiles(g, ap, ic, mc, jc, nc, 0, npan, kc, pc == 0);
      }
    }
  }
}

/* Block sizes: K blocks depend on K alone (determinism); row blocks are a
 * multiple of the thread count when possible so the tasks balance. */
static void plan(job *g, int nth) {
  int nkb = cdiv(g->K, GEMM_KC);
  g->kc = cdiv(g->K, nkb);
  int nnb = cdiv(g->N, GEMM_NC);
  g->nc = cdiv(cdiv(g->N, nnb), NR) * NR;
  int nic = cdiv(g->M, GEMM_MC);
  if (nth > 1 && nic % nth) nic += nth - nic % nth;
  g->mc = cdiv(cdiv(g->M, nic), MR) * MR;
  g->nic = cdiv(g->M, g->mc);
  int npan = cdiv(g->nc, NR), want = 2 * nth;
  g->ngrp = g->nic >= want ? 1 : imin(npan, cdiv(want, g->nic));
}

static void gemm_go(job *g) {
  int nth = omp_in_parallel() ? 1 : omp_get_max_threads();
  if ((double)g->M * g->N * g->K < GEMM_SERIAL_FMAS) nth = 1;
  plan(g, nth);
  if (g->nic > 1) g->bp = ct_gemm_packbuf(1, (size_t)g->kc * cdiv(g->nc, NR) * NR);
  if (nth == 1) {
    run_serial(g);
    return;
  }
  /* Open our own region: the work-sharing inside run() must bind to our
   * team, not to a caller's enclosing one. */
#pragma omp parallel num_threads(nth)
  run(g);
}

void GEMM_ENTRY(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc) {
  job g = {transA, transB, M, N, K, A, B, NULL, lda, ldb, ldc, alpha, beta, C, NULL, 0, 0, 0, 0, 0};
  gemm_go(&g);
}

#ifdef GEMM_ENTRY_W
/* B a bf16 or int8 weight view (stored row-major, leading dimension ldb). */
void GEMM_ENTRY_W(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                  const ct_wview *B, int ldb, float beta, float *C, int ldc) {
  job g = {transA, transB, M, N, K, A, NULL, B, lda, ldb, ldc, alpha, beta, C, NULL, 0, 0, 0, 0, 0};
  gemm_go(&g);
}
#endif

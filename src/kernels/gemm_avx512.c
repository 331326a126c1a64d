/* AVX-512 SGEMM: GotoBLAS/BLIS-style blocking around a register-tile kernel.
 *
 * C (M x N) is computed in column blocks of up to NC_MAX, and K in blocks of
 * about KC_MAX. For each (column block, K block) op(B) is packed once into
 * NR-wide panels (k-major, NR floats per k) shared by all threads; each task
 * then packs an MC-row block of op(A) into MR-row panels (MR floats per k) in a
 * thread-local buffer and sweeps the micro-kernel over its MR x NR tiles. The
 * micro-kernel keeps an MR x NR tile of C in zmm registers, broadcasting one
 * A value per row and loading NR/16 vectors of B per k; edges use zero-padded
 * panels and masked loads/stores of C.
 *
 * Determinism: the K blocks depend only on K, and each element of C is
 * computed as acc = sum_k a*b (FMA, k ascending within a block), then
 * C = alpha*acc + (first block ? beta*C : C) — the same operations whichever
 * thread or tile handles it, so results do not depend on the thread count.
 * Threads split only (row block, column group) tasks of one K block. The
 * loops over blocks and threads are gemm_driver.h, shared with the AVX2 path
 * (gemm_avx2.c), which computes the same bits.
 * Every function carries the AVX-512 target attribute so the library builds
 * without -march flags; gemm.c calls in here only after a CPU check.
 * Not here: dispatch, degenerate shapes, packing buffers (gemm.c); the
 * block loops (gemm_driver.h); the tile, blocks and packing
 * (gemm_avx512_pack.h, shared with the bf16 kernel gemm_bf16.c).
 */
#include <immintrin.h>
#include <omp.h>

#include "gemm.h"
#include "gemm_avx512_pack.h"

/* ----------------------------------------------------------- micro-kernel */

/* C[0:mr, 0:nr] = alpha * (a-panel . b-panel) + (first ? beta * C : C), with
 * beta == 0 on the first block never reading C. a: kc x MR, b: kc x NR. */
AVX512 static void ukernel(int kc, const float *restrict a, const float *restrict b,
                           float *restrict c, int ldc, int mr, int nr, float alpha, float beta,
                           int first) {
  __m512 acc[MR][NV];
#pragma GCC unroll 32
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();
  /* C is read after the k loop; fetch its lines now so that the loads at the
   * end do not stall (C usually comes from memory, once per K block). */
  for (int i = 0; i < mr; i++)
    for (int v = 0; v < NR; v += 16)
      _mm_prefetch((const char *)(c + (size_t)i * ldc + v), _MM_HINT_T0);
#pragma GCC unroll 2
  for (int k = 0; k < kc; k++, a += MR, b += NR) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) bv[v] = _mm512_load_ps(b + 16 * v);
#pragma GCC unroll 32
    for (int i = 0; i < MR; i++) {
      __m512 ai = _mm512_set1_ps(a[i]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  __mmask16 m[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; v++) m[v] = lanes(nr - 16 * v);
  int skip_c = first && beta == 0.0f, scale_c = first && beta != 1.0f;
#pragma GCC unroll 32
  for (int i = 0; i < MR; i++) {
    if (i >= mr) break;
    float *ci = c + (size_t)i * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
      __m512 old = _mm512_setzero_ps();
      if (!skip_c) old = _mm512_maskz_loadu_ps(m[v], ci + 16 * v);
      if (scale_c && !skip_c) old = _mm512_mul_ps(vb, old);
      _mm512_mask_storeu_ps(ci + 16 * v, m[v], _mm512_fmadd_ps(va, acc[i][v], old));
    }
  }
}

/* ----------------------------------------------------------------- driver */

#define GEMM_ISA AVX512
#define GEMM_ENTRY ct_sgemm_avx512
#define GEMM_ENTRY_W ct_sgemm_avx512_w
#include "gemm_driver.h"

/* AVX512-BF16 GEMM: C = alpha * op(A) op(B) + beta * C on float32 matrices,
 * with the operands rounded to bf16 and the products summed in float32
 * (vdpbf16ps), for --mixed_precision bf16 (docs/gemm.md).
 *
 * The same blocking, threading and tile as the float32 AVX-512 kernel
 * (gemm_driver.h, gemm_avx512_pack.h: 8 x 48 tile, KC <= 512): A and B are
 * packed into the same panels, then each pair of consecutive k of a panel is
 * rounded to bf16 (round to nearest even, as torch casts; NaN stays NaN) and
 * interleaved into one 32-bit word per row or column, the layout vdpbf16ps
 * reads: word (kp, j) = {bf16(x[2kp][j]) low, bf16(x[2kp+1][j]) high}; an odd
 * K block pads its last pair with a zero. The micro-kernel then does, per
 * pair of k, acc += a0*b0 + a1*b1 (one vdpbf16ps per 16 columns: bf16 products
 * are exact in float32, the sums round to float32) and ends like the float32
 * kernel: C = alpha*acc + (first K block ? beta*C : C). Numerics that differ
 * from torch: vdpbf16ps and the rounding instruction treat float32 denormal
 * inputs (|x| < 1.2e-38) as zero.
 *
 * Determinism: each element's sum is a fixed sequence of vdpbf16ps over the K
 * blocks (which depend only on K), whichever thread or tile computes it, so
 * the result is bitwise the same for any thread count.
 * Every function carries the AVX512-BF16 target attribute; gemm.c calls in
 * here only when __builtin_cpu_supports("avx512bf16").
 * Not here: dispatch and degenerate shapes (gemm.c), the float32 packing
 * (gemm_avx512_pack.h), the block loops (gemm_driver.h).
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "gemm.h"
#include "gemm_avx512_pack.h"

#define BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,fma")))

/* ------------------------------------------------- rounding to bf16 pairs */

/* 16 words {bf16(lo[j]) | bf16(hi[j]) << 16}, j = 0..15. */
BF16 static inline __m512i pair16(__m512 lo, __m512 hi) {
  /* cvtne2ps: bf16 elements 0..15 from lo, 16..31 from hi; then interleave */
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/* In place, a packed float32 panel of w columns (w = MR or a multiple of 16)
 * and kc rows (row k at p + k*w) into (kc+1)/2 rows of w bf16 pair words
 * (word (kp, j) at p + kp*w). Writes never overtake the rows still to read:
 * output row kp lies at or below input row 2kp. */
BF16 static void panel_to_pairs(float *p, int kc, int w) {
  int kp = 0;
  if (w == 8) { /* rows 2kp and 2kp+1 are 16 contiguous floats */
    for (; 2 * kp + 1 < kc; kp++) {
      __m512 r = _mm512_loadu_ps(p + (size_t)kp * 16);
      __m512 hi = _mm512_shuffle_f32x4(r, r, 0xEE); /* row 2kp+1 into lanes 0..7 */
      _mm256_storeu_si256((__m256i *)(p + (size_t)kp * 8), _mm512_castsi512_si256(pair16(r, hi)));
    }
    if (kp * 2 < kc) {
      __m512 lo = _mm512_maskz_loadu_ps(0xFF, p + (size_t)kp * 16);
      _mm256_storeu_si256((__m256i *)(p + (size_t)kp * 8),
                          _mm512_castsi512_si256(pair16(lo, _mm512_setzero_ps())));
    }
    return;
  }
  for (; kp * 2 < kc; kp++) {
    const float *r0 = p + (size_t)2 * kp * w, *r1 = r0 + w;
    int has1 = 2 * kp + 1 < kc;
    for (int v = 0; v < w; v += 16) {
      __m512 hi = has1 ? _mm512_loadu_ps(r1 + v) : _mm512_setzero_ps();
      _mm512_storeu_si512(p + (size_t)kp * w + v, pair16(_mm512_loadu_ps(r0 + v), hi));
    }
  }
}

/* op(A) block as gemm_avx512's pack_a, then rounded to pairs panel by panel
 * (panel p at ap + p*kc, as the driver expects; it needs half of that). */
BF16 static void pack_a_bf16(int transA, const float *A, int lda, int i0, int k0, int mc, int kc,
                             float *restrict ap) {
  pack_a(transA, A, lda, i0, k0, mc, kc, ap);
  for (int p = 0; p < mc; p += MR) panel_to_pairs(ap + (size_t)p * kc, kc, MR);
}

/* Rows [k0+ka, k0+kb) of op(B) = B, columns [j0, j0+nc), straight into the
 * pair panels: row k fills the low (k even) or high (k odd) halves of pair
 * row k/2 with a masked 16-bit store, so threads packing neighbouring rows
 * never write the same bytes. The last row of an odd kc also writes the zero
 * high halves. */
BF16 static void pack_b_rows_bf16(const float *B, int ldb, int k0, int ka, int kb, int kc, int j0,
                                  int nc, float *restrict bp) {
  for (int k = ka; k < kb; k++) {
    const float *src = B + (size_t)(k0 + k) * ldb + j0;
    int odd = k & 1, last_even = !odd && k == kc - 1;
    __mmask32 m = last_even ? 0xFFFFFFFFu : odd ? 0xAAAAAAAAu : 0x55555555u;
    for (int q = 0; q * NR < nc; q++) {
      float *dst = bp + (size_t)q * kc * NR + (size_t)(k >> 1) * NR;
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) {
        __m512 r = _mm512_maskz_loadu_ps(lanes(nc - q * NR - 16 * v), src + q * NR + 16 * v);
        __m512i w = odd ? pair16(_mm512_setzero_ps(), r) : pair16(r, _mm512_setzero_ps());
        _mm512_mask_storeu_epi16(dst + 16 * v, m, w);
      }
    }
  }
}

/* One NR-column panel of op(B) = B^T as gemm_avx512's, then rounded. */
BF16 static void pack_bt_panel_bf16(const float *B, int ldb, int k0, int kc, int j0, int nr,
                                    float *restrict dst) {
  pack_bt_panel(B, ldb, k0, kc, j0, nr, dst);
  panel_to_pairs(dst, kc, NR);
}

/* ----------------------------------------------------------- micro-kernel */

/* C[0:mr, 0:nr] = alpha * (a-panel . b-panel) + (first ? beta * C : C) over
 * the (kc+1)/2 pair rows of the panels; beta == 0 on the first block never
 * reads C. */
BF16 static void ukernel_bf16(int kc, const float *restrict a, const float *restrict b,
                              float *restrict c, int ldc, int mr, int nr, float alpha, float beta,
                              int first) {
  __m512 acc[MR][NV];
#pragma GCC unroll 32
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();
  for (int i = 0; i < mr; i++)
    for (int v = 0; v < NR; v += 16)
      _mm_prefetch((const char *)(c + (size_t)i * ldc + v), _MM_HINT_T0);
  const int32_t *aw = (const int32_t *)(const void *)a;
  int kp2 = (kc + 1) / 2;
#pragma GCC unroll 2
  for (int kp = 0; kp < kp2; kp++, aw += MR, b += NR) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) bv[v] = (__m512bh)_mm512_load_si512(b + 16 * v);
#pragma GCC unroll 32
    for (int i = 0; i < MR; i++) {
      __m512bh ai = (__m512bh)_mm512_set1_epi32(aw[i]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], ai, bv[v]);
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

#define pack_a pack_a_bf16
#define pack_b_rows pack_b_rows_bf16
#define pack_bt_panel pack_bt_panel_bf16
#define ukernel ukernel_bf16
#define GEMM_ISA BF16
#define GEMM_ENTRY ct_sgemm_bf16_avx512
#define GEMM_ENTRY_W ct_sgemm_bf16_avx512_w
#include "gemm_driver.h"

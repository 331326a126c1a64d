/* Fused softmax attention (FlashAttention-2 style), forward and backward.
 *
 * Forward, one task per (batch, head, tile of BQ = 32 queries): the query tile
 * is packed transposed and pre-scaled (T = scale Q^T, hd x 32) once; then for
 * each tile of BK = 64 keys the scores S^T = K_tile T (64 x 32, 8 KB: L1) are
 * computed by a register-tile kernel (keys broadcast, 32 queries in two
 * 16-lane vectors), and the online softmax runs down the columns: the
 * running max m and sum l per query are vectors of lanes, P = exp(S - m_new)
 * overwrites S, and O (32 x hd, in L1/L2) is rescaled by exp(m_old - m_new)
 * and accumulates P V by a second register-tile kernel (P broadcast, V's rows
 * as vectors). At the end O /= l and lse = m + log(l). No score matrix
 * larger than one 64 x 32 tile ever exists, and only lse is kept for the
 * backward.
 *
 * Backward, one task per (batch, head), its query tiles in order: per query
 * tile T = scale Q^T, Td = dO^T and D = rowsum(dO o O); per key tile S^T and
 * dP^T = V Td by the scores kernel, P = exp(S - lse), dS = P (dP - D), then
 * dV += P^T dO, dK += scale dS^T Q (straight into the head's dk, dv) and
 * dQ_tile += scale dS K. The task owns its head's dK, dV and dQ, so
 * nothing is shared between threads.
 *
 * bf16 (the bf16 argument): every product's operands rounded to bf16 and
 * packed as pairs in 32-bit words along the summed index, summed in float32
 * by vdpbf16ps (the *_hw kernels here) or by an emulation with the same bits.
 *
 * Bits: every output element is produced by one task with a fixed sequence of
 * operations, so results do not depend on the thread count. The kernels are
 * written once on 16-float vectors (attention_flash_impl.h) and compiled for
 * AVX-512, AVX2 + FMA and plain x86-64; the first two give the same bits in
 * optimised builds (every statement has one product, so FMA contraction has
 * one choice; -O0 does not contract). They are not the bits of the
 * score-tile kernel (attention.c): the sums run in a different order and exp
 * is taken per key tile. Head dims that are not a multiple of 16 are padded
 * with zeros (copies of the rows that are read as vectors), which leaves
 * every dot product unchanged. Each task first prefetches its head's rows.
 *
 * Not here: the score-tile kernel and the choice between the two (attention.c).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/kernels.h"
#include "fastmath.h"
#include "scratch.h"

/* The v16 helpers are static and inlined into functions of their own
 * instruction set: the ABI note GCC gives for 64-byte vectors passed without
 * AVX-512 does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"

#define BQ 32 /* queries per tile: two 16-lane vectors */
#define BK 64 /* keys per tile */

typedef float v16 __attribute__((vector_size(64)));
typedef int v16i __attribute__((vector_size(64)));
typedef unsigned v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef float v8 __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));

/* Two-vector shuffle by an index vector: GCC's __builtin_shuffle; clang (the
 * fuzz build) has only __builtin_shufflevector with constant indices, so it
 * picks the lanes one by one (same result). A statement expression, not a
 * function: a function passing v16 by value without avx512f (an AVX2-only
 * CPU's -march=native) is an ABI error for clang. */
#if defined(__clang__)
#define FA_SHUFFLE2(a, c, m)                                         \
  ({                                                                 \
    v16 sa_ = (a), sc_ = (c), sr_;                                   \
    v16i sm_ = (m);                                                  \
    for (int si_ = 0; si_ < 16; si_++)                               \
      sr_[si_] = sm_[si_] < 16 ? sa_[sm_[si_]] : sc_[sm_[si_] - 16]; \
    sr_;                                                             \
  })
#else
#define FA_SHUFFLE2(a, c, m) __builtin_shuffle(a, c, m)
#endif
#define LOAD(p)                  \
  ({                             \
    v16 t_;                      \
    memcpy(&t_, (p), sizeof t_); \
    t_;                          \
  })
#define STORE(p, x)              \
  do {                           \
    v16 s_ = (x);                \
    memcpy((p), &s_, sizeof s_); \
  } while (0)
/* The same on the instantiation's lane vector FA_VT. */
#define LOADV(p)                 \
  ({                             \
    FA_VT t_;                    \
    memcpy(&t_, (p), sizeof t_); \
    t_;                          \
  })
#define STOREV(p, x)             \
  do {                           \
    FA_VT s_ = (x);              \
    memcpy((p), &s_, sizeof s_); \
  } while (0)

typedef struct {
  int B, H, L, hd, hdp, causal; /* hdp: hd rounded up to 16 */
  int bf16;                     /* 0 float32 products; 1 bf16 scores; 2 the same, emulated */
  float scale;
} fa_shape;
typedef struct {
  const float *q, *k, *v;
  float *o, *lse;
} fa_fwd_io;
typedef struct {
  const float *q, *k, *v, *o, *lse, *dout;
  float *dq, *dk, *dv;
} fa_bwd_io;

static inline int imin(int a, int b) {
  return a < b ? a : b;
}

/* rows x hd of X into dst with leading dim w >= hd, zeros in [hd, w). */
static void pad_rows(int rows, int hd, const float *X, size_t ld, int w, float *dst) {
  for (int r = 0; r < rows; r++) {
    memcpy(dst + (size_t)r * w, X + (size_t)r * ld, sizeof(float) * hd);
    memset(dst + (size_t)r * w + hd, 0, sizeof(float) * (size_t)(w - hd));
  }
}

/* Ask for rows [0, rows) x hd of X (leading dim ld) in cache: the tasks
 * start on a new head's rows, and reading them as 8 strided streams waits on
 * memory latency; many prefetches in flight at once do not (~25% of the
 * kernel time at the bench shape, B*H*L*hd past L2). Only the first KB_PF
 * rows: further ones arrive while the first tiles compute. */
#define KB_PF 128
static void prefetch_rows(int rows, int hd, const float *X, size_t ld) {
  rows = rows < KB_PF ? rows : KB_PF;
  for (int r = 0; r < rows; r++)
    for (int d = 0; d < hd; d += 16) __builtin_prefetch(X + (size_t)r * ld + d);
}

/* words of the bf16 pair buffers: T2 (hdp/2 x BQ) and K2 (BK x hdp/2) */
static size_t pairs_words(const fa_shape *g) {
  return (size_t)g->hdp / 2 * (BQ + BK);
}

static size_t fwd_ws_floats(const fa_shape *g) {
  size_t f = (size_t)g->hd * BQ + (size_t)BK * BQ + (size_t)BQ * g->hdp + 3 * BQ + pairs_words(g) +
             (size_t)BK / 2 * (BQ + g->hdp); /* P2, V2 */
  if (g->hdp != g->hd) f += (size_t)g->L * g->hdp;
  return f;
}

static size_t bwd_tile_floats(const fa_shape *g) {
  return 2 * (size_t)g->hd * BQ + 2 * (size_t)BK * BQ + (size_t)BQ * g->hdp + 2 * BQ +
         pairs_words(g) + (size_t)g->hdp / 2 * BQ + (size_t)BK * BQ / 2 +
         (size_t)BK / 2 * g->hdp; /* A2, B2 */
}

static size_t bwd_ws_floats(const fa_shape *g) {
  size_t lhw = (size_t)g->L * g->hdp;
  return bwd_tile_floats(g) + (g->hdp != g->hd ? 5 * lhw : 0);
}

/* Set once (isa_get): the CPU runs vdpbf16ps and the AVX-512 kernels are in use. */
static int fa_bf16_hw;

/* The scores kernel on bf16 pairs with vdpbf16ps (AVX512-BF16): the same
 * register tile as FN(scores), one instruction per pair of head dims. */
__attribute__((target("avx512f,avx512bf16"))) static void scores_bf16_hw(
    int nk, int np, const uint32_t *K2, size_t ldk2, const uint32_t *T2, float *S) {
  for (int j0 = 0; j0 < nk; j0 += 8) {
    const uint32_t *kr[8];
    __m512 a0[8], a1[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) {
      int j = j0 + r < nk ? j0 + r : nk - 1;
      kr[r] = K2 + (size_t)j * ldk2;
      a0[r] = a1[r] = _mm512_setzero_ps();
    }
    for (int p = 0; p < np; p++) {
      __m512bh t0 = (__m512bh)_mm512_loadu_si512(T2 + (size_t)p * BQ);
      __m512bh t1 = (__m512bh)_mm512_loadu_si512(T2 + (size_t)p * BQ + 16);
#pragma GCC unroll 8
      for (int r = 0; r < 8; r++) {
        __m512bh a = (__m512bh)_mm512_set1_epi32((int)kr[r][p]);
        a0[r] = _mm512_dpbf16_ps(a0[r], a, t0);
        a1[r] = _mm512_dpbf16_ps(a1[r], a, t1);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
      if (j0 + r < nk) {
        _mm512_storeu_ps(S + (size_t)(j0 + r) * BQ, a0[r]);
        _mm512_storeu_ps(S + (size_t)(j0 + r) * BQ + 16, a1[r]);
      }
  }
}

/* The P V kernel on bf16 pairs with vdpbf16ps: C = rs C + sum_p A2(i, p) .
 * B2[p] over MR rows x NV vectors, as the emulation FN(accbNV) computes it. */
#define ACCB_HW(NV, MR)                                                                         \
  __attribute__((target("avx512f,avx512bf16"))) static void accb##NV##_hw(                      \
      int rows, int np, int c0, const uint32_t *A2, size_t ars, size_t acs, const uint32_t *B2, \
      size_t ldb, float *C, size_t ldc, const float *rs, float alpha) {                         \
    for (int i0 = 0; i0 < rows; i0 += MR) {                                                     \
      const uint32_t *ar[MR];                                                                   \
      float *cr[MR];                                                                            \
      __m512 acc[MR][NV];                                                                       \
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                   \
        int i = i0 + r < rows ? i0 + r : rows - 1;                                              \
        ar[r] = A2 + (size_t)i * ars;                                                           \
        cr[r] = C + (size_t)i * ldc + c0;                                                       \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();   \
      }                                                                                         \
      for (int p = 0; p < np; p++) {                                                            \
        __m512bh bv[NV];                                                                        \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) bv[v] =                            \
            (__m512bh)_mm512_loadu_si512(B2 + (size_t)p * ldb + c0 + 16 * v);                   \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                 \
          __m512bh a = (__m512bh)_mm512_set1_epi32((int)ar[r][(size_t)p * acs]);                \
          _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] =                      \
              _mm512_dpbf16_ps(acc[r][v], a, bv[v]);                                            \
        }                                                                                       \
      }                                                                                         \
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                   \
        if (i0 + r >= rows) break;                                                              \
        __m512 s = _mm512_set1_ps(rs ? rs[i0 + r] : alpha);                                     \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {                                  \
          __m512 c = _mm512_loadu_ps(cr[r] + 16 * v);                                           \
          c = rs ? _mm512_fmadd_ps(c, s, acc[r][v]) : _mm512_fmadd_ps(acc[r][v], s, c);         \
          _mm512_storeu_ps(cr[r] + 16 * v, c);                                                  \
        }                                                                                       \
      }                                                                                         \
    }                                                                                           \
  }
ACCB_HW(4, 4)
ACCB_HW(2, 8)
ACCB_HW(1, 8)
#undef ACCB_HW

/* FA_PIN(x): keep vector x in a register (GCC would otherwise re-read the B
 * rows from memory for each FMA, which makes the kernels load-bound). */
#define FA_ISA __attribute__((target("avx512f")))
#define FA_SUFFIX avx512
#define FA_VT v16
#define FA_VTI v16i
#define FA_W 16
#define FA_PIN(x) __asm__("" : "+v"(x))
#define FA_MRS 8
#define FA_MR4 4
#define FA_MR2 8
#define FA_MR1 8
#include "attention_flash_impl.h"
#undef FA_ISA
#undef FA_SUFFIX
#undef FA_MRS
#undef FA_MR4
#undef FA_MR2
#undef FA_MR1
#undef FA_PIN
#undef FA_VT
#undef FA_VTI
#undef FA_W

/* AVX2: 8-lane vectors in the float32 loops (16 ymm registers: FA_MRS rows
 * x 4 vectors of scores + 4 of T; acc's MR rows x 16 NV / 8 vectors). */
#define FA_ISA __attribute__((target("avx2,fma")))
#define FA_SUFFIX avx2
#define FA_VT v8
#define FA_VTI v8i
#define FA_W 8
#define FA_PIN(x) (void)0
#define FA_MRS 2
#define FA_MR4 1
#define FA_MR2 2
#define FA_MR1 6
#include "attention_flash_impl.h"
#undef FA_ISA
#undef FA_SUFFIX
#undef FA_MRS
#undef FA_MR4
#undef FA_MR2
#undef FA_MR1
#undef FA_PIN
#undef FA_VT
#undef FA_VTI
#undef FA_W

#define FA_ISA
#define FA_SUFFIX generic
#define FA_VT v16
#define FA_VTI v16i
#define FA_W 16
#define FA_PIN(x) (void)0
#define FA_MRS 2
#define FA_MR4 1
#define FA_MR2 1
#define FA_MR1 2
#include "attention_flash_impl.h"

enum { ISA_UNSET, ISA_AVX512, ISA_AVX2, ISA_GENERIC };

static int isa_get(void) {
  static int isa = ISA_UNSET;
  int p = __atomic_load_n(&isa, __ATOMIC_ACQUIRE);
  if (p == ISA_UNSET) {
    __builtin_cpu_init();
    const char *env = getenv("CT_ATTENTION_ISA");
    if (env && !strcmp(env, "generic"))
      p = ISA_GENERIC;
    else if (__builtin_cpu_supports("avx512f") && !(env && !strcmp(env, "avx2")))
      p = ISA_AVX512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      p = ISA_AVX2;
    else
      p = ISA_GENERIC;
    fa_bf16_hw = p == ISA_AVX512 && __builtin_cpu_supports("avx512bf16");
    __atomic_store_n(&isa, p, __ATOMIC_RELEASE);
  }
  return p;
}

const char *ct_attention_flash_isa(void) {
  static const char *const names[] = {"", "avx512", "avx2", "generic"};
  return names[isa_get()];
}

static fa_shape shape(int B, int H, int L, int hd, float scale, int causal, int bf16) {
  fa_shape g = {B,    H, L, hd, (hd + 15) / 16 * 16, causal != 0, bf16 < 0 || bf16 > 2 ? 1 : bf16,
                scale};
  return g;
}

void ct_attention_flash_fwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                            const float *k, const float *v, float *o, float *lse, int bf16) {
  if (B <= 0 || H <= 0 || L <= 0 || hd <= 0) return;
  fa_shape g = shape(B, H, L, hd, scale, causal, bf16);
  fa_fwd_io io = {q, k, v, o, lse};
  int isa = isa_get();
  if (isa == ISA_AVX512)
    fwd_avx512(&g, &io);
  else if (isa == ISA_AVX2)
    fwd_avx2(&g, &io);
  else
    fwd_generic(&g, &io);
}

void ct_attention_flash_bwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                            const float *k, const float *v, const float *o, const float *lse,
                            const float *dout, float *dq, float *dk, float *dv, int bf16) {
  if (B <= 0 || H <= 0 || L <= 0 || hd <= 0) return;
  fa_shape g = shape(B, H, L, hd, scale, causal, bf16);
  fa_bwd_io io = {q, k, v, o, lse, dout, dq, dk, dv};
  int isa = isa_get();
  if (isa == ISA_AVX512)
    bwd_avx512(&g, &io);
  else if (isa == ISA_AVX2)
    bwd_avx2(&g, &io);
  else
    bwd_generic(&g, &io);
}

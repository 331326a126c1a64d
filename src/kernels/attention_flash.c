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
 * Bits: every output element is produced by one task with a fixed sequence of
 * operations, so results do not depend on the thread count. The kernels are
 * written once on 16-float vectors (attention_flash_impl.h) and compiled for
 * AVX-512, AVX2 + FMA and plain x86-64; the first two give the same bits.
 * They are not the bits of the score-tile kernel (attention.c): the sums run
 * in a different order and exp is taken per key tile. Head dims that are not
 * a multiple of 16 are padded with zeros (copies of the rows that are read as
 * vectors), which leaves every dot product unchanged.
 *
 * Not here: the score-tile kernel and the choice between the two (attention.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/kernels.h"
#include "fastmath.h"
#include "scratch.h"

#define BQ 32 /* queries per tile: two 16-lane vectors */
#define BK 64 /* keys per tile */

typedef float v16 __attribute__((vector_size(64)));
typedef int v16i __attribute__((vector_size(64)));
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

typedef struct {
  int B, H, L, hd, hdp, causal; /* hdp: hd rounded up to 16 */
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

/* T[d][i] = s X[i][d] for i < n, 0 for n <= i < BQ (X rows of leading dim ld). */
static void pack_t(int n, int hd, const float *X, size_t ld, float s, float *T) {
  for (int d = 0; d < hd; d++) {
    float *t = T + (size_t)d * BQ;
    for (int i = 0; i < n; i++) t[i] = s * X[(size_t)i * ld + d];
    for (int i = n; i < BQ; i++) t[i] = 0.0f;
  }
}

/* rows x hd of X into dst with leading dim w >= hd, zeros in [hd, w). */
static void pad_rows(int rows, int hd, const float *X, size_t ld, int w, float *dst) {
  for (int r = 0; r < rows; r++) {
    memcpy(dst + (size_t)r * w, X + (size_t)r * ld, sizeof(float) * hd);
    memset(dst + (size_t)r * w + hd, 0, sizeof(float) * (size_t)(w - hd));
  }
}

static float row_dot(int n, const float *a, const float *b) {
  float s;
  CT_SUM_LANES(float, s, n, c, a[c] * b[c]);
  return s;
}

static size_t fwd_ws_floats(const fa_shape *g) {
  size_t f = (size_t)g->hd * BQ + (size_t)BK * BQ + (size_t)BQ * g->hdp + 3 * BQ;
  if (g->hdp != g->hd) f += (size_t)g->L * g->hdp;
  return f;
}

static size_t bwd_tile_floats(const fa_shape *g) {
  return 2 * (size_t)g->hd * BQ + 2 * (size_t)BK * BQ + (size_t)BQ * g->hdp + 2 * BQ;
}

static size_t bwd_ws_floats(const fa_shape *g) {
  size_t lhw = (size_t)g->L * g->hdp;
  return bwd_tile_floats(g) + (g->hdp != g->hd ? 5 * lhw : 0);
}

/* FA_PIN(x): keep vector x in a register (GCC would otherwise re-read the B
 * rows from memory for each FMA, which makes the kernels load-bound). */
#define FA_ISA __attribute__((target("avx512f")))
#define FA_SUFFIX avx512
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

#define FA_ISA __attribute__((target("avx2,fma")))
#define FA_SUFFIX avx2
#define FA_PIN(x) (void)0
#define FA_MRS 3
#define FA_MR4 2
#define FA_MR2 3
#define FA_MR1 6
#include "attention_flash_impl.h"
#undef FA_ISA
#undef FA_SUFFIX
#undef FA_MRS
#undef FA_MR4
#undef FA_MR2
#undef FA_MR1
#undef FA_PIN

#define FA_ISA
#define FA_SUFFIX generic
#define FA_PIN(x) (void)0
#define FA_MRS 2
#define FA_MR4 1
#define FA_MR2 1
#define FA_MR1 2
#include "attention_flash_impl.h"

enum { ISA_UNSET, ISA_AVX512, ISA_AVX2, ISA_GENERIC };

static int isa_get(void) {
  static int isa = ISA_UNSET;
  int p = __atomic_load_n(&isa, __ATOMIC_RELAXED);
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
    __atomic_store_n(&isa, p, __ATOMIC_RELAXED);
  }
  return p;
}

const char *ct_attention_flash_isa(void) {
  static const char *const names[] = {"", "avx512", "avx2", "generic"};
  return names[isa_get()];
}

static fa_shape shape(int B, int H, int L, int hd, float scale, int causal) {
  fa_shape g = {B, H, L, hd, (hd + 15) / 16 * 16, causal != 0, scale};
  return g;
}

void ct_attention_flash_fwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                            const float *k, const float *v, float *o, float *lse) {
  if (B <= 0 || H <= 0 || L <= 0 || hd <= 0) return;
  fa_shape g = shape(B, H, L, hd, scale, causal);
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
                            const float *dout, float *dq, float *dk, float *dv) {
  if (B <= 0 || H <= 0 || L <= 0 || hd <= 0) return;
  fa_shape g = shape(B, H, L, hd, scale, causal);
  fa_bwd_io io = {q, k, v, o, lse, dout, dq, dk, dv};
  int isa = isa_get();
  if (isa == ISA_AVX512)
    bwd_avx512(&g, &io);
  else if (isa == ISA_AVX2)
    bwd_avx2(&g, &io);
  else
    bwd_generic(&g, &io);
}

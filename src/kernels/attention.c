/* Softmax attention, forward and backward, tiled over query rows.
 *
 * Design: for one (batch, head) and a tile of up to ATT_TQ query rows the scores
 * S = scale Q K^T (tile x keys) live in a per-thread scratch buffer, so no
 * B*H*L*L tensor ever exists. All products are ct_sgemm calls made inside
 * an OpenMP parallel region, where they run on the calling thread; the
 * parallelism is ours. The forward parallelises over
 * (batch, head, query tile), normalises the softmax in place with a
 * vectorised exp and stores lse = max + log(sum) per query. The backward
 * parallelises over (batch, head): each task owns dK and dV of its head and
 * accumulates them over its query tiles in order, recomputing P = exp(S - lse).
 * Causal masking limits each tile to keys [0, last query of the tile] and
 * zeroes P above the diagonal, so no -inf is ever stored.
 * Results do not depend on the thread count: every output element is produced
 * by one task with a fixed sequence of operations.
 * Also here: ct_attention_fwd/bwd, which run the fused kernel of
 * attention_flash.c for head dims up to 256 and this one above (or the one
 * CT_ATTENTION names); docs/attention.md.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/kernels.h"
#include "fastmath.h"
#include "gemm.h"
#include "scratch.h"

#define ATT_TQ 64 /* query rows per tile */

static inline int min_int(int a, int b) {
  return a < b ? a : b;
}

/* In-place softmax of one row's first n scores; zero the rest up to lk.
 * Returns log-sum-exp of the first n. */
static inline float softmax_row(float *s, int n, int lk) {
  float m = s[0];
#pragma omp simd reduction(max : m)
  for (int j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
#pragma omp simd
  for (int j = 0; j < n; j++) s[j] = ct_expf(s[j] - m);
  float sum;
  CT_SUM_LANES(float, sum, n, j, s[j]); /* the same bits at any SIMD width */
  float inv = 1.0f / sum;
  for (int j = 0; j < n; j++) s[j] *= inv;
  for (int j = n; j < lk; j++) s[j] = 0.0f;
  return m + logf(sum);
}

void ct_attention_tiles_fwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                            const float *k, const float *v, float *o, float *lse) {
  if (B <= 0 || H <= 0 || L <= 0) return;
  int nt = (L + ATT_TQ - 1) / ATT_TQ;
  int ntask = B * H * nt, ldo = H * hd;
#pragma omp parallel
  {
    float *S = ct_kernels_scratch(sizeof(float) * (size_t)min_int(ATT_TQ, L) * L,
                                  "attention forward score tile");
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < ntask; t++) {
      int bh = t / nt, i0 = (t % nt) * ATT_TQ;
      int b = bh / H, h = bh % H;
      int tq = min_int(ATT_TQ, L - i0), lk = causal ? i0 + tq : L;
      const float *Q = q + ((size_t)bh * L + i0) * hd;
      const float *K = k + (size_t)bh * L * hd, *V = v + (size_t)bh * L * hd;
      ct_sgemm(0, 1, tq, lk, hd, scale, Q, hd, K, hd, 0.0f, S, lk);
      for (int i = 0; i < tq; i++)
        lse[(size_t)bh * L + i0 + i] =
            softmax_row(S + (size_t)i * lk, causal ? i0 + i + 1 : lk, lk);
      float *O = o + ((size_t)b * L + i0) * ldo + (size_t)h * hd;
      ct_sgemm(0, 0, tq, hd, lk, 1.0f, S, lk, V, hd, 0.0f, O, ldo);
    }
    free(S);
  }
}

/* As ct_attention_fwd without causality and lse, the bias rows of the tile
 * added to the scores before the softmax. */
void ct_attention_bias_fwd(int B, int H, int L, int hd, float scale, const float *bias,
                           const float *q, const float *k, const float *v, float *o) {
  if (B <= 0 || H <= 0 || L <= 0) return;
  int nt = (L + ATT_TQ - 1) / ATT_TQ;
  int ntask = B * H * nt, ldo = H * hd;
#pragma omp parallel
  {
    float *S = ct_kernels_scratch(sizeof(float) * (size_t)min_int(ATT_TQ, L) * L,
                                  "attention forward score tile");
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < ntask; t++) {
      int bh = t / nt, i0 = (t % nt) * ATT_TQ;
      int b = bh / H, h = bh % H;
      int tq = min_int(ATT_TQ, L - i0);
      const float *Q = q + ((size_t)bh * L + i0) * hd;
      const float *K = k + (size_t)bh * L * hd, *V = v + (size_t)bh * L * hd;
      const float *Bi = bias + ((size_t)h * L + i0) * L;
      ct_sgemm(0, 1, tq, L, hd, scale, Q, hd, K, hd, 0.0f, S, L);
      for (int i = 0; i < tq; i++) {
        float *s = S + (size_t)i * L;
        const float *br = Bi + (size_t)i * L;
        for (int j = 0; j < L; j++) s[j] += br[j];
        softmax_row(s, L, L);
      }
      float *O = o + ((size_t)b * L + i0) * ldo + (size_t)h * hd;
      ct_sgemm(0, 0, tq, hd, L, 1.0f, S, L, V, hd, 0.0f, O, ldo);
    }
    free(S);
  }
}

void ct_attention_tiles_bwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                            const float *k, const float *v, const float *o, const float *lse,
                            const float *dout, float *dq, float *dk, float *dv) {
  if (B <= 0 || H <= 0 || L <= 0) return;
  int ldo = H * hd;
#pragma omp parallel
  {
    size_t tile = (size_t)min_int(ATT_TQ, L) * L;
    float *P = ct_kernels_scratch(sizeof(float) * 2 * tile, "attention backward score tiles");
    float *dP = P + tile;
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < B * H; bh++) {
      int b = bh / H, h = bh % H;
      size_t hoff = (size_t)bh * L * hd;
      const float *K = k + hoff, *V = v + hoff;
      float *dK = dk + hoff, *dV = dv + hoff;
      memset(dK, 0, sizeof(float) * (size_t)L * hd);
      memset(dV, 0, sizeof(float) * (size_t)L * hd);
      for (int i0 = 0; i0 < L; i0 += ATT_TQ) {
        int tq = min_int(ATT_TQ, L - i0), lk = causal ? i0 + tq : L;
        const float *Q = q + hoff + (size_t)i0 * hd;
        const float *O = o + ((size_t)b * L + i0) * ldo + (size_t)h * hd;
        const float *dO = dout + ((size_t)b * L + i0) * ldo + (size_t)h * hd;
        const float *ls = lse + (size_t)bh * L + i0;
        ct_sgemm(0, 1, tq, lk, hd, scale, Q, hd, K, hd, 0.0f, P, lk);
        ct_sgemm(0, 1, tq, lk, hd, 1.0f, dO, ldo, V, hd, 0.0f, dP, lk);
        for (int i = 0; i < tq; i++) {
          float *p = P + (size_t)i * lk, *dp = dP + (size_t)i * lk;
          const float *oi = O + (size_t)i * ldo, *doi = dO + (size_t)i * ldo;
          float Di;
          CT_SUM_LANES(float, Di, hd, c, doi[c] * oi[c]);
          int n = causal ? i0 + i + 1 : lk;
          float li = ls[i];
          for (int j = 0; j < n; j++) {
            float pj = ct_expf(p[j] - li);
            p[j] = pj;
            dp[j] = pj * (dp[j] - Di);
          }
          for (int j = n; j < lk; j++) p[j] = dp[j] = 0.0f;
        }
        ct_sgemm(0, 0, tq, hd, lk, scale, dP, lk, K, hd, 0.0f, dq + hoff + (size_t)i0 * hd, hd);
        ct_sgemm(1, 0, lk, hd, tq, scale, dP, lk, Q, hd, 1.0f, dK, hd);
        ct_sgemm(1, 0, lk, hd, tq, 1.0f, P, lk, dO, ldo, 1.0f, dV, hd);
      }
    }
    free(P);
  }
}

/* ------------------------------------------------- the choice */

enum { ATT_UNSET, ATT_AUTO, ATT_TILES, ATT_FLASH };

/* Head dims above this take the score-tile kernel by default: with one wide
 * head (the VAE's 512 channels) the fused backward re-reads L x hd dK and
 * dV accumulators per 32-query tile from L3 and is slower (docs/attention.md). */
#define FLASH_MAX_HD 256

/* Decided on first use from CT_ATTENTION ("tiles" or "flash" for every
 * shape; unset or anything else: auto, the fused kernel up to FLASH_MAX_HD,
 * docs/attention.md); a race only computes the same answer twice. */
static int att_path(void) {
  static int path = ATT_UNSET;
  int p = __atomic_load_n(&path, __ATOMIC_RELAXED);
  if (p == ATT_UNSET) {
    const char *env = getenv("CT_ATTENTION");
    p = env && !strcmp(env, "tiles")   ? ATT_TILES
        : env && !strcmp(env, "flash") ? ATT_FLASH
                                       : ATT_AUTO;
    __atomic_store_n(&path, p, __ATOMIC_RELAXED);
  }
  return p;
}

static int use_flash(int hd) {
  int p = att_path();
  return p == ATT_FLASH || (p == ATT_AUTO && hd <= FLASH_MAX_HD);
}

const char *ct_attention_path(void) {
  int p = att_path();
  return p == ATT_FLASH ? "flash" : p == ATT_TILES ? "tiles" : "auto";
}

void ct_attention_fwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                      const float *k, const float *v, float *o, float *lse) {
  if (use_flash(hd))
    ct_attention_flash_fwd(B, H, L, hd, scale, causal, q, k, v, o, lse, 0);
  else
    ct_attention_tiles_fwd(B, H, L, hd, scale, causal, q, k, v, o, lse);
}

/* --mixed_precision bf16 (the cpu-bf16 backend): the fused kernel with every
 * product on bf16 operands; where the tiles kernel runs (head dims above
 * 256, or CT_ATTENTION=tiles) it stays float32. */
void ct_attention_fwd_bf16(int B, int H, int L, int hd, float scale, int causal, const float *q,
                           const float *k, const float *v, float *o, float *lse) {
  if (use_flash(hd))
    ct_attention_flash_fwd(B, H, L, hd, scale, causal, q, k, v, o, lse, 1);
  else
    ct_attention_tiles_fwd(B, H, L, hd, scale, causal, q, k, v, o, lse);
}

void ct_attention_bwd_bf16(int B, int H, int L, int hd, float scale, int causal, const float *q,
                           const float *k, const float *v, const float *o, const float *lse,
                           const float *dout, float *dq, float *dk, float *dv) {
  if (use_flash(hd))
    ct_attention_flash_bwd(B, H, L, hd, scale, causal, q, k, v, o, lse, dout, dq, dk, dv, 1);
  else
    ct_attention_tiles_bwd(B, H, L, hd, scale, causal, q, k, v, o, lse, dout, dq, dk, dv);
}

void ct_attention_bwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                      const float *k, const float *v, const float *o, const float *lse,
                      const float *dout, float *dq, float *dk, float *dv) {
  if (use_flash(hd))
    ct_attention_flash_bwd(B, H, L, hd, scale, causal, q, k, v, o, lse, dout, dq, dk, dv, 0);
  else
    ct_attention_tiles_bwd(B, H, L, hd, scale, causal, q, k, v, o, lse, dout, dq, dk, dv);
}

/* Joint attention with a per-token padding mask (Chroma's T5 mask extended
 * over the image tokens), forward and backward.
 *
 * mask (B, L) holds 1 for a real token and 0 for a padding one (backend
 * memory). Two meanings, both diffusers/torch behaviours:
 * - CT_MASK_BOOL (additive = 0): SDPA's boolean mask m_i AND m_j, the one
 *   SimpleTuner's chroma training passes (helpers/models/chroma/model.py
 *   model_predict: `attention_mask > 0`, then ChromaTransformerBlock's
 *   `mask[:, None, None, :] * mask[:, None, :, None]`): a real query attends
 *   only real keys; a padding query has no key at all and, as torch 2's SDPA
 *   gives for a fully masked row, its output is 0 and it passes no gradient
 *   (its lse is stored as 0).
 * - CT_MASK_ADD (additive = 1): SDPA's float mask m_i * m_j added to the
 *   scores, which is what diffusers 0.42.1's ChromaPipeline passes: its
 *   _get_t5_prompt_embeds makes the mask in the latents' float dtype and
 *   _prepare_attention_mask's torch.cat with a bool tensor keeps it float, so
 *   SDPA adds 1 to every real-real score instead of masking.
 * Layouts as ct_attention_fwd: q, k, v (B, H, L, hd); o (B, L, H*hd); lse
 * (B, H, L). One task per (batch, head, query tile) forward and per (batch,
 * head) backward, each output written by one task in a fixed order, so the
 * results do not depend on the thread count. Score tiles through ct_sgemm as
 * the tiles kernel of attention.c.
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

/* Adds the mask's term to one row of scores and marks the keys this query
 * may see in keep (1/0). Returns 0 when the query sees no key. */
static int mask_row(float *s, int L, float mi, const float *m, int additive, unsigned char *keep) {
  int any = 0;
  for (int j = 0; j < L; j++) {
    if (additive) {
      s[j] += mi * m[j];
      keep[j] = 1;
    } else
      keep[j] = mi != 0.0f && m[j] != 0.0f;
    any |= keep[j];
  }
  return any;
}

/* In-place softmax over the kept scores (the rest 0); returns the lse. */
static float softmax_kept(float *s, int L, const unsigned char *keep) {
  float mx = -INFINITY, sum = 0.0f;
  for (int j = 0; j < L; j++)
    if (keep[j] && s[j] > mx) mx = s[j];
  for (int j = 0; j < L; j++) {
    s[j] = keep[j] ? ct_expf(s[j] - mx) : 0.0f;
    sum += s[j];
  }
  float inv = 1.0f / sum;
  for (int j = 0; j < L; j++) s[j] *= inv;
  return mx + logf(sum);
}

void ct_attention_mask_fwd(int B, int H, int L, int hd, float scale, const float *mask,
                           int additive, const float *q, const float *k, const float *v, float *o,
                           float *lse) {
  if (B <= 0 || H <= 0 || L <= 0) return;
  int nt = (L + ATT_TQ - 1) / ATT_TQ;
  int ntask = B * H * nt, ldo = H * hd;
#pragma omp parallel
  {
    size_t tile = (size_t)min_int(ATT_TQ, L) * L;
    float *S = ct_kernels_scratch(sizeof(float) * tile + (size_t)L, "masked attention score tile");
    unsigned char *keep = (unsigned char *)(S + tile);
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < ntask; t++) {
      int bh = t / nt, i0 = (t % nt) * ATT_TQ;
      int b = bh / H, h = bh % H;
      int tq = min_int(ATT_TQ, L - i0);
      const float *Q = q + ((size_t)bh * L + i0) * hd, *m = mask + (size_t)b * L;
      const float *K = k + (size_t)bh * L * hd, *V = v + (size_t)bh * L * hd;
      ct_sgemm(0, 1, tq, L, hd, scale, Q, hd, K, hd, 0.0f, S, L);
      for (int i = 0; i < tq; i++) {
        float *s = S + (size_t)i * L;
        float l = 0.0f;
        if (mask_row(s, L, m[i0 + i], m, additive, keep))
          l = softmax_kept(s, L, keep);
        else
          memset(s, 0, sizeof(float) * (size_t)L); /* a fully masked query: output 0 */
        lse[(size_t)bh * L + i0 + i] = l;
      }
      float *O = o + ((size_t)b * L + i0) * ldo + (size_t)h * hd;
      ct_sgemm(0, 0, tq, hd, L, 1.0f, S, L, V, hd, 0.0f, O, ldo);
    }
    free(S);
  }
}

/* P = exp(S - lse) over the kept keys and dS = P (dP - D) of one query row;
 * a query that sees no key gets zero rows (no gradient). */
static void grad_row(float *p, float *dp, int L, float mi, const float *m, int additive,
                     unsigned char *keep, float li, float Di) {
  if (!mask_row(p, L, mi, m, additive, keep)) {
    memset(p, 0, sizeof(float) * (size_t)L);
    memset(dp, 0, sizeof(float) * (size_t)L);
    return;
  }
  for (int j = 0; j < L; j++) {
    float pj = keep[j] ? ct_expf(p[j] - li) : 0.0f;
    p[j] = pj;
    dp[j] = pj * (dp[j] - Di);
  }
}

void ct_attention_mask_bwd(int B, int H, int L, int hd, float scale, const float *mask,
                           int additive, const float *q, const float *k, const float *v,
                           const float *o, const float *lse, const float *dout, float *dq,
                           float *dk, float *dv) {
  if (B <= 0 || H <= 0 || L <= 0) return;
  int ldo = H * hd;
#pragma omp parallel
  {
    size_t tile = (size_t)min_int(ATT_TQ, L) * L;
    float *P = ct_kernels_scratch(sizeof(float) * 2 * tile + (size_t)L,
                                  "masked attention backward score tiles");
    float *dP = P + tile;
    unsigned char *keep = (unsigned char *)(dP + tile);
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < B * H; bh++) {
      int b = bh / H, h = bh % H;
      size_t hoff = (size_t)bh * L * hd;
      const float *K = k + hoff, *V = v + hoff, *m = mask + (size_t)b * L;
      float *dK = dk + hoff, *dV = dv + hoff;
      memset(dK, 0, sizeof(float) * (size_t)L * hd);
      memset(dV, 0, sizeof(float) * (size_t)L * hd);
      for (int i0 = 0; i0 < L; i0 += ATT_TQ) {
        int tq = min_int(ATT_TQ, L - i0);
        const float *Q = q + hoff + (size_t)i0 * hd;
        const float *O = o + ((size_t)b * L + i0) * ldo + (size_t)h * hd;
        const float *dO = dout + ((size_t)b * L + i0) * ldo + (size_t)h * hd;
        ct_sgemm(0, 1, tq, L, hd, scale, Q, hd, K, hd, 0.0f, P, L);
        ct_sgemm(0, 1, tq, L, hd, 1.0f, dO, ldo, V, hd, 0.0f, dP, L);
        for (int i = 0; i < tq; i++) {
          const float *oi = O + (size_t)i * ldo, *doi = dO + (size_t)i * ldo;
          float Di;
          CT_SUM_LANES(float, Di, hd, c, doi[c] * oi[c]);
          grad_row(P + (size_t)i * L, dP + (size_t)i * L, L, m[i0 + i], m, additive, keep,
                   lse[(size_t)bh * L + i0 + i], Di);
        }
        ct_sgemm(0, 0, tq, hd, L, scale, dP, L, K, hd, 0.0f, dq + hoff + (size_t)i0 * hd, hd);
        ct_sgemm(1, 0, L, hd, tq, scale, dP, L, Q, hd, 1.0f, dK, hd);
        ct_sgemm(1, 0, L, hd, tq, 1.0f, P, L, dO, ldo, 1.0f, dV, hd);
      }
    }
    free(P);
  }
}

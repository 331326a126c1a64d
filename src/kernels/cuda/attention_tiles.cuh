// attention_tiles.cuh: attention for head dims above CU_ATT_MAXHD (the VAE's one
// 512-wide head), attention.c's score-tile algorithm over an Ops policy: per
// (batch, head) and chunk of tq queries, S = scale Q K^T (tq x keys) by the
// matrix product, a row softmax keeping lse, O = P V; the backward recomputes
// P from lse, dS = P (dP - D), dQ = scale dS K, and accumulates dK += scale
// dS^T Q and dV += P^T dO chunk by chunk in order (deterministic). The device
// (attention.cu: kernels, cuBLASLt) and the host self-test (ct_sgemm) run this
// one driver. Ops: mm(...) as ct_sgemm; softmax_rows(n, lk, i0, causal, S,
// lse); grad_rows(n, lk, i0, causal, P, dP, lse, D); rowdot(B, H, L, hd, o,
// dout, D); zero(p, n).
#pragma once

#include "attention_core.cuh"

// keys query i0 + r of a chunk sees among the chunk's lk
CU_HD int cu_att_row_keys(int i0, int r, int lk, int causal) {
  return causal ? (i0 + r + 1 < lk ? i0 + r + 1 : lk) : lk;
}

template <class Ops>
void cu_att_tiles_fwd(Ops &ops, int tq, int B, int H, int L, int hd, float scale, int causal,
                      const float *q, const float *k, const float *v, float *o, float *lse,
                      float *S) {
  const int ldo = H * hd;
  for (int bh = 0; bh < B * H; bh++) {
    const int b = bh / H, h = bh % H;
    const float *K = k + cu_att_qoff(bh, 0, L, hd), *V = v + cu_att_qoff(bh, 0, L, hd);
    for (int i0 = 0; i0 < L; i0 += tq) {
      const int n = L - i0 < tq ? L - i0 : tq, lk = cu_att_kend(i0, n, L, causal);
      ops.mm(0, 1, n, lk, hd, scale, q + cu_att_qoff(bh, i0, L, hd), hd, K, hd, 0.0f, S, lk);
      ops.softmax_rows(n, lk, i0, causal, S, lse + (size_t)bh * L + i0);
      ops.mm(0, 0, n, hd, lk, 1.0f, S, lk, V, hd, 0.0f, o + cu_att_ooff(b, h, i0, L, H, hd), ldo);
    }
  }
}

// D: B*H*L floats of scratch; P, dP: tq * L floats each
template <class Ops>
void cu_att_tiles_bwd(Ops &ops, int tq, int B, int H, int L, int hd, float scale, int causal,
                      const float *q, const float *k, const float *v, const float *o,
                      const float *lse, const float *dout, float *dq, float *dk, float *dv,
                      float *D, float *P, float *dP) {
  const int ldo = H * hd;
  ops.rowdot(B, H, L, hd, o, dout, D);
  for (int bh = 0; bh < B * H; bh++) {
    const int b = bh / H, h = bh % H;
    const size_t hoff = cu_att_qoff(bh, 0, L, hd);
    const float *K = k + hoff, *V = v + hoff;
    ops.zero(dk + hoff, (size_t)L * hd);
    ops.zero(dv + hoff, (size_t)L * hd);
    for (int i0 = 0; i0 < L; i0 += tq) {
      const int n = L - i0 < tq ? L - i0 : tq, lk = cu_att_kend(i0, n, L, causal);
      const float *Q = q + hoff + (size_t)i0 * hd, *dO = dout + cu_att_ooff(b, h, i0, L, H, hd);
      ops.mm(0, 1, n, lk, hd, scale, Q, hd, K, hd, 0.0f, P, lk);
      ops.mm(0, 1, n, lk, hd, 1.0f, dO, ldo, V, hd, 0.0f, dP, lk);
      ops.grad_rows(n, lk, i0, causal, P, dP, lse + (size_t)bh * L + i0, D + (size_t)bh * L + i0);
      ops.mm(0, 0, n, hd, lk, scale, dP, lk, K, hd, 0.0f, dq + hoff + (size_t)i0 * hd, hd);
      ops.mm(1, 0, lk, hd, n, scale, dP, lk, Q, hd, 1.0f, dk + hoff, hd);
      ops.mm(1, 0, lk, hd, n, 1.0f, P, lk, dO, ldo, 1.0f, dv + hoff, hd);
    }
  }
}

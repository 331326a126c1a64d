// attention_core.cuh: the host-and-device pieces of the CUDA attention
// (attention.cu): tile sizes, the layouts' offsets, the mask, the online-softmax
// recurrence and the gradient of one score. The host self-test
// (gemm_selftest.cu) runs the kernels' tile loops with these same functions
// and compares with ct_attention_flash_fwd/bwd, so the algorithm, not only
// the syntax, is checked without a device.
#pragma once

#include <math.h>
#include <stddef.h>

#include "gemm_map.cuh"

#define CU_ATT_WARPS 4                         // warps per block
#define CU_ATT_R 4                             // rows (queries, or keys in the dK/dV pass) per warp
#define CU_ATT_ROWS (CU_ATT_WARPS * CU_ATT_R)  // rows per block: 16
#define CU_ATT_KT 32                           // the other side's tile: one per lane
#define CU_ATT_MAXT 8                          // head dim chunks of 32 per lane: hd <= 256
#define CU_ATT_MAXHD (32 * CU_ATT_MAXT)

// q, k, v, dq, dk, dv (B, H, L, hd): row i of head bh
CU_HD size_t cu_att_qoff(int bh, int i, int L, int hd) {
  return ((size_t)bh * (size_t)L + (size_t)i) * (size_t)hd;
}
// o, dout (B, L, H * hd): row i of head h of batch b
CU_HD size_t cu_att_ooff(int b, int h, int i, int L, int H, int hd) {
  return (((size_t)b * (size_t)L + (size_t)i) * (size_t)H + (size_t)h) * (size_t)hd;
}
// bias (H, L, L) of attention_bias_fwd: head h, query i, key j
CU_HD size_t cu_att_boff(int h, int i, int j, int L) {
  return ((size_t)h * (size_t)L + (size_t)i) * (size_t)L + (size_t)j;
}
// key j is seen by query i
CU_HD bool cu_att_visible(int i, int j, int L, int causal) {
  return i < L && j < L && (!causal || j <= i);
}
// the last key (exclusive) any of the queries [i0, i0 + n) sees
CU_HD int cu_att_kend(int i0, int n, int L, int causal) {
  return causal ? (i0 + n < L ? i0 + n : L) : L;
}
// the first query tile (of CU_ATT_KT) that sees a key of [j0, ...)
CU_HD int cu_att_qstart(int j0, int causal) {
  return causal ? j0 / CU_ATT_KT * CU_ATT_KT : 0;
}
// the operand of a product: rounded to bf16 in the bf16 mode
CU_HD float cu_att_op(float x, bool bf) {
  return bf ? cu_bf16_round(x) : x;
}
// online softmax: what the running sum and output are scaled by when the max moves from mo to mn
CU_HD float cu_att_corr(float mo, float mn) {
  return mo == -INFINITY ? 0.0f : expf(mo - mn);
}
// a visible score's unnormalised probability against the running max mn
CU_HD float cu_att_p(float s, float mn, bool vis) {
  return vis ? expf(s - mn) : 0.0f;
}
// backward: P = exp(s - lse), dS = P (dP - D)
CU_HD float cu_att_prob(float s, float lse, bool vis) {
  return vis ? expf(s - lse) : 0.0f;
}
CU_HD float cu_att_ds(float p, float dp, float D) {
  return p * (dp - D);
}
// floats per shared row: hd in chunks of 32, plus one so that lanes reading rows do not collide
CU_HD int cu_att_sp(int hd) {
  return (hd + 31) / 32 * 32 + 1;
}

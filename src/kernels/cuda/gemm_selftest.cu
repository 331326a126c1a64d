// gemm_selftest.cu: the CUDA matrix products' and attention's arithmetic,
// checked on the host (no device needed; tests/test_cuda_gemm_host.c).
//
// It runs the very __host__ __device__ helpers the kernels use
// (gemm_map.cuh, attention_core.cuh):
//   - bf16 rounding against ct_f32_to_bf16 (ties, NaN, infinities, random bits);
//   - the row-major to column-major mapping handed to cuBLASLt, executed by a
//     naive column-major GEMM with cuBLASLt's operand semantics (first operand
//     the caller's B, second its A; layouts rows x cols with ld >= rows and
//     every read inside the stored matrix), against ct_sgemm for every
//     transpose pair, odd sizes, padded leading dimensions, alpha and beta;
//     and the bf16 row (operands cast into padded rows, as gemm.cu's cast
//     kernel writes them) against ct_sgemm_bf16;
//   - weight views dequantised (float32 and bf16 scratch) against ct_wview_at;
//   - the attention kernels' tile loops (16 rows per block, 32 per tile, the
//     same mask, online-softmax recurrence, bf16 rounding points and
//     two-pass deterministic backward) against ct_attention_flash_fwd/bwd,
//     float32 and bf16 (the CPU kernel's bf16 emulation, bf16 = 2).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_core.cuh"
#include "attention_tiles.cuh"
#include "conv_driver.cuh"

extern "C" {
#include "ctuner/bf16.h"
#include "ctuner/kernels.h"
}

namespace {

uint64_t rng = 0x9E3779B97F4A7C15ull;
uint32_t rnd32() {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 16);
}
float frand() {  // [-1, 1)
  return (float)((double)(rnd32() >> 8) / (double)(1u << 23) - 1.0);
}
float *randv(size_t n) {
  float *p = (float *)malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = frand();
  return p;
}

double rel_err(const float *a, const float *b, size_t n) {
  double md = 0, mb = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= md)) md = d;  // NaN sticks
    if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
  }
  return mb > 0 ? md / mb : md;
}

#define FAIL(...)                    \
  do {                               \
    snprintf(msg, cap, __VA_ARGS__); \
    return 1;                        \
  } while (0)

// ---- bf16 ----
int check_bf16(char *msg, size_t cap) {
  const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                              0x7F800001u, 0xFFFFFFFFu, 0x3F808000u, 0x3F818000u, 0x3F80FFFFu,
                              0x7F7FFFFFu, 0x00000001u, 0x00008000u, 0x00018000u, 0x7F7F8000u};
  for (uint32_t u : special) {
    float f;
    memcpy(&f, &u, 4);
    if (cu_bf16_bits(f) != ct_f32_to_bf16(f))
      FAIL("bf16 of bits %08x: %04x, ct_f32_to_bf16 %04x", u, cu_bf16_bits(f), ct_f32_to_bf16(f));
  }
  for (int n = 0; n < 200000; n++) {
    uint32_t u = rnd32() ^ (rnd32() << 16);
    float f;
    memcpy(&f, &u, 4);
    if (cu_bf16_bits(f) != ct_f32_to_bf16(f))
      FAIL("bf16 of bits %08x: %04x, ct_f32_to_bf16 %04x", u, cu_bf16_bits(f), ct_f32_to_bf16(f));
    float r = cu_bf16_round(f), w = ct_bf16_round(f);
    if (memcmp(&r, &w, 4) && !(isnan(r) && isnan(w)))
      FAIL("bf16 round of bits %08x: %g, ct_bf16_round %g", u, (double)r, (double)w);
  }
  return 0;
}

// ---- the mapping: cuBLASLt's column-major product, naively ----
// element (i, j) of a column-major stored matrix with leading dim ld
inline float cm(const float *X, int ld, int i, int j) {
  return X[(size_t)j * ld + i];
}

// D = alpha op(A1) op(B1) + beta C over column-major layouts, as cublasLtMatmul computes it
// (op(A1) m x k, op(B1) k x n); checks the layouts' shape rules first. Returns 0 or an error.
int colmajor_gemm(const cu_mm_map &p, float alpha, const float *A1, size_t a1_n, const float *B1,
                  size_t b1_n, float beta, float *C, size_t c_n, char *msg, size_t cap) {
  int ar = p.op_a ? p.k : p.m, ac = p.op_a ? p.m : p.k;
  int br = p.op_b ? p.n : p.k, bc = p.op_b ? p.k : p.n;
  if (ar != p.a_rows || ac != p.a_cols || br != p.b_rows || bc != p.b_cols || p.c_rows != p.m ||
      p.c_cols != p.n)
    FAIL("layout shapes disagree with the product (m %d n %d k %d)", p.m, p.n, p.k);
  if (p.lda < p.a_rows || p.ldb < p.b_rows || p.ldc < p.c_rows)
    FAIL("leading dimension below the rows (lda %d rows %d, ldb %d rows %d, ldc %d rows %d)", p.lda,
         p.a_rows, p.ldb, p.b_rows, p.ldc, p.c_rows);
  if ((size_t)(p.a_cols - 1) * p.lda + p.a_rows > a1_n ||
      (size_t)(p.b_cols - 1) * p.ldb + p.b_rows > b1_n ||
      (size_t)(p.c_cols - 1) * p.ldc + p.c_rows > c_n)
    FAIL("a layout reaches past its matrix (m %d n %d k %d)", p.m, p.n, p.k);
  for (int j = 0; j < p.n; j++)
    for (int i = 0; i < p.m; i++) {
      double acc = 0;
      for (int kk = 0; kk < p.k; kk++) {
        float a = p.op_a ? cm(A1, p.lda, kk, i) : cm(A1, p.lda, i, kk);
        float b = p.op_b ? cm(B1, p.ldb, j, kk) : cm(B1, p.ldb, kk, j);
        acc += (double)a * (double)b;
      }
      float *c = C + (size_t)j * p.ldc + i;
      *c = (float)(alpha * acc + (beta == 0.0f ? 0.0 : (double)beta * *c));
    }
  return 0;
}

// bf16 copy of a stored row-major operand into rows ld16 apart (gemm.cu's cast kernel)
float *cast_padded(int rows, int cols, const float *src, int ld, int *ld16) {
  *ld16 = (cols + 7) / 8 * 8;
  float *d = (float *)calloc((size_t)rows * *ld16 + 1, sizeof(float));
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++)
      d[(size_t)r * *ld16 + c] = cu_bf16_to_f32(cu_bf16_bits(src[(size_t)r * ld + c]));
  return d;
}

int check_mapping(char *msg, size_t cap) {
  const int shapes[][3] = {{5, 7, 3}, {1, 9, 4}, {13, 2, 11}, {8, 8, 8}, {17, 33, 1}, {3, 1, 40}};
  const float ab[][2] = {{1.0f, 0.0f}, {0.5f, 1.0f}, {-2.0f, 0.25f}};
  for (const auto &sh : shapes)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (const auto &c : ab)
          for (int bf = 0; bf < 2; bf++) {
            int M = sh[0], N = sh[1], K = sh[2];
            int ar, acn, br, bcn;
            cu_stored_a(ta, M, K, &ar, &acn);
            cu_stored_b(tb, N, K, &br, &bcn);
            int lda = acn + 3, ldb = bcn + 1, ldc = N + 2;  // padded, odd
            size_t na = (size_t)ar * lda, nb = (size_t)br * ldb, nc = (size_t)M * ldc;
            float *A = randv(na), *B = randv(nb), *C0 = randv(nc);
            float *Cr = (float *)malloc(nc * sizeof(float)), *Cg = (float *)malloc(nc * 4);
            memcpy(Cr, C0, nc * 4);
            memcpy(Cg, C0, nc * 4);
            (bf ? ct_sgemm_bf16 : ct_sgemm)(ta, tb, M, N, K, c[0], A, lda, B, ldb, c[1], Cr, ldc);
            int la = lda, lb = ldb;
            const float *Ao = A, *Bo = B;
            float *Ac = NULL, *Bc = NULL;
            if (bf) {  // gemm.cu: both operands cast into padded bf16 rows first
              Ao = Ac = cast_padded(ar, acn, A, lda, &la);
              Bo = Bc = cast_padded(br, bcn, B, ldb, &lb);
            }
            cu_mm_map p = cu_rowmajor_map(ta, tb, M, N, K, la, lb, ldc);
            size_t nao = bf ? (size_t)ar * la : na, nbo = bf ? (size_t)br * lb : nb;
            // the first operand is the caller's B, the second its A (gemm.cu's mm)
            int rc = colmajor_gemm(p, c[0], Bo, nbo, Ao, nao, c[1], Cg, nc, msg, cap);
            double e = rc ? 0 : rel_err(Cg, Cr, nc);
            free(A);
            free(B);
            free(C0);
            free(Cr);
            free(Cg);
            free(Ac);
            free(Bc);
            if (rc) return rc;
            if (!(e < 2e-6))
              FAIL(
                  "mapped product vs ct_sgemm%s: rel err %.3g (transA %d transB %d M %d N %d K %d "
                  "alpha %g beta %g)",
                  bf ? "_bf16" : "", e, ta, tb, M, N, K, (double)c[0], (double)c[1]);
          }
  // alignment as the heuristic is told it
  if (cu_align_of((void *)(uintptr_t)0x1000, 64) != 16 ||
      cu_align_of((void *)(uintptr_t)0x1004, 64) != 4 ||
      cu_align_of((void *)(uintptr_t)0x1000, 12) != 4 ||
      cu_align_of((void *)(uintptr_t)0x1008, 0) != 8)
    FAIL("cu_align_of");
  return 0;
}

// ---- weight views ----
int check_views(char *msg, size_t cap) {
  const int rows = 9, cols = 13;
  size_t n = (size_t)rows * cols;
  float *w = randv(n), *scales = randv(rows);
  uint16_t *wb = (uint16_t *)malloc(n * 2);
  int8_t *wq = (int8_t *)malloc(n);
  ct_to_bf16(n, w, wb);
  ct_quantize_int8(CT_QUANT_QUANTO, rows, cols, w, wq, scales);
  ct_wview vb = {CT_WDT_BF16, wb, NULL}, vq = {CT_WDT_I8, wq, scales}, vf = ct_wview_f32(w);
  const ct_wview *vs[] = {&vf, &vb, &vq};
  int bad = 0;
  for (const ct_wview *v : vs)
    for (int r = 0; r < rows && !bad; r++)
      for (int c = 0; c < cols && !bad; c++) {
        size_t i = (size_t)r * cols + c;
        float g = cu_wview_elem((int)v->dtype, v->data, v->scales, i, (size_t)r);
        float ref = ct_wview_at(*v, cols, r, c);
        // the bf16 scratch of the cuda-bf16 row: the dequantised value rounded once
        uint16_t g16 = cu_bf16_bits(g), r16 = ct_f32_to_bf16(ref);
        if (memcmp(&g, &ref, 4) || g16 != r16) {
          snprintf(msg, cap, "view %s (%d, %d): %g, ct_wview_at %g", ct_wdtype_name(v->dtype), r, c,
                   (double)g, (double)ref);
          bad = 1;
        }
      }
  free(w);
  free(scales);
  free(wb);
  free(wq);
  return bad;
}

// ---- attention: the kernels' tile loops on the host ----
struct att_in {
  int B, H, L, hd, causal;
  float scale;
  const float *q, *k, *v, *o, *lse, *dout;
};

// att_fwd_kernel: per block of CU_ATT_ROWS queries, per key tile of CU_ATT_KT
// bias: attention_bias_fwd's (H, L, L) scores bias, or NULL
void emu_fwd(const att_in &a, bool bf, float *o, float *lse, const float *bias) {
  int L = a.L, hd = a.hd;
  float *acc = (float *)malloc(sizeof(float) * hd), s[CU_ATT_KT];
  for (int bh = 0; bh < a.B * a.H; bh++)
    for (int i0 = 0; i0 < L; i0 += CU_ATT_ROWS) {
      int kend = cu_att_kend(i0, CU_ATT_ROWS, L, a.causal);
      for (int i = i0; i < i0 + CU_ATT_ROWS && i < L; i++) {
        float m = -INFINITY, l = 0.0f;
        for (int d = 0; d < hd; d++) acc[d] = 0.0f;
        const float *qi = a.q + cu_att_qoff(bh, i, L, hd);
        for (int j0 = 0; j0 < kend; j0 += CU_ATT_KT) {
          float mt = -INFINITY;
          for (int jl = 0; jl < CU_ATT_KT; jl++) {
            int j = j0 + jl;
            bool vis = cu_att_visible(i, j, L, a.causal);
            float x = bias && vis ? bias[cu_att_boff(bh % a.H, i, j, L)] : 0.0f;
            if (j < L) {
              const float *kj = a.k + cu_att_qoff(bh, j, L, hd);
              for (int d = 0; d < hd; d++)
                x = fmaf(cu_att_op(a.scale * qi[d], bf), cu_att_op(kj[d], bf), x);
            }
            s[jl] = x;
            if (vis) mt = fmaxf(mt, x);
          }
          float mn = fmaxf(m, mt), corr = cu_att_corr(m, mn), sum = 0.0f;
          for (int d = 0; d < hd; d++) acc[d] *= corr;
          for (int jl = 0; jl < CU_ATT_KT; jl++) {
            int j = j0 + jl;
            float p = cu_att_p(s[jl], mn, cu_att_visible(i, j, L, a.causal));
            sum += p;
            if (j < kend) {
              const float *vj = a.v + cu_att_qoff(bh, j, L, hd);
              for (int d = 0; d < hd; d++)
                acc[d] = fmaf(cu_att_op(p, bf), cu_att_op(vj[d], bf), acc[d]);
            }
          }
          l = l * corr + sum;
          m = mn;
        }
        int b = bh / a.H, h = bh % a.H;
        float *oi = o + cu_att_ooff(b, h, i, L, a.H, hd);
        for (int d = 0; d < hd; d++) oi[d] = acc[d] * (1.0f / l);
        if (lse) lse[(size_t)bh * L + i] = m + logf(l);
      }
    }
  free(acc);
}

// score and dP of query i and key j (both < L), as the backward kernels compute them
void emu_sdp(const att_in &a, bool bf, int bh, int i, int j, float *s, float *dp) {
  int L = a.L, hd = a.hd, b = bh / a.H, h = bh % a.H;
  const float *qi = a.q + cu_att_qoff(bh, i, L, hd), *kj = a.k + cu_att_qoff(bh, j, L, hd);
  const float *vj = a.v + cu_att_qoff(bh, j, L, hd);
  const float *oi = a.dout + cu_att_ooff(b, h, i, L, a.H, hd);
  float x = 0.0f, y = 0.0f;
  for (int d = 0; d < hd; d++) {
    x = fmaf(cu_att_op(a.scale * qi[d], bf), cu_att_op(kj[d], bf), x);
    y = fmaf(cu_att_op(oi[d], bf), cu_att_op(vj[d], bf), y);
  }
  *s = x;
  *dp = y;
}

// att_rowdot_kernel, att_dkdv_kernel, att_dq_kernel
void emu_bwd(const att_in &a, bool bf, float *dq, float *dk, float *dv) {
  int L = a.L, hd = a.hd, BH = a.B * a.H;
  float *D = (float *)malloc(sizeof(float) * (size_t)BH * L);
  for (int bh = 0; bh < BH; bh++)
    for (int i = 0; i < L; i++) {
      size_t off = cu_att_ooff(bh / a.H, bh % a.H, i, L, a.H, hd);
      double acc = 0;
      for (int d = 0; d < hd; d++) acc += (double)a.dout[off + d] * a.o[off + d];
      D[(size_t)bh * L + i] = (float)acc;
    }
  for (int bh = 0; bh < BH; bh++) {
    int b = bh / a.H, h = bh % a.H;
    for (int j0 = 0; j0 < L; j0 += CU_ATT_ROWS)  // dK, dV: one block per CU_ATT_ROWS keys
      for (int j = j0; j < j0 + CU_ATT_ROWS && j < L; j++) {
        float *gk = dk + cu_att_qoff(bh, j, L, hd), *gv = dv + cu_att_qoff(bh, j, L, hd);
        for (int d = 0; d < hd; d++) gk[d] = gv[d] = 0.0f;
        for (int q0 = cu_att_qstart(j0, a.causal); q0 < L; q0 += CU_ATT_KT)
          for (int i = q0; i < q0 + CU_ATT_KT && i < L; i++) {
            bool vis = cu_att_visible(i, j, L, a.causal);
            float s, dp;
            emu_sdp(a, bf, bh, i, j, &s, &dp);
            float p = cu_att_prob(s, a.lse[(size_t)bh * L + i], vis);
            float g = cu_att_ds(p, dp, D[(size_t)bh * L + i]);
            const float *qi = a.q + cu_att_qoff(bh, i, L, hd);
            const float *oi = a.dout + cu_att_ooff(b, h, i, L, a.H, hd);
            for (int d = 0; d < hd; d++) {
              float qd = bf ? cu_att_op(qi[d], true) : a.scale * qi[d];
              gv[d] = fmaf(cu_att_op(p, bf), cu_att_op(oi[d], bf), gv[d]);
              gk[d] = fmaf(cu_att_op(g, bf), qd, gk[d]);
            }
          }
        if (bf)
          for (int d = 0; d < hd; d++) gk[d] *= a.scale;
      }
    for (int i0 = 0; i0 < L; i0 += CU_ATT_ROWS) {  // dQ: one block per CU_ATT_ROWS queries
      int kend = cu_att_kend(i0, CU_ATT_ROWS, L, a.causal);
      for (int i = i0; i < i0 + CU_ATT_ROWS && i < L; i++) {
        float *gq = dq + cu_att_qoff(bh, i, L, hd);
        for (int d = 0; d < hd; d++) gq[d] = 0.0f;
        for (int j0 = 0; j0 < kend; j0 += CU_ATT_KT)
          for (int j = j0; j < j0 + CU_ATT_KT && j < kend; j++) {
            bool vis = cu_att_visible(i, j, L, a.causal);
            float s, dp;
            emu_sdp(a, bf, bh, i, j, &s, &dp);
            float p = cu_att_prob(s, a.lse[(size_t)bh * L + i], vis);
            float g = cu_att_op(cu_att_ds(p, dp, D[(size_t)bh * L + i]), bf);
            const float *kj = a.k + cu_att_qoff(bh, j, L, hd);
            for (int d = 0; d < hd; d++) gq[d] = fmaf(g, cu_att_op(kj[d], bf), gq[d]);
          }
        for (int d = 0; d < hd; d++) gq[d] *= a.scale;
      }
    }
  }
  free(D);
}

int check_attention(char *msg, size_t cap) {
  const int shapes[][5] = {{1, 2, 37, 7, 0},  {1, 2, 37, 7, 1},   {2, 1, 70, 16, 0},
                           {1, 3, 33, 64, 1}, {1, 1, 50, 40, 0},  {1, 1, 17, 256, 1},
                           {2, 2, 1, 5, 0},   {1, 1, 100, 32, 1}, {1, 2, 65, 128, 0}};
  for (const auto &sh : shapes)
    for (int bf = 0; bf < 2; bf++) {
      int B = sh[0], H = sh[1], L = sh[2], hd = sh[3], causal = sh[4];
      size_t n = (size_t)B * H * L * hd, nl = (size_t)B * H * L;
      float scale = 1.0f / sqrtf((float)hd);
      float *q = randv(n), *k = randv(n), *v = randv(n), *dout = randv(n);
      for (size_t i = 0; i < n; i++) q[i] *= 3.0f;  // peaked softmax rows too
      float *o_r = (float *)malloc(n * 4), *l_r = (float *)malloc(nl * 4);
      float *o_e = (float *)malloc(n * 4), *l_e = (float *)malloc(nl * 4);
      float *g_r = (float *)malloc(3 * n * 4), *g_e = (float *)malloc(3 * n * 4);
      int cpu_bf = bf ? 2 : 0;  // the CPU kernel's bf16 emulation (any CPU)
      ct_attention_flash_fwd(B, H, L, hd, scale, causal, q, k, v, o_r, l_r, cpu_bf);
      att_in a = {B, H, L, hd, causal, scale, q, k, v, o_r, l_r, dout};
      emu_fwd(a, bf != 0, o_e, l_e, NULL);
      ct_attention_flash_bwd(B, H, L, hd, scale, causal, q, k, v, o_r, l_r, dout, g_r, g_r + n,
                             g_r + 2 * n, cpu_bf);
      emu_bwd(a, bf != 0, g_e, g_e + n, g_e + 2 * n);
      // bf16: P is rounded against the running max, which depends on the key tile (32 here, 64
      // in the CPU kernel), so o differs by a bf16 rounding now and then; the backward rounds P
      // against the final lse and agrees as closely as float32
      double tol = 2e-5, tol_o = bf ? 1e-2 : tol;
      double eo = rel_err(o_e, o_r, n), el = rel_err(l_e, l_r, nl);
      double eq = rel_err(g_e, g_r, n), ek = rel_err(g_e + n, g_r + n, n);
      double ev = rel_err(g_e + 2 * n, g_r + 2 * n, n);
      free(q);
      free(k);
      free(v);
      free(dout);
      free(o_r);
      free(l_r);
      free(o_e);
      free(l_e);
      free(g_r);
      free(g_e);
      if (!(eo < tol_o && el < tol && eq < tol && ek < tol && ev < tol))
        FAIL(
            "attention %s B %d H %d L %d hd %d causal %d: rel err o %.3g lse %.3g dq %.3g dk "
            "%.3g dv %.3g (tol %g)",
            bf ? "bf16" : "float32", B, H, L, hd, causal, eo, el, eq, ek, ev, tol);
    }
  // attention_bias_fwd: the forward kernel with the bias, float32
  for (int L : {5, 37, 70}) {
    int B = 2, H = 3, hd = 9;
    size_t n = (size_t)B * H * L * hd;
    float *q = randv(n), *k = randv(n), *v = randv(n), *bias = randv((size_t)H * L * L);
    float *o_r = (float *)malloc(n * 4), *o_e = (float *)malloc(n * 4);
    ct_attention_bias_fwd(B, H, L, hd, 0.7f, bias, q, k, v, o_r);
    att_in a = {B, H, L, hd, 0, 0.7f, q, k, v, NULL, NULL, NULL};
    emu_fwd(a, false, o_e, NULL, bias);
    double e = rel_err(o_e, o_r, n);
    free(q);
    free(k);
    free(v);
    free(bias);
    free(o_r);
    free(o_e);
    if (!(e < 2e-5)) FAIL("attention_bias_fwd L %d: rel err %.3g", L, e);
  }
  return 0;
}

// ---- attention above 256 head dims: attention_tiles.cuh's driver with ct_sgemm ----
struct host_tiles_ops {
  void mm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
          int ldb, float beta, float *C, int ldc) {
    ct_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void softmax_rows(int n, int lk, int i0, int causal, float *S, float *lse) {
    for (int r = 0; r < n; r++) {
      float *s = S + (size_t)r * lk, m = -INFINITY, sum = 0.0f;
      int cnt = cu_att_row_keys(i0, r, lk, causal);
      for (int j = 0; j < cnt; j++) m = fmaxf(m, s[j]);
      for (int j = 0; j < cnt; j++) sum += expf(s[j] - m);
      for (int j = 0; j < lk; j++) s[j] = j < cnt ? expf(s[j] - m) * (1.0f / sum) : 0.0f;
      lse[r] = m + logf(sum);
    }
  }
  void grad_rows(int n, int lk, int i0, int causal, float *P, float *dP, const float *lse,
                 const float *D) {
    for (int r = 0; r < n; r++)
      for (int j = 0; j < lk; j++) {
        size_t e = (size_t)r * lk + j;
        float p = cu_att_prob(P[e], lse[r], j < cu_att_row_keys(i0, r, lk, causal));
        P[e] = p;
        dP[e] = cu_att_ds(p, dP[e], D[r]);
      }
  }
  void rowdot(int B, int H, int L, int hd, const float *o, const float *dout, float *D) {
    for (int bh = 0; bh < B * H; bh++)
      for (int i = 0; i < L; i++) {
        size_t off = cu_att_ooff(bh / H, bh % H, i, L, H, hd);
        float acc = 0.0f;
        for (int d = 0; d < hd; d++) acc = fmaf(dout[off + d], o[off + d], acc);
        D[(size_t)bh * L + i] = acc;
      }
  }
  void zero(float *p, size_t n) {
    memset(p, 0, n * sizeof(float));
  }
};

int check_attention_tiles(char *msg, size_t cap) {
  const int shapes[][6] = {{1, 1, 70, 300, 0, 16}, {2, 1, 45, 260, 1, 16}, {1, 2, 33, 20, 1, 7}};
  for (const auto &c : shapes) {
    int B = c[0], H = c[1], L = c[2], hd = c[3], causal = c[4], tq = c[5];
    size_t n = (size_t)B * H * L * hd, nl = (size_t)B * H * L;
    float scale = 1.0f / sqrtf((float)hd);
    float *q = randv(n), *k = randv(n), *v = randv(n), *dout = randv(n);
    float *o_r = (float *)malloc(n * 4), *l_r = (float *)malloc(nl * 4);
    float *o_e = (float *)malloc(n * 4), *l_e = (float *)malloc(nl * 4);
    float *g_r = (float *)malloc(3 * n * 4), *g_e = (float *)malloc(3 * n * 4);
    float *D = (float *)malloc(nl * 4), *P = (float *)malloc(2 * (size_t)tq * L * 4);
    ct_attention_tiles_fwd(B, H, L, hd, scale, causal, q, k, v, o_r, l_r);
    ct_attention_tiles_bwd(B, H, L, hd, scale, causal, q, k, v, o_r, l_r, dout, g_r, g_r + n,
                           g_r + 2 * n);
    host_tiles_ops ops;
    cu_att_tiles_fwd(ops, tq, B, H, L, hd, scale, causal, q, k, v, o_e, l_e, P);
    cu_att_tiles_bwd(ops, tq, B, H, L, hd, scale, causal, q, k, v, o_r, l_r, dout, g_e, g_e + n,
                     g_e + 2 * n, D, P, P + (size_t)tq * L);
    double e[5] = {rel_err(o_e, o_r, n), rel_err(l_e, l_r, nl), rel_err(g_e, g_r, n),
                   rel_err(g_e + n, g_r + n, n), rel_err(g_e + 2 * n, g_r + 2 * n, n)};
    free(q), free(k), free(v), free(dout), free(o_r), free(l_r), free(o_e), free(l_e);
    free(g_r), free(g_e), free(D), free(P);
    for (double x : e)
      if (!(x < 2e-5))
        FAIL(
            "attention tiles B %d H %d L %d hd %d causal %d: rel err o %.3g lse %.3g dq %.3g dk "
            "%.3g dv %.3g",
            B, H, L, hd, causal, e[0], e[1], e[2], e[3], e[4]);
  }
  return 0;
}

// ---- convolution: conv.cu's driver and element helpers with ct_sgemm ----
struct host_ops {
  void bias_planes(int B, int Cout, int HWo, const float *b, float *y) {
    for (size_t i = 0; i < (size_t)B * Cout * HWo; i++) y[i] = b[(i / (size_t)HWo) % (size_t)Cout];
  }
  void im2col(const cu_conv &s, const float *xb, int r0, int rows, float *col) {
    size_t n = (size_t)rows * s.Wo;
    for (size_t i = 0; i < (size_t)s.Cin * s.k * s.k * n; i++)
      col[i] = cu_im2col_at(s, xb, r0, (int)(i / n), (int)(i % n));
  }
  void col2im_acc(const cu_conv &s, const float *dcol, int r0, int rows, float *dxb) {
    for (int c = 0; c < s.Cin; c++)
      for (int i = 0; i < s.H; i++)
        for (int j = 0; j < s.W; j++)
          dxb[((size_t)c * s.H + i) * s.W + j] += cu_col2im_at(s, dcol, r0, rows, c, i, j);
  }
  void zero(float *p, size_t n) {
    memset(p, 0, n * sizeof(float));
  }
  void db_acc(int B, int Cout, int HWo, const float *dy, float *db) {
    for (int o = 0; o < Cout; o++) {
      double acc = 0;
      for (int bi = 0; bi < B; bi++)
        for (int p = 0; p < HWo; p++) acc += dy[((size_t)bi * Cout + o) * HWo + p];
      db[o] = (float)((double)db[o] + acc);
    }
  }
  void mm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
          int ldb, float beta, float *C, int ldc) {
    ct_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
};

int check_conv(char *msg, size_t cap) {
  // B Cin H W Cout k stride pad_t pad_l pad_b pad_r, and a band size (col floats) or 0
  const int shapes[][12] = {
      {2, 3, 9, 7, 4, 3, 1, 1, 1, 1, 1, 0},  {2, 3, 9, 7, 4, 3, 1, 1, 1, 1, 1, 60},
      {1, 2, 8, 8, 3, 3, 2, 0, 0, 1, 1, 40}, {2, 5, 6, 5, 3, 1, 1, 0, 0, 0, 0, 0},
      {1, 3, 7, 9, 2, 4, 2, 1, 2, 2, 1, 50}, {1, 1, 5, 5, 1, 5, 1, 2, 2, 2, 2, 0}};
  const char *old = getenv("CTUNER_CONV_COL_FLOATS");
  int rc = 0;
  for (const auto &c : shapes) {
    ct_conv2d_shape s = {c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10]};
    char band[32];
    snprintf(band, sizeof band, "%d", c[11]);
    if (c[11])
      setenv("CTUNER_CONV_COL_FLOATS", band, 1);
    else
      unsetenv("CTUNER_CONV_COL_FLOATS");
    cu_conv g = cu_conv_of(&s);
    size_t nx = (size_t)s.B * s.Cin * s.H * s.W, ny = (size_t)s.B * s.Cout * g.Ho * g.Wo;
    size_t nw = (size_t)s.Cout * s.Cin * s.k * s.k, ncol = ct_conv2d_col_floats(&s);
    float *x = randv(nx), *w = randv(nw), *b = randv(s.Cout), *dy = randv(ny);
    float *col = (float *)malloc((ncol + 1) * 4);
    float *y_r = (float *)malloc(ny * 4), *y_e = (float *)malloc(ny * 4);
    float *dx_r = randv(nx), *dx_e = (float *)malloc(nx * 4);
    float *dw_r = randv(nw), *dw_e = (float *)malloc(nw * 4);
    float *db_r = randv(s.Cout), *db_e = (float *)malloc(s.Cout * 4);
    memcpy(dw_e, dw_r, nw * 4);
    memcpy(db_e, db_r, s.Cout * 4);
    memcpy(dx_e, dx_r, nx * 4);  // overwritten by both
    ct_conv2d_fwd(&s, x, w, b, y_r, col);
    host_ops ops;
    cu_conv_fwd_drive(ops, &s, x, w, b, y_e, col);
    ct_conv2d_bwd(&s, x, w, dy, dx_r, dw_r, db_r, col);
    cu_conv_bwd_drive(ops, &s, x, w, dy, dx_e, dw_e, db_e, col);
    double ey = rel_err(y_e, y_r, ny), ex = rel_err(dx_e, dx_r, nx);
    double ew = rel_err(dw_e, dw_r, nw), eb = rel_err(db_e, db_r, s.Cout);
    free(x), free(w), free(b), free(dy), free(col), free(y_r), free(y_e), free(dx_r), free(dx_e);
    free(dw_r), free(dw_e), free(db_r), free(db_e);
    if (!(ey < 1e-6 && ex < 1e-6 && ew < 1e-6 && eb < 1e-6)) {
      snprintf(msg, cap,
               "conv2d Cin %d H %d W %d Cout %d k %d stride %d pads %d %d %d %d band %d: rel err y "
               "%.3g dx %.3g dw %.3g db %.3g",
               s.Cin, s.H, s.W, s.Cout, s.k, s.stride, s.pad_t, s.pad_l, s.pad_b, s.pad_r, c[11],
               ey, ex, ew, eb);
      rc = 1;
      break;
    }
  }
  if (old)
    setenv("CTUNER_CONV_COL_FLOATS", old, 1);
  else
    unsetenv("CTUNER_CONV_COL_FLOATS");
  return rc;
}

}  // namespace

extern "C" int ct_cu_gemm_selftest_host(char *msg, size_t cap) {
  if (msg && cap) msg[0] = 0;
  char local[512];
  if (!msg || !cap) {
    msg = local;
    cap = sizeof local;
  }
  if (check_bf16(msg, cap)) return 1;
  if (check_mapping(msg, cap)) return 2;
  if (check_views(msg, cap)) return 3;
  if (check_attention(msg, cap)) return 4;
  if (check_conv(msg, cap)) return 5;
  if (check_attention_tiles(msg, cap)) return 6;
  return 0;
}

/* The fused attention's tile kernels and task loops, instantiated once per ISA
 * by attention_flash.c (private; included with FA_ISA, the target attribute,
 * FA_SUFFIX, the name suffix, the register-tile heights FA_MRS, FA_MR4,
 * FA_MR2, FA_MR1, and the lane vector FA_VT / FA_VTI of FA_W floats
 * defined). The design and numerics are in attention_flash.c.
 *
 * The float32 hot loops (scores, acc, online softmax, probs_grad) work on
 * FA_VT: v16 (one zmm) with AVX-512 and on plain x86-64, v8 (one ymm) with
 * AVX2 — GCC lowers 64-byte vectors badly without AVX-512 (splats and
 * accumulators through the stack: the AVX2 kernels ran at ~2 GFLOP/s). The
 * rest (packing, the bf16 emulation) stays on v16. Every operation is
 * elementwise in a fixed order, whatever the lane count, so the
 * instantiations with FMA (AVX-512, AVX2) give the same bits. Helpers are
 * defined here, not shared, so each one is compiled (and inlined) for its
 * instantiation's ISA.
 */
#define FA_NQ (BQ / FA_W) /* vectors per BQ-lane row */
#define FA_CAT2(a, b) a##_##b
#define FA_CAT(a, b) FA_CAT2(a, b)
#define FN(x) FA_CAT(x, FA_SUFFIX)

FA_ISA static inline FA_VT FN(vmax)(FA_VT a, FA_VT b) {
  FA_VTI m = a > b;
  return (FA_VT)((m & (FA_VTI)a) | (~m & (FA_VTI)b));
}

FA_ISA static inline FA_VT FN(vmin)(FA_VT a, FA_VT b) {
  FA_VTI m = a < b;
  return (FA_VT)((m & (FA_VTI)a) | (~m & (FA_VTI)b));
}

/* ct_expf's algorithm (fastmath.h) on FA_W lanes: e^x, 0 below ln(FLT_MIN)
 * (so -inf gives 0), saturating above 88.376. */
FA_ISA static inline FA_VT FN(vexp)(FA_VT x) {
  const FA_VT zero = {0};
  FA_VTI below = x < (zero + CT_EXP_LO);
  FA_VT xc = FN(vmin)(FN(vmax)(x, zero + CT_EXP_LO), zero + CT_EXP_HI);
  FA_VT n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  FA_VT r = xc - n * 0.693145751953125f;
  r = r - n * 1.428606820309417e-06f;
  FA_VT p = r * 1.9841270e-04f + 1.3888889e-03f;
  p = p * r + 8.3333333e-03f;
  p = p * r + 4.1666667e-02f;
  p = p * r + 1.6666667e-01f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  FA_VTI e = (__builtin_convertvector(n, FA_VTI) + 127) << 23;
  FA_VT y = p * (FA_VT)e;
  return (FA_VT)(~below & (FA_VTI)y);
}

/* sum_c a[c] b[c] over c < n: 16 lanes (zero-padded tail), then a fixed tree. */
FA_ISA static float FN(row_dot)(int n, const float *a, const float *b) {
  v16 acc = {0};
  int c = 0;
  for (; c + 16 <= n; c += 16) acc += LOAD(a + c) * LOAD(b + c);
  if (c < n) {
    float ta[16] = {0}, tb[16] = {0};
    memcpy(ta, a + c, sizeof(float) * (size_t)(n - c));
    memcpy(tb, b + c, sizeof(float) * (size_t)(n - c));
    acc += LOAD(ta) * LOAD(tb);
  }
  float l[16];
  memcpy(l, &acc, sizeof l);
  for (int i = 0; i < 8; i++) l[i] += l[i + 8];
  for (int i = 0; i < 4; i++) l[i] += l[i + 4];
  return (l[0] + l[2]) + (l[1] + l[3]);
}

/* One stage of a 16 x 16 transpose: swap the off-diagonal b x b blocks of
 * every 2b x 2b block (rows r and r + b for r & b == 0). */
#define FA_TSTAGE(R, b, lo, hi)             \
  for (int r = 0; r < 16; r++)              \
    if (!(r & (b))) {                       \
      v16 a_ = R[r], c_ = R[r + (b)];       \
      R[r] = FA_SHUFFLE2(a_, c_, lo);       \
      R[r + (b)] = FA_SHUFFLE2(a_, c_, hi); \
    }

/* T[d][i] = s X[i][d] for i < n, 0 for n <= i < BQ (X rows of leading dim
 * ld): 16 x 16 blocks transposed in registers; a head dim that is not a
 * multiple of 16 takes the scalar loop for its last columns. */
FA_ISA static void FN(pack_t)(int n, int hd, const float *X, size_t ld, float s, float *T) {
  static const v16i lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  static const v16i hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  static const v16i lo4 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
  static const v16i hi4 = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31};
  static const v16i lo2 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
  static const v16i hi2 = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
  static const v16i lo1 = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
  static const v16i hi1 = {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};
  int d16 = hd / 16 * 16;
  for (int ib = 0; ib < BQ; ib += 16)
    for (int d0 = 0; d0 < d16; d0 += 16) {
      v16 R[16];
      for (int r = 0; r < 16; r++)
        R[r] = ib + r < n ? LOAD(X + (size_t)(ib + r) * ld + d0) * s : (v16){0};
      FA_TSTAGE(R, 8, lo8, hi8)
      FA_TSTAGE(R, 4, lo4, hi4)
      FA_TSTAGE(R, 2, lo2, hi2)
      FA_TSTAGE(R, 1, lo1, hi1)
      for (int c = 0; c < 16; c++) STORE(T + (size_t)(d0 + c) * BQ + ib, R[c]);
    }
  for (int d = d16; d < hd; d++) {
    float *t = T + (size_t)d * BQ;
    for (int i = 0; i < n; i++) t[i] = s * X[(size_t)i * ld + d];
    for (int i = n; i < BQ; i++) t[i] = 0.0f;
  }
}
#undef FA_TSTAGE

/* S[j][0:BQ] = sum_d K[j][d] T[d][0:BQ] for j < nk: K rows (leading dim ldk)
 * times a transposed, BQ-lane tile T (hd x BQ). FA_MRS rows of S in
 * registers, FA_NQ vectors each; the last block repeats row nk - 1 rather
 * than branch. */
FA_ISA static void FN(scores)(int nk, int hd, const float *K, size_t ldk, const float *T,
                              float *S) {
  for (int j0 = 0; j0 < nk; j0 += FA_MRS) {
    const float *kr[FA_MRS];
    FA_VT acc[FA_MRS][FA_NQ];
#pragma GCC unroll 16
    for (int r = 0; r < FA_MRS; r++) {
      int j = j0 + r < nk ? j0 + r : nk - 1;
      kr[r] = K + (size_t)j * ldk;
#pragma GCC unroll 4
      for (int u = 0; u < FA_NQ; u++) acc[r][u] = (FA_VT){0};
    }
    for (int d = 0; d < hd; d++) {
      FA_VT t[FA_NQ];
#pragma GCC unroll 4
      for (int u = 0; u < FA_NQ; u++) {
        t[u] = LOADV(T + (size_t)d * BQ + u * FA_W);
        FA_PIN(t[u]);
      }
#pragma GCC unroll 16
      for (int r = 0; r < FA_MRS; r++) {
        float a = kr[r][d];
#pragma GCC unroll 4
        for (int u = 0; u < FA_NQ; u++) acc[r][u] += a * t[u];
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < FA_MRS; r++)
      if (j0 + r < nk) {
#pragma GCC unroll 4
        for (int u = 0; u < FA_NQ; u++) STOREV(S + (size_t)(j0 + r) * BQ + u * FA_W, acc[r][u]);
      }
  }
}

/* ---- bf16 products (g->bf16): operands rounded to bf16 (nearest even) and
 * stored as pairs in 32-bit words, low half first, the layout vdpbf16ps
 * reads; products summed in float32 as vdpbf16ps does (high pair's product
 * added first, then the low one's; both exact, so one FMA each gives the
 * same bits as the instruction on normal numbers). */

FA_ISA static inline v16u FN(bf16_bits)(v16 x) { /* bf16 of x in the low 16 bits */
  v16u u = (v16u)x;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

/* y[0:w] = bf16(x[0:hd]), zeros in [hd, w) (w a multiple of 16). */
FA_ISA static void FN(to_bf16)(int hd, int w, const float *x, uint16_t *y) {
  int d = 0;
  for (; d + 16 <= hd; d += 16) {
    v16h h = __builtin_convertvector(FN(bf16_bits)(LOAD(x + d)), v16h);
    memcpy(y + d, &h, sizeof h);
  }
  for (; d < w; d++) {
    float v = d < hd ? x[d] : 0.0f;
    v16 t = (v16){0} + v;
    y[d] = (uint16_t)FN(bf16_bits)(t)[0];
  }
}

/* T2[p][i] = pair(T[2p][i], T[2p + 1][i]) for p < w / 2, rows past hd zero. */
FA_ISA static void FN(pack_pairs)(int hd, int w, const float *T, uint32_t *T2) {
  for (int p = 0; p < w / 2; p++)
    for (int h = 0; h < BQ; h += 16) {
      v16 x0 = 2 * p < hd ? LOAD(T + (size_t)2 * p * BQ + h) : (v16){0};
      v16 x1 = 2 * p + 1 < hd ? LOAD(T + (size_t)(2 * p + 1) * BQ + h) : (v16){0};
      v16u wd = FN(bf16_bits)(x0) | (FN(bf16_bits)(x1) << 16);
      memcpy(T2 + (size_t)p * BQ + h, &wd, sizeof wd);
    }
}

/* As FN(scores) on bf16 pairs: S[j][0:BQ] = sum_p K2[j][p] . T2[p][0:BQ]. */
FA_ISA static void FN(scores_bf16)(int nk, int np, const uint32_t *K2, size_t ldk2,
                                   const uint32_t *T2, float *S) {
  for (int j0 = 0; j0 < nk; j0 += FA_MRS) {
    const uint32_t *kr[FA_MRS];
    v16 a0[FA_MRS], a1[FA_MRS];
#pragma GCC unroll 16
    for (int r = 0; r < FA_MRS; r++) {
      int j = j0 + r < nk ? j0 + r : nk - 1;
      kr[r] = K2 + (size_t)j * ldk2;
      a0[r] = a1[r] = (v16){0};
    }
    for (int p = 0; p < np; p++) {
      v16u t0, t1;
      memcpy(&t0, T2 + (size_t)p * BQ, sizeof t0);
      memcpy(&t1, T2 + (size_t)p * BQ + 16, sizeof t1);
      v16 l0 = (v16)(t0 << 16), h0 = (v16)(t0 & 0xFFFF0000u);
      v16 l1 = (v16)(t1 << 16), h1 = (v16)(t1 & 0xFFFF0000u);
#pragma GCC unroll 16
      for (int r = 0; r < FA_MRS; r++) {
        uint32_t wl = kr[r][p] << 16, wh = kr[r][p] & 0xFFFF0000u;
        float al, ah;
        memcpy(&al, &wl, sizeof al);
        memcpy(&ah, &wh, sizeof ah);
        a0[r] += ah * h0;
        a0[r] += al * l0;
        a1[r] += ah * h1;
        a1[r] += al * l1;
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < FA_MRS; r++)
      if (j0 + r < nk) {
        STORE(S + (size_t)(j0 + r) * BQ, a0[r]);
        STORE(S + (size_t)(j0 + r) * BQ + 16, a1[r]);
      }
  }
}

/* S = K_tile T: float32, or (g->bf16) K's rows rounded into K2 and the
 * pairs T2 (made by the caller from T) through vdpbf16ps or its emulation. */
FA_ISA static void FN(scores_sel)(const fa_shape *g, int nk, const float *K, size_t ldk,
                                  const float *T, const uint32_t *T2, uint32_t *K2, float *S) {
  if (!g->bf16) {
    FN(scores)(nk, g->hd, K, ldk, T, S);
    return;
  }
  int w = g->hdp;
  for (int j = 0; j < nk; j++)
    FN(to_bf16)(g->hd, w, K + (size_t)j * ldk, (uint16_t *)(K2 + (size_t)j * (w / 2)));
  if (g->bf16 == 1 && fa_bf16_hw)
    scores_bf16_hw(nk, w / 2, K2, w / 2, T2, S);
  else
    FN(scores_bf16)(nk, w / 2, K2, w / 2, T2, S);
}

/* C[i][c0 : c0 + 16 NV] = rs[i] C[i][...] + sum_{k<n} A(i, k) Bm[k][...]
 * (rs given, alpha ignored) or C[i][...] + alpha sum_k ... (rs NULL) for
 * i < rows, A(i, k) = A[i ars + k acs] (so A may be stored transposed). MR
 * rows x 16 NV / FA_W vectors of C in registers. */
#define FA_ACC(NV, MR)                                                                            \
  FA_ISA static void FN(acc##NV)(int rows, int n, int c0, const float *A, size_t ars, size_t acs, \
                                 const float *Bm, size_t ldb, float *C, size_t ldc,               \
                                 const float *rs, float alpha) {                                  \
    enum { NW = 16 * (NV) / FA_W };                                                               \
    for (int i0 = 0; i0 < rows; i0 += MR) {                                                       \
      const float *ar[MR];                                                                        \
      float *cr[MR];                                                                              \
      FA_VT acc[MR][NW];                                                                          \
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                     \
        int i = i0 + r < rows ? i0 + r : rows - 1;                                                \
        ar[r] = A + (size_t)i * ars;                                                              \
        cr[r] = C + (size_t)i * ldc + c0;                                                         \
        _Pragma("GCC unroll 8") for (int v = 0; v < NW; v++) acc[r][v] = (FA_VT){0};              \
      }                                                                                           \
      for (int k = 0; k < n; k++) {                                                               \
        const float *b = Bm + (size_t)k * ldb + c0;                                               \
        FA_VT bv[NW];                                                                             \
        _Pragma("GCC unroll 8") for (int v = 0; v < NW; v++) {                                    \
          bv[v] = LOADV(b + FA_W * v);                                                            \
          FA_PIN(bv[v]);                                                                          \
        }                                                                                         \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                   \
          float a = ar[r][(size_t)k * acs];                                                       \
          _Pragma("GCC unroll 8") for (int v = 0; v < NW; v++) acc[r][v] += a * bv[v];            \
        }                                                                                         \
      }                                                                                           \
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                     \
        if (i0 + r >= rows) break;                                                                \
        float s = rs ? rs[i0 + r] : 0.0f;                                                         \
        _Pragma("GCC unroll 8") for (int v = 0; v < NW; v++) {                                    \
          FA_VT c = LOADV(cr[r] + FA_W * v);                                                      \
          /* one product per branch: FMA contraction has one choice */                            \
          if (rs)                                                                                 \
            c = c * s + acc[r][v];                                                                \
          else                                                                                    \
            c = acc[r][v] * alpha + c;                                                            \
          STOREV(cr[r] + FA_W * v, c);                                                            \
        }                                                                                         \
      }                                                                                           \
    }                                                                                             \
  }
FA_ACC(4, FA_MR4)
FA_ACC(2, FA_MR2)
FA_ACC(1, FA_MR1)
#undef FA_ACC

/* FN(acc4/2/1) over columns [0, w) of C and Bm, w a multiple of 16. */
FA_ISA static void FN(acc)(int rows, int n, int w, const float *A, size_t ars, size_t acs,
                           const float *Bm, size_t ldb, float *C, size_t ldc, const float *rs,
                           float alpha) {
  int c0 = 0;
  for (; c0 + 64 <= w; c0 += 64) FN(acc4)(rows, n, c0, A, ars, acs, Bm, ldb, C, ldc, rs, alpha);
  if (c0 + 32 <= w) {
    FN(acc2)(rows, n, c0, A, ars, acs, Bm, ldb, C, ldc, rs, alpha);
    c0 += 32;
  }
  if (c0 + 16 <= w) FN(acc1)(rows, n, c0, A, ars, acs, Bm, ldb, C, ldc, rs, alpha);
}

/* As FN(acc) (rs given) on bf16 pairs: C[i][c0 : c0 + 16 NV] = rs[i] C[i][...]
 * + sum_{p<np} A2(i, p) . B2[p][...], A2(i, p) = A2[i ars + p acs] a pair of
 * k, B2 rows of pair words (leading dim ldb). */
#define FA_ACCB(NV, MR)                                                                     \
  FA_ISA static void FN(accb##NV)(int rows, int np, int c0, const uint32_t *A2, size_t ars, \
                                  size_t acs, const uint32_t *B2, size_t ldb, float *C,     \
                                  size_t ldc, const float *rs, float alpha) {               \
    for (int i0 = 0; i0 < rows; i0 += MR) {                                                 \
      const uint32_t *ar[MR];                                                               \
      float *cr[MR];                                                                        \
      v16 acc[MR][NV];                                                                      \
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                               \
        int i = i0 + r < rows ? i0 + r : rows - 1;                                          \
        ar[r] = A2 + (size_t)i * ars;                                                       \
        cr[r] = C + (size_t)i * ldc + c0;                                                   \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] = (v16){0};          \
      }                                                                                     \
      for (int p = 0; p < np; p++) {                                                        \
        const uint32_t *b = B2 + (size_t)p * ldb + c0;                                      \
        v16 bl[NV], bh[NV];                                                                 \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {                              \
          v16u t;                                                                           \
          memcpy(&t, b + 16 * v, sizeof t);                                                 \
          bl[v] = (v16)(t << 16);                                                           \
          bh[v] = (v16)(t & 0xFFFF0000u);                                                   \
        }                                                                                   \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                             \
          uint32_t wd = ar[r][(size_t)p * acs], wl = wd << 16, wh = wd & 0xFFFF0000u;       \
          float al, ah;                                                                     \
          memcpy(&al, &wl, sizeof al);                                                      \
          memcpy(&ah, &wh, sizeof ah);                                                      \
          _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {                            \
            acc[r][v] += ah * bh[v];                                                        \
            acc[r][v] += al * bl[v];                                                        \
          }                                                                                 \
        }                                                                                   \
      }                                                                                     \
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                               \
        if (i0 + r >= rows) break;                                                          \
        float s = rs ? rs[i0 + r] : 0.0f;                                                   \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {                              \
          v16 c = LOAD(cr[r] + 16 * v);                                                     \
          if (rs)                                                                           \
            c = c * s + acc[r][v];                                                          \
          else                                                                              \
            c = acc[r][v] * alpha + c;                                                      \
          STORE(cr[r] + 16 * v, c);                                                         \
        }                                                                                   \
      }                                                                                     \
    }                                                                                       \
  }
FA_ACCB(4, FA_MR4)
FA_ACCB(2, FA_MR2)
FA_ACCB(1, FA_MR1)
#undef FA_ACCB

/* X2[p][0:w] = pair(X[2p][...], X[2p + 1][...]) for p < (n + 1) / 2, a row
 * past n zero (X rows of leading dim ld, w a multiple of 16). */
FA_ISA static void FN(pack_pairs_rows)(int n, int w, const float *X, size_t ld, uint32_t *X2) {
  for (int p = 0; p < (n + 1) / 2; p++)
    for (int c = 0; c < w; c += 16) {
      v16 x0 = LOAD(X + (size_t)2 * p * ld + c);
      v16 x1 = 2 * p + 1 < n ? LOAD(X + (size_t)(2 * p + 1) * ld + c) : (v16){0};
      v16u wd = FN(bf16_bits)(x0) | (FN(bf16_bits)(x1) << 16);
      memcpy(X2 + (size_t)p * w + c, &wd, sizeof wd);
    }
}

/* FN(acc) on bf16 pairs over columns [0, w): vdpbf16ps or its emulation. */
FA_ISA static void FN(accb)(const fa_shape *g, int rows, int np, const uint32_t *A2, size_t ars,
                            size_t acs, const uint32_t *B2, float *C, size_t ldc, const float *rs,
                            float alpha) {
  int w = g->hdp, c0 = 0, hw = g->bf16 == 1 && fa_bf16_hw;
  for (; c0 + 64 <= w; c0 += 64)
    if (hw)
      accb4_hw(rows, np, c0, A2, ars, acs, B2, w, C, ldc, rs, alpha);
    else
      FN(accb4)(rows, np, c0, A2, ars, acs, B2, w, C, ldc, rs, alpha);
  if (c0 + 32 <= w) {
    if (hw)
      accb2_hw(rows, np, c0, A2, ars, acs, B2, w, C, ldc, rs, alpha);
    else
      FN(accb2)(rows, np, c0, A2, ars, acs, B2, w, C, ldc, rs, alpha);
    c0 += 32;
  }
  if (c0 + 16 <= w) {
    if (hw)
      accb1_hw(rows, np, c0, A2, ars, acs, B2, w, C, ldc, rs, alpha);
    else
      FN(accb1)(rows, np, c0, A2, ars, acs, B2, w, C, ldc, rs, alpha);
  }
}

/* O = corr O + P V_tile with P (in S, transposed) and V's rows rounded to
 * bf16 pairs of keys. */
FA_ISA static void FN(pv_bf16)(const fa_shape *g, int nq, int nk, const float *S, const float *V,
                               size_t ldv, uint32_t *P2, uint32_t *V2, float *O,
                               const float *corr) {
  int np = (nk + 1) / 2;
  FN(pack_pairs)(nk, 2 * np, S, P2);
  FN(pack_pairs_rows)(nk, g->hdp, V, ldv, V2);
  FN(accb)(g, nq, np, P2, 1, BQ, V2, O, g->hdp, corr, 1.0f);
}

/* The backward's dV += P^T dO, dK += scale dS^T Q, dQ += scale dS K on bf16
 * pairs: P and dS (nk x BQ, rows of keys) as pairs of queries for dV and dK
 * and as pairs of keys for dQ; dO, Q and K's rows as row pairs. */
FA_ISA static void FN(grads_bf16)(const fa_shape *g, int nq, int nk, const float *S,
                                  const float *dS, const float *dO, size_t lddo, const float *Q,
                                  const float *K, size_t ldk, float *dV, float *dK, float *dQ,
                                  uint32_t *A2, uint32_t *B2) {
  int w = g->hdp, pq = (nq + 1) / 2, pk = (nk + 1) / 2;
  for (int j = 0; j < nk; j++) /* a row's query lanes past nq are zeroed */
    FN(to_bf16)(nq, BQ, S + (size_t)j * BQ, (uint16_t *)(A2 + (size_t)j * BQ / 2));
  FN(pack_pairs_rows)(nq, w, dO, lddo, B2);
  FN(accb)(g, nk, pq, A2, BQ / 2, 1, B2, dV, w, NULL, 1.0f);
  for (int j = 0; j < nk; j++)
    FN(to_bf16)(nq, BQ, dS + (size_t)j * BQ, (uint16_t *)(A2 + (size_t)j * BQ / 2));
  FN(pack_pairs_rows)(nq, w, Q, ldk, B2);
  FN(accb)(g, nk, pq, A2, BQ / 2, 1, B2, dK, w, NULL, g->scale);
  FN(pack_pairs)(nk, 2 * pk, dS, A2);
  FN(pack_pairs_rows)(nk, w, K, ldk, B2);
  FN(accb)(g, nq, pk, A2, 1, BQ, B2, dQ, w, NULL, g->scale);
}

/* Causal: S[j][i] = -inf where key j0 + j comes after query i0 + i. */
FA_ISA static void FN(mask)(int nk, int nq, int i0, int j0, float *S) {
  if (j0 + nk - 1 <= i0) return;
  for (int j = 0; j < nk; j++)
    for (int i = 0; i < nq; i++)
      if (j0 + j > i0 + i) S[(size_t)j * BQ + i] = -INFINITY;
}

/* One query tile's online softmax over one key tile, in place: S becomes
 * P = exp(S - m_new) with m_new = max(m, column max of S); corr = exp(m -
 * m_new) rescales what l and O hold; l = corr l + column sums of P. */
FA_ISA static void FN(online_softmax)(int nk, float *S, float *m, float *l, float *corr) {
  for (int h = 0; h < BQ; h += FA_W) {
    FA_VT mo = LOADV(m + h), mx = mo;
    for (int j = 0; j < nk; j++) mx = FN(vmax)(mx, LOADV(S + (size_t)j * BQ + h));
    FA_VT sum = {0};
    for (int j = 0; j < nk; j++) {
      FA_VT p = FN(vexp)(LOADV(S + (size_t)j * BQ + h) - mx);
      STOREV(S + (size_t)j * BQ + h, p);
      sum += p;
    }
    FA_VT c = FN(vexp)(mo - mx);
    STOREV(corr + h, c);
    FA_VT lv = LOADV(l + h) * c + sum;
    STOREV(l + h, lv);
    STOREV(m + h, mx);
  }
}

/* One forward task: query rows [i0, i0 + nq) of head bh. */
FA_ISA static void FN(fwd_task)(const fa_shape *g, const fa_fwd_io *io, int bh, int i0, float *ws) {
  int hd = g->hd, w = g->hdp, nq = imin(BQ, g->L - i0);
  int kend = g->causal ? i0 + nq : g->L;
  size_t hoff = (size_t)bh * g->L * hd;
  float *T = ws, *S = T + (size_t)hd * BQ, *O = S + (size_t)BK * BQ, *m = O + (size_t)BQ * w;
  float *l = m + BQ, *corr = l + BQ;
  uint32_t *T2 = (uint32_t *)(corr + BQ), *K2 = T2 + (size_t)w / 2 * BQ;
  uint32_t *P2 = K2 + (size_t)BK * w / 2, *V2 = P2 + (size_t)BK / 2 * BQ;
  float *vpad = (float *)(V2 + (size_t)BK / 2 * w);
  const float *V = io->v + hoff;
  size_t ldv = hd;
  if (w != hd) { /* rows of V are read 16 floats at a time: pad them */
    pad_rows(kend, hd, V, hd, w, vpad);
    V = vpad;
    ldv = w;
  }
  prefetch_rows(nq, hd, io->q + hoff + (size_t)i0 * hd, hd);
  prefetch_rows(kend, hd, io->k + hoff, hd);
  prefetch_rows(kend, hd, V, ldv);
  FN(pack_t)(nq, hd, io->q + hoff + (size_t)i0 * hd, hd, g->scale, T);
  if (g->bf16) FN(pack_pairs)(hd, w, T, T2);
  memset(O, 0, sizeof(float) * (size_t)BQ * w);
  for (int i = 0; i < BQ; i++) m[i] = -INFINITY, l[i] = 0.0f;
  for (int j0 = 0; j0 < kend; j0 += BK) {
    int nk = imin(BK, kend - j0);
    FN(scores_sel)(g, nk, io->k + hoff + (size_t)j0 * hd, hd, T, T2, K2, S);
    if (g->causal) FN(mask)(nk, nq, i0, j0, S);
    FN(online_softmax)(nk, S, m, l, corr);
    if (g->bf16)
      FN(pv_bf16)(g, nq, nk, S, V + (size_t)j0 * ldv, ldv, P2, V2, O, corr);
    else
      FN(acc)(nq, nk, w, S, 1, BQ, V + (size_t)j0 * ldv, ldv, O, w, corr, 1.0f);
  }
  int b = bh / g->H, h = bh % g->H;
  size_t ldo = (size_t)g->H * hd;
  for (int i = 0; i < nq; i++) {
    float inv = 1.0f / l[i], *oi = io->o + ((size_t)b * g->L + i0 + i) * ldo + (size_t)h * hd;
    for (int d = 0; d < hd; d++) oi[d] = O[(size_t)i * w + d] * inv;
    io->lse[(size_t)bh * g->L + i0 + i] = m[i] + logf(l[i]);
  }
}

FA_ISA static void FN(fwd)(const fa_shape *g, const fa_fwd_io *io) {
  int nt = (g->L + BQ - 1) / BQ, ntask = g->B * g->H * nt;
  size_t wsf = fwd_ws_floats(g);
#pragma omp parallel
  {
    float *ws = ct_kernels_scratch(sizeof(float) * wsf, "fused attention forward tiles");
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < ntask; t++) FN(fwd_task)(g, io, t / nt, (t % nt) * BQ, ws);
    free(ws);
  }
}

/* dS = P (dP - D) for one key tile: P = exp(S - lse) in place in S, dS in dP. */
FA_ISA static void FN(probs_grad)(int nk, float *S, float *dP, const float *lse, const float *D) {
  for (int h = 0; h < BQ; h += FA_W) {
    FA_VT lv = LOADV(lse + h), dv = LOADV(D + h);
    for (int j = 0; j < nk; j++) {
      float *s = S + (size_t)j * BQ + h, *dp = dP + (size_t)j * BQ + h;
      FA_VT p = FN(vexp)(LOADV(s) - lv);
      FA_VT ds = p * (LOADV(dp) - dv);
      STOREV(s, p);
      STOREV(dp, ds);
    }
  }
}

/* One query tile [i0, i0 + nq) of head bh against every key tile: dQ of the
 * tile, dK and dV (leading dim w, zeroed by the caller) accumulated. Q, K, dO
 * are rows readable 16 floats at a time (leading dims ldq, ldk, lddo). */
FA_ISA static void FN(bwd_tile)(const fa_shape *g, const fa_bwd_io *io, int bh, int i0,
                                const float *Q, const float *K, size_t ldk, const float *dO,
                                size_t lddo, float *dK, float *dV, float *ws) {
  int hd = g->hd, w = g->hdp, nq = imin(BQ, g->L - i0);
  int kend = g->causal ? i0 + nq : g->L;
  size_t hoff = (size_t)bh * g->L * hd;
  float *T = ws, *Td = T + (size_t)hd * BQ, *S = Td + (size_t)hd * BQ, *dP = S + (size_t)BK * BQ;
  float *dQ = dP + (size_t)BK * BQ, *lse = dQ + (size_t)BQ * w, *D = lse + BQ;
  uint32_t *T2 = (uint32_t *)(D + BQ), *Td2 = T2 + (size_t)w / 2 * BQ;
  uint32_t *K2 = Td2 + (size_t)w / 2 * BQ, *A2 = K2 + (size_t)BK * w / 2;
  uint32_t *B2 = A2 + (size_t)BK * BQ / 2;
  int b = bh / g->H, h = bh % g->H;
  size_t ldo = (size_t)g->H * hd;
  const float *Oi = io->o + ((size_t)b * g->L + i0) * ldo + (size_t)h * hd;
  const float *dOi = io->dout + ((size_t)b * g->L + i0) * ldo + (size_t)h * hd;
  FN(pack_t)(nq, hd, io->q + hoff + (size_t)i0 * hd, hd, g->scale, T);
  FN(pack_t)(nq, hd, dOi, ldo, 1.0f, Td);
  if (g->bf16) {
    FN(pack_pairs)(hd, w, T, T2);
    FN(pack_pairs)(hd, w, Td, Td2);
  }
  for (int i = 0; i < BQ; i++) {
    lse[i] = i < nq ? io->lse[(size_t)bh * g->L + i0 + i] : 0.0f;
    D[i] = i < nq ? FN(row_dot)(hd, dOi + (size_t)i * ldo, Oi + (size_t)i * ldo) : 0.0f;
  }
  float *dq = io->dq + hoff + (size_t)i0 * hd;
  if (w == hd) dQ = dq; /* accumulate in place */
  memset(dQ, 0, sizeof(float) * (size_t)nq * w);
  const float *V = io->v + hoff;
  const float *Qi = Q + (size_t)i0 * ldk, *dOt = dO + (size_t)i0 * lddo;
  for (int j0 = 0; j0 < kend; j0 += BK) {
    int nk = imin(BK, kend - j0);
    FN(scores_sel)(g, nk, io->k + hoff + (size_t)j0 * hd, hd, T, T2, K2, S);
    if (g->causal) FN(mask)(nk, nq, i0, j0, S);
    FN(scores_sel)(g, nk, V + (size_t)j0 * hd, hd, Td, Td2, K2, dP);
    FN(probs_grad)(nk, S, dP, lse, D);
    if (g->bf16) {
      FN(grads_bf16)
      (g, nq, nk, S, dP, dOt, lddo, Qi, K + (size_t)j0 * ldk, ldk, dV + (size_t)j0 * w,
       dK + (size_t)j0 * w, dQ, A2, B2);
      continue;
    }
    FN(acc)(nk, nq, w, S, BQ, 1, dOt, lddo, dV + (size_t)j0 * w, w, NULL, 1.0f);
    FN(acc)(nk, nq, w, dP, BQ, 1, Qi, ldk, dK + (size_t)j0 * w, w, NULL, g->scale);
    FN(acc)(nq, nk, w, dP, 1, BQ, K + (size_t)j0 * ldk, ldk, dQ, w, NULL, g->scale);
  }
  if (w != hd)
    for (int i = 0; i < nq; i++)
      memcpy(dq + (size_t)i * hd, dQ + (size_t)i * w, sizeof(float) * hd);
}

/* One backward task: head bh, its query tiles in order. */
FA_ISA static void FN(bwd_task)(const fa_shape *g, const fa_bwd_io *io, int bh, float *ws) {
  int L = g->L, hd = g->hd, w = g->hdp;
  size_t hoff = (size_t)bh * L * hd, lhw = (size_t)L * w;
  float *tile = ws, *dK = io->dk + hoff, *dV = io->dv + hoff;
  const float *Q = io->q + hoff, *K = io->k + hoff, *dO = NULL;
  size_t ldk = hd, lddo = (size_t)g->H * hd;
  int b = bh / g->H, h = bh % g->H;
  dO = io->dout + (size_t)b * L * lddo + (size_t)h * hd;
  prefetch_rows(L, hd, Q, hd);
  prefetch_rows(L, hd, K, hd);
  prefetch_rows(L, hd, io->v + hoff, hd);
  prefetch_rows(L, hd, dO, lddo);
  prefetch_rows(L, hd, io->o + (size_t)b * L * lddo + (size_t)h * hd, lddo);
  if (w != hd) { /* rows read 16 floats at a time: pad Q, K, dO, dK and dV */
    float *qp = tile + bwd_tile_floats(g), *kp = qp + lhw, *op = kp + lhw;
    dK = op + lhw, dV = dK + lhw;
    pad_rows(L, hd, Q, hd, w, qp);
    pad_rows(L, hd, K, hd, w, kp);
    pad_rows(L, hd, dO, lddo, w, op);
    Q = qp, K = kp, dO = op, ldk = w, lddo = w;
  }
  memset(dK, 0, sizeof(float) * lhw);
  memset(dV, 0, sizeof(float) * lhw);
  for (int i0 = 0; i0 < L; i0 += BQ) FN(bwd_tile)(g, io, bh, i0, Q, K, ldk, dO, lddo, dK, dV, tile);
  if (w != hd)
    for (int j = 0; j < L; j++) {
      memcpy(io->dk + hoff + (size_t)j * hd, dK + (size_t)j * w, sizeof(float) * hd);
      memcpy(io->dv + hoff + (size_t)j * hd, dV + (size_t)j * w, sizeof(float) * hd);
    }
}

FA_ISA static void FN(bwd)(const fa_shape *g, const fa_bwd_io *io) {
  size_t wsf = bwd_ws_floats(g);
#pragma omp parallel
  {
    float *ws = ct_kernels_scratch(sizeof(float) * wsf, "fused attention backward tiles");
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < g->B * g->H; bh++) FN(bwd_task)(g, io, bh, ws);
    free(ws);
  }
}

#undef FN
#undef FA_CAT
#undef FA_CAT2
#undef FA_NQ

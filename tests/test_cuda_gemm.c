/* The CUDA backend's matrix products, convolutions and attention on a device,
 * against the CPU kernels at shapes the backend suite's small cases never
 * reach: several tiles, odd leading dimensions, pointers 4 bytes off 16-byte
 * alignment (the arena's offsets), a bias the epilogue cannot take, bf16 and
 * int8 weight views, strided and padded convolutions, head dims 7 / 128 /
 * 256, causal, and bitwise repeatability. The "cuda" row is compared with the
 * float32 kernels, "cuda-bf16" with the bf16 ones (the same rounded
 * operands; only the order of the sums differs). Without a device every test
 * passes at once, saying so; a FLUX-sized attention is timed (printed, not
 * checked). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctuner/backend.h"
#include "harness.h"

static uint64_t rs = 7;
static float frnd(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return (float)((double)(rs >> 40) / (double)(1ull << 23) - 1.0);
}
static float *hv(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = frnd();
  return p;
}
static double relerr(const float *a, const float *b, size_t n) {
  double md = 0, mb = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= md)) md = d;
    if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
  }
  return mb > 0 ? md / mb : md;
}

/* device buffers: off floats past an aligned block (off 1: 4-byte aligned only) */
typedef struct {
  const ct_backend_ops *be;
  void *blocks[64];
  int n;
} pool;
static float *up(pool *p, const float *h, size_t n, int off) {
  char *d = p->be->alloc(CT_MEM_OTHER, (n + (size_t)off) * sizeof(float) + 16);
  p->blocks[p->n++] = d;
  float *f = (float *)d + off;
  if (h) p->be->copy_in(f, h, n * sizeof(float));
  return f;
}
static void *up_bytes(pool *p, const void *h, size_t bytes) {
  void *d = p->be->alloc(CT_MEM_OTHER, bytes + 16);
  p->blocks[p->n++] = d;
  p->be->copy_in(d, h, bytes);
  return d;
}
static float *down(pool *p, const float *d, size_t n) {
  float *h = malloc((n ? n : 1) * sizeof(float));
  p->be->copy_out(h, d, n * sizeof(float));
  return h;
}
static void pool_free(pool *p) {
  for (int i = 0; i < p->n; i++) p->be->free(p->blocks[i]);
  p->n = 0;
}

static const ct_backend_ops *row(const char *name) {
  const ct_backend_ops *be = NULL;
  ct_err err = {0};
  if (ct_backend_get(name, &be, &err) != CT_OK) {
    fprintf(stderr, "  %s: %s\n", name, err.msg);
    return NULL;
  }
  return be;
}

static int dev_ok(const ct_backend_ops *be, int *ct_failed_) {
  ct_err err = {0};
  ct_status st = be->check(&err);
  CHECKF(st == CT_OK, "%s: %s", be->name, err.msg);
  return st == CT_OK;
}

CT_TEST(cuda_gemm, sgemm_vs_cpu) {
  const int shapes[][3] = {{64, 48, 33}, {257, 129, 300}, {1, 1, 1}, {3, 1000, 17}, {130, 7, 513}};
  for (int bf = 0; bf < 2; bf++) {
    const ct_backend_ops *be = row(bf ? "cuda-bf16" : "cuda");
    if (!be) CT_SKIP("no CUDA device");
    pool p = {be, {0}, 0};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
          for (int bi = 0; bi < 2; bi++) {
            int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            int lda = (ta ? M : K) + (int)s % 3, ldb = (tb ? K : N) + 1, ldc = N + 2 * (int)s;
            size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb;
            size_t nc = (size_t)M * ldc;
            float alpha = 0.7f, beta = bi ? 1.3f : 0.0f;
            float *A = hv(na), *B = hv(nb), *C = hv(nc), *ref = malloc(nc * sizeof(float));
            memcpy(ref, C, nc * sizeof(float));
            (bf ? ct_sgemm_bf16 : ct_sgemm)(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, ref, ldc);
            if (!bi)
              for (size_t i = 0; i < nc; i++) C[i] = NAN; /* beta 0 must not read C */
            int off = (int)(s + ta + tb) % 2;
            float *dA = up(&p, A, na, off), *dB = up(&p, B, nb, 1 - off), *dC = up(&p, C, nc, off);
            be->sgemm(ta, tb, M, N, K, alpha, dA, lda, dB, ldb, beta, dC, ldc);
            float *got = down(&p, dC, nc);
            double e = relerr(got, ref, nc);
            CHECKF(e < 1e-5, "%s transA %d transB %d M %d N %d K %d beta %g: rel err %.3g",
                   be->name, ta, tb, M, N, K, (double)beta, e);
            if (bi && !bf) { /* repeatable, and sgemm_deterministic the same product */
              float *dC2 = up(&p, C, nc, off);
              be->sgemm_deterministic(ta, tb, M, N, K, alpha, dA, lda, dB, ldb, beta, dC2, ldc);
              float *again = down(&p, dC2, nc);
              CHECKF(!memcmp(again, got, nc * sizeof(float)), "%s: sgemm_deterministic differs",
                     be->name);
              free(again);
            }
            free(A);
            free(B);
            free(C);
            free(ref);
            free(got);
            pool_free(&p);
          }
    dev_ok(be, ct_failed_);
  }
}

CT_TEST(cuda_gemm, linear_vs_cpu) {
  const int N = 300, K = 129, M = 70, ldx = K + 3, ldy = M + 1;
  for (int bf = 0; bf < 2; bf++) {
    const ct_backend_ops *be = row(bf ? "cuda-bf16" : "cuda");
    if (!be) CT_SKIP("no CUDA device");
    pool p = {be, {0}, 0};
    size_t nx = (size_t)N * ldx, ny = (size_t)N * ldy, nw = (size_t)M * K;
    float *x = hv(nx), *w = hv(nw), *b = hv(M), *dy = hv(ny), *y0 = hv(ny);
    float *dx0 = hv(nx), *dw0 = hv(nw), *db0 = hv(M);
    for (int boff = 0; boff < 2; boff++) { /* boff 1: a bias the epilogue cannot take */
      float *ry = malloc(ny * 4), *rdx = malloc(nx * 4), *rdw = malloc(nw * 4),
            *rdb = malloc(M * 4);
      memcpy(ry, y0, ny * 4);
      memcpy(rdx, dx0, nx * 4);
      memcpy(rdw, dw0, nw * 4);
      memcpy(rdb, db0, M * 4);
      (bf ? ct_linear_fwd_bf16 : ct_linear_fwd)(N, K, M, x, ldx, w, b, ry, ldy);
      (bf ? ct_linear_bwd_bf16 : ct_linear_bwd)(N, K, M, x, ldx, w, dy, ldy, rdx, ldx, 1.0f, rdw,
                                                rdb);
      float *dxp = up(&p, x, nx, 0), *dwp = up(&p, w, nw, 0), *dbp = up(&p, b, M, boff);
      float *dyv = up(&p, y0, ny, 0), *ddy = up(&p, dy, ny, 1);
      float *ddx = up(&p, dx0, nx, 0), *ddw = up(&p, dw0, nw, 0), *ddb = up(&p, db0, M, 0);
      be->linear_fwd(N, K, M, dxp, ldx, dwp, dbp, dyv, ldy);
      be->linear_bwd(N, K, M, dxp, ldx, dwp, ddy, ldy, ddx, ldx, 1.0f, ddw, ddb);
      float *gy = down(&p, dyv, ny), *gdx = down(&p, ddx, nx), *gdw = down(&p, ddw, nw);
      float *gdb = down(&p, ddb, M);
      CHECKF(relerr(gy, ry, ny) < 1e-5, "%s y (bias offset %d): %.3g", be->name, boff,
             relerr(gy, ry, ny));
      CHECKF(relerr(gdx, rdx, nx) < 1e-5, "%s dx: %.3g", be->name, relerr(gdx, rdx, nx));
      CHECKF(relerr(gdw, rdw, nw) < 1e-5, "%s dw: %.3g", be->name, relerr(gdw, rdw, nw));
      CHECKF(relerr(gdb, rdb, M) < 1e-6, "%s db: %.3g", be->name, relerr(gdb, rdb, M));
      free(ry), free(rdx), free(rdw), free(rdb), free(gy), free(gdx), free(gdw), free(gdb);
      pool_free(&p);
    }
    /* weight views: bf16 and int8 (dw NULL), dx with beta 0 */
    uint16_t *wb = malloc(nw * 2);
    int8_t *wq = malloc(nw);
    float *sc = malloc(M * 4), *deq = malloc(nw * 4);
    ct_to_bf16(nw, w, wb);
    ct_quantize_int8(CT_QUANT_TORCHAO, M, K, w, wq, sc);
    for (int dt = 1; dt <= 2; dt++) {
      ct_wview hvw = {dt == 1 ? CT_WDT_BF16 : CT_WDT_I8, dt == 1 ? (void *)wb : (void *)wq,
                      dt == 2 ? sc : NULL};
      for (int r = 0; r < M; r++)
        for (int c = 0; c < K; c++) deq[(size_t)r * K + c] = ct_wview_at(hvw, K, r, c);
      float *ry = malloc(ny * 4), *rdx = malloc(nx * 4), *rdb = malloc(M * 4);
      memcpy(ry, y0, ny * 4);
      memcpy(rdb, db0, M * 4);
      /* cuda: the float32 product on the dequantised weight; cuda-bf16: bf16 operands */
      (bf ? ct_linear_fwd_bf16 : ct_linear_fwd)(N, K, M, x, ldx, deq, b, ry, ldy);
      (bf ? ct_linear_bwd_bf16 : ct_linear_bwd)(N, K, M, x, ldx, deq, dy, ldy, rdx, ldx, 0.0f, NULL,
                                                rdb);
      ct_wview dvw = hvw;
      dvw.data = up_bytes(&p, hvw.data, nw * ct_wdtype_size(hvw.dtype));
      if (dt == 2) dvw.scales = up(&p, sc, M, 0);
      float *dxp = up(&p, x, nx, 1), *dbp = up(&p, b, M, 0), *dyv = up(&p, y0, ny, 0);
      float *ddy = up(&p, dy, ny, 0), *ddx = up(&p, dx0, nx, 0), *ddb = up(&p, db0, M, 0);
      be->linear_fwd_w(N, K, M, dxp, ldx, &dvw, dbp, dyv, ldy);
      be->linear_bwd_w(N, K, M, dxp, ldx, &dvw, ddy, ldy, ddx, ldx, 0.0f, NULL, ddb);
      float *gy = down(&p, dyv, ny), *gdx = down(&p, ddx, nx), *gdb = down(&p, ddb, M);
      CHECKF(relerr(gy, ry, ny) < 1e-5, "%s view %s y: %.3g", be->name, ct_wdtype_name(hvw.dtype),
             relerr(gy, ry, ny));
      CHECKF(relerr(gdx, rdx, nx) < 1e-5, "%s view %s dx: %.3g", be->name,
             ct_wdtype_name(hvw.dtype), relerr(gdx, rdx, nx));
      CHECKF(relerr(gdb, rdb, M) < 1e-6, "%s view db: %.3g", be->name, relerr(gdb, rdb, M));
      free(ry), free(rdx), free(rdb), free(gy), free(gdx), free(gdb);
      pool_free(&p);
    }
    free(wb), free(wq), free(sc), free(deq);
    free(x), free(w), free(b), free(dy), free(y0), free(dx0), free(dw0), free(db0);
    dev_ok(be, ct_failed_);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

CT_TEST(cuda_gemm, attention_vs_cpu) {
  /* hd above 256: the score-tile path, compared with the CPU's tiles kernel */
  const int shapes[][5] = {{1, 3, 300, 128, 0}, {2, 2, 77, 7, 1},     {1, 1, 40, 256, 1},
                           {1, 2, 129, 64, 0},  {1, 4, 1100, 128, 0}, {1, 1, 300, 512, 0},
                           {2, 1, 90, 300, 1}};
  for (int bf = 0; bf < 2; bf++) {
    const ct_backend_ops *be = row(bf ? "cuda-bf16" : "cuda");
    if (!be) CT_SKIP("no CUDA device");
    pool p = {be, {0}, 0};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      int B = shapes[s][0], H = shapes[s][1], L = shapes[s][2], hd = shapes[s][3];
      int causal = shapes[s][4];
      size_t n = (size_t)B * H * L * hd, nl = (size_t)B * H * L;
      float scale = 1.0f / sqrtf((float)hd);
      float *q = hv(n), *k = hv(n), *v = hv(n), *dO = hv(n);
      for (size_t i = 0; i < n; i++) q[i] *= 3.0f;
      float *o = malloc(n * 4), *lse = malloc(nl * 4), *g = malloc(3 * n * 4);
      int cbf = bf ? 2 : 0;
      if (hd > 256) {
        ct_attention_tiles_fwd(B, H, L, hd, scale, causal, q, k, v, o, lse);
        ct_attention_tiles_bwd(B, H, L, hd, scale, causal, q, k, v, o, lse, dO, g, g + n,
                               g + 2 * n);
      } else {
        ct_attention_flash_fwd(B, H, L, hd, scale, causal, q, k, v, o, lse, cbf);
        ct_attention_flash_bwd(B, H, L, hd, scale, causal, q, k, v, o, lse, dO, g, g + n, g + 2 * n,
                               cbf);
      }
      float *dq_ = up(&p, q, n, 0), *dk_ = up(&p, k, n, 0), *dv_ = up(&p, v, n, 0);
      float *ddO = up(&p, dO, n, 0), *dob = up(&p, NULL, n, 0), *dl = up(&p, NULL, nl, 0);
      float *gq = up(&p, NULL, n, 0), *gk = up(&p, NULL, n, 0), *gv = up(&p, NULL, n, 0);
      be->attention_fwd(B, H, L, hd, scale, causal, dq_, dk_, dv_, dob, dl);
      be->attention_bwd(B, H, L, hd, scale, causal, dq_, dk_, dv_, dob, dl, ddO, gq, gk, gv);
      float *ho = down(&p, dob, n), *hl = down(&p, dl, nl), *hq = down(&p, gq, n);
      float *hk = down(&p, gk, n), *hvv = down(&p, gv, n);
      double tol = bf && hd <= 256 ? 2e-2 : 1e-4;
      double e[5] = {relerr(ho, o, n), relerr(hl, lse, nl), relerr(hq, g, n), relerr(hk, g + n, n),
                     relerr(hvv, g + 2 * n, n)};
      CHECKF(e[0] < tol && e[1] < tol && e[2] < tol && e[3] < tol && e[4] < tol,
             "%s B %d H %d L %d hd %d causal %d: o %.3g lse %.3g dq %.3g dk %.3g dv %.3g", be->name,
             B, H, L, hd, causal, e[0], e[1], e[2], e[3], e[4]);
      /* bitwise repeatable (no atomics) */
      be->attention_bwd(B, H, L, hd, scale, causal, dq_, dk_, dv_, dob, dl, ddO, gq, gk, gv);
      float *hq2 = down(&p, gq, n), *hk2 = down(&p, gk, n);
      CHECKF(!memcmp(hq2, hq, n * 4) && !memcmp(hk2, hk, n * 4), "%s: backward not repeatable",
             be->name);
      free(q), free(k), free(v), free(dO), free(o), free(lse), free(g);
      free(ho), free(hl), free(hq), free(hk), free(hvv), free(hq2), free(hk2);
      pool_free(&p);
    }
    /* FLUX-sized timing: B 1, H 24, L 4608, hd 128 (printed only) */
    {
      int B = 1, H = 24, L = 4608, hd = 128;
      size_t n = (size_t)B * H * L * hd, nl = (size_t)B * H * L;
      float *hq = hv(n);
      float *dq_ = up(&p, hq, n, 0), *dk_ = up(&p, hq, n, 0), *dv_ = up(&p, hq, n, 0);
      float *dob = up(&p, NULL, n, 0), *dl = up(&p, NULL, nl, 0);
      float *gq = up(&p, NULL, n, 0), *gk = up(&p, NULL, n, 0), *gv = up(&p, NULL, n, 0);
      be->attention_fwd(B, H, L, hd, 0.088f, 0, dq_, dk_, dv_, dob, dl); /* warm up */
      be->synchronize();
      double t0 = now_s();
      be->attention_fwd(B, H, L, hd, 0.088f, 0, dq_, dk_, dv_, dob, dl);
      be->synchronize();
      double t1 = now_s();
      be->attention_bwd(B, H, L, hd, 0.088f, 0, dq_, dk_, dv_, dob, dl, dq_, gq, gk, gv);
      be->synchronize();
      double t2 = now_s(), fl = 4.0 * L * (double)L * hd * H * B;
      fprintf(stderr, "  %s attention 1x24x4608x128: fwd %.2f ms (%.1f TFLOP/s), bwd %.2f ms\n",
              be->name, 1e3 * (t1 - t0), fl / (t1 - t0) * 1e-12, 1e3 * (t2 - t1));
      free(hq);
      pool_free(&p);
    }
    dev_ok(be, ct_failed_);
  }
}

CT_TEST(cuda_gemm, conv2d_vs_cpu) {
  /* B Cin H W Cout k stride pad_t pad_l pad_b pad_r */
  const int shapes[][11] = {{2, 32, 33, 31, 16, 3, 1, 1, 1, 1, 1},
                            {1, 8, 64, 64, 8, 3, 2, 0, 0, 1, 1},
                            {2, 24, 17, 19, 12, 1, 1, 0, 0, 0, 0}};
  for (int bf = 0; bf < 2; bf++) {
    const ct_backend_ops *be = row(bf ? "cuda-bf16" : "cuda");
    if (!be) CT_SKIP("no CUDA device");
    pool p = {be, {0}, 0};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
      const int *v = shapes[c];
      ct_conv2d_shape s = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10]};
      int Ho = ct_conv2d_out(s.H, s.k, s.stride, s.pad_t, s.pad_b);
      int Wo = ct_conv2d_out(s.W, s.k, s.stride, s.pad_l, s.pad_r);
      size_t nx = (size_t)s.B * s.Cin * s.H * s.W, ny = (size_t)s.B * s.Cout * Ho * Wo;
      size_t nw = (size_t)s.Cout * s.Cin * s.k * s.k;
      size_t ncol = ct_conv2d_col_floats(&s), ncold = be->conv2d_col_floats(&s);
      float *x = hv(nx), *w = hv(nw), *b = hv(s.Cout), *dy = hv(ny), *dw0 = hv(nw);
      float *db0 = hv(s.Cout), *col = malloc(ncol * 4 + 4), *y = malloc(ny * 4);
      float *dx = malloc(nx * 4), *dw = malloc(nw * 4), *db = malloc(s.Cout * 4);
      memcpy(dw, dw0, nw * 4);
      memcpy(db, db0, s.Cout * 4);
      (bf ? ct_conv2d_fwd_bf16 : ct_conv2d_fwd)(&s, x, w, b, y, col);
      (bf ? ct_conv2d_bwd_bf16 : ct_conv2d_bwd)(&s, x, w, dy, dx, dw, db, col);
      float *gx = up(&p, x, nx, 0), *gw = up(&p, w, nw, 0), *gb = up(&p, b, s.Cout, 0);
      float *gdy = up(&p, dy, ny, 0), *gy = up(&p, NULL, ny, 0), *gdx = up(&p, NULL, nx, 0);
      float *gdw = up(&p, dw0, nw, 0), *gdb = up(&p, db0, s.Cout, 0);
      float *gcol = up(&p, NULL, ncold ? ncold : 1, 0);
      be->conv2d_fwd(&s, gx, gw, gb, gy, gcol);
      be->conv2d_bwd(&s, gx, gw, gdy, gdx, gdw, gdb, gcol);
      float *hy = down(&p, gy, ny), *hx = down(&p, gdx, nx), *hw = down(&p, gdw, nw);
      float *hb = down(&p, gdb, s.Cout);
      double e[4] = {relerr(hy, y, ny), relerr(hx, dx, nx), relerr(hw, dw, nw),
                     relerr(hb, db, s.Cout)};
      CHECKF(e[0] < 1e-5 && e[1] < 1e-5 && e[2] < 1e-5 && e[3] < 1e-6,
             "%s conv2d case %zu: y %.3g dx %.3g dw %.3g db %.3g", be->name, c, e[0], e[1], e[2],
             e[3]);
      free(x), free(w), free(b), free(dy), free(dw0), free(db0), free(col), free(y), free(dx);
      free(dw), free(db), free(hy), free(hx), free(hw), free(hb);
      pool_free(&p);
    }
    dev_ok(be, ct_failed_);
  }
}

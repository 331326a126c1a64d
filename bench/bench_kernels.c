/* Micro-benchmark of the kernels at the `bench` preset's shapes (B=16, d=384,
 * H=6, hd=64, 64 image + 16 text tokens = 80 joint tokens, MLP hidden 1536).
 * Prints one line per kernel: median milliseconds over repetitions and the
 * achieved GB/s (memory-bound kernels, counting each array read or written
 * once) or GFLOP/s (GEMM-based kernels), then the linear layers of one double
 * block against attention, and a 2048^3 SGEMM for reference.
 * Not part of the library; threads come from OMP_NUM_THREADS. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/kernels.h"

enum { B = 16, D = 384, H = 6, HD = 64, LI = 64, LT = 16, L = 80, N = B * L, F = 4 * D };

static float *buf(size_t n) {
  float *p = malloc(n * sizeof(float));
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  unsigned s = 12345u + (unsigned)n;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    p[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.2f;
  }
  return p;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

#define REPS 25
/* Median milliseconds of REPS runs of stmt after 3 warm-up runs. */
#define TIME_MS(out, stmt)                     \
  do {                                         \
    double ts_[REPS];                          \
    for (int w_ = 0; w_ < 3; w_++) {           \
      stmt;                                    \
    }                                          \
    for (int r_ = 0; r_ < REPS; r_++) {        \
      double t0_ = omp_get_wtime();            \
      stmt;                                    \
      ts_[r_] = (omp_get_wtime() - t0_) * 1e3; \
    }                                          \
    qsort(ts_, REPS, sizeof(double), cmpd);    \
    (out) = ts_[REPS / 2];                     \
  } while (0)

static void line_gb(const char *name, const char *shape, double ms, double bytes) {
  printf("%-22s %-28s %9.3f ms %8.1f GB/s\n", name, shape, ms, bytes / (ms * 1e-3) / 1e9);
}
static void line_gf(const char *name, const char *shape, double ms, double flops) {
  printf("%-22s %-28s %9.3f ms %8.1f GFLOP/s\n", name, shape, ms, flops / (ms * 1e-3) / 1e9);
}

/* fwd and bwd (dx, dw, db) of one Linear on `rows` rows; returns fwd+bwd ms */
static double bench_linear(const char *name, int rows, int K, int M, int print) {
  float *x = buf((size_t)rows * K), *w = buf((size_t)M * K), *b = buf(M);
  float *y = buf((size_t)rows * M), *dy = buf((size_t)rows * M), *dx = buf((size_t)rows * K);
  float *dw = buf((size_t)M * K), *db = buf(M);
  double tf, tb;
  TIME_MS(tf, ct_linear_fwd(rows, K, M, x, K, w, b, y, M));
  TIME_MS(tb, ct_linear_bwd(rows, K, M, x, K, w, dy, M, dx, K, 0.0f, dw, db));
  double fl = 2.0 * rows * K * M;
  if (print) {
    char shape[64];
    snprintf(shape, sizeof shape, "%dx%d -> %d", rows, K, M);
    char n1[64], n2[64];
    snprintf(n1, sizeof n1, "linear_fwd %s", name);
    snprintf(n2, sizeof n2, "linear_bwd %s", name);
    line_gf(n1, shape, tf, fl);
    line_gf(n2, shape, tb, 2 * fl);
  }
  free(x), free(w), free(b), free(y), free(dy), free(dx), free(dw), free(db);
  return tf + tb;
}

int main(void) {
  printf("threads: %d; shapes: B=%d d=%d H=%d hd=%d tokens=%d+%d, rows N=%d, MLP %d\n",
         omp_get_max_threads(), B, D, H, HD, LI, LT, N, F);
  double ms;
  char sh[64];

  /* ---- reference SGEMM ---- */
  {
    int n = 2048;
    float *a = buf((size_t)n * n), *bb = buf((size_t)n * n), *c = buf((size_t)n * n);
    double ts[5];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, bb, n, 0.0f, c, n);
    for (int r = 0; r < 5; r++) {
      double t0 = omp_get_wtime();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, bb, n, 0.0f, c,
                  n);
      ts[r] = (omp_get_wtime() - t0) * 1e3;
    }
    qsort(ts, 5, sizeof(double), cmpd);
    line_gf("sgemm 2048^3", "NN", ts[2], 2.0 * n * n * n);
    free(a), free(bb), free(c);
  }

  /* ---- linear layers ---- */
  double dbl = 0;
  const char *st[2] = {"img", "txt"};
  const int rows[2] = {B * LI, B * LT};
  for (int s = 0; s < 2; s++) {
    char nm[32];
    snprintf(nm, sizeof nm, "%s.qkv", st[s]);
    dbl += bench_linear(nm, rows[s], D, 3 * D, 1);
    snprintf(nm, sizeof nm, "%s.proj", st[s]);
    dbl += bench_linear(nm, rows[s], D, D, 1);
    snprintf(nm, sizeof nm, "%s.mlp0", st[s]);
    dbl += bench_linear(nm, rows[s], D, F, 1);
    snprintf(nm, sizeof nm, "%s.mlp2", st[s]);
    dbl += bench_linear(nm, rows[s], F, D, 1);
  }
  double sgl = bench_linear("single.linear1", N, D, 3 * D + F, 1);
  sgl += bench_linear("single.linear2", N, D + F, D, 1);

  /* ---- attention ---- */
  float *q = buf((size_t)N * D), *k = buf((size_t)N * D), *v = buf((size_t)N * D);
  float *o = buf((size_t)N * D), *lse = buf((size_t)B * H * L), *dout = buf((size_t)N * D);
  float *dq = buf((size_t)N * D), *dk = buf((size_t)N * D), *dv = buf((size_t)N * D);
  double af, ab;
  double afl = 4.0 * B * H * L * L * HD;
  snprintf(sh, sizeof sh, "B%d H%d L%d hd%d", B, H, L, HD);
  TIME_MS(af, ct_attention_fwd(B, H, L, HD, 0.125f, 0, q, k, v, o, lse));
  line_gf("attention_fwd", sh, af, afl);
  TIME_MS(ab, ct_attention_bwd(B, H, L, HD, 0.125f, 0, q, k, v, o, lse, dout, dq, dk, dv));
  line_gf("attention_bwd", sh, ab, 2.5 * afl);
  TIME_MS(ms, ct_attention_fwd(B, H, 77, HD, 0.125f, 1, q, k, v, o, lse));
  line_gf("attention_fwd causal", "B16 H6 L77 hd64", ms, afl * 77 * 77 / (2.0 * L * L));

  /* ---- memory-bound kernels ---- */
  size_t nd = (size_t)N * D, nf = (size_t)N * F;
  float *x = buf(nd), *hh = buf(nd), *xhat = buf(nd), *rstd = buf(N), *mod = buf((size_t)B * 6 * D);
  float *dmod = buf((size_t)B * 6 * D), *dh = buf(nd), *dx = buf(nd);
  snprintf(sh, sizeof sh, "%dx%d", N, D);
  TIME_MS(ms, ct_ln_mod_fwd(B, L, D, x, D, mod, mod + D, 6 * D, 1e-6f, xhat, rstd, hh, D));
  line_gb("ln_mod_fwd", sh, ms, 4.0 * (3 * nd));
  TIME_MS(ms, ct_ln_mod_bwd(B, L, D, xhat, rstd, mod + D, 6 * D, dh, D, dx, D, dmod, dmod + D));
  line_gb("ln_mod_bwd", sh, ms, 4.0 * (4 * nd));
  TIME_MS(ms, ct_gate_res_fwd(B, L, D, x, D, mod + 2 * D, 6 * D, hh, D, dx, D));
  line_gb("gate_res_fwd", sh, ms, 4.0 * (3 * nd));
  TIME_MS(ms, ct_gate_res_bwd(B, L, D, mod + 2 * D, 6 * D, hh, D, dh, D, dx, D, dmod + 2 * D));
  line_gb("gate_res_bwd", sh, ms, 4.0 * (3 * nd));
  TIME_MS(ms, ct_add_inplace(nd, dx, dh));
  line_gb("add_inplace", sh, ms, 4.0 * (3 * nd));
  TIME_MS(ms, ct_zero(nd, dx));
  line_gb("zero", sh, ms, 4.0 * nd);

  float *a1 = buf(nf), *a2 = buf(nf), *a3 = buf(nf);
  snprintf(sh, sizeof sh, "%dx%d", N, F);
  TIME_MS(ms, ct_gelu_tanh_fwd(N, F, a1, F, a2, F));
  line_gb("gelu_tanh_fwd", sh, ms, 4.0 * (2 * nf));
  TIME_MS(ms, ct_gelu_tanh_bwd(N, F, a1, F, a2, F, a3, F));
  line_gb("gelu_tanh_bwd", sh, ms, 4.0 * (3 * nf));
  TIME_MS(ms, ct_silu_fwd(N, F, a1, F, a2, F));
  line_gb("silu_fwd", sh, ms, 4.0 * (2 * nf));
  TIME_MS(ms, ct_silu_bwd(N, F, a1, F, a2, F, a3, F));
  line_gb("silu_bwd", sh, ms, 4.0 * (3 * nf));
  TIME_MS(ms, ct_quick_gelu_fwd(N, F, a1, F, a2, F));
  line_gb("quick_gelu_fwd", sh, ms, 4.0 * (2 * nf));

  /* ---- heads: fused QK-norm + RoPE + transpose ---- */
  float *qkv = buf((size_t)N * 3 * D), *dqkv = buf((size_t)N * 3 * D), *pe = buf((size_t)L * HD);
  float *qs = buf(HD), *ks = buf(HD), *dqs = buf(HD), *dks = buf(HD);
  float *rq = buf((size_t)N * H), *rk = buf((size_t)N * H);
  snprintf(sh, sizeof sh, "%dx%d", N, 3 * D);
  TIME_MS(ms, ct_qkv_heads_fwd(B, L, L, 0, H, HD, qkv, qs, ks, pe, q, k, v, rq, rk));
  line_gb("qkv_heads_fwd", sh, ms, 4.0 * (2 * 3 * nd));
  TIME_MS(ms,
          ct_qkv_heads_bwd(B, L, L, 0, H, HD, qkv, qs, ks, pe, rq, rk, dq, dk, dv, dqkv, dqs, dks));
  line_gb("qkv_heads_bwd", sh, ms, 4.0 * (3 * 3 * nd));
  snprintf(sh, sizeof sh, "%dx%d", N * H, HD);
  TIME_MS(ms, ct_rope_fwd(N * H, L, HD, pe, q, HD, o, HD));
  line_gb("rope_fwd", sh, ms, 4.0 * (2 * nd));
  TIME_MS(ms, ct_rope_bwd(N * H, L, HD, pe, q, HD, o, HD));
  line_gb("rope_bwd", sh, ms, 4.0 * (2 * nd));
  float *rs = buf(N * H);
  TIME_MS(ms, ct_rmsnorm_fwd(N * H, HD, q, HD, qs, 1e-6f, o, HD, rs));
  line_gb("rmsnorm_fwd", sh, ms, 4.0 * (2 * nd));
  TIME_MS(ms, ct_rmsnorm_bwd(N * H, HD, q, HD, qs, rs, dq, HD, o, HD, dqs));
  line_gb("rmsnorm_bwd", sh, ms, 4.0 * (3 * nd));

  /* ---- embeddings, patches, loss ---- */
  size_t nl = (size_t)B * 4 * 16 * 16;
  float *lat = buf(nl), *tok = buf(nl), *tgt = buf(nl), *dp = buf(nl), *temb = buf(B * 256);
  TIME_MS(ms, ct_patchify(B, 4, 16, 16, 2, lat, tok));
  line_gb("patchify", "16x4x16x16 p2", ms, 4.0 * 2 * nl);
  TIME_MS(ms, ct_unpatchify(B, 4, 16, 16, 2, tok, lat));
  line_gb("unpatchify", "16x4x16x16 p2", ms, 4.0 * 2 * nl);
  volatile float sink = 0;
  TIME_MS(ms, sink += ct_mse_fwd_bwd(nl, tok, tgt, 1.0f, dp));
  line_gb("mse_fwd_bwd", "16384", ms, 4.0 * 3 * nl);
  TIME_MS(ms, ct_timestep_embedding(B, rs, 256, 10000.0f, 1000.0f, temb));
  line_gb("timestep_embedding", "16x256", ms, 4.0 * B * 256);

  printf("\none double block, linear layers fwd+bwd (img+txt): %.3f ms\n", dbl);
  printf("one single block, linear layers fwd+bwd: %.3f ms\n", sgl);
  printf("attention fwd+bwd: %.3f ms = %.1f%% of the double block's linear layers\n", af + ab,
         100.0 * (af + ab) / dbl);
  return 0;
}

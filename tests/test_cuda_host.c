/* The CUDA kernels' arithmetic, on the host (no device needed): the
 * per-element functions the kernels run (src/kernels/cuda/elem_math.cuh,
 * through the host mirrors of src/kernels/cuda/selftest.cu) against the CPU
 * kernels and functions they mirror: Philox and the uniform fill (bit for
 * bit), bf16 rounding (bit for bit), the LoRA dropout (bit for bit), the
 * activations and the optimizer updates (a few ulp: the CPU build may fuse
 * multiply-adds, the kernels never do). What runs on a device is checked by
 * tests/test_backend.c's cuda rows where there is one. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#ifdef CT_CUDA
#include "ctuner/backend.h"
#include "ctuner/bf16.h"
#include "ctuner/kernels.h"
#include "ctuner/rng.h"
#include "kernels/cuda_elem.h"

static uint64_t lcg_state = 0x2545F4914F6CDD1Dull;
static uint32_t lcg(void) {
  lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(lcg_state >> 32);
}
static float frand(float lo, float hi) {
  return lo + (hi - lo) * (float)(lcg() >> 8) * 0x1p-24f;
}
static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* |a - b| within rel * |b| + abs, or both NaN */
static int near(float a, float b, double rel, double abs_) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  return fabs((double)a - (double)b) <= rel * fabs((double)b) + abs_;
}

CT_TEST(cuda_host, selftest) {
  char msg[256];
  int n = ct_cu_selftest_host(msg, sizeof msg);
  CHECKF(n == 0, "%d failures, the first: %s", n, msg);
}

CT_TEST(cuda_host, philox_bitwise) {
  static const uint64_t seeds[] = {0, 1, 42, 0xDEADBEEFCAFEF00Dull};
  static const uint64_t streams[] = {0, 3, CT_STREAM_DROPOUT, 0x100000007ull};
  static const uint64_t idx[] = {0,    1, 2, 1000, 0xFFFFFFFFull, 0x100000000ull, 0x1234567890ull,
                                 ~0ull};
  int bad = 0;
  for (size_t a = 0; a < 4; a++)
    for (size_t b = 0; b < 4; b++)
      for (size_t c = 0; c < 8; c++)
        for (uint64_t d = 0; d < 64; d++) {
          const uint64_t i = idx[c] + d;
          bad += bits(ct_cuh_uniform(seeds[a], streams[b], i)) !=
                 bits(ct_rng_uniform(seeds[a], streams[b], i));
        }
  for (int t = 0; t < 2000; t++) {
    uint32_t ctr[4] = {lcg(), lcg(), lcg(), lcg()}, key[2] = {lcg(), lcg()}, o1[4], o2[4];
    ct_cuh_philox_raw(ctr, key, o1);
    ct_philox4x32_raw(ctr, key, o2);
    bad += memcmp(o1, o2, sizeof o1) != 0;
  }
  CHECKF(bad == 0, "%d mismatches", bad);
}

CT_TEST(cuda_host, bf16_bitwise) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++)
    bad += bits(ct_cuh_bf16_to_f32((uint16_t)h)) != bits(ct_bf16_to_f32((uint16_t)h));
  for (int t = 0; t < 200000; t++) {
    uint32_t u = lcg();
    if (t % 4 == 1) u &= 0xFFFF8000u | (lcg() & 1u);     /* near ties */
    if (t % 4 == 2) u = (u & 0x807FFFFFu) | 0x7F800000u; /* inf and NaN */
    const float f = from_bits(u);
    bad += ct_cuh_f32_to_bf16(f) != ct_f32_to_bf16(f);
    /* narrow_acc: bf16(float(dst) + src) */
    const uint16_t d = (uint16_t)lcg();
    const float s = frand(-4.0f, 4.0f);
    volatile float sum = ct_bf16_to_f32(d) + s;
    bad += ct_cuh_f32_to_bf16(ct_cuh_bf16_to_f32(d) + s) != ct_f32_to_bf16(sum);
  }
  /* the array entry points */
  enum { n = 4099 };
  static float f[n], w[n];
  static uint16_t h[n], h2[n], h3[n];
  for (int i = 0; i < n; i++) f[i] = from_bits(lcg()), h[i] = h3[i] = (uint16_t)lcg();
  ct_cuh_bf16_narrow(n, f, h2);
  for (int i = 0; i < n; i++) bad += h2[i] != ct_f32_to_bf16(f[i]);
  ct_cuh_bf16_widen(n, h, w);
  for (int i = 0; i < n; i++) bad += bits(w[i]) != bits(ct_bf16_to_f32(h[i]));
  for (int i = 0; i < n; i++) f[i] = frand(-1.0f, 1.0f);
  ct_cuh_bf16_narrow_acc(n, f, h3);
  for (int i = 0; i < n; i++) {
    volatile float sum = ct_bf16_to_f32(h[i]) + f[i];
    bad += h3[i] != ct_f32_to_bf16(sum);
  }
  CHECKF(bad == 0, "%d mismatches", bad);
}

/* LoRA dropout as src/model/lora.c computes it: ct_rng_fill_uniform per row */
CT_TEST(cuda_host, dropout_bitwise) {
  const int N = 7, D = 300, ldx = 311, lddx = 305;
  const uint64_t seed = 1234, stream = 0x4C4F524100000003ull;
  uint64_t ctr[7];
  for (int n = 0; n < N; n++) ctr[n] = (uint64_t)n * 1000003u + ((uint64_t)n << 33);
  float *x = malloc(sizeof(float) * N * ldx), *xd = malloc(sizeof(float) * N * D);
  float *ref = malloc(sizeof(float) * N * D), *u = malloc(sizeof(float) * D);
  float *dx = malloc(sizeof(float) * N * lddx), *dxr = malloc(sizeof(float) * N * lddx);
  REQUIRE(x && xd && ref && u && dx && dxr);
  for (int i = 0; i < N * ldx; i++) x[i] = frand(-2.0f, 2.0f);
  for (int i = 0; i < N * lddx; i++) dx[i] = dxr[i] = frand(-1.0f, 1.0f);
  static const float ps[] = {0.1f, 0.25f, 0.5f, 0.05f};
  int bad = 0, dropped = 0;
  for (int t = 0; t < 4; t++) {
    const float p = ps[t];
    const float keep = (float)(1.0 / (1.0 - (double)p));
    CHECK(ct_cu_dropout_keep(p) == keep);
    for (int n = 0; n < N; n++) {
      ct_rng_fill_uniform(u, (size_t)D, seed, stream, ctr[n], 0.0f, 1.0f);
      for (int c = 0; c < D; c++) {
        ref[n * D + c] = u[c] < p ? 0.0f : x[(size_t)n * ldx + c] * keep;
        dropped += u[c] < p;
        if (!(u[c] < p)) {
          volatile float add = ref[n * D + c] * keep; /* no fused multiply-add here */
          dxr[(size_t)n * lddx + c] += add;
        }
      }
    }
    ct_cuh_dropout_fwd(N, D, x, ldx, seed, stream, ctr, p, xd);
    for (int i = 0; i < N * D; i++) bad += bits(xd[i]) != bits(ref[i]);
    /* the backward with dxd = the forward's output */
    ct_cuh_dropout_bwd(N, D, ref, seed, stream, ctr, p, dx, lddx);
    for (int i = 0; i < N * lddx; i++) bad += bits(dx[i]) != bits(dxr[i]);
  }
  CHECKF(bad == 0, "%d mismatches", bad);
  CHECK(dropped > 0);
  /* keep from a float p is lora.c's keep (from the configured double) for the usual rates */
  for (int k = 1; k <= 32; k++) {
    const double pd = k / 100.0;
    CHECKF(ct_cu_dropout_keep((float)pd) == (float)(1.0 / (1.0 - pd)), "p %.2f", pd);
  }
  free(x), free(xd), free(ref), free(u), free(dx), free(dxr);
}

/* count of elements of a (rows x cols, ld lda) not near b's (ld ldb); exact counts the identical */
static int cmp2d(const char *what, int rows, int cols, const float *a, int lda, const float *b,
                 int ldb, double rel, double abs_, int *exact) {
  int bad = 0;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      const float x = a[(size_t)r * lda + c], y = b[(size_t)r * ldb + c];
      if (exact) *exact += bits(x) == bits(y);
      if (!near(x, y, rel, abs_)) {
        if (!bad) fprintf(stderr, "  %s[%d][%d]: %.9g, cpu %.9g\n", what, r, c, x, y);
        bad++;
      }
    }
  return bad;
}

static float *rnd(size_t n, float lo, float hi) {
  float *p = malloc(n * sizeof *p);
  if (p)
    for (size_t i = 0; i < n; i++) p[i] = frand(lo, hi);
  return p;
}

/* the activations' entry points on the host, with leading dimensions, against act.c */
CT_TEST(cuda_host, activations) {
  enum { N = 37, D = 129, LD = 140 };
  float *x = rnd((size_t)N * LD, -12.0f, 12.0f), *g = rnd((size_t)N * LD, -1.0f, 1.0f);
  float *y = rnd((size_t)N * LD, 0, 0), *r = rnd((size_t)N * LD, 0, 0);
  REQUIRE(x && g && y && r);
  x[0] = 0.0f, x[1] = -0.0f, x[2] = 100.0f, x[3] = -100.0f, x[4] = 1e-30f, x[5] = -90.0f;
  for (int o = 0; o < 6; o++) {
    static const char *ops[] = {"silu",     "gelu_tanh", "quick_gelu",
                                "gelu_erf", "silu_bwd",  "gelu_tanh_bwd"};
    memcpy(y, x, sizeof(float) * N * LD); /* the padding must stay as it was */
    memcpy(r, x, sizeof(float) * N * LD);
    switch (o) {
      case 0:
        ct_cuh_silu_fwd(N, D, x, LD, y, LD), ct_silu_fwd(N, D, x, LD, r, LD);
        break;
      case 1:
        ct_cuh_gelu_tanh_fwd(N, D, x, LD, y, LD), ct_gelu_tanh_fwd(N, D, x, LD, r, LD);
        break;
      case 2:
        ct_cuh_quick_gelu_fwd(N, D, x, LD, y, LD), ct_quick_gelu_fwd(N, D, x, LD, r, LD);
        break;
      case 3:
        ct_cuh_gelu_erf_fwd(N, D, x, LD, y, LD), ct_gelu_erf_fwd(N, D, x, LD, r, LD);
        break;
      case 4:
        ct_cuh_silu_bwd(N, D, x, LD, g, LD, y, LD), ct_silu_bwd(N, D, x, LD, g, LD, r, LD);
        break;
      default:
        ct_cuh_gelu_tanh_bwd(N, D, x, LD, g, LD, y, LD);
        ct_gelu_tanh_bwd(N, D, x, LD, g, LD, r, LD);
        break;
    }
    int exact = 0;
    /* absolute 1e-6: the derivatives are sums of terms near 1 that cancel (gelu_tanh' near
     * x = -2.4); the CPU may fuse multiply-adds there, the kernels never do */
    int bad = cmp2d(ops[o], N, LD, y, LD, r, LD, 1e-6, 1e-6, &exact);
    CHECKF(bad == 0, "%s: %d mismatches", ops[o], bad);
    fprintf(stderr, "  %s: %d of %d bit-identical to the CPU kernel\n", ops[o], exact, N * LD);
  }
  /* gated residual, clamp */
  enum { B = 3, L = 5, LDG = 200 };
  float *gate = rnd((size_t)B * LDG, -1.0f, 1.0f);
  REQUIRE(gate);
  memcpy(y, x, sizeof(float) * N * LD), memcpy(r, x, sizeof(float) * N * LD);
  ct_cuh_gate_res_fwd(B, L, D, x, LD, gate, LDG, g, LD, y, LD);
  ct_gate_res_fwd(B, L, D, x, LD, gate, LDG, g, LD, r, LD);
  CHECK(cmp2d("gate_res_fwd", N, LD, y, LD, r, LD, 1e-6, 1e-6, NULL) == 0);
  ct_cuh_clamp_fwd(N, D, x, LD, -3.0f, 2.5f, y, LD), ct_clamp_fwd(N, D, x, LD, -3.0f, 2.5f, r, LD);
  CHECK(cmp2d("clamp_fwd", N, LD, y, LD, r, LD, 0, 0, NULL) == 0);
  memcpy(y, g, sizeof(float) * N * LD), memcpy(r, g, sizeof(float) * N * LD);
  ct_cuh_clamp_bwd(N, D, x, LD, -3.0f, 2.5f, g, LD, y, LD);
  ct_clamp_bwd(N, D, x, LD, -3.0f, 2.5f, g, LD, r, LD);
  CHECK(cmp2d("clamp_bwd", N, LD, y, LD, r, LD, 0, 0, NULL) == 0);
  free(x), free(g), free(y), free(r), free(gate);
}

/* permutations and the upsample: bit for bit */
CT_TEST(cuda_host, layout) {
  enum { B = 2, C = 3, H = 6, W = 10, P = 2, BC = B * C, HW = H * W };
  const size_t n = (size_t)B * C * H * W;
  float *x = rnd(n, -1, 1), *a = rnd(4 * n, 0, 0), *b = rnd(4 * n, 0, 0), *c = rnd(4 * n, 0, 0);
  REQUIRE(x && a && b && c);
  int bad = 0;
  ct_cuh_patchify(B, C, H, W, P, x, a), ct_patchify(B, C, H, W, P, x, b);
  bad += cmp2d("patchify", 1, (int)n, a, 0, b, 0, 0, 0, NULL);
  ct_cuh_unpatchify(B, C, H, W, P, a, c);
  bad += cmp2d("unpatchify", 1, (int)n, c, 0, x, 0, 0, 0, NULL);
  ct_cuh_nchw_to_nlc(B, C, HW, x, a), ct_nchw_to_nlc(B, C, HW, x, b);
  bad += cmp2d("nchw_to_nlc", 1, (int)n, a, 0, b, 0, 0, 0, NULL);
  ct_cuh_nlc_to_nchw(B, C, HW, a, c);
  bad += cmp2d("nlc_to_nchw", 1, (int)n, c, 0, x, 0, 0, 0, NULL);
  ct_cuh_upsample2x_fwd(BC, H, W, x, a), ct_upsample2x_fwd(BC, H, W, x, b);
  bad += cmp2d("upsample2x_fwd", 1, (int)(4 * n), a, 0, b, 0, 0, 0, NULL);
  for (size_t i = 0; i < 4 * n; i++) a[i] = frand(-1, 1);
  ct_cuh_upsample2x_bwd(BC, H, W, a, b), ct_upsample2x_bwd(BC, H, W, a, c);
  bad += cmp2d("upsample2x_bwd", 1, (int)n, b, 0, c, 0, 0, 0, NULL);
  /* tile blend, both directions, on planes with row padding */
  for (int vertical = 0; vertical < 2; vertical++) {
    const int e = 4, rows = vertical ? e : 5, cols = vertical ? 7 : e, lda = 9, ldb = 11;
    for (size_t i = 0; i < 4 * n; i++) b[i] = c[i] = frand(-1, 1);
    ct_cuh_tile_blend(3, rows, cols, e, vertical, x, 60, lda, b, 70, ldb);
    ct_tile_blend(3, rows, cols, e, vertical, x, 60, lda, c, 70, ldb);
    bad += cmp2d("tile_blend", 1, 210, b, 0, c, 0, 1e-6, 1e-7, NULL);
  }
  CHECKF(bad == 0, "%d mismatches", bad);
  free(x), free(a), free(b), free(c);
}

/* the RoPE table, rotations, timestep and token embeddings */
CT_TEST(cuda_host, positions) {
  enum { L = 12, N = 24, D = 16, LD = 20 };
  int pos[L * 3];
  for (int i = 0; i < L * 3; i++) pos[i] = (int)(lcg() % 64);
  static const int axes[3] = {4, 6, 6};
  float pe[L * D], pe2[L * D];
  ct_cuh_rope_table(L, pos, axes, 10000.0f, pe);
  ct_rope_table(L, pos, axes, 10000.0f, pe2);
  int bad = cmp2d("rope_table", 1, L * D, pe, 0, pe2, 0, 0, 0, NULL);
  float *x = rnd((size_t)N * LD, -1, 1), *y = rnd((size_t)N * LD, 0, 0),
        *r = rnd((size_t)N * LD, 0, 0);
  REQUIRE(x && y && r);
  memcpy(y, x, sizeof(float) * N * LD), memcpy(r, x, sizeof(float) * N * LD);
  ct_cuh_rope_fwd(N, L, D, pe, x, LD, y, LD), ct_rope_fwd(N, L, D, pe, x, LD, r, LD);
  bad += cmp2d("rope_fwd", N, LD, y, LD, r, LD, 1e-6, 1e-7, NULL);
  ct_cuh_rope_bwd(N, L, D, pe, x, LD, y, LD), ct_rope_bwd(N, L, D, pe, x, LD, r, LD);
  bad += cmp2d("rope_bwd", N, LD, y, LD, r, LD, 1e-6, 1e-7, NULL);
  /* timestep embedding, odd and even widths */
  const float t[3] = {0.0f, 0.5f, 0.999f};
  for (int dim = 255; dim <= 256; dim++) {
    float e1[3 * 256], e2[3 * 256];
    ct_cuh_timestep_embedding(3, t, dim, 10000.0f, 1000.0f, e1);
    ct_timestep_embedding(3, t, dim, 10000.0f, 1000.0f, e2);
    bad += cmp2d("timestep_embedding", 1, 3 * dim, e1, 0, e2, 0, 1e-6, 1e-6, NULL);
  }
  /* token + position embedding */
  int32_t ids[N];
  for (int i = 0; i < N; i++) ids[i] = (int32_t)(lcg() % 50);
  float *tok = rnd(50 * D, -1, 1), *pp = rnd(8 * D, -1, 1);
  REQUIRE(tok && pp);
  ct_cuh_embedding_fwd(N, 8, D, ids, tok, pp, y), ct_embedding_fwd(N, 8, D, ids, tok, pp, r);
  bad += cmp2d("embedding_fwd", 1, N * D, y, 0, r, 0, 0, 0, NULL);
  CHECKF(bad == 0, "%d mismatches", bad);
  free(x), free(y), free(r), free(tok), free(pp);
}

static int cmp_arrays(const char *what, size_t n, const float *a, const float *b, int *exact) {
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    *exact += bits(a[i]) == bits(b[i]);
    if (!near(a[i], b[i], 2e-6, 1e-9)) {
      if (!bad) fprintf(stderr, "  %s[%zu]: %.9g, cpu %.9g\n", what, i, a[i], b[i]);
      bad++;
    }
  }
  return bad;
}

CT_TEST(cuda_host, optimizers) {
  enum { n = 1000 };
  static float w[n], g[n], m[n], v[n], w2[n], m2[n], v2[n];
  int bad = 0, exact = 0, total = 0;
  for (int t = 0; t < 16; t++) {
    for (int i = 0; i < n; i++) {
      w[i] = w2[i] = frand(-1.0f, 1.0f);
      g[i] = frand(-0.1f, 0.1f);
      m[i] = m2[i] = frand(-0.01f, 0.01f);
      v[i] = v2[i] = frand(0.0f, 1e-4f);
    }
    const long step = 1 + t * 37;
    switch (t % 8) {
      case 0:
      case 1:
        ct_cuh_adam_update(n, w, g, m, v, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, t & 1, step);
        ct_adam_update(n, w2, g, m2, v2, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, t & 1, step);
        break;
      case 2:
        ct_cuh_adagrad_update(n, w, g, v, 1e-2f, 1e-3f, 1e-10f, 0.01f, step);
        ct_adagrad_update(n, w2, g, v2, 1e-2f, 1e-3f, 1e-10f, 0.01f, step);
        break;
      case 3:
        ct_cuh_lion_update(n, w, g, m, 1e-4f, 0.9f, 0.99f, 0.1f);
        ct_lion_update(n, w2, g, m2, 1e-4f, 0.9f, 0.99f, 0.1f);
        break;
      case 4:
      case 5:
        ct_cuh_sgd_update(n, w, g, m, 1e-2f, 0.9f, 0.1f, t & 1, 1e-4f, step);
        ct_sgd_update(n, w2, g, m2, 1e-2f, 0.9f, 0.1f, t & 1, 1e-4f, step);
        break;
      case 6:
        ct_cuh_sgd_update(n, w, g, NULL, 1e-2f, 0.0f, 0.0f, 0, 1e-4f, step);
        ct_sgd_update(n, w2, g, NULL, 1e-2f, 0.0f, 0.0f, 0, 1e-4f, step);
        break;
      default:
        ct_cuh_ema_update(n, w, g, 0.999f);
        ct_ema_update(n, w2, g, 0.999f);
        break;
    }
    bad += cmp_arrays("w", n, w, w2, &exact);
    bad += cmp_arrays("m", n, m, m2, &exact);
    bad += cmp_arrays("v", n, v, v2, &exact);
    total += 3 * n;
  }
  CHECKF(bad == 0, "%d mismatches", bad);
  fprintf(stderr, "  optimizers: %d of %d values bit-identical to the CPU kernels\n", exact, total);
}

/* ---- on a device (skipped without one): the kernels at shapes past the
 * small ones of tests/test_backend.c (several row chunks in the column sums,
 * rows wider than a block, sums over several 65536-float chunks) against the
 * CPU kernels, and run twice: the same bits (no atomics) ---- */
typedef struct {
  const ct_backend_ops *be;
  void *p[64];
  int np;
} devbuf;
static float *dput(devbuf *d, const float *h, size_t n) {
  float *p = d->be->alloc(CT_MEM_OTHER, n * sizeof(float));
  if (p && d->np < 64) d->p[d->np++] = p;
  if (p) d->be->copy_in(p, h, n * sizeof(float));
  return p;
}
static float *dget(const devbuf *d, const float *p, size_t n) {
  float *h = malloc(n * sizeof(float));
  if (h) d->be->copy_out(h, p, n * sizeof(float));
  return h;
}
/* max |a - b| <= tol * max(1, max |b|) */
static int close_scaled(const char *what, const float *a, const float *b, size_t n, double tol) {
  double m = 1.0, e = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    m = fmax(m, fabs(b[i]));
    const double d = fabs((double)a[i] - b[i]);
    if (!(d <= e)) e = d, at = i; /* NaN counts */
  }
  if (e <= tol * m) return 1;
  fprintf(stderr, "  %s: max error %.3g at %zu (%.9g vs cpu %.9g), scale %.3g\n", what, e, at,
          a[at], b[at], m);
  return 0;
}

CT_TEST(cuda_host, device_shapes) {
  const ct_backend_ops *be = NULL;
  ct_err err = {0};
  if (ct_backend_get("cuda", &be, &err) != CT_OK) CT_SKIP("no CUDA device: %s", err.msg);
  devbuf d = {.be = be};
  int ok = 1;
  for (int rep = 0; rep < 2; rep++) {
    static float *first[16];
    int k = 0;
#define KEEP(h, n)                                                                          \
  do {                                                                                      \
    if (rep == 0)                                                                           \
      first[k] = h;                                                                         \
    else {                                                                                  \
      CHECKF(!memcmp(first[k], h, (n) * sizeof(float)), "run twice: output %d differs", k); \
      free(first[k]), free(h);                                                              \
    }                                                                                       \
    k++;                                                                                    \
  } while (0)
    /* ln_mod: B 2, L 300 (5 chunks of 64 rows), D 3072 (rows wider than a block), ldm 2 D */
    {
      enum { B = 2, L = 300, D = 3072, LDX = 3080, LDM = 2 * D };
      const size_t nx = (size_t)B * L * LDX, nm = (size_t)B * LDM, nh = (size_t)B * L * D;
      lcg_state = 11;
      float *x = rnd(nx, -2, 2), *m = rnd(nm, -0.5f, 0.5f), *dh = rnd(nh, -1, 1);
      float *xh = rnd(nh, 0, 0), *rs = rnd((size_t)B * L, 0, 0), *h = rnd(nh, 0, 0);
      float *dx = rnd(nx, -1, 1), *dm = rnd(nm, -1, 1);
      REQUIRE(x && m && dh && xh && rs && h && dx && dm);
      float *gx = dput(&d, x, nx), *gm = dput(&d, m, nm), *gdh = dput(&d, dh, nh);
      float *gxh = dput(&d, xh, nh), *grs = dput(&d, rs, (size_t)B * L), *gh = dput(&d, h, nh);
      float *gdx = dput(&d, dx, nx), *gdm = dput(&d, dm, nm);
      REQUIRE(gx && gm && gdh && gxh && grs && gh && gdx && gdm);
      be->ln_mod_fwd(B, L, D, gx, LDX, gm, gm + D, LDM, 1e-6f, gxh, grs, gh, D);
      be->ln_mod_bwd(B, L, D, gxh, grs, gm + D, LDM, gdh, D, gdx, LDX, gdm, gdm + D);
      ct_ln_mod_fwd(B, L, D, x, LDX, m, m + D, LDM, 1e-6f, xh, rs, h, D);
      ct_ln_mod_bwd(B, L, D, xh, rs, m + D, LDM, dh, D, dx, LDX, dm, dm + D);
      float *oh = dget(&d, gh, nh), *odx = dget(&d, gdx, nx), *odm = dget(&d, gdm, nm);
      REQUIRE(oh && odx && odm);
      ok &= close_scaled("ln_mod h", oh, h, nh, 1e-5);
      ok &= close_scaled("ln_mod dx", odx, dx, nx, 1e-5);
      ok &= close_scaled("ln_mod dshift dscale", odm, dm, nm, 1e-5);
      KEEP(oh, nh);
      KEEP(odx, nx);
      KEEP(odm, nm);
      free(x), free(m), free(dh), free(xh), free(rs), free(h), free(dx), free(dm);
    }
    /* rmsnorm over 700 rows (11 chunks), gate_res_bwd's dgate over 300 rows */
    {
      enum { N = 700, D = 3072, B = 2, L = 300 };
      const size_t n = (size_t)N * D;
      lcg_state = 12;
      float *x = rnd(n, -2, 2), *sc = rnd(D, 0.5f, 1.5f), *dy = rnd(n, -1, 1);
      float *y = rnd(n, 0, 0), *rs = rnd(N, 0, 0), *dx = rnd(n, -1, 1), *ds = rnd(D, -1, 1);
      float *gate = rnd((size_t)B * D, -1, 1), *dg = rnd((size_t)B * D, -1, 1);
      float *dyy = rnd((size_t)B * L * D, 0, 0);
      REQUIRE(x && sc && dy && y && rs && dx && ds && gate && dg && dyy);
      float *gx = dput(&d, x, n), *gsc = dput(&d, sc, D), *gdy = dput(&d, dy, n);
      float *gy = dput(&d, y, n), *grs = dput(&d, rs, N), *gdx = dput(&d, dx, n);
      float *gds = dput(&d, ds, D), *gg = dput(&d, gate, (size_t)B * D);
      float *gdg = dput(&d, dg, (size_t)B * D), *gdyy = dput(&d, dyy, (size_t)B * L * D);
      REQUIRE(gx && gsc && gdy && gy && grs && gdx && gds && gg && gdg && gdyy);
      be->rmsnorm_fwd(N, D, gx, D, gsc, 1e-6f, gy, D, grs);
      be->rmsnorm_bwd(N, D, gx, D, gsc, grs, gdy, D, gdx, D, gds);
      be->gate_res_bwd(B, L, D, gg, D, gx, D, gdy, D, gdyy, D, gdg);
      ct_rmsnorm_fwd(N, D, x, D, sc, 1e-6f, y, D, rs);
      ct_rmsnorm_bwd(N, D, x, D, sc, rs, dy, D, dx, D, ds);
      ct_gate_res_bwd(B, L, D, gate, D, x, D, dy, D, dyy, D, dg);
      float *oy = dget(&d, gy, n), *odx = dget(&d, gdx, n), *ods = dget(&d, gds, D);
      float *odg = dget(&d, gdg, (size_t)B * D), *odyy = dget(&d, gdyy, (size_t)B * L * D);
      REQUIRE(oy && odx && ods && odg && odyy);
      ok &= close_scaled("rmsnorm y", oy, y, n, 1e-5);
      ok &= close_scaled("rmsnorm dx", odx, dx, n, 1e-5);
      ok &= close_scaled("rmsnorm dscale", ods, ds, D, 1e-5);
      ok &= close_scaled("gate_res dgate", odg, dg, (size_t)B * D, 1e-5);
      ok &= close_scaled("gate_res dy", odyy, dyy, (size_t)B * L * D, 1e-6);
      KEEP(oy, n);
      KEEP(odx, n);
      KEEP(ods, D);
      KEEP(odg, (size_t)B * D);
      free(odyy);
      free(x), free(sc), free(dy), free(y), free(rs), free(dx), free(ds), free(gate), free(dg),
          free(dyy);
    }
    /* qkv_heads: 100 rows x 3 heads = 300 (row, head) pairs, hd 128 */
    {
      enum { B = 1, Ls = 100, Lt = 130, OFF = 30, H = 3, HD = 128 };
      const size_t nq = (size_t)B * Ls * 3 * H * HD, nh = (size_t)B * H * Lt * HD,
                   ns = (size_t)B * Ls * H;
      lcg_state = 13;
      float *qkv = rnd(nq, -2, 2), *qs = rnd(HD, 0.5f, 1.5f), *ks = rnd(HD, 0.5f, 1.5f);
      float *pe = rnd((size_t)Lt * HD, -1, 1);
      for (int i = 0; i < Lt * HD / 2; i++) {
        const double ang = 3.0 * pe[2 * i];
        pe[2 * i] = (float)cos(ang), pe[2 * i + 1] = (float)sin(ang);
      }
      float *q = rnd(nh, 0, 0), *kk = rnd(nh, 0, 0), *v = rnd(nh, 0, 0), *sq = rnd(ns, 0, 0),
            *sk = rnd(ns, 0, 0);
      float *dq = rnd(nh, -1, 1), *dk = rnd(nh, -1, 1), *dv = rnd(nh, -1, 1);
      float *dqkv = rnd(nq, 0, 0), *dqs = rnd(HD, -1, 1), *dks = rnd(HD, -1, 1);
      REQUIRE(qkv && qs && ks && pe && q && kk && v && sq && sk && dq && dk && dv && dqkv && dqs &&
              dks);
      float *g[15] = {
          dput(&d, qkv, nq),  dput(&d, qs, HD),  dput(&d, ks, HD), dput(&d, pe, (size_t)Lt * HD),
          dput(&d, q, nh),    dput(&d, kk, nh),  dput(&d, v, nh),  dput(&d, sq, ns),
          dput(&d, sk, ns),   dput(&d, dq, nh),  dput(&d, dk, nh), dput(&d, dv, nh),
          dput(&d, dqkv, nq), dput(&d, dqs, HD), dput(&d, dks, HD)};
      for (int i = 0; i < 15; i++) REQUIRE(g[i]);
      be->qkv_heads_fwd(B, Ls, Lt, OFF, H, HD, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7],
                        g[8]);
      be->qkv_heads_bwd(B, Ls, Lt, OFF, H, HD, g[0], g[1], g[2], g[3], g[7], g[8], g[9], g[10],
                        g[11], g[12], g[13], g[14]);
      ct_qkv_heads_fwd(B, Ls, Lt, OFF, H, HD, qkv, qs, ks, pe, q, kk, v, sq, sk);
      ct_qkv_heads_bwd(B, Ls, Lt, OFF, H, HD, qkv, qs, ks, pe, sq, sk, dq, dk, dv, dqkv, dqs, dks);
      float *o[6] = {dget(&d, g[4], nh),  dget(&d, g[5], nh),  dget(&d, g[6], nh),
                     dget(&d, g[12], nq), dget(&d, g[13], HD), dget(&d, g[14], HD)};
      for (int i = 0; i < 6; i++) REQUIRE(o[i]);
      ok &= close_scaled("qkv q", o[0], q, nh, 1e-5);
      ok &= close_scaled("qkv k", o[1], kk, nh, 1e-5);
      ok &= close_scaled("qkv v", o[2], v, nh, 0);
      ok &= close_scaled("qkv dqkv", o[3], dqkv, nq, 1e-5);
      ok &= close_scaled("qkv dqscale", o[4], dqs, HD, 1e-5);
      ok &= close_scaled("qkv dkscale", o[5], dks, HD, 1e-5);
      KEEP(o[3], nq);
      KEEP(o[4], HD);
      KEEP(o[5], HD);
      free(o[0]), free(o[1]), free(o[2]);
      free(qkv), free(qs), free(ks), free(pe), free(q), free(kk), free(v), free(sq), free(sk),
          free(dq), free(dk), free(dv), free(dqkv), free(dqs), free(dks);
    }
    /* mse and sumsq over 3 chunks and a bit */
    {
      const size_t n = 3 * 65536 + 17;
      lcg_state = 14;
      float *p = rnd(n, -1, 1), *tg = rnd(n, -1, 1), *dp = rnd(n, 0, 0);
      REQUIRE(p && tg && dp);
      float *gp = dput(&d, p, n), *gt = dput(&d, tg, n), *gdp = dput(&d, dp, n);
      REQUIRE(gp && gt && gdp);
      const float l1 = be->mse_fwd_bwd(n, gp, gt, 0.5f, gdp),
                  l2 = ct_mse_fwd_bwd(n, p, tg, 0.5f, dp);
      const double s1 = be->sumsq(n, gp), s2 = ct_sumsq(n, p);
      CHECKF(fabs(l1 - l2) <= 1e-6 * l2, "mse %.9g, cpu %.9g", l1, l2);
      CHECKF(fabs(s1 - s2) <= 1e-12 * s2, "sumsq %.17g, cpu %.17g", s1, s2);
      float *odp = dget(&d, gdp, n);
      REQUIRE(odp);
      ok &= close_scaled("mse dpred", odp, dp, n, 1e-6);
      float *sv = malloc(2 * sizeof(float));
      REQUIRE(sv);
      sv[0] = l1, sv[1] = (float)s1;
      KEEP(sv, 2);
      free(odp), free(p), free(tg), free(dp);
    }
#undef KEEP
    for (int i = 0; i < d.np; i++) be->free(d.p[i]);
    d.np = 0;
  }
  ct_err e2 = {0};
  CHECKF(!be->check || be->check(&e2) == CT_OK, "device error: %s", e2.msg);
  CHECK(ok);
}
#else
CT_TEST(cuda_host, not_built) {
  CT_SKIP("CUDA is not built (CT_CUDA off): nothing to check");
}
#endif

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
#else
CT_TEST(cuda_host, not_built) {
  fprintf(stderr, "  CUDA is not built (CT_CUDA off): nothing to check\n");
}
#endif

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

CT_TEST(cuda_host, activations) {
  enum { n = 4096 };
  static float x[n], g[n], y[n], r[n];
  for (int i = 0; i < n; i++) {
    x[i] = i < 2048 ? frand(-12.0f, 12.0f) : frand(-2.0f, 2.0f);
    g[i] = frand(-1.0f, 1.0f);
  }
  x[0] = 0.0f, x[1] = -0.0f, x[2] = 100.0f, x[3] = -100.0f, x[4] = 1e-30f;
  static const char *ops[] = {"silu",     "gelu_tanh", "quick_gelu",
                              "gelu_erf", "silu_bwd",  "gelu_tanh_bwd"};
  for (int o = 0; o < 6; o++) {
    REQUIRE(ct_cuh_act(ops[o], n, x, g, y));
    switch (o) {
      case 0:
        ct_silu_fwd(1, n, x, n, r, n);
        break;
      case 1:
        ct_gelu_tanh_fwd(1, n, x, n, r, n);
        break;
      case 2:
        ct_quick_gelu_fwd(1, n, x, n, r, n);
        break;
      case 3:
        ct_gelu_erf_fwd(1, n, x, n, r, n);
        break;
      case 4:
        ct_silu_bwd(1, n, x, n, g, n, r, n);
        break;
      default:
        ct_gelu_tanh_bwd(1, n, x, n, g, n, r, n);
        break;
    }
    int bad = 0, exact = 0;
    for (int i = 0; i < n; i++) {
      bad += !near(y[i], r[i], 1e-6, 1e-7);
      exact += bits(y[i]) == bits(r[i]);
      if (bad == 1 && !near(y[i], r[i], 1e-6, 1e-7))
        fprintf(stderr, "  %s(%.9g): %.9g, cpu %.9g\n", ops[o], x[i], y[i], r[i]), bad++;
    }
    CHECKF(bad == 0, "%s: %d mismatches", ops[o], bad);
    fprintf(stderr, "  %s: %d of %d bit-identical to the CPU kernel\n", ops[o], exact, n);
  }
  REQUIRE(!ct_cuh_act("nope", 1, x, g, y));
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

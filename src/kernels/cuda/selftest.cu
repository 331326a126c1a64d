// selftest.cu: the CUDA kernels' per-element arithmetic (elem_math.cuh) run on the host, with no
// device: known answers (ct_cu_selftest_host) and host mirrors of the entry points' arithmetic
// that tests/test_cuda_host.c compares with the CPU kernels (ct_rng_*, ct_f32_to_bf16, act.c,
// optim_math.c, lora.c's dropout). The device runs the very same functions, each operation
// rounded as here (elem_math.cuh), so what these checks prove holds for the kernels' arithmetic;
// the kernels' indexing is what the device run of tests/test_backend.c checks.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "elem_math.cuh"

extern "C" {
#include "kernels/cuda_elem.h"
}

namespace {

struct ct_st {
  int fails;
  char *msg;
  size_t cap;
  void fail(const char *fmt, ...) {
    if (fails++ == 0 && msg && cap) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(msg, cap, fmt, ap);
      va_end(ap);
    }
  }
};

void check_philox(ct_st &st) {
  // Random123's known answers for Philox4x32-10 (kat_vectors)
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
      {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du,
       0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
      {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u,
       0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
  for (int t = 0; t < 3; t++) {
    uint32_t out[4];
    ct_cu_philox_raw(kat[t], kat[t] + 4, out);
    for (int i = 0; i < 4; i++)
      if (out[i] != kat[t][6 + i])
        st.fail("philox known answer %d word %d: %08x, want %08x", t, i, out[i], kat[t][6 + i]);
  }
  // uniforms: in [0, 1), multiples of 2^-24
  for (uint64_t i = 0; i < 4096; i++) {
    const float u = ct_cu_uniform(42, 7, i * 0x9E3779B97F4A7C15ull);
    if (!(u >= 0.0f && u < 1.0f) || (float)(int32_t)(u * 16777216.0f) != u * 16777216.0f)
      st.fail("uniform %llu = %.9g", (unsigned long long)i, u);
  }
}

void check_bf16(ct_st &st) {
  static const struct {
    uint32_t f;
    uint16_t h;
  } v[] = {{0x3F800000u, 0x3F80}, {0x3F808000u, 0x3F80}, /* tie, even stays */
           {0x3F818000u, 0x3F82},                        /* tie, odd rounds up */
           {0x3F808001u, 0x3F81}, {0xBF80FFFFu, 0xBF81}, {0x7F800000u, 0x7F80}, /* inf */
           {0xFF800000u, 0xFF80}, {0x7F7FFFFFu, 0x7F80},                        /* max -> inf */
           {0x7FC00000u, 0x7FC0}, {0x7F800001u, 0x7FC0},                        /* sNaN quieted */
           {0xFF812345u, 0xFFC1}, {0x00000001u, 0x0000}, {0x00008000u, 0x0000}, /* denormal tie */
           {0x00018000u, 0x0002}, {0x80000000u, 0x8000}};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    const uint16_t h = ct_cu_f32_to_bf16(ct_u2f(v[i].f));
    if (h != v[i].h) st.fail("bf16(%08x) = %04x, want %04x", v[i].f, h, v[i].h);
  }
  for (uint32_t h = 0; h < 65536; h++) {
    const float f = ct_cu_bf16_to_f32((uint16_t)h);
    if (ct_f2u(f) != h << 16) st.fail("widen %04x", h);
    const bool nan = (h & 0x7FFFu) > 0x7F80u;
    if (!nan && ct_cu_f32_to_bf16(f) != h) st.fail("bf16 round trip %04x", h);
  }
}

// the fast exp and the activations against double-precision formulas
void check_math(ct_st &st) {
  if (ct_cu_expf(0.0f) != 1.0f || ct_cu_sigmoidf(0.0f) != 0.5f || ct_cu_expf(-100.0f) != 0.0f)
    st.fail("exp/sigmoid at 0 or -100");
  for (int i = -8000; i <= 8000; i++) {
    const float x = (float)i * 0.01f;
    const double e = exp((double)x), got = ct_cu_expf(x);
    if (fabs(got - e) > 4e-7 * e) st.fail("exp(%.9g) = %.9g, want %.9g", x, got, e);
    const double s = x * (1.0 / (1.0 + exp(-(double)x)));
    if (fabs(ct_cu_silu(x) - s) > 1e-6 * fabs(s) + 1e-30) st.fail("silu(%.9g)", x);
    const double u = 0.7978845608028654 * ((double)x + 0.044715 * (double)x * x * x);
    const double gt = 0.5 * x * (1.0 + tanh(u));
    if (fabs(ct_cu_gelu_tanh(x) - gt) > 2e-6 * fabs(x) + 1e-7)
      st.fail("gelu_tanh(%.9g) = %.9g, want %.9g", x, ct_cu_gelu_tanh(x), gt);
    const double ge = 0.5 * x * (1.0 + erf((double)x / sqrt(2.0)));
    if (fabs(ct_cu_gelu_erf(x) - ge) > 1e-6 * fabs(x) + 1e-30) st.fail("gelu_erf(%.9g)", x);
  }
  // derivatives against central differences of the forward functions in double
  for (int i = -600; i <= 600; i++) {
    const float x = (float)i * 0.01f + 0.003f;
    const double h = 1e-4;
    const double ds = ((x + h) / (1.0 + exp(-(x + h))) - (x - h) / (1.0 + exp(-(x - h)))) / (2 * h);
    if (fabs(ct_cu_silu_bwd(x, 1.0f) - ds) > 1e-5) st.fail("silu'(%.9g)", x);
    auto gtd = [](double v) {
      return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    };
    const double dg = (gtd(x + h) - gtd(x - h)) / (2 * h);
    if (fabs(ct_cu_gelu_tanh_bwd(x, 1.0f) - dg) > 1e-5) st.fail("gelu_tanh'(%.9g)", x);
  }
  if (ct_cu_clamp(NAN, -1.0f, 1.0f) == ct_cu_clamp(NAN, -1.0f, 1.0f)) st.fail("clamp(NaN)");
  if (ct_cu_clamp(-3.0f, -1.0f, 1.0f) != -1.0f || ct_cu_clamp(3.0f, -1.0f, 1.0f) != 1.0f)
    st.fail("clamp");
}

// Adam on a few elements against the formula in double
void check_optim(ct_st &st) {
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  for (long step = 1; step <= 5; step += 4) {
    const ct_cu_adam_k k = ct_cu_adam_consts(lr, b1, b2, eps, wd, 1, step);
    for (int i = 0; i < 64; i++) {
      float w = 0.5f - 0.013f * i, m = 0.001f * i, v = 1e-6f * i, g = 0.02f * (i - 30);
      const double wd0 = w * (1.0 - (double)lr * wd);
      const double md = (double)m * b1 + (1.0 - b1) * (double)g;
      const double vd = (double)v * b2 + (1.0 - b2) * (double)g * g;
      const double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
      const double wref = wd0 - (double)lr / bc1 * (md / (sqrt(vd) / sqrt(bc2) + eps));
      ct_cu_adam_at(k, &w, g, &m, &v);
      // m: a difference of two terms near 0.02 (an ulp there is 2e-9)
      if (fabs(w - wref) > 1e-6 * fabs(wref) + 1e-9 || fabs(m - md) > 1e-8)
        st.fail("adam step %ld element %d: w %.9g, want %.9g", step, i, w, wref);
    }
  }
}

}  // namespace

int ct_cu_selftest_host(char *msg, size_t cap) {
  ct_st st = {0, msg, cap};
  if (msg && cap) msg[0] = 0;
  check_philox(st);
  check_bf16(st);
  check_math(st);
  check_optim(st);
  return st.fails;
}

// ---- host mirrors ----
float ct_cuh_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return ct_cu_uniform(seed, stream, index);
}
void ct_cuh_philox_raw(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  ct_cu_philox_raw(ctr, key, out);
}
uint16_t ct_cuh_f32_to_bf16(float f) {
  return ct_cu_f32_to_bf16(f);
}
float ct_cuh_bf16_to_f32(uint16_t h) {
  return ct_cu_bf16_to_f32(h);
}

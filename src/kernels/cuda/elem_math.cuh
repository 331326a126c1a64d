// elem_math.cuh: the per-element arithmetic of the CUDA backend's element-wise, activation,
// optimizer, bf16 and Philox ops, as __host__ __device__ functions: the kernels call them on the
// device and selftest.cu calls the very same functions on the host, where tests/test_cuda_host.c
// compares them with the CPU kernels (src/kernels/act.c, optim_math.c, src/core/rng.c,
// ctuner/bf16.h).
//
// Rounding: every multiply and add goes through ct_fm/ct_fa/ct_fs (__fmul_rn, __fadd_rn, ... on
// the device), so nvcc cannot contract them into FMAs: the device rounds each operation as the
// host build of the same function does (x86-64 without -march: no FMA), bit for bit, and the
// host self-test proves the device's arithmetic. Division and sqrt are IEEE on both (nvcc's
// default -prec-div/-prec-sqrt; __fdiv_rn/__fsqrt_rn spelled out anyway).
// No dependence on the device: nothing here reads blockDim or the SM count.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define CT_HD __host__ __device__ __forceinline__
#else
#define CT_HD static inline
#endif

// ---- IEEE single operations, never contracted ----
CT_HD float ct_fm(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  volatile float r = a * b;  // volatile: no host-side contraction either
  return r;
#endif
}
CT_HD float ct_fa(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  volatile float r = a + b;
  return r;
#endif
}
CT_HD float ct_fs(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  volatile float r = a - b;
  return r;
#endif
}
CT_HD float ct_fdv(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  volatile float r = a / b;
  return r;
#endif
}
CT_HD float ct_fsqrt(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return sqrtf(a);
#endif
}
CT_HD uint32_t ct_f2u(float f) {
#ifdef __CUDA_ARCH__
  return (uint32_t)__float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}
CT_HD float ct_u2f(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- fastmath.h's exp, sigmoid, tanh (the CPU activations' functions), operation for operation
CT_HD float ct_cu_expf(float x) {
  const float lo_ = -87.33654f, hi_ = 88.37626f;
  float xc = x < lo_ ? lo_ : x;
  xc = xc > hi_ ? hi_ : xc;
  const float shifter = 12582912.0f;
  float n = ct_fs(ct_fa(ct_fm(xc, 1.44269504088896341f), shifter), shifter);
  float r = ct_fs(xc, ct_fm(n, 0.693145751953125f));
  r = ct_fs(r, ct_fm(n, 1.428606820309417e-06f));
  float p = 1.9841270e-04f;
  p = ct_fa(ct_fm(p, r), 1.3888889e-03f);
  p = ct_fa(ct_fm(p, r), 8.3333333e-03f);
  p = ct_fa(ct_fm(p, r), 4.1666667e-02f);
  p = ct_fa(ct_fm(p, r), 1.6666667e-01f);
  p = ct_fa(ct_fm(p, r), 0.5f);
  p = ct_fa(ct_fm(p, r), 1.0f);
  p = ct_fa(ct_fm(p, r), 1.0f);
  int32_t e = ((int32_t)n + 127) << 23;
  float s = ct_u2f((uint32_t)e);
  float y = ct_fm(p, s);
  return x < lo_ ? 0.0f : y;
}
CT_HD float ct_cu_sigmoidf(float x) {
  return ct_fdv(1.0f, ct_fa(1.0f, ct_cu_expf(-x)));
}
CT_HD float ct_cu_tanhf(float u) {
  return ct_fs(1.0f, ct_fdv(2.0f, ct_fa(ct_cu_expf(ct_fm(2.0f, u)), 1.0f)));
}

// ---- activations (act.c) ----
#define CT_CU_GELU_K0 0.7978845608028654f
#define CT_CU_GELU_K1 0.044715f

CT_HD float ct_cu_silu(float x) {
  return ct_fm(x, ct_cu_sigmoidf(x));
}
// dy * s * (1 + x (1 - s))
CT_HD float ct_cu_silu_bwd(float x, float g) {
  float s = ct_cu_sigmoidf(x);
  return ct_fm(ct_fm(g, s), ct_fa(1.0f, ct_fm(x, ct_fs(1.0f, s))));
}
CT_HD float ct_cu_gelu_tanh(float v) {
  float cube = ct_fm(ct_fm(ct_fm(CT_CU_GELU_K1, v), v), v);
  float t = ct_cu_tanhf(ct_fm(CT_CU_GELU_K0, ct_fa(v, cube)));
  return ct_fm(ct_fm(0.5f, v), ct_fa(1.0f, t));
}
CT_HD float ct_cu_gelu_tanh_bwd(float v, float g) {
  float v2 = ct_fm(v, v);
  float t = ct_cu_tanhf(ct_fm(CT_CU_GELU_K0, ct_fa(v, ct_fm(ct_fm(CT_CU_GELU_K1, v2), v))));
  float a = ct_fm(0.5f, ct_fa(1.0f, t));
  float b = ct_fm(ct_fm(ct_fm(0.5f, v), ct_fs(1.0f, ct_fm(t, t))), CT_CU_GELU_K0);
  b = ct_fm(b, ct_fa(1.0f, ct_fm(3.0f * CT_CU_GELU_K1, v2)));
  return ct_fm(g, ct_fa(a, b));
}
CT_HD float ct_cu_quick_gelu(float x) {
  return ct_fm(x, ct_cu_sigmoidf(ct_fm(1.702f, x)));
}
// erff: CUDA's (max 2 ulp) on the device, libm's on the host
CT_HD float ct_cu_gelu_erf(float x) {
  return ct_fm(ct_fm(0.5f, x), ct_fa(1.0f, erff(ct_fm(x, 0.70710678118654752f))));
}
// NaN stays NaN (both comparisons false)
CT_HD float ct_cu_clamp(float x, float lo, float hi) {
  return x < lo ? lo : x > hi ? hi : x;
}
// the weight of a in the tile blend at position s of e
CT_HD float ct_cu_blend(float a, float b, int s, int e) {
  const float t = ct_fdv((float)s, (float)e);
  return ct_fa(ct_fm(a, ct_fs(1.0f, t)), ct_fm(b, t));
}

// ---- bf16 (ctuner/bf16.h) ----
CT_HD uint16_t ct_cu_f32_to_bf16(float f) {
  uint32_t u = ct_f2u(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
CT_HD float ct_cu_bf16_to_f32(uint16_t h) {
  return ct_u2f((uint32_t)h << 16);
}

// ---- Philox4x32-10 (src/core/rng.c) ----
CT_HD void ct_cu_philox_raw(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    uint64_t p0 = (uint64_t)0xD2511F53u * c0;
    uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c1 ^ k0;
    uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}
// ct_rng_uniform: the top 24 bits of word 0 of counter (index, stream), key seed
CT_HD float ct_cu_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)stream,
                           (uint32_t)(stream >> 32)};
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  uint32_t w[4];
  ct_cu_philox_raw(ctr, key, w);
  return ct_fm((float)(w[0] >> 8), 0x1p-24f);
}
// element i of ct_rng_fill_uniform(out, n, seed, stream, offset, lo, hi)
CT_HD float ct_cu_fill_uniform_at(uint64_t seed, uint64_t stream, uint64_t offset, uint64_t i,
                                  float lo, float hi) {
  return ct_fa(lo, ct_fm(ct_fs(hi, lo), ct_cu_uniform(seed, stream, offset + i)));
}
// LoRA dropout (src/model/lora.c dropped()): element c of a row whose counter offset is ctr
CT_HD float ct_cu_dropout_fwd_at(float x, uint64_t seed, uint64_t stream, uint64_t ctr, int c,
                                 float p, float keep) {
  float u = ct_cu_fill_uniform_at(seed, stream, ctr, (uint64_t)c, 0.0f, 1.0f);
  return u < p ? 0.0f : ct_fm(x, keep);
}
// whether element c of that row is kept (the backward adds dxd * keep to dx there, nothing
// elsewhere)
CT_HD bool ct_cu_dropout_kept(uint64_t seed, uint64_t stream, uint64_t ctr, int c, float p) {
  return !(ct_cu_fill_uniform_at(seed, stream, ctr, (uint64_t)c, 0.0f, 1.0f) < p);
}

// ---- optimizer math (optim_math.c); the scalars are computed on the host in double ----
struct ct_cu_adam_k {
  float step_size, bc2_sqrt, decay, l2, a1, a2, b1, b2, eps;
};
struct ct_cu_sgd_k {
  float keep, add, lr, momentum, wd;
};

static inline ct_cu_adam_k ct_cu_adam_consts(float lr, float b1, float b2, float eps, float wd,
                                             int decoupled, long step) {
  const double bc1 = 1.0 - pow((double)b1, (double)step), bc2 = 1.0 - pow((double)b2, (double)step);
  ct_cu_adam_k k;
  k.step_size = (float)((double)lr / bc1);
  k.bc2_sqrt = (float)sqrt(bc2);
  k.decay = decoupled ? (float)(1.0 - (double)lr * (double)wd) : 1.0f;
  k.l2 = decoupled ? 0.0f : wd;
  k.a1 = 1.0f - b1;
  k.a2 = 1.0f - b2;
  k.b1 = b1;
  k.b2 = b2;
  k.eps = eps;
  return k;
}
CT_HD void ct_cu_adam_at(const ct_cu_adam_k &k, float *w, float g, float *m, float *v) {
  float wi = *w;
  float gi = ct_fa(g, ct_fm(k.l2, wi));
  wi = ct_fm(wi, k.decay);
  float mi = ct_fa(ct_fm(*m, k.b1), ct_fm(k.a1, gi));
  float vi = ct_fa(ct_fm(*v, k.b2), ct_fm(ct_fm(k.a2, gi), gi));
  *m = mi;
  *v = vi;
  *w = ct_fs(wi, ct_fm(k.step_size, ct_fdv(mi, ct_fa(ct_fdv(ct_fsqrt(vi), k.bc2_sqrt), k.eps))));
}
static inline float ct_cu_adagrad_clr(float lr, float lr_decay, long step) {
  return (float)((double)lr / (1.0 + (double)(step - 1) * (double)lr_decay));
}
CT_HD void ct_cu_adagrad_at(float clr, float eps, float wd, float *w, float g, float *sum) {
  float wi = *w;
  float gi = ct_fa(g, ct_fm(wd, wi));
  float si = ct_fa(*sum, ct_fm(gi, gi));
  *sum = si;
  *w = ct_fs(wi, ct_fm(clr, ct_fdv(gi, ct_fa(ct_fsqrt(si), eps))));
}
static inline float ct_cu_lion_decay(float lr, float wd) {
  return (float)(1.0 - (double)lr * (double)wd);
}
CT_HD void ct_cu_lion_at(float decay, float lr, float b1, float b2, float *w, float g, float *m) {
  const float a1 = 1.0f - b1, a2 = 1.0f - b2;
  float mi = *m;
  float c = ct_fa(ct_fm(b1, mi), ct_fm(a1, g));
  float s = (float)(c > 0.0f) - (float)(c < 0.0f);
  *w = ct_fs(ct_fm(*w, decay), ct_fm(lr, s));
  *m = ct_fa(ct_fm(b2, mi), ct_fm(a2, g));
}
static inline ct_cu_sgd_k ct_cu_sgd_consts(float lr, float momentum, float dampening, float wd,
                                           long step) {
  ct_cu_sgd_k k;
  const int first = step <= 1;
  k.keep = first ? 0.0f : momentum;
  k.add = first ? 1.0f : 1.0f - dampening;
  k.lr = lr;
  k.momentum = momentum;
  k.wd = wd;
  return k;
}
// no momentum buffer
CT_HD void ct_cu_sgd_plain_at(float lr, float wd, float *w, float g) {
  float wi = *w;
  *w = ct_fs(wi, ct_fm(lr, ct_fa(g, ct_fm(wd, wi))));
}
CT_HD void ct_cu_sgd_mom_at(const ct_cu_sgd_k &k, int nesterov, float *w, float g, float *buf) {
  float wi = *w;
  float d = ct_fa(g, ct_fm(k.wd, wi));
  float b = ct_fa(ct_fm(k.keep, *buf), ct_fm(k.add, d));
  *buf = b;
  *w =
      nesterov ? ct_fs(wi, ct_fm(k.lr, ct_fa(d, ct_fm(k.momentum, b)))) : ct_fs(wi, ct_fm(k.lr, b));
}
CT_HD float ct_cu_ema_at(float e, float w, float decay, float one_minus_decay) {
  return ct_fa(ct_fm(decay, e), ct_fm(one_minus_decay, w));
}

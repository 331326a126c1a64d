/* Vectorisable exp, sigmoid and tanh for the kernels (private header).
 *
 * libm's expf/tanhf are scalar calls that GCC cannot vectorise (~20 ns each),
 * which would make activations and softmax compute-bound. These are plain C,
 * branch-free inline functions that GCC auto-vectorises inside `omp simd` or
 * ordinary inner loops (no -ffast-math needed).
 *
 * exp: x = n ln2 + r with n = round(x / ln2) (magic-number rounding) and
 * |r| <= ln2/2 (Cody-Waite split of ln2), e^r by a degree-7 Taylor polynomial
 * (truncation < 4e-9 relative), 2^n built in the exponent bits. Relative error
 * is a few ulp. Inputs above 88.376 saturate at e^88.376 ~ 2.4e38 (finite, no
 * inf); inputs below ln(FLT_MIN) = -87.3365 return 0 (the true value there is
 * denormal), so -inf gives 0. NaN in gives an unspecified value.
 * tanh(u) = 1 - 2 / (e^(2u) + 1): absolute error ~1e-7, exactly +-1 for large |u|.
 */
#ifndef CT_KERNELS_FASTMATH_H
#define CT_KERNELS_FASTMATH_H

#include <stdint.h>
#include <string.h>

/* Sums whose bits do not depend on the SIMD width the compiler picks
 * (-march=native: 8 lanes on AVX2, 16 on AVX-512): `omp simd reduction`
 * splits a sum into as many partial sums as the vector has lanes, so its
 * result changed with the build machine. Here the split is always
 * CT_LANES partial sums, lane l taking elements l, l + 16, ..., each
 * lane's adds in order, then a fixed pairwise tree (ct_lanes_sum): the
 * same bits on every machine with FMA, vectorised at any width. */
#define CT_LANES 16

static inline float ct_lanes_sum(const float *a) {
  float b[8];
  for (int l = 0; l < 8; l++) b[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; l++) b[l] += b[l + 4];
  return (b[0] + b[2]) + (b[1] + b[3]);
}

static inline double ct_lanes_sumd(const double *a) {
  double b[8];
  for (int l = 0; l < 8; l++) b[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; l++) b[l] += b[l + 4];
  return (b[0] + b[2]) + (b[1] + b[3]);
}

/* OUT = the sum over J in [0, N) of EXPR (which reads J), split as above;
 * T is float or double. */
#define CT_SUM_LANES(T, OUT, N, J, EXPR)                                             \
  do {                                                                               \
    T acc_[CT_LANES] = {0};                                                          \
    long b_ = 0;                                                                     \
    for (; b_ + CT_LANES <= (long)(N); b_ += CT_LANES) {                             \
      _Pragma("omp simd") for (int l_ = 0; l_ < CT_LANES; l_++) {                    \
        const long J = b_ + l_;                                                      \
        acc_[l_] += (EXPR);                                                          \
      }                                                                              \
    }                                                                                \
    for (int l_ = 0; b_ + l_ < (long)(N); l_++) {                                    \
      const long J = b_ + l_;                                                        \
      acc_[l_] += (EXPR);                                                            \
    }                                                                                \
    (OUT) = _Generic(acc_[0], double : ct_lanes_sumd, default : ct_lanes_sum)(acc_); \
  } while (0)

#define CT_EXP_LO (-87.33654f)
#define CT_EXP_HI 88.37626f

static inline float ct_expf(float x) {
  float xc = x < CT_EXP_LO ? CT_EXP_LO : x;
  xc = xc > CT_EXP_HI ? CT_EXP_HI : xc;
  const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  float n = (xc * 1.44269504088896341f + shifter) - shifter;
  /* ln2 = hi + lo, hi with 16 significant bits so n * hi is exact for |n| < 256 */
  float r = xc - n * 0.693145751953125f;
  r = r - n * 1.428606820309417e-06f;
  float p = 1.9841270e-04f;   /* 1/7! */
  p = p * r + 1.3888889e-03f; /* 1/6! */
  p = p * r + 8.3333333e-03f; /* 1/5! */
  p = p * r + 4.1666667e-02f; /* 1/4! */
  p = p * r + 1.6666667e-01f; /* 1/3! */
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t e = ((int32_t)n + 127) << 23; /* n in [-126, 127]: a normal power of two */
  float s;
  memcpy(&s, &e, sizeof s);
  float y = p * s;
  return x < CT_EXP_LO ? 0.0f : y;
}

/* 1 / (1 + e^-x) */
static inline float ct_sigmoidf(float x) {
  return 1.0f / (1.0f + ct_expf(-x));
}

static inline float ct_tanhf(float u) {
  return 1.0f - 2.0f / (ct_expf(2.0f * u) + 1.0f);
}

#endif

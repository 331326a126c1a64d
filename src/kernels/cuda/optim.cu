// optim.cu: the timestep and token embeddings, the MSE loss, the optimizer updates, the EMA and
// the sum of squares of the CUDA backend (contracts: include/ctuner/kernels.h; the CPU twins:
// src/kernels/embed.c, optim_math.c). The updates' scalars (bias corrections, step sizes) are
// computed on the host in double and rounded once, as the CPU does; the per-element arithmetic
// is elem_math.cuh's. The MSE and the sum of squares sum in double over fixed chunks of
// CT_CU_SUM_CHUNK floats (one block each, a fixed tree inside), then the chunks in a second
// one-block pass: the same bits run after run; one copy_out returns the sum (one sync).
#include "elem_math.cuh"
#include "reduce.cuh"

extern "C" {
#include "kernels/cuda_elem.h"
}

#define CT_CU_SUM_CHUNK 65536

// ---- embeddings ----
// row b, column k < half: the cos/sin pair; k == half (odd dim): the trailing 0
struct ct_f_timestep {
  const float *t;
  int dim, half;
  float c, time_factor;
  float *out;
  CT_HD void operator()(int b, int k) const {
    float *o = out + (size_t)b * dim;
    if (k == half) {
      o[dim - 1] = 0.0f;
      return;
    }
    const float tb = ct_fm(time_factor, t[b]);
    // in double, rounded once: the device's expf/cosf/sinf are up to 2 ulp off, and at
    // time_factor 1000 the angle reaches ~1000 rad, where an ulp of f is 1e-4 of the result;
    // the host's libm is within half an ulp, so both round to what the CPU kernel gives
    const float f = (float)exp((double)ct_fdv(ct_fm(c, (float)k), (float)half));
    const float a = ct_fm(tb, f);
    o[k] = (float)cos((double)a);
    o[half + k] = (float)sin((double)a);
  }
};

template <class Run>
static void timestep_embedding_impl(Run run, int B, const float *t, int dim, float max_period,
                                    float time_factor, float *out) {
  const int half = dim / 2;
  const float c = (float)(-log((double)max_period));
  run.rows("timestep_embedding", B, half + dim % 2,
           ct_f_timestep{t, dim, half, c, time_factor, out});
}
void ct_cu_timestep_embedding(int B, const float *t, int dim, float max_period, float time_factor,
                              float *out) {
  timestep_embedding_impl(ct_dev_run(), B, t, dim, max_period, time_factor, out);
}
void ct_cuh_timestep_embedding(int B, const float *t, int dim, float max_period, float time_factor,
                               float *out) {
  timestep_embedding_impl(ct_host_run(), B, t, dim, max_period, time_factor, out);
}

struct ct_f_embedding {
  int T, D;
  const int32_t *ids;
  const float *tok, *pos;
  float *y;
  CT_HD void operator()(int r, int j) const {
    y[(size_t)r * D + j] = ct_fa(tok[(size_t)ids[r] * D + j], pos[(size_t)(r % T) * D + j]);
  }
};

template <class Run>
static void embedding_fwd_impl(Run run, int N, int T, int D, const int32_t *ids, const float *tok,
                               const float *pos, float *y) {
  if (N <= 0 || D <= 0 || T <= 0) return;
  const int32_t *dids = (const int32_t *)run.in(ids, (size_t)N * sizeof(int32_t));
  if (!dids) return;
  run.rows("embedding_fwd", N, D, ct_f_embedding{T, D, dids, tok, pos, y});
}
void ct_cu_embedding_fwd(int N, int T, int D, const int32_t *ids, const float *tok,
                         const float *pos, float *y) {
  embedding_fwd_impl(ct_dev_run(), N, T, D, ids, tok, pos, y);
}
void ct_cuh_embedding_fwd(int N, int T, int D, const int32_t *ids, const float *tok,
                          const float *pos, float *y) {
  embedding_fwd_impl(ct_host_run(), N, T, D, ids, tok, pos, y);
}

// ---- sums in double: chunk partials, then one block over the partials ----
// mode 0: sum of squares of a; mode 1: sum of (a - b)^2, and dpred = g (a - b) where dpred
__global__ void ct_k_sum_part(size_t n, int mode, const float *a, const float *b, float g,
                              float *dpred, double *part) {
  __shared__ double sh[33];
  const size_t i0 = (size_t)blockIdx.x * CT_CU_SUM_CHUNK;
  const size_t i1 = n - i0 < CT_CU_SUM_CHUNK ? n : i0 + CT_CU_SUM_CHUNK;
  double s = 0.0;
  if (mode == 0) {
    for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) s += (double)a[i] * a[i];
  } else {
    for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
      const float d = a[i] - b[i];
      s += (double)d * (double)d;
      if (dpred) dpred[i] = ct_fm(g, d);
    }
  }
  s = ct_block_sum(s, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void ct_k_sum_final(size_t nblk, double *part) {
  __shared__ double sh[33];
  double s = 0.0;
  for (size_t i = threadIdx.x; i < nblk; i += blockDim.x) s += part[i];
  s = ct_block_sum(s, sh);
  if (threadIdx.x == 0) part[nblk] = s;
}

static double ct_cu_sum(size_t n, int mode, const float *a, const float *b, float g, float *dpred) {
  if (n == 0) return 0.0;
  const size_t nblk = (n + CT_CU_SUM_CHUNK - 1) / CT_CU_SUM_CHUNK;
  double *part = (double *)ct_cu_scratch(CT_CU_SLOT_PART, (nblk + 1) * sizeof(double));
  if (!part) return NAN;
  ct_k_sum_part<<<(unsigned)nblk, CT_CU_ROW_THREADS, 0, ct_cu_stream()>>>(n, mode, a, b, g, dpred,
                                                                          part);
  CU_LAUNCHED(mode ? "mse_fwd_bwd" : "sumsq");
  ct_k_sum_final<<<1, CT_CU_ROW_THREADS, 0, ct_cu_stream()>>>(nblk, part);
  CU_LAUNCHED(mode ? "mse_fwd_bwd (final sum)" : "sumsq (final sum)");
  double tot = NAN;  // stays NaN when the copy fails (the sticky error says why)
  ct_cu_copy_out(&tot, part + nblk, sizeof tot);
  return tot;
}

float ct_cu_mse_fwd_bwd(size_t n, const float *pred, const float *target, float dloss,
                        float *dpred) {
  if (n == 0) return 0.0f;
  const float g = (float)(2.0 * (double)dloss / (double)n);
  const double tot = ct_cu_sum(n, 1, pred, target, g, dpred);
  return (float)(tot / (double)n);
}

double ct_cu_sumsq(size_t n, const float *x) {
  return ct_cu_sum(n, 0, x, NULL, 0.0f, NULL);
}

// ---- optimizer updates ----
struct ct_f_adam {
  ct_cu_adam_k k;
  float *w;
  const float *g;
  float *m, *v;
  CT_HD void operator()(size_t i) const {
    ct_cu_adam_at(k, w + i, g[i], m + i, v + i);
  }
};
struct ct_f_adagrad {
  float clr, eps, wd;
  float *w;
  const float *g;
  float *sum;
  CT_HD void operator()(size_t i) const {
    ct_cu_adagrad_at(clr, eps, wd, w + i, g[i], sum + i);
  }
};
struct ct_f_lion {
  float decay, lr, b1, b2;
  float *w;
  const float *g;
  float *m;
  CT_HD void operator()(size_t i) const {
    ct_cu_lion_at(decay, lr, b1, b2, w + i, g[i], m + i);
  }
};
struct ct_f_sgd_plain {
  float lr, wd;
  float *w;
  const float *g;
  CT_HD void operator()(size_t i) const {
    ct_cu_sgd_plain_at(lr, wd, w + i, g[i]);
  }
};
struct ct_f_sgd_mom {
  ct_cu_sgd_k k;
  int nesterov;
  float *w;
  const float *g;
  float *buf;
  CT_HD void operator()(size_t i) const {
    ct_cu_sgd_mom_at(k, nesterov, w + i, g[i], buf + i);
  }
};
struct ct_f_ema {
  float decay, one_minus;
  float *e;
  const float *w;
  CT_HD void operator()(size_t i) const {
    e[i] = ct_cu_ema_at(e[i], w[i], decay, one_minus);
  }
};

template <class Run>
static void adam_update_impl(Run run, size_t n, float *w, const float *g, float *m, float *v,
                             float lr, float b1, float b2, float eps, float wd, int decoupled,
                             long step) {
  run.flat("adam_update", n,
           ct_f_adam{ct_cu_adam_consts(lr, b1, b2, eps, wd, decoupled, step), w, g, m, v});
}
void ct_cu_adam_update(size_t n, float *w, const float *g, float *m, float *v, float lr, float b1,
                       float b2, float eps, float wd, int decoupled, long step) {
  adam_update_impl(ct_dev_run(), n, w, g, m, v, lr, b1, b2, eps, wd, decoupled, step);
}
void ct_cuh_adam_update(size_t n, float *w, const float *g, float *m, float *v, float lr, float b1,
                        float b2, float eps, float wd, int decoupled, long step) {
  adam_update_impl(ct_host_run(), n, w, g, m, v, lr, b1, b2, eps, wd, decoupled, step);
}

template <class Run>
static void adagrad_update_impl(Run run, size_t n, float *w, const float *g, float *sum, float lr,
                                float lr_decay, float eps, float wd, long step) {
  run.flat("adagrad_update", n,
           ct_f_adagrad{ct_cu_adagrad_clr(lr, lr_decay, step), eps, wd, w, g, sum});
}
void ct_cu_adagrad_update(size_t n, float *w, const float *g, float *sum, float lr, float lr_decay,
                          float eps, float wd, long step) {
  adagrad_update_impl(ct_dev_run(), n, w, g, sum, lr, lr_decay, eps, wd, step);
}
void ct_cuh_adagrad_update(size_t n, float *w, const float *g, float *sum, float lr, float lr_decay,
                           float eps, float wd, long step) {
  adagrad_update_impl(ct_host_run(), n, w, g, sum, lr, lr_decay, eps, wd, step);
}

template <class Run>
static void lion_update_impl(Run run, size_t n, float *w, const float *g, float *m, float lr,
                             float b1, float b2, float wd) {
  run.flat("lion_update", n, ct_f_lion{ct_cu_lion_decay(lr, wd), lr, b1, b2, w, g, m});
}
void ct_cu_lion_update(size_t n, float *w, const float *g, float *m, float lr, float b1, float b2,
                       float wd) {
  lion_update_impl(ct_dev_run(), n, w, g, m, lr, b1, b2, wd);
}
void ct_cuh_lion_update(size_t n, float *w, const float *g, float *m, float lr, float b1, float b2,
                        float wd) {
  lion_update_impl(ct_host_run(), n, w, g, m, lr, b1, b2, wd);
}

template <class Run>
static void sgd_update_impl(Run run, size_t n, float *w, const float *g, float *buf, float lr,
                            float momentum, float dampening, int nesterov, float wd, long step) {
  if (momentum == 0.0f || !buf) {
    run.flat("sgd_update", n, ct_f_sgd_plain{lr, wd, w, g});
    return;
  }
  run.flat("sgd_update", n,
           ct_f_sgd_mom{ct_cu_sgd_consts(lr, momentum, dampening, wd, step), nesterov, w, g, buf});
}
void ct_cu_sgd_update(size_t n, float *w, const float *g, float *buf, float lr, float momentum,
                      float dampening, int nesterov, float wd, long step) {
  sgd_update_impl(ct_dev_run(), n, w, g, buf, lr, momentum, dampening, nesterov, wd, step);
}
void ct_cuh_sgd_update(size_t n, float *w, const float *g, float *buf, float lr, float momentum,
                       float dampening, int nesterov, float wd, long step) {
  sgd_update_impl(ct_host_run(), n, w, g, buf, lr, momentum, dampening, nesterov, wd, step);
}

template <class Run>
static void ema_update_impl(Run run, size_t n, float *e, const float *w, float decay) {
  run.flat("ema_update", n, ct_f_ema{decay, 1.0f - decay, e, w});
}
void ct_cu_ema_update(size_t n, float *e, const float *w, float decay) {
  ema_update_impl(ct_dev_run(), n, e, w, decay);
}
void ct_cuh_ema_update(size_t n, float *e, const float *w, float decay) {
  ema_update_impl(ct_host_run(), n, e, w, decay);
}

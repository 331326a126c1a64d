/* The profiling backend behind `ctuner bench step --profile`: a ct_backend_ops
 * whose every op calls the same op of a wrapped backend and adds the time it
 * took to the op's family, under the phase the caller has set (forward,
 * backward, step): wall time (monotonic clock, read after the op returns; the
 * CPU backend runs each op to completion) and the process's CPU time, which on
 * one thread is the op's own work whatever else runs on the machine. A model put on this table
 * (ct_mmdit_set_backend) is profiled op by op; nothing costs anything when it is not used, since
 * the models then call the wrapped table directly. Counters are process-wide (one profile at a
 * time) and added atomically, so ops issued from several threads are counted too. The wrappers
 * below are one per field of ct_backend_ops, in its order; tests/test_backend.c checks that every
 * field is wrapped and that the table passes the op comparison suite. Not here: printing
 * (src/cli/cmd_bench.c); the ops (the wrapped backend).
 */
#include <stdint.h>
#include <time.h>

#include "ctuner/backend.h"

static const ct_backend_ops *inner;
static int phase;
static uint64_t ns[CT_PROF_NPHASES][CT_PROF_NFAMILIES];
static uint64_t cpu_ns[CT_PROF_NPHASES][CT_PROF_NFAMILIES];
static uint64_t calls[CT_PROF_NPHASES][CT_PROF_NFAMILIES];

static uint64_t clock_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* start of an op: wall and process CPU time */
typedef struct {
  uint64_t wall, cpu;
} stamp;
static stamp now_ns(void) {
  stamp s = {clock_ns(CLOCK_MONOTONIC), clock_ns(CLOCK_PROCESS_CPUTIME_ID)};
  return s;
}

static void add(ct_prof_family f, stamp t0) {
  /* an asynchronous backend (device memory) has only issued the op: wait for
   * it, so that the time is the op's and not its launch's (this serialises
   * the device; the profile's totals are then an upper bound) */
  if (!inner->host_memory) inner->synchronize();
  stamp t1 = now_ns();
  int p = __atomic_load_n(&phase, __ATOMIC_RELAXED);
  __atomic_fetch_add(&ns[p][f], t1.wall - t0.wall, __ATOMIC_RELAXED);
  __atomic_fetch_add(&cpu_ns[p][f], t1.cpu - t0.cpu, __ATOMIC_RELAXED);
  __atomic_fetch_add(&calls[p][f], 1, __ATOMIC_RELAXED);
}

#define TIMED(fam, call)  \
  do {                    \
    stamp t0_ = now_ns(); \
    call;                 \
    add(fam, t0_);        \
  } while (0)

static void *p_alloc(ct_mem_cat cat, size_t bytes) {
  stamp t0 = now_ns();
  void *r = inner->alloc(cat, bytes);
  add(CT_PROF_MEMORY, t0);
  return r;
}

static void p_free(void *p) {
  TIMED(CT_PROF_MEMORY, inner->free(p));
}

static void p_copy_in(void *dst, const void *host_src, size_t bytes) {
  TIMED(CT_PROF_MEMORY, inner->copy_in(dst, host_src, bytes));
}

static void p_copy_out(void *host_dst, const void *src, size_t bytes) {
  TIMED(CT_PROF_MEMORY, inner->copy_out(host_dst, src, bytes));
}

static void p_copy(void *dst, const void *src, size_t bytes) {
  TIMED(CT_PROF_MEMORY, inner->copy(dst, src, bytes));
}

static void p_synchronize(void) {
  TIMED(CT_PROF_MEMORY, inner->synchronize());
}

static void p_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  TIMED(CT_PROF_GEMM, inner->sgemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
}

static void p_sgemm_deterministic(int transA, int transB, int M, int N, int K, float alpha,
                                  const float *A, int lda, const float *B, int ldb, float beta,
                                  float *C, int ldc) {
  TIMED(CT_PROF_GEMM,
        inner->sgemm_deterministic(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
}

static void p_linear_fwd(int N, int K, int M, const float *x, int ldx, const float *w,
                         const float *b, float *y, int ldy) {
  TIMED(CT_PROF_GEMM, inner->linear_fwd(N, K, M, x, ldx, w, b, y, ldy));
}

static void p_linear_bwd(int N, int K, int M, const float *x, int ldx, const float *w,
                         const float *dy, int lddy, float *dx, int lddx, float beta_dx, float *dw,
                         float *db) {
  TIMED(CT_PROF_GEMM, inner->linear_bwd(N, K, M, x, ldx, w, dy, lddy, dx, lddx, beta_dx, dw, db));
}

static void p_linear_fwd_w(int N, int K, int M, const float *x, int ldx, const ct_wview *w,
                           const float *b, float *y, int ldy) {
  TIMED(CT_PROF_GEMM, inner->linear_fwd_w(N, K, M, x, ldx, w, b, y, ldy));
}

static void p_linear_bwd_w(int N, int K, int M, const float *x, int ldx, const ct_wview *w,
                           const float *dy, int lddy, float *dx, int lddx, float beta_dx, float *dw,
                           float *db) {
  TIMED(CT_PROF_GEMM, inner->linear_bwd_w(N, K, M, x, ldx, w, dy, lddy, dx, lddx, beta_dx, dw, db));
}

static void p_attention_fwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                            const float *k, const float *v, float *o, float *lse) {
  TIMED(CT_PROF_ATTENTION, inner->attention_fwd(B, H, L, hd, scale, causal, q, k, v, o, lse));
}

static void p_attention_bias_fwd(int B, int H, int L, int hd, float scale, const float *bias,
                                 const float *q, const float *k, const float *v, float *o) {
  TIMED(CT_PROF_ATTENTION, inner->attention_bias_fwd(B, H, L, hd, scale, bias, q, k, v, o));
}

static void p_attention_bwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                            const float *k, const float *v, const float *o, const float *lse,
                            const float *dout, float *dq, float *dk, float *dv) {
  TIMED(CT_PROF_ATTENTION,
        inner->attention_bwd(B, H, L, hd, scale, causal, q, k, v, o, lse, dout, dq, dk, dv));
}

static void p_rope_table(int L, const int *pos, const int axes[3], float theta, float *pe) {
  TIMED(CT_PROF_ROPE, inner->rope_table(L, pos, axes, theta, pe));
}

static void p_rope_fwd(int N, int L, int D, const float *pe, const float *x, int ldx, float *y,
                       int ldy) {
  TIMED(CT_PROF_ROPE, inner->rope_fwd(N, L, D, pe, x, ldx, y, ldy));
}

static void p_rope_bwd(int N, int L, int D, const float *pe, const float *dy, int lddy, float *dx,
                       int lddx) {
  TIMED(CT_PROF_ROPE, inner->rope_bwd(N, L, D, pe, dy, lddy, dx, lddx));
}

static void p_qkv_heads_fwd(int B, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                            const float *qscale, const float *kscale, const float *pe, float *q,
                            float *k, float *v, float *rstd_q, float *rstd_k) {
  TIMED(CT_PROF_ROPE, inner->qkv_heads_fwd(B, Ls, Lt, off, H, hd, qkv, qscale, kscale, pe, q, k, v,
                                           rstd_q, rstd_k));
}

static void p_qkv_heads_bwd(int B, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                            const float *qscale, const float *kscale, const float *pe,
                            const float *rstd_q, const float *rstd_k, const float *dq,
                            const float *dk, const float *dv, float *dqkv, float *dqscale,
                            float *dkscale) {
  TIMED(CT_PROF_ROPE, inner->qkv_heads_bwd(B, Ls, Lt, off, H, hd, qkv, qscale, kscale, pe, rstd_q,
                                           rstd_k, dq, dk, dv, dqkv, dqscale, dkscale));
}

static void p_ln_mod_fwd(int B, int L, int D, const float *x, int ldx, const float *shift,
                         const float *scale, int ldm, float eps, float *xhat, float *rstd, float *h,
                         int ldh) {
  TIMED(CT_PROF_NORM,
        inner->ln_mod_fwd(B, L, D, x, ldx, shift, scale, ldm, eps, xhat, rstd, h, ldh));
}

static void p_ln_mod_bwd(int B, int L, int D, const float *xhat, const float *rstd,
                         const float *scale, int ldm, const float *dh, int lddh, float *dx,
                         int lddx, float *dshift, float *dscale) {
  TIMED(CT_PROF_NORM,
        inner->ln_mod_bwd(B, L, D, xhat, rstd, scale, ldm, dh, lddh, dx, lddx, dshift, dscale));
}

static void p_layernorm_affine_fwd(int N, int D, const float *x, int ldx, const float *gamma,
                                   const float *beta, float eps, float *y, int ldy) {
  TIMED(CT_PROF_NORM, inner->layernorm_affine_fwd(N, D, x, ldx, gamma, beta, eps, y, ldy));
}

static void p_rmsnorm_fwd(int N, int D, const float *x, int ldx, const float *scale, float eps,
                          float *y, int ldy, float *rstd) {
  TIMED(CT_PROF_NORM, inner->rmsnorm_fwd(N, D, x, ldx, scale, eps, y, ldy, rstd));
}

static void p_rmsnorm_bwd(int N, int D, const float *x, int ldx, const float *scale,
                          const float *rstd, const float *dy, int lddy, float *dx, int lddx,
                          float *dscale) {
  TIMED(CT_PROF_NORM, inner->rmsnorm_bwd(N, D, x, ldx, scale, rstd, dy, lddy, dx, lddx, dscale));
}

static void p_groupnorm_fwd(int B, int C, int HW, int G, float eps, const float *x,
                            const float *gamma, const float *beta, float *y, float *mean,
                            float *rstd) {
  TIMED(CT_PROF_NORM, inner->groupnorm_fwd(B, C, HW, G, eps, x, gamma, beta, y, mean, rstd));
}

static void p_groupnorm_bwd(int B, int C, int HW, int G, const float *x, const float *gamma,
                            const float *mean, const float *rstd, const float *dy, float *dx,
                            float *dgamma, float *dbeta) {
  TIMED(CT_PROF_NORM,
        inner->groupnorm_bwd(B, C, HW, G, x, gamma, mean, rstd, dy, dx, dgamma, dbeta));
}

static size_t p_conv2d_col_floats(const ct_conv2d_shape *s) {
  stamp t0 = now_ns();
  size_t r = inner->conv2d_col_floats(s);
  add(CT_PROF_CONV, t0);
  return r;
}

static void p_conv2d_fwd(const ct_conv2d_shape *s, const float *x, const float *w, const float *b,
                         float *y, float *col) {
  TIMED(CT_PROF_CONV, inner->conv2d_fwd(s, x, w, b, y, col));
}

static void p_conv2d_bwd(const ct_conv2d_shape *s, const float *x, const float *w, const float *dy,
                         float *dx, float *dw, float *db, float *col) {
  TIMED(CT_PROF_CONV, inner->conv2d_bwd(s, x, w, dy, dx, dw, db, col));
}

static void p_upsample2x_fwd(int BC, int H, int W, const float *x, float *y) {
  TIMED(CT_PROF_PACKING, inner->upsample2x_fwd(BC, H, W, x, y));
}

static void p_upsample2x_bwd(int BC, int H, int W, const float *dy, float *dx) {
  TIMED(CT_PROF_PACKING, inner->upsample2x_bwd(BC, H, W, dy, dx));
}

static void p_nchw_to_nlc(int B, int C, int L, const float *x, float *y) {
  TIMED(CT_PROF_PACKING, inner->nchw_to_nlc(B, C, L, x, y));
}

static void p_nlc_to_nchw(int B, int C, int L, const float *x, float *y) {
  TIMED(CT_PROF_PACKING, inner->nlc_to_nchw(B, C, L, x, y));
}

static void p_tile_blend(int planes, int rows, int cols, int e, int vertical, const float *a,
                         size_t plane_a, int lda, float *b, size_t plane_b, int ldb) {
  TIMED(CT_PROF_PACKING,
        inner->tile_blend(planes, rows, cols, e, vertical, a, plane_a, lda, b, plane_b, ldb));
}

static void p_patchify(int B, int C, int H, int W, int p, const float *x, float *out) {
  TIMED(CT_PROF_PACKING, inner->patchify(B, C, H, W, p, x, out));
}

static void p_unpatchify(int B, int C, int H, int W, int p, const float *in, float *x) {
  TIMED(CT_PROF_PACKING, inner->unpatchify(B, C, H, W, p, in, x));
}

static void p_silu_fwd(int N, int D, const float *x, int ldx, float *y, int ldy) {
  TIMED(CT_PROF_ACTIVATION, inner->silu_fwd(N, D, x, ldx, y, ldy));
}

static void p_silu_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx,
                       int lddx) {
  TIMED(CT_PROF_ACTIVATION, inner->silu_bwd(N, D, x, ldx, dy, lddy, dx, lddx));
}

static void p_gelu_tanh_fwd(int N, int D, const float *x, int ldx, float *y, int ldy) {
  TIMED(CT_PROF_ACTIVATION, inner->gelu_tanh_fwd(N, D, x, ldx, y, ldy));
}

static void p_gelu_tanh_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy,
                            float *dx, int lddx) {
  TIMED(CT_PROF_ACTIVATION, inner->gelu_tanh_bwd(N, D, x, ldx, dy, lddy, dx, lddx));
}

static void p_quick_gelu_fwd(int N, int D, const float *x, int ldx, float *y, int ldy) {
  TIMED(CT_PROF_ACTIVATION, inner->quick_gelu_fwd(N, D, x, ldx, y, ldy));
}

static void p_gelu_erf_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy,
                           float *dx, int lddx) {
  TIMED(CT_PROF_ACTIVATION, inner->gelu_erf_bwd(N, D, x, ldx, dy, lddy, dx, lddx));
}

static void p_attention_cross_fwd(int B, int H, int Lq, int Lk, int hd, float scale, const float *q,
                                  const float *k, const float *v, float *o, float *lse) {
  TIMED(CT_PROF_ATTENTION, inner->attention_cross_fwd(B, H, Lq, Lk, hd, scale, q, k, v, o, lse));
}

static void p_attention_cross_bwd(int B, int H, int Lq, int Lk, int hd, float scale, const float *q,
                                  const float *k, const float *v, const float *o, const float *lse,
                                  const float *dout, float *dq, float *dk, float *dv) {
  TIMED(CT_PROF_ATTENTION,
        inner->attention_cross_bwd(B, H, Lq, Lk, hd, scale, q, k, v, o, lse, dout, dq, dk, dv));
}

static void p_attention_mask_fwd(int B, int H, int L, int hd, float scale, const float *mask,
                                 int additive, const float *q, const float *k, const float *v,
                                 float *o, float *lse) {
  TIMED(CT_PROF_ATTENTION,
        inner->attention_mask_fwd(B, H, L, hd, scale, mask, additive, q, k, v, o, lse));
}

static void p_attention_mask_bwd(int B, int H, int L, int hd, float scale, const float *mask,
                                 int additive, const float *q, const float *k, const float *v,
                                 const float *o, const float *lse, const float *dout, float *dq,
                                 float *dk, float *dv) {
  TIMED(CT_PROF_ATTENTION, inner->attention_mask_bwd(B, H, L, hd, scale, mask, additive, q, k, v, o,
                                                     lse, dout, dq, dk, dv));
}

static void p_gelu_erf_fwd(int N, int D, const float *x, int ldx, float *y, int ldy) {
  TIMED(CT_PROF_ACTIVATION, inner->gelu_erf_fwd(N, D, x, ldx, y, ldy));
}

static void p_gate_res_fwd(int B, int L, int D, const float *x, int ldx, const float *gate, int ldg,
                           const float *y, int ldy, float *out, int ldo) {
  TIMED(CT_PROF_MODULATION, inner->gate_res_fwd(B, L, D, x, ldx, gate, ldg, y, ldy, out, ldo));
}

static void p_gate_res_bwd(int B, int L, int D, const float *gate, int ldg, const float *y, int ldy,
                           const float *dout, int lddo, float *dy, int lddy, float *dgate) {
  TIMED(CT_PROF_MODULATION,
        inner->gate_res_bwd(B, L, D, gate, ldg, y, ldy, dout, lddo, dy, lddy, dgate));
}

static void p_add_inplace(size_t n, float *y, const float *x) {
  TIMED(CT_PROF_OTHER, inner->add_inplace(n, y, x));
}

static void p_scale_inplace(size_t n, float *x, float c) {
  TIMED(CT_PROF_OTHER, inner->scale_inplace(n, x, c));
}

static void p_mul_inplace(size_t n, float *y, const float *x) {
  TIMED(CT_PROF_OTHER, inner->mul_inplace(n, y, x));
}

static void p_copy_2d(int rows, int cols, const float *src, int lds, float *dst, int ldd) {
  TIMED(CT_PROF_PACKING, inner->copy_2d(rows, cols, src, lds, dst, ldd));
}

static void p_clamp_fwd(int rows, int cols, const float *x, int ldx, float lo, float hi, float *y,
                        int ldy) {
  TIMED(CT_PROF_OTHER, inner->clamp_fwd(rows, cols, x, ldx, lo, hi, y, ldy));
}

static void p_clamp_bwd(int rows, int cols, const float *x, int ldx, float lo, float hi,
                        const float *dy, int lddy, float *dx, int lddx) {
  TIMED(CT_PROF_OTHER, inner->clamp_bwd(rows, cols, x, ldx, lo, hi, dy, lddy, dx, lddx));
}

static void p_zero(size_t n, float *x) {
  TIMED(CT_PROF_OTHER, inner->zero(n, x));
}

static void p_timestep_embedding(int B, const float *t, int dim, float max_period,
                                 float time_factor, float *out) {
  TIMED(CT_PROF_OTHER, inner->timestep_embedding(B, t, dim, max_period, time_factor, out));
}

static void p_embedding_fwd(int N, int T, int D, const int32_t *ids, const float *tok,
                            const float *pos, float *y) {
  TIMED(CT_PROF_OTHER, inner->embedding_fwd(N, T, D, ids, tok, pos, y));
}

static float p_mse_fwd_bwd(size_t n, const float *pred, const float *target, float dloss,
                           float *dpred) {
  stamp t0 = now_ns();
  float r = inner->mse_fwd_bwd(n, pred, target, dloss, dpred);
  add(CT_PROF_OTHER, t0);
  return r;
}

static void p_adam_update(size_t n, float *w, const float *g, float *m, float *v, float lr,
                          float b1, float b2, float eps, float wd, int decoupled, long step) {
  TIMED(CT_PROF_OPTIMIZER, inner->adam_update(n, w, g, m, v, lr, b1, b2, eps, wd, decoupled, step));
}

static void p_adagrad_update(size_t n, float *w, const float *g, float *sum, float lr,
                             float lr_decay, float eps, float wd, long step) {
  TIMED(CT_PROF_OPTIMIZER, inner->adagrad_update(n, w, g, sum, lr, lr_decay, eps, wd, step));
}

static void p_lion_update(size_t n, float *w, const float *g, float *m, float lr, float b1,
                          float b2, float wd) {
  TIMED(CT_PROF_OPTIMIZER, inner->lion_update(n, w, g, m, lr, b1, b2, wd));
}

static void p_sgd_update(size_t n, float *w, const float *g, float *buf, float lr, float momentum,
                         float dampening, int nesterov, float wd, long step) {
  TIMED(CT_PROF_OPTIMIZER,
        inner->sgd_update(n, w, g, buf, lr, momentum, dampening, nesterov, wd, step));
}

static void p_ema_update(size_t n, float *e, const float *w, float decay) {
  TIMED(CT_PROF_OPTIMIZER, inner->ema_update(n, e, w, decay));
}

static double p_sumsq(size_t n, const float *x) {
  stamp t0 = now_ns();
  double r = inner->sumsq(n, x);
  add(CT_PROF_OPTIMIZER, t0);
  return r;
}

static void p_bf16_widen(size_t n, const uint16_t *src, float *dst) {
  TIMED(CT_PROF_OTHER, inner->bf16_widen(n, src, dst));
}

static void p_bf16_narrow(size_t n, const float *src, uint16_t *dst) {
  TIMED(CT_PROF_OTHER, inner->bf16_narrow(n, src, dst));
}

static void p_bf16_narrow_acc(size_t n, const float *src, uint16_t *dst) {
  TIMED(CT_PROF_OTHER, inner->bf16_narrow_acc(n, src, dst));
}

static void p_dropout_fwd(int N, int D, const float *x, int ldx, uint64_t seed, uint64_t stream,
                          const uint64_t *ctr, float p, float *xd) {
  TIMED(CT_PROF_OTHER, inner->dropout_fwd(N, D, x, ldx, seed, stream, ctr, p, xd));
}

static void p_dropout_bwd(int N, int D, const float *dxd, uint64_t seed, uint64_t stream,
                          const uint64_t *ctr, float p, float *dx, int lddx) {
  TIMED(CT_PROF_OTHER, inner->dropout_bwd(N, D, dxd, seed, stream, ctr, p, dx, lddx));
}

/* every wrapper; prof_ops is this with the wrapped backend's properties and
 * without the ops it lacks */
static const ct_backend_ops prof_all = {
    .name = "cpu-profiled",
    .description = "the wrapped backend's ops, each timed into its op family",
    .precision_bits = 24,
    .alloc = p_alloc,
    .free = p_free,
    .copy_in = p_copy_in,
    .copy_out = p_copy_out,
    .copy = p_copy,
    .synchronize = p_synchronize,
    .sgemm = p_sgemm,
    .sgemm_deterministic = p_sgemm_deterministic,
    .linear_fwd = p_linear_fwd,
    .linear_bwd = p_linear_bwd,
    .linear_fwd_w = p_linear_fwd_w,
    .linear_bwd_w = p_linear_bwd_w,
    .attention_fwd = p_attention_fwd,
    .attention_bias_fwd = p_attention_bias_fwd,
    .attention_bwd = p_attention_bwd,
    .attention_cross_fwd = p_attention_cross_fwd,
    .attention_cross_bwd = p_attention_cross_bwd,
    .attention_mask_fwd = p_attention_mask_fwd,
    .attention_mask_bwd = p_attention_mask_bwd,
    .rope_table = p_rope_table,
    .rope_fwd = p_rope_fwd,
    .rope_bwd = p_rope_bwd,
    .qkv_heads_fwd = p_qkv_heads_fwd,
    .qkv_heads_bwd = p_qkv_heads_bwd,
    .ln_mod_fwd = p_ln_mod_fwd,
    .ln_mod_bwd = p_ln_mod_bwd,
    .layernorm_affine_fwd = p_layernorm_affine_fwd,
    .rmsnorm_fwd = p_rmsnorm_fwd,
    .rmsnorm_bwd = p_rmsnorm_bwd,
    .groupnorm_fwd = p_groupnorm_fwd,
    .groupnorm_bwd = p_groupnorm_bwd,
    .conv2d_col_floats = p_conv2d_col_floats,
    .conv2d_fwd = p_conv2d_fwd,
    .conv2d_bwd = p_conv2d_bwd,
    .upsample2x_fwd = p_upsample2x_fwd,
    .upsample2x_bwd = p_upsample2x_bwd,
    .nchw_to_nlc = p_nchw_to_nlc,
    .nlc_to_nchw = p_nlc_to_nchw,
    .tile_blend = p_tile_blend,
    .patchify = p_patchify,
    .unpatchify = p_unpatchify,
    .silu_fwd = p_silu_fwd,
    .silu_bwd = p_silu_bwd,
    .gelu_tanh_fwd = p_gelu_tanh_fwd,
    .gelu_tanh_bwd = p_gelu_tanh_bwd,
    .quick_gelu_fwd = p_quick_gelu_fwd,
    .gelu_erf_fwd = p_gelu_erf_fwd,
    .gelu_erf_bwd = p_gelu_erf_bwd,
    .gate_res_fwd = p_gate_res_fwd,
    .gate_res_bwd = p_gate_res_bwd,
    .add_inplace = p_add_inplace,
    .scale_inplace = p_scale_inplace,
    .mul_inplace = p_mul_inplace,
    .copy_2d = p_copy_2d,
    .clamp_fwd = p_clamp_fwd,
    .clamp_bwd = p_clamp_bwd,
    .zero = p_zero,
    .timestep_embedding = p_timestep_embedding,
    .embedding_fwd = p_embedding_fwd,
    .mse_fwd_bwd = p_mse_fwd_bwd,
    .adam_update = p_adam_update,
    .adagrad_update = p_adagrad_update,
    .lion_update = p_lion_update,
    .sgd_update = p_sgd_update,
    .ema_update = p_ema_update,
    .sumsq = p_sumsq,
    .bf16_widen = p_bf16_widen,
    .bf16_narrow = p_bf16_narrow,
    .bf16_narrow_acc = p_bf16_narrow_acc,
    .dropout_fwd = p_dropout_fwd,
    .dropout_bwd = p_dropout_bwd,
};

static ct_backend_ops prof_ops;

const ct_backend_ops *ct_backend_profiled(const ct_backend_ops *wrapped) {
  inner = wrapped;
  prof_ops = prof_all;
  prof_ops.precision_bits = wrapped->precision_bits;
  prof_ops.compute = wrapped->compute;
  prof_ops.host_memory = wrapped->host_memory;
  prof_ops.check = wrapped->check;
  prof_ops.gemm_peak = wrapped->gemm_peak;
  prof_ops.copy_peak = wrapped->copy_peak;
#define CT_X(f) \
  if (!wrapped->f) prof_ops.f = NULL;
  CT_BACKEND_OP_FIELDS(CT_X)
#undef CT_X
  return &prof_ops;
}

void ct_prof_set_phase(ct_prof_phase p) {
  if (p >= 0 && p < CT_PROF_NPHASES) __atomic_store_n(&phase, (int)p, __ATOMIC_RELAXED);
}

void ct_prof_add(ct_prof_family f, double seconds, double cpu_seconds) {
  if (f < 0 || f >= CT_PROF_NFAMILIES) return;
  int p = __atomic_load_n(&phase, __ATOMIC_RELAXED);
  if (seconds > 0) __atomic_fetch_add(&ns[p][f], (uint64_t)(seconds * 1e9), __ATOMIC_RELAXED);
  if (cpu_seconds > 0)
    __atomic_fetch_add(&cpu_ns[p][f], (uint64_t)(cpu_seconds * 1e9), __ATOMIC_RELAXED);
  __atomic_fetch_add(&calls[p][f], 1, __ATOMIC_RELAXED);
}

double ct_prof_cpu_now(void) {
  return 1e-9 * (double)clock_ns(CLOCK_PROCESS_CPUTIME_ID);
}

void ct_prof_reset(void) {
  for (int p = 0; p < CT_PROF_NPHASES; p++)
    for (int f = 0; f < CT_PROF_NFAMILIES; f++) {
      __atomic_store_n(&ns[p][f], 0, __ATOMIC_RELAXED);
      __atomic_store_n(&cpu_ns[p][f], 0, __ATOMIC_RELAXED);
      __atomic_store_n(&calls[p][f], 0, __ATOMIC_RELAXED);
    }
}

void ct_prof_read(ct_prof_counts *out) {
  for (int p = 0; p < CT_PROF_NPHASES; p++)
    for (int f = 0; f < CT_PROF_NFAMILIES; f++) {
      out->seconds[p][f] = 1e-9 * (double)__atomic_load_n(&ns[p][f], __ATOMIC_RELAXED);
      out->cpu_seconds[p][f] = 1e-9 * (double)__atomic_load_n(&cpu_ns[p][f], __ATOMIC_RELAXED);
      out->calls[p][f] = (long)__atomic_load_n(&calls[p][f], __ATOMIC_RELAXED);
    }
}

const char *ct_prof_family_name(ct_prof_family f) {
  static const char *const names[CT_PROF_NFAMILIES] = {
      "gemm",      "attention", "norm", "rope",   "modulation", "activation",
      "optimizer", "packing",   "conv", "memory", "other"};
  return f >= 0 && f < CT_PROF_NFAMILIES ? names[f] : "?";
}

const char *ct_prof_phase_name(ct_prof_phase p) {
  static const char *const names[CT_PROF_NPHASES] = {"forward", "backward", "step"};
  return p >= 0 && p < CT_PROF_NPHASES ? names[p] : "?";
}

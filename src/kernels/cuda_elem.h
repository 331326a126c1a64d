/* The CUDA backend's element-wise, activation, layout, normalisation,
 * position, embedding, loss and optimizer kernels (src/kernels/cuda/, one .cu per family):
 * one entry point per table field, named ct_cu_<field>, with the signature
 * and contract of the CPU kernel of the same name in include/ctuner/kernels.h
 * (leading dimensions, "+=" versus overwrite, NULL optional outputs). Pointers
 * are device memory except where kernels.h says host (rope_table's pos,
 * embedding_fwd's ids, the dropout counters). Every op is issued on the
 * backend's one stream; only mse_fwd_bwd and sumsq wait (they return a sum).
 * Reductions have one fixed order (set by the shapes, never by the device):
 * run-to-run bit-identical, no atomics. Private to src/kernels; C linkage;
 * built only with CT_CUDA.
 */
#ifndef CT_KERNELS_CUDA_ELEM_H
#define CT_KERNELS_CUDA_ELEM_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/kernels.h"

/* ---- activations, gated residual, element-wise (cuda/elem.cu) ---- */
void ct_cu_silu_fwd(int N, int D, const float *x, int ldx, float *y, int ldy);
void ct_cu_silu_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx,
                    int lddx);
void ct_cu_gelu_tanh_fwd(int N, int D, const float *x, int ldx, float *y, int ldy);
void ct_cu_gelu_tanh_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy,
                         float *dx, int lddx);
void ct_cu_quick_gelu_fwd(int N, int D, const float *x, int ldx, float *y, int ldy);
void ct_cu_gelu_erf_fwd(int N, int D, const float *x, int ldx, float *y, int ldy);
void ct_cu_gate_res_fwd(int B, int L, int D, const float *x, int ldx, const float *gate, int ldg,
                        const float *y, int ldy, float *out, int ldo);
void ct_cu_gate_res_bwd(int B, int L, int D, const float *gate, int ldg, const float *y, int ldy,
                        const float *dout, int lddo, float *dy, int lddy, float *dgate);
void ct_cu_add_inplace(size_t n, float *y, const float *x);
void ct_cu_scale_inplace(size_t n, float *x, float c);
void ct_cu_mul_inplace(size_t n, float *y, const float *x);
void ct_cu_copy_2d(int rows, int cols, const float *src, int lds, float *dst, int ldd);
void ct_cu_zero(size_t n, float *x);
void ct_cu_clamp_fwd(int rows, int cols, const float *x, int ldx, float lo, float hi, float *y,
                     int ldy);
void ct_cu_clamp_bwd(int rows, int cols, const float *x, int ldx, float lo, float hi,
                     const float *dy, int lddy, float *dx, int lddx);

/* ---- image layout (cuda/layout.cu) ---- */
void ct_cu_patchify(int B, int C, int H, int W, int p, const float *x, float *out);
void ct_cu_unpatchify(int B, int C, int H, int W, int p, const float *in, float *x);
void ct_cu_nchw_to_nlc(int B, int C, int L, const float *x, float *y);
void ct_cu_nlc_to_nchw(int B, int C, int L, const float *x, float *y);
void ct_cu_upsample2x_fwd(int BC, int H, int W, const float *x, float *y);
void ct_cu_upsample2x_bwd(int BC, int H, int W, const float *dy, float *dx);
void ct_cu_tile_blend(int planes, int rows, int cols, int e, int vertical, const float *a,
                      size_t plane_a, int lda, float *b, size_t plane_b, int ldb);

/* ---- normalisations (cuda/norm.cu) ---- */
void ct_cu_ln_mod_fwd(int B, int L, int D, const float *x, int ldx, const float *shift,
                      const float *scale, int ldm, float eps, float *xhat, float *rstd, float *h,
                      int ldh);
void ct_cu_ln_mod_bwd(int B, int L, int D, const float *xhat, const float *rstd, const float *scale,
                      int ldm, const float *dh, int lddh, float *dx, int lddx, float *dshift,
                      float *dscale);
void ct_cu_layernorm_affine_fwd(int N, int D, const float *x, int ldx, const float *gamma,
                                const float *beta, float eps, float *y, int ldy);
void ct_cu_rmsnorm_fwd(int N, int D, const float *x, int ldx, const float *scale, float eps,
                       float *y, int ldy, float *rstd);
void ct_cu_rmsnorm_bwd(int N, int D, const float *x, int ldx, const float *scale, const float *rstd,
                       const float *dy, int lddy, float *dx, int lddx, float *dscale);
void ct_cu_groupnorm_fwd(int B, int C, int HW, int G, float eps, const float *x, const float *gamma,
                         const float *beta, float *y, float *mean, float *rstd);
void ct_cu_groupnorm_bwd(int B, int C, int HW, int G, const float *x, const float *gamma,
                         const float *mean, const float *rstd, const float *dy, float *dx,
                         float *dgamma, float *dbeta);

/* ---- positions (cuda/rope.cu) ---- */
void ct_cu_rope_table(int L, const int *pos, const int axes[3], float theta, float *pe);
void ct_cu_rope_fwd(int N, int L, int D, const float *pe, const float *x, int ldx, float *y,
                    int ldy);
void ct_cu_rope_bwd(int N, int L, int D, const float *pe, const float *dy, int lddy, float *dx,
                    int lddx);
void ct_cu_qkv_heads_fwd(int B, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                         const float *qscale, const float *kscale, const float *pe, float *q,
                         float *k, float *v, float *rstd_q, float *rstd_k);
void ct_cu_qkv_heads_bwd(int B, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                         const float *qscale, const float *kscale, const float *pe,
                         const float *rstd_q, const float *rstd_k, const float *dq, const float *dk,
                         const float *dv, float *dqkv, float *dqscale, float *dkscale);

/* ---- embeddings, loss, optimizer math (cuda/optim.cu) ---- */
void ct_cu_timestep_embedding(int B, const float *t, int dim, float max_period, float time_factor,
                              float *out);
void ct_cu_embedding_fwd(int N, int T, int D, const int32_t *ids, const float *tok,
                         const float *pos, float *y);
float ct_cu_mse_fwd_bwd(size_t n, const float *pred, const float *target, float dloss,
                        float *dpred);
void ct_cu_adam_update(size_t n, float *w, const float *g, float *m, float *v, float lr, float b1,
                       float b2, float eps, float wd, int decoupled, long step);
void ct_cu_adagrad_update(size_t n, float *w, const float *g, float *sum, float lr, float lr_decay,
                          float eps, float wd, long step);
void ct_cu_lion_update(size_t n, float *w, const float *g, float *m, float lr, float b1, float b2,
                       float wd);
void ct_cu_sgd_update(size_t n, float *w, const float *g, float *buf, float lr, float momentum,
                      float dampening, int nesterov, float wd, long step);
void ct_cu_ema_update(size_t n, float *e, const float *w, float decay);
double ct_cu_sumsq(size_t n, const float *x);

/* ---- ops not yet in the table (the lead wires them at merge) ---- */
void ct_cu_bf16_widen(size_t n, const uint16_t *src, float *dst);      /* dst[i] = float(src[i]) */
void ct_cu_bf16_narrow(size_t n, const float *src, uint16_t *dst);     /* ct_f32_to_bf16 */
void ct_cu_bf16_narrow_acc(size_t n, const float *src, uint16_t *dst); /* bf16(dst + src) */
/* LoRA dropout, row n of N (width D): u[c] = ct_rng_fill_uniform(u, D, seed,
 * stream, ctr[n], 0, 1)[c]; xd[n*D + c] = u[c] < p ? 0 : x[n*ldx + c] * keep,
 * keep = ct_cu_dropout_keep(p) = (float)(1.0 / (1.0 - (double)p)). ctr (N) is
 * host memory. The backward: dx[n*lddx + c] += dxd[n*D + c] * keep where kept. */
void ct_cu_dropout_fwd(int N, int D, const float *x, int ldx, uint64_t seed, uint64_t stream,
                       const uint64_t *ctr, float p, float *xd);
void ct_cu_dropout_bwd(int N, int D, const float *dxd, uint64_t seed, uint64_t stream,
                       const uint64_t *ctr, float p, float *dx, int lddx);
float ct_cu_dropout_keep(float p);
/* The same with keep given: lora.c computes keep from the configured dropout
 * in double, (float)(1.0 / (1.0 - dropout)), which for some p (0.33, 0.45,
 * 0.6, ...) is an ulp away from ct_cu_dropout_keep((float)dropout); a caller
 * that wants lora.c's bits passes that keep here. */
void ct_cu_dropout_fwd_keep(int N, int D, const float *x, int ldx, uint64_t seed, uint64_t stream,
                            const uint64_t *ctr, float p, float keep, float *xd);
void ct_cu_dropout_bwd_keep(int N, int D, const float *dxd, uint64_t seed, uint64_t stream,
                            const uint64_t *ctr, float p, float keep, float *dx, int lddx);

/* ---- host mirrors (no device; for tests/test_cuda_host.c) ----
 * Known-answer and internal checks of the kernels' per-element math
 * (cuda/elem_math.cuh) run on the host: the number of failures (0: all good),
 * the first one described in msg (cuda/selftest.cu). */
int ct_cu_selftest_host(char *msg, size_t cap);
float ct_cuh_uniform(uint64_t seed, uint64_t stream, uint64_t index);
void ct_cuh_philox_raw(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
uint16_t ct_cuh_f32_to_bf16(float f);
float ct_cuh_bf16_to_f32(uint16_t h);
/* ct_cuh_X: the entry point ct_cu_X with the same code and functor, run on
 * the host over host memory (every pointer host memory): the kernels'
 * indexing and arithmetic, checked against the CPU kernels. */
void ct_cuh_silu_fwd(int N, int D, const float *x, int ldx, float *y, int ldy);
void ct_cuh_silu_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx,
                     int lddx);
void ct_cuh_gelu_tanh_fwd(int N, int D, const float *x, int ldx, float *y, int ldy);
void ct_cuh_gelu_tanh_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy,
                          float *dx, int lddx);
void ct_cuh_quick_gelu_fwd(int N, int D, const float *x, int ldx, float *y, int ldy);
void ct_cuh_gelu_erf_fwd(int N, int D, const float *x, int ldx, float *y, int ldy);
void ct_cuh_gate_res_fwd(int B, int L, int D, const float *x, int ldx, const float *gate, int ldg,
                         const float *y, int ldy, float *out, int ldo);
void ct_cuh_clamp_fwd(int rows, int cols, const float *x, int ldx, float lo, float hi, float *y,
                      int ldy);
void ct_cuh_clamp_bwd(int rows, int cols, const float *x, int ldx, float lo, float hi,
                      const float *dy, int lddy, float *dx, int lddx);
void ct_cuh_patchify(int B, int C, int H, int W, int p, const float *x, float *out);
void ct_cuh_unpatchify(int B, int C, int H, int W, int p, const float *in, float *x);
void ct_cuh_nchw_to_nlc(int B, int C, int L, const float *x, float *y);
void ct_cuh_nlc_to_nchw(int B, int C, int L, const float *x, float *y);
void ct_cuh_upsample2x_fwd(int BC, int H, int W, const float *x, float *y);
void ct_cuh_upsample2x_bwd(int BC, int H, int W, const float *dy, float *dx);
void ct_cuh_tile_blend(int planes, int rows, int cols, int e, int vertical, const float *a,
                       size_t plane_a, int lda, float *b, size_t plane_b, int ldb);
void ct_cuh_rope_table(int L, const int *pos, const int axes[3], float theta, float *pe);
void ct_cuh_rope_fwd(int N, int L, int D, const float *pe, const float *x, int ldx, float *y,
                     int ldy);
void ct_cuh_rope_bwd(int N, int L, int D, const float *pe, const float *dy, int lddy, float *dx,
                     int lddx);
void ct_cuh_timestep_embedding(int B, const float *t, int dim, float max_period, float time_factor,
                               float *out);
void ct_cuh_embedding_fwd(int N, int T, int D, const int32_t *ids, const float *tok,
                          const float *pos, float *y);
void ct_cuh_adam_update(size_t n, float *w, const float *g, float *m, float *v, float lr, float b1,
                        float b2, float eps, float wd, int decoupled, long step);
void ct_cuh_adagrad_update(size_t n, float *w, const float *g, float *sum, float lr, float lr_decay,
                           float eps, float wd, long step);
void ct_cuh_lion_update(size_t n, float *w, const float *g, float *m, float lr, float b1, float b2,
                        float wd);
void ct_cuh_sgd_update(size_t n, float *w, const float *g, float *buf, float lr, float momentum,
                       float dampening, int nesterov, float wd, long step);
void ct_cuh_ema_update(size_t n, float *e, const float *w, float decay);
void ct_cuh_bf16_widen(size_t n, const uint16_t *src, float *dst);
void ct_cuh_bf16_narrow(size_t n, const float *src, uint16_t *dst);
void ct_cuh_bf16_narrow_acc(size_t n, const float *src, uint16_t *dst);
void ct_cuh_dropout_fwd(int N, int D, const float *x, int ldx, uint64_t seed, uint64_t stream,
                        const uint64_t *ctr, float p, float *xd);
void ct_cuh_dropout_bwd(int N, int D, const float *dxd, uint64_t seed, uint64_t stream,
                        const uint64_t *ctr, float p, float *dx, int lddx);

#endif

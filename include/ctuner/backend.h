/* Compute backends: every operation a model, an optimizer or the step needs,
 * as one table of function pointers per device (ggml's ggml_backend_i).
 *
 * A backend owns where its buffers live and how its ops compute. Pointers that
 * an op takes or writes point into the backend's memory (alloc, copy_in); for
 * the CPU backend that is host memory and every op is the kernel of the same
 * name in include/ctuner/kernels.h, so the CPU backend gives the very bits the
 * free kernel functions give. Scalars (shapes, hyperparameters, the
 * ct_conv2d_shape, the rope table's positions) are host values; the few
 * scalar results (mse, sumsq) come back on the host. Each op has the contract
 * written beside its kernel in kernels.h (leading dimensions, what accumulates
 * with "+=" and what is overwritten, what may be NULL).
 *
 * Ops may run asynchronously with respect to the host; copy_out and
 * synchronize wait for everything issued before them (the CPU backend runs
 * each op to completion).
 *
 * Adding a backend (CUDA, ...): one file defining a const
 * ct_backend_ops with every pointer set, one row in the registry
 * (src/kernels/backend.c), and tests/test_backend.c — which runs every op of
 * every registered backend against plain-C references, forward and
 * finite-difference gradients — passing for it. The free kernel functions stay
 * the CPU implementation.
 */
#ifndef CTUNER_BACKEND_H
#define CTUNER_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/alloc.h"
#include "ctuner/kernels.h"
#include "ctuner/status.h"

typedef struct ct_backend_ops ct_backend_ops;

/* What a backend's matrix products compute in (docs/gemm.md, "bf16 compute"):
 * float32, or bf16 operands (rounded to nearest even) with float32 sums —
 * --mixed_precision bf16, as PyTorch's CPU autocast does for linear, matmul
 * and convolutions. The ops it covers are sgemm, linear_fwd/bwd and
 * conv2d_fwd/bwd (so LoRA's adapter products too) and attention_fwd/bwd
 * (the fused kernel's bf16 products; the softmax stays float32).
 * Everything else — norms' statistics, softmax, RoPE, activations,
 * modulation, losses, reductions, the optimizer math, sgemm_deterministic
 * (Muon) — is float32 in either. */
typedef enum { CT_COMPUTE_F32 = 0, CT_COMPUTE_BF16 = 1 } ct_compute;

struct ct_backend_ops {
  const char *name;        /* "cpu": the registry key */
  const char *description; /* one line for listings */
  /* Significand bits of the arithmetic the ops store in (24: float32, 8:
   * bfloat16); the comparison test scales its tolerances to it. */
  int precision_bits;
  /* The arithmetic of the matrix products (above); the CPU backend "cpu" is
   * CT_COMPUTE_F32, its sibling "cpu-bf16" (same memory, same other ops)
   * CT_COMPUTE_BF16 with precision_bits 8. ct_backend_with_compute finds one
   * from the other. */
  ct_compute compute;
  /* 1 when the host may read and write this backend's memory through its
   * pointers (cpu, cpu-bf16); 0 when only copy_in/copy_out reach it (cuda,
   * and the test backend "sealed" whose pages the host cannot touch). Code
   * outside a backend never dereferences a pointer of a backend with 0. */
  int host_memory;
  /* Optional (NULL: always usable). Run once, before the registry lists or
   * returns the backend: CT_OK when it can run here, else why not (no CUDA
   * device, driver too old). It may fill `description` with the device. */
  ct_status (*init)(ct_err *err);
  /* Optional (NULL: ops cannot fail). The first error an asynchronous op
   * met since the last call (a CUDA launch or memory fault), as
   * CT_ERR_DEVICE with its message, cleared on read; callers check it at
   * their synchronisation points (after a micro-batch, a copy_out). */
  ct_status (*check)(ct_err *err);
  /* Optional (NULL on the CPU backends, whose yardsticks are bench peak's own
   * loops): the device's GEMM rate in GFLOP/s on an n x n x n product with
   * operands stored in bf16 (bf16 = 1; float32 sums) or float32, through the
   * vendor library, and its device-to-device copy rate in GB/s counting bytes
   * read and written (`ctuner bench peak --backend`, docs/cuda.md). */
  double (*gemm_peak)(int n, int bf16);
  double (*copy_peak)(size_t bytes);

  /* Ops a backend does not have are NULL (ct_backend_lacks names them; the
   * models refuse such a backend by name before computing); the memory
   * functions are always set. */

  /* ---- memory ---- */
  /* bytes of backend memory counted under cat (ct_mem_get_stats), aligned for
   * any op; NULL on failure or bytes == 0. free(NULL) is a no-op. */
  void *(*alloc)(ct_mem_cat cat, size_t bytes);
  void (*free)(void *p);
  /* host -> backend; host_src may be reused once it returns (the trainer refills its staging
   * buffers right after) */
  void (*copy_in)(void *dst, const void *host_src, size_t bytes);
  void (*copy_out)(void *host_dst, const void *src, size_t bytes); /* backend -> host; waits */
  void (*copy)(void *dst, const void *src, size_t bytes);          /* backend -> backend */
  void (*synchronize)(void); /* wait for every op issued so far */

  /* ---- matrix products ---- */
  void (*sgemm)(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc);
  /* as sgemm, bitwise the same for any thread count (Muon) */
  void (*sgemm_deterministic)(int transA, int transB, int M, int N, int K, float alpha,
                              const float *A, int lda, const float *B, int ldb, float beta,
                              float *C, int ldc);
  void (*linear_fwd)(int N, int K, int M, const float *x, int ldx, const float *w, const float *b,
                     float *y, int ldy);
  void (*linear_bwd)(int N, int K, int M, const float *x, int ldx, const float *w, const float *dy,
                     int lddy, float *dx, int lddx, float beta_dx, float *dw, float *db);
  /* the same with the weight a view (bf16 / int8 frozen weights, dequantised
   * while packing; the view's data and scales are backend memory) */
  void (*linear_fwd_w)(int N, int K, int M, const float *x, int ldx, const ct_wview *w,
                       const float *b, float *y, int ldy);
  void (*linear_bwd_w)(int N, int K, int M, const float *x, int ldx, const ct_wview *w,
                       const float *dy, int lddy, float *dx, int lddx, float beta_dx, float *dw,
                       float *db);

  /* ---- attention and positions ---- */
  void (*attention_fwd)(int B, int H, int L, int hd, float scale, int causal, const float *q,
                        const float *k, const float *v, float *o, float *lse);
  /* forward only, bias (H, L, L) added to the scores (T5) */
  void (*attention_bias_fwd)(int B, int H, int L, int hd, float scale, const float *bias,
                             const float *q, const float *k, const float *v, float *o);
  void (*attention_bwd)(int B, int H, int L, int hd, float scale, int causal, const float *q,
                        const float *k, const float *v, const float *o, const float *lse,
                        const float *dout, float *dq, float *dk, float *dv);
  /* queries and keys of different lengths (cross-attention, not causal) */
  void (*attention_cross_fwd)(int B, int H, int Lq, int Lk, int hd, float scale, const float *q,
                              const float *k, const float *v, float *o, float *lse);
  void (*attention_cross_bwd)(int B, int H, int Lq, int Lk, int hd, float scale, const float *q,
                              const float *k, const float *v, const float *o, const float *lse,
                              const float *dout, float *dq, float *dk, float *dv);
  /* joint attention with a per-token padding mask (B, L) in backend memory,
   * 1 real / 0 padding: additive 0 = boolean m_i AND m_j, additive 1 = m_i m_j
   * added to the scores (ct_attention_mask_fwd, docs/chroma.md) */
  void (*attention_mask_fwd)(int B, int H, int L, int hd, float scale, const float *mask,
                             int additive, const float *q, const float *k, const float *v, float *o,
                             float *lse);
  void (*attention_mask_bwd)(int B, int H, int L, int hd, float scale, const float *mask,
                             int additive, const float *q, const float *k, const float *v,
                             const float *o, const float *lse, const float *dout, float *dq,
                             float *dk, float *dv);
  /* pos (L, 3) is host memory, pe backend memory */
  void (*rope_table)(int L, const int *pos, const int axes[3], float theta, float *pe);
  void (*rope_fwd)(int N, int L, int D, const float *pe, const float *x, int ldx, float *y,
                   int ldy);
  void (*rope_bwd)(int N, int L, int D, const float *pe, const float *dy, int lddy, float *dx,
                   int lddx);
  void (*qkv_heads_fwd)(int B, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                        const float *qscale, const float *kscale, const float *pe, float *q,
                        float *k, float *v, float *rstd_q, float *rstd_k);
  void (*qkv_heads_bwd)(int B, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                        const float *qscale, const float *kscale, const float *pe,
                        const float *rstd_q, const float *rstd_k, const float *dq, const float *dk,
                        const float *dv, float *dqkv, float *dqscale, float *dkscale);

  /* ---- normalisations ---- */
  void (*ln_mod_fwd)(int B, int L, int D, const float *x, int ldx, const float *shift,
                     const float *scale, int ldm, float eps, float *xhat, float *rstd, float *h,
                     int ldh);
  void (*ln_mod_bwd)(int B, int L, int D, const float *xhat, const float *rstd, const float *scale,
                     int ldm, const float *dh, int lddh, float *dx, int lddx, float *dshift,
                     float *dscale);
  void (*layernorm_affine_fwd)(int N, int D, const float *x, int ldx, const float *gamma,
                               const float *beta, float eps, float *y, int ldy);
  void (*rmsnorm_fwd)(int N, int D, const float *x, int ldx, const float *scale, float eps,
                      float *y, int ldy, float *rstd);
  void (*rmsnorm_bwd)(int N, int D, const float *x, int ldx, const float *scale, const float *rstd,
                      const float *dy, int lddy, float *dx, int lddx, float *dscale);
  void (*groupnorm_fwd)(int B, int C, int HW, int G, float eps, const float *x, const float *gamma,
                        const float *beta, float *y, float *mean, float *rstd);
  void (*groupnorm_bwd)(int B, int C, int HW, int G, const float *x, const float *gamma,
                        const float *mean, const float *rstd, const float *dy, float *dx,
                        float *dgamma, float *dbeta);

  /* ---- convolutions and image layout ---- */
  /* floats of scratch conv2d_fwd/bwd take as col (allocate it on the backend) */
  size_t (*conv2d_col_floats)(const ct_conv2d_shape *s);
  void (*conv2d_fwd)(const ct_conv2d_shape *s, const float *x, const float *w, const float *b,
                     float *y, float *col);
  void (*conv2d_bwd)(const ct_conv2d_shape *s, const float *x, const float *w, const float *dy,
                     float *dx, float *dw, float *db, float *col);
  void (*upsample2x_fwd)(int BC, int H, int W, const float *x, float *y);
  void (*upsample2x_bwd)(int BC, int H, int W, const float *dy, float *dx);
  void (*nchw_to_nlc)(int B, int C, int L, const float *x, float *y);
  void (*nlc_to_nchw)(int B, int C, int L, const float *x, float *y);
  void (*tile_blend)(int planes, int rows, int cols, int e, int vertical, const float *a,
                     size_t plane_a, int lda, float *b, size_t plane_b, int ldb);
  void (*patchify)(int B, int C, int H, int W, int p, const float *x, float *out);
  void (*unpatchify)(int B, int C, int H, int W, int p, const float *in, float *x);

  /* ---- activations, elementwise, embeddings, loss ---- */
  void (*silu_fwd)(int N, int D, const float *x, int ldx, float *y, int ldy);
  void (*silu_bwd)(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx,
                   int lddx);
  void (*gelu_tanh_fwd)(int N, int D, const float *x, int ldx, float *y, int ldy);
  void (*gelu_tanh_bwd)(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx,
                        int lddx);
  void (*quick_gelu_fwd)(int N, int D, const float *x, int ldx, float *y, int ldy);
  void (*gelu_erf_fwd)(int N, int D, const float *x, int ldx, float *y, int ldy);
  void (*gelu_erf_bwd)(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx,
                       int lddx);
  void (*gate_res_fwd)(int B, int L, int D, const float *x, int ldx, const float *gate, int ldg,
                       const float *y, int ldy, float *out, int ldo);
  void (*gate_res_bwd)(int B, int L, int D, const float *gate, int ldg, const float *y, int ldy,
                       const float *dout, int lddo, float *dy, int lddy, float *dgate);
  void (*add_inplace)(size_t n, float *y, const float *x);
  void (*scale_inplace)(size_t n, float *x, float c);
  void (*mul_inplace)(size_t n, float *y, const float *x);
  void (*copy_2d)(int rows, int cols, const float *src, int lds, float *dst, int ldd);
  void (*clamp_fwd)(int rows, int cols, const float *x, int ldx, float lo, float hi, float *y,
                    int ldy);
  void (*clamp_bwd)(int rows, int cols, const float *x, int ldx, float lo, float hi,
                    const float *dy, int lddy, float *dx, int lddx);
  void (*zero)(size_t n, float *x);
  void (*timestep_embedding)(int B, const float *t, int dim, float max_period, float time_factor,
                             float *out);
  /* ids (N) host memory, as rope_table's pos */
  void (*embedding_fwd)(int N, int T, int D, const int32_t *ids, const float *tok, const float *pos,
                        float *y);
  float (*mse_fwd_bwd)(size_t n, const float *pred, const float *target, float dloss, float *dpred);

  /* ---- optimizer math ---- */
  void (*adam_update)(size_t n, float *w, const float *g, float *m, float *v, float lr, float b1,
                      float b2, float eps, float wd, int decoupled, long step);
  void (*adagrad_update)(size_t n, float *w, const float *g, float *sum, float lr, float lr_decay,
                         float eps, float wd, long step);
  void (*lion_update)(size_t n, float *w, const float *g, float *m, float lr, float b1, float b2,
                      float wd);
  void (*sgd_update)(size_t n, float *w, const float *g, float *buf, float lr, float momentum,
                     float dampening, int nesterov, float wd, long step);
  void (*ema_update)(size_t n, float *e, const float *w, float decay);
  double (*sumsq)(size_t n, const float *x);

  /* ---- residency: bf16 storage, LoRA dropout (kernels.h, "residency") ---- */
  void (*bf16_widen)(size_t n, const uint16_t *src, float *dst);  /* dst[i] = float(src[i]) */
  void (*bf16_narrow)(size_t n, const float *src, uint16_t *dst); /* dst[i] = bf16 RNE of src[i] */
  void (*bf16_narrow_acc)(size_t n, const float *src,
                          uint16_t *dst); /* dst[i] = bf16(float(dst[i]) + src[i]) */
  /* LoRA dropout, row n of N (width D): u = the D Philox uniforms
   * ct_rng_fill_uniform(u, D, seed, stream, ctr[n], 0, 1) gives for that row;
   * keep = (float)(1 / (1 - (double)p)) (p as lora.c passes it, (float)dropout);
   * xd[n*D + c] = u[c] < p ? 0 : x[n*ldx + c] * keep. ctr is HOST memory (N values). */
  void (*dropout_fwd)(int N, int D, const float *x, int ldx, uint64_t seed, uint64_t stream,
                      const uint64_t *ctr, float p, float *xd);
  /* the backward, for kept elements only (u[c] >= p): dx[n*lddx + c] += dxd[n*D + c] * keep;
   * dropped elements' dx untouched */
  void (*dropout_bwd)(int N, int D, const float *dxd, uint64_t seed, uint64_t stream,
                      const uint64_t *ctr, float p, float *dx, int lddx);
};

/* Every op field of ct_backend_ops (X(field)), for code that walks the
 * table: tests, the profiling wrapper, ct_backend_lacks. */
// clang-format off
#define CT_BACKEND_OP_FIELDS(X) \
  X(sgemm) X(sgemm_deterministic) X(linear_fwd) X(linear_bwd) X(linear_fwd_w) X(linear_bwd_w) \
  X(attention_fwd) X(attention_bias_fwd) X(attention_bwd) X(attention_cross_fwd) \
  X(attention_cross_bwd) X(attention_mask_fwd) X(attention_mask_bwd) X(rope_table) X(rope_fwd) X(rope_bwd) \
  X(qkv_heads_fwd) X(qkv_heads_bwd) X(ln_mod_fwd) X(ln_mod_bwd) X(layernorm_affine_fwd) \
  X(rmsnorm_fwd) X(rmsnorm_bwd) X(groupnorm_fwd) X(groupnorm_bwd) X(conv2d_col_floats) \
  X(conv2d_fwd) X(conv2d_bwd) X(upsample2x_fwd) X(upsample2x_bwd) X(nchw_to_nlc) X(nlc_to_nchw) \
  X(tile_blend) X(patchify) X(unpatchify) X(silu_fwd) X(silu_bwd) X(gelu_tanh_fwd) \
  X(gelu_tanh_bwd) X(quick_gelu_fwd) X(gelu_erf_fwd) X(gelu_erf_bwd) X(gate_res_fwd) \
  X(gate_res_bwd) \
  X(add_inplace) X(scale_inplace) X(mul_inplace) X(copy_2d) X(zero) X(clamp_fwd) X(clamp_bwd) \
  X(embedding_fwd) X(timestep_embedding) X(mse_fwd_bwd) X(adam_update) X(adagrad_update) \
  X(lion_update) X(sgd_update) X(ema_update) X(sumsq) X(bf16_widen) X(bf16_narrow) \
  X(bf16_narrow_acc) X(dropout_fwd) X(dropout_bwd)
// clang-format on

/* The first of `ops` (field names separated by spaces: "conv2d_fwd
 * conv2d_bwd") that be does not have (NULL, or not a field name), or NULL
 * when it has them all: what a model checks before it moves onto be. */
const char *ct_backend_lacks(const ct_backend_ops *be, const char *ops);

/* ---- registry (src/kernels/backend.c) ---- */
/* The backend called name. A name that is not compiled in fails with
 * CT_ERR_NOT_FOUND and a message listing the usable ones (and saying when
 * the name is a backend this build left out: "cuda" without CT_CUDA); a
 * compiled-in backend whose init fails (no device) with CT_ERR_UNSUPPORTED
 * and init's reason. */
ct_status ct_backend_get(const char *name, const ct_backend_ops **out, ct_err *err);
/* The backend used when none is named: "cpu". */
const ct_backend_ops *ct_backend_default(void);
/* The usable backends (compiled in, init succeeded), i < ct_backend_count(),
 * in registry order (the CPU backend first); NULL past the end. */
size_t ct_backend_count(void);
const ct_backend_ops *ct_backend_at(size_t i);

/* The registered backend with be's memory (the same alloc and free) whose
 * products compute in c: be itself when it already does; "cpu-bf16" for
 * ("cpu", CT_COMPUTE_BF16). CT_ERR_NOT_FOUND when none is registered. */
ct_status ct_backend_with_compute(const ct_backend_ops *be, ct_compute c,
                                  const ct_backend_ops **out, ct_err *err);

/* Moves bytes of backend memory at *p from backend `from` to backend `to`
 * (alloc on `to` counted under cat, copied through the host, freed on
 * `from`): what a model's ct_*_set_backend does with the buffers it owns.
 * Nothing to do when *p is NULL, from == to, or the two share their memory
 * (the same alloc and free: "cpu" and "cpu-bf16"); on failure *p is
 * unchanged. */
ct_status ct_backend_move(const ct_backend_ops *from, const ct_backend_ops *to, ct_mem_cat cat,
                          size_t bytes, void **p, ct_err *err);

/* ---- the op profile (src/kernels/backend_prof.c) ----
 * A backend that times every op of `wrapped` into the op's family and the
 * current phase (`ctuner bench step --profile`). Process-wide: one profile
 * at a time; the returned table stays valid for the process. The models
 * cost nothing extra when they are not put on it. */
typedef enum {
  CT_PROF_GEMM,       /* sgemm, sgemm_deterministic, linear_fwd/bwd(_w) */
  CT_PROF_ATTENTION,  /* attention_fwd/bwd (with their score-tile GEMMs), attention_bias_fwd */
  CT_PROF_NORM,       /* ln_mod (LayerNorm + shift/scale), layernorm, rmsnorm, groupnorm */
  CT_PROF_ROPE,       /* rope_table/fwd/bwd, qkv_heads_fwd/bwd (QK RMSNorm + RoPE + head split) */
  CT_PROF_MODULATION, /* gate_res_fwd/bwd (gated residual) */
  CT_PROF_ACTIVATION, /* silu, gelu_tanh, quick_gelu, gelu_erf */
  CT_PROF_OPTIMIZER,  /* adam/adagrad/lion/sgd updates, ema, sumsq (and ct_prof_add) */
  CT_PROF_PACKING,    /* layout: copy_2d, patchify, unpatchify, nchw/nlc, upsample, tile_blend */
  CT_PROF_CONV,       /* conv2d (im2col + GEMM) */
  CT_PROF_MEMORY,     /* alloc, free, copies, synchronize */
  CT_PROF_OTHER,      /* elementwise, clamp, zero, embeddings, loss, bf16 widen/narrow, dropout */
  CT_PROF_NFAMILIES
} ct_prof_family;
typedef enum { CT_PROF_FORWARD, CT_PROF_BACKWARD, CT_PROF_STEP, CT_PROF_NPHASES } ct_prof_phase;
typedef struct {
  double seconds[CT_PROF_NPHASES][CT_PROF_NFAMILIES];     /* wall */
  double cpu_seconds[CT_PROF_NPHASES][CT_PROF_NFAMILIES]; /* process CPU time */
  long calls[CT_PROF_NPHASES][CT_PROF_NFAMILIES];
} ct_prof_counts;

const ct_backend_ops *ct_backend_profiled(const ct_backend_ops *wrapped);
void ct_prof_set_phase(ct_prof_phase p); /* where the next ops count */
/* work timed outside the table (wall and process CPU seconds) */
void ct_prof_add(ct_prof_family f, double seconds, double cpu_seconds);
double ct_prof_cpu_now(void); /* the process's CPU time in seconds, for ct_prof_add */
void ct_prof_reset(void);
void ct_prof_read(ct_prof_counts *out);
const char *ct_prof_family_name(ct_prof_family f); /* "gemm", "attention", ... */
const char *ct_prof_phase_name(ct_prof_phase p);   /* "forward", "backward", "step" */

#endif

/* Forward and backward kernels on flat float32 buffers.
 *
 * Conventions: activations are row-major matrices (rows, cols) with an explicit
 * leading dimension (ld = distance between rows, in floats) so a kernel can read
 * or write a column slice of a wider buffer. Batched activations have rows
 * grouped by batch: row r belongs to batch item r / L. Per-batch vectors (shift,
 * scale, gate from a modulation) are read at `p + b * ldp`.
 *
 * Backward kernels ACCUMULATE into parameter gradients (dw, db, dscale, ...) and
 * into dx where documented ("+="), so residual branches and gradient accumulation
 * need no extra buffers; callers zero gradients when a step starts.
 *
 * Everything here is OpenMP-parallel and deterministic: the result does not
 * depend on the thread count (reductions over rows are done per batch item or
 * in fixed-size chunks combined in a fixed order). Matrix products go through
 * ct_sgemm (below; src/kernels/gemm.c), whose AVX-512 and AVX2 paths sum K in a
 * fixed order whatever the thread count, which OpenBLAS does not promise; with
 * CT_GEMM=blas or on CPUs without AVX2 the linear layers use OpenBLAS and dx/dw
 * may then differ in the last bits between thread counts.
 * Kernels know nothing of parameters' names, files or models.
 *
 * These are the CPU implementations; include/ctuner/backend.h gathers every
 * one of them into the CPU compute backend's table (docs/architecture.md,
 * "Compute backends").
 */
#ifndef CTUNER_KERNELS_H
#define CTUNER_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* ---- matrix product ----
 * C = alpha * op(A) * op(B) + beta * C on row-major matrices, with the argument
 * meaning of cblas_sgemm(CblasRowMajor, ...): op(A) is M x K, op(B) is K x N,
 * C is M x N; transA/transB != 0 mean the stored matrix is the transpose
 * (A stored K x M, B stored N x K). beta == 0 overwrites C without reading it.
 * Our AVX-512 kernel where the CPU has AVX-512F, our AVX2 kernel where it has
 * AVX2 + FMA (both bitwise identical for any thread count, and to each
 * other), OpenBLAS otherwise or with CT_GEMM=blas (docs/gemm.md).
 * Called outside a parallel region it uses omp_get_max_threads() threads;
 * inside one it runs on the calling thread only. */
void ct_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);
/* "avx512", "avx2" or "blas": the path ct_sgemm takes on this machine and
 * environment (CT_GEMM=blas forces OpenBLAS, CT_GEMM=avx2 the AVX2 kernel). */
const char *ct_sgemm_path(void);
/* One path by name ("avx512", "avx2", "blas"; "bf16": ct_sgemm_bf16's
 * kernel, which rounds the operands), whatever CT_GEMM says; NULL when
 * the CPU lacks it or the name is unknown. The tests run every path the
 * machine has; a path function needs M, N, K >= 1 and alpha != 0 (ct_sgemm
 * handles the degenerate shapes before dispatching). */
typedef void (*ct_sgemm_fn)(int transA, int transB, int M, int N, int K, float alpha,
                            const float *A, int lda, const float *B, int ldb, float beta, float *C,
                            int ldc);
ct_sgemm_fn ct_sgemm_path_fn(const char *name);
/* ct_sgemm whose result is bitwise the same for any thread count on every
 * path: our kernels are ct_sgemm itself; on the OpenBLAS path C is split
 * into fixed blocks of 64 rows, one single-threaded cblas_sgemm per block,
 * the blocks spread over the threads (Muon's Newton–Schulz iteration). */
void ct_sgemm_deterministic(int transA, int transB, int M, int N, int K, float alpha,
                            const float *A, int lda, const float *B, int ldb, float beta, float *C,
                            int ldc);

/* ct_sgemm with the operands rounded to bf16 (round to nearest even, as
 * torch's autocast casts; NaN stays NaN) and the products summed in float32:
 * the matrix product of --mixed_precision bf16 (docs/gemm.md). A, B and C are
 * float32 in memory, arguments as ct_sgemm. On a CPU with AVX512-BF16
 * (ct_sgemm_bf16_available) our vdpbf16ps kernel, rounding while packing,
 * bitwise the same for any thread count; elsewhere (or with CT_GEMM=avx2,
 * blas or nobf16) the same rounded operands through ct_sgemm in the kernel's
 * order of sums (copies; for parity, not speed), which gives the kernel's
 * bits wherever ct_sgemm runs our float32 kernels (docs/gemm.md).
 * ct_sgemm_path_fn("bf16") is the kernel alone (NULL without AVX512-BF16),
 * "bf16_copies" that fallback on any CPU. */
void ct_sgemm_bf16(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc);
int ct_sgemm_bf16_available(void);
/* "bf16" (the AVX512-BF16 kernel) or "bf16_copies": what ct_sgemm_bf16 runs. */
const char *ct_sgemm_bf16_path(void);
/* x rounded to the nearest bf16 (ties to even), returned as a float. */
float ct_bf16_round(float x);

/* ---- the FMA peak (src/kernels/peak.c, `ctuner bench peak`) ----
 * 1 if the CPU has the ISA ("avx512", "avx2": AVX2 + FMA, "avx512bf16": the
 * vdpbf16ps loop, 4 FLOPs per 32-bit lane), else 0. */
int ct_fma_peak_has(const char *isa);
/* Runs the register-only FMA loop of isa for iters iterations on the calling
 * thread and returns the float32 FLOPs done (2 per lane per FMA; 0 when the
 * CPU lacks the ISA). Adds a value to *sink so the loop is not optimised away. */
double ct_fma_peak_loop(const char *isa, long iters, float *sink);

/* ---- linear: y = x w^T + b, w is [out=M, in=K] (PyTorch layout) ---- */
/* y (N, M) = x (N, K) . w^T + b; b may be NULL. */
void ct_linear_fwd(int N, int K, int M, const float *x, int ldx, const float *w, const float *b,
                   float *y, int ldy);
/* dx = beta_dx * dx + dy . w   (dx may be NULL: skipped)
 * dw += dy^T . x               (dw may be NULL)
 * db += sum over rows of dy    (db may be NULL) */
void ct_linear_bwd(int N, int K, int M, const float *x, int ldx, const float *w, const float *dy,
                   int lddy, float *dx, int lddx, float beta_dx, float *dw, float *db);
/* The same with the three products by ct_sgemm_bf16 (x, w, dy rounded to
 * bf16, sums in float32; the bias and db float32): the linear layer of the
 * bf16 compute backend (--mixed_precision bf16, docs/gemm.md). */
void ct_linear_fwd_bf16(int N, int K, int M, const float *x, int ldx, const float *w,
                        const float *b, float *y, int ldy);
void ct_linear_bwd_bf16(int N, int K, int M, const float *x, int ldx, const float *w,
                        const float *dy, int lddy, float *dx, int lddx, float beta_dx, float *dw,
                        float *db);

/* ---- frozen weights in their stored dtype (docs/gemm.md, docs/lora.md) ----
 * A weight view: a row-major [rows = out, cols = in] matrix as float32, bf16
 * (the top 16 bits of a float32: widened exactly) or int8 weight-only with
 * one float32 scale per row (output channel): element (r, c) is
 * (float)q[r][c] * scales[r] in float32. The GEMM reads a view by widening or
 * dequantising tiles of it while packing B and multiplies in float32, so the
 * result has the bits of ct_sgemm on the dequantised float32 matrix and no
 * float32 copy of the weight is made (on the OpenBLAS path: one block of 64
 * rows at a time). */
typedef enum { CT_WDT_F32 = 0, CT_WDT_BF16 = 1, CT_WDT_I8 = 2 } ct_wdtype;
typedef struct ct_wview {
  ct_wdtype dtype;
  const void *data;    /* float, uint16_t (bf16 bits) or int8_t elements */
  const float *scales; /* CT_WDT_I8: one per row; else NULL */
} ct_wview;
/* bytes per element (4, 2, 1); the name ("float32", "bf16", "int8") */
size_t ct_wdtype_size(ct_wdtype t);
const char *ct_wdtype_name(ct_wdtype t);
/* the view of a float32 matrix; the view from row r0 on (cols per row) */
ct_wview ct_wview_f32(const float *w);
ct_wview ct_wview_rows(ct_wview w, int r0, int cols);
/* element (r, c) of a view with cols columns, dequantised */
float ct_wview_at(ct_wview w, int cols, int r, int c);
/* ct_sgemm with B a weight view of leading dimension ldb (transB: B stored
 * transposed, the forward x W^T; else dX = dy W). A float32 view is ct_sgemm. */
void ct_sgemm_w(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                const ct_wview *B, int ldb, float beta, float *C, int ldc);
/* ct_linear_fwd / ct_linear_bwd over a weight view: the weight is frozen
 * unless it is float32 (dw must be NULL for bf16 and int8 views). */
void ct_linear_fwd_w(int N, int K, int M, const float *x, int ldx, const ct_wview *w,
                     const float *b, float *y, int ldy);
void ct_linear_bwd_w(int N, int K, int M, const float *x, int ldx, const ct_wview *w,
                     const float *dy, int lddy, float *dx, int lddx, float beta_dx, float *dw,
                     float *db);
/* Weight-only int8 quantisation of rows x cols (per output row, symmetric
 * absmax), as the libraries SimpleTuner's base_model_precision names:
 *   CT_QUANT_QUANTO  (optimum-quanto qint8): scale = absmax / 127,
 *                    q = clamp(round(w / scale), -128, 127)
 *   CT_QUANT_TORCHAO (torchao int8_weight_only): scale = max(absmax / 127.5,
 *                    FLT_EPSILON), q = clamp(round(w * (1 / scale)), -128, 127)
 * in float32, round half to even (torch.round). A row of zeros gets scale 0
 * and q 0 under quanto (where torch would divide 0 by 0). */
typedef enum { CT_QUANT_QUANTO = 0, CT_QUANT_TORCHAO = 1 } ct_quant_kind;
void ct_quantize_int8(ct_quant_kind kind, int rows, int cols, const float *w, int8_t *q,
                      float *scales);
/* n floats rounded to bf16 bits (round to nearest even; NaN stays NaN) */
void ct_to_bf16(size_t n, const float *x, uint16_t *out);

/* ---- LayerNorm without affine + adaLN modulation ----
 * xhat = (x - mean) * rstd,  rstd = 1/sqrt(var + eps)   (biased variance)
 * h    = (1 + scale[b]) * xhat + shift[b]               (shift/scale may be NULL => 0)
 * Stores xhat (N, D, ld = D) and rstd (N) for the backward. */
void ct_ln_mod_fwd(int B, int L, int D, const float *x, int ldx, const float *shift,
                   const float *scale, int ldm, float eps, float *xhat, float *rstd, float *h,
                   int ldh);
/* From dh: dshift[b] += sum_rows dh; dscale[b] += sum_rows dh*xhat;
 * dx += LN backward of (dh * (1+scale)).  dshift/dscale may be NULL; like shift
 * and scale they are per-batch vectors at dshift + b * ldm (the layout of a
 * modulation's gradient). scale may be NULL (=> 0), dx may be NULL. */
void ct_ln_mod_bwd(int B, int L, int D, const float *xhat, const float *rstd, const float *scale,
                   int ldm, const float *dh, int lddh, float *dx, int lddx, float *dshift,
                   float *dscale);
/* LayerNorm with affine weight/bias (text encoder; forward only). */
void ct_layernorm_affine_fwd(int N, int D, const float *x, int ldx, const float *gamma,
                             const float *beta, float eps, float *y, int ldy);

/* ---- RMSNorm with learned scale over the last dim ----
 * y = x * rstd * scale,  rstd = 1/sqrt(mean(x^2) + eps). rstd (N) stored. */
void ct_rmsnorm_fwd(int N, int D, const float *x, int ldx, const float *scale, float eps, float *y,
                    int ldy, float *rstd);
/* dx += ..., dscale += ... */
void ct_rmsnorm_bwd(int N, int D, const float *x, int ldx, const float *scale, const float *rstd,
                    const float *dy, int lddy, float *dx, int lddx, float *dscale);

/* ---- RoPE: rotate pairs (2j, 2j+1) of each row by angle table ----
 * pe is (L, D/2, 2) holding (cos, sin) for sequence position l; row r uses
 * position r % L (rows grouped by batch). In place allowed (x == y). */
void ct_rope_table(int L, const int *pos /* (L, 3) */, const int axes[3], float theta,
                   float *pe /* (L, sum(axes)/2, 2) */);
void ct_rope_fwd(int N, int L, int D, const float *pe, const float *x, int ldx, float *y, int ldy);
/* dx = R^T dy (overwrite, not accumulate); in place allowed. */
void ct_rope_bwd(int N, int L, int D, const float *pe, const float *dy, int lddy, float *dx,
                 int lddx);

/* ---- QKV head preparation (fused RMSNorm + RoPE + transpose) ----
 * qkv: (B*Ls, 3*H*hd) rows laid out (3, H, hd) as a Linear produces them.
 * Writes q, k, v into (B, H, Lt, hd) at sequence positions [off, off+Ls):
 *   q = rope(rmsnorm(q_raw, qscale)), k = rope(rmsnorm(k_raw, kscale)), v = v_raw.
 * pe is the table for the joint sequence (Lt positions). rstd_q/rstd_k: (B*Ls*H),
 * index (b*Ls + l)*H + h. The RMSNorm eps is the model's fixed 1e-6. */
void ct_qkv_heads_fwd(int B, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                      const float *qscale, const float *kscale, const float *pe, float *q, float *k,
                      float *v, float *rstd_q, float *rstd_k);
/* Inverse: from dq, dk, dv in (B, H, Lt, hd) (positions [off, off+Ls)) write
 * dqkv (B*Ls, 3*H*hd) (overwrite) and accumulate dqscale, dkscale (hd). */
void ct_qkv_heads_bwd(int B, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                      const float *qscale, const float *kscale, const float *pe,
                      const float *rstd_q, const float *rstd_k, const float *dq, const float *dk,
                      const float *dv, float *dqkv, float *dqscale, float *dkscale);

/* ---- softmax attention ----
 * q, k, v: (B, H, L, hd). o: (B, L, H*hd) (heads concatenated per token, the
 * layout the output projection reads). lse: (B, H, L) log-sum-exp of the scaled
 * scores per query, kept for the backward. Scores are computed in tiles of query
 * rows (never a B*H*L*L buffer); the backward recomputes them from lse.
 * causal != 0 masks keys after the query (text encoder). */
void ct_attention_fwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                      const float *k, const float *v, float *o, float *lse);
/* Forward only, with an additive score bias shared by the batch (T5's
 * relative position bias): softmax(scale Q K^T + bias[h]) V per (b, h), bias
 * (H, L, L) row = query, column = key; o as ct_attention_fwd, no lse. */
void ct_attention_bias_fwd(int B, int H, int L, int hd, float scale, const float *bias,
                           const float *q, const float *k, const float *v, float *o);
/* dq, dk, dv (B, H, L, hd) are overwritten. */
void ct_attention_bwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                      const float *k, const float *v, const float *o, const float *lse,
                      const float *dout, float *dq, float *dk, float *dv);
/* The two implementations behind ct_attention_fwd/bwd (same contracts; an
 * lse and o from one must go to the same one's backward). tiles
 * (attention.c): score tiles of 64 queries x all keys through ct_sgemm.
 * flash (attention_flash.c): fused FlashAttention-2-style tiles of 32 queries
 * x 64 keys with an online softmax. Both give the same bits for any thread
 * count; not each other's. ct_attention_fwd/bwd run flash for head dims up
 * to 256 and tiles above (faster there), or the one named by the environment
 * variable CT_ATTENTION ("flash" or "tiles"), read once per process;
 * ct_attention_path() says "auto", "flash" or "tiles". */
void ct_attention_tiles_fwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                            const float *k, const float *v, float *o, float *lse);
void ct_attention_tiles_bwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                            const float *k, const float *v, const float *o, const float *lse,
                            const float *dout, float *dq, float *dk, float *dv);
/* bf16: 0 float32 throughout; 1 every product (forward Q K^T and P V;
 * backward Q K^T, dO V^T, P^T dO, dS^T Q, dS K) on operands rounded to bf16
 * with float32 sums, by vdpbf16ps where the CPU has AVX512-BF16; 2 the same
 * bits by an emulation (for tests). The softmax, its rescaling and the
 * accumulators stay float32. The backward must get the forward's bf16. */
void ct_attention_flash_fwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                            const float *k, const float *v, float *o, float *lse, int bf16);
void ct_attention_flash_bwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                            const float *k, const float *v, const float *o, const float *lse,
                            const float *dout, float *dq, float *dk, float *dv, int bf16);
/* ct_attention_fwd/bwd with the flash kernel's bf16 = 1 (the cpu-bf16
 * backend's attention); the tiles kernel, where it runs, stays float32. */
void ct_attention_fwd_bf16(int B, int H, int L, int hd, float scale, int causal, const float *q,
                           const float *k, const float *v, float *o, float *lse);
void ct_attention_bwd_bf16(int B, int H, int L, int hd, float scale, int causal, const float *q,
                           const float *k, const float *v, const float *o, const float *lse,
                           const float *dout, float *dq, float *dk, float *dv);
/* Cross-attention: queries (B, H, Lq, hd) against keys and values (B, H, Lk,
 * hd) of another length (the U-net's attention to the text); o (B, Lq, H*hd)
 * and lse (B, H, Lq) as ct_attention_fwd. Not causal. The backward
 * overwrites dq (B, H, Lq, hd), dk and dv (B, H, Lk, hd)
 * (src/kernels/attention_cross.c). */
void ct_attention_cross_fwd(int B, int H, int Lq, int Lk, int hd, float scale, const float *q,
                            const float *k, const float *v, float *o, float *lse);
void ct_attention_cross_bwd(int B, int H, int Lq, int Lk, int hd, float scale, const float *q,
                            const float *k, const float *v, const float *o, const float *lse,
                            const float *dout, float *dq, float *dk, float *dv);
/* Joint attention with a per-token padding mask (B, L) of 1 (real) and 0
 * (padding): additive = 0, SDPA's boolean m_i AND m_j (a fully masked query
 * gives 0 and no gradient, lse 0); additive = 1, m_i * m_j added to the
 * scores (diffusers' ChromaPipeline float mask). Layouts and the backward's
 * overwrites as ct_attention_fwd/bwd, not causal (src/kernels/attention_mask.c). */
void ct_attention_mask_fwd(int B, int H, int L, int hd, float scale, const float *mask,
                           int additive, const float *q, const float *k, const float *v, float *o,
                           float *lse);
void ct_attention_mask_bwd(int B, int H, int L, int hd, float scale, const float *mask,
                           int additive, const float *q, const float *k, const float *v,
                           const float *o, const float *lse, const float *dout, float *dq,
                           float *dk, float *dv);
const char *ct_attention_path(void);
/* The flash kernels' instruction set: "avx512", "avx2" or "generic" (the best
 * the CPU has; CT_ATTENTION_ISA=avx2 or generic picks a lower one). */
const char *ct_attention_flash_isa(void);

/* ---- activations (2-D with leading dims so column slices work) ---- */
void ct_silu_fwd(int N, int D, const float *x, int ldx, float *y, int ldy);
void ct_silu_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx,
                 int lddx); /* dx = dy * silu'(x) (overwrite) */
void ct_gelu_tanh_fwd(int N, int D, const float *x, int ldx, float *y, int ldy);
void ct_gelu_tanh_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx,
                      int lddx); /* overwrite */
void ct_quick_gelu_fwd(int N, int D, const float *x, int ldx, float *y,
                       int ldy); /* x*sigmoid(1.702x) */
void ct_gelu_erf_fwd(int N, int D, const float *x, int ldx, float *y,
                     int ldy); /* 0.5x(1+erf(x/sqrt 2)): torch's exact GELU, HF "gelu" */
/* its backward: dx = dy * (Phi(x) + x phi(x)) (overwrite; GEGLU's gate) */
void ct_gelu_erf_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx,
                     int lddx);

/* ---- gated residual: out = x + gate[b] * y  (rows grouped by batch, L rows each) ---- */
void ct_gate_res_fwd(int B, int L, int D, const float *x, int ldx, const float *gate, int ldg,
                     const float *y, int ldy, float *out, int ldo);
/* dy = gate[b] * dout (overwrite); dgate[b] += sum_rows dout * y, dgate[b] at
 * dgate + b * ldg like gate. (dx == dout: the caller keeps using dout for the
 * residual path.) dy may alias y; dy or dgate may be NULL. */
void ct_gate_res_bwd(int B, int L, int D, const float *gate, int ldg, const float *y, int ldy,
                     const float *dout, int lddo, float *dy, int lddy, float *dgate);

/* ---- embeddings, patches, loss ---- */
/* out (B, dim): [cos(args), sin(args)], args = time_factor*t[b] * exp(-ln(max_period)*k/(dim/2)).
 */
void ct_timestep_embedding(int B, const float *t, int dim, float max_period, float time_factor,
                           float *out);
/* y (N, D), row r = tok[ids[r]] + pos[r % T]: the token plus position
 * embedding of N = B*T tokens (text encoder; forward only). tok (vocab, D),
 * pos (>= T, D); ids (N) are host memory and must be in range. */
void ct_embedding_fwd(int N, int T, int D, const int32_t *ids, const float *tok, const float *pos,
                      float *y);
/* (B, C, H, W) -> (B, (H/p)*(W/p), C*p*p) in the order b c (h ph) (w pw) -> b (h w) (c ph pw). */
void ct_patchify(int B, int C, int H, int W, int p, const float *x, float *out);
/* Exact inverse of ct_patchify (also its backward: a permutation). */
void ct_unpatchify(int B, int C, int H, int W, int p, const float *in, float *x);
/* Mean squared error over n elements; dpred = 2 (pred - target) / n * dloss (overwrite, may be
 * NULL). */
float ct_mse_fwd_bwd(size_t n, const float *pred, const float *target, float dloss, float *dpred);

/* ---- image kernels (the VAE), NCHW float32 ---- */
/* 2-D convolution: x (B, Cin, H, W), w (Cout, Cin, k, k) (PyTorch layout),
 * b (Cout) or NULL, y (B, Cout, Ho, Wo), Ho = (H + pad_t + pad_b - k) /
 * stride + 1. Padding may be asymmetric (diffusers' Downsample2D pads only
 * right and bottom). col: scratch of ct_conv2d_col_floats() floats (unused
 * for 1x1 stride-1 unpadded convolutions, may then be NULL). */
typedef struct ct_conv2d_shape {
  int B, Cin, H, W, Cout, k, stride, pad_t, pad_l, pad_b, pad_r;
} ct_conv2d_shape;
#define CT_CONV_COL_FLOATS ((size_t)8 << 20) /* 32 MiB of im2col per band of output rows */
int ct_conv2d_out(int in, int k, int stride, int pad_lo, int pad_hi);
int ct_conv2d_band_rows(const ct_conv2d_shape *s);
size_t ct_conv2d_col_floats(const ct_conv2d_shape *s);
void ct_conv2d_fwd(const ct_conv2d_shape *s, const float *x, const float *w, const float *b,
                   float *y, float *col);
/* dx (overwritten; NULL: skipped), dw += , db += (NULL: skipped). */
void ct_conv2d_bwd(const ct_conv2d_shape *s, const float *x, const float *w, const float *dy,
                   float *dx, float *dw, float *db, float *col);
/* The same with the products by ct_sgemm_bf16 (the bf16 compute backend). */
void ct_conv2d_fwd_bf16(const ct_conv2d_shape *s, const float *x, const float *w, const float *b,
                        float *y, float *col);
void ct_conv2d_bwd_bf16(const ct_conv2d_shape *s, const float *x, const float *w, const float *dy,
                        float *dx, float *dw, float *db, float *col);
/* GroupNorm over (C/G channels x HW) per image and group, statistics in
 * double; gamma/beta (C) may be NULL (1, 0). Keeps mean, rstd (B*G). */
void ct_groupnorm_fwd(int B, int C, int HW, int G, float eps, const float *x, const float *gamma,
                      const float *beta, float *y, float *mean, float *rstd);
/* dx overwritten (NULL: skipped); dgamma, dbeta += (NULL: skipped). */
void ct_groupnorm_bwd(int B, int C, int HW, int G, const float *x, const float *gamma,
                      const float *mean, const float *rstd, const float *dy, float *dx,
                      float *dgamma, float *dbeta);
/* Nearest-neighbour x2: (BC, H, W) -> (BC, 2H, 2W); the backward sums the 4 (overwrite). */
void ct_upsample2x_fwd(int BC, int H, int W, const float *x, float *y);
void ct_upsample2x_bwd(int BC, int H, int W, const float *dy, float *dx);
/* (B, C, L) <-> (B, L, C): each is the other's backward. */
void ct_nchw_to_nlc(int B, int C, int L, const float *x, float *y);
void ct_nlc_to_nchw(int B, int C, int L, const float *x, float *y);
/* The linear blend of two overlapping tiles (diffusers' blend_v / blend_h),
 * per plane p: b[y][x] = a[y][x] (1 - s/e) + b[y][x] (s/e), s = y (vertical)
 * or x (horizontal), over a rows x cols block (rows = e when vertical, cols =
 * e when horizontal). a points at the overlap (the last e rows or columns of
 * the earlier tile), plane p of a at a + p * plane_a with rows lda apart, of
 * b at b + p * plane_b with rows ldb apart. Forward only (inference). */
void ct_tile_blend(int planes, int rows, int cols, int e, int vertical, const float *a,
                   size_t plane_a, int lda, float *b, size_t plane_b, int ldb);

/* ---- elementwise helpers ---- */
void ct_add_inplace(size_t n, float *y, const float *x); /* y += x */
void ct_zero(size_t n, float *x);
void ct_scale_inplace(size_t n, float *x, float c);      /* x *= c (gradient clipping) */
void ct_mul_inplace(size_t n, float *y, const float *x); /* y *= x (gated FFN) */
/* dst (rows, cols, ld ldd) = src (rows, cols, ld lds): a column slice or a
 * block of rows moved between buffers (the joint sequence's streams, heads). */
void ct_copy_2d(int rows, int cols, const float *src, int lds, float *dst, int ldd);
/* y = x clamped to [lo, hi] on a (rows, cols) block (NaN stays NaN): the
 * VAE's logvar clamp. y may alias x. */
void ct_clamp_fwd(int rows, int cols, const float *x, int ldx, float lo, float hi, float *y,
                  int ldy);
/* dx += dy where lo <= x <= hi; outside (and for NaN) the clamp passes no gradient. */
void ct_clamp_bwd(int rows, int cols, const float *x, int ldx, float lo, float hi, const float *dy,
                  int lddy, float *dx, int lddx);

/* ---- optimizer math (src/kernels/optim_math.c) ----
 * Elementwise updates on n floats, one pass each, PyTorch's formulas
 * (docs/optimizers.md); the scalars PyTorch computes in double (bias
 * corrections, step sizes) are computed in double and rounded once. step is
 * 1-based. Every element's arithmetic is independent of the others, so the
 * result does not depend on the thread count or on how a range is sliced.
 * Adam (decoupled = 0: g += wd w) or AdamW (decoupled = 1: w *= 1 - lr wd). */
void ct_adam_update(size_t n, float *w, const float *g, float *m, float *v, float lr, float b1,
                    float b2, float eps, float wd, int decoupled, long step);
void ct_adagrad_update(size_t n, float *w, const float *g, float *sum, float lr, float lr_decay,
                       float eps, float wd, long step);
void ct_lion_update(size_t n, float *w, const float *g, float *m, float lr, float b1, float b2,
                    float wd);
/* SGD with optional momentum (buf may be NULL when momentum == 0); on the
 * first step the buffer is a copy of the gradient, as in PyTorch. */
void ct_sgd_update(size_t n, float *w, const float *g, float *buf, float lr, float momentum,
                   float dampening, int nesterov, float wd, long step);
/* EMA of weights: e = decay e + (1 - decay) w. */
void ct_ema_update(size_t n, float *e, const float *w, float decay);
/* Sum of squares in double over fixed chunks of 65536 floats summed in
 * order: the same result for any thread count (the gradient norm). */
double ct_sumsq(size_t n, const float *x);

/* ---- residency: bf16 storage and LoRA dropout on the compute backend ----
 * (src/kernels/resident.c; the ops of the same names in backend.h) */
/* dst[i] = float(src[i]) (a bf16 bit pattern widened: exact). */
void ct_bf16_widen(size_t n, const uint16_t *src, float *dst);
/* dst[i] = bf16 of src[i], rounded to nearest even (ct_f32_to_bf16). */
void ct_bf16_narrow(size_t n, const float *src, uint16_t *dst);
/* dst[i] = bf16(float(dst[i]) + src[i]): a float32 gradient accumulated into
 * bf16 storage, one rounding per element. */
void ct_bf16_narrow_acc(size_t n, const float *src, uint16_t *dst);
/* LoRA dropout (peft's nn.Dropout on the adapter's input), row n of N (width
 * D): u[0..D) = the Philox uniforms ct_rng_fill_uniform(u, D, seed, stream,
 * ctr[n], 0, 1) fills for that row; keep = (float)(1 / (1 - (double)p));
 *   xd[n*D + c] = u[c] < p ? 0 : x[n*ldx + c] * keep.
 * ctr (N values) is host memory; x, xd backend memory. */
void ct_dropout_fwd(int N, int D, const float *x, int ldx, uint64_t seed, uint64_t stream,
                    const uint64_t *ctr, float p, float *xd);
/* Its backward, through the same mask: for each kept element (u[c] >= p)
 *   dx[n*lddx + c] += dxd[n*D + c] * keep;
 * a dropped element's dx is left untouched (not += 0: a -0 stays -0). */
void ct_dropout_bwd(int N, int D, const float *dxd, uint64_t seed, uint64_t stream,
                    const uint64_t *ctr, float p, float *dx, int lddx);

#endif

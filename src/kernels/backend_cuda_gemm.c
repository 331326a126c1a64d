/* The CUDA backend's matrix products, convolutions and attention
 * (src/kernels/cuda/gemm.cu, conv.cu, attention.cu): the table fields they
 * fill, float32 or bf16 products.
 * "cuda-bf16" (bf16 = 1): sgemm, linear_fwd/bwd, conv2d_fwd/bwd and
 * attention_fwd/bwd on bf16 operands with float32 sums (cpu-bf16's arithmetic
 * up to the order of the sums; attention above 256 head dims float32, as the
 * CPU's tiles kernel); sgemm_deterministic stays float32 (Muon).
 * linear_fwd_w/bwd_w: a float32 view as linear_fwd/bwd of the row; bf16 and
 * int8 views dequantised into scratch, float32 in "cuda", bf16 in "cuda-bf16"
 * (a bf16 view then used as it is, the activation cast to bf16). Note: this
 * is where "cuda-bf16" differs from "cpu-bf16", whose linear_*_w are the
 * float32 ones; within the bf16 row's tolerances either way.
 * attention_bias_fwd (T5): float32 in both rows. conv2d: conv.c's bands of
 * im2col + the row's product (conv2d_col_floats is conv.c's). */
#ifdef CT_CUDA
#include "cuda_rt.h"

#define CU_SGEMM_ARGS                                                                \
  int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, \
      const float *B, int ldb, float beta, float *C, int ldc
#define CU_LIN_FWD_ARGS \
  int N, int K, int M, const float *x, int ldx, const float *w, const float *b, float *y, int ldy
#define CU_LIN_BWD_ARGS                                                                    \
  int N, int K, int M, const float *x, int ldx, const float *w, const float *dy, int lddy, \
      float *dx, int lddx, float beta_dx, float *dw, float *db
#define CU_LINW_FWD_ARGS \
  int N, int K, int M, const float *x, int ldx, const ct_wview *w, const float *b, float *y, int ldy
#define CU_LINW_BWD_ARGS                                                                      \
  int N, int K, int M, const float *x, int ldx, const ct_wview *w, const float *dy, int lddy, \
      float *dx, int lddx, float beta_dx, float *dw, float *db
#define CU_ATT_FWD_ARGS                                                                 \
  int B, int H, int L, int hd, float scale, int causal, const float *q, const float *k, \
      const float *v, float *o, float *lse
#define CU_ATT_BWD_ARGS                                                                          \
  int B, int H, int L, int hd, float scale, int causal, const float *q, const float *k,          \
      const float *v, const float *o, const float *lse, const float *dout, float *dq, float *dk, \
      float *dv

/* gemm.cu */
void ct_cu_sgemm(CU_SGEMM_ARGS);
void ct_cu_sgemm_bf16(CU_SGEMM_ARGS);
void ct_cu_sgemm_deterministic(CU_SGEMM_ARGS);
void ct_cu_linear_fwd(CU_LIN_FWD_ARGS);
void ct_cu_linear_fwd_bf16(CU_LIN_FWD_ARGS);
void ct_cu_linear_bwd(CU_LIN_BWD_ARGS);
void ct_cu_linear_bwd_bf16(CU_LIN_BWD_ARGS);
void ct_cu_linear_fwd_w(CU_LINW_FWD_ARGS);
void ct_cu_linear_fwd_w_bf16(CU_LINW_FWD_ARGS);
void ct_cu_linear_bwd_w(CU_LINW_BWD_ARGS);
void ct_cu_linear_bwd_w_bf16(CU_LINW_BWD_ARGS);
/* conv.cu */
void ct_cu_conv2d_fwd(const ct_conv2d_shape *s, const float *x, const float *w, const float *b,
                      float *y, float *col);
void ct_cu_conv2d_fwd_bf16(const ct_conv2d_shape *s, const float *x, const float *w, const float *b,
                           float *y, float *col);
void ct_cu_conv2d_bwd(const ct_conv2d_shape *s, const float *x, const float *w, const float *dy,
                      float *dx, float *dw, float *db, float *col);
void ct_cu_conv2d_bwd_bf16(const ct_conv2d_shape *s, const float *x, const float *w,
                           const float *dy, float *dx, float *dw, float *db, float *col);
/* attention.cu */
void ct_cu_attention_fwd(CU_ATT_FWD_ARGS);
void ct_cu_attention_fwd_bf16(CU_ATT_FWD_ARGS);
void ct_cu_attention_bwd(CU_ATT_BWD_ARGS);
void ct_cu_attention_bias_fwd(int B, int H, int L, int hd, float scale, const float *bias,
                              const float *q, const float *k, const float *v, float *o);
void ct_cu_attention_bwd_bf16(CU_ATT_BWD_ARGS);

void ct_cuda_fill_gemm(ct_backend_ops *t, int bf16) {
  t->sgemm = bf16 ? ct_cu_sgemm_bf16 : ct_cu_sgemm;
  t->sgemm_deterministic = ct_cu_sgemm_deterministic;
  t->linear_fwd = bf16 ? ct_cu_linear_fwd_bf16 : ct_cu_linear_fwd;
  t->linear_bwd = bf16 ? ct_cu_linear_bwd_bf16 : ct_cu_linear_bwd;
  t->linear_fwd_w = bf16 ? ct_cu_linear_fwd_w_bf16 : ct_cu_linear_fwd_w;
  t->linear_bwd_w = bf16 ? ct_cu_linear_bwd_w_bf16 : ct_cu_linear_bwd_w;
  t->attention_fwd = bf16 ? ct_cu_attention_fwd_bf16 : ct_cu_attention_fwd;
  t->attention_bwd = bf16 ? ct_cu_attention_bwd_bf16 : ct_cu_attention_bwd;
  t->conv2d_col_floats = ct_conv2d_col_floats; /* conv.c's bands: the same col */
  t->conv2d_fwd = bf16 ? ct_cu_conv2d_fwd_bf16 : ct_cu_conv2d_fwd;
  t->conv2d_bwd = bf16 ? ct_cu_conv2d_bwd_bf16 : ct_cu_conv2d_bwd;
  t->attention_bias_fwd = ct_cu_attention_bias_fwd; /* float32 in both rows, as cpu-bf16 */
}
#else
typedef int ct_backend_cuda_gemm_not_built; /* CT_CUDA off */
#endif

/* unet_int.h: the U-net's internals shared by unet_config.c, unet_params.c
 * (the table, load, save), unet_tape.c (the recorded ops and their
 * backward) and unet.c (the graph). */
#ifndef CTUNER_UNET_INT_H
#define CTUNER_UNET_INT_H

#include "ctuner/backend.h"
#include "ctuner/unet.h"

#define UNET_MAX_LAYERS 8 /* resnets per block: layers_per_block + 1 in the up blocks */

typedef struct uconv {
  size_t w, b; /* offsets into the parameter buffer */
  int cin, cout, k;
} uconv;
typedef struct unorm { /* GroupNorm or LayerNorm: weight, bias */
  size_t g, b;
  int C;
} unorm;
typedef struct ulin {
  size_t w, b; /* b: (size_t)-1 when the layer has no bias */
  int in, out;
} ulin;
#define UNET_NO_BIAS ((size_t)-1)
typedef struct ures { /* ResnetBlock2D */
  unorm n1, n2;
  uconv c1, c2, sc;
  ulin temb;
  int has_sc, cin, cout;
} ures;
typedef struct uattn { /* diffusers' Attention: to_q, to_k, to_v (no bias), to_out.0 */
  ulin q, k, v, o;
} uattn;
typedef struct ublk { /* BasicTransformerBlock */
  unorm n1, n2, n3;
  uattn a1, a2;
  ulin ff1, ff2; /* ff.net.0.proj (GEGLU, 2 x 4C), ff.net.2 */
} ublk;
typedef struct uxf { /* Transformer2DModel */
  unorm norm;
  ulin pin, pout;
  ublk *blk;
  int nblk, C, heads;
} uxf;
typedef struct ublock { /* a down or up block */
  ures res[UNET_MAX_LAYERS];
  uxf attn[UNET_MAX_LAYERS];
  int nres, cross, has_sampler;
  uconv sampler; /* downsamplers.0.conv (stride 2) or upsamplers.0.conv */
} ublock;

struct ct_unet {
  ct_unet_config cfg;
  const ct_backend_ops *be;
  ct_unet_param *params;
  size_t np, cap, numel;
  float *w, *g;
  float *swapped; /* the backend's parameter buffer while w is a host copy (swap_params) */
  uconv conv_in, conv_out;
  ulin t1, t2, a1, a2; /* time_embedding.linear_1/2, add_embedding.linear_1/2 */
  ublock down[CT_UNET_MAX_BLOCKS], up[CT_UNET_MAX_BLOCKS];
  ures mid_r0, mid_r1;
  uxf mid_attn;
  unorm norm_out;
  float *col; /* im2col scratch of the convolutions */
  size_t col_n;
  ct_unet_lora *lora; /* attached adapters (ct_unet_set_lora) or NULL */
  int frozen;         /* ct_unet_set_frozen: no base-weight gradients */
};

/* ---- LoRA (unet_lora.c) ---- */
struct ct_unet_lora {
  ct_unet_config cfg;
  ct_unet_adapter *ad;
  size_t nad, numel;
  int rank;
  double alpha;
  float scale; /* alpha / rank */
  const ct_backend_ops *be;
  float *w, *g;
  float *swapped; /* the backend's buffer while w is a host copy */
  float *scratch; /* u = A x and its gradient (2 N r) */
  size_t scratch_n;
};
/* the adapter on the Linear whose weight is at offset w_off, or -1 */
int ul_find(const ct_unet_lora *l, size_t w_off);
/* y[N, out] (row stride ldy) += scale B (A x); 0 when out of memory */
int ul_fwd(ct_unet_lora *l, const ct_backend_ops *be, int ad, int N, const float *x, float *y,
           int ldy);
/* dA, dB accumulate; dx[N, in] += scale (dy B) A (dx NULL: skipped); 0 when out of memory */
int ul_bwd(ct_unet_lora *l, const ct_backend_ops *be, int ad, int N, const float *x,
           const float *dy, float *dx);

/* unet_params.c: the table of cfg (no allocation of the values) */
ct_status ct_unet_build(ct_unet *u, ct_err *err);
void ct_unet_unbuild(ct_unet *u);
ct_status ct_unet_need_col(ct_unet *u, const ct_conv2d_shape *s, ct_err *err);

/* ---- the tape (unet_tape.c) ----
 * Tensors are flat buffers on the backend with a shape (B, C, H, W) for
 * images or (rows, cols) for token matrices (then C = cols, H = rows, W = 1,
 * B = 1). Each t_* records one op, computes it and returns the output
 * tensor's index, or -1 with err set. */
typedef struct ct_unet_tape ct_unet_tape;
/* keep 1: record for ct_unet_backward; 0: inference, each op's saved
 * buffers freed after it runs and dead tensors freed by ut_drop */
ct_unet_tape *ut_new(ct_unet *u, int keep);
/* tensor i is read by no later op (inference only; a no-op when keeping) */
void ut_drop(ct_unet_tape *tp, int i);
int ut_input(ct_unet_tape *tp, int B, int C, int H, int W, const float *init, ct_err *err);
float *ut_x(ct_unet_tape *tp, int i);
float *ut_g(ct_unet_tape *tp, int i);
int ut_conv(ct_unet_tape *tp, const uconv *c, int in, int stride, ct_err *err);
int ut_gn(ct_unet_tape *tp, const unorm *n, int in, int G, float eps, int silu, ct_err *err);
int ut_ln(ct_unet_tape *tp, const unorm *n, int in, float eps, ct_err *err);
int ut_lin(ct_unet_tape *tp, const ulin *l, int in, ct_err *err);
int ut_silu(ct_unet_tape *tp, int in, ct_err *err);
int ut_add(ct_unet_tape *tp, int a, int b, ct_err *err);
int ut_add_bc(ct_unet_tape *tp, int x, int v, ct_err *err); /* x (B,C,H,W) + v (B,C) */
int ut_up(ct_unet_tape *tp, int in, ct_err *err);
int ut_cat(ct_unet_tape *tp, int a, int b, ct_err *err); /* channels */
int ut_to_nlc(ct_unet_tape *tp, int in, ct_err *err);
int ut_to_nchw(ct_unet_tape *tp, int in, int C, int H, int W, ct_err *err);
int ut_attn(ct_unet_tape *tp, const uattn *a, int heads, int xq, int xkv, int self, ct_err *err);
int ut_geglu(ct_unet_tape *tp, int in, ct_err *err);
/* the rows of ones and -1s the broadcast add and LayerNorm read (n >= the
 * largest H W and C) */
ct_status ut_constants(ct_unet_tape *tp, size_t n, ct_err *err);
void ut_mark(ct_unet_tape *tp, int input, int enc);
void ut_set_final(ct_unet_tape *tp, int i);
void ut_marks(const ct_unet_tape *tp, int *input, int *enc, int *final);
const ct_unet *ut_owner(const ct_unet_tape *tp);
const ct_backend_ops *ut_backend(const ct_unet_tape *tp);
ct_status ut_backward(ct_unet_tape *tp, int out, const float *dout, ct_err *err);
/* the tensor's shape: C (cols), H (rows) */
void ut_shape(const ct_unet_tape *tp, int i, int *B, int *C, int *H, int *W);

#endif

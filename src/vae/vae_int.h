/* vae_int.h: the VAE's internals shared by vae.c (table, forward) and
 * vae_train.c (the recorded forward and its backward). */
#ifndef CTUNER_VAE_INT_H
#define CTUNER_VAE_INT_H

#include "ctuner/backend.h"
#include "ctuner/vae.h"

#define GN_EPS 1e-6f

typedef struct act {
  float *p;
  int C, H, W;
} act;

typedef struct vconv {
  size_t w, b; /* offsets */
  int cin, cout, k;
} vconv;
typedef struct vgn {
  size_t g, b;
  int C;
} vgn;
typedef struct vlin {
  size_t w, b;
} vlin;
typedef struct vres {
  vgn n1, n2;
  vconv c1, c2, sc;
  int has_sc, cin, cout;
} vres;
typedef struct vattn {
  vgn gn;
  vlin q, k, v, o;
  int C;
} vattn;
typedef struct vblock {
  vres res[17];
  int nres, has_sampler;
  vconv sampler;
} vblock;
typedef struct vmid {
  vres r0, r1;
  vattn attn;
  int has_attn;
} vmid;

struct ct_vae {
  ct_vae_config cfg;
  const ct_backend_ops *be; /* computes every op; owns w, g and the workspace */
  ct_vae_param *params;
  size_t np, cap, numel;
  float *w;
  /* encoder */
  vconv e_in, e_out;
  vblock e_blocks[CT_VAE_MAX_BLOCKS];
  vmid e_mid;
  vgn e_norm;
  /* decoder */
  vconv d_in, d_out;
  vblock d_blocks[CT_VAE_MAX_BLOCKS];
  vmid d_mid;
  vgn d_norm;
  vconv quant, post_quant;
  /* workspace of the last call */
  float *buf[6], *col, *mean, *rstd;
  size_t buf_n, col_n, stat_n;
  float *g; /* gradients (ct_vae_grads), same layout as w */
};

/* Grows v->col for a convolution of shape s. */
ct_status ct_vae_need_col(ct_vae *v, const ct_conv2d_shape *s, ct_err *err);

ct_status ct_vae_encode_moments(ct_vae *v, int B, int H, int W, const float *x,
                                const float **moments, ct_err *err);
void ct_vae_split_moments(const ct_backend_ops *be, int B, int lc, size_t plane, const float *mom,
                          float *mean, float *logvar);

#endif

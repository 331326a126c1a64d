/* unet_plan.c: the U-net's memory without computing — the forward and
 * backward run on a "dry" backend whose ops do nothing and whose alloc hands
 * out addresses no one reads, counting bytes per category as the CPU
 * backend's ct_alloc counts them. The tape's allocations are the real code's,
 * so the plan is the bytes a run allocates (tests/test_unet.c compares). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "unet_int.h"

typedef struct dry_block {
  uintptr_t at;
  size_t bytes;
  int cat;
} dry_block;

static _Thread_local struct {
  dry_block *b;
  size_t n, cap;
  uintptr_t next;
  size_t cur[CT_MEM_NCAT], peak[CT_MEM_NCAT], total, total_peak;
  int oom;
} dry;

static void *d_alloc(ct_mem_cat cat, size_t bytes) {
  if (!bytes) return NULL;
  if (dry.n == dry.cap) {
    size_t nc = dry.cap ? dry.cap * 2 : 1024;
    dry_block *nb = realloc(dry.b, nc * sizeof *nb);
    if (!nb) return dry.oom = 1, NULL;
    dry.b = nb, dry.cap = nc;
  }
  if (!dry.next) dry.next = 4096;
  dry_block *k = &dry.b[dry.n++];
  k->at = dry.next, k->bytes = bytes, k->cat = (int)cat;
  dry.next += (bytes + 127) & ~(size_t)63;
  dry.cur[cat] += bytes, dry.total += bytes;
  if (dry.cur[cat] > dry.peak[cat]) dry.peak[cat] = dry.cur[cat];
  if (dry.total > dry.total_peak) dry.total_peak = dry.total;
  return (void *)k->at;
}
static void d_free(void *p) {
  for (size_t i = dry.n; p && i-- > 0;)
    if (dry.b[i].at == (uintptr_t)p) {
      dry.cur[dry.b[i].cat] -= dry.b[i].bytes, dry.total -= dry.b[i].bytes;
      dry.b[i] = dry.b[--dry.n];
      return;
    }
}

/* the ops: nothing to compute */
static void d_copy(void *d, const void *s, size_t n) {
  (void)d, (void)s, (void)n;
}
static void d_sync(void) {}
static void d_sgemm(int ta, int tb, int M, int N, int K, float al, const float *A, int lda,
                    const float *B, int ldb, float be, float *C, int ldc) {
  (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)al, (void)A, (void)lda, (void)B, (void)ldb,
      (void)be, (void)C, (void)ldc;
}
static void d_lin_f(int N, int K, int M, const float *x, int ldx, const float *w, const float *b,
                    float *y, int ldy) {
  (void)N, (void)K, (void)M, (void)x, (void)ldx, (void)w, (void)b, (void)y, (void)ldy;
}
static void d_lin_b(int N, int K, int M, const float *x, int ldx, const float *w, const float *dy,
                    int lddy, float *dx, int lddx, float bdx, float *dw, float *db) {
  (void)N, (void)K, (void)M, (void)x, (void)ldx, (void)w, (void)dy, (void)lddy, (void)dx,
      (void)lddx, (void)bdx, (void)dw, (void)db;
}
static void d_att_f(int B, int H, int L, int hd, float s, int c, const float *q, const float *k,
                    const float *v, float *o, float *lse) {
  (void)B, (void)H, (void)L, (void)hd, (void)s, (void)c, (void)q, (void)k, (void)v, (void)o,
      (void)lse;
}
static void d_att_b(int B, int H, int L, int hd, float s, int c, const float *q, const float *k,
                    const float *v, const float *o, const float *lse, const float *d, float *dq,
                    float *dk, float *dv) {
  (void)B, (void)H, (void)L, (void)hd, (void)s, (void)c, (void)q, (void)k, (void)v, (void)o,
      (void)lse, (void)d, (void)dq, (void)dk, (void)dv;
}
static void d_xatt_f(int B, int H, int Lq, int Lk, int hd, float s, const float *q, const float *k,
                     const float *v, float *o, float *lse) {
  d_att_f(B, H, Lq + Lk, hd, s, 0, q, k, v, o, lse);
}
static void d_xatt_b(int B, int H, int Lq, int Lk, int hd, float s, const float *q, const float *k,
                     const float *v, const float *o, const float *lse, const float *d, float *dq,
                     float *dk, float *dv) {
  d_att_b(B, H, Lq + Lk, hd, s, 0, q, k, v, o, lse, d, dq, dk, dv);
}
static void d_ln_f(int B, int L, int D, const float *x, int ldx, const float *sh, const float *sc,
                   int ldm, float eps, float *xh, float *r, float *h, int ldh) {
  (void)B, (void)L, (void)D, (void)x, (void)ldx, (void)sh, (void)sc, (void)ldm, (void)eps, (void)xh,
      (void)r, (void)h, (void)ldh;
}
static void d_ln_b(int B, int L, int D, const float *xh, const float *r, const float *sc, int ldm,
                   const float *dh, int lddh, float *dx, int lddx, float *dsh, float *dsc) {
  (void)B, (void)L, (void)D, (void)xh, (void)r, (void)sc, (void)ldm, (void)dh, (void)lddh, (void)dx,
      (void)lddx, (void)dsh, (void)dsc;
}
static void d_gn_f(int B, int C, int HW, int G, float eps, const float *x, const float *g,
                   const float *b, float *y, float *m, float *r) {
  (void)B, (void)C, (void)HW, (void)G, (void)eps, (void)x, (void)g, (void)b, (void)y, (void)m,
      (void)r;
}
static void d_gn_b(int B, int C, int HW, int G, const float *x, const float *g, const float *m,
                   const float *r, const float *dy, float *dx, float *dg, float *db) {
  (void)B, (void)C, (void)HW, (void)G, (void)x, (void)g, (void)m, (void)r, (void)dy, (void)dx,
      (void)dg, (void)db;
}
static void d_conv_f(const ct_conv2d_shape *s, const float *x, const float *w, const float *b,
                     float *y, float *col) {
  (void)s, (void)x, (void)w, (void)b, (void)y, (void)col;
}
static void d_conv_b(const ct_conv2d_shape *s, const float *x, const float *w, const float *dy,
                     float *dx, float *dw, float *db, float *col) {
  (void)s, (void)x, (void)w, (void)dy, (void)dx, (void)dw, (void)db, (void)col;
}
static void d_up(int BC, int H, int W, const float *x, float *y) {
  (void)BC, (void)H, (void)W, (void)x, (void)y;
}
static void d_lay(int B, int C, int L, const float *x, float *y) {
  (void)B, (void)C, (void)L, (void)x, (void)y;
}
static void d_act_f(int N, int D, const float *x, int ldx, float *y, int ldy) {
  (void)N, (void)D, (void)x, (void)ldx, (void)y, (void)ldy;
}
static void d_act_b(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx,
                    int lddx) {
  (void)N, (void)D, (void)x, (void)ldx, (void)dy, (void)lddy, (void)dx, (void)lddx;
}
static void d_vec(size_t n, float *y, const float *x) {
  (void)n, (void)y, (void)x;
}
static void d_zero(size_t n, float *x) {
  (void)n, (void)x;
}
static void d_copy2d(int rows, int cols, const float *s, int lds, float *d, int ldd) {
  (void)rows, (void)cols, (void)s, (void)lds, (void)d, (void)ldd;
}
static void d_temb(int B, const float *t, int dim, float mp, float tf, float *out) {
  (void)B, (void)t, (void)dim, (void)mp, (void)tf, (void)out;
}

static const ct_backend_ops dry_ops = {
    .name = "dry",
    .description = "the U-net's memory plan: ops that do nothing, allocations counted",
    .precision_bits = 24,
    .alloc = d_alloc,
    .free = d_free,
    .copy_in = d_copy,
    .copy_out = d_copy,
    .copy = d_copy,
    .synchronize = d_sync,
    .sgemm = d_sgemm,
    .linear_fwd = d_lin_f,
    .linear_bwd = d_lin_b,
    .attention_fwd = d_att_f,
    .attention_bwd = d_att_b,
    .attention_cross_fwd = d_xatt_f,
    .attention_cross_bwd = d_xatt_b,
    .ln_mod_fwd = d_ln_f,
    .ln_mod_bwd = d_ln_b,
    .groupnorm_fwd = d_gn_f,
    .groupnorm_bwd = d_gn_b,
    .conv2d_col_floats = ct_conv2d_col_floats,
    .conv2d_fwd = d_conv_f,
    .conv2d_bwd = d_conv_b,
    .upsample2x_fwd = d_up,
    .upsample2x_bwd = d_up,
    .nchw_to_nlc = d_lay,
    .nlc_to_nchw = d_lay,
    .silu_fwd = d_act_f,
    .silu_bwd = d_act_b,
    .gelu_erf_fwd = d_act_f,
    .gelu_erf_bwd = d_act_b,
    .add_inplace = d_vec,
    .mul_inplace = d_vec,
    .copy_2d = d_copy2d,
    .zero = d_zero,
    .timestep_embedding = d_temb,
};

ct_status ct_unet_plan_memory(const ct_unet_config *c, int B, int H, int W, int Lk,
                              ct_unet_plan *out, ct_err *err) {
  memset(out, 0, sizeof *out);
  ct_status st = ct_unet_config_validate(c, err);
  if (st) return st;
  ct_unet *u = calloc(1, sizeof *u);
  if (!u) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  memset(&dry, 0, sizeof dry);
  u->cfg = *c;
  u->be = &dry_ops;
  st = ct_unet_build(u, err);
  out->numel = u->numel, out->ntensors = u->np;
  for (size_t i = 0; i < u->np; i++)
    if (u->params[i].numel > out->max_tensor) out->max_tensor = u->params[i].numel;
  float *fake = (float *)(uintptr_t)64; /* the inputs and weights: never read */
  u->w = fake;
  const ct_unet_inputs in = {B, H, W, fake, fake, Lk, fake, fake, fake};
  ct_unet_tape *tp = NULL;
  if (!st) st = ct_unet_forward(u, &in, NULL, NULL, err); /* inference */
  out->inference_peak = dry.total_peak;
  memcpy(dry.peak, dry.cur, sizeof dry.peak);
  dry.total_peak = dry.total;
  if (!st) st = ct_unet_forward(u, &in, NULL, &tp, err);
  if (!st) {
    out->forward_bytes = dry.cur[CT_MEM_ACTIVATIONS] + dry.cur[CT_MEM_BUFFERS];
    st = ct_unet_backward(u, tp, fake, NULL, NULL, err);
  }
  ct_unet_tape_free(tp);
  d_free(u->col), u->col = NULL;
  d_free(u->g), u->g = NULL;
  out->params_bytes = u->numel * sizeof(float);
  out->grads_bytes = dry.peak[CT_MEM_GRADS];
  out->activations_peak = dry.peak[CT_MEM_ACTIVATIONS];
  out->buffers_peak = dry.peak[CT_MEM_BUFFERS];
  out->total_peak = dry.total_peak;
  if (!st && (dry.oom || dry.total))
    st = ct_errf(err, dry.oom ? CT_ERR_NOMEM : CT_ERR_INVALID, "U-net memory plan: %s",
                 dry.oom ? "out of memory" : "bytes left allocated");
  free(dry.b);
  memset(&dry, 0, sizeof dry);
  ct_unet_unbuild(u);
  free(u);
  return st;
}

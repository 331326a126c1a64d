/* unet_tape.c: the U-net's recorded ops and their backward.
 *
 * Every op computes its output tensor on the U-net's backend and records
 * what its backward needs; ut_backward walks the ops in reverse. Each tensor
 * has a gradient buffer (allocated zeroed when the backward starts) that its
 * consumers add into, so residual and skip branches need no special casing.
 * Parameter gradients ACCUMULATE into the U-net's gradient buffer in the
 * tape's order, whatever the thread count. Token tensors (B, L, C) are
 * stored with shape (B, C, L, 1). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "unet_int.h"

typedef struct tt {
  float *x, *g;
  int B, C, H, W;
} tt;

enum {
  OP_CONV,
  OP_GN,
  OP_LN,
  OP_LIN,
  OP_SILU,
  OP_ADD,
  OP_ADDBC,
  OP_UP,
  OP_CAT,
  OP_NLC,
  OP_NCHW,
  OP_ATTN,
  OP_GEGLU
};

typedef struct op {
  int kind, in, in2, out;
  const uconv *c;
  int stride, silu, G, heads, self;
  const unorm *n;
  const ulin *l;
  const uattn *a;
  float *pre, *mean, *rstd, *xhat, *scale; /* norms: before SiLU, statistics, LN's gamma - 1 */
  float *q, *k, *v, *o, *lse, *ao;         /* attention: heads, output before to_out */
  float *gl;                               /* GEGLU: gelu(gate) */
} op;

struct ct_unet_tape {
  ct_unet *u;
  const ct_backend_ops *be;
  tt *t;
  int nt, capt;
  op *ops;
  int nops, capo;
  float *tmp, *tmp2, *ones, *minus1;
  size_t tmp_n, ones_n;
  int input, enc, final;
  int keep; /* 1: recording for a backward */
  int oom;  /* a LoRA backward ran out of scratch memory */
};

static float *buf(const ct_unet_tape *tp, size_t n) {
  n = n ? n : 1;
  return tp->be->alloc(CT_MEM_ACTIVATIONS, n * sizeof(float));
}

static size_t numel(const tt *t) {
  return (size_t)t->B * t->C * t->H * t->W;
}

ct_unet_tape *ut_new(ct_unet *u, int keep) {
  ct_unet_tape *tp = calloc(1, sizeof *tp);
  if (tp) tp->u = u, tp->be = u->be, tp->input = tp->enc = tp->final = -1, tp->keep = keep;
  return tp;
}

/* Without a backward to come (keep 0): what an op kept for it, freed as soon
 * as the op has run, and tensors the graph says are dead (ut_drop) */
static void done(ct_unet_tape *tp, op *o) {
  if (tp->keep) return;
  float **p[] = {&o->pre, &o->mean, &o->rstd, &o->xhat, &o->scale, &o->q,
                 &o->k,   &o->v,    &o->o,    &o->lse,  &o->ao,    &o->gl};
  for (size_t k = 0; k < sizeof p / sizeof p[0]; k++) tp->be->free(*p[k]), *p[k] = NULL;
}
void ut_drop(ct_unet_tape *tp, int i) {
  if (tp->keep || i < 0) return;
  tp->be->free(tp->t[i].x);
  tp->t[i].x = NULL;
}

#define NOMEM(err) \
  ct_errf((err), CT_ERR_NOMEM, "out of memory for the U-net's recorded activations")

/* the attached LoRA adapter of Linear l (unet_lora.c), or -1 */
static int lora_of(const ct_unet_tape *tp, const ulin *l) {
  return tp->u->lora ? ul_find(tp->u->lora, l->w) : -1;
}
/* y += the adapter's scale B A x; 0 (err set) when out of memory */
static int lora_fwd(ct_unet_tape *tp, const ulin *l, int N, const float *x, float *y, int ldy,
                    ct_err *err) {
  const int k = lora_of(tp, l);
  if (k < 0 || ul_fwd(tp->u->lora, tp->be, k, N, x, y, ldy)) return 1;
  NOMEM(err);
  return 0;
}
static void lora_bwd(ct_unet_tape *tp, const ulin *l, int N, const float *x, const float *dy,
                     float *dx) {
  const int k = lora_of(tp, l);
  if (k >= 0 && !ul_bwd(tp->u->lora, tp->be, k, N, x, dy, dx)) tp->oom = 1;
}

static int tensor(ct_unet_tape *tp, int B, int C, int H, int W, ct_err *err) {
  if (tp->nt == tp->capt) {
    int nc = tp->capt ? tp->capt * 2 : 256;
    tt *n = realloc(tp->t, (size_t)nc * sizeof *n);
    if (!n) return NOMEM(err), -1;
    tp->t = n, tp->capt = nc;
  }
  tt *t = &tp->t[tp->nt];
  memset(t, 0, sizeof *t);
  t->B = B, t->C = C, t->H = H, t->W = W;
  if (!(t->x = buf(tp, numel(t)))) return NOMEM(err), -1;
  if (numel(t) > tp->tmp_n) tp->tmp_n = numel(t);
  return tp->nt++;
}

int ut_input(ct_unet_tape *tp, int B, int C, int H, int W, const float *init, ct_err *err) {
  int i = tensor(tp, B, C, H, W, err);
  if (i >= 0 && init) tp->be->copy(tp->t[i].x, init, numel(&tp->t[i]) * sizeof(float));
  return i;
}
const ct_unet *ut_owner(const ct_unet_tape *tp) {
  return tp->u;
}
const ct_backend_ops *ut_backend(const ct_unet_tape *tp) {
  return tp->be;
}
void ut_set_final(ct_unet_tape *tp, int i) {
  tp->final = i;
}
void ut_marks(const ct_unet_tape *tp, int *input, int *enc, int *final) {
  *input = tp->input, *enc = tp->enc, *final = tp->final;
}
float *ut_x(ct_unet_tape *tp, int i) {
  return tp->t[i].x;
}
float *ut_g(ct_unet_tape *tp, int i) {
  return tp->t[i].g;
}
void ut_shape(const ct_unet_tape *tp, int i, int *B, int *C, int *H, int *W) {
  const tt *t = &tp->t[i];
  *B = t->B, *C = t->C, *H = t->H, *W = t->W;
}
void ut_mark(ct_unet_tape *tp, int input, int enc) {
  tp->input = input, tp->enc = enc;
}

static op *new_op(ct_unet_tape *tp, int kind, int in, int out, ct_err *err) {
  if (out < 0) return NULL;
  if (tp->nops == tp->capo) {
    int nc = tp->capo ? tp->capo * 2 : 256;
    op *n = realloc(tp->ops, (size_t)nc * sizeof *n);
    if (!n) return NOMEM(err), NULL;
    tp->ops = n, tp->capo = nc;
  }
  op *o = &tp->ops[tp->nops++];
  memset(o, 0, sizeof *o);
  o->kind = kind, o->in = in, o->out = out, o->in2 = -1;
  return o;
}

static ct_conv2d_shape conv_shape(const uconv *c, const tt *x, int stride) {
  const int p = c->k / 2;
  ct_conv2d_shape s = {x->B, c->cin, x->H, x->W, c->cout, c->k, stride, p, p, p, p};
  return s;
}

int ut_conv(ct_unet_tape *tp, const uconv *c, int in, int stride, ct_err *err) {
  ct_conv2d_shape s = conv_shape(c, &tp->t[in], stride);
  if (ct_unet_need_col(tp->u, &s, err)) return -1;
  const int Ho = ct_conv2d_out(s.H, s.k, stride, s.pad_t, s.pad_b),
            Wo = ct_conv2d_out(s.W, s.k, stride, s.pad_l, s.pad_r);
  int out = tensor(tp, s.B, c->cout, Ho, Wo, err);
  op *o = new_op(tp, OP_CONV, in, out, err);
  if (!o) return -1;
  o->c = c, o->stride = stride;
  const float *w = tp->u->w;
  tp->be->conv2d_fwd(&s, tp->t[in].x, w + c->w, w + c->b, tp->t[out].x, tp->u->col);
  return out;
}

int ut_gn(ct_unet_tape *tp, const unorm *n, int in, int G, float eps, int silu, ct_err *err) {
  tt x = tp->t[in];
  const int HW = x.H * x.W;
  int out = tensor(tp, x.B, x.C, x.H, x.W, err);
  op *o = new_op(tp, OP_GN, in, out, err);
  if (!o) return -1;
  o->n = n, o->silu = silu, o->G = G;
  o->mean = buf(tp, (size_t)x.B * G), o->rstd = buf(tp, (size_t)x.B * G);
  o->pre = silu ? buf(tp, numel(&x)) : NULL;
  if (!o->mean || !o->rstd || (silu && !o->pre)) return NOMEM(err), -1;
  const float *w = tp->u->w;
  float *y = silu ? o->pre : tp->t[out].x;
  tp->be->groupnorm_fwd(x.B, x.C, HW, G, eps, x.x, w + n->g, w + n->b, y, o->mean, o->rstd);
  if (silu) tp->be->silu_fwd(x.B * x.C, HW, o->pre, HW, tp->t[out].x, HW);
  done(tp, o);
  return out;
}

/* LayerNorm with affine weight as ln_mod with shift = bias, scale = weight - 1 */
int ut_ln(ct_unet_tape *tp, const unorm *n, int in, float eps, ct_err *err) {
  tt x = tp->t[in];
  const int N = x.B * x.H, D = x.C;
  if (!tp->minus1 || tp->ones_n < (size_t)D)
    return ct_errf(err, CT_ERR_INVALID, "no constants"), -1;
  int out = tensor(tp, x.B, x.C, x.H, x.W, err);
  op *o = new_op(tp, OP_LN, in, out, err);
  if (!o) return -1;
  o->n = n;
  o->xhat = buf(tp, numel(&x)), o->rstd = buf(tp, (size_t)N), o->scale = buf(tp, (size_t)D);
  if (!o->xhat || !o->rstd || !o->scale) return NOMEM(err), -1;
  const float *w = tp->u->w;
  tp->be->copy(o->scale, w + n->g, (size_t)D * sizeof(float));
  tp->be->add_inplace((size_t)D, o->scale, tp->minus1);
  tp->be->ln_mod_fwd(1, N, D, x.x, D, w + n->b, o->scale, 0, eps, o->xhat, o->rstd, tp->t[out].x,
                     D);
  done(tp, o);
  return out;
}

int ut_lin(ct_unet_tape *tp, const ulin *l, int in, ct_err *err) {
  tt x = tp->t[in];
  const int N = x.B * x.H;
  int out = tensor(tp, x.B, l->out, x.H, 1, err);
  op *o = new_op(tp, OP_LIN, in, out, err);
  if (!o) return -1;
  o->l = l;
  const float *w = tp->u->w;
  tp->be->linear_fwd(N, l->in, l->out, x.x, l->in, w + l->w, l->b == UNET_NO_BIAS ? NULL : w + l->b,
                     tp->t[out].x, l->out);
  return lora_fwd(tp, l, N, x.x, tp->t[out].x, l->out, err) ? out : -1;
}

int ut_silu(ct_unet_tape *tp, int in, ct_err *err) {
  tt x = tp->t[in];
  int out = tensor(tp, x.B, x.C, x.H, x.W, err);
  if (!new_op(tp, OP_SILU, in, out, err)) return -1;
  tp->be->silu_fwd(1, (int)numel(&x), x.x, 0, tp->t[out].x, 0);
  return out;
}

int ut_add(ct_unet_tape *tp, int a, int b, ct_err *err) {
  tt x = tp->t[a];
  int out = tensor(tp, x.B, x.C, x.H, x.W, err);
  op *o = new_op(tp, OP_ADD, a, out, err);
  if (!o) return -1;
  o->in2 = b;
  tp->be->copy(tp->t[out].x, x.x, numel(&x) * sizeof(float));
  tp->be->add_inplace(numel(&x), tp->t[out].x, tp->t[b].x);
  return out;
}

/* x (B, C, H, W) + v[b, c] over H W: a rank-1 product with a row of ones */
int ut_add_bc(ct_unet_tape *tp, int xi, int vi, ct_err *err) {
  tt x = tp->t[xi];
  const int HW = x.H * x.W;
  if ((size_t)HW > tp->ones_n) return ct_errf(err, CT_ERR_INVALID, "no constants"), -1;
  int out = tensor(tp, x.B, x.C, x.H, x.W, err);
  op *o = new_op(tp, OP_ADDBC, xi, out, err);
  if (!o) return -1;
  o->in2 = vi;
  tp->be->copy(tp->t[out].x, x.x, numel(&x) * sizeof(float));
  tp->be->sgemm(0, 0, x.B * x.C, HW, 1, 1.0f, tp->t[vi].x, 1, tp->ones, HW, 1.0f, tp->t[out].x, HW);
  return out;
}

int ut_up(ct_unet_tape *tp, int in, ct_err *err) {
  tt x = tp->t[in];
  int out = tensor(tp, x.B, x.C, 2 * x.H, 2 * x.W, err);
  if (!new_op(tp, OP_UP, in, out, err)) return -1;
  tp->be->upsample2x_fwd(x.B * x.C, x.H, x.W, x.x, tp->t[out].x);
  return out;
}

int ut_cat(ct_unet_tape *tp, int a, int b, ct_err *err) {
  tt x = tp->t[a], y = tp->t[b];
  const int HW = x.H * x.W, C = x.C + y.C;
  int out = tensor(tp, x.B, C, x.H, x.W, err);
  op *o = new_op(tp, OP_CAT, a, out, err);
  if (!o) return -1;
  o->in2 = b;
  float *d = tp->t[out].x;
  tp->be->copy_2d(x.B, x.C * HW, x.x, x.C * HW, d, C * HW);
  tp->be->copy_2d(x.B, y.C * HW, y.x, y.C * HW, d + (size_t)x.C * HW, C * HW);
  return out;
}

int ut_to_nlc(ct_unet_tape *tp, int in, ct_err *err) {
  tt x = tp->t[in];
  int out = tensor(tp, x.B, x.C, x.H * x.W, 1, err);
  if (!new_op(tp, OP_NLC, in, out, err)) return -1;
  tp->be->nchw_to_nlc(x.B, x.C, x.H * x.W, x.x, tp->t[out].x);
  return out;
}

int ut_to_nchw(ct_unet_tape *tp, int in, int C, int H, int W, ct_err *err) {
  tt x = tp->t[in];
  int out = tensor(tp, x.B, C, H, W, err);
  if (!new_op(tp, OP_NCHW, in, out, err)) return -1;
  tp->be->nlc_to_nchw(x.B, C, H * W, x.x, tp->t[out].x);
  return out;
}

/* (B*L, H*hd) rows <-> (B, H, L, hd) heads */
static void split_heads(const ct_backend_ops *be, int B, int L, int H, int hd, const float *x,
                        float *y) {
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      be->copy_2d(L, hd, x + (size_t)b * L * H * hd + (size_t)h * hd, H * hd,
                  y + ((size_t)b * H + h) * L * hd, hd);
}
static void merge_heads(const ct_backend_ops *be, int B, int L, int H, int hd, const float *y,
                        float *x) {
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      be->copy_2d(L, hd, y + ((size_t)b * H + h) * L * hd, hd,
                  x + (size_t)b * L * H * hd + (size_t)h * hd, H * hd);
}

/* diffusers' Attention (attention_processor.py, AttnProcessor2_0): q from
 * xq, k and v from xkv, softmax(q k^T / sqrt(hd)) v per head, to_out.0 */
int ut_attn(ct_unet_tape *tp, const uattn *a, int heads, int xq, int xkv, int self, ct_err *err) {
  tt x = tp->t[xq], e = tp->t[xkv];
  const int B = x.B, Lq = x.H, Lk = e.H, C = a->q.out, hd = C / heads;
  const ct_backend_ops *be = tp->be;
  int out = tensor(tp, B, C, Lq, 1, err);
  op *o = new_op(tp, OP_ATTN, xq, out, err);
  if (!o) return -1;
  o->in2 = xkv, o->a = a, o->heads = heads, o->self = self;
  const size_t nq = (size_t)B * Lq * C, nk = (size_t)B * Lk * C;
  o->q = buf(tp, nq), o->k = buf(tp, nk), o->v = buf(tp, nk), o->o = buf(tp, nq);
  o->lse = buf(tp, (size_t)B * heads * Lq);
  float *t = buf(tp, nq > nk ? nq : nk);
  if (!o->q || !o->k || !o->v || !o->o || !o->lse || !t) {
    be->free(t);
    return NOMEM(err), -1;
  }
  const float *w = tp->u->w;
  be->linear_fwd(B * Lq, a->q.in, C, x.x, a->q.in, w + a->q.w, NULL, t, C);
  if (!lora_fwd(tp, &a->q, B * Lq, x.x, t, C, err)) return be->free(t), -1;
  split_heads(be, B, Lq, heads, hd, t, o->q);
  be->linear_fwd(B * Lk, a->k.in, C, e.x, a->k.in, w + a->k.w, NULL, t, C);
  if (!lora_fwd(tp, &a->k, B * Lk, e.x, t, C, err)) return be->free(t), -1;
  split_heads(be, B, Lk, heads, hd, t, o->k);
  be->linear_fwd(B * Lk, a->v.in, C, e.x, a->v.in, w + a->v.w, NULL, t, C);
  if (!lora_fwd(tp, &a->v, B * Lk, e.x, t, C, err)) return be->free(t), -1;
  split_heads(be, B, Lk, heads, hd, t, o->v);
  be->free(t);
  const float scale = 1.0f / sqrtf((float)hd);
  if (self)
    be->attention_fwd(B, heads, Lq, hd, scale, 0, o->q, o->k, o->v, o->o, o->lse);
  else
    be->attention_cross_fwd(B, heads, Lq, Lk, hd, scale, o->q, o->k, o->v, o->o, o->lse);
  be->linear_fwd(B * Lq, C, C, o->o, C, w + a->o.w, w + a->o.b, tp->t[out].x, C);
  if (!lora_fwd(tp, &a->o, B * Lq, o->o, tp->t[out].x, C, err)) return -1;
  done(tp, o);
  return out;
}

/* diffusers' GEGLU (activations.py): hidden, gate = proj(x).chunk(2); hidden * gelu(gate) */
int ut_geglu(ct_unet_tape *tp, int in, ct_err *err) {
  tt x = tp->t[in];
  const int N = x.B * x.H, I = x.C / 2;
  int out = tensor(tp, x.B, I, x.H, 1, err);
  op *o = new_op(tp, OP_GEGLU, in, out, err);
  if (!o) return -1;
  if (!(o->gl = buf(tp, (size_t)N * I))) return NOMEM(err), -1;
  tp->be->gelu_erf_fwd(N, I, x.x + I, 2 * I, o->gl, I);
  tp->be->copy_2d(N, I, x.x, 2 * I, tp->t[out].x, I);
  tp->be->mul_inplace((size_t)N * I, tp->t[out].x, o->gl);
  done(tp, o);
  return out;
}

/* the constants: a row of ones (the broadcast add) and -1s (LayerNorm's scale) */
ct_status ut_constants(ct_unet_tape *tp, size_t n, ct_err *err) {
  float *h = malloc(n * sizeof(float));
  tp->ones = buf(tp, n), tp->minus1 = buf(tp, n);
  if (!h || !tp->ones || !tp->minus1) {
    free(h);
    return NOMEM(err);
  }
  for (size_t i = 0; i < n; i++) h[i] = 1.0f;
  tp->be->copy_in(tp->ones, h, n * sizeof(float));
  for (size_t i = 0; i < n; i++) h[i] = -1.0f;
  tp->be->copy_in(tp->minus1, h, n * sizeof(float));
  free(h);
  tp->ones_n = n;
  return CT_OK;
}

void ct_unet_tape_free(ct_unet_tape *tp) {
  if (!tp) return;
  const ct_backend_ops *be = tp->be;
  for (int i = 0; i < tp->nt; i++) be->free(tp->t[i].x), be->free(tp->t[i].g);
  for (int i = 0; i < tp->nops; i++) {
    op *o = &tp->ops[i];
    float *p[] = {o->pre, o->mean, o->rstd, o->xhat, o->scale, o->q,
                  o->k,   o->v,    o->o,    o->lse,  o->ao,    o->gl};
    for (size_t k = 0; k < sizeof p / sizeof p[0]; k++) be->free(p[k]);
  }
  free(tp->t);
  free(tp->ops);
  be->free(tp->tmp), be->free(tp->tmp2), be->free(tp->ones), be->free(tp->minus1);
  free(tp);
}

/* ---------------------------------------------------------- the backward */

/* a parameter's gradient, or NULL when the base is frozen */
#define GW(off) (gw ? gw + (off) : NULL)

static void bwd_attn(ct_unet_tape *tp, const op *o, float *gw, float *dq, float *dk, float *dv) {
  const ct_backend_ops *be = tp->be;
  const float *w = tp->u->w;
  tt *x = &tp->t[o->in], *e = &tp->t[o->in2], *out = &tp->t[o->out];
  const uattn *a = o->a;
  const int B = x->B, Lq = x->H, Lk = e->H, C = a->q.out, H = o->heads, hd = C / H;
  float *dO = tp->tmp, *t = tp->tmp2;
  be->linear_bwd(B * Lq, C, C, o->o, C, w + a->o.w, out->g, C, dO, C, 0.0f, GW(a->o.w), GW(a->o.b));
  lora_bwd(tp, &a->o, B * Lq, o->o, out->g, dO);
  const float scale = 1.0f / sqrtf((float)hd);
  if (o->self)
    be->attention_bwd(B, H, Lq, hd, scale, 0, o->q, o->k, o->v, o->o, o->lse, dO, dq, dk, dv);
  else
    be->attention_cross_bwd(B, H, Lq, Lk, hd, scale, o->q, o->k, o->v, o->o, o->lse, dO, dq, dk,
                            dv);
  merge_heads(be, B, Lq, H, hd, dq, t);
  be->linear_bwd(B * Lq, a->q.in, C, x->x, a->q.in, w + a->q.w, t, C, x->g, a->q.in, 1.0f,
                 GW(a->q.w), NULL);
  lora_bwd(tp, &a->q, B * Lq, x->x, t, x->g);
  merge_heads(be, B, Lk, H, hd, dk, t);
  be->linear_bwd(B * Lk, a->k.in, C, e->x, a->k.in, w + a->k.w, t, C, e->g, a->k.in, 1.0f,
                 GW(a->k.w), NULL);
  lora_bwd(tp, &a->k, B * Lk, e->x, t, e->g);
  merge_heads(be, B, Lk, H, hd, dv, t);
  be->linear_bwd(B * Lk, a->v.in, C, e->x, a->v.in, w + a->v.w, t, C, e->g, a->v.in, 1.0f,
                 GW(a->v.w), NULL);
  lora_bwd(tp, &a->v, B * Lk, e->x, t, e->g);
}

/* GEGLU's input has one consumer (ff.net.0.proj's output feeds only it), so
 * its gradient is written, not added */
static void bwd_geglu(ct_unet_tape *tp, const op *o) {
  const ct_backend_ops *be = tp->be;
  tt *x = &tp->t[o->in], *out = &tp->t[o->out];
  const int N = x->B * x->H, I = x->C / 2;
  be->copy_2d(N, I, out->g, I, tp->tmp, I);
  be->mul_inplace((size_t)N * I, tp->tmp, o->gl); /* d hidden = dout gelu(gate) */
  be->copy_2d(N, I, tp->tmp, I, x->g, 2 * I);
  be->copy_2d(N, I, x->x, 2 * I, tp->tmp2, I);
  be->mul_inplace((size_t)N * I, tp->tmp2, out->g); /* d gelu(gate) = dout hidden */
  be->gelu_erf_bwd(N, I, x->x + I, 2 * I, tp->tmp2, I, x->g + I, 2 * I);
}

static void bwd_cat(ct_unet_tape *tp, const op *o) {
  const ct_backend_ops *be = tp->be;
  tt *a = &tp->t[o->in], *b = &tp->t[o->in2], *out = &tp->t[o->out];
  const int HW = a->H * a->W, C = out->C;
  be->copy_2d(a->B, a->C * HW, out->g, C * HW, tp->tmp, a->C * HW);
  be->add_inplace(numel(a), a->g, tp->tmp);
  be->copy_2d(a->B, b->C * HW, out->g + (size_t)a->C * HW, C * HW, tp->tmp, b->C * HW);
  be->add_inplace(numel(b), b->g, tp->tmp);
}

static void bwd_op(ct_unet_tape *tp, const op *o, float *gw, float *dq, float *dk, float *dv) {
  const ct_backend_ops *be = tp->be;
  const float *w = tp->u->w;
  tt *in = &tp->t[o->in], *out = &tp->t[o->out];
  const size_t nin = numel(in);
  const int HW = in->H * in->W;
  switch (o->kind) {
    case OP_CONV: {
      ct_conv2d_shape s = conv_shape(o->c, in, o->stride);
      be->conv2d_bwd(&s, in->x, w + o->c->w, out->g, tp->tmp, GW(o->c->w), GW(o->c->b), tp->u->col);
      be->add_inplace(nin, in->g, tp->tmp);
      break;
    }
    case OP_GN: {
      const float *dy = out->g;
      if (o->silu) {
        be->silu_bwd(in->B * in->C, HW, o->pre, HW, out->g, HW, tp->tmp2, HW);
        dy = tp->tmp2;
      }
      be->groupnorm_bwd(in->B, in->C, HW, o->G, in->x, w + o->n->g, o->mean, o->rstd, dy, tp->tmp,
                        GW(o->n->g), GW(o->n->b));
      be->add_inplace(nin, in->g, tp->tmp);
      break;
    }
    case OP_LN:
      be->ln_mod_bwd(1, in->B * in->H, in->C, o->xhat, o->rstd, o->scale, 0, out->g, in->C, in->g,
                     in->C, GW(o->n->b), GW(o->n->g));
      break;
    case OP_LIN:
      be->linear_bwd(in->B * in->H, o->l->in, o->l->out, in->x, o->l->in, w + o->l->w, out->g,
                     o->l->out, in->g, o->l->in, 1.0f, GW(o->l->w),
                     o->l->b == UNET_NO_BIAS ? NULL : GW(o->l->b));
      lora_bwd(tp, o->l, in->B * in->H, in->x, out->g, in->g);
      break;
    case OP_SILU:
      be->silu_bwd(1, (int)nin, in->x, 0, out->g, 0, tp->tmp, 0);
      be->add_inplace(nin, in->g, tp->tmp);
      break;
    case OP_ADD:
      be->add_inplace(nin, in->g, out->g);
      be->add_inplace(nin, tp->t[o->in2].g, out->g);
      break;
    case OP_ADDBC:
      be->add_inplace(nin, in->g, out->g);
      be->sgemm(0, 0, in->B * in->C, 1, HW, 1.0f, out->g, HW, tp->ones, 1, 1.0f, tp->t[o->in2].g,
                1);
      break;
    case OP_UP:
      be->upsample2x_bwd(in->B * in->C, in->H, in->W, out->g, tp->tmp);
      be->add_inplace(nin, in->g, tp->tmp);
      break;
    case OP_CAT:
      bwd_cat(tp, o);
      break;
    case OP_NLC:
      be->nlc_to_nchw(in->B, in->C, HW, out->g, tp->tmp);
      be->add_inplace(nin, in->g, tp->tmp);
      break;
    case OP_NCHW:
      be->nchw_to_nlc(in->B, out->C, out->H * out->W, out->g, tp->tmp);
      be->add_inplace(nin, in->g, tp->tmp);
      break;
    case OP_ATTN:
      bwd_attn(tp, o, gw, dq, dk, dv);
      break;
    case OP_GEGLU:
      bwd_geglu(tp, o);
      break;
  }
}

/* tensor i's gradient buffer, zeroed when first needed */
static int need_g(ct_unet_tape *tp, int i) {
  tt *t = &tp->t[i];
  if (!t->g && (t->g = buf(tp, numel(t)))) tp->be->zero(numel(t), t->g);
  return t->g != NULL;
}

/* what op o kept for its backward and its output (value and gradient): no
 * op processed after it reads them (its consumers came later in the forward) */
static void release(ct_unet_tape *tp, op *o) {
  const ct_backend_ops *be = tp->be;
  float **p[] = {
      &o->pre, &o->mean, &o->rstd, &o->xhat, &o->scale,        &o->q,           &o->k, &o->v,
      &o->o,   &o->lse,  &o->ao,   &o->gl,   &tp->t[o->out].x, &tp->t[o->out].g};
  for (size_t k = 0; k < sizeof p / sizeof p[0]; k++) be->free(*p[k]), *p[k] = NULL;
}

/* Walks the tape backwards. A tensor's gradient is allocated when a consumer
 * first adds into it, and freed with its value once its producer is done,
 * so the peak is the forward's tape plus the gradients in flight. The
 * tape's activations are gone afterwards: one backward per tape. */
ct_status ut_backward(ct_unet_tape *tp, int out, const float *dout, ct_err *err) {
  const ct_backend_ops *be = tp->be;
  float *gw = tp->u->frozen ? NULL : ct_unet_grads(tp->u);
  if (!gw && !tp->u->frozen)
    return ct_errf(err, CT_ERR_NOMEM, "out of memory for the U-net's gradients");
  if (tp->tmp) return ct_errf(err, CT_ERR_INVALID, "ct_unet_backward: this tape was used already");
  size_t hn = 1; /* the largest attention heads buffer */
  for (int i = 0; i < tp->nops; i++)
    if (tp->ops[i].kind == OP_ATTN) {
      const tt *x = &tp->t[tp->ops[i].in], *e = &tp->t[tp->ops[i].in2];
      const size_t n = (size_t)x->B * (x->H > e->H ? x->H : e->H) * tp->ops[i].a->q.out;
      hn = n > hn ? n : hn;
    }
  if (hn > tp->tmp_n) tp->tmp_n = hn;
  tp->tmp = buf(tp, tp->tmp_n), tp->tmp2 = buf(tp, tp->tmp_n);
  float *dq = buf(tp, hn), *dk = buf(tp, hn), *dv = buf(tp, hn);
  ct_status st = tp->tmp && tp->tmp2 && dq && dk && dv && need_g(tp, out) ? CT_OK : NOMEM(err);
  if (!st) be->copy(tp->t[out].g, dout, numel(&tp->t[out]) * sizeof(float));
  for (int i = tp->nops - 1; !st && i >= 0; i--) {
    op *o = &tp->ops[i];
    if (tp->t[o->out].g) { /* else nothing reached it: no gradient flows */
      if (!need_g(tp, o->in) || (o->in2 >= 0 && !need_g(tp, o->in2))) {
        st = NOMEM(err);
        break;
      }
      bwd_op(tp, o, gw, dq, dk, dv);
    }
    release(tp, o);
  }
  be->free(dq), be->free(dk), be->free(dv);
  if (!st && tp->oom) st = ct_errf(err, CT_ERR_NOMEM, "out of memory for the LoRA backward");
  return st;
}

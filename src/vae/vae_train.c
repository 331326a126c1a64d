/* vae_train.c: the VAE's forward with a tape, and its backward.
 *
 * The recorded forward computes what ct_vae_encode/ct_vae_decode compute,
 * but keeps every intermediate tensor on a tape of operations (conv,
 * GroupNorm(+SiLU), add, upsample, attention). The backward walks the tape
 * in reverse: each tensor has a gradient buffer that its consumers add into,
 * so residual branches need no special casing. Parameter gradients
 * ACCUMULATE into the VAE's gradient buffer (ct_vae_grads), in the order of
 * the tape, whatever the thread count. Ops and buffers go through the VAE's
 * compute backend (v->be), which the tape remembers for freeing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "vae/vae_int.h"

typedef struct tt { /* a tensor on the tape */
  float *x, *g;
  int C, H, W;
} tt;

enum { OP_CONV, OP_GN, OP_ADD, OP_UP, OP_ATTN };

typedef struct op {
  int kind, in, in2, out; /* tensor indices */
  const vconv *c;
  int down;
  const vgn *n;
  int silu;
  float *pre, *mean, *rstd; /* GN: output before SiLU, statistics */
  const vattn *a;
  float *t, *q, *k, *v, *o, *lse; /* attention internals (B, L, C) */
} op;

struct ct_vae_tape {
  const ct_backend_ops *be;
  int B, encode;
  tt *t;
  int nt, capt;
  op *ops;
  int nops, capo;
  float *tmp, *tmp2;
  size_t tmp_n;
  int final; /* the output tensor */
  int input;
};

/* n zeroed floats of the backend's memory (at least one), counted as activations */
static float *tape_buf(const ct_vae_tape *tp, size_t n) {
  n = n ? n : 1;
  float *p = tp->be->alloc(CT_MEM_ACTIVATIONS, n * sizeof(float));
  if (p) tp->be->zero(n, p);
  return p;
}

static int new_tensor(ct_vae_tape *tp, int C, int H, int W, const float *init) {
  if (tp->nt == tp->capt) {
    int nc = tp->capt ? tp->capt * 2 : 64;
    tt *n = realloc(tp->t, (size_t)nc * sizeof *n);
    if (!n) return -1;
    tp->t = n, tp->capt = nc;
  }
  const size_t n = (size_t)tp->B * C * H * W;
  tt *t = &tp->t[tp->nt];
  t->x = tape_buf(tp, n);
  t->g = tape_buf(tp, n);
  t->C = C, t->H = H, t->W = W;
  if (!t->x || !t->g) {
    tp->be->free(t->x);
    tp->be->free(t->g);
    return -1;
  }
  if (init) tp->be->copy(t->x, init, n * sizeof(float));
  if (n > tp->tmp_n) tp->tmp_n = n;
  return tp->nt++;
}

static op *new_op(ct_vae_tape *tp, int kind) {
  if (tp->nops == tp->capo) {
    int nc = tp->capo ? tp->capo * 2 : 64;
    op *n = realloc(tp->ops, (size_t)nc * sizeof *n);
    if (!n) return NULL;
    tp->ops = n, tp->capo = nc;
  }
  op *o = &tp->ops[tp->nops++];
  memset(o, 0, sizeof *o);
  o->kind = kind;
  return o;
}

static size_t numel(const ct_vae_tape *tp, int i) {
  return (size_t)tp->B * tp->t[i].C * tp->t[i].H * tp->t[i].W;
}

#define NOMEM(err) ct_errf((err), CT_ERR_NOMEM, "out of memory for the VAE's recorded activations")

static ct_conv2d_shape conv_shape(int B, const vconv *c, const tt *x, int down) {
  ct_conv2d_shape s = {B, c->cin, x->H, x->W, c->cout, c->k, down ? 2 : 1, 0, 0, 0, 0};
  if (down)
    s.pad_b = s.pad_r = 1;
  else
    s.pad_t = s.pad_l = s.pad_b = s.pad_r = c->k / 2;
  return s;
}

static int t_conv(ct_vae *v, ct_vae_tape *tp, const vconv *c, int in, int down, ct_err *err) {
  ct_conv2d_shape s = conv_shape(tp->B, c, &tp->t[in], down);
  if (ct_vae_need_col(v, &s, err)) return -1;
  const int Ho = ct_conv2d_out(s.H, s.k, s.stride, s.pad_t, s.pad_b),
            Wo = ct_conv2d_out(s.W, s.k, s.stride, s.pad_l, s.pad_r);
  int out = new_tensor(tp, c->cout, Ho, Wo, NULL);
  op *o = out < 0 ? NULL : new_op(tp, OP_CONV);
  if (!o) return NOMEM(err), -1;
  o->in = in, o->out = out, o->c = c, o->down = down;
  tp->be->conv2d_fwd(&s, tp->t[in].x, v->w + c->w, v->w + c->b, tp->t[out].x, v->col);
  return out;
}

static int t_gn(ct_vae *v, ct_vae_tape *tp, const vgn *g, int in, int silu, ct_err *err) {
  const tt *x = &tp->t[in];
  const int B = tp->B, G = v->cfg.norm_num_groups, HW = x->H * x->W;
  int out = new_tensor(tp, x->C, x->H, x->W, NULL);
  op *o = out < 0 ? NULL : new_op(tp, OP_GN);
  if (!o) return NOMEM(err), -1;
  o->in = in, o->out = out, o->n = g, o->silu = silu;
  o->mean = tp->be->alloc(CT_MEM_ACTIVATIONS, (size_t)B * G * sizeof(float));
  o->rstd = tp->be->alloc(CT_MEM_ACTIVATIONS, (size_t)B * G * sizeof(float));
  o->pre = silu ? tape_buf(tp, numel(tp, out)) : NULL;
  if (!o->mean || !o->rstd || (silu && !o->pre)) return NOMEM(err), -1;
  float *y = silu ? o->pre : tp->t[out].x;
  x = &tp->t[in];
  tp->be->groupnorm_fwd(B, x->C, HW, G, GN_EPS, x->x, v->w + g->g, v->w + g->b, y, o->mean,
                        o->rstd);
  if (silu) tp->be->silu_fwd(B * x->C, HW, o->pre, HW, tp->t[out].x, HW);
  return out;
}

static int t_add(ct_vae_tape *tp, int a, int b, ct_err *err) {
  const tt *x = &tp->t[a];
  int out = new_tensor(tp, x->C, x->H, x->W, tp->t[a].x);
  op *o = out < 0 ? NULL : new_op(tp, OP_ADD);
  if (!o) return NOMEM(err), -1;
  o->in = a, o->in2 = b, o->out = out;
  tp->be->add_inplace(numel(tp, out), tp->t[out].x, tp->t[b].x);
  return out;
}

static int t_up(ct_vae_tape *tp, int in, ct_err *err) {
  const tt *x = &tp->t[in];
  int out = new_tensor(tp, x->C, 2 * x->H, 2 * x->W, NULL);
  op *o = out < 0 ? NULL : new_op(tp, OP_UP);
  if (!o) return NOMEM(err), -1;
  o->in = in, o->out = out;
  x = &tp->t[in];
  tp->be->upsample2x_fwd(tp->B * x->C, x->H, x->W, x->x, tp->t[out].x);
  return out;
}

static int t_res(ct_vae *v, ct_vae_tape *tp, const vres *r, int x, ct_err *err) {
  int h = t_gn(v, tp, &r->n1, x, 1, err);
  if (h >= 0) h = t_conv(v, tp, &r->c1, h, 0, err);
  if (h >= 0) h = t_gn(v, tp, &r->n2, h, 1, err);
  if (h >= 0) h = t_conv(v, tp, &r->c2, h, 0, err);
  int sc = x;
  if (h >= 0 && r->has_sc) sc = t_conv(v, tp, &r->sc, x, 0, err);
  return h >= 0 && sc >= 0 ? t_add(tp, sc, h, err) : -1;
}

static int t_attn(ct_vae *v, ct_vae_tape *tp, const vattn *a, int x, ct_err *err) {
  int gn = t_gn(v, tp, &a->gn, x, 0, err);
  if (gn < 0) return -1;
  const tt *xt = &tp->t[x];
  const int B = tp->B, C = a->C, L = xt->H * xt->W;
  int out = new_tensor(tp, C, xt->H, xt->W, NULL);
  op *o = out < 0 ? NULL : new_op(tp, OP_ATTN);
  if (!o) return NOMEM(err), -1;
  const size_t n = (size_t)B * L * C;
  o->in = x, o->in2 = gn, o->out = out, o->a = a;
  o->t = tape_buf(tp, n), o->q = tape_buf(tp, n), o->k = tape_buf(tp, n), o->v = tape_buf(tp, n);
  o->o = tape_buf(tp, n);
  o->lse = tape_buf(tp, (size_t)B * L);
  float *proj = tape_buf(tp, n);
  if (!o->t || !o->q || !o->k || !o->v || !o->o || !o->lse || !proj) {
    tp->be->free(proj);
    return NOMEM(err), -1;
  }
  tp->be->nchw_to_nlc(B, C, L, tp->t[gn].x, o->t);
  tp->be->linear_fwd(B * L, C, C, o->t, C, v->w + a->q.w, v->w + a->q.b, o->q, C);
  tp->be->linear_fwd(B * L, C, C, o->t, C, v->w + a->k.w, v->w + a->k.b, o->k, C);
  tp->be->linear_fwd(B * L, C, C, o->t, C, v->w + a->v.w, v->w + a->v.b, o->v, C);
  tp->be->attention_fwd(B, 1, L, C, 1.0f / sqrtf((float)C), 0, o->q, o->k, o->v, o->o, o->lse);
  tp->be->linear_fwd(B * L, C, C, o->o, C, v->w + a->o.w, v->w + a->o.b, proj, C);
  tp->be->nlc_to_nchw(B, C, L, proj, tp->t[out].x);
  tp->be->add_inplace(n, tp->t[out].x, tp->t[x].x);
  tp->be->free(proj);
  return out;
}

static int t_mid(ct_vae *v, ct_vae_tape *tp, const vmid *m, int x, ct_err *err) {
  x = t_res(v, tp, &m->r0, x, err);
  if (x >= 0 && m->has_attn) x = t_attn(v, tp, &m->attn, x, err);
  return x >= 0 ? t_res(v, tp, &m->r1, x, err) : -1;
}

void ct_vae_tape_free(ct_vae_tape *tp) {
  if (!tp) return;
  const ct_backend_ops *be = tp->be;
  for (int i = 0; i < tp->nt; i++) {
    be->free(tp->t[i].x);
    be->free(tp->t[i].g);
  }
  for (int i = 0; i < tp->nops; i++) {
    op *o = &tp->ops[i];
    be->free(o->mean);
    be->free(o->rstd);
    be->free(o->pre);
    be->free(o->t), be->free(o->q), be->free(o->k), be->free(o->v), be->free(o->o),
        be->free(o->lse);
  }
  free(tp->t);
  free(tp->ops);
  be->free(tp->tmp);
  be->free(tp->tmp2);
  free(tp);
}

float *ct_vae_grads(ct_vae *v) {
  if (!v->g) {
    const size_t n = v->numel ? v->numel : 1;
    v->g = v->be->alloc(CT_MEM_GRADS, n * sizeof(float));
    if (v->g) v->be->zero(n, v->g);
  }
  return v->g;
}

/* ----------------------------------------------------------- the forward */

static ct_vae_tape *tape_new(const ct_vae *v, int B, int encode) {
  ct_vae_tape *tp = calloc(1, sizeof *tp);
  if (tp) tp->be = v->be, tp->B = B, tp->encode = encode;
  return tp;
}

ct_status ct_vae_encode_fwd(ct_vae *v, int B, int H, int W, const float *x, float *mean,
                            float *logvar, ct_vae_tape **out, ct_err *err) {
  *out = NULL;
  const ct_vae_config *c = &v->cfg;
  const int f = ct_vae_factor(c);
  if (B < 1 || H < f || W < f || H % f || W % f)
    return ct_errf(err, CT_ERR_SHAPE,
                   "VAE encode: %dx%d is not a positive multiple of the VAE's factor %d", W, H, f);
  ct_vae_tape *tp = tape_new(v, B, 1);
  if (!tp) return NOMEM(err);
  int h = tp->input = new_tensor(tp, c->in_channels, H, W, x);
  if (h >= 0) h = t_conv(v, tp, &v->e_in, h, 0, err);
  for (int i = 0; h >= 0 && i < c->nblocks; i++) {
    const vblock *b = &v->e_blocks[i];
    for (int j = 0; h >= 0 && j < b->nres; j++) h = t_res(v, tp, &b->res[j], h, err);
    if (h >= 0 && b->has_sampler) h = t_conv(v, tp, &b->sampler, h, 1, err);
  }
  if (h >= 0) h = t_mid(v, tp, &v->e_mid, h, err);
  if (h >= 0) h = t_gn(v, tp, &v->e_norm, h, 1, err);
  if (h >= 0) h = t_conv(v, tp, &v->e_out, h, 0, err);
  if (h >= 0 && c->use_quant_conv) h = t_conv(v, tp, &v->quant, h, 0, err);
  if (h < 0) {
    if (!err || !err->msg[0]) NOMEM(err);
    ct_vae_tape_free(tp);
    return err ? err->status : CT_ERR_NOMEM;
  }
  tp->final = h;
  ct_vae_split_moments(v->be, B, c->latent_channels, (size_t)tp->t[h].H * tp->t[h].W, tp->t[h].x,
                       mean, logvar);
  *out = tp;
  return CT_OK;
}

ct_status ct_vae_decode_fwd(ct_vae *v, int B, int h_, int w_, const float *z, float *x,
                            ct_vae_tape **out, ct_err *err) {
  *out = NULL;
  const ct_vae_config *c = &v->cfg;
  if (B < 1 || h_ < 1 || w_ < 1)
    return ct_errf(err, CT_ERR_SHAPE, "VAE decode: empty latent %dx%d", w_, h_);
  ct_vae_tape *tp = tape_new(v, B, 0);
  if (!tp) return NOMEM(err);
  int h = tp->input = new_tensor(tp, c->latent_channels, h_, w_, z);
  if (h >= 0 && c->use_post_quant_conv) h = t_conv(v, tp, &v->post_quant, h, 0, err);
  if (h >= 0) h = t_conv(v, tp, &v->d_in, h, 0, err);
  if (h >= 0) h = t_mid(v, tp, &v->d_mid, h, err);
  for (int i = 0; h >= 0 && i < c->nblocks; i++) {
    const vblock *b = &v->d_blocks[i];
    for (int j = 0; h >= 0 && j < b->nres; j++) h = t_res(v, tp, &b->res[j], h, err);
    if (h >= 0 && b->has_sampler) h = t_up(tp, h, err);
    if (h >= 0 && b->has_sampler) h = t_conv(v, tp, &b->sampler, h, 0, err);
  }
  if (h >= 0) h = t_gn(v, tp, &v->d_norm, h, 1, err);
  if (h >= 0) h = t_conv(v, tp, &v->d_out, h, 0, err);
  if (h < 0) {
    if (!err || !err->msg[0]) NOMEM(err);
    ct_vae_tape_free(tp);
    return err ? err->status : CT_ERR_NOMEM;
  }
  tp->final = h;
  if (x) v->be->copy(x, tp->t[h].x, numel(tp, h) * sizeof(float));
  *out = tp;
  return CT_OK;
}

/* ---------------------------------------------------------- the backward */

static ct_status backward(ct_vae *v, ct_vae_tape *tp, ct_err *err) {
  float *gw = ct_vae_grads(v);
  if (!gw) return ct_errf(err, CT_ERR_NOMEM, "out of memory for the VAE's gradients");
  if (!tp->tmp) {
    tp->tmp = tape_buf(tp, tp->tmp_n);
    tp->tmp2 = tape_buf(tp, tp->tmp_n);
    if (!tp->tmp || !tp->tmp2) return NOMEM(err);
  }
  const ct_backend_ops *be = v->be;
  const int B = tp->B, G = v->cfg.norm_num_groups;
  for (int i = tp->nops - 1; i >= 0; i--) {
    const op *o = &tp->ops[i];
    tt *in = &tp->t[o->in], *out = &tp->t[o->out];
    const size_t nin = numel(tp, o->in);
    switch (o->kind) {
      case OP_CONV: {
        ct_conv2d_shape s = conv_shape(B, o->c, in, o->down);
        ct_status st = ct_vae_need_col(v, &s, err);
        if (st) return st;
        be->conv2d_bwd(&s, in->x, v->w + o->c->w, out->g, tp->tmp, gw + o->c->w, gw + o->c->b,
                       v->col);
        be->add_inplace(nin, in->g, tp->tmp);
        break;
      }
      case OP_GN: {
        const int HW = in->H * in->W;
        const float *dy = out->g;
        if (o->silu) {
          be->silu_bwd(B * in->C, HW, o->pre, HW, out->g, HW, tp->tmp2, HW);
          dy = tp->tmp2;
        }
        be->groupnorm_bwd(B, in->C, HW, G, in->x, v->w + o->n->g, o->mean, o->rstd, dy, tp->tmp,
                          gw + o->n->g, gw + o->n->b);
        be->add_inplace(nin, in->g, tp->tmp);
        break;
      }
      case OP_ADD:
        be->add_inplace(nin, in->g, out->g);
        be->add_inplace(numel(tp, o->in2), tp->t[o->in2].g, out->g);
        break;
      case OP_UP:
        be->upsample2x_bwd(B * in->C, in->H, in->W, out->g, tp->tmp);
        be->add_inplace(nin, in->g, tp->tmp);
        break;
      case OP_ATTN: {
        const vattn *a = o->a;
        const int C = a->C, L = in->H * in->W, N = B * L;
        const size_t n = (size_t)N * C;
        tt *gn = &tp->t[o->in2];
        be->add_inplace(nin, in->g, out->g); /* the residual */
        float *dproj = tp->tmp, *dO = tp->tmp2;
        be->nchw_to_nlc(B, C, L, out->g, dproj);
        be->linear_bwd(N, C, C, o->o, C, v->w + a->o.w, dproj, C, dO, C, 0.0f, gw + a->o.w,
                       gw + a->o.b);
        float *dq = tape_buf(tp, n), *dk = tape_buf(tp, n), *dv = tape_buf(tp, n);
        if (!dq || !dk || !dv) {
          be->free(dq), be->free(dk), be->free(dv);
          return NOMEM(err);
        }
        be->attention_bwd(B, 1, L, C, 1.0f / sqrtf((float)C), 0, o->q, o->k, o->v, o->o, o->lse, dO,
                          dq, dk, dv);
        float *dt = tp->tmp; /* dproj is no longer needed */
        be->linear_bwd(N, C, C, o->t, C, v->w + a->q.w, dq, C, dt, C, 0.0f, gw + a->q.w,
                       gw + a->q.b);
        be->linear_bwd(N, C, C, o->t, C, v->w + a->k.w, dk, C, dt, C, 1.0f, gw + a->k.w,
                       gw + a->k.b);
        be->linear_bwd(N, C, C, o->t, C, v->w + a->v.w, dv, C, dt, C, 1.0f, gw + a->v.w,
                       gw + a->v.b);
        be->free(dq), be->free(dk), be->free(dv);
        be->nlc_to_nchw(B, C, L, dt, tp->tmp2);
        be->add_inplace(n, gn->g, tp->tmp2);
        break;
      }
    }
  }
  return CT_OK;
}

ct_status ct_vae_encode_bwd(ct_vae *v, ct_vae_tape *tp, const float *dmean, const float *dlogvar,
                            float *dx, ct_err *err) {
  if (!tp || !tp->encode)
    return ct_errf(err, CT_ERR_INVALID, "ct_vae_encode_bwd needs an encoder tape");
  if (tp->be != v->be)
    return ct_errf(err, CT_ERR_INVALID, "the tape was recorded on another compute backend");
  const ct_backend_ops *be = v->be;
  tt *f = &tp->t[tp->final];
  const size_t n =
      (size_t)v->cfg.latent_channels * f->H * f->W; /* floats of mean (logvar) per image */
  for (int bi = 0; dmean && bi < tp->B; bi++)
    be->add_inplace(n, f->g + (size_t)bi * 2 * n, dmean + (size_t)bi * n);
  /* the clamp passes no gradient outside [-30, 20] */
  if (dlogvar)
    be->clamp_bwd(tp->B, (int)n, f->x + n, (int)(2 * n), -30.0f, 20.0f, dlogvar, (int)n, f->g + n,
                  (int)(2 * n));
  ct_status st = backward(v, tp, err);
  if (!st && dx) be->copy(dx, tp->t[tp->input].g, numel(tp, tp->input) * sizeof(float));
  return st;
}

ct_status ct_vae_decode_bwd(ct_vae *v, ct_vae_tape *tp, const float *dout, float *dz, ct_err *err) {
  if (!tp || tp->encode)
    return ct_errf(err, CT_ERR_INVALID, "ct_vae_decode_bwd needs a decoder tape");
  if (tp->be != v->be)
    return ct_errf(err, CT_ERR_INVALID, "the tape was recorded on another compute backend");
  v->be->add_inplace(numel(tp, tp->final), tp->t[tp->final].g, dout);
  ct_status st = backward(v, tp, err);
  if (!st && dz) v->be->copy(dz, tp->t[tp->input].g, numel(tp, tp->input) * sizeof(float));
  return st;
}

/* unet.c: the U-net's graph (diffusers' UNet2DConditionModel.forward,
 * src/diffusers/models/unets/unet_2d_condition.py) on the tape of
 * unet_tape.c: the time and added-condition embeddings, the down blocks
 * keeping their skips, the mid block, the up blocks concatenating them, the
 * output head; and the public forward and backward. */
#include <stdlib.h>
#include <string.h>

#include "unet_int.h"

/* next, the op's output, in place of old, which no later op reads (freed
 * when inference: ut_drop) */
static int then(ct_unet_tape *tp, int old, int next) {
  if (next >= 0) ut_drop(tp, old);
  return next;
}

/* ResnetBlock2D (resnet.py, resnet_time_scale_shift "default"):
 * conv2(silu(norm2(conv1(silu(norm1(x))) + time_emb_proj(silu(temb))))) + shortcut(x).
 * x is the caller's to drop (it may be a skip). */
static int res(ct_unet_tape *tp, const ures *r, int x, int semb, ct_err *err) {
  const ct_unet_config *c = &ut_owner(tp)->cfg;
  const int G = c->norm_num_groups;
  int h = ut_gn(tp, &r->n1, x, G, c->norm_eps, 1, err);
  if (h >= 0) h = then(tp, h, ut_conv(tp, &r->c1, h, 1, err));
  int t = h >= 0 ? ut_lin(tp, &r->temb, semb, err) : -1;
  if (t >= 0) h = then(tp, h, ut_add_bc(tp, h, t, err));
  ut_drop(tp, t);
  if (h >= 0 && t >= 0) h = then(tp, h, ut_gn(tp, &r->n2, h, G, c->norm_eps, 1, err));
  if (h >= 0 && t >= 0) h = then(tp, h, ut_conv(tp, &r->c2, h, 1, err));
  int sc = x;
  if (h >= 0 && t >= 0 && r->has_sc) sc = ut_conv(tp, &r->sc, x, 1, err);
  int out = h >= 0 && t >= 0 && sc >= 0 ? ut_add(tp, sc, h, err) : -1;
  if (out >= 0) ut_drop(tp, h);
  if (out >= 0 && sc != x) ut_drop(tp, sc);
  return out;
}

/* BasicTransformerBlock (attention.py, norm_type "layer_norm", GEGLU
 * feed-forward); t is the caller's to drop */
static int blk(ct_unet_tape *tp, const ublk *b, int heads, int t, int enc, ct_err *err) {
  int n = ut_ln(tp, &b->n1, t, 1e-5f, err);
  int a = n >= 0 ? then(tp, n, ut_attn(tp, &b->a1, heads, n, n, 1, err)) : -1;
  int t1 = a >= 0 ? ut_add(tp, t, a, err) : -1;
  ut_drop(tp, a);
  n = t1 >= 0 ? ut_ln(tp, &b->n2, t1, 1e-5f, err) : -1;
  a = n >= 0 ? then(tp, n, ut_attn(tp, &b->a2, heads, n, enc, 0, err)) : -1;
  int t2 = a >= 0 ? then(tp, t1, ut_add(tp, t1, a, err)) : -1;
  ut_drop(tp, a);
  n = t2 >= 0 ? ut_ln(tp, &b->n3, t2, 1e-5f, err) : -1;
  int f = n >= 0 ? then(tp, n, ut_lin(tp, &b->ff1, n, err)) : -1;
  if (f >= 0) f = then(tp, f, ut_geglu(tp, f, err));
  if (f >= 0) f = then(tp, f, ut_lin(tp, &b->ff2, f, err));
  int out = f >= 0 ? then(tp, t2, ut_add(tp, t2, f, err)) : -1;
  ut_drop(tp, f);
  return out;
}

/* Transformer2DModel (transformer_2d.py): GroupNorm (eps 1e-6), proj_in,
 * the blocks, proj_out, the residual. A 1x1-conv projection is the same
 * product as the linear one on the tokens. in is the caller's to drop. */
static int xf(ct_unet_tape *tp, const uxf *x, int in, int enc, ct_err *err) {
  const ct_unet_config *c = &ut_owner(tp)->cfg;
  int B, C, H, W;
  ut_shape(tp, in, &B, &C, &H, &W);
  int h = ut_gn(tp, &x->norm, in, c->norm_num_groups, 1e-6f, 0, err);
  if (h >= 0) h = then(tp, h, ut_to_nlc(tp, h, err));
  if (h >= 0) h = then(tp, h, ut_lin(tp, &x->pin, h, err));
  for (int i = 0; h >= 0 && i < x->nblk; i++)
    h = then(tp, h, blk(tp, &x->blk[i], x->heads, h, enc, err));
  if (h >= 0) h = then(tp, h, ut_lin(tp, &x->pout, h, err));
  if (h >= 0) h = then(tp, h, ut_to_nchw(tp, h, C, H, W, err));
  return h >= 0 ? then(tp, h, ut_add(tp, h, in, err)) : -1;
}

/* emb = time_embedding(time_proj(t)) [+ add_embedding(concat(text_embeds,
 * add_time_proj(time_ids)))]; returns silu(emb), what every resnet reads */
static int embeddings(ct_unet *u, ct_unet_tape *tp, const ct_unet_inputs *in, ct_err *err) {
  const ct_unet_config *c = &u->cfg;
  const ct_backend_ops *be = u->be;
  const int B = in->B, c0 = c->block_out_channels[0];
  int ts = ut_input(tp, B, c0, 1, 1, NULL, err);
  if (ts < 0) return -1;
  be->timestep_embedding(B, in->timesteps, c0, 10000.0f, 1.0f, ut_x(tp, ts));
  int e = then(tp, ts, ut_lin(tp, &u->t1, ts, err));
  if (e >= 0) e = then(tp, e, ut_silu(tp, e, err));
  if (e >= 0) e = then(tp, e, ut_lin(tp, &u->t2, e, err));
  if (e < 0 || !c->text_time) return e >= 0 ? then(tp, e, ut_silu(tp, e, err)) : -1;
  const int P = ct_unet_pooled_dim(c), Td = c->addition_time_embed_dim, D = P + 6 * Td;
  int ids = ut_input(tp, B * 6, Td, 1, 1, NULL, err);
  int cat = ids >= 0 ? ut_input(tp, B, D, 1, 1, NULL, err) : -1;
  if (cat < 0) return -1;
  be->timestep_embedding(B * 6, in->time_ids, Td, 10000.0f, 1.0f, ut_x(tp, ids));
  be->copy_2d(B, P, in->text_embeds, P, ut_x(tp, cat), D);
  be->copy_2d(B, 6 * Td, ut_x(tp, ids), 6 * Td, ut_x(tp, cat) + P, D);
  ut_drop(tp, ids);
  int a = then(tp, cat, ut_lin(tp, &u->a1, cat, err));
  if (a >= 0) a = then(tp, a, ut_silu(tp, a, err));
  if (a >= 0) a = then(tp, a, ut_lin(tp, &u->a2, a, err));
  if (a >= 0) e = then(tp, e, ut_add(tp, e, a, err));
  ut_drop(tp, a);
  return a >= 0 && e >= 0 ? then(tp, e, ut_silu(tp, e, err)) : -1;
}

/* the down blocks, pushing each output on skips; returns the last */
static int down(ct_unet *u, ct_unet_tape *tp, int h, int semb, int enc, int *skips, int *ns,
                ct_err *err) {
  skips[(*ns)++] = h;
  for (int i = 0; h >= 0 && i < u->cfg.nblocks; i++) {
    const ublock *b = &u->down[i];
    for (int j = 0; h >= 0 && j < b->nres; j++) {
      h = res(tp, &b->res[j], h, semb, err); /* its input is a skip: kept */
      if (h >= 0 && b->cross) h = then(tp, h, xf(tp, &b->attn[j], h, enc, err));
      skips[(*ns)++] = h;
    }
    if (h >= 0 && b->has_sampler) {
      h = ut_conv(tp, &b->sampler, h, 2, err);
      skips[(*ns)++] = h;
    }
  }
  return h;
}

static int up(ct_unet *u, ct_unet_tape *tp, int h, int semb, int enc, const int *skips, int *ns,
              ct_err *err) {
  for (int i = 0; h >= 0 && i < u->cfg.nblocks; i++) {
    const ublock *b = &u->up[i];
    for (int j = 0; h >= 0 && j < b->nres; j++) {
      const int s = skips[--(*ns)];
      h = then(tp, h, ut_cat(tp, h, s, err));
      if (h >= 0) ut_drop(tp, s);
      if (h >= 0) h = then(tp, h, res(tp, &b->res[j], h, semb, err));
      if (h >= 0 && b->cross) h = then(tp, h, xf(tp, &b->attn[j], h, enc, err));
    }
    if (h >= 0 && b->has_sampler) h = then(tp, h, ut_up(tp, h, err));
    if (h >= 0 && b->has_sampler) h = then(tp, h, ut_conv(tp, &b->sampler, h, 1, err));
  }
  return h;
}

static ct_status check_inputs(const ct_unet *u, const ct_unet_inputs *in, ct_err *err) {
  const ct_unet_config *c = &u->cfg;
  const int f = 1 << (c->nblocks - 1);
  if (u->swapped || (u->lora && u->lora->swapped))
    return ct_errf(err, CT_ERR_INVALID,
                   "U-net: the parameters are swapped for a host copy (swap them back first)");
  const char *lacks = ct_backend_lacks(u->be, CT_UNET_OPS);
  if (lacks)
    return ct_errf(err, CT_ERR_UNSUPPORTED, "the U-net cannot run on backend %s: it has no %s",
                   u->be->name, lacks);
  if (in->B < 1 || in->H < f || in->W < f || in->H % f || in->W % f)
    return ct_errf(err, CT_ERR_SHAPE,
                   "U-net: latents %dx%d are not a positive multiple of %d (2^(blocks - 1))", in->W,
                   in->H, f);
  if (in->Lk < 1 || !in->sample || !in->timesteps || !in->encoder_hidden_states)
    return ct_errf(err, CT_ERR_INVALID,
                   "U-net: sample, timesteps and encoder_hidden_states (Lk >= 1) are needed");
  if (c->text_time && (!in->text_embeds || !in->time_ids))
    return ct_errf(err, CT_ERR_INVALID,
                   "U-net: addition_embed_type text_time needs text_embeds and time_ids");
  return CT_OK;
}

static int graph(ct_unet *u, ct_unet_tape *tp, const ct_unet_inputs *in, ct_err *err) {
  const ct_unet_config *c = &u->cfg;
  int x = ut_input(tp, in->B, c->in_channels, in->H, in->W, in->sample, err);
  int enc = x >= 0 ? ut_input(tp, in->B, c->cross_attention_dim, in->Lk, 1,
                              in->encoder_hidden_states, err)
                   : -1;
  if (enc < 0) return -1;
  ut_mark(tp, x, enc);
  int semb = embeddings(u, tp, in, err);
  int skips[CT_UNET_MAX_BLOCKS * (UNET_MAX_LAYERS + 1) + 1], ns = 0;
  int h = semb >= 0 ? then(tp, x, ut_conv(tp, &u->conv_in, x, 1, err)) : -1;
  if (h >= 0) h = down(u, tp, h, semb, enc, skips, &ns, err);
  if (h >= 0) h = res(tp, &u->mid_r0, h, semb, err); /* its input is a skip */
  if (h >= 0) h = then(tp, h, xf(tp, &u->mid_attn, h, enc, err));
  if (h >= 0) h = then(tp, h, res(tp, &u->mid_r1, h, semb, err));
  if (h >= 0) h = up(u, tp, h, semb, enc, skips, &ns, err);
  if (h >= 0) h = then(tp, h, ut_gn(tp, &u->norm_out, h, c->norm_num_groups, c->norm_eps, 1, err));
  return h >= 0 ? then(tp, h, ut_conv(tp, &u->conv_out, h, 1, err)) : -1;
}

ct_status ct_unet_forward(ct_unet *u, const ct_unet_inputs *in, float *out, ct_unet_tape **tape,
                          ct_err *err) {
  if (tape) *tape = NULL;
  ct_status st = check_inputs(u, in, err);
  if (st) return st;
  ct_unet_tape *tp = ut_new(u, tape != NULL);
  if (!tp) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  size_t nconst = (size_t)in->H * in->W;
  for (int i = 0; i < u->cfg.nblocks; i++)
    if ((size_t)u->cfg.block_out_channels[i] > nconst)
      nconst = (size_t)u->cfg.block_out_channels[i];
  ct_err le = {0};
  st = ut_constants(tp, nconst, &le);
  int h = st ? -1 : graph(u, tp, in, &le);
  if (h < 0) {
    st = le.status ? le.status : CT_ERR_NOMEM;
    if (!le.msg[0]) ct_errf(&le, st, "out of memory in the U-net's forward");
    if (err) *err = le;
    ct_unet_tape_free(tp);
    return st;
  }
  ut_set_final(tp, h);
  int B, C, H, W;
  ut_shape(tp, h, &B, &C, &H, &W);
  if (out) u->be->copy(out, ut_x(tp, h), (size_t)B * C * H * W * sizeof(float));
  if (tape)
    *tape = tp;
  else
    ct_unet_tape_free(tp);
  return CT_OK;
}

ct_status ct_unet_backward(ct_unet *u, ct_unet_tape *tp, const float *dout, float *dsample,
                           float *dencoder, ct_err *err) {
  if (!tp || ut_owner(tp) != u)
    return ct_errf(err, CT_ERR_INVALID, "ct_unet_backward needs a tape of this U-net's forward");
  if (ut_backend(tp) != u->be)
    return ct_errf(err, CT_ERR_INVALID, "the tape was recorded on another compute backend");
  int in, enc, fin;
  ut_marks(tp, &in, &enc, &fin);
  ct_status st = ut_backward(tp, fin, dout, err);
  int B, C, H, W;
  const int which[2] = {in, enc};
  float *dst[2] = {dsample, dencoder};
  for (int k = 0; !st && k < 2; k++) {
    if (!dst[k]) continue;
    ut_shape(tp, which[k], &B, &C, &H, &W);
    const size_t n = (size_t)B * C * H * W;
    if (ut_g(tp, which[k]))
      u->be->copy(dst[k], ut_g(tp, which[k]), n * sizeof(float));
    else /* no op reads it (no cross-attention block) */
      u->be->zero(n, dst[k]);
  }
  return st;
}

/* MMDiT forward and backward over the flat parameter buffer.
 *
 * The forward computes every block through the model's compute backend
 * (m->be, include/ctuner/backend.h; the CPU one unless ct_mmdit_set_backend
 * says otherwise) and keeps what the backward
 * needs in one activation arena, planned for the batch shape (B, H, W, T) and
 * grown only when a larger shape arrives. The joint sequence of a batch item is
 * [txt; img] (text first). Double blocks keep each stream's rows separately
 * (B*T and B*Li rows) and meet in the joint attention, whose output is split
 * back into the streams; single blocks work on the joint rows (B*Lt).
 * The backward walks the blocks in reverse and accumulates parameter
 * gradients; input gradients of the embeddings (x, txt, y) are not computed.
 * With gradient checkpointing (ct_mmdit_set_checkpointing) a checkpointed
 * block keeps only its output, its other activations share one block's worth
 * of arena, and the backward re-runs its forward (dblock_fwd, sblock_fwd)
 * inside its segment, right before its backward.
 */
#include "ctuner/mmdit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/backend.h"
#include "model/mmdit_int.h"

#define LN_EPS 1e-6f
#define RMS_EPS 1e-6f

static int ckpt(const ct_mmdit *m, int i, int n);

/* ---- parameter views ---- */

/* A parameter's address inside its segment's current storage. */
static float *seg_addr(float *base, const ct_mmdit *m, int s, const ct_param *p) {
  return base ? base + (p->offset - m->seg_off[s]) : NULL;
}

static lin view_lin(ct_mmdit *m, int s, const char *prefix) {
  char n[128];
  lin l;
  memset(&l, 0, sizeof l);
  snprintf(n, sizeof n, "%s.weight", prefix);
  const ct_param *pw = ct_mmdit_find(m, n);
  snprintf(n, sizeof n, "%s.bias", prefix);
  const ct_param *pb = ct_mmdit_find(m, n);
  CT_ASSERT(pw && pb);
  l.w = seg_addr(m->segw[s], m, s, pw);
  l.b = seg_addr(m->segw[s], m, s, pb);
  l.wv = ct_wview_f32(l.w);
  if (m->qv) { /* ct_mmdit_quantize: the stored views (mmdit_quant.c) */
    l.wv = m->qv[pw - m->params];
    l.w = l.wv.dtype == CT_WDT_F32 ? (float *)l.wv.data : NULL;
    l.b = (float *)m->qv[pb - m->params].data;
  }
  l.gw = m->frozen ? NULL : seg_addr(m->segg[s], m, s, pw);
  l.gb = m->frozen ? NULL : seg_addr(m->segg[s], m, s, pb);
  l.out = (int)pw->shape[0];
  l.in = (int)pw->shape[1];
  l.site = m->lora ? ct_lora_site(m->lora, pw->name) : -1;
  l.lora = l.site >= 0 ? m->lora : NULL;
  if (l.lora) ct_lora_bind_base(l.lora, l.site, l.w, l.b); /* DoRA reads the base rows */
  return l;
}

static void view_vec(ct_mmdit *m, int s, const char *name, float **w, float **g) {
  const ct_param *p = ct_mmdit_find(m, name);
  CT_ASSERT(p);
  *w = m->qv ? (float *)m->qv[p - m->params].data : seg_addr(m->segw[s], m, s, p);
  *g = m->frozen ? NULL : seg_addr(m->segg[s], m, s, p);
}

/* Points the views of segment s at m->segw[s] / m->segg[s]. */
static void bind_segment(ct_mmdit *m, int s) {
  const ct_mmdit_config *c = &m->cfg;
  const int D = c->depth_double, S = c->depth_single;
  char n[128];
  if (s == 0) {
    m->img_in = view_lin(m, s, "img_in");
    m->txt_in = view_lin(m, s, "txt_in");
    m->time_in0 = view_lin(m, s, "time_in.in_layer");
    m->time_in1 = view_lin(m, s, "time_in.out_layer");
    m->vec_in0 = view_lin(m, s, "vector_in.in_layer");
    m->vec_in1 = view_lin(m, s, "vector_in.out_layer");
    if (c->guidance_embed) {
      m->g_in0 = view_lin(m, s, "guidance_in.in_layer");
      m->g_in1 = view_lin(m, s, "guidance_in.out_layer");
    }
  } else if (s <= D) {
    static const char *sn[2] = {"img", "txt"};
    const int i = s - 1;
    for (int k = 0; k < 2; k++) {
      dstream_p *p = &m->db[i][k];
      snprintf(n, sizeof n, "double_blocks.%d.%s_mod.lin", i, sn[k]);
      p->mod = view_lin(m, s, n);
      snprintf(n, sizeof n, "double_blocks.%d.%s_attn.qkv", i, sn[k]);
      p->qkv = view_lin(m, s, n);
      snprintf(n, sizeof n, "double_blocks.%d.%s_attn.proj", i, sn[k]);
      p->proj = view_lin(m, s, n);
      snprintf(n, sizeof n, "double_blocks.%d.%s_mlp.0", i, sn[k]);
      p->mlp0 = view_lin(m, s, n);
      snprintf(n, sizeof n, "double_blocks.%d.%s_mlp.2", i, sn[k]);
      p->mlp2 = view_lin(m, s, n);
      snprintf(n, sizeof n, "double_blocks.%d.%s_attn.norm.query_norm.scale", i, sn[k]);
      view_vec(m, s, n, &p->qs, &p->gqs);
      snprintf(n, sizeof n, "double_blocks.%d.%s_attn.norm.key_norm.scale", i, sn[k]);
      view_vec(m, s, n, &p->ks, &p->gks);
    }
  } else if (s <= D + S) {
    const int i = s - 1 - D;
    sblock_p *p = &m->sb[i];
    snprintf(n, sizeof n, "single_blocks.%d.linear1", i);
    p->l1 = view_lin(m, s, n);
    snprintf(n, sizeof n, "single_blocks.%d.linear2", i);
    p->l2 = view_lin(m, s, n);
    snprintf(n, sizeof n, "single_blocks.%d.modulation.lin", i);
    p->mod = view_lin(m, s, n);
    snprintf(n, sizeof n, "single_blocks.%d.norm.query_norm.scale", i);
    view_vec(m, s, n, &p->qs, &p->gqs);
    snprintf(n, sizeof n, "single_blocks.%d.norm.key_norm.scale", i);
    view_vec(m, s, n, &p->ks, &p->gks);
  } else {
    m->final_lin = view_lin(m, s, "final_layer.linear");
    m->final_mod = view_lin(m, s, "final_layer.adaLN_modulation.1");
  }
}

/* Segment of a parameter name: 0 inputs, 1..D double blocks, D+1..D+S single
 * blocks, D+S+1 the final layer. */
static int segment_of(const ct_mmdit_config *c, const char *name) {
  int i;
  if (sscanf(name, "double_blocks.%d.", &i) == 1) return 1 + i;
  if (sscanf(name, "single_blocks.%d.", &i) == 1) return 1 + c->depth_double + i;
  if (!strncmp(name, "final_layer.", 12)) return 1 + c->depth_double + c->depth_single;
  return 0;
}

/* Default storage: the model's own buffers; then rebinds every segment. */
static void bind_views(ct_mmdit *m) {
  for (int s = 0; s < m->nseg; s++) {
    m->segw[s] = m->w ? m->w + m->seg_off[s] : NULL;
    m->segg[s] = m->g ? m->g + m->seg_off[s] : NULL;
    bind_segment(m, s);
  }
}

static ct_status build_segments(ct_mmdit *m, ct_err *err) {
  const ct_mmdit_config *c = &m->cfg;
  m->nseg = 2 + c->depth_double + c->depth_single;
  m->seg_off = calloc((size_t)m->nseg + 1, sizeof *m->seg_off);
  m->segw = calloc((size_t)m->nseg, sizeof *m->segw);
  m->segg = calloc((size_t)m->nseg, sizeof *m->segg);
  if (!m->seg_off || !m->segw || !m->segg) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  int prev = -1;
  for (size_t i = 0; i < m->nparams; i++) {
    int s = segment_of(c, m->params[i].name);
    CT_ASSERT(s >= prev && s < m->nseg); /* the table keeps each segment contiguous */
    while (prev < s) m->seg_off[++prev] = m->params[i].offset;
  }
  CT_ASSERT(prev == m->nseg - 1);
  m->seg_off[m->nseg] = m->numel;
  return CT_OK;
}

/* n zeroed floats of the backend's memory, counted under cat */
static float *be_calloc(const ct_backend_ops *be, ct_mem_cat cat, size_t n) {
  float *p = be->alloc(cat, n * sizeof(float));
  if (p) be->zero(n, p);
  return p;
}

ct_status ct_mmdit_new(const ct_mmdit_config *cfg, uint64_t seed, int flags, ct_mmdit **out,
                       ct_err *err) {
  const int with_grads = (flags & CT_MMDIT_GRADS) != 0, with_params = !(flags & CT_MMDIT_NO_PARAMS);
  ct_status st = CT_OK;
  ct_mmdit *m = calloc(1, sizeof *m);
  if (!m) return ct_errf(err, CT_ERR_NOMEM, "out of memory allocating the model");
  m->cfg = *cfg;
  m->be = ct_backend_default();
  st = ct_mmdit_param_table(cfg, &m->params, &m->nparams, &m->numel, err);
  if (st) goto out;
  if (with_params) m->w = be_calloc(m->be, CT_MEM_PARAMS, m->numel);
  if (with_grads) m->g = be_calloc(m->be, CT_MEM_GRADS, m->numel);
  m->db = calloc((size_t)cfg->depth_double + 1, sizeof *m->db);
  m->sb = calloc((size_t)cfg->depth_single + 1, sizeof *m->sb);
  m->db_a = calloc((size_t)cfg->depth_double + 1, sizeof *m->db_a);
  m->sb_a = calloc((size_t)cfg->depth_single + 1, sizeof *m->sb_a);
  if ((with_params && !m->w) || (with_grads && !m->g) || !m->db || !m->sb || !m->db_a || !m->sb_a) {
    st =
        ct_errf(err, CT_ERR_NOMEM, "out of memory allocating %zu parameters (%.1f MiB%s)", m->numel,
                m->numel * 4.0 / 1048576.0, with_grads ? " and as much for gradients" : "");
    goto out;
  }
  m->own_w = with_params;
  m->own_g = with_grads;
  st = build_segments(m, err);
  if (st) goto out;
  bind_views(m);
  if (m->w) ct_mmdit_init_params(m, seed);
out:
  if (st) {
    ct_mmdit_free(m);
    m = NULL;
  }
  *out = m;
  return st;
}

void ct_mmdit_free(ct_mmdit *m) {
  if (!m) return;
  if (m->own_w) m->be->free(m->w);
  if (m->own_g) m->be->free(m->g);
  m->be->free(m->qbuf);
  free(m->qv);
  m->be->free(m->arena);
  free(m->pos);
  free(m->params);
  free(m->db);
  free(m->sb);
  free(m->db_a);
  free(m->sb_a);
  free(m->seg_off);
  free(m->segw);
  free(m->segg);
  free(m);
}

const ct_mmdit_config *ct_mmdit_cfg(const ct_mmdit *m) {
  return &m->cfg;
}
size_t ct_mmdit_numel(const ct_mmdit *m) {
  return m->numel;
}
float *ct_mmdit_params(ct_mmdit *m) {
  return m->w;
}
float *ct_mmdit_grads(ct_mmdit *m) {
  return m->g;
}
const ct_param *ct_mmdit_table(const ct_mmdit *m, size_t *n) {
  *n = m->nparams;
  return m->params;
}
size_t ct_mmdit_activation_bytes(const ct_mmdit *m) {
  return m->arena_floats * sizeof(float);
}

int ct_mmdit_nsegments(const ct_mmdit *m) {
  return m->nseg;
}
void ct_mmdit_segment(const ct_mmdit *m, int s, size_t *off, size_t *numel) {
  CT_ASSERT(s >= 0 && s < m->nseg);
  *off = m->seg_off[s];
  *numel = m->seg_off[s + 1] - m->seg_off[s];
}

void ct_mmdit_set_hooks(ct_mmdit *m, const ct_mmdit_hooks *h) {
  if (h) {
    m->hooks = *h;
    m->have_hooks = 1;
  } else {
    memset(&m->hooks, 0, sizeof m->hooks);
    m->have_hooks = 0;
    bind_views(m);
  }
}

void ct_mmdit_set_lora(ct_mmdit *m, ct_lora *l) {
  m->lora = l;
  for (int s = 0; s < m->nseg; s++) bind_segment(m, s);
}

void ct_mmdit_set_frozen(ct_mmdit *m, int frozen) {
  m->frozen = frozen != 0;
  for (int s = 0; s < m->nseg; s++) bind_segment(m, s);
}

void ct_mmdit_set_checkpointing(ct_mmdit *m, int every) {
  if (every < 0) every = 0;
  if (every == m->ckpt_every) return;
  m->ckpt_every = every;
  m->be->free(m->arena); /* re-planned (and sized) by the next forward */
  m->arena = NULL;
  m->arena_floats = 0;
  m->have_acts = 0;
}

int ct_mmdit_checkpointing(const ct_mmdit *m, int *ndouble, int *nsingle) {
  const int D = m->cfg.depth_double, S = m->cfg.depth_single;
  int nd = 0, ns = 0;
  for (int i = 0; i < D; i++) nd += ckpt(m, i, D);
  for (int i = 0; i < S; i++) ns += ckpt(m, i, S);
  if (ndouble) *ndouble = nd;
  if (nsingle) *nsingle = ns;
  return m->ckpt_every;
}

const ct_backend_ops *ct_mmdit_backend(const ct_mmdit *m) {
  return m->be;
}

ct_status ct_mmdit_set_backend(ct_mmdit *m, const ct_backend_ops *be, ct_err *err) {
  if (!be) be = ct_backend_default();
  if (be == m->be) return CT_OK;
  const char *lacks = ct_backend_lacks(
      be,
      "linear_fwd linear_bwd attention_fwd attention_bwd rope_table qkv_heads_fwd "
      "qkv_heads_bwd ln_mod_fwd ln_mod_bwd silu_fwd silu_bwd gelu_tanh_fwd gelu_tanh_bwd "
      "gate_res_fwd gate_res_bwd add_inplace copy_2d zero timestep_embedding patchify "
      "unpatchify");
  if (lacks)
    return ct_errf(err, CT_ERR_UNSUPPORTED, "the MMDiT needs %s, which compute backend %s lacks",
                   lacks, be->name);
  lacks = m->qv ? ct_backend_lacks(be, "linear_fwd_w linear_bwd_w") : NULL;
  if (lacks)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "a base stored as bf16 / int8 (base_model_precision) needs %s, which compute "
                   "backend %s lacks",
                   lacks, be->name);
  const size_t bytes = m->numel * sizeof(float);
  ct_status st =
      m->own_w ? ct_backend_move(m->be, be, CT_MEM_PARAMS, bytes, (void **)&m->w, err) : CT_OK;
  if (!st && m->qv) { /* a narrow base: its bytes move, its views follow them */
    char *old = m->qbuf;
    st = ct_backend_move(m->be, be, CT_MEM_PARAMS, m->qbytes, &m->qbuf, err);
    const ptrdiff_t d = (char *)m->qbuf - old;
    for (size_t i = 0; !st && d && i < m->nparams; i++) {
      if (m->qv[i].data) m->qv[i].data = (const char *)m->qv[i].data + d;
      if (m->qv[i].scales) m->qv[i].scales = (const float *)((const char *)m->qv[i].scales + d);
    }
  }
  if (!st && m->own_g) {
    st = ct_backend_move(m->be, be, CT_MEM_GRADS, bytes, (void **)&m->g, err);
    if (st && m->own_w) { /* put the parameters back: the model stays on its backend */
      ct_err ignored = {0};
      ct_status back = ct_backend_move(be, m->be, CT_MEM_PARAMS, bytes, (void **)&m->w, &ignored);
      CT_ASSERT(back == CT_OK);
    }
  }
  if (st) return st;
  m->be->free(m->arena);
  m->arena = NULL;
  m->arena_floats = 0;
  m->have_acts = 0;
  m->be = be;
  bind_views(m);
  return CT_OK;
}

float *ct_mmdit_swap_params(ct_mmdit *m, float *w) {
  float *old = m->w;
  m->w = w;
  bind_views(m);
  return old;
}

void ct_mmdit_use_params(ct_mmdit *m, float *w) {
  if (m->own_w) m->be->free(m->w);
  m->w = w;
  m->own_w = 0;
  bind_views(m);
}

void ct_mmdit_use_grads(ct_mmdit *m, float *g) {
  if (m->own_g) m->be->free(m->g);
  m->g = g;
  m->own_g = 0;
  bind_views(m);
}

/* Before segment s runs: the hook may supply its storage; rebinds when it moved. */
static ct_status seg_enter(ct_mmdit *m, int s, int backward, ct_err *err) {
  float *w = NULL, *g = NULL;
  if (m->have_hooks && m->hooks.enter) {
    ct_status st = m->hooks.enter(m->hooks.user, s, backward, &w, &g, err);
    if (st) return st;
  }
  if (m->qv) return CT_OK; /* a frozen base in its stored dtype: the views never move */
  if (!w) w = m->w ? m->w + m->seg_off[s] : NULL;
  if (!g) g = m->g ? m->g + m->seg_off[s] : NULL;
  if (!w)
    return ct_errf(err, CT_ERR_INVALID,
                   "segment %d has no parameters (sharded model without hooks)", s);
  if (backward && !g && !m->frozen)
    return ct_errf(err, CT_ERR_INVALID, "backward on a model created without gradients");
  if (w != m->segw[s] || (backward && g != m->segg[s])) {
    m->segw[s] = w;
    if (backward) m->segg[s] = g;
    bind_segment(m, s);
  }
  return CT_OK;
}

static ct_status seg_leave(ct_mmdit *m, int s, int backward, ct_err *err) {
  if (m->have_hooks && m->hooks.leave) return m->hooks.leave(m->hooks.user, s, backward, err);
  return CT_OK;
}

/* ---- activation arena ---- */

typedef struct bump {
  float *base;
  size_t off;
} bump;

static float *take(bump *b, size_t n) {
  float *p = b->base ? b->base + b->off : NULL;
  b->off += (n + 15) & ~(size_t)15;
  return p;
}

/* Whether block i of a list of n blocks (double or single) is checkpointed:
 * every ckpt_every-th from 0, as diffusers' index % interval == 0. Such a
 * block keeps only its output (the next block's input) and is recomputed in
 * the backward; a list where that would be one block only runs plain (one
 * block's worth of shared arena saves nothing over its own activations). */
static int ckpt(const ct_mmdit *m, int i, int n) {
  const int e = m->ckpt_every;
  return e > 0 && (n + e - 1) / e >= 2 && i % e == 0;
}

/* One double block's activations. */
static void plan_dblock(bump *b, dblock_a *x, size_t Bz, size_t Ni, size_t Nt, size_t N, size_t d,
                        size_t mh, size_t nh) {
  for (int s = 0; s < 2; s++) {
    dstream_a *y = &x->s[s];
    size_t Ns = s == 0 ? Ni : Nt;
    y->mod = take(b, Bz * 6 * d);
    y->xhat1 = take(b, Ns * d);
    y->rstd1 = take(b, Ns);
    y->h1 = take(b, Ns * d);
    y->qkv = take(b, Ns * 3 * d);
    y->rq = take(b, Ns * nh);
    y->rk = take(b, Ns * nh);
    y->os = take(b, Ns * d);
    y->pr = take(b, Ns * d);
    y->x1 = take(b, Ns * d);
    y->xhat2 = take(b, Ns * d);
    y->rstd2 = take(b, Ns);
    y->h2 = take(b, Ns * d);
    y->u = take(b, Ns * mh);
    y->gu = take(b, Ns * mh);
    y->m = take(b, Ns * d);
    y->x2 = take(b, Ns * d);
  }
  x->q = take(b, N * d);
  x->k = take(b, N * d);
  x->v = take(b, N * d);
  x->o = take(b, N * d);
  x->lse = take(b, N * nh);
}

/* One single block's activations. */
static void plan_sblock(bump *b, sblock_a *x, size_t Bz, size_t N, size_t d, size_t mh, size_t nh) {
  x->mod = take(b, Bz * 3 * d);
  x->xhat = take(b, N * d);
  x->rstd = take(b, N);
  x->h = take(b, N * d);
  x->qkv = take(b, N * 3 * d);
  x->u = take(b, N * mh);
  x->rq = take(b, N * nh);
  x->rk = take(b, N * nh);
  x->q = take(b, N * d);
  x->k = take(b, N * d);
  x->v = take(b, N * d);
  x->o = take(b, N * d);
  x->lse = take(b, N * nh);
  x->cat = take(b, N * (d + mh));
  x->l2 = take(b, N * d);
  x->xout = take(b, N * d);
}

/* Lay out every activation for the shape; with base == NULL only counts. */
static size_t plan(ct_mmdit *m, float *base, int B, int H, int W, int Lr, int T) {
  const ct_mmdit_config *c = &m->cfg;
  acts *a = &m->a;
  bump b = {base, 0};
  size_t d = (size_t)c->hidden, P = (size_t)c->in_channels * 4, mh = (size_t)c->mlp_ratio * d;
  size_t hd = d / (size_t)c->heads, nh = (size_t)c->heads;
  size_t Li = (size_t)(H / 2) * (size_t)(W / 2) + (size_t)Lr, Lt = Li + (size_t)T;
  size_t Ni = (size_t)B * Li, Nt = (size_t)B * (size_t)T, N = (size_t)B * Lt, Bz = (size_t)B;
  a->B = B;
  a->H = H;
  a->W = W;
  a->T = T;
  a->Li = (int)Li;
  a->Lr = Lr;
  a->Lt = (int)Lt;
  a->img_p = take(&b, Ni * P);
  a->temb = take(&b, Bz * 256);
  a->t_h = take(&b, Bz * d);
  a->t_hs = take(&b, Bz * d);
  a->y_h = take(&b, Bz * d);
  a->y_hs = take(&b, Bz * d);
  a->g_emb = take(&b, Bz * 256);
  a->g_h = take(&b, Bz * d);
  a->g_hs = take(&b, Bz * d);
  a->vec = take(&b, Bz * d);
  a->svec = take(&b, Bz * d);
  a->tmpv = take(&b, Bz * d);
  a->img0 = take(&b, Ni * d);
  a->txt0 = take(&b, Nt * d);
  a->pe = take(&b, Lt * hd);
  a->db = m->db_a;
  a->sb = m->sb_a;
  /* A checkpointed block keeps only its output (the next block's input); its
   * other activations share one block's worth (db_rc, sb_rc), refilled by the
   * backward's recompute. */
  if (ckpt(m, 0, c->depth_double)) plan_dblock(&b, &a->db_rc, Bz, Ni, Nt, N, d, mh, nh);
  for (int i = 0; i < c->depth_double; i++) {
    dblock_a *x = &m->db_a[i];
    if (ckpt(m, i, c->depth_double)) {
      *x = a->db_rc;
      x->s[0].x2 = take(&b, Ni * d);
      x->s[1].x2 = take(&b, Nt * d);
    } else {
      plan_dblock(&b, x, Bz, Ni, Nt, N, d, mh, nh);
    }
  }
  a->db_rc_of = a->sb_rc_of = -1;
  a->xj0 = take(&b, N * d);
  if (ckpt(m, 0, c->depth_single)) plan_sblock(&b, &a->sb_rc, Bz, N, d, mh, nh);
  for (int i = 0; i < c->depth_single; i++) {
    sblock_a *x = &m->sb_a[i];
    if (ckpt(m, i, c->depth_single)) {
      *x = a->sb_rc;
      x->xout = take(&b, N * d);
    } else {
      plan_sblock(&b, x, Bz, N, d, mh, nh);
    }
  }
  a->xf = take(&b, Ni * d);
  a->xhatf = take(&b, Ni * d);
  a->rstdf = take(&b, Ni);
  a->hf = take(&b, Ni * d);
  a->modf = take(&b, Bz * 2 * d);
  a->outp = take(&b, Ni * P);
  /* backward scratch */
  a->dimg = take(&b, Ni * d);
  a->dtxt = take(&b, Nt * d);
  a->dj = take(&b, N * d);
  a->dh = take(&b, N * d);
  a->dqkv = take(&b, N * 3 * d);
  a->dq = take(&b, N * d);
  a->dk = take(&b, N * d);
  a->dv = take(&b, N * d);
  a->dO = take(&b, N * d);
  a->du = take(&b, N * mh);
  a->dcat = take(&b, N * (d + mh));
  a->dtmp = take(&b, N * d);
  a->dmod = take(&b, 2 * Bz * 6 * d);
  a->dsvec = take(&b, Bz * d);
  a->dvec = take(&b, Bz * d);
  a->dbv = take(&b, Bz * d);
  a->dbv2 = take(&b, Bz * d);
  a->doutp = take(&b, Ni * P);
  return b.off;
}

size_t ct_mmdit_max_segment(const ct_mmdit_config *cfg, const ct_param *tab, size_t n,
                            size_t numel) {
  size_t best = 0, start = 0;
  int cur = -1;
  for (size_t i = 0; i < n; i++) {
    int s = segment_of(cfg, tab[i].name);
    if (s == cur) continue;
    if (cur >= 0 && tab[i].offset - start > best) best = tab[i].offset - start;
    start = tab[i].offset;
    cur = s;
  }
  if (cur >= 0 && numel - start > best) best = numel - start;
  return best;
}

size_t ct_mmdit_activation_plan(const ct_mmdit_config *cfg, int every, int B, int H, int W, int T) {
  ct_mmdit *m = calloc(1, sizeof *m);
  if (!m) return 0;
  m->cfg = *cfg;
  m->ckpt_every = every > 0 ? every : 0;
  m->db_a = calloc((size_t)cfg->depth_double + 1, sizeof *m->db_a);
  m->sb_a = calloc((size_t)cfg->depth_single + 1, sizeof *m->sb_a);
  size_t n = m->db_a && m->sb_a ? plan(m, NULL, B, H, W, 0, T) : 0; /* counts only */
  free(m->db_a);
  free(m->sb_a);
  free(m);
  return n * sizeof(float);
}

static ct_status reserve(ct_mmdit *m, int B, int H, int W, int Lr, int T, ct_err *err) {
  size_t need = plan(m, NULL, B, H, W, Lr, T);
  size_t Lt = (size_t)(H / 2) * (size_t)(W / 2) + (size_t)Lr + (size_t)T;
  if (need > m->arena_floats) {
    m->be->free(m->arena);
    m->arena = m->be->alloc(CT_MEM_ACTIVATIONS, need * sizeof(float));
    m->arena_floats = m->arena ? need : 0;
    if (!m->arena)
      return ct_errf(
          err, CT_ERR_NOMEM,
          "out of memory for activations (%.1f MiB for batch %d, latent %dx%d, %d text tokens)",
          need * 4.0 / 1048576.0, B, H, W, T);
  }
  free(m->pos);
  m->pos = malloc(Lt * 3 * sizeof(int));
  if (!m->pos) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  plan(m, m->arena, B, H, W, Lr, T);
  m->a.pos = m->pos;
  return CT_OK;
}

/* Copy rows [off, off+Ls) of each batch item of a joint (B, Lt, d) buffer into a
 * stream buffer (B*Ls, d), or back (to_joint). */
static void rows_copy(const ct_backend_ops *be, int B, int Ls, int Lt, int off, int d, float *joint,
                      float *stream, int to_joint) {
  for (int b = 0; b < B; b++) {
    float *j = joint + ((size_t)b * Lt + off) * d, *s = stream + (size_t)b * Ls * d;
    if (to_joint)
      be->copy_2d(Ls, d, s, d, j, d);
    else
      be->copy_2d(Ls, d, j, d, s, d);
  }
}

/* A linear layer, plus its LoRA adapters when it has any. */
static void lin_fwd(const ct_backend_ops *be, const lin *l, int N, const float *x, int ldx,
                    float *y, int ldy) {
  if (l->wv.dtype != CT_WDT_F32)
    be->linear_fwd_w(N, l->in, l->out, x, ldx, &l->wv, l->b, y, ldy);
  else
    be->linear_fwd(N, l->in, l->out, x, ldx, l->w, l->b, y, ldy);
  if (l->lora) ct_lora_fwd(l->lora, be, l->site, 0, l->out, N, x, ldx, y, ldy);
}

static void lin_bwd(const ct_backend_ops *be, const lin *l, int N, const float *x, int ldx,
                    const float *dy, int lddy, float *dx, int lddx, float beta) {
  if (l->wv.dtype != CT_WDT_F32)
    be->linear_bwd_w(N, l->in, l->out, x, ldx, &l->wv, dy, lddy, dx, lddx, beta, l->gw, l->gb);
  else
    be->linear_bwd(N, l->in, l->out, x, ldx, l->w, dy, lddy, dx, lddx, beta, l->gw, l->gb);
  if (l->lora) ct_lora_bwd(l->lora, be, l->site, 0, l->out, N, x, ldx, dy, lddy, dx, lddx);
}

/* Rows [r0, r0 + rows) of a linear layer without its adapters (linear1's qkv
 * and mlp halves): dx = beta * dx + dy W[r0:], gradients into the same rows. */
static void lin_rows_fwd(const ct_backend_ops *be, const lin *l, int r0, int rows, int N,
                         const float *x, int ldx, float *y, int ldy) {
  if (l->wv.dtype != CT_WDT_F32) {
    const ct_wview v = ct_wview_rows(l->wv, r0, l->in);
    be->linear_fwd_w(N, l->in, rows, x, ldx, &v, l->b + r0, y, ldy);
  } else {
    be->linear_fwd(N, l->in, rows, x, ldx, l->w + (size_t)r0 * l->in, l->b + r0, y, ldy);
  }
}

static void lin_rows_bwd(const ct_backend_ops *be, const lin *l, int r0, int rows, int N,
                         const float *x, int ldx, const float *dy, int lddy, float *dx, int lddx,
                         float beta) {
  float *gw = l->gw ? l->gw + (size_t)r0 * l->in : NULL, *gb = l->gb ? l->gb + r0 : NULL;
  if (l->wv.dtype != CT_WDT_F32) {
    const ct_wview v = ct_wview_rows(l->wv, r0, l->in);
    be->linear_bwd_w(N, l->in, rows, x, ldx, &v, dy, lddy, dx, lddx, beta, gw, gb);
  } else {
    be->linear_bwd(N, l->in, rows, x, ldx, l->w + (size_t)r0 * l->in, dy, lddy, dx, lddx, beta, gw,
                   gb);
  }
}

/* Shapes every block helper needs, from the planned batch. */
typedef struct dims {
  int B, T, Li, Lt, d, nh, hd, mh, N;
  float ascale;
} dims;

static dims dims_of(const ct_mmdit *m) {
  const acts *a = &m->a;
  dims z;
  z.B = a->B;
  z.T = a->T;
  z.Li = a->Li;
  z.Lt = a->Lt;
  z.d = m->cfg.hidden;
  z.nh = m->cfg.heads;
  z.hd = z.d / z.nh;
  z.mh = m->cfg.mlp_ratio * z.d;
  z.N = z.B * z.Lt;
  z.ascale = 1.0f / sqrtf((float)z.hd);
  return z;
}

/* Double block i's forward from its inputs (B*Li, d) and (B*T, d); the
 * backward's recompute of a checkpointed block runs it again, unchanged. */
static void dblock_fwd(ct_mmdit *m, int i, const float *ximg, const float *xtxt) {
  const ct_backend_ops *be = m->be;
  acts *a = &m->a;
  dblock_a *ba = &a->db[i];
  const dims z = dims_of(m);
  const int B = z.B, T = z.T, Li = z.Li, Lt = z.Lt, d = z.d, nh = z.nh, hd = z.hd, mh = z.mh;
  const float ascale = z.ascale;
  if (ckpt(m, i, m->cfg.depth_double)) a->db_rc_of = i;
  for (int s = 0; s < 2; s++) {
    dstream_p *p = &m->db[i][s];
    dstream_a *x = &ba->s[s];
    int Ls = s == 0 ? Li : T, off = s == 0 ? T : 0;
    x->xin = s == 0 ? ximg : xtxt;
    lin_fwd(be, &p->mod, B, a->svec, d, x->mod, 6 * d);
    be->ln_mod_fwd(B, Ls, d, x->xin, d, x->mod, x->mod + d, 6 * d, LN_EPS, x->xhat1, x->rstd1,
                   x->h1, d);
    lin_fwd(be, &p->qkv, B * Ls, x->h1, d, x->qkv, 3 * d);
    be->qkv_heads_fwd(B, Ls, Lt, off, nh, hd, x->qkv, p->qs, p->ks, a->pe, ba->q, ba->k, ba->v,
                      x->rq, x->rk);
  }
  be->attention_fwd(B, nh, Lt, hd, ascale, 0, ba->q, ba->k, ba->v, ba->o, ba->lse);
  for (int s = 0; s < 2; s++) {
    dstream_p *p = &m->db[i][s];
    dstream_a *x = &ba->s[s];
    int Ls = s == 0 ? Li : T, off = s == 0 ? T : 0, Ns = B * Ls;
    rows_copy(be, B, Ls, Lt, off, d, ba->o, x->os, 0);
    lin_fwd(be, &p->proj, Ns, x->os, d, x->pr, d);
    be->gate_res_fwd(B, Ls, d, x->xin, d, x->mod + 2 * d, 6 * d, x->pr, d, x->x1, d);
    be->ln_mod_fwd(B, Ls, d, x->x1, d, x->mod + 3 * d, x->mod + 4 * d, 6 * d, LN_EPS, x->xhat2,
                   x->rstd2, x->h2, d);
    lin_fwd(be, &p->mlp0, Ns, x->h2, d, x->u, mh);
    be->gelu_tanh_fwd(Ns, mh, x->u, mh, x->gu, mh);
    lin_fwd(be, &p->mlp2, Ns, x->gu, mh, x->m, d);
    be->gate_res_fwd(B, Ls, d, x->x1, d, x->mod + 5 * d, 6 * d, x->m, d, x->x2, d);
  }
}

/* Single block i's forward from its joint input (B*Lt, d); recomputed like dblock_fwd. */
static void sblock_fwd(ct_mmdit *m, int i, const float *xj) {
  const ct_backend_ops *be = m->be;
  acts *a = &m->a;
  sblock_p *p = &m->sb[i];
  sblock_a *x = &a->sb[i];
  const dims z = dims_of(m);
  const int B = z.B, Lt = z.Lt, d = z.d, nh = z.nh, hd = z.hd, mh = z.mh, N = z.N;
  const float ascale = z.ascale;
  if (ckpt(m, i, m->cfg.depth_single)) a->sb_rc_of = i;
  x->xin = xj;
  lin_fwd(be, &p->mod, B, a->svec, d, x->mod, 3 * d);
  be->ln_mod_fwd(B, Lt, d, x->xin, d, x->mod, x->mod + d, 3 * d, LN_EPS, x->xhat, x->rstd, x->h, d);
  /* linear1 as two GEMMs over the row blocks of its weight: qkv (3d) and mlp (mh). */
  lin_rows_fwd(be, &p->l1, 0, 3 * d, N, x->h, d, x->qkv, 3 * d);
  lin_rows_fwd(be, &p->l1, 3 * d, mh, N, x->h, d, x->u, mh);
  if (p->l1.lora) { /* adapters on q, k, v (rows 0..3d) and proj_mlp (3d..3d+mh) */
    ct_lora_fwd(p->l1.lora, be, p->l1.site, 0, 3 * d, N, x->h, d, x->qkv, 3 * d);
    ct_lora_fwd(p->l1.lora, be, p->l1.site, 3 * d, 3 * d + mh, N, x->h, d, x->u, mh);
  }
  be->qkv_heads_fwd(B, Lt, Lt, 0, nh, hd, x->qkv, p->qs, p->ks, a->pe, x->q, x->k, x->v, x->rq,
                    x->rk);
  be->attention_fwd(B, nh, Lt, hd, ascale, 0, x->q, x->k, x->v, x->o, x->lse);
  /* cat = [attn, gelu(mlp)] feeds linear2 in one GEMM */
  be->copy_2d(N, d, x->o, d, x->cat, d + mh);
  be->gelu_tanh_fwd(N, mh, x->u, mh, x->cat + d, d + mh);
  lin_fwd(be, &p->l2, N, x->cat, d + mh, x->l2, d);
  be->gate_res_fwd(B, Lt, d, x->xin, d, x->mod + 2 * d, 3 * d, x->l2, d, x->xout, d);
}

/* The image stream's tokens (B*Li, P) from x (B, C, H, W): without reference
 * tokens FluxPipeline's packing; with them (Kontext) each item's Li - Lr
 * target tokens followed by its reference latent's Lr (zeros when ref is NULL:
 * the backward's dL/dv, which has no reference part). */
static void img_tokens(const ct_backend_ops *be, const acts *a, int C, const float *x,
                       const float *ref, int RH, int RW, float *out) {
  const int B = a->B, H = a->H, W = a->W, Li = a->Li, Lr = a->Lr, P = 4 * C;
  if (!Lr) {
    be->patchify(B, C, H, W, 2, x, out);
    return;
  }
  for (int b = 0; b < B; b++) {
    float *o = out + (size_t)b * Li * P;
    be->patchify(1, C, H, W, 2, x + (size_t)b * C * H * W, o);
    o += (size_t)(Li - Lr) * P;
    if (ref)
      be->patchify(1, C, RH, RW, 2, ref + (size_t)b * C * RH * RW, o);
    else
      be->zero((size_t)Lr * P, o);
  }
}

ct_status ct_mmdit_forward(ct_mmdit *m, const ct_mmdit_batch *in, float *v, ct_err *err) {
  return ct_mmdit_forward_ref(m, in, NULL, 0, 0, v, err);
}

ct_status ct_mmdit_forward_ref(ct_mmdit *m, const ct_mmdit_batch *in, const float *ref, int RH,
                               int RW, float *v, ct_err *err) {
  const ct_mmdit_config *c = &m->cfg;
  const ct_backend_ops *be = m->be;
  ct_status st = CT_OK;
  if (in->B < 1 || in->T < 0 || in->H < 2 || in->W < 2 || in->H % 2 || in->W % 2)
    return ct_errf(err, CT_ERR_SHAPE,
                   "batch shape B=%d, latent %dx%d, T=%d: need B >= 1 and an even latent size",
                   in->B, in->H, in->W, in->T);
  if (c->guidance_embed && !in->guidance)
    return ct_errf(err, CT_ERR_INVALID,
                   "this model embeds guidance (guidance_embed) but no guidance was given");
  if (ref && (RH < 2 || RW < 2 || RH % 2 || RW % 2))
    return ct_errf(err, CT_ERR_SHAPE, "reference latent %dx%d: need an even size of at least 2", RH,
                   RW);
  const int Lr = ref ? (RH / 2) * (RW / 2) : 0;
  st = reserve(m, in->B, in->H, in->W, Lr, in->T, err);
  if (st) return st;
  acts *a = &m->a;
  const int B = in->B, T = in->T, Li = a->Li, Lt = a->Lt, d = c->hidden;
  const int C = c->in_channels, P = C * 4;
  const int Ni = B * Li, Nt = B * T, gw = in->W / 2;

  const int D = c->depth_double, S = c->depth_single, last = D + S + 1;
  a->in_txt = in->txt;
  a->in_y = in->y;
  if ((st = seg_enter(m, 0, 0, err))) return st;
  img_tokens(be, a, C, in->x, ref, RH, RW, a->img_p);
  /* vec = time_in(temb(t)) + vector_in(y) [+ guidance_in(temb(g))] */
  be->timestep_embedding(B, in->t, 256, 10000.f, 1000.f, a->temb);
  lin_fwd(be, &m->time_in0, B, a->temb, 256, a->t_h, d);
  be->silu_fwd(B, d, a->t_h, d, a->t_hs, d);
  lin_fwd(be, &m->time_in1, B, a->t_hs, d, a->vec, d);
  lin_fwd(be, &m->vec_in0, B, in->y, c->vec_in_dim, a->y_h, d);
  be->silu_fwd(B, d, a->y_h, d, a->y_hs, d);
  lin_fwd(be, &m->vec_in1, B, a->y_hs, d, a->tmpv, d);
  be->add_inplace((size_t)B * d, a->vec, a->tmpv);
  if (c->guidance_embed) {
    be->timestep_embedding(B, in->guidance, 256, 10000.f, 1000.f, a->g_emb);
    lin_fwd(be, &m->g_in0, B, a->g_emb, 256, a->g_h, d);
    be->silu_fwd(B, d, a->g_h, d, a->g_hs, d);
    lin_fwd(be, &m->g_in1, B, a->g_hs, d, a->tmpv, d);
    be->add_inplace((size_t)B * d, a->vec, a->tmpv);
  }
  be->silu_fwd(B, d, a->vec, d, a->svec, d);
  lin_fwd(be, &m->img_in, Ni, a->img_p, P, a->img0, d);
  lin_fwd(be, &m->txt_in, Nt, in->txt, c->context_in_dim, a->txt0, d);
  if ((st = seg_leave(m, 0, 0, err))) return st;

  /* RoPE table of the joint sequence: text (0,0,0), image (0, row, col);
   * Kontext's reference tokens after the image's: (1, row, col) of their own
   * grid (diffusers' pipeline_flux_kontext.py prepare_latents, image_ids[..., 0] = 1). */
  const int Lx = Li - Lr, rw = Lr ? RW / 2 : 1;
  for (int l = 0; l < Lt; l++) {
    int *p = a->pos + 3 * l, r = l - T - Lx;
    p[0] = r >= 0 ? 1 : 0;
    p[1] = l < T ? 0 : r >= 0 ? r / rw : (l - T) / gw;
    p[2] = l < T ? 0 : r >= 0 ? r % rw : (l - T) % gw;
  }
  be->rope_table(Lt, a->pos, c->axes_dim, c->theta, a->pe);

  const float *ximg = a->img0, *xtxt = a->txt0;
  for (int i = 0; i < c->depth_double; i++) {
    dblock_a *ba = &a->db[i];
    if ((st = seg_enter(m, 1 + i, 0, err))) return st;
    dblock_fwd(m, i, ximg, xtxt);
    ximg = ba->s[0].x2;
    xtxt = ba->s[1].x2;
    if ((st = seg_leave(m, 1 + i, 0, err))) return st;
  }

  if (c->depth_single > 0) {
    rows_copy(be, B, T, Lt, 0, d, a->xj0, (float *)xtxt, 1);
    rows_copy(be, B, Li, Lt, T, d, a->xj0, (float *)ximg, 1);
    const float *xj = a->xj0;
    for (int i = 0; i < c->depth_single; i++) {
      sblock_a *x = &a->sb[i];
      if ((st = seg_enter(m, 1 + D + i, 0, err))) return st;
      sblock_fwd(m, i, xj);
      xj = x->xout;
      if ((st = seg_leave(m, 1 + D + i, 0, err))) return st;
    }
    rows_copy(be, B, Li, Lt, T, d, (float *)xj, a->xf, 0);
  } else {
    be->copy(a->xf, ximg, (size_t)Ni * d * sizeof(float));
  }

  if ((st = seg_enter(m, last, 0, err))) return st;
  lin_fwd(be, &m->final_mod, B, a->svec, d, a->modf, 2 * d);
  be->ln_mod_fwd(B, Li, d, a->xf, d, a->modf, a->modf + d, 2 * d, LN_EPS, a->xhatf, a->rstdf, a->hf,
                 d);
  lin_fwd(be, &m->final_lin, Ni, a->hf, d, a->outp, P);
  if ((st = seg_leave(m, last, 0, err))) return st;
  if (Lr) /* the prediction of the target tokens only (diffusers slices it) */
    for (int b = 0; b < B; b++)
      be->unpatchify(1, C, in->H, in->W, 2, a->outp + (size_t)b * Li * P,
                     v + (size_t)b * C * in->H * in->W);
  else
    be->unpatchify(B, C, in->H, in->W, 2, a->outp, v);
  m->have_acts = 1;
  return CT_OK;
}

ct_status ct_mmdit_backward(ct_mmdit *m, const float *dv, ct_err *err) {
  const ct_mmdit_config *c = &m->cfg;
  const ct_backend_ops *be = m->be;
  if (!m->have_acts) return ct_errf(err, CT_ERR_INVALID, "backward called before forward");
  acts *a = &m->a;
  const int B = a->B, T = a->T, Li = a->Li, Lt = a->Lt, d = c->hidden, nh = c->heads, hd = d / nh;
  const int mh = c->mlp_ratio * d, C = c->in_channels, P = C * 4;
  const int Ni = B * Li, Nt = B * T, N = B * Lt;
  const float ascale = 1.0f / sqrtf((float)hd);
  const int D = c->depth_double, S = c->depth_single, last = D + S + 1;
  /* frozen with adapters: no segment below the first adapted one needs a gradient */
  const int lo = m->frozen && m->lora ? ct_lora_first_mmdit_segment(m->lora) : 0;
  ct_status st;

  be->zero((size_t)B * d, a->dsvec);
  /* final layer */
  if ((st = seg_enter(m, last, 1, err))) return st;
  img_tokens(be, a, C, dv, NULL, 0, 0, a->doutp); /* reference tokens: no loss, 0 */
  lin_bwd(be, &m->final_lin, Ni, a->hf, d, a->doutp, P, a->dh, d, 0.0f);
  be->zero((size_t)B * 2 * d, a->dmod);
  be->zero((size_t)Ni * d, a->dimg);
  be->ln_mod_bwd(B, Li, d, a->xhatf, a->rstdf, a->modf + d, 2 * d, a->dh, d, a->dimg, d, a->dmod,
                 a->dmod + d);
  lin_bwd(be, &m->final_mod, B, a->svec, d, a->dmod, 2 * d, a->dsvec, d, 1.0f);
  if ((st = seg_leave(m, last, 1, err))) return st;

  if (c->depth_single > 0) {
    be->zero((size_t)N * d, a->dj);
    rows_copy(be, B, Li, Lt, T, d, a->dj, a->dimg, 1);
    for (int i = c->depth_single - 1; i >= 0; i--) {
      if (1 + D + i < lo) return CT_OK;
      sblock_p *p = &m->sb[i];
      sblock_a *x = &a->sb[i];
      if ((st = seg_enter(m, 1 + D + i, 1, err))) return st;
      /* recompute, its weights present; the last checkpointed block's are still there */
      if (ckpt(m, i, S) && a->sb_rc_of != i) sblock_fwd(m, i, x->xin);
      be->zero((size_t)B * 3 * d, a->dmod);
      /* xout = xin + gate * l2: dl2 = gate * dj, dgate; dj itself flows on to xin */
      be->gate_res_bwd(B, Lt, d, x->mod + 2 * d, 3 * d, x->l2, d, a->dj, d, a->dtmp, d,
                       a->dmod + 2 * d);
      lin_bwd(be, &p->l2, N, x->cat, d + mh, a->dtmp, d, a->dcat, d + mh, 0.0f);
      be->copy_2d(N, d, a->dcat, d + mh, a->dO, d);
      be->gelu_tanh_bwd(N, mh, x->u, mh, a->dcat + d, d + mh, a->du, mh);
      be->attention_bwd(B, nh, Lt, hd, ascale, 0, x->q, x->k, x->v, x->o, x->lse, a->dO, a->dq,
                        a->dk, a->dv);
      be->qkv_heads_bwd(B, Lt, Lt, 0, nh, hd, x->qkv, p->qs, p->ks, a->pe, x->rq, x->rk, a->dq,
                        a->dk, a->dv, a->dqkv, p->gqs, p->gks);
      lin_rows_bwd(be, &p->l1, 0, 3 * d, N, x->h, d, a->dqkv, 3 * d, a->dh, d, 0.0f);
      lin_rows_bwd(be, &p->l1, 3 * d, mh, N, x->h, d, a->du, mh, a->dh, d, 1.0f);
      if (p->l1.lora) {
        ct_lora_bwd(p->l1.lora, be, p->l1.site, 0, 3 * d, N, x->h, d, a->dqkv, 3 * d, a->dh, d);
        ct_lora_bwd(p->l1.lora, be, p->l1.site, 3 * d, 3 * d + mh, N, x->h, d, a->du, mh, a->dh, d);
      }
      be->ln_mod_bwd(B, Lt, d, x->xhat, x->rstd, x->mod + d, 3 * d, a->dh, d, a->dj, d, a->dmod,
                     a->dmod + d);
      lin_bwd(be, &p->mod, B, a->svec, d, a->dmod, 3 * d, a->dsvec, d, 1.0f);
      if ((st = seg_leave(m, 1 + D + i, 1, err))) return st;
    }
    rows_copy(be, B, Li, Lt, T, d, a->dj, a->dimg, 0);
    rows_copy(be, B, T, Lt, 0, d, a->dj, a->dtxt, 0);
  } else {
    be->zero((size_t)Nt * d, a->dtxt);
  }

  for (int i = c->depth_double - 1; i >= 0; i--) {
    if (1 + i < lo) return CT_OK;
    dblock_a *ba = &a->db[i];
    if ((st = seg_enter(m, 1 + i, 1, err))) return st;
    if (ckpt(m, i, D) && a->db_rc_of != i) dblock_fwd(m, i, ba->s[0].xin, ba->s[1].xin);
    /* Each stream's modulation gradient (B, 6d) is complete only after the
     * attention backward (shift1/scale1), so both are kept until then. */
    be->zero((size_t)2 * B * 6 * d, a->dmod);
    for (int s = 0; s < 2; s++) {
      dstream_p *p = &m->db[i][s];
      dstream_a *x = &ba->s[s];
      int Ls = s == 0 ? Li : T, off = s == 0 ? T : 0, Ns = B * Ls;
      float *dx = s == 0 ? a->dimg : a->dtxt;
      float *dmod = a->dmod + (size_t)s * B * 6 * d;
      /* x2 = x1 + gate2 * mlp(...) */
      be->gate_res_bwd(B, Ls, d, x->mod + 5 * d, 6 * d, x->m, d, dx, d, a->dtmp, d, dmod + 5 * d);
      lin_bwd(be, &p->mlp2, Ns, x->gu, mh, a->dtmp, d, a->dcat, mh, 0.0f);
      be->gelu_tanh_bwd(Ns, mh, x->u, mh, a->dcat, mh, a->du, mh);
      lin_bwd(be, &p->mlp0, Ns, x->h2, d, a->du, mh, a->dh, d, 0.0f);
      be->ln_mod_bwd(B, Ls, d, x->xhat2, x->rstd2, x->mod + 4 * d, 6 * d, a->dh, d, dx, d,
                     dmod + 3 * d, dmod + 4 * d);
      /* x1 = xin + gate1 * proj(attn) */
      be->gate_res_bwd(B, Ls, d, x->mod + 2 * d, 6 * d, x->pr, d, dx, d, a->dtmp, d, dmod + 2 * d);
      lin_bwd(be, &p->proj, Ns, x->os, d, a->dtmp, d, a->dh, d, 0.0f);
      rows_copy(be, B, Ls, Lt, off, d, a->dO, a->dh, 1);
    }
    be->attention_bwd(B, nh, Lt, hd, ascale, 0, ba->q, ba->k, ba->v, ba->o, ba->lse, a->dO, a->dq,
                      a->dk, a->dv);
    for (int s = 0; s < 2; s++) {
      dstream_p *p = &m->db[i][s];
      dstream_a *x = &ba->s[s];
      int Ls = s == 0 ? Li : T, off = s == 0 ? T : 0, Ns = B * Ls;
      float *dx = s == 0 ? a->dimg : a->dtxt;
      float *dmod = a->dmod + (size_t)s * B * 6 * d;
      be->qkv_heads_bwd(B, Ls, Lt, off, nh, hd, x->qkv, p->qs, p->ks, a->pe, x->rq, x->rk, a->dq,
                        a->dk, a->dv, a->dqkv, p->gqs, p->gks);
      lin_bwd(be, &p->qkv, Ns, x->h1, d, a->dqkv, 3 * d, a->dh, d, 0.0f);
      be->ln_mod_bwd(B, Ls, d, x->xhat1, x->rstd1, x->mod + d, 6 * d, a->dh, d, dx, d, dmod,
                     dmod + d);
      lin_bwd(be, &p->mod, B, a->svec, d, dmod, 6 * d, a->dsvec, d, 1.0f);
    }
    if ((st = seg_leave(m, 1 + i, 1, err))) return st;
  }

  /* embeddings */
  if (lo > 0) return CT_OK;
  if ((st = seg_enter(m, 0, 1, err))) return st;
  lin_bwd(be, &m->img_in, Ni, a->img_p, P, a->dimg, d, NULL, 0, 0.0f);
  be->silu_bwd(B, d, a->vec, d, a->dsvec, d, a->dvec, d);
  lin_bwd(be, &m->time_in1, B, a->t_hs, d, a->dvec, d, a->dbv, d, 0.0f);
  be->silu_bwd(B, d, a->t_h, d, a->dbv, d, a->dbv2, d);
  lin_bwd(be, &m->time_in0, B, a->temb, 256, a->dbv2, d, NULL, 0, 0.0f);
  lin_bwd(be, &m->vec_in1, B, a->y_hs, d, a->dvec, d, a->dbv, d, 0.0f);
  be->silu_bwd(B, d, a->y_h, d, a->dbv, d, a->dbv2, d);
  lin_bwd(be, &m->vec_in0, B, a->in_y, c->vec_in_dim, a->dbv2, d, NULL, 0, 0.0f);
  if (c->guidance_embed) {
    lin_bwd(be, &m->g_in1, B, a->g_hs, d, a->dvec, d, a->dbv, d, 0.0f);
    be->silu_bwd(B, d, a->g_h, d, a->dbv, d, a->dbv2, d);
    lin_bwd(be, &m->g_in0, B, a->g_emb, 256, a->dbv2, d, NULL, 0, 0.0f);
  }
  lin_bwd(be, &m->txt_in, Nt, a->in_txt, c->context_in_dim, a->dtxt, d, NULL, 0, 0.0f);
  return seg_leave(m, 0, 1, err);
}

void ct_mmdit_flops(const ct_mmdit_config *c, int B, int H, int W, int T, double *fwd,
                    double *bwd) {
  double d = c->hidden, P = c->in_channels * 4.0, mh = (double)c->mlp_ratio * c->hidden;
  double Li = (double)(H / 2) * (W / 2), Lt = Li + T, Ni = B * Li, Nt = (double)B * T, N = B * Lt;
  double hd = d / c->heads;
  /* GEMM work of the token-wise linears (rows x in x out), split by whether dX is back-propagated
   */
  double with_dx = 0, no_dx = 0;
  no_dx += Ni * P * d + Nt * c->context_in_dim * d + B * 256.0 * d + B * (double)c->vec_in_dim * d;
  with_dx += 2 * B * d * d; /* time_in/vector_in out_layer */
  if (c->guidance_embed) {
    no_dx += B * 256.0 * d;
    with_dx += B * d * d;
  }
  double per_stream = d * 3 * d + d * d + 2 * d * mh; /* qkv, proj, mlp */
  with_dx += c->depth_double * ((Ni + Nt) * per_stream + 2.0 * B * d * 6 * d);
  with_dx += c->depth_single * (N * (d * (3 * d + mh) + (d + mh) * d) + B * d * 3 * d);
  with_dx += Ni * d * P + B * d * 2 * d;
  double attn = (double)(c->depth_double + c->depth_single) * B * c->heads * Lt * Lt *
                hd; /* one L*L*hd product */
  *fwd = 2 * (with_dx + no_dx) + 2 * 2 * attn;
  *bwd = 2 * (2 * with_dx + no_dx) + 2 * 4 * attn;
}

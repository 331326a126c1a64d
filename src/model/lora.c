/* Standard LoRA adapters over the BFL-layout MMDiT (include/ctuner/lora.h,
 * docs/lora.md): the adapter table from peft target lists through the
 * BFL <-> diffusers name map, the flat adapter buffer and its segments, the
 * adapter forward and backward (through the compute backend's sgemm), peft's
 * initialisations, and pytorch_lora_weights.safetensors in and out. */
#include "ctuner/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/log.h"
#include "ctuner/rng.h"
#include "ctuner/safetensors.h"

#define STREAM_LORA_INIT 0x4c4f524100000000ull /* "LORA": init draws, + adapter index */
#define STREAM_LORA_DROP 0x4c44524f00000000ull /* dropout masks, + adapter index */

/* SimpleTuner's Flux.get_lora_target_layers (lora_type standard). "mmdit" is
 * no case there: it falls through to DEFAULT_LORA_TARGET (to_qkv exists only
 * with fused projections, which ctuner's diffusers layout never has). */
static const char *const T_MMDIT[] = {"to_k", "to_q", "to_v", "to_out.0", "to_qkv", NULL};
static const char *const T_ALL[] = {"to_k",       "to_q",       "to_v",
                                    "add_k_proj", "add_q_proj", "add_v_proj",
                                    "to_out.0",   "to_add_out", NULL};
static const char *const T_CONTEXT[] = {"add_k_proj", "add_q_proj", "add_v_proj", "to_add_out",
                                        NULL};
static const char *const T_CONTEXT_FFS[] = {
    "add_k_proj",       "add_q_proj", "add_v_proj", "to_add_out", "ff_context.net.0.proj",
    "ff_context.net.2", NULL};
static const char *const T_ALL_FFS[] = {"to_k",
                                        "to_q",
                                        "to_v",
                                        "add_k_proj",
                                        "add_q_proj",
                                        "add_v_proj",
                                        "to_out.0",
                                        "to_add_out",
                                        "ff.net.0.proj",
                                        "ff.net.2",
                                        "ff_context.net.0.proj",
                                        "ff_context.net.2",
                                        "proj_mlp",
                                        "proj_out",
                                        NULL};
static const char *const T_ALL_FFS_EMB[] = {
    "x_embedder",       "to_k",          "to_q",       "to_v",
    "to_out.0",         "add_k_proj",    "add_q_proj", "add_v_proj",
    "to_add_out",       "ff.net.0.proj", "ff.net.2",   "ff_context.net.0.proj",
    "ff_context.net.2", "proj_mlp",      "proj_out",   NULL};
static const char *const T_AITK[] = {"to_q",
                                     "to_k",
                                     "to_v",
                                     "add_q_proj",
                                     "add_k_proj",
                                     "add_v_proj",
                                     "to_out.0",
                                     "to_add_out",
                                     "ff.net.0.proj",
                                     "ff.net.2",
                                     "ff_context.net.0.proj",
                                     "ff_context.net.2",
                                     "norm.linear",
                                     "norm1.linear",
                                     "norm1_context.linear",
                                     "proj_mlp",
                                     "proj_out",
                                     NULL};
static const char *const T_TINY[] = {"single_transformer_blocks.7.proj_out",
                                     "single_transformer_blocks.20.proj_out", NULL};
static const char *const T_NANO[] = {"single_transformer_blocks.7.proj_out", NULL};

static const struct {
  const char *name;
  const char *const *targets;
} PRESETS[] = {{"mmdit", T_MMDIT}, {"context", T_CONTEXT}, {"context+ffs", T_CONTEXT_FFS},
               {"all", T_ALL},     {"all+ffs", T_ALL_FFS}, {"ai-toolkit", T_AITK},
               {"tiny", T_TINY},   {"nano", T_NANO},       {"all+ffs+embedder", T_ALL_FFS_EMB}};

const char *const *ct_lora_preset(const char *name) {
  for (size_t i = 0; name && i < sizeof PRESETS / sizeof PRESETS[0]; i++)
    if (!strcmp(PRESETS[i].name, name)) return PRESETS[i].targets;
  return NULL;
}

const char *ct_lora_preset_names(void) {
  return "mmdit, context, context+ffs, all, all+ffs, ai-toolkit, tiny, nano, all+ffs+embedder";
}

/* The adapters of one base weight. */
typedef struct site {
  char base[96];
  int first, n; /* adapters [first, first + n) */
} site;

struct ct_lora {
  ct_lora_opts o;
  float scale;
  ct_lora_adapter *ad;
  size_t nad, numel;
  site *sites;
  int nsites;
  float *w, *g;
  int own_w, own_g;
  int nseg;
  int *seg_of;     /* MMDiT segment -> lora segment or -1 (nmmseg entries) */
  int nmmseg;      /* MMDiT segments */
  size_t *seg_off; /* nseg + 1 */
  float **segw, **segg;
  uint64_t *ids; /* the micro-batch's sample ids (dropout masks) */
  int nids;
  size_t ids_cap;
  float *scratch; /* u, gu (N x rank), dropout x and dx (N x in) */
  size_t scratch_n;
};

/* peft's match: the module's name equals the target or ends with ".target". */
static int matches(const char *module, const char *const *targets) {
  const size_t n = strlen(module);
  for (const char *const *t = targets; *t; t++) {
    const size_t k = strlen(*t);
    if (!strcmp(module, *t)) return 1;
    if (n > k && module[n - k - 1] == '.' && !strcmp(module + n - k, *t)) return 1;
  }
  return 0;
}

static int mmdit_segment_of(const ct_mmdit_config *c, const char *name) {
  int i;
  if (sscanf(name, "double_blocks.%d.", &i) == 1) return 1 + i;
  if (sscanf(name, "single_blocks.%d.", &i) == 1) return 1 + c->depth_double + i;
  if (!strncmp(name, "final_layer.", 12)) return 1 + c->depth_double + c->depth_single;
  return 0;
}

static size_t align16(size_t n) {
  return (n + 15) & ~(size_t)15;
}

/* Adapters from the name map: every 2-D ".weight" entry whose module matches. */
static ct_status build_table(ct_lora *l, const ct_mmdit_config *cfg, const char *const *targets,
                             ct_err *err) {
  ct_flux_name *map = NULL;
  size_t nm = 0;
  ct_status st = ct_flux_name_map(cfg, &map, &nm, err);
  if (st) return st;
  l->ad = calloc(nm ? nm : 1, sizeof *l->ad);
  l->sites = calloc(nm ? nm : 1, sizeof *l->sites);
  if (!l->ad || !l->sites) {
    free(map);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  size_t off = 0;
  for (size_t i = 0; i < nm; i++) {
    const ct_flux_name *e = &map[i];
    const size_t dl = strlen(e->dif);
    if (!e->cols || dl < 8 || strcmp(e->dif + dl - 7, ".weight")) continue;
    char module[112];
    snprintf(module, sizeof module, "%.*s", (int)(dl - 7), e->dif);
    if (!matches(module, targets)) continue;
    ct_lora_adapter *a = l->nad ? &l->ad[l->nad - 1] : NULL;
    if (!a || strcmp(a->module, module)) { /* a new adapter (SWAP gives two pieces of one) */
      a = &l->ad[l->nad++];
      snprintf(a->module, sizeof a->module, "%s", module);
      snprintf(a->base, sizeof a->base, "%s", e->bfl);
      a->in = (int)e->cols;
      a->out = (int)e->dif_rows;
      a->seg = mmdit_segment_of(cfg, e->bfl);
      a->a_off = off;
      off += align16((size_t)l->o.rank * (size_t)a->in);
      a->b_off = off;
      off += align16((size_t)a->out * (size_t)l->o.rank);
      if (!l->nsites || strcmp(l->sites[l->nsites - 1].base, e->bfl)) {
        site *s = &l->sites[l->nsites++];
        snprintf(s->base, sizeof s->base, "%s", e->bfl);
        s->first = (int)(l->nad - 1);
      }
      l->sites[l->nsites - 1].n++;
    }
    CT_ASSERT(a->npieces < 2);
    a->piece[a->npieces++] = (ct_lora_piece){e->bfl_row, e->dif_row, e->rows};
  }
  free(map);
  l->numel = off;
  return CT_OK;
}

static ct_status check_fit(const ct_lora *l, const char *const *targets, ct_err *err) {
  if (!l->nad) {
    char list[512] = "";
    for (const char *const *t = targets; *t; t++) {
      size_t n = strlen(list);
      snprintf(list + n, sizeof list - n, "%s%s", n ? ", " : "", *t);
    }
    return ct_errf(err, CT_ERR_INVALID,
                   "the LoRA targets [%s] match no module of this transformer (peft would "
                   "refuse them too): a preset such as tiny/nano names single blocks 7 and 20, "
                   "which a model with fewer single blocks lacks",
                   list);
  }
  /* above both sides a module cannot hold the rank; above the smaller one the
   * adapter is redundant but valid (peft trains it): one warning */
  int over = 0;
  const ct_lora_adapter *first = NULL;
  for (size_t i = 0; i < l->nad; i++) {
    const ct_lora_adapter *a = &l->ad[i];
    const int small = a->in < a->out ? a->in : a->out, big = a->in + a->out - small;
    if (l->o.rank > big)
      return ct_errf(err, CT_ERR_INVALID,
                     "lora_rank %d does not fit module %s (%d inputs, %d outputs): the rank "
                     "exceeds both sides; lower lora_rank or pick another flux_lora_target",
                     l->o.rank, a->module, a->in, a->out);
    if (l->o.rank > small && !over++) first = a;
  }
  if (over)
    CT_WARN(
        "lora_rank %d exceeds min(in, out) of %d module(s), e.g. %s (%d inputs, %d outputs): "
        "their adapters hold redundant parameters (peft trains them the same)",
        l->o.rank, over, first->module, first->in, first->out);
  return CT_OK;
}

ct_status ct_lora_new(const ct_mmdit_config *cfg, const char *const *targets, const ct_lora_opts *o,
                      int flags, ct_lora **out, ct_err *err) {
  *out = NULL;
  if (o->rank < 1) return ct_errf(err, CT_ERR_INVALID, "lora_rank %d must be at least 1", o->rank);
  if (!(o->alpha > 0) || !isfinite(o->alpha))
    return ct_errf(err, CT_ERR_INVALID, "lora_alpha %g must be a positive number", o->alpha);
  if (!(o->dropout >= 0 && o->dropout < 1))
    return ct_errf(err, CT_ERR_INVALID, "lora_dropout %g must be in [0, 1)", o->dropout);
  ct_lora *l = calloc(1, sizeof *l);
  if (!l) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  l->o = *o;
  l->scale = (float)(o->alpha / o->rank);
  ct_status st = build_table(l, cfg, targets, err);
  if (!st) st = check_fit(l, targets, err);
  if (st) goto fail;
  l->nmmseg = 2 + cfg->depth_double + cfg->depth_single;
  l->seg_of = malloc((size_t)l->nmmseg * sizeof *l->seg_of);
  l->seg_off = calloc(l->nad + 1, sizeof *l->seg_off);
  l->segw = calloc(l->nad + 1, sizeof *l->segw);
  l->segg = calloc(l->nad + 1, sizeof *l->segg);
  if (!l->seg_of || !l->seg_off || !l->segw || !l->segg) goto nomem;
  for (int s = 0; s < l->nmmseg; s++) l->seg_of[s] = -1;
  for (size_t i = 0; i < l->nad; i++) {
    const int s = l->ad[i].seg;
    if (l->seg_of[s] < 0) {
      l->seg_of[s] = l->nseg;
      l->seg_off[l->nseg++] = l->ad[i].a_off;
    }
  }
  l->seg_off[l->nseg] = l->numel;
  if (!(flags & CT_LORA_NO_PARAMS)) {
    l->w = ct_alloc(CT_MEM_PARAMS, l->numel * sizeof(float));
    if (!l->w) goto nomem;
    memset(l->w, 0, l->numel * sizeof(float));
    l->own_w = 1;
  }
  if (flags & CT_LORA_GRADS) {
    l->g = ct_alloc(CT_MEM_GRADS, l->numel * sizeof(float));
    if (!l->g) goto nomem;
    memset(l->g, 0, l->numel * sizeof(float));
    l->own_g = 1;
  }
  for (int k = 0; k < l->nseg; k++) ct_lora_bind_segment(l, k, NULL, NULL);
  *out = l;
  return CT_OK;
nomem:
  st = ct_errf(err, CT_ERR_NOMEM, "out of memory for %zu LoRA parameters", l->numel);
fail:
  ct_lora_free(l);
  return st;
}

void ct_lora_free(ct_lora *l) {
  if (!l) return;
  if (l->own_w) ct_free(l->w);
  if (l->own_g) ct_free(l->g);
  ct_free(l->scratch);
  free(l->ids);
  free(l->ad);
  free(l->sites);
  free(l->seg_of);
  free(l->seg_off);
  free(l->segw);
  free(l->segg);
  free(l);
}

size_t ct_lora_numel(const ct_lora *l) {
  return l->numel;
}
const ct_lora_adapter *ct_lora_adapters(const ct_lora *l, size_t *n) {
  *n = l->nad;
  return l->ad;
}
const ct_lora_opts *ct_lora_options(const ct_lora *l) {
  return &l->o;
}
float ct_lora_scale(const ct_lora *l) {
  return l->scale;
}
float *ct_lora_params(ct_lora *l) {
  return l->w;
}
float *ct_lora_grads(ct_lora *l) {
  return l->g;
}
void ct_lora_set_batch(ct_lora *l, int B, const uint64_t *ids) {
  l->nids = 0;
  if (B > 0 && ids && (size_t)B > l->ids_cap) {
    uint64_t *p = realloc(l->ids, (size_t)B * sizeof *p);
    if (!p) return; /* masks then keyed by the row: still valid dropout */
    l->ids = p;
    l->ids_cap = (size_t)B;
  }
  if (B > 0 && ids) {
    memcpy(l->ids, ids, (size_t)B * sizeof *ids);
    l->nids = B;
  }
}

/* Philox index of element c of row n (of N) of adapter's input: keyed by the
 * row's sample id and its row within the sample, so masks do not depend on
 * how samples are spread over ranks and micro-batches. */
static uint64_t drop_index(const ct_lora *l, int n, int N, int in, int c) {
  const int per = N % l->nids == 0 ? N / l->nids : N;
  const uint64_t id = N % l->nids == 0 ? l->ids[n / per] : l->ids[0];
  return (id << 40) + (uint64_t)(n % per) * (uint64_t)in + (uint64_t)c;
}

void ct_lora_use_params(ct_lora *l, float *w) {
  if (l->own_w) ct_free(l->w);
  l->w = w;
  l->own_w = 0;
  for (int k = 0; k < l->nseg; k++) l->segw[k] = w ? w + l->seg_off[k] : NULL;
}

void ct_lora_use_grads(ct_lora *l, float *g) {
  if (l->own_g) ct_free(l->g);
  l->g = g;
  l->own_g = 0;
  for (int k = 0; k < l->nseg; k++) l->segg[k] = g ? g + l->seg_off[k] : NULL;
}

int ct_lora_nsegments(const ct_lora *l) {
  return l->nseg;
}
void ct_lora_segment(const ct_lora *l, int k, size_t *off, size_t *numel) {
  CT_ASSERT(k >= 0 && k < l->nseg);
  *off = l->seg_off[k];
  *numel = l->seg_off[k + 1] - l->seg_off[k];
}
int ct_lora_segment_of(const ct_lora *l, int s) {
  return s >= 0 && s < l->nmmseg ? l->seg_of[s] : -1;
}
int ct_lora_first_mmdit_segment(const ct_lora *l) {
  return l->nad ? l->ad[0].seg : 0;
}

void ct_lora_bind_segment(ct_lora *l, int k, float *w, float *g) {
  l->segw[k] = w ? w : l->w ? l->w + l->seg_off[k] : NULL;
  l->segg[k] = g ? g : l->g ? l->g + l->seg_off[k] : NULL;
}

/* Where adapter a's A (B) lives now, and its gradient (NULL: none). */
static float *ad_w(const ct_lora *l, const ct_lora_adapter *a, int b) {
  const int k = l->seg_of[a->seg];
  float *base = l->segw[k];
  return base ? base + ((b ? a->b_off : a->a_off) - l->seg_off[k]) : NULL;
}
static float *ad_g(const ct_lora *l, const ct_lora_adapter *a, int b) {
  const int k = l->seg_of[a->seg];
  float *base = l->segg[k];
  return base ? base + ((b ? a->b_off : a->a_off) - l->seg_off[k]) : NULL;
}

ct_status ct_lora_init_range(const ct_lora *l, const char *init_type, uint64_t seed, size_t lo,
                             size_t hi, float *out, ct_err *err) {
  const int gauss = !strcmp(init_type, "gaussian");
  if (!gauss && strcmp(init_type, "default"))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "lora_init_type '%s' is not supported; use default or gaussian", init_type);
  memset(out, 0, (hi - lo) * sizeof(float)); /* B (and padding) start at zero, as peft's */
  const int r = l->o.rank;
  for (size_t i = 0; i < l->nad; i++) {
    const ct_lora_adapter *a = &l->ad[i];
    const size_t n = (size_t)r * (size_t)a->in, s = a->a_off, e = s + n;
    const size_t x0 = s > lo ? s : lo, x1 = e < hi ? e : hi;
    if (x0 >= x1) continue;
    if (gauss) /* peft: normal_(A, std=1/r) */
      ct_rng_fill_normal(out + (x0 - lo), x1 - x0, seed, STREAM_LORA_INIT + i, x0 - s, 0.0f,
                         1.0f / (float)r);
    else { /* peft: kaiming_uniform_(A, a=sqrt(5)): bound = 1/sqrt(fan_in) */
      const float b = 1.0f / sqrtf((float)a->in);
      ct_rng_fill_uniform(out + (x0 - lo), x1 - x0, seed, STREAM_LORA_INIT + i, x0 - s, -b, b);
    }
  }
  return CT_OK;
}

int ct_lora_site(const ct_lora *l, const char *base) {
  for (int i = 0; i < l->nsites; i++)
    if (!strcmp(l->sites[i].base, base)) return i;
  return -1;
}

static float *scratch(ct_lora *l, size_t n) {
  if (n > l->scratch_n) {
    ct_free(l->scratch);
    l->scratch = ct_alloc(CT_MEM_ACTIVATIONS, n * sizeof(float));
    l->scratch_n = l->scratch ? n : 0;
    CT_ASSERT(l->scratch); /* a few rank-wide rows: far below the model's own arena */
  }
  return l->scratch;
}

static int in_window(const ct_lora_adapter *a, int lo, int hi) {
  return a->piece[0].bfl_row >= lo && a->piece[0].bfl_row + a->piece[0].rows <= hi;
}

/* x with adapter i's dropout mask (scaled by 1/(1-p)) into xd, or x itself. */
static const float *dropped(const ct_lora *l, int i, int N, int in, const float *x, int ldx,
                            float *xd) {
  const double p = l->o.dropout;
  if (p <= 0 || !l->nids) return x; /* no batch set: inference, no dropout (peft's eval mode) */
  const float keep = (float)(1.0 / (1.0 - p));
  for (int n = 0; n < N; n++) {
    ct_rng_fill_uniform(xd + (size_t)n * in, (size_t)in, l->o.seed, STREAM_LORA_DROP + (uint64_t)i,
                        drop_index(l, n, N, in, 0), 0.0f, 1.0f);
    for (int c = 0; c < in; c++) {
      float *v = &xd[(size_t)n * in + c];
      *v = *v < (float)p ? 0.0f : x[(size_t)n * ldx + c] * keep;
    }
  }
  return xd;
}

void ct_lora_fwd(ct_lora *l, const ct_backend_ops *be, int si, int row_lo, int row_hi, int N,
                 const float *x, int ldx, float *y, int ldy) {
  const site *st = &l->sites[si];
  const int r = l->o.rank;
  for (int i = st->first; i < st->first + st->n; i++) {
    const ct_lora_adapter *a = &l->ad[i];
    if (!in_window(a, row_lo, row_hi)) continue;
    const int in = a->in;
    float *u =
        scratch(l, (size_t)N * r * 2 + (l->nids && l->o.dropout > 0 ? (size_t)N * in * 2 : 0));
    const float *xd = dropped(l, i, N, in, x, ldx, u + (size_t)N * r * 2);
    const int ldxd = xd == x ? ldx : in;
    const float *A = ad_w(l, a, 0), *B = ad_w(l, a, 1);
    be->sgemm(0, 1, N, r, in, 1.0f, xd, ldxd, A, in, 0.0f, u, r);
    for (int p = 0; p < a->npieces; p++) {
      const ct_lora_piece *pc = &a->piece[p];
      be->sgemm(0, 1, N, (int)pc->rows, r, l->scale, u, r, B + pc->dif_row * r, r, 1.0f,
                y + (pc->bfl_row - row_lo), ldy);
    }
  }
}

void ct_lora_bwd(ct_lora *l, const ct_backend_ops *be, int si, int row_lo, int row_hi, int N,
                 const float *x, int ldx, const float *dy, int lddy, float *dx, int lddx) {
  const site *st = &l->sites[si];
  const int r = l->o.rank;
  const int drop = l->o.dropout > 0 && l->nids > 0;
  for (int i = st->first; i < st->first + st->n; i++) {
    const ct_lora_adapter *a = &l->ad[i];
    if (!in_window(a, row_lo, row_hi)) continue;
    const int in = a->in;
    float *u = scratch(l, (size_t)N * r * 2 + (drop ? (size_t)N * in * 2 : 0));
    float *gu = u + (size_t)N * r, *xdb = gu + (size_t)N * r, *dxd = xdb + (size_t)N * in;
    const float *xd = dropped(l, i, N, in, x, ldx, xdb);
    const int ldxd = xd == x ? ldx : in;
    const float *A = ad_w(l, a, 0), *B = ad_w(l, a, 1);
    float *gA = ad_g(l, a, 0), *gB = ad_g(l, a, 1);
    be->sgemm(0, 1, N, r, in, 1.0f, xd, ldxd, A, in, 0.0f, u, r); /* u = x A^T, recomputed */
    for (int p = 0; p < a->npieces; p++) {
      const ct_lora_piece *pc = &a->piece[p];
      const float *dyp = dy + (pc->bfl_row - row_lo);
      /* gu = sum over pieces dy_p B_p (N x r) */
      be->sgemm(0, 0, N, r, (int)pc->rows, 1.0f, dyp, lddy, B + pc->dif_row * r, r, p ? 1.0f : 0.0f,
                gu, r);
      if (gB) /* dB_p += scale dy_p^T u */
        be->sgemm(1, 0, (int)pc->rows, r, N, l->scale, dyp, lddy, u, r, 1.0f, gB + pc->dif_row * r,
                  r);
    }
    if (gA) be->sgemm(1, 0, r, in, N, l->scale, gu, r, xd, ldxd, 1.0f, gA, in);
    if (!dx) continue;
    if (!drop) {
      be->sgemm(0, 0, N, in, r, l->scale, gu, r, A, in, 1.0f, dx, lddx);
      continue;
    }
    be->sgemm(0, 0, N, in, r, l->scale, gu, r, A, in, 0.0f, dxd, in);
    /* through the mask: xd = x * m / (1 - p), so dx += dxd * (xd != 0 ? 1/(1-p) : 0) */
    const float keep = (float)(1.0 / (1.0 - l->o.dropout));
    for (int n = 0; n < N; n++) {
      ct_rng_fill_uniform(xdb + (size_t)n * in, (size_t)in, l->o.seed,
                          STREAM_LORA_DROP + (uint64_t)i, drop_index(l, n, N, in, 0), 0.0f, 1.0f);
      for (int c = 0; c < in; c++)
        if (!(xdb[(size_t)n * in + c] < (float)l->o.dropout))
          dx[(size_t)n * lddx + c] += dxd[(size_t)n * in + c] * keep;
    }
  }
}

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
#include "lora_impl.h"

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

/* peft: the module matches a target list; A [r, in], B [out, r]. */
typedef struct peft_pick {
  const char *const *targets;
  int rank;
  float scale;
  int dora;
} peft_pick;

static ct_status pick_peft(void *user, const char *module, int in, int out, ct_lora_adapter *a,
                           int *take, ct_err *err) {
  (void)err;
  const peft_pick *p = user;
  *take = matches(module, p->targets);
  if (!*take) return CT_OK;
  a->algo = CT_ALGO_PEFT;
  a->rank = p->rank;
  a->scale = p->scale;
  a->nt = 2;
  a->t[0] = (ct_lora_tensor){"lora_A", p->rank, in, 0, 'u', 1.0f / sqrtf((float)in)};
  a->t[1] = (ct_lora_tensor){"lora_B", out, p->rank, 0, 'z', 0};
  if (p->dora) a->t[a->nt++] = (ct_lora_tensor){"lora_magnitude_vector", out, 1, 0, 'm', 0};
  return CT_OK;
}

/* Adapters from the name map: every 2-D ".weight" entry whose module the pick takes. */
static ct_status build_table(ct_lora *l, const ct_mmdit_config *cfg, ct_lora_pick_fn pick,
                             void *user, ct_err *err) {
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
  for (size_t i = 0; i < nm && !st; i++) {
    const ct_flux_name *e = &map[i];
    const size_t dl = strlen(e->dif);
    if (!e->cols || dl < 8 || strcmp(e->dif + dl - 7, ".weight")) continue;
    char module[112];
    snprintf(module, sizeof module, "%.*s", (int)(dl - 7), e->dif);
    ct_lora_adapter *a = l->nad ? &l->ad[l->nad - 1] : NULL;
    if (!a || strcmp(a->module, module)) { /* a new adapter (SWAP gives two pieces of one) */
      ct_lora_adapter cand;
      memset(&cand, 0, sizeof cand);
      int take = 0;
      st = pick(user, module, (int)e->cols, (int)e->dif_rows, &cand, &take, err);
      if (st || !take) continue;
      a = &l->ad[l->nad++];
      *a = cand;
      snprintf(a->module, sizeof a->module, "%s", module);
      snprintf(a->base, sizeof a->base, "%s", e->bfl);
      a->in = (int)e->cols;
      a->out = (int)e->dif_rows;
      a->seg = mmdit_segment_of(cfg, e->bfl);
      for (int k = 0; k < a->nt; k++) {
        a->t[k].off = off;
        off += align16((size_t)a->t[k].rows * (size_t)a->t[k].cols);
      }
      a->a_off = a->t[0].off;
      a->b_off = a->t[1].off;
      if (!l->nsites || strcmp(l->sites[l->nsites - 1].base, e->bfl)) {
        lora_site *s = &l->sites[l->nsites++];
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
  return st;
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

ct_status ct_lora_build(ct_lora *l, const ct_mmdit_config *cfg, ct_lora_pick_fn pick, void *user,
                        int flags, ct_err *err) {
  if (!l->be) l->be = ct_backend_default(); /* built on the host; moved later */
  ct_status st = build_table(l, cfg, pick, user, err);
  if (st) return st;
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
  if (!(flags & CT_LORA_NO_PARAMS) && l->nad) {
    l->w = ct_alloc(CT_MEM_PARAMS, l->numel * sizeof(float));
    if (!l->w) goto nomem;
    memset(l->w, 0, l->numel * sizeof(float));
    l->own_w = 1;
  }
  if ((flags & CT_LORA_GRADS) && l->nad) {
    l->g = ct_alloc(CT_MEM_GRADS, l->numel * sizeof(float));
    if (!l->g) goto nomem;
    memset(l->g, 0, l->numel * sizeof(float));
    l->own_g = 1;
  }
  for (int k = 0; k < l->nseg; k++) ct_lora_bind_segment(l, k, NULL, NULL);
  return CT_OK;
nomem:
  return ct_errf(err, CT_ERR_NOMEM, "out of memory for %zu LoRA parameters", l->numel);
}

ct_status ct_lora_new(const ct_mmdit_config *cfg, const char *const *targets, const ct_lora_opts *o,
                      int flags, ct_lora **out, ct_err *err) {
  *out = NULL;
  if (o->rank < 1) return ct_errf(err, CT_ERR_INVALID, "lora_rank %d must be at least 1", o->rank);
  if (!(o->alpha > 0) || !isfinite(o->alpha))
    return ct_errf(err, CT_ERR_INVALID, "lora_alpha %g must be a positive number", o->alpha);
  if (!(o->dropout >= 0 && o->dropout < 1))
    return ct_errf(err, CT_ERR_INVALID, "lora_dropout %g must be in [0, 1)", o->dropout);
  if (o->dora && o->dropout > 0)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "use_dora with lora_dropout %g is not implemented (peft's DoRA then computes "
                   "the base on the dropped input); set lora_dropout 0",
                   o->dropout);
  ct_lora *l = calloc(1, sizeof *l);
  if (!l) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  l->o = *o;
  l->scale = (float)(o->alpha / o->rank);
  peft_pick pp = {targets, o->rank, l->scale, o->dora};
  ct_status st = build_table(l, cfg, pick_peft, &pp, err);
  if (!st) st = check_fit(l, targets, err);
  if (!st) {
    /* the table again, now known to fit, with segments and buffers */
    free(l->ad);
    free(l->sites);
    l->ad = NULL;
    l->sites = NULL;
    l->nad = 0;
    l->nsites = 0;
    st = ct_lora_build(l, cfg, pick_peft, &pp, flags, err);
  }
  if (st) {
    ct_lora_free(l);
    return st;
  }
  *out = l;
  return CT_OK;
}

void ct_lora_free(ct_lora *l) {
  if (!l) return;
  const ct_backend_ops *be = l->be ? l->be : ct_backend_default();
  if (l->own_w) be->free(l->w);
  if (l->own_g) be->free(l->g);
  be->free(l->scratch);
  be->free(l->dense);
  free(l->ctr);
  free(l->lyco_json);
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
/* LyCORIS: every adapter's scale at multiplier m (as make_module computes it). */
static void apply_mult(ct_lora *l, double m) {
  for (size_t i = 0; i < l->nad; i++) l->ad[i].scale = (float)(l->ad[i].alpha / l->ad[i].rank * m);
}

void ct_lora_set_validation_multiplier(ct_lora *l, double m) {
  l->lyco_vmult = m;
  if (l->lyco && !l->nids) apply_mult(l, m);
}

void ct_lora_set_batch(ct_lora *l, int B, const uint64_t *ids) {
  if (l->lyco) apply_mult(l, B > 0 && ids ? l->lyco_mult : l->lyco_vmult);
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
  if (l->own_w) l->be->free(l->w);
  l->w = w;
  l->own_w = 0;
  for (int k = 0; k < l->nseg; k++) l->segw[k] = w ? w + l->seg_off[k] : NULL;
}

void ct_lora_use_grads(ct_lora *l, float *g) {
  if (l->own_g) l->be->free(l->g);
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

/* Tensor k of adapter a, and its gradient (NULL: none). */
float *ct_lora_t(const ct_lora *l, const ct_lora_adapter *a, int k) {
  const int s = l->seg_of[a->seg];
  return l->segw[s] + (a->t[k].off - l->seg_off[s]);
}
float *ct_lora_gt(const ct_lora *l, const ct_lora_adapter *a, int k) {
  const int s = l->seg_of[a->seg];
  return l->segg[s] ? l->segg[s] + (a->t[k].off - l->seg_off[s]) : NULL;
}

int ct_lora_is_lycoris(const ct_lora *l) {
  return l->lyco;
}

ct_status ct_lora_init_range(const ct_lora *l, const char *init_type, uint64_t seed, size_t lo,
                             size_t hi, float *out, ct_err *err) {
  const int gauss = !strcmp(init_type, "gaussian");
  if (!gauss && strcmp(init_type, "default"))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "lora_init_type '%s' is not supported; use default or gaussian", init_type);
  memset(out, 0, (hi - lo) * sizeof(float)); /* B (and padding) start at zero, as peft's */
  if (l->lyco) {                             /* LyCORIS's initialisations, per tensor */
    for (size_t i = 0; i < l->nad; i++)
      for (int k = 0; k < l->ad[i].nt; k++) {
        const ct_lora_tensor *t = &l->ad[i].t[k];
        const size_t s = t->off, e = s + (size_t)t->rows * (size_t)t->cols;
        const size_t x0 = s > lo ? s : lo, x1 = e < hi ? e : hi;
        const uint64_t stream = STREAM_LORA_INIT + (i << 3) + (uint64_t)k;
        if (x0 >= x1 || t->init == 'z') continue;
        if (t->init == 'n')
          ct_rng_fill_normal(out + (x0 - lo), x1 - x0, seed, stream, x0 - s, 0.0f, t->init_v);
        else
          ct_rng_fill_uniform(out + (x0 - lo), x1 - x0, seed, stream, x0 - s, -t->init_v,
                              t->init_v);
      }
    return CT_OK;
  }
  const int r = l->o.rank;
  for (size_t i = 0; i < l->nad; i++) { /* DoRA's magnitude: the base's row norms */
    const ct_lora_adapter *a = &l->ad[i];
    if (a->nt < 3) continue;
    const size_t s = a->t[2].off, e = s + (size_t)a->out, x0 = s > lo ? s : lo,
                 x1 = e < hi ? e : hi;
    if (x0 >= x1) continue;
    float *mag = malloc((size_t)a->out * sizeof *mag);
    if (!mag) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    ct_dora_init(l, i, mag);
    memcpy(out + (x0 - lo), mag + (x0 - s), (x1 - x0) * sizeof(float));
    free(mag);
  }
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

void ct_lora_bind_base(ct_lora *l, int site, const float *w, const float *b) {
  l->sites[site].w = w;
  l->sites[site].b = b;
}

int ct_lora_site(const ct_lora *l, const char *base) {
  for (int i = 0; i < l->nsites; i++)
    if (!strcmp(l->sites[i].base, base)) return i;
  return -1;
}

static float *scratch(ct_lora *l, size_t n) {
  if (n > l->scratch_n) {
    l->be->free(l->scratch);
    l->scratch = l->be->alloc(CT_MEM_ACTIVATIONS, n * sizeof(float));
    l->scratch_n = l->scratch ? n : 0;
    CT_ASSERT(l->scratch); /* a few rank-wide rows: far below the model's own arena */
  }
  return l->scratch;
}

static int in_window(const ct_lora_adapter *a, int lo, int hi) {
  return a->piece[0].bfl_row >= lo && a->piece[0].bfl_row + a->piece[0].rows <= hi;
}

/* The Philox offset of each of the N rows of adapter input (host memory). */
static const uint64_t *drop_ctr(ct_lora *l, int N, int in) {
  if ((size_t)N > l->ctr_cap) {
    uint64_t *p = realloc(l->ctr, (size_t)N * sizeof *p);
    CT_ASSERT(p); /* N counters: a few KB */
    l->ctr = p;
    l->ctr_cap = (size_t)N;
  }
  for (int n = 0; n < N; n++) l->ctr[n] = drop_index(l, n, N, in, 0);
  return l->ctr;
}

/* x with adapter i's dropout mask (scaled by 1/(1-p)) into xd, or x itself:
 * the backend's dropout_fwd, whose mask is drawn from the rows' offsets. */
static const float *dropped(ct_lora *l, const ct_backend_ops *be, int i, int N, int in,
                            const float *x, int ldx, float *xd) {
  const double p = l->o.dropout;
  if (p <= 0 || !l->nids) return x; /* no batch set: inference, no dropout (peft's eval mode) */
  be->dropout_fwd(N, in, x, ldx, l->o.seed, STREAM_LORA_DROP + (uint64_t)i, drop_ctr(l, N, in),
                  (float)p, xd);
  return xd;
}

ct_status ct_lora_set_backend(ct_lora *l, const ct_backend_ops *be, ct_err *err) {
  if (!be) be = ct_backend_default();
  if (be == l->be) return CT_OK;
  int dora = 0;
  for (size_t i = 0; i < l->nad; i++) dora |= l->ad[i].nt == 3 && l->ad[i].algo == CT_ALGO_PEFT;
  if (!be->host_memory && (l->lyco || dora))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s adapters do not run on compute backend %s (their weight norms and "
                   "rebuilds are host loops); use standard LoRA there",
                   l->lyco ? "LyCORIS" : "DoRA", be->name);
  const char *lacks =
      ct_backend_lacks(be, l->o.dropout > 0 ? "sgemm dropout_fwd dropout_bwd" : "sgemm");
  if (lacks)
    return ct_errf(err, CT_ERR_UNSUPPORTED, "LoRA on compute backend %s: it has no %s", be->name,
                   lacks);
  const size_t bytes = l->numel * sizeof(float);
  ct_status st =
      l->own_w ? ct_backend_move(l->be, be, CT_MEM_PARAMS, bytes, (void **)&l->w, err) : CT_OK;
  if (!st && l->own_g) st = ct_backend_move(l->be, be, CT_MEM_GRADS, bytes, (void **)&l->g, err);
  if (st) return st;
  l->be->free(l->scratch); /* scratch is re-made on the new backend as it is needed */
  l->be->free(l->dense);
  l->scratch = l->dense = NULL;
  l->scratch_n = l->dense_n = 0;
  l->be = be;
  for (int k = 0; k < l->nseg; k++) ct_lora_bind_segment(l, k, NULL, NULL);
  return CT_OK;
}

const ct_backend_ops *ct_lora_backend(const ct_lora *l) {
  return l->be;
}

float *ct_lora_swap_params(ct_lora *l, float *w) {
  float *old = l->w;
  l->w = w;
  for (int k = 0; k < l->nseg; k++) ct_lora_bind_segment(l, k, NULL, NULL);
  return old;
}

/* ---- LoHa and LoKr: the adapter's weight rebuilt (out x in, times its
 * scale), as LyCORIS's default (non-bypass) forward does ---- */

float *ct_lora_dense(ct_lora *l, size_t n) {
  if (n > l->dense_n) {
    l->be->free(l->dense);
    l->dense = l->be->alloc(CT_MEM_ACTIVATIONS, n * sizeof(float));
    l->dense_n = l->dense ? n : 0;
    CT_ASSERT(l->dense); /* a few module-sized matrices */
  }
  return l->dense;
}

/* C (m x n) = A (m x r) B (r x n). */
static void prod(const ct_backend_ops *be, int m, int n, int r, const float *A, const float *B,
                 float *C) {
  be->sgemm(0, 0, m, n, r, 1.0f, A, r, B, n, 0.0f, C, n);
}

/* LoHa: P1 = w1a w1b, P2 = w2a w2b, W = scale * P1 . P2 (all out x in). */
static void loha_rebuild(const ct_backend_ops *be, const ct_lora *l, const ct_lora_adapter *a,
                         float *w, float *p1, float *p2) {
  const size_t n = (size_t)a->out * (size_t)a->in;
  prod(be, a->out, a->in, a->rank, ct_lora_t(l, a, 0), ct_lora_t(l, a, 1), p1);
  prod(be, a->out, a->in, a->rank, ct_lora_t(l, a, 2), ct_lora_t(l, a, 3), p2);
  for (size_t i = 0; i < n; i++) w[i] = a->scale * p1[i] * p2[i];
}

static void loha_fwd(ct_lora *l, const ct_backend_ops *be, const ct_lora_adapter *a, int row_lo,
                     int N, const float *x, int ldx, float *y, int ldy) {
  const size_t n = (size_t)a->out * (size_t)a->in;
  float *w = ct_lora_dense(l, 3 * n), *p1 = w + n, *p2 = p1 + n;
  loha_rebuild(be, l, a, w, p1, p2);
  for (int p = 0; p < a->npieces; p++) {
    const ct_lora_piece *pc = &a->piece[p];
    be->sgemm(0, 1, N, (int)pc->rows, a->in, 1.0f, x, ldx, w + pc->dif_row * a->in, a->in, 1.0f,
              y + (pc->bfl_row - row_lo), ldy);
  }
}

/* dx += dy W; G = dL/dW (into W's buffer); dP1 = s G . P2 -> w1a, w1b;
 * dP2 = s G . P1 -> w2a, w2b (in place of P2, P1). */
static void loha_bwd(ct_lora *l, const ct_backend_ops *be, const ct_lora_adapter *a, int row_lo,
                     int N, const float *x, int ldx, const float *dy, int lddy, float *dx,
                     int lddx) {
  const size_t n = (size_t)a->out * (size_t)a->in;
  float *w = ct_lora_dense(l, 3 * n), *p1 = w + n, *p2 = p1 + n;
  loha_rebuild(be, l, a, w, p1, p2);
  for (int p = 0; dx && p < a->npieces; p++) {
    const ct_lora_piece *pc = &a->piece[p];
    be->sgemm(0, 0, N, a->in, (int)pc->rows, 1.0f, dy + (pc->bfl_row - row_lo), lddy,
              w + pc->dif_row * a->in, a->in, 1.0f, dx, lddx);
  }
  if (!ct_lora_gt(l, a, 0)) return; /* this segment keeps no gradient */
  memset(w, 0, n * sizeof(float));
  for (int p = 0; p < a->npieces; p++) {
    const ct_lora_piece *pc = &a->piece[p];
    be->sgemm(1, 0, (int)pc->rows, a->in, N, 1.0f, dy + (pc->bfl_row - row_lo), lddy, x, ldx, 0.0f,
              w + pc->dif_row * a->in, a->in);
  }
  const int r = a->rank;
  for (int h = 0; h < 2; h++) {
    float *t = h ? p1 : p2; /* h 0: dP1 = s G . P2 (into P2); h 1: dP2 = s G . P1 (into P1) */
    for (size_t i = 0; i < n; i++) t[i] *= a->scale * w[i];
    float *ga = ct_lora_gt(l, a, 2 * h), *gb = ct_lora_gt(l, a, 2 * h + 1);
    be->sgemm(0, 1, a->out, r, a->in, 1.0f, t, a->in, ct_lora_t(l, a, 2 * h + 1), a->in, 1.0f, ga,
              r);
    be->sgemm(1, 0, r, a->in, a->out, 1.0f, ct_lora_t(l, a, 2 * h), r, t, a->in, 1.0f, gb, a->in);
  }
}

void ct_lora_set_bypass(ct_lora *l, int on) {
  l->bypass = on;
}

void ct_lora_fwd(ct_lora *l, const ct_backend_ops *be, int si, int row_lo, int row_hi, int N,
                 const float *x, int ldx, float *y, int ldy) {
  if (l->bypass) return; /* the base model's output: no adapter, no DoRA magnitude */
  const lora_site *st = &l->sites[si];
  for (int i = st->first; i < st->first + st->n; i++) {
    const ct_lora_adapter *a = &l->ad[i];
    if (!in_window(a, row_lo, row_hi)) continue;
    if (a->nt == 3 && a->algo == CT_ALGO_PEFT) {
      ct_dora_fwd(l, be, si, a, row_lo, N, x, ldx, y, ldy);
      continue;
    }
    if (a->algo == CT_ALGO_LOHA || a->algo == CT_ALGO_LOKR) {
      if (a->algo == CT_ALGO_LOHA)
        loha_fwd(l, be, a, row_lo, N, x, ldx, y, ldy);
      else
        ct_lokr_fwd(l, be, a, row_lo, N, x, ldx, y, ldy);
      continue;
    }
    const int in = a->in, r = a->rank;
    float *u =
        scratch(l, (size_t)N * r * 2 + (l->nids && l->o.dropout > 0 ? (size_t)N * in * 2 : 0));
    const float *xd = dropped(l, be, i, N, in, x, ldx, u + (size_t)N * r * 2);
    const int ldxd = xd == x ? ldx : in;
    const float *A = ad_w(l, a, 0), *B = ad_w(l, a, 1);
    be->sgemm(0, 1, N, r, in, 1.0f, xd, ldxd, A, in, 0.0f, u, r);
    for (int p = 0; p < a->npieces; p++) {
      const ct_lora_piece *pc = &a->piece[p];
      be->sgemm(0, 1, N, (int)pc->rows, r, a->scale, u, r, B + pc->dif_row * r, r, 1.0f,
                y + (pc->bfl_row - row_lo), ldy);
    }
  }
}

void ct_lora_bwd(ct_lora *l, const ct_backend_ops *be, int si, int row_lo, int row_hi, int N,
                 const float *x, int ldx, const float *dy, int lddy, float *dx, int lddx) {
  const lora_site *st = &l->sites[si];
  const int drop = l->o.dropout > 0 && l->nids > 0;
  for (int i = st->first; i < st->first + st->n; i++) {
    const ct_lora_adapter *a = &l->ad[i];
    if (!in_window(a, row_lo, row_hi)) continue;
    if (a->nt == 3 && a->algo == CT_ALGO_PEFT) {
      ct_dora_bwd(l, be, si, a, row_lo, N, x, ldx, dy, lddy, dx, lddx);
      continue;
    }
    if (a->algo == CT_ALGO_LOHA || a->algo == CT_ALGO_LOKR) {
      if (a->algo == CT_ALGO_LOHA)
        loha_bwd(l, be, a, row_lo, N, x, ldx, dy, lddy, dx, lddx);
      else
        ct_lokr_bwd(l, be, a, row_lo, N, x, ldx, dy, lddy, dx, lddx);
      continue;
    }
    const int in = a->in, r = a->rank;
    const float sc = a->scale;
    float *u = scratch(l, (size_t)N * r * 2 + (drop ? (size_t)N * in * 2 : 0));
    float *gu = u + (size_t)N * r, *xdb = gu + (size_t)N * r, *dxd = xdb + (size_t)N * in;
    const float *xd = dropped(l, be, i, N, in, x, ldx, xdb);
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
        be->sgemm(1, 0, (int)pc->rows, r, N, sc, dyp, lddy, u, r, 1.0f, gB + pc->dif_row * r, r);
    }
    if (gA) be->sgemm(1, 0, r, in, N, sc, gu, r, xd, ldxd, 1.0f, gA, in);
    if (!dx) continue;
    if (!drop) {
      be->sgemm(0, 0, N, in, r, sc, gu, r, A, in, 1.0f, dx, lddx);
      continue;
    }
    be->sgemm(0, 0, N, in, r, sc, gu, r, A, in, 0.0f, dxd, in);
    /* through the mask: xd = x * m / (1 - p), so dx += dxd * (xd != 0 ? 1/(1-p) : 0) */
    be->dropout_bwd(N, in, dxd, l->o.seed, STREAM_LORA_DROP + (uint64_t)i, drop_ctr(l, N, in),
                    (float)l->o.dropout, dx, lddx);
  }
}

/* The T5 v1.1 encoder (Hugging Face T5EncoderModel, FLUX's text_encoder_2):
 * weights from a text_encoder_2 directory, forward pass on a compute backend.
 *
 * x = shared[ids]                                   (no scaling, no positions)
 * per block: x += o(attn(RMSNorm(x) q, k, v; + position bias))   (no 1/sqrt(d_kv))
 *            x += wo(gelu_tanh(RMSNorm(x) wi_0) * (RMSNorm(x) wi_1))
 * seq = RMSNorm(x) (final_layer_norm)
 * RMSNorm is T5LayerNorm: x / sqrt(mean(x^2) + eps) * weight, no mean, no
 * bias. The position bias (heads, T, T) is block 0's relative_attention_bias
 * table (num_buckets, heads) looked up at the bucket of key - query
 * (bidirectional), built on the host once per sequence length and shared by
 * every block, as HF does. No attention mask: FluxPipeline passes none.
 * Weights: when every matrix (the embedding and the seven linear weights of
 * each block) is stored BF16 — FLUX.1's text_encoder_2 — they stay in the
 * memory-mapped files (2 bytes per parameter, nothing copied): the linear
 * layers read them through bf16 weight views, which the GEMM widens tile by
 * tile while packing (docs/gemm.md), the embedding rows are widened as they
 * are looked up; only the norms and the position-bias table are widened into
 * float32. Widening is exact, so the outputs are the float32 path's bits.
 * Otherwise (F32, F16 files) the weights are held in float32.
 * text_encoder_2_precision (ct_t5_load_prec) bf16 / int8-quanto / int8-torchao:
 * every linear weight through a view as well: a BF16 file's mapped (bf16),
 * or widened one matrix at a time and rounded to bf16 or quantised per
 * output row (ct_quantize_int8: quanto's and torchao's scales) into one owned
 * buffer [int8 rows' scales][narrow elements]; the embedding stays as stored
 * (mapped BF16, else float32), as the libraries quantise nn.Linear only.
 * Not here: the tokenizer (spm.c), a backward pass, fp8/int4 storage.
 */
#include "ctuner/t5.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/bf16.h"
#include "ctuner/json.h"
#include "ctuner/kernels.h"
#include "ctuner/safetensors.h"

typedef struct tparam {
  char name[128];
  int ndim;
  int64_t shape[2];
  size_t offset, numel;
} tparam;

typedef struct tlayer {
  size_t ln0, qkv, o, ln1, wi0, wi1, wo;
} tlayer;

struct ct_t5 {
  ct_t5_config cfg;
  const ct_backend_ops *be;
  tparam *params;
  size_t nparams, numel;
  tlayer *layers;
  size_t shared, relbias, lnf;
  float *w;
  /* mapped (stored BF16): the files stay open, w holds only the norms and the
   * bias table, lv the 7 views of each block (q, k, v, o, wi0, wi1, wo) */
  int mapped;
  ct_st_set set;
  ct_wview *lv;
  const uint16_t *emb;
  size_t wfloats; /* floats in w */
  /* views mode (lv set): the owned narrow weights (int8 rows' scales, then
   * int8 or bf16 elements), the bytes read from the mapping, and where the
   * embedding is in w when it is not mapped */
  char *qbuf;
  size_t qbytes, mbytes;
  /* scratch, backend memory, for cap_rows tokens */
  float *x, *h, *big, *heads, *o, *f0, *f1, *rstd, *bias;
  size_t cap_rows;
  int bias_T, bias_cap; /* sequence length the bias holds, and its capacity */
};

/* ---- configuration ---- */

static ct_status cfg_int(const ct_json *j, const char *key, int def, int *out, const char *path,
                         ct_err *err) {
  const ct_json *v = ct_json_get(j, key);
  if (!v) {
    if (def < 0) return ct_errf(err, CT_ERR_FORMAT, "%s: \"%s\" is missing", path, key);
    *out = def;
    return CT_OK;
  }
  if (v->type != CT_JSON_NUMBER || !v->is_int || v->i64 < 1 || v->i64 > (1 << 24))
    return ct_errf(err, CT_ERR_FORMAT, "%s: \"%s\" must be an integer in [1, 2^24]", path, key);
  *out = (int)v->i64;
  return CT_OK;
}

ct_status ct_t5_config_read(const char *path, ct_t5_config *c, ct_err *err) {
  ct_json *j = NULL;
  ct_status st = ct_json_parse_file(path, 1 << 20, &j, err);
  if (st) return st;
  memset(c, 0, sizeof *c);
  st = cfg_int(j, "vocab_size", -1, &c->vocab, path, err);
  if (!st) st = cfg_int(j, "d_model", -1, &c->d_model, path, err);
  if (!st) st = cfg_int(j, "d_kv", -1, &c->d_kv, path, err);
  if (!st) st = cfg_int(j, "d_ff", -1, &c->d_ff, path, err);
  if (!st) st = cfg_int(j, "num_layers", -1, &c->layers, path, err);
  if (!st) st = cfg_int(j, "num_heads", -1, &c->heads, path, err);
  if (!st) st = cfg_int(j, "relative_attention_num_buckets", 32, &c->num_buckets, path, err);
  if (!st) st = cfg_int(j, "relative_attention_max_distance", 128, &c->max_distance, path, err);
  const ct_json *eps = ct_json_get(j, "layer_norm_epsilon");
  c->eps = eps && eps->type == CT_JSON_NUMBER ? (float)eps->num : 1e-6f;
  const ct_json *ff = ct_json_get(j, "feed_forward_proj");
  const char *ffs = ff && ff->type == CT_JSON_STRING ? ff->str : "relu"; /* T5Config's default */
  if (!st && strcmp(ffs, "gated-gelu"))
    st = ct_errf(err, CT_ERR_UNSUPPORTED,
                 "%s: feed_forward_proj \"%s\"; ctuner runs T5 v1.1 (\"gated-gelu\", FLUX's "
                 "text_encoder_2), not the original T5's ReLU or other variants",
                 path, ffs);
  if (!st) st = ct_t5_config_validate(c, err);
  if (st) ct_err_prefix(err, "%s: ", path);
  ct_json_free(j);
  return st;
}

ct_status ct_t5_config_validate(const ct_t5_config *c, ct_err *err) {
  if (c->vocab < 1 || c->d_model < 1 || c->d_kv < 1 || c->d_ff < 1 || c->layers < 1 ||
      c->heads < 1 || c->num_buckets < 4 || c->num_buckets % 2 || c->max_distance < 2 ||
      !(c->eps > 0.0f) || (size_t)c->heads * c->d_kv > (1u << 20))
    return ct_errf(err, CT_ERR_INVALID,
                   "T5 config: vocab %d, d_model %d, d_kv %d, d_ff %d, layers %d, heads %d, "
                   "buckets %d, max_distance %d, eps %g: need positive sizes, an even number of "
                   "buckets >= 4, max_distance >= 2, eps > 0",
                   c->vocab, c->d_model, c->d_kv, c->d_ff, c->layers, c->heads, c->num_buckets,
                   c->max_distance, (double)c->eps);
  return CT_OK;
}

/* ---- parameter table ---- */

static size_t add(ct_t5 *t, const char *name, int64_t d0, int64_t d1) {
  tparam *p = &t->params[t->nparams++];
  snprintf(p->name, sizeof p->name, "%s", name);
  p->ndim = d1 ? 2 : 1;
  p->shape[0] = d0, p->shape[1] = d1;
  p->numel = (size_t)d0 * (size_t)(d1 ? d1 : 1);
  p->offset = t->numel;
  t->numel += p->numel;
  return p->offset;
}

static size_t addl(ct_t5 *t, int l, const char *suffix, int64_t d0, int64_t d1) {
  char nm[100];
  snprintf(nm, sizeof nm, "encoder.block.%d.%s", l, suffix);
  return add(t, nm, d0, d1);
}

/* HF names; q, k, v adjacent so that they are one [3 inner, d] weight. */
static ct_status build_table(ct_t5 *t, ct_err *err) {
  const ct_t5_config *c = &t->cfg;
  int64_t d = c->d_model, in = (int64_t)c->heads * c->d_kv, F = c->d_ff;
  size_t n = 3 + 9 * (size_t)c->layers;
  t->params = calloc(n, sizeof *t->params);
  t->layers = calloc((size_t)c->layers, sizeof *t->layers);
  if (!t->params || !t->layers) return ct_errf(err, CT_ERR_NOMEM, "out of memory (T5 table)");
  t->shared = add(t, "shared.weight", c->vocab, d);
  for (int l = 0; l < c->layers; l++) {
    tlayer *L = &t->layers[l];
    L->qkv = addl(t, l, "layer.0.SelfAttention.q.weight", in, d);
    addl(t, l, "layer.0.SelfAttention.k.weight", in, d);
    addl(t, l, "layer.0.SelfAttention.v.weight", in, d);
    L->o = addl(t, l, "layer.0.SelfAttention.o.weight", d, in);
    if (l == 0)
      t->relbias = addl(t, l, "layer.0.SelfAttention.relative_attention_bias.weight",
                        c->num_buckets, c->heads);
    L->ln0 = addl(t, l, "layer.0.layer_norm.weight", d, 0);
    L->wi0 = addl(t, l, "layer.1.DenseReluDense.wi_0.weight", F, d);
    L->wi1 = addl(t, l, "layer.1.DenseReluDense.wi_1.weight", F, d);
    L->wo = addl(t, l, "layer.1.DenseReluDense.wo.weight", d, F);
    L->ln1 = addl(t, l, "layer.1.layer_norm.weight", d, 0);
  }
  t->lnf = add(t, "encoder.final_layer_norm.weight", d, 0);
  CT_ASSERT(t->nparams == n);
  return CT_OK;
}

/* ---- loading ---- */

/* Tensors of a T5 checkpoint that carry nothing the encoder needs: the tied
 * copy of shared.weight, and a full model's decoder and LM head. */
static int ignorable(const char *name) {
  return !strcmp(name, "encoder.embed_tokens.weight") || !strncmp(name, "decoder.", 8) ||
         !strcmp(name, "lm_head.weight");
}

static int known(const ct_t5 *t, const char *name) {
  for (size_t i = 0; i < t->nparams; i++)
    if (!strcmp(t->params[i].name, name)) return 1;
  return 0;
}

/* shared.weight may be stored only as its tied copy encoder.embed_tokens.weight. */
static const ct_st_tensor *find_param(const ct_st_set *s, size_t i, const char *name,
                                      const char **file) {
  const ct_st_tensor *x = ct_st_set_find(s, name, file);
  if (!x && i == 0) x = ct_st_set_find(s, "encoder.embed_tokens.weight", file);
  return x;
}

/* Every matrix stored BF16 and 2-byte aligned in the mapping: keep them there. */
static int all_bf16(const ct_t5 *t, const ct_st_set *s) {
  for (size_t i = 0; i < t->nparams; i++) {
    const ct_st_tensor *x = find_param(s, i, t->params[i].name, NULL);
    if (t->params[i].ndim == 2 && t->params[i].offset != t->relbias &&
        (!x || x->dtype != CT_DTYPE_BF16 || ((uintptr_t)x->data & 1)))
      return 0;
  }
  return 1;
}

static int linear_param(const ct_t5 *t, size_t i) {
  return i > 0 && t->params[i].ndim == 2 && t->params[i].offset != t->relbias;
}

static int mappable(const ct_st_tensor *x) {
  return x->dtype == CT_DTYPE_BF16 && !((uintptr_t)x->data & 1);
}

/* prec: 0 no_change (every matrix stored BF16), 1 bf16, 2 int8-quanto, 3 int8-torchao.
 * Bytes of the owned part: int8 rows' scales, then the narrow elements. */
static void narrow_bytes(const ct_t5 *t, const ct_st_set *s, int prec, size_t *sc, size_t *el) {
  *sc = *el = 0;
  for (size_t i = 1; i < t->nparams; i++) {
    if (!linear_param(t, i)) continue;
    const tparam *p = &t->params[i];
    if (prec >= 2) {
      *sc += (size_t)p->shape[0] * sizeof(float);
      *el += p->numel;
    } else if (!mappable(find_param(s, i, p->name, NULL))) {
      *el += p->numel * 2;
    }
  }
}

/* One linear matrix into view v: mapped (stored BF16, precision no_change or
 * bf16), or converted / quantised into qbuf at *sc, *el from its float32
 * values (tmp: one matrix). */
static ct_status store_linear(ct_t5 *t, size_t i, int prec, float *tmp, size_t *sc, size_t *el,
                              ct_wview *v, ct_err *err) {
  const tparam *p = &t->params[i];
  const ct_st_tensor *x = find_param(&t->set, i, p->name, NULL);
  if (prec < 2 && mappable(x)) {
    *v = (ct_wview){CT_WDT_BF16, x->data, NULL};
    t->mbytes += p->numel * 2;
    return CT_OK;
  }
  ct_status st = ct_st_to_f32(x, tmp, p->numel, err);
  if (st) return st;
  if (prec < 2) {
    ct_to_bf16(p->numel, tmp, (uint16_t *)(t->qbuf + *el));
    *v = (ct_wview){CT_WDT_BF16, t->qbuf + *el, NULL};
    *el += p->numel * 2;
    return CT_OK;
  }
  float *scales = (float *)(t->qbuf + *sc);
  ct_quantize_int8(prec == 3 ? CT_QUANT_TORCHAO : CT_QUANT_QUANTO, (int)p->shape[0],
                   (int)p->shape[1], tmp, (int8_t *)(t->qbuf + *el), scales);
  *v = (ct_wview){CT_WDT_I8, t->qbuf + *el, scales};
  *sc += (size_t)p->shape[0] * sizeof(float);
  *el += p->numel;
  return CT_OK;
}

/* The views layout: the linear layers through views (mapped, bf16 or int8,
 * one matrix converted at a time), the embedding mapped when stored BF16;
 * the rest (norms, the bias table, an embedding not stored BF16) widened
 * into a small w, the offsets re-addressed into it. The set stays open
 * while anything is read from it. */
static ct_status view_weights(ct_t5 *t, int prec, ct_err *err) {
  const int nl = t->cfg.layers;
  size_t sc = 0, el = 0, maxm = 0;
  narrow_bytes(t, &t->set, prec, &sc, &el);
  t->qbytes = ((sc + 63) & ~(size_t)63) + el;
  t->lv = calloc((size_t)nl * 7, sizeof *t->lv);
  size_t nw = 0, *where = calloc(t->nparams, sizeof *where);
  if (!t->lv || !where) {
    free(where);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory (T5 views)");
  }
  const ct_st_tensor *e0 = find_param(&t->set, 0, t->params[0].name, NULL);
  if (mappable(e0)) {
    t->emb = e0->data;
    t->mbytes += t->params[0].numel * 2;
  }
  for (size_t i = 0; i < t->nparams; i++) {
    if (linear_param(t, i)) {
      if (t->params[i].numel > maxm) maxm = t->params[i].numel;
    } else if (i > 0 || !t->emb) {
      where[i] = nw;
      nw += t->params[i].numel;
    }
  }
  t->wfloats = nw;
  t->w = t->be->alloc(CT_MEM_OTHER, nw * sizeof(float));
  t->qbuf = t->qbytes ? t->be->alloc(CT_MEM_OTHER, t->qbytes) : NULL;
  float *tmp = t->qbytes ? t->be->alloc(CT_MEM_BUFFERS, maxm * sizeof(float)) : NULL;
  ct_status st = t->w && ((t->qbuf && tmp) || !t->qbytes)
                     ? CT_OK
                     : ct_errf(err, CT_ERR_NOMEM, "out of memory (T5 weights)");
  size_t at_sc = 0, at_el = (sc + 63) & ~(size_t)63;
  int k = 0; /* the next view: params in table order, 7 matrices per block */
  for (size_t i = 0; i < t->nparams && !st; i++) {
    const tparam *p = &t->params[i];
    if (linear_param(t, i))
      st = store_linear(t, i, prec, tmp, &at_sc, &at_el, &t->lv[k++], err);
    else if (i > 0 || !t->emb)
      st = ct_st_to_f32(find_param(&t->set, i, p->name, NULL), t->w + where[i], p->numel, err);
  }
  t->be->free(tmp);
  CT_ASSERT(st || k == 7 * nl);
  /* the offsets the forward reads, now into the small w (looked up by the
   * table's original offsets, which stay unchanged in t->params) */
  const size_t relbias = t->relbias, lnf = t->lnf;
  t->shared = where[0];
  for (size_t i = 1; i < t->nparams; i++) {
    const size_t o = t->params[i].offset;
    if (o == relbias) t->relbias = where[i];
    if (o == lnf) t->lnf = where[i];
  }
  for (int l = 0; l < nl; l++) {
    tlayer *L = &t->layers[l];
    const size_t ln0 = L->ln0, ln1 = L->ln1;
    for (size_t i = 1; i < t->nparams; i++) {
      if (t->params[i].offset == ln0) L->ln0 = where[i];
      if (t->params[i].offset == ln1) L->ln1 = where[i];
    }
  }
  free(where);
  return st;
}

static ct_status load_weights(ct_t5 *t, const char *dir, int prec, ct_err *err) {
  ct_st_set s;
  ct_st_check *chk = NULL;
  ct_status st = ct_st_set_open(&s, dir, "model.safetensors", err);
  if (st) return st;
  if ((st = ct_st_check_new(&chk, err))) goto out;
  for (size_t i = 0; i < t->nparams; i++) {
    const tparam *p = &t->params[i];
    const char *file = NULL;
    const ct_st_tensor *x = find_param(&s, i, p->name, &file);
    ct_st_check_tensor(chk, x, p->name, s.nf > 1 ? file : NULL, p->ndim, p->shape);
  }
  for (size_t k = 0; k < s.nf; k++)
    for (size_t i = 0; i < s.f[k]->ntensors; i++) {
      const char *tn = s.f[k]->tensors[i].name;
      if (!known(t, tn) && !ignorable(tn))
        ct_st_check_unexpected(chk, tn, s.nf > 1 ? s.fname[k] : NULL);
    }
  st = ct_st_check_done(chk, err,
                        "%s does not match its config.json (d_model %d, d_kv %d, d_ff %d, "
                        "layers %d, heads %d, vocab %d)",
                        dir, t->cfg.d_model, t->cfg.d_kv, t->cfg.d_ff, t->cfg.layers, t->cfg.heads,
                        t->cfg.vocab);
  if (!st && (prec || all_bf16(t, &s))) { /* views: mapped, bf16 or int8 */
    t->set = s;
    st = view_weights(t, prec, err);
    t->mapped = t->mbytes > 0;
    if (!t->mapped) ct_st_set_close(&t->set);
    return st;
  }
  t->wfloats = t->numel;
  t->w = st ? NULL : t->be->alloc(CT_MEM_OTHER, t->numel * sizeof(float));
  if (!st && !t->w)
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory: T5 encoder weights (%zu floats)", t->numel);
  for (size_t i = 0; i < t->nparams && !st; i++) {
    const tparam *p = &t->params[i];
    st = ct_st_to_f32(find_param(&s, i, p->name, NULL), t->w + p->offset, p->numel, err);
  }
out:
  ct_st_set_close(&s);
  return st;
}

static void free_scratch(ct_t5 *t) {
  float **b[] = {&t->x, &t->h, &t->big, &t->heads, &t->o, &t->f0, &t->f1, &t->rstd, &t->bias};
  for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
    t->be->free(*b[i]);
    *b[i] = NULL;
  }
  t->cap_rows = 0;
  t->bias_T = t->bias_cap = 0;
}

void ct_t5_free(ct_t5 *t) {
  if (!t) return;
  if (t->be) {
    free_scratch(t);
    t->be->free(t->w);
    t->be->free(t->qbuf);
  }
  if (t->mapped) ct_st_set_close(&t->set);
  free(t->lv);
  free(t->params);
  free(t->layers);
  free(t);
}

static int precision_code(const char *p) {
  static const char *const names[] = {"no_change", "bf16", "int8-quanto", "int8-torchao"};
  for (int i = 0; i < 4; i++)
    if (!p || !strcmp(p, names[i])) return i;
  return -1;
}

ct_status ct_t5_load_prec(const char *dir, const char *precision, ct_t5 **out, ct_err *err) {
  ct_status st = CT_OK;
  char p[4096];
  *out = NULL;
  const int prec = precision_code(precision);
  if (prec < 0)
    return ct_errf(err, CT_ERR_INVALID,
                   "T5 precision '%s': no_change, bf16, int8-quanto or int8-torchao", precision);
  ct_t5 *t = calloc(1, sizeof *t);
  if (!t) return ct_errf(err, CT_ERR_NOMEM, "out of memory (T5)");
  t->be = ct_backend_default();
  snprintf(p, sizeof p, "%s/config.json", dir);
  st = ct_t5_config_read(p, &t->cfg, err);
  if (st) goto out;
  st = build_table(t, err);
  if (st) goto out;
  /* frozen weights count as "other", as the CLIP encoder's (mapped: not at all) */
  st = load_weights(t, dir, prec, err);
  if (st) goto out;
  *out = t;
  t = NULL;
out:
  ct_t5_free(t);
  return st;
}

ct_status ct_t5_load(const char *dir, ct_t5 **out, ct_err *err) {
  return ct_t5_load_prec(dir, "no_change", out, err);
}

size_t ct_t5_weight_bytes(const ct_t5 *t) {
  return t->wfloats * sizeof(float) + t->qbytes + t->mbytes;
}

const ct_t5_config *ct_t5_cfg(const ct_t5 *t) {
  return &t->cfg;
}

size_t ct_t5_numel(const ct_t5 *t) {
  return t->numel;
}

int ct_t5_mapped(const ct_t5 *t) {
  return t->mapped;
}

ct_status ct_t5_set_backend(ct_t5 *t, const ct_backend_ops *be, ct_err *err) {
  if (!be) be = ct_backend_default();
  if (be == t->be) return CT_OK;
  if (t->lv)
    return ct_errf(err, CT_ERR_INVALID,
                   "a T5 encoder read through weight views (mapped bf16 files, bf16 or int8) "
                   "stays on %s",
                   t->be->name);
  ct_status st =
      ct_backend_move(t->be, be, CT_MEM_OTHER, t->wfloats * sizeof(float), (void **)&t->w, err);
  if (st) return st;
  free_scratch(t);
  t->be = be;
  return CT_OK;
}

/* ---- forward ---- */

int ct_t5_bucket(int rel, int num_buckets, int max_distance) {
  int half = num_buckets / 2, ret = rel > 0 ? half : 0, n = rel < 0 ? -rel : rel;
  int max_exact = half / 2;
  if (n < max_exact) return ret + n;
  /* torch: log(n / max_exact) / math.log(max_distance / max_exact) * (half - max_exact) in
   * float32, then truncated */
  float v = logf((float)n / (float)max_exact);
  v = v / (float)log((double)max_distance / (double)max_exact);
  v = v * (float)(half - max_exact);
  int large = max_exact + (int)v;
  return ret + (large < half - 1 ? large : half - 1);
}

static ct_status reserve(ct_t5 *t, size_t rows, ct_err *err) {
  if (rows <= t->cap_rows) return CT_OK;
  const ct_t5_config *c = &t->cfg;
  size_t d = (size_t)c->d_model, in = (size_t)c->heads * c->d_kv, F = (size_t)c->d_ff;
  free_scratch(t);
  t->x = t->be->alloc(CT_MEM_BUFFERS, rows * d * sizeof(float));
  t->h = t->be->alloc(CT_MEM_BUFFERS, rows * d * sizeof(float));
  t->big = t->be->alloc(CT_MEM_BUFFERS, rows * 3 * in * sizeof(float));
  t->heads = t->be->alloc(CT_MEM_BUFFERS, rows * 3 * in * sizeof(float));
  t->o = t->be->alloc(CT_MEM_BUFFERS, rows * in * sizeof(float));
  t->f0 = t->be->alloc(CT_MEM_BUFFERS, rows * F * sizeof(float));
  t->f1 = t->be->alloc(CT_MEM_BUFFERS, rows * F * sizeof(float));
  t->rstd = t->be->alloc(CT_MEM_BUFFERS, rows * sizeof(float));
  if (!t->x || !t->h || !t->big || !t->heads || !t->o || !t->f0 || !t->f1 || !t->rstd) {
    free_scratch(t);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory: T5 scratch for %zu tokens", rows);
  }
  t->cap_rows = rows;
  return CT_OK;
}

/* bias (H, T, T) = table[bucket(j - i)][h], built on the host. */
static ct_status position_bias(ct_t5 *t, int T, ct_err *err) {
  const ct_t5_config *c = &t->cfg;
  if (t->bias_T == T) return CT_OK;
  size_t n = (size_t)c->heads * T * T, nt = (size_t)c->num_buckets * c->heads;
  if (T > t->bias_cap) {
    t->be->free(t->bias);
    t->bias = t->be->alloc(CT_MEM_BUFFERS, n * sizeof(float));
    t->bias_cap = t->bias ? T : 0;
    if (!t->bias)
      return ct_errf(err, CT_ERR_NOMEM, "out of memory: T5 position bias (%d heads x %d x %d)",
                     c->heads, T, T);
  }
  float *host = malloc(n * sizeof(float)), *table = malloc(nt * sizeof(float));
  int *bucket = malloc((2 * (size_t)T - 1) * sizeof(int));
  if (!host || !table || !bucket) {
    free(host), free(table), free(bucket);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory: T5 position bias");
  }
  t->be->copy_out(table, t->w + t->relbias, nt * sizeof(float));
  for (int r = -(T - 1); r < T; r++)
    bucket[r + T - 1] = ct_t5_bucket(r, c->num_buckets, c->max_distance);
  for (int h = 0; h < c->heads; h++)
    for (int i = 0; i < T; i++)
      for (int j = 0; j < T; j++)
        host[((size_t)h * T + i) * T + j] = table[(size_t)bucket[j - i + T - 1] * c->heads + h];
  t->be->copy_in(t->bias, host, n * sizeof(float));
  free(host), free(table), free(bucket);
  t->bias_T = T;
  return CT_OK;
}

/* (B*T, 3 inner) rows laid out (3, H, d_kv) -> q, k, v each (B, H, T, d_kv). */
static void split_heads(const ct_backend_ops *be, int B, int T, int H, int hd, const float *qkv,
                        float *out) {
  size_t plane = (size_t)B * H * T * hd;
  int in = H * hd;
  for (int b = 0; b < B; b++)
    for (int s = 0; s < 3; s++)
      for (int h = 0; h < H; h++)
        be->copy_2d(T, hd, qkv + (size_t)b * T * 3 * in + (size_t)s * in + (size_t)h * hd, 3 * in,
                    out + s * plane + ((size_t)b * H + h) * T * hd, hd);
}

/* Block l's linear weight j (0..6: q, k, v, o, wi0, wi1, wo), no bias. */
static void lin(const ct_t5 *t, int l, int j, int N, int K, int M, const float *x, int ldx,
                float *y, int ldy) {
  if (t->lv) {
    t->be->linear_fwd_w(N, K, M, x, ldx, &t->lv[(size_t)l * 7 + j], NULL, y, ldy);
    return;
  }
  const tlayer *L = &t->layers[l];
  const size_t off[7] = {L->qkv, 0, 0, L->o, L->wi0, L->wi1, L->wo};
  t->be->linear_fwd(N, K, M, x, ldx, t->w + off[j], NULL, y, ldy);
}

ct_status ct_t5_encode(ct_t5 *t, const int32_t *ids, int B, int T, float *seq, ct_err *err) {
  const ct_t5_config *c = &t->cfg;
  if (B < 1 || T < 1 || (size_t)B * T > (1u << 24))
    return ct_errf(err, CT_ERR_RANGE, "T5 encoder: batch %d x %d tokens", B, T);
  if (!ids || !seq) return ct_errf(err, CT_ERR_INVALID, "T5 encoder: ids or seq is NULL");
  size_t rows = (size_t)B * T;
  for (size_t r = 0; r < rows; r++)
    if (ids[r] < 0 || ids[r] >= c->vocab)
      return ct_errf(err, CT_ERR_RANGE,
                     "T5 encoder: token id %d at caption %zu position %zu is outside [0, %d)",
                     (int)ids[r], r / (size_t)T, r % (size_t)T, c->vocab);
  ct_status st = reserve(t, rows, err);
  if (!st) st = position_bias(t, T, err);
  if (st) return st;

  const ct_backend_ops *be = t->be;
  int d = c->d_model, H = c->heads, hd = c->d_kv, in = H * hd, F = c->d_ff, N = (int)rows;
  const float *W = t->w;
  float *x = t->x, *h = t->h;
  size_t plane = (size_t)B * H * T * hd;
  for (size_t r = 0; r < rows && !t->emb; r++)
    be->copy(x + r * d, W + t->shared + (size_t)ids[r] * d, (size_t)d * sizeof(float));
  for (size_t r = 0; r < rows && t->emb; r++) /* CPU memory: the mapping is host memory */
    for (int i = 0; i < d; i++) x[r * d + i] = ct_bf16_to_f32(t->emb[(size_t)ids[r] * d + i]);
  for (int l = 0; l < c->layers; l++) {
    const tlayer *L = &t->layers[l];
    be->rmsnorm_fwd(N, d, x, d, W + L->ln0, c->eps, h, d, t->rstd);
    if (t->lv) /* q, k, v are separate tensors: three products into big's columns */
      for (int j = 0; j < 3; j++) lin(t, l, j, N, d, in, h, d, t->big + (size_t)j * in, 3 * in);
    else
      be->linear_fwd(N, d, 3 * in, h, d, W + L->qkv, NULL, t->big, 3 * in);
    split_heads(be, B, T, H, hd, t->big, t->heads);
    be->attention_bias_fwd(B, H, T, hd, 1.0f, t->bias, t->heads, t->heads + plane,
                           t->heads + 2 * plane, t->o);
    lin(t, l, 3, N, in, d, t->o, in, h, d);
    be->add_inplace(rows * d, x, h);
    be->rmsnorm_fwd(N, d, x, d, W + L->ln1, c->eps, h, d, t->rstd);
    lin(t, l, 4, N, d, F, h, d, t->f0, F);
    lin(t, l, 5, N, d, F, h, d, t->f1, F);
    be->gelu_tanh_fwd(N, F, t->f0, F, t->f0, F);
    be->mul_inplace(rows * F, t->f0, t->f1);
    lin(t, l, 6, N, F, d, t->f0, F, h, d);
    be->add_inplace(rows * d, x, h);
  }
  be->rmsnorm_fwd(N, d, x, d, W + t->lnf, c->eps, seq, d, t->rstd);
  return CT_OK;
}

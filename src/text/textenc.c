/* The frozen CLIP text encoder: parameters, seeded init, safetensors load/save
 * and the forward pass (Hugging Face CLIPTextModel semantics).
 *
 * Design: all weights live in one CT_MEM_PARAMS block described by a table of
 * HF names (without the "text_model." prefix). Within a layer q, k and v
 * weights are adjacent, and so are their biases, so the three projections are
 * one [3d, d] linear. The forward is a chain of ops of the encoder's compute
 * backend (te->be, include/ctuner/backend.h: embedding, layernorm_affine,
 * linear, attention with its causal mask, quick_gelu; the (B*T, 3d) ->
 * (3, B, H, T, hd) head split is copy_2d per head). Scratch buffers are
 * kept in the struct and grow to the largest B*T seen, so repeated encodes do
 * not allocate; hence one ct_textenc must not be used by two threads at once.
 * Not here: tokenizers (tokenizer.c), gradients (the encoder never trains).
 */
#include "ctuner/textenc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/backend.h"
#include "ctuner/kernels.h"
#include "ctuner/rng.h"
#include "ctuner/safetensors.h"
#include "text/textenc_int.h"

#define PREFIX "text_model."
#define PROJ_NAME "text_projection.weight" /* outside PREFIX, as transformers names it */
#define RNG_STREAM 0x54455854ull           /* "TEXT": distinct from the MMDiT's streams */

typedef struct tparam {
  char name[96]; /* HF name without the "text_model." prefix */
  int ndim;
  int64_t shape[2];
  size_t offset, numel; /* floats within te->w */
} tparam;

/* Offsets of one layer's tensors within te->w. */
typedef struct tlayer {
  size_t ln1_w, ln1_b, qkv_w, qkv_b, out_w, out_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
} tlayer;

struct ct_textenc {
  ct_textenc_config cfg;
  const ct_backend_ops *be; /* computes the forward; owns w and the scratch */
  tparam *params;
  size_t nparams, numel;
  float *w;
  tlayer *layers;
  size_t tok, pos, lnf_w, lnf_b;
  size_t proj; /* text_projection (cfg.projection_dim > 0) */
  /* scratch, sized for cap_rows = B*T rows */
  size_t cap_rows;
  float *x;    /* (B*T, d) residual stream */
  float *h;    /* (B*T, d) normed input / branch output */
  float *big;  /* (B*T, max(3d, intermediate)) qkv or MLP hidden */
  float *qkv;  /* (3, B, H, T, hd) heads */
  float *o;    /* (B*T, d) attention output, heads concatenated */
  float *lse;  /* (B, H, T) */
  ct_bpe *bpe; /* owned; NULL: byte tokenizer */
  /* stored narrow (ct_textenc_store): per layer the views of qkv, out, fc1,
   * fc2 into qbuf ([int8 rows' scales][bf16 or int8 elements]); w then holds
   * only the other parameters (wfloats of them) */
  ct_wview *lv;
  char *qbuf;
  size_t qbytes, wfloats;
};

void ct_textenc_config_default(int hidden, ct_textenc_config *cfg) {
  int heads = hidden / 64 > 1 ? hidden / 64 : 1;
  while (heads > 1 && hidden % heads) heads--;
  cfg->vocab = CT_TOK_BYTE_VOCAB;
  cfg->eos_id = CT_TOK_EOS;
  cfg->max_pos = 77;
  cfg->hidden = hidden;
  cfg->heads = heads;
  cfg->layers = 2;
  cfg->intermediate = 4 * hidden;
  cfg->ln_eps = 1e-5f;
  cfg->act = CT_TEXTENC_ACT_QUICK_GELU;
  cfg->pool = CT_TEXTENC_POOL_FIRST_EOS_OR_LAST;
  cfg->projection_dim = 0;
}

ct_status ct_textenc_config_validate(const ct_textenc_config *c, ct_err *err) {
  if (!c) return ct_errf(err, CT_ERR_INVALID, "text encoder config is NULL");
  if (c->vocab < 1)
    return ct_errf(err, CT_ERR_INVALID, "text encoder vocab must be >= 1 (got %d)", c->vocab);
  if (c->eos_id < 0 || c->eos_id >= c->vocab)
    return ct_errf(err, CT_ERR_INVALID, "text encoder eos_id %d is outside the vocabulary [0, %d)",
                   c->eos_id, c->vocab);
  if (c->max_pos < 1)
    return ct_errf(err, CT_ERR_INVALID, "text encoder max_pos must be >= 1 (got %d)", c->max_pos);
  if (c->hidden < 1 || c->heads < 1 || c->hidden % c->heads)
    return ct_errf(err, CT_ERR_INVALID,
                   "text encoder hidden (%d) must be >= 1 and divisible by heads (%d)", c->hidden,
                   c->heads);
  if (c->layers < 0)
    return ct_errf(err, CT_ERR_INVALID, "text encoder layers must be >= 0 (got %d)", c->layers);
  if (c->intermediate < 1)
    return ct_errf(err, CT_ERR_INVALID, "text encoder intermediate must be >= 1 (got %d)",
                   c->intermediate);
  if (!(c->ln_eps > 0.0f) || !isfinite(c->ln_eps))
    return ct_errf(err, CT_ERR_INVALID, "text encoder ln_eps must be a positive number (got %g)",
                   (double)c->ln_eps);
  if (c->act != CT_TEXTENC_ACT_QUICK_GELU && c->act != CT_TEXTENC_ACT_GELU)
    return ct_errf(err, CT_ERR_INVALID, "text encoder act %d is not an activation", c->act);
  if (c->pool < CT_TEXTENC_POOL_FIRST_EOS_OR_LAST || c->pool > CT_TEXTENC_POOL_FIRST_EOS)
    return ct_errf(err, CT_ERR_INVALID, "text encoder pool %d is not a pooling rule", c->pool);
  if (c->projection_dim < 0 || c->projection_dim > (1 << 16))
    return ct_errf(err, CT_ERR_INVALID, "text encoder projection_dim %d is outside [0, 65536]",
                   c->projection_dim);
  /* Keep every size well inside int (kernels take int dimensions). */
  if (c->hidden > (1 << 16) || c->intermediate > (1 << 18) || c->vocab > (1 << 22) ||
      c->max_pos > (1 << 16) || c->layers > 1024)
    return ct_errf(
        err, CT_ERR_RANGE,
        "text encoder config too large (hidden %d, intermediate %d, vocab %d, max_pos %d, "
        "layers %d)",
        c->hidden, c->intermediate, c->vocab, c->max_pos, c->layers);
  return CT_OK;
}

static size_t add(ct_textenc *te, const char *name, int64_t d0, int64_t d1) {
  tparam *p = &te->params[te->nparams++];
  snprintf(p->name, sizeof p->name, "%s", name);
  p->ndim = d1 ? 2 : 1;
  p->shape[0] = d0;
  p->shape[1] = d1;
  p->numel = (size_t)d0 * (size_t)(d1 ? d1 : 1);
  p->offset = te->numel;
  te->numel += p->numel;
  return p->offset;
}

static size_t addl(ct_textenc *te, int layer, const char *suffix, int64_t d0, int64_t d1) {
  char nm[96];
  snprintf(nm, sizeof nm, "encoder.layers.%d.%s", layer, suffix);
  return add(te, nm, d0, d1);
}

/* The table in the order HF's named_parameters() would give, except that
 * within self_attn the q, k, v weights come first and then their biases, which
 * makes them one contiguous [3d, d] weight and [3d] bias. */
static ct_status build_table(ct_textenc *te, ct_err *err) {
  const ct_textenc_config *c = &te->cfg;
  int64_t d = c->hidden, I = c->intermediate;
  size_t n = 4 + 16 * (size_t)c->layers + (c->projection_dim > 0);
  te->params = calloc(n, sizeof *te->params);
  te->layers = calloc(c->layers ? (size_t)c->layers : 1, sizeof *te->layers);
  if (!te->params || !te->layers)
    return ct_errf(err, CT_ERR_NOMEM, "out of memory (text encoder table)");
  te->tok = add(te, "embeddings.token_embedding.weight", c->vocab, d);
  te->pos = add(te, "embeddings.position_embedding.weight", c->max_pos, d);
  for (int l = 0; l < c->layers; l++) {
    tlayer *L = &te->layers[l];
    L->ln1_w = addl(te, l, "layer_norm1.weight", d, 0);
    L->ln1_b = addl(te, l, "layer_norm1.bias", d, 0);
    L->qkv_w = addl(te, l, "self_attn.q_proj.weight", d, d);
    addl(te, l, "self_attn.k_proj.weight", d, d);
    addl(te, l, "self_attn.v_proj.weight", d, d);
    L->qkv_b = addl(te, l, "self_attn.q_proj.bias", d, 0);
    addl(te, l, "self_attn.k_proj.bias", d, 0);
    addl(te, l, "self_attn.v_proj.bias", d, 0);
    L->out_w = addl(te, l, "self_attn.out_proj.weight", d, d);
    L->out_b = addl(te, l, "self_attn.out_proj.bias", d, 0);
    L->ln2_w = addl(te, l, "layer_norm2.weight", d, 0);
    L->ln2_b = addl(te, l, "layer_norm2.bias", d, 0);
    L->fc1_w = addl(te, l, "mlp.fc1.weight", I, d);
    L->fc1_b = addl(te, l, "mlp.fc1.bias", I, 0);
    L->fc2_w = addl(te, l, "mlp.fc2.weight", d, I);
    L->fc2_b = addl(te, l, "mlp.fc2.bias", d, 0);
  }
  te->lnf_w = add(te, "final_layer_norm.weight", d, 0);
  te->lnf_b = add(te, "final_layer_norm.bias", d, 0);
  /* last, so that the seeded tensors before it keep their streams */
  if (c->projection_dim > 0) te->proj = add(te, PROJ_NAME, c->projection_dim, d);
  CT_ASSERT(te->nparams == n);
  return CT_OK;
}

static const tparam *find(const ct_textenc *te, const char *name) {
  for (size_t i = 0; i < te->nparams; i++)
    if (!strcmp(te->params[i].name, name)) return &te->params[i];
  return NULL;
}

static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

/* HF CLIPPreTrainedModel._init_weights with initializer_factor 1 (see
 * docs/text_encoder.md). Each tensor has its own RNG stream (its table index),
 * so a tensor's values do not depend on the others' sizes or the thread count. */
static void init_params(ct_textenc *te, uint64_t seed) {
  const ct_textenc_config *c = &te->cfg;
  float d = (float)c->hidden, twoL = 2.0f * (float)(c->layers ? c->layers : 1);
  float in_std = 1.0f / sqrtf(d) / sqrtf(twoL); /* q, k, v, fc2 */
  float out_std = 1.0f / sqrtf(d);              /* out_proj */
  float fc1_std = 1.0f / sqrtf(2.0f * d);       /* fc1 */
  for (size_t i = 0; i < te->nparams; i++) {
    const tparam *p = &te->params[i];
    float *w = te->w + p->offset;
    float std = 0.0f;
    if (strstr(p->name, "layer_norm") && ends_with(p->name, ".weight")) {
      for (size_t j = 0; j < p->numel; j++) w[j] = 1.0f;
      continue;
    }
    if (ends_with(p->name, ".bias")) {
      memset(w, 0, p->numel * sizeof(float));
      continue;
    }
    if (strstr(p->name, "embedding"))
      std = 0.02f;
    else if (strstr(p->name, "out_proj"))
      std = out_std;
    else if (strstr(p->name, "fc1"))
      std = fc1_std;
    else if (!strcmp(p->name, PROJ_NAME))
      std = 1.0f / sqrtf(d); /* CLIPTextModelWithProjection: hidden_size^-0.5 */
    else
      std = in_std; /* q/k/v_proj, fc2 */
    ct_rng_fill_normal(w, p->numel, seed, RNG_STREAM + i, 0, 0.0f, std);
  }
}

ct_status ct_textenc_alloc(const ct_textenc_config *cfg, ct_textenc **out, ct_err *err) {
  ct_status st = CT_OK;
  ct_textenc *te = NULL;
  *out = NULL;
  st = ct_textenc_config_validate(cfg, err);
  if (st) goto out;
  te = calloc(1, sizeof *te);
  if (!te) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory (text encoder)");
    goto out;
  }
  te->cfg = *cfg;
  te->be = ct_backend_default();
  st = build_table(te, err);
  if (st) goto out;
  /* frozen weights: "other", so that "params" counts what is trained (ZeRO formulas) */
  te->wfloats = te->numel;
  te->w = te->be->alloc(CT_MEM_OTHER, te->numel * sizeof(float));
  if (!te->w) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory: text encoder parameters (%zu floats)",
                 te->numel);
    goto out;
  }
  *out = te;
  te = NULL;
out:
  ct_textenc_free(te);
  return st;
}

ct_status ct_textenc_new(const ct_textenc_config *cfg, uint64_t seed, ct_textenc **out,
                         ct_err *err) {
  ct_status st = ct_textenc_alloc(cfg, out, err);
  if (!st) init_params(*out, seed);
  return st;
}

static void free_scratch(ct_textenc *te) {
  te->be->free(te->x);
  te->be->free(te->h);
  te->be->free(te->big);
  te->be->free(te->qkv);
  te->be->free(te->o);
  te->be->free(te->lse);
  te->x = te->h = te->big = te->qkv = te->o = te->lse = NULL;
  te->cap_rows = 0;
}

void ct_textenc_free(ct_textenc *te) {
  if (!te) return;
  free_scratch(te);
  te->be->free(te->w);
  te->be->free(te->qbuf);
  free(te->lv);
  free(te->params);
  free(te->layers);
  ct_bpe_free(te->bpe);
  free(te);
}

const ct_backend_ops *ct_textenc_backend(const ct_textenc *te) {
  return te->be;
}

ct_status ct_textenc_set_backend(ct_textenc *te, const ct_backend_ops *be, ct_err *err) {
  if (!be) be = ct_backend_default();
  if (be == te->be) return CT_OK;
  if (te->lv)
    return ct_errf(err, CT_ERR_INVALID, "a text encoder stored bf16/int8 stays on %s",
                   te->be->name);
  ct_status st =
      ct_backend_move(te->be, be, CT_MEM_OTHER, te->numel * sizeof(float), (void **)&te->w, err);
  if (st) return st;
  free_scratch(te); /* on the old backend; the next encode allocates on the new one */
  te->be = be;
  return CT_OK;
}

ct_status ct_textenc_set_bpe(ct_textenc *te, ct_bpe *b, ct_err *err) {
  /* With the legacy argmax pooling (eos_token_id 2, FLUX.1's config) the
   * config's eos id is not used: the largest id, CLIP's <|endoftext|>, is. */
  int eos_ok = te->cfg.pool == CT_TEXTENC_POOL_ARGMAX_ID || (b && ct_bpe_eos(b) == te->cfg.eos_id);
  if (b && (ct_bpe_vocab_size(b) > te->cfg.vocab || !eos_ok)) {
    ct_status st = ct_errf(err, CT_ERR_SHAPE,
                           "tokenizer (%d ids, <|endoftext|> = %d) does not match the text encoder "
                           "(vocab %d, eos_id %d)",
                           ct_bpe_vocab_size(b), ct_bpe_eos(b), te->cfg.vocab, te->cfg.eos_id);
    ct_bpe_free(b);
    return st;
  }
  ct_bpe_free(te->bpe);
  te->bpe = b;
  return CT_OK;
}

const ct_bpe *ct_textenc_bpe(const ct_textenc *te) {
  return te->bpe;
}

int ct_textenc_tokenize(const ct_textenc *te, const char *text, int T, int32_t *ids) {
  return te->bpe ? ct_bpe_encode(te->bpe, text, T, ids) : ct_tokenize_bytes(text, T, ids);
}

const ct_textenc_config *ct_textenc_cfg(const ct_textenc *te) {
  return &te->cfg;
}

/* ---- safetensors ---- */

static int is_known_buffer(const char *name) {
  /* Older transformers versions save the position_ids buffer (an I64 arange);
   * it carries no weights. */
  return !strcmp(name, "embeddings.position_ids");
}

/* The weights from a file or a directory's (sharded) model.safetensors. The
 * prefix is whatever the files use: HF CLIPTextModel files have it, bare
 * names (as listed in docs/text_encoder.md) are accepted too; with it,
 * tensors outside text_model.* (a full CLIPModel's vision tower,
 * projections) are not ours and are ignored. */
ct_status ct_textenc_load(ct_textenc *te, const char *path, ct_err *err) {
  ct_st_set s;
  ct_st_check *chk = NULL;
  char full[128];
  const char *prefix = "", *file = NULL;
  if (te->lv)
    return ct_errf(err, CT_ERR_INVALID, "%s: the text encoder is stored bf16/int8 already", path);
  ct_status st = ct_st_set_open(&s, path, "model.safetensors", err);
  if (st) return st;
  if ((st = ct_st_check_new(&chk, err))) goto out;
  for (size_t k = 0; k < s.nf; k++)
    for (size_t i = 0; i < s.f[k]->ntensors; i++)
      if (!strncmp(s.f[k]->tensors[i].name, PREFIX, strlen(PREFIX))) prefix = PREFIX;
  size_t plen = strlen(prefix);
  for (size_t i = 0; i < te->nparams; i++) {
    const tparam *p = &te->params[i];
    snprintf(full, sizeof full, "%s%s", strcmp(p->name, PROJ_NAME) ? prefix : "", p->name);
    const ct_st_tensor *t = ct_st_set_find(&s, full, &file);
    ct_st_check_tensor(chk, t, p->name, s.nf > 1 ? file : NULL, p->ndim, p->shape);
  }
  for (size_t k = 0; k < s.nf; k++)
    for (size_t i = 0; i < s.f[k]->ntensors; i++) {
      const char *tn = s.f[k]->tensors[i].name;
      if (strncmp(tn, prefix, plen)) continue;
      if (!find(te, tn + plen) && !is_known_buffer(tn + plen))
        ct_st_check_unexpected(chk, tn, s.nf > 1 ? s.fname[k] : NULL);
    }
  st = ct_st_check_done(chk, err,
                        "%s does not match the text encoder (%zu tensors, hidden %d, layers %d, "
                        "intermediate %d, vocab %d, max_pos %d)",
                        path, te->nparams, te->cfg.hidden, te->cfg.layers, te->cfg.intermediate,
                        te->cfg.vocab, te->cfg.max_pos);
  for (size_t i = 0; i < te->nparams && !st; i++) {
    const tparam *p = &te->params[i];
    snprintf(full, sizeof full, "%s%s", strcmp(p->name, PROJ_NAME) ? prefix : "", p->name);
    st = ct_st_to_f32(ct_st_set_find(&s, full, NULL), te->w + p->offset, p->numel, err);
  }
out:
  ct_st_set_close(&s);
  return st;
}

ct_status ct_textenc_save(const ct_textenc *te, const char *path, ct_err *err) {
  ct_st_writer *w = NULL;
  char full[128];
  if (te->lv)
    return ct_errf(
        err, CT_ERR_INVALID,
        "%s: a text encoder stored bf16/int8 is not saved (its float32 weights are gone)", path);
  ct_status st = ct_st_writer_new(&w);
  if (st) return ct_errf(err, st, "out of memory");
  /* HF names with the prefix, so the file is a CLIPTextModel state dict. */
  for (size_t i = 0; i < te->nparams && !st; i++) {
    const tparam *p = &te->params[i];
    snprintf(full, sizeof full, "%s%s", strcmp(p->name, PROJ_NAME) ? PREFIX : "", p->name);
    st = ct_st_writer_add_f32(w, full, p->ndim, p->shape, te->w + p->offset, CT_DTYPE_F32, err);
  }
  if (!st) st = ct_st_writer_write(w, path, err);
  ct_st_writer_free(w);
  return st;
}

/* ---- forward ---- */

static ct_status reserve(ct_textenc *te, size_t rows, ct_err *err) {
  if (rows <= te->cap_rows) return CT_OK;
  const ct_textenc_config *c = &te->cfg;
  size_t d = (size_t)c->hidden,
         wide = 3 * d > (size_t)c->intermediate ? 3 * d : (size_t)c->intermediate;
  free_scratch(te);
  te->x = te->be->alloc(CT_MEM_BUFFERS, rows * d * sizeof(float));
  te->h = te->be->alloc(CT_MEM_BUFFERS, rows * d * sizeof(float));
  te->big = te->be->alloc(CT_MEM_BUFFERS, rows * wide * sizeof(float));
  te->qkv = te->be->alloc(CT_MEM_BUFFERS, 3 * rows * d * sizeof(float));
  te->o = te->be->alloc(CT_MEM_BUFFERS, rows * d * sizeof(float));
  te->lse = te->be->alloc(CT_MEM_BUFFERS, rows * (size_t)c->heads * sizeof(float));
  if (!te->x || !te->h || !te->big || !te->qkv || !te->o || !te->lse) {
    free_scratch(te);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory: text encoder scratch for %zu tokens", rows);
  }
  te->cap_rows = rows;
  return CT_OK;
}

/* Layer l's linear j (0..3: qkv, out_proj, fc1, fc2) with bias b. */
static void lin(const ct_textenc *te, int l, int j, int N, int K, int M, const float *x, int ldx,
                const float *b, float *y, int ldy) {
  if (te->lv) {
    te->be->linear_fwd_w(N, K, M, x, ldx, &te->lv[(size_t)l * 4 + j], b, y, ldy);
    return;
  }
  const tlayer *L = &te->layers[l];
  const size_t off[4] = {L->qkv_w, L->out_w, L->fc1_w, L->fc2_w};
  te->be->linear_fwd(N, K, M, x, ldx, te->w + off[j], b, y, ldy);
}

/* (B*T, 3d) rows laid out (3, H, hd) -> q, k, v each (B, H, T, hd): one
 * (T, hd) block per batch item, part and head. */
static void split_heads(const ct_backend_ops *be, int B, int T, int H, int hd, const float *qkv,
                        float *out) {
  size_t plane = (size_t)B * H * T * hd;
  int d = H * hd;
  for (int b = 0; b < B; b++)
    for (int s = 0; s < 3; s++)
      for (int h = 0; h < H; h++)
        be->copy_2d(T, hd, qkv + (size_t)b * T * 3 * d + (size_t)s * d + (size_t)h * hd, 3 * d,
                    out + s * plane + ((size_t)b * H + h) * T * hd, hd);
}

/* The forward: seq (final LN), pooled (at cfg.pool's position, after the
 * final LN), and hidden: the residual stream after `layer` layers (any may be
 * NULL; layer < 0: none). */
static ct_status forward(ct_textenc *te, const int32_t *ids, int B, int T, int layer, float *hidden,
                         float *seq, float *pooled, ct_err *err) {
  ct_status st = CT_OK;
  CT_ASSERT(te);
  const ct_textenc_config *c = &te->cfg;
  if (B < 1 || T < 1 || T > c->max_pos)
    return ct_errf(err, CT_ERR_RANGE,
                   "text encoder: batch %d x %d tokens; need B >= 1 and 1 <= T <= max_pos (%d)", B,
                   T, c->max_pos);
  if (!ids) return ct_errf(err, CT_ERR_INVALID, "text encoder: ids is NULL");
  size_t rows = (size_t)B * T;
  for (size_t r = 0; r < rows; r++)
    if (ids[r] < 0 || ids[r] >= c->vocab)
      return ct_errf(err, CT_ERR_RANGE,
                     "text encoder: token id %d at caption %zu position %zu is outside [0, %d)",
                     (int)ids[r], r / (size_t)T, r % (size_t)T, c->vocab);
  st = reserve(te, rows, err);
  if (st) return st;

  int d = c->hidden, H = c->heads, hd = d / H, I = c->intermediate, N = (int)rows;
  const ct_backend_ops *be = te->be;
  float *x = te->x, *h = te->h, *big = te->big, *o = te->o;
  const float *W = te->w;
  size_t plane = rows * (size_t)d;

  be->embedding_fwd(N, T, d, ids, W + te->tok, W + te->pos, x);
  if (hidden && layer == 0) be->copy(hidden, x, plane * sizeof(float));
  for (int l = 0; l < c->layers; l++) {
    const tlayer *L = &te->layers[l];
    /* x += out_proj(attn(LN1(x))); HF multiplies q by hd^-1/2, the kernel
     * scales the scores: the same product. */
    be->layernorm_affine_fwd(N, d, x, d, W + L->ln1_w, W + L->ln1_b, c->ln_eps, h, d);
    lin(te, l, 0, N, d, 3 * d, h, d, W + L->qkv_b, big, 3 * d);
    split_heads(be, B, T, H, hd, big, te->qkv);
    be->attention_fwd(B, H, T, hd, 1.0f / sqrtf((float)hd), 1, te->qkv, te->qkv + plane,
                      te->qkv + 2 * plane, o, te->lse);
    lin(te, l, 1, N, d, d, o, d, W + L->out_b, h, d);
    be->add_inplace(plane, x, h);
    /* x += fc2(quick_gelu(fc1(LN2(x)))) */
    be->layernorm_affine_fwd(N, d, x, d, W + L->ln2_w, W + L->ln2_b, c->ln_eps, h, d);
    lin(te, l, 2, N, d, I, h, d, W + L->fc1_b, big, I);
    if (c->act == CT_TEXTENC_ACT_GELU)
      be->gelu_erf_fwd(N, I, big, I, big, I);
    else
      be->quick_gelu_fwd(N, I, big, I, big, I);
    lin(te, l, 3, N, I, d, big, I, W + L->fc2_b, h, d);
    be->add_inplace(plane, x, h);
    if (hidden && layer == l + 1) be->copy(hidden, x, plane * sizeof(float));
  }
  if (!seq && !pooled) return CT_OK;
  float *y = seq ? seq : h;
  be->layernorm_affine_fwd(N, d, x, d, W + te->lnf_w, W + te->lnf_b, c->ln_eps, y, d);
  if (pooled) {
    for (int b = 0; b < B; b++) {
      const int32_t *row = ids + (size_t)b * T;
      int at = c->pool == CT_TEXTENC_POOL_FIRST_EOS_OR_LAST ? T - 1 : 0;
      if (c->pool == CT_TEXTENC_POOL_ARGMAX_ID) {
        for (int t = 1; t < T; t++)
          if (row[t] > row[at]) at = t;
      } else {
        for (int t = 0; t < T; t++)
          if (row[t] == c->eos_id) {
            at = t;
            break;
          }
      }
      be->copy(pooled + (size_t)b * d, y + ((size_t)b * T + at) * d, (size_t)d * sizeof(float));
    }
  }
  return CT_OK;
}

ct_status ct_textenc_encode(ct_textenc *te, const int32_t *ids, int B, int T, float *seq,
                            float *pooled, ct_err *err) {
  return forward(te, ids, B, T, -1, NULL, seq, pooled, err);
}

ct_status ct_textenc_encode_hidden(ct_textenc *te, const int32_t *ids, int B, int T, int layer,
                                   float *hidden, float *embeds, ct_err *err) {
  const ct_textenc_config *c = &te->cfg;
  if (hidden && (layer < 0 || layer > c->layers))
    return ct_errf(err, CT_ERR_RANGE, "text encoder: hidden_states[%d] of %d layers", layer,
                   c->layers);
  const int d = c->hidden, P = c->projection_dim;
  float *pooled = NULL;
  if (embeds && P > 0) {
    pooled = te->be->alloc(CT_MEM_BUFFERS, (size_t)B * d * sizeof(float));
    if (!pooled) return ct_errf(err, CT_ERR_NOMEM, "out of memory (pooled text)");
  } else {
    pooled = embeds;
  }
  ct_status st = forward(te, ids, B, T, hidden ? layer : -1, hidden, NULL, pooled, err);
  if (!st && embeds && P > 0) /* text_embeds = text_projection(pooled_output) */
    te->be->linear_fwd(B, d, P, pooled, d, te->w + te->proj, NULL, embeds, P);
  if (pooled != embeds) te->be->free(pooled);
  return st;
}

/* ---- stored narrow (text_encoder_1_precision) ---- */

static int linear_weight(const tparam *p) {
  /* text_projection stays float32: one small GEMV per caption */
  return p->ndim == 2 && !strstr(p->name, "embedding") && strcmp(p->name, PROJ_NAME);
}

static size_t remap(const ct_textenc *te, const size_t *neu, size_t old) {
  for (size_t i = 0; i < te->nparams; i++)
    if (te->params[i].offset == old) return neu[i];
  CT_ASSERT(0);
  return 0;
}

/* Every linear weight (q, k, v, out_proj, fc1, fc2) from the float32 w into
 * qbuf, in table order (q, k, v adjacent: one [3d, d] view); w is then
 * rebuilt with the other parameters alone and the offsets re-addressed. */
static ct_status store_linears(ct_textenc *te, int prec, size_t sc, ct_err *err) {
  const ct_quant_kind kind = prec == 3 ? CT_QUANT_TORCHAO : CT_QUANT_QUANTO;
  size_t at_sc = 0, at_el = (sc + 63) & ~(size_t)63, nw = 0;
  size_t *neu = calloc(te->nparams, sizeof *neu);
  if (!neu) return ct_errf(err, CT_ERR_NOMEM, "out of memory (text encoder views)");
  for (size_t i = 0; i < te->nparams; i++) {
    const tparam *p = &te->params[i];
    const float *src = te->w + p->offset;
    if (!linear_weight(p)) {
      neu[i] = nw;
      nw += p->numel;
      continue;
    }
    for (int l = 0; l < te->cfg.layers; l++) {
      const tlayer *L = &te->layers[l];
      const size_t first[4] = {L->qkv_w, L->out_w, L->fc1_w, L->fc2_w};
      for (int j = 0; j < 4; j++)
        if (first[j] == p->offset)
          te->lv[(size_t)l * 4 + j] =
              (ct_wview){prec == 1 ? CT_WDT_BF16 : CT_WDT_I8, te->qbuf + at_el,
                         prec == 1 ? NULL : (const float *)(te->qbuf + at_sc)};
    }
    if (prec == 1) {
      ct_to_bf16(p->numel, src, (uint16_t *)(te->qbuf + at_el));
      at_el += p->numel * 2;
    } else {
      ct_quantize_int8(kind, (int)p->shape[0], (int)p->shape[1], src, (int8_t *)(te->qbuf + at_el),
                       (float *)(te->qbuf + at_sc));
      at_sc += (size_t)p->shape[0] * sizeof(float);
      at_el += p->numel;
    }
  }
  float *w = te->be->alloc(CT_MEM_OTHER, nw * sizeof(float));
  ct_status st = w ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory (text encoder)");
  for (size_t i = 0; i < te->nparams && !st; i++)
    if (!linear_weight(&te->params[i]))
      te->be->copy(w + neu[i], te->w + te->params[i].offset, te->params[i].numel * sizeof(float));
  if (!st) {
    for (int l = 0; l < te->cfg.layers; l++) {
      tlayer *L = &te->layers[l];
      size_t *f[8] = {&L->ln1_w, &L->ln1_b, &L->qkv_b, &L->out_b,
                      &L->ln2_w, &L->ln2_b, &L->fc1_b, &L->fc2_b};
      for (int k = 0; k < 8; k++) *f[k] = remap(te, neu, *f[k]);
    }
    te->tok = remap(te, neu, te->tok), te->pos = remap(te, neu, te->pos);
    te->lnf_w = remap(te, neu, te->lnf_w), te->lnf_b = remap(te, neu, te->lnf_b);
    if (te->cfg.projection_dim > 0) te->proj = remap(te, neu, te->proj);
    te->be->free(te->w);
    te->w = w;
    te->wfloats = nw;
  }
  free(neu);
  return st;
}

ct_status ct_textenc_store(ct_textenc *te, const char *precision, ct_err *err) {
  static const char *const names[] = {"no_change", "bf16", "int8-quanto", "int8-torchao"};
  int prec = -1;
  for (int i = 0; i < 4; i++)
    if (precision && !strcmp(precision, names[i])) prec = i;
  if (prec < 0)
    return ct_errf(err, CT_ERR_INVALID,
                   "text encoder precision '%s': no_change, bf16, int8-quanto or int8-torchao",
                   precision ? precision : "(null)");
  if (prec == 0) return CT_OK;
  if (te->lv) return ct_errf(err, CT_ERR_INVALID, "the text encoder is stored narrow already");
  size_t sc = 0, el = 0;
  for (size_t i = 0; i < te->nparams; i++)
    if (linear_weight(&te->params[i])) {
      sc += prec == 1 ? 0 : (size_t)te->params[i].shape[0] * sizeof(float);
      el += te->params[i].numel * (prec == 1 ? 2 : 1);
    }
  te->qbytes = ((sc + 63) & ~(size_t)63) + el;
  te->lv = calloc(te->cfg.layers ? (size_t)te->cfg.layers * 4 : 1, sizeof *te->lv);
  te->qbuf = te->be->alloc(CT_MEM_OTHER, te->qbytes ? te->qbytes : 64);
  if (!te->lv || !te->qbuf) return ct_errf(err, CT_ERR_NOMEM, "out of memory (text encoder)");
  return store_linears(te, prec, sc, err);
}

size_t ct_textenc_weight_bytes(const ct_textenc *te) {
  return te->wfloats * sizeof(float) + te->qbytes;
}

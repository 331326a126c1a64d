/* unet_lora.c: the U-net's Linear layers a LoRA target list names, matched
 * as peft matches target_modules given as strings (tuners_utils.py,
 * check_target_module_exists: the module's name equals the target or ends
 * with "." + target). SimpleTuner's SDXL default is the attention
 * projections (helpers/models/sdxl/model.py, DEFAULT_LORA_TARGET). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/rng.h"
#include "unet_int.h"

static int peft_match(const char *module, const char *target, size_t tl) {
  const size_t ml = strlen(module);
  if (ml == tl && !strncmp(module, target, tl)) return 1;
  return ml > tl && module[ml - tl - 1] == '.' && !strncmp(module + ml - tl, target, tl);
}

/* the module of a ".weight" entry, or 0 */
static int module_of(const ct_unet_param *p, char *out, size_t n) {
  const size_t l = strlen(p->name);
  if (l < 8 || strcmp(p->name + l - 7, ".weight") || l - 7 >= n) return 0;
  memcpy(out, p->name, l - 7);
  out[l - 7] = 0;
  return 1;
}

static ct_status match_one(const ct_unet *u, const char *t, size_t tl, ct_unet_linear **out,
                           size_t *n, size_t *cap, ct_err *err) {
  size_t found = 0;
  for (size_t i = 0; i < u->np; i++) {
    const ct_unet_param *p = &u->params[i];
    char mod[112];
    if (!module_of(p, mod, sizeof mod) || !peft_match(mod, t, tl)) continue;
    if (p->ndim != 2)
      return ct_errf(err, CT_ERR_UNSUPPORTED,
                     "LoRA target \"%.*s\" names %s, a %s: ctuner's U-net LoRA adapts Linear "
                     "layers only",
                     (int)tl, t, mod, p->ndim == 4 ? "convolution" : "norm");
    for (size_t k = 0; k < *n; k++)
      if (!strcmp((*out)[k].name, mod)) goto next; /* named by two targets */
    if (*n == *cap) {
      size_t nc = *cap ? *cap * 2 : 64;
      ct_unet_linear *nl = realloc(*out, nc * sizeof *nl);
      if (!nl) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
      *out = nl, *cap = nc;
    }
    ct_unet_linear *l = &(*out)[(*n)++];
    memset(l, 0, sizeof *l);
    memcpy(l->name, mod, sizeof l->name);
    l->out = (int)p->shape[0], l->in = (int)p->shape[1], l->w = p->offset;
    l->b = i + 1 < u->np && !strncmp(u->params[i + 1].name, mod, strlen(mod)) &&
                   !strcmp(u->params[i + 1].name + strlen(mod), ".bias")
               ? u->params[i + 1].offset
               : (size_t)-1;
  next:
    found++;
  }
  return found ? CT_OK
               : ct_errf(err, CT_ERR_NOT_FOUND,
                         "LoRA target \"%.*s\" matches no module of the U-net (peft matches a "
                         "module name or its dotted suffix: to_q, attn2.to_k, ff.net.2, ...)",
                         (int)tl, t);
}

ct_status ct_unet_lora_targets(const ct_unet_config *c, const char *targets, ct_unet_linear **out,
                               size_t *n, ct_err *err) {
  *out = NULL, *n = 0;
  if (!targets || !*targets) targets = CT_UNET_LORA_DEFAULT;
  ct_status st = ct_unet_config_validate(c, err);
  if (st) return st;
  ct_unet u = {0};
  u.cfg = *c;
  st = ct_unet_build(&u, err);
  size_t cap = 0;
  for (const char *t = targets; !st && *t;) {
    const char *e = strchr(t, ',');
    size_t tl = e ? (size_t)(e - t) : strlen(t);
    while (tl && t[0] == ' ') t++, tl--;
    while (tl && t[tl - 1] == ' ') tl--;
    if (tl) st = match_one(&u, t, tl, out, n, &cap, err);
    t = e ? e + 1 : t + strlen(t);
  }
  ct_unet_unbuild(&u);
  if (st) free(*out), *out = NULL, *n = 0;
  return st;
}

/* ------------------------------------------------------------ the adapters */

#define STREAM_UNET_LORA_INIT 0x554c4f5200000000ull /* "ULOR": init draws, + adapter index */

ct_status ct_unet_lora_new(const ct_unet_config *c, const char *targets, int rank, double alpha,
                           ct_unet_lora **out, ct_err *err) {
  *out = NULL;
  if (rank < 1) return ct_errf(err, CT_ERR_INVALID, "lora_rank %d: must be at least 1", rank);
  if (!(alpha > 0)) return ct_errf(err, CT_ERR_INVALID, "lora_alpha %g: must be positive", alpha);
  ct_unet_linear *lin = NULL;
  size_t n = 0;
  ct_status st = ct_unet_lora_targets(c, targets, &lin, &n, err);
  if (st) return st;
  ct_unet_lora *l = calloc(1, sizeof *l);
  if (l) l->ad = calloc(n, sizeof *l->ad);
  if (!l || !l->ad) {
    free(lin), free(l);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  l->cfg = *c, l->nad = n, l->rank = rank, l->alpha = alpha;
  l->scale = (float)(alpha / rank); /* peft's scaling = lora_alpha / r (use_rslora False) */
  l->be = ct_backend_default();
  for (size_t i = 0; i < n; i++) {
    ct_unet_adapter *a = &l->ad[i];
    a->lin = lin[i];
    if (!st && (rank > a->lin.in || rank > a->lin.out))
      st = ct_errf(err, CT_ERR_INVALID, "lora_rank %d is above %s's smaller side (%d x %d)", rank,
                   a->lin.name, a->lin.out, a->lin.in);
    a->a_off = l->numel, l->numel += (size_t)rank * a->lin.in;
    a->b_off = l->numel, l->numel += (size_t)a->lin.out * rank;
  }
  free(lin);
  if (!st) {
    l->w = l->be->alloc(CT_MEM_PARAMS, l->numel * sizeof(float));
    if (!l->w) st = ct_errf(err, CT_ERR_NOMEM, "out of memory for %zu LoRA parameters", l->numel);
  }
  if (st) {
    ct_unet_lora_free(l);
    return st;
  }
  l->be->zero(l->numel, l->w);
  *out = l;
  return CT_OK;
}

void ct_unet_lora_free(ct_unet_lora *l) {
  if (!l) return;
  l->be->free(l->swapped ? l->swapped : l->w);
  l->be->free(l->g);
  l->be->free(l->scratch);
  free(l->ad);
  free(l);
}

const ct_unet_adapter *ct_unet_lora_adapters(const ct_unet_lora *l, size_t *n) {
  *n = l->nad;
  return l->ad;
}
int ct_unet_lora_rank(const ct_unet_lora *l) {
  return l->rank;
}
double ct_unet_lora_alpha(const ct_unet_lora *l) {
  return l->alpha;
}
size_t ct_unet_lora_numel(const ct_unet_lora *l) {
  return l->numel;
}
float *ct_unet_lora_params(ct_unet_lora *l) {
  return l->w;
}
float *ct_unet_lora_grads(ct_unet_lora *l) {
  if (!l->g && (l->g = l->be->alloc(CT_MEM_GRADS, l->numel * sizeof(float))))
    l->be->zero(l->numel, l->g);
  return l->g;
}
float *ct_unet_lora_swap_params(ct_unet_lora *l, float *w) { /* as ct_unet_swap_params */
  float *old = l->w;
  if (!l->swapped) l->swapped = old;
  l->w = w;
  if (w == l->swapped) l->swapped = NULL; /* swapped back */
  return old;
}

ct_status ct_unet_lora_set_backend(ct_unet_lora *l, const ct_backend_ops *be, ct_err *err) {
  if (!be) be = ct_backend_default();
  if (be == l->be) return CT_OK;
  if (l->swapped)
    return ct_errf(err, CT_ERR_INVALID, "the LoRA parameters are swapped for a host copy");
  const size_t bytes = l->numel * sizeof(float);
  ct_status st = ct_backend_move(l->be, be, CT_MEM_PARAMS, bytes, (void **)&l->w, err);
  if (!st && l->g) st = ct_backend_move(l->be, be, CT_MEM_GRADS, bytes, (void **)&l->g, err);
  if (st) return st; /* (a failed gradient move leaves w moved: the caller frees l) */
  l->be->free(l->scratch);
  l->scratch = NULL, l->scratch_n = 0;
  l->be = be;
  return CT_OK;
}

ct_status ct_unet_lora_init_range(const ct_unet_lora *l, const char *init_type, uint64_t seed,
                                  size_t lo, size_t hi, float *out, ct_err *err) {
  const int gauss = init_type && !strcmp(init_type, "gaussian");
  if (!gauss && init_type && strcmp(init_type, "default"))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "lora_init_type '%s' is not supported; use default or gaussian", init_type);
  memset(out, 0, (hi - lo) * sizeof(float)); /* B starts at zero, as peft's */
  for (size_t i = 0; i < l->nad; i++) {
    const ct_unet_adapter *a = &l->ad[i];
    const size_t s = a->a_off, e = s + (size_t)l->rank * a->lin.in;
    const size_t x0 = s > lo ? s : lo, x1 = e < hi ? e : hi;
    if (x0 >= x1) continue;
    if (gauss) /* peft layer.py reset_lora_parameters: nn.init.normal_(A, std=1/r) */
      ct_rng_fill_normal(out + (x0 - lo), x1 - x0, seed, STREAM_UNET_LORA_INIT + i, x0 - s, 0.0f,
                         1.0f / (float)l->rank);
    else { /* kaiming_uniform_(A, a=sqrt(5)): bound = 1/sqrt(fan_in) */
      const float b = 1.0f / sqrtf((float)a->lin.in);
      ct_rng_fill_uniform(out + (x0 - lo), x1 - x0, seed, STREAM_UNET_LORA_INIT + i, x0 - s, -b, b);
    }
  }
  return CT_OK;
}

ct_status ct_unet_lora_init(ct_unet_lora *l, const char *init_type, uint64_t seed, ct_err *err) {
  float *h = malloc((l->numel ? l->numel : 1) * sizeof(float));
  if (!h) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = ct_unet_lora_init_range(l, init_type, seed, 0, l->numel, h, err);
  if (!st) l->be->copy_in(l->w, h, l->numel * sizeof(float));
  free(h);
  return st;
}

/* --------------------------------------------------- forward and backward */

int ul_find(const ct_unet_lora *l, size_t w_off) {
  for (size_t i = 0; i < l->nad; i++)
    if (l->ad[i].lin.w == w_off) return (int)i;
  return -1;
}

static float *scratch(ct_unet_lora *l, size_t n) {
  if (n <= l->scratch_n) return l->scratch;
  l->be->free(l->scratch);
  l->scratch = l->be->alloc(CT_MEM_BUFFERS, n * sizeof(float));
  l->scratch_n = l->scratch ? n : 0;
  return l->scratch;
}

int ul_fwd(ct_unet_lora *l, const ct_backend_ops *be, int ad, int N, const float *x, float *y,
           int ldy) {
  const ct_unet_adapter *a = &l->ad[ad];
  const int r = l->rank, in = a->lin.in, out = a->lin.out;
  float *u = scratch(l, (size_t)N * r);
  if (!u) return 0;
  be->sgemm(0, 1, N, r, in, 1.0f, x, in, l->w + a->a_off, in, 0.0f, u, r);
  be->sgemm(0, 1, N, out, r, l->scale, u, r, l->w + a->b_off, r, 1.0f, y, ldy);
  return 1;
}

int ul_bwd(ct_unet_lora *l, const ct_backend_ops *be, int ad, int N, const float *x,
           const float *dy, float *dx) {
  const ct_unet_adapter *a = &l->ad[ad];
  const int r = l->rank, in = a->lin.in, out = a->lin.out;
  float *g = ct_unet_lora_grads(l), *u = scratch(l, 2 * (size_t)N * r);
  if (!g || !u) return 0;
  float *gu = u + (size_t)N * r;
  be->sgemm(0, 1, N, r, in, 1.0f, x, in, l->w + a->a_off, in, 0.0f, u, r); /* u = x A^T */
  /* dB += scale dy^T u; gu = dy B; dA += scale gu^T x; dx += scale gu A */
  be->sgemm(1, 0, out, r, N, l->scale, dy, out, u, r, 1.0f, g + a->b_off, r);
  be->sgemm(0, 0, N, r, out, 1.0f, dy, out, l->w + a->b_off, r, 0.0f, gu, r);
  be->sgemm(1, 0, r, in, N, l->scale, gu, r, x, in, 1.0f, g + a->a_off, in);
  if (dx) be->sgemm(0, 0, N, in, r, l->scale, gu, r, l->w + a->a_off, in, 1.0f, dx, in);
  return 1;
}

/* ------------------------------------------------ attaching and merging */

ct_status ct_unet_set_lora(ct_unet *u, ct_unet_lora *l, ct_err *err) {
  if (l && memcmp(&l->cfg, &u->cfg, sizeof l->cfg))
    return ct_errf(err, CT_ERR_INVALID, "the LoRA adapters were made for another U-net config");
  if (l && l->be != u->be)
    return ct_errf(err, CT_ERR_INVALID,
                   "the LoRA adapters live on backend %s, the U-net on %s (move them first)",
                   l->be->name, u->be->name);
  u->lora = l;
  return CT_OK;
}

void ct_unet_set_frozen(ct_unet *u, int frozen) {
  u->frozen = frozen != 0;
}

ct_status ct_unet_lora_merge(ct_unet *u, const ct_unet_lora *l, int sign, ct_err *err) {
  if (memcmp(&l->cfg, &u->cfg, sizeof l->cfg) || l->be != u->be)
    return ct_errf(err, CT_ERR_INVALID,
                   "LoRA merge: the adapters belong to another U-net config or backend");
  if (u->swapped || l->swapped)
    return ct_errf(err, CT_ERR_INVALID, "LoRA merge: parameters are swapped for a host copy");
  for (size_t i = 0; i < l->nad; i++) { /* W[out, in] += sign scale B[out, r] A[r, in] */
    const ct_unet_adapter *a = &l->ad[i];
    u->be->sgemm(0, 0, a->lin.out, a->lin.in, l->rank, (float)sign * l->scale, l->w + a->b_off,
                 l->rank, l->w + a->a_off, a->lin.in, 1.0f, u->w + a->lin.w, a->lin.in);
  }
  return CT_OK;
}

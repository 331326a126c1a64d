/* LyCORIS adapters (src/model/lycoris.c, lora.c's LoHa/LoKr path) against
 * LyCORIS (lycoris-lora from PyPI) on diffusers' FluxTransformer2DModel
 * (scripts/lycoris_golden.py, tests/data/lycoris; the base and inputs are
 * tests/data/lora/m3): for each lycoris_config (locon, loha, lokr with
 * module_algo_map / name_algo_map, lokr full_matrix, lokr decompose_both),
 * with LyCORIS's file as the initial weights, the output equals the one
 * through create_lycoris_from_weights, the loss and every adapter gradient
 * are within 1e-4 of LyCORIS's (relative to the tensor's largest), and the
 * file ctuner saves holds LyCORIS's names, shapes, values and alphas; the
 * initialisations leave the base's output unchanged; the errors name the key.
 * CT_LYCORIS_DATA overrides the data directory (make interop: fresh goldens);
 * CT_LYCORIS_SAVED keeps the saved files there (make interop loads them
 * with create_lycoris_from_weights). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "ctuner/lora.h"
#include "ctuner/mmdit.h"
#include "ctuner/safetensors.h"
#include "harness.h"
#include "model/lora_impl.h" /* kron_chunk: LoKr in several token passes */

#define REQUIRE_V(cond, v)                                                         \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      fprintf(stderr, "  %s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
      *ct_failed_ = 1;                                                             \
      return v;                                                                    \
    }                                                                              \
  } while (0)

#define data(rel) ct_test_data_in("CT_LYCORIS_DATA", "lycoris", rel)
#define base(rel) ct_test_data_in("CT_LORA_DATA", "lora", rel)
#define tensor ct_test_tensor

static const char *const CONFIGS[] = {"locon", "loha", "lokr", "lokr_full", "lokr_both"};

typedef struct run {
  ct_mmdit *m;
  ct_mmdit_batch b;
  float *x, *v, *vp, *target, *dv;
  int B, C, H, W;
  size_t nx;
} run;

static void run_free(run *r) {
  free(r->x), free(r->v), free(r->vp), free(r->target), free(r->dv);
  free((void *)r->b.t), free((void *)r->b.txt), free((void *)r->b.y), free((void *)r->b.guidance);
  ct_mmdit_free(r->m);
}

/* The m3 transformer and the golden inputs. */
static int run_open(run *r, int *ct_failed_) {
  ct_err e;
  ct_st_file *in = NULL;
  memset(r, 0, sizeof *r);
  REQUIRE_V(!ct_mmdit_open_diffusers(base("m3/transformer"), 0, &r->m, &e), 0);
  REQUIRE_V(!ct_st_open(base("m3/inputs.safetensors"), &in, &e), 0);
  const ct_st_tensor *hs = ct_st_find(in, "hidden_states"),
                     *eh = ct_st_find(in, "encoder_hidden_states");
  REQUIRE_V(hs && eh, 0);
  r->B = (int)hs->shape[0];
  r->C = ct_mmdit_cfg(r->m)->in_channels;
  r->H = r->W = 4;
  r->nx = (size_t)r->B * r->C * r->H * r->W;
  float *packed = tensor(in, "hidden_states", NULL);
  r->x = malloc(r->nx * 4), r->v = malloc(r->nx * 4), r->vp = malloc(r->nx * 4);
  r->dv = malloc(r->nx * 4);
  r->target = tensor(in, "target", NULL);
  r->b = (ct_mmdit_batch){r->B,
                          r->H,
                          r->W,
                          (int)eh->shape[1],
                          r->x,
                          tensor(in, "timestep", NULL),
                          tensor(in, "encoder_hidden_states", NULL),
                          tensor(in, "pooled_projections", NULL),
                          tensor(in, "guidance", NULL)};
  ct_st_close(in);
  REQUIRE_V(packed && r->x && r->v && r->vp && r->dv && r->target && r->b.t && r->b.txt && r->b.y &&
                r->b.guidance,
            0);
  ct_flux_unpack(r->B, r->C, r->H, r->W, packed, r->x);
  free(packed);
  return 1;
}

/* Forward (packed output in r->vp), the loss, and dL/dv in r->dv. */
static double forward_loss(run *r, int *ct_failed_) {
  ct_err e;
  REQUIRE_V(!ct_mmdit_forward(r->m, &r->b, r->v, &e) || !fprintf(stderr, "%s\n", e.msg), NAN);
  ct_flux_pack(r->B, r->C, r->H, r->W, r->v, r->vp);
  double loss = 0;
  float *d = malloc(r->nx * 4);
  REQUIRE_V(d, NAN);
  for (size_t i = 0; i < r->nx; i++) {
    loss += ((double)r->vp[i] - r->target[i]) * ((double)r->vp[i] - r->target[i]);
    d[i] = 2.0f * (r->vp[i] - r->target[i]) / (float)r->nx;
  }
  ct_flux_unpack(r->B, r->C, r->H, r->W, d, r->dv);
  free(d);
  return loss / (double)r->nx;
}

/* The file ctuner writes equals LyCORIS's: names, shapes, values, alphas, metadata. */
static void check_saved(const char *name, ct_lora *l, const char *src, int *ct_failed_) {
  ct_err e;
  char out[4200];
  const char *keep = getenv("CT_LYCORIS_SAVED");
  snprintf(out, sizeof out, "%s/%s.safetensors", keep ? keep : ct_test_tmpdir(), name);
  ct_st_file *a = NULL, *b = NULL;
  REQUIRE_V(!ct_lora_save(l, ct_lora_params(l), out, &e) || !fprintf(stderr, "%s\n", e.msg), );
  REQUIRE_V(!ct_st_open(src, &a, &e) && !ct_st_open(out, &b, &e), );
  CHECKF(a->ntensors == b->ntensors, "%s: LyCORIS's file %zu tensors, ctuner's %zu", name,
         a->ntensors, b->ntensors);
  for (size_t i = 0; i < a->ntensors; i++) {
    const ct_st_tensor *x = &a->tensors[i], *y = ct_st_find(b, x->name);
    CHECKF(y, "%s: the saved file lacks %s", name, x->name);
    if (!y) continue;
    CHECKF(y->ndim == x->ndim && y->numel == x->numel && y->dtype == CT_DTYPE_F32 &&
               x->dtype == CT_DTYPE_F32 && !memcmp(x->data, y->data, x->numel * 4),
           "%s: %s differs", name, x->name);
  }
  CHECKF(ct_st_meta(b, "lycoris_config"), "%s: no lycoris_config metadata", name);
  ct_st_close(a);
  ct_st_close(b);
}

static void check_config(const char *name, size_t chunk, int *ct_failed_) {
  char rel[256];
  ct_err e;
  run r;
  ct_lora *l = NULL;
  ct_st_file *g = NULL;
  if (!run_open(&r, ct_failed_)) return;
  snprintf(rel, sizeof rel, "%s/config.json", name);
  REQUIRE_V(!ct_lycoris_new(ct_mmdit_cfg(r.m), data(rel), CT_LORA_GRADS, &l, &e) ||
                !fprintf(stderr, "%s\n", e.msg), );
  l->kron_chunk = chunk;
  snprintf(rel, sizeof rel, "%s/pytorch_lora_weights.safetensors", name);
  const char *src = data(rel);
  REQUIRE_V(!ct_lora_load(l, src, 0, ct_lora_numel(l), ct_lora_params(l), &e) ||
                !fprintf(stderr, "%s\n", e.msg), );
  ct_mmdit_set_lora(r.m, l);
  ct_mmdit_set_frozen(r.m, 1);
  snprintf(rel, sizeof rel, "%s/golden.safetensors", name);
  REQUIRE_V(!ct_st_open(data(rel), &g, &e), );
  const double loss = forward_loss(&r, ct_failed_);
  size_t no = 0;
  float *lref = tensor(g, "loss", NULL), *oref = tensor(g, "out", &no);
  REQUIRE_V(lref && oref && no == r.nx, );
  const double el = fabs(loss - lref[0]) / fabs(lref[0]), eo = ct_test_rel_err(r.vp, oref, no);
  CHECKF(el <= 1e-4, "%s: loss %.9g, LyCORIS %.9g (%.3g)", name, loss, lref[0], el);
  CHECKF(eo <= 1e-4, "%s: output differs from create_lycoris_from_weights's by %.3g", name, eo);
  REQUIRE_V(!ct_mmdit_backward(r.m, r.dv, &e) || !fprintf(stderr, "%s\n", e.msg), );
  size_t nad, ngold = 0, nours = 0;
  const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
  for (size_t i = 0; i < g->ntensors; i++) ngold += !strncmp(g->tensors[i].name, "grad.", 5);
  double worst = 0;
  for (size_t i = 0; i < nad; i++)
    for (int k = 0; k < ad[i].nt; k++, nours++) {
      char tn[200], gn[220];
      ct_lora_tensor_fullname(l, &ad[i], k, tn, sizeof tn);
      snprintf(gn, sizeof gn, "grad.%s", tn);
      size_t n = 0;
      float *ref = tensor(g, gn, &n);
      CHECKF(ref, "%s: LyCORIS has no gradient %s", name, gn);
      if (!ref) continue;
      const double er = ct_test_rel_err(ct_lora_grads(l) + ad[i].t[k].off, ref, n);
      worst = ct_test_max(worst, er);
      CHECKF(er <= 1e-4, "%s: gradient of %s differs from LyCORIS's by %.3g", name, tn, er);
      free(ref);
    }
  CHECKF(ngold == nours, "%s: LyCORIS trains %zu tensors, ctuner %zu", name, ngold, nours);
  fprintf(stderr,
          "  %-10s %3zu modules: loss %.2g, output %.2g, worst gradient %.2g (rel. to max)\n", name,
          nad, el, eo, worst);
  check_saved(name, l, src, ct_failed_);
  free(lref), free(oref);
  ct_st_close(g);
  run_free(&r);
  ct_lora_free(l);
}

CT_TEST(lycoris, every_config_vs_lycoris) {
  for (size_t i = 0; i < sizeof CONFIGS / sizeof CONFIGS[0]; i++)
    check_config(CONFIGS[i], 0, ct_failed_);
}

/* LoKr in passes of 3 tokens (the golden batch has 14: 4 full passes and a
 * partial one): the same numbers, so the bounded scratch changes nothing. */
CT_TEST(lycoris, lokr_in_token_chunks) {
  check_config("lokr", 3, ct_failed_);
  check_config("lokr_full", 3, ct_failed_);
  check_config("lokr_both", 3, ct_failed_);
}

/* LyCORIS's initialisations leave the output unchanged (one half zero), yet
 * the other tensors are random, and the gradient reaches the zero half. */
CT_TEST(lycoris, init_keeps_the_base) {
  run r;
  ct_err e;
  if (!run_open(&r, ct_failed_)) return;
  const double l0 = forward_loss(&r, ct_failed_);
  float *v0 = malloc(r.nx * 4);
  REQUIRE(v0);
  memcpy(v0, r.vp, r.nx * 4);
  for (size_t c = 0; c < sizeof CONFIGS / sizeof CONFIGS[0]; c++) {
    char rel[256];
    ct_lora *l = NULL;
    snprintf(rel, sizeof rel, "%s/config.json", CONFIGS[c]);
    REQUIRE(!ct_lycoris_new(ct_mmdit_cfg(r.m), data(rel), CT_LORA_GRADS, &l, &e));
    REQUIRE(!ct_lora_init_range(l, "default", 5, 0, ct_lora_numel(l), ct_lora_params(l), &e));
    size_t nz = 0;
    for (size_t i = 0; i < ct_lora_numel(l); i++) nz += ct_lora_params(l)[i] != 0;
    CHECKF(nz > ct_lora_numel(l) / 8, "%s: %zu of %zu initial values nonzero", CONFIGS[c], nz,
           ct_lora_numel(l));
    ct_mmdit_set_lora(r.m, l);
    ct_mmdit_set_frozen(r.m, 1);
    const double l1 = forward_loss(&r, ct_failed_);
    CHECKF(fabs(l1 - l0) <= 1e-6 * l0 && ct_test_rel_err(r.vp, v0, r.nx) < 1e-6,
           "%s: the initial adapters change the output", CONFIGS[c]);
    REQUIRE(!ct_mmdit_backward(r.m, r.dv, &e));
    double gs = 0;
    for (size_t i = 0; i < ct_lora_numel(l); i++) gs += fabs(ct_lora_grads(l)[i]);
    CHECKF(gs > 0, "%s: no gradient", CONFIGS[c]);
    ct_mmdit_set_lora(r.m, NULL);
    ct_lora_free(l);
  }
  free(v0);
  run_free(&r);
}

/* Each bad config: an error naming the key or value. */
CT_TEST(lycoris, errors_name_the_key) {
  run r;
  ct_err e;
  if (!run_open(&r, ct_failed_)) return;
  static const struct {
    const char *json, *want;
  } BAD[] = {
      {"{\"algo\": \"ia3\", \"multiplier\": 1, \"linear_dim\": 2, \"linear_alpha\": 1}", "'ia3'"},
      {"{\"algo\": \"lorax\", \"multiplier\": 1, \"linear_dim\": 2, \"linear_alpha\": 1}",
       "'lorax' is not a LyCORIS algorithm"},
      {"{\"algo\": \"lokr\", \"multiplier\": 1, \"linear_dim\": 2, \"linear_alpha\": 1, "
       "\"factor\": 0}",
       "factor 0"},
      {"{\"algo\": \"lokr\", \"multiplier\": 1, \"linear_dim\": 2, \"linear_alpha\": 1, "
       "\"factor\": 2.5}",
       "factor must be an integer"},
      {"{\"algo\": \"lokr\", \"multiplier\": 1, \"linear_dim\": 2, \"linear_alpha\": 1, "
       "\"colour\": 3}",
       "unknown lycoris_config key 'colour'"},
      {"{\"algo\": \"loha\", \"multiplier\": 1, \"linear_dim\": 2, \"linear_alpha\": 1, "
       "\"apply_preset\": {\"target_modul\": []}}",
       "unknown apply_preset key 'target_modul'"},
      {"{\"algo\": \"loha\", \"multiplier\": 1, \"linear_dim\": 2, \"linear_alpha\": 1, "
       "\"apply_preset\": {\"module_algo_map\": {\"FeedForward\": {\"algo\": \"boft\"}}}}",
       "FeedForward: algo 'boft' is LyCORIS's but not implemented"},
      {"{\"algo\": \"loha\", \"multiplier\": 1, \"linear_dim\": 2, \"linear_alpha\": 1, "
       "\"apply_preset\": {\"name_algo_map\": {\"x_embedder\": {\"rank\": 3}}}}",
       "unknown key 'rank'"},
      {"{\"algo\": \"lokr\", \"multiplier\": 1, \"linear_dim\": 2, \"linear_alpha\": 1, "
       "\"dora_wd\": true}",
       "dora_wd is not implemented"},
      {"{\"algo\": \"locon\", \"multiplier\": 1, \"linear_dim\": 2, \"linear_alpha\": 1, "
       "\"dropout\": 0.1}",
       "dropout 0.1 is not implemented"},
      {"{\"algo\": \"locon\", \"multiplier\": 1, \"linear_alpha\": 1}", "linear_dim key"},
      {"{\"algo\": \"locon\", \"multiplier\": 1, \"linear_dim\": 2, \"linear_alpha\": 1, "
       "\"apply_preset\": {\"target_module\": [\"Attention\"]}}",
       "targets no Linear module"},
  };
  char path[4200];
  snprintf(path, sizeof path, "%s/lycoris_bad.json", ct_test_tmpdir());
  for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs(BAD[i].json, f);
    fclose(f);
    ct_lora *l = NULL;
    const ct_status st = ct_lycoris_new(ct_mmdit_cfg(r.m), path, 0, &l, &e);
    CHECKF(st && strstr(e.msg, BAD[i].want), "config %zu: want '%s', got '%s'", i, BAD[i].want,
           st ? e.msg : "accepted");
    if (!st) ct_lora_free(l);
  }
  /* a LoHa file for the LoKr config: names and shapes named */
  ct_lora *l = NULL;
  REQUIRE(!ct_lycoris_new(ct_mmdit_cfg(r.m), data("lokr/config.json"), 0, &l, &e));
  const ct_status st = ct_lora_load(l, data("loha/pytorch_lora_weights.safetensors"), 0,
                                    ct_lora_numel(l), ct_lora_params(l), &e);
  CHECKF(st && strstr(e.msg, "not a LyCORIS adapter for this model") && strstr(e.msg, "missing") &&
             strstr(e.msg, "lokr_w1"),
         "%s", st ? e.msg : "accepted");
  ct_lora_free(l);
  run_free(&r);
}

/* SimpleTuner's own lycoris_defaults (lora, loha, lokr) load: on diffusers'
 * Flux their "Attention" class matches nothing (the class is FluxAttention),
 * "FeedForward" the 4 Linears of each double block's two feed-forwards. */
CT_TEST(lycoris, simpletuner_defaults) {
  run r;
  ct_err e;
  if (!run_open(&r, ct_failed_)) return;
  static const struct {
    const char *algo, *head;
    int kind, dim;
  } D[] = {
      {"lora", "\"linear_dim\": 64, \"linear_alpha\": 32", CT_ALGO_LOCON, 64},
      {"loha", "\"linear_dim\": 32, \"linear_alpha\": 16", CT_ALGO_LOHA, 32},
      {"lokr", "\"linear_dim\": 10000, \"linear_alpha\": 1, \"factor\": 16", CT_ALGO_LOKR, 10000}};
  char path[4200];
  snprintf(path, sizeof path, "%s/lycoris_default.json", ct_test_tmpdir());
  for (size_t i = 0; i < sizeof D / sizeof D[0]; i++) {
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fprintf(f,
            "{\"algo\": \"%s\", \"multiplier\": 1.0, %s, \"apply_preset\": {\"target_module\": "
            "[\"Attention\", \"FeedForward\"], \"module_algo_map\": {\"Attention\": {\"factor\": "
            "16}, \"FeedForward\": {\"factor\": 8}}}}",
            D[i].algo, D[i].head);
    fclose(f);
    ct_lora *l = NULL;
    REQUIRE(!ct_lycoris_new(ct_mmdit_cfg(r.m), path, 0, &l, &e) || !fprintf(stderr, "%s\n", e.msg));
    size_t nad;
    const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
    CHECKF(nad == 8, "%s: %zu modules", D[i].algo, nad);
    for (size_t k = 0; k < nad; k++) {
      CHECKF(ad[k].algo == D[i].kind && ad[k].rank == D[i].dim && strstr(ad[k].module, ".ff"),
             "%s: %s", D[i].algo, ad[k].module);
      if (D[i].kind == CT_ALGO_LOKR) /* factor 8 (FeedForward's): 16 = 2 x 8, 64 = 8 x 8; whole
                                        halves: scale 1 */
        CHECKF(ad[k].w1_full && ad[k].w2_full && ad[k].scale == 1.0f &&
                   ((ad[k].lokr[0] == 8 && ad[k].lokr[2] == 2) ||
                    (ad[k].lokr[0] == 2 && ad[k].lokr[2] == 8)),
               "lokr %s: %d %d %d %d", ad[k].module, ad[k].lokr[0], ad[k].lokr[1], ad[k].lokr[2],
               ad[k].lokr[3]);
      else
        CHECK(fabsf(ad[k].scale - 0.5f) < 1e-7f);
    }
    ct_lora_free(l);
  }
  run_free(&r);
}

/* validation_lycoris_strength: with no batch set (validation) the adapters
 * run at that multiplier, with a batch (training) at lycoris_config's. */
CT_TEST(lycoris, validation_strength) {
  run r;
  ct_err e;
  ct_lora *l = NULL;
  if (!run_open(&r, ct_failed_)) return;
  forward_loss(&r, ct_failed_);
  float *base = malloc(r.nx * 4), *trained = malloc(r.nx * 4);
  REQUIRE(base && trained);
  memcpy(base, r.vp, r.nx * 4);
  REQUIRE(!ct_lycoris_new(ct_mmdit_cfg(r.m), data("locon/config.json"), 0, &l, &e));
  REQUIRE(!ct_lora_load(l, data("locon/pytorch_lora_weights.safetensors"), 0, ct_lora_numel(l),
                        ct_lora_params(l), &e));
  ct_mmdit_set_lora(r.m, l);
  ct_mmdit_set_frozen(r.m, 1);
  forward_loss(&r, ct_failed_); /* no batch, strength not set: the config's multiplier (2) */
  memcpy(trained, r.vp, r.nx * 4);
  CHECK(ct_test_rel_err(trained, base, r.nx) > 1e-3);
  ct_lora_set_validation_multiplier(l, 0.0); /* strength 0: the base's output */
  forward_loss(&r, ct_failed_);
  CHECKF(ct_test_rel_err(r.vp, base, r.nx) < 1e-6, "strength 0: %.3g",
         ct_test_rel_err(r.vp, base, r.nx));
  const uint64_t ids[2] = {0, 1};
  ct_lora_set_batch(l, 2, ids); /* training: multiplier 2 again */
  forward_loss(&r, ct_failed_);
  CHECK(ct_test_rel_err(r.vp, trained, r.nx) < 1e-7);
  ct_lora_set_batch(l, 0, NULL);
  forward_loss(&r, ct_failed_);
  CHECK(ct_test_rel_err(r.vp, base, r.nx) < 1e-6);
  free(base), free(trained);
  run_free(&r);
  ct_lora_free(l);
}

/* LyCORIS's walk on configs that stress it (tables.json, from lycoris-lora):
 * the same modules, each with LyCORIS's tensors and shapes, alpha and scale
 * (unbalanced factorization, decompose_both, exclusions, fnmatch names,
 * nested class maps with inherited algorithms, name patterns on blocks, an
 * exact name, another prefix). */
CT_TEST(lycoris, module_tables_vs_lycoris) {
  run r;
  ct_err e;
  ct_json *tab = NULL;
  if (!run_open(&r, ct_failed_)) return;
  REQUIRE(!ct_json_parse_file(data("tables.json"), 1 << 22, &tab, &e));
  REQUIRE(tab->type == CT_JSON_OBJECT && tab->n >= 5);
  for (size_t t = 0; t < tab->n; t++) {
    char rel[200];
    snprintf(rel, sizeof rel, "tables/%s.json", tab->keys[t]);
    const ct_json *mods = ct_json_get(&tab->items[t], "modules");
    ct_lora *l = NULL;
    REQUIRE(mods && !ct_lycoris_new(ct_mmdit_cfg(r.m), data(rel), 0, &l, &e));
    size_t nad;
    const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
    CHECKF(nad == mods->n, "%s: LyCORIS makes %zu modules, ctuner %zu", tab->keys[t], mods->n, nad);
    int bad = 0;
    for (size_t i = 0; i < nad; i++) {
      char name[200];
      ct_lora_tensor_fullname(l, &ad[i], 0, name, sizeof name);
      *strchr(name, '.') = 0;
      const ct_json *m = ct_json_get(mods, name), *sh = m ? ct_json_get(m, "shapes") : NULL;
      const ct_json *al = m ? ct_json_get(m, "alpha") : NULL,
                    *sc = m ? ct_json_get(m, "scale") : NULL;
      int ok = m && sh && al && sc && sh->n == (size_t)ad[i].nt &&
               fabs(al->num - ad[i].alpha) < 1e-9 &&
               fabs(sc->num - ad[i].scale) <= 1e-6 * fabs(sc->num);
      for (int k = 0; ok && k < ad[i].nt; k++) {
        const ct_json *s = ct_json_get(sh, ad[i].t[k].key);
        ok = s && s->n == 2 && s->items[0].num == ad[i].t[k].rows &&
             s->items[1].num == ad[i].t[k].cols;
      }
      if (!ok && bad++ < 4)
        fprintf(stderr, "  %s: %s (%s, rank %d, alpha %g, scale %g) differs from LyCORIS's\n",
                tab->keys[t], name, ad[i].t[0].key, ad[i].rank, ad[i].alpha, (double)ad[i].scale);
    }
    CHECKF(!bad, "%s: %d modules differ", tab->keys[t], bad);
    ct_lora_free(l);
  }
  ct_json_free(tab);
  run_free(&r);
}

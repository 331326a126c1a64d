/* LyCORIS adapters (lora_type lycoris, docs/lora.md): the lycoris_config
 * JSON as SimpleTuner hands it to LyCORIS's create_lycoris (after
 * LycorisNetwork.apply_preset of its "apply_preset"), which diffusers
 * modules get which algorithm (LyCORIS's walk over named_modules with
 * target_module / target_name / module_algo_map / name_algo_map /
 * exclude_name), each module's tensors, shapes, scale and initialisation
 * (LoConModule, LohaModule, LokrModule), and the file SimpleTuner writes
 * (pytorch_lora_weights.safetensors: lycoris_<module>.<key>, .alpha, the
 * config as "lycoris_config" metadata). Every key is used, refused by name,
 * or warned about once. */
#include <ctype.h>
#include <fnmatch.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/lora.h"
#include "ctuner/safetensors.h"
#include "lora_impl.h"

/* One module's settings: the top level's, overridden by a map entry. */
typedef struct lyco_mod {
  int algo; /* ct_lora_algo; 0: not set */
  int dim, dim_set;
  double alpha;
  int alpha_set;
  int factor, full_matrix, decompose_both, unbalanced;
} lyco_mod;

typedef struct lyco {
  const char *path;
  const ct_json *root, *preset;
  lyco_mod top;
  double mult;
  int guidance;
  const ct_json *tmod, *tname, *mmap, *nmap, *excl; /* arrays / objects or NULL */
  int fnm;                                          /* use_fnmatch */
  int warn_unmatched;
  char prefix[48];
  int quiet; /* ct_lycoris_check: no warnings (the trainer gives them once, later) */
} lyco;

#define LWARN(c, ...)                      \
  do {                                     \
    if (!(c)->quiet) CT_WARN(__VA_ARGS__); \
  } while (0)

static const char *const REFUSED_ALGOS[] = {"dylora", "glora", "full",  "diag-oft",
                                            "boft",   "ia3",   "tlora", NULL};

static int in_list(const char *s, const char *const *list) {
  for (; *list; list++)
    if (!strcmp(s, *list)) return 1;
  return 0;
}

/* LyCORIS's str_bool over a JSON value: a bool, 0/1, or "true"/"false". */
static int jbool(const ct_json *v, int *out) {
  if (v->type == CT_JSON_BOOL)
    *out = v->boolean;
  else if (v->type == CT_JSON_NUMBER)
    *out = v->num != 0;
  else if (v->type == CT_JSON_STRING && (!strcmp(v->str, "true") || !strcmp(v->str, "True")))
    *out = 1;
  else if (v->type == CT_JSON_STRING && (!strcmp(v->str, "false") || !strcmp(v->str, "False")))
    *out = 0;
  else if (v->type == CT_JSON_NULL)
    *out = 0;
  else
    return 0;
  return 1;
}

static ct_status algo_of(const lyco *c, const char *where, const ct_json *v, int *algo,
                         ct_err *err) {
  if (v->type != CT_JSON_STRING)
    return ct_errf(err, CT_ERR_INVALID, "%s: %salgo must be a string", c->path, where);
  char a[32];
  snprintf(a, sizeof a, "%s", v->str);
  for (char *p = a; *p; p++) *p = (char)tolower((unsigned char)*p);
  if (!strcmp(a, "lora") || !strcmp(a, "locon"))
    *algo = CT_ALGO_LOCON;
  else if (!strcmp(a, "loha"))
    *algo = CT_ALGO_LOHA;
  else if (!strcmp(a, "lokr"))
    *algo = CT_ALGO_LOKR;
  else if (in_list(a, REFUSED_ALGOS))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: %salgo '%s' is LyCORIS's but not implemented in ctuner (lora, locon, "
                   "loha, lokr are)",
                   c->path, where, v->str);
  else
    return ct_errf(err, CT_ERR_INVALID,
                   "%s: %salgo '%s' is not a LyCORIS algorithm (ctuner trains lora, locon, loha, "
                   "lokr)",
                   c->path, where, v->str);
  return CT_OK;
}

static ct_status get_int(const lyco *c, const char *where, const char *key, const ct_json *v,
                         int *out, ct_err *err) {
  if (v->type != CT_JSON_NUMBER || !v->is_int)
    return ct_errf(err, CT_ERR_INVALID, "%s: %s%s must be an integer", c->path, where, key);
  *out = (int)v->i64;
  return CT_OK;
}

/* Keys a module setting (top level or a map entry) may carry. top: the
 * top level's names (linear_dim, dora_wd...), else a map entry's (dim,
 * weight_decompose...). Returns 1 if the key was handled. */
static ct_status mod_key(const lyco *c, const char *where, const char *k, const ct_json *v,
                         lyco_mod *m, int top, int *handled, ct_err *err) {
  int b = 0;
  *handled = 1;
  if (!strcmp(k, "algo")) return algo_of(c, where, v, &m->algo, err);
  if (!strcmp(k, top ? "linear_dim" : "dim")) {
    if (v->type != CT_JSON_NUMBER)
      return ct_errf(err, CT_ERR_INVALID, "%s: %s%s must be a number", c->path, where, k);
    m->dim = (int)v->num; /* SimpleTuner: int(...) */
    m->dim_set = 1;
    if (m->dim < 1)
      return ct_errf(err, CT_ERR_INVALID, "%s: %s%s %g must be at least 1", c->path, where, k,
                     v->num);
    return CT_OK;
  }
  if (!strcmp(k, top ? "linear_alpha" : "alpha")) {
    if (v->type != CT_JSON_NUMBER || v->num < 0)
      return ct_errf(err, CT_ERR_INVALID, "%s: %s%s must be a number >= 0", c->path, where, k);
    m->alpha = top ? (double)(long long)v->num : v->num; /* SimpleTuner int()s linear_alpha */
    if (top && m->alpha != v->num)
      LWARN(c, "%s: linear_alpha %g becomes %g: SimpleTuner passes int(linear_alpha) to LyCORIS",
            c->path, v->num, m->alpha);
    m->alpha_set = 1;
    return CT_OK;
  }
  if (!strcmp(k, "factor")) {
    ct_status st = get_int(c, where, k, v, &m->factor, err);
    if (!st && m->factor != -1 && m->factor < 1)
      st = ct_errf(err, CT_ERR_INVALID,
                   "%s: %sfactor %d: LoKr's factor must be -1 (the most balanced split) or a "
                   "positive integer",
                   c->path, where, m->factor);
    return st;
  }
  int *flag = !strcmp(k, "full_matrix")                ? &m->full_matrix
              : !strcmp(k, "decompose_both")           ? &m->decompose_both
              : !strcmp(k, "unbalanced_factorization") ? &m->unbalanced
                                                       : NULL;
  if (flag) {
    if (!jbool(v, flag))
      return ct_errf(err, CT_ERR_INVALID, "%s: %s%s must be true or false", c->path, where, k);
    return CT_OK;
  }
  if (!strcmp(k, "bypass_mode")) /* the same numbers either way: ctuner rebuilds or bypasses */
    return jbool(v, &b)
               ? CT_OK
               : ct_errf(err, CT_ERR_INVALID, "%s: %s%s must be a bool", c->path, where, k);
  /* refused when on */
  static const char *const ON_REFUSED[] = {"dora_wd", "weight_decompose", "use_scalar",
                                           "rs_lora", "train_norm",       NULL};
  if (in_list(k, ON_REFUSED)) {
    if (!jbool(v, &b))
      return ct_errf(err, CT_ERR_INVALID, "%s: %s%s must be true or false", c->path, where, k);
    if (b)
      return ct_errf(err, CT_ERR_UNSUPPORTED,
                     "%s: %s%s is not implemented in ctuner's LyCORIS (set it false or remove it)",
                     c->path, where, k);
    return CT_OK;
  }
  static const char *const DROPS[] = {"dropout", "rank_dropout", "module_dropout", NULL};
  if (in_list(k, DROPS)) {
    if (v->type == CT_JSON_NULL || (v->type == CT_JSON_NUMBER && v->num == 0)) return CT_OK;
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: %s%s %g is not implemented in ctuner's LyCORIS (LyCORIS's LoHa/LoKr "
                   "ignore dropout too); set it to 0",
                   c->path, where, k, v->type == CT_JSON_NUMBER ? v->num : NAN);
  }
  *handled = 0;
  return CT_OK;
}

/* Keys with no effect on the FLUX transformer's Linear layers: one warning each. */
static const struct {
  const char *key, *why;
} IGNORED[] = {
    {"conv_dim", "the FLUX transformer has no convolutions"},
    {"conv_alpha", "the FLUX transformer has no convolutions"},
    {"use_tucker", "Tucker factors apply to convolution kernels only"},
    {"use_cp", "Tucker factors apply to convolution kernels only"},
    {"use_conv_cp", "Tucker factors apply to convolution kernels only"},
    {"disable_conv_cp", "Tucker factors apply to convolution kernels only"},
    {"block_size", "used by diag-oft and boft only"},
    {"constraint", "used by diag-oft and boft only"},
    {"rescaled", "used by diag-oft and boft only"},
    {"wd_on_output", "used with dora_wd only"},
    {"rank_dropout_scale", "used with rank_dropout only"},
    {"train_llm_adapter", "for Anima's LLM adapter blocks only"},
    {"preset", "LyCORIS's built-in presets set only enable_conv (apply_preset decides targets)"},
    {"enable_conv", "the FLUX transformer has no convolutions"},
    {"unet_target_module", "LycorisNetwork.apply_preset does not read it"},
    {"unet_target_name", "LycorisNetwork.apply_preset does not read it"},
    {"text_encoder_target_module", "LycorisNetwork.apply_preset does not read it"},
    {"text_encoder_target_name", "LycorisNetwork.apply_preset does not read it"},
};

static int ignored(const lyco *c, const char *where, const char *k) {
  for (size_t i = 0; i < sizeof IGNORED / sizeof IGNORED[0]; i++)
    if (!strcmp(k, IGNORED[i].key)) {
      LWARN(c, "%s: %s%s has no effect here (%s)", c->path, where, k, IGNORED[i].why);
      return 1;
    }
  return 0;
}

/* A map entry (module_algo_map / name_algo_map value) checked; no output. */
static ct_status check_entry(const lyco *c, const char *map, const char *name, const ct_json *e,
                             ct_err *err) {
  char where[200];
  snprintf(where, sizeof where, "apply_preset.%s.%s: ", map, name);
  if (e->type != CT_JSON_OBJECT)
    return ct_errf(err, CT_ERR_INVALID, "%s: %smust be an object", c->path, where);
  lyco_mod m = c->top;
  for (size_t i = 0; i < e->n; i++) {
    int h = 0;
    ct_status st = mod_key(c, where, e->keys[i], &e->items[i], &m, 0, &h, err);
    if (st) return st;
    if (h || ignored(c, where, e->keys[i])) continue;
    if (!strcmp(e->keys[i], "linear_dim") || !strcmp(e->keys[i], "linear_alpha")) {
      LWARN(c,
            "%s: %s%s has no effect: LyCORIS reads a module's rank and alpha from dim and "
            "alpha there",
            c->path, where, e->keys[i]);
      continue;
    }
    return ct_errf(err, CT_ERR_INVALID,
                   "%s: %sunknown key '%s' (ctuner knows algo, dim, alpha, "
                   "factor, full_matrix, decompose_both, unbalanced_factorization, bypass_mode)",
                   c->path, where, e->keys[i]);
  }
  return CT_OK;
}

static ct_status str_array(const lyco *c, const char *k, const ct_json *v, ct_err *err) {
  if (v->type != CT_JSON_ARRAY)
    return ct_errf(err, CT_ERR_INVALID, "%s: apply_preset.%s must be a list of strings", c->path,
                   k);
  for (size_t i = 0; i < v->n; i++)
    if (v->items[i].type != CT_JSON_STRING)
      return ct_errf(err, CT_ERR_INVALID, "%s: apply_preset.%s must be a list of strings", c->path,
                     k);
  return CT_OK;
}

static ct_status read_preset(lyco *c, const ct_json *p, ct_err *err) {
  if (p->type == CT_JSON_NULL) return CT_OK;
  if (p->type != CT_JSON_OBJECT)
    return ct_errf(err, CT_ERR_INVALID, "%s: apply_preset must be an object", c->path);
  for (size_t i = 0; i < p->n; i++) {
    const char *k = p->keys[i];
    const ct_json *v = &p->items[i];
    ct_status st = CT_OK;
    if (!strcmp(k, "target_module") || !strcmp(k, "target_name") || !strcmp(k, "exclude_name")) {
      st = str_array(c, k, v, err);
      *(k[0] == 'e' ? &c->excl : k[7] == 'm' ? &c->tmod : &c->tname) = v;
    } else if (!strcmp(k, "module_algo_map") || !strcmp(k, "name_algo_map")) {
      if (v->type != CT_JSON_OBJECT)
        return ct_errf(err, CT_ERR_INVALID, "%s: apply_preset.%s must be an object", c->path, k);
      for (size_t j = 0; j < v->n && !st; j++)
        st = check_entry(c, k, v->keys[j], &v->items[j], err);
      *(k[0] == 'm' ? &c->mmap : &c->nmap) = v;
    } else if (!strcmp(k, "lora_prefix")) {
      if (v->type != CT_JSON_STRING || !*v->str || strlen(v->str) >= sizeof c->prefix)
        return ct_errf(err, CT_ERR_INVALID, "%s: apply_preset.lora_prefix must be a short string",
                       c->path);
      snprintf(c->prefix, sizeof c->prefix, "%s", v->str);
    } else if (!strcmp(k, "use_fnmatch")) {
      if (!jbool(v, &c->fnm))
        return ct_errf(err, CT_ERR_INVALID, "%s: apply_preset.use_fnmatch must be a bool", c->path);
    } else if (!ignored(c, "apply_preset.", k))
      return ct_errf(err, CT_ERR_INVALID,
                     "%s: unknown apply_preset key '%s' (LyCORIS's are target_module, "
                     "target_name, module_algo_map, name_algo_map, exclude_name, lora_prefix, "
                     "use_fnmatch, enable_conv)",
                     c->path, k);
    if (st) return st;
  }
  return CT_OK;
}

static ct_status read_top(lyco *c, ct_err *err) {
  const ct_json *r = c->root;
  if (r->type != CT_JSON_OBJECT)
    return ct_errf(err, CT_ERR_INVALID, "%s: a lycoris_config must be a JSON object", c->path);
  static const char *const REQUIRED[] = {"algo", "multiplier", "linear_dim", "linear_alpha", NULL};
  for (const char *const *k = REQUIRED; *k; k++)
    if (!ct_json_get(r, *k))
      return ct_errf(err, CT_ERR_INVALID,
                     "%s: lycoris_config JSON must contain the %s key (as "
                     "SimpleTuner requires)",
                     c->path, *k);
  c->top = (lyco_mod){.factor = -1};
  for (size_t i = 0; i < r->n; i++) {
    const char *k = r->keys[i];
    const ct_json *v = &r->items[i];
    int h = 0;
    ct_status st = mod_key(c, "", k, v, &c->top, 1, &h, err);
    if (st) return st;
    if (h || ignored(c, "", k)) continue;
    if (!strcmp(k, "multiplier")) {
      if (v->type != CT_JSON_NUMBER)
        return ct_errf(err, CT_ERR_INVALID, "%s: multiplier must be a number", c->path);
      c->mult = (double)(long long)v->num; /* SimpleTuner: int(multiplier) */
      if (c->mult != v->num)
        LWARN(c, "%s: multiplier %g becomes %g: SimpleTuner passes int(multiplier) to LyCORIS",
              c->path, v->num, c->mult);
    } else if (!strcmp(k, "apply_preset")) {
      c->preset = v;
    } else if (!strcmp(k, "warn_on_unmatched")) {
      if (!jbool(v, &c->warn_unmatched))
        return ct_errf(err, CT_ERR_INVALID, "%s: warn_on_unmatched must be a bool", c->path);
    } else {
      return ct_errf(err, CT_ERR_INVALID,
                     "%s: unknown lycoris_config key '%s' (neither LyCORIS's create_lycoris nor "
                     "SimpleTuner reads it; docs/lora.md lists the keys)",
                     c->path, k);
    }
  }
  return c->preset ? read_preset(c, c->preset, err) : CT_OK;
}

/* ---- which modules, with which settings (LycorisNetwork.__init__'s walk) ---- */

/* The class of the diffusers module at name (a prefix of a Linear's name). */
static const char *class_of(const lyco *c, const char *name, int is_linear) {
  if (is_linear) return "Linear";
  if (!*name) return "FluxTransformer2DModel";
  if (!strcmp(name, "time_text_embed"))
    return c->guidance ? "CombinedTimestepGuidanceTextProjEmbeddings"
                       : "CombinedTimestepTextProjEmbeddings";
  if (!strcmp(name, "time_text_embed.text_embedder")) return "PixArtAlphaTextProjection";
  if (!strncmp(name, "time_text_embed.", 16)) return "TimestepEmbedding";
  const char *dot = strrchr(name, '.');
  const char *last = dot ? dot + 1 : name;
  char parent[64] = "";
  if (dot) {
    const char *pd = dot - 1;
    while (pd > name && *pd != '.') pd--;
    if (*pd == '.') pd++;
    snprintf(parent, sizeof parent, "%.*s", (int)(dot - pd), pd);
  }
  if (isdigit((unsigned char)*last)) {
    if (!strcmp(parent, "transformer_blocks")) return "FluxTransformerBlock";
    if (!strcmp(parent, "single_transformer_blocks")) return "FluxSingleTransformerBlock";
    return "GELU"; /* ff.net.0 */
  }
  static const char *const MAP[][2] = {{"transformer_blocks", "ModuleList"},
                                       {"single_transformer_blocks", "ModuleList"},
                                       {"to_out", "ModuleList"},
                                       {"net", "ModuleList"},
                                       {"norm1", "AdaLayerNormZero"},
                                       {"norm1_context", "AdaLayerNormZero"},
                                       {"norm", "AdaLayerNormZeroSingle"},
                                       {"attn", "FluxAttention"},
                                       {"ff", "FeedForward"},
                                       {"ff_context", "FeedForward"},
                                       {"norm_out", "AdaLayerNormContinuous"}};
  for (size_t i = 0; i < sizeof MAP / sizeof MAP[0]; i++)
    if (!strcmp(last, MAP[i][0])) return MAP[i][1];
  return "Module";
}

/* LyCORIS's match_fn: re.match (anchored at the start) or fnmatch. */
static int match_fn(const lyco *c, const char *pat, const char *name) {
  if (c->fnm) return fnmatch(pat, name, 0) == 0;
  char buf[600];
  snprintf(buf, sizeof buf, "^(%s)", pat);
  regex_t re;
  if (regcomp(&re, buf, REG_EXTENDED | REG_NOSUB)) return 0;
  const int m = regexec(&re, name, 0, NULL, 0) == 0;
  regfree(&re);
  return m;
}

static int any_match(const lyco *c, const ct_json *pats, const char *name) {
  for (size_t i = 0; pats && i < pats->n; i++)
    if (match_fn(c, pats->items[i].str, name)) return 1;
  return 0;
}

static int has_str(const ct_json *arr, const char *s) {
  for (size_t i = 0; arr && i < arr->n; i++)
    if (!strcmp(arr->items[i].str, s)) return 1;
  return 0;
}

static int excluded(const lyco *c, const char *name) {
  return *name && c->excl && (has_str(c->excl, name) || any_match(c, c->excl, name));
}

/* Target classes: target_module (default LyCORIS's: Linear, convs, norms) and the map's keys. */
static int target_class(const lyco *c, const char *cls) {
  if (c->mmap && ct_json_get(c->mmap, cls)) return 1;
  if (!c->tmod) return !strcmp(cls, "Linear");
  return has_str(c->tmod, cls);
}

static int target_named(const lyco *c, const char *name) {
  if (c->tname && (has_str(c->tname, name) || any_match(c, c->tname, name))) return 1;
  for (size_t i = 0; c->nmap && i < c->nmap->n; i++)
    if (!strcmp(c->nmap->keys[i], name) || match_fn(c, c->nmap->keys[i], name)) return 1;
  return 0;
}

/* LyCORIS's test that keeps a target class out of the subtree walk: a
 * match_fn hit of target_name or a name_algo_map key on the module's name. */
static int name_pattern_hit(const lyco *c, const char *name) {
  if (any_match(c, c->tname, name)) return 1;
  for (size_t i = 0; c->nmap && i < c->nmap->n; i++)
    if (match_fn(c, c->nmap->keys[i], name)) return 1;
  return 0;
}

static const ct_json *name_conf(const lyco *c, const char *name) {
  const ct_json *e = c->nmap ? ct_json_get(c->nmap, name) : NULL;
  for (size_t i = 0; !e && c->nmap && i < c->nmap->n; i++)
    if (match_fn(c, c->nmap->keys[i], name)) e = &c->nmap->items[i];
  return e;
}

/* A map entry's algo, or cur. */
static int entry_algo(const lyco *c, const ct_json *e, int cur) {
  const ct_json *v = e ? ct_json_get(e, "algo") : NULL;
  int a = cur;
  ct_err ignore;
  if (v && algo_of(c, "", v, &a, &ignore)) a = cur; /* checked when the config was read */
  return a;
}

/* The settings of module (a Linear): the first module on its path from the
 * root that LyCORIS's pre-order walk triggers decides (0: no adapter). */
static int resolve(const lyco *c, const char *module, const ct_json **conf, int *algo) {
  const size_t n = strlen(module);
  char pre[112];
  for (size_t e = 0; e <= n; e++) {
    if (e > 0 && e < n && module[e] != '.') continue;
    snprintf(pre, sizeof pre, "%.*s", (int)e, module);
    const char *cls = class_of(c, pre, e == n);
    if (excluded(c, pre)) continue;
    if (target_class(c, cls) && !name_pattern_hit(c, pre)) {
      /* create_modules_ over pre's subtree: each module_algo_map class on the
       * way down takes over (its algo inherits the one above) */
      const ct_json *cf = c->mmap ? ct_json_get(c->mmap, cls) : NULL;
      int al = entry_algo(c, cf, c->top.algo);
      for (size_t f = e + 1; f <= n; f++) {
        if (f < n && module[f] != '.') continue;
        char sub[112];
        snprintf(sub, sizeof sub, "%.*s", (int)f, module);
        if (excluded(c, sub)) {
          if (f == n) return 0;
          continue;
        }
        const ct_json *m2 = c->mmap ? ct_json_get(c->mmap, class_of(c, sub, f == n)) : NULL;
        if (m2) {
          cf = m2;
          al = entry_algo(c, m2, al);
        }
      }
      *conf = cf;
      *algo = al;
      return 1;
    }
    if (target_named(c, pre)) {
      if (e != n) continue; /* a named non-Linear module gets no adapter itself */
      const ct_json *cf = name_conf(c, pre);
      if (!cf && c->mmap) cf = ct_json_get(c->mmap, "Linear");
      *conf = cf;
      *algo = entry_algo(c, cf, c->top.algo);
      return 1;
    }
  }
  return 0;
}

/* LyCORIS's factorization(dimension, factor): (m, n), m <= n, m * n = dimension. */
static void factorization(int dim, int factor, int *m_out, int *n_out) {
  if (factor > 0 && dim % factor == 0) {
    int m = factor, n = dim / factor;
    if (m > n) {
      int t = m;
      m = n;
      n = t;
    }
    *m_out = m;
    *n_out = n;
    return;
  }
  if (factor < 0) factor = dim;
  int m = 1, n = dim, length = m + n;
  while (m < n) {
    int nm = m + 1;
    while (dim % nm) nm++;
    const int nn = dim / nm;
    if (nm + nn > length || nm > factor) break;
    m = nm;
    n = nn;
  }
  if (m > n) {
    int t = m;
    m = n;
    n = t;
  }
  *m_out = m;
  *n_out = n;
}

static ct_lora_tensor tens(const char *key, int rows, int cols, char init, float v) {
  ct_lora_tensor t;
  memset(&t, 0, sizeof t);
  snprintf(t.key, sizeof t.key, "%s", key);
  t.rows = rows;
  t.cols = cols;
  t.init = init;
  t.init_v = v;
  return t;
}

/* kaiming_uniform_(a=sqrt(5)) of a [rows, fan_in] tensor: bound 1/sqrt(fan_in). */
static float ku(int fan_in) {
  return 1.0f / sqrtf((float)fan_in);
}

/* The module's tensors, rank, scale and alpha under settings m
 * (LoConModule / LohaModule / LokrModule.__init__ for a Linear). */
static void make_module(const lyco *c, const lyco_mod *m, int in, int out, ct_lora_adapter *a) {
  const int r = m->dim;
  double alpha = m->alpha == 0 ? r : m->alpha;
  a->algo = m->algo;
  a->rank = r;
  if (m->algo == CT_ALGO_LOCON) {
    a->nt = 2;
    a->t[0] = tens("lora_down.weight", r, in, 'u', ku(in));
    a->t[1] = tens("lora_up.weight", out, r, 'z', 0);
  } else if (m->algo == CT_ALGO_LOHA) {
    a->nt = 4;
    a->t[0] = tens("hada_w1_a", out, r, 'n', 0.1f);
    a->t[1] = tens("hada_w1_b", r, in, 'n', 1.0f);
    a->t[2] = tens("hada_w2_a", out, r, 'z', 0);
    a->t[3] = tens("hada_w2_b", r, in, 'n', 1.0f);
  } else { /* LoKr: out = ol ok, in = im in2; w1 (ol x im) the small side */
    int im, in2, ol, ok;
    factorization(in, m->factor, &im, &in2);
    factorization(out, m->factor, &ol, &ok);
    if (m->unbalanced) {
      const int t = ol;
      ol = ok;
      ok = t;
    }
    a->lokr[0] = ol;
    a->lokr[1] = ok;
    a->lokr[2] = im;
    a->lokr[3] = in2;
    const int big1 = ol > im ? ol : im, big2 = ok > in2 ? ok : in2;
    a->w1_full = !(m->decompose_both && r < big1 / 2.0 && !m->full_matrix);
    a->w2_full = !(r < big2 / 2.0 && !m->full_matrix);
    int k = 0;
    if (a->w1_full)
      a->t[k++] = tens("lokr_w1", ol, im, 'u', ku(im));
    else {
      a->t[k++] = tens("lokr_w1_a", ol, r, 'u', ku(r));
      a->t[k++] = tens("lokr_w1_b", r, im, 'u', ku(im));
    }
    if (a->w2_full)
      a->t[k++] = tens("lokr_w2", ok, in2, 'z', 0);
    else {
      a->t[k++] = tens("lokr_w2_a", ok, r, 'u', ku(r));
      a->t[k++] = tens("lokr_w2_b", r, in2, 'z', 0);
    }
    a->nt = k;
    if (a->w1_full && a->w2_full) alpha = r; /* LyCORIS: scale 1 */
  }
  a->alpha = alpha;
  a->scale = (float)(alpha / r * c->mult);
}

/* ct_lora_build's pick: resolve, then the entry's settings over the top level's. */
typedef struct pick_state {
  lyco *c;
  size_t nmod;
  int counts[4];
  int lokr_only;   /* modules of another algorithm given LoKr's keys */
  char first[112]; /* the first of them */
} pick_state;

/* A LoKr-only key (factor, full_matrix, decompose_both, unbalanced_factorization) in obj. */
static int has_lokr_key(const ct_json *obj) {
  static const char *const K[] = {"factor", "full_matrix", "decompose_both",
                                  "unbalanced_factorization"};
  for (size_t i = 0; obj && i < sizeof K / sizeof K[0]; i++)
    if (ct_json_get(obj, K[i])) return 1;
  return 0;
}

static ct_status pick(void *user, const char *module, int in, int out, ct_lora_adapter *a,
                      int *take, ct_err *err) {
  pick_state *ps = user;
  const lyco *c = ps->c;
  const ct_json *conf = NULL;
  int algo = 0;
  *take = resolve(c, module, &conf, &algo);
  if (!*take) return CT_OK;
  lyco_mod m = c->top;
  m.algo = algo;
  for (size_t i = 0; conf && i < conf->n; i++) {
    int h = 0;
    ct_status st = mod_key(c, "", conf->keys[i], &conf->items[i], &m, 0, &h, err);
    if (st) return st;
  }
  if (conf && ct_json_get(conf, "alpha") && ct_json_get(conf, "alpha")->num == 0)
    m.alpha = c->top.alpha; /* LyCORIS: alpha or self.alpha */
  make_module(c, &m, in, out, a);
  if (m.algo != CT_ALGO_LOKR && (has_lokr_key(conf) || has_lokr_key(c->root)) && !ps->lokr_only++)
    snprintf(ps->first, sizeof ps->first, "%s", module);
  ps->nmod++;
  ps->counts[a->algo]++;
  return CT_OK;
}

/* LyCORIS warns of target classes and names no module matched. */
static void warn_unmatched(const lyco *c, const ct_mmdit_config *cfg) {
  ct_flux_name *map = NULL;
  size_t nm = 0;
  ct_err er;
  if (!c->warn_unmatched || ct_flux_name_map(cfg, &map, &nm, &er)) return;
  for (int list = 0; list < 2; list++) {
    const ct_json *arr = list ? c->tname : c->tmod;
    for (size_t t = 0; arr && t < arr->n; t++) {
      const char *want = arr->items[t].str;
      int hit = 0;
      for (size_t i = 0; i < nm && !hit; i++) {
        char name[112];
        snprintf(name, sizeof name, "%s", map[i].dif);
        char *dot = strrchr(name, '.'); /* drop ".weight" / ".bias" */
        if (dot) *dot = 0;
        const size_t n = strlen(name);
        for (size_t e = 0; e <= n && !hit; e++) { /* the module and its ancestors */
          if (e > 0 && e < n && name[e] != '.') continue;
          char pre[112];
          snprintf(pre, sizeof pre, "%.*s", (int)e, name);
          hit = list ? (!strcmp(pre, want) || match_fn(c, want, pre))
                     : !strcmp(class_of(c, pre, e == n && map[i].cols), want);
        }
      }
      if (!hit)
        CT_WARN(
            "%s: no module of the FLUX transformer matched the target %s '%s' (LyCORIS "
            "warns the same)",
            c->path, list ? "name" : "module class", want);
    }
  }
  free(map);
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *b = NULL;
  size_t n = 0, cap = 0, k;
  char buf[4096];
  while ((k = fread(buf, 1, sizeof buf, f)) > 0) {
    if (n + k + 1 > cap) {
      cap = (n + k + 1) * 2;
      char *p = realloc(b, cap);
      if (!p) {
        free(b);
        fclose(f);
        return NULL;
      }
      b = p;
    }
    memcpy(b + n, buf, k);
    n += k;
  }
  fclose(f);
  if (!b)
    b = calloc(1, 1);
  else
    b[n] = 0;
  return b;
}

ct_status ct_lycoris_new(const ct_mmdit_config *cfg, const char *path, int flags, ct_lora **out,
                         ct_err *err) {
  *out = NULL;
  ct_json *root = NULL;
  ct_status st = ct_json_parse_file(path, 1 << 20, &root, err);
  if (st) return st;
  lyco c;
  memset(&c, 0, sizeof c);
  c.path = path;
  c.root = root;
  c.guidance = cfg->guidance_embed;
  c.warn_unmatched = 1;
  snprintf(c.prefix, sizeof c.prefix, "lycoris");
  st = read_top(&c, err);
  ct_lora *l = NULL;
  if (!st && !(l = calloc(1, sizeof *l))) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  pick_state ps;
  memset(&ps, 0, sizeof ps);
  ps.c = &c;
  if (!st) {
    l->lyco = 1;
    l->lyco_mult = l->lyco_vmult = c.mult;
    snprintf(l->prefix, sizeof l->prefix, "%s", c.prefix);
    l->o = (ct_lora_opts){c.top.dim, c.top.alpha == 0 ? c.top.dim : c.top.alpha, 0, 0, 0};
    l->scale = (float)(l->o.alpha / l->o.rank * c.mult);
    l->lyco_json = read_text(path);
    if (!l->lyco_json) st = ct_errf(err, CT_ERR_IO, "%s: cannot read it again", path);
  }
  if (!st) st = ct_lora_build(l, cfg, pick, &ps, flags, err);
  if (!st && !l->nad)
    st = ct_errf(err, CT_ERR_INVALID,
                 "%s: its apply_preset targets no Linear module of the FLUX transformer (LyCORIS "
                 "would create no module either)",
                 path);
  if (!st) {
    warn_unmatched(&c, cfg);
    if (ps.lokr_only)
      CT_WARN(
          "%s: factor, full_matrix, decompose_both and unbalanced_factorization shape LoKr "
          "only: %d module(s) of another algorithm ignore them (e.g. %s), as in LyCORIS",
          path, ps.lokr_only, ps.first);
    CT_INFO("LyCORIS %s: %zu modules (LoCon %d, LoHa %d, LoKr %d), multiplier %g", path, ps.nmod,
            ps.counts[CT_ALGO_LOCON], ps.counts[CT_ALGO_LOHA], ps.counts[CT_ALGO_LOKR], c.mult);
  }
  ct_json_free(root);
  if (st) {
    ct_lora_free(l);
    return st;
  }
  *out = l;
  return CT_OK;
}

ct_status ct_lycoris_check(const char *path, ct_err *err) {
  ct_json *root = NULL;
  ct_status st = ct_json_parse_file(path, 1 << 20, &root, err);
  if (st) return st;
  lyco c;
  memset(&c, 0, sizeof c);
  c.path = path;
  c.root = root;
  c.quiet = 1;
  snprintf(c.prefix, sizeof c.prefix, "lycoris");
  st = read_top(&c, err);
  ct_json_free(root);
  return st;
}

/* ---- files: LycorisNetwork.save_weights as SimpleTuner calls it ---- */

ct_status ct_lycoris_save(const ct_lora *l, const float *w, const char *path, ct_err *err) {
  ct_st_writer *wr;
  if (ct_st_writer_new(&wr)) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = CT_OK;
  float *alphas = malloc((l->nad ? l->nad : 1) * sizeof *alphas);
  if (!alphas) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  char name[200];
  for (size_t i = 0; !st && i < l->nad; i++) {
    const ct_lora_adapter *a = &l->ad[i];
    for (int k = 0; !st && k < a->nt; k++) {
      const int64_t sh[2] = {a->t[k].rows, a->t[k].cols};
      ct_lora_tensor_fullname(l, a, k, name, sizeof name);
      st = ct_st_writer_add_f32(wr, name, 2, sh, w + a->t[k].off, CT_DTYPE_F32, err);
    }
    alphas[i] = (float)a->alpha;
    ct_lora_tensor_fullname(l, a, 0, name, sizeof name);
    *strchr(name, '.') = 0;
    strcat(name, ".alpha");
    if (!st) st = ct_st_writer_add_f32(wr, name, 0, NULL, &alphas[i], CT_DTYPE_F32, err);
  }
  if (!st) st = ct_st_writer_meta(wr, "lycoris_config", l->lyco_json, err);
  if (!st) st = ct_st_writer_write(wr, path, err);
  ct_st_writer_free(wr);
  free(alphas);
  return st;
}

static void note(char *list, size_t cap, int *count, const char *name) {
  if ((*count)++ < 6) {
    size_t n = strlen(list);
    snprintf(list + n, cap - n, "%s%s", n ? ", " : "", name);
  } else if (*count == 7) {
    size_t n = strlen(list);
    snprintf(list + n, cap - n, ", ...");
  }
}

/* One adapter's tensors and alpha from f into [lo, hi) of out; problems noted. */
static ct_status load_one(const ct_lora *l, const ct_lora_adapter *a, const ct_st_file *f,
                          size_t lo, size_t hi, float *out, char (*lists)[700], int *counts,
                          size_t *found, ct_err *err) {
  char name[200];
  for (int k = 0; k <= a->nt; k++) {
    ct_lora_tensor_fullname(l, a, 0, name, sizeof name);
    if (k == a->nt) {
      *strchr(name, '.') = 0;
      strcat(name, ".alpha");
    } else
      ct_lora_tensor_fullname(l, a, k, name, sizeof name);
    const ct_st_tensor *t = ct_st_find(f, name);
    if (!t) {
      note(lists[0], sizeof lists[0], &counts[0], name);
      continue;
    }
    ++*found;
    if (k == a->nt) { /* alpha: a scalar equal to ours */
      float v = 0;
      /* a bf16/f16 file (SimpleTuner saves in the parameters' dtype) rounds alpha */
      const double tol = t->dtype == CT_DTYPE_F32 ? 1e-6 : 1e-2;
      if (t->numel != 1 || ct_st_to_f32(t, &v, 1, err) || fabs(v - a->alpha) > tol * a->alpha) {
        char d[260];
        snprintf(d, sizeof d, "%s (%g, the config gives %g)", name, (double)v, a->alpha);
        note(lists[1], sizeof lists[1], &counts[1], d);
      }
      continue;
    }
    const int64_t s0 = a->t[k].rows, s1 = a->t[k].cols;
    if (t->ndim != 2 || t->shape[0] != s0 || t->shape[1] != s1) {
      char d[260];
      snprintf(d, sizeof d, "%s (has [%lld, %lld], needs [%lld, %lld])", name,
               (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)s0,
               (long long)s1);
      note(lists[1], sizeof lists[1], &counts[1], d);
      continue;
    }
    const size_t off = a->t[k].off, n = (size_t)(s0 * s1);
    const size_t a0 = off > lo ? off : lo, a1 = off + n < hi ? off + n : hi;
    if (a0 < a1) {
      ct_status st = ct_st_to_f32_range(t, a0 - off, a1 - a0, out + (a0 - lo), err);
      if (st) return st;
    }
  }
  return CT_OK;
}

ct_status ct_lycoris_load(const ct_lora *l, const char *path, size_t lo, size_t hi, float *out,
                          ct_err *err) {
  ct_st_file *f = NULL;
  ct_status st = ct_st_open(path, &f, err);
  if (st) return st;
  char lists[3][700] = {"", "", ""};
  int counts[3] = {0, 0, 0};
  size_t found = 0;
  for (size_t i = 0; !st && i < l->nad; i++)
    st = load_one(l, &l->ad[i], f, lo, hi, out, lists, counts, &found, err);
  for (size_t i = 0; !st && found + (size_t)counts[2] < f->ntensors && i < f->ntensors; i++) {
    const char *tn = f->tensors[i].name;
    int ours = 0;
    char name[200];
    for (size_t k = 0; k < l->nad && !ours; k++) {
      ct_lora_tensor_fullname(l, &l->ad[k], 0, name, sizeof name);
      const size_t pl = strchr(name, '.') - name;
      ours = !strncmp(tn, name, pl) && tn[pl] == '.' &&
             (!strcmp(tn + pl + 1, "alpha") || !strcmp(tn + pl + 1, l->ad[k].t[0].key) ||
              (l->ad[k].nt > 1 && !strcmp(tn + pl + 1, l->ad[k].t[1].key)) ||
              (l->ad[k].nt > 2 && !strcmp(tn + pl + 1, l->ad[k].t[2].key)) ||
              (l->ad[k].nt > 3 && !strcmp(tn + pl + 1, l->ad[k].t[3].key)));
    }
    if (!ours) note(lists[2], sizeof lists[2], &counts[2], tn);
  }
  ct_st_close(f);
  if (!st && (counts[0] || counts[1] || counts[2]))
    st = ct_errf(err, CT_ERR_FORMAT,
                 "%s is not a LyCORIS adapter for this model and lycoris_config: %d missing [%s]; "
                 "%d wrong shape or alpha [%s]; %d unexpected [%s]",
                 path, counts[0], lists[0], counts[1], lists[1], counts[2], lists[2]);
  return st;
}

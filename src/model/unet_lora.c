/* unet_lora.c: the U-net's Linear layers a LoRA target list names, matched
 * as peft matches target_modules given as strings (tuners_utils.py,
 * check_target_module_exists: the module's name equals the target or ends
 * with "." + target). SimpleTuner's SDXL default is the attention
 * projections (helpers/models/sdxl/model.py, DEFAULT_LORA_TARGET). */
#include <stdlib.h>
#include <string.h>

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

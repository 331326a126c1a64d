/* pytorch_lora_weights.safetensors in and out (include/ctuner/lora.h): the
 * tensor names FluxPipeline.save_lora_weights writes
 * (transformer.<module>.lora_A.weight / lora_B.weight) and the LoraConfig as
 * diffusers' "lora_adapter_metadata" (keys prefixed "transformer."), which
 * load_lora_weights hands to peft's LoraConfig — so lora_alpha survives. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "ctuner/lora.h"
#include "ctuner/safetensors.h"
#include "lora_impl.h"

void ct_lora_tensor_name(const ct_lora_adapter *a, int which_b, char *out, size_t cap) {
  snprintf(out, cap, "transformer.%s.lora_%c.weight", a->module, which_b ? 'B' : 'A');
}

void ct_lora_tensor_fullname(const ct_lora *l, const ct_lora_adapter *a, int k, char *out,
                             size_t cap) {
  if (!l->lyco && k == 2) {
    snprintf(out, cap, "transformer.%s.lora_magnitude_vector", a->module);
    return;
  }
  if (!l->lyco) {
    ct_lora_tensor_name(a, k, out, cap);
    return;
  }
  int n = snprintf(out, cap, "%s_%s", l->prefix, a->module);
  for (int i = (int)strlen(l->prefix) + 1; i < n && (size_t)i < cap; i++)
    if (out[i] == '.') out[i] = '_';
  if (n >= 0 && (size_t)n < cap) snprintf(out + n, cap - (size_t)n, ".%s", a->t[k].key);
}

/* Appends s to the growing string *buf (n used, cap allocated); 0 on failure. */
static int app(char **buf, size_t *n, size_t *cap, const char *s) {
  size_t k = strlen(s);
  if (*n + k + 1 > *cap) {
    size_t nc = *cap ? *cap * 2 : 1024;
    while (nc < *n + k + 1) nc *= 2;
    char *p = realloc(*buf, nc);
    if (!p) return 0;
    *buf = p;
    *cap = nc;
  }
  memcpy(*buf + *n, s, k + 1);
  *n += k;
  return 1;
}

/* The LoraConfig kwargs diffusers passes to peft; target_modules are the exact
 * module names adapted (a preset's short names would match the same ones). */
static char *config_json(const ct_lora *l) {
  const ct_lora_opts *o = ct_lora_options(l);
  size_t nad, n = 0, cap = 0;
  const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
  char *b = NULL, tmp[256];
  int ok = app(&b, &n, &cap, "{\"transformer.bias\": \"none\", \"transformer.lora_alpha\": ");
  snprintf(tmp, sizeof tmp, "%.17g, \"transformer.lora_dropout\": %.17g, \"transformer.r\": %d, ",
           o->alpha, o->dropout, o->rank);
  ok = ok && app(&b, &n, &cap, tmp);
  ok = ok && app(&b, &n, &cap, "\"transformer.target_modules\": [");
  for (size_t i = 0; ok && i < nad; i++) {
    snprintf(tmp, sizeof tmp, "%s\"%s\"", i ? ", " : "", ad[i].module);
    ok = app(&b, &n, &cap, tmp);
  }
  ok = ok &&
       app(&b, &n, &cap,
           o->dora ? "], \"transformer.use_dora\": true}" : "], \"transformer.use_dora\": false}");
  if (!ok) {
    free(b);
    return NULL;
  }
  return b;
}

ct_status ct_lora_save(const ct_lora *l, const float *w, const char *path, ct_err *err) {
  if (l->lyco) return ct_lycoris_save(l, w, path, err);
  size_t nad;
  const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
  const int r = ct_lora_options(l)->rank;
  ct_st_writer *wr;
  if (ct_st_writer_new(&wr)) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  char *meta = config_json(l);
  ct_status st = meta ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  char name[160];
  for (size_t i = 0; !st && i < nad; i++) {
    const int64_t sa[2] = {r, ad[i].in}, sb[2] = {ad[i].out, r};
    ct_lora_tensor_name(&ad[i], 0, name, sizeof name);
    st = ct_st_writer_add_f32(wr, name, 2, sa, w + ad[i].a_off, CT_DTYPE_F32, err);
    ct_lora_tensor_name(&ad[i], 1, name, sizeof name);
    if (!st) st = ct_st_writer_add_f32(wr, name, 2, sb, w + ad[i].b_off, CT_DTYPE_F32, err);
    if (!st && ad[i].nt == 3) { /* DoRA: the magnitude, 1-D [out] */
      const int64_t sm[1] = {ad[i].out};
      ct_lora_tensor_fullname(l, &ad[i], 2, name, sizeof name);
      st = ct_st_writer_add_f32(wr, name, 1, sm, w + ad[i].t[2].off, CT_DTYPE_F32, err);
    }
  }
  if (!st) st = ct_st_writer_meta(wr, "format", "pt", err);
  if (!st) st = ct_st_writer_meta(wr, "lora_adapter_metadata", meta, err);
  if (!st) st = ct_st_writer_write(wr, path, err);
  ct_st_writer_free(wr);
  free(meta);
  return st;
}

/* Up to 6 names in list, then "..." */
static void note(char *list, size_t cap, int *count, const char *name) {
  if ((*count)++ < 6) {
    size_t n = strlen(list);
    snprintf(list + n, cap - n, "%s%s", n ? ", " : "", name);
  } else if (*count == 7) {
    size_t n = strlen(list);
    snprintf(list + n, cap - n, ", ...");
  }
}

/* The file's lora_adapter_metadata must agree with our rank and alpha. */
static ct_status check_meta(const ct_lora *l, const ct_st_file *f, const char *path, ct_err *err) {
  const char *m = ct_st_meta(f, "lora_adapter_metadata");
  if (!m) return CT_OK; /* kohya/peft files without it: shapes decide */
  ct_json *j = NULL;
  ct_status st = ct_json_parse(m, strlen(m), &j, err);
  if (st) return ct_errf(err, CT_ERR_FORMAT, "%s: its lora_adapter_metadata is not JSON", path);
  const ct_lora_opts *o = ct_lora_options(l);
  const ct_json *r = ct_json_get(j, "transformer.r"), *a = ct_json_get(j, "transformer.lora_alpha");
  if (r && r->type == CT_JSON_NUMBER && (int)r->num != o->rank)
    st = ct_errf(err, CT_ERR_INVALID, "%s: an adapter of rank %d, not lora_rank %d", path,
                 (int)r->num, o->rank);
  else if (a && a->type == CT_JSON_NUMBER && fabs(a->num - o->alpha) > 1e-9 * fabs(o->alpha))
    st = ct_errf(err, CT_ERR_INVALID,
                 "%s: its lora_alpha is %g, not %g: set lora_alpha to %g to continue it", path,
                 a->num, o->alpha, a->num);
  ct_json_free(j);
  return st;
}

ct_status ct_lora_load(const ct_lora *l, const char *path, size_t lo, size_t hi, float *out,
                       ct_err *err) {
  if (l->lyco) return ct_lycoris_load(l, path, lo, hi, out, err);
  ct_st_file *f = NULL;
  ct_status st = ct_st_open(path, &f, err);
  if (st) return st;
  st = check_meta(l, f, path, err);
  size_t nad;
  const ct_lora_adapter *ad = ct_lora_adapters(l, &nad);
  char miss[700] = "", shape[700] = "", unexp[700] = "", name[160];
  int nmiss = 0, nshape = 0, nunexp = 0;
  size_t found = 0;
  for (size_t i = 0; !st && i < nad; i++) {
    for (int b = 0; b < ad[i].nt && !st; b++) {
      ct_lora_tensor_fullname(l, &ad[i], b, name, sizeof name);
      const ct_st_tensor *t = ct_st_find(f, name);
      const int64_t s0 = ad[i].t[b].rows, s1 = ad[i].t[b].cols;
      const int vec = b == 2; /* DoRA's magnitude: 1-D [out] */
      if (!t) {
        note(miss, sizeof miss, &nmiss, name);
        continue;
      }
      found++;
      if (t->ndim != (vec ? 1 : 2) || t->shape[0] != s0 || (!vec && t->shape[1] != s1)) {
        char d[220];
        snprintf(d, sizeof d, "%s (has [%lld, %lld], needs [%lld, %lld])", name,
                 (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)s0,
                 (long long)(vec ? 0 : s1));
        note(shape, sizeof shape, &nshape, d);
        continue;
      }
      const size_t off = ad[i].t[b].off, n = (size_t)(s0 * s1);
      const size_t a0 = off > lo ? off : lo, a1 = off + n < hi ? off + n : hi;
      if (a0 < a1) st = ct_st_to_f32_range(t, a0 - off, a1 - a0, out + (a0 - lo), err);
    }
  }
  for (size_t i = 0; !st && found + (size_t)nunexp < f->ntensors && i < f->ntensors; i++) {
    const char *tn = f->tensors[i].name;
    int ours = 0;
    for (size_t k = 0; k < nad && !ours; k++)
      for (int b = 0; b < ad[k].nt && !ours; b++) {
        ct_lora_tensor_fullname(l, &ad[k], b, name, sizeof name);
        ours = !strcmp(name, tn);
      }
    if (!ours) note(unexp, sizeof unexp, &nunexp, tn);
  }
  ct_st_close(f);
  if (!st && (nmiss || nshape || nunexp))
    st = ct_errf(err, CT_ERR_FORMAT,
                 "%s is not an adapter for this model and flux_lora_target: %d missing [%s]; %d "
                 "wrongly shaped [%s]; %d unexpected [%s]",
                 path, nmiss, miss, nshape, shape, nunexp, unexp);
  return st;
}

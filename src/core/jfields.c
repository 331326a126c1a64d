/* Typed fields of a config file's JSON object, every problem collected
 * (ctuner/jfields.h). */
#include "ctuner/jfields.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void ct_jf_prob(ct_jf_probs *p, const char *key, const char *what) {
  size_t l = strlen(p->buf);
  if (l + strlen(key) + strlen(what) + 16 < sizeof p->buf)
    snprintf(p->buf + l, sizeof p->buf - l, "%s%s %s", p->n ? "; " : "", key, what);
  p->n++;
}

const char *ct_jf_str(const ct_json *j, const char *key, ct_jf_probs *p) {
  const ct_json *v = ct_json_get(j, key);
  if (!v || v->type == CT_JSON_NULL) return NULL;
  if (v->type != CT_JSON_STRING) {
    ct_jf_prob(p, key, "must be a string");
    return NULL;
  }
  return v->str;
}

void ct_jf_num(const ct_json *j, const char *key, double *out, int nullable, ct_jf_probs *p) {
  const ct_json *v = ct_json_get(j, key);
  if (!v || (nullable && v->type == CT_JSON_NULL)) return;
  if (v->type != CT_JSON_NUMBER || !isfinite(v->num))
    ct_jf_prob(p, key, "must be a number");
  else
    *out = v->num;
}

void ct_jf_posint(const ct_json *j, const char *key, long *out, ct_jf_probs *p) {
  const ct_json *v = ct_json_get(j, key);
  if (!v) return;
  if (v->type != CT_JSON_NUMBER || !v->is_int || v->i64 < 1 || v->i64 > (1 << 30))
    ct_jf_prob(p, key, "must be a positive integer");
  else
    *out = (long)v->i64;
}

int ct_jf_flag(const ct_json *j, const char *key, int def, ct_jf_probs *p) {
  const ct_json *v = ct_json_get(j, key);
  if (!v || v->type == CT_JSON_NULL) return def;
  if (v->type != CT_JSON_BOOL) {
    ct_jf_prob(p, key, "must be true or false");
    return def;
  }
  return v->boolean;
}

void ct_jf_only(const ct_json *j, const char *key, const char *list, const char *why,
                ct_jf_probs *p) {
  const char *s = ct_jf_str(j, key, p);
  if (!s) return;
  char l[128], w[96];
  snprintf(l, sizeof l, "|%s|", list);
  snprintf(w, sizeof w, "|%s|", s);
  if (!strstr(l, w)) {
    char m[256];
    snprintf(m, sizeof m, "\"%s\" is not supported (%s)", s, why);
    ct_jf_prob(p, key, m);
  }
}

/* Typed fields of a JSON object read for a config file (a scheduler's
 * scheduler_config.json, a model's config.json): each reader takes what is
 * well typed and adds a problem ("KEY must be …") for what is not, so one
 * error can list every problem of a file at once. */
#ifndef CT_JFIELDS_H
#define CT_JFIELDS_H

#include "ctuner/json.h"

typedef struct ct_jf_probs {
  char buf[1024]; /* "key what; key what; …" (cut short past its size; n still counts) */
  int n;
} ct_jf_probs;

void ct_jf_prob(ct_jf_probs *p, const char *key, const char *what);
/* The string at key; NULL when absent or null (a problem when not a string). */
const char *ct_jf_str(const ct_json *j, const char *key, ct_jf_probs *p);
/* A finite number into *out when present (null too, with nullable: left as is). */
void ct_jf_num(const ct_json *j, const char *key, double *out, int nullable, ct_jf_probs *p);
/* An integer in [1, 2^30] into *out when present. */
void ct_jf_posint(const ct_json *j, const char *key, long *out, ct_jf_probs *p);
/* true/false; def when absent or null. */
int ct_jf_flag(const ct_json *j, const char *key, int def, ct_jf_probs *p);
/* The string at key must be one of list ("a|b") when present; why says
 * what ctuner does instead. */
void ct_jf_only(const ct_json *j, const char *key, const char *list, const char *why,
                ct_jf_probs *p);

#endif

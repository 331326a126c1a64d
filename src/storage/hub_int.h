/* Private to hub.c and hub_fetch.c (ctuner/hub.h). */
#ifndef CT_STORAGE_HUB_INT_H
#define CT_STORAGE_HUB_INT_H

#include <stddef.h>

#include "ctuner/hub.h"

/* HF_HOME as huggingface_hub computes it; *from: the variable used. Nonzero: too long. */
int ct_hub_home(char *out, size_t n, const char **from);
/* CACHE/models--ORG--NAME. Nonzero: too long. */
int ct_hub_repo_dir(const char *cache, const char *id, char *out, size_t n);
/* 1 if r can name a refs/ file (no "..", no leading '/', no control characters). */
int ct_hub_revision_ok(const char *r);
/* 0: not a weight file, 1: a non-variant weight, 2: a weight of variant (plain: its loader name).
 */
int ct_hub_weight_kind(const char *base, const char *variant, char *plain, size_t n);
/* The names in dir (no "." or ".."), sorted, malloc'd. Nonzero: cannot list. */
int hub_list_dir(const char *dir, char ***names, size_t *n);

#endif

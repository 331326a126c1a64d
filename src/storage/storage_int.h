/* storage_int.h: the backends behind ctuner/storage.h (local.c, s3.c). */
#ifndef CTUNER_STORAGE_INT_H
#define CTUNER_STORAGE_INT_H

#include <pthread.h>

#include "ctuner/storage.h"

typedef struct ct_storage_ops {
  ct_status (*get_many)(ct_storage *s, ct_storage_req *r, size_t n, ct_err *err);
  ct_status (*put)(ct_storage *s, const char *key, const void *data, size_t n, int durable,
                   ct_err *err);
  ct_status (*put_many)(ct_storage *s, ct_storage_put_req *r, size_t n, int durable,
                        ct_err *err); /* NULL: puts */
  ct_status (*head)(ct_storage *s, const char *key, uint64_t *size, ct_err *err);
  ct_status (*del)(ct_storage *s, const char *key, ct_err *err);
  ct_status (*list)(ct_storage *s, const char *dir, ct_storage_list *out, ct_err *err);
  void (*free)(ct_storage *s);
} ct_storage_ops;

struct ct_storage {
  const ct_storage_ops *ops;
  int remote;
  char *desc;
  char *root; /* local: the directory */
  pthread_mutex_t stat_mu;
  ct_storage_stats stats;
  void *impl;
};

/* Sort a listing bytewise (keys with their sizes). */
void ct_storage_list_sort(ct_storage_list *l);
/* Append to a listing; -1 when out of memory (the key is taken over). */
int ct_storage_list_push(ct_storage_list *l, size_t *cap, char *key, uint64_t size);

/* s3.c: one ListObjectsV2 page (NUL-terminated doc of n bytes): the keys
 * under prefix, relative to it, appended to out (keys that are not valid
 * keys here are skipped); *more and *token (malloc'd) for the next page.
 * CT_ERR_FORMAT when doc is not a ListBucketResult. Exposed for the fuzzer. */
ct_status ct_s3_list_page(const char *doc, size_t n, const char *prefix, ct_storage_list *out,
                          size_t *cap, int *more, char **token, ct_err *err);

#endif

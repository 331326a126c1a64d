/* data_int.h: declarations shared by the data module's files (not public). */
#ifndef CTUNER_DATA_INT_H
#define CTUNER_DATA_INT_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/data.h"
#include "ctuner/hash.h"

struct ct_comm;

/* bucket.c: re-fit an image to a given target (a bucket's shared size). */
void ct_bucket_refit(const ct_bucket_opts *o, int target_w, int target_h, uint64_t key_hash, ct_img_geom *g);


/* ---- cache.c: cache files ---- */

typedef enum { CT_CACHE_RAW = 0, CT_CACHE_GZIP, CT_CACHE_ZSTD } ct_cache_comp;


/* Compress (gzip or zstd) or pass through; *out malloc'd. */
ct_status ct_cache_pack(ct_cache_comp c, const void *in, size_t n, void **out, size_t *on, ct_err *err);
/* Detect gzip (1f 8b), zstd (28 b5 2f fd) or raw by magic; *out malloc'd
 * (may be in itself when raw: then *owned = 0). max bounds the output. */
ct_status ct_cache_unpack(const void *in, size_t n, size_t max, void **out, size_t *on, int *owned, ct_err *err);

/* A cache entry: named float tensors plus string metadata, stored as
 * safetensors bytes (optionally compressed) written atomically. */
typedef struct ct_cache_tensor {
  const char *name;
  int ndim;
  int64_t shape[4];
  const float *data;
} ct_cache_tensor;
ct_status ct_cache_write(const char *path, ct_cache_comp c, const ct_cache_tensor *t, int nt, const char *const *meta,
                         int nmeta, ct_err *err);
/* Read tensors by name into out[i] (sizes must match) and check metadata
 * pairs (key, value) all equal; a mismatch or a corrupt file is CT_ERR_FORMAT,
 * a missing one CT_ERR_NOT_FOUND. */
ct_status ct_cache_read(const char *path, const ct_cache_tensor *t, float *const *out, int nt,
                        const char *const *meta, int nmeta, ct_err *err);

/* ---- comm helpers ---- */

/* Every rank's bytes, concatenated in rank order (*all malloc'd; off[r] is
 * where rank r's part starts, off[size] the total). comm NULL: a copy. */
ct_status ct_data_allgatherv(struct ct_comm *comm, const void *mine, size_t n, char **all, size_t **off, ct_err *err);

#endif

/* data_int.h: declarations shared by the data module's files (not public). */
#ifndef CTUNER_DATA_INT_H
#define CTUNER_DATA_INT_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/data.h"
#include "ctuner/hash.h"
#include "ctuner/storage.h"

struct ct_comm;

/* bucket.c: re-fit an image to a given target (a bucket's shared size). */
void ct_bucket_refit(const ct_bucket_opts *o, int target_w, int target_h, uint64_t key_hash,
                     ct_img_geom *g);

/* ---- cache.c: cache files ---- */

typedef enum { CT_CACHE_RAW = 0, CT_CACHE_GZIP, CT_CACHE_ZSTD } ct_cache_comp;

/* Compress (gzip or zstd) or pass through; *out malloc'd. */
ct_status ct_cache_pack(ct_cache_comp c, const void *in, size_t n, void **out, size_t *on,
                        ct_err *err);
/* Detect gzip (1f 8b), zstd (28 b5 2f fd) or raw by magic; *out malloc'd
 * (may be in itself when raw: then *owned = 0). max bounds the output. */
ct_status ct_cache_unpack(const void *in, size_t n, size_t max, void **out, size_t *on, int *owned,
                          ct_err *err);

/* A cache entry: named float tensors plus string metadata, stored as
 * safetensors bytes (optionally compressed) written atomically. */
typedef struct ct_cache_tensor {
  const char *name;
  int ndim;
  int64_t shape[4];
  const float *data;
} ct_cache_tensor;
ct_status ct_cache_write(const char *path, ct_cache_comp c, const ct_cache_tensor *t, int nt,
                         const char *const *meta, int nmeta, ct_err *err);
/* Read tensors by name into out[i] (sizes must match) and check metadata
 * pairs (key, value) all equal; a mismatch or a corrupt file is CT_ERR_FORMAT,
 * a missing one CT_ERR_NOT_FOUND. */
ct_status ct_cache_read(const char *path, const ct_cache_tensor *t, float *const *out, int nt,
                        const char *const *meta, int nmeta, ct_err *err);
/* The same on an object of a storage (local directory or S3 bucket). */
ct_status ct_cache_put(ct_storage *s, const char *key, ct_cache_comp c, const ct_cache_tensor *t,
                       int nt, const char *const *meta, int nmeta, ct_err *err);
ct_status ct_cache_get(ct_storage *s, const char *key, const ct_cache_tensor *t, float *const *out,
                       int nt, const char *const *meta, int nmeta, ct_err *err);
/* An entry's bytes (packed) and their check (raw: as stored, packed or not;
 * anything wrong is CT_ERR_FORMAT). */
ct_status ct_cache_encode(ct_cache_comp c, const ct_cache_tensor *t, int nt,
                          const char *const *meta, int nmeta, void **out, size_t *on, ct_err *err);
ct_status ct_cache_decode(const void *raw, size_t n, const ct_cache_tensor *t, float *const *out,
                          int nt, const char *const *meta, int nmeta, ct_err *err);

/* ---- filelist.c: key sets and output_dir file lists ---- */

#include "ctuner/json.h"

/* The keys of a JSON object, sorted for binary search (duplicates: one kept). */
typedef struct ct_keyset {
  void *kv;
  size_t n;
  ct_json *owner;
} ct_keyset;
/* Takes obj (freed with the set, or at once on error). */
ct_status ct_keyset_from_json(ct_json *obj, ct_keyset *s, ct_err *err);
/* 1 when path held a JSON object (now in s); 0 if missing or bad (warned). */
int ct_keyset_load(const char *path, ct_keyset *s);
const ct_json *ct_keyset_find(const ct_keyset *s, const char *key);
const char *ct_keyset_key(const ct_keyset *s, size_t i); /* i < s->n, in strcmp order */
void ct_keyset_free(ct_keyset *s);

/* {outdir}/all_{kind}_files_{id}.json, kind "image", "vae_cache" or "text_cache". */
int ct_filelist_path(char *buf, size_t n, const char *outdir, const char *kind, const char *id);
void ct_filelist_remove(const char *outdir, const char *kind, const char *id);
/* Writes {prefix+key: false, ...} atomically; merge keeps what the file
 * already lists (several datasets sharing one text cache). */
ct_status ct_filelist_write(const char *outdir, const char *kind, const char *id,
                            const char *prefix, const char *const *keys, size_t n, int merge,
                            ct_err *err);

/* ---- comm helpers ---- */

/* Every rank's bytes, concatenated in rank order (*all malloc'd; off[r] is
 * where rank r's part starts, off[size] the total). comm NULL: a copy. */
ct_status ct_data_allgatherv(struct ct_comm *comm, const void *mine, size_t n, char **all,
                             size_t **off, ct_err *err);

#endif

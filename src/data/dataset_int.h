/* dataset_int.h: the dataset's private types, shared by its files (not public).
 *
 * dataset.c opens and frees a ct_dataset and answers its getters;
 * ds_buckets.c groups images into aspect buckets and checks them against the
 * effective batch; latent_cache.c and text_cache.c build the caches;
 * prefetch.c runs the producer thread and ct_dataset_next, which drives the
 * sampler (sampler.h: plain data, no dataset).
 */
#ifndef CTUNER_DATASET_INT_H
#define CTUNER_DATASET_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ctuner/config.h"
#include "data/data_int.h"
#include "data/sampler.h"

typedef struct item {
  char *rel;
  char **lines;
  int nlines;
  ct_img_geom g;
  uint64_t hash;
  int bucket;
  /* the reference (conditioning_data): its path in the conditioning dataset,
   * its placement and the hash of its path; ref NULL without one */
  char *ref;
  ct_img_geom rg;
  uint64_t rhash;
} item;

typedef struct bucket {
  char key[24];
  int w, h;
  int rw, rh;  /* the references' pixel size (conditioning_data), else 0 */
  size_t *idx; /* items */
  size_t n;
} bucket;

typedef struct dset {
  const ct_ds_config *c;
  char *dir;          /* the images as users see them: a path, or s3://bucket/prefix/dir */
  ct_storage *sto;    /* the dataset's storage (local directory or S3; owned by ct_dataset) */
  const char *imgdir; /* the images' key prefix in sto ("" = its root) */
  ct_bucket_opts bo;
  item *it;
  size_t nit;
  bucket *b;
  int nb;
  long repeats;
  char vae_dir[4096];  /* the latent cache as users see it (file lists, messages) */
  ct_storage *vae_sto; /* where its entries are: the S3 dataset's storage, or a local directory */
  char vae_key[4096];  /* their key prefix in vae_sto */
  char text_dir[4096]; /* the text_embeds dataset's cache_dir, or {output_dir}/cache/text */
  ct_storage *text_sto;
  char text_key[4096];
  long text_batch;     /* captions encoded at a time (write_batch_size) */
  const char *text_id; /* the text_embeds dataset's id (its file list's name) */
  int text_preserve;   /* preserve_data_backend_cache of this dataset or its text_embeds dataset */
  ct_cache_comp comp;  /* compress_disk_cache, or the dataset's compress_cache */
  /* conditioning_data: the conditioning dataset, where its images are, its
   * placement options (reference_loose) and its latent cache */
  const ct_ds_config *cc;
  ct_storage *csto;
  char *cdir;
  ct_bucket_opts cbo;
  char cvae_dir[4096];
  ct_storage *cvae_sto;
  char cvae_key[4096];
} dset;

/* The target (ref 0) or reference (ref 1) side of an item and its dataset. */
static inline const char *ct_it_rel(const item *it, int ref) {
  return ref ? it->ref : it->rel;
}
static inline const ct_img_geom *ct_it_geom(const item *it, int ref) {
  return ref ? &it->rg : &it->g;
}
static inline uint64_t ct_it_hash(const item *it, int ref) {
  return ref ? it->rhash : it->hash;
}

typedef struct slot {
  ct_batch b;
  float *x0;
  float *ref; /* (B, C, rh, rw) references, or NULL */
  const char **caps;
  uint64_t *ids;
  float *txt, *pooled;    /* text cache: (B, T, d), (B, dp) */
  unsigned char *miss;    /* text cache entries the trainer's thread must encode */
  const char **rels;      /* the samples' files (the CTUNER_DATA_TRACE test hook) */
  ct_img_geom *geom;      /* the samples' placements */
  unsigned char *dropped; /* 1: the sample's caption was dropped */
  const char *key;        /* the bucket */
  const dset *from;       /* the dataset of this batch */
  ct_sampler_pos after;   /* the position after this batch */
  int ready;
  ct_status st;
  ct_err err;
} slot;

struct ct_dataset {
  ct_data_opts o;
  const ct_config *cfg;
  ct_backend *be;
  ct_storage *
      *bsto; /* per backend entry, opened on first use (S3: one connection pool per dataset) */
  ct_storage **own; /* local cache directories */
  int nown;
  dset *d;
  int nd; /* datasets */
  int C, s, rank, world;
  size_t B, accum, E, maxlat;
  size_t maxref; /* floats of the largest reference latent (0: none) */
  ct_cache_comp comp;
  ct_data_stats stats;
  ct_sampler_pos pos; /* after the last batch the trainer took */
  /* producer */
  ct_sampler smp;      /* its position runs ahead of pos by the queued batches */
  ct_sampler_step cur; /* the current step */
  int pm;              /* its next micro-batch */
  /* queue */
  slot *q;
  int qn, qhead, qtail, qcount, started, stop;
  slot *held;
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  double wait_s;
};

/* ---- dataset.c ---- */

static inline size_t ct_ds_entries(const ct_dataset *ds, int d, int b) {
  return ds->d[d].b[b].n * (size_t)(ds->d[d].repeats + 1);
}
double ct_ds_now(void);
/* prefix/name (prefix "": name); -1 if it does not fit. */
int ct_ds_key_join(char *buf, size_t n, const char *prefix, const char *name);

/* ---- ds_buckets.c ---- */

void ct_ds_free_buckets(dset *d);
/* Group items by aspect key; a bucket's size is its first item's target. */
ct_status ct_ds_make_buckets(dset *d, ct_err *err);
/* Frees the items with drop[i] set and closes the gaps; returns how many went. */
size_t ct_ds_drop_items(dset *d, const unsigned char *drop);
/* SimpleTuner's checks of every bucket against the effective batch. */
ct_status ct_ds_check_effective_batch(ct_dataset *ds, dset *d, ct_err *err);
/* SimpleTuner's bucket index and metadata files (rank 0). */
void ct_ds_write_index(ct_dataset *ds, dset *d, const ct_data_stats *fs);

/* ---- latent_cache.c ---- */

typedef enum { LAT_CACHED, LAT_ENCODED, LAT_BAD, LAT_WRITE_FAILED } lat_result;

/* ref: 0 the item's own latent, 1 its reference's (the conditioning
 * dataset's image, encoded to the VAE's latent mean, in that dataset's cache). */
/* An item's cache entry: its key in vae_sto and (shown) its name in file
 * lists and messages. */
void ct_ds_latent_path(const dset *d, const item *it, int ref, char *key, size_t kn, char *shown,
                       size_t sn);
/* What a cache entry must have been made from. */
void ct_ds_latent_meta(const ct_dataset *ds, const item *it, int ref, char bufs[4][96],
                       const char *meta[8]);
/* The tensor of an item's entry. */
ct_cache_tensor ct_ds_latent_tensor(const ct_dataset *ds, const item *it, int ref, float *lat);
/* An item's latent: from the cache, or encoded (and written to the cache). */
lat_result ct_ds_latent_of(const ct_dataset *ds, const dset *d, const item *it, int ref, float *lat,
                           ct_err *err);
/* Every rank encodes its share of every dataset's images into the cache. */
ct_status ct_ds_build_latent_cache(ct_dataset *ds, ct_err *err);

/* ---- reference.c ---- */

/* conditioning_data: where the conditioning dataset's images and latent cache
 * are (d->cc set by the caller). */
ct_status ct_ds_setup_reference(ct_dataset *ds, dset *d, ct_err *err);
/* Pair every item of d with the conditioning image of the same relative path
 * (reference_strict: placed as the item; reference_loose: its own placement);
 * items without one are dropped and counted in *unpaired. */
ct_status ct_ds_pair_references(ct_dataset *ds, dset *d, size_t *unpaired, ct_err *err);

/* ---- text_cache.c ---- */

/* A caption's entry: its name in file lists and messages (out), and its key
 * in text_sto (key, if not NULL). */
void ct_ds_text_path(const ct_dataset *ds, const dset *d, const char *cap, char *out, size_t n,
                     char md5[33], char *key, size_t kn);
/* Read (write = 0) or write the entry of one caption. */
ct_status ct_ds_text_entry(const ct_dataset *ds, const dset *d, const char *cap, float *seq,
                           float *pooled, int write, ct_err *err);
/* Every caption of every dataset gets an entry (each rank encodes its share). */
ct_status ct_ds_build_text_cache(ct_dataset *ds, ct_err *err);

#endif

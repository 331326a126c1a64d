/* dataset.c: the training data behind ctuner/data.h.
 *
 * Open: parse the multidatabackend.json (backend.c); per image dataset,
 * discover its items (discover.c, spread over ranks), drop what the filters
 * reject (counted), place each image in an aspect bucket (bucket.c; every
 * image of a bucket shares its size), write SimpleTuner's bucket index and
 * metadata files, check every bucket against the effective batch (fail with
 * SimpleTuner's detailed message, oversubscribe, or prune), then build the
 * latent cache with each rank encoding its share of the images.
 *
 * Sampling: an optimizer step takes E consecutive entries of one bucket's
 * order for the epoch (a Philox shuffle of its images x (repeats + 1), keyed
 * by seed, dataset, bucket and epoch); the dataset and then the bucket are
 * drawn with a generator keyed by (seed, epoch, step-in-epoch), datasets by
 * `probability`, buckets by the whole steps they have left. Micro-batch m of
 * rank r takes entries [(m x ranks + r) x b, +b). A bucket with fewer than
 * E entries left is done for the epoch (its tail is not repeated); the epoch
 * ends when every bucket is done. The position (epoch, steps drawn, entries
 * consumed per bucket, samples seen) is all the state there is.
 *
 * Prefetch: a producer thread runs the same sampler ahead of the trainer and
 * fills a ring of slots (dataloader_prefetch_qlen); each slot carries the
 * position after it, which becomes the dataset's position when the trainer
 * takes the slot.
 */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctuner/alloc.h"
#include "ctuner/codec.h"
#include "ctuner/comm.h"
#include "ctuner/config.h"
#include "ctuner/fs.h"
#include "ctuner/image.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/rng.h"
#include "data/discover.h"

#define STREAM_PERM 0x5045524d00000000ull
#define STREAM_DSPICK 0x4453504b00000000ull
#define STREAM_BUCKET 0x424b504b00000000ull
#define STREAM_SUBSET 0x5355425300000000ull

typedef struct item {
  char *rel;
  char **lines;
  int nlines;
  ct_img_geom g;
  uint64_t hash;
  int bucket;
} item;

typedef struct bucket {
  char key[24];
  int w, h;
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
  int boff;            /* first flat bucket index */
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
} dset;

typedef struct position {
  long epoch, k;
  uint64_t seen;
  size_t *consumed; /* per flat bucket */
} position;

typedef struct slot {
  ct_batch b;
  float *x0;
  const char **caps;
  uint64_t *ids;
  float *txt, *pooled; /* text cache: (B, T, d), (B, dp) */
  unsigned char *miss; /* text cache entries the trainer's thread must encode */
  const char **rels;   /* the samples' files (the CTUNER_DATA_TRACE test hook) */
  const char *key;     /* the bucket */
  const dset *from;    /* the dataset of this batch */
  position after;
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
  int nd, nbt; /* datasets, flat buckets */
  int C, s, rank, world;
  size_t B, accum, E, maxlat;
  ct_cache_comp comp;
  ct_data_stats stats;
  position pos; /* after the last batch the trainer took */
  /* producer */
  position ppos;
  int pd, pb, pm; /* current step: dataset, bucket, next micro-batch */
  size_t pbase;
  uint64_t pseen; /* samples seen at the current step's start */
  int pnew_epoch;
  long perm_epoch;
  size_t **perm; /* per flat bucket */
  /* queue */
  slot *q;
  int qn, qhead, qtail, qcount, started, stop;
  slot *held;
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  double wait_s;
};

/* ---------------------------------------------------------------- helpers */

static void pos_copy(position *dst, const position *src, int nbt) {
  dst->epoch = src->epoch, dst->k = src->k, dst->seen = src->seen;
  memcpy(dst->consumed, src->consumed, (size_t)nbt * sizeof(size_t));
}

static size_t entries(const ct_dataset *ds, int d, int b) {
  return ds->d[d].b[b].n * (size_t)(ds->d[d].repeats + 1);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* --------------------------------------------------------------- storage */

static ct_status backend_storage(ct_dataset *ds, const ct_ds_config *c, ct_storage **out,
                                 ct_err *err) {
  const int k = (int)(c - ds->be->ds);
  ct_status st = ds->bsto[k] ? CT_OK : ct_ds_open_storage(c, &ds->bsto[k], err);
  *out = ds->bsto[k];
  return st;
}

static ct_status local_storage(ct_dataset *ds, const char *dir, ct_storage **out, ct_err *err) {
  ct_storage **no = realloc(ds->own, (size_t)(ds->nown + 1) * sizeof *no);
  if (!no) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ds->own = no;
  ct_status st = ct_storage_open_local(dir, out, err);
  if (!st) ds->own[ds->nown++] = *out;
  return st;
}

/* prefix/name (prefix "": name); -1 if it does not fit. */
static int key_join(char *buf, size_t n, const char *prefix, const char *name) {
  return ct_pathf(buf, n, "%s%s%s", prefix, *prefix ? "/" : "", name);
}

/* s3://bucket[/aws_data_prefix][/sub]: an S3 location as users see it. */
static void s3_name(const ct_ds_config *c, const char *sub, char *out, size_t n) {
  (void)ct_pathf(out, n, "s3://%s%s%s%s%s", c->s3.bucket, c->s3.prefix[0] ? "/" : "", c->s3.prefix,
                 sub && sub[0] ? "/" : "", sub ? sub : "");
}

/* --------------------------------------------------------------- buckets */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int cmp_bucket(const void *a, const void *b) {
  double x = atof(((const bucket *)a)->key), y = atof(((const bucket *)b)->key);
  return x < y ? -1 : x > y;
}

static void free_buckets(dset *d) {
  for (int i = 0; i < d->nb; i++) free(d->b[i].idx);
  free(d->b);
  d->b = NULL;
  d->nb = 0;
}

/* Group items by aspect key; a bucket's size is its first item's target. */
static ct_status make_buckets(dset *d, ct_err *err) {
  free_buckets(d);
  for (size_t i = 0; i < d->nit; i++) {
    item *it = &d->it[i];
    char key[24];
    ct_bucket_key(it->g.aspect, d->bo.rounding, key, sizeof key);
    int b;
    for (b = 0; b < d->nb; b++)
      if (!strcmp(d->b[b].key, key)) break;
    if (b == d->nb) {
      bucket *nb = realloc(d->b, (size_t)(d->nb + 1) * sizeof *nb);
      if (!nb) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
      d->b = nb;
      memset(&d->b[b], 0, sizeof d->b[b]);
      snprintf(d->b[b].key, sizeof d->b[b].key, "%s", key);
      d->b[b].w = it->g.target_w, d->b[b].h = it->g.target_h;
      d->nb++;
    }
    bucket *bk = &d->b[b];
    if (it->g.target_w != bk->w || it->g.target_h != bk->h)
      ct_bucket_refit(&d->bo, bk->w, bk->h, it->hash, &it->g);
    size_t *ni = realloc(bk->idx, (bk->n + 1) * sizeof *ni);
    if (!ni) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    bk->idx = ni;
    bk->idx[bk->n++] = i;
  }
  qsort(d->b, (size_t)d->nb, sizeof *d->b, cmp_bucket);
  for (int b = 0; b < d->nb; b++)
    for (size_t k = 0; k < d->b[b].n; k++) d->it[d->b[b].idx[k]].bucket = b;
  return CT_OK;
}

/* Frees the items with drop[i] set and closes the gaps; returns how many went. */
static size_t drop_items(dset *d, const unsigned char *drop) {
  size_t k = 0;
  for (size_t i = 0; i < d->nit; i++) {
    if (!drop[i]) {
      d->it[k++] = d->it[i];
      continue;
    }
    free(d->it[i].rel);
    for (int l = 0; l < d->it[i].nlines; l++) free(d->it[i].lines[l]);
    free(d->it[i].lines);
  }
  size_t gone = d->nit - k;
  d->nit = k;
  return gone;
}

/* SimpleTuner's checks of every bucket against the effective batch. */
static ct_status check_effective_batch(ct_dataset *ds, dset *d, ct_err *err) {
  const size_t E = ds->E;
  int nbad = 0;
  long need_r = 0;
  for (int b = 0; b < d->nb; b++)
    if (entries(ds, (int)(d - ds->d), b) < E) {
      nbad++;
      long r = (long)((E + d->b[b].n - 1) / d->b[b].n) - 1;
      if (r > need_r) need_r = r;
    }
  if (!nbad) return CT_OK;
  const ct_config *cfg = ds->cfg;
  if (cfg->allow_dataset_oversubscription && !(d->c->repeats_set && d->c->repeats > 0)) {
    CT_WARN(
        "dataset '%s': %d bucket(s) hold fewer samples than the effective batch %zu; "
        "allow_dataset_oversubscription sets repeats to %ld (each image seen %ld times per epoch)",
        d->c->id, nbad, E, need_r, need_r + 1);
    d->repeats = need_r;
    return CT_OK;
  }
  if (!cfg->disable_bucket_pruning && nbad < d->nb) {
    unsigned char *drop = calloc(d->nit + 1, 1);
    if (!drop) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    for (int b = d->nb - 1; b >= 0; b--)
      if (entries(ds, (int)(d - ds->d), b) < E) {
        CT_WARN(
            "dataset '%s': bucket %s (%dx%d) holds %zu sample(s) x (%ld+1) repeats = %zu, fewer "
            "than the "
            "effective batch %zu; pruned (its images are not trained on; set "
            "allow_dataset_oversubscription "
            "or add images to keep them)",
            d->c->id, d->b[b].key, d->b[b].w, d->b[b].h, d->b[b].n, d->repeats,
            entries(ds, (int)(d - ds->d), b), E);
        ds->stats.buckets_pruned++;
        for (size_t k = 0; k < d->b[b].n; k++) drop[d->b[b].idx[k]] = 1;
      }
    /* the pruned buckets' images leave the dataset (no cache, no captions) */
    ds->stats.kept -= drop_items(d, drop);
    free(drop);
    return make_buckets(d, err);
  }
  /* The detailed failure. */
  size_t total = 0;
  for (int b = 0; b < d->nb; b++) total += d->b[b].n;
  char msg[8192];
  int n = snprintf(msg, sizeof msg,
                   "Dataset '%s' cannot fill the effective batch size.\n"
                   "  Total samples: %zu image(s) in %d bucket(s); repeats: %ld\n"
                   "  Batch size: %ld x %d GPU(s)/rank(s) x gradient_accumulation_steps %ld = "
                   "effective batch %zu\n"
                   "Insufficient buckets:\n",
                   d->c->id, total, d->nb, d->repeats, cfg->train_batch_size, ds->world,
                   cfg->gradient_accumulation_steps, E);
  int shown = 0;
  for (int b = 0; b < d->nb && n < (int)sizeof msg - 1200; b++) {
    size_t have = entries(ds, (int)(d - ds->d), b);
    if (have >= E) continue;
    n += snprintf(msg + n, n < (int)sizeof msg ? sizeof msg - (size_t)n : 0,
                  "  Bucket %s: %zu samples x (%ld+1) = %zu samples; need at least %zu; minimum "
                  "repeats: %zu\n",
                  d->b[b].key, d->b[b].n, d->repeats, have, E, (E + d->b[b].n - 1) / d->b[b].n - 1);
    shown++;
  }
  if (shown < nbad)
    n += snprintf(msg + n, n < (int)sizeof msg ? sizeof msg - (size_t)n : 0, "  ... and %d more\n",
                  nbad - shown);
  n += snprintf(
      msg + n, n < (int)sizeof msg ? sizeof msg - (size_t)n : 0,
      "Solutions:\n"
      "  1. Reduce --train_batch_size (now %ld)\n"
      "  2. Use fewer GPUs/ranks (now %d)\n"
      "  3. Reduce --gradient_accumulation_steps (now %ld)\n"
      "  4. Set \"repeats\": %ld (or more) on dataset '%s'\n"
      "  5. Add more images to the small buckets\n"
      "  6. Set --allow_dataset_oversubscription=true to apply the minimum repeats automatically\n",
      cfg->train_batch_size, ds->world, cfg->gradient_accumulation_steps, need_r, d->c->id);
  if (d->c->repeats_set && d->c->repeats > 0)
    n += snprintf(msg + n, n < (int)sizeof msg ? sizeof msg - (size_t)n : 0,
                  "Note: repeats is set by hand (%ld) on dataset '%s'; "
                  "--allow_dataset_oversubscription does not "
                  "override it.\n",
                  d->c->repeats, d->c->id);
  if (cfg->disable_bucket_pruning)
    n += snprintf(msg + n, n < (int)sizeof msg ? sizeof msg - (size_t)n : 0,
                  "(bucket pruning is off: disable_bucket_pruning is set)\n");
  CT_ERROR("%s", msg);
  return ct_errf(err, CT_ERR_INVALID, "%s", msg);
}

/* ---------------------------------------------------------- index files */

/* aspect_ratio_bucket_indices_<id>.json and aspect_ratio_bucket_metadata_<id>.json
 * beside the images (SimpleTuner's place; in the bucket for an S3 dataset),
 * or in output_dir when that fails (a read-only directory). Rank 0 writes;
 * atomic. */
static void write_index(ct_dataset *ds, dset *d, const ct_data_stats *fs) {
  for (int attempt = 0; attempt < 2; attempt++) {
    char p1[4200], p2[4200], n1s[200], n2s[200];
    snprintf(n1s, sizeof n1s, "aspect_ratio_bucket_indices_%s.json", d->c->id);
    snprintf(n2s, sizeof n2s, "aspect_ratio_bucket_metadata_%s.json", d->c->id);
    if (attempt
            ? ct_pathf(p1, sizeof p1, "%s/%s", ds->cfg->output_dir, n1s) ||
                  ct_pathf(p2, sizeof p2, "%s/%s", ds->cfg->output_dir, n2s)
            : key_join(p1, sizeof p1, d->imgdir, n1s) || key_join(p2, sizeof p2, d->imgdir, n2s))
      return;
    char *b1 = NULL, *b2 = NULL;
    size_t n1 = 0, n2 = 0;
    FILE *f = open_memstream(&b1, &n1);
    if (!f) return;
    fprintf(
        f,
        "{\"config\": {\"resolution\": %g, \"resolution_type\": \"%s\", "
        "\"aspect_bucket_alignment\": %d, "
        "\"aspect_bucket_rounding\": %d, \"crop\": %s, \"crop_style\": %d, \"crop_aspect\": %d},\n",
        d->bo.resolution, d->bo.resolution_type == CT_RES_AREA ? "area" : "pixel", d->bo.alignment,
        d->bo.rounding, d->bo.crop ? "true" : "false", (int)d->bo.crop_style,
        (int)d->bo.crop_aspect);
    fprintf(f, " \"aspect_ratio_bucket_indices\": {");
    for (int b = 0; b < d->nb; b++) {
      fprintf(f, "%s\n  \"%s\": [", b ? "," : "", d->b[b].key);
      for (size_t k = 0; k < d->b[b].n; k++) {
        char full[8400];
        snprintf(full, sizeof full, "%s/%s", d->dir, d->it[d->b[b].idx[k]].rel);
        if (k) fputs(", ", f);
        ct_json_fput_str(f, full);
      }
      fputc(']', f);
    }
    fprintf(
        f,
        "},\n \"filtering_statistics\": {\"total_processed\": %zu, \"skipped\": {\"too_small\": "
        "%zu, "
        "\"aspect_ratio\": %zu, \"unreadable\": %zu, \"no_caption\": %zu, \"outside_dir\": %zu, "
        "\"duplicate\": %zu, \"not_found\": %zu, \"metadata_missing\": %zu, \"max_num_samples\": "
        "%zu}}}\n",
        fs->total_processed, fs->too_small, fs->aspect_ratio, fs->unreadable, fs->no_caption,
        fs->outside_dir, fs->duplicate, fs->not_found, fs->metadata_missing, fs->max_num_samples);
    fclose(f);
    f = open_memstream(&b2, &n2);
    if (!f) {
      free(b1);
      return;
    }
    fputc('{', f);
    for (size_t i = 0; i < d->nit; i++) {
      const ct_img_geom *g = &d->it[i].g;
      fprintf(f, "%s\n ", i ? "," : "");
      ct_json_fput_str(f, d->it[i].rel);
      fprintf(f,
              ": {\"original_size\": [%d, %d], \"intermediary_size\": [%d, %d], "
              "\"crop_coordinates\": [%d, %d], "
              "\"target_size\": [%d, %d], \"aspect_ratio\": %g}",
              g->orig_w, g->orig_h, g->inter_w, g->inter_h, g->crop_y, g->crop_x, g->target_w,
              g->target_h, g->aspect);
    }
    fputs("\n}\n", f);
    fclose(f);
    ct_err e = {0};
    ct_status st =
        attempt ? ct_write_file_atomic(p1, b1, n1, &e) : ct_storage_put(d->sto, p1, b1, n1, 1, &e);
    if (!st)
      st = attempt ? ct_write_file_atomic(p2, b2, n2, &e)
                   : ct_storage_put(d->sto, p2, b2, n2, 1, &e);
    free(b1);
    free(b2);
    if (!st) return;
    CT_WARN("dataset '%s': cannot write the bucket index beside the images (%s)%s", d->c->id, e.msg,
            attempt ? "" : "; writing it to output_dir");
  }
}

/* ---------------------------------------------------------------- latents */

/* An item's cache entry: its key in vae_sto and (shown) its name in file
 * lists and messages: {cache_dir_vae}/{sha256(path without extension)}.st. */
static void latent_path(const dset *d, const item *it, char *key, size_t kn, char *shown,
                        size_t sn) {
  char stem[4096], hex[65], name[80];
  snprintf(stem, sizeof stem, "%s", it->rel);
  char *dot = strrchr(stem, '.'), *slash = strrchr(stem, '/');
  if (dot && (!slash || dot > slash)) *dot = 0;
  ct_sha256_hex(stem, strlen(stem), hex);
  snprintf(name, sizeof name, "%s.st", hex);
  if (key) key_join(key, kn, d->vae_key, name);
  if (shown) (void)ct_pathf(shown, sn, "%s/%s", d->vae_dir, name);
}

/* What a cache entry must have been made from. */
static void latent_meta(const ct_dataset *ds, const item *it, char bufs[4][96],
                        const char *meta[8]) {
  const ct_img_geom *g = &it->g;
  if (ds->o.codec)
    snprintf(bufs[0], 96, "%s", ds->o.codec->tag);
  else
    snprintf(bufs[0], 96, "pixel:%d", ds->s);
  snprintf(bufs[1], 96, "%dx%d", g->target_w, g->target_h);
  snprintf(bufs[2], 96, "%d,%d,%dx%d", g->crop_x, g->crop_y, g->inter_w, g->inter_h);
  snprintf(bufs[3], 96, "%dx%d", g->orig_w, g->orig_h);
  meta[0] = "codec", meta[1] = bufs[0], meta[2] = "target_size", meta[3] = bufs[1];
  meta[4] = "crop", meta[5] = bufs[2], meta[6] = "original_size", meta[7] = bufs[3];
}

/* Decode, resize to the intermediary size, crop, encode. bytes: the image
 * file when the caller fetched it, else NULL (fetched here). */
static ct_status encode_item(const ct_dataset *ds, const dset *d, const item *it, const char *bytes,
                             size_t n, float *lat, ct_err *err) {
  char key[4400];
  char *own = NULL;
  ct_image img = {0}, r = {0}, c = {0};
  const ct_img_geom *g = &it->g;
  ct_status st = CT_OK;
  if (key_join(key, sizeof key, d->imgdir, it->rel))
    return ct_errf(err, CT_ERR_RANGE, "%s: path too long", it->rel);
  if (!bytes) {
    st = ct_storage_get(d->sto, key, (size_t)1 << 30, &own, &n, err);
    bytes = own;
  }
  if (!st) st = ct_image_decode(bytes, n, &img, err);
  if (st) ct_err_prefix(err, "%s/%s: ", d->dir, it->rel);
  if (!st && (img.w != g->orig_w || img.h != g->orig_h))
    st = ct_errf(err, CT_ERR_FORMAT, "%s/%s: decoded %dx%d but its header said %dx%d", d->dir,
                 it->rel, img.w, img.h, g->orig_w, g->orig_h);
  free(own);
  if (!st) st = ct_image_resize(&img, g->inter_w, g->inter_h, &r, err);
  if (!st) st = ct_image_crop(&r, g->crop_x, g->crop_y, g->target_w, g->target_h, &c, err);
  if (!st)
    st = ds->o.codec ? ct_codec_encode(ds->o.codec, c.px, c.w, c.h, it->hash, lat, err)
                     : ct_pixel_encode(c.px, c.w, c.h, ds->s, lat, err);
  ct_image_free(&img);
  ct_image_free(&r);
  ct_image_free(&c);
  return st;
}

typedef enum { LAT_CACHED, LAT_ENCODED, LAT_BAD, LAT_WRITE_FAILED } lat_result;

/* The tensor of an item's entry. */
static ct_cache_tensor latent_tensor(const ct_dataset *ds, const item *it, float *lat) {
  const ct_img_geom *g = &it->g;
  return (ct_cache_tensor){"latent", 3, {ds->C, g->target_h / ds->s, g->target_w / ds->s, 0}, lat};
}

/* An item's latent: its cache entry when that is valid, else encoded from the
 * image and (unless vae_cache_disable) written to the cache. The path of the
 * prefetch thread (the cache build batches the same steps, build_chunk); err
 * says what went wrong for LAT_BAD (the image) and LAT_WRITE_FAILED (the
 * cache; lat is still valid). */
static lat_result latent_of(const ct_dataset *ds, const dset *d, const item *it, float *lat,
                            ct_err *err) {
  if (d->c->vae_cache_disable)
    return encode_item(ds, d, it, NULL, 0, lat, err) ? LAT_BAD : LAT_ENCODED;
  ct_cache_tensor t = latent_tensor(ds, it, lat);
  char key[4400], bufs[4][96];
  const char *meta[8];
  latent_path(d, it, key, sizeof key, NULL, 0);
  latent_meta(ds, it, bufs, meta);
  float *outs[1] = {lat};
  ct_err re = {0};
  ct_status st = ct_cache_get(d->vae_sto, key, &t, outs, 1, meta, 4, &re);
  if (st == CT_OK) return LAT_CACHED;
  if (st != CT_ERR_NOT_FOUND) CT_WARN("latent cache entry unusable (%s); rebuilding it", re.msg);
  if (encode_item(ds, d, it, NULL, 0, lat, err)) return LAT_BAD;
  return ct_cache_put(d->vae_sto, key, d->comp, &t, 1, meta, 4, err) ? LAT_WRITE_FAILED
                                                                     : LAT_ENCODED;
}

/* all_vae_cache_files_<id>.json: every entry of the finished build. */
static void write_vae_list(const ct_dataset *ds, const dset *d) {
  char **paths = calloc(d->nit + 1, sizeof *paths);
  size_t k = 0;
  for (; paths && k < d->nit; k++) {
    char p[4200];
    latent_path(d, &d->it[k], NULL, 0, p, sizeof p);
    if (!(paths[k] = strdup(p))) break;
  }
  ct_err e = {0};
  if (!paths || k < d->nit ||
      ct_filelist_write(ds->cfg->output_dir, "vae_cache", d->c->id, NULL,
                        (const char *const *)paths, k, 0, &e))
    CT_WARN("dataset '%s': cannot write its latent cache file list to output_dir: %s", d->c->id,
            e.msg[0] ? e.msg : "out of memory");
  for (size_t i = 0; paths && i < k; i++) free(paths[i]);
  free(paths);
}

/* Items per ct_storage_get_many of the cache build (S3: transfers in parallel
 * over the connection pool). */
#define BUILD_CHUNK 64

typedef struct build_acc {
  size_t built, trusted;
  char *mine;  /* mine[i - lo]: item i failed */
  int fatal;   /* a cache write (or an S3 read) failed here */
  ct_err ferr; /* its message */
} build_acc;

static void build_fatal(build_acc *A, const ct_err *e) {
#pragma omp critical(ct_cache_fatal)
  {
    if (!A->fatal) A->ferr = *e;
    A->fatal = 1;
  }
}

/* Items [a, b) of d (this rank's share starts at lo): read their entries with
 * one get_many, check them, fetch the images of the missing or bad ones with
 * another, then decode, encode and write those. */
static void build_chunk(const ct_dataset *ds, const dset *d, size_t lo, size_t a, size_t b,
                        const ct_keyset *listed, build_acc *A) {
  const size_t n = b - a;
  ct_storage_req *er = calloc(n, sizeof *er), *ir = calloc(n, sizeof *ir),
                 *pk = calloc(n, sizeof *pk);
  size_t *map = calloc(n, sizeof *map), np = 0;
  unsigned char *todo = calloc(n, 1);
  void **packed = calloc(n, sizeof *packed); /* encoded entries to write */
  size_t *packed_n = calloc(n, sizeof *packed_n);
  ct_storage_put_req *puts = calloc(n, sizeof *puts);
  ct_err e = {0};
  if (!er || !ir || !pk || !map || !todo || !packed || !packed_n || !puts) {
    snprintf(e.msg, sizeof e.msg, "out of memory for the latent cache build");
    build_fatal(A, &e);
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    char key[4400], shown[4400];
    latent_path(d, &d->it[a + i], key, sizeof key, shown, sizeof shown);
    if (listed->n && ct_keyset_find(listed, shown)) {
      A->trusted++;
      continue;
    }
    if (!(er[i].key = strdup(key))) {
      snprintf(e.msg, sizeof e.msg, "out of memory for the latent cache build");
      build_fatal(A, &e);
      goto out;
    }
    map[np] = i, pk[np++] = er[i];
  }
  /* 1. the entries (a failed read is a rebuild, not an error) */
  ct_storage_get_many(d->vae_sto, pk, np, &e);
  for (size_t k = 0; k < np; k++) er[map[k]] = pk[k];
  const int par = !ds->o.codec || !ds->o.codec->serial;
#pragma omp parallel if (par)
  {
    float *lat = ct_alloc(CT_MEM_BUFFERS, ds->maxlat * sizeof(float));
#pragma omp for schedule(dynamic, 1)
    for (long k = 0; k < (long)np; k++) {
      const size_t i = map[k];
      const item *it = &d->it[a + i];
      if (er[i].st == CT_OK && lat) {
        char bufs[4][96];
        const char *meta[8];
        ct_cache_tensor t = latent_tensor(ds, it, lat);
        float *outs[1] = {lat};
        ct_err re = {0};
        latent_meta(ds, it, bufs, meta);
        if (ct_cache_decode(er[i].data, er[i].n, &t, outs, 1, meta, 4, &re) == CT_OK) continue;
        CT_WARN("latent cache entry %s of dataset '%s' is unusable (%s); rebuilding it", er[i].key,
                d->c->id, re.msg);
      } else if (er[i].st != CT_ERR_NOT_FOUND) {
        CT_WARN("latent cache entry %s of dataset '%s' cannot be read (%s); rebuilding it",
                er[i].key, d->c->id, ct_status_name(er[i].st));
      }
      todo[i] = 1;
    }
    ct_free(lat);
  }
  /* 2. the images of the entries to build */
  np = 0;
  for (size_t i = 0; i < n; i++) {
    free(er[i].data), er[i].data = NULL;
    if (!todo[i]) continue;
    char key[4400];
    if (key_join(key, sizeof key, d->imgdir, d->it[a + i].rel) || !(ir[i].key = strdup(key))) {
      A->mine[a + i - lo] = 1;
      continue;
    }
    ir[i].max = (size_t)1 << 30;
    map[np] = i, pk[np++] = ir[i];
  }
  ct_err ge = {0};
  ct_status gs = ct_storage_get_many(d->sto, pk, np, &ge);
  for (size_t k = 0; k < np; k++) ir[map[k]] = pk[k];
  if ((gs == CT_ERR_IO || gs == CT_ERR_NOMEM) &&
      ct_storage_is_remote(d->sto)) { /* the network, not the images: no image is dropped for it */
    ct_err_prefix(&ge, "reading the images of dataset '%s': ", d->c->id);
    build_fatal(A, &ge);
    goto out;
  }
  size_t built = 0;
#pragma omp parallel if (par) reduction(+ : built)
  {
    float *lat = ct_alloc(CT_MEM_BUFFERS, ds->maxlat * sizeof(float));
#pragma omp for schedule(dynamic, 1)
    for (long k = 0; k < (long)np; k++) {
      const size_t i = map[k];
      const item *it = &d->it[a + i];
      ct_err ie = {0};
      if (!lat) {
        snprintf(ie.msg, sizeof ie.msg, "out of memory for a latent");
        build_fatal(A, &ie);
        continue;
      }
      ct_status st = ir[i].st;
      if (st)
        ct_errf(&ie, st, "%s/%s: %s", d->dir, it->rel,
                st == CT_ERR_NOT_FOUND ? "not found" : "cannot be read");
      else
        st = encode_item(ds, d, it, ir[i].data, ir[i].n, lat, &ie);
      if (st) {
        CT_WARN("dataset '%s': %s; skipped", d->c->id, ie.msg);
        A->mine[a + i - lo] = 1;
        continue;
      }
      char bufs[4][96];
      const char *meta[8];
      ct_cache_tensor t = latent_tensor(ds, it, lat);
      latent_meta(ds, it, bufs, meta);
      if (ct_cache_encode(d->comp, &t, 1, meta, 4, &packed[i], &packed_n[i], &ie))
        build_fatal(A, &ie);
      else
        built++;
    }
    ct_free(lat);
  }
  /* 3. the new entries with one put_many (S3: over the pool) */
  np = 0;
  for (size_t i = 0; i < n; i++)
    if (packed[i])
      puts[np++] = (ct_storage_put_req){.key = er[i].key, .data = packed[i], .n = packed_n[i]};
  ct_err pe = {0};
  if (np && ct_storage_put_many(d->vae_sto, puts, np, 0, &pe))
    build_fatal(A, &pe);
  else
    A->built += built;
out:
  for (size_t i = 0; i < n && packed; i++) free(packed[i]);
  free(packed), free(packed_n), free(puts);
  for (size_t i = 0; i < n && er; i++) free(er[i].data), free((char *)er[i].key);
  for (size_t i = 0; i < n && ir; i++) free(ir[i].data), free((char *)ir[i].key);
  free(er), free(ir), free(pk), free(map), free(todo);
}

/* Every rank encodes its share of every dataset's images into the cache;
 * images that fail are dropped everywhere (counted as unreadable). A failed
 * cache write fails every rank. */
static ct_status build_latent_cache(ct_dataset *ds, ct_err *err) {
  ct_status st = CT_OK;
  for (int di = 0; di < ds->nd && !st; di++) {
    dset *d = &ds->d[di];
    if (d->c->vae_cache_disable) continue;
    if (!ct_storage_is_remote(d->vae_sto) && (st = ct_mkdir_p(d->vae_dir, err))) break;
    const size_t lo = d->nit * (size_t)ds->rank / (size_t)ds->world,
                 hi = d->nit * (size_t)(ds->rank + 1) / (size_t)ds->world;
    /* mine[i - lo]: item i failed; mine[hi - lo]: a cache write failed here */
    char *mine = calloc(hi - lo + 1, 1), *all = NULL;
    size_t *off = NULL;
    const double t0 = now_s();
    if (!mine) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    /* preserve_data_backend_cache: entries the last finished build listed are
     * not read back here (a batch still validates what it reads) */
    ct_keyset listed = {0};
    char lp[4200];
    if (d->c->preserve_data_backend_cache &&
        !ct_filelist_path(lp, sizeof lp, ds->cfg->output_dir, "vae_cache", d->c->id))
      ct_keyset_load(lp, &listed);
    build_acc A = {0, 0, mine, 0, {0}};
    for (size_t a = lo; a < hi && !A.fatal; a += BUILD_CHUNK)
      build_chunk(ds, d, lo, a, a + BUILD_CHUNK < hi ? a + BUILD_CHUNK : hi, &listed, &A);
    mine[hi - lo] = (char)A.fatal;
    /* everyone learns which images failed and whether a write failed */
    st = ct_data_allgatherv(ds->o.comm, mine, hi - lo + 1, &all, &off, err);
    unsigned char *drop = st ? NULL : calloc(d->nit + 1, 1);
    int anyfatal = 0;
    if (!st && !drop) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    for (int r = 0; !st && r < ds->world; r++) {
      size_t rlo = d->nit * (size_t)r / (size_t)ds->world,
             rhi = d->nit * (size_t)(r + 1) / (size_t)ds->world;
      memcpy(drop + rlo, all + off[r], rhi - rlo);
      anyfatal |= all[off[r] + (rhi - rlo)];
    }
    if (!st && anyfatal)
      st = mine[hi - lo]
               ? ct_errf(err, CT_ERR_IO, "writing the latent cache of dataset '%s' failed: %s",
                         d->c->id, A.ferr.msg)
               : ct_errf(err, CT_ERR_IO,
                         "another rank failed writing the latent cache of dataset '%s'", d->c->id);
    size_t dropped = 0;
    if (!st) {
      dropped = drop_items(d, drop);
      ds->stats.unreadable += dropped;
      ds->stats.kept -= dropped;
      if (dropped) st = make_buckets(d, err);
    }
    ct_keyset_free(&listed);
    if (!st && ds->rank == 0) write_vae_list(ds, d);
    free(mine);
    free(all);
    free(off);
    free(drop);
    CT_INFO(
        "dataset '%s': latent cache in %s: %zu encoded by this rank in %.1f s (%zu listed entries "
        "trusted), %zu unreadable image(s) dropped",
        d->c->id, d->vae_dir, A.built, now_s() - t0, A.trusted, dropped);
  }
  return st;
}

/* ------------------------------------------------------------- text cache */

/* A caption's entry: its name in file lists and messages (out), and its key
 * in text_sto (key, if not NULL). */
static void text_path(const ct_dataset *ds, const dset *d, const char *cap, char *out, size_t n,
                      char md5[33], char *key, size_t kn) {
  char name[120];
  ct_md5_hex(cap, strlen(cap), md5);
  snprintf(name, sizeof name, "%s-%s.st", md5, ds->o.text->tag);
  (void)ct_pathf(out, n, "%s/%s", d->text_dir, name);
  if (key) key_join(key, kn, d->text_key, name);
}

/* Read (write = 0) or write the entry of one caption. */
static ct_status text_entry(const ct_dataset *ds, const dset *d, const char *cap, float *seq,
                            float *pooled, int write, ct_err *err) {
  const ct_text_encoder_fn *te = ds->o.text;
  char path[4200], md5[33], key[4400];
  text_path(ds, d, cap, path, sizeof path, md5, key, sizeof key);
  const char *meta[4] = {"encoder", te->tag, "caption_md5", md5};
  ct_cache_tensor t[2] = {{"seq", 2, {te->T, te->d, 0, 0}, seq},
                          {"pooled", 1, {te->dp, 0, 0, 0}, pooled}};
  if (write) return ct_cache_put(d->text_sto, key, d->comp, t, 2, meta, 2, err);
  float *outs[2] = {seq, pooled};
  return ct_cache_get(d->text_sto, key, t, outs, 2, meta, 2, err);
}

/* The entries of captions caps[a, b) read at once (one get_many: S3 fetches
 * them over the pool). *bad: index of the first missing or unusable entry, or
 * b. A storage failure other than a missing entry is returned. */
static ct_status text_group_check(const ct_dataset *ds, const dset *d, const char **caps, size_t a,
                                  size_t b, const ct_keyset *listed, float *seq, float *pooled,
                                  size_t *bad, size_t *trusted, ct_err *err) {
  const ct_text_encoder_fn *te = ds->o.text;
  const size_t m = b - a;
  *bad = b;
  ct_storage_req *rq = calloc(m, sizeof *rq);
  char(*keys)[4400] = malloc(m * sizeof *keys);
  size_t *idx = malloc(m * sizeof *idx), k = 0;
  ct_status st =
      rq && keys && idx ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory for the text cache");
  for (size_t i = a; !st && i < b; i++) {
    char path[4200], md5[33];
    text_path(ds, d, caps[i], path, sizeof path, md5, keys[k], sizeof keys[k]);
    if (listed->n &&
        ct_keyset_find(listed, path)) { /* preserve_data_backend_cache: not read back */
      (*trusted)++;
      continue;
    }
    rq[k].key = keys[k];
    idx[k++] = i;
  }
  if (!st && k) st = ct_storage_get_many(d->text_sto, rq, k, err);
  for (size_t j = 0; !st && j < k && *bad == b; j++) {
    char md5[33];
    ct_md5_hex(caps[idx[j]], strlen(caps[idx[j]]), md5);
    const char *meta[4] = {"encoder", te->tag, "caption_md5", md5};
    ct_cache_tensor t[2] = {{"seq", 2, {te->T, te->d, 0, 0}, seq},
                            {"pooled", 1, {te->dp, 0, 0, 0}, pooled}};
    float *outs[2] = {seq, pooled};
    ct_err e = {0};
    if (rq[j].st == CT_ERR_NOT_FOUND)
      *bad = idx[j];
    else if (ct_cache_decode(rq[j].data, rq[j].n, t, outs, 2, meta, 2, &e)) {
      CT_WARN("text cache entry %s unusable (%s); rebuilding it", keys[j], e.msg);
      *bad = idx[j];
    }
  }
  for (size_t j = 0; rq && j < k; j++) free(rq[j].data);
  free(rq), free(keys), free(idx);
  return st;
}

/* The entries of m captions just encoded, written at once (one put_many). */
static ct_status text_group_write(const ct_dataset *ds, const dset *d, const char **caps, int m,
                                  const float *seq, const float *pooled, ct_err *err) {
  const ct_text_encoder_fn *te = ds->o.text;
  const size_t Td = (size_t)te->T * (size_t)te->d;
  ct_storage_put_req *rq = calloc((size_t)m, sizeof *rq);
  char(*keys)[4400] = malloc((size_t)m * sizeof *keys);
  void **bufs = calloc((size_t)m, sizeof *bufs);
  ct_status st =
      rq && keys && bufs ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory for the text cache");
  for (int j = 0; !st && j < m; j++) {
    char path[4200], md5[33];
    text_path(ds, d, caps[j], path, sizeof path, md5, keys[j], sizeof keys[j]);
    const char *meta[4] = {"encoder", te->tag, "caption_md5", md5};
    ct_cache_tensor t[2] = {{"seq", 2, {te->T, te->d, 0, 0}, seq + (size_t)j * Td},
                            {"pooled", 1, {te->dp, 0, 0, 0}, pooled + (size_t)j * te->dp}};
    st = ct_cache_encode(d->comp, t, 2, meta, 2, &bufs[j], &rq[j].n, err);
    rq[j].key = keys[j], rq[j].data = bufs[j];
  }
  if (!st) st = ct_storage_put_many(d->text_sto, rq, (size_t)m, 0, err);
  for (int j = 0; bufs && j < m; j++) free(bufs[j]);
  free(rq), free(keys), free(bufs);
  return st;
}

static int cmp_cstr(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every caption line of every dataset (and "", caption dropout's) gets an
 * entry: each rank encodes the missing ones of its share, write_batch_size at
 * a time. A failed write fails every rank. */
static ct_status build_text_cache(ct_dataset *ds, ct_err *err) {
  const ct_text_encoder_fn *te = ds->o.text;
  ct_status st = CT_OK;
  if (!te) return CT_OK;
  const size_t Td = (size_t)te->T * (size_t)te->d;
  for (int di = 0; di < ds->nd && !st; di++) {
    dset *d = &ds->d[di];
    if (!ct_storage_is_remote(d->text_sto) && (st = ct_mkdir_p(d->text_dir, err))) break;
    size_t n = 1;
    for (size_t i = 0; i < d->nit; i++) n += (size_t)d->it[i].nlines;
    const char **caps = malloc(n * sizeof *caps), ***todo = malloc(n * sizeof *todo);
    const size_t nb = (size_t)d->text_batch;
    float *seq = ct_alloc(CT_MEM_BUFFERS, nb * Td * sizeof(float)),
          *pooled = ct_alloc(CT_MEM_BUFFERS, nb * (size_t)te->dp * sizeof(float));
    if (!caps || !todo || !seq || !pooled)
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory for the text cache");
    size_t u = 0, ntodo = 0, built = 0, trusted = 0;
    const double t0 = now_s();
    ct_keyset listed = {0};
    char lp[4200];
    if (!st) {
      caps[0] = "";
      size_t k = 1;
      for (size_t i = 0; i < d->nit; i++)
        for (int l = 0; l < d->it[i].nlines; l++) caps[k++] = d->it[i].lines[l];
      qsort(caps, n, sizeof *caps, cmp_cstr);
      for (size_t i = 0; i < n; i++)
        if (!u || strcmp(caps[u - 1], caps[i])) caps[u++] = caps[i];
      /* Groups of nb captions of the sorted list are the encoder's batches and
       * the ranks' unit of work, so an entry's bits never depend on the world
       * size; a group with any entry missing is encoded (and written) whole. */
      const size_t groups = (u + nb - 1) / nb, glo = groups * (size_t)ds->rank / (size_t)ds->world,
                   ghi = groups * (size_t)(ds->rank + 1) / (size_t)ds->world;
      if (d->text_preserve &&
          !ct_filelist_path(lp, sizeof lp, ds->cfg->output_dir, "text_cache", d->text_id))
        ct_keyset_load(lp, &listed);
      for (size_t g = glo; g < ghi && !st; g++) {
        const size_t a = g * nb, b = (g + 1) * nb < u ? (g + 1) * nb : u;
        size_t badi = b;
        st = text_group_check(ds, d, caps, a, b, &listed, seq, pooled, &badi, &trusted, err);
        if (!st && badi < b) todo[ntodo++] = caps + a; /* the group's first caption */
      }
    }
    char failed = 0;
    for (size_t k = 0; !st && !failed && k < ntodo; k++) {
      const size_t first = (size_t)(todo[k] - caps);
      const int m = (int)(u - first < nb ? u - first : nb);
      st = te->encode(te->ctx, todo[k], m, seq, pooled, err);
      ct_err e = {0};
      if (!st && text_group_write(ds, d, todo[k], m, seq, pooled, &e)) {
        failed = 1;
        CT_ERROR("dataset '%s': writing the text cache failed: %s", d->c->id, e.msg);
      }
      if (!st) built += (size_t)m;
    }
    char *all = NULL;
    size_t *off = NULL;
    failed |= st != CT_OK;
    ct_status gs = ct_data_allgatherv(ds->o.comm, &failed, 1, &all, &off, err);
    if (!st) st = gs;
    for (int r = 0; !st && r < ds->world; r++)
      if (all[r])
        st = ct_errf(err, CT_ERR_IO, "rank %d failed building the text cache of dataset '%s' in %s",
                     r, d->c->id, d->text_dir);
    ct_keyset_free(&listed);
    if (!st &&
        ds->rank == 0) { /* all_text_cache_files_<id>.json, shared by the datasets using it */
      char **paths = calloc(u + 1, sizeof *paths);
      size_t k = 0;
      for (; paths && k < u; k++) {
        char p[4200], md5[33];
        text_path(ds, d, caps[k], p, sizeof p, md5, NULL, 0);
        if (!(paths[k] = strdup(p))) break;
      }
      ct_err e = {0};
      if (!paths || k < u ||
          ct_filelist_write(ds->cfg->output_dir, "text_cache", d->text_id, NULL,
                            (const char *const *)paths, k, 1, &e))
        CT_WARN("dataset '%s': cannot write the text cache file list to output_dir: %s", d->c->id,
                e.msg[0] ? e.msg : "out of memory");
      for (size_t i = 0; paths && i < k; i++) free(paths[i]);
      free(paths);
    }
    free(all);
    free(off);
    free(caps);
    free(todo);
    ct_free(seq);
    ct_free(pooled);
    if (!st)
      CT_INFO(
          "dataset '%s': text cache in %s: %zu distinct caption(s), %zu encoded by this rank in "
          "%.1f s "
          "(%zu listed entries trusted)",
          d->c->id, d->text_dir, u, built, now_s() - t0, trusted);
  }
  return st;
}

/* ---------------------------------------------------------------- sampler */

static void make_perms(ct_dataset *ds, long epoch) {
  if (ds->perm_epoch == epoch) return;
  for (int di = 0; di < ds->nd; di++) {
    dset *d = &ds->d[di];
    for (int b = 0; b < d->nb; b++) {
      size_t n = entries(ds, di, b), *p = ds->perm[d->boff + b];
      uint64_t key = ct_hash_str(d->c->id) ^ (ct_hash_str(d->b[b].key) * 0x9e3779b97f4a7c15ull);
      for (size_t i = 0; i < n; i++) p[i] = i % d->b[b].n;
      for (size_t i = n; i > 1;
           i--) { /* Fisher-Yates, Philox-keyed: the same on every rank and run */
        uint32_t r[4];
        ct_philox4x32((uint64_t)ds->cfg->seed, STREAM_PERM ^ key, ((uint64_t)epoch << 32) + i, r);
        size_t j = (size_t)((((uint64_t)r[0] << 32) | r[1]) % i);
        size_t t = p[i - 1];
        p[i - 1] = p[j];
        p[j] = t;
      }
    }
  }
  ds->perm_epoch = epoch;
}

/* Draw the next optimizer step's bucket at position p (advanced). */
static void draw_step(ct_dataset *ds, position *p, int *od, int *ob, size_t *base, int *new_epoch) {
  const size_t E = ds->E;
  *new_epoch = 0;
  for (int pass = 0; pass < 2; pass++) {
    double wsum = 0;
    for (int di = 0; di < ds->nd; di++) {
      dset *d = &ds->d[di];
      for (int b = 0; b < d->nb; b++)
        if (entries(ds, di, b) - p->consumed[d->boff + b] >= E) {
          wsum += d->c->probability;
          break;
        }
    }
    if (wsum > 0) {
      uint64_t key = ((uint64_t)p->epoch << 32) + (uint64_t)p->k;
      double u = ct_rng_uniform((uint64_t)ds->cfg->seed, STREAM_DSPICK, key) * wsum, acc = 0;
      int pick = -1, last = -1;
      for (int di = 0; di < ds->nd && pick < 0; di++) {
        dset *d = &ds->d[di];
        for (int b = 0; b < d->nb; b++)
          if (entries(ds, di, b) - p->consumed[d->boff + b] >= E) {
            last = di;
            acc += d->c->probability;
            if (u < acc) pick = di;
            break;
          }
      }
      if (pick < 0) pick = last;
      dset *d = &ds->d[pick];
      double bsum = 0;
      for (int b = 0; b < d->nb; b++)
        bsum += (double)((entries(ds, pick, b) - p->consumed[d->boff + b]) / E);
      double v = ct_rng_uniform((uint64_t)ds->cfg->seed, STREAM_BUCKET, key) * bsum;
      int bp = -1, bl = -1;
      acc = 0;
      for (int b = 0; b < d->nb && bp < 0; b++) {
        double steps = (double)((entries(ds, pick, b) - p->consumed[d->boff + b]) / E);
        if (steps <= 0) continue;
        bl = b;
        acc += steps;
        if (v < acc) bp = b;
      }
      if (bp < 0) bp = bl;
      *od = pick, *ob = bp, *base = p->consumed[d->boff + bp];
      p->consumed[d->boff + bp] += E;
      p->k++;
      return;
    }
    /* every bucket is done: a new epoch */
    p->epoch++;
    p->k = 0;
    memset(p->consumed, 0, (size_t)ds->nbt * sizeof(size_t));
    *new_epoch = 1;
  }
  CT_ASSERT(!"no bucket can fill a step after the effective-batch check");
}

/* Produce this rank's next micro-batch into s (the producer's sampler). */
/* Fetch and check the cached latents (unless vae_cache_disable) and text
 * entries of a micro-batch with one get_many per storage; ok[i] = 1 where the
 * entry was there and valid (its values already in the slot). */
static void batch_prefetch(const ct_dataset *ds, const dset *d, const item **its, slot *s,
                           size_t lat, unsigned char *lat_ok, unsigned char *txt_ok) {
  const size_t B = ds->B;
  ct_storage_req *rq = calloc(B, sizeof *rq);
  char(*keys)[4400] = malloc(B * sizeof *keys);
  if (!rq || !keys) goto out; /* everything falls back to one read at a time */
  if (!d->c->vae_cache_disable) {
    for (size_t i = 0; i < B; i++) {
      latent_path(d, its[i], keys[i], sizeof keys[i], NULL, 0);
      rq[i] = (ct_storage_req){.key = keys[i]};
    }
    ct_err e = {0};
    ct_storage_get_many(d->vae_sto, rq, B, &e); /* failures: per request, retried one by one */
    for (size_t i = 0; i < B; i++) {
      if (rq[i].st == CT_OK) {
        char bufs[4][96];
        const char *meta[8];
        latent_meta(ds, its[i], bufs, meta);
        ct_cache_tensor t = latent_tensor(ds, its[i], s->x0 + i * lat);
        float *outs[1] = {s->x0 + i * lat};
        lat_ok[i] = ct_cache_decode(rq[i].data, rq[i].n, &t, outs, 1, meta, 4, &e) == CT_OK;
      }
      free(rq[i].data);
    }
  }
  if (ds->o.text) {
    const ct_text_encoder_fn *te = ds->o.text;
    char(*md5s)[33] = malloc(B * sizeof *md5s);
    if (!md5s) goto out;
    for (size_t i = 0; i < B; i++) {
      char path[4200];
      text_path(ds, d, s->caps[i], path, sizeof path, md5s[i], keys[i], sizeof keys[i]);
      rq[i] = (ct_storage_req){.key = keys[i]};
    }
    ct_err e = {0};
    ct_storage_get_many(d->text_sto, rq, B, &e);
    for (size_t i = 0; i < B; i++) {
      if (rq[i].st == CT_OK) {
        float *seq = s->txt + i * (size_t)te->T * (size_t)te->d,
              *pooled = s->pooled + i * (size_t)te->dp;
        const char *meta[4] = {"encoder", te->tag, "caption_md5", md5s[i]};
        ct_cache_tensor t[2] = {{"seq", 2, {te->T, te->d, 0, 0}, seq},
                                {"pooled", 1, {te->dp, 0, 0, 0}, pooled}};
        float *outs[2] = {seq, pooled};
        txt_ok[i] = ct_cache_decode(rq[i].data, rq[i].n, t, outs, 2, meta, 2, &e) == CT_OK;
      }
      free(rq[i].data);
    }
    free(md5s);
  }
out:
  free(rq), free(keys);
}

static ct_status produce(ct_dataset *ds, slot *s, ct_err *err) {
  const int N = ds->world, r = ds->rank;
  const size_t B = ds->B;
  int ne = 0;
  if (ds->pm == 0) {
    ds->pseen = ds->ppos.seen;
    draw_step(ds, &ds->ppos, &ds->pd, &ds->pb, &ds->pbase, &ne);
    ds->ppos.seen += ds->E;
    ds->pnew_epoch = ne;
  }
  make_perms(ds, ds->ppos.epoch);
  const int m = ds->pm;
  dset *d = &ds->d[ds->pd];
  const bucket *bk = &d->b[ds->pb];
  const size_t *perm = ds->perm[d->boff + ds->pb];
  const size_t lat = (size_t)ds->C * (size_t)(bk->h / ds->s) * (size_t)(bk->w / ds->s);
  s->b.B = (int)B, s->b.C = ds->C, s->b.h = bk->h / ds->s, s->b.w = bk->w / ds->s;
  s->b.x0 = s->x0, s->b.caps = s->caps, s->b.ids = s->ids;
  s->b.epoch_end = m == 0 && ds->pnew_epoch;
  ct_status st = CT_OK;
  const item **its = malloc(B * sizeof *its);
  if (!its) return ct_errf(err, CT_ERR_NOMEM, "out of memory for a batch");
  for (size_t i = 0; i < B; i++) {
    const size_t off = ((size_t)m * (size_t)N + (size_t)r) * B + i;
    const item *it = its[i] = &d->it[bk->idx[perm[ds->pbase + off]]];
    const uint64_t id = ds->pseen + off;
    s->ids[i] = id;
    s->rels[i] = it->rel;
    uint32_t rr[4];
    ct_philox4x32((uint64_t)ds->cfg->seed, CT_STREAM_CAPTION, id, rr);
    s->caps[i] = it->lines[rr[0] % (uint32_t)it->nlines];
    if (ct_rng_uniform((uint64_t)ds->cfg->seed, CT_STREAM_DROPOUT, id) <
        ds->cfg->caption_dropout_probability)
      s->caps[i] = "";
  }
  /* The batch's cache entries in two get_many calls (S3: over the pool);
   * what is missing or bad falls back to latent_of / the trainer's thread. */
  unsigned char *lat_ok = calloc(B, 1), *txt_ok = calloc(B, 1);
  if (!lat_ok || !txt_ok) st = ct_errf(err, CT_ERR_NOMEM, "out of memory for a batch");
  if (!st) batch_prefetch(ds, d, its, s, lat, lat_ok, txt_ok);
  for (size_t i = 0; i < B && !st; i++) {
    const item *it = its[i];
    ct_err e = {0};
    lat_result lr = lat_ok[i] ? LAT_CACHED : latent_of(ds, d, it, s->x0 + i * lat, &e);
    if (lr == LAT_WRITE_FAILED) /* the latent is fine; only the cache is not */
      CT_WARN("dataset '%s': %s (training continues without this cache entry)", d->c->id, e.msg);
    if (lr == LAT_BAD)
      st = ct_errf(err, CT_ERR_IO, "dataset '%s': %s (readable when the cache was built)", d->c->id,
                   e.msg);
    if (ds->o
            .text) /* a missing or bad entry is encoded on the trainer's thread (ct_dataset_next) */
      s->miss[i] = !txt_ok[i];
  }
  free(its), free(lat_ok), free(txt_ok);
  s->from = d;
  s->key = bk->key;
  s->b.txt = ds->o.text ? s->txt : NULL;
  s->b.pooled = ds->o.text ? s->pooled : NULL;
  if (++ds->pm == (int)ds->accum) ds->pm = 0;
  pos_copy(&s->after, &ds->ppos, ds->nbt);
  return st;
}

static void *producer(void *arg) {
  ct_dataset *ds = arg;
  pthread_mutex_lock(&ds->mu);
  for (;;) {
    while (!ds->stop && ds->qcount == ds->qn) pthread_cond_wait(&ds->cv, &ds->mu);
    if (ds->stop) break;
    slot *s = &ds->q[ds->qtail];
    pthread_mutex_unlock(&ds->mu);
    memset(&s->err, 0, sizeof s->err);
    s->st = produce(ds, s, &s->err);
    pthread_mutex_lock(&ds->mu);
    s->ready = 1;
    ds->qtail = (ds->qtail + 1) % ds->qn;
    ds->qcount++;
    pthread_cond_broadcast(&ds->cv);
    if (s->st) break; /* the consumer reports it */
  }
  pthread_mutex_unlock(&ds->mu);
  return NULL;
}

/* Test hook: CTUNER_DATA_TRACE=FILE appends one line per sample the trainer
 * takes: global id, rank, epoch, dataset, bucket, file (docs/training.md, "Test hooks"). */
static void trace(const ct_dataset *ds, const slot *s) {
  const char *path = getenv("CTUNER_DATA_TRACE");
  if (!path || !*path) return;
  FILE *f = fopen(path, "a");
  if (!f) return;
  for (int i = 0; i < s->b.B; i++)
    fprintf(f, "%llu %d %ld %s %s %s\n", (unsigned long long)s->ids[i], ds->rank, s->after.epoch,
            s->from->c->id, s->key, s->rels[i]);
  fclose(f);
}

ct_status ct_dataset_next(ct_dataset *ds, ct_batch **out, ct_err *err) {
  *out = NULL;
  double t0 = now_s();
  slot *s;
  if (ds->qn == 1 && !ds->started) { /* synchronous */
    s = &ds->q[0];
    ct_status st = produce(ds, s, err);
    if (st) return st;
  } else {
    pthread_mutex_lock(&ds->mu);
    if (ds->held) { /* the previous batch is free again */
      ds->held->ready = 0;
      ds->held = NULL;
      ds->qhead = (ds->qhead + 1) % ds->qn;
      ds->qcount--;
      pthread_cond_broadcast(&ds->cv);
    }
    if (!ds->started) {
      ds->started = 1;
      if (pthread_create(&ds->th, NULL, producer, ds) != 0) {
        ds->started = 0;
        pthread_mutex_unlock(&ds->mu);
        return ct_errf(err, CT_ERR_INTERNAL, "cannot start the data prefetch thread: %s",
                       strerror(errno));
      }
    }
    while (ds->qcount == 0) pthread_cond_wait(&ds->cv, &ds->mu);
    s = &ds->q[ds->qhead];
    ds->held = s;
    pthread_mutex_unlock(&ds->mu);
    if (s->st) {
      if (err) *err = s->err;
      return s->st;
    }
  }
  for (int i = 0; ds->o.text && i < s->b.B; i++) {
    if (!s->miss[i]) continue;
    const ct_text_encoder_fn *te = ds->o.text;
    float *seq = s->txt + (size_t)i * (size_t)te->T * (size_t)te->d,
          *pooled = s->pooled + (size_t)i * (size_t)te->dp;
    ct_status st = te->encode(te->ctx, &s->caps[i], 1, seq, pooled, err);
    if (st) return st;
    ct_err e = {0};
    if (text_entry(ds, s->from, s->caps[i], seq, pooled, 1, &e))
      CT_WARN("text cache: %s (training continues without this entry)", e.msg);
    s->miss[i] = 0;
  }
  pos_copy(&ds->pos, &s->after, ds->nbt);
  trace(ds, s);
  s->b.wait_s = now_s() - t0;
  ds->wait_s += s->b.wait_s;
  *out = &s->b;
  return CT_OK;
}

/* ---------------------------------------------------------------- state */

char *ct_dataset_state_json(const ct_dataset *ds) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  if (!f) return NULL;
  fprintf(f,
          "{\"version\": 1, \"epoch\": %ld, \"step_in_epoch\": %ld, \"samples_seen\": %llu, "
          "\"datasets\": {",
          ds->pos.epoch, ds->pos.k, (unsigned long long)ds->pos.seen);
  for (int di = 0; di < ds->nd; di++) {
    const dset *d = &ds->d[di];
    fprintf(f, "%s", di ? ", " : "");
    ct_json_fput_str(f, d->c->id);
    fprintf(f, ": {\"repeats\": %ld, \"consumed\": {", d->repeats);
    for (int b = 0; b < d->nb; b++)
      fprintf(f, "%s\"%s\": %zu", b ? ", " : "", d->b[b].key, ds->pos.consumed[d->boff + b]);
    fprintf(f, "}}");
  }
  fprintf(f, "}}");
  fclose(f);
  return buf;
}

ct_status ct_dataset_state_restore(ct_dataset *ds, const char *json, ct_err *err) {
  if (ds->started)
    return ct_errf(err, CT_ERR_INVALID, "ct_dataset_state_restore after the first batch");
  ct_json *j = NULL;
  ct_status st = ct_json_parse(json, strlen(json), &j, err);
  if (st) {
    ct_err_prefix(err, "sampler state: ");
    return st;
  }
  const ct_json *e = ct_json_get(j, "epoch"), *k = ct_json_get(j, "step_in_epoch"),
                *seen = ct_json_get(j, "samples_seen"), *dsets = ct_json_get(j, "datasets");
  if (!e || !e->is_int || !k || !k->is_int || !seen || !seen->is_int || !dsets ||
      dsets->type != CT_JSON_OBJECT) {
    ct_json_free(j);
    return ct_errf(err, CT_ERR_FORMAT,
                   "sampler state: missing epoch, step_in_epoch, samples_seen or datasets");
  }
  position p = ds->pos;
  p.consumed = calloc((size_t)ds->nbt + 1, sizeof(size_t));
  if (!p.consumed) {
    ct_json_free(j);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  p.epoch = (long)e->i64, p.k = (long)k->i64, p.seen = (uint64_t)seen->i64;
  int changed = 0;
  for (int di = 0; di < ds->nd; di++) {
    dset *d = &ds->d[di];
    const ct_json *x = ct_json_get(dsets, d->c->id), *c = x ? ct_json_get(x, "consumed") : NULL;
    if (!c) {
      changed = 1;
      continue;
    }
    for (int b = 0; b < d->nb; b++) {
      const ct_json *v = ct_json_get(c, d->b[b].key);
      size_t have = entries(ds, di, b);
      if (!v || !v->is_int || v->i64 < 0 || (size_t)v->i64 > have) {
        changed = 1;
        continue;
      }
      p.consumed[d->boff + b] = (size_t)v->i64;
    }
  }
  ct_json_free(j);
  if (changed)
    CT_WARN(
        "the datasets changed since the checkpoint (buckets or sizes differ); the sampler "
        "continues in epoch "
        "%ld with the buckets it can match",
        p.epoch + 1);
  pos_copy(&ds->ppos, &p, ds->nbt);
  pos_copy(&ds->pos, &p, ds->nbt);
  free(p.consumed);
  ds->pm = 0;
  return CT_OK;
}

long ct_dataset_epoch(const ct_dataset *ds) {
  return ds->pos.epoch;
}
uint64_t ct_dataset_samples_seen(const ct_dataset *ds) {
  return ds->pos.seen;
}
double ct_dataset_wait_seconds(const ct_dataset *ds) {
  return ds->wait_s;
}
void ct_dataset_stats(const ct_dataset *ds, ct_data_stats *out) {
  *out = ds->stats;
}
int ct_dataset_channels(const ct_dataset *ds) {
  return ds->C;
}
size_t ct_dataset_max_latent(const ct_dataset *ds) {
  return ds->maxlat;
}

size_t ct_dataset_count(const ct_dataset *ds) {
  size_t n = 0;
  for (int di = 0; di < ds->nd; di++)
    for (int b = 0; b < ds->d[di].nb; b++) n += entries(ds, di, b);
  return n;
}

long ct_dataset_steps_per_epoch(const ct_dataset *ds) {
  long n = 0;
  for (int di = 0; di < ds->nd; di++)
    for (int b = 0; b < ds->d[di].nb; b++) n += (long)(entries(ds, di, b) / ds->E);
  return n;
}

size_t ct_dataset_longest_caption(const ct_dataset *ds, size_t (*measure)(const char *, void *),
                                  void *ctx, size_t limit, size_t *n_over) {
  size_t best = 0, over = 0;
  for (int di = 0; di < ds->nd; di++)
    for (size_t i = 0; i < ds->d[di].nit; i++)
      for (int l = 0; l < ds->d[di].it[i].nlines; l++) {
        const char *c = ds->d[di].it[i].lines[l];
        size_t m = measure ? measure(c, ctx) : strlen(c);
        if (m > best) best = m;
        if (m > limit) over++;
      }
  if (n_over) *n_over = over;
  return best;
}

/* ---------------------------------------------------------------- open */

static ct_status load_dataset(ct_dataset *ds, dset *d, ct_err *err) {
  const ct_ds_config *c = d->c;
  const ct_config *cfg = ds->cfg;
  ct_disc disc;
  ct_status st =
      ct_bucket_opts_from(c, (double)cfg->resolution, (int)cfg->aspect_bucket_alignment,
                          (int)cfg->aspect_bucket_rounding, (uint64_t)cfg->seed, &d->bo, err);
  if (st) return st;
  if (d->bo.alignment % ds->o.size_multiple) {
    return ct_errf(
        err, CT_ERR_INVALID,
        "aspect_bucket_alignment %d is not a multiple of %d (codec factor %d x patch size 2): "
        "bucket sizes would not fit the model",
        d->bo.alignment, ds->o.size_multiple, ds->s);
  }
  double t0 = now_s();
  ct_keyset listed = {0};
  char lp[4200];
  if (c->preserve_data_backend_cache &&
      !ct_filelist_path(lp, sizeof lp, cfg->output_dir, "image", c->id))
    ct_keyset_load(lp, &listed);
  st = ct_discover(c, d->sto, d->imgdir, d->dir, &listed, ds->o.comm, &disc, err);
  const int from_list = listed.n > 0;
  ct_keyset_free(&listed);
  if (st) return st;
  if (ds->rank == 0 && !from_list) { /* SimpleTuner's all_image_files_<id>.json: the files found */
    const char **names = malloc((disc.n + 1) * sizeof *names);
    size_t k = 0;
    char prefix[4200];
    snprintf(prefix, sizeof prefix, "%s/", d->dir);
    for (size_t i = 0; names && i < disc.n; i++)
      if (disc.it[i].why != CT_DISC_NOT_FOUND) names[k++] = disc.it[i].rel;
    ct_err e = {0};
    if (!names || ct_filelist_write(cfg->output_dir, "image", c->id, prefix, names, k, 0, &e))
      CT_WARN("dataset '%s': cannot write its image file list to output_dir: %s", c->id,
              names ? e.msg : "out of memory");
    free(names);
  }
  ct_data_stats *S = &ds->stats, fs = {0};
  fs.total_processed = disc.total;
  fs.outside_dir = disc.outside_dir, fs.duplicate = disc.duplicate,
  fs.metadata_missing = disc.metadata_missing;
  d->it = calloc(disc.n + 1, sizeof *d->it);
  if (!d->it) {
    ct_disc_free(&disc);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < disc.n && !st; i++) {
    ct_disc_item *x = &disc.it[i];
    if (x->why == CT_DISC_UNREADABLE) {
      fs.unreadable++;
      CT_WARN("dataset '%s': %s is not a readable image; skipped", c->id, x->rel);
      continue;
    }
    if (x->why == CT_DISC_NOT_FOUND) {
      fs.not_found++;
      continue;
    }
    if (x->why == CT_DISC_NO_CAPTION) {
      fs.no_caption++;
      continue;
    }
    const double ar = (double)x->w / x->h;
    const double size = d->bo.resolution_type == CT_RES_AREA ? (double)x->w * x->h / 1e6
                                                             : (x->w < x->h ? x->w : x->h);
    double minsz = c->minimum_image_size;
    if (c->resolution_type == CT_RES_PIXEL_AREA) minsz = minsz * minsz / 1e6;
    if (minsz > 0 && size < minsz) {
      fs.too_small++;
      continue;
    }
    if ((c->minimum_aspect_ratio > 0 && ar < c->minimum_aspect_ratio) ||
        (c->maximum_aspect_ratio > 0 && ar > c->maximum_aspect_ratio)) {
      fs.aspect_ratio++;
      continue;
    }
    item *it = &d->it[d->nit];
    it->hash = ct_hash_str(x->rel);
    st = ct_bucket_place(&d->bo, x->w, x->h, it->hash, &it->g, err);
    if (st) break;
    if (c->caption_strategy == CT_CAP_INSTANCEPROMPT) {
      it->lines = malloc(sizeof *it->lines);
      if (it->lines && (it->lines[0] = strdup(c->instance_prompt))) it->nlines = 1;
    } else {
      it->nlines = ct_caption_lines(x->caption, &it->lines);
    }
    if (it->nlines <= 0) {
      free(it->lines);
      it->lines = NULL;
      it->nlines = 0;
      fs.no_caption++;
      continue;
    }
    it->rel = x->rel;
    x->rel = NULL;
    d->nit++;
  }
  ct_disc_free(&disc);
  if (st) return st;
  /* max_num_samples: a seeded, deterministic subset */
  if (c->max_num_samples > 0 && d->nit > (size_t)c->max_num_samples) {
    size_t keep = (size_t)c->max_num_samples;
    uint64_t *key = malloc(d->nit * sizeof *key);
    if (!key) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < d->nit; i++) {
      uint32_t r[4];
      ct_philox4x32((uint64_t)cfg->seed, STREAM_SUBSET, d->it[i].hash, r);
      key[i] = ((uint64_t)r[0] << 32) | r[1];
    }
    /* keep the `keep` smallest keys, in path order */
    uint64_t *sorted = malloc(d->nit * sizeof *sorted);
    if (!sorted) {
      free(key);
      return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    }
    memcpy(sorted, key, d->nit * sizeof *sorted);
    qsort(sorted, d->nit, sizeof *sorted, cmp_u64);
    uint64_t cut = sorted[keep - 1];
    unsigned char *drop = (unsigned char *)sorted; /* reused: nit bytes fit in nit words */
    size_t kept = 0;
    for (size_t i = 0; i < d->nit; i++) {
      int keep_i = key[i] <= cut && kept < keep;
      kept += (size_t)keep_i;
      drop[i] = (unsigned char)!keep_i;
    }
    fs.max_num_samples = drop_items(d, drop);
    free(key);
    free(sorted);
  }
  fs.kept = d->nit;
  if (d->nit == 0) {
    return ct_errf(err, CT_ERR_NOT_FOUND,
                   "dataset '%s': no usable images in %s (%zu processed: %zu unreadable, %zu "
                   "without a caption, "
                   "%zu too small, %zu outside the aspect range, %zu not found)",
                   c->id, d->dir, fs.total_processed, fs.unreadable, fs.no_caption, fs.too_small,
                   fs.aspect_ratio, fs.not_found);
  }
  st = make_buckets(d, err);
  if (st) return st;
  if (ds->rank == 0) write_index(ds, d, &fs);
  CT_INFO(
      "dataset '%s': %zu of %zu images in %d bucket(s) (%.2f s, %d rank(s)); skipped: %zu "
      "unreadable, %zu "
      "without caption, %zu too small, %zu aspect, %zu outside dir, %zu duplicate, %zu not found, "
      "%zu beyond "
      "max_num_samples",
      c->id, d->nit, fs.total_processed, d->nb, now_s() - t0, ds->world, fs.unreadable,
      fs.no_caption, fs.too_small, fs.aspect_ratio, fs.outside_dir, fs.duplicate, fs.not_found,
      fs.max_num_samples);
  S->total_processed += fs.total_processed, S->kept += fs.kept, S->too_small += fs.too_small;
  S->aspect_ratio += fs.aspect_ratio, S->unreadable += fs.unreadable,
      S->no_caption += fs.no_caption;
  S->outside_dir += fs.outside_dir, S->duplicate += fs.duplicate, S->not_found += fs.not_found;
  S->metadata_missing += fs.metadata_missing, S->max_num_samples += fs.max_num_samples;
  return CT_OK;
}

ct_status ct_dataset_open(const char *backend_json, const ct_data_opts *o, ct_dataset **out,
                          ct_err *err) {
  *out = NULL;
  const ct_config *cfg = o->cfg;
  ct_dataset *ds = calloc(1, sizeof *ds);
  if (!ds) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ds->o = *o;
  ds->cfg = cfg;
  ds->s = o->codec ? o->codec->factor : o->codec_scale;
  ds->C = o->codec ? o->codec->channels : ct_pixel_channels(o->codec_scale);
  ds->rank = o->comm ? ct_comm_rank(o->comm) : 0;
  ds->world = o->comm ? ct_comm_size(o->comm) : 1;
  ds->B = (size_t)cfg->train_batch_size;
  ds->accum = (size_t)cfg->gradient_accumulation_steps;
  ds->E = ds->B * (size_t)ds->world * ds->accum;
  ds->comp = !cfg->compress_disk_cache                      ? CT_CACHE_RAW
             : !strcmp(cfg->disk_cache_compression, "zstd") ? CT_CACHE_ZSTD
                                                            : CT_CACHE_GZIP;
  ds->perm_epoch = -1;
  pthread_mutex_init(&ds->mu, NULL);
  pthread_cond_init(&ds->cv, NULL);
  ct_status st = ct_backend_load(backend_json, &ds->be, err);
  if (st) goto out;
  if (o->size_multiple <= 0 || ds->C <= 0) {
    st = ct_errf(err, CT_ERR_INVALID, "codec scale %d is not 1, 2 or 4", ds->s);
    goto out;
  }
  ds->d = calloc((size_t)ds->be->n, sizeof *ds->d);
  ds->bsto = calloc((size_t)ds->be->n + 1, sizeof *ds->bsto);
  if (!ds->d || !ds->bsto) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    goto out;
  }
  for (int i = 0; i < ds->be->n && !st; i++) {
    const ct_ds_config *c = &ds->be->ds[i];
    if (c->disabled || c->kind != CT_DS_IMAGE) continue;
    if (c->probability <= 0) {
      CT_WARN("dataset '%s': probability 0; never sampled, so not loaded", c->id);
      continue;
    }
    dset *d = &ds->d[ds->nd++];
    d->c = c;
    d->repeats = c->repeats;
    d->imgdir = ct_ds_image_dir(c);
    char shown[4200];
    if (c->is_aws) s3_name(c, d->imgdir, shown, sizeof shown);
    d->dir = strdup(c->is_aws ? shown : c->instance_data_dir);
    if ((st = backend_storage(ds, c, &d->sto, err))) break;
    /* the latent cache: a key prefix of an S3 dataset's bucket, else a local directory */
    if (c->is_aws && c->cache_dir_vae) {
      d->vae_sto = d->sto;
      snprintf(d->vae_key, sizeof d->vae_key, "%s", c->cache_dir_vae);
      s3_name(c, c->cache_dir_vae, d->vae_dir, sizeof d->vae_dir);
    } else {
      if (c->cache_dir_vae)
        snprintf(d->vae_dir, sizeof d->vae_dir, "%s", c->cache_dir_vae);
      else
        snprintf(d->vae_dir, sizeof d->vae_dir, "%s/cache/vae/%s", cfg->output_dir, c->id);
      if ((st = local_storage(ds, d->vae_dir, &d->vae_sto, err))) break;
    }
    const ct_ds_config *tc = c->text_embeds ? ct_backend_find(ds->be, c->text_embeds) : NULL;
    for (int k = 0; !c->text_embeds && k < ds->be->n;
         k++) { /* the default (or only) text_embeds dataset */
      const ct_ds_config *x = &ds->be->ds[k];
      if (!x->disabled && x->kind == CT_DS_TEXT_EMBEDS && (x->is_default || !tc)) tc = x;
    }
    /* the text cache: an S3 text_embeds dataset's bucket (below aws_data_prefix/cache_dir), else a
     * directory */
    if (tc && tc->is_aws) {
      if ((st = backend_storage(ds, tc, &d->text_sto, err))) break;
      snprintf(d->text_key, sizeof d->text_key, "%s", tc->cache_dir ? tc->cache_dir : "");
      s3_name(tc, d->text_key, d->text_dir, sizeof d->text_dir);
    } else {
      if (tc)
        snprintf(d->text_dir, sizeof d->text_dir, "%s", tc->cache_dir);
      else
        snprintf(d->text_dir, sizeof d->text_dir, "%s/cache/text", cfg->output_dir);
      if ((st = local_storage(ds, d->text_dir, &d->text_sto, err))) break;
    }
    d->text_batch = tc ? tc->write_batch_size : 128;
    d->text_id = tc ? tc->id : "text_embeds";
    d->text_preserve = c->preserve_data_backend_cache || (tc && tc->preserve_data_backend_cache);
    if (ds->rank == 0) { /* SimpleTuner: the lists of an earlier run go unless preserved */
      if (!c->preserve_data_backend_cache) {
        ct_filelist_remove(cfg->output_dir, "image", c->id);
        ct_filelist_remove(cfg->output_dir, "vae_cache", c->id);
      }
      if (!d->text_preserve) ct_filelist_remove(cfg->output_dir, "text_cache", d->text_id);
    }
    d->comp = ds->comp != CT_CACHE_RAW || !c->compress_cache ? ds->comp
              : !strcmp(cfg->disk_cache_compression, "zstd") ? CT_CACHE_ZSTD
                                                             : CT_CACHE_GZIP;
    if (!d->dir) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    if (!st) st = load_dataset(ds, d, err);
  }
  if (st) goto out;
  for (int i = 0; i < ds->nd && !st; i++) st = check_effective_batch(ds, &ds->d[i], err);
  for (int i = 0; i < ds->nd; i++) /* the largest latent, for the encoders' buffers */
    for (int b = 0; b < ds->d[i].nb; b++) {
      size_t lat =
          (size_t)ds->C * (size_t)(ds->d[i].b[b].h / ds->s) * (size_t)(ds->d[i].b[b].w / ds->s);
      if (lat > ds->maxlat) ds->maxlat = lat;
    }
  if (!st) st = build_latent_cache(ds, err);
  if (!st) st = build_text_cache(ds, err);
  /* images dropped by the cache build may have emptied buckets: check again */
  for (int i = 0; i < ds->nd && !st; i++) st = check_effective_batch(ds, &ds->d[i], err);
  if (st) goto out;
  /* flat buckets, positions, permutations, queue */
  for (int i = 0; i < ds->nd; i++) {
    ds->d[i].boff = ds->nbt;
    ds->nbt += ds->d[i].nb;
    for (int b = 0; b < ds->d[i].nb; b++) {
      size_t lat =
          (size_t)ds->C * (size_t)(ds->d[i].b[b].h / ds->s) * (size_t)(ds->d[i].b[b].w / ds->s);
      if (lat > ds->maxlat) ds->maxlat = lat;
    }
    ds->stats.buckets += (size_t)ds->d[i].nb;
  }
  ds->stats.samples = ct_dataset_count(ds);
  ds->pos.consumed = calloc((size_t)ds->nbt + 1, sizeof(size_t));
  ds->ppos.consumed = calloc((size_t)ds->nbt + 1, sizeof(size_t));
  ds->perm = calloc((size_t)ds->nbt + 1, sizeof *ds->perm);
  ds->qn = o->prefetch > 0 ? o->prefetch + 1 : 1; /* one slot is held by the trainer */
  ds->q = calloc((size_t)ds->qn, sizeof *ds->q);
  if (!ds->pos.consumed || !ds->ppos.consumed || !ds->perm || !ds->q) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    goto out;
  }
  for (int i = 0; i < ds->nd && !st; i++)
    for (int b = 0; b < ds->d[i].nb; b++)
      if (!(ds->perm[ds->d[i].boff + b] = malloc(entries(ds, i, b) * sizeof(size_t))))
        st = ct_errf(err, CT_ERR_NOMEM, "out of memory for the sample order");
  for (int k = 0; k < ds->qn && !st; k++) {
    slot *s = &ds->q[k];
    s->x0 = ct_alloc(CT_MEM_BUFFERS, ds->B * ds->maxlat * sizeof(float));
    s->caps = calloc(ds->B, sizeof *s->caps);
    s->ids = calloc(ds->B, sizeof *s->ids);
    s->after.consumed = calloc((size_t)ds->nbt + 1, sizeof(size_t));
    s->miss = calloc(ds->B, 1);
    s->rels = calloc(ds->B, sizeof *s->rels);
    if (o->text) {
      s->txt =
          ct_alloc(CT_MEM_BUFFERS, ds->B * (size_t)o->text->T * (size_t)o->text->d * sizeof(float));
      s->pooled = ct_alloc(CT_MEM_BUFFERS, ds->B * (size_t)o->text->dp * sizeof(float));
    }
    if (!s->x0 || !s->caps || !s->ids || !s->after.consumed || !s->miss || !s->rels ||
        (o->text && (!s->txt || !s->pooled)))
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
out:
  if (st) {
    ct_dataset_free(ds);
    return st;
  }
  *out = ds;
  return CT_OK;
}

void ct_dataset_free(ct_dataset *ds) {
  if (!ds) return;
  if (ds->started) {
    pthread_mutex_lock(&ds->mu);
    ds->stop = 1;
    pthread_cond_broadcast(&ds->cv);
    pthread_mutex_unlock(&ds->mu);
    pthread_join(ds->th, NULL);
  }
  for (int k = 0; ds->q && k < ds->qn; k++) {
    ct_free(ds->q[k].x0);
    free(ds->q[k].caps);
    free(ds->q[k].ids);
    free(ds->q[k].after.consumed);
    free(ds->q[k].miss);
    free(ds->q[k].rels);
    ct_free(ds->q[k].txt);
    ct_free(ds->q[k].pooled);
  }
  free(ds->q);
  for (int b = 0; ds->perm && b < ds->nbt; b++) free(ds->perm[b]);
  free(ds->perm);
  free(ds->pos.consumed);
  free(ds->ppos.consumed);
  for (int i = 0; ds->d && i < ds->nd; i++) {
    dset *d = &ds->d[i];
    for (size_t k = 0; k < d->nit; k++) {
      free(d->it[k].rel);
      for (int l = 0; l < d->it[k].nlines; l++) free(d->it[k].lines[l]);
      free(d->it[k].lines);
    }
    free(d->it);
    free_buckets(d);
    free(d->dir);
  }
  free(ds->d);
  for (int i = 0; ds->bsto && ds->be && i < ds->be->n; i++) ct_storage_free(ds->bsto[i]);
  free(ds->bsto);
  for (int i = 0; i < ds->nown; i++) ct_storage_free(ds->own[i]);
  free(ds->own);
  ct_backend_free(ds->be);
  pthread_mutex_destroy(&ds->mu);
  pthread_cond_destroy(&ds->cv);
  free(ds);
}

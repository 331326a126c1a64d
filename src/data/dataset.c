/* dataset.c: the training data behind ctuner/data.h — opening and freeing.
 *
 * Open: parse the multidatabackend.json (backend.c); per image dataset,
 * discover its items (discover.c, spread over ranks), drop what the filters
 * reject (counted), place each image in an aspect bucket (bucket.c; every
 * image of a bucket shares its size), write SimpleTuner's bucket index and
 * metadata files, check every bucket against the effective batch (fail with
 * SimpleTuner's detailed message, oversubscribe, or prune; ds_buckets.c),
 * then build the latent cache with each rank encoding its share of the
 * images (latent_cache.c) and the text cache (text_cache.c). The sampler
 * (sampler.c) and the prefetch thread behind ct_dataset_next (prefetch.c)
 * take it from there.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctuner/alloc.h"
#include "ctuner/codec.h"
#include "ctuner/comm.h"
#include "ctuner/fs.h"
#include "ctuner/log.h"
#include "ctuner/rng.h"
#include "data/dataset_int.h"
#include "data/discover.h"

#define STREAM_SUBSET 0x5355425300000000ull

/* --------------------------------------------------------------- helpers */

double ct_ds_now(void) {
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
int ct_ds_key_join(char *buf, size_t n, const char *prefix, const char *name) {
  return ct_pathf(buf, n, "%s%s%s", prefix, *prefix ? "/" : "", name);
}

/* s3://bucket[/aws_data_prefix][/sub]: an S3 location as users see it. */
static void s3_name(const ct_ds_config *c, const char *sub, char *out, size_t n) {
  (void)ct_pathf(out, n, "s3://%s%s%s%s%s", c->s3.bucket, c->s3.prefix[0] ? "/" : "", c->s3.prefix,
                 sub && sub[0] ? "/" : "", sub ? sub : "");
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* ---------------------------------------------------------------- state */

char *ct_dataset_state_json(const ct_dataset *ds) {
  return ct_sampler_state_json(&ds->smp, &ds->pos);
}

ct_status ct_dataset_state_restore(ct_dataset *ds, const char *json, ct_err *err) {
  if (ds->started)
    return ct_errf(err, CT_ERR_INVALID, "ct_dataset_state_restore after the first batch");
  int changed = 0;
  ct_status st = ct_sampler_state_restore(&ds->smp, json, &changed, err);
  if (st) return st;
  if (changed)
    CT_WARN(
        "the datasets changed since the checkpoint (buckets or sizes differ); the sampler "
        "continues in epoch "
        "%ld with the buckets it can match",
        ds->smp.pos.epoch + 1);
  ct_sampler_pos_copy(&ds->smp, &ds->pos, &ds->smp.pos);
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
size_t ct_dataset_max_reference(const ct_dataset *ds) {
  return ds->maxref;
}

size_t ct_dataset_count(const ct_dataset *ds) {
  size_t n = 0;
  for (int di = 0; di < ds->nd; di++)
    for (int b = 0; b < ds->d[di].nb; b++) n += ct_ds_entries(ds, di, b);
  return n;
}

long ct_dataset_steps_per_epoch(const ct_dataset *ds) {
  long n = 0;
  for (int di = 0; di < ds->nd; di++)
    for (int b = 0; b < ds->d[di].nb; b++) n += (long)(ct_ds_entries(ds, di, b) / ds->E);
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

/* SimpleTuner's all_image_files_<id>.json: the files found. */
static void write_image_list(const ct_dataset *ds, const dset *d, const ct_disc *disc) {
  const char **names = malloc((disc->n + 1) * sizeof *names);
  size_t k = 0;
  char prefix[4200];
  snprintf(prefix, sizeof prefix, "%s/", d->dir);
  for (size_t i = 0; names && i < disc->n; i++)
    if (disc->it[i].why != CT_DISC_NOT_FOUND) names[k++] = disc->it[i].rel;
  ct_err e = {0};
  if (!names || ct_filelist_write(ds->cfg->output_dir, "image", d->c->id, prefix, names, k, 0, &e))
    CT_WARN("dataset '%s': cannot write its image file list to output_dir: %s", d->c->id,
            names ? e.msg : "out of memory");
  free(names);
}

/* The discovered items the filters keep (the others counted in fs), with
 * their geometry and caption lines; the kept paths move into d. */
static ct_status take_items(dset *d, ct_disc *disc, ct_data_stats *fs, ct_err *err) {
  const ct_ds_config *c = d->c;
  ct_status st = CT_OK;
  for (size_t i = 0; i < disc->n && !st; i++) {
    ct_disc_item *x = &disc->it[i];
    if (x->why == CT_DISC_UNREADABLE) {
      fs->unreadable++;
      CT_WARN("dataset '%s': %s is not a readable image; skipped", c->id, x->rel);
      continue;
    }
    if (x->why == CT_DISC_NOT_FOUND) {
      fs->not_found++;
      continue;
    }
    if (x->why == CT_DISC_NO_CAPTION) {
      fs->no_caption++;
      continue;
    }
    const double ar = (double)x->w / x->h;
    const double size = d->bo.resolution_type == CT_RES_AREA ? (double)x->w * x->h / 1e6
                                                             : (x->w < x->h ? x->w : x->h);
    double minsz = c->minimum_image_size;
    if (c->resolution_type == CT_RES_PIXEL_AREA) minsz = minsz * minsz / 1e6;
    if (minsz > 0 && size < minsz) {
      fs->too_small++;
      continue;
    }
    if ((c->minimum_aspect_ratio > 0 && ar < c->minimum_aspect_ratio) ||
        (c->maximum_aspect_ratio > 0 && ar > c->maximum_aspect_ratio)) {
      fs->aspect_ratio++;
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
      fs->no_caption++;
      continue;
    }
    it->rel = x->rel;
    x->rel = NULL;
    d->nit++;
  }
  return st;
}

/* max_num_samples: keep a seeded, deterministic subset (the items with the
 * smallest Philox keys, in path order); *dropped counts the others. */
static ct_status keep_subset(const ct_dataset *ds, dset *d, size_t *dropped, ct_err *err) {
  const size_t keep = (size_t)d->c->max_num_samples;
  uint64_t *key = malloc(d->nit * sizeof *key);
  if (!key) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < d->nit; i++) {
    uint32_t r[4];
    ct_philox4x32((uint64_t)ds->cfg->seed, STREAM_SUBSET, d->it[i].hash, r);
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
  *dropped = ct_ds_drop_items(d, drop);
  free(key);
  free(sorted);
  return CT_OK;
}

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
  double t0 = ct_ds_now();
  ct_keyset listed = {0};
  char lp[4200];
  if (c->preserve_data_backend_cache &&
      !ct_filelist_path(lp, sizeof lp, cfg->output_dir, "image", c->id))
    ct_keyset_load(lp, &listed);
  st = ct_discover(c, d->sto, d->imgdir, d->dir, &listed, ds->o.comm, &disc, err);
  const int from_list = listed.n > 0;
  ct_keyset_free(&listed);
  if (st) return st;
  if (ds->rank == 0 && !from_list) write_image_list(ds, d, &disc);
  ct_data_stats *S = &ds->stats, fs = {0};
  fs.total_processed = disc.total;
  fs.outside_dir = disc.outside_dir, fs.duplicate = disc.duplicate,
  fs.metadata_missing = disc.metadata_missing;
  d->it = calloc(disc.n + 1, sizeof *d->it);
  if (!d->it) {
    ct_disc_free(&disc);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  st = take_items(d, &disc, &fs, err);
  ct_disc_free(&disc);
  if (st) return st;
  if (c->max_num_samples > 0 && d->nit > (size_t)c->max_num_samples &&
      (st = keep_subset(ds, d, &fs.max_num_samples, err)))
    return st;
  if (d->cc && (st = ct_ds_pair_references(ds, d, &fs.unpaired, err))) return st;
  fs.kept = d->nit;
  if (d->nit == 0) {
    return ct_errf(err, CT_ERR_NOT_FOUND,
                   "dataset '%s': no usable images in %s (%zu processed: %zu unreadable, %zu "
                   "without a caption, "
                   "%zu too small, %zu outside the aspect range, %zu not found, %zu without a "
                   "reference)",
                   c->id, d->dir, fs.total_processed, fs.unreadable, fs.no_caption, fs.too_small,
                   fs.aspect_ratio, fs.not_found, fs.unpaired);
  }
  st = ct_ds_make_buckets(d, err);
  if (st) return st;
  if (ds->rank == 0) ct_ds_write_index(ds, d, &fs);
  CT_INFO(
      "dataset '%s': %zu of %zu images in %d bucket(s) (%.2f s, %d rank(s)); skipped: %zu "
      "unreadable, %zu "
      "without caption, %zu too small, %zu aspect, %zu outside dir, %zu duplicate, %zu not found, "
      "%zu beyond "
      "max_num_samples, %zu without a reference",
      c->id, d->nit, fs.total_processed, d->nb, ct_ds_now() - t0, ds->world, fs.unreadable,
      fs.no_caption, fs.too_small, fs.aspect_ratio, fs.outside_dir, fs.duplicate, fs.not_found,
      fs.max_num_samples, fs.unpaired);
  S->total_processed += fs.total_processed, S->kept += fs.kept, S->too_small += fs.too_small;
  S->aspect_ratio += fs.aspect_ratio, S->unreadable += fs.unreadable,
      S->no_caption += fs.no_caption;
  S->outside_dir += fs.outside_dir, S->duplicate += fs.duplicate, S->not_found += fs.not_found;
  S->metadata_missing += fs.metadata_missing, S->max_num_samples += fs.max_num_samples;
  S->unpaired += fs.unpaired;
  return CT_OK;
}

/* conditioning_data: the conditioning dataset's storage, placement options
 * and latent cache ({output_dir}/cache/vae/{its id} unless its cache_dir_vae);
 * refused where the trainer takes no references, required where it does. */
static ct_status setup_reference(ct_dataset *ds, const ct_ds_config *c, dset *d, ct_err *err) {
  const ct_config *cfg = ds->cfg;
  if (!c->conditioning_data && !ds->o.reference) return CT_OK;
  if (!c->conditioning_data)
    return ct_errf(err, CT_ERR_INVALID,
                   "dataset '%s' has no conditioning_data: FLUX.1 Kontext training (model_flavour "
                   "kontext) needs a reference for every image (a dataset with \"dataset_type\": "
                   "\"conditioning\" and conditioning_type reference_strict or reference_loose, "
                   "docs/kontext.md)",
                   c->id);
  if (!ds->o.reference)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "dataset '%s': conditioning_data \"%s\": %s takes no reference images (FLUX.1 "
                   "Kontext, model_flavour kontext, does); the pairs would be ignored",
                   c->id, c->conditioning_data,
                   ds->o.reference_why ? ds->o.reference_why : "this model");
  const ct_ds_config *cc = d->cc = ct_backend_find(ds->be, c->conditioning_data);
  ct_status st = backend_storage(ds, cc, &d->csto, err);
  if (st) return st;
  if (!(d->cdir = strdup(cc->instance_data_dir)))
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  if (cc->cache_dir_vae)
    snprintf(d->cvae_dir, sizeof d->cvae_dir, "%s", cc->cache_dir_vae);
  else
    snprintf(d->cvae_dir, sizeof d->cvae_dir, "%s/cache/vae/%s", cfg->output_dir, cc->id);
  if ((st = local_storage(ds, d->cvae_dir, &d->cvae_sto, err))) return st;
  return ct_bucket_opts_from(cc, (double)cfg->resolution, (int)cfg->aspect_bucket_alignment,
                             (int)cfg->aspect_bucket_rounding, (uint64_t)cfg->seed, &d->cbo, err);
}

/* Dataset d of configuration c: where its images, latent cache and text
 * cache are (their storages opened), its text cache's settings, and the file
 * lists of an earlier run removed unless preserved. */
static ct_status setup_dataset(ct_dataset *ds, const ct_ds_config *c, dset *d, ct_err *err) {
  const ct_config *cfg = ds->cfg;
  ct_status st = CT_OK;
  d->c = c;
  d->repeats = c->repeats;
  d->imgdir = ct_ds_image_dir(c);
  char shown[4200];
  if (c->is_aws) s3_name(c, d->imgdir, shown, sizeof shown);
  d->dir = strdup(c->is_aws ? shown : c->instance_data_dir);
  if ((st = backend_storage(ds, c, &d->sto, err))) return st;
  /* the latent cache: with image_embeds, cache_dir_vae inside that dataset's storage (its
   * bucket if it is S3, as SimpleTuner's cache_data_backend); else a key prefix of an S3
   * dataset's own bucket, else a local directory */
  const ct_ds_config *ie = c->image_embeds ? ct_backend_find(ds->be, c->image_embeds) : NULL;
  if (ie && ie->is_aws) {
    if ((st = backend_storage(ds, ie, &d->vae_sto, err))) return st;
    snprintf(d->vae_key, sizeof d->vae_key, "%s", c->cache_dir_vae);
    s3_name(ie, c->cache_dir_vae, d->vae_dir, sizeof d->vae_dir);
  } else if (c->is_aws && c->cache_dir_vae && !ie) {
    d->vae_sto = d->sto;
    snprintf(d->vae_key, sizeof d->vae_key, "%s", c->cache_dir_vae);
    s3_name(c, c->cache_dir_vae, d->vae_dir, sizeof d->vae_dir);
  } else {
    if (c->cache_dir_vae)
      snprintf(d->vae_dir, sizeof d->vae_dir, "%s", c->cache_dir_vae);
    else
      snprintf(d->vae_dir, sizeof d->vae_dir, "%s/cache/vae/%s", cfg->output_dir, c->id);
    if ((st = local_storage(ds, d->vae_dir, &d->vae_sto, err))) return st;
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
    if ((st = backend_storage(ds, tc, &d->text_sto, err))) return st;
    snprintf(d->text_key, sizeof d->text_key, "%s", tc->cache_dir ? tc->cache_dir : "");
    s3_name(tc, d->text_key, d->text_dir, sizeof d->text_dir);
  } else {
    if (tc)
      snprintf(d->text_dir, sizeof d->text_dir, "%s", tc->cache_dir);
    else
      snprintf(d->text_dir, sizeof d->text_dir, "%s/cache/text", cfg->output_dir);
    if ((st = local_storage(ds, d->text_dir, &d->text_sto, err))) return st;
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
  if (!d->dir) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  return setup_reference(ds, c, d, err);
}

/* The sampler (from the final buckets), the positions and the queue's slots. */
static ct_status alloc_sampler_queue(ct_dataset *ds, ct_err *err) {
  const ct_data_opts *o = &ds->o;
  ct_status st = CT_OK;
  ct_sampler_set *sets = calloc((size_t)ds->nd + 1, sizeof *sets);
  ct_sampler_bucket **bks = calloc((size_t)ds->nd + 1, sizeof *bks);
  if (!sets || !bks) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (int i = 0; i < ds->nd && !st; i++) {
    const dset *d = &ds->d[i];
    for (int b = 0; b < d->nb; b++) {
      size_t lat = (size_t)ds->C * (size_t)(d->b[b].h / ds->s) * (size_t)(d->b[b].w / ds->s);
      size_t ref = (size_t)ds->C * (size_t)(d->b[b].rh / ds->s) * (size_t)(d->b[b].rw / ds->s);
      if (lat > ds->maxlat) ds->maxlat = lat;
      if (ref > ds->maxref) ds->maxref = ref;
    }
    ds->stats.buckets += (size_t)d->nb;
    if (!(bks[i] = calloc((size_t)d->nb + 1, sizeof *bks[i]))) {
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
      break;
    }
    for (int b = 0; b < d->nb; b++) bks[i][b] = (ct_sampler_bucket){d->b[b].key, d->b[b].n};
    sets[i] = (ct_sampler_set){d->c->id, d->c->probability, d->repeats, bks[i], d->nb};
  }
  ds->stats.samples = ct_dataset_count(ds);
  if (!st)
    st = ct_sampler_init(&ds->smp, sets, ds->nd, (uint64_t)ds->cfg->seed, ds->B, ds->world,
                         (int)ds->accum, err);
  for (int i = 0; bks && i < ds->nd; i++) free(bks[i]);
  free(bks);
  free(sets);
  if (!st) st = ct_sampler_pos_init(&ds->smp, &ds->pos, err);
  if (st) return st;
  ds->qn = o->prefetch > 0 ? o->prefetch + 1 : 1; /* one slot is held by the trainer */
  ds->q = calloc((size_t)ds->qn, sizeof *ds->q);
  if (!ds->q) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (int k = 0; k < ds->qn && !st; k++) {
    slot *s = &ds->q[k];
    s->x0 = ct_alloc(CT_MEM_BUFFERS, ds->B * ds->maxlat * sizeof(float));
    if (ds->maxref && !(s->ref = ct_alloc(CT_MEM_BUFFERS, ds->B * ds->maxref * sizeof(float))))
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    s->caps = calloc(ds->B, sizeof *s->caps);
    s->ids = calloc(ds->B, sizeof *s->ids);
    if ((st = ct_sampler_pos_init(&ds->smp, &s->after, err))) break;
    s->miss = calloc(ds->B, 1);
    s->rels = calloc(ds->B, sizeof *s->rels);
    s->geom = calloc(ds->B, sizeof *s->geom);
    s->dropped = calloc(ds->B, 1);
    if (o->text) {
      s->txt =
          ct_alloc(CT_MEM_BUFFERS, ds->B * (size_t)o->text->T * (size_t)o->text->d * sizeof(float));
      s->pooled = ct_alloc(CT_MEM_BUFFERS, ds->B * (size_t)o->text->dp * sizeof(float));
    }
    if (!s->x0 || !s->caps || !s->ids || !s->miss || !s->rels || !s->geom || !s->dropped ||
        (o->text && (!s->txt || !s->pooled)))
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  return st;
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
  pthread_mutex_init(&ds->mu, NULL);
  pthread_cond_init(&ds->cv, NULL);
  const ct_backend_vars vars = {cfg->model_family, cfg->output_dir, cfg->resolution_type,
                                cfg->minimum_image_size, cfg->model_type};
  ct_status st = ct_backend_load_with(backend_json, &vars, &ds->be, NULL, err);
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
    st = setup_dataset(ds, c, d, err);
    if (!st) st = load_dataset(ds, d, err);
  }
  if (st) goto out;
  for (int i = 0; i < ds->nd && !st; i++) st = ct_ds_check_effective_batch(ds, &ds->d[i], err);
  for (int i = 0; i < ds->nd; i++) /* the largest latent, for the encoders' buffers */
    for (int b = 0; b < ds->d[i].nb; b++) {
      const bucket *bk = &ds->d[i].b[b];
      size_t lat = (size_t)ds->C * (size_t)(bk->h / ds->s) * (size_t)(bk->w / ds->s);
      size_t ref = (size_t)ds->C * (size_t)(bk->rh / ds->s) * (size_t)(bk->rw / ds->s);
      if (lat > ds->maxlat) ds->maxlat = lat;
      if (ref > ds->maxref) ds->maxref = ref;
    }
  if (!st) st = ct_ds_build_latent_cache(ds, err);
  if (!st) st = ct_ds_build_text_cache(ds, err);
  /* images dropped by the cache build may have emptied buckets: check again */
  for (int i = 0; i < ds->nd && !st; i++) st = ct_ds_check_effective_batch(ds, &ds->d[i], err);
  if (st) goto out;
  st = alloc_sampler_queue(ds, err);
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
    ct_free(ds->q[k].ref);
    free(ds->q[k].caps);
    free(ds->q[k].ids);
    ct_sampler_pos_free(&ds->q[k].after);
    free(ds->q[k].miss);
    free(ds->q[k].rels);
    free(ds->q[k].geom);
    free(ds->q[k].dropped);
    ct_free(ds->q[k].txt);
    ct_free(ds->q[k].pooled);
  }
  free(ds->q);
  ct_sampler_free(&ds->smp);
  ct_sampler_pos_free(&ds->pos);
  for (int i = 0; ds->d && i < ds->nd; i++) {
    dset *d = &ds->d[i];
    for (size_t k = 0; k < d->nit; k++) {
      free(d->it[k].rel);
      free(d->it[k].ref);
      for (int l = 0; l < d->it[k].nlines; l++) free(d->it[k].lines[l]);
      free(d->it[k].lines);
    }
    free(d->it);
    ct_ds_free_buckets(d);
    free(d->dir);
    free(d->cdir);
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

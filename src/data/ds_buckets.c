/* ds_buckets.c: a dataset's aspect buckets — grouping its images by aspect
 * key (each bucket at its first image's size; bucket.c does the arithmetic),
 * SimpleTuner's checks of every bucket against the effective batch (its
 * detailed failure, allow_dataset_oversubscription, or pruning), and the
 * bucket index and metadata files SimpleTuner writes beside the images.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "data/dataset_int.h"

static int cmp_bucket(const void *a, const void *b) {
  double x = atof(((const bucket *)a)->key), y = atof(((const bucket *)b)->key);
  return x < y ? -1 : x > y;
}

void ct_ds_free_buckets(dset *d) {
  for (int i = 0; i < d->nb; i++) free(d->b[i].idx);
  free(d->b);
  d->b = NULL;
  d->nb = 0;
}

/* Group items by aspect key; a bucket's size is its first item's target.
 * With reference_loose references the key also holds the reference's
 * ("1.0|0.75"): a batch's references share one size. */
ct_status ct_ds_make_buckets(dset *d, ct_err *err) {
  ct_ds_free_buckets(d);
  const int loose = d->cc && d->cc->conditioning_type == CT_COND_REFERENCE_LOOSE;
  for (size_t i = 0; i < d->nit; i++) {
    item *it = &d->it[i];
    char key[24];
    ct_bucket_key(it->g.aspect, d->bo.rounding, key, sizeof key);
    if (loose) {
      const size_t kl = strlen(key);
      key[kl] = '|';
      ct_bucket_key(it->rg.aspect, d->cbo.rounding, key + kl + 1, sizeof key - kl - 1);
    }
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
      if (d->cc) d->b[b].rw = it->rg.target_w, d->b[b].rh = it->rg.target_h;
      d->nb++;
    }
    bucket *bk = &d->b[b];
    if (it->g.target_w != bk->w || it->g.target_h != bk->h)
      ct_bucket_refit(&d->bo, bk->w, bk->h, it->hash, &it->g);
    if (d->cc && !loose) { /* reference_strict: placed as its target (its own original size) */
      const int ow = it->rg.orig_w, oh = it->rg.orig_h;
      it->rg = it->g;
      it->rg.orig_w = ow, it->rg.orig_h = oh;
    } else if (loose && (it->rg.target_w != bk->rw || it->rg.target_h != bk->rh))
      ct_bucket_refit(&d->cbo, bk->rw, bk->rh, it->rhash, &it->rg);
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
size_t ct_ds_drop_items(dset *d, const unsigned char *drop) {
  size_t k = 0;
  for (size_t i = 0; i < d->nit; i++) {
    if (!drop[i]) {
      d->it[k++] = d->it[i];
      continue;
    }
    free(d->it[i].rel);
    free(d->it[i].ref);
    for (int l = 0; l < d->it[i].nlines; l++) free(d->it[i].lines[l]);
    free(d->it[i].lines);
  }
  size_t gone = d->nit - k;
  d->nit = k;
  return gone;
}

/* SimpleTuner's checks of every bucket against the effective batch. */
ct_status ct_ds_check_effective_batch(ct_dataset *ds, dset *d, ct_err *err) {
  const size_t E = ds->E;
  int nbad = 0;
  long need_r = 0;
  for (int b = 0; b < d->nb; b++)
    if (ct_ds_entries(ds, (int)(d - ds->d), b) < E) {
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
      if (ct_ds_entries(ds, (int)(d - ds->d), b) < E) {
        CT_WARN(
            "dataset '%s': bucket %s (%dx%d) holds %zu sample(s) x (%ld+1) repeats = %zu, fewer "
            "than the "
            "effective batch %zu; pruned (its images are not trained on; set "
            "allow_dataset_oversubscription "
            "or add images to keep them)",
            d->c->id, d->b[b].key, d->b[b].w, d->b[b].h, d->b[b].n, d->repeats,
            ct_ds_entries(ds, (int)(d - ds->d), b), E);
        ds->stats.buckets_pruned++;
        for (size_t k = 0; k < d->b[b].n; k++) drop[d->b[b].idx[k]] = 1;
      }
    /* the pruned buckets' images leave the dataset (no cache, no captions) */
    ds->stats.kept -= ct_ds_drop_items(d, drop);
    free(drop);
    return ct_ds_make_buckets(d, err);
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
    size_t have = ct_ds_entries(ds, (int)(d - ds->d), b);
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
void ct_ds_write_index(ct_dataset *ds, dset *d, const ct_data_stats *fs) {
  for (int attempt = 0; attempt < 2; attempt++) {
    char p1[4200], p2[4200], n1s[200], n2s[200];
    snprintf(n1s, sizeof n1s, "aspect_ratio_bucket_indices_%s.json", d->c->id);
    snprintf(n2s, sizeof n2s, "aspect_ratio_bucket_metadata_%s.json", d->c->id);
    if (attempt ? ct_pathf(p1, sizeof p1, "%s/%s", ds->cfg->output_dir, n1s) ||
                      ct_pathf(p2, sizeof p2, "%s/%s", ds->cfg->output_dir, n2s)
                : ct_ds_key_join(p1, sizeof p1, d->imgdir, n1s) ||
                      ct_ds_key_join(p2, sizeof p2, d->imgdir, n2s))
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
    /* the images' own aspect keys: reference_loose buckets ("1.0|0.75") of
     * one target key are listed together under it, as SimpleTuner keys them */
    for (int b = 0, first = 1; b < d->nb; b++) {
      const size_t kl = strcspn(d->b[b].key, "|");
      int seen = 0;
      for (int e = 0; e < b && !seen; e++)
        seen = strcspn(d->b[e].key, "|") == kl && !strncmp(d->b[e].key, d->b[b].key, kl);
      if (seen) continue;
      fprintf(f, "%s\n  \"%.*s\": [", first ? "" : ",", (int)kl, d->b[b].key);
      first = 0;
      for (int e = b, k = 0; e < d->nb; e++) {
        if (strcspn(d->b[e].key, "|") != kl || strncmp(d->b[e].key, d->b[b].key, kl)) continue;
        for (size_t i = 0; i < d->b[e].n; i++, k++) {
          char full[8400];
          snprintf(full, sizeof full, "%s/%s", d->dir, d->it[d->b[e].idx[i]].rel);
          if (k) fputs(", ", f);
          ct_json_fput_str(f, full);
        }
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

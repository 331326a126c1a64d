/* reference.c: conditioning_data — each image of a dataset paired with its
 * reference, the image of the same relative path in the dataset_type
 * "conditioning" dataset that it names (SimpleTuner's rule: "every edit image
 * must have a 1-to-1 matching file name"; docs/data.md, "Conditioning
 * datasets").
 *
 * reference_strict: the reference takes its image's placement whatever its
 * own size (resized to the image's intermediary size and cropped at the same
 * place: SimpleTuner's TrainingSample.prepare_like); reference_loose: it is
 * placed by the conditioning dataset's own keys (resolution, crop, ...). Images without a
 * usable reference are dropped and counted. The references' latents (the
 * VAE's mean, as FluxKontextPipeline's prepare_latents) are cached by
 * latent_cache.c in the conditioning dataset's cache_dir_vae.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/hash.h"
#include "ctuner/log.h"
#include "data/dataset_int.h"
#include "data/discover.h"

static int cmp_disc(const void *a, const void *b) {
  return strcmp(((const ct_disc_item *)a)->rel, ((const ct_disc_item *)b)->rel);
}

/* The reference of item it, or why there is none (NULL: paired). */
static const char *pair_one(const dset *d, item *it, const ct_disc *disc, ct_err *err,
                            ct_status *st) {
  ct_disc_item key = {.rel = it->rel};
  const ct_disc_item *x = bsearch(&key, disc->it, disc->n, sizeof *disc->it, cmp_disc);
  static char why[160];
  if (!x || x->why == CT_DISC_NOT_FOUND) return "no image of that path";
  if (x->why == CT_DISC_UNREADABLE) return "its reference is not a readable image";
  const int strict = d->cc->conditioning_type == CT_COND_REFERENCE_STRICT;
  if (!strict && d->cc->minimum_image_size > 0) { /* loose: its own dataset's minimum */
    double minsz = d->cc->minimum_image_size, size = x->w < x->h ? x->w : x->h;
    if (d->cbo.resolution_type == CT_RES_AREA) size = (double)x->w * x->h / 1e6;
    if (d->cc->resolution_type == CT_RES_PIXEL_AREA) minsz = minsz * minsz / 1e6;
    if (size < minsz) {
      snprintf(why, sizeof why, "the reference (%dx%d) is below minimum_image_size %g", x->w, x->h,
               d->cc->minimum_image_size);
      return why;
    }
  }
  it->rhash = ct_hash_str(x->rel);
  if (strict) { /* resized to its image's intermediary size, cropped at the same place */
    it->rg = it->g;
    it->rg.orig_w = x->w, it->rg.orig_h = x->h;
  } else if ((*st = ct_bucket_place(&d->cbo, x->w, x->h, it->rhash, &it->rg, err))) {
    return "";
  }
  if (!(it->ref = strdup(x->rel))) *st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  return *st ? "" : NULL;
}

ct_status ct_ds_pair_references(ct_dataset *ds, dset *d, size_t *unpaired, ct_err *err) {
  *unpaired = 0;
  /* the conditioning dataset's images and sizes; its captions are not read
   * (the image dataset's caption each pair) */
  ct_ds_config cc = *d->cc;
  cc.caption_strategy = CT_CAP_FILENAME;
  ct_disc disc = {0};
  ct_status st = ct_discover(&cc, d->csto, "", d->cdir, NULL, ds->o.comm, &disc, err);
  if (st) return st;
  qsort(disc.it, disc.n, sizeof *disc.it, cmp_disc);
  unsigned char *drop = calloc(d->nit + 1, 1);
  if (!drop) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  size_t shown = 0;
  for (size_t i = 0; i < d->nit && !st; i++) {
    const char *why = pair_one(d, &d->it[i], &disc, err, &st);
    if (!why || st) continue;
    drop[i] = 1;
    if (shown++ < 5)
      CT_WARN(
          "dataset '%s': %s has no usable reference in conditioning dataset '%s' (%s/%s: %s); "
          "skipped",
          d->c->id, d->it[i].rel, d->cc->id, d->cdir, d->it[i].rel, why);
  }
  if (!st) *unpaired = ct_ds_drop_items(d, drop);
  if (!st && *unpaired > 5)
    CT_WARN("dataset '%s': %zu images in all without a usable reference in '%s'", d->c->id,
            *unpaired, d->cc->id);
  free(drop);
  ct_disc_free(&disc);
  return st;
}

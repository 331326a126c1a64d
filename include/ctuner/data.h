/* Training data as the trainer sees it: a fixed list of samples, each an
 * encoded latent (C, h, w) and its caption lines, plus the order in which an
 * epoch visits them.
 *
 * This is the narrow interface the full SimpleTuner-compatible loader
 * (buckets, caches, S3, parquet) plugs into later. The implementation here
 * reads `type: local` datasets of a multidatabackend.json: images (PNG, JPEG)
 * with captions from same-name .txt files (caption_strategy textfile), the
 * file name (filename) or a fixed prompt (instanceprompt); every image is
 * resized to resolution x resolution (crop false: squashed; crop true:
 * short side to resolution, then a centre crop) and encoded once.
 * Corrupt or unreadable images are skipped and counted, never fatal.
 */
#ifndef CTUNER_DATA_H
#define CTUNER_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/status.h"

typedef struct ct_data_opts {
  int resolution;  /* pixels, square */
  int codec_scale; /* pixel codec s */
  uint64_t seed;
} ct_data_opts;

typedef struct ct_dataset ct_dataset;

/* Read a multidatabackend.json and load every enabled image dataset. */
ct_status ct_dataset_open(const char *backend_json, const ct_data_opts *o, ct_dataset **out,
                          ct_err *err);
void ct_dataset_free(ct_dataset *ds);

/* Samples after repeats (each image appears repeats+1 times). */
size_t ct_dataset_count(const ct_dataset *ds);
int ct_dataset_channels(const ct_dataset *ds);
int ct_dataset_latent_side(const ct_dataset *ds);
/* Latent of sample i: (C, side, side). */
const float *ct_dataset_latent(const ct_dataset *ds, size_t i);
/* Caption of sample i; with several lines, line (pick mod nlines). */
const char *ct_dataset_caption(const ct_dataset *ds, size_t i, uint64_t pick);
/* Longest caption over every caption line of every sample, measured by
 * measure(caption, ctx) (NULL: bytes); *n_over (if not NULL) counts caption
 * lines longer than `limit`. */
size_t ct_dataset_longest_caption(const ct_dataset *ds, size_t (*measure)(const char *, void *), void *ctx,
                                  size_t limit, size_t *n_over);
/* Images skipped as unreadable, and the path of the first one (or NULL). */
size_t ct_dataset_skipped(const ct_dataset *ds, const char **first);

/* Index of the sample at position pos of epoch e: a Philox permutation of
 * [0, count) keyed by (seed, epoch), identical on every run. */
size_t ct_dataset_order(ct_dataset *ds, long epoch, size_t pos);

#endif

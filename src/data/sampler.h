/* sampler.h: the data sampler as plain data — which entries of which bucket
 * each optimizer step takes, and the position that is all its state.
 *
 * Private to src/data (the dataset's prefetch thread drives it); the tests
 * include it. No I/O, no dataset, no threads: the buckets come in as sizes
 * and names, selections go out as indexes into a bucket's images.
 *
 * The rules (docs/data.md, "Sampling"): an optimizer step takes E = B x ranks
 * x accum consecutive entries of one bucket's order for the epoch (a Philox
 * shuffle of its n images x (repeats + 1), keyed by seed, set id, bucket key
 * and epoch); the set and then the bucket are drawn with a generator keyed by
 * (seed, epoch, step-in-epoch), sets by probability, buckets by the whole
 * steps they have left. Micro-batch m of rank r takes entries
 * [(m x ranks + r) x B, +B) of the step. A bucket with fewer than E entries
 * left is done for the epoch; the epoch ends when every bucket is done.
 */
#ifndef CTUNER_DATA_SAMPLER_H
#define CTUNER_DATA_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/status.h"

/* The version ct_sampler_state_json writes and ct_sampler_state_restore reads. */
#define CT_SAMPLER_STATE_VERSION 1

/* ---- what the sampler is built from (copied by ct_sampler_init) ---- */

typedef struct ct_sampler_bucket {
  const char *key; /* its name in the state JSON (the aspect key, e.g. "1.33") */
  size_t n;        /* images */
} ct_sampler_bucket;

typedef struct ct_sampler_set { /* a dataset */
  const char *id;               /* its name in the state JSON */
  double probability;           /* > 0: its weight when a step's set is drawn */
  long repeats;                 /* >= 0: each image appears repeats + 1 times per epoch */
  const ct_sampler_bucket *b;
  int nb;
} ct_sampler_set;

/* ---- state ---- */

typedef struct ct_sampler_pos {
  long epoch;       /* the current epoch (0 first) */
  long step;        /* steps drawn in it */
  uint64_t seen;    /* samples drawn: the next step's first sample id */
  size_t *consumed; /* per flat bucket: entries of its epoch order drawn */
} ct_sampler_pos;

/* One optimizer step, as drawn. */
typedef struct ct_sampler_step {
  int set, bucket;   /* the set and its bucket */
  int flat;          /* the bucket's flat index (over every set) */
  long epoch;        /* the epoch the step belongs to */
  int new_epoch;     /* 1: the draw began a new epoch */
  size_t base;       /* its first entry in the bucket's order */
  uint64_t first_id; /* the global id of that entry (ids are consecutive) */
} ct_sampler_step;

typedef struct ct_sampler_fbucket { /* a bucket, flat over every set */
  char *key;
  size_t n, entries; /* images; entries per epoch (n x (repeats + 1)) */
  int set;
} ct_sampler_fbucket;

typedef struct ct_sampler_fset {
  char *id;
  double probability;
  long repeats;
  int boff, nb; /* its buckets: flat [boff, boff + nb) */
} ct_sampler_fset;

/* Read-only outside sampler.c, except through the functions below. */
typedef struct ct_sampler {
  uint64_t seed;
  size_t B, E; /* micro-batch per rank; entries per step (B x ranks x accum) */
  int ranks, accum;
  int nsets, nbt; /* sets, flat buckets */
  ct_sampler_fset *sets;
  ct_sampler_fbucket *b;
  ct_sampler_pos pos; /* after the last step drawn */
  long perm_epoch;    /* the epoch perm holds (-1: none) */
  size_t **perm;      /* per flat bucket: its order (entries -> image index) */
} ct_sampler;

/* A sampler at the start of epoch 0. Sets need probability > 0, repeats >= 0
 * and distinct ids; B, ranks and accum must be positive. An error names the
 * set or value. ct_sampler_free(s) is safe after a failure. */
ct_status ct_sampler_init(ct_sampler *s, const ct_sampler_set *sets, int nsets, uint64_t seed,
                          size_t B, int ranks, int accum, ct_err *err);
void ct_sampler_free(ct_sampler *s);

/* Draw the next step at s->pos (advanced: steps, consumed, seen; a new epoch
 * when every bucket is done). CT_ERR_INVALID when no bucket of any set holds
 * E entries (nothing can ever be drawn). */
ct_status ct_sampler_next(ct_sampler *s, ct_sampler_step *out, ct_err *err);
/* Micro-batch m (< accum) of rank (< ranks) of step st: img[i] the index of
 * the bucket's image and ids[i] the global sample id of its B samples. */
void ct_sampler_select(ct_sampler *s, const ct_sampler_step *st, int m, int rank, size_t *img,
                       uint64_t *ids);

/* Positions of this sampler's shape (a copy survives s->pos moving on). */
ct_status ct_sampler_pos_init(const ct_sampler *s, ct_sampler_pos *p, ct_err *err);
void ct_sampler_pos_copy(const ct_sampler *s, ct_sampler_pos *dst, const ct_sampler_pos *src);
void ct_sampler_pos_free(ct_sampler_pos *p);

/* Position p as sampler_state.json (malloc'd; NULL when out of memory):
 * {"version": 1, "epoch", "step_in_epoch", "samples_seen", "datasets":
 * {id: {"repeats", "consumed": {bucket key: entries}}}}. */
char *ct_sampler_state_json(const ct_sampler *s, const ct_sampler_pos *p);
/* Set s->pos from such a JSON text. Text that is not JSON, an unknown
 * version, a missing or negative epoch / step_in_epoch / samples_seen, or a
 * datasets entry of the wrong type fail with CT_ERR_FORMAT naming the problem
 * (s->pos unchanged). Sets or buckets this sampler has that the state lacks,
 * or counts beyond a bucket's entries, start from 0 and set *changed (the
 * datasets changed since the state was saved). */
ct_status ct_sampler_state_restore(ct_sampler *s, const char *json, int *changed, ct_err *err);

#endif

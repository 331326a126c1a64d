/* sampler.c: which samples each optimizer step takes, and the position.
 *
 * Sampling: an optimizer step takes E consecutive entries of one bucket's
 * order for the epoch (a Philox shuffle of its images x (repeats + 1), keyed
 * by seed, dataset, bucket and epoch); the dataset and then the bucket are
 * drawn with a generator keyed by (seed, epoch, step-in-epoch), datasets by
 * `probability`, buckets by the whole steps they have left. Micro-batch m of
 * rank r takes entries [(m x ranks + r) x b, +b). A bucket with fewer than
 * E entries left is done for the epoch (its tail is not repeated); the epoch
 * ends when every bucket is done. The position (epoch, steps drawn, entries
 * consumed per bucket, samples seen) is all the state there is
 * (sampler_state.json in checkpoints).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/rng.h"
#include "data/dataset_int.h"

#define STREAM_PERM 0x5045524d00000000ull
#define STREAM_DSPICK 0x4453504b00000000ull
#define STREAM_BUCKET 0x424b504b00000000ull

void ct_ds_pos_copy(position *dst, const position *src, int nbt) {
  dst->epoch = src->epoch, dst->k = src->k, dst->seen = src->seen;
  memcpy(dst->consumed, src->consumed, (size_t)nbt * sizeof(size_t));
}

void ct_ds_make_perms(ct_dataset *ds, long epoch) {
  if (ds->perm_epoch == epoch) return;
  for (int di = 0; di < ds->nd; di++) {
    dset *d = &ds->d[di];
    for (int b = 0; b < d->nb; b++) {
      size_t n = ct_ds_entries(ds, di, b), *p = ds->perm[d->boff + b];
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
void ct_ds_draw_step(ct_dataset *ds, position *p, int *od, int *ob, size_t *base, int *new_epoch) {
  const size_t E = ds->E;
  *new_epoch = 0;
  for (int pass = 0; pass < 2; pass++) {
    double wsum = 0;
    for (int di = 0; di < ds->nd; di++) {
      dset *d = &ds->d[di];
      for (int b = 0; b < d->nb; b++)
        if (ct_ds_entries(ds, di, b) - p->consumed[d->boff + b] >= E) {
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
          if (ct_ds_entries(ds, di, b) - p->consumed[d->boff + b] >= E) {
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
        bsum += (double)((ct_ds_entries(ds, pick, b) - p->consumed[d->boff + b]) / E);
      double v = ct_rng_uniform((uint64_t)ds->cfg->seed, STREAM_BUCKET, key) * bsum;
      int bp = -1, bl = -1;
      acc = 0;
      for (int b = 0; b < d->nb && bp < 0; b++) {
        double steps = (double)((ct_ds_entries(ds, pick, b) - p->consumed[d->boff + b]) / E);
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
      size_t have = ct_ds_entries(ds, di, b);
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
  ct_ds_pos_copy(&ds->ppos, &p, ds->nbt);
  ct_ds_pos_copy(&ds->pos, &p, ds->nbt);
  free(p.consumed);
  ds->pm = 0;
  return CT_OK;
}


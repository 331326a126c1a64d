/* prefetch.c: ct_dataset_next and the prefetch thread behind it.
 *
 * A producer thread runs the sampler ahead of the trainer and fills a ring of
 * slots (dataloader_prefetch_qlen); each slot carries the position after it,
 * which becomes the dataset's position when the trainer takes the slot. A
 * slot's cache entries are fetched with one get_many per storage; a missing
 * latent is encoded on the producer thread, a missing text entry on the
 * trainer's thread (the text encoder is not thread-safe). With no prefetch
 * the trainer's thread produces each batch itself.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/log.h"
#include "ctuner/rng.h"
#include "data/dataset_int.h"

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
      ct_ds_latent_path(d, its[i], 0, keys[i], sizeof keys[i], NULL, 0);
      rq[i] = (ct_storage_req){.key = keys[i]};
    }
    ct_err e = {0};
    ct_storage_get_many(d->vae_sto, rq, B, &e); /* failures: per request, retried one by one */
    for (size_t i = 0; i < B; i++) {
      if (rq[i].st == CT_OK) {
        char bufs[4][96];
        const char *meta[8];
        ct_ds_latent_meta(ds, its[i], 0, bufs, meta);
        ct_cache_tensor t = ct_ds_latent_tensor(ds, its[i], 0, s->x0 + i * lat);
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
      ct_ds_text_path(ds, d, s->caps[i], path, sizeof path, md5s[i], keys[i], sizeof keys[i]);
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

/* Produce this rank's next micro-batch into s: the sampler's selection, the
 * captions (with dropout) and the cached latents and text entries. */
static ct_status produce(ct_dataset *ds, slot *s, ct_err *err) {
  const size_t B = ds->B;
  ct_status st = ds->pm == 0 ? ct_sampler_next(&ds->smp, &ds->cur, err) : CT_OK;
  if (st) return st;
  const int m = ds->pm;
  dset *d = &ds->d[ds->cur.set];
  const bucket *bk = &d->b[ds->cur.bucket];
  const size_t lat = (size_t)ds->C * (size_t)(bk->h / ds->s) * (size_t)(bk->w / ds->s);
  s->b.B = (int)B, s->b.C = ds->C, s->b.h = bk->h / ds->s, s->b.w = bk->w / ds->s;
  s->b.x0 = s->x0, s->b.caps = s->caps, s->b.ids = s->ids;
  s->b.geom = s->geom, s->b.dropped = s->dropped;
  s->b.epoch_end = m == 0 && ds->cur.new_epoch;
  s->b.regularisation = d->c->is_regularisation_data;
  const size_t rlat = (size_t)ds->C * (size_t)(bk->rh / ds->s) * (size_t)(bk->rw / ds->s);
  s->b.ref = d->cc ? s->ref : NULL;
  s->b.rh = d->cc ? bk->rh / ds->s : 0, s->b.rw = d->cc ? bk->rw / ds->s : 0;
  const item **its = malloc(B * sizeof *its);
  size_t *img = malloc(B * sizeof *img);
  if (!its || !img) {
    free(its), free(img);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory for a batch");
  }
  ct_sampler_select(&ds->smp, &ds->cur, m, ds->rank, img, s->ids);
  for (size_t i = 0; i < B; i++) {
    const item *it = its[i] = &d->it[bk->idx[img[i]]];
    const uint64_t id = s->ids[i];
    s->rels[i] = it->rel;
    s->geom[i] = it->g;
    s->dropped[i] = 0;
    uint32_t rr[4];
    ct_philox4x32((uint64_t)ds->cfg->seed, CT_STREAM_CAPTION, id, rr);
    s->caps[i] = it->lines[rr[0] % (uint32_t)it->nlines];
    if (ct_rng_uniform((uint64_t)ds->cfg->seed, CT_STREAM_DROPOUT, id) <
        ds->cfg->caption_dropout_probability)
      s->caps[i] = "", s->dropped[i] = 1;
  }
  free(img);
  /* The batch's cache entries in two get_many calls (S3: over the pool);
   * what is missing or bad falls back to latent_of / the trainer's thread. */
  unsigned char *lat_ok = calloc(B, 1), *txt_ok = calloc(B, 1);
  if (!lat_ok || !txt_ok) st = ct_errf(err, CT_ERR_NOMEM, "out of memory for a batch");
  if (!st) batch_prefetch(ds, d, its, s, lat, lat_ok, txt_ok);
  for (size_t i = 0; i < B && !st; i++) {
    const item *it = its[i];
    ct_err e = {0};
    lat_result lr = lat_ok[i] ? LAT_CACHED : ct_ds_latent_of(ds, d, it, 0, s->x0 + i * lat, &e);
    if (d->cc && lr != LAT_BAD) { /* the reference: its own cache entry */
      if (lr == LAT_WRITE_FAILED)
        CT_WARN("dataset '%s': %s (training continues without this cache entry)", d->c->id, e.msg);
      memset(&e, 0, sizeof e);
      lr = ct_ds_latent_of(ds, d, it, 1, s->ref + i * rlat, &e);
    }
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
  ct_sampler_pos_copy(&ds->smp, &s->after, &ds->smp.pos);
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
  double t0 = ct_ds_now();
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
    if (ct_ds_text_entry(ds, s->from, s->caps[i], seq, pooled, 1, &e))
      CT_WARN("text cache: %s (training continues without this entry)", e.msg);
    s->miss[i] = 0;
  }
  ct_sampler_pos_copy(&ds->smp, &ds->pos, &s->after);
  trace(ds, s);
  s->b.wait_s = ct_ds_now() - t0;
  ds->wait_s += s->b.wait_s;
  *out = &s->b;
  return CT_OK;
}

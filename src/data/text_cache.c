/* text_cache.c: the text cache — one entry per distinct caption
 * ({text cache}/{md5(caption)}-{encoder tag}.st: the sequence and pooled
 * embeddings). The build encodes the missing entries in groups of
 * write_batch_size captions of the sorted list, spread over the ranks, so an
 * entry's bits never depend on the world size; ct_dataset_next encodes the
 * odd entry missing at training time on the trainer's thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/fs.h"
#include "ctuner/log.h"
#include "data/dataset_int.h"

/* A caption's entry: its name in file lists and messages (out), and its key
 * in text_sto (key, if not NULL). */
void ct_ds_text_path(const ct_dataset *ds, const dset *d, const char *cap, char *out, size_t n,
                     char md5[33], char *key, size_t kn) {
  char name[120];
  ct_md5_hex(cap, strlen(cap), md5);
  snprintf(name, sizeof name, "%s-%s.st", md5, ds->o.text->tag);
  (void)ct_pathf(out, n, "%s/%s", d->text_dir, name);
  if (key) ct_ds_key_join(key, kn, d->text_key, name);
}

/* Read (write = 0) or write the entry of one caption. */
ct_status ct_ds_text_entry(const ct_dataset *ds, const dset *d, const char *cap, float *seq,
                           float *pooled, int write, ct_err *err) {
  const ct_text_encoder_fn *te = ds->o.text;
  char path[4200], md5[33], key[4400];
  ct_ds_text_path(ds, d, cap, path, sizeof path, md5, key, sizeof key);
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
    ct_ds_text_path(ds, d, caps[i], path, sizeof path, md5, keys[k], sizeof keys[k]);
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
    ct_ds_text_path(ds, d, caps[j], path, sizeof path, md5, keys[j], sizeof keys[j]);
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
ct_status ct_ds_build_text_cache(ct_dataset *ds, ct_err *err) {
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
    const double t0 = ct_ds_now();
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
        ct_ds_text_path(ds, d, caps[k], p, sizeof p, md5, NULL, 0);
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
          d->c->id, d->text_dir, u, built, ct_ds_now() - t0, trusted);
  }
  return st;
}

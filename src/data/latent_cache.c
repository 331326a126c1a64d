/* latent_cache.c: the latent cache — one entry per image
 * ({cache_dir_vae}/{sha256(path without extension)}.st, cache.c's format)
 * holding its latent and what it was made from. The build spreads the images
 * over the ranks and works in chunks (one get_many for the entries, one for
 * the images of the missing ones, one put_many for the new entries); images
 * that fail are dropped on every rank. The prefetch thread reads entries
 * through ct_ds_latent_of.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/codec.h"
#include "ctuner/fs.h"
#include "ctuner/image.h"
#include "ctuner/log.h"
#include "data/dataset_int.h"

/* The side ref of d: where its images and its cache entries are. */
static ct_storage *img_sto(const dset *d, int ref) {
  return ref ? d->csto : d->sto;
}
static const char *img_dir(const dset *d, int ref) {
  return ref ? "" : d->imgdir;
}
static const char *shown_dir(const dset *d, int ref) {
  return ref ? d->cdir : d->dir;
}
static ct_storage *vae_sto(const dset *d, int ref) {
  return ref ? d->cvae_sto : d->vae_sto;
}

/* An item's cache entry: its key in vae_sto and (shown) its name in file
 * lists and messages: {cache_dir_vae}/{sha256(path without extension)}.st. */
void ct_ds_latent_path(const dset *d, const item *it, int ref, char *key, size_t kn, char *shown,
                       size_t sn) {
  char stem[4096], hex[65], name[80];
  snprintf(stem, sizeof stem, "%s", ct_it_rel(it, ref));
  char *dot = strrchr(stem, '.'), *slash = strrchr(stem, '/');
  if (dot && (!slash || dot > slash)) *dot = 0;
  ct_sha256_hex(stem, strlen(stem), hex);
  snprintf(name, sizeof name, "%s.st", hex);
  if (key) ct_ds_key_join(key, kn, ref ? d->cvae_key : d->vae_key, name);
  if (shown) (void)ct_pathf(shown, sn, "%s/%s", ref ? d->cvae_dir : d->vae_dir, name);
}

/* What a cache entry must have been made from. */
void ct_ds_latent_meta(const ct_dataset *ds, const item *it, int ref, char bufs[4][96],
                       const char *meta[8]) {
  const ct_img_geom *g = ct_it_geom(it, ref);
  if (ds->o.codec) /* a reference is the latent mean, not a sample */
    snprintf(bufs[0], 96, "%s%s", ds->o.codec->tag, ref ? ":mean" : "");
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
static ct_status encode_item(const ct_dataset *ds, const dset *d, const item *it, int ref,
                             const char *bytes, size_t n, float *lat, ct_err *err) {
  char key[4400];
  char *own = NULL;
  ct_image img = {0}, r = {0}, c = {0};
  const ct_img_geom *g = ct_it_geom(it, ref);
  const char *rel = ct_it_rel(it, ref), *dir = shown_dir(d, ref);
  ct_status st = CT_OK;
  if (ct_ds_key_join(key, sizeof key, img_dir(d, ref), rel))
    return ct_errf(err, CT_ERR_RANGE, "%s: path too long", rel);
  if (!bytes) {
    st = ct_storage_get(img_sto(d, ref), key, (size_t)1 << 30, &own, &n, err);
    bytes = own;
  }
  if (!st) st = ct_image_decode(bytes, n, &img, err);
  if (st) ct_err_prefix(err, "%s/%s: ", dir, rel);
  if (!st && (img.w != g->orig_w || img.h != g->orig_h))
    st = ct_errf(err, CT_ERR_FORMAT, "%s/%s: decoded %dx%d but its header said %dx%d", dir, rel,
                 img.w, img.h, g->orig_w, g->orig_h);
  free(own);
  if (!st) st = ct_image_resize(&img, g->inter_w, g->inter_h, &r, err);
  if (!st) st = ct_image_crop(&r, g->crop_x, g->crop_y, g->target_w, g->target_h, &c, err);
  /* a reference: the latent distribution's mean, as FluxKontextPipeline's
   * prepare_latents (retrieve_latents sample_mode "argmax") */
  if (!st && ds->o.codec)
    st = ref ? ct_codec_encode_mean(ds->o.codec, c.px, c.w, c.h, lat, err)
             : ct_codec_encode(ds->o.codec, c.px, c.w, c.h, it->hash, lat, err);
  else if (!st)
    st = ct_pixel_encode(c.px, c.w, c.h, ds->s, lat, err);
  ct_image_free(&img);
  ct_image_free(&r);
  ct_image_free(&c);
  return st;
}

/* The tensor of an item's entry. */
ct_cache_tensor ct_ds_latent_tensor(const ct_dataset *ds, const item *it, int ref, float *lat) {
  const ct_img_geom *g = ct_it_geom(it, ref);
  return (ct_cache_tensor){"latent", 3, {ds->C, g->target_h / ds->s, g->target_w / ds->s, 0}, lat};
}

/* An item's latent: its cache entry when that is valid, else encoded from the
 * image and (unless vae_cache_disable) written to the cache. The path of the
 * prefetch thread (the cache build batches the same steps, build_chunk); err
 * says what went wrong for LAT_BAD (the image) and LAT_WRITE_FAILED (the
 * cache; lat is still valid). */
lat_result ct_ds_latent_of(const ct_dataset *ds, const dset *d, const item *it, int ref, float *lat,
                           ct_err *err) {
  if (d->c->vae_cache_disable)
    return encode_item(ds, d, it, ref, NULL, 0, lat, err) ? LAT_BAD : LAT_ENCODED;
  ct_cache_tensor t = ct_ds_latent_tensor(ds, it, ref, lat);
  char key[4400], bufs[4][96];
  const char *meta[8];
  ct_ds_latent_path(d, it, ref, key, sizeof key, NULL, 0);
  ct_ds_latent_meta(ds, it, ref, bufs, meta);
  float *outs[1] = {lat};
  ct_err re = {0};
  ct_status st = ct_cache_get(vae_sto(d, ref), key, &t, outs, 1, meta, 4, &re);
  if (st == CT_OK) return LAT_CACHED;
  if (st != CT_ERR_NOT_FOUND) CT_WARN("latent cache entry unusable (%s); rebuilding it", re.msg);
  if (encode_item(ds, d, it, ref, NULL, 0, lat, err)) return LAT_BAD;
  return ct_cache_put(vae_sto(d, ref), key, d->comp, &t, 1, meta, 4, err) ? LAT_WRITE_FAILED
                                                                          : LAT_ENCODED;
}

/* all_vae_cache_files_<id>.json: every entry of the finished build. */
static void write_vae_list(const ct_dataset *ds, const dset *d) {
  char **paths = calloc(d->nit + 1, sizeof *paths);
  size_t k = 0;
  for (; paths && k < d->nit; k++) {
    char p[4200];
    ct_ds_latent_path(d, &d->it[k], 0, NULL, 0, p, sizeof p);
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
static void build_chunk(const ct_dataset *ds, const dset *d, int ref, size_t lo, size_t a, size_t b,
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
    ct_ds_latent_path(d, &d->it[a + i], ref, key, sizeof key, shown, sizeof shown);
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
  ct_storage_get_many(vae_sto(d, ref), pk, np, &e);
  for (size_t k = 0; k < np; k++) er[map[k]] = pk[k];
  const int par = !ds->o.codec || !ds->o.codec->serial;
#pragma omp parallel if (par)
  {
    float *lat = ct_alloc(CT_MEM_BUFFERS,
                          (ds->maxlat > ds->maxref ? ds->maxlat : ds->maxref) * sizeof(float));
#pragma omp for schedule(dynamic, 1)
    for (long k = 0; k < (long)np; k++) {
      const size_t i = map[k];
      const item *it = &d->it[a + i];
      if (er[i].st == CT_OK && lat) {
        char bufs[4][96];
        const char *meta[8];
        ct_cache_tensor t = ct_ds_latent_tensor(ds, it, ref, lat);
        float *outs[1] = {lat};
        ct_err re = {0};
        ct_ds_latent_meta(ds, it, ref, bufs, meta);
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
    if (ct_ds_key_join(key, sizeof key, img_dir(d, ref), ct_it_rel(&d->it[a + i], ref)) ||
        !(ir[i].key = strdup(key))) {
      A->mine[a + i - lo] = 1;
      continue;
    }
    ir[i].max = (size_t)1 << 30;
    map[np] = i, pk[np++] = ir[i];
  }
  ct_err ge = {0};
  ct_status gs = ct_storage_get_many(img_sto(d, ref), pk, np, &ge);
  for (size_t k = 0; k < np; k++) ir[map[k]] = pk[k];
  if ((gs == CT_ERR_IO || gs == CT_ERR_NOMEM) &&
      ct_storage_is_remote(
          img_sto(d, ref))) { /* the network, not the images: no image is dropped for it */
    ct_err_prefix(&ge, "reading the images of dataset '%s': ", d->c->id);
    build_fatal(A, &ge);
    goto out;
  }
  size_t built = 0;
#pragma omp parallel if (par) reduction(+ : built)
  {
    float *lat = ct_alloc(CT_MEM_BUFFERS,
                          (ds->maxlat > ds->maxref ? ds->maxlat : ds->maxref) * sizeof(float));
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
        ct_errf(&ie, st, "%s/%s: %s", shown_dir(d, ref), ct_it_rel(it, ref),
                st == CT_ERR_NOT_FOUND ? "not found" : "cannot be read");
      else
        st = encode_item(ds, d, it, ref, ir[i].data, ir[i].n, lat, &ie);
      if (st) {
        CT_WARN("dataset '%s': %s; skipped", d->c->id, ie.msg);
        A->mine[a + i - lo] = 1;
        continue;
      }
      char bufs[4][96];
      const char *meta[8];
      ct_cache_tensor t = ct_ds_latent_tensor(ds, it, ref, lat);
      ct_ds_latent_meta(ds, it, ref, bufs, meta);
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
  if (np && ct_storage_put_many(vae_sto(d, ref), puts, np, 0, &pe))
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

/* One side of dataset d (its images, or with ref their references): every
 * rank encodes its share into the cache; images that fail are dropped
 * everywhere (counted as unreadable). A failed cache write fails every rank. */
static ct_status build_side(ct_dataset *ds, dset *d, int ref, ct_err *err) {
  ct_status st = CT_OK;
  const char *vdir = ref ? d->cvae_dir : d->vae_dir;
  if (!ct_storage_is_remote(vae_sto(d, ref)) && (st = ct_mkdir_p(vdir, err))) return st;
  const size_t lo = d->nit * (size_t)ds->rank / (size_t)ds->world,
               hi = d->nit * (size_t)(ds->rank + 1) / (size_t)ds->world;
  /* mine[i - lo]: item i failed; mine[hi - lo]: a cache write failed here */
  char *mine = calloc(hi - lo + 1, 1), *all = NULL;
  size_t *off = NULL;
  const double t0 = ct_ds_now();
  if (!mine) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  /* preserve_data_backend_cache: entries the last finished build listed are
   * not read back here (a batch still validates what it reads) */
  ct_keyset listed = {0};
  char lp[4200];
  if (!ref && d->c->preserve_data_backend_cache &&
      !ct_filelist_path(lp, sizeof lp, ds->cfg->output_dir, "vae_cache", d->c->id))
    ct_keyset_load(lp, &listed);
  build_acc A = {0, 0, mine, 0, {0}};
  for (size_t a = lo; a < hi && !A.fatal; a += BUILD_CHUNK)
    build_chunk(ds, d, ref, lo, a, a + BUILD_CHUNK < hi ? a + BUILD_CHUNK : hi, &listed, &A);
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
    dropped = ct_ds_drop_items(d, drop);
    if (ref)
      ds->stats.unpaired += dropped;
    else
      ds->stats.unreadable += dropped;
    ds->stats.kept -= dropped;
    if (dropped) st = ct_ds_make_buckets(d, err);
  }
  ct_keyset_free(&listed);
  if (!st && !ref && ds->rank == 0) write_vae_list(ds, d);
  free(mine);
  free(all);
  free(off);
  free(drop);
  if (ref)
    CT_INFO(
        "dataset '%s': reference latents (the VAE's mean) of '%s' in %s: %zu encoded by this "
        "rank in %.1f s, %zu image(s) dropped for an unreadable reference",
        d->c->id, d->cc->id, vdir, A.built, ct_ds_now() - t0, dropped);
  else
    CT_INFO(
        "dataset '%s': latent cache in %s: %zu encoded by this rank in %.1f s (%zu listed "
        "entries trusted), %zu unreadable image(s) dropped",
        d->c->id, vdir, A.built, ct_ds_now() - t0, A.trusted, dropped);
  return st;
}

/* Every rank encodes its share of every dataset's images (and references)
 * into the cache. */
ct_status ct_ds_build_latent_cache(ct_dataset *ds, ct_err *err) {
  ct_status st = CT_OK;
  for (int di = 0; di < ds->nd && !st; di++) {
    dset *d = &ds->d[di];
    if (d->c->vae_cache_disable) continue;
    st = build_side(ds, d, 0, err);
    if (!st && d->cc) st = build_side(ds, d, 1, err);
  }
  return st;
}

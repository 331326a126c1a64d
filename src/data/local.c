/* Local image folders of a multidatabackend.json, loaded and encoded up front.
 *
 * Small datasets (the synthetic shapes, a few thousand images) fit in memory
 * as latents; the bucketed, cached loader of the data-loader issue replaces
 * this for large ones behind the same interface (ctuner/data.h). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "ctuner/alloc.h"
#include "ctuner/codec.h"
#include "ctuner/config.h"
#include "ctuner/data.h"
#include "ctuner/image.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/rng.h"

typedef struct sample {
  size_t latent; /* index into the latent store */
  char **lines;  /* caption lines (owned by the first of its repeats) */
  int nlines;
} sample;

struct ct_dataset {
  ct_data_opts o;
  int C, side;
  size_t lat_floats; /* per sample */
  float *lat;        /* nimages * lat_floats */
  size_t nimages, cap_images;
  sample *s;
  size_t n, cap;
  char ***owned; /* caption arrays to free (one per image) */
  int *owned_n;
  size_t skipped;
  char *first_skipped;
  long perm_epoch;
  size_t *perm;
};

/* Keys SimpleTuner accepts that this loader does not use yet: accepted with a
 * warning so that existing configs run. Everything else is an error. */
static const char *const KNOWN_IGNORED[] = {
    "resolution_type", "minimum_image_size", "maximum_image_size", "minimum_aspect_ratio",
    "maximum_aspect_ratio", "crop_aspect", "crop_aspect_buckets", "probability", "cache_dir_vae",
    "text_embeds", "image_embeds", "vae_cache_disable", "preserve_data_backend_cache",
    "compress_cache", "metadata_backend", "skip_file_discovery", "target_downsample_size",
    "hash_filenames", "vae_cache_clear_each_epoch", "cache_dir", "write_batch_size", "default",
    NULL};
static const char *const KNOWN_USED[] = {"id", "type", "dataset_type", "disabled",
                                         "instance_data_dir", "caption_strategy",
                                         "instance_prompt", "resolution", "crop", "crop_style",
                                         "repeats", "max_num_samples", NULL};

static int in_list(const char *k, const char *const *l) {
  for (; *l; l++)
    if (!strcmp(k, *l)) return 1;
  return 0;
}

static int is_image_name(const char *n) {
  const char *dot = strrchr(n, '.');
  if (!dot) return 0;
  return !strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg");
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted image paths under dir, recursively (SimpleTuner discovers recursively). */
static ct_status list_images(const char *dir, char ***out, size_t *n, size_t *cap, ct_err *err) {
  DIR *d = opendir(dir);
  if (!d) return ct_errf(err, CT_ERR_IO, "cannot open instance_data_dir %s: %s", dir, strerror(errno));
  struct dirent *e;
  ct_status st = CT_OK;
  while ((e = readdir(d)) && !st) {
    if (e->d_name[0] == '.') continue;
    size_t pl = strlen(dir) + strlen(e->d_name) + 2;
    char *p = malloc(pl);
    if (!p) {
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
      break;
    }
    snprintf(p, pl, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (stat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
      st = list_images(p, out, n, cap, err);
      free(p);
      continue;
    }
    if (!is_image_name(e->d_name)) {
      free(p);
      continue;
    }
    if (*n == *cap) {
      size_t nc = *cap ? *cap * 2 : 256;
      char **np = realloc(*out, nc * sizeof *np);
      if (!np) {
        free(p);
        st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
        break;
      }
      *out = np, *cap = nc;
    }
    (*out)[(*n)++] = p;
  }
  closedir(d);
  return st;
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = malloc(65537);
  size_t r = buf ? fread(buf, 1, 65536, f) : 0;
  fclose(f);
  if (!buf) return NULL;
  buf[r] = 0;
  return buf;
}

/* Caption lines: trimmed, non-empty; at least one (possibly ""). */
static int split_lines(char *text, char ***lines) {
  int n = 0, cap = 4;
  char **l = malloc(cap * sizeof *l);
  if (!l) return -1;
  char *save = NULL;
  for (char *p = strtok_r(text, "\r\n", &save); p; p = strtok_r(NULL, "\r\n", &save)) {
    while (*p == ' ' || *p == '\t') p++;
    size_t len = strlen(p);
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) p[--len] = 0;
    if (!len) continue;
    if (n == cap) {
      cap *= 2;
      char **nl = realloc(l, cap * sizeof *nl);
      if (!nl) break;
      l = nl;
    }
    l[n++] = strdup(p);
  }
  if (n == 0) l[n++] = strdup("");
  *lines = l;
  return n;
}

/* Caption from a file name: stem with '_' and '-' as spaces (SimpleTuner's filename strategy). */
static char *caption_from_name(const char *path) {
  const char *b = strrchr(path, '/');
  b = b ? b + 1 : path;
  char *s = strdup(b);
  if (!s) return NULL;
  char *dot = strrchr(s, '.');
  if (dot) *dot = 0;
  for (char *p = s; *p; p++)
    if (*p == '_' || *p == '-') *p = ' ';
  return s;
}

static ct_status to_square(const ct_image *img, int res, int crop, ct_image *out, ct_err *err) {
  if (!crop) return ct_image_resize(img, res, res, out, err);
  /* Short side to res, then the centre res x res. */
  int w, h;
  if (img->w <= img->h) {
    w = res;
    h = (int)((double)img->h * res / img->w + 0.5);
  } else {
    h = res;
    w = (int)((double)img->w * res / img->h + 0.5);
  }
  if (w < res) w = res;
  if (h < res) h = res;
  ct_image tmp = {0};
  ct_status st = ct_image_resize(img, w, h, &tmp, err);
  if (st) return st;
  st = ct_image_crop(&tmp, (w - res) / 2, (h - res) / 2, res, res, out, err);
  ct_image_free(&tmp);
  return st;
}

static ct_status add_image(ct_dataset *ds, const char *path, const char *strategy,
                           const char *instance_prompt, int crop, long repeats, ct_err *err) {
  ct_image img = {0}, sq = {0};
  ct_err ierr = {0};
  ct_status st = ct_image_load(path, &img, &ierr);
  if (!st) st = to_square(&img, ds->o.resolution, crop, &sq, &ierr);
  ct_image_free(&img);
  if (st) {
    /* Bad images are skipped and counted, never fatal. */
    ds->skipped++;
    if (!ds->first_skipped) ds->first_skipped = strdup(path);
    CT_WARN("skipping %s: %s", path, ierr.msg);
    ct_image_free(&sq);
    return st == CT_ERR_NOMEM ? ct_errf(err, st, "%s", ierr.msg) : CT_OK;
  }
  char **lines = NULL;
  int nlines;
  if (!strcmp(strategy, "textfile")) {
    char tp[4096];
    snprintf(tp, sizeof tp, "%s", path);
    char *dot = strrchr(tp, '.');
    if (dot) strcpy(dot, ".txt");
    char *text = read_text(tp);
    if (!text) {
      ct_image_free(&sq);
      ds->skipped++;
      if (!ds->first_skipped) ds->first_skipped = strdup(path);
      CT_WARN("skipping %s: caption file %s is missing (caption_strategy textfile)", path, tp);
      return CT_OK;
    }
    nlines = split_lines(text, &lines);
    free(text);
  } else if (!strcmp(strategy, "filename")) {
    char *c = caption_from_name(path);
    nlines = split_lines(c, &lines);
    free(c);
  } else {
    char *c = strdup(instance_prompt);
    nlines = split_lines(c, &lines);
    free(c);
  }
  if (nlines < 0) {
    ct_image_free(&sq);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  if (ds->nimages == ds->cap_images) {
    size_t nc = ds->cap_images ? ds->cap_images * 2 : 256;
    float *nl = ct_alloc(CT_MEM_BUFFERS, nc * ds->lat_floats * sizeof(float));
    char ***no = realloc(ds->owned, nc * sizeof *no);
    int *non = realloc(ds->owned_n, nc * sizeof *non);
    if (no) ds->owned = no;
    if (non) ds->owned_n = non;
    if (!nl || !no || !non) {
      ct_free(nl);
      ct_image_free(&sq);
      return ct_errf(err, CT_ERR_NOMEM, "out of memory loading images");
    }
    if (ds->lat) memcpy(nl, ds->lat, ds->nimages * ds->lat_floats * sizeof(float));
    ct_free(ds->lat);
    ds->lat = nl, ds->cap_images = nc;
  }
  size_t li = ds->nimages;
  st = ct_pixel_encode(sq.px, sq.w, sq.h, ds->o.codec_scale, ds->lat + li * ds->lat_floats, err);
  ct_image_free(&sq);
  if (st) return st;
  ds->owned[li] = lines;
  ds->owned_n[li] = nlines;
  ds->nimages++;
  for (long r = 0; r <= repeats; r++) {
    if (ds->n == ds->cap) {
      size_t nc = ds->cap ? ds->cap * 2 : 256;
      sample *ns = realloc(ds->s, nc * sizeof *ns);
      if (!ns) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
      ds->s = ns, ds->cap = nc;
    }
    ds->s[ds->n++] = (sample){li, lines, nlines};
  }
  return CT_OK;
}

static const char *jstr(const ct_json *o, const char *k) {
  const ct_json *v = ct_json_get(o, k);
  return v && v->type == CT_JSON_STRING ? v->str : NULL;
}

static ct_status load_dir(ct_dataset *ds, const char *cfgpath, const char *id, const char *dir,
                          const ct_json *e, ct_err *err);

static ct_status load_entry(ct_dataset *ds, const char *cfgpath, size_t idx, const ct_json *e,
                            ct_err *err) {
  if (e->type != CT_JSON_OBJECT)
    return ct_errf(err, CT_ERR_FORMAT, "%s: entry %zu: expected an object, got %s", cfgpath, idx,
                   ct_json_type_name(e->type));
  for (size_t i = 0; i < e->n; i++) {
    const char *k = e->keys[i];
    if (in_list(k, KNOWN_USED)) continue;
    if (in_list(k, KNOWN_IGNORED)) {
      CT_WARN("%s: entry %zu: key '%s' is not used by this data loader yet; ignored", cfgpath,
                  idx, k);
      continue;
    }
    return ct_errf(err, CT_ERR_INVALID, "%s: entry %zu: unknown key '%s'", cfgpath, idx, k);
  }
  const char *id = jstr(e, "id");
  if (!id || !*id)
    return ct_errf(err, CT_ERR_INVALID, "%s: entry %zu: 'id' (a non-empty string) is required",
                   cfgpath, idx);
  const ct_json *dis = ct_json_get(e, "disabled");
  if (dis && dis->type == CT_JSON_BOOL && dis->boolean) return CT_OK;
  const char *dt = jstr(e, "dataset_type");
  if (dt && strcmp(dt, "image")) {
    if (!strcmp(dt, "text_embeds") || !strcmp(dt, "image_embeds")) return CT_OK; /* caches: in memory here */
    return ct_errf(err, CT_ERR_UNSUPPORTED, "%s: dataset '%s': dataset_type '%s' is not supported",
                   cfgpath, id, dt);
  }
  const char *type = jstr(e, "type");
  if (!type || strcmp(type, "local"))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: dataset '%s': type '%s' is not supported by this loader; use \"local\"",
                   cfgpath, id, type ? type : "(missing)");
  const char *dir0 = jstr(e, "instance_data_dir");
  if (!dir0)
    return ct_errf(err, CT_ERR_INVALID, "%s: dataset '%s': 'instance_data_dir' is required",
                   cfgpath, id);
  char *dir = NULL; /* {env:VAR} expanded, as SimpleTuner does in this file */
  ct_status st = ct_config_expand_env(dir0, &dir, err);
  if (st) {
    ct_err_prefix(err, "%s: dataset '%s': instance_data_dir: ", cfgpath, id);
    return st;
  }
  st = load_dir(ds, cfgpath, id, dir, e, err);
  free(dir);
  return st;
}

static ct_status load_dir(ct_dataset *ds, const char *cfgpath, const char *id, const char *dir,
                          const ct_json *e, ct_err *err) {
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return ct_errf(err, CT_ERR_NOT_FOUND,
                   "%s: dataset '%s': instance_data_dir '%s' is not a directory (%s)", cfgpath, id,
                   dir, stat(dir, &sb) ? strerror(errno) : "not a directory");
  const char *strategy = jstr(e, "caption_strategy");
  if (!strategy) strategy = "filename"; /* SimpleTuner's default */
  const char *ip = jstr(e, "instance_prompt");
  if (strcmp(strategy, "textfile") && strcmp(strategy, "filename") &&
      strcmp(strategy, "instanceprompt"))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: dataset '%s': caption_strategy '%s' is not supported (textfile, filename, "
                   "instanceprompt)",
                   cfgpath, id, strategy);
  if (!strcmp(strategy, "instanceprompt") && !ip)
    return ct_errf(err, CT_ERR_INVALID,
                   "%s: dataset '%s': caption_strategy instanceprompt needs 'instance_prompt'",
                   cfgpath, id);
  const ct_json *res = ct_json_get(e, "resolution");
  if (res && !(res->type == CT_JSON_NUMBER && res->num == ds->o.resolution))
    CT_WARN("%s: dataset '%s': per-dataset resolution is not supported yet; using %d", cfgpath,
                id, ds->o.resolution);
  const ct_json *crop = ct_json_get(e, "crop");
  if (crop && crop->type != CT_JSON_BOOL)
    return ct_errf(err, CT_ERR_INVALID, "%s: dataset '%s': 'crop' must be true or false", cfgpath, id);
  const char *cs = jstr(e, "crop_style");
  if (cs && strcmp(cs, "center") && strcmp(cs, "centre"))
    CT_WARN("%s: dataset '%s': crop_style '%s' is not supported yet; using center", cfgpath, id, cs);
  long repeats = 0, maxn = -1;
  const ct_json *rp = ct_json_get(e, "repeats");
  if (rp) {
    if (rp->type != CT_JSON_NUMBER || !rp->is_int || rp->i64 < 0 || rp->i64 > 100000)
      return ct_errf(err, CT_ERR_INVALID, "%s: dataset '%s': 'repeats' must be an integer >= 0",
                     cfgpath, id);
    repeats = (long)rp->i64;
  }
  const ct_json *mx = ct_json_get(e, "max_num_samples");
  if (mx) {
    if (mx->type != CT_JSON_NUMBER || !mx->is_int || mx->i64 < 1)
      return ct_errf(err, CT_ERR_INVALID,
                     "%s: dataset '%s': 'max_num_samples' must be an integer >= 1", cfgpath, id);
    maxn = (long)mx->i64;
  }
  char **paths = NULL;
  size_t np = 0, cap = 0;
  ct_status st = list_images(dir, &paths, &np, &cap, err);
  if (!st) {
    qsort(paths, np, sizeof *paths, cmp_str);
    if (np == 0)
      st = ct_errf(err, CT_ERR_NOT_FOUND,
                   "%s: dataset '%s': no .png/.jpg/.jpeg images in %s", cfgpath, id, dir);
  }
  size_t before = ds->nimages;
  for (size_t i = 0; i < np && !st; i++) {
    if (maxn >= 0 && (long)(ds->nimages - before) >= maxn) break;
    st = add_image(ds, paths[i], strategy, ip ? ip : "", crop && crop->boolean, repeats, err);
  }
  for (size_t i = 0; i < np; i++) free(paths[i]);
  free(paths);
  if (!st)
    CT_INFO("dataset '%s': %zu images from %s (%zu skipped so far)", id,
                ds->nimages - before, dir, ds->skipped);
  return st;
}

ct_status ct_dataset_open(const char *path, const ct_data_opts *o, ct_dataset **out, ct_err *err) {
  *out = NULL;
  if (o->resolution <= 0 || o->resolution % (o->codec_scale * 2))
    return ct_errf(err, CT_ERR_INVALID,
                   "resolution %d must be a positive multiple of %d (codec scale %d x patch 2)",
                   o->resolution, o->codec_scale * 2, o->codec_scale);
  FILE *f = fopen(path, "rb");
  if (!f)
    return ct_errf(err, CT_ERR_IO, "data_backend_config %s: cannot open: %s", path, strerror(errno));
  char *text = malloc(1 << 20);
  size_t len = text ? fread(text, 1, (1 << 20) - 1, f) : 0;
  fclose(f);
  if (!text) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_json *j = NULL;
  ct_status st = ct_json_parse(text, len, &j, err);
  free(text);
  if (st) {
    ct_err_prefix(err, "%s: ", path);
    return st;
  }
  if (j->type != CT_JSON_ARRAY) {
    ct_json_free(j);
    return ct_errf(err, CT_ERR_FORMAT, "%s: expected a JSON array of datasets, got %s", path,
                   ct_json_type_name(j->type));
  }
  ct_dataset *ds = calloc(1, sizeof *ds);
  if (!ds) {
    ct_json_free(j);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  ds->o = *o;
  ds->C = ct_pixel_channels(o->codec_scale);
  ds->side = o->resolution / o->codec_scale;
  ds->lat_floats = (size_t)ds->C * ds->side * ds->side;
  ds->perm_epoch = -1;
  for (size_t i = 0; i < j->n && !st; i++) st = load_entry(ds, path, i, &j->items[i], err);
  ct_json_free(j);
  if (!st && ds->n == 0)
    st = ct_errf(err, CT_ERR_NOT_FOUND, "%s: no usable images (%zu skipped%s%s)", path,
                 ds->skipped, ds->first_skipped ? ", first: " : "",
                 ds->first_skipped ? ds->first_skipped : "");
  if (st) {
    ct_dataset_free(ds);
    return st;
  }
  *out = ds;
  return CT_OK;
}

void ct_dataset_free(ct_dataset *ds) {
  if (!ds) return;
  for (size_t i = 0; i < ds->nimages; i++) {
    for (int k = 0; k < ds->owned_n[i]; k++) free(ds->owned[i][k]);
    free(ds->owned[i]);
  }
  free(ds->owned);
  free(ds->owned_n);
  ct_free(ds->lat);
  free(ds->s);
  free(ds->perm);
  free(ds->first_skipped);
  free(ds);
}

size_t ct_dataset_count(const ct_dataset *ds) { return ds->n; }
int ct_dataset_channels(const ct_dataset *ds) { return ds->C; }
int ct_dataset_latent_side(const ct_dataset *ds) { return ds->side; }
const float *ct_dataset_latent(const ct_dataset *ds, size_t i) {
  return ds->lat + ds->s[i].latent * ds->lat_floats;
}
const char *ct_dataset_caption(const ct_dataset *ds, size_t i, uint64_t pick) {
  return ds->s[i].lines[pick % (uint64_t)ds->s[i].nlines];
}
size_t ct_dataset_longest_caption(const ct_dataset *ds, size_t (*measure)(const char *, void *), void *ctx,
                                  size_t limit, size_t *n_over) {
  size_t longest = 0, over = 0;
  for (size_t i = 0; i < ds->n; i++)
    for (int k = 0; k < ds->s[i].nlines; k++) {
      const char *c = ds->s[i].lines[k];
      size_t l = measure ? measure(c, ctx) : strlen(c);
      if (l > longest) longest = l;
      over += l > limit;
    }
  if (n_over) *n_over = over;
  return longest;
}
size_t ct_dataset_skipped(const ct_dataset *ds, const char **first) {
  if (first) *first = ds->first_skipped;
  return ds->skipped;
}

/* Stream of the epoch permutation draws (distinct from the trainer's streams). */
#define PERM_STREAM 0x5045524d00000000ull

size_t ct_dataset_order(ct_dataset *ds, long epoch, size_t pos) {
  if (ds->perm_epoch != epoch) {
    if (!ds->perm) ds->perm = malloc(ds->n * sizeof *ds->perm);
    CT_ASSERT(ds->perm);
    for (size_t i = 0; i < ds->n; i++) ds->perm[i] = i;
    /* Fisher–Yates with Philox draws indexed by position: reproducible. */
    for (size_t i = ds->n; i > 1; i--) {
      uint32_t r[4];
      ct_philox4x32(ds->o.seed, PERM_STREAM + (uint64_t)epoch, i, r);
      uint64_t x = ((uint64_t)r[0] << 32) | r[1];
      size_t k = (size_t)(x % i);
      size_t t = ds->perm[i - 1];
      ds->perm[i - 1] = ds->perm[k];
      ds->perm[k] = t;
    }
    ds->perm_epoch = epoch;
  }
  return ds->perm[pos % ds->n];
}

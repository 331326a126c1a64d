/* backend.c: multidatabackend.json -> ct_backend.
 *
 * A JSON array of dataset objects with SimpleTuner's keys (docs/data.md). One table lists every key
 * ctuner reads; SimpleTuner keys it does not use are accepted with one warning each; anything else
 * is an error naming the dataset id, the key and the nearest known key. String values may hold
 * {env:VAR}. Cross-key rules (instanceprompt needs instance_prompt, parquet needs a parquet block,
 * one default text_embeds dataset, references to existing cache datasets, unique ids) are checked
 * here so that a bad file fails before any image is read.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/data.h"
#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/parse.h"
#include "ctuner/storage.h"

/* SimpleTuner keys ctuner accepts but does not act on (they change nothing
 * here: discovery and cache bookkeeping). */
static const char *const IGNORED[] = {"skip_file_discovery", "hash_filenames", "scan_for_errors",
                                      "disable_multiline_split", NULL};
/* SimpleTuner keys that change the training data when set (true, a
 * non-empty string or list): refused then, with why; ignored when off. */
static const struct {
  const char *key, *why;
} WHEN_SET[] = {
    {"vae_cache_clear_each_epoch",
     "re-encoding the latents every epoch for new random crops is not implemented; the latent "
     "cache is built once (set crop_style center, or crop false)"},
    {"prepend_instance_prompt", "prepending instance_prompt to every caption is not implemented"},
    {"only_instance_prompt", "use caption_strategy \"instanceprompt\", which does the same"},
    {"caption_filter_list", "caption filter lists are not implemented"},
};

/* A value that turns an option on: true, a non-zero number, a non-empty
 * string, array or object. */
static int is_set(const ct_json *v) {
  switch (v->type) {
    case CT_JSON_BOOL:
      return v->boolean;
    case CT_JSON_NUMBER:
      return v->num != 0;
    case CT_JSON_STRING:
      return v->str && *v->str;
    case CT_JSON_ARRAY:
    case CT_JSON_OBJECT:
      return v->n > 0;
    default:
      return 0;
  }
}
/* SimpleTuner keys of features ctuner does not have: refused with why. */
static const struct {
  const char *key, *why;
} REFUSED[] = {
    {"conditioning", "generated conditioning datasets (ControlNet) are not implemented"},
    {"dataset_name", "Hugging Face datasets (type \"huggingface\") are not supported"},
    {"csv_file", "CSV URL lists (type \"csv\") are not supported"},
};
static const char *const KNOWN[] = {
    "id", "type", "dataset_type", "disabled", "instance_data_dir", "caption_strategy",
    "instance_prompt", "metadata_backend", "parquet", "resolution", "resolution_type",
    "minimum_image_size", "maximum_image_size", "target_downsample_size", "minimum_aspect_ratio",
    "maximum_aspect_ratio", "crop", "crop_style", "crop_aspect", "crop_aspect_buckets", "repeats",
    "probability", "max_num_samples", "cache_dir_vae", "text_embeds", "image_embeds",
    "vae_cache_disable", "preserve_data_backend_cache", "compress_cache", "default", "cache_dir",
    "write_batch_size", "ignore_epochs", "is_regularisation_data", "is_regularization_data",
    "conditioning_data", "conditioning_type", "source_dataset_id",
    /* type "aws" (AWS_KEYS) */
    "aws_bucket_name", "aws_region_name", "aws_endpoint_url", "aws_access_key_id",
    "aws_secret_access_key", "aws_session_token", "aws_data_prefix", "aws_max_pool_connections",
    "aws_addressing_style", "aws_max_retries", "aws_request_timeout", NULL};
static const char *const PARQUET_KEYS[] = {"path",
                                           "filename_column",
                                           "caption_column",
                                           "fallback_caption_column",
                                           "width_column",
                                           "height_column",
                                           "identifier_includes_extension",
                                           NULL};

static int in_list(const char *k, const char *const *l) {
  for (; *l; l++)
    if (!strcmp(k, *l)) return 1;
  return 0;
}

/* Levenshtein distance, bounded strings. */
static int edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 63 || lb > 63) return 99;
  int d[64][64];
  for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
      d[i][j] = c;
    }
  return d[la][lb];
}

static const char *suggest(const char *k, const char *const *l) {
  const char *best = NULL;
  int bd = 4;
  for (; *l; l++) {
    int dd = edit_distance(k, *l);
    if (dd < bd) bd = dd, best = *l;
  }
  return best;
}

typedef struct ctx {
  const char *file;
  char where[160]; /* "dataset 'id'" or "entry 3" */
  ct_err *err;
  const ct_backend_vars *vars; /* {model_family}, {output_dir}; NULL: the defaults */
  const char *id;              /* {id}: the dataset's */
  const ct_json *obj;          /* the dataset's object, for positions */
  int line, col;               /* where the last error is (0: unknown) */
  char key[64];                /* the key of the last error */
  ct_config_problems *probs;   /* NULL: stop at the first problem */
  int noted;                   /* the failing dataset's problems are already in probs */
} ctx;

static void note(ctx *c, ct_config_problems *probs, const char *name);

/* Where key sits in the dataset's object, for the problem list. */
static void at_key(ctx *c, const char *key) {
  const ct_json *v = c->obj ? ct_json_get(c->obj, key) : NULL;
  snprintf(c->key, sizeof c->key, "%s", key ? key : "");
  c->line = v ? v->line : c->obj ? c->obj->line : 0;
  c->col = v ? v->col : c->obj ? c->obj->col : 0;
}

/* SimpleTuner's placeholders in a string value (fill_variables_in_config_paths
 * in its data backend factory): {model_family}, {output_dir} and {id} (the
 * dataset's), replaced wherever they occur. NULL on allocation failure. */
static char *fill_placeholders(const ctx *c, char *s) {
  const char *names[3] = {"{model_family}", "{output_dir}", "{id}"};
  const char *vals[3] = {c->vars && c->vars->model_family ? c->vars->model_family : "flux",
                         c->vars && c->vars->output_dir ? c->vars->output_dir : "output",
                         c->id ? c->id : ""};
  for (int k = 0; k < 3 && s; k++) {
    const size_t nl = strlen(names[k]), vl = strlen(vals[k]);
    for (char *hit = strstr(s, names[k]); hit; hit = strstr(s, names[k])) {
      const size_t off = (size_t)(hit - s), len = strlen(s);
      char *r = malloc(len - nl + vl + 1);
      if (!r) {
        free(s);
        return NULL;
      }
      memcpy(r, s, off);
      memcpy(r + off, vals[k], vl);
      memcpy(r + off + vl, hit + nl, len - off - nl + 1);
      free(s);
      s = r;
      if (vl >= nl && strstr(vals[k], names[k])) break; /* a value naming itself */
    }
  }
  return s;
}

static ct_status bad(ctx *c, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ct_status bad(ctx *c, const char *key, const char *fmt, ...) {
  char msg[700];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  at_key(c, key);
  return ct_errf(c->err, CT_ERR_INVALID, "%s: %s: key '%s': %s", c->file, c->where, key, msg);
}

static ct_status get_str(ctx *c, const ct_json *o, const char *key, char **out) {
  const ct_json *v = ct_json_get(o, key);
  if (!v || v->type == CT_JSON_NULL) return CT_OK;
  if (v->type != CT_JSON_STRING)
    return bad(c, key, "expected a string, got %s", ct_json_type_name(v->type));
  free(*out);
  *out = NULL;
  ct_status st = ct_expand_env(v->str, NULL, out, c->err);
  if (!st && !(*out = fill_placeholders(c, *out)))
    st = ct_errf(c->err, CT_ERR_NOMEM, "out of memory");
  if (st) {
    at_key(c, key);
    ct_err_prefix(c->err, "%s: %s: key '%s': ", c->file, c->where, key);
  }
  return st;
}

static ct_status get_bool(ctx *c, const ct_json *o, const char *key, int *out) {
  const ct_json *v = ct_json_get(o, key);
  if (!v || v->type == CT_JSON_NULL) return CT_OK;
  if (v->type == CT_JSON_BOOL) {
    *out = v->boolean;
    return CT_OK;
  }
  if (v->type == CT_JSON_STRING && (!strcmp(v->str, "true") || !strcmp(v->str, "false"))) {
    *out = !strcmp(v->str, "true");
    return CT_OK;
  }
  return bad(c, key, "expected true or false, got %s", ct_json_type_name(v->type));
}

static ct_status get_num(ctx *c, const ct_json *o, const char *key, double lo, double hi,
                         double *out) {
  const ct_json *v = ct_json_get(o, key);
  if (!v || v->type == CT_JSON_NULL) return CT_OK;
  double x;
  if (v->type == CT_JSON_NUMBER) {
    x = v->num;
  } else if (v->type == CT_JSON_STRING) { /* "{env:RES}" */
    char *s = NULL, *end;
    ct_status st = get_str(c, o, key, &s);
    if (st) return st;
    errno = 0;
    x = strtod(s, &end);
    int ok = end != s && !*end && !errno;
    free(s);
    if (!ok) return bad(c, key, "expected a number, got \"%s\"", v->str);
  } else {
    return bad(c, key, "expected a number, got %s", ct_json_type_name(v->type));
  }
  if (!(x >= lo && x <= hi)) return bad(c, key, "%g is out of range [%g, %g]", x, lo, hi);
  *out = x;
  return CT_OK;
}

static ct_status get_int(ctx *c, const ct_json *o, const char *key, long lo, long hi, long *out) {
  double x = (double)*out;
  ct_status st = get_num(c, o, key, (double)lo, (double)hi, &x);
  if (st) return st;
  if (x != floor(x)) return bad(c, key, "expected an integer, got %g", x);
  *out = (long)x;
  return CT_OK;
}

/* A string that must be one of names[]; *out gets its index (aliases map via map[]). */
static ct_status get_enum(ctx *c, const ct_json *o, const char *key, const char *const *names,
                          const int *map, int *out) {
  char *s = NULL;
  ct_status st = get_str(c, o, key, &s);
  if (st || !s) return st;
  int found = -1;
  char list[300] = "";
  for (int i = 0; names[i]; i++) {
    if (!strcmp(s, names[i])) found = map ? map[i] : i;
    if (strlen(list) + strlen(names[i]) + 4 < sizeof list) {
      if (list[0]) strcat(list, ", ");
      strcat(list, names[i]);
    }
  }
  if (found < 0) st = bad(c, key, "\"%s\" is not one of: %s", s, list);
  free(s);
  if (!st) *out = found;
  return st;
}

static void ds_free(ct_ds_config *d) {
  free(d->id);
  free(d->type);
  free(d->instance_data_dir);
  free(d->instance_prompt);
  free(d->parquet.path);
  free(d->parquet.filename_column);
  free(d->parquet.caption_column);
  free(d->parquet.fallback_caption_column);
  free(d->parquet.width_column);
  free(d->parquet.height_column);
  free(d->crop_aspect_buckets);
  free(d->crop_aspect_weights);
  free(d->cache_dir_vae);
  free(d->text_embeds);
  free(d->image_embeds);
  free(d->cache_dir);
  free(d->conditioning_data);
  free(d->source_dataset_id);
  ct_ds_s3 *a = &d->s3;
  free(a->bucket), free(a->region), free(a->endpoint), free(a->access_key), free(a->prefix);
  ct_free_secret(a->secret_key), ct_free_secret(a->session_token);
}

static char *dup(const char *s) {
  char *r = strdup(s);
  if (!r) abort(); /* a few bytes at start-up; not worth a status path */
  return r;
}

static ct_status parse_aspects(ctx *c, const ct_json *o, ct_ds_config *d) {
  const ct_json *v = ct_json_get(o, "crop_aspect_buckets");
  if (!v || v->type == CT_JSON_NULL) return CT_OK;
  if (v->type != CT_JSON_ARRAY || v->n == 0 || v->n > 256)
    return bad(c, "crop_aspect_buckets",
               "expected a list of 1 to 256 aspect ratios (floats, or "
               "{\"aspect\": a, \"weight\": w} objects)");
  d->crop_aspect_buckets = calloc(v->n, sizeof(double));
  d->crop_aspect_weights = calloc(v->n, sizeof(double));
  if (!d->crop_aspect_buckets || !d->crop_aspect_weights)
    return ct_errf(c->err, CT_ERR_NOMEM, "out of memory");
  d->n_crop_aspect_buckets = (int)v->n;
  int weighted = -1;
  double wsum = 0;
  for (size_t i = 0; i < v->n; i++) {
    const ct_json *e = &v->items[i];
    double a, w = 1.0 / (double)v->n;
    int is_obj = e->type == CT_JSON_OBJECT;
    if (weighted >= 0 && weighted != is_obj)
      return bad(c, "crop_aspect_buckets",
                 "mixes plain numbers and {aspect, weight} objects; use one form");
    weighted = is_obj;
    if (is_obj) {
      const ct_json *ja = ct_json_get(e, "aspect"), *jw = ct_json_get(e, "weight");
      if (!ja || ja->type != CT_JSON_NUMBER || !jw || jw->type != CT_JSON_NUMBER)
        return bad(c, "crop_aspect_buckets",
                   "item %zu: an object needs numbers 'aspect' and 'weight'", i);
      a = ja->num;
      w = jw->num;
    } else if (e->type == CT_JSON_NUMBER) {
      a = e->num;
    } else {
      return bad(c, "crop_aspect_buckets", "item %zu: expected a number or an object, got %s", i,
                 ct_json_type_name(e->type));
    }
    if (!(a > 0.05 && a < 20))
      return bad(c, "crop_aspect_buckets", "item %zu: aspect %g is not in (0.05, 20)", i, a);
    if (!(w > 0))
      return bad(c, "crop_aspect_buckets", "item %zu: weight %g must be positive", i, w);
    d->crop_aspect_buckets[i] = a;
    d->crop_aspect_weights[i] = w;
    wsum += w;
  }
  if (weighted == 1 && fabs(wsum - 1.0) > 1e-6)
    return bad(c, "crop_aspect_buckets", "the weights sum to %g; they must sum to 1", wsum);
  return CT_OK;
}

static ct_status parse_parquet(ctx *c, const ct_json *o, ct_ds_config *d) {
  const ct_json *p = ct_json_get(o, "parquet");
  ct_ds_parquet *q = &d->parquet;
  q->filename_column = dup("filename");
  q->caption_column = dup("caption");
  q->width_column = dup("width");
  q->height_column = dup("height");
  if (!p || p->type == CT_JSON_NULL) return CT_OK;
  if (p->type != CT_JSON_OBJECT)
    return bad(c, "parquet", "expected an object, got %s", ct_json_type_name(p->type));
  for (size_t i = 0; i < p->n; i++)
    if (!in_list(p->keys[i], PARQUET_KEYS)) {
      const char *s = suggest(p->keys[i], PARQUET_KEYS);
      return bad(c, "parquet", "unknown key '%s'%s%s%s", p->keys[i], s ? "; did you mean '" : "",
                 s ? s : "", s ? "'?" : "");
    }
  snprintf(c->where + strlen(c->where), sizeof c->where - strlen(c->where), ": parquet");
  ct_status st = get_str(c, p, "path", &q->path);
  if (!st) st = get_str(c, p, "filename_column", &q->filename_column);
  if (!st) st = get_str(c, p, "caption_column", &q->caption_column);
  if (!st) st = get_str(c, p, "fallback_caption_column", &q->fallback_caption_column);
  if (!st) st = get_str(c, p, "width_column", &q->width_column);
  if (!st) st = get_str(c, p, "height_column", &q->height_column);
  if (!st) st = get_bool(c, p, "identifier_includes_extension", &q->identifier_includes_extension);
  *strrchr(c->where, ':') = '\0';
  return st;
}

/* A secret string (aws_secret_access_key, aws_session_token): as get_str, but
 * no message ever quotes the value. */
static ct_status get_secret(ctx *c, const ct_json *o, const char *key, char **out) {
  const ct_json *v = ct_json_get(o, key);
  if (!v || v->type == CT_JSON_NULL) return CT_OK;
  if (v->type != CT_JSON_STRING)
    return bad(c, key, "expected a string, got %s", ct_json_type_name(v->type));
  ct_err e = {0};
  char *s = NULL;
  if (ct_expand_env(v->str, NULL, &s, &e) == CT_OK) {
    free(*out);
    *out = s;
    return CT_OK;
  }
  const char *p = strstr(v->str, "{env:"), *q = p ? strchr(p + 5, '}') : NULL;
  if (p && q && q - p - 5 > 0 && q - p - 5 < 200 && strstr(e.msg, "is not set"))
    return bad(c, key, "the environment variable %.*s is not set", (int)(q - p - 5), p + 5);
  return bad(c, key, "holds a bad {env:VAR} reference (the value is not shown: it is a secret)");
}

/* A key prefix (aws_data_prefix, and with type "aws" instance_data_dir,
 * cache_dir_vae, cache_dir): leading "/" and "./" and trailing "/" dropped;
 * no empty, "." or ".." segments. */
static ct_status norm_keydir(ctx *c, const char *key, char *s) {
  if (!s) return CT_OK;
  char *p = s;
  for (;;) {
    if (*p == '/')
      p++;
    else if (p[0] == '.' && p[1] == '/')
      p += 2;
    else
      break;
  }
  if (!strcmp(p, ".")) p++;
  memmove(s, p, strlen(p) + 1);
  size_t n = strlen(s);
  while (n && s[n - 1] == '/') s[--n] = 0;
  for (const char *t = s; *t;) {
    const char *e = strchr(t, '/');
    size_t l = e ? (size_t)(e - t) : strlen(t);
    if (l == 0 || (l == 1 && t[0] == '.') || (l == 2 && t[0] == '.' && t[1] == '.'))
      return bad(
          c, key,
          "\"%s\" is not a usable S3 key prefix ('/'-separated, no empty, '.' or '..' parts)", s);
    t += l + (e != NULL);
  }
  return CT_OK;
}

static const char *const AWS_KEYS[] = {
    "aws_bucket_name",       "aws_region_name",   "aws_endpoint_url",    "aws_access_key_id",
    "aws_secret_access_key", "aws_session_token", "aws_data_prefix",     "aws_max_pool_connections",
    "aws_addressing_style",  "aws_max_retries",   "aws_request_timeout", NULL};

static ct_status parse_aws(ctx *c, const ct_json *o, ct_ds_config *d) {
  static const char *const ADDR[] = {"auto", "path", "virtual", NULL};
  ct_ds_s3 *a = &d->s3;
  a->max_pool_connections = 128;
  a->max_retries = 6;
  a->request_timeout = 60;
  a->addressing = CT_S3_ADDR_AUTO;
  if (!d->is_aws) {
    for (size_t i = 0; i < o->n; i++)
      if (in_list(o->keys[i], AWS_KEYS))
        return bad(c, o->keys[i], "S3 settings need \"type\": \"aws\" (this dataset is \"%s\")",
                   d->type);
    return CT_OK;
  }
  ct_status st;
  int v = CT_S3_ADDR_AUTO;
  if ((st = get_str(c, o, "aws_bucket_name", &a->bucket))) return st;
  if ((st = get_str(c, o, "aws_region_name", &a->region))) return st;
  if ((st = get_str(c, o, "aws_endpoint_url", &a->endpoint))) return st;
  if ((st = get_str(c, o, "aws_access_key_id", &a->access_key))) return st;
  if ((st = get_secret(c, o, "aws_secret_access_key", &a->secret_key))) return st;
  if ((st = get_secret(c, o, "aws_session_token", &a->session_token))) return st;
  if ((st = get_str(c, o, "aws_data_prefix", &a->prefix))) return st;
  if ((st = get_int(c, o, "aws_max_pool_connections", 1, 1024, &a->max_pool_connections)))
    return st;
  if ((st = get_enum(c, o, "aws_addressing_style", ADDR, NULL, &v))) return st;
  a->addressing = (ct_s3_addressing)v;
  if ((st = get_int(c, o, "aws_max_retries", 0, 20, &a->max_retries))) return st;
  if ((st = get_num(c, o, "aws_request_timeout", 0, 86400, &a->request_timeout))) return st;
  if (!(a->request_timeout > 0))
    return bad(c, "aws_request_timeout", "must be more than 0 seconds");
  if (!a->bucket || !a->bucket[0])
    return bad(c, "aws_bucket_name",
               "is required with \"type\": \"aws\" (the bucket that holds the dataset)");
  if (strchr(a->bucket, '/'))
    return bad(c, "aws_bucket_name",
               "\"%s\" holds a '/'; put the path inside the bucket in aws_data_prefix", a->bucket);
  if (a->endpoint && a->endpoint[0] && strncmp(a->endpoint, "http://", 7) &&
      strncmp(a->endpoint, "https://", 8))
    return bad(c, "aws_endpoint_url", "\"%s\" must start with http:// or https://", a->endpoint);
  if (!a->prefix) a->prefix = dup("");
  if ((st = norm_keydir(c, "aws_data_prefix", a->prefix))) return st;
  if ((st = norm_keydir(c, "instance_data_dir", d->instance_data_dir))) return st;
  if ((st = norm_keydir(c, "cache_dir_vae", d->cache_dir_vae))) return st;
  if ((st = norm_keydir(c, "cache_dir", d->cache_dir))) return st;
  if (d->kind == CT_DS_IMAGE && !d->instance_data_dir) d->instance_data_dir = dup("");
  return CT_OK;
}

/* Does the dataset crop at random (crop true, crop_style random, SimpleTuner's
 * default style)? */
static int random_crops(const ct_json *o) {
  const ct_json *crop = ct_json_get(o, "crop"), *style = ct_json_get(o, "crop_style");
  if (!crop || crop->type != CT_JSON_BOOL || !crop->boolean) return 0;
  return !style || (style->type == CT_JSON_STRING && !strcmp(style->str, "random"));
}

/* One warning for a SimpleTuner key that has no effect here. */
static void warn_ignored(ctx *c, const char *k, const ct_json *v) {
  if (c->probs)
    ct_config_problems_add(c->probs, 1, CT_OK, CT_ORIGIN_FILE, c->file, v->line, v->col, k, NULL,
                           "%s: key '%s' is a SimpleTuner option ctuner does not use; ignored",
                           c->where, k);
  else
    CT_WARN("%s: %s: key '%s' is a SimpleTuner option ctuner does not use; ignored", c->file,
            c->where, k);
}

/* A dataset's values before its keys are read: SimpleTuner's defaults, and
 * the run's resolution_type / minimum_image_size (args.resolution_type,
 * "pixel_area"; args.minimum_image_size) for a dataset that leaves them out. */
static void set_defaults(const ctx *c, ct_ds_config *d) {
  d->kind = CT_DS_IMAGE;
  d->caption_strategy = CT_CAP_FILENAME;
  d->crop_style = CT_CROP_RANDOM;
  d->crop_aspect = CT_ASPECT_SQUARE;
  const char *rt = c->vars && c->vars->resolution_type ? c->vars->resolution_type : "pixel_area";
  d->resolution_type = !strcmp(rt, "pixel")  ? CT_RES_PIXEL
                       : !strcmp(rt, "area") ? CT_RES_AREA
                                             : CT_RES_PIXEL_AREA;
  d->minimum_image_size = c->vars ? c->vars->minimum_image_size : 0;
  d->probability = 1.0;
  d->write_batch_size = 128;
}

/* The values a dataset's enumerated keys take. */
static const char *const KINDS[] = {"image", "text_embeds", "image_embeds", "conditioning", NULL};
static const char *const CONDS[] = {"reference_strict", "reference_loose", "controlnet", "mask",
                                    NULL};
static const char *const CAPS[] = {"textfile", "filename", "instanceprompt", "parquet", NULL};
static const char *const METAS[] = {"discovery", "parquet", "json", NULL};
static const int META_MAP[] = {CT_META_DISCOVERY, CT_META_PARQUET, CT_META_DISCOVERY};
static const char *const RES[] = {"pixel", "area", "pixel_area", NULL};
static const char *const STYLES[] = {"random", "center", "centre", "corner", NULL};
static const int STYLE_MAP[] = {CT_CROP_RANDOM, CT_CROP_CENTER, CT_CROP_CENTER, CT_CROP_CORNER};
static const char *const ASPECTS[] = {"square", "preserve", "closest", "random", NULL};

/* Every key of the dataset o known, or refused by name / warned as SimpleTuner's
 * with no effect here; with c->probs each unknown key is listed at its place. */
static ct_status check_keys(ctx *c, const ct_json *o) {
  ct_status st = CT_OK;
  /* a storage type ctuner has not is the problem, not the keys that come with it */
  const ct_json *ty = ct_json_get(o, "type");
  if (ty && ty->type == CT_JSON_STRING && strcmp(ty->str, "local") && strcmp(ty->str, "aws"))
    return bad(c, "type", "\"%s\" is not supported; use \"local\" or \"aws\" (S3)", ty->str);
  int unknown = 0;
  ct_err first = {0};
  for (size_t i = 0; i < o->n; i++) {
    const char *k = o->keys[i];
    if (in_list(k, KNOWN)) continue;
    if (in_list(k, IGNORED)) {
      warn_ignored(c, k, &o->items[i]);
      continue;
    }
    /* only_instance_prompt on an instanceprompt dataset changes nothing: SimpleTuner's factory
     * (helpers/data_backend/factory.py, _create_dataset_and_sampler) turns captions off for
     * either, and instanceprompt already has */
    const ct_json *cs = ct_json_get(o, "caption_strategy");
    if (!strcmp(k, "only_instance_prompt") && cs && cs->type == CT_JSON_STRING &&
        !strcmp(cs->str, "instanceprompt"))
      continue;
    const char *why = NULL;
    int off = 0; /* a WHEN_SET key that is off: a warning, as IGNORED */
    for (size_t r = 0; r < sizeof WHEN_SET / sizeof WHEN_SET[0] && !why && !off; r++)
      if (!strcmp(k, WHEN_SET[r].key)) {
        /* re-encoding each epoch changes nothing unless the crops are random */
        const int moot = !strcmp(k, "vae_cache_clear_each_epoch") && !random_crops(o);
        if (is_set(&o->items[i]) && !moot)
          why = WHEN_SET[r].why;
        else
          off = 1;
      }
    if (off) {
      warn_ignored(c, k, &o->items[i]);
      continue;
    }
    for (size_t r = 0; r < sizeof REFUSED / sizeof REFUSED[0] && !why; r++)
      if (!strcmp(k, REFUSED[r].key)) why = REFUSED[r].why;
    const char *s = why ? NULL : suggest(k, KNOWN);
    at_key(c, k);
    if (why)
      st = ct_errf(c->err, CT_ERR_UNSUPPORTED, "%s: %s: key '%s': %s", c->file, c->where, k, why);
    else
      st = ct_errf(c->err, CT_ERR_INVALID, "%s: %s: unknown key '%s'%s%s%s", c->file, c->where, k,
                   s ? "; did you mean '" : "", s ? s : "", s ? "'?" : "");
    if (!c->probs) return st;
    note(c, c->probs, c->file); /* every unknown key of the dataset, each at its place */
    if (!unknown++) first = *c->err;
  }
  if (unknown) {
    c->noted = 1;    /* already in the list */
    *c->err = first; /* err keeps the first */
    return first.status;
  }
  return CT_OK;
}

/* conditioning_data (an id, or a list of one id), conditioning_type and
 * source_dataset_id. */
static ct_status read_conditioning(ctx *c, const ct_json *o, ct_ds_config *d) {
  const ct_json *cd = ct_json_get(o, "conditioning_data");
  ct_status st;
  if (cd && cd->type == CT_JSON_ARRAY) {
    if (cd->n != 1 || cd->items[0].type != CT_JSON_STRING)
      return bad(c, "conditioning_data",
                 "a list of %zu conditioning datasets: several per image dataset (SimpleTuner "
                 "draws one per sample or stitches them) are not implemented; name one id",
                 cd->n);
    free(d->conditioning_data);
    d->conditioning_data = dup(cd->items[0].str);
  } else if ((st = get_str(c, o, "conditioning_data", &d->conditioning_data))) {
    return st;
  }
  if (d->conditioning_data && !d->conditioning_data[0]) { /* "": none, as SimpleTuner's */
    free(d->conditioning_data);
    d->conditioning_data = NULL;
  }
  if ((st = get_str(c, o, "source_dataset_id", &d->source_dataset_id))) return st;
  int v = -1;
  if ((st = get_enum(c, o, "conditioning_type", CONDS, NULL, &v))) return st;
  if (v >= 2)
    return bad(c, "conditioning_type",
               "\"%s\": conditioning datasets of this type (ControlNet, masks) are not "
               "implemented; reference_strict "
               "and reference_loose (FLUX.1 Kontext's references) are",
               CONDS[v]);
  d->conditioning_type = v < 0 ? CT_COND_NONE
                         : v   ? CT_COND_REFERENCE_LOOSE
                               : CT_COND_REFERENCE_STRICT;
  /* SimpleTuner's factory: a dataset with a conditioning_type is a conditioning dataset
   * (backend["dataset_type"] = "conditioning"), whatever its dataset_type said */
  if (d->conditioning_type != CT_COND_NONE) d->kind = CT_DS_CONDITIONING;
  return CT_OK;
}

/* The dataset's values into d (defaults first). */
static ct_status read_fields(ctx *c, const ct_json *o, ct_ds_config *d) {
  ct_status st;
  set_defaults(c, d);
  int v;
  if ((st = get_str(c, o, "type", &d->type))) return st;
  v = d->kind;
  if ((st = get_enum(c, o, "dataset_type", KINDS, NULL, &v))) return st;
  d->kind = (ct_ds_kind)v;
  if ((st = get_bool(c, o, "disabled", &d->disabled))) return st;
  /* SimpleTuner's data backend config reads either spelling, the British first
   * (helpers/data_backend/config: backend_dict.get("is_regularisation_data",
   * backend_dict.get("is_regularization_data", False))) */
  if ((st = get_bool(c, o, "is_regularization_data", &d->is_regularisation_data)) ||
      (st = get_bool(c, o, "is_regularisation_data", &d->is_regularisation_data)))
    return st;
  if (d->is_regularisation_data && c->vars && c->vars->model_type &&
      strcmp(c->vars->model_type, "lora")) {
    const ct_json *rv = ct_json_get(o, "is_regularisation_data");
    if (!rv) rv = ct_json_get(o, "is_regularization_data");
    /* SimpleTuner's trainer predicts the parent model's target only `if is_regularisation_data
     * and self.config.model_type == "lora"`: a full fine-tune trains it as ordinary data */
    if (c->probs)
      ct_config_problems_add(c->probs, 1, CT_OK, CT_ORIGIN_FILE, c->file, rv->line, rv->col,
                             "is_regularisation_data", NULL,
                             "%s: is_regularisation_data has no effect with model_type %s "
                             "(SimpleTuner trains towards the base model only for LoRA; here the "
                             "dataset is ordinary training data)",
                             c->where, c->vars->model_type);
    else
      CT_WARN(
          "%s: %s: is_regularisation_data has no effect with model_type %s (SimpleTuner "
          "trains towards the base model only for LoRA; here the dataset is ordinary "
          "training data)",
          c->file, c->where, c->vars->model_type);
  }
  if ((st = get_str(c, o, "instance_data_dir", &d->instance_data_dir))) return st;
  v = d->caption_strategy;
  if ((st = get_enum(c, o, "caption_strategy", CAPS, NULL, &v))) return st;
  d->caption_strategy = (ct_caption_strategy)v;
  if ((st = get_str(c, o, "instance_prompt", &d->instance_prompt))) return st;
  v = d->metadata_backend;
  if ((st = get_enum(c, o, "metadata_backend", METAS, META_MAP, &v))) return st;
  d->metadata_backend = (ct_metadata_backend)v;
  if ((st = parse_parquet(c, o, d))) return st;
  if ((st = get_num(c, o, "resolution", 0, 100000, &d->resolution))) return st;
  v = d->resolution_type;
  if ((st = get_enum(c, o, "resolution_type", RES, NULL, &v))) return st;
  d->resolution_type = (ct_resolution_type)v;
  if ((st = get_num(c, o, "minimum_image_size", 0, 1e6, &d->minimum_image_size))) return st;
  if ((st = get_num(c, o, "maximum_image_size", 0, 1e6, &d->maximum_image_size))) return st;
  if ((st = get_num(c, o, "target_downsample_size", 0, 1e6, &d->target_downsample_size))) return st;
  if ((st = get_num(c, o, "minimum_aspect_ratio", 0, 100, &d->minimum_aspect_ratio))) return st;
  if ((st = get_num(c, o, "maximum_aspect_ratio", 0, 100, &d->maximum_aspect_ratio))) return st;
  if ((st = get_bool(c, o, "crop", &d->crop))) return st;
  v = d->crop_style;
  if ((st = get_enum(c, o, "crop_style", STYLES, STYLE_MAP, &v))) return st;
  d->crop_style = (ct_crop_style)v;
  v = d->crop_aspect;
  if ((st = get_enum(c, o, "crop_aspect", ASPECTS, NULL, &v))) return st;
  d->crop_aspect = (ct_crop_aspect)v;
  if ((st = parse_aspects(c, o, d))) return st;
  d->repeats_set = ct_json_get(o, "repeats") != NULL;
  if ((st = get_int(c, o, "repeats", 0, 1000000, &d->repeats))) return st;
  if ((st = get_num(c, o, "probability", 0, 1e6, &d->probability))) return st;
  if ((st = get_int(c, o, "max_num_samples", 0, LONG_MAX / 2, &d->max_num_samples))) return st;
  if ((st = get_str(c, o, "cache_dir_vae", &d->cache_dir_vae))) return st;
  if ((st = get_str(c, o, "text_embeds", &d->text_embeds))) return st;
  if ((st = get_str(c, o, "image_embeds", &d->image_embeds))) return st;
  if ((st = get_bool(c, o, "vae_cache_disable", &d->vae_cache_disable))) return st;
  if ((st = get_bool(c, o, "preserve_data_backend_cache", &d->preserve_data_backend_cache)))
    return st;
  if ((st = get_bool(c, o, "compress_cache", &d->compress_cache))) return st;
  if ((st = get_bool(c, o, "default", &d->is_default))) return st;
  if ((st = get_str(c, o, "cache_dir", &d->cache_dir))) return st;
  if ((st = get_int(c, o, "write_batch_size", 1, 1 << 20, &d->write_batch_size))) return st;
  int ignore_epochs = 0;
  if ((st = get_bool(c, o, "ignore_epochs", &ignore_epochs))) return st;
  if (ignore_epochs)
    return bad(c, "ignore_epochs",
               "true is not implemented: every dataset counts toward the end of an epoch here "
               "(false, SimpleTuner's default, is accepted)");
  return read_conditioning(c, o, d);
}

/* A dataset_type "conditioning" dataset: its images are the references of
 * the image dataset that names it (conditioning_data); which images train,
 * and how often, is that dataset's to say. */
static ct_status check_conditioning(ctx *c, const ct_json *o, const ct_ds_config *d) {
  static const char *const NOT_HERE[] = {"repeats",
                                         "probability",
                                         "max_num_samples",
                                         "minimum_aspect_ratio",
                                         "maximum_aspect_ratio",
                                         "is_regularisation_data",
                                         "is_regularization_data",
                                         "conditioning_data",
                                         "text_embeds",
                                         "image_embeds",
                                         "vae_cache_disable",
                                         "parquet",
                                         "metadata_backend",
                                         NULL};
  if (d->is_aws)
    return bad(c, "type",
               "an S3 conditioning dataset is not implemented; give it \"type\": \"local\"");
  if (!d->instance_data_dir || !d->instance_data_dir[0])
    return bad(c, "instance_data_dir", "is required for a conditioning dataset (its images)");
  if (d->conditioning_type == CT_COND_NONE)
    return bad(c, "conditioning_type",
               "is required on a conditioning dataset: reference_strict or reference_loose "
               "(SimpleTuner's default, controlnet, is not implemented)");
  for (int k = 0; NOT_HERE[k]; k++)
    if (ct_json_get(o, NOT_HERE[k]))
      return bad(c, NOT_HERE[k],
                 "has no meaning on a conditioning dataset here: its images are paired with the "
                 "image dataset that names it in conditioning_data, which decides what is read "
                 "and sampled; set it there");
  /* reference_strict: the reference takes its image's placement (SimpleTuner's
   * prepare_like; its DatasetDuplicator copies the source's keys over these) */
  static const char *const PLACEMENT[] = {"resolution",
                                          "resolution_type",
                                          "minimum_image_size",
                                          "maximum_image_size",
                                          "target_downsample_size",
                                          "crop",
                                          "crop_style",
                                          "crop_aspect",
                                          "crop_aspect_buckets",
                                          NULL};
  for (int k = 0; d->conditioning_type == CT_COND_REFERENCE_STRICT && PLACEMENT[k]; k++) {
    const ct_json *v = ct_json_get(o, PLACEMENT[k]);
    if (!v || v->type == CT_JSON_NULL) continue;
    if (c->probs)
      ct_config_problems_add(c->probs, 1, CT_OK, CT_ORIGIN_FILE, c->file, v->line, v->col,
                             PLACEMENT[k], NULL,
                             "%s: key '%s' has no effect with reference_strict: each reference "
                             "takes its image's size and crop (as SimpleTuner's)",
                             c->where, PLACEMENT[k]);
    else
      CT_WARN(
          "%s: %s: key '%s' has no effect with reference_strict: each reference takes its "
          "image's size and crop (as SimpleTuner's)",
          c->file, c->where, PLACEMENT[k]);
  }
  return CT_OK;
}

/* The rules between a dataset's keys. */
static ct_status check_rules(ctx *c, const ct_json *o, ct_ds_config *d) {
  ct_status st;
  if (d->source_dataset_id && d->kind != CT_DS_CONDITIONING)
    return bad(c, "source_dataset_id",
               "belongs on a dataset with \"dataset_type\": \"conditioning\"");
  if (d->conditioning_data && d->kind != CT_DS_IMAGE)
    return bad(c, "conditioning_data", "belongs on an image dataset (dataset_type \"image\")");
  if (!d->type) return bad(c, "type", "is required (\"local\" or \"aws\")");
  if (strcmp(d->type, "local") && strcmp(d->type, "aws"))
    return bad(c, "type", "\"%s\" is not supported; use \"local\" or \"aws\" (S3)", d->type);
  d->is_aws = !strcmp(d->type, "aws");
  if ((st = parse_aws(c, o, d))) return st;
  if (d->kind == CT_DS_IMAGE) {
    if (!d->instance_data_dir || (!d->is_aws && !d->instance_data_dir[0]))
      return bad(c, "instance_data_dir",
                 "is required for an image dataset (a directory of images; \"\" names none)");
    if (d->caption_strategy == CT_CAP_INSTANCEPROMPT && !d->instance_prompt)
      return bad(c, "instance_prompt", "is required with caption_strategy \"instanceprompt\"");
    if ((d->caption_strategy == CT_CAP_PARQUET || d->metadata_backend == CT_META_PARQUET) &&
        !d->parquet.path)
      return bad(c, "parquet",
                 "caption_strategy or metadata_backend \"parquet\" needs a \"parquet\" block "
                 "with a \"path\" (.parquet or .jsonl)");
    if (d->crop_aspect >= CT_ASPECT_CLOSEST && !d->n_crop_aspect_buckets)
      return bad(c, "crop_aspect_buckets", "crop_aspect \"%s\" needs a list of crop_aspect_buckets",
                 ASPECTS[d->crop_aspect]);
    if (d->minimum_aspect_ratio > 0 && d->maximum_aspect_ratio > 0 &&
        d->minimum_aspect_ratio > d->maximum_aspect_ratio)
      return bad(c, "minimum_aspect_ratio", "%g is above maximum_aspect_ratio %g",
                 d->minimum_aspect_ratio, d->maximum_aspect_ratio);
  } else if (d->kind == CT_DS_CONDITIONING) {
    if ((st = check_conditioning(c, o, d))) return st;
    if (d->crop_aspect >= CT_ASPECT_CLOSEST && !d->n_crop_aspect_buckets)
      return bad(c, "crop_aspect_buckets", "crop_aspect \"%s\" needs a list of crop_aspect_buckets",
                 ASPECTS[d->crop_aspect]);
  } else {
    if (d->kind == CT_DS_TEXT_EMBEDS && !d->cache_dir && !d->is_aws)
      return bad(c, "cache_dir", "is required for a text_embeds dataset");
    if (d->kind == CT_DS_IMAGE_EMBEDS && !d->cache_dir && !d->instance_data_dir && !d->is_aws)
      return bad(c, "cache_dir", "is required for an image_embeds dataset (or instance_data_dir)");
  }
  return CT_OK;
}

static ct_status parse_one(ctx *c, const ct_json *o, ct_ds_config *d) {
  ct_status st = check_keys(c, o);
  if (!st) st = read_fields(c, o, d);
  if (!st) st = check_rules(c, o, d);
  return st;
}

/* A failed dataset (or rule) as a problem; the file name prefix of the
 * message goes, the position says it. */
static void note(ctx *c, ct_config_problems *probs, const char *name) {
  const size_t nl = strlen(name);
  const char *m = c->err ? c->err->msg : "";
  if (!strncmp(m, name, nl) && !strncmp(m + nl, ": ", 2)) m += nl + 2;
  ct_config_problems_add(probs, 0, c->err && c->err->status ? c->err->status : CT_ERR_INVALID,
                         CT_ORIGIN_FILE, name, c->line, c->col, c->key, NULL, "%s", m);
  c->line = c->col = 0;
  c->key[0] = 0;
}

/* One entry of the array into b->ds (id, uniqueness, then its keys). */
static ct_status parse_entry(ctx *c, const ct_json *e, size_t i, ct_backend *b) {
  snprintf(c->where, sizeof c->where, "entry %zu", i);
  c->obj = e, c->id = NULL;
  if (e->type != CT_JSON_OBJECT) {
    c->line = e->line, c->col = e->col;
    return ct_errf(c->err, CT_ERR_FORMAT, "%s: entry %zu: expected an object, got %s", c->file, i,
                   ct_json_type_name(e->type));
  }
  ct_ds_config *d = &b->ds[b->n++];
  ct_status st = get_str(c, e, "id", &d->id);
  if (!st && (!d->id || !*d->id))
    st = bad(c, "id", "a non-empty string is required (it names the caches)");
  if (st) return st;
  for (const char *p = d->id; *p; p++)
    if (*p == '/' || *p == '\\' || (unsigned char)*p < 0x20)
      return bad(c, "id",
                 "\"%s\" may not contain '/', '\\' or control characters (it is part of file "
                 "names)",
                 d->id);
  snprintf(c->where, sizeof c->where, "dataset '%s'", d->id);
  c->id = d->id;
  for (int k = 0; k < b->n - 1; k++)
    if (b->ds[k].id && !strcmp(b->ds[k].id, d->id))
      return bad(c, "id", "\"%s\" is used by entry %d too; ids must be unique", d->id, k);
  return parse_one(c, e, d);
}

/* References between datasets: text_embeds and image_embeds name enabled
 * datasets of that type; an image dataset naming an image_embeds dataset
 * says where in it the latents go (cache_dir_vae). */
static ct_status check_refs(ctx *c, ct_backend *b, int i) {
  ct_ds_config *d = &b->ds[i];
  const char *refs[2] = {d->text_embeds, d->image_embeds};
  const ct_ds_kind want[2] = {CT_DS_TEXT_EMBEDS, CT_DS_IMAGE_EMBEDS};
  snprintf(c->where, sizeof c->where, "dataset '%s'", d->id);
  for (int r = 0; r < 2; r++) {
    if (!refs[r]) continue;
    const ct_ds_config *t = ct_backend_find(b, refs[r]);
    if (!t || t->disabled || t->kind != want[r])
      return bad(c, r ? "image_embeds" : "text_embeds", "no enabled %s dataset with id \"%s\"",
                 r ? "image_embeds" : "text_embeds", refs[r]);
  }
  if (d->conditioning_data) {
    const ct_ds_config *t = ct_backend_find(b, d->conditioning_data);
    if (!t || t->disabled || t->kind != CT_DS_CONDITIONING)
      return bad(c, "conditioning_data",
                 "no enabled dataset with id \"%s\" and \"dataset_type\": \"conditioning\"",
                 d->conditioning_data);
  }
  if (d->kind == CT_DS_CONDITIONING) {
    int named = 0;
    for (int k = 0; k < b->n; k++)
      named += !b->ds[k].disabled && b->ds[k].conditioning_data &&
               !strcmp(b->ds[k].conditioning_data, d->id) &&
               (!d->source_dataset_id || !strcmp(b->ds[k].id, d->source_dataset_id));
    if (d->source_dataset_id && !named)
      return bad(c, "source_dataset_id",
                 "\"%s\" is not an enabled image dataset whose conditioning_data is \"%s\"",
                 d->source_dataset_id, d->id);
    if (!named)
      CT_WARN("%s: %s: no image dataset names it in conditioning_data; its images are not used",
              c->file, c->where);
  }
  if (d->image_embeds && d->kind == CT_DS_IMAGE) {
    const ct_ds_config *t = ct_backend_find(b, d->image_embeds);
    if (!d->cache_dir_vae || !d->cache_dir_vae[0])
      return bad(c, "cache_dir_vae",
                 "is required with image_embeds: it is where in image_embeds dataset \"%s\" the "
                 "latents go (as in SimpleTuner)",
                 d->image_embeds);
    if (d->is_aws && !t->is_aws)
      return bad(c, "image_embeds",
                 "an S3 image dataset with its latents in local image_embeds dataset \"%s\" is "
                 "not supported; give that dataset type \"aws\", or drop image_embeds and set "
                 "cache_dir_vae (a key prefix of this dataset's bucket)",
                 d->image_embeds);
    if (t->is_aws && !d->is_aws) return norm_keydir(c, "cache_dir_vae", d->cache_dir_vae);
  }
  return CT_OK;
}

ct_status ct_backend_parse_with(const char *text, size_t len, const char *name,
                                const ct_backend_vars *vars, ct_backend **out,
                                ct_config_problems *probs, ct_err *err) {
  ct_json *j = NULL;
  ct_backend *b = NULL;
  ct_err scratch = {0};
  ctx c = {.file = name, .err = err ? err : &scratch, .vars = vars, .probs = probs};
  ct_status st = ct_json_parse(text, len, &j, c.err), first = CT_OK;
  *out = NULL;
  if (st) {
    int line = 0, col = 0, n = 0;
    if (sscanf(c.err->msg, "line %d, column %d: %n", &line, &col, &n) != 2 || n <= 0)
      line = col = n = 0;
    ct_config_problems_add(probs, 0, st, CT_ORIGIN_FILE, name, line, col, NULL, NULL, "%s",
                           c.err->msg + n);
    ct_err_prefix(c.err, "%s: ", name);
    return st;
  }
  if (j->type != CT_JSON_ARRAY) {
    st = ct_errf(c.err, CT_ERR_FORMAT, "%s: expected a JSON array of datasets, got %s", name,
                 ct_json_type_name(j->type));
    c.line = j->line, c.col = j->col;
    note(&c, probs, name);
    goto out;
  }
  b = calloc(1, sizeof *b);
  if (!b || !(b->ds = calloc(j->n ? j->n : 1, sizeof *b->ds)) || !(b->path = strdup(name))) {
    st = ct_errf(c.err, CT_ERR_NOMEM, "out of memory");
    goto out;
  }
  /* every dataset, each one's first problem; then the references */
  for (size_t i = 0; i < j->n && (probs || !first); i++) {
    ct_err keep = *c.err;
    st = parse_entry(&c, &j->items[i], i, b);
    if (st) {
      if (!c.noted) note(&c, probs, name);
      c.noted = 0;
      if (first) *c.err = keep; /* err keeps the first problem */
      if (!first) first = st;
    }
  }
  if (first) {
    st = first;
    goto out;
  }
  int n_img = 0, n_default = 0, n_text = 0;
  for (int i = 0; i < b->n; i++) {
    const ct_ds_config *d = &b->ds[i];
    if (d->disabled) continue;
    n_img += d->kind == CT_DS_IMAGE;
    n_text += d->kind == CT_DS_TEXT_EMBEDS;
    n_default += d->kind == CT_DS_TEXT_EMBEDS && d->is_default;
    c.obj = &j->items[i], c.id = d->id;
    ct_err keep = *c.err;
    st = check_refs(&c, b, i);
    if (st) {
      note(&c, probs, name);
      if (first) *c.err = keep;
      if (!first) first = st;
      if (!probs) goto out;
    }
  }
  st = first;
  c.obj = NULL;
  if (!st && n_text > 1 && n_default != 1) {
    st = ct_errf(c.err, CT_ERR_INVALID,
                 "%s: %d text_embeds datasets and %d marked \"default\": true; exactly one must be "
                 "the default",
                 name, n_text, n_default);
    note(&c, probs, name);
  }
  if (!st && n_img == 0) {
    st =
        ct_errf(c.err, CT_ERR_INVALID,
                "%s: no enabled image dataset (dataset_type \"image\"); nothing to train on", name);
    note(&c, probs, name);
  }
out:
  ct_json_free(j);
  if (st) {
    ct_backend_free(b);
    b = NULL;
  }
  *out = b;
  return st;
}

ct_status ct_backend_parse(const char *text, size_t len, const char *name, ct_backend **out,
                           ct_err *err) {
  return ct_backend_parse_with(text, len, name, NULL, out, NULL, err);
}

ct_status ct_backend_load(const char *path, ct_backend **out, ct_err *err) {
  return ct_backend_load_with(path, NULL, out, NULL, err);
}

ct_status ct_backend_load_with(const char *path, const ct_backend_vars *vars, ct_backend **out,
                               ct_config_problems *probs, ct_err *err) {
  *out = NULL;
  if (ct_is_dir(path)) { /* fopen opens it and fread reads nothing: say what it is */
    ct_config_problems_add(probs, 0, CT_ERR_INVALID, CT_ORIGIN_FILE, path, 0, 0, NULL, NULL,
                           "is a directory, not a data backend config (multidatabackend.json)");
    return ct_errf(err, CT_ERR_INVALID,
                   "data_backend_config %s: is a directory, not a multidatabackend.json", path);
  }
  FILE *f = fopen(path, "rb");
  if (!f) {
    ct_config_problems_add(probs, 0, CT_ERR_IO, CT_ORIGIN_FILE, path, 0, 0, NULL, NULL,
                           "cannot open the data backend config: %s", strerror(errno));
    return ct_errf(err, CT_ERR_IO, "data_backend_config %s: cannot open: %s", path,
                   strerror(errno));
  }
  const size_t cap = (size_t)16 << 20;
  char *text = malloc(cap);
  size_t len = text ? fread(text, 1, cap, f) : 0;
  int more = text && len == cap;
  fclose(f);
  if (!text) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  if (more) {
    free(text);
    ct_config_problems_add(probs, 0, CT_ERR_RANGE, CT_ORIGIN_FILE, path, 0, 0, NULL, NULL,
                           "larger than 16 MiB");
    return ct_errf(err, CT_ERR_RANGE,
                   "%s: larger than 16 MiB; is this really a multidatabackend.json?", path);
  }
  ct_status st = ct_backend_parse_with(text, len, path, vars, out, probs, err);
  free(text);
  return st;
}

void ct_backend_free(ct_backend *b) {
  if (!b) return;
  for (int i = 0; i < b->n; i++) ds_free(&b->ds[i]);
  free(b->ds);
  free(b->path);
  free(b);
}

const ct_ds_config *ct_backend_find(const ct_backend *b, const char *id) {
  for (int i = 0; b && i < b->n; i++)
    if (!strcmp(b->ds[i].id, id)) return &b->ds[i];
  return NULL;
}

const char *ct_ds_image_dir(const ct_ds_config *d) {
  return d->is_aws && d->instance_data_dir ? d->instance_data_dir : "";
}

ct_status ct_ds_open_storage(const ct_ds_config *d, ct_storage **out, ct_err *err) {
  *out = NULL;
  if (!d->is_aws) {
    const char *dir = d->kind == CT_DS_IMAGE || !d->cache_dir ? d->instance_data_dir : d->cache_dir;
    if (!dir || !dir[0])
      return ct_errf(err, CT_ERR_INVALID, "dataset '%s': no directory to read", d->id);
    return ct_storage_open_local(dir, out, err);
  }
  char name[200];
  snprintf(name, sizeof name, "dataset '%s'", d->id);
  const ct_ds_s3 *a = &d->s3;
  ct_s3_config sc = {
      .bucket = a->bucket,
      .region = a->region,
      .endpoint = a->endpoint,
      .access_key = a->access_key,
      .secret_key = a->secret_key,
      .session_token = a->session_token,
      .prefix = a->prefix,
      .max_connections = (int)a->max_pool_connections,
      .addressing = a->addressing,
      .max_retries = a->max_retries > 0 ? (int)a->max_retries : -1, /* 0 in the file: no retries */
      .timeout_s = a->request_timeout,
      .name = name,
  };
  return ct_storage_open_s3(&sc, out, err);
}

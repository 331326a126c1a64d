/* Training data: SimpleTuner's multidatabackend.json, aspect buckets, a
 * sharded resumable sampler, latent and text-embedding caches, prefetch.
 *
 * Layers (docs/data.md):
 *   ct_backend   the parsed multidatabackend.json (every key validated; errors
 *                name the dataset id and the key)
 *   ct_bucket_*  SimpleTuner's bucket arithmetic: an image's target size,
 *                intermediary size, crop and aspect key (pure functions)
 *   ct_dataset   discovery (headers only, spread over every rank) or parquet/
 *                JSONL metadata, the bucket index, the effective-batch check,
 *                the caches and the sampler; batches come from a prefetch
 *                thread through a bounded queue.
 *
 * The sample order is a function of the seed and the sampler's position only:
 * each optimizer step takes E = train_batch_size x ranks x accumulation
 * consecutive samples of one bucket's shuffled order, and micro-batch m of
 * rank r takes samples [(m x ranks + r) x b, +b) of them. So N ranks x b draw
 * exactly what 1 rank x N·b draws, and a checkpoint's position resumes at any
 * world size.
 */
#ifndef CTUNER_DATA_H
#define CTUNER_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/config.h" /* ct_config_problems (the config module) */
#include "ctuner/status.h"
#include "ctuner/storage.h"

/* ---- multidatabackend.json ---- */

typedef enum {
  CT_DS_IMAGE = 0,
  CT_DS_TEXT_EMBEDS,
  CT_DS_IMAGE_EMBEDS,
  CT_DS_CONDITIONING
} ct_ds_kind;
/* conditioning_type of a dataset_type "conditioning" dataset (docs/data.md,
 * "Conditioning datasets"): reference images of FLUX.1 Kontext */
typedef enum {
  CT_COND_NONE = 0,
  CT_COND_REFERENCE_STRICT, /* the target's size and crop */
  CT_COND_REFERENCE_LOOSE   /* bucketed and cropped by its own dataset's keys */
} ct_cond_type;
typedef enum {
  CT_CAP_TEXTFILE = 0,
  CT_CAP_FILENAME,
  CT_CAP_INSTANCEPROMPT,
  CT_CAP_PARQUET
} ct_caption_strategy;
typedef enum { CT_META_DISCOVERY = 0, CT_META_PARQUET } ct_metadata_backend;
typedef enum { CT_RES_PIXEL = 0, CT_RES_AREA, CT_RES_PIXEL_AREA } ct_resolution_type;
typedef enum { CT_CROP_RANDOM = 0, CT_CROP_CENTER, CT_CROP_CORNER } ct_crop_style;
typedef enum {
  CT_ASPECT_SQUARE = 0,
  CT_ASPECT_PRESERVE,
  CT_ASPECT_CLOSEST,
  CT_ASPECT_RANDOM
} ct_crop_aspect;

typedef struct ct_ds_parquet {
  char *path; /* .parquet or .jsonl (relative: to instance_data_dir) */
  char *filename_column, *caption_column, *fallback_caption_column, *width_column, *height_column;
  int identifier_includes_extension;
} ct_ds_parquet;

/* type "aws": SimpleTuner's aws_* keys plus ctuner's addressing, retries and
 * timeout (docs/data.md, "S3 datasets"). Credentials left NULL come from
 * AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN. The secret
 * key and session token never appear in a message, log line or saved file. */
typedef struct ct_ds_s3 {
  char *bucket;            /* aws_bucket_name (required) */
  char *region, *endpoint; /* aws_region_name, aws_endpoint_url */
  char *access_key, *secret_key, *session_token;
  char *prefix; /* aws_data_prefix: the dataset's root in the bucket ("" = the bucket's) */
  long max_pool_connections;   /* 1..1024 (128) */
  ct_s3_addressing addressing; /* aws_addressing_style: auto, path, virtual */
  long max_retries;            /* aws_max_retries 0..20 (6) */
  double request_timeout;      /* aws_request_timeout, seconds (60) */
} ct_ds_s3;

typedef struct ct_ds_config {
  char *id;
  char *type; /* "local" or "aws" (S3) */
  int is_aws;
  ct_ds_s3 s3; /* type "aws" only */
  ct_ds_kind kind;
  int disabled;
  char *instance_data_dir; /* aws: a key prefix below aws_data_prefix ("" or NULL: the prefix
                              itself) */
  ct_caption_strategy caption_strategy;
  char *instance_prompt;
  ct_metadata_backend metadata_backend;
  ct_ds_parquet parquet;
  double resolution; /* pixels, or megapixels for area (0: the run's --resolution) */
  ct_resolution_type resolution_type;
  double minimum_image_size, maximum_image_size, target_downsample_size; /* 0: unset */
  double minimum_aspect_ratio, maximum_aspect_ratio;                     /* 0: unset */
  int crop;
  ct_crop_style crop_style;
  ct_crop_aspect crop_aspect;
  double *crop_aspect_buckets, *crop_aspect_weights; /* n_crop_aspect_buckets each */
  int n_crop_aspect_buckets;
  long repeats;
  int repeats_set; /* given in the file (oversubscription leaves it alone) */
  double probability;
  long max_num_samples;             /* 0: all */
  char *cache_dir_vae;              /* NULL: {output_dir}/cache/vae/{id} */
  char *text_embeds, *image_embeds; /* ids of cache datasets */
  int vae_cache_disable, preserve_data_backend_cache, compress_cache;
  /* is_regularisation_data (or is_regularization_data): under model_type
   * lora its batches train towards the base model's own prediction
   * (SimpleTuner's prior preservation; docs/lora.md) */
  int is_regularisation_data;
  /* image datasets: conditioning_data, the id of the dataset_type "conditioning"
   * dataset holding each image's reference (same relative path) */
  char *conditioning_data;
  /* conditioning datasets: conditioning_type; source_dataset_id (optional: the
   * image dataset that names it) */
  ct_cond_type conditioning_type;
  char *source_dataset_id;
  /* text_embeds / image_embeds datasets */
  int is_default;
  char *cache_dir;
  long write_batch_size;
} ct_ds_config;

typedef struct ct_backend {
  ct_ds_config *ds;
  int n;
  char *path; /* the file, for messages */
} ct_backend;

/* Parse a multidatabackend.json ({env:VAR} substituted in strings). Unknown
 * keys are errors with the nearest known key; known SimpleTuner keys that
 * ctuner does not use are accepted with one warning. */
ct_status ct_backend_load(const char *path, ct_backend **out, ct_err *err);
ct_status ct_backend_parse(const char *text, size_t len, const char *name, ct_backend **out,
                           ct_err *err);
/* What SimpleTuner's placeholders in string values become ({model_family},
 * {output_dir}; {id} is each dataset's own id). NULL fields: "flux", "output". */
typedef struct ct_backend_vars {
  const char *model_family, *output_dir;
  /* the run's defaults for datasets that leave them out, as SimpleTuner's
   * backend.get(key, args.key): resolution_type (NULL: SimpleTuner's
   * "pixel_area") and minimum_image_size (0: none) */
  const char *resolution_type;
  double minimum_image_size;
  /* the run's model_type (NULL: not known): is_regularisation_data acts
   * under lora only, and says so elsewhere */
  const char *model_type;
} ct_backend_vars;
/* As ct_backend_load/parse with placeholders filled from vars, and every
 * dataset's first problem (and the rules between datasets) collected into
 * probs (may be NULL: stop at the first) with its line and column. */
ct_status ct_backend_load_with(const char *path, const ct_backend_vars *vars, ct_backend **out,
                               ct_config_problems *probs, ct_err *err);
ct_status ct_backend_parse_with(const char *text, size_t len, const char *name,
                                const ct_backend_vars *vars, ct_backend **out,
                                ct_config_problems *probs, ct_err *err);
void ct_backend_free(ct_backend *b);
/* The dataset with this id, or NULL. */
const ct_ds_config *ct_backend_find(const ct_backend *b, const char *id);

/* The storage of a dataset: local, a directory (instance_data_dir, or for a
 * cache dataset its cache_dir); aws, the bucket below aws_data_prefix (image
 * keys then live under ct_ds_image_dir). Credentials missing from the config
 * come from the environment. */
ct_status ct_ds_open_storage(const ct_ds_config *d, ct_storage **out, ct_err *err);
/* Where the images are inside the dataset's storage: "" (local, or aws
 * without instance_data_dir) or a '/'-separated key prefix without slashes
 * at either end. */
const char *ct_ds_image_dir(const ct_ds_config *d);

/* A local directory of images listed the way the loader's discovery lists a
 * dataset (listing, image headers and .txt captions, on every core;
 * src/data/discover.c); `ctuner bench discovery` times it. rel: the image
 * paths relative to dir, sorted; bad: those that are unreadable or lack a
 * caption. ct_ds_listing_free(NULL-filled) is a no-op. */
typedef struct ct_ds_listing {
  char **rel;
  size_t n, bad;
} ct_ds_listing;
ct_status ct_ds_list_dir(const char *dir, ct_ds_listing *out, ct_err *err);
void ct_ds_listing_free(ct_ds_listing *l);

/* ---- buckets ---- */

typedef struct ct_bucket_opts {
  ct_resolution_type resolution_type; /* pixel_area is converted to area by ct_bucket_opts_from */
  double resolution;                  /* pixels (pixel) or megapixels (area) */
  int alignment;                      /* aspect_bucket_alignment: 8, 16, 24, 32 or 64 */
  int rounding;                       /* aspect_bucket_rounding: decimals of the key */
  int crop;
  ct_crop_style crop_style;
  ct_crop_aspect crop_aspect;
  const double *aspects, *weights;
  int naspects;
  double maximum_image_size, target_downsample_size; /* in resolution_type units; 0: unset */
  uint64_t seed;
} ct_bucket_opts;

/* Where an image goes: SimpleTuner's per-image metadata. */
typedef struct ct_img_geom {
  int orig_w, orig_h;     /* original_size (after EXIF orientation) */
  int inter_w, inter_h;   /* intermediary_size: resized before the crop */
  int crop_x, crop_y;     /* crop_coordinates (left, top) in the intermediary image */
  int target_w, target_h; /* target_size: the bucket's pixel size */
  double aspect;          /* aspect_ratio = round(target_w / target_h, rounding) */
} ct_img_geom;

/* pixel_area -> area (megapixels = edge^2 / 1e6), validation of alignment. */
ct_status ct_bucket_opts_from(const ct_ds_config *d, double run_resolution, int alignment,
                              int rounding, uint64_t seed, ct_bucket_opts *o, ct_err *err);
/* Place an image of w x h; key_hash decorrelates random crops and aspects
 * between images (a hash of its path). */
ct_status ct_bucket_place(const ct_bucket_opts *o, int w, int h, uint64_t key_hash, ct_img_geom *g,
                          ct_err *err);
/* round(x, decimals) the way Python prints it: "1.0", "1.33", "0.75". */
void ct_bucket_key(double aspect, int rounding, char *out, size_t n);
/* Python's round(x): half to even. */
double ct_round_half_even(double x);

/* ---- the dataset ---- */

struct ct_comm;
struct ct_config;

/* Frozen text encoder for the text-embedding cache: seq (n, T, d) and pooled
 * (n, dp) of n captions. Called on the thread that calls ct_dataset_open and
 * ct_dataset_next only (never on the prefetch thread). */
typedef struct ct_text_encoder_fn {
  void *ctx;
  int T, d, dp;
  char
      tag[32]; /* names the encoder in cache file names: a digest of its output on probe captions */
  ct_status (*encode)(void *ctx, const char *const *caps, int n, float *seq, float *pooled,
                      ct_err *err);
} ct_text_encoder_fn;

typedef struct ct_data_opts {
  const struct ct_config *cfg; /* seed, resolution, batch, accumulation, output_dir, data keys */
  struct ct_comm *comm;        /* NULL: one process */
  int codec_scale;             /* pixel codec s (when codec is NULL) */
  const struct ct_codec
      *codec;        /* the latent codec (pixel or VAE); NULL: the pixel codec of codec_scale */
  int size_multiple; /* bucket sizes must be multiples of this (codec s x patch) */
  const ct_text_encoder_fn *text; /* NULL: batches carry captions and nothing is cached */
  int prefetch;                   /* micro-batches queued ahead (0: synchronous) */
  /* 1: the trainer takes reference latents (FLUX.1 Kontext): every image
   * dataset needs conditioning_data and batches carry ref; 0: conditioning_data
   * is refused by name (nothing would use it) */
  int reference;
  const char *reference_why; /* with reference 0: what the run is, for that message */
} ct_data_opts;

typedef struct ct_dataset ct_dataset;

/* Filtering statistics (SimpleTuner's), summed over every dataset. */
typedef struct ct_data_stats {
  size_t total_processed, kept;
  size_t too_small, too_large, aspect_ratio, unreadable, no_caption, outside_dir, duplicate,
      not_found, metadata_missing, max_num_samples;
  size_t unpaired; /* without a usable reference in the conditioning dataset */
  size_t buckets, buckets_pruned, samples; /* samples: after repeats */
} ct_data_stats;

/* One micro-batch for this rank: B samples of one bucket. */
typedef struct ct_batch {
  int B, C, h, w;    /* latents (B, C, h, w) */
  float *x0;         /* (B, C, h, w) */
  const char **caps; /* B captions after the pick and dropout */
  float *txt,
      *pooled; /* (B, T, d), (B, dp) from the text cache when a text encoder was given, else NULL */
  uint64_t *ids;      /* global sample ids (noise and timestep streams) */
  double wait_s;      /* seconds the trainer waited for this batch */
  int epoch_end;      /* 1: this micro-batch started a new epoch */
  int regularisation; /* its dataset's is_regularisation_data */
  /* per sample: its bucket placement (SDXL's time_ids) and 1 when its
   * caption was dropped (caption_dropout_probability) */
  const ct_img_geom *geom;
  const unsigned char *dropped;
  /* with ct_data_opts.reference: the samples' reference latents (B, C, rh, rw),
   * the VAE's latent mean (FluxKontextPipeline's prepare_latents); else NULL */
  float *ref;
  int rh, rw;
} ct_batch;

/* Discovery (or metadata), buckets, effective-batch check, caches. Every rank
 * calls it together. */
ct_status ct_dataset_open(const char *backend_json, const ct_data_opts *o, ct_dataset **out,
                          ct_err *err);
void ct_dataset_free(ct_dataset *ds);

void ct_dataset_stats(const ct_dataset *ds, ct_data_stats *out);
int ct_dataset_channels(const ct_dataset *ds);
/* Floats of the largest latent of any bucket (C x h x w). */
size_t ct_dataset_max_latent(const ct_dataset *ds);
/* ... and of the largest reference latent (0: no conditioning_data). */
size_t ct_dataset_max_reference(const ct_dataset *ds);
/* Samples (after repeats) over every dataset, and optimizer steps per epoch. */
size_t ct_dataset_count(const ct_dataset *ds);
long ct_dataset_steps_per_epoch(const ct_dataset *ds);
/* Longest caption line measured by measure (NULL: bytes); *n_over counts
 * lines longer than limit. */
size_t ct_dataset_longest_caption(const ct_dataset *ds, size_t (*measure)(const char *, void *),
                                  void *ctx, size_t limit, size_t *n_over);

/* The next micro-batch of this rank (valid until the next call). */
ct_status ct_dataset_next(ct_dataset *ds, ct_batch **out, ct_err *err);

/* The sampler's position after the last batch returned: a JSON object
 * (caller frees), and its restore (before the first ct_dataset_next; works
 * at any world size). epoch is 0-based. */
char *ct_dataset_state_json(const ct_dataset *ds);
ct_status ct_dataset_state_restore(ct_dataset *ds, const char *json, ct_err *err);
long ct_dataset_epoch(const ct_dataset *ds);
uint64_t ct_dataset_samples_seen(const ct_dataset *ds);

/* Seconds the trainer waited for batches in total. */
double ct_dataset_wait_seconds(const ct_dataset *ds);

#endif

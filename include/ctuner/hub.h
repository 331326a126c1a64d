/* Hugging Face Hub ids ("black-forest-labs/FLUX.1-dev") as diffusers reads
 * them: from the user's Hugging Face cache, downloading what is missing over
 * the hub's HTTP API into the same cache layout huggingface_hub writes.
 * docs/hub.md.
 *
 * The cache (huggingface_hub's constants.py): HF_HUB_CACHE (or the older
 * HUGGINGFACE_HUB_CACHE), else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub,
 * else ~/.cache/huggingface/hub. A repo lives in models--ORG--NAME/ with
 *   refs/REVISION          the commit sha a branch or tag pointed at
 *   snapshots/SHA/PATH     a symlink to ../../blobs/ETAG (deeper paths: more ../)
 *   blobs/ETAG             the file's bytes (ETAG.incomplete while downloading)
 * A revision that is a 40-hex commit sha names snapshots/SHA directly.
 *
 * The hub (HF_ENDPOINT, default https://huggingface.co): GET
 * /api/models/REPO/revision/REV for the commit sha and the file list, HEAD
 * /REPO/resolve/SHA/PATH for a file's etag and size (X-Linked-Etag and
 * X-Linked-Size for LFS files), GET the same URL (redirects followed) with
 * Range to resume a .incomplete blob. The token (HF_TOKEN, else
 * HUGGING_FACE_HUB_TOKEN, else the file HF_TOKEN_PATH, default HF_HOME/token)
 * goes as "Authorization: Bearer", never to another host, never printed.
 * HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) = 1/ON/YES/TRUE: no network.
 */
#ifndef CTUNER_HUB_H
#define CTUNER_HUB_H

#include <stddef.h>

#include "ctuner/status.h"

#define CT_HUB_PATH 4096

/* 1 if s is a repo id as huggingface_hub's validate_repo_id accepts it:
 * "name" or "org/name", [A-Za-z0-9_.-] only, no "--" or "..", not starting
 * or ending with '-' or '.', at most 96 characters. */
int ct_hub_is_repo_id(const char *s);

/* 1 if s is a 40-hex lowercase commit sha (huggingface_hub's REGEX_COMMIT_HASH). */
int ct_hub_is_commit(const char *s);

/* The cache directory and the variable it came from ("HF_HUB_CACHE",
 * "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME"); from may be NULL. */
ct_status ct_hub_cache_dir(char *out, size_t n, const char **from, ct_err *err);

/* 1 if HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is true. */
int ct_hub_offline(void);

/* What to fetch and how. Every field may be 0/NULL. */
typedef struct ct_hub_opts {
  const char *revision;    /* branch, tag or commit sha (NULL: "main") */
  const char *variant;     /* diffusers' weight variant, e.g. "fp16" (NULL: none) */
  const char *subfolder;   /* only files under it (NULL: a pipeline's components, or all) */
  int subfolder_optional;  /* the subfolder only if the repo has SUBFOLDER/config.json */
  const char *key;         /* the config key, for messages */
  int quiet;               /* no progress on stderr */
  const char *const *skip; /* component folders not fetched (NULL-terminated; NULL: none) */
} ct_hub_opts;

/* The snapshot directory of id at o->revision in the cache, nothing
 * downloaded. CT_ERR_NOT_FOUND names every place looked (the cache and how it
 * was chosen, the repo folder, the refs file, the snapshot). */
ct_status ct_hub_lookup(const char *id, const ct_hub_opts *o, char *out, size_t n, ct_err *err);

/* The snapshot directory of id at o->revision with every file the pipeline
 * needs: the hub's file list for the revision, the files selected as
 * diffusers selects them (ct_hub_wanted), the missing ones downloaded
 * (resumed), refs/REVISION written. Offline, or when the hub cannot be
 * reached (a warning), the cache alone (ct_hub_lookup). */
ct_status ct_hub_fetch(const char *id, const ct_hub_opts *o, char *out, size_t n, ct_err *err);

/* Which of a repo's files (paths relative to its root) a diffusers pipeline
 * load fetches, as DiffusionPipeline.download does: with model_index.json
 * among them, only it and the component folders it names (components: their
 * names, NULL otherwise); with subfolder, only files under it; weights that
 * ctuner cannot read (.bin, .msgpack, .onnx, .pb, .h5, .ckpt, .pt, .pth)
 * never; weight files by variant (pipeline_loading_utils.py
 * variant_compatible_siblings): with a variant its files, plus a non-variant
 * one wherever its variant counterpart is absent; without, non-variant only.
 * keep[i] is set to 1 or 0. */
void ct_hub_wanted(const char *const *files, size_t nfiles, const char *const *components,
                   size_t ncomp, const char *subfolder, const char *variant, int *keep);

/* A directory in which a variant's weight files have the plain names the
 * loaders open (diffusion_pytorch_model.fp16.safetensors as
 * diffusion_pytorch_model.safetensors, X.safetensors.index.fp16.json as
 * X.safetensors.index.json; shards keep their names, which the index
 * names): dir itself when no file of the variant is there, else a tree of
 * symlinks under cache_root (made once, reused). CT_ERR_NOT_FOUND when the
 * variant has no file in dir or one level below. */
ct_status ct_hub_variant_dir(const char *dir, const char *variant, const char *cache_root,
                             char *out, size_t n, ct_err *err);

#endif

/* remote.h: output_dir as s3://bucket/prefix (remote.c; docs/storage.md).
 *
 * The run works in a local directory as always (output_dir_local); rank 0
 * mirrors each committed checkpoint to the bucket — every file first, the
 * .guard last, so a checkpoint that is listed with a .guard is complete — and
 * keeps checkpoints_total_limit there too (deleting a checkpoint's .guard
 * before its files). resume_from_checkpoint latest takes the newest guarded
 * checkpoint of the bucket when it is newer than the local one. */
#ifndef CTUNER_TRAIN_REMOTE_H
#define CTUNER_TRAIN_REMOTE_H

#include "ctuner/config.h"
#include "ctuner/storage.h"

typedef struct ct_remote ct_remote;

/* 1 if cfg->output_dir is an s3:// URL. */
int ct_remote_wanted(const ct_config *cfg);
/* The bucket from the output_aws_* keys and the AWS_* environment variables
 * (credentials only from the environment); *local: the working directory
 * (malloc'd). connect 0: only *local, and *out is NULL (ranks other than 0
 * never use the bucket and may lack the credentials). */
ct_status ct_remote_open(const ct_config *cfg, int connect, ct_remote **out, char **local,
                         ct_err *err);
void ct_remote_free(ct_remote *r);
const char *ct_remote_url(const ct_remote *r);

/* Download the newest guarded remote checkpoint into local_out when it is
 * newer than every guarded local one (into checkpoint-N-tmp, renamed, then
 * .guard). *step: the step pulled, or 0. */
ct_status ct_remote_pull_latest(ct_remote *r, const char *local_out, long *step, ct_err *err);
/* Upload a committed local checkpoint directory (…/checkpoint-N), then apply
 * limit (0: keep all) to the remote checkpoints. */
ct_status ct_remote_push_checkpoint(ct_remote *r, const char *ckpt_dir, long limit, ct_err *err);
/* Upload metrics.jsonl and validation_images/ of local_out. */
ct_status ct_remote_push_outputs(ct_remote *r, const char *local_out, ct_err *err);

#endif

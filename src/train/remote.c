/* remote.c: output_dir as s3://bucket/prefix — checkpoints mirrored to a
 * bucket through ct_storage, and the newest one pulled back for a resume.
 *
 * Files move in batches of at most BATCH_BYTES held in memory, each batch
 * over the storage's connection pool (put_many/get_many). A single object is
 * one PUT, so files over 5 GiB (S3's limit for one PUT) are refused with a
 * message; multipart uploads are not implemented. */
#include "train/remote.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/fs.h"
#include "ctuner/log.h"
#include "train_int.h"

#define BATCH_BYTES ((size_t)512 << 20)
#define BATCH_FILES 64
#define SINGLE_PUT_MAX ((uint64_t)5 << 30)

struct ct_remote {
  ct_storage *s;
  char *url;
};

int ct_remote_wanted(const ct_config *cfg) {
  return cfg->output_dir && !strncmp(cfg->output_dir, "s3://", 5);
}
const char *ct_remote_url(const ct_remote *r) {
  return r->url;
}

ct_status ct_remote_open(const ct_config *cfg, int connect, ct_remote **out, char **local,
                         ct_err *err) {
  *out = NULL;
  *local = NULL;
  char *bucket = NULL, *prefix = NULL;
  if (!ct_storage_parse_s3_url(cfg->output_dir, &bucket, &prefix) || !bucket[0]) {
    free(bucket), free(prefix);
    return ct_errf(err, CT_ERR_INVALID, "output_dir '%s' must be s3://bucket/prefix",
                   cfg->output_dir);
  }
  const char *as = cfg->output_aws_addressing_style ? cfg->output_aws_addressing_style : "auto";
  ct_s3_config c = {.bucket = bucket,
                    .prefix = prefix,
                    .endpoint = cfg->output_aws_endpoint_url,
                    .region = cfg->output_aws_region_name,
                    .addressing = !strcmp(as, "path")      ? CT_S3_ADDR_PATH
                                  : !strcmp(as, "virtual") ? CT_S3_ADDR_VIRTUAL
                                                           : CT_S3_ADDR_AUTO,
                    .max_connections = 16,
                    .name = "output_dir"};
  ct_remote *r = calloc(1, sizeof *r);
  ct_status st = r ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  if (!st && connect) st = ct_storage_open_s3(&c, &r->s, err);
  if (!st) {
    r->url = strdup(cfg->output_dir);
    if (cfg->output_dir_local)
      *local = strdup(cfg->output_dir_local);
    else {
      size_t n = strlen(bucket) + strlen(prefix) + 16;
      *local = malloc(n);
      if (*local) snprintf(*local, n, "s3-output/%s%s%s", bucket, prefix[0] ? "/" : "", prefix);
    }
    if (!r->url || !*local) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  free(bucket), free(prefix);
  if (st) {
    ct_remote_free(r);
    free(*local);
    *local = NULL;
    return st;
  }
  if (!connect) ct_remote_free(r), r = NULL;
  *out = r;
  return CT_OK;
}

void ct_remote_free(ct_remote *r) {
  if (!r) return;
  ct_storage_free(r->s);
  free(r->url);
  free(r);
}

/* "checkpoint-<digits>/.guard" -> step, else -1. */
static long guard_step(const char *key) {
  const char *slash = strchr(key, '/');
  if (!slash || strcmp(slash, "/.guard") || slash - key > 40) return -1;
  char dir[48];
  memcpy(dir, key, (size_t)(slash - key));
  dir[slash - key] = 0;
  return ct_checkpoint_step(dir);
}

static int cmp_long(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return (x > y) - (x < y);
}

/* Steps of the remote checkpoints whose .guard says "complete", ascending. */
static ct_status remote_steps(ct_remote *r, long **steps, size_t *n, ct_err *err) {
  *steps = NULL;
  *n = 0;
  ct_storage_list l;
  ct_status st = ct_storage_list_dir(r->s, "", &l, err);
  if (st) return st;
  size_t ng = 0;
  for (size_t i = 0; i < l.n; i++) ng += guard_step(l.keys[i]) >= 0;
  long *v = calloc(ng ? ng : 1, sizeof *v);
  ct_storage_req *q = calloc(ng ? ng : 1, sizeof *q);
  if (!v || !q) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  size_t k = 0;
  for (size_t i = 0; !st && i < l.n; i++)
    if (guard_step(l.keys[i]) >= 0)
      q[k].key = l.keys[i], q[k].max = 64, v[k++] = guard_step(l.keys[i]);
  if (!st && k) st = ct_storage_get_many(r->s, q, k, err);
  size_t m = 0;
  for (size_t i = 0; !st && i < k; i++)
    if (q[i].st == CT_OK && !strncmp(q[i].data, CT_CKPT_GUARD, strlen(CT_CKPT_GUARD)))
      v[m++] = v[i];
  for (size_t i = 0; i < k; i++) free(q[i].data);
  free(q);
  ct_storage_list_free(&l);
  if (st) return free(v), st;
  qsort(v, m, sizeof *v, cmp_long);
  *steps = v;
  *n = m;
  return CT_OK;
}

/* Delete checkpoint-<step> remotely: the .guard first, so a half-deleted
 * checkpoint is never taken for a complete one. */
static ct_status remote_delete(ct_remote *r, long step, ct_err *err) {
  char dir[64], g[80];
  snprintf(dir, sizeof dir, "checkpoint-%ld", step);
  snprintf(g, sizeof g, "%s/.guard", dir);
  ct_status st = ct_storage_delete(r->s, g, err);
  ct_storage_list l;
  if (!st) st = ct_storage_list_dir(r->s, dir, &l, err);
  if (st) return st;
  for (size_t i = 0; !st && i < l.n; i++) st = ct_storage_delete(r->s, l.keys[i], err);
  ct_storage_list_free(&l);
  return st;
}

ct_status ct_remote_pull_latest(ct_remote *r, const char *local_out, long *step, ct_err *err) {
  *step = 0;
  long *steps = NULL;
  size_t n = 0;
  ct_status st = remote_steps(r, &steps, &n, err);
  if (st) {
    ct_err_prefix(err, "resume from %s: ", r->url);
    return st;
  }
  long newest = n ? steps[n - 1] : -1;
  free(steps);
  if (newest < 0) return CT_OK;
  char lp[4096];
  long ls = -1;
  ct_err e2 = {0};
  if (ct_checkpoint_latest(local_out, lp, sizeof lp, &ls, &e2) != CT_OK) ls = -1;
  if (ls >= newest) {
    CT_INFO("%s: newest remote checkpoint-%ld is not newer than the local checkpoint-%ld", r->url,
            newest, ls);
    return CT_OK;
  }
  char dir[64], tmp[4200], fin[4200];
  snprintf(dir, sizeof dir, "checkpoint-%ld", newest);
  if (ct_pathf(tmp, sizeof tmp, "%s/%s-tmp", local_out, dir) ||
      ct_pathf(fin, sizeof fin, "%s/%s", local_out, dir))
    return ct_errf(err, CT_ERR_RANGE, "output_dir_local path is too long: %s", local_out);
  ct_storage_list l;
  st = ct_storage_list_dir(r->s, dir, &l, err);
  if (st) return st;
  ct_rm_rf(tmp, NULL);
  ct_storage *loc = NULL;
  st = ct_mkdir_p(tmp, err);
  if (!st) st = ct_storage_open_local(tmp, &loc, err);
  size_t plen = strlen(dir) + 1;
  uint64_t total = 0;
  /* batches bounded in files and bytes */
  for (size_t i = 0; !st && i < l.n;) {
    ct_storage_req q[BATCH_FILES];
    size_t k = 0, bytes = 0;
    while (i < l.n && k < BATCH_FILES && (k == 0 || bytes + l.sizes[i] <= BATCH_BYTES)) {
      if (strcmp(l.keys[i] + plen, ".guard")) {
        q[k] = (ct_storage_req){.key = l.keys[i], .max = (size_t)l.sizes[i] + 1};
        bytes += l.sizes[i];
        k++;
      }
      i++;
    }
    if (!k) continue;
    st = ct_storage_get_many(r->s, q, k, err);
    for (size_t j = 0; !st && j < k; j++) {
      if (q[j].st == CT_ERR_NOT_FOUND)
        st = ct_errf(err, CT_ERR_NOT_FOUND, "%s/%s vanished while downloading checkpoint-%ld",
                     r->url, q[j].key, newest);
      else
        st = ct_storage_put(loc, q[j].key + plen, q[j].data, q[j].n, 1, err);
      total += q[j].n;
    }
    for (size_t j = 0; j < k; j++) free(q[j].data);
  }
  ct_storage_list_free(&l);
  ct_storage_free(loc);
  if (!st) {
    ct_rm_rf(fin, NULL); /* an unguarded leftover of the same step */
    if (rename(tmp, fin) != 0)
      st = ct_errf(err, CT_ERR_IO, "cannot rename %s to %s: %s", tmp, fin, strerror(errno));
  }
  if (!st) st = ct_fsync_dir(local_out, err);
  if (!st) {
    char g[4300];
    if (ct_pathf(g, sizeof g, "%s/.guard", fin))
      st = ct_errf(err, CT_ERR_RANGE, "path too long: %s", fin);
    else
      st = ct_write_file_atomic(g, CT_CKPT_GUARD, strlen(CT_CKPT_GUARD), err);
  }
  if (st) {
    ct_rm_rf(tmp, NULL);
    ct_err_prefix(err, "downloading checkpoint-%ld from %s: ", newest, r->url);
    return st;
  }
  CT_INFO("pulled checkpoint-%ld (%.1f MB) from %s into %s", newest, (double)total / 1e6, r->url,
          fin);
  *step = newest;
  return CT_OK;
}

/* Upload every file under local dir `from` to remote `to_dir` (except skip),
 * in bounded batches over the pool. */
static ct_status push_tree(ct_remote *r, const char *from, const char *to_dir, const char *skip,
                           uint64_t *bytes, ct_err *err) {
  ct_storage *loc = NULL;
  ct_status st = ct_storage_open_local(from, &loc, err);
  ct_storage_list l = {0};
  if (!st) st = ct_storage_list_dir(loc, "", &l, err);
  for (size_t i = 0; !st && i < l.n;) {
    ct_storage_put_req q[BATCH_FILES];
    char *data[BATCH_FILES];
    char keys[BATCH_FILES][1024];
    size_t k = 0, sum = 0;
    while (!st && i < l.n && k < BATCH_FILES && (k == 0 || sum + l.sizes[i] <= BATCH_BYTES)) {
      const char *key = l.keys[i++];
      if (skip && !strcmp(key, skip)) continue;
      if (strstr(key, ".tmp.")) continue; /* another writer's temporary file */
      if (l.sizes[i - 1] > SINGLE_PUT_MAX) {
        st = ct_errf(err, CT_ERR_UNSUPPORTED,
                     "%s/%s: %.1f GB is over S3's 5 GiB limit for one PUT (multipart uploads "
                     "are not implemented)",
                     from, key, (double)l.sizes[i - 1] / 1e9);
        break;
      }
      if (ct_pathf(keys[k], sizeof keys[k], "%s%s%s", to_dir, to_dir[0] ? "/" : "", key)) {
        st = ct_errf(err, CT_ERR_RANGE, "key too long: %s/%s", to_dir, key);
        break;
      }
      size_t n = 0;
      st = ct_storage_get(loc, key, (size_t)SINGLE_PUT_MAX + 1, &data[k], &n, err);
      if (st) break;
      q[k] = (ct_storage_put_req){.key = keys[k], .data = data[k], .n = n};
      sum += n;
      k++;
    }
    if (!st && k) st = ct_storage_put_many(r->s, q, k, 1, err);
    if (bytes) *bytes += sum;
    for (size_t j = 0; j < k; j++) free(data[j]);
  }
  ct_storage_list_free(&l);
  ct_storage_free(loc);
  return st;
}

/* Remote keys of checkpoint `name` the local directory does not have (a
 * re-upload of a step another run wrote: other ranks' fragments, say) are
 * deleted before the new files, so the .guard covers exactly this set. */
static ct_status drop_stale(ct_remote *r, const char *ckpt_dir, const char *name, ct_err *err) {
  ct_storage_list rl;
  ct_status st = ct_storage_list_dir(r->s, name, &rl, err);
  if (st || !rl.n) return ct_storage_list_free(&rl), st;
  ct_storage *loc = NULL;
  ct_storage_list ll = {0};
  st = ct_storage_open_local(ckpt_dir, &loc, err);
  if (!st) st = ct_storage_list_dir(loc, "", &ll, err);
  const size_t pn = strlen(name) + 1;
  for (size_t i = 0, j = 0; !st && i < rl.n; i++) {
    const char *k = rl.keys[i] + pn; /* both lists are sorted */
    while (j < ll.n && strcmp(ll.keys[j], k) < 0) j++;
    if (j < ll.n && !strcmp(ll.keys[j], k)) continue;
    CT_INFO("%s/%s: not in the local checkpoint; removed before the upload", r->url, rl.keys[i]);
    st = ct_storage_delete(r->s, rl.keys[i], err);
  }
  ct_storage_list_free(&ll);
  ct_storage_list_free(&rl);
  ct_storage_free(loc);
  return st;
}

ct_status ct_remote_push_checkpoint(ct_remote *r, const char *ckpt_dir, long limit, ct_err *err) {
  const char *name = strrchr(ckpt_dir, '/');
  name = name ? name + 1 : ckpt_dir;
  char g[128], lg[4200];
  struct stat sb;
  if (strncmp(name, "checkpoint-", 11) || strlen(name) > 60)
    return ct_errf(err, CT_ERR_INVALID, "%s is not a checkpoint directory", ckpt_dir);
  if (ct_pathf(lg, sizeof lg, "%s/.guard", ckpt_dir) || stat(lg, &sb) != 0)
    return ct_errf(err, CT_ERR_INVALID, "%s has no .guard: not a complete checkpoint, not uploaded",
                   ckpt_dir);
  snprintf(g, sizeof g, "%s/.guard", name);
  const long step = strtol(name + 11, NULL, 10);
  uint64_t bytes = 0;
  ct_status st =
      ct_storage_delete(r->s, g, err); /* a re-upload of the same step is unguarded until done */
  if (!st) st = drop_stale(r, ckpt_dir, name, err);
  if (!st) st = push_tree(r, ckpt_dir, name, ".guard", &bytes, err);
  if (!st) st = ct_storage_put(r->s, g, CT_CKPT_GUARD, strlen(CT_CKPT_GUARD), 1, err);
  if (st) {
    ct_err_prefix(err, "uploading %s to %s: ", name, r->url);
    return st;
  }
  CT_INFO("uploaded %s (%.1f MB) to %s", name, (double)bytes / 1e6, r->url);
  if (limit <= 0) return CT_OK;
  long *steps = NULL;
  size_t n = 0;
  st = remote_steps(r, &steps, &n, err);
  /* the oldest go, never the one just uploaded; newer ones come from another run */
  size_t keep = n, newer = 0;
  for (size_t i = 0; !st && i < n; i++) newer += steps[i] > step;
  if (newer)
    CT_WARN(
        "%s holds %zu checkpoint(s) newer than checkpoint-%ld (another run's?); a resume takes the "
        "newest",
        r->url, newer, step);
  for (size_t i = 0; !st && keep > (size_t)limit && i < n; i++) {
    if (steps[i] == step) continue;
    st = remote_delete(r, steps[i], err);
    keep--;
    if (!st)
      CT_INFO("removed checkpoint-%ld from %s (checkpoints_total_limit %ld)", steps[i], r->url,
              limit);
  }
  free(steps);
  if (st) ct_err_prefix(err, "rotating checkpoints in %s: ", r->url);
  return st;
}

ct_status ct_remote_push_outputs(ct_remote *r, const char *local_out, ct_err *err) {
  char p[4200];
  ct_status st = CT_OK;
  if (!ct_pathf(p, sizeof p, "%s/metrics.jsonl", local_out) && access(p, R_OK) == 0) {
    char *d = NULL;
    size_t n = 0;
    st = ct_read_file(p, (size_t)SINGLE_PUT_MAX, &d, &n, err);
    if (!st) st = ct_storage_put(r->s, "metrics.jsonl", d, n, 1, err);
    free(d);
  }
  struct stat sb;
  if (!st && !ct_pathf(p, sizeof p, "%s/validation_images", local_out) && stat(p, &sb) == 0 &&
      S_ISDIR(sb.st_mode))
    st = push_tree(r, p, "validation_images", NULL, NULL, err);
  if (st) ct_err_prefix(err, "uploading outputs to %s: ", r->url);
  return st;
}

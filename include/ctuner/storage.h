/* Object storage behind one interface: a local directory or an S3-compatible
 * bucket (AWS S3, Cloudflare R2, MinIO, s3rver). docs/storage.md.
 *
 * A storage handle has a root (a directory, or a bucket plus a key prefix);
 * keys are relative to it, '/'-separated, never starting with '/' and never
 * holding "." or ".." segments. Objects are whole: a put replaces an object
 * atomically (a reader sees the old or the new bytes, never a mix).
 *
 * Missing objects are CT_ERR_NOT_FOUND (S3: 404) and carry no message worth
 * showing; every other failure names the storage (bucket, key, endpoint —
 * never a credential) and says what to do.
 *
 * The S3 backend signs with AWS Signature V4, keeps a pool of up to
 * max_connections connections, and retries 5xx, 429, timeouts and dropped
 * connections with exponential backoff and full jitter; other 4xx fail at
 * once. Handles are thread-safe: several threads may call at once.
 */
#ifndef CTUNER_STORAGE_H
#define CTUNER_STORAGE_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/status.h"

typedef struct ct_storage ct_storage;

typedef enum { CT_S3_ADDR_AUTO = 0, CT_S3_ADDR_PATH, CT_S3_ADDR_VIRTUAL } ct_s3_addressing;

/* Every string may be NULL/empty where it says so; the handle copies them. */
typedef struct ct_s3_config {
  const char *bucket;     /* required */
  const char *region;     /* NULL/empty: AWS_REGION, AWS_DEFAULT_REGION, else "auto" (R2) */
  const char *endpoint;   /* "http(s)://host[:port]"; NULL: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL,
                             else https://s3.<region>.amazonaws.com */
  const char *access_key; /* NULL: AWS_ACCESS_KEY_ID */
  const char *secret_key; /* NULL: AWS_SECRET_ACCESS_KEY */
  const char *session_token;   /* NULL: AWS_SESSION_TOKEN (only when the keys also came from the
                                  environment) */
  const char *prefix;          /* key prefix inside the bucket ("" or NULL: the bucket's root) */
  int max_connections;         /* the pool (0: 128, SimpleTuner's default) */
  ct_s3_addressing addressing; /* AUTO: virtual-hosted on AWS, path-style on any other endpoint */
  int max_retries;             /* retries after the first try (0: the default 6; < 0: none) */
  double timeout_s;            /* per request, connect to last byte (0: 60) */
  double backoff_s; /* first backoff (0: 0.2 s); attempt k sleeps U(0, min(cap, b*2^k)) */
  const char *name; /* for messages: e.g. "dataset 'photos'" (may be NULL) */
} ct_s3_config;

ct_status ct_storage_open_local(const char *root, ct_storage **out, ct_err *err);
ct_status ct_storage_open_s3(const ct_s3_config *c, ct_storage **out, ct_err *err);
void ct_storage_free(ct_storage *s);

/* 1 for S3. */
int ct_storage_is_remote(const ct_storage *s);
/* For messages: the local root, or "s3://bucket/prefix at endpoint". */
const char *ct_storage_describe(const ct_storage *s);
/* The local path of key (local backends only; NULL for S3): for code that
 * must hand a path to a library (the parquet reader maps the file). */
int ct_storage_local_path(const ct_storage *s, const char *key, char *buf, size_t n);

/* Whole object: NUL-terminated, malloc'd. CT_ERR_RANGE if larger than max. */
ct_status ct_storage_get(ct_storage *s, const char *key, size_t max, char **data, size_t *n,
                         ct_err *err);
/* Bytes [off, off+len) (fewer at the end of the object; 0 bytes past it). */
ct_status ct_storage_get_range(ct_storage *s, const char *key, uint64_t off, size_t len,
                               char **data, size_t *n, ct_err *err);
/* Create or replace. durable: local writes fsync (checkpoints); S3 puts are
 * durable when they return either way. */
ct_status ct_storage_put(ct_storage *s, const char *key, const void *data, size_t n, int durable,
                         ct_err *err);
/* Size of an object; CT_ERR_NOT_FOUND if missing. */
ct_status ct_storage_head(ct_storage *s, const char *key, uint64_t *size, ct_err *err);
/* Missing is not an error. */
ct_status ct_storage_delete(ct_storage *s, const char *key, ct_err *err);

/* Every object under dir ("" = the root; "a/b" lists "a/b/..."), recursively,
 * sorted bytewise; keys relative to the root. S3 lists only under the prefix
 * (ListObjectsV2, paginated). */
typedef struct ct_storage_list {
  char **keys;
  uint64_t *sizes;
  size_t n;
} ct_storage_list;
ct_status ct_storage_list_dir(ct_storage *s, const char *dir, ct_storage_list *out, ct_err *err);
void ct_storage_list_free(ct_storage_list *l);

/* Many reads at once: S3 runs them over the connection pool, the local
 * backend one after another. Each request has its own result; the call's
 * status is the first failure that is not CT_ERR_NOT_FOUND (CT_OK when every
 * request succeeded or was missing). len 0: the whole object. */
typedef struct ct_storage_req {
  const char *key;
  uint64_t off;
  size_t len;
  size_t max; /* whole-object reads: CT_ERR_RANGE past it (0: 1 GiB) */
  /* results */
  char *data; /* malloc'd, NUL-terminated; the caller frees */
  size_t n;
  ct_status st;
} ct_storage_req;
ct_status ct_storage_get_many(ct_storage *s, ct_storage_req *r, size_t n, ct_err *err);

/* Many writes at once (the S3 pool; the local backend in turn). Each request
 * has its own status; the call returns the first failure. */
typedef struct ct_storage_put_req {
  const char *key;
  const void *data;
  size_t n;
  ct_status st; /* result */
} ct_storage_put_req;
ct_status ct_storage_put_many(ct_storage *s, ct_storage_put_req *r, size_t n, int durable,
                              ct_err *err);

/* Transfer statistics since open (S3: requests sent, including retries). */
typedef struct ct_storage_stats {
  uint64_t requests, retries, bytes_in, bytes_out;
} ct_storage_stats;
void ct_storage_get_stats(const ct_storage *s, ct_storage_stats *out);

/* Parse "s3://bucket/prefix" into bucket and prefix (malloc'd); 0 if s is not
 * an s3:// URL. */
int ct_storage_parse_s3_url(const char *s, char **bucket, char **prefix);

/* 1 if key is a valid key: relative, '/'-separated, no empty, "." or ".."
 * segment. */
int ct_storage_key_ok(const char *key);

/* AWS Signature V4 of one request (exposed for tests against AWS's published
 * examples). headers: n "name:value" pairs (lowercase names, trimmed values)
 * that are signed, sorted or not; payload_hash: hex SHA-256 of the body or
 * "UNSIGNED-PAYLOAD". Writes the Authorization header value. */
ct_status ct_sigv4_authorization(const char *method, const char *canonical_uri,
                                 const char *canonical_query, const char *const *headers, int nh,
                                 const char *payload_hash, const char *amz_date, const char *region,
                                 const char *service, const char *access_key,
                                 const char *secret_key, char *out, size_t out_n, ct_err *err);

#endif

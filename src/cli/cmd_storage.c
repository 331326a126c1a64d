/* `ctuner storage ls|get|put|rm|sync|bench`: objects in an S3-compatible
 * bucket or a local directory, through the storage interface
 * (ctuner/storage.h, docs/storage.md) — for users checking a bucket before
 * training, and for the storage tests and benchmark.
 *
 * A location is "s3://bucket/prefix/key" or a local path. Credentials come
 * only from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
 * AWS_SESSION_TOKEN), never from a flag, and are never printed. The handle is
 * thread-safe, so `sync` and `bench` upload from a few threads at once (the
 * interface has get_many but no put_many). Not here: downloads of a whole
 * prefix, multipart uploads, anything that needs more than the interface. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "ctuner/fs.h"
#include "ctuner/parallel.h"
#include "ctuner/storage.h"

#define GET_MAX ((size_t)16 << 30)
#define PUT_MAX ((size_t)5 << 30) /* one S3 PUT */
#define SYNC_MAX_FILES 10000000

void ct_cmd_storage_help(FILE *f) {
  fprintf(
      f,
      "usage: ctuner storage ls URL                     every object under URL (recursive): size, "
      "key\n"
      "       ctuner storage get URL [--out FILE]       one object to FILE (default: stdout)\n"
      "       ctuner storage put FILE URL               one file as the object URL\n"
      "       ctuner storage rm URL                     delete one object (missing is not an "
      "error)\n"
      "       ctuner storage sync DIR URL [--jobs N]    upload a directory tree under URL, N puts "
      "at once\n"
      "       ctuner storage bench URL [--count N] [--size BYTES] [--pools 32,1]\n"
      "                                                 upload N objects under URL (once), then "
      "time\n"
      "                                                 fetching all of them with each pool size\n"
      "\n"
      "URL: s3://BUCKET/KEY or a local path. S3 options (any subcommand):\n"
      "  --endpoint URL        http(s)://host[:port] (default: AWS_ENDPOINT_URL_S3, "
      "AWS_ENDPOINT_URL,\n"
      "                        else https://s3.REGION.amazonaws.com)\n"
      "  --region R            (default: AWS_REGION, AWS_DEFAULT_REGION, else auto)\n"
      "  --addressing path|virtual|auto   (auto: virtual-hosted on AWS, path-style elsewhere)\n"
      "  --pool N              connections (default 128)   --retries N   retries after the first "
      "try (default 6)\n"
      "  --timeout S           per request (default 60)\n"
      "Credentials come only from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and\n"
      "AWS_SESSION_TOKEN in the environment.\n"
      "\n"
      "bench prints one JSON line: objects/s per pool size and the ratio of the first\n"
      "pool size to the last. Exit status: 0 done, 1 failed (the message names bucket,\n"
      "key and endpoint), 2 bad usage.\n");
}

typedef struct {
  const char *endpoint, *region;
  ct_s3_addressing addressing;
  long pool, retries;
  double timeout;
} s3opts;

/* A location: an opened handle whose root is the URL's bucket (+ prefix when
 * as_dir) or directory, and the key of the object inside it. */
typedef struct {
  ct_storage *s;
  char *bucket; /* NULL: local */
  char *key;    /* object key ("" for a directory root) */
  char what[4200];
} loc;

static void loc_free(loc *l) {
  ct_storage_free(l->s);
  free(l->bucket);
  free(l->key);
  memset(l, 0, sizeof *l);
}

/* Open url. as_dir: the whole URL is the root (ls, sync, bench); else the
 * root is the bucket (S3) or the parent directory (local) and key the rest.
 * Prints the error; returns 1 (failure) or 2 (usage). */
static int loc_open(const char *cmd, const char *url, int as_dir, const s3opts *o, int pool,
                    loc *l) {
  memset(l, 0, sizeof *l);
  ct_err err = {0};
  char *bucket = NULL, *prefix = NULL;
  ct_status st;
  if (ct_storage_parse_s3_url(url, &bucket, &prefix)) {
    if (!bucket || !bucket[0]) {
      fprintf(stderr, "ctuner storage %s: %s: no bucket (expected s3://BUCKET/KEY)\n", cmd, url);
      free(bucket), free(prefix);
      return 2;
    }
    size_t pl = prefix ? strlen(prefix) : 0;
    while (pl && prefix[pl - 1] == '/') prefix[--pl] = '\0';
    if (!as_dir && !pl) {
      fprintf(stderr, "ctuner storage %s: %s: no key (expected s3://BUCKET/KEY)\n", cmd, url);
      free(bucket), free(prefix);
      return 2;
    }
    ct_s3_config c = {0};
    c.bucket = bucket;
    c.region = o->region;
    c.endpoint = o->endpoint;
    c.prefix = as_dir ? prefix : "";
    c.max_connections = pool > 0 ? pool : (int)o->pool;
    c.addressing = o->addressing;
    c.max_retries = (int)o->retries;
    c.timeout_s = o->timeout;
    st = ct_storage_open_s3(&c, &l->s, &err);
    l->bucket = bucket;
    l->key = as_dir ? strdup("") : prefix;
    if (as_dir) free(prefix);
    snprintf(l->what, sizeof l->what, "s3://%s/%s", bucket, as_dir ? "" : l->key);
  } else {
    free(bucket), free(prefix);
    if (as_dir) {
      st = ct_storage_open_local(url, &l->s, &err);
      l->key = strdup("");
    } else {
      const char *slash = strrchr(url, '/');
      char dir[4096];
      if (!slash)
        snprintf(dir, sizeof dir, ".");
      else if (slash == url)
        snprintf(dir, sizeof dir, "/");
      else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - url), url);
      l->key = strdup(slash ? slash + 1 : url);
      st = ct_storage_open_local(dir, &l->s, &err);
    }
    snprintf(l->what, sizeof l->what, "%s", url);
  }
  if (!st && !l->key) st = ct_errf(&err, CT_ERR_NOMEM, "out of memory");
  if (st) {
    fprintf(stderr, "ctuner storage %s: %s\n", cmd, err.msg);
    loc_free(l);
    return 1;
  }
  return 0;
}

/* The error of a failed call on l: a missing object gets a message here
 * (the library leaves it empty). */
static int fail(const char *cmd, const loc *l, ct_status st, const ct_err *err) {
  if (st == CT_ERR_NOT_FOUND && !err->msg[0])
    fprintf(stderr, "ctuner storage %s: %s: not found (%s)\n", cmd, l->what,
            ct_storage_describe(l->s));
  else
    fprintf(stderr, "ctuner storage %s: %s\n", cmd, err->msg);
  return 1;
}

static int cmd_ls(const char *url, const s3opts *o) {
  loc l;
  int rc = loc_open("ls", url, 1, o, 0, &l);
  if (rc) return rc;
  ct_err err = {0};
  ct_storage_list list = {0};
  ct_status st = ct_storage_list_dir(l.s, "", &list, &err);
  if (st) {
    rc = fail("ls", &l, st, &err);
  } else {
    for (size_t i = 0; i < list.n; i++) printf("%12" PRIu64 "  %s\n", list.sizes[i], list.keys[i]);
  }
  ct_storage_list_free(&list);
  loc_free(&l);
  return rc;
}

static int cmd_get(const char *url, const char *out, const s3opts *o) {
  loc l;
  int rc = loc_open("get", url, 0, o, 0, &l);
  if (rc) return rc;
  ct_err err = {0};
  char *data = NULL;
  size_t n = 0;
  ct_status st = ct_storage_get(l.s, l.key, GET_MAX, &data, &n, &err);
  if (st) {
    rc = fail("get", &l, st, &err);
  } else if (out) {
    if ((st = ct_write_file_replace(out, data, n, &err))) {
      fprintf(stderr, "ctuner storage get: %s\n", err.msg);
      rc = 1;
    }
  } else if (fwrite(data, 1, n, stdout) != n || fflush(stdout)) {
    fprintf(stderr, "ctuner storage get: writing to stdout: %s\n", strerror(errno));
    rc = 1;
  }
  free(data);
  loc_free(&l);
  return rc;
}

static int cmd_put(const char *file, const char *url, const s3opts *o) {
  ct_err err = {0};
  char *data = NULL;
  size_t n = 0;
  if (ct_read_file(file, PUT_MAX, &data, &n, &err)) {
    fprintf(stderr, "ctuner storage put: %s\n", err.msg);
    return 1;
  }
  loc l;
  int rc = loc_open("put", url, 0, o, 0, &l);
  if (!rc) {
    ct_status st = ct_storage_put(l.s, l.key, data, n, 0, &err);
    if (st) rc = fail("put", &l, st, &err);
    loc_free(&l);
  }
  free(data);
  return rc;
}

static int cmd_rm(const char *url, const s3opts *o) {
  loc l;
  int rc = loc_open("rm", url, 0, o, 0, &l);
  if (rc) return rc;
  ct_err err = {0};
  ct_status st = ct_storage_delete(l.s, l.key, &err);
  if (st) rc = fail("rm", &l, st, &err);
  loc_free(&l);
  return rc;
}

/* ---- parallel puts (sync, bench) ---- */

typedef struct {
  ct_storage *s;
  char **keys;    /* (n) */
  char **paths;   /* (n) local files, or NULL: bench objects made from the index */
  size_t n, size; /* size: bench object bytes */
  size_t next;    /* guarded by mu */
  uint64_t bytes; /* guarded by mu */
  ct_status st;   /* first failure, guarded by mu */
  ct_err err;     /* its message */
  pthread_mutex_t mu;
} putjob;

/* The bench object i: its index, then a byte pattern from it. */
static void bench_fill(char *buf, size_t size, size_t i) {
  for (size_t j = 0; j < size; j++) buf[j] = (char)('a' + (i * 7 + j) % 26);
  char head[32];
  int hn = snprintf(head, sizeof head, "%zu:", i);
  memcpy(buf, head, (size_t)hn < size ? (size_t)hn : size);
}

static void *put_worker(void *arg) {
  putjob *j = arg;
  char *buf = j->paths ? NULL : malloc(j->size ? j->size : 1);
  for (;;) {
    pthread_mutex_lock(&j->mu);
    size_t i = j->next++;
    int stop = j->st != CT_OK || i >= j->n;
    if (!buf && !j->paths && !j->st)
      j->st = ct_errf(&j->err, CT_ERR_NOMEM, "out of memory"), stop = 1;
    pthread_mutex_unlock(&j->mu);
    if (stop) break;
    ct_err err = {0};
    char *data = buf;
    size_t n = j->size;
    ct_status st = CT_OK;
    if (j->paths)
      st = ct_read_file(j->paths[i], PUT_MAX, &data, &n, &err);
    else
      bench_fill(buf, n, i);
    if (!st) st = ct_storage_put(j->s, j->keys[i], data, n, 0, &err);
    if (j->paths) free(data);
    pthread_mutex_lock(&j->mu);
    if (st && !j->st) j->st = st, j->err = err;
    if (!st) j->bytes += n;
    pthread_mutex_unlock(&j->mu);
  }
  free(buf);
  return NULL;
}

/* Put j's objects from `jobs` threads; CT_OK or the first failure (in j->err). */
static ct_status put_all(putjob *j, int jobs) {
  pthread_t th[64];
  int nt = jobs < 1 ? 1 : jobs > 64 ? 64 : jobs;
  if ((size_t)nt > j->n) nt = j->n ? (int)j->n : 1;
  pthread_mutex_init(&j->mu, NULL);
  int started = 0;
  for (; started < nt; started++)
    if (pthread_create(&th[started], NULL, put_worker, j)) break;
  if (!started) put_worker(j);
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  pthread_mutex_destroy(&j->mu);
  return j->st;
}

typedef struct {
  char **keys, **paths;
  size_t n, cap;
} filelist;

static void filelist_free(filelist *f) {
  for (size_t i = 0; i < f->n; i++) free(f->keys[i]), free(f->paths[i]);
  free(f->keys);
  free(f->paths);
}

/* Every regular file under dir/rel, recursively (symlinks to files followed,
 * to directories not); rel "" at the top. Prints the error; -1 on failure. */
static int walk(const char *dir, const char *rel, filelist *f, int depth) {
  char path[4096];
  if (ct_pathf(path, sizeof path, "%s%s%s", dir, rel[0] ? "/" : "", rel)) {
    fprintf(stderr, "ctuner storage sync: path too long under %s\n", dir);
    return -1;
  }
  if (depth > 64) {
    fprintf(stderr, "ctuner storage sync: %s: directories nested too deep\n", path);
    return -1;
  }
  DIR *d = opendir(path);
  if (!d) {
    fprintf(stderr, "ctuner storage sync: cannot open directory %s: %s\n", path, strerror(errno));
    return -1;
  }
  int rc = 0;
  struct dirent *e;
  while (!rc && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char r[4096], p[4096];
    struct stat sb, lb;
    if (ct_pathf(r, sizeof r, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name) ||
        ct_pathf(p, sizeof p, "%s/%s", path, e->d_name)) {
      fprintf(stderr, "ctuner storage sync: path too long under %s\n", path);
      rc = -1;
    } else if (lstat(p, &lb) || stat(p, &sb)) {
      fprintf(stderr, "ctuner storage sync: %s: %s\n", p, strerror(errno));
      rc = -1;
    } else if (S_ISDIR(sb.st_mode)) {
      if (!S_ISLNK(lb.st_mode)) rc = walk(dir, r, f, depth + 1);
    } else if (S_ISREG(sb.st_mode)) {
      if (f->n >= SYNC_MAX_FILES) {
        fprintf(stderr, "ctuner storage sync: more than %d files under %s\n", SYNC_MAX_FILES, dir);
        rc = -1;
      } else if (f->n == f->cap) {
        size_t nc = f->cap ? f->cap * 2 : 256;
        char **k = realloc(f->keys, nc * sizeof *k),
             **q = k ? realloc(f->paths, nc * sizeof *q) : NULL;
        if (k) f->keys = k;
        if (q) f->paths = q, f->cap = nc;
        if (!k || !q) fprintf(stderr, "ctuner storage sync: out of memory\n"), rc = -1;
      }
      if (!rc && S_ISREG(sb.st_mode)) {
        f->keys[f->n] = strdup(r);
        f->paths[f->n] = strdup(p);
        if (!f->keys[f->n] || !f->paths[f->n]) {
          free(f->keys[f->n]), free(f->paths[f->n]);
          fprintf(stderr, "ctuner storage sync: out of memory\n");
          rc = -1;
        } else {
          f->n++;
        }
      }
    }
  }
  closedir(d);
  return rc;
}

static int cmd_sync(const char *dir, const char *url, long jobs, const s3opts *o) {
  filelist f = {0};
  if (walk(dir, "", &f, 0)) {
    filelist_free(&f);
    return 1;
  }
  loc l;
  int rc = loc_open("sync", url, 1, o, 0, &l);
  if (rc) {
    filelist_free(&f);
    return rc;
  }
  double t0 = ct_time_now();
  putjob j = {.s = l.s, .keys = f.keys, .paths = f.paths, .n = f.n};
  ct_status st = put_all(&j, (int)jobs);
  double dt = ct_time_now() - t0;
  if (st) {
    rc = fail("sync", &l, st, &j.err);
  } else {
    ct_storage_stats ss;
    ct_storage_get_stats(l.s, &ss);
    printf("{\"files\": %zu, \"bytes\": %" PRIu64 ", \"seconds\": %.3f, \"requests\": %" PRIu64
           ", \"retries\": %" PRIu64 ", \"to\": ",
           f.n, j.bytes, dt, ss.requests, ss.retries);
    ct_cli_json_str(stdout, url);
    printf("}\n");
  }
  loc_free(&l);
  filelist_free(&f);
  return rc;
}

/* ---- bench ---- */

static int bench_keys(size_t count, char ***keys) {
  *keys = calloc(count ? count : 1, sizeof **keys);
  if (!*keys) return -1;
  for (size_t i = 0; i < count; i++) {
    char k[32];
    snprintf(k, sizeof k, "obj-%06zu", i);
    if (!((*keys)[i] = strdup(k))) return -1;
  }
  return 0;
}

static int cmd_bench(const char *url, long count, long size, const char *pools_s, const s3opts *o) {
  long pools[16];
  int np = 0;
  for (const char *p = pools_s; *p && np < 16;) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno || end == p || v < 1 || v > 1024 || (*end && *end != ',')) {
      fprintf(stderr,
              "ctuner storage bench: --pools=%s: expected pool sizes in [1, 1024], e.g. 32,1\n",
              pools_s);
      return 2;
    }
    pools[np++] = v;
    p = *end ? end + 1 : end;
  }
  if (!np) {
    fprintf(stderr, "ctuner storage bench: --pools: expected pool sizes, e.g. 32,1\n");
    return 2;
  }
  long maxpool = 1;
  for (int i = 0; i < np; i++) maxpool = pools[i] > maxpool ? pools[i] : maxpool;
  char **keys = NULL;
  ct_storage_req *req = NULL;
  int rc = 0;
  ct_err err = {0};
  ct_status st = CT_OK;
  loc l = {0};
  double objs[16] = {0};
  size_t uploaded = 0;
  if (bench_keys((size_t)count, &keys)) {
    fprintf(stderr, "ctuner storage bench: out of memory\n");
    rc = 1;
    goto out;
  }
  /* Upload once: skip when every object is already there with its size. */
  if ((rc = loc_open("bench", url, 1, o, (int)maxpool, &l))) goto out;
  ct_storage_list list = {0};
  if ((st = ct_storage_list_dir(l.s, "", &list, &err))) {
    rc = fail("bench", &l, st, &err);
    goto out;
  }
  size_t have = 0;
  for (size_t i = 0; i < list.n; i++)
    if (!strncmp(list.keys[i], "obj-", 4) && list.sizes[i] == (uint64_t)size &&
        strlen(list.keys[i]) == 10 && strtoul(list.keys[i] + 4, NULL, 10) < (unsigned long)count)
      have++;
  ct_storage_list_free(&list);
  if (have != (size_t)count) {
    putjob j = {.s = l.s, .keys = keys, .n = (size_t)count, .size = (size_t)size};
    if ((st = put_all(&j, maxpool < 16 ? (int)maxpool : 16))) {
      rc = fail("bench", &l, st, &j.err);
      goto out;
    }
    uploaded = (size_t)count;
  }
  loc_free(&l);
  req = calloc((size_t)count, sizeof *req);
  char *want = malloc((size_t)size ? (size_t)size : 1);
  if (!req || !want) {
    free(want);
    fprintf(stderr, "ctuner storage bench: out of memory\n");
    rc = 1;
    goto out;
  }
  printf("{\"url\": ");
  ct_cli_json_str(stdout, url);
  printf(", \"count\": %ld, \"size\": %ld, \"uploaded\": %zu, \"runs\": [", count, size, uploaded);
  for (int p = 0; p < np && !rc; p++) {
    if ((rc = loc_open("bench", url, 1, o, (int)pools[p], &l))) break;
    for (long i = 0; i < count; i++) req[i] = (ct_storage_req){.key = keys[i]};
    double t0 = ct_time_now();
    st = ct_storage_get_many(l.s, req, (size_t)count, &err);
    double dt = ct_time_now() - t0;
    for (long i = 0; i < count && !st; i++) {
      bench_fill(want, (size_t)size, (size_t)i);
      if (req[i].st)
        st = req[i].st, err.msg[0] = '\0';
      else if (req[i].n != (size_t)size || memcmp(req[i].data, want, (size_t)size))
        st = ct_errf(&err, CT_ERR_IO,
                     "%s/%s: %zu bytes, not the %ld written by the benchmark (rerun it)",
                     ct_storage_describe(l.s), keys[i], req[i].n, size);
    }
    for (long i = 0; i < count; i++) free(req[i].data);
    if (st) {
      printf("]}\n");
      fflush(stdout);
      rc = fail("bench", &l, st, &err);
      break;
    }
    ct_storage_stats ss;
    ct_storage_get_stats(l.s, &ss);
    objs[p] = dt > 0 ? (double)count / dt : 0;
    printf(
        "%s{\"pool\": %ld, \"seconds\": %.3f, \"objects_per_s\": %.1f, \"mb_per_s\": %.2f, "
        "\"requests\": %" PRIu64 ", \"retries\": %" PRIu64 "}",
        p ? ", " : "", pools[p], dt, objs[p], dt > 0 ? (double)count * (double)size / dt / 1e6 : 0,
        ss.requests, ss.retries);
    loc_free(&l);
  }
  free(want);
  if (!rc)
    printf("], \"ratio\": %.2f, \"ratio_of\": \"pool %ld vs pool %ld\"}\n",
           objs[np - 1] > 0 ? objs[0] / objs[np - 1] : 0, pools[0], pools[np - 1]);
out:
  loc_free(&l);
  if (keys)
    for (long i = 0; i < count; i++) free(keys[i]);
  free(keys);
  free(req);
  return rc;
}

/* Every storage subcommand (the table checked argv[1]): they share the options. */
int ct_cmd_storage(int argc, char **argv) {
  const char *sub = argv[1];
  s3opts o = {.addressing = CT_S3_ADDR_AUTO};
  const char *addr = NULL, *pool = NULL, *retries = NULL, *timeout = NULL, *out = NULL,
             *jobs_s = NULL;
  const char *count_s = NULL, *size_s = NULL, *pools = "32,1";
  const char *pos[2];
  int npos = 0;
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_storage_help(stdout);
      return 0;
    } else if ((r = ct_cli_opt(argc, argv, &i, "endpoint", &o.endpoint)) ||
               (r = ct_cli_opt(argc, argv, &i, "region", &o.region)) ||
               (r = ct_cli_opt(argc, argv, &i, "addressing", &addr)) ||
               (r = ct_cli_opt(argc, argv, &i, "pools", &pools)) ||
               (r = ct_cli_opt(argc, argv, &i, "pool", &pool)) ||
               (r = ct_cli_opt(argc, argv, &i, "retries", &retries)) ||
               (r = ct_cli_opt(argc, argv, &i, "timeout", &timeout)) ||
               (r = ct_cli_opt(argc, argv, &i, "out", &out)) ||
               (r = ct_cli_opt(argc, argv, &i, "jobs", &jobs_s)) ||
               (r = ct_cli_opt(argc, argv, &i, "count", &count_s)) ||
               (r = ct_cli_opt(argc, argv, &i, "size", &size_s))) {
      if (r < 0) return 2;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "ctuner storage %s: unknown option '%s'%s\n", sub, argv[i],
              strstr(argv[i], "secret") || strstr(argv[i], "key") || strstr(argv[i], "token")
                  ? " (credentials come only from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                    "AWS_SESSION_TOKEN)"
                  : "");
      return 2;
    } else if (npos < 2) {
      pos[npos++] = argv[i];
    } else {
      fprintf(stderr, "ctuner storage %s: unexpected argument '%s'\n", sub, argv[i]);
      return 2;
    }
  }
  if (addr) {
    if (!strcmp(addr, "path"))
      o.addressing = CT_S3_ADDR_PATH;
    else if (!strcmp(addr, "virtual"))
      o.addressing = CT_S3_ADDR_VIRTUAL;
    else if (!strcmp(addr, "auto"))
      o.addressing = CT_S3_ADDR_AUTO;
    else {
      fprintf(stderr, "ctuner storage: --addressing=%s: expected path, virtual or auto\n", addr);
      return 2;
    }
  }
  long jobs = 8, count = 2000, size = 4096;
  if ((pool && ct_cli_int("pool", pool, 1, 1024, &o.pool)) ||
      (retries && ct_cli_int("retries", retries, 0, 100, &o.retries)) ||
      (timeout && ct_cli_float("timeout", timeout, &o.timeout)) ||
      (jobs_s && ct_cli_int("jobs", jobs_s, 1, 64, &jobs)) ||
      (count_s && ct_cli_int("count", count_s, 1, 10000000, &count)) ||
      (size_s && ct_cli_int("size", size_s, 0, 1L << 30, &size)))
    return 2;
  if (timeout && !(o.timeout > 0)) {
    fprintf(stderr, "ctuner storage: --timeout=%s: expected a positive number of seconds\n",
            timeout);
    return 2;
  }
  if (retries && o.retries == 0) o.retries = -1; /* the interface: 0 is the default, < 0 none */
  int want = !strcmp(sub, "put") || !strcmp(sub, "sync") ? 2 : 1;
  if (npos != want) {
    fprintf(stderr, "ctuner storage %s: expected %s\n", sub,
            want == 2 ? (!strcmp(sub, "put") ? "FILE URL" : "DIR URL") : "URL");
    ct_cmd_storage_help(stderr);
    return 2;
  }
  if (!strcmp(sub, "ls")) return cmd_ls(pos[0], &o);
  if (!strcmp(sub, "get")) return cmd_get(pos[0], out, &o);
  if (!strcmp(sub, "put")) return cmd_put(pos[0], pos[1], &o);
  if (!strcmp(sub, "rm")) return cmd_rm(pos[0], &o);
  if (!strcmp(sub, "sync")) return cmd_sync(pos[0], pos[1], jobs, &o);
  return cmd_bench(pos[0], count, size, pools, &o);
}

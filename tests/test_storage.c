/* Storage: AWS Signature V4 against AWS's published S3 examples, the local
 * backend's operations, S3 configuration errors (no server needed; the S3
 * protocol itself is tested end to end against s3rver in tests/cli_s3.sh). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/storage.h"
#include "harness.h"

#define AK "AKIAIOSFODNN7EXAMPLE"
#define SK "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
#define EMPTY_SHA "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* The examples of AWS's "Signature Calculations for the Authorization Header"
 * page (examplebucket, 2013-05-24, us-east-1). */
CT_TEST(storage, sigv4_aws_examples) {
  char out[512];
  ct_err err = {0};
  {
    const char *h[] = {"host:examplebucket.s3.amazonaws.com", "range:bytes=0-9",
                       "x-amz-content-sha256:" EMPTY_SHA, "x-amz-date:20130524T000000Z"};
    REQUIRE(!ct_sigv4_authorization("GET", "/test.txt", "", h, 4, EMPTY_SHA, "20130524T000000Z",
                                    "us-east-1", "s3", AK, SK, out, sizeof out, &err));
    CHECKF(
        !strcmp(
            out,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"),
        "%s", out);
  }
  {
    /* headers given unsorted: the signer sorts them */
    const char *h[] = {"x-amz-date:20130524T000000Z", "host:examplebucket.s3.amazonaws.com",
                       "x-amz-content-sha256:" EMPTY_SHA};
    REQUIRE(!ct_sigv4_authorization("GET", "/", "max-keys=2&prefix=J", h, 3, EMPTY_SHA,
                                    "20130524T000000Z", "us-east-1", "s3", AK, SK, out, sizeof out,
                                    &err));
    CHECKF(
        strstr(out, "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7") !=
            NULL,
        "%s", out);
  }
  {
    const char *body_sha = "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072";
    const char *h[] = {
        "date:Fri, 24 May 2013 00:00:00 GMT", "host:examplebucket.s3.amazonaws.com",
        "x-amz-content-sha256:44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072",
        "x-amz-date:20130524T000000Z", "x-amz-storage-class:REDUCED_REDUNDANCY"};
    REQUIRE(!ct_sigv4_authorization("PUT", "/test%24file.text", "", h, 5, body_sha,
                                    "20130524T000000Z", "us-east-1", "s3", AK, SK, out, sizeof out,
                                    &err));
    CHECKF(strstr(out,
                  "SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class, "
                  "Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd") !=
               NULL,
           "%s", out);
  }
}

CT_TEST(storage, local_backend) {
  char root[4096];
  snprintf(root, sizeof root, "%s/store", ct_test_tmpdir());
  ct_storage *s = NULL;
  ct_err err = {0};
  REQUIRE(!ct_storage_open_local(root, &s, &err));
  CHECK(!ct_storage_is_remote(s));
  CHECK(!ct_storage_put(s, "a/b/one.txt", "hello world", 11, 0, &err));
  CHECK(!ct_storage_put(s, "a/two.bin", "\0\1\2", 3, 1, &err));
  CHECK(!ct_storage_put(s, "z.txt", "", 0, 0, &err));
  char *d = NULL;
  size_t n = 0;
  REQUIRE(!ct_storage_get(s, "a/b/one.txt", 0, &d, &n, &err));
  CHECK(n == 11 && !memcmp(d, "hello world", 11) && d[11] == 0);
  free(d);
  REQUIRE(!ct_storage_get_range(s, "a/b/one.txt", 6, 100, &d, &n, &err));
  CHECK(n == 5 && !strcmp(d, "world"));
  free(d);
  REQUIRE(!ct_storage_get_range(s, "a/b/one.txt", 20, 4, &d, &n, &err));
  CHECK(n == 0);
  free(d);
  CHECK(ct_storage_get(s, "a/b/one.txt", 5, &d, &n, &err) == CT_ERR_RANGE);
  CHECK(ct_storage_get(s, "missing.txt", 0, &d, &n, &err) == CT_ERR_NOT_FOUND);
  uint64_t sz = 0;
  CHECK(!ct_storage_head(s, "a/two.bin", &sz, &err) && sz == 3);
  CHECK(ct_storage_head(s, "a", &sz, &err) == CT_ERR_NOT_FOUND); /* a directory is no object */
  ct_storage_list l;
  REQUIRE(!ct_storage_list_dir(s, "", &l, &err));
  CHECK(l.n == 3);
  if (l.n == 3) {
    CHECK(!strcmp(l.keys[0], "a/b/one.txt") && l.sizes[0] == 11);
    CHECK(!strcmp(l.keys[1], "a/two.bin") && !strcmp(l.keys[2], "z.txt"));
  }
  ct_storage_list_free(&l);
  REQUIRE(!ct_storage_list_dir(s, "a/b", &l, &err));
  CHECK(l.n == 1);
  ct_storage_list_free(&l);
  REQUIRE(!ct_storage_list_dir(s, "nothing/here", &l, &err));
  CHECK(l.n == 0);
  ct_storage_list_free(&l);
  /* many at once: per-request results */
  ct_storage_req r[3] = {
      {.key = "a/two.bin"}, {.key = "nope"}, {.key = "a/b/one.txt", .off = 0, .len = 5}};
  CHECK(!ct_storage_get_many(s, r, 3, &err));
  CHECK(r[0].st == CT_OK && r[0].n == 3 && r[1].st == CT_ERR_NOT_FOUND && r[2].st == CT_OK &&
        r[2].n == 5);
  for (int i = 0; i < 3; i++) free(r[i].data);
  CHECK(!ct_storage_delete(s, "a/two.bin", &err));
  CHECK(!ct_storage_delete(s, "a/two.bin", &err)); /* missing is fine */
  CHECK(ct_storage_head(s, "a/two.bin", &sz, &err) == CT_ERR_NOT_FOUND);
  /* keys that could leave the root are refused */
  const char *badk[] = {"/etc/passwd", "../x", "a/../../x", "a//b", "a/./b", "a/", ""};
  for (size_t i = 0; i < sizeof badk / sizeof *badk; i++) {
    CHECKF(ct_storage_put(s, badk[i], "x", 1, 0, &err) == CT_ERR_INVALID, "%s", badk[i]);
    CHECK(ct_storage_get(s, badk[i], 0, &d, &n, &err) == CT_ERR_INVALID);
  }
  CHECK(ct_storage_list_dir(s, "../", &l, &err) == CT_ERR_INVALID);
  ct_storage_stats stt;
  ct_storage_get_stats(s, &stt);
  CHECK(stt.requests > 0 && stt.bytes_out == 14);
  ct_storage_free(s);
}

CT_TEST(storage, s3_url_and_config_errors) {
  char *b, *p;
  CHECK(ct_storage_parse_s3_url("s3://bkt/some/prefix/", &b, &p) && !strcmp(b, "bkt") &&
        !strcmp(p, "some/prefix"));
  free(b), free(p);
  CHECK(ct_storage_parse_s3_url("s3://bkt", &b, &p) && !strcmp(b, "bkt") && !strcmp(p, ""));
  free(b), free(p);
  CHECK(!ct_storage_parse_s3_url("/local/dir", &b, &p));

  const char *secret = "Sup3rS3cretValue/xyz";
  ct_s3_config c = {.bucket = "data",
                    .endpoint = "http://127.0.0.1:9",
                    .access_key = "AK",
                    .secret_key = secret,
                    .name = "dataset 'x'"};
  ct_storage *s = NULL;
  ct_err err = {0};
  REQUIRE(!ct_storage_open_s3(&c, &s, &err));
  CHECK(ct_storage_is_remote(s));
  CHECK(strstr(ct_storage_describe(s), "s3://data/") != NULL);
  CHECK(ct_storage_local_path(s, "k", (char[64]){0}, 64) == -1);
  ct_storage_free(s);

  struct {
    ct_s3_config c;
    const char *want;
  } cases[] = {
      {{.endpoint = "http://h", .access_key = "a", .secret_key = secret},
       "aws_bucket_name is required"},
      {{.bucket = "Bad_Bucket!", .access_key = "a", .secret_key = secret},
       "not a valid bucket name"},
      {{.bucket = "data", .endpoint = "ftp://h", .access_key = "a", .secret_key = secret},
       "http:// or https://"},
      {{.bucket = "data", .endpoint = "http://h/path", .access_key = "a", .secret_key = secret},
       "no path"},
      {{.bucket = "data", .endpoint = "http://u:p@h", .access_key = "a", .secret_key = secret},
       "credentials"},
      {{.bucket = "data",
        .endpoint = "http://h",
        .region = "us east",
        .access_key = "a",
        .secret_key = secret},
       "region"},
      {{.bucket = "data", .endpoint = "http://h", .access_key = "a"}, "no secret key"},
      {{.bucket = "my.data",
        .endpoint = "https://h",
        .addressing = CT_S3_ADDR_VIRTUAL,
        .access_key = "a",
        .secret_key = secret},
       "\"path\""},
  };
  /* keep the environment out of the missing-credential case */
  char *saved_ak = getenv("AWS_ACCESS_KEY_ID") ? strdup(getenv("AWS_ACCESS_KEY_ID")) : NULL;
  char *saved_sk = getenv("AWS_SECRET_ACCESS_KEY") ? strdup(getenv("AWS_SECRET_ACCESS_KEY")) : NULL;
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    memset(&err, 0, sizeof err);
    s = NULL;
    CHECKF(ct_storage_open_s3(&cases[i].c, &s, &err) == CT_ERR_INVALID, "case %zu", i);
    CHECKF(strstr(err.msg, cases[i].want) != NULL, "case %zu: %s", i, err.msg);
    CHECKF(strstr(err.msg, secret) == NULL, "case %zu leaks the secret: %s", i, err.msg);
    CHECK(s == NULL);
  }
  /* credentials from the environment */
  setenv("AWS_ACCESS_KEY_ID", "envkey", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "envsecret", 1);
  ct_s3_config e = {.bucket = "data", .endpoint = "http://127.0.0.1:9"};
  CHECK(!ct_storage_open_s3(&e, &s, &err));
  ct_storage_free(s);
  if (saved_ak)
    setenv("AWS_ACCESS_KEY_ID", saved_ak, 1);
  else
    unsetenv("AWS_ACCESS_KEY_ID");
  if (saved_sk)
    setenv("AWS_SECRET_ACCESS_KEY", saved_sk, 1);
  else
    unsetenv("AWS_SECRET_ACCESS_KEY");
  free(saved_ak), free(saved_sk);
}

/* Nothing listens on port 9 of 127.0.0.1: the connection is refused at once
 * and retried; the error names the endpoint and the key, never the secret. */
CT_TEST(storage, s3_unreachable_endpoint) {
  const char *secret = "AnotherS3cret";
  ct_s3_config c = {.bucket = "data",
                    .endpoint = "http://127.0.0.1:9",
                    .access_key = "AK",
                    .secret_key = secret,
                    .max_retries = 2,
                    .backoff_s = 0.01,
                    .timeout_s = 2};
  ct_storage *s = NULL;
  ct_err err = {0};
  REQUIRE(!ct_storage_open_s3(&c, &s, &err));
  char *d = NULL;
  size_t n = 0;
  CHECK(ct_storage_get(s, "k/img.png", 0, &d, &n, &err) == CT_ERR_IO);
  CHECKF(strstr(err.msg, "s3://data/k/img.png") && strstr(err.msg, "127.0.0.1:9") &&
             strstr(err.msg, "after 3 attempts"),
         "%s", err.msg);
  CHECK(strstr(err.msg, secret) == NULL);
  ct_storage_stats st;
  ct_storage_get_stats(s, &st);
  CHECK(st.requests == 3 && st.retries == 2);
  ct_storage_free(s);
}

typedef struct {
  ct_storage *s;
  const char (*keys)[32];
  int n, ok;
} thr_arg;

static void *thr_get(void *p) {
  thr_arg *a = p;
  ct_storage_req r[100] = {{0}};
  for (int i = 0; i < a->n; i++) r[i].key = a->keys[i];
  ct_err e = {0};
  if (!ct_storage_get_many(a->s, r, (size_t)a->n, &e))
    for (int i = 0; i < a->n; i++) a->ok += r[i].st == CT_OK;
  for (int i = 0; i < a->n; i++) free(r[i].data);
  return NULL;
}

/* Against a live S3-compatible server, when tests/cli_s3_train.sh (or a user) sets
 * CT_S3_TEST_ENDPOINT (and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, and
 * CT_S3_TEST_BUCKET): put/get/range/head/delete, many at once, listing under
 * a prefix with pagination past 1000 keys. Reported as skipped without it. */
CT_TEST(storage, s3_live) {
  const char *ep = getenv("CT_S3_TEST_ENDPOINT"), *bk = getenv("CT_S3_TEST_BUCKET");
  if (!ep || !bk) {
    CT_SKIP("CT_S3_TEST_ENDPOINT/CT_S3_TEST_BUCKET unset; tests/cli_s3_train.sh runs it");
  }
  const char *addr = getenv("CT_S3_TEST_ADDRESSING");
  ct_s3_config c = {
      .bucket = bk,
      .endpoint = ep,
      .prefix = "live/run",
      .max_connections = 16,
      .addressing = addr && !strcmp(addr, "virtual") ? CT_S3_ADDR_VIRTUAL : CT_S3_ADDR_PATH};
  ct_storage *s = NULL;
  ct_err err = {0};
  REQUIRE(!ct_storage_open_s3(&c, &s, &err));
  CHECKF(!ct_storage_put(s, "a b/é+x&y.txt", "hello world", 11, 1, &err), "%s", err.msg);
  CHECKF(!ct_storage_put(s, "empty", "", 0, 1, &err), "%s", err.msg);
  char *d = NULL;
  size_t n = 0;
  CHECKF(!ct_storage_get(s, "a b/é+x&y.txt", 0, &d, &n, &err), "%s", err.msg);
  CHECK(d && n == 11 && !memcmp(d, "hello world", 11));
  free(d), d = NULL;
  CHECKF(!ct_storage_get(s, "empty", 0, &d, &n, &err), "%s", err.msg);
  CHECK(n == 0);
  free(d), d = NULL;
  CHECKF(!ct_storage_get_range(s, "a b/é+x&y.txt", 6, 100, &d, &n, &err), "%s", err.msg);
  CHECK(d && n == 5 && !strcmp(d, "world"));
  free(d), d = NULL;
  CHECK(ct_storage_get(s, "a b/é+x&y.txt", 4, &d, &n, &err) == CT_ERR_RANGE);
  CHECK(ct_storage_get(s, "missing/key", 0, &d, &n, &err) == CT_ERR_NOT_FOUND);
  /* a small bound or a range never turns a missing object's error document into CT_ERR_RANGE */
  CHECK(ct_storage_get(s, "missing/key", 4, &d, &n, &err) == CT_ERR_NOT_FOUND);
  CHECK(ct_storage_get_range(s, "missing/key", 0, 2, &d, &n, &err) == CT_ERR_NOT_FOUND);
  /* (a range of an empty object is not checked: s3rver 3.7.1 answers 206 with
   * Content-Length 1 and no body, where S3 answers 416, which reads as 0 bytes) */
  uint64_t sz = 0;
  CHECKF(!ct_storage_head(s, "a b/é+x&y.txt", &sz, &err) && sz == 11, "%s", err.msg);
  CHECK(ct_storage_head(s, "missing/key", &sz, &err) == CT_ERR_NOT_FOUND);
  /* 1100 keys under one directory: two pages of ListObjectsV2 */
  enum { N = 1100 };
  char(*keys)[32] = calloc(N, 32);
  char(*vals)[32] = calloc(N, 32);
  REQUIRE(keys && vals);
  for (int i = 0; i < N; i++) {
    snprintf(keys[i], 32, "many/k%05d", i);
    snprintf(vals[i], 32, "value %d", i * 7);
  }
  ct_storage_req *r = calloc(N, sizeof *r);
  REQUIRE(r);
  int put_bad = 0;
  for (int i = 0; i < N && !put_bad; i++)
    put_bad = ct_storage_put(s, keys[i], vals[i], strlen(vals[i]), 0, &err);
  CHECKF(!put_bad, "%s", err.msg);
  for (int i = 0; i < N; i++) r[i].key = keys[i];
  CHECKF(!ct_storage_get_many(s, r, N, &err), "%s", err.msg);
  int same = 0;
  for (int i = 0; i < N; i++) {
    same += r[i].st == CT_OK && r[i].n == strlen(vals[i]) && !memcmp(r[i].data, vals[i], r[i].n);
    free(r[i].data);
  }
  CHECKF(same == N, "%d of %d fetched intact", same, N);
  ct_storage_list l;
  CHECKF(!ct_storage_list_dir(s, "many", &l, &err), "%s", err.msg);
  CHECKF(l.n == N, "listed %zu", l.n);
  if (l.n == N)
    CHECK(!strcmp(l.keys[0], "many/k00000") && !strcmp(l.keys[N - 1], "many/k01099") &&
          l.sizes[7] == strlen(vals[7]));
  ct_storage_list_free(&l);
  CHECKF(!ct_storage_list_dir(s, "a b", &l, &err), "%s", err.msg);
  CHECK(l.n == 1 && !strcmp(l.keys[0], "a b/é+x&y.txt"));
  ct_storage_list_free(&l);
  /* 4 threads at once on one handle with a pool of 2 (more transfers wanted
   * than the pool holds; a shared connection cache hung here) */
  {
    ct_s3_config c2 = c;
    c2.max_connections = 2;
    ct_storage *s2 = NULL;
    REQUIRE(!ct_storage_open_s3(&c2, &s2, &err));
    thr_arg ta[4];
    pthread_t th[4];
    for (int t = 0; t < 4; t++) {
      ta[t] = (thr_arg){s2, (const char(*)[32])keys + 100 * t, 100, 0};
      pthread_create(&th[t], NULL, thr_get, &ta[t]);
    }
    int got = 0;
    for (int t = 0; t < 4; t++) pthread_join(th[t], NULL), got += ta[t].ok;
    CHECKF(got == 400, "%d of 400 fetched by 4 threads", got);
    ct_storage_free(s2);
  }
  for (int i = 0; i < N; i++) ct_storage_delete(s, keys[i], &err);
  CHECKF(!ct_storage_delete(s, "empty", &err), "%s", err.msg);
  CHECK(ct_storage_head(s, "empty", &sz, &err) == CT_ERR_NOT_FOUND);
  CHECK(!ct_storage_delete(s, "empty", &err));
  free(keys), free(vals), free(r);
  ct_storage_free(s);
}

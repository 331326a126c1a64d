/* s3.c: the S3-compatible backend of ctuner/storage.h over libcurl.
 *
 * Every operation is a list of HTTP requests run by one engine (run_xfers):
 * a curl multi handle per call, at most max_connections transfers in flight.
 * Multi handles (each with its own cache of kept-alive connections) wait in a
 * stack between calls, so a call reuses the sockets of an earlier one; calls
 * running at once on several threads each check out their own, since libcurl
 * cannot share one connection cache between threads safely (a transfer queued
 * for a connection another thread's multi handle holds would never wake). A
 * request is signed (AWS Signature V4, our own over OpenSSL) at each attempt,
 * since the signature covers the time. Retries: 5xx, 408, 429, timeouts,
 * refused/reset/dropped connections and short bodies, after a backoff drawn
 * uniformly from [0, min(20 s, backoff * 2^attempt)) ("full jitter"); any
 * other 4xx fails at once; 404 is CT_ERR_NOT_FOUND. Messages name the method,
 * s3://bucket/key and the endpoint, and the server's error code and message —
 * never a credential (nor the error document's StringToSign/CanonicalRequest).
 *
 * Not here: multipart uploads (objects up to 5 GiB, one PUT), server-side
 * encryption options, credentials from instance metadata or profiles.
 */
#include <curl/curl.h>
#include <math.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctuner/hash.h"
#include "ctuner/log.h"
#include "storage/storage_int.h"

#define BACKOFF_CAP_S 20.0
#define LIST_MAX (64u << 20) /* one ListObjectsV2 page */
#define ERRBODY_MAX (64u << 10)

typedef struct s3 {
  char *bucket, *region, *prefix; /* prefix: "" or "p/q/" */
  char *scheme, *host;            /* host: "name[:port]" as sent in Host */
  char *access_key, *secret_key, *token;
  char *name;
  int virt; /* virtual-hosted addressing */
  int pool, max_retries;
  double timeout_s, backoff_s;
  CURLSH *share; /* DNS and TLS sessions only */
  pthread_mutex_t share_mu[CURL_LOCK_DATA_LAST];
  pthread_mutex_t multi_mu; /* idle multi handles */
  CURLM **multis;
  int nmulti, cap_multi;
  pthread_mutex_t rng_mu;
  uint64_t rng;
} s3;

/* ---- small helpers ---- */

static void to_hex(const unsigned char *b, size_t n, char *out) {
  static const char H[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) out[2 * i] = H[b[i] >> 4], out[2 * i + 1] = H[b[i] & 15];
  out[2 * n] = 0;
}

static void hmac(const void *key, size_t kn, const char *msg, unsigned char out[32]) {
  unsigned int on = 32;
  HMAC(EVP_sha256(), key, (int)kn, (const unsigned char *)msg, strlen(msg), out, &on);
}

/* Growable string with a bound. */
typedef struct {
  char *p;
  size_t n, cap, max;
  int over;
} buf;

static int buf_add(buf *b, const void *d, size_t n) {
  if (b->over) return -1;
  if (b->max && b->n + n > b->max) return b->over = 1, -1;
  if (b->n + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap : 256;
    while (nc < b->n + n + 1) nc *= 2;
    char *q = realloc(b->p, nc);
    if (!q) return b->over = 2, -1;
    b->p = q, b->cap = nc;
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
  b->p[b->n] = 0;
  return 0;
}
static int buf_str(buf *b, const char *s) {
  return buf_add(b, s, strlen(s));
}

/* RFC 3986 unreserved characters pass; everything else is %XX. keep_slash for paths. */
static int uri_encode(buf *b, const char *s, int keep_slash) {
  static const char H[] = "0123456789ABCDEF";
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    unsigned c = *p;
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      if (buf_add(b, p, 1)) return -1;
    } else {
      char e[3] = {'%', H[c >> 4], H[c & 15]};
      if (buf_add(b, e, 3)) return -1;
    }
  }
  return 0;
}

static int cmp_hdr(const void *a, const void *b) {
  const char *x = *(const char *const *)a, *y = *(const char *const *)b;
  size_t nx = strcspn(x, ":"), ny = strcspn(y, ":");
  int c = strncmp(x, y, nx < ny ? nx : ny);
  return c ? c : (nx < ny ? -1 : nx > ny);
}

ct_status ct_sigv4_authorization(const char *method, const char *canonical_uri,
                                 const char *canonical_query, const char *const *headers, int nh,
                                 const char *payload_hash, const char *amz_date, const char *region,
                                 const char *service, const char *access_key,
                                 const char *secret_key, char *out, size_t out_n, ct_err *err) {
  if (nh < 1 || nh > 16 || strlen(amz_date) != 16)
    return ct_errf(err, CT_ERR_INVALID, "sigv4: bad arguments (headers %d, date '%s')", nh,
                   amz_date);
  const char *h[16];
  for (int i = 0; i < nh; i++) h[i] = headers[i];
  qsort(h, (size_t)nh, sizeof *h, cmp_hdr);
  buf cr = {0}, signed_h = {0};
  int bad = 0;
  bad |= buf_str(&cr, method) | buf_str(&cr, "\n") | buf_str(&cr, canonical_uri) |
         buf_str(&cr, "\n") | buf_str(&cr, canonical_query) | buf_str(&cr, "\n");
  for (int i = 0; i < nh; i++) {
    size_t kn = strcspn(h[i], ":");
    bad |= buf_add(&cr, h[i], strlen(h[i])) | buf_str(&cr, "\n");
    if (i) bad |= buf_str(&signed_h, ";");
    bad |= buf_add(&signed_h, h[i], kn);
  }
  bad |= buf_str(&cr, "\n") | buf_str(&cr, signed_h.p ? signed_h.p : "") | buf_str(&cr, "\n") |
         buf_str(&cr, payload_hash);
  char date[9];
  memcpy(date, amz_date, 8);
  date[8] = 0;
  char scope[160], crh[65], sts[400];
  snprintf(scope, sizeof scope, "%s/%s/%s/aws4_request", date, region, service);
  if (!bad) ct_sha256_hex(cr.p, cr.n, crh);
  snprintf(sts, sizeof sts, "AWS4-HMAC-SHA256\n%s\n%s\n%s", amz_date, scope, crh);
  /* signing key: HMAC chain from "AWS4" + secret */
  size_t sn = strlen(secret_key);
  char *k0 = malloc(sn + 5);
  if (!k0) bad = 1;
  unsigned char k1[32], k2[32], k3[32], k4[32], sig[32];
  char sighex[65];
  if (!bad) {
    memcpy(k0, "AWS4", 4);
    memcpy(k0 + 4, secret_key, sn + 1);
    hmac(k0, sn + 4, date, k1);
    hmac(k1, 32, region, k2);
    hmac(k2, 32, service, k3);
    hmac(k3, 32, "aws4_request", k4);
    hmac(k4, 32, sts, sig);
    to_hex(sig, 32, sighex);
    OPENSSL_cleanse(k0, sn + 4);
    OPENSSL_cleanse(k4, sizeof k4);
  }
  free(k0);
  ct_status st = CT_OK;
  if (bad)
    st = ct_errf(err, CT_ERR_NOMEM, "sigv4: out of memory");
  else if (snprintf(out, out_n, "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s",
                    access_key, scope, signed_h.p, sighex) >= (int)out_n)
    st = ct_errf(err, CT_ERR_RANGE, "sigv4: authorization header too long");
  free(cr.p);
  free(signed_h.p);
  return st;
}

/* ---- transfers ---- */

typedef enum { M_GET, M_PUT, M_HEAD, M_DELETE, M_LIST } method;
static const char *const METHOD[] = {"GET", "PUT", "HEAD", "DELETE", "GET"};

typedef struct xfer {
  method m;
  const char *key;   /* relative to the prefix (M_LIST: NULL) */
  const char *query; /* canonical query, already encoded and sorted ("" for none) */
  const void *body;  /* M_PUT */
  size_t body_n;
  uint64_t off;
  size_t len; /* range GET (0: whole) */
  size_t max; /* response bound */
  /* state */
  int attempts;
  double next_at;
  int started, done;
  CURL *c;
  struct curl_slist *hdr;
  char *url;
  buf resp;
  long http;
  CURLcode cc;
  int range_cut; /* a 200 to a range request, cut at off + len */
  char cerr[CURL_ERROR_SIZE];
  /* result */
  ct_status st;
  char msg[1000];
  uint64_t length; /* HEAD: Content-Length */
} xfer;

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double jitter01(s3 *q) {
  pthread_mutex_lock(&q->rng_mu);
  uint64_t x = q->rng;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  q->rng = x;
  pthread_mutex_unlock(&q->rng_mu);
  return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

static size_t on_body(char *d, size_t sz, size_t nm, void *ud) {
  xfer *x = ud;
  size_t n = sz * nm;
  if (x->http == 0) { /* the first bytes: bound the body by what it is */
    curl_easy_getinfo(x->c, CURLINFO_RESPONSE_CODE, &x->http);
    if (x->http >= 300)
      x->resp.max = ERRBODY_MAX; /* an error document, whatever max the caller set */
    else if (x->m == M_GET && x->len && x->http == 200)
      x->resp.max = (size_t)x->off + x->len; /* range ignored */
  }
  if (x->m == M_GET && x->len && x->http == 200 && x->resp.n + n > x->resp.max) {
    /* a server that ignored the range: keep the bytes up to off + len, then stop */
    buf_add(&x->resp, d, x->resp.max - x->resp.n);
    x->range_cut = 1;
    return 0;
  }
  if (x->http >= 300 && x->resp.n + n > x->resp.max) { /* a long error page: keep its start */
    buf_add(&x->resp, d, x->resp.max - x->resp.n);
    return n;
  }
  return buf_add(&x->resp, d, n) ? 0 : n; /* over the bound: curl stops with CURLE_WRITE_ERROR */
}

/* "s3://bucket/prefix+key" for messages. */
static void where(const s3 *q, const xfer *x, char *out, size_t n) {
  snprintf(out, n, "%s s3://%s/%s%s (endpoint %s://%s%s%s)", METHOD[x->m], q->bucket, q->prefix,
           x->key ? x->key : "", q->scheme, q->virt ? q->bucket : "", q->virt ? "." : "", q->host);
}

static void lock_cb(CURL *h, curl_lock_data d, curl_lock_access a, void *u) {
  (void)h, (void)a;
  pthread_mutex_lock(&((s3 *)u)->share_mu[d]);
}
static void unlock_cb(CURL *h, curl_lock_data d, void *u) {
  (void)h;
  pthread_mutex_unlock(&((s3 *)u)->share_mu[d]);
}

/* Header lists hold the Authorization and the session token: wiped before freed. */
static void free_headers(struct curl_slist *h) {
  for (struct curl_slist *p = h; p; p = p->next)
    if (p->data) OPENSSL_cleanse(p->data, strlen(p->data));
  curl_slist_free_all(h);
}

/* Build, sign and configure one attempt. */
static ct_status setup(s3 *q, xfer *x, ct_err *err) {
  buf path = {0}, url = {0};
  int bad = 0;
  /* canonical URI: path-style "/bucket/key", virtual-hosted "/key" */
  bad |= buf_str(&path, "/");
  if (!q->virt) bad |= uri_encode(&path, q->bucket, 0) | buf_str(&path, "/");
  if (x->m != M_LIST)
    bad |= uri_encode(&path, q->prefix, 1) | uri_encode(&path, x->key, 1);
  else if (!q->virt)
    path.n--, path.p[path.n] = 0; /* "/bucket" for a bucket-level request */
  bad |= buf_str(&url, q->scheme) | buf_str(&url, "://");
  if (q->virt) bad |= buf_str(&url, q->bucket) | buf_str(&url, ".");
  bad |= buf_str(&url, q->host) | buf_str(&url, path.p ? path.p : "/");
  if (x->query[0]) bad |= buf_str(&url, "?") | buf_str(&url, x->query);
  char host[600], date_h[64], sha_h[100], tok_h[64], range_h[80], amz[17], ph[65];
  time_t t = time(NULL);
  struct tm g;
  gmtime_r(&t, &g);
  strftime(amz, sizeof amz, "%Y%m%dT%H%M%SZ", &g);
  ct_sha256_hex(x->m == M_PUT ? x->body : "", x->m == M_PUT ? x->body_n : 0, ph);
  snprintf(host, sizeof host, "host:%s%s%s", q->virt ? q->bucket : "", q->virt ? "." : "", q->host);
  snprintf(date_h, sizeof date_h, "x-amz-date:%s", amz);
  snprintf(sha_h, sizeof sha_h, "x-amz-content-sha256:%s", ph);
  const char *sh[5] = {host, sha_h, date_h};
  int nh = 3;
  if (x->m == M_GET && x->len) {
    snprintf(range_h, sizeof range_h, "range:bytes=%llu-%llu", (unsigned long long)x->off,
             (unsigned long long)(x->off + x->len - 1));
    sh[nh++] = range_h;
  }
  char *tok = NULL;
  if (q->token && q->token[0]) {
    size_t tn = strlen(q->token) + 32;
    tok = malloc(tn);
    if (!tok)
      bad = 1;
    else
      snprintf(tok, tn, "x-amz-security-token:%s", q->token), sh[nh++] = tok;
  }
  (void)tok_h;
  char auth[1024];
  ct_status st = CT_OK;
  if (bad) st = ct_errf(err, CT_ERR_NOMEM, "s3: out of memory");
  if (!st)
    st = ct_sigv4_authorization(METHOD[x->m], path.p, x->query, sh, nh, ph, amz, q->region, "s3",
                                q->access_key, q->secret_key, auth, sizeof auth, err);
  /* headers as sent: "Name: value" */
  struct curl_slist *hl = NULL;
  if (!st) {
    char line[1100];
    for (int i = 0; i < nh; i++) {
      const char *c = strchr(sh[i], ':');
      size_t kn = (size_t)(c - sh[i]);
      size_t ln = kn + strlen(c + 1) + 3;
      char *l = ln <= sizeof line ? line : malloc(ln);
      if (!l) {
        bad = 1;
        break;
      }
      snprintf(l, ln, "%.*s: %s", (int)kn, sh[i], c + 1);
      struct curl_slist *nl = curl_slist_append(hl, l);
      if (l != line) free(l);
      if (!nl) {
        bad = 1;
        break;
      }
      hl = nl;
    }
    snprintf(line, sizeof line, "Authorization: %s", auth);
    struct curl_slist *nl = bad ? NULL : curl_slist_append(hl, line);
    if (nl) hl = nl, nl = curl_slist_append(hl, "Expect:");
    if (nl)
      hl = nl,
      nl = x->m == M_PUT ? curl_slist_append(hl, "Content-Type: application/octet-stream") : hl;
    if (!nl)
      bad = 1;
    else
      hl = nl;
    OPENSSL_cleanse(auth, sizeof auth);
    OPENSSL_cleanse(line, sizeof line);
    if (bad) st = ct_errf(err, CT_ERR_NOMEM, "s3: out of memory");
  }
  if (tok) OPENSSL_cleanse(tok, strlen(tok)), free(tok);
  free(path.p);
  if (st) {
    free(url.p);
    free_headers(hl);
    return st;
  }
  free(x->url);
  free_headers(x->hdr);
  x->url = url.p;
  x->hdr = hl;
  free(x->resp.p);
  x->resp = (buf){.max = x->max};
  x->range_cut = 0;
  x->http = 0;
  x->cerr[0] = 0;
  CURL *c = x->c;
  curl_easy_reset(c);
  curl_easy_setopt(c, CURLOPT_URL, x->url);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, x->hdr);
  curl_easy_setopt(c, CURLOPT_SHARE, q->share);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  /* timeout_s bounds a request whose size is known, plus a second per MB
   * moved; any transfer fails once no byte moved for timeout_s (a stall) */
  size_t moved = x->m == M_PUT ? x->body_n : x->m == M_GET ? x->len : 0;
  if (!(x->m == M_GET && !x->len))
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(q->timeout_s * 1000) + (long)(moved / 1000));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)ceil(q->timeout_s));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   (long)((q->timeout_s < 10 ? q->timeout_s : 10) * 1000));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, x->cerr);
  curl_easy_setopt(c, CURLOPT_PRIVATE, x);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  switch (x->m) {
    case M_PUT:
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, x->body_n ? x->body : "");
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)x->body_n);
      break;
    case M_HEAD:
      curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
      break;
    case M_DELETE:
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "DELETE");
      break;
    default:
      break;
  }
  return CT_OK;
}

/* The <Code> and <Message> of an S3 error document, printable and short. */
static void xml_field(const char *doc, const char *tag, char *out, size_t n) {
  out[0] = 0;
  if (!doc) return;
  char open[40], close[40];
  snprintf(open, sizeof open, "<%s>", tag);
  snprintf(close, sizeof close, "</%s>", tag);
  const char *a = strstr(doc, open);
  if (!a) return;
  a += strlen(open);
  const char *b = strstr(a, close);
  if (!b) return;
  size_t k = 0;
  for (const char *p = a; p < b && k + 1 < n; p++) out[k++] = (*p >= 32 && *p < 127) ? *p : '?';
  out[k] = 0;
}

static int retryable_curl(CURLcode cc) {
  switch (cc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return 1;
    default:
      return 0;
  }
}

/* Classify a finished attempt: 1 done (x->st set), 0 retry. */
static int finish(s3 *q, xfer *x) {
  char w[400];
  where(q, x, w, sizeof w);
  if (x->cc == CURLE_WRITE_ERROR && x->range_cut) x->cc = CURLE_OK;
  if (x->cc == CURLE_WRITE_ERROR && x->resp.over == 1) {
    x->st = CT_ERR_RANGE;
    snprintf(x->msg, sizeof x->msg, "%.400s: the object is larger than %zu bytes", w, x->max);
    return 1;
  }
  if (x->cc == CURLE_WRITE_ERROR && x->resp.over == 2) {
    x->st = CT_ERR_NOMEM;
    snprintf(x->msg, sizeof x->msg, "%.400s: out of memory", w);
    return 1;
  }
  if (x->cc != CURLE_OK) {
    int again = retryable_curl(x->cc);
    if (again && x->attempts <= q->max_retries) return 0;
    x->st = CT_ERR_IO;
    snprintf(x->msg, sizeof x->msg, "%.400s: %.100s%s%.200s%s", w, curl_easy_strerror(x->cc),
             x->cerr[0] ? " (" : "", x->cerr, x->cerr[0] ? ")" : "");
    if (again) {
      size_t l = strlen(x->msg);
      snprintf(x->msg + l, sizeof x->msg - l, "; gave up after %d attempts", x->attempts);
    }
    return 1;
  }
  curl_easy_getinfo(x->c, CURLINFO_RESPONSE_CODE, &x->http);
  long h = x->http;
  if (h >= 200 && h < 300) {
    if (x->m == M_HEAD) {
      curl_off_t cl = -1;
      curl_easy_getinfo(x->c, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
      x->length = cl > 0 ? (uint64_t)cl : 0;
    }
    if (x->m == M_GET && x->len && h == 200) {
      /* a server that ignored the range: keep the asked part */
      if (x->off >= x->resp.n)
        x->resp.n = 0;
      else {
        size_t k = x->resp.n - (size_t)x->off < x->len ? x->resp.n - (size_t)x->off : x->len;
        memmove(x->resp.p, x->resp.p + x->off, k);
        x->resp.n = k;
      }
      if (x->resp.p) x->resp.p[x->resp.n] = 0;
    }
    x->st = CT_OK;
    return 1;
  }
  if (h == 404 || (x->m == M_DELETE && h == 204)) {
    x->st = (x->m == M_DELETE) ? CT_OK : CT_ERR_NOT_FOUND;
    if (h == 404 && x->m == M_LIST) { /* NoSuchBucket */
      x->st = CT_ERR_NOT_FOUND;
      snprintf(x->msg, sizeof x->msg,
               "%.400s: bucket '%.63s' does not exist (HTTP 404); check aws_bucket_name", w,
               q->bucket);
    }
    return 1;
  }
  if (h == 416 && x->m == M_GET && x->len) { /* range past the end: no bytes */
    x->resp.n = 0;
    x->st = CT_OK;
    return 1;
  }
  int again = h >= 500 || h == 429 || h == 408;
  if (again && x->attempts <= q->max_retries) return 0;
  char code[80], m[240];
  xml_field(x->resp.p, "Code", code, sizeof code);
  xml_field(x->resp.p, "Message", m, sizeof m);
  const char *hint = "";
  if (!strcmp(code, "SignatureDoesNotMatch"))
    hint = "; check aws_secret_access_key (or AWS_SECRET_ACCESS_KEY) for this access key";
  else if (!strcmp(code, "InvalidAccessKeyId"))
    hint = "; check aws_access_key_id (or AWS_ACCESS_KEY_ID)";
  else if (!strcmp(code, "NoSuchBucket"))
    hint = "; check aws_bucket_name";
  else if (h == 403)
    hint = "; check the credentials and the bucket's permissions";
  else if (!strcmp(code, "AuthorizationHeaderMalformed") || !strcmp(code, "PermanentRedirect"))
    hint = "; check aws_region_name and aws_endpoint_url";
  x->st = h == 403 || h == 401 ? CT_ERR_INVALID : CT_ERR_IO;
  snprintf(x->msg, sizeof x->msg, "%.400s: HTTP %ld%s%s%s%s%s%s", w, h, code[0] ? " " : "", code,
           m[0] ? ": " : "", m, hint, again ? "; gave up after the retries" : "");
  return 1;
}

/* Start one attempt of t on a free or new easy handle. */
static ct_status start(s3 *q, CURLM *m, xfer *t, CURL **free_c, size_t *nfree, ct_err *err) {
  CURL *c = *nfree ? free_c[--*nfree] : curl_easy_init();
  if (!c) return ct_errf(err, CT_ERR_NOMEM, "s3: out of memory");
  t->c = c;
  ct_status st = setup(q, t, err);
  if (st) {
    curl_easy_cleanup(c);
    t->c = NULL;
    return st;
  }
  t->attempts++;
  t->started = 1;
  curl_multi_add_handle(m, c);
  return CT_OK;
}

/* Run every transfer to its end: first attempts in order, retries when their
 * backoff has passed, at most pool in flight. Returns CT_OK unless setting a
 * request up failed; each x->st holds its own result. */
static ct_status run_xfers(ct_storage *s, xfer *x, size_t n, ct_err *err) {
  s3 *q = s->impl;
  size_t pool = (size_t)q->pool;
  CURLM *m = NULL;
  pthread_mutex_lock(&q->multi_mu);
  if (q->nmulti) m = q->multis[--q->nmulti];
  pthread_mutex_unlock(&q->multi_mu);
  if (!m && (m = curl_multi_init())) curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, (long)q->pool);
  CURL **free_c = calloc(pool, sizeof *free_c);
  size_t *retry = calloc(n ? n : 1, sizeof *retry); /* indices waiting for their backoff */
  if (!m || !free_c || !retry) {
    if (m) curl_multi_cleanup(m);
    free(free_c), free(retry);
    return ct_errf(err, CT_ERR_NOMEM, "s3: out of memory");
  }
  size_t nfree = 0, active = 0, done = 0, next = 0, nretry = 0;
  uint64_t reqs = 0, retries = 0, bin = 0, bout = 0;
  ct_status st = CT_OK;
  for (size_t i = 0; i < n; i++)
    x[i].started = x[i].done = 0, x[i].attempts = 0, x[i].next_at = 0, x[i].c = NULL;
  while (done < n && !st) {
    double now = mono(), wake = now + 0.1;
    for (size_t k = 0; k < nretry && active < pool && !st;) { /* due retries first */
      xfer *t = &x[retry[k]];
      if (t->next_at > now) {
        if (t->next_at < wake) wake = t->next_at;
        k++;
        continue;
      }
      retry[k] = retry[--nretry];
      if (!(st = start(q, m, t, free_c, &nfree, err)))
        active++, reqs++, retries++, bout += t->m == M_PUT ? t->body_n : 0;
    }
    while (!st && next < n && active < pool) {
      xfer *t = &x[next++];
      if (!(st = start(q, m, t, free_c, &nfree, err)))
        active++, reqs++, bout += t->m == M_PUT ? t->body_n : 0;
    }
    if (st) break;
    if (!active) {
      double d = wake - mono();
      if (d > 0) usleep((useconds_t)(d * 1e6) + 1);
      continue;
    }
    int running = 0;
    curl_multi_perform(m, &running);
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left))) {
      if (msg->msg != CURLMSG_DONE) continue;
      xfer *t = NULL;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&t);
      t->cc = msg->data.result;
      curl_multi_remove_handle(m, t->c);
      active--;
      t->started = 0;
      if (finish(q, t)) {
        t->done = 1;
        done++;
        if (t->st == CT_OK && t->m != M_PUT) bin += t->resp.n;
      } else {
        double cap = q->backoff_s * (double)(1u << (t->attempts < 16 ? t->attempts - 1 : 15));
        if (cap > BACKOFF_CAP_S) cap = BACKOFF_CAP_S;
        t->next_at = mono() + cap * jitter01(q);
        if (t->next_at < wake) wake = t->next_at;
        retry[nretry++] = (size_t)(t - x);
        CT_DEBUG("s3: retrying %s %s%s (attempt %d): %s, HTTP %ld", METHOD[t->m], q->prefix,
                 t->key ? t->key : "", t->attempts + 1,
                 t->cc ? curl_easy_strerror(t->cc) : "no transport error", t->http);
      }
      free_c[nfree++] = t->c;
      t->c = NULL;
    }
    /* wait for socket activity only with transfers in flight and none to
     * start now (a poll on idle sockets would sleep out its timeout) */
    if (done < n && active > 0 && !(next < n && active < pool)) {
      double d = wake - mono();
      int ms = d <= 0 ? 0 : d > 0.1 ? 100 : (int)(d * 1000) + 1;
      curl_multi_poll(m, NULL, 0, ms, NULL);
    }
  }
  for (size_t i = 0; i < n; i++) /* after a set-up failure: stop what is in flight */
    if (x[i].c) {
      curl_multi_remove_handle(m, x[i].c);
      curl_easy_cleanup(x[i].c);
      x[i].c = NULL;
    }
  for (size_t i = 0; i < nfree; i++) curl_easy_cleanup(free_c[i]);
  free(free_c);
  free(retry);
  pthread_mutex_lock(&q->multi_mu); /* back on the stack with its connections */
  if (q->nmulti == q->cap_multi) {
    int nc = q->cap_multi ? 2 * q->cap_multi : 4;
    CURLM **v = realloc(q->multis, (size_t)nc * sizeof *v);
    if (v) q->multis = v, q->cap_multi = nc;
  }
  if (q->nmulti < q->cap_multi) q->multis[q->nmulti++] = m, m = NULL;
  pthread_mutex_unlock(&q->multi_mu);
  if (m) curl_multi_cleanup(m);
  for (size_t i = 0; i < n; i++) {
    free(x[i].url);
    x[i].url = NULL;
    free_headers(x[i].hdr);
    x[i].hdr = NULL;
  }
  pthread_mutex_lock(&s->stat_mu);
  s->stats.requests += reqs, s->stats.retries += retries, s->stats.bytes_in += bin,
      s->stats.bytes_out += bout;
  pthread_mutex_unlock(&s->stat_mu);
  return st;
}

/* One transfer's result as a status (the message into err). */
static ct_status result(const xfer *x, ct_err *err) {
  if (x->st == CT_OK || (x->st == CT_ERR_NOT_FOUND && !x->msg[0])) return x->st;
  return ct_errf(err, x->st, "%s", x->msg);
}

static ct_status s3_get_many(ct_storage *s, ct_storage_req *r, size_t n, ct_err *err) {
  xfer *x = calloc(n, sizeof *x);
  if (!x) return ct_errf(err, CT_ERR_NOMEM, "s3: out of memory for %zu requests", n);
  for (size_t i = 0; i < n; i++) {
    x[i].m = M_GET, x[i].key = r[i].key, x[i].query = "";
    x[i].off = r[i].off, x[i].len = r[i].len;
    x[i].max = r[i].len ? r[i].len : (r[i].max ? r[i].max : ((size_t)1 << 30));
  }
  ct_status st = run_xfers(s, x, n, err), first = CT_OK;
  for (size_t i = 0; i < n; i++) {
    r[i].st = st ? st : x[i].st;
    if (!st && x[i].st == CT_OK) {
      if (!x[i].resp.p) x[i].resp.p = calloc(1, 1);
      if (!x[i].resp.p) r[i].st = CT_ERR_NOMEM;
      r[i].data = x[i].resp.p, r[i].n = x[i].resp.n;
      x[i].resp.p = NULL;
    }
    if (!st && r[i].st && r[i].st != CT_ERR_NOT_FOUND && !first) first = result(&x[i], err);
    free(x[i].resp.p);
  }
  free(x);
  return st ? st : first;
}

static ct_status one(ct_storage *s, xfer *x, ct_err *err) {
  ct_status st = run_xfers(s, x, 1, err);
  if (!st) st = result(x, err);
  return st;
}

static ct_status s3_put(ct_storage *s, const char *key, const void *data, size_t n, int durable,
                        ct_err *err) {
  (void)durable;
  xfer x = {.m = M_PUT, .key = key, .query = "", .body = data, .body_n = n, .max = ERRBODY_MAX};
  ct_status st = one(s, &x, err);
  free(x.resp.p);
  if (st == CT_ERR_NOT_FOUND) /* PUT 404: the bucket is missing */
    st = ct_errf(err, CT_ERR_NOT_FOUND,
                 "PUT s3://%s/%s%s: bucket not found (HTTP 404); check aws_bucket_name",
                 ((s3 *)s->impl)->bucket, ((s3 *)s->impl)->prefix, key);
  return st;
}

static ct_status s3_put_many(ct_storage *s, ct_storage_put_req *r, size_t n, int durable,
                             ct_err *err) {
  (void)durable;
  xfer *x = calloc(n, sizeof *x);
  if (!x) return ct_errf(err, CT_ERR_NOMEM, "s3: out of memory for %zu requests", n);
  for (size_t i = 0; i < n; i++)
    x[i] = (xfer){.m = M_PUT,
                  .key = r[i].key,
                  .query = "",
                  .body = r[i].data,
                  .body_n = r[i].n,
                  .max = ERRBODY_MAX};
  ct_status st = run_xfers(s, x, n, err), first = CT_OK;
  for (size_t i = 0; i < n; i++) {
    r[i].st = st ? st : x[i].st;
    if (!st && r[i].st && !first) {
      first = r[i].st;
      if (x[i].msg[0])
        ct_errf(err, first, "%s", x[i].msg);
      else
        ct_errf(err, first, "PUT s3://%s/%s%s: bucket not found (HTTP 404); check aws_bucket_name",
                ((s3 *)s->impl)->bucket, ((s3 *)s->impl)->prefix, r[i].key);
    }
    free(x[i].resp.p);
  }
  free(x);
  return st ? st : first;
}

static ct_status s3_head(ct_storage *s, const char *key, uint64_t *size, ct_err *err) {
  xfer x = {.m = M_HEAD, .key = key, .query = "", .max = ERRBODY_MAX};
  ct_status st = one(s, &x, err);
  free(x.resp.p);
  if (!st && size) *size = x.length;
  return st;
}

static ct_status s3_del(ct_storage *s, const char *key, ct_err *err) {
  xfer x = {.m = M_DELETE, .key = key, .query = "", .max = ERRBODY_MAX};
  ct_status st = one(s, &x, err);
  free(x.resp.p);
  return st == CT_ERR_NOT_FOUND ? CT_OK : st;
}

/* XML text with the five entities and numeric references decoded. */
static char *xml_text(const char *a, const char *b) {
  char *o = malloc((size_t)(b - a) + 1), *w = o;
  if (!o) return NULL;
  for (const char *p = a; p < b;) {
    if (*p != '&') {
      *w++ = *p++;
      continue;
    }
    const char *semi = memchr(p, ';', (size_t)(b - p));
    if (!semi || semi - p > 10) {
      *w++ = *p++;
      continue;
    }
    size_t k = (size_t)(semi - p - 1);
    const char *e = p + 1;
    unsigned long cp = 0;
    if (k == 3 && !strncmp(e, "amp", 3))
      cp = '&';
    else if (k == 2 && !strncmp(e, "lt", 2))
      cp = '<';
    else if (k == 2 && !strncmp(e, "gt", 2))
      cp = '>';
    else if (k == 4 && !strncmp(e, "quot", 4))
      cp = '"';
    else if (k == 4 && !strncmp(e, "apos", 4))
      cp = '\'';
    else if (k >= 2 && e[0] == '#')
      cp = e[1] == 'x' ? strtoul(e + 2, NULL, 16) : strtoul(e + 1, NULL, 10);
    if (!cp || cp > 0x10FFFF) {
      *w++ = *p++;
      continue;
    }
    if (cp < 0x80)
      *w++ = (char)cp;
    else if (cp < 0x800)
      *w++ = (char)(0xC0 | (cp >> 6)), *w++ = (char)(0x80 | (cp & 63));
    else if (cp < 0x10000)
      *w++ = (char)(0xE0 | (cp >> 12)), *w++ = (char)(0x80 | ((cp >> 6) & 63)),
      *w++ = (char)(0x80 | (cp & 63));
    else
      *w++ = (char)(0xF0 | (cp >> 18)), *w++ = (char)(0x80 | ((cp >> 12) & 63)),
      *w++ = (char)(0x80 | ((cp >> 6) & 63)), *w++ = (char)(0x80 | (cp & 63));
    p = semi + 1;
  }
  *w = 0;
  return o;
}

/* The text of the first <tag> in [a, b), or NULL. */
static char *xml_get(const char *a, const char *b, const char *tag, const char **after) {
  char open[40], close[40];
  snprintf(open, sizeof open, "<%s>", tag);
  snprintf(close, sizeof close, "</%s>", tag);
  const char *p = strstr(a, open);
  if (!p || p >= b) return NULL;
  p += strlen(open);
  const char *e = strstr(p, close);
  if (!e || e > b) return NULL;
  if (after) *after = e + strlen(close);
  return xml_text(p, e);
}

ct_status ct_s3_list_page(const char *doc, size_t n, const char *prefix, ct_storage_list *out,
                          size_t *cap, int *more, char **token, ct_err *err) {
  const char *end = doc + n, *p = doc, *c;
  const size_t plen = strlen(prefix);
  *more = 0;
  *token = NULL;
  if (!strstr(doc, "<ListBucketResult"))
    return ct_errf(err, CT_ERR_FORMAT,
                   "the reply is not a ListBucketResult document; is the endpoint an S3 endpoint?");
  while ((c = strstr(p, "<Contents>")) && c < end) {
    const char *ce = strstr(c, "</Contents>");
    if (!ce) break;
    char *k = xml_get(c, ce, "Key", NULL), *z = xml_get(c, ce, "Size", NULL);
    /* keys under the prefix that are keys here (no "..", "//", trailing '/': directory markers) */
    if (k && strlen(k) > plen && !strncmp(k, prefix, plen) && ct_storage_key_ok(k + plen)) {
      char *rel = strdup(k + plen);
      if (!rel || ct_storage_list_push(out, cap, rel, z ? strtoull(z, NULL, 10) : 0)) {
        free(k), free(z);
        return ct_errf(err, CT_ERR_NOMEM, "out of memory");
      }
    } else if (k && strlen(k) > plen && !strncmp(k, prefix, plen) && k[strlen(k) - 1] != '/') {
      CT_DEBUG("s3: listing skips the key '%.200s' (empty, '.' or '..' segments)", k);
    }
    free(k), free(z);
    p = ce + 11;
  }
  char *trunc = xml_get(doc, end, "IsTruncated", NULL);
  *more = trunc && !strcmp(trunc, "true");
  free(trunc);
  if (*more) *token = xml_get(doc, end, "NextContinuationToken", NULL);
  return CT_OK;
}

static ct_status s3_list(ct_storage *s, const char *dir, ct_storage_list *out, ct_err *err) {
  s3 *q = s->impl;
  buf pre = {0};
  int bad = buf_str(&pre, q->prefix);
  if (dir[0]) bad |= buf_str(&pre, dir) | buf_str(&pre, "/");
  if (bad) return free(pre.p), ct_errf(err, CT_ERR_NOMEM, "s3: out of memory");
  size_t cap = 0;
  char *token = NULL;
  ct_status st = CT_OK;
  for (int page = 0; !st; page++) {
    buf qs = {0};
    /* canonical order: continuation-token, list-type, prefix */
    if (token)
      bad |= buf_str(&qs, "continuation-token=") | uri_encode(&qs, token, 0) | buf_str(&qs, "&");
    bad |= buf_str(&qs, "list-type=2&prefix=") | uri_encode(&qs, pre.p ? pre.p : "", 0);
    if (bad) {
      free(qs.p);
      st = ct_errf(err, CT_ERR_NOMEM, "s3: out of memory");
      break;
    }
    xfer x = {.m = M_LIST, .query = qs.p, .max = LIST_MAX};
    st = one(s, &x, err);
    free(qs.p);
    if (st == CT_ERR_NOT_FOUND && !x.msg[0])
      st = ct_errf(err, CT_ERR_NOT_FOUND,
                   "listing s3://%s/%s: bucket not found (HTTP 404); check aws_bucket_name",
                   q->bucket, pre.p ? pre.p : "");
    if (st) {
      free(x.resp.p);
      break;
    }
    int more = 0;
    free(token);
    token = NULL;
    st = ct_s3_list_page(x.resp.p ? x.resp.p : "", x.resp.n, q->prefix, out, &cap, &more, &token,
                         err);
    free(x.resp.p);
    if (st == CT_ERR_FORMAT)
      ct_err_prefix(err, "listing s3://%s/%s (endpoint %s://%s): ", q->bucket, pre.p ? pre.p : "",
                    q->scheme, q->host);
    if (st) break;
    if (!more) break;
    if (!token) {
      st = ct_errf(err, CT_ERR_FORMAT,
                   "listing s3://%s/%s: a truncated page without NextContinuationToken", q->bucket,
                   pre.p);
      break;
    }
    if (page > 1000000) {
      st = ct_errf(err, CT_ERR_RANGE, "listing s3://%s/%s: more than a million pages", q->bucket,
                   pre.p);
      break;
    }
  }
  free(token);
  free(pre.p);
  return st;
}

static void s3_free(ct_storage *s) {
  s3 *q = s->impl;
  if (!q) return;
  for (int i = 0; i < q->nmulti; i++) curl_multi_cleanup(q->multis[i]);
  free(q->multis);
  pthread_mutex_destroy(&q->multi_mu);
  if (q->share) curl_share_cleanup(q->share);
  for (int i = 0; i < CURL_LOCK_DATA_LAST; i++) pthread_mutex_destroy(&q->share_mu[i]);
  pthread_mutex_destroy(&q->rng_mu);
  if (q->secret_key) OPENSSL_cleanse(q->secret_key, strlen(q->secret_key));
  if (q->token) OPENSSL_cleanse(q->token, strlen(q->token));
  free(q->bucket), free(q->region), free(q->prefix), free(q->scheme), free(q->host);
  free(q->access_key), free(q->secret_key), free(q->token), free(q->name);
  free(q);
}

static const ct_storage_ops s3_ops = {s3_get_many, s3_put,  s3_put_many, s3_head,
                                      s3_del,      s3_list, s3_free};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
}

static const char *env(const char *k) {
  const char *v = getenv(k);
  return v && v[0] ? v : NULL;
}
static const char *given(const char *v) {
  return v && v[0] ? v : NULL;
}

/* Bucket names as S3 allows them (3-63 of a-z 0-9 . -); virtual-hosted
 * addressing also needs them without dots. */
static int bucket_ok(const char *b) {
  size_t n = strlen(b);
  if (n < 3 || n > 63) return 0;
  for (size_t i = 0; i < n; i++)
    if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '.' ||
          b[i] == '-' || b[i] == '_'))
      return 0;
  return 1;
}

ct_status ct_storage_open_s3(const ct_s3_config *c, ct_storage **out, ct_err *err) {
  *out = NULL;
  const char *who = c->name ? c->name : "s3";
  if (!given(c->bucket))
    return ct_errf(err, CT_ERR_INVALID, "%s: aws_bucket_name is required", who);
  if (!bucket_ok(c->bucket))
    return ct_errf(err, CT_ERR_INVALID,
                   "%s: aws_bucket_name '%.80s' is not a valid bucket name (3-63 characters: "
                   "lowercase letters, digits, '.', '-')",
                   who, c->bucket);
  /* credentials: the config, else the environment (never both halves mixed) */
  const char *ak = given(c->access_key), *sk = given(c->secret_key), *tk = given(c->session_token);
  if (!ak && !sk)
    ak = env("AWS_ACCESS_KEY_ID"), sk = env("AWS_SECRET_ACCESS_KEY"),
    tk = tk ? tk : env("AWS_SESSION_TOKEN");
  if (!ak)
    return ct_errf(err, CT_ERR_INVALID,
                   "%s: no access key: set aws_access_key_id (\"{env:VAR}\" reads a variable) "
                   "or AWS_ACCESS_KEY_ID",
                   who);
  if (!sk)
    return ct_errf(err, CT_ERR_INVALID,
                   "%s: no secret key: set aws_secret_access_key (\"{env:VAR}\" reads a "
                   "variable) or AWS_SECRET_ACCESS_KEY",
                   who);
  const char *region = given(c->region);
  if (!region) region = env("AWS_REGION");
  if (!region) region = env("AWS_DEFAULT_REGION");
  if (!region) region = "auto";
  for (const char *p = region; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-'))
      return ct_errf(err, CT_ERR_INVALID,
                     "%s: aws_region_name '%.40s' is not a region name (like us-east-1 or auto)",
                     who, region);
  const char *ep = given(c->endpoint);
  int aws = 0;
  char def_ep[128];
  if (!ep) ep = env("AWS_ENDPOINT_URL_S3");
  if (!ep) ep = env("AWS_ENDPOINT_URL");
  if (!ep) {
    snprintf(def_ep, sizeof def_ep, "https://s3.%s.amazonaws.com",
             strcmp(region, "auto") ? region : "us-east-1");
    ep = def_ep;
    aws = 1;
  }
  const char *sep = strstr(ep, "://");
  if (!sep || (strncmp(ep, "http://", 7) && strncmp(ep, "https://", 8)))
    return ct_errf(err, CT_ERR_INVALID,
                   "%s: aws_endpoint_url '%.200s' must start with http:// or https://", who, ep);
  const char *h = sep + 3;
  size_t hn = strcspn(h, "/?#");
  if (hn == 0 || h[hn] == '?' || h[hn] == '#' || (h[hn] == '/' && h[hn + 1]))
    return ct_errf(err, CT_ERR_INVALID,
                   "%s: aws_endpoint_url '%.200s' must be scheme://host[:port] with no path", who,
                   ep);
  if (memchr(h, '@', hn))
    return ct_errf(err, CT_ERR_INVALID,
                   "%s: aws_endpoint_url must not hold credentials (user@host)", who);
  int virt = c->addressing == CT_S3_ADDR_VIRTUAL || (c->addressing == CT_S3_ADDR_AUTO && aws);
  if (virt && strchr(c->bucket, '.') && !strncmp(ep, "https", 5))
    return ct_errf(err, CT_ERR_INVALID,
                   "%s: bucket '%s' holds dots, which TLS cannot match with virtual-hosted "
                   "addressing; set aws_addressing_style to \"path\"",
                   who, c->bucket);
  ct_storage *s = calloc(1, sizeof *s);
  s3 *q = calloc(1, sizeof *q);
  if (!s || !q) {
    free(s), free(q);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  pthread_mutex_init(&s->stat_mu, NULL);
  s->impl = q;
  s->ops = &s3_ops;
  s->remote = 1;
  for (int i = 0; i < CURL_LOCK_DATA_LAST; i++) pthread_mutex_init(&q->share_mu[i], NULL);
  pthread_mutex_init(&q->multi_mu, NULL);
  pthread_mutex_init(&q->rng_mu, NULL);
  q->rng =
      (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() ^ (uint64_t)(uintptr_t)q;
  if (!q->rng) q->rng = 1;
  q->bucket = strdup(c->bucket);
  q->region = strdup(region);
  q->scheme = strndup(ep, (size_t)(sep - ep));
  /* Host as curl sends it: the scheme's default port is left out */
  size_t keep = hn;
  if (hn > 3 && !strcmp(q->scheme ? q->scheme : "", "http") && !strncmp(h + hn - 3, ":80", 3))
    keep = hn - 3;
  if (hn > 4 && !strcmp(q->scheme ? q->scheme : "", "https") && !strncmp(h + hn - 4, ":443", 4))
    keep = hn - 4;
  q->host = strndup(h, keep);
  q->access_key = strdup(ak);
  q->secret_key = strdup(sk);
  q->token = tk ? strdup(tk) : NULL;
  q->name = strdup(who);
  q->virt = virt;
  q->pool = c->max_connections > 0 ? c->max_connections : 128;
  q->max_retries = c->max_retries == 0 ? 6 : c->max_retries < 0 ? 0 : c->max_retries;
  q->timeout_s = c->timeout_s > 0 ? c->timeout_s : 60;
  q->backoff_s = c->backoff_s > 0 ? c->backoff_s : 0.2;
  const char *pf = given(c->prefix) ? c->prefix : "";
  while (*pf == '/') pf++;
  size_t pn = strlen(pf);
  while (pn && pf[pn - 1] == '/') pn--;
  q->prefix = malloc(pn + 2);
  if (q->prefix) {
    memcpy(q->prefix, pf, pn);
    if (pn) q->prefix[pn++] = '/';
    q->prefix[pn] = 0;
  }
  size_t dn = strlen(q->bucket ? q->bucket : "") + pn + strlen(ep) + 40;
  s->desc = malloc(dn);
  if (s->desc)
    snprintf(s->desc, dn, "s3://%s/%.*s at %s", q->bucket, (int)(pn ? pn - 1 : 0),
             q->prefix ? q->prefix : "", ep);
  pthread_once(&curl_once, curl_init_once);
  q->share = curl_share_init();
  if (!q->bucket || !q->region || !q->scheme || !q->host || !q->access_key || !q->secret_key ||
      (tk && !q->token) || !q->name || !q->prefix || !s->desc || !q->share) {
    ct_storage_free(s);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  curl_share_setopt(q->share, CURLSHOPT_LOCKFUNC, lock_cb);
  curl_share_setopt(q->share, CURLSHOPT_UNLOCKFUNC, unlock_cb);
  curl_share_setopt(q->share, CURLSHOPT_USERDATA, q);
  curl_share_setopt(q->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
  curl_share_setopt(q->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
  *out = s;
  return CT_OK;
}

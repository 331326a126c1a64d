/* hub_fetch.c: downloading a repo's files from the Hugging Face Hub into the
 * cache layout huggingface_hub writes (ctuner/hub.h, docs/hub.md).
 *
 * As huggingface_hub's snapshot_download + hf_hub_download
 * (_snapshot_download.py, file_download.py): the revision's commit sha and
 * file list from /api/models/REPO/revision/REV; per missing file a HEAD of
 * /REPO/resolve/SHA/PATH (relative redirects followed, others not: the
 * X-Linked-Etag/X-Linked-Size of an LFS file sit on the hub's 302), the blob
 * named by the normalised etag (quotes and W/ removed), downloaded into
 * blobs/ETAG.incomplete with Range from its size (resumed across runs and
 * retries), checked against the announced size, renamed, and linked from
 * snapshots/SHA/PATH by a relative symlink; refs/REV written last. Errors
 * use the hub's X-Error-Code / X-Error-Message (utils/_http.py
 * hf_raise_for_status). Not here: huggingface_hub's .locks (ranks other than
 * 0 wait for rank 0 instead), hf_transfer/xet, copying instead of symlinks. */
#include <curl/curl.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctuner/fs.h"
#include "ctuner/hub.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/storage.h"
#include "storage/hub_int.h"

#define API_MAX (16u << 20)
#define ATTEMPTS 5

typedef struct hub {
  char ep[1024];   /* HF_ENDPOINT without a trailing '/' */
  char token[512]; /* "" when none */
  const char *token_from;
  char cache[CT_HUB_PATH], repo[CT_HUB_PATH];
  const char *id, *key;
  long etag_timeout, dl_timeout; /* seconds */
  int quiet, tty;
} hub;

typedef struct resp {
  long status;
  char etag[256], linked_etag[256], commit[64], location[2048], ecode[64], emsg[512];
  long long size, linked_size;
  char *body;
  size_t blen, bmax;
  FILE *out;
  /* progress */
  const char *name;
  long long base, total;
  double t0, last;
  int tty, quiet;
} resp;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long env_long(const char *k, long dflt) {
  const char *v = getenv(k);
  char *end;
  long x = v && *v ? strtol(v, &end, 10) : 0;
  return v && *v && !*end && x > 0 ? x : dflt;
}

/* HF_TOKEN, else HUGGING_FACE_HUB_TOKEN, else HF_TOKEN_PATH (default HF_HOME/token):
 * huggingface_hub utils/_auth.py get_token. */
static void read_token(hub *h) {
  const char *v = getenv("HF_TOKEN");
  h->token_from = "HF_TOKEN";
  if (!v || !*v) {
    v = getenv("HUGGING_FACE_HUB_TOKEN");
    h->token_from = "HUGGING_FACE_HUB_TOKEN";
  }
  if (v && *v) {
    snprintf(h->token, sizeof h->token, "%s", v);
  } else {
    char home[CT_HUB_PATH], path[CT_HUB_PATH + 16];
    const char *from;
    const char *tp = getenv("HF_TOKEN_PATH");
    if (tp && *tp)
      snprintf(path, sizeof path, "%s", tp);
    else if (ct_hub_home(home, sizeof home, &from) || ct_pathf(path, sizeof path, "%s/token", home))
      path[0] = 0;
    h->token_from = "HF_TOKEN_PATH";
    FILE *f = path[0] ? fopen(path, "r") : NULL;
    if (f) {
      if (!fgets(h->token, sizeof h->token, f)) h->token[0] = 0;
      fclose(f);
    }
  }
  /* strip whitespace (get_token strips) */
  char *s = h->token;
  while (*s == ' ' || *s == '\t') s++;
  memmove(h->token, s, strlen(s) + 1);
  size_t l = strlen(h->token);
  while (l && strchr(" \t\r\n", h->token[l - 1])) h->token[--l] = 0;
  if (!l) h->token_from = NULL;
}

/* Percent-encoding as urllib.parse.quote (safe "/" for file paths, none for revisions). */
static void quote(const char *s, int keep_slash, char *out, size_t n) {
  static const char hex[] = "0123456789ABCDEF";
  size_t k = 0;
  for (; *s && k + 4 < n; s++) {
    const unsigned char c = (unsigned char)*s;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
        strchr("-._~", c) || (keep_slash && c == '/')) {
      out[k++] = (char)c;
    } else {
      out[k++] = '%';
      out[k++] = hex[c >> 4];
      out[k++] = hex[c & 15];
    }
  }
  out[k] = 0;
}

static size_t on_header(char *b, size_t sz, size_t nm, void *u) {
  resp *r = u;
  const size_t n = sz * nm;
  char line[2400];
  const size_t l = n < sizeof line - 1 ? n : sizeof line - 1;
  memcpy(line, b, l);
  line[l] = 0;
  line[strcspn(line, "\r\n")] = 0;
  char *colon = strchr(line, ':');
  if (!colon) return n;
  *colon = 0;
  const char *v = colon + 1;
  while (*v == ' ') v++;
  static const struct {
    const char *name;
    size_t off, cap;
  } H[] = {
      {"etag", offsetof(resp, etag), 256},
      {"x-linked-etag", offsetof(resp, linked_etag), 256},
      {"x-repo-commit", offsetof(resp, commit), 64},
      {"location", offsetof(resp, location), 2048},
      {"x-error-code", offsetof(resp, ecode), 64},
      {"x-error-message", offsetof(resp, emsg), 512},
  };
  for (size_t i = 0; i < sizeof H / sizeof H[0]; i++)
    if (!strcasecmp(line, H[i].name)) snprintf((char *)r + H[i].off, H[i].cap, "%s", v);
  if (!strcasecmp(line, "content-length")) r->size = atoll(v);
  if (!strcasecmp(line, "x-linked-size")) r->linked_size = atoll(v);
  return n;
}

static size_t on_body(char *b, size_t sz, size_t nm, void *u) {
  resp *r = u;
  const size_t n = sz * nm;
  if (r->out) return fwrite(b, 1, n, r->out);
  if (r->blen + n + 1 > r->bmax) return 0; /* too large: curl fails the transfer */
  if (!r->body && !(r->body = malloc(r->bmax))) return 0;
  memcpy(r->body + r->blen, b, n);
  r->blen += n;
  r->body[r->blen] = 0;
  return n;
}

static void human(double b, char *out, size_t n) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, i++;
  snprintf(out, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

/* Bytes, rate and ETA: on a terminal a line redrawn 4 times a second, else a
 * line every 10 s; downloads under 10 s show nothing but the closing line. */
static int on_progress(void *u, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
  (void)ut, (void)un;
  resp *r = u;
  const double t = now_s();
  if (r->quiet || !r->name || t - r->t0 < (r->tty ? 1.0 : 10.0) ||
      t - r->last < (r->tty ? 0.25 : 10.0))
    return 0;
  r->last = t;
  const double got = (double)(r->base + dn), tot = dt ? (double)(r->base + dt) : 0;
  const double rate = (double)dn / (t - r->t0);
  char a[32], b[32], c[32];
  human(got, a, sizeof a), human(tot, b, sizeof b), human(rate, c, sizeof c);
  char eta[32] = "?";
  if (tot > 0 && rate > 0) snprintf(eta, sizeof eta, "%.0f s", (tot - got) / rate);
  fprintf(stderr, "%shub: %s %s / %s, %s/s, ETA %s%s", r->tty ? "\r" : "", r->name, a, b, c, eta,
          r->tty ? "\033[K" : "\n");
  return 0;
}

/* One request. method "GET" or "HEAD"; from > 0: Range bytes=from-. Returns
 * the curl code (the HTTP status in r->status). */
static CURLcode request(const hub *h, const char *method, const char *url, long long from,
                        int follow, long timeout, resp *r) {
  CURL *c = curl_easy_init();
  if (!c) return CURLE_FAILED_INIT;
  struct curl_slist *hd = NULL;
  char auth[600], range[64];
  if (h->token[0]) {
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", h->token);
    hd = curl_slist_append(hd, auth); /* libcurl does not send it to another host */
  }
  hd = curl_slist_append(hd, "user-agent: ctuner; hf_hub/compatible");
  hd = curl_slist_append(hd, "Accept-Encoding: identity"); /* file_download.py: sizes are raw */
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
  if (!strcmp(method, "HEAD")) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  if (from > 0) {
    snprintf(range, sizeof range, "%lld-", from);
    curl_easy_setopt(c, CURLOPT_RANGE, range);
  }
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, follow ? 1L : 0L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, h->etag_timeout);
  if (timeout) curl_easy_setopt(c, CURLOPT_TIMEOUT, timeout);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, h->dl_timeout);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, r);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  CURLcode cc = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
  curl_easy_cleanup(c);
  curl_slist_free_all(hd);
  return cc;
}

/* An HTTP error as huggingface_hub explains it (utils/_http.py hf_raise_for_status). */
static ct_status http_error(const hub *h, const char *what, const resp *r, ct_err *err) {
  const char *code = r->ecode[0] ? r->ecode : "";
  const char *tok = h->token_from ? h->token_from : NULL;
  char why[1400];
  if (!strcmp(code, "GatedRepo"))
    snprintf(why, sizeof why,
             "the repo is gated: accept its terms on %s/%s while logged in, with a token "
             "(HF_TOKEN) of that account",
             h->ep, h->id);
  else if (r->status == 401 && tok)
    snprintf(why, sizeof why,
             "the token from %s was refused (a typo, a revoked token, or one without access "
             "to this repo)",
             tok);
  else if (r->status == 401 || (r->status == 404 && !strcmp(code, "RepoNotFound")))
    snprintf(why, sizeof why,
             "no such repo %s%s (check the id; a private or gated repo needs a token: set "
             "HF_TOKEN or run huggingface-cli login)",
             h->id, tok ? " visible to the token" : "");
  else if (!strcmp(code, "RevisionNotFound"))
    snprintf(why, sizeof why, "no such revision (check revision: a branch, tag or commit)");
  else if (r->status == 403)
    snprintf(why, sizeof why, "forbidden (the token from %s lacks read access)",
             tok ? tok : "(none)");
  else
    snprintf(why, sizeof why, "HTTP %ld", r->status);
  return ct_errf(err, r->status == 404 ? CT_ERR_NOT_FOUND : CT_ERR_IO,
                 "%s '%s': %s answered %ld for %s: %s%s%s", h->key, h->id, h->ep, r->status, what,
                 why, r->emsg[0] ? "; the hub says: " : "", r->emsg);
}

/* GET /api/models/REPO/revision/REV: the commit sha and the file list.
 * *unreachable set when the hub cannot be reached (the caller uses the cache). */
static ct_status list_files(const hub *h, const char *rev, char sha[41], char ***files, size_t *nf,
                            int *unreachable, ct_err *err) {
  char qrev[800], url[2400];
  quote(rev, 0, qrev, sizeof qrev);
  snprintf(url, sizeof url, "%s/api/models/%s/revision/%s", h->ep, h->id, qrev);
  resp r = {0};
  r.bmax = API_MAX;
  CURLcode cc = request(h, "GET", url, 0, 1, h->etag_timeout * 6, &r);
  if (cc != CURLE_OK) {
    free(r.body);
    /* snapshot_download falls back to the cache on connection errors and timeouts only */
    *unreachable = cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST ||
                   cc == CURLE_COULDNT_RESOLVE_PROXY || cc == CURLE_OPERATION_TIMEDOUT ||
                   cc == CURLE_GOT_NOTHING || cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR ||
                   cc == CURLE_SSL_CONNECT_ERROR;
    return ct_errf(err, CT_ERR_IO, "cannot reach %s: %s", h->ep, curl_easy_strerror(cc));
  }
  if (r.status != 200) {
    free(r.body);
    return http_error(h, "the file list", &r, err);
  }
  ct_json *j = NULL;
  ct_status st = ct_json_parse(r.body ? r.body : "", r.blen, &j, err);
  free(r.body);
  if (st) return ct_errf(err, CT_ERR_FORMAT, "%s: the file list of %s is not JSON", h->ep, h->id);
  const ct_json *s = ct_json_get(j, "sha"), *sib = ct_json_get(j, "siblings");
  if (!s || s->type != CT_JSON_STRING || !ct_hub_is_commit(s->str) || !sib ||
      sib->type != CT_JSON_ARRAY) {
    ct_json_free(j);
    return ct_errf(err, CT_ERR_FORMAT,
                   "%s: the file list of %s has no 40-hex \"sha\" or no \"siblings\" array", h->ep,
                   h->id);
  }
  memcpy(sha, s->str, 41);
  char **v = calloc(sib->n + 1, sizeof *v);
  size_t k = 0;
  for (size_t i = 0; v && i < sib->n; i++) {
    const ct_json *f = ct_json_get(&sib->items[i], "rfilename");
    if (!f || f->type != CT_JSON_STRING || !ct_storage_key_ok(f->str) || strlen(f->str) > 1000) {
      CT_WARN("hub: %s lists a file name ctuner does not accept; skipped", h->id);
      continue;
    }
    if (!(v[k] = strdup(f->str))) break;
    k++;
  }
  ct_json_free(j);
  if (!v) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  *files = v;
  *nf = k;
  return CT_OK;
}

static void free_list(char **v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

/* The etag as file_download.py _normalize_etag: no "W/" prefix, no quotes;
 * ctuner also insists on a file-name-safe one (it names the blob). */
static int normalize_etag(const char *in, char *out, size_t n) {
  if (!strncmp(in, "W/", 2)) in += 2;
  size_t k = 0;
  for (; *in && k + 1 < n; in++) {
    if (*in == '"') continue;
    if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.", *in))
      return -1;
    out[k++] = *in;
  }
  out[k] = 0;
  return k && strcmp(out, ".") && strcmp(out, "..") ? 0 : -1;
}

/* HEAD of the file's resolve URL: its etag and size (relative redirects followed,
 * as file_download.py's _request_wrapper(follow_relative_redirects=True)). */
static ct_status head_file(const hub *h, const char *sha, const char *file, char *etag, size_t en,
                           long long *size, ct_err *err) {
  char qf[3100], url[4400];
  quote(file, 1, qf, sizeof qf);
  snprintf(url, sizeof url, "%s/%s/resolve/%s/%s", h->ep, h->id, sha, qf);
  for (int hop = 0; hop < 5; hop++) {
    resp r = {0};
    CURLcode cc = request(h, "HEAD", url, 0, 0, h->etag_timeout, &r);
    if (cc != CURLE_OK)
      return ct_errf(err, CT_ERR_IO, "%s '%s': %s: HEAD %s: %s", h->key, h->id, file, h->ep,
                     curl_easy_strerror(cc));
    if (r.status >= 300 && r.status < 400 && r.location[0] == '/' && !r.linked_etag[0]) {
      snprintf(url, sizeof url, "%s%s", h->ep, r.location);
      continue;
    }
    if (r.status >= 400) {
      char what[1100];
      snprintf(what, sizeof what, "%s", file);
      return http_error(h, what, &r, err);
    }
    const char *e = r.linked_etag[0] ? r.linked_etag : r.etag;
    *size = r.linked_etag[0] && r.linked_size > 0 ? r.linked_size : r.size;
    if (normalize_etag(e, etag, en) || *size < 0)
      return ct_errf(err, CT_ERR_FORMAT,
                     "%s '%s': %s: the hub sent no usable ETag/X-Linked-Etag ('%s') or size",
                     h->key, h->id, file, e);
    return CT_OK;
  }
  return ct_errf(err, CT_ERR_IO, "%s '%s': %s: too many redirects", h->key, h->id, file);
}

static long long file_size(const char *p) {
  struct stat sb;
  return stat(p, &sb) ? -1 : (long long)sb.st_size;
}

static int transient(CURLcode cc, long status) {
  if (cc == CURLE_OK) return status >= 500 || status == 429 || status == 408;
  return cc == CURLE_PARTIAL_FILE || cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR ||
         cc == CURLE_OPERATION_TIMEDOUT || cc == CURLE_GOT_NOTHING || cc == CURLE_COULDNT_CONNECT;
}

/* blobs/ETAG from the resolve URL, resuming ETAG.incomplete; a few retries. */
static ct_status get_blob(const hub *h, const char *sha, const char *file, const char *blob,
                          long long size, ct_err *err) {
  char inc[CT_HUB_PATH + 300], qf[3100], url[4400];
  ct_pathf(inc, sizeof inc, "%s.incomplete", blob);
  quote(file, 1, qf, sizeof qf);
  snprintf(url, sizeof url, "%s/%s/resolve/%s/%s", h->ep, h->id, sha, qf);
  const double t0 = now_s();
  long long first = file_size(inc) > 0 ? file_size(inc) : 0;
  for (int attempt = 0;; attempt++) {
    long long have = file_size(inc);
    if (have < 0) have = 0;
    if (have > size) have = 0; /* not this file: start over */
    FILE *f = fopen(inc, have ? "ab" : "wb");
    if (!f) return ct_errf(err, CT_ERR_IO, "%s: %s", inc, strerror(errno));
    resp r = {0};
    r.out = f, r.name = file, r.base = have, r.t0 = now_s(), r.tty = h->tty, r.quiet = h->quiet;
    CURLcode cc = have == size ? CURLE_OK : request(h, "GET", url, have, 1, 0, &r);
    if (have == size) r.status = 206;
    const int wrote = fclose(f) == 0;
    if (h->tty && !h->quiet && r.last > 0) fputs("\r\033[K", stderr);
    if (cc == CURLE_OK && r.status == 200 && have > 0) { /* the server ignored Range */
      if (truncate(inc, 0)) return ct_errf(err, CT_ERR_IO, "%s: %s", inc, strerror(errno));
      continue;
    }
    if (cc == CURLE_OK && (r.status == 200 || r.status == 206) && wrote) break;
    if (attempt + 1 < ATTEMPTS && transient(cc, r.status)) {
      CT_WARN("hub: %s: %s after %lld bytes; resuming (try %d of %d)", file,
              cc ? curl_easy_strerror(cc) : "server error", file_size(inc), attempt + 2, ATTEMPTS);
      usleep((useconds_t)(250000u << attempt));
      continue;
    }
    if (cc == CURLE_OK && r.status >= 400) return http_error(h, file, &r, err);
    return ct_errf(err, CT_ERR_IO,
                   "%s '%s': %s: download failed after %lld of %lld bytes (%s); run again to "
                   "resume from %s",
                   h->key, h->id, file, file_size(inc), size,
                   cc ? curl_easy_strerror(cc) : "write error", inc);
  }
  const long long got = file_size(inc);
  if (got != size) /* file_download.py: "Consistency check failed" */
    return ct_errf(err, CT_ERR_IO,
                   "%s '%s': %s: downloaded %lld bytes, the hub announced %lld; run again (the "
                   "partial file %s is kept)",
                   h->key, h->id, file, got, size, inc);
  if (rename(inc, blob)) return ct_errf(err, CT_ERR_IO, "%s: %s", blob, strerror(errno));
  const double dt = now_s() - t0;
  char a[32], b[32];
  human((double)size, a, sizeof a),
      human((double)(size - first) / (dt > 1e-3 ? dt : 1e-3), b, sizeof b);
  if (!h->quiet)
    CT_INFO("hub: %s/%s: %s%s, %.1f s, %s/s", h->id, file, a, first ? " (resumed)" : "", dt, b);
  return CT_OK;
}

/* snapshots/SHA/FILE -> ../../blobs/ETAG (one more ../ per directory in FILE). */
static ct_status link_snapshot(const hub *h, const char *snap, const char *file, const char *etag,
                               ct_err *err) {
  char path[CT_HUB_PATH + 1100], target[1400] = "", dir[CT_HUB_PATH + 1100];
  ct_pathf(path, sizeof path, "%s/%s", snap, file);
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = 0;
  ct_status st = ct_mkdir_p(dir, err);
  if (st) return st;
  size_t k = 0;
  for (int d = 0; d < 2; d++) k += (size_t)snprintf(target + k, sizeof target - k, "../");
  for (const char *p = file; *p; p++)
    if (*p == '/') k += (size_t)snprintf(target + k, sizeof target - k, "../");
  snprintf(target + k, sizeof target - k, "blobs/%s", etag);
  unlink(path);
  if (symlink(target, path))
    return ct_errf(err, CT_ERR_IO, "%s '%s': cannot link %s -> %s: %s", h->key, h->id, path, target,
                   strerror(errno));
  return CT_OK;
}

/* One file into the cache, unless the snapshot has it already. */
static ct_status fetch_one(const hub *h, const char *sha, const char *file, ct_err *err) {
  char snap[CT_HUB_PATH + 64], path[CT_HUB_PATH + 1100], blob[CT_HUB_PATH + 300];
  ct_pathf(snap, sizeof snap, "%s/snapshots/%s", h->repo, sha);
  ct_pathf(path, sizeof path, "%s/%s", snap, file);
  if (file_size(path) >= 0) return CT_OK; /* try_to_load_from_cache's hit */
  char etag[256];
  long long size = 0;
  ct_status st = head_file(h, sha, file, etag, sizeof etag, &size, err);
  if (st) return st;
  ct_pathf(blob, sizeof blob, "%s/blobs/%s", h->repo, etag);
  if (file_size(blob) != size) {
    char bdir[CT_HUB_PATH + 16];
    ct_pathf(bdir, sizeof bdir, "%s/blobs", h->repo);
    if ((st = ct_mkdir_p(bdir, err)) || (st = get_blob(h, sha, file, blob, size, err))) return st;
  }
  return link_snapshot(h, snap, file, etag, err);
}

/* refs/REV holding sha (not for a commit revision: file_download.py
 * _cache_commit_hash_for_specific_revision). */
static ct_status write_ref(const hub *h, const char *rev, const char *sha, ct_err *err) {
  if (ct_hub_is_commit(rev)) return CT_OK;
  char ref[CT_HUB_PATH + 300], dir[CT_HUB_PATH + 300];
  ct_pathf(ref, sizeof ref, "%s/refs/%s", h->repo, rev);
  snprintf(dir, sizeof dir, "%s", ref);
  *strrchr(dir, '/') = 0;
  ct_status st = ct_mkdir_p(dir, err);
  return st ? st : ct_write_file_replace(ref, sha, 40, err);
}

/* model_index.json's component folders (pipeline_utils.py download: its list-valued keys). */
static ct_status components(const hub *h, const char *sha, char ***names, size_t *n, ct_err *err) {
  ct_status st = fetch_one(h, sha, "model_index.json", err);
  if (st) return st;
  char path[CT_HUB_PATH + 100];
  ct_pathf(path, sizeof path, "%s/snapshots/%s/model_index.json", h->repo, sha);
  ct_json *j = NULL;
  if ((st = ct_json_parse_file(path, 1 << 20, &j, err))) return st;
  char **v = calloc(j->n + 1, sizeof *v);
  size_t k = 0;
  for (size_t i = 0; v && j->type == CT_JSON_OBJECT && i < j->n; i++)
    if (j->keys[i][0] != '_' && j->items[i].type == CT_JSON_ARRAY && ct_storage_key_ok(j->keys[i]))
      v[k++] = strdup(j->keys[i]);
  ct_json_free(j);
  if (!v) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  *names = v;
  *n = k;
  return CT_OK;
}

static int listed(char *const *files, size_t n, const char *dir, const char *name) {
  char want[1200];
  snprintf(want, sizeof want, "%s/%s", dir, name);
  for (size_t i = 0; i < n; i++)
    if (!strcmp(files[i], want)) return 1;
  return 0;
}

/* The revision's files the load needs, each fetched unless cached. */
static ct_status fetch_listed(const hub *h, const ct_hub_opts *o, const char *sha, char **files,
                              size_t nf, ct_err *err) {
  const char *sub = o->subfolder && *o->subfolder ? o->subfolder : NULL;
  if (sub && o->subfolder_optional && !listed(files, nf, sub, "config.json")) sub = NULL;
  char **comp = NULL;
  size_t nc = 0;
  ct_status st = CT_OK;
  int has_index = 0;
  for (size_t i = 0; i < nf; i++) has_index |= !strcmp(files[i], "model_index.json");
  if (!sub && has_index && (st = components(h, sha, &comp, &nc, err))) return st;
  for (size_t i = 0; o->skip && i < nc;) { /* components another key replaces */
    int drop = 0;
    for (const char *const *s = o->skip; *s && !drop; s++) drop = !strcmp(*s, comp[i]);
    if (drop) {
      free(comp[i]);
      comp[i] = comp[--nc];
    } else {
      i++;
    }
  }
  int *keep = calloc(nf + 1, sizeof *keep);
  if (!keep) {
    free_list(comp, nc);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  ct_hub_wanted((const char *const *)files, nf, (const char *const *)comp, comp ? nc : 0, sub,
                o->variant, keep);
  size_t nk = 0;
  for (size_t i = 0; i < nf; i++) nk += (size_t)keep[i];
  if (!nk)
    st = ct_errf(err, CT_ERR_NOT_FOUND, "%s '%s' (commit %s): no file to fetch%s%s", h->key, h->id,
                 sha, sub ? " under " : "", sub ? sub : "");
  for (size_t i = 0, k = 0; !st && i < nf; i++) {
    if (!keep[i]) continue;
    k++;
    if (!h->quiet && h->tty)
      fprintf(stderr, "\rhub: %s [%zu/%zu] %s\033[K", h->id, k, nk, files[i]);
    st = fetch_one(h, sha, files[i], err);
  }
  if (!h->quiet && h->tty) fputs("\r\033[K", stderr);
  free(keep);
  free_list(comp, nc);
  return st;
}

/* More words after err's message (as far as they fit). */
static void append(ct_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void append(ct_err *err, const char *fmt, ...) {
  const size_t l = strlen(err->msg);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg + l, sizeof err->msg - l, fmt, ap);
  va_end(ap);
}

static ct_status hub_init(hub *h, const char *id, const ct_hub_opts *o, ct_err *err) {
  memset(h, 0, sizeof *h);
  h->id = id;
  h->key = o->key ? o->key : "model";
  h->quiet = o->quiet;
  h->tty = isatty(2);
  const char *ep = getenv("HF_ENDPOINT"); /* constants.py: ENDPOINT, rstrip("/") */
  snprintf(h->ep, sizeof h->ep, "%s", ep && *ep ? ep : "https://huggingface.co");
  for (size_t l = strlen(h->ep); l && h->ep[l - 1] == '/';) h->ep[--l] = 0;
  if (strncmp(h->ep, "http://", 7) && strncmp(h->ep, "https://", 8))
    return ct_errf(err, CT_ERR_INVALID, "HF_ENDPOINT '%s' is not an http(s):// URL", h->ep);
  /* constants.py: HF_HUB_ETAG_TIMEOUT and HF_HUB_DOWNLOAD_TIMEOUT, 10 s each */
  h->etag_timeout = env_long("HF_HUB_ETAG_TIMEOUT", 10);
  h->dl_timeout = env_long("HF_HUB_DOWNLOAD_TIMEOUT", 10);
  read_token(h);
  ct_status st = ct_hub_cache_dir(h->cache, sizeof h->cache, NULL, err);
  if (!st && ct_hub_repo_dir(h->cache, id, h->repo, sizeof h->repo))
    st = ct_errf(err, CT_ERR_RANGE, "%s '%s': the cache path is too long", h->key, id);
  return st;
}

ct_status ct_hub_fetch(const char *id, const ct_hub_opts *o, char *out, size_t n, ct_err *err) {
  static const ct_hub_opts none = {0};
  if (!o) o = &none;
  const char *rev = o->revision ? o->revision : "main";
  const char *key = o->key ? o->key : "model";
  if (!ct_hub_is_repo_id(id))
    return ct_errf(err, CT_ERR_INVALID, "%s '%s' is neither a local path nor a hub id (org/name)",
                   key, id);
  if (!ct_hub_revision_ok(rev))
    return ct_errf(err, CT_ERR_INVALID, "%s '%s': revision '%s' is not a branch, tag or commit",
                   key, id, rev);
  if (ct_hub_offline()) {
    ct_status st = ct_hub_lookup(id, o, out, n, err);
    if (st) append(err, "; HF_HUB_OFFLINE is set, so nothing was downloaded");
    return st;
  }
  hub *h = calloc(1, sizeof *h);
  if (!h) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = hub_init(h, id, o, err);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  char sha[41], **files = NULL;
  size_t nf = 0;
  int unreachable = 0;
  if (!st) st = list_files(h, rev, sha, &files, &nf, &unreachable, err);
  if (st && unreachable) { /* snapshot_download: the cache when the hub is out of reach */
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    memset(err, 0, sizeof *err);
    st = ct_hub_lookup(id, o, out, n, err);
    if (!st)
      CT_WARN("hub: %s; using the cached %s (revision %s) as it is", why, id, rev);
    else
      append(err, "; and %s (HF_ENDPOINT) to download it", why);
    free(h);
    return st;
  }
  if (!st) st = fetch_listed(h, o, sha, files, nf, err);
  if (!st) st = write_ref(h, rev, sha, err);
  if (!st && ct_pathf(out, n, "%s/snapshots/%s", h->repo, sha))
    st = ct_errf(err, CT_ERR_RANGE, "%s '%s': the snapshot path is too long", key, id);
  free_list(files, nf);
  free(h);
  return st;
}

/* webhook.c: SimpleTuner-compatible webhooks.
 *
 * --webhook_config is a path to a JSON file or inline JSON, an object or a
 * list of objects ({webhook_type: discord|raw, webhook_url | callback_url,
 * message_prefix, log_level, auth_token, ssl_no_verify}). Events are queued
 * by the training threads (never blocking: a full queue drops the event) and
 * sent by one background thread over libcurl: POST, a per-request timeout,
 * retries with exponential backoff and jitter on connection errors,
 * timeouts, 429 and 5xx. The auth token goes only into the X-API-Key header:
 * it is never logged, and URLs are logged as their host only (a Discord
 * webhook URL carries its own secret). */
#define _GNU_SOURCE /* asprintf */
#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "ctuner/alloc.h"
#include "ctuner/fs.h"
#include "ctuner/log.h"
#include "ctuner/parse.h"
#include "health/health_int.h"

static const char *const SEV[] = {"critical", "error", "warning", "info", "debug"};

const char *ct_severity_name(ct_severity s) {
  return s >= 0 && s <= CT_SEV_DEBUG ? SEV[s] : "info";
}

char *ct_json_quote(const char *s) {
  if (!s) return strdup("null");
  size_t n = strlen(s), cap = n * 6 + 3, w = 0;
  char *o = malloc(cap);
  if (!o) return NULL;
  o[w++] = '"';
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
      case '"':
        o[w++] = '\\', o[w++] = '"';
        break;
      case '\\':
        o[w++] = '\\', o[w++] = '\\';
        break;
      case '\n':
        o[w++] = '\\', o[w++] = 'n';
        break;
      case '\r':
        o[w++] = '\\', o[w++] = 'r';
        break;
      case '\t':
        o[w++] = '\\', o[w++] = 't';
        break;
      default:
        if (*p < 0x20)
          w += (size_t)snprintf(o + w, cap - w, "\\u%04x", *p);
        else
          o[w++] = (char)*p;
    }
  }
  o[w++] = '"';
  o[w] = 0;
  return o;
}

/* ------------------------------------------------------------- config */

static void hook_free(ct_hook *h) {
  free(h->url);
  free(h->message_prefix);
  ct_free_secret(h->auth_token);
  memset(h, 0, sizeof *h);
}

void ct_hooks_free(ct_hook *hooks, int n) {
  for (int i = 0; hooks && i < n; i++) hook_free(&hooks[i]);
  free(hooks);
}

static ct_status str_key(const ct_json *o, const char *key, int idx, char **out, ct_err *err) {
  const ct_json *v = ct_json_get(o, key);
  if (!v || v->type == CT_JSON_NULL) return CT_OK;
  if (v->type != CT_JSON_STRING)
    return ct_errf(err, CT_ERR_INVALID, "entry %d: %s must be a string, got %s", idx, key,
                   ct_json_type_name(v->type));
  if (!(*out = strdup(v->str))) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  return CT_OK;
}

static ct_status parse_one(const ct_json *o, int idx, ct_hook *h, ct_err *err) {
  static const char *const known[] = {"webhook_type",   "webhook_url", "callback_url",
                                      "message_prefix", "log_level",   "auth_token",
                                      "ssl_no_verify",  NULL};
  memset(h, 0, sizeof *h);
  h->log_level = CT_SEV_INFO;
  if (o->type != CT_JSON_OBJECT)
    return ct_errf(err, CT_ERR_INVALID, "entry %d must be an object, got %s", idx,
                   ct_json_type_name(o->type));
  for (size_t i = 0; i < o->n; i++) {
    int ok = 0;
    for (int k = 0; known[k]; k++) ok |= !strcmp(o->keys[i], known[k]);
    if (!ok)
      CT_WARN(
          "webhook_config entry %d: unknown key '%s' ignored (known: webhook_type, webhook_url, "
          "callback_url, "
          "message_prefix, log_level, auth_token, ssl_no_verify)",
          idx, o->keys[i]);
  }
  char *type = NULL, *level = NULL, *wurl = NULL, *curl = NULL;
  ct_status st = str_key(o, "webhook_type", idx, &type, err);
  if (!st) st = str_key(o, "log_level", idx, &level, err);
  if (!st) st = str_key(o, "webhook_url", idx, &wurl, err);
  if (!st) st = str_key(o, "callback_url", idx, &curl, err);
  if (!st) st = str_key(o, "message_prefix", idx, &h->message_prefix, err);
  if (!st) st = str_key(o, "auth_token", idx, &h->auth_token, err);
  const ct_json *v = ct_json_get(o, "ssl_no_verify");
  if (!st && v && v->type != CT_JSON_NULL) {
    if (v->type != CT_JSON_BOOL)
      st = ct_errf(err, CT_ERR_INVALID, "entry %d: ssl_no_verify must be true or false, got %s",
                   idx, ct_json_type_name(v->type));
    else
      h->ssl_no_verify = v->boolean;
  }
  if (!st && !type)
    st = ct_errf(err, CT_ERR_INVALID, "entry %d: webhook_type is required (\"discord\" or \"raw\")",
                 idx);
  if (!st && strcmp(type, "discord") && strcmp(type, "raw"))
    st = ct_errf(err, CT_ERR_INVALID,
                 "entry %d: webhook_type '%s' is not supported: use \"discord\" or \"raw\"", idx,
                 type);
  if (!st) {
    h->type = !strcmp(type, "raw") ? CT_HOOK_RAW : CT_HOOK_DISCORD;
    if (h->type == CT_HOOK_DISCORD && !wurl)
      st = ct_errf(err, CT_ERR_INVALID, "entry %d: a discord webhook needs webhook_url", idx);
    if (h->type == CT_HOOK_RAW && (!curl || !curl[0]) && !wurl)
      st = ct_errf(err, CT_ERR_INVALID, "entry %d: a raw webhook needs callback_url", idx);
  }
  if (!st) { /* SimpleTuner posts to webhook_url when both are set */
    h->url = wurl ? wurl : curl;
    if (wurl) free(curl);
    wurl = curl = NULL;
    if (strncmp(h->url, "http://", 7) && strncmp(h->url, "https://", 8))
      st = ct_errf(err, CT_ERR_INVALID,
                   "entry %d: the webhook URL must start with http:// or https://", idx);
  }
  if (!st && level) {
    int found = -1;
    for (int k = 0; k <= CT_SEV_DEBUG; k++)
      if (!strcasecmp(level, SEV[k])) found = k;
    if (found < 0)
      st = ct_errf(err, CT_ERR_INVALID,
                   "entry %d: log_level '%s' is not one of critical, error, warning, info, debug",
                   idx, level);
    else
      h->log_level = (ct_severity)found;
  }
  free(type), free(level), free(wurl), free(curl);
  if (st) hook_free(h);
  return st;
}

ct_status ct_hooks_parse(const char *value, ct_hook **hooks, int *n, ct_err *err) {
  *hooks = NULL;
  *n = 0;
  while (*value == ' ' || *value == '\t' || *value == '\n' || *value == '\r') value++;
  char *text = NULL, *expanded = NULL;
  size_t len = 0;
  ct_status st;
  const char *where = "inline JSON";
  if (*value == '{' || *value == '[') {
    st = (text = strdup(value)) ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  } else {
    where = value;
    if (strstr(value,
               "://")) /* a URL given where the config goes: never echo it (it may hold a secret) */
      return ct_errf(err, CT_ERR_INVALID,
                     "webhook_config looks like a URL: give a JSON file path, or an object such as "
                     "{\"webhook_type\": \"discord\", \"webhook_url\": \"...\"}");
    st = ct_read_file(value, 1 << 20, &text, &len, err);
    if (st == CT_ERR_NOT_FOUND)
      st = ct_errf(err, CT_ERR_NOT_FOUND,
                   "webhook_config file not found: %s (give a path, or an inline object or list)",
                   value);
  }
  if (!st) st = ct_expand_env(text, NULL, &expanded, err); /* {env:VAR}, e.g. for auth_token */
  free(text);
  ct_json *j = NULL;
  if (!st) st = ct_json_parse(expanded, strlen(expanded), &j, err);
  ct_free_secret(expanded); /* may hold an auth_token */
  if (st) {
    ct_err_prefix(err, "%s: ", where);
    return st;
  }
  const int list = j->type == CT_JSON_ARRAY;
  const size_t cnt = list ? j->n : 1;
  if (list && cnt == 0)
    st = ct_errf(err, CT_ERR_INVALID, "%s: an empty list configures no webhook", where);
  ct_hook *hs = st ? NULL : calloc(cnt, sizeof *hs);
  if (!st && !hs) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  size_t k = 0;
  for (; !st && k < cnt; k++) st = parse_one(list ? &j->items[k] : j, (int)k, &hs[k], err);
  ct_json_free(j);
  if (st) {
    ct_hooks_free(hs,
                  hs ? (int)cnt : 0); /* a failed entry freed its own strings; the rest are zero */
    if (strcmp(where, "inline JSON")) ct_err_prefix(err, "%s: ", where);
    return st;
  }
  *hooks = hs;
  *n = (int)cnt;
  return CT_OK;
}

ct_status ct_health_check_webhooks(const char *value, ct_err *err) {
  ct_hook *h = NULL;
  int n = 0;
  ct_status st = ct_hooks_parse(value, &h, &n, err);
  if (st) {
    ct_err_prefix(err, "webhook_config: ");
    return st;
  }
  ct_hooks_free(h, n);
  return CT_OK;
}

/* --------------------------------------------------------------- bodies */

static void iso8601(double when, char out[64]) {
  time_t s = (time_t)when;
  struct tm tm;
  gmtime_r(&s, &tm);
  char b[32];
  strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%S", &tm);
  long us = (long)((when - (double)s) * 1e6);
  if (us < 0) us = 0;
  if (us > 999999) us = 999999;
  snprintf(out, 64, "%.20s.%06ld+00:00", b, us);
}

char *ct_event_body(const ct_event *ev, const ct_hook *h, const char *job_id) {
  char *body = NULL;
  if (h->type == CT_HOOK_DISCORD) {
    /* Discord: {"content": "`(prefix)` text"}, at most 2000 characters */
    size_t pl = h->message_prefix ? strlen(h->message_prefix) + 6 : 0;
    char *t = malloc(pl + strlen(ev->text ? ev->text : "") + 1);
    if (!t) return NULL;
    if (h->message_prefix)
      sprintf(t, "`(%s)` %s", h->message_prefix, ev->text ? ev->text : "");
    else
      strcpy(t, ev->text ? ev->text : "");
    size_t n = 0, chars = 0;
    for (; t[n] && chars < 2000; chars++) { /* whole UTF-8 characters */
      n++;
      while ((t[n] & 0xC0) == 0x80) n++;
    }
    t[n] = 0;
    char *q = ct_json_quote(t);
    free(t);
    if (q && asprintf(&body, "{\"content\": %s}", q) < 0) body = NULL;
    free(q);
    return body;
  }
  char ts[64];
  iso8601(ev->when, ts);
  char *jid = job_id && job_id[0] ? ct_json_quote(job_id) : strdup("null");
  if (jid &&
      asprintf(&body,
               "{\"type\": \"%s\", \"severity\": \"%s\", \"job_id\": %s, \"timestamp\": \"%s\"%s}",
               ev->type, ct_severity_name(ev->severity), jid, ts, ev->fields ? ev->fields : "") < 0)
    body = NULL;
  free(jid);
  return body;
}

/* --------------------------------------------------------------- sender */

struct ct_sender {
  ct_hook *hooks;
  int n;
  ct_sender_opts o;
  char job_id[128];
  pthread_t th;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  ct_event *q;
  int head, count;
  int busy; /* an event is being delivered */
  int stop;
  atomic_int abort_now;
  long sent, failed, dropped;
  uint64_t rng;
  unsigned char *down; /* per endpoint: its last event failed every attempt */
};

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
}

static size_t discard(char *p, size_t sz, size_t n, void *u) {
  (void)p, (void)u;
  return sz * n;
}

static int xfer_abort(void *u, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d) {
  (void)a, (void)b, (void)c, (void)d;
  return atomic_load(&((ct_sender *)u)->abort_now); /* non-zero aborts the transfer */
}

/* "https://host[:port]" of a URL, for logs. */
static void url_host(const char *url, char *out, size_t n) {
  const char *p = strstr(url, "://");
  p = p ? p + 3 : url;
  size_t k = strcspn(p, "/?#");
  const char *at = memchr(p, '@', k); /* user:password@ */
  if (at) k -= (size_t)(at + 1 - p), p = at + 1;
  snprintf(out, n, "%.*s", (int)k, p);
}

/* Sleeps up to s seconds; returns early (1) when stopping for good. */
static int nap(ct_sender *s, double secs) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  double until = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + secs;
  ts.tv_sec = (time_t)until;
  ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
  pthread_mutex_lock(&s->mu);
  while (!atomic_load(&s->abort_now) && pthread_cond_timedwait(&s->cv, &s->mu, &ts) == 0) {
  }
  pthread_mutex_unlock(&s->mu);
  return atomic_load(&s->abort_now);
}

/* The header list holds the X-API-Key line: wiped before freed. */
static void free_headers(struct curl_slist *h) {
  for (struct curl_slist *p = h; p; p = p->next)
    if (p->data) ct_wipe(p->data, strlen(p->data));
  curl_slist_free_all(h);
}

/* One event to one endpoint, with retries; 1 if delivered. */
static int deliver(ct_sender *s, const ct_hook *h, const char *type, const char *body,
                   int retries) {
  char host[256];
  url_host(h->url, host, sizeof host);
  CURL *c = curl_easy_init();
  if (!c) return 0;
  struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json"), *h2 = NULL;
  char *key = NULL;
  if (h->auth_token && asprintf(&key, "X-API-Key: %s", h->auth_token) < 0) key = NULL;
  if (hdr && key) h2 = curl_slist_append(hdr, key);
  if (!hdr || (h->auth_token && !h2)) { /* never send without the header the endpoint expects */
    CT_WARN("webhook %s: out of memory building the request; %s event not sent", host, type);
    free_headers(hdr);
    ct_free_secret(key);
    curl_easy_cleanup(c);
    return 0;
  }
  curl_easy_setopt(c, CURLOPT_URL, h->url);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(s->o.timeout_s * 1000));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)(s->o.timeout_s * 1000));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, xfer_abort);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, s);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "ctuner-webhook/1");
  if (h->ssl_no_verify) {
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  int ok = 0;
  double delay = s->o.backoff_s;
  for (int attempt = 0; attempt <= retries && !atomic_load(&s->abort_now); attempt++) {
    CURLcode rc = curl_easy_perform(c);
    long code = 0;
    if (rc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    if (rc == CURLE_OK && code >= 200 && code < 300) {
      ok = 1;
      break;
    }
    const int retry = rc != CURLE_OK || code == 429 || code >= 500 || code == 408;
    char why[160];
    if (rc != CURLE_OK)
      snprintf(why, sizeof why, "%s", curl_easy_strerror(rc));
    else
      snprintf(why, sizeof why, "HTTP %ld", code);
    if (!retry) {
      CT_WARN("webhook %s (%s): %s event refused with %s; not retried", host,
              h->type == CT_HOOK_RAW ? "raw" : "discord", type, why);
      break;
    }
    if (attempt == retries) {
      CT_WARN("webhook %s: %s event not delivered after %d attempt(s): %s", host, type, attempt + 1,
              why);
      break;
    }
    /* exponential backoff with jitter in [0.5, 1.5) of the delay */
    s->rng = s->rng * 6364136223846793005ULL + 1442695040888963407ULL;
    const double jitter = 0.5 + (double)(s->rng >> 11) / 9007199254740992.0;
    CT_DEBUG("webhook %s: %s (attempt %d); retrying in %.2f s", host, why, attempt + 1,
             delay * jitter);
    if (nap(s, delay * jitter)) break;
    delay *= 2;
  }
  free_headers(hdr);
  ct_free_secret(key);
  curl_easy_cleanup(c);
  return ok;
}

static void *sender_main(void *arg) {
  ct_sender *s = arg;
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE); /* CURLOPT_NOSIGNAL: a reset TLS peer must not kill the trainer */
  pthread_sigmask(SIG_BLOCK, &pipe, NULL);
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while ((!s->count || s->o.paused) && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
    if (!s->count || atomic_load(&s->abort_now)) {
      pthread_mutex_unlock(&s->mu);
      break;
    }
    ct_event ev = s->q[s->head];
    s->head = (s->head + 1) % s->o.queue_max;
    s->count--;
    s->busy = 1;
    pthread_mutex_unlock(&s->mu);
    int delivered = 1, any = 0;
    for (int i = 0; i < s->n; i++) {
      const ct_hook *h = &s->hooks[i];
      if (ev.severity > h->log_level) continue; /* more verbose than this endpoint wants */
      char *body = ct_event_body(&ev, h, s->job_id);
      any = 1;
      /* an endpoint whose last event failed every retry gets one attempt per
       * event until it answers again, so a dead endpoint costs one timeout
       * per event, not the whole backoff, and cannot hold the queue */
      const int ok = body && deliver(s, h, ev.type, body, s->down[i] ? 0 : s->o.retries);
      if (ok && s->down[i]) CT_INFO("webhook %d answers again", i);
      s->down[i] = !ok;
      delivered &= ok;
      free(body);
    }
    pthread_mutex_lock(&s->mu);
    if (any) {
      if (delivered)
        s->sent++;
      else
        s->failed++;
    }
    s->busy = 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    free(ev.fields);
    free(ev.text);
  }
  return NULL;
}

ct_status ct_sender_start(ct_hook *hooks, int n, const ct_sender_opts *o, const char *job_id,
                          ct_sender **out, ct_err *err) {
  *out = NULL;
  pthread_once(&g_curl_once, curl_init_once);
  ct_sender *s = calloc(1, sizeof *s);
  if (!s) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  s->o = *o;
  if (s->o.queue_max < 1) s->o.queue_max = 256;
  s->q = calloc((size_t)s->o.queue_max, sizeof *s->q);
  s->down = calloc((size_t)n + 1, 1);
  if (!s->q || !s->down) {
    free(s->q);
    free(s->down);
    free(s);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  s->hooks = hooks;
  s->n = n;
  s->rng = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)s;
  snprintf(s->job_id, sizeof s->job_id, "%s", job_id ? job_id : "");
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  if (pthread_create(&s->th, NULL, sender_main, s) != 0) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->q);
    free(s->down);
    free(s);
    return ct_errf(err, CT_ERR_INTERNAL, "cannot start the webhook thread");
  }
  s->started = 1;
  for (int i = 0; i < n; i++) {
    char host[256];
    url_host(hooks[i].url, host, sizeof host);
    CT_DEBUG("webhook %d: %s to %s, log_level %s%s", i,
             hooks[i].type == CT_HOOK_RAW ? "raw" : "discord", host,
             ct_severity_name(hooks[i].log_level), hooks[i].auth_token ? ", with X-API-Key" : "");
  }
  *out = s;
  return CT_OK;
}

void ct_sender_post(ct_sender *s, ct_event *ev) {
  pthread_mutex_lock(&s->mu);
  if (!s->stop && s->count == s->o.queue_max && ev->severity <= CT_SEV_WARNING) {
    /* a fault or an error never waits behind status events: the oldest
     * info/debug event makes room */
    for (int i = 0; i < s->count; i++) {
      const int at = (s->head + i) % s->o.queue_max;
      if (s->q[at].severity <= CT_SEV_WARNING) continue;
      free(s->q[at].fields);
      free(s->q[at].text);
      for (int j = i; j + 1 < s->count; j++)
        s->q[(s->head + j) % s->o.queue_max] = s->q[(s->head + j + 1) % s->o.queue_max];
      s->count--;
      s->dropped++;
      break;
    }
  }
  if (s->stop || s->count == s->o.queue_max) {
    s->dropped++;
    pthread_mutex_unlock(&s->mu);
    free(ev->fields);
    free(ev->text);
    ev->fields = ev->text = NULL;
    return;
  }
  s->q[(s->head + s->count) % s->o.queue_max] = *ev;
  s->count++;
  ev->fields = ev->text = NULL;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

int ct_sender_queued(ct_sender *s, ct_severity sev) {
  int k = 0;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->count; i++) k += s->q[(s->head + i) % s->o.queue_max].severity <= sev;
  pthread_mutex_unlock(&s->mu);
  return k;
}

void ct_sender_stop(ct_sender *s, double grace_s, long *sent, long *failed, long *dropped) {
  if (!s) return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  double until = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + grace_s;
  ts.tv_sec = (time_t)until;
  ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_broadcast(&s->cv);
  /* wait for the queue to drain (the thread signals after each event) */
  while ((s->count || s->busy) && pthread_cond_timedwait(&s->cv, &s->mu, &ts) == 0) {
  }
  atomic_store(&s->abort_now, 1);
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  if (s->started) pthread_join(s->th, NULL);
  s->dropped += s->count;
  for (int i = 0; i < s->count; i++) {
    ct_event *e = &s->q[(s->head + i) % s->o.queue_max];
    free(e->fields);
    free(e->text);
  }
  if (sent) *sent = s->sent;
  if (failed) *failed = s->failed;
  if (dropped) *dropped = s->dropped;
  ct_hooks_free(s->hooks, s->n);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s->q);
  free(s->down);
  free(s);
}

/* The web UI's HTTP front door over libmicrohttpd: one thread per connection
 * (so a slow client never holds up another), request bodies bounded
 * (Content-Length checked before the body is read, and the bytes counted as
 * they come), the access rules, and the routing of /api/ to the handlers of
 * runs.c and launch.c. The page itself (web/dist/index.html, embedded at
 * build time) is served at "/".
 *
 * Access: without a token, only a Host header naming a loopback address with
 * this port (or no port when it is 80, as browsers send it) is answered (a
 * web page elsewhere cannot reach the API through DNS rebinding), and POSTs
 * must be application/json (a cross-site form cannot send that without a
 * CORS preflight, which is never answered). With a
 * token, every /api/ call carries it as "Authorization: Bearer T" or as the
 * cookie ctuner_token, which a first visit to "/?token=T" sets (HttpOnly,
 * SameSite=Strict) before redirecting to "/". Tokens compare in constant
 * time. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctuner/log.h"
#include "serve/serve_int.h"

typedef struct conn_state {
  char *buf;
  size_t n;
  int too_big, done;
} conn_state;

FILE *srv_json_open(srv_reply *r, int code) {
  free(r->body);
  r->body = NULL;
  r->n = 0;
  r->code = code;
  r->type = "application/json";
  return open_memstream(&r->body, &r->n);
}

void srv_json_close(srv_reply *r, FILE *f) {
  if (f) {
    fputc('\n', f);
    fclose(f);
  } else {
    r->code = 500;
  }
}

void srv_error(srv_reply *r, int code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  FILE *f = srv_json_open(r, code);
  if (f) {
    fputs("{\"error\": ", f);
    ct_json_fput_str(f, msg);
    fputc('}', f);
  }
  srv_json_close(r, f);
}

const char *srv_query(const srv_req *q, const char *key) {
  return MHD_lookup_connection_value(q->c, MHD_GET_ARGUMENT_KIND, key);
}

static int hexval(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

static int token_eq(const char *a, const char *b) {
  size_t na = a ? strlen(a) : 0, nb = strlen(b);
  unsigned char d = na != nb;
  for (size_t i = 0; i < nb; i++) d |= (unsigned char)((i < na ? a[i] : 0) ^ b[i]);
  return a && !d;
}

/* 1 if the request may reach the API (see the file comment). */
static int allowed(ct_serve *s, struct MHD_Connection *c, int api, srv_reply *r) {
  if (!s->has_token) {
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    static const char *const names[] = {"127.0.0.1", "localhost", "[::1]"};
    for (int i = 0; host && i < 3; i++) {
      size_t k = strlen(names[i]);
      if (strncasecmp(host, names[i], k)) continue;
      /* NAME:PORT; a browser leaves the port out on port 80 (HTTP's default) */
      if ((host[k] == ':' && atol(host + k + 1) == s->port &&
           strspn(host + k + 1, "0123456789") == strlen(host + k + 1) && host[k + 1]) ||
          (!host[k] && s->port == 80))
        return 1;
    }
    srv_error(r, 403,
              "Host '%s' is not this server's loopback address; serve on another host "
              "with --host and a token",
              host ? host : "");
    return 0;
  }
  if (!api) return 1;
  const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  const char *cookie = MHD_lookup_connection_value(c, MHD_COOKIE_KIND, "ctuner_token");
  if (auth && !strncasecmp(auth, "Bearer ", 7) && token_eq(auth + 7, s->token)) return 1;
  if (cookie && token_eq(cookie, s->token)) return 1;
  srv_error(r, 401,
            "a token is required: 'Authorization: Bearer TOKEN' or open /?token=TOKEN once");
  return 0;
}

/* "/" and "/?token=T". */
static void page(ct_serve *s, struct MHD_Connection *c, srv_reply *r) {
  const char *t = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "token");
  if (t && s->has_token) {
    if (!token_eq(t, s->token)) {
      srv_error(r, 401, "wrong token");
      return;
    }
    snprintf(r->cookie, sizeof r->cookie, "ctuner_token=%s; Path=/; HttpOnly; SameSite=Strict",
             s->token);
    snprintf(r->location, sizeof r->location, "/");
    r->code = 303;
    return;
  }
  r->code = 200;
  r->type = "text/html; charset=utf-8";
  r->body = malloc(ct_serve_index_html_len);
  if (!r->body) {
    r->code = 500;
    return;
  }
  memcpy(r->body, ct_serve_index_html, ct_serve_index_html_len);
  r->n = ct_serve_index_html_len;
}

/* /api/runs/{name}[/{what}[/{rest}]] */
static void route_run(ct_serve *s, srv_req *q, const char *p, srv_reply *r) {
  char name[160];
  const char *slash = strchr(p, '/');
  size_t nn = slash ? (size_t)(slash - p) : strlen(p);
  if (nn >= sizeof name) nn = sizeof name - 1;
  memcpy(name, p, nn);
  name[nn] = 0;
  if (!srv_name_ok(name)) {
    srv_error(r, 400, "bad run name (letters, digits, '.', '_', '-'; not starting with '.')");
    return;
  }
  const char *what = slash ? slash + 1 : "";
  int get = !strcmp(q->method, "GET"), post = !strcmp(q->method, "POST");
  if (!*what && get)
    srv_run_get(s, name, r);
  else if (!strcmp(what, "metrics") && get)
    srv_run_metrics(s, name, q, r);
  else if (!strcmp(what, "validation") && get)
    srv_run_validation(s, name, r);
  else if (!strcmp(what, "log") && get)
    srv_run_log(s, name, q, r);
  else if (!strcmp(what, "stream") && get)
    srv_run_stream(s, name, q, r);
  else if (!strncmp(what, "files/", 6) && get)
    srv_run_file(s, name, what + 6, r);
  else if (!strcmp(what, "stop") && post)
    srv_run_stop(s, name, r);
  else if (!strcmp(what, "export") && post)
    srv_run_export(s, name, q, r);
  else if (!strcmp(what, "config") && post)
    srv_config_save(s, name, q, r);
  else
    srv_error(r, 404, "no such endpoint: %s %s", q->method, q->path);
}

static void route(ct_serve *s, srv_req *q, srv_reply *r) {
  const char *p = q->path;
  int get = !strcmp(q->method, "GET"), post = !strcmp(q->method, "POST");
  if (post) {
    const char *ct =
        MHD_lookup_connection_value(q->c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!ct || strncasecmp(ct, "application/json", 16)) {
      srv_error(r, 415, "POST bodies must be Content-Type: application/json");
      return;
    }
  }
  if (!strcmp(p, "runs") && get)
    srv_runs_list(s, r);
  else if (!strcmp(p, "runs") && post)
    srv_run_start(s, q, r);
  else if (!strncmp(p, "runs/", 5))
    route_run(s, q, p + 5, r);
  else if (!strcmp(p, "queue") && get)
    srv_queue_get(s, r);
  else if (!strcmp(p, "queue/remove") && post)
    srv_queue_remove(s, q, r);
  else if (!strcmp(p, "keys") && get)
    srv_keys(r);
  else if (!strcmp(p, "config/check") && post)
    srv_config_check(s, q, r);
  else
    srv_error(r, 404, "no such endpoint: %s /api/%s", q->method, p);
}

static enum MHD_Result send_reply(struct MHD_Connection *c, srv_reply *r, int api) {
  struct MHD_Response *resp;
  if (r->stream) {
    resp = srv_stream_response(r->stream); /* owns the stream now */
    r->stream = NULL;
  } else if (r->fd >= 0) {
    resp = MHD_create_response_from_fd64(r->fd_size, r->fd); /* owns fd now */
    r->fd = -1;
  } else if (r->body) {
    resp = MHD_create_response_from_buffer(r->n, r->body, MHD_RESPMEM_MUST_FREE);
    r->body = NULL;
  } else {
    resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
  }
  if (!resp) return MHD_NO;
  if (r->type) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->type);
  MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(resp, "X-Frame-Options", "DENY");
  MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
  MHD_add_response_header(resp, "Content-Security-Policy",
                          "default-src 'self'; img-src 'self' data: blob:; style-src 'self' "
                          "'unsafe-inline'; script-src 'self' 'unsafe-inline'; connect-src 'self'");
  if (api || r->no_store) MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  if (r->cookie[0]) MHD_add_response_header(resp, MHD_HTTP_HEADER_SET_COOKIE, r->cookie);
  if (r->location[0]) MHD_add_response_header(resp, MHD_HTTP_HEADER_LOCATION, r->location);
  enum MHD_Result ok = MHD_queue_response(c, (unsigned)r->code, resp);
  MHD_destroy_response(resp);
  return ok;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
  ct_serve *s = cls;
  conn_state *cs = *con_cls;
  srv_reply r = {.code = 500, .fd = -1};
  if (!cs) { /* first call: headers only */
    if (!(cs = calloc(1, sizeof *cs))) return MHD_NO;
    *con_cls = cs;
    const char *cl =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!cl || strtoull(cl, NULL, 10) <= s->max_body) return MHD_YES;
    cs->too_big = 1;
    srv_error(&r, 413, "request body over %zu bytes", s->max_body);
    return send_reply(c, &r, 1); /* the body is never read */
  }
  if (*upload_size) { /* a piece of the body */
    if (!cs->too_big && cs->n + *upload_size > s->max_body) {
      cs->too_big = 1;
      free(cs->buf);
      cs->buf = NULL;
    }
    if (!cs->too_big) {
      char *nb = realloc(cs->buf, cs->n + *upload_size + 1);
      if (!nb) return MHD_NO;
      memcpy(nb + cs->n, upload, *upload_size);
      cs->buf = nb;
      cs->n += *upload_size;
      cs->buf[cs->n] = 0;
    }
    *upload_size = 0;
    return MHD_YES;
  }
  if (cs->done) return MHD_YES;
  cs->done = 1;
  int api = !strncmp(url, "/api/", 5);
  if (cs->too_big) {
    srv_error(&r, 413, "request body over %zu bytes", s->max_body);
  } else if (!allowed(s, c, api, &r)) {
    /* r holds the refusal */
  } else if (api) {
    srv_req q = {
        .method = method, .path = url + 5, .body = cs->buf ? cs->buf : "", .nbody = cs->n, .c = c};
    route(s, &q, &r);
  } else if (!strcmp(url, "/") || !strcmp(url, "/index.html")) {
    page(s, c, &r);
  } else {
    srv_error(&r, 404, "not found: %s", url);
  }
  enum MHD_Result ok = send_reply(c, &r, api);
  free(r.body);
  if (r.fd >= 0) close(r.fd);
  return ok;
}

/* %XX decoding as libmicrohttpd's own, except that %00 becomes 0x01 (which no
 * name check accepts) instead of ending the string early: "a.json%00.png"
 * must not reach a.json. */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s) {
  char *w = s;
  for (const char *r = s; *r; r++) {
    int hi, lo;
    if (r[0] == '%' && (hi = hexval(r[1])) >= 0 && (lo = hexval(r[2])) >= 0) {
      *w++ = (char)((hi << 4 | lo) ? (hi << 4 | lo) : 1);
      r += 2;
    } else {
      *w++ = *r;
    }
  }
  *w = 0;
  return (size_t)(w - s);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode why) {
  conn_state *cs = *con_cls;
  if (cs) {
    free(cs->buf);
    free(cs);
  }
  *con_cls = NULL;
}

static int is_loopback(const struct sockaddr_storage *ss) {
  if (ss->ss_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
  return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)ss)->sin6_addr);
}

static ct_status bind_addr(const ct_serve_opts *o, struct sockaddr_storage *ss, ct_err *err) {
  const char *host = o->host && *o->host ? o->host : "127.0.0.1";
  memset(ss, 0, sizeof *ss);
  struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
  if (o->port < 0 || o->port > 65535)
    return ct_errf(err, CT_ERR_INVALID, "port %d is outside 0..65535", o->port);
  if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)o->port);
  } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)o->port);
  } else {
    return ct_errf(err, CT_ERR_INVALID, "host '%s' is not an IPv4 or IPv6 address", host);
  }
  if (!is_loopback(ss) && !o->token)
    return ct_errf(err, CT_ERR_INVALID,
                   "serving on %s (not loopback) needs a token (--token, or one generated)", host);
  return CT_OK;
}

ct_status ct_serve_start(const ct_serve_opts *o, ct_serve **out, ct_err *err) {
  ct_status st = CT_OK;
  struct sockaddr_storage ss;
  *out = NULL;
  ct_serve *s = calloc(1, sizeof *s);
  if (!s) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  s->rootfd = -1;
  pthread_mutex_init(&s->mu, NULL);
  if ((st = bind_addr(o, &ss, err))) goto out;
  if (o->token && (strlen(o->token) < 8 || strlen(o->token) >= sizeof s->token)) {
    st = ct_errf(err, CT_ERR_INVALID, "the token must have 8 to 128 characters");
    goto out;
  }
  if (!o->root || !realpath(o->root, s->root) ||
      (s->rootfd = open(s->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
    st = ct_errf(err, CT_ERR_NOT_FOUND, "root '%s' is not a readable directory: %s",
                 o->root ? o->root : "(none)", strerror(errno));
    goto out;
  }
  if (o->token) snprintf(s->token, sizeof s->token, "%s", o->token);
  s->has_token = o->token != NULL;
  snprintf(s->ctuner, sizeof s->ctuner, "%s", o->ctuner ? o->ctuner : "ctuner");
  snprintf(s->mpirun, sizeof s->mpirun, "%s", o->mpirun ? o->mpirun : "mpirun");
  s->max_body = o->max_body ? o->max_body : (size_t)1 << 20;
  s->hub_downloads = o->hub_downloads;
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD;
  if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
  s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, handle, s, MHD_OPTION_SOCK_ADDR,
                          (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
                          MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120, MHD_OPTION_NOTIFY_COMPLETED,
                          completed, s, MHD_OPTION_UNESCAPE_CALLBACK, unescape, s, MHD_OPTION_END);
  if (!s->d) {
    st = ct_errf(err, CT_ERR_IO, "cannot listen on %s port %d (in use?)",
                 o->host ? o->host : "127.0.0.1", o->port);
    goto out;
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
  s->port = di ? di->port : o->port;
  if (pthread_create(&s->reaper, NULL, srv_reaper_main, s) == 0) s->reaper_on = 1;
out:
  if (st) {
    ct_serve_stop(s);
    s = NULL;
  }
  *out = s;
  return st;
}

int ct_serve_port(const ct_serve *s) {
  return s->port;
}

void ct_serve_stop(ct_serve *s) {
  if (!s) return;
  s->stopping = 1;
  if (s->d) MHD_stop_daemon(s->d);
  if (s->reaper_on) pthread_join(s->reaper, NULL);
  if (s->rootfd >= 0) close(s->rootfd);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

ct_status ct_serve_new_token(char out[33], ct_err *err) {
  unsigned char b[16];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  ssize_t got = fd >= 0 ? read(fd, b, sizeof b) : -1;
  if (fd >= 0) close(fd);
  if (got != (ssize_t)sizeof b) return ct_errf(err, CT_ERR_IO, "cannot read /dev/urandom");
  for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
  return CT_OK;
}

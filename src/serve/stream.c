/* GET /api/runs/{name}/stream?since=STEP&offset=N: a run as server-sent events
 * (text/event-stream) — "metrics" with the lines after the last step sent (the
 * JSON of /metrics), "log" with train.log from the last byte sent (the JSON of
 * /log), "status" when the status changes; a comment every 15 s of quiet keeps
 * proxies from closing the connection. The run is looked at once a second,
 * from the connection's own thread (libmicrohttpd runs one per connection), so
 * a stream costs what one client polling /metrics and /log each second costs.
 * The stream ends when the run directory disappears or the server stops. */
#define _GNU_SOURCE
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve/serve_int.h"

typedef struct stream {
  ct_serve *s;
  char name[129], status[16];
  long since;
  long long off;
  char *buf;
  size_t n, pos;
  int quiet, first, ended;
} stream;

/* One event (its data a JSON object on one line) into f. */
static void add_event(FILE *f, const char *event, const char *data) {
  fprintf(f, "event: %s\ndata: %s\n\n", event, data);
}

/* The events since the last look, into t->buf. */
static void look(stream *t) {
  char *b = NULL, *jb = NULL;
  size_t n = 0, jn = 0;
  FILE *f = open_memstream(&b, &n), *j;
  int runfd = srv_open_run(t->s, t->name);
  if (!f) return;
  if (runfd < 0) {
    add_event(f, "gone", "{}");
    t->ended = 1;
    goto out;
  }
  long last = t->since;
  if ((j = open_memstream(&jb, &jn))) {
    long count = srv_metrics_json(runfd, t->since, j, &last);
    fclose(j);
    if (count > 0) add_event(f, "metrics", jb);
    t->since = last;
    free(jb);
    jb = NULL;
  }
  long long next = t->off;
  if ((j = open_memstream(&jb, &jn))) {
    long long got = srv_log_json(runfd, t->off, j, &next);
    fclose(j);
    if (got > 0 || (got == 0 && next < t->off)) add_event(f, "log", jb);
    if (got >= 0) t->off = next;
    free(jb);
  }
  long step, max_steps;
  const char *st = srv_run_status(t->s, t->name, runfd, &step, &max_steps);
  if (strcmp(st, t->status)) {
    char d[128];
    snprintf(d, sizeof d, "{\"status\": \"%s\", \"step\": %ld, \"max_train_steps\": %ld}", st, step,
             max_steps);
    add_event(f, "status", d);
    snprintf(t->status, sizeof t->status, "%s", st);
  }
  close(runfd);
out:
  fclose(f);
  t->buf = b;
  t->n = n;
  t->pos = 0;
}

static ssize_t stream_read(void *cls, uint64_t at, char *out, size_t max) {
  stream *t = cls;
  while (t->pos >= t->n) {
    free(t->buf);
    t->buf = NULL;
    t->n = t->pos = 0;
    if (t->s->stopping || t->ended) return MHD_CONTENT_READER_END_OF_STREAM;
    for (int i = 0; !t->first && i < 10 && !t->s->stopping; i++) usleep(100 * 1000);
    t->first = 0;
    look(t);
    if (t->n) {
      t->quiet = 0;
    } else if (++t->quiet >= 15 && (t->buf = strdup(": keep-alive\n\n"))) {
      t->n = strlen(t->buf);
      t->quiet = 0;
    }
  }
  size_t k = t->n - t->pos < max ? t->n - t->pos : max;
  memcpy(out, t->buf + t->pos, k);
  t->pos += k;
  return (ssize_t)k;
}

static void stream_free(void *cls) {
  stream *t = cls;
  free(t->buf);
  free(t);
}

struct MHD_Response *srv_stream_response(void *st) {
  return MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
}

void srv_run_stream(ct_serve *s, const char *name, const srv_req *q, srv_reply *r) {
  const char *sv = srv_query(q, "since"), *ov = srv_query(q, "offset");
  int runfd = srv_open_run(s, name);
  if (runfd < 0) {
    srv_error(r, 404, "no run '%s' under the root", name);
    return;
  }
  close(runfd);
  stream *t = calloc(1, sizeof *t);
  if (!t) {
    srv_error(r, 500, "out of memory");
    return;
  }
  t->s = s;
  snprintf(t->name, sizeof t->name, "%s", name);
  t->since = sv ? atol(sv) : -1;
  t->off = ov ? atoll(ov) : 0;
  t->first = 1;
  r->stream = t;
  r->code = 200;
  r->type = "text/event-stream";
}

/* The run queue: POST /api/runs with "queue": true puts a run at the end; the
 * reaper thread starts the head once no run this server started is alive (one
 * after another: the ranks of the machine go to one run at a time), through
 * the same launch check as a direct start. A queued start that is refused
 * (its config.json gone, a link found) is kept in "refused" with the reason.
 * GET /api/queue answers the queue, the refused starts and the history: every
 * run a server started and saw end, with its exit, reason, final loss and
 * time. The queue lives in memory: a restarted server starts with none. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "serve/serve_int.h"

int srv_queue_pos(ct_serve *s, const char *name) {
  int pos = 0;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->nqueue && !pos; i++)
    if (!strcmp(s->queue[i].name, name)) pos = i + 1;
  pthread_mutex_unlock(&s->mu);
  return pos;
}

void srv_queue_add(ct_serve *s, const char *name, int ranks, const ct_json *resume, srv_reply *r) {
  int runfd = srv_open_run(s, name),
      exists = runfd >= 0 && !faccessat(runfd, "config.json", F_OK, AT_SYMLINK_NOFOLLOW);
  if (runfd >= 0) close(runfd);
  if (!exists) {
    srv_error(r, 404, "run '%s' has no saved config.json (POST /api/runs/%s/config first)", name,
              name);
    return;
  }
  int pos = 0, full = 0;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->nqueue && !pos; i++)
    if (!strcmp(s->queue[i].name, name)) pos = -(i + 1);
  if (!pos && s->nqueue == SRV_MAX_QUEUE) full = 1;
  if (!pos && !full) {
    srv_queued *e = &s->queue[s->nqueue++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->ranks = ranks;
    e->resume = resume && resume->type == CT_JSON_BOOL ? resume->boolean : -1;
    e->at = (long)time(NULL);
    pos = s->nqueue;
  }
  pthread_mutex_unlock(&s->mu);
  if (full) {
    srv_error(r, 503, "the queue holds %d runs already", SRV_MAX_QUEUE);
  } else if (pos < 0) {
    srv_error(r, 409, "run '%s' is queued already (place %d)", name, -pos);
  } else {
    FILE *f = srv_json_open(r, 202);
    if (f) {
      fputs("{\"name\": ", f);
      ct_json_fput_str(f, name);
      fprintf(f, ", \"queued\": true, \"position\": %d}", pos);
    }
    srv_json_close(r, f);
  }
}

void srv_queue_tick(ct_serve *s) {
  srv_queued head;
  int take = 0;
  pthread_mutex_lock(&s->mu);
  int busy = 0;
  for (int i = 0; i < SRV_MAX_CHILDREN && !busy; i++) busy = s->children[i].pid != 0;
  if (!busy && s->nqueue > 0) {
    head = s->queue[0];
    memmove(s->queue, s->queue + 1, (size_t)(--s->nqueue) * sizeof *s->queue);
    take = 1;
  }
  pthread_mutex_unlock(&s->mu);
  if (!take) return;
  srv_reply r = {.code = 500, .fd = -1};
  ct_json rj = {.type = CT_JSON_BOOL, .boolean = head.resume > 0};
  if (!srv_start_run(s, head.name, head.ranks, head.resume >= 0 ? &rj : NULL, &r)) {
    pthread_mutex_lock(&s->mu);
    if (s->nrefused == SRV_MAX_REFUSED) {
      memmove(s->refused, s->refused + 1, (SRV_MAX_REFUSED - 1) * sizeof *s->refused);
      memmove(s->refused_why, s->refused_why + 1, (SRV_MAX_REFUSED - 1) * sizeof *s->refused_why);
      s->nrefused--;
    }
    s->refused[s->nrefused] = head;
    s->refused[s->nrefused].at = (long)time(NULL);
    ct_json *j = NULL;
    ct_err err;
    const ct_json *e =
        r.body && !ct_json_parse(r.body, r.n, &j, &err) ? ct_json_get(j, "error") : NULL;
    snprintf(s->refused_why[s->nrefused++], sizeof s->refused_why[0], "%s",
             e && e->type == CT_JSON_STRING ? e->str : "the start failed");
    ct_json_free(j);
    pthread_mutex_unlock(&s->mu);
  }
  free(r.body);
}

/* The loss of metrics.jsonl's last complete line; 0 if none (*has 0). */
static double final_loss(int runfd, int *has) {
  struct stat st;
  char *b = NULL;
  size_t n = 0;
  double loss = 0;
  *has = 0;
  int fd = openat(runfd, "metrics.jsonl", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0 && !fstat(fd, &st) &&
      !srv_read_fd(fd, st.st_size > 8192 ? st.st_size - 8192 : 0, 8192, &b, &n)) {
    while (n > 0 && b[n - 1] != '\n') n--;
    if (n) b[--n] = 0;
    char *line = strrchr(b, '\n');
    line = line ? line + 1 : b;
    ct_json *j = NULL;
    ct_err err;
    if (*line && !ct_json_parse(line, strlen(line), &j, &err)) {
      const ct_json *v = ct_json_get(j, "loss");
      if (v && v->type == CT_JSON_NUMBER) {
        loss = v->num;
        *has = 1;
      }
    }
    ct_json_free(j);
  }
  free(b);
  if (fd >= 0) close(fd);
  return loss;
}

/* Every run a server started and saw end, newest end first. */
static void write_history(ct_serve *s, FILE *f) {
  size_t n = 0, k = 0;
  char **v = srv_list_dir(s->rootfd, "", NULL, &n);
  struct row {
    const char *name;
    srv_meta m;
    double loss;
    int has_loss;
  } *rows = calloc(n ? n : 1, sizeof *rows);
  for (size_t i = 0; rows && i < n; i++) {
    int fd = srv_open_run(s, v[i]);
    if (fd < 0) continue;
    srv_meta m;
    if (srv_meta_get(s, fd, &m) && m.exit_code >= 0) {
      rows[k] = (struct row){.name = v[i], .m = m};
      rows[k].loss = final_loss(fd, &rows[k].has_loss);
      k++;
    }
    close(fd);
  }
  for (size_t i = 1; i < k; i++) /* insertion sort by end, newest first (then by start) */
    for (size_t j = i; j > 0 && (rows[j].m.ended > rows[j - 1].m.ended ||
                                 (rows[j].m.ended == rows[j - 1].m.ended &&
                                  rows[j].m.started > rows[j - 1].m.started));
         j--) {
      struct row t = rows[j];
      rows[j] = rows[j - 1];
      rows[j - 1] = t;
    }
  fputs("[", f);
  for (size_t i = 0; i < k; i++) {
    const srv_meta *m = &rows[i].m;
    fputs(i ? ", {\"name\": " : "{\"name\": ", f);
    ct_json_fput_str(f, rows[i].name);
    fprintf(f, ", \"ranks\": %d, \"started\": %.3f, \"ended\": %.3f, \"seconds\": ", m->ranks,
            m->started, m->ended);
    if (m->ended >= m->started && m->ended)
      fprintf(f, "%.3f", m->ended - m->started);
    else
      fputs("null", f);
    fprintf(f, ", \"exit_code\": %d, \"stopped\": %s, \"final_loss\": ", m->exit_code,
            m->stop ? "true" : "false");
    if (rows[i].has_loss)
      fprintf(f, "%.9g", rows[i].loss);
    else
      fputs("null", f);
    fputs("}", f);
  }
  fputs("]", f);
  free(rows);
  srv_free_list(v, n);
}

void srv_queue_get(ct_serve *s, srv_reply *r) {
  FILE *f = srv_json_open(r, 200);
  if (!f) {
    srv_json_close(r, f);
    return;
  }
  pthread_mutex_lock(&s->mu);
  fputs("{\"queue\": [", f);
  for (int i = 0; i < s->nqueue; i++) {
    const srv_queued *e = &s->queue[i];
    fputs(i ? ", {\"name\": " : "{\"name\": ", f);
    ct_json_fput_str(f, e->name);
    fprintf(f, ", \"position\": %d, \"ranks\": %d, \"resume\": %s, \"queued\": %ld}", i + 1,
            e->ranks,
            e->resume < 0 ? "null"
            : e->resume   ? "true"
                          : "false",
            e->at);
  }
  fputs("], \"refused\": [", f);
  for (int i = s->nrefused - 1; i >= 0; i--) {
    fputs(i < s->nrefused - 1 ? ", {\"name\": " : "{\"name\": ", f);
    ct_json_fput_str(f, s->refused[i].name);
    fprintf(f, ", \"at\": %ld, \"error\": ", s->refused[i].at);
    ct_json_fput_str(f, s->refused_why[i]);
    fputs("}", f);
  }
  pthread_mutex_unlock(&s->mu);
  fputs("], \"history\": ", f);
  write_history(s, f);
  fputs("}", f);
  srv_json_close(r, f);
}

void srv_queue_remove(ct_serve *s, const srv_req *q, srv_reply *r) {
  ct_json *body = NULL;
  ct_err err;
  int found = 0;
  const char *name = NULL;
  if (!ct_json_parse(q->body, q->nbody, &body, &err))
    name = srv_json_name(ct_json_get(body, "name"));
  if (!name) {
    srv_error(r, 400, "body: expected {\"name\": RUN}");
    ct_json_free(body);
    return;
  }
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->nqueue && !found; i++)
    if (!strcmp(s->queue[i].name, name)) {
      memmove(s->queue + i, s->queue + i + 1, (size_t)(s->nqueue - i - 1) * sizeof *s->queue);
      s->nqueue--;
      found = 1;
    }
  pthread_mutex_unlock(&s->mu);
  if (!found) {
    srv_error(r, 404, "run '%s' is not queued", name);
  } else {
    FILE *f = srv_json_open(r, 200);
    if (f) {
      fputs("{\"removed\": ", f);
      ct_json_fput_str(f, name);
      fputs("}", f);
    }
    srv_json_close(r, f);
  }
  ct_json_free(body);
}

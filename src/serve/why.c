/* Why a run is in its state, for the dashboard: the exit reason of its last
 * start (serve.json's exit code read as the trainer's exit codes: 5 stopped on
 * request, 3 the health circuit breaker, 4 the collective watchdog, 2 a
 * configuration problem, 128+N a signal) and the fatal lines of its log since
 * that start ("ctuner train: ..." messages, [ctuner] ERROR lines, mpirun's
 * report, crashes) — so a failed run shows "dataset 'data': no directory to
 * read" instead of only its exit code. A run made by `ctuner train` and served
 * later has no serve.json or config.json of the server's: its
 * max_train_steps comes from its newest complete checkpoint's config.json. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "serve/serve_int.h"

#define WHY_TAIL ((size_t)64 << 10) /* bytes of train.log looked at, from its end */
#define WHY_LINES 20

long srv_ckpt_max_steps(int runfd, long *ckpt_step) {
  size_t n = 0;
  char **v = srv_list_dir(runfd, "", NULL, &n);
  long best = -1, max = 0;
  for (size_t i = 0; i < n; i++) {
    char guard[200];
    long step = !strncmp(v[i], "checkpoint-", 11) ? atol(v[i] + 11) : -1;
    snprintf(guard, sizeof guard, "%s/.guard", v[i]);
    if (step > best && !faccessat(runfd, guard, F_OK, AT_SYMLINK_NOFOLLOW)) best = step;
  }
  srv_free_list(v, n);
  *ckpt_step = best;
  if (best < 0) return 0;
  char rel[200], *b = NULL;
  size_t len = 0;
  snprintf(rel, sizeof rel, "checkpoint-%ld/config.json", best);
  int fd = srv_open_rel(runfd, rel, O_RDONLY);
  ct_json *j = NULL;
  ct_err err;
  if (fd >= 0 && !srv_read_fd(fd, 0, (size_t)1 << 20, &b, &len) &&
      !ct_json_parse(b, len, &j, &err)) {
    const ct_json *m = ct_json_get(j, "max_train_steps");
    if (m && m->type == CT_JSON_NUMBER) max = (long)m->num;
  }
  ct_json_free(j);
  free(b);
  if (fd >= 0) close(fd);
  return max;
}

/* The exit reason of a run not running, into buf. */
static const char *reason(const char *status, const srv_meta *m, int has_meta, long updated,
                          char *buf, size_t n) {
  const int c = m->exit_code;
  if (!strcmp(status, "running")) return NULL;
  if (!has_meta) {
    if (!strcmp(status, "finished")) return "finished: it logged its max_train_steps";
    snprintf(buf, n,
             "not started by this server, so no exit status is known; its metrics last changed "
             "%ld s ago",
             updated ? (long)time(NULL) - updated : -1L);
    return updated ? buf : "not started by this server; no metrics or exit status";
  }
  if (c < 0)
    return "the process is gone and its exit status is unknown (the server that started it "
           "stopped before it did)";
  if (c == 0) return "finished: exit 0";
  const char *what = c == 5   ? "stopped on request: it wrote its checkpoint and exited"
                     : c == 3 ? "the health circuit breaker stopped it (docs/health.md)"
                     : c == 4 ? "a collective timed out (the watchdog, docs/distributed.md)"
                     : c == 2 ? "the configuration has a problem; nothing was run"
                     : c > 128 && c < 128 + 65 ? NULL
                                               : "the trainer failed";
  if (!what) {
    const char *sig = sigabbrev_np(c - 128);
    snprintf(buf, n, "%skilled by SIG%s (exit %d)", m->stop ? "stopped on request: " : "",
             sig ? sig : "?", c);
  } else if (m->stop && c != 5) {
    snprintf(buf, n, "stopped on request (exit %d)", c);
  } else {
    snprintf(buf, n, "%s (exit %d)", what, c);
  }
  return buf;
}

/* A line that says why a run ended. */
static int fatal_line(const char *l) {
  if (!strncmp(l, "ctuner ", 7)) { /* "ctuner train: ...", the command's own last word */
    const char *colon = strstr(l, ": ");
    return colon && colon - l < 24 && !memchr(l + 7, ' ', (size_t)(colon - l - 7));
  }
  static const char *const marks[] = {"[ctuner] ERROR",
                                      "Segmentation fault",
                                      "Aborted",
                                      "core dumped",
                                      "Killed",
                                      "MPI_ABORT",
                                      "exited on signal",
                                      "noticed that process rank",
                                      "terminated with non-zero exit status"};
  for (size_t i = 0; i < sizeof marks / sizeof *marks; i++)
    if (strstr(l, marks[i])) return 1;
  return 0;
}

/* The fatal lines of train.log since its last start, as a JSON array. */
static void write_fatal(int runfd, FILE *f) {
  struct stat st;
  char *b = NULL;
  size_t n = 0;
  const char *lines[WHY_LINES];
  size_t k = 0, total = 0;
  fputs("[", f);
  int fd = openat(runfd, "train.log", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) goto out;
  off_t off = st.st_size > (off_t)WHY_TAIL ? st.st_size - (off_t)WHY_TAIL : 0;
  if (srv_read_fd(fd, off, WHY_TAIL, &b, &n)) goto out;
  for (size_t i = 0; i < n; i++)
    if (!b[i]) b[i] = '?';
  char *start = b, *p;
  for (p = b; (p = strstr(p, "==== ctuner serve: starting")); p++)
    if (p == b || p[-1] == '\n') start = p; /* the last start */
  char *save = NULL;
  for (char *l = strtok_r(start, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    if (!fatal_line(l)) continue;
    lines[total++ % WHY_LINES] = l; /* the last WHY_LINES of them */
  }
  k = total < WHY_LINES ? total : WHY_LINES;
  for (size_t i = 0; i < k; i++) {
    const char *l = lines[(total - k + i) % WHY_LINES];
    char one[600];
    snprintf(one, sizeof one, "%s", l);
    if (!ct_utf8_valid(one, strlen(one)))
      for (char *q = one; *q; q++)
        if ((unsigned char)*q >= 0x80) *q = '?';
    fputs(i ? ", " : "", f);
    ct_json_fput_str(f, one);
  }
out:
  fputs("]", f);
  free(b);
  if (fd >= 0) close(fd);
}

void srv_run_why(ct_serve *s, int runfd, const char *status, FILE *f) {
  srv_meta m;
  struct stat st;
  char buf[400];
  int has = srv_meta_get(s, runfd, &m);
  long updated = fstatat(runfd, "metrics.jsonl", &st, AT_SYMLINK_NOFOLLOW) ? 0 : st.st_mtime;
  const char *why = reason(status, &m, has, updated, buf, sizeof buf);
  fputs("\"exit_reason\": ", f);
  if (why)
    ct_json_fput_str(f, why);
  else
    fputs("null", f);
  fputs(", \"fatal\": ", f);
  if (strcmp(status, "failed") && strcmp(status, "stopped"))
    fputs("[]", f);
  else
    write_fatal(runfd, f);
}

/* The web server's read side: the runs under root and what each holds —
 * status, metrics.jsonl from a step on, validation images with their prompts,
 * checkpoints, the log of a launched run, and single files for download.
 *
 * A run is a directory directly under root holding metrics.jsonl, a
 * checkpoint-N directory, serve.json (a run this server started) or
 * config.json (one saved by the config builder). The trainer may be writing
 * while we read: only lines ending in '\n' are taken from metrics.jsonl (a
 * partial last line waits for the next poll), every line is parsed before it
 * is passed on, and files are read with one bounded pread loop each.
 *
 * Status: "running" while the process a server started is alive (serve.json,
 * launch.c), or — for a run started elsewhere — while metrics.jsonl changed in
 * the last 60 s; "finished" once the run exited 0 or logged max_train_steps
 * (from its config.json, else its newest checkpoint's); "failed" when a start
 * from a server exited non-zero without a stop asked for (why.c says why);
 * "queued" while it waits in the queue (queue.c); "stopped" otherwise. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "serve/serve_int.h"

#define METRICS_MAX ((size_t)64 << 20) /* bytes of metrics.jsonl read per call (the tail) */
#define POINTS_MAX 20000               /* lines answered per call; "more" says there are others */
#define LOG_CHUNK ((size_t)64 << 10)

/* Last complete line's "step" of metrics.jsonl, or -1. */
static long last_step(int runfd, time_t *mtime) {
  long step = -1;
  struct stat st;
  char *b = NULL;
  size_t n = 0;
  int fd = openat(runfd, "metrics.jsonl", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 || fstat(fd, &st)) goto out;
  if (mtime) *mtime = st.st_mtime;
  off_t off = st.st_size > 8192 ? st.st_size - 8192 : 0;
  if (srv_read_fd(fd, off, 8192, &b, &n)) goto out;
  while (n > 0 && b[n - 1] != '\n') n--; /* a line being written */
  if (n) b[--n] = 0;
  char *line = strrchr(b, '\n');
  line = line ? line + 1 : b;
  ct_json *j = NULL;
  ct_err err;
  if (*line && !ct_json_parse(line, strlen(line), &j, &err)) {
    const ct_json *v = ct_json_get(j, "step");
    if (v && v->type == CT_JSON_NUMBER) step = (long)v->num;
  }
  ct_json_free(j);
out:
  free(b);
  if (fd >= 0) close(fd);
  return step;
}

/* RUN/config.json parsed (the builder's), or NULL. */
static ct_json *run_config(int runfd) {
  ct_json *j = NULL;
  char *b = NULL;
  size_t n;
  ct_err err;
  int fd = openat(runfd, "config.json", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0 && !srv_read_fd(fd, 0, (size_t)1 << 20, &b, &n) && ct_json_parse(b, n, &j, &err))
    j = NULL;
  free(b);
  if (fd >= 0) close(fd);
  if (j && j->type != CT_JSON_OBJECT) {
    ct_json_free(j);
    j = NULL;
  }
  return j;
}

static long config_long(const ct_json *cfg, const char *key) {
  char dashed[128];
  snprintf(dashed, sizeof dashed, "--%s", key);
  const ct_json *v = ct_json_get(cfg, key);
  if (!v) v = ct_json_get(cfg, dashed);
  if (v && v->type == CT_JSON_NUMBER) return (long)v->num;
  if (v && v->type == CT_JSON_STRING) return atol(v->str);
  return 0;
}

const char *srv_run_status(ct_serve *s, const char *name, int runfd, long *step, long *max_steps) {
  int ranks = 0, code = -1;
  time_t mt = 0;
  long ckpt = -1;
  srv_meta m;
  ct_json *cfg = run_config(runfd);
  *max_steps = cfg ? config_long(cfg, "max_train_steps") : 0;
  ct_json_free(cfg);
  *step = last_step(runfd, &mt);
  if (*max_steps <= 0 || *step < 0) { /* a run of `ctuner train`: its checkpoints say */
    long from_ckpt = srv_ckpt_max_steps(runfd, &ckpt);
    if (*max_steps <= 0) *max_steps = from_ckpt;
    if (*step < ckpt) *step = ckpt;
  }
  pid_t pid = srv_run_pid(s, runfd, &ranks, &code);
  if (pid > 0) return "running";
  if (srv_queue_pos(s, name)) return "queued";
  if (code == 0 || (*max_steps > 0 && *step >= *max_steps)) return "finished";
  const int has_meta = srv_meta_get(s, runfd, &m);
  if (!has_meta && mt && time(NULL) - mt < 60) return "running";
  if (has_meta && code > 0 && code != CT_EXIT_STOPPED_CODE && !m.stop) return "failed";
  return "stopped";
}

static int is_run(int dirfd, const char *name) {
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), yes = 0;
  if (fd < 0) return 0;
  const char *marks[] = {"metrics.jsonl", "serve.json", "config.json"};
  for (int i = 0; i < 3 && !yes; i++) yes = !faccessat(fd, marks[i], F_OK, AT_SYMLINK_NOFOLLOW);
  DIR *d = yes ? NULL : fdopendir(fd);
  for (struct dirent *e; d && !yes && (e = readdir(d));)
    yes = !strncmp(e->d_name, "checkpoint-", 11);
  if (d)
    closedir(d); /* closes fd */
  else
    close(fd);
  return yes;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names in dirfd/sub ("" for dirfd) accepted by keep, symbolic links
 * left out; caller frees. */
char **srv_list_dir(int dirfd, const char *sub, int (*keep)(int, const char *), size_t *count) {
  char **v = NULL;
  size_t n = 0, cap = 0;
  /* a new open file description: a dup would share (and race on) dirfd's offset */
  int fd = *sub ? srv_open_rel(dirfd, sub, O_RDONLY | O_DIRECTORY)
                : openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d && fd >= 0) close(fd);
  for (struct dirent *e; d && (e = readdir(d));) {
    struct stat st; /* a symbolic link is never listed (nor followed when opened) */
    if (e->d_type == DT_LNK ||
        (e->d_type == DT_UNKNOWN &&
         (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) || S_ISLNK(st.st_mode))))
      continue;
    if (!srv_name_ok(e->d_name) || (keep && !keep(dirfd, e->d_name))) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      char **nv = realloc(v, cap * sizeof *v);
      if (!nv) break;
      v = nv;
    }
    if (!(v[n] = strdup(e->d_name))) break;
    n++;
  }
  if (d) closedir(d);
  if (n) qsort(v, n, sizeof *v, cmp_str);
  *count = n;
  return v;
}

void srv_free_list(char **v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

void srv_runs_list(ct_serve *s, srv_reply *r) {
  size_t n = 0;
  char **names = srv_list_dir(s->rootfd, "", is_run, &n);
  FILE *f = srv_json_open(r, 200);
  if (f) fputs("{\"runs\": [", f);
  for (size_t i = 0; f && i < n; i++) {
    int fd = srv_open_run(s, names[i]);
    if (fd < 0) continue;
    long step, max_steps;
    struct stat st;
    const char *status = srv_run_status(s, names[i], fd, &step, &max_steps);
    long updated = fstatat(fd, "metrics.jsonl", &st, AT_SYMLINK_NOFOLLOW) ? 0 : (long)st.st_mtime;
    fprintf(f, "%s{\"name\": ", i ? ", " : "");
    ct_json_fput_str(f, names[i]);
    fprintf(f, ", \"status\": \"%s\", \"step\": %ld, \"max_train_steps\": %ld, \"updated\": %ld}",
            status, step, max_steps, updated);
    close(fd);
  }
  if (f) fputs("]}", f);
  srv_json_close(r, f);
  srv_free_list(names, n);
}

static int is_ckpt(int dirfd, const char *name) {
  return !strncmp(name, "checkpoint-", 11);
}

static void write_checkpoints(FILE *f, int runfd) {
  size_t n = 0;
  char **v = srv_list_dir(runfd, "", is_ckpt, &n);
  fputs("[", f);
  for (size_t i = 0; i < n; i++) {
    int cfd = srv_open_rel(runfd, v[i], O_RDONLY | O_DIRECTORY);
    if (cfd < 0) continue;
    int complete = !faccessat(cfd, ".guard", F_OK, AT_SYMLINK_NOFOLLOW);
    fprintf(f, "%s{\"name\": ", i ? ", " : "");
    ct_json_fput_str(f, v[i]);
    fprintf(f, ", \"step\": %ld, \"complete\": %s, \"files\": [", atol(v[i] + 11),
            complete ? "true" : "false");
    size_t nf = 0;
    char **files = srv_list_dir(cfd, "", NULL, &nf);
    int first = 1;
    for (size_t k = 0; k < nf; k++) {
      struct stat st;
      if (fstatat(cfd, files[k], &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode)) continue;
      fprintf(f, "%s{\"name\": ", first ? "" : ", ");
      ct_json_fput_str(f, files[k]);
      fprintf(f, ", \"size\": %lld}", (long long)st.st_size);
      first = 0;
    }
    srv_free_list(files, nf);
    fputs("]}", f);
    close(cfd);
  }
  fputs("]", f);
  srv_free_list(v, n);
}

/* Open MPI's rank of a process (OMPI_COMM_WORLD_RANK in its environment), or -1. */
static long mpi_rank(const char *pid) {
  char path[64], *b = NULL;
  size_t n = 0;
  long rank = -1;
  snprintf(path, sizeof path, "/proc/%.20s/environ", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0 && !srv_read_fd(fd, 0, (size_t)1 << 18, &b, &n))
    for (size_t i = 0; i < n; i += strlen(b + i) + 1)
      if (!strncmp(b + i, "OMPI_COMM_WORLD_RANK=", 21)) rank = atol(b + i + 21);
  free(b);
  if (fd >= 0) close(fd);
  return rank;
}

/* The processes of a run's session (mpirun and its ranks, or the one trainer)
 * from /proc: pid, name, MPI rank (-1: none), state, CPU seconds, resident MB. */
static void write_procs(FILE *f, pid_t sid) {
  DIR *d = sid > 0 ? opendir("/proc") : NULL;
  long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
  int first = 1;
  fputs("[", f);
  for (struct dirent *e; d && (e = readdir(d));) {
    char path[64], buf[1024], comm[64];
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    snprintf(path, sizeof path, "/proc/%.20s/stat", e->d_name);
    FILE *sf = fopen(path, "r");
    size_t n = sf ? fread(buf, 1, sizeof buf - 1, sf) : 0;
    if (sf) fclose(sf);
    buf[n] = 0;
    char *open = strchr(buf, '('), *close_ = strrchr(buf, ')');
    if (!open || !close_ || close_ - open > 60) continue;
    snprintf(comm, sizeof comm, "%.*s", (int)(close_ - open - 1), open + 1);
    char state;
    long ppid, pgrp, session, rss;
    unsigned long ut, st;
    /* fields after the name: state ppid pgrp session tty tpgid flags minflt
     * cminflt majflt cmajflt utime stime cutime cstime priority nice threads
     * itrealvalue starttime vsize rss */
    if (sscanf(close_ + 2,
               "%c %ld %ld %ld %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d %*d %*d %*d %*d %*u %*u "
               "%ld",
               &state, &ppid, &pgrp, &session, &ut, &st, &rss) != 7 ||
        session != sid)
      continue;
    fprintf(f, "%s{\"pid\": %s, \"name\": ", first ? "" : ", ", e->d_name);
    ct_json_fput_str(f, comm);
    fprintf(f, ", \"rank\": %ld, \"state\": \"%c\", \"cpu_s\": %.1f, \"rss_mb\": %.1f}",
            mpi_rank(e->d_name), state, (double)(ut + st) / (double)tick,
            (double)rss * (double)page / 1048576.0);
    first = 0;
  }
  if (d) closedir(d);
  fputs("]", f);
}

void srv_run_get(ct_serve *s, const char *name, srv_reply *r) {
  int fd = srv_open_run(s, name);
  if (fd < 0) {
    srv_error(r, 404, "no run '%s' under the root", name);
    return;
  }
  long step, max_steps;
  int ranks = 0, code = -1;
  const char *status = srv_run_status(s, name, fd, &step, &max_steps);
  pid_t pid = srv_run_pid(s, fd, &ranks, &code);
  ct_json *cfg = run_config(fd);
  FILE *f = srv_json_open(r, 200);
  if (f) {
    fputs("{\"name\": ", f);
    ct_json_fput_str(f, name);
    fprintf(f,
            ", \"status\": \"%s\", \"step\": %ld, \"max_train_steps\": %ld, \"pid\": %ld, "
            "\"ranks\": %d, \"exit_code\": ",
            status, step, max_steps, (long)pid, ranks);
    if (code >= 0)
      fprintf(f, "%d", code);
    else
      fputs("null", f);
    fprintf(f, ", \"has_log\": %s, \"config\": ",
            faccessat(fd, "train.log", F_OK, AT_SYMLINK_NOFOLLOW) ? "false" : "true");
    if (cfg)
      srv_json_write(f, cfg);
    else
      fputs("null", f);
    fputs(", ", f);
    srv_run_why(s, fd, status, f);
    fputs(", \"processes\": ", f);
    write_procs(f, pid);
    fputs(", \"checkpoints\": ", f);
    write_checkpoints(f, fd);
    fputs("}", f);
  }
  srv_json_close(r, f);
  ct_json_free(cfg);
  close(fd);
}

/* The complete lines of b[0..n) with "step" > since, as a JSON array body. */
static long metrics_lines(FILE *f, char *b, size_t n, long since, long *last_out) {
  long last = since, count = 0;
  int more = 0;
  char *p = b, *end = b + n;
  fputs("{\"points\": [", f);
  while (p < end) {
    char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) break; /* the line being written: next poll */
    *nl = 0;
    ct_json *j = NULL;
    ct_err err;
    /* the trainer's lines start with the step: skip old ones without parsing them */
    if (!strncmp(p, "{\"step\": ", 9) && strtol(p + 9, NULL, 10) <= since) {
      p = nl + 1;
      continue;
    }
    if (nl > p && !ct_json_parse(p, (size_t)(nl - p), &j, &err) && j->type == CT_JSON_OBJECT) {
      const ct_json *v = ct_json_get(j, "step");
      long step = v && v->type == CT_JSON_NUMBER ? (long)v->num : -1;
      if (step > since && count >= POINTS_MAX) {
        more = 1;
      } else if (step > since) {
        fprintf(f, "%s%s", count ? ", " : "", p);
        count++;
        if (step > last) last = step;
      }
    }
    ct_json_free(j);
    p = nl + 1;
  }
  fprintf(f, "], \"last_step\": %ld, \"more\": %s}", last, more ? "true" : "false");
  *last_out = last;
  return count;
}

/* The tail of metrics.jsonl holding every line after step `since`: 64 KiB
 * from the end, doubled while the first whole line read is still newer than
 * since (up to METRICS_MAX), so a poll with since = the last step it saw reads
 * about the new lines only, however long the run. */
static void read_tail(int fd, off_t size, long since, char **b, size_t *n) {
  for (size_t want = (size_t)64 << 10;; want *= 2) {
    if (want > METRICS_MAX) want = METRICS_MAX;
    off_t off = (off_t)want < size ? size - (off_t)want : 0;
    if (srv_read_fd(fd, off, (size_t)(size - off), b, n)) return;
    if (off == 0) return;
    char *nl = memchr(*b, '\n', *n); /* drop the cut first line */
    size_t skip = nl ? (size_t)(nl - *b) + 1 : *n;
    memmove(*b, *b + skip, *n - skip + 1);
    *n -= skip;
    long first = !strncmp(*b, "{\"step\": ", 9) ? strtol(*b + 9, NULL, 10) : LONG_MAX;
    if (first <= since || want == METRICS_MAX) return;
    free(*b);
    *b = NULL;
    *n = 0;
  }
}

long srv_metrics_json(int runfd, long since, FILE *f, long *last) {
  char *b = NULL;
  size_t n = 0;
  struct stat st;
  int fd = openat(runfd, "metrics.jsonl", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0 && !fstat(fd, &st)) read_tail(fd, st.st_size, since, &b, &n);
  long count = metrics_lines(f, b ? b : (char *)"", n, since, last);
  free(b);
  if (fd >= 0) close(fd);
  return count;
}

void srv_run_metrics(ct_serve *s, const char *name, const srv_req *q, srv_reply *r) {
  const char *sv = srv_query(q, "since");
  char *endp = NULL;
  long since = sv ? strtol(sv, &endp, 10) : -1, last;
  if (sv && (!*sv || *endp)) {
    srv_error(r, 400, "since must be an integer step, got '%s'", sv);
    return;
  }
  int runfd = srv_open_run(s, name);
  if (runfd < 0) {
    srv_error(r, 404, "no run '%s' under the root", name);
    return;
  }
  FILE *f = srv_json_open(r, 200);
  if (f) srv_metrics_json(runfd, since, f, &last);
  srv_json_close(r, f);
  close(runfd);
}

static int is_png(int dirfd, const char *name) {
  size_t n = strlen(name);
  return n > 4 && !strcmp(name + n - 4, ".png");
}

void srv_run_validation(ct_serve *s, const char *name, srv_reply *r) {
  int runfd = srv_open_run(s, name);
  if (runfd < 0) {
    srv_error(r, 404, "no run '%s' under the root", name);
    return;
  }
  size_t n = 0;
  char **v = srv_list_dir(runfd, "validation_images", is_png, &n);
  FILE *f = srv_json_open(r, 200);
  if (f) fputs("{\"images\": [", f);
  for (size_t i = 0; f && i < n; i++) {
    long step = !strncmp(v[i], "step_", 5) ? atol(v[i] + 5) : -1;
    size_t len = strlen(v[i]);
    int grid = len > 9 && !strcmp(v[i] + len - 9, "_grid.png");
    char txt[200], *prompt = NULL, rel[220];
    size_t pn = 0;
    snprintf(txt, sizeof txt, "validation_images/%.*s.txt", (int)(len - 4), v[i]);
    int tfd = srv_open_rel(runfd, txt, O_RDONLY);
    if (tfd >= 0) {
      if (srv_read_fd(tfd, 0, 4096, &prompt, &pn) || !ct_utf8_valid(prompt, pn)) {
        free(prompt);
        prompt = NULL;
      }
      close(tfd);
    }
    snprintf(rel, sizeof rel, "validation_images/%s", v[i]);
    fprintf(f, "%s{\"file\": ", i ? ", " : "");
    ct_json_fput_str(f, rel);
    fprintf(f, ", \"step\": %ld, \"grid\": %s, \"prompt\": ", step, grid ? "true" : "false");
    if (prompt)
      ct_json_fput_str(f, prompt);
    else
      fputs("null", f);
    fputs("}", f);
    free(prompt);
  }
  if (f) fputs("]}", f);
  srv_json_close(r, f);
  srv_free_list(v, n);
  close(runfd);
}

long long srv_log_json(int runfd, long long off, FILE *f, long long *next) {
  char *b = NULL;
  size_t n = 0;
  struct stat st;
  long long got = -1;
  int fd = openat(runfd, "train.log", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 || fstat(fd, &st)) goto out;
  if (off < 0 || off > (long long)st.st_size) off = 0; /* a new log (the run was restarted) */
  if (srv_read_fd(fd, (off_t)off, LOG_CHUNK, &b, &n)) goto out;
  if (n == LOG_CHUNK) /* do not cut a UTF-8 sequence: leave it for the next call */
    while (n > 0 && ((unsigned char)b[n - 1] & 0xC0) == 0x80) n--;
  if (n == LOG_CHUNK && n > 0 && ((unsigned char)b[n - 1] & 0x80)) n--;
  b[n] = 0;
  if (!ct_utf8_valid(b, n))
    for (size_t i = 0; i < n; i++)
      if ((unsigned char)b[i] >= 0x80) b[i] = '?';
  for (size_t i = 0; i < n; i++)
    if (!b[i]) b[i] = '?';
  *next = off + (long long)n;
  fprintf(f, "{\"offset\": %lld, \"size\": %lld, \"text\": ", *next, (long long)st.st_size);
  ct_json_fput_str(f, b);
  fputs("}", f);
  got = (long long)n;
out:
  free(b);
  if (fd >= 0) close(fd);
  return got;
}

void srv_run_log(ct_serve *s, const char *name, const srv_req *q, srv_reply *r) {
  const char *ov = srv_query(q, "offset");
  long long next;
  int runfd = srv_open_run(s, name);
  if (runfd < 0) {
    srv_error(r, 404, "no run '%s' under the root", name);
    return;
  }
  FILE *f = srv_json_open(r, 200);
  long long got = f ? srv_log_json(runfd, ov ? atoll(ov) : 0, f, &next) : 0;
  srv_json_close(r, f);
  if (got < 0)
    srv_error(r, 404, "run '%s' has no train.log (it was not started from the web UI)", name);
  close(runfd);
}

static const char *content_type(const char *rel) {
  const char *dot = strrchr(rel, '.');
  static const char *map[][2] = {{".png", "image/png"},         {".jpg", "image/jpeg"},
                                 {".json", "application/json"}, {".jsonl", "text/plain"},
                                 {".txt", "text/plain"},        {".log", "text/plain"}};
  for (size_t i = 0; dot && i < sizeof map / sizeof map[0]; i++)
    if (!strcmp(dot, map[i][0])) return map[i][1];
  return "application/octet-stream";
}

void srv_run_file(ct_serve *s, const char *name, const char *rel, srv_reply *r) {
  int runfd = srv_open_run(s, name);
  if (runfd < 0) {
    srv_error(r, 404, "no run '%s' under the root", name);
    return;
  }
  struct stat st;
  int fd = srv_open_rel(runfd, rel, O_RDONLY);
  if (fd < 0 && (errno == EACCES || errno == ELOOP)) {
    srv_error(r, 403,
              "refused path '%s' (components of letters, digits, '.', '_', '-'; no "
              "'..', no hidden files, no symbolic links)",
              rel);
  } else if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    srv_error(r, 404, "no file '%s' in run '%s'", rel, name);
  } else {
    r->code = 200;
    r->type = content_type(rel);
    r->fd = fd;
    r->fd_size = (size_t)st.st_size;
    fd = -1;
  }
  if (fd >= 0) close(fd);
  close(runfd);
}

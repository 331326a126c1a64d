/* Private to src/serve: the server state and the helpers its files share —
 * replies (a JSON body built in a memory stream, or an open file), paths kept
 * under root (safepath.c), run listings (runs.c) and launches (launch.c). */
#ifndef CT_SERVE_INT_H
#define CT_SERVE_INT_H

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/types.h>
#include <time.h>

#include "ctuner/config.h"
#include "ctuner/json.h"
#include "ctuner/serve.h"

#define SRV_MAX_CHILDREN 64
#define CT_EXIT_STOPPED_CODE 5 /* the trainer's exit once stopped on request (train.h) */

#define SRV_MAX_QUEUE 64
#define SRV_MAX_REFUSED 16

typedef struct srv_queued {
  char name[129];
  int ranks, resume; /* resume -1: the config's own */
  long at;
} srv_queued;

typedef struct srv_child {
  pid_t pid;      /* 0: free slot */
  time_t kill_at; /* SIGKILL the group then, if still there (0: not stopping) */
  char name[129];
} srv_child;

struct ct_serve {
  struct MHD_Daemon *d;
  int rootfd;
  char root[PATH_MAX];
  char token[129];
  int has_token;
  int port;
  char ctuner[PATH_MAX], mpirun[PATH_MAX];
  size_t max_body;
  int hub_downloads;  /* 0: children get HF_HUB_OFFLINE=1 (nothing written outside root) */
  pthread_mutex_t mu; /* children and every serve.json write */
  srv_child children[SRV_MAX_CHILDREN];
  srv_queued queue[SRV_MAX_QUEUE]; /* runs to start one after another (queue.c) */
  int nqueue;
  srv_queued refused[SRV_MAX_REFUSED]; /* queued starts that failed, newest last */
  char refused_why[SRV_MAX_REFUSED][256];
  int nrefused;
  pthread_t reaper;
  int reaper_on;
  volatile int stopping;
};

/* What a handler answers: a malloc'd body, or an open file (fd >= 0). */
typedef struct srv_reply {
  int code;
  const char *type;
  char *body;
  size_t n;
  int fd;
  size_t fd_size;
  char cookie[256];   /* Set-Cookie value, if any */
  char location[128]; /* Location, for a redirect */
  int no_store;       /* Cache-Control: no-store */
  void *stream;       /* a server-sent event stream (stream.c), if set */
} srv_reply;

/* The request as the handlers see it. */
typedef struct srv_req {
  const char *method, *path; /* path after "/api/" */
  const char *body;
  size_t nbody;
  struct MHD_Connection *c;
} srv_req;

/* A JSON body: open, write with fprintf/ct_json_fput_str, close. */
FILE *srv_json_open(srv_reply *r, int code);
void srv_json_close(srv_reply *r, FILE *f);
/* {"error": "..."} with an HTTP code. */
void srv_error(srv_reply *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A query argument or NULL. */
const char *srv_query(const srv_req *q, const char *key);

/* safepath.c: the one rule for names: 1 if name[0..n) is one safe path
 * component ([A-Za-z0-9._-], 1..128 bytes, not starting with '.'; a NUL
 * inside fails). srv_name_ok is it for a C string, srv_json_name for a JSON
 * string (the whole of it: "zz\u0000/../x" is refused, not cut to "zz"),
 * answering the name or NULL. */
int srv_name_okn(const char *name, size_t n);
int srv_name_ok(const char *name);
const char *srv_json_name(const ct_json *v);
/* 1 if a string anywhere in v holds a NUL (a body holding one is refused
 * whole: written back out, the string would end there). */
int srv_json_nul(const ct_json *v);
/* 1 if dirfd/sub (sub "" for dirfd itself) or anything below it is a symbolic
 * link, its path (relative to dirfd) in found; 0 if none; -1 with errno. */
int srv_find_link(int dirfd, const char *sub, char *found, size_t n);
/* Where path (absolute, or relative to root/run) lies, "."/".." folded: 0
 * outside root; 1 inside, no existing component a link; 2 inside through a
 * link; -1 too long. rel: the path below root (for 2: up to the link). */
int srv_path_inside(const ct_serve *s, const char *run, const char *path, char *rel, size_t n);
/* The run directory root/name (no symlinks), or -1 with errno. */
int srv_open_run(const ct_serve *s, const char *name);
/* rel ("a/b/c.png") below dirfd, each component srv_name_ok and no symlink
 * followed; flags as openat. -1 with errno (EACCES for a refused name). */
int srv_open_rel(int dirfd, const char *rel, int flags);
/* Whole file (at most max bytes from offset off) into a malloc'd buffer. */
int srv_read_fd(int fd, off_t off, size_t max, char **out, size_t *n);
/* Writes data to dirfd/name through a temporary file and a rename. */
int srv_write_at(int dirfd, const char *name, const char *data, size_t n);

/* runs.c */
void srv_runs_list(ct_serve *s, srv_reply *r);
void srv_run_get(ct_serve *s, const char *name, srv_reply *r);
void srv_run_metrics(ct_serve *s, const char *name, const srv_req *q, srv_reply *r);
void srv_run_validation(ct_serve *s, const char *name, srv_reply *r);
void srv_run_log(ct_serve *s, const char *name, const srv_req *q, srv_reply *r);
void srv_run_file(ct_serve *s, const char *name, const char *rel, srv_reply *r);
/* {"points": [...], "last_step", "more"} of metrics.jsonl after step since
 * into f; returns the number of points, *last the last step. */
long srv_metrics_json(int runfd, long since, FILE *f, long *last);
/* {"offset", "size", "text"} of train.log from byte off into f; returns the
 * bytes of text, -1 (nothing written) without a log. */
long long srv_log_json(int runfd, long long off, FILE *f, long long *next);
/* "running", "stopped" or "finished", and the last step logged; runfd open. */
const char *srv_run_status(ct_serve *s, const char *name, int runfd, long *step, long *max_steps);

/* guard.c: 0 if run `name` may start (its config.json a regular file, no
 * link in the run, the paths it names kept to root: see guard.c), else the
 * refusal (4xx) in r. */
int srv_launch_check(ct_serve *s, const char *name, int runfd, srv_reply *r);
/* The datasets of a multidatabackend.json text as `ctuner config check`
 * checks them, plus a local image dataset's directory present; relative
 * paths against outdir. */
void srv_backend_problems(const char *text, size_t n, const char *outdir, const ct_config *cfg,
                          ct_config_problems *probs);

/* runs.c: sorted names in dirfd/sub ("" for dirfd) accepted by keep (NULL:
 * all), symbolic links left out; srv_free_list frees them. */
char **srv_list_dir(int dirfd, const char *sub, int (*keep)(int, const char *), size_t *count);
void srv_free_list(char **v, size_t n);

/* why.c: "exit_reason": "...", "fatal": [lines of train.log] of a run in
 * `status` into f (members of an object being written). */
void srv_run_why(ct_serve *s, int runfd, const char *status, FILE *f);
/* max_train_steps of the newest complete checkpoint's config.json (0: none),
 * its step in *ckpt_step (-1: none). */
long srv_ckpt_max_steps(int runfd, long *ckpt_step);

/* stream.c */
void srv_run_stream(ct_serve *s, const char *name, const srv_req *q, srv_reply *r);
struct MHD_Response *srv_stream_response(void *stream);

/* launch.c */
void srv_keys(srv_reply *r);
void srv_config_check(ct_serve *s, const srv_req *q, srv_reply *r);
void srv_config_save(ct_serve *s, const char *name, const srv_req *q, srv_reply *r);
void srv_run_start(ct_serve *s, const srv_req *q, srv_reply *r);
void srv_run_stop(ct_serve *s, const char *name, srv_reply *r);
void srv_run_export(ct_serve *s, const char *name, const srv_req *q, srv_reply *r);
/* Starts a run (the launch check first); 1 if it started (r: 202), else 0
 * with the refusal in r. */
int srv_start_run(ct_serve *s, const char *name, int ranks, const ct_json *resume, srv_reply *r);

/* queue.c: runs started one after another, each once no run this server
 * started is alive (the reaper calls srv_queue_tick); in memory, so a
 * restarted server's queue is empty. */
void srv_queue_add(ct_serve *s, const char *name, int ranks, const ct_json *resume, srv_reply *r);
void srv_queue_tick(ct_serve *s);
/* 1-based place of a run in the queue, 0 if not queued. */
int srv_queue_pos(ct_serve *s, const char *name);
void srv_queue_get(ct_serve *s, srv_reply *r);
void srv_queue_remove(ct_serve *s, const srv_req *q, srv_reply *r);
/* RUN/serve.json: the last start from a server. */
typedef struct srv_meta {
  long pid;
  double started;       /* Unix seconds, to the millisecond (runs queued back to back
                         * start and end within one second) */
  int ranks, exit_code; /* exit_code -1: not known (running, or never collected) */
  int stop;             /* a stop was asked for */
  double ended;         /* when the exit was collected (Unix seconds; 0: not known) */
} srv_meta;
/* 1 and *m if the run has a serve.json. */
int srv_meta_get(ct_serve *s, int runfd, srv_meta *m);
/* The wall clock in Unix seconds, to the millisecond. */
double srv_now(void);
/* The pid of a live run started by this or an earlier server, else 0. */
pid_t srv_run_pid(ct_serve *s, int runfd, int *ranks, int *exit_code);
void *srv_reaper_main(void *arg);
/* Writes v as JSON. */
void srv_json_write(FILE *f, const ct_json *v);

/* assets (generated at build time from web/dist/index.html) */
extern const unsigned char ct_serve_index_html[];
extern const size_t ct_serve_index_html_len;

#endif

/* The web server's write side: the key registry for the config builder, the
 * config check (the trainer's own parser and validator), saving a run's
 * config.json (+ multidatabackend.json), and starting and stopping runs.
 *
 * A run starts as `ctuner train --config RUN/config.json --output_dir=RUN`
 * (through `mpirun -np N` for N ranks) in its own session, stdout and stderr
 * appended to RUN/train.log; RUN/serve.json records its pid, ranks and, once
 * the reaper thread collects it, its exit code. Stop sends SIGTERM to the
 * run's process group (mpirun and its ranks) and SIGKILL 30 s later if it is
 * still there; the trainer's checkpoints are written to a temporary name and
 * renamed, so a run killed at any point resumes from its last complete one. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctuner/config.h"
#include "ctuner/optim.h"
#include "serve/serve_int.h"

extern char **environ;

#define STOP_GRACE_S 30

void srv_json_write(FILE *f, const ct_json *v) {
  switch (v->type) {
    case CT_JSON_NULL:
      fputs("null", f);
      break;
    case CT_JSON_BOOL:
      fputs(v->boolean ? "true" : "false", f);
      break;
    case CT_JSON_NUMBER:
      if (v->is_int)
        fprintf(f, "%lld", (long long)v->i64);
      else
        fprintf(f, "%.17g", v->num);
      break;
    case CT_JSON_STRING:
      ct_json_fput_str(f, v->str);
      break;
    case CT_JSON_ARRAY:
    case CT_JSON_OBJECT:
      fputc(v->type == CT_JSON_ARRAY ? '[' : '{', f);
      for (size_t i = 0; i < v->n; i++) {
        if (i) fputs(", ", f);
        if (v->type == CT_JSON_OBJECT) {
          ct_json_fput_str(f, v->keys[i]);
          fputs(": ", f);
        }
        srv_json_write(f, &v->items[i]);
      }
      fputc(v->type == CT_JSON_ARRAY ? ']' : '}', f);
      break;
  }
}

static void add_choice(char *buf, size_t n, const char *c) {
  size_t at = strlen(buf);
  snprintf(buf + at, n - at, "%s%s", at ? "|" : "", c);
}

/* The values a key whose rule is a function accepts, from the registries the
 * validator itself consults (optimizers, schedules) or its messages; *open: a
 * value outside them is allowed too (resume_from_checkpoint's directory). The
 * validator keeps the last word. NULL: none known. */
static const char *fn_choices(const ct_config_key_info *k, char *buf, size_t n, int *open) {
  *open = 0;
  buf[0] = 0;
  if (!strcmp(k->name, "optimizer")) {
    size_t m = 0;
    const ct_optim_info *o = ct_optim_registry(&m);
    for (size_t i = 0; i < m; i++)
      if (!strcmp(o[i].name, o[i].canonical)) add_choice(buf, n, o[i].name);
  } else if (!strcmp(k->name, "lr_scheduler")) {
    for (int i = 0; i < CT_SCHED_NKINDS; i++) add_choice(buf, n, ct_sched_kind_name(i));
  } else if (!strcmp(k->name, "mixed_precision")) {
    add_choice(buf, n, "no|bf16");
  } else if (!strcmp(k->name, "preset")) {
    add_choice(buf, n, "tiny|small|demo|bench"); /* check_preset's message */
  } else if (!strcmp(k->name, "resume_from_checkpoint")) {
    add_choice(buf, n, "latest|none");
    *open = 1;
  } else if (!strcmp(k->name, "report_to") && k->choices) {
    snprintf(buf, n, "none|%s", k->choices); /* NONE_OR's none */
  } else {
    return k->choices;
  }
  return buf;
}

void srv_keys(srv_reply *r) {
  FILE *f = srv_json_open(r, 200);
  ct_config_key_info k;
  char cb[1024];
  if (f) fputs("{\"keys\": [", f);
  for (size_t i = 0; f && ct_config_key_info_at(i, &k); i++) {
    int open = 0;
    k.choices = fn_choices(&k, cb, sizeof cb, &open);
    fprintf(f, "%s{\"name\": ", i ? ",\n" : "");
    ct_json_fput_str(f, k.name);
    fputs(", \"type\": ", f);
    ct_json_fput_str(f, k.type);
    fputs(", \"default\": ", f);
    if (k.def)
      ct_json_fput_str(f, k.def);
    else
      fputs("null", f);
    fputs(", \"models\": ", f);
    ct_json_fput_str(f, ct_config_models_name(k.models));
    fputs(", \"help\": ", f);
    ct_json_fput_str(f, k.help ? k.help : "");
    fputs(", \"choices\": ", f);
    if (k.choices) { /* the allowed values, for a drop-down */
      fputc('[', f);
      for (const char *p = k.choices; *p;) {
        const size_t n = strcspn(p, "|");
        char one[128];
        snprintf(one, sizeof one, "%.*s", (int)(n < sizeof one ? n : sizeof one - 1), p);
        if (p != k.choices) fputs(", ", f);
        ct_json_fput_str(f, one);
        p += n + (p[n] == '|');
      }
      fputc(']', f);
    } else {
      fputs("null", f);
    }
    fprintf(f, ", \"open\": %s}", open ? "true" : "false");
  }
  if (f) fputs("]}", f);
  srv_json_close(r, f);
}

/* The key a validator message is about: the first quoted word that is a key,
 * else the first word that is one; NULL if none. */
static const char *message_key(const char *msg, char *buf, size_t n) {
  const char *unk = strstr(msg, "unknown key '");
  if (unk) { /* the key as the user wrote it, not the suggestion */
    unk += 13;
    size_t len = strcspn(unk, "'");
    if (len < n) {
      memcpy(buf, unk, len);
      buf[len] = 0;
      return buf;
    }
  }
  for (int quoted = 1; quoted >= 0; quoted--) {
    for (const char *p = msg; *p; p++) {
      if (quoted && *p != '\'') continue;
      const char *w = quoted ? p + 1 : p;
      if (!quoted && p > msg && (p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z'))) continue;
      size_t len = strspn(w, "abcdefghijklmnopqrstuvwxyz0123456789_");
      if (len == 0 || len >= n || (quoted && w[len] != '\'')) continue;
      memcpy(buf, w, len);
      buf[len] = 0;
      if (ct_config_help(buf)) return buf;
    }
  }
  return NULL;
}

/* Checks the config text as `ctuner train --config` would for `world` ranks,
 * collecting every problem (ct_config_problems, the list `ctuner config check`
 * prints): parse, per-key rules, the DeepSpeed fold, rules between keys. On
 * no error *resolved is the canonical JSON of every key (caller frees). */
static void check_config(const char *text, size_t n, const char *be, size_t ben, const char *outdir,
                         int world, ct_config_problems *probs, char **resolved) {
  ct_config cfg;
  ct_config_defaults(&cfg);
  char path[64];
  *resolved = NULL;
  int fd = memfd_create("config.json", MFD_CLOEXEC); /* no file written anywhere */
  if (fd < 0 || write(fd, text, n) != (ssize_t)n) {
    ct_config_problems_add(probs, 0, CT_ERR_IO, CT_ORIGIN_FILE, NULL, 0, 0, NULL, NULL,
                           "cannot hold the config in memory: %s", strerror(errno));
    goto out;
  }
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  const size_t before = probs->n;
  if (ct_config_load(&cfg, path, probs) == CT_OK && cfg.deepspeed_config) {
    ct_err e = {0};
    if (ct_deepspeed_apply(&cfg, world, &e))
      ct_config_problems_add(probs, 0, e.status, CT_ORIGIN_DEEPSPEED, NULL, 0, 0,
                             "deepspeed_config", NULL, "%s", e.msg);
  }
  ct_config_check(&cfg, probs);
  if (be) srv_backend_problems(be, ben, outdir, &cfg, probs); /* as `ctuner config check` */
  for (size_t i = before; i < probs->n; i++) /* the memfd's path means nothing to the user */
    if (!strcmp(probs->v[i].file, path))
      snprintf(probs->v[i].file, sizeof probs->v[i].file, "config");
  if (!probs->errors) *resolved = ct_config_to_json(&cfg);
out:
  if (fd >= 0) close(fd);
  ct_config_free(&cfg);
}

/* {"ok": ..., "problems": [{key, message, where, warning, hint}...], "resolved": {...}}. */
static void write_check(FILE *f, const char *text, size_t n, const char *be, size_t ben,
                        const char *outdir, int world) {
  ct_config_problems probs = {0};
  char *resolved = NULL, kb[128], wb[700];
  check_config(text, n, be, ben, outdir, world, &probs, &resolved);
  fprintf(f, "{\"ok\": %s, \"world\": %d, \"problems\": [", probs.errors ? "false" : "true", world);
  for (size_t i = 0; i < probs.n; i++) {
    const ct_config_problem *pr = &probs.v[i];
    const char *key = pr->key[0] ? pr->key : message_key(pr->msg, kb, sizeof kb);
    fputs(i ? ", {\"key\": " : "{\"key\": ", f);
    if (key)
      ct_json_fput_str(f, key);
    else
      fputs("null", f);
    fputs(", \"message\": ", f);
    ct_json_fput_str(f, pr->msg);
    fputs(", \"where\": ", f);
    ct_json_fput_str(f, ct_config_problem_where(pr, wb, sizeof wb));
    fprintf(f, ", \"warning\": %s, \"hint\": ", pr->warning ? "true" : "false");
    if (pr->hint[0])
      ct_json_fput_str(f, pr->hint);
    else
      fputs("null", f);
    fputs("}", f);
  }
  fprintf(f, "], \"resolved\": %s}", resolved ? resolved : "null");
  free(resolved);
  ct_config_problems_free(&probs);
}

static int world_arg(const srv_req *q) {
  const char *w = srv_query(q, "world");
  long v = w ? atol(w) : 1;
  return v < 1 ? 1 : v > 1024 ? 1024 : (int)v;
}

/* The JSON text of v (malloc'd), or NULL. */
static char *json_text(const ct_json *v, size_t *n) {
  char *t = NULL;
  FILE *f = open_memstream(&t, n);
  if (!f) return NULL;
  srv_json_write(f, v);
  fputc('\n', f);
  fclose(f);
  return t;
}

/* The body: a config object, or {"config": {...}, "backend": [...]} (the
 * builder's form, whose datasets are checked as `ctuner config check` does). */
void srv_config_check(ct_serve *s, const srv_req *q, srv_reply *r) {
  ct_json *body = NULL;
  ct_err err;
  char *ct = NULL, *bt = NULL;
  size_t cn = 0, bn = 0;
  if (!ct_json_parse(q->body, q->nbody, &body, &err) && body->type == CT_JSON_OBJECT &&
      body->n == 2 && ct_json_get(body, "config") && ct_json_get(body, "backend")) {
    const ct_json *c = ct_json_get(body, "config"), *b = ct_json_get(body, "backend");
    if (c->type == CT_JSON_OBJECT && b->type == CT_JSON_ARRAY) {
      ct = json_text(c, &cn);
      bt = json_text(b, &bn);
    }
  }
  FILE *f = srv_json_open(r, 200);
  if (f && ct && bt)
    write_check(f, ct, cn, bt, bn, s->root, world_arg(q));
  else if (f)
    write_check(f, q->body, q->nbody, NULL, 0, NULL, world_arg(q));
  srv_json_close(r, f);
  free(ct);
  free(bt);
  ct_json_free(body);
}

/* The config object with output_dir (and data_backend_config) set to paths in
 * the run directory, as text. */
static char *config_text(const ct_json *cfg, const char *run, int has_backend) {
  char *t = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&t, &n);
  if (!f) return NULL;
  fputs("{\n  \"output_dir\": ", f);
  ct_json_fput_str(f, run);
  if (has_backend) {
    char p[PATH_MAX + 256];
    snprintf(p, sizeof p, "%s/multidatabackend.json", run);
    fputs(",\n  \"data_backend_config\": ", f);
    ct_json_fput_str(f, p);
  }
  for (size_t i = 0; i < cfg->n; i++) {
    const char *k = cfg->keys[i] + (strncmp(cfg->keys[i], "--", 2) ? 0 : 2);
    if (!strcmp(k, "output_dir") || (has_backend && !strcmp(k, "data_backend_config"))) continue;
    fputs(",\n  ", f);
    ct_json_fput_str(f, cfg->keys[i]);
    fputs(": ", f);
    srv_json_write(f, &cfg->items[i]);
  }
  fputs("\n}\n", f);
  fclose(f);
  return t;
}

/* Writes RUN/config.json (and RUN/multidatabackend.json) from a body
 * {"config": {...}, "backend": [...]}; answers as the check does, plus the
 * files written. */
static void save_config(ct_serve *s, const char *name, const ct_json *body, int world,
                        srv_reply *r) {
  const ct_json *cfg = ct_json_get(body, "config"), *be = ct_json_get(body, "backend");
  char run[PATH_MAX + 200], *text = NULL, *betext = NULL;
  size_t ben = 0;
  int runfd = -1;
  if (!cfg || cfg->type != CT_JSON_OBJECT || (be && be->type != CT_JSON_ARRAY)) {
    srv_error(r, 400, "expected {\"config\": {...}, \"backend\": [...] (optional)}");
    goto out;
  }
  if (mkdirat(s->rootfd, name, 0755) && errno != EEXIST) {
    srv_error(r, 500, "cannot create run '%s': %s", name, strerror(errno));
    goto out;
  }
  if ((runfd = srv_open_run(s, name)) < 0) {
    srv_error(r, 403, "'%s' under the root is not a directory", name);
    goto out;
  }
  snprintf(run, sizeof run, "%s/%s", s->root, name);
  if (be) betext = json_text(be, &ben);
  text = config_text(cfg, run, be != NULL);
  if (!text || (be && !betext) ||
      (be && srv_write_at(runfd, "multidatabackend.json", betext, ben)) ||
      srv_write_at(runfd, "config.json", text, strlen(text))) {
    srv_error(r, 500, "cannot write the config of run '%s': %s", name, strerror(errno));
    goto out;
  }
  FILE *f = srv_json_open(r, 200);
  if (f) {
    fputs("{\"saved\": [\"config.json\"", f);
    if (be) fputs(", \"multidatabackend.json\"", f);
    fputs("], \"check\": ", f);
    write_check(f, text, strlen(text), betext, ben, run, world);
    fputs("}", f);
  }
  srv_json_close(r, f);
out:
  free(text);
  free(betext);
  if (runfd >= 0) close(runfd);
}

void srv_config_save(ct_serve *s, const char *name, const srv_req *q, srv_reply *r) {
  ct_json *body = NULL;
  ct_err err;
  if (ct_json_parse(q->body, q->nbody, &body, &err)) {
    srv_error(r, 400, "body: %s", err.msg);
    return;
  }
  if (srv_json_nul(body))
    srv_error(r, 400, "body: a string holds a NUL (\\u0000)");
  else
    save_config(s, name, body, world_arg(q), r);
  ct_json_free(body);
}

/* ---- serve.json and the children ---- */

double srv_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + (double)(t.tv_nsec / 1000000) / 1e3;
}

static int meta_read(int runfd, srv_meta *m) {
  ct_json *j = NULL;
  ct_err err;
  char *b = NULL;
  size_t n;
  memset(m, 0, sizeof *m);
  m->exit_code = -1;
  int fd = openat(runfd, "serve.json", O_RDONLY | O_NOFOLLOW | O_CLOEXEC), ok = 0;
  if (fd >= 0 && !srv_read_fd(fd, 0, 4096, &b, &n) && !ct_json_parse(b, n, &j, &err)) {
    const ct_json *v;
    if ((v = ct_json_get(j, "pid")) && v->type == CT_JSON_NUMBER) m->pid = (long)v->num;
    if ((v = ct_json_get(j, "started")) && v->type == CT_JSON_NUMBER) m->started = v->num;
    if ((v = ct_json_get(j, "ranks")) && v->type == CT_JSON_NUMBER) m->ranks = (int)v->num;
    if ((v = ct_json_get(j, "exit_code")) && v->type == CT_JSON_NUMBER) m->exit_code = (int)v->num;
    if ((v = ct_json_get(j, "stop_requested")) && v->type == CT_JSON_BOOL) m->stop = v->boolean;
    if ((v = ct_json_get(j, "ended")) && v->type == CT_JSON_NUMBER) m->ended = v->num;
    ok = 1;
  }
  ct_json_free(j);
  free(b);
  if (fd >= 0) close(fd);
  return ok;
}

int srv_meta_get(ct_serve *s, int runfd, srv_meta *m) {
  pthread_mutex_lock(&s->mu);
  int ok = meta_read(runfd, m);
  pthread_mutex_unlock(&s->mu);
  return ok;
}

static void meta_write(int runfd, const srv_meta *m) {
  char b[256];
  int n = snprintf(b, sizeof b,
                   "{\"pid\": %ld, \"ranks\": %d, \"started\": %.3f, %s\"exit_code\": ", m->pid,
                   m->ranks, m->started, m->stop ? "\"stop_requested\": true, " : "");
  if (m->exit_code >= 0)
    n += snprintf(b + n, sizeof b - (size_t)n, "%d, \"ended\": %.3f}\n", m->exit_code, m->ended);
  else
    n += snprintf(b + n, sizeof b - (size_t)n, "null}\n");
  srv_write_at(runfd, "serve.json", b, (size_t)n);
}

pid_t srv_run_pid(ct_serve *s, int runfd, int *ranks, int *exit_code) {
  srv_meta m;
  int ok = srv_meta_get(s, runfd, &m);
  *ranks = m.ranks;
  *exit_code = m.exit_code;
  /* alive, and still the session leader we made it (not a reused pid) */
  if (ok && m.pid > 0 && m.exit_code < 0 && kill((pid_t)m.pid, 0) == 0 &&
      getsid((pid_t)m.pid) == (pid_t)m.pid)
    return (pid_t)m.pid;
  return 0;
}

void *srv_reaper_main(void *arg) {
  ct_serve *s = arg;
  while (!s->stopping) {
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < SRV_MAX_CHILDREN; i++) {
      srv_child *c = &s->children[i];
      int ws;
      if (!c->pid) continue;
      if (c->kill_at && time(NULL) >= c->kill_at) {
        kill(-c->pid, SIGKILL);
        c->kill_at = 0;
      }
      if (waitpid(c->pid, &ws, WNOHANG) != c->pid) continue;
      int runfd = srv_open_run(s, c->name);
      srv_meta m;
      if (runfd >= 0 && meta_read(runfd, &m) && m.pid == c->pid) {
        m.exit_code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
        m.ended = srv_now();
        meta_write(runfd, &m);
      }
      if (runfd >= 0) close(runfd);
      memset(c, 0, sizeof *c);
    }
    pthread_mutex_unlock(&s->mu);
    srv_queue_tick(s); /* the next queued run, once none runs */
    usleep(200 * 1000);
  }
  return NULL;
}

/* argv of a start into av (strings in store). */
static int start_argv(ct_serve *s, const char *run, int ranks, const ct_json *resume, char **av,
                      char store[4][PATH_MAX + 256]) {
  int n = 0;
  if (ranks > 1) {
    av[n++] = s->mpirun;
    av[n++] = "-np";
    snprintf(store[0], sizeof store[0], "%d", ranks);
    av[n++] = store[0];
    av[n++] = "--oversubscribe";
    if (geteuid() == 0) av[n++] = "--allow-run-as-root";
  }
  av[n++] = s->ctuner;
  av[n++] = "train";
  snprintf(store[1], sizeof store[1], "--config=%s/config.json", run);
  av[n++] = store[1];
  snprintf(store[2], sizeof store[2], "--output_dir=%s", run);
  av[n++] = store[2];
  if (resume && resume->type == CT_JSON_BOOL)
    av[n++] = resume->boolean ? "--resume_from_checkpoint=latest" : "--resume_from_checkpoint=none";
  av[n] = NULL;
  return n;
}

/* The environment of a child: this process's, with HF_HUB_OFFLINE=1 unless
 * the server was started with --hub-downloads (a download would write into
 * the user's Hugging Face cache, outside the root: docs/webui.md). Free with
 * child_env_free; NULL when out of memory. */
static char **child_env(const ct_serve *s) {
  if (s->hub_downloads) return environ;
  size_t n = 0;
  while (environ[n]) n++;
  char **e = malloc((n + 2) * sizeof *e);
  if (!e) return NULL;
  size_t k = 0;
  e[k++] = "HF_HUB_OFFLINE=1";
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "HF_HUB_OFFLINE=", 15)) e[k++] = environ[i];
  e[k] = NULL;
  return e;
}

static void child_env_free(char **e) {
  if (e != environ) free(e);
}

/* Spawns av in its own session with stdout/stderr on logfd, in runfd, with
 * the server's child environment. */
static int spawn(const ct_serve *s, char **av, int logfd, int runfd, pid_t *pid) {
  char **envp = child_env(s);
  if (!envp) return ENOMEM;
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  sigset_t none, def;
  sigemptyset(&none);
  sigemptyset(&def);
  sigaddset(&def, SIGTERM);
  sigaddset(&def, SIGINT);
  sigaddset(&def, SIGPIPE);
  sigaddset(&def, SIGHUP);
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, logfd, 1);
  posix_spawn_file_actions_adddup2(&fa, logfd, 2);
  posix_spawn_file_actions_addfchdir_np(&fa, runfd);
  posix_spawnattr_init(&at);
  posix_spawnattr_setflags(&at,
                           POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setsigmask(&at, &none); /* `ctuner serve` blocks SIGTERM to sigwait on it */
  posix_spawnattr_setsigdefault(&at, &def);
  int rc = posix_spawnp(pid, av[0], &fa, &at, av, envp);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  child_env_free(envp);
  return rc;
}

/* Starts run `name` (its config.json saved) under s->mu. */
static void start_locked(ct_serve *s, const char *name, int runfd, int ranks, const ct_json *resume,
                         srv_reply *r) {
  char run[PATH_MAX + 200], store[4][PATH_MAX + 256], *av[16];
  int slot = -1, logfd = -1;
  srv_meta m;
  for (int i = 0; i < SRV_MAX_CHILDREN && slot < 0; i++)
    if (!s->children[i].pid) slot = i;
  if (meta_read(runfd, &m) && m.pid > 0 && m.exit_code < 0 && kill((pid_t)m.pid, 0) == 0 &&
      getsid((pid_t)m.pid) == (pid_t)m.pid) {
    srv_error(r, 409, "run '%s' is already running (pid %ld)", name, m.pid);
    return;
  }
  if (slot < 0) {
    srv_error(r, 503, "%d runs are running already", SRV_MAX_CHILDREN);
    return;
  }
  snprintf(run, sizeof run, "%s/%s", s->root, name);
  int ac = start_argv(s, run, ranks, resume, av, store);
  logfd = openat(runfd, "train.log", O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (logfd < 0) {
    srv_error(r, 500, "cannot open %s/train.log: %s", run, strerror(errno));
    return;
  }
  dprintf(logfd, "==== ctuner serve: starting at %ld:", (long)time(NULL));
  for (int i = 0; i < ac; i++) dprintf(logfd, " %s", av[i]);
  dprintf(logfd, "\n");
  pid_t pid;
  int rc = spawn(s, av, logfd, runfd, &pid);
  close(logfd);
  if (rc) {
    srv_error(r, 500, "cannot start %s: %s", av[0], strerror(rc));
    return;
  }
  m = (srv_meta){.pid = pid, .started = srv_now(), .ranks = ranks, .exit_code = -1};
  meta_write(runfd, &m);
  s->children[slot].pid = pid;
  s->children[slot].kill_at = 0;
  snprintf(s->children[slot].name, sizeof s->children[slot].name, "%s", name);
  FILE *f = srv_json_open(r, 202);
  if (f) {
    fputs("{\"name\": ", f);
    ct_json_fput_str(f, name);
    fprintf(f, ", \"pid\": %ld, \"ranks\": %d, \"command\": [", (long)pid, ranks);
    for (int i = 0; i < ac; i++) {
      if (i) fputs(", ", f);
      ct_json_fput_str(f, av[i]);
    }
    fputs("]}", f);
  }
  srv_json_close(r, f);
}

int srv_start_run(ct_serve *s, const char *name, int ranks, const ct_json *resume, srv_reply *r) {
  int runfd = srv_open_run(s, name);
  if (runfd < 0) {
    srv_error(r, 404, "run '%s' has no saved config.json (POST /api/runs/%s/config first)", name,
              name);
    return 0;
  }
  if (!srv_launch_check(s, name, runfd, r)) { /* no links, nothing written outside */
    pthread_mutex_lock(&s->mu);
    start_locked(s, name, runfd, ranks, resume, r);
    pthread_mutex_unlock(&s->mu);
  }
  close(runfd);
  return r->code == 202;
}

void srv_run_start(ct_serve *s, const srv_req *q, srv_reply *r) {
  ct_json *body = NULL;
  ct_err err;
  int runfd = -1;
  if (ct_json_parse(q->body, q->nbody, &body, &err) || body->type != CT_JSON_OBJECT) {
    srv_error(r, 400, "body: expected {\"name\": ..., \"ranks\": N, \"resume\": bool}%s%s",
              body ? "" : ": ", body ? "" : err.msg);
    goto out;
  }
  const ct_json *rk = ct_json_get(body, "ranks"), *resume = ct_json_get(body, "resume");
  const char *name = srv_json_name(ct_json_get(body, "name"));
  long ranks = rk && rk->type == CT_JSON_NUMBER && rk->is_int ? (long)rk->i64 : rk ? -1 : 1;
  if (!name) {
    srv_error(r, 400, "\"name\" must be a run name (letters, digits, '.', '_', '-')");
    goto out;
  }
  if (srv_json_nul(body)) {
    srv_error(r, 400, "body: a string holds a NUL (\\u0000)");
    goto out;
  }
  if (ranks < 1 || ranks > 64) {
    srv_error(r, 400, "\"ranks\" must be an integer in 1..64");
    goto out;
  }
  if (ct_json_get(body, "config")) { /* save first, refuse a config that does not check */
    save_config(s, name, body, (int)ranks, r);
    if (r->code != 200) goto out;
    if (!strstr(r->body, "\"check\": {\"ok\": true")) {
      r->code = 422;
      goto out;
    }
  }
  const ct_json *queue = ct_json_get(body, "queue");
  if (queue && queue->type == CT_JSON_BOOL && queue->boolean)
    srv_queue_add(s, name, (int)ranks, resume, r);
  else
    srv_start_run(s, name, (int)ranks, resume, r);
out:
  if (runfd >= 0) close(runfd);
  ct_json_free(body);
}

void srv_run_stop(ct_serve *s, const char *name, srv_reply *r) {
  int ranks, code;
  int runfd = srv_open_run(s, name);
  if (runfd < 0) {
    srv_error(r, 404, "no run '%s' under the root", name);
    return;
  }
  pid_t pid = srv_run_pid(s, runfd, &ranks, &code);
  close(runfd);
  if (!pid) {
    srv_error(r, 409, "run '%s' is not running (or was not started by ctuner serve)", name);
    return;
  }
  pthread_mutex_lock(&s->mu);
  srv_meta m;
  if ((runfd = srv_open_run(s, name)) >= 0 && meta_read(runfd, &m) && m.pid == pid) {
    m.stop = 1; /* its exit is a stop, not a failure (mpirun's own code is 1) */
    meta_write(runfd, &m);
  }
  if (runfd >= 0) close(runfd);
  kill(-pid, SIGTERM); /* the whole session: mpirun and its ranks */
  for (int i = 0; i < SRV_MAX_CHILDREN; i++)
    if (s->children[i].pid == pid) s->children[i].kill_at = time(NULL) + STOP_GRACE_S;
  pthread_mutex_unlock(&s->mu);
  FILE *f = srv_json_open(r, 202);
  if (f) fprintf(f, "{\"stopping\": true, \"pid\": %ld, \"signal\": \"SIGTERM\"}", (long)pid);
  srv_json_close(r, f);
}

/* 0 if checkpoint dir `ck` of the run is a directory with no symbolic link in
 * it (the export reads it by name), else the refusal in r. */
static int export_refused(int runfd, const char *name, const char *ck, srv_reply *r) {
  char link[PATH_MAX];
  int fd = srv_open_rel(runfd, ck, O_RDONLY | O_DIRECTORY);
  if (fd < 0 && errno != ENOENT) {
    srv_error(r, 403,
              "%s of run '%s' is not a directory (a symbolic link?): the server follows no "
              "links under its root",
              ck, name);
    return 1;
  }
  if (fd < 0) {
    srv_error(r, 404, "run '%s' has no %s", name, ck);
    return 1;
  }
  close(fd);
  int found = srv_find_link(runfd, ck, link, sizeof link);
  if (found > 0)
    srv_error(r, 403, "%s of run '%s' holds a symbolic link, '%s': the server follows no links", ck,
              name, link);
  else if (found < 0)
    srv_error(r, 500, "cannot look through %s of run '%s': %s", ck, name, strerror(errno));
  return found != 0;
}

/* POST /api/runs/{name}/export {"checkpoint": "checkpoint-N", "dtype": "f32"|"bf16",
 * "ema": bool}: `ctuner checkpoint export` into RUN/exports/, waited for (in
 * this connection's thread), its output kept in RUN/exports/export.log. */
void srv_run_export(ct_serve *s, const char *name, const srv_req *q, srv_reply *r) {
  ct_json *body = NULL;
  ct_err err;
  int runfd = -1, exfd = -1, logfd = -1;
  char ck[PATH_MAX + 256], out[PATH_MAX + 256], file[200], *av[12];
  if (ct_json_parse(q->body, q->nbody, &body, &err) || body->type != CT_JSON_OBJECT) {
    srv_error(r, 400,
              "body: expected {\"checkpoint\": \"checkpoint-N\", \"dtype\": ..., \"ema\": ...}");
    goto out;
  }
  const ct_json *dt = ct_json_get(body, "dtype"), *ema = ct_json_get(body, "ema");
  const char *ckpt = srv_json_name(ct_json_get(body, "checkpoint"));
  const char *dtype = dt && dt->type == CT_JSON_STRING ? dt->str : "f32";
  int use_ema = ema && ema->type == CT_JSON_BOOL && ema->boolean;
  if (!ckpt || strncmp(ckpt, "checkpoint-", 11) || srv_json_nul(body) ||
      (strcmp(dtype, "f32") && strcmp(dtype, "bf16"))) {
    srv_error(r, 400, "\"checkpoint\" must be a checkpoint-N of the run, \"dtype\" f32 or bf16");
    goto out;
  }
  if ((runfd = srv_open_run(s, name)) < 0) {
    srv_error(r, 404, "no run '%s' under the root", name);
    goto out;
  }
  if (export_refused(runfd, name, ckpt, r)) goto out;
  if ((mkdirat(runfd, "exports", 0755) && errno != EEXIST) ||
      (exfd = srv_open_rel(runfd, "exports", O_RDONLY | O_DIRECTORY)) < 0 ||
      (logfd = openat(exfd, "export.log", O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC,
                      0644)) < 0) {
    srv_error(r, 500, "cannot make %s/%s/exports: %s", s->root, name, strerror(errno));
    goto out;
  }
  snprintf(file, sizeof file, "%s%s-%s.safetensors", ckpt, use_ema ? "-ema" : "", dtype);
  struct stat sb;
  if (!fstatat(exfd, file, &sb, AT_SYMLINK_NOFOLLOW) && !S_ISREG(sb.st_mode)) {
    srv_error(r, 403, "exports/%s of run '%s' is not a regular file (a symbolic link?)", file,
              name);
    goto out;
  }
  snprintf(ck, sizeof ck, "%s/%s/%s", s->root, name, ckpt);
  snprintf(out, sizeof out, "%s/%s/exports/%s", s->root, name, file);
  int n = 0;
  av[n++] = s->ctuner;
  av[n++] = "checkpoint";
  av[n++] = "export";
  av[n++] = "--checkpoint";
  av[n++] = ck;
  av[n++] = "--out";
  av[n++] = out;
  av[n++] = "--dtype";
  av[n++] = (char *)dtype;
  if (use_ema) av[n++] = "--ema";
  av[n] = NULL;
  pid_t pid;
  int ws = 0, rc = spawn(s, av, logfd, runfd, &pid);
  if (!rc)
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
  if (rc || !WIFEXITED(ws) || WEXITSTATUS(ws)) {
    srv_error(r, 500, "ctuner checkpoint export failed (see exports/export.log of run '%s')", name);
    goto out;
  }
  FILE *f = srv_json_open(r, 200);
  if (f) {
    fputs("{\"file\": ", f);
    char rel[240];
    snprintf(rel, sizeof rel, "exports/%s", file);
    ct_json_fput_str(f, rel);
    fputs("}", f);
  }
  srv_json_close(r, f);
out:
  if (logfd >= 0) close(logfd);
  if (exfd >= 0) close(exfd);
  if (runfd >= 0) close(runfd);
  ct_json_free(body);
}

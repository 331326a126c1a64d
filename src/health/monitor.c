/* monitor.c: the health object of one rank — NVML readings judged every
 * health_poll_interval seconds on a thread, the circuit breaker (closed ->
 * open on the first fatal fault, never back), runtime faults, host checks,
 * and the events handed to the webhook sender (webhook.c). */
#define _GNU_SOURCE /* asprintf */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctuner/log.h"
#include "ctuner/parse.h"
#include "health/health_int.h"

#define MAX_GPUS 16
#define KEYLEN 160

typedef struct watched {
  ct_gpu_reading last; /* the newest reading (under the mutex): runtime faults report it */
  int have_last;
  int index;              /* NVML index */
  long long ecc_baseline; /* uncorrected volatile errors at start (-1 unsupported) */
  int faulted, warned;    /* gpu.fault sent (fatal) / thermal warning active */
} watched;

struct ct_health {
  int rank, world, lead;
  char host[64], job_id[128];
  ct_gpu_limits lim;
  double poll_s, mem_low_pct, grace_s, disk_logged;
  long long disk_low; /* bytes, 0 off */
  char disk_action[16], *disk_script;
  ct_nvml *nvml;
  watched gpu[MAX_GPUS];
  int ngpu;
  ct_sender *sender;
  pthread_t th;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop, mem_warned;
  atomic_int open;
  char reason[512];
  double t0;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------- verdicts */

void ct_throttle_names(unsigned long long mask, char *out, size_t n) {
  static const struct {
    unsigned long long bit;
    const char *name;
  } R[] = {{0x1ULL, "gpu_idle"},
           {0x2ULL, "applications_clocks_setting"},
           {0x4ULL, "sw_power_cap"},
           {0x8ULL, "hw_slowdown"},
           {0x10ULL, "sync_boost"},
           {0x20ULL, "sw_thermal_slowdown"},
           {0x40ULL, "hw_thermal_slowdown"},
           {0x80ULL, "hw_power_brake_slowdown"},
           {0x100ULL, "display_clock_setting"}};
  size_t w = 0;
  out[0] = 0;
  for (size_t i = 0; i < sizeof R / sizeof R[0]; i++)
    if (mask & R[i].bit) {
      int k = snprintf(out + w, n - w, "%s\"%s\"", w ? ", " : "", R[i].name);
      if (k < 0 || (size_t)k >= n - w) break;
      w += (size_t)k;
    }
}

ct_gpu_verdict ct_gpu_judge(const ct_gpu_reading *g, long long base, const ct_gpu_limits *lim,
                            const char **type, char *msg, size_t n) {
  *type = NULL;
  msg[0] = 0;
  if (g->ecc_double >= 0 && base >= 0 && g->ecc_double - base >= lim->ecc_threshold) {
    *type = "ecc_errors";
    snprintf(msg, n,
             "GPU %d (%s): %lld new uncorrectable ECC error(s) since start-up (threshold %ld)",
             g->index, g->name, g->ecc_double - base, lim->ecc_threshold);
    return CT_GPU_FATAL;
  }
  if (g->temperature >= 0 && g->shutdown_temperature > 0 &&
      g->temperature >= g->shutdown_temperature - lim->temp_margin) {
    *type = "temperature";
    snprintf(msg, n, "GPU %d (%s): %d C, within %g C of its shutdown temperature %d C", g->index,
             g->name, g->temperature, lim->temp_margin, g->shutdown_temperature);
    return CT_GPU_FATAL;
  }
  if (g->throttle & CT_THROTTLE_HW_SLOWDOWN) {
    *type = "throttle";
    snprintf(msg, n,
             "GPU %d (%s): hardware slowdown (clock throttle reason 0x8: thermal or power fault)",
             g->index, g->name);
    return CT_GPU_FATAL;
  }
  if (g->throttle & CT_THROTTLE_HW_POWER_BRAKE) {
    *type = "throttle";
    snprintf(msg, n,
             "GPU %d (%s): hardware power brake slowdown (clock throttle reason 0x80: external "
             "power brake)",
             g->index, g->name);
    return CT_GPU_FATAL;
  }
  if (g->throttle & CT_THROTTLE_HW_THERMAL) {
    *type = "thermal";
    snprintf(msg, n, "GPU %d (%s): hardware thermal slowdown at %d C (clock throttle reason 0x40)",
             g->index, g->name, g->temperature);
    return CT_GPU_WARNING;
  }
  return CT_GPU_OK;
}

void ct_gpu_assign(const char *keys, int world, int max, size_t keylen, int me, int *mine) {
  int *load = calloc((size_t)world, sizeof *load);
  if (!load) return;
  for (int k = 0; k < max; k++) mine[k] = 0;
  /* every (rank, slot) in order; a key already assigned is skipped */
  for (int r = 0; r < world; r++)
    for (int k = 0; k < max; k++) {
      const char *key = keys + ((size_t)r * (size_t)max + (size_t)k) * keylen;
      if (!key[0]) break;
      int seen_before = 0;
      for (int r2 = 0; r2 < r && !seen_before; r2++)
        for (int k2 = 0; k2 < max; k2++) {
          const char *o = keys + ((size_t)r2 * (size_t)max + (size_t)k2) * keylen;
          if (!o[0]) break;
          if (!strcmp(o, key)) {
            seen_before = 1;
            break;
          }
        }
      for (int k2 = 0; k2 < k && !seen_before; k2++)
        if (!strcmp(keys + ((size_t)r * (size_t)max + (size_t)k2) * keylen, key)) seen_before = 1;
      if (seen_before) continue;
      /* candidates: every rank that sees this key; the least loaded wins */
      int best = -1, best_slot = -1;
      for (int r2 = 0; r2 < world; r2++)
        for (int k2 = 0; k2 < max; k2++) {
          const char *o = keys + ((size_t)r2 * (size_t)max + (size_t)k2) * keylen;
          if (!o[0]) break;
          if (strcmp(o, key)) continue;
          if (best < 0 || load[r2] < load[best]) best = r2, best_slot = k2;
          break;
        }
      load[best]++;
      if (best == me) mine[best_slot] = 1;
    }
  free(load);
}

/* --------------------------------------------------------------- events */

static void post(ct_health *h, const char *type, ct_severity sev, char *fields, char *text) {
  if (!h->sender || !fields || !text) {
    free(fields);
    free(text);
    return;
  }
  ct_event ev = {{0}, sev, fields, text, now_s()};
  snprintf(ev.type, sizeof ev.type, "%s", type);
  ct_sender_post(h->sender, &ev);
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  char *s = NULL;
  if (vasprintf(&s, f, ap) < 0) s = NULL;
  va_end(ap);
  return s;
}

static void send_fault(ct_health *h, const char *type, const char *message, const ct_gpu_reading *g,
                       const char *action, const char *exception_type, ct_severity sev) {
  char *qm = ct_json_quote(message), *qt = ct_json_quote(type), *qh = ct_json_quote(h->host);
  char *qe = exception_type ? ct_json_quote(exception_type) : strdup("null");
  char *gpu = NULL;
  if (g) {
    char thr[512], mem[32];
    ct_throttle_names(g->throttle, thr, sizeof thr);
    char *qn = ct_json_quote(g->name);
    if (g->memory_used_percent >= 0)
      snprintf(mem, sizeof mem, "%.1f", g->memory_used_percent);
    else
      snprintf(mem, sizeof mem, "null");
    char t[16], es[24], ed[24];
    snprintf(t, sizeof t, g->temperature >= 0 ? "%d" : "null", g->temperature);
    snprintf(es, sizeof es, g->ecc_single >= 0 ? "%lld" : "null", g->ecc_single);
    snprintf(ed, sizeof ed, g->ecc_double >= 0 ? "%lld" : "null", g->ecc_double);
    gpu =
        fmt("{\"index\": %d, \"name\": %s, \"temperature_celsius\": %s, \"ecc_errors_single\": %s, "
            "\"ecc_errors_double\": %s, \"throttle_reasons\": [%s], \"memory_used_percent\": %s}",
            g->index, qn ? qn : "null", t, es, ed, thr, mem);
    free(qn);
  }
  char *fields =
      qm && qt && qh && qe
          ? fmt(", \"title\": \"GPU Fault: %s\", \"message\": %s, \"fault\": {\"type\": %s, "
                "\"gpu\": %s, "
                "\"action_taken\": \"%s\", \"exception_type\": %s, \"rank\": %d, \"host\": %s}",
                type, qm, qt, gpu ? gpu : "null", action, qe, h->rank, qh)
          : NULL;
  char *text =
      fmt("GPU Fault: %s on %s, rank %d: %s (%s)", type, h->host, h->rank, message, action);
  post(h, "gpu.fault", sev, fields, text);
  free(qm), free(qt), free(qh), free(qe), free(gpu);
}

/* The breaker opens once; the first fault's message is the reason. */
static void trip(ct_health *h, const char *message) {
  pthread_mutex_lock(&h->mu);
  if (!atomic_load(&h->open)) {
    snprintf(h->reason, sizeof h->reason, "%s", message);
    atomic_store(&h->open, 1);
  }
  pthread_mutex_unlock(&h->mu);
}

int ct_health_is_open(const ct_health *h) {
  return h && atomic_load(&((ct_health *)h)->open);
}
const char *ct_health_reason(const ct_health *h) {
  return h ? h->reason : "";
}

void ct_health_runtime_fault(ct_health *h, const char *type, const char *exception_type,
                             const char *message, int notify) {
  if (!h) return;
  CT_ERROR("health: rank %d: %s: %s; the circuit breaker opens", h->rank, type, message);
  trip(h, message);
  if (!notify) return;
  /* the monitor's newest reading: no NVML call here, a lost GPU may hang it */
  ct_gpu_reading g;
  int have = 0;
  pthread_mutex_lock(&h->mu);
  if (h->ngpu && h->gpu[0].have_last) g = h->gpu[0].last, have = 1;
  pthread_mutex_unlock(&h->mu);
  send_fault(h, type, message, have ? &g : NULL, "circuit_opened", exception_type, CT_SEV_CRITICAL);
}

void ct_health_stage(ct_health *h, const char *key, const char *label, const char *status,
                     double progress) {
  if (!h || !h->lead || !h->sender) return;
  char *qk = ct_json_quote(key), *ql = ct_json_quote(label), *qs = ct_json_quote(status);
  post(
      h, "lifecycle.stage", CT_SEV_INFO,
      qk && ql && qs
          ? fmt(", \"title\": %s, \"message\": \"%s: %s\", \"stage\": {\"key\": %s, \"label\": %s, "
                "\"status\": %s, \"progress\": {\"percent\": %.1f}}",
                ql, label, status, qk, ql, qs, progress)
          : NULL,
      fmt("%s: %s", label, status));
  free(qk), free(ql), free(qs);
}

void ct_health_status(ct_health *h, const char *status, long current, long total, double eta_s,
                      double loss) {
  if (!h || !h->lead || !h->sender) return;
  char l[32], eta[32];
  snprintf(l, sizeof l, isfinite(loss) ? "%.6g" : "null", loss);
  snprintf(eta, sizeof eta, eta_s >= 0 && isfinite(eta_s) ? "%.0f" : "null", eta_s);
  const double pct = total > 0 ? 100.0 * (double)current / (double)total : 0;
  char *qs = ct_json_quote(status);
  post(h, "training.status", CT_SEV_INFO,
       qs ? fmt(", \"title\": \"Training %s\", \"message\": \"step %ld of %ld (%.1f%%), loss %s\", "
                "\"data\": "
                "{\"status\": %s}, \"progress\": {\"current\": %ld, \"total\": %ld, \"percent\": "
                "%.1f, "
                "\"eta_seconds\": %s, \"metrics\": {\"loss\": %s}}",
                status, current, total, pct, l, qs, current, total, pct, eta, l)
          : NULL,
       fmt("Training %s: step %ld of %ld (%.1f%%), loss %s, ETA %s s", status, current, total, pct,
           l, eta));
  free(qs);
}

void ct_health_checkpoint(ct_health *h, const char *path, long step, int is_final) {
  if (!h || !h->lead || !h->sender) return;
  char *label = fmt("Checkpoint saved to %s", path);
  char *qp = ct_json_quote(path), *ql = label ? ct_json_quote(label) : NULL;
  free(label);
  post(h, "training.checkpoint", CT_SEV_INFO,
       qp && ql ? fmt(", \"title\": %s, \"message\": %s, \"checkpoint\": {\"path\": %s, \"label\": "
                      "%s, \"step\": %ld, "
                      "\"is_final\": %s}",
                      ql, ql, qp, ql, step, is_final ? "true" : "false")
                : NULL,
       fmt("Checkpoint saved to %s%s", path, is_final ? " (final)" : ""));
  free(qp);
  free(ql);
}

void ct_health_validation(ct_health *h, long step, int images, const char *dir) {
  if (!h || !h->lead || !h->sender) return;
  char *qd = ct_json_quote(dir);
  post(h, "training.validation", CT_SEV_INFO,
       qd ? fmt(", \"title\": \"Validation at step %ld\", \"message\": \"%d validation image(s) at "
                "step %ld\", "
                "\"validation\": {\"step\": %ld, \"images\": %d, \"path\": %s}",
                step, images, step, step, images, qd)
          : NULL,
       fmt("Validation at step %ld: %d image(s) in %s", step, images, dir));
  free(qd);
}

void ct_health_error(ct_health *h, const char *title, const char *message) {
  if (!h || !h->sender) return;
  char *qt = ct_json_quote(title), *qm = ct_json_quote(message);
  post(h, "error", CT_SEV_ERROR,
       qt && qm ? fmt(", \"title\": %s, \"message\": %s, \"rank\": %d, \"traceback\": null", qt, qm,
                      h->rank)
                : NULL,
       fmt("%s (rank %d): %s", title, h->rank, message));
  free(qt), free(qm);
}

/* ---------------------------------------------------------- host checks */

static void check_memory(ct_health *h) {
  if (h->mem_low_pct <= 0) return;
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return;
  char line[256];
  long long total = -1, avail = -1;
  while (fgets(line, sizeof line, f)) {
    long long v;
    if (sscanf(line, "MemTotal: %lld kB", &v) == 1) total = v;
    if (sscanf(line, "MemAvailable: %lld kB", &v) == 1) avail = v;
  }
  fclose(f);
  if (total <= 0 || avail < 0) return;
  const double pct = 100.0 * (double)avail / (double)total;
  if (pct < h->mem_low_pct && !h->mem_warned) {
    CT_WARN(
        "health: host memory low on %s: %.1f%% available (%lld MiB of %lld MiB; warning below "
        "%g%%)",
        h->host, pct, avail / 1024, total / 1024, h->mem_low_pct);
    h->mem_warned = 1;
  } else if (pct >= h->mem_low_pct * 1.5) {
    h->mem_warned = 0;
  }
}

static long long free_bytes(const char *dir) {
  struct statvfs v;
  if (statvfs(dir, &v) != 0) return -1;
  return (long long)v.f_bavail * (long long)v.f_frsize;
}

/* disk_low_script through sh -c with CTUNER_OUTPUT_DIR and CTUNER_FREE_BYTES
 * added to a copy of the environment (setenv would race with getenv on the
 * webhook and monitor threads). Returns its exit status, -1 if it did not run. */
static int run_script(const char *script, const char *dir, long long free_b) {
  extern char **environ;
  size_t n = 0;
  while (environ[n]) n++;
  char **envp = calloc(n + 3, sizeof *envp);
  char *e1 = NULL, *e2 = NULL;
  if (!envp || asprintf(&e1, "CTUNER_OUTPUT_DIR=%s", dir) < 0 ||
      asprintf(&e2, "CTUNER_FREE_BYTES=%lld", free_b) < 0) {
    free(envp);
    return -1;
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "CTUNER_OUTPUT_DIR=", 18) &&
        strncmp(environ[i], "CTUNER_FREE_BYTES=", 18))
      envp[k++] = environ[i];
  envp[k++] = e1;
  envp[k++] = e2;
  envp[k] = NULL;
  char *argv[] = {"sh", "-c", (char *)script, NULL};
  pid_t pid;
  int rc = -1;
  if (posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, envp) == 0) {
    int ws;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    rc = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
  }
  free(e1);
  free(e2);
  free(envp);
  return rc;
}

int ct_health_disk_verdict(ct_health *h, const char *dir, int round, ct_err *err) {
  if (!h || h->disk_low <= 0) return 0;
  long long fb = free_bytes(dir);
  if (fb < 0) {
    ct_errf(err, CT_ERR_IO, "%s: cannot read free space: %s", dir, strerror(errno));
    return 2;
  }
  if (fb >= h->disk_low) {
    if (round) CT_INFO("health: %s has %.2f GiB free again; checkpointing", dir, fb / 1073741824.0);
    return 0;
  }
  const double gib = 1024.0 * 1024 * 1024;
  if (!round)
    CT_WARN("health: %s has %.2f GiB free, below disk_low_threshold %.2f GiB (disk_low_action %s)",
            dir, fb / gib, h->disk_low / gib, h->disk_action);
  if (!strcmp(h->disk_action, "wait")) {
    if (round && now_s() - h->disk_logged > 60) {
      CT_WARN("health: still waiting for space on %s (%.2f GiB free, need %.2f GiB)", dir, fb / gib,
              h->disk_low / gib);
      h->disk_logged = now_s();
    }
    if (!round) h->disk_logged = now_s();
    return 1;
  }
  if (!strcmp(h->disk_action, "script") && !round) {
    int rc = run_script(h->disk_script, dir, fb);
    CT_INFO("health: disk_low_script exited with %d", rc);
    fb = free_bytes(dir);
    if (fb >= h->disk_low) return 0;
  }
  char msg[600];
  snprintf(msg, sizeof msg,
           "%s has %.2f GiB free, below disk_low_threshold %.2f GiB: the checkpoint was not "
           "written and training "
           "stops (free space, lower disk_low_threshold, or set disk_low_action to wait or script)",
           dir, fb / gib, h->disk_low / gib);
  ct_health_error(h, "Disk space low", msg);
  ct_errf(err, CT_ERR_IO, "%s", msg);
  return 2;
}

double ct_health_poll_seconds(const ct_health *h) {
  return h ? h->poll_s : 1;
}

/* ------------------------------------------------------------ the thread */

static void poll_gpus(ct_health *h) {
  for (int i = 0; i < h->ngpu; i++) {
    watched *w = &h->gpu[i];
    ct_gpu_reading g;
    ct_err e = {0};
    if (ct_nvml_read(h->nvml, w->index, &g, &e)) {
      if (!w->warned) CT_WARN("health: %s", e.msg);
      w->warned = 1;
      continue;
    }
    pthread_mutex_lock(&h->mu);
    w->last = g;
    w->have_last = 1;
    pthread_mutex_unlock(&h->mu);
    const char *type;
    char msg[400];
    ct_gpu_verdict v = ct_gpu_judge(&g, w->ecc_baseline, &h->lim, &type, msg, sizeof msg);
    if (v == CT_GPU_FATAL && !w->faulted) {
      w->faulted = 1;
      CT_ERROR(
          "health: rank %d on %s: %s; the circuit breaker opens and training stops at the next "
          "step",
          h->rank, h->host, msg);
      trip(h, msg);
      send_fault(h, type, msg, &g, "circuit_opened", NULL, CT_SEV_CRITICAL);
    } else if (v == CT_GPU_WARNING && !w->warned) {
      w->warned = 1;
      CT_WARN("health: rank %d on %s: %s (a warning: training continues)", h->rank, h->host, msg);
      send_fault(h, type, msg, &g, "none", NULL, CT_SEV_WARNING);
    } else if (v == CT_GPU_OK) {
      w->warned = 0;
    }
  }
}

static void *monitor(void *arg) {
  ct_health *h = arg;
  pthread_mutex_lock(&h->mu);
  while (!h->stop) {
    pthread_mutex_unlock(&h->mu);
    poll_gpus(h);
    check_memory(h);
    pthread_mutex_lock(&h->mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double until = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + h->poll_s;
    ts.tv_sec = (time_t)until;
    ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
    while (!h->stop && pthread_cond_timedwait(&h->cv, &h->mu, &ts) != ETIMEDOUT) {
    }
  }
  pthread_mutex_unlock(&h->mu);
  return NULL;
}

/* --------------------------------------------------------- open / close */

/* GPU keys this rank sees: "host/uuid" (or "host/index"). */
static int visible(ct_health *h, char keys[MAX_GPUS][KEYLEN], int idx[MAX_GPUS]) {
  if (!h->nvml) return 0;
  int count = 0, n = 0;
  ct_err e = {0};
  if (ct_nvml_count(h->nvml, &count, &e)) {
    CT_WARN("health: %s; no GPU is monitored", e.msg);
    return 0;
  }
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  if (cvd) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", cvd);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t && n < MAX_GPUS; t = strtok_r(NULL, ",", &save)) {
      while (*t == ' ') t++;
      int i = ct_nvml_resolve(h->nvml, t);
      if (i < 0) break; /* CUDA stops at the first invalid entry too */
      idx[n++] = i;
    }
  } else {
    for (int i = 0; i < count && n < MAX_GPUS; i++) idx[n++] = i;
  }
  for (int k = 0; k < n; k++) {
    ct_gpu_reading g;
    if (ct_nvml_read(h->nvml, idx[k], &g, &e)) g.uuid[0] = 0;
    if (g.uuid[0])
      snprintf(keys[k], KEYLEN, "%.63s/%.90s", h->host, g.uuid);
    else
      snprintf(keys[k], KEYLEN, "%.63s/%d", h->host, idx[k]);
  }
  return n;
}

ct_status ct_health_open(const ct_config *cfg, ct_comm *comm, ct_health **out, ct_err *err) {
  *out = NULL;
  ct_health *h = calloc(1, sizeof *h);
  if (!h) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->cv, NULL);
  h->rank = comm ? ct_comm_rank(comm) : 0;
  h->world = comm ? ct_comm_size(comm) : 1;
  h->lead = h->rank == 0;
  h->t0 = now_s();
  if (gethostname(h->host, sizeof h->host) != 0) snprintf(h->host, sizeof h->host, "localhost");
  h->host[sizeof h->host - 1] = 0;
  const char *jid = getenv("CTUNER_JOB_ID");
  snprintf(h->job_id, sizeof h->job_id, "%s", jid ? jid : "");
  h->lim.ecc_threshold = cfg->health_ecc_threshold;
  h->lim.temp_margin = cfg->health_temp_margin;
  h->poll_s = cfg->health_poll_interval;
  h->grace_s = cfg->webhook_timeout + 1; /* at the end: one more attempt for what is queued */
  h->mem_low_pct = cfg->health_memory_low_percent;
  h->disk_low = cfg->disk_low_threshold ? ct_parse_bytes(cfg->disk_low_threshold) : 0;
  snprintf(h->disk_action, sizeof h->disk_action, "%s",
           cfg->disk_low_action ? cfg->disk_low_action : "stop");
  if (cfg->disk_low_script) h->disk_script = strdup(cfg->disk_low_script);
  ct_status st = CT_OK;
  /* webhooks: every rank parses (a bad file fails every rank the same way) */
  if (cfg->webhook_config && cfg->webhook_config[0]) {
    ct_hook *hooks = NULL;
    int nh = 0;
    st = ct_hooks_parse(cfg->webhook_config, &hooks, &nh, err);
    if (!st) {
      ct_sender_opts so = {cfg->webhook_timeout, (int)cfg->webhook_retries, 1.0, 256, 0};
      st = ct_sender_start(hooks, nh, &so, h->job_id, &h->sender, err);
      if (st) ct_hooks_free(hooks, nh);
    }
    if (st) {
      ct_err_prefix(err, "webhook_config: ");
      ct_health_close(h);
      return st;
    }
  }
  /* NVML: missing is normal (no GPU); logged once by rank 0 */
  ct_err ne = {0};
  const char *lib = cfg->health_nvml_library ? cfg->health_nvml_library : "libnvidia-ml.so.1";
  if (ct_nvml_open(lib, &h->nvml, &ne)) {
    if (h->lead) CT_INFO("health: no GPU is monitored (%s); training is unaffected", ne.msg);
    h->nvml = NULL;
  }
  char(*keys)[KEYLEN] = calloc(MAX_GPUS, KEYLEN);
  char *all = calloc((size_t)h->world * MAX_GPUS, KEYLEN);
  int idx[MAX_GPUS], mine[MAX_GPUS] = {0};
  if (!keys || !all) {
    free(keys);
    free(all);
    ct_health_close(h);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  int n = visible(h, keys, idx);
  if (comm && h->world > 1) {
    st = ct_comm_allgather_bytes(comm, keys, all, (size_t)MAX_GPUS * KEYLEN, err);
  } else {
    memcpy(all, keys, (size_t)MAX_GPUS * KEYLEN);
  }
  if (!st) ct_gpu_assign(all, h->world, MAX_GPUS, KEYLEN, h->rank, mine);
  free(all);
  for (int k = 0; !st && k < n; k++) {
    if (!mine[k]) continue;
    watched *w = &h->gpu[h->ngpu++];
    w->index = idx[k];
    ct_gpu_reading g;
    ct_err e = {0};
    const ct_status rs = ct_nvml_read(h->nvml, idx[k], &g, &e);
    w->ecc_baseline = rs ? -1 : g.ecc_double;
    if (!rs) w->last = g, w->have_last = 1; /* the thread is not running yet */
    CT_INFO(
        "health: rank %d watches GPU %d (%s) on %s: %d C (shutdown %d C), %lld uncorrected ECC "
        "error(s) at "
        "start",
        h->rank, idx[k], g.name, h->host, g.temperature, g.shutdown_temperature, w->ecc_baseline);
  }
  free(keys);
  if (st) {
    ct_health_close(h);
    return st;
  }
  if (pthread_create(&h->th, NULL, monitor, h) == 0)
    h->started = 1;
  else
    CT_WARN("health: cannot start the monitor thread; no GPU or host memory monitoring");
  *out = h;
  return CT_OK;
}

void ct_health_close(ct_health *h) {
  if (!h) return;
  pthread_mutex_lock(&h->mu);
  h->stop = 1;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  if (h->started) pthread_join(h->th, NULL);
  if (h->sender) {
    long sent = 0, failed = 0, dropped = 0;
    ct_sender_stop(h->sender, h->grace_s, &sent, &failed, &dropped);
    if (failed || dropped)
      CT_WARN(
          "webhooks: %ld event(s) delivered, %ld failed after retries, %ld dropped (queue full or "
          "shut down)",
          sent, failed, dropped);
    else
      CT_DEBUG("webhooks: %ld event(s) delivered", sent);
  }
  ct_nvml_close(h->nvml);
  free(h->disk_script);
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->cv);
  free(h);
}

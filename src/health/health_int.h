/* health_int.h: the health module's internals (nvml.c, monitor.c,
 * webhook.c), exposed to its tests. */
#ifndef CTUNER_HEALTH_INT_H
#define CTUNER_HEALTH_INT_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/health.h"
#include "ctuner/json.h"

/* ---- nvml.c ---- */
typedef struct ct_nvml ct_nvml;
typedef struct ct_nvml_memory { /* nvmlMemory_t */
  unsigned long long total, free, used;
} ct_nvml_memory;

/* NVML's clock throttle reasons (nvml.h) */
#define CT_THROTTLE_SW_POWER_CAP 0x4ULL
#define CT_THROTTLE_HW_SLOWDOWN 0x8ULL
#define CT_THROTTLE_SW_THERMAL 0x20ULL
#define CT_THROTTLE_HW_THERMAL 0x40ULL
#define CT_THROTTLE_HW_POWER_BRAKE 0x80ULL

typedef struct ct_gpu_reading {
  int index; /* NVML index */
  char name[96], uuid[96];
  int temperature; /* °C, -1 unknown */
  int shutdown_temperature;
  long long ecc_single, ecc_double; /* volatile corrected / uncorrected; -1 unsupported */
  unsigned long long throttle;      /* reasons bitmask */
  double memory_used_percent;       /* -1 unknown */
} ct_gpu_reading;

ct_status ct_nvml_open(const char *lib, ct_nvml **out, ct_err *err);
void ct_nvml_close(ct_nvml *n);
ct_status ct_nvml_count(ct_nvml *n, int *count, ct_err *err);
int ct_nvml_resolve(ct_nvml *n, const char *entry);
ct_status ct_nvml_read(ct_nvml *n, int index, ct_gpu_reading *g, ct_err *err);

/* ---- monitor.c: one poll's verdict on one GPU ---- */
typedef struct ct_gpu_limits {
  long ecc_threshold; /* new uncorrected errors that are fatal */
  double temp_margin; /* °C below the shutdown threshold that is fatal */
} ct_gpu_limits;

typedef enum { CT_GPU_OK = 0, CT_GPU_WARNING, CT_GPU_FATAL } ct_gpu_verdict;

/* type: "ecc_errors" | "temperature" | "throttle" (fatal) or "thermal"
 * (a warning, as SimpleTuner's); message: a sentence. */
ct_gpu_verdict ct_gpu_judge(const ct_gpu_reading *now, long long ecc_baseline,
                            const ct_gpu_limits *lim, const char **type, char *message, size_t n);
/* Throttle reason names as a JSON array body ("\"hw_slowdown\", ..."). */
void ct_throttle_names(unsigned long long mask, char *out, size_t n);
/* Which ranks watch which GPUs: every distinct (host, GPU) once, by the
 * rank seeing it that watches the fewest so far (lowest rank on ties).
 * seen[r*max + k]: key of the k-th GPU rank r sees ("" ends the list).
 * mine[k] = 1 if this rank (me) watches its k-th GPU. */
void ct_gpu_assign(const char *keys, int world, int max, size_t keylen, int me, int *mine);

/* ---- webhook.c ---- */
typedef enum { CT_HOOK_DISCORD, CT_HOOK_RAW } ct_hook_type;

typedef struct ct_hook {
  ct_hook_type type;
  char *url; /* webhook_url or callback_url */
  char *message_prefix;
  ct_severity log_level;
  char *auth_token;
  int ssl_no_verify;
} ct_hook;

/* --webhook_config: a path, or inline JSON (an object or a list). */
ct_status ct_hooks_parse(const char *value, ct_hook **hooks, int *n, ct_err *err);
void ct_hooks_free(ct_hook *hooks, int n);
const char *ct_severity_name(ct_severity s);

/* An event: its JSON body for raw endpoints (without job_id/timestamp/
 * severity/type, added by the sender) and its text for Discord. */
typedef struct ct_event {
  char type[32];
  ct_severity severity;
  char *fields; /* ", \"key\": value ..." appended to the common fields */
  char *text;   /* Discord content (before message_prefix) */
  double when;  /* unix seconds */
} ct_event;

/* The body sent to one endpoint (malloc'd). */
char *ct_event_body(const ct_event *ev, const ct_hook *h, const char *job_id);
/* JSON string literal of s ("..." with escapes), malloc'd. */
char *ct_json_quote(const char *s);

typedef struct ct_sender ct_sender;
typedef struct ct_sender_opts {
  double timeout_s; /* per request */
  int retries;      /* after the first attempt */
  double backoff_s; /* first retry delay, doubled each time */
  int queue_max;    /* events queued at most; more are dropped (counted) */
  int paused;       /* tests: deliver nothing until ct_sender_stop */
} ct_sender_opts;
ct_status ct_sender_start(ct_hook *hooks, int n, const ct_sender_opts *o, const char *job_id,
                          ct_sender **out, ct_err *err);
/* Takes ev's strings. Never blocks: a full queue drops the event. */
void ct_sender_post(ct_sender *s, ct_event *ev);
/* Events queued now with severity at or above sev (tests). */
int ct_sender_queued(ct_sender *s, ct_severity sev);
/* Waits up to grace_s for the queue to drain, then stops; returns events
 * delivered / failed / dropped through the out-parameters (may be NULL). */
void ct_sender_stop(ct_sender *s, double grace_s, long *sent, long *failed, long *dropped);

#endif

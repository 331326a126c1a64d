/* Health monitoring (docs/health.md): a monitor thread per rank watching its
 * GPUs through NVML (dlopen'd; without NVML nothing is monitored and
 * training is unaffected), a circuit breaker that runtime faults also open,
 * host checks (disk space before checkpoints, low memory) and
 * SimpleTuner-compatible webhooks sent by a background thread.
 *
 * The trainer asks ct_health_is_open() at every step boundary; the ranks
 * agree on it through the step's reduction, so a fault on any rank stops
 * every rank at the same step, without a checkpoint, and the CLI exits with
 * CT_EXIT_HEALTH. */
#ifndef CTUNER_HEALTH_H
#define CTUNER_HEALTH_H

#include "ctuner/comm.h"
#include "ctuner/config.h"
#include "ctuner/status.h"

/* The process exit code of a job stopped by the circuit breaker. */
#define CT_EXIT_HEALTH 3

typedef enum {
  CT_SEV_CRITICAL = 0,
  CT_SEV_ERROR,
  CT_SEV_WARNING,
  CT_SEV_INFO,
  CT_SEV_DEBUG
} ct_severity;

typedef struct ct_health ct_health;

/* Collective over comm (the GPUs are assigned to ranks). Never fails
 * because NVML is missing; fails on a bad webhook_config. */
ct_status ct_health_open(const ct_config *cfg, ct_comm *comm, ct_health **out, ct_err *err);
/* Stops the monitor, sends what is queued (bounded wait), frees. NULL ok. */
void ct_health_close(ct_health *h);

/* 1 once a fatal fault opened the breaker on this rank (it never closes). */
int ct_health_is_open(const ct_health *h);
/* The first fatal fault's message ("" while closed). */
const char *ct_health_reason(const ct_health *h);
/* A runtime compute fault (repeated NaN/Inf, allocation failure, failed
 * collective): opens the breaker; notify: also send gpu.fault (a fault every
 * rank sees at once, as NaN/Inf, is sent by rank 0 alone). */
void ct_health_runtime_fault(ct_health *h, const char *type, const char *exception_type,
                             const char *message, int notify);

/* Events (rank 0 sends lifecycle/status/checkpoint/validation; any rank
 * sends gpu.fault and error). All return at once. */
void ct_health_stage(ct_health *h, const char *key, const char *label, const char *status,
                     double progress);
void ct_health_status(ct_health *h, const char *status, long current, long total, double eta_s,
                      double loss);
void ct_health_checkpoint(ct_health *h, const char *path, long step, int is_final);
void ct_health_validation(ct_health *h, long step, int images, const char *dir);
void ct_health_error(ct_health *h, const char *title, const char *message);

/* Before a checkpoint, round 0, 1, ...: free space on dir against
 * disk_low_threshold. 0: enough (or no threshold); 1: wait (disk_low_action
 * wait: ask again after ct_health_poll_seconds); 2: stop, err says why (an
 * error event is sent). disk_low_action script runs its script at round 0
 * and then decides. The trainer asks on rank 0 and all-reduces the verdict
 * with the breaker, so every rank waits or stops together. */
int ct_health_disk_verdict(ct_health *h, const char *dir, int round, ct_err *err);
double ct_health_poll_seconds(const ct_health *h);
/* Validates a webhook_config value (path or inline JSON) without starting
 * anything: for the CLI's configuration checks (exit code 2). */
ct_status ct_health_check_webhooks(const char *value, ct_err *err);

#endif

/* watchdog.c: the collective watchdog (docs/distributed.md, "Watchdog").
 *
 * A collective that never completes — a rank stopped (SIGSTOP, a wedged
 * device), hung or cut off — would otherwise hold every other rank forever.
 * comm.c starts every collective non-blocking and completes it here, polling
 * MPI_Testall against a deadline of distributed_timeout seconds from the
 * start of the wait. To name the culprit, each rank numbers its collectives
 * and announces "arrived at #k" to every other rank on a side channel (a
 * communicator of its own, 8-byte messages, one posted receive per peer)
 * when a collective does not complete at its first test — one that does
 * costs nothing more, and a rank that completed #k had every rank's part of
 * it; while a wait lasts, the rank repeats its announcement every beat as a
 * heartbeat. On a timeout at #k the ranks whose
 * newest announcement is below k did not arrive; if every rank arrived, the
 * ones silent for several beats are named (stopped inside the collective);
 * otherwise every rank is alive and the collective itself is stuck. Time
 * this rank itself did not run (a gap of more than a beat between two polls:
 * it was stopped and continued) does not count, so a stopped rank that is
 * continued does not blame the others.
 *
 * After a timeout the communicator is broken: later collectives fail at once
 * with the same message, and ct_comm_free neither finalises MPI (it would
 * wait for the missing rank) nor frees what the abandoned operations may
 * still write into. Not here: ending the job (the CLI exits with
 * CT_EXIT_WATCHDOG through MPI_Abort, which also ends a stopped rank).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_int.h"

#define TAG_ARRIVE 0
#define MAX_NAMED 16 /* ranks listed by name in a message */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds between heartbeats while a wait lasts: a tenth of the timeout,
 * within [0.05, 1]. */
static double beat_of(double timeout) {
  double b = timeout > 0 ? timeout / 10 : 1;
  return b < 0.05 ? 0.05 : b > 1 ? 1 : b;
}

ct_status ct_wd_init(ct_comm *c, ct_err *err) {
  ct_wd *w = &c->wd;
  const size_t N = (size_t)c->size;
  w->timeout = CT_COMM_TIMEOUT_DEFAULT;
  w->seen = calloc(N, sizeof *w->seen);
  w->heard = calloc(N, sizeof *w->heard);
  w->in = calloc(N, sizeof *w->in);
  w->out = calloc(N, sizeof *w->out);
  w->sent = calloc(N, sizeof *w->sent);
  w->rreq = malloc(N * sizeof *w->rreq);
  w->sreq = malloc(N * sizeof *w->sreq);
  if (!w->seen || !w->heard || !w->in || !w->out || !w->sent || !w->rreq || !w->sreq)
    return ct_errf(err, CT_ERR_NOMEM, "out of memory for the collective watchdog");
  for (size_t p = 0; p < N; p++) w->rreq[p] = w->sreq[p] = MPI_REQUEST_NULL;
  int rc = MPI_Comm_dup(c->world, &w->side);
  if (rc != MPI_SUCCESS)
    return ct_errf(err, CT_ERR_COMM, "setting up the collective watchdog (MPI_Comm_dup, code %d)",
                   rc);
  w->ready = 1;
  const double t = now_s();
  for (int p = 0; p < c->size && rc == MPI_SUCCESS; p++) {
    w->heard[p] = t;
    if (p != c->rank)
      rc = MPI_Irecv(&w->in[p], 1, MPI_UINT64_T, p, TAG_ARRIVE, w->side, &w->rreq[p]);
  }
  if (rc != MPI_SUCCESS)
    return ct_errf(err, CT_ERR_COMM, "setting up the collective watchdog (MPI_Irecv, code %d)", rc);
  return CT_OK;
}

void ct_wd_free(ct_comm *c) {
  ct_wd *w = &c->wd;
  if (w->broken) return; /* MPI may still write into all of it */
  for (int p = 0; w->ready && p < c->size; p++) {
    if (w->rreq[p] != MPI_REQUEST_NULL) {
      MPI_Cancel(&w->rreq[p]);
      MPI_Wait(&w->rreq[p], MPI_STATUS_IGNORE);
    }
    if (w->sreq[p] != MPI_REQUEST_NULL) MPI_Request_free(&w->sreq[p]); /* completes on its own */
  }
  if (w->ready) MPI_Comm_free(&w->side);
  free(w->seen);
  free(w->heard);
  free(w->in);
  free(w->out);
  free(w->sent);
  free(w->rreq);
  free(w->sreq);
  memset(w, 0, sizeof *w);
}

/* Takes in the announcements that arrived (at most a few per peer). */
static void drain(ct_comm *c, double t) {
  ct_wd *w = &c->wd;
  for (int k = 0; k < 64 * c->size; k++) {
    int idx = MPI_UNDEFINED, flag = 0;
    if (MPI_Testany(c->size, w->rreq, &idx, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag ||
        idx == MPI_UNDEFINED)
      return;
    if (w->in[idx] > w->seen[idx]) w->seen[idx] = w->in[idx];
    w->heard[idx] = t;
    if (MPI_Irecv(&w->in[idx], 1, MPI_UINT64_T, idx, TAG_ARRIVE, w->side, &w->rreq[idx]) !=
        MPI_SUCCESS)
      w->rreq[idx] = MPI_REQUEST_NULL; /* that rank is then named by its silence */
  }
}

/* Sends this rank's number to every peer that has not had it (every peer when
 * beat: a heartbeat); a peer still holding the previous message is skipped
 * and gets it at a later beat. */
static void announce(ct_comm *c, int beat) {
  ct_wd *w = &c->wd;
  for (int p = 0; p < c->size; p++) {
    if (p == c->rank || (!beat && w->sent[p] == w->seq)) continue;
    int done = 1;
    if (w->sreq[p] != MPI_REQUEST_NULL) MPI_Test(&w->sreq[p], &done, MPI_STATUS_IGNORE);
    if (!done) continue;
    w->out[p] = w->seq;
    if (MPI_Isend(&w->out[p], 1, MPI_UINT64_T, p, TAG_ARRIVE, w->side, &w->sreq[p]) == MPI_SUCCESS)
      w->sent[p] = w->seq;
  }
}

ct_status ct_wd_arrive(ct_comm *c, ct_err *err) {
  ct_wd *w = &c->wd;
  if (w->broken) return ct_errf(err, CT_ERR_TIMEOUT, "%s", w->msg);
  w->seq++;               /* announced when a wait does not complete at once */
  if ((w->seq & 15) == 0) /* a rank that never waits still takes in the others' news, */
    drain(c, now_s());    /* so no backlog of their announcements builds up in MPI */
  return CT_OK;
}

/* "1 (newest #56), 3 (newest #55)": the ranks p with pick(p), up to
 * MAX_NAMED of them; returns how many there are. */
static int list_ranks(const ct_comm *c, int which, uint64_t k, double t, double quiet, char *out,
                      size_t cap) {
  const ct_wd *w = &c->wd;
  int n = 0;
  size_t len = 0;
  out[0] = 0;
  for (int p = 0; p < c->size; p++) {
    if (p == c->rank) continue;
    const int pick = which == 0 ? w->seen[p] < k : w->seen[p] >= k && t - w->heard[p] > quiet;
    if (!pick) continue;
    if (n < MAX_NAMED && len < cap) {
      int m = which == 0 ? snprintf(out + len, cap - len, "%s%d (newest #%llu)", n ? ", " : "", p,
                                    (unsigned long long)w->seen[p])
                         : snprintf(out + len, cap - len, "%s%d", n ? ", " : "", p);
      len += m > 0 ? (size_t)m : 0;
    }
    n++;
  }
  if (n > MAX_NAMED && len < cap) snprintf(out + len, cap - len, ", ... (%d in all)", n);
  return n;
}

/* The timeout at collective #k: the message naming who is missing; the
 * communicator is broken from here on. */
static ct_status timed_out(ct_comm *c, uint64_t k, const char *what, double waited, ct_err *err) {
  ct_wd *w = &c->wd;
  const double t = now_s();
  drain(c, t);
  char where[64], names[256];
  if (w->step > 0)
    snprintf(where, sizeof where, "at step %ld", w->step);
  else
    snprintf(where, sizeof where, "before the first step");
  const char *tail =
      "; every rank stops, no checkpoint is written (the newest one resumes; "
      "docs/distributed.md, \"Watchdog\")";
  int n = list_ranks(c, 0, k, t, 0, names, sizeof names);
  if (n) {
    snprintf(w->msg, sizeof w->msg,
             "collective watchdog: rank%s %s did not reach collective #%llu (%s) %s within "
             "distributed_timeout %g s: stopped, hung or too slow%s",
             n > 1 ? "s" : "", names, (unsigned long long)k, what, where, w->timeout, tail);
  } else if ((n = list_ranks(c, 1, k, t, 3 * beat_of(w->timeout), names, sizeof names))) {
    snprintf(w->msg, sizeof w->msg,
             "collective watchdog: rank%s %s reached collective #%llu (%s) %s but %s not been "
             "heard from since, and it did not complete within distributed_timeout %g s: "
             "stopped or hung inside it%s",
             n > 1 ? "s" : "", names, (unsigned long long)k, what, where, n > 1 ? "have" : "has",
             w->timeout, tail);
  } else {
    snprintf(w->msg, sizeof w->msg,
             "collective watchdog: collective #%llu (%s) %s did not complete within "
             "distributed_timeout %g s (waited %.1f s) although every rank reached it and "
             "answers: the network between the ranks?%s",
             (unsigned long long)k, what, where, w->timeout, waited, tail);
  }
  w->broken = 1;
  return ct_errf(err, CT_ERR_TIMEOUT, "%s", w->msg);
}

ct_status ct_wd_wait(ct_comm *c, uint64_t k, int n, MPI_Request *reqs, const char *what,
                     ct_err *err) {
  ct_wd *w = &c->wd;
  if (w->broken) /* a range operation started before the timeout: abandoned too */
    return ct_errf(err, CT_ERR_TIMEOUT, "%s", w->msg);
  int flag = 0, rc = MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE);
  if (rc == MPI_SUCCESS && flag) return CT_OK;
  const double beat = beat_of(w->timeout);
  double t0 = now_s(), last = t0, next = t0 + beat;
  announce(c, 0);
  drain(c, t0);
  while (rc == MPI_SUCCESS && !flag) {
    const double t = now_s();
    if (t - last > beat) /* this rank itself did not run (stopped, then continued): */
      t0 += t - last;    /* that time is not the others' delay */
    last = t;
    if (t >= next) { /* a heartbeat, and the others' news */
      drain(c, t);
      announce(c, 1);
      next = t + beat;
    }
    if (w->timeout > 0 && t - t0 >= w->timeout) return timed_out(c, k, what, t - t0, err);
    rc = MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE);
  }
  if (rc == MPI_SUCCESS) return CT_OK;
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return ct_errf(err, CT_ERR_COMM,
                 "%s failed: %s (a rank may have died; see the other ranks' output)", what, msg);
}

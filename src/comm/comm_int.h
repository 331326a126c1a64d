/* comm_int.h: the communicator's private state, shared by comm.c (the
 * collectives) and watchdog.c (waiting on them with a deadline). For
 * src/comm only. */
#ifndef CTUNER_COMM_INT_H
#define CTUNER_COMM_INT_H

#include <mpi.h>
#include <stdint.h>

#include "ctuner/comm.h"

#define CT_COMM_POOL 4

/* The collective watchdog (watchdog.c). Every collective this rank starts
 * gets the next number (seq); a rank that has to wait announces it to every
 * other rank on a side channel (its own communicator, 8-byte messages), so a
 * rank whose wait runs past the timeout can say which ranks never arrived. */
typedef struct ct_wd {
  double timeout;           /* seconds a rank waits in one collective; <= 0: forever */
  uint64_t seq;             /* collectives this rank started */
  long step;                /* the trainer's step (ct_comm_set_step), for messages */
  int ready;                /* side exists and the receives are posted */
  int broken;               /* a collective timed out: every later one fails at once */
  char msg[1024];           /* its message */
  MPI_Comm side;            /* announcements travel here, never matching a collective */
  uint64_t *seen;           /* [size] the newest collective each rank announced */
  double *heard;            /* [size] when a message from each rank last arrived */
  uint64_t *in;             /* [size] receive buffers of the posted receives */
  uint64_t *out;            /* [size] send buffers */
  uint64_t *sent;           /* [size] the newest number sent to each rank */
  MPI_Request *rreq, *sreq; /* [size] one receive and one send per rank */
  double last_beat;         /* when this rank last announced while waiting */
} ct_wd;

struct ct_comm {
  int mpi; /* MPI was initialised by us */
  int rank, size, local_rank, local_size;
  MPI_Comm world;
  float *pack, *unpack; /* size * CHUNK floats each, allocated on first use */
  size_t cap;           /* floats in each */
  float *shard;         /* all-reduce's reduced shard, kept between calls */
  size_t shard_cap;
  /* receive buffers of range reductions, kept for reuse: fresh pages cost a
   * fault each on first touch, which made a 20 MB bucket 10x slower */
  void *pool[CT_COMM_POOL];
  size_t pool_cap[CT_COMM_POOL]; /* bytes */
  ct_wd wd;
};

/* Sets up the side channel (after world exists). */
ct_status ct_wd_init(ct_comm *c, ct_err *err);
/* Cancels the posted receives, completes the sends, frees. */
void ct_wd_free(ct_comm *c);
/* This rank arrives at its next collective: fails at once (CT_ERR_TIMEOUT,
 * the first timeout's message) if an earlier one timed out, else numbers it
 * (announced to the others by a wait that does not complete at once). */
ct_status ct_wd_arrive(ct_comm *c, ct_err *err);
/* Completes reqs[0..n) of collective number k (MPI_Testall polling); past
 * the timeout stops with CT_ERR_TIMEOUT naming the ranks that did not reach
 * it (what: its name for the message) and leaves the communicator broken;
 * the requests are then abandoned, with the buffers they use. */
ct_status ct_wd_wait(ct_comm *c, uint64_t k, int n, MPI_Request *reqs, const char *what,
                     ct_err *err);

#endif

/* comm.h: the communicator — the only door to MPI (docs/distributed.md).
 *
 * One ct_comm per process. Under mpirun (Open MPI sets OMPI_COMM_WORLD_SIZE;
 * Slurm's srun with PMI sets PMI_SIZE / PMIX_RANK) ct_comm_init starts MPI and
 * spans every rank; otherwise it is the single-process communicator (size 1,
 * every collective a copy or a no-op) and MPI is never initialised.
 *
 * Determinism: every reduction sums the ranks' contributions in rank order
 * 0, 1, ..., N-1 in float32 (f32) or double (f64), whatever MPI's own
 * algorithms would do: reduce-scatter is an all-to-all of the chunks followed
 * by the summation on the owning rank, and all-reduce is reduce-scatter then
 * all-gather. So a run is bit-reproducible for a given world size.
 *
 * Shards: the flat buffers of n floats are split into N equal contiguous
 * shards of ct_comm_shard_len(n, N) floats; the last may be padding (callers
 * allocate N * shard floats); with the rounding several trailing ranks may hold
 * nothing of a short buffer. Rank r owns [r * shard, (r + 1) * shard).
 *
 * Failures: a collective that fails returns CT_ERR_COMM with a message; MPI's
 * error handler is set to return errors rather than abort. A rank that dies
 * makes mpirun end the job (docs/distributed.md, "Failures").
 *
 * Watchdog (docs/distributed.md, "Watchdog"): no collective blocks forever.
 * Each is started non-blocking and polled; a rank that waits in one longer
 * than the timeout (distributed_timeout, default 600 s) gets CT_ERR_TIMEOUT
 * with a message naming the ranks that did not reach it (every rank announces
 * each collective it reaches to the others on a side channel) and the step
 * (ct_comm_set_step). The communicator is then broken: every later collective
 * fails at once with the same message, and ct_comm_free does not finalise MPI
 * (that would wait for the missing rank) — end the job, as the CLI does with
 * exit code CT_EXIT_WATCHDOG through ct_comm_abort. The single-process
 * communicator never waits and has no watchdog.
 */
#ifndef CTUNER_COMM_H
#define CTUNER_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/status.h"

typedef struct ct_comm ct_comm;

/* Starts MPI when launched by an MPI launcher, else a single-process
 * communicator. force_single != 0 never touches MPI. */
ct_status ct_comm_init(int force_single, ct_comm **out, ct_err *err);
/* Finalises MPI (when it was started) and frees. NULL is fine. After a
 * timeout: frees nothing MPI may still write into and skips MPI_Finalize. */
void ct_comm_free(ct_comm *c);

/* The watchdog's default timeout (seconds; SimpleTuner's nccl_timeout) and the
 * exit code of a job it stopped (docs/distributed.md). */
#define CT_COMM_TIMEOUT_DEFAULT 600.0
#define CT_EXIT_WATCHDOG 4
/* Seconds a rank may wait in one collective; <= 0: forever. */
void ct_comm_set_timeout(ct_comm *c, double seconds);
/* The training step for the watchdog's messages (0: before the first). */
void ct_comm_set_step(ct_comm *c, long step);

int ct_comm_rank(const ct_comm *c);
int ct_comm_size(const ct_comm *c);
/* Ranks on this node and this rank's index among them (for threads per rank). */
int ct_comm_local_rank(const ct_comm *c);
int ct_comm_local_size(const ct_comm *c);
/* "mpi" or "single". */
const char *ct_comm_backend(const ct_comm *c);

/* Floats per shard when n floats are split over size ranks (rounded up to a
 * multiple of 16 floats, so shards stay 64-byte aligned). */
size_t ct_comm_shard_len(size_t n, int size);

/* buf[0..n) <- sum over ranks, in rank order (reduce-scatter + all-gather). */
ct_status ct_comm_allreduce_f32(ct_comm *c, float *buf, size_t n, ct_err *err);
/* The same for a few doubles (losses, norms): every rank gathers all. */
ct_status ct_comm_allreduce_f64(ct_comm *c, double *buf, size_t n, ct_err *err);
/* The floats of rank r's shard that lie inside n: min(shard, n - r*shard), >= 0. */
size_t ct_comm_shard_valid(size_t n, size_t shard, int rank);
/* send holds n <= size * shard floats (the missing tail counts as zeros);
 * recv[0..m) <- sum over ranks of their send[rank * shard ..], in rank order,
 * m = ct_comm_shard_valid(n, shard, rank). recv may be send + rank * shard
 * (in place); no other overlap. */
ct_status ct_comm_reduce_scatter_f32(ct_comm *c, const float *send, size_t n, float *recv,
                                     size_t shard, ct_err *err);
/* recv[0..n) <- every rank's shard in rank order, cut at n (n <= size * shard);
 * each rank's send holds its ct_comm_shard_valid(n, shard, rank) floats. send
 * may be recv + rank * shard (in place) — on every rank or on none (MPI's rule
 * for MPI_IN_PLACE). */
ct_status ct_comm_allgather_f32(ct_comm *c, const float *send, float *recv, size_t shard, size_t n,
                                ct_err *err);
/* As ct_comm_allgather_f32, but only root receives (recv may be NULL
 * elsewhere): root's recv[0..n) <- every rank's shard in rank order. */
ct_status ct_comm_gather_f32(ct_comm *c, const float *send, float *recv, size_t shard, size_t n,
                             int root, ct_err *err);
/* ---- non-blocking collectives over a range (ZeRO-2/3) ----
 * [a, b) is a range of a flat buffer split into shards of `shard` floats (rank
 * r owns [r * shard, (r + 1) * shard)); b - a below 2^31. A started operation
 * is completed by ct_comm_wait, which also frees it; ct_comm_test lets MPI
 * progress it in between (call it while computing). Operations complete in
 * the order the caller waits; every rank must start them in the same order. */
typedef struct ct_comm_req ct_comm_req;
/* send[0 .. b-a) holds this rank's floats [a, b). On completion, for each i in
 * [a, b) inside this rank's shard: acc[i - rank * shard] += the sum over ranks,
 * in rank order, of their send[i - a]. send and acc belong to the operation
 * until ct_comm_wait. */
ct_status ct_comm_ireduce_scatter(ct_comm *c, const float *send, size_t a, size_t b, size_t shard,
                                  float *acc, ct_comm_req **req, ct_err *err);
/* recv[0 .. b-a) <- floats [a, b), each rank giving the part inside its shard
 * from `mine` (its shard buffer: mine[0] is float rank * shard). */
ct_status ct_comm_iallgather(ct_comm *c, const float *mine, size_t a, size_t b, size_t shard,
                             float *recv, ct_comm_req **req, ct_err *err);
/* The same for float32 or bf16 elements (bf16: sums in float32, rounded to
 * bf16 once). flags CT_COMM_ACCUMULATE adds the sum to acc; without it acc
 * receives the sum, and acc may then be this rank's slot of send itself.
 * CT_COMM_U8: raw bytes (a frozen weight storage of any dtype, sharded by
 * byte ranges), all-gather only (a reduce-scatter of bytes is refused). */
typedef enum ct_comm_dtype { CT_COMM_F32 = 0, CT_COMM_BF16 = 1, CT_COMM_U8 = 2 } ct_comm_dtype;
#define CT_COMM_ACCUMULATE 1
ct_status ct_comm_ireduce_scatter_t(ct_comm *c, ct_comm_dtype t, int flags, const void *send,
                                    size_t a, size_t b, size_t shard, void *acc, ct_comm_req **req,
                                    ct_err *err);
ct_status ct_comm_iallgather_t(ct_comm *c, ct_comm_dtype t, const void *mine, size_t a, size_t b,
                               size_t shard, void *recv, ct_comm_req **req, ct_err *err);
/* As ct_comm_iallgather_t, but piece points at this rank's elements of [a, b)
 * themselves (b - a ∩ its shard of them), wherever they are. */
ct_status ct_comm_iallgather_piece(ct_comm *c, ct_comm_dtype t, const void *piece, size_t a,
                                   size_t b, size_t shard, void *recv, ct_comm_req **req,
                                   ct_err *err);
/* Whole bf16 buffers of n elements, in place: this rank's slot buf[rank *
 * shard ..] receives its reduced shard; all-gather fills buf from every
 * rank's slot; all-reduce is both. */
ct_status ct_comm_reduce_scatter_bf16(ct_comm *c, uint16_t *buf, size_t n, size_t shard,
                                      ct_err *err);
ct_status ct_comm_allgather_bf16(ct_comm *c, uint16_t *buf, size_t n, size_t shard, ct_err *err);
ct_status ct_comm_allreduce_bf16(ct_comm *c, uint16_t *buf, size_t n, ct_err *err);
/* *done <- 1 when the operation has completed (ct_comm_wait is still due). */
ct_status ct_comm_test(ct_comm *c, ct_comm_req *r, int *done, ct_err *err);
/* Completes r (applying a reduction's sums) and frees it. NULL is fine. */
ct_status ct_comm_wait(ct_comm *c, ct_comm_req *r, ct_err *err);

/* Raw bytes (the 1-bit optimizers' packed signs and scales): all-to-all —
 * this rank's send[p * bytes ..] goes to rank p's recv[rank * bytes ..] — and
 * all-gather — recv[p * bytes ..] <- rank p's send. bytes <= 2^31 - 1. */
ct_status ct_comm_alltoall_bytes(ct_comm *c, const void *send, void *recv, size_t bytes,
                                 ct_err *err);
ct_status ct_comm_allgather_bytes(ct_comm *c, const void *send, void *recv, size_t bytes,
                                  ct_err *err);

/* bytes of buf from root to every rank. */
ct_status ct_comm_broadcast(ct_comm *c, void *buf, size_t bytes, int root, ct_err *err);
ct_status ct_comm_barrier(ct_comm *c, ct_err *err);
/* Ends every rank of the job with exit code `code` (MPI_Abort) when there is
 * more than one rank; returns (doing nothing) otherwise. For the CLI's error
 * path: a rank that fails alone must not leave the others waiting. */
void ct_comm_abort(ct_comm *c, int code);

#endif

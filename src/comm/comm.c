/* comm.c: the communicator over Open MPI, and the single-process one.
 *
 * Reductions never use MPI_SUM: the ranks' pieces are exchanged (all-to-all or
 * all-gather) and summed here in rank order, so results are bitwise
 * reproducible for a world size whatever algorithm MPI picks. Large transfers
 * go in chunks of at most CHUNK floats (MPI counts are int), packed into
 * scratch buffers the communicator keeps and grows. Every collective is
 * started non-blocking (MPI_Ialltoall, MPI_Iallgather, ...) and completed by
 * the watchdog (watchdog.c), so none waits forever.
 * Not here: who owns which shard of the model (src/train), launching.
 */
#include "ctuner/comm.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_int.h"
#include "ctuner/alloc.h"
#include "ctuner/log.h"
#include "ctuner/safetensors.h" /* bf16 conversions */

#define CHUNK ((size_t)1 << 22) /* floats per exchange (16 MiB) */
#define POOL CT_COMM_POOL

static ct_status mpi_fail(ct_err *err, int rc, const char *what) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return ct_errf(err, CT_ERR_COMM,
                 "%s failed: %s (a rank may have died; see the other ranks' output)", what, msg);
}

/* A started non-blocking collective (rc: MPI's answer to starting it), run to
 * completion under the watchdog as this rank's newest collective. */
static ct_status run(ct_comm *c, int rc, MPI_Request *q, const char *what, const char *mpi_name,
                     ct_err *err) {
  if (rc != MPI_SUCCESS) return mpi_fail(err, rc, mpi_name);
  return ct_wd_wait(c, c->wd.seq, 1, q, what, err);
}

static int launched_by_mpi(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", NULL};
  for (const char *const *v = vars; *v; v++)
    if (getenv(*v)) return 1;
  return 0;
}

ct_status ct_comm_init(int force_single, ct_comm **out, ct_err *err) {
  *out = NULL;
  ct_comm *c = calloc(1, sizeof *c);
  if (!c) return ct_errf(err, CT_ERR_NOMEM, "out of memory for the communicator");
  c->size = c->local_size = 1;
  if (force_single || !launched_by_mpi()) {
    *out = c;
    return CT_OK;
  }
  int provided = 0;
  int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) {
    free(c);
    return ct_errf(err, CT_ERR_COMM,
                   "MPI_Init_thread failed (code %d): is this an Open MPI launch?", rc);
  }
  c->mpi = 1;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  rc = MPI_Comm_dup(MPI_COMM_WORLD, &c->world);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(c->world, &c->rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(c->world, &c->size);
  MPI_Comm node;
  if (rc == MPI_SUCCESS)
    rc = MPI_Comm_split_type(c->world, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
  if (rc == MPI_SUCCESS) {
    MPI_Comm_rank(node, &c->local_rank);
    MPI_Comm_size(node, &c->local_size);
    MPI_Comm_free(&node);
  }
  if (rc != MPI_SUCCESS) {
    ct_status st = mpi_fail(err, rc, "setting up MPI_COMM_WORLD");
    ct_comm_free(c);
    return st;
  }
  ct_status st = ct_wd_init(c, err);
  if (st) {
    ct_comm_free(c);
    return st;
  }
  *out = c;
  return CT_OK;
}

void ct_comm_free(ct_comm *c) {
  if (!c) return;
  if (c->wd.broken) { /* abandoned operations may still write into the buffers, and
                         MPI_Finalize would wait for the rank that never came */
    free(c);
    return;
  }
  ct_wd_free(c);
  ct_free(c->pack);
  ct_free(c->unpack);
  ct_free(c->shard);
  for (int i = 0; i < POOL; i++) ct_free(c->pool[i]);
  if (c->mpi) {
    if (c->world != MPI_COMM_NULL && c->world) MPI_Comm_free(&c->world);
    MPI_Finalize();
  }
  free(c);
}

int ct_comm_rank(const ct_comm *c) {
  return c ? c->rank : 0;
}
int ct_comm_size(const ct_comm *c) {
  return c ? c->size : 1;
}
int ct_comm_local_rank(const ct_comm *c) {
  return c ? c->local_rank : 0;
}
int ct_comm_local_size(const ct_comm *c) {
  return c ? c->local_size : 1;
}
const char *ct_comm_backend(const ct_comm *c) {
  return c && c->mpi ? "mpi" : "single";
}

void ct_comm_set_timeout(ct_comm *c, double seconds) {
  if (c) c->wd.timeout = seconds;
}

void ct_comm_set_step(ct_comm *c, long step) {
  if (c) c->wd.step = step;
}

size_t ct_comm_shard_len(size_t n, int size) {
  if (size < 1) size = 1;
  size_t s = (n + (size_t)size - 1) / (size_t)size;
  return (s + 15) / 16 * 16;
}

static ct_status ensure_scratch(ct_comm *c, size_t per_rank, ct_err *err) {
  size_t need = (size_t)c->size * per_rank;
  if (need <= c->cap) return CT_OK;
  ct_free(c->pack);
  ct_free(c->unpack);
  c->pack = ct_alloc(CT_MEM_BUFFERS, need * sizeof(float));
  c->unpack = ct_alloc(CT_MEM_BUFFERS, need * sizeof(float));
  c->cap = c->pack && c->unpack ? need : 0;
  if (!c->cap)
    return ct_errf(err, CT_ERR_NOMEM, "out of memory for %zu MB of communication buffers",
                   2 * need * sizeof(float) >> 20);
  return CT_OK;
}

size_t ct_comm_shard_valid(size_t n, size_t shard, int rank) {
  size_t a = (size_t)rank * shard;
  if (a >= n) return 0;
  return n - a < shard ? n - a : shard;
}

/* Copies send[g0 .. g0+len) into dst, zero past n. */
static void copy_valid(float *dst, const float *send, size_t g0, size_t len, size_t n) {
  size_t have = g0 >= n ? 0 : (n - g0 < len ? n - g0 : len);
  if (have) memcpy(dst, send + g0, have * sizeof(float));
  if (have < len) memset(dst + have, 0, (len - have) * sizeof(float));
}

ct_status ct_comm_reduce_scatter_f32(ct_comm *c, const float *send, size_t n, float *recv,
                                     size_t shard, ct_err *err) {
  const int N = c->size;
  const size_t m = ct_comm_shard_valid(n, shard, c->rank);
  if (!c->mpi || N == 1) {
    if (recv != send) memmove(recv, send, m * sizeof(float));
    return CT_OK;
  }
  const size_t len0 = shard < CHUNK ? shard : CHUNK;
  ct_status st = ct_wd_arrive(c, err);
  if (!st) st = ensure_scratch(c, len0, err);
  if (st) return st;
  for (size_t off = 0; off < shard; off += len0) {
    const size_t len = shard - off < len0 ? shard - off : len0;
    for (int p = 0; p < N; p++)
      copy_valid(c->pack + (size_t)p * len, send, (size_t)p * shard + off, len, n);
    MPI_Request q;
    int rc =
        MPI_Ialltoall(c->pack, (int)len, MPI_FLOAT, c->unpack, (int)len, MPI_FLOAT, c->world, &q);
    st = run(c, rc, &q, "reduce-scatter of floats", "reduce-scatter (MPI_Ialltoall)", err);
    if (st) return st;
    /* Chunks go in increasing offset: writing recv[off, off+len) in place
     * never touches what a later chunk still has to send. */
    float *r = recv + off;
    const float *u = c->unpack;
    const size_t keep = off >= m ? 0 : (m - off < len ? m - off : len);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < keep; i++) {
      float acc = u[i];
      for (int p = 1; p < N; p++) acc += u[(size_t)p * len + i];
      r[i] = acc;
    }
  }
  return CT_OK;
}

/* The packed path of all-gather (root < 0) and gather (to root): chunk by
 * chunk, this rank's valid floats are packed (zeros past them), exchanged, and
 * unpacked into recv cut at n, on every rank or on root only. */
static ct_status gather_packed(ct_comm *c, const float *send, float *recv, size_t shard, size_t n,
                               int root, ct_err *err) {
  const int N = c->size;
  const size_t m = ct_comm_shard_valid(n, shard, c->rank);
  const size_t len0 = shard < CHUNK ? shard : CHUNK;
  ct_status st = ct_wd_arrive(c, err);
  if (!st) st = ensure_scratch(c, len0, err);
  if (st) return st;
  for (size_t off = 0; off < shard; off += len0) {
    const size_t len = shard - off < len0 ? shard - off : len0;
    copy_valid(c->pack, send, off, len, m);
    MPI_Request q;
    int rc = root < 0 ? MPI_Iallgather(c->pack, (int)len, MPI_FLOAT, c->unpack, (int)len, MPI_FLOAT,
                                       c->world, &q)
                      : MPI_Igather(c->pack, (int)len, MPI_FLOAT, c->unpack, (int)len, MPI_FLOAT,
                                    root, c->world, &q);
    st = root < 0 ? run(c, rc, &q, "all-gather of floats", "all-gather (MPI_Iallgather)", err)
                  : run(c, rc, &q, "gather of floats", "gather (MPI_Igather)", err);
    if (st) return st;
    if ((root >= 0 && c->rank != root) || !recv)
      continue; /* a root without a buffer (it failed) only sends */
    for (int p = 0; p < N; p++) {
      size_t g0 = (size_t)p * shard + off;
      if (g0 >= n) break;
      size_t cnt = n - g0 < len ? n - g0 : len;
      memcpy(recv + g0, c->unpack + (size_t)p * len, cnt * sizeof(float));
    }
  }
  return CT_OK;
}

ct_status ct_comm_allgather_f32(ct_comm *c, const float *send, float *recv, size_t shard, size_t n,
                                ct_err *err) {
  const int N = c->size;
  if (!c->mpi || N == 1) {
    if (recv != send) memmove(recv, send, ct_comm_shard_valid(n, shard, c->rank) * sizeof(float));
    return CT_OK;
  }
  if (shard <= CHUNK && n == (size_t)N * shard) {
    ct_status st = ct_wd_arrive(c, err);
    if (st) return st;
    MPI_Request q;
    int rc;
    if (send == recv + (size_t)c->rank * shard)
      rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_FLOAT, recv, (int)shard, MPI_FLOAT, c->world, &q);
    else
      rc = MPI_Iallgather(send, (int)shard, MPI_FLOAT, recv, (int)shard, MPI_FLOAT, c->world, &q);
    return run(c, rc, &q, "all-gather of floats", "all-gather (MPI_Iallgather)", err);
  }
  return gather_packed(c, send, recv, shard, n, -1, err);
}

ct_status ct_comm_gather_f32(ct_comm *c, const float *send, float *recv, size_t shard, size_t n,
                             int root, ct_err *err) {
  if (!c->mpi || c->size == 1) {
    if (recv != send) memmove(recv, send, ct_comm_shard_valid(n, shard, c->rank) * sizeof(float));
    return CT_OK;
  }
  return gather_packed(c, send, recv, shard, n, root, err);
}

ct_status ct_comm_allreduce_f32(ct_comm *c, float *buf, size_t n, ct_err *err) {
  if (!c->mpi || c->size == 1 || n == 0) return CT_OK;
  const size_t shard = ct_comm_shard_len(n, c->size);
  if (shard > c->shard_cap) { /* kept: a training step all-reduces the same size every time */
    ct_free(c->shard);
    c->shard = ct_alloc(CT_MEM_BUFFERS, shard * sizeof(float));
    c->shard_cap = c->shard ? shard : 0;
    if (!c->shard)
      return ct_errf(err, CT_ERR_NOMEM, "out of memory for an all-reduce of %zu floats", n);
  }
  ct_status st = ct_comm_reduce_scatter_f32(c, buf, n, c->shard, shard, err);
  if (!st) st = ct_comm_allgather_f32(c, c->shard, buf, shard, n, err);
  return st;
}

ct_status ct_comm_allreduce_f64(ct_comm *c, double *buf, size_t n, ct_err *err) {
  if (!c->mpi || c->size == 1 || n == 0) return CT_OK;
  if (n > (size_t)INT_MAX / (size_t)c->size)
    return ct_errf(err, CT_ERR_INVALID, "allreduce_f64 is for a few values, not %zu", n);
  ct_status st = ct_wd_arrive(c, err);
  if (st) return st;
  double *all = malloc((size_t)c->size * n * sizeof *all);
  if (!all) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  MPI_Request q;
  int rc = MPI_Iallgather(buf, (int)n, MPI_DOUBLE, all, (int)n, MPI_DOUBLE, c->world, &q);
  st = run(c, rc, &q, "all-reduce of doubles", "all-reduce of doubles (MPI_Iallgather)", err);
  if (st) {
    if (st != CT_ERR_TIMEOUT) free(all); /* else MPI may still write into it */
    return st;
  }
  for (size_t i = 0; i < n; i++) {
    double acc = all[i];
    for (int p = 1; p < c->size; p++) acc += all[(size_t)p * n + i];
    buf[i] = acc;
  }
  free(all);
  return CT_OK;
}

/* ---- non-blocking range collectives ---- */

/* Point-to-point messages (Isend/Irecv to each rank) rather than Open MPI's
 * non-blocking collectives: a message between two ranks of a node moves with
 * one CMA copy as soon as the receiver progresses, whichever schedule libnbc
 * would pick, and each piece completes on its own. Every rank starts
 * range operations in the same order, and MPI keeps messages between two
 * ranks with one tag in order, so one tag per kind suffices. */
#define TAG_REDUCE 7101
#define TAG_GATHER 7102

struct ct_comm_req {
  int kind; /* 0 reduce-scatter, 1 all-gather */
  ct_comm_dtype t;
  int flags;
  MPI_Request *mr; /* 2 * size requests (MPI_REQUEST_NULL where none) */
  int nmr, active; /* requests outstanding */
  void *recv;      /* reduce: size * m elements, rank p's piece at p * m (pooled) */
  size_t recv_cap; /* bytes */
  void *acc;
  size_t m;     /* elements of [a, b) in this rank's shard */
  uint64_t seq; /* its number for the watchdog */
};

static size_t esize(ct_comm_dtype t) {
  return t == CT_COMM_U8 ? 1 : t == CT_COMM_BF16 ? 2 : 4;
}
static MPI_Datatype mpi_type(ct_comm_dtype t) {
  return t == CT_COMM_U8 ? MPI_BYTE : t == CT_COMM_BF16 ? MPI_UINT16_T : MPI_FLOAT;
}

static float ld(ct_comm_dtype t, const void *p, size_t i) {
  if (t == CT_COMM_BF16) return ct_bf16_to_f32(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

static void st_(ct_comm_dtype t, void *p, size_t i, float v) {
  if (t == CT_COMM_BF16)
    ((uint16_t *)p)[i] = ct_f32_to_bf16(v);
  else
    ((float *)p)[i] = v;
}

/* [a, b) ∩ shard p as (offset from a, count). */
static void piece(size_t a, size_t b, size_t shard, int p, size_t *off, size_t *cnt) {
  size_t lo = (size_t)p * shard, hi = lo + shard;
  if (lo < a) lo = a;
  if (hi > b) hi = b;
  *off = lo < hi ? lo - a : 0;
  *cnt = lo < hi ? hi - lo : 0;
}

static ct_status req_new(ct_comm *c, int kind, size_t a, size_t b, ct_comm_req **out, ct_err *err) {
  *out = NULL;
  if (b < a || b - a > (size_t)INT_MAX)
    return ct_errf(err, CT_ERR_INVALID, "a range collective of %zu elements (at most %d)", b - a,
                   INT_MAX);
  ct_comm_req *r = calloc(1, sizeof *r);
  if (r) r->mr = malloc(2 * (size_t)c->size * sizeof *r->mr);
  if (!r || !r->mr) {
    if (r) free(r);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory for a collective");
  }
  for (int i = 0; i < 2 * c->size; i++) r->mr[i] = MPI_REQUEST_NULL;
  r->kind = kind;
  *out = r;
  return CT_OK;
}

/* A buffer of at least n bytes from the pool (the smallest that fits, else
 * the largest grown), or a new one when all are in use. */
static void *pool_take(ct_comm *c, size_t n, size_t *cap) {
  int best = -1;
  for (int i = 0; i < POOL; i++)
    if (c->pool[i] && c->pool_cap[i] >= n && (best < 0 || c->pool_cap[i] < c->pool_cap[best]))
      best = i;
  if (best < 0)
    for (int i = 0; i < POOL; i++)
      if (c->pool[i] && (best < 0 || c->pool_cap[i] > c->pool_cap[best])) best = i;
  void *p = NULL;
  if (best >= 0) {
    p = c->pool[best];
    *cap = c->pool_cap[best];
    c->pool[best] = NULL;
    if (*cap >= n) return p;
    ct_free(p);
  }
  *cap = n;
  return ct_alloc(CT_MEM_BUFFERS, n);
}

static void pool_give(ct_comm *c, void *p, size_t cap) {
  if (!p) return;
  for (int i = 0; i < POOL; i++)
    if (!c->pool[i]) {
      c->pool[i] = p;
      c->pool_cap[i] = cap;
      return;
    }
  ct_free(p);
}

static void req_free(ct_comm *c, ct_comm_req *r) {
  if (!r) return;
  pool_give(c, r->recv, r->recv_cap);
  free(r->mr);
  free(r);
}

/* acc[i] <- (acc[i] +) the rank-order float sum of the pieces, i < m. */
static void reduce_into(ct_comm_dtype t, int flags, const void *u, int N, size_t m, void *acc) {
  const int add = flags & CT_COMM_ACCUMULATE;
  if (t == CT_COMM_F32) {
    const float *f = u;
    float *o = acc;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < m; i++) {
      float s = f[i];
      for (int p = 1; p < N; p++) s += f[(size_t)p * m + i];
      o[i] = add ? o[i] + s : s;
    }
    return;
  }
#pragma omp parallel for schedule(static) if (m > 65536)
  for (size_t i = 0; i < m; i++) {
    float s = ld(t, u, i);
    for (int p = 1; p < N; p++) s += ld(t, u, (size_t)p * m + i);
    st_(t, acc, i, add ? ld(t, acc, i) + s : s);
  }
}

/* A new request of kind over [a, b), and this rank's piece of it. */
static ct_status range_begin(ct_comm *c, int kind, ct_comm_dtype t, size_t a, size_t b,
                             size_t shard, ct_comm_req **r, size_t *off, size_t *m, ct_err *err) {
  ct_status st = c->mpi && c->size > 1 ? ct_wd_arrive(c, err) : CT_OK;
  if (!st) st = req_new(c, kind, a, b, r, err);
  if (st) return st;
  (*r)->t = t;
  (*r)->seq = c->wd.seq;
  piece(a, b, shard, c->rank, off, m);
  return CT_OK;
}

ct_status ct_comm_ireduce_scatter_t(ct_comm *c, ct_comm_dtype t, int flags, const void *send,
                                    size_t a, size_t b, size_t shard, void *acc, ct_comm_req **req,
                                    ct_err *err) {
  ct_comm_req *r;
  size_t off, m;
  if (t == CT_COMM_U8)
    return ct_errf(err, CT_ERR_INVALID, "reduce-scatter of raw bytes: only all-gather moves them");
  ct_status st = range_begin(c, 0, t, a, b, shard, &r, &off, &m, err);
  if (st) return st;
  const int N = c->size;
  const size_t es = esize(t);
  r->flags = flags;
  r->m = m;
  void *dst = (char *)acc + (m ? a + off - (size_t)c->rank * shard : 0) * es;
  const char *mine = (const char *)send + off * es;
  if (!c->mpi || N == 1) { /* the sum over one rank: done at once */
    reduce_into(t, flags, mine, 1, m, dst);
    *req = r;
    return CT_OK;
  }
  r->acc = dst;
  if (m) {
    r->recv = pool_take(c, (size_t)N * m * es, &r->recv_cap);
    if (!r->recv) {
      req_free(c, r);
      return ct_errf(err, CT_ERR_NOMEM, "out of memory for a reduce-scatter of %zu elements",
                     (size_t)N * m);
    }
  }
  /* receive every rank's piece of my part; send each rank its part of mine */
  int rcode = MPI_SUCCESS;
  for (int p = 0; p < N && rcode == MPI_SUCCESS && m; p++) {
    char *slot = (char *)r->recv + (size_t)p * m * es;
    if (p == c->rank)
      memcpy(slot, mine, m * es);
    else
      rcode = MPI_Irecv(slot, (int)m, mpi_type(t), p, TAG_REDUCE, c->world, &r->mr[r->nmr++]);
  }
  for (int p = 0; p < N && rcode == MPI_SUCCESS; p++) {
    size_t po, pc;
    piece(a, b, shard, p, &po, &pc);
    if (p != c->rank && pc)
      rcode = MPI_Isend((const char *)send + po * es, (int)pc, mpi_type(t), p, TAG_REDUCE, c->world,
                        &r->mr[r->nmr++]);
  }
  if (rcode != MPI_SUCCESS) { /* requests already posted may still use the buffers: leak them; the
                                 job aborts */
    *req = NULL;
    return mpi_fail(err, rcode, "reduce-scatter (MPI_Isend/MPI_Irecv)");
  }
  r->active = r->nmr > 0;
  *req = r;
  return CT_OK;
}

ct_status ct_comm_iallgather_t(ct_comm *c, ct_comm_dtype t, const void *mine, size_t a, size_t b,
                               size_t shard, void *recv, ct_comm_req **req, ct_err *err) {
  size_t off, m;
  piece(a, b, shard, c->rank, &off, &m);
  const char *src = (const char *)mine + (m ? a + off - (size_t)c->rank * shard : 0) * esize(t);
  return ct_comm_iallgather_piece(c, t, src, a, b, shard, recv, req, err);
}

ct_status ct_comm_iallgather_piece(ct_comm *c, ct_comm_dtype t, const void *piece_src, size_t a,
                                   size_t b, size_t shard, void *recv, ct_comm_req **req,
                                   ct_err *err) {
  ct_comm_req *r;
  size_t off, m;
  ct_status st = range_begin(c, 1, t, a, b, shard, &r, &off, &m, err);
  if (st) return st;
  const int N = c->size;
  const size_t es = esize(t);
  const char *src = piece_src;
  if (m) memmove((char *)recv + off * es, src, m * es); /* may be in place */
  if (!c->mpi || N == 1) {
    *req = r;
    return CT_OK;
  }
  /* every rank's piece from it; mine to every other rank */
  int rcode = MPI_SUCCESS;
  for (int p = 0; p < N && rcode == MPI_SUCCESS; p++) {
    size_t po, pc;
    piece(a, b, shard, p, &po, &pc);
    if (pc && p != c->rank)
      rcode = MPI_Irecv((char *)recv + po * es, (int)pc, mpi_type(t), p, TAG_GATHER, c->world,
                        &r->mr[r->nmr++]);
  }
  for (int p = 0; p < N && rcode == MPI_SUCCESS && m; p++)
    if (p != c->rank)
      rcode = MPI_Isend(src, (int)m, mpi_type(t), p, TAG_GATHER, c->world, &r->mr[r->nmr++]);
  if (rcode != MPI_SUCCESS) { /* as above: leaked, never reused while MPI may write into it */
    *req = NULL;
    return mpi_fail(err, rcode, "all-gather (MPI_Isend/MPI_Irecv)");
  }
  r->active = r->nmr > 0;
  *req = r;
  return CT_OK;
}

ct_status ct_comm_ireduce_scatter(ct_comm *c, const float *send, size_t a, size_t b, size_t shard,
                                  float *acc, ct_comm_req **req, ct_err *err) {
  return ct_comm_ireduce_scatter_t(c, CT_COMM_F32, CT_COMM_ACCUMULATE, send, a, b, shard, acc, req,
                                   err);
}

ct_status ct_comm_iallgather(ct_comm *c, const float *mine, size_t a, size_t b, size_t shard,
                             float *recv, ct_comm_req **req, ct_err *err) {
  return ct_comm_iallgather_t(c, CT_COMM_F32, mine, a, b, shard, recv, req, err);
}

ct_status ct_comm_test(ct_comm *c, ct_comm_req *r, int *done, ct_err *err) {
  (void)c;
  *done = 1;
  if (!r || !r->active) return CT_OK;
  int flag = 0, rc = MPI_Testall(r->nmr, r->mr, &flag, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS)
    return mpi_fail(err, rc, r->kind ? "all-gather (MPI_Testall)" : "reduce-scatter (MPI_Testall)");
  if (flag) r->active = 0;
  *done = flag;
  return CT_OK;
}

ct_status ct_comm_wait(ct_comm *c, ct_comm_req *r, ct_err *err) {
  if (!r) return CT_OK;
  ct_status st = CT_OK;
  if (r->active) {
    st = ct_wd_wait(c, r->seq, r->nmr, r->mr,
                    r->kind ? "all-gather of a range" : "reduce-scatter of a range", err);
    r->active = 0;
    if (st) r->recv = NULL; /* receives may still land in it: never back to the pool */
  }
  if (!st && r->kind == 0 && r->acc && r->m)
    reduce_into(r->t, r->flags, r->recv, c->size, r->m, r->acc);
  req_free(c, r);
  return st;
}

/* Whole-buffer bf16 operations: windows of at most 2^30 elements through the
 * range operations, each completed before the next. */
#define WINDOW ((size_t)1 << 30)

ct_status ct_comm_reduce_scatter_bf16(ct_comm *c, uint16_t *buf, size_t n, size_t shard,
                                      ct_err *err) {
  ct_status st = CT_OK;
  uint16_t *slot = buf + (size_t)c->rank * shard;
  for (size_t a = 0; a < n && !st; a += WINDOW) {
    const size_t b = n - a < WINDOW ? n : a + WINDOW;
    ct_comm_req *r = NULL;
    st = ct_comm_ireduce_scatter_t(c, CT_COMM_BF16, 0, buf + a, a, b, shard, slot, &r, err);
    ct_status s2 = ct_comm_wait(c, r, err);
    if (!st) st = s2;
  }
  return st;
}

ct_status ct_comm_allgather_bf16(ct_comm *c, uint16_t *buf, size_t n, size_t shard, ct_err *err) {
  ct_status st = CT_OK;
  const uint16_t *mine = buf + (size_t)c->rank * shard;
  for (size_t a = 0; a < n && !st; a += WINDOW) {
    const size_t b = n - a < WINDOW ? n : a + WINDOW;
    ct_comm_req *r = NULL;
    st = ct_comm_iallgather_t(c, CT_COMM_BF16, mine, a, b, shard, buf + a, &r, err);
    ct_status s2 = ct_comm_wait(c, r, err);
    if (!st) st = s2;
  }
  return st;
}

ct_status ct_comm_allreduce_bf16(ct_comm *c, uint16_t *buf, size_t n, ct_err *err) {
  if (!c->mpi || c->size == 1 || n == 0) return CT_OK;
  const size_t shard = ct_comm_shard_len(n, c->size);
  ct_status st = ct_comm_reduce_scatter_bf16(c, buf, n, shard, err);
  if (!st) st = ct_comm_allgather_bf16(c, buf, n, shard, err);
  return st;
}

ct_status ct_comm_alltoall_bytes(ct_comm *c, const void *send, void *recv, size_t bytes,
                                 ct_err *err) {
  if (bytes > (size_t)INT_MAX)
    return ct_errf(err, CT_ERR_INVALID, "all-to-all of %zu bytes per rank", bytes);
  if (!c->mpi || c->size == 1) {
    memmove(recv, send, bytes);
    return CT_OK;
  }
  ct_status st = ct_wd_arrive(c, err);
  if (st) return st;
  MPI_Request q;
  int rc = MPI_Ialltoall(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, c->world, &q);
  return run(c, rc, &q, "all-to-all of bytes", "all-to-all (MPI_Ialltoall)", err);
}

ct_status ct_comm_allgather_bytes(ct_comm *c, const void *send, void *recv, size_t bytes,
                                  ct_err *err) {
  if (bytes > (size_t)INT_MAX)
    return ct_errf(err, CT_ERR_INVALID, "all-gather of %zu bytes per rank", bytes);
  if (!c->mpi || c->size == 1) {
    memmove(recv, send, bytes);
    return CT_OK;
  }
  ct_status st = ct_wd_arrive(c, err);
  if (st) return st;
  MPI_Request q;
  int rc = MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, c->world, &q);
  return run(c, rc, &q, "all-gather of bytes", "all-gather (MPI_Iallgather)", err);
}

ct_status ct_comm_broadcast(ct_comm *c, void *buf, size_t bytes, int root, ct_err *err) {
  if (!c->mpi || c->size == 1) return CT_OK;
  ct_status st = ct_wd_arrive(c, err);
  for (size_t off = 0; off < bytes && !st; off += (size_t)INT_MAX) {
    size_t len = bytes - off < (size_t)INT_MAX ? bytes - off : (size_t)INT_MAX;
    MPI_Request q;
    int rc = MPI_Ibcast((char *)buf + off, (int)len, MPI_BYTE, root, c->world, &q);
    st = run(c, rc, &q, "broadcast", "broadcast (MPI_Ibcast)", err);
  }
  return st;
}

ct_status ct_comm_barrier(ct_comm *c, ct_err *err) {
  if (!c->mpi || c->size == 1) return CT_OK;
  ct_status st = ct_wd_arrive(c, err);
  if (st) return st;
  MPI_Request q;
  int rc = MPI_Ibarrier(c->world, &q);
  return run(c, rc, &q, "barrier", "barrier (MPI_Ibarrier)", err);
}

void ct_comm_abort(ct_comm *c, int code) {
  if (c && c->mpi && c->size > 1) MPI_Abort(c->world, code);
}

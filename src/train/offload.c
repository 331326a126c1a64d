/* offload.c: optimizer state in a swap file, moved through three buffers by a
 * reader and a writer thread (docs/distributed.md, "Offload").
 *
 * The file holds nsub blocks; block k holds sub-group k of every state (state
 * i at float i * sub of the block), so one pread or pwrite moves a sub-group.
 * Blocks are multiples of 4096 bytes and the buffers 4096-aligned, so the file
 * is opened with O_DIRECT — the page cache is bypassed and the state really
 * lives on the device — where the file system allows it, and buffered
 * otherwise (tmpfs, some overlay set-ups; logged once).
 *
 * Reads and writes go to two threads, so the device reads one sub-group while
 * it writes another. A pass steps sub-group k in one buffer while k + 1 is
 * read into the next and k - 1 is written from the third; every read waits
 * for the writes it depends on (the last write from its buffer, and the last
 * write of its sub-group). At the end of a pass the read of sub-group 0 for
 * the next pass is queued, and the pass does not wait for its writes: both
 * happen while the next forward and backward compute.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_DIRECT */
#endif
#include "train/offload.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ctuner/alloc.h"
#include "ctuner/log.h"
#include "train_int.h"

#define ALIGN 4096
#define QCAP 16
#define NBUF 3

typedef struct req {
  size_t k;
  int slot;
  long seq, dep; /* reads: the write sequence number that must be complete first */
  void *dst;     /* a part of a block instead of a whole one: len bytes at off into dst */
  off_t off;
  size_t len;
} req;

typedef struct io_arg {
  struct ct_offload *o;
  int write; /* the thread's role: 0 reader, 1 writer */
} io_arg;

typedef struct queue {
  req q[QCAP];
  int qh, qn;
  long submitted, completed;
} queue;

struct ct_offload {
  char path[4200];
  int fd, direct, pinned;
  size_t n, nstate, sub, nsub, block; /* block bytes */
  void *raw[NBUF];
  float *buf[NBUF];
  pthread_t th[2]; /* 0 reader, 1 writer */
  io_arg args[2];
  int started[2], stop;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  queue q[2];            /* 0 reads, 1 writes */
  long slot_write[NBUF]; /* last write sequence number from each buffer */
  long *sub_write;       /* last write sequence number of each sub-group (nsub) */
  void *part_raw;        /* ct_offload_read_range's aligned staging buffer (sub floats) */
  float *part;
  int pre_slot; /* buffer holding (or reading) sub-group 0 for the next pass, -1 none */
  long pre_seq;
  int io_failed;
  char io_msg[4400];
  double wait_s, bytes;
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int xfer(int fd, int write, void *buf, size_t len, off_t off) {
  char *p = buf;
  while (len) {
    ssize_t r = write ? pwrite(fd, p, len, off) : pread(fd, p, len, off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) { /* reading past what was written: zeros */
      memset(p, 0, len);
      return 0;
    }
    p += r, off += r, len -= (size_t)r;
  }
  return 0;
}

static void *io_main(void *arg) {
  const io_arg *a = arg;
  ct_offload *o = a->o;
  queue *q = &o->q[a->write];
  for (;;) {
    pthread_mutex_lock(&o->mu);
    while (!q->qn && !o->stop) pthread_cond_wait(&o->cv, &o->mu);
    if (!q->qn && o->stop) {
      pthread_mutex_unlock(&o->mu);
      return NULL;
    }
    req r = q->q[q->qh];
    while (!a->write && o->q[1].completed < r.dep)
      pthread_cond_wait(&o->cv, &o->mu); /* its writes first */
    q->qh = (q->qh + 1) % QCAP;
    q->qn--;
    const int failed = o->io_failed;
    pthread_mutex_unlock(&o->mu);
    int rc = 0, e = 0;
    if (!failed) {
      if (r.dst)
        rc = xfer(o->fd, 0, r.dst, r.len, r.off);
      else
        rc = xfer(o->fd, a->write, o->buf[r.slot], o->block, (off_t)(r.k * o->block));
      e = errno;
    }
    pthread_mutex_lock(&o->mu);
    if (rc && !o->io_failed) {
      o->io_failed = 1;
      snprintf(o->io_msg, sizeof o->io_msg, "%s: %s of sub-group %zu failed: %s", o->path,
               a->write ? "write" : "read", r.k, strerror(e));
    }
    o->bytes += (double)(r.dst ? r.len : o->block);
    q->completed = r.seq;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
  }
}

static long submit_req(ct_offload *o, int write, size_t k, int slot, long dep, void *dst, off_t off,
                       size_t len) {
  queue *q = &o->q[write];
  pthread_mutex_lock(&o->mu);
  while (q->qn == QCAP) pthread_cond_wait(&o->cv, &o->mu);
  req *r = &q->q[(q->qh + q->qn) % QCAP];
  r->k = k;
  r->slot = slot;
  r->dep = dep;
  r->dst = dst;
  r->off = off;
  r->len = len;
  r->seq = ++q->submitted;
  q->qn++;
  long s = r->seq;
  pthread_cond_broadcast(&o->cv);
  pthread_mutex_unlock(&o->mu);
  if (write) {
    o->slot_write[slot] = s;
    o->sub_write[k] = s;
  }
  return s;
}

static long submit(ct_offload *o, int write, size_t k, int slot, long dep) {
  return submit_req(o, write, k, slot, dep, NULL, 0, 0);
}

/* Read sub-group k into buffer slot once its writes are done. */
static long read_into(ct_offload *o, size_t k, int slot) {
  long dep = o->slot_write[slot] > o->sub_write[k] ? o->slot_write[slot] : o->sub_write[k];
  return submit(o, 0, k, slot, dep);
}

static ct_status wait_for(ct_offload *o, int write, long seq, ct_err *err) {
  const double t0 = now();
  pthread_mutex_lock(&o->mu);
  while (o->q[write].completed < seq) pthread_cond_wait(&o->cv, &o->mu);
  int failed = o->io_failed;
  pthread_mutex_unlock(&o->mu);
  o->wait_s += now() - t0;
  return failed ? ct_errf(err, CT_ERR_IO, "offload: %s", o->io_msg) : CT_OK;
}

/* Everything queued is done; the prefetch is dropped (whole-file access follows). */
static ct_status drain(ct_offload *o, ct_err *err) {
  ct_status st = wait_for(o, 0, o->q[0].submitted, err);
  ct_status s2 = wait_for(o, 1, o->q[1].submitted, err);
  o->pre_slot = -1;
  return st ? st : s2;
}

static size_t sub_len(const ct_offload *o, size_t k) {
  size_t a = k * o->sub;
  return o->n - a < o->sub ? o->n - a : o->sub;
}

ct_status ct_offload_open(const char *dir, size_t n, size_t nstate, size_t sub, int pin,
                          ct_offload **out, ct_err *err) {
  *out = NULL;
  ct_status st = ct_mkdir_p(dir, err);
  if (st) return st;
  ct_offload *o = calloc(1, sizeof *o);
  if (!o) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  o->fd = -1;
  o->pre_slot = -1;
  pthread_mutex_init(&o->mu, NULL);
  pthread_cond_init(&o->cv, NULL);
  if (sub < 1024) sub = 1024;
  sub = (sub + 1023) / 1024 * 1024; /* 4096-byte multiples per state */
  o->n = n;
  o->nstate = nstate ? nstate : 1;
  o->sub = sub;
  o->nsub = (n + sub - 1) / sub;
  o->block = o->nstate * sub * sizeof(float);
  o->sub_write = calloc(o->nsub ? o->nsub : 1, sizeof *o->sub_write);
  if (!o->sub_write || ct_pathf(o->path, sizeof o->path, "%s/optimizer.swap", dir)) {
    ct_offload_close(o);
    return ct_errf(err, CT_ERR_RANGE, "offload: out of memory or path too long: %s", dir);
  }
  for (int s = 0; s < NBUF; s++) {
    o->raw[s] = ct_alloc(CT_MEM_OPTIMIZER, o->block + ALIGN);
    if (!o->raw[s]) {
      ct_offload_close(o);
      return ct_errf(err, CT_ERR_NOMEM, "out of memory for %d offload buffers of %zu bytes", NBUF,
                     o->block);
    }
    o->buf[s] = (float *)(((uintptr_t)o->raw[s] + ALIGN - 1) / ALIGN * ALIGN);
  }
  if (pin) {
    int ok = 1;
    for (int s = 0; s < NBUF; s++) ok &= mlock(o->buf[s], o->block) == 0;
    o->pinned = ok;
    if (!ok)
      CT_WARN(
          "offload: pin_memory: mlock of %d x %zu bytes failed (%s); the buffers stay pageable "
          "(raise "
          "ulimit -l to pin them)",
          NBUF, o->block, strerror(errno));
  }
  memset(o->buf[0], 0, ALIGN);
  o->fd = open(o->path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
  o->direct = o->fd >= 0;
  if (o->fd >= 0 && ftruncate(o->fd, (off_t)(o->nsub * o->block)) == 0 &&
      xfer(o->fd, 1, o->buf[0], ALIGN, 0) !=
          0) { /* opened, but the file system refuses direct writes */
    close(o->fd);
    o->fd = -1;
    o->direct = 0;
  }
  if (o->fd < 0) {
    o->fd = open(o->path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (o->fd < 0) {
      st = ct_errf(err, CT_ERR_IO,
                   "%s: cannot create the offload file: %s (check offload_param_path)", o->path,
                   strerror(errno));
      ct_offload_close(o);
      return st;
    }
    CT_INFO(
        "offload: %s does not take O_DIRECT here; buffered I/O (the page cache may hold the state)",
        dir);
  }
  if (ftruncate(o->fd, (off_t)(o->nsub * o->block)) != 0) {
    st = ct_errf(err, CT_ERR_IO, "%s: cannot size the offload file to %zu bytes: %s", o->path,
                 o->nsub * o->block, strerror(errno));
    ct_offload_close(o);
    return st;
  }
  for (int t = 0; t < 2; t++) {
    o->args[t].o = o;
    o->args[t].write = t;
    if (pthread_create(&o->th[t], NULL, io_main, &o->args[t]) != 0) {
      ct_offload_close(o);
      return ct_errf(err, CT_ERR_IO, "cannot start the offload I/O threads");
    }
    o->started[t] = 1;
  }
  *out = o;
  return CT_OK;
}

ct_status ct_offload_store_all(ct_offload *o, float *const *arrays, ct_err *err) {
  ct_status st = drain(o, err);
  for (size_t k = 0; k < o->nsub && !st; k++) {
    const size_t len = sub_len(o, k);
    memset(o->buf[0], 0, o->block);
    for (size_t i = 0; i < o->nstate; i++)
      if (arrays && arrays[i])
        memcpy(o->buf[0] + i * o->sub, arrays[i] + k * o->sub, len * sizeof(float));
    st = wait_for(o, 1, submit(o, 1, k, 0, 0), err);
  }
  return st;
}

ct_status ct_offload_load_all(ct_offload *o, float *const *arrays, ct_err *err) {
  ct_status st = drain(o, err);
  for (size_t k = 0; k < o->nsub && !st; k++) {
    st = wait_for(o, 0, read_into(o, k, 0), err);
    if (st) break;
    const size_t len = sub_len(o, k);
    for (size_t i = 0; i < o->nstate; i++)
      if (arrays[i]) memcpy(arrays[i] + k * o->sub, o->buf[0] + i * o->sub, len * sizeof(float));
  }
  o->pre_slot = -1;
  return st;
}

ct_status ct_offload_foreach(ct_offload *o, ct_offload_fn fn, void *user, ct_err *err) {
  if (!o->nsub) return CT_OK;
  int slot = o->pre_slot;
  long rseq = o->pre_seq;
  if (slot < 0) { /* nothing prefetched (the first pass, after a checkpoint) */
    slot = 0;
    rseq = read_into(o, 0, slot);
  }
  o->pre_slot = -1;
  float *states[8];
  ct_status st = CT_OK;
  for (size_t k = 0; k < o->nsub && !st; k++) {
    long next = 0;
    const int nslot = (slot + 1) % NBUF;
    if (k + 1 < o->nsub) next = read_into(o, k + 1, nslot);
    st = wait_for(o, 0, rseq, err);
    if (st) break;
    for (size_t i = 0; i < o->nstate && i < 8; i++) states[i] = o->buf[slot] + i * o->sub;
    st = fn(user, k * o->sub, sub_len(o, k), states, err);
    if (st) break;
    submit(o, 1, k, slot, 0); /* written behind */
    slot = nslot;
    rseq = next;
  }
  if (st) { /* leave nothing half-done behind */
    ct_err e2 = {0};
    drain(o, &e2);
    return st;
  }
  /* sub-group 0 of the next pass, read while the next forward and backward run */
  o->pre_slot = slot;
  o->pre_seq = read_into(o, 0, slot);
  return CT_OK;
}

ct_status ct_offload_read_range(ct_offload *o, size_t arr, size_t a, size_t b, float *dst,
                                ct_err *err) {
  if (arr >= o->nstate || a > b || b > o->n)
    return ct_errf(err, CT_ERR_RANGE,
                   "offload: range [%zu, %zu) of array %zu outside %zu x %zu floats", a, b, arr,
                   o->nstate, o->n);
  if (!o->part) {
    o->part_raw = ct_alloc(CT_MEM_BUFFERS, o->sub * sizeof(float) + ALIGN);
    if (!o->part_raw)
      return ct_errf(err, CT_ERR_NOMEM, "out of memory for the offload staging buffer");
    o->part = (float *)(((uintptr_t)o->part_raw + ALIGN - 1) / ALIGN * ALIGN);
  }
  for (size_t k = a / o->sub; a < b; k++) { /* one sub-group's part of the array at a time */
    const size_t k0 = k * o->sub, i0 = a - k0, i1 = (b - k0 < o->sub ? b - k0 : o->sub);
    const size_t f0 = i0 / 1024 * 1024, f1 = (i1 + 1023) / 1024 * 1024; /* whole pages (O_DIRECT) */
    const off_t off = (off_t)(k * o->block + (arr * o->sub + f0) * sizeof(float));
    ct_status st = wait_for(
        o, 0, submit_req(o, 0, k, 0, o->sub_write[k], o->part, off, (f1 - f0) * sizeof(float)),
        err);
    if (st) return st;
    memcpy(dst, o->part + (i0 - f0), (i1 - i0) * sizeof(float));
    dst += i1 - i0;
    a = k0 + i1;
  }
  return CT_OK;
}

double ct_offload_wait_s(const ct_offload *o) {
  return o ? o->wait_s : 0;
}
double ct_offload_bytes(const ct_offload *o) {
  return o ? o->bytes : 0;
}
const char *ct_offload_mode(const ct_offload *o) {
  return o && o->direct ? "O_DIRECT" : "buffered";
}

void ct_offload_close(ct_offload *o) {
  if (!o) return;
  pthread_mutex_lock(&o->mu);
  o->stop = 1;
  pthread_cond_broadcast(&o->cv);
  pthread_mutex_unlock(&o->mu);
  for (int t = 0; t < 2; t++)
    if (o->started[t]) pthread_join(o->th[t], NULL);
  if (o->fd >= 0) {
    close(o->fd);
    unlink(o->path);
  }
  for (int s = 0; s < NBUF; s++) {
    if (o->pinned && o->buf[s]) munlock(o->buf[s], o->block);
    ct_free(o->raw[s]);
  }
  free(o->sub_write);
  ct_free(o->part_raw);
  pthread_mutex_destroy(&o->mu);
  pthread_cond_destroy(&o->cv);
  free(o);
}

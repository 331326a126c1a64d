/* offload.c: optimizer state in a swap file, moved through two buffers by an
 * I/O thread (docs/distributed.md, "Offload").
 *
 * The file holds nsub blocks; block k holds sub-group k of every state (state
 * i at float i * sub of the block), so one pread or pwrite moves a sub-group.
 * Blocks are multiples of 4096 bytes and the buffers 4096-aligned, so the file
 * is opened with O_DIRECT — the page cache is bypassed and the state really
 * lives on the device — where the file system allows it, and buffered
 * otherwise (tmpfs, some overlay set-ups; logged once).
 *
 * One I/O thread serves requests in submission order. A pass reads sub-group
 * k + 1 into the other buffer while the caller works on k, then queues k's
 * write; FIFO order makes the write of k - 1 (same buffer as k + 1) land
 * before that buffer is read into. So a pass costs max(compute, I/O) plus one
 * read, not their sum.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_DIRECT */
#endif
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
#include "train/offload.h"
#include "train_int.h"

#define ALIGN 4096
#define QCAP 16

typedef struct req {
  int write; /* 0 read, 1 write */
  size_t k;
  int slot;
  long seq;
} req;

struct ct_offload {
  char path[4200];
  int fd, direct, pinned;
  size_t n, nstate, sub, nsub, block; /* block bytes */
  void *raw[2];
  float *buf[2];
  pthread_t th;
  int started, stop;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  req q[QCAP];
  int qh, qn;
  long submitted, completed;
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
  ct_offload *o = arg;
  for (;;) {
    pthread_mutex_lock(&o->mu);
    while (!o->qn && !o->stop) pthread_cond_wait(&o->cv, &o->mu);
    if (!o->qn && o->stop) {
      pthread_mutex_unlock(&o->mu);
      return NULL;
    }
    req r = o->q[o->qh];
    o->qh = (o->qh + 1) % QCAP;
    o->qn--;
    pthread_mutex_unlock(&o->mu);
    int rc = 0, e = 0;
    if (!o->io_failed) {
      rc = xfer(o->fd, r.write, o->buf[r.slot], o->block, (off_t)(r.k * o->block));
      e = errno;
    }
    pthread_mutex_lock(&o->mu);
    if (rc && !o->io_failed) {
      o->io_failed = 1;
      snprintf(o->io_msg, sizeof o->io_msg, "%s: %s of sub-group %zu failed: %s", o->path,
               r.write ? "write" : "read", r.k, strerror(e));
    }
    o->bytes += (double)o->block;
    o->completed = r.seq;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
  }
}

static long submit(ct_offload *o, int write, size_t k, int slot) {
  pthread_mutex_lock(&o->mu);
  while (o->qn == QCAP) pthread_cond_wait(&o->cv, &o->mu);
  req *r = &o->q[(o->qh + o->qn) % QCAP];
  r->write = write;
  r->k = k;
  r->slot = slot;
  r->seq = ++o->submitted;
  o->qn++;
  long s = r->seq;
  pthread_cond_broadcast(&o->cv);
  pthread_mutex_unlock(&o->mu);
  return s;
}

static ct_status wait_for(ct_offload *o, long seq, ct_err *err) {
  const double t0 = now();
  pthread_mutex_lock(&o->mu);
  while (o->completed < seq) pthread_cond_wait(&o->cv, &o->mu);
  int failed = o->io_failed;
  pthread_mutex_unlock(&o->mu);
  o->wait_s += now() - t0;
  return failed ? ct_errf(err, CT_ERR_IO, "offload: %s", o->io_msg) : CT_OK;
}

static size_t sub_len(const ct_offload *o, size_t k) {
  size_t a = k * o->sub;
  return o->n - a < o->sub ? o->n - a : o->sub;
}

ct_status ct_offload_open(const char *dir, size_t n, size_t nstate, size_t sub, int pin, ct_offload **out,
                          ct_err *err) {
  *out = NULL;
  ct_status st = ct_mkdir_p(dir, err);
  if (st) return st;
  ct_offload *o = calloc(1, sizeof *o);
  if (!o) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  o->fd = -1;
  pthread_mutex_init(&o->mu, NULL);
  pthread_cond_init(&o->cv, NULL);
  if (sub < 1024) sub = 1024;
  sub = (sub + 1023) / 1024 * 1024; /* 4096-byte multiples per state */
  o->n = n;
  o->nstate = nstate ? nstate : 1;
  o->sub = sub;
  o->nsub = (n + sub - 1) / sub;
  o->block = o->nstate * sub * sizeof(float);
  if (ct_pathf(o->path, sizeof o->path, "%s/optimizer.swap", dir)) {
    free(o);
    return ct_errf(err, CT_ERR_RANGE, "offload path too long: %s", dir);
  }
  for (int s = 0; s < 2; s++) {
    o->raw[s] = ct_alloc(CT_MEM_OPTIMIZER, o->block + ALIGN);
    if (!o->raw[s]) {
      ct_offload_close(o);
      return ct_errf(err, CT_ERR_NOMEM, "out of memory for two offload buffers of %zu bytes", o->block);
    }
    o->buf[s] = (float *)(((uintptr_t)o->raw[s] + ALIGN - 1) / ALIGN * ALIGN);
  }
  if (pin) {
    if (mlock(o->buf[0], o->block) == 0 && mlock(o->buf[1], o->block) == 0)
      o->pinned = 1;
    else
      CT_WARN("offload: pin_memory: mlock of 2 x %zu bytes failed (%s); the buffers stay pageable (raise "
              "ulimit -l to pin them)",
              o->block, strerror(errno));
  }
  memset(o->buf[0], 0, ALIGN);
  o->fd = open(o->path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
  o->direct = o->fd >= 0;
  if (o->fd >= 0 && ftruncate(o->fd, (off_t)(o->nsub * o->block)) == 0 &&
      xfer(o->fd, 1, o->buf[0], ALIGN, 0) != 0) { /* opened, but the file system refuses direct writes */
    close(o->fd);
    o->fd = -1;
    o->direct = 0;
  }
  if (o->fd < 0) {
    o->fd = open(o->path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (o->fd < 0) {
      st = ct_errf(err, CT_ERR_IO, "%s: cannot create the offload file: %s (check offload_param_path)", o->path,
                   strerror(errno));
      ct_offload_close(o);
      return st;
    }
    CT_INFO("offload: %s does not take O_DIRECT here; buffered I/O (the page cache may hold the state)", dir);
  }
  if (ftruncate(o->fd, (off_t)(o->nsub * o->block)) != 0) {
    st = ct_errf(err, CT_ERR_IO, "%s: cannot size the offload file to %zu bytes: %s", o->path, o->nsub * o->block,
                 strerror(errno));
    ct_offload_close(o);
    return st;
  }
  if (pthread_create(&o->th, NULL, io_main, o) != 0) {
    ct_offload_close(o);
    return ct_errf(err, CT_ERR_IO, "cannot start the offload I/O thread");
  }
  o->started = 1;
  *out = o;
  return CT_OK;
}

ct_status ct_offload_store_all(ct_offload *o, float *const *arrays, ct_err *err) {
  for (size_t k = 0; k < o->nsub; k++) {
    const size_t len = sub_len(o, k);
    memset(o->buf[0], 0, o->block);
    for (size_t i = 0; i < o->nstate; i++)
      if (arrays && arrays[i]) memcpy(o->buf[0] + i * o->sub, arrays[i] + k * o->sub, len * sizeof(float));
    ct_status st = wait_for(o, submit(o, 1, k, 0), err);
    if (st) return st;
  }
  return CT_OK;
}

ct_status ct_offload_load_all(ct_offload *o, float *const *arrays, ct_err *err) {
  for (size_t k = 0; k < o->nsub; k++) {
    ct_status st = wait_for(o, submit(o, 0, k, 0), err);
    if (st) return st;
    const size_t len = sub_len(o, k);
    for (size_t i = 0; i < o->nstate; i++) memcpy(arrays[i] + k * o->sub, o->buf[0] + i * o->sub, len * sizeof(float));
  }
  return CT_OK;
}

ct_status ct_offload_foreach(ct_offload *o, ct_offload_fn fn, void *user, ct_err *err) {
  if (!o->nsub) return CT_OK;
  ct_status st = wait_for(o, submit(o, 0, 0, 0), err);
  float *states[8];
  for (size_t k = 0; k < o->nsub && !st; k++) {
    const int slot = (int)(k & 1);
    long next = 0;
    if (k + 1 < o->nsub) next = submit(o, 0, k + 1, slot ^ 1);
    for (size_t i = 0; i < o->nstate && i < 8; i++) states[i] = o->buf[slot] + i * o->sub;
    st = fn(user, k * o->sub, sub_len(o, k), states, err);
    if (!st) submit(o, 1, k, slot);
    if (next) {
      ct_status s2 = wait_for(o, next, err);
      if (!st) st = s2;
    }
  }
  /* the writes behind: done before anyone reads the file again */
  ct_status s2 = wait_for(o, o->submitted, err);
  return st ? st : s2;
}

double ct_offload_wait_s(const ct_offload *o) { return o ? o->wait_s : 0; }
double ct_offload_bytes(const ct_offload *o) { return o ? o->bytes : 0; }
const char *ct_offload_mode(const ct_offload *o) { return o && o->direct ? "O_DIRECT" : "buffered"; }

void ct_offload_close(ct_offload *o) {
  if (!o) return;
  if (o->started) {
    pthread_mutex_lock(&o->mu);
    o->stop = 1;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->th, NULL);
  }
  if (o->fd >= 0) {
    close(o->fd);
    unlink(o->path);
  }
  for (int s = 0; s < 2; s++) {
    if (o->pinned && o->buf[s]) munlock(o->buf[s], o->block);
    ct_free(o->raw[s]);
  }
  pthread_mutex_destroy(&o->mu);
  pthread_cond_destroy(&o->cv);
  free(o);
}

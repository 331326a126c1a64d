/* onebit.c: 1-bit Adam (docs/distributed.md, "1-bit Adam").
 *
 * Warm-up (steps <= freeze_step): the trainer all-reduces the gradient as
 * usual and this is Adam without bias correction (DeepSpeed's OneBitAdam
 * update: m / (sqrt(v) + eps), plus weight_decay * w).
 *
 * Compression (later steps): the trainer skips the gradient all-reduce. Each
 * rank updates the momentum with its own gradient, and the momentum — not the
 * gradient — is averaged by the error-compensated compressed all-reduce:
 *   worker:  x = m + e_w;  s_w = ||x|| / sqrt(len);  e_w = x - s_w sign(x);
 *            chunk c of sign(x) (bits) goes to rank c, s_w to everyone;
 *   server:  y = (sum over ranks, in rank order, of s_p sign_p) / N + e_s;
 *            s_s = ||y|| / sqrt(chunk);  e_s = y - s_s sign(y);
 *            sign(y) (bits) and s_s go to everyone;
 *   m = s_s(c) sign(y) for every chunk c.
 * The variance is frozen at its value after warm-up. Every rank ends the step
 * with the same m, so the weights stay identical. Per element that is 2 bits
 * through MPI instead of the 64 of a reduce-scatter + all-gather of floats.
 *
 * Error feedback starts at zero and is not checkpointed: a resume resets it,
 * as DeepSpeed does.
 */
#include "train/onebit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"

/* One tensor: compressed on its own (its own scales and error), as
 * DeepSpeed compresses each parameter. Its n floats are padded to np, a
 * multiple of 8 N, and cut into N chunks of ch; chunk p is served by rank p. */
typedef struct ob_tensor {
  size_t off, n, np, ch;
  size_t xoff; /* in the worker buffers (sum of np before it) */
  size_t soff; /* in the server buffers (sum of ch before it); its bits start at soff / 8 */
} ob_tensor;

struct ct_onebit {
  ct_comm *comm;
  int N, rank;
  size_t n;
  ob_tensor *t;
  size_t nt, nx, ns, B; /* worker floats, server floats, bytes of one rank's bits (ns / 8) */
  float *m, *v;         /* borrowed */
  float *werr, *serr, *x, *y;
  uint8_t *bits, *rbits, *sbits, *gbits; /* N B, N B, B, N B */
  float *wsc, *wsc_all, *ssc, *ssc_all;  /* nt, N nt, nt, N nt */
  float b1, b2, eps, wd;
  long freeze;
  double sent, full;
  long nsteps;
  /* 0/1 Adam */
  int zeroone;
  ct_zeroone_hp zh;
  long var_interval, var_counter, local_interval, local_counter;
  int frozen, errors_reset;
  double lrs; /* learning rates summed over the local steps since the last sync */
  float *u;   /* momentum accumulator of the local steps (n) */
  float *g1;  /* the gradient's copy for its 1-bit all-reduce (n) */
  /* 1-bit Lamb */
  int lamb;
  ct_onebit_lamb_hp lh;
  float *vfresh;        /* the variance re-estimated from the communicated momentum (n) */
  double *coeff_freeze; /* per tensor: running average of the trust ratio during warm-up */
  double *last_factor;  /* per tensor */
  float *mlast;         /* the momentum before this step (n) */
  double sent_all,
      full_all; /* every step: what went through MPI, and a float32 all-reduce each step */
  long steps;
};

ct_status ct_onebit_new(ct_comm *comm, size_t n, const size_t *offs, const size_t *lens, size_t nt,
                        float *m, float *v, float beta1, float beta2, float eps, float weight_decay,
                        long freeze_step, ct_onebit **out, ct_err *err) {
  *out = NULL;
  ct_onebit *o = calloc(1, sizeof *o);
  if (!o) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  o->comm = comm;
  o->N = ct_comm_size(comm);
  o->rank = ct_comm_rank(comm);
  o->n = n;
  o->m = m;
  o->v = v;
  o->b1 = beta1, o->b2 = beta2, o->eps = eps, o->wd = weight_decay;
  o->freeze = freeze_step;
  o->nt = nt;
  o->t = calloc(nt ? nt : 1, sizeof *o->t);
  if (!o->t) {
    free(o);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  const size_t q = (size_t)8 * (size_t)o->N;
  for (size_t i = 0; i < nt; i++) {
    ob_tensor *t = &o->t[i];
    t->off = offs[i];
    t->n = lens[i];
    t->np = (t->n + q - 1) / q * q;
    t->ch = t->np / (size_t)o->N;
    t->xoff = o->nx;
    t->soff = o->ns;
    o->nx += t->np;
    o->ns += t->ch;
  }
  o->B = o->ns / 8;
  const size_t N = (size_t)o->N, T = nt ? nt : 1;
  o->werr = ct_calloc(CT_MEM_OPTIMIZER, o->nx + 1, sizeof(float));
  o->serr = ct_calloc(CT_MEM_OPTIMIZER, o->ns + 1, sizeof(float));
  o->x = ct_alloc(CT_MEM_BUFFERS, (o->nx + 1) * sizeof(float));
  o->y = ct_alloc(CT_MEM_BUFFERS, (o->ns + 1) * sizeof(float));
  o->bits = ct_alloc(CT_MEM_BUFFERS, N * o->B + 1);
  o->rbits = ct_alloc(CT_MEM_BUFFERS, N * o->B + 1);
  o->sbits = ct_alloc(CT_MEM_BUFFERS, o->B + 1);
  o->gbits = ct_alloc(CT_MEM_BUFFERS, N * o->B + 1);
  o->wsc = calloc(T, sizeof(float));
  o->wsc_all = calloc(N * T, sizeof(float));
  o->ssc = calloc(T, sizeof(float));
  o->ssc_all = calloc(N * T, sizeof(float));
  if (!o->werr || !o->serr || !o->x || !o->y || !o->bits || !o->rbits || !o->sbits || !o->gbits ||
      !o->wsc || !o->wsc_all || !o->ssc || !o->ssc_all) {
    const size_t nx = o->nx;
    ct_onebit_free(o);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory for OneBitAdam's error feedback (%zu floats)",
                   nx);
  }
  *out = o;
  return CT_OK;
}

ct_status ct_onebit_zeroone(ct_onebit *o, const ct_zeroone_hp *hp, ct_err *err) {
  o->zeroone = 1;
  o->zh = *hp;
  o->var_interval = o->local_interval = 1;
  o->u = ct_calloc(CT_MEM_OPTIMIZER, o->n ? o->n : 1, sizeof(float));
  o->g1 = ct_alloc(CT_MEM_BUFFERS, (o->n ? o->n : 1) * sizeof(float));
  return o->u && o->g1
             ? CT_OK
             : ct_errf(err, CT_ERR_NOMEM, "out of memory for 0/1 Adam's momentum accumulator");
}

ct_status ct_onebit_lamb(ct_onebit *o, const ct_onebit_lamb_hp *hp, ct_err *err) {
  o->lamb = 1;
  o->lh = *hp;
  const size_t n = o->n ? o->n : 1, T = o->nt ? o->nt : 1;
  o->vfresh = ct_calloc(CT_MEM_OPTIMIZER, n, sizeof(float));
  o->mlast = ct_alloc(CT_MEM_BUFFERS, n * sizeof(float));
  o->coeff_freeze = calloc(T, sizeof(double));
  o->last_factor = malloc(T * sizeof(double));
  if (!o->vfresh || !o->mlast || !o->coeff_freeze || !o->last_factor)
    return ct_errf(err, CT_ERR_NOMEM, "out of memory for 1-bit Lamb's state");
  for (size_t k = 0; k < T; k++) o->last_factor[k] = 1.0;
  return CT_OK;
}

void ct_onebit_set_freeze(ct_onebit *o, long freeze_step) {
  o->freeze = freeze_step;
}

void ct_onebit_free(ct_onebit *o) {
  if (!o) return;
  ct_free(o->vfresh);
  ct_free(o->mlast);
  free(o->coeff_freeze);
  free(o->last_factor);
  ct_free(o->u);
  ct_free(o->g1);
  free(o->t);
  ct_free(o->werr);
  ct_free(o->serr);
  ct_free(o->x);
  ct_free(o->y);
  ct_free(o->bits);
  ct_free(o->rbits);
  ct_free(o->sbits);
  ct_free(o->gbits);
  free(o->wsc);
  free(o->wsc_all);
  free(o->ssc);
  free(o->ssc_all);
  free(o);
}

int ct_onebit_full_gradient(const ct_onebit *o, long step) {
  if (!o->zeroone) return step <= o->freeze;
  return !o->frozen && step % o->var_interval == 0;
}

static float rms(const float *x, size_t len) {
  double ss = 0;
  for (size_t i = 0; i < len; i++) ss += (double)x[i] * x[i];
  return len ? (float)(sqrt(ss) / sqrt((double)len)) : 0.0f;
}

/* sign bits of x[0..len) (1 for >= 0; len a multiple of 8) and the error x - scale * sign. */
static void quantize(const float *x, size_t len, float scale, uint8_t *bits, float *e) {
  memset(bits, 0, len / 8);
  for (size_t i = 0; i < len; i++) {
    const int pos = x[i] >= 0.0f;
    bits[i >> 3] |= (uint8_t)(pos << (i & 7));
    e[i] = x[i] - (pos ? scale : -scale);
  }
}

static inline float sgn(const uint8_t *bits, size_t i) {
  return (bits[i >> 3] >> (i & 7)) & 1 ? 1.0f : -1.0f;
}

ct_status ct_onebit_allreduce(ct_onebit *o, float *m, ct_err *err) {
  const int N = o->N;
  const size_t B = o->B, T = o->nt;
  /* workers: compensate, one scale per tensor, chunk p's signs for rank p */
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t k = 0; k < T; k++) {
    const ob_tensor *t = &o->t[k];
    float *x = o->x + t->xoff, *e = o->werr + t->xoff;
    for (size_t i = 0; i < t->np; i++) x[i] = (i < t->n ? m[t->off + i] : 0.0f) + e[i];
    o->wsc[k] = rms(x, t->np);
    for (int p = 0; p < N; p++)
      quantize(x + (size_t)p * t->ch, t->ch, o->wsc[k], o->bits + (size_t)p * B + t->soff / 8,
               e + (size_t)p * t->ch);
  }
  ct_status st = ct_comm_alltoall_bytes(o->comm, o->bits, o->rbits, B, err);
  if (!st) st = ct_comm_allgather_bytes(o->comm, o->wsc, o->wsc_all, T * sizeof(float), err);
  if (st) return st;
    /* servers: this rank's chunk of every tensor from every worker, averaged in
     * rank order, compensated, one scale per tensor */
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t k = 0; k < T; k++) {
    const ob_tensor *t = &o->t[k];
    float *y = o->y + t->soff, *e = o->serr + t->soff;
    for (size_t j = 0; j < t->ch; j++) {
      float s = 0.0f;
      for (int p = 0; p < N; p++)
        s += o->wsc_all[(size_t)p * T + k] * sgn(o->rbits + (size_t)p * B + t->soff / 8, j);
      y[j] = s / (float)N + e[j];
    }
    o->ssc[k] = rms(y, t->ch);
    quantize(y, t->ch, o->ssc[k], o->sbits + t->soff / 8, e);
  }
  st = ct_comm_allgather_bytes(o->comm, o->sbits, o->gbits, B, err);
  if (!st) st = ct_comm_allgather_bytes(o->comm, o->ssc, o->ssc_all, T * sizeof(float), err);
  if (st) return st;
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t k = 0; k < T; k++) {
    const ob_tensor *t = &o->t[k];
    for (size_t i = 0; i < t->n; i++) {
      const size_t p = i / t->ch, j = i % t->ch;
      m[t->off + i] = o->ssc_all[p * T + k] * sgn(o->gbits + p * B + t->soff / 8, j);
    }
  }
  /* what went through MPI from this rank: signs to N-1 ranks twice, the scales twice */
  const double c = (double)(N - 1) * (2.0 * (double)B + 2.0 * (double)T * sizeof(float));
  o->sent += c;
  o->sent_all += c;
  o->full += 2.0 * (double)(N - 1) * (double)ct_comm_shard_len(o->n, N) * sizeof(float);
  return CT_OK;
}

/* 0/1 Adam (Lu et al. 2022, as DeepSpeed's ZeroOneAdam steps it). Before the
 * variance freezes: on variance-update steps (at exponentially growing
 * intervals) the all-reduced gradient updates m and v; on the others each
 * rank's gradient goes through the 1-bit all-reduce into m alone. After it:
 * every rank takes local steps with its own gradient, accumulating its
 * updates in u, and every local_interval steps (growing to
 * local_step_clipper) the ranks synchronise: the local updates are undone,
 * u is turned back into momentum units, 1-bit all-reduced, and applied once;
 * m becomes the average momentum over those steps. */
static ct_status zeroone_step(ct_onebit *o, float *w, const float *g, float lr, long step,
                              ct_err *err) {
  float *m = o->m, *v = o->v, *u = o->u;
  const float b1 = o->b1, b2 = o->b2, eps = o->eps, wd = o->wd;
  const size_t n = o->n;
  ct_status st = CT_OK;
  if (!o->frozen) {
    if (step % o->var_interval == 0) { /* the gradient was all-reduced */
#pragma omp parallel for simd schedule(static)
      for (size_t i = 0; i < n; i++) {
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      }
    } else {
      float *x = o->g1; /* the 1-bit average of the ranks' gradients, into m */
      memcpy(x, g, n * sizeof(float));
      if (o->N > 1 && (st = ct_onebit_allreduce(o, x, err))) return st;
#pragma omp parallel for simd schedule(static)
      for (size_t i = 0; i < n; i++) m[i] = b1 * m[i] + (1.0f - b1) * x[i];
      o->nsteps++;
    }
  } else {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    o->lrs += lr;
  }
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    const float up = m[i] / (sqrtf(v[i]) + eps) + wd * w[i];
    w[i] -= lr * up;
    if (o->frozen) u[i] -= lr * up;
  }
  if (o->frozen && step % o->local_interval == 0) { /* synchronise the ranks */
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
      w[i] -= u[i];
      u[i] *= sqrtf(v[i]) + eps;
    }
    if (o->N > 1 && (st = ct_onebit_allreduce(o, u, err))) return st;
    const float inv = o->lrs > 0 ? (float)(1.0 / o->lrs) : 0.0f;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
      m[i] = -u[i] * inv;
      w[i] += u[i] / (sqrtf(v[i]) + eps);
      u[i] = 0.0f;
    }
    o->lrs = 0;
    o->nsteps++;
  }
  /* the schedules */
  if (!o->frozen) {
    if (step % o->var_interval == 0 && ++o->var_counter == o->zh.var_update_scaler) {
      o->var_counter = 0;
      o->var_interval *= 2;
    }
  } else if (++o->local_counter == o->zh.local_step_scaler) {
    o->local_counter = 0;
    o->local_interval = o->local_interval * 2 < o->zh.local_step_clipper ? o->local_interval * 2
                                                                         : o->zh.local_step_clipper;
  }
  if (!o->frozen && step > o->zh.var_freeze_step) {
    o->frozen = 1;
    /* the errors now measure accumulated momentum, not gradients: start them afresh */
    memset(o->werr, 0, o->nx * sizeof(float));
    memset(o->serr, 0, o->ns * sizeof(float));
  }
  return CT_OK;
}

static double norm2(const float *x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  return sqrt(s);
}

/* 1-bit Lamb (Li et al. 2021, as DeepSpeed's OnebitLamb steps it), tensor by
 * tensor. Warm-up: Lamb without bias correction over the all-reduced gradient
 * — update u = m / (sqrt(v) + eps) + wd w, trust ratio ||w|| / ||u|| clipped
 * to [min_coeff, max_coeff] — keeping a running average of each tensor's
 * trust ratio. After freeze_step: v is frozen, the momentum (updated with each
 * rank's own gradient) goes through the 1-bit all-reduce, a fresh variance
 * is re-estimated from the gradient that momentum implies, and the trust
 * ratio is the frozen average times a factor max(denominator / fresh
 * denominator), bounded by factor_min/factor_max and by factor_threshold
 * from the last step. (DeepSpeed compresses one flat buffer after scaling
 * every tensor's momentum to a common size; with a scale per tensor here,
 * that scaling is not needed.) */
static ct_status lamb_step(ct_onebit *o, float *w, const float *g, float lr, long step,
                           ct_err *err) {
  float *m = o->m, *v = o->v;
  const float b1 = o->b1, b2 = o->b2, eps = o->eps, wd = o->wd;
  const ct_onebit_lamb_hp *h = &o->lh;
  const int warm = ct_onebit_full_gradient(o, step);
  if (!warm) {
    memcpy(o->mlast, m, o->n * sizeof(float));
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < o->n; i++) m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    ct_status st = ct_onebit_allreduce(o, m, err);
    if (st) return st;
    o->nsteps++;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t k = 0; k < o->nt; k++) {
    const ob_tensor *t = &o->t[k];
    float *wk = w + t->off, *mk = m + t->off, *vk = v + t->off, *fk = o->vfresh + t->off;
    const float *gk = g + t->off;
    double un2 = 0, up2 = 0, dmax = 0;
    if (warm) {
      for (size_t i = 0; i < t->n; i++) {
        mk[i] = b1 * mk[i] + (1.0f - b1) * gk[i];
        vk[i] = b2 * vk[i] + (1.0f - b2) * gk[i] * gk[i];
      }
      if (step == o->freeze) memcpy(fk, vk, t->n * sizeof(float));
    } else {
      const float *ml = o->mlast + t->off;
      for (size_t i = 0; i < t->n; i++) {
        const float gr = (mk[i] - ml[i] * b1) / (1.0f - b1); /* the gradient the momentum implies */
        fk[i] = b2 * fk[i] + (1.0f - b2) * gr * gr;
        const double den = (double)sqrtf(vk[i]) + eps, real = (double)sqrtf(fk[i]) + eps;
        if (den / real > dmax) dmax = den / real;
      }
    }
    for (size_t i = 0; i < t->n; i++) {
      const double pre = mk[i] / (sqrtf(vk[i]) + eps), u = pre + (double)wd * wk[i];
      up2 += pre * pre;
      un2 += u * u;
    }
    const double un = sqrt(un2);
    double coeff = 1.0;
    if (warm) {
      const double wn = norm2(wk, t->n);
      if (wn != 0 && un != 0) {
        coeff = wn / un;
        coeff = coeff > h->max_coeff ? h->max_coeff : coeff < h->min_coeff ? h->min_coeff : coeff;
      }
      if (coeff != 1.0)
        o->coeff_freeze[k] = h->coeff_beta * o->coeff_freeze[k] + (1.0 - h->coeff_beta) * coeff;
    } else {
      double factor = dmax;
      if (wd > 0.0f && un > 0) {
        const double ratio = fmin(1.0, sqrt(up2) / un);
        factor = factor * ratio + (1.0 - ratio);
      }
      factor = fmin(fmax(factor, h->factor_min), h->factor_max);
      const double lf = o->last_factor[k];
      factor =
          fmin(fmax(factor, lf * (1.0 - h->factor_threshold)), lf * (1.0 + h->factor_threshold));
      o->last_factor[k] = factor;
      coeff = o->coeff_freeze[k] * factor;
    }
    const float c = (float)((double)lr * coeff);
    for (size_t i = 0; i < t->n; i++) wk[i] -= c * (mk[i] / (sqrtf(vk[i]) + eps) + wd * wk[i]);
  }
  return CT_OK;
}

ct_status ct_onebit_step(ct_onebit *o, float *w, const float *g, float lr, long step, ct_err *err) {
  /* the float32 all-reduce a step would cost (reduce-scatter + all-gather), and
   * whether the trainer made one for this step's gradient */
  const double fb =
      2.0 * (double)(o->N - 1) * (double)ct_comm_shard_len(o->n, o->N) * sizeof(float);
  o->full_all += fb;
  if (ct_onebit_full_gradient(o, step)) o->sent_all += fb;
  o->steps++;
  if (o->zeroone) return zeroone_step(o, w, g, lr, step, err);
  if (o->lamb) return lamb_step(o, w, g, lr, step, err);
  float *m = o->m, *v = o->v;
  const float b1 = o->b1, b2 = o->b2;
  const size_t n = o->n;
  if (ct_onebit_full_gradient(o, step)) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    }
  } else {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    ct_status st = ct_onebit_allreduce(o, m, err);
    if (st) return st;
    o->nsteps++;
  }
  const float eps = o->eps, wd = o->wd;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) w[i] -= lr * (m[i] / (sqrtf(v[i]) + eps) + wd * w[i]);
  return CT_OK;
}

void ct_onebit_bytes(const ct_onebit *o, double *sent, double *full, long *compressed_steps) {
  *sent = o->sent;
  *full = o->full;
  *compressed_steps = o->nsteps;
}

void ct_onebit_bytes_all(const ct_onebit *o, double *sent, double *full, long *steps) {
  *sent = o->sent_all;
  *full = o->full_all;
  *steps = o->steps;
}

/* The test backend "sealed" (and its bf16-compute sibling "sealed-bf16"):
 * the CPU backend's kernels on memory the host cannot touch. It proves that
 * code runs device-resident without a GPU (docs/training.md, "Compute
 * backends and residency").
 *
 * Every allocation is its own anonymous mapping, kept PROT_NONE except while
 * one of this table's functions runs: an op wrapper makes every live
 * allocation readable and writable, calls the CPU backend's op (the same
 * kernel, so the same bits as "cpu" / "cpu-bf16"), and seals them again;
 * copy_in / copy_out / copy open only the allocations they touch. Any other
 * host access to this memory — a trainer loop, a memset, a writer reading a
 * parameter — is a SIGSEGV at the faulting line. An op handed a float or
 * bf16 pointer that is not inside a sealed allocation (host memory where
 * device memory belongs: a CUDA illegal address) aborts with the op and
 * argument named. host_memory is 0; allocations are counted as device memory
 * (ct_mem_device_add/sub). Ops run one at a time (one lock), which is all a
 * test needs; it is slow (a few mprotect calls per op and allocation) and is
 * no backend to train with.
 * Not here: the kernels (the CPU backend's), the registry (backend.c).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <threads.h>
#include <unistd.h>

#include "ctuner/backend.h"

extern const ct_backend_ops ct_backend_cpu;      /* backend_cpu.c */
const ct_backend_ops *ct_backend_cpu_bf16(void); /* backend_cpu.c */

typedef struct seal_block {
  char *p;
  size_t len, bytes; /* mapped (whole pages), asked for */
  ct_mem_cat cat;
} seal_block;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static seal_block *blocks;
static size_t nblocks, capblocks;
static const ct_backend_ops *bf16_inner;

static void die(const char *what) {
  fprintf(stderr, "sealed backend: %s\n", what);
  abort();
}

static void prot(const seal_block *b, int rw) {
  if (mprotect(b->p, b->len, rw ? PROT_READ | PROT_WRITE : PROT_NONE)) die("mprotect failed");
}

/* the block holding p (lock held), or NULL */
static seal_block *find(const void *p) {
  const char *c = p;
  for (size_t i = 0; i < nblocks; i++)
    if (c >= blocks[i].p && c < blocks[i].p + blocks[i].len) return &blocks[i];
  return NULL;
}

/* An op's float / bf16 pointer must be NULL or inside a sealed allocation. */
static void seal_arg(const char *op, const char *name, const void *p) {
  if (!p) return;
  pthread_mutex_lock(&lock);
  const int ok = find(p) != NULL;
  pthread_mutex_unlock(&lock);
  if (ok) return;
  char msg[160];
  snprintf(msg, sizeof msg, "op %s: argument %s (%p) is not sealed-backend memory", op, name, p);
  die(msg);
}
#define SEAL_ARG(op, a) seal_arg(op, #a, (const void *)(a))

/* Ops run so far (the fault hook counts them). */
static unsigned long nops;

static void seal_open(void) {
  pthread_mutex_lock(&lock);
  nops++;
  for (size_t i = 0; i < nblocks; i++) prot(&blocks[i], 1);
}

static void seal_close(void) {
  for (size_t i = 0; i < nblocks; i++) prot(&blocks[i], 0);
  pthread_mutex_unlock(&lock);
}

static void *s_alloc(ct_mem_cat cat, size_t bytes) {
  if (!bytes) return NULL;
  const size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (bytes + page - 1) / page * page;
  void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  pthread_mutex_lock(&lock);
  if (nblocks == capblocks) {
    size_t cap = capblocks ? 2 * capblocks : 64;
    seal_block *nb = realloc(blocks, cap * sizeof *nb);
    if (!nb) {
      pthread_mutex_unlock(&lock);
      munmap(p, len);
      return NULL;
    }
    blocks = nb;
    capblocks = cap;
  }
  blocks[nblocks++] = (seal_block){p, len, bytes, cat};
  pthread_mutex_unlock(&lock);
  ct_mem_device_add(cat, bytes);
  return p;
}

static void s_free(void *p) {
  if (!p) return;
  pthread_mutex_lock(&lock);
  seal_block *b = find(p);
  if (!b || b->p != p) die("free of a pointer this backend did not allocate");
  const seal_block g = *b;
  *b = blocks[--nblocks];
  pthread_mutex_unlock(&lock);
  ct_mem_device_sub(g.cat, g.bytes);
  munmap(g.p, g.len);
}

/* a range [p, p + bytes) inside one block (lock held), opened */
static seal_block *open_range(const void *p, size_t bytes, const char *what) {
  seal_block *b = find(p);
  if (!b || (const char *)p + bytes > b->p + b->len) die(what);
  prot(b, 1);
  return b;
}

static void s_copy_in(void *dst, const void *host_src, size_t bytes) {
  if (!bytes) return;
  pthread_mutex_lock(&lock);
  seal_block *b = open_range(dst, bytes, "copy_in: the destination is not sealed memory");
  memcpy(dst, host_src, bytes);
  prot(b, 0);
  pthread_mutex_unlock(&lock);
}

static void s_copy_out(void *host_dst, const void *src, size_t bytes) {
  if (!bytes) return;
  pthread_mutex_lock(&lock);
  seal_block *b = open_range(src, bytes, "copy_out: the source is not sealed memory");
  memcpy(host_dst, src, bytes);
  prot(b, 0);
  pthread_mutex_unlock(&lock);
}

static void s_copy(void *dst, const void *src, size_t bytes) {
  if (!bytes) return;
  pthread_mutex_lock(&lock);
  seal_block *a = open_range(dst, bytes, "copy: the destination is not sealed memory");
  seal_block *b = open_range(src, bytes, "copy: the source is not sealed memory");
  memmove(dst, src, bytes);
  prot(a, 0);
  prot(b, 0);
  pthread_mutex_unlock(&lock);
}

static void s_synchronize(void) {}

/* A test hook for the status path of asynchronous device errors:
 * CTUNER_SEALED_FAULT_AFTER=N makes check report one (CT_ERR_DEVICE) once
 * more than N ops have run, as a CUDA backend reports a failed kernel. */
static ct_status s_check(ct_err *err) {
  static int reported;
  const char *e = getenv("CTUNER_SEALED_FAULT_AFTER");
  if (!e || reported) return CT_OK;
  pthread_mutex_lock(&lock);
  const unsigned long n = nops;
  pthread_mutex_unlock(&lock);
  if (n <= strtoul(e, NULL, 10)) return CT_OK;
  reported = 1;
  return ct_errf(err, CT_ERR_DEVICE,
                 "injected device fault after %lu ops (CTUNER_SEALED_FAULT_AFTER)", n);
}

static void s_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  SEAL_ARG("sgemm", A);
  SEAL_ARG("sgemm", B);
  SEAL_ARG("sgemm", C);
  seal_open();
  ct_backend_cpu.sgemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  seal_close();
}

static void sb_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  SEAL_ARG("sgemm", A);
  SEAL_ARG("sgemm", B);
  SEAL_ARG("sgemm", C);
  seal_open();
  bf16_inner->sgemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  seal_close();
}

static void s_sgemm_deterministic(int transA, int transB, int M, int N, int K, float alpha,
                                  const float *A, int lda, const float *B, int ldb, float beta,
                                  float *C, int ldc) {
  SEAL_ARG("sgemm_deterministic", A);
  SEAL_ARG("sgemm_deterministic", B);
  SEAL_ARG("sgemm_deterministic", C);
  seal_open();
  ct_backend_cpu.sgemm_deterministic(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  seal_close();
}

static void s_linear_fwd(int N, int K, int M, const float *x, int ldx, const float *w,
                         const float *b, float *y, int ldy) {
  SEAL_ARG("linear_fwd", x);
  SEAL_ARG("linear_fwd", w);
  SEAL_ARG("linear_fwd", b);
  SEAL_ARG("linear_fwd", y);
  seal_open();
  ct_backend_cpu.linear_fwd(N, K, M, x, ldx, w, b, y, ldy);
  seal_close();
}

static void sb_linear_fwd(int N, int K, int M, const float *x, int ldx, const float *w,
                          const float *b, float *y, int ldy) {
  SEAL_ARG("linear_fwd", x);
  SEAL_ARG("linear_fwd", w);
  SEAL_ARG("linear_fwd", b);
  SEAL_ARG("linear_fwd", y);
  seal_open();
  bf16_inner->linear_fwd(N, K, M, x, ldx, w, b, y, ldy);
  seal_close();
}

static void s_linear_bwd(int N, int K, int M, const float *x, int ldx, const float *w,
                         const float *dy, int lddy, float *dx, int lddx, float beta_dx, float *dw,
                         float *db) {
  SEAL_ARG("linear_bwd", x);
  SEAL_ARG("linear_bwd", w);
  SEAL_ARG("linear_bwd", dy);
  SEAL_ARG("linear_bwd", dx);
  SEAL_ARG("linear_bwd", dw);
  SEAL_ARG("linear_bwd", db);
  seal_open();
  ct_backend_cpu.linear_bwd(N, K, M, x, ldx, w, dy, lddy, dx, lddx, beta_dx, dw, db);
  seal_close();
}

static void sb_linear_bwd(int N, int K, int M, const float *x, int ldx, const float *w,
                          const float *dy, int lddy, float *dx, int lddx, float beta_dx, float *dw,
                          float *db) {
  SEAL_ARG("linear_bwd", x);
  SEAL_ARG("linear_bwd", w);
  SEAL_ARG("linear_bwd", dy);
  SEAL_ARG("linear_bwd", dx);
  SEAL_ARG("linear_bwd", dw);
  SEAL_ARG("linear_bwd", db);
  seal_open();
  bf16_inner->linear_bwd(N, K, M, x, ldx, w, dy, lddy, dx, lddx, beta_dx, dw, db);
  seal_close();
}

static void s_linear_fwd_w(int N, int K, int M, const float *x, int ldx, const ct_wview *w,
                           const float *b, float *y, int ldy) {
  SEAL_ARG("linear_fwd_w", x);
  SEAL_ARG("linear_fwd_w", b);
  SEAL_ARG("linear_fwd_w", y);
  SEAL_ARG("linear_fwd_w", w->data);
  SEAL_ARG("linear_fwd_w", w->scales);
  seal_open();
  ct_backend_cpu.linear_fwd_w(N, K, M, x, ldx, w, b, y, ldy);
  seal_close();
}

static void s_linear_bwd_w(int N, int K, int M, const float *x, int ldx, const ct_wview *w,
                           const float *dy, int lddy, float *dx, int lddx, float beta_dx, float *dw,
                           float *db) {
  SEAL_ARG("linear_bwd_w", x);
  SEAL_ARG("linear_bwd_w", dy);
  SEAL_ARG("linear_bwd_w", dx);
  SEAL_ARG("linear_bwd_w", dw);
  SEAL_ARG("linear_bwd_w", db);
  SEAL_ARG("linear_bwd_w", w->data);
  SEAL_ARG("linear_bwd_w", w->scales);
  seal_open();
  ct_backend_cpu.linear_bwd_w(N, K, M, x, ldx, w, dy, lddy, dx, lddx, beta_dx, dw, db);
  seal_close();
}

static void s_attention_fwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                            const float *k, const float *v, float *o, float *lse) {
  SEAL_ARG("attention_fwd", q);
  SEAL_ARG("attention_fwd", k);
  SEAL_ARG("attention_fwd", v);
  SEAL_ARG("attention_fwd", o);
  SEAL_ARG("attention_fwd", lse);
  seal_open();
  ct_backend_cpu.attention_fwd(B, H, L, hd, scale, causal, q, k, v, o, lse);
  seal_close();
}

static void sb_attention_fwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                             const float *k, const float *v, float *o, float *lse) {
  SEAL_ARG("attention_fwd", q);
  SEAL_ARG("attention_fwd", k);
  SEAL_ARG("attention_fwd", v);
  SEAL_ARG("attention_fwd", o);
  SEAL_ARG("attention_fwd", lse);
  seal_open();
  bf16_inner->attention_fwd(B, H, L, hd, scale, causal, q, k, v, o, lse);
  seal_close();
}

static void s_attention_bias_fwd(int B, int H, int L, int hd, float scale, const float *bias,
                                 const float *q, const float *k, const float *v, float *o) {
  SEAL_ARG("attention_bias_fwd", bias);
  SEAL_ARG("attention_bias_fwd", q);
  SEAL_ARG("attention_bias_fwd", k);
  SEAL_ARG("attention_bias_fwd", v);
  SEAL_ARG("attention_bias_fwd", o);
  seal_open();
  ct_backend_cpu.attention_bias_fwd(B, H, L, hd, scale, bias, q, k, v, o);
  seal_close();
}

static void s_attention_bwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                            const float *k, const float *v, const float *o, const float *lse,
                            const float *dout, float *dq, float *dk, float *dv) {
  SEAL_ARG("attention_bwd", q);
  SEAL_ARG("attention_bwd", k);
  SEAL_ARG("attention_bwd", v);
  SEAL_ARG("attention_bwd", o);
  SEAL_ARG("attention_bwd", lse);
  SEAL_ARG("attention_bwd", dout);
  SEAL_ARG("attention_bwd", dq);
  SEAL_ARG("attention_bwd", dk);
  SEAL_ARG("attention_bwd", dv);
  seal_open();
  ct_backend_cpu.attention_bwd(B, H, L, hd, scale, causal, q, k, v, o, lse, dout, dq, dk, dv);
  seal_close();
}

static void sb_attention_bwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                             const float *k, const float *v, const float *o, const float *lse,
                             const float *dout, float *dq, float *dk, float *dv) {
  SEAL_ARG("attention_bwd", q);
  SEAL_ARG("attention_bwd", k);
  SEAL_ARG("attention_bwd", v);
  SEAL_ARG("attention_bwd", o);
  SEAL_ARG("attention_bwd", lse);
  SEAL_ARG("attention_bwd", dout);
  SEAL_ARG("attention_bwd", dq);
  SEAL_ARG("attention_bwd", dk);
  SEAL_ARG("attention_bwd", dv);
  seal_open();
  bf16_inner->attention_bwd(B, H, L, hd, scale, causal, q, k, v, o, lse, dout, dq, dk, dv);
  seal_close();
}

static void s_rope_table(int L, const int *pos, const int axes[3], float theta, float *pe) {
  SEAL_ARG("rope_table", pe);
  seal_open();
  ct_backend_cpu.rope_table(L, pos, axes, theta, pe);
  seal_close();
}

static void s_rope_fwd(int N, int L, int D, const float *pe, const float *x, int ldx, float *y,
                       int ldy) {
  SEAL_ARG("rope_fwd", pe);
  SEAL_ARG("rope_fwd", x);
  SEAL_ARG("rope_fwd", y);
  seal_open();
  ct_backend_cpu.rope_fwd(N, L, D, pe, x, ldx, y, ldy);
  seal_close();
}

static void s_rope_bwd(int N, int L, int D, const float *pe, const float *dy, int lddy, float *dx,
                       int lddx) {
  SEAL_ARG("rope_bwd", pe);
  SEAL_ARG("rope_bwd", dy);
  SEAL_ARG("rope_bwd", dx);
  seal_open();
  ct_backend_cpu.rope_bwd(N, L, D, pe, dy, lddy, dx, lddx);
  seal_close();
}

static void s_qkv_heads_fwd(int B, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                            const float *qscale, const float *kscale, const float *pe, float *q,
                            float *k, float *v, float *rstd_q, float *rstd_k) {
  SEAL_ARG("qkv_heads_fwd", qkv);
  SEAL_ARG("qkv_heads_fwd", qscale);
  SEAL_ARG("qkv_heads_fwd", kscale);
  SEAL_ARG("qkv_heads_fwd", pe);
  SEAL_ARG("qkv_heads_fwd", q);
  SEAL_ARG("qkv_heads_fwd", k);
  SEAL_ARG("qkv_heads_fwd", v);
  SEAL_ARG("qkv_heads_fwd", rstd_q);
  SEAL_ARG("qkv_heads_fwd", rstd_k);
  seal_open();
  ct_backend_cpu.qkv_heads_fwd(B, Ls, Lt, off, H, hd, qkv, qscale, kscale, pe, q, k, v, rstd_q,
                               rstd_k);
  seal_close();
}

static void s_qkv_heads_bwd(int B, int Ls, int Lt, int off, int H, int hd, const float *qkv,
                            const float *qscale, const float *kscale, const float *pe,
                            const float *rstd_q, const float *rstd_k, const float *dq,
                            const float *dk, const float *dv, float *dqkv, float *dqscale,
                            float *dkscale) {
  SEAL_ARG("qkv_heads_bwd", qkv);
  SEAL_ARG("qkv_heads_bwd", qscale);
  SEAL_ARG("qkv_heads_bwd", kscale);
  SEAL_ARG("qkv_heads_bwd", pe);
  SEAL_ARG("qkv_heads_bwd", rstd_q);
  SEAL_ARG("qkv_heads_bwd", rstd_k);
  SEAL_ARG("qkv_heads_bwd", dq);
  SEAL_ARG("qkv_heads_bwd", dk);
  SEAL_ARG("qkv_heads_bwd", dv);
  SEAL_ARG("qkv_heads_bwd", dqkv);
  SEAL_ARG("qkv_heads_bwd", dqscale);
  SEAL_ARG("qkv_heads_bwd", dkscale);
  seal_open();
  ct_backend_cpu.qkv_heads_bwd(B, Ls, Lt, off, H, hd, qkv, qscale, kscale, pe, rstd_q, rstd_k, dq,
                               dk, dv, dqkv, dqscale, dkscale);
  seal_close();
}

static void s_ln_mod_fwd(int B, int L, int D, const float *x, int ldx, const float *shift,
                         const float *scale, int ldm, float eps, float *xhat, float *rstd, float *h,
                         int ldh) {
  SEAL_ARG("ln_mod_fwd", x);
  SEAL_ARG("ln_mod_fwd", shift);
  SEAL_ARG("ln_mod_fwd", scale);
  SEAL_ARG("ln_mod_fwd", xhat);
  SEAL_ARG("ln_mod_fwd", rstd);
  SEAL_ARG("ln_mod_fwd", h);
  seal_open();
  ct_backend_cpu.ln_mod_fwd(B, L, D, x, ldx, shift, scale, ldm, eps, xhat, rstd, h, ldh);
  seal_close();
}

static void s_ln_mod_bwd(int B, int L, int D, const float *xhat, const float *rstd,
                         const float *scale, int ldm, const float *dh, int lddh, float *dx,
                         int lddx, float *dshift, float *dscale) {
  SEAL_ARG("ln_mod_bwd", xhat);
  SEAL_ARG("ln_mod_bwd", rstd);
  SEAL_ARG("ln_mod_bwd", scale);
  SEAL_ARG("ln_mod_bwd", dh);
  SEAL_ARG("ln_mod_bwd", dx);
  SEAL_ARG("ln_mod_bwd", dshift);
  SEAL_ARG("ln_mod_bwd", dscale);
  seal_open();
  ct_backend_cpu.ln_mod_bwd(B, L, D, xhat, rstd, scale, ldm, dh, lddh, dx, lddx, dshift, dscale);
  seal_close();
}

static void s_layernorm_affine_fwd(int N, int D, const float *x, int ldx, const float *gamma,
                                   const float *beta, float eps, float *y, int ldy) {
  SEAL_ARG("layernorm_affine_fwd", x);
  SEAL_ARG("layernorm_affine_fwd", gamma);
  SEAL_ARG("layernorm_affine_fwd", beta);
  SEAL_ARG("layernorm_affine_fwd", y);
  seal_open();
  ct_backend_cpu.layernorm_affine_fwd(N, D, x, ldx, gamma, beta, eps, y, ldy);
  seal_close();
}

static void s_rmsnorm_fwd(int N, int D, const float *x, int ldx, const float *scale, float eps,
                          float *y, int ldy, float *rstd) {
  SEAL_ARG("rmsnorm_fwd", x);
  SEAL_ARG("rmsnorm_fwd", scale);
  SEAL_ARG("rmsnorm_fwd", y);
  SEAL_ARG("rmsnorm_fwd", rstd);
  seal_open();
  ct_backend_cpu.rmsnorm_fwd(N, D, x, ldx, scale, eps, y, ldy, rstd);
  seal_close();
}

static void s_rmsnorm_bwd(int N, int D, const float *x, int ldx, const float *scale,
                          const float *rstd, const float *dy, int lddy, float *dx, int lddx,
                          float *dscale) {
  SEAL_ARG("rmsnorm_bwd", x);
  SEAL_ARG("rmsnorm_bwd", scale);
  SEAL_ARG("rmsnorm_bwd", rstd);
  SEAL_ARG("rmsnorm_bwd", dy);
  SEAL_ARG("rmsnorm_bwd", dx);
  SEAL_ARG("rmsnorm_bwd", dscale);
  seal_open();
  ct_backend_cpu.rmsnorm_bwd(N, D, x, ldx, scale, rstd, dy, lddy, dx, lddx, dscale);
  seal_close();
}

static void s_groupnorm_fwd(int B, int C, int HW, int G, float eps, const float *x,
                            const float *gamma, const float *beta, float *y, float *mean,
                            float *rstd) {
  SEAL_ARG("groupnorm_fwd", x);
  SEAL_ARG("groupnorm_fwd", gamma);
  SEAL_ARG("groupnorm_fwd", beta);
  SEAL_ARG("groupnorm_fwd", y);
  SEAL_ARG("groupnorm_fwd", mean);
  SEAL_ARG("groupnorm_fwd", rstd);
  seal_open();
  ct_backend_cpu.groupnorm_fwd(B, C, HW, G, eps, x, gamma, beta, y, mean, rstd);
  seal_close();
}

static void s_groupnorm_bwd(int B, int C, int HW, int G, const float *x, const float *gamma,
                            const float *mean, const float *rstd, const float *dy, float *dx,
                            float *dgamma, float *dbeta) {
  SEAL_ARG("groupnorm_bwd", x);
  SEAL_ARG("groupnorm_bwd", gamma);
  SEAL_ARG("groupnorm_bwd", mean);
  SEAL_ARG("groupnorm_bwd", rstd);
  SEAL_ARG("groupnorm_bwd", dy);
  SEAL_ARG("groupnorm_bwd", dx);
  SEAL_ARG("groupnorm_bwd", dgamma);
  SEAL_ARG("groupnorm_bwd", dbeta);
  seal_open();
  ct_backend_cpu.groupnorm_bwd(B, C, HW, G, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
  seal_close();
}

static size_t s_conv2d_col_floats(const ct_conv2d_shape *s) {
  seal_open();
  size_t r = ct_backend_cpu.conv2d_col_floats(s);
  seal_close();
  return r;
}

static void s_conv2d_fwd(const ct_conv2d_shape *s, const float *x, const float *w, const float *b,
                         float *y, float *col) {
  SEAL_ARG("conv2d_fwd", x);
  SEAL_ARG("conv2d_fwd", w);
  SEAL_ARG("conv2d_fwd", b);
  SEAL_ARG("conv2d_fwd", y);
  SEAL_ARG("conv2d_fwd", col);
  seal_open();
  ct_backend_cpu.conv2d_fwd(s, x, w, b, y, col);
  seal_close();
}

static void sb_conv2d_fwd(const ct_conv2d_shape *s, const float *x, const float *w, const float *b,
                          float *y, float *col) {
  SEAL_ARG("conv2d_fwd", x);
  SEAL_ARG("conv2d_fwd", w);
  SEAL_ARG("conv2d_fwd", b);
  SEAL_ARG("conv2d_fwd", y);
  SEAL_ARG("conv2d_fwd", col);
  seal_open();
  bf16_inner->conv2d_fwd(s, x, w, b, y, col);
  seal_close();
}

static void s_conv2d_bwd(const ct_conv2d_shape *s, const float *x, const float *w, const float *dy,
                         float *dx, float *dw, float *db, float *col) {
  SEAL_ARG("conv2d_bwd", x);
  SEAL_ARG("conv2d_bwd", w);
  SEAL_ARG("conv2d_bwd", dy);
  SEAL_ARG("conv2d_bwd", dx);
  SEAL_ARG("conv2d_bwd", dw);
  SEAL_ARG("conv2d_bwd", db);
  SEAL_ARG("conv2d_bwd", col);
  seal_open();
  ct_backend_cpu.conv2d_bwd(s, x, w, dy, dx, dw, db, col);
  seal_close();
}

static void sb_conv2d_bwd(const ct_conv2d_shape *s, const float *x, const float *w, const float *dy,
                          float *dx, float *dw, float *db, float *col) {
  SEAL_ARG("conv2d_bwd", x);
  SEAL_ARG("conv2d_bwd", w);
  SEAL_ARG("conv2d_bwd", dy);
  SEAL_ARG("conv2d_bwd", dx);
  SEAL_ARG("conv2d_bwd", dw);
  SEAL_ARG("conv2d_bwd", db);
  SEAL_ARG("conv2d_bwd", col);
  seal_open();
  bf16_inner->conv2d_bwd(s, x, w, dy, dx, dw, db, col);
  seal_close();
}

static void s_upsample2x_fwd(int BC, int H, int W, const float *x, float *y) {
  SEAL_ARG("upsample2x_fwd", x);
  SEAL_ARG("upsample2x_fwd", y);
  seal_open();
  ct_backend_cpu.upsample2x_fwd(BC, H, W, x, y);
  seal_close();
}

static void s_upsample2x_bwd(int BC, int H, int W, const float *dy, float *dx) {
  SEAL_ARG("upsample2x_bwd", dy);
  SEAL_ARG("upsample2x_bwd", dx);
  seal_open();
  ct_backend_cpu.upsample2x_bwd(BC, H, W, dy, dx);
  seal_close();
}

static void s_nchw_to_nlc(int B, int C, int L, const float *x, float *y) {
  SEAL_ARG("nchw_to_nlc", x);
  SEAL_ARG("nchw_to_nlc", y);
  seal_open();
  ct_backend_cpu.nchw_to_nlc(B, C, L, x, y);
  seal_close();
}

static void s_nlc_to_nchw(int B, int C, int L, const float *x, float *y) {
  SEAL_ARG("nlc_to_nchw", x);
  SEAL_ARG("nlc_to_nchw", y);
  seal_open();
  ct_backend_cpu.nlc_to_nchw(B, C, L, x, y);
  seal_close();
}

static void s_tile_blend(int planes, int rows, int cols, int e, int vertical, const float *a,
                         size_t plane_a, int lda, float *b, size_t plane_b, int ldb) {
  SEAL_ARG("tile_blend", a);
  SEAL_ARG("tile_blend", b);
  seal_open();
  ct_backend_cpu.tile_blend(planes, rows, cols, e, vertical, a, plane_a, lda, b, plane_b, ldb);
  seal_close();
}

static void s_patchify(int B, int C, int H, int W, int p, const float *x, float *out) {
  SEAL_ARG("patchify", x);
  SEAL_ARG("patchify", out);
  seal_open();
  ct_backend_cpu.patchify(B, C, H, W, p, x, out);
  seal_close();
}

static void s_unpatchify(int B, int C, int H, int W, int p, const float *in, float *x) {
  SEAL_ARG("unpatchify", in);
  SEAL_ARG("unpatchify", x);
  seal_open();
  ct_backend_cpu.unpatchify(B, C, H, W, p, in, x);
  seal_close();
}

static void s_silu_fwd(int N, int D, const float *x, int ldx, float *y, int ldy) {
  SEAL_ARG("silu_fwd", x);
  SEAL_ARG("silu_fwd", y);
  seal_open();
  ct_backend_cpu.silu_fwd(N, D, x, ldx, y, ldy);
  seal_close();
}

static void s_silu_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy, float *dx,
                       int lddx) {
  SEAL_ARG("silu_bwd", x);
  SEAL_ARG("silu_bwd", dy);
  SEAL_ARG("silu_bwd", dx);
  seal_open();
  ct_backend_cpu.silu_bwd(N, D, x, ldx, dy, lddy, dx, lddx);
  seal_close();
}

static void s_gelu_tanh_fwd(int N, int D, const float *x, int ldx, float *y, int ldy) {
  SEAL_ARG("gelu_tanh_fwd", x);
  SEAL_ARG("gelu_tanh_fwd", y);
  seal_open();
  ct_backend_cpu.gelu_tanh_fwd(N, D, x, ldx, y, ldy);
  seal_close();
}

static void s_gelu_tanh_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy,
                            float *dx, int lddx) {
  SEAL_ARG("gelu_tanh_bwd", x);
  SEAL_ARG("gelu_tanh_bwd", dy);
  SEAL_ARG("gelu_tanh_bwd", dx);
  seal_open();
  ct_backend_cpu.gelu_tanh_bwd(N, D, x, ldx, dy, lddy, dx, lddx);
  seal_close();
}

static void s_quick_gelu_fwd(int N, int D, const float *x, int ldx, float *y, int ldy) {
  SEAL_ARG("quick_gelu_fwd", x);
  SEAL_ARG("quick_gelu_fwd", y);
  seal_open();
  ct_backend_cpu.quick_gelu_fwd(N, D, x, ldx, y, ldy);
  seal_close();
}

static void s_gelu_erf_fwd(int N, int D, const float *x, int ldx, float *y, int ldy) {
  SEAL_ARG("gelu_erf_fwd", x);
  SEAL_ARG("gelu_erf_fwd", y);
  seal_open();
  ct_backend_cpu.gelu_erf_fwd(N, D, x, ldx, y, ldy);
  seal_close();
}

static void s_gelu_erf_bwd(int N, int D, const float *x, int ldx, const float *dy, int lddy,
                           float *dx, int lddx) {
  SEAL_ARG("gelu_erf_bwd", x);
  SEAL_ARG("gelu_erf_bwd", dy);
  SEAL_ARG("gelu_erf_bwd", dx);
  seal_open();
  ct_backend_cpu.gelu_erf_bwd(N, D, x, ldx, dy, lddy, dx, lddx);
  seal_close();
}

static void s_attention_cross_fwd(int B, int H, int Lq, int Lk, int hd, float scale, const float *q,
                                  const float *k, const float *v, float *o, float *lse) {
  SEAL_ARG("attention_cross_fwd", q);
  SEAL_ARG("attention_cross_fwd", k);
  SEAL_ARG("attention_cross_fwd", v);
  SEAL_ARG("attention_cross_fwd", o);
  SEAL_ARG("attention_cross_fwd", lse);
  seal_open();
  ct_backend_cpu.attention_cross_fwd(B, H, Lq, Lk, hd, scale, q, k, v, o, lse);
  seal_close();
}

static void s_attention_cross_bwd(int B, int H, int Lq, int Lk, int hd, float scale, const float *q,
                                  const float *k, const float *v, const float *o, const float *lse,
                                  const float *dout, float *dq, float *dk, float *dv) {
  SEAL_ARG("attention_cross_bwd", q);
  SEAL_ARG("attention_cross_bwd", k);
  SEAL_ARG("attention_cross_bwd", v);
  SEAL_ARG("attention_cross_bwd", o);
  SEAL_ARG("attention_cross_bwd", lse);
  SEAL_ARG("attention_cross_bwd", dout);
  SEAL_ARG("attention_cross_bwd", dq);
  SEAL_ARG("attention_cross_bwd", dk);
  SEAL_ARG("attention_cross_bwd", dv);
  seal_open();
  ct_backend_cpu.attention_cross_bwd(B, H, Lq, Lk, hd, scale, q, k, v, o, lse, dout, dq, dk, dv);
  seal_close();
}

static void s_attention_mask_fwd(int B, int H, int L, int hd, float scale, const float *mask,
                                 int additive, const float *q, const float *k, const float *v,
                                 float *o, float *lse) {
  SEAL_ARG("attention_mask_fwd", mask);
  SEAL_ARG("attention_mask_fwd", q);
  SEAL_ARG("attention_mask_fwd", k);
  SEAL_ARG("attention_mask_fwd", v);
  SEAL_ARG("attention_mask_fwd", o);
  SEAL_ARG("attention_mask_fwd", lse);
  seal_open();
  ct_backend_cpu.attention_mask_fwd(B, H, L, hd, scale, mask, additive, q, k, v, o, lse);
  seal_close();
}

static void s_attention_mask_bwd(int B, int H, int L, int hd, float scale, const float *mask,
                                 int additive, const float *q, const float *k, const float *v,
                                 const float *o, const float *lse, const float *dout, float *dq,
                                 float *dk, float *dv) {
  SEAL_ARG("attention_mask_bwd", mask);
  SEAL_ARG("attention_mask_bwd", q);
  SEAL_ARG("attention_mask_bwd", k);
  SEAL_ARG("attention_mask_bwd", v);
  SEAL_ARG("attention_mask_bwd", o);
  SEAL_ARG("attention_mask_bwd", lse);
  SEAL_ARG("attention_mask_bwd", dout);
  SEAL_ARG("attention_mask_bwd", dq);
  SEAL_ARG("attention_mask_bwd", dk);
  SEAL_ARG("attention_mask_bwd", dv);
  seal_open();
  ct_backend_cpu.attention_mask_bwd(B, H, L, hd, scale, mask, additive, q, k, v, o, lse, dout, dq,
                                    dk, dv);
  seal_close();
}

static void s_gate_res_fwd(int B, int L, int D, const float *x, int ldx, const float *gate, int ldg,
                           const float *y, int ldy, float *out, int ldo) {
  SEAL_ARG("gate_res_fwd", x);
  SEAL_ARG("gate_res_fwd", gate);
  SEAL_ARG("gate_res_fwd", y);
  SEAL_ARG("gate_res_fwd", out);
  seal_open();
  ct_backend_cpu.gate_res_fwd(B, L, D, x, ldx, gate, ldg, y, ldy, out, ldo);
  seal_close();
}

static void s_gate_res_bwd(int B, int L, int D, const float *gate, int ldg, const float *y, int ldy,
                           const float *dout, int lddo, float *dy, int lddy, float *dgate) {
  SEAL_ARG("gate_res_bwd", gate);
  SEAL_ARG("gate_res_bwd", y);
  SEAL_ARG("gate_res_bwd", dout);
  SEAL_ARG("gate_res_bwd", dy);
  SEAL_ARG("gate_res_bwd", dgate);
  seal_open();
  ct_backend_cpu.gate_res_bwd(B, L, D, gate, ldg, y, ldy, dout, lddo, dy, lddy, dgate);
  seal_close();
}

static void s_add_inplace(size_t n, float *y, const float *x) {
  SEAL_ARG("add_inplace", y);
  SEAL_ARG("add_inplace", x);
  seal_open();
  ct_backend_cpu.add_inplace(n, y, x);
  seal_close();
}

static void s_scale_inplace(size_t n, float *x, float c) {
  SEAL_ARG("scale_inplace", x);
  seal_open();
  ct_backend_cpu.scale_inplace(n, x, c);
  seal_close();
}

static void s_mul_inplace(size_t n, float *y, const float *x) {
  SEAL_ARG("mul_inplace", y);
  SEAL_ARG("mul_inplace", x);
  seal_open();
  ct_backend_cpu.mul_inplace(n, y, x);
  seal_close();
}

static void s_copy_2d(int rows, int cols, const float *src, int lds, float *dst, int ldd) {
  SEAL_ARG("copy_2d", src);
  SEAL_ARG("copy_2d", dst);
  seal_open();
  ct_backend_cpu.copy_2d(rows, cols, src, lds, dst, ldd);
  seal_close();
}

static void s_clamp_fwd(int rows, int cols, const float *x, int ldx, float lo, float hi, float *y,
                        int ldy) {
  SEAL_ARG("clamp_fwd", x);
  SEAL_ARG("clamp_fwd", y);
  seal_open();
  ct_backend_cpu.clamp_fwd(rows, cols, x, ldx, lo, hi, y, ldy);
  seal_close();
}

static void s_clamp_bwd(int rows, int cols, const float *x, int ldx, float lo, float hi,
                        const float *dy, int lddy, float *dx, int lddx) {
  SEAL_ARG("clamp_bwd", x);
  SEAL_ARG("clamp_bwd", dy);
  SEAL_ARG("clamp_bwd", dx);
  seal_open();
  ct_backend_cpu.clamp_bwd(rows, cols, x, ldx, lo, hi, dy, lddy, dx, lddx);
  seal_close();
}

static void s_zero(size_t n, float *x) {
  SEAL_ARG("zero", x);
  seal_open();
  ct_backend_cpu.zero(n, x);
  seal_close();
}

static void s_timestep_embedding(int B, const float *t, int dim, float max_period,
                                 float time_factor, float *out) {
  SEAL_ARG("timestep_embedding", t);
  SEAL_ARG("timestep_embedding", out);
  seal_open();
  ct_backend_cpu.timestep_embedding(B, t, dim, max_period, time_factor, out);
  seal_close();
}

static void s_embedding_fwd(int N, int T, int D, const int32_t *ids, const float *tok,
                            const float *pos, float *y) {
  SEAL_ARG("embedding_fwd", tok);
  SEAL_ARG("embedding_fwd", pos);
  SEAL_ARG("embedding_fwd", y);
  seal_open();
  ct_backend_cpu.embedding_fwd(N, T, D, ids, tok, pos, y);
  seal_close();
}

static float s_mse_fwd_bwd(size_t n, const float *pred, const float *target, float dloss,
                           float *dpred) {
  SEAL_ARG("mse_fwd_bwd", pred);
  SEAL_ARG("mse_fwd_bwd", target);
  SEAL_ARG("mse_fwd_bwd", dpred);
  seal_open();
  float r = ct_backend_cpu.mse_fwd_bwd(n, pred, target, dloss, dpred);
  seal_close();
  return r;
}

static void s_adam_update(size_t n, float *w, const float *g, float *m, float *v, float lr,
                          float b1, float b2, float eps, float wd, int decoupled, long step) {
  SEAL_ARG("adam_update", w);
  SEAL_ARG("adam_update", g);
  SEAL_ARG("adam_update", m);
  SEAL_ARG("adam_update", v);
  seal_open();
  ct_backend_cpu.adam_update(n, w, g, m, v, lr, b1, b2, eps, wd, decoupled, step);
  seal_close();
}

static void s_adagrad_update(size_t n, float *w, const float *g, float *sum, float lr,
                             float lr_decay, float eps, float wd, long step) {
  SEAL_ARG("adagrad_update", w);
  SEAL_ARG("adagrad_update", g);
  SEAL_ARG("adagrad_update", sum);
  seal_open();
  ct_backend_cpu.adagrad_update(n, w, g, sum, lr, lr_decay, eps, wd, step);
  seal_close();
}

static void s_lion_update(size_t n, float *w, const float *g, float *m, float lr, float b1,
                          float b2, float wd) {
  SEAL_ARG("lion_update", w);
  SEAL_ARG("lion_update", g);
  SEAL_ARG("lion_update", m);
  seal_open();
  ct_backend_cpu.lion_update(n, w, g, m, lr, b1, b2, wd);
  seal_close();
}

static void s_sgd_update(size_t n, float *w, const float *g, float *buf, float lr, float momentum,
                         float dampening, int nesterov, float wd, long step) {
  SEAL_ARG("sgd_update", w);
  SEAL_ARG("sgd_update", g);
  SEAL_ARG("sgd_update", buf);
  seal_open();
  ct_backend_cpu.sgd_update(n, w, g, buf, lr, momentum, dampening, nesterov, wd, step);
  seal_close();
}

static void s_ema_update(size_t n, float *e, const float *w, float decay) {
  SEAL_ARG("ema_update", e);
  SEAL_ARG("ema_update", w);
  seal_open();
  ct_backend_cpu.ema_update(n, e, w, decay);
  seal_close();
}

static double s_sumsq(size_t n, const float *x) {
  SEAL_ARG("sumsq", x);
  seal_open();
  double r = ct_backend_cpu.sumsq(n, x);
  seal_close();
  return r;
}

static void s_bf16_widen(size_t n, const uint16_t *src, float *dst) {
  SEAL_ARG("bf16_widen", src);
  SEAL_ARG("bf16_widen", dst);
  seal_open();
  ct_backend_cpu.bf16_widen(n, src, dst);
  seal_close();
}

static void s_bf16_narrow(size_t n, const float *src, uint16_t *dst) {
  SEAL_ARG("bf16_narrow", src);
  SEAL_ARG("bf16_narrow", dst);
  seal_open();
  ct_backend_cpu.bf16_narrow(n, src, dst);
  seal_close();
}

static void s_bf16_narrow_acc(size_t n, const float *src, uint16_t *dst) {
  SEAL_ARG("bf16_narrow_acc", src);
  SEAL_ARG("bf16_narrow_acc", dst);
  seal_open();
  ct_backend_cpu.bf16_narrow_acc(n, src, dst);
  seal_close();
}

static void s_dropout_fwd(int N, int D, const float *x, int ldx, uint64_t seed, uint64_t stream,
                          const uint64_t *ctr, float p, float *xd) {
  SEAL_ARG("dropout_fwd", x);
  SEAL_ARG("dropout_fwd", xd);
  seal_open();
  ct_backend_cpu.dropout_fwd(N, D, x, ldx, seed, stream, ctr, p, xd);
  seal_close();
}

static void s_dropout_bwd(int N, int D, const float *dxd, uint64_t seed, uint64_t stream,
                          const uint64_t *ctr, float p, float *dx, int lddx) {
  SEAL_ARG("dropout_bwd", dxd);
  SEAL_ARG("dropout_bwd", dx);
  seal_open();
  ct_backend_cpu.dropout_bwd(N, D, dxd, seed, stream, ctr, p, dx, lddx);
  seal_close();
}

const ct_backend_ops ct_backend_sealed = {
    .name = "sealed",
    .description =
        "test backend: the cpu kernels on memory the host cannot touch (PROT_NONE "
        "outside the table's functions); proves residency without a GPU",
    .precision_bits = 24,
    .compute = CT_COMPUTE_F32,
    .host_memory = 0,
    .check = s_check,

    .alloc = s_alloc,
    .free = s_free,
    .copy_in = s_copy_in,
    .copy_out = s_copy_out,
    .copy = s_copy,
    .synchronize = s_synchronize,

    .sgemm = s_sgemm,
    .sgemm_deterministic = s_sgemm_deterministic,
    .linear_fwd = s_linear_fwd,
    .linear_bwd = s_linear_bwd,
    .linear_fwd_w = s_linear_fwd_w,
    .linear_bwd_w = s_linear_bwd_w,
    .attention_fwd = s_attention_fwd,
    .attention_bias_fwd = s_attention_bias_fwd,
    .attention_bwd = s_attention_bwd,
    .attention_cross_fwd = s_attention_cross_fwd,
    .attention_cross_bwd = s_attention_cross_bwd,
    .attention_mask_fwd = s_attention_mask_fwd,
    .attention_mask_bwd = s_attention_mask_bwd,
    .rope_table = s_rope_table,
    .rope_fwd = s_rope_fwd,
    .rope_bwd = s_rope_bwd,
    .qkv_heads_fwd = s_qkv_heads_fwd,
    .qkv_heads_bwd = s_qkv_heads_bwd,
    .ln_mod_fwd = s_ln_mod_fwd,
    .ln_mod_bwd = s_ln_mod_bwd,
    .layernorm_affine_fwd = s_layernorm_affine_fwd,
    .rmsnorm_fwd = s_rmsnorm_fwd,
    .rmsnorm_bwd = s_rmsnorm_bwd,
    .groupnorm_fwd = s_groupnorm_fwd,
    .groupnorm_bwd = s_groupnorm_bwd,
    .conv2d_col_floats = s_conv2d_col_floats,
    .conv2d_fwd = s_conv2d_fwd,
    .conv2d_bwd = s_conv2d_bwd,
    .upsample2x_fwd = s_upsample2x_fwd,
    .upsample2x_bwd = s_upsample2x_bwd,
    .nchw_to_nlc = s_nchw_to_nlc,
    .nlc_to_nchw = s_nlc_to_nchw,
    .tile_blend = s_tile_blend,
    .patchify = s_patchify,
    .unpatchify = s_unpatchify,
    .silu_fwd = s_silu_fwd,
    .silu_bwd = s_silu_bwd,
    .gelu_tanh_fwd = s_gelu_tanh_fwd,
    .gelu_tanh_bwd = s_gelu_tanh_bwd,
    .quick_gelu_fwd = s_quick_gelu_fwd,
    .gelu_erf_fwd = s_gelu_erf_fwd,
    .gelu_erf_bwd = s_gelu_erf_bwd,
    .gate_res_fwd = s_gate_res_fwd,
    .gate_res_bwd = s_gate_res_bwd,
    .add_inplace = s_add_inplace,
    .scale_inplace = s_scale_inplace,
    .mul_inplace = s_mul_inplace,
    .copy_2d = s_copy_2d,
    .clamp_fwd = s_clamp_fwd,
    .clamp_bwd = s_clamp_bwd,
    .zero = s_zero,
    .timestep_embedding = s_timestep_embedding,
    .embedding_fwd = s_embedding_fwd,
    .mse_fwd_bwd = s_mse_fwd_bwd,
    .adam_update = s_adam_update,
    .adagrad_update = s_adagrad_update,
    .lion_update = s_lion_update,
    .sgd_update = s_sgd_update,
    .ema_update = s_ema_update,
    .sumsq = s_sumsq,
    .bf16_widen = s_bf16_widen,
    .bf16_narrow = s_bf16_narrow,
    .bf16_narrow_acc = s_bf16_narrow_acc,
    .dropout_fwd = s_dropout_fwd,
    .dropout_bwd = s_dropout_bwd,
};

static ct_backend_ops sealed_bf16;
static once_flag sealed_bf16_once = ONCE_FLAG_INIT;

static void sealed_bf16_init(void) {
  bf16_inner = ct_backend_cpu_bf16();
  sealed_bf16 = ct_backend_sealed;
  sealed_bf16.name = "sealed-bf16";
  sealed_bf16.description =
      "test backend: the cpu-bf16 kernels on sealed memory (the sealed backend's; bf16 matrix "
      "products)";
  sealed_bf16.precision_bits = 8;
  sealed_bf16.compute = CT_COMPUTE_BF16;
  sealed_bf16.sgemm = sb_sgemm;
  sealed_bf16.linear_fwd = sb_linear_fwd;
  sealed_bf16.linear_bwd = sb_linear_bwd;
  sealed_bf16.attention_fwd = sb_attention_fwd;
  sealed_bf16.attention_bwd = sb_attention_bwd;
  sealed_bf16.conv2d_fwd = sb_conv2d_fwd;
  sealed_bf16.conv2d_bwd = sb_conv2d_bwd;
}

const ct_backend_ops *ct_backend_sealed_bf16(void) {
  call_once(&sealed_bf16_once, sealed_bf16_init);
  return &sealed_bf16;
}

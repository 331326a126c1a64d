/* Tensor-wise optimizer rules: Lamb's trust ratio and Muon's orthogonalised
 * update, plus the deterministic sum of squares they share.
 *
 * Reductions split a tensor into blocks whose bounds depend only on its
 * length (at most MAX_BLOCKS), reduce each block in double, and add the block
 * sums in block order; OpenMP only decides which thread computes which block,
 * so norms (and therefore updates) are bit-identical for any thread count.
 * Muon's Newton–Schulz iteration runs in float32 with the kernel layer's
 * ct_sgemm_deterministic (include/ctuner/kernels.h): bitwise identical for any
 * thread count on the AVX-512 and the OpenBLAS path alike; the caller provides
 * the scratch.
 * Not here: elementwise rules (optim_elem.c), the table walk (optim.c).
 */
#include <math.h>
#include <string.h>

#include "ctuner/kernels.h"
#include "optim_int.h"

#define MAX_BLOCKS 64
#define MIN_BLOCK 2048

static int nblocks(size_t n) {
  size_t nb = n / MIN_BLOCK;
  if (nb < 1) nb = 1;
  if (nb > MAX_BLOCKS) nb = MAX_BLOCKS;
  return (int)nb;
}

double ct_optim_sumsq(size_t n, const float *x) {
  double part[MAX_BLOCKS];
  const int nb = nblocks(n);
#pragma omp parallel for schedule(static) if (nb > 1)
  for (int b = 0; b < nb; b++) {
    size_t lo = n * (size_t)b / (size_t)nb, hi = n * (size_t)(b + 1) / (size_t)nb;
    double s = 0.0;
    for (size_t i = lo; i < hi; i++) s += (double)x[i] * (double)x[i];
    part[b] = s;
  }
  double s = 0.0;
  for (int b = 0; b < nb; b++) s += part[b];
  return s;
}

/* Lamb (You et al. 2019, Algorithm 2, with Adam's bias correction):
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   r = (m/bc1) / (sqrt(v)/sqrt(bc2) + eps) + wd w
 *   w -= lr * (|w|/|r|) * r     (ratio 1 if either norm is 0)
 * The ratio is clamped to [lamb_min_coeff, lamb_max_coeff] where they are set
 * (DeepSpeed's FusedLamb: max first, then min); step is LONG_MAX without bias
 * correction (ct_optim_bc_step: bc1 = bc2 = 1 exactly).
 * Pass 1 updates the moments and reduces |w|^2, |r|^2; pass 2 recomputes r
 * from the stored moments (same arithmetic, same bits) and applies it. */
void ct_optim_lamb_tensor(size_t n, float *w, const float *g, float *m, float *v, float lr,
                          const ct_optim_hp *hp, long step) {
  const float b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps, wd = hp->weight_decay;
  const float a1 = 1.0f - b1, a2 = 1.0f - b2;
  const float bc1 = (float)(1.0 - pow((double)b1, (double)step));
  const float bc2_sqrt = (float)sqrt(1.0 - pow((double)b2, (double)step));
  double pw[MAX_BLOCKS], pr[MAX_BLOCKS];
  const int nb = nblocks(n);
#pragma omp parallel for schedule(static) if (nb > 1)
  for (int b = 0; b < nb; b++) {
    size_t lo = n * (size_t)b / (size_t)nb, hi = n * (size_t)(b + 1) / (size_t)nb;
    double sw = 0.0, sr = 0.0;
    for (size_t i = lo; i < hi; i++) {
      float gi = g[i], wi = w[i];
      float mi = m[i] * b1 + a1 * gi;
      float vi = v[i] * b2 + a2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      float r = (mi / bc1) / (sqrtf(vi) / bc2_sqrt + eps) + wd * wi;
      sw += (double)wi * (double)wi;
      sr += (double)r * (double)r;
    }
    pw[b] = sw;
    pr[b] = sr;
  }
  double sw = 0.0, sr = 0.0;
  for (int b = 0; b < nb; b++) {
    sw += pw[b];
    sr += pr[b];
  }
  const double wn = sqrt(sw), rn = sqrt(sr);
  float trust = 1.0f;
  if (wn > 0.0 && rn > 0.0) {
    trust = (float)(wn / rn);
    if (hp->lamb_max_coeff > 0 && trust > hp->lamb_max_coeff) trust = hp->lamb_max_coeff;
    if (hp->lamb_min_coeff > 0 && trust < hp->lamb_min_coeff) trust = hp->lamb_min_coeff;
  }
  const float step_size = lr * trust;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float wi = w[i];
    float r = (m[i] / bc1) / (sqrtf(v[i]) / bc2_sqrt + eps) + wd * wi;
    w[i] = wi - step_size * r;
  }
}

/* C = alpha A op(B) + beta C (row-major, A is m x k, C is m x ncol), the same
 * bits for any thread count. */
static void gemm_rows(int transb, int m, int ncol, int k, float alpha, const float *a,
                      const float *b, int ldb, float beta, float *c) {
  ct_sgemm_deterministic(0, transb, m, ncol, k, alpha, a, k, b, ldb, beta, c, ncol);
}

size_t ct_optim_muon_scratch(int rows, int cols) {
  size_t p = (size_t)(rows < cols ? rows : cols), q = (size_t)(rows < cols ? cols : rows);
  return 2 * p * q + 2 * p * p;
}

/* Muon (Keller Jordan, 2024) on one rows x cols weight (row-major [out, in]):
 *   buf = mu buf + g;  u = nesterov ? g + mu buf : buf
 *   X = u (transposed if rows > cols, so X is p x q with p <= q), X /= |X|_F + 1e-7
 *   repeat ns_steps: A = X X^T; B = b A + c A A; X = a X + B X
 *   w = w (1 - lr wd) - lr sqrt(max(1, rows/cols)) X (transposed back) */
void ct_optim_muon_tensor(int rows, int cols, float *w, const float *g, float *buf, float lr,
                          const ct_optim_hp *hp, float *scratch) {
  const float mu = hp->muon_momentum;
  const int nesterov = hp->nesterov, trans = rows > cols;
  const int p = trans ? cols : rows, q = trans ? rows : cols;
  const size_t pq = (size_t)p * (size_t)q;
  float *x = scratch, *x2 = scratch + pq, *a = scratch + 2 * pq, *bm = a + (size_t)p * (size_t)p;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < rows; i++) {
    for (int j = 0; j < cols; j++) {
      size_t k = (size_t)i * (size_t)cols + (size_t)j;
      float b = mu * buf[k] + g[k];
      buf[k] = b;
      float u = nesterov ? g[k] + mu * b : b;
      x[trans ? (size_t)j * (size_t)rows + (size_t)i : k] = u;
    }
  }
  const float inv = 1.0f / ((float)sqrt(ct_optim_sumsq(pq, x)) + 1e-7f);
#pragma omp parallel for simd schedule(static)
  for (size_t k = 0; k < pq; k++) x[k] *= inv;
  const float ca = 3.4445f, cb = -4.7750f, cc = 2.0315f;
  for (int s = 0; s < hp->muon_ns_steps; s++) {
    gemm_rows(1, p, p, q, 1.0f, x, x, q, 0.0f, a); /* A = X X^T */
    memcpy(bm, a, (size_t)p * (size_t)p * sizeof *bm);
    gemm_rows(0, p, p, p, cc, a, a, p, cb, bm); /* B = b A + c A A */
    memcpy(x2, x, pq * sizeof *x2);
    gemm_rows(0, p, q, p, 1.0f, bm, x, q, ca, x2); /* X = a X + B X */
    float *t = x;
    x = x2;
    x2 = t;
  }
  const float scale = rows > cols ? sqrtf((float)rows / (float)cols) : 1.0f;
  const float step_size = lr * scale, decay = (float)(1.0 - (double)lr * (double)hp->weight_decay);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < rows; i++) {
    for (int j = 0; j < cols; j++) {
      size_t k = (size_t)i * (size_t)cols + (size_t)j;
      float u = x[trans ? (size_t)j * (size_t)rows + (size_t)i : k];
      w[k] = w[k] * decay - step_size * u;
    }
  }
}

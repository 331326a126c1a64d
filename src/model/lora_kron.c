/* LoKr adapters without their rebuilt weight (lora_impl.h): ΔW = s kron(W1,
 * W2), W1 [ol, im], W2 [ok, in] (out = ol ok, in = im in). A token's input
 * x viewed as X [im, in] gives ΔW x = s W1 X W2ᵀ, [ol, ok] = the out rows in
 * order, so the forward is two GEMMs over all tokens (the left product
 * through a transposition of the token and im axes), never an out × in
 * matrix; the backward likewise: dX = s W1ᵀ dY W2, dW1 = s Σ dY (X W2ᵀ)ᵀ,
 * dW2 = s Σ dYᵀ (W1 X), then the factors' gradients when a half is split
 * (w_a w_b). The same numbers as LyCORIS's rebuilt kron (tests/test_lycoris.c). */
#include <string.h>

#include "lora_impl.h"

/* dst [B, A, C] = src [A, B, C] with the first two axes swapped. */
static void swap01(const float *src, int A, int B, int C, float *dst) {
  for (int a = 0; a < A; a++)
    for (int b = 0; b < B; b++)
      memcpy(dst + ((size_t)b * A + a) * C, src + ((size_t)a * B + b) * C,
             (size_t)C * sizeof(float));
}

typedef struct kdims {
  int ol, ok, im, in, N; /* N: tokens per pass (a chunk) */
  size_t m;              /* floats per work buffer */
} kdims;

#define KRON_BUDGET ((size_t)1 << 22) /* floats per work buffer (16 MB) unless l->kron_chunk */

/* The dims of passes over at most `chunk` tokens (l->kron_chunk, else as many
 * as the budget allows), so the scratch stays bounded whatever N is. */
static kdims dims_of(const ct_lora *l, const ct_lora_adapter *a, int N) {
  kdims d = {a->lokr[0], a->lokr[1], a->lokr[2], a->lokr[3], N, 0};
  size_t m = (size_t)a->in > (size_t)a->out ? (size_t)a->in : (size_t)a->out;
  const size_t u = (size_t)d.ol * d.in, z = (size_t)d.im * d.ok;
  if (u > m) m = u;
  if (z > m) m = z;
  size_t c = l->kron_chunk ? l->kron_chunk : KRON_BUDGET / m;
  if (c < 1) c = 1;
  if ((size_t)N > c) d.N = (int)c;
  d.m = m * (size_t)d.N;
  return d;
}

/* W1, W2 whole (a half given as w_a w_b is multiplied out: they are small). */
static void factors(const ct_backend_ops *be, const ct_lora *l, const ct_lora_adapter *a,
                    const kdims *d, float *w1, float *w2) {
  int k = 0;
  for (int h = 0; h < 2; h++) {
    const int full = h ? a->w2_full : a->w1_full, m = h ? d->ok : d->ol, c = h ? d->in : d->im;
    float *w = h ? w2 : w1;
    if (full) {
      memcpy(w, ct_lora_t(l, a, k++), (size_t)m * c * sizeof(float));
      continue;
    }
    be->sgemm(0, 0, m, c, a->rank, 1.0f, ct_lora_t(l, a, k), a->rank, ct_lora_t(l, a, k + 1), c,
              0.0f, w, c);
    k += 2;
  }
}

/* The tokens' inputs contiguous [N, in] (x itself when already so). */
static const float *contiguous(const ct_backend_ops *be, const ct_lora_adapter *a, int N,
                               const float *x, int ldx, float *buf) {
  if (ldx == a->in) return x;
  be->copy_2d(N, a->in, x, ldx, buf, a->in);
  return buf;
}

/* U = W1 X per token, [N, ol, in] into u (t: scratch). */
static void left(const ct_backend_ops *be, const kdims *d, const float *w1, const float *xc,
                 float *t, float *u) {
  float *xt = t, *up = u;
  swap01(xc, d->N, d->im, d->in, xt); /* [im, N, in] */
  be->sgemm(0, 0, d->ol, d->N * d->in, d->im, 1.0f, w1, d->im, xt, d->N * d->in, 0.0f, up,
            d->N * d->in); /* [ol, N, in] */
  swap01(up, d->ol, d->N, d->in, t);
  memcpy(u, t, (size_t)d->N * d->ol * d->in * sizeof(float));
}

void ct_lokr_fwd(ct_lora *l, const ct_backend_ops *be, const ct_lora_adapter *a, int row_lo, int N,
                 const float *x, int ldx, float *y, int ldy) {
  kdims d = dims_of(l, a, N);
  const int C = d.N;
  float *w1 = ct_lora_dense(l, 3 * d.m + (size_t)d.ol * d.im + (size_t)d.ok * d.in);
  float *w2 = w1 + (size_t)d.ol * d.im, *b0 = w2 + (size_t)d.ok * d.in, *b1 = b0 + d.m,
        *b2 = b1 + d.m;
  factors(be, l, a, &d, w1, w2);
  for (int n0 = 0; n0 < N; n0 += C) {
    const int nc = N - n0 < C ? N - n0 : C;
    d.N = nc;
    const float *xc = contiguous(be, a, nc, x + (size_t)n0 * ldx, ldx, b0);
    left(be, &d, w1, xc, b1, b2); /* U: b2 */
    be->sgemm(0, 1, nc * d.ol, d.ok, d.in, 1.0f, b2, d.in, w2, d.in, 0.0f, b1,
              d.ok); /* [nc, out] */
    for (int p = 0; p < a->npieces; p++) {
      const ct_lora_piece *pc = &a->piece[p];
      for (int n = 0; n < nc; n++) {
        float *yr = y + (size_t)(n0 + n) * ldy + (pc->bfl_row - row_lo);
        const float *src = b1 + (size_t)n * a->out + pc->dif_row;
        for (int64_t r = 0; r < pc->rows; r++) yr[r] += a->scale * src[r];
      }
    }
  }
}

/* dW1 and dW2 (d1 [ol, im], d2 [ok, in], the scale included) into the tensors'
 * gradients: whole, or through their two factors. */
static void factor_grads(const ct_backend_ops *be, const ct_lora *l, const ct_lora_adapter *a,
                         const kdims *d, const float *d1, const float *d2) {
  int k = 0;
  for (int h = 0; h < 2; h++) {
    const int full = h ? a->w2_full : a->w1_full, m = h ? d->ok : d->ol, c = h ? d->in : d->im;
    const float *g = h ? d2 : d1;
    if (full) {
      float *gw = ct_lora_gt(l, a, k++);
      for (size_t i = 0; i < (size_t)m * c; i++) gw[i] += g[i];
      continue;
    }
    float *ga = ct_lora_gt(l, a, k), *gb = ct_lora_gt(l, a, k + 1);
    be->sgemm(0, 1, m, a->rank, c, 1.0f, g, c, ct_lora_t(l, a, k + 1), c, 1.0f, ga, a->rank);
    be->sgemm(1, 0, a->rank, c, m, 1.0f, ct_lora_t(l, a, k), a->rank, g, c, 1.0f, gb, c);
    k += 2;
  }
}

/* One pass of the backward over d->N tokens: dx (if any), and dW1, dW2 added
 * into d1, d2 (beta 0 on the first pass). */
static void bwd_pass(const ct_lora *l, const ct_backend_ops *be, const ct_lora_adapter *a,
                     const kdims *dd, const float *w1, const float *w2, float *d1, float *d2,
                     float *b0, int row_lo, const float *x, int ldx, const float *dy, int lddy,
                     float *dx, int lddx, float beta) {
  const kdims d = *dd;
  const int N = d.N;
  float *b1 = b0 + d.m, *b2 = b1 + d.m, *b3 = b2 + d.m;
  for (int p = 0; p < a->npieces; p++) { /* dY [N, out] = [N ol, ok] */
    const ct_lora_piece *pc = &a->piece[p];
    be->copy_2d(N, (int)pc->rows, dy + (pc->bfl_row - row_lo), lddy, b3 + pc->dif_row, a->out);
  }
  if (dx) { /* dX = s W1ᵀ (dY W2) per token */
    be->sgemm(0, 0, N * d.ol, d.in, d.ok, 1.0f, b3, d.ok, w2, d.in, 0.0f, b1, d.in); /* V */
    swap01(b1, N, d.ol, d.in, b2); /* [ol, N, in] */
    be->sgemm(1, 0, d.im, N * d.in, d.ol, 1.0f, w1, d.im, b2, N * d.in, 0.0f, b1, N * d.in);
    swap01(b1, d.im, N, d.in, b2); /* [N, im, in] */
    for (int n = 0; n < N; n++)
      for (int c = 0; c < a->in; c++)
        dx[(size_t)n * lddx + c] += a->scale * b2[(size_t)n * a->in + c];
  }
  if (!ct_lora_gt(l, a, 0)) return; /* this segment keeps no gradient */
  const float *xc = contiguous(be, a, N, x, ldx, b0);
  /* dW1 = s dYt Ztᵀ: Z = X W2ᵀ [N, im, ok] -> Zt [im, N, ok]; dYt [ol, N, ok] */
  be->sgemm(0, 1, N * d.im, d.ok, d.in, 1.0f, xc, d.in, w2, d.in, 0.0f, b1, d.ok);
  swap01(b1, N, d.im, d.ok, b2);
  swap01(b3, N, d.ol, d.ok, b1);
  be->sgemm(0, 1, d.ol, d.im, N * d.ok, a->scale, b1, N * d.ok, b2, N * d.ok, beta, d1, d.im);
  /* dW2 = s dYᵀ U over the N ol rows */
  left(be, &d, w1, xc, b1, b2);
  be->sgemm(1, 0, d.ok, d.in, N * d.ol, a->scale, b3, d.ok, b2, d.in, beta, d2, d.in);
}

void ct_lokr_bwd(ct_lora *l, const ct_backend_ops *be, const ct_lora_adapter *a, int row_lo, int N,
                 const float *x, int ldx, const float *dy, int lddy, float *dx, int lddx) {
  kdims d = dims_of(l, a, N);
  const int C = d.N;
  const size_t f1 = (size_t)d.ol * d.im, f2 = (size_t)d.ok * d.in;
  float *w1 = ct_lora_dense(l, 4 * d.m + 2 * (f1 + f2));
  float *w2 = w1 + f1, *d1 = w2 + f2, *d2 = d1 + f1, *b0 = d2 + f2;
  factors(be, l, a, &d, w1, w2);
  for (int n0 = 0; n0 < N; n0 += C) {
    d.N = N - n0 < C ? N - n0 : C;
    bwd_pass(l, be, a, &d, w1, w2, d1, d2, b0, row_lo, x + (size_t)n0 * ldx, ldx,
             dy + (size_t)n0 * lddy, lddy, dx ? dx + (size_t)n0 * lddx : NULL, lddx,
             n0 ? 1.0f : 0.0f);
  }
  if (ct_lora_gt(l, a, 0)) factor_grads(be, l, a, &d, d1, d2);
}

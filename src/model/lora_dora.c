/* peft's DoRA (use_dora) on a standard LoRA adapter (lora_impl.h): with
 * V = W + s B A (the module's rows of the base weight W) and the per-row
 * norm n = ||V_o|| treated as a constant (peft detaches it, DoRA paper §4.3),
 * g = m / n, the output is  base(x) + (g - 1) (x Wᵀ) + g s B A x, i.e.
 * b + g (x Vᵀ). The backward: dm = Σ dy (x Vᵀ) / n, the LoRA gradients with
 * dy replaced by g dy, dx += (g - 1) dy W + s (g dy) B A. The base rows and
 * bias come from ct_lora_bind_base (the MMDiT binds them with its views). */
#include <math.h>
#include <string.h>

#include "lora_impl.h"

/* The base weight row of module row o (through the pieces), bias into *bias. */
static const float *base_row(const lora_site *st, const ct_lora_adapter *a, int o, float *bias) {
  for (int p = 0; p < a->npieces; p++) {
    const ct_lora_piece *pc = &a->piece[p];
    if (o >= pc->dif_row && o < pc->dif_row + pc->rows) {
      const int64_t r = pc->bfl_row + (o - pc->dif_row);
      *bias = st->b ? st->b[r] : 0.0f;
      return st->w + r * a->in;
    }
  }
  return NULL;
}

/* g = m / ||W_o + s (B A)_o|| per module row (ba: out x in scratch, nrm: out). */
static void dora_scale(const ct_backend_ops *be, const ct_lora *l, const lora_site *st,
                       const ct_lora_adapter *a, float *ba, float *nrm, float *g) {
  const float *A = ct_lora_t(l, a, 0), *B = ct_lora_t(l, a, 1), *m = ct_lora_t(l, a, 2);
  be->sgemm(0, 0, a->out, a->in, a->rank, a->scale, B, a->rank, A, a->in, 0.0f, ba, a->in);
  for (int o = 0; o < a->out; o++) {
    float bias;
    const float *w = base_row(st, a, o, &bias), *d = ba + (size_t)o * a->in;
    double acc = 0;
    for (int c = 0; c < a->in; c++) acc += ((double)w[c] + d[c]) * ((double)w[c] + d[c]);
    nrm[o] = (float)sqrt(acc);
    g[o] = m[o] / nrm[o];
  }
}

void ct_dora_init(const ct_lora *l, size_t i, float *mag) {
  const ct_lora_adapter *a = &l->ad[i];
  const lora_site *st = NULL;
  for (int k = 0; k < l->nsites && !st; k++)
    if ((int)i >= l->sites[k].first && (int)i < l->sites[k].first + l->sites[k].n)
      st = &l->sites[k];
  for (int o = 0; o < a->out; o++) {
    float bias;
    const float *w = st && st->w ? base_row(st, a, o, &bias) : NULL;
    double acc = 0;
    for (int c = 0; w && c < a->in; c++) acc += (double)w[c] * w[c];
    mag[o] = (float)sqrt(acc); /* peft: ||W + s B A|| with B = 0 */
  }
}

void ct_dora_fwd(ct_lora *l, const ct_backend_ops *be, int si, const ct_lora_adapter *a, int row_lo,
                 int N, const float *x, int ldx, float *y, int ldy) {
  const lora_site *st = &l->sites[si];
  const int out = a->out, r = a->rank;
  float *ba =
      ct_lora_dense(l, (size_t)out * a->in + 2 * (size_t)out + (size_t)N * r + (size_t)N * out);
  float *nrm = ba + (size_t)out * a->in, *g = nrm + out, *u = g + out, *t = u + (size_t)N * r;
  dora_scale(be, l, st, a, ba, nrm, g);
  be->sgemm(0, 1, N, r, a->in, 1.0f, x, ldx, ct_lora_t(l, a, 0), a->in, 0.0f, u, r);
  be->sgemm(0, 1, N, out, r, a->scale, u, r, ct_lora_t(l, a, 1), r, 0.0f, t, out);
  for (int p = 0; p < a->npieces; p++) {
    const ct_lora_piece *pc = &a->piece[p];
    for (int n = 0; n < N; n++) {
      float *yr = y + (size_t)n * ldy + (pc->bfl_row - row_lo);
      const float *tr = t + (size_t)n * out + pc->dif_row;
      for (int64_t j = 0; j < pc->rows; j++) {
        const int64_t o = pc->dif_row + j;
        const float b = st->b ? st->b[pc->bfl_row + j] : 0.0f;
        yr[j] += (g[o] - 1.0f) * (yr[j] - b) + g[o] * tr[j];
      }
    }
  }
}

void ct_dora_bwd(ct_lora *l, const ct_backend_ops *be, int si, const ct_lora_adapter *a, int row_lo,
                 int N, const float *x, int ldx, const float *dy, int lddy, float *dx, int lddx) {
  const lora_site *st = &l->sites[si];
  const int out = a->out, r = a->rank, in = a->in;
  const size_t no = (size_t)N * out;
  float *ba = ct_lora_dense(l, (size_t)out * in + 2 * (size_t)out + 2 * (size_t)N * r + 3 * no);
  float *nrm = ba + (size_t)out * in, *g = nrm + out, *u = g + out, *gu = u + (size_t)N * r;
  float *t = gu + (size_t)N * r, *bo = t + no, *dyg = bo + no;
  dora_scale(be, l, st, a, ba, nrm, g);
  const float *A = ct_lora_t(l, a, 0), *B = ct_lora_t(l, a, 1);
  float *gA = ct_lora_gt(l, a, 0), *gB = ct_lora_gt(l, a, 1), *gm = ct_lora_gt(l, a, 2);
  be->sgemm(0, 1, N, r, in, 1.0f, x, ldx, A, in, 0.0f, u, r);
  be->sgemm(0, 1, N, out, r, a->scale, u, r, B, r, 0.0f, t, out); /* s B A x */
  for (int p = 0; p < a->npieces; p++) {                          /* x Wᵀ, dy gathered */
    const ct_lora_piece *pc = &a->piece[p];
    if (gm)
      be->sgemm(0, 1, N, (int)pc->rows, in, 1.0f, x, ldx, st->w + pc->bfl_row * in, in, 0.0f,
                bo + pc->dif_row, out);
    be->copy_2d(N, (int)pc->rows, dy + (pc->bfl_row - row_lo), lddy, dyg + pc->dif_row, out);
  }
  if (gm)
    for (int n = 0; n < N; n++)
      for (int o = 0; o < out; o++) {
        const size_t k = (size_t)n * out + o;
        gm[o] += dyg[k] * (bo[k] + t[k]) / nrm[o];
      }
  if (dx) /* (g - 1) dy W, through the pieces (bo reused for (g - 1) dy) */
    for (int p = 0; p < a->npieces; p++) {
      const ct_lora_piece *pc = &a->piece[p];
      for (int n = 0; n < N; n++)
        for (int64_t j = 0; j < pc->rows; j++) {
          const int64_t o = pc->dif_row + j;
          bo[(size_t)n * out + o] = (g[o] - 1.0f) * dyg[(size_t)n * out + o];
        }
      be->sgemm(0, 0, N, in, (int)pc->rows, 1.0f, bo + pc->dif_row, out, st->w + pc->bfl_row * in,
                in, 1.0f, dx, lddx);
    }
  for (int n = 0; n < N; n++)
    for (int o = 0; o < out; o++) dyg[(size_t)n * out + o] *= g[o];
  be->sgemm(0, 0, N, r, out, 1.0f, dyg, out, B, r, 0.0f, gu, r); /* gu = (g dy) B */
  if (gB) be->sgemm(1, 0, out, r, N, a->scale, dyg, out, u, r, 1.0f, gB, r);
  if (gA) be->sgemm(1, 0, r, in, N, a->scale, gu, r, x, ldx, 1.0f, gA, in);
  if (dx) be->sgemm(0, 0, N, in, r, a->scale, gu, r, A, in, 1.0f, dx, lddx);
}

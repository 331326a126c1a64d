/* Frozen weights in their stored dtype (kernels.h ct_wview, docs/gemm.md):
 * the GEMM with B a bf16 or int8 weight view on every path this machine has
 * (AVX-512, AVX2, OpenBLAS over dequantised blocks) against a double
 * reference of the dequantised weight — odd sizes, both transposes of A and of
 * the weight, alpha/beta, padded leading dimensions —; bitwise equality with
 * ct_sgemm on a float32 copy of the dequantised weight and across 1, 2 and 3
 * threads on our kernels; the linear layer over a view; the int8 quantisers
 * against optimum-quanto's and torchao's own tensors (tests/data/quant,
 * scripts/quant_golden.py) and their invariants. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/bf16.h"
#include "ctuner/safetensors.h"
#include "harness.h"
#include "kernels/gemm.h"

static uint64_t rng_s = 1;
static float frand(void) { /* uniform in [-1, 1) */
  rng_s ^= rng_s << 13;
  rng_s ^= rng_s >> 7;
  rng_s ^= rng_s << 17;
  return (float)((double)(rng_s >> 40) / (double)(1ull << 23) - 1.0);
}
static float *randv(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = frand();
  return p;
}

/* A weight of rows x ld stored as dt: the view and its float32 dequantised copy. */
typedef struct qw {
  ct_wview v;
  void *data;
  float *scales, *deq;
} qw;

static qw make_w(ct_wdtype dt, ct_quant_kind kind, int rows, int ld) {
  qw q = {{dt, NULL, NULL}, NULL, NULL, NULL};
  size_t n = (size_t)rows * ld;
  float *w = randv(n);
  for (int r = 0; r < rows; r++) /* rows of different magnitudes: per-row scales matter */
    for (int c = 0; c < ld; c++) w[(size_t)r * ld + c] *= 0.01f + (float)(r % 7);
  q.data = malloc(n * ct_wdtype_size(dt) + 1);
  if (dt == CT_WDT_BF16) {
    ct_to_bf16(n, w, q.data);
  } else if (dt == CT_WDT_I8) {
    q.scales = malloc((size_t)rows * sizeof(float));
    ct_quantize_int8(kind, rows, ld, w, q.data, q.scales);
  } else {
    memcpy(q.data, w, n * sizeof(float));
  }
  q.v.data = q.data;
  q.v.scales = q.scales;
  q.deq = malloc(n * sizeof(float));
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < ld; c++) q.deq[(size_t)r * ld + c] = ct_wview_at(q.v, ld, r, c);
  free(w);
  return q;
}
static void free_w(qw *q) {
  free(q->data), free(q->scales), free(q->deq);
}

static const char *const wpaths[] = {"avx512", "avx2", "blas"};
static const ct_wdtype wdts[] = {CT_WDT_BF16, CT_WDT_I8};

/* One product against the double reference of the dequantised weight. */
static int check_w(ct_sgemm_w_fn f, ct_wdtype dt, int tA, int tB, int M, int N, int K, float alpha,
                   float beta, int pad) {
  int lda = (tA ? M : K) + pad, ldb = (tB ? K : N) + pad, ldc = N + pad;
  int brows = tB ? N : K;
  float *A = randv((size_t)(tA ? K : M) * lda), *C = randv((size_t)M * ldc);
  float *C0 = malloc((size_t)M * ldc * sizeof(float));
  memcpy(C0, C, (size_t)M * ldc * sizeof(float));
  qw w = make_w(dt, CT_QUANT_QUANTO, brows, ldb);
  if (f)
    f(tA, tB, M, N, K, alpha, A, lda, &w.v, ldb, beta, C, ldc);
  else
    ct_sgemm_w(tA, tB, M, N, K, alpha, A, lda, &w.v, ldb, beta, C, ldc);
  int bad = 0;
  const double tol = 1e-5 * sqrt((double)K + 1);
  for (int i = 0; i < M && bad < 3; i++)
    for (int j = 0; j < ldc && bad < 3; j++) {
      size_t ij = (size_t)i * ldc + j;
      if (j >= N) {
        bad += memcmp(&C[ij], &C0[ij], sizeof(float)) != 0;
        continue;
      }
      double s = 0, sa = 0;
      for (int k = 0; k < K; k++) {
        double a = tA ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
        double b = tB ? w.deq[(size_t)j * ldb + k] : w.deq[(size_t)k * ldb + j];
        s += a * b;
        sa += fabs(a * b);
      }
      double prev = beta == 0.0f ? 0.0 : (double)beta * C0[ij];
      double ref = (double)alpha * s + prev;
      if (!(fabs((double)C[ij] - ref) <= tol * (fabs((double)alpha) * sa + fabs(prev) + 1e-30)))
        bad++;
    }
  free(A), free(C), free(C0);
  free_w(&w);
  return bad;
}

CT_TEST(quant, gemm_w_odd_sizes_all_paths) {
  static const int sz[] = {1, 7, 17, 49, 97, 130};
  for (int p = -1; p < 3; p++) {
    ct_sgemm_w_fn f = p < 0 ? NULL : ct_sgemm_w_path_fn(wpaths[p]);
    if (p >= 0 && !f) {
      CT_SKIP_PART("path %s: this CPU lacks it", wpaths[p]);
      continue;
    }
    for (int d = 0; d < 2; d++)
      for (int t = 0; t < 4; t++)
        for (int a = 0; a < 6; a++) {
          int M = sz[a], N = sz[(a + 2) % 6], K = sz[(a + 4) % 6], tA = t >> 1, tB = t & 1;
          float alpha = a % 2 ? 0.75f : 1.0f, beta = a % 3 == 0 ? 0.0f : a % 3 == 1 ? 1.0f : -0.5f;
          CHECKF(!check_w(f, wdts[d], tA, tB, M, N, K, alpha, beta, a % 2 ? 3 : 0),
                 "%s %s tA=%d tB=%d M=%d N=%d K=%d", p < 0 ? "ct_sgemm_w" : wpaths[p],
                 ct_wdtype_name(wdts[d]), tA, tB, M, N, K);
        }
    /* K over several K blocks, many row blocks */
    for (int d = 0; d < 2; d++)
      for (int tB = 0; tB < 2; tB++)
        CHECKF(!check_w(f, wdts[d], 0, tB, 400, 130, 1100, 1.0f, 1.0f, 1), "%s %s large tB=%d",
               p < 0 ? "ct_sgemm_w" : wpaths[p], ct_wdtype_name(wdts[d]), tB);
  }
}

/* Our kernels read exactly the packed panels of the dequantised float32
 * matrix: the same bits as ct_sgemm on that copy, for any thread count. */
static float *run_w(int threads, int use_view, int tB, int M, int N, int K, const float *A,
                    const qw *w, const float *C0) {
  int ldb = tB ? K : N;
  float *C = malloc((size_t)M * N * sizeof(float));
  memcpy(C, C0, (size_t)M * N * sizeof(float));
  int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  if (use_view)
    ct_sgemm_w(0, tB, M, N, K, 1.0f, A, K, &w->v, ldb, 1.0f, C, N);
  else
    ct_sgemm(0, tB, M, N, K, 1.0f, A, K, w->deq, ldb, 1.0f, C, N);
  omp_set_num_threads(saved);
  return C;
}

CT_TEST(quant, gemm_w_bits_equal_dequantised_and_threads) {
  if (!strcmp(ct_sgemm_path(), "blas")) {
    CT_SKIP("OpenBLAS path (no bitwise promise)");
  }
  static const int shp[][3] = {{523, 301, 700}, {16, 777, 384}, {97, 97, 2000}, {400, 130, 1031}};
  rng_s = 21;
  for (int s = 0; s < 4; s++)
    for (int d = 0; d < 2; d++)
      for (int tB = 0; tB < 2; tB++) {
        int M = shp[s][0], N = shp[s][1], K = shp[s][2];
        float *A = randv((size_t)M * K), *C0 = randv((size_t)M * N);
        qw w = make_w(wdts[d], CT_QUANT_TORCHAO, tB ? N : K, tB ? K : N);
        float *ref = run_w(2, 0, tB, M, N, K, A, &w, C0);
        for (int th = 1; th <= 3; th++) {
          float *c = run_w(th, 1, tB, M, N, K, A, &w, C0);
          CHECKF(
              !memcmp(c, ref, (size_t)M * N * sizeof(float)),
              "%s M=%d N=%d K=%d tB=%d, %d threads: differs from ct_sgemm on the dequantised copy",
              ct_wdtype_name(wdts[d]), M, N, K, tB, th);
          free(c);
        }
        free(A), free(C0), free(ref);
        free_w(&w);
      }
}

/* ct_linear_fwd_w / ct_linear_bwd_w: the float32 linear on the dequantised weight, bit for bit. */
CT_TEST(quant, linear_w_equals_linear_on_dequantised) {
  if (!strcmp(ct_sgemm_path(), "blas")) {
    CT_SKIP("OpenBLAS path (no bitwise promise)");
  }
  rng_s = 5;
  const int N = 67, K = 129, M = 95;
  float *x = randv((size_t)N * K), *b = randv(M), *dy = randv((size_t)N * M);
  for (int d = 0; d < 2; d++) {
    qw w = make_w(wdts[d], CT_QUANT_QUANTO, M, K);
    float *y1 = calloc((size_t)N * M, 4), *y2 = calloc((size_t)N * M, 4);
    ct_linear_fwd_w(N, K, M, x, K, &w.v, b, y1, M);
    ct_linear_fwd(N, K, M, x, K, w.deq, b, y2, M);
    CHECKF(!memcmp(y1, y2, (size_t)N * M * 4), "%s forward", ct_wdtype_name(wdts[d]));
    float *dx1 = randv((size_t)N * K), *dx2 = malloc((size_t)N * K * 4);
    float *db1 = calloc(M, 4), *db2 = calloc(M, 4);
    memcpy(dx2, dx1, (size_t)N * K * 4);
    ct_linear_bwd_w(N, K, M, x, K, &w.v, dy, M, dx1, K, 1.0f, NULL, db1);
    ct_linear_bwd(N, K, M, x, K, w.deq, dy, M, dx2, K, 1.0f, NULL, db2);
    CHECKF(!memcmp(dx1, dx2, (size_t)N * K * 4) && !memcmp(db1, db2, (size_t)M * 4), "%s backward",
           ct_wdtype_name(wdts[d]));
    /* a row view (linear1's qkv / mlp halves) */
    ct_wview half = ct_wview_rows(w.v, 40, K);
    ct_linear_fwd_w(N, K, M - 40, x, K, &half, NULL, y1, M);
    ct_linear_fwd(N, K, M - 40, x, K, w.deq + (size_t)40 * K, NULL, y2, M);
    CHECKF(!memcmp(y1, y2, (size_t)N * M * 4), "%s row view", ct_wdtype_name(wdts[d]));
    free(y1), free(y2), free(dx1), free(dx2), free(db1), free(db2);
    free_w(&w);
  }
  free(x), free(b), free(dy);
}

/* Invariants (torchao rounds w * (1/scale): half a step + a few ulps): the row's absmax element
 * maps to +-127 (quanto) or +-127/-128 (torchao), every element within half a step, zero rows stay
 * zero. */
CT_TEST(quant, int8_invariants) {
  rng_s = 9;
  const int R = 33, C = 70;
  float *w = randv((size_t)R * C);
  for (int c = 0; c < C; c++) w[(size_t)5 * C + c] = 0.0f; /* a zero row */
  int8_t *q = malloc((size_t)R * C);
  float *s = malloc(R * sizeof(float));
  for (int k = 0; k < 2; k++) {
    ct_quantize_int8((ct_quant_kind)k, R, C, w, q, s);
    for (int r = 0; r < R; r++) {
      int amax = 0;
      for (int c = 0; c < C; c++) {
        float v = w[(size_t)r * C + c], d = (float)q[(size_t)r * C + c] * s[r];
        amax = abs(q[(size_t)r * C + c]) > amax ? abs(q[(size_t)r * C + c]) : amax;
        CHECKF(fabsf(v - d) <= 0.5f * s[r] * (1 + 1e-4f) + 1e-30f, "kind %d row %d col %d", k, r,
               c);
      }
      if (r == 5)
        CHECKF(amax == 0, "kind %d: zero row quantised to %d", k, amax);
      else
        CHECKF(amax == 127 || amax == 128, "kind %d row %d: max |q| %d", k, r, amax);
    }
  }
  free(w), free(q), free(s);
}

/* ---------------------------------------------------------------- the MMDiT base */

#include "ctuner/alloc.h"
#include "ctuner/mmdit.h"
#include "ctuner/rng.h"

/* The tiny preset with random weights (the init zeroes the final layer and the gates). */
static ct_mmdit *random_mmdit(const ct_mmdit_preset *pr) {
  ct_mmdit *m = NULL;
  ct_err e = {0};
  if (ct_mmdit_new(&pr->cfg, 3, 0, &m, &e)) return NULL;
  ct_rng_fill_normal(ct_mmdit_params(m), ct_mmdit_numel(m), 11, 0, 0, 0.0f, 0.05f);
  return m;
}

static float *forward(ct_mmdit *m, const ct_mmdit_preset *pr, int *nv) {
  const ct_mmdit_config *c = &pr->cfg;
  const int B = 2, H = pr->lat_h, W = pr->lat_w, T = pr->txt_len;
  float *x = randv((size_t)B * c->in_channels * H * W), *t = randv(B);
  float *txt = randv((size_t)B * T * c->context_in_dim), *y = randv((size_t)B * c->vec_in_dim);
  float g[2] = {3.5f, 3.5f};
  for (int i = 0; i < B; i++) t[i] = 0.25f + 0.25f * (float)i;
  ct_mmdit_batch in = {B, H, W, T, x, t, txt, y, g};
  *nv = B * c->in_channels * H * W;
  float *v = malloc((size_t)*nv * sizeof(float));
  ct_err e = {0};
  ct_status st = ct_mmdit_forward(m, &in, v, &e);
  if (st) fprintf(stderr, "  forward: %s\n", e.msg);
  free(x), free(t), free(txt), free(y);
  return st ? NULL : v;
}

/* A base stored as bf16 / int8 gives the very bits of the float32 model
 * whose weights are the dequantised ones (the GEMM packs the same panels),
 * frees its float32 buffer, and takes the bytes the plan says. */
CT_TEST(quant, mmdit_stored_equals_dequantised_float32) {
  const ct_mmdit_preset *pr = ct_mmdit_preset_find("tiny");
  REQUIRE(pr);
  static const char *const precs[] = {"bf16", "int8-quanto", "int8-torchao"};
  for (int k = 0; k < 3; k++) {
    ct_mmdit *q = random_mmdit(pr), *f = random_mmdit(pr);
    REQUIRE(q && f);
    size_t np;
    const ct_param *tab = ct_mmdit_table(q, &np);
    ct_err e = {0};
    ct_mem_stats before, after;
    ct_mem_get_stats(&before);
    CHECKF(ct_mmdit_quantize(q, precs[k], 0, &e) == CT_OK, "%s: %s", precs[k], e.msg);
    ct_mem_get_stats(&after);
    const size_t plan = ct_mmdit_quant_bytes(tab, np, precs[k], 0);
    CHECKF(ct_mmdit_param_bytes(q) == plan, "%s: %zu bytes, plan %zu", precs[k],
           ct_mmdit_param_bytes(q), plan);
    CHECKF(after.current[CT_MEM_PARAMS] + ct_mmdit_numel(q) * 4 ==
               before.current[CT_MEM_PARAMS] + plan,
           "%s: params category %zu -> %zu, plan %zu", precs[k], before.current[CT_MEM_PARAMS],
           after.current[CT_MEM_PARAMS], plan);
    CHECK(ct_mmdit_params(q) == NULL);
    /* the float32 twin with the dequantised weights */
    float *w = ct_mmdit_params(f);
    size_t nq = 0;
    for (size_t i = 0; i < np; i++) {
      const int dt = ct_mmdit_quant_dtype(&tab[i], precs[k], 0);
      const int R = (int)tab[i].shape[0], C = tab[i].ndim == 2 ? (int)tab[i].shape[1] : 1;
      float *p = w + tab[i].offset;
      if (dt == CT_WDT_BF16)
        for (size_t j = 0; j < tab[i].numel; j++) p[j] = ct_bf16_round(p[j]);
      if (dt == CT_WDT_I8) {
        int8_t *qq = malloc(tab[i].numel);
        float *sc = malloc((size_t)R * sizeof(float));
        ct_quantize_int8(k == 2 ? CT_QUANT_TORCHAO : CT_QUANT_QUANTO, R, C, p, qq, sc);
        for (int r = 0; r < R; r++)
          for (int c = 0; c < C; c++) p[(size_t)r * C + c] = (float)qq[(size_t)r * C + c] * sc[r];
        free(qq), free(sc);
      }
      nq += dt != CT_WDT_F32;
    }
    CHECKF(nq > 10, "%s: %zu weights stored narrow", precs[k], nq);
    rng_s = 77;
    int n1, n2;
    float *v1 = forward(q, pr, &n1);
    rng_s = 77;
    float *v2 = forward(f, pr, &n2);
    REQUIRE(v1 && v2 && n1 == n2);
    CHECKF(!memcmp(v1, v2, (size_t)n1 * sizeof(float)), "%s: v differs from the float32 twin",
           precs[k]);
    double s = 0;
    for (int i = 0; i < n1; i++) s += fabs(v1[i]);
    CHECKF(s > 0, "%s: v is zero", precs[k]);
    free(v1), free(v2);
    ct_mmdit_free(q);
    ct_mmdit_free(f);
  }
}

static const float *twin_w;
static ct_status read_twin(void *user, size_t lo, size_t hi, float *out, ct_err *err) {
  (void)user, (void)err;
  memcpy(out, twin_w + lo, (hi - lo) * sizeof(float));
  return CT_OK;
}

/* Stored as read, a segment at a time (ct_mmdit_quantize_from, what training
 * does), equals quantising a loaded float32 model; the float32 never whole. */
CT_TEST(quant, mmdit_quantize_from_segments) {
  const ct_mmdit_preset *pr = ct_mmdit_preset_find("tiny");
  REQUIRE(pr);
  ct_mmdit *a = random_mmdit(pr), *b = NULL;
  ct_err e = {0};
  REQUIRE(a && ct_mmdit_new(&pr->cfg, 3, CT_MMDIT_NO_PARAMS, &b, &e) == CT_OK);
  twin_w = ct_mmdit_params(a);
  CHECKF(ct_mmdit_quantize_from(b, "int8-torchao", 1, read_twin, NULL, &e) == CT_OK, "%s", e.msg);
  CHECKF(ct_mmdit_quantize(a, "int8-torchao", 1, &e) == CT_OK, "%s", e.msg);
  CHECK(ct_mmdit_param_bytes(a) == ct_mmdit_param_bytes(b));
  rng_s = 78;
  int n1, n2;
  float *v1 = forward(a, pr, &n1);
  rng_s = 78;
  float *v2 = forward(b, pr, &n2);
  REQUIRE(v1 && v2 && n1 == n2);
  CHECK(!memcmp(v1, v2, (size_t)n1 * sizeof(float)));
  /* the refusals: twice, a model with gradients, an unknown precision */
  CHECK(ct_mmdit_quantize(a, "int8-quanto", 0, &e) == CT_ERR_INVALID);
  CHECK(ct_mmdit_quantize_from(b, "fp8-quanto", 0, read_twin, NULL, &e) == CT_ERR_INVALID);
  CHECKF(strstr(e.msg, "fp8-quanto") != NULL, "%s", e.msg);
  free(v1), free(v2);
  ct_mmdit_free(a);
  ct_mmdit_free(b);
}

/* ---------------------------------------------------------------- the libraries' own tensors */

#define qdata(rel) ct_test_data_in("CT_QUANT_DATA", "quant", rel)

/* ct_quantize_int8 gives optimum-quanto's (qint8 weights) and torchao's
 * (Int8WeightOnlyConfig) int8 values and scales exactly, and the GEMM over the
 * quanto weight gives the quantised nn.Linear's output (float32 sums in
 * another order: 1e-5 relative). tests/data/quant from scripts/quant_golden.py. */
CT_TEST(quant, int8_equals_quanto_and_torchao) {
  struct ct_st_file *f = NULL;
  ct_err e = {0};
  REQUIRE(!ct_st_open(qdata("quant_golden.safetensors"), &f, &e));
  int tensors = 0;
  for (int i = 0;; i++) {
    char n[32];
    size_t nw, nx, ny, n1, n2;
    snprintf(n, sizeof n, "w%d", i);
    float *w = ct_test_tensor(f, n, &nw);
    if (!w) break;
    tensors++;
    const ct_st_tensor *tw = ct_st_find(f, n);
    const int R = (int)tw->shape[0], C = (int)tw->shape[1];
    snprintf(n, sizeof n, "x%d", i);
    float *x = ct_test_tensor(f, n, &nx);
    snprintf(n, sizeof n, "y%d", i);
    float *y = ct_test_tensor(f, n, &ny);
    static const char *const lib[2] = {"quanto", "torchao"};
    int8_t *q = malloc(nw);
    float *s = malloc((size_t)R * sizeof(float));
    for (int k = 0; k < 2; k++) {
      snprintf(n, sizeof n, "%s_q%d", lib[k], i);
      float *gq = ct_test_tensor(f, n, &n1);
      snprintf(n, sizeof n, "%s_s%d", lib[k], i);
      float *gs = ct_test_tensor(f, n, &n2);
      REQUIRE(gq && gs && n1 == nw && n2 == (size_t)R);
      ct_quantize_int8(k ? CT_QUANT_TORCHAO : CT_QUANT_QUANTO, R, C, w, q, s);
      size_t badq = 0, bads = 0;
      for (size_t j = 0; j < nw; j++) badq += (float)q[j] != gq[j];
      for (int r = 0; r < R; r++) bads += memcmp(&s[r], &gs[r], sizeof(float)) != 0;
      CHECKF(!badq && !bads, "w%d (%dx%d) vs %s: %zu int8 values and %zu scales differ", i, R, C,
             lib[k], badq, bads);
      if (k == 0 && x && y) { /* the quantised Linear's forward */
        ct_quantize_int8(CT_QUANT_QUANTO, R, C, w, q, s);
        ct_wview v = {CT_WDT_I8, q, s};
        const int N = (int)(nx / (size_t)C);
        float *out = calloc(ny, sizeof(float));
        ct_linear_fwd_w(N, C, R, x, C, &v, NULL, out, R);
        double err = ct_test_rel_err(out, y, ny);
        CHECKF(err < 1e-5, "w%d: quanto Linear output %.3g relative", i, err);
        free(out);
      }
      free(gq), free(gs);
    }
    free(q), free(s), free(w), free(x), free(y);
  }
  CHECKF(tensors >= 4, "%d golden tensors", tensors);
  ct_st_close(f);
}

/* ---------------------------------------------------------------- T5 in its stored dtype */

#include "ctuner/t5.h"

/* A text_encoder_2 stored BF16 (the tiny FLUX pipeline's) stays in its mapped
 * files and gives the very bits of the same weights held in float32 (the
 * directory rewritten as F32 here): widening is exact and the GEMM packs the
 * same panels, q, k, v as three products or one. */
CT_TEST(quant, t5_mapped_bf16_equals_float32) {
  const char *src = "tests/data/flux_pipe/dev/text_encoder_2";
  char dir[512], p[1200];
  snprintf(dir, sizeof dir, "%s/t5_f32", ct_test_tmpdir());
  snprintf(p, sizeof p, "mkdir -p %s && cp %s/config.json %s/", dir, src, dir);
  REQUIRE(system(p) == 0);
  ct_st_set s;
  ct_err e = {0};
  REQUIRE(!ct_st_set_open(&s, src, "model.safetensors", &e));
  ct_st_writer *w = NULL;
  REQUIRE(!ct_st_writer_new(&w));
  float *keep[64]; /* the writer borrows each tensor's floats until it writes */
  size_t nk = 0;
  for (size_t k = 0; k < s.nf; k++)
    for (size_t i = 0; i < s.f[k]->ntensors && nk < 64; i++) {
      const ct_st_tensor *x = &s.f[k]->tensors[i];
      float *v = keep[nk++] = malloc(x->numel * sizeof(float));
      REQUIRE(v && !ct_st_to_f32(x, v, x->numel, &e));
      CHECK(!ct_st_writer_add_f32(w, x->name, x->ndim, x->shape, v, CT_DTYPE_F32, &e));
    }
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  CHECKF(!ct_st_writer_write(w, p, &e), "%s", e.msg);
  ct_st_writer_free(w);
  while (nk) free(keep[--nk]);
  ct_st_set_close(&s);
  ct_t5 *a = NULL, *b = NULL;
  REQUIRE(!ct_t5_load(src, &a, &e) && !ct_t5_load(dir, &b, &e));
  CHECK(ct_t5_mapped(a) == 1 && ct_t5_mapped(b) == 0);
  const int B = 2, T = 9, d = ct_t5_cfg(a)->d_model, V = ct_t5_cfg(a)->vocab;
  int32_t ids[18];
  for (int i = 0; i < B * T; i++) ids[i] = (int32_t)((i * 37 + 5) % V);
  float *ya = malloc((size_t)B * T * d * sizeof(float)), *yb = malloc((size_t)B * T * d * 4);
  REQUIRE(!ct_t5_encode(a, ids, B, T, ya, &e) && !ct_t5_encode(b, ids, B, T, yb, &e));
  CHECK(!memcmp(ya, yb, (size_t)B * T * d * sizeof(float)));
  double s2 = 0;
  for (int i = 0; i < B * T * d; i++) s2 += fabs(ya[i]);
  CHECK(s2 > 0);
  free(ya), free(yb);
  ct_t5_free(a);
  ct_t5_free(b);
}

/* The two attention kernels (tiles: attention.c, flash: attention_flash.c)
 * against a float64 reference of the forward (o, lse) and of the analytic
 * gradients dq, dk, dv, on odd shapes: L not a multiple of either kernel's
 * tiles, several heads, head dims 16..128 (some not a multiple of 16), causal
 * and not. Also: the flash kernels give the same bits for 1 and 2 threads,
 * their error is no worse than the tiles kernel's (within 1.5x); with bf16
 * score products the error is bf16-sized (and the vdpbf16ps path gives the
 * bits of its emulation).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/kernels.h"
#include "harness.h"

static uint64_t rng_s = 1;
static void rng_seed(uint64_t s) {
  rng_s = s * 0x9E3779B97F4A7C15ull + 0x1234567ull;
}
static float frand(void) { /* uniform in [-1, 1) */
  rng_s ^= rng_s << 13;
  rng_s ^= rng_s >> 7;
  rng_s ^= rng_s << 17;
  return (float)((double)(rng_s >> 40) / (double)(1ull << 23) - 1.0);
}
static float *randv(size_t n, float scale) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = scale * frand();
  return p;
}
static float *nanv(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = NAN;
  return p;
}

typedef struct {
  int B, H, L, hd, causal;
  float scale;
  float *q, *k, *v, *dout; /* dout (B, L, H*hd) */
} att_in;

typedef struct {
  float *o, *lse, *dq, *dk, *dv;
} att_out;

enum { TILES = -1 }; /* run()'s kernel: TILES, or the flash kernels' bf16 argument */

static att_in in_make(int B, int H, int L, int hd, int causal) {
  att_in a = {B, H, L, hd, causal, 1.0f / sqrtf((float)hd), NULL, NULL, NULL, NULL};
  size_t n = (size_t)B * H * L * hd;
  /* |scores| up to a few units: peaked and flat rows both occur */
  a.q = randv(n, 2.0f), a.k = randv(n, 2.0f), a.v = randv(n, 1.0f), a.dout = randv(n, 1.0f);
  return a;
}
static void in_free(att_in *a) {
  free(a->q), free(a->k), free(a->v), free(a->dout);
}

static att_out run(const att_in *a, int kernel) {
  size_t n = (size_t)a->B * a->H * a->L * a->hd;
  att_out r = {nanv(n), nanv((size_t)a->B * a->H * a->L), nanv(n), nanv(n), nanv(n)};
  if (kernel == TILES) {
    ct_attention_tiles_fwd(a->B, a->H, a->L, a->hd, a->scale, a->causal, a->q, a->k, a->v, r.o,
                           r.lse);
    ct_attention_tiles_bwd(a->B, a->H, a->L, a->hd, a->scale, a->causal, a->q, a->k, a->v, r.o,
                           r.lse, a->dout, r.dq, r.dk, r.dv);
  } else {
    ct_attention_flash_fwd(a->B, a->H, a->L, a->hd, a->scale, a->causal, a->q, a->k, a->v, r.o,
                           r.lse, kernel);
    ct_attention_flash_bwd(a->B, a->H, a->L, a->hd, a->scale, a->causal, a->q, a->k, a->v, r.o,
                           r.lse, a->dout, r.dq, r.dk, r.dv, kernel);
  }
  return r;
}
static void out_free(att_out *r) {
  free(r->o), free(r->lse), free(r->dq), free(r->dk), free(r->dv);
}

/* One head of the float64 reference: o, lse, dq, dk, dv. P is L x L. */
static void ref_head(const att_in *a, int b, int h, double *P, double *dP, double *o, double *lse,
                     double *dq, double *dk, double *dv) {
  int L = a->L, hd = a->hd, ld = a->H * hd;
  size_t ho = ((size_t)b * a->H + h) * L * hd;
  const float *q = a->q + ho, *k = a->k + ho, *v = a->v + ho;
  const float *dO = a->dout + (size_t)b * L * ld + (size_t)h * hd;
  for (int i = 0; i < L; i++) {
    int n = a->causal ? i + 1 : L;
    double m = -INFINITY, sum = 0;
    for (int j = 0; j < L; j++) {
      double s = 0;
      for (int e = 0; e < hd; e++) s += (double)q[i * hd + e] * k[j * hd + e];
      P[(size_t)i * L + j] = j < n ? s * a->scale : -INFINITY;
      m = fmax(m, P[(size_t)i * L + j]);
    }
    for (int j = 0; j < L; j++) sum += (P[(size_t)i * L + j] = exp(P[(size_t)i * L + j] - m));
    for (int j = 0; j < L; j++) P[(size_t)i * L + j] /= sum;
    lse[((size_t)b * a->H + h) * L + i] = m + log(sum);
    double D = 0;
    for (int e = 0; e < hd; e++) {
      double acc = 0;
      for (int j = 0; j < L; j++) acc += P[(size_t)i * L + j] * v[j * hd + e];
      o[((size_t)b * L + i) * ld + h * hd + e] = acc;
      D += acc * dO[(size_t)i * ld + e];
    }
    for (int j = 0; j < L; j++) {
      double s = 0;
      for (int e = 0; e < hd; e++) s += (double)dO[(size_t)i * ld + e] * v[j * hd + e];
      dP[(size_t)i * L + j] = P[(size_t)i * L + j] * (s - D); /* dS */
    }
  }
  for (int i = 0; i < L; i++)
    for (int e = 0; e < hd; e++) {
      double gq = 0, gk = 0, gv = 0;
      for (int j = 0; j < L; j++) {
        gq += dP[(size_t)i * L + j] * k[j * hd + e];
        gk += dP[(size_t)j * L + i] * q[j * hd + e];
        gv += P[(size_t)j * L + i] * dO[(size_t)j * ld + e];
      }
      dq[ho + (size_t)i * hd + e] = gq * a->scale;
      dk[ho + (size_t)i * hd + e] = gk * a->scale;
      dv[ho + (size_t)i * hd + e] = gv;
    }
}

/* ||x - ref|| / ||ref|| */
static double rel(const float *x, const double *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)x[i] - ref[i];
    num += d * d, den += ref[i] * ref[i];
  }
  return sqrt(num / (den > 0 ? den : 1));
}

/* The five relative errors of one kernel: o, lse, dq, dk, dv. */
static void errors(const att_in *a, const att_out *r, double *const ref[5], double e[5]) {
  size_t n = (size_t)a->B * a->H * a->L * a->hd, nl = (size_t)a->B * a->H * a->L;
  const float *got[5] = {r->o, r->lse, r->dq, r->dk, r->dv};
  for (int t = 0; t < 5; t++) e[t] = rel(got[t], ref[t], t == 1 ? nl : n);
}

/* 1 when the flash kernels' bf16 = 1 runs vdpbf16ps (else it runs the emulation,
 * and comparing it with bf16 = 2 compares the emulation with itself). */
static int bf16_hw(void) {
  return !strcmp(ct_attention_flash_isa(), "avx512") && ct_fma_peak_has("avx512bf16");
}

static void check_shape(int *ct_failed_, int B, int H, int L, int hd, int causal) {
  att_in a = in_make(B, H, L, hd, causal);
  size_t n = (size_t)B * H * L * hd;
  double *ref[5];
  for (int t = 0; t < 5; t++) ref[t] = calloc(t == 1 ? (size_t)B * H * L : n, sizeof(double));
  double *P = malloc(sizeof(double) * L * L), *dP = malloc(sizeof(double) * L * L);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) ref_head(&a, b, h, P, dP, ref[0], ref[1], ref[2], ref[3], ref[4]);
  att_out rt = run(&a, TILES), rf = run(&a, 0), rb = run(&a, 1), re = run(&a, 2);
  double et[5], ef[5], eb[5];
  errors(&a, &rt, ref, et);
  errors(&a, &rf, ref, ef);
  errors(&a, &rb, ref, eb);
  /* bf16: the instruction and its emulation agree bit for bit where the
   * compiler contracts a * b + c into one FMA as the instruction path does
   * (not at -O0: the Debug + sanitizer build), closely otherwise */
#ifdef __OPTIMIZE__
  if (bf16_hw())
    CHECK(!memcmp(rb.o, re.o, n * sizeof(float)) && !memcmp(rb.dq, re.dq, n * sizeof(float)) &&
          !memcmp(rb.dk, re.dk, n * sizeof(float)) && !memcmp(rb.dv, re.dv, n * sizeof(float)));
#else
  if (bf16_hw()) {
    double ebe[5];
    errors(&a, &re, ref, ebe);
    for (int t = 0; t < 5; t++) CHECK(fabs(ebe[t] - eb[t]) <= 1e-3 * eb[t]);
  }
#endif
  static const char *const nm[5] = {"o", "lse", "dq", "dk", "dv"};
  for (int t = 0; t < 5; t++) {
    CHECKF(ef[t] < 3e-6, "flash B=%d H=%d L=%d hd=%d causal=%d: %s rel err %.3g", B, H, L, hd,
           causal, nm[t], ef[t]);
    CHECKF(ef[t] <= 1.5 * et[t] + 1e-7, "flash %s err %.3g vs tiles %.3g (L=%d hd=%d causal=%d)",
           nm[t], ef[t], et[t], L, hd, causal);
    /* bf16 scores: rounding Q and K to 8 significant bits moves scores of a
     * few units by ~1e-2; the outputs are within a few percent */
    CHECKF(eb[t] < 3e-2 && eb[t] > 10 * ef[t],
           "bf16 B=%d H=%d L=%d hd=%d causal=%d: %s rel err %.3g", B, H, L, hd, causal, nm[t],
           eb[t]);
  }
  if (getenv("CT_ATTENTION_ERRORS"))
    fprintf(stderr,
            "  L=%3d hd=%3d causal=%d  tiles o %.2e dq %.2e dk %.2e dv %.2e | flash o %.2e "
            "dq %.2e dk %.2e dv %.2e\n",
            L, hd, causal, et[0], et[2], et[3], et[4], ef[0], ef[2], ef[3], ef[4]);
  if (getenv("CT_ATTENTION_ERRORS"))
    fprintf(stderr, "  L=%3d hd=%3d causal=%d  bf16 o %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", L,
            hd, causal, eb[0], eb[1], eb[2], eb[3], eb[4]);
  out_free(&rt), out_free(&rf), out_free(&rb), out_free(&re);
  for (int t = 0; t < 5; t++) free(ref[t]);
  free(P), free(dP);
  in_free(&a);
}

CT_TEST(attention, flash_vs_float64) {
  rng_seed(21);
  static const int shapes[][4] = {
      /* B, H, L, hd */
      {2, 3, 37, 16}, {1, 2, 150, 24}, {2, 2, 80, 64},
      {1, 2, 97, 40}, {1, 1, 65, 128}, {1, 1, 33, 100},
  };
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int causal = 0; causal < 2; causal++)
      check_shape(ct_failed_, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], causal);
  if (!bf16_hw())
    CT_SKIP_PART(
        "vdpbf16ps vs its emulation: this CPU has no AVX512-BF16 (flash ISA %s), so "
        "both runs are the emulation",
        ct_attention_flash_isa());
}

static int same(const float *a, const float *b, size_t n) {
  return memcmp(a, b, n * sizeof(float)) == 0;
}

CT_TEST(attention, flash_threads) {
  rng_seed(22);
  int saved = omp_get_max_threads();
  for (int c = 0; c < 4; c++) { /* causal or not, float32 or bf16 */
    int causal = c & 1, bf16 = c >> 1;
    att_in a = in_make(2, 3, 150, 40, causal);
    size_t n = (size_t)a.B * a.H * a.L * a.hd;
    omp_set_num_threads(1);
    att_out r1 = run(&a, bf16);
    omp_set_num_threads(3);
    att_out r3 = run(&a, bf16);
    omp_set_num_threads(saved);
    CHECK(same(r1.o, r3.o, n) && same(r1.lse, r3.lse, (size_t)a.B * a.H * a.L));
    CHECK(same(r1.dq, r3.dq, n) && same(r1.dk, r3.dk, n) && same(r1.dv, r3.dv, n));
    /* same bits of NaN (never written) would pass the above */
    CHECK(ct_test_all_finite(r1.o, n) && ct_test_all_finite(r1.lse, (size_t)a.B * a.H * a.L));
    CHECK(ct_test_all_finite(r1.dq, n) && ct_test_all_finite(r1.dk, n) &&
          ct_test_all_finite(r1.dv, n));
    out_free(&r1), out_free(&r3);
    in_free(&a);
  }
}

/* L = 1 and a single key tile per query tile: nothing to mix, o = v. */
CT_TEST(attention, flash_one_token) {
  rng_seed(23);
  att_in a = in_make(2, 2, 1, 32, 0);
  att_out r = run(&a, 0);
  size_t n = (size_t)2 * 2 * 32;
  int ok = 1;
  for (int b = 0; b < 2; b++)
    for (int h = 0; h < 2; h++)
      for (int e = 0; e < 32; e++)
        ok &= r.o[(size_t)b * 64 + h * 32 + e] == a.v[((size_t)b * 2 + h) * 32 + e];
  CHECK(ok);
  double mq = 0;
  for (size_t i = 0; i < n; i++) mq = ct_test_max(mq, fabsf(r.dq[i]) + fabsf(r.dk[i]));
  CHECK(mq < 1e-5f); /* one key: the softmax is constant (dP - D rounds to ~0) */
  out_free(&r);
  in_free(&a);
}

/* ct_attention_fwd/bwd: flash up to head dim 256, tiles above (unless
 * CT_ATTENTION names one); the bits of all five outputs say which ran, on both
 * sides of the boundary. */
CT_TEST(attention, dispatch) {
  rng_seed(24);
  const char *path = ct_attention_path();
  static const int hds[] = {16, 64, 255, 256, 257, 320};
  for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++) {
    const int hd = hds[hi];
    att_in a = in_make(1, 2, 40, hd, 0);
    size_t n = (size_t)a.B * a.H * a.L * a.hd, nl = (size_t)a.B * a.H * a.L;
    att_out want =
        run(&a, !strcmp(path, "tiles") || (!strcmp(path, "auto") && hd > 256) ? TILES : 0);
    att_out got = {nanv(n), nanv((size_t)a.B * a.H * a.L), nanv(n), nanv(n), nanv(n)};
    ct_attention_fwd(a.B, a.H, a.L, a.hd, a.scale, 0, a.q, a.k, a.v, got.o, got.lse);
    ct_attention_bwd(a.B, a.H, a.L, a.hd, a.scale, 0, a.q, a.k, a.v, got.o, got.lse, a.dout, got.dq,
                     got.dk, got.dv);
    CHECKF(same(want.o, got.o, n) && same(want.lse, got.lse, nl) && same(want.dq, got.dq, n) &&
               same(want.dk, got.dk, n) && same(want.dv, got.dv, n),
           "path %s, hd %d", path, hd);
    /* both left unwritten (NaN) would be the same bits */
    CHECKF(ct_test_all_finite(got.o, n) && ct_test_all_finite(got.lse, nl) &&
               ct_test_all_finite(got.dq, n) && ct_test_all_finite(got.dk, n) &&
               ct_test_all_finite(got.dv, n),
           "path %s, hd %d: a NaN or Inf in the outputs", path, hd);
    out_free(&want), out_free(&got);
    in_free(&a);
  }
}

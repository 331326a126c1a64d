/* The models compute through their backend table (suite backend): the
 * MMDiT, the VAE and the text encoder moved onto a counting copy of the CPU
 * backend (ct_*_set_backend) call its ops and allocate through it, and give
 * the very bits they give on the default backend; every buffer they
 * allocated there is freed there.
 */
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/backend.h"
#include "ctuner/mmdit.h"
#include "ctuner/rng.h"
#include "ctuner/textenc.h"
#include "ctuner/vae.h"
#include "harness.h"

static struct {
  long alloc, free, linear_fwd, linear_bwd, attention_fwd, conv2d_fwd, conv2d_bwd, copy_2d,
      clamp_fwd, clamp_bwd, embedding_fwd;
} calls;
static ct_backend_ops counting;

static void *c_alloc(ct_mem_cat cat, size_t bytes) {
  void *p = ct_backend_default()->alloc(cat, bytes);
  calls.alloc += p != NULL;
  return p;
}
static void c_free(void *p) {
  calls.free += p != NULL;
  ct_backend_default()->free(p);
}
static void c_linear_fwd(int N, int K, int M, const float *x, int ldx, const float *w,
                         const float *b, float *y, int ldy) {
  calls.linear_fwd++;
  ct_linear_fwd(N, K, M, x, ldx, w, b, y, ldy);
}
static void c_linear_bwd(int N, int K, int M, const float *x, int ldx, const float *w,
                         const float *dy, int lddy, float *dx, int lddx, float beta_dx, float *dw,
                         float *db) {
  calls.linear_bwd++;
  ct_linear_bwd(N, K, M, x, ldx, w, dy, lddy, dx, lddx, beta_dx, dw, db);
}
static void c_attention_fwd(int B, int H, int L, int hd, float scale, int causal, const float *q,
                            const float *k, const float *v, float *o, float *lse) {
  calls.attention_fwd++;
  ct_attention_fwd(B, H, L, hd, scale, causal, q, k, v, o, lse);
}
static void c_conv2d_fwd(const ct_conv2d_shape *s, const float *x, const float *w, const float *b,
                         float *y, float *col) {
  calls.conv2d_fwd++;
  ct_conv2d_fwd(s, x, w, b, y, col);
}
static void c_conv2d_bwd(const ct_conv2d_shape *s, const float *x, const float *w, const float *dy,
                         float *dx, float *dw, float *db, float *col) {
  calls.conv2d_bwd++;
  ct_conv2d_bwd(s, x, w, dy, dx, dw, db, col);
}
static void c_copy_2d(int rows, int cols, const float *src, int lds, float *dst, int ldd) {
  calls.copy_2d++;
  ct_copy_2d(rows, cols, src, lds, dst, ldd);
}
static void c_clamp_fwd(int rows, int cols, const float *x, int ldx, float lo, float hi, float *y,
                        int ldy) {
  calls.clamp_fwd++;
  ct_clamp_fwd(rows, cols, x, ldx, lo, hi, y, ldy);
}
static void c_clamp_bwd(int rows, int cols, const float *x, int ldx, float lo, float hi,
                        const float *dy, int lddy, float *dx, int lddx) {
  calls.clamp_bwd++;
  ct_clamp_bwd(rows, cols, x, ldx, lo, hi, dy, lddy, dx, lddx);
}
static void c_embedding_fwd(int N, int T, int D, const int32_t *ids, const float *tok,
                            const float *pos, float *y) {
  calls.embedding_fwd++;
  ct_embedding_fwd(N, T, D, ids, tok, pos, y);
}

static const ct_backend_ops *counting_backend(void) {
  counting = *ct_backend_default();
  counting.name = "cpu-counting";
  counting.alloc = c_alloc;
  counting.free = c_free;
  counting.linear_fwd = c_linear_fwd;
  counting.linear_bwd = c_linear_bwd;
  counting.attention_fwd = c_attention_fwd;
  counting.conv2d_fwd = c_conv2d_fwd;
  counting.conv2d_bwd = c_conv2d_bwd;
  counting.copy_2d = c_copy_2d;
  counting.clamp_fwd = c_clamp_fwd;
  counting.clamp_bwd = c_clamp_bwd;
  counting.embedding_fwd = c_embedding_fwd;
  memset(&calls, 0, sizeof calls);
  return &counting;
}

static float *randn(size_t n, uint64_t stream) {
  float *p = malloc(n * sizeof(float));
  if (!p) abort();
  ct_rng_fill_normal(p, n, 11, stream, 0, 0.0f, 1.0f);
  return p;
}

/* The tiny preset, forward and backward, on the default backend and on the
 * counting one: the same v and gradients, bit for bit. */
CT_TEST(backend, mmdit_through_table) {
  const ct_backend_ops *be = counting_backend();
  const ct_mmdit_config *c = &ct_mmdit_preset_find("tiny")->cfg;
  enum { B = 2, H = 4, W = 6, T = 5 };
  const size_t nx = (size_t)B * c->in_channels * H * W;
  float *x = randn(nx, 1), *txt = randn((size_t)B * T * c->context_in_dim, 2),
        *y = randn((size_t)B * c->vec_in_dim, 3);
  float *dv = randn(nx, 4), t[B] = {0.3f, 0.8f}, *v[2] = {randn(nx, 5), randn(nx, 5)},
        *g[2] = {NULL, NULL};
  ct_mmdit *m[2] = {NULL, NULL};
  ct_err err = {0};
  ct_mem_stats s0, s1;
  ct_mem_get_stats(&s0);
  for (int k = 0; k < 2; k++) {
    REQUIRE(ct_mmdit_new(c, 5, CT_MMDIT_GRADS, &m[k], &err) == CT_OK);
    if (k) REQUIRE(ct_mmdit_set_backend(m[k], be, &err) == CT_OK);
    ct_mmdit_batch in = {B, H, W, T, x, t, txt, y, NULL};
    CHECKF(ct_mmdit_forward(m[k], &in, v[k], &err) == CT_OK, "%s", err.msg);
    CHECKF(ct_mmdit_backward(m[k], dv, &err) == CT_OK, "%s", err.msg);
    g[k] = ct_mmdit_grads(m[k]);
  }
  CHECK(ct_mmdit_backend(m[0]) == ct_backend_default() && ct_mmdit_backend(m[1]) == be);
  CHECK(!memcmp(v[0], v[1], nx * sizeof(float)));
  CHECK(
      !memcmp(ct_mmdit_params(m[0]), ct_mmdit_params(m[1]), ct_mmdit_numel(m[0]) * sizeof(float)));
  CHECK(!memcmp(g[0], g[1], ct_mmdit_numel(m[0]) * sizeof(float)));
  CHECKF(calls.alloc >= 3 && calls.linear_fwd > 0 && calls.linear_bwd > 0 &&
             calls.attention_fwd > 0 && calls.copy_2d > 0,
         "calls: alloc %ld, linear %ld/%ld, attention %ld, copy_2d %ld", calls.alloc,
         calls.linear_fwd, calls.linear_bwd, calls.attention_fwd, calls.copy_2d);
  for (int k = 0; k < 2; k++) ct_mmdit_free(m[k]);
  CHECKF(calls.free == calls.alloc, "%ld allocations, %ld frees on the counting backend",
         calls.alloc, calls.free);
  ct_mem_get_stats(&s1);
  CHECK(s1.total_current == s0.total_current);
  free(x), free(txt), free(y), free(dv), free(v[0]), free(v[1]);
}

/* A two-block VAE: taped encode (its moments split and clamp) and decode and
 * both backwards, on either backend: the same outputs and gradients. */
CT_TEST(backend, vae_through_table) {
  const ct_backend_ops *be = counting_backend();
  ct_vae_config c;
  ct_vae_config_defaults(&c);
  c.nblocks = 2, c.block_out_channels[0] = 8, c.block_out_channels[1] = 16, c.norm_num_groups = 4;
  enum { B = 2, H = 8, W = 8, LC = 4 };
  const size_t nx = (size_t)B * 3 * H * W, nz = (size_t)B * LC * (H / 2) * (W / 2);
  float *x = randn(nx, 6), *dmean = randn(nz, 7), *dlogvar = randn(nz, 8), *dout = randn(nx, 9);
  float *mean[2], *logvar[2], *img[2], *dx[2], *dz[2];
  ct_vae *v[2] = {NULL, NULL};
  ct_err err = {0};
  for (int k = 0; k < 2; k++) {
    mean[k] = randn(nz, 1), logvar[k] = randn(nz, 1), img[k] = randn(nx, 1), dx[k] = randn(nx, 1);
    dz[k] = randn(nz, 1);
    REQUIRE(ct_vae_new(&c, 3, &v[k], &err) == CT_OK);
    if (k) REQUIRE(ct_vae_set_backend(v[k], be, &err) == CT_OK);
    size_t np = 0;
    const ct_vae_param *tab = ct_vae_table(v[k], &np);
    for (size_t i = 0; i < np; i++)
      if (!strcmp(tab[i].name,
                  "quant_conv.bias")) { /* logvar channels 0 and 1 clamp above and below */
        ct_vae_params(v[k])[tab[i].offset + LC] = 60.0f;
        ct_vae_params(v[k])[tab[i].offset + LC + 1] = -60.0f;
      }
    ct_vae_tape *te = NULL, *td = NULL;
    CHECKF(ct_vae_encode_fwd(v[k], B, H, W, x, mean[k], logvar[k], &te, &err) == CT_OK, "%s",
           err.msg);
    CHECKF(ct_vae_encode_bwd(v[k], te, dmean, dlogvar, dx[k], &err) == CT_OK, "%s", err.msg);
    CHECKF(ct_vae_decode_fwd(v[k], B, H / 2, W / 2, mean[k], img[k], &td, &err) == CT_OK, "%s",
           err.msg);
    CHECKF(ct_vae_decode_bwd(v[k], td, dout, dz[k], &err) == CT_OK, "%s", err.msg);
    ct_vae_tape_free(te);
    ct_vae_tape_free(td);
  }
  CHECK(ct_vae_backend(v[1]) == be);
  ct_vae_tape *tp = NULL; /* a tape recorded on one backend has no backward on another */
  REQUIRE(ct_vae_decode_fwd(v[0], B, H / 2, W / 2, mean[0], NULL, &tp, &err) == CT_OK);
  REQUIRE(ct_vae_set_backend(v[0], be, &err) == CT_OK);
  CHECK(ct_vae_decode_bwd(v[0], tp, dout, NULL, &err) == CT_ERR_INVALID &&
        strstr(err.msg, "another compute backend"));
  ct_vae_tape_free(tp);
  CHECK(!memcmp(mean[0], mean[1], nz * sizeof(float)) &&
        !memcmp(logvar[0], logvar[1], nz * sizeof(float)));
  CHECK(!memcmp(img[0], img[1], nx * sizeof(float)) && !memcmp(dx[0], dx[1], nx * sizeof(float)));
  CHECK(!memcmp(dz[0], dz[1], nz * sizeof(float)));
  CHECK(!memcmp(ct_vae_grads(v[0]), ct_vae_grads(v[1]), ct_vae_numel(v[0]) * sizeof(float)));
  CHECKF(calls.conv2d_fwd > 0 && calls.conv2d_bwd > 0 && calls.linear_fwd > 0 &&
             calls.attention_fwd > 0 && calls.clamp_fwd > 0 && calls.clamp_bwd > 0 &&
             calls.copy_2d > 0,
         "calls: conv2d %ld/%ld, linear %ld, attention %ld, clamp %ld/%ld, copy_2d %ld",
         calls.conv2d_fwd, calls.conv2d_bwd, calls.linear_fwd, calls.attention_fwd, calls.clamp_fwd,
         calls.clamp_bwd, calls.copy_2d);
  for (int k = 0; k < 2; k++) {
    ct_vae_free(v[k]);
    free(mean[k]), free(logvar[k]), free(img[k]), free(dx[k]), free(dz[k]);
  }
  CHECKF(calls.free == calls.alloc, "%ld allocations, %ld frees on the counting backend",
         calls.alloc, calls.free);
  free(x), free(dmean), free(dlogvar), free(dout);
}

CT_TEST(backend, textenc_through_table) {
  const ct_backend_ops *be = counting_backend();
  ct_textenc_config c;
  ct_textenc_config_default(64, &c);
  enum { B = 2, T = 7 };
  int32_t ids[B * T];
  for (int i = 0; i < B * T; i++) ids[i] = (int32_t)((i * 37 + 5) % c.vocab);
  ids[T + 3] = c.eos_id;
  float seq[2][B * T * 64], pooled[2][B * 64];
  ct_textenc *te[2] = {NULL, NULL};
  ct_err err = {0};
  for (int k = 0; k < 2; k++) {
    REQUIRE(ct_textenc_new(&c, 4, &te[k], &err) == CT_OK);
    if (k) REQUIRE(ct_textenc_set_backend(te[k], be, &err) == CT_OK);
    CHECKF(ct_textenc_encode(te[k], ids, B, T, seq[k], pooled[k], &err) == CT_OK, "%s", err.msg);
  }
  CHECK(ct_textenc_backend(te[1]) == be);
  CHECK(!memcmp(seq[0], seq[1], sizeof seq[0]) && !memcmp(pooled[0], pooled[1], sizeof pooled[0]));
  CHECKF(calls.embedding_fwd == 1 && calls.linear_fwd > 0 && calls.attention_fwd > 0 &&
             calls.copy_2d > 0,
         "calls: embedding %ld, linear %ld, attention %ld, copy_2d %ld", calls.embedding_fwd,
         calls.linear_fwd, calls.attention_fwd, calls.copy_2d);
  for (int k = 0; k < 2; k++) ct_textenc_free(te[k]);
  CHECKF(calls.free == calls.alloc, "%ld allocations, %ld frees on the counting backend",
         calls.alloc, calls.free);
}

// layout.cu: the image layout ops of the CUDA backend: patchify/unpatchify, NCHW <-> NLC, the
// nearest-neighbour x2 upsample and its backward, the tile blend (contracts:
// include/ctuner/kernels.h; the CPU twins: src/kernels/embed.c, conv.c). Pure permutations
// except the upsample backward (the four in the CPU's order) and the blend (elem_math.cuh).
#include "elem_math.cuh"
#include "reduce.cuh"

extern "C" {
#include "kernels/cuda_elem.h"
}

// row r = (b, c, h) of x, column w: x[b][c][hh*p+ph][ww*p+pw] <-> out[b][hh*gw+ww][(c*p+ph)*p+pw]
struct ct_f_patch {
  int C, H, W, p, dir;
  const float *src;
  float *dst;
  CT_HD void operator()(int r, int w) const {
    const int gh = H / p, gw = W / p, F = C * p * p;
    const int b = r / (C * H), rem = r % (C * H), c = rem / H, hrow = rem % H;
    const int hh = hrow / p, ph = hrow % p, ww = w / p, pw = w % p;
    if (hh >= gh || ww >= gw) return;  // outside the patch grid: the CPU never visits it
    const size_t xi = (size_t)r * W + w;
    const size_t tok =
        ((size_t)b * gh * gw + (size_t)hh * gw + ww) * F + ((size_t)c * p + ph) * p + pw;
    if (dir == 0)
      dst[tok] = src[xi];
    else
      dst[xi] = src[tok];
  }
};

template <class Run>
static void patchify_impl(Run run, int B, int C, int H, int W, int p, const float *x, float *out) {
  if (p <= 0) return;
  run.rows("patchify", B * C * H, W, ct_f_patch{C, H, W, p, 0, x, out});
}
void ct_cu_patchify(int B, int C, int H, int W, int p, const float *x, float *out) {
  patchify_impl(ct_dev_run(), B, C, H, W, p, x, out);
}
void ct_cuh_patchify(int B, int C, int H, int W, int p, const float *x, float *out) {
  patchify_impl(ct_host_run(), B, C, H, W, p, x, out);
}

template <class Run>
static void unpatchify_impl(Run run, int B, int C, int H, int W, int p, const float *in, float *x) {
  if (p <= 0) return;
  run.rows("unpatchify", B * C * H, W, ct_f_patch{C, H, W, p, 1, in, x});
}
void ct_cu_unpatchify(int B, int C, int H, int W, int p, const float *in, float *x) {
  unpatchify_impl(ct_dev_run(), B, C, H, W, p, in, x);
}
void ct_cuh_unpatchify(int B, int C, int H, int W, int p, const float *in, float *x) {
  unpatchify_impl(ct_host_run(), B, C, H, W, p, in, x);
}

// dir 0: (B, C, L) -> (B, L, C), row (b, l), column c; dir 1: (B, L, C) -> (B, C, L), row (b, c),
// column l
struct ct_f_transpose {
  int C, L, dir;
  const float *x;
  float *y;
  CT_HD void operator()(int r, int j) const {
    if (dir == 0) {
      const int bi = r / L, l = r % L;
      y[(size_t)r * C + j] = x[((size_t)bi * C + j) * L + l];
    } else {
      const int bi = r / C, c = r % C;
      y[(size_t)r * L + j] = x[((size_t)bi * L + j) * C + c];
    }
  }
};

template <class Run>
static void nchw_to_nlc_impl(Run run, int B, int C, int L, const float *x, float *y) {
  if (C <= 0 || L <= 0) return;
  run.rows("nchw_to_nlc", B * L, C, ct_f_transpose{C, L, 0, x, y});
}
void ct_cu_nchw_to_nlc(int B, int C, int L, const float *x, float *y) {
  nchw_to_nlc_impl(ct_dev_run(), B, C, L, x, y);
}
void ct_cuh_nchw_to_nlc(int B, int C, int L, const float *x, float *y) {
  nchw_to_nlc_impl(ct_host_run(), B, C, L, x, y);
}

template <class Run>
static void nlc_to_nchw_impl(Run run, int B, int C, int L, const float *x, float *y) {
  if (C <= 0 || L <= 0) return;
  run.rows("nlc_to_nchw", B * C, L, ct_f_transpose{C, L, 1, x, y});
}
void ct_cu_nlc_to_nchw(int B, int C, int L, const float *x, float *y) {
  nlc_to_nchw_impl(ct_dev_run(), B, C, L, x, y);
}
void ct_cuh_nlc_to_nchw(int B, int C, int L, const float *x, float *y) {
  nlc_to_nchw_impl(ct_host_run(), B, C, L, x, y);
}

// output row r = (plane, 2H row), column of 2W
struct ct_f_up_fwd {
  int H, W;
  const float *x;
  float *y;
  CT_HD void operator()(int r, int j2) const {
    const int pl = r / (2 * H), i2 = r % (2 * H);
    y[(size_t)r * 2 * W + j2] = x[((size_t)pl * H + i2 / 2) * W + j2 / 2];
  }
};
// input row r = (plane, H row): the sum of its four outputs, (r0 pair) + (r1 pair)
struct ct_f_up_bwd {
  int W;
  const float *dy;
  float *dx;
  CT_HD void operator()(int r, int j) const {
    const float *r0 = dy + (size_t)(2 * r) * 2 * W, *r1 = r0 + 2 * W;
    dx[(size_t)r * W + j] = ct_fa(ct_fa(r0[2 * j], r0[2 * j + 1]), ct_fa(r1[2 * j], r1[2 * j + 1]));
  }
};

template <class Run>
static void upsample2x_fwd_impl(Run run, int BC, int H, int W, const float *x, float *y) {
  if (H <= 0) return;
  run.rows("upsample2x_fwd", BC * 2 * H, 2 * W, ct_f_up_fwd{H, W, x, y});
}
void ct_cu_upsample2x_fwd(int BC, int H, int W, const float *x, float *y) {
  upsample2x_fwd_impl(ct_dev_run(), BC, H, W, x, y);
}
void ct_cuh_upsample2x_fwd(int BC, int H, int W, const float *x, float *y) {
  upsample2x_fwd_impl(ct_host_run(), BC, H, W, x, y);
}

template <class Run>
static void upsample2x_bwd_impl(Run run, int BC, int H, int W, const float *dy, float *dx) {
  run.rows("upsample2x_bwd", BC * H, W, ct_f_up_bwd{W, dy, dx});
}
void ct_cu_upsample2x_bwd(int BC, int H, int W, const float *dy, float *dx) {
  upsample2x_bwd_impl(ct_dev_run(), BC, H, W, dy, dx);
}
void ct_cuh_upsample2x_bwd(int BC, int H, int W, const float *dy, float *dx) {
  upsample2x_bwd_impl(ct_host_run(), BC, H, W, dy, dx);
}

struct ct_f_blend {
  int rows, e, vertical;
  const float *a;
  size_t plane_a;
  int lda;
  float *b;
  size_t plane_b;
  int ldb;
  CT_HD void operator()(int r, int x) const {
    const int pl = r / rows, y = r % rows;
    const float av = a[(size_t)pl * plane_a + (size_t)y * lda + x];
    float *bp = b + (size_t)pl * plane_b + (size_t)y * ldb + x;
    *bp = ct_cu_blend(av, *bp, vertical ? y : x, e);
  }
};

template <class Run>
static void tile_blend_impl(Run run, int planes, int rows, int cols, int e, int vertical,
                            const float *a, size_t plane_a, int lda, float *b, size_t plane_b,
                            int ldb) {
  if (rows <= 0 || planes <= 0) return;
  run.rows("tile_blend", planes * rows, cols,
           ct_f_blend{rows, e, vertical, a, plane_a, lda, b, plane_b, ldb});
}
void ct_cu_tile_blend(int planes, int rows, int cols, int e, int vertical, const float *a,
                      size_t plane_a, int lda, float *b, size_t plane_b, int ldb) {
  tile_blend_impl(ct_dev_run(), planes, rows, cols, e, vertical, a, plane_a, lda, b, plane_b, ldb);
}
void ct_cuh_tile_blend(int planes, int rows, int cols, int e, int vertical, const float *a,
                       size_t plane_a, int lda, float *b, size_t plane_b, int ldb) {
  tile_blend_impl(ct_host_run(), planes, rows, cols, e, vertical, a, plane_a, lda, b, plane_b, ldb);
}
